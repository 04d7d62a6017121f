"""``flatradix compile``: build every kernel into Numba's cache ahead of time.

A fresh environment compiles each kernel at its first call (a minute or more on
a small machine, the first time a program uses a feature). For container
images, CI and shared installs, ``flatradix compile`` runs small workloads that
reach every kernel -- the Full-only cache, SWA, Mamba, the host tier with each
of them, and every replay mode -- in parallel processes (``--jobs``, default:
one per CPU core, at most one per workload), so that later processes only load
them from the cache (``flatradix._numba_env``: ``$NUMBA_CACHE_DIR/flatradix/...``,
else ``~/.cache/flatradix/numba/...``; keyed by the kernels' source, so an
upgrade compiles again).

Usage::

    flatradix compile [--jobs N] [--only GROUP[,GROUP...]] [--list]

Exit status 0 when every workload ran, 1 when one failed (its error is shown).
The workloads are plain public-API calls (:data:`GROUPS`); running one in a
process whose cache is warm takes about a second.
"""

import argparse
import json
import os
import subprocess
import sys
import time

# --------------------------------------------------------------------- workloads
# Each reaches a part of the kernels through the public API with tiny sizes; the
# union reaches every entry kernel (tests/test_precompile.py checks that a
# workload covering every public operation compiles nothing afterwards).


def _full():
    from array import array

    import numpy as np

    import flatradix as F

    CT = F.ComponentType
    for page, eagle, events in ((1, False, True), (16, False, False), (1, True, True)):
        alloc = F.TokenToKVPoolAllocator(4096, page_size=page)
        rtp = F.ReqToTokenPool(8, 512)
        c = F.UnifiedRadixCache(page_size=page, token_to_kv_pool_allocator=alloc,
                                req_to_token_pool=rtp, is_eagle=eagle,
                                enable_kv_cache_events=events)
        for i, make in enumerate((list, np.array, lambda x: array("q", x))):
            toks = [1, 2, 3] * (8 * page) + [i]
            v = alloc.alloc(len(toks) - (1 if eagle else 0))
            c.insert(F.InsertParams(key=F.RadixKey(make(toks)), value=v,
                                    track_adopted_ranges=True))
            m = c.match_prefix(F.MatchPrefixParams(key=F.RadixKey(make(toks))))
            r = c.inc_lock_ref(m.last_device_node)
            c.dec_lock_ref(m.last_device_node, r)
            c.path_device_indices(m.last_device_node)
            ms = c.match_prefix_batch([F.RadixKey(make(toks)), F.RadixKey(make(toks[:5]))])
            c.unlock_batch(c.lock_batch([x.last_device_node for x in ms]))
            c.unlock(c.lock(m.last_device_node))
        row = rtp.alloc(1)[0]
        prompt = array("q", [7, 8, 9] * (6 * page))
        n = len(prompt)
        rtp.req_to_token[row, :n] = alloc.alloc(n)
        req = F.Req(origin_input_ids=prompt, req_pool_idx=row, kv_committed_len=n,
                    kv_allocated_len=n)
        c.cache_unfinished_req(req)
        c.cache_finished_req(req)
        c.evict_device_start(CT.FULL, 8)
        c.evict_device_next_node(CT.FULL)
        c.evict_device_end(CT.FULL)
        c.evict(F.EvictParams(num_tokens=1 << 20))
        c.sanity_check()
        c.reset()
    # a gap pass, a pool compaction in place and into a larger pool, node-table and
    # child-table growth
    c = F.UnifiedRadixCache(page_size=1, pool_capacity=64)
    for i in range(5):
        if i == 4:
            c.evict(F.EvictParams(num_tokens=32))
        c.insert(F.InsertParams(key=F.RadixKey(list(range(100 * i, 100 * i + 16))),
                                value=np.arange(1, 17, dtype=np.int64)))
    c = F.UnifiedRadixCache(page_size=1, pool_capacity=64, node_capacity=16)
    for i in range(40):
        c.insert(F.InsertParams(key=F.RadixKey([10_000 + i] + [i] * 7),
                                value=np.arange(1, 9, dtype=np.int64)))
        if i % 5 == 4:
            c.evict(F.EvictParams(num_tokens=8))
    c.sanity_check()
    for policy in ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru", "tlru"):
        c = F.UnifiedRadixCache(page_size=1, eviction_policy=policy)
        for i in range(3):
            c.insert(F.InsertParams(key=F.RadixKey([i, i + 1, i + 2]),
                                    value=np.arange(1, 4, dtype=np.int64), priority=i))
        c.match_prefix(F.MatchPrefixParams(key=F.RadixKey([0, 1])))
        c.evict(F.EvictParams(num_tokens=6))


