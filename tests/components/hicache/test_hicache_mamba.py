"""Mamba on the host tier (HiCache, SGLang 0.5.23 spec §6.3 / §8): hand-worked scenarios,
the reported bug "Mamba with HiCache prunes evicted nodes instead of moving them to the
host", the slot partition on all four pools over random runs, bad input.

Every expected value is worked out by hand from the spec (and checked against SGLang's
own cache by ``tests/oracle/hicache_driver.py``'s ``*-mamba-*`` configurations): a
backup copies a node's Full KV *and* its state; demoting a backed-up leaf frees both on
the device and keeps both on the host; a match through a host-only state reports
``mamba_host_hit_length`` 1; a load-back restores the state into a fresh device slot and
copies it into the request's own slot; ``evict_host(n, MAMBA)`` frees host states from
the least recently used end, a host leaf whole.
"""

from types import SimpleNamespace

import numpy as np
import pytest

from flatradix import (
    ComponentType, EvictParams, HybridReqToTokenPool, InitLoadBackParams, InsertParams,
    LockRefError, MatchPrefixParams, RadixKey, TokenToKVPoolAllocator, UnifiedRadixCache,
)
from flatradix.inspection import all_mamba_host_values_flatten

from .test_hicache import _same_state, ack_mix, drain

FULL, MAMBA = ComponentType.FULL, ComponentType.MAMBA


class Env:
    """A FULL+MAMBA cache with flatradix's pools and a host tier; every transfer the
    tree asks for is logged as ``(kind, device slots, host slots)``."""

    def __init__(self, states=8, pool=64, host=64, host_states=16, policy="write_through",
                 page=1, threshold=1):
        self.alloc = TokenToKVPoolAllocator(pool, page_size=page)
        self.pool = HybridReqToTokenPool(4, 256, mamba_size=states,
                                         enable_mamba_extra_buffer=page > 1)
        self.ma = self.pool.mamba_allocator
        self.cache = UnifiedRadixCache(
            page_size=page, tree_components=(FULL, MAMBA), token_to_kv_pool_allocator=self.alloc,
            req_to_token_pool=self.pool, mamba_cache_chunk_size=4,
            enable_mamba_extra_buffer=page > 1)
        self.log = []
        self.cache.init_hicache(host_size=host, mamba_host_size=host_states,
                                hicache_write_policy=policy, load_back_threshold=threshold,
                                transfer=lambda k, d, h: self.log.append(
                                    (k, np.asarray(d).tolist(), np.asarray(h).tolist())))
        self.caller = []   # state slots the test holds (requests')

    def ins(self, toks):
        kv = self.alloc.alloc(len(toks))
        st = self.ma.alloc(1)
        r = self.cache.insert(InsertParams(key=RadixKey(list(toks)), value=kv, mamba_value=st))
        if r.mamba_exist:
            self.ma.free(st)
        return r, int(st[0])

    def match(self, toks):
        return self.cache.match_prefix(MatchPrefixParams(key=RadixKey(list(toks))))

    def req(self, m=None, slot=None):
        return SimpleNamespace(last_node=None if m is None else m.last_device_node,
                               mamba_host_hit_length=0 if m is None else m.mamba_host_hit_length,
                               kv=SimpleNamespace(mamba_pool_idx=slot))

    def host_states(self):
        return sorted(all_mamba_host_values_flatten(self.cache._engine).tolist())

    def partition(self):
        """Each of the four pools: free + tree (+ the test's) == every slot, disjoint."""
        c = self.cache
        c.sanity_check()
        tree = np.asarray(c.all_values_flatten()).tolist()
        assert len(set(tree)) == len(tree)
        assert self.alloc.available_size() + len(tree) == self.alloc.size
        states = c.all_mamba_values_flatten().tolist()
        assert len(set(states)) == len(states)
        assert self.ma.available_size() + len(states) + len(self.caller) == self.ma.size
        htree = c.all_host_values_flatten().tolist()
        assert c.mem_pool_host.available_size() + len(htree) == c.mem_pool_host.size
        hs = self.host_states()
        assert len(set(hs)) == len(hs) == c.mamba_host_total_size()
        assert c.mamba_pool_host.available_size() + len(hs) == c.mamba_pool_host.size


def bare(tokens=32, **kw):
    """``(alloc, pool, cache)``: a Full + Mamba cache of ``tokens`` KV slots and 4
    states, its host tier off (``kw``: the cache's other arguments)."""
    alloc = TokenToKVPoolAllocator(tokens)
    pool = HybridReqToTokenPool(4, 64, mamba_size=4)
    cache = UnifiedRadixCache(tree_components=(FULL, MAMBA), token_to_kv_pool_allocator=alloc,
                              req_to_token_pool=pool, **kw)
    return alloc, pool, cache


def backed(env, *keys):
    """Insert each key (backed up at its first hit under write_through) and ack."""
    for k in keys:
        env.ins(k)
    env.cache.check_hicache_events()


