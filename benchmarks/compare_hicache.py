#!/usr/bin/env python
"""flatradix's host tier (HiCache) against SGLang 0.5.23's own, step by step.

    export SGLANG_USE_CPU_ENGINE=1 SGLANG_RUST_BUILD_MODE=never OMP_NUM_THREADS=1 \\
           PYTHONPATH=$PWD:$VENV/peer_stubs                # from the repository root
    $VENV/bin/python benchmarks/compare_hicache.py --json-out /tmp/compare_hicache.json
    options: --rounds 5  --quick  --pages 1 16  --num-seqs 3000  --chunk-len 96
             --policy write_through|write_through_selective  --engines ...  --no-profile

``$VENV`` is the SGLang oracle venv (``../shared/tools/setup_sglang_oracle.sh``,
default ``~/.cache/flatradix-sglang-oracle``); ``--sglang-python`` re-executes
this script under it, as ``compare_sglang.py`` does.

Engines: ``flatradix`` (its ``UnifiedRadixCache`` + ``init_hicache``, own numpy
``TokenToKVPoolAllocator`` and ``HostKVPool``), ``sglang-python`` and
``sglang-rust`` (SGLang's ``UnifiedRadixCache`` on its Python / Rust tree core
with ``init_hicache``: its ``HybridCacheController``, ``MHATokenToKVPoolHost``
(layout ``page_first_direct``, io ``direct``), a 1-layer CPU ``MHATokenToKVPool``
and its own allocator). Full attention, LRU, no KV events, write policy
``--policy``.

**No bytes move on either side.** SGLang's two CUDA-only steps are doubles (as in
``tests/oracle/hicache_peer.py``): the host buffer is not pinned, and the
controller's ``l2_transfer_engine`` is a ``NullL2Engine`` that copies nothing and
returns completion events that are complete at once (it records nothing either,
unlike the oracle's). flatradix is built without a ``transfer`` callable, so it
moves no bytes. Both sides therefore do the tree work plus their bookkeeping
(host-slot allocation, queues, acks, locks, the device allocator) only.

Workload: ``workloads.prefix_sharing_sequences(--num-seqs, --chunk-len)``
(default 3,000 requests of ~375 tokens, ~146k distinct tree tokens), each cut to
a page multiple; a device pool and a host pool of ``--pool`` slots each (default
262,144: everything fits, so no step has to make room first). Per engine, page
size and round, one fresh cache goes through four phases, every call timed on
its own (``perf_counter``), as a scheduler drives them:

* ``backup``     per request: ``insert(InsertParams(key, fresh slots))`` (the new
                 leaf gets its first hit and, under write_through, its backup is
                 committed: host slots, pending mark, device lock, queued),
                 ``flush_pending_backups()`` (the scheduler's end-of-batch submit),
                 ``writing_check()`` (the next step's ack delivery). The whole step
                 is timed, and each part.
* ``demote``     ``evict(EvictParams(num_tokens=1))``: the LRU device leaf, backed
                 up, is demoted (device slots freed, host copy kept): one node per
                 call, for up to ``--num-seqs`` / 2 calls; then
* ``demote_batch`` ``evict(EvictParams(num_tokens=2048))`` until the device
                 is empty: several nodes per call (reported per call; the nodes a
                 call demotes are counted on flatradix's side, and the work check
                 makes sure every engine freed the same tokens in every call).
* ``load_back``  every request, shuffled, against the all-host tree: the
                 ``PrefillAdder``'s sequence: ``match_prefix``; ``lock(last_device_node)``;
                 when ``host_hit_length > 0``: ``inc_host_lock_ref(best_match_node)``,
                 ``lock(best_match_node)``, ``init_load_back(InitLoadBackParams(
                 best_match_node, host_hit_length, req=req))``, ``unlock``,
                 ``dec_host_lock_ref``; ``unlock``; then ``ready_to_load_host_cache()``
                 (the batch's submit) and ``loading_check()`` (the next step's ack
                 delivery). Timed per request, and each part (match, the three
                 pins, init_load_back, the three unpins, ready, loading_check);
                 only requests with a host hit are reported (the others are a
                 plain match); loads shorter than ``load_back_threshold`` (10)
                 are declined by both.
* ``host_evict`` after an untimed ``evict`` of every device copy (all host-only):
                 ``evict_host(1)``: the LRU host leaf is deleted, one node per call,
                 for up to ``--num-seqs`` / 2 calls; then
* ``host_evict_batch`` ``evict_host(2048)`` until the host is empty.

Engines alternate scenario by scenario in every round (order rotated each
round); figures are medians over rounds, with the range of the p50 over rounds;
a ratio is SGLang's p50 / flatradix's p50 of the same round ("flatradix is x
times faster"), median and range over rounds. The first ``min(20, n // 10)``
samples of each phase are dropped (warm-up); before the rounds every engine runs
the whole scenario once on a small workload. ``free`` is the time inside the
device allocator's ``free`` family and the host pool's ``free`` (SGLang's are a
``torch.cat`` onto a free list, O(pool) a call on the CPU; flatradix's numpy):
the "ex allocator free" table subtracts it (tree work + bookkeeping, the
"tree-only" of ``compare_sglang.py``), the "end to end" table keeps it.

The profile (on by default, ``--no-profile``) then runs flatradix's scenario
twice more with every numba kernel the façade calls wrapped in a timer: kernel
calls per step, time inside kernels (numba dispatch included), time in the
action executor (``executor.execute``: frees, host-pool returns, events), and
the rest, the Python façade, per public call; plus the bare numba dispatch cost
of a no-op kernel with the tree arrays' signature. The machine is a shared
2-core VM: load averages are printed and stored.
"""

import argparse
import datetime
import gc
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import zlib
from array import array
from time import perf_counter
from types import SimpleNamespace

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

import numpy as np

