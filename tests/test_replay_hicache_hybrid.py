"""``flatradix replay --host-capacity H`` over the hybrid models: the SWA mode
(``--swa-window``), the Mamba mode (``--mamba-states``) and the SWA + Mamba mode with
SGLang's host tier (HiCache) behind them. As SGLang's scheduler: each step polls
``check_hicache_events``; the request holds its lock on its device match (and, with
Mamba, its own state slot) while a host hit of any component -- Full tokens
(``host_hit_length``), the SWA window (``swa_host_hit_length``), the state
(``mamba_host_hit_length``) -- is loaded back by ``init_load_back`` (``req`` carries
``last_node`` and the match's host hit lengths); its lock then moves to the loaded
node, the rest is allocated, and ``ready_to_load_host_cache`` / ``loading_check``
complete the load.

Exact values: two hand-worked runs (every figure worked out from the spec, not read
off the code), the run with no host slot equals the run without a host tier request
by request in all three modes and write policies, and after random runs the six
pools (Full / SWA / state, device and host) each partition exactly. The trace test
reads the whole Mooncake conversation trace (``TRACE`` of ``tests/test_replay.py``) and skips, saying how to get it, where it is
absent.
"""

import csv
import importlib.util
import json
import math

import numpy as np
import pytest

from flatradix.inspection import all_mamba_host_values_flatten, all_swa_host_values_flatten
from flatradix.replay import (ArrivalModel, format_report, format_sweep, load_mooncake, replay,
                              sweep, synthetic_workload, write_per_request_csv, write_runs_csv,
                              write_sweep_csv)
from flatradix.replay.sim import HOST_FIELDS, HOST_MAMBA_FIELDS, HOST_SWA_FIELDS, host_aux_slots

from .test_replay import TRACE, needs_trace, swa_pool_partition
from .test_replay_hicache import HAND
from .test_replay_mamba import _capturing_factory, _cli, _workload
from .test_replay_triple import extending_workload


def _assert_six_pools_partitioned(box, swa, mamba):
    """Device: every Full slot free or in the tree once (SWA: every SWA slot free or
    the peer of one tree Full slot; Mamba: every state slot free or one node's);
    host: every Full / SWA / state host slot free or one node's host copy; nothing
    locked, nothing in flight."""
    cache, alloc, pool = box["cache"], box["alloc"], box["pool"]
    if swa:
        swa_pool_partition(cache, alloc)
        assert cache.swa_protected_size() == 0
    else:
        tree = np.asarray(cache.all_values_flatten(), dtype=np.int64)
        assert np.unique(tree).size == tree.size
        assert tree.size + alloc.available_size() == alloc.size
    if mamba:
        states = np.asarray(cache.all_mamba_values_flatten(), dtype=np.int64)
        ma = pool.mamba_allocator
        assert np.unique(states).size == states.size and ma.is_held(states).all()
        assert states.size + ma.available_size() == ma.size
        assert cache.mamba_protected_size() == 0
    assert cache.protected_size() == 0
    for flat, pool_host, total in (
            (cache.all_host_values_flatten(), cache.mem_pool_host, cache.host_total_size()),
            (all_swa_host_values_flatten(cache._engine) if swa else None,
             cache.swa_pool_host if swa else None, cache.swa_host_total_size() if swa else 0),
            (all_mamba_host_values_flatten(cache._engine) if mamba else None,
             cache.mamba_pool_host if mamba else None,
             cache.mamba_host_total_size() if mamba else 0)):
        if pool_host is None:
            continue
        flat = np.asarray(flat, dtype=np.int64)
        assert np.unique(flat).size == flat.size == total
        assert ((flat >= 0) & (flat < pool_host.size)).all()
        assert flat.size + pool_host.available_size() == pool_host.size
    assert cache.ongoing_write_through == {} and cache.ongoing_load_back == {}
    cache.sanity_check()