def test_backup_copies_the_state_and_demotion_keeps_it_on_the_host():
    env = Env()
    (_, s1), (_, s2) = env.ins(range(1, 9)), env.ins([1, 2, 3, 4, 50, 51, 52, 53])
    env.cache.flush_pending_backups()
    # two backups (one per new leaf; the second's split upper part is backed already)
    kinds = [k for k, _, _ in env.log]
    assert kinds == ["backup", "backup_state", "backup", "backup_state"]
    assert [d for k, d, _ in env.log if k == "backup_state"] == [[s1], [s2]]
    env.cache.writing_check()
    assert env.cache.mamba_host_total_size() == 2
    r = env.cache.evict(EvictParams(num_tokens=12, mamba_num=2))
    # both leaves demoted: 4 + 4 Full tokens and their 2 states; the shared upper part
    # [1, 2, 3, 4] (no state: a split's upper part holds none) then 4 more
    assert (r.num_tokens_evicted, r.mamba_num_evicted) == (12, 2)
    assert env.cache.all_mamba_values_flatten().tolist() == []
    assert env.cache.mamba_host_total_size() == 2       # moved to the host, not pruned
    env.partition()


def test_b_mamba_prune_evicted_nodes_keep_a_host_hit():
    """Reported bug (issue 13): with HiCache, evicting a Mamba node must demote it
    (host copy kept), so a later match still reports a host hit -- the Mamba walk's
    leaf victims included."""
    env = Env()
    backed(env, range(1, 9))
    r = env.cache.evict(EvictParams(num_tokens=0, mamba_num=1))   # the Mamba walk
    assert (r.num_tokens_evicted, r.mamba_num_evicted) == (8, 1)   # its leaf, demoted
    m = env.match(range(1, 9))
    assert (m.device_prefix_len, m.host_hit_length, m.mamba_host_hit_length) == (0, 8, 1)
    assert m.mamba_branching_seqlen is None      # 8 is on the grid, not past 0 + 8
    assert m.best_match_node != env.cache.root_node_handle()
    env.partition()


def test_load_back_restores_the_state_and_copies_it_into_the_request_slot():
    env = Env()
    backed(env, range(1, 9))
    env.cache.evict(EvictParams(num_tokens=8, mamba_num=1))
    env.log.clear()
    m = env.match(range(1, 9))
    host_state = env.host_states()[0]
    req = env.req(m)
    n, node = env.cache.init_load_back(InitLoadBackParams(m.best_match_node, m.host_hit_length,
                                                          None, req))
    assert (n, node) == (8, m.best_match_node)
    got = int(req.kv.mamba_pool_idx)              # the load gave the request a slot
    restored = env.cache.all_mamba_values_flatten().tolist()
    assert len(restored) == 1 and restored[0] != got
    assert [(k, d, h) for k, d, h in env.log if k == "load_state"] == [
        ("load_state", restored, [host_state]), ("load_state", [got], [host_state])]
    assert env.cache.mamba_protected_size() == 1  # pinned until the ack
    env.cache.ready_to_load_host_cache()
    env.cache.loading_check()
    assert (env.cache.mamba_protected_size(), env.cache.mamba_evictable_size()) == (0, 1)
    env.caller.append(got)
    m2 = env.match(range(1, 9))
    assert (m2.device_prefix_len, m2.mamba_host_hit_length) == (8, 0)
    env.partition()


def test_a_state_only_load_counts_the_full_tokens_it_made_usable():
    """A node on the device whose state is on the host only (its device state was
    tombstoned): SGLang loads the state alone and returns the Full device tokens from
    the best node up to the request's device node."""
    env = Env()
    backed(env, range(1, 9), range(1, 13))   # a child: [1..8] is internal now
    env.cache.evict(EvictParams(num_tokens=0, mamba_num=1))  # LRU: [1..8]'s state
    assert len(env.host_states()) == 2 and env.cache.mamba_evictable_size() == 1
    m = env.match(range(1, 9))
    assert (m.device_prefix_len, m.host_hit_length, m.mamba_host_hit_length) == (0, 8, 1)
    req = env.req(m)
    n, node = env.cache.init_load_back(InitLoadBackParams(m.best_match_node, m.host_hit_length,
                                                          None, req))
    assert (n, node) == (8, m.best_match_node)
    env.caller.append(int(req.kv.mamba_pool_idx))
    env.cache.check_hicache_events()
    m2 = env.match(range(1, 9))
    assert (m2.device_prefix_len, m2.mamba_host_hit_length) == (8, 0)
    env.partition()


def test_a_declined_load_gives_the_request_slot_back_and_keeps_its_own():
    env = Env(threshold=1)
    backed(env, range(1, 9))
    env.cache.evict(EvictParams(num_tokens=8, mamba_num=1))
    m = env.match(range(1, 9))
    free_before = env.ma.available_size()
    req = env.req(m)
    # mem_quota 0: declined after the request slot was taken: it goes back, cleared
    assert env.cache.init_load_back(InitLoadBackParams(m.best_match_node, m.host_hit_length,
                                                       0, req)) == (0, m.last_device_node)
    assert req.kv.mamba_pool_idx is None and env.ma.available_size() == free_before
    own = int(env.ma.alloc(1)[0])          # a request holding its own slot keeps it
    req = env.req(m, own)
    assert not env.cache.load_back(m.best_match_node, 0, req)
    assert req.kv.mamba_pool_idx == own and env.ma.is_held([own])[0]
    env.caller.append(own)
    assert env.cache.protected_size() == 0 and env.cache.mamba_protected_size() == 0
    env.partition()


