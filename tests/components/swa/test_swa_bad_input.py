"""SWA bad input (spec §4, §6.2, §10): each refused before anything changes -- the
cache's ``_snapshot()``, both sides of the SWA allocator (free stacks, marks) and
its Full -> SWA mapping, and the request pool are compared before and after.
"""

import copy

import numpy as np
import pytest

from flatradix import (
    EvictParams, InsertParams, RadixKey, Req, ReqToTokenPool, SWATokenToKVPoolAllocator,
    TokenToKVPoolAllocator, UnifiedRadixCache,
)

from ...conftest import assert_state_equal
from .swa_support import FULL, FS, SWA, SWAEnv


def _alloc_state(a):
    sides = []
    for side in (a.full_attn_allocator, a.swa_attn_allocator):
        sides.append((side._top, side._stack[:side._top].copy(), side._mark.copy()))
    return sides, a.full_to_swa_index_mapping.copy()


def _same_alloc(x, y):
    (sx, mx), (sy, my) = x, y
    for (t1, s1, k1), (t2, s2, k2) in zip(sx, sy):
        assert t1 == t2
        np.testing.assert_array_equal(s1, s2)
        np.testing.assert_array_equal(k1, k2)
    np.testing.assert_array_equal(mx, my)


def refused(e, fn, exc, match=None, reqs=(), check=True):
    """``fn()`` raises ``exc`` and nothing changed. ``check``: also the partition (off
    while the test itself holds slots the model does not know)."""
    before = (e.cache._snapshot(), _alloc_state(e.alloc), e.rtp._rows.copy(),
              [copy.deepcopy(vars(r)) for r in reqs])
    with pytest.raises(exc, match=match):
        fn()
    assert_state_equal(before[0], e.cache._snapshot())
    _same_alloc(before[1], _alloc_state(e.alloc))
    np.testing.assert_array_equal(before[2], e.rtp._rows)
    for r, v in zip(reqs, before[3]):
        now = vars(r)
        assert now.keys() == v.keys()
        for k in v:
            if k == "_np_cache":  # Req's memo of its token lists as arrays (not request state)
                continue
            a, b = v[k], now[k]
            if isinstance(a, np.ndarray):
                np.testing.assert_array_equal(a, b)
            else:
                assert a == b, k
    if check:
        e.check()
    else:
        e.cache.sanity_check()


@pytest.fixture
def env():
    """W 4, P 2: [0,4) tomb + [4,8) live, and a live branch [9,9,9,9]."""
    e = SWAEnv(W=4, P=2, size=48)
    e.insert(list(range(1, 9)), cursor=4)
    e.insert([9, 9, 9, 9])
    return e


# ----------------------------------------------------------------------------- constructor
@pytest.mark.parametrize("W", [0, -3, None], ids=["zero", "negative", "missing"])
def test_ctor_window_must_be_positive(W):
    a = SWATokenToKVPoolAllocator(16, 16)
    before = _alloc_state(a)
    kw = {} if W is None else {"sliding_window_size": W}
    with pytest.raises(ValueError, match="sliding_window_size"):
        UnifiedRadixCache(tree_components=FS, token_to_kv_pool_allocator=a, **kw)
    _same_alloc(before, _alloc_state(a))


@pytest.mark.parametrize("W", [1.5, "4", True])
def test_ctor_window_must_be_an_int(W):
    with pytest.raises(TypeError, match="sliding_window_size"):
        UnifiedRadixCache(tree_components=FS, sliding_window_size=W,
                          token_to_kv_pool_allocator=SWATokenToKVPoolAllocator(16, 16))


@pytest.mark.parametrize("args,exc,msg", [
    ((16, "x"), TypeError, "size_swa must be an int"),
    ((16, -1), ValueError, "size_swa must be >= 0"),
    (("x", 16), TypeError, "size must be an int"),
])
def test_swa_allocator_sizes_name_the_argument(args, exc, msg):
    with pytest.raises(exc, match=msg):
        SWATokenToKVPoolAllocator(*args)


def test_ctor_window_on_a_full_only_cache():
    with pytest.raises(ValueError, match="sliding_window_size"):
        UnifiedRadixCache(sliding_window_size=4)
    with pytest.raises(ValueError, match="sliding_window_size"):
        UnifiedRadixCache(tree_components=(FULL,), sliding_window_size=4,
                          token_to_kv_pool_allocator=SWATokenToKVPoolAllocator(16, 16))