# ---------------------------------------------------------------- by hand
def test_swa_host_replay_by_hand():
    """HAND of the Full host tier test (blocks of 4, page 4, one output token each,
    device pool 24, host 64) served as an SWA model whose window never slides (W 64
    > every request, SWA pool = Full pool): the SWA KV mirrors the Full KV, and a
    backup / demote / load moves both. One difference from the Full run: a load
    that restores SWA data ignores load_back_threshold (SGLang loads a demoted
    prefix's window whatever its Full count), so r3's 8-token host hit is loaded.
    A = [1,2,3], B = [4,5,6].
    r0 A (12): miss. Finished: A cached, backed up (Full and SWA host 12); 12 free.
    r1 B (12): needs 13 > 12: A demoted (12). Finished: B backed up (host 24).
    r2 [1,2,3,7]: A host-only: host hit 12, SWA host hit 12: loaded into the 12 free
      slots; needs 4 + 1, none free: B demoted (12). Finished: C = [7] under A,
      backed up (host 28); device A + C = 16, 8 free.
    r3 [4,5,8]: [4,5] of host-only B (split B1 = [4,5], B2 = [6]): host hit 8, SWA 8:
      loaded (8 free); needs 5, none free: C (4) then A, now a leaf (12), demoted:
      16. Finished: D = [8] under B1, backed up (host 32); B1 + D = 12, 12 free.
    r4 [1,2,3,7]: A and C host-only: host hit 16: the load evicts D (4; B1 keeps a
      device child until then) and loads 16; needs 1: B1, now a leaf, demoted (8).
    r5 [1,2,3,9]: A on the device: device hit 12, needs 5 of 8 free. Finished: E =
      [9] backed up (host 36: every block of the workload, the host pool's size).
    Device hits 12, host hits 12 + 8 + 16 = 36 (3 loads, 36 SWA tokens restored),
    misses 84 - 48 = 36; evicted 12 + 12 + 16 + 12 = 52 Full tokens and as many SWA
    tokens (4 of each by r4's load); nothing lost to the window, nothing evicted
    from the host. The Full host replay of HAND declines r3's load (40 hits)."""
    box = {}
    r = replay(_workload(*HAND), capacity=24, page_size=4, host_capacity=64, swa_window=64,
               swa_ratio=1.0, record_requests=True, cache_factory=_capturing_factory(box))
    pr = r.per_request
    assert pr["device_hit_tokens"].tolist() == [0, 0, 0, 0, 0, 12]
    assert pr["host_hit_tokens"].tolist() == [0, 0, 12, 8, 16, 0]
    assert pr["miss_tokens"].tolist() == [12, 12, 4, 4, 0, 4]
    assert pr["host_match_tokens"].tolist() == [0, 0, 12, 8, 16, 0]
    assert pr["evicted_tokens"].tolist() == [0, 12, 12, 16, 12, 0]
    assert pr["swa_evicted_tokens"].tolist() == [0, 12, 12, 16, 12, 0]
    assert pr["window_lost_hit_tokens"].tolist() == [0] * 6
    assert (r.device_hit_tokens, r.host_hit_tokens, r.miss_tokens) == (12, 36, 36)
    assert r.hit_tokens == 48 and r.token_hit_ratio == 48 / 84
    assert (r.load_backs, r.loaded_tokens, r.declined_host_tokens) == (3, 36, 0)
    assert (r.evicted_tokens, r.load_evicted_tokens) == (52, 4)
    assert (r.swa_evicted_tokens, r.load_swa_evicted_tokens) == (52, 4)
    assert r.swa_host_loaded_tokens == 36 and r.window_lost_hit_tokens == 0
    assert (r.host_pool_slots, r.swa_host_pool_slots) == (36, 36)
    assert (r.backed_up_tokens, r.swa_backed_up_tokens) == (36, 36)
    assert (r.host_evicted_tokens, r.swa_host_evicted_tokens) == (0, 0)
    assert r.final_host_tree_tokens == r.final_swa_host_tree_tokens == 36
    assert r.final_tree_tokens == 20 and r.kv_conserved
    assert r.latency_us["init_load_back"]["count"] == 3
    assert r.latency_us["loading_check"]["count"] == 3
    _assert_six_pools_partitioned(box, swa=True, mamba=False)
    full = replay(_workload(*HAND), capacity=24, page_size=4, host_capacity=64)
    assert (full.hit_tokens, full.declined_host_tokens) == (40, 8)


# blocks of 4 tokens, page 1 (the Mamba mode's), one output token each
FOUR = ([[1, 2], [3, 4], [1, 2, 5], [3, 4, 6]], [8, 8, 12, 12], [1, 1, 1, 1])


