"""Device eviction: whole rounds (``evict``) and step-wise rounds, per component.

Full (SGLang §5.4): victims come from the incrementally kept heap of
evictable device leaves (``kernels/order.py``); when a leaf is deleted its
parent re-enters the heap if it became a leaf, so chains collapse bottom-up.

SWA (§6.2): victims come from the SWA LRU tail, skipping window-locked entries;
a victim that is an evictable device leaf is deleted whole (Full counts too),
any other is tombstoned (``components/swa.py: evict_component``; on an internal
node SWA's cascade reaches only lower-priority components, none yet). Within
one ``evict`` call every entry the walk passes is deleted, tombstoned or
locked, so the next victim is always the LRU's least recent unlocked entry.
A step-wise Full round (§5.4) takes its victims as SGLang's does: from a heap
of the evictable leaves *keyed at the round's start* (heap rows ``WALK_*``:
``(key0, key1, node id)`` entries), the previous victim's parent pushed with
its current key when it became an evictable leaf, stale entries (a node
deleted, locked or no longer a leaf) skipped. So a refresh between steps does
not spare a leaf, and a leaf inserted between steps waits for the next round.
Whole ``evict`` calls use the incrementally kept heap instead: within one call
no key changes, so both give the same order.

Mamba (§6.3): victims come from the Mamba LRU tail, skipping Mamba-locked
entries; an evictable device leaf is deleted whole, any other node loses its
state only. An SWA tombstone cascades to the node's Mamba state.

A step-wise SWA or Mamba round (§5.4) keeps SGLang's cursor in ``meta[M_EVICT_CURSOR + c]``
(a node id): each step takes the cursor and moves it to the next more recent
unlocked entry, so an LRU refresh between steps does not change the next
victim; a cursor that left the list (or got window-locked since) restarts the
walk at the least recent unlocked entry, and a cursor that ran past the most
recent entry ends the round.

Every victim's frees and events are emitted as actions (``tree.delete_leaf``,
``swa.evict_component``); the façade executes them.
"""

from ..components import dispatch
from ..kernels._jit import helper, kernel
from ..kernels.actions import acts_begin, acts_room
from ..kernels.layout import (
    E_CAPACITY, E_NEED_BACKUP, E_NEED_STATE_BACKUP, E_NO_WALK, E_WALK_OPEN,
    F_HAS_FULL_HOST, FLAGS,
    FULL, HOST_WRITE_BACK, M_HOST, HEAP_DEVICE, HEAP_POS, KEY_LEN, N_COMPONENTS,
    M_COMPONENTS, M_EVICT_CURSOR, M_EVICT_DONE, M_EVICT_REQ, M_EVICT_WALK, M_HEAP_N, M_NACTS,
    M_NOUT, M_WALK_N, M_WALK_PARENT, NIL, OK, PARENT, WALK_K0, WALK_K1,
    WALK_NID,
)
from ..kernels.lru import (
    lru_in_list, lru_list, lru_lock_col, lru_prev_unlocked, lru_tail_unlocked,
)
from ..kernels.order import heap_pop, is_device_leaf, priority_key
from ..kernels.state import SLOT_MASK, need, node_id, resolve
from .tree import delete_leaf, demote


@helper
def evict_leaf(nodes, ctab, pool, heap, meta, s, out, acts):
    """SGLang ``evict_device_leaf`` for an evictable device leaf ``s`` taken off the
    heap: demote it when it has a host backup (host tier), else delete it.
    Returns the Full units freed on the device."""
    if nodes[s, FLAGS] & F_HAS_FULL_HOST:
        return demote(nodes, pool, heap, meta, s, out, acts)
    return delete_leaf(nodes, ctab, pool, heap, meta, s, out, acts)

#: ``evict``'s phases: the Full walk (0), then each auxiliary component's walk, in
#: component order (an auxiliary walk's phase is its component id); ``PHASE_END``:
#: done.
PHASE_FULL = 0
PHASE_END = N_COMPONENTS


@helper
def _short(nodes, acts, out, meta, s):
    """Room for one victim ``s`` (6 rows, twice its length + 2 values); else the needs."""
    if acts_room(acts, out, meta, 6, 2 * nodes[s, KEY_LEN] + 2):
        return False
    need(meta, 0, 0, meta[M_NOUT] + 2 * nodes[s, KEY_LEN] + 2, meta[M_NACTS] + 6)
    return True


