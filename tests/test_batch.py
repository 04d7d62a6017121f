"""Batched calls (flatradix extensions): ``match_prefix_batch``, ``inc/dec_lock_ref_batch``,
``lock_batch`` / ``unlock_batch`` give exactly what the single calls give, in
order, with the same effects; bad input and failing releases change nothing."""

import random

import numpy as np
import pytest

from flatradix import (ComponentType, EvictParams, InsertParams, LockRefError, MatchPrefixParams,
                       NodeAccessError, RadixKey, SWATokenToKVPoolAllocator, UnifiedRadixCache)

from .conftest import assert_state_equal

SWA = ComponentType.SWA


def _pair(page, swa):
    def make():
        if swa:
            alloc = SWATokenToKVPoolAllocator(1 << 14, 1 << 14, page_size=page)
            return UnifiedRadixCache(page_size=page, tree_components=(ComponentType.FULL, SWA),
                                     sliding_window_size=3 * page, token_to_kv_pool_allocator=alloc)
        return UnifiedRadixCache(page_size=page)
    return make(), make()


def _fill(c, rng, prompts, page):
    alloc = c.token_to_kv_pool_allocator
    for p in prompts:
        v = alloc.alloc(len(p)) if alloc is not None else np.arange(len(p)) + rng.randrange(1 << 20)
        c.insert(InsertParams(key=RadixKey(p), value=v))


def _same(a, b):
    assert a.device_prefix_len == b.device_prefix_len
    assert np.asarray(a.device_indices).tolist() == np.asarray(b.device_indices).tolist()
    assert a[1:] == b[1:]


@pytest.mark.parametrize("page,swa", [(1, False), (4, False), (1, True), (4, True)])
def test_match_batch_equals_single_calls_in_order(page, swa):
    rng = random.Random(page * 10 + swa)
    batch, single = _pair(page, swa)
    base = [[rng.randint(1, 4) for _ in range(rng.randint(1, 40))] for _ in range(30)]
    for c in (batch, single):
        _fill(c, random.Random(1), base, page)
        if swa:
            c.evict(EvictParams(swa_num_tokens=20))  # tombstones: windows that fail
    for _ in range(20):
        keys = []
        for _ in range(rng.randint(0, 12)):
            k = rng.choice(base)[: rng.randint(0, 40)] + [rng.randint(1, 4)] * rng.randint(0, 5)
            ek = rng.choice((None, None, "other"))
            # token containers: the batch's inline path (int64 numpy, also a strided
            # view) and the general one (list, int32)
            kind = rng.randrange(4)
            if kind == 1:
                k = np.array(k, dtype=np.int64)
            elif kind == 2:
                k = np.repeat(np.array(k, dtype=np.int64), 2)[::2]
            elif kind == 3:
                k = np.array(k, dtype=np.int32)
            keys.append(MatchPrefixParams(key=RadixKey(k, extra_key=ek)) if rng.random() < 0.5
                        else RadixKey(k, extra_key=ek))
        got = batch.match_prefix_batch(keys)
        want = [single.match_prefix(k) for k in keys]
        assert len(got) == len(want)
        for a, b in zip(got, want):
            _same(a, b)
        batch.sanity_check()
        # the splits and the recency the batch made are the single calls' too
        eb, es = batch.evict(EvictParams(num_tokens=7)), single.evict(EvictParams(num_tokens=7))
        assert eb.num_tokens_evicted == es.num_tokens_evicted
        if eb.evicted_indices is not None:
            assert eb.evicted_indices.tolist() == es.evicted_indices.tolist()
        assert batch.total_size() == single.total_size()


def test_match_batch_bad_key_changes_nothing():
    c = UnifiedRadixCache(page_size=1)
    c.insert(InsertParams(key=RadixKey([1, 2, 3]), value=np.array([5, 6, 7])))
    before = c._snapshot()
    with pytest.raises(TypeError, match=r"params\[1\].key"):
        c.match_prefix_batch([RadixKey([1, 2, 3]), [1, 2]])
    with pytest.raises(TypeError, match="params must be a list"):
        c.match_prefix_batch(RadixKey([1, 2]))
    assert_state_equal(before, c._snapshot())
    assert c.match_prefix_batch([]) == []


