#!/usr/bin/env python
"""flatradix's host tier (HiCache) against SGLang 0.5.23's own, step by step.

    export SGLANG_USE_CPU_ENGINE=1 SGLANG_RUST_BUILD_MODE=never OMP_NUM_THREADS=1 \\
           PYTHONPATH=$PWD:$VENV/peer_stubs                # from the repository root
    $VENV/bin/python benchmarks/compare_hicache.py --json-out /tmp/compare_hicache.json
    options: --rounds 5  --quick  --pages 1 16  --num-seqs 3000  --chunk-len 96
             --policy write_through|write_through_selective  --engines ...  --no-profile
             --component full|swa|mamba  --window 256  --mamba-states N  --mamba-chunk 64

``$VENV`` is the SGLang oracle venv (``../shared/tools/setup_sglang_oracle.sh``,
default ``~/.cache/flatradix-sglang-oracle``); ``--sglang-python`` re-executes
this script under it, as ``compare_sglang.py`` does.

Engines: ``flatradix`` (its ``UnifiedRadixCache`` + ``init_hicache``, own numpy
``TokenToKVPoolAllocator`` and ``HostKVPool``), ``sglang-python`` and
``sglang-rust`` (SGLang's ``UnifiedRadixCache`` on its Python / Rust tree core
with ``init_hicache``: its ``HybridCacheController``, ``MHATokenToKVPoolHost``
(layout ``page_first_direct``, io ``direct``), a 1-layer CPU ``MHATokenToKVPool``
and its own allocator). Full attention (``--component full``, the default), LRU,
no KV events, write policy ``--policy``.

Hybrid caches (``--component swa`` / ``mamba``), the same scenario on a cache with
a second component, both sides built alike (as ``tests/oracle/hicache_peer.py``
and ``tests/oracle/hicache_hybrid_probe.py`` build SGLang's on CPU):

* ``swa``: ``(FULL, SWA)`` with ``sliding_window_size`` ``--window`` (default 256
  tokens: the workload's nodes are at most ``--chunk-len`` (96) tokens, so the
  window spans the last few nodes of a ~375-token request, and a load-back moves
  the Full host hit plus the SWA data of those nodes; with a window shorter than
  the nodes, e.g. 32, some ``demote_swa`` calls free SWA alone, a tombstone).
  SGLang: its ``SWAKVPool`` and ``SWATokenToKVPoolAllocator`` (Full and SWA pools of
  ``--pool`` slots each); its ``alloc`` is page-1 only, so above page 1 an
  insert's slots come from the two inner allocators paired with
  ``set_full_to_swa_mapping`` (as the scheduler's ``alloc_extend``). flatradix:
  ``SWATokenToKVPoolAllocator(pool, pool, page_size=P)``, ``init_hicache(...,
  swa_host_size=H)``: SGLang's SWA host pool gets the Full one's sizing over the
  SWA pool, so ``H`` = the host pool (checked). A load-back request carries the
  match's ``swa_host_hit_length``.
* ``mamba``: ``(FULL, MAMBA)``. SGLang: its ``HybridReqToTokenPool`` (one-layer
  Mamba2 states, ``--mamba-states`` of them, default 2 x requests + 64; the
  extra buffer above page 1) and ``HybridLinearKVPool``, ``_mamba_cache_chunk_size``
  ``--mamba-chunk``. flatradix: ``HybridReqToTokenPool(4, 8192, mamba_size=S,
  enable_mamba_extra_buffer=P > 1)``, ``UnifiedRadixCache(..., mamba_cache_chunk_size,
  enable_mamba_extra_buffer=P > 1)``, ``init_hicache(..., mamba_host_size=S2)``
  with ``S2`` SGLang's ``MambaPoolHost`` size, ``int(S * ratio) + 1`` (checked).
  Every insert donates a fresh state slot (``mamba_value``; given back, untimed,
  when the result's ``mamba_exist``); a load-back request carries the match's
  ``mamba_host_hit_length`` and no state slot (``req.kv.mamba_pool_idx`` None: the
  cache allocates one, freed untimed after the step).

Their frees (the SWA allocator's and both its sides', the state allocator's, the
SWA / Mamba host pool's) are clocked with the others. The adder's load condition
becomes SGLang's ``needs_host_load_back``: a Full host hit or one of the
component (``swa_host_hit_length`` / ``mamba_host_hit_length`` > 0). Two phases
are added (below); the work check also compares, per call, the component's units
each eviction freed (``swa_num_tokens_evicted`` / ``mamba_num_evicted``), and after
each phase the component's evictable / protected sizes, its host pool's use and
its device pool's free slots / states.

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
* ``demote_swa`` / ``demote_mamba`` (hybrid only, first): ``evict(EvictParams(
                 swa_num_tokens=1))`` / ``evict(EvictParams(mamba_num=1))``: the
                 component's own eviction walk, one node a call, for up to
                 ``--num-seqs`` / 4 calls. Under LRU the victim is the LRU leaf
                 (its ancestors were touched with it), which goes whole (Full
                 too); with a window shorter than the nodes some calls free SWA
                 alone (a tombstone).
* ``demote``     ``evict(EvictParams(num_tokens=1))``: the LRU device leaf, backed
                 up, is demoted (device slots freed, host copy kept): one node per
                 call, for up to ``--num-seqs`` / 2 calls; then
* ``demote_batch`` ``evict(EvictParams(num_tokens=2048))`` until the device
                 is empty: several nodes per call (reported per call; the nodes a
                 call demotes are counted on flatradix's side, and the work check
                 makes sure every engine freed the same tokens in every call).
* ``load_back``  every request, shuffled, against the all-host tree: the
                 ``PrefillAdder``'s sequence: ``match_prefix``; ``lock(last_device_node)``;
                 when ``host_hit_length > 0`` (hybrid: or the component's host
                 hit): ``inc_host_lock_ref(best_match_node)``,
                 ``lock(best_match_node)``, ``init_load_back(InitLoadBackParams(
                 best_match_node, host_hit_length, req=req))``, ``unlock``,
                 ``dec_host_lock_ref``; ``unlock``; then ``ready_to_load_host_cache()``
                 (the batch's submit) and ``loading_check()`` (the next step's ack
                 delivery). Timed per request, and each part (match, the three
                 pins, init_load_back, the three unpins, ready, loading_check);
                 only requests with a host hit are reported (the others are a
                 plain match); loads shorter than ``load_back_threshold`` (10)
                 are declined by both.
* ``host_evict_swa`` / ``host_evict_mamba`` (hybrid only) after an untimed
                 ``evict`` of every device copy (all host-only):
                 ``evict_host(1, ComponentType.SWA / MAMBA)``: the component's
                 LRU host value (an SWA node's host tokens / one host state; a host
                 leaf losing it goes whole) is freed, one node per call, for up to
                 ``--num-seqs`` / 4 calls (the rest goes with the Full host leaves
                 below); then
* ``host_evict`` after an untimed ``evict`` of every device copy (all host-only;
                 hybrid: after ``host_evict_<component>``):
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
of a no-op kernel with the tree arrays' signature (kernels the executor calls,
a host pool's free, count as kernel time only). The machine is a shared
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
COMPONENTS = ("full", "swa", "mamba")


def phases_for(kind):
    """The phases of a component's scenario: Full's, plus (SWA / Mamba) the
    component's own device eviction (``demote_swa`` / ``demote_mamba``) before
    Full's and its own host eviction (``host_evict_swa`` / ``host_evict_mamba``)
    before Full's."""
    if kind == "full":
        return PHASES
    return (PHASES[:1] + (f"demote_{kind}",) + PHASES[1:4] + (f"host_evict_{kind}",)
            + PHASES[4:])


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
                "load_back_nohit": 5,  # match, lock, unlock, ready, loading_check
                "host_evict_swa": 1, "host_evict_mamba": 1, "demote_swa": 1, "demote_mamba": 1}
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