def _swa():
    import flatradix as F

    CT = F.ComponentType
    for page in (1, 16):
        alloc = F.SWATokenToKVPoolAllocator(4096, 4096, page_size=page)
        rtp = F.ReqToTokenPool(8, 512)
        c = F.UnifiedRadixCache(page_size=page, tree_components=(CT.FULL, CT.SWA),
                                sliding_window_size=16, token_to_kv_pool_allocator=alloc,
                                req_to_token_pool=rtp, enable_kv_cache_events=True)
        toks = list(range(1, 8 * page + 40))
        v = alloc.alloc(len(toks))
        alloc.free_swa(v[:page])
        p = F.InsertParams(key=F.RadixKey(toks), value=v, track_adopted_ranges=True)
        p.set_evicted_seqlen(CT.SWA, page)
        c.insert(p)
        m = c.match_prefix(F.MatchPrefixParams(key=F.RadixKey(toks)))
        lk = c.lock(m.last_device_node)
        c.release_swa(lk)
        c.unlock(lk)
        c.unlock_batch(c.lock_batch([m.last_device_node]))
        c.match_prefix_batch([F.RadixKey(toks)])
        r = c.inc_lock_ref(m.last_device_node)
        c.dec_lock_ref(m.last_device_node, r)
        row = rtp.alloc(1)[0]
        prompt = list(range(500, 500 + 6 * page + 30))
        n = len(prompt)
        rtp.req_to_token[row, :n] = alloc.alloc(n)
        req = F.Req(origin_input_ids=prompt, req_pool_idx=row, kv_committed_len=n,
                    kv_allocated_len=n)
        c.cache_unfinished_req(req)
        c.evict_sliding_windows(req, n - 1)
        c.cache_finished_req(req)
        c.evict_device_start(CT.SWA, 8)
        c.evict_device_next_node(CT.SWA)
        c.evict_device_end(CT.SWA)
        c.evict(F.EvictParams(num_tokens=8, swa_num_tokens=1 << 20))
        c.sanity_check()


def _mamba_cache(page, extra, per_path):
    """A Full + Mamba cache with events on, its allocator and its request pool."""
    import flatradix as F

    alloc = F.TokenToKVPoolAllocator(4096, page_size=page)
    rtp = F.HybridReqToTokenPool(8, 512, mamba_size=16, enable_mamba_extra_buffer=extra)
    c = F.UnifiedRadixCache(page_size=page, tree_components=(F.ComponentType.FULL,
                                                             F.ComponentType.MAMBA),
                            token_to_kv_pool_allocator=alloc, req_to_token_pool=rtp,
                            enable_mamba_extra_buffer=extra, enable_kv_cache_events=True,
                            mamba_max_states_per_path=per_path)
    return c, alloc, rtp


