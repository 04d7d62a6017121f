"""``flatradix replay --mamba-states N --mamba-extra-buffer``: the replay of a hybrid
SSM model served with SGLang's Mamba extra buffer (non-lazy: each running request
holds its own state slot and a 2-entry ping-pong track buffer; states tracked on
the grid ``G = lcm(mamba_chunk, page_size)``; a checkpoint after each prefill that
does not finish the request; ``release_kv_cache`` at the end).

Exact values: hand-worked runs (hits, the Full KV hit of the same match, states
and Full tokens the tree keeps, state waits and evictions), and, unbounded, one
request at a time, a plain-Python oracle over the hash ids (:func:`expected_extra`:
the prefill of a request with hit ``h`` over ``e = n - h`` tokens caches the key
up to ``h + (e // G) * G``, or up to the branching point, with a state there).
The trace tests read the packaged sample of the Mooncake conversation trace
(``mooncake:sample``, its first 500 requests).
"""

import csv
import json
import math

import numpy as np
import pytest

from flatradix.replay import (ArrivalModel, Workload, format_report, format_sweep,
                              load_mooncake, replay, sweep, synthetic_workload, write_runs_csv,
                              write_sweep_csv)

from .test_replay import SAMPLE, workload_requests
from .test_replay_mamba import _assert_state_partition, _capturing_factory, _cli


def _workload(blocks, lengths, outputs, block_size=50):
    ptr = np.cumsum([0] + [len(b) for b in blocks])
    return Workload("hand", block_size, np.zeros(len(blocks)), np.array(lengths),
                    np.array(outputs), ptr, np.array(sum(blocks, [])))


def _extra(w, **kw):
    return replay(w, **{"page_size": 16, "mamba_states": 16, "mamba_extra_buffer": True,
                        "record_requests": True, **kw})


# ---------------------------------------------------------------- by hand
# blocks of 50 tokens; page 16, chunk 64: the grid is 64
SHARED = ([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 6], [1, 2, 3, 5, 7]], [170, 200, 200, 250],
          [2, 2, 2, 2])


def test_two_requests_sharing_150_tokens_by_hand():
    """r0 [1,2,3,4] (170 tokens; it shares 150 with r1 and r2): its prefill over 170
    tokens tracks the state at 170 // 64 * 64 = 128; the checkpoint after it caches
    [0, 128) with that state (the tree: 128 tokens, 1 state).
    r1 [1,2,3,5] (200): key 199, Full hit 128 (all r0 cached), state at 128: hit 128
    (the no-buffer mode: r0's state sits at 170, r1's match stops at 150: 0). Its
    prefill over 72 tracks 128 + 64 = 192: [128, 192) cached on its branch, state at
    192 (tree 192 tokens, 2 states).
    r2 [1,2,3,6] (200): Full hit 150 -> 144 (page 16; r1's key holds the shared 150),
    deepest state 128: hit 128, lost 16. Tracks 192: r1's node splits at 144, a leaf
    [144, 192) with a state (tree 240 tokens, 3 states).
    r3 [1,2,3,5,7] (250) extends r1 whole: Full hit 192 (r1 cached up to its state),
    state at 192: hit 192. Its prefill over 58 < 64 tracks nothing: its checkpoint and
    its release cache nothing.
    Hits 128 + 128 + 192 = 448 of Full hits 464; the Full-only replay at page 16 hits
    144 + 144 + 192 = 480 (its tree keeps r0's 160 and r1's 192); the no-buffer mode
    (page 1) 200, r3's hit of r1's state at r1's end."""
    box = {}
    r = _extra(_workload(*SHARED), cache_factory=_capturing_factory(box))
    pr = r.per_request
    assert pr["hit_tokens"].tolist() == [0, 128, 128, 192] and r.hit_tokens == 448
    assert pr["full_kv_hit_tokens"].tolist() == [0, 128, 144, 192]
    assert pr["checkpoint_lost_hit_tokens"].tolist() == [0, 0, 16, 0]
    assert r.checkpoint_lost_hit_tokens == 16
    assert r.final_mamba_tree_states == r.peak_mamba_tree_states == 3
    assert r.final_tree_tokens == 240 and r.evicted_tokens == 0
    assert r.mamba_evicted_states == r.mamba_waits == 0
    assert r.mamba_pool_slots == 16 and r.mamba_extra_buffer is True and r.kv_conserved
    # one checkpoint per request (each decodes past its prefill), one release each
    assert r.latency_us["checkpoint"]["count"] == 4
    assert r.latency_us["cache_finished_req"]["count"] == 4
    cache = box["cache"]
    ma = box["pool"].mamba_allocator
    # every request gave its 3 slots back: only the tree's 3 states are held
    assert ma.available_size() == 16 - 3
    _assert_state_partition(cache, box["alloc"], box["pool"])
    full_only = replay(_workload(*SHARED), page_size=16, record_requests=True)
    assert full_only.per_request["hit_tokens"].tolist() == [0, 144, 144, 192]
    no_buffer = replay(_workload(*SHARED), page_size=1, mamba_states=4, record_requests=True)
    assert no_buffer.per_request["hit_tokens"].tolist() == [0, 0, 0, 200]


