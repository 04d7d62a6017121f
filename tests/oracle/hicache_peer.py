"""SGLang 0.5.23's ``UnifiedRadixCache`` with HiCache on, run on CPU (Full attention,
Full + Mamba with ``mamba_states``, Full + SWA with ``swa_window``, or Full + SWA +
Mamba with both): the peer ``hicache_driver.py`` compares flatradix's host tier
against.

Runs only in the oracle venv (``../shared/tools/setup_sglang_oracle.sh``), with
``SGLANG_USE_CPU_ENGINE=1 SGLANG_RUST_BUILD_MODE=never OMP_NUM_THREADS=1``.

What is SGLang's own and what is a test double
----------------------------------------------
SGLang's own: the tree (its Python ``UnifiedTreeCore`` or its Rust
``RustUnifiedTreeCore``), ``UnifiedRadixCache`` with its HiCache glue
(``init_hicache`` -> ``HybridCacheController``), the device KV pool
(``MHATokenToKVPool``: 1 layer, 1 head, head_dim 8, fp16, on CPU) and its
allocator (``TokenToKVPoolAllocator`` at page 1, ``PagedTokenToKVPoolAllocator``
above, with SGLang's ``debug_mode`` page checks on), the host pool
(``MHATokenToKVPoolHost``, layout ``page_first_direct``, io backend ``direct``) and
its slot allocator, the write / load queues and their ack queues.

Test doubles (the two CUDA-only steps):

* pinning the host buffer (``cudaHostRegister``) is skipped;
* the controller's ``l2_transfer_engine`` is ``FakeL2Engine``: it moves no bytes,
  records every submitted transfer as (host slot, device slot) pairs, and returns
  completion events that are complete at once. Acks still arrive late: a backup
  is only submitted by ``flush_pending_backups`` and delivered by ``writing_check``,
  a load only submitted by ``ready_to_load_host_cache`` and delivered by
  ``loading_check`` -- separate calls in the driver's op stream.

Recording (the allocators still do their real work):

* ``log``: every device free / device allocation made *by SGLang* (load-back) /
  host allocation / host free, interleaved in call order, as
  ``("dfree" | "dalloc" | "halloc" | "hfree", [slots])``. The driver's own
  allocations and frees (``alloc_slots`` / ``free_slots``) are not logged.
* ``engine.d2h`` / ``engine.h2d``: the submitted transfers (KV pairs);
  ``engine.d2h_state`` / ``engine.h2d_state``: their Mamba state pairs.
* Full + Mamba: the state allocator's allocations / frees made by SGLang
  (``"malloc"`` / ``"mfree"``) and the Mamba host pool's (``"salloc"`` /
  ``"sfree"``), in the same log.
* Full + SWA: SGLang's own ``SWAKVPool`` and ``SWATokenToKVPoolAllocator`` (its
  two inner allocators, paged above page 1 with ``debug_mode`` on, logged before
  the cache is built: ``init_hicache`` keeps the SWA side's bound ``alloc`` /
  ``free`` for load-backs). The Full side's allocations / frees are the ``"d"``
  entries, the SWA side's ``"walloc"`` / ``"wfree"``, the SWA host pool's
  ``"valloc"`` / ``"vfree"``; ``engine.d2h_swa`` / ``engine.h2d_swa`` the SWA
  pairs (SWA host slot, SWA device slot) of each submission. The driver's own
  slots: ``alloc`` at page 1, the two inner allocators paired with
  ``set_full_to_swa_mapping`` above (``alloc`` is page-1 only).
* Full + SWA + Mamba: the SWA pools above with the Mamba ``HybridReqToTokenPool``;
  ``init_hicache``'s hybrid pool assembler picks its ``_MambaSwaStrategy``
  (``build_hybrid_mamba_swa_stack``: the SWA group plus a ``MambaPoolHost`` entry),
  so all three host pools are logged as above.

The host pool is sized exactly ``host_tokens``: SGLang sizes it
``(int(device * hicache_ratio) // P + 1) * P``, so the ratio is picked to land on it;
the SWA host pool is sized by the same formula over the SWA device pool
(``swa_host_tokens``).
"""

from __future__ import annotations

import logging
import os
import warnings
from array import array
from types import SimpleNamespace

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
os.environ.setdefault("SGLANG_RUST_BUILD_MODE", "never")
os.environ.setdefault("OMP_NUM_THREADS", "1")

