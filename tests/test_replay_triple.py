"""``flatradix replay --mamba-states N --swa-window W``: the SWA + Mamba mode, a
hybrid model with sliding-window and SSM layers served as SGLang serves it at page
1 without the Mamba extra buffer: the ``(FULL, SWA, MAMBA)`` cache, the SWA mode's
pools and window slides, the Mamba mode's state pool, ``prompt[:-1]`` match and
state donation.

Of a match's ``full_kv_hit_length - device_prefix_len``, the tokens past the
deepest state on the matched path are lost to checkpoint granularity and the rest
(a state there, the SWA KV of its window dropped) lost to the window.

Exact values: a six-request run worked by hand in all four modes (Full only, SWA
only, Mamba only, both), where the window loses a hit Mamba keeps and Mamba a hit
the window keeps; the split checked against an independent tree walk at every
match; a window no request slides past (and an SWA pool as large as the Full one)
gives the Mamba-only run request by request; every Full, SWA and state slot ends
free or cached once, and a leaked SWA or state slot fails the conservation check.
"""

import csv
import json

import numpy as np
import pytest

from flatradix.replay import (ArrivalModel, Workload, default_cache_factory, format_report,
                              format_sweep, load_mooncake, replay, sweep, synthetic_workload,
                              write_per_request_csv, write_runs_csv, write_sweep_csv)

from .test_cli import EXAMPLES
from .test_replay import SAMPLE, swa_pool_partition
from .test_replay_mamba import _capturing_factory, _cli, _workload


def _assert_three_pool_partition(cache, alloc, pool):
    """Every Full slot is free or in the tree once; every SWA slot is free or the peer
    of exactly one tree Full slot; every state slot is free or held by exactly one
    node; the ledgers agree with those counts; nothing is locked."""
    tree_full, tree_swa = swa_pool_partition(cache, alloc)
    states = np.asarray(cache.all_mamba_values_flatten(), dtype=np.int64)
    ma = pool.mamba_allocator
    assert np.unique(states).size == states.size and ma.is_held(states).all()
    assert states.size + ma.available_size() == ma.size
    assert cache.total_size() == (tree_full.size, tree_swa.size + states.size)
    assert cache.swa_evictable_size() == tree_swa.size
    assert cache.mamba_evictable_size() == states.size
    assert (cache.protected_size(), cache.swa_protected_size(),
            cache.mamba_protected_size()) == (0, 0, 0)
    cache.sanity_check()
    return tree_full.size, tree_swa.size, states.size


# ---------------------------------------------------------------- by hand
# blocks of 4 tokens, page 1, one request at a time, unbounded; W = 2, a slide at every
# decode step (interval 1), an SWA pool as large as the Full one
SIX = ([[1, 2], [1, 2, 3], [7, 8, 9], [7, 8, 6], [7, 8, 9, 5], [1, 2, 3]],
       [8, 12, 12, 12, 16, 12], [8, 1, 1, 1, 1, 1])
SWA_KW = dict(swa_window=2, swa_ratio=1.0, swa_eviction_interval=1)