def test_no_state_room_raises_and_gives_the_pins_back():
    """The state pool empty and nothing evictable: SGLang asserts (and keeps the load's
    locks); flatradix raises RuntimeError and releases them."""
    env = Env(states=2)
    backed(env, range(1, 9))
    env.cache.evict(EvictParams(num_tokens=8, mamba_num=1))
    env.caller += [int(env.ma.alloc(1)[0]), int(env.ma.alloc(1)[0])]   # the pool is empty
    m = env.match(range(1, 9))
    before = env.cache._snapshot()
    with pytest.raises(RuntimeError, match="Cannot alloc mamba"):
        env.cache.init_load_back(InitLoadBackParams(m.best_match_node, m.host_hit_length, None,
                                                    env.req(m)))
    after = env.cache._snapshot()
    # every lock given back: the node table as before, but for the host-lock boundary
    # stamp the pin left on the node (stamps are never reused; SGLang keeps its uuid too)
    from flatradix.kernels.layout import HOST_UUID
    cols = [c for c in range(before["nodes"].shape[1]) if c != HOST_UUID]
    assert np.array_equal(before["nodes"][:, cols], after["nodes"][:, cols])
    assert env.cache.protected_size() == 0 and env.cache.mamba_protected_size() == 0
    env.partition()


def test_evict_host_states_lru_first_skipping_host_locks_and_leaves_go_whole():
    env = Env()
    backed(env, range(1, 9), range(20, 28))
    env.ins(list(range(1, 9)) + [9, 10, 11, 12])   # [1..8] internal from here on
    env.cache.check_hicache_events()
    # tombstone [1..8]'s device state (internal: the state goes, the node stays),
    # demote the [20..27] leaf: both states host-only now, [1..8]'s first
    env.cache.evict(EvictParams(num_tokens=0, mamba_num=1))
    env.cache.evict(EvictParams(num_tokens=8, mamba_num=0))
    hs = env.host_states()
    assert len(hs) == 3
    m = env.match(range(1, 9))
    assert m.mamba_host_hit_length == 1
    lock = env.cache.inc_host_lock_ref(m.best_match_node)   # pins [1..8]'s host state
    assert env.cache.evict_host(1, MAMBA) == 1     # skips it: [20..27], a host leaf, whole
    assert env.cache.host_total_size() == 8 + 4     # [1..8] and its child
    assert env.match(range(20, 28)).host_hit_length == 0
    env.cache.dec_host_lock_ref(m.best_match_node, lock)
    assert env.cache.evict_host(1, MAMBA) == 1     # [1..8]'s now: internal, the state alone
    assert env.cache.host_total_size() == 12
    assert env.match(range(1, 9)).mamba_host_hit_length == 0
    env.partition()


def test_a_walked_backup_leaves_out_the_state_the_insert_commits():
    """SGLang runs a walked node's backup at its barrier, before the commit attaches
    the insert's state to that node: the backup holds the Full KV only, and the node
    is pending at the tail, so no incremental state backup follows."""
    env = Env(policy="write_through_selective")      # a backup at the second hit
    _, s1 = env.ins([1, 2, 3, 4])                    # hit 1: no backup
    st = env.ma.alloc(1)
    r = env.cache.insert(InsertParams(key=RadixKey([1, 2]), value=env.alloc.alloc(2),
                                      mamba_value=st, inserted_len=0))
    # [1, 2] is split off [1, 2, 3, 4] (the upper part: hit count 1 copied, no state);
    # the walk counts its second hit and backs it up, then the commit gives it the state
    assert not r.mamba_exist
    env.cache.flush_pending_backups()
    assert [k for k, _, _ in env.log] == ["backup"]
    env.cache.writing_check()
    assert env.cache.mamba_host_total_size() == 0
    # the next insert ending there backs the state up (SGLang's incremental backup)
    st2 = env.ma.alloc(1)
    r = env.cache.insert(InsertParams(key=RadixKey([1, 2]), value=env.alloc.alloc(2),
                                      mamba_value=st2, inserted_len=2))
    assert r.mamba_exist
    env.ma.free(st2)
    env.cache.flush_pending_backups()
    assert [k for k, _, _ in env.log] == ["backup", "backup_state"]
    assert env.log[-1][1] == [int(st[0])]
    env.cache.writing_check()
    assert env.cache.mamba_host_total_size() == 1
    env.partition()


def test_host_lock_receipts_on_a_mamba_cache():
    env = Env()
    backed(env, range(1, 9))
    m = env.match(range(1, 9))
    rec = env.cache.inc_host_lock_ref(m.last_device_node)
    env.cache.dec_host_lock_ref(m.last_device_node, rec)
    with pytest.raises(LockRefError, match="Mamba host lock"):
        env.cache.dec_host_lock_ref(m.last_device_node, rec)
    env.partition()


