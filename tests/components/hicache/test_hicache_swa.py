"""SWA on the host tier (HiCache, SGLang 0.5.23 spec §6.2 / §8): hand-worked scenarios,
the reported bug "SWA with write-through frees a live slot through a tombstone's stale
mapping", the slot partition on all four pools (Full and SWA, device and host) over
random runs and a hypothesis machine, bad input.

Every expected value is worked out by hand from the spec (and checked against SGLang's
own cache by ``tests/oracle/hicache_driver.py``'s ``*-swa*`` configurations): a backup
copies a node's Full KV and the SWA data within one window of it that has no host copy;
demoting a backed-up leaf frees its Full and SWA device data and keeps both host
copies; an SWA tombstone of a backed-up node keeps its SWA host copy (SWA host LRU); a
match through host-only SWA data reports ``swa_host_hit_length`` (the host-only SWA
units within one window of the best node); a load-back restores the Full host hit and
the window's host-only SWA data (into fresh SWA slots, mapped to the Full slots);
``evict_host(n, SWA)`` frees SWA host values from the least recently used end, a host
leaf whole.
"""

from types import SimpleNamespace

import numpy as np
import pytest

from flatradix import (
    ComponentType, EvictParams, InitLoadBackParams, InsertParams, LockRefError,
    MatchPrefixParams, RadixKey, SWATokenToKVPoolAllocator, UnifiedRadixCache,
)
from flatradix.inspection import all_swa_full_values_flatten, all_swa_host_values_flatten

from .test_hicache import _same_state, ack_mix, drain

FULL, SWA = ComponentType.FULL, ComponentType.SWA


class Env:
    """A FULL+SWA cache with flatradix's SWA allocator and a host tier; every transfer
    the tree asks for is logged as ``(kind, device slots, host slots)``."""

    def __init__(self, window=4, pool=64, swa_pool=None, host=64, swa_host=None,
                 policy="write_through", page=1, threshold=1):
        self.alloc = SWATokenToKVPoolAllocator(pool, swa_pool or pool, page_size=page)
        self.cache = UnifiedRadixCache(
            page_size=page, tree_components=(FULL, SWA), sliding_window_size=window,
            token_to_kv_pool_allocator=self.alloc)
        self.log = []
        self.cache.init_hicache(host_size=host, swa_host_size=swa_host or host,
                                hicache_write_policy=policy, load_back_threshold=threshold,
                                transfer=lambda k, d, h: self.log.append(
                                    (k, np.asarray(d).tolist(), np.asarray(h).tolist())))

    def ins(self, toks, **kw):
        kv = self.alloc.alloc(len(toks))
        return self.cache.insert(InsertParams(key=RadixKey(list(toks)), value=kv, **kw))

    def match(self, toks):
        return self.cache.match_prefix(MatchPrefixParams(key=RadixKey(list(toks))))

    @staticmethod
    def req(m):
        return SimpleNamespace(last_node=m.last_device_node,
                               swa_host_hit_length=m.swa_host_hit_length)

    def load(self, m):
        return self.cache.init_load_back(InitLoadBackParams(m.best_match_node, m.host_hit_length,
                                                            None, self.req(m)))

    def units(self, kind):
        return sum(len(d) for k, d, _ in self.log if k == kind)

    def partition(self):
        """Each of the four pools: free + tree == every slot, no slot twice; the SWA
        slots the tree holds are the peers of its SWA nodes' Full slots."""
        c, a = self.cache, self.alloc
        c.sanity_check()
        tree = np.asarray(c.all_values_flatten()).tolist()
        assert len(set(tree)) == len(tree)
        assert a.full_available_size() + len(tree) == a.size_full
        swa_full = all_swa_full_values_flatten(c._engine)
        swa = np.asarray(a.translate_swa_indices_for_transfer(swa_full)).tolist()
        assert 0 not in swa and len(set(swa)) == len(swa)
        held = int(np.count_nonzero(a.full_to_swa_index_mapping[1:]))
        assert held == len(swa)   # no stale mapping: only the tree's SWA nodes map
        assert a.swa_available_size() + len(swa) == a.size_swa
        assert c.swa_evictable_size() + c.swa_protected_size() == len(swa)
        htree = c.all_host_values_flatten().tolist()
        assert len(set(htree)) == len(htree)
        assert c.mem_pool_host.available_size() + len(htree) == c.mem_pool_host.size
        hs = all_swa_host_values_flatten(c._engine).tolist()
        assert len(set(hs)) == len(hs) == c.swa_host_total_size()
        assert c.swa_pool_host.available_size() + len(hs) == c.swa_pool_host.size


def backed(env, *keys):
    """Insert each key (backed up at its first hit under write_through) and ack."""
    for k in keys:
        env.ins(k)
    env.cache.check_hicache_events()


A = list(range(1, 17))
B = list(range(1, 9)) + list(range(50, 58))


