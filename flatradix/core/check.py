"""``sanity_check``: recompute every invariant from scratch (SGLang §2.5, device tier).

Returns ``(code, slot)``; code 0 when everything holds. Codes:

===  =====================================================================
101  root is not alive / has a parent / a key / lacks lock_ref >= 1
102  a live node's parent is not alive
103  edge length is 0 or not a multiple of page_size
104  span outside the used pool
105  child count (NCHILD) disagrees with the sibling list
106  device-child count (NDEVCHILD) disagrees
107  a child's namespace differs from its (non-root) parent's
108  the child table does not map (parent, ns, first page) to this node
109  a non-root node holds no Full device value and (host tier) no host value, a
     device node below a host-only node, or a host value / pending mark without
     a host tier
110  negative lock_ref, CHILD_LOCK != sum of the children's lock_ref, or
     fewer locks than the children's (a lock was released on an ancestor)
111  heap membership disagrees with the device-leaf predicate
112  heap order violated, or HEAP_POS does not point back
113  evictable / protected / total ledgers disagree with a recount
114  live-node count, free list, retired-slot count or child-table counters disagree
115  pool accounting (live + dead != top)
116  SWA: data without Full data, a negative SWA lock_ref or one above the
     node's Full lock_ref, or SWA data / locks on a cache without SWA
117  SWA LRU: membership disagrees with the data bit, or broken links
118  SWA evictable / protected / total ledgers disagree with a recount
119  Mamba: a state bit without a slot (or a slot without the bit), a
     negative Mamba lock_ref or one above the node's Full lock_ref, or
     Mamba states / locks on a cache without Mamba
120  Mamba LRU: membership disagrees with the state bit, or broken links
121  Mamba evictable / protected / total ledgers disagree with a recount
122  host tier: host-leaf heap membership disagrees with the H-leaf predicate,
     its order or HOST_HEAP_POS is broken, or the host ledgers (total,
     evictable) disagree with a recount
123  host tier: the duplicate list is broken (links, F_DUP marks, a dead
     member) or misses a settled duplicate (Full on both tiers, nothing in flight)
124  Mamba host tier: a host-state bit without a slot (or a slot without the
     bit), a host state without a Full host value (under write-back: without
     Full data on either tier) or on a cache without Mamba
     and a host tier, a negative Mamba host lock_ref (or one without Mamba),
     the Mamba host LRU holding a node whose state is not host-only or missing
     an unlocked host-only one, broken links, or ``M_MAMBA_HOST_TOTAL`` off
125  SWA host tier: SWA host data without a Full host value (under write-back:
     without Full data on either tier) or on a cache
     without SWA and a host tier, a negative SWA host lock_ref (or one without
     SWA), the SWA host LRU holding a node whose SWA data is not host-only or
     missing an unlocked host-only one, broken links, or ``M_SWA_HOST_TOTAL`` off
126  pool spans: two live spans overlap, or the allocation cursor is off
     (outside a gap pass ``M_POOL_CUR != M_POOL_TOP``; inside one, the gap
     ``[M_POOL_CUR, M_POOL_LIM)`` past the pool or holding a live row)
===  =====================================================================
"""

import numpy as np

from ..components import dispatch
from ..kernels._jit import helper, kernel
from ..kernels.children import find_child
from ..kernels.dups import is_settled_duplicate
from ..kernels.layout import (
    CHILD_LOCK, DUP_NEXT, DUP_PREV, F_ALIVE, F_DUP, F_HAS_FULL_DEV, F_HAS_FULL_HOST,
    FIRST_CHILD, FIRST_SLOT, FLAGS, FULL, FULL_LOCK, GEN, GEN_LIMIT, HEAP_DEVICE, HEAP_HOST,
    HEAP_POS, HOST_HEAP_POS, KEY_LEN, KEY_OFF, LOAD_PENDING, LOCK_REF, M_CT_LIVE, M_DUP_HEAD,
    M_DUP_TAIL, M_EVICTABLE, M_FREE_HEAD, M_HEAP_N, M_HOST, M_HOST_EVICTABLE, M_HOST_TOTAL,
    M_HWM, M_NFREE, M_NLIVE, M_PAGE, M_POOL_CUR, M_POOL_DEAD, M_POOL_LIM, M_POOL_TOP,
    M_PROTECTED, M_RETIRED, M_TOTAL, N_COMPONENTS, N_SENTINELS, N_TIERS, NCHILD, NDEVCHILD,
    NEXT_SIB, NIL, NS, PARENT, ROOT, SENTINEL0, TOK, WT_PENDING,
)
from ..kernels.state import live_spans
from ..kernels.order import _less, is_device_leaf, is_host_leaf


