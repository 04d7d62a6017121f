"""Bytes of memory per cached token, page size 1 and 16.

Tree: SGLang's benchmark workload (``workloads.prefix_sharing_sequences``,
5,000 sequences, ~650k distinct tokens) inserted into a KV pool large enough
that nothing is evicted; keys are page-aligned down.

flatradix is measured two ways:

* arrays: ``nbytes`` of the engine's arrays (the state tuple ``nodes, ctab,
  pool, heap, meta`` and the scratch ``out, acts, batch``): **allocated** (capacity,
  including doubling slack and the scratch) and **used** (node rows
  below the high-water mark, heap slots, live child-table entries, pool rows in
  use, meta);
* RSS, as for SGLang (below).

SGLang's cores keep Python objects / Rust heap memory, so every engine is also
measured by RSS in a fresh process (``gc.collect()`` and ``malloc_trim(0)``
before each reading; token data prepared as compact arrays beforehand; the KV
allocator's pages pre-touched and its free-list storage change subtracted;
SGLang values inserted as fresh tensors, as ``checkpoint`` does with
``row[:n].to(int64, copy=True)``; numpy's huge-page madvise off unless
``--numpy-hugepages``): **growth** while the tree is built, and
**released** when it is dropped (a lower bound: memory an allocator keeps for
reuse is not returned).

asv: ``track_bytes_per_token`` (flatradix arrays, page 1/16, allocated/used).
Script (all engines that import; each in a fresh process)::

    python benchmarks/bench_memory.py [--engines flatradix sglang-rust sglang-python] [--json-out F]
    python benchmarks/bench_memory.py --one ENGINE PAGE     # one measurement, JSON on stdout
"""

import ctypes
import gc
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if __package__ in (None, ""):
    sys.path.insert(0, HERE)
    try:
        import flatradix  # noqa: F401
    except ImportError:
        sys.path.insert(1, os.path.dirname(HERE))
    import workloads as W
else:
    from . import workloads as W

PAGES = [1, 16]
NUM_SEQS = 5000


def flatradix_array_bytes(cache):
    """(allocated, used) bytes of a flatradix cache's state arrays."""
    from flatradix.kernels import layout as L

    eng = cache._engine
    arrays = list(eng.st) + [eng.out, eng.acts, eng.batch]
    allocated = sum(a.nbytes for a in arrays)
    meta = eng.meta
    nodes, pool, ctab, heap = eng.st.nodes, eng.st.pool, eng.st.ctab, eng.st.heap
    hwm = int(meta[L.M_HWM])
    used = (hwm * nodes.strides[0] + hwm * heap.shape[0] * heap.itemsize
            + int(meta[L.M_POOL_TOP]) * pool.strides[0]
            + int(meta[L.M_CT_LIVE]) * ctab.strides[0] + meta.nbytes)
    return allocated, used


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _settle():
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def _touch(alloc):
    """Rewrite every array of the allocator in place, so pages it would commit
    lazily later (e.g. a ``np.zeros`` free mask) are resident before the first
    reading and never charged to the tree."""
    for v in vars(alloc).values():
        if isinstance(v, np.ndarray) and v.size:
            v[...] = v
        elif hasattr(v, "untyped_storage") and v.numel():
            v.copy_(v.clone())


def _alloc_storage_bytes(alloc):
    """Bytes of the KV allocator's own free-list storage (not tree memory)."""
    total = 0
    for name in ("free_pages", "release_pages", "_stack", "_is_free", "_mark"):
        t = getattr(alloc, name, None)
        if t is None:
            continue
        if hasattr(t, "untyped_storage"):
            total += t.untyped_storage().nbytes()
        else:
            total += t.nbytes
    return total