_S = None


class _ReqKV:
    """The request KV fields a load-back reads and writes (SGLang's ``Req.kv``)."""

    def __init__(self, idx=None):
        self.mamba_pool_idx = idx
        self.mamba_cow_src_index = None
        self.mamba_needs_clear = False

    @property
    def holds_mamba(self):
        return self.mamba_pool_idx is not None


def _slot(x):
    return None if x is None else int(x)


def _slot1(x):
    """A one-element slot (tensor, array or int) as an int; None stays None."""
    if x is None:
        return None
    return int(x.reshape(-1)[0]) if hasattr(x, "reshape") else int(x)


def cow_match(params_cls, key, match_prefix, state=None):
    """``match_prefix(params_cls(key, cow_mamba=True, req=req))`` for a request that
    holds Mamba slot ``state`` (None: none); ``(MatchResult, (the request's slot,
    mamba_cow_src_index, mamba_needs_clear))``, or ``(None, the same)`` when the
    slot allocation failed (SGLang's assertion, flatradix's RuntimeError: the match
    itself ran)."""
    req = SimpleNamespace(kv=_ReqKV(state), session=None)  # not a streaming session's
    try:
        m = match_prefix(params_cls(key=key, cow_mamba=True, req=req))
    except (AssertionError, RuntimeError) as e:
        if "alloc mamba cache" not in str(e):
            raise
        m = None
    kv = req.kv
    return m, (_slot1(kv.mamba_pool_idx), _slot1(kv.mamba_cow_src_index), kv.mamba_needs_clear)


def sgl():
    """Import SGLang once, publish server args, install the pinning double."""
    global _S
    if _S is not None:
        return _S
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    import torch

    torch.set_num_threads(1)
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    server_args = ServerArgs(model_path="dummy")
    set_global_server_args_for_scheduler(server_args)

    import sglang.srt.mem_cache.pool_host.common as pool_host_common

    pool_host_common._cuda_host_register = lambda *a, **k: None  # double 1

    # the names below are handed out through locals() (S.<name>)

    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: F401
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import (
        EvictParams,
        InitLoadBackParams,
        InsertParams,
        MatchPrefixParams,
    )
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.l2_transfer import TransferCompletion
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
    from sglang.srt.runtime_context import get_context

    _S = SimpleNamespace(**locals())
    return _S


class FakeEvent:
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


class FakeL2Engine:
    """Stands where ``L2TransferEngine`` stands: moves no bytes, records each
    submission as a list of (host slot, device slot) pairs."""

    def __init__(self, S):
        import torch

        self.S = S
        self.device_to_host_stream = torch.cpu.Stream()
        self.host_to_device_stream = torch.cpu.Stream()
        self.d2h = []
        self.h2d = []

        self.d2h_state = []  # Mamba state transfers, (host state, device state) pairs
        self.h2d_state = []
        self.d2h_swa = []    # SWA transfers, (SWA host slot, SWA device slot) pairs
        self.h2d_swa = []

    @staticmethod
    def _kind(t):
        if type(t.host_pool).__name__ == "MambaPoolHost":
            return "state"
        return "swa" if getattr(t.host_pool, "pool_label", None) == "swa" else "kv"

    @classmethod
    def _pairs(cls, transfers, kind):
        out = []
        for t in transfers:
            if cls._kind(t) == kind:
                out.extend(zip(t.host_indices.tolist(), t.device_indices.tolist()))
        return out

    def _record(self, transfers, kv, state, swa):
        kv.append(self._pairs(transfers, "kv"))
        state.append(self._pairs(transfers, "state"))
        swa.append(self._pairs(transfers, "swa"))

    def submit_device_to_host(self, transfers):
        self._record(transfers, self.d2h, self.d2h_state, self.d2h_swa)
        return self.S.TransferCompletion(FakeEvent(), FakeEvent(), False)

    def submit_host_to_device(self, transfers, *, transfer_layer_id_max, start_event=None,
                              on_layer_done=None):
        if on_layer_done is not None:
            for layer_id in range(transfer_layer_id_max):
                on_layer_done(layer_id)
        self._record(transfers, self.h2d, self.h2d_state, self.h2d_swa)
        return self.S.TransferCompletion(FakeEvent(), FakeEvent(), False)


