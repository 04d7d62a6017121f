"""``flatradix replay``: trace reader, synthetic workload, scheduler emulation, CLI.

Exact values: with unbounded capacity, one request at a time and a page size
dividing the block size, the replay's ``hit_tokens`` must equal what the hash
ids alone imply (``expected_hits`` below, plain Python, no flatradix); with a
finite capacity, the pure-Python reference cache of ``tests/reference.py``
replayed the same way must give the same hits, evictions, waits and
rejections, request by request. Tests of at most 500 requests read the packaged
sample (``mooncake:sample``, the trace's first 500 requests); the whole-trace
tests read the full conversation trace (``TRACE``) and skip, saying how to get
it, where it is absent.
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
SAMPLE = "mooncake:sample"   # packaged: the conversation trace's first 500 requests


def _full_trace():
    """The whole conversation trace: the project workspace's copy, else the one
    ``--trace mooncake:conversation`` downloaded into the user cache."""
    from flatradix.replay import datasets

    shared = ROOT.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"
    cached = datasets.cache_dir() / datasets.TRACES["mooncake:conversation"].filename
    for p in (shared, cached):
        if p.is_file() and p.stat().st_size == datasets.TRACES["mooncake:conversation"].size:
            return p
    return shared


TRACE = _full_trace()
needs_trace = pytest.mark.skipif(
    not TRACE.exists(),
    reason="needs the whole Mooncake conversation trace (12,031 requests): run `flatradix "
           "replay --trace mooncake:conversation --describe` once to download it (3 MB) into "
           "~/.cache/flatradix/traces ($FLATRADIX_TRACE_DIR)")
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


@pytest.mark.slow
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


@pytest.mark.parametrize("capacity, max_running", [(150_000, 8), (100_000, 2)])
def test_finite_capacity_matches_reference_on_the_trace(capacity, max_running):
    """First 500 requests: same hits (request by request), evictions, waits and
    rejections as the pure-Python reference cache driven the same way."""
    w = load_mooncake(SAMPLE, limit=500)
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


def test_cli_on_the_trace(capsys):
    assert main(["replay", "--trace", SAMPLE, "--limit", "300", "--capacity", "1M",
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
    """--help's promise: --sweep prints a table, --json the curve's JSON."""
    assert main(["replay", "--limit", "100", "--sweep", "3000", "--json"]) == 0
    curve = json.loads(capsys.readouterr().out)
    assert curve["points"][0]["capacity"] == 3000 and "unbounded" in curve
    assert curve["points"][0]["policy"] == "lru" and curve["policies"] == ["lru"]
    assert main(["replay", "--limit", "100", "--sweep", "3000"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["policy", "capacity", "hit", "ratio", "evicted", "rejected"]
    assert table[1].split()[:2] == ["lru", "3,000"] and table[2].split()[:2] == ["any", "inf"]


def test_plot_needs_sweep(capsys):
    assert main(["replay", "--plot", "x.png"]) == 2
    assert "--plot needs --sweep" in capsys.readouterr().err


@pytest.mark.parametrize("text, value", [
    ("inf", None), ("2000000", 2_000_000), ("2M", 2_000_000), ("500k", 500_000),
    ("1.5G", 1_500_000_000), ("2e6", 2_000_000), ("2_000_000", 2_000_000),
    ("2,000,000", 2_000_000), ("1,500k", 1_500_000),
])
def test_parse_capacity(text, value):
    assert parse_capacity(text) == value


@pytest.mark.parametrize("text", ["0", "-3", "1.5", "lots", "", "nan", "5,6", "1,0000", "2,00"])
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


# ---------------------------------------------------------------- KV sizing
def _layout(**cfg):
    from flatradix.replay import kv_layout_from_dict

    return kv_layout_from_dict(cfg, "c.json")


def test_kv_bytes_per_token_of_the_example_configs():
    from flatradix.replay import load_model_config

    llama = load_model_config(ROOT / "examples" / "model_configs" / "llama-3-8b-like.json")
    assert llama.full_kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072
    assert llama.sliding_window is None and llama.full_attention_layers == 32
    oss = load_model_config(ROOT / "examples" / "model_configs" / "gpt-oss-20b-like.json")
    assert (oss.full_attention_layers, oss.sliding_window_layers, oss.sliding_window) == (12, 12,
                                                                                          128)
    assert oss.full_kv_bytes_per_token == oss.swa_kv_bytes_per_token == 2 * 12 * 8 * 64 * 2


def test_kv_layouts_of_hybrid_models_by_hand():
    # gpt-oss-20b-like: 12 sliding (128) + 12 full; 2 x 12 x 8 x 64 x 2 each
    oss = _layout(num_hidden_layers=4, num_attention_heads=64, num_key_value_heads=8,
                  head_dim=64, sliding_window=128, torch_dtype="bfloat16",
                  layer_types=["sliding_attention", "full_attention"] * 2)
    assert (oss.full_attention_layers, oss.sliding_window_layers, oss.sliding_window) == (2, 2, 128)
    assert oss.full_kv_bytes_per_token == oss.swa_kv_bytes_per_token == 2 * 2 * 8 * 64 * 2
    # gemma-3-27b-like, nested text_config: 62 layers, every 6th global -> 10 full, 52 sliding
    g3 = _layout(model_type="gemma3", torch_dtype="bfloat16", text_config=dict(
        num_hidden_layers=62, num_attention_heads=32, num_key_value_heads=16, head_dim=128,
        sliding_window=1024, sliding_window_pattern=6))
    assert (g3.full_attention_layers, g3.sliding_window_layers) == (10, 52)
    assert g3.full_kv_bytes_per_token == 2 * 10 * 16 * 128 * 2 == 81_920
    assert g3.swa_kv_bytes_per_token == 2 * 52 * 16 * 128 * 2
    # gemma-2-9b-like: alternating, even layers slide
    g2 = _layout(model_type="gemma2", num_hidden_layers=42, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=256, sliding_window=4096)
    assert g2.layer_kinds[:2] == ("swa", "full") and g2.full_attention_layers == 21
    assert g2.full_kv_bytes_per_token == 2 * 21 * 8 * 256 * 2
    # qwen3-next-like: every 4th layer full, the rest gated delta net
    qn = _layout(num_hidden_layers=48, num_attention_heads=16, num_key_value_heads=2,
                 head_dim=256, full_attention_interval=4, linear_num_key_heads=16,
                 linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
                 linear_conv_kernel_dim=4, torch_dtype="bfloat16")
    assert (qn.full_attention_layers, qn.linear_attention_layers) == (12, 36)
    assert qn.full_kv_bytes_per_token == 2 * 12 * 2 * 256 * 2 == 24_576
    assert qn.mamba_state_elements == {"conv": 36 * (2 * 16 * 128 + 32 * 128) * 3,
                                       "ssm": 36 * 32 * 128 * 128}
    assert qn.mamba_state_bytes(ssm_bytes=4) == 36 * (8192 * 3 * 2 + 32 * 128 * 128 * 4)
    # nemotron-h-like pattern: 2 attention, 3 Mamba-2, 2 MLP layers
    nh = _layout(num_hidden_layers=7, num_attention_heads=8, num_key_value_heads=2,
                 head_dim=128, hybrid_override_pattern="M-M*-M*", mamba_num_heads=4,
                 mamba_head_dim=8, ssm_state_size=16, n_groups=2, conv_kernel=4)
    assert (nh.full_attention_layers, nh.linear_attention_layers, nh.num_layers) == (2, 3, 7)
    assert nh.full_kv_bytes_per_token == 2 * 2 * 2 * 128 * 2
    assert nh.mamba_state_elements == {"conv": 3 * (32 + 2 * 2 * 16) * 3, "ssm": 3 * 4 * 8 * 16}
    # jamba-like: attention at i % 8 == 4, Mamba-1 elsewhere
    jb = _layout(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                 hidden_size=4096, attn_layer_period=8, attn_layer_offset=4,
                 mamba_d_state=16, mamba_d_conv=4, mamba_expand=2)
    assert [i for i, k in enumerate(jb.layer_kinds) if k == "full"] == [4, 12, 20, 28]
    assert jb.full_kv_bytes_per_token == 2 * 4 * 8 * 128 * 2
    assert jb.mamba_state_elements == {"conv": 28 * 8192 * 3, "ssm": 28 * 8192 * 16}
    # DeepSeek-V3-like MLA: 61 layers x (512 + 64) x 2 bytes
    ds = _layout(num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128,
                 hidden_size=7168, kv_lora_rank=512, qk_rope_head_dim=64, torch_dtype="bfloat16")
    assert ds.full_kv_bytes_per_token == 61 * 576 * 2 == 70_272
    # Qwen2 with its window switched off; Mistral-7B-v0.1 slides on every layer
    assert _layout(num_hidden_layers=2, num_attention_heads=4, hidden_size=64,
                   sliding_window=4096, use_sliding_window=False).full_attention_layers == 2
    ms = _layout(num_hidden_layers=2, num_attention_heads=4, hidden_size=64, sliding_window=4096)
    assert ms.full_kv_bytes_per_token == 0 and ms.sliding_window_layers == 2


def test_kv_dtype_and_config_errors(tmp_path):
    from flatradix.replay import ModelConfigError, load_model_config

    cfg = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64,
           "torch_dtype": "float32"}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    assert load_model_config(p).full_kv_bytes_per_token == 2 * 2 * 4 * 16 * 4
    assert load_model_config(tmp_path, kv_dtype="fp8_e4m3").full_kv_bytes_per_token == 256
    for bad, what in (({"num_attention_heads": 4}, "no num_hidden_layers"),
                      (dict(cfg, layer_types=["full_attention"]), "must list 2 layer types"),
                      (dict(cfg, layer_types=["full_attention", "x"]), "unknown layer type 'x'"),
                      (dict(cfg, hidden_size=65), "not a multiple of num_attention_heads"),
                      (dict(cfg, torch_dtype="int3"), "unknown KV dtype 'int3'")):
        p.write_text(json.dumps(bad))
        with pytest.raises(ModelConfigError, match=re.escape(what)):
            load_model_config(p)


@pytest.mark.parametrize("text, value", [
    ("40GiB", 40 * 2**30), ("80GB", 80 * 10**9), ("512 MiB", 512 * 2**20), ("1.5TiB", 3 * 2**39),
    ("1000", 1000), ("64kB", 64_000),
])
def test_parse_memory(text, value):
    from flatradix.replay import parse_memory

    assert parse_memory(text) == value


@pytest.mark.parametrize("text", ["40G", "0B", "-1GiB", "0.5B", "lots", "1e400GB"])
def test_parse_memory_rejects(text):
    from flatradix.replay import parse_memory

    with pytest.raises(ValueError):
        parse_memory(text)


def test_tokens_for_memory_whole_pages():
    from flatradix.replay import tokens_for_memory

    assert tokens_for_memory(40 * 2**30, 131_072, 16) == 327_680
    assert tokens_for_memory(40 * 2**30, 24_576, 16) == 1_747_616   # 1,747,626 -> pages of 16
    with pytest.raises(ValueError, match="less than one page"):
        tokens_for_memory(1000, 100, 16)


# ---------------------------------------------------------------- arrival mode
def _arrival_workload():
    from flatradix.replay import Workload

    # r0 t=0 [1,2] 8+2 | r1 t=100 [1,2] 8+2 | r2 t=150 [3] 4+0 | r3 t=400 [1,2] 8+2; blocks of 4
    return Workload("four", 4, np.array([0.0, 100.0, 150.0, 400.0]),
                    np.array([8, 8, 4, 8]), np.array([2, 2, 0, 2]),
                    np.array([0, 2, 4, 5, 7]), np.array([1, 2, 1, 2, 3, 1, 2]))


def test_arrival_mode_by_hand_unbounded():
    """Prefill 100 tok/s, decode 10 tok/s: service = 10 ms per uncached token + 100 ms per
    output token. r0 [0, 280), r1 [100, 380) (r0 not cached yet), r2 [150, 190),
    r3 hits r0's 8 tokens: [400, 600). Peak 3 running (150-190), mean 800 / 600."""
    from flatradix.replay import ArrivalModel

    r = replay(_arrival_workload(), page_size=4, record_requests=True,
               arrival=ArrivalModel(prefill_tokens_per_s=100, decode_tokens_per_s=10,
                                    interval_s=0.2))
    pr = r.per_request
    assert pr["finish_ms"].tolist() == [280.0, 380.0, 190.0, 600.0]
    assert pr["hit_tokens"].tolist() == [0, 0, 0, 8] and r.hit_tokens == 8
    assert pr["wait_ms"].tolist() == [0.0, 0.0, 0.0, 0.0] and r.waits == 0
    a = r.arrival
    assert a["peak_running"] == 3 and a["mean_running"] == round(800 / 600, 2)
    assert a["span_s"] == 0.6 and a["interval_s"] == 0.2
    # [0, 200): r0, r1 from 100, r2 150-190: area 200 + 100 + 40; [200, 400): r0 to 280,
    # r1 to 380: 80 + 180; [400, 600): r3
    assert [(b["t_s"], b["arrivals"], b["running_max"], b["running_mean"])
            for b in a["timeline"]] == [(0.0, 3, 3, 1.7), (0.2, 0, 2, 1.3), (0.4, 1, 1, 1.0)]