BRANCH = ([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 6], [1, 2, 3, 4, 7]], [200, 200, 200, 250],
          [2, 2, 2, 2])


def test_a_state_at_the_branching_point():
    """r0 [1,2,3,4] (200): tracks 192; the tree [0, 192), a state at 192.
    r1 [1,2,3,5]: Full hit 150 -> 144, no state within it: hit 0, lost 144. The match's
    mamba_branching_seqlen is 144 // 64 * 64 = 128, past the hit on the grid: its
    prefill tracks 128 instead of 192 (SGLang), so its checkpoint splits r0's node at
    128 and puts a state there.
    r2 [1,2,3,6]: Full hit 144, state at 128: hit 128, lost 16; tracks 128 + 64 = 192
    on its own branch (split at 144).
    r3 [1,2,3,4,7] extends r0: Full hit 192 = r0's state: hit 192."""
    r = _extra(_workload(*BRANCH))
    pr = r.per_request
    assert pr["hit_tokens"].tolist() == [0, 0, 128, 192]
    assert pr["full_kv_hit_tokens"].tolist() == [0, 144, 144, 192]
    assert pr["checkpoint_lost_hit_tokens"].tolist() == [0, 144, 16, 0]
    assert r.final_mamba_tree_states == 3 and r.final_tree_tokens == 192 + 48
    assert r.kv_conserved


def test_decode_states_lie_past_the_prompt_unless_outputs_are_cached():
    """r0: 100 prompt tokens, 100 outputs; r1 = r0's prompt again, 1 output.
    r0's prefill tracks 64 and its checkpoint caches [0, 64) with that state. Its
    decode steps (sequence lengths 101 .. 199) track 128, then 192.
    Without --cache-outputs its release caches the prompt only (100 tokens): both
    tracked states lie past it, so nothing more is cached (the tree: 64 tokens, 1
    state). With it, 200 tokens: [0, 192) with the state at 192 (the tree: 192
    tokens, 2 states). r1 (key 99) hits the state at 64 either way; its Full hit is
    64, or 96 where the outputs' path holds its whole key. r1's prefill over 36 < 64
    tracks nothing, and with 1 output it finishes at its prefill: no checkpoint."""
    w = _workload([[1, 2], [1, 2]], [100, 100], [100, 1])
    for cache_outputs, full, tokens, states in ((False, 64, 64, 1), (True, 96, 192, 2)):
        r = _extra(w, mamba_states=8, cache_outputs=cache_outputs)
        pr = r.per_request
        assert pr["hit_tokens"].tolist() == [0, 64], cache_outputs
        assert pr["full_kv_hit_tokens"].tolist() == [0, full], cache_outputs
        assert (r.final_tree_tokens, r.final_mamba_tree_states) == (tokens, states)
        assert r.latency_us["checkpoint"]["count"] == 1 and r.kv_conserved


@pytest.mark.parametrize("outputs,tokens", [(92, 128), (93, 192)])
def test_the_last_decode_step_tracks_at_n_plus_o_minus_1(outputs, tokens):
    """With --cache-outputs: 100 prompt tokens and o outputs decode at sequence lengths
    101 .. 99 + o (the last sampled token has no KV). o = 92 ends at 191: a state at
    128 only, cached with [0, 128) at release (192 committed tokens); o = 93 reaches
    192: the release caches [0, 192)."""
    r = _extra(_workload([[1, 2]], [100], [outputs]), mamba_states=8, cache_outputs=True)
    assert (r.final_tree_tokens, r.final_mamba_tree_states) == (tokens, 2) and r.kv_conserved


def test_a_request_finishing_at_its_prefill_donates_at_release():
    """One output token: the prefill samples it and the request finishes, so there is
    no checkpoint; release_kv_cache caches [0, 64) with the prefill's state (r1 hits
    it). The request needed 3 state slots, not 4."""
    w = _workload([[1, 2], [1, 2, 3]], [100, 150], [1, 1])
    r = _extra(w, mamba_states=4)
    assert r.per_request["hit_tokens"].tolist() == [0, 64]
    assert r.latency_us["checkpoint"]["count"] == 0
    # r1 tracks 64 + (86 // 64) * 64 = 128: the tree [0, 128) with 2 states; the pool
    # of 4 held both and r1's 3 slots without evicting
    assert (r.final_tree_tokens, r.final_mamba_tree_states) == (128, 2)
    assert r.mamba_evicted_states == 0 and r.kv_conserved


