#!/usr/bin/env python
"""Cost per operation against tree size, 100k to 10M cached tokens (flatradix).

One cache grows through the checkpoints (``workloads.SequenceStream``: prefix-
sharing sequences of ~1-2k tokens, page size 1, own KV allocator); at each size
the same operation mix is timed per call (``perf_counter``):

* match_prefix  300 keys: 1/3 full hits, 1/3 partial (+10..100 tokens), 1/3 misses
* insert        300 new sequences (~130 new tokens each; slots allocated untimed)
* lock_unlock   inc_lock_ref + dec_lock_ref on 300 matched nodes
* evict         EvictParams(2,500) x 8..40 (<= 20 % of the tree; refilled after)
* release       cache_finished_req of 100 requests (prompt = a cached sequence
                + 32 new tokens, 32 output tokens; KV prepared untimed)

The growth is repeated ``--repeat`` times (fresh cache, same seed) and the
median of the per-pass medians is kept. Writes ``docs/scaling.png`` (median µs
per call against tree size, log x) and, with ``--json-out``, the figures.
``--max-tokens`` lowers the top size.

    python benchmarks/scaling.py [--sizes 100000 300000 1000000 3000000 10000000]
"""

import argparse
import gc
import json
import os
import statistics
import sys
from time import perf_counter

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if __package__ in (None, ""):
    sys.path.insert(0, HERE)
    try:
        import flatradix  # noqa: F401
    except ImportError:
        sys.path.insert(1, ROOT)
    import workloads as W
    from bench_ops import build_tree
else:
    from . import workloads as W
    from .bench_ops import build_tree

import flatradix as fr  # noqa: E402

SIZES = [100_000, 300_000, 1_000_000, 3_000_000, 10_000_000]
N = 300


def _time_each(fn, items):
    lat = []
    pc = perf_counter
    for it in items:
        t0 = pc()
        fn(it)
        lat.append(pc() - t0)
    return lat


def _slots(alloc, n):
    v = alloc.alloc(n)
    if v is None:
        raise MemoryError(f"KV pool exhausted ({n} slots asked)")
    return v


def _stats(lat):
    s = sorted(lat)
    return {"p50_us": statistics.median(s) * 1e6, "mean_us": sum(s) / len(s) * 1e6,
            "p99_us": s[min(int(len(s) * 0.99), len(s) - 1)] * 1e6, "n": len(s)}