def test_arrival_mode_by_hand_kv_waits():
    """A 12-token pool: r1 waits for r0 (ends 280), r2 for r1 (ends 560; FCFS behind r1),
    r3 (hits r1's prompt, locked) for r2 (ends 600). Waits 180, 410, 200 ms; one runs at a
    time."""
    from flatradix.replay import ArrivalModel

    r = replay(_arrival_workload(), capacity=12, page_size=4, record_requests=True,
               arrival=ArrivalModel(prefill_tokens_per_s=100, decode_tokens_per_s=10))
    pr = r.per_request
    assert pr["wait_ms"].tolist() == [0.0, 180.0, 410.0, 200.0]
    assert pr["finish_ms"].tolist() == [280.0, 560.0, 600.0, 800.0]
    assert pr["waited"].tolist() == [0, 1, 1, 1] and r.waits == 3
    assert pr["hit_tokens"].tolist() == [0, 0, 0, 8]
    assert r.arrival["waited_requests"] == 3 and r.arrival["peak_running"] == 1
    assert r.kv_conserved and r.rejected_requests == 0


def test_arrival_mode_running_cap_and_rate_scale():
    """max_running 1 serialises: r1 waits for r0 (280 - 100), r2 for r1 (560 - 150), r3 for
    r2 (600 - 400), now hitting; rate_scale 2 halves the arrival times."""
    from flatradix.replay import ArrivalModel

    m = ArrivalModel(prefill_tokens_per_s=100, decode_tokens_per_s=10, rate_scale=2.0)
    r = replay(_arrival_workload(), page_size=4, max_running=1, record_requests=True, arrival=m)
    pr = r.per_request
    assert pr["arrival_ms"].tolist() == [0.0, 50.0, 75.0, 200.0]
    # the running slot frees (r0 completes, its prompt cached) before r1's match: r1 and r3
    # hit 8 tokens and hold their KV 200 ms (two output tokens)
    assert pr["hit_tokens"].tolist() == [0, 8, 0, 8]
    assert pr["finish_ms"].tolist() == [280.0, 480.0, 520.0, 720.0]
    assert pr["wait_ms"].tolist() == [0.0, 230.0, 405.0, 320.0]
    assert r.arrival["slot_waits"] == 3 and r.waits == 0
    assert "waited 3 times for a running slot" in r.notes[-1]