def test_mamba_host_replay_by_hand():
    """Device pool 14 tokens, 3 state slots, host 64 tokens (the workload's 6 blocks:
    24) and by default int(3 x 64 / 14) = 13 host states (capped at one per request:
    4). Each request matches prompt[:-1] and takes its state slot first.
    r0 [1,2] (8): miss; 9 of 14. Finished: X = [1,2] and its state cached, backed up
      (Full and state); 6 free.
    r1 [3,4] (8): its slot (1 of 2 free); needs 9 > 6: X demoted (8 tokens, its state
      freed on the device, kept on the host). Finished: Y = [3,4] + state, backed up.
    r2 [1,2,5] (key 11): X host-only with a host state: host hit 8, state host hit 1.
      Its slot (1 free); the load needs 8 > 6 free: Y demoted (8, its state); loads X
      and restores its state (a free slot): hit 8 (on the host). Needs 4 + 1 of 6.
      Finished: Z = [5] under X + the request's state, backed up; 2 free.
    r3 [3,4,6] (key 11): Y host-only, host state: host hit 8. Its slot (the last
      free one); the load needs 8 > 2: Z (4) then X, now a leaf (8), demoted: 12 (2
      states); loads Y, restores its state. Finished: W = [6] under Y, backed up.
    Hits 16, all loaded back (2 loads, 2 states restored), misses 40 - 16 = 24;
    evicted 8 + 8 + 12 = 28 tokens (20 by loads), 1 + 1 + 2 = 4 states (3 by loads).
    Without the host tier every prefix is deleted before its reuse: 0 hits."""
    box = {}
    kw = dict(capacity=14, page_size=1, mamba_states=3, record_requests=True)
    r = replay(_workload(*FOUR), host_capacity=64, cache_factory=_capturing_factory(box), **kw)
    pr = r.per_request
    assert pr["host_hit_tokens"].tolist() == [0, 0, 8, 8]
    assert pr["device_hit_tokens"].tolist() == [0, 0, 0, 0]
    assert pr["host_match_tokens"].tolist() == [0, 0, 8, 8]
    assert pr["evicted_tokens"].tolist() == [0, 8, 8, 12]
    assert pr["mamba_evicted_states"].tolist() == [0, 1, 1, 2]
    assert pr["full_kv_hit_tokens"].tolist() == [0, 0, 8, 8]
    assert pr["checkpoint_lost_hit_tokens"].tolist() == [0] * 4
    assert (r.device_hit_tokens, r.host_hit_tokens, r.miss_tokens) == (0, 16, 24)
    assert (r.load_backs, r.host_state_loads, r.loaded_tokens) == (2, 2, 16)
    assert (r.evicted_tokens, r.load_evicted_tokens) == (28, 20)
    assert (r.mamba_evicted_states, r.load_evicted_states) == (4, 3)
    assert (r.host_pool_slots, r.mamba_host_pool_slots) == (24, 4)
    assert (r.backed_up_tokens, r.backed_up_states) == (24, 4)
    assert (r.host_evicted_tokens, r.host_evicted_states) == (0, 0)
    assert (r.final_host_tree_tokens, r.final_host_tree_states) == (24, 4)
    assert (r.final_tree_tokens, r.final_mamba_tree_states) == (12, 2)
    assert r.kv_conserved and r.mamba_waits == 0
    _assert_six_pools_partitioned(box, swa=False, mamba=True)
    assert replay(_workload(*FOUR), **kw).hit_tokens == 0


# ---------------------------------------------------------------- host pool sizes
def test_host_aux_pools_follow_the_host_to_device_ratio():
    w = extending_workload(300, seed=1)     # 300 requests
    tokens = w.distinct_prefix_blocks() * w.block_size
    # SGLang's one hicache_ratio: SWA host = ratio x SWA device = host x swa_ratio (pages);
    # host states = ratio x device states
    assert host_aux_slots(w, 600, 300, 300, 1, 0.5, 8) == (300, 16)
    assert host_aux_slots(w, 1000, 400, 400, 16, 0.3, 10) == (288, 25)
    assert host_aux_slots(w, 0, 300, 300, 4, 0.5, 8) == (4, 1)      # one page / state
    assert host_aux_slots(w, math.inf, 300, 300, 1, 0.5, 8) == (tokens, 300)
    assert host_aux_slots(w, 600, None, 250, 1, 0.5, 5) == (300, 12)  # over the pool used
    assert host_aux_slots(w, 600, 300, 300, 1, 0.5, 8, swa_host_capacity=7,
                          mamba_host_states=3) == (7, 3)
    notes = []
    assert host_aux_slots(w, 600, 300, 300, 1, 0.5, 8, swa_host_capacity=10**9,
                          mamba_host_states=10**9, notes=notes) == (tokens, 300)  # its use
    assert notes == [f"SWA host pool sized to {tokens:,} tokens: this workload can never use "
                     f"more, so 1,000,000,000 tokens gives the same run",
                     "Mamba host pool sized to 300 states: this workload can never use more "
                     "(one a request), so 1,000,000,000 states gives the same run"]
    r = replay(w, capacity=300, page_size=1, host_capacity=600, swa_window=8, swa_ratio=0.5,
               mamba_states=8, swa_host_capacity=100, mamba_host_states=5)
    assert (r.swa_host_pool_slots, r.mamba_host_pool_slots) == (100, 5)
    assert r.peak_swa_host_tree_tokens <= 100 and r.peak_host_tree_states <= 5