# ------------------------------------------------------------------ components
def make_component(kind="full", window=256, states=None, chunk=64, num_seqs=0):
    """What a scenario's cache holds beside Full: ``kind`` "full" (nothing),
    "swa" (a sliding window of ``window`` tokens) or "mamba" (``states`` device
    states, default ``2 * num_seqs + 64``; checkpoint chunk ``chunk``)."""
    if kind not in COMPONENTS:
        raise ValueError(f"component must be one of {COMPONENTS}, got {kind!r}")
    if states is None:
        states = 2 * num_seqs + 64
    return SimpleNamespace(kind=kind, window=window, states=states, chunk=chunk)


FULL = make_component()


def host_ratio(pool, host, page):
    """The ``hicache_ratio`` that makes SGLang size the Full host pool ``host``
    tokens (``(int(pool * ratio) // P + 1) * P``)."""
    return (host - page + 0.5) / pool


def mamba_host_states(comp, pool, host, page):
    """SGLang's ``MambaPoolHost`` size under that ratio: ``int(states * ratio) + 1``
    (flatradix is given the same)."""
    return int(comp.states * host_ratio(pool, host, page)) + 1


# ------------------------------------------------------------------ engines
class FlatradixHi:
    name = "flatradix"
    core = "flatradix"

    def __init__(self):
        import flatradix

        self.fr = flatradix

    def build(self, page, pool, host, policy, comp=FULL):
        fr = self.fr
        CT = fr.ComponentType
        kind = comp.kind
        kw, hkw, rtp = {}, {}, None
        if kind == "swa":
            # Full and SWA pools of ``pool`` slots each; alloc(n) pairs them at any page
            alloc = fr.SWATokenToKVPoolAllocator(pool, pool, page_size=page)
            clock = FreeClock(alloc, E.FreeClock.SWA_NAMES)
            clock.add(alloc.full_attn_allocator, FreeClock.NAMES)
            clock.add(alloc.swa_attn_allocator, FreeClock.NAMES)
            kw = dict(tree_components=(CT.FULL, CT.SWA), sliding_window_size=comp.window)
            hkw = dict(swa_host_size=host)  # SGLang's sizing over an SWA pool of ``pool``
        else:
            alloc = fr.TokenToKVPoolAllocator(pool, page_size=page, index_kind="numpy")
            clock = FreeClock(alloc, FreeClock.NAMES)
        if kind == "mamba":
            rtp = fr.HybridReqToTokenPool(4, 8192, mamba_size=comp.states,
                                          enable_mamba_extra_buffer=page > 1)
            clock.add(rtp.mamba_allocator, ("free",))
            kw = dict(tree_components=(CT.FULL, CT.MAMBA), req_to_token_pool=rtp,
                      mamba_cache_chunk_size=comp.chunk, enable_mamba_extra_buffer=page > 1)
            hkw = dict(mamba_host_size=mamba_host_states(comp, pool, host, page))
        cache = fr.UnifiedRadixCache(page_size=page, token_to_kv_pool_allocator=alloc, **kw)
        if kind == "full":
            cache.init_hicache(host_size=host, hicache_write_policy=policy)
        else:
            cache.init_hicache(host_size=host, hicache_write_policy=policy,
                               load_back_threshold=10, **hkw)
        clock.add(cache.mem_pool_host, ("free",))
        comp_host = None
        if kind == "swa":
            comp_host = cache.swa_pool_host
        elif kind == "mamba":
            comp_host = cache.mamba_pool_host
        if comp_host is not None:
            clock.add(comp_host, ("free",))
        return SimpleNamespace(cache=cache, alloc=alloc, host=cache.mem_pool_host, clock=clock,
                               kind=kind, rtp=rtp, comp_host=comp_host,
                               comp_ct={"swa": CT.SWA, "mamba": CT.MAMBA}.get(kind))

    def key(self, tokens):
        return self.fr.RadixKey(np.asarray(tokens, dtype=np.int64))

    def slots(self, ctx, n):
        """Device slots for an insert (SWA: each Full slot mapped to a fresh SWA slot)."""
        return ctx.alloc.alloc(n)

    def alloc_state(self, ctx):
        return ctx.rtp.mamba_allocator.alloc(1)

    def free_state(self, ctx, idx):
        ctx.rtp.mamba_allocator.free(np.asarray(idx, dtype=np.int64).reshape(-1))

    def insert_params(self, key, value, state=None):
        if state is None:
            return self.fr.InsertParams(key=key, value=value)
        return self.fr.InsertParams(key=key, value=value, mamba_value=state)

    def match_params(self, key):
        return self.fr.MatchPrefixParams(key=key)

    def evict_params(self, n):
        return self.fr.EvictParams(num_tokens=n)

    def comp_evict_params(self, kind, n):
        """Evict ``n`` units of the component alone (SWA tokens / Mamba states)."""
        if kind == "swa":
            return self.fr.EvictParams(num_tokens=0, swa_num_tokens=n)
        return self.fr.EvictParams(num_tokens=0, mamba_num=n)

    def load_params(self, best, hit, req):
        return self.fr.InitLoadBackParams(best_match_node=best, host_hit_length=hit, req=req)

    def sizes(self, ctx):
        c = ctx.cache
        out = {"device_evictable": int(c.evictable_size()),
               "device_protected": int(c.protected_size()),
               "host_used": ctx.host.size - ctx.host.available_size()}
        if ctx.kind != "full":
            k = ctx.kind
            out[f"{k}_evictable"] = int(getattr(c, f"{k}_evictable_size")())
            out[f"{k}_protected"] = int(getattr(c, f"{k}_protected_size")())
            out[f"{k}_host_used"] = ctx.comp_host.size - ctx.comp_host.available_size()
        return _pool_free(ctx, out)

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

    def build(self, page, pool, host, policy, comp=FULL):
        S, torch, P = self.S, self.torch, page
        CT = S.ComponentType
        kind = comp.kind
        # SGLang sizes the host pool (int(device * ratio) // P + 1) * P: pick the
        # ratio that lands on ``host`` exactly.
        ratio = host_ratio(pool, host, P)
        S.get_context().override(
            "flatradix-compare-hicache", hicache_write_policy=policy,
            hicache_io_backend="direct", hicache_mem_layout="page_first_direct",
            hicache_ratio=ratio, hicache_size=0, hicache_storage_backend=None,
            hicache_host_memory_mode="cache")
        comps, extra = (CT.FULL,), {}
        if kind == "swa":
            from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
            from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

            kv = SWAKVPool(size=pool, size_swa=pool, page_size=P, dtype=torch.float16,
                           head_num=1, head_dim=8, swa_attention_layer_ids=[0],
                           full_attention_layer_ids=[1], device="cpu")
            alloc = SWATokenToKVPoolAllocator(size=pool, size_swa=pool, page_size=P,
                                              dtype=torch.float16, device="cpu", kvcache=kv,
                                              need_sort=False)
            # clocked before the cache is built: init_hicache keeps the SWA side's
            # bound methods for load-backs
            clock = FreeClock(alloc, E.FreeClock.SWA_NAMES)
            clock.add(alloc.full_attn_allocator, FreeClock.NAMES)
            clock.add(alloc.swa_attn_allocator, FreeClock.NAMES)
            rtp = S.ReqToTokenPool(size=4, max_context_len=8192, device="cpu",
                                   enable_memory_saver=False)
            comps, extra = (CT.FULL, CT.SWA), dict(sliding_window_size=comp.window)
        elif kind == "mamba":
            from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
            from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool
            from sglang.srt.runtime_context import get_server_args

            get_server_args()._mamba_cache_chunk_size = comp.chunk
            shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=2, n_groups=1,
                                            num_heads=1, head_dim=2, state_size=1,
                                            conv_kernel=2)
            rtp = HybridReqToTokenPool(
                size=4, mamba_size=comp.states, mamba_spec_state_size=4, max_context_len=8192,
                device="cpu", enable_memory_saver=False,
                cache_params=Mamba2CacheParams(shape=shape, layers=[0]), mamba_layer_ids=[0],
                enable_mamba_extra_buffer=P > 1, speculative_num_draft_tokens=3)
            kv = HybridLinearKVPool(size=pool, dtype=torch.float16, page_size=P, head_num=1,
                                    head_dim=8, full_attention_layer_ids=[1], device="cpu",
                                    mamba_pool=rtp.mamba_pool)
            comps, extra = (CT.FULL, CT.MAMBA), dict(enable_mamba_extra_buffer=P > 1)
        else:
            kv = S.MHATokenToKVPool(size=pool, page_size=P, dtype=torch.float16, head_num=1,
                                    head_dim=8, layer_num=1, device="cpu",
                                    enable_memory_saver=False)
            rtp = S.ReqToTokenPool(size=4, max_context_len=8192, device="cpu",
                                   enable_memory_saver=False)
        if kind != "swa":
            if P == 1:
                alloc = S.TokenToKVPoolAllocator(pool, torch.float16, "cpu", kv, False)
            else:
                alloc = S.PagedTokenToKVPoolAllocator(pool, P, torch.float16, "cpu", kv, False)
            clock = FreeClock(alloc, FreeClock.NAMES)
        if kind == "mamba":
            clock.add(rtp.mamba_allocator, ("free",))
        params = S.CacheInitParams(
            disable=False, req_to_token_pool=rtp, token_to_kv_pool_allocator=alloc,
            page_size=P, eviction_policy="lru", enable_kv_cache_events=False,
            tree_components=comps, tree_core_backend=self.backend, **extra)
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
        if cache.load_back_threshold != 10:
            raise RuntimeError(f"load_back_threshold {cache.load_back_threshold}, not 10")
        clock.add(host_pool, ("free",))
        comp_host, comp_ct = None, None
        if kind != "full":
            from sglang.srt.mem_cache.hicache_storage import PoolName

            comp_host = cc.mem_pool_host.entry_map[
                PoolName.SWA if kind == "swa" else PoolName.MAMBA].host_pool
            want = host if kind == "swa" else mamba_host_states(comp, pool, host, P)
            if comp_host.size != want:
                raise RuntimeError(f"{kind} host pool has {comp_host.size} slots, "
                                   f"flatradix is given {want}")
            clock.add(comp_host, ("free",))
            comp_ct = CT.SWA if kind == "swa" else CT.MAMBA
        return SimpleNamespace(cache=cache, alloc=alloc, host=cc.mem_pool_host,
                               host_size=host_pool.size, clock=clock, kind=kind, rtp=rtp,
                               comp_host=comp_host, comp_ct=comp_ct)

    def key(self, tokens):
        return self.S.RadixKey(array("q", tokens), None)

    def slots(self, ctx, n):
        """Device slots for an insert. SWA: ``alloc`` (Full slots mapped to fresh
        SWA slots) is page-1 only; above, the two inner allocators are paired as
        the scheduler's ``alloc_extend`` does."""
        a = ctx.alloc
        if ctx.kind == "swa" and a.page_size > 1:
            if n > a.full_available_size() or n > a.swa_available_size():
                return None
            v = a.full_attn_allocator.alloc(n)
            a.set_full_to_swa_mapping(v, a.swa_attn_allocator.alloc(n))
            return v
        return a.alloc(n)

    def alloc_state(self, ctx):
        return ctx.rtp.mamba_allocator.alloc(1)

    def free_state(self, ctx, idx):
        ctx.rtp.mamba_allocator.free(
            self.torch.as_tensor(idx, dtype=self.torch.int64).reshape(-1))

    def insert_params(self, key, value, state=None):
        if state is None:
            return self.S.InsertParams(key=key, value=value)
        return self.S.InsertParams(key=key, value=value, mamba_value=state)

    def match_params(self, key):
        return self.S.MatchPrefixParams(key=key)

    def evict_params(self, n):
        return self.S.EvictParams(num_tokens=n)

    def comp_evict_params(self, kind, n):
        if kind == "swa":
            return self.S.EvictParams(num_tokens=0, swa_num_tokens=n)
        return self.S.EvictParams(num_tokens=0, mamba_num=n)

    def load_params(self, best, hit, req):
        return self.S.InitLoadBackParams(best_match_node=best, host_hit_length=hit, req=req)

    def sizes(self, ctx):
        c = ctx.cache
        out = {"device_evictable": int(c.full_evictable_size()),
               "device_protected": int(c.full_protected_size()),
               "host_used": ctx.host_size - ctx.host.available_size()}
        if ctx.kind != "full":
            k = ctx.kind
            out[f"{k}_evictable"] = int(getattr(c, f"{k}_evictable_size")())
            out[f"{k}_protected"] = int(getattr(c, f"{k}_protected_size")())
            out[f"{k}_host_used"] = ctx.comp_host.size - ctx.comp_host.available_size()
        return _pool_free(ctx, out)


