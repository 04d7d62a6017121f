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

from ._jit import helper, kernel
from .children import find_child
from .state import live_spans
from .layout import (
    C_MAMBA, C_SWA, CHILD_LOCK, F_HAS, LRU_MAMBA, MAMBA, MAMBA_SLOT, F_ALIVE, F_HAS_FULL_DEV, F_HAS_SWA_DEV, FIRST_CHILD, FIRST_SLOT, FLAGS,
    FULL, FULL_LOCK, LRU_NEXT, LRU_PREV, LRU_SWA, M_COMPONENTS, SWA, SWA_LOCK,
    HEAP_DEVICE, HEAP_HOST, HEAP_POS, HOST_HEAP_POS, N_SENTINELS, SENTINEL0, F_HAS_FULL_HOST,
    LOAD_PENDING, M_HOST, M_HOST_EVICTABLE, M_HOST_TOTAL, WT_PENDING, DUP_NEXT, DUP_PREV, F_DUP,
    M_DUP_HEAD, M_DUP_TAIL, F_HAS_MAMBA_HOST, LRU_MAMBA_HOST, MAMBA_HOST_SLOT,
    M_MAMBA_HOST_TOTAL, HOST_WRITE_BACK, F_HAS_SWA_HOST, LRU_SWA_HOST, M_SWA_HOST_TOTAL,
    SWA_HOST_LOCK,
    GEN, GEN_LIMIT, KEY_LEN, KEY_OFF, M_CT_LIVE, M_EVICTABLE, M_FREE_HEAD, M_HEAP_N, M_HWM,
    M_NFREE, M_NLIVE, M_PAGE, M_POOL_CUR, M_POOL_DEAD, M_POOL_LIM, M_POOL_TOP, M_PROTECTED, M_RETIRED, M_TOTAL,
    N_COMPONENTS, N_TIERS, NCHILD, NDEVCHILD, NEXT_SIB, NIL, NS, PARENT, ROOT,
    LOCK_REF, TOK,
)
from .lru import lru_head, lru_in_list, lru_tail
from .dups import is_settled_duplicate
from .order import _less, is_device_leaf, is_host_leaf


@helper
def _aux_node(nodes, s, on, lst, bit, lock_col, full_lock):
    """Node ``s`` against an auxiliary component's rules: ``(k, has data, locked)``
    with ``k`` 0 when they hold, 1 for data / a lock on a cache without the
    component or a lock_ref below 0 or above the node's Full lock_ref, 2 when
    its LRU membership disagrees with the data bit."""
    has = (nodes[s, FLAGS] & bit) != 0
    lk = nodes[s, lock_col]
    if not on:
        if has or lk != 0 or lru_in_list(nodes, lst, s):
            return 1, False, False
        return 0, False, False
    if lk < 0 or lk > full_lock:
        return 1, has, lk > 0
    if has != lru_in_list(nodes, lst, s):
        return 2, has, lk > 0
    return 0, has, lk > 0


@helper
def _check_aux(nodes, meta, hwm, lst, c, bit, members, evictable, protected):
    """The LRU list ``lst`` of component ``c`` against the recount: -2 when it
    holds, a bad entry's slot (or NIL for a wrong length / tail link) when the
    list is broken, -3 when the ledgers disagree."""
    h, t = lru_head(lst), lru_tail(lst)
    count = 0
    prev = h
    x = nodes[h, LRU_NEXT + lst]
    while x != t:
        if (x < FIRST_SLOT or x >= hwm or count > hwm or nodes[x, LRU_PREV + lst] != prev
                or not (nodes[x, FLAGS] & F_ALIVE) or not (nodes[x, FLAGS] & bit)):
            return x
        count += 1
        prev = x
        x = nodes[x, LRU_NEXT + lst]
    if nodes[t, LRU_PREV + lst] != prev or count != members:
        return NIL
    if (evictable != meta[M_EVICTABLE + c] or protected != meta[M_PROTECTED + c]
            or evictable + protected != meta[M_TOTAL + c]):
        return -3
    return -2


_MAMBA_LOCK = LOCK_REF + MAMBA * N_TIERS
_MAMBA_HOST_LOCK = LOCK_REF + MAMBA * N_TIERS + 1
_F_HAS_MAMBA = F_HAS(MAMBA)


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


