"""Bad input gets a clear error naming the argument, and the tree is exactly as before.

| input | entry point | error |
|---|---|---|
| float / bool / object token ids, 2-D key | match_prefix, insert | TypeError / ValueError |
| key not a RadixKey, params not InsertParams | match_prefix, insert | TypeError |
| value: float dtype, 2-D, wrong length, negative, >= pool size | insert | TypeError / ValueError |
| bigram key in a non-EAGLE cache | insert, match_prefix | ValueError |
| extra_key / cache_salt not str | insert | TypeError |
| negative prev_prefix_len / inserted_len, non-int priority | insert | ValueError / TypeError |
| stale / never-issued / negative / non-int node id | inc_lock_ref, dec_lock_ref, path_device_indices | NodeAccessError / TypeError |
| unlock without lock, unlock twice, receipt of another node | dec_lock_ref | LockRefError (ValueError) |
| negative or non-int evict count | evict | ValueError / TypeError |
| page_size <= 0, unknown policy, bad policy config | constructor | ValueError / TypeError |
"""

from array import array

import numpy as np
import pytest
import torch

from flatradix import (
    EvictParams, InsertParams, LockRefError, MatchPrefixParams, NodeAccessError, RadixKey,
    TokenToKVPoolAllocator, UnifiedRadixCache,
)

from .conftest import assert_state_equal


@pytest.fixture
def cache():
    alloc = TokenToKVPoolAllocator(64)
    c = UnifiedRadixCache(page_size=2, token_to_kv_pool_allocator=alloc)
    v = alloc.alloc(8)
    c.insert(InsertParams(key=RadixKey([1, 2, 3, 4, 5, 6, 7, 8]), value=v))
    v = alloc.alloc(4)
    c.insert(InsertParams(key=RadixKey([1, 2, 9, 9]), value=v))
    return c


def unchanged(c, fn, exc, match=None):
    before = c._snapshot()
    with pytest.raises(exc, match=match):
        fn()
    assert_state_equal(before, c._snapshot())
    c.sanity_check()


def ip(key, value=None, **kw):
    return InsertParams(key=key, value=value, **kw)


BAD_INSERTS = [
    (lambda: ip(RadixKey([1.0, 2.0]), np.array([1, 2])), TypeError, "token_ids"),
    (lambda: ip(RadixKey([True, False]), np.array([1, 2])), TypeError, "token_ids"),
    (lambda: ip(RadixKey(np.array([[1, 2]])), np.array([1, 2])), ValueError, "1-D"),
    (lambda: ip(RadixKey(np.array([1.5, 2.5])), np.array([1, 2])), TypeError, "integers"),
    (lambda: ip(RadixKey(array("d", [1.0, 2.0])), np.array([1, 2])), TypeError, "integers"),
    (lambda: ip(RadixKey("ab"), np.array([1, 2])), TypeError, "token_ids"),
    (lambda: ip([1, 2], np.array([1, 2])), TypeError, "RadixKey"),
    (lambda: ip(RadixKey([1, 2]), np.array([1.0, 2.0])), TypeError, "value"),
    (lambda: ip(RadixKey([1, 2]), np.array([[1, 2]])), ValueError, "value"),
    (lambda: ip(RadixKey([1, 2]), np.array([1, 2, 3])), ValueError, "value"),
    (lambda: ip(RadixKey([1, 2, 3, 4]), np.array([1, 2])), ValueError, "value"),
    (lambda: ip(RadixKey([1, 2]), np.array([-1, 2])), ValueError, "value"),
    (lambda: ip(RadixKey([1, 2]), np.array([1, 10_000])), ValueError, "value"),
    (lambda: ip(RadixKey([1, 2]), np.array([np.nan, 1.0])), TypeError, "value"),
    (lambda: ip(RadixKey([1, 2]), torch.tensor([1.0, 2.0])), TypeError, "value"),
    (lambda: ip(RadixKey([1, 2], is_bigram=True), np.array([1])), ValueError, "bigram"),
    (lambda: ip(RadixKey([1, 2], extra_key=5), np.array([1, 2])), TypeError, "extra_key"),
    (lambda: ip(RadixKey([1, 2], cache_salt=b"x"), np.array([1, 2])), TypeError, "cache_salt"),
    (lambda: ip(RadixKey([1, 2]), np.array([1, 2]), prev_prefix_len=-1), ValueError, "prev_prefix_len"),
    (lambda: ip(RadixKey([1, 2]), np.array([1, 2]), inserted_len=-3), ValueError, "inserted_len"),
    (lambda: ip(RadixKey([1, 2]), np.array([1, 2]), priority=1.5), TypeError, "priority"),
    (lambda: ip(RadixKey([1, 2]), np.array([1, 2]), mamba_value=np.array([3])), ValueError, "mamba"),
    (lambda: "not params", TypeError, "InsertParams"),
]


@pytest.mark.parametrize("make,exc,msg", BAD_INSERTS)
def test_bad_insert_leaves_tree_unchanged(cache, make, exc, msg):
    unchanged(cache, lambda: cache.insert(make()), exc, msg)


