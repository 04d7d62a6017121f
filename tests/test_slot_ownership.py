"""KV slot ownership at the cache boundary (found by a fresh-eyes review).

* A cache built with ``disable=True`` caches nothing through the request path
  either: a finished request's whole row goes back to the allocator, and
  ``checkpoint`` / ``cache_unfinished_req`` change nothing (SGLang's disabled
  cache does the same).
* With flatradix's allocator attached, ``insert`` refuses KV slots the allocator
  has not handed out (free, slot 0, outside ``1..size``, or given twice) before
  anything changes: freeing them later, at eviction, would fail half-way.
* On the request path a "duplicate" equal to the tree's own slot at its
  position is the same KV and is never freed (a request released without
  ``prefix_indices`` / ``cache_protected_len`` used to free slots the tree still
  pointed at). Plain ``insert`` keeps SGLang's rule: ``value[prev_prefix_len:
  prefix_len]`` is freed (the differential oracle holds it to that).

Every scenario checks KV conservation: free + cached + held by requests == pool.
"""

import numpy as np
import pytest

from flatradix import (
    InsertParams, MatchPrefixParams, RadixKey, Req, ReqToTokenPool, TokenToKVPoolAllocator,
    UnifiedRadixCache,
)

from .conftest import assert_state_equal


def test_disabled_cache_frees_a_finished_request_row():
    a = TokenToKVPoolAllocator(16)
    rp = ReqToTokenPool(2, 16)
    c = UnifiedRadixCache(disable=True, token_to_kv_pool_allocator=a, req_to_token_pool=rp)
    row = rp.alloc(1)[0]
    rp.req_to_token[row, :5] = a.alloc(5)
    req = Req(origin_input_ids=[1, 2, 3, 4, 5], output_ids=[6], req_pool_idx=row)
    assert c.cache_unfinished_req(req) == 0          # no-op: the request keeps its KV
    assert a.available_size() == 11 and c.total_size()[0] == 0
    c.cache_finished_req(req)
    assert a.available_size() == 16                  # all five slots back
    assert c.total_size() == (0, 0) and c.evictable_size() == 0
    assert req.req_pool_idx is None and rp.available_size() == 2


@pytest.fixture
def cache():
    a = TokenToKVPoolAllocator(32, page_size=16)
    c = UnifiedRadixCache(page_size=1, token_to_kv_pool_allocator=a)
    c.insert(InsertParams(key=RadixKey([1, 2]), value=a.alloc(2)))
    return c, a


@pytest.mark.parametrize("make,msg", [
    (lambda a, s: np.array([s[0], s[0]]), "appears twice"),
    (lambda a, s: np.array([s[0], 0]), "outside"),
    (lambda a, s: np.array([s[0], 33]), "outside"),      # size + 1 (page_size 16 pads 47)
    (lambda a, s: np.array([s[0], s[1] + 1]), "free in the allocator"),
])
def test_insert_refuses_slots_the_allocator_did_not_hand_out(cache, make, msg):
    c, a = cache
    s = a.alloc(2)
    bad = make(a, s)
    before, free_before = c._snapshot(), a.available_size()
    with pytest.raises(ValueError, match=msg):
        c.insert(InsertParams(key=RadixKey([7, 8]), value=bad))
    assert_state_equal(before, c._snapshot())
    assert a.available_size() == free_before
    c.sanity_check()


def test_release_without_prefix_fields_keeps_the_tree_slots():
    """The request's row starts with the tree's own slots (from match_prefix) but it
    declares no prefix: only the slots it allocated itself go back."""
    a = TokenToKVPoolAllocator(32)
    rp = ReqToTokenPool(4, 16)
    c = UnifiedRadixCache(token_to_kv_pool_allocator=a, req_to_token_pool=rp)
    c.insert(InsertParams(key=RadixKey([1, 2, 3, 4]), value=a.alloc(4)))
    m = c.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3, 4, 5, 6])))
    c.inc_lock_ref(m.last_device_node)
    row = rp.alloc(1)[0]
    rp.req_to_token[row, :4] = m.device_indices
    own = a.alloc(1)
    rp.req_to_token[row, 4] = own[0]
    c.cache_finished_req(Req(origin_input_ids=[1, 2, 3, 4, 5], output_ids=[6], req_pool_idx=row,
                             last_node=m.last_device_node))
    cached = c.all_values_flatten()
    assert not a.is_free(cached).any()
    np.testing.assert_array_equal(np.sort(cached), np.r_[m.device_indices, own])
    assert a.available_size() + c.total_size()[0] == 32
    assert c.protected_size() == 0
    c.sanity_check()
