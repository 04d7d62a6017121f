"""The engine's one way to call a kernel (``Engine.k``) and its calling conventions."""

import numpy as np
import pytest

from flatradix import inspection as Q
from flatradix.engine import Engine
from flatradix.kernels import layout as L
from flatradix.kernels._jit import SPECS, kernel
from flatradix.kernels.actions import A_FREE_SLOT


def _engine(**kw):
    return Engine(page_size=1, policy=L.POLICY_LRU, **kw)


def _insert(eng, toks, first):
    """One insert through the engine (values ``first ..``); returns the target's id."""
    key = np.asarray(toks, dtype=np.int64)
    value = np.arange(first, first + len(toks), dtype=np.int64)
    st, plen, target, _ = eng.k.insert(key, value, len(toks), 0, 0, 0, L.VALUES_NONNEG, 0, 0,
                                       0, -1, 0)
    assert st == L.OK
    return target


def test_every_entry_kernel_on_tree_arrays_is_on_the_engine():
    eng = _engine()
    names = {s.name for s in SPECS.values() if s.state and not s.engine_only}
    assert {"match_prefix", "insert", "inc_lock_ref", "evict", "backup_commit"} <= names
    for name in names:
        assert callable(getattr(eng.k, name)), name
    # the engine's own growth kernels are not offered
    assert not hasattr(eng.k, "compact_pool") and not hasattr(eng.k, "reset_tree")


def test_a_lock_after_a_node_table_growth_reaches_the_new_arrays():
    """``inc_lock_ref`` is a partial over the arrays: a growth must rebind it, or the
    lock would land in the dropped table."""
    eng = _engine(node_capacity=16)
    first = _insert(eng, [1, 2], 100)
    old_nodes = eng.st.nodes
    for i in range(40):  # many leaves: the node table doubles
        _insert(eng, [1000 + 3 * i, 1001 + 3 * i], 200 + 2 * i)
    assert eng.st.nodes is not old_nodes
    st, delta, _ = eng.k.inc_lock_ref(first, 0)
    assert (st, delta) == (L.OK, 2)
    s = Q.slot(eng, first)
    assert Q.lock_ref(eng, s) == 1 and old_nodes[s, L.FULL_LOCK] == 0
    assert int(eng.meta[L.M_PROTECTED + L.FULL]) == 2
    assert eng.k.sanity_check()[0] == 0


def test_a_retry_kernel_grows_its_scratch_and_calls_again():
    eng = _engine()
    n = 3000  # longer than ``out`` (1,024 entries at first)
    nid = _insert(eng, list(range(1, n + 1)), 5)
    assert eng.out.shape[0] < n
    st, got = eng.k.path_device_indices(nid)
    assert (st, got) == (L.OK, n)
    assert eng.out[:n].tolist() == list(range(5, 5 + n))


def test_a_resume_kernel_hands_its_capacity_answer_back():
    """``evict`` (resume): with ``out`` too short for the next victim it reports what
    it did so far; the caller executes, grows and calls again."""
    eng = _engine()
    for i in range(3):
        _insert(eng, list(range(10_000 * i, 10_000 * i + 900)), 1 + 1000 * i)
    want = np.array([2700, 0, 0], dtype=np.int64)  # per component
    done = np.zeros(3, dtype=np.int64)
    calls = phase = 0
    freed = []
    while True:
        st, phase = eng.k.evict(want, done, phase)
        calls += 1
        freed += [eng.out[off:off + n].tolist() for kind, _, _, off, n, _ in eng.actions()
                  if kind == A_FREE_SLOT]
        if st == L.OK:
            break
        assert st == L.E_CAPACITY
        eng.grow()
    assert done.tolist() == [2700, 0, 0] and calls >= 2
    assert sorted(x for part in freed for x in part) == list(range(1, 901)) + list(
        range(1001, 1901)) + list(range(2001, 2901))


def test_a_kernel_declares_its_convention_by_its_parameters():
    with pytest.raises(TypeError, match="tree arrays must come first"):
        @kernel
        def bad_order(meta, nodes, x):  # pragma: no cover - never compiled
            return 0
    with pytest.raises(TypeError, match="must be its last parameters"):
        @kernel(scratch=("out", "acts"))
        def bad_scratch(nodes, meta, acts, out, x):  # pragma: no cover
            return 0
    with pytest.raises(ValueError, match="on_capacity"):
        @kernel(on_capacity="sometimes")
        def bad_capacity(nodes, meta):  # pragma: no cover
            return 0
