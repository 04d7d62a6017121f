#!/usr/bin/env python
"""Where flatradix's time goes per operation: façade Python vs kernel vs allocator.

A developer tool for the engine owner, not a benchmark of record. It runs the
peer comparison's workload (SGLang benchmark shape, own allocator, page 1) and
splits each operation's wall time into

* kernel:    time inside the kernel calls made through the engine (``Engine.k``)
             (Numba dispatch + unboxing of the array arguments + compiled code);
  dispatch:  the part of it a trivial call costs (same arrays, empty key / stale id);
* allocator: time inside ``TokenToKVPoolAllocator.free``;
* façade:    the rest (validation, casting, locking, result objects, copies).

The engine's kernel callers are wrapped (each cache built while a ``KernelClock``
is on gets timed ones); the wrapper's own cost is measured and subtracted. Then ``cProfile`` lists the façade functions
with the most own time for match_prefix and insert.

    python benchmarks/profile_ops.py [--num-seqs 5000] [--no-cprofile]
    python benchmarks/profile_ops.py --swa-window 1024 [--swa-ratio 0.8]

``--swa-window``: the same split for the ``(FULL, SWA)`` cache driven as
``compare_sglang.py --swa-window`` drives it (insert with the sequence's SWA
cursor, match, ``lock`` + ``unlock``, slide, rolling release), each next to
the Full-only cache's figure for the same call.
"""

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
from time import perf_counter

import numpy as np

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

from flatradix import engine as engine_mod  # noqa: E402


class KernelClock:
    """Times every kernel call of the caches built while it is on (it wraps the
    callers ``Engine.k`` is made of: ``engine._caller``)."""

    def __init__(self):
        self.seconds = 0.0
        self.calls = 0
        self.orig = engine_mod._caller

        def timed_caller(eng, k, spec, _orig=self.orig):
            return self._wrap(_orig(eng, k, spec))

        engine_mod._caller = timed_caller

    def _wrap(self, f):
        def timed(*a):
            t0 = perf_counter()
            r = f(*a)
            self.seconds += perf_counter() - t0
            self.calls += 1
            return r
        return timed

    def restore(self):
        engine_mod._caller = self.orig


def wrapper_overhead():
    """Seconds a KernelClock-style wrapper adds around a trivial call."""
    def noop(*a):
        return a

    kc = KernelClock.__new__(KernelClock)
    kc.seconds, kc.calls = 0.0, 0
    w = kc._wrap(noop)
    n = 100_000
    t0 = perf_counter()
    for _ in range(n):
        noop(1, 2, 3)
    base = perf_counter() - t0
    t0 = perf_counter()
    for _ in range(n):
        w(1, 2, 3)
    return max(0.0, (perf_counter() - t0 - base) / n)


def breakdown(name, fn, items, kc, fclock, wrap_cost):
    """``items`` may be a generator: its (untimed) preparation is excluded."""
    kern = kcalls = alloc = 0.0
    lat = []
    pc = perf_counter
    for it in items:
        k0, kn0, f0 = kc.seconds, kc.calls, fclock.seconds
        t0 = pc()
        fn(it)
        lat.append(pc() - t0)
        kern += kc.seconds - k0
        kcalls += kc.calls - kn0
        alloc += fclock.seconds - f0
    total = sum(lat)
    n = len(lat)
    facade = total - kern - alloc - kcalls * wrap_cost
    return {"op": name, "n": n, "total_us": total / n * 1e6, "p50_us": statistics.median(lat) * 1e6,
            "kernel_us": kern / n * 1e6, "kernel_calls_per_op": kcalls / n,
            "alloc_us": alloc / n * 1e6, "facade_us": facade / n * 1e6}


