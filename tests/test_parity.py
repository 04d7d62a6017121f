"""Randomised lock-step parity: flatradix.UnifiedRadixCache vs tests/reference.py.

Every operation of a seeded random stream (insert, match, lock, unlock, evict,
path queries on possibly-stale handles, reset) is applied to both caches and
the results are compared exactly after each op: prefix lengths, matched /
duplicate / evicted KV indices (in order), size ledgers, node counts, lock
deltas, error classes, and node identity (as a consistent bijection, never raw
id values). ``node_info`` (key, value, lock_ref, children, last_access,
creation, hit_count, priority, evictable-leaf flag) of paired nodes is compared
too: for a sample after every op and for every paired node every 8th op; that
is what pins the exact clock protocol, which eviction order alone cannot
observe. flatradix's ``sanity_check()`` runs after every op.

Half of the streams start flatradix with tiny arrays (``Pair(small=True)``) so
node-table / child-table growth and pool compaction happen all the time.
"""

import random
import zlib

import numpy as np
import pytest

from flatradix import InsertParams, RadixKey, UnifiedRadixCache

from .parity import POLICY_CASES, Pair, policy_id, run_stream

STEPS = 300

CONFIGS = [(p, False) for p in (1, 4, 16)] + [(p, True) for p in (1, 4)]


def _seed(*parts):
    """Deterministic per-case seed (independent of PYTHONHASHSEED)."""
    return zlib.crc32(repr(parts).encode())


@pytest.mark.parametrize("namespaces", [False, True], ids=["ns0", "ns"])
@pytest.mark.parametrize("page_size,is_eagle", CONFIGS,
                         ids=[f"p{p}{'-eagle' if e else ''}" for p, e in CONFIGS])
@pytest.mark.parametrize("policy_case", POLICY_CASES, ids=[policy_id(c) for c in POLICY_CASES])
def test_random_stream_parity(policy_case, page_size, is_eagle, namespaces):
    policy, cfg = policy_case
    seed = _seed(policy_id(policy_case), page_size, is_eagle, namespaces)
    pair = Pair(page_size, policy, cfg, is_eagle, small=namespaces)
    try:
        run_stream(pair, random.Random(seed), STEPS, namespaces=namespaces)
    except AssertionError as e:
        raise AssertionError(f"{e}\nseed={seed}\nlast ops:\n{pair.history()}") from e


@pytest.mark.parametrize("policy_case", [("lru", None), ("lfu", None),
                                         ("tlru", {"threshold_pages": 3,
                                                   "next_prompt_estimate_pages": 1})],
                         ids=policy_id)
@pytest.mark.parametrize("page_size", [1, 4])
def test_random_stream_parity_with_allocator(policy_case, page_size):
    """Freed duplicates / evicted indices go through an attached allocator, in order."""
    policy, cfg = policy_case
    seed = _seed("alloc", policy_id(policy_case), page_size)
    pair = Pair(page_size, policy, cfg, False, allocator=True)
    try:
        run_stream(pair, random.Random(seed), STEPS, namespaces=True)
    except AssertionError as e:
        raise AssertionError(f"{e}\nseed={seed}\nlast ops:\n{pair.history()}") from e


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("policy", ["lru", "lfu", "tlru"])
def test_long_stream_wide_tree(policy, page_size, seed):
    """Longer streams over more prompts, with a larger tree before forced eviction."""
    cfg = {"threshold_pages": 3, "next_prompt_estimate_pages": 1} if policy == "tlru" else None
    pair = Pair(page_size, policy, cfg, False, small=bool(seed))
    try:
        run_stream(pair, random.Random(1000 + seed), 1000, namespaces=True, max_total=3000,
                   n_prompts=12, vocab=6)
    except AssertionError as e:
        raise AssertionError(f"{e}\nseed={seed}\nlast ops:\n{pair.history()}") from e


# ---------------------------------------------------------------- hand-made cases
def _key(toks, **kw):
    return RadixKey(list(toks), **kw)


