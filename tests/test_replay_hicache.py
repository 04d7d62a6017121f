"""``flatradix replay --host-capacity H``: the replay with the host tier (HiCache), as
SGLang's scheduler drives it: every scheduler step polls ``check_hicache_events``;
an admission whose match continues on the host (``host_hit_length > 0``) calls
``init_load_back`` (``req.last_node`` the device match), locks the loaded node,
allocates the rest, then ``ready_to_load_host_cache`` and ``loading_check``.

Exact values: hand-worked runs (device hits, host hits = tokens loaded back,
misses, evictions, per request), the run with no host slot equals the Full-only
run request by request, and with an unbounded host pool (write-through keeps
every cached prefix on the host) the hits are those of an unbounded device pool,
the hash-id oracle of ``tests/test_replay.py``. The trace test reads
the whole Mooncake conversation trace (``TRACE`` of ``tests/test_replay.py``) and skips, saying how to get it, where it is
absent.
"""

import csv
import importlib.util
import json
import math

import numpy as np
import pytest

from flatradix.replay import (ArrivalModel, format_report, format_sweep, load_mooncake, replay,
                              sweep, synthetic_workload, write_per_request_csv, write_runs_csv,
                              write_sweep_csv)
from flatradix.replay.sim import HOST_FIELDS

from .test_replay import TRACE, expected_hits, needs_trace, workload_requests
from .test_replay_mamba import _cli, _workload


def _capturing_factory(box):
    from flatradix.replay import default_cache_factory

    def factory(*args, **kw):
        box["cache"] = default_cache_factory(*args, **kw)
        box["alloc"] = args[2]
        return box["cache"]
    return factory


def _assert_both_tiers_partitioned(cache, alloc):
    """Device: every slot free or in the tree once; host: every slot free or holding
    one node's host copy once; nothing locked, no backup or load in flight."""
    tree = np.asarray(cache.all_values_flatten(), dtype=np.int64)
    assert np.unique(tree).size == tree.size
    assert tree.size + alloc.available_size() == alloc.size
    assert cache.total_size()[0] == tree.size and cache.protected_size() == 0
    host = cache.mem_pool_host
    htree = np.asarray(cache.all_host_values_flatten(), dtype=np.int64)
    assert np.unique(htree).size == htree.size
    assert ((htree >= 0) & (htree < host.size)).all()
    assert htree.size + host.available_size() == host.size
    assert cache.host_total_size() == htree.size
    assert cache.ongoing_write_through == {} and cache.ongoing_load_back == {}
    cache.sanity_check()


# ---------------------------------------------------------------- by hand
# blocks of 4 tokens, page 4, one request at a time, one output token each
HAND = ([[1, 2, 3], [4, 5, 6], [1, 2, 3, 7], [4, 5, 8], [1, 2, 3, 7], [1, 2, 3, 9]],
        [12, 12, 16, 12, 16, 16], [1] * 6)