def test_four_state_slots_two_running_requests():
    """N = 4, two in flight, r0 [1,2] and r1 [3,4] (100 tokens each, 2 outputs). r0
    takes 3 slots and its checkpoint a 4th (the state at 64 goes to the tree, locked
    by r0, which runs on). r1 needs 4 free: none, nothing evictable (one evict call,
    empty-handed), so it waits for r0; r0's release frees its 3 slots and unlocks its
    node, whose state r1 then evicts: an unlocked leaf, 64 Full tokens go with it."""
    w = _workload([[1, 2], [3, 4]], [100, 100], [2, 2])
    r = _extra(w, mamba_states=4, max_running=2)
    pr = r.per_request
    assert pr["waited"].tolist() == [0, 1] and r.mamba_waits == 1 and r.waits == 0
    assert pr["evicted_tokens"].tolist() == [0, 64]
    assert pr["mamba_evicted_states"].tolist() == [0, 1] and r.evict_calls == 2
    assert pr["hit_tokens"].tolist() == [0, 0]
    assert (r.final_tree_tokens, r.final_mamba_tree_states, r.peak_mamba_tree_states) == \
        (64, 1, 1)
    assert r.kv_conserved


def test_four_state_slots_one_request_at_a_time_gives_up_its_match():
    """N = 4: r0 [1,2,3] (150) leaves a state at 128. r1 [1,2,3,4] (200) matches it
    (hit 128, locked), and needs 4 free slots (its prefill over 72 tracks, it runs on):
    3 are free, the only state is the one it locked, nothing runs. It gives the match
    up, evicts that state (r0's leaf, 128 Full tokens) and matches again: hit 0. With
    N = 5 it keeps its hit."""
    w = _workload([[1, 2, 3], [1, 2, 3, 4]], [150, 200], [2, 2])
    r = _extra(w, mamba_states=4)
    pr = r.per_request
    assert pr["hit_tokens"].tolist() == [0, 0] and pr["full_kv_hit_tokens"].tolist() == [0, 0]
    assert pr["evicted_tokens"].tolist() == [0, 128]
    assert pr["mamba_evicted_states"].tolist() == [0, 1] and r.evict_calls == 2
    assert r.mamba_waits == 0 and r.kv_conserved
    assert (r.final_tree_tokens, r.final_mamba_tree_states) == (192, 1)
    r = _extra(w, mamba_states=5)
    assert r.per_request["hit_tokens"].tolist() == [0, 128] and r.mamba_evicted_states == 0
    assert r.final_mamba_tree_states == 2


def test_rejected_request_holds_no_state_slot():
    """A 100-token pool, N = 5. r0 [1,2] (80 + 2) leaves [0, 64) and a state. r1 (200
    + 2 tokens) finds its 4 state slots free, then evicts all it can for KV (r0's leaf:
    64 tokens and its state) and is rejected with nothing running: its lock released,
    no state slot taken. r2 = r0 again finds nothing."""
    box = {}
    w = _workload([[1, 2], [5, 6, 7, 8], [1, 2]], [80, 200, 80], [2, 2, 2])
    r = _extra(w, capacity=100, mamba_states=5, cache_factory=_capturing_factory(box))
    pr = r.per_request
    assert pr["rejected"].tolist() == [False, True, False] and r.rejected_requests == 1
    assert pr["evicted_tokens"].tolist() == [0, 64, 0]
    assert pr["mamba_evicted_states"].tolist() == [0, 1, 0]
    assert pr["hit_tokens"].tolist() == [0, 0, 0] and r.final_mamba_tree_states == 1
    assert r.kv_conserved
    _assert_state_partition(box["cache"], box["alloc"], box["pool"])