@pytest.mark.parametrize("key,exc", [
    (RadixKey([1.0, 2.0]), TypeError),
    (RadixKey(np.zeros((2, 2), dtype=np.int64)), ValueError),
    (RadixKey([1, 2], is_bigram=True), ValueError),
    ("tokens", TypeError),
    (None, TypeError),
])
def test_bad_match_leaves_tree_unchanged(cache, key, exc):
    unchanged(cache, lambda: cache.match_prefix(MatchPrefixParams(key=key)), exc)


def test_stale_and_bogus_node_ids(cache):
    m = cache.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 9, 9])))
    node = m.last_device_node
    cache.evict(EvictParams(num_tokens=100))  # node is gone now
    for bad in (node, 12345678901, -1, (7 << 32) | 1):
        unchanged(cache, lambda: cache.inc_lock_ref(bad), NodeAccessError, "live node")
        unchanged(cache, lambda: cache.dec_lock_ref(bad), NodeAccessError)
        unchanged(cache, lambda: cache.path_device_indices(bad), KeyError)
    for bad in ("3", 1.0, None, True):
        unchanged(cache, lambda: cache.inc_lock_ref(bad), TypeError, "node")


def test_node_ids_never_reused_across_reset(cache):
    seen = {cache.root_node_handle()}
    for round_ in range(3):
        for i in range(5):
            r = cache.insert(InsertParams(key=RadixKey([100 + round_, i, 7, 7])))
            assert r.last_device_node not in seen
            seen.add(r.last_device_node)
        old = cache.root_node_handle()
        cache.reset()
        assert cache.root_node_handle() != old
        assert cache.root_node_handle() not in seen
        seen.add(cache.root_node_handle())
        with pytest.raises(NodeAccessError):
            cache.inc_lock_ref(r.last_device_node)


def test_unlock_errors(cache):
    node = cache.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3, 4]))).last_device_node
    unchanged(cache, lambda: cache.dec_lock_ref(node), LockRefError, "lock_ref=0")
    receipt = cache.inc_lock_ref(node)
    other = cache.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 9, 9]))).last_device_node
    unchanged(cache, lambda: cache.dec_lock_ref(other, receipt), LockRefError, "anchored")
    cache.dec_lock_ref(node, receipt)
    unchanged(cache, lambda: cache.dec_lock_ref(node, receipt), ValueError, "lock_ref=0")
    # SGLang callers catch AssertionError for this.
    unchanged(cache, lambda: cache.dec_lock_ref(node, receipt), AssertionError)


@pytest.mark.parametrize("arg,exc", [(-1, ValueError), (1.5, TypeError), ("3", TypeError),
                                     (EvictParams(num_tokens=-5), ValueError)])
def test_bad_evict(cache, arg, exc):
    unchanged(cache, lambda: cache.evict(arg), exc, "num_tokens")


def test_evict_more_than_exists_is_a_clamped_noop_beyond(cache):
    r = cache.evict(EvictParams(num_tokens=10 ** 9))
    assert r.num_tokens_evicted == 10
    assert cache.total_size()[0] == 0
    assert cache.evict(EvictParams(num_tokens=5)).num_tokens_evicted == 0


@pytest.mark.parametrize("kw,exc", [
    (dict(page_size=0), ValueError), (dict(page_size=-4), ValueError),
    (dict(page_size=1.0), TypeError), (dict(eviction_policy="random"), ValueError),
    (dict(eviction_policy="slru", eviction_policy_config={"bogus": 1}), TypeError),
    (dict(components=(0, 1)), ValueError),
])
def test_bad_constructor(kw, exc):
    with pytest.raises(exc):
        UnifiedRadixCache(**kw)


def test_unknown_policy_lists_valid_names():
    with pytest.raises(ValueError, match="lru, lfu, fifo, mru, filo, priority, slru, tlru"):
        UnifiedRadixCache(eviction_policy="nope")


def test_readonly_and_noncontiguous_inputs_are_accepted(cache):
    toks = np.arange(100, 120, dtype=np.int64)[::2]
    vals = np.arange(30, 40, dtype=np.int32)
    vals.setflags(write=False)
    r = cache.insert(InsertParams(key=RadixKey(toks), value=vals))
    assert r.prefix_len == 0
    m = cache.match_prefix(MatchPrefixParams(key=RadixKey(toks.copy())))
    np.testing.assert_array_equal(m.device_indices.numpy() if hasattr(m.device_indices, "numpy")
                                  else m.device_indices, vals)
    cache.sanity_check()


def test_bool_among_int_token_ids_counts_as_int(cache):
    """Python's bool is an int subclass: a bool among ints is the token 0/1 (as in
    SGLang's cores); an all-bool list or a bool array is refused (test above)."""
    a = cache.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3, 4])))
    b = cache.match_prefix(MatchPrefixParams(key=RadixKey([True, 2, 3, 4])))
    assert a.device_prefix_len == b.device_prefix_len == 4
    np.testing.assert_array_equal(a.device_indices, b.device_indices)