def test_window_backup_demote_match_and_load_back():
    # W 4, page 1: A becomes [1..12] + [13..16] (a fresh leaf keeps one window of 4);
    # B splits [1..12] at 8 and adds [50..53] + [54..57]: 5 nodes, 24 units, all with SWA
    env = Env(window=4, pool=32, host=32)
    c = env.cache
    assert env.ins(A).prefix_len == 0 and env.ins(B).prefix_len == 8
    c.check_hicache_events()
    assert (env.units("backup"), env.units("backup_swa")) == (24, 24)
    assert c.swa_host_total_size() == 24 and c.host_total_size() == 24
    r = c.evict(EvictParams(num_tokens=32))          # every leaf demoted, both components
    assert (r.num_tokens_evicted, r.swa_num_tokens_evicted) == (24, 24)
    env.partition()
    m = env.match(A)
    # all host-only; the best node [13..16] holds one window of host-only SWA
    assert (m.device_prefix_len, m.host_hit_length, m.swa_host_hit_length,
            m.swa_branching_seqlen) == (0, 16, 4, None)
    env.log.clear()
    n, node = env.load(m)
    assert (n, node) == (16, m.best_match_node)
    # Full: the 16 host-only units; SWA: only the last window (the best node's 4)
    assert (env.units("load"), env.units("load_swa")) == (16, 4)
    c.ready_to_load_host_cache()
    c.loading_check()
    env.partition()
    m = env.match(A)
    assert (m.device_prefix_len, m.host_hit_length, m.swa_host_hit_length) == (16, 0, 0)
    c.evict(EvictParams(num_tokens=64))
    assert c.evict_host(1, SWA) == 4      # one node's SWA host value (least recent first)
    assert c.evict_host(64) == 24         # every host leaf, its SWA host value with it
    assert c.swa_host_total_size() == 0 and c.host_total_size() == 0
    env.partition()
    assert env.alloc.full_available_size() == 32 and env.alloc.swa_available_size() == 32


def _tombstoned_internal():
    """W 8, page 1: [1..8] (one node: a fresh leaf keeps 8) then [9..12] below it, both
    backed up. The insert-end refresh puts [9..12] and then [1..8] at the SWA LRU's MRU
    end, so the LRU tail is [1..8]: an SWA eviction tombstones it (an internal node)
    and its host copy stays, host-only."""
    env = Env(window=8, pool=32, host=32)
    backed(env, range(1, 9), range(1, 13))
    r = env.cache.evict(EvictParams(num_tokens=0, swa_num_tokens=4))
    assert (r.num_tokens_evicted, r.swa_num_tokens_evicted) == (0, 8)
    env.partition()
    return env


def test_an_swa_only_load_back_restores_the_window_of_a_device_node():
    env = _tombstoned_internal()
    c = env.cache
    m = env.match(range(1, 13))
    # device: the hole at [1..8] rejects both nodes ([9..12] is 4 < 8 units past it);
    # host: [1..8]'s host copy counts, so the best node is [9..12]; both nodes hold a
    # Full host copy (12 units), the window's host-only SWA data is [1..8]'s 8 units
    assert (m.device_prefix_len, m.host_hit_length, m.swa_host_hit_length) == (0, 12, 8)
    env.log.clear()
    n, node = env.load(m)
    # nothing of Full moves; the count is the Full device units from the best node up to
    # the request's device node (the root)
    assert (n, node) == (12, m.best_match_node)
    assert (env.units("load"), env.units("load_swa")) == (0, 8)
    c.ready_to_load_host_cache()
    c.loading_check()
    env.partition()
    m = env.match(range(1, 13))
    assert (m.device_prefix_len, m.host_hit_length, m.swa_host_hit_length) == (12, 0, 0)


def test_evict_host_swa_takes_an_internal_nodes_swa_host_value_only():
    env = _tombstoned_internal()
    c = env.cache
    assert c.evict_host(1, SWA) == 8           # [1..8]: not a host leaf, SWA host only
    assert (c.host_total_size(), c.swa_host_total_size()) == (12, 4)
    env.partition()
    m = env.match(range(1, 13))
    # no SWA data on [1..8] on either tier: a hole for both validators; the Full hit
    # (12, on the device) is past both boundaries: the branching point
    assert (m.device_prefix_len, m.host_hit_length, m.swa_host_hit_length,
            m.swa_branching_seqlen) == (0, 0, 0, 12)


def test_a_host_lock_pins_the_swa_host_window():
    env = _tombstoned_internal()
    c = env.cache
    m = env.match(range(1, 13))
    rec = c.inc_host_lock_ref(m.best_match_node)   # the window: [9..12], then [1..8]
    assert rec.component_host_lock_uuids.get(SWA)   # the boundary, [1..8], stamped
    assert c.evict_host(8, SWA) == 0               # [1..8] left the SWA host LRU
    before = c._snapshot()
    with pytest.raises(LockRefError):
        c.dec_host_lock_ref(m.best_match_node, SimpleNamespace(
            component_host_lock_uuids={FULL: rec.component_host_lock_uuids.get(FULL),
                                       SWA: 12345}))   # a boundary not on the path
    _same_state(before, c._snapshot())
    c.dec_host_lock_ref(m.best_match_node, rec)
    assert c.evict_host(8, SWA) == 8
    env.partition()


def test_b_swa_write_through_frees_no_live_slot_through_a_tombstones_mapping():
    # The reported bug (SGLang #27586): recovering an SWA tombstone from an overlapping
    # insert freed the node's old Full slots through their stale Full->SWA mapping,
    # returning an SWA slot the incoming request had just been given. Here the
    # tombstone's SWA slots go back at its eviction (their mapping cleared); the
    # re-insert's fresh slots reuse exactly those SWA slots; the recovery frees the
    # old Full slots Full-only, so every SWA slot stays owned exactly once.
    env = _tombstoned_internal()
    c = env.cache
    freed_swa = set(range(1, 9))                   # [1..8]'s SWA slots (first handed out)
    kv = env.alloc.alloc(12)
    assert set(env.alloc.translate_swa_indices_for_transfer(kv[:8]).tolist()) <= (
        freed_swa | set(range(13, 33)))
    r = c.insert(InsertParams(key=RadixKey(list(range(1, 13))), value=kv, prev_prefix_len=0))
    assert r.prefix_len == 12
    env.partition()                                # each SWA slot held once, none stale
    m = env.match(range(1, 13))
    assert m.device_prefix_len == 12               # the window is whole again
    c.evict(EvictParams(num_tokens=10**6, swa_num_tokens=10**6))
    c.evict_host(10**6)
    env.partition()
    assert env.alloc.full_available_size() == 32 and env.alloc.swa_available_size() == 32


