"""The host tier (HiCache, Full attention): hand-worked scenarios of SGLang 0.5.23's
behaviour (spec §8), the slot partition on both tiers over random runs, bad input.

Every expected value here is worked out by hand from the spec, not read back
from the cache: a backup pins its node on the device until its ack, eviction of
a backed-up leaf keeps it host-only, a match walks host-only nodes and reports
them as ``host_hit_length``, a load-back restores the host-only part of a path,
host eviction deletes host-only leaves in policy order.
"""

import numpy as np
import pytest

from flatradix import (
    EvictParams, InsertParams, MatchPrefixParams, RadixKey, TokenToKVPoolAllocator,
    UnifiedRadixCache,
)
from flatradix import inspection as Q
from flatradix.pools import HostKVPool
from flatradix.kernels import layout as L

pytest.importorskip("msgspec")


class LoadParams:
    """Duck-typed ``InitLoadBackParams``."""

    def __init__(self, best_match_node, host_hit_length, mem_quota=None, req=None):
        self.best_match_node = best_match_node
        self.host_hit_length = host_hit_length
        self.mem_quota = mem_quota
        self.req = req


def make(page=1, pool=64, host=100, policy="write_through", events=True, **kw):
    alloc = TokenToKVPoolAllocator(pool, page_size=page)
    cache = UnifiedRadixCache(page_size=page, token_to_kv_pool_allocator=alloc,
                              enable_kv_cache_events=events, **kw)
    cache.init_hicache(host_size=host, hicache_write_policy=policy)
    cache.take_events()
    return cache, alloc


def put(cache, alloc, tokens):
    v = alloc.alloc(len(tokens))
    r = cache.insert(InsertParams(key=RadixKey(list(tokens)), value=v))
    return r, v


def match(cache, tokens):
    return cache.match_prefix(MatchPrefixParams(key=RadixKey(list(tokens))))


def media(events):
    return [(type(e).__name__, e.medium, list(e.token_ids) if hasattr(e, "token_ids") else None)
            for e in events]


def check_partition(cache, alloc, host_pool, held=()):
    """Device: free + tree + held == every slot, disjoint; host: free + tree == every slot."""
    cache.sanity_check()
    tree = np.asarray(cache.all_values_flatten())
    free = np.asarray(alloc._free_slots()) if hasattr(alloc, "_free_slots") else None
    assert len(np.unique(tree)) == len(tree)
    total = alloc.available_size() + len(tree) + sum(len(h) for h in held)
    assert total == alloc.size
    htree = cache.all_host_values_flatten()
    assert len(np.unique(htree)) == len(htree)
    assert host_pool.available_size() + len(htree) == host_pool.size
    assert cache.host_total_size() == len(htree)
    del free


def test_backup_pins_until_ack_then_cpu_store():
    cache, alloc = make()
    r, v = put(cache, alloc, range(10))
    assert r.prefix_len == 0
    # write_through: the first hit backs the new leaf up; it is locked until the ack
    assert list(cache.ongoing_write_through.values()) == [r.last_device_node]
    assert cache.protected_size() == 10 and cache.evictable_size() == 0
    assert cache.host_total_size() == 10
    assert cache.mem_pool_host.available_size() == 90
    assert cache.evict(10).num_tokens_evicted == 0  # pinned
    assert media(cache.take_events()) == [("BlockStored", "GPU", list(range(10)))]
    cache.writing_check()                           # not submitted yet: nothing to complete
    assert len(cache.ongoing_write_through) == 1 and cache.protected_size() == 10
    cache.flush_pending_backups()
    cache.writing_check()
    assert cache.ongoing_write_through == {}
    assert cache.protected_size() == 0 and cache.evictable_size() == 10
    assert media(cache.take_events()) == [("BlockStored", "CPU_PINNED", list(range(10)))]
    assert cache.is_backuped(r.last_device_node)


def test_demote_match_load_back_and_host_evict():
    cache, alloc = make()
    r, v = put(cache, alloc, range(10))
    cache.check_hicache_events()
    cache.take_events()
    assert cache.evict(1).num_tokens_evicted == 10
    assert alloc.available_size() == 64  # the leaf's 10 slots are back
    assert media(cache.take_events()) == [("BlockRemoved", "GPU", None)]
    # the node stays, host-only: an evictable host leaf
    assert cache.host_evictable_size() == 10 and cache.evictable_size() == 0
    m = match(cache, range(12))
    assert m.device_prefix_len == 0 and len(m.device_indices) == 0
    assert m.host_hit_length == 10
    assert m.best_match_node == m.last_host_node == r.last_device_node
    assert m.last_device_node == cache.root_node_handle()
    loaded, node = cache.init_load_back(LoadParams(m.best_match_node, m.host_hit_length))
    assert (loaded, node) == (10, r.last_device_node)
    # loaded and locked until loading_check; host copy kept (D+H)
    assert cache.protected_size() == 10 and cache.host_evictable_size() == 0
    assert media(cache.take_events()) == [("BlockStored", "GPU", list(range(10)))]
    cache.ready_to_load_host_cache()
    cache.loading_check()
    assert cache.protected_size() == 0 and cache.evictable_size() == 10
    m2 = match(cache, range(10))
    assert m2.device_prefix_len == 10 and m2.host_hit_length == 0
    assert np.array_equal(np.asarray(m2.device_indices), np.asarray(cache.path_device_indices(node)))
    # evict again (a demote: the host copy stays), then evict the host copy
    cache.evict(10)
    assert cache.evict_host(1) == 10
    assert cache.host_total_size() == 0 and cache.mem_pool_host.available_size() == 100
    assert media(cache.take_events()) == [("BlockRemoved", "GPU", None),
                                          ("BlockRemoved", "CPU_PINNED", None)]
    assert match(cache, range(10)).host_hit_length == 0
    cache.sanity_check()


def test_selective_backs_up_at_the_second_hit():
    cache, alloc = make(policy="write_through_selective")
    assert cache.write_through_threshold == 2
    r, _ = put(cache, alloc, range(8))
    assert cache.ongoing_write_through == {}
    r2, v2 = put(cache, alloc, range(8))  # hit 2: backed up now; its slots are duplicates
    assert r2.prefix_len == 8
    assert list(cache.ongoing_write_through.values()) == [r.last_device_node]
    assert alloc.available_size() == 64 - 8


def test_chain_backs_up_ancestors_first_and_split_pending_node():
    cache, alloc = make(page=2)
    put(cache, alloc, range(8))          # node A = [0..8), pending ack 1
    cache.check_hicache_events()
    cache.take_events()
    # a child of A: backup covers only the child (A is backed up already)
    r, _ = put(cache, alloc, list(range(8)) + [50, 51, 52, 53])
    acks = list(cache.ongoing_write_through.items())
    assert len(acks) == 1 and acks[0][1] == r.last_device_node
    assert cache.host_total_size() == 12
    # split the pending child at 2 units: both fragments stay pending under the same ack
    put(cache, alloc, list(range(8)) + [50, 51, 60, 61])
    cache.take_events()
    cache.check_hicache_events()
    ev = media(cache.take_events())
    # the split's fragments complete under one ack, parent first (chained pages: one
    # merged event); then the new leaf [60, 61]'s own backup (its parent's last
    # page is 51, not the queue tail's 53: a second event)
    assert ev == [("BlockStored", "CPU_PINNED", [50, 51, 52, 53]),
                  ("BlockStored", "CPU_PINNED", [60, 61])]
    cache.sanity_check()
    assert cache.protected_size() == 0


def test_insert_over_host_only_node_takes_the_fresh_slots():
    cache, alloc = make()
    r, _ = put(cache, alloc, range(6))
    cache.check_hicache_events()
    cache.evict(6)
    cache.take_events()
    before = alloc.available_size()
    r2, v2 = put(cache, alloc, range(6))
    # the node took the request's slots (none freed as duplicates)
    assert r2.prefix_len == 6
    assert alloc.available_size() == before - 6
    assert np.array_equal(np.asarray(cache.path_device_indices(r.last_device_node)),
                          np.asarray(v2))
    assert media(cache.take_events()) == [("BlockStored", "GPU", list(range(6)))]
    assert cache.evictable_size() == 6 and cache.host_evictable_size() == 0
    assert cache.ongoing_write_through == {}  # already backed up: no second backup
    cache.sanity_check()


