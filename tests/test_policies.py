"""Every eviction policy on hand-worked scenarios (priority formulas of SGLang
0.5.23 ``evict_policy.py``; spec §7), plus step-wise eviction and evict_for_alloc.

Scenario A (page 1). Clock reads, in order (each insert first touches the root):
  insert a=[1,1] prio 5   -> a.last_access=t1, a.creation=t2        (hit 1)
  insert b=[2,2] prio 0   -> b: t4, t5                               (hit 1)
  insert c=[3,3] prio 9   -> c: t7, t8                               (hit 1)
  insert b again          -> b.last_access=t10, hit 2 (walked past inserted_len 0)
  match a                 -> a.last_access=t11
  match c                 -> c.last_access=t12
So last_access a=t11 b=t10 c=t12; creation a<b<c; hits a=1 b=2 c=1;
priority a=5 b=0 c=9. Expected eviction orders:
  lru  (last_access)                 b, a, c
  mru  (-last_access)                c, a, b
  fifo (creation)                    a, b, c
  filo (-creation)                   c, b, a
  lfu  (hit_count, last_access)      a, c, b
  priority (priority, last_access)   b, a, c
  slru (hit_count >= 2, last_access) a, c, b   (b is protected)
"""

import numpy as np
import pytest

from flatradix import (
    EvictParams, InsertParams, MatchPrefixParams, RadixKey, TokenToKVPoolAllocator,
    UnifiedRadixCache,
)

A, B, C = [1, 1], [2, 2], [3, 3]
VALUES = {tuple(A): [10, 11], tuple(B): [20, 21], tuple(C): [30, 31]}


def scenario_a(policy):
    c = UnifiedRadixCache(page_size=1, eviction_policy=policy)
    for key, prio in ((A, 5), (B, 0), (C, 9)):
        c.insert(InsertParams(key=RadixKey(key), value=np.array(VALUES[tuple(key)]), priority=prio))
    c.insert(InsertParams(key=RadixKey(B), value=np.array([90, 91])))
    c.match_prefix(MatchPrefixParams(key=RadixKey(A)))
    c.match_prefix(MatchPrefixParams(key=RadixKey(C)))
    return c


def eviction_order(c):
    order = []
    while c.total_size()[0]:
        r = c.evict(EvictParams(num_tokens=1))
        order.append(r.evicted_indices.tolist())
    return order


@pytest.mark.parametrize("policy,expected", [
    ("lru", [B, A, C]), ("mru", [C, A, B]), ("fifo", [A, B, C]), ("filo", [C, B, A]),
    ("lfu", [A, C, B]), ("priority", [B, A, C]), ("slru", [A, C, B]),
    ("LRU", [B, A, C]),
])
def test_policy_order_scenario_a(policy, expected):
    c = scenario_a(policy)
    c.sanity_check()
    assert eviction_order(c) == [VALUES[tuple(k)] for k in expected]


def test_slru_threshold_config():
    # threshold 3: b's 2 hits no longer protect it -> plain LRU order
    c = UnifiedRadixCache(page_size=1, eviction_policy="slru",
                          eviction_policy_config={"protected_threshold": 3})
    for key in (A, B, C):
        c.insert(InsertParams(key=RadixKey(key), value=np.array(VALUES[tuple(key)])))
    c.insert(InsertParams(key=RadixKey(B), value=np.array([90, 91])))
    c.match_prefix(MatchPrefixParams(key=RadixKey(A)))
    c.match_prefix(MatchPrefixParams(key=RadixKey(C)))
    assert eviction_order(c) == [VALUES[tuple(k)] for k in (B, A, C)]


def test_tlru_evicts_safe_tails_first():
    """threshold 3, next_prompt_estimate 0.
    x=[1,1,1,1]: depth 4, own 4 -> cached-without-node 0, history 4, budget 1: not safe.
    [5,5] -> [6,6]: the [6,6] leaf has depth 4, own 2 -> 2 >= budget 1: safe (-1),
    so it goes first although x is older (LRU would take x first). Then x
    (last_access older than [5,5], which the second insert touched), then [5,5]
    (depth 2, own 2 -> 0 < 1: not safe)."""
    for policy, expected in (("tlru", [[60, 61], [1, 2, 3, 4], [50, 51]]),
                             ("lru", [[1, 2, 3, 4], [60, 61], [50, 51]])):
        cfg = {"threshold": 3, "next_prompt_estimate": 0} if policy == "tlru" else None
        c = UnifiedRadixCache(page_size=1, eviction_policy=policy, eviction_policy_config=cfg)
        c.insert(InsertParams(key=RadixKey([1, 1, 1, 1]), value=np.array([1, 2, 3, 4])))
        c.insert(InsertParams(key=RadixKey([5, 5]), value=np.array([50, 51])))
        c.insert(InsertParams(key=RadixKey([5, 5, 6, 6]), value=np.array([50, 51, 60, 61])))
        c.sanity_check()
        assert eviction_order(c) == expected, policy