# ---------------------------------------------------------------- oracle
def expected_extra(requests, block, page, chunk):
    """Per request ``(hit, Full KV hit)``: unbounded, one request at a time, outputs
    not cached. Every request caches at most one key, its prompt up to the state its
    prefill tracked, with that state (its checkpoint or, finishing at the prefill,
    its release; a decode state lies past the prompt). The match of ``prompt[:-1]``:
    the Full hit is the longest common prefix with a cached key, page-aligned down;
    the hit the deepest state on the key's path within it."""
    G = chunk * page // math.gcd(chunk, page)
    cached = []        # (hash ids of the blocks covering a cached key, its length)
    states = set()     # (hash ids of the blocks covering L tokens, L): a state at L
    out = []
    for n, hs in requests:
        k = max(n - 1, 0)
        lcp = 0
        for ids, L in cached:
            d = 0
            while d < min(len(ids), len(hs)) and ids[d] == hs[d]:
                d += 1
            lcp = max(lcp, min(d * block, L, k))
        full = lcp // page * page
        hit = next((L for L in range(full // G * G, 0, -G)
                    if (tuple(hs[:-(-L // block)]), L) in states), 0)
        e = n - hit
        if e >= G:
            at = hit + e // G * G
            branch = full // G * G
            if hit < branch < n:
                at = branch
            cached.append((tuple(hs[:-(-at // block)]), at))
            states.add((tuple(hs[:-(-at // block)]), at))
        out.append((hit, full))
    return out


def _check_oracle(w, page, chunk):
    r = replay(w, page_size=page, mamba_states=4 * len(w), mamba_chunk=chunk,
               mamba_extra_buffer=True, record_requests=True)
    exp = expected_extra(workload_requests(w), w.block_size, page, chunk)
    pr = r.per_request
    assert pr["hit_tokens"].tolist() == [h for h, _ in exp], (page, chunk)
    assert pr["full_kv_hit_tokens"].tolist() == [f for _, f in exp], (page, chunk)
    assert r.checkpoint_lost_hit_tokens == sum(f - h for h, f in exp)
    grid = chunk * page // math.gcd(chunk, page)
    assert (pr["hit_tokens"] % grid == 0).all() and r.kv_conserved
    return r


@pytest.mark.parametrize("page,chunk", [(16, 64), (1, 64), (64, 16), (16, 24)])
def test_unbounded_hits_equal_the_oracle_synthetic(page, chunk):
    r = _check_oracle(synthetic_workload(300, block_size=16, seed=3), page, chunk)
    assert r.hit_tokens > 0 and r.checkpoint_lost_hit_tokens > 0


def test_unbounded_hits_equal_the_oracle_on_the_trace():
    r = _check_oracle(load_mooncake(SAMPLE, limit=400), 16, 64)
    assert r.hit_tokens > 0 and r.checkpoint_lost_hit_tokens > 0


@pytest.mark.parametrize("capacity,states,max_running,page,outputs,arrival", [
    (20_000, 4, 1, 16, False, False), (20_000, 9, 3, 16, True, False),
    (6_000, 64, 4, 1, False, False), (None, 5, 3, 64, True, False),
    (20_000, 16, None, 16, False, True)])
def test_state_slots_partition_after_replay(capacity, states, max_running, page, outputs,
                                            arrival):
    """Every KV slot and every state slot free or in the tree once, nothing locked,
    the hits on the grid (chunk 32)."""
    box = {}
    r = replay(synthetic_workload(150, block_size=16, seed=5), capacity=capacity,
               page_size=page, max_running=max_running, mamba_states=states, mamba_chunk=32,
               mamba_extra_buffer=True, cache_outputs=outputs, record_requests=True,
               arrival=ArrivalModel() if arrival else None, cache_factory=_capturing_factory(box))
    assert r.kv_conserved and r.peak_mamba_tree_states <= r.mamba_pool_slots
    assert (r.per_request["hit_tokens"] % math.lcm(32, page) == 0).all()
    _assert_state_partition(box["cache"], box["alloc"], box["pool"])


def test_pool_sized_to_four_states_a_request():
    r = _extra(_workload(*SHARED), mamba_states=1000)
    assert r.mamba_pool_slots == 16 and r.mamba_states == 1000
    assert "state pool sized to 16 states: this workload can never use more" in r.notes[0]
    same = _extra(_workload(*SHARED), mamba_states=16)
    assert same.per_request["hit_tokens"].tolist() == r.per_request["hit_tokens"].tolist()


@pytest.mark.parametrize("kw,exc,what", [
    (dict(mamba_extra_buffer=True), ValueError, "mamba_extra_buffer needs mamba_states"),
    (dict(mamba_extra_buffer=True, mamba_states=8, swa_window=64), ValueError,
     "mamba_extra_buffer with swa_window"),
    (dict(mamba_extra_buffer=True, mamba_states=3), ValueError,
     "mamba_extra_buffer needs mamba_states >= 4"),
    (dict(mamba_extra_buffer=1, mamba_states=8), TypeError,
     "mamba_extra_buffer must be a bool, got int"),
    (dict(mamba_states=8, page_size=16), ValueError, "needs page_size=1"),
    (dict(mamba_extra_buffer=True, mamba_states=8, driver="core"), ValueError,
     "driver='request'"),
])
def test_extra_buffer_rejects_bad_options(kw, exc, what):
    with pytest.raises(exc, match=what):
        replay(_workload(*SHARED), **{"page_size": 1, **kw})


# ---------------------------------------------------------------- reports
def test_report_text_and_json():
    r = _extra(_workload(*SHARED), page_size=128, mamba_chunk=64)
    text = format_report(r)
    for s in ("page size 128 |", "Mamba state pool 16 states | chunk 64 | extra buffer (grid "
              "128, 3 slots a running request)", "lost to ckpt", "peak tree size",
              "KV conservation ok"):
        assert s in text, s
    ops = [line.split()[0] for line in text.splitlines()[-5:]]
    assert ops == ["match_prefix", "inc_lock_ref", "evict", "checkpoint", "cache_finished_req"]
    d = r.to_dict()
    assert d["mamba_extra_buffer"] is True and d["page_size"] == 128
    no_buffer = replay(_workload(*SHARED), page_size=1, mamba_states=4)
    assert no_buffer.to_dict()["mamba_extra_buffer"] is False
    assert "(no extra buffer)" in format_report(no_buffer)
    assert "checkpoint" not in no_buffer.latency_us


def test_sweep_table_and_csv(tmp_path):
    w = synthetic_workload(80, block_size=16, seed=4)
    curve = sweep(w, [5_000], mamba_states=[4, 64], page_size=16, mamba_extra_buffer=True)
    assert curve["mamba"]["extra_buffer"] is True and curve["page_size"] == 16
    assert [p["mamba_states"] for p in curve["points"]] == [4, 64]
    text = format_sweep(curve).splitlines()
    assert text[0] == ("Mamba replay with the extra buffer: page 16, chunk 64, states = the "
                       "state pool")
    assert len(text) == 2 + 2 + 2
    write_sweep_csv(curve, tmp_path / "c.csv")
    rows = list(csv.DictReader(open(tmp_path / "c.csv")))
    assert [x["mamba_extra_buffer"] for x in rows] == ["True"] * 4
    runs = [_extra(w, mamba_states=8, capacity=5_000)]
    write_runs_csv(runs, tmp_path / "r.csv")
    row = next(csv.DictReader(open(tmp_path / "r.csv")))
    assert row["mamba_extra_buffer"] == "True" and int(row["hit_tokens"]) == runs[0].hit_tokens


def test_cli_text_and_json():
    rc, out, err = _cli("--limit", "40", "--capacity", "8k", "--mamba-states", "4,64",
                        "--mamba-extra-buffer", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert [x["mamba_states"] for x in d] == [4, 64] and [x["mamba_pool_slots"] for x in d] \
        == [4, 64]
    assert all(x["mamba_extra_buffer"] and x["page_size"] == 16 and x["kv_conserved"]
               for x in d)
    assert d[1]["latency_us"]["checkpoint"]["count"] > 0
    rc, out, err = _cli("--limit", "40", "--capacity", "8k", "--mamba-states", "64",
                        "--mamba-extra-buffer", "--page-size", "32", "--mamba-chunk", "48")
    assert rc == 0, err
    for s in ("page size 32 |", "chunk 48 | extra buffer (grid 96, 3 slots a running request)",
              "checkpoint", "KV conservation ok"):
        assert s in out, s


@pytest.mark.parametrize("args,what", [
    (["--mamba-extra-buffer"], "--mamba-extra-buffer needs --mamba-states"),
    (["--mamba-states", "8", "--mamba-extra-buffer", "--swa-window", "512"],
     "--mamba-extra-buffer with --swa-window"),
    (["--mamba-states", "8,3", "--mamba-extra-buffer"],
     "--mamba-extra-buffer needs --mamba-states of at least 4"),
    (["--mamba-states", "8", "--page-size", "16"], "--mamba-extra-buffer takes any"),
])
def test_cli_refusals_are_one_line(args, what):
    rc, out, err = _cli(*args)
    assert rc == 2 and out == "" and "Traceback" not in err
    assert err.strip().splitlines() == [err.strip()] and what in err, err


def test_cli_on_a_prefix_of_the_trace():
    rc, out, err = _cli("--trace", SAMPLE, "--limit", "300", "--capacity", "1M",
                        "--mamba-states", "32", "--mamba-extra-buffer", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["requests"] == 300 and d["kv_conserved"] and d["page_size"] == 16
    assert d["peak_mamba_tree_states"] <= 32 and d["hit_tokens"] % 64 == 0
    assert d["hit_tokens"] > 0
