"""Shared tree mutations used by several entry kernels: node split, new leaf, leaf delete.

``split_node`` and ``add_leaf`` are written by the insert path (``add_host_leaf``
by ``insert_host``) (and match, for a
split); ``delete_leaf`` by every eviction path. They keep the child table, the
sibling lists, the NCHILD / NDEVCHILD counters, the size ledgers and the
eviction heap consistent.
"""

from ..components import dispatch, full
from ..kernels._jit import helper
from ..kernels.children import (
    add_child_entry, edge_page_key, find_child, remove_child_entry, repoint_child_entry,
)
from ..kernels.layout import (
    CREATION, FIRST_CHILD, FLAGS, FULL, FULL_DEV, FULL_LOCK, F_ALIVE, F_HAS,
    F_HAS_FULL_DEV, F_HAS_FULL_HOST, HEAP_DEVICE, HEAP_HOST, HEAP_POS,
    HIT_COUNT, HOST, HOST_HEAP_POS, HOST_UUID, KEY_LEN, KEY_OFF, LAST_ACCESS, LOAD_PENDING,
    M_EVENTS, M_EVICTABLE, M_HOST, M_HOST_EVICTABLE, M_HOST_TOTAL, M_POLICY,
    M_POOL_CUR, M_POOL_DEAD, M_POOL_TOP, M_PROTECTED, M_TOTAL, NCHILD, NDEVCHILD, NEXT_SIB, NIL, NS,
    PARENT, POLICY_TLRU, PREV_SIB, PRIORITY, ROOT, TLRU_CACHED, TLRU_HIST, TOK,
    WT_PENDING,
)
from ..kernels.actions import (
    A_FREE_HOST, A_FREE_SLOT, A_REMOVED, MEDIUM_CPU, MEDIUM_GPU, SRC_OUT, SRC_POOL, emit,
    out_put_col, out_put_span,
)
from ..kernels.dups import dup_remove, dup_update
from ..kernels.order import fix, heap_remove, refresh_leaf
from ..kernels.state import link_child, node_alloc, node_free, tick, unlink_child

# Full's value-presence bits a split's upper part inherits (each component's rule
# says what it inherits of its own: ``dispatch.split``).
_SPLIT_FLAGS = F_HAS(FULL) | F_HAS(FULL, HOST)


@helper
def edge_match_len(nodes, pool, s, key, start, n, page):
    """Units of ``s``'s edge equal to ``key[start:n]``, rounded down to a page.

    Compares through 1-D views (no per-element 2-D index arithmetic) in blocks
    of 8 without early exit, which the compiler vectorises; the first differing
    block is finished unit by unit. About 2x faster than a unit loop on a
    1,300-unit path (benchmarks/profile_ops.py).
    """
    off = nodes[s, KEY_OFF]
    lim = min(nodes[s, KEY_LEN], n - start)
    ptok = pool[off:off + lim, TOK]
    k = key[start:start + lim]
    i = 0
    while i + 8 <= lim:
        d = 0
        for j in range(8):
            d |= ptok[i + j] ^ k[i + j]
        if d != 0:
            break
        i += 8
    while i < lim and ptok[i] == k[i]:
        i += 1
    return i - i % page


@helper
def copy_values(pool, off, m, out, dst):
    """``out[dst:dst + m] = pool[off:off + m, FULL_DEV]`` through 1-D views."""
    src = pool[off:off + m, FULL_DEV]
    o = out[dst:dst + m]
    for j in range(m):
        o[j] = src[j]