@pytest.mark.parametrize("alloc", [None, "plain"], ids=["no-allocator", "full-only-allocator"])
def test_ctor_swa_needs_an_swa_allocator(alloc):
    a = TokenToKVPoolAllocator(16) if alloc == "plain" else None
    with pytest.raises((TypeError, ValueError), match="token_to_kv_pool_allocator"):
        UnifiedRadixCache(tree_components=FS, sliding_window_size=4, token_to_kv_pool_allocator=a)


def test_ctor_allocator_page_size_must_match():
    a = SWATokenToKVPoolAllocator(16, 16, page_size=2)
    with pytest.raises(ValueError, match="page_size"):
        UnifiedRadixCache(page_size=1, tree_components=FS, sliding_window_size=4,
                          token_to_kv_pool_allocator=a)


def test_ctor_good_and_introspection():
    e = SWAEnv(W=5, P=2)
    c = e.cache
    assert c.supports_swa() is True
    assert c.sliding_window_size == 5
    assert c.component_evictable_size(SWA) == c.swa_evictable_size() == 0
    assert c.total_size() == (0, 0)
    plain = UnifiedRadixCache()
    assert plain.supports_swa() is False and plain.sliding_window_size is None
    assert plain.swa_evictable_size() == plain.swa_protected_size() == 0


# ----------------------------------------------------------------------------- insert
def _ip(toks, value, cursor=None, **kw):
    p = InsertParams(key=RadixKey(toks), value=value, **kw)
    if cursor is not None:
        p.set_evicted_seqlen(SWA, cursor)
    return p


@pytest.mark.parametrize("cursor,exc", [(3, ValueError), (-2, ValueError), (1, ValueError),
                                        ("4", TypeError), (2.0, TypeError)])
def test_insert_bad_cursor(env, cursor, exc):
    v = env.fresh(8)
    refused(env, lambda: env.cache.insert(_ip([5, 6, 7, 8, 1, 2, 3, 4], v, cursor)), exc,
            r"component_evicted_seqlens", check=False)
    env.alloc.free(v)
    env.check()


def test_insert_slot_without_swa_peer_at_or_past_the_cursor(env):
    """Position 5 has no SWA peer: refused with cursor 0 and 4 (5 >= cursor), naming
    params.value; with cursor 6 (5 < 6) the slot is a tombstone position: accepted."""
    v = env.fresh(8)
    env.alloc.free_swa(v[5:6])
    for cursor in (0, 4):
        refused(env, lambda: env.cache.insert(_ip([5, 6, 7, 8, 1, 2, 3, 4], v, cursor)),
                ValueError, "params.value", check=False)
    env.alloc.free_swa(np.r_[v[:5]])
    r = env.cache.insert(_ip([5, 6, 7, 8, 1, 2, 3, 4], v, 6))
    assert r.prefix_len == 0
    env.check()


def test_insert_slot_with_swa_peer_below_the_cursor(env):
    """Cursor 6, positions 0..5 tombstone positions: a slot there that still has its
    SWA peer (position 3) is refused, naming params.value (accepted, the tree would
    keep or free its Full side only: the peer would leak and a later eviction of the
    node raise partway); below prev_prefix_len the slots are the tree's, not
    checked; with the peer given back the insert goes through."""
    v = env.fresh(8)
    env.alloc.free_swa(np.r_[v[:3], v[4:6]])
    refused(env, lambda: env.cache.insert(_ip([5, 6, 7, 8, 1, 2, 3, 4], v, 6)),
            ValueError, r"params.value: KV slot \d+ at 3 still has an SWA slot", check=False)
    env.alloc.free_swa(v[3:4])
    r = env.cache.insert(_ip([5, 6, 7, 8, 1, 2, 3, 4], v, 6))
    assert r.prefix_len == 0
    env.check()
    env.cache.evict(EvictParams(num_tokens=100, swa_num_tokens=100))
    env.check()


def test_insert_swa_params_on_a_full_only_cache():
    a = TokenToKVPoolAllocator(16)
    c = UnifiedRadixCache(token_to_kv_pool_allocator=a)
    c.insert(InsertParams(key=RadixKey([1, 2]), value=a.alloc(2)))
    before = c._snapshot()
    v = a.alloc(4)
    with pytest.raises(ValueError, match="swa_branching_seqlen"):
        c.insert(InsertParams(key=RadixKey([1, 2, 3, 4]), value=v, swa_branching_seqlen=2))
    p = InsertParams(key=RadixKey([1, 2, 3, 4]), value=v)
    p.set_evicted_seqlen(SWA, 2)
    with pytest.raises(ValueError, match="component_evicted_seqlens"):
        c.insert(p)
    assert_state_equal(before, c._snapshot())
    assert a.available_size() == 10
    c.sanity_check()