def test_triple_replay_by_hand():
    """Full only and SWA match whole prompts; Mamba and both match prompt[:-1].

    r0 [1,2] (8 + 8): nothing cached. Its decode slides the window to 12 (last pre_len
      14 - W): every SWA slot of its prompt goes back, so the prompt is cached Full-only (a
      tombstone); with Mamba its state sits at 8 all the same.
    r1 [1,2,3] (12): shares 8 tokens with r0. Full 8. SWA: no SWA KV there: 0, lost 8.
      Mamba: key 11, r0's state at 8: 8. Both: the state is there, its window is not:
      0, 8 lost to the window (the window loses a hit Mamba keeps). Its insert recovers
      [0, 8)'s SWA KV; SWA alone stops it at the branching point 8 (the tail [8, 12) is
      not cached), with Mamba the key is not cut (state at 12).
    r2 [7,8,9] (12): nothing shared; state at 12.
    r3 [7,8,6] (12): shares 8 with r2. Full 8, SWA 8 (window live). Mamba: key 11, no
      state at 8 (r2's is at 12): 0, 8 lost to checkpoint granularity. Both: the same
      (Mamba loses a hit the window keeps).
    r4 [7,8,9,5] (16): extends r2 whole: 12 in every mode (key 15 reaches r2's state).
    r5 [1,2,3] again: Full 12 (r1's whole prompt). SWA: the tree holds [0, 8) of it: 8.
      Mamba: key 11; r1's state at 12 is beyond it, r0's at 8 is not: 8, 3 lost. Both:
      r0's state at 8 with the window r1 recovered: 8, 3 lost to checkpoint granularity.
    Hits: Full 40, SWA 28 (8 lost to W), Mamba 28 (11 lost), both 20 (8 + 11 lost)."""
    full = replay(_workload(*SIX), page_size=1, record_requests=True)
    swa = replay(_workload(*SIX), page_size=1, record_requests=True, **SWA_KW)
    mamba = replay(_workload(*SIX), page_size=1, mamba_states=10, record_requests=True)
    box = {}
    both = replay(_workload(*SIX), page_size=1, mamba_states=10, record_requests=True,
                  cache_factory=_capturing_factory(box), **SWA_KW)
    assert full.per_request["hit_tokens"].tolist() == [0, 8, 0, 8, 12, 12]
    assert swa.per_request["hit_tokens"].tolist() == [0, 0, 0, 8, 12, 8]
    assert swa.per_request["window_lost_hit_tokens"].tolist() == [0, 8, 0, 0, 0, 0]
    assert mamba.per_request["hit_tokens"].tolist() == [0, 8, 0, 0, 12, 8]
    assert mamba.per_request["checkpoint_lost_hit_tokens"].tolist() == [0, 0, 0, 8, 0, 3]
    pr = both.per_request
    assert pr["hit_tokens"].tolist() == [0, 0, 0, 0, 12, 8]
    assert pr["full_kv_hit_tokens"].tolist() == [0, 8, 0, 8, 12, 11]
    assert pr["window_lost_hit_tokens"].tolist() == [0, 8, 0, 0, 0, 0]
    assert pr["checkpoint_lost_hit_tokens"].tolist() == [0, 0, 0, 8, 0, 3]
    assert (full.hit_tokens, swa.hit_tokens, mamba.hit_tokens, both.hit_tokens) == (40, 28, 28,
                                                                                   20)
    assert (both.window_lost_hit_tokens, both.checkpoint_lost_hit_tokens) == (8, 11)
    assert (swa.window_lost_hit_tokens, mamba.checkpoint_lost_hit_tokens) == (8, 11)
    # r0 slides at pre_len 8, 9, ..., 14 (sequence lengths 9 to 15), each time to pre_len -
    # W: its 8 prompt slots and 4 of its outputs go back, in both SWA runs
    assert both.swa_slid_tokens == swa.swa_slid_tokens == 12
    assert both.latency_us["evict_sliding_windows"]["count"] == 7
    # nothing evicted; states: r0..r4 donated, r5's freed (r1's node at 12 has one)
    assert both.evicted_tokens == both.swa_evicted_tokens == both.mamba_evicted_states == 0
    assert pr["swa_evicted_tokens"].tolist() == pr["mamba_evicted_states"].tolist() == [0] * 6
    assert both.final_mamba_tree_states == both.peak_mamba_tree_states == 5
    assert both.mamba_waits == 0 and both.mamba_pool_slots == 6 and both.kv_conserved
    # the tree: [1,2] 8, [1,2,3]'s tail 4, [7,8] 8, its two branches 4 + 4, [7,8,9,5]'s 4;
    # the SWA KV of all of it (r0's tombstone recovered by r1)
    assert (both.final_tree_tokens, both.final_swa_tree_tokens) == (32, 32)
    assert _assert_three_pool_partition(box["cache"], box["alloc"], box["pool"]) == (32, 32, 5)
    d = both.to_dict()
    for k in ("swa_window", "swa_pool_slots", "swa_evicted_tokens", "window_lost_hit_tokens",
              "swa_slid_tokens", "mamba_states", "mamba_evicted_states",
              "checkpoint_lost_hit_tokens", "mamba_waits", "peak_mamba_tree_states"):
        assert k in d, k
    assert d["window_lost_hit_tokens"] == 8 and d["checkpoint_lost_hit_tokens"] == 11
    assert "mamba_states" not in swa.to_dict() and "swa_window" not in mamba.to_dict()