@helper
def split_node(nodes, ctab, pool, heap, meta, child, m):
    """Split ``child`` after ``m`` units; returns the new upper node's slot.

    The child keeps its NodeId and becomes the lower part (running requests
    hold its id). The upper part U takes the child's place under the parent,
    inherits creation / hit_count / priority and Full's value bits, and each
    configured component redistributes its data (``redistribute_on_node_split``,
    ``dispatch.split``: Full and SWA lock counts copied -- every lock through the
    child also covers U --, SWA's value bits inherited and its boundary stamp
    moved up, Mamba's state left below); the child gets a fresh access tick
    (SGLang ``split_node``).
    """
    u = node_alloc(nodes, meta)
    p = nodes[child, PARENT]
    repoint_child_entry(nodes, ctab, pool, meta, child, u)
    nodes[u, KEY_OFF] = nodes[child, KEY_OFF]
    nodes[u, KEY_LEN] = m
    nodes[u, NS] = nodes[child, NS]
    nodes[child, KEY_OFF] += m
    nodes[child, KEY_LEN] -= m
    # U takes the child's place in the parent's sibling list.
    prv = nodes[child, PREV_SIB]
    nxt = nodes[child, NEXT_SIB]
    nodes[u, PARENT] = p
    nodes[u, PREV_SIB] = prv
    nodes[u, NEXT_SIB] = nxt
    if prv != NIL:
        nodes[prv, NEXT_SIB] = u
    else:
        nodes[p, FIRST_CHILD] = u
    if nxt != NIL:
        nodes[nxt, PREV_SIB] = u
    nodes[child, PARENT] = u
    nodes[child, PREV_SIB] = NIL
    nodes[child, NEXT_SIB] = NIL
    nodes[u, FIRST_CHILD] = child
    nodes[u, NCHILD] = 1
    nodes[u, NDEVCHILD] = 1 if nodes[child, FLAGS] & F_HAS_FULL_DEV else 0
    nodes[u, FLAGS] = F_ALIVE | (nodes[child, FLAGS] & _SPLIT_FLAGS)
    dispatch.split(nodes, pool, meta, u, child)
    nodes[u, LAST_ACCESS] = tick(meta)
    nodes[u, CREATION] = nodes[child, CREATION]
    nodes[u, HIT_COUNT] = nodes[child, HIT_COUNT]
    nodes[u, PRIORITY] = nodes[child, PRIORITY]
    full.redistribute_on_node_split(nodes, u, child)
    if meta[M_HOST]:  # both fragments stay in the backup / load-back in flight
        nodes[u, WT_PENDING] = nodes[child, WT_PENDING]
        nodes[u, LOAD_PENDING] = nodes[child, LOAD_PENDING]
        # a host-lock segment ending at the child now ends at its upper part
        # (the host lock counts were copied with the Full ones)
        nodes[u, HOST_UUID] = nodes[child, HOST_UUID]
        nodes[child, HOST_UUID] = 0
        if nodes[child, HOST_HEAP_POS] >= 0:  # an evictable host leaf lost m units
            meta[M_HOST_EVICTABLE] -= m
        dup_update(nodes, meta, u)  # the new fragment may be a duplicate (the child keeps its place)
    if meta[M_POLICY] == POLICY_TLRU:
        nodes[u, TLRU_CACHED] = nodes[p, TLRU_CACHED] + m
        nodes[u, TLRU_HIST] = nodes[child, TLRU_HIST]
    add_child_entry(ctab, meta, u, nodes[u, NS], edge_page_key(nodes, pool, meta, child), child)
    nodes[child, LAST_ACCESS] = tick(meta)
    fix(nodes, heap, meta, child)
    return u


@helper
def walk_child(nodes, ctab, pool, heap, meta, node, ns, key, length, n, page):
    """One step of an insert-style walk below ``node`` (``insert``,
    ``insert_host``): the child whose edge starts with ``key[length:]``'s page,
    touched with a fresh tick and split where ``key[:n]`` leaves its edge.
    Returns ``(child, units matched)``, or ``(-1, 0)`` when no child matches.
    Needs room for one split."""
    child = find_child(nodes, ctab, pool, node, ns, key, length, page)
    if child < 0:
        return -1, 0
    nodes[child, LAST_ACCESS] = tick(meta)
    m = edge_match_len(nodes, pool, child, key, length, n, page)
    if m < nodes[child, KEY_LEN]:
        child = split_node(nodes, ctab, pool, heap, meta, child, m)
    return child, m


@helper
def add_leaf(nodes, ctab, pool, heap, meta, parent, ns, key, value, start, n, priority):
    """Create a leaf under ``parent`` holding ``key[start:n]`` -> ``value[start:n]``."""
    s = node_alloc(nodes, meta)
    length = n - start
    top = meta[M_POOL_CUR]
    ptok = pool[top:top + length, TOK]  # 1-D views: no 2-D index arithmetic per unit
    pval = pool[top:top + length, FULL_DEV]
    k = key[start:n]
    v = value[start:n]
    for i in range(length):
        ptok[i] = k[i]
        pval[i] = v[i]
    _link_leaf(nodes, ctab, pool, heap, meta, parent, s, ns, length, priority,
               F_ALIVE | F_HAS_FULL_DEV)
    nodes[parent, NDEVCHILD] += 1
    meta[M_EVICTABLE + FULL] += length
    meta[M_TOTAL + FULL] += length
    refresh_leaf(nodes, heap, meta, parent)
    refresh_leaf(nodes, heap, meta, s)
    return s


