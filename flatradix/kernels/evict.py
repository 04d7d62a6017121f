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

from ..components import mamba, swa
from ._jit import helper, kernel
from .actions import acts_begin, acts_room
from .layout import (
    E_CAPACITY, E_NEED_BACKUP, E_NEED_STATE_BACKUP, E_NO_WALK, E_WALK_OPEN,
    F_HAS_FULL_DEV, F_HAS_FULL_HOST, FLAGS,
    FULL, HOST_WRITE_BACK, M_HOST, HEAP_DEVICE, HEAP_POS, KEY_LEN,
    LRU_MAMBA, LRU_SWA, MAMBA,
    M_COMPONENTS, M_EVICT_CURSOR, M_EVICT_DONE, M_EVICT_REQ, M_EVICT_WALK, M_HEAP_N, M_NACTS,
    M_NOUT, M_WALK_N, M_WALK_PARENT, NIL, OK, PARENT, SWA, WALK_K0, WALK_K1,
    WALK_NID,
)
from .lru import lru_in_list, lru_lock_col, lru_prev_unlocked, lru_tail_unlocked
from .order import heap_pop, is_device_leaf, priority_key
from .state import SLOT_MASK, need, node_id, resolve
from .tree import delete_leaf, demote


@helper
def evict_leaf(nodes, ctab, pool, heap, meta, s, out, acts):
    """SGLang ``evict_device_leaf`` for an evictable device leaf ``s`` taken off the
    heap: demote it when it has a host backup (host tier), else delete it.
    Returns the Full units freed on the device."""
    if nodes[s, FLAGS] & F_HAS_FULL_HOST:
        return demote(nodes, pool, heap, meta, s, out, acts)
    return delete_leaf(nodes, ctab, pool, heap, meta, s, out, acts)

#: ``evict``'s phases: the Full walk, then the SWA walk, then the Mamba walk
#: (an auxiliary walk's phase is its component id).
PHASE_FULL = 0
PHASE_SWA = SWA
PHASE_MAMBA = MAMBA


@helper
def _short(nodes, acts, out, meta, s):
    """Room for one victim ``s`` (6 rows, twice its length + 2 values); else the needs."""
    if acts_room(acts, out, meta, 6, 2 * nodes[s, KEY_LEN] + 2):
        return False
    need(meta, 0, 0, meta[M_NOUT] + 2 * nodes[s, KEY_LEN] + 2, meta[M_NACTS] + 6)
    return True


@helper
def swa_evict_one(nodes, ctab, pool, heap, meta, x, out, acts):
    """Evict SWA from ``x``: evict it whole when it is an evictable device leaf
    (``evict_leaf``: demoted when it has a host copy), else tombstone it (a host copy of its
    SWA data stays, in the SWA host LRU); the tombstone cascades to a Mamba state on ``x``
    (a state behind an SWA hole is useless: SWA's internal priority is above Mamba's).
    Returns ``(full units, swa units, mamba states, deleted)``."""
    n = nodes[x, KEY_LEN]
    m = 1 if mamba.has_data(nodes, x) else 0
    if is_device_leaf(nodes, x):
        evict_leaf(nodes, ctab, pool, heap, meta, x, out, acts)  # demoted when backed up
        return n, n, m, True
    swa.evict_component(nodes, pool, meta, x, out, acts)
    if m:
        mamba.evict_component(nodes, meta, x, out, acts)
    return 0, n, m, False


@helper
def mamba_evict_one(nodes, ctab, pool, heap, meta, x, out, acts):
    """Evict Mamba from ``x``: evict it whole when it is an evictable device leaf
    (``evict_leaf``: demoted when it has a host copy), else tombstone its state
    (no cascade). Returns ``(full units, swa units, mamba states, deleted)``."""
    if is_device_leaf(nodes, x):
        n = nodes[x, KEY_LEN]
        w = n if swa.has_data(nodes, x) else 0
        evict_leaf(nodes, ctab, pool, heap, meta, x, out, acts)  # demoted when backed up
        return n, w, 1, True
    mamba.evict_component(nodes, meta, x, out, acts)  # a host copy stays (host LRU)
    return 0, 0, 1, False