def test_bad_input_is_refused_before_any_change():
    alloc, pool, cache = bare(64)
    with pytest.raises(ValueError, match="mamba_host_size"):
        cache.init_hicache(host_size=8)
    assert not cache.enable_hicache
    cache.init_hicache(hicache_ratio=2.0)
    assert (cache.mem_pool_host.size, cache.mamba_pool_host.size) == (129, 9)  # 4 * 2 + 1
    with pytest.raises(ValueError, match="component_type"):
        cache.evict_host(1, ComponentType.SWA)
    plain = UnifiedRadixCache(token_to_kv_pool_allocator=TokenToKVPoolAllocator(8))
    with pytest.raises(ValueError, match="no Mamba"):
        plain.init_hicache(host_size=8, mamba_host_size=4)
    with pytest.raises(ValueError, match="component_type"):
        (plain.init_hicache(host_size=8), plain.evict_host(1, MAMBA))
    env = Env()
    backed(env, range(1, 9))
    env.cache.evict(EvictParams(num_tokens=8, mamba_num=1))
    m = env.match(range(1, 9))
    before = env.cache._snapshot()
    with pytest.raises(ValueError, match="req"):
        env.cache.load_back(m.best_match_node, None, req=SimpleNamespace(last_node=None))
    _same_state(before, env.cache._snapshot())


def test_write_back_backs_an_internal_state_up_before_its_tombstone():
    """SGLang's InternalStateBackup: under write-back the Mamba round offers an
    internal node's unbacked state (with its Full KV) to the host before it drops
    the device state; a leaf victim is backed up and demoted as in the Full round."""
    env = Env(policy="write_back")
    env.ins(range(1, 9))
    env.ins(list(range(1, 9)) + [20, 21])          # [1..8] internal, both with states
    assert env.cache.host_total_size() == 0         # write-back backs nothing up at insert
    r = env.cache.evict(EvictParams(num_tokens=0, mamba_num=1))
    # the LRU tail is [1..8]'s state (internal): backed up (8 tokens + the state),
    # then tombstoned; no Full token leaves the device
    assert (r.num_tokens_evicted, r.mamba_num_evicted) == (0, 1)
    assert env.cache.host_total_size() == 8 and env.cache.mamba_host_total_size() == 1
    assert [k for k, _, _ in env.log] == ["backup", "backup_state"]
    r = env.cache.evict(EvictParams(num_tokens=0, mamba_num=1))
    # next: the leaf [20, 21] -- backed up with its state and demoted
    assert (r.num_tokens_evicted, r.mamba_num_evicted) == (2, 1)
    assert env.cache.host_total_size() == 10 and env.cache.mamba_host_total_size() == 2
    m = env.match(range(1, 9))
    assert (m.device_prefix_len, m.host_hit_length, m.mamba_host_hit_length) == (0, 8, 1)
    env.partition()


def test_write_back_host_hit_counts_only_nodes_with_a_host_copy():
    """SGLang's host_hit_length sums the Full host values from the best node up to
    the device match: under write-back a device-only node may lie between them."""
    env = Env(policy="write_back")
    env.ins([1, 2, 3, 4])
    env.ins([1, 2, 3, 4, 5, 6])             # [1..4] internal, its state LRU-older
    env.ins([1, 2, 3, 4, 5, 6, 7, 8])       # [5, 6] internal too
    # tombstone [1..4]'s state (backed up with its KV first), then [5, 6]'s
    env.cache.evict(EvictParams(num_tokens=0, mamba_num=1))
    env.cache.evict(EvictParams(num_tokens=0, mamba_num=1))
    # host eviction reclaims the oldest settled duplicate's Full host copy: [1..4]'s
    # (its state stays on the host)
    assert env.cache.evict_host(1) == 4
    m = env.match([1, 2, 3, 4, 5, 6])
    # best: [5, 6] (host-only state); device match: the root (no device state on the
    # way); host hit: [5, 6]'s 2 units only, not the 6 between the two nodes
    assert (m.device_prefix_len, m.host_hit_length, m.mamba_host_hit_length) == (0, 2, 1)
    env.partition()