def _mamba():
    import flatradix as F

    CT = F.ComponentType
    for page, extra in ((1, False), (16, True)):
        c, alloc, rtp = _mamba_cache(page, extra, 2)
        toks = list(range(1, 4 * page + 1))
        for key in (toks, toks + list(range(500, 500 + page)),
                    toks + list(range(500, 500 + 2 * page))):
            c.insert(F.InsertParams(key=F.RadixKey(key), value=alloc.alloc(len(key)),
                                    mamba_value=rtp.mamba_allocator.alloc(1)))
        m = c.match_prefix(F.MatchPrefixParams(key=F.RadixKey(toks)))
        lk = c.lock(m.last_device_node, skip_lock_components=(CT.MAMBA,))
        c.unlock(lk)
        c.unlock(c.lock(m.last_device_node))
        c.evict_device_start(CT.MAMBA, 1)
        c.evict_device_next_node(CT.MAMBA)
        c.evict_device_end(CT.MAMBA)
        c.evict(F.EvictParams(num_tokens=0, mamba_num=1))
        c.evict(F.EvictParams(num_tokens=1 << 20, mamba_num=1 << 20))
        c.sanity_check()
    # the SWA + Mamba tree
    alloc = F.SWATokenToKVPoolAllocator(4096, 4096)
    rtp = F.HybridReqToTokenPool(8, 512, mamba_size=16)
    c = F.UnifiedRadixCache(tree_components=(CT.FULL, CT.SWA, CT.MAMBA), sliding_window_size=4,
                            token_to_kv_pool_allocator=alloc, req_to_token_pool=rtp)
    for key in ([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]):
        c.insert(F.InsertParams(key=F.RadixKey(key), value=alloc.alloc(len(key)),
                                mamba_value=rtp.mamba_allocator.alloc(1)))
    m = c.match_prefix(F.MatchPrefixParams(key=F.RadixKey([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])))
    c.unlock(c.lock(m.last_device_node))
    c.evict(F.EvictParams(num_tokens=2, swa_num_tokens=4, mamba_num=1))
    c.sanity_check()


def _host():
    import flatradix as F

    for page in (1, 16):
        alloc = F.TokenToKVPoolAllocator(4096, page_size=page)
        c = F.UnifiedRadixCache(page_size=page, token_to_kv_pool_allocator=alloc,
                                enable_kv_cache_events=True)
        c.init_hicache(host_size=4096, load_back_threshold=1,
                       transfer=lambda kind, dev, host: None)
        toks = list(range(1, 4 * page + 1))
        c.insert(F.InsertParams(key=F.RadixKey(toks), value=alloc.alloc(len(toks))))
        c.check_hicache_events()
        c.evict(F.EvictParams(num_tokens=1 << 20))
        m = c.match_prefix(F.MatchPrefixParams(key=F.RadixKey(toks)))
        c.match_prefix_batch([F.RadixKey(toks)])
        c.init_load_back(F.InitLoadBackParams(m.best_match_node, m.host_hit_length))
        c.ready_to_load_host_cache()
        c.loading_check()
        c.evict(F.EvictParams(num_tokens=1 << 20))
        c.evict_host(1 << 20)
        h = c.mem_pool_host.alloc(len(toks))
        r = c.insert_host(c.root_node_handle(), F.RadixKey(toks), h)
        c.mem_pool_host.free(h[:r.prefix_len])
        c.sanity_check()
        alloc = F.TokenToKVPoolAllocator(4096, page_size=page)
        c = F.UnifiedRadixCache(page_size=page, token_to_kv_pool_allocator=alloc,
                                enable_kv_cache_events=True)
        c.init_hicache(host_size=4 * page, hicache_write_policy="write_back")
        c.insert(F.InsertParams(key=F.RadixKey(toks), value=alloc.alloc(len(toks))))
        c.evict(F.EvictParams(num_tokens=1 << 20))
        m = c.match_prefix(F.MatchPrefixParams(key=F.RadixKey(toks)))
        hl = c.inc_host_lock_ref(m.best_match_node)
        other = [t + 1000 for t in toks]
        c.insert(F.InsertParams(key=F.RadixKey(other), value=alloc.alloc(len(other))))
        c.evict(F.EvictParams(num_tokens=1 << 20))
        c.dec_host_lock_ref(m.best_match_node, hl)
        c.evict_host(1 << 20)
        c.sanity_check()
    # loading_check after a caller released a load-back's own path lock (load_ack)
    alloc = F.TokenToKVPoolAllocator(64)
    c = F.UnifiedRadixCache(token_to_kv_pool_allocator=alloc)
    c.init_hicache(host_size=32, load_back_threshold=1)
    c.insert(F.InsertParams(key=F.RadixKey(list(range(10))), value=alloc.alloc(10)))
    c.check_hicache_events()
    c.evict(F.EvictParams(num_tokens=10))
    m = c.match_prefix(F.MatchPrefixParams(key=F.RadixKey(list(range(10)))))
    c.init_load_back(F.InitLoadBackParams(m.best_match_node, 10))
    c.dec_lock_ref(m.best_match_node)
    c.ready_to_load_host_cache()
    try:
        c.loading_check()
    except F.LockRefError:
        pass