PHASES = ("backup", "demote", "demote_batch", "load_back", "host_evict", "host_evict_batch")
PARTS = {"backup": ("insert", "flush", "writing_check"),
         # pins: lock(last_device_node), inc_host_lock_ref(best), lock(best);
         # unpins: unlock, dec_host_lock_ref, unlock
         "load_back": ("match", "pins", "init_load_back", "unpins", "ready", "loading_check")}
#: Public cache calls a step makes (the profile divides the façade time by them).
FACADE_CALLS = {"backup": 3, "demote": 1, "demote_batch": 1, "host_evict": 1,
                "host_evict_batch": 1,
                # match, lock, inc_host_lock_ref, lock, init_load_back, unlock,
                # dec_host_lock_ref, unlock, ready_to_load_host_cache, loading_check
                "load_back": 10,
                "load_back_nohit": 5}  # match, lock, unlock, ready, loading_check
BATCH_TOKENS = 2048  # a page multiple at every page size benchmarked


def warmup_count(n):
    return min(20, n // 10)


def crc(rows):
    return zlib.crc32(repr(rows).encode())


# ------------------------------------------------------------------ workload
class Workload:
    def __init__(self, num_seqs, chunk_len, page, pool, seed=5):
        raw = W.prefix_sharing_sequences(num_seqs, chunk_len)
        self.seqs = [s[: len(s) // page * page] for s in raw]
        self.seqs = [s for s in self.seqs if s]
        self.page = page
        self.pool = pool
        self.num_seqs = len(self.seqs)
        self.mean_len = statistics.mean(len(s) for s in self.seqs)
        order = list(range(self.num_seqs))
        random.Random(seed).shuffle(order)
        self.load_order = order
        self._keys = {}

    def keys(self, eng):
        if eng.name not in self._keys:
            self._keys[eng.name] = [eng.key(s) for s in self.seqs]
        return self._keys[eng.name]


# ------------------------------------------------------------------ clocks
class FreeClock(E.FreeClock):
    """Seconds inside the device allocator's frees (and ``add``-ed host pool frees)."""

    NAMES = ("free", "free_segment", "free_page_ids")


# ------------------------------------------------------------------ engines
class FlatradixHi:
    name = "flatradix"
    core = "flatradix"

    def __init__(self):
        import flatradix

        self.fr = flatradix

    def build(self, page, pool, host, policy):
        fr = self.fr
        alloc = fr.TokenToKVPoolAllocator(pool, page_size=page, index_kind="numpy")
        cache = fr.UnifiedRadixCache(page_size=page, token_to_kv_pool_allocator=alloc)
        cache.init_hicache(host_size=host, hicache_write_policy=policy)
        clock = FreeClock(alloc, FreeClock.NAMES)
        clock.add(cache.mem_pool_host, ("free",))
        return SimpleNamespace(cache=cache, alloc=alloc, host=cache.mem_pool_host, clock=clock)

    def key(self, tokens):
        return self.fr.RadixKey(np.asarray(tokens, dtype=np.int64))

    def insert_params(self, key, value):
        return self.fr.InsertParams(key=key, value=value)

    def match_params(self, key):
        return self.fr.MatchPrefixParams(key=key)

    def evict_params(self, n):
        return self.fr.EvictParams(num_tokens=n)

    def load_params(self, best, hit, req):
        return self.fr.InitLoadBackParams(best_match_node=best, host_hit_length=hit, req=req)

    def sizes(self, ctx):
        c = ctx.cache
        return {"device_evictable": int(c.evictable_size()),
                "device_protected": int(c.protected_size()),
                "host_used": ctx.host.size - ctx.host.available_size()}

    def live_nodes(self, ctx):
        from flatradix.kernels import layout as L

        return int(ctx.cache._engine.st.meta[L.M_NLIVE])

    def device_nodes(self, ctx):
        """Nodes holding a Full device value (untimed; for per-node figures)."""
        from flatradix import inspection
        from flatradix.kernels import layout as L

        nodes = ctx.cache._engine.st.nodes
        return sum(1 for s, _ in inspection.dfs(nodes)
                   if nodes[s, L.FLAGS] & L.F_HAS_FULL_DEV) - 1  # the root


class NullEvent:
    """A completion event that is complete at once (duck-types torch.cuda.Event)."""

    def query(self):
        return True

    def synchronize(self):
        pass

    def record(self, *a, **k):
        pass

    def wait(self, *a, **k):
        pass

    def elapsed_time(self, other):
        return 0.0


class NullL2Engine:
    """Stands where SGLang's ``L2TransferEngine`` stands: copies nothing,
    records nothing, every completion is complete at once."""

    def __init__(self, TransferCompletion):
        import torch

        self._TC = TransferCompletion
        self._ev = NullEvent()
        self.device_to_host_stream = torch.cpu.Stream()
        self.host_to_device_stream = torch.cpu.Stream()

    def submit_device_to_host(self, transfers):
        return self._TC(self._ev, self._ev, False)

    def submit_host_to_device(self, transfers, *, transfer_layer_id_max, start_event=None,
                              on_layer_done=None):
        if on_layer_done is not None:
            for layer_id in range(transfer_layer_id_max):
                on_layer_done(layer_id)
        return self._TC(self._ev, self._ev, False)


_SGL = None


def _sgl():
    """Import SGLang once, publish server args, skip host-buffer pinning."""
    global _SGL
    if _SGL is not None:
        return _SGL
    E.prepare_sglang_env()
    import torch

    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    server_args = ServerArgs(model_path="dummy")
    set_global_server_args_for_scheduler(server_args)
    import sglang.srt.mem_cache.pool_host.common as pool_host_common

    pool_host_common._cuda_host_register = lambda *a, **k: None  # CPU box: nothing to pin
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import (
        EvictParams, InitLoadBackParams, InsertParams, MatchPrefixParams,
    )
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.l2_transfer import TransferCompletion
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
    from sglang.srt.runtime_context import get_context

    _SGL = SimpleNamespace(**locals())
    return _SGL


class SGLangHi:
    def __init__(self, backend):
        self.S = _sgl()
        import torch

        self.torch = torch
        self.backend = backend
        self.name = f"sglang-{backend}"
        self.core = None

    def build(self, page, pool, host, policy):
        S, torch, P = self.S, self.torch, page
        # SGLang sizes the host pool (int(device * ratio) // P + 1) * P: pick the
        # ratio that lands on ``host`` exactly.
        ratio = (host - P + 0.5) / pool
        S.get_context().override(
            "flatradix-compare-hicache", hicache_write_policy=policy,
            hicache_io_backend="direct", hicache_mem_layout="page_first_direct",
            hicache_ratio=ratio, hicache_size=0, hicache_storage_backend=None,
            hicache_host_memory_mode="cache")
        kv = S.MHATokenToKVPool(size=pool, page_size=P, dtype=torch.float16, head_num=1,
                                head_dim=8, layer_num=1, device="cpu", enable_memory_saver=False)
        if P == 1:
            alloc = S.TokenToKVPoolAllocator(pool, torch.float16, "cpu", kv, False)
        else:
            alloc = S.PagedTokenToKVPoolAllocator(pool, P, torch.float16, "cpu", kv, False)
        rtp = S.ReqToTokenPool(size=4, max_context_len=8192, device="cpu",
                               enable_memory_saver=False)
        params = S.CacheInitParams(
            disable=False, req_to_token_pool=rtp, token_to_kv_pool_allocator=alloc,
            page_size=P, eviction_policy="lru", enable_kv_cache_events=False,
            tree_components=(S.ComponentType.FULL,), tree_core_backend=self.backend)
        cache = S.UnifiedRadixCache(params)
        want = {"python": "UnifiedTreeCore", "rust": "RustUnifiedTreeCore"}[self.backend]
        core = type(cache.tree_core).__name__
        if core != want:
            raise RuntimeError(f"asked for the {self.backend} tree core, got {core}")
        self.core = core
        cache.init_hicache(S.server_args, params)
        cc = cache.cache_controller
        cc.l2_transfer_engine = NullL2Engine(S.TransferCompletion)
        host_pool = cc.mem_pool_host.anchor_entry.host_pool
        if host_pool.size != host:
            raise RuntimeError(f"host pool has {host_pool.size} slots, wanted {host}")
        if cache.write_through_threshold != (1 if policy == "write_through" else 2):
            raise RuntimeError(f"write_through_threshold {cache.write_through_threshold}")
        clock = FreeClock(alloc, FreeClock.NAMES)
        clock.add(host_pool, ("free",))
        return SimpleNamespace(cache=cache, alloc=alloc, host=cc.mem_pool_host,
                               host_size=host_pool.size, clock=clock)

    def key(self, tokens):
        return self.S.RadixKey(array("q", tokens), None)

    def insert_params(self, key, value):
        return self.S.InsertParams(key=key, value=value)

    def match_params(self, key):
        return self.S.MatchPrefixParams(key=key)

    def evict_params(self, n):
        return self.S.EvictParams(num_tokens=n)

    def load_params(self, best, hit, req):
        return self.S.InitLoadBackParams(best_match_node=best, host_hit_length=hit, req=req)

    def sizes(self, ctx):
        c = ctx.cache
        return {"device_evictable": int(c.full_evictable_size()),
                "device_protected": int(c.full_protected_size()),
                "host_used": ctx.host_size - ctx.host.available_size()}


def make_req(i):
    """The request fields the adder sets from a match and ``init_load_back`` reads."""
    return SimpleNamespace(rid=f"b{i}", last_node=None, best_match_node=None,
                           host_hit_length=0, swa_host_hit_length=0, mamba_host_hit_length=0,
                           auxiliary_swa_host_hit_length=0,
                           kv=SimpleNamespace(mamba_pool_idx=None, holds_mamba=False))


def make_engines(names):
    out = []
    for n in names:
        if n == "flatradix":
            out.append(FlatradixHi())
        elif n in ("sglang-python", "sglang-rust"):
            out.append(SGLangHi(n.split("-", 1)[1]))
        else:
            raise ValueError(f"unknown engine {n!r}")
    return out


# ------------------------------------------------------------------ the scenario
def scenario(eng, wl, policy, count_nodes=False):
    """One fresh cache through the four phases. Returns {phase: (samples, check)}
    where samples is a list of (total seconds, free seconds, parts tuple or None)
    and check what the work check compares. ``count_nodes`` (flatradix only; an
    untimed counting run): also count the nodes each call demotes / deletes,
    with a Python walk of the tree between calls (which would disturb the
    timings: the timed runs never count)."""
    ctx = eng.build(wl.page, wl.pool, wl.pool, policy)
    cache, alloc, clock = ctx.cache, ctx.alloc, ctx.clock
    keys = wl.keys(eng)
    out = {}
    pc = perf_counter
    is_flat = count_nodes and isinstance(eng, FlatradixHi)

    # ---- backup: insert + flush_pending_backups + writing_check
    insert, flush, wcheck = cache.insert, cache.flush_pending_backups, cache.writing_check
    samples, prefix = [], []
    for k, s in zip(keys, wl.seqs):
        v = alloc.alloc(len(s))
        if v is None:
            raise MemoryError("device pool too small for the workload (raise --pool)")
        p = eng.insert_params(k, v)
        f0 = clock.seconds
        t0 = pc()
        r = insert(p)
        t1 = pc()
        flush()
        t2 = pc()
        wcheck()
        t3 = pc()
        samples.append((t3 - t0, clock.seconds - f0, (t1 - t0, t2 - t1, t3 - t2)))
        prefix.append(int(r.prefix_len))
    sz = eng.sizes(ctx)
    out["backup"] = (samples, dict(sz, prefix_crc32=crc(prefix), matched=sum(prefix)))

    # ---- demote: evict(1) per call (one backed-up leaf), then batches
    evict = cache.evict
    one = eng.evict_params(1)
    samples, toks = [], []
    dev_nodes0 = eng.device_nodes(ctx) if is_flat else None
    for _ in range(max(1, wl.num_seqs // 2)):
        f0 = clock.seconds
        t0 = pc()
        r = evict(one)
        t1 = pc()
        n = int(r.num_tokens_evicted)
        if n == 0:
            break
        samples.append((t1 - t0, clock.seconds - f0, None))
        toks.append(n)
    chk = {"calls": len(toks), "tokens": sum(toks), "per_call_crc32": crc(toks)}
    if is_flat:
        chk["nodes"] = dev_nodes0 - eng.device_nodes(ctx)
    out["demote"] = (samples, dict(chk, **eng.sizes(ctx)))

    batch = eng.evict_params(BATCH_TOKENS)
    samples, toks, nodes = [], [], []
    while True:
        d0 = eng.device_nodes(ctx) if is_flat else None
        f0 = clock.seconds
        t0 = pc()
        r = evict(batch)
        t1 = pc()
        n = int(r.num_tokens_evicted)
        if n == 0:
            break
        samples.append((t1 - t0, clock.seconds - f0, None))
        toks.append(n)
        if is_flat:
            nodes.append(d0 - eng.device_nodes(ctx))
    chk = {"calls": len(toks), "tokens": sum(toks), "per_call_crc32": crc(toks)}
    if is_flat:
        chk["nodes"] = sum(nodes)
        chk["nodes_per_call"] = nodes
    out["demote_batch"] = (samples, dict(chk, **eng.sizes(ctx)))

    # ---- load-back: the adder's sequence per request
    match, lock, unlock = cache.match_prefix, cache.lock, cache.unlock
    hlock, hunlock = cache.inc_host_lock_ref, cache.dec_host_lock_ref
    init_load_back = cache.init_load_back
    ready, lcheck = cache.ready_to_load_host_cache, cache.loading_check
    mparams = [eng.match_params(k) for k in keys]
    samples, rows = [], []
    for j, i in enumerate(wl.load_order):
        req = make_req(j)
        mp = mparams[i]
        f0 = clock.seconds
        t0 = pc()
        m = match(mp)
        t1 = pc()
        req.last_node = m.last_device_node
        req.best_match_node = best = m.best_match_node
        req.host_hit_length = hit = m.host_hit_length
        lk = lock(req.last_node)
        loaded = 0
        if hit > 0:
            hl = hlock(best).to_dec_params()
            lk2 = lock(best)
            t2 = pc()
            loaded, req.last_node = init_load_back(eng.load_params(best, hit, req))
            t3 = pc()
            unlock(lk2)
            hunlock(best, hl)
        else:
            t2 = t3 = pc()
        unlock(lk)
        t4 = pc()
        ready()
        t5 = pc()
        lcheck()
        t6 = pc()
        if hit > 0:
            samples.append((t6 - t0, clock.seconds - f0,
                            (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5)))
        rows.append((int(m.device_prefix_len), int(hit), int(loaded)))
    out["load_back"] = (samples, dict(
        eng.sizes(ctx), requests=len(rows), host_hits=sum(1 for r in rows if r[1]),
        loads=sum(1 for r in rows if r[2]), loaded_tokens=sum(r[2] for r in rows),
        device_hit_tokens=sum(r[0] for r in rows), rows_crc32=crc(rows)))

    # ---- host eviction: everything host-only first (untimed), then evict_host
    evict(eng.evict_params(wl.pool * 2))
    evict_host = cache.evict_host
    for phase, n_ask, cap in (("host_evict", 1, max(1, wl.num_seqs // 2)),
                              ("host_evict_batch", BATCH_TOKENS, None)):
        samples, toks, nodes = [], [], []
        while cap is None or len(toks) < cap:
            l0 = eng.live_nodes(ctx) if is_flat else None
            f0 = clock.seconds
            t0 = pc()
            n = evict_host(n_ask)
            t1 = pc()
            if n == 0:
                break
            samples.append((t1 - t0, clock.seconds - f0, None))
            toks.append(int(n))
            if is_flat:
                nodes.append(l0 - eng.live_nodes(ctx))
        chk = {"calls": len(toks), "tokens": sum(toks), "per_call_crc32": crc(toks)}
        if is_flat:
            chk["nodes"] = sum(nodes)
            if cap is None:
                chk["nodes_per_call"] = nodes
        out[phase] = (samples, dict(chk, **eng.sizes(ctx)))
    return out


def summarize(samples, warm, nodes_per_call=None):
    """p50 / p99 / mean of the whole call ("e2e") and of the call less the time
    inside the allocators' frees ("ex"), the parts' p50, and with
    ``nodes_per_call`` the mean µs per node."""
    samples = samples[warm:]
    n = len(samples)
    if n == 0:
        return None
    lat = [s[0] for s in samples]
    fre = [s[1] for s in samples]
    ex = [a - b for a, b in zip(lat, fre)]

    def pct(xs, q):
        xs = sorted(xs)
        return xs[min(int(len(xs) * q), len(xs) - 1)] * 1e6

    out = {"n": n,
           "p50_us": statistics.median(lat) * 1e6, "p99_us": pct(lat, 0.99),
           "mean_us": statistics.fmean(lat) * 1e6,
           "ex_p50_us": statistics.median(ex) * 1e6, "ex_p99_us": pct(ex, 0.99),
           "ex_mean_us": statistics.fmean(ex) * 1e6,
           "free_us_per_op": statistics.fmean(fre) * 1e6}
    if samples[0][2] is not None:
        for k in range(len(samples[0][2])):
            out[f"part{k}_p50_us"] = statistics.median(s[2][k] for s in samples) * 1e6
    if nodes_per_call is not None:
        npc = nodes_per_call[warm:]
        out["nodes_per_call"] = statistics.fmean(npc)
        out["us_per_node"] = sum(lat) / sum(npc) * 1e6
        out["ex_us_per_node"] = sum(ex) / sum(npc) * 1e6
    return out


# ------------------------------------------------------------------ the flatradix profile
def profile_flatradix(wl, policy, repeats=2):
    """flatradix's scenario with every numba kernel the façade calls wrapped in a
    timer, ``repeats`` times (per phase the repeat with the lowest step time is
    kept: the machine is noisy). Returns {phase: {step_us, kernel_calls,
    kernel_us, executor_us, facade_us, ...}} and the bare dispatch cost of a
    no-op kernel."""
    import numba
    import flatradix.cache as FC
    import flatradix.engine as FE
    import flatradix.hicache as FH
    import flatradix.requests as FRQ
    from flatradix.kernels import host as KH

    acc = {"calls": 0, "kernel": 0.0, "exec": 0.0, "by": {}}
    patched = []
    pc = perf_counter

    def wrap_kernel(name, f):
        def timed(*a, **k):
            t0 = pc()
            try:
                return f(*a, **k)
            finally:
                dt = pc() - t0
                acc["calls"] += 1
                acc["kernel"] += dt
                b = acc["by"].setdefault(name, [0, 0.0])
                b[0] += 1
                b[1] += dt
        return timed

    def wrap_exec(f):
        def timed(*a, **k):
            t0 = pc()
            try:
                return f(*a, **k)
            finally:
                acc["exec"] += pc() - t0
        return timed

    Disp = numba.core.registry.CPUDispatcher
    for mod in (FC, FE, FH, FRQ, KH):
        for name, obj in list(vars(mod).items()):
            if isinstance(obj, Disp):
                patched.append((mod, name, obj))
                setattr(mod, name, wrap_kernel(name, obj))
            elif name == "execute" and mod in (FC, FH):
                patched.append((mod, name, obj))
                setattr(mod, name, wrap_exec(obj))
    try:
        eng = FlatradixHi()
        res = None
        for _ in range(repeats):
            acc.update(calls=0, kernel=0.0, exec=0.0, by={})
            r = _profiled_scenario(eng, wl, policy, acc)
            if res is None:
                res = r
            else:
                for ph, v in r.items():
                    if ph != "kernels" and v["step_us"] < res[ph]["step_us"]:
                        res[ph] = v
    finally:
        for mod, name, obj in patched:
            setattr(mod, name, obj)

    # bare dispatch: a no-op kernel taking the tree arrays + 2 ints + out + acts
    @numba.njit(cache=False)
    def noop(nodes, ctab, pool, heap, meta, a, b, out, acts):
        return 0, a

    c = FlatradixHi().build(wl.page, 1024, 1024, policy).cache
    e = c._engine
    args = (*e.st, 1, 2, e.out, e.acts)
    noop(*args)
    n = 20000
    t0 = pc()
    for _ in range(n):
        noop(*args)
    dispatch = (pc() - t0) / n * 1e6

    @numba.njit(cache=False)
    def noop0():
        return 0

    noop0()
    t0 = pc()
    for _ in range(n):
        noop0()
    dispatch0 = (pc() - t0) / n * 1e6
    return res, {"noop_kernel_9_args_us": dispatch, "noop_kernel_0_args_us": dispatch0}


def _profiled_scenario(eng, wl, policy, acc):
    """``scenario``'s phases for flatradix with per-step kernel accounting."""
    ctx = eng.build(wl.page, wl.pool, wl.pool, policy)
    cache, alloc = ctx.cache, ctx.alloc
    keys = wl.keys(eng)
    pc = perf_counter
    stats = {}

    def step(phase, fn):
        c0, k0, x0 = acc["calls"], acc["kernel"], acc["exec"]
        t0 = pc()
        r = fn()
        dt = pc() - t0
        s = stats.setdefault(phase, [0, 0.0, 0, 0.0, 0.0])
        s[0] += 1
        s[1] += dt
        s[2] += acc["calls"] - c0
        s[3] += acc["kernel"] - k0
        s[4] += acc["exec"] - x0
        return r

    for k, s in zip(keys, wl.seqs):
        p = eng.insert_params(k, alloc.alloc(len(s)))

        def backup():
            cache.insert(p)
            cache.flush_pending_backups()
            cache.writing_check()
        step("backup", backup)
    one = eng.evict_params(1)
    for _ in range(max(1, wl.num_seqs // 2)):
        if step("demote", lambda: cache.evict(one)).num_tokens_evicted == 0:
            break
    batch = eng.evict_params(BATCH_TOKENS)
    while step("demote_batch", lambda: cache.evict(batch)).num_tokens_evicted:
        pass
    for j, i in enumerate(wl.load_order):
        req = make_req(j)
        mp = eng.match_params(keys[i])

        def load():
            m = cache.match_prefix(mp)
            req.last_node = m.last_device_node
            req.best_match_node = best = m.best_match_node
            req.host_hit_length = hit = m.host_hit_length
            lk = cache.lock(req.last_node)
            if hit > 0:
                hl = cache.inc_host_lock_ref(best).to_dec_params()
                lk2 = cache.lock(best)
                cache.init_load_back(eng.load_params(best, hit, req))
                cache.unlock(lk2)
                cache.dec_host_lock_ref(best, hl)
            cache.unlock(lk)
            cache.ready_to_load_host_cache()
            cache.loading_check()
            return hit
        # only host-hit steps count, as in the timed run: peek without timing
        m = cache.match_prefix(mp)
        step("load_back" if m.host_hit_length > 0 else "load_back_nohit", load)
    cache.evict(eng.evict_params(wl.pool * 2))
    for _ in range(max(1, wl.num_seqs // 2)):
        if step("host_evict", lambda: cache.evict_host(1)) == 0:
            break
    while step("host_evict_batch", lambda: cache.evict_host(BATCH_TOKENS)):
        pass
    out = {}
    for ph, (n, t, calls, kern, ex) in stats.items():
        out[ph] = {"steps": n, "step_us": t / n * 1e6, "kernel_calls_per_step": calls / n,
                   "kernel_us_per_step": kern / n * 1e6, "executor_us_per_step": ex / n * 1e6,
                   "facade_us_per_step": (t - kern - ex) / n * 1e6,
                   "facade_calls_per_step": FACADE_CALLS[ph],
                   "facade_us_per_call": (t - kern - ex) / n * 1e6 / FACADE_CALLS[ph]}
    out["kernels"] = {k: {"calls": v[0], "us_per_call": v[1] / v[0] * 1e6}
                      for k, v in sorted(acc["by"].items(), key=lambda kv: -kv[1][1])}
    return out


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

        info["flatradix"] = flatradix.__file__
        info["numba"], info["numpy"] = numba.__version__, np.__version__
        src = os.path.dirname(os.path.dirname(os.path.abspath(flatradix.__file__)))
        info["commit"] = subprocess.run(["git", "-C", src, "describe", "--always", "--dirty"],
                                        capture_output=True, text=True).stdout.strip() or "?"
    except Exception:
        pass
    try:
        import torch

        info["torch"] = torch.__version__
        import sglang

        info["sglang"] = getattr(sglang, "__version__", "?")
    except Exception:
        pass
    return info


def run(engines, pages, rounds, args, verbose=True):
    wls = {P: Workload(args.num_seqs, args.chunk_len, P, args.pool) for P in pages}
    # warm-up: compile flatradix's kernels, import-load SGLang's paths (untimed)
    for P in pages:
        small = Workload(200, args.chunk_len, P, 1 << 15)
        for eng in engines:
            scenario(eng, small, args.policy)
    # nodes per call of the batch phases: one untimed counting run of flatradix
    # per page (deterministic; every timed run's per-call tokens must match it)
    node_ref = {}
    if any(isinstance(e, FlatradixHi) for e in engines):
        for P in pages:
            res = scenario(FlatradixHi(), wls[P], args.policy, count_nodes=True)
            node_ref[P] = {ph: res[ph][1] for ph in PHASES}
    results = {P: {e.name: {ph: [] for ph in PHASES} for e in engines} for P in pages}
    checks = {P: {e.name: {ph: [] for ph in PHASES} for e in engines} for P in pages}
    raw = {P: {e.name: {ph: [] for ph in PHASES} for e in engines} for P in pages}
    loads = []
    for r in range(rounds):
        order = engines[r % len(engines):] + engines[: r % len(engines)]
        for P in pages:
            wl = wls[P]
            for eng in order:
                gc.collect()
                t0 = perf_counter()
                res = scenario(eng, wl, args.policy)
                wall = perf_counter() - t0
                loads.append(os.getloadavg()[0])
                for ph in PHASES:
                    raw[P][eng.name][ph].append(res[ph][0])
                    checks[P][eng.name][ph].append(res[ph][1])
                if verbose:
                    b, d, lb, h = (summarize(res[ph][0], warmup_count(len(res[ph][0])))
                                   for ph in ("backup", "demote", "load_back", "host_evict"))
                    print(f"  round {r + 1} page {P:2d} {eng.name:14s} {wall:6.1f}s  "
                          f"backup p50 {b['p50_us']:7.1f}  demote {d['p50_us']:6.1f}  "
                          f"load_back {lb['p50_us']:7.1f}  host_evict {h['p50_us']:6.1f} us  "
                          f"(load {os.getloadavg()[0]:.2f})", flush=True)
    # summaries; the batch phases' nodes per call are the counting run's (used
    # only where a run freed the same tokens in every call, so the same nodes)
    for P in pages:
        for name, phs in raw[P].items():
            for ph, rounds in phs.items():
                for r, samples in enumerate(rounds):
                    npc = None
                    if ph in ("demote", "host_evict"):
                        npc = [1] * len(samples)
                    elif ph.endswith("_batch") and P in node_ref:
                        ref = node_ref[P][ph]
                        if ref["per_call_crc32"] == checks[P][name][ph][r]["per_call_crc32"]:
                            npc = ref["nodes_per_call"]
                    results[P][name][ph].append(summarize(samples, warmup_count(len(samples)),
                                                          npc))
    return results, checks, loads, node_ref


RANGED = ("p50_us", "p99_us", "ex_p50_us", "ex_p99_us", "us_per_node", "ex_us_per_node")


def medians(results):
    """Median over rounds, and (min, max) over rounds of the RANGED figures."""
    out = {}
    for P, engs in results.items():
        out[P] = {}
        for eng, phs in engs.items():
            out[P][eng] = {}
            for ph, rounds in phs.items():
                rounds = [x for x in rounds if x]
                if not rounds:
                    continue
                keys = [k for k in rounds[0] if all(k in x for x in rounds)]
                m = {k: statistics.median(x[k] for x in rounds) for k in keys}
                for k in RANGED:
                    if k in m:
                        m[k + "_range"] = (min(x[k] for x in rounds), max(x[k] for x in rounds))
                out[P][eng][ph] = m
    return out


def ratios(results, base="flatradix"):
    """Per round, other engine's p50 / flatradix's p50 (e2e and ex-free) and per
    node; median and (min, max) over rounds."""
    out = {}
    for P, engs in results.items():
        out[P] = {}
        if base not in engs:
            continue
        for eng, phs in engs.items():
            if eng == base:
                continue
            out[P][eng] = {}
            for ph, rounds in phs.items():
                r = {}
                for k in ("p50_us", "ex_p50_us", "us_per_node", "ex_us_per_node"):
                    xs = [o[k] / f[k] for o, f in zip(rounds, engs[base][ph])
                          if o and f and k in o and k in f and f[k] > 0]
                    if xs:
                        r[k] = {"median": statistics.median(xs), "min": min(xs), "max": max(xs),
                                "per_round": xs}
                out[P][eng][ph] = r
    return out


def work_check(checks):
    """Every engine's per-phase checks must equal flatradix's (nodes counts are
    flatradix-only and left out)."""
    bad = []
    for P, engs in checks.items():
        ref_name = next(iter(engs))
        for name, phs in engs.items():
            for ph, rounds in phs.items():
                for a, b in zip(rounds, engs[ref_name][ph]):
                    a = {k: v for k, v in a.items() if not k.startswith("nodes")}
                    b = {k: v for k, v in b.items() if not k.startswith("nodes")}
                    if a != b:
                        bad.append((P, ph, name, a, ref_name, b))
    return bad


def fmt(x):
    if x is None:
        return "–"
    if x >= 100:
        return f"{x:,.0f}"
    return f"{x:.1f}" if x >= 10 else f"{x:.2f}"


UNIT = {"backup": "step", "demote": "node", "demote_batch": "call", "load_back": "request",
        "host_evict": "node", "host_evict_batch": "call"}


def _ratio_cell(rt, P, b, ph, k):
    x = rt.get(P, {}).get(b, {}).get(ph, {}).get(k)
    if not x:
        return "–"
    return f"{x['median']:.1f}x [{x['min']:.1f}–{x['max']:.1f}]"


def table(med, rt, P, engs):
    """Two tables (ex allocator free; end to end) and the per-node / parts lines."""
    lines = []
    others = [b for b in ("sglang-rust", "sglang-python") if b in engs and "flatradix" in engs]
    for title, pre in (("Ex allocator free (tree + bookkeeping): p50 / p99 µs per call "
                        "[p50 range over rounds]", "ex_"),
                       ("End to end (allocator free included): p50 / p99 µs per call "
                        "[p50 range over rounds]", "")):
        lines.append(title)
        lines.append("")
        hdr = "| op (unit) | " + " | ".join(engs)
        hdr += "".join(f" | {b} / flatradix" for b in others) + " |"
        lines.append(hdr)
        lines.append("|" + "---|" * (1 + len(engs) + len(others)))
        for ph in PHASES:
            row = [f"{ph} ({UNIT[ph]})"]
            for e in engs:
                s = med[P][e].get(ph)
                if s is None:
                    row.append("–")
                    continue
                lo, hi = s[pre + "p50_us_range"]
                row.append(f"{fmt(s[pre + 'p50_us'])} / {fmt(s[pre + 'p99_us'])} "
                           f"[{fmt(lo)}–{fmt(hi)}]")
            for b in others:
                row.append(_ratio_cell(rt, P, b, ph, pre + "p50_us"))
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    for ph in ("demote_batch", "host_evict_batch"):
        s = med[P].get("flatradix", {}).get(ph)
        if s and "us_per_node" in s:
            cells = [f"{e} {fmt(med[P][e][ph].get('ex_us_per_node'))} "
                     f"({fmt(med[P][e][ph].get('us_per_node'))})" for e in engs
                     if ph in med[P][e] and "us_per_node" in med[P][e][ph]]
            rts = [f"{b} / flatradix {_ratio_cell(rt, P, b, ph, 'ex_us_per_node')}"
                   for b in others]
            lines.append(f"  {ph}: {fmt(s['nodes_per_call'])} nodes a call; mean µs per node "
                         f"ex free (e2e): " + ", ".join(cells) + "; " + ", ".join(rts))
    for ph, parts in PARTS.items():
        cells = []
        for e in engs:
            s = med[P][e].get(ph)
            if s:
                cells.append(f"{e} " + " + ".join(
                    f"{p} {fmt(s.get(f'part{k}_p50_us'))}" for k, p in enumerate(parts)))
        lines.append(f"  {ph} parts, p50 µs e2e: " + "; ".join(cells))
        fr = med[P].get("flatradix", {}).get(ph)
        for b in others:
            sb = med[P][b].get(ph)
            if fr and sb:
                lines.append(f"    {b} / flatradix per part: " + ", ".join(
                    f"{p} {sb[f'part{k}_p50_us'] / fr[f'part{k}_p50_us']:.1f}x"
                    for k, p in enumerate(parts) if fr.get(f"part{k}_p50_us", 0) > 0))
    cells = []
    for ph in PHASES:
        row = [f"{e} {fmt(med[P][e][ph]['free_us_per_op'])}" for e in engs if ph in med[P][e]]
        cells.append(f"{ph}: " + ", ".join(row))
    lines.append("  allocator free, mean µs per call: " + "; ".join(cells))
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 600 requests, 1 round, no profile")
    ap.add_argument("--num-seqs", type=int, default=3000)
    ap.add_argument("--chunk-len", type=int, default=96,
                    help="prefix_sharing_sequences' run length (96: ~375-token requests)")
    ap.add_argument("--pool", type=int, default=1 << 18,
                    help="device and host pool slots each (default 262,144)")
    ap.add_argument("--pages", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--policy", default="write_through",
                    choices=("write_through", "write_through_selective"))
    ap.add_argument("--engines", nargs="+", default=None,
                    help="default: flatradix sglang-rust sglang-python (those importable)")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--sglang-python", default=None,
                    help="interpreter of the SGLang oracle venv: re-run this script under it")
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)

    if args.sglang_python:
        E.reexec_under(args.sglang_python, __file__, ROOT)

    if args.quick:
        args.num_seqs, args.rounds, args.no_profile = 600, 1, True
    if args.policy != "write_through":
        print("note: under write_through_selective a request's first insert backs nothing up; "
              "the backup step then times inserts that mostly queue nothing")
    have = E.sglang_available()
    names = args.engines or (["flatradix", "sglang-rust", "sglang-python"] if have
                             else ["flatradix"])
    if not have and any(n != "flatradix" for n in names):
        sys.exit("SGLang is not importable here: run under the oracle venv's python or pass "
                 f"--sglang-python {E.SGLANG_VENV_DEFAULT}/bin/python")
    if have:
        try:
            import torch

            torch.set_num_threads(1)
        except ImportError:
            pass
    info = machine_info()
    engines = make_engines(names)
    wl1 = Workload(args.num_seqs, args.chunk_len, 1, args.pool)
    print(f"workload: {wl1.num_seqs} requests, mean {wl1.mean_len:.0f} tokens (page 1), "
          f"shared prefixes (prefix_sharing_sequences, run {args.chunk_len}); device and host "
          f"pools {args.pool:,} slots; pages {args.pages}; policy {args.policy}; "
          f"{args.rounds} round(s); engines {', '.join(names)}")
    print("no bytes move on either side (SGLang: a null transfer engine; flatradix: no transfer "
          "callable): tree work + bookkeeping only")
    print(f"machine: {info.get('cpu', '?')}, {info['cpus']} CPUs; python {info['python']}; "
          f"flatradix {info.get('commit', '?')}; load average {info['loadavg_start'][0]:.2f}",
          flush=True)
    t_start = perf_counter()
    results, checks, loads, node_ref = run(engines, args.pages, args.rounds, args,
                                           verbose=not args.quiet)
    med = medians(results)
    rt = ratios(results)
    info["loadavg_end"] = os.getloadavg()
    info["loadavg_1min_per_scenario"] = (min(loads), max(loads)) if loads else None
    info["cores"] = {e.name: e.core for e in engines}
    prof = None
    if not args.no_profile and "flatradix" in names:
        prof = {}
        for P in args.pages:
            prof[P] = profile_flatradix(Workload(args.num_seqs, args.chunk_len, P, args.pool),
                                        args.policy)
    info["wall_s"] = perf_counter() - t_start
    bad = work_check(checks)
    print(f"\nload average (1 min): start {info['loadavg_start'][0]:.2f}, over the scenarios "
          f"{min(loads):.2f}..{max(loads):.2f}, end {info['loadavg_end'][0]:.2f} "
          f"({info['cpus']} CPUs)")
    print("work check: " + ("every engine did the same work in every phase (per-call tokens, "
                            "matches, loads, sizes)" if not bad else
                            f"{len(bad)} DIFFERENCES (see 'work_check' in the JSON)"))
    for b in bad[:6]:
        print(f"  page {b[0]} {b[1]}: {b[2]} {b[3]} vs {b[4]} {b[5]}")
    engs = [e.name for e in engines]
    for P in args.pages:
        c = checks[P][engs[0]]
        lb = c["load_back"][0]
        print(f"\npage {P}: {checks[P][engs[0]]['backup'][0]['host_used']:,} tokens backed up; "
              f"demote {c['demote'][0]['calls']} single + {c['demote_batch'][0]['calls']} batch "
              f"calls; load-back {lb['host_hits']} requests with a host hit, {lb['loads']} loads, "
              f"{lb['loaded_tokens']:,} tokens ({lb['loaded_tokens'] / max(1, lb['loads']):.0f} "
              f"a load); host evict {c['host_evict'][0]['calls']} single + "
              f"{c['host_evict_batch'][0]['calls']} batch calls")
        print(f"medians over {args.rounds} round(s); ratio = SGLang p50 / flatradix p50 of the "
              f"same round (flatradix is x times faster), median [min–max] over rounds\n")
        print(table(med, rt, P, engs))
    if prof:
        print("\nflatradix profile (kernels timed; wrappers add ~0.1 µs a kernel call):")
        for P, (res, disp) in prof.items():
            print(f"  page {P}: bare numba dispatch {disp['noop_kernel_9_args_us']:.2f} µs "
                  f"(9 args: tree arrays + 2 ints + out + acts), "
                  f"{disp['noop_kernel_0_args_us']:.2f} µs (no args)")
            for ph in PHASES + ("load_back_nohit",):
                s = res.get(ph)
                if s:
                    print(f"    {ph:17s} step {s['step_us']:7.1f} µs = kernels "
                          f"{s['kernel_us_per_step']:6.1f} "
                          f"({s['kernel_calls_per_step']:.1f} calls) "
                          f"+ executor {s['executor_us_per_step']:5.1f} + façade "
                          f"{s['facade_us_per_step']:6.1f} ({s['facade_calls_per_step']} public "
                          f"call(s): {s['facade_us_per_call']:.1f} µs each)")
            top = list(res["kernels"].items())[:8]
            print("    kernels: " + ", ".join(f"{k} {v['calls']}x {v['us_per_call']:.1f}µs"
                                             for k, v in top))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"machine": info,
                       "workload": {"num_seqs": wl1.num_seqs, "chunk_len": args.chunk_len,
                                    "mean_len_page1": wl1.mean_len, "pool": args.pool,
                                    "pages": args.pages, "policy": args.policy,
                                    "rounds": args.rounds, "quick": args.quick,
                                    "batch_tokens": BATCH_TOKENS},
                       "note": "no bytes move on either side: tree work + bookkeeping only",
                       "parts": PARTS,
                       "median": {str(P): v for P, v in med.items()},
                       "ratios_vs_flatradix": {str(P): v for P, v in rt.items()},
                       "rounds": {str(P): v for P, v in results.items()},
                       "checks": {str(P): {e: {ph: [{k: x for k, x in c.items()
                                                     if k != "nodes_per_call"} for c in rs]
                                               for ph, rs in phs.items()}
                                           for e, phs in engs_.items()}
                                  for P, engs_ in checks.items()},
                       "work_check": [list(map(str, b)) for b in bad],
                       "node_counts": {str(P): {ph: {k: v for k, v in c.items()
                                                     if k != "nodes_per_call"}
                                                for ph, c in r.items()}
                                       for P, r in node_ref.items()},
                       "profile": {str(P): v for P, v in (prof or {}).items()}}, f, indent=1)
        print(f"\nwrote {args.json_out}")


if __name__ == "__main__":
    main()