@helper
def _check_dups(nodes, meta, hwm):
    """The duplicate list: -2 when it holds, else the offending slot (NIL: counts)."""
    members = 0
    prev = NIL
    x = meta[M_DUP_HEAD]
    while x != NIL:
        if (x < FIRST_SLOT or x >= hwm or not (nodes[x, FLAGS] & F_ALIVE)
                or not (nodes[x, FLAGS] & F_DUP) or nodes[x, DUP_PREV] != prev or members > hwm):
            return x
        members += 1
        prev = x
        x = nodes[x, DUP_NEXT]
    if meta[M_DUP_TAIL] != prev:
        return NIL
    flagged = 0
    for s in range(hwm):
        if not (nodes[s, FLAGS] & F_ALIVE):
            continue
        if nodes[s, FLAGS] & F_DUP:
            flagged += 1
        elif is_settled_duplicate(nodes, s):
            return s
    return -2 if flagged == members else NIL


#: Rows of ``sanity_check``'s tally: one per component id (the components' rules use
#: theirs, ``dispatch.check_node``), FULL's holding the Full recounts below.
_TALLY_ROWS = 8
_LEAVES, _EVICTABLE, _PROTECTED, _USED, _LIVE, _H_LEAVES, _H_EVICTABLE, _H_TOTAL = range(8)


@helper
def _check_children(nodes, hwm, s):
    """Node ``s``'s child list against its counters: ``(code, slot)``."""
    cnt = 0
    dev = 0
    child_locks = 0
    c = nodes[s, FIRST_CHILD]
    while c != NIL:
        if not (nodes[c, FLAGS] & F_ALIVE) or nodes[c, PARENT] != s or cnt > hwm:
            return 105, s
        cnt += 1
        child_locks += nodes[c, FULL_LOCK]
        if nodes[c, FLAGS] & F_HAS_FULL_DEV:
            dev += 1
        c = nodes[c, NEXT_SIB]
    if child_locks != nodes[s, CHILD_LOCK] or (s != ROOT and nodes[s, FULL_LOCK] < child_locks):
        return 110, s
    if cnt != nodes[s, NCHILD]:
        return 105, s
    if dev != nodes[s, NDEVCHILD]:
        return 106, s
    return 0, NIL


@helper
def _check_heaps(nodes, heap, meta, s, host_on, tally):
    """Node ``s``'s membership and place in the device- and host-leaf heaps."""
    leaf = is_device_leaf(nodes, s)
    if leaf != (nodes[s, HEAP_POS + HEAP_DEVICE] >= 0):
        return 111, s
    if leaf:
        tally[FULL, _LEAVES] += 1
    if nodes[s, HEAP_POS + HEAP_DEVICE] >= 0:
        i = nodes[s, HEAP_POS + HEAP_DEVICE]
        if i >= meta[M_HEAP_N + HEAP_DEVICE] or heap[HEAP_DEVICE, i] != s:
            return 112, s
        if i > 0 and _less(nodes, meta, s, heap[HEAP_DEVICE, (i - 1) >> 1]):
            return 112, s
    hleaf = is_host_leaf(nodes, s) and host_on
    if hleaf != (nodes[s, HOST_HEAP_POS] >= 0):
        return 122, s
    if hleaf:
        tally[FULL, _H_LEAVES] += 1
        tally[FULL, _H_EVICTABLE] += nodes[s, KEY_LEN]
        i = nodes[s, HOST_HEAP_POS]
        if i >= meta[M_HEAP_N + HEAP_HOST] or heap[HEAP_HOST, i] != s:
            return 122, s
        if i > 0 and _less(nodes, meta, s, heap[HEAP_HOST, (i - 1) >> 1]):
            return 122, s
    return 0, NIL


@helper
def _check_node(nodes, ctab, pool, meta, s, host_on, tally):
    """A live non-root node: its parent, span, namespace, child-table entry, Full
    values on either tier and lock against its parent's (codes 102-110)."""
    page = meta[M_PAGE]
    hwm = meta[M_HWM]
    lk = nodes[s, FULL_LOCK]
    p = nodes[s, PARENT]
    if p < 0 or p >= hwm or not (nodes[p, FLAGS] & F_ALIVE):
        return 102, s
    n = nodes[s, KEY_LEN]
    if n <= 0 or n % page != 0:
        return 103, s
    if nodes[s, KEY_OFF] < 0 or nodes[s, KEY_OFF] + n > meta[M_POOL_TOP]:
        return 104, s
    tally[FULL, _USED] += n
    if p != ROOT and nodes[p, NS] != nodes[s, NS]:
        return 107, s
    if find_child(nodes, ctab, pool, p, nodes[s, NS], pool[:, TOK], nodes[s, KEY_OFF], page) != s:
        return 108, s
    f = nodes[s, FLAGS]
    if f & F_HAS_FULL_HOST:
        if not host_on:
            return 109, s
        tally[FULL, _H_TOTAL] += n
    elif nodes[s, WT_PENDING] != 0 or nodes[s, LOAD_PENDING] != 0:
        return 109, s
    if not (f & F_HAS_FULL_DEV):
        if not (f & F_HAS_FULL_HOST):
            return 109, s
    elif p != ROOT and not (nodes[p, FLAGS] & F_HAS_FULL_DEV):
        return 109, s  # device data is root-closed: load-back restores whole paths
    if p != ROOT and nodes[p, FULL_LOCK] < lk:
        return 110, s
    if f & F_HAS_FULL_DEV:
        if lk == 0:
            tally[FULL, _EVICTABLE] += n
        else:
            tally[FULL, _PROTECTED] += n
    return 0, NIL