def test_insert_negative_branching(env):
    v = env.fresh(4)
    refused(env, lambda: env.cache.insert(_ip([7, 7, 7, 7], v, swa_branching_seqlen=-1)),
            ValueError, "swa_branching_seqlen", check=False)
    env.alloc.free(v)
    env.check()


# ----------------------------------------------------------------------------- evict
@pytest.mark.parametrize("call", ["evict", "evict_for_alloc"])
def test_evict_negative_swa_count(env, call):
    fn = getattr(env.cache, call)
    refused(env, lambda: fn(EvictParams(swa_num_tokens=-1)), ValueError, "swa_num_tokens")
    refused(env, lambda: fn(EvictParams(num_tokens=1, swa_num_tokens=-4)), ValueError,
            "swa_num_tokens")


def test_evict_swa_count_not_an_int(env):
    refused(env, lambda: env.cache.evict(EvictParams(swa_num_tokens="3")), TypeError,
            "swa_num_tokens")


def test_stepwise_swa_bad_count(env):
    refused(env, lambda: env.cache.evict_device_start(SWA, -1), ValueError)
    env.cache.evict_device_start(SWA, 1)
    refused(env, lambda: env.cache.evict_device_start(SWA, 1), RuntimeError, "already in progress")
    assert env.cache.evict_device_end(SWA) == 0


# ----------------------------------------------------------------------------- locks
def test_release_with_none_boundary_for_a_bounded_segment(env):
    """A receipt claiming the window reached the root (None) for a segment that ended
    below it walks past the boundary onto an unlocked node: refused, unchanged."""
    leaf = env.match(list(range(1, 9))).last_device_node
    r = env.cache.inc_lock_ref(leaf)
    b = r.component_lock_uuids[SWA]
    assert b is not None
    bad = r.to_dec_params()
    bad.component_lock_uuids[SWA] = None
    refused(env, lambda: env.cache.dec_lock_ref(leaf, bad), AssertionError, "lock_ref=0")
    env.cache.dec_lock_ref(leaf, r)
    env.check()


def test_release_with_a_malformed_boundary(env):
    leaf = env.match(list(range(1, 9))).last_device_node
    r = env.cache.inc_lock_ref(leaf).to_dec_params()
    for bad in ("x", -1, 1.5):
        p = copy.deepcopy(r)
        p.component_lock_uuids[SWA] = bad
        refused(env, lambda: env.cache.dec_lock_ref(leaf, p), TypeError)
    env.cache.dec_lock_ref(leaf, r)
    env.check()


# ----------------------------------------------------------------------------- requests
def test_request_with_unaligned_cursor_is_refused():
    e = SWAEnv(W=4, P=2, size=32)
    req, _ = e.admit(list(range(1, 11)))
    req.swa_evicted_seqlen = 3
    for fn in (lambda: e.cache.checkpoint(req, 10), lambda: e.cache.evict_sliding_windows(req, 9),
               lambda: e.cache.release_kv_cache(req)):
        refused(e, fn, ValueError, "swa_evicted_seqlen", reqs=[req], check=False)
    req.swa_evicted_seqlen = 0
    e.release(req)
    e.check()


def test_request_without_receipt_on_swa_cache_is_refused():
    """An SWA cache needs the lock's receipt: a request carrying only last_node."""
    e = SWAEnv(W=4, P=2, size=32)
    e.insert(list(range(1, 5)))
    req, _ = e.admit(list(range(1, 9)))
    lock, req.lock = req.lock, None
    refused(e, lambda: e.cache.checkpoint(req, 8), KeyError, reqs=[req])
    req.lock = lock
    e.release(req)
    e.check()


def test_evict_sliding_windows_bad_pre_len():
    e = SWAEnv(W=4, P=1, size=32)
    req, _ = e.admit(list(range(1, 11)))
    refused(e, lambda: e.cache.evict_sliding_windows(req, -1), ValueError, "pre_len", reqs=[req])
    refused(e, lambda: e.cache.evict_sliding_windows(req, 40), ValueError, reqs=[req])
    e.release(req)
    e.check()


def test_evict_sliding_windows_is_a_noop_without_swa():
    a = TokenToKVPoolAllocator(16)
    rtp = ReqToTokenPool(2, 16)
    c = UnifiedRadixCache(token_to_kv_pool_allocator=a, req_to_token_pool=rtp)
    row = rtp.alloc(1)[0]
    rtp.req_to_token[row, :10] = a.alloc(10)
    req = Req(origin_input_ids=list(range(10)), req_pool_idx=row, kv_committed_len=10)
    before = c._snapshot()
    c.evict_sliding_windows(req, 9)
    assert req.swa_evicted_seqlen == 0 and a.available_size() == 6
    assert_state_equal(before, c._snapshot())
