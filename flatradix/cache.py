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
from ._cast import as_count, as_flag, as_int, as_int64, as_node_id, is_torch, key_units
from .errors import CacheInvariantError, LockRefError, NodeAccessError
from .kernels import layout as L
from .kernels.check import sanity_check as _k_check
from .kernels.children import rebuild_children as _k_rebuild_children
from .kernels.evict import evict as _k_evict
from .kernels.evict import evict_end as _k_evict_end
from .kernels.evict import evict_next as _k_evict_next
from .kernels.evict import evict_start as _k_evict_start
from .kernels.hashing import hash_node as _k_hash_node
from .kernels.insert import insert as _k_insert
from .kernels.lock import dec_lock_ref as _k_dec
from .kernels.lock import inc_lock_ref as _k_inc
from .kernels.match import match_prefix as _k_match
from .kernels.query import path_device_indices as _k_path
from .kernels.query import resolve_slot as _k_resolve
from .kernels.state import compact_pool as _k_compact
from .kernels.state import reset_tree as _k_reset
from .requests import RequestCachingMixin
from .types import (
    ComponentType, DecLockRefResult, EvictParams, EvictResult, EvictStep,
    IncLockRefResult, InsertParams, InsertResult, MatchPrefixParams, MatchResult,
    RadixKey,
)

_EMPTY = np.empty(0, dtype=np.int64)
#: initial length of the output scratch ``_out`` (grown on demand by ``_ensure_out``)
_OUT_MIN = 1024
_tuple_new = tuple.__new__


