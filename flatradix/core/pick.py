"""Pick-then-evict: SGLang 0.5.23's TreeCore eviction protocol over the step-wise rounds.

SGLang's controller drives a device-eviction round in two calls per victim
(``UnifiedTreeCoreInterface``): ``evict_device_next_node`` *picks* the next
victim and ``evict_device_leaf`` evicts it, so the controller can decide in
between (a write-back backup, an allocator check). ``core/evict.py``'s
``evict_next`` does both in one step (flatradix's own cache never needs the
gap); these two kernels split it, over the same round state (``evict_start``
/ ``evict_end`` open and close the round, the Full round's snapshot heap and
the SWA / Mamba cursors are ``evict_next``'s):

* ``evict_pick``: Full -- the next leaf by the keys the round started with
  (the previous pick's parent pushed first when it became an evictable leaf),
  returned, *not* evicted. SWA / Mamba -- from the round's cursor: an
  evictable device leaf is returned, not evicted; any other node is
  tombstoned here (one internal step, its frees as actions), as SGLang's
  component walks do.
* ``evict_leaf_at``: evict one picked device leaf (``evict.evict_leaf``:
  demoted when it has a host copy, else deleted).

The round's request is compared with the caller's running total (SGLang's
``tracker``), not with ``meta[M_EVICT_DONE]``: the caller counts what each
``evict_leaf_at`` freed.
"""

import numpy as np

from ..components import dispatch
from ..kernels._jit import kernel
from ..kernels.actions import acts_begin
from ..kernels.layout import (
    E_CAPACITY, E_NEED_BACKUP, E_NEED_STATE_BACKUP, E_NO_WALK, E_NOT_LEAF, E_STALE,
    F_HAS_FULL_HOST, FLAGS, FULL, HEAP_POS, HOST_WRITE_BACK, M_COMPONENTS,
    M_EVICT_CURSOR, M_EVICT_REQ, M_EVICT_WALK, M_HOST, M_WALK_N, M_WALK_PARENT, MAMBA,
    N_COMPONENTS, NIL, OK, PARENT, SWA, WALK_NID,
)
from ..kernels.lru import lru_list, lru_prev_unlocked
from ..kernels.order import is_device_leaf
from ..kernels.state import node_id, resolve
from .evict import _aux_cursor, _id_or_nil, _short, _walk_pop, _walk_push, evict_leaf, evict_tombstone


@kernel(scratch=("out", "acts"), on_capacity="retry")
def evict_pick(nodes, ctab, pool, heap, meta, component, done, out, acts):
    """One pick of the open round of ``component``; ``done``: the units (Full,
    SWA) or states (Mamba) of it the caller counted as evicted so far.

    Returns ``(status, node_id, full_units, swa_units, mamba_states)``:

    * ``(OK, id, 0, 0, 0)``: the victim ``id``, an evictable device leaf, left
      in place (``evict_leaf_at`` evicts it);
    * ``(OK, -1, f, w, m)`` with a count > 0: an SWA / Mamba round tombstoned an
      internal node here (its frees are the call's actions);
    * ``(OK, -1, 0, 0, 0)``: the round is over (``done`` reached the request, or
      nothing is left);
    * ``(E_NEED_STATE_BACKUP, id, 0, units, 0)``: write-back, an internal victim
      whose data has no host copy (as ``evict_next``; the cursor moved on);
    * ``E_CAPACITY`` (``meta[M_NEED_*]``), nothing changed; ``E_NO_WALK``.
    """
    if not meta[M_EVICT_WALK + component]:
        return E_NO_WALK, -1, 0, 0, 0
    acts_begin(meta, 0)
    if done >= meta[M_EVICT_REQ + component]:
        return OK, -1, 0, 0, 0
    if component == FULL:
        p = resolve(nodes, meta, meta[M_WALK_PARENT])
        meta[M_WALK_PARENT] = NIL
        if p >= 0 and nodes[p, HEAP_POS] >= 0:
            _walk_push(nodes, heap, meta, p)
        while meta[M_WALK_N] > 0:  # skip stale entries (deleted, locked, not a leaf)
            s = resolve(nodes, meta, heap[WALK_NID, 0])
            _walk_pop(heap, meta)
            if s >= 0 and nodes[s, HEAP_POS] >= 0:
                meta[M_WALK_PARENT] = node_id(nodes, nodes[s, PARENT])
                return OK, node_id(nodes, s), 0, 0, 0
        return OK, -1, 0, 0, 0
    lst = lru_list(component)
    x = _aux_cursor(nodes, meta, component, lst)
    if x == NIL:
        return OK, -1, 0, 0, 0
    nid = node_id(nodes, x)
    if is_device_leaf(nodes, x):
        meta[M_EVICT_CURSOR + component] = _id_or_nil(nodes, lru_prev_unlocked(nodes, lst, x))
        return OK, nid, 0, 0, 0
    if _short(nodes, acts, out, meta, x):
        return E_CAPACITY, -1, 0, 0, 0
    meta[M_EVICT_CURSOR + component] = _id_or_nil(nodes, lru_prev_unlocked(nodes, lst, x))
    if meta[M_HOST] == HOST_WRITE_BACK and not (nodes[x, FLAGS] & F_HAS_FULL_HOST):
        units = dispatch.internal_backup(component, nodes, meta, x, out)
        if units >= 0:
            return E_NEED_STATE_BACKUP, nid, 0, (units if component == SWA else 0), 0
    done = np.zeros(N_COMPONENTS, np.int64)
    evict_tombstone(nodes, pool, meta, component, x, out, acts, done)
    return OK, -1, 0, done[SWA], done[MAMBA]