def test_timeline_by_hand():
    from flatradix.replay import timeline

    buckets, peak, mean = timeline(np.array([0.0, 0.0]), np.array([0.0, 50.0]),
                                   np.array([100.0, 150.0]), np.array([True, True]), 100.0)
    assert peak == 2 and mean == round((100 + 100) / 150, 2)   # two 100 ms runs over 150 ms
    assert [(b["running_max"], b["running_mean"], b["queued_max"], b["wait_ms_max"])
            for b in buckets] == [(2, 1.5, 1, 50.0), (1, 0.5, 0, 0.0)]


def test_order_mode_unchanged_by_the_arrival_machinery():
    """The order mode's figures and per-request hits equal the reference cache's, with
    several running requests (the in-flight pool bound is now the largest requests')."""
    w = synthetic_workload(150, seed=21)
    kw = dict(capacity=None, page_size=4, max_running=3, record_hits=True)
    assert_same_run(replay(w, **kw), replay(w, cache_factory=reference_factory, driver="core",
                                            **kw))


# ---------------------------------------------------------------- sweeps, CSV
def test_parallel_sweep_equals_sequential_for_several_policies():
    w = synthetic_workload(150, seed=13)
    kw = dict(capacities=[1500, 8000, None], policies=["lru", "fifo", "lfu"], page_size=4,
              bytes_per_token=100)
    seq, par = sweep(w, jobs=1, **kw), sweep(w, jobs=3, **kw)

    def strip(c):
        c = json.loads(json.dumps(c))
        for p in c["points"] + [c["unbounded"]]:
            p.pop("wall_s")
        return c

    assert strip(seq) == strip(par)
    assert [(p["policy"], p["capacity"]) for p in seq["points"]] == [
        (p, c) for p in ("lru", "fifo", "lfu") for c in (1500, 8000, "inf")]
    assert seq["points"][0]["kv_bytes"] == 150_000 and seq["unbounded"]["kv_bytes"] is None
    # each point ran its own policy: at 8,000 tokens the three differ
    assert len({seq["points"][k]["hit_tokens"] for k in (1, 4, 7)}) == 3


