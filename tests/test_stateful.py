"""Hypothesis state machines over the public API.

``CacheMachine``: flatradix.UnifiedRadixCache vs tests/reference.py. Rules:
insert, match (optionally locking the matched node), unlock a held lock,
evict, reset, path / node_info queries on possibly-stale handles. Every step
is compared with the reference (``tests/parity.py``: results, ledgers,
node_info of every paired node, identity bijection); invariants:
``sanity_check()`` and evictable + protected == total_size()[0].

``RequestMachine``: the whole scheduler-facing API with a real
``TokenToKVPoolAllocator`` and ``ReqToTokenPool``: admit (match_prefix +
inc_lock_ref + alloc, evict_for_alloc when short), decode (alloc), checkpoint
(cache_unfinished_req), finish (cache_finished_req, or is_insert=False),
bare matches with extra locks, unlock, direct insert, evict, evict_for_alloc,
step-wise eviction rounds, stale-handle probes, flush (reset + pool clear).
Each rule checks its own result against values computed independently
(duplicates freed, evicted counts equal to the ledger drop, matched slots owned
by the tree, the request row rewritten to the tree's path). Invariants:
``sanity_check()``; KV conservation as an exact *partition* of the pool's slots
1..POOL into free (allocator), cached (``all_values_flatten``) and owned by a
running request (its row past ``cache_protected_len``), with available +
evictable + protected + owned == POOL; protected_size() equal to the number of
distinct slots on the paths of every held lock (recomputed from
``path_device_indices``).
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine, initialize, invariant, precondition, rule,
)

from flatradix import (
    InsertParams, MatchPrefixParams, NodeAccessError, RadixKey, Req, ReqToTokenPool,
    TokenToKVPoolAllocator, UnifiedRadixCache,
)

from .conftest import assert_state_equal
from .parity import POLICY_CASES, Pair, policy_config

NAMESPACES = [(None, None), ("", None), ("a", None), (None, "s")]

# Small alphabets so that keys share prefixes and diverge inside pages.
tokens = st.lists(st.integers(0, 2), min_size=0, max_size=14)
prompts = st.sampled_from([[0, 1, 2, 0, 1, 2, 0, 1], [2, 2, 1, 1, 0, 0, 2, 2], [1, 0, 1, 0]])


@st.composite
def keys(draw):
    base = draw(prompts)
    cut = draw(st.integers(0, len(base)))
    toks = base[:cut] + draw(tokens)
    ns = draw(st.sampled_from(NAMESPACES))
    as_np = draw(st.booleans())
    return (toks, ns, as_np)


class CacheMachine(RuleBasedStateMachine):
    @initialize(page_size=st.sampled_from([1, 2, 4]),
                policy=st.sampled_from(POLICY_CASES),
                is_eagle=st.booleans())
    def setup(self, page_size, policy, is_eagle):
        name, cfg = policy
        self.pair = Pair(page_size, name, cfg, is_eagle)
        self.counter = 1
        self.held = []
        self.known = []

    def _key(self, spec, bigram=False):
        toks, ns, as_np = spec
        ids = np.asarray(toks, dtype=np.int64) if as_np else list(toks)
        return RadixKey(ids, extra_key=ns[0], cache_salt=ns[1],
                        is_bigram=bigram and self.pair.is_eagle)

    def _remember(self, node):
        self.known.append(node)
        del self.known[:-30]

    @rule(spec=keys(), prev=st.integers(0, 20), priority=st.integers(-2, 2),
          inserted_len=st.sampled_from([0, 0, 0, 3, 8]), bigram=st.booleans())
    def insert(self, spec, prev, priority, inserted_len, bigram):
        key = self._key(spec, bigram)
        n = len(key)
        value = np.arange(self.counter, self.counter + n, dtype=np.int64)
        self.counter += n
        node, _ = self.pair.insert(key, value, prev, priority, inserted_len)
        self._remember(node)

    @rule(spec=keys(), lock=st.booleans())
    def match(self, spec, lock):
        node, _ = self.pair.match(self._key(spec))
        self._remember(node)
        if lock and self.pair.inc(node):
            self.held.append(node)

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 100))
    def unlock(self, i):
        node = self.held.pop(i % len(self.held))
        assert self.pair.dec(node)

    @precondition(lambda self: self.known)
    @rule(i=st.integers(0, 100))
    def unlock_invalid(self, i):
        """A release that must be refused on both sides (stale, or lock_ref 0 on the path)."""
        node = self.known[i % len(self.known)]
        if not self.pair.r.dec_would_succeed(node[1]):
            assert not self.pair.dec(node)

    @precondition(lambda self: self.known)
    @rule(i=st.integers(0, 100))
    def query(self, i):
        node = self.known[i % len(self.known)]
        self.pair.path(node)
        if self.pair.inc(node):
            self.held.append(node)

    @rule(num=st.integers(0, 40))
    def evict(self, num):
        self.pair.evict(num)

    @rule()
    def evict_all(self):
        self.pair.evict(self.pair.f.total_size()[0] + 1)

    @rule()
    def reset(self):
        self.pair.reset()
        self.held.clear()

    @invariant()
    def consistent(self):
        pair = self.pair
        pair.check()  # sanity_check, ledgers, node_count, node_info of paired nodes
        f = pair.f
        assert f.evictable_size() + f.protected_size() == f.total_size()[0]


CacheMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestCacheMachine = CacheMachine.TestCase


# ----------------------------------------------------------------------------- requests
POOL = 96
ROWS = 6
CTX = 48
REQ_NAMESPACES = [{}, {"extra_key": "lora"}, {"cache_salt": "s"}]


@st.composite
def prompts_(draw):
    base = draw(prompts)
    toks = base[: draw(st.integers(0, len(base)))] + draw(
        st.lists(st.integers(0, 2), min_size=1, max_size=10))
    return toks, draw(st.sampled_from(range(len(REQ_NAMESPACES))))


class RequestMachine(RuleBasedStateMachine):
    @initialize(page_size=st.sampled_from([1, 2, 4]), policy=st.sampled_from(POLICY_CASES))
    def setup(self, page_size, policy):
        name, cfg = policy
        self.page = page_size
        self.alloc = TokenToKVPoolAllocator(POOL)
        self.rtp = ReqToTokenPool(ROWS, CTX)
        self.cache = UnifiedRadixCache(page_size=page_size, eviction_policy=name,
                                       eviction_policy_config=policy_config(cfg, page_size),
                                       token_to_kv_pool_allocator=self.alloc,
                                       req_to_token_pool=self.rtp)
        self.running = []
        self.held = []   # node ids locked by this machine (not by requests)
        self.known = []  # node ids seen, maybe stale
        self.next_tok = 3

    # ------------------------------------------------------------------ helpers
    def _remember(self, node):
        self.known.append(node)
        del self.known[:-20]

    def _alloc(self, n):
        c = self.cache
        slots = self.alloc.alloc(n)
        if slots is None:
            avail, ev = self.alloc.available_size(), c.evictable_size()
            got = c.evict_for_alloc(n)
            assert got == ev - c.evictable_size()
            assert self.alloc.available_size() == avail + got
            assert self.alloc.available_size() >= min(n, avail + ev)
            slots = self.alloc.alloc(n)
        return slots

    def _owned(self, req):
        p = req.cache_protected_len if req.cache_protected_len is not None else len(req.prefix_indices)
        return self.rtp.req_to_token[req.req_pool_idx, p:req.kv_committed_len]

    def _pick(self, i):
        return self.running[i % len(self.running)]

    def _drop(self, req):
        del self.running[next(k for k, r in enumerate(self.running) if r is req)]

    # ------------------------------------------------------------------ rules
    @rule(spec=prompts_())
    def admit(self, spec):
        toks, nsi = spec
        ns = REQ_NAMESPACES[nsi]
        c = self.cache
        m = c.match_prefix(MatchPrefixParams(key=RadixKey(toks, **ns)))
        plen = m.device_prefix_len
        assert plen % self.page == 0 and plen <= len(toks) and len(m.device_indices) == plen
        assert not self.alloc.is_free(m.device_indices).any()  # the tree owns them
        np.testing.assert_array_equal(m.device_indices, c.path_device_indices(m.last_device_node))
        r = c.inc_lock_ref(m.last_device_node)
        self._remember(m.last_device_node)
        slots = self._alloc(len(toks) - plen)
        rows = self.rtp.alloc(1) if slots is not None else None
        if rows is None:
            c.dec_lock_ref(m.last_device_node, r)
            if slots is not None:
                self.alloc.free(slots)
            return
        row = rows[0]
        self.rtp.write((row, slice(0, plen)), m.device_indices)
        self.rtp.write((row, slice(plen, len(toks))), slots)
        self.running.append(Req(origin_input_ids=list(toks), req_pool_idx=row,
                                prefix_indices=m.device_indices, last_node=m.last_device_node,
                                kv_committed_len=len(toks), **ns))

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100), n=st.integers(1, 8))
    def decode(self, i, n):
        req = self._pick(i)
        have = req.kv_committed_len
        if have + n > CTX:
            return
        slots = self._alloc(n)
        if slots is None:
            return
        self.rtp.write((req.req_pool_idx, slice(have, have + n)), slots)
        new = [(self.next_tok + k) % 3 for k in range(n)]  # shared alphabet: outputs overlap
        self.next_tok += n
        req.output_ids = list(req.output_ids) + new
        req.fill_ids = list(req.fill_ids) + new
        req.kv_committed_len = have + n

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100))
    def checkpoint(self, i):
        req = self._pick(i)
        c = self.cache
        c.cache_unfinished_req(req)
        n = len(req.fill_ids)
        aligned = n - n % self.page
        row = self.rtp.req_to_token[req.req_pool_idx]
        if aligned > 0:
            assert req.cache_protected_len == aligned
            path = c.path_device_indices(req.last_node)
            np.testing.assert_array_equal(path, row[:aligned])  # row rewritten to the tree's slots
            np.testing.assert_array_equal(np.asarray(req.prefix_indices)[:aligned], path)
            assert c.node_info(req.last_node)["lock_ref"] >= 1
        self._remember(req.last_node)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100), insert=st.booleans())
    def finish(self, i, insert):
        req = self._pick(i)
        self._drop(req)
        committed = req.kv_committed_len
        toks = list(req.fill_ids)[:committed]
        self.cache.cache_finished_req(req, is_insert=insert)
        assert req.req_pool_idx is None and req.last_node is None
        aligned = committed - committed % self.page
        if insert and aligned:
            ns = {k: getattr(req, k) for k in ("extra_key", "cache_salt") if getattr(req, k)}
            m = self.cache.match_prefix(MatchPrefixParams(key=RadixKey(toks, **ns)))
            assert m.device_prefix_len == aligned  # just cached, nothing evicted since

    @rule(spec=prompts_(), lock=st.booleans())
    def match(self, spec, lock):
        toks, nsi = spec
        m = self.cache.match_prefix(MatchPrefixParams(key=RadixKey(toks, **REQ_NAMESPACES[nsi])))
        assert not self.alloc.is_free(m.device_indices).any()
        self._remember(m.last_device_node)
        if lock:
            self.cache.inc_lock_ref(m.last_device_node)
            self.held.append(m.last_device_node)

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 100))
    def unlock(self, i):
        self.cache.dec_lock_ref(self.held.pop(i % len(self.held)))

    @rule(spec=prompts_())
    def insert(self, spec):
        toks, nsi = spec
        n = len(toks) - len(toks) % self.page
        slots = self._alloc(n)
        if slots is None:
            return
        c = self.cache
        r = c.insert(InsertParams(key=RadixKey(toks[:n], **REQ_NAMESPACES[nsi]), value=slots))
        assert r.prefix_len % self.page == 0 and r.prefix_len <= n
        assert self.alloc.is_free(slots[: r.prefix_len]).all()  # duplicates went back
        if n:
            path = c.path_device_indices(r.last_device_node)
            assert len(path) == n
            np.testing.assert_array_equal(path[r.prefix_len:], slots[r.prefix_len:])
            self._remember(r.last_device_node)
        else:
            assert r.last_device_node == c.root_node_handle()

    @rule(n=st.integers(0, 60))
    def evict(self, n):
        c = self.cache
        ev, avail = c.evictable_size(), self.alloc.available_size()
        got = c.evict(n).num_tokens_evicted
        assert got == ev - c.evictable_size() and got >= min(n, ev)
        assert self.alloc.available_size() == avail + got

    @rule(n=st.integers(0, 200))
    def evict_for_alloc(self, n):
        c = self.cache
        ev, avail = c.evictable_size(), self.alloc.available_size()
        got = c.evict_for_alloc(n)
        assert got == ev - c.evictable_size()
        assert (got == 0) if n <= avail else (self.alloc.available_size() >= min(n, avail + ev))

    @rule(n=st.integers(0, 60))
    def evict_steps(self, n):
        c = self.cache
        ev = c.evictable_size()
        c.evict_device_start(num_tokens=n)
        total = 0
        while True:
            step = c.evict_device_next_node()
            if step.node_id is None:
                break
            assert step.made_progress and step.num_tokens == len(step.freed_indices) > 0
            with pytest.raises(NodeAccessError):
                c.node_info(step.node_id)  # the step's node is gone
            self.alloc.free(step.freed_indices)
            total += step.num_tokens
        assert c.evict_device_end() == total == ev - c.evictable_size()
        assert total >= min(n, ev)

    @precondition(lambda self: self.known)
    @rule(i=st.integers(0, 100))
    def probe(self, i):
        node = self.known[i % len(self.known)]
        before = self.cache._snapshot()
        try:
            r = self.cache.inc_lock_ref(node)
        except NodeAccessError:
            assert_state_equal(before, self.cache._snapshot())  # a stale id changes nothing
            return
        self.cache.dec_lock_ref(node, r)

    @precondition(lambda self: not self.running)
    @rule()
    def flush(self):
        """What a scheduler's flush_cache does: reset the tree and both pools."""
        c = self.cache
        old = list(self.known)
        c.reset()
        self.alloc.clear()
        self.rtp.clear()
        self.held.clear()
        assert c.total_size()[0] == c.evictable_size() == c.protected_size() == 0
        for node in old:
            if node != c.root_node_handle():
                try:
                    c.inc_lock_ref(node)
                except NodeAccessError:
                    continue
                raise AssertionError(f"node {node} survived reset()")

    # ------------------------------------------------------------------ invariants
    @invariant()
    def conservation(self):
        c = self.cache
        c.sanity_check()
        owned = [np.asarray(self._owned(r)) for r in self.running]
        n_owned = sum(len(o) for o in owned)
        ev, pr, tot = c.evictable_size(), c.protected_size(), c.total_size()[0]
        assert ev + pr == tot
        assert self.alloc.available_size() + ev + pr + n_owned == POOL
        free = np.nonzero(self.alloc.is_free(np.arange(POOL + 1)))[0]
        cached = np.asarray(c.all_values_flatten())
        assert len(cached) == tot
        every = np.concatenate([free, cached] + owned)
        assert len(every) == POOL
        np.testing.assert_array_equal(np.sort(every), np.arange(1, POOL + 1))  # a partition

    @invariant()
    def protected_is_the_union_of_locked_paths(self):
        c = self.cache
        locked = set()
        for node in self.held + [r.last_node for r in self.running if r.last_node is not None]:
            locked.update(np.asarray(c.path_device_indices(node)).tolist())
        assert c.protected_size() == len(locked)


RequestMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestRequestMachine = RequestMachine.TestCase
TestRequestMachine.pytestmark = [pytest.mark.slow]