def test_host_eviction_is_leaf_first_and_in_lru_order():
    cache, alloc = make(pool=64, host=100)
    put(cache, alloc, range(4))                 # A
    put(cache, alloc, [0, 1, 2, 3, 10, 11])     # B under A
    put(cache, alloc, [20, 21, 22])             # C
    cache.check_hicache_events()
    cache.evict(100)
    assert cache.evictable_size() == 0 and cache.host_total_size() == 9
    # host leaves: B (2 tokens) and C (3); B was last touched before C
    assert cache.host_evictable_size() == 5
    assert cache.evict_host(1) == 2             # B: the least recently used host leaf
    # A is a host leaf now, last touched (by B's insert walk) before C
    assert cache.host_evictable_size() == 7
    assert cache.evict_host(1) == 4             # A
    assert cache.evict_host(10) == 3            # C
    assert cache.host_total_size() == 0
    cache.sanity_check()


def test_backup_evicts_host_leaves_when_the_host_pool_is_full():
    cache, alloc = make(pool=64, host=10)
    put(cache, alloc, range(6))
    cache.check_hicache_events()
    cache.evict(6)                               # host-only, 6 of 10 host slots
    put(cache, alloc, range(100, 108))           # needs 8: the old host leaf goes
    assert cache.host_total_size() == 8
    assert match(cache, range(6)).host_hit_length == 0
    cache.check_hicache_events()
    cache.sanity_check()


def test_load_back_threshold_and_mem_quota():
    cache, alloc = make()
    cache.load_back_threshold = 10
    r, _ = put(cache, alloc, range(6))
    cache.check_hicache_events()
    cache.evict(6)
    m = match(cache, range(6))
    assert cache.init_load_back(LoadParams(m.best_match_node, m.host_hit_length)) == (
        0, m.best_match_node)   # 6 < threshold: recompute
    cache.load_back_threshold = 1
    assert cache.init_load_back(LoadParams(m.best_match_node, m.host_hit_length,
                                           mem_quota=5))[0] == 0
    assert cache.protected_size() == 0 and cache.host_evictable_size() == 6
    assert cache.init_load_back(LoadParams(m.best_match_node, m.host_hit_length,
                                           mem_quota=6))[0] == 6
    cache.ready_to_load_host_cache()
    cache.loading_check()
    cache.sanity_check()


def test_load_back_evicts_device_leaves_when_short():
    cache, alloc = make(pool=16, host=100)
    put(cache, alloc, range(10))
    cache.check_hicache_events()
    cache.evict(10)
    put(cache, alloc, range(100, 112))            # 12 of the 16 slots
    cache.check_hicache_events()
    m = match(cache, range(10))
    assert cache.init_load_back(LoadParams(m.best_match_node, m.host_hit_length))[0] == 10
    # the other leaf was demoted to make room
    assert match(cache, range(100, 112)).host_hit_length == 12
    cache.ready_to_load_host_cache()
    cache.loading_check()
    cache.sanity_check()


@pytest.mark.parametrize("page", [1, 4])
@pytest.mark.parametrize("policy", ["write_through", "write_through_selective", "write_back"])
def test_random_runs_keep_both_tiers_partitioned(page, policy):
    rng = np.random.default_rng(7 + page)
    cache, alloc = make(page=page, pool=256, host=192, policy=policy)
    host = cache.mem_pool_host
    prefixes = [list(rng.integers(0, 50, size=int(rng.integers(1, 6)) * page)) for _ in range(6)]
    locks = []
    for step in range(600):
        op = rng.integers(0, 7)
        if op <= 1:
            toks = prefixes[rng.integers(0, len(prefixes))] + list(
                rng.integers(0, 50, size=int(rng.integers(0, 4)) * page))
            if not toks:
                continue
            if alloc.available_size() < len(toks):
                cache.evict(len(toks))
            v = alloc.alloc(len(toks))
            if v is None:
                continue
            cache.insert(InsertParams(key=RadixKey(toks), value=v))
        elif op == 2:
            toks = prefixes[rng.integers(0, len(prefixes))]
            m = match(cache, toks)
            if m.host_hit_length > 0 and rng.random() < 0.7:
                cache.init_load_back(LoadParams(m.best_match_node, m.host_hit_length))
            elif rng.random() < 0.5:
                locks.append((m.last_device_node, cache.inc_lock_ref(m.last_device_node)))
        elif op == 3 and locks:
            nid, rec = locks.pop(rng.integers(0, len(locks)))
            cache.dec_lock_ref(nid, rec.to_dec_params())
        elif op == 4:
            cache.evict(int(rng.integers(1, 40)))
        elif op == 5:
            cache.evict_host(int(rng.integers(1, 40)))
        else:
            if rng.random() < 0.5:
                cache.flush_pending_backups()
            if rng.random() < 0.5:
                cache.ready_to_load_host_cache()
            cache.writing_check(finish_count=int(rng.integers(0, 3)))
            cache.loading_check(finish_count=int(rng.integers(0, 2)))
        check_partition(cache, alloc, host)
    for nid, rec in locks:
        cache.dec_lock_ref(nid, rec.to_dec_params())
    cache.check_hicache_events()
    cache.ready_to_load_host_cache()
    cache.loading_check()
    assert cache.protected_size() == 0
    cache.evict(10**6)
    cache.evict_host(10**6)
    assert cache.host_total_size() == 0 and host.available_size() == host.size
    assert alloc.available_size() == alloc.size
    check_partition(cache, alloc, host)


# ---------------------------------------------------------------------- bad input
def test_init_hicache_refuses_bad_input_and_changes_nothing():
    alloc = TokenToKVPoolAllocator(64)
    cache = UnifiedRadixCache(token_to_kv_pool_allocator=alloc)
    with pytest.raises(ValueError, match="hicache_write_policy"):
        cache.init_hicache(host_size=10, hicache_write_policy="write_sideways")
    with pytest.raises(ValueError, match="host_size"):
        cache.init_hicache()
    with pytest.raises(ValueError, match="hicache_ratio"):
        cache.init_hicache(hicache_ratio=0)
    assert not cache.enable_hicache
    with pytest.raises(ValueError, match="no host tier"):
        cache.evict_host(1)
    cache.init_hicache(hicache_ratio=2.0)
    assert cache.mem_pool_host.size == 129   # SGLang: (int(64 * 2.0) // 1 + 1) * 1
    with pytest.raises(ValueError, match="already on"):
        cache.init_hicache(host_size=10)


def test_host_calls_refuse_bad_counts_before_any_change():
    cache, alloc = make()
    put(cache, alloc, range(5))
    cache.check_hicache_events()
    cache.evict(5)
    snap = cache._snapshot()
    with pytest.raises(ValueError, match="num_tokens"):
        cache.evict_host(-1)
    with pytest.raises(TypeError, match="num_tokens"):
        cache.evict_host(1.5)
    m = match(cache, range(5))
    snap = cache._snapshot()
    with pytest.raises(ValueError, match="mem_quota"):
        cache.init_load_back(LoadParams(m.best_match_node, m.host_hit_length, mem_quota=-1))
    with pytest.raises(ValueError, match="host_hit_length"):
        cache.init_load_back(LoadParams(m.best_match_node, -3))
    after = cache._snapshot()
    for k in snap:
        if isinstance(snap[k], np.ndarray):
            assert np.array_equal(snap[k], after[k]), k


def test_host_pool_refuses_a_double_free():
    p = HostKVPool(4)
    a = p.alloc(3)
    assert a.tolist() == [0, 1, 2] and p.available_size() == 1
    assert p.alloc(2) is None
    p.free(a)
    with pytest.raises(ValueError, match="double free"):
        p.free(np.array([0, 1]))
    p.clear()
    assert p.available_size() == 4


def test_host_pool_free_refuses_a_bad_batch_whole_and_keeps_its_order():
    p = HostKVPool(6)
    a = p.alloc(4)                                   # 0 1 2 3
    for bad in ([1, 6], [1, -1], [2, 3, 2], [3, 4]):  # outside, outside, repeated, not held
        with pytest.raises(ValueError, match="nothing freed"):
            p.free(np.array(bad))
        assert p.available_size() == 2
        assert p.all_held(a) and not p.all_held(np.array(bad))
    p.free(np.array([2, 0]))                          # the last batch freed goes out first
    assert p.alloc(3).tolist() == [2, 0, 4]
    p.free(a[1::2][::-1])                             # a strided view is freed as given
    assert p.alloc(2).tolist() == [3, 1]


