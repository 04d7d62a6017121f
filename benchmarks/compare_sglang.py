#!/usr/bin/env python
"""flatradix against SGLang 0.5.23's UnifiedRadixCache (Python and Rust tree cores).

    python benchmarks/compare_sglang.py                       # flatradix only
    ~/.cache/flatradix-sglang-oracle/bin/python benchmarks/compare_sglang.py   # all engines
    python benchmarks/compare_sglang.py --sglang-python ~/.cache/flatradix-sglang-oracle/bin/python
    options: --rounds 3  --quick  --json-out FILE  --ops insert evict  --engines ...
    --swa-window 512 [--swa-ratio 0.8]      # the SWA mode (below)
    --mamba [--mamba-chunk 64 --mamba-states N --mamba-evict 8]   # the Mamba mode (below)

The SGLang oracle venv comes from ``../shared/tools/setup_sglang_oracle.sh``.
``--sglang-python`` re-executes this script under that interpreter (with the
repo root on ``PYTHONPATH``, so only numba must be installed there).

Workload (SGLang's own benchmark shape, ``workloads.prefix_sharing_sequences``):
5,000 sequences of ~1,300 tokens (chains and fan-outs of 1..256-token
suffixes), page size 1, a 500,000-slot KV pool. Operations, each on a fresh
cache per engine and round:

* insert          every sequence, KV slots allocated first (duplicates are freed
                  by the cache; a full pool is evicted untimed, as SGLang's bench)
* match_prefix    tree of the first 2,500; 5,000 queries, 1/3 full hits,
                  1/3 partial (+10..100 tokens), 1/3 misses (50..300 random tokens)
* match+indices   the same, plus the matched KV indices (0.5.23's match returns
                  none; its scheduler reads ``path_device_indices``; flatradix's
                  match returns them), for equal work
* evict           full pool; EvictParams(2,500) per call, up to 80 % of the tree
* lock_unlock     inc_lock_ref + dec_lock_ref on random matched nodes
* release         ``cache_finished_req`` / ``release_kv_cache(req, checkpoint=True)``
                  of requests that hold fresh KV for every committed token
* release_rolling the same, but each request is admitted first (match + lock +
                  prefix row from the tree) so admissions hit
* match_queue256  one item = a waiting queue of 256 match_prefix queries (the
                  queries above, overlapping windows): flatradix's
                  ``match_prefix_batch`` (one call) against 256 calls
* lock_batch64    one item = lock 64 matched nodes then release them:
                  ``lock_batch`` + ``unlock_batch`` against 64 ``lock`` + 64 ``unlock``

**SWA mode** (``--swa-window W``): every engine is built with the ``(FULL, SWA)``
components, window W, and its own SWA allocator at page 1 (flatradix's
``SWATokenToKVPoolAllocator``; SGLang's over an ``SWAKVPool`` on the CPU: its
``alloc`` hands out a Full and an SWA slot per token), the SWA pool
``--swa-ratio`` x the Full pool. The same sequences, driven as a scheduler
does: each inserted sequence is a finished request whose window slid during
decode (its SWA slots below ``n - 1 - W`` freed first, then
``InsertParams(component_evicted_seqlens={SWA: cursor})``), short pools are
evicted with ``EvictParams(num_tokens, swa_num_tokens)``, requests lock with
``cache.lock`` / ``unlock`` (``TreeLock`` receipts), carry the match's
``swa_branching_seqlen`` and slide with ``evict_sliding_windows`` before their
release. Operations:

* insert, match_prefix, match+indices, lock_unlock, release, release_rolling
                  as above
* evict           full pools; ``EvictParams(num_tokens=2,500)`` per call (the
                  Full walk; evicted leaves free their SWA too)
* evict_swa       ``EvictParams(num_tokens=0, swa_num_tokens=2,500)`` per call
                  (the SWA walk: LRU SWA data tombstoned), up to 80 % of the SWA
* slide           ``evict_sliding_windows(req, committed - 1)`` of a finished
                  request whose window never slid (frees its SWA below the window)

The work check compares, per operation, the tree's (Full, SWA) sizes, both
pools' free slots, the evicted Full and SWA tokens, and every match's
``(device_prefix_len, full_kv_hit_length, swa_branching_seqlen)``.

**Mamba mode** (``--mamba``): every engine with the ``(FULL, MAMBA)`` components
at page 1 without the extra buffer (SGLang's rule: only sequence-end states are
cached), ``mamba_cache_chunk_size`` ``--mamba-chunk``, and its own request pool
with a Mamba state allocator of ``--mamba-states`` slots (default ``--kv-size`` /
400; flatradix's ``HybridReqToTokenPool``, SGLang's on the CPU with the smallest
Mamba2 state shapes; "flatradix+sgl_alloc" runs on SGLang's KV allocator and
pool). Each inserted sequence is a finished request donating its state:
``InsertParams(mamba_value=mamba_allocator.alloc(1))``, a state the tree did not
take (``InsertResult.mamba_exist``) freed by the caller (untimed); a short state
pool is evicted first with ``EvictParams(num_tokens=0, mamba_num=1)``, a short
KV pool as above. Operations:

* insert, match_prefix, match+indices, lock_unlock (``cache.lock`` / ``unlock``)
                  as above
* evict           every sequence inserted (up to a full KV pool; the state pool's
                  evictions keep it below); ``EvictParams(num_tokens=2,500)`` per
                  call (a leaf goes whole, its state with it)
* evict_mamba     the same tree; ``EvictParams(num_tokens=0, mamba_num=--mamba-evict)``
                  per call (the Mamba LRU: a leaf goes whole, an internal state is
                  tombstoned), up to 80 % of the states
* lock_unlock_decode  ``lock(node, skip_lock_components=(MAMBA,))`` / ``unlock``:
                  a decoding request's hold (its state is its own; the tree's
                  stays evictable)

No release / release_rolling / slide: this mode times tree operations only
(a Mamba request's release, ``cache_finished_req`` donating ``Req.mamba_pool_idx``,
is the request path). The work check compares the tree's (Full tokens, states), both pools' free slots,
the evicted tokens and states, and every match's ``(device_prefix_len,
full_kv_hit_length, mamba_branching_seqlen)``.

Only the cache call is timed (per operation, ``perf_counter``); preparation
(allocating slots, building keys, requests, admissions) is not. Engines
alternate operation by operation in every round (order rotated each round);
figures are medians over rounds. "tree-only" subtracts the time spent inside
the allocator's ``free``/``free_segment`` (``engines.FreeClock``); "e2e" keeps it.
"""

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
from time import perf_counter

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if __package__ in (None, ""):
    sys.path.insert(0, HERE)
    try:
        import flatradix  # noqa: F401
    except ImportError:
        sys.path.insert(1, ROOT)
    import engines as E
    import workloads as W