@helper
def _aux_walk(nodes, ctab, pool, heap, meta, c, want, have, out, acts):
    """``evict``'s walk of auxiliary component ``c`` (SWA or Mamba): from its LRU
    tail, skipping locked entries, until ``have`` plus what the walk frees of
    ``c`` reaches ``want`` or nothing is left. Returns ``(short, full, swa,
    mamba)``: the units freed per component, ``short`` when the buffers cannot
    hold the next victim (the caller answers E_CAPACITY)."""
    lst = LRU_SWA if c == SWA else LRU_MAMBA
    f = 0
    w = 0
    m = 0
    while have + (w if c == SWA else m) < want:
        x = lru_tail_unlocked(nodes, lst)
        if x == NIL:
            break
        if _short(nodes, acts, out, meta, x):
            return True, f, w, m
        if c == SWA:
            a, b, d, _ = swa_evict_one(nodes, ctab, pool, heap, meta, x, out, acts)
        else:
            a, b, d, _ = mamba_evict_one(nodes, ctab, pool, heap, meta, x, out, acts)
        f += a
        w += b
        m += d
    return False, f, w, m


@kernel(scratch=("out", "acts"), on_capacity="resume")
def evict(nodes, ctab, pool, heap, meta, num_full, num_swa, num_mamba, phase, out, acts):
    """Evict until ``num_full`` Full units, ``num_swa`` SWA units and ``num_mamba``
    Mamba states are freed or nothing evictable is left: the Full walk first
    (least-priority leaves), then the SWA walk, then the Mamba walk (each only
    when configured), each skipped when the earlier walks' deletions and
    cascades already freed enough of its component (SGLang §5.3).
    Node-granular: may exceed a request.

    Returns ``(status, full_freed, swa_freed, mamba_freed, phase)``.
    ``E_CAPACITY`` when ``out`` or ``acts`` cannot hold the next victim
    (``meta[M_NEED_*]``): what was evicted so far is reported as usual, and
    calling again with the remaining requests and the returned ``phase``
    continues the same round (the façade executes the actions and grows the
    buffers in between). O(evicted nodes * log(leaves)).
    """
    acts_begin(meta, 0)
    full_freed = 0
    swa_freed = 0
    mamba_freed = 0
    if phase == PHASE_FULL:
        while full_freed < num_full and meta[M_HEAP_N + HEAP_DEVICE] > 0:
            s = heap[HEAP_DEVICE, 0]
            if _short(nodes, acts, out, meta, s):
                return E_CAPACITY, full_freed, swa_freed, mamba_freed, PHASE_FULL
            heap_pop(nodes, heap, meta, HEAP_DEVICE)
            if swa.has_data(nodes, s):
                swa_freed += nodes[s, KEY_LEN]
            if mamba.has_data(nodes, s):
                mamba_freed += 1
            full_freed += evict_leaf(nodes, ctab, pool, heap, meta, s, out, acts)
        phase = PHASE_SWA
    for c in (SWA, MAMBA):  # the auxiliary walks; phase c is component c's walk
        if phase > c or not meta[M_COMPONENTS] & (1 << c):
            continue
        short, f, w, m = _aux_walk(nodes, ctab, pool, heap, meta, c,
                                   num_swa if c == SWA else num_mamba,
                                   swa_freed if c == SWA else mamba_freed, out, acts)
        full_freed += f
        swa_freed += w
        mamba_freed += m
        if short:
            return E_CAPACITY, full_freed, swa_freed, mamba_freed, c
    return OK, full_freed, swa_freed, mamba_freed, PHASE_MAMBA


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
        lst = LRU_SWA if component == SWA else LRU_MAMBA
        meta[M_EVICT_CURSOR + component] = _id_or_nil(nodes, lru_tail_unlocked(nodes, lst))
    else:  # snapshot the evictable leaves with today's keys
        meta[M_WALK_N] = 0
        meta[M_WALK_PARENT] = NIL
        for i in range(meta[M_HEAP_N + HEAP_DEVICE]):
            _walk_push(nodes, heap, meta, heap[HEAP_DEVICE, i])
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
def evict_next(nodes, ctab, pool, heap, meta, component, out, acts):
    """One step of the open round of ``component``.

    Full: delete the least-priority evictable leaf by the keys the round started
    with. SWA / Mamba: evict the component from the round's cursor, the least
    recently used unlocked entry (a leaf is deleted whole, another node
    tombstoned); see the module docstring. Returns
    ``(status, node_id, full_units, swa_units, mamba_states)``:
    ``node_id`` is the deleted node, -1 for a tombstone step or when the round
    is over (its request met, or nothing evictable: then all counts are 0).
    The step's actions are emitted as in ``evict``. ``E_CAPACITY``
    (``meta[M_NEED_*]``) when the buffers cannot hold the victim: nothing changed.
    Write-back (SGLang's deferred steps, the round moving on either way, nothing
    changed): ``E_NEED_BACKUP`` with a Full round's victim, or a Mamba round's
    device leaf, that has no host copy; ``E_NEED_STATE_BACKUP`` with a Mamba
    round's internal victim whose state and Full KV have no host copy (the
    caller backs it up, then ``host.finish_state_eviction``), or an SWA round's
    whose SWA data and Full KV have none (``swa_units``: the unbacked SWA units
    of its window; then ``host.finish_swa_eviction``).
    """
    if not meta[M_EVICT_WALK + component]:
        return E_NO_WALK, -1, 0, 0, 0
    acts_begin(meta, 0)
    if meta[M_EVICT_DONE + component] >= meta[M_EVICT_REQ + component]:
        return OK, -1, 0, 0, 0
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
            return OK, -1, 0, 0, 0
        if meta[M_HOST] == HOST_WRITE_BACK and not (nodes[s, FLAGS] & F_HAS_FULL_HOST):
            # SGLang's deferred demote: the caller backs the victim up, then demotes
            # or drops it; the round moves on either way
            _walk_pop(heap, meta)
            meta[M_WALK_PARENT] = node_id(nodes, nodes[s, PARENT])
            return E_NEED_BACKUP, node_id(nodes, s), 0, 0, 0
        if _short(nodes, acts, out, meta, s):
            return E_CAPACITY, -1, 0, 0, 0
        _walk_pop(heap, meta)
        nid = node_id(nodes, s)
        meta[M_WALK_PARENT] = node_id(nodes, nodes[s, PARENT])
        w = nodes[s, KEY_LEN] if swa.has_data(nodes, s) else 0
        m = 1 if mamba.has_data(nodes, s) else 0
        n = evict_leaf(nodes, ctab, pool, heap, meta, s, out, acts)
        meta[M_EVICT_DONE + FULL] += n
        return OK, nid, n, w, m
    lst = LRU_SWA if component == SWA else LRU_MAMBA
    x = _aux_cursor(nodes, meta, component, lst)
    if x == NIL:
        return OK, -1, 0, 0, 0
    if _short(nodes, acts, out, meta, x):
        return E_CAPACITY, -1, 0, 0, 0
    meta[M_EVICT_CURSOR + component] = _id_or_nil(nodes, lru_prev_unlocked(nodes, lst, x))
    nid = node_id(nodes, x)
    if meta[M_HOST] == HOST_WRITE_BACK:
        backed = (nodes[x, FLAGS] & F_HAS_FULL_HOST) != 0
        if is_device_leaf(nodes, x):
            if not backed:
                # as the Full round: the caller backs the leaf up, then demotes / drops it
                return E_NEED_BACKUP, nid, 0, 0, 0
        elif component == MAMBA and mamba.needs_backup(nodes, x) and not backed:
            # SGLang's InternalStateBackup: the state is offered for a host backup
            # (with the node's Full KV) before host.finish_state_eviction tombstones it
            return E_NEED_STATE_BACKUP, nid, 0, 0, 0
        elif component == SWA and not backed and not swa.has_host(nodes, x) \
                and (nodes[x, FLAGS] & F_HAS_FULL_DEV):
            # the same for SWA data: the node (and the unbacked SWA data of its
            # window, ``w`` units: the host room the caller reserves) is backed up
            # before host.finish_swa_eviction tombstones it
            _, units = swa.collect_unbacked(nodes, meta, x, out[:0], 0)
            if units:
                return E_NEED_STATE_BACKUP, nid, 0, units, 0
    if component == SWA:
        f, w, m, deleted = swa_evict_one(nodes, ctab, pool, heap, meta, x, out, acts)
        meta[M_EVICT_DONE + SWA] += w
    else:
        f, w, m, deleted = mamba_evict_one(nodes, ctab, pool, heap, meta, x, out, acts)
        meta[M_EVICT_DONE + MAMBA] += m
    return OK, (nid if deleted else -1), f, w, m


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
