"""Hypothesis state machine over an SWA cache driven like a scheduler drives it.

A ``flatradix.SWATokenToKVPoolAllocator`` or a double holding the cache to
SGLang's allocator contract (``swa_support.StrictSWAAllocator``; Full and SWA
pools, possibly of different sizes), a ``ReqToTokenPool`` and ``flatradix.Req`` requests. Rules:
admit (match + lock + allocate, evicting for the allocation when short),
decode (allocate + the scheduler's per-step slide ``evict_sliding_windows``),
checkpoint, finish (``release_kv_cache`` with or without checkpoint), early
release of a request's window (``release_swa_prefix_lock``), direct inserts
with an SWA cursor, bare locks (with or without SWA) and their release /
early window release, a refused second release, evict, evict_for_alloc,
step-wise SWA / Full rounds with the controller freeing, and flush.

Each rule checks its result against values computed independently: matches
against a re-walk of the tree with §6.2's validator, cursors against §6.2's
out-of-window formula, eviction counts against the ledgers and the pools.
Invariants after every step: ``sanity_check()``, the exact slot partition of
both pools (``swa_support.check_partition``), and the protected ledgers equal
to the union of what the held locks cover -- Full: every node on each lock's
path; SWA: each window segment (from the anchor up until ``W`` tokens, of the
locks whose window is still held), counted where the node holds SWA data.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from flatradix import EvictParams, InsertParams, LockRefError, MatchPrefixParams, RadixKey, Req

from ...conftest import assert_state_equal
from .swa_support import FULL, SWA, SWAEnv, nodes
from .test_swa_requests import expected_cursor

POOL = 72
ROWS = 5
CTX = 40

prompts = st.sampled_from([[0, 1, 2, 0, 1, 2, 0, 1, 2, 0], [2, 2, 1, 1, 0, 0, 2, 2], [1, 0, 1, 0]])


@st.composite
def token_lists(draw, min_tail=0):
    base = draw(prompts)
    return base[: draw(st.integers(0, len(base)))] + draw(
        st.lists(st.integers(0, 2), min_size=min_tail, max_size=10))


def expected_match(cache, units, W, P):
    """``(device_prefix_len, full_kv_hit_length)`` of matching ``units`` (logical units
    in the tree's encoding), re-derived from the tree as it is: follow child edges
    page by page (a partial edge counts its page-aligned common part and ends the
    walk), and run §6.2's validator (acc = +inf until a tombstone, then reset to 0;
    a node with data adds its length and passes at acc >= W)."""
    n = len(units) - len(units) % P
    units = list(units[:n])
    info = nodes(cache)
    kids = {}
    for x in info:
        kids.setdefault(x["parent"], []).append(x)
    node, length, acc, best, INF = cache.root_node_handle(), 0, float("inf"), 0, float("inf")
    while length < n:
        child = next((c for c in kids.get(node, ())
                      if list(c["key"][:P]) == units[length:length + P]), None)
        if child is None:
            break
        key = list(child["key"])
        m = 0
        while m < len(key) and length + m < n and key[m] == units[length + m]:
            m += 1
        m -= m % P
        length += m
        if not child["has_swa"]:
            acc = 0
        elif acc != INF:
            acc += m
        if child["has_swa"] and acc >= W:
            best = length
        if m < len(key):
            break
        node = child["node_id"]
    return best, length


class SWAMachine(RuleBasedStateMachine):
    @initialize(W=st.sampled_from([1, 2, 3, 4, 6]), P=st.sampled_from([1, 2, 4]),
                eagle=st.booleans(), swa_pool=st.sampled_from([POOL, POOL // 2]),
                strict=st.booleans())
    def setup(self, W, P, eagle, swa_pool, strict):
        self.e = SWAEnv(W=W, P=P, size=POOL, size_swa=swa_pool, rows=ROWS, ctx=CTX, eagle=eagle,
                        strict=strict)
        self.W, self.P, self.eagle = W, P, int(eagle)
        self.held = []       # TreeLocks taken by the machine itself
        self.next_tok = 3
        self.segments = {}   # id(TreeLock) -> first key position of its window segment

    # ------------------------------------------------------------------ helpers
    @property
    def c(self):
        return self.e.cache

    def _units(self, toks):
        """The key's logical units in the tree's encoding (bigram pairs packed)."""
        return self.c._key(RadixKey(list(toks)))[0].tolist()

    def _alloc(self, n):
        a, c = self.e.alloc, self.c
        v = a.alloc(n)
        if v is not None:
            return v
        fa, sa = a.full_available_size(), a.swa_available_size()
        sf, ss = max(0, n - fa), max(0, n - sa)
        r = c.evict_for_alloc(EvictParams(num_tokens=sf, swa_num_tokens=ss))
        assert a.full_available_size() - fa == r.num_tokens_evicted
        assert a.swa_available_size() - sa == r.swa_num_tokens_evicted
        assert a.full_available_size() >= n or c.evictable_size() == 0
        assert a.swa_available_size() >= n or c.swa_evictable_size() == 0
        return a.alloc(n)

    def _note(self, lock):
        """Record the window segment ``lock`` covers, as key positions: from the anchor
        up until W tokens (spec §5.7), taken now. Splits keep positions, so a later
        split of the boundary node keeps both halves in the segment."""
        info = {n["node_id"]: n for n in nodes(self.c)}
        root = self.c.root_node_handle()
        x, covered = lock.node, 0
        while x != root and covered < self.W:
            covered += len(info[x]["key"])
            x = info[x]["parent"]
        depth = len(info[lock.node]["path"]) if lock.node != root else 0
        self.segments[id(lock)] = depth - covered
        return lock

    def _pick(self, i):
        return self.e.reqs[i % len(self.e.reqs)]

    # ------------------------------------------------------------------ rules
    @rule(toks=token_lists(min_tail=1))
    def admit(self, toks):
        if len(self.e.reqs) >= ROWS:
            return
        c, e = self.c, self.e
        want = expected_match(c, self._units(toks), self.W, self.P)
        m = c.match_prefix(MatchPrefixParams(key=RadixKey(list(toks))))
        assert (m.device_prefix_len, m.full_kv_hit_length) == want
        assert m.swa_branching_seqlen == (
            m.full_kv_hit_length if m.full_kv_hit_length > m.device_prefix_len else None)
        np.testing.assert_array_equal(m.device_indices, c.path_device_indices(m.last_device_node))
        assert not e.alloc.full_attn_allocator.is_free(m.device_indices).any()
        plen = m.device_prefix_len
        lock = c.lock(m.last_device_node)
        slots = self._alloc(len(toks) - plen)
        if slots is None:
            c.unlock(lock)
            return
        row = e.rtp.alloc(1)[0]
        e.rtp.write((row, slice(0, plen)), m.device_indices)
        e.rtp.write((row, slice(plen, len(toks))), slots)
        e.reqs.append(Req(origin_input_ids=list(toks), req_pool_idx=row,
                          prefix_indices=m.device_indices, last_node=m.last_device_node,
                          lock=lock, kv_committed_len=len(toks),
                          swa_branching_seqlen=m.swa_branching_seqlen))
        self._note(lock)

    @precondition(lambda self: self.e.reqs)
    @rule(i=st.integers(0, 50), n=st.integers(1, 6), at=st.sampled_from([0, 1]))
    def decode(self, i, n, at):
        req = self._pick(i)
        have = req.kv_committed_len
        if have + n > CTX:
            return
        slots = self._alloc(n)
        if slots is None:
            return
        self.e.alloc.free(slots)
        new = [(self.next_tok + k) % 3 for k in range(n)]
        self.next_tok += n
        self.e.decode(req, new)
        pre_len = req.kv_committed_len - at
        old, prot = req.swa_evicted_seqlen, req.cache_protected_len
        if prot is None:
            prot = len(req.prefix_indices)
        swa_before = self.e.alloc.swa_available_size()
        self.c.evict_sliding_windows(req, pre_len)
        want = expected_cursor(old, prot, pre_len, self.W, self.P)
        assert req.swa_evicted_seqlen == (want if want != old else old)
        freed = self.e.alloc.swa_available_size() - swa_before
        assert freed == (want - max(old, prot) if want > max(old, prot) else 0)

    @precondition(lambda self: self.e.reqs)
    @rule(i=st.integers(0, 50))
    def checkpoint(self, i):
        req = self._pick(i)
        c, P, eg = self.c, self.P, self.eagle
        up_to = req.kv_committed_len
        p0 = req.cache_protected_len
        if p0 is None:
            p0 = len(req.prefix_indices)
        c0, b0 = req.swa_evicted_seqlen, req.swa_branching_seqlen
        eff = up_to
        branch = b0 is not None and b0 > p0 and b0 + eg <= up_to
        if branch:
            eff = b0 + eg
        L = max(eff - eg, 0)
        aligned = L - L % P
        c1 = expected_cursor(c0, p0, L - 1, self.W, P)
        got = c.checkpoint(req, up_to)
        assert got == aligned
        prot = aligned if aligned > 0 else p0
        assert req.cache_protected_len == prot
        if branch and aligned >= b0:
            assert req.swa_branching_seqlen is None
            c1 = expected_cursor(c1, prot, len(req.fill_ids) - eg - 1, self.W, P)
        assert req.swa_evicted_seqlen == c1
        if aligned > 0:
            path = np.asarray(c.path_device_indices(req.last_node))
            assert len(path) == aligned
            np.testing.assert_array_equal(self.e.row(req)[:aligned], path)
        assert req.lock is not None and req.lock.node == req.last_node
        self._note(req.lock)

    @precondition(lambda self: self.e.reqs)
    @rule(i=st.integers(0, 50), ckpt=st.booleans())
    def finish(self, i, ckpt):
        req = self._pick(i)
        self.e.release(req, checkpoint=ckpt)
        assert req.req_pool_idx is None and req.lock is None

    @precondition(lambda self: self.e.reqs)
    @rule(i=st.integers(0, 50))
    def release_window(self, i):
        req = self._pick(i)
        spr = self.c.swa_protected_size()
        had = (req.lock is not None and not req.lock.swa_released
               and req.lock.receipt.component_lock_uuids.get(SWA) is not None)
        self.c.release_swa_prefix_lock(req)
        if had:
            assert req.lock.swa_released
        assert self.c.swa_protected_size() <= spr

    @rule(toks=token_lists(), pages=st.integers(0, 6))
    def insert(self, toks, pages):
        units = self._units(toks)
        n = len(units) - len(units) % self.P
        if n == 0:
            return
        toks, units = list(toks[:n + self.eagle]), units[:n]
        cursor = min(pages * self.P, n)
        v = self._alloc(n)
        if v is None:
            return
        if cursor:
            self.e.alloc.free_swa_segment(v[:cursor], start_pos=0)
        p = InsertParams(key=RadixKey(toks), value=v)
        p.set_evicted_seqlen(SWA, cursor)
        walked = expected_match(self.c, units, self.W, self.P)[1]
        r = self.c.insert(p)
        assert r.prefix_len == walked
        path = np.asarray(self.c.path_device_indices(r.last_device_node))
        assert len(path) == n
        np.testing.assert_array_equal(path[r.prefix_len:], v[r.prefix_len:])

    @rule(toks=token_lists(min_tail=1), skip=st.booleans())
    def lock(self, toks, skip):
        m = self.c.match_prefix(MatchPrefixParams(key=RadixKey(list(toks))))
        self.held.append(self._note(self.c.lock(m.last_device_node, (SWA,) if skip else ())))

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 50), twice=st.booleans())
    def unlock(self, i, twice):
        lk = self.held.pop(i % len(self.held))
        self.c.unlock(lk)
        others = self.held or any(r.lock is not None for r in self.e.reqs)
        if twice and not others and lk.node != self.c.root_node_handle():
            before = self.c._snapshot()
            with pytest.raises(LockRefError):
                self.c.unlock(lk)
            assert_state_equal(before, self.c._snapshot())

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 50))
    def release_swa(self, i):
        lk = self.held[i % len(self.held)]
        if SWA in lk.receipt.skipped_lock_components:
            return
        self.c.release_swa(lk)
        assert lk.swa_released

    @rule(n=st.integers(0, 30), s=st.integers(0, 30))
    def evict(self, n, s):
        c, a = self.c, self.e.alloc
        (tf, ts), ev, sev = c.total_size(), c.evictable_size(), c.swa_evictable_size()
        fa, sa = a.full_available_size(), a.swa_available_size()
        r = c.evict(EvictParams(num_tokens=n, swa_num_tokens=s))
        tf2, ts2 = c.total_size()
        assert r.num_tokens_evicted == tf - tf2 == a.full_available_size() - fa
        assert r.swa_num_tokens_evicted == ts - ts2 == a.swa_available_size() - sa
        if n:
            assert r.num_tokens_evicted >= min(n, ev)
        if s:
            assert r.swa_num_tokens_evicted >= min(s, sev)

    @rule(comp=st.sampled_from([FULL, SWA]), n=st.integers(0, 30))
    def evict_steps(self, comp, n):
        c, a = self.c, self.e.alloc
        (tf, ts) = c.total_size()
        c.evict_device_start(comp, n)
        full = swa = 0
        while True:
            s = c.evict_device_next_node(comp)
            if not s.made_progress:
                assert s.node_id is None
                break
            assert len(s.freed_indices) == s.num_tokens
            assert len(s.swa_freed_indices) == s.swa_num_tokens
            if len(s.swa_freed_indices):
                a.free_swa_segment(s.swa_freed_indices, start_pos=0)
            if len(s.freed_indices):
                a.free_full_segment(s.freed_indices, start_pos=0)
            full += s.num_tokens
            swa += s.swa_num_tokens
        done = c.evict_device_end(comp)
        assert done == (full if comp == FULL else swa)
        assert c.total_size() == (tf - full, ts - swa)

    @precondition(lambda self: not self.e.reqs and not self.held)
    @rule()
    def flush(self):
        self.c.reset()
        self.e.alloc.clear()
        self.e.rtp.clear()
        assert self.c.total_size() == (0, 0)

    # ------------------------------------------------------------------ invariants
    @invariant()
    def partition(self):
        self.e.check()

    @invariant()
    def protected_is_what_the_locks_cover(self):
        c = self.c
        info = {n["node_id"]: n for n in nodes(c)}
        root = c.root_node_handle()
        locks = self.held + [r.lock for r in self.e.reqs if r.lock is not None]
        full, window = set(), set()
        for lk in locks:
            x = lk.node
            while x != root:
                full.add(x)
                x = info[x]["parent"]
            if lk.swa_released or SWA in lk.receipt.skipped_lock_components:
                continue
            x, start = lk.node, self.segments[id(lk)]
            while x != root and len(info[x]["path"]) - len(info[x]["key"]) >= start:
                window.add(x)
                x = info[x]["parent"]
        assert c.protected_size() == sum(len(info[x]["key"]) for x in full)
        assert c.swa_protected_size() == sum(
            len(info[x]["key"]) for x in window if info[x]["has_swa"])


SWAMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestSWAMachine = SWAMachine.TestCase
TestSWAMachine.pytestmark = [pytest.mark.slow]