@helper
def _count_leaf(nodes, meta, s, done):
    """What deleting (or demoting) device leaf ``s`` frees, added to ``done`` per
    component: its Full units and every auxiliary component's data on it."""
    comps = meta[M_COMPONENTS]
    done[FULL] += nodes[s, KEY_LEN]
    for c in range(1, N_COMPONENTS):
        if comps & (1 << c):
            done[c] += dispatch.held(c, nodes, meta, s)


@helper
def evict_one(nodes, ctab, pool, heap, meta, c, x, out, acts, done):
    """One victim ``x`` of component ``c``'s walk (SWA or Mamba): evicted whole when
    it is an evictable device leaf (``evict_leaf``: demoted when it has a host
    copy), else the component tombstones its data, and the tombstone cascades to
    the components of a lower internal priority (``dispatch.priority``: a Mamba
    state behind an SWA hole is useless). What it frees is added to ``done`` per
    component. Returns True when ``x`` was deleted (or demoted)."""
    if is_device_leaf(nodes, x):
        _count_leaf(nodes, meta, x, done)
        evict_leaf(nodes, ctab, pool, heap, meta, x, out, acts)
        return True
    evict_tombstone(nodes, pool, meta, c, x, out, acts, done)
    return False


@helper
def evict_tombstone(nodes, pool, meta, c, x, out, acts, done):
    """Component ``c`` tombstones its data at ``x`` (not an evictable device leaf),
    and the tombstone cascades to the components of a lower internal priority
    (``dispatch.priority``); what it frees is added to ``done`` per component."""
    done[c] += dispatch.evict_internal(c, nodes, pool, meta, x, out, acts)
    comps = meta[M_COMPONENTS]
    top = dispatch.priority(c, meta)
    for d in range(1, N_COMPONENTS):
        if d != c and comps & (1 << d) and dispatch.priority(d, meta) < top \
                and dispatch.held(d, nodes, meta, x) > 0:
            done[d] += dispatch.evict_internal(d, nodes, pool, meta, x, out, acts)


@helper
def _aux_walk(nodes, ctab, pool, heap, meta, c, want, out, acts, done):
    """``evict``'s walk of auxiliary component ``c``: from its LRU tail, skipping
    locked entries, until ``done[c]`` reaches ``want`` or nothing is left. Returns
    True when the buffers cannot hold the next victim (the caller answers
    E_CAPACITY)."""
    lst = lru_list(c)
    while done[c] < want:
        x = lru_tail_unlocked(nodes, lst)
        if x == NIL:
            break
        if _short(nodes, acts, out, meta, x):
            return True
        evict_one(nodes, ctab, pool, heap, meta, c, x, out, acts, done)
    return False


@kernel(scratch=("out", "acts"), on_capacity="resume")
def evict(nodes, ctab, pool, heap, meta, want, done, phase, out, acts):
    """Evict until ``want[c]`` units of each component ``c`` are freed (Full and SWA:
    units; Mamba: states) or nothing evictable is left: the Full walk first
    (least-priority leaves), then each auxiliary component's walk, in component
    order (each only when configured), each skipped when the earlier walks'
    deletions and cascades already freed enough of its component (SGLang §5.3).
    Node-granular: may exceed a request. What it frees is added to ``done[c]``
    (int64, one entry per component, as ``want``; the caller zeroes it first).

    Returns ``(status, phase)``. ``E_CAPACITY`` when ``out`` or ``acts`` cannot hold
    the next victim (``meta[M_NEED_*]``): what was evicted so far is in ``done``,
    and calling again with the returned ``phase`` (and ``done`` as it is)
    continues the same round (the façade executes the actions and grows the
    buffers in between). O(evicted nodes * log(leaves)).
    """
    acts_begin(meta, 0)
    if phase == PHASE_FULL:
        while done[FULL] < want[FULL] and meta[M_HEAP_N + HEAP_DEVICE] > 0:
            s = heap[HEAP_DEVICE, 0]
            if _short(nodes, acts, out, meta, s):
                return E_CAPACITY, PHASE_FULL
            heap_pop(nodes, heap, meta, HEAP_DEVICE)
            _count_leaf(nodes, meta, s, done)
            evict_leaf(nodes, ctab, pool, heap, meta, s, out, acts)
        phase = 1
    for c in range(1, N_COMPONENTS):  # the auxiliary walks; phase c is component c's walk
        if phase > c or not meta[M_COMPONENTS] & (1 << c):
            continue
        if _aux_walk(nodes, ctab, pool, heap, meta, c, want[c], out, acts, done):
            return E_CAPACITY, c
    return OK, PHASE_END