def test_sweep_csv_and_plot_ticks(tmp_path):
    import csv as csvmod

    from flatradix.replay import write_sweep_csv

    w = synthetic_workload(100, seed=14)
    curve = sweep(w, [1000, 3000], policies=["lru", "mru"], page_size=16)
    p = tmp_path / "s.csv"
    write_sweep_csv(curve, p)
    rows = list(csvmod.DictReader(p.open()))
    assert [(r["policy"], r["capacity"]) for r in rows] == [
        ("lru", "1000"), ("lru", "3000"), ("mru", "1000"), ("mru", "3000"), ("lru", "inf")]
    assert [int(r["hit_tokens"]) for r in rows] == [
        q["hit_tokens"] for q in curve["points"] + [curve["unbounded"]]]
    pytest.importorskip("matplotlib")
    from flatradix.replay.report import sweep_figure

    curve["kv_bytes_per_token"] = 131_072
    fig = sweep_figure(curve)
    ax = fig.axes[0]
    assert list(ax.get_xticks()) == [1000, 3000]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["125 MiB\n1k", "375 MiB\n3k"]
    assert [line.get_label() for line in ax.get_lines()][:2] == ["lru", "mru"]


def test_per_request_csv_sums_to_the_run(tmp_path):
    import csv as csvmod

    from flatradix.replay import write_per_request_csv

    w = synthetic_workload(120, seed=15)
    r = replay(w, capacity=3000, page_size=16, max_running=2, record_requests=True)
    p = tmp_path / "r.csv"
    write_per_request_csv([r], p)
    rows = list(csvmod.DictReader(p.open()))
    assert len(rows) == 120 and rows[0]["wait_ms"] == ""
    assert sum(int(x["hit_tokens"]) for x in rows) == r.hit_tokens
    assert sum(int(x["evicted_tokens"]) for x in rows) == r.evicted_tokens
    assert sum(int(x["waited"]) for x in rows) == r.waits
    assert sum(int(x["rejected"]) for x in rows) == r.rejected_requests
    assert [float(x["arrival_ms"]) for x in rows] == w.timestamps.tolist()