def test_an_incremental_backup_covers_recovered_swa_data():
    # W 8: after the tombstone of [1..8] its SWA host copy is freed; an insert that
    # ends on [9..12] (backed up, not pending) recovers [1..8]'s SWA from its fresh
    # slots: SGLang's incremental backup then copies the window's SWA data alone
    env = _tombstoned_internal()
    c = env.cache
    c.evict_host(1, SWA)
    env.log.clear()
    r = env.ins(range(1, 13))
    assert r.prefix_len == 12
    c.check_hicache_events()
    assert (env.units("backup"), env.units("backup_swa")) == (0, 8)
    assert c.swa_host_total_size() == 12
    env.partition()


def test_write_back_backs_an_internal_swa_victim_up_before_its_tombstone():
    # W 8, write-back (no insert-time backups): [1..8] then [1..12]; the SWA walk's
    # tail is the internal [1..8]: its SWA data and Full KV have no host copy, so it
    # is backed up (Full 8, SWA 8) before the tombstone (SGLang's InternalStateBackup)
    env = Env(window=8, pool=32, host=32, policy="write_back")
    c = env.cache
    env.ins(range(1, 9))
    env.ins(range(1, 13))
    assert env.log == []
    r = c.evict(EvictParams(num_tokens=0, swa_num_tokens=4))
    assert (r.num_tokens_evicted, r.swa_num_tokens_evicted) == (0, 8)
    assert (env.units("backup"), env.units("backup_swa")) == (8, 8)
    env.partition()
    m = env.match(range(1, 13))
    # the host hit counts the nodes with a Full host copy ([1..8]); the branching
    # point is the Full hit (12, past 0 + 8)
    assert (m.device_prefix_len, m.host_hit_length, m.swa_host_hit_length,
            m.swa_branching_seqlen) == (0, 8, 8, 12)
    env.log.clear()
    # the Full walk's leaf [9..12] is backed up with the SWA data of its window
    # that has no host copy (its own 4), then demoted
    r = c.evict(EvictParams(num_tokens=4))
    assert (r.num_tokens_evicted, r.swa_num_tokens_evicted) == (4, 4)
    assert (env.units("backup"), env.units("backup_swa")) == (4, 4)
    m = env.match(range(1, 13))
    assert (m.device_prefix_len, m.host_hit_length, m.swa_host_hit_length) == (0, 12, 12)
    env.partition()


def test_bad_input_is_refused_before_any_change():
    full_only = UnifiedRadixCache(token_to_kv_pool_allocator=SWATokenToKVPoolAllocator(8, 8))
    with pytest.raises(ValueError, match="swa_host_size given"):
        full_only.init_hicache(host_size=8, swa_host_size=8)
    assert full_only.enable_hicache is False
    alloc = SWATokenToKVPoolAllocator(16, 16)
    c = UnifiedRadixCache(tree_components=(FULL, SWA), sliding_window_size=4,
                          token_to_kv_pool_allocator=alloc)
    with pytest.raises(ValueError, match="swa_host_size must be >= 1"):
        c.init_hicache(host_size=16, swa_host_size=0)
    with pytest.raises(ValueError, match="swa_host_size"):
        c.init_hicache(host_size=16)
    assert c.enable_hicache is False
    c.init_hicache(hicache_ratio=1.0)          # both pools from the ratio: (16 // 1 + 1) * 1
    assert c.mem_pool_host.size == 17 and c.swa_pool_host.size == 17
    env = Env(window=4, pool=16, host=16)
    env.ins(range(1, 9))
    before = env.cache._snapshot()
    with pytest.raises(ValueError, match="component_type"):
        env.cache.evict_host(4, ComponentType.MAMBA)
    with pytest.raises(TypeError):
        env.cache.dec_host_lock_ref(env.cache.root_node_handle(), SimpleNamespace(
            component_host_lock_uuids={SWA: "x"}))
    _same_state(before, env.cache._snapshot())


def test_a_failed_swa_backup_copy_commits_nothing():
    env = Env(window=4, pool=16, host=16)
    c = env.cache
    calls = []

    def transfer(kind, dev, host):
        calls.append(kind)
        if kind == "backup_swa":
            raise OSError("copy failed")
    c._hicache._transfer = transfer
    with pytest.raises(OSError):
        env.ins(range(1, 9))
    assert calls == ["backup", "backup_swa"]
    assert c.host_total_size() == 0 and c.swa_host_total_size() == 0
    assert c.mem_pool_host.available_size() == 16 and c.swa_pool_host.available_size() == 16
    env.partition()


@pytest.mark.parametrize("policy,page", [("write_through", 1), ("write_through_selective", 2),
                                         ("write_back", 1), ("write_back", 2)])