def test_host_replay_by_hand():
    """Device pool 24 tokens, host pool 64 (sized to the 36 distinct prefix tokens: 9
    blocks), write_through (each new node backed up at its insert, pinned on the device
    until the next step's check_hicache_events), threshold 10. A = [1,2,3], B = [4,5,6].
    r0 A (12): miss 12; alloc 13 of 24. Finished (before r1's step): A cached and
      backed up (host 12); 12 device slots free.
    r1 B (12): miss 12; needs 13 > 12: evict A, backed up: demoted (host-only);
      evicted 12. Finished: B cached, backed up (host 24).
    r2 [1,2,3,7] (16): A on the host only: host_hit_length 12 >= 10: init_load_back
      loads A into the 12 free slots (no eviction); the request locks A, needs 4 + 1 =
      5, none free: B demoted (12). Host hit 12, miss 4. Finished: leaf C = [7] under A,
      backed up (host 28); 8 free.
    r3 [4,5,8] (12): matches [4,5] of host-only B (split: B1 = [4,5], B2 = [6]):
      host_hit_length 8 < 10: declined, recomputed: miss 12. Needs 13 > 8: evicts C
      (4) then A, now a device leaf (12): 16 demoted. Finished: the insert walks B1
      (host-only): B1 takes the request's first 8 slots as its device value; new leaf
      D = [8] backed up (host 32). Device B1 + D = 12, 12 free.
    r4 [1,2,3,7] (16): A and C host-only: host hit 16: init_load_back needs 16 > 12
      free: it evicts D (4, demoted) and loads A and C. The request needs 1, none
      free: B1 demoted (8). Host hit 16, miss 0; evicted 12 (4 by the load-back).
      Finished: nothing new (its whole prompt is the loaded path).
    r5 [1,2,3,9] (16): A on the device: device hit 12, miss 4, 8 free: no eviction.
      Finished: leaf E = [9], backed up: host 36, the whole host pool.
    Device hits 12, host hits 12 + 16 = 28 (2 loads), misses 84 - 40 = 44, declined 8;
    evicted 12 + 12 + 16 + 12 = 52. The Full-only replay hits r5's 12 tokens only."""
    box = {}
    r = replay(_workload(*HAND), capacity=24, page_size=4, host_capacity=64,
               record_requests=True, cache_factory=_capturing_factory(box))
    pr = r.per_request
    assert pr["device_hit_tokens"].tolist() == [0, 0, 0, 0, 0, 12]
    assert pr["host_hit_tokens"].tolist() == [0, 0, 12, 0, 16, 0]
    assert pr["hit_tokens"].tolist() == [0, 0, 12, 0, 16, 12]
    assert pr["miss_tokens"].tolist() == [12, 12, 4, 12, 0, 4]
    assert pr["host_match_tokens"].tolist() == [0, 0, 12, 8, 16, 0]
    assert pr["evicted_tokens"].tolist() == [0, 12, 12, 16, 12, 0]
    assert (r.device_hit_tokens, r.host_hit_tokens, r.miss_tokens) == (12, 28, 44)
    assert r.hit_tokens == 40 and r.prompt_tokens == 84
    assert r.token_hit_ratio == 40 / 84 and r.host_hit_ratio == 28 / 84
    assert (r.load_backs, r.loaded_tokens, r.declined_host_tokens) == (2, 28, 8)
    assert (r.evicted_tokens, r.load_evicted_tokens) == (52, 4)
    assert r.host_capacity == 64 and r.host_pool_slots == 36
    assert "host pool sized to 36 tokens" in r.notes[0]
    assert r.peak_host_tree_tokens == r.final_host_tree_tokens == 36
    assert r.final_tree_tokens == 20 and r.kv_conserved
    assert (r.write_policy, r.load_back_threshold) == ("write_through", 10)
    assert r.latency_us["init_load_back"]["count"] == 3     # r2, r3 (declined), r4
    assert r.latency_us["loading_check"]["count"] == 2
    assert r.latency_us["check_hicache_events"]["count"] == 7   # 6 admissions + the end
    _assert_both_tiers_partitioned(box["cache"], box["alloc"])
    full = replay(_workload(*HAND), capacity=24, page_size=4, record_requests=True)
    assert full.per_request["hit_tokens"].tolist() == [0, 0, 0, 0, 0, 12]
    assert full.per_request["evicted_tokens"].tolist() == [0, 12, 12, 16, 12, 0]


def test_write_back_by_hand():
    """The same six requests under write_back: nothing is backed up at insert; each
    eviction backs its victim up first (A at r1, B at r2, C and then A -- already on
    both tiers, demoted only -- at r3, D and then B1 at r4). The hits, misses and
    evictions are those of write_through; the host holds A, B, C, D = 32 tokens at
    the end: r5's leaf E = [9] is never evicted, so never backed up (36 under
    write_through)."""
    box = {}
    r = replay(_workload(*HAND), capacity=24, page_size=4, host_capacity=64,
               write_policy="write_back", record_requests=True,
               cache_factory=_capturing_factory(box))
    pr = r.per_request
    assert pr["host_hit_tokens"].tolist() == [0, 0, 12, 0, 16, 0]
    assert pr["miss_tokens"].tolist() == [12, 12, 4, 12, 0, 4]
    assert pr["evicted_tokens"].tolist() == [0, 12, 12, 16, 12, 0]
    assert (r.device_hit_tokens, r.host_hit_tokens, r.miss_tokens) == (12, 28, 44)
    assert r.final_host_tree_tokens == 32 and r.kv_conserved
    assert r.write_policy == "write_back"
    _assert_both_tiers_partitioned(box["cache"], box["alloc"])


