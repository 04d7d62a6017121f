"""A slow, obviously-correct pure-Python radix cache (Full component only).

This is the test oracle for ``flatradix.UnifiedRadixCache``. It implements the
contract of ``docs/architecture.md`` section "Semantics (Full component)"
directly on linked node objects (a dict of children per node), without looking
at ``flatradix/kernels``: every size is recomputed by walking the tree, and
eviction scans every node for the least-priority evictable leaf at each step.

Only the parameter/result types and exceptions are shared with flatradix (they
are part of the public API, not of the engine).

Node handles are this module's own integers: they are never reused (also not
across ``reset()``), so tests can compare the two implementations' node
identities only by behaviour (a consistent bijection, equal paths, equal lock
effects), never by raw value.
"""

import itertools
import sys

import numpy as np

from flatradix.errors import LockRefError, NodeAccessError
from flatradix.types import (
    DecLockRefResult, EvictParams, EvictResult, IncLockRefResult, InsertParams,
    InsertResult, MatchPrefixParams, MatchResult, RadixKey,
)

TICK = 100000
POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru", "tlru")
_POLICY_DEFAULTS = {"slru": {"protected_threshold": 2},
                    "tlru": {"threshold": 0, "next_prompt_estimate": 0}}


class _Node:
    __slots__ = ("id", "seq", "parent", "children", "key", "value", "ns", "lock_ref",
                 "last_access", "creation", "hit_count", "priority",
                 "tlru_cached", "tlru_hist")

    def __init__(self, nid, seq):
        self.id = nid
        self.seq = seq            # creation order, only used as a last-resort tie-break
        self.parent = None
        self.children = {}        # (ns, first page tuple) -> _Node
        self.key = []             # logical units (ints)
        self.value = []           # KV indices (ints), same length as key
        self.ns = None
        self.lock_ref = 0
        self.last_access = 0
        self.creation = 0
        self.hit_count = 0
        self.priority = 0
        self.tlru_cached = 0
        self.tlru_hist = 0