def test_one_state_slot_two_running_requests_with_a_window():
    """tests/test_replay_mamba.py's N = 1 run, two in flight, r2 = r0 again, with W = 4
    and an SWA pool as large as the Full one. The SWA insert caps a new leaf at W
    tokens of SWA data, so r0's prompt is cached as [0, 8) -> [8, 12) (state on the
    latter). r1 [7,8] finds no state slot (r0 holds it): it waits for r0, then evicts
    r0's state, which deletes the leaf [8, 12) only: 4 Full and 4 SWA tokens (Mamba
    alone deletes all 12). r2 = r0: key 11, Full hit 8 on [0, 8), no state: hit 0, 8
    lost to checkpoint granularity; it waits for r1 and evicts r1's leaf [4, 8). The
    tree ends with [0, 8) + r2's [8, 12) and r1's [0, 4): 16 Full, 16 SWA, 1 state."""
    three = ([[1, 2, 3], [7, 8], [1, 2, 3]], [12, 8, 12], [2, 2, 1])
    box = {}
    r = replay(_workload(*three), page_size=1, max_running=2, mamba_states=1, swa_window=4,
               swa_ratio=1.0, record_requests=True, cache_factory=_capturing_factory(box))
    pr = r.per_request
    assert pr["waited"].tolist() == [0, 1, 1] and r.mamba_waits == 2 and r.waits == 0
    assert pr["hit_tokens"].tolist() == [0, 0, 0]
    assert pr["full_kv_hit_tokens"].tolist() == pr["checkpoint_lost_hit_tokens"].tolist() == \
        [0, 0, 8]
    assert r.window_lost_hit_tokens == 0
    assert pr["evicted_tokens"].tolist() == pr["swa_evicted_tokens"].tolist() == [0, 4, 4]
    assert pr["mamba_evicted_states"].tolist() == [0, 1, 1]
    assert r.swa_slid_tokens == 0 and r.evict_calls == 4   # one empty-handed per admission
    assert _assert_three_pool_partition(box["cache"], box["alloc"], box["pool"]) == (16, 16, 1)
    mamba = replay(_workload(*three), page_size=1, max_running=2, mamba_states=1,
                   record_requests=True)
    assert mamba.per_request["evicted_tokens"].tolist() == [0, 12, 8]