def measure_at(cache, alloc, rtp, stream, rng_seed):
    out = {}
    r = np.random.default_rng(rng_seed)
    keys = [fr.MatchPrefixParams(key=fr.RadixKey(k)) for k in stream.match_keys(N, seed=rng_seed)]
    out["match_prefix"] = _stats(_time_each(cache.match_prefix, keys))
    # lock_unlock
    nodes = [cache.match_prefix(fr.RadixKey(s)).last_device_node
             for s in stream.sample(N, seed=rng_seed + 3)]
    inc, dec = cache.inc_lock_ref, cache.dec_lock_ref
    out["lock_unlock"] = _stats(_time_each(lambda n: dec(n, inc(n)), nodes))
    # insert
    seqs = []
    while len(seqs) < N:
        seqs.extend(stream.batch())
    params = [fr.InsertParams(key=fr.RadixKey(s), value=_slots(alloc, s.shape[0])) for s in seqs[:N]]
    out["insert"] = _stats(_time_each(cache.insert, params))
    # release (cache_finished_req)
    reqs = []
    for i, s in enumerate(stream.sample(100, seed=rng_seed + 4)):
        full = np.concatenate([s, r.integers(4 * W.VOCAB, 5 * W.VOCAB, size=64, dtype=np.int64)])
        committed = full.shape[0] - 1
        row = rtp.alloc(1)[0]
        rtp.req_to_token[row, :committed] = _slots(alloc, committed)
        reqs.append(fr.Req(origin_input_ids=full[:-32], output_ids=full[-32:],
                           fill_ids=full[:committed], req_pool_idx=row, kv_committed_len=committed))
    out["release"] = _stats(_time_each(cache.cache_finished_req, reqs))
    # evict
    ev = fr.EvictParams(num_tokens=2500)
    n_ev = max(8, min(40, int(0.2 * cache.total_size()[0] / 2500)))
    out["evict"] = _stats(_time_each(cache.evict, [ev] * n_ev))
    return out


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [r["tree_tokens"] for r in results]
    ops = list(results[0]["ops"])
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for op in ops:
        ax.plot(sizes, [r["ops"][op]["p50_us"] for r in results], marker="o", label=op)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("cached tokens in the tree")
    ax.set_ylabel("median µs per call (median of passes)")
    ax.set_title("flatradix: cost per operation vs tree size (page 1)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def grow_and_measure(sizes, seed):
    """One pass: a fresh cache grown through ``sizes``, the op mix timed at each."""
    cache, alloc, rtp, stream = build_tree(0, seed=seed, headroom=int(max(sizes) * 1.3) + 2_000_000,
                                           rows=128)
    out = []
    for size in sizes:
        t0 = perf_counter()
        W.fill_to(cache, alloc, stream, size, fr.InsertParams, fr.RadixKey)
        build_s = perf_counter() - t0
        gc.collect()
        tokens, nodes = cache.total_size()[0], cache.node_count()
        ops = measure_at(cache, alloc, rtp, stream, size % 1000 + 7)
        out.append({"tree_tokens": tokens, "nodes": nodes, "build_s": build_s, "ops": ops})
        print(f"{tokens:>11,} tokens {nodes:>9,} nodes  " +
              "  ".join(f"{op} {v['p50_us']:.1f}" for op, v in ops.items()) + "  (p50 µs)", flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description="flatradix cost per op vs tree size")
    ap.add_argument("--sizes", nargs="+", type=int, default=SIZES)
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=3,
                    help="independent growth passes (fresh cache, same seed); medians are plotted")
    ap.add_argument("--plot", default=os.path.join(ROOT, "docs", "scaling.png"))
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    sizes = [s for s in args.sizes if args.max_tokens is None or s <= args.max_tokens]
    # JIT warm-up on a throw-away cache
    wa = fr.TokenToKVPoolAllocator(1_000_000)
    wc = fr.UnifiedRadixCache(token_to_kv_pool_allocator=wa, req_to_token_pool=fr.ReqToTokenPool(128, 8192))
    W.fill_to(wc, wa, W.SequenceStream(seed=99), 20_000, fr.InsertParams, fr.RadixKey)
    measure_at(wc, wa, wc.req_to_token_pool, W.SequenceStream(seed=98), 0)
    del wc, wa
    passes = []
    for r in range(args.repeat):
        print(f"pass {r + 1}/{args.repeat}")
        passes.append(grow_and_measure(sizes, seed=0))
        gc.collect()
    results = []
    for i, first in enumerate(passes[0]):
        ops = {op: {k: statistics.median(p[i]["ops"][op][k] for p in passes) for k in first["ops"][op]}
               for op in first["ops"]}
        results.append({"tree_tokens": first["tree_tokens"], "nodes": first["nodes"], "ops": ops,
                        "passes": [p[i] for p in passes]})
    base, last = results[0]["ops"], results[-1]["ops"]
    print(f"\nmedian over {args.repeat} passes; ratio of median cost, largest / smallest tree:")
    for op in base:
        print(f"  {op:13s} {base[op]['p50_us']:8.1f} -> {last[op]['p50_us']:8.1f} µs   "
              f"{last[op]['p50_us'] / base[op]['p50_us']:.2f}x")
    if args.plot:
        os.makedirs(os.path.dirname(os.path.abspath(args.plot)), exist_ok=True)
        plot(results, args.plot)
        print(f"wrote {args.plot}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
