"""``flatradix replay --mamba-states N``: the replay of a hybrid SSM model served
without the Mamba extra buffer (page 1, one state slot per request, the finished
request's state donated to the tree).

Exact values: hand-worked runs (hits, hits lost to checkpoint granularity, waits
for a state slot, evictions), and, unbounded, a plain-Python oracle over the
prompts: request ``i`` hits the longest earlier prompt that is a prefix of its
own (a state exists only where a prompt ended), and its Full KV hit is the
Full-only one (``expected_hits`` of ``tests/test_replay.py``). The trace tests
read ``../shared/traces/mooncake_conversation_trace.jsonl`` and skip where it is
absent.
"""

import contextlib
import csv
import io
import json

import numpy as np
import pytest

from flatradix.cli import main
from flatradix.replay import (Workload, format_report, format_sweep, load_mooncake, replay,
                              sweep, synthetic_workload, write_per_request_csv,
                              write_runs_csv, write_sweep_csv)

from .test_cli import EXAMPLES
from .test_replay import TRACE, expected_hits, needs_trace, workload_requests


def _workload(blocks, lengths, outputs, block_size=4):
    ptr = np.cumsum([0] + [len(b) for b in blocks])
    return Workload("hand", block_size, np.zeros(len(blocks)), np.array(lengths),
                    np.array(outputs), ptr, np.array(sum(blocks, [])))


def _capturing_factory(box):
    from flatradix.replay import default_cache_factory

    def factory(*args, **kw):
        box["cache"] = default_cache_factory(*args, **kw)
        box["alloc"], box["pool"] = args[2], args[3]
        return box["cache"]
    return factory


def _assert_state_partition(cache, alloc, pool):
    """Every Full slot is free or in the tree once; every state slot is free or held
    by exactly one tree node; nothing is locked."""
    tree_full = np.asarray(cache.all_values_flatten(), dtype=np.int64)
    assert np.unique(tree_full).size == tree_full.size
    assert tree_full.size + alloc.available_size() == alloc.size
    states = np.asarray(cache.all_mamba_values_flatten(), dtype=np.int64)
    ma = pool.mamba_allocator
    assert np.unique(states).size == states.size
    assert ma.is_held(states).all()
    assert states.size + ma.available_size() == ma.size
    assert cache.total_size() == (tree_full.size, states.size)
    assert cache.protected_size() == 0 and cache.mamba_protected_size() == 0
    cache.sanity_check()


# ---------------------------------------------------------------- by hand
# blocks of 4 tokens, page 1, one request at a time, nothing evicted
SEVEN = ([[1, 2, 3], [1, 2, 5], [1, 2, 3], [1, 2, 3, 4], [1, 2], [1, 2, 6], [1, 2, 3]],
         [12, 12, 12, 16, 8, 12, 10], [2, 1, 1, 3, 1, 1, 2])


def test_mamba_replay_by_hand():
    """r0 [1,2,3] (12 tokens): empty cache; its state goes to depth 12.
    r1 [1,2,5]: shares the system prompt [1,2] (8 tokens) with r0, but no state was
      checkpointed at 8: Full hit 8, Mamba hit 0, lost 8. Its state: depth 12 of its branch.
    r2 = r0 repeated: hit 12 (r0's state); its own state is freed (the node has one).
    r3 [1,2,3,4] extends r0: hit 12, lost 0; state at 16.
    r4 [1,2] (8): Full hit 8, the node at 8 (a split) holds none: hit 0, lost 8; its
      state goes to that node.
    r5 [1,2,6]: hit 8 (r4's state), Full hit 8.
    r6 [1,2,3] cut at 10: Full hit 10, deepest state on the path at 8: hit 8, lost 2.
    Full-only page 1: 8 + 12 + 12 + 8 + 8 + 10 = 58 = 40 hit + 18 lost."""
    box = {}
    r = replay(_workload(*SEVEN), capacity=None, page_size=1, mamba_states=100,
               record_requests=True, cache_factory=_capturing_factory(box))
    pr = r.per_request
    assert pr["hit_tokens"].tolist() == [0, 0, 12, 12, 0, 8, 8] and r.hit_tokens == 40
    assert pr["full_kv_hit_tokens"].tolist() == [0, 8, 12, 12, 8, 8, 10]
    assert pr["checkpoint_lost_hit_tokens"].tolist() == [0, 8, 0, 0, 8, 0, 2]
    assert r.checkpoint_lost_hit_tokens == 18
    full_only = replay(_workload(*SEVEN), capacity=None, page_size=1, record_requests=True)
    assert full_only.per_request["hit_tokens"].tolist() == pr["full_kv_hit_tokens"].tolist()
    # states: r0, r1, r3, r4, r5, r6 donated; r2's freed. One per request at most: 7 slots
    assert r.mamba_states == 100 and r.mamba_pool_slots == 7
    assert "state pool sized to 7 states" in r.notes[0]
    assert r.final_mamba_tree_states == r.peak_mamba_tree_states == 6
    assert r.mamba_evicted_states == 0 and r.mamba_waits == 0 and r.evicted_tokens == 0
    assert r.mamba_chunk == 64 and r.kv_conserved
    _assert_state_partition(box["cache"], box["alloc"], box["pool"])
    d = r.to_dict()
    assert d["checkpoint_lost_hit_tokens"] == 18 and "swa_window" not in d
    assert "mamba_states" not in full_only.to_dict()


