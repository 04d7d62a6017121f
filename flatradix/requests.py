"""Request-level caching, as SGLang's scheduler calls it (spec §5.8).

``cache_unfinished_req`` / ``cache_finished_req`` are the names schedulers up
to SGLang 0.5.22 call; 0.5.23 calls them ``checkpoint`` and
``release_kv_cache``. All four are offered, over one implementation.

A request is anything with the attributes of ``flatradix.Req`` (a duck-typed
SGLang ``Req`` works): ``origin_input_ids``, ``output_ids``, ``fill_ids``,
``req_pool_idx``, ``prefix_indices``, ``last_node``, ``extra_key``,
``cache_salt``, ``priority``; optional ``cache_protected_len``,
``cache_inserted_len``, ``kv_committed_len``, ``kv_allocated_len``.

Besides the cache's public API, the request path uses exactly this engine API
of the cache (documented where each is defined, ``flatradix/cache.py``):
``_mutex`` (the cache's lock), ``_vals`` (``flatradix.values.ValueBridge``: the
index kind, ``check_held``, ``kv_bound``, ``free``, ``free_split``, ``out``),
``_key`` (key -> units), ``_insert_units`` (one insert kernel call + its
actions), ``_check_unlock`` (a lock to release exists and its release would
succeed) and ``_window`` / ``_swa`` (the SWA configuration).
"""

from array import array
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from ._cast import _to_numpy, as_count, as_flag, as_int, as_int64, as_node_id, is_torch
from .device import on_device
from .values import check_range
from .kernels import layout as L
from .types import ComponentType, DecLockRefParams, EvictParams, RadixKey, TreeLock

_EMPTY = np.empty(0, dtype=np.int64)


@dataclass
class Req:
    """The request fields the cache reads and writes (a subset of SGLang's ``Req``).

    Token lists are Python lists or ``array('q')``. ``prefix_indices``: the KV
    indices of the request's cached prefix (int64 1-D; set by the scheduler from
    ``match_prefix``). ``last_node``: the NodeId the request holds a lock on.
    ``cache_protected_len``: prefix units whose slots belong to the tree (``None``
    = ``len(prefix_indices)``). ``kv_committed_len``: tokens with KV (``None`` =
    ``len(origin_input_ids) + len(output_ids) - 1``, the last sampled token has
    none yet). ``kv_allocated_len``: row slots allocated (``None`` = committed).
    ``lock``: the ``TreeLock`` the request holds on ``last_node`` (from
    ``cache.lock(node)``; required on SWA caches, whose release needs the
    receipt; a Full-only cache also releases ``last_node`` without one).
    SWA caches: ``swa_evicted_seqlen`` is the request's SWA cursor (its row's
    SWA slots below it are freed; the cache advances it), and
    ``swa_branching_seqlen`` the ``MatchResult`` field of its admission match
    (the first checkpoint then inserts only up to it; not with Mamba, whose state
    belongs to the whole key -- the field is still validated).
    Mamba caches: ``mamba_pool_idx`` is the request's own state slot (from
    ``req_to_token_pool.mamba_allocator``; ``None``: holds none);
    ``mamba_cow_src_index`` / ``mamba_needs_clear`` are set by a ``cow_mamba``
    match. With ``enable_mamba_extra_buffer``: ``mamba_ping_pong_track_buffer``
    (its tracked state slots), ``mamba_ping_pong_empty``, ``mamba_next_track_idx``,
    ``mamba_last_track_idx``, ``mamba_last_track_seqlen``,
    ``mamba_prev_track_seqlen`` (see ``HybridReqToTokenPool``; set by
    ``alloc_mamba`` and the model runner; the buffer and its ``empty`` flags are
    validated when the cache reads them: every entry a held slot of its own, a
    tracked length page-aligned and not below ``cache_protected_len``). ``req.kv`` is the request itself (SGLang keeps these under ``req.kv``).

    Construction validates every field (``TypeError`` / ``ValueError`` naming it):
    token containers must be 1-D integer sequences (list, tuple, ``array('q')``,
    numpy or torch), counts non-negative ints or ``None``, ``extra_key`` /
    ``cache_salt`` str or ``None``, node ids ints. The cache validates again
    what it reads, before changing anything, since a scheduler mutates the
    fields later.
    """

    origin_input_ids: Any
    output_ids: Any = field(default_factory=list)
    fill_ids: Any = None
    req_pool_idx: Optional[int] = None
    prefix_indices: Any = None
    last_node: Optional[int] = None
    extra_key: Optional[str] = None
    cache_salt: Optional[str] = None
    priority: Optional[int] = None
    cache_protected_len: Optional[int] = None
    cache_inserted_len: int = 0
    kv_committed_len: Optional[int] = None
    kv_allocated_len: Optional[int] = None
    rid: Any = None
    lock: Any = None
    swa_evicted_seqlen: int = 0
    swa_branching_seqlen: Optional[int] = None
    mamba_pool_idx: Any = None
    mamba_cow_src_index: Any = None
    mamba_needs_clear: bool = False
    mamba_ping_pong_track_buffer: Any = None
    mamba_ping_pong_empty: Any = None
    mamba_next_track_idx: Optional[int] = None
    mamba_last_track_idx: Optional[int] = None
    mamba_last_track_seqlen: Optional[int] = None
    mamba_prev_track_seqlen: Optional[int] = None
    #: attr -> (container, its length, int64 view or copy): a list is converted once
    _np_cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        self._validate_tokens("origin_input_ids")
        self._validate_tokens("output_ids")
        if self.fill_ids is None:
            # the prompt's own container, not a copy: the cache reads array('q'),
            # numpy and torch prompts without converting them (a list once per
            # request, see _req_tokens); the scheduler replaces fill_ids, never
            # extends it in place
            self.fill_ids = self.origin_input_ids
        else:
            self._validate_tokens("fill_ids")
        if self.prefix_indices is None:
            self.prefix_indices = _EMPTY.copy()
        elif on_device(self.prefix_indices):   # device values: metadata only (no host read)
            _check_device_indices(self.prefix_indices, "prefix_indices")
        else:
            _to_numpy(self.prefix_indices, "prefix_indices")
        if self.req_pool_idx is not None:
            as_count(self.req_pool_idx, "req_pool_idx")
        if self.last_node is not None:
            as_node_id(self.last_node, "last_node")
        for name in ("extra_key", "cache_salt"):
            v = getattr(self, name)
            if v is not None and type(v) is not str:
                raise TypeError(f"{name} must be a str or None, got {type(v).__name__}")
        if self.priority is not None:
            as_int(self.priority, "priority")
        as_count(self.cache_inserted_len, "cache_inserted_len")
        as_count(self.swa_evicted_seqlen, "swa_evicted_seqlen")
        if self.lock is not None and not isinstance(self.lock, TreeLock):
            raise TypeError(f"lock must be a flatradix.TreeLock or None, got {type(self.lock).__name__}")
        for name in ("cache_protected_len", "kv_committed_len", "kv_allocated_len",
                     "swa_branching_seqlen", "mamba_next_track_idx", "mamba_last_track_idx",
                     "mamba_last_track_seqlen", "mamba_prev_track_seqlen"):
            v = getattr(self, name)
            if v is not None:
                as_count(v, name)
        if self.mamba_pool_idx is not None:
            from .values import one_slot

            if one_slot(self.mamba_pool_idx, "mamba_pool_idx") < 1:
                raise ValueError("mamba_pool_idx must be a state slot >= 1 (slot 0 is the "
                                 "reserved dummy)")
        as_flag(self.mamba_needs_clear, "mamba_needs_clear")

    def _validate_tokens(self, attr):
        """Validate a token container; a Python list's int64 copy is kept for the
        cache (``_req_tokens``), so validating it is its one conversion."""
        x = getattr(self, attr)
        if type(x) is list:
            _req_tokens(self, attr, attr)
        else:
            _to_numpy(x, attr)