def measure_one(engine_name, page, num_seqs=NUM_SEQS, hugepages=False):
    """Build the workload tree in this process; return a dict of figures.

    ``hugepages=False`` turns off numpy's ``madvise(MADV_HUGEPAGE)`` for large
    arrays, so RSS counts the 4 KiB pages actually touched; with it on (numpy's
    default) a partly used array can hold whole 2 MiB pages, depending on what
    the kernel has free at the time (seen: 23 to 37 B/token for one tree)."""
    np._core.multiarray._set_madvise_hugepage(hugepages)
    if __package__ in (None, ""):
        import engines as E
    else:
        from . import engines as E

    eng = E.make_engines([engine_name])[0]
    seqs = W.prefix_sharing_sequences(num_seqs)
    # Compact per-sequence arrays made before the first reading: the ~50 MB of
    # Python int lists are freed (and trimmed) before measuring, so heap churn
    # from them is not charged to the tree.
    seqs = [np.asarray(s[: len(s) - len(s) % page], dtype=np.int64) for s in seqs]
    seqs = [s for s in seqs if s.shape[0]]
    kv = 1_500_000
    # warm-up (JIT load, lazy imports) on a throw-away cache
    w = eng.build(4096, page_size=page)
    for s in seqs[:20]:
        v = w.alloc.alloc(s.shape[0]) if s.shape[0] <= 4096 else None
        if v is not None:
            w.cache.insert(eng.insert_params(eng.key(s), v))
    del w, v
    copy = engine_name.startswith("sglang")
    _settle()
    if engine_name == "flatradix":
        import flatradix as fr

        alloc = fr.TokenToKVPoolAllocator(kv, page_size=page)
    else:
        alloc = E.sglang_allocator(kv, page)
    _touch(alloc)
    a0 = _alloc_storage_bytes(alloc)
    _settle()
    r0 = _rss()
    ctx = eng.build(kv, page_size=page, max_context_len=16, rows=1, alloc=alloc)
    cache = ctx.cache
    for s in seqs:
        key = eng.key(s)
        v = alloc.alloc(s.shape[0])
        if copy:
            v = v.clone()
        cache.insert(eng.insert_params(key, v))
        del key, v
    _settle()
    r1 = _rss()
    a1 = _alloc_storage_bytes(alloc)
    tokens = eng.tree_tokens(ctx)
    growth = r1 - r0 - (a1 - a0)
    out = {"engine": engine_name, "page_size": page, "cached_tokens": tokens,
           "rss_growth_bytes": growth, "rss_bytes_per_token": growth / tokens,
           "core": getattr(eng, "core", None)}
    if engine_name == "flatradix":
        allocated, used = flatradix_array_bytes(cache)
        out.update(arrays_allocated_bytes=allocated, arrays_used_bytes=used,
                   allocated_bytes_per_token=allocated / tokens, used_bytes_per_token=used / tokens,
                   nodes=cache.node_count())
    # RSS given back when the tree is dropped (a lower bound: memory that the
    # allocator keeps for reuse is not returned)
    del cache, ctx
    _settle()
    r2 = _rss()
    out["rss_released_bytes_per_token"] = (r1 - r2) / tokens
    return out


# ------------------------------------------------------------------ asv
class BytesPerToken:
    """flatradix state arrays per cached token (allocated and used)."""

    params = (PAGES, ["allocated", "used"])
    param_names = ["page_size", "kind"]
    unit = "bytes/token"
    timeout = 300

    def setup_cache(self):
        import flatradix as fr

        out = {}
        for page in PAGES:
            alloc = fr.TokenToKVPoolAllocator(1_500_000, page_size=page)
            cache = fr.UnifiedRadixCache(page_size=page, token_to_kv_pool_allocator=alloc)
            for s in W.prefix_sharing_sequences(NUM_SEQS):
                s = s[: len(s) - len(s) % page]
                if s:
                    cache.insert(fr.InsertParams(key=fr.RadixKey(s), value=alloc.alloc(len(s))))
            allocated, used = flatradix_array_bytes(cache)
            tokens = cache.total_size()[0]
            out[page] = {"allocated": allocated / tokens, "used": used / tokens}
        return out

    def track_bytes_per_token(self, data, page_size, kind):
        return data[page_size][kind]


# ------------------------------------------------------------------ script
def main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(description="bytes per cached token")
    ap.add_argument("--one", nargs=2, metavar=("ENGINE", "PAGE"))
    ap.add_argument("--numpy-hugepages", action="store_true",
                    help="keep numpy's huge-page madvise on (RSS then varies run to run)")
    ap.add_argument("--engines", nargs="+", default=None)
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(measure_one(args.one[0], int(args.one[1]), hugepages=args.numpy_hugepages)))
        return
    if __package__ in (None, ""):
        import engines as E
    else:
        from . import engines as E
    names = args.engines or (["flatradix", "sglang-rust", "sglang-python"]
                             if E.sglang_available() else ["flatradix"])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), os.path.dirname(HERE)) if p)
    res = []
    for page in PAGES:
        for name in names:
            cmd = [sys.executable, os.path.abspath(__file__), "--one", name, str(page)]
            out = subprocess.run(cmd + (["--numpy-hugepages"] if args.numpy_hugepages else []),
                                 check=True, capture_output=True, text=True, env=env)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            res.append(r)
            extra = ""
            if name == "flatradix":
                extra = (f"  arrays: allocated {r['allocated_bytes_per_token']:.1f}, "
                         f"used {r['used_bytes_per_token']:.1f} B/token ({r['nodes']} nodes)")
            print(f"page {page:2d} {name:15s} {r['cached_tokens']:>9,} tokens  RSS growth "
                  f"{r['rss_bytes_per_token']:6.1f}, released on delete "
                  f"{r['rss_released_bytes_per_token']:6.1f} B/token{extra}", flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