# r0 [1,2,3] 12 + 2, r1 [7,8] 8 + 2, r2 = r0 again
THREE = ([[1, 2, 3], [7, 8], [1, 2, 3]], [12, 8, 12], [2, 2, 1])


def test_one_state_slot_two_running_requests():
    """N = 1, two requests in flight. r1 finds no free state (r0 holds it, the tree has
    none): it waits for r0 to finish (r0's state goes to the tree), then evicts it:
    r0's node is an unlocked leaf, deleted whole (12 Full tokens, 1 state). r2 = r0
    again: nothing cached; the state is r1's until r1 finishes (a second wait), then
    r1's leaf goes (8 tokens). No hit at all."""
    box = {}
    r = replay(_workload(*THREE), capacity=None, page_size=1, max_running=2, mamba_states=1,
               record_requests=True, cache_factory=_capturing_factory(box))
    pr = r.per_request
    assert pr["waited"].tolist() == [0, 1, 1] and r.mamba_waits == 2 and r.waits == 0
    assert pr["hit_tokens"].tolist() == [0, 0, 0]
    assert pr["evicted_tokens"].tolist() == [0, 12, 8] and r.evicted_tokens == 20
    assert pr["mamba_evicted_states"].tolist() == [0, 1, 1] and r.mamba_evicted_states == 2
    assert r.evict_calls == 4   # per admission: one empty-handed, one after the wait
    assert r.kv_conserved and r.final_mamba_tree_states == 1
    _assert_state_partition(box["cache"], box["alloc"], box["pool"])


def test_two_state_slots_keep_the_matched_state():
    """N = 2: r2 waits for r0 to finish (max running 2), then matches r0's state (hit
    12, that node locked). No slot is free (tree: r0's; r1 holds one) and the locked
    state cannot go: r2 waits for r1, whose leaf is then evicted (8 tokens)."""
    r = replay(_workload(*THREE), capacity=None, page_size=1, max_running=2, mamba_states=2,
               record_requests=True)
    pr = r.per_request
    assert pr["hit_tokens"].tolist() == [0, 0, 12] and r.checkpoint_lost_hit_tokens == 0
    assert pr["waited"].tolist() == [0, 0, 1] and r.mamba_waits == 1
    assert r.evicted_tokens == 8 and r.mamba_evicted_states == 1 and r.kv_conserved


def test_one_state_slot_one_request_at_a_time_gives_up_its_match():
    """N = 1, one request at a time: r2 matches r0's state, but a copy would need a
    second slot and nothing runs that could free one: it unlocks, evicts that state
    (r0's leaf, 12 tokens) and matches again: hit 0 (and no Full hit left either)."""
    r = replay(_workload(*THREE), capacity=None, page_size=1, mamba_states=1,
               record_requests=True)
    pr = r.per_request
    assert pr["hit_tokens"].tolist() == [0, 0, 0] and r.checkpoint_lost_hit_tokens == 0
    assert pr["evicted_tokens"].tolist() == [0, 12, 8] and r.mamba_waits == 0
    assert r.kv_conserved and r.rejected_requests == 0


def test_rejected_request_returns_its_state_slot():
    """A pool of 16 Full slots: r0 (12 + 2) fits, r3 (16 + 3) never does: rejected, its
    state slot and lock released (conservation checks both pools)."""
    r = replay(_workload(*SEVEN), capacity=16, page_size=1, mamba_states=3,
               record_requests=True)
    assert r.per_request["rejected"].tolist() == [False, False, False, True, False, False,
                                                  False]
    assert r.kv_conserved and r.rejected_requests == 1