def test_sweep_progress_per_point_on_a_terminal(monkeypatch):
    pytest.importorskip("tqdm")
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    w = synthetic_workload(60, seed=16)
    for stream, shown in ((io.StringIO(), False), (Terminal(), True)):
        monkeypatch.setattr(sys, "stderr", stream)
        sweep(w, [2000, 4000], jobs=2, progress=True)
        text = stream.getvalue()
        assert all(f"{k}/3" in text for k in (1, 2, 3)) == shown   # one refresh per point


# ---------------------------------------------------------------- SWA mode
def _swa_capturing_factory(box):
    from flatradix.replay import default_cache_factory

    def factory(*args, **kw):
        box["cache"] = default_cache_factory(*args, **kw)
        box["alloc"] = args[2]
        return box["cache"]
    return factory


def _five():
    """Blocks of 4 tokens: r0 [1,2,3,4] 16+6, r1 [1,2,3,4,5] 20+1, r2 the same, r3 [9,10,11]
    12+4, r4 [1,2,3] 12+1."""
    from flatradix.replay import Workload

    blocks = [[1, 2, 3, 4], [1, 2, 3, 4, 5], [1, 2, 3, 4, 5], [9, 10, 11], [1, 2, 3]]
    ptr = np.cumsum([0] + [len(b) for b in blocks])
    return Workload("five", 4, np.zeros(5), np.array([16, 20, 20, 12, 12]),
                    np.array([6, 1, 1, 4, 1]), ptr, np.array(sum(blocks, [])))