@helper
def add_host_leaf(nodes, ctab, pool, heap, meta, parent, ns, key, host_value, start, n, priority):
    """Create a host-only leaf under ``parent`` holding ``key[start:n]`` with
    ``host_value[start:n]`` as its Full host value (SGLang ``insert_host``'s new
    node): no device value, the host ledger credited, both nodes re-checked for
    the leaf heaps. The pool's device column of its rows is 0 (unused)."""
    s = node_alloc(nodes, meta)
    length = n - start
    top = meta[M_POOL_CUR]
    ptok = pool[top:top + length, TOK]
    pdev = pool[top:top + length, FULL_DEV]
    phost = pool[top:top + length, pool.shape[1] - 1]
    k = key[start:n]
    h = host_value[start:n]
    for i in range(length):
        ptok[i] = k[i]
        pdev[i] = 0
        phost[i] = h[i]
    _link_leaf(nodes, ctab, pool, heap, meta, parent, s, ns, length, priority,
               F_ALIVE | F_HAS_FULL_HOST)
    meta[M_HOST_TOTAL] += length
    refresh_leaf(nodes, heap, meta, parent)
    refresh_leaf(nodes, heap, meta, s)
    return s


@helper
def _link_leaf(nodes, ctab, pool, heap, meta, parent, s, ns, length, priority, flags):
    """The part of a new leaf both kinds share, after its ``length`` pool rows were
    written at ``M_POOL_CUR``: the rows taken, the node's fields, the sibling
    list, the child table, and (TLRU) the cached depth and the path's history.
    Rows below ``M_POOL_TOP`` (a gap pass) were dead rows and are live again;
    rows above it raise the top."""
    top = meta[M_POOL_CUR]
    end = top + length
    meta[M_POOL_CUR] = end
    revived = min(end, meta[M_POOL_TOP]) - top  # dead rows below the top taken again
    if revived > 0:
        meta[M_POOL_DEAD] -= revived
    if end > meta[M_POOL_TOP]:
        meta[M_POOL_TOP] = end
    nodes[s, KEY_OFF] = top
    nodes[s, KEY_LEN] = length
    nodes[s, NS] = ns
    nodes[s, FLAGS] = flags
    nodes[s, LAST_ACCESS] = tick(meta)
    nodes[s, CREATION] = tick(meta)
    nodes[s, PRIORITY] = priority
    link_child(nodes, parent, s)
    nodes[parent, NCHILD] += 1
    add_child_entry(ctab, meta, parent, ns, edge_page_key(nodes, pool, meta, s), s)
    if meta[M_POLICY] == POLICY_TLRU:
        depth = nodes[parent, TLRU_CACHED] + length
        nodes[s, TLRU_CACHED] = depth
        nodes[s, TLRU_HIST] = depth
        a = parent
        while a != ROOT and nodes[a, TLRU_HIST] < depth:
            nodes[a, TLRU_HIST] = depth
            fix(nodes, heap, meta, a)
            a = nodes[a, PARENT]


@helper
def delete_leaf(nodes, ctab, pool, heap, meta, s, out, acts):
    """Remove the unlocked device leaf ``s`` with every component's data (SGLang
    ``_delete_unbacked_device_leaf``); returns its length in units.

    Emits ``A_FREE_SLOT(FULL)`` with its KV indices (copied to ``out``), then
    ``A_FREE_SLOT(SWA)`` over the same indices when it holds SWA data,
    ``A_FREE_SLOT(MAMBA)`` with its state slot when it owns one,
    ``A_FREE_HOST(SWA)`` / ``A_FREE_HOST(MAMBA)`` with its SWA host value / host
    state when it holds one (left by a write-back duplicate reclaim) and, with
    KV events on, ``A_REMOVED`` with its pool span (the rows keep their page
    digests until the next compaction or gap pass, both between calls). The parent re-enters the heap if it
    became a leaf. The caller checked room for 6 rows and ``2 * len + 2`` values.
    """
    n = nodes[s, KEY_LEN]
    off = nodes[s, KEY_OFF]
    at = out_put_span(out, meta, pool, off, n)
    emit(acts, meta, A_FREE_SLOT, FULL, SRC_OUT, at, n, 0)
    dispatch.drop_device(nodes, pool, meta, s, at, out, acts)  # the cascade
    # host data left by a write-back duplicate reclaim
    dispatch.drop_host(nodes, pool, meta, s, out, acts)
    if meta[M_EVENTS]:
        emit(acts, meta, A_REMOVED, FULL, SRC_POOL, off, n, 0)
    dup_remove(nodes, meta, s)
    meta[M_EVICTABLE + FULL] -= n
    meta[M_TOTAL + FULL] -= n
    meta[M_POOL_DEAD] += n
    if nodes[s, HEAP_POS + HEAP_DEVICE] >= 0:
        heap_remove(nodes, heap, meta, HEAP_DEVICE, s)
    remove_child_entry(nodes, ctab, pool, meta, s)
    p = nodes[s, PARENT]
    unlink_child(nodes, s)
    nodes[p, NCHILD] -= 1
    nodes[p, NDEVCHILD] -= 1
    node_free(nodes, meta, s)
    refresh_leaf(nodes, heap, meta, p)
    return n


