"""The SWA component against the spec (unified_radix_cache.md §6.2, §5.1-5.7, known_bugs
B13): worked examples, the window lock, eviction.

Every expected value is worked by hand from the spec; the comment above each
block gives the arithmetic. Notation: ``W`` window, ``P`` page, ``T =
ceil(W/P)*P`` the leaf cap; ``[a,b)`` a node holding key positions a..b-1;
"live" = holds SWA data, "tomb" = Full only. Every scenario ends (and most
steps end) with ``check()``: ``sanity_check()`` plus the exact slot partition
of the Full and SWA pools and the ledgers (``tests/swa_support.py``).
"""

import numpy as np
import pytest

from flatradix import EvictParams, LockRefError

from .swa_support import FULL, SWA, SWAEnv, find, nodes, shape


@pytest.fixture(params=[False, True], ids=["flatradix-alloc", "sglang-contract-alloc"])
def strict(request):
    """Run the scenario with flatradix's SWA allocator and with a double that holds the
    cache to SGLang's allocator contract (torch indices, peer checks)."""
    return request.param

T1 = list(range(1, 41))  # token ids: position i holds token i + 1


def toks(n, base=T1):
    return base[:n]


# ----------------------------------------------------------------------------- §6.2 validator
def test_validator_worked_example_w4_p2(strict):
    """W 4, P 2: insert 8 tokens with cursor 4 -> [0,4) tomb, [4,8) live; matching 8
    -> 8; matching 6 -> 0 (2 live tokens after the hole < W) with full hit 6 and
    branching 6 (aligned 6 > boundary 0)."""
    e = SWAEnv(strict=strict, W=4, P=2)
    r = e.insert(toks(8), cursor=4)
    assert r.prefix_len == 0
    assert shape(e.cache) == [(4, 4, False), (8, 4, True)]
    assert e.cache.total_size() == (8, 4)
    assert (e.cache.swa_evictable_size(), e.cache.swa_protected_size()) == (4, 0)
    e.check()

    m = e.match(toks(8))
    assert (m.device_prefix_len, m.full_kv_hit_length, m.swa_branching_seqlen) == (8, 8, None)
    assert m.best_match_node == find(e.cache, toks(8))["node_id"]
    e.check()

    m = e.match(toks(6))
    assert (m.device_prefix_len, m.full_kv_hit_length, m.swa_branching_seqlen) == (0, 6, 6)
    assert m.best_match_node == m.last_device_node == e.cache.root_node_handle()
    assert len(m.device_indices) == 0
    # the match split [4,8) at 6 so the walk ends on a node boundary
    assert shape(e.cache) == [(4, 4, False), (6, 2, True), (8, 2, True)]
    assert e.cache.total_size() == (8, 4)
    e.check()


def test_validator_after_hole_needs_w_contiguous(strict):
    """W 4, P 1: cursor 2 on 9 tokens -> [0,2) tomb, live [2,9) = 7 > T 4 so capped:
    [2,5) + [5,9). Match 5 -> 0 (3 live after the hole), match 9 -> 9 (7 >= 4),
    match 6 -> splits [5,9) at 6: acc 3 + 1 = 4 >= 4 -> 6."""
    e = SWAEnv(strict=strict, W=4, P=1)
    e.insert(toks(9), cursor=2)
    assert shape(e.cache) == [(2, 2, False), (5, 3, True), (9, 4, True)]
    assert e.match(toks(5)).device_prefix_len == 0
    assert e.match(toks(5)).swa_branching_seqlen == 5
    assert e.match(toks(9)).device_prefix_len == 9
    m = e.match(toks(6))
    assert (m.device_prefix_len, m.swa_branching_seqlen) == (6, None)
    e.check()


def test_from_root_live_nodes_need_no_window(strict):
    """A short prefix with SWA data and no hole is accepted at once (acc = +inf)."""
    e = SWAEnv(strict=strict, W=8, P=1)
    e.insert(toks(3))
    m = e.match(toks(3))
    assert (m.device_prefix_len, m.swa_branching_seqlen) == (3, None)
    e.check()