def test_host_pool_free_never_writes_past_its_free_stack():
    """A refused batch longer than the held slots (a repeat, a double free) must
    not touch memory past the free stack: guard words after it stay as they were
    (the kernel's stack writes are unchecked, so this is checked here)."""
    p = HostKVPool(8)
    guard = np.full(8 + 6, -7, dtype=np.int64)
    guard[:8] = p._free
    p._free = guard[:8]                               # the stack, with 6 guard words after
    a = p.alloc(1)
    for bad in ([a[0], a[0]], [a[0]] * 6, [a[0], 9], [a[0], -1]):
        with pytest.raises(ValueError, match="nothing freed"):
            p.free(bad)
        assert (guard[8:] == -7).all() and p.available_size() == 7 and p.all_held(a)
    p.free(a)
    assert (guard[8:] == -7).all() and p.available_size() == 8


def test_host_pool_refuses_non_integer_slots():
    p = HostKVPool(4)
    a = p.alloc(2)
    for bad, err in (([1.7], TypeError), (["3"], TypeError), ([True], TypeError),
                     (np.array([[0, 1]]), ValueError)):
        with pytest.raises(err, match="indices"):
            p.free(bad)
        assert not p.all_held(bad)
    assert p.available_size() == 2 and p.all_held(list(a)) and p.all_held(a.tolist())
    torch = pytest.importorskip("torch")
    assert p.all_held(torch.from_numpy(a)) and not p.all_held(torch.tensor([0.5]))
    p.free(torch.from_numpy(a))
    assert p.available_size() == 4


# ---------------------------------------------------------------------- the request path
@pytest.mark.parametrize("page_size,policy", [(1, "write_through"), (8, "write_through"),
                                              (1, "write_back"), (8, "write_back")])
def test_request_path_with_load_backs_conserves_both_tiers(page_size, policy):
    """A scheduler's loop (match -> load back the host hit -> lock -> allocate the
    tail -> request -> decode -> cache_unfinished_req / cache_finished_req), acks
    delivered late: after every step allocator available + tree device units +
    request-owned slots == pool size, host pool free + tree host units == host size."""
    from flatradix import EvictParams, Req, ReqToTokenPool

    from ...test_conservation import decode, owned

    pool = 1024
    rng = np.random.default_rng(page_size)
    alloc = TokenToKVPoolAllocator(pool)
    rtp = ReqToTokenPool(32, 512)
    cache = UnifiedRadixCache(page_size=page_size, token_to_kv_pool_allocator=alloc,
                              req_to_token_pool=rtp)
    cache.init_hicache(host_size=3 * pool, load_back_threshold=1, hicache_write_policy=policy)
    host = cache.mem_pool_host
    systems = [list(rng.integers(0, 50, size=int(rng.integers(8, 120)))) for _ in range(5)]
    running, finished, loaded_total = [], [], 0
    next_tok = 10_000

    def conserve():
        held = sum(owned(r) for r in running)
        assert alloc.available_size() + cache.evictable_size() + cache.protected_size() + held \
            == pool
        assert host.available_size() + cache.host_total_size() == host.size

    for step in range(4000):
        op = rng.random()
        if op < 0.35 and len(running) < 24:
            base = (finished[int(rng.integers(len(finished)))]
                    if finished and rng.random() < 0.6 else systems[int(rng.integers(5))])
            tokens = list(base) + list(rng.integers(0, 50, size=int(rng.integers(1, 40))))
            req = Req(origin_input_ids=tokens)
            m = cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens)))
            req.last_node = m.last_device_node
            prefix, last = m.device_indices, m.last_device_node
            if m.host_hit_length > 0:
                n, node = cache.init_load_back(LoadParams(m.best_match_node, m.host_hit_length,
                                                          req=req))
                if n:
                    loaded_total += n
                    last = node
                    prefix = cache.path_device_indices(node)
            cache.inc_lock_ref(last)
            need = len(tokens) - len(prefix)
            slots = alloc.alloc(need)
            if slots is None:
                cache.evict(EvictParams(num_tokens=need - alloc.available_size()))
                slots = alloc.alloc(need)
            row = rtp.alloc(1) if slots is not None else None
            if slots is None or row is None:
                cache.dec_lock_ref(last)
                if slots is not None:
                    alloc.free(slots)
            else:
                req.req_pool_idx = row[0]
                req.prefix_indices = prefix
                req.last_node = last
                rtp.write((row[0], slice(0, len(prefix))), prefix)
                rtp.write((row[0], slice(len(prefix), len(tokens))), slots)
                req.kv_committed_len = len(tokens)
                running.append(req)
        elif op < 0.6 and running:
            req = running[int(rng.integers(len(running)))]
            if decode(cache, alloc, rtp, req, int(rng.integers(1, 16)), next_tok):
                next_tok += 16
                if rng.random() < 0.3:
                    cache.cache_unfinished_req(req)
        elif op < 0.85 and running:
            req = running.pop(int(rng.integers(len(running))))
            cache.cache_finished_req(req)
            if len(finished) < 100:
                finished.append(list(req.origin_input_ids) + list(req.output_ids))
        elif op < 0.93:
            cache.check_hicache_events() if rng.random() < 0.5 else cache.flush_pending_backups()
            cache.ready_to_load_host_cache()
            cache.writing_check(finish_count=int(rng.integers(0, 4)))
            cache.loading_check(finish_count=int(rng.integers(0, 4)))
        else:
            cache.evict_host(int(rng.integers(1, 200)))
        conserve()
        if step % 500 == 0:
            cache.sanity_check()
    while running:
        cache.cache_finished_req(running.pop())
    cache.check_hicache_events()
    cache.ready_to_load_host_cache()
    cache.loading_check()
    conserve()
    assert cache.protected_size() == 0
    assert loaded_total > 0  # the run did load host hits back
    cache.evict(EvictParams(num_tokens=pool))
    assert alloc.available_size() == pool
    cache.evict_host(10 * pool)
    assert host.available_size() == host.size
    cache.sanity_check()


def test_stepwise_full_round_demotes_backed_up_leaves():
    cache, alloc = make()
    put(cache, alloc, range(4))
    cache.check_hicache_events()
    cache.evict_device_start(num_tokens=4)
    step = cache.evict_device_next_node()
    assert step.made_progress and step.num_tokens == 4
    assert sorted(np.asarray(step.freed_indices).tolist()) == [1, 2, 3, 4]
    alloc.free(step.freed_indices)       # the controller frees the step's slots
    assert not cache.evict_device_next_node().made_progress
    cache.evict_device_end()
    assert cache.host_evictable_size() == 4
    assert match(cache, range(4)).host_hit_length == 4
    cache.sanity_check()


def test_match_prefix_batch_reports_host_hits_as_single_calls():
    single, a1 = make(page=2)
    batch, a2 = make(page=2)
    keys = [list(range(8)), list(range(4)) + [9, 9], [7, 7, 7, 7]]
    for c, a in ((single, a1), (batch, a2)):
        for k in keys[:2]:
            put(c, a, k)
        c.check_hicache_events()
        c.evict(6)
        put(c, a, keys[2])
    want = [match(single, k) for k in keys + [list(range(10))]]
    got = batch.match_prefix_batch([MatchPrefixParams(key=RadixKey(k))
                                    for k in keys + [list(range(10))]])
    for w, g in zip(want, got):
        assert (g.device_prefix_len, g.host_hit_length, g.last_device_node, g.best_match_node,
                g.last_host_node) == (w.device_prefix_len, w.host_hit_length,
                                      w.last_device_node, w.best_match_node, w.last_host_node)
    assert any(w.host_hit_length > 0 for w in want)


def test_adopted_ranges_include_the_host_only_nodes_taken_over():
    cache, alloc = make(page=2)
    put(cache, alloc, range(4))
    cache.check_hicache_events()
    cache.evict(4)
    r = cache.insert(InsertParams(key=RadixKey(list(range(6))), value=alloc.alloc(6),
                                  track_adopted_ranges=True))
    # SGLang records the unevicted [0, 4) and the new leaf [4, 6) (one coalesced range)
    assert r.prefix_len == 4
    assert {int(k): v for k, v in r.adopted_ranges.items()} == {0: [(0, 6)]}


