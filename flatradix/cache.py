"""The façade: SGLang's ``UnifiedRadixCache`` API over the flat-array kernels.

Validates and casts inputs once (``_cast``), calls one kernel per public
operation, turns status codes into exceptions, and hands freed KV indices to
the attached allocator. Holds no tree logic. Thread-safe: every public method
runs under one re-entrant lock (the kernels hold the GIL; see
``docs/architecture.md``).
"""

import threading
from collections.abc import Mapping

import numpy as np

from . import _numba_env  # noqa: F401  (must precede the kernels: cache directory)
from . import inspection
from ._cast import as_count, as_flag, as_int, as_int64, as_node_id, is_torch, key_units
from .engine import Engine, node_id
from .errors import CacheInvariantError, LockRefError, NodeAccessError
from .event_sink import EventSink
from .executor import execute
from .kernels import layout as L
from .kernels.check import sanity_check as _k_check
from .kernels.evict import evict as _k_evict
from .kernels.evict import evict_end as _k_evict_end
from .kernels.evict import evict_next as _k_evict_next
from .kernels.evict import evict_start as _k_evict_start
from .kernels.insert import insert as _k_insert
from .kernels.lock import dec_lock_ref as _k_dec
from .kernels.lock import inc_lock_ref as _k_inc
from .kernels.match import match_prefix as _k_match
from .kernels.query import path_device_indices as _k_path
from .kernels.query import resolve_slot as _k_resolve
from .requests import RequestCachingMixin
from .values import ValueBridge
from .types import (
    ComponentType, DecLockRefResult, EvictParams, EvictResult, EvictStep,
    IncLockRefResult, InsertParams, InsertResult, MatchPrefixParams, MatchResult,
    RadixKey,
)

_EMPTY = np.empty(0, dtype=np.int64)
_tuple_new = tuple.__new__
assert len(MatchResult._fields) == 14  # the positional tuples below build all 14 fields
_POLICY_DEFAULTS = {"slru": {"protected_threshold": 2},
                    "tlru": {"threshold": 0, "next_prompt_estimate": 0}}
#: Largest accepted page_size (tokens per page); real models use <= 1024.
MAX_PAGE_SIZE = 1 << 20
#: Largest accepted initial node_capacity: a slot must fit the low 32 bits of a NodeId.
MAX_NODE_CAPACITY = 1 << 31
#: Largest accepted initial pool_capacity (rows of 16 bytes or more each).
MAX_POOL_CAPACITY = 1 << 40
#: Eviction counts above this are clamped to it (it exceeds any tree; kernels take int64).
_COUNT_CLAMP = 1 << 62


def _components(components):
    """``components`` as a tuple of ComponentType (TypeError / ValueError naming it)."""
    if isinstance(components, (str, bytes)) or not hasattr(components, "__iter__"):
        raise TypeError(f"components must be a tuple of ComponentType, got "
                        f"{type(components).__name__}")
    out = []
    for c in components:
        try:
            out.append(ComponentType(c))
        except (ValueError, TypeError):
            raise ValueError(f"components: {c!r} is not a ComponentType "
                             f"({', '.join(m.name for m in ComponentType)})") from None
    return tuple(out)


def _component(component, name="component"):
    try:
        return ComponentType(component)
    except (ValueError, TypeError):
        raise ValueError(f"{name} must be a ComponentType, got {component!r}") from None