# ---------------------------------------------------------------- generated runs
def extending_workload(n, seed, block=4, max_out=12):
    """Prompts that repeat or extend an earlier prompt's whole blocks (so its state can
    be reached) or start afresh; 30 % cut mid-block; 1 to ``max_out`` outputs."""
    rng = np.random.default_rng(seed)
    prompts, lengths, outs = [], [], []
    fresh = 1000
    for _ in range(n):
        base = []
        if prompts and rng.random() < 0.8:
            j = int(rng.integers(len(prompts)))
            base = prompts[j][:lengths[j] // block]
        extra = int(rng.integers(0 if base else 1, 3))
        hs = base + list(range(fresh, fresh + extra))
        fresh += extra
        cut = int(rng.integers(0, block)) if rng.random() < 0.3 else 0
        prompts.append(hs)
        lengths.append(max(1, len(hs) * block - cut))
        outs.append(int(rng.integers(1, max_out + 1)))
    ptr = np.cumsum([0] + [len(p) for p in prompts])
    return Workload(f"extending-{seed}", block, np.zeros(n), np.array(lengths),
                    np.array(outs), ptr, np.array(sum(prompts, []), dtype=np.int64))


def _same(a, b):
    return a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


@pytest.mark.parametrize("capacity, states, max_running", [
    (400, 4, 1), (400, 64, 4), (800, 2, 8), (None, 3, 3), (300, 1, 2), (None, 300, 1)])
def test_a_window_nothing_slides_past_gives_the_mamba_only_run(capacity, states, max_running):
    """W above every request and an SWA pool as large as the Full one: the SWA pool
    tracks the Full pool, no window check fails, so the run is the Mamba-only run,
    request by request (hits, Full KV hits, evictions, waits, rejections), its SWA
    evictions are its Full evictions and nothing is lost to the window."""
    w = extending_workload(300, seed=1)
    kw = dict(capacity=capacity, page_size=1, max_running=max_running, mamba_states=states,
              record_requests=True)
    m = replay(w, **kw)
    b = replay(w, swa_window=1 << 20, swa_ratio=1.0, **kw)
    for k, v in m.per_request.items():
        assert _same(v, b.per_request[k]), k
    for k in ("hit_tokens", "evicted_tokens", "evict_calls", "waits", "rejected_requests",
              "mamba_evicted_states", "checkpoint_lost_hit_tokens", "mamba_waits",
              "peak_tree_tokens", "final_tree_tokens", "peak_mamba_tree_states",
              "final_mamba_tree_states"):
        assert getattr(m, k) == getattr(b, k), k
    assert b.swa_evicted_tokens == b.evicted_tokens and b.window_lost_hit_tokens == 0
    assert b.swa_slid_tokens == 0 and b.final_swa_tree_tokens == b.final_tree_tokens
    assert b.kv_conserved
    if states < 300:
        assert b.mamba_evicted_states > 0


def _oracle_state_hits(cache_box, seen):
    """A factory whose cache records, at each match, the deepest node end holding a
    state on the matched path, from a walk over every node's full path (not the
    replay's upward walk)."""
    from .components.swa.swa_support import nodes

    def factory(*args, **kw):
        cache = default_cache_factory(*args, **kw)
        real = cache.match_prefix

        def match(params):
            m = real(params)
            key = np.asarray(params.key.token_ids).tolist()
            best = 0
            for info in nodes(cache):
                p = info["path"]
                if info["has_mamba"] and len(p) <= m.full_kv_hit_length and key[:len(p)] == p:
                    best = max(best, len(p))
            seen.append((m.device_prefix_len, best, m.full_kv_hit_length))
            return m

        cache.match_prefix = match
        cache_box["cache"] = cache
        return cache
    return factory


@pytest.mark.parametrize("window, capacity", [(2, None), (4, 600), (8, 400)])
def test_the_split_of_the_lost_hits_matches_a_tree_walk(window, capacity):
    """One request at a time with a state per request (one match each): per request,
    Full KV hit - checkpoint_lost = the deepest state on the path at admission, which
    lies between the hit and the Full KV hit; both losses occur."""
    w = extending_workload(250, seed=window)
    seen, box = [], {}
    r = replay(w, capacity=capacity, page_size=1, mamba_states=250, swa_window=window,
               swa_eviction_interval=1, record_requests=True,
               cache_factory=_oracle_state_hits(box, seen))
    assert len(seen) == 250 and r.rejected_requests == 0
    pr = r.per_request
    hit, state, full = (np.array(x) for x in zip(*seen))
    assert pr["hit_tokens"].tolist() == hit.tolist()
    assert pr["full_kv_hit_tokens"].tolist() == full.tolist()
    assert (pr["full_kv_hit_tokens"] - pr["checkpoint_lost_hit_tokens"]).tolist() == \
        state.tolist()
    assert ((hit <= state) & (state <= full)).all()
    assert (pr["window_lost_hit_tokens"] + pr["checkpoint_lost_hit_tokens"]).tolist() == \
        (full - hit).tolist()
    assert r.window_lost_hit_tokens > 0 and r.checkpoint_lost_hit_tokens > 0
    assert r.window_lost_hit_tokens == int(pr["window_lost_hit_tokens"].sum())
    assert r.kv_conserved


@pytest.mark.parametrize("capacity, states, max_running, window, ratio, arrival", [
    (600, 4, 1, 4, 0.5, False), (500, 2, 6, 8, 0.25, False), (None, 3, 4, 2, None, False),
    (800, 8, 8, 16, 1.0, True), (20_000, 16, 4, 64, 0.5, False)])
def test_three_pool_partition_after_replay(capacity, states, max_running, window, ratio,
                                           arrival):
    w = (synthetic_workload(200, block_size=16, seed=5) if capacity == 20_000
         else extending_workload(250, seed=7))
    box = {}
    r = replay(w, capacity=capacity, page_size=1, max_running=max_running, mamba_states=states,
               swa_window=window, swa_ratio=ratio, swa_eviction_interval=1,
               cache_factory=_capturing_factory(box),
               arrival=ArrivalModel(decode_tokens_per_s=200) if arrival else None)
    assert r.kv_conserved and r.swa_slid_tokens > 0
    assert r.peak_mamba_tree_states <= states
    assert r.served_requests + r.rejected_requests == len(w)
    full, swa, n = _assert_three_pool_partition(box["cache"], box["alloc"], box["pool"])
    assert (r.final_tree_tokens, r.final_swa_tree_tokens, r.final_mamba_tree_states) == (
        full, swa, n)
    if capacity is not None:
        assert r.swa_pool_slots == int(capacity * (ratio or 0.8)) and r.evicted_tokens > 0


@pytest.mark.parametrize("leak, what", [("swa", "; SWA: available"),
                                        ("state", "; Mamba states: available")])
def test_a_leaked_swa_or_state_slot_breaks_conservation(leak, what):
    """The end check covers both auxiliary pools: one SWA slot (or one state slot)
    taken behind the replay's back is reported."""
    def factory(*args, **kw):
        cache = default_cache_factory(*args, **kw)
        if leak == "swa":
            args[2].swa_attn_allocator.alloc(1)
        else:
            args[3].mamba_allocator.alloc(1)
        return cache

    kw = dict(page_size=1, mamba_states=10, cache_factory=factory, **SWA_KW)
    with pytest.raises(AssertionError, match=what):
        replay(_workload(*SIX), **kw)
    assert not replay(_workload(*SIX), check=False, **kw).kv_conserved


@pytest.mark.parametrize("kw, what", [
    (dict(mamba_states=8, swa_window=8, page_size=16), "needs page_size=1"),
    (dict(mamba_states=8, swa_window=8, driver="core"), "driver='request'"),
    (dict(mamba_states=8, swa_window=0), "swa_window must be in"),
    (dict(mamba_states=0, swa_window=8), "mamba_states must be >= 1"),
    (dict(mamba_states=8, swa_window=8, swa_ratio=0.01, capacity=20),
     "SWA pool .* less than one page"),
])
def test_triple_replay_rejects_bad_options(kw, what):
    with pytest.raises(ValueError, match=what):
        replay(_workload(*SIX), **{"page_size": 1, **kw})


# ---------------------------------------------------------------- reports
def test_triple_report_text():
    r = replay(_workload(*SIX), page_size=1, mamba_states=10, **SWA_KW)
    text = format_report(r)
    for s in ("page size 1 |", "sliding window 2 tokens | SWA pool 49 tokens (swa ratio 1)",
              "Mamba state pool 10 states | chunk 64 (no extra buffer)",
              "hit tokens      20 (", "lost to window  8 (11.11 % of prompt tokens: Full KV "
              "cached, a state at its end, its window's SWA KV dropped)",
              "lost to ckpt    11 (15.28 % of prompt tokens: Full KV cached, no Mamba state",
              "evicted         Full 0 tokens, SWA 0 tokens, Mamba 0 states (0 evict calls)",
              "window slides   12 SWA slots freed (7 calls)",
              "state waits     0 completions waited for a free state slot",
              "peak tree size  32 Full tokens, 32 SWA tokens, 5 Mamba states",
              "KV conservation ok", "evict_sliding_windows"):
        assert s in text, s


def test_triple_sweep_over_states_and_over_windows(tmp_path):
    """The series are the state pools (one window) or the windows (one state pool);
    both listing several is refused. Table, CSV (sweep, runs, per request), plot."""
    w = extending_workload(150, seed=3)
    curve = sweep(w, [300, 600], swa_windows=[4], mamba_states=[2, 64], page_size=1,
                  swa_ratio=0.5)
    assert [(p["mamba_states"], p["swa_window"], p["capacity"]) for p in curve["points"]] == [
        (2, 4, 300), (2, 4, 600), (64, 4, 300), (64, 4, 600)]
    sm = curve["swa_mamba"]
    assert (sm["series"], sm["windows"], sm["states"], sm["ratio"], sm["chunk"]) == (
        "mamba_states", [4], [2, 64], 0.5, 64)
    assert [p["mamba_states"] for p in sm["unbounded"]] == [2, 64]
    assert "swa" not in curve and "mamba" not in curve
    # a point is the single run's figures
    one = replay(w, capacity=600, page_size=1, swa_window=4, swa_ratio=0.5, mamba_states=64)
    p = curve["points"][3]
    for k in ("hit_tokens", "window_lost_hit_tokens", "checkpoint_lost_hit_tokens",
              "swa_evicted_tokens", "mamba_evicted_states", "evicted_tokens"):
        assert p[k] == getattr(one, k), k
    text = format_sweep(curve).splitlines()
    assert text[0] == ("sliding-window + Mamba replay: page 1, SWA pool = 0.5 x capacity, "
                       "chunk 64, states = the state pool")
    assert text[1].split()[:5] == ["policy", "window", "states", "capacity", "SWA"]
    for h in ("lost to W", "lost to ckpt", "SWA evicted", "states evicted"):
        assert h in text[1], h
    assert len(text) == 2 + 4 + 2
    write_sweep_csv(curve, tmp_path / "c.csv")
    rows = list(csv.DictReader(open(tmp_path / "c.csv")))
    assert len(rows) == 6 and rows[-1]["capacity"] == "inf" and rows[-1]["mamba_states"] == "64"
    assert int(rows[3]["window_lost_hit_tokens"]) == one.window_lost_hit_tokens
    assert int(rows[3]["checkpoint_lost_hit_tokens"]) == one.checkpoint_lost_hit_tokens
    by_w = sweep(w, [600], swa_windows=[2, 16], mamba_states=[8], page_size=1)
    assert by_w["swa_mamba"]["series"] == "swa_window"
    assert [(p["swa_window"], p["mamba_states"]) for p in by_w["points"]] == [(2, 8), (16, 8)]
    assert format_sweep(by_w).splitlines()[2].split()[1:3] == ["2", "8"]
    with pytest.raises(ValueError, match=r"swa_windows \(2\) and mamba_states \(2\) both list "
                                         r"several values"):
        sweep(w, [600], swa_windows=[2, 16], mamba_states=[8, 16], page_size=1)
    runs = [replay(w, capacity=600, page_size=1, swa_window=4, mamba_states=n,
                   record_requests=True) for n in (2, 64)]
    write_runs_csv(runs, tmp_path / "r.csv")
    rows = list(csv.DictReader(open(tmp_path / "r.csv")))
    assert [int(x["mamba_evicted_states"]) for x in rows] == [r.mamba_evicted_states for r in runs]
    assert [int(x["swa_evicted_tokens"]) for x in rows] == [r.swa_evicted_tokens for r in runs]
    write_per_request_csv(runs, tmp_path / "p.csv")
    rows = list(csv.DictReader(open(tmp_path / "p.csv")))
    assert list(rows[0])[11:] == ["swa_window", "mamba_states", "swa_evicted_tokens",
                                  "mamba_evicted_states", "full_kv_hit_tokens",
                                  "window_lost_hit_tokens", "checkpoint_lost_hit_tokens"]
    assert len(rows) == 300 and rows[0]["swa_window"] == "4" and rows[0]["mamba_states"] == "2"
    assert sum(int(x["window_lost_hit_tokens"]) for x in rows[:150]) == \
        runs[0].window_lost_hit_tokens
    assert sum(int(x["checkpoint_lost_hit_tokens"]) for x in rows[150:]) == \
        runs[1].checkpoint_lost_hit_tokens
    pytest.importorskip("matplotlib")
    from flatradix.replay import plot_sweep

    plot_sweep(curve, tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 1000


def test_triple_parallel_sweep_equals_sequential():
    w = extending_workload(100, seed=2)
    kw = dict(page_size=1, swa_windows=[2, 8], mamba_states=[4], swa_ratio=0.5)

    def strip(c):
        for p in c["points"] + c["swa_mamba"]["unbounded"] + [c["unbounded"]]:
            p.pop("wall_s")
        return c
    assert strip(sweep(w, [400], jobs=2, **kw)) == strip(sweep(w, [400], **kw))


# ---------------------------------------------------------------- CLI (_cli: test_replay_mamba's)


def test_cli_triple_json_and_text():
    """Two state pools with one window: one run each, page 1, both modes' fields."""
    rc, out, err = _cli("--limit", "40", "--capacity", "8k", "--swa-window", "256",
                        "--swa-ratio", "0.5", "--mamba-states", "4,64", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert [(x["swa_window"], x["mamba_states"]) for x in d] == [(256, 4), (256, 64)]
    for x in d:
        assert x["page_size"] == 1 and x["kv_conserved"] and x["swa_pool_slots"] == 4_000
        for k in ("window_lost_hit_tokens", "swa_evicted_tokens", "swa_slid_tokens",
                  "checkpoint_lost_hit_tokens", "mamba_evicted_states", "mamba_waits",
                  "peak_swa_tree_tokens", "peak_mamba_tree_states"):
            assert k in x, k
    assert d[1]["mamba_pool_slots"] == 40
    rc, out, err = _cli("--limit", "40", "--capacity", "8k", "--swa-window", "256,1024",
                        "--mamba-states", "4")
    assert rc == 0, err
    assert out.count("flatradix replay:") == 2
    for s in ("sliding window 256 tokens", "sliding window 1,024 tokens",
              "Mamba state pool 4 states | chunk 64", "lost to window", "lost to ckpt",
              "window slides", "state waits", "Mamba", "evict_sliding_windows"):
        assert s in out, s


def test_cli_triple_sweep_and_per_request(tmp_path):
    rc, out, err = _cli("--limit", "40", "--sweep", "8k", "--swa-window", "256",
                        "--mamba-states", "4,64", "--csv", tmp_path / "s.csv")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("sliding-window + Mamba replay: page 1, SWA pool = 0.8 x")
    assert len(lines) == 2 + 2 + 2
    assert "checkpoint_lost_hit_tokens" in (tmp_path / "s.csv").read_text().splitlines()[0]
    rc, out, err = _cli("--limit", "40", "--capacity", "8k", "--swa-window", "256",
                        "--mamba-states", "4", "--per-request", tmp_path / "p.csv", "--json")
    assert rc == 0, err
    rows = list(csv.DictReader(open(tmp_path / "p.csv")))
    assert len(rows) == 40 and rows[0]["swa_window"] == "256" and rows[0]["mamba_states"] == "4"
    assert sum(int(x["checkpoint_lost_hit_tokens"]) for x in rows) == \
        json.loads(out)["checkpoint_lost_hit_tokens"]


def test_cli_triple_with_a_model_config(tmp_path):
    """A Qwen3-Next-shaped config with a quarter of its layers sliding (W 4096): 12
    full-attention, 12 sliding-window, 24 linear layers. Full and SWA KV are each
    12 x 2 x 2 KV heads x 256 x 2 B = 24,576 bytes/token, so 40 GiB at R = 0.5 buys
    42,949,672,960 / 36,864 = 1,165,084 full tokens (page 1) and 582,542 SWA tokens;
    a state is 24 x (24,576 conv elements x 2 B + 524,288 SSM x 4 B) = 51,511,296 B."""
    cfg = json.loads((EXAMPLES / "qwen3-next-80b-like.json").read_text())
    cfg.pop("full_attention_interval")
    cfg.update(layer_types=["linear_attention", "linear_attention", "sliding_attention",
                            "full_attention"] * 12, sliding_window=4096)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    rc, out, err = _cli("--limit", "30", "--model-config", path, "--kv-memory", "40GiB",
                        "--swa-window", "model", "--swa-ratio", "0.5", "--mamba-states", "64")
    assert rc == 0, err
    for s in ("capacity 1,165,084 tokens", "sliding window 4,096 tokens",
              "sliding-window pool 582,542 tokens = 13.3 GiB (14,316,552,192 bytes); both pools "
              "40 GiB (42,949,656,576 bytes)",
              "Mamba state pool 64 states = 3.07 GiB (3,296,722,944 bytes), besides the "
              "full-attention and sliding-window pools",
              "sliding-window KV 24,576 bytes/token, for the last 4,096 tokens of a request "
              "(own pool; replayed)",
              "Mamba state 51,511,296 bytes/request (conv bfloat16, SSM float32; own pool; "
              "replayed)", "Mamba state pool 64 states | chunk 64",
              "lost to window", "lost to ckpt"):
        assert s in out, s


@pytest.mark.parametrize("args, needles", [
    (["--swa-window", "256,1024", "--mamba-states", "4,8"],
     ["--swa-window (2 windows) and --mamba-states (2 state counts) both list several values",
      "give one window or one state count"]),
    (["--sweep", "8k", "--swa-window", "256,1024", "--mamba-states", "4,8"],
     ["both list several values"]),
    (["--swa-window", "256", "--mamba-states", "4", "--page-size", "16"],
     ["--mamba-states needs --page-size 1"]),
    (["--swa-window", "256", "--mamba-states", "4", "--kv-bytes-per-token", "1000"],
     ["--kv-bytes-per-token gives one pool's bytes"]),
    (["--swa-window", "256", "--mamba-states", "4", "--model-config",
      str(EXAMPLES / "qwen3-next-80b-like.json")], ["--swa-window", "no sliding-window layer"]),
    (["--swa-window", "model", "--mamba-states", "4", "--model-config",
      str(EXAMPLES / "gpt-oss-20b-like.json")],
     ["--mamba-states", "no linear-attention / Mamba layer"]),
])
def test_cli_triple_refusals_are_one_line(args, needles):
    rc, out, err = _cli("--limit", "5", *args)
    assert rc == 2 and out == "" and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flatradix replay: error: "), err
    for s in needles:
        assert s in lines[0], (s, lines[0])


# ---------------------------------------------------------------- the trace
def test_triple_on_a_prefix_of_the_trace():
    """The trace's first 300 requests at 1M tokens: every pool conserved, the split
    adds up, and a window no request slides past gives the Mamba-only run."""
    w = load_mooncake(SAMPLE, limit=300)
    kw = dict(capacity=1_000_000, page_size=1, mamba_states=32, record_requests=True)
    m = replay(w, **kw)
    b = replay(w, swa_window=4096, **kw)
    assert b.kv_conserved and b.peak_mamba_tree_states <= 32
    pr = b.per_request
    assert ((pr["window_lost_hit_tokens"] >= 0) & (pr["checkpoint_lost_hit_tokens"] >= 0)).all()
    assert b.hit_tokens + b.window_lost_hit_tokens + b.checkpoint_lost_hit_tokens == \
        int(pr["full_kv_hit_tokens"].sum())
    longest = int((w.input_lengths + w.output_lengths).max())
    same = replay(w, swa_window=longest, swa_ratio=1.0, **kw)
    assert same.per_request["hit_tokens"].tolist() == m.per_request["hit_tokens"].tolist()
    assert same.checkpoint_lost_hit_tokens == m.checkpoint_lost_hit_tokens
