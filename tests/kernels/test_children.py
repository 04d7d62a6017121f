"""The open-addressing child table: page keys hash P units, and every hit is
confirmed against the child's stored page, so a hash collision cannot join two
different pages."""

import numpy as np

from flatradix import InsertParams, MatchPrefixParams, RadixKey, UnifiedRadixCache
from flatradix.kernels import layout as L
from flatradix.kernels.children import page_key


def test_page_key_is_the_token_at_page_1():
    assert page_key(np.array([7, 8, 9], dtype=np.int64), 1, 1) == 8


def test_colliding_page_keys_are_told_apart(monkeypatch):
    c = UnifiedRadixCache(page_size=4)
    c.insert(InsertParams(key=RadixKey([1, 2, 3, 4, 5, 6, 7, 8])))
    c.insert(InsertParams(key=RadixKey([1, 2, 3, 4, 9, 9, 9, 9])))
    # Forge a collision: rewrite the stored page key of the [9,9,9,9] child to the
    # key of [5,6,7,8]; lookups must still tell the two pages apart.
    k5 = page_key(np.array([5, 6, 7, 8], dtype=np.int64), 0, 4)
    k9 = page_key(np.array([9, 9, 9, 9], dtype=np.int64), 0, 4)
    rows = np.nonzero(c._engine.st.ctab[:, L.CT_PAGEKEY] == k9)[0]
    assert len(rows) == 1
    m9 = c.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3, 4, 9, 9, 9, 9])))
    assert m9.device_prefix_len == 8
    c._engine.st.ctab[rows[0], L.CT_PAGEKEY] = k5
    m5 = c.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3, 4, 5, 6, 7, 8])))
    assert m5.device_prefix_len == 8
    assert m5.device_indices.tolist() == [1, 2, 3, 4, 5, 6, 7, 8]


def test_many_children_and_rebuild():
    c = UnifiedRadixCache(page_size=1, node_capacity=8)
    for t in range(5000):
        c.insert(InsertParams(key=RadixKey([0, t]), value=np.array([1, 10 + t])))
    c.sanity_check()
    for t in range(0, 5000, 97):
        assert c.match_prefix(MatchPrefixParams(key=RadixKey([0, t]))).device_indices.tolist() == [1, 10 + t]
