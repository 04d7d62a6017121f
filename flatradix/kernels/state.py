"""Slots, handles, the clock, and whole-table maintenance (init, reset, compaction).

Owns ``nodes[:, GEN]``, ``FLAGS & F_ALIVE``, the free-slot list (linked through
``NEXT_SIB``), the sibling links, ``meta[M_CLOCK]``, ``meta[M_HWM]``,
``meta[M_FREE_HEAD]``, ``meta[M_NFREE]``, ``meta[M_NLIVE]``, ``meta[M_RETIRED]``
and the pool counters.
"""

import numpy as np

from ._jit import helper, kernel
from .layout import (
    CREATION, CT_CHILD, CT_EMPTY, CT_LOAD_DEN, CT_LOAD_NUM, F_ALIVE, F_HAS_FULL_DEV, FIRST_CHILD,
    FIRST_SLOT, FLAGS, GEN, GEN_LIMIT, HEAP_POS, HOST_HEAP_POS, INT64_MIN, KEY_LEN, KEY_OFF, LAST_ACCESS,
    LOCK_REF, LRU_NEXT, LRU_PREV, M_CLOCK, M_CT_LIVE, M_CT_TOMB, M_EVICT_CURSOR,
    M_WALK_N, M_WALK_PARENT,
    M_EVICT_DONE, M_EVICT_REQ, M_EVICT_WALK, M_EVICTABLE, M_FREE_HEAD, M_HEAP_N,
    M_HWM, M_NEED_ACTS, M_NEED_OUT, M_NEED_SLOTS, M_NEED_UNITS, M_NFREE, M_NLIVE, M_POOL_CUR, M_POOL_DEAD, M_POOL_LIM, M_RETIRED, M_POOL_TOP,
    M_PROTECTED, M_TOTAL,
    M_HOST_EVICTABLE, M_HOST_TOTAL, M_MAMBA_HOST_TOTAL, M_SWA_HOST_TOTAL, M_HOST_UUID_NEXT,
    MAMBA_SLOT, MAMBA_HOST_SLOT, DUP_NEXT, DUP_PREV, M_DUP_HEAD,
    M_DUP_TAIL, N_COMPONENTS, N_HEAPS, N_LRU_LISTS, N_TIERS, NEXT_SIB, NIL,
    PARENT, PREV_SIB, PRIORITY, SENTINEL0, TICK,
)
from .lru import lru_init

SLOT_MASK = (1 << 32) - 1


@helper
def tick(meta):
    """Read the logical clock and advance it by one tick."""
    t = meta[M_CLOCK]
    meta[M_CLOCK] = t + TICK
    return t


@helper
def node_id(nodes, s):
    return (nodes[s, GEN] << 32) | s


@helper
def resolve(nodes, meta, nid):
    """Slot of the live node ``nid``, or -1 for a stale / never-issued id. O(1)."""
    if nid < 0:
        return -1
    s = nid & SLOT_MASK
    if s >= meta[M_HWM]:
        return -1
    if not (nodes[s, FLAGS] & F_ALIVE) or nodes[s, GEN] != (nid >> 32):
        return -1
    return s


@helper
def free_slots(meta, capacity):
    return meta[M_NFREE] + capacity - meta[M_HWM]


@helper
def need(meta, slots, units, out_n, acts_n):
    """Say what an ``E_CAPACITY`` answer needs (the engine grows that, then retries)."""
    meta[M_NEED_SLOTS] = slots
    meta[M_NEED_UNITS] = units
    meta[M_NEED_OUT] = out_n
    meta[M_NEED_ACTS] = acts_n


@helper
def has_room(nodes, ctab, pool, meta, slots, units):
    """Room for ``slots`` new nodes (and as many child-table entries) and ``units``
    pool rows. Checked by mutating kernels before they change anything; when
    short, the needs are left in ``meta[M_NEED_*]``."""
    lim = meta[M_POOL_LIM]
    if lim == 0:  # no gap pass: new spans go up to the pool's end (Engine._pool_room)
        lim = pool.shape[0]
    ok = (meta[M_NFREE] + nodes.shape[0] - meta[M_HWM] >= slots
          and meta[M_POOL_CUR] + units <= lim
          and (meta[M_CT_LIVE] + meta[M_CT_TOMB] + slots) * CT_LOAD_DEN
          <= ctab.shape[0] * CT_LOAD_NUM)
    if not ok:
        need(meta, slots, units, 0, 0)
    return ok


@helper
def _clear_row(nodes, s):
    gen = nodes[s, GEN]
    for c in range(nodes.shape[1]):
        nodes[s, c] = 0
    nodes[s, GEN] = gen
    nodes[s, PARENT] = NIL
    nodes[s, FIRST_CHILD] = NIL
    nodes[s, NEXT_SIB] = NIL
    nodes[s, PREV_SIB] = NIL
    nodes[s, HEAP_POS] = NIL
    nodes[s, HOST_HEAP_POS] = NIL
    nodes[s, DUP_PREV] = NIL
    nodes[s, DUP_NEXT] = NIL
    for i in range(N_LRU_LISTS):
        nodes[s, LRU_PREV + i] = NIL
        nodes[s, LRU_NEXT + i] = NIL
    nodes[s, MAMBA_SLOT] = NIL
    nodes[s, MAMBA_HOST_SLOT] = NIL