def test_failed_backup_is_not_treated_as_backed_up():
    """Issue 13's reported bug: a backup that found no host memory must leave the node
    unbacked -- evicting it deletes it (no host hit afterwards), nothing on the host."""
    cache, alloc = make(pool=64, host=4)
    put(cache, alloc, range(4))                    # fills the host pool (pending: locked)
    r, _ = put(cache, alloc, range(10, 16))        # 6 tokens: nothing host-evictable
    assert not cache.is_backuped(r.last_device_node)
    assert len(cache.ongoing_write_through) == 1 and cache.host_total_size() == 4
    cache.check_hicache_events()
    cache.evict(64)
    m = match(cache, range(10, 16))
    assert (m.device_prefix_len, m.host_hit_length) == (0, 0)
    assert match(cache, range(4)).host_hit_length == 4
    cache.sanity_check()


def test_b16_no_ghost_hit_a_reinsert_over_the_host_copy_gets_fresh_values():
    """known_bugs.md B16 with the host tier: after eviction the freed device values
    are never returned; the host copy is a host hit; a re-insert takes fresh slots."""
    cache = UnifiedRadixCache(page_size=1)   # no allocator: evicted slots are returned
    cache.init_hicache(host_size=16)
    cache.insert(InsertParams(key=RadixKey([1, 2, 3]), value=np.array([10, 11, 12])))
    cache.check_hicache_events()
    e = cache.evict(3)
    assert e.num_tokens_evicted == 3 and cache.total_size()[0] == 0
    assert np.asarray(e.evicted_indices).tolist() == [10, 11, 12]
    m = match(cache, [1, 2, 3])
    assert m.device_prefix_len == 0 and m.host_hit_length == 3
    r = cache.insert(InsertParams(key=RadixKey([1, 2, 3]), value=np.array([20, 21, 22])))
    assert r.prefix_len == 3          # SGLang: the host-only node took the slots
    m = match(cache, [1, 2, 3])
    assert np.asarray(m.device_indices).tolist() == [20, 21, 22]


def test_b12_eagle_bigram_pages_on_the_host_tier():
    """known_bugs.md B12 with the host tier: bigram pages demote, match on the host
    and load back by whole pages, short inputs never crash."""
    alloc = TokenToKVPoolAllocator(64, page_size=4)
    cache = UnifiedRadixCache(page_size=4, token_to_kv_pool_allocator=alloc, is_eagle=True)
    cache.init_hicache(host_size=64, load_back_threshold=1)
    cache.insert(InsertParams(key=RadixKey(list(range(1, 10))), value=alloc.alloc(9)))
    assert cache.total_size()[0] == 8
    cache.check_hicache_events()
    cache.evict(8)
    assert match(cache, [1, 2, 3, 4]).host_hit_length == 0        # 3 bigrams: no page
    assert match(cache, [1, 2, 3, 4, 5]).host_hit_length == 4
    m = match(cache, list(range(1, 10)))
    assert (m.device_prefix_len, m.host_hit_length) == (0, 8)
    assert cache.init_load_back(LoadParams(m.best_match_node, m.host_hit_length))[0] == 8
    cache.ready_to_load_host_cache()
    cache.loading_check()
    assert match(cache, list(range(1, 10))).device_prefix_len == 8
    cache.sanity_check()


def test_host_lock_pins_a_host_leaf_and_a_split_extends_its_segment():
    cache, alloc = make(page=2)
    r, _ = put(cache, alloc, range(8))
    cache.check_hicache_events()
    cache.evict(8)
    nid = r.last_device_node
    rec = cache.inc_host_lock_ref(nid)
    assert int(list(rec.component_host_lock_uuids)[0]) == 0   # {FULL: stamp}
    assert cache.host_evictable_size() == 0 and cache.evict_host(100) == 0
    # a match splits the host-locked node: the segment now covers both fragments
    m = match(cache, range(4))
    assert m.best_match_node != nid and m.host_hit_length == 4
    assert cache.evict_host(100) == 0
    cache.dec_host_lock_ref(nid, rec.to_dec_params())
    assert cache.host_evictable_size() == 4                 # the lower fragment is a leaf
    assert cache.evict_host(100) == 8
    from flatradix import LockRefError
    with pytest.raises(LockRefError):
        r2, _ = put(cache, alloc, range(20, 24))
        cache.check_hicache_events()
        cache.evict(4)
        rec2 = cache.inc_host_lock_ref(r2.last_device_node)
        cache.dec_host_lock_ref(r2.last_device_node, rec2)
        cache.dec_host_lock_ref(r2.last_device_node, rec2)      # released twice
    cache.sanity_check()
    # no host copy: nothing locked, an empty receipt
    assert cache.inc_host_lock_ref(cache.root_node_handle()).component_host_lock_uuids == {}



# ---------------------------------------------------------------------- write-back
def test_write_back_backs_up_at_eviction_then_demotes():
    cache, alloc = make(policy="write_back")
    r, _ = put(cache, alloc, range(4))
    put(cache, alloc, range(4))                  # no hit counting, no backup at insert
    assert cache.ongoing_write_through == {} and cache.host_total_size() == 0
    assert cache.node_info(r.last_device_node)["hit_count"] == 0
    cache.take_events()
    assert cache.evict(1).num_tokens_evicted == 4
    # backed up (CPU store), completed at once, then demoted (GPU removal)
    assert media(cache.take_events()) == [("BlockStored", "CPU_PINNED", [0, 1, 2, 3]),
                                          ("BlockRemoved", "GPU", None)]
    assert cache.host_total_size() == 4 and cache.ongoing_write_through == {}
    assert match(cache, range(4)).host_hit_length == 4
    cache.sanity_check()


def test_write_back_reclaims_duplicates_first_sparing_device_leaves():
    """SGLang (helper's run on both cores): A internal D+H (4), B a D+H device
    leaf (3), H a host-only leaf (2): evict_host(1) frees A's host copy, then B's,
    then deletes H."""
    cache, alloc = make(policy="write_back", host=64)
    cache.load_back_threshold = 1
    put(cache, alloc, range(4))                          # A
    put(cache, alloc, [0, 1, 2, 3, 10, 11, 12])          # B under A
    put(cache, alloc, [0, 1, 2, 3, 20, 21])              # H under A
    cache.evict(100)                                     # all backed up, demoted
    for toks in ([0, 1, 2, 3, 10, 11, 12], [0, 1, 2, 3, 20, 21]):
        m = match(cache, toks)
        cache.init_load_back(LoadParams(m.best_match_node, m.host_hit_length))
        cache.ready_to_load_host_cache()
        cache.loading_check()
    # demote H again: its device copy goes, host copy stays (a host-only leaf)
    m = match(cache, [0, 1, 2, 3, 10, 11, 12])       # B more recent than H
    cache.evict(2)
    assert match(cache, [0, 1, 2, 3, 20, 21]).host_hit_length == 2
    assert cache.evict_host(1) == 4                     # A: internal duplicate
    assert cache.evict_host(1) == 3                     # B: a device leaf, pass 2
    assert cache.evict_host(1) == 2                     # H: the host leaf, deleted
    assert cache.evict_host(1) == 0
    assert match(cache, [0, 1, 2, 3, 10, 11, 12]).device_prefix_len == 7
    cache.sanity_check()


def test_write_back_drops_the_subtree_when_the_host_is_full():
    cache, alloc = make(policy="write_back", host=4)
    r, _ = put(cache, alloc, range(4))
    rec = cache.inc_host_lock_ref(r.last_device_node)   # write-back pins a device-only node too
    assert list(rec.component_host_lock_uuids) == [0]   # (SGLang's), {FULL: stamp}
    cache.dec_host_lock_ref(r.last_device_node, rec)
    cache.evict(4)                                      # backed up (4 host slots), demoted
    m = match(cache, range(4))
    hl = cache.inc_host_lock_ref(m.best_match_node)     # pin the only host copy
    r2, _ = put(cache, alloc, range(10, 16))
    before = alloc.available_size()
    assert cache.evict(6).num_tokens_evicted == 6       # no host room: dropped
    assert alloc.available_size() == before + 6
    assert match(cache, range(10, 16)).host_hit_length == 0
    cache.dec_host_lock_ref(m.best_match_node, hl)
    cache.sanity_check()


