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
from ._cast import as_flag, as_node_id, key_units
from .engine import Engine
from .errors import LockRefError, NodeAccessError, ReceiptError
from .event_sink import EventSink
from . import batch, device_api, eviction, insertion, views
from .batch import _plain_lock
from .config import FULL_ONLY, _component, validate
from .executor import Executor
from .kernels import layout as L
from .hicache import HostTier
from .requests import RequestCachingMixin, holds_state
from .values import ValueBridge
from .types import (
    ComponentType, DecLockRefParams, DecLockRefResult, EvictParams, IncLockRefResult,
    MatchPrefixParams, MatchResult, RadixKey, TreeLock,
)

_I64 = np.dtype(np.int64)
_DEFAULT_NS = (None, None)   # the namespace of a key without extra_key / cache_salt
_PLAIN_RECEIPTS = (IncLockRefResult, DecLockRefParams)
_tuple_new = tuple.__new__
_TRACK = 1  # core/insert.py: TRACK_ADOPTED
assert len(MatchResult._fields) == 14  # the positional tuples below build all 14 fields


class UnifiedRadixCache(RequestCachingMixin):
    """Prefix cache of KV indices keyed by token ids (SGLang 0.5.23 ``UnifiedRadixCache``).

    Parameters
    ----------
    page_size : int, >= 1
        Keys are aligned down to whole pages; nodes hold whole pages.
    components : tuple of ComponentType
        ``(FULL,)``, ``(FULL, SWA)``, ``(FULL, MAMBA)`` or ``(FULL, SWA, MAMBA)``
        (SGLang's order). ``tree_components`` is SGLang's keyword for it.
    sliding_window_size : int, keyword-only
        SWA only: the retain window ``W`` in tokens (>= 1), as SGLang's
        ``sliding_window_size``. A match needs ``W`` contiguous tokens with SWA
        data before its end; a running request's lock pins one window of SWA;
        fresh leaves are capped at ``ceil(W / page_size) * page_size`` tokens.
    eviction_policy : str
        One of ``lru, lfu, fifo, mru, filo, priority, slru, tlru`` (case-insensitive).
    eviction_policy_config : dict, optional
        ``slru``: ``protected_threshold`` (2); ``tlru``: ``threshold`` (0),
        ``next_prompt_estimate`` (0). Unknown keys raise ``TypeError``.
    token_to_kv_pool_allocator : optional
        Object with ``free(indices)`` (SGLang's or ``flatradix.TokenToKVPoolAllocator``).
        When given, duplicate and evicted KV indices are freed through it; when
        ``None`` they are returned in the results for the caller to free. SWA
        caches need an SWA allocator (``flatradix.SWATokenToKVPoolAllocator`` or
        SGLang's ``SWATokenToKVPoolAllocator``, duck-typed) with the cache's page
        size: the SWA pool's slots are freed through its Full -> SWA mapping.
    req_to_token_pool : optional
        Needed by ``cache_finished_req`` / ``cache_unfinished_req``. Mamba caches
        need one with a ``mamba_allocator`` (``alloc(n)``, ``free(indices)``,
        ``available_size()``): ``flatradix.HybridReqToTokenPool`` or SGLang's
        ``HybridReqToTokenPool``; evicted states are freed through it.
    mamba_cache_chunk_size : int, keyword-only
        Mamba only (default 64, SGLang's): tokens per Mamba checkpoint chunk; a
        match's ``mamba_branching_seqlen`` lies on the grid
        ``lcm(mamba_cache_chunk_size, page_size)``.
    enable_mamba_extra_buffer : bool, keyword-only
        Mamba only: the request pool keeps extra (ping-pong) state slots so a
        checkpoint can be cached at any chunk boundary. Without it only the
        sequence-end state exists and ``page_size`` must be 1 (SGLang's rule).
    enable_mamba_extra_buffer_lazy : bool, keyword-only
        Mamba with the extra buffer only (SGLang's ``--mamba-radix-cache-strategy
        extra_buffer_lazy``, a server-wide flag there): requests start with one
        track slot and the scheduler adds the second at a track boundary (see
        ``HybridReqToTokenPool``, which must be built alike: ``ValueError``).
        The cache's own difference: when a running request's checkpoint finds
        the state pool empty, the Mamba part of ``req.lock`` is released (and
        the receipt marks MAMBA skipped) before one state is evicted, so the
        request's matched state may be the one evicted (SGLang
        ``MambaComponent._alloc_mamba_slot``; not when the lock's SWA part was
        released early, which released its Mamba part already).
    mamba_max_states_per_path : int, keyword-only
        Mamba only: -1 (default, SGLang's ``--mamba-max-states-per-path``) keeps
        every state; ``c >= 1`` caps the states on a root-to-node path: after an
        insert attached a state, the shallowest states beyond ``c`` on its path
        are freed (their Full KV stays cached), sparing the inserted node,
        Mamba-locked nodes and nodes without exactly one child, so the cap is
        soft (SGLang ``MambaEvictExcessPathStates``). ``ValueError`` for 0 or
        below -1, or for a value other than -1 without Mamba.
    device_values : bool or None, keyword-only
        Where the KV indices live (``docs/device_values.md``). None (default):
        on the caller's device when they are device values -- the allocator's
        ``device`` is a non-CPU torch device (SGLang's allocators,
        ``flatradix.device.DeviceKVAllocator``), or the first value inserted is
        a CUDA / non-CPU torch tensor or a cupy array --, else in host memory.
        On the device (the device value arena) no call copies an index to the
        host: a match is one gather there, an insert one device copy, an
        eviction hands the allocator device arrays. True: the arena even for
        CPU tensors (tests); False: host memory always (a device value is
        copied to the host on insert and back on match). Full-attention caches
        (with or without the host tier); an SWA or Mamba cache keeps host values
        (``ValueError`` with True).
    debug_checks : bool, keyword-only
        Device values only: check every inserted index on the host before any
        change, as for host values (held by the allocator, in range, no
        duplicate): one device-to-host copy per call. Off (default): the range
        of each inserted index is checked on the device and an out-of-range one
        raises ``DeviceValueError`` at the next ``check_device_values()`` (also
        run by ``sanity_check()``), the caller's sync point.
    device : str or torch.device
        ``"cpu"`` (values live in host memory; CUDA tensors are accepted and
        returned on their device, with one copy each way), or ``"cuda"`` /
        ``"cuda:N"`` when torch sees a CUDA device (``ValueError`` otherwise).
    is_eagle : bool
        EAGLE bigram tree: every key is viewed as bigrams. A cache with the Mamba
        component is never a bigram tree (SGLang: bigram iff ``is_eagle`` and no
        Mamba), so ``cache.is_eagle`` is then False.
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
        ``pool_capacity`` (rows, one per cached token) defaults to twice the
        allocator's Full slots, at most 2**23 (``POOL_CAPACITY_AUTO_MAX``), or
        2**16 without an allocator: a cache sized for its KV pool never grows
        its pool for device tokens (a growth copies every live row at once);
        the rows of evicted nodes are reused in place (gap passes; an in-place
        compaction when the dead rows are too scattered).

    Bad input raises ``TypeError`` / ``ValueError`` naming the argument before
    anything changes (``docs/architecture.md``, "Bad input").

    Threads
    -------
    Every public method runs under one re-entrant lock, ``cache.mutex`` (a
    ``threading.RLock``), so calls from several threads are serialised and each
    is atomic; the Numba kernels hold the GIL while they run. Allocator frees
    happen under it too (lock order: cache, then allocator / request pool, which
    have their own locks). What one call cannot give, hold ``cache.mutex`` for
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

    def __init__(self, page_size=1, components=FULL_ONLY, eviction_policy="lru",
                 token_to_kv_pool_allocator=None, req_to_token_pool=None, device="cpu",
                 is_eagle=False, eviction_policy_config=None, disable=False,
                 enable_kv_cache_events=False, node_capacity=1024, pool_capacity=None,
                 kv_event_lora_names=None, *, tree_components=None, sliding_window_size=None,
                 mamba_cache_chunk_size=64, enable_mamba_extra_buffer=False,
                 mamba_max_states_per_path=-1, enable_mamba_extra_buffer_lazy=False,
                 device_values=None, debug_checks=False):
        ncap, pcap, kv_event_lora_names = validate(
            self, page_size, components, eviction_policy, token_to_kv_pool_allocator,
            req_to_token_pool, device, is_eagle, eviction_policy_config, disable, node_capacity,
            pool_capacity, kv_event_lora_names, tree_components, sliding_window_size,
            mamba_cache_chunk_size, enable_mamba_extra_buffer, mamba_max_states_per_path,
            enable_mamba_extra_buffer_lazy)
        self.kv_event_lora_names = kv_event_lora_names
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.req_to_token_pool = req_to_token_pool
        self.device = device
        # a Mamba tree is never a bigram tree (SGLang: bigram iff is_eagle and no Mamba)
        self.is_eagle = as_flag(is_eagle, "is_eagle") and not self._mamba
        self.disable = as_flag(disable, "disable")
        self.enable_kv_cache_events = (as_flag(enable_kv_cache_events, "enable_kv_cache_events")
                                       and not self.disable)
        # a Full-only cache: lock / unlock take their short path (no receipt parts)
        # while it is enabled (``disable`` is read at each call: it may be set later)
        self._plain_locks = not (self._swa or self._mamba)
        self._mutex = threading.RLock()
        if device_values is not None:
            device_values = as_flag(device_values, "device_values")
        self._vals = ValueBridge(token_to_kv_pool_allocator, device_values,
                                 as_flag(debug_checks, "debug_checks"))
        if self._mamba:
            self._vals.set_mamba(req_to_token_pool.mamba_allocator)
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
                components=(L.C_FULL | (L.C_SWA if self._swa else 0)
                            | (L.C_MAMBA if self._mamba else 0)), swa_window=self._window,
                mamba_path_cap=self._path_cap,
                bigram=self.is_eagle, node_capacity=max(4, ncap), pool_capacity=max(64, pcap))
        except MemoryError as e:
            raise MemoryError(f"node_capacity={ncap}, pool_capacity={pcap}: cannot allocate the "
                              f"initial arrays ({e})") from None
        self._sink = (EventSink(self._engine, self.page_size, self.is_eagle,
                                self.kv_event_lora_names)
                      if self.enable_kv_cache_events else None)
        self._root = self._engine.root
        if self._sink is not None:
            self._sink.cleared()
        self._executor = Executor(self._vals, self._sink)
        #: the host tier (HiCache), off until ``init_hicache``
        self._hicache = HostTier(self)
        self._device_values_start(None)

    # ------------------------------------------------------------------ device values
    _device_values_start = device_api.start
    device_values = property(device_api.device_values)
    check_device_values = device_api.check_device_values

    @property
    def mutex(self):
        """The cache's ``threading.RLock``: hold it to make several calls one atomic
        step (e.g. ``match_prefix`` + ``inc_lock_ref``). See the class docstring.
        (``lock(node)`` is SGLang's lock call, not this.)"""
        return self._mutex

    # ------------------------------------------------------------------ request-path API
    # The request path (``requests.py``) uses the public API plus exactly these:
    # ``_mutex``, ``_vals`` (the ValueBridge), ``_key``, ``_insert_units``,
    # ``_check_unlock`` and ``_window`` / ``_swa``; each is documented where it is
    # defined.

    def _key(self, key, name="key"):
        """``(units, aligned_len, ns_key, raw_tokens)`` of a RadixKey; changes nothing.

        ``units`` are the key's logical units (int64, bigram pairs packed in EAGLE
        trees), ``aligned_len`` their count aligned down to a page, ``ns_key`` the
        ``(extra_key, cache_salt)`` tuple: namespaces are compared as tuples, never
        concatenated (known_bugs B5). ``TypeError`` / ``ValueError`` naming ``name``.
        """
        if type(key) is RadixKey:
            toks = key.token_ids
            if (type(toks) is np.ndarray and toks.dtype is _I64 and toks.ndim == 1
                    and key.extra_key is None and key.cache_salt is None and not key.is_bigram
                    and not self.is_eagle):
                flags = toks.flags
                if flags.c_contiguous and flags.writeable:  # the common key: as it is
                    n = toks.shape[0]
                    return toks, n - n % self.page_size, _DEFAULT_NS, toks
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
                      want_path=False, keep_own=False, cursor=0, track=False, mamba_slot=-1):
        """One insert kernel call on validated arguments (shared by ``insert`` and the
        request path); executes its actions (duplicate frees, SWA recovery, events).

        ``units``/``value``: int64, ``n`` page-aligned (> 0); ``limit``: the
        kernel's bound check (``VALUES_*`` or the allocator's bound). ``want_path``:
        the path's value is returned (a view valid until the next engine call;
        ``path[:prefix_len]`` are the tree's slots). ``keep_own`` (request path):
        duplicates equal to the tree's own slot at their position are not freed.
        ``cursor``: the request's SWA eviction cursor (page-aligned; SWA caches).
        ``track``: SWA caches report adopted ranges. ``mamba_slot``: the state slot
        donated to the target (Mamba caches; validated by the caller).
        Returns ``(prefix_len, target_id, freed, path, adopted, mamba_exist)``; ``freed`` are the
        duplicate slots freed (what the caller frees without an allocator),
        ``adopted`` ``{component: [(start, end)]}`` when tracked on an SWA cache.
        Raises ``ValueError`` naming ``name`` for a bad KV index, nothing changed
        (a namespace first seen by this call is forgotten again).
        ``inserted_len`` beyond ``n`` is clamped to ``n`` (same hit accounting)."""
        if inserted_len > n:
            inserted_len = n
        if prev > n:
            prev = n
        eng = self._engine
        adopted = {} if track else None
        dev = self._vals.dev
        with self._mutex:
            ns = eng.ns.get(nk)
            new_ns = ns is None
            if new_ns:
                ns = eng.ns.intern(nk)
            if want_path:
                eng.ensure_out(2 * n)
            # device values: the kernel writes tags; the tagged rows are claimed
            # and the device input copied into them (device.DeviceValues)
            kval = value if dev is None else dev.tags(value.shape[0])
            st, plen, target, exist = eng.k.insert(units, kval, n, ns, inserted_len, priority,
                                                   limit, prev, cursor, _TRACK if track else 0,
                                                   mamba_slot, n if want_path else 0)
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
            pre = None
            if dev is not None:
                runs = dev.claim(eng, target & 0xFFFFFFFF)
                # the values the actions free are gathered before the input overwrites
                # any row (an SWA recovery frees the rows it takes over)
                pre = self._executor.prepare(eng.actions(), eng.out)
                dev.write(runs, value)
            if self._hicache.on:  # backups run amid the rows (engine calls): copy them
                out = eng.out[:max(n if want_path else 0, int(eng.meta[L.M_NOUT]))].copy()
                freed = self._hicache.run_with_barriers(eng.actions().copy(), out, value,
                                                        keep_own, adopted, pre)
            else:
                out = eng.out
                freed = self._executor.run(eng.actions(), out, value, keep_own=keep_own,
                                           adopted=adopted, pre=pre)
            path = out[:n] if want_path else None
        return plen, target, freed, path, adopted, bool(exist)

    def _check_anchored(self, node, name):
        """Raise (before any change) unless ``dec_lock_ref(node)`` would succeed for
        Full: ``NodeAccessError`` for a stale id, ``LockRefError`` when no lock is
        anchored on the node. O(1): a lock anchored on a node implies lock_ref >= 1
        on its whole path (each parent counts its children's locks). Returns the id."""
        nid = as_node_id(node, name)
        if self.disable:
            return nid
        eng = self._engine
        s = inspection.slot(eng, nid)
        if s < 0:
            raise self._stale(nid, name)
        if s != L.ROOT and inspection.anchored_locks(eng, s) < 1:
            raise LockRefError(f"{name}={nid} holds no lock to release (lock_ref="
                               f"{inspection.lock_ref(eng, s)}, all of it held by locks on "
                               "its descendants)")
        return nid

    def _check_unlock(self, node, receipt, swa_released, name):
        """Raise (before any change) unless releasing the lock on ``node`` with
        ``receipt`` (None: Full-only caches) would succeed -- the check
        ``dec_lock_ref`` makes first, without releasing. Errors as ``dec_lock_ref``,
        naming ``name``. Returns the node id."""
        nid = self._check_anchored(node, f"{name}.node" if receipt is not None else name)
        if self.disable or not (self._swa or self._mamba):
            return nid
        skip, boundary = self._receipt(nid, receipt, f"{name}.receipt")
        if swa_released:
            skip |= self._early_mask
        # (callers hold the cache lock: _check_last_node)
        st, slot = self._engine.k.check_dec(nid, skip, boundary)
        if st == L.E_LOCK_UNDERFLOW:
            self._raise_underflow(int(slot), nid)
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
        With SWA the prefix ends at the deepest node reached through ``W``
        contiguous tokens of SWA data (or with no tombstone on its path);
        ``full_kv_hit_length`` counts every matched token with Full KV and
        ``swa_branching_seqlen`` is it when it is longer than the usable prefix
        (else None). Raises ``TypeError``/``ValueError`` for a malformed key
        (tree unchanged). A list key that is ``params.req``'s own
        ``origin_input_ids`` / ``fill_ids`` (as SGLang's scheduler passes them)
        is converted through the request's memo: once per request, not per call.
        Mamba with ``cow_mamba`` (spec §6.3): when the best match node
        (``best_match_node``, which may lie past the device match on the host
        tier) owns a *device* state and the request holds no slot, one slot is
        allocated for it (one state evicted first when the pool is empty, the
        best match node locked meanwhile); nothing at all when that node's state
        is not on the device (SGLang's ``finalize_match_result_in_cache``);
        ``RuntimeError("Can not alloc mamba cache ...")`` when nothing is
        evictable -- raised after the match itself (its split and LRU refresh)
        happened, as SGLang's assertion; the request then still holds no slot.
        """
        cow = False
        if type(params) is MatchPrefixParams:
            key = params.key
            if params.req is not None and type(key) is RadixKey and type(key.token_ids) is list:
                key = self._req_key(params.req, key)
            if params.cow_mamba is not False:
                cow = as_flag(params.cow_mamba, "params.cow_mamba") and self._check_cow(params)
        else:
            key = params
        units, n, nk, _ = self._key(key, "params.key")
        eng = self._engine
        ns = eng.ns.get(nk)
        if self.disable or n == 0 or ns is None:  # an unseen namespace caches nothing
            return self._empty_match()
        # The result array is allocated here, at the key's length, and the kernel
        # writes the matched indices straight into it (no scratch + copy).
        idx = np.empty(n, dtype=np.int64)
        dev = self._vals.dev
        with self._mutex:
            st, plen, best, visited, full_hit, host_hit, hbest = eng.k.match_prefix(units, n, ns,
                                                                                    idx)
            h = self._hicache
            shost = 0 if h.swa_pool_host is None else eng.k.swa_host_hit(hbest)
            mhost = 0 if h.mamba_pool_host is None else h.mamba_host_hit(hbest)
            if dev is not None:  # pool rows: one gather on the device (under the lock:
                idx = dev.take(idx[:plen])  # a compaction moves rows)
        if plen < n and dev is None:
            idx = idx[:plen]
        vis = None if visited < 0 else visited
        if self._vals.kind == "torch" and dev is None:
            idx = self._vals.out(idx)
        # SWA: how far the match could have gone with the window present (the walk's
        # page-aligned length, when it is past the usable prefix)
        branch = full_hit if self._swa and full_hit > plen + host_hit else None
        mbranch = None
        if self._mamba:
            mbranch = self._mamba_branch(full_hit, plen + host_hit)
            if cow:  # the best match node's device state (SGLang's finaliser), not `best`'s
                self._cow_mamba(params.req, hbest)
        # tuple.__new__ skips the NamedTuple's Python-level __new__ (~0.4 µs)
        return _tuple_new(MatchResult, (idx, best, hbest, hbest, host_hit, plen, full_hit, vis,
                                        shost, branch, mhost, mbranch, None, None))

    def _mamba_branch(self, full_hit, boundary):
        """SGLang's ``mamba_branching_seqlen``: the Full hit aligned down to the
        checkpoint grid ``lcm(mamba_cache_chunk_size, page_size)``, when that is
        past the Mamba boundary (the device prefix plus the host hit; spec §6.3),
        else None."""
        grid = self.mamba_checkpoint_grid
        aligned = full_hit // grid * grid
        return aligned if aligned > boundary else None

    def _check_cow(self, params):
        """Validate a ``cow_mamba`` match's request (before anything changes)."""
        if not self._mamba:
            raise ValueError("params.cow_mamba given, but this cache has no Mamba component")
        req = params.req
        kv = getattr(req, "kv", None)
        if req is None or kv is None or not hasattr(kv, "mamba_pool_idx"):
            raise ValueError("params.cow_mamba needs params.req with a .kv holding "
                             "mamba_pool_idx (SGLang's Req)")
        return True

    def _cow_mamba(self, req, best):
        """Copy-on-write of the best match node ``best``'s device state (SGLang's
        Mamba cache finaliser): the request gets a private slot (allocated when it
        holds none; when the pool is empty one state is evicted with ``best``
        locked meanwhile) and ``req.kv.mamba_cow_src_index`` names the node's
        slot (the copy itself is the caller's, on its stream). Nothing when the
        node has no device state (none, or on the host only)."""
        with self._mutex:
            eng = self._engine
            s = inspection.slot(eng, best)
            src = -1 if s < 0 else inspection.device_state(eng, s)
            if src < 0:
                return
            kv = req.kv
            if not holds_state(kv):
                alloc = self._vals.mamba
                dst = alloc.alloc(1)
                if dst is None:
                    receipt = self.inc_lock_ref(best)
                    try:
                        self.evict(EvictParams(num_tokens=0, mamba_num=1))
                    finally:
                        self.dec_lock_ref(best, receipt.to_dec_params())
                    dst = alloc.alloc(1)
                    if dst is None:
                        raise RuntimeError("Can not alloc mamba cache: the Mamba state pool is "
                                           "empty and nothing is evictable")
                kv.mamba_pool_idx = dst[0]
            src_t = self._vals.mamba_out(src)
            kv.mamba_cow_src_index = src_t
            kv.mamba_needs_clear = False

    # ------------------------------------------------------------------ insert (``insertion.py``)
    insert = insertion.insert
    _swa_params = insertion._swa_params

    # ------------------------------------------------------------------ locks
    def inc_lock_ref(self, node, skip_lock_components=()):
        """Lock ``node`` against eviction; returns the receipt (``IncLockRefResult``).

        Full locks the path root -> ``node``; with SWA, the window segment from
        ``node`` up until ``W`` tokens are covered is locked too and the receipt's
        ``component_lock_uuids[SWA]`` names its boundary (``None``: it reached the
        root); with Mamba, the node's own state is locked (not its ancestors'). ``delta``: Full units moved evictable -> protected. Locking the
        root is a no-op. ``skip_lock_components``: ComponentTypes not to lock
        (SWA, MAMBA -- a decode hold skips MAMBA; FULL cannot be skipped:
        ``ValueError``); the receipt remembers them, so a release drops exactly
        what this lock took.
        Raises ``NodeAccessError`` for a stale or never-issued id, ``TypeError``
        for a non-int id; the tree is unchanged then. O(depth).
        """
        nid = as_node_id(node, "node")
        skip = skip_lock_components
        if not (type(skip) is tuple and not skip):
            skip = self._skip_components(skip)
        if self.disable:        # nothing is ever locked; the receipt still has SGLang's shape
            if self._swa and ComponentType.SWA not in skip:
                return IncLockRefResult(0, nid, skip, {ComponentType.SWA: None})
            return IncLockRefResult(0, nid, skip)
        skip_mask = ((L.C_SWA if ComponentType.SWA in skip else 0)
                     | (L.C_MAMBA if ComponentType.MAMBA in skip else 0))
        with self._mutex:  # the arrays are read under the lock: a growth replaces them
            st, delta, boundary = self._engine.k.inc_lock_ref(nid, skip_mask)
        if st == L.E_STALE:
            raise self._stale(nid)
        if self._swa and not skip_mask & L.C_SWA:
            return IncLockRefResult(delta, nid, skip, {ComponentType.SWA: boundary or None})
        return IncLockRefResult(delta, nid, skip)

    @staticmethod
    def _skip_components(skip):
        if isinstance(skip, (str, bytes)) or not hasattr(skip, "__iter__"):
            raise TypeError("skip_lock_components must be a tuple of ComponentType, got "
                            f"{type(skip).__name__}")
        out = tuple(_component(c, "skip_lock_components") for c in skip)
        if ComponentType.FULL in out:
            raise ValueError("skip_lock_components: FULL cannot be skipped (it is the backbone)")
        return out

    def _receipt(self, nid, receipt, name="receipt"):
        """The validated receipt's ``(skip mask, SWA boundary)`` (checks only)."""
        if receipt is None:
            if self._swa or self._mamba:
                raise ReceiptError(f"{name}: {'an SWA' if self._swa else 'a Mamba'} cache needs "
                                   "the lock's receipt (the IncLockRefResult, or lock() / its "
                                   "TreeLock): it says which components the lock took")
            return 0, 0
        if not hasattr(receipt, "node_id"):
            raise TypeError(f"{name} must be the IncLockRefResult of inc_lock_ref (or its "
                            f"to_dec_params()), got {type(receipt).__name__}")
        anchor = receipt.node_id
        if anchor is not None and anchor != nid:
            raise LockRefError(f"lock receipt anchored on node {anchor} released on node {nid}")
        skipped = getattr(receipt, "skipped_lock_components", ()) or ()
        if not isinstance(skipped, (tuple, list, frozenset, set)):
            raise TypeError(f"{name}.skipped_lock_components must be a tuple of ComponentType, "
                            f"got {type(skipped).__name__}")
        if not self._swa and not self._mamba:
            if ComponentType.FULL in skipped:
                # only a Mamba cache releases a lock's Mamba part alone that way;
                # here it would release nothing (and leak the lock)
                raise TypeError(f"{name}.skipped_lock_components holds FULL: a Full-only "
                                "cache's locks always take FULL (the receipt is not one of "
                                "its locks')")
            return 0, 0
        mask = L.C_MAMBA if self._mamba and ComponentType.MAMBA in skipped else 0
        if ComponentType.FULL in skipped:
            # SGLang releases a lock's Mamba part alone with a receipt that skips
            # every other component (MambaComponent._alloc_mamba_slot)
            mask |= L.C_FULL
        if not self._swa:
            return mask, 0
        if ComponentType.SWA in skipped:
            return mask | L.C_SWA, 0
        uuids = getattr(receipt, "component_lock_uuids", None)
        if not isinstance(uuids, Mapping) or ComponentType.SWA not in uuids:
            raise ReceiptError(f"{name}.component_lock_uuids has no ComponentType.SWA entry "
                               "(the window lock's boundary)")
        boundary = uuids[ComponentType.SWA]
        if boundary is None:
            return mask, 0
        if isinstance(boundary, bool) or not isinstance(boundary, (int, np.integer)) or boundary <= 0:
            raise TypeError(f"{name}.component_lock_uuids[SWA] must be a boundary stamp (a "
                            f"positive int) or None, got {boundary!r}")
        return mask, int(boundary)

    def dec_lock_ref(self, node, receipt=None, skip_swa=False):
        """Release a lock taken by ``inc_lock_ref(node)``; returns ``DecLockRefResult``.

        ``receipt`` (the ``IncLockRefResult`` or its ``to_dec_params()``) is optional
        for Full-only caches and required with SWA (``ReceiptError``, a
        ``KeyError``, when it or its SWA entry is missing); it must be anchored on
        ``node``. The release replays exactly what the receipt locked: the SWA
        window up to its boundary unless skipped, or already released early
        (``skip_swa=True``, as ``unlock`` passes after ``release_swa``), then the
        Full path. Raises ``LockRefError`` (a ValueError) when the release would
        take a lock_ref below zero (unlock without lock, double unlock, the window
        released twice) and ``NodeAccessError`` for a stale id; the tree is
        unchanged then. ``TypeError`` for a non-int id or a malformed receipt.
        A disabled cache locked nothing: it returns at once. O(depth).
        """
        nid = as_node_id(node, "node")
        if self._plain_locks and not self.disable and skip_swa is False and (receipt is None or (
                type(receipt) in _PLAIN_RECEIPTS and receipt.node_id == nid
                and not receipt.skipped_lock_components)):
            skip_mask, boundary = 0, 0   # Full-only: what _receipt would return
        else:
            skip_swa = as_flag(skip_swa, "skip_swa") if skip_swa is not False else False
            if self.disable:        # nothing was locked (SGLang returns at once too)
                return DecLockRefResult()
            skip_mask, boundary = self._receipt(nid, receipt) if (
                receipt is not None or self._swa or self._mamba) else (0, 0)
        if skip_swa:
            skip_mask |= self._early_mask
        self._dec(nid, skip_mask, boundary)
        return DecLockRefResult()

    def _dec(self, nid, skip_mask, boundary):
        """One ``dec_lock_ref`` kernel call on a checked release; its refusal raised
        (``_dec_error``), nothing changed then."""
        with self._mutex:  # the arrays are read under the lock: a growth replaces them
            st, x = self._engine.k.dec_lock_ref(nid, skip_mask, boundary)
            if st != L.OK:
                self._dec_error(st, x, nid)

    def _dec_error(self, st, x, nid):
        """Raise what the lock kernel's refusal ``(st, x)`` of a release on ``nid`` means
        (nothing was changed). Under the cache lock."""
        if st == L.E_NOT_ANCHORED:
            slot = int(x)
            raise LockRefError(f"no lock is anchored at node {nid}: its lock_ref="
                               f"{inspection.lock_ref(self._engine, slot)} is held by "
                               "locks on its descendants (release the node that was locked)")
        if st == L.E_LOCK_UNDERFLOW:
            self._raise_underflow(int(x), nid)
        assert st == L.E_STALE, st
        raise self._stale(nid)

    def _raise_underflow(self, slot, nid, what="segment release", name=None, comp=None):
        eng = self._engine
        if comp is not None:  # the kernel says which check failed (a batch's dry run)
            comp, what = {L.FULL: ("FULL", what), L.SWA: ("SWA", what),
                          L.MAMBA: ("Mamba", "release")}[comp]
        elif inspection.lock_ref(eng, slot) <= 0:
            comp = "FULL"
        elif self._mamba and inspection.lock_ref(eng, slot, L.MAMBA) <= 0:
            comp = "Mamba"
            what = "release"
        else:
            comp = "SWA"
        where = f"{name}: " if name else ""
        raise LockRefError(f"{where}{comp} {what} hit lock_ref=0 on node {inspection.nid(eng, slot)} "
                           f"(releasing node {nid}: unlock without lock, twice, or without "
                           "skip_swa after release_swa)")

    def lock(self, node, skip_lock_components=()):
        """``inc_lock_ref`` packed as SGLang's ``TreeLock(node, receipt)`` for ``unlock``
        and ``release_swa``. Errors as ``inc_lock_ref``."""
        nid = as_node_id(node, "node")
        if (self._plain_locks and not self.disable and type(skip_lock_components) is tuple
                and not skip_lock_components):
            # Full-only: the receipt holds nothing but the node (what inc_lock_ref's
            # to_dec_params() would give), so skip building the IncLockRefResult
            with self._mutex:  # the arrays are read under the lock: a growth replaces them
                st, _, _ = self._engine.k.inc_lock_ref(nid, 0)
            if st == L.E_STALE:
                raise self._stale(nid)
            return TreeLock(nid, DecLockRefParams(nid, (), {}, {}))
        return TreeLock(nid, self.inc_lock_ref(nid, skip_lock_components).to_dec_params())

    def unlock(self, lock):
        """Release a ``TreeLock`` (``None``: no-op), SWA skipped when it was released
        early. Errors as ``dec_lock_ref``."""
        if lock is None:
            return
        if not isinstance(lock, TreeLock):
            raise TypeError(f"lock must be a flatradix.TreeLock or None, got {type(lock).__name__}")
        nid = lock.node
        if self._plain_locks and not self.disable and _plain_lock(lock):
            # Full-only, a plain receipt: what dec_lock_ref would check reduces to this
            self._dec(nid, 0, 0)
            return
        self.dec_lock_ref(nid, lock.receipt, skip_swa=lock.swa_released)

    def release_swa(self, lock):
        """Release the SWA window part of ``lock`` early, once (SGLang ``release_swa``):
        the window's nodes become SWA-evictable while the Full path stays locked;
        ``lock.swa_released`` is set and the final ``unlock`` skips SWA. A window
        node left an unlocked device leaf loses its SWA data at once. ``None``, an
        already released lock, a cache without SWA or the root: no-op (still
        marked). ``LockRefError`` when the window holds no lock any more,
        ``ReceiptError`` for a receipt without an SWA entry (one that skipped SWA);
        nothing changed then."""
        if lock is None or self.disable or lock.swa_released:
            return
        if not isinstance(lock, TreeLock):
            raise TypeError(f"lock must be a flatradix.TreeLock or None, got {type(lock).__name__}")
        nid = as_node_id(lock.node, "lock.node")
        anchor = getattr(lock.receipt, "node_id", None)
        if anchor is not None and anchor != nid:
            raise LockRefError(f"lock receipt anchored on node {anchor} released on node {nid}")
        if self._swa and nid != self._root:
            uuids = getattr(lock.receipt, "component_lock_uuids", None)
            if not isinstance(uuids, Mapping) or ComponentType.SWA not in uuids:
                raise ReceiptError("lock.receipt.component_lock_uuids has no ComponentType.SWA "
                                   "entry (the lock skipped SWA: nothing to release early)")
            skip, boundary = self._receipt(nid, lock.receipt, "lock.receipt")
            eng = self._engine
            with self._mutex:
                st, x = eng.k.release_window(nid, boundary, skip)
                if st == L.E_STALE:
                    raise self._stale(nid, "lock.node")
                if st == L.E_LOCK_UNDERFLOW:
                    self._raise_underflow(int(x), nid, "window release")
                self._executor.run(eng.actions(), eng.out)
        lock.swa_released = True

    # ------------------------------------------------------------------ evict (``eviction.py``)
    evict = eviction.evict
    evict_device_start = eviction.evict_device_start
    evict_device_next_node = eviction.evict_device_next_node
    _mamba_empty = eviction._mamba_empty
    _mamba_slots = eviction._mamba_slots
    evict_device_end = eviction.evict_device_end
    evict_for_alloc = eviction.evict_for_alloc
    _check_component = eviction._check_component

    # ------------------------------------------------------------------ batches (``batch.py``)
    match_prefix_batch = batch.match_prefix_batch
    inc_lock_ref_batch = batch.inc_lock_ref_batch
    dec_lock_ref_batch = batch.dec_lock_ref_batch
    _dec_batch = batch._dec_batch
    lock_batch = batch.lock_batch
    unlock_batch = batch.unlock_batch
    _node_ids = batch._node_ids

    # ------------------------------------------------------------------ sizes (``views.py``)
    evictable_size = views.evictable_size
    protected_size = views.protected_size
    component_evictable_size = views.component_evictable_size
    component_protected_size = views.component_protected_size
    swa_evictable_size = views.swa_evictable_size
    swa_protected_size = views.swa_protected_size
    mamba_evictable_size = views.mamba_evictable_size
    mamba_protected_size = views.mamba_protected_size
    all_mamba_values_flatten = views.all_mamba_values_flatten
    total_size = views.total_size
    node_count = views.node_count
    available_and_evictable_str = views.available_and_evictable_str
    supports_swa = views.supports_swa
    mamba_max_states_per_path = property(views.mamba_max_states_per_path)
    supports_mamba = views.supports_mamba
    supports_prefix_sharing = views.supports_prefix_sharing
    sliding_window_size = property(views.sliding_window_size)
    full_evictable_size = views.evictable_size
    full_protected_size = views.protected_size
    swa_retain_window = property(views.sliding_window_size)

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
        s = inspection.slot(self._engine, nid)
        if s < 0:
            raise self._stale(nid, name)
        return s

    # node views and the sanity check (``views.py``)
    path_device_indices = views.path_device_indices
    node_info = views.node_info
    all_values_flatten = views.all_values_flatten
    pretty_print = views.pretty_print
    sanity_check = views.sanity_check

    def reset(self):
        """Drop the whole tree; every old node id goes stale and the root gets a new id.
        Closes any open step-wise eviction round. O(nodes).

        As SGLang's ``reset``: the tree's KV slots are not given back to the
        allocator (clear it too, as SGLang's ``flush_cache`` does), and locks held
        by running requests go stale (releasing them raises ``NodeAccessError``).
        With a host tier the host pools (Full, and SWA / Mamba) are cleared and
        pending backups / loads are dropped (their acks never come)."""
        with self._mutex:
            self._root = self._engine.reset()
            self._vals.mamba_owned.clear()
            self._hicache.clear()
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


    # the request path's inserts back nodes up too: a failed copy is raised at the end
    # of the whole call (the insert's frees, the unlock and the row release done)
    def checkpoint(self, req, up_to, *, finished=False):
        try:
            return super().checkpoint(req, up_to, finished=finished)
        finally:
            if self._hicache.on:
                self._hicache.raise_transfer_error()

    def release_kv_cache(self, req, checkpoint=True):
        try:
            return super().release_kv_cache(req, checkpoint)
        finally:
            if self._hicache.on:
                self._hicache.raise_transfer_error()

    checkpoint.__doc__ = RequestCachingMixin.checkpoint.__doc__
    release_kv_cache.__doc__ = RequestCachingMixin.release_kv_cache.__doc__


def _host_method(name):
    """The cache's public host-tier method ``name``: ``HostTier.<name>`` of its host
    tier (``cache._hicache``), with that docstring."""
    def method(self, *args, **kwargs):
        return getattr(self._hicache, name)(*args, **kwargs)

    impl = getattr(HostTier, name)
    method.__name__ = name
    method.__qualname__ = f"UnifiedRadixCache.{name}"
    method.__doc__ = impl.__doc__
    method.__wrapped__ = impl  # (inspect.signature shows the real parameters)
    return method


def _host_property(name):
    impl = getattr(HostTier, name, None)

    def get(self):
        return getattr(self._hicache, name)

    def set_(self, value):
        setattr(self._hicache, name, value)

    doc = impl.__doc__ if isinstance(impl, property) else f"The host tier's ``{name}``."
    return property(get, set_ if name == "load_back_threshold" else None, doc=doc)


for _name in HostTier.API:
    setattr(UnifiedRadixCache, _name, _host_method(_name))
for _name in HostTier.PROPERTIES:
    setattr(UnifiedRadixCache, _name, _host_property(_name))
del _name

