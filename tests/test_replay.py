"""``flatradix replay``: trace reader, synthetic workload, scheduler emulation, CLI.

Exact values: with unbounded capacity, one request at a time and a page size
dividing the block size, the replay's ``hit_tokens`` must equal what the hash
ids alone imply (``expected_hits`` below, plain Python, no flatradix); with a
finite capacity, the pure-Python reference cache of ``tests/reference.py``
replayed the same way must give the same hits, evictions, waits and
rejections, request by request. The trace tests read
``../shared/traces/mooncake_conversation_trace.jsonl`` and skip where it is absent.
"""

import json
import os
import re
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from flatradix.replay import (
    TraceFormatError, format_report, load_mooncake, parse_capacity, replay, sweep,
    synthetic_workload,
)
from flatradix.cli import main

from .reference import ReferenceRadixCache

ROOT = pathlib.Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"
needs_trace = pytest.mark.skipif(not TRACE.exists(), reason=f"trace not found: {TRACE}")
JSON_KEYS = {"requests", "rejected_requests", "prompt_tokens", "hit_tokens", "token_hit_ratio",
             "evicted_tokens", "wall_s", "requests_per_s"}


# ---------------------------------------------------------------- the oracle
def expected_hits(requests, page, block):
    """Total hit tokens of an unbounded prefix cache replayed one request at a time.

    ``requests``: ``(input_length, hash_ids)`` pairs in arrival order. Request
    ``i`` hits the longest prefix it shares with any earlier prompt, each prompt
    cached page-aligned down and the hit itself page-aligned down (``page``
    must divide ``block``). A trie over hash-id sequences keeps, per block
    prefix, the most tokens of that block any cached prompt covers.
    """
    assert block % page == 0
    trie = {}  # (parent node, hash id) -> [node, tokens of the block cached]
    total = 0
    for n, hs in requests:
        aligned = n - n % page
        node, hit = 0, 0
        for k, h in enumerate(hs):
            need = min(block, aligned - k * block)
            if need <= 0 or (node, h) not in trie:
                break
            child, cover = trie[(node, h)]
            hit += min(cover, need)
            if min(cover, need) < block:
                break
            node = child
        total += hit - hit % page
        node = 0
        for k, h in enumerate(hs):
            cover = min(block, aligned - k * block)
            if cover <= 0:
                break
            entry = trie.get((node, h))
            if entry is None:
                entry = trie[(node, h)] = [len(trie) + 1, cover]
            entry[1] = max(entry[1], cover)
            node = entry[0]
    return total


def workload_requests(w):
    return [(int(w.input_lengths[i]), w.blocks(i).tolist()) for i in range(len(w))]


def trace_requests(path):
    with open(path) as f:
        return [(r["input_length"], r["hash_ids"]) for r in map(json.loads, f)]


def reference_factory(page_size, eviction_policy, token_to_kv_pool_allocator, req_to_token_pool):
    return ReferenceRadixCache(page_size=page_size, eviction_policy=eviction_policy,
                               token_to_kv_pool_allocator=token_to_kv_pool_allocator)


def assert_same_run(a, b):
    np.testing.assert_array_equal(a.hits, b.hits)
    for k in ("hit_tokens", "evicted_tokens", "rejected_requests", "waits", "peak_tree_tokens",
              "final_tree_tokens"):
        assert getattr(a, k) == getattr(b, k), k