def test_write_back_load_back_pins_its_nodes_against_reclaim():
    cache, alloc = make(policy="write_back")
    cache.load_back_threshold = 1
    put(cache, alloc, range(6))
    cache.evict(6)
    m = match(cache, range(6))
    assert cache.init_load_back(LoadParams(m.best_match_node, m.host_hit_length))[0] == 6
    assert cache.evict_host(100) == 0                   # pinned until the load's ack
    cache.ready_to_load_host_cache()
    cache.loading_check()
    assert cache.evict_host(100) == 6                   # now a duplicate: reclaimed
    assert match(cache, range(6)).device_prefix_len == 6
    cache.sanity_check()


def test_write_back_load_back_eviction_never_frees_the_host_pages_being_loaded():
    """Issue 13's reported bug: under write-back, the device eviction a load-back
    triggers backs its victims up, which may evict host memory; the host copies
    being loaded must survive (here the victim is dropped instead: the only host
    copy is the one being loaded)."""
    cache, alloc = make(policy="write_back", pool=8, host=4)
    cache.load_back_threshold = 1
    put(cache, alloc, range(4))                  # A
    put(cache, alloc, range(10, 14))             # B
    cache.evict(4)                               # A backed up (the whole host pool), demoted
    put(cache, alloc, range(20, 24))             # C: the device is full again
    m = match(cache, range(4))
    host_a = cache.all_host_values_flatten().tolist()
    assert cache.init_load_back(LoadParams(m.best_match_node, m.host_hit_length))[0] == 4
    # B, the victim, found no host room (A's pages are pinned): dropped, not backed up
    assert cache.all_host_values_flatten().tolist() == host_a
    assert match(cache, range(10, 14)).host_hit_length == 0
    cache.ready_to_load_host_cache()
    cache.loading_check()
    assert match(cache, range(4)).device_prefix_len == 4
    cache.sanity_check()



def test_a_walked_nodes_backup_falls_at_its_place_among_the_inserts_events():
    """Oracle finding: SGLang backs a walked node up at that point of the walk (a
    barrier), so the host room its backup makes (a CPU removal) comes before the new
    leaf's GPU store; the new leaf's own backup comes after its store."""
    cache, alloc = make(pool=16, host=4, policy="write_through_selective")
    put(cache, alloc, [1, 2, 3, 4])
    put(cache, alloc, [1, 2, 3, 4])          # second hit: backed up (the whole host pool)
    cache.check_hicache_events()
    cache.evict(4)                           # host-only now, the host pool full
    put(cache, alloc, [5, 6])
    cache.take_events()
    put(cache, alloc, [5, 6, 7])             # [5, 6] reaches its second hit on the walk
    assert media(cache.take_events()) == [("BlockRemoved", "CPU_PINNED", None),
                                          ("BlockStored", "GPU", [7])]


def test_host_lock_receipts_as_sglang():
    """Oracle findings: the receipt's delta is None (SGLang's), and releasing an
    empty receipt on a node deleted since raises NodeAccessError."""
    from flatradix import NodeAccessError

    cache, alloc = make(policy="write_through_selective")
    r, _ = put(cache, alloc, [1, 2, 3])
    rec = cache.inc_host_lock_ref(r.last_device_node)
    assert rec.delta is None and rec.component_host_lock_uuids == {}
    cache.evict(3)                           # never backed up: deleted
    with pytest.raises(NodeAccessError):
        cache.dec_host_lock_ref(r.last_device_node, rec.to_dec_params())


# ---------------------------------------------------------------------- hypothesis machine
from hypothesis import settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule  # noqa: E402

_BASES = ([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 9, 9, 9], [5, 5, 6, 6, 7, 7, 8, 8], [4, 3, 2, 1])
#: The ack protocol's calls a machine makes at arbitrary points (``ack``).
ACK_CALLS = ("flush", "wcheck", "ready", "lcheck", "step")


def ack(c, what, k):
    """One ack-protocol call on cache ``c``: ``flush_pending_backups``,
    ``writing_check(finish_count=k)``, ``ready_to_load_host_cache``,
    ``loading_check(finish_count=k)`` or ``check_hicache_events``."""
    if what == "flush":
        c.flush_pending_backups()
    elif what == "wcheck":
        c.writing_check(finish_count=k)
    elif what == "ready":
        c.ready_to_load_host_cache()
    elif what == "lcheck":
        c.loading_check(finish_count=k)
    else:
        c.check_hicache_events()


def ack_mix(c, rng):
    """A random runs' ack step: submit both queues, complete some of each."""
    c.flush_pending_backups()
    c.ready_to_load_host_cache()
    c.writing_check(finish_count=int(rng.integers(0, 3)))
    c.loading_check(finish_count=int(rng.integers(0, 2)))


def drain(c, locks, hlocks):
    """A random run's end: release every held ``(node, receipt)`` lock of either
    tier and complete every backup and load."""
    for nid, rec in locks:
        c.dec_lock_ref(nid, rec.to_dec_params())
    for nid, rec in hlocks:
        c.dec_host_lock_ref(nid, rec)
    c.check_hicache_events()
    c.ready_to_load_host_cache()
    c.loading_check()


class AuxHostTierRules(RuleBasedStateMachine):
    """The rules the auxiliary components' host-tier machines share (Mamba's in
    ``test_hicache_mamba.py``, SWA's in ``test_hicache_swa.py``): a subclass builds
    ``self.env`` (with ``cache`` and ``partition()``) and ``self.locks`` /
    ``self.hlocks`` (``(node, receipt)`` pairs) in its own ``build`` rule and gives
    a storage refill's staging (``_staging(n, pages)``: ``insert_host`` keywords);
    these release a held lock of either tier, make ack calls at arbitrary points,
    refill the host tier from storage, and check ``env.partition()`` after every
    step."""

    def __init__(self):
        super().__init__()
        self.env = None

    def _toks(self, b, cut):
        t = _BASES[b][:cut]
        return t[:len(t) - len(t) % self.env.cache.page_size]

    @rule(i=st.integers(0, 2), host=st.booleans())
    @precondition(lambda self: self.env is not None and (self.locks or self.hlocks))
    def release(self, i, host):
        c = self.env.cache
        if host and self.hlocks:
            nid, rec = self.hlocks.pop(i % len(self.hlocks))
            c.dec_host_lock_ref(nid, rec)
        elif self.locks:
            nid, rec = self.locks.pop(i % len(self.locks))
            c.dec_lock_ref(nid, rec.to_dec_params())

    @rule(what=st.sampled_from(ACK_CALLS), k=st.integers(0, 2))
    @precondition(lambda self: self.env is not None)
    def acks(self, what, k):
        ack(self.env.cache, what, k)

    @rule(b=st.integers(0, 3), cut=st.integers(1, 8), at=st.integers(0, 8),
          pages=st.integers(1, 4))
    @precondition(lambda self: self.env is not None)
    def refill(self, b, cut, at, pages):
        """A storage refill of ``toks`` below the host match of its first ``at``
        tokens, with the component's staging (``_staging``: ``pages`` pages)."""
        c = self.env.cache
        toks = self._toks(b, cut)
        anchor = c.match_prefix(MatchPrefixParams(key=RadixKey(list(toks[:at])))).last_host_node \
            if at and len(toks) >= at else c.root_node_handle()
        depth = Q.path_units(c._engine, anchor)
        if depth >= len(toks):
            return
        h = c.mem_pool_host.alloc(len(toks) - depth)
        if h is None:
            return
        r = c.insert_host(anchor, RadixKey(list(toks[depth:])), h,
                          **self._staging(len(toks) - depth, pages))
        c.mem_pool_host.free(h if r.host_insert_dropped else h[:r.prefix_len])

    @invariant()
    def partitioned(self):
        if self.env is not None:
            self.env.partition()