Req.kv = property(lambda self: self, doc="The request itself: SGLang reads the KV fields "
                                         "as ``req.kv.<field>``.")


def _check_device_indices(x, name):
    """A device array of indices (torch / cupy): 1-D, integer; host metadata only."""
    dt = x.dtype
    if is_torch(x):
        bad = dt.is_floating_point or dt.is_complex or str(dt) == "torch.bool"
    else:
        bad = getattr(dt, "kind", "i") not in "iu"
    if bad:
        raise TypeError(f"{name} must hold integers, got dtype {dt}")
    if len(x.shape) != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(x.shape)}")


def _tokens(x, name):
    return as_int64(x, name)


def _req_tokens(req, attr, name=None):
    """``req.<attr>`` as int64 (``TypeError`` / ``ValueError`` naming it, or
    ``name``). Buffer containers (``array('q')``, numpy, CPU torch) are viewed
    without a copy; a Python list is converted once per ``flatradix.Req`` (when
    it is built) and kept while the field holds the same list with the same
    length, under every field that holds that list (containers are replaced or
    extended, never edited in place: an in-place edit of the same length is not
    seen)."""
    x = getattr(req, attr)
    cache = getattr(req, "_np_cache", None)
    if cache is None or type(x) is not list:
        return as_int64(x, name or f"req.{attr}")
    hit = cache.get(attr)
    if hit is not None and hit[0] is x and hit[1] == len(x):
        return hit[2]
    for other in cache.values():  # the same list under another field (fill_ids)
        if other[0] is x and other[1] == len(x):
            cache[attr] = other
            return other[2]
    a = as_int64(x, name or f"req.{attr}")
    cache[attr] = (x, len(x), a)
    return a


_SEQ_TYPES = frozenset((list, tuple, np.ndarray, array))


def _seq_len(req, attr):
    """``len(req.<attr>)`` of a token container; TypeError naming it otherwise."""
    x = getattr(req, attr)
    if type(x) in _SEQ_TYPES and (type(x) is not np.ndarray or x.ndim == 1):
        return len(x)  # the usual containers: no further checks
    if (x is None or isinstance(x, (str, bytes, dict, set)) or not hasattr(x, "__len__")
            or getattr(x, "ndim", 1) != 1):
        raise TypeError(f"req.{attr} must be a 1-D integer sequence, got {type(x).__name__}")
    return len(x)


def holds_state(kv):
    """Whether a request's ``kv`` holds a Mamba state slot (SGLang's ``holds_mamba``,
    else ``mamba_pool_idx is not None``)."""
    holds = getattr(kv, "holds_mamba", None)
    return kv.mamba_pool_idx is not None if holds is None else bool(holds)


