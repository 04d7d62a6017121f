"""Eviction cost vs tree size: evicting 1,000 tokens from a 100k-token tree and
from a 10M-token tree should cost about the same, because flatradix keeps the
evictable-leaf order incrementally (SGLang's cores re-heapify every leaf at each
round start).

    python benchmarks/evict_scaling.py [--sizes 100000,1000000,10000000] [--json]

Tree: sequences of 1,000 tokens, each sharing a random-length prefix (up to 256
tokens, chained) with an earlier one; page size 1. Per size: median and p99 of
20 calls of evict(1000) and of 20 step-wise rounds of 1,000 tokens (at most 4%
of the smallest tree is evicted in all).
"""

import argparse
import json
import time

import numpy as np

from flatradix import EvictParams, InsertParams, RadixKey, UnifiedRadixCache


def build(total_tokens, seq_len=1000, seed=0):
    rng = np.random.default_rng(seed)
    cache = UnifiedRadixCache(page_size=1, node_capacity=4 * total_tokens // seq_len + 64,
                              pool_capacity=total_tokens + seq_len)
    seqs = []
    next_val = 0
    while cache.total_size()[0] < total_tokens:
        if seqs and rng.random() < 0.7:
            base = seqs[int(rng.integers(len(seqs)))]
            share = int(rng.integers(1, 257))
            toks = np.concatenate([base[:share], rng.integers(0, 1 << 30, seq_len - share)])
        else:
            toks = rng.integers(0, 1 << 30, seq_len)
        toks = toks.astype(np.int64)
        vals = np.arange(next_val, next_val + seq_len, dtype=np.int64)
        next_val += seq_len
        cache.insert(InsertParams(key=RadixKey(toks), value=vals))
        if len(seqs) < 2000:
            seqs.append(toks)
    return cache


def measure_evict(cache, n=1000, calls=20):
    cache.evict(EvictParams(num_tokens=1))  # first-call effects out of the timings
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        cache.evict(EvictParams(num_tokens=n))
        ts.append(time.perf_counter_ns() - t0)
    return np.median(ts) / 1e3, np.percentile(ts, 99) / 1e3


def measure_stepwise(cache, n=1000, calls=20):
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        cache.evict_device_start(num_tokens=n)
        while cache.evict_device_next_node().node_id is not None:
            pass
        cache.evict_device_end()
        ts.append(time.perf_counter_ns() - t0)
    return np.median(ts) / 1e3, np.percentile(ts, 99) / 1e3


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="100000,1000000,10000000")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    measure_stepwise(build(20_000), calls=2)  # compile / load the kernels outside the timings
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        t0 = time.perf_counter()
        cache = build(size)
        build_s = time.perf_counter() - t0
        tokens, nodes = cache.total_size()[0], cache.node_count()
        med, p99 = measure_evict(cache)
        smed, sp99 = measure_stepwise(cache)
        rows.append({"tree_tokens": tokens, "nodes": nodes,
                     "build_s": round(build_s, 2), "evict_1000_us_p50": round(med, 1),
                     "evict_1000_us_p99": round(p99, 1), "stepwise_1000_us_p50": round(smed, 1),
                     "stepwise_1000_us_p99": round(sp99, 1)})
        del cache
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print("| tree tokens | nodes | evict(1000) p50 µs | p99 µs | step-wise round p50 µs | p99 µs |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['tree_tokens']:,} | {r['nodes']:,} | {r['evict_1000_us_p50']} | "
              f"{r['evict_1000_us_p99']} | {r['stepwise_1000_us_p50']} | {r['stepwise_1000_us_p99']} |")


if __name__ == "__main__":
    main()