@helper
def demote(nodes, pool, heap, meta, s, out, acts):
    """Demote the unlocked, backed-up device leaf ``s`` (SGLang §8.3): free its Full
    device value (``A_FREE_SLOT(FULL)`` with the indices copied to ``out``), and
    SWA data (``A_FREE_SLOT(SWA)`` over the same indices) and its Mamba device
    state (``A_FREE_SLOT(MAMBA)``): the cascade; a host copy of either stays, in
    its host LRU; then with events on ``A_REMOVED``
    medium GPU; the node stays host-only. Its parent
    loses a device child (it may become a device leaf) and ``s`` may become an
    evictable host leaf. Returns its length. The caller checked room for 4 rows
    and ``len + 1`` values."""
    n = nodes[s, KEY_LEN]
    off = nodes[s, KEY_OFF]
    at = out_put_span(out, meta, pool, off, n)
    emit(acts, meta, A_FREE_SLOT, FULL, SRC_OUT, at, n, 0)
    dispatch.drop_device(nodes, pool, meta, s, at, out, acts)  # the cascade; host copies stay
    # SGLang then puts every host-only aux value in its host LRU (unless there),
    # host-locked or not
    dispatch.to_host_only(nodes, meta, s)
    if meta[M_EVENTS]:
        emit(acts, meta, A_REMOVED, FULL, SRC_POOL, off, n, MEDIUM_GPU)
    if nodes[s, HEAP_POS] >= 0:
        heap_remove(nodes, heap, meta, HEAP_DEVICE, s)
    nodes[s, FLAGS] &= ~F_HAS_FULL_DEV
    meta[M_EVICTABLE + FULL] -= n
    meta[M_TOTAL + FULL] -= n
    p = nodes[s, PARENT]
    nodes[p, NDEVCHILD] -= 1
    refresh_leaf(nodes, heap, meta, p)
    refresh_leaf(nodes, heap, meta, s)
    return n


@helper
def restore_device(nodes, pool, heap, meta, s, value, start):
    """The inverse of ``demote``: the host-only node ``s`` takes
    ``value[start:start + len]`` as its Full device value; device ledgers credited
    (protected when it is locked), the parent counts a device child again, both
    re-checked for the leaf heaps. Returns its length. (An insert taking the node
    over, a load-back restoring it.)"""
    m = nodes[s, KEY_LEN]
    dst = pool[nodes[s, KEY_OFF]:nodes[s, KEY_OFF] + m, FULL_DEV]
    v = value[start:start + m]
    for j in range(m):
        dst[j] = v[j]
    nodes[s, FLAGS] |= F_HAS_FULL_DEV
    if nodes[s, FULL_LOCK] > 0:
        meta[M_PROTECTED + FULL] += m
    else:
        meta[M_EVICTABLE + FULL] += m
    meta[M_TOTAL + FULL] += m
    p = nodes[s, PARENT]
    nodes[p, NDEVCHILD] += 1
    refresh_leaf(nodes, heap, meta, p)
    refresh_leaf(nodes, heap, meta, s)
    return m


@helper
def delete_host_leaf(nodes, ctab, pool, heap, meta, s, out, acts):
    """Remove the evictable host leaf ``s`` (SGLang ``evict_host_leaf``): free its
    Full host value (``A_FREE_HOST`` with the host slots copied to ``out``; with
    events on, ``A_REMOVED`` medium CPU), then its SWA host value
    (``A_FREE_HOST(SWA)``) and Mamba host state (``A_FREE_HOST(MAMBA)``), and
    delete the node; the parent may become an evictable host leaf. Returns its
    length. The caller checked room for 4 rows and ``2 * len + 1`` values."""
    n = nodes[s, KEY_LEN]
    off = nodes[s, KEY_OFF]
    at = out_put_col(out, meta, pool, off, n, pool.shape[1] - 1)
    emit(acts, meta, A_FREE_HOST, FULL, SRC_OUT, at, n, 0)
    if meta[M_EVENTS]:
        emit(acts, meta, A_REMOVED, FULL, SRC_POOL, off, n, MEDIUM_CPU)
    dispatch.drop_host(nodes, pool, meta, s, out, acts)  # atomic: every component's goes
    if nodes[s, HOST_HEAP_POS] >= 0:
        heap_remove(nodes, heap, meta, HEAP_HOST, s)
        meta[M_HOST_EVICTABLE] -= n
    meta[M_HOST_TOTAL] -= n
    meta[M_POOL_DEAD] += n
    dup_remove(nodes, meta, s)
    remove_child_entry(nodes, ctab, pool, meta, s)
    p = nodes[s, PARENT]
    unlink_child(nodes, s)
    nodes[p, NCHILD] -= 1
    node_free(nodes, meta, s)
    refresh_leaf(nodes, heap, meta, p)
    return n