def test_a_small_host_pool_evicts_host_copies_by_hand():
    """The same requests with a host pool of 24 tokens (two prompts).
    r1's backup of B fills it (A 12 + B 12). r2 loads A (host hit 12) and demotes B.
    r2's leaf C = [7] needs 4 host slots: the only host leaf that may go is B
      (host-only; A is on both tiers): B's host copy is evicted (host A + C = 16).
    r3 [4,5,8]: nothing cached (B is gone): miss 12; evicts C and A (16, demoted). Its
      leaf D = [4,5,8] needs 12 host slots, 8 free: C goes (a host-only leaf; A has
      child C until then): host A + D = 24.
    r4 [1,2,3,7]: A host-only: host hit 12 (C is gone), loaded into the 12 free slots;
      needs 5: D demoted (12); miss 4. Its leaf C' = [7]: D's host copy goes.
    r5: device hit 12 (A), miss 4; its leaf [9] backed up: host 12 + 4 + 4 = 20.
    Hits 12 + 12 + 12 = 36, misses 48, no load evicted anything."""
    box = {}
    r = replay(_workload(*HAND), capacity=24, page_size=4, host_capacity=24,
               record_requests=True, cache_factory=_capturing_factory(box))
    pr = r.per_request
    assert pr["device_hit_tokens"].tolist() == [0, 0, 0, 0, 0, 12]
    assert pr["host_hit_tokens"].tolist() == [0, 0, 12, 0, 12, 0]
    assert pr["miss_tokens"].tolist() == [12, 12, 4, 12, 4, 4] and r.miss_tokens == 48
    assert pr["host_match_tokens"].tolist() == [0, 0, 12, 0, 12, 0]
    assert pr["evicted_tokens"].tolist() == [0, 12, 12, 16, 12, 0]
    assert (r.load_backs, r.load_evicted_tokens, r.declined_host_tokens) == (2, 0, 0)
    assert r.host_pool_slots == 24 and not r.notes
    assert (r.peak_host_tree_tokens, r.final_host_tree_tokens) == (24, 20)
    assert r.kv_conserved
    _assert_both_tiers_partitioned(box["cache"], box["alloc"])


def test_load_back_threshold_one_loads_the_short_host_hit():
    """Threshold 1: r3's 8 host tokens ([4,5] of B) are loaded into its 8 free slots;
    it needs 4 + 1 more: C and A are demoted (16) as before. Host hits 12 + 8 + 16."""
    r = replay(_workload(*HAND), capacity=24, page_size=4, host_capacity=64,
               load_back_threshold=1, record_requests=True)
    pr = r.per_request
    assert pr["host_hit_tokens"].tolist() == [0, 0, 12, 8, 16, 0]
    assert pr["miss_tokens"].tolist() == [12, 12, 4, 4, 0, 4]
    assert pr["evicted_tokens"].tolist() == [0, 12, 12, 16, 12, 0]
    assert (r.load_backs, r.loaded_tokens, r.declined_host_tokens) == (3, 36, 0)
    assert r.load_back_threshold == 1 and r.kv_conserved


def test_selective_backs_up_at_the_second_hit_by_hand():
    """write_through_selective: a node is backed up at its second hit. Every prompt
    here is inserted once before its node is evicted, so nothing is on the host when
    a request could use it: the Full-only run's hits (r5's 12). r5's match splits
    r4's leaf [1,2,3,7]: the fragment A = [1,2,3] keeps its hit count (1), and r5's
    insert walks it (its second hit): A is backed up at the end (12 host tokens)."""
    box = {}
    r = replay(_workload(*HAND), capacity=24, page_size=4, host_capacity=64,
               write_policy="write_through_selective", record_requests=True,
               cache_factory=_capturing_factory(box))
    assert r.per_request["hit_tokens"].tolist() == [0, 0, 0, 0, 0, 12]
    assert r.host_hit_tokens == 0 and r.load_backs == 0 and r.device_hit_tokens == 12
    assert r.peak_host_tree_tokens == r.final_host_tree_tokens == 12
    assert r.write_policy == "write_through_selective" and r.kv_conserved
    _assert_both_tiers_partitioned(box["cache"], box["alloc"])


# ---------------------------------------------------------------- against other runs
@pytest.mark.parametrize("capacity,max_running,policy,arrival", [
    (8_000, 1, "lru", False), (20_000, 4, "lfu", False), (6_000, 3, "fifo", True),
    (30_000, 16, "lru", True)])