else:
    from . import engines as E
    from . import workloads as W

OPS = ("insert", "match_prefix", "match+indices", "evict", "lock_unlock", "release",
       "release_rolling", "match_queue256", "lock_batch64")
QUEUE, LOCK_BATCH = 256, 64
SWA_OPS = ("insert", "match_prefix", "match+indices", "evict", "evict_swa", "lock_unlock",
           "release", "release_rolling", "slide")
MAMBA_OPS = ("insert", "match_prefix", "match+indices", "evict", "evict_mamba", "lock_unlock",
             "lock_unlock_decode")
EVICT_BATCH = 2500


# ------------------------------------------------------------------ workload
class Workload:
    def __init__(self, num_seqs, kv_size, chunk_len=256):
        self.num_seqs = num_seqs
        self.kv_size = kv_size
        self.seqs = W.prefix_sharing_sequences(num_seqs, chunk_len)
        self.half = len(self.seqs) // 2
        self.queries, self.kinds = W.match_queries(self.seqs, self.half, num_seqs)
        self.requests = W.request_splits(self.seqs)
        self.max_len = max(len(s) for s in self.seqs) + 16
        self.mean_len = statistics.mean(len(s) for s in self.seqs)
        self._keys = {}

    def keys(self, eng, what):
        """Engine-native keys, built once per engine (keys are never mutated)."""
        k = (eng.name, what)
        if k not in self._keys:
            src = self.seqs if what == "seqs" else self.queries
            self._keys[k] = [eng.key(s) for s in src]
        return self._keys[k]