@helper
def node_alloc(nodes, meta):
    """Take a free slot (the façade reserved capacity), clear it and mark it alive."""
    if meta[M_NFREE] > 0:
        s = meta[M_FREE_HEAD]
        meta[M_FREE_HEAD] = nodes[s, NEXT_SIB]
        meta[M_NFREE] -= 1
    else:
        s = meta[M_HWM]
        meta[M_HWM] = s + 1
    _clear_row(nodes, s)
    nodes[s, FLAGS] = F_ALIVE
    meta[M_NLIVE] += 1
    return s


@helper
def node_free(nodes, meta, s):
    """Free slot ``s``: bump its generation (old ids go stale) and push it on the free
    list, or retire it for good when the generation reached ``GEN_LIMIT``."""
    nodes[s, FLAGS] = 0
    nodes[s, GEN] += 1
    meta[M_NLIVE] -= 1
    if nodes[s, GEN] >= GEN_LIMIT:
        meta[M_RETIRED] += 1
        return
    nodes[s, NEXT_SIB] = meta[M_FREE_HEAD]
    meta[M_FREE_HEAD] = s
    meta[M_NFREE] += 1


@helper
def link_child(nodes, parent, s):
    """Attach ``s`` at the head of ``parent``'s child list (counters not touched)."""
    nodes[s, PARENT] = parent
    head = nodes[parent, FIRST_CHILD]
    nodes[s, NEXT_SIB] = head
    nodes[s, PREV_SIB] = NIL
    if head != NIL:
        nodes[head, PREV_SIB] = s
    nodes[parent, FIRST_CHILD] = s


@helper
def unlink_child(nodes, s):
    """Detach ``s`` from its parent's child list (counters not touched)."""
    p = nodes[s, PARENT]
    prv = nodes[s, PREV_SIB]
    nxt = nodes[s, NEXT_SIB]
    if prv != NIL:
        nodes[prv, NEXT_SIB] = nxt
    else:
        nodes[p, FIRST_CHILD] = nxt
    if nxt != NIL:
        nodes[nxt, PREV_SIB] = prv
    nodes[s, PREV_SIB] = NIL
    nodes[s, NEXT_SIB] = NIL


@helper
def _make_root(nodes, meta):
    s = node_alloc(nodes, meta)  # slot 0 on a fresh table
    nodes[s, FLAGS] = F_ALIVE | F_HAS_FULL_DEV
    nodes[s, PRIORITY] = INT64_MIN
    for c in range(N_COMPONENTS):
        nodes[s, LOCK_REF + c * N_TIERS] = 1
    nodes[s, LAST_ACCESS] = tick(meta)
    nodes[s, CREATION] = tick(meta)
    return s


@kernel(engine_only=True)
def reset_tree(nodes, ctab, meta):
    """Drop every node (all their ids go stale), then lay out a new root and empty
    the auxiliary LRU lists (their sentinel slots follow the root).

    Also lays out the first tree on fresh (zeroed) arrays.

    Slots are kept with bumped generations, so no id is ever reissued, also
    across resets (a slot whose generation reaches GEN_LIMIT stays retired).
    The clock keeps running. O(slots used). Returns the new root's NodeId.
    """
    hwm = meta[M_HWM]
    for s in range(hwm):
        if nodes[s, FLAGS] & F_ALIVE:
            nodes[s, GEN] += 1
        nodes[s, FLAGS] = 0
    meta[M_HWM] = 0
    meta[M_FREE_HEAD] = NIL
    meta[M_NFREE] = 0
    meta[M_NLIVE] = 0
    meta[M_RETIRED] = 0
    meta[M_POOL_TOP] = 0
    meta[M_POOL_DEAD] = 0
    cursor_on_top(meta)
    for h in range(N_HEAPS):
        meta[M_HEAP_N + h] = 0
    meta[M_CT_LIVE] = 0
    meta[M_CT_TOMB] = 0
    for c in range(N_COMPONENTS):
        meta[M_EVICTABLE + c] = 0
        meta[M_PROTECTED + c] = 0
        meta[M_TOTAL + c] = 0
        meta[M_EVICT_WALK + c] = 0
        meta[M_EVICT_REQ + c] = 0
        meta[M_EVICT_DONE + c] = 0
        meta[M_EVICT_CURSOR + c] = NIL
    meta[M_WALK_N] = 0
    meta[M_WALK_PARENT] = NIL
    meta[M_HOST_TOTAL] = 0
    meta[M_MAMBA_HOST_TOTAL] = 0
    meta[M_SWA_HOST_TOTAL] = 0
    meta[M_HOST_EVICTABLE] = 0
    meta[M_DUP_HEAD] = NIL
    meta[M_DUP_TAIL] = NIL
    if meta[M_HOST_UUID_NEXT] == 0:  # stamps are never reused, also across resets
        meta[M_HOST_UUID_NEXT] = 1
    ctab[:, CT_CHILD] = CT_EMPTY
    s = _make_root(nodes, meta)  # slot 0, its generation bumped above
    for t in range(SENTINEL0, FIRST_SLOT):
        _clear_row(nodes, t)
        nodes[t, FLAGS] = 0
    lru_init(nodes)
    # Every other used slot goes on the free list, lowest slot at the head.
    for f in range(hwm - 1, FIRST_SLOT - 1, -1):
        if nodes[f, GEN] >= GEN_LIMIT:
            meta[M_RETIRED] += 1
            continue
        nodes[f, NEXT_SIB] = meta[M_FREE_HEAD]
        meta[M_FREE_HEAD] = f
        meta[M_NFREE] += 1
    meta[M_HWM] = max(hwm, FIRST_SLOT)
    return node_id(nodes, s)


