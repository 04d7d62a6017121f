"""SGLang 0.5.23's host tier with a hybrid component, on CPU: the groundwork for the
SWA / Mamba HiCache oracle (issue 13; flatradix's SWA and Mamba host tiers are now
compared op by op in ``hicache_driver.py``).

    $VENV/bin/python -m tests.oracle.hicache_hybrid_probe --component swa --core rust
    $VENV/bin/python -m tests.oracle.hicache_hybrid_probe --component mamba --core python --page 4

(environment as for ``hicache_driver.py``: ``SGLANG_USE_CPU_ENGINE=1
SGLANG_RUST_BUILD_MODE=never OMP_NUM_THREADS=1 PYTHONPATH=$PWD:$VENV/peer_stubs``.)

It builds SGLang's ``UnifiedRadixCache`` with ``(FULL, SWA)`` (window 4, its
``SWAKVPool`` and ``SWATokenToKVPoolAllocator``) or ``(FULL, MAMBA)`` (its
``HybridReqToTokenPool`` and ``HybridLinearKVPool``; the extra buffer above
page 1), turns HiCache on with ``init_hicache`` and walks one scenario: two
sequences sharing 8 tokens inserted (backed up at the first hit), the backup
submitted and acked, everything evicted (demoted), a match, a load-back, its
ack, eviction and host eviction per component. It prints each step's result
and every transfer submitted (host pool, count, device slots).

Findings (helper-22, both tree cores, pages 1 and 4; no double beyond
``hicache_peer.py``'s two -- the unpinned host buffer and ``FakeL2Engine``):

* ``init_hicache`` assembles one host pool per component (SWA: a second
  ``MHATokenToKVPoolHost``; Mamba: a ``MambaPoolHost``, sized by the same
  ``hicache_ratio`` over the state pool: ``int(states * ratio) + 1``).
* SWA: one backup submits both pools (the Full path, the SWA window of it);
  a match reports ``swa_host_hit_length``; a load-back moves the Full host hit
  and only the last window of SWA; ``evict_host(n, SWA)`` frees SWA host
  values alone, ``evict_host(n)`` takes them with their Full host leaves.
* Mamba: a backup submits the node's state; a match on a host-only state
  reports ``mamba_host_hit_length`` 1; a load-back moves the node's state and
  a copy into a fresh request slot (``req.kv.mamba_pool_idx``).
* A write-through backup fires only for ``insert(..., inserted_len=0)`` (below
  the node's end): with ``inserted_len == len(key)`` the hit count is skipped.
* ``SWATokenToKVPoolAllocator.alloc`` is page-1 only: above page 1 the probe
  pairs the two inner allocators and calls ``set_full_to_swa_mapping``.
* With SGLang's real transfer engine the backup fails on CPU in both modes
  (its CPU stream has no ``synchronize``; its copy kernels import only on
  CUDA / HIP): ``FakeL2Engine`` is what gets past it, as for Full.
"""

from __future__ import annotations

import argparse
import sys
from array import array
from types import SimpleNamespace

from tests.oracle.hicache_peer import FakeL2Engine, sgl


class LoggingEngine(FakeL2Engine):
    """``FakeL2Engine`` that also keeps, per submission, each transfer's host pool,
    slot count and first device slots."""

    def __init__(self, S):
        super().__init__(S)
        self.log = []

    def _note(self, kind, transfers):
        self.log.append((kind, [(getattr(t.host_pool, "pool_label", type(t.host_pool).__name__),
                                 t.host_indices.numel(), t.device_indices.tolist()[:24])
                                for t in transfers]))

    def submit_device_to_host(self, transfers):
        self._note("d2h", transfers)
        return super().submit_device_to_host(transfers)

    def submit_host_to_device(self, transfers, **kw):
        self._note("h2d", transfers)
        return super().submit_host_to_device(transfers, **kw)


def describe(m):
    return (f"device={m.device_prefix_len} host_hit={m.host_hit_length} "
            f"swa_host_hit={m.swa_host_hit_length} mamba_host_hit={m.mamba_host_hit_length} "
            f"swa_branch={m.swa_branching_seqlen} mamba_branch={m.mamba_branching_seqlen}")


