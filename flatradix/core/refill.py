"""Storage refills of the host tier (SGLang 0.5.23 spec §8.6): ``insert_host`` (the
Full host KV of a storage prefetch) and ``prefetch_commit`` (the components'
staged host data: an SWA window, a Mamba state). See ``core/host.py``.
"""

# a refill's staged host values (an SWA window's host slots, a Mamba host state) are
# inputs of those two components: ``prefetch_commit`` names their rules
from ..components import mamba, swa
from ..kernels._jit import kernel
from ..kernels.actions import A_FREE_HOST, A_STORED, MEDIUM_CPU, SRC_IN, SRC_POOL, acts_begin, emit
from ..kernels.layout import (
    E_CAPACITY, E_STALE, FLAGS, FULL, F_HAS_FULL_HOST, HOST_WRITE_BACK, KEY_LEN, KEY_OFF,
    LAST_ACCESS, M_EVENTS, M_HOST, M_HOST_TOTAL, MAMBA, SWA, M_NLIVE, M_PAGE, M_SWA_WINDOW, OK,
    PARENT, PRIORITY, ROOT,
)
from ..kernels.dups import dup_update
from ..kernels.order import fix, refresh_leaf
from ..kernels.state import has_room, need, node_id, resolve, tick
from .tree import add_host_leaf, split_node, walk_child