# ----------------------------------------------------------------------------- leaf cap
@pytest.mark.parametrize("W,P", [(4, 2), (5, 2), (3, 1), (7, 4), (4, 4)])
def test_leaf_cap(W, P, strict):
    """T = ceil(W/P)*P. T/P + 2 pages -> parent [0, 2P) live, leaf [2P, T+2P) live of
    length T, parent != root (older part published first, so an SWA eviction of
    one unit takes the parent). T/P pages -> one node under the root."""
    T = -(-W // P) * P
    e = SWAEnv(strict=strict, W=W, P=P)
    e.insert(toks(T + 2 * P))
    assert shape(e.cache) == [(2 * P, 2 * P, True), (T + 2 * P, T, True)]
    leaf = find(e.cache, toks(T + 2 * P))
    assert leaf["parent"] != e.cache.root_node_handle() and len(leaf["key"]) == T
    assert e.cache.total_size() == (T + 2 * P, T + 2 * P)
    e.check()
    # the tail is more recent: the first SWA victim is the (internal) parent
    r = e.cache.evict(EvictParams(swa_num_tokens=1))
    assert (r.num_tokens_evicted, r.swa_num_tokens_evicted) == (0, 2 * P)
    assert shape(e.cache) == [(2 * P, 2 * P, False), (T + 2 * P, T, True)]
    e.check()

    e2 = SWAEnv(strict=strict, W=W, P=P)
    e2.insert(toks(T))
    assert shape(e2.cache) == [(T, T, True)]
    assert find(e2.cache, toks(T))["parent"] == e2.cache.root_node_handle()
    e2.check()


def test_leaf_cap_applies_to_the_live_part_only(strict):
    """W 4, P 1, cursor 3 on 10 tokens: [0,3) tomb, live [3,10) = 7 > 4 -> [3,6) + [6,10)."""
    e = SWAEnv(strict=strict, W=4, P=1)
    e.insert(toks(10), cursor=3)
    assert shape(e.cache) == [(3, 3, False), (6, 3, True), (10, 4, True)]
    assert e.cache.total_size() == (10, 7)
    e.check()


# ----------------------------------------------------------------------------- recovery
def test_recovery_w8_reinsert_then_evict_tombstones_the_recovered_part_first(strict):
    """W 8, P 2 (T 8): insert 16 with cursor 8 -> [0,8) tomb, [8,16) live. Re-insert 16
    with fresh slots (cursor 0): [0,8) recovered (its Full value becomes the new
    slots, the old ones freed Full-only), [8,16)'s duplicates freed with their
    SWA peers. The insert-end refresh puts [8,16) at MRU with [0,8) right behind,
    so evict(swa_num_tokens=8) tombstones [0,8) again and keeps [8,16)."""
    e = SWAEnv(strict=strict, W=8, P=2, size=64)
    v1 = e.fresh(16, swa_dead=8)
    e.insert(toks(16), value=v1, cursor=8)
    assert shape(e.cache) == [(8, 8, False), (16, 8, True)]
    v2 = e.fresh(16)
    r = e.insert(toks(16), value=v2, track_adopted_ranges=True)
    assert r.prefix_len == 16
    assert r.adopted_ranges == {FULL: [(0, 8)], SWA: [(0, 8)]}
    assert shape(e.cache) == [(8, 8, True), (16, 8, True)]
    path = np.asarray(e.cache.path_device_indices(find(e.cache, toks(16))["node_id"]))
    np.testing.assert_array_equal(path, np.r_[v2[:8], v1[8:]])
    assert e.alloc.full_available_size() == 64 - 16
    assert e.alloc.swa_available_size() == 64 - 16
    assert e.cache.total_size() == (16, 16)
    e.check()

    r = e.cache.evict(EvictParams(swa_num_tokens=8))
    assert (r.num_tokens_evicted, r.swa_num_tokens_evicted) == (0, 8)
    assert shape(e.cache) == [(8, 8, False), (16, 8, True)]
    assert e.alloc.swa_available_size() == 64 - 8
    assert e.match(toks(16)).device_prefix_len == 16  # [8,16) is one full window
    e.check()


def test_recovery_skipped_when_request_owns_the_span(strict):
    """prev_prefix_len >= the node's end: no recovery, nothing adopted or freed there."""
    e = SWAEnv(strict=strict, W=4, P=1)
    e.insert(toks(4), cursor=4)                      # [0,4) tomb leaf
    tomb = np.asarray(e.cache.path_device_indices(find(e.cache, toks(4))["node_id"]))
    v = np.r_[tomb, e.fresh(2)]
    r = e.insert(toks(6), value=v, prev=4, track_adopted_ranges=True)
    assert r.prefix_len == 4
    assert shape(e.cache) == [(4, 4, False), (6, 2, True)]
    assert r.adopted_ranges == {FULL: [(4, 6)], SWA: [(4, 6)]}
    e.check()


def test_recovery_splits_at_the_cursor(strict):
    """W 4, P 2: tomb [0,8) (cursor 8); re-insert with cursor 4: [0,4) stays tomb
    (its duplicates freed Full-only), [4,8) recovered."""
    e = SWAEnv(strict=strict, W=4, P=2)
    e.insert(toks(8), cursor=8)
    assert shape(e.cache) == [(8, 8, False)]
    v = e.fresh(8, swa_dead=4)
    r = e.insert(toks(8), value=v, cursor=4, track_adopted_ranges=True)
    assert r.prefix_len == 8
    assert r.adopted_ranges == {FULL: [(4, 8)], SWA: [(4, 8)]}
    assert shape(e.cache) == [(4, 4, False), (8, 4, True)]
    assert e.alloc.full_attn_allocator.is_free(v[:4]).all()
    assert not e.alloc.full_attn_allocator.is_free(v[4:]).any()
    assert e.cache.total_size() == (8, 4)
    e.check()


# ----------------------------------------------------------------------------- LRU refresh
def _chain(e, lens, base=T1):
    """Insert a chain of nodes of the given key lengths one insert at a time (each
    insert adds one leaf); returns the cumulative paths."""
    paths, end = [], 0
    for k in lens:
        end += k
        e.insert(base[:end])
        paths.append(base[:end])
    return paths


def test_lru_refresh_window_w_plus_p(strict):
    """Spec example 1 (window argument W + P = 5, W 4, P 1): chain a,b,c,d of key
    length 3. Building it leaves the LRU (MRU first) [d,c,b,a]; matching abc, ab, a
    makes it [a,b,c,d]; matching abcd refreshes d (acc 0) and c (acc 3) only ->
    [d,c,a,b]. SWA victims from the tail: b, a, c (internal: tombstones), then d
    (a leaf: deleted whole, Full too)."""
    e = SWAEnv(strict=strict, W=4, P=1)
    a, b, c, d = _chain(e, [3, 3, 3, 3])
    for p in (c, b, a, d):
        e.match(p)
    has = lambda: {len(n["path"]): n["has_swa"] for n in nodes(e.cache)}  # noqa: E731
    for victim in (6, 3, 9):
        r = e.cache.evict(EvictParams(swa_num_tokens=3))
        assert (r.num_tokens_evicted, r.swa_num_tokens_evicted) == (0, 3)
        assert not has()[victim]
        e.check()
    assert has() == {3: False, 6: False, 9: False, 12: True}
    r = e.cache.evict(EvictParams(swa_num_tokens=3))
    assert (r.num_tokens_evicted, r.swa_num_tokens_evicted) == (3, 3)
    assert has() == {3: False, 6: False, 9: False}
    e.check()


def test_lru_refresh_stops_at_window_counting_tombstones(strict):
    """Spec example 2 (window 5, key length 2, b absent from the list): the refresh
    from d moves d (acc 0 -> 2) and c (2 -> 4), passes b (no data, 4 -> 6) and stops:
    a is not moved. Setup: chain a,b,c built by inserts ([c,b,a]); match a
    ([a,c,b]); evict 2 SWA -> b (internal) tombstoned ([a,c]); insert abcd with the
    prefix owned (prev 6: b is not recovered) -> [d,c,a]; insert e (own branch) ->
    [e,d,c,a]; match abcd (a ok, b hole, c 2, d 4 >= 4: best d) -> [d,c,e,a].
    The next SWA victim is a (tombstoned); had a been moved it would be e."""
    e = SWAEnv(strict=strict, W=4, P=1)
    a, b, c = _chain(e, [2, 2, 2])
    e.match(a)
    r = e.cache.evict(EvictParams(swa_num_tokens=2))
    assert r.swa_num_tokens_evicted == 2 and not find(e.cache, b)["has_swa"]
    own = np.asarray(e.cache.path_device_indices(find(e.cache, c)["node_id"]))
    d = T1[:8]
    e.insert(d, value=np.r_[own, e.fresh(2)], prev=6)
    assert not find(e.cache, b)["has_swa"]
    ebranch = [90, 91]
    e.insert(ebranch)
    m = e.match(d)
    assert m.device_prefix_len == 8
    r = e.cache.evict(EvictParams(swa_num_tokens=2))
    assert (r.num_tokens_evicted, r.swa_num_tokens_evicted) == (0, 2)
    assert not find(e.cache, a)["has_swa"]
    assert find(e.cache, ebranch)["has_swa"]
    e.check()
    r = e.cache.evict(EvictParams(swa_num_tokens=2))
    assert (r.num_tokens_evicted, r.swa_num_tokens_evicted) == (2, 2)  # e: a leaf, deleted
    assert ebranch not in [n["path"] for n in nodes(e.cache)]
    e.check()


def test_lru_window_larger_than_path_refreshes_whole_path(strict):
    """W 64: chain x,y (2 each) and a sibling leaf z built after; matching xy refreshes
    y and x (the whole path) -> [y,x,z]: the first SWA victim is the leaf z."""
    e = SWAEnv(strict=strict, W=64, P=1)
    x, y = _chain(e, [2, 2])
    z = [70, 71]
    e.insert(z)
    e.match(y)
    r = e.cache.evict(EvictParams(swa_num_tokens=1))
    assert (r.num_tokens_evicted, r.swa_num_tokens_evicted) == (2, 2)
    assert z not in [n["path"] for n in nodes(e.cache)]
    assert shape(e.cache) == [(2, 2, True), (4, 2, True)]
    e.check()


# ----------------------------------------------------------------------------- B13
def test_b13a_leaf_wholly_outside_the_window_keeps_full_kv(strict):
    """W 4, P 1: insert 8 with cursor 8 -> one Full-only leaf of 8; no error, SWA 0.
    A match gets 0 (no live SWA) with full hit 8 and branching 8."""
    e = SWAEnv(strict=strict, W=4, P=1)
    r = e.insert(toks(8), cursor=8)
    assert r.prefix_len == 0
    assert shape(e.cache) == [(8, 8, False)]
    assert e.cache.total_size() == (8, 0)
    assert (e.cache.evictable_size(), e.cache.protected_size()) == (8, 0)
    assert (e.cache.swa_evictable_size(), e.cache.swa_protected_size()) == (0, 0)
    m = e.match(toks(8))
    assert (m.device_prefix_len, m.full_kv_hit_length, m.swa_branching_seqlen) == (0, 8, 8)
    e.check()


def test_b13b_recovery_under_a_full_lock_keeps_the_locked_slots(strict):
    """W 4, P 1: insert 8 (v) -> [0,4) + [4,8) live. Lock the leaf skipping SWA (Full
    path locked), evict 8 SWA -> both tombstoned (the leaf is Full-locked). Insert
    8 with fresh w: returns 8; the nodes keep v (locked) and take over w's SWA
    peers; w's Full slots are freed; both components' ledgers add up."""
    e = SWAEnv(strict=strict, W=4, P=1, size=32)
    v = e.fresh(8)
    e.insert(toks(8), value=v)
    leaf = find(e.cache, toks(8))["node_id"]
    lk = e.cache.lock(leaf, skip_lock_components=(SWA,))
    assert (e.cache.protected_size(), e.cache.swa_protected_size()) == (8, 0)
    r = e.cache.evict(EvictParams(swa_num_tokens=8))
    assert (r.num_tokens_evicted, r.swa_num_tokens_evicted) == (0, 8)
    assert shape(e.cache) == [(4, 4, False), (8, 4, False)]
    e.check()
    w = e.fresh(8)
    w_swa = e.alloc.full_to_swa_index_mapping[w].copy()
    r = e.insert(toks(8), value=w)
    assert r.prefix_len == 8
    np.testing.assert_array_equal(np.asarray(e.cache.path_device_indices(leaf)), v)
    assert shape(e.cache) == [(4, 4, True), (8, 4, True)]
    np.testing.assert_array_equal(e.alloc.full_to_swa_index_mapping[v], w_swa)
    assert e.alloc.full_attn_allocator.is_free(w).all()
    assert not e.alloc.full_attn_allocator.is_free(v).any()
    assert e.cache.total_size() == (8, 8)
    assert (e.cache.swa_evictable_size(), e.cache.swa_protected_size()) == (8, 0)
    assert (e.cache.evictable_size(), e.cache.protected_size()) == (0, 8)
    e.check()
    e.cache.unlock(lk)
    assert (e.cache.evictable_size(), e.cache.protected_size()) == (8, 0)
    e.check()


def test_recovery_under_window_lock_credits_protected(strict):
    """A tombstone inside a live window lock (Full and SWA locked, SWA data gone)
    that is recovered counts as SWA-protected. W 4, P 1: 4 tokens live, lock it
    (window = the node), release the window early and evict its SWA (Full-locked:
    tombstone), lock again (window on a tombstone: lock counted, 0 units moved),
    then recover it with fresh slots: the 4 units land on the protected side."""
    e = SWAEnv(strict=strict, W=4, P=1)
    e.insert(toks(4))
    n = find(e.cache, toks(4))["node_id"]
    l1 = e.cache.lock(n)
    e.cache.release_swa(l1)
    assert e.cache.evict(EvictParams(swa_num_tokens=4)).swa_num_tokens_evicted == 4
    l2 = e.cache.lock(n)
    assert e.cache.node_info(n)["swa_lock_ref"] == 1
    assert (e.cache.swa_evictable_size(), e.cache.swa_protected_size()) == (0, 0)
    e.insert(toks(4))
    assert e.cache.node_info(n)["has_swa"]
    assert (e.cache.swa_evictable_size(), e.cache.swa_protected_size()) == (0, 4)
    e.check()
    e.cache.unlock(l2)
    e.cache.unlock(l1)
    assert (e.cache.swa_evictable_size(), e.cache.swa_protected_size()) == (4, 0)
    e.check()


# ----------------------------------------------------------------------------- branching
def test_swa_branch_inserted(strict):
    """swa_branch_inserted = len(key) >= params.swa_branching_seqlen."""
    e = SWAEnv(strict=strict, W=4, P=1)
    assert e.insert(toks(8), swa_branching_seqlen=6).swa_branch_inserted is True
    assert e.insert(toks(6), swa_branching_seqlen=6).swa_branch_inserted is True
    assert e.insert(toks(4), swa_branching_seqlen=6).swa_branch_inserted is False
    assert e.insert(toks(4)).swa_branch_inserted is False
    e.check()


# ----------------------------------------------------------------------------- locks
def _two_nodes(W, P=2):
    """8 tokens, W 4..8, P 2 -> [0,4) + [4,8) (T 4) when W <= 4; else one node."""
    e = SWAEnv(W=W, P=P)
    e.insert(toks(4))
    e.insert(toks(8))
    return e, find(e.cache, toks(4))["node_id"], find(e.cache, toks(8))["node_id"]


def test_window_lock_boundary_on_the_anchor():
    """W 4: locking the leaf [4,8) covers 4 >= W at the leaf: boundary stamped there
    (not None); SWA protected 4 / evictable 4; Full protects the whole path (8)."""
    e, up, leaf = _two_nodes(4)
    r = e.cache.inc_lock_ref(leaf)
    assert r.delta == 8
    b = r.component_lock_uuids[SWA]
    assert b is not None
    assert (e.cache.swa_protected_size(), e.cache.swa_evictable_size()) == (4, 4)
    assert (e.cache.protected_size(), e.cache.evictable_size()) == (8, 0)
    assert e.cache.node_info(leaf)["swa_lock_ref"] == 1
    assert e.cache.node_info(up)["swa_lock_ref"] == 0
    e.check()
    r2 = e.cache.inc_lock_ref(up)                     # the parent is its own boundary
    assert r2.component_lock_uuids[SWA] not in (None, b)
    assert e.cache.swa_protected_size() == 8
    e.cache.dec_lock_ref(leaf, r)
    e.cache.dec_lock_ref(up, r2)
    assert (e.cache.swa_protected_size(), e.cache.swa_evictable_size()) == (0, 8)
    assert (e.cache.protected_size(), e.cache.evictable_size()) == (0, 8)
    e.check()


def test_window_lock_boundary_on_an_ancestor_and_at_root():
    """W 6, P 2, nodes [0,4) + [4,8) (inserted one by one, no cap): locking the leaf
    covers 4 then 8 >= 6 at the parent -> boundary there; with W 10 the walk
    reaches the root first -> boundary None. Both protect 8 SWA units."""
    for W, at_root in ((6, False), (10, True)):
        e, up, leaf = _two_nodes(W)
        assert shape(e.cache) == [(4, 4, True), (8, 4, True)]
        r = e.cache.inc_lock_ref(leaf)
        assert (r.component_lock_uuids[SWA] is None) is at_root
        assert e.cache.node_info(up)["swa_lock_ref"] == 1
        assert e.cache.swa_protected_size() == 8
        e.check()
        e.cache.dec_lock_ref(leaf, r.to_dec_params())
        assert (e.cache.swa_protected_size(), e.cache.swa_evictable_size()) == (0, 8)
        assert e.cache.node_info(up)["swa_lock_ref"] == 0
        e.check()


def test_window_lock_counts_tombstones(strict):
    """W 4, P 1: [0,2) tomb + [2,4) live (cursor 2); locking the leaf covers 2 (live)
    then 4 at the tombstone: both counted (swa_lock_ref 1), only 2 units move."""
    e = SWAEnv(strict=strict, W=4, P=1)
    e.insert(toks(4), cursor=2)
    leaf, tomb = find(e.cache, toks(4))["node_id"], find(e.cache, toks(2))["node_id"]
    r = e.cache.inc_lock_ref(leaf)
    assert r.component_lock_uuids[SWA] is not None
    assert e.cache.node_info(tomb)["swa_lock_ref"] == 1
    assert (e.cache.swa_protected_size(), e.cache.swa_evictable_size()) == (2, 0)
    e.check()
    e.cache.dec_lock_ref(leaf, r)
    assert e.cache.node_info(tomb)["swa_lock_ref"] == 0
    e.check()


def test_split_of_locked_node_keeps_both_halves_locked_and_release_is_exact(strict):
    """W 4, P 1: node X = [1,2,3,4] (boundary at itself). Insert [1,2,5,6] splits X at
    2: U = [1,2] gets lock counts and the stamp, X keeps its counts; SWA protected
    stays 4, the new leaf [5,6] is evictable 2. The release walks X, U (stamp) and
    returns exactly to 0."""
    e = SWAEnv(strict=strict, W=4, P=1)
    e.insert([1, 2, 3, 4])
    x = find(e.cache, [1, 2, 3, 4])["node_id"]
    lk = e.cache.lock(x)
    e.insert([1, 2, 5, 6])
    u = find(e.cache, [1, 2])
    assert u["swa_lock_ref"] == 1 and u["lock_ref"] == 1
    assert e.cache.node_info(x)["swa_lock_ref"] == 1
    assert (e.cache.swa_protected_size(), e.cache.swa_evictable_size()) == (4, 2)
    assert (e.cache.protected_size(), e.cache.evictable_size()) == (4, 2)
    e.check()
    e.cache.unlock(lk)
    assert all(n["swa_lock_ref"] == 0 and n["lock_ref"] == 0 for n in nodes(e.cache))
    assert (e.cache.swa_protected_size(), e.cache.swa_evictable_size()) == (0, 6)
    e.check()


def test_split_below_the_boundary_release_is_exact(strict):
    """W 6, P 1: A = [1,2] then B = [3,4,5,6]; lock B: B 4, A 6 -> boundary A. A
    split of B at [3,4] (insert [1,2,3,4,9,9]) copies the counts to the new middle
    node; the release walks B, its upper half and A, all back to 0."""
    e = SWAEnv(strict=strict, W=6, P=1)
    e.insert([1, 2])
    e.insert([1, 2, 3, 4, 5, 6])
    b = find(e.cache, [1, 2, 3, 4, 5, 6])["node_id"]
    lk = e.cache.lock(b)
    assert e.cache.swa_protected_size() == 6
    e.insert([1, 2, 3, 4, 9, 9])
    assert find(e.cache, [1, 2, 3, 4])["swa_lock_ref"] == 1
    assert (e.cache.swa_protected_size(), e.cache.swa_evictable_size()) == (6, 2)
    e.check()
    e.cache.unlock(lk)
    assert all(n["swa_lock_ref"] == 0 for n in nodes(e.cache))
    assert (e.cache.swa_protected_size(), e.cache.swa_evictable_size()) == (0, 8)
    e.check()


def test_two_windows_different_boundaries(strict):
    """W 4, P 1: Y = [1,2] with children B1 = [3,4] and B2 = [5] (page 1), P = parent
    of Y... built as: [1,2], [1,2,3,4], [1,2,5]: B1's window ends at Y (2 + 2),
    B2's (1 + 2 = 3 < 4) reaches the root -> None. Releases are independent."""
    e = SWAEnv(strict=strict, W=4, P=1)
    for t in ([1, 2], [1, 2, 3, 4], [1, 2, 5]):
        e.insert(t)
    b1, b2 = find(e.cache, [1, 2, 3, 4])["node_id"], find(e.cache, [1, 2, 5])["node_id"]
    l1, l2 = e.cache.lock(b1), e.cache.lock(b2)
    assert l1.receipt.component_lock_uuids[SWA] is not None
    assert l2.receipt.component_lock_uuids[SWA] is None
    assert find(e.cache, [1, 2])["swa_lock_ref"] == 2
    assert e.cache.swa_protected_size() == 5
    e.cache.unlock(l1)
    assert find(e.cache, [1, 2])["swa_lock_ref"] == 1
    assert e.cache.swa_protected_size() == 3
    e.cache.unlock(l2)
    assert e.cache.swa_protected_size() == 0
    e.check()


def test_skip_swa_lock():
    """skip_lock_components=(SWA,): Full path locked, no SWA lock, no SWA entry in the
    receipt; the release works with that receipt; release_swa on it is a KeyError
    with nothing changed."""
    e, up, leaf = _two_nodes(4)
    lk = e.cache.lock(leaf, skip_lock_components=(SWA,))
    assert tuple(lk.receipt.skipped_lock_components) == (SWA,)
    assert SWA not in lk.receipt.component_lock_uuids
    assert (e.cache.protected_size(), e.cache.swa_protected_size()) == (8, 0)
    before = e.cache._snapshot()
    with pytest.raises(KeyError):
        e.cache.release_swa(lk)
    from ...conftest import assert_state_equal
    assert_state_equal(before, e.cache._snapshot())
    assert lk.swa_released is False
    e.cache.unlock(lk)
    assert (e.cache.protected_size(), e.cache.swa_protected_size()) == (0, 0)
    e.check()


def test_release_swa_then_unlock():
    """release_swa: the window becomes SWA-evictable, Full stays protected, the lock
    is marked; a second release_swa on the same lock is a no-op; unlock then
    releases Full only (skip_swa)."""
    e, up, leaf = _two_nodes(4)
    lk = e.cache.lock(leaf)
    e.cache.release_swa(lk)
    assert lk.swa_released is True
    assert (e.cache.swa_protected_size(), e.cache.swa_evictable_size()) == (0, 8)
    assert (e.cache.protected_size(), e.cache.evictable_size()) == (8, 0)
    assert find(e.cache, toks(8))["has_swa"]  # Full still held: not a leaf, kept
    before = e.cache._snapshot()
    e.cache.release_swa(lk)
    from ...conftest import assert_state_equal
    assert_state_equal(before, e.cache._snapshot())
    e.check()
    # the window is evictable now although Full is held: SWA eviction tombstones both
    r = e.cache.evict(EvictParams(swa_num_tokens=8))
    assert (r.num_tokens_evicted, r.swa_num_tokens_evicted) == (0, 8)
    e.check()
    e.cache.unlock(lk)
    assert (e.cache.protected_size(), e.cache.evictable_size()) == (0, 8)
    e.check()


def test_release_swa_prefix_lock_releases_only_with_a_boundary(strict):
    """Request-level: a lock whose window reached the root (boundary None) is kept."""
    from flatradix import Req
    e = SWAEnv(strict=strict, W=10, P=2)
    e.insert(toks(8))
    leaf = find(e.cache, toks(8))["node_id"]
    req = Req(origin_input_ids=toks(8), lock=e.cache.lock(leaf))
    assert req.lock.receipt.component_lock_uuids[SWA] is None
    e.cache.release_swa_prefix_lock(req)
    assert req.lock.swa_released is False and e.cache.swa_protected_size() == 8
    e.cache.unlock(req.lock)
    e2, _, leaf2 = _two_nodes(4)
    req2 = Req(origin_input_ids=toks(8), lock=e2.cache.lock(leaf2))
    e2.cache.release_swa_prefix_lock(req2)
    assert req2.lock.swa_released is True and e2.cache.swa_protected_size() == 0
    e2.cache.unlock(req2.lock)
    e2.check()


def _refused(e, fn, exc, match=None):
    from ...conftest import assert_state_equal
    before = e.cache._snapshot()
    with pytest.raises(exc, match=match):
        fn()
    assert_state_equal(before, e.cache._snapshot())
    e.check()


def test_bad_releases_change_nothing():
    """Double release, missing receipt, receipt without the SWA entry, receipt of
    another node, full release after release_swa without skip_swa, a second window
    release through a copy of the lock: errors, tree unchanged."""
    from flatradix import DecLockRefParams, TreeLock
    e, up, leaf = _two_nodes(4)
    r = e.cache.inc_lock_ref(leaf)
    r_up = e.cache.inc_lock_ref(up)
    c = e.cache
    _refused(e, lambda: c.dec_lock_ref(leaf, None), KeyError)
    _refused(e, lambda: c.dec_lock_ref(leaf, DecLockRefParams(node_id=leaf)), KeyError)
    _refused(e, lambda: c.dec_lock_ref(up, r), AssertionError, "anchored on node")
    _refused(e, lambda: c.dec_lock_ref(leaf, r_up), AssertionError, "anchored on node")
    c.dec_lock_ref(leaf, r)
    _refused(e, lambda: c.dec_lock_ref(leaf, r), LockRefError, "lock_ref=0")
    c.dec_lock_ref(up, r_up)
    # full release after an early SWA release, without skip_swa
    lk = c.lock(leaf)
    c.release_swa(lk)
    _refused(e, lambda: c.dec_lock_ref(leaf, lk.receipt), AssertionError, "lock_ref=0")
    # the window released twice through a copy of the lock (swa_released False)
    twin = TreeLock(lk.node, lk.receipt)
    _refused(e, lambda: c.release_swa(twin), AssertionError, "lock_ref=0")
    assert twin.swa_released is False
    c.unlock(lk)
    assert (c.protected_size(), c.swa_protected_size()) == (0, 0)
    e.check()


# ----------------------------------------------------------------------------- eviction
def test_evict_leaf_whole_node_counts_full_too(strict):
    """A live SWA leaf is deleted whole by the SWA walk: Full and SWA both freed."""
    e = SWAEnv(strict=strict, W=4, P=1, size=16)
    e.insert([1, 2, 3])
    r = e.cache.evict(EvictParams(swa_num_tokens=1))
    assert (r.num_tokens_evicted, r.swa_num_tokens_evicted) == (3, 3)
    assert nodes(e.cache) == [] and e.cache.total_size() == (0, 0)
    assert (e.alloc.full_available_size(), e.alloc.swa_available_size()) == (16, 16)
    e.check()


def test_evict_full_locked_leaf_is_tombstoned(strict):
    """Leaf Full-locked, SWA unlocked (skip): the SWA walk tombstones it; the Full walk
    cannot touch it; after the unlock the Full walk deletes the tombstone (SWA 0)."""
    e = SWAEnv(strict=strict, W=4, P=1, size=16)
    e.insert([1, 2, 3])
    n = find(e.cache, [1, 2, 3])["node_id"]
    lk = e.cache.lock(n, skip_lock_components=(SWA,))
    r = e.cache.evict(EvictParams(num_tokens=10, swa_num_tokens=10))
    assert (r.num_tokens_evicted, r.swa_num_tokens_evicted) == (0, 3)
    assert shape(e.cache) == [(3, 3, False)]
    assert (e.alloc.full_available_size(), e.alloc.swa_available_size()) == (13, 16)
    e.check()
    e.cache.unlock(lk)
    r = e.cache.evict(EvictParams(num_tokens=10))
    assert (r.num_tokens_evicted, r.swa_num_tokens_evicted) == (3, 0)
    assert (e.alloc.full_available_size(), e.alloc.swa_available_size()) == (16, 16)
    e.check()


def test_evict_skips_locked_windows(strict):
    """W 4, P 1: [0,4) + [4,8); the leaf's window lock covers only the leaf. SWA walk:
    [0,4) tombstoned (internal), leaf skipped. After the unlock the leaf is deleted
    whole and the tombstone parent stays (it has Full)."""
    e = SWAEnv(strict=strict, W=4, P=1, size=32)
    e.insert(toks(8))
    lk = e.cache.lock(find(e.cache, toks(8))["node_id"])
    r = e.cache.evict(EvictParams(swa_num_tokens=100))
    assert (r.num_tokens_evicted, r.swa_num_tokens_evicted) == (0, 4)
    assert shape(e.cache) == [(4, 4, False), (8, 4, True)]
    e.check()
    e.cache.unlock(lk)
    r = e.cache.evict(EvictParams(swa_num_tokens=100))
    assert (r.num_tokens_evicted, r.swa_num_tokens_evicted) == (4, 4)
    assert shape(e.cache) == [(4, 4, False)]
    assert e.cache.total_size() == (4, 0)
    e.check()


def _mixed_tree(e):
    """Z = Full-only tombstone leaf [20..23] (oldest), then chain [0,4) live internal +
    [4,8) live leaf (W 4, P 1, T 4: one insert, capped)."""
    e.insert([20, 21, 22, 23], cursor=4)
    e.insert(toks(8))
    assert sorted(shape(e.cache)) == [(4, 4, False), (4, 4, True), (8, 4, True)]
    assert not find(e.cache, [20, 21, 22, 23])["has_swa"]


def test_evict_num_tokens_and_swa_num_tokens_interplay(strict):
    """evict(num 4, swa 8): the Full walk deletes the oldest leaf Z (Full 4, SWA 0);
    the SWA walk then tombstones [0,4) (4) and deletes the leaf [4,8) whole (Full 4,
    SWA 4): result (8, 8)."""
    e = SWAEnv(strict=strict, W=4, P=1, size=32)
    _mixed_tree(e)
    r = e.cache.evict(EvictParams(num_tokens=4, swa_num_tokens=8))
    assert (r.num_tokens_evicted, r.swa_num_tokens_evicted) == (8, 8)
    assert shape(e.cache) == [(4, 4, False)]
    e.check()


def test_evict_full_walk_frees_enough_swa(strict):
    """Two live leaves of 4; evict(num 4, swa 4): the Full walk's leaf deletion frees 4
    SWA too, so the SWA walk is skipped: (4, 4), one leaf left live."""
    e = SWAEnv(strict=strict, W=4, P=1, size=32)
    e.insert([1, 2, 3, 4])
    e.insert([9, 9, 9, 9])
    r = e.cache.evict(EvictParams(num_tokens=4, swa_num_tokens=4))
    assert (r.num_tokens_evicted, r.swa_num_tokens_evicted) == (4, 4)
    assert shape(e.cache) == [(4, 4, True)]
    assert find(e.cache, [9, 9, 9, 9])["has_swa"]
    e.check()


def test_evict_for_alloc_swa_shortfall_stops_after_one_tombstone(strict):
    """evict_for_alloc(swa 1): the first SWA victim, the internal [0,4), is tombstoned
    (4 SWA slots back) and that meets the target: (0, 4)."""
    e = SWAEnv(strict=strict, W=4, P=1, size=32)
    _mixed_tree(e)
    avail = e.alloc.swa_available_size()
    r = e.cache.evict_for_alloc(EvictParams(swa_num_tokens=1))
    assert (r.num_tokens_evicted, r.swa_num_tokens_evicted) == (0, 4)
    assert e.alloc.swa_available_size() == avail + 4
    e.check()
    r = e.cache.evict_for_alloc(EvictParams(num_tokens=4, swa_num_tokens=4))
    # Full: Z (oldest leaf, 4 Full); SWA: then the live leaf [4,8) whole
    assert (r.num_tokens_evicted, r.swa_num_tokens_evicted) == (8, 4)
    e.check()


def test_stepwise_swa_round(strict):
    """evict_device_start(SWA, 8) on the mixed tree: step 1 tombstones [0,4) (node
    None, progress, swa 4, Full 0), step 2 deletes the leaf [4,8) (its id, Full 4,
    SWA 4), step 3 ends the round; the controller frees the SWA peers of
    swa_freed_indices and then the Full slots of freed_indices; end returns 8."""
    e = SWAEnv(strict=strict, W=4, P=1, size=32)
    _mixed_tree(e)
    leaf = find(e.cache, toks(8))
    up_val = find(e.cache, toks(4))["value"]
    c = e.cache
    c.evict_device_start(SWA, 8)
    s1 = c.evict_device_next_node(SWA)
    assert (s1.node_id, s1.made_progress, s1.num_tokens, s1.swa_num_tokens) == (None, True, 0, 4)
    np.testing.assert_array_equal(np.asarray(s1.swa_freed_indices), up_val)
    assert len(s1.freed_indices) == 0
    e.alloc.free_swa_segment(s1.swa_freed_indices, start_pos=0)
    e.check()
    s2 = c.evict_device_next_node(SWA)
    assert (s2.node_id, s2.made_progress, s2.num_tokens, s2.swa_num_tokens) == (
        leaf["node_id"], True, 4, 4)
    np.testing.assert_array_equal(np.asarray(s2.freed_indices), leaf["value"])
    np.testing.assert_array_equal(np.asarray(s2.swa_freed_indices), leaf["value"])
    e.alloc.free_swa_segment(s2.swa_freed_indices, start_pos=0)
    e.alloc.free_full_segment(s2.freed_indices, start_pos=0)
    e.check()
    s3 = c.evict_device_next_node(SWA)
    assert (s3.node_id, s3.made_progress) == (None, False)
    assert c.evict_device_end(SWA) == 8
    e.check()


def test_stepwise_full_round_reports_swa_of_deleted_leaf(strict):
    """A Full step deleting a live leaf reports its SWA count and indices too."""
    e = SWAEnv(strict=strict, W=4, P=1, size=16)
    e.insert([1, 2, 3])
    val = find(e.cache, [1, 2, 3])["value"]
    c = e.cache
    c.evict_device_start(FULL, 1)
    s = c.evict_device_next_node(FULL)
    assert (s.num_tokens, s.swa_num_tokens, s.made_progress) == (3, 3, True)
    np.testing.assert_array_equal(np.asarray(s.swa_freed_indices), val)
    e.alloc.free_swa_segment(s.swa_freed_indices, start_pos=0)
    e.alloc.free_full_segment(s.freed_indices, start_pos=0)
    assert c.evict_device_next_node(FULL).made_progress is False
    assert c.evict_device_end(FULL) == 3
    e.check()


def test_split_places_upper_part_right_behind_the_child_in_the_lru(strict):
    """W 4, P 1: H = [0,2) tomb (cursor 2), X = [2,6) live leaf, then a sibling leaf Y
    (LRU: [Y, X]). Matching the first 4 tokens splits X at 4: U = [2,4) joins the
    LRU right behind X ([Y, X, U]); the validator rejects U (2 live after the hole)
    and H, so the best node is the root and nothing is refreshed. The next SWA
    victim is U (tombstoned); had U been put at the MRU end it would be X (a leaf,
    deleted whole)."""
    e = SWAEnv(strict=strict, W=4, P=1)
    e.insert(toks(2), cursor=2)
    own = np.asarray(e.cache.path_device_indices(find(e.cache, toks(2))["node_id"]))
    e.insert(toks(6), value=np.r_[own, e.fresh(4)], prev=2)
    e.insert([50, 51, 52, 53])
    m = e.match(toks(4))
    assert (m.device_prefix_len, m.full_kv_hit_length, m.swa_branching_seqlen) == (0, 4, 4)
    assert sorted(shape(e.cache)) == [(2, 2, False), (4, 2, True), (4, 4, True), (6, 2, True)]
    r = e.cache.evict(EvictParams(swa_num_tokens=1))
    assert (r.num_tokens_evicted, r.swa_num_tokens_evicted) == (0, 2)
    assert not find(e.cache, toks(4))["has_swa"]
    assert find(e.cache, toks(6))["has_swa"] and find(e.cache, [50, 51, 52, 53])["has_swa"]
    e.check()


def test_available_and_evictable_str_swa_line(strict):
    """One line per aux component: 'Available swa: <available + evictable> (...)'."""
    e = SWAEnv(strict=strict, W=4, P=1, size=32)
    e.insert(toks(6))                       # [0,2) + [2,6) live: SWA evictable 6
    lines = e.cache.available_and_evictable_str().splitlines()
    assert lines[0].startswith("Available full tokens: 32 ")
    assert lines[1].startswith("Available swa: 32 ")


def test_last_visited_node_id_counts_rejected_nodes(strict):
    """§3.2: the deepest non-root node walked, even if the validator rejected it."""
    e = SWAEnv(strict=strict, W=4, P=2)
    e.insert(toks(8), cursor=4)
    m = e.match(toks(6))
    assert m.device_prefix_len == 0
    assert m.last_visited_node_id == find(e.cache, toks(6))["node_id"]
    m = e.match(toks(8))
    assert m.last_visited_node_id == m.best_match_node == find(e.cache, toks(8))["node_id"]
    assert e.match([99, 99]).last_visited_node_id is None


@pytest.mark.parametrize("cursor,want", [
    (0, {FULL: [(0, 8)], SWA: [(0, 8)]}),
    (4, {FULL: [(0, 8)], SWA: [(4, 8)]}),
    (8, {FULL: [(0, 8)]}),
])
def test_adopted_ranges_of_a_new_leaf(cursor, want, strict):
    """W 4, P 2: the new leaf is adopted for Full; SWA only from the cursor on (none
    when the leaf is wholly before it)."""
    e = SWAEnv(strict=strict, W=4, P=2)
    r = e.insert(toks(8), cursor=cursor, track_adopted_ranges=True)
    assert r.adopted_ranges == want
    e.check()


def test_adopted_ranges_recovery_plus_new_leaf_coalesce(strict):
    """Tomb [0,4) recovered (Full and SWA adopted) and a new leaf [4,8): both
    components report one coalesced range [(0, 8)]."""
    e = SWAEnv(strict=strict, W=4, P=2)
    e.insert(toks(4), cursor=4)
    r = e.insert(toks(8), track_adopted_ranges=True)
    assert r.prefix_len == 4
    assert r.adopted_ranges == {FULL: [(0, 8)], SWA: [(0, 8)]}
    assert shape(e.cache) == [(4, 4, True), (8, 4, True)]
    e.check()


def test_adopted_ranges_locked_recovery_is_swa_only(strict):
    """Recovery under a Full lock keeps the tree's Full slots: only SWA is adopted."""
    e = SWAEnv(strict=strict, W=4, P=1, size=32)
    e.insert(toks(4))
    n = find(e.cache, toks(4))["node_id"]
    lk = e.cache.lock(n, skip_lock_components=(SWA,))
    assert e.cache.evict(EvictParams(swa_num_tokens=4)).swa_num_tokens_evicted == 4
    r = e.insert(toks(4), track_adopted_ranges=True)
    assert r.adopted_ranges == {SWA: [(0, 4)]}
    e.cache.unlock(lk)
    e.check()


def test_recovered_ancestor_outside_the_refresh_window_stays_at_mru(strict):
    """W 2, P 1 (refresh window 3): Z = [50,51] first; then 8 tokens with cursor 4:
    [0,4) tomb, live [4,8) capped to [4,6) + [6,8). LRU: [[6,8), [4,6), Z]. Re-insert
    the 8 tokens fresh: [0,4) is recovered and published at MRU; the insert-end
    refresh from [6,8) moves [6,8) and [4,6) (acc 0 -> 2 -> 4 >= 3) ahead of it:
    [[6,8), [4,6), [0,4), Z]. SWA victims: Z (a leaf: deleted whole), then [0,4)."""
    e = SWAEnv(strict=strict, W=2, P=1, size=32)
    e.insert([50, 51])
    e.insert(toks(8), cursor=4)
    assert sorted(shape(e.cache)) == [(2, 2, True), (4, 4, False), (6, 2, True), (8, 2, True)]
    e.insert(toks(8))
    assert find(e.cache, toks(4))["has_swa"]
    r = e.cache.evict(EvictParams(swa_num_tokens=1))
    assert (r.num_tokens_evicted, r.swa_num_tokens_evicted) == (2, 2)
    assert [50, 51] not in [n["path"] for n in nodes(e.cache)]
    r = e.cache.evict(EvictParams(swa_num_tokens=1))
    assert (r.num_tokens_evicted, r.swa_num_tokens_evicted) == (0, 4)
    assert not find(e.cache, toks(4))["has_swa"]
    assert find(e.cache, toks(6))["has_swa"] and find(e.cache, toks(8))["has_swa"]
    e.check()


def test_stepwise_swa_cursor_survives_a_refresh_between_steps(strict):
    """W 4, P 1: chain A [0,4), B [4,8), C [8,12) (one insert each): LRU [C, B, A].
    Step 1 tombstones A and moves the cursor to B. A match of the first 8 tokens
    between the steps (A hole, B 4 >= 4: best B) refreshes B to MRU: [B, C]. Step 2
    takes the cursor, B (internal: tombstoned), not the new tail C (a leaf)."""
    e = SWAEnv(strict=strict, W=4, P=1)
    for n in (4, 8, 12):
        e.insert(toks(n))
    c = e.cache
    c.evict_device_start(SWA, 100)
    s1 = c.evict_device_next_node(SWA)
    assert (s1.node_id, s1.swa_num_tokens) == (None, 4)
    e.alloc.free_swa_segment(s1.swa_freed_indices, start_pos=0)
    assert e.match(toks(8)).device_prefix_len == 8
    s2 = c.evict_device_next_node(SWA)
    for s in (s2,):
        if len(s.swa_freed_indices):
            e.alloc.free_swa_segment(s.swa_freed_indices, start_pos=0)
        if len(s.freed_indices):
            e.alloc.free_full_segment(s.freed_indices, start_pos=0)
    c.evict_device_end(SWA)
    assert (s2.node_id, s2.num_tokens, s2.swa_num_tokens) == (None, 0, 4)
    assert shape(e.cache) == [(4, 4, False), (8, 4, False), (12, 4, True)]
    e.check()


def test_disabled_swa_cache_lock_unlock_is_a_noop():
    from flatradix import SWATokenToKVPoolAllocator, UnifiedRadixCache
    c = UnifiedRadixCache(tree_components=(FULL, SWA), sliding_window_size=4, disable=True,
                          token_to_kv_pool_allocator=SWATokenToKVPoolAllocator(16, 16))
    root = c.root_node_handle()
    lk = c.lock(root)
    c.release_swa(lk)
    c.unlock(lk)
    c.dec_lock_ref(root, c.inc_lock_ref(root))
    assert c.total_size() == (0, 0)


def test_kv_events_swa_splits_do_not_split_the_store_and_tombstones_remove_nothing():
    """A new leaf split by SWA (tomb [0,4), capped live [4,8) + [8,12); W 4, P 2) is
    one GPU BlockStored of 6 pages / 12 tokens, parent None; tombstoning SWA data
    emits nothing (the Full KV stays); deleting the nodes removes the 6 pages."""
    from flatradix import SWATokenToKVPoolAllocator, UnifiedRadixCache
    a = SWATokenToKVPoolAllocator(32, 32, page_size=2)
    c = UnifiedRadixCache(page_size=2, tree_components=(FULL, SWA), sliding_window_size=4,
                          token_to_kv_pool_allocator=a, enable_kv_cache_events=True)
    c.take_events()
    v = a.alloc(12)
    a.free_swa_segment(v[:4], start_pos=0)
    from flatradix import InsertParams, RadixKey
    p = InsertParams(key=RadixKey(toks(12)), value=v)
    p.set_evicted_seqlen(SWA, 4)
    c.insert(p)
    ev = c.take_events()
    assert [type(x).__name__ for x in ev] == ["BlockStored"]
    assert ev[0].token_ids == toks(12) and len(ev[0].block_hashes) == 6
    assert ev[0].parent_block_hash is None
    stored = set(ev[0].block_hashes)
    assert c.evict(EvictParams(swa_num_tokens=1)).swa_num_tokens_evicted == 4
    assert c.take_events() == []
    assert c.evict(EvictParams(num_tokens=100)).num_tokens_evicted == 12
    removed = [h for x in c.take_events() for h in x.block_hashes]
    assert sorted(removed) == sorted(stored)