@pytest.mark.parametrize("policy", ["write_through", "write_through_selective", "write_back"])
def test_random_runs_keep_all_four_pools_partitioned(policy):
    rng = np.random.default_rng(11)
    env = Env(states=6, pool=48, host=40, host_states=5, policy=policy)
    c = env.cache
    bases = [list(rng.integers(1, 6, size=12)) for _ in range(3)]
    locks, hlocks = [], []
    for _ in range(700):
        op = int(rng.integers(0, 9))
        toks = list(bases[int(rng.integers(0, 3))][:int(rng.integers(1, 13))])
        if op <= 1:
            if env.alloc.available_size() < len(toks):
                c.evict(EvictParams(num_tokens=len(toks)))
            if env.ma.available_size() == 0:
                c.evict(EvictParams(num_tokens=0, mamba_num=1))
            if env.alloc.available_size() >= len(toks) and env.ma.available_size():
                env.ins(toks)
        elif op == 2:
            m = env.match(toks)
            if (m.host_hit_length or m.mamba_host_hit_length) and not (
                    env.ma.available_size() == 0 and c.mamba_evictable_size() == 0):
                req = env.req(m)
                c.init_load_back(InitLoadBackParams(m.best_match_node, m.host_hit_length,
                                                    None, req))
                if req.kv.mamba_pool_idx is not None:   # the request ends: its slot goes
                    env.ma.free(np.asarray([int(req.kv.mamba_pool_idx)]))
            elif rng.random() < 0.5 and len(locks) < 3:
                locks.append((m.last_device_node, c.inc_lock_ref(m.last_device_node)))
        elif op == 3 and locks:
            nid, rec = locks.pop(int(rng.integers(0, len(locks))))
            c.dec_lock_ref(nid, rec.to_dec_params())
        elif op == 4:
            c.evict(EvictParams(num_tokens=int(rng.integers(0, 10)),
                                mamba_num=int(rng.integers(0, 3))))
        elif op == 5:
            c.evict_host(int(rng.integers(1, 3)), MAMBA if rng.random() < 0.5 else FULL)
        elif op == 6:
            m = env.match(toks)
            if m.best_match_node != c.root_node_handle() and len(hlocks) < 2:
                rec = c.inc_host_lock_ref(m.best_match_node)
                if rec.component_host_lock_uuids:
                    hlocks.append((m.best_match_node, rec))
                else:
                    c.dec_host_lock_ref(m.best_match_node, rec)
        elif op == 7 and hlocks:
            nid, rec = hlocks.pop()
            c.dec_host_lock_ref(nid, rec)
        else:
            ack_mix(c, rng)
        env.partition()
    drain(c, locks, hlocks)
    assert c.protected_size() == 0 and c.mamba_protected_size() == 0
    c.evict(EvictParams(num_tokens=10**6, mamba_num=10**6))
    c.evict_host(10**6)
    assert c.mamba_host_total_size() == 0 and c.host_total_size() == 0
    assert c.mamba_pool_host.available_size() == c.mamba_pool_host.size
    assert env.ma.available_size() == env.ma.size
    env.partition()


def test_state_bytes_survive_backup_demote_and_load_back_with_kvtransfer():
    from flatradix import KVTransfer

    alloc, pool, cache = bare(mamba_cache_chunk_size=4)
    ma = pool.mamba_allocator
    kv = [np.zeros((33, 2), dtype=np.float32)]
    conv, temporal = np.zeros((5, 3), dtype=np.float32), np.zeros((5, 2, 2), dtype=np.float16)
    with pytest.raises(ValueError, match="state_buffers"):   # a Mamba cache needs them
        cache.init_hicache(host_size=16, mamba_host_size=3,
                           transfer=KVTransfer.with_host_buffers(kv, 16))
    assert not cache.enable_hicache
    t = KVTransfer.with_host_buffers(kv, 16, device_state_buffers=[conv, temporal],
                                     host_state_size=3)
    cache.init_hicache(host_size=16, mamba_host_size=3, load_back_threshold=1, transfer=t)
    v, st = alloc.alloc(4), ma.alloc(1)
    s = int(st[0])
    conv[s], temporal[s] = 7.5, 2.0                 # the state the model wrote
    cache.insert(InsertParams(key=RadixKey([1, 2, 3, 4]), value=v, mamba_value=st))
    cache.check_hicache_events()                    # backed up (first hit), acked
    assert t.backed_up_states == 1
    cache.evict(EvictParams(num_tokens=4, mamba_num=1))
    conv[s], temporal[s] = -1.0, -1.0               # the freed slot is reused: garbage
    m = cache.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3, 4])))
    req = SimpleNamespace(last_node=m.last_device_node, mamba_host_hit_length=1,
                          kv=SimpleNamespace(mamba_pool_idx=None))
    cache.init_load_back(InitLoadBackParams(m.best_match_node, m.host_hit_length, None, req))
    node_slot = cache.all_mamba_values_flatten().tolist()[0]
    for slot in (node_slot, int(req.kv.mamba_pool_idx)):
        assert (conv[slot] == 7.5).all() and (temporal[slot] == 2.0).all()
    assert (t.loaded_states, t.backed_up_states) == (2, 1)