def test_swa_replay_by_hand():
    """Page 4, W = 8 (tail T = 8), slide interval 4, Full pool 64 (54 used), SWA pool
    0.5 x 64 = 32.

    r0 (16 + 6 tokens): decode slides at pre_len 16 (SWA [0, 8) freed) and 20 ([8, 12));
      cursor 12, so the prompt is cached as a tombstone [0, 12) + live [12, 16).
    r1: the match walks 16 tokens of Full KV, but after the hole only 4 < W live SWA
      tokens: hit 0, lost 16, branching 16. Its insert stops at the branching point 16
      and recovers the tombstone [0, 12) from its fresh KV: the tree holds 16 + 16.
    r2: hits 16 (the branch [16, 20) was not cached). Tree 20 + 20; SWA free 12.
    r3 (12 + 4, new blocks) needs 16 SWA slots: evict_for_alloc(swa_num_tokens=4)
      tombstones the LRU SWA node, [0, 12) (the insert-end refresh moved [16, 20) and
      [12, 16) ahead of it): 12 SWA tokens evicted, no Full. Slide at pre_len 12 frees
      [0, 4): cursor 4, cached as tombstone [0, 4) + live [4, 12).
    r4 [1,2,3]: Full KV for all 12, SWA none: hit 0, lost 12; its insert recovers [0, 12).
    Full-only replay of the same pool: r1 16, r2 20, r4 12."""
    box = {}
    r = replay(_five(), capacity=64, page_size=4, swa_window=8, swa_ratio=0.5,
               swa_eviction_interval=4, record_requests=True,
               cache_factory=_swa_capturing_factory(box))
    pr = r.per_request
    assert pr["hit_tokens"].tolist() == [0, 0, 16, 0, 0] and r.hit_tokens == 16
    assert pr["full_kv_hit_tokens"].tolist() == [0, 16, 16, 0, 12]
    assert pr["window_lost_hit_tokens"].tolist() == [0, 16, 0, 0, 12]
    assert r.window_lost_hit_tokens == 28
    assert pr["swa_evicted_tokens"].tolist() == [0, 0, 0, 12, 0]
    assert r.swa_evicted_tokens == 12 and r.evicted_tokens == 0 and r.evict_calls == 1
    assert r.swa_slid_tokens == 8 + 4 + 4
    assert r.latency_us["evict_sliding_windows"]["count"] == 3
    # the Full pool is the workload's bound: 8 distinct prefix blocks x 4 + 22 in flight
    assert r.swa_pool_slots == 32 and r.pool_slots == 54
    # tree: [0,12) 12 + [12,16) 4 + [16,20) 4 + r3's 12 Full; SWA all but r3's [0, 4)
    assert r.final_tree_tokens == 32 and r.final_swa_tree_tokens == 28
    assert r.kv_conserved and r.rejected_requests == 0
    cache, alloc = box["cache"], box["alloc"]
    assert alloc.full_available_size() == 54 - 32 and alloc.swa_available_size() == 4
    _assert_slot_partition(cache, alloc)
    full_only = replay(_five(), capacity=64, page_size=4, record_requests=True)
    assert full_only.per_request["hit_tokens"].tolist() == [0, 16, 20, 0, 12]
    d = r.to_dict()
    assert d["swa_window"] == 8 and d["window_lost_hit_tokens"] == 28
    assert "swa_window" not in full_only.to_dict()


def _assert_slot_partition(cache, alloc):
    """Every Full slot is free or in the tree (once); every SWA slot is free or the
    peer of exactly one tree Full slot; nothing is held by a request or locked."""
    tree_full, tree_swa = swa_pool_partition(cache, alloc)
    assert cache.total_size() == (tree_full.size, tree_swa.size)


def swa_pool_partition(cache, alloc):
    """The Full and SWA halves of ``_assert_slot_partition`` (shared with the SWA +
    Mamba replay tests): returns the tree's Full slots and their SWA peers."""
    tree_full = np.asarray(cache.all_values_flatten(), dtype=np.int64)
    full_free = np.flatnonzero(alloc.full_attn_allocator.is_free(
        np.arange(alloc.size_full + 1)))
    assert np.unique(tree_full).size == tree_full.size
    assert np.intersect1d(tree_full, full_free).size == 0
    assert tree_full.size + full_free.size == alloc.size_full
    peers = np.asarray(alloc.translate_swa_indices_for_transfer(tree_full), dtype=np.int64)
    tree_swa = peers[peers > 0]
    swa_free = np.flatnonzero(alloc.swa_attn_allocator.is_free(np.arange(alloc.size_swa + 1)))
    assert np.unique(tree_swa).size == tree_swa.size
    assert np.intersect1d(tree_swa, swa_free).size == 0
    assert tree_swa.size + swa_free.size == alloc.size_swa
    return tree_full, tree_swa
    assert cache.protected_size() == 0 and cache.swa_protected_size() == 0
    cache.sanity_check()