def test_no_host_slot_is_the_full_only_run(capacity, max_running, policy, arrival):
    """A host pool of 0 tokens backs nothing up (each backup finds no host slot and
    ends, as SGLang's controller): the run is the Full-only run, request by request."""
    w = synthetic_workload(250, block_size=16, seed=6)
    kw = dict(capacity=capacity, max_running=max_running, policy=policy, record_hits=True,
              record_requests=True, arrival=ArrivalModel(decode_tokens_per_s=20) if arrival
              else None)
    a = replay(w, **kw)
    b = replay(w, host_capacity=0, **kw)
    np.testing.assert_array_equal(a.hits, b.hits)
    for k in ("hit_tokens", "evicted_tokens", "evict_calls", "waits", "rejected_requests",
              "peak_tree_tokens", "final_tree_tokens"):
        assert getattr(a, k) == getattr(b, k), k
    np.testing.assert_array_equal(a.per_request["evicted_tokens"], b.per_request["evicted_tokens"])
    if arrival:
        np.testing.assert_array_equal(a.per_request["finish_ms"], b.per_request["finish_ms"])
    assert b.host_hit_tokens == 0 and b.device_hit_tokens == b.hit_tokens
    assert b.host_pool_slots == 0 and b.peak_host_tree_tokens == 0 and b.kv_conserved


@pytest.mark.parametrize("capacity", [6_000, 12_000])   # the largest request: 5,330
def test_an_unbounded_host_pool_keeps_every_hit(capacity):
    """Write-through backs every cached node up, and a host pool as large as the
    workload never evicts: no prefix is ever lost, so one request at a time the hits
    (device + host) are the unbounded device pool's, the hash-id oracle's."""
    w = synthetic_workload(250, block_size=16, seed=8)
    r = replay(w, capacity=capacity, host_capacity=math.inf, record_requests=True)
    assert r.hit_tokens == expected_hits(workload_requests(w), 16, 16)
    assert r.host_hit_tokens > 0 and r.declined_host_tokens == 0
    assert r.host_capacity == "inf" and r.evicted_tokens > 0 and r.rejected_requests == 0
    assert r.kv_conserved
    small = replay(w, capacity=capacity, host_capacity=capacity)
    assert small.hit_tokens < r.hit_tokens


@pytest.mark.parametrize("capacity,host,max_running,policy,write_policy,arrival", [
    (4_000, 6_000, 1, "lru", "write_through", False),
    (6_000, 3_000, 4, "lfu", "write_through", False),
    (5_000, 20_000, 8, "fifo", "write_through_selective", True),
    (16_000, 16_000, 2, "slru", "write_through_selective", False),
    (3_000, 9_000, 3, "priority", "write_through", True),
    (4_000, 6_000, 1, "lru", "write_back", False),
    (5_000, 2_000, 4, "lfu", "write_back", True),
])
def test_both_tiers_partitioned_after_replay(capacity, host, max_running, policy,
                                             write_policy, arrival):
    box = {}
    w = synthetic_workload(200, block_size=16, seed=5)
    r = replay(w, capacity=capacity, host_capacity=host, max_running=max_running,
               policy=policy, write_policy=write_policy, record_requests=True,
               arrival=ArrivalModel(decode_tokens_per_s=30) if arrival else None,
               cache_factory=_capturing_factory(box))
    assert r.kv_conserved
    pr = r.per_request
    served = ~pr["rejected"]
    np.testing.assert_array_equal(pr["hit_tokens"], pr["device_hit_tokens"] + pr["host_hit_tokens"])
    np.testing.assert_array_equal(pr["miss_tokens"] + pr["hit_tokens"], pr["prompt_tokens"])
    assert (pr["host_hit_tokens"][served] <= pr["host_match_tokens"][served]).all()
    assert r.device_hit_tokens + r.host_hit_tokens + r.miss_tokens == r.prompt_tokens
    assert r.host_hit_tokens <= r.loaded_tokens and r.peak_host_tree_tokens <= r.host_pool_slots
    assert r.evicted_tokens == pr["evicted_tokens"].sum()
    _assert_both_tiers_partitioned(box["cache"], box["alloc"])