@pytest.mark.parametrize("policy_case", POLICY_CASES, ids=[policy_id(c) for c in POLICY_CASES])
def test_chain_collapses_bottom_up(policy_case):
    """A parent that becomes a leaf during an evict competes in the same call."""
    policy, cfg = policy_case
    pair = Pair(1, policy, cfg)
    pair.insert(_key([1, 2, 3]), np.array([10, 11, 12]))
    pair.insert(_key([1, 2, 3, 4, 5]), np.array([20, 21, 22, 23, 24]))
    pair.insert(_key([1, 2, 9]), np.array([30, 31, 32]))
    pair.insert(_key([7, 7]), np.array([40, 41]))
    pair.match(_key([1, 2, 3, 4]))
    pair.check()
    for n in (1, 1, 2, 100):
        pair.evict(n)
        pair.check()
    assert pair.f.total_size()[0] == 0 and pair.f.node_count() == 0


def test_split_keeps_lower_node_identity():
    pair = Pair(1, "lru", None)
    leaf, _ = pair.insert(_key([1, 2, 3, 4]), np.array([10, 11, 12, 13]))
    upper, plen = pair.match(_key([1, 2, 5]))
    assert plen == 2 and upper != leaf
    again, plen = pair.match(_key([1, 2, 3, 4, 5]))
    assert again == leaf and plen == 4
    pair.path(leaf)
    pair.path(upper)
    pair.check()


def test_namespaces_are_tuples():
    """("a", None), (None, "a") and ("", None) are different namespaces; cache_salt ""
    is None."""
    pair = Pair(1, "lru", None)
    pair.insert(_key([1, 2, 3], extra_key="a"), np.array([1, 2, 3]))
    for kw in ({}, {"cache_salt": "a"}, {"extra_key": ""}, {"extra_key": "a", "cache_salt": "x"}):
        _, plen = pair.match(_key([1, 2, 3], **kw))
        assert plen == 0
    _, plen = pair.match(_key([1, 2, 3], extra_key="a", cache_salt=""))
    assert plen == 3
    pair.check()


def test_eagle_bigram_units():
    pair = Pair(2, "lru", None, is_eagle=True)
    _, plen = pair.insert(_key([5, 6, 7, 8, 9]), np.array([1, 2, 3, 4]))
    assert plen == 0
    _, plen = pair.match(RadixKey([5, 6, 7, 8, 1], is_bigram=True))
    assert plen == 2
    _, plen = pair.insert(_key([5, 6, 7, 8, 9, 10]), np.array([11, 12, 13, 14, 15, 16]))
    assert plen == 4
    pair.check()


def test_lock_underflow_and_stale_handles():
    pair = Pair(4, "lfu", None)
    node, _ = pair.insert(_key(range(8)), np.arange(8))
    assert pair.inc(node)
    assert pair.dec(node)
    assert not pair.dec(node)          # LockRefError on both
    pair.evict(100)
    assert not pair.inc(node)          # NodeAccessError on both
    pair.path(node)
    pair.reset()
    pair.path(pair.root)
    pair.check()


def test_insert_priority_and_inserted_len():
    pair = Pair(1, "priority", None)
    pair.insert(_key([1, 2, 3, 4]), np.array([1, 2, 3, 4]), priority=5)
    pair.insert(_key([1, 2, 9, 9]), np.array([5, 6, 7, 8]), priority=-1, prev_prefix_len=1,
                inserted_len=3)
    pair.insert(_key([8]), np.array([9]), priority=2)
    for _ in range(4):
        pair.evict(1)
        pair.check()


def test_release_of_unlocked_ancestor_keeps_invariants():
    """Releasing a node that was never locked itself, whose lock_ref is non-zero only
    because a descendant is locked (a caller bug SGLang does not detect either).
    The documented contract refuses a release only when some lock_ref on the path is
    0, so the call is accepted; then the tree must still pass its own
    ``sanity_check()`` (or, if flatradix chooses to refuse such a release, it must
    raise LockRefError and leave the tree unchanged)."""
    from flatradix import LockRefError, UnifiedRadixCache

    c = UnifiedRadixCache(page_size=1)
    a = c.insert(InsertParams(key=RadixKey([1, 2]), value=np.array([10, 11]))).last_device_node
    b = c.insert(InsertParams(key=RadixKey([1, 2, 3]), value=np.array([20, 21, 22]))).last_device_node
    c.inc_lock_ref(b)
    try:
        c.dec_lock_ref(a)
    except LockRefError:
        assert (c.evictable_size(), c.protected_size()) == (0, 3)
    else:
        assert (c.evictable_size(), c.protected_size()) == (2, 1)
    c.sanity_check()