@pytest.mark.parametrize("capacity, max_running, window, ratio, arrival", [
    (4_000, 1, 64, 0.5, False), (3_000, 6, 256, 0.25, False), (None, 4, 32, None, False),
    (6_000, 8, 128, 1.0, True),
])
def test_swa_slot_partition_after_replay(capacity, max_running, window, ratio, arrival):
    from flatradix.replay import ArrivalModel

    w = synthetic_workload(250, seed=11)
    box = {}
    r = replay(w, capacity=capacity, page_size=16, max_running=max_running, swa_window=window,
               swa_ratio=ratio, cache_factory=_swa_capturing_factory(box),
               arrival=ArrivalModel(decode_tokens_per_s=200) if arrival else None)
    _assert_slot_partition(box["cache"], box["alloc"])
    assert r.kv_conserved and r.swa_slid_tokens > 0
    assert r.served_requests + r.rejected_requests == 250
    if capacity is not None:
        assert r.swa_pool_slots == int(capacity * (ratio or 0.8)) // 16 * 16


@pytest.mark.parametrize("capacity, max_running, policy", [
    (3_200, 4, "lru"), (1_600, 1, "lfu"), (None, 2, "lru"),
])
def test_swa_window_that_never_slides_equals_full_only(capacity, max_running, policy):
    """W above every request's length and an SWA pool as large as the Full pool: no slot
    ever slides out of a window, so the SWA pool tracks the Full pool and the run is the
    Full-only run, request by request; every Full eviction frees the same SWA tokens.
    (Capacities are whole pages: the SWA pool is sized in whole pages.)"""
    w = synthetic_workload(200, block_size=16, seed=7)
    kw = dict(capacity=capacity, page_size=16, max_running=max_running, policy=policy,
              record_hits=True)
    full = replay(w, **kw)
    swa = replay(w, swa_window=1 << 20, swa_ratio=1.0, **kw)
    assert_same_run(full, swa)
    if capacity is not None:
        assert full.evicted_tokens > 0
    assert swa.swa_evicted_tokens == swa.evicted_tokens
    assert swa.window_lost_hit_tokens == 0 and swa.swa_slid_tokens == 0
    assert swa.final_swa_tree_tokens == swa.final_tree_tokens


def test_swa_unbounded_long_window_hits_the_hash_id_oracle():
    w = synthetic_workload(400, block_size=16, seed=5)
    longest = int((w.input_lengths + w.output_lengths).max())
    r = replay(w, page_size=16, swa_window=longest)
    assert r.hit_tokens == expected_hits(workload_requests(w), 16, 16)
    assert r.evicted_tokens == 0 and r.swa_evicted_tokens == 0


def test_swa_small_window_and_pool_lose_hits():
    """A window far below the prompts: whole prompts slide out before they are cached, so
    matches find Full KV without SWA (lost > 0); a small SWA pool forces SWA evictions."""
    w = synthetic_workload(300, block_size=16, seed=3)
    full = replay(w, capacity=20_000, page_size=16)
    r = replay(w, capacity=20_000, page_size=16, swa_window=512, swa_ratio=0.3)
    assert r.window_lost_hit_tokens > 0 and r.swa_evicted_tokens > 0
    assert r.hit_tokens < full.hit_tokens


def test_swa_request_larger_than_the_swa_pool_is_rejected():
    """r0 needs 16 + 6 = 22 slots in each pool at admission; an SWA pool of 16 cannot
    hold it even empty: rejected (a miss), the note says which pool."""
    r = replay(_five(), capacity=64, page_size=4, swa_window=8, swa_ratio=0.25,
               swa_eviction_interval=4, record_hits=True)
    assert r.hits.tolist()[0] == -1 and r.rejected_requests >= 1
    assert "SWA pool holds 16 tokens" in r.notes[-1]
    assert r.kv_conserved


@pytest.mark.parametrize("kw, what", [
    (dict(swa_ratio=0.5), "swa_ratio needs swa_window"),
    (dict(swa_window=0), "swa_window must be in"),
    (dict(swa_window=-4), "swa_window must be in"),
    (dict(swa_window=64, swa_ratio=0), r"swa_ratio must be a number in \(0, 1\]"),
    (dict(swa_window=64, swa_ratio=1.5), r"swa_ratio must be a number in \(0, 1\]"),
    (dict(swa_window=64, swa_eviction_interval=0), "swa_eviction_interval"),
    (dict(swa_window=64, driver="core"), "driver='request'"),
    (dict(swa_window=64, capacity=20, swa_ratio=0.1), "SWA pool .* less than one page"),
])
def test_swa_replay_rejects_bad_options(kw, what):
    with pytest.raises(ValueError, match=what):
        replay(_five(), page_size=4, **kw)