def test_random_runs_keep_all_four_pools_partitioned(policy, page):
    rng = np.random.default_rng(5)
    env = Env(window=4 * page, pool=40 * page, swa_pool=24 * page, host=32 * page,
              swa_host=20 * page, policy=policy, page=page)
    c = env.cache
    bases = [list(rng.integers(1, 5, size=12 * page)) for _ in range(3)]
    locks, hlocks = [], []
    for _ in range(600):
        op = int(rng.integers(0, 10))
        toks = bases[int(rng.integers(0, 3))][:int(rng.integers(1, 13)) * page]
        if op <= 1:
            n = len(toks)
            if env.alloc.full_available_size() < n or env.alloc.swa_available_size() < n:
                c.evict(EvictParams(num_tokens=n, swa_num_tokens=n))
            if env.alloc.available_size() >= n:
                env.ins(toks)
        elif op == 2:
            m = env.match(toks)
            if m.host_hit_length or m.swa_host_hit_length:
                env.load(m)
            elif rng.random() < 0.5 and len(locks) < 3:
                locks.append((m.last_device_node, c.inc_lock_ref(m.last_device_node)))
        elif op == 3 and locks:
            nid, rec = locks.pop(int(rng.integers(0, len(locks))))
            c.dec_lock_ref(nid, rec.to_dec_params())
        elif op == 4:
            c.evict(EvictParams(num_tokens=int(rng.integers(0, 10)) * page,
                                swa_num_tokens=int(rng.integers(0, 10)) * page))
        elif op == 5:
            c.evict_host(int(rng.integers(1, 4)) * page, SWA if rng.random() < 0.5 else FULL)
        elif op == 6:
            m = env.match(toks)
            if m.best_match_node != c.root_node_handle() and len(hlocks) < 2:
                rec = c.inc_host_lock_ref(m.best_match_node)
                if FULL in rec.component_host_lock_uuids:
                    hlocks.append((m.best_match_node, rec))
                else:  # a device-only node: device eviction may take it, release now
                    c.dec_host_lock_ref(m.best_match_node, rec)
        elif op == 7 and hlocks:
            nid, rec = hlocks.pop()
            c.dec_host_lock_ref(nid, rec)
        elif op == 8:  # a storage refill from the root with its SWA window staged
            pages = len(toks) // page
            k = min(pages, 4) if rng.random() < 0.7 else int(rng.integers(1, pages + 1))
            h = c.mem_pool_host.alloc(len(toks))
            sw = c.swa_pool_host.alloc(k * page)
            if h is not None:
                r = c.insert_host(c.root_node_handle(), RadixKey(list(toks)), h,
                                  swa_host_value=sw)
                c.mem_pool_host.free(h if r.host_insert_dropped else h[:r.prefix_len])
            elif sw is not None:
                c.swa_pool_host.free(sw)
        else:
            ack_mix(c, rng)
        env.partition()
    drain(c, locks, hlocks)
    assert c.protected_size() == 0 and c.swa_protected_size() == 0
    c.evict(EvictParams(num_tokens=10**6, swa_num_tokens=10**6))
    c.evict_host(10**6)
    assert c.swa_host_total_size() == 0 and c.host_total_size() == 0
    env.partition()
    assert env.alloc.full_available_size() == env.alloc.size_full
    assert env.alloc.swa_available_size() == env.alloc.size_swa


# ---------------------------------------------------------------------- hypothesis machine
from hypothesis import settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import precondition, rule  # noqa: E402

from .test_hicache import AuxHostTierRules  # noqa: E402


class SWAHostTierMachine(AuxHostTierRules):
    """SWA on the host tier under a random schedule (every write policy):
    inserts (some with an SWA cursor past 0), matches with locks, host locks and
    load-backs, whole and step-wise evictions of both components, host eviction of
    both, and the ack calls at arbitrary points (acks late and interleaved).
    Invariant after every step: all four pools partition exactly (``Env.partition``)
    and ``sanity_check()``."""

    @rule(policy=st.sampled_from(["write_through", "write_through_selective", "write_back"]),
          host=st.sampled_from([6, 12, 40]), swa_host=st.sampled_from([3, 8, 40]),
          page=st.sampled_from([1, 2]), window=st.sampled_from([2, 4, 6]))
    @precondition(lambda self: self.env is None)
    def build(self, policy, host, swa_host, page, window):
        self.env = Env(window=window, pool=24 * page, swa_pool=16 * page, host=host * page,
                       swa_host=swa_host * page, policy=policy, page=page)
        self.locks, self.hlocks = [], []


    @rule(b=st.integers(0, 3), cut=st.integers(1, 8), cursor=st.integers(0, 2))
    @precondition(lambda self: self.env is not None)
    def insert(self, b, cut, cursor):
        env, c = self.env, self.env.cache
        toks = self._toks(b, cut)
        if not toks:
            return
        n = len(toks)
        if env.alloc.full_available_size() < n or env.alloc.swa_available_size() < n:
            c.evict(EvictParams(num_tokens=n, swa_num_tokens=n))
        if env.alloc.available_size() < n:
            return
        p = c.page_size
        cur = min(cursor * p, n // p * p)
        kv = env.alloc.alloc(n)
        if cur:  # the request's slots below its SWA cursor lost their SWA peers
            env.alloc.free_swa(kv[:cur])
        params = InsertParams(key=RadixKey(list(toks)), value=kv)
        params.set_evicted_seqlen(SWA, cur)
        c.insert(params)

    @rule(b=st.integers(0, 3), cut=st.integers(1, 8), what=st.sampled_from(
        ["lock", "hlock", "load"]))
    @precondition(lambda self: self.env is not None)
    def match(self, b, cut, what):
        env, c = self.env, self.env.cache
        toks = self._toks(b, cut)
        if not toks:
            return
        m = env.match(toks)
        if what == "lock" and len(self.locks) < 3:
            self.locks.append((m.last_device_node, c.inc_lock_ref(m.last_device_node)))
        elif what == "hlock" and len(self.hlocks) < 2 and \
                m.best_match_node != c.root_node_handle():
            rec = c.inc_host_lock_ref(m.best_match_node)
            if FULL in rec.component_host_lock_uuids:
                self.hlocks.append((m.best_match_node, rec))
            else:  # a device-only node: device eviction may take it, release now
                c.dec_host_lock_ref(m.best_match_node, rec)
        elif what == "load" and (m.host_hit_length or m.swa_host_hit_length):
            env.load(m)


    @rule(n=st.integers(0, 12), w=st.integers(0, 12), stepwise=st.booleans())
    @precondition(lambda self: self.env is not None)
    def evict(self, n, w, stepwise):
        env, c = self.env, self.env.cache
        if not stepwise:
            c.evict(EvictParams(num_tokens=n, swa_num_tokens=w))
            return
        c.evict_device_start(SWA, w)  # the controller frees what each step names
        try:
            while True:
                step = c.evict_device_next_node(SWA)
                if len(step.swa_freed_indices):   # the SWA peers first, then Full
                    env.alloc.free_swa(step.swa_freed_indices)
                if len(step.freed_indices):
                    env.alloc.free(step.freed_indices)
                if not step.made_progress:
                    break
        finally:
            c.evict_device_end(SWA)

    @rule(n=st.integers(1, 8), swa=st.booleans())
    @precondition(lambda self: self.env is not None)
    def evict_host(self, n, swa):
        self.env.cache.evict_host(n, SWA if swa else FULL)

    def _staging(self, n, pages):
        """A refill's SWA staging: ``pages`` pages of the key's end (None: pool short)."""
        return dict(swa_host_value=self.env.cache.swa_pool_host.alloc(
            min(pages * self.env.cache.page_size, n)))


SWAHostTierMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=40,
                                                deadline=None)
