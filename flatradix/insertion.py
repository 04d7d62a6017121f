"""The cache's ``insert`` (and the SWA parameters it reads). A method of
``UnifiedRadixCache`` (taking the cache as ``self``), kept in its own module;
the kernel call and its actions are the cache's ``_insert_units``, shared with
the request path.
"""

from collections.abc import Mapping

import numpy as np

from ._cast import as_count, as_int, as_int64
from .config import _component
from .kernels import layout as L
from .types import ComponentType, InsertParams, InsertResult
from .values import check_range


def insert(self, params):
    """Insert ``params.key`` -> ``params.value`` (an ``InsertParams``).

    The key and value are page-aligned down (the unaligned tail stays the
    caller's). Returns ``InsertResult(prefix_len, ..., last_device_node)``.
    The slots ``value[prev_prefix_len:prefix_len]`` duplicate cached ones:
    they are freed through the allocator when one is attached, else returned
    in ``duplicate_indices``. O(len(key)).

    SWA caches (spec §6.2): positions below the request's SWA cursor
    (``params.component_evicted_seqlens[SWA]``) are inserted as tombstones and
    their duplicates freed Full-only; a matched tombstone at or past the
    cursor is recovered from ``value`` (its duplicate is then the tree's);
    the new leaf keeps at most ``ceil(W / P) * P`` tokens of SWA data (an
    older part becomes its parent). Mamba caches (spec §6.3):
    ``params.mamba_value`` (a 1-element slot of ``req_to_token_pool.
    mamba_allocator``) is required; the new leaf -- or the node the key ended
    on, when it has no state -- takes it; when that node already has a state,
    ``mamba_exist`` is True and the slot stays the caller's to free.
    ``swa_branch_inserted`` is
    ``len(key) >= params.swa_branching_seqlen`` when the latter is set;
    ``adopted_ranges`` (when tracked) lists per component the ranges whose
    slots the tree took over.

    A key that is empty after page alignment (shorter than a page) is a
    no-op: nothing is touched (SGLang touches the root's recency, which
    nothing reads), ``prefix_len == 0``, ``last_device_node`` is the root
    and the value stays the caller's. ``prev_prefix_len`` and ``inserted_len``
    beyond the key's length mean "all of it" (any int >= 0 is accepted).

    Raises ``TypeError``/``ValueError`` naming the argument for a malformed
    key or value (wrong type, dtype, shape or length, negative or
    out-of-range KV index; with flatradix's allocator attached, a slot it has
    not handed out: free, slot 0, or given twice; with its SWA allocator, a
    slot at or past the SWA cursor without an SWA peer, or one below it and
    past ``prev_prefix_len`` with an SWA peer still), a negative or
    unaligned SWA cursor or SWA parameters on a cache without SWA, before
    anything changes.
    """
    if not isinstance(params, InsertParams):
        raise TypeError(f"params must be a flatradix.InsertParams, got {type(params).__name__}")
    units, n, nk, raw = self._key(params.key, "params.key")
    prev = as_count(params.prev_prefix_len, "params.prev_prefix_len")
    inserted_len = as_count(params.inserted_len, "params.inserted_len")
    priority = as_int(params.priority if params.priority is not None else 0, "params.priority")
    mamba_slot = -1
    if params.mamba_value is not None:
        if not self._mamba:
            raise ValueError("params.mamba_value given, but this cache has no Mamba component")
        mamba_slot = self._vals.mamba_slot(params.mamba_value, "params.mamba_value")
    cursor, branching = self._swa_params(params)
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
        vals = self._vals
        # device values: the first device value turns the arena on (auto mode), once
        # it passed its checks (a refused call changes nothing, that choice included)
        ops = (vals.device_ops(params.value)
               if vals.dev is None and vals.device_values is not False else None)
        if ops is None and vals.dev is None and vals.device_values is True:
            self._device_values_start(params.value)   # TypeError: a host value
        native = vals.dev.ops if vals.dev is not None else ops
        value = (as_int64(params.value, "params.value") if native is None
                 else native.native(params.value, "params.value"))
        bigram = params.key.is_bigram or self.is_eagle
        ok = value.shape[0] == nlog or (bigram and value.shape[0] == raw.shape[0])
        if not ok:
            k = value.shape[0]
            raise ValueError(f"params.value has {k} {'entry' if k == 1 else 'entries'} but "
                             f"params.key has {nlog} logical {'unit' if nlog == 1 else 'units'}")
        if vals.dev is None and vals.device_values is not False:
            # decided once: the arena, or host values (device_values becomes False)
            self._device_values_start(params.value)
            if vals.dev is None and ops is not None:   # SWA / Mamba, or host values stored
                value = as_int64(params.value, "params.value")
        name = "params.value"
        limit = self._vals.kv_bound()  # checked by the kernel, before anything changes
    if self.disable:
        return InsertResult(prefix_len=0)
    dev = self._vals.dev
    if dev is not None:
        if params.value is None:
            raise ValueError("params.value is None: with device values the KV indices "
                             "must be given (a device array)")
        if dev.debug:   # debug_checks: the host path's checks, on a host copy
            host = dev.host_copy(value)
            if not (limit != L.VALUES_UNCHECKED and self._vals.check_held(host, name)):
                check_range(host, limit, name)
        elif n and limit != L.VALUES_UNCHECKED:
            with self._mutex:   # (the checks' ring is the cache's)
                dev.record(value[:n], 0, None if limit < 0 else limit, name)
        limit = L.VALUES_UNCHECKED
    if n == 0:  # documented no-op (see above): no namespace, no clock tick
        if limit != L.VALUES_UNCHECKED and value.shape[0] and (
                value.min() < 0 or (limit >= 0 and value.max() >= limit)):
            bound = f"[0, {limit})" if limit >= 0 else ">= 0"
            raise ValueError(f"{name}: KV indices must be in {bound}")
        dup_out = None if self.token_to_kv_pool_allocator is not None else self._vals.empty()
        # (SGLang returns before the component commits: swa_branch_inserted False)
        return InsertResult(prefix_len=0, last_device_node=self._root, duplicate_indices=dup_out,
                            mamba_exist=True)
    if self._mamba and mamba_slot < 0:
        raise ValueError("params.mamba_value is required with ComponentType.MAMBA (the "
                         "state slot donated to the inserted node)")
    if dev is None and limit != L.VALUES_UNCHECKED and self._vals.check_held(value, name):
        # flatradix's allocator: every slot is held (allocated, in 1..size, not
        # given twice), which implies the kernel's bound check: skip that pass
        limit = L.VALUES_UNCHECKED
    if self._swa:
        self._vals.check_swa_peers(value[:n], prev, cursor, name)
    branch_inserted = branching is not None and nlog >= branching
    track = bool(params.track_adopted_ranges)
    plen, target, dup, _, adopted, exist = self._insert_units(
        units, value, n, nk, prev, inserted_len, priority, limit, name, cursor=cursor,
        track=track and (self._swa or self._hicache.on), mamba_slot=mamba_slot)
    if params.value is not None and dev is None:
        self._vals.note_kind(params.value)
    if mamba_slot >= 0 and not exist:
        self._vals.mamba_owned.add(mamba_slot)
    dup_out = (None if self.token_to_kv_pool_allocator is not None
               else dup if dev is not None else self._vals.out(dup))
    if track:
        if self._swa or self._hicache.on:
            adopted = {ComponentType(c): r for c, r in adopted.items()}
        else:  # only components that adopted something appear (SGLang: {} when none)
            adopted = {ComponentType.FULL: [(plen, n)]} if n > plen else {}
    result = InsertResult(prefix_len=plen, last_device_node=target, adopted_ranges=adopted,
                          duplicate_indices=dup_out, mamba_exist=exist,
                          swa_branch_inserted=branch_inserted)
    if self._hicache.on:
        # a backup's copy failed: raised once all is done, carrying the insert's
        # result (a Mamba caller frees its slot on mamba_exist)
        self._hicache.raise_transfer_error(result)
    return result