# ---------------------------------------------------------------- against other runs
MODES = {"swa": dict(swa_window=8, swa_ratio=0.5, swa_eviction_interval=4),
         "mamba": dict(mamba_states=8),
         "swa+mamba": dict(swa_window=8, swa_ratio=0.5, swa_eviction_interval=4,
                           mamba_states=8)}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("write_policy", ["write_through", "write_through_selective",
                                          "write_back"])
def test_no_host_slot_is_the_run_without_a_host_tier(mode, write_policy):
    """A host pool of 0 Full tokens backs nothing up (a backup needs Full host slots
    first; the SWA / state host pools, one slot each, stay empty): the run is the
    hybrid mode's run without a host tier, request by request."""
    w = extending_workload(200, seed=3)
    kw = dict(capacity=300, page_size=1, max_running=3, record_hits=True,
              record_requests=True, **MODES[mode])
    a = replay(w, **kw)
    b = replay(w, host_capacity=0, write_policy=write_policy, load_back_threshold=1, **kw)
    np.testing.assert_array_equal(a.hits, b.hits)
    for k, v in a.per_request.items():
        np.testing.assert_array_equal(v, b.per_request[k], err_msg=k)
    for k in ("hit_tokens", "evicted_tokens", "evict_calls", "waits", "rejected_requests",
              "peak_tree_tokens", "final_tree_tokens", "swa_evicted_tokens",
              "window_lost_hit_tokens", "mamba_evicted_states", "checkpoint_lost_hit_tokens",
              "mamba_waits"):
        assert getattr(a, k) == getattr(b, k), k
    assert b.host_hit_tokens == b.load_backs == 0 and b.device_hit_tokens == b.hit_tokens
    assert b.backed_up_tokens == 0 and b.peak_host_tree_tokens == 0 and b.kv_conserved
    assert b.swa_backed_up_tokens in (None, 0) and b.backed_up_states in (None, 0)
    assert a.hit_tokens > 0


@pytest.mark.parametrize("capacity,host,max_running,policy,write_policy,arrival", [
    (4_000, 6_000, 1, "lru", "write_through", False),
    (6_000, 3_000, 4, "lfu", "write_through", False),
    (5_000, 20_000, 8, "fifo", "write_through_selective", True),
    (4_000, 6_000, 1, "lru", "write_back", False),
    (5_000, 2_000, 4, "lfu", "write_back", True),
])
def test_a_window_nothing_slides_past_gives_the_full_host_run(capacity, host, max_running,
                                                              policy, write_policy, arrival):
    """W above every request and an SWA pool as large as the Full one: the SWA KV
    tracks the Full KV on both tiers (every load restores both), no window check
    fails, so the SWA host run is the Full host run request by request (the Full
    host mode locks after the load, the SWA one before and moves the lock: the
    same pins)."""
    w = synthetic_workload(200, block_size=16, seed=5)
    kw = dict(capacity=capacity, host_capacity=host, max_running=max_running, policy=policy,
              write_policy=write_policy, record_requests=True,
              arrival=ArrivalModel(decode_tokens_per_s=30) if arrival else None)
    a = replay(w, **kw)
    b = replay(w, swa_window=1 << 20, swa_ratio=1.0, **kw)
    for k, v in a.per_request.items():
        np.testing.assert_array_equal(v, b.per_request[k], err_msg=k)
    for k in ("hit_tokens", "device_hit_tokens", "host_hit_tokens", "load_backs",
              "loaded_tokens", "declined_host_tokens", "evicted_tokens", "load_evicted_tokens",
              "waits", "rejected_requests", "peak_tree_tokens", "final_tree_tokens"):
        assert getattr(a, k) == getattr(b, k), k
    assert b.swa_evicted_tokens == b.evicted_tokens and b.window_lost_hit_tokens == 0
    assert a.host_hit_tokens > 0 and b.kv_conserved