@pytest.mark.parametrize("page_size", [1, 4])
def test_output_scratch_outgrown_mid_call(monkeypatch, page_size):
    """The output scratch and the action buffer are sized per call, not by the pool:
    start them at 2 entries / 1 row so nearly every match, path query, insert and
    eviction outgrows them (an eviction resumes its round after growing them).
    Results, in order, must still equal the reference's."""
    import flatradix.engine as fe

    monkeypatch.setattr(fe, "OUT_MIN", 2)
    monkeypatch.setattr(fe, "ACTS_MIN", 1)
    pair = Pair(page_size, "lru", None, False, small=True)
    assert pair.f._engine.out.shape[0] == 2
    try:
        run_stream(pair, random.Random(4242 + page_size), 600, namespaces=True, max_total=3000,
                   n_prompts=12, vocab=6)
    except AssertionError as e:
        raise AssertionError(f"{e}\nlast ops:\n{pair.history()}") from e
    assert pair.f._engine.out.shape[0] > 2


def test_step_wise_eviction_of_a_leaf_longer_than_the_scratch(monkeypatch):
    """A step-wise victim longer than the output scratch: the scratch grows, the step
    returns the leaf's whole value, and a long path query returns every index."""
    import flatradix.engine as fe

    monkeypatch.setattr(fe, "OUT_MIN", 4)
    monkeypatch.setattr(fe, "ACTS_MIN", 1)
    c = UnifiedRadixCache(page_size=1)
    c.insert(InsertParams(key=RadixKey(list(range(100, 150))), value=np.arange(1000, 1050)))
    r = c.insert(InsertParams(key=RadixKey(list(range(100, 120)) + [7] * 30),
                              value=np.arange(2000, 2050)))
    assert r.prefix_len == 20
    np.testing.assert_array_equal(c.path_device_indices(r.last_device_node),
                                  np.r_[np.arange(1000, 1020), np.arange(2020, 2050)])
    c.evict_device_start(num_tokens=31)
    first = c.evict_device_next_node()   # LRU: the older leaf [120:150) goes first
    second = c.evict_device_next_node()  # then the other 30-unit leaf
    assert c.evict_device_next_node().node_id is None  # 60 >= 31: the round is done
    assert c.evict_device_end() == 60
    np.testing.assert_array_equal(first.freed_indices, np.arange(1020, 1050))
    np.testing.assert_array_equal(second.freed_indices, np.arange(2020, 2050))
    c.sanity_check()


def test_adopted_ranges_worked_numbers():
    """spec §5.2's worked numbers (page P = 4), and SGLang 0.5.23's shapes for
    the edge cases: ``{}`` when nothing is adopted, ``None`` for an empty
    page-aligned key or without tracking."""
    from flatradix import UnifiedRadixCache
    from flatradix.types import ComponentType

    P = 4
    cache = UnifiedRadixCache(page_size=P)

    def ins(n_tokens, first_value, prev=0, track=True, key_start=0):
        res = cache.insert(InsertParams(
            key=RadixKey(list(range(key_start, key_start + n_tokens))),
            value=np.arange(first_value, first_value + n_tokens), prev_prefix_len=prev,
            track_adopted_ranges=track))
        return res.adopted_ranges

    assert ins(P, 100) == {ComponentType.FULL: [(0, P)]}
    assert ins(2 * P, 200) == {ComponentType.FULL: [(P, 2 * P)]}
    assert ins(3 * P, 300, prev=2 * P) == {ComponentType.FULL: [(2 * P, 3 * P)]}
    assert ins(3 * P, 400) == {}                    # all cached: nothing adopted
    assert ins(P - 1, 500, key_start=50) is None    # page-aligned key is empty
    assert ins(P, 600, track=False, key_start=60) is None
    cache.sanity_check()