class SglHiCache:
    """SGLang's cache + pools + controller, and the calls a scheduler makes."""

    def __init__(self, core, page_size, device_tokens, host_tokens, write_policy,
                 eviction_policy="lru", load_back_threshold=None, mamba_states=0, chunk=8,
                 path_cap=-1, swa_window=None, swa_tokens=None):
        S = self.S = sgl()
        import torch

        self.torch = torch
        P = self.page_size = page_size
        if device_tokens % P or host_tokens % P or host_tokens < P:
            raise ValueError("device_tokens and host_tokens must be page multiples")
        ratio = (host_tokens - P + 0.5) / device_tokens
        S.get_context().override(
            "flatradix-hicache-oracle", hicache_write_policy=write_policy,
            hicache_io_backend="direct", hicache_mem_layout="page_first_direct",
            hicache_ratio=ratio, hicache_size=0, hicache_storage_backend=None,
            hicache_host_memory_mode="cache")
        self.mamba = bool(mamba_states)
        self.swa = swa_window is not None
        if self.mamba:
            # (FULL, MAMBA) and (FULL, SWA, MAMBA): SGLang's HybridReqToTokenPool
            # (one-layer Mamba2 states; the extra buffer above page 1, as the scheduler
            # requires)
            from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
            from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool
            from sglang.srt.runtime_context import get_exec, get_server_args

            get_server_args()._mamba_cache_chunk_size = chunk
            # the per-path state cap (-1: off), as a launcher sets it (both cores read it
            # at construction)
            S.get_context().override("flatradix-hicache-oracle-mamba",
                                     mamba_max_states_per_path=path_cap)
            if get_exec().mamba.mamba_max_states_per_path != path_cap:
                raise RuntimeError(f"mamba_max_states_per_path did not become {path_cap}")
            shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=2, n_groups=1,
                                            num_heads=1, head_dim=2, state_size=1,
                                            conv_kernel=2)
            self.rtp = HybridReqToTokenPool(
                size=4, mamba_size=mamba_states, mamba_spec_state_size=4,
                max_context_len=max(64, device_tokens + host_tokens), device="cpu",
                enable_memory_saver=False, cache_params=Mamba2CacheParams(shape=shape, layers=[0]),
                mamba_layer_ids=[0], enable_mamba_extra_buffer=P > 1,
                speculative_num_draft_tokens=3)
        if self.swa:
            # (FULL, SWA) and (FULL, SWA, MAMBA): SGLang's SWAKVPool (with Mamba, its
            # hybrid pool assembler's _MambaSwaStrategy takes the state pool from the
            # HybridReqToTokenPool above)
            from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

            swa_tokens = device_tokens if swa_tokens is None else swa_tokens
            if swa_tokens % P:
                raise ValueError("swa_tokens must be a page multiple")
            self.kv = SWAKVPool(size=device_tokens, size_swa=swa_tokens, page_size=P,
                                dtype=torch.float16, head_num=1, head_dim=8,
                                swa_attention_layer_ids=[0], full_attention_layer_ids=[1],
                                device="cpu")
        elif self.mamba:
            from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool

            self.kv = HybridLinearKVPool(size=device_tokens, dtype=torch.float16, page_size=P,
                                         head_num=1, head_dim=8, full_attention_layer_ids=[1],
                                         device="cpu", mamba_pool=self.rtp.mamba_pool)
        else:
            self.kv = S.MHATokenToKVPool(size=device_tokens, page_size=P, dtype=torch.float16,
                                         head_num=1, head_dim=8, layer_num=1, device="cpu",
                                         enable_memory_saver=False)
        if self.swa:
            from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator

            self.alloc = SWATokenToKVPoolAllocator(size=device_tokens, size_swa=swa_tokens,
                                                   page_size=P, dtype=torch.float16,
                                                   device="cpu", kvcache=self.kv,
                                                   need_sort=False)
            if P > 1:
                self.alloc.full_attn_allocator.debug_mode = True
                self.alloc.swa_attn_allocator.debug_mode = True
        elif P == 1:
            self.alloc = S.TokenToKVPoolAllocator(device_tokens, torch.float16, "cpu", self.kv,
                                                  False)
        else:
            self.alloc = S.PagedTokenToKVPoolAllocator(device_tokens, P, torch.float16, "cpu",
                                                       self.kv, False)
            self.alloc.debug_mode = True
        self.device_tokens = device_tokens
        self.log = []
        self._quiet = False  # the driver's own allocations / frees are not logged
        if self.swa:  # each side on its own (init_hicache keeps the SWA side's methods)
            self._log_allocator(self.alloc.full_attn_allocator, "d")
            self._log_allocator(self.alloc.swa_attn_allocator, "w")
        else:
            self._log_allocator(self.alloc, "d")
        comps = (S.ComponentType.FULL,)
        extra = {}
        if self.swa:
            comps += (S.ComponentType.SWA,)
            extra.update(sliding_window_size=swa_window)
        if self.mamba:
            comps += (S.ComponentType.MAMBA,)
            extra.update(enable_mamba_extra_buffer=P > 1)
            self.malloc = self.rtp.mamba_allocator
            real_malloc, real_mfree = self.malloc.alloc, self.malloc.free

            def logged_malloc(n, *a, _real=real_malloc, **k):
                out = _real(n, *a, **k)
                if not self._quiet and out is not None:
                    self.log.append(("malloc", out.tolist()))
                return out

            def logged_mfree(idx, *a, _real=real_mfree, **k):
                if not self._quiet:
                    self.log.append(("mfree", idx.reshape(-1).tolist()))
                return _real(idx, *a, **k)

            self.malloc.alloc, self.malloc.free = logged_malloc, logged_mfree
        else:
            self.rtp = S.ReqToTokenPool(size=4,
                                        max_context_len=max(64, device_tokens + host_tokens),
                                        device="cpu", enable_memory_saver=False)
        self.params = S.CacheInitParams(
            disable=False, req_to_token_pool=self.rtp, token_to_kv_pool_allocator=self.alloc,
            page_size=P, eviction_policy=eviction_policy, enable_kv_cache_events=True,
            tree_components=comps, tree_core_backend=core, **extra)
        self.cache = S.UnifiedRadixCache(self.params)
        want = {"python": "UnifiedTreeCore", "rust": "RustUnifiedTreeCore"}[core]
        if type(self.cache.tree_core).__name__ != want:
            raise RuntimeError(f"got {type(self.cache.tree_core).__name__}, not {want}")
        self.core = core
        self.cache.init_hicache(S.server_args, self.params)
        if load_back_threshold is not None:
            self.cache.load_back_threshold = load_back_threshold
        self.cc = self.cache.cache_controller
        self.engine = FakeL2Engine(S)  # double 2
        self.cc.l2_transfer_engine = self.engine
        self.host_group = self.cc.mem_pool_host
        self.host_pool = self.host_group.anchor_entry.host_pool
        if self.host_pool.size != host_tokens:
            raise RuntimeError(f"host pool has {self.host_pool.size} slots, wanted {host_tokens}")
        self._log_host_pool(self.host_pool, "h")
        self.swa_host_pool = None
        if self.swa:
            from sglang.srt.mem_cache.hicache_storage import PoolName

            self.swa_host_pool = self.host_group.entry_map[PoolName.SWA].host_pool
            # sized as the Full one, over the SWA device pool (flatradix is given this)
            self.swa_host_tokens = (int(swa_tokens * ratio) // P + 1) * P
            if self.swa_host_pool.size != self.swa_host_tokens:
                raise RuntimeError(f"SWA host pool has {self.swa_host_pool.size} slots, "
                                   f"expected {self.swa_host_tokens}")
            self._log_host_pool(self.swa_host_pool, "v")
        self.state_host_pool = None
        if self.mamba:
            from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import PoolName

            self.state_host_pool = self.host_group.entry_map[PoolName.MAMBA].host_pool
            self._log_host_pool(self.state_host_pool, "s")
        self.cache.take_events()  # the construction's AllBlocksCleared
        self._rid = 0

    def _log_allocator(self, alloc, tier):
        """Log the frees (outermost call only: a free may call another free method)
        and allocations of a device allocator made by SGLang as ``(tier + "free" |
        tier + "alloc", slots)``; page-id frees as their slots."""
        P = self.page_size
        depth = [0]

        def wrap(name, to_slots):
            real = getattr(alloc, name)

            def logged(idx, *a, _real=real, **k):
                if depth[0] == 0 and not self._quiet:
                    self.log.append((tier + "free", to_slots(idx)))
                depth[0] += 1
                try:
                    return _real(idx, *a, **k)
                finally:
                    depth[0] -= 1

            setattr(alloc, name, logged)

        for name in ("free", "free_full", "free_segment", "free_full_segment"):
            wrap(name, lambda idx: idx.tolist())
        wrap("free_page_ids",
             lambda pages: [int(p) * P + j for p in pages.tolist() for j in range(P)])
        real_alloc = alloc.alloc

        def logged_alloc(n, *a, _real=real_alloc, **k):
            out = _real(n, *a, **k)
            if not self._quiet and out is not None:
                self.log.append((tier + "alloc", out.tolist()))
            return out

        alloc.alloc = logged_alloc

    def _log_host_pool(self, pool, tier):
        """Log every ``alloc`` / ``free`` of a host pool as ``(tier + "alloc" | tier +
        "free", slots)`` (the driver's own host allocations too: a refill's)."""
        real_alloc, real_free = pool.alloc, pool.free

        def logged_alloc(n, *a, **k):
            out = real_alloc(n, *a, **k)
            if out is not None:
                self.log.append((tier + "alloc", out.tolist()))
            return out

        def logged_free(idx):
            self.log.append((tier + "free", idx.tolist()))
            return real_free(idx)

        pool.alloc, pool.free = logged_alloc, logged_free

    # ------------------------------------------------------------ slots
    def key(self, tokens):
        return self.S.RadixKey(array("q", tokens), None)

    def alloc_slots(self, n):
        """``n`` fresh device slots (n a page multiple), or None; not logged. Full +
        SWA: Full slots, each mapped to a fresh SWA slot (``alloc`` at page 1; above,
        where it asserts, the two sides paired as the scheduler's ``alloc_extend``)."""
        self._quiet = True
        try:
            if self.swa and self.page_size > 1:
                a = self.alloc
                if n > a.full_available_size() or n > a.swa_available_size():
                    return None
                out = a.full_attn_allocator.alloc(n)
                a.set_full_to_swa_mapping(out, a.swa_attn_allocator.alloc(n))
            else:
                out = self.alloc.alloc(n)
        finally:
            self._quiet = False
        return None if out is None else out.tolist()

    def free_slots(self, slots):
        """Free device slots (Full + SWA: with their SWA peers); not logged."""
        self._quiet = True
        try:
            self.alloc.free(self.torch.as_tensor(slots, dtype=self.torch.int64))
        finally:
            self._quiet = False

    def swa_peers(self, slots):
        """The SWA slots Full slots map to (0: none)."""
        if not slots:
            return []
        return self.alloc.translate_swa_indices_for_transfer(
            self.torch.as_tensor(slots, dtype=self.torch.int64)).tolist()

    def free_swa(self, slots):
        """Free the SWA peers of Full slots (a request whose window slid past them:
        ``free_swa_segment``, page-aligned from 0); not logged."""
        self._quiet = True
        try:
            self.alloc.free_swa_segment(self.torch.as_tensor(slots, dtype=self.torch.int64),
                                        start_pos=0)
        finally:
            self._quiet = False

    def alloc_state(self):
        """One fresh Mamba state slot (an int), or None; not logged."""
        self._quiet = True
        try:
            out = self.malloc.alloc(1)
        finally:
            self._quiet = False
        return None if out is None else int(out[0])

    def free_state(self, slot):
        self._quiet = True
        try:
            self.malloc.free(self.torch.as_tensor([slot], dtype=self.torch.int64))
        finally:
            self._quiet = False

    def take_log(self):
        out, self.log = self.log, []
        return out

    @property
    def root(self):
        return self.cache.root_node_handle()

    # ------------------------------------------------------------ tree ops
    def insert(self, tokens, value, prev_prefix_len, inserted_len, state=None, cursor=0):
        """``cursor`` (SWA): the request's SWA evicted seqlen (its slots below it hold
        no SWA peer)."""
        extra = {}
        if state is not None:
            extra["mamba_value"] = self.torch.as_tensor([state], dtype=self.torch.int64)
        params = self.S.InsertParams(
            key=self.key(tokens), value=self.torch.as_tensor(value, dtype=self.torch.int64),
            prev_prefix_len=prev_prefix_len, inserted_len=inserted_len, **extra)
        if cursor:
            params.set_evicted_seqlen(self.S.ComponentType.SWA, cursor)
        return self.cache.insert(params)

    def match(self, tokens):
        return self.cache.match_prefix(self.S.MatchPrefixParams(key=self.key(tokens)))

    def match_cow(self, tokens, state=None):
        """``cow_match`` on this cache (``state``: the request's Mamba slot or None)."""
        idx = None if state is None else self.torch.tensor(state, dtype=self.torch.int64)
        return cow_match(self.S.MatchPrefixParams, self.key(tokens), self.cache.match_prefix,
                         idx)

    def path_device_indices(self, node, n):
        return self.cache.path_device_indices(node)[:n].tolist() if n else []

    def make_req(self, last_node, mamba_host_hit=0, state=None, swa_host_hit=0):
        """The request fields ``init_load_back`` reads (as the scheduler sets them);
        ``state``: a Mamba slot the request holds already."""
        self._rid += 1
        idx = None if state is None else self.torch.tensor(state, dtype=self.torch.int64)
        req = SimpleNamespace(rid=f"r{self._rid}", last_node=last_node,
                              swa_host_hit_length=swa_host_hit,
                              mamba_host_hit_length=mamba_host_hit,
                              auxiliary_swa_host_hit_length=0, kv=_ReqKV(idx))
        return req

    def init_load_back(self, best, hit, mem_quota, last_node, mamba_host_hit=0, state=None,
                       swa_host_hit=0):
        """``(result, the request's Mamba slot after the call or None)``."""
        req = self.make_req(last_node, mamba_host_hit, state, swa_host_hit)
        r = self.cache.init_load_back(self.S.InitLoadBackParams(
            best_match_node=best, host_hit_length=hit, mem_quota=mem_quota, req=req))
        return r, _slot(req.kv.mamba_pool_idx)

    def load_back(self, node, mem_quota, last_node, state=None):
        req = self.make_req(last_node, 0, state)
        r = self.cache.load_back(node, mem_quota, req=req)
        return r, _slot(req.kv.mamba_pool_idx)

    def evict(self, n, states=0, swa=0):
        """Evicted Full tokens; Full + Mamba: (tokens, states); Full + SWA: (tokens, SWA
        tokens); Full + SWA + Mamba: (tokens, SWA tokens, states)."""
        if self.swa and self.mamba:
            r = self.cache.evict(self.S.EvictParams(num_tokens=n, swa_num_tokens=swa,
                                                    mamba_num=states))
            return r.num_tokens_evicted, r.swa_num_tokens_evicted, r.mamba_num_evicted
        if self.swa:
            r = self.cache.evict(self.S.EvictParams(num_tokens=n, swa_num_tokens=swa))
            return r.num_tokens_evicted, r.swa_num_tokens_evicted
        r = self.cache.evict(self.S.EvictParams(num_tokens=n, mamba_num=states) if self.mamba
                             else self.S.EvictParams(num_tokens=n))
        return r.num_tokens_evicted if not self.mamba else (r.num_tokens_evicted,
                                                            r.mamba_num_evicted)

    def host_alloc(self, n):
        """``n`` host slots from the host pool (logged ``halloc``), or None."""
        out = self.host_pool.alloc(n)
        return None if out is None else out.tolist()

    def host_free(self, slots):
        if slots:
            self.host_pool.free(self.torch.as_tensor(slots, dtype=self.torch.int64))

    def insert_host(self, anchor, tokens, host_slots, path_tokens, swa_slots=None,
                    state_slot=None):
        """The storage prefetch's refill as SGLang's ``_handle_prefetch_result`` runs
        it: the tree's ``insert_host`` with the pages' storage hashes (SGLang's own
        ``get_storage_hash_str`` over the whole path, so they are the hashes its
        tree would compute), then the walk's cache actions (a split of a pending
        backup). The caller frees the Full host slots the result leaves to it.

        Hybrid: ``swa_slots`` (SWA host slots staging the key's last units) and
        ``state_slot`` (a host state slot) are the components' staging, every page
        of it fetched: committed as SGLang commits a prefetch (the tree's
        ``commit_hicache_transfers``, phase ``PREFETCH``, with a storage result
        counting all of them; its frees run as cache actions), or, for a dropped
        refill, freed to their host pools (the controller's release)."""
        from sglang.srt.mem_cache.hicache_storage import (
            PoolHitPolicy, PoolName, PoolTransfer, PoolTransferResult,
        )
        from sglang.srt.mem_cache.unified_cache.components import CacheTransferPhase
        from sglang.srt.mem_cache.utils import get_storage_hash_str

        P = self.page_size
        T = self.torch
        hashes = get_storage_hash_str(self.key(path_tokens), None, page_size=P)
        hashes = hashes[(len(path_tokens) - len(tokens)) // P:]
        res = self.cache.tree_core.insert_host(
            anchor, self.key(tokens), T.as_tensor(host_slots, dtype=T.int64), hashes)
        self.cache._apply_cache_actions(res.cache_actions)
        if swa_slots is None and state_slot is None:
            return res
        swa = None if swa_slots is None else T.as_tensor(swa_slots, dtype=T.int64)
        state = None if state_slot is None else T.as_tensor([state_slot], dtype=T.int64)
        if res.host_insert_dropped:
            if swa is not None:
                self.swa_host_pool.free(swa)
            if state is not None:
                self.state_host_pool.free(state)
            return res
        CT = self.S.ComponentType
        xfers, hits = {}, {}
        if swa is not None:
            xfers[CT.SWA] = [PoolTransfer(name=PoolName.SWA, host_indices=swa,
                                          keys=["__placeholder__"] * (len(swa_slots) // P),
                                          hit_policy=PoolHitPolicy.TRAILING_PAGES)]
            hits[PoolName.SWA] = len(swa_slots) // P
        if state is not None:
            xfers[CT.MAMBA] = [PoolTransfer(name=PoolName.MAMBA, host_indices=state,
                                            keys=["__placeholder__"],
                                            hit_policy=PoolHitPolicy.TRAILING_PAGES)]
            hits[PoolName.MAMBA] = 1
        # the commit's frees go to the controller's release queues (which exist once
        # its storage threads run: the oracle runs none), drained below
        from queue import Queue

        cc = self.cache.cache_controller
        for name in hits:
            cc.extra_host_mem_release_queues.setdefault(name, Queue())
        actions = []
        self.cache.tree_core.commit_hicache_transfers(
            anchor, CacheTransferPhase.PREFETCH, xfers, cache_actions=actions,
            insert_result=res, pool_storage_result=PoolTransferResult(len(tokens) // P, hits))
        self.cache._apply_cache_actions(actions)
        # SGLang's storage step drains those queues into the host pools on the
        # scheduler's next step; drained here at once, as flatradix frees in the call
        for name, pool in ((PoolName.SWA, self.swa_host_pool),
                           (PoolName.MAMBA, self.state_host_pool)):
            q = cc.extra_host_mem_release_queues.get(name)
            pages = []
            while q is not None and not q.empty():
                pages.append(q.get_nowait())
            if pages:
                pool.free(T.cat(pages))
        return res

    # ------------------------------------------------------------ state views
    def write_queue(self):
        """Backups committed, not yet submitted: their ack ids, in queue order."""
        return [i for op in self.cc.write_queue for i in op.node_ids]

    def write_acks(self):
        return [list(a.node_ids) for a in self.cc.ack_write_queue]

    def load_queue(self):
        return [i for op in self.cc.load_queue for i in op.node_ids]

    def load_acks(self):
        return [list(a.node_ids) for a in self.cc.ack_load_queue]

    def host_available(self):
        return self.host_group.available_size()

    def state_host_available(self):
        return self.state_host_pool.available_size()

    def swa_host_available(self):
        return self.swa_host_pool.available_size()

    def swa_host_total(self):
        """Python core only: tokens holding an SWA host value, from the node arena."""
        tc = self.cache.tree_core
        SWA = self.S.ComponentType.SWA
        return sum(len(n.component_data[SWA].host_value) for n in tc._node_arena.values()
                   if n is not tc.root_node and n.component_data[SWA].host_value is not None)

    def host_ledger(self):
        """Python core only: (host tokens in the tree, of them on evictable host leaves)."""
        tc = self.cache.tree_core
        FULL = self.S.ComponentType.FULL
        total = leaf = 0
        for n in tc._node_arena.values():
            if n is tc.root_node:
                continue
            hv = n.component_data[FULL].host_value
            if hv is None:
                continue
            total += len(hv)
            if n in tc.evictable_host_leaves:
                leaf += len(hv)
        return total, leaf