def test_warm_up_workload_loads_back_and_evicts_host_copies():
    """The host mode's JIT warm-up runs the load-back and host eviction paths."""
    from flatradix.replay import Workload

    two = Workload("warm-up", 4, np.zeros(3), np.full(3, 8, dtype=np.int64),
                   np.ones(3, dtype=np.int64), np.array([0, 2, 4, 6], dtype=np.int64),
                   np.array([0, 1, 2, 3, 0, 1], dtype=np.int64))
    a = replay(two, capacity=10, page_size=1, host_capacity=16, load_back_threshold=1)
    assert a.load_backs == 1 and a.host_hit_tokens == 8
    b = replay(two, capacity=10, page_size=1, host_capacity=12, load_back_threshold=1)
    assert b.load_backs == 0 and b.host_hit_tokens == 0 and b.final_host_tree_tokens == 8


# ---------------------------------------------------------------- bad options
@pytest.mark.parametrize("kw,err,what", [
    (dict(host_capacity=1000, mamba_states=4, mamba_extra_buffer=True), ValueError,
     "host_capacity \\(the host tier\\) with mamba_extra_buffer"),
    (dict(host_capacity=1000, write_policy="write_sideways"), ValueError,
     "write_policy must be one of write_through, write_through_selective, write_back"),
    (dict(write_policy="write_through"), ValueError, "write_policy needs host_capacity"),
    (dict(load_back_threshold=5), ValueError, "load_back_threshold needs host_capacity"),
    (dict(host_capacity=-1), ValueError, "host_capacity must be >= 0"),
    (dict(host_capacity=1000, load_back_threshold=-1), ValueError,
     "load_back_threshold must be in \\[0, "),
    (dict(host_capacity=1000, driver="core"), ValueError, "driver='request'"),
    (dict(host_capacity="8"), TypeError, "host_capacity must be an int"),
    (dict(host_capacity=1.5), TypeError, "host_capacity must be an int"),
    (dict(host_capacity=True), TypeError, "host_capacity must be an int"),
    (dict(host_capacity=100, load_back_threshold=2.0), TypeError,
     "load_back_threshold must be an int"),
])
def test_host_replay_rejects_bad_options(kw, err, what):
    with pytest.raises(err, match=what):
        replay(_workload(*HAND), **{"capacity": 24, "page_size": 4, **kw})


def test_sweep_refuses_host_pools_with_several_windows():
    # one window and one state pool run with a host tier (tests/test_replay_hicache_hybrid.py)
    w = _workload(*HAND)
    with pytest.raises(ValueError, match="host_capacities \\(the host tier\\) with 2 "
                                         "swa_windows"):
        sweep(w, [24], swa_windows=[64, 128], host_capacities=[0, 32], page_size=4)


# ---------------------------------------------------------------- reports
def test_host_report_text_and_json():
    r = replay(_workload(*HAND), capacity=24, page_size=4, host_capacity=64)
    text = format_report(r)
    for s in ("host tier 64 tokens (pool 36) | write_through | load-back threshold 10",
              "hit tokens      40 (47.62 % token hit ratio: device + host)",
              "device hits     12 (14.29 %)",
              "host hits       28 (33.33 %: loaded back, 2 loads; 8 more on the host "
              "recomputed",
              "misses          44 (52.38 %: computed)",
              "evicted tokens  52 from the device (4 evict calls; 4 by load-backs)",
              "peak tree size  20 device tokens, 36 host tokens", "KV conservation ok",
              "init_load_back", "check_hicache_events"):
        assert s in text, s
    d = r.to_dict()
    for k in HOST_FIELDS:
        assert k in d, k
    assert d["host_hit_tokens"] == 28 and "swa_window" not in d and "mamba_states" not in d
    json.dumps(d)
    plain = replay(_workload(*HAND), capacity=24, page_size=4).to_dict()
    assert not set(HOST_FIELDS) & set(plain)
    assert "init_load_back" not in format_report(replay(_workload(*HAND), capacity=24,
                                                        page_size=4))


def test_host_csv_files(tmp_path):
    w = synthetic_workload(120, block_size=16, seed=4)
    runs = [replay(w, capacity=5_000, host_capacity=h, record_requests=True)
            for h in (0, 20_000)]
    write_runs_csv(runs, tmp_path / "r.csv")
    rows = list(csv.DictReader(open(tmp_path / "r.csv")))
    assert [int(x["host_capacity"]) for x in rows] == [0, 20_000]
    for row, r in zip(rows, runs):
        for k in ("device_hit_tokens", "host_hit_tokens", "miss_tokens", "loaded_tokens"):
            assert int(row[k]) == getattr(r, k), k
        assert float(row["host_hit_ratio"]) == r.host_hit_ratio
    write_per_request_csv(runs, tmp_path / "p.csv")
    rows = list(csv.DictReader(open(tmp_path / "p.csv")))
    assert len(rows) == 240 and rows[0]["host_capacity"] == "0"
    for k, r in enumerate(runs):
        part = rows[120 * k:120 * (k + 1)]
        assert sum(int(x["host_hit_tokens"]) for x in part) == r.host_hit_tokens
        assert sum(int(x["device_hit_tokens"]) for x in part) == r.device_hit_tokens
        assert sum(int(x["miss_tokens"]) for x in part) == r.miss_tokens
        assert all(int(x["hit_tokens"]) == int(x["device_hit_tokens"]) + int(x["host_hit_tokens"])
                   for x in part)
    assert runs[1].host_hit_tokens > 0