# ---------------------------------------------------------------- oracle
def expected_mamba_hits(requests, block):
    """Per request, unbounded cache and state pool, one at a time: the longest earlier
    prompt (hash ids, length) that is a prefix of this one (page 1)."""
    seen = set()
    lengths = set()
    out = []
    for n, hs in requests:
        best = 0
        for L in lengths:
            if best < L <= n and (tuple(hs[:-(-L // block)]), L) in seen:
                best = L
        out.append(best)
        seen.add((tuple(hs[:-(-n // block)]), n))
        lengths.add(n)
    return out


def _check_against_oracles(w):
    r = replay(w, capacity=None, page_size=1, mamba_states=len(w), record_requests=True)
    reqs = workload_requests(w)
    pr = r.per_request
    assert pr["hit_tokens"].tolist() == expected_mamba_hits(reqs, w.block_size)
    assert r.hit_tokens + r.checkpoint_lost_hit_tokens == expected_hits(reqs, 1, w.block_size)
    assert r.mamba_evicted_states == 0 and r.kv_conserved
    return r


def test_unbounded_hits_equal_the_prompt_prefix_oracle_synthetic():
    r = _check_against_oracles(synthetic_workload(300, block_size=16, seed=3))
    assert r.hit_tokens > 0 and r.checkpoint_lost_hit_tokens > 0


@needs_trace
def test_unbounded_hits_equal_the_prompt_prefix_oracle_on_the_trace():
    _check_against_oracles(load_mooncake(TRACE, limit=400))


@pytest.mark.parametrize("capacity,states,max_running", [(20_000, 4, 1), (20_000, 64, 4),
                                                         (50_000, 2, 8), (None, 3, 3)])
def test_state_slots_partition_after_replay(capacity, states, max_running):
    box = {}
    r = replay(synthetic_workload(200, block_size=16, seed=5), capacity=capacity, page_size=1,
               max_running=max_running, mamba_states=states, cache_factory=_capturing_factory(box))
    assert r.kv_conserved and r.peak_mamba_tree_states <= states
    _assert_state_partition(box["cache"], box["alloc"], box["pool"])


def test_more_state_slots_never_lose_hits_unbounded():
    w = synthetic_workload(200, block_size=16, seed=9)
    hits = [replay(w, page_size=1, mamba_states=n).hit_tokens for n in (1, 8, 64, 200)]
    assert hits == sorted(hits) and hits[0] == 0 and hits[-1] > 0


@pytest.mark.parametrize("kw,what", [
    (dict(mamba_states=0), "mamba_states must be >= 1"),
    (dict(mamba_states=-1), "mamba_states must be >= 1"),
    (dict(mamba_states=8, page_size=16), "needs page_size=1"),
    (dict(mamba_states=8, swa_window=64), r"no \(FULL, SWA, MAMBA\) mode yet"),
    (dict(mamba_states=8, driver="core"), "driver='request'"),
    (dict(mamba_states=8, mamba_chunk=0), "mamba_chunk must be an int >= 1"),
    (dict(mamba_chunk=32), "mamba_chunk needs mamba_states"),
])
def test_mamba_replay_rejects_bad_options(kw, what):
    with pytest.raises(ValueError, match=what):
        replay(_workload(*THREE), **{"page_size": 1, **kw})


def test_mamba_states_must_be_an_int():
    with pytest.raises(TypeError, match="mamba_states must be an int, got str"):
        replay(_workload(*THREE), page_size=1, mamba_states="8")


# ---------------------------------------------------------------- reports
def test_mamba_report_text():
    r = replay(_workload(*THREE), capacity=None, page_size=1, max_running=2, mamba_states=1)
    text = format_report(r)
    for s in ("page size 1 |", "Mamba state pool 1 states | chunk 64 (no extra buffer)",
              "lost to ckpt    0 (0.00 % of prompt tokens",
              "evicted         Full 20 tokens, Mamba 2 states (4 evict calls)",
              "state waits     2 completions waited for a free state slot",
              "peak tree size  12 Full tokens, 1 Mamba states", "KV conservation ok"):
        assert s in text, s


def test_mamba_sweep_table_csv_and_plot(tmp_path):
    """Two state pools x two capacities + one unbounded run per pool; CSV rows and
    columns (sweep, runs, per request); the plot."""
    w = synthetic_workload(120, block_size=16, seed=4)
    curve = sweep(w, [5_000, 20_000], mamba_states=[2, 64], page_size=1)
    assert [(p["mamba_states"], p["capacity"]) for p in curve["points"]] == [
        (2, 5_000), (2, 20_000), (64, 5_000), (64, 20_000)]
    assert [p["mamba_states"] for p in curve["mamba"]["unbounded"]] == [2, 64]
    assert curve["mamba"]["chunk"] == 64 and curve["unbounded"]["mamba_states"] == 2
    text = format_sweep(curve).splitlines()
    assert text[0] == "Mamba replay: page 1, chunk 64, states = the state pool"
    assert text[1].split()[:3] == ["policy", "states", "capacity"] and "lost to ckpt" in text[1]
    assert len(text) == 2 + 4 + 2
    write_sweep_csv(curve, tmp_path / "c.csv")
    rows = list(csv.DictReader(open(tmp_path / "c.csv")))
    assert len(rows) == 6 and rows[-1]["capacity"] == "inf" and rows[-1]["mamba_states"] == "64"
    assert int(rows[0]["checkpoint_lost_hit_tokens"]) == curve["points"][0][
        "checkpoint_lost_hit_tokens"]
    runs = [replay(w, capacity=5_000, page_size=1, mamba_states=n, record_requests=True)
            for n in (2, 64)]
    write_runs_csv(runs, tmp_path / "r.csv")
    rows = list(csv.DictReader(open(tmp_path / "r.csv")))
    assert [int(x["mamba_evicted_states"]) for x in rows] == [r.mamba_evicted_states for r in runs]
    write_per_request_csv(runs, tmp_path / "p.csv")
    rows = list(csv.DictReader(open(tmp_path / "p.csv")))
    assert len(rows) == 240 and rows[0]["mamba_states"] == "2"
    assert sum(int(x["checkpoint_lost_hit_tokens"]) for x in rows[:120]) == \
        runs[0].checkpoint_lost_hit_tokens
    pytest.importorskip("matplotlib")
    from flatradix.replay import plot_sweep

    plot_sweep(curve, tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 1000


def test_mamba_parallel_sweep_equals_sequential():
    w = synthetic_workload(100, block_size=16, seed=2)
    kw = dict(page_size=1, mamba_states=[4, 32], mamba_chunk=128)

    def strip(c):
        for p in c["points"] + c["mamba"]["unbounded"] + [c["unbounded"]]:
            p.pop("wall_s")
        return c
    assert strip(sweep(w, [3_000], jobs=2, **kw)) == strip(sweep(w, [3_000], **kw))
    with pytest.raises(ValueError, match=r"no \(FULL, SWA, MAMBA\) mode yet"):
        sweep(w, [3_000], swa_windows=[128], **kw)


# ---------------------------------------------------------------- CLI
def _cli(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(["replay", "--no-progress", *map(str, args)])
        except SystemExit as e:
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


def test_format_bytes_just_below_the_next_unit():
    """1 GiB / 24,576 B/token buys 43,690 tokens = 1,073,725,440 bytes: it printed
    "1.02e+03 MiB" in the sweep table."""
    from flatradix.replay import format_bytes

    assert format_bytes(43_690 * 24_576) == "1024 MiB"
    assert format_bytes(999 * 2**20) == "999 MiB" and format_bytes(40 * 2**30) == "40 GiB"


def test_cli_mamba_runs_and_model_config():
    """Two state pools, one run each; with the qwen3-next-like config, 40 GiB buys the
    full-attention pool (24,576 B/token: 1,747,626 tokens at page 1) and the state
    pool is reported beside it (64 x 39,518,208 bytes; the replay allocates 40 slots,
    one per request, which gives the same run)."""
    rc, out, err = _cli("--limit", "40", "--capacity", "8k", "--mamba-states", "4,64", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert [x["mamba_states"] for x in d] == [4, 64]
    assert d[0]["page_size"] == 1 and d[1]["mamba_pool_slots"] == 40 and d[0]["kv_conserved"]
    rc, out, err = _cli("--limit", "40", "--model-config",
                        EXAMPLES / "qwen3-next-80b-like.json", "--kv-memory", "40GiB",
                        "--mamba-states", "64", "--mamba-chunk", "256")
    assert rc == 0, err
    for s in ("capacity 1,747,626 tokens", "Mamba state 39,518,208 bytes/request in bfloat16 "
              "(own pool; replayed)", "Mamba state pool 64 states | chunk 256",
              "Mamba state pool 64 states = 2.36 GiB (2,529,165,312 bytes), besides the "
              "full-attention pool", "state pool sized to 40 states", "lost to ckpt"):
        assert s in out, s


@needs_trace
def test_cli_on_a_prefix_of_the_trace():
    rc, out, err = _cli("--trace", TRACE, "--limit", "300", "--capacity", "1M",
                        "--mamba-states", "32", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["requests"] == 300 and d["kv_conserved"] and d["page_size"] == 1
    assert d["mamba_pool_slots"] == 32 and d["peak_mamba_tree_states"] <= 32
    full = replay(load_mooncake(TRACE, limit=300), capacity=1_000_000, page_size=1)
    assert d["hit_tokens"] <= full.hit_tokens
    assert d["hit_tokens"] + d["checkpoint_lost_hit_tokens"] > 0
