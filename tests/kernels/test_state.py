"""Kernel-level tests of slots, handles, growth and pool compaction."""

import numpy as np

from flatradix import EvictParams, InsertParams, MatchPrefixParams, RadixKey, UnifiedRadixCache
from flatradix.kernels import layout as L


def test_slot_reuse_bumps_generation_and_old_ids_go_stale():
    c = UnifiedRadixCache(page_size=1, node_capacity=4)
    a = c.insert(InsertParams(key=RadixKey([1, 2]))).last_device_node
    c.evict(EvictParams(num_tokens=2))
    b = c.insert(InsertParams(key=RadixKey([3, 4]))).last_device_node
    assert a & 0xFFFFFFFF == b & 0xFFFFFFFF  # same slot (LIFO free list) ...
    assert a >> 32 != b >> 32                 # ... new generation
    assert c.node_info(b)["key"].tolist() == [3, 4]
    c.sanity_check()


def test_growth_of_every_array_keeps_the_tree():
    c = UnifiedRadixCache(page_size=2, node_capacity=4, pool_capacity=64)
    rng = np.random.default_rng(1)
    keys = [rng.integers(0, 4, size=int(rng.integers(2, 40))).tolist() for _ in range(300)]
    for i, k in enumerate(keys):
        c.insert(InsertParams(key=RadixKey(k), value=np.arange(len(k)) + 1000 * i))
    c.sanity_check()
    assert c._engine.st.nodes.shape[0] > 4 and c._engine.st.pool.shape[0] > 64
    for i, k in enumerate(keys):
        m = c.match_prefix(MatchPrefixParams(key=RadixKey(k)))
        assert m.device_prefix_len == len(k) - len(k) % 2


def test_compaction_reclaims_dead_rows_under_churn():
    c = UnifiedRadixCache(page_size=1, pool_capacity=1024)
    rng = np.random.default_rng(2)
    for step in range(3000):
        k = rng.integers(0, 1000, size=50)
        c.insert(InsertParams(key=RadixKey(k), value=np.arange(50) + step * 50))
        if c.total_size()[0] > 500:
            c.evict(EvictParams(num_tokens=200))
    c.sanity_check()
    # live data stays bounded, so the pool must not grow without bound
    assert c._engine.st.pool.shape[0] <= 4096
    assert c._engine.meta[L.M_POOL_TOP] - c._engine.meta[L.M_POOL_DEAD] == c.total_size()[0]
    assert c._engine.st.nodes.shape[0] <= 1024


def test_reset_makes_every_id_stale_and_keeps_capacity():
    c = UnifiedRadixCache(page_size=1)
    ids = [c.insert(InsertParams(key=RadixKey([i, i + 1]))).last_device_node for i in range(0, 20, 2)]
    cap = c._engine.st.nodes.shape[0]
    c.reset()
    assert c.node_count() == 0 and c.total_size() == (0, 0)
    for nid in ids:
        try:
            c.inc_lock_ref(nid)
        except KeyError:
            continue
        raise AssertionError("stale id accepted after reset")
    assert c._engine.st.nodes.shape[0] == cap
    c.sanity_check()


def test_the_pool_is_sized_from_the_allocator_and_never_grows_for_its_tokens():
    # pool_capacity left out: twice the allocator's Full slots (SWA: size_full), within
    # [2**16, 2**23]; caching the whole KV pool over and over (churn through eviction)
    # only compacts in place, the array is never replaced
    from flatradix import ComponentType, SWATokenToKVPoolAllocator, TokenToKVPoolAllocator
    from flatradix.config import POOL_CAPACITY_AUTO_MAX, POOL_CAPACITY_DEFAULT

    assert UnifiedRadixCache()._engine.st.pool.shape[0] == POOL_CAPACITY_DEFAULT
    assert UnifiedRadixCache(token_to_kv_pool_allocator=TokenToKVPoolAllocator(
        100))._engine.st.pool.shape[0] == POOL_CAPACITY_DEFAULT
    swa = SWATokenToKVPoolAllocator(50_000, 1_000)
    assert UnifiedRadixCache(
        token_to_kv_pool_allocator=swa,
        tree_components=(ComponentType.FULL, ComponentType.SWA),
        sliding_window_size=8)._engine.st.pool.shape[0] == 100_000
    big = TokenToKVPoolAllocator(1 << 24)
    assert UnifiedRadixCache(token_to_kv_pool_allocator=big)._engine.st.pool.shape[0] == \
        POOL_CAPACITY_AUTO_MAX
    assert UnifiedRadixCache(token_to_kv_pool_allocator=big, pool_capacity=64
                             )._engine.st.pool.shape[0] == 64

    class Failing(TokenToKVPoolAllocator):   # a size the cache cannot read: the default
        @property
        def size_full(self):
            raise RuntimeError("not ready")

    assert UnifiedRadixCache(token_to_kv_pool_allocator=Failing(1 << 20)
                             )._engine.st.pool.shape[0] == 2 << 20
    alloc = TokenToKVPoolAllocator(40_000)
    c = UnifiedRadixCache(token_to_kv_pool_allocator=alloc)
    pool = c._engine.st.pool
    assert pool.shape[0] == 80_000
    rng = np.random.default_rng(3)
    for step in range(400):
        k = rng.integers(0, 1 << 20, size=int(rng.integers(500, 3000)))
        v = alloc.alloc(k.size)
        if v is None:
            c.evict(EvictParams(num_tokens=k.size - alloc.available_size()))
            v = alloc.alloc(k.size)
        c.insert(InsertParams(key=RadixKey(k), value=v))
    assert c._engine.st.pool is pool               # compacted in place, never replaced
    assert int(c._engine.st.meta[L.M_POOL_TOP]) < 80_000
    c.sanity_check()