def test_locked_leaf_skipped_then_evictable_after_unlock():
    c = scenario_a("lru")
    nb = c.match_prefix(MatchPrefixParams(key=RadixKey(B))).last_device_node  # b now newest
    receipt = c.inc_lock_ref(nb)
    r = c.evict(EvictParams(num_tokens=100))
    assert r.num_tokens_evicted == 4 and sorted(r.evicted_indices.tolist()) == [10, 11, 30, 31]
    c.dec_lock_ref(nb, receipt)
    assert c.evict(EvictParams(num_tokens=1)).evicted_indices.tolist() == [20, 21]


def test_chain_collapses_bottom_up_and_parent_competes():
    """[1,2] -> {[3,4], [5,6]} and a separate old leaf [9,9]. After both children of
    [1,2] go, [1,2] becomes a leaf with its (match-refreshed) recency."""
    c = UnifiedRadixCache(page_size=1)
    c.insert(InsertParams(key=RadixKey([9, 9]), value=np.array([90, 91])))
    c.insert(InsertParams(key=RadixKey([1, 2, 3, 4]), value=np.array([1, 2, 3, 4])))
    c.insert(InsertParams(key=RadixKey([1, 2, 5, 6]), value=np.array([1, 2, 5, 6])))
    c.match_prefix(MatchPrefixParams(key=RadixKey([9, 9])))  # [9,9] newest leaf
    assert eviction_order(c) == [[3, 4], [5, 6], [1, 2], [90, 91]]


def test_step_wise_eviction_matches_evict():
    ref = scenario_a("lru")
    c = scenario_a("lru")
    c.evict_device_start(num_tokens=4)
    with pytest.raises(RuntimeError, match="already in progress"):
        c.evict_device_start(num_tokens=1)
    steps = []
    while True:
        step = c.evict_device_next_node()
        if step.node_id is None:
            break
        assert step.made_progress and not step.needs_backup
        steps.append(step.freed_indices.tolist())
    assert c.evict_device_end() == 4
    assert steps == eviction_order(ref)[:2]
    with pytest.raises(RuntimeError, match="evict_device_start"):
        c.evict_device_next_node()
    c.sanity_check()


def test_step_wise_round_keys_leaves_at_its_start():
    """SGLang §5.4: a Full round heapifies the evictable leaves with their keys at
    the start. LRU, leaves A [1,2,3] (oldest), B [5,6], C [8]: step 1 takes A; a
    match of B between the steps does not spare it (its stale key is still older
    than C's), so step 2 takes B. C gets a child and D is inserted between the
    steps: neither the child nor D was a leaf at the start and C's entry is stale
    (not a leaf), so step 3 finds nothing; the next round takes them."""
    c = UnifiedRadixCache()
    for k, v in (([1, 2, 3], [0, 1, 2]), ([5, 6], [3, 4]), ([8], [5])):
        c.insert(InsertParams(key=RadixKey(k), value=np.array(v)))
    c.evict_device_start(num_tokens=100)
    assert c.evict_device_next_node().freed_indices.tolist() == [0, 1, 2]
    c.match_prefix(MatchPrefixParams(key=RadixKey([5, 6])))
    c.insert(InsertParams(key=RadixKey([9, 9]), value=np.array([6, 7])))       # D
    c.insert(InsertParams(key=RadixKey([8, 4]), value=np.array([5, 8])))       # C's child
    assert c.evict_device_next_node().freed_indices.tolist() == [3, 4]          # B, stale key
    assert c.evict_device_next_node().made_progress is False
    assert c.evict_device_end() == 5
    assert c.evictable_size() == 4
    c.evict_device_start(num_tokens=100)                                        # next round
    got = []
    while (st := c.evict_device_next_node()).made_progress:
        got.append(st.freed_indices.tolist())
    assert c.evict_device_end() == 4
    assert got == [[6, 7], [8], [5]]  # D (older than C's child), the child, then C as its parent
    c.sanity_check()


def test_evict_for_alloc_stops_when_allocation_fits():
    alloc = TokenToKVPoolAllocator(10)
    c = UnifiedRadixCache(page_size=1, token_to_kv_pool_allocator=alloc)
    for k in ([1, 1, 1], [2, 2, 2], [3, 3, 3]):
        c.insert(InsertParams(key=RadixKey(k), value=alloc.alloc(3)))
    assert alloc.available_size() == 1
    assert c.evict_for_alloc(1) == 0
    assert c.evict_for_alloc(5) == 6  # two 3-token leaves
    assert alloc.available_size() == 7
    assert c.evictable_size() == 3