@helper
def _walk_less(heap, i, j):
    """Entry ``i`` before entry ``j`` of the snapshot heap: by key, then slot."""
    if heap[WALK_K0, i] != heap[WALK_K0, j]:
        return heap[WALK_K0, i] < heap[WALK_K0, j]
    if heap[WALK_K1, i] != heap[WALK_K1, j]:
        return heap[WALK_K1, i] < heap[WALK_K1, j]
    return (heap[WALK_NID, i] & SLOT_MASK) < (heap[WALK_NID, j] & SLOT_MASK)


@helper
def _walk_swap(heap, i, j):
    for r in (WALK_K0, WALK_K1, WALK_NID):
        t = heap[r, i]
        heap[r, i] = heap[r, j]
        heap[r, j] = t


@helper
def _walk_push(nodes, heap, meta, s):
    """Push slot ``s`` with its current key. The heap holds at most the leaves
    the round started with (each push follows a pop), so it fits its rows."""
    i = meta[M_WALK_N]
    meta[M_WALK_N] = i + 1
    k0, k1 = priority_key(nodes, meta, s)
    heap[WALK_K0, i] = k0
    heap[WALK_K1, i] = k1
    heap[WALK_NID, i] = node_id(nodes, s)
    while i > 0:
        up = (i - 1) >> 1
        if not _walk_less(heap, i, up):
            break
        _walk_swap(heap, i, up)
        i = up


@helper
def _walk_pop(heap, meta):
    """Drop the top entry."""
    n = meta[M_WALK_N] - 1
    meta[M_WALK_N] = n
    _walk_swap(heap, 0, n)
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and _walk_less(heap, c + 1, c):
            c += 1
        if not _walk_less(heap, c, i):
            break
        _walk_swap(heap, i, c)
        i = c


@helper
def _id_or_nil(nodes, s):
    return NIL if s == NIL else node_id(nodes, s)


@kernel
def evict_start(nodes, heap, meta, component, num_tokens):
    """Open a step-wise eviction round of ``component`` for ``num_tokens`` units
    (SWA, Mamba: the cursor starts at the least recent unlocked entry)."""
    if meta[M_EVICT_WALK + component]:
        return E_WALK_OPEN
    meta[M_EVICT_WALK + component] = 1
    meta[M_EVICT_REQ + component] = num_tokens
    meta[M_EVICT_DONE + component] = 0
    meta[M_EVICT_CURSOR + component] = NIL
    if component != FULL:
        meta[M_EVICT_CURSOR + component] = _id_or_nil(nodes,
                                                      lru_tail_unlocked(nodes, lru_list(component)))
    else:  # snapshot the evictable leaves with today's keys
        # The device-leaf heap is ordered by exactly these keys (ties by slot, as
        # _walk_less), so copying it entry by entry is a valid heap: O(leaves).
        n = meta[M_HEAP_N + HEAP_DEVICE]
        for i in range(n):
            s = heap[HEAP_DEVICE, i]
            k0, k1 = priority_key(nodes, meta, s)
            heap[WALK_K0, i] = k0
            heap[WALK_K1, i] = k1
            heap[WALK_NID, i] = node_id(nodes, s)
        meta[M_WALK_N] = n
        meta[M_WALK_PARENT] = NIL
    return OK


@helper
def _aux_cursor(nodes, meta, c, lst):
    """The SWA / Mamba round's cursor slot, restarted at the least recent unlocked
    entry of list ``lst`` when its node left the list or is locked now; NIL: the
    round is over."""
    cur = meta[M_EVICT_CURSOR + c]
    if cur == NIL:
        return NIL
    x = resolve(nodes, meta, cur)
    if x < 0 or not lru_in_list(nodes, lst, x) or nodes[x, lru_lock_col(lst)] > 0:
        x = lru_tail_unlocked(nodes, lst)
        meta[M_EVICT_CURSOR + c] = _id_or_nil(nodes, x)
    return x