def test_the_per_path_cap_runs_after_the_walks_backups():
    """SGLang defers MambaEvictExcessPathStates behind the insert's walk backups:
    a walked node's backup copies its state before the cap drops it from the device."""
    alloc, pool, cache = bare(mamba_max_states_per_path=1)
    ma = pool.mamba_allocator
    cache.init_hicache(host_size=16, mamba_host_size=4,
                       hicache_write_policy="write_through_selective")
    a = alloc.alloc(2)
    cache.insert(InsertParams(key=RadixKey([1, 2]), value=a,
                              mamba_value=ma.alloc(1)))            # A: hit 1, a state
    v = np.concatenate([np.asarray(a), np.asarray(alloc.alloc(2))])  # A's own slots + 2
    cache.insert(InsertParams(key=RadixKey([1, 2, 3, 4]), value=v,
                              mamba_value=ma.alloc(1), prev_prefix_len=2))
    # the walk counted A's second hit: its backup ran first, with the state, and locks
    # A until its ack; then the new leaf took its state and the cap (1 a path) skipped
    # A (locked: the cap is soft). Had the cap run first, A's state would be gone and
    # its backup without one.
    cache.check_hicache_events()
    assert cache.mamba_host_total_size() == 1
    assert len(cache.all_mamba_values_flatten()) == 2 and ma.available_size() == 2
    cache.sanity_check()
    # the next insert below the leaf: now the cap drops A's state (unlocked, one child);
    # its host copy stays, in the host LRU
    v = np.concatenate([np.asarray(cache.match_prefix(MatchPrefixParams(
        key=RadixKey([1, 2, 3, 4]))).device_indices), np.asarray(alloc.alloc(2))])
    cache.insert(InsertParams(key=RadixKey([1, 2, 3, 4, 5, 6]), value=v,
                              mamba_value=ma.alloc(1), prev_prefix_len=4))
    cache.check_hicache_events()
    m = cache.match_prefix(MatchPrefixParams(key=RadixKey([1, 2])))
    assert (m.device_prefix_len, m.mamba_host_hit_length) == (0, 1)
    cache.sanity_check()


# ---------------------------------------------------------------------- fresh-user findings
def test_a_load_whose_state_eviction_raises_gives_its_full_slots_back():
    """(helper-25) The state pool full: restoring the state evicts one, and that
    eviction raises (here: a step-wise round is open); the load's Full device slots,
    taken before, go back with its pins."""
    env = Env(policy="write_back", states=3, pool=24)
    c = env.cache
    env.ins(range(1, 9))
    c.evict(EvictParams(num_tokens=8, mamba_num=1))       # backed up, demoted
    env.ins(range(20, 24))
    while env.ma.available_size():
        env.caller.append(int(env.ma.alloc(1)[0]))
    m = env.match(range(1, 9))
    c.evict_device_start(FULL, 1)
    with pytest.raises(RuntimeError, match="already in progress"):
        c.init_load_back(InitLoadBackParams(m.best_match_node, m.host_hit_length, None,
                                            env.req(m, env.caller[0])))
    c.evict_device_end(FULL)
    assert c.protected_size() == 0 and c.mamba_protected_size() == 0
    env.partition()


def test_load_back_request_fields_are_checked_before_any_change():
    env = Env()
    backed(env, range(1, 9))
    env.cache.evict(EvictParams(num_tokens=8, mamba_num=1))
    env.ins(range(30, 34))
    m = env.match(range(1, 9))
    tree_slot = env.cache.all_mamba_values_flatten().tolist()[0]
    before = env.cache._snapshot()
    for idx, err, what in ((tree_slot, ValueError, "already cached by the tree"),
                           ("x", TypeError, "mamba_pool_idx"), (999, ValueError, "outside"),
                           (np.array([2, 3]), ValueError, "mamba_pool_idx")):
        with pytest.raises(err, match=what):
            env.cache.init_load_back(InitLoadBackParams(m.best_match_node, m.host_hit_length,
                                                        None, env.req(m, idx)))
    bad = env.req(m)
    bad.last_node = "bad"
    with pytest.raises(TypeError, match="last_node"):
        env.cache.init_load_back(InitLoadBackParams(m.best_match_node, m.host_hit_length,
                                                    None, bad))
    _same_state(before, env.cache._snapshot())
    # without a request the count is the Full tokens loaded, as on a Full-only cache
    assert env.cache.init_load_back(InitLoadBackParams(m.best_match_node, m.host_hit_length)) \
        == (8, m.best_match_node)
    env.cache.check_hicache_events()
    env.partition()


def test_a_failed_backup_copy_in_an_insert_carries_the_insert_result():
    boom = [False]

    def transfer(kind, dev, host):
        if boom[0] and kind == "backup":
            raise OSError("DMA error")

    alloc, pool, cache = bare()
    cache.init_hicache(host_size=16, mamba_host_size=4, transfer=transfer,
                       hicache_write_policy="write_through_selective")
    cache.insert(InsertParams(key=RadixKey([1, 2, 3, 4]), value=alloc.alloc(4),
                              mamba_value=pool.mamba_allocator.alloc(1)))   # hit 1
    boom[0] = True
    st = pool.mamba_allocator.alloc(1)
    with pytest.raises(OSError) as e:   # hit 2: the backup's copy fails
        cache.insert(InsertParams(key=RadixKey([1, 2, 3, 4]), value=alloc.alloc(4),
                                  mamba_value=st))
    assert e.value.insert_result.mamba_exist      # the node had a state: st is ours
    pool.mamba_allocator.free(st)
    assert pool.mamba_allocator.available_size() == 3
    cache.sanity_check()