def build(S, component, core, page, device=32, host=32, window=4, states=8):
    import torch

    # the host pool is sized from hicache_ratio: pick it to land on ``host`` tokens
    S.get_context().override(
        "probe", hicache_write_policy="write_through", hicache_io_backend="direct",
        hicache_mem_layout="page_first_direct", hicache_ratio=(host - page + 0.5) / device,
        hicache_size=0, hicache_storage_backend=None, hicache_host_memory_mode="cache")
    CT = S.ComponentType
    if component == "swa":
        from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
        from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

        kv = SWAKVPool(size=device, size_swa=device, page_size=page, dtype=torch.float16,
                       head_num=1, head_dim=8, swa_attention_layer_ids=[0],
                       full_attention_layer_ids=[1], device="cpu")
        alloc = SWATokenToKVPoolAllocator(size=device, size_swa=device, page_size=page,
                                          dtype=torch.float16, device="cpu", kvcache=kv,
                                          need_sort=False)
        rtp = S.ReqToTokenPool(size=4, max_context_len=128, device="cpu",
                               enable_memory_saver=False)
        params = S.CacheInitParams(
            disable=False, req_to_token_pool=rtp, token_to_kv_pool_allocator=alloc,
            page_size=page, eviction_policy="lru", enable_kv_cache_events=False,
            tree_components=(CT.FULL, CT.SWA), sliding_window_size=window,
            tree_core_backend=core)
    else:
        from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
        from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool
        from sglang.srt.runtime_context import get_server_args

        get_server_args()._mamba_cache_chunk_size = 8
        shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=2, n_groups=1,
                                        num_heads=1, head_dim=2, state_size=1, conv_kernel=2)
        rtp = HybridReqToTokenPool(
            size=4, mamba_size=states, mamba_spec_state_size=4, max_context_len=128,
            device="cpu", enable_memory_saver=False,
            cache_params=Mamba2CacheParams(shape=shape, layers=[0]), mamba_layer_ids=[0],
            enable_mamba_extra_buffer=page > 1, speculative_num_draft_tokens=3)
        kv = HybridLinearKVPool(size=device, dtype=torch.float16, page_size=page, head_num=1,
                                head_dim=8, full_attention_layer_ids=[1], device="cpu",
                                mamba_pool=rtp.mamba_pool)
        alloc = (S.TokenToKVPoolAllocator(device, torch.float16, "cpu", kv, False) if page == 1
                 else S.PagedTokenToKVPoolAllocator(device, page, torch.float16, "cpu", kv, False))
        params = S.CacheInitParams(
            disable=False, req_to_token_pool=rtp, token_to_kv_pool_allocator=alloc,
            page_size=page, eviction_policy="lru", enable_kv_cache_events=False,
            tree_components=(CT.FULL, CT.MAMBA), tree_core_backend=core,
            enable_mamba_extra_buffer=page > 1)
    cache = S.UnifiedRadixCache(params)
    cache.init_hicache(S.server_args, params)
    engine = LoggingEngine(S)
    cache.cache_controller.l2_transfer_engine = engine
    return cache, alloc, rtp, engine


def run(component, core, page):
    S = sgl()
    CT = S.ComponentType
    cache, alloc, rtp, engine = build(S, component, core, page)
    print("tree core:", type(cache.tree_core).__name__)
    print("host pools:", {k: (type(e.host_pool).__name__, e.host_pool.size)
                          for k, e in cache.host_pool_group.entry_map.items()})

    def key(toks):
        return S.RadixKey(array("q", toks), None)

    def insert(toks):
        extra = {}
        if component == "swa" and page > 1:   # alloc is page-1 only: pair the two sides
            v = alloc.full_attn_allocator.alloc(len(toks))
            alloc.set_full_to_swa_mapping(v, alloc.swa_attn_allocator.alloc(len(toks)))
        else:
            v = alloc.alloc(len(toks))
        if component == "mamba":
            extra["mamba_value"] = rtp.mamba_allocator.alloc(1)
        r = cache.insert(S.InsertParams(key=key(toks), value=v, prev_prefix_len=0,
                                        inserted_len=0, **extra))
        return r.prefix_len

    a = list(range(1, 17))
    b = list(range(1, 9)) + list(range(50, 58))
    print("insert a, b:", insert(a), insert(b))
    cache.flush_pending_backups()
    print("backup submitted:", engine.log[-1] if engine.log else None)
    cache.writing_check()
    evict = (S.EvictParams(num_tokens=32, mamba_num=2) if component == "mamba"
             else S.EvictParams(num_tokens=32))
    print("evict:", cache.evict(evict))
    m = cache.match_prefix(S.MatchPrefixParams(key=key(a)))
    print("match a:", describe(m))
    req = SimpleNamespace(rid="r1", last_node=m.last_device_node,
                          swa_host_hit_length=m.swa_host_hit_length,
                          mamba_host_hit_length=m.mamba_host_hit_length,
                          auxiliary_swa_host_hit_length=0,
                          kv=SimpleNamespace(mamba_pool_idx=None, holds_mamba=False))
    print("init_load_back:", cache.init_load_back(S.InitLoadBackParams(
        best_match_node=m.best_match_node, host_hit_length=m.host_hit_length, mem_quota=None,
        req=req)))
    cache.ready_to_load_host_cache()
    print("load submitted:", engine.log[-1])
    cache.loading_check()
    print("match a after the load:", describe(cache.match_prefix(S.MatchPrefixParams(key=key(a)))))
    other = CT.SWA if component == "swa" else CT.MAMBA
    cache.evict(S.EvictParams(num_tokens=64, mamba_num=8) if component == "mamba"
                else S.EvictParams(num_tokens=64))
    print(f"evict_host(1, {other.name}):", cache.evict_host(1, other))
    print("evict_host(64):", cache.evict_host(64))
    print("match a at the end:", describe(cache.match_prefix(S.MatchPrefixParams(key=key(a)))))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--component", choices=("swa", "mamba"), required=True)
    ap.add_argument("--core", choices=("python", "rust"), default="python")
    ap.add_argument("--page", type=int, default=1)
    args = ap.parse_args(argv)
    run(args.component, args.core, args.page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