TestSWAHostTierMachine = SWAHostTierMachine.TestCase


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_kv_and_swa_bytes_survive_backup_demote_and_load_back_with_kvtransfer(policy):
    # A content model: the row of every position is a function of its whole prefix,
    # written into the Full and SWA device buffers at insert; free device rows of both
    # pools are overwritten with garbage after every step. After each match, every
    # matched position's Full row -- and the SWA row of each of those that has an SWA
    # peer -- must hold its content (what a backup, demotion and load-back moved).
    from flatradix import KVTransfer

    rng = np.random.default_rng(3)
    pool, swa_pool, host = 40, 24, 48
    full_buf = np.zeros((pool + 1, 2), dtype=np.int64)
    swa_buf = np.zeros((swa_pool + 1, 2), dtype=np.int64)
    t = KVTransfer.with_host_buffers([full_buf], host, device_swa_buffers=[swa_buf],
                                     host_swa_size=host)
    alloc = SWATokenToKVPoolAllocator(pool, swa_pool)
    c = UnifiedRadixCache(tree_components=(FULL, SWA), sliding_window_size=4,
                          token_to_kv_pool_allocator=alloc)
    c.init_hicache(host_size=host, swa_host_size=host, hicache_write_policy=policy,
                   load_back_threshold=1, transfer=t)

    def content(toks):
        return np.array([hash(tuple(toks)) % (1 << 40), len(toks)], dtype=np.int64)

    bases = [list(rng.integers(1, 4, size=12)) for _ in range(3)]
    checked = 0
    for _ in range(400):
        toks = bases[int(rng.integers(0, 3))][:int(rng.integers(2, 13))]
        op = int(rng.integers(0, 6))
        if op <= 1:
            n = len(toks)
            if alloc.full_available_size() < n or alloc.swa_available_size() < n:
                c.evict(EvictParams(num_tokens=n, swa_num_tokens=n))
            if alloc.available_size() >= n:
                kv = alloc.alloc(n)
                swa = alloc.translate_swa_indices_for_transfer(kv)
                for i in range(n):
                    full_buf[kv[i]] = content(toks[:i + 1])
                    swa_buf[swa[i]] = content(toks[:i + 1])
                c.insert(InsertParams(key=RadixKey(toks), value=kv))
        elif op == 2:
            m = c.match_prefix(MatchPrefixParams(key=RadixKey(toks)))
            if m.host_hit_length or m.swa_host_hit_length:
                c.init_load_back(InitLoadBackParams(m.best_match_node, m.host_hit_length, None,
                                                    Env.req(m)))
        elif op == 3:
            c.evict(EvictParams(num_tokens=int(rng.integers(0, 8)),
                                swa_num_tokens=int(rng.integers(0, 8))))
        elif op == 4:
            c.evict_host(int(rng.integers(1, 6)), SWA if rng.random() < 0.5 else FULL)
        else:
            c.check_hicache_events()
        # garbage into every free device row of both pools
        held = set(np.asarray(c.all_values_flatten()).tolist())
        for s in range(1, pool + 1):
            if s not in held:
                full_buf[s] = -1
        swa_held = set(np.asarray(alloc.translate_swa_indices_for_transfer(
            all_swa_full_values_flatten(c._engine))).tolist())
        for s in range(1, swa_pool + 1):
            if s not in swa_held:
                swa_buf[s] = -1
        m = c.match_prefix(MatchPrefixParams(key=RadixKey(toks)))
        idx = np.asarray(m.device_indices)
        swa = np.asarray(alloc.translate_swa_indices_for_transfer(idx)) if idx.size else idx
        for i in range(idx.shape[0]):
            assert np.array_equal(full_buf[idx[i]], content(toks[:i + 1])), i
            if swa[i]:
                assert np.array_equal(swa_buf[swa[i]], content(toks[:i + 1])), i
                checked += 1
    assert checked > 100 and t.loaded_swa_tokens > 0 and t.backed_up_swa_tokens > 0


