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