def _host_mamba():
    from types import SimpleNamespace

    import flatradix as F

    CT = F.ComponentType
    for page, extra in ((1, False), (16, True)):
        c, alloc, rtp = _mamba_cache(page, extra, 4)
        c.init_hicache(host_size=4096, mamba_host_size=16, load_back_threshold=1,
                       transfer=lambda kind, dev, host: None)
        toks = list(range(1, 4 * page + 1))
        for key in (toks, toks + list(range(500, 500 + page))):
            c.insert(F.InsertParams(key=F.RadixKey(key), value=alloc.alloc(len(key)),
                                    mamba_value=rtp.mamba_allocator.alloc(1)))
        c.check_hicache_events()
        c.evict(F.EvictParams(num_tokens=0, mamba_num=1))
        c.evict(F.EvictParams(num_tokens=page, mamba_num=0))
        m = c.match_prefix(F.MatchPrefixParams(key=F.RadixKey(toks)))
        hl = c.inc_host_lock_ref(m.best_match_node)
        c.dec_host_lock_ref(m.best_match_node, hl)
        req = SimpleNamespace(last_node=m.last_device_node,
                              mamba_host_hit_length=m.mamba_host_hit_length,
                              kv=SimpleNamespace(mamba_pool_idx=None))
        c.init_load_back(F.InitLoadBackParams(m.best_match_node, m.host_hit_length, None, req))
        c.check_hicache_events()
        c.evict(F.EvictParams(num_tokens=1 << 20, mamba_num=1 << 20))
        c.evict_host(1, CT.MAMBA)
        c.evict_host(1 << 20)
        h = c.mem_pool_host.alloc(len(toks))
        r = c.insert_host(c.root_node_handle(), F.RadixKey(toks), h,
                          mamba_host_value=int(c.mamba_pool_host.alloc(1)[0]))
        c.mem_pool_host.free(h if r.host_insert_dropped else h[:r.prefix_len])
        c.sanity_check()
    for step in (False, True):
        alloc = F.TokenToKVPoolAllocator(4096)
        rtp = F.HybridReqToTokenPool(8, 512, mamba_size=16)
        c = F.UnifiedRadixCache(tree_components=(CT.FULL, CT.MAMBA),
                                token_to_kv_pool_allocator=alloc, req_to_token_pool=rtp)
        c.init_hicache(host_size=4096, mamba_host_size=16, hicache_write_policy="write_back")
        for key in ([1, 2, 3, 4], [1, 2, 3, 4, 5, 6]):
            c.insert(F.InsertParams(key=F.RadixKey(key), value=alloc.alloc(len(key)),
                                    mamba_value=rtp.mamba_allocator.alloc(1)))
        if step:
            c.evict_device_start(CT.MAMBA, 2)
            c.evict_device_next_node(CT.MAMBA)
            c.evict_device_next_node(CT.MAMBA)
            c.evict_device_end(CT.MAMBA)
        else:
            c.evict(F.EvictParams(num_tokens=0, mamba_num=2))
        c.sanity_check()


