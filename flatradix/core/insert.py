"""``insert``: add a page-aligned key and its KV indices, reusing the cached prefix."""

from ..components import dispatch
from ..kernels._jit import helper, kernel
from ..kernels.actions import (
    A_ADOPTED, A_BACKUP, A_FREE_KV, A_STORED, ACT_AUX, MEDIUM_GPU, SRC_IN, SRC_POOL,
    acts_begin, emit,
)
from ..kernels.layout import (
    C_FULL, E_BAD_VALUE, E_CAPACITY, FIRST_CHILD, FLAGS, FULL, F_HAS_FULL_DEV,
    F_HAS_FULL_HOST, HIT_COUNT, HOST_OFF, HOST_WRITE_BACK, KEY_LEN, KEY_OFF, LAST_ACCESS,
    M_COMPONENTS, M_EVENTS, M_HOST, M_NLIVE, M_PAGE, M_WT_THRESHOLD, OK,
    M_NACTS, PRIORITY, ROOT, VALUES_UNCHECKED, WT_PENDING,
)
from ..kernels.dups import dup_update
from ..kernels.order import fix
from ..kernels.state import has_room, need, node_id, tick
from .tree import add_leaf, copy_values, restore_device, split_node, walk_child


#: ``insert``'s ``flags`` bits.
TRACK_ADOPTED = 1
#: ``A_BACKUP`` row ``aux``: back the row's own node up without its Mamba state
#: (the walk reached it before the commit attached one; see ``insert``).
BACKUP_NO_STATE = 1


@helper
def _wants_backup(nodes, meta, s):
    """Write-through: a node with no host copy whose hit count reached the
    threshold is backed up (SGLang ``_inc_hit_count_and_check``)."""
    return (not (nodes[s, FLAGS] & F_HAS_FULL_HOST)
            and nodes[s, HIT_COUNT] >= meta[M_WT_THRESHOLD])


@helper
def unevict(nodes, pool, heap, meta, s, value, start):
    """SGLang ``_unevict_node_on_insert``: the host-only node ``s`` (at key position
    ``start``) takes the insert's slots as its device value (``tree.restore_device``)
    and is a duplicate at once."""
    restore_device(nodes, pool, heap, meta, s, value, start)
    dup_update(nodes, meta, s)