@pytest.mark.parametrize("policy", ["write_through", "write_through_selective", "write_back"])
def test_swa_with_mamba_on_the_host_tier_keeps_every_pool_partitioned(policy):
    # FULL + SWA + MAMBA: random runs over both auxiliary components on both tiers;
    # after every op all six pools (Full / SWA / states, device and host) partition
    # exactly and the cache's own invariants hold
    from flatradix import HybridReqToTokenPool
    from flatradix.inspection import all_mamba_host_values_flatten

    rng = np.random.default_rng(9)
    alloc = SWATokenToKVPoolAllocator(40, 24)
    rtp = HybridReqToTokenPool(4, 64, mamba_size=6)
    ma = rtp.mamba_allocator
    c = UnifiedRadixCache(tree_components=(FULL, SWA, ComponentType.MAMBA),
                          sliding_window_size=4, token_to_kv_pool_allocator=alloc,
                          req_to_token_pool=rtp, mamba_cache_chunk_size=4)
    c.init_hicache(host_size=32, swa_host_size=20, mamba_host_size=4,
                   hicache_write_policy=policy, load_back_threshold=1)
    env = SimpleNamespace(cache=c, alloc=alloc)
    bases = [list(rng.integers(1, 5, size=12)) for _ in range(3)]
    for _ in range(500):
        op = int(rng.integers(0, 7))
        toks = bases[int(rng.integers(0, 3))][:int(rng.integers(1, 13))]
        if op <= 1:
            n = len(toks)
            if alloc.full_available_size() < n or alloc.swa_available_size() < n:
                c.evict(EvictParams(num_tokens=n, swa_num_tokens=n))
            if ma.available_size() == 0:
                c.evict(EvictParams(num_tokens=0, mamba_num=1))
            if alloc.available_size() >= n and ma.available_size():
                st = ma.alloc(1)
                r = c.insert(InsertParams(key=RadixKey(toks), value=alloc.alloc(n),
                                          mamba_value=st))
                if r.mamba_exist:
                    ma.free(st)
        elif op == 2:
            m = c.match_prefix(MatchPrefixParams(key=RadixKey(toks)))
            if (m.host_hit_length or m.swa_host_hit_length or m.mamba_host_hit_length) and (
                    ma.available_size() or c.mamba_evictable_size()):
                req = SimpleNamespace(last_node=m.last_device_node,
                                      swa_host_hit_length=m.swa_host_hit_length,
                                      mamba_host_hit_length=m.mamba_host_hit_length,
                                      kv=SimpleNamespace(mamba_pool_idx=None))
                c.init_load_back(InitLoadBackParams(m.best_match_node, m.host_hit_length,
                                                    None, req))
                if req.kv.mamba_pool_idx is not None:   # the request ends: its slot goes
                    ma.free(np.asarray([int(req.kv.mamba_pool_idx)]))
        elif op == 3:
            c.evict(EvictParams(num_tokens=int(rng.integers(0, 8)),
                                swa_num_tokens=int(rng.integers(0, 8)),
                                mamba_num=int(rng.integers(0, 2))))
        elif op == 4:
            c.evict_host(int(rng.integers(1, 6)),
                         (FULL, SWA, ComponentType.MAMBA)[int(rng.integers(0, 3))])
        else:
            c.ready_to_load_host_cache()
            c.check_hicache_events()
        Env.partition(env)
        states = c.all_mamba_values_flatten().tolist()
        assert ma.available_size() + len(states) == ma.size
        hs = all_mamba_host_values_flatten(c._engine).tolist()
        assert len(set(hs)) == len(hs) == c.mamba_host_total_size()
        assert c.mamba_pool_host.available_size() + len(hs) == c.mamba_pool_host.size
    c.ready_to_load_host_cache()
    c.check_hicache_events()
    assert c.protected_size() == 0
    c.evict(EvictParams(num_tokens=10**6, swa_num_tokens=10**6, mamba_num=10**6))
    c.evict_host(10**6)
    Env.partition(env)
    assert c.mamba_host_total_size() == 0 and c.swa_host_total_size() == 0


def test_reset_clears_the_swa_host_pool_and_its_ledger():
    # helper-29: reset() left the SWA host pool and M_SWA_HOST_TOTAL as they were
    env = Env(window=4, pool=32, host=32)
    c = env.cache
    backed(env, range(1, 13))
    assert c.swa_host_total_size() > 0
    c.reset()
    c.sanity_check()
    assert c.swa_host_total_size() == 0
    assert c.swa_pool_host.available_size() == c.swa_pool_host.size == 32
    env.alloc.clear()
    backed(env, range(1, 13))          # backups work again, window included
    assert c.swa_host_total_size() == c.host_total_size() == 12
    env.partition()


def test_hicache_ratio_sizes_the_full_host_pool_over_the_full_side():
    # helper-29: an SWA allocator's size is min(Full, SWA); SGLang sizes the Full host
    # pool over the Full side (64 * 0.5078 -> 32, + 1 page = 33), the SWA one over the
    # SWA side (16 * 0.5078 -> 8, + 1 = 9)
    alloc = SWATokenToKVPoolAllocator(64, 16)
    c = UnifiedRadixCache(tree_components=(FULL, SWA), sliding_window_size=4,
                          token_to_kv_pool_allocator=alloc)
    c.init_hicache(hicache_ratio=0.5078)
    assert (c.mem_pool_host.size, c.swa_pool_host.size) == (33, 9)


def test_a_kvtransfer_short_of_full_device_rows_is_refused_on_an_swa_cache():
    from flatradix import KVTransfer

    alloc = SWATokenToKVPoolAllocator(64, 16)
    c = UnifiedRadixCache(tree_components=(FULL, SWA), sliding_window_size=4,
                          token_to_kv_pool_allocator=alloc)
    t = KVTransfer.with_host_buffers([np.zeros((17, 2))], 32, device_swa_buffers=[
        np.zeros((17, 2))], host_swa_size=32)
    with pytest.raises(ValueError, match="need 65 rows"):
        c.init_hicache(host_size=32, swa_host_size=32, transfer=t)
    assert c.enable_hicache is False


def test_host_lock_receipts_are_checked_and_huge_host_evictions_clamped():
    env = _tombstoned_internal()
    c = env.cache
    m = env.match(range(1, 13))
    rec = c.inc_host_lock_ref(m.best_match_node)
    before = c._snapshot()
    with pytest.raises(LockRefError, match="anchored"):
        c.dec_host_lock_ref(m.last_visited_node_id if m.last_visited_node_id !=
                            m.best_match_node else c.root_node_handle(), rec)
    _same_state(before, c._snapshot())
    c.dec_host_lock_ref(m.best_match_node, rec)
    assert c.evict_host(2 ** 70, SWA) == 8     # everything, as evict clamps
    env.partition()