@kernel(engine_only=True)
def compact_pool(nodes, pool, new_pool, meta):
    """Move every live edge span to the front, back to back, in pool order, and
    repoint KEY_OFF; rows past the new top are free again. ``new_pool`` is
    ``pool`` itself (in place: no allocation, no page faults) or a larger array
    (growth: the rows land there, the old array is dropped by the caller).

    In place is safe because spans are visited in increasing offset order and a
    span only ever moves to a lower offset (a forward copy never overwrites a
    row it has yet to read). Reclaims the rows of removed nodes
    (``meta[M_POOL_DEAD]``). O(live units + live nodes log live nodes).
    Returns the new pool top.
    """
    slots, offs, order = live_spans(nodes, meta)
    nlive = slots.shape[0]
    top = 0
    ncol = pool.shape[1]
    for j in range(nlive):
        s = slots[order[j]]
        n = nodes[s, KEY_LEN]
        off = nodes[s, KEY_OFF]
        if off != top or new_pool is not pool:
            for c in range(ncol):
                src = pool[off:off + n, c]
                dst = new_pool[top:top + n, c]
                for i in range(n):
                    dst[i] = src[i]
        nodes[s, KEY_OFF] = top
        top += n
    meta[M_POOL_TOP] = top
    meta[M_POOL_DEAD] = 0
    cursor_on_top(meta)
    return top


@helper
def cursor_on_top(meta):
    """No gap pass: new spans go on top of the pool's rows in use, up to its end
    (``Engine._end_gap_pass`` does the same from Python)."""
    meta[M_POOL_CUR] = meta[M_POOL_TOP]
    meta[M_POOL_LIM] = 0


@helper
def live_spans(nodes, meta):
    """Slots and offsets of every live node holding pool rows, and the order that
    sorts them by offset (``compact_pool``, ``pool_gaps``)."""
    hwm = meta[M_HWM]
    nlive = 0
    for s in range(hwm):
        if nodes[s, FLAGS] & F_ALIVE and nodes[s, KEY_LEN] > 0:
            nlive += 1
    slots = np.empty(nlive, dtype=np.int64)
    offs = np.empty(nlive, dtype=np.int64)
    j = 0
    for s in range(hwm):
        if nodes[s, FLAGS] & F_ALIVE and nodes[s, KEY_LEN] > 0:
            slots[j] = s
            offs[j] = nodes[s, KEY_OFF]
            j += 1
    return slots, offs, np.argsort(offs, kind="mergesort")


@kernel(engine_only=True)
def pool_gaps(nodes, meta, cap, min_len, gaps):
    """The pool's dead row ranges a gap pass can fill, in increasing order: the
    complement of the live spans in ``[0, cap)``, each at least ``min_len`` rows,
    written as ``gaps[2 i]`` (start), ``gaps[2 i + 1]`` (end). ``gaps`` holds
    ``2 * (meta[M_NLIVE] + 1)`` entries or more (one gap before each live span,
    one after the last). Reads only; the engine moves ``M_POOL_CUR`` /
    ``M_POOL_LIM`` through the gaps (``flatradix/engine.py``), so rows freed after
    the scan are reused only after the next scan or compaction, never by the call
    that freed them. O(live nodes log live nodes). Returns ``(count, rows)``."""
    slots, offs, order = live_spans(nodes, meta)
    end = 0
    k = 0
    rows = 0
    for j in range(order.shape[0]):
        off = offs[order[j]]
        if off - end >= min_len:
            gaps[2 * k] = end
            gaps[2 * k + 1] = off
            k += 1
            rows += off - end
        e = off + nodes[slots[order[j]], KEY_LEN]
        if e > end:
            end = e
    if cap - end >= min_len:
        gaps[2 * k] = end
        gaps[2 * k + 1] = cap
        k += 1
        rows += cap - end
    return k, rows