@kernel(scratch=("out", "acts"), on_capacity="retry")
def insert(nodes, ctab, pool, heap, meta, key, value, n, ns, inserted_len, priority, limit, prev,
           cursor, flags, mamba_slot, out_base, out, acts):
    """Insert ``key[:n]`` -> ``value[:n]`` (n page-aligned, > 0) in namespace ``ns``.

    Check first: every entry of ``value`` (all of it, not only ``[:n]``) must be
    ``>= 0`` and, when ``limit >= 0``, ``< limit`` (``limit`` = VALUES_NONNEG:
    only ``>= 0``; VALUES_UNCHECKED: no check). Else ``(E_BAD_VALUE, i, -1)``
    names the first bad entry ``i``, and nothing has changed.

    Walk (SGLang §5.2): touch each walked node with a fresh tick, split a
    partially matched node, raise ``priority`` along the path, let each
    component take over what it needs of the node (SWA:
    ``update_component_on_insert_overlap`` recovers a tombstone at or past the
    request's SWA ``cursor``), and count a hit on every walked node that ends
    past ``inserted_len``. The slots of ``value`` that duplicate a walked node's,
    from ``prev`` (the caller's ``prev_prefix_len``) on and below what a
    component took over, are emitted as free actions (``SRC_IN``; with SWA the
    part below the cursor Full-only). Commit: the unmatched rest becomes one
    new leaf whose value is a copy of ``value[prefix_len:n]``; each component
    commits its data (SWA: the window at or past the cursor, capped);
    ``A_STORED`` per new node with events on. Mamba: the target takes
    ``mamba_slot`` unless it had a state, and then the per-path cap
    (``mamba.evict_excess_path_states``) may drop shallower states
    (``A_FREE_SLOT``). ``flags & TRACK_ADOPTED``: the
    adopted ranges are reported (``A_ADOPTED``; SWA caches, and with the host
    tier the host-only nodes that took the caller's slots).

    ``out_base``: when ``>= n``, the cached prefix's KV indices (the tree's,
    not the caller's duplicates) are written to ``out[:prefix_len]``, so
    ``out[:prefix_len] ++ value[prefix_len:n]`` is the path's value (the request
    path needs it); action data goes to ``out[out_base:]``. Pass 0 to skip.

    Returns ``(status, prefix_len, target_node_id, mamba_exist)`` where the
    target is the new leaf, else the node the key ended on, and ``mamba_exist``
    is 1 when the target already owned a Mamba state (0 without Mamba). Requires free slots (2; 4 with SWA),
    child-table entries, ``n`` free pool rows, ``out`` and ``acts`` room for the
    actions (with a Mamba per-path cap, one row and value per node on the
    target's path more); E_CAPACITY otherwise (``meta[M_NEED_*]`` say how much), with
    nothing changed.
    """
    if limit != VALUES_UNCHECKED and value.shape[0] > 0:
        lo = value[0]
        hi = value[0]
        for i in range(value.shape[0]):  # branch-free min/max: vectorised
            lo = min(lo, value[i])
            hi = max(hi, value[i])
        if lo < 0 or (limit >= 0 and hi >= limit):
            for i in range(value.shape[0]):
                if value[i] < 0 or (limit >= 0 and value[i] >= limit):
                    return E_BAD_VALUE, i, -1, 0
    page = meta[M_PAGE]
    aux = (meta[M_COMPONENTS] & ~C_FULL) != 0  # any component beside Full
    track = (flags & TRACK_ADOPTED) != 0
    want_path = out_base >= n
    need_out = out_base if want_path else 0
    need_acts = 4
    slots = 2
    if aux:  # what the components' rules emit, split and copy
        more_slots, more_out, more_acts = dispatch.insert_room(meta, n)
        slots += more_slots
        need_out += more_out
        need_acts += more_acts
    host_on = meta[M_HOST] != HOST_OFF
    # SGLang counts no hits under write-back (backups happen at eviction there)
    count_hits = meta[M_HOST] != HOST_WRITE_BACK
    backup_on = host_on and count_hits
    if host_on:  # per walked node and the leaf: a GPU store, an adopted range, a backup
        need_acts += 3 * min(n // page + 1, meta[M_NLIVE]) + 4
    if out.shape[0] < need_out or acts.shape[0] < need_acts:
        need(meta, 0, 0, need_out, need_acts)
        return E_CAPACITY, 0, -1, 0
    if not has_room(nodes, ctab, pool, meta, slots, n):
        return E_CAPACITY, 0, -1, 0
    acts_begin(meta, out_base if want_path else 0)
    nodes[ROOT, LAST_ACCESS] = tick(meta)
    if priority > nodes[ROOT, PRIORITY]:
        nodes[ROOT, PRIORITY] = priority
    node = ROOT
    length = 0
    while length < n:
        child, m = walk_child(nodes, ctab, pool, heap, meta, node, ns, key, length, n, page)
        if child < 0:
            break
        off = nodes[child, KEY_OFF]
        if priority > nodes[child, PRIORITY]:
            nodes[child, PRIORITY] = priority
        if host_on and not (nodes[child, FLAGS] & F_HAS_FULL_DEV):
            # a host-only node takes the caller's slots as its device value
            # (SGLang ``_unevict_node_on_insert``): adopted, not duplicates
            unevict(nodes, pool, heap, meta, child, value, length)
            if track:
                emit(acts, meta, A_ADOPTED, FULL, SRC_IN, length, m, 0)
            upper = -1
            if aux:  # the components' data from the same slots (SWA: past the cursor)
                k = dispatch.unevict_split(nodes, meta, child, length, m, cursor)
                if k > 0:
                    upper = split_node(nodes, ctab, pool, heap, meta, child, k)
                dispatch.unevict(nodes, meta, child, length, m, cursor, track, acts)
            if meta[M_EVENTS]:
                if upper >= 0:  # SGLang's event covers the node before that split
                    emit(acts, meta, A_STORED, FULL, SRC_POOL, upper, nodes[upper, KEY_LEN],
                         MEDIUM_GPU)
                emit(acts, meta, A_STORED, FULL, SRC_POOL, child, nodes[child, KEY_LEN],
                     MEDIUM_GPU)
        else:
            consumed = m
            if aux:  # each component takes over what it needs (SWA: a tombstone's data)
                k = dispatch.overlap_split(nodes, meta, child, length, m, prev, cursor)
                if k > 0:
                    split_node(nodes, ctab, pool, heap, meta, child, k)  # child: the lower part
                consumed = dispatch.overlap(nodes, pool, meta, child, length, m, value, prev,
                                            cursor, track, out, acts)
            dup = max(prev, length)
            if not (aux and dispatch.free_dups(nodes, meta, dup, length + consumed, cursor,
                                               acts)) and dup < length + consumed:
                emit(acts, meta, A_FREE_KV, FULL, SRC_IN, dup, length + consumed - dup, 0)
        if want_path:
            copy_values(pool, off, m, out, length)
        walk_backup = -1
        if length + m > inserted_len and count_hits:
            nodes[child, HIT_COUNT] += 1
            if backup_on and _wants_backup(nodes, meta, child):
                walk_backup = meta[M_NACTS]
                emit(acts, meta, A_BACKUP, FULL, SRC_POOL, child, 0, 0)
        fix(nodes, heap, meta, child)
        length += m
        node = child
    prefix_len = length
    target = node
    leaf_backup = False
    if length < n:
        walk_backup = -1  # the walk's last node is not the target
        target = add_leaf(nodes, ctab, pool, heap, meta, node, ns, key, value, length, n, priority)
        top = target
        if track and (aux or host_on):
            emit(acts, meta, A_ADOPTED, FULL, SRC_IN, length, n - length, 0)
        if aux:  # the components ask for splits of the new leaf, then commit to it
            while True:
                k = dispatch.commit_split(nodes, meta, target, length, n, cursor)
                if k <= 0:
                    break
                u = split_node(nodes, ctab, pool, heap, meta, target, k)
                if top == target:
                    top = u
                dispatch.commit_upper(nodes, meta, u, target, length, n, cursor)
            dispatch.commit_leaf(nodes, pool, meta, target, length, n, cursor, track, acts)
        if meta[M_EVENTS]:
            s = top
            while True:  # the new nodes top-down (one unless a component split the leaf)
                emit(acts, meta, A_STORED, FULL, SRC_POOL, s, nodes[s, KEY_LEN], 0)
                if s == target:
                    break
                s = nodes[s, FIRST_CHILD]
        if n > inserted_len and count_hits:
            nodes[target, HIT_COUNT] += 1
            fix(nodes, heap, meta, target)
            leaf_backup = backup_on and _wants_backup(nodes, meta, target)
    committed = 0
    if aux:  # the target takes the components' donated values (Mamba: the state)
        committed = dispatch.commit_target(nodes, heap, meta, target, target != node,
                                           mamba_slot, out, acts)
    exist = 1 if committed == dispatch.EXISTED else 0
    if leaf_backup:  # SGLang's tail step: the new leaf's backup comes last
        emit(acts, meta, A_BACKUP, FULL, SRC_POOL, target, 0, 0)
    if walk_backup >= 0:
        # SGLang runs a walked node's backup at its barrier, before the commit gave
        # the target its state: that backup leaves the state out (the row's aux),
        # and the node is pending at the tail, so no incremental backup follows
        if committed == dispatch.COMMITTED:
            acts[walk_backup, ACT_AUX] = BACKUP_NO_STATE
    elif (backup_on and aux and target == node and target != ROOT
            and (nodes[target, FLAGS] & F_HAS_FULL_HOST)
            and nodes[target, WT_PENDING] == 0
            and dispatch.needs_backup(nodes, meta, target, out)):
        # SGLang's incremental backup: a backed-up node the key ended on holds a
        # state, or SWA data within its window, with no host copy
        emit(acts, meta, A_BACKUP, FULL, SRC_POOL, target, 0, 0)
    if aux and target != ROOT:
        dispatch.insert_end(nodes, meta, target)
    return OK, prefix_len, node_id(nodes, target), exist