def warmup_count(n):
    return min(20, n // 10)


# ------------------------------------------------------------------ timing
def timed_loop(fn, items, clock, after=None):
    """Time ``fn(item)`` for each item (the item generator runs untimed; so does
    ``after(item, result)``, what the caller does with a result).
    Returns (latencies, free seconds inside each call, results)."""
    lat, fre, res = [], [], []
    pc = perf_counter
    for item in items:
        f0 = clock.seconds
        t0 = pc()
        r = fn(item)
        t1 = pc()
        lat.append(t1 - t0)
        fre.append(clock.seconds - f0)
        res.append(r)
        if after is not None:
            after(item, r)
    return lat, fre, res


def summarize(lat, fre, warm):
    lat, fre = lat[warm:], fre[warm:]
    n = len(lat)
    if n == 0:
        return None
    tree = [a - b for a, b in zip(lat, fre)]
    tot, tot_tree = sum(lat), sum(tree)

    def pct(xs, q):
        s = sorted(xs)
        return s[min(int(len(s) * q), len(s) - 1)] * 1e6

    return {
        "n": n,
        "e2e_ops_s": n / tot,
        "tree_ops_s": n / tot_tree,
        "e2e_p50_us": statistics.median(lat) * 1e6,
        "e2e_p99_us": pct(lat, 0.99),
        "tree_p50_us": statistics.median(tree) * 1e6,
        "tree_p99_us": pct(tree, 0.99),
        "free_us_per_op": sum(fre) / n * 1e6,
    }


# ------------------------------------------------------------------ operations
def op_insert(eng, wl):
    ctx = eng.build(wl.kv_size, max_context_len=wl.max_len)
    keys = wl.keys(eng, "seqs")

    def items():
        for k, s in zip(keys, wl.seqs):
            v = E.alloc_slots(eng, ctx, len(s), evict=2 * len(s))
            if v is not None:
                yield eng.insert_params(k, v)

    lat, fre, _ = timed_loop(ctx.cache.insert, items(), ctx.clock)
    return lat, fre, {"tree_tokens": eng.tree_tokens(ctx)}


def _match_common(eng, wl, fn_of):
    ctx = eng.build(wl.kv_size, max_context_len=wl.max_len)
    E.populate(eng, ctx, wl.keys(eng, "seqs")[: wl.half], wl.seqs[: wl.half])
    params = [eng.match_params(k) for k in wl.keys(eng, "queries")]
    fn = fn_of(ctx)
    lat, fre, res = timed_loop(fn, params, ctx.clock)
    return ctx, lat, fre, res


def op_match(eng, wl):
    ctx, lat, fre, res = _match_common(eng, wl, lambda ctx: ctx.cache.match_prefix)
    return lat, fre, {"matched_tokens": sum(r.device_prefix_len for r in res),
                      "tree_tokens": eng.tree_tokens(ctx)}


def op_match_indices(eng, wl):
    ctx, lat, fre, res = _match_common(eng, wl, eng.match_indices_fn)
    return lat, fre, {"matched_tokens": sum(len(r) if not hasattr(r, "device_indices")
                                            else len(r.device_indices) for r in res)}


def op_evict(eng, wl):
    ctx = eng.build(wl.kv_size, max_context_len=wl.max_len)
    for k, s in zip(wl.keys(eng, "seqs"), wl.seqs):
        v = ctx.alloc.alloc(len(s))
        if v is None:
            break
        ctx.cache.insert(eng.insert_params(k, v))
    total = eng.tree_tokens(ctx)
    n = max(1, min(max(wl.num_seqs // 5, 100), int(0.8 * total / EVICT_BATCH)))
    params = [eng.evict_params(EVICT_BATCH)] * n
    lat, fre, res = timed_loop(ctx.cache.evict, params, ctx.clock)
    return lat, fre, {"tree_tokens_before": total,
                      "evicted_tokens": sum(r.num_tokens_evicted for r in res)}


def _lock_unlock(eng, wl, populate, fn_of=None):
    """lock + unlock (``fn_of(ctx)``, default ``eng.lock_unlock_fn``) of random
    matched nodes of a tree ``populate`` filled; returns ``(ctx, nodes, lat, fre)``."""
    import random

    ctx = eng.build(wl.kv_size, max_context_len=wl.max_len)
    keys = wl.keys(eng, "seqs")[: wl.half]
    populate(eng, ctx, keys, wl.seqs[: wl.half])
    root = eng.root(ctx)
    nodes = []
    for k in keys:
        m = ctx.cache.match_prefix(eng.match_params(k))
        if m.last_device_node != root:
            nodes.append(m.last_device_node)
    rng = random.Random(99)
    n = min(2 * len(nodes), wl.num_seqs)
    items = [rng.choice(nodes) for _ in range(n + warmup_count(n))]
    lat, fre, _ = timed_loop((fn_of or eng.lock_unlock_fn)(ctx), items, ctx.clock)
    return ctx, nodes, lat, fre


def op_lock_unlock(eng, wl):
    ctx, _, lat, fre = _lock_unlock(eng, wl, E.populate)
    return lat, fre, {"protected_after": ctx.cache.protected_size()}


def op_match_queue(eng, wl):
    """A longest-prefix scheduling policy scores its whole waiting queue every step:
    one item = 256 queued requests' matches (flatradix: ``match_prefix_batch``,
    one call; SGLang: 256 ``match_prefix`` calls)."""
    ctx = eng.build(wl.kv_size, max_context_len=wl.max_len)
    E.populate(eng, ctx, wl.keys(eng, "seqs")[: wl.half], wl.seqs[: wl.half])
    params = [eng.match_params(k) for k in wl.keys(eng, "queries")]
    queues = [params[i:i + QUEUE] for i in range(0, len(params) - QUEUE + 1, QUEUE // 4)]
    lat, fre, res = timed_loop(eng.match_queue_fn(ctx), queues, ctx.clock)
    return lat, fre, {"matched_tokens": sum(m.device_prefix_len for q in res for m in q),
                      "tree_tokens": eng.tree_tokens(ctx)}


def op_lock_batch(eng, wl):
    """A batch admission: lock 64 matched nodes, then release them (flatradix:
    ``lock_batch`` + ``unlock_batch``; SGLang: 64 ``lock`` + 64 ``unlock``)."""
    import random

    ctx = eng.build(wl.kv_size, max_context_len=wl.max_len)
    keys = wl.keys(eng, "seqs")[: wl.half]
    E.populate(eng, ctx, keys, wl.seqs[: wl.half])
    root = eng.root(ctx)
    nodes = [m.last_device_node for m in (ctx.cache.match_prefix(eng.match_params(k)) for k in keys)
             if m.last_device_node != root]
    rng = random.Random(98)
    n = max(1, min(2 * len(nodes), wl.num_seqs) // LOCK_BATCH)
    items = [[rng.choice(nodes) for _ in range(LOCK_BATCH)] for _ in range(n + warmup_count(n))]
    lat, fre, _ = timed_loop(eng.lock_unlock_batch_fn(ctx), items, ctx.clock)
    return lat, fre, {"protected_after": ctx.cache.protected_size()}


def _op_release(eng, wl, rolling):
    ctx = eng.build(wl.kv_size, max_context_len=wl.max_len)

    def items():
        for prompt, output in wl.requests:
            yield eng.make_request(ctx, prompt, output, rolling=rolling)

    lat, fre, _ = timed_loop(eng.release_fn(ctx), items(), ctx.clock)
    return lat, fre, {"tree_tokens": eng.tree_tokens(ctx),
                      "available": ctx.alloc.available_size()}


def op_release(eng, wl):
    return _op_release(eng, wl, False)


def op_release_rolling(eng, wl):
    return _op_release(eng, wl, True)


OP_FUNCS = {"insert": op_insert, "match_prefix": op_match, "match+indices": op_match_indices,
            "evict": op_evict, "lock_unlock": op_lock_unlock, "release": op_release,
            "release_rolling": op_release_rolling, "match_queue256": op_match_queue,
            "lock_batch64": op_lock_batch}


# ------------------------------------------------------------------ SWA and Mamba operations
# The two-component modes share these; the engine prepares each insert
# (``insert_item``: SWA slots below the window freed / a state donated) and
# handles its result (``inserted``: a state the tree did not take goes back).
def _digest(rows):
    import zlib

    return zlib.crc32(repr(rows).encode())


def hybrid_op_insert(eng, wl):
    ctx = eng.build(wl.kv_size, max_context_len=wl.max_len)

    def items():
        for k, s in zip(wl.keys(eng, "seqs"), wl.seqs):
            p = eng.insert_item(ctx, k, s)
            if p is not None:
                yield p

    lat, fre, _ = timed_loop(ctx.cache.insert, items(), ctx.clock,
                             after=lambda p, r: eng.inserted(ctx, p, r))
    return lat, fre, {"tree_tokens": eng.tree_tokens(ctx), "available": eng.available(ctx)}


def hybrid_op_match(eng, wl):
    ctx = eng.build(wl.kv_size, max_context_len=wl.max_len)
    E.populate_hybrid(eng, ctx, wl.keys(eng, "seqs")[: wl.half], wl.seqs[: wl.half])
    params = [eng.match_params(k) for k in wl.keys(eng, "queries")]
    lat, fre, res = timed_loop(ctx.cache.match_prefix, params, ctx.clock)
    rows = [eng.match_result(m) for m in res]
    return lat, fre, {"matched_tokens": sum(r[0] for r in rows),
                      "full_kv_hit_tokens": sum(r[1] for r in rows),
                      "branching": sum(r[2] is not None for r in rows),
                      "matches_crc32": _digest(rows), "tree_tokens": eng.tree_tokens(ctx)}


def hybrid_op_match_indices(eng, wl):
    ctx = eng.build(wl.kv_size, max_context_len=wl.max_len)
    E.populate_hybrid(eng, ctx, wl.keys(eng, "seqs")[: wl.half], wl.seqs[: wl.half])
    params = [eng.match_params(k) for k in wl.keys(eng, "queries")]
    lat, fre, res = timed_loop(eng.match_indices_fn(ctx), params, ctx.clock)
    return lat, fre, {"matched_tokens": sum(len(r) if not hasattr(r, "device_indices")
                                            else len(r.device_indices) for r in res)}


def _hybrid_full_tree(eng, wl):
    """Sequences inserted until the (Full) KV pool is full (a Mamba state is
    still evicted for when the state pool is short)."""
    ctx = eng.build(wl.kv_size, max_context_len=wl.max_len)
    for k, s in zip(wl.keys(eng, "seqs"), wl.seqs):
        p = eng.insert_item(ctx, k, s, evict=False)
        if p is None:
            break
        eng.inserted(ctx, p, ctx.cache.insert(p))
    return ctx


def _hybrid_op_evict(eng, wl, second):
    """The ``_hybrid_full_tree``; per call EVICT_BATCH Full tokens, or (``second``)
    the second component's batch (SWA tokens / Mamba states), up to 80 % of what
    the tree holds."""
    ctx = _hybrid_full_tree(eng, wl)
    total = eng.tree_tokens(ctx)
    batch = (eng.second_batch or EVICT_BATCH) if second else EVICT_BATCH
    base = total[1] if second else total[0]
    n = max(1, min(max(wl.num_seqs // 5, 100), int(0.8 * base / batch)))
    params = [eng.evict_params(0, batch) if second else eng.evict_params(batch)] * n
    lat, fre, res = timed_loop(ctx.cache.evict, params, ctx.clock)
    full, other = (sum(x) for x in zip(*(eng.evicted(r) for r in res)))
    return lat, fre, {"tree_tokens_before": total, "evicted_tokens": full,
                      f"{eng.second}_evicted_{eng.second_unit}": other,
                      "tree_tokens_after": eng.tree_tokens(ctx), "available": eng.available(ctx)}


def hybrid_op_evict(eng, wl):
    return _hybrid_op_evict(eng, wl, False)


def hybrid_op_evict_second(eng, wl):
    return _hybrid_op_evict(eng, wl, True)


def hybrid_op_lock_unlock(eng, wl, fn_of=None):
    ctx, nodes, lat, fre = _lock_unlock(eng, wl, E.populate_hybrid, fn_of)
    return lat, fre, {"locked_nodes": len(nodes), "protected_after": eng.protected(ctx)}


def _swa_op_release(eng, wl, rolling):
    ctx = eng.build(wl.kv_size, max_context_len=wl.max_len)

    def items():
        for prompt, output in wl.requests:
            yield eng.make_request(ctx, prompt, output, rolling=rolling)

    lat, fre, _ = timed_loop(eng.release_fn(ctx), items(), ctx.clock)
    chk = {"tree_tokens": eng.tree_tokens(ctx), "available": eng.available(ctx)}
    if rolling:
        chk.update(admission_hit_tokens=sum(a[0] for a in ctx.admissions),
                   admissions_crc32=_digest(ctx.admissions))
    return lat, fre, chk


def swa_op_release(eng, wl):
    return _swa_op_release(eng, wl, False)


def swa_op_release_rolling(eng, wl):
    return _swa_op_release(eng, wl, True)


def swa_op_slide(eng, wl):
    """``evict_sliding_windows(req, committed - 1)`` of requests whose window never
    slid; each is released (untimed) before the next is prepared. The lambda is
    the same one frame for every engine."""
    ctx = eng.build(wl.kv_size, max_context_len=wl.max_len)
    release = eng.release_fn(ctx)
    slide = ctx.cache.evict_sliding_windows

    def items():
        for prompt, output in wl.requests:
            req = eng.make_request(ctx, prompt, output, slide=False)
            yield req, len(prompt) + len(output) - 2
            release(req)

    lat, fre, _ = timed_loop(lambda item: slide(item[0], item[1]), items(), ctx.clock)
    return lat, fre, {"tree_tokens": eng.tree_tokens(ctx), "available": eng.available(ctx)}


HYBRID_OP_FUNCS = {"insert": hybrid_op_insert, "match_prefix": hybrid_op_match,
                   "match+indices": hybrid_op_match_indices, "evict": hybrid_op_evict,
                   "lock_unlock": hybrid_op_lock_unlock}
SWA_OP_FUNCS = dict(HYBRID_OP_FUNCS, evict_swa=hybrid_op_evict_second,
                    release=swa_op_release, release_rolling=swa_op_release_rolling,
                    slide=swa_op_slide)
MAMBA_OP_FUNCS = dict(HYBRID_OP_FUNCS, evict_mamba=hybrid_op_evict_second,
                      lock_unlock_decode=lambda eng, wl: hybrid_op_lock_unlock(
                          eng, wl, eng.lock_decode_fn))


# ------------------------------------------------------------------ driver
def machine_info():
    info = {"python": platform.python_version(), "platform": platform.platform(),
            "cpus": os.cpu_count(), "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "loadavg_start": os.getloadavg()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import flatradix
        import numba
        import numpy

        info["flatradix"] = flatradix.__file__
        info["numba"], info["numpy"] = numba.__version__, numpy.__version__
        src = os.path.dirname(os.path.dirname(os.path.abspath(flatradix.__file__)))
        info["commit"] = subprocess.run(["git", "-C", src, "describe", "--always", "--dirty"],
                                        capture_output=True, text=True).stdout.strip() or "?"
    except Exception:
        pass
    try:
        import torch

        info["torch"] = torch.__version__
    except Exception:
        pass
    return info


def run(engine_names, ops, rounds, wl, verbose=True, swa=None, mamba=None):
    """``swa``: ``(window, ratio)`` for the SWA mode; ``mamba``: ``(chunk, states,
    evict batch)`` for the Mamba mode (states None: the KV pool / 400); else None."""
    if swa:
        engines = E.swa_engines(engine_names, *swa)
        funcs = SWA_OP_FUNCS
    elif mamba:
        engines = E.mamba_engines(engine_names, *mamba)
        funcs = MAMBA_OP_FUNCS
    else:
        engines = E.make_engines(engine_names)
        funcs = OP_FUNCS
    # Warm-up: compile flatradix's kernels and import-load SGLang's paths, untimed.
    small = Workload(200, 50_000)
    for eng in engines:
        for op in ops:
            funcs[op](eng, small)
    results = {e.name: {op: [] for op in ops} for e in engines}
    checks = {e.name: {op: [] for op in ops} for e in engines}
    for r in range(rounds):
        order = engines[r % len(engines):] + engines[: r % len(engines)]
        for op in ops:
            for eng in order:
                gc.collect()
                lat, fre, chk = funcs[op](eng, wl)
                s = summarize(lat, fre, warmup_count(len(lat)))
                results[eng.name][op].append(s)
                checks[eng.name][op].append(chk)
                if verbose:
                    print(f"  round {r + 1} {op:18s} {eng.name:20s} tree {s['tree_ops_s']:>11,.0f} ops/s"
                          f"  e2e {s['e2e_ops_s']:>11,.0f} ops/s  p50 {s['tree_p50_us']:8.1f} us"
                          f"  free {s['free_us_per_op']:7.1f} us/op  {chk}", flush=True)
    cores = {e.name: e.core for e in engines}
    return results, checks, cores


def medians(results):
    out = {}
    for eng, ops in results.items():
        out[eng] = {}
        for op, rounds in ops.items():
            rounds = [x for x in rounds if x]
            if rounds:
                out[eng][op] = {k: statistics.median(x[k] for x in rounds) for k in rounds[0]}
    return out


def fmt(x, unit=""):
    if x is None:
        return "–"
    if x >= 100:
        return f"{x:,.0f}{unit}"
    return f"{x:.1f}{unit}" if x >= 10 else f"{x:.2f}{unit}"


def tables(med, ops):
    engs = list(med)
    lines = []
    lines.append("Tree-only (allocator free time subtracted): ops/s, p50 / p99 µs")
    lines.append("")
    hdr = "| op | " + " | ".join(engs)
    ratios = []
    if "sglang-rust" in med:
        ratios.append(("flatradix", "sglang-rust"))
    if "sglang-python" in med:
        ratios.append(("flatradix", "sglang-python"))
    if "sglang-flatradix" in med and "sglang-rust" in med:  # the TreeCore plug-in
        ratios.append(("sglang-flatradix", "sglang-rust"))
    hdr += "".join(f" | {a} / {b}" for a, b in ratios) + " |"
    lines.append(hdr)
    lines.append("|" + "---|" * (1 + len(engs) + len(ratios)))
    for op in ops:
        row = [op]
        for e in engs:
            s = med[e].get(op)
            row.append("–" if s is None else
                       f"{fmt(s['tree_ops_s'])} ({fmt(s['tree_p50_us'])} / {fmt(s['tree_p99_us'])})")
        for a, b in ratios:
            sa, sb = med.get(a, {}).get(op), med.get(b, {}).get(op)
            row.append("–" if not (sa and sb) else f"{sa['tree_ops_s'] / sb['tree_ops_s']:.1f}x")
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.append("End to end (allocator free included): ops/s, p50 / p99 µs; allocator free µs per op")
    lines.append("")
    hdr = "| op | " + " | ".join(engs)
    e2e = [a for a in ("flatradix", "sglang-flatradix") if "sglang-rust" in med
           and (a == "flatradix" or a in med)]
    hdr += "".join(f" | {a} / sglang-rust" for a in e2e)
    lines.append(hdr + " |")
    lines.append("|" + "---|" * (1 + len(engs) + len(e2e)))
    for op in ops:
        row = [op]
        for e in engs:
            s = med[e].get(op)
            row.append("–" if s is None else
                       f"{fmt(s['e2e_ops_s'])} ({fmt(s['e2e_p50_us'])} / {fmt(s['e2e_p99_us'])}); "
                       f"free {fmt(s['free_us_per_op'])}")
        for a in e2e:
            sa, sb = med.get(a, {}).get(op), med["sglang-rust"].get(op)
            row.append("–" if not (sa and sb) else f"{sa['e2e_ops_s'] / sb['e2e_ops_s']:.1f}x")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def targets(med, ops):
    """The issue's targets that this run measures (others: see README)."""
    fr, rust = med.get("flatradix"), med.get("sglang-rust")
    if not (fr and rust):
        return []
    out = []
    for op in ops:
        if op == "match+indices" or op not in fr or op not in rust:
            continue
        ratio = fr[op]["tree_ops_s"] / rust[op]["tree_ops_s"]
        goal = 10 if op == "match_queue256" else 5  # issue 14: a queue in one call >= 10x
        out.append({"target": f"{op}: tree-only >= {goal}x Rust core", "ratio": ratio,
                    "met": ratio >= goal})
    if "release" in fr and "release" in rust:
        ratio = fr["release"]["e2e_ops_s"] / rust["release"]["e2e_ops_s"]
        out.append({"target": "release e2e (own allocator) >= 10x Rust core e2e (SGLang allocator)",
                    "ratio": ratio, "met": ratio >= 10})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 1,000 sequences, 100k-slot pool, 1 round (not the reported workload)")
    ap.add_argument("--num-seqs", type=int, default=5000)
    ap.add_argument("--kv-size", type=int, default=500_000)
    ap.add_argument("--ops", nargs="+", default=None,
                    choices=sorted(set(OPS) | set(SWA_OPS) | set(MAMBA_OPS)),
                    help=f"default: {' '.join(OPS)}; SWA mode: {' '.join(SWA_OPS)}; "
                         f"Mamba mode: {' '.join(MAMBA_OPS)}")
    ap.add_argument("--swa-window", type=int, default=None, metavar="W",
                    help="the SWA mode: every engine with the (FULL, SWA) components and "
                         "window W tokens (module docstring)")
    ap.add_argument("--swa-ratio", type=float, default=0.8, metavar="R",
                    help="SWA mode: SWA pool = R x --kv-size slots (default 0.8, SGLang's "
                         "swa_full_tokens_ratio default)")
    ap.add_argument("--mamba", action="store_true",
                    help="the Mamba mode: every engine with the (FULL, MAMBA) components at "
                         "page 1, no extra buffer, each insert donating a state slot "
                         "(module docstring); tree operations only, not with --swa-window")
    ap.add_argument("--mamba-chunk", type=int, default=64, metavar="C",
                    help="Mamba mode: mamba_cache_chunk_size (default 64, SGLang's FLA chunk): "
                         "the grid of the matches' mamba_branching_seqlen")
    ap.add_argument("--mamba-states", type=int, default=None, metavar="N",
                    help="Mamba mode: state slots in the request pool's mamba_allocator "
                         "(default --kv-size / 400: 1,250 at the default pool, fewer than the "
                         "sequences, so inserts evict states and matches stop at tombstones)")
    ap.add_argument("--mamba-evict", type=int, default=8, metavar="K",
                    help="Mamba mode: evict_mamba's EvictParams(num_tokens=0, mamba_num=K) "
                         "per call (default 8)")
    ap.add_argument("--engines", nargs="+", default=None,
                    help="default: flatradix, plus flatradix+sgl_alloc sglang-rust sglang-python "
                         "when SGLang imports; sglang-flatradix: SGLang's controller over "
                         "flatradix's TreeCore plug-in (flatradix installed in SGLang's venv)")
    ap.add_argument("--sglang-python", default=None,
                    help="interpreter of the SGLang oracle venv: re-run this script under it")
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--torch-threads", type=int, default=1,
                    help="torch intra-op threads (SGLang's allocator free is a torch.cat; 1 is the "
                         "steadier and faster setting on a 2-core box; 0 keeps torch's default)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)

    if args.sglang_python:
        E.reexec_under(args.sglang_python, __file__, ROOT)

    if args.quick:
        args.num_seqs, args.kv_size, args.rounds = 1000, 100_000, 1
    swa = mamba = states = None
    if args.mamba:
        if args.swa_window is not None:
            ap.error("--mamba with --swa-window: (FULL, SWA, MAMBA) is not a mode of this "
                     "benchmark")
        for flag, v in (("--mamba-chunk", args.mamba_chunk), ("--mamba-evict", args.mamba_evict),
                        ("--mamba-states", 1 if args.mamba_states is None else args.mamba_states)):
            if v < 1:
                ap.error(f"{flag} must be >= 1, got {v}")
        mamba = (args.mamba_chunk, args.mamba_states, args.mamba_evict)
        bad = [o for o in (args.ops or []) if o not in MAMBA_OPS]
        if bad:
            ap.error(f"--ops {' '.join(bad)}: not a Mamba-mode operation ({' '.join(MAMBA_OPS)})")
    elif args.swa_window is not None:
        if args.swa_window < 1:
            ap.error(f"--swa-window must be >= 1, got {args.swa_window}")
        if not 0 < args.swa_ratio <= 1:
            ap.error(f"--swa-ratio must be in (0, 1], got {args.swa_ratio}")
        swa = (args.swa_window, args.swa_ratio)
        bad = [o for o in (args.ops or []) if o not in SWA_OPS]
        if bad:
            ap.error(f"--ops {' '.join(bad)}: not an SWA-mode operation ({' '.join(SWA_OPS)})")
    elif args.ops and any(o not in OPS for o in args.ops):
        ap.error(f"--ops {' '.join(o for o in args.ops if o not in OPS)} needs --swa-window "
                 "or --mamba")
    args.ops = args.ops or list(SWA_OPS if swa else MAMBA_OPS if mamba else OPS)
    have_sglang = E.sglang_available()
    names = args.engines or (["flatradix", "flatradix+sgl_alloc", "sglang-rust", "sglang-python"]
                             if have_sglang else ["flatradix"])
    if not have_sglang and any(n != "flatradix" for n in names):
        sys.exit("SGLang is not importable here: run under the oracle venv's python or pass "
                 f"--sglang-python {E.SGLANG_VENV_DEFAULT}/bin/python")
    if not have_sglang:
        print("SGLang not importable: flatradix only (see --sglang-python)")

    if args.torch_threads:
        try:
            import torch

            torch.set_num_threads(args.torch_threads)
        except ImportError:
            pass
    info = machine_info()
    info["torch_threads"] = args.torch_threads
    wl = Workload(args.num_seqs, args.kv_size)
    print(f"workload: {len(wl.seqs)} sequences, mean {wl.mean_len:.0f} tokens, page 1, "
          f"{args.kv_size:,}-slot KV pool; {args.rounds} round(s); engines {', '.join(names)}")
    if swa:
        print(f"SWA mode: components (FULL, SWA), window {swa[0]:,} tokens, SWA pool "
              f"{int(args.kv_size * swa[1]):,} slots ({swa[1]:g} x)")
    if mamba:
        states = args.mamba_states or E.default_mamba_states(args.kv_size)
        print(f"Mamba mode: components (FULL, MAMBA), page 1, no extra buffer, chunk "
              f"{mamba[0]}, {states:,} state slots, evict_mamba {mamba[2]} states a call")
    print(f"machine: {info.get('cpu', '?')}, {info['cpus']} CPUs; python {info['python']}; "
          f"flatradix {info.get('commit', '?')} ({info.get('flatradix', '?')})")
    results, checks, cores = run(names, args.ops, args.rounds, wl, verbose=not args.quiet,
                                 swa=swa, mamba=mamba)
    med = medians(results)
    info["loadavg_end"] = os.getloadavg()
    print(f"\nload average at start {info['loadavg_start'][0]:.2f}, at end {info['loadavg_end'][0]:.2f} "
          f"({info['cpus']} CPUs)")
    ref_name, ref = next(iter(checks.items()))
    same = all(c == ref for c in checks.values())
    print("work check: every engine " + ("did the same work (tree sizes, matched and evicted tokens "
                                         "identical)" if same else "DID NOT do the same work: see "
                                         "'checks' in the JSON"))
    if not same:
        for name, c in checks.items():
            for op in args.ops:
                if c[op] != ref[op]:
                    print(f"  {op}: {name} {c[op][0]} vs {ref_name} {ref[op][0]}")
    print()
    print(tables(med, args.ops))
    tg = targets(med, args.ops)
    if tg:
        print()
        for t in tg:
            print(f"  [{'met' if t['met'] else 'NOT met'}] {t['target']}: {t['ratio']:.1f}x")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"machine": info, "workload": {"num_seqs": args.num_seqs, "kv_size": args.kv_size,
                                                     "mean_len": wl.mean_len, "rounds": args.rounds,
                                                     "quick": args.quick,
                                                     "swa_window": swa and swa[0],
                                                     "swa_ratio": swa and swa[1],
                                                     "mamba_chunk": mamba and mamba[0],
                                                     "mamba_states": states,
                                                     "mamba_evict": mamba and mamba[2]},
                       "cores": cores, "median": med, "rounds": results, "checks": checks,
                       "targets": tg}, f, indent=1)
        print(f"\nwrote {args.json_out}")


if __name__ == "__main__":
    main()