@kernel(scratch=("out", "acts"), on_capacity="retry")
def insert_host(nodes, ctab, pool, heap, meta, nid, key, host_value, n, ns, out, acts):
    """SGLang ``insert_host`` (spec §8.6, the storage-prefetch refill): add
    ``key[:n]`` (n page-aligned) with ``host_value[:n]`` (int64 host slots, one per
    unit) below node ``nid`` in namespace ``ns``.

    The anchor is touched (a fresh tick); the walk below it touches each node,
    splits a partially matched one, and, under write-through (either kind), gives
    a walked node without a host copy the matching host slots (``A_STORED``
    medium CPU with events on; a duplicate at once when it is on the device) --
    unless its parent (not the root) has no host copy either, which only a
    device-only anchor allows: the refill is then dropped (flatradix; SGLang
    refills and leaves a host copy below a node without one, which its own
    sanity check rejects and its Rust core panics on at a later eviction).
    The unmatched rest becomes a new host-only leaf (``A_STORED`` medium CPU)
    with the parent's priority -- except under write-through when the node it
    would hang from (not the root) has no host copy: the refill is then dropped.
    Under write-back walked nodes take nothing and the rest always becomes a leaf.

    Returns ``(status, prefix_len, inserted_host_node_id, dropped)``:
    ``prefix_len`` is the matched length under write-back, and under
    write-through the length of walked nodes that already had a host copy (the
    caller frees ``host_value[:prefix_len]``; everything when dropped);
    ``inserted_host_node_id`` the new leaf, else the node the key ended on when
    it is not the root and has a host copy, else -1. ``E_STALE`` for a dead
    anchor; E_CAPACITY (``meta[M_NEED_*]``: 2 slots, ``n`` pool rows, action
    rows) with nothing changed.
    """
    acts_begin(meta, 0)
    s = resolve(nodes, meta, nid)
    if s < 0:
        return E_STALE, 0, -1, 0
    page = meta[M_PAGE]
    need_acts = min(n // page + 1, meta[M_NLIVE]) + 2
    if acts.shape[0] < need_acts:
        need(meta, 0, 0, 0, need_acts)
        return E_CAPACITY, 0, -1, 0
    if not has_room(nodes, ctab, pool, meta, 2, n):
        return E_CAPACITY, 0, -1, 0
    events = meta[M_EVENTS] != 0
    write_back = meta[M_HOST] == HOST_WRITE_BACK
    hc = pool.shape[1] - 1
    nodes[s, LAST_ACCESS] = tick(meta)
    fix(nodes, heap, meta, s)
    if n == 0:
        return OK, 0, -1, 0
    node = s
    length = 0
    host_prefix = 0
    refilled = -1
    while length < n:
        child, m = walk_child(nodes, ctab, pool, heap, meta, node, ns, key, length, n, page)
        if child < 0:
            break
        fix(nodes, heap, meta, child)
        if not write_back:
            if not (nodes[child, FLAGS] & F_HAS_FULL_HOST):
                p = nodes[child, PARENT]
                if p != ROOT and not (nodes[p, FLAGS] & F_HAS_FULL_HOST):
                    # a device-only anchor: a host copy here would hang below a node
                    # without one (SGLang refills it and breaks its own write-through
                    # invariant); dropped like a new node there
                    return OK, host_prefix, -1, 1
                off = nodes[child, KEY_OFF]
                dst = pool[off:off + m, hc]
                src = host_value[length:length + m]
                for j in range(m):
                    dst[j] = src[j]
                nodes[child, FLAGS] |= F_HAS_FULL_HOST
                meta[M_HOST_TOTAL] += m
                refresh_leaf(nodes, heap, meta, child)
                refresh_leaf(nodes, heap, meta, nodes[child, PARENT])
                dup_update(nodes, meta, child)
                if events:
                    emit(acts, meta, A_STORED, FULL, SRC_POOL, child, m, MEDIUM_CPU)
                refilled = child
            elif refilled < 0:
                host_prefix += m
        length += m
        node = child
    prefix = length if write_back else host_prefix
    if length == n:
        got = node != ROOT and (refilled >= 0 or (nodes[node, FLAGS] & F_HAS_FULL_HOST) != 0)
        return OK, prefix, node_id(nodes, node) if got else -1, 0
    if node != ROOT and not write_back and not (nodes[node, FLAGS] & F_HAS_FULL_HOST):
        return OK, prefix, -1, 1
    leaf = add_host_leaf(nodes, ctab, pool, heap, meta, node, ns, key, host_value, length, n,
                         nodes[node, PRIORITY])
    if events:
        emit(acts, meta, A_STORED, FULL, SRC_POOL, leaf, n - length, MEDIUM_CPU)
    return OK, prefix, node_id(nodes, leaf), 0


@kernel(scratch=("out", "acts"), on_capacity="retry")
def prefetch_commit(nodes, ctab, pool, heap, meta, anchor_nid, target_nid, total, staging,
                    n_swa, mamba_at, out, acts):
    """The aux components' part of a storage prefetch, after ``insert_host`` (SGLang's
    ``commit_hicache_transfers`` phase ``PREFETCH``: SWA ``_commit_prefetch``, Mamba's
    prefetch branch).

    ``anchor_nid``: the refill's anchor; ``target_nid``: ``insert_host``'s
    ``inserted_host_node`` (-1: none, or the refill was dropped); ``total``: the
    refilled key's length (units below the anchor); ``staging`` (int64): the SWA
    staging host slots at ``[0, n_swa)`` -- covering the key's last ``n_swa`` units,
    ``n_swa`` page-aligned, 0 for none -- then the Mamba staging host state at
    ``mamba_at`` (-1: none).

    SWA, all or nothing over one window: with no target, or below a non-root anchor
    with fewer than ``ceil(W / P)`` pages, every staging slot is freed. Else the walk
    goes from the target up to the anchor while it is inside the staged span: a node
    without an SWA host value takes its part of the span (split first when the span
    starts inside it; it joins the SWA host LRU when its SWA data is not on the
    device), a node with one has its part freed, and so is the part above the anchor.
    Mamba: the target takes the staged state unless it has a host state (or there is
    no target): the state is freed then (``mamba_exist``). Frees are ``A_FREE_HOST``
    rows over ``staging`` (``SRC_IN``).

    Returns ``(status, mamba_exist)``; ``E_STALE`` for a dead anchor or target,
    ``E_CAPACITY`` (a node slot, action rows) with nothing changed. O(nodes walked).
    """
    acts_begin(meta, 0)
    a = resolve(nodes, meta, anchor_nid)
    if a < 0:
        return E_STALE, 0
    t = -1
    if target_nid >= 0:
        t = resolve(nodes, meta, target_nid)
        if t < 0:
            return E_STALE, 0
    page = meta[M_PAGE]
    need_acts = min(n_swa // page, meta[M_NLIVE]) + 3
    if acts.shape[0] < need_acts:
        need(meta, 0, 0, 0, need_acts)
        return E_CAPACITY, 0
    if not has_room(nodes, ctab, pool, meta, 1, 0):
        return E_CAPACITY, 0
    if n_swa > 0:
        window_pages = (meta[M_SWA_WINDOW] + page - 1) // page
        if t < 0 or (a != ROOT and n_swa // page < window_pages):
            emit(acts, meta, A_FREE_HOST, SWA, SRC_IN, 0, n_swa, 0)
        else:
            start = total - n_swa  # staging[i] is unit start + i below the anchor
            pos = total
            cur = t
            while cur != a and pos > start:
                top = pos - nodes[cur, KEY_LEN]
                fill = max(top, start)
                if not swa.has_host(nodes, cur):
                    if fill > top:  # the span starts inside: its part becomes the node
                        split_node(nodes, ctab, pool, heap, meta, cur, fill - top)
                    swa.attach_host(nodes, pool, meta, cur, staging, fill - start)
                    swa.host_lru_join(nodes, cur)
                    refresh_leaf(nodes, heap, meta, cur)
                    refresh_leaf(nodes, heap, meta, nodes[cur, PARENT])
                else:
                    emit(acts, meta, A_FREE_HOST, SWA, SRC_IN, fill - start, pos - fill, 0)
                pos = top
                cur = nodes[cur, PARENT]
            if pos > start:  # the span's head above the anchor
                emit(acts, meta, A_FREE_HOST, SWA, SRC_IN, 0, pos - start, 0)
    exist = 0
    if mamba_at >= 0:
        if t < 0 or mamba.has_host(nodes, t):
            emit(acts, meta, A_FREE_HOST, MAMBA, SRC_IN, mamba_at, 1, 0)
            exist = 1
        else:
            mamba.attach_host(nodes, meta, t, staging[mamba_at])
    return OK, exist