def test_a_write_back_backup_short_of_swa_host_slots_gives_its_host_state_back():
    # FULL + SWA + MAMBA under write-back: a leaf victim's backup finds its Full host
    # slots and a host state slot, but no SWA host room for its window (an SWA host
    # pool of 1 token): SGLang's rollback gives every slot back (the host state was
    # kept, leaked, before _backup_node served both backup paths) and the leaf is
    # dropped instead
    from flatradix import HybridReqToTokenPool

    alloc = SWATokenToKVPoolAllocator(32, 32)
    rtp = HybridReqToTokenPool(4, 64, mamba_size=4)
    c = UnifiedRadixCache(tree_components=(FULL, SWA, ComponentType.MAMBA),
                          sliding_window_size=4, token_to_kv_pool_allocator=alloc,
                          req_to_token_pool=rtp, mamba_cache_chunk_size=4)
    c.init_hicache(host_size=32, swa_host_size=1, mamba_host_size=4,
                   hicache_write_policy="write_back")
    c.insert(InsertParams(key=RadixKey(list(range(1, 5))), value=alloc.alloc(4),
                          mamba_value=rtp.mamba_allocator.alloc(1)))
    r = c.evict(EvictParams(num_tokens=4))
    assert r.num_tokens_evicted == 4                 # dropped, not demoted
    assert c.host_total_size() == 0 and c.mamba_host_total_size() == 0
    assert c.mem_pool_host.available_size() == 32
    assert c.mamba_pool_host.available_size() == c.mamba_pool_host.size == 4
    assert c.swa_pool_host.available_size() == 1
    c.sanity_check()


def test_a_write_back_subtree_drop_deletes_each_nodes_oldest_child_first():
    # write-back, an SWA host pool of 1 token: the backup of device leaf P = [1..4]
    # finds no SWA host room, so P is dropped with its host-only subtree (refills
    # below it: C1 = +[10, 11], then C2 = +[20, 21], then G = C1 + [12, 13]). The CPU
    # removals come in SGLang's order (its Python core; the oracle found the other
    # order): a post-order walk taking each node's oldest child first: G, C1, C2
    alloc = SWATokenToKVPoolAllocator(32, 32)
    c = UnifiedRadixCache(tree_components=(FULL, SWA), sliding_window_size=4,
                          token_to_kv_pool_allocator=alloc, enable_kv_cache_events=True)
    c.init_hicache(host_size=32, swa_host_size=1, hicache_write_policy="write_back")
    p = list(range(1, 5))
    c.insert(InsertParams(key=RadixKey(p), value=alloc.alloc(4)))
    node = c.match_prefix(MatchPrefixParams(key=RadixKey(p))).last_device_node
    c.take_events()
    stored, nodes = {}, {"P": node}
    for name, anchor, toks in (("C1", "P", [10, 11]), ("C2", "P", [20, 21]),
                               ("G", "C1", [12, 13])):
        r = c.insert_host(nodes[anchor], RadixKey(toks), c.mem_pool_host.alloc(2))
        assert (r.prefix_len, r.host_insert_dropped) == (0, False)
        nodes[name] = r.inserted_host_node
        stored[name] = [e for ev in c.take_events() for e in ev.block_hashes]
    assert c.host_total_size() == 6 and node == c.match_prefix(
        MatchPrefixParams(key=RadixKey(p))).last_device_node
    r = c.evict(EvictParams(num_tokens=4))
    assert r.num_tokens_evicted == 4                     # dropped, not demoted
    cpu = [h for ev in c.take_events() if type(ev).__name__ == "BlockRemoved"
           and ev.medium == "CPU_PINNED" for h in ev.block_hashes]
    assert cpu == stored["G"] + stored["C1"] + stored["C2"]
    assert c.host_total_size() == 0 and c.mem_pool_host.available_size() == 32
    c.sanity_check()


# ---------------------------------------------------------------------- storage prefetch
def _refill(env, anchor, toks, swa):
    """``insert_host`` of ``toks`` below ``anchor`` with fresh host slots and ``swa``
    staged SWA slots; the caller's share of the Full slots is freed as SGLang's
    controller frees it. Returns (result, the staged SWA slots)."""
    c = env.cache
    h = c.mem_pool_host.alloc(len(toks))
    sw = c.swa_pool_host.alloc(swa)
    r = c.insert_host(anchor, RadixKey(list(toks)), h, swa_host_value=sw)
    c.mem_pool_host.free(h if r.host_insert_dropped else h[:r.prefix_len])
    return r, sw.tolist()


def test_a_storage_refill_from_the_root_takes_its_staged_window():
    # W 4, page 1: a refill of 10 tokens from the root with 4 SWA slots staged (the key's
    # last 4 units): the new host leaf is split at 6, [7..10] takes the 4 slots
    env = Env(window=4, pool=32, host=32)
    c = env.cache
    r, sw = _refill(env, c.root_node_handle(), range(1, 11), 4)
    assert (r.prefix_len, r.total_len, r.host_insert_dropped) == (0, 10, False)
    assert c.swa_host_total_size() == 4 and c.host_total_size() == 10
    assert c.swa_pool_host.available_size() == c.swa_pool_host.size - 4
    env.partition()
    m = env.match(range(1, 11))
    # host validator: [1..6] has SWA data on neither tier (rejected), [7..10] holds one
    # window on the host: the best node; Full host hit 10, SWA host hit 4
    assert (m.device_prefix_len, m.host_hit_length, m.swa_host_hit_length) == (0, 10, 4)
    assert m.best_match_node == r.inserted_host_node
    env.log.clear()
    assert env.load(m) == (10, m.best_match_node)
    assert (env.units("load"), env.units("load_swa")) == (10, 4)
    # the staged slots are what the load reads, in key order
    assert [h for k, _, hs in env.log if k == "load_swa" for h in hs] == sw
    c.ready_to_load_host_cache()
    c.loading_check()
    env.partition()
    assert env.match(range(1, 11)).device_prefix_len == 10