class UnifiedRadixCache(RequestCachingMixin):
    """Prefix cache of KV indices keyed by token ids (SGLang 0.5.23 ``UnifiedRadixCache``).

    Parameters
    ----------
    page_size : int, >= 1
        Keys are aligned down to whole pages; nodes hold whole pages.
    components : tuple of ComponentType
        ``(FULL,)`` (SWA and Mamba are not implemented yet: ``ValueError``).
    eviction_policy : str
        One of ``lru, lfu, fifo, mru, filo, priority, slru, tlru`` (case-insensitive).
    eviction_policy_config : dict, optional
        ``slru``: ``protected_threshold`` (2); ``tlru``: ``threshold`` (0),
        ``next_prompt_estimate`` (0). Unknown keys raise ``TypeError``.
    token_to_kv_pool_allocator : optional
        Object with ``free(indices)`` (SGLang's or ``flatradix.TokenToKVPoolAllocator``).
        When given, duplicate and evicted KV indices are freed through it; when
        ``None`` they are returned in the results for the caller to free.
    req_to_token_pool : optional
        Needed by ``cache_finished_req`` / ``cache_unfinished_req``.
    device : str
        ``"cpu"`` (values live in host memory; CUDA tensors are accepted and
        returned on their device, with one copy each way).
    is_eagle : bool
        EAGLE bigram tree: every key is viewed as bigrams.
    enable_kv_cache_events : bool
        Queue ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` events
        (``flatradix.events``; needs msgspec), drained by ``take_events()``. When
        off, no hashing work is done at all.
    disable : bool
        Hold nothing: match returns empty, insert returns prefix_len 0.
    node_capacity, pool_capacity : int
        Initial sizes (grown by doubling on demand); at most 2**31 / 2**40.

    Bad input raises ``TypeError`` / ``ValueError`` naming the argument before
    anything changes (``docs/architecture.md``, "Bad input").

    Threads
    -------
    Every public method runs under one re-entrant lock, ``cache.lock`` (a
    ``threading.RLock``), so calls from several threads are serialised and each
    is atomic; the Numba kernels hold the GIL while they run. Allocator frees
    happen under it too (lock order: cache, then allocator / request pool, which
    have their own locks). What one call cannot give, hold ``cache.lock`` for
    (re-entrant: the cache's own calls inside are fine):

    * match + lock: another thread may evict the matched node between
      ``match_prefix`` and ``inc_lock_ref`` (then ``NodeAccessError``: retry),
      so hold the lock across both, or retry. A node that could be locked was
      never evicted (ids are never reissued), so its matched indices are valid.
    * a consistent reading of several sizes (each size alone is exact).
    * a step-wise eviction round (one round per cache at a time).

    Not safe: a request (``Req``) used by two threads at once; node handles kept
    across another thread's ``reset()`` (they go stale: ``NodeAccessError``,
    never another node); KV indices of an unlocked match after another thread
    may have evicted them (lock first, then use them).
    """

    def __init__(self, page_size=1, components=(ComponentType.FULL,), eviction_policy="lru",
                 token_to_kv_pool_allocator=None, req_to_token_pool=None, device="cpu",
                 is_eagle=False, eviction_policy_config=None, disable=False,
                 enable_kv_cache_events=False, node_capacity=1024, pool_capacity=1 << 16):
        self.page_size = as_count(page_size, "page_size")
        if not 1 <= self.page_size <= MAX_PAGE_SIZE:
            raise ValueError(f"page_size must be in [1, {MAX_PAGE_SIZE}], got {self.page_size}")
        comps = _components(components)
        if comps != (ComponentType.FULL,):
            raise ValueError(f"components: only (ComponentType.FULL,) is implemented, got {comps}")
        self.components = comps
        if not isinstance(eviction_policy, str) or eviction_policy.lower() not in L.POLICY_NAMES:
            raise ValueError(f"eviction_policy must be one of {', '.join(L.POLICY_NAMES)}; "
                             f"got {eviction_policy!r}")
        self.eviction_policy = eviction_policy.lower()
        if eviction_policy_config is not None and not isinstance(eviction_policy_config, Mapping):
            raise TypeError(f"eviction_policy_config must be a dict or None, got "
                            f"{type(eviction_policy_config).__name__}")
        self._policy_cfg = self._policy_config(self.eviction_policy, eviction_policy_config or {})
        if token_to_kv_pool_allocator is not None and not callable(
                getattr(token_to_kv_pool_allocator, "free", None)):
            raise TypeError("token_to_kv_pool_allocator must have a free(indices) method "
                            f"(got {type(token_to_kv_pool_allocator).__name__})")
        if req_to_token_pool is not None and not (
                hasattr(req_to_token_pool, "req_to_token")
                and callable(getattr(req_to_token_pool, "free", None))):
            raise TypeError("req_to_token_pool must have .req_to_token and a free(row) method "
                            f"(got {type(req_to_token_pool).__name__})")
        if not (isinstance(device, str) or is_torch(device)):
            raise TypeError(f"device must be a str (or torch.device), got {type(device).__name__}")
        ncap = as_count(node_capacity, "node_capacity")
        if ncap > MAX_NODE_CAPACITY:
            raise ValueError(f"node_capacity must be <= {MAX_NODE_CAPACITY}, got {ncap}")
        pcap = as_count(pool_capacity, "pool_capacity")
        if pcap > MAX_POOL_CAPACITY:
            raise ValueError(f"pool_capacity must be <= {MAX_POOL_CAPACITY}, got {pcap}")
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.req_to_token_pool = req_to_token_pool
        self.device = device
        self.is_eagle = as_flag(is_eagle, "is_eagle")
        self.disable = as_flag(disable, "disable")
        self.enable_kv_cache_events = (as_flag(enable_kv_cache_events, "enable_kv_cache_events")
                                       and not self.disable)
        self._mutex = threading.RLock()
        self._vals = ValueBridge(token_to_kv_pool_allocator)
        cfg = self._policy_cfg
        pa = pb = 0
        if self.eviction_policy == "slru":
            pa = cfg["protected_threshold"]
        elif self.eviction_policy == "tlru":
            pa, pb = cfg["threshold"], cfg["next_prompt_estimate"]
        try:
            self._engine = Engine(
                page_size=self.page_size, policy=L.POLICY_NAMES.index(self.eviction_policy),
                policy_a=pa, policy_b=pb, events=self.enable_kv_cache_events,
                bigram=self.is_eagle, node_capacity=max(4, ncap), pool_capacity=max(64, pcap))
        except MemoryError as e:
            raise MemoryError(f"node_capacity={ncap}, pool_capacity={pcap}: cannot allocate the "
                              f"initial arrays ({e})") from None
        self._sink = (EventSink(self._engine, self.page_size, self.is_eagle)
                      if self.enable_kv_cache_events else None)
        self._root = self._engine.root
        if self._sink is not None:
            self._sink.cleared()

    @property
    def lock(self):
        """The cache's ``threading.RLock``: hold it to make several calls one atomic
        step (e.g. ``match_prefix`` + ``inc_lock_ref``). See the class docstring."""
        return self._mutex

    # ------------------------------------------------------------------ setup
    @staticmethod
    def _policy_config(name, cfg):
        allowed = _POLICY_DEFAULTS.get(name, {})
        bad = set(cfg) - set(allowed)
        if bad:
            raise TypeError(f"eviction_policy_config: unknown keys {sorted(bad)} for policy "
                            f"{name!r} (allowed: {sorted(allowed)})")
        out = dict(allowed)
        out.update(cfg)
        for k, v in out.items():
            as_int(v, f"eviction_policy_config[{k!r}]")
        if name == "tlru" and not out["threshold"] >= 0:
            raise ValueError("eviction_policy_config['threshold'] must be >= 0")
        if name == "slru" and not out["protected_threshold"] >= 0:
            raise ValueError("eviction_policy_config['protected_threshold'] must be >= 0")
        return out

    # ------------------------------------------------------------------ request-path API
    # The request path (``requests.py``) uses the public API plus exactly these:
    # ``_mutex``, ``_vals`` (the ValueBridge), ``_key``, ``_insert_units`` and
    # ``_check_anchored``; each is documented where it is defined.

    def _key(self, key, name="key"):
        """``(units, aligned_len, ns_key, raw_tokens)`` of a RadixKey; changes nothing.

        ``units`` are the key's logical units (int64, bigram pairs packed in EAGLE
        trees), ``aligned_len`` their count aligned down to a page, ``ns_key`` the
        ``(extra_key, cache_salt)`` tuple: namespaces are compared as tuples, never
        concatenated (known_bugs B5). ``TypeError`` / ``ValueError`` naming ``name``.
        """
        if not isinstance(key, RadixKey):
            raise TypeError(f"{name} must be a flatradix.RadixKey, got {type(key).__name__}")
        if key.is_bigram and not self.is_eagle:
            raise ValueError(f"{name}: a bigram key given to a cache built with is_eagle=False "
                             "(bigram and plain keys cannot be mixed)")
        ek, salt = key.extra_key, key.cache_salt
        if ek is not None and type(ek) is not str:
            raise TypeError(f"{name}.extra_key must be a str or None, got {type(ek).__name__}")
        if salt is not None and type(salt) is not str:
            raise TypeError(f"{name}.cache_salt must be a str or None, got {type(salt).__name__}")
        units, raw = key_units(key, self.is_eagle, name)
        n = units.shape[0]
        n -= n % self.page_size
        return units, n, (ek, salt), raw

    def _insert_units(self, units, value, n, nk, prev, inserted_len, priority, limit, name,
                      want_path=False, keep_own=False):
        """One insert kernel call on validated arguments (shared by ``insert`` and the
        request path); executes its actions (duplicate frees, events).

        ``units``/``value``: int64, ``n`` page-aligned (> 0); ``limit``: the
        kernel's bound check (``VALUES_*`` or the allocator's bound). ``want_path``:
        the path's value is returned (a view valid until the next engine call;
        ``path[:prefix_len]`` are the tree's slots). ``keep_own`` (request path):
        duplicates equal to the tree's own slot at their position are not freed.
        Returns ``(prefix_len, target_id, freed, path)``; ``freed`` are the
        duplicate slots freed (what the caller frees without an allocator).
        Raises ``ValueError`` naming ``name`` for a bad KV index, nothing changed
        (a namespace first seen by this call is forgotten again).
        ``inserted_len`` beyond ``n`` is clamped to ``n`` (same hit accounting)."""
        if inserted_len > n:
            inserted_len = n
        if prev > n:
            prev = n
        eng = self._engine
        with self._mutex:
            ns = eng.ns.get(nk)
            new_ns = ns is None
            if new_ns:
                ns = eng.ns.intern(nk)
            if want_path:
                eng.ensure_out(2 * n)
            st, plen, target = eng.call(_k_insert, units, value, n, ns, inserted_len, priority,
                                        limit, prev, n if want_path else 0)
            if st == L.E_BAD_VALUE:
                if new_ns:
                    eng.ns.forget(nk)
                bad = int(value[plen])
                if bad < 0:
                    raise ValueError(f"{name}: KV indices must be >= 0, got {bad} at {plen}")
                raise ValueError(f"{name}: KV index {bad} at {plen} is outside the "
                                 f"allocator's pool (indices must be < {limit})")
            if new_ns and len(eng.ns.ids) > eng.ns.gc_at:
                # after the insert: a refused call changes nothing
                eng.gc_namespaces(self._sink.forget if self._sink is not None else None)
            freed = execute(eng.actions(), eng.out, value, self._vals, self._sink,
                            keep_own=keep_own)
            path = eng.out[:n] if want_path else None
        return plen, target, freed, path

    def _check_anchored(self, node, name):
        """Raise (before any change) unless ``dec_lock_ref(node)`` would succeed:
        ``NodeAccessError`` for a stale id, ``LockRefError`` when no lock is
        anchored on the node. O(1): a lock anchored on a node implies lock_ref >= 1
        on its whole path (each parent counts its children's locks). Returns the id."""
        nid = as_node_id(node, name)
        if self.disable:
            return nid
        nodes = self._engine.st.nodes
        s = int(_k_resolve(nodes, self._engine.meta, nid))
        if s < 0:
            raise self._stale(nid, name)
        if s != L.ROOT and nodes[s, L.FULL_LOCK] - nodes[s, L.CHILD_LOCK] < 1:
            raise LockRefError(f"{name}={nid} holds no lock to release (lock_ref="
                               f"{int(nodes[s, L.FULL_LOCK])}, all of it held by locks on "
                               "its descendants)")
        return nid

    def _stale(self, nid, name="node"):
        return NodeAccessError(f"{name}: node id {nid} does not name a live node "
                               "(evicted, split away, from before reset(), or never issued)")

    # ------------------------------------------------------------------ match
    def _empty_match(self):
        r = self._root
        return _tuple_new(MatchResult, (self._vals.empty(), r, r, r, 0, 0, 0, None,
                                        0, None, 0, None, None, None))

    def match_prefix(self, params):
        """Longest cached prefix of ``params.key`` (a ``MatchPrefixParams`` or a ``RadixKey``).

        Returns a ``MatchResult``; ``device_indices`` is int64 1-D of length
        ``device_prefix_len`` (page-aligned). May split a node so the match ends on
        a node boundary; refreshes recency of the matched path. O(len(key)).
        Raises ``TypeError``/``ValueError`` for a malformed key (tree unchanged).
        """
        key = params.key if type(params) is MatchPrefixParams else params
        units, n, nk, _ = self._key(key, "params.key")
        eng = self._engine
        ns = eng.ns.get(nk)
        if self.disable or n == 0 or ns is None:  # an unseen namespace caches nothing
            return self._empty_match()
        # The result array is allocated here, at the key's length, and the kernel
        # writes the matched indices straight into it (no scratch + copy).
        idx = np.empty(n, dtype=np.int64)
        with self._mutex:
            st, plen, best, visited = eng.call_tree(_k_match, units, n, ns, idx)
        if plen < n:
            idx = idx[:plen]
        vis = None if visited < 0 else visited
        if self._vals.kind == "torch":
            idx = self._vals.out(idx)
        # tuple.__new__ skips the NamedTuple's Python-level __new__ (~0.4 µs)
        return _tuple_new(MatchResult, (idx, best, best, best, 0, plen, plen, vis,
                                        0, None, 0, None, None, None))

    # ------------------------------------------------------------------ insert
    def insert(self, params):
        """Insert ``params.key`` -> ``params.value`` (an ``InsertParams``).

        The key and value are page-aligned down (the unaligned tail stays the
        caller's). Returns ``InsertResult(prefix_len, ..., last_device_node)``.
        The slots ``value[prev_prefix_len:prefix_len]`` duplicate cached ones:
        they are freed through the allocator when one is attached, else returned
        in ``duplicate_indices``. O(len(key)).

        A key that is empty after page alignment (shorter than a page) is a
        no-op: nothing is touched (SGLang touches the root's recency, which
        nothing reads), ``prefix_len == 0``, ``last_device_node`` is the root
        and the value stays the caller's. ``prev_prefix_len`` and ``inserted_len``
        beyond the key's length mean "all of it" (any int >= 0 is accepted).

        Raises ``TypeError``/``ValueError`` naming the argument for a malformed
        key or value (wrong type, dtype, shape or length, negative or
        out-of-range KV index; with flatradix's allocator attached, a slot it has
        not handed out: free, slot 0, or given twice) before anything changes.
        """
        if not isinstance(params, InsertParams):
            raise TypeError(f"params must be a flatradix.InsertParams, got {type(params).__name__}")
        units, n, nk, raw = self._key(params.key, "params.key")
        prev = as_count(params.prev_prefix_len, "params.prev_prefix_len")
        inserted_len = as_count(params.inserted_len, "params.inserted_len")
        priority = as_int(params.priority if params.priority is not None else 0, "params.priority")
        if params.mamba_value is not None:
            raise ValueError("params.mamba_value given, but this cache has no Mamba component")
        nlog = units.shape[0]
        if params.value is None:
            value = raw[:nlog].astype(np.int64) if raw.dtype != np.int64 else raw[:nlog]
            value = np.ascontiguousarray(value)
            name = "params.value is None, so the token ids are the KV indices"
            # without an allocator the token ids are values as they are; with one they
            # must be slots of its pool like any value (evicting them frees them there)
            limit = (L.VALUES_UNCHECKED if self.token_to_kv_pool_allocator is None
                     else self._vals.kv_bound())
        else:
            value = as_int64(params.value, "params.value")
            bigram = params.key.is_bigram or self.is_eagle
            ok = value.shape[0] == nlog or (bigram and value.shape[0] == raw.shape[0])
            if not ok:
                raise ValueError(f"params.value has {value.shape[0]} entries but params.key has "
                                 f"{nlog} logical units")
            name = "params.value"
            limit = self._vals.kv_bound()  # checked by the kernel, before anything changes
        if self.disable:
            return InsertResult(prefix_len=0)
        if n == 0:  # documented no-op (see above): no namespace, no clock tick
            if limit != L.VALUES_UNCHECKED and value.shape[0] and (
                    value.min() < 0 or (limit >= 0 and value.max() >= limit)):
                bound = f"[0, {limit})" if limit >= 0 else ">= 0"
                raise ValueError(f"{name}: KV indices must be in {bound}")
            dup_out = None if self.token_to_kv_pool_allocator is not None else self._vals.empty()
            return InsertResult(prefix_len=0, last_device_node=self._root, duplicate_indices=dup_out,
                                mamba_exist=True)  # adopted_ranges None, as SGLang's empty key
        if limit != L.VALUES_UNCHECKED and self._vals.check_held(value, name):
            # flatradix's allocator: every slot is held (allocated, in 1..size, not
            # given twice), which implies the kernel's bound check: skip that pass
            limit = L.VALUES_UNCHECKED
        plen, target, dup, _ = self._insert_units(units, value, n, nk, prev, inserted_len,
                                                  priority, limit, name)
        if params.value is not None:
            self._vals.note_kind(params.value)
        dup_out = None if self.token_to_kv_pool_allocator is not None else self._vals.out(dup)
        adopted = None
        if params.track_adopted_ranges:
            # only components that adopted something appear (SGLang: {} when none)
            adopted = {ComponentType.FULL: [(plen, n)]} if n > plen else {}
        return InsertResult(prefix_len=plen, last_device_node=target, adopted_ranges=adopted,
                            duplicate_indices=dup_out, mamba_exist=(n == 0))

    # ------------------------------------------------------------------ evict
    def evict(self, params):
        """Evict least-priority unlocked leaves until ``num_tokens`` units are freed.

        ``params``: ``EvictParams`` or an int. Freed KV indices go to the allocator
        (or ``EvictResult.evicted_indices`` without one). Node-granular: may free
        more than asked. Cost O(evicted nodes * log leaves), independent of the
        tree's size. Asking for more than is evictable evicts every evictable
        leaf and returns what that freed (never an error; counts above 2**62,
        e.g. 2**63, are clamped). Raises ``TypeError`` for a non-int count and
        ``ValueError`` for a negative one, before anything changes.
        ``swa_num_tokens`` / ``mamba_num`` are validated the same way and
        ignored (no such component).
        """
        if isinstance(params, EvictParams):
            num = as_count(params.num_tokens, "params.num_tokens")
            if params.swa_num_tokens != 0 or params.mamba_num != 0:
                as_count(params.swa_num_tokens, "params.swa_num_tokens")
                as_count(params.mamba_num, "params.mamba_num")
        elif isinstance(params, (int, np.integer)) and not isinstance(params, bool):
            num = as_count(params, "params.num_tokens")
        else:
            raise TypeError(f"params must be an EvictParams or an int (params.num_tokens), got "
                            f"{type(params).__name__}")
        if num > _COUNT_CLAMP:
            num = _COUNT_CLAMP
        no_alloc = self.token_to_kv_pool_allocator is None
        if self.disable or num == 0:
            return EvictResult(0, 0, 0, self._vals.empty() if no_alloc else None)
        eng = self._engine
        parts = []
        with self._mutex:
            done = 0
            while True:
                st, freed = _k_evict(*eng.st, num - done, eng.out, eng.acts)
                done += freed
                parts.append(execute(eng.actions(), eng.out, None, self._vals, self._sink))
                if st == L.OK:
                    break
                eng.grow()  # out / acts too small for the next victim: grow, go on
        if no_alloc:
            return EvictResult(done, 0, 0, self._vals.out(
                np.concatenate(parts) if len(parts) > 1 else parts[0]))
        return EvictResult(done, 0, 0, None)

    def evict_device_start(self, component=ComponentType.FULL, num_tokens=0):
        """Open a step-wise eviction round of ``num_tokens`` units for ``component``.

        Raises ``RuntimeError("device eviction already in progress")`` when one is open,
        ``ValueError`` for a component that is not configured or a negative count,
        ``TypeError`` for a non-int count. Counts above 2**62 are clamped (the round
        then runs until nothing evictable is left).
        """
        c = self._check_component(component)
        num = min(as_count(num_tokens, "num_tokens"), _COUNT_CLAMP)
        with self._mutex:
            if _k_evict_start(self._engine.meta, c, num) != L.OK:
                raise RuntimeError("device eviction already in progress")

    def evict_device_next_node(self, component=ComponentType.FULL):
        """Evict the next leaf of the open round; returns an ``EvictStep``.

        The step's ``freed_indices`` are *not* freed by the cache: the controller
        frees them (SGLang's "tree decides, cache executes"). ``node_id is None``
        ends the round (request met, or nothing evictable).
        """
        c = self._check_component(component)
        eng = self._engine
        with self._mutex:
            st, nid, n = eng.call(_k_evict_next, c)
            if st == L.E_NO_WALK:
                raise RuntimeError("no device eviction in progress: call evict_device_start first")
            # the controller frees the step's slots: execute the events only
            freed = execute(eng.actions(), eng.out, None, _NO_FREE, self._sink)
        if nid < 0:
            return EvictStep(None, self._vals.empty(), 0, False)
        return EvictStep(int(nid), self._vals.out(freed), int(n), True)

    def evict_device_end(self, component=ComponentType.FULL):
        """Close the open round (idempotent); returns the units it evicted."""
        c = self._check_component(component)
        with self._mutex:
            return int(_k_evict_end(self._engine.meta, c))

    def evict_for_alloc(self, num_tokens):
        """Evict until the allocator has ``num_tokens`` free slots (or nothing is left).

        Needs an allocator with ``available_size()``. Returns the units evicted
        (0 when enough are free already; a request beyond what eviction can
        free evicts everything evictable, never an error). The check and the
        eviction run under the cache's lock (other threads' frees through the
        cache cannot interleave).
        """
        num = as_count(num_tokens, "num_tokens")
        alloc = self.token_to_kv_pool_allocator
        if alloc is None:
            raise ValueError("evict_for_alloc needs a token_to_kv_pool_allocator")
        with self._mutex:
            short = num - alloc.available_size()
            if short <= 0:
                return 0
            return self.evict(EvictParams(num_tokens=short)).num_tokens_evicted

    def _check_component(self, component):
        c = _component(component)
        if c not in self.components:
            raise ValueError(f"component {component!r} is not configured")
        return int(c)

    # ------------------------------------------------------------------ locks
    def inc_lock_ref(self, node, skip_lock_components=()):
        """Lock the path root -> ``node`` against eviction; returns the receipt.

        ``IncLockRefResult.delta``: units moved evictable -> protected. Locking the
        root is a no-op. ``skip_lock_components``: ComponentTypes not to lock
        (SWA / Mamba: nothing to skip here; FULL cannot be skipped: ``ValueError``).
        Raises ``NodeAccessError`` for a stale or never-issued id, ``TypeError``
        for a non-int id; the tree is unchanged then. O(depth).
        """
        nid = as_node_id(node, "node")
        skip = skip_lock_components
        if not (type(skip) is tuple and not skip):
            skip = self._skip_components(skip)
        if self.disable:
            return IncLockRefResult(0, nid, skip)
        st_ = self._engine.st
        with self._mutex:
            st, delta = _k_inc(st_.nodes, st_.heap, st_.meta, nid, 0)
        if st == L.E_STALE:
            raise self._stale(nid)
        return IncLockRefResult(delta, nid, skip)

    @staticmethod
    def _skip_components(skip):
        if isinstance(skip, (str, bytes)) or not hasattr(skip, "__iter__"):
            raise TypeError("skip_lock_components must be a tuple of ComponentType, got "
                            f"{type(skip).__name__}")
        out = tuple(_component(c, "skip_lock_components") for c in skip)
        if ComponentType.FULL in out:
            raise ValueError("skip_lock_components: FULL cannot be skipped (Full-only cache)")
        return out

    def dec_lock_ref(self, node, receipt=None, skip_swa=False):
        """Release a lock taken by ``inc_lock_ref(node)``; returns ``DecLockRefResult``.

        ``receipt`` (the ``IncLockRefResult`` or its ``to_dec_params()``) is optional
        for Full-only caches; when given it must be anchored on ``node``. Raises
        ``LockRefError`` (a ValueError) when the release would take a lock_ref below
        zero (unlock without lock, double unlock) and ``NodeAccessError`` for a stale
        id; the tree is unchanged then. ``TypeError`` for a non-int id or a receipt
        without ``node_id``. O(depth).
        """
        nid = as_node_id(node, "node")
        if skip_swa is not False:
            as_flag(skip_swa, "skip_swa")  # no SWA component: validated, then nothing to skip
        if receipt is not None:
            if not hasattr(receipt, "node_id"):
                raise TypeError("receipt must be the IncLockRefResult of inc_lock_ref (or its "
                                f"to_dec_params()), got {type(receipt).__name__}")
            anchor = receipt.node_id
            if anchor is not None and anchor != nid:
                raise LockRefError(f"lock receipt anchored on node {anchor} released on node {nid}")
        if self.disable:
            return DecLockRefResult()
        st_ = self._engine.st
        with self._mutex:
            st, delta = _k_dec(st_.nodes, st_.heap, st_.meta, nid, 0)
            if st == L.E_NOT_ANCHORED:
                slot = int(delta)
                raise LockRefError(f"no lock is anchored at node {nid}: its lock_ref="
                                   f"{int(st_.nodes[slot, L.FULL_LOCK])} is held by locks on its "
                                   "descendants (release the node that was locked)")
            if st == L.E_LOCK_UNDERFLOW:
                slot = int(delta)
                bad = node_id(st_.nodes, slot)
                raise LockRefError(f"FULL segment release hit lock_ref=0 on node {bad} "
                                   f"(releasing node {nid}: unlock without lock, or twice)")
        if st == L.E_STALE:
            raise self._stale(nid)
        return DecLockRefResult()

    # ------------------------------------------------------------------ sizes
    def evictable_size(self):
        """Full units held by unlocked nodes."""
        return int(self._engine.meta[L.M_EVICTABLE + L.FULL])

    def protected_size(self):
        """Full units held by locked nodes."""
        return int(self._engine.meta[L.M_PROTECTED + L.FULL])

    full_evictable_size = evictable_size
    full_protected_size = protected_size

    def component_evictable_size(self, component):
        """Units held by unlocked nodes for ``component`` (0 for SWA / Mamba).
        ``ValueError`` naming ``component`` when it is not a ComponentType."""
        return int(self._engine.meta[L.M_EVICTABLE + int(_component(component))])

    def component_protected_size(self, component):
        """Units held by locked nodes for ``component`` (0 for SWA / Mamba)."""
        return int(self._engine.meta[L.M_PROTECTED + int(_component(component))])

    def swa_evictable_size(self):
        return 0

    swa_protected_size = mamba_evictable_size = mamba_protected_size = swa_evictable_size

    def total_size(self):
        """``(full_units, aux_units)`` held on device (aux is 0 for Full-only)."""
        return int(self._engine.meta[L.M_TOTAL + L.FULL]), 0

    def node_count(self):
        """Live nodes, root excluded."""
        return int(self._engine.meta[L.M_NLIVE]) - 1

    def available_and_evictable_str(self):
        alloc = self.token_to_kv_pool_allocator
        avail = alloc.available_size() if alloc is not None else 0
        ev = self.evictable_size()
        return (f"Available full tokens: {avail + ev} (available: {avail} + evictable: {ev})\n")

    def supports_swa(self):
        return False

    def supports_mamba(self):
        return False

    def supports_prefix_sharing(self):
        return not self.disable

    @property
    def sliding_window_size(self):
        return None

    # ------------------------------------------------------------------ nodes
    def root_node_handle(self, extra_key=None):
        """NodeId of the root (one root for all namespaces; a new id after ``reset()``)."""
        return self._root

    def is_root(self, node):
        """Whether ``node`` is the current root's id (False for any other int, stale or
        never issued); ``TypeError`` for a non-int."""
        try:
            return as_node_id(node) == self._root
        except NodeAccessError:  # outside int64: never issued
            return False

    def _slot(self, node, name="node"):
        nid = as_node_id(node, name)
        s = int(_k_resolve(self._engine.st.nodes, self._engine.meta, nid))
        if s < 0:
            raise self._stale(nid, name)
        return s

    def path_device_indices(self, node):
        """KV indices on the path root -> ``node`` (int64, 1-D). ``NodeAccessError`` if stale."""
        nid = as_node_id(node, "node")
        eng = self._engine
        with self._mutex:
            st, n = _k_path(eng.st.nodes, eng.st.pool, eng.meta, nid, eng.out)
            if st == L.E_CAPACITY:
                eng.ensure_out(n)
                st, n = _k_path(eng.st.nodes, eng.st.pool, eng.meta, nid, eng.out)
            if st == L.E_STALE:
                raise self._stale(nid)
            return self._vals.out(eng.out[:n].copy())

    def node_info(self, node):
        """Debug view of one node: dict of its fields (key units, value, lock_ref, ...).
        O(len(node)): copies its key and value."""
        with self._mutex:
            return inspection.node_info(self._engine, self._slot(node), as_node_id(node))

    def all_values_flatten(self):
        """Every non-root node's Full device value, concatenated in DFS order."""
        with self._mutex:
            flat = inspection.all_values_flatten(self._engine)
        return self._vals.out(flat)

    def pretty_print(self, file=None):
        """Print one line per node in DFS order (format informative only) to ``file``
        (a text stream with ``write``; ``None``: stdout). Changes nothing."""
        if file is not None and not callable(getattr(file, "write", None)):
            raise TypeError(f"file must be a text stream with write() or None, got "
                            f"{type(file).__name__}")
        with self._mutex:
            lines = inspection.pretty_lines(self._engine)
            lines.append(f"#tokens: {self.total_size()[0]}, evictable: {self.evictable_size()}, "
                         f"protected: {self.protected_size()}")
        print("\n".join(lines), file=file)

    def sanity_check(self):
        """Recompute every invariant (tree links, child table, lock counts, the
        evictable-leaf heap, size ledgers incl. evictable + protected == total,
        free lists, pool accounting) in one kernel. Raises ``CacheInvariantError``
        (an ``AssertionError``) naming the failed check and node. O(tree)."""
        with self._mutex:
            code, slot = _k_check(*self._engine.st)
            if code != 0:
                from .kernels import check

                nid = None if slot < 0 else node_id(self._engine.st.nodes, int(slot))
                raise CacheInvariantError(
                    f"Sanity check FAILED: code {int(code)} on node {nid} "
                    f"(see flatradix.kernels.check: {check.__doc__.split(chr(10))[0]})")

    def reset(self):
        """Drop the whole tree; every old node id goes stale and the root gets a new id.
        Closes any open step-wise eviction round. O(nodes).

        As SGLang's ``reset``: the tree's KV slots are not given back to the
        allocator (clear it too, as SGLang's ``flush_cache`` does), and locks held
        by running requests go stale (releasing them raises ``NodeAccessError``)."""
        with self._mutex:
            self._root = self._engine.reset()
            if self._sink is not None:
                self._sink.cleared()

    # ------------------------------------------------------------------ events
    def take_events(self):
        """Return and clear the queued KV events (oldest first); ``[]`` when events
        are off. Stores of chained pages and consecutive removals are merged as
        SGLang does."""
        if self._sink is None:
            return []
        with self._mutex:
            return self._sink.take()

    def block_hashes(self):
        """Event block hashes of every page cached on device (KV events on), as a set.
        What a router that applied every event so far believes is cached."""
        if self._sink is None:
            raise ValueError("block_hashes() needs enable_kv_cache_events=True")
        with self._mutex:
            return self._sink.block_hashes()

    # ------------------------------------------------------------------ tests
    def _snapshot(self):
        """Copy of the whole state, for "unchanged after an error" tests."""
        with self._mutex:
            return self._engine.snapshot()


class _NoFree:
    """A value bridge that frees nothing (step-wise eviction: the controller frees)."""

    @staticmethod
    def free(idx):
        pass


_NO_FREE = _NoFree()