def _host_swa():
    from types import SimpleNamespace

    import flatradix as F

    CT = F.ComponentType
    for page in (1, 16):
        alloc = F.SWATokenToKVPoolAllocator(4096, 4096, page_size=page)
        c = F.UnifiedRadixCache(page_size=page, tree_components=(CT.FULL, CT.SWA),
                                sliding_window_size=2 * page, token_to_kv_pool_allocator=alloc,
                                enable_kv_cache_events=True)
        c.init_hicache(host_size=4096, swa_host_size=4096, load_back_threshold=1,
                       transfer=lambda kind, dev, host: None)
        toks = list(range(1, 4 * page + 1))
        for key in (toks, toks + list(range(500, 500 + 2 * page))):
            c.insert(F.InsertParams(key=F.RadixKey(key), value=alloc.alloc(len(key))))
        c.check_hicache_events()
        c.evict(F.EvictParams(num_tokens=0, swa_num_tokens=page))
        c.evict_host(page, CT.SWA)
        c.insert(F.InsertParams(key=F.RadixKey(toks), value=alloc.alloc(len(toks))))
        c.check_hicache_events()
        c.evict(F.EvictParams(num_tokens=1 << 20, swa_num_tokens=1 << 20))
        for _ in range(2):
            m = c.match_prefix(F.MatchPrefixParams(key=F.RadixKey(toks)))
            hl = c.inc_host_lock_ref(m.best_match_node)
            c.dec_host_lock_ref(m.best_match_node, hl)
            req = SimpleNamespace(last_node=m.last_device_node,
                                  swa_host_hit_length=m.swa_host_hit_length)
            c.init_load_back(F.InitLoadBackParams(m.best_match_node, m.host_hit_length, None,
                                                  req))
            c.check_hicache_events()
            c.evict(F.EvictParams(num_tokens=0, swa_num_tokens=1 << 20))
        c.evict_host(1 << 20, CT.SWA)
        c.evict(F.EvictParams(num_tokens=1 << 20, swa_num_tokens=1 << 20))
        c.evict_host(1 << 20)
        h = c.mem_pool_host.alloc(len(toks))
        r = c.insert_host(c.root_node_handle(), F.RadixKey(toks), h,
                          swa_host_value=c.swa_pool_host.alloc(2 * page))
        c.mem_pool_host.free(h if r.host_insert_dropped else h[:r.prefix_len])
        c.sanity_check()
    for step in (False, True):
        alloc = F.SWATokenToKVPoolAllocator(4096, 4096)
        c = F.UnifiedRadixCache(tree_components=(CT.FULL, CT.SWA), sliding_window_size=8,
                                token_to_kv_pool_allocator=alloc)
        c.init_hicache(host_size=4096, swa_host_size=4096, hicache_write_policy="write_back")
        for key in (list(range(1, 9)), list(range(1, 13))):
            c.insert(F.InsertParams(key=F.RadixKey(key), value=alloc.alloc(len(key))))
        if step:
            c.evict_device_start(CT.SWA, 4)
            while c.evict_device_next_node(CT.SWA).made_progress:
                pass
            c.evict_device_end(CT.SWA)
        else:
            c.evict(F.EvictParams(num_tokens=0, swa_num_tokens=4))
        c.evict(F.EvictParams(num_tokens=4))
        c.sanity_check()


def _treecore():
    """The kernels only SGLang's controller reaches through the TreeCore plug-in
    (flatradix.sglang): pick-then-evict and one component's tombstone, driven
    through the core API as the plug-in drives them (no SGLang import)."""
    import numpy as np

    import flatradix as F
    from .kernels import layout as L

    CT = F.ComponentType
    alloc = F.SWATokenToKVPoolAllocator(256, 256, page_size=1)
    rtp = F.HybridReqToTokenPool(4, 64, mamba_size=8)
    c = F.UnifiedRadixCache(page_size=1, components=(CT.FULL, CT.SWA, CT.MAMBA),
                            sliding_window_size=4, token_to_kv_pool_allocator=alloc,
                            req_to_token_pool=rtp)
    for i in range(3):
        key = [1, 2, 3, 4] + [10 + i] * 4
        p = F.InsertParams(key=F.RadixKey(key), value=alloc.alloc(len(key)),
                           mamba_value=rtp.mamba_allocator.alloc(1))
        if c.insert(p).mamba_exist:
            rtp.mamba_allocator.free(p.mamba_value)
    k = c._engine.k
    leaf = c.match_prefix(F.MatchPrefixParams(key=F.RadixKey([1, 2, 3, 4, 10, 10, 10, 10])))
    k.evict_component_at(leaf.last_device_node, L.SWA)
    k.evict_start(L.FULL, 8)
    st, nid, *_ = k.evict_pick(L.FULL, 0)
    if st == L.OK and nid >= 0:
        k.evict_leaf_at(nid)
    k.evict_end(L.FULL)