@kernel(scratch=("out", "acts"), on_capacity="retry")
def evict_next(nodes, ctab, pool, heap, meta, component, done, out, acts):
    """One step of the open round of ``component``.

    Full: delete the least-priority evictable leaf by the keys the round started
    with. SWA / Mamba: evict the component from the round's cursor, the least
    recently used unlocked entry (a leaf is deleted whole, another node
    tombstoned); see the module docstring. What the step frees is written to
    ``done[c]`` per component (int64, one entry per component; all 0 when the
    round is over: its request met, or nothing evictable). Returns ``(status,
    node_id)``: the deleted node, -1 for a tombstone step or when the round is
    over. The step's actions are emitted as in ``evict``. ``E_CAPACITY``
    (``meta[M_NEED_*]``) when the buffers cannot hold the victim: nothing changed.
    Write-back (SGLang's deferred steps, the round moving on either way, nothing
    changed): ``E_NEED_BACKUP`` with a Full round's victim, or an auxiliary
    round's device leaf, that has no host copy; ``E_NEED_STATE_BACKUP`` with an
    auxiliary round's internal victim whose component data must be backed up
    with its Full KV first (``dispatch.internal_backup``: Mamba, a state with no
    host copy; SWA, SWA data with none in its window, ``done[SWA]`` then holding
    the host units to reserve); the caller backs it up, then
    ``host.finish_state_eviction`` / ``finish_swa_eviction``.
    """
    for c in range(N_COMPONENTS):
        done[c] = 0
    if not meta[M_EVICT_WALK + component]:
        return E_NO_WALK, -1
    acts_begin(meta, 0)
    if meta[M_EVICT_DONE + component] >= meta[M_EVICT_REQ + component]:
        return OK, -1
    if component == FULL:
        p = resolve(nodes, meta, meta[M_WALK_PARENT])
        meta[M_WALK_PARENT] = NIL
        if p >= 0 and nodes[p, HEAP_POS] >= 0:
            _walk_push(nodes, heap, meta, p)
        s = NIL
        while meta[M_WALK_N] > 0:  # skip stale entries (deleted, locked, not a leaf)
            s = resolve(nodes, meta, heap[WALK_NID, 0])
            if s >= 0 and nodes[s, HEAP_POS] >= 0:
                break
            s = NIL
            _walk_pop(heap, meta)
        if s == NIL:
            return OK, -1
        if meta[M_HOST] == HOST_WRITE_BACK and not (nodes[s, FLAGS] & F_HAS_FULL_HOST):
            # SGLang's deferred demote: the caller backs the victim up, then demotes
            # or drops it; the round moves on either way
            _walk_pop(heap, meta)
            meta[M_WALK_PARENT] = node_id(nodes, nodes[s, PARENT])
            return E_NEED_BACKUP, node_id(nodes, s)
        if _short(nodes, acts, out, meta, s):
            return E_CAPACITY, -1
        _walk_pop(heap, meta)
        nid = node_id(nodes, s)
        meta[M_WALK_PARENT] = node_id(nodes, nodes[s, PARENT])
        _count_leaf(nodes, meta, s, done)
        evict_leaf(nodes, ctab, pool, heap, meta, s, out, acts)
        meta[M_EVICT_DONE + FULL] += done[FULL]
        return OK, nid
    lst = lru_list(component)
    x = _aux_cursor(nodes, meta, component, lst)
    if x == NIL:
        return OK, -1
    if _short(nodes, acts, out, meta, x):
        return E_CAPACITY, -1
    meta[M_EVICT_CURSOR + component] = _id_or_nil(nodes, lru_prev_unlocked(nodes, lst, x))
    nid = node_id(nodes, x)
    if meta[M_HOST] == HOST_WRITE_BACK:
        backed = (nodes[x, FLAGS] & F_HAS_FULL_HOST) != 0
        if is_device_leaf(nodes, x):
            if not backed:
                # as the Full round: the caller backs the leaf up, then demotes / drops it
                return E_NEED_BACKUP, nid
        elif not backed:
            # SGLang's InternalStateBackup: the component's data is offered for a
            # host backup (with the node's Full KV) before it is tombstoned
            units = dispatch.internal_backup(component, nodes, meta, x, out)
            if units >= 0:
                done[component] = units
                return E_NEED_STATE_BACKUP, nid
    deleted = evict_one(nodes, ctab, pool, heap, meta, component, x, out, acts, done)
    meta[M_EVICT_DONE + component] += done[component]
    return OK, (nid if deleted else -1)


@kernel
def evict_end(meta, component):
    """Close the open round of ``component``; returns the units it evicted (0 when
    none was open)."""
    done = meta[M_EVICT_DONE + component] if meta[M_EVICT_WALK + component] else 0
    meta[M_EVICT_WALK + component] = 0
    meta[M_EVICT_REQ + component] = 0
    meta[M_EVICT_DONE + component] = 0
    meta[M_EVICT_CURSOR + component] = NIL
    if component == FULL:
        meta[M_WALK_N] = 0
        meta[M_WALK_PARENT] = NIL
    return done