def test_a_zero_mamba_host_pool_is_refused():
    alloc, pool, cache = bare()
    with pytest.raises(ValueError, match="mamba_host_size must be >= 1"):
        cache.init_hicache(host_size=16, mamba_host_size=0)
    assert not cache.enable_hicache


# ---------------------------------------------------------------------- hypothesis machine
from hypothesis import settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import precondition, rule  # noqa: E402

from .test_hicache import AuxHostTierRules  # noqa: E402


class MambaHostTierMachine(AuxHostTierRules):
    """The Mamba host tier under a random schedule (every write policy): inserts with
    states, matches with locks, host locks and load-backs (the request holding no
    slot, or its own), whole and step-wise evictions of both components, host
    eviction of both, and the ack calls at arbitrary points (acks late and
    interleaved). Invariant after every step: all four pools partition exactly
    (``Env.partition``: KV and state slots on both tiers) and ``sanity_check()``."""

    @rule(policy=st.sampled_from(["write_through", "write_through_selective", "write_back"]),
          host=st.sampled_from([6, 12, 40]), host_states=st.sampled_from([1, 2, 6]),
          page=st.sampled_from([1, 2]))
    @precondition(lambda self: self.env is None)
    def build(self, policy, host, host_states, page):
        self.env = Env(states=5, pool=24, host=host * page, host_states=host_states,
                       policy=policy, page=page)
        self.locks, self.hlocks = [], []


    @rule(b=st.integers(0, 3), cut=st.integers(1, 8))
    @precondition(lambda self: self.env is not None)
    def insert(self, b, cut):
        env, c = self.env, self.env.cache
        toks = self._toks(b, cut)
        if not toks:
            return
        if env.ma.available_size() == 0:
            c.evict(EvictParams(num_tokens=0, mamba_num=1))
        if env.alloc.available_size() < len(toks):
            c.evict(EvictParams(num_tokens=len(toks)))
        if env.ma.available_size() and env.alloc.available_size() >= len(toks):
            env.ins(toks)

    @rule(b=st.integers(0, 3), cut=st.integers(1, 8), what=st.sampled_from(
        ["lock", "hlock", "load", "load_own"]))
    @precondition(lambda self: self.env is not None)
    def match(self, b, cut, what):
        env, c = self.env, self.env.cache
        toks = self._toks(b, cut)
        if not toks:
            return
        own = None
        if what == "load_own" and env.ma.available_size():
            own = int(env.ma.alloc(1)[0])     # the request holds a slot (before the match)
        m = env.match(toks)
        if what == "lock" and len(self.locks) < 3:
            self.locks.append((m.last_device_node, c.inc_lock_ref(m.last_device_node)))
        elif what == "hlock" and len(self.hlocks) < 2:
            rec = c.inc_host_lock_ref(m.best_match_node)
            if rec.component_host_lock_uuids:
                self.hlocks.append((m.best_match_node, rec))
            else:  # nothing pinned on the Full side: the node may go, release now
                c.dec_host_lock_ref(m.best_match_node, rec)
        elif what.startswith("load") and (m.host_hit_length or m.mamba_host_hit_length):
            req = env.req(m, own)
            if own is not None or env.ma.available_size() or c.mamba_evictable_size():
                c.init_load_back(InitLoadBackParams(m.best_match_node, m.host_hit_length,
                                                    None, req))
            if req.kv.mamba_pool_idx is not None:  # the request ends: its slot goes
                env.ma.free(np.asarray([int(req.kv.mamba_pool_idx)]))
                own = None
        if own is not None:
            env.ma.free(np.asarray([own]))


    @rule(n=st.integers(0, 12), states=st.integers(0, 3), stepwise=st.booleans())
    @precondition(lambda self: self.env is not None)
    def evict(self, n, states, stepwise):
        env, c = self.env, self.env.cache
        if not stepwise:
            c.evict(EvictParams(num_tokens=n, mamba_num=states))
            return
        c.evict_device_start(MAMBA, states)  # the controller frees what each step names
        try:
            while True:
                step = c.evict_device_next_node(MAMBA)
                if len(step.freed_indices):
                    env.alloc.free(step.freed_indices)
                if step.mamba_freed_indices is not None and len(step.mamba_freed_indices):
                    env.ma.free(step.mamba_freed_indices)
                if not step.made_progress:
                    break
        finally:
            c.evict_device_end(MAMBA)

    @rule(n=st.integers(1, 8), states=st.booleans())
    @precondition(lambda self: self.env is not None)
    def evict_host(self, n, states):
        self.env.cache.evict_host(n, MAMBA if states else FULL)

    def _staging(self, n, pages):
        """A refill's staged state (one in four refills has none; None: pool short)."""
        h = self.env.cache.mamba_pool_host.alloc(1) if pages > 1 else None
        return dict(mamba_host_value=None if h is None else int(h[0]))


MambaHostTierMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40,
                                                  deadline=None)
TestMambaHostTierMachine = MambaHostTierMachine.TestCase