def _replay(kinds):
    def run():
        import numpy as np

        from .replay.sim import warm_up
        from .replay.stats import describe_workload
        from .replay.trace import Workload

        for kw in kinds:
            warm_up(**kw)
        if {} in kinds:
            tiny = Workload("warm-up", 4, np.zeros(2), np.array([8, 7], dtype=np.int64),
                            np.full(2, 2, dtype=np.int64), np.array([0, 2, 4], dtype=np.int64),
                            np.array([0, 1, 0, 2], dtype=np.int64))
            describe_workload(tiny)
    return run


def _device():
    """Device values (the device value arena on CPU tensors); nothing without torch."""
    try:
        import torch
    except ImportError:
        return
    from . import InsertParams, MatchPrefixParams, RadixKey, UnifiedRadixCache

    c = UnifiedRadixCache(page_size=1, device_values=True)
    c.insert(InsertParams(key=RadixKey([1, 2, 3]), value=torch.tensor([4, 5, 6])))
    c.insert(InsertParams(key=RadixKey([1, 2, 7]), value=torch.tensor([4, 5, 8])))
    c.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 7])))
    c.evict(8)
    c.sanity_check()


#: name -> (what it covers, workload); ordered from the longest to compile
GROUPS = {
    "full": ("the Full-attention cache: every operation, events, EAGLE, growth, policies",
             _full),
    "replay": ("the replay: Full-only, SWA, Mamba (with and without the extra buffer), "
               "SWA + Mamba, trace statistics",
               _replay([{}, {"swa": True}, {"mamba": True}, {"mamba": True, "extra": True},
                        {"swa": True, "mamba": True}])),
    "replay-host": ("the replay with a host tier, Full-only and hybrid",
                    _replay([{"host": True}, {"host": True, "swa": True},
                             {"host": True, "mamba": True},
                             {"host": True, "swa": True, "mamba": True}])),
    "swa": ("the SWA cache (Full + SWA)", _swa),
    "mamba": ("the Mamba caches (Full + Mamba, extra buffer, Full + SWA + Mamba)", _mamba),
    "host": ("the host tier (HiCache) of a Full cache: write-through and write-back", _host),
    "host-swa": ("the host tier of an SWA cache", _host_swa),
    "host-mamba": ("the host tier of a Mamba cache", _host_mamba),
    "treecore": ("the SGLang TreeCore plug-in's pick-then-evict kernels", _treecore),
    "device": ("device values (the device value arena; needs torch)", _device),
}


def _worker(name):
    """Run one workload in this process; print its compile counters as JSON."""
    from . import _compile_notice

    t = time.perf_counter(), time.process_time()
    GROUPS[name][1]()
    s = _compile_notice.stats()
    s.update(group=name, process_wall=time.perf_counter() - t[0],
             process_cpu=time.process_time() - t[1])
    print(json.dumps(s))


# --------------------------------------------------------------------- command

def add_parser(sub):
    """Add the ``compile`` subcommand to ``flatradix``'s subparsers."""
    p = sub.add_parser("compile", help="compile every kernel into Numba's cache ahead of time",
                       description=__doc__.split("\n\n")[1].replace("\n", " "),
                       allow_abbrev=False)
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="workloads run at once, each in its own process (default: one per "
                        "CPU core)")
    p.add_argument("--only", metavar="GROUP[,GROUP...]",
                   help=f"run these workloads only: {', '.join(GROUPS)}")
    p.add_argument("--list", action="store_true", help="list the workloads and exit")
    return p


