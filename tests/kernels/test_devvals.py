"""``core/devvals.py``: ``claim_values`` on hand-worked trees (issue 29).

An insert into a device-valued cache writes tags (``TAG + input position``) into
the rows it fills; ``claim_values`` walks from the deepest written node to the
root, sets the tagged rows back to themselves and reports them as runs
``(row, input position, length)``, deepest first, adjacent pieces merged.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flatradix as F  # noqa: E402
from flatradix import device as D  # noqa: E402
from flatradix.core import devvals  # noqa: E402
from flatradix.kernels import layout as L  # noqa: E402


def test_the_kernel_tag_is_the_arena_tag():
    assert devvals.TAG == D.TAG


def _cache():
    # no allocator: the arena starts with the first value (a torch tensor)
    return F.UnifiedRadixCache(page_size=1, device_values=True)


def _node(c, key):
    assert c.device_values
    m = c.match_prefix(F.MatchPrefixParams(key=F.RadixKey(key)))
    assert m.device_prefix_len == len(key)
    return int(m.last_device_node) & 0xFFFFFFFF


def _rows(c, slot):
    nodes = c._engine.st.nodes
    off, n = int(nodes[slot, L.KEY_OFF]), int(nodes[slot, L.KEY_LEN])
    return off, n


def test_claim_turns_tags_into_runs_and_rows_back_to_themselves():
    c = _cache()
    eng = c._engine
    c.insert(F.InsertParams(key=F.RadixKey([1, 2, 3, 4]), value=torch.tensor([11, 12, 13, 14])))
    c.insert(F.InsertParams(key=F.RadixKey([1, 2, 9]), value=torch.tensor([11, 12, 19])))
    parent, child = _node(c, [1, 2]), _node(c, [1, 2, 3, 4])
    po, pn = _rows(c, parent)
    co, cn = _rows(c, child)
    assert (pn, cn) == (2, 2)
    pool = eng.st.pool
    assert pool[po:po + 2, L.FULL_DEV].tolist() == [po, po + 1]   # self-referencing
    # tag the parent with positions 10, 11 and the child with 12, 13
    pool[po:po + 2, L.FULL_DEV] = D.TAG + np.array([10, 11])
    pool[co:co + 2, L.FULL_DEV] = D.TAG + np.array([12, 13])
    runs = np.zeros((4, 3), dtype=np.int64)
    k = eng.k.claim_values(child, runs)
    assert co == po + 2   # the split keeps the rows where they were: adjacent
    assert k == 1 and runs[0].tolist() == [po, 10, 4]   # one merged run
    assert pool[po:po + 4, L.FULL_DEV].tolist() == [po, po + 1, po + 2, po + 3]
    # the other leaf [9] sits at a row apart from its parent's: two runs
    leaf = _node(c, [1, 2, 9])
    lo, ln = _rows(c, leaf)
    assert ln == 1 and lo != po + 2
    pool[po:po + 2, L.FULL_DEV] = D.TAG + np.array([10, 11])
    pool[lo, L.FULL_DEV] = D.TAG + 12
    k = eng.k.claim_values(leaf, runs)
    assert k == 2 and runs[:2].tolist() == [[lo, 12, 1], [po, 10, 2]]
    c.sanity_check()


def test_claim_splits_runs_where_positions_jump_and_skips_untagged_nodes():
    c = _cache()
    eng = c._engine
    c.insert(F.InsertParams(key=F.RadixKey([5, 6, 7, 8, 9]), value=torch.tensor([1, 2, 3, 4, 5])))
    s = _node(c, [5, 6, 7, 8, 9])
    off, n = _rows(c, s)
    pool = eng.st.pool
    # positions 0, 1 then 7, 8 (a jump), the last row untagged
    pool[off:off + 4, L.FULL_DEV] = D.TAG + np.array([0, 1, 7, 8])
    runs = np.zeros((4, 3), dtype=np.int64)
    k = eng.k.claim_values(s, runs)
    assert k == 2 and runs[:2].tolist() == [[off, 0, 2], [off + 2, 7, 2]]
    assert pool[off:off + n, L.FULL_DEV].tolist() == list(range(off, off + n))


def test_claim_with_too_small_scratch_changes_nothing():
    c = _cache()
    eng = c._engine
    c.insert(F.InsertParams(key=F.RadixKey([5, 6, 7]), value=torch.tensor([1, 2, 3])))
    s = _node(c, [5, 6, 7])
    off, _ = _rows(c, s)
    pool = eng.st.pool
    pool[off:off + 3, L.FULL_DEV] = D.TAG + np.array([0, 5, 9])
    before = pool.copy()
    assert eng.k.claim_values(s, np.zeros((2, 3), dtype=np.int64)) == -3
    assert np.array_equal(pool, before)
    runs = np.zeros((3, 3), dtype=np.int64)
    assert eng.k.claim_values(s, runs) == 3
    assert runs.tolist() == [[off, 0, 1], [off + 1, 5, 1], [off + 2, 9, 1]]