def dispatch_floor(cache):
    """µs of a kernel call that does no work (empty key / stale id): the fixed cost."""
    k = cache._engine.k
    units = np.empty(0, np.int64)
    out = {}
    reps = 20000
    t0 = perf_counter()
    for _ in range(reps):
        k.match_prefix(units, 0, 0, cache._engine.out)
    out["match"] = (perf_counter() - t0) / reps * 1e6
    stale = (1 << 40) | 1
    t0 = perf_counter()
    for _ in range(reps):
        k.inc_lock_ref(stale, 0)
    out["inc_lock_ref"] = (perf_counter() - t0) / reps * 1e6
    # the same no-op match, unwrapped and with its arguments packed once, through
    # Numba's dispatcher and through the compiled overload's entry point (which
    # skips the dispatcher's type resolution): what the dispatcher adds
    from flatradix.core.match import match_prefix as dispatcher  # (k's may be wrapped)

    args = (*cache._engine.st, units, 0, 0, cache._engine.out)
    dispatcher(*args)
    entry = dispatcher.overloads[dispatcher.signatures[0]].entry_point
    for name, fn in (("match_dispatcher", dispatcher), ("match_entry_point", entry)):
        t0 = perf_counter()
        for _ in range(reps):
            fn(*args)
        out[name] = (perf_counter() - t0) / reps * 1e6
    return out


def swa_main(args):
    """The SWA cache's split, op by op, with the Full-only cache's alongside."""
    seqs = W.prefix_sharing_sequences(args.num_seqs)
    half = len(seqs) // 2
    queries, _ = W.match_queries(seqs, half, args.num_seqs)
    requests = W.request_splits(seqs)
    swa = E.FlatradixSWAEngine("own", args.swa_window, args.swa_ratio)
    full = E.FlatradixEngine("own")
    for eng in (swa, full):  # warm-up compile/load
        w = eng.build(100_000)
        (E.populate_swa if eng is swa else E.populate)(
            eng, w, [eng.key(s) for s in seqs[:50]], seqs[:50])
    wrap_cost = wrapper_overhead()
    kc = KernelClock()
    rows = []
    try:
        for label, eng in (("SWA", swa), ("Full", full)):
            keys = [eng.key(s) for s in seqs]
            pop = E.populate_swa if eng is swa else E.populate
            ctx = eng.build(500_000, max_context_len=4096)

            def insert_items(ctx=ctx, eng=eng):
                for k, s in zip(keys, seqs):
                    if eng is swa:
                        v = E.alloc_slots_swa(eng, ctx, len(s), evict=2 * len(s))
                        if v is not None:
                            c = E.swa_cursor(len(s), eng.window)
                            if c:
                                ctx.alloc.free_swa(v[:c])
                            yield eng.insert_params(k, v, 0, c)
                    else:
                        v = E.alloc_slots(eng, ctx, len(s), evict=2 * len(s))
                        if v is not None:
                            yield eng.insert_params(k, v)

            rows.append(breakdown(f"{label} insert", ctx.cache.insert, insert_items(), kc,
                                  ctx.clock, wrap_cost))
            ctx = eng.build(500_000, max_context_len=4096)
            pop(eng, ctx, keys[:half], seqs[:half])
            mparams = [eng.match_params(eng.key(q)) for q in queries]
            rows.append(breakdown(f"{label} match_prefix", ctx.cache.match_prefix, mparams, kc,
                                  ctx.clock, wrap_cost))
            root = ctx.cache.root_node_handle()
            nodes = [n for n in (ctx.cache.match_prefix(eng.key(s)).last_device_node
                                 for s in seqs[:half]) if n != root]
            if eng is swa:
                lock, unlock = ctx.cache.lock, ctx.cache.unlock
                fn = lambda n: unlock(lock(n))  # noqa: E731
            else:
                inc, dec = ctx.cache.inc_lock_ref, ctx.cache.dec_lock_ref
                fn = lambda n: dec(n, inc(n))  # noqa: E731
            rows.append(breakdown(f"{label} lock_unlock", fn, nodes, kc, ctx.clock, wrap_cost))
            ctx = eng.build(500_000, max_context_len=4096)
            release = ctx.cache.cache_finished_req

            def rolling(ctx=ctx, eng=eng):
                for p, o in requests:
                    yield eng.make_request(ctx, p, o, rolling=True)
            rows.append(breakdown(f"{label} release_rolling", release, rolling(), kc, ctx.clock,
                                  wrap_cost))
            if eng is swa:
                ctx = eng.build(500_000, max_context_len=4096)
                slide = ctx.cache.evict_sliding_windows

                def slides(ctx=ctx, eng=eng):
                    for p, o in requests:
                        req = eng.make_request(ctx, p, o, slide=False)
                        yield req, len(p) + len(o) - 2
                        ctx.cache.cache_finished_req(req)
                rows.append(breakdown("SWA slide", lambda it: slide(*it), slides(), kc,
                                      ctx.clock, wrap_cost))
    finally:
        kc.restore()
    print(f"window {args.swa_window}, SWA pool {args.swa_ratio:g} x 500,000; wrapper overhead "
          f"subtracted: {wrap_cost * 1e6:.3f} µs per kernel call\n")
    print("| op | n | total µs/op (p50) | kernel µs/op (calls/op) | allocator free µs/op | "
          "façade µs/op | façade share |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['op']} | {r['n']} | {r['total_us']:.2f} ({r['p50_us']:.2f}) | "
              f"{r['kernel_us']:.2f} ({r['kernel_calls_per_op']:.2f}) | {r['alloc_us']:.2f} | "
              f"{r['facade_us']:.2f} | {r['facade_us'] / r['total_us'] * 100:.0f} % |")
    if args.no_cprofile:
        return
    ctx = swa.build(500_000, max_context_len=4096)
    keys = [swa.key(s) for s in seqs]
    E.populate_swa(swa, ctx, keys[:half], seqs[:half])
    root = ctx.cache.root_node_handle()
    nodes = [n for n in (ctx.cache.match_prefix(swa.key(s)).last_device_node
                         for s in seqs[:half]) if n != root]
    lock, unlock = ctx.cache.lock, ctx.cache.unlock
    mparams = [swa.match_params(swa.key(q)) for q in queries]
    for name, fn, items in (("SWA match_prefix", ctx.cache.match_prefix, mparams),
                            ("SWA lock_unlock", lambda n: unlock(lock(n)), nodes)):
        pr = cProfile.Profile()
        for it in items:
            pr.enable()
            fn(it)
            pr.disable()
        out = io.StringIO()
        pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(12)
        print(f"\ncProfile, {name} x {len(items)} (own time; cProfile inflates Python-call "
              f"costs):")
        print("\n".join(line for line in out.getvalue().splitlines()[6:] if line.strip()))


