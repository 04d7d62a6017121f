"""``sanity_check``: recompute every invariant from scratch (SGLang §2.5, Full tier).

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
109  a non-root node holds no Full device value (no host tier yet)
110  negative lock_ref, CHILD_LOCK != sum of the children's lock_ref, or
     fewer locks than the children's (a lock was released on an ancestor)
111  heap membership disagrees with the device-leaf predicate
112  heap order violated, or HEAP_POS does not point back
113  evictable / protected / total ledgers disagree with a recount
114  live-node count, free list, retired-slot count or child-table counters disagree
115  pool accounting (live + dead != top)
===  =====================================================================
"""

from ._jit import kernel
from .children import find_child
from .layout import (
    CHILD_LOCK, F_ALIVE, F_HAS_FULL_DEV, FIRST_CHILD, FIRST_SLOT, FLAGS, FULL, FULL_LOCK,
    HEAP_DEVICE, HEAP_POS, N_SENTINELS, SENTINEL0,
    GEN, GEN_LIMIT, KEY_LEN, KEY_OFF, M_CT_LIVE, M_EVICTABLE, M_FREE_HEAD, M_HEAP_N, M_HWM,
    M_NFREE, M_NLIVE, M_PAGE, M_POOL_DEAD, M_POOL_TOP, M_PROTECTED, M_RETIRED, M_TOTAL,
    N_COMPONENTS, N_TIERS, NCHILD, NDEVCHILD, NEXT_SIB, NIL, NS, PARENT, ROOT,
    LOCK_REF, TOK,
)
from .order import _less, is_device_leaf


@kernel
def sanity_check(nodes, ctab, pool, heap, meta):
    page = meta[M_PAGE]
    hwm = meta[M_HWM]
    if not (nodes[ROOT, FLAGS] & F_ALIVE) or nodes[ROOT, PARENT] != NIL or nodes[ROOT, KEY_LEN] != 0:
        return 101, ROOT
    for c in range(N_COMPONENTS):
        if nodes[ROOT, LOCK_REF + c * N_TIERS] < 1:
            return 101, ROOT
    live = 0
    leaves = 0
    evictable = 0
    protected = 0
    used = 0
    for s in range(hwm):
        if not (nodes[s, FLAGS] & F_ALIVE):
            continue
        live += 1
        # children via the sibling list
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
        leaf = is_device_leaf(nodes, s)
        if leaf != (nodes[s, HEAP_POS + HEAP_DEVICE] >= 0):
            return 111, s
        if leaf:
            leaves += 1
        if nodes[s, HEAP_POS + HEAP_DEVICE] >= 0:
            i = nodes[s, HEAP_POS + HEAP_DEVICE]
            if i >= meta[M_HEAP_N + HEAP_DEVICE] or heap[HEAP_DEVICE, i] != s:
                return 112, s
            if i > 0 and _less(nodes, meta, s, heap[HEAP_DEVICE, (i - 1) >> 1]):
                return 112, s
        lk = nodes[s, FULL_LOCK]
        if lk < 0:
            return 110, s
        if s == ROOT:
            continue
        p = nodes[s, PARENT]
        if p < 0 or p >= hwm or not (nodes[p, FLAGS] & F_ALIVE):
            return 102, s
        n = nodes[s, KEY_LEN]
        if n <= 0 or n % page != 0:
            return 103, s
        if nodes[s, KEY_OFF] < 0 or nodes[s, KEY_OFF] + n > meta[M_POOL_TOP]:
            return 104, s
        used += n
        if p != ROOT and nodes[p, NS] != nodes[s, NS]:
            return 107, s
        if find_child(nodes, ctab, pool, p, nodes[s, NS], pool[:, TOK], nodes[s, KEY_OFF], page) != s:
            return 108, s
        if not (nodes[s, FLAGS] & F_HAS_FULL_DEV):
            return 109, s
        if p != ROOT and nodes[p, FULL_LOCK] < lk:
            return 110, s
        if lk == 0:
            evictable += n
        else:
            protected += n
    if leaves != meta[M_HEAP_N + HEAP_DEVICE]:
        return 111, NIL
    if evictable != meta[M_EVICTABLE + FULL] or protected != meta[M_PROTECTED + FULL]:
        return 113, NIL
    if evictable + protected != meta[M_TOTAL + FULL]:
        return 113, NIL
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
    if used + meta[M_POOL_DEAD] != meta[M_POOL_TOP]:
        return 115, NIL
    return 0, NIL