@kernel(scratch=("out", "acts"), on_capacity="retry")
def evict_leaf_at(nodes, ctab, pool, heap, meta, nid, out, acts):
    """Evict the device leaf ``nid`` (SGLang ``evict_device_leaf``): demoted when it
    has a Full host copy, else deleted with every component's data (the frees
    are the call's actions). Returns ``(status, full_units, swa_units,
    mamba_states, had_host)``; ``E_STALE``, ``E_NOT_LEAF`` (not an evictable
    device leaf), ``E_NEED_BACKUP`` (write-back: no host copy yet; nothing
    changed) or ``E_CAPACITY``, nothing changed."""
    s = resolve(nodes, meta, nid)
    if s < 0:
        return E_STALE, 0, 0, 0, 0
    acts_begin(meta, 0)
    if not is_device_leaf(nodes, s):
        return E_NOT_LEAF, 0, 0, 0, 0
    backed = (nodes[s, FLAGS] & F_HAS_FULL_HOST) != 0
    if meta[M_HOST] == HOST_WRITE_BACK and not backed:
        return E_NEED_BACKUP, 0, 0, 0, 0
    if _short(nodes, acts, out, meta, s):
        return E_CAPACITY, 0, 0, 0, 0
    w = dispatch.held(SWA, nodes, meta, s) if meta[M_COMPONENTS] & (1 << SWA) else 0
    m = dispatch.held(MAMBA, nodes, meta, s) if meta[M_COMPONENTS] & (1 << MAMBA) else 0
    n = evict_leaf(nodes, ctab, pool, heap, meta, s, out, acts)
    return OK, n, w, m, 1 if backed else 0


@kernel(scratch=("out", "acts"), on_capacity="retry")
def evict_component_at(nodes, ctab, pool, heap, meta, nid, component, out, acts):
    """Tombstone auxiliary ``component``'s (SWA, Mamba) device data on node ``nid``,
    nothing else (no cascade, no leaf deletion): SGLang's test-only
    ``evict_component(node, c, DEVICE)``. Returns ``(status, units)``: SWA units
    or Mamba states freed (0 when the node has none), the frees as actions;
    ``E_STALE``, or ``E_CAPACITY`` with nothing changed."""
    s = resolve(nodes, meta, nid)
    if s < 0:
        return E_STALE, 0
    acts_begin(meta, 0)
    if _short(nodes, acts, out, meta, s):
        return E_CAPACITY, 0
    if component == FULL or not meta[M_COMPONENTS] & (1 << component) \
            or dispatch.held(component, nodes, meta, s) == 0:
        return OK, 0
    return OK, dispatch.evict_internal(component, nodes, pool, meta, s, out, acts)