# ---------------------------------------------------------------------- storage prefetch
def test_a_storage_refill_gives_its_staged_state_to_the_refilled_node():
    # a refill of [1..8] from the root with a staged host state: the new host leaf takes
    # it (a Mamba host hit at its end); a second refill ending on the same node finds a
    # host state there: its staged state is freed (mamba_exist)
    env = Env(states=4, pool=32, host=32, host_states=4)
    c = env.cache
    h, s = c.mem_pool_host.alloc(8), int(c.mamba_pool_host.alloc(1)[0])
    r = c.insert_host(c.root_node_handle(), RadixKey(list(range(1, 9))), h,
                      mamba_host_value=s)
    assert (r.prefix_len, r.host_insert_dropped, r.mamba_exist) == (0, False, False)
    assert env.host_states() == [s] and c.mamba_host_total_size() == 1
    env.partition()
    m = env.match(range(1, 9))
    assert (m.device_prefix_len, m.host_hit_length, m.mamba_host_hit_length) == (0, 8, 1)
    assert m.best_match_node == r.inserted_host_node
    h2, s2 = c.mem_pool_host.alloc(8), c.mamba_pool_host.alloc(1)
    r = c.insert_host(c.root_node_handle(), RadixKey(list(range(1, 9))), h2,
                      mamba_host_value=s2)       # a 1-element tensor-like slot is accepted
    assert (r.prefix_len, r.mamba_exist) == (8, True)
    c.mem_pool_host.free(h2)
    assert env.host_states() == [s] and c.mamba_pool_host.available_size() == 3
    env.partition()


def test_a_refill_with_a_bad_staged_state_is_refused_before_any_change():
    env = Env(states=4, pool=32, host=32, host_states=4)
    c = env.cache
    h, root = c.mem_pool_host.alloc(4), c.root_node_handle()
    before = c._snapshot()
    for bad, err in ((3, ValueError),                 # not handed out
                     (np.array([0, 1]), ValueError),  # two slots
                     (99, ValueError),                # outside the pool
                     (2 ** 70, ValueError),           # beyond int64 (was OverflowError)
                     (-2 ** 70, ValueError),
                     (True, TypeError)):
        with pytest.raises(err, match="mamba_host_value"):
            c.insert_host(root, RadixKey([1, 2, 3, 4]), h, mamba_host_value=bad)
        _same_state(before, c._snapshot())
    with pytest.raises(ValueError, match="swa_host_value"):   # no SWA host pool
        c.insert_host(root, RadixKey([1, 2, 3, 4]), h, swa_host_value=np.array([0]))
    _same_state(before, c._snapshot())
    assert c.mamba_pool_host.available_size() == 4


class _CowKv:
    """SGLang's ``Req.kv`` fields a ``cow_mamba`` match reads and writes."""

    def __init__(self, idx=None):
        self.mamba_pool_idx = idx
        self.mamba_cow_src_index = None
        self.mamba_needs_clear = True


def test_copy_on_write_past_the_device_match_copies_nothing():
    """Issue 33: the match continues past the last device node onto a host-only node.
    SGLang copies only the best match node's *device* state; that node's state is on
    the host only, so nothing happens: no source named, no slot taken (the old code
    copied the last device node's state into a fresh slot)."""
    env = Env(states=4)
    _, s_deep = env.ins(range(1, 9))
    _, s_top = env.ins(range(1, 5))       # split: [1..4] (takes this state) + [5..8]
    env.cache.check_hicache_events()      # both backed up (write-through) and acked
    env.cache.flush_pending_backups()
    env.cache.writing_check()
    # demote the leaf [5..8] (Full KV and state to the host only)
    r = env.cache.evict(EvictParams(num_tokens=4))
    assert (r.num_tokens_evicted, r.mamba_num_evicted) == (4, 1)
    assert env.cache.all_mamba_values_flatten().tolist() == [s_top]
    free_before = env.ma.available_size()
    req = SimpleNamespace(kv=_CowKv())
    m = env.cache.match_prefix(MatchPrefixParams(key=RadixKey(list(range(1, 9))),
                                                 cow_mamba=True, req=req))
    # the device match ends at [1..4] (its state on the device); the best node is [5..8]
    assert (m.device_prefix_len, m.host_hit_length, m.mamba_host_hit_length) == (4, 4, 1)
    assert m.best_match_node != m.last_device_node
    assert req.kv.mamba_pool_idx is None and req.kv.mamba_cow_src_index is None
    assert req.kv.mamba_needs_clear is True
    assert env.ma.available_size() == free_before
    # a match ending on [1..4] itself still copies its device state
    req2 = SimpleNamespace(kv=_CowKv())
    m2 = env.cache.match_prefix(MatchPrefixParams(key=RadixKey(list(range(1, 5))),
                                                  cow_mamba=True, req=req2))
    assert m2.best_match_node == m2.last_device_node
    assert int(req2.kv.mamba_cow_src_index[0]) == s_top
    assert req2.kv.mamba_pool_idx is not None and req2.kv.mamba_needs_clear is False
    env.caller.append(int(req2.kv.mamba_pool_idx))
    env.partition()