@pytest.mark.parametrize("mode,capacity,host,max_running,policy,write_policy,arrival", [
    ("swa", 300, 600, 3, "lru", "write_through", False),
    ("swa", 250, 200, 4, "lfu", "write_back", True),
    ("mamba", 300, 600, 3, "lru", "write_through_selective", False),
    ("mamba", 400, 300, 2, "fifo", "write_back", False),
    ("mamba", 300, math.inf, 1, "lru", "write_through", True),
    ("swa+mamba", 300, 600, 3, "lru", "write_through", False),
    ("swa+mamba", 350, 250, 4, "slru", "write_back", True),
    ("swa+mamba", 300, 900, 2, "lru", "write_through_selective", False),
    # 6 requests running in a pool of 120: loads declined for want of device slots
    ("swa", 120, 600, 6, "lru", "write_through", False),
    ("mamba", 120, 600, 6, "lru", "write_through", False),
    ("swa+mamba", 120, 600, 6, "lru", "write_back", False),
])
def test_six_pools_partitioned_after_replay(mode, capacity, host, max_running, policy,
                                            write_policy, arrival):
    box = {}
    w = extending_workload(250, seed=5)
    r = replay(w, capacity=capacity, page_size=1, host_capacity=host, max_running=max_running,
               policy=policy, write_policy=write_policy, load_back_threshold=1,
               record_requests=True, cache_factory=_capturing_factory(box),
               arrival=ArrivalModel(decode_tokens_per_s=30) if arrival else None,
               **MODES[mode])
    assert r.kv_conserved
    pr = r.per_request
    served = ~pr["rejected"]
    np.testing.assert_array_equal(pr["hit_tokens"], pr["device_hit_tokens"] + pr["host_hit_tokens"])
    np.testing.assert_array_equal(pr["miss_tokens"] + pr["hit_tokens"], pr["prompt_tokens"])
    # the hit, the host hit a declined load left and the lost hits add up to the Full
    # KV the match found on either tier
    lost = sum(pr[k] for k in ("window_lost_hit_tokens", "checkpoint_lost_hit_tokens")
               if k in pr)
    np.testing.assert_array_equal((pr["hit_tokens"] + pr["declined_host_tokens"] + lost)[served],
                                  pr["full_kv_hit_tokens"][served])
    assert pr["declined_host_tokens"].sum() == r.declined_host_tokens
    assert (lost >= 0).all()
    assert r.device_hit_tokens + r.host_hit_tokens + r.miss_tokens == r.prompt_tokens
    assert r.host_hit_tokens > 0 and r.load_backs > 0
    assert (r.declined_host_tokens > 0) == (capacity == 120)
    assert r.evicted_tokens == pr["evicted_tokens"].sum()
    assert r.load_evicted_tokens <= r.evicted_tokens
    assert r.backed_up_tokens - r.host_evicted_tokens == r.final_host_tree_tokens
    assert r.peak_host_tree_tokens <= r.host_pool_slots
    if "swa" in mode:
        assert r.swa_evicted_tokens == pr["swa_evicted_tokens"].sum()
        assert r.load_swa_evicted_tokens <= r.swa_evicted_tokens
        assert r.peak_swa_host_tree_tokens <= r.swa_host_pool_slots
        assert r.swa_backed_up_tokens - r.swa_host_evicted_tokens == r.final_swa_host_tree_tokens
    if "mamba" in mode:
        assert r.mamba_evicted_states == pr["mamba_evicted_states"].sum()
        assert r.load_evicted_states <= r.mamba_evicted_states
        assert 0 < r.host_state_loads <= r.load_backs
        assert r.peak_host_tree_states <= r.mamba_host_pool_slots
        assert r.backed_up_states - r.host_evicted_states == r.final_host_tree_states
    _assert_six_pools_partitioned(box, swa="swa" in mode, mamba="mamba" in mode)