class ReferenceRadixCache:
    """Same public API as ``flatradix.UnifiedRadixCache`` for the Full component."""

    def __init__(self, page_size=1, eviction_policy="lru", eviction_policy_config=None,
                 is_eagle=False, token_to_kv_pool_allocator=None):
        if int(page_size) < 1:
            raise ValueError("page_size must be >= 1")
        self.page_size = int(page_size)
        policy = eviction_policy.lower()
        if policy not in POLICIES:
            raise ValueError(f"unknown eviction policy {eviction_policy!r}")
        self.eviction_policy = policy
        cfg = dict(_POLICY_DEFAULTS.get(policy, {}))
        extra = set(eviction_policy_config or {}) - set(cfg)
        if extra:
            raise TypeError(f"unknown eviction_policy_config keys {sorted(extra)}")
        cfg.update(eviction_policy_config or {})
        self.policy_config = cfg
        self.is_eagle = bool(is_eagle)
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self._ids = itertools.count(1)
        self._seqs = itertools.count()
        self._clock = TICK
        self._known_ns = {(None, None)}
        self._live = {}
        self._new_root()

    # ------------------------------------------------------------------ helpers
    def _tick(self):
        t = self._clock
        self._clock += TICK
        return t

    def _new_node(self):
        n = _Node(next(self._ids), next(self._seqs))
        self._live[n.id] = n
        return n

    def _new_root(self):
        """A fresh root: like any new node it reads the clock twice (last access,
        then creation); the clock itself is never reset."""
        self._live = {}
        root = self._new_node()
        root.lock_ref = 1  # SGLang: the root is locked for good (never a leaf, never evicted)
        root.priority = -sys.maxsize
        root.last_access = self._tick()
        root.creation = self._tick()
        self.root = root

    def _resolve(self, nid):
        node = self._live.get(int(nid))
        if node is None:
            raise NodeAccessError(f"node id {nid} does not name a live node")
        return node

    def _key(self, key):
        """(units, aligned length, namespace tuple, raw tokens) of a RadixKey."""
        if not isinstance(key, RadixKey):
            raise TypeError("key must be a RadixKey")
        if key.is_bigram and not self.is_eagle:
            raise ValueError("bigram key given to a non-EAGLE cache")
        raw = [int(t) for t in np.asarray(key.token_ids).reshape(-1).tolist()]
        if self.is_eagle or key.is_bigram:
            units = [(raw[i] << 32) | raw[i + 1] for i in range(len(raw) - 1)]
        else:
            units = list(raw)
        n = len(units) - len(units) % self.page_size
        return units, n, (key.extra_key, key.cache_salt), raw

    def _child_key(self, ns, units, pos):
        return (ns, tuple(units[pos:pos + self.page_size]))

    def _common(self, a, b):
        """Common prefix length of two unit lists, rounded down to whole pages."""
        m = 0
        lim = min(len(a), len(b))
        while m < lim and a[m] == b[m]:
            m += 1
        return m - m % self.page_size

    def _split(self, child, m):
        """New upper node U takes child's first m units and its place; returns U."""
        parent = child.parent
        u = self._new_node()
        u.parent = parent
        u.ns = child.ns
        u.key, u.value = child.key[:m], child.value[:m]
        child.key, child.value = child.key[m:], child.value[m:]
        ck = self._child_key(u.ns, u.key, 0)
        assert parent.children[ck] is child
        parent.children[ck] = u
        u.children = {self._child_key(child.ns, child.key, 0): child}
        child.parent = u
        u.creation = child.creation
        u.hit_count = child.hit_count
        u.priority = child.priority
        u.lock_ref = child.lock_ref
        u.tlru_cached = parent.tlru_cached + m
        u.tlru_hist = child.tlru_hist
        u.last_access = self._tick()
        child.last_access = self._tick()
        return u

    def _values_out(self, vals):
        return np.asarray(vals, dtype=np.int64).reshape(-1)

    def _free(self, vals):
        """Hand freed indices to the allocator (returns None) or back (returns array)."""
        arr = self._values_out(vals)
        if self.token_to_kv_pool_allocator is not None:
            if arr.size:
                self.token_to_kv_pool_allocator.free(arr)
            return None
        return arr

    def _nodes(self):
        """Every non-root node (DFS)."""
        out = []
        stack = list(self.root.children.values())
        while stack:
            x = stack.pop()
            out.append(x)
            stack.extend(x.children.values())
        return out

    # ------------------------------------------------------------------ match
    def match_prefix(self, params):
        key = params.key if isinstance(params, MatchPrefixParams) else params
        units, n, ns, _ = self._key(key)
        root = self.root
        if n == 0 or ns not in self._known_ns:
            return MatchResult(self._values_out([]), root.id, root.id, root.id, 0, 0, 0, None)
        node, pos, vals = root, 0, []
        while pos < n:
            child = node.children.get(self._child_key(ns, units, pos))
            if child is None:
                break
            m = self._common(child.key, units[pos:n])
            if m < len(child.key):
                node = self._split(child, m)
                vals += node.value
                pos += m
                break
            vals += child.value
            pos += m
            node = child
        best = node
        t = self._tick()
        k, x = 0, best
        while x is not None:
            x.last_access = t - k
            k += 1
            x = x.parent
        visited = None if best is root else best.id
        return MatchResult(self._values_out(vals), best.id, best.id, best.id, 0, pos, pos, visited)

    # ------------------------------------------------------------------ insert
    def insert(self, params):
        units, n, ns, raw = self._key(params.key)
        if params.value is None:
            value = raw[:len(units)]
        else:
            value = [int(v) for v in np.asarray(params.value).reshape(-1).tolist()]
        prev = int(params.prev_prefix_len)
        inserted_len = int(params.inserted_len)
        priority = int(params.priority if params.priority is not None else 0)
        if n == 0:  # flatradix: an empty (page-aligned) key is a no-op; SGLang touches the root
            return InsertResult(prefix_len=0, last_device_node=self.root.id,
                                duplicate_indices=self._free([]), mamba_exist=True)
        self._known_ns.add(ns)
        root = self.root
        root.last_access = self._tick()
        root.priority = max(root.priority, priority)
        node, pos = root, 0
        while pos < n:
            child = node.children.get(self._child_key(ns, units, pos))
            if child is None:
                break
            child.last_access = self._tick()
            m = self._common(child.key, units[pos:n])
            if m < len(child.key):
                child = self._split(child, m)
            child.priority = max(child.priority, priority)
            if pos + m > inserted_len:
                child.hit_count += 1
            pos += m
            node = child
        target = node
        if pos < n:
            leaf = self._new_node()
            leaf.parent = node
            leaf.ns = ns
            leaf.key = units[pos:n]
            leaf.value = value[pos:n]
            leaf.priority = priority
            leaf.last_access = self._tick()
            leaf.creation = self._tick()
            leaf.hit_count = 1 if n > inserted_len else 0
            node.children[self._child_key(ns, units, pos)] = leaf
            leaf.tlru_cached = node.tlru_cached + len(leaf.key)
            leaf.tlru_hist = leaf.tlru_cached
            a = node
            while a is not None and a.tlru_hist < leaf.tlru_cached:
                a.tlru_hist = leaf.tlru_cached
                a = a.parent
            target = leaf
        dup = value[prev:pos] if prev < pos else []
        return InsertResult(prefix_len=pos, last_device_node=target.id,
                            duplicate_indices=self._free(dup), mamba_exist=(n == 0))

    # ------------------------------------------------------------------ evict
    def _priority(self, x):
        p = self.eviction_policy
        if p == "lru":
            key = (x.last_access,)
        elif p == "lfu":
            key = (x.hit_count, x.last_access)
        elif p == "fifo":
            key = (x.creation,)
        elif p == "mru":
            key = (-x.last_access,)
        elif p == "filo":
            key = (-x.creation,)
        elif p == "priority":
            key = (x.priority, x.last_access)
        elif p == "slru":
            key = (1 if x.hit_count >= self.policy_config["protected_threshold"] else 0,
                   x.last_access)
        else:  # tlru
            cfg = self.policy_config
            budget = max(x.tlru_hist + cfg["next_prompt_estimate"] - cfg["threshold"], 0)
            safe = (x.tlru_cached - len(x.key)) >= budget
            key = (-1 if safe else 0, x.last_access)
        return key + (x.seq,)

    def _is_evictable_leaf(self, x):
        return x is not self.root and x.lock_ref == 0 and not x.children

    def evict(self, params):
        num = params.num_tokens if isinstance(params, EvictParams) else params
        num = int(num)
        if num < 0:
            raise ValueError("num_tokens must be >= 0")
        done, freed = 0, []
        while done < num:
            cands = [x for x in self._nodes() if self._is_evictable_leaf(x)]
            if not cands:
                break
            x = min(cands, key=self._priority)
            del x.parent.children[self._child_key(x.ns, x.key, 0)]
            del self._live[x.id]
            x.parent = None
            freed += x.value
            done += len(x.key)
        return EvictResult(done, 0, 0, self._free(freed))

    # ------------------------------------------------------------------ locks
    def inc_lock_ref(self, node):
        x = self._resolve(node)
        delta = 0
        while x is not self.root:
            if x.lock_ref == 0:
                delta += len(x.key)
            x.lock_ref += 1
            x = x.parent
        return IncLockRefResult(delta, int(node))

    def dec_lock_ref(self, node, receipt=None):
        if receipt is not None:
            anchor = getattr(receipt, "node_id", None)
            if anchor is not None and anchor != int(node):
                raise LockRefError("receipt anchored on another node")
        x = self._resolve(node)
        path = []
        while x is not self.root:
            if x.lock_ref == 0:
                raise LockRefError(f"lock_ref 0 on node {x.id}")
            path.append(x)
            x = x.parent
        for x in path:
            x.lock_ref -= 1
        return DecLockRefResult()

    def dec_would_succeed(self, node):
        """Whether ``dec_lock_ref(node)`` would succeed (test helper; changes nothing)."""
        x = self._live.get(int(node))
        if x is None:
            return False
        while x is not self.root:
            if x.lock_ref == 0:
                return False
            x = x.parent
        return True

    # ------------------------------------------------------------------ sizes
    def evictable_size(self):
        return sum(len(x.key) for x in self._nodes() if x.lock_ref == 0)

    def protected_size(self):
        return sum(len(x.key) for x in self._nodes() if x.lock_ref > 0)

    def total_size(self):
        return sum(len(x.key) for x in self._nodes()), 0

    def node_count(self):
        return len(self._nodes())

    def ledger(self):
        """(evictable, protected, (total, 0), node_count) from one traversal."""
        ev = pr = cnt = 0
        for x in self._nodes():
            cnt += 1
            if x.lock_ref == 0:
                ev += len(x.key)
            else:
                pr += len(x.key)
        return ev, pr, (ev + pr, 0), cnt

    # ------------------------------------------------------------------ nodes
    def root_node_handle(self, extra_key=None):
        return self.root.id

    def is_root(self, node):
        return int(node) == self.root.id

    def path_device_indices(self, node):
        x = self._resolve(node)
        parts = []
        while x is not self.root:
            parts.append(x.value)
            x = x.parent
        return self._values_out([v for p in reversed(parts) for v in p])

    def node_info(self, node):
        """Same fields as ``flatradix.UnifiedRadixCache.node_info``."""
        x = self._resolve(node)
        return {
            "node_id": x.id,
            "parent": None if x.parent is None else x.parent.id,
            "key": np.asarray(x.key, dtype=np.int64),
            "value": np.asarray(x.value, dtype=np.int64),
            "lock_ref": x.lock_ref,
            "num_children": len(x.children),
            "last_access": x.last_access,
            "creation": x.creation,
            "hit_count": x.hit_count,
            "priority": x.priority,
            "evictable_leaf": self._is_evictable_leaf(x),
        }

    def reset(self):
        self._new_root()

    def check(self):
        """Self-consistency of the reference (structure only)."""
        seen = {self.root.id}
        for x in self._nodes():
            assert x.key and len(x.key) % self.page_size == 0
            assert len(x.key) == len(x.value)
            assert x.parent.children[self._child_key(x.ns, x.key, 0)] is x
            assert self._live[x.id] is x
            assert x.lock_ref >= 0
            seen.add(x.id)
        assert seen == set(self._live)