def write_trace(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


# ---------------------------------------------------------------- workloads
def test_synthetic_workload_is_deterministic():
    a, b = synthetic_workload(400, seed=3), synthetic_workload(400, seed=3)
    for f in ("timestamps", "input_lengths", "output_lengths", "hash_ptr", "hash_ids"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    c = synthetic_workload(400, seed=4)
    assert not np.array_equal(a.input_lengths, c.input_lengths)
    assert len(a) == 400 and np.all(np.diff(a.timestamps) >= 0)
    nblocks = np.diff(a.hash_ptr)
    np.testing.assert_array_equal(nblocks, -(-a.input_lengths // a.block_size))


def test_synthetic_workload_shares_prefixes():
    w = synthetic_workload(600, seed=1)
    firsts = w.hash_ids[w.hash_ptr[:-1]]
    assert len(set(firsts.tolist())) <= 8        # every prompt starts in a system prompt
    r = replay(w, page_size=16)
    assert 0.3 < r.token_hit_ratio < 1.0


def test_token_expansion_is_injective_and_truncated():
    w = synthetic_workload(50, block_size=16, seed=2)
    for i in range(len(w)):
        toks = w.tokens(i)
        n = int(w.input_lengths[i])
        expect = [h * 16 + j for h in w.blocks(i).tolist() for j in range(16)][:n]
        assert toks.dtype == np.int64 and toks.flags.c_contiguous
        assert toks.tolist() == expect
    assert w.token_base > max(int(w.tokens(i).max()) for i in range(len(w)))


def test_load_mooncake_orders_by_timestamp_and_takes_block_size(tmp_path):
    p = write_trace(tmp_path / "t.jsonl", [
        {"timestamp": 5, "input_length": 40, "output_length": 3, "hash_ids": [7, 8, 9]},
        {"timestamp": 1, "input_length": 16, "output_length": 0, "hash_ids": [1]},
        "",
        {"timestamp": 5, "input_length": 17, "output_length": 2, "hash_ids": [1, 2]},
    ])
    w = load_mooncake(p, block_size=16)
    assert w.input_lengths.tolist() == [16, 40, 17]
    assert w.output_lengths.tolist() == [0, 3, 2]
    assert [w.blocks(i).tolist() for i in range(3)] == [[1], [7, 8, 9], [1, 2]]
    assert w.tokens(2).tolist() == list(range(16, 32)) + [32]
    assert len(load_mooncake(p, block_size=16, limit=2)) == 2
    with pytest.raises(TraceFormatError, match=r"t\.jsonl:1: .*needs 1 block"):
        load_mooncake(p)  # the default block size is Mooncake's 512


@pytest.mark.parametrize("bad, what", [
    ('{"timestamp": 0, "input_length": 5', "invalid JSON"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1}', "missing field"),
    ('{"timestamp": 0, "input_length": -5, "output_length": 1, "hash_ids": []}', "input_length"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1.5, "hash_ids": [1]}', "output_length"),
    ('{"timestamp": 0, "input_length": 40, "output_length": 1, "hash_ids": [1]}', "needs 3 block"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": ["a"]}', "hash_ids"),
    ('{"timestamp": "x", "input_length": 5, "output_length": 1, "hash_ids": [1]}', "timestamp"),
    ('[1, 2]', "JSON object"),
])
def test_malformed_line_names_its_line_number(tmp_path, bad, what):
    good = {"timestamp": 0, "input_length": 20, "output_length": 4, "hash_ids": [1, 2]}
    p = write_trace(tmp_path / "bad.jsonl", [good, good, bad, good])
    with pytest.raises(TraceFormatError, match=rf"bad\.jsonl:3: .*{what}"):
        load_mooncake(p, block_size=16)


def test_cli_reports_malformed_line(tmp_path, capsys):
    p = write_trace(tmp_path / "bad.jsonl", ['{"timestamp": 0}'])
    assert main(["replay", "--trace", str(p)]) == 2
    assert "bad.jsonl:1: missing field" in capsys.readouterr().err


# ---------------------------------------------------------------- exact values
@pytest.mark.parametrize("page", [1, 4, 16])
def test_unbounded_hits_equal_hash_id_oracle_synthetic(page):
    w = synthetic_workload(1500, block_size=16, seed=5)
    r = replay(w, capacity=None, page_size=page, max_running=1)
    assert r.hit_tokens == expected_hits(workload_requests(w), page, 16)
    assert r.evicted_tokens == 0 and r.rejected_requests == 0


def test_outputs_cached_never_match():
    w = synthetic_workload(500, seed=6)
    plain = replay(w, page_size=4)
    with_out = replay(w, page_size=4, cache_outputs=True)
    assert with_out.hit_tokens == plain.hit_tokens
    assert with_out.peak_tree_tokens > plain.peak_tree_tokens


@needs_trace
def test_unbounded_hits_equal_hash_id_oracle_on_the_trace():
    """The whole conversation trace, page 16: equal to the token (and to the
    54,097,552 the trace's README computes)."""
    expect = expected_hits(trace_requests(TRACE), 16, 512)
    assert expect == 54_097_552
    r = replay(load_mooncake(TRACE), capacity=None, page_size=16, max_running=1)
    assert r.requests == 12_031 and r.prompt_tokens == 144_793_823
    assert r.hit_tokens == expect
    assert r.kv_conserved and r.evicted_tokens == 0


# ---------------------------------------------------------------- vs the reference
@pytest.mark.parametrize("capacity, max_running, policy", [
    (3_000, 4, "lru"), (1_500, 1, "lfu"), (2_000, 8, "fifo"),
])
def test_finite_capacity_matches_reference_synthetic(capacity, max_running, policy):
    w = synthetic_workload(150, block_size=16, seed=7)
    kw = dict(capacity=capacity, page_size=4, max_running=max_running, policy=policy,
              record_hits=True)
    eng = replay(w, **kw)
    ref = replay(w, cache_factory=reference_factory, driver="core", **kw)
    assert eng.evicted_tokens > 0
    assert_same_run(eng, ref)
    assert_same_run(eng, replay(w, driver="core", **kw))


@needs_trace
@pytest.mark.parametrize("capacity, max_running", [(150_000, 8), (100_000, 2)])
def test_finite_capacity_matches_reference_on_the_trace(capacity, max_running):
    """First 500 requests: same hits (request by request), evictions, waits and
    rejections as the pure-Python reference cache driven the same way."""
    w = load_mooncake(TRACE, limit=500)
    kw = dict(capacity=capacity, page_size=16, max_running=max_running, record_hits=True)
    eng = replay(w, **kw)
    ref = replay(w, cache_factory=reference_factory, driver="core", **kw)
    assert eng.evicted_tokens > 1_000_000
    assert_same_run(eng, ref)


# ---------------------------------------------------------------- conservation, rejects
def _capturing_factory(box):
    from flatradix.replay import default_cache_factory

    def factory(*args):
        box["cache"] = default_cache_factory(*args)
        box["alloc"] = args[2]
        return box["cache"]
    return factory


@pytest.mark.parametrize("capacity, max_running", [(None, 3), (4_000, 6), (900, 2)])
def test_kv_conservation_after_replay(capacity, max_running):
    w = synthetic_workload(300, seed=8)
    box = {}
    r = replay(w, capacity=capacity, page_size=16, max_running=max_running,
               cache_factory=_capturing_factory(box))
    cache, alloc = box["cache"], box["alloc"]
    assert alloc.available_size() + cache.evictable_size() + cache.protected_size() == alloc.size
    assert cache.protected_size() == 0
    assert r.final_tree_tokens == cache.total_size()[0] == cache.evictable_size()
    cache.sanity_check()
    assert r.kv_conserved and r.served_requests + r.rejected_requests == 300


def test_requests_that_cannot_fit_are_rejected():
    w = synthetic_workload(300, seed=9)
    longest = int((w.input_lengths + w.output_lengths).max())
    cap = longest // 2
    r = replay(w, capacity=cap, page_size=16, max_running=4, record_hits=True)
    too_big = (w.input_lengths + w.output_lengths) > cap
    assert r.rejected_requests == int(too_big.sum()) > 0
    assert np.all(r.hits[too_big] == -1) and np.all(r.hits[~too_big] >= 0)
    assert r.kv_conserved


# ---------------------------------------------------------------- CLI, report, sweep
def test_cli_json_in_a_subprocess():
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-m", "flatradix", "replay", "--limit", "200",
                          "--capacity", "50k", "--max-running", "4", "--json"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert JSON_KEYS <= d.keys()
    assert d["requests"] == 200 and d["capacity"] == 50_000 and d["max_running"] == 4
    assert "req/s" not in out.stderr and "\r" not in out.stderr  # no bar off a terminal


def test_cli_text_report(capsys):
    assert main(["replay", "--limit", "100", "--page-size", "4", "--policy", "lfu"]) == 0
    text = capsys.readouterr().out
    for s in ("hit tokens", "token hit ratio", "evicted tokens", "peak tree size",
              "requests/s", "match_prefix", "cache_finished_req", "p99"):
        assert s in text


@needs_trace
def test_cli_on_the_trace(capsys):
    assert main(["replay", "--trace", str(TRACE), "--limit", "300", "--capacity", "1M",
                 "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["requests"] == 300 and JSON_KEYS <= d.keys()


def test_sweep_and_plot(tmp_path, capsys):
    out, png = tmp_path / "curve.json", tmp_path / "curve.png"
    args = ["replay", "--limit", "200", "--sweep", "2k,8k,inf", "--out", str(out)]
    pytest.importorskip("matplotlib")
    assert main(args + ["--plot", str(png)]) == 0
    curve = json.loads(out.read_text())
    assert [p["capacity"] for p in curve["points"]] == [2000, 8000, "inf"]
    ratios = [p["token_hit_ratio"] for p in curve["points"]]
    assert ratios[0] <= ratios[1] <= ratios[2] == curve["unbounded_hit_ratio"]
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
    assert "capacity" in capsys.readouterr().out


def test_sweep_json_to_stdout(capsys):
    assert main(["replay", "--limit", "100", "--sweep", "3000"]) == 0
    curve = json.loads(capsys.readouterr().out)
    assert curve["points"][0]["capacity"] == 3000 and "unbounded" in curve


def test_plot_needs_sweep():
    with pytest.raises(SystemExit):
        main(["replay", "--plot", "x.png"])


@pytest.mark.parametrize("text, value", [
    ("inf", None), ("2000000", 2_000_000), ("2M", 2_000_000), ("500k", 500_000),
    ("1.5G", 1_500_000_000), ("2e6", 2_000_000), ("2_000_000", 2_000_000),
])
def test_parse_capacity(text, value):
    assert parse_capacity(text) == value


@pytest.mark.parametrize("text", ["0", "-3", "1.5", "lots", "", "nan"])
def test_parse_capacity_rejects(text):
    with pytest.raises(ValueError):
        parse_capacity(text)


def test_format_report_and_json_keys():
    r = replay(synthetic_workload(100, seed=10), capacity=5000, max_running=2)
    assert JSON_KEYS <= r.to_dict().keys()
    json.dumps(r.to_dict())
    assert "5,000 tokens" in format_report(r)
    assert r.latency_us["match_prefix"]["count"] == 100
    assert r.evict_calls == r.latency_us["evict"]["count"]
    # the kernels are compiled / loaded once per process, outside the timed loop
    assert replay(synthetic_workload(10, seed=10)).warmup_s == 0.0


def test_sweep_function_points():
    w = synthetic_workload(120, seed=11)
    curve = sweep(w, [1000, None], page_size=16)
    assert curve["points"][1]["token_hit_ratio"] == curve["unbounded_hit_ratio"]
    assert curve["points"][0]["evicted_tokens"] > 0


def test_progress_bar_only_on_a_terminal(monkeypatch):
    pytest.importorskip("tqdm")
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for stream, shown in ((io.StringIO(), False), (Terminal(), True)):
        monkeypatch.setattr(sys, "stderr", stream)
        replay(synthetic_workload(200, seed=12), progress=True)
        assert ("req" in stream.getvalue()) == shown


def test_cli_usage_errors_are_clean(tmp_path, capsys):
    """Options no cache can be built with, a negative seed and a hash id beyond int64
    expansion are reported as errors (exit 2), never as tracebacks."""
    assert main(["replay", "--page-size", "2000000", "--limit", "10", "--no-progress"]) == 2
    assert "page_size" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["replay", "--seed", "-1"])
    assert e.value.code == 2
    p = tmp_path / "t.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, '
                 '"hash_ids": [99999999999999999999]}\n')
    assert main(["replay", "--trace", str(p), "--no-progress"]) == 2
    assert ":1: hash id 99999999999999999999 too large" in capsys.readouterr().err


# ---------------------------------------------------------------- trace formats (issue 15)
def test_generic_token_ids_trace_matches_token_by_token(tmp_path):
    from flatradix.replay import load_trace

    p = write_trace(tmp_path / "g.jsonl", [
        {"token_ids": [5, 6, 7, 8, 9], "output_length": 2},
        {"token_ids": [5, 6, 7, 1], "output_length": 0, "input_length": 4},
        {"token_ids": [5, 6, 7, 8, 9, 10], "output_length": 1},
    ])
    w = load_trace(p)
    assert w.source_format == "generic/token_ids" and w.block_size == 1
    assert not w.has_timestamps
    assert [w.tokens(i).tolist() for i in range(3)] == [[5, 6, 7, 8, 9], [5, 6, 7, 1],
                                                        [5, 6, 7, 8, 9, 10]]
    r = replay(w, page_size=1, record_hits=True)
    assert r.hits.tolist() == [0, 3, 5]        # by hand: [5,6,7] then [5,6,7,8,9]


def test_generic_hash_ids_trace_takes_block_size_from_line_or_option(tmp_path):
    from flatradix.replay import load_trace

    rows = [{"timestamp": 3, "hash_ids": [1, 2], "output_length": 1, "block_size": 4},
            {"timestamp": 1, "hash_ids": [1], "input_length": 3, "output_length": 0,
             "block_size": 4}]
    w = load_trace(write_trace(tmp_path / "a.jsonl", rows))
    assert w.source_format == "generic" and w.block_size == 4 and w.has_timestamps
    assert w.input_lengths.tolist() == [3, 8]  # sorted by timestamp; default 2 blocks x 4
    for r in rows:
        del r["block_size"]
    p = write_trace(tmp_path / "b.jsonl", rows)
    assert load_trace(p, format="generic", block_size=4).input_lengths.tolist() == [3, 8]
    with pytest.raises(TraceFormatError, match=r"b\.jsonl:1: hash_ids without a block size"):
        load_trace(p, format="generic")


@pytest.mark.parametrize("rows, what", [
    ([{"token_ids": [1], "output_length": 0}, {"hash_ids": [1], "output_length": 0}],
     ":2: has hash_ids but the lines before have token_ids"),
    ([{"token_ids": [1], "output_length": 0, "timestamp": 0},
      {"token_ids": [1], "output_length": 0}], ":2: timestamp on some lines but not others"),
    ([{"token_ids": [1], "output_length": 0},
      {"token_ids": [1], "output_length": 0, "timestamp": 5}], ":2: has a timestamp but"),
    ([{"token_ids": [1, 2], "output_length": 0, "input_length": 3}],
     ":1: input_length 3 but token_ids has 2 tokens"),
    ([{"token_ids": [1, -2], "output_length": 0}], ":1: token_ids must hold integers >= 0"),
    ([{"token_ids": [1, True], "output_length": 0}], ":1: token_ids must hold integers"),
    ([{"token_ids": [1 << 62], "output_length": 0}], ":1: token id 4611686018427387904 too"),
    ([{"token_ids": [1], "hash_ids": [1], "output_length": 0}], ":1: has both"),
    ([{"token_ids": [1]}], ":1: missing field(s) output_length"),
    ([{"output_length": 3}], ":1: missing field(s) token_ids or hash_ids"),
    ([{"hash_ids": [1, 2], "block_size": 4, "output_length": 0, "input_length": 3}],
     ":1: input_length 3 needs 1 block of 4 tokens but hash_ids has 2 ids"),
])
def test_generic_trace_errors_name_the_line(tmp_path, rows, what):
    from flatradix.replay import load_trace

    with pytest.raises(TraceFormatError, match=re.escape("g.jsonl" + what)):
        load_trace(write_trace(tmp_path / "g.jsonl", rows))


def test_encoding_and_empty_file_errors(tmp_path):
    from flatradix.replay import load_trace

    good = '{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1]}\n'
    for enc, what in (("utf-16", "UTF-16-encoded"), ("utf-32", "UTF-32-encoded"),
                      ("utf-16-be", "NUL bytes")):
        (tmp_path / "e.jsonl").write_bytes(good.encode(enc))
        with pytest.raises(TraceFormatError, match=f"e.jsonl:1: .*{what}"):
            load_trace(tmp_path / "e.jsonl")
    (tmp_path / "bom8.jsonl").write_bytes(b"\xef\xbb\xbf" + good.encode())   # UTF-8 BOM is fine
    assert len(load_trace(tmp_path / "bom8.jsonl", block_size=4)) == 1
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(TraceFormatError, match="empty.jsonl: no requests"):
        load_trace(tmp_path / "empty.jsonl")


def test_trace_loading_shows_progress_on_a_terminal(tmp_path, monkeypatch):
    pytest.importorskip("tqdm")
    import io

    from flatradix.replay import load_trace

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    p = write_trace(tmp_path / "t.jsonl", [{"timestamp": i, "input_length": 4,
                                            "output_length": 1, "hash_ids": [i]}
                                           for i in range(5000)])
    for stream, shown in ((io.StringIO(), False), (Terminal(), True)):
        monkeypatch.setattr(sys, "stderr", stream)
        assert len(load_trace(p, block_size=4, progress=True)) == 5000
        assert ("loading trace" in stream.getvalue()) == shown


# ---------------------------------------------------------------- describe
def test_describe_reuse_distances_by_hand(tmp_path):
    """Prefixes touched: r0 a ab | r1 a ab abc | r2 a ad | r3 a ab (a = [1], ab = [1, 2]...).
    Reuses, with the distinct prefixes touched in between: r1.a {ab} 1, r1.ab {a} 1,
    r2.a {ab, abc} 2, r3.a {ad} 1, r3.ab {abc, a, ad} 3; LRU tokens (k + 1) x 4."""
    from flatradix.replay import describe_workload, load_trace

    rows = [{"timestamp": t, "input_length": 4 * len(h), "output_length": 1, "hash_ids": h}
            for t, h in ((0, [1, 2]), (1000, [1, 2, 3]), (3000, [1, 4]), (4000, [1, 2]))]
    d = describe_workload(load_trace(write_trace(tmp_path / "t.jsonl", rows), block_size=4))
    assert (d["requests"], d["blocks"], d["distinct_prefixes"], d["reused_blocks"]) == (4, 9, 4, 5)
    assert d["duration_s"] == 4.0 and d["arrival_rate_per_s"] == 1.0
    # [8, 8, 8, 12], numpy's linear percentiles: p90 8 + 0.7 x 4, p99 8 + 0.97 x 4
    assert d["prompt_length"] == {"p50": 8, "p90": 11, "p99": 12, "max": 12, "mean": 9.0}
    rd = d["reuse_distance"]
    assert rd["lru_tokens"]["p50"] == 8 and rd["lru_tokens"]["max"] == 16   # [8, 8, 12, 8, 16]
    assert rd["requests"]["p50"] == 1 and rd["requests"]["max"] == 2        # [1, 1, 1, 1, 2]
    assert rd["seconds"]["p50"] == 1.0 and rd["seconds"]["max"] == 3.0      # [1, 1, 2, 1, 3]


@needs_trace
def test_describe_the_trace_agrees_with_its_readme():
    from flatradix.replay import describe_workload

    d = describe_workload(load_mooncake(TRACE))
    assert d["blocks"] == 288_500 and d["distinct_block_ids"] == 182_790
    assert round(100 * d["reused_block_ratio"], 2) == 36.64