class HostTierMachine(RuleBasedStateMachine):
    """The host tier under a random schedule: backups, demotes, write-back backups and
    drops, host eviction and duplicate reclaim, load-backs, host locks, storage
    refills (``insert_host``), and the ack
    calls (flush / writing_check / ready / loading_check with counts) at arbitrary
    points, so acks arrive late and interleaved. Invariant after every step: both
    tiers' slots partition exactly -- device: free (allocator) + cached (tree) +
    held (slots of inserts the machine still owns: none, every insert hands its
    slots over) == the pool; host: free + cached == the host pool; plus
    ``sanity_check()`` (heaps, ledgers, duplicate list, locks)."""

    def __init__(self):
        super().__init__()
        self.page = 2
        self.policy = None
        self.cache = None

    @rule(policy=st.sampled_from(["write_through", "write_through_selective", "write_back"]),
          host=st.sampled_from([4, 8, 16, 64]))
    @precondition(lambda self: self.cache is None)
    def build(self, policy, host):
        self.alloc = TokenToKVPoolAllocator(24, page_size=self.page)
        self.cache = UnifiedRadixCache(page_size=self.page, token_to_kv_pool_allocator=self.alloc,
                                       enable_kv_cache_events=True, node_capacity=8,
                                       pool_capacity=64)
        self.cache.init_hicache(host_size=host, hicache_write_policy=policy,
                                load_back_threshold=1)
        self.locks, self.hlocks = [], []

    def _key(self, b, cut, tail):
        return (_BASES[b][:cut] + tail)

    @rule(b=st.integers(0, 3), cut=st.integers(0, 8), tail=st.lists(st.integers(0, 3), max_size=4))
    @precondition(lambda self: self.cache is not None)
    def insert(self, b, cut, tail):
        toks = self._key(b, cut, tail)
        n = len(toks) - len(toks) % self.page
        if n == 0:
            return
        if self.alloc.available_size() < n:
            self.cache.evict(n - self.alloc.available_size())
        v = self.alloc.alloc(n)
        if v is not None:
            self.cache.insert(InsertParams(key=RadixKey(toks[:n]), value=v))

    @rule(b=st.integers(0, 3), cut=st.integers(1, 8), lock=st.booleans(), load=st.booleans(),
          hlock=st.booleans())
    @precondition(lambda self: self.cache is not None)
    def match(self, b, cut, lock, load, hlock):
        m = match(self.cache, _BASES[b][:cut])
        if hlock and len(self.hlocks) < 3:
            rec = self.cache.inc_host_lock_ref(m.best_match_node)
            if rec.component_host_lock_uuids:  # an empty receipt pins nothing (the node may go)
                self.hlocks.append((m.best_match_node, rec))
        if load and m.host_hit_length:
            self.cache.init_load_back(LoadParams(m.best_match_node, m.host_hit_length))
        elif lock and len(self.locks) < 3:
            self.locks.append((m.last_device_node, self.cache.inc_lock_ref(m.last_device_node)))

    @rule(i=st.integers(0, 2), host=st.booleans())
    @precondition(lambda self: self.cache is not None and (self.locks or self.hlocks))
    def release(self, i, host):
        if host and self.hlocks:
            nid, rec = self.hlocks.pop(i % len(self.hlocks))
            self.cache.dec_host_lock_ref(nid, rec.to_dec_params())
        elif self.locks:
            nid, rec = self.locks.pop(i % len(self.locks))
            self.cache.dec_lock_ref(nid, rec.to_dec_params())

    @rule(n=st.integers(1, 16))
    @precondition(lambda self: self.cache is not None)
    def evict(self, n):
        self.cache.evict(n)

    @rule(n=st.integers(1, 16))
    @precondition(lambda self: self.cache is not None)
    def evict_host(self, n):
        self.cache.evict_host(n)

    @rule(b=st.integers(0, 3), cut=st.integers(0, 8), extra=st.integers(1, 3),
          anchor_pages=st.integers(0, 4))
    @precondition(lambda self: self.cache is not None)
    def insert_host(self, b, cut, extra, anchor_pages):
        """A storage refill: host slots for ``toks[a:cut + extra pages]`` below the
        node a match of ``toks[:a]`` ends on (a prefetch anchor, possibly above
        nodes cached since); the slots the result leaves to the caller go back."""
        P = self.page
        toks = _BASES[b][:cut] + [7] * (extra * P)
        a = min(anchor_pages * P, (len(toks) // P - 1) * P)
        n = (len(toks) - a) // P * P
        if a < 0 or n <= 0:
            return
        anchor = match(self.cache, toks[:a]).best_match_node if a else \
            self.cache.root_node_handle()
        h = self.cache.mem_pool_host.alloc(n)
        if h is None:
            return
        r = self.cache.insert_host(anchor, RadixKey(toks[a:a + n]), h)
        self.cache.mem_pool_host.free(h if r.host_insert_dropped else h[:r.prefix_len])

    @rule(what=st.sampled_from(ACK_CALLS), k=st.integers(0, 2))
    @precondition(lambda self: self.cache is not None)
    def acks(self, what, k):
        ack(self.cache, what, k)

    @invariant()
    def partitioned(self):
        if self.cache is not None:
            check_partition(self.cache, self.alloc, self.cache.mem_pool_host)


HostTierMachine.TestCase.settings = settings(max_examples=120, stateful_step_count=40,
                                             deadline=None)
TestHostTierMachine = HostTierMachine.TestCase


def test_write_back_declined_drop_frees_nothing_twice():
    """Oracle finding: a victim whose backup finds no host room, after host eviction
    freed something, and whose drop is declined (a host-locked child) -- the host
    eviction's frees and events happen once, and the victim stays on the device."""
    cache, alloc = make(policy="write_back", pool=16, host=3)
    put(cache, alloc, [5])
    cache.evict(1)                              # Z backed up (1 host slot), demoted
    put(cache, alloc, [1, 2])                   # A
    r, _ = put(cache, alloc, [1, 2, 3, 4])      # B under A
    cache.evict(1)                              # B backed up (host full), demoted
    hl = cache.inc_host_lock_ref(r.last_device_node)
    cache.take_events()
    assert cache.evict(1).num_tokens_evicted == 0   # A: no host room, drop declined
    assert media(cache.take_events()) == [("BlockRemoved", "CPU_PINNED", None)]  # Z, once
    assert cache.mem_pool_host.available_size() == 1
    assert match(cache, [5]).host_hit_length == 0
    assert match(cache, [1, 2]).device_prefix_len == 2
    cache.dec_host_lock_ref(r.last_device_node, hl)
    cache.sanity_check()


# ---------------------------------------------------------------------- a transfer that fails
class _Boom(RuntimeError):
    pass


def _failing(kinds):
    """A transfer callable whose first copy of each kind in ``kinds`` raises."""
    calls = []

    def transfer(kind, dev, host):
        calls.append(kind)
        if kind in kinds and calls.count(kind) == 1:
            raise _Boom(kind)
    return transfer, calls


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_a_failed_backup_copy_commits_nothing_and_loses_nothing(policy):
    """Fresh-user finding: a transfer callable that raises during a backup left the
    node pinned (write-through) or marked backed up without a copy (write-back).
    Now the copy runs before the commit: on failure the host slots go back, nothing
    is marked, every other action of the call still runs, and the exception is
    raised at the end; a later eviction or hit retries."""
    alloc = TokenToKVPoolAllocator(64)
    cache = UnifiedRadixCache(page_size=1, token_to_kv_pool_allocator=alloc)
    transfer, calls = _failing({"backup"})
    cache.init_hicache(host_size=32, hicache_write_policy=policy, transfer=transfer)
    v = alloc.alloc(10)
    if policy == "write_through":
        with pytest.raises(_Boom):
            cache.insert(InsertParams(key=RadixKey(list(range(10))), value=v))
    else:
        cache.insert(InsertParams(key=RadixKey(list(range(10))), value=v))
        with pytest.raises(_Boom):
            cache.evict(10)
    assert calls == ["backup"]
    assert cache.host_total_size() == 0 and cache.mem_pool_host.available_size() == 32
    assert cache.ongoing_write_through == {} and cache.protected_size() == 0
    cache.sanity_check()
    check_partition(cache, alloc, cache.mem_pool_host)
    # not pinned: write-through deletes the unbacked leaf, write-back retries the copy
    assert cache.evict(10).num_tokens_evicted == 10
    assert calls == (["backup"] if policy == "write_through" else ["backup", "backup"])
    assert cache.host_total_size() == (0 if policy == "write_through" else 10)
    cache.sanity_check()


def test_a_failed_load_copy_gives_the_slots_and_locks_back():
    alloc = TokenToKVPoolAllocator(64)
    cache = UnifiedRadixCache(page_size=1, token_to_kv_pool_allocator=alloc)
    transfer, calls = _failing({"load"})
    cache.init_hicache(host_size=32, transfer=transfer, load_back_threshold=1)
    cache.insert(InsertParams(key=RadixKey(list(range(10))), value=alloc.alloc(10)))
    cache.check_hicache_events()
    cache.evict(10)
    m = match(cache, range(10))
    with pytest.raises(_Boom):
        cache.init_load_back(LoadParams(m.best_match_node, m.host_hit_length))
    assert alloc.available_size() == 64 and cache.protected_size() == 0
    assert cache.host_evictable_size() == 10 and cache.ongoing_load_back == {}
    check_partition(cache, alloc, cache.mem_pool_host)


def test_loading_check_after_a_caller_released_the_loads_own_pins():
    """A load-back holds a device path lock and a host lock on its node until its
    ack. When a caller's unlock too many takes one of them, loading_check says
    which (LockRefError), still clears the load (no node stays "loading") and
    releases the other pin; the ledgers come back to the same figures as
    without the stray release, and another load of the same ack completes."""
    from flatradix import LockRefError

    for stolen in ("device", "host"):
        cache, alloc = make()
        put(cache, alloc, range(10))
        put(cache, alloc, range(100, 110))
        cache.check_hicache_events()
        cache.evict(20)
        other = match(cache, range(100, 110)).best_match_node
        m = match(cache, range(10))
        node = m.best_match_node
        assert cache.init_load_back(LoadParams(node, 10)) == (10, node)
        assert cache.init_load_back(LoadParams(other, 10)) == (10, other)   # same ack
        assert cache.protected_size() == 20   # the loads' path locks
        if stolen == "device":
            cache.dec_lock_ref(node)          # the load's own lock, released by a caller
            assert cache.protected_size() == 10
        else:
            # the host-lock stamp is the load's: a receipt with the same stamp
            stamp = cache.inc_host_lock_ref(node)
            cache.dec_host_lock_ref(node, stamp)
            cache.dec_host_lock_ref(node, stamp)   # one too many: the load's pin
        cache.ready_to_load_host_cache()
        with pytest.raises(LockRefError, match="path lock" if stolen == "device" else "host lock"):
            cache.loading_check()
        # both loads completed, every pin released
        assert cache.ongoing_load_back == {} and cache.protected_size() == 0
        assert cache.evictable_size() == 20 and cache.host_evictable_size() == 0
        # the nodes are no longer loading: demoted, then evicted from the host
        assert cache.evict(20).num_tokens_evicted == 20
        assert cache.host_evictable_size() == 20 and cache.evict_host(20) == 20
        cache.sanity_check()


def test_a_failed_backup_in_cache_finished_req_still_finishes_the_request():
    from flatradix import Req, ReqToTokenPool

    alloc = TokenToKVPoolAllocator(64)
    rtp = ReqToTokenPool(4, 64)
    cache = UnifiedRadixCache(page_size=1, token_to_kv_pool_allocator=alloc,
                              req_to_token_pool=rtp)
    transfer, _ = _failing({"backup"})
    cache.init_hicache(host_size=32, transfer=transfer)
    toks = list(range(12))
    row = rtp.alloc(1)[0]
    rtp.write((row, slice(0, 12)), alloc.alloc(12))
    req = Req(origin_input_ids=toks, req_pool_idx=row, kv_committed_len=12,
              kv_allocated_len=12)
    req.last_node = cache.root_node_handle()
    with pytest.raises(_Boom):
        cache.cache_finished_req(req)
    # the request was finished all the same: its row is free, its KV cached, unpinned
    assert rtp.available_size() == rtp.size and cache.protected_size() == 0
    assert alloc.available_size() + cache.evictable_size() == 64
    cache.sanity_check()


def test_fresh_user_bad_inputs_name_the_argument():
    cache, alloc = make()
    put(cache, alloc, range(4))
    snap = cache._snapshot()
    for call, err, what in [
            (lambda: cache.load_back("x"), TypeError, "node"),
            (lambda: cache.init_load_back(None), TypeError, "InitLoadBackParams"),
            (lambda: cache.init_load_back(LoadParams("x", 1)), TypeError,
             "params.best_match_node"),
            (lambda: cache.evict_host(5, "FULL"), ValueError, "component_type"),
            (lambda: cache.writing_check(write_back="no"), TypeError, "write_back"),
            (lambda: cache.dec_host_lock_ref(cache.root_node_handle(), {}), TypeError, "params"),
            (lambda: cache.init_load_back(LoadParams(1 << 40, 0)), KeyError,
             "params.best_match_node"),
            (lambda: cache.init_load_back(LoadParams(1 << 40, 4)), KeyError,
             "params.best_match_node"),
            (lambda: cache.init_load_back(LoadParams(cache.root_node_handle(), 0, -1)),
             ValueError, "params.mem_quota"),
    ]:
        with pytest.raises(err, match=what):
            call()
    after = cache._snapshot()
    for k in snap:
        if isinstance(snap[k], np.ndarray):
            assert np.array_equal(snap[k], after[k]), k
    fresh = UnifiedRadixCache(token_to_kv_pool_allocator=TokenToKVPoolAllocator(64))
    for kw, err, what in [(dict(hicache_ratio="2"), TypeError, "hicache_ratio"),
                          (dict(hicache_ratio=float("inf")), ValueError, "hicache_ratio"),
                          (dict(host_size=2 ** 41), ValueError, "host_size"),
                          (dict(host_size=8, load_back_threshold=-5), ValueError,
                           "load_back_threshold")]:
        with pytest.raises(err, match=what):
            fresh.init_hicache(**kw)
    assert not fresh.enable_hicache


# ---------------------------------------------------------------------- insert_host
def _same_state(before, after):
    for k in before:
        if isinstance(before[k], np.ndarray):
            assert np.array_equal(before[k], after[k]), k
        else:
            assert before[k] == after[k], k


def _backed(cache, alloc, tokens):
    """Insert ``tokens`` twice (write_through_selective backs up at the second hit)
    and complete the backup: one device + host node."""
    r, _ = put(cache, alloc, tokens)
    cache.insert(InsertParams(key=RadixKey(list(tokens)), value=alloc.alloc(len(tokens))))
    cache.check_hicache_events()
    return r.last_device_node


def test_insert_host_refills_walked_nodes_and_adds_a_host_only_leaf():
    cache, alloc = make(host=100, policy="write_through_selective")
    a = _backed(cache, alloc, range(10))                      # [0,10): device + host
    put(cache, alloc, range(20))                              # [10,20): device only
    assert cache.host_total_size() == 10
    cache.take_events()
    h = cache.mem_pool_host.alloc(30)
    r = cache.insert_host(cache.root_node_handle(), RadixKey(list(range(30))), h)
    # [0,10) had a host copy: prefix 10 (the caller frees h[:10]); [10,20) takes
    # h[10:20]; [20,30) becomes a host-only leaf with h[20:30]
    assert (r.prefix_len, r.total_len, r.host_insert_dropped) == (10, 30, False)
    assert r.inserted_host_node not in (None, a)
    cache.mem_pool_host.free(h[:10])
    assert cache.host_total_size() == 30 and cache.host_evictable_size() == 10
    assert sorted(cache.all_host_values_flatten().tolist()) == sorted(
        list(range(0, 10)) + h[10:].tolist())  # the first backup took host slots 0..9
    # the refill and the new leaf, parent first (the sink coalesces a chain into one event)
    assert media(cache.take_events()) == [("BlockStored", "CPU_PINNED", list(range(10, 30)))]
    m = match(cache, range(30))
    assert (m.device_prefix_len, m.host_hit_length) == (20, 10)
    assert m.last_host_node == r.inserted_host_node
    check_partition(cache, alloc, cache.mem_pool_host)
    # the refilled node is a duplicate now: a device eviction demotes it, not deletes it
    assert cache.evict(10).num_tokens_evicted == 10
    assert (match(cache, range(30)).device_prefix_len, match(cache, range(30)).host_hit_length) \
        == (10, 20)
    check_partition(cache, alloc, cache.mem_pool_host)


def test_insert_host_dropped_below_a_node_without_a_host_copy():
    cache, alloc = make(host=100, policy="write_through_selective")
    d = put(cache, alloc, range(100, 110))[0].last_device_node  # device only
    h = cache.mem_pool_host.alloc(10)
    before = cache._snapshot()
    r = cache.insert_host(d, RadixKey(list(range(110, 120))), h)
    assert (r.prefix_len, r.inserted_host_node, r.host_insert_dropped) == (0, None, True)
    after = cache._snapshot()
    # no node, key or value changed (only the anchor's access time: it is touched)
    for k in ("ctab", "pool"):
        assert np.array_equal(before[k], after[k]), k
    assert cache.host_total_size() == 0 and cache.node_count() == 1
    cache.mem_pool_host.free(h)                               # dropped: all go back
    check_partition(cache, alloc, cache.mem_pool_host)


def test_insert_host_never_refills_below_a_device_only_anchor():
    # a prefetch anchored on a device-only node, with a child cached meanwhile:
    # SGLang refills the child and leaves a host copy under a node without one
    # (its sanity check fails, its Rust core panics at a later eviction);
    # flatradix drops the refill
    cache, alloc = make(host=100, policy="write_through_selective")
    put(cache, alloc, range(200, 220))                        # one node, device only
    e = match(cache, range(200, 210)).last_device_node        # split: [200,210) + [210,220)
    h = cache.mem_pool_host.alloc(20)
    r = cache.insert_host(e, RadixKey(list(range(210, 230))), h)
    assert (r.prefix_len, r.inserted_host_node, r.host_insert_dropped) == (0, None, True)
    assert cache.host_total_size() == 0
    cache.mem_pool_host.free(h)
    assert cache.evict(20).num_tokens_evicted == 20           # both still plain device nodes
    check_partition(cache, alloc, cache.mem_pool_host)


def test_insert_host_split_and_write_back_rules():
    cache, alloc = make(host=100, policy="write_through_selective")
    a = _backed(cache, alloc, range(10))
    h = cache.mem_pool_host.alloc(5)
    r = cache.insert_host(cache.root_node_handle(), RadixKey(list(range(5))), h)
    # the walk ends inside [0,10): split; the upper part holds a host copy already
    assert (r.prefix_len, r.host_insert_dropped) == (5, False)
    assert r.inserted_host_node not in (None, a) and cache.node_count() == 2
    cache.mem_pool_host.free(h)
    check_partition(cache, alloc, cache.mem_pool_host)
    # write-back: walked nodes take nothing, prefix_len is the matched length, and
    # the rest hangs below a node without a host copy
    cache, alloc = make(host=100, policy="write_back")
    put(cache, alloc, range(10))
    h = cache.mem_pool_host.alloc(20)
    r = cache.insert_host(cache.root_node_handle(), RadixKey(list(range(20))), h)
    assert (r.prefix_len, r.host_insert_dropped) == (10, False)
    cache.mem_pool_host.free(h[:10])
    assert cache.host_total_size() == 10
    m = match(cache, range(20))
    assert (m.device_prefix_len, m.host_hit_length) == (10, 10)
    # and the refill loads back like any host-only node
    loaded, node = cache.init_load_back(LoadParams(m.best_match_node, m.host_hit_length))
    assert loaded == 10 and match(cache, range(20)).device_prefix_len == 20
    cache.loading_check()
    check_partition(cache, alloc, cache.mem_pool_host)


def test_insert_host_refuses_bad_input_and_changes_nothing():
    from flatradix import NodeAccessError

    cache, alloc = make(page=2, host=100, policy="write_through_selective")
    a = _backed(cache, alloc, range(10))
    h = cache.mem_pool_host.alloc(4)
    free = cache.mem_pool_host.alloc(1)
    cache.mem_pool_host.free(free)
    before = cache._snapshot()
    root = cache.root_node_handle()
    for args, exc, msg in [
        ((root, RadixKey([1, 2, 3]), h[:3]), ValueError, "multiple of page_size"),
        ((root, RadixKey([1, 2, 3, 4]), h[:2]), ValueError, "one host slot per key unit"),
        ((root, RadixKey([1, 2]), np.array([h[0], free[0]])), ValueError, "handed out"),
        ((root, RadixKey([1, 2]), np.array([h[0], h[0]])), ValueError, "distinct"),
        ((root, RadixKey([1, 2]), np.array([h[0], 1000])), ValueError, "lie in"),
        ((root, [1, 2], h[:2]), TypeError, "RadixKey"),
        ((a, RadixKey([1, 2], extra_key="lora"), h[:2]), ValueError, "namespace"),
        ((a + (1 << 40), RadixKey([1, 2]), h[:2]), NodeAccessError, "node"),
    ]:
        with pytest.raises(exc, match=msg):
            cache.insert_host(*args)
    with pytest.raises(ValueError, match="page hashes"):
        cache.insert_host(root, RadixKey([1, 2, 3, 4]), h, hash_value=["x"])
    _same_state(before, cache._snapshot())
    plain, palloc = UnifiedRadixCache(), None
    with pytest.raises(ValueError, match="no host tier"):
        plain.insert_host(plain.root_node_handle(), RadixKey([1]), np.array([0]))
    del palloc


def test_write_back_load_whose_eviction_fails_a_backup_copy_gives_its_pins_back():
    """Under write-back a load-back short of device slots evicts first, and that
    eviction backs its victim up. When that copy fails the load is not made and
    the error is raised; the load's pins (path lock, host lock) go back, so a
    retry loads and the prefix is evictable again after its ack (found by
    helper-23: the pins stayed, and 12 tokens on both tiers with them)."""
    alloc = TokenToKVPoolAllocator(16)
    cache = UnifiedRadixCache(page_size=1, token_to_kv_pool_allocator=alloc)
    transfer, calls = _failing(set())
    broken = {"on": False}

    def flaky(kind, dev, host):
        if kind == "backup" and broken["on"]:
            raise _Boom("backup copy failed")
        transfer(kind, dev, host)

    cache.init_hicache(host_size=64, hicache_write_policy="write_back", transfer=flaky,
                       load_back_threshold=1)
    a, b = list(range(1, 13)), list(range(100, 112))
    cache.insert(InsertParams(key=RadixKey(a), value=alloc.alloc(12)))
    cache.evict(12)                                   # a: host only
    cache.insert(InsertParams(key=RadixKey(b), value=alloc.alloc(12)))   # 4 slots free
    m = match(cache, a)
    before = (cache.evictable_size(), cache.protected_size(), cache.host_evictable_size())
    assert before == (12, 0, 12)
    broken["on"] = True
    with pytest.raises(_Boom):
        cache.init_load_back(LoadParams(m.best_match_node, m.host_hit_length))
    assert (cache.evictable_size(), cache.protected_size(), cache.host_evictable_size()) == before
    broken["on"] = False
    m = match(cache, a)
    assert cache.init_load_back(LoadParams(m.best_match_node, m.host_hit_length))[0] == 12
    cache.ready_to_load_host_cache()
    cache.loading_check()
    assert cache.protected_size() == 0
    assert cache.evict(10 ** 6).num_tokens_evicted == 12   # a, loaded back, evictable
    assert cache.evictable_size() == 0 and cache.protected_size() == 0
    cache.sanity_check()


def test_init_hicache_on_a_populated_cache_keeps_every_node():
    # the host column is added by copying the pool's rows in use only (the rows past
    # the top stay untouched: a pool sized from a large allocator is mostly unused);
    # after churn (the pool doubles, then a gap pass puts new spans in evicted
    # nodes' rows), every cached key still matches its slots
    alloc = TokenToKVPoolAllocator(600)
    cache = UnifiedRadixCache(token_to_kv_pool_allocator=alloc, enable_kv_cache_events=True,
                              pool_capacity=256)
    kept = {}
    for i in range(40):
        k = list(range(i * 100, i * 100 + 30))
        v = alloc.alloc(30)
        if v is None:
            cache.evict(EvictParams(num_tokens=30))
            v = alloc.alloc(30)
        cache.insert(InsertParams(key=RadixKey(k), value=v))
        kept[i] = v.tolist()
    top = int(cache._engine.st.meta[L.M_POOL_TOP])
    assert top < cache._engine.st.pool.shape[0] and cache._engine.gap_passes >= 1
    cache.init_hicache(host_size=1000)
    cache.sanity_check()
    live = 0
    for i, v in kept.items():
        key = RadixKey(list(range(i * 100, i * 100 + 30)))
        m = cache.match_prefix(MatchPrefixParams(key=key))
        if m.device_prefix_len:
            assert np.asarray(m.device_indices).tolist() == v
            live += 1
    assert live == cache.total_size()[0] // 30 > 0