def test_swa_tokens_for_memory_by_hand():
    """gpt-oss-20b-like: 24,576 bytes/token in each pool. 40 GiB at R = 0.5: a full token
    costs 24,576 + 0.5 x 24,576 = 36,864 bytes, 42,949,672,960 / 36,864 = 1,165,084.4 ->
    1,165,072 (pages of 16); SWA 582,536 -> 582,528. R = 1: 873,813.3 -> 873,808 each."""
    from flatradix.replay.model import swa_tokens_for_memory

    assert swa_tokens_for_memory(40 * 2**30, 24_576, 24_576, 0.5, 16) == (1_165_072, 582_528)
    assert swa_tokens_for_memory(40 * 2**30, 24_576, 24_576, 1.0, 16) == (873_808, 873_808)
    f, s = swa_tokens_for_memory(40 * 2**30, 24_576, 24_576, 0.5, 16)
    assert f * 24_576 + s * 24_576 <= 40 * 2**30
    with pytest.raises(ValueError, match="less than one page"):
        swa_tokens_for_memory(100_000, 24_576, 24_576, 0.5, 16)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        swa_tokens_for_memory(40 * 2**30, 24_576, 24_576, 0.0, 16)


def test_swa_sweep_over_windows(tmp_path):
    """Two windows x two capacities + one unbounded run per window; a window longer than
    every request gives the Full-only curve; CSV rows and columns; the plot."""
    from flatradix.replay import format_sweep, write_sweep_csv

    w = synthetic_workload(150, block_size=16, seed=7)
    longest = int((w.input_lengths + w.output_lengths).max())
    caps = [2_000, 5_000]
    curve = sweep(w, caps, swa_windows=[256, longest], page_size=16, swa_ratio=1.0)
    full = sweep(w, caps, page_size=16)
    assert [(p["swa_window"], p["capacity"]) for p in curve["points"]] == [
        (256, 2_000), (256, 5_000), (longest, 2_000), (longest, 5_000)]
    assert [p["swa_window"] for p in curve["swa"]["unbounded"]] == [256, longest]
    assert [p["hit_tokens"] for p in curve["points"][2:]] == [
        p["hit_tokens"] for p in full["points"]]
    assert curve["swa"]["unbounded"][1]["hit_tokens"] == full["unbounded"]["hit_tokens"]
    assert curve["unbounded"]["swa_window"] == 256
    assert curve["swa"]["unbounded"][0]["window_lost_hit_tokens"] > 0
    text = format_sweep(curve)
    assert "lost to W" in text and len(text.splitlines()) == 2 + 4 + 2
    write_sweep_csv(curve, tmp_path / "c.csv")
    import csv as _csv

    rows = list(_csv.DictReader(open(tmp_path / "c.csv")))
    assert len(rows) == 6 and rows[-1]["capacity"] == "inf"
    assert rows[0]["swa_window"] == "256" and rows[0]["swa_pool_slots"] == "2000"
    assert int(rows[0]["window_lost_hit_tokens"]) == curve["points"][0]["window_lost_hit_tokens"]
    pytest.importorskip("matplotlib")
    from flatradix.replay import plot_sweep

    plot_sweep(curve, tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 1000


def test_swa_parallel_sweep_equals_sequential():
    w = synthetic_workload(120, block_size=16, seed=2)
    kw = dict(page_size=16, swa_windows=[128, 512], swa_ratio=0.5)

    def strip(c):
        for p in c["points"] + c["swa"]["unbounded"] + [c["unbounded"]]:
            p.pop("wall_s")
        return c
    assert strip(sweep(w, [3_000], jobs=2, **kw)) == strip(sweep(w, [3_000], **kw))


def test_swa_report_text():
    r = replay(_five(), capacity=64, page_size=4, swa_window=8, swa_ratio=0.5,
               swa_eviction_interval=4)
    text = format_report(r)
    for s in ("sliding window 8 tokens | SWA pool 32 tokens (swa ratio 0.5)",
              "lost to window  28 (", "evicted tokens  Full 0, SWA 12 (1 evict calls)",
              "window slides   16 SWA slots freed (3 calls)",
              "peak tree size  32 Full tokens, 28 SWA tokens", "evict_sliding_windows"):
        assert s in text, s
