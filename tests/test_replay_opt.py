"""``policy="opt"``, Belady's rule on the prefix tree: on small traces it gives
exactly the most hit tokens a brute-force search over every eviction choice
finds (one request at a time, the order mode: what ``replay/opt.py`` says is
proven), never fewer than any policy flatradix has, and the unbounded ceiling
with room for everything; hand-worked runs pin its choice down."""

import functools
import math

import numpy as np
import pytest

from flatradix.replay import replay, synthetic_workload
from flatradix.replay.config import pool_sizes, ReplayConfig
from flatradix.replay.trace import Workload

POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru")


def _workload(prompts, outputs):
    """Requests of the given token ids (a token_ids trace: block size 1)."""
    lens = np.array([len(p) for p in prompts], dtype=np.int64)
    ptr = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
    ids = np.array([t for p in prompts for t in p], dtype=np.int64)
    return Workload("tiny", 1, np.zeros(len(prompts)), lens, np.array(outputs, dtype=np.int64),
                    ptr, ids, True, "generic/token_ids")


def brute_force(prompts, outputs, capacity, page):
    """Most hit tokens over every eviction choice, one request at a time: before
    request i the previous one completes (its page-aligned prompt cached); i hits
    its longest cached page prefix (locked), needs ``n - hit + outputs`` free
    slots; short by d, some ceil(d / page) unlocked pages go, leaves first (every
    choice is tried); nothing evictable enough: all that is evictable goes and i
    is rejected (no hit)."""
    w = _workload(prompts, outputs)
    slots = pool_sizes(ReplayConfig(capacity=capacity, page_size=page), w).slots
    pages = [tuple(tuple(p[:k * page]) for k in range(1, len(p) // page + 1)) for p in prompts]

    @functools.lru_cache(maxsize=None)
    def best(i, cached, running):
        if i == len(prompts):
            return 0
        if running:
            cached = cached | frozenset(pages[i - 1])      # i - 1 completes
        mine = pages[i]
        h = 0
        while h < len(mine) and mine[h] in cached:
            h += 1
        locked = set(mine[:h])
        n, o = len(prompts[i]), outputs[i]
        need = n - h * page + o
        deficit = need - (slots - len(cached) * page)
        if deficit <= 0:
            return h * page + best(i + 1, cached, True)
        k = math.ceil(deficit / page)
        evictable = [x for x in cached if x not in locked]
        if len(evictable) < k:
            # everything evictable goes, and still short: rejected
            return best(i + 1, frozenset(locked), False)
        out = -1
        for gone in _leaf_sets(cached, locked, k):
            out = max(out, h * page + best(i + 1, cached - gone, True))
        return out

    return best(0, frozenset(), False)


def _leaf_sets(cached, locked, k):
    """Every set of k pages removable one leaf at a time (a page's prefix key is
    its ancestor's extension), none locked."""
    seen = set()

    def rec(left, gone, k):
        if k == 0:
            if gone not in seen:
                seen.add(gone)
                yield gone
            return
        for x in left:
            if x in locked:
                continue
            if any(y != x and y[:len(x)] == x for y in left):
                continue            # not a leaf
            yield from rec(left - {x}, gone | {x}, k - 1)

    yield from rec(frozenset(cached), frozenset(), k)


def _random_trace(rng):
    prompts, outputs = [], []
    stems = [list(rng.integers(0, 3, size=int(rng.integers(1, 5)))) for _ in range(3)]
    for _ in range(int(rng.integers(4, 8))):
        s = stems[int(rng.integers(len(stems)))]
        p = s[:int(rng.integers(1, len(s) + 1))] + list(rng.integers(0, 3, size=int(
            rng.integers(0, 4))))
        prompts.append([int(t) for t in p] or [0])
        outputs.append(int(rng.integers(0, 3)))
    return prompts, outputs


@pytest.mark.parametrize("seed", range(40))
def test_opt_is_the_brute_force_optimum_and_beats_every_policy(seed):
    rng = np.random.default_rng(seed)
    prompts, outputs = _random_trace(rng)
    page = int(rng.integers(1, 3))
    capacity = int(rng.integers(3, 11))
    w = _workload(prompts, outputs)
    want = brute_force(prompts, outputs, capacity, page)
    got = replay(w, capacity=capacity, page_size=page, policy="opt", record_hits=True)
    assert got.hit_tokens == want, (prompts, outputs, capacity, page)
    assert got.kv_conserved
    for p in POLICIES:
        r = replay(w, capacity=capacity, page_size=page, policy=p)
        assert r.hit_tokens <= want, (p, prompts, outputs, capacity, page)


def test_opt_evicts_the_page_used_farthest_ahead():
    # pool of 5, page 1, no outputs. [5, 6] arrives with A = [1, 2] and B = [3, 4]
    # cached (4 slots): short by 1. LRU drops A's node (2 tokens: the older one),
    # Belady drops B's last page ([3, 4]: used after A's). [1, 2] then hits 2; [3, 4]
    # hits its first page, after Belady drops a page nobody uses again. LRU, two
    # tokens short each time, drops whole nodes and never hits.
    prompts = [[1, 2], [3, 4], [5, 6], [1, 2], [3, 4]]
    w = _workload(prompts, [0] * 5)
    opt = replay(w, capacity=5, page_size=1, policy="opt", record_hits=True)
    lru = replay(w, capacity=5, page_size=1, policy="lru", record_hits=True)
    assert opt.hits.tolist() == [0, 0, 0, 2, 1] and opt.evicted_tokens == 2
    assert lru.hits.tolist() == [0, 0, 0, 0, 0]
    assert brute_force(prompts, [0] * 5, 5, 1) == 3


def test_opt_against_policies_and_the_ceiling_on_a_bigger_trace():
    w = synthetic_workload(300, seed=4)
    ceiling = replay(w).hit_tokens
    for cap in (4_000, 12_000, 40_000):
        opt = replay(w, capacity=cap, policy="opt")
        assert opt.hit_tokens <= ceiling
        for p in ("lru", "lfu", "fifo", "slru"):
            assert replay(w, capacity=cap, policy=p).hit_tokens <= opt.hit_tokens, (cap, p)
    assert replay(w, policy="opt").hit_tokens == ceiling


@pytest.mark.parametrize("kw", [dict(swa_window=64), dict(mamba_states=4, page_size=1),
                                dict(host_capacity=100)])
def test_opt_refuses_what_it_does_not_model(kw):
    with pytest.raises(ValueError, match="policy 'opt'"):
        replay(synthetic_workload(3), policy="opt", **kw)