@helper
def _check_counts(nodes, meta, hwm, tally):
    """The Full ledgers, the heaps' sizes, the slot accounting (codes 111-115, 122)."""
    if tally[FULL, _LEAVES] != meta[M_HEAP_N + HEAP_DEVICE]:
        return 111, NIL
    if (tally[FULL, _H_LEAVES] != meta[M_HEAP_N + HEAP_HOST]
            or tally[FULL, _H_EVICTABLE] != meta[M_HOST_EVICTABLE]
            or tally[FULL, _H_TOTAL] != meta[M_HOST_TOTAL]):
        return 122, NIL
    evictable = tally[FULL, _EVICTABLE]
    protected = tally[FULL, _PROTECTED]
    if evictable != meta[M_EVICTABLE + FULL] or protected != meta[M_PROTECTED + FULL]:
        return 113, NIL
    if evictable + protected != meta[M_TOTAL + FULL]:
        return 113, NIL
    live = tally[FULL, _LIVE]
    if live != meta[M_NLIVE] or meta[M_CT_LIVE] != live - 1:
        return 114, NIL
    nfree = 0
    f = meta[M_FREE_HEAD]
    while f != NIL:
        if nodes[f, FLAGS] & F_ALIVE or nodes[f, GEN] >= GEN_LIMIT or nfree > hwm:
            return 114, f
        nfree += 1
        f = nodes[f, NEXT_SIB]
    retired = 0
    for s in range(hwm):
        if not (nodes[s, FLAGS] & F_ALIVE) and nodes[s, GEN] >= GEN_LIMIT:
            retired += 1
    for t in range(SENTINEL0, FIRST_SLOT):
        if nodes[t, FLAGS] & F_ALIVE:
            return 114, t
    if (nfree != meta[M_NFREE] or retired != meta[M_RETIRED]
            or nfree + live + retired + N_SENTINELS != hwm):
        return 114, NIL
    if tally[FULL, _USED] + meta[M_POOL_DEAD] != meta[M_POOL_TOP]:
        return 115, NIL
    return 0, NIL


@kernel
def sanity_check(nodes, ctab, pool, heap, meta):
    """Every invariant of the module docstring, recomputed: ``(code, slot)``. Each
    component checks its own (``dispatch.check_node`` per node, ``check_end``),
    whether it is configured or not (then it must hold nothing)."""
    hwm = meta[M_HWM]
    if not (nodes[ROOT, FLAGS] & F_ALIVE) or nodes[ROOT, PARENT] != NIL or nodes[ROOT, KEY_LEN] != 0:
        return 101, ROOT
    for c in range(N_COMPONENTS):
        if nodes[ROOT, LOCK_REF + c * N_TIERS] < 1:
            return 101, ROOT
    host_on = meta[M_HOST] != 0
    tally = np.zeros((_TALLY_ROWS, _TALLY_ROWS), dtype=np.int64)  # (O(tree): not a hot path)
    for s in range(hwm):
        if not (nodes[s, FLAGS] & F_ALIVE):
            continue
        tally[FULL, _LIVE] += 1
        code, x = _check_children(nodes, hwm, s)
        if code != 0:
            return code, x
        code, x = _check_heaps(nodes, heap, meta, s, host_on, tally)
        if code != 0:
            return code, x
        if nodes[s, FULL_LOCK] < 0:
            return 110, s
        if s == ROOT:
            continue
        code, x = _check_node(nodes, ctab, pool, meta, s, host_on, tally)
        if code != 0:
            return code, x
        code, x = dispatch.check_node(nodes, meta, s, nodes[s, KEY_LEN], nodes[s, FULL_LOCK],
                                      tally)
        if code != 0:
            return code, x
    code, x = _check_counts(nodes, meta, hwm, tally)
    if code != 0:
        return code, x
    x = _check_dups(nodes, meta, hwm)
    if x != -2:
        return 123, x
    x = _check_spans(nodes, pool, meta)
    if x != -2:
        return 126, x
    return dispatch.check_end(nodes, meta, hwm, tally)


@helper
def _check_spans(nodes, pool, meta):
    """Live spans pairwise disjoint, and the cursor's gap free of them: -2 when it
    holds, else the offending slot (NIL: the cursor itself)."""
    cur = meta[M_POOL_CUR]
    lim = meta[M_POOL_LIM]
    if lim == 0:
        if cur != meta[M_POOL_TOP]:
            return NIL
    elif cur > lim or lim > pool.shape[0] or cur < 0:
        return NIL
    slots, offs, order = live_spans(nodes, meta)
    end = 0
    for j in range(order.shape[0]):
        s = slots[order[j]]
        off = offs[order[j]]
        if off < end:
            return s
        end = off + nodes[s, KEY_LEN]
        if lim != 0 and off < lim and end > cur:
            return s
    return -2
