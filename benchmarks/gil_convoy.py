#!/usr/bin/env python
"""GIL convoy check: match_prefix latency with and without a busy Python thread.

Tree: the first 2,500 sequences of SGLang's benchmark workload; 5,000 queries
(1/3 full hits, 1/3 partial, 1/3 misses), each call timed with
``perf_counter``. Run alone, then while a second thread spins in pure Python
(``x += 1``), alternating idle / busy for ``--rounds`` rounds.

A kernel that releases the GIL (``nogil=True``) and re-takes it on return
waits out the busy thread's 5 ms switch interval on every call (the convoy);
flatradix's kernels keep the GIL, so a call runs to the end once started and
only the share of CPU time between the two threads changes. Reported: p50 /
p90 / p99 / mean per call and calls per second of wall time, busy / idle.
Target (issue): latency within 2x.

    python benchmarks/gil_convoy.py [--rounds 3] [--engines flatradix sglang-rust ...]
"""

import argparse
import gc
import json
import os
import statistics
import sys
import threading
from time import perf_counter

HERE = os.path.dirname(os.path.abspath(__file__))
if __package__ in (None, ""):
    sys.path.insert(0, HERE)
    try:
        import flatradix  # noqa: F401
    except ImportError:
        sys.path.insert(1, os.path.dirname(HERE))
    import engines as E
    import workloads as W
else:
    from . import engines as E
    from . import workloads as W


class Busy:
    """A pure-Python thread holding the GIL as much as the interpreter lets it."""

    def __init__(self):
        self.stop = False
        self.thread = threading.Thread(target=self._spin, daemon=True)

    def _spin(self):
        x = 0
        while not self.stop:
            x += 1

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop = True
        self.thread.join()


def run_queries(fn, params):
    lat = []
    pc = perf_counter
    w0 = pc()
    for p in params:
        t0 = pc()
        fn(p)
        lat.append(pc() - t0)
    return lat, pc() - w0


def stats(lat, wall):
    s = sorted(lat)
    q = lambda f: s[min(int(len(s) * f), len(s) - 1)] * 1e6  # noqa: E731
    return {"p50_us": q(0.5), "p90_us": q(0.9), "p99_us": q(0.99), "max_us": s[-1] * 1e6,
            "mean_us": sum(s) / len(s) * 1e6, "calls_per_s_wall": len(s) / wall,
            "over_1ms": sum(1 for x in s if x > 1e-3)}


def main(argv=None):
    ap = argparse.ArgumentParser(description="match_prefix latency with a busy Python thread")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--num-seqs", type=int, default=5000)
    ap.add_argument("--engines", nargs="+", default=None)
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    names = args.engines or (["flatradix", "sglang-rust"] if E.sglang_available() else ["flatradix"])
    print(f"switch interval {sys.getswitchinterval() * 1e3:.1f} ms; {os.cpu_count()} CPUs; "
          f"engines {', '.join(names)}")
    seqs = W.prefix_sharing_sequences(args.num_seqs)
    half = len(seqs) // 2
    queries, _ = W.match_queries(seqs, half, args.num_seqs)
    res = {}
    for eng in E.make_engines(names):
        ctx = eng.build(500_000, max_context_len=4096)
        E.populate(eng, ctx, [eng.key(s) for s in seqs[:half]], seqs[:half])
        params = [eng.match_params(eng.key(q)) for q in queries]
        fn = ctx.cache.match_prefix
        run_queries(fn, params)  # first pass: splits at partial hits, JIT/caches warm
        idle, busy = [], []
        for _ in range(args.rounds):
            gc.collect()
            idle.append(stats(*run_queries(fn, params)))
            gc.collect()
            with Busy():
                busy.append(stats(*run_queries(fn, params)))
        med = lambda rs: {k: statistics.median(r[k] for r in rs) for k in rs[0]}  # noqa: E731
        mi, mb = med(idle), med(busy)
        res[eng.name] = {"idle": mi, "busy": mb,
                         "ratio": {k: mb[k] / mi[k] for k in ("p50_us", "p90_us", "p99_us", "mean_us")}}
        res[eng.name]["ratio"]["wall_throughput"] = mi["calls_per_s_wall"] / mb["calls_per_s_wall"]
        for tag, m in (("idle", mi), ("busy", mb)):
            print(f"{eng.name:14s} {tag}: p50 {m['p50_us']:7.1f}  p90 {m['p90_us']:7.1f}  "
                  f"p99 {m['p99_us']:8.1f}  max {m['max_us']:9.1f}  mean {m['mean_us']:7.1f} µs  "
                  f"{m['calls_per_s_wall']:>9,.0f} calls/s wall  {m['over_1ms']:.0f} calls > 1 ms")
        r = res[eng.name]["ratio"]
        print(f"{eng.name:14s} busy/idle: p50 {r['p50_us']:.2f}x  p90 {r['p90_us']:.2f}x  "
              f"p99 {r['p99_us']:.2f}x  mean {r['mean_us']:.2f}x  wall time {r['wall_throughput']:.2f}x")
        del ctx
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
