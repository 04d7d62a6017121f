"""``kernels/lru.py`` against a Python list model: every verb, random sequences."""

import random

import numpy as np
import pytest

from flatradix.kernels import layout as L
from flatradix.kernels import lru


def _table(n=40):
    nodes = np.zeros((L.FIRST_SLOT + n, L.NCOL), dtype=np.int64)
    for i in range(L.N_LRU):
        nodes[:, L.LRU_PREV + i] = L.NIL
        nodes[:, L.LRU_NEXT + i] = L.NIL
    lru.lru_init(nodes)
    return nodes


def _walk(nodes, lst):
    """MRU -> LRU order by following next links; checks the prev links agree."""
    out = []
    h, t = lru.lru_head(lst), lru.lru_tail(lst)
    x = nodes[h, L.LRU_NEXT + lst]
    prev = h
    while x != t:
        assert nodes[x, L.LRU_PREV + lst] == prev
        out.append(int(x))
        prev, x = x, nodes[x, L.LRU_NEXT + lst]
        assert len(out) <= nodes.shape[0]
    assert nodes[t, L.LRU_PREV + lst] == prev
    return out


@pytest.mark.parametrize("seed", range(5))
def test_random_verbs_match_a_list_model(seed):
    rng = random.Random(seed)
    nodes = _table()
    lst = L.LRU_SWA
    col = lru.lru_lock_col(lst)
    assert col == L.SWA_LOCK
    model = []  # MRU first
    slots = list(range(L.FIRST_SLOT, nodes.shape[0]))
    for _ in range(2000):
        free = [s for s in slots if s not in model]
        op = rng.choice(["push", "after", "remove", "front", "move_after", "pop", "lock"])
        if op == "push" and free:
            s = rng.choice(free)
            lru.lru_push_front(nodes, lst, s)
            model.insert(0, s)
        elif op == "after" and free and model:
            s, p = rng.choice(free), rng.choice(model)
            lru.lru_insert_after(nodes, lst, p, s)
            model.insert(model.index(p) + 1, s)
        elif op == "remove" and model:
            s = rng.choice(model)
            lru.lru_remove(nodes, lst, s)
            model.remove(s)
        elif op == "front" and model:
            s = rng.choice(model)
            lru.lru_move_to_front(nodes, lst, s)
            model.remove(s)
            model.insert(0, s)
        elif op == "move_after" and len(model) > 1:
            s, p = rng.sample(model, 2)
            lru.lru_move_after(nodes, lst, p, s)
            model.remove(s)
            model.insert(model.index(p) + 1, s)
        elif op == "pop":
            got = lru.lru_pop_tail(nodes, lst)
            assert got == (model.pop() if model else L.NIL)
        elif op == "lock" and model:
            s = rng.choice(model)
            nodes[s, col] = rng.choice((0, 0, 1, 2))
        assert _walk(nodes, lst) == model
        for s in slots:
            assert lru.lru_in_list(nodes, lst, s) == (s in model)
        unlocked = [s for s in model if nodes[s, col] == 0]
        assert lru.lru_tail_unlocked(nodes, lst) == (unlocked[-1] if unlocked else L.NIL)
        if model:
            s = rng.choice(model)
            newer = [x for x in model[:model.index(s)] if nodes[x, col] == 0]
            assert lru.lru_prev_unlocked(nodes, lst, s) == (newer[-1] if newer else L.NIL)


def test_lists_are_independent():
    nodes = _table()
    a, b = L.LRU_ID(L.SWA), L.LRU_ID(L.MAMBA)
    lru.lru_push_front(nodes, a, L.FIRST_SLOT)
    lru.lru_push_front(nodes, b, L.FIRST_SLOT + 1)
    lru.lru_push_front(nodes, b, L.FIRST_SLOT)
    assert _walk(nodes, a) == [L.FIRST_SLOT]
    assert _walk(nodes, b) == [L.FIRST_SLOT, L.FIRST_SLOT + 1]
    assert lru.lru_lock_col(b) == L.LOCK_COL(L.MAMBA)
