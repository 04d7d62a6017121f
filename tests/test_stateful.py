"""Hypothesis state machine: flatradix.UnifiedRadixCache vs tests/reference.py.

Rules: insert, match (optionally locking the matched node), unlock a held lock,
evict, reset, path / node_info queries on possibly-stale handles. Every step
is compared with the reference (``tests/parity.py``: results, ledgers,
node_info of every paired node, identity bijection); invariants:
``sanity_check()`` and evictable + protected == total_size()[0].
"""

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine, initialize, invariant, precondition, rule,
)

from flatradix import RadixKey

from .parity import POLICY_CASES, Pair

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