def main(argv=None):
    ap = argparse.ArgumentParser(description="flatradix time breakdown per op")
    ap.add_argument("--num-seqs", type=int, default=5000)
    ap.add_argument("--no-cprofile", action="store_true")
    ap.add_argument("--swa-window", type=int, default=None, metavar="W",
                    help="profile the (FULL, SWA) cache with window W (module docstring)")
    ap.add_argument("--swa-ratio", type=float, default=0.8, metavar="R")
    args = ap.parse_args(argv)
    if args.swa_window is not None:
        return swa_main(args)

    seqs = W.prefix_sharing_sequences(args.num_seqs)
    half = len(seqs) // 2
    queries, _ = W.match_queries(seqs, half, args.num_seqs)
    eng = E.FlatradixEngine("own")
    # warm-up compile/load
    w = eng.build(100_000)
    for s in seqs[:50]:
        w.cache.insert(eng.insert_params(eng.key(s), w.alloc.alloc(len(s))))
    node = w.cache.match_prefix(eng.key(seqs[0])).last_device_node
    w.cache.dec_lock_ref(node, w.cache.inc_lock_ref(node))
    w.cache.evict(eng.evict_params(2500))

    wrap_cost = wrapper_overhead()
    kc = KernelClock()
    rows = []
    try:
        # insert
        ctx = eng.build(500_000, max_context_len=4096)
        keys = [eng.key(s) for s in seqs]

        def insert_items(ctx):
            for k, s in zip(keys, seqs):
                v = E.alloc_slots(eng, ctx, len(s), evict=2 * len(s))
                if v is not None:
                    yield eng.insert_params(k, v)

        rows.append(breakdown("insert", ctx.cache.insert, insert_items(ctx), kc, ctx.clock, wrap_cost))
        # match_prefix on a tree of the first half
        ctx = eng.build(500_000, max_context_len=4096)
        E.populate(eng, ctx, keys[:half], seqs[:half])
        mparams = [eng.match_params(eng.key(q)) for q in queries]
        rows.append(breakdown("match_prefix", ctx.cache.match_prefix, mparams, kc, ctx.clock, wrap_cost))
        rows.append(breakdown("match_prefix (2nd pass)", ctx.cache.match_prefix, mparams, kc, ctx.clock,
                              wrap_cost))
        nodes = [ctx.cache.match_prefix(eng.key(s)).last_device_node for s in seqs[:half]]
        inc, dec = ctx.cache.inc_lock_ref, ctx.cache.dec_lock_ref
        rows.append(breakdown("lock_unlock", lambda n: dec(n, inc(n)), nodes, kc, ctx.clock, wrap_cost))
        floor = dispatch_floor(ctx.cache)
        ev = [eng.evict_params(2500)] * 100
        rows.append(breakdown("evict(2500)", ctx.cache.evict, ev, kc, ctx.clock, wrap_cost))
        # release
        ctx = eng.build(500_000, max_context_len=4096, rows=300)
        reqs = [eng.make_request(ctx, p, o) for p, o in W.request_splits(seqs)[:300]]
        rows.append(breakdown("release (300 reqs)", ctx.cache.cache_finished_req, reqs, kc, ctx.clock,
                              wrap_cost))
    finally:
        kc.restore()

    print(f"wrapper overhead subtracted: {wrap_cost * 1e6:.3f} µs per kernel call")
    print(f"dispatch floor (kernel call doing no work): match {floor['match']:.2f} µs, "
          f"inc_lock_ref {floor['inc_lock_ref']:.2f} µs (through the timing wrapper); the "
          f"no-op match, unwrapped: {floor['match_dispatcher']:.2f} µs through Numba's "
          f"dispatcher, {floor['match_entry_point']:.2f} µs through the compiled entry point\n")
    print("| op | n | total µs/op (p50) | kernel µs/op (calls/op) | allocator free µs/op | façade µs/op | façade share |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['op']} | {r['n']} | {r['total_us']:.2f} ({r['p50_us']:.2f}) | {r['kernel_us']:.2f} "
              f"({r['kernel_calls_per_op']:.2f}) | {r['alloc_us']:.2f} | {r['facade_us']:.2f} | "
              f"{r['facade_us'] / r['total_us'] * 100:.0f} % |")

    if args.no_cprofile:
        return
    for name, fn, items in (("match_prefix", None, None), ("insert", None, None)):
        ctx = eng.build(500_000, max_context_len=4096)
        if name == "match_prefix":
            E.populate(eng, ctx, keys[:half], seqs[:half])
            fn, items = ctx.cache.match_prefix, mparams
        else:
            items, fn = insert_items(ctx), ctx.cache.insert
        pr = cProfile.Profile()
        n = 0
        for it in items:  # profile the calls only, not the item preparation
            pr.enable()
            fn(it)
            pr.disable()
            n += 1
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(14)
        print(f"\ncProfile, {name} x {n} (own time; cProfile inflates Python-call costs):")
        print("\n".join(line for line in s.getvalue().splitlines()[6:] if line.strip()))


if __name__ == "__main__":
    main()