def _cpu_count():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def run(args):
    """Run ``flatradix compile`` with parsed ``args``; returns the exit status."""
    from ._numba_env import CACHE_DIR

    if args.list:
        for name, (what, _) in GROUPS.items():
            print(f"{name:12} {what}")
        return 0
    names = list(GROUPS)
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        bad = [n for n in names if n not in GROUPS]
        if bad or not names:
            print(f"flatradix compile: error: --only: unknown workload(s) "
                  f"{', '.join(bad) or repr(args.only)}; known: {', '.join(GROUPS)}",
                  file=sys.stderr)
            return 2
    if args.jobs is not None and args.jobs < 1:
        print(f"flatradix compile: error: --jobs must be >= 1, got {args.jobs}", file=sys.stderr)
        return 2
    jobs = min(args.jobs or _cpu_count(), len(names))
    # the Full-only workload first, alone: every other one calls its kernels, so
    # running it beside them would compile those kernels in every process at once
    stages = [names]
    if "full" in names and len(names) > 1 and jobs > 1:
        stages = [["full"], [n for n in names if n != "full"]]
    print(f"flatradix compile: {_n(len(names), 'workload')}, {jobs} at a time"
          + (" (the Full-only one first)" if len(stages) > 1 else "") + f", into {CACHE_DIR}",
          file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    running = []   # (name, Popen, stdout file, stderr file, start time)
    import signal

    def _term(signum, frame):          # a SIGTERM stops the workers too
        raise KeyboardInterrupt
    old_term = signal.signal(signal.SIGTERM, _term) if _main_thread() else None
    failed, total = [], {"compiles": 0, "cpu": 0.0}
    try:
        for stage in stages:
            queue = list(stage)
            while queue or running:
                while queue and len(running) < jobs:
                    running.append(_start(queue.pop(0)))
                time.sleep(0.05)
                for job in [j for j in running if j[1].poll() is not None]:
                    running.remove(job)
                    _report(job, failed, total)
    except KeyboardInterrupt:
        for _, proc, out, err, _ in running:
            proc.kill()
            proc.wait()
            out.close()
            err.close()
        print("flatradix compile: interrupted (what finished is cached)", file=sys.stderr)
        return 130
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
    wall = time.perf_counter() - t0
    print(f"flatradix compile: {'FAILED: ' + ', '.join(failed) if failed else 'done'}; "
          f"{total['compiles']} functions compiled in {wall:.1f} s (CPU {total['cpu']:.1f} s "
          f"in {_n(len(names), 'process', 'es')})", file=sys.stderr, flush=True)
    return 1 if failed else 0


def _main_thread():
    import threading

    return threading.current_thread() is threading.main_thread()


def _n(k, word, plural="s"):
    return f"{k} {word}" + ("" if k == 1 else plural)


def _start(name):
    import tempfile

    env = dict(os.environ, FLATRADIX_QUIET_COMPILE="1")
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    proc = subprocess.Popen([sys.executable, "-c",
                             f"from flatradix.precompile import _worker; _worker({name!r})"],
                            env=env, stdout=out, stderr=err, text=True)
    return name, proc, out, err, time.perf_counter()


def _report(job, failed, total):
    name, proc, out, err, t0 = job
    wall = time.perf_counter() - t0
    out.seek(0)
    err.seek(0)
    stdout, stderr = out.read(), err.read()
    out.close()
    err.close()
    if proc.returncode != 0:
        failed.append(name)
        tail = "\n".join(stderr.strip().splitlines()[-15:])
        print(f"  {name:12} FAILED (exit status {proc.returncode}):\n{tail}",
              file=sys.stderr, flush=True)
        return
    s = json.loads(stdout.strip().splitlines()[-1])
    total["compiles"] += s["compiles"]
    total["cpu"] += s["process_cpu"]
    print(f"  {name:12} {s['compiles']:4d} functions compiled, {wall:6.1f} s (CPU "
          f"{s['process_cpu']:.1f} s)", file=sys.stderr, flush=True)


def main(argv=None):
    """``python -m flatradix.precompile``: the same as ``flatradix compile``."""
    p = argparse.ArgumentParser(prog="flatradix", allow_abbrev=False)
    add_parser(p.add_subparsers(dest="command"))
    return run(p.parse_args(["compile"] + list(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    sys.exit(main())
