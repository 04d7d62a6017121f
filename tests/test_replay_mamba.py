"""``flatradix replay --mamba-states N``: the replay of a hybrid SSM model served
without the Mamba extra buffer (page 1, one state slot per request, the finished
request's state donated to the tree).

Each request matches its prompt less the last token, ``prompt[:-1]``, as SGLang's
scheduler does (``Req._compute_max_prefix_len``: the key is capped at
``input_len - 1``); a state sits at the end of the prompt that donated it.

Exact values: hand-worked runs (hits, hits lost to checkpoint granularity, waits
for a state slot, evictions), and, unbounded, plain-Python oracles over the
prompts: request ``i`` hits the longest earlier prompt of length ``L <= n - 1``
that is a prefix of its own (a state exists only where a prompt ended), and its
Full KV hit is ``min(h, n - 1)`` for ``h`` its longest common prefix with an
earlier prompt (:func:`full_hits`, checked against ``expected_hits`` of
``tests/test_replay.py``). The trace tests read the packaged sample of the
Mooncake conversation trace (``mooncake:sample``, its first 500 requests).
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
from .test_replay import SAMPLE, expected_hits, workload_requests


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
    """Each request matches its first n - 1 tokens (SGLang's key limit).
    r0 [1,2,3] (12 tokens): empty cache; its state goes to depth 12.
    r1 [1,2,5]: key 11 shares the system prompt [1,2] (8 tokens) with r0, but no state
      was checkpointed at 8: Full hit 8, Mamba hit 0, lost 8. Its state: depth 12 of
      its branch.
    r2 = r0 repeated: key 11 stops one token short of r0's state at 12: Full hit 11,
      hit 0, lost 11 (a repeated prompt never reaches its twin's state); its own state
      is freed at completion (the node at 12 has r0's).
    r3 [1,2,3,4] (16) extends r0: key 15, Full hit 12 = r0's state: hit 12, lost 0;
      state at 16.
    r4 [1,2] (8): key 7, Full hit 7, no state: hit 0, lost 7; its state goes to the
      node ending at 8 (a split of the shared prefix).
    r5 [1,2,6]: key 11, Full hit 8 = r4's state: hit 8, lost 0.
    r6 [1,2,3] cut at 10: key 9, Full hit 9, deepest state on the path at 8 (r4's):
      hit 8, lost 1.
    Hits 12 + 8 + 8 = 28; Full hits of the keys 8 + 11 + 12 + 7 + 8 + 9 = 55 = 28 + 27
    lost. The Full-only replay matches whole prompts: 8 + 12 + 12 + 8 + 8 + 10 = 58,
    3 more: one token each for r2, r4 and r6, whose whole prompt was cached."""
    box = {}
    r = replay(_workload(*SEVEN), capacity=None, page_size=1, mamba_states=100,
               record_requests=True, cache_factory=_capturing_factory(box))
    pr = r.per_request
    assert pr["hit_tokens"].tolist() == [0, 0, 0, 12, 0, 8, 8] and r.hit_tokens == 28
    assert pr["full_kv_hit_tokens"].tolist() == [0, 8, 11, 12, 7, 8, 9]
    assert pr["checkpoint_lost_hit_tokens"].tolist() == [0, 8, 11, 0, 7, 0, 1]
    assert r.checkpoint_lost_hit_tokens == 27
    full_only = replay(_workload(*SEVEN), capacity=None, page_size=1, record_requests=True)
    assert full_only.per_request["hit_tokens"].tolist() == [0, 8, 12, 12, 8, 8, 10]
    assert full_only.hit_tokens == 58 == r.hit_tokens + r.checkpoint_lost_hit_tokens + 3
    # states: r0, r1, r3, r4, r5, r6 donated; r2's freed. One per request at most: 7 slots
    assert r.mamba_states == 100 and r.mamba_pool_slots == 7
    assert "state pool sized to 7 states" in r.notes[0]
    assert r.final_mamba_tree_states == r.peak_mamba_tree_states == 6
    assert r.mamba_evicted_states == 0 and r.mamba_waits == 0 and r.evicted_tokens == 0
    assert r.mamba_chunk == 64 and r.kv_conserved
    _assert_state_partition(box["cache"], box["alloc"], box["pool"])
    d = r.to_dict()
    assert d["checkpoint_lost_hit_tokens"] == 27 and "swa_window" not in d
    assert "mamba_states" not in full_only.to_dict()


def test_a_repeated_prompt_hits_a_shorter_earlier_prompt_state_only():
    """r0 [1,2] (8), r1 [1,2,3] (12), r2 = r1 again, r3 = r0 again. r1: key 11 reaches r0's
    state at 8: hit 8. r2: key 11 stops short of r1's state at 12; the deepest state on
    its path is r0's at 8: hit 8, lost 3. r3: key 7, no state within 7: hit 0, lost 7."""
    w = _workload([[1, 2], [1, 2, 3], [1, 2, 3], [1, 2]], [8, 12, 12, 8], [1, 1, 1, 1])
    r = replay(w, page_size=1, mamba_states=4, record_requests=True)
    pr = r.per_request
    assert pr["hit_tokens"].tolist() == [0, 8, 8, 0]
    assert pr["full_kv_hit_tokens"].tolist() == [0, 8, 11, 7]
    assert (pr["hit_tokens"] < pr["prompt_tokens"]).all()
    assert r.final_mamba_tree_states == 2 and r.kv_conserved


def test_one_token_prompts_match_nothing():
    """A prompt of 1 token matches the empty key (SGLang's limit max(n - 1, 0)): no hit,
    even repeated; a 2-token repeat reaches the 1-token prompt's state."""
    w = Workload("hand", 1, np.zeros(3), np.array([1, 1, 2]), np.array([1, 1, 1]),
                 np.array([0, 1, 2, 4]), np.array([5, 5, 5, 6]))
    r = replay(w, page_size=1, mamba_states=3, record_requests=True)
    assert r.per_request["hit_tokens"].tolist() == [0, 0, 1]
    assert r.per_request["full_kv_hit_tokens"].tolist() == [0, 0, 1] and r.kv_conserved


# r0 [1,2,3] 12 + 2, r1 [7,8] 8 + 2, r2 = r0 again
THREE = ([[1, 2, 3], [7, 8], [1, 2, 3]], [12, 8, 12], [2, 2, 1])
# the same, r2 extending r0 to [1,2,3,4] (16 + 1): its key 15 reaches r0's state at 12
THREE_EXT = ([[1, 2, 3], [7, 8], [1, 2, 3, 4]], [12, 8, 16], [2, 2, 1])


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
    """N = 2: r2 [1,2,3,4] waits for r0 to finish (max running 2), then matches r0's
    state (key 15, hit 12, that node locked). No slot is free (tree: r0's; r1 holds one)
    and the locked state cannot go: r2 waits for r1, whose leaf is then evicted (8
    tokens)."""
    r = replay(_workload(*THREE_EXT), capacity=None, page_size=1, max_running=2,
               mamba_states=2, record_requests=True)
    pr = r.per_request
    assert pr["hit_tokens"].tolist() == [0, 0, 12] and r.checkpoint_lost_hit_tokens == 0
    assert pr["waited"].tolist() == [0, 0, 1] and r.mamba_waits == 1
    assert r.evicted_tokens == 8 and r.mamba_evicted_states == 1 and r.kv_conserved


def test_one_state_slot_one_request_at_a_time_gives_up_its_match():
    """N = 1, one request at a time: r1 [1,2,3,4] matches r0's state (key 15, hit 12),
    but a copy would need a second slot and nothing runs that could free one: one
    empty-handed evict (the state is locked), then it unlocks, evicts that state (r0's
    leaf, 12 tokens) and matches again: hit 0, and no Full hit left either."""
    w = _workload([[1, 2, 3], [1, 2, 3, 4]], [12, 16], [2, 1])
    r = replay(w, capacity=None, page_size=1, mamba_states=1, record_requests=True)
    pr = r.per_request
    assert pr["hit_tokens"].tolist() == [0, 0] and r.checkpoint_lost_hit_tokens == 0
    assert pr["full_kv_hit_tokens"].tolist() == [0, 0]
    assert pr["evicted_tokens"].tolist() == [0, 12] and r.mamba_waits == 0
    assert pr["mamba_evicted_states"].tolist() == [0, 1] and r.evict_calls == 2
    assert r.kv_conserved and r.rejected_requests == 0 and r.final_mamba_tree_states == 1


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
    prompt (hash ids, length) that is a prefix of this one's first n - 1 tokens
    (page 1)."""
    seen = set()
    lengths = set()
    out = []
    for n, hs in requests:
        best = 0
        for L in lengths:
            if best < L <= n - 1 and (tuple(hs[:-(-L // block)]), L) in seen:
                best = L
        out.append(best)
        seen.add((tuple(hs[:-(-n // block)]), n))
        lengths.add(n)
    return out


def full_hits(requests, block):
    """Per request, unbounded, one at a time, page 1: the longest prefix (tokens) it
    shares with any earlier prompt. Block ``k`` of a prompt is the tokens
    ``hash * block + 0 ..``: two prompts share it token by token up to the shorter
    one's cover when the hash ids up to ``k`` agree, and not at all otherwise."""
    cover = {}   # hash ids of blocks 0..k -> most tokens of block k an earlier prompt held
    out = []
    for n, hs in requests:
        hit = 0
        for k in range(len(hs)):
            c = min(cover.get(tuple(hs[:k + 1]), 0), block, n - k * block)
            hit += c
            if c < block:
                break
        out.append(hit)
        for k in range(len(hs)):
            c = min(block, n - k * block)
            if c <= 0:
                break
            key = tuple(hs[:k + 1])
            cover[key] = max(cover.get(key, 0), c)
    return out


def _check_against_oracles(w):
    r = replay(w, capacity=None, page_size=1, mamba_states=len(w), record_requests=True)
    reqs = workload_requests(w)
    pr = r.per_request
    assert pr["hit_tokens"].tolist() == expected_mamba_hits(reqs, w.block_size)
    full = full_hits(reqs, w.block_size)
    assert sum(full) == expected_hits(reqs, 1, w.block_size)   # the two oracles agree
    # the Full KV hit of the key prompt[:-1]
    key_full = [min(h, max(n - 1, 0)) for h, (n, _) in zip(full, reqs)]
    assert pr["full_kv_hit_tokens"].tolist() == key_full
    assert r.hit_tokens + r.checkpoint_lost_hit_tokens == sum(key_full)
    # against the Full-only replay (whole prompts): one token less per request whose
    # whole prompt was cached
    whole = sum(h == n for h, (n, _) in zip(full, reqs) if n)
    full_only = replay(w, capacity=None, page_size=1)
    assert full_only.hit_tokens == sum(full) == r.hit_tokens + r.checkpoint_lost_hit_tokens \
        + whole
    assert (pr["hit_tokens"] < np.maximum(pr["prompt_tokens"], 1)).all()
    assert r.mamba_evicted_states == 0 and r.kv_conserved
    return r, whole


def test_unbounded_hits_equal_the_prompt_prefix_oracle_synthetic():
    r, _ = _check_against_oracles(synthetic_workload(300, block_size=16, seed=3))
    assert r.hit_tokens > 0 and r.checkpoint_lost_hit_tokens > 0


def test_unbounded_hits_equal_the_prompt_prefix_oracle_on_the_trace():
    r, whole = _check_against_oracles(load_mooncake(SAMPLE, limit=400))
    assert whole > 0 and r.checkpoint_lost_hit_tokens > 0


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
    (dict(mamba_states=8, driver="core"), "driver='request'"),
    (dict(mamba_states=8, mamba_chunk=0), r"mamba_chunk must be an int in \[1, "),
    (dict(mamba_states=8, mamba_chunk=1 << 62), r"in \[1, 4611686018427387903\], got "),
    (dict(mamba_chunk=32), "mamba_chunk needs mamba_states"),
])
def test_mamba_replay_rejects_bad_options(kw, what):
    with pytest.raises(ValueError, match=what):
        replay(_workload(*THREE), **{"page_size": 1, **kw})


def test_mamba_states_must_be_an_int():
    with pytest.raises(TypeError, match="mamba_states must be an int, got str"):
        replay(_workload(*THREE), page_size=1, mamba_states="8")


def test_largest_mamba_chunk_runs():
    """2**62 - 1, the largest chunk the cache takes, runs (and gives the same figures:
    without the extra buffer the chunk moves nothing the replay reads)."""
    from flatradix.replay.sim import MAX_MAMBA_CHUNK

    assert MAX_MAMBA_CHUNK == 2**62 - 1
    a = replay(_workload(*SEVEN), page_size=1, mamba_states=3, mamba_chunk=MAX_MAMBA_CHUNK)
    b = replay(_workload(*SEVEN), page_size=1, mamba_states=3)
    assert a.mamba_chunk == MAX_MAMBA_CHUNK and a.kv_conserved
    assert (a.hit_tokens, a.checkpoint_lost_hit_tokens) == (b.hit_tokens,
                                                          b.checkpoint_lost_hit_tokens)


# ---------------------------------------------------------------- reports
def test_mamba_report_text():
    r = replay(_workload(*THREE), capacity=None, page_size=1, max_running=2, mamba_states=1)
    text = format_report(r)
    for s in ("page size 1 |", "Mamba state pool 1 state | chunk 64 (no extra buffer)",
              "lost to ckpt    0 (0.00 % of prompt tokens",
              "evicted         Full 20 tokens, Mamba 2 states (4 evict calls)",
              "state waits     2 completions waited for a free state slot",
              "peak tree size  12 Full tokens, 1 Mamba state", "KV conservation ok"):
        assert s in text, s


def test_mamba_report_singulars():
    """N = 1 over [r0, r1 = r0 extended], two running: r1 matches an empty tree (r0
    runs), finds no slot free and no state in the tree (one empty-handed evict), waits
    for r0 (1 completion), then evicts r0's state, an unlocked leaf: 12 Full tokens go
    with it (2 evict calls). The tree peaks at r1's 16 tokens and 1 state. One request
    with a pool of 5: "sized to 1 state"."""
    w = _workload([[1, 2, 3], [1, 2, 3, 4]], [12, 16], [2, 1])
    r = replay(w, page_size=1, mamba_states=1, max_running=2)
    text = format_report(r)
    for s in ("Mamba state pool 1 state |", "state waits     1 completion waited",
              "evicted         Full 12 tokens, Mamba 1 state (2 evict calls)",
              "peak tree size  16 Full tokens, 1 Mamba state"):
        assert s in text, s
    one = replay(_workload([[1, 2]], [8], [1]), page_size=1, mamba_states=5)
    assert "state pool sized to 1 state: this workload can never use more" in one.notes


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
    with pytest.raises(ValueError, match="both list several values"):
        sweep(w, [3_000], swa_windows=[128, 512], **kw)


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
    pool is reported beside it (64 x 77,266,944 bytes, conv bfloat16 + SSM float32:
    see test_mamba_state_bytes_follow_sglang_dtypes; the replay allocates 40 slots, one
    per request, which gives the same run)."""
    rc, out, err = _cli("--limit", "40", "--capacity", "8k", "--mamba-states", "4,64", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert [x["mamba_states"] for x in d] == [4, 64]
    assert d[0]["page_size"] == 1 and d[1]["mamba_pool_slots"] == 40 and d[0]["kv_conserved"]
    rc, out, err = _cli("--limit", "40", "--model-config",
                        EXAMPLES / "qwen3-next-80b-like.json", "--kv-memory", "40GiB",
                        "--mamba-states", "64", "--mamba-chunk", "256")
    assert rc == 0, err
    for s in ("capacity 1,747,626 tokens", "Mamba state 77,266,944 bytes/request (conv "
              "bfloat16, SSM float32; own pool; replayed)",
              "Mamba state pool 64 states | chunk 256",
              "Mamba state pool 64 states = 4.61 GiB (4,945,084,416 bytes), besides the "
              "full-attention pool", "state pool sized to 40 states", "lost to ckpt"):
        assert s in out, s


def test_cli_on_a_prefix_of_the_trace():
    rc, out, err = _cli("--trace", SAMPLE, "--limit", "300", "--capacity", "1M",
                        "--mamba-states", "32", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["requests"] == 300 and d["kv_conserved"] and d["page_size"] == 1
    assert d["mamba_pool_slots"] == 32 and d["peak_mamba_tree_states"] <= 32
    full = replay(load_mooncake(SAMPLE, limit=300), capacity=1_000_000, page_size=1)
    assert d["hit_tokens"] <= full.hit_tokens
    assert d["hit_tokens"] + d["checkpoint_lost_hit_tokens"] > 0

# ---------------------------------------------------------------- state bytes
QN = EXAMPLES / "qwen3-next-80b-like.json"
# qwen3-next-like, 36 gated-delta-net layers, per layer: conv (2 x 16 key heads x 128 +
# 32 value heads x 128) x (kernel 4 - 1) = 24,576 elements; SSM 32 x 128 x 128 = 524,288
QN_CONV, QN_SSM = 36 * (2 * 16 * 128 + 32 * 128) * 3, 36 * 32 * 128 * 128
QN_SGLANG = QN_CONV * 2 + QN_SSM * 4          # conv bfloat16, SSM float32: SGLang's default
QN_BF16 = (QN_CONV + QN_SSM) * 2              # --mamba-ssm-dtype bfloat16 (or float16)


def test_mamba_state_bytes_follow_sglang_dtypes():
    """SGLang 0.5.23 (configs/mamba_utils.py, mamba2_state_dtype): conv state bfloat16
    (SGLANG_MAMBA_CONV_DTYPE), SSM state --mamba-ssm-dtype, else the config's
    mamba_ssm_dtype, else float32. The KV dtype (--kv-dtype) sizes attention KV only."""
    from flatradix.replay import kv_layout_from_dict, load_model_config

    assert (QN_CONV, QN_SSM) == (884_736, 18_874_368)
    assert QN_SGLANG == 77_266_944 and QN_BF16 == 39_518_208
    qn = load_model_config(QN)
    assert (qn.mamba_conv_dtype, qn.mamba_ssm_dtype) == ("bfloat16", "float32")
    assert qn.mamba_state_bytes() == QN_SGLANG
    assert qn.to_dict()["mamba_state_bytes"] == QN_SGLANG
    for kv in ("float32", "fp8_e4m3", "bfloat16"):
        assert load_model_config(QN, kv_dtype=kv).mamba_state_bytes() == QN_SGLANG, kv
    assert load_model_config(QN, kv_dtype="float32").full_kv_bytes_per_token == 2 * 24_576
    assert load_model_config(QN, mamba_ssm_dtype="bfloat16").mamba_state_bytes() == QN_BF16
    assert load_model_config(QN, mamba_ssm_dtype="float16").mamba_state_bytes() == QN_BF16
    with pytest.raises(ValueError, match="mamba_ssm_dtype must be one of float32, bfloat16, "
                                         "float16, got 'fp8'"):
        load_model_config(QN, mamba_ssm_dtype="fp8")
    cfg = json.loads(QN.read_text())
    # the config's own mamba_ssm_dtype; the option over it; a nested text_config's first
    assert kv_layout_from_dict(dict(cfg, mamba_ssm_dtype="bfloat16")).mamba_state_bytes() \
        == QN_BF16
    assert kv_layout_from_dict(dict(cfg, mamba_ssm_dtype="bfloat16"),
                               mamba_ssm_dtype="float32").mamba_state_bytes() == QN_SGLANG
    nested = {"model_type": "wrapper", "mamba_ssm_dtype": "float32",
              "text_config": dict(cfg, mamba_ssm_dtype="float16")}
    assert kv_layout_from_dict(nested).mamba_ssm_dtype == "float16"
    bad = kv_layout_from_dict(dict(cfg, mamba_ssm_dtype="int8"))
    assert bad.mamba_ssm_dtype == "float32" and bad.mamba_state_bytes() == QN_SGLANG
    assert any("mamba_ssm_dtype 'int8' is not one SGLang takes" in n for n in bad.notes)
    # nemotron-h-like, a float32 model: 3 Mamba-2 layers of conv (4 x 8 + 2 x 2 x 16) x 3
    # = 288 and SSM 4 x 8 x 16 = 512 elements: 3 x (288 x 2 + 512 x 4) = 7,872 bytes
    nh = kv_layout_from_dict(dict(num_hidden_layers=7, num_attention_heads=8,
                                  num_key_value_heads=2, head_dim=128,
                                  hybrid_override_pattern="M-M*-M*", mamba_num_heads=4,
                                  mamba_head_dim=8, ssm_state_size=16, n_groups=2,
                                  conv_kernel=4, torch_dtype="float32"))
    assert nh.mamba_state_bytes() == 7_872 and nh.dtype_bytes == 4


def test_cli_mamba_ssm_dtype_and_kv_dtype():
    """--kv-dtype float32 doubles the attention KV (49,152 B/token) but not the state
    (2 states: 154,533,888 bytes); --mamba-ssm-dtype bfloat16 halves the SSM part."""
    rc, out, err = _cli("--limit", "5", "--describe", "--model-config", QN, "--kv-dtype",
                        "float32", "--capacity", "1M", "--mamba-states", "2")
    assert rc == 0, err
    for s in ("full-attention KV 49,152 bytes/token",
              "Mamba state 77,266,944 bytes/request (conv bfloat16, SSM float32; own pool; "
              "replayed)",
              "Mamba state pool 2 states = 147 MiB (154,533,888 bytes)"):
        assert s in out, s
    rc, out, err = _cli("--limit", "5", "--describe", "--model-config", QN,
                        "--mamba-ssm-dtype", "bfloat16", "--json")
    assert rc == 0, err
    model = json.loads(out)["kv"]["model"]
    assert model["mamba_state_bytes"] == QN_BF16 == 39_518_208
    assert (model["mamba_conv_dtype"], model["mamba_ssm_dtype"]) == ("bfloat16", "bfloat16")