@kernel
def sanity_check(nodes, ctab, pool, heap, meta):
    page = meta[M_PAGE]
    hwm = meta[M_HWM]
    if not (nodes[ROOT, FLAGS] & F_ALIVE) or nodes[ROOT, PARENT] != NIL or nodes[ROOT, KEY_LEN] != 0:
        return 101, ROOT
    for c in range(N_COMPONENTS):
        if nodes[ROOT, LOCK_REF + c * N_TIERS] < 1:
            return 101, ROOT
    swa_on = (meta[M_COMPONENTS] & C_SWA) != 0
    mamba_on = (meta[M_COMPONENTS] & C_MAMBA) != 0
    host_on = meta[M_HOST] != 0
    h_leaves = 0
    h_evictable = 0
    h_total = 0
    mamba_lock = _MAMBA_LOCK
    mamba_bit = _F_HAS_MAMBA
    mh_total = 0
    mh_listed = 0
    sh_total = 0
    sh_listed = 0
    m_nodes = 0
    m_evictable = 0
    m_protected = 0
    live = 0
    leaves = 0
    evictable = 0
    protected = 0
    used = 0
    swa_nodes = 0
    swa_evictable = 0
    swa_protected = 0
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
        hleaf = is_host_leaf(nodes, s) and host_on
        if hleaf != (nodes[s, HOST_HEAP_POS] >= 0):
            return 122, s
        if hleaf:
            h_leaves += 1
            h_evictable += nodes[s, KEY_LEN]
            i = nodes[s, HOST_HEAP_POS]
            if i >= meta[M_HEAP_N + HEAP_HOST] or heap[HEAP_HOST, i] != s:
                return 122, s
            if i > 0 and _less(nodes, meta, s, heap[HEAP_HOST, (i - 1) >> 1]):
                return 122, s
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
        f = nodes[s, FLAGS]
        if f & F_HAS_FULL_HOST:
            if not host_on:
                return 109, s
            h_total += n
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
                evictable += n
            else:
                protected += n
        if (nodes[s, FLAGS] & mamba_bit) != 0 and nodes[s, MAMBA_SLOT] < 0:
            return 119, s
        if (nodes[s, FLAGS] & mamba_bit) == 0 and nodes[s, MAMBA_SLOT] != NIL:
            return 119, s
        mh = (f & F_HAS_MAMBA_HOST) != 0
        if mh != (nodes[s, MAMBA_HOST_SLOT] != NIL) or (mh and nodes[s, MAMBA_HOST_SLOT] < 0):
            return 124, s
        if mh:
            # a Full host copy under it, except under write-back, whose duplicate
            # reclaim may free the Full host copy of a device node and keep its state's
            if not (mamba_on and host_on) or not (
                    f & F_HAS_FULL_HOST
                    or (meta[M_HOST] == HOST_WRITE_BACK and f & F_HAS_FULL_DEV)):
                return 124, s
            mh_total += 1
        hlk = nodes[s, _MAMBA_HOST_LOCK]
        if hlk < 0 or (hlk > 0 and not mamba_on):
            return 124, s
        listed = lru_in_list(nodes, LRU_MAMBA_HOST, s)
        h_only = mh and not (f & mamba_bit)
        if (listed and not h_only) or (h_only and hlk == 0 and not listed):
            return 124, s
        if listed:
            mh_listed += 1
        sh = (f & F_HAS_SWA_HOST) != 0
        if sh:
            # a Full host copy under it, except under write-back, whose duplicate
            # reclaim may free the Full host copy of a device node and keep its SWA's
            if not (swa_on and host_on) or not (
                    f & F_HAS_FULL_HOST
                    or (meta[M_HOST] == HOST_WRITE_BACK and f & F_HAS_FULL_DEV)):
                return 125, s
            sh_total += n
        slk = nodes[s, SWA_HOST_LOCK]
        if slk < 0 or (slk > 0 and not swa_on):
            return 125, s
        listed = lru_in_list(nodes, LRU_SWA_HOST, s)
        h_only = sh and not (f & F_HAS_SWA_DEV)
        if (listed and not h_only) or (h_only and slk == 0 and not listed):
            return 125, s
        if listed:
            sh_listed += 1
        k, has, locked = _aux_node(nodes, s, mamba_on, LRU_MAMBA, mamba_bit, mamba_lock, lk)
        if k != 0:
            return 118 + k, s
        if has:
            m_nodes += 1
            if locked:
                m_protected += 1
            else:
                m_evictable += 1
        k, has, locked = _aux_node(nodes, s, swa_on, LRU_SWA, F_HAS_SWA_DEV, SWA_LOCK, lk)
        if k != 0:
            return 115 + k, s
        if has:
            swa_nodes += 1
            if locked:
                swa_protected += n
            else:
                swa_evictable += n
    if leaves != meta[M_HEAP_N + HEAP_DEVICE]:
        return 111, NIL
    if (h_leaves != meta[M_HEAP_N + HEAP_HOST] or h_evictable != meta[M_HOST_EVICTABLE]
            or h_total != meta[M_HOST_TOTAL]):
        return 122, NIL
    x = _check_dups(nodes, meta, hwm)
    if x != -2:
        return 123, x
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
    x = _check_spans(nodes, pool, meta)
    if x != -2:
        return 126, x
    # each aux list: sentinel to sentinel, every entry a live node with data; ledgers
    x = _check_aux(nodes, meta, hwm, LRU_SWA, SWA, F_HAS_SWA_DEV, swa_nodes, swa_evictable,
                   swa_protected)
    if x != -2:
        return (117, x) if x != -3 else (118, NIL)
    x = _check_aux(nodes, meta, hwm, LRU_MAMBA, MAMBA, mamba_bit, m_nodes, m_evictable,
                   m_protected)
    if x != -2:
        return (120, x) if x != -3 else (121, NIL)
    if mh_total != meta[M_MAMBA_HOST_TOTAL]:
        return 124, NIL
    x = _check_host_list(nodes, hwm, LRU_MAMBA_HOST, mh_listed)
    if x != -2:
        return 124, x
    if sh_total != meta[M_SWA_HOST_TOTAL]:
        return 125, NIL
    x = _check_host_list(nodes, hwm, LRU_SWA_HOST, sh_listed)
    if x != -2:
        return 125, x
    return 0, NIL


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


@helper
def _check_host_list(nodes, hwm, lst, listed):
    """Host LRU ``lst`` runs sentinel to sentinel through ``listed`` live nodes:
    -2, else the bad entry (NIL for a count or tail mismatch)."""
    h, t = lru_head(lst), lru_tail(lst)
    count = 0
    prev = h
    x = nodes[h, LRU_NEXT + lst]
    while x != t:
        if (x < FIRST_SLOT or x >= hwm or count > hwm
                or nodes[x, LRU_PREV + lst] != prev
                or not (nodes[x, FLAGS] & F_ALIVE)):
            return x
        count += 1
        prev = x
        x = nodes[x, LRU_NEXT + lst]
    if nodes[t, LRU_PREV + lst] != prev or count != listed:
        return NIL
    return -2