def _swa_params(self, params):
    """``(cursor, swa_branching_seqlen)`` of an ``InsertParams``, validated."""
    evicted = params.component_evicted_seqlens
    if type(evicted) is dict and not evicted and params.swa_branching_seqlen is None:
        return 0, None   # the common case: nothing to check
    if not isinstance(evicted, Mapping):
        raise TypeError("params.component_evicted_seqlens must be a dict, got "
                        f"{type(evicted).__name__}")
    cursor = 0
    for c, v in evicted.items():
        c = _component(c, "params.component_evicted_seqlens key")
        v = as_count(v, f"params.component_evicted_seqlens[{c.name}]")
        if v and c not in self.components:
            raise ValueError(f"params.component_evicted_seqlens[{c.name}]={v}, but this "
                             f"cache has no {c.name} component")
        if c == ComponentType.SWA:
            if v % self.page_size:
                raise ValueError(f"params.component_evicted_seqlens[SWA]={v} is not a "
                                 f"multiple of page_size={self.page_size}")
            cursor = v
    branching = params.swa_branching_seqlen
    if branching is not None:
        branching = as_count(branching, "params.swa_branching_seqlen")
        if not self._swa:
            raise ValueError("params.swa_branching_seqlen given, but this cache has no "
                             "SWA component")
    return cursor, branching