# ---------------------------------------------------------------- bad options
@pytest.mark.parametrize("kw,err,what", [
    (dict(host_capacity=100, mamba_states=8, mamba_extra_buffer=True, page_size=16),
     ValueError, "host_capacity \\(the host tier\\) with mamba_extra_buffer"),
    (dict(host_capacity=100, swa_host_capacity=8), ValueError,
     "swa_host_capacity needs swa_window"),
    (dict(host_capacity=100, mamba_host_states=8), ValueError,
     "mamba_host_states needs mamba_states"),
    (dict(swa_window=8, swa_host_capacity=8), ValueError,
     "swa_host_capacity needs host_capacity"),
    (dict(mamba_states=8, mamba_host_states=8), ValueError,
     "mamba_host_states needs host_capacity"),
    (dict(host_capacity=100, swa_window=8, swa_host_capacity=0), ValueError,
     "swa_host_capacity must be in \\[1, "),
    (dict(host_capacity=100, mamba_states=8, mamba_host_states=-2), ValueError,
     "mamba_host_states must be in \\[1, "),
    (dict(host_capacity=100, swa_window=8, swa_host_capacity=2.5), TypeError,
     "swa_host_capacity must be an int"),
    (dict(host_capacity=100, mamba_states=8, mamba_host_states=True), TypeError,
     "mamba_host_states must be an int"),
    (dict(host_capacity=100, mamba_states=8, mamba_host_states="4"), TypeError,
     "mamba_host_states must be an int"),
])
def test_hybrid_host_replay_rejects_bad_options(kw, err, what):
    kw = {"page_size": 1, **kw}
    with pytest.raises(err, match=what):
        replay(_workload(*FOUR), capacity=14, **kw)


def test_sweep_refuses_several_windows_or_state_pools_with_host_pools():
    w = _workload(*FOUR)
    with pytest.raises(ValueError, match="host_capacities \\(the host tier\\) with 2 "
                                         "swa_windows"):
        sweep(w, [14], swa_windows=[4, 8], host_capacities=[0, 32], page_size=1)
    with pytest.raises(ValueError, match="with 2 mamba_states"):
        sweep(w, [14], mamba_states=[2, 3], host_capacities=[0], page_size=1)


# ---------------------------------------------------------------- reports
def test_hybrid_host_report_text_and_json():
    r = replay(_workload(*FOUR), capacity=14, page_size=1, mamba_states=3, host_capacity=64)
    text = format_report(r)
    for s in ("host tier 64 tokens (pool 24) | Mamba host pool 4 states | write_through | "
              "load-back threshold 10",
              "hit tokens      16 (40.00 % token hit ratio: device + host)",
              "host hits       16 (40.00 %: loaded back, 2 loads; restored 2 states)",
              "misses          24 (60.00 %: computed)",
              "lost to ckpt    0", "evicted         Full 28 tokens, Mamba 4 states",
              "by load-backs   Full 20 tokens, Mamba 3 states evicted from the device",
              "backed up       Full 24 tokens, Mamba 4 states",
              "host evicted    Full 0 tokens, Mamba 0 states",
              "peak host tree  Full 24 tokens, Mamba 4 states",
              "KV conservation ok", "init_load_back", "check_hicache_events"):
        assert s in text, s
    assert "evict_sliding_windows" not in text
    d = r.to_dict()
    for k in HOST_FIELDS + HOST_MAMBA_FIELDS:
        assert k in d, k
    assert not set(HOST_SWA_FIELDS) & set(d) and "swa_window" not in d
    json.dumps(d)
    s = replay(_workload(*HAND), capacity=24, page_size=4, host_capacity=64, swa_window=64,
               swa_ratio=1.0)
    text = format_report(s)
    for t in ("| SWA host pool 36 tokens | write_through",
              "restored 36 SWA tokens", "backed up       Full 36 tokens, SWA 36 tokens",
              "evict_sliding_windows"):
        assert t in text, t
    d = s.to_dict()
    assert set(HOST_SWA_FIELDS) <= set(d) and not set(HOST_MAMBA_FIELDS) & set(d)
    # the runs without a host tier carry none of these
    plain = replay(_workload(*FOUR), capacity=14, page_size=1, mamba_states=3).to_dict()
    assert not set(HOST_FIELDS + HOST_MAMBA_FIELDS) & set(plain)