def _aligned_zeros(rows, cols, align=64):
    """A zeroed C-contiguous int64 ``(rows, cols)`` array whose data starts on an
    ``align``-byte boundary (a view into a slightly larger buffer), so node-table
    rows (320 bytes) and child-table rows (32 bytes) never straddle cache lines
    more than their size needs (kernels/layout.py: column order)."""
    n = rows * cols
    buf = np.zeros(n + align // 8, dtype=np.int64)
    skip = (-buf.ctypes.data % align) // 8
    return buf[skip:skip + n].reshape(rows, cols)
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
    kv_event_lora_names : dict or flatradix.events.KvEventLoraNames, optional
        ``{extra_key: lora_name}`` (or ``{extra_key: (lora_name, lora_id)}``):
        stores of those ``extra_key`` namespaces carry ``lora_name`` / ``lora_id``,
        the name a router is queried with (SGLang's cache parameter of that
        name). A dict is copied; a ``KvEventLoraNames`` is used live. Hashes do
        not depend on it. Needs msgspec.
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
                 enable_kv_cache_events=False, node_capacity=1024, pool_capacity=1 << 16,
                 kv_event_lora_names=None):
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
        if kv_event_lora_names is not None:
            from .events import lora_name_table  # TypeError / ValueError naming the argument

            kv_event_lora_names = lora_name_table(kv_event_lora_names, "kv_event_lora_names")
        self.kv_event_lora_names = kv_event_lora_names
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.req_to_token_pool = req_to_token_pool
        self.device = device
        self.is_eagle = as_flag(is_eagle, "is_eagle")
        self.disable = as_flag(disable, "disable")
        self.enable_kv_cache_events = (as_flag(enable_kv_cache_events, "enable_kv_cache_events")
                                       and not self.disable)
        self._events = []
        self._seeds = {}
        if self.enable_kv_cache_events:
            from . import events as _events  # msgspec is needed only with events on

            self._ev = _events
            self._hmsg = np.zeros(self.page_size * 16 + 128, dtype=np.uint8)
            self._hstate = np.zeros(8, dtype=np.uint64)
            self._hw = np.zeros(64, dtype=np.uint64)
        self._lock = threading.RLock()
        self._ns = {(None, None): 0}  # (extra_key, cache_salt) -> namespace id
        self._ns_next = 1
        self._ns_gc_at = 1024
        self._kind = getattr(token_to_kv_pool_allocator, "index_kind", None)
        if self._kind is None and token_to_kv_pool_allocator is not None:
            self._kind = "torch"  # SGLang's allocators hold torch tensors
        self._torch_device = None
        try:
            self._alloc_arrays(max(4, ncap), max(64, pcap))
        except MemoryError as e:
            raise MemoryError(f"node_capacity={ncap}, pool_capacity={pcap}: cannot allocate the "
                              f"initial arrays ({e})") from None
        self._root = int(_k_reset(self._nodes, self._ctab, self._meta))
        self._queue_event_cleared()

    @property
    def lock(self):
        """The cache's ``threading.RLock``: hold it to make several calls one atomic
        step (e.g. ``match_prefix`` + ``inc_lock_ref``). See the class docstring."""
        return self._lock

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

    def _alloc_arrays(self, ncap, pcap):
        self._nodes = _aligned_zeros(ncap, L.NCOL)
        self._heap = np.full(ncap, -1, dtype=np.int64)
        self._ctab = _aligned_zeros(self._ct_capacity_for(ncap), L.CT_NCOL)
        self._pool = np.zeros((pcap, self._pool_ncol()), dtype=np.int64)
        self._out = np.zeros(_OUT_MIN, dtype=np.int64)  # grown per call (_ensure_out)
        self._spans = np.zeros((ncap if self.enable_kv_cache_events else 0, 2), dtype=np.int64)
        meta = np.zeros(L.META_LEN, dtype=np.int64)
        meta[L.M_EVENTS] = int(self.enable_kv_cache_events)
        meta[L.M_BIGRAM] = int(self.is_eagle)
        meta[L.M_CLOCK] = L.TICK
        meta[L.M_PAGE] = self.page_size
        meta[L.M_POLICY] = L.POLICY_NAMES.index(self.eviction_policy)
        if self.eviction_policy == "slru":
            meta[L.M_POLICY_A] = self._policy_cfg["protected_threshold"]
        elif self.eviction_policy == "tlru":
            meta[L.M_POLICY_A] = self._policy_cfg["threshold"]
            meta[L.M_POLICY_B] = self._policy_cfg["next_prompt_estimate"]
        self._meta = meta

    def _pool_ncol(self):
        return L.POOL_NCOL_EVENTS if self.enable_kv_cache_events else L.POOL_NCOL

    @staticmethod
    def _ct_capacity_for(nslots):
        cap = 16
        while cap * L.CT_MAX_LOAD < nslots + 2:
            cap *= 2
        return cap

    def _grow(self, units_needed):
        """Make room for one operation: 2 node slots, ``units_needed`` pool rows,
        2 child-table entries (a rebuild purges tombstones). Doubles arrays
        (amortised O(1)); called only after a kernel answered E_CAPACITY, so the hot
        path pays nothing."""
        meta = self._meta
        ncap = self._nodes.shape[0]
        if meta[L.M_NFREE] + ncap - meta[L.M_HWM] < 2:
            new = _aligned_zeros(ncap * 2, L.NCOL)
            new[:ncap] = self._nodes
            self._nodes = new
            heap = np.full(ncap * 2, -1, dtype=np.int64)
            heap[:ncap] = self._heap
            self._heap = heap
            if self.enable_kv_cache_events:
                self._spans = np.zeros((ncap * 2, 2), dtype=np.int64)
        ccap = self._ctab.shape[0]
        # headroom: after a rebuild live entries fill at most ~2/3 of the allowed
        # load, so the next rebuild is >= cap/5 operations away (amortised O(1))
        need_ct = self._ct_capacity_for(int(meta[L.M_NLIVE]) * 3 // 2 + 2)
        if (need_ct > ccap or (meta[L.M_CT_LIVE] + meta[L.M_CT_TOMB] + 2) * L.CT_LOAD_DEN
                > ccap * L.CT_LOAD_NUM):
            self._ctab = _aligned_zeros(max(need_ct, ccap), L.CT_NCOL)
            self._ctab[:, L.CT_CHILD] = L.CT_EMPTY
            _k_rebuild_children(self._nodes, self._ctab, self._pool, meta)
        pcap = self._pool.shape[0]
        top = int(meta[L.M_POOL_TOP])
        if top + units_needed > pcap:
            live = top - int(meta[L.M_POOL_DEAD])
            new_cap = pcap
            while live + units_needed > new_cap // 2 and live + units_needed > new_cap - new_cap // 4:
                new_cap *= 2
            new_pool = np.zeros((new_cap, self._pool_ncol()), dtype=np.int64)
            _k_compact(self._nodes, self._pool, new_pool, meta)
            self._pool = new_pool

    def _ensure_out(self, n):
        """Make the output scratch ``_out`` hold at least ``n`` indices.

        ``_out`` is sized by what calls need (a key's length, an eviction's
        victims), never by the pool: it doubles on demand, so it stays small."""
        if self._out.shape[0] < n:
            self._out = np.empty(max(n, 2 * self._out.shape[0]), dtype=np.int64)

    # ------------------------------------------------------------------ casting
    def _intern_ns(self, nk):
        """Namespace id of ``(extra_key, cache_salt)``, creating it (after validation).

        Ids come from a counter and are never reused, so a match that looked an id
        up without the lock can at worst miss (the namespace was dropped and
        re-interned meanwhile), never see another namespace's nodes. Entries no
        live node uses are dropped once the map reaches ``_ns_gc_at`` (O(slots),
        amortised O(1) per new namespace; ``_insert_core`` runs it after a
        successful insert), so per-request salts do not grow it without bound.
        Caller holds the lock."""
        ns = self._ns.get(nk)
        if ns is None:
            ns = self._ns_next
            self._ns_next += 1
            self._ns[nk] = ns
        return ns

    def _gc_namespaces(self):
        """Drop the namespaces no live node is in (their ids are never reissued)."""
        used = set(np.unique(self._nodes[self._live_slots(), L.NS]).tolist())
        used.add(0)
        for nk, ns in list(self._ns.items()):
            if ns not in used:
                del self._ns[nk]
                self._seeds.pop(nk, None)
        self._ns_gc_at = len(self._ns) + max(1024, len(self._ns), int(self._meta[L.M_HWM]) // 4)

    def _key(self, key, name="key"):
        """``(units, aligned_len, ns_key, raw_tokens)`` of a RadixKey; changes nothing.

        ``ns_key`` is the ``(extra_key, cache_salt)`` tuple: namespaces are compared
        as tuples, never concatenated (known_bugs B5).
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

    def _values_out(self, a):
        """Return int64 indices in the cache's index kind (copy of scratch data)."""
        if self._kind == "torch":
            import torch

            t = torch.from_numpy(a)
            if self._torch_device is not None:
                t = t.to(self._torch_device)
            return t
        return a

    def _kv_limit(self):
        """Exclusive upper bound of valid KV indices, from the allocator (None: no bound).
        SGLang's KV pools have ``size + page_size`` rows (slot 0 is padding)."""
        alloc = self.token_to_kv_pool_allocator
        size = getattr(alloc, "size", None)
        if size is None:
            return None
        return int(size) + int(getattr(alloc, "page_size", 1) or 1)

    def _note_kind(self, value):
        if self._kind is None:
            self._kind = "torch" if is_torch(value) else "numpy"
        if is_torch(value) and value.is_cuda:
            self._torch_device = value.device

    def _free_to_allocator(self, idx):
        alloc = self.token_to_kv_pool_allocator
        if alloc is None or idx.size == 0:
            return
        if getattr(alloc, "index_kind", "torch") == "numpy":
            alloc.free(idx)
        else:
            import torch

            t = torch.from_numpy(idx)
            dev = getattr(alloc, "device", "cpu")
            alloc.free(t.to(dev) if str(dev) != "cpu" else t)

    def _stale(self, nid, name="node"):
        return NodeAccessError(f"{name}: node id {nid} does not name a live node "
                               "(evicted, split away, from before reset(), or never issued)")

    # ------------------------------------------------------------------ match
    def _empty_match(self):
        r = self._root
        return _tuple_new(MatchResult, (self._values_out(_EMPTY.copy()), r, r, r, 0, 0, 0, None,
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
        ns = self._ns.get(nk)
        if self.disable or n == 0 or ns is None:  # an unseen namespace caches nothing
            return self._empty_match()
        # The result array is allocated here, at the key's length, and the kernel
        # writes the matched indices straight into it (no scratch + copy).
        idx = np.empty(n, dtype=np.int64)
        with self._lock:
            while True:
                st, plen, best, visited = _k_match(self._nodes, self._ctab, self._pool, self._heap,
                                                   self._meta, units, n, ns, idx)
                if st == L.OK:
                    break
                self._grow(0)
        if plen < n:
            idx = idx[:plen]
        vis = None if visited < 0 else visited
        if self._kind == "torch":
            idx = self._values_out(idx)
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
                     else self._kv_bound())
        else:
            value = as_int64(params.value, "params.value")
            bigram = params.key.is_bigram or self.is_eagle
            ok = value.shape[0] == nlog or (bigram and value.shape[0] == raw.shape[0])
            if not ok:
                raise ValueError(f"params.value has {value.shape[0]} entries but params.key has "
                                 f"{nlog} logical units")
            name = "params.value"
            limit = self._kv_bound()  # checked by the kernel, before anything changes
        if self.disable:
            return InsertResult(prefix_len=0)
        if n == 0:  # documented no-op (see above): no namespace, no clock tick
            if limit != L.VALUES_UNCHECKED and value.shape[0] and (
                    value.min() < 0 or (limit >= 0 and value.max() >= limit)):
                bound = f"[0, {limit})" if limit >= 0 else ">= 0"
                raise ValueError(f"{name}: KV indices must be in {bound}")
            dup_out = None if self.token_to_kv_pool_allocator is not None else self._values_out(
                _EMPTY.copy())
            return InsertResult(prefix_len=0, last_device_node=self._root, duplicate_indices=dup_out,
                                mamba_exist=True)  # adopted_ranges None, as SGLang's empty key
        if limit != L.VALUES_UNCHECKED and self._check_held(value, name):
            # flatradix's allocator: every slot is held (allocated, in 1..size, not
            # given twice), which implies the kernel's bound check: skip that pass
            limit = L.VALUES_UNCHECKED
        # empty out: plain insert does not need the cached prefix's indices
        plen, target, dup = self._insert_core(units, value, n, nk, prev, inserted_len, priority,
                                              limit, _EMPTY, name)
        if params.value is not None:
            self._note_kind(params.value)
        if self.token_to_kv_pool_allocator is not None:
            dup_out = None
        else:
            dup_out = self._values_out(dup)
        adopted = None
        if params.track_adopted_ranges:
            # only components that adopted something appear (SGLang: {} when none)
            adopted = {ComponentType.FULL: [(plen, n)]} if n > plen else {}
        return InsertResult(prefix_len=plen, last_device_node=target, adopted_ranges=adopted,
                            duplicate_indices=dup_out, mamba_exist=(n == 0))

    def _kv_bound(self):
        """``insert`` kernel's ``limit``: the allocator's bound, or VALUES_NONNEG."""
        limit = self._kv_limit()
        return L.VALUES_NONNEG if limit is None else limit

    def _insert_core(self, units, value, n, nk, prev, inserted_len, priority, limit, out, name,
                     keep_own=False):
        """One insert kernel call on validated arguments (shared by ``insert`` and the
        request path). Frees the duplicates ``value[prev:prefix_len]`` through the
        allocator when there is one. Returns ``(prefix_len, target_id, duplicates)``.
        ``keep_own`` (request path): duplicates equal to the tree's own slot at their
        position are not freed. Raises ``ValueError`` naming ``name`` for a bad KV
        index, nothing changed
        (a namespace first seen by this call is forgotten again). ``inserted_len``
        beyond ``n`` is clamped to ``n`` (same hit accounting; keeps it in int64)."""
        if inserted_len > n:
            inserted_len = n
        with self._lock:
            ns = self._ns.get(nk)
            new_ns = ns is None
            if new_ns:
                ns = self._intern_ns(nk)
            while True:
                st, plen, target = _k_insert(self._nodes, self._ctab, self._pool, self._heap,
                                             self._meta, units, value, n, ns, inserted_len,
                                             priority, limit, out)
                if st == L.OK:
                    break
                if st == L.E_BAD_VALUE:
                    if new_ns:
                        del self._ns[nk]
                    bad = int(value[plen])
                    if bad < 0:
                        raise ValueError(f"{name}: KV indices must be >= 0, got {bad} at {plen}")
                    raise ValueError(f"{name}: KV index {bad} at {plen} is outside the "
                                     f"allocator's pool (indices must be < {limit})")
                self._grow(n)
            if new_ns and len(self._ns) > self._ns_gc_at:
                self._gc_namespaces()  # after the insert: a refused call changes nothing
            if self.enable_kv_cache_events and n > plen:
                self._queue_event_stored(target, nk)
            dup = value[prev:plen].copy() if prev < plen else _EMPTY
            if self.token_to_kv_pool_allocator is not None:
                if keep_own and dup.size and out.shape[0] >= n:
                    # request path: never free the tree's own slot: a row entry equal to
                    # the cached slot at its position is the same KV, not a duplicate
                    # (a request released without prefix_indices / cache_protected_len;
                    # SGLang frees it and the tree then points at a free slot)
                    own = dup == out[prev:plen]
                    if own.any():
                        dup = dup[~own]
                self._free_to_allocator(dup)
        return plen, target, dup

    def _held_checked(self):
        """Whether ``_check_held`` checks slots: flatradix's allocator is attached."""
        return hasattr(self.token_to_kv_pool_allocator, "_first_unheld")

    def _check_held(self, value, name):
        """With flatradix's allocator attached: ``ValueError`` naming ``name`` unless
        every entry of ``value`` is a distinct slot the allocator has handed out
        (one kernel pass, O(len)). No check with other allocators. Returns whether
        the check applies (then every slot is also inside the allocator's bound)."""
        if not self._held_checked():
            return False
        if not value.shape[0]:
            return True
        code, i = self.token_to_kv_pool_allocator._first_unheld(value)
        if code == 1:
            raise ValueError(f"{name}: KV slot {int(value[i])} at {int(i)} is outside the "
                             "allocator's pool")
        if code == 2:
            raise ValueError(f"{name}: KV slot {int(value[i])} at {int(i)} is free in the "
                             "allocator (insert only slots it handed out)")
        if code == 3:
            raise ValueError(f"{name}: KV slot {int(value[i])} at {int(i)} appears twice")
        return True

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
        if self.disable or num == 0:
            return EvictResult(0, 0, 0, None if self.token_to_kv_pool_allocator else self._values_out(_EMPTY.copy()))
        with self._lock:
            st, nout, nspans = _k_evict(self._nodes, self._ctab, self._pool, self._heap,
                                        self._meta, num, self._out, self._spans)
            freed = self._out[:nout].copy()
            if nspans:
                self._queue_event_removed(nspans)
            if st != L.OK:  # _out too small for the next victim: grow, go on with the round
                parts = [freed]
                while st != L.OK:
                    self._ensure_out(2 * self._out.shape[0])
                    st, n2, nspans = _k_evict(self._nodes, self._ctab, self._pool, self._heap,
                                              self._meta, num - nout, self._out, self._spans)
                    parts.append(self._out[:n2].copy())
                    nout += n2
                    if nspans:
                        self._queue_event_removed(nspans)
                freed = np.concatenate(parts)
            if self.token_to_kv_pool_allocator is not None:
                self._free_to_allocator(freed)
                return EvictResult(int(nout), 0, 0, None)
        return EvictResult(int(nout), 0, 0, self._values_out(freed))

    def evict_device_start(self, component=ComponentType.FULL, num_tokens=0):
        """Open a step-wise eviction round of ``num_tokens`` units for ``component``.

        Raises ``RuntimeError("device eviction already in progress")`` when one is open,
        ``ValueError`` for a component that is not configured or a negative count,
        ``TypeError`` for a non-int count. Counts above 2**62 are clamped (the round
        then runs until nothing evictable is left).
        """
        self._check_component(component)
        num = min(as_count(num_tokens, "num_tokens"), _COUNT_CLAMP)
        with self._lock:
            if _k_evict_start(self._meta, num) != L.OK:
                raise RuntimeError("device eviction already in progress")

    def evict_device_next_node(self, component=ComponentType.FULL):
        """Evict the next leaf of the open round; returns an ``EvictStep``.

        The step's ``freed_indices`` are *not* freed by the cache: the controller
        frees them (SGLang's "tree decides, cache executes"). ``node_id is None``
        ends the round (request met, or nothing evictable).
        """
        self._check_component(component)
        with self._lock:
            while True:
                st, nid, nout, nspans = _k_evict_next(self._nodes, self._ctab, self._pool,
                                                      self._heap, self._meta, self._out, self._spans)
                if st != L.E_CAPACITY:
                    break
                self._ensure_out(nout)
            if st == L.E_NO_WALK:
                raise RuntimeError("no device eviction in progress: call evict_device_start first")
            freed = self._out[:nout].copy()
            if nspans:
                self._queue_event_removed(nspans)
        if nid < 0:
            return EvictStep(None, self._values_out(_EMPTY.copy()), 0, False)
        return EvictStep(int(nid), self._values_out(freed), int(nout), True)

    def evict_device_end(self, component=ComponentType.FULL):
        """Close the open round (idempotent); returns the units it evicted."""
        self._check_component(component)
        with self._lock:
            return int(_k_evict_end(self._meta))

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
        with self._lock:
            short = num - alloc.available_size()
            if short <= 0:
                return 0
            return self.evict(EvictParams(num_tokens=short)).num_tokens_evicted

    def _check_component(self, component):
        if _component(component) not in self.components:
            raise ValueError(f"component {component!r} is not configured")

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
        with self._lock:
            st, delta = _k_inc(self._nodes, self._heap, self._meta, nid)
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
        with self._lock:
            st, delta = _k_dec(self._nodes, self._heap, self._meta, nid)
            if st == L.E_NOT_ANCHORED:
                slot = int(delta)
                raise LockRefError(f"no lock is anchored at node {nid}: its lock_ref="
                                   f"{int(self._nodes[slot, L.FULL_LOCK])} is held by locks on its "
                                   "descendants (release the node that was locked)")
            if st == L.E_LOCK_UNDERFLOW:
                slot = int(delta)
                bad = (int(self._nodes[slot, L.GEN]) << 32) | slot
                raise LockRefError(f"FULL segment release hit lock_ref=0 on node {bad} "
                                   f"(releasing node {nid}: unlock without lock, or twice)")
        if st == L.E_STALE:
            raise self._stale(nid)
        return DecLockRefResult()

    # ------------------------------------------------------------------ sizes
    def evictable_size(self):
        """Full units held by unlocked nodes."""
        return int(self._meta[L.M_EVICTABLE + L.FULL])

    def protected_size(self):
        """Full units held by locked nodes."""
        return int(self._meta[L.M_PROTECTED + L.FULL])

    full_evictable_size = evictable_size
    full_protected_size = protected_size

    def component_evictable_size(self, component):
        """Units held by unlocked nodes for ``component`` (0 for SWA / Mamba).
        ``ValueError`` naming ``component`` when it is not a ComponentType."""
        return int(self._meta[L.M_EVICTABLE + int(_component(component))])

    def component_protected_size(self, component):
        """Units held by locked nodes for ``component`` (0 for SWA / Mamba)."""
        return int(self._meta[L.M_PROTECTED + int(_component(component))])

    def swa_evictable_size(self):
        return 0

    swa_protected_size = mamba_evictable_size = mamba_protected_size = swa_evictable_size

    def total_size(self):
        """``(full_units, aux_units)`` held on device (aux is 0 for Full-only)."""
        return int(self._meta[L.M_TOTAL + L.FULL]), 0

    def node_count(self):
        """Live nodes, root excluded."""
        return int(self._meta[L.M_NLIVE]) - 1

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
        s = int(_k_resolve(self._nodes, self._meta, nid))
        if s < 0:
            raise self._stale(nid, name)
        return s

    def _check_anchored(self, node, name):
        """Raise (before any change) unless ``dec_lock_ref(node)`` would succeed:
        ``NodeAccessError`` for a stale id, ``LockRefError`` when no lock is
        anchored on the node. O(1): a lock anchored on a node implies lock_ref >= 1
        on its whole path (each parent counts its children's locks)."""
        nid = as_node_id(node, name)
        if self.disable:
            return nid
        s = int(_k_resolve(self._nodes, self._meta, nid))
        if s < 0:
            raise self._stale(nid, name)
        if s != L.ROOT and self._nodes[s, L.FULL_LOCK] - self._nodes[s, L.CHILD_LOCK] < 1:
            raise LockRefError(f"{name}={nid} holds no lock to release (lock_ref="
                               f"{int(self._nodes[s, L.FULL_LOCK])}, all of it held by locks on "
                               "its descendants)")
        return nid

    def path_device_indices(self, node):
        """KV indices on the path root -> ``node`` (int64, 1-D). ``NodeAccessError`` if stale."""
        nid = as_node_id(node, "node")
        with self._lock:
            st, n = _k_path(self._nodes, self._pool, self._meta, nid, self._out)
            if st == L.E_CAPACITY:
                self._ensure_out(n)
                st, n = _k_path(self._nodes, self._pool, self._meta, nid, self._out)
            if st == L.E_STALE:
                raise self._stale(nid)
            return self._values_out(self._out[:n].copy())

    def node_info(self, node):
        """Debug view of one node: dict of its fields (key units, value, lock_ref, ...)."""
        with self._lock:
            s = self._slot(node)
            row = self._nodes[s]
            off, n = int(row[L.KEY_OFF]), int(row[L.KEY_LEN])
            parent = int(row[L.PARENT])
            return {
                "node_id": as_node_id(node),
                "parent": None if parent < 0 else (int(self._nodes[parent, L.GEN]) << 32) | parent,
                "key": self._pool[off:off + n, L.TOK].copy(),
                "value": self._pool[off:off + n, L.FULL_DEV].copy(),
                "lock_ref": int(row[L.FULL_LOCK]),
                "num_children": int(row[L.NCHILD]),
                "last_access": int(row[L.LAST_ACCESS]),
                "creation": int(row[L.CREATION]),
                "hit_count": int(row[L.HIT_COUNT]),
                "priority": int(row[L.PRIORITY]),
                "evictable_leaf": bool(row[L.HEAP_POS] >= 0),
            }

    def _live_slots(self):
        hwm = int(self._meta[L.M_HWM])
        alive = (self._nodes[:hwm, L.FLAGS] & L.F_ALIVE) != 0
        return np.nonzero(alive)[0]

    def all_values_flatten(self):
        """Every non-root node's Full device value, concatenated in DFS order."""
        with self._lock:
            parts = [self._pool[int(self._nodes[s, L.KEY_OFF]):
                                int(self._nodes[s, L.KEY_OFF] + self._nodes[s, L.KEY_LEN]), L.FULL_DEV]
                     for s, _ in self._dfs() if s != L.ROOT]
            flat = np.concatenate(parts) if parts else _EMPTY.copy()
        return self._values_out(flat)

    def _dfs(self):
        stack = [(L.ROOT, 0)]
        nodes = self._nodes
        while stack:
            s, depth = stack.pop()
            yield s, depth
            kids = []
            c = int(nodes[s, L.FIRST_CHILD])
            while c != L.NIL:
                kids.append(c)
                c = int(nodes[c, L.NEXT_SIB])
            for c in reversed(kids):
                stack.append((c, depth + 1))

    def pretty_print(self, file=None):
        """Print one line per node in DFS order (format informative only) to ``file``
        (a text stream with ``write``; ``None``: stdout). Changes nothing."""
        if file is not None and not callable(getattr(file, "write", None)):
            raise TypeError(f"file must be a text stream with write() or None, got "
                            f"{type(file).__name__}")
        lines = []
        with self._lock:
            for s, depth in self._dfs():
                row = self._nodes[s]
                nid = (int(row[L.GEN]) << 32) | s
                off, n = int(row[L.KEY_OFF]), int(row[L.KEY_LEN])
                head = self._pool[off:off + min(n, 8), L.TOK].tolist()
                lines.append(f"{'  ' * depth}[{nid}] len={n} key={head}{'...' if n > 8 else ''} "
                             f"full_lock={int(row[L.FULL_LOCK])} full=yes")
            lines.append(f"#tokens: {self.total_size()[0]}, evictable: {self.evictable_size()}, "
                         f"protected: {self.protected_size()}")
        print("\n".join(lines), file=file)

    def sanity_check(self):
        """Recompute every invariant (tree links, child table, lock counts, the
        evictable-leaf heap, size ledgers incl. evictable + protected == total,
        free lists, pool accounting) in one kernel. Raises ``CacheInvariantError``
        (an ``AssertionError``) naming the failed check and node. O(tree)."""
        with self._lock:
            code, slot = _k_check(self._nodes, self._ctab, self._pool, self._heap, self._meta)
        if code != 0:
            from .kernels import check

            nid = None if slot < 0 else (int(self._nodes[slot, L.GEN]) << 32) | int(slot)
            raise CacheInvariantError(f"Sanity check FAILED: code {int(code)} on node {nid} "
                                      f"(see flatradix.kernels.check: {check.__doc__.split(chr(10))[0]})")

    def reset(self):
        """Drop the whole tree; every old node id goes stale and the root gets a new id.
        Closes any open step-wise eviction round. O(nodes).

        As SGLang's ``reset``: the tree's KV slots are not given back to the
        allocator (clear it too, as SGLang's ``flush_cache`` does), and locks held
        by running requests go stale (releasing them raises ``NodeAccessError``)."""
        with self._lock:
            self._root = int(_k_reset(self._nodes, self._ctab, self._meta))
            self._queue_event_cleared()

    # ------------------------------------------------------------------ events
    def take_events(self):
        """Return and clear the queued KV events (oldest first); ``[]`` when events
        are off. Stores of chained pages and consecutive removals are merged as
        SGLang does."""
        with self._lock:
            out, self._events = self._events, []
        return out

    def _queue_event_cleared(self):
        if self.enable_kv_cache_events:
            self._ev.enqueue(self._events, self._ev.AllBlocksCleared())

    def _seed(self, nk):
        seed = self._seeds.get(nk)
        if seed is None:
            words = self._ev.namespace_seed(*nk)
            seed = (np.array(words if words else [0, 0, 0, 0], dtype=np.int64), words is not None)
            self._seeds[nk] = seed
        return seed

    def block_hashes(self):
        """Event block hashes of every page cached on device (KV events on), as a set.
        What a router that applied every event so far believes is cached."""
        if not self.enable_kv_cache_events:
            raise ValueError("block_hashes() needs enable_kv_cache_events=True")
        with self._lock:
            out = set()
            for s in self._live_slots():
                if s != L.ROOT:
                    out.update(self._page_hashes(int(self._nodes[s, L.KEY_OFF]),
                                                 int(self._nodes[s, L.KEY_LEN])))
            return out

    def _page_hashes(self, off, n):
        return self._pool[off:off + n:self.page_size, L.HASH0].tolist()

    def _queue_event_stored(self, nid, nk):
        seed, has_seed = self._seed(nk)
        _k_hash_node(self._nodes, self._pool, self._meta, nid, seed, has_seed,
                     self._hmsg, self._hstate, self._hw)
        s = nid & 0xFFFFFFFF
        off, n = int(self._nodes[s, L.KEY_OFF]), int(self._nodes[s, L.KEY_LEN])
        p = int(self._nodes[s, L.PARENT])
        parent_hash = None
        if p != L.ROOT:
            last = int(self._nodes[p, L.KEY_OFF] + self._nodes[p, L.KEY_LEN]) - self.page_size
            parent_hash = int(self._pool[last, L.HASH0])
        toks = self._pool[off:off + n, L.TOK]
        if self.is_eagle:
            token_ids = [[int(u) >> 32, int(u) & 0xFFFFFFFF] for u in toks]
        else:
            token_ids = toks.tolist()
        lora_name, lora_id = self._ev.lora_fields(self.kv_event_lora_names, nk[0])
        self._ev.enqueue(self._events, self._ev.BlockStored(
            block_hashes=self._page_hashes(off, n), parent_block_hash=parent_hash,
            token_ids=token_ids, block_size=self.page_size, lora_id=lora_id, medium="GPU",
            cache_salt=nk[1], lora_name=lora_name))

    def _queue_event_removed(self, nspans):
        for off, n in self._spans[:nspans].tolist():
            self._ev.enqueue(self._events, self._ev.BlockRemoved(
                block_hashes=self._page_hashes(off, n), medium="GPU"))

    # ------------------------------------------------------------------ tests
    def _snapshot(self):
        """Copy of the whole state, for "unchanged after an error" tests."""
        with self._lock:
            return {
                "nodes": self._nodes.copy(), "ctab": self._ctab.copy(), "pool": self._pool.copy(),
                "heap": self._heap.copy(), "meta": self._meta.copy(), "ns": dict(self._ns),
                "root": self._root,
            }