class RequestCachingMixin:
    """Mixed into ``UnifiedRadixCache``: needs ``req_to_token_pool`` and an allocator."""

    # ------------------------------------------------------------------ rows
    def _need_pools(self, what):
        if self.req_to_token_pool is None or self.token_to_kv_pool_allocator is None:
            raise ValueError(f"{what} needs req_to_token_pool and token_to_kv_pool_allocator")
        if self._mamba and self.enable_mamba_extra_buffer:
            pool = self.req_to_token_pool
            if not (getattr(pool, "enable_mamba_extra_buffer", False) and all(
                    callable(getattr(pool, m, None)) for m in (
                        "donate_mamba_ping_pong_slot", "get_mamba_ping_pong_other_idx",
                        "free_mamba_cache"))):
                raise TypeError(f"{what}: enable_mamba_extra_buffer needs a request pool with "
                                "ping-pong track buffers (flatradix.HybridReqToTokenPool or "
                                "SGLang's, built with enable_mamba_extra_buffer=True), got "
                                f"{type(pool).__name__}")

    # ------------------------------------------------------------------ Mamba
    def _mamba_own(self, req):
        """``req.kv.mamba_pool_idx`` checked (before any change): the request's
        state slot as an int, held in the state pool."""
        kv = getattr(req, "kv", req)
        idx = getattr(kv, "mamba_pool_idx", None)
        if idx is None:
            raise ValueError("req.mamba_pool_idx is None: a Mamba cache caches a request's "
                             "state, and this request holds none")
        own = self._vals.mamba_slot(idx, "req.mamba_pool_idx")
        if self.enable_mamba_extra_buffer:
            self._mamba_check_ping_pong(kv, own)
        return own

    def _mamba_check_ping_pong(self, kv, own):
        """Extra buffer, before any change: the ping-pong track buffer holds the
        pool's number of entries; ``mamba_ping_pong_empty`` says which are empty;
        every other entry is a state slot the pool handed out, the tree does not
        hold, and that is neither the request's own slot nor another entry.
        ``ValueError`` / ``TypeError`` naming the field."""
        size = self.req_to_token_pool.mamba_ping_pong_track_buffer_size
        buf = getattr(kv, "mamba_ping_pong_track_buffer", None)
        if buf is None:
            raise ValueError(f"req.mamba_ping_pong_track_buffer is None: with the extra buffer "
                             f"a request holds {size} track slots (HybridReqToTokenPool."
                             "alloc_mamba)")
        arr = as_int64(buf, "req.mamba_ping_pong_track_buffer")
        if arr.ndim != 1 or arr.shape[0] != size:
            raise ValueError(f"req.mamba_ping_pong_track_buffer must be 1-D with {size} "
                             f"entries, got shape {tuple(arr.shape)}")
        empty = getattr(kv, "mamba_ping_pong_empty", None)
        if empty is None or isinstance(empty, (str, bytes)) or len(empty) != size:
            raise ValueError(f"req.mamba_ping_pong_empty must be {size} bools, got {empty!r}")
        seen = {own}
        for p in range(size):
            if as_flag(empty[p], f"req.mamba_ping_pong_empty[{p}]"):
                continue
            slot = self._vals.mamba_slot(arr[p], f"req.mamba_ping_pong_track_buffer[{p}]")
            if slot in seen:
                raise ValueError(f"req.mamba_ping_pong_track_buffer[{p}]: slot {slot} is "
                                 "already the request's own state or another entry")
            seen.add(slot)

    def _mamba_fork(self, own):
        """A fresh slot holding a copy of the state in ``own`` (SGLang: an unfinished
        request forks its state into the tree). When the pool is empty one state is
        evicted first (``RuntimeError`` when none is evictable). The copy runs on the
        pool's own ``mamba_pool.copy_from`` when it has one (SGLang's pool); a pool
        without state tensors (flatradix's) has nothing to copy."""
        slot = self._mamba_alloc_slot()
        mp = getattr(self.req_to_token_pool, "mamba_pool", None)
        if mp is not None and callable(getattr(mp, "copy_from", None)):
            src_t, dst_t = self._vals.mamba_out(own), self._vals.mamba_out(slot)
            tr = getattr(self.req_to_token_pool, "translate_mamba_indices", None)
            if callable(tr):
                src_t, dst_t = tr(src_t), tr(dst_t)
            mp.copy_from(src_t, dst_t)
        return slot

    def _mamba_alloc_slot(self, req=None):
        """A fresh state slot (SGLang ``_alloc_mamba_slot``): one state is evicted
        first when the pool is empty (``RuntimeError`` when none is evictable).
        Lazy extra buffer, for a request's checkpoint (``req``): before that
        eviction the Mamba part of ``req.lock`` is released and its receipt
        marks MAMBA skipped (unless the lock skipped it already or released its
        SWA window early), so the final unlock does not release it again."""
        alloc = self._vals.mamba
        dst = alloc.alloc(1)
        if dst is None:
            lock = getattr(req, "lock", None) if self.enable_mamba_extra_buffer_lazy else None
            if lock is not None and not lock.swa_released:
                skipped = tuple(lock.receipt.skipped_lock_components)
                if ComponentType.MAMBA not in skipped:
                    others = tuple(c for c in self.components if c != ComponentType.MAMBA)
                    r = lock.receipt
                    self.dec_lock_ref(lock.node, DecLockRefParams(
                        r.node_id, others, dict(getattr(r, "component_lock_uuids", None) or {}),
                        dict(getattr(r, "component_host_lock_uuids", None) or {})))
                    lock.receipt.skipped_lock_components = skipped + (ComponentType.MAMBA,)
            self.evict(EvictParams(num_tokens=0, mamba_num=1))
            dst = alloc.alloc(1)
            if dst is None:
                raise RuntimeError("Can not alloc mamba cache: the Mamba state pool is empty "
                                   "and no state is evictable")
        return self._vals.mamba_slot(dst, "mamba_allocator.alloc(1)", check_held=False)

    def _mamba_tracked(self, req, up_to, finished, protected):
        """Extra buffer (SGLang ``prepare_for_caching_req`` / ``_select_finished_checkpoint``),
        validated before any change: ``(cache_len, keep)`` -- the length the tracked
        state belongs to (0: nothing to cache) and its ping-pong entry. A running
        request caches its latest tracked state; a finished one too when it lies
        within ``up_to``, else (2-entry buffer) the previous one when that does.
        The caller validated the buffer first (``_mamba_own``)."""
        kv = getattr(req, "kv", req)
        last = getattr(kv, "mamba_last_track_seqlen", None)
        if last is not None:
            last = as_count(last, "req.mamba_last_track_seqlen")
        if last is None or last == 0:
            return 0, None
        pool = self.req_to_token_pool
        size = pool.mamba_ping_pong_track_buffer_size
        keep = as_count(kv.mamba_last_track_idx, "req.mamba_last_track_idx")
        if keep >= size:
            raise ValueError(f"req.mamba_last_track_idx={keep} is not an entry of the "
                             f"{size}-entry track buffer")
        cache_len = last
        if finished and last > up_to:  # overshoot: the state ran past the key
            prev = getattr(kv, "mamba_prev_track_seqlen", None)
            if prev is not None:
                prev = as_count(prev, "req.mamba_prev_track_seqlen")
            if size != 2 or prev is None or prev > up_to or prev == 0:
                return 0, None
            cache_len, keep = prev, pool.get_mamba_ping_pong_other_idx(keep)
        if not finished and last > up_to:
            raise ValueError(f"req.mamba_last_track_seqlen={last} exceeds the {up_to} tokens "
                             "being cached")
        name = ("req.mamba_last_track_seqlen" if cache_len == last
                else "req.mamba_prev_track_seqlen")
        if cache_len < protected:
            raise ValueError(f"{name}={cache_len} lies below req.cache_protected_len="
                             f"{protected}: a tracked state is taken past the cached prefix")
        if cache_len % self.page_size:
            raise ValueError(f"{name}={cache_len} is not a multiple of page_size="
                             f"{self.page_size} (states are tracked on the checkpoint grid)")
        if as_flag(kv.mamba_ping_pong_empty[keep], f"req.mamba_ping_pong_empty[{keep}]"):
            raise ValueError(f"req.mamba_ping_pong_track_buffer[{keep}] is empty: no tracked "
                             "state to cache")
        return cache_len, keep

    def _mamba_release_own(self, req):
        """Free the request's own state slot (it holds one) and clear the field."""
        free = getattr(self.req_to_token_pool, "free_mamba_cache", None)
        if callable(free):  # SGLang's pool (and flatradix's): frees and clears the field
            free(req)
            return
        kv = getattr(req, "kv", req)
        self._vals.free_mamba(np.array([self._vals.mamba_slot(kv.mamba_pool_idx,
                                                              "req.mamba_pool_idx")],
                                       dtype=np.int64))
        kv.mamba_pool_idx = None

    @staticmethod
    def _check_req_type(req):
        if not (hasattr(req, "origin_input_ids") and hasattr(req, "req_pool_idx")):
            raise TypeError(f"req must be a Req (flatradix.Req or SGLang's), got "
                            f"{type(req).__name__}")

    def _row_index(self, req):
        """``req.req_pool_idx`` checked: an int naming an allocated row."""
        idx = req.req_pool_idx
        if idx is None:
            raise ValueError("req.req_pool_idx is None: the request holds no row")
        if isinstance(idx, bool) or not isinstance(idx, (int, np.integer)):
            raise TypeError(f"req.req_pool_idx must be an int, got {type(idx).__name__}")
        idx = int(idx)
        rows = self.req_to_token_pool.req_to_token.shape[0]
        if not 0 <= idx < rows:
            raise ValueError(f"req.req_pool_idx={idx} outside [0, {rows})")
        allocated = getattr(self.req_to_token_pool, "is_allocated", None)
        if allocated is not None and not allocated(idx):
            raise ValueError(f"req.req_pool_idx={idx} is not an allocated row (freed already?)")
        return idx

    def _row(self, req, n, name="req.kv_committed_len", start=0):
        """``req_to_token[req.req_pool_idx, start:n]`` as an int64 numpy copy. With
        flatradix's allocator, checks in one pass that every slot read is held
        (in range, not free), so that freeing them later cannot fail half-way."""
        idx = self._row_index(req)
        table = self.req_to_token_pool.req_to_token
        if n > table.shape[1]:
            raise ValueError(f"{name}: {n} tokens exceed the request row length {table.shape[1]}")
        row = table[idx, start:n]
        vals = self._vals
        if vals.dev is None and vals.device_values is not False and type(table) is not np.ndarray:
            self._device_values_start(table)
        dev = vals.dev
        if dev is not None:
            # device values: a view of the table's row, never read on the host
            # (debug_checks: checked on a host copy, as host values are)
            row = dev.native(row, f"req_to_token row {idx}")
            if dev.debug:
                host = dev.host_copy(row)
                if not vals.check_held(host, f"req_to_token row {idx}"):
                    check_range(host, vals.kv_bound(), f"req_to_token row {idx}")
            return row
        if is_torch(row):
            row = row.cpu().numpy()
        row = np.array(row, dtype=np.int64)
        vals.check_held(row, f"req_to_token row {idx}")  # flatradix's allocator: one pass
        return row

    def _write_row(self, req, start, values):
        if values.size == 0:
            return
        table = self.req_to_token_pool.req_to_token
        if is_torch(table):
            import torch

            table[req.req_pool_idx, start:start + values.size] = torch.from_numpy(values).to(
                device=table.device, dtype=table.dtype)
        else:
            table[req.req_pool_idx, start:start + values.size] = values

    def _free_slots(self, slots):
        if slots.shape[0]:
            self._vals.free(slots if self._vals.dev is not None
                            else np.ascontiguousarray(slots))

    @staticmethod
    def _committed_len(req):
        c = getattr(req, "kv_committed_len", None)
        if c is not None:
            return as_count(c, "req.kv_committed_len")
        return _seq_len(req, "origin_input_ids") + max(_seq_len(req, "output_ids") - 1, 0)

    def _protected_len(self, req):
        p = getattr(req, "cache_protected_len", None)
        if p is None:
            p = _seq_len(req, "prefix_indices") if req.prefix_indices is not None else 0
        return as_count(p, "req.cache_protected_len")

    def _check_last_node(self, req):
        """The request's lock must be releasable, checked before anything changes:
        ``req.lock`` (a ``TreeLock``, whose receipt the release replays) or, on a
        Full-only cache without one, ``req.last_node`` (None, or a live node with a
        lock anchored on it)."""
        lock = getattr(req, "lock", None)
        if lock is not None:
            if not isinstance(lock, TreeLock):
                raise TypeError(f"req.lock must be a flatradix.TreeLock or None, got "
                                f"{type(lock).__name__}")
            self._check_unlock(lock.node, lock.receipt, lock.swa_released, "req.lock")
        elif req.last_node is not None:
            self._check_unlock(req.last_node, None, False, "req.last_node")

    def _release_req_lock(self, req):
        """Release what ``_check_last_node`` checked (``req.lock`` or ``last_node``)."""
        lock = getattr(req, "lock", None)
        if lock is not None:
            self.unlock(lock)
            req.lock = None
        elif req.last_node is not None:
            self.dec_lock_ref(req.last_node)

    def _take_req_lock(self, req, node):
        """Lock ``node`` for the request: ``req.lock`` when the request has the field."""
        if hasattr(req, "lock"):
            req.lock = self.lock(node)
        else:
            self.inc_lock_ref(node)

    def _swa_cursor(self, req):
        """``req.swa_evicted_seqlen`` checked: an int >= 0, a multiple of the page size."""
        c = as_count(getattr(req, "swa_evicted_seqlen", 0) or 0, "req.swa_evicted_seqlen")
        if c % self.page_size:
            raise ValueError(f"req.swa_evicted_seqlen={c} is not a multiple of "
                             f"page_size={self.page_size}")
        return c

    def _slide_span(self, req, pre_len, protected, interval=1):
        """``(start, new)``: the row positions whose SWA slots slid out of the window
        once the request is ``pre_len`` tokens in (SGLang
        ``free_swa_out_of_window_slots``: up to ``pre_len - ceil(max(W, P) / P) * P``,
        page-aligned, from the cursor but never below ``protected``, which the tree
        owns); ``None`` when the interval has not passed. Reads only the request."""
        w, page = self._window, self.page_size
        cursor = self._swa_cursor(req)
        if pre_len - w < cursor + interval:
            return None
        start = max(cursor, protected)
        if self.disable:
            threshold = pre_len - w
        else:
            threshold = pre_len - -(-max(w, page) // page) * page
            floor = self._swa_retain_floor(req)
            if floor is not None:  # keep the window behind the tracked Mamba state
                threshold = min(threshold, floor)
        new = max(start, threshold)
        return start, new - new % page

    def _swa_retain_floor(self, req):
        """SGLang ``swa_retain_floor``: on a (FULL, SWA, MAMBA) cache, a request whose
        model runner tracked a state at ``req.mamba_last_track_seqlen`` keeps the
        SWA window behind it (a later match may land on that checkpoint):
        ``mamba_last_track_seqlen - W``; None otherwise. Validated (``ValueError``
        / ``TypeError`` naming the field)."""
        if not (self._mamba and self._swa):
            return None
        last = getattr(getattr(req, "kv", req), "mamba_last_track_seqlen", None)
        if last is None:
            return None
        return as_count(last, "req.mamba_last_track_seqlen") - self._window

    def _free_out_of_window(self, req, row, pre_len, protected, interval=1, span=None):
        """Free the SWA slots of ``_slide_span`` and advance ``req.swa_evicted_seqlen``
        past them. ``row``: the row's slots (int64) from position 0, or -- with
        ``span`` given -- exactly ``row[start:new]``. Returns the new cursor."""
        if span is None:
            span = self._slide_span(req, pre_len, protected, interval)
            if span is None:
                return self._swa_cursor(req)
            row = row[span[0]:span[1]]
        start, new = span
        req.swa_evicted_seqlen = start
        if new > start:
            self._vals.free_split(_EMPTY, np.ascontiguousarray(row))
            req.swa_evicted_seqlen = new
        return req.swa_evicted_seqlen

    @staticmethod
    def _req_key(req, key):
        """``key`` with its list swapped for ``req``'s memoised int64 copy when the
        list *is* the request's ``origin_input_ids`` or ``fill_ids``."""
        toks = key.token_ids
        for attr in ("fill_ids", "origin_input_ids"):
            if getattr(req, attr, None) is toks:
                return RadixKey(_req_tokens(req, attr), key.extra_key, key.cache_salt,
                                key.is_bigram)
        return key

    def _request_key(self, req, token_ids):
        return RadixKey(token_ids, getattr(req, "extra_key", None), getattr(req, "cache_salt", None),
                        is_bigram=self.is_eagle)

    # ------------------------------------------------------------------ core
    def checkpoint(self, req, up_to, *, finished=False):
        """Insert the request's tokens ``[0, up_to)`` with its row's KV indices and
        re-anchor its lock (SGLang 0.5.23 ``checkpoint``).

        Steps: insert the page-aligned key (duplicate slots from
        ``cache_protected_len`` up to the reused prefix are freed); on a Full-only
        tree re-insert the page-aligned prompt with ``priority + 1`` so the prompt
        and the output live in separate nodes; rewrite the row with the tree's
        canonical slots; move the lock from ``req.last_node`` to the new last node
        (released instead when ``finished``). Sets ``req.prefix_indices``,
        ``req.last_node``, ``req.cache_protected_len``, ``req.cache_inserted_len``.
        The unaligned tail ``[aligned, up_to)`` stays owned by the request.
        Returns the page-aligned length cached.

        Every field read is validated first (``TypeError`` / ``ValueError`` naming
        it: token lists, lengths, the row and its KV slots; ``NodeAccessError`` /
        ``LockRefError`` for a ``req.last_node`` that is stale or holds no lock);
        nothing changes then. Mamba: a running request's fork needs a free state
        slot; with the pool empty one state is evicted first, and when none is
        evictable ``RuntimeError("Can not alloc mamba cache ...")`` is raised,
        nothing changed (SGLang asserts). With ``enable_mamba_extra_buffer`` the
        key ends at ``req.mamba_last_track_seqlen`` (0 cached when no state was
        tracked since the last checkpoint; see ``HybridReqToTokenPool``), and the
        pool must have the ping-pong track buffers (``TypeError`` otherwise).
        With ``enable_mamba_extra_buffer_lazy`` a running request's fork on an
        empty state pool first releases the Mamba part of ``req.lock`` (its
        receipt then skips MAMBA), so the request's matched state may be
        evicted for it; when nothing is evictable even then, the
        ``RuntimeError`` leaves that part released.
        """
        self._need_pools("checkpoint")
        self._check_req_type(req)
        up_to = as_count(up_to, "up_to")
        if self.disable:  # SGLang: a disabled cache caches nothing; the request keeps its KV
            return 0
        return self._checkpoint(req, up_to, finished, None)

    def _checkpoint(self, req, up_to, finished, row):
        """``checkpoint`` with ``up_to`` validated; ``row``: the request's row
        (int64 copy, at least ``up_to`` long) when the caller already read it."""
        # fill_ids is a prefix of origin_input_ids + output_ids; a finished request's
        # fill_ids may be stale (shorter), then the full list is used.
        n_prompt = _seq_len(req, "origin_input_ids")
        if req.fill_ids is not None and _seq_len(req, "fill_ids") >= up_to:
            all_ids = _req_tokens(req, "fill_ids")
        else:
            _seq_len(req, "output_ids")
            all_ids = np.concatenate([_req_tokens(req, "origin_input_ids"),
                                      _req_tokens(req, "output_ids")])
        if up_to > all_ids.size:
            raise ValueError(f"up_to={up_to} exceeds the request's {all_ids.size} tokens")
        protected = self._protected_len(req)
        if protected > up_to:
            raise ValueError(f"req.cache_protected_len={protected} exceeds the {up_to} tokens "
                             "being cached")
        inserted = as_count(getattr(req, "cache_inserted_len", 0) or 0, "req.cache_inserted_len")
        priority = as_int(getattr(req, "priority", None) or 0, "req.priority")
        eagle = 1 if self.is_eagle else 0
        effective = up_to
        branching = None
        if self._swa:
            if protected % self.page_size:
                raise ValueError(f"req.cache_protected_len={protected} is not a multiple of "
                                 f"page_size={self.page_size}")
            self._swa_cursor(req)
            self._swa_retain_floor(req)  # validated here: read after the changes begin
            # SGLang prepare_for_caching_req: a first checkpoint after a match that
            # stopped short of its Full hit inserts only up to the branching point --
            # not with Mamba, whose state belongs to the whole key (SGLang's SWA
            # component leaves the length to Mamba's then)
            branching = getattr(req, "swa_branching_seqlen", None)
            if branching is not None:
                branching = as_count(branching, "req.swa_branching_seqlen")
                if self._mamba or branching <= protected or branching + eagle > up_to:
                    branching = None
                else:
                    effective = branching + eagle
        extra = self._mamba and self.enable_mamba_extra_buffer
        keep = None
        own = self._mamba_own(req) if self._mamba else -1  # (extra: and the ping-pong buffer)
        if extra:  # the key ends where the tracked state was taken
            track_len, keep = self._mamba_tracked(req, up_to, finished, protected)
            effective = min(effective, track_len)
        key = self._request_key(req, all_ids[:effective])
        units, aligned, nk, _ = self._key(key, "req")
        with self._mutex:  # the row's slots and the lock are checked where they can't change
            if row is None:
                row = self._row(req, up_to, "up_to")
            self._check_last_node(req)
            # every check is done: from here on the request and the tree change
            kv = getattr(req, "kv", req)
            if extra and effective <= 0:
                # SGLang: no state tracked since the last checkpoint, nothing is
                # inserted; a finished request gives its states back
                if finished:
                    self._mamba_release_own(req)
                    self._release_req_lock(req)
                    req.last_node = None
                else:
                    kv.mamba_last_track_seqlen = kv.mamba_prev_track_seqlen = None
                return 0
            if extra:
                # SGLang prepare_for_caching_req with the extra buffer: a finished
                # request donates the tracked entry, a running one swaps a fresh
                # slot into that entry and donates the tracked state
                if finished:
                    mslot = self._vals.mamba_slot(kv.mamba_ping_pong_track_buffer[keep],
                                                  "req.mamba_ping_pong_track_buffer")
                else:
                    fresh = self._mamba_alloc_slot(req)
                    mslot = self._vals.mamba_slot(
                        self.req_to_token_pool.donate_mamba_ping_pong_slot(
                            req, self._vals.mamba_out(fresh)),
                        "donate_mamba_ping_pong_slot", check_held=False)
            else:
                # Mamba (SGLang prepare_for_caching_req, no extra buffer): a finished
                # request donates its own state, a running one forks a copy
                mslot = own if finished else (self._mamba_fork(own) if self._mamba else -1)
            exist = True
            cursor = 0
            if self._swa:
                if not finished:
                    cursor = self._free_out_of_window(req, row, units.shape[0] - 1, protected)
                else:
                    cursor = self._swa_cursor(req)
            old_node = req.last_node
            branch_inserted = False
            if aligned <= 0:
                new_node = old_node
            else:
                values = row[:aligned]
                dev = self._vals.dev
                if dev is not None:
                    # device values: the row's range checked on the device (debug_checks:
                    # _row checked it on the host)
                    limit = L.VALUES_UNCHECKED
                    if not dev.debug:
                        bound = self._vals.kv_bound()
                        dev.record(values, 0, None if bound < 0 else bound,
                                   "req row (req_to_token_pool)")
                else:
                    # _row checked every slot held when flatradix's allocator is
                    # attached, which implies the kernel's bound check: skip that pass then
                    limit = L.VALUES_UNCHECKED if self._vals.checks_held else self._vals.kv_bound()
                plen, new_node, _, path, _, exist = self._insert_units(
                    units, values, aligned, nk, protected, inserted, priority, limit,
                    "req row (req_to_token_pool)", want_path=True, keep_own=True, cursor=cursor,
                    mamba_slot=mslot)
                if dev is not None:
                    # the tree's values of [0, plen) (one gather); the row, a view of
                    # the table, takes them from the protected length on
                    tree_vals = dev.resolve(path[:plen], values)
                    if protected < plen:
                        dev.ops.copy(row[protected:plen], tree_vals[protected:plen])
                else:
                    self._vals.note_kind(values)
                    # the path's value: the tree's slots for the cached prefix, ours after it
                    row[:plen] = path[:plen]
                if self.components == (ComponentType.FULL,):
                    prompt_units = n_prompt - eagle
                    prompt = prompt_units - prompt_units % self.page_size
                    if 0 < prompt < aligned:
                        self._insert_units(units, values, prompt, nk, prompt, prompt,
                                           min(priority + 1, (1 << 62) - 1), L.VALUES_UNCHECKED,
                                           "req row")
                if protected < plen and dev is None:
                    self._write_row(req, protected, np.ascontiguousarray(row[protected:plen]))
                req.cache_inserted_len = max(inserted, aligned)
                # the inserted key is the page-aligned one (SGLang aligns before insert)
                branch_inserted = branching is not None and aligned >= branching
            if extra:  # SGLang cleanup_after_caching_req, extra buffer
                if not exist:
                    self._vals.mamba_owned.add(mslot)
                if finished:  # every slot of the request but the adopted entry goes back
                    self.req_to_token_pool.free_mamba_cache(
                        req, mamba_ping_pong_track_buffer_to_keep=None if exist else keep)
                else:
                    if exist:
                        self._vals.free_mamba(np.array([mslot], dtype=np.int64))
                    kv.mamba_last_track_seqlen = kv.mamba_prev_track_seqlen = None
            elif self._mamba:  # SGLang cleanup_after_caching_req
                if not exist:       # the tree took the slot
                    self._vals.mamba_owned.add(mslot)
                    if finished:
                        getattr(req, "kv", req).mamba_pool_idx = None
                elif finished:
                    self._mamba_release_own(req)
                else:
                    self._vals.free_mamba(np.array([mslot], dtype=np.int64))
            self._release_req_lock(req)
            if not finished and new_node is not None:
                self._take_req_lock(req, new_node)
            req.last_node = None if finished else new_node
            req.cache_protected_len = max(aligned, 0) if aligned > 0 else protected
            dev = self._vals.dev
            if dev is None:
                req.prefix_indices = self._vals.out(np.ascontiguousarray(row[:up_to]))
            elif aligned > 0:   # the tree's values, then the row's own (a new array)
                req.prefix_indices = dev.cat([tree_vals, dev.ops.int64(row[plen:up_to])]
                                             if plen < up_to else [tree_vals])
            else:
                req.prefix_indices = dev.ops.clone(row[:up_to])
            if branch_inserted:
                # SGLang cleanup_after_caching_req: the branch is cached; a running
                # request then frees the SWA slots that slid out of its window
                req.swa_branching_seqlen = None
                if not finished:
                    self._free_out_of_window(req, row, _seq_len(req, "fill_ids") - eagle - 1,
                                             req.cache_protected_len)
        return max(aligned, 0)

    def release_kv_cache(self, req, checkpoint=True):
        """Finish a request (SGLang 0.5.23 ``release_kv_cache``): cache its committed
        tokens when ``checkpoint``, free every row slot the tree does not own
        (unaligned tail, over-allocated slots, or everything past the protected
        prefix when not checkpointing), unlock, and free the request row.

        Validated before anything changes (see ``checkpoint``): ``req`` itself,
        its row (an allocated ``req_pool_idx`` whose slots are allocated),
        ``kv_committed_len`` <= ``kv_allocated_len`` <= row length,
        ``req.last_node``; a second release of the same request raises
        ``ValueError`` (its ``req_pool_idx`` is None then). On a cache built with
        ``disable=True`` every slot of the row is freed (nothing is cached), as in
        SGLang; ``checkpoint`` is then a no-op returning 0."""
        self._need_pools("release_kv_cache")
        self._check_req_type(req)
        checkpoint = as_flag(checkpoint, "checkpoint")
        committed = self._committed_len(req)
        allocated = getattr(req, "kv_allocated_len", None)
        allocated = committed if allocated is None else as_count(allocated, "req.kv_allocated_len")
        if allocated < committed:
            raise ValueError(f"req.kv_allocated_len={allocated} < committed length {committed}")
        if getattr(req, "kv_committed_len", None) is not None:  # else derived from the lengths
            n_tokens = _seq_len(req, "origin_input_ids") + _seq_len(req, "output_ids")
            if req.fill_ids is not None:
                n_tokens = max(n_tokens, _seq_len(req, "fill_ids"))
            if committed > n_tokens:
                raise ValueError(f"req.kv_committed_len={committed} exceeds the request's "
                                 f"{n_tokens} tokens")
        with self._mutex:
            row = self._row(req, allocated,
                            "req.kv_allocated_len" if allocated > committed else "req.kv_committed_len")
            if self.disable:
                # a disabled cache holds nothing (SGLang: the whole row goes back, and
                # a Mamba request's state)
                keep = 0
                held = self._mamba and getattr(getattr(req, "kv", req), "mamba_pool_idx",
                                               None) is not None
                if held:
                    self._mamba_own(req)  # (ping-pong entries validated too)
                req.last_node = None
                if held:
                    self._mamba_release_own(req)
            elif checkpoint:
                self._checkpoint(req, committed, True, row)
                keep = self._protected_len(req)
            else:
                keep = self._protected_len(req)
                if keep > allocated:
                    raise ValueError(f"req.cache_protected_len={keep} exceeds "
                                     f"req.kv_allocated_len={allocated}")
                if self._swa:
                    self._swa_cursor(req)
                own = self._mamba_own(req) if self._mamba else -1
                self._check_last_node(req)
                if own >= 0:  # SGLang on_release: not checkpointed, the state goes back
                    self._mamba_release_own(req)
                self._release_req_lock(req)
                req.last_node = None
            if self._swa:
                # SGLang free_kv_row: below the SWA cursor only the Full side is left
                # (a disabled cache's request slides too)
                dead = min(max(self._swa_cursor(req), keep), allocated)
                self._vals.free_split(np.ascontiguousarray(row[keep:allocated]),
                                      np.ascontiguousarray(row[dead:allocated]))
                req.swa_evicted_seqlen = 0
            else:
                self._free_slots(row[keep:allocated])
            self.req_to_token_pool.free(req.req_pool_idx)
            req.req_pool_idx = None

    # ------------------------------------------------------------------ SWA, scheduler-side
    def evict_sliding_windows(self, req, pre_len, eviction_interval=1):
        """Free the SWA slots that slid out of a running request's window (SGLang
        ``evict_sliding_windows``, what the scheduler calls per decode step with
        ``pre_len = seqlen - 1``): once ``pre_len - W >= req.swa_evicted_seqlen +
        eviction_interval``, the row's SWA slots from the cursor (at least
        ``cache_protected_len``: the tree owns the prefix) up to
        ``pre_len - ceil(max(W, P) / P) * P`` (page-aligned) go back to the SWA
        pool and the cursor moves there. No-op without SWA or for a request that
        holds no row. Errors (``TypeError`` / ``ValueError`` naming the field)
        before anything changes. O(freed)."""
        self._check_req_type(req)
        pre_len = as_count(pre_len, "pre_len")
        interval = as_count(eviction_interval, "eviction_interval")
        if not self._swa or req.req_pool_idx is None:
            return
        self._need_pools("evict_sliding_windows")
        protected = self._protected_len(req)
        if protected % self.page_size:
            raise ValueError(f"req.cache_protected_len={protected} is not a multiple of "
                             f"page_size={self.page_size}")
        span = self._slide_span(req, pre_len, protected, interval)
        if span is None:
            return
        with self._mutex:  # only the slid slots are read: O(freed), not O(pre_len)
            width = self.req_to_token_pool.req_to_token.shape[1]
            if pre_len > width:
                raise ValueError(f"pre_len: {pre_len} tokens exceed the request row length {width}")
            row = self._row(req, span[1], "pre_len", start=span[0])
            self._free_out_of_window(req, row, pre_len, protected, interval, span)

    def release_swa_prefix_lock(self, req):
        """The request's window moved past its cached prefix: release the SWA part of
        its lock early (``release_swa(req.lock)``) when that lock holds a window
        with a boundary. No-op otherwise."""
        lock = getattr(req, "lock", None)
        if lock is None or not self._swa:
            return
        uuids = getattr(lock.receipt, "component_lock_uuids", {}) or {}
        if uuids.get(ComponentType.SWA) is not None:
            self.release_swa(lock)

    # ------------------------------------------------------------------ old names
    def cache_unfinished_req(self, req, chunked=False):
        """Cache a running request's ``fill_ids`` (SGLang <= 0.5.22 name of
        ``checkpoint(req, len(req.fill_ids))``). Errors as ``checkpoint``."""
        self._check_req_type(req)
        return self.checkpoint(req, _seq_len(req, "fill_ids"))

    def cache_finished_req(self, req, is_insert=True):
        """Cache a finished request and release it (SGLang <= 0.5.22 name of
        ``release_kv_cache(req, checkpoint=is_insert)``). Errors as
        ``release_kv_cache``; ``is_insert`` must be a bool."""
        return self.release_kv_cache(req, checkpoint=as_flag(is_insert, "is_insert"))