def test_a_storage_refill_below_a_node_is_all_or_nothing_over_one_window():
    # W 4, page 1. Anchor: [1..8], backed up on both tiers
    env = Env(window=4, pool=32, host=32)
    c = env.cache
    backed(env, range(1, 9))
    a = env.match(range(1, 9)).last_host_node
    free0 = c.swa_pool_host.available_size()
    # a staging of 2 (< one window) below a non-root anchor: all freed, the Full part stays
    r, _ = _refill(env, a, range(11, 17), 2)
    assert (r.prefix_len, r.host_insert_dropped) == (0, False)
    assert c.swa_pool_host.available_size() == free0 and c.swa_host_total_size() == 8
    env.partition()
    # [11..16] again with [17, 18]: 8 units below the anchor, the last 4 staged: the new
    # leaf [17, 18] takes 2, the host leaf [11..16] is split at 4 and [15, 16] takes 2
    r, sw = _refill(env, a, range(11, 19), 4)
    assert (r.prefix_len, r.total_len) == (6, 8)
    assert c.swa_pool_host.available_size() == free0 - 4 and c.swa_host_total_size() == 12
    m = env.match(list(range(1, 9)) + list(range(11, 19)))
    # host validator: [1..8] (8 units, accepted), [11..14] (no SWA: a hole), [15, 16],
    # [17, 18] (4 units past the hole: accepted); the window's host-only units: 4
    assert (m.device_prefix_len, m.host_hit_length, m.swa_host_hit_length) == (8, 8, 4)
    env.partition()
    # [11..18] with [19, 20], 4 staged over [17..20]: [17, 18] holds SWA host data
    # already (its 2 staged slots are freed), the new leaf [19, 20] takes 2
    r, sw2 = _refill(env, a, range(11, 21), 4)
    assert c.swa_pool_host.available_size() == free0 - 6 and c.swa_host_total_size() == 14
    assert set(sw2[2:]) <= set(all_swa_host_values_flatten(c._engine).tolist())
    assert not set(sw2[:2]) & set(all_swa_host_values_flatten(c._engine).tolist())
    env.partition()


def test_a_dropped_refill_frees_its_staging():
    # write-through: a refill hanging below a device-only node is dropped; the cache
    # frees the SWA staging it owns, the caller all of its Full slots
    env = Env(window=4, pool=32, host=32, policy="write_through_selective")
    c = env.cache
    env.ins(range(1, 9))                      # selective: not backed up at the first hit
    d = env.match(range(1, 9)).last_device_node
    r, _ = _refill(env, d, range(20, 26), 4)
    assert (r.inserted_host_node, r.host_insert_dropped) == (None, True)
    assert c.swa_pool_host.available_size() == c.swa_pool_host.size
    assert c.swa_host_total_size() == 0 and c.host_total_size() == 0
    env.partition()


def test_a_refill_with_bad_staging_is_refused_before_any_change():
    env = Env(window=4, pool=32, host=32, page=2)
    c = env.cache
    root = c.root_node_handle()
    h = c.mem_pool_host.alloc(8)
    sw = c.swa_pool_host.alloc(4)
    key = RadixKey(list(range(1, 9)))
    before, avail = c._snapshot(), (c.mem_pool_host.available_size(),
                                   c.swa_pool_host.available_size())
    for bad, err in ((sw[:3], ValueError),                  # not whole pages
                     (np.concatenate([sw, sw, sw[:2]]), ValueError),  # longer than the key
                     (np.array([c.swa_pool_host.size - 1, 0]), ValueError),  # not handed out
                     (np.array([sw[0], sw[0]]), ValueError),          # twice
                     (sw.reshape(2, 2), ValueError),
                     ("ab", TypeError)):
        with pytest.raises(err, match="swa_host_value"):
            c.insert_host(root, key, h, swa_host_value=bad)
        _same_state(before, c._snapshot())
    with pytest.raises(ValueError, match="mamba_host_value"):      # no Mamba host pool
        c.insert_host(root, key, h, mamba_host_value=0)
    _same_state(before, c._snapshot())
    assert (c.mem_pool_host.available_size(), c.swa_pool_host.available_size()) == avail
    plain = UnifiedRadixCache(page_size=1)
    plain.init_hicache(host_size=8)
    with pytest.raises(ValueError, match="swa_host_value"):
        plain.insert_host(plain.root_node_handle(), RadixKey([1]),
                          plain.mem_pool_host.alloc(1), swa_host_value=np.array([0]))
    assert plain.host_total_size() == 0


def test_match_prefix_batch_reports_swa_host_hits_as_single_calls():
    # two caches built alike: A and B backed up and demoted (host-only SWA windows), a
    # device-only key beside them; the batch's results equal the single calls', field by
    # field (swa_host_hit_length included: computed for the whole batch under one lock)
    def build():
        env = Env(window=4, pool=48, host=48)
        backed(env, A, B)
        env.cache.evict(EvictParams(num_tokens=24))
        env.ins(list(range(30, 36)))
        return env
    one, many = build(), build()
    keys = [A, B, A[:10], list(range(30, 36)) + [1], [99]]
    want = [one.match(k) for k in keys]
    got = many.cache.match_prefix_batch([MatchPrefixParams(key=RadixKey(list(k)))
                                         for k in keys])
    fields = ("device_prefix_len", "host_hit_length", "swa_host_hit_length",
              "swa_branching_seqlen", "last_device_node", "best_match_node", "last_host_node",
              "full_kv_hit_length")
    for w, g in zip(want, got):
        assert [getattr(g, f) for f in fields] == [getattr(w, f) for f in fields]
        assert np.asarray(g.device_indices).tolist() == np.asarray(w.device_indices).tolist()
    assert sum(w.swa_host_hit_length for w in want) > 0
    many.partition()