@pytest.mark.parametrize("swa", [False, True])
def test_lock_batches_equal_single_calls_and_are_all_or_nothing(swa):
    rng = random.Random(7)
    batch, single = _pair(1, swa)
    base = [[rng.randint(1, 3) for _ in range(rng.randint(2, 30))] for _ in range(25)]
    for c in (batch, single):
        _fill(c, random.Random(2), base, 1)
    nodes = [batch.match_prefix(RadixKey(p)).last_device_node for p in base[:10]]
    assert nodes == [single.match_prefix(RadixKey(p)).last_device_node for p in base[:10]]
    rb = batch.inc_lock_ref_batch(nodes)
    rs = [single.inc_lock_ref(n) for n in nodes]
    assert [r.delta for r in rb] == [r.delta for r in rs]
    assert [dict(r.component_lock_uuids) for r in rb] == [dict(r.component_lock_uuids) for r in rs]
    assert (batch.protected_size(), batch.swa_protected_size()) == (
        single.protected_size(), single.swa_protected_size())
    # a release that fails half-way (the first node twice, locked once) undoes the batch
    before = batch._snapshot()
    with pytest.raises(LockRefError, match=rf"nodes\[{len(nodes)}\]"):
        batch.dec_lock_ref_batch(nodes + nodes[:1], rb + rb[:1])
    assert_state_equal(before, batch._snapshot())
    with pytest.raises(NodeAccessError, match=r"nodes\[1\]"):
        batch.inc_lock_ref_batch([nodes[0], (1 << 40) | 3])
    assert_state_equal(before, batch._snapshot())
    batch.dec_lock_ref_batch(nodes, rb)
    for n, r in zip(nodes, rs):
        single.dec_lock_ref(n, r)
    assert batch.protected_size() == 0 == single.protected_size()
    batch.sanity_check()


def test_lock_batch_and_unlock_batch_with_an_early_swa_release():
    batch, _ = _pair(1, True)
    _fill(batch, random.Random(3), [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 9, 9, 9, 9]], 1)
    nodes = [batch.match_prefix(RadixKey(k)).last_device_node
             for k in ([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 9, 9, 9, 9])]
    locks = batch.lock_batch(nodes)
    assert batch.swa_protected_size() > 0
    batch.release_swa(locks[0])
    batch.unlock_batch(locks + [None])
    assert batch.protected_size() == 0 == batch.swa_protected_size()
    batch.sanity_check()


def test_full_only_lock_batch_and_unlock_batch_as_the_single_calls():
    """A Full-only cache takes the short path (plain receipts); a tampered receipt,
    a double release or a stale id still raise as the single calls, naming the
    entry, with the tree unchanged."""
    rng = random.Random(11)
    batch, single = _pair(1, False)
    base = [[rng.randint(1, 3) for _ in range(rng.randint(2, 30))] for _ in range(25)]
    for c in (batch, single):
        _fill(c, random.Random(4), base, 1)
    nodes = [batch.match_prefix(RadixKey(p)).last_device_node for p in base[:12]]
    locks = batch.lock_batch(nodes)
    singles = [single.lock(n) for n in nodes]
    assert [(lk.node, lk.receipt) for lk in locks] == [(lk.node, lk.receipt) for lk in singles]
    assert batch.protected_size() == single.protected_size() > 0
    before = batch._snapshot()
    with pytest.raises(NodeAccessError, match=r"nodes\[2\]"):
        batch.lock_batch([nodes[0], nodes[1], (1 << 40) | 5])
    with pytest.raises(LockRefError, match=r"nodes\[12\]"):
        batch.unlock_batch(locks + locks[:1])          # the first lock released twice
    tampered = batch.lock_batch(nodes[:1])[0]
    tampered.receipt.node_id = nodes[1] if nodes[1] != nodes[0] else nodes[2]
    with pytest.raises(LockRefError, match="anchored on node"):
        batch.unlock_batch([tampered])                 # the checked path names the mismatch
    batch.unlock(batch.lock_batch(nodes[:1])[0])       # (the extra lock taken above, back)
    batch.dec_lock_ref(nodes[0])
    assert_state_equal(before, batch._snapshot())
    batch.unlock_batch(locks)
    for lk in singles:
        single.unlock(lk)
    assert batch.protected_size() == 0 == single.protected_size()
    batch.sanity_check()


def test_locks_follow_disable_set_after_construction():
    """``disable`` is read at each call (helper-24: the short lock paths once froze it
    at construction): set later, every lock call is a no-op, as ``inc_lock_ref``."""
    c = UnifiedRadixCache(page_size=1)
    c.insert(InsertParams(key=RadixKey([1, 2, 3]), value=np.array([5, 6, 7])))
    node = c.match_prefix(RadixKey([1, 2, 3])).last_device_node
    c.disable = True
    lk = c.lock(node)
    locks = c.lock_batch([node, node])
    c.inc_lock_ref(node)
    assert c.protected_size() == 0
    c.dec_lock_ref(node)                 # nothing held, nothing released: no error
    c.unlock(lk)
    c.unlock_batch(locks)
    assert c.protected_size() == 0 and c.evictable_size() == 3
    c.disable = False
    c.unlock(c.lock(node))
    assert c.protected_size() == 0
    c.sanity_check()