def _pool_free(ctx, out):
    """The device pools' free slots (states) into ``out``: a leak on either side
    shows in the work check."""
    a = ctx.alloc
    if ctx.kind == "swa":
        out["device_free"] = int(a.full_available_size())
        out["swa_device_free"] = int(a.swa_available_size())
    else:
        out["device_free"] = int(a.available_size())
    if ctx.kind == "mamba":
        out["mamba_device_free"] = int(ctx.rtp.mamba_allocator.available_size())
    return out


class ReqKV:
    """The request KV fields a Mamba load-back reads and writes (SGLang's ``Req.kv``)."""

    def __init__(self):
        self.mamba_pool_idx = None
        self.mamba_cow_src_index = None
        self.mamba_needs_clear = False

    @property
    def holds_mamba(self):
        return self.mamba_pool_idx is not None


def make_req(i):
    """The request fields the adder sets from a match and ``init_load_back`` reads."""
    return SimpleNamespace(rid=f"b{i}", last_node=None, best_match_node=None,
                           host_hit_length=0, swa_host_hit_length=0, mamba_host_hit_length=0,
                           auxiliary_swa_host_hit_length=0,
                           kv=ReqKV())


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
def scenario(eng, wl, policy, count_nodes=False, comp=FULL):
    """One fresh cache through the four phases. Returns {phase: (samples, check)}
    where samples is a list of (total seconds, free seconds, parts tuple or None)
    and check what the work check compares. ``count_nodes`` (flatradix only; an
    untimed counting run): also count the nodes each call demotes / deletes,
    with a Python walk of the tree between calls (which would disturb the
    timings: the timed runs never count). ``comp``: the component beside Full
    (``make_component``): SWA / Mamba add their units to every check and the
    component's host eviction phase."""
    ctx = eng.build(wl.page, wl.pool, wl.pool, policy, comp)
    cache, clock = ctx.cache, ctx.clock
    kind = comp.kind
    mamba, hybrid = kind == "mamba", kind != "full"
    keys = wl.keys(eng)
    out = {}
    pc = perf_counter
    is_flat = count_nodes and isinstance(eng, FlatradixHi)

    def evicted(r):
        """(Full tokens, what the check records: Full tokens, or (Full tokens,
        the component's tokens / states) freed by the call)."""
        n = int(r.num_tokens_evicted)
        if kind == "swa":
            return n, (n, int(r.swa_num_tokens_evicted))
        if mamba:
            return n, (n, int(r.mamba_num_evicted))
        return n, n

    def totals(toks):
        if not hybrid:
            return {"tokens": sum(toks)}
        return {"tokens": sum(t[0] for t in toks), f"{kind}_units": sum(t[1] for t in toks)}

    # ---- backup: insert + flush_pending_backups + writing_check
    insert, flush, wcheck = cache.insert, cache.flush_pending_backups, cache.writing_check
    samples, prefix, exist = [], [], 0
    for k, s in zip(keys, wl.seqs):
        v = eng.slots(ctx, len(s))
        if v is None:
            raise MemoryError("device pool too small for the workload (raise --pool)")
        state = None
        if mamba:  # every insert donates a fresh state slot (back to the pool when it exists)
            state = eng.alloc_state(ctx)
            if state is None:
                raise MemoryError("Mamba state pool too small (raise --mamba-states)")
        p = eng.insert_params(k, v, state)
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
        if mamba and r.mamba_exist:
            eng.free_state(ctx, state)
            exist += 1
    sz = eng.sizes(ctx)
    chk = dict(sz, prefix_crc32=crc(prefix), matched=sum(prefix))
    if mamba:
        chk["mamba_exist"] = exist
    out["backup"] = (samples, chk)

    # ---- demote: evict(1) per call (one backed-up leaf), then batches
    evict = cache.evict
    if hybrid:  # SWA / Mamba first: the component's own eviction, one node a call
        comp_one = eng.comp_evict_params(kind, 1)
        samples, toks = [], []
        for _ in range(max(1, wl.num_seqs // 4)):
            f0 = clock.seconds
            t0 = pc()
            r = evict(comp_one)
            t1 = pc()
            rec = evicted(r)[1]
            if rec[1] == 0:
                break
            samples.append((t1 - t0, clock.seconds - f0, None))
            toks.append(rec)
        chk = {"calls": len(toks), **totals(toks), "per_call_crc32": crc(toks)}
        out[f"demote_{kind}"] = (samples, dict(chk, **eng.sizes(ctx)))
    one = eng.evict_params(1)
    samples, toks = [], []
    dev_nodes0 = eng.device_nodes(ctx) if is_flat else None
    for _ in range(max(1, wl.num_seqs // 2)):
        f0 = clock.seconds
        t0 = pc()
        r = evict(one)
        t1 = pc()
        n, rec = evicted(r)
        if n == 0:
            break
        samples.append((t1 - t0, clock.seconds - f0, None))
        toks.append(rec)
    chk = {"calls": len(toks), **totals(toks), "per_call_crc32": crc(toks)}
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
        n, rec = evicted(r)
        if n == 0:
            break
        samples.append((t1 - t0, clock.seconds - f0, None))
        toks.append(rec)
        if is_flat:
            nodes.append(d0 - eng.device_nodes(ctx))
    chk = {"calls": len(toks), **totals(toks), "per_call_crc32": crc(toks)}
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
        aux = 0  # the component's host hit (the adder's needs_host_load_back)
        if kind == "swa":
            req.swa_host_hit_length = aux = m.swa_host_hit_length
        elif mamba:
            req.mamba_host_hit_length = aux = m.mamba_host_hit_length
        lk = lock(req.last_node)
        loaded = 0
        if hit > 0 or aux > 0:
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
        if hit > 0 or aux > 0:
            samples.append((t6 - t0, clock.seconds - f0,
                            (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5)))
        if not hybrid:
            rows.append((int(m.device_prefix_len), int(hit), int(loaded)))
            continue
        got = req.kv.mamba_pool_idx is not None
        if got:  # the request's own state slot (the cache allocated it): back to the pool
            eng.free_state(ctx, req.kv.mamba_pool_idx)
        rows.append((int(m.device_prefix_len), int(hit), int(loaded), int(aux), got))
    chk = dict(eng.sizes(ctx), requests=len(rows),
               host_hits=sum(1 for r in rows if r[1] or (hybrid and r[3])),
               loads=sum(1 for r in rows if r[2]), loaded_tokens=sum(r[2] for r in rows),
               device_hit_tokens=sum(r[0] for r in rows), rows_crc32=crc(rows))
    if hybrid:
        chk[f"{kind}_host_hits"] = sum(1 for r in rows if r[3])
        chk[f"{kind}_host_hit_units"] = sum(r[3] for r in rows)
    if mamba:
        chk["request_states"] = sum(1 for r in rows if r[4])
    out["load_back"] = (samples, chk)

    # ---- host eviction: everything host-only first (untimed), then evict_host
    # (SWA / Mamba: the component's own first, one node a call, up to a quarter
    # of the requests; the rest goes with its Full host leaves)
    evict(eng.evict_params(wl.pool * 2))
    evict_host = cache.evict_host
    plan = [("host_evict", 1, max(1, wl.num_seqs // 2), None),
            ("host_evict_batch", BATCH_TOKENS, None, None)]
    if hybrid:
        plan.insert(0, (f"host_evict_{kind}", 1, max(1, wl.num_seqs // 4), ctx.comp_ct))
    for phase, n_ask, cap, ct in plan:
        samples, toks, nodes = [], [], []
        while cap is None or len(toks) < cap:
            l0 = eng.live_nodes(ctx) if is_flat else None
            f0 = clock.seconds
            t0 = pc()
            n = evict_host(n_ask) if ct is None else evict_host(n_ask, ct)
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
def profile_flatradix(wl, policy, repeats=2, comp=FULL):
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
    from flatradix.core import host as KH

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
            # the kernels the executor calls (a host pool's free) count as kernel
            # time only (with a Mamba / SWA host pool there are many)
            k0 = acc["kernel"]
            t0 = pc()
            try:
                return f(*a, **k)
            finally:
                acc["exec"] += pc() - t0 - (acc["kernel"] - k0)
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
            r = _profiled_scenario(eng, wl, policy, acc, comp)
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


def _profiled_scenario(eng, wl, policy, acc, comp=FULL):
    """``scenario``'s phases for flatradix with per-step kernel accounting."""
    ctx = eng.build(wl.page, wl.pool, wl.pool, policy, comp)
    cache = ctx.cache
    kind = comp.kind
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
        state = eng.alloc_state(ctx) if kind == "mamba" else None
        p = eng.insert_params(k, eng.slots(ctx, len(s)), state)

        def backup():
            r = cache.insert(p)
            cache.flush_pending_backups()
            cache.writing_check()
            return r
        if step("backup", backup).mamba_exist:
            eng.free_state(ctx, state)
    if kind != "full":
        comp_one = eng.comp_evict_params(kind, 1)
        for _ in range(max(1, wl.num_seqs // 4)):
            r = step(f"demote_{kind}", lambda: cache.evict(comp_one))
            if (r.swa_num_tokens_evicted if kind == "swa" else r.mamba_num_evicted) == 0:
                break
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
            aux = 0
            if kind == "swa":
                req.swa_host_hit_length = aux = m.swa_host_hit_length
            elif kind == "mamba":
                req.mamba_host_hit_length = aux = m.mamba_host_hit_length
            lk = cache.lock(req.last_node)
            if hit > 0 or aux > 0:
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
        needs = m.host_hit_length > 0 or (kind == "swa" and m.swa_host_hit_length > 0) or (
            kind == "mamba" and m.mamba_host_hit_length > 0)
        step("load_back" if needs else "load_back_nohit", load)
        if req.kv.mamba_pool_idx is not None:
            eng.free_state(ctx, req.kv.mamba_pool_idx)
    cache.evict(eng.evict_params(wl.pool * 2))
    if kind != "full":
        ct = ctx.comp_ct
        for _ in range(max(1, wl.num_seqs // 4)):
            if step(f"host_evict_{kind}", lambda: cache.evict_host(1, ct)) == 0:
                break
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


def run(engines, pages, rounds, args, verbose=True, comp=FULL):
    phases = phases_for(comp.kind)
    wls = {P: Workload(args.num_seqs, args.chunk_len, P, args.pool) for P in pages}
    # warm-up: compile flatradix's kernels, import-load SGLang's paths (untimed)
    for P in pages:
        small = Workload(200, args.chunk_len, P, 1 << 15)
        for eng in engines:
            scenario(eng, small, args.policy, comp=comp)
    # nodes per call of the batch phases: one untimed counting run of flatradix
    # per page (deterministic; every timed run's per-call tokens must match it)
    node_ref = {}
    if any(isinstance(e, FlatradixHi) for e in engines):
        for P in pages:
            res = scenario(FlatradixHi(), wls[P], args.policy, count_nodes=True, comp=comp)
            node_ref[P] = {ph: res[ph][1] for ph in phases}
    results = {P: {e.name: {ph: [] for ph in phases} for e in engines} for P in pages}
    checks = {P: {e.name: {ph: [] for ph in phases} for e in engines} for P in pages}
    raw = {P: {e.name: {ph: [] for ph in phases} for e in engines} for P in pages}
    loads = []
    for r in range(rounds):
        order = engines[r % len(engines):] + engines[: r % len(engines)]
        for P in pages:
            wl = wls[P]
            for eng in order:
                gc.collect()
                t0 = perf_counter()
                res = scenario(eng, wl, args.policy, comp=comp)
                wall = perf_counter() - t0
                loads.append(os.getloadavg()[0])
                for ph in phases:
                    raw[P][eng.name][ph].append(res[ph][0])
                    checks[P][eng.name][ph].append(res[ph][1])
                if verbose:
                    b, d, lb, h = (summarize(res[ph][0], warmup_count(len(res[ph][0])))
                                   for ph in ("backup", "demote", "load_back", "host_evict"))
                    print(f"  round {r + 1} page {P:2d} {eng.name:14s} {wall:6.1f}s  "
                          f"backup p50 {b['p50_us']:7.1f}  demote {d['p50_us']:6.1f}  "
                          f"load_back {lb['p50_us']:7.1f}  host_evict {h['p50_us']:6.1f} us  "
                          + (f"host_evict_{comp.kind} {_p50(res[f'host_evict_{comp.kind}'][0])} "
                             "us  " if comp.kind != "full" else "")
                          + f"(load {os.getloadavg()[0]:.2f})", flush=True)
    # summaries; the batch phases' nodes per call are the counting run's (used
    # only where a run freed the same tokens in every call, so the same nodes)
    for P in pages:
        for name, phs in raw[P].items():
            for ph, rounds in phs.items():
                for r, samples in enumerate(rounds):
                    npc = None
                    if ph in ("demote", "host_evict", f"host_evict_{comp.kind}",
                              f"demote_{comp.kind}"):
                        npc = [1] * len(samples)
                    elif ph.endswith("_batch") and P in node_ref:
                        ref = node_ref[P][ph]
                        if ref["per_call_crc32"] == checks[P][name][ph][r]["per_call_crc32"]:
                            npc = ref["nodes_per_call"]
                    results[P][name][ph].append(summarize(samples, warmup_count(len(samples)),
                                                          npc))
    return results, checks, loads, node_ref


def _p50(samples):
    s = summarize(samples, warmup_count(len(samples)))
    return "–" if s is None else f"{s['p50_us']:6.1f}"


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
        "host_evict": "node", "host_evict_batch": "call", "host_evict_swa": "node",
        "host_evict_mamba": "node", "demote_swa": "node", "demote_mamba": "node"}


def _ratio_cell(rt, P, b, ph, k):
    x = rt.get(P, {}).get(b, {}).get(ph, {}).get(k)
    if not x:
        return "–"
    return f"{x['median']:.1f}x [{x['min']:.1f}–{x['max']:.1f}]"


def table(med, rt, P, engs, phases=PHASES):
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
        for ph in phases:
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
    for ph in phases:
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
    ap.add_argument("--component", default="full", choices=COMPONENTS,
                    help="the cache's components: full (Full attention), swa (Full + SWA) or "
                         "mamba (Full + Mamba); default full")
    ap.add_argument("--window", type=int, default=256,
                    help="swa: the sliding window in tokens (default 256: most of a "
                         "~375-token request, so a load-back moves the window's SWA data "
                         "of a few nodes)")
    ap.add_argument("--mamba-states", type=int, default=None,
                    help="mamba: device state slots (default 2 x requests + 64); the host "
                         "state pool is sized by SGLang's rule, int(states x ratio) + 1")
    ap.add_argument("--mamba-chunk", type=int, default=64,
                    help="mamba: mamba_cache_chunk_size (default 64, SGLang's)")
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
    comp = make_component(args.component, args.window, args.mamba_states, args.mamba_chunk,
                          args.num_seqs)
    if comp.kind == "swa" and args.window < 1:
        sys.exit("--window must be >= 1")
    if comp.kind == "mamba" and any(max(P, args.mamba_chunk) % min(P, args.mamba_chunk)
                                    for P in args.pages):
        sys.exit("--mamba-chunk and every page size must divide one another (SGLang's rule)")
    phases = phases_for(comp.kind)
    info = machine_info()
    engines = make_engines(names)
    wl1 = Workload(args.num_seqs, args.chunk_len, 1, args.pool)
    print(f"workload: {wl1.num_seqs} requests, mean {wl1.mean_len:.0f} tokens (page 1), "
          f"shared prefixes (prefix_sharing_sequences, run {args.chunk_len}); device and host "
          f"pools {args.pool:,} slots; pages {args.pages}; policy {args.policy}; "
          f"{args.rounds} round(s); engines {', '.join(names)}")
    if comp.kind == "swa":
        print(f"component: Full + SWA, sliding window {comp.window} tokens; SWA device and host "
              f"pools {args.pool:,} slots each (SGLang: SWAKVPool + SWATokenToKVPoolAllocator)")
    elif comp.kind == "mamba":
        print(f"component: Full + Mamba, {comp.states:,} device states, checkpoint chunk "
              f"{comp.chunk}, extra buffer above page 1 (SGLang: HybridReqToTokenPool + "
              f"HybridLinearKVPool); every insert donates a state")
    print("no bytes move on either side (SGLang: a null transfer engine; flatradix: no transfer "
          "callable): tree work + bookkeeping only")
    print(f"machine: {info.get('cpu', '?')}, {info['cpus']} CPUs; python {info['python']}; "
          f"flatradix {info.get('commit', '?')}; load average {info['loadavg_start'][0]:.2f}",
          flush=True)
    t_start = perf_counter()
    results, checks, loads, node_ref = run(engines, args.pages, args.rounds, args,
                                           verbose=not args.quiet, comp=comp)
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
                                        args.policy, comp=comp)
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
        if comp.kind != "full":
            k = comp.kind
            what = "SWA tokens" if k == "swa" else "states"
            b = c["backup"][0]
            print(f"  {k}: {b[f'{k}_host_used']:,} {what} backed up"
                  + (f" ({b['mamba_exist']} inserts found a state)" if k == "mamba" else "")
                  + f"; demote_{k} {c[f'demote_{k}'][0]['calls']} calls ("
                  f"{c[f'demote_{k}'][0][f'{k}_units']:,} {what}, "
                  f"{c[f'demote_{k}'][0]['tokens']:,} Full tokens with them); demote + "
                  f"demote_batch freed {c['demote'][0][f'{k}_units']:,} + "
                  f"{c['demote_batch'][0][f'{k}_units']:,}; load-back "
                  f"{lb[f'{k}_host_hits']} requests with a {k} host hit"
                  + (f", {lb['request_states']} request states allocated" if k == "mamba"
                     else "")
                  + f"; host evict {c[f'host_evict_{k}'][0]['calls']} {k} calls "
                  f"({c[f'host_evict_{k}'][0]['tokens']:,} {what})")
        print(f"medians over {args.rounds} round(s); ratio = SGLang p50 / flatradix p50 of the "
              f"same round (flatradix is x times faster), median [min–max] over rounds\n")
        print(table(med, rt, P, engs, phases))
    if prof:
        print("\nflatradix profile (kernels timed; wrappers add ~0.1 µs a kernel call):")
        for P, (res, disp) in prof.items():
            print(f"  page {P}: bare numba dispatch {disp['noop_kernel_9_args_us']:.2f} µs "
                  f"(9 args: tree arrays + 2 ints + out + acts), "
                  f"{disp['noop_kernel_0_args_us']:.2f} µs (no args)")
            for ph in phases + ("load_back_nohit",):
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
                                    "batch_tokens": BATCH_TOKENS,
                                    "component": vars(comp)},
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
