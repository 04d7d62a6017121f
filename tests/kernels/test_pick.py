"""``core/pick.py``: SGLang's pick-then-evict (``evict_pick`` + ``evict_leaf_at``)
does exactly what the one-step rounds of ``core/evict.py`` (``evict_next``,
validated by the oracle against SGLang's cores) do: the same victims in the same
order, the same frees, the same tree after every step."""

import random

import numpy as np
import pytest

import flatradix as F
from flatradix.kernels import layout as L

CT = F.ComponentType


def _build(components, seed, page=1):
    """A cache with a random tree: shared prefixes, some nodes locked, some
    matched (recency), SWA / Mamba data where configured."""
    rng = random.Random(seed)
    kw = {}
    alloc = F.TokenToKVPoolAllocator(1 << 14, page_size=page)
    rtp = None
    if CT.SWA in components:
        alloc = F.SWATokenToKVPoolAllocator(1 << 14, 1 << 14, page_size=page)
        kw["sliding_window_size"] = 4
    if CT.MAMBA in components:
        rtp = F.HybridReqToTokenPool(8, 512, mamba_size=256)
    c = F.UnifiedRadixCache(page_size=page, components=components,
                            token_to_kv_pool_allocator=alloc, req_to_token_pool=rtp, **kw)
    keys = []
    for i in range(60):
        base = rng.choice(keys) if keys and rng.random() < 0.6 else []
        cut = rng.randrange(len(base) + 1) if base else 0
        key = base[:cut] + [rng.randrange(1000) for _ in range(rng.randrange(1, 12) * page)]
        key = key[:len(key) - len(key) % page]
        if not key:
            continue
        p = F.InsertParams(key=F.RadixKey(key), value=alloc.alloc(len(key)))
        if CT.MAMBA in components:
            p.mamba_value = rtp.mamba_allocator.alloc(1)
        r = c.insert(p)
        if CT.MAMBA in components and r.mamba_exist:
            rtp.mamba_allocator.free(p.mamba_value)
        keys.append(key)
    for key in rng.sample(keys, 10):
        c.match_prefix(F.MatchPrefixParams(key=F.RadixKey(key)))
    locked = [c.match_prefix(F.MatchPrefixParams(key=F.RadixKey(k))).last_device_node
              for k in rng.sample(keys, 3)]
    for n in locked:
        c.inc_lock_ref(n)
    return c


def _state(c):
    st = c._engine.st
    meta = st.meta.copy()
    meta[L.M_EVICT_DONE:L.M_EVICT_DONE + L.N_COMPONENTS] = 0
    meta[L.M_NACTS] = meta[L.M_NOUT] = 0  # the last call's output counts (scratch)
    return st.nodes.copy(), st.heap.copy(), meta


@pytest.mark.parametrize("components,comp", [
    ((CT.FULL,), L.FULL),
    ((CT.FULL, CT.SWA), L.FULL), ((CT.FULL, CT.SWA), L.SWA),
    ((CT.FULL, CT.MAMBA), L.FULL), ((CT.FULL, CT.MAMBA), L.MAMBA),
    ((CT.FULL, CT.SWA, CT.MAMBA), L.SWA), ((CT.FULL, CT.SWA, CT.MAMBA), L.MAMBA),
])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_pick_then_evict_equals_one_step_rounds(components, comp, seed):
    a, b = _build(components, seed), _build(components, seed)
    ea, eb = a._engine, b._engine
    request = 40
    assert ea.k.evict_start(comp, request) == L.OK
    assert eb.k.evict_start(comp, request) == L.OK
    freed = np.zeros(L.N_COMPONENTS, dtype=np.int64)
    done = 0
    steps = 0
    while True:
        st, nid = ea.k.evict_next(comp, freed)
        f, w, m = (int(freed[c]) for c in (L.FULL, L.SWA, L.MAMBA))
        assert st == L.OK
        freed_a = ea.out[:int(ea.meta[L.M_NOUT])].copy()
        pst, pid, pf, pw, pm = eb.k.evict_pick(comp, done)
        assert pst == L.OK
        if pid >= 0 and (pf, pw, pm) == (0, 0, 0):  # a picked leaf: evict it now
            lst, pf, pw, pm, _ = eb.k.evict_leaf_at(pid)
            assert lst == L.OK
        freed_b = eb.out[:int(eb.meta[L.M_NOUT])].copy()
        assert (nid, f, w, m) == (pid, pf, pw, pm)
        np.testing.assert_array_equal(freed_a, freed_b)
        for x, y in zip(_state(a), _state(b)):
            np.testing.assert_array_equal(x, y)
        done += (pf, pw, pm)[(L.FULL, L.SWA, L.MAMBA).index(comp)]
        if (f, w, m) == (0, 0, 0):
            break
        steps += 1
    assert steps > 0
    ea.k.evict_end(comp)
    eb.k.evict_end(comp)
    for e in (ea, eb):  # the kernel check (the façade's also compares its Mamba slot set,
        assert tuple(e.k.sanity_check()) == (0, -1)  # which these raw kernel calls bypass)


def test_evict_leaf_at_refuses_a_node_that_is_not_an_evictable_leaf():
    c = _build((CT.FULL,), 4)
    eng = c._engine
    before = _state(c)
    st, *_ = eng.k.evict_leaf_at(c.root_node_handle())
    assert st == L.E_NOT_LEAF
    st, *_ = eng.k.evict_leaf_at((1 << 40) | 5)
    assert st == L.E_STALE
    for x, y in zip(before, _state(c)):
        np.testing.assert_array_equal(x, y)


def test_evict_pick_without_a_round_is_refused():
    c = _build((CT.FULL,), 5)
    st, *_ = c._engine.k.evict_pick(L.FULL, 0)
    assert st == L.E_NO_WALK


def test_evict_component_at_tombstones_one_component_only():
    c = _build((CT.FULL, CT.SWA, CT.MAMBA), 6)
    eng = c._engine
    nodes = eng.st.nodes
    s = next(int(s) for s in eng.live_slots()
             if s != L.ROOT and nodes[s, L.FLAGS] & L.F_HAS(L.SWA)
             and nodes[s, L.FLAGS] & L.F_HAS(L.MAMBA) and nodes[s, L.LOCK_COL(L.SWA)] == 0)
    nid = (int(nodes[s, L.GEN]) << 32) | s
    n = int(nodes[s, L.KEY_LEN])
    swa_before = int(eng.meta[L.M_TOTAL + L.SWA])
    st, units = eng.k.evict_component_at(nid, L.SWA)
    assert (st, units) == (L.OK, n)
    assert not nodes[s, L.FLAGS] & L.F_HAS(L.SWA)
    assert nodes[s, L.FLAGS] & L.F_HAS(L.MAMBA)  # no cascade
    assert int(eng.meta[L.M_TOTAL + L.SWA]) == swa_before - n
    rows = eng.actions()
    assert rows.shape[0] == 1 and rows[0, 0] == 3 and rows[0, 1] == L.SWA  # A_FREE_SLOT(SWA)
    st, units = eng.k.evict_component_at(nid, L.SWA)  # nothing left to tombstone
    assert (st, units) == (L.OK, 0)