def test_hybrid_host_sweep_grid_table_csv_and_plot(tmp_path):
    """Two device capacities x three host pools over the SWA + Mamba model: each point
    is the single replay's figures; the table has the model's lost-hit columns; the
    CSVs; the heatmap."""
    w = extending_workload(150, seed=2)
    kw = dict(page_size=1, swa_ratio=0.5, swa_eviction_interval=4, max_running=3,
              load_back_threshold=1)
    caps, hosts = [200, 400], [0, 600, math.inf]
    curve = sweep(w, caps, host_capacities=hosts, swa_windows=[8], mamba_states=[8], **kw)
    assert [(p["host_capacity"], p["capacity"]) for p in curve["points"]] == [
        (0, 200), (0, 400), (600, 200), (600, 400), ("inf", 200), ("inf", 400)]
    h = curve["host"]
    assert (h["swa_window"], h["mamba_states"], h["swa_ratio"]) == (8, 8, 0.5)
    for p in curve["points"]:
        r = replay(w, capacity=p["capacity"], swa_window=8, mamba_states=8,
                   host_capacity=math.inf if p["host_capacity"] == "inf" else p["host_capacity"],
                   **kw)
        for k in ("hit_tokens", "device_hit_tokens", "host_hit_tokens", "miss_tokens",
                  "window_lost_hit_tokens", "checkpoint_lost_hit_tokens",
                  "swa_host_loaded_tokens", "host_state_loads", "mamba_host_pool_slots"):
            assert p[k] == getattr(r, k), (p["host_capacity"], p["capacity"], k)
    assert curve["points"][4]["hit_tokens"] > curve["points"][0]["hit_tokens"]
    text = format_sweep(curve).splitlines()
    assert text[0].startswith("host tier replay over sliding window 8 (SWA pool 0.5 x "
                              "capacity) + 8 Mamba states (page 1, chunk 64); SWA host pool "
                              "0.5 x host, Mamba host pool states x host / capacity: "
                              "write_through")
    assert "lost to W" in text[1] and "lost to ckpt" in text[1]
    assert text[-5] == "total hit ratio (%), lru: host pool (rows) x device pool (columns)"
    write_sweep_csv(curve, tmp_path / "c.csv")
    rows = list(csv.DictReader(open(tmp_path / "c.csv")))
    assert len(rows) == 7 and rows[0]["swa_window"] == "8" and rows[0]["mamba_states"] == "8"
    assert int(rows[2]["host_state_loads"]) == curve["points"][2]["host_state_loads"]
    json.dumps(curve)
    runs = [replay(w, capacity=300, host_capacity=h, swa_window=8, mamba_states=8,
                   record_requests=True, **kw) for h in (0, 600)]
    write_runs_csv(runs, tmp_path / "r.csv")
    rows = list(csv.DictReader(open(tmp_path / "r.csv")))
    assert [int(x["host_capacity"]) for x in rows] == [0, 600]
    assert int(rows[1]["swa_host_loaded_tokens"]) == runs[1].swa_host_loaded_tokens
    write_per_request_csv(runs, tmp_path / "p.csv")
    rows = list(csv.DictReader(open(tmp_path / "p.csv")))
    assert len(rows) == 300 and rows[150]["host_capacity"] == "600"
    assert sum(int(x["host_hit_tokens"]) for x in rows[150:]) == runs[1].host_hit_tokens
    assert sum(int(x["checkpoint_lost_hit_tokens"]) for x in rows[150:]) == \
        runs[1].checkpoint_lost_hit_tokens
    pytest.importorskip("matplotlib")
    from flatradix.replay import plot_sweep

    plot_sweep(curve, tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 1000


# ---------------------------------------------------------------- CLI
def test_cli_hybrid_host_runs_json():
    rc, out, err = _cli("--limit", "60", "--capacity", "6k", "--swa-window", "512",
                        "--swa-ratio", "0.5", "--host-capacity", "0,24k",
                        "--swa-host-capacity", "5000", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert [x["host_capacity"] for x in d] == [0, 24_000]
    assert [x["swa_host_pool_slots"] for x in d] == [5_000, 5_000]
    assert all(x["kv_conserved"] and x["swa_window"] == 512 for x in d)
    rc, out, err = _cli("--limit", "80", "--capacity", "6k", "--mamba-states", "16",
                        "--host-capacity", "24k", "--write-policy", "write_back")
    assert rc == 0, err
    for s in ("host tier 24,000 tokens", "Mamba host pool 64 states | write_back",
              "device hits", "host hits", "backed up       Full"):
        assert s in out, s


def test_cli_hybrid_host_sweep_and_kv_bytes(tmp_path):
    args = ["--limit", "40", "--sweep", "3k,6k", "--host-capacity", "0,12k",
            "--mamba-states", "8", "--swa-window", "256", "--swa-ratio", "0.5", "--csv",
            tmp_path / "s.csv"]
    if importlib.util.find_spec("matplotlib") is not None:
        args += ["--plot", tmp_path / "s.png"]
    rc, out, err = _cli(*args)
    assert rc == 0, err
    assert out.startswith("host tier replay over sliding window 256")
    assert len(list(csv.DictReader(open(tmp_path / "s.csv")))) == 4 + 1
    rc, out, err = _cli("--limit", "40", "--capacity", "4k", "--mamba-states", "8",
                        "--host-capacity", "16k", "--model-config",
                        "examples/model_configs/qwen3-next-80b-like.json")
    assert rc == 0, err
    assert "Mamba host pool 32 states = " in out and "of host memory" in out


@pytest.mark.parametrize("args,what", [
    (["--host-capacity", "1M", "--mamba-states", "8", "--mamba-extra-buffer"],
     "--host-capacity with --mamba-extra-buffer"),
    (["--host-capacity", "1M", "--swa-window", "512,1024"],
     "--host-capacity with --swa-window (2 windows): a host tier replay varies the host "
     "pool; give one value"),
    (["--host-capacity", "1M", "--mamba-states", "8,16"],
     "--host-capacity with --mamba-states (2 state counts)"),
    (["--host-capacity", "1M", "--swa-host-capacity", "4k"],
     "--swa-host-capacity needs --swa-window (the SWA mode)"),
    (["--host-capacity", "1M", "--mamba-host-states", "4"],
     "--mamba-host-states needs --mamba-states (the Mamba mode)"),
    (["--swa-window", "512", "--swa-host-capacity", "4k"],
     "--swa-host-capacity needs --host-capacity"),
    (["--mamba-states", "8", "--mamba-host-states", "4"],
     "--mamba-host-states needs --host-capacity"),
    (["--host-capacity", "1M", "--swa-window", "512", "--swa-host-capacity", "0"],
     "argument --swa-host-capacity"),
    (["--host-capacity", "1M", "--mamba-states", "8", "--mamba-host-states", "inf"],
     "argument --mamba-host-states: expected one whole number of states >= 1"),
    # a list typed into a one-value option is refused, never read as 56 (fresh-user run)
    (["--host-capacity", "1M", "--mamba-states", "8", "--mamba-host-states", "5,6"],
     "argument --mamba-host-states: expected one whole number of states >= 1 (e.g. 4096, "
     "2M, 500k), got '5,6'"),
    (["--host-capacity", "1M", "--swa-window", "512", "--swa-host-capacity", "5,6"],
     "argument --swa-host-capacity: expected one whole number of tokens >= 1"),
    (["--host-capacity", "1M", "--mamba-states", "8", "--mamba-host-states", "2" + "0" * 20],
     "is more than the largest pool (1,099,511,627,776 states)"),
    (["--host-capacity", "1,000,000"], "commas separate host capacities here"),
    (["--host-capacity", "1,024"], "'1,024': commas separate host capacities here"),
    (["--swa-window", "4,096"], "'4,096': commas separate windows here (512,1024,4096); "
     "write a number without its thousands commas (4096, not 4,096)"),
    (["--mamba-states", "1,000"], "'1,000': commas separate state counts here"),
    (["--sweep", "1,024"], "'1,024': commas separate capacities here"),
    (["--capacity", "5,6"], "argument --capacity: capacity takes one value (a comma only "
     "groups thousands, as in 2,000,000), got '5,6'"),
])
def test_cli_hybrid_host_errors_are_one_line(args, what):
    rc, out, err = _cli(*args)
    assert rc == 2 and out == "", (rc, out)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flatradix replay: error: "), err
    assert what in lines[0], lines[0]
    assert "Traceback" not in err


# ---------------------------------------------------------------- the trace
@pytest.mark.slow
@needs_trace
def test_swa_host_tier_on_a_prefix_of_the_trace():
    """The first 800 requests at page 16, a 1M-token device pool, W 4096, SWA pool
    half the Full one: no host slot gives the SWA run request by request; an 8M host
    pool loads hits back (windows too) and conserves every pool."""
    w = load_mooncake(TRACE, limit=800)
    kw = dict(capacity=1_000_000, swa_window=4096, swa_ratio=0.5, record_hits=True)
    plain = replay(w, **kw)
    none = replay(w, host_capacity=0, **kw)
    np.testing.assert_array_equal(plain.hits, none.hits)
    r = replay(w, host_capacity=8_000_000, **kw)
    assert r.kv_conserved and r.hit_tokens > plain.hit_tokens
    assert r.host_hit_tokens > 0 and r.swa_host_loaded_tokens > 0