def test_host_sweep_grid_table_csv_and_plot(tmp_path):
    """Two device capacities x three host pools (one unbounded) + one unbounded device
    run; each point is the single replay's figures; the table's grid; the CSV; the
    heatmap."""
    w = synthetic_workload(150, block_size=16, seed=7)
    caps, hosts = [4_000, 10_000], [0, 12_000, math.inf]
    curve = sweep(w, caps, host_capacities=hosts)
    assert [(p["host_capacity"], p["capacity"]) for p in curve["points"]] == [
        (0, 4_000), (0, 10_000), (12_000, 4_000), (12_000, 10_000), ("inf", 4_000),
        ("inf", 10_000)]
    h = curve["host"]
    assert h["capacities"] == [0, 12_000, "inf"] and h["write_policy"] == "write_through"
    assert h["load_back_threshold"] == 10 and len(h["unbounded"]) == 1
    assert curve["unbounded"]["capacity"] == "inf"
    for p in curve["points"]:
        r = replay(w, capacity=p["capacity"], host_capacity=(math.inf if p["host_capacity"]
                                                             == "inf" else p["host_capacity"]))
        for k in ("hit_tokens", "device_hit_tokens", "host_hit_tokens", "miss_tokens",
                  "evicted_tokens", "loaded_tokens"):
            assert p[k] == getattr(r, k), (p["host_capacity"], p["capacity"], k)
        assert p["token_hit_ratio"] == p["device_hit_ratio"] + p["host_hit_ratio"] or \
            abs(p["token_hit_ratio"] - p["device_hit_ratio"] - p["host_hit_ratio"]) < 1e-12
    # an unbounded host pool reaches the unbounded device pool's hits
    assert curve["points"][-1]["hit_tokens"] == curve["unbounded"]["hit_tokens"]
    text = format_sweep(curve).splitlines()
    assert text[0].startswith("host tier replay: write_through, load-back threshold 10")
    assert text[1].split()[:3] == ["policy", "host", "capacity"]
    assert len(text) == 2 + 6 + 1 + 1 + 2 + 3
    assert text[-5] == "total hit ratio (%), lru: host pool (rows) x device pool (columns)"
    grid = {line.split()[0]: line.split()[1:] for line in text[-3:]}
    assert set(grid) == {"0", "12k", "inf"}
    assert grid["inf"] == [f"{100 * p['token_hit_ratio']:.2f}" for p in curve["points"][-2:]]
    write_sweep_csv(curve, tmp_path / "c.csv")
    rows = list(csv.DictReader(open(tmp_path / "c.csv")))
    assert len(rows) == 7 and rows[-1]["capacity"] == "inf"
    assert [r["host_capacity"] for r in rows[:6]] == ["0", "0", "12000", "12000", "inf", "inf"]
    assert int(rows[2]["host_hit_tokens"]) == curve["points"][2]["host_hit_tokens"]
    json.dumps(curve)
    pytest.importorskip("matplotlib")
    from flatradix.replay import plot_sweep

    plot_sweep(curve, tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 1000


def test_host_parallel_sweep_equals_sequential():
    w = synthetic_workload(100, block_size=16, seed=2)
    kw = dict(host_capacities=[0, 8_000], write_policy="write_through_selective",
              load_back_threshold=32, policies=("lru", "lfu"))

    def strip(c):
        for p in c["points"] + c["host"]["unbounded"] + [c["unbounded"]]:
            p.pop("wall_s")
        return c
    assert strip(sweep(w, [3_000], jobs=2, **kw)) == strip(sweep(w, [3_000], **kw))


# ---------------------------------------------------------------- CLI
def test_cli_host_runs_json():
    rc, out, err = _cli("--limit", "80", "--capacity", "4k", "--host-capacity", "0,16k",
                        "--load-back-threshold", "16", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert [x["host_capacity"] for x in d] == [0, 16_000]
    assert d[1]["load_back_threshold"] == 16 and d[1]["write_policy"] == "write_through"
    assert d[1]["host_hit_tokens"] > 0 and d[0]["host_hit_tokens"] == 0
    assert all(x["kv_conserved"] for x in d)
    assert d[1]["device_hit_tokens"] + d[1]["host_hit_tokens"] == d[1]["hit_tokens"]


def test_cli_host_text_with_kv_bytes():
    rc, out, err = _cli("--limit", "40", "--capacity", "4k", "--host-capacity", "16k",
                        "--write-policy", "write_through_selective", "--kv-bytes-per-token",
                        "131072")
    assert rc == 0, err
    for s in ("host tier 16,000 tokens", "write_through_selective",
              "host pool 16,000 tokens = 1.95 GiB (2,097,152,000 bytes) of host memory",
              "device hits", "host hits", "misses"):
        assert s in out, s


def test_cli_host_sweep_csv_and_plot(tmp_path):
    args = ["--limit", "60", "--sweep", "3k,6k", "--host-capacity", "0,12k", "--csv",
            tmp_path / "s.csv"]
    if importlib.util.find_spec("matplotlib") is not None:
        args += ["--plot", tmp_path / "s.png"]
    rc, out, err = _cli(*args)
    assert rc == 0, err
    assert out.startswith("host tier replay: write_through")
    assert "total hit ratio (%), lru: host pool (rows) x device pool (columns)" in out
    assert len(list(csv.DictReader(open(tmp_path / "s.csv")))) == 4 + 1
    if "--plot" in args:
        assert (tmp_path / "s.png").stat().st_size > 1000


@pytest.mark.parametrize("args,what", [
    (["--host-capacity", "1M", "--swa-window", "512,1024"],
     "--host-capacity with --swa-window (2 windows): a host tier replay varies the host pool"),
    (["--host-capacity", "1M", "--mamba-states", "8", "--mamba-extra-buffer"],
     "--host-capacity with --mamba-extra-buffer: the replay drives the host tier of the "
     "Mamba mode without the extra buffer only"),
    (["--write-policy", "write_through"], "--write-policy needs --host-capacity"),
    (["--load-back-threshold", "5"], "--load-back-threshold needs --host-capacity"),
    (["--host-capacity", "-1"], "argument --host-capacity: host capacity must be a whole"),
    (["--host-capacity", "lots"], "argument --host-capacity: host capacity must be a token"),
    (["--host-capacity", "1M", "--write-policy", "fast"], "argument --write-policy"),
    (["--host-capacity", "1M", "--load-back-threshold", "-1"],
     "argument --load-back-threshold"),
])
def test_cli_host_errors_are_one_line(args, what):
    rc, out, err = _cli(*args)
    assert rc == 2 and out == "", (rc, out)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flatradix replay: error: "), err
    assert what in lines[0], lines[0]
    assert "Traceback" not in err


# ---------------------------------------------------------------- the trace
@pytest.mark.slow
@needs_trace
def test_host_tier_on_a_prefix_of_the_trace():
    """The first 1,500 requests at page 16 with a 1M-token device pool: no host slot
    gives the Full-only run request by request; a 4M-token host pool loads hits back
    (and conserves both tiers); an unbounded one reaches the unbounded device pool's
    hits, the hash-id oracle's."""
    w = load_mooncake(TRACE, limit=1500)
    full = replay(w, capacity=1_000_000, record_hits=True)
    none = replay(w, capacity=1_000_000, host_capacity=0, record_hits=True)
    np.testing.assert_array_equal(full.hits, none.hits)
    assert none.evicted_tokens == full.evicted_tokens
    rc, out, err = _cli("--trace", TRACE, "--limit", "1500", "--capacity", "1M",
                        "--host-capacity", "4M,inf", "--json")
    assert rc == 0, err
    mid, inf = json.loads(out)
    assert mid["kv_conserved"] and inf["kv_conserved"]
    assert full.hit_tokens < mid["hit_tokens"] < inf["hit_tokens"]
    assert mid["host_hit_tokens"] > 0 and mid["device_hit_tokens"] > 0
    assert inf["hit_tokens"] == expected_hits(workload_requests(w), 16, 512)
