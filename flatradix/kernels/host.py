"""The host tier (HiCache, SGLang 0.5.23 spec §8): backup, its ack, load-back, host eviction.

A node is on the device (Full device value, ``F_HAS_FULL_DEV``), on the host
(Full host value, ``F_HAS_FULL_HOST``; the host slots are the pool's last
column over the node's span), or both. Device data is root-closed (a device
node's parent is a device node: demotion takes device leaves, load-back
restores whole paths) and so is host data under write-through (a backup takes
the node's unbacked ancestors first).

The kernels here never allocate host or device slots: the façade
(``flatradix.hicache``) does, between a *plan* kernel (what the transfer
moves, written to ``out`` root-first) and a *commit* kernel (the tree takes
the slots), and an *ack* kernel completes the step when the transfer is done
(SGLang's step-wise protocol: the scheduler may run other calls between a
commit and its ack). Every kernel checks its node id and its input before any
change.

Writes ``FLAGS`` (host bit, device bit on load-back), the host column of
``pool``, ``WT_PENDING``, ``LOAD_PENDING``, ``NDEVCHILD`` (load-back), the
Full device ledgers (load-back) and the host ledgers ``M_HOST_TOTAL`` /
``M_HOST_EVICTABLE`` (through ``order.refresh_host_leaf``).
"""

from ..components import full, mamba, swa
from ._jit import helper, kernel
from .actions import (
    A_FREE_HOST, A_REMOVED, A_STORED, MEDIUM_CPU, MEDIUM_GPU, SRC_IN, SRC_OUT, SRC_POOL,
    acts_begin, acts_room, emit, out_put_col,
)
from .layout import (
    C_MAMBA, C_SWA, DUP_NEXT, E_CAPACITY, E_LOCK_UNDERFLOW, E_NO_BOUNDARY, E_STALE, FIRST_CHILD, FLAGS,
    FULL, LRU_MAMBA_HOST, M_COMPONENTS,
    FULL_DEV, FULL_HOST_LOCK, F_ALIVE, F_HAS_FULL_DEV, F_HAS_FULL_HOST, HEAP_HOST, HEAP_POS,
    HOST_HEAP_POS, HOST_UUID, HOST_WRITE_BACK, KEY_LEN, KEY_OFF, LAST_ACCESS, LOAD_PENDING, LOCK_REF,
    M_DUP_HEAD, M_EVENTS, M_EVICT_CURSOR, M_EVICT_DONE, M_EVICT_WALK, M_HEAP_N, M_HOST,
    M_HOST_TOTAL, MAMBA, SWA, LRU_SWA_HOST, F_HAS_SWA_DEV, F_HAS_SWA_HOST,
    M_HOST_UUID_NEXT, M_HWM, M_NACTS, M_NLIVE, M_NOUT, M_PAGE, M_SWA_WINDOW, NCHILD, NEXT_SIB,
    NIL,
    N_COMPONENTS, N_TIERS, OK, PARENT, PREV_SIB, PRIORITY, ROOT, WT_PENDING,
)
from .dups import dup_remove, dup_update
from .lru import lru_prev_unlocked, lru_tail_unlocked
from .order import fix, refresh_leaf
from .state import has_room, need, node_id, resolve, tick
from .tree import (
    add_host_leaf, delete_host_leaf, delete_leaf, demote, restore_device, split_node, walk_child,
)

#: Status: a plan / commit whose node is not in the state the step needs (a
#: backup of a node without device data, a load of a node already on the device,
#: an ack whose id is not pending on the node); nothing changed.
E_HOST_STATE = 20
#: Status: the slots given to a commit are not as many as the plan's units.
E_HOST_LEN = 21


@kernel(scratch="out", on_capacity="retry")
def backup_plan(nodes, ctab, pool, heap, meta, nid, out):
    """The nodes a write-through backup of node ``nid`` covers (SGLang
    ``_build_backup_kv_action``): ``nid`` and its ancestors up to the first one
    with a host value. Writes their slots to ``out[:k]``, ancestors first.
    Returns ``(status, units, k)`` (``units``: the Full units they lack on the
    host). A node with a Full host copy is planned only when its Mamba state
    needs one or SWA data within its window does (SGLang's incremental backup,
    ``needs_aux_backup``): ``k`` is 0
    when ``nid`` needs nothing (a re-backup is a no-op). ``E_STALE`` for a dead
    id, ``E_HOST_STATE`` when a node of the chain has no device value,
    ``E_CAPACITY`` (``meta[M_NEED_OUT]``) when ``out`` is short; nothing
    changes."""
    s = resolve(nodes, meta, nid)
    if s < 0 or s == ROOT:
        return E_STALE, 0, 0
    units = 0
    k = 0
    a = s
    if nodes[s, FLAGS] & F_HAS_FULL_HOST:
        if not needs_aux_backup(nodes, meta, s, out):
            return OK, 0, 0
        k = 1  # its aux data alone; its ancestors are backed up (write-through)
        a = nodes[s, PARENT]
    while a != ROOT and not (nodes[a, FLAGS] & F_HAS_FULL_HOST):
        if not (nodes[a, FLAGS] & F_HAS_FULL_DEV):
            return E_HOST_STATE, 0, 0
        units += nodes[a, KEY_LEN]
        k += 1
        a = nodes[a, PARENT]
    if out.shape[0] < k:
        need(meta, 0, 0, k, 0)
        return E_CAPACITY, 0, 0
    i = k
    a = s
    while i > 0:
        i -= 1
        out[i] = a
        a = nodes[a, PARENT]
    return OK, units, k


@helper
def needs_aux_backup(nodes, meta, s, out):
    """SGLang's ``_needs_incremental_component_backup`` of a node not pending: its
    Mamba state has no host copy, or SWA data within its window has none
    (``swa.collect_unbacked``; ``out`` is only passed through, nothing written)."""
    c = meta[M_COMPONENTS]
    if (c & C_MAMBA) and mamba.needs_backup(nodes, s):
        return True
    if (c & C_SWA) and meta[M_HOST] != 0:
        return swa.collect_unbacked(nodes, meta, s, out[:0], 0)[0] > 0
    return False


@kernel(scratch="out", on_capacity="retry")
def swa_backup_plan(nodes, ctab, pool, heap, meta, slot, out):
    """The SWA part of the backup of the live node in ``slot`` (SGLang's SWA
    ``build_hicache_transfers(BACKUP_HOST)``, read just before its commit): the
    nodes within its window whose SWA data has no host copy
    (``swa.collect_unbacked``), none past a node with a backup in flight. Their
    Full device indices, root-first, go to ``out[:units]`` (the façade translates
    them to SWA slots for the copy), their slots, root-first, to
    ``out[units:units + nodes]`` (``backup_commit``'s ``swa_nodes``: SGLang
    commits the nodes it planned). Returns ``(status, units, nodes)``;
    ``(OK, 0, 0)`` on a cache without SWA on the host tier or a dead slot."""
    if slot <= ROOT or slot >= meta[M_HWM] or not (nodes[slot, FLAGS] & F_ALIVE):
        return OK, 0, 0
    if not (meta[M_COMPONENTS] & C_SWA) or meta[M_HOST] == 0:
        return OK, 0, 0
    k, units = swa.collect_unbacked(nodes, meta, slot, out[:0], 0)
    if k == 0:
        return OK, 0, 0
    if out.shape[0] < units + k:
        need(meta, 0, 0, units + k, 0)
        return E_CAPACITY, 0, 0
    swa.collect_unbacked(nodes, meta, slot, out, units)
    _reverse(out, units, units + k)  # root-first
    _node_values(nodes, pool, out, units, k, FULL_DEV)
    return OK, units, k


@helper
def _swa_node_units(nodes, meta, swa_nodes, tier_bit):
    """The units of the SWA nodes a commit takes (slots), each alive with its SWA
    data on the tier of ``tier_bit`` only (a backup's: the device; a load's: the
    host); -1 when one is not, or the cache has no SWA on the host tier."""
    if not (meta[M_COMPONENTS] & C_SWA) or meta[M_HOST] == 0:
        return -1
    units = 0
    for i in range(swa_nodes.shape[0]):
        a = swa_nodes[i]
        if a <= ROOT or a >= meta[M_HWM] or not (nodes[a, FLAGS] & F_ALIVE) or (
                nodes[a, FLAGS] & (F_HAS_SWA_DEV | F_HAS_SWA_HOST)) != tier_bit:
            return -1
        units += nodes[a, KEY_LEN]
    return units


@helper
def _node_values(nodes, pool, out, slots_at, k, col):
    """``out[:units]`` = the values in pool column ``col`` of the ``k`` nodes whose
    slots are ``out[slots_at:slots_at + k]`` (root-first), concatenated; the
    caller checked that they fit before ``slots_at``."""
    pos = 0
    for i in range(k):
        a = out[slots_at + i]
        n = nodes[a, KEY_LEN]
        src = pool[nodes[a, KEY_OFF]:nodes[a, KEY_OFF] + n, col]
        dst = out[pos:pos + n]
        for j in range(n):
            dst[j] = src[j]
        pos += n


@helper
def _reverse(a, lo, hi):
    """Reverse ``a[lo:hi]`` in place."""
    hi -= 1
    while lo < hi:
        t = a[lo]
        a[lo] = a[hi]
        a[hi] = t
        lo += 1
        hi -= 1


@kernel(scratch="out", on_capacity="retry")
def node_device_values(nodes, ctab, pool, heap, meta, slot, out):
    """The Full device indices of the live node in ``slot`` to ``out[:len]`` (a
    backup transfer's source, read before its commit). Returns ``(status, len)``;
    ``E_HOST_STATE`` for a slot without a live device node."""
    if slot <= ROOT or slot >= meta[M_HWM] or not (nodes[slot, FLAGS] & F_ALIVE):
        return E_HOST_STATE, 0
    if not (nodes[slot, FLAGS] & F_HAS_FULL_DEV):
        return E_HOST_STATE, 0
    n = nodes[slot, KEY_LEN]
    if out.shape[0] < n:
        need(meta, 0, 0, n, 0)
        return E_CAPACITY, 0
    off = nodes[slot, KEY_OFF]
    src = pool[off:off + n, FULL_DEV]
    for j in range(n):
        out[j] = src[j]
    return OK, n


@kernel(scratch="out", on_capacity="retry")
def backup_commit(nodes, ctab, pool, heap, meta, slot, host_slots, state_host, swa_nodes, swa_host,
                  ack_id, lock, out):
    """Commit the backup of the node in ``slot`` (one node of a ``backup_plan``
    chain, committed ancestors first): it takes ``host_slots`` (int64, one host slot per
    unit; empty when it has a Full host copy already) as its Full host value, ``state_host``
    (>= 0; -1: none) as its Mamba host state, and the pending mark ``ack_id`` (> 0) until
    ``backup_ack``; with ``lock`` it is locked on the device until then as ``inc_lock_ref``
    locks it (the Full path, and the node's Mamba lock on a Mamba cache, its SWA window lock
    on an SWA cache: write-through holds the source). ``swa_nodes`` / ``swa_host`` (SWA on
    the host tier): the node slots ``swa_backup_plan(slot)`` planned, root-first, and their
    SWA host slots (empty: none); each of those nodes takes its part as its SWA host value
    and the pending mark ``ack_id`` too. Its device indices are copied to ``out[:len]`` (the
    transfer's source; none for an aux-only backup). Returns ``(status, units,
    swa_boundary)``: the SWA window lock's boundary stamp (0: none, or it reached the root);
    ``E_HOST_STATE`` when the node is not alive, has no device value, has a host value and
    no aux data to back up, or ``state_host`` names a state it does not need backed up
    (``mamba.needs_backup``); ``E_HOST_LEN`` when ``host_slots`` is not its length (or not
    empty) or ``swa_host`` not the SWA nodes' units, and ``E_HOST_STATE`` when one of those
    is dead or its SWA data is not on the device only; nothing changes then."""
    if slot <= ROOT or slot >= meta[M_HWM] or not (nodes[slot, FLAGS] & F_ALIVE):
        return E_HOST_STATE, 0, 0
    f = nodes[slot, FLAGS]
    if not (f & F_HAS_FULL_DEV):
        return E_HOST_STATE, 0, 0
    if state_host >= 0 and not ((meta[M_COMPONENTS] & C_MAMBA) and mamba.needs_backup(nodes, slot)):
        return E_HOST_STATE, 0, 0
    ws = swa_host.shape[0]
    wk = swa_nodes.shape[0]
    if ws or wk:
        wu = _swa_node_units(nodes, meta, swa_nodes, F_HAS_SWA_DEV)
        if wu < 0:
            return E_HOST_STATE, 0, 0
        if wu != ws:
            return E_HOST_LEN, wu, 0
    n = nodes[slot, KEY_LEN]
    if f & F_HAS_FULL_HOST:
        if state_host < 0 and ws == 0:
            return E_HOST_STATE, 0, 0
        n = 0
    if host_slots.shape[0] != n:
        return E_HOST_LEN, n, 0
    if out.shape[0] < n:
        need(meta, 0, 0, n, 0)
        return E_CAPACITY, 0, 0
    pos = 0
    for i in range(wk):  # the window's nodes, root-first
        a = swa_nodes[i]
        swa.attach_host(nodes, pool, meta, a, swa_host, pos)
        pos += nodes[a, KEY_LEN]
        nodes[a, WT_PENDING] = ack_id
    if n:
        off = nodes[slot, KEY_OFF]
        dst = pool[off:off + n, pool.shape[1] - 1]
        src = pool[off:off + n, FULL_DEV]
        o = out[:n]
        for j in range(n):
            dst[j] = host_slots[j]
            o[j] = src[j]
        nodes[slot, FLAGS] |= F_HAS_FULL_HOST
        meta[M_HOST_TOTAL] += n
    if state_host >= 0:
        mamba.attach_host(nodes, meta, slot, state_host)
    nodes[slot, WT_PENDING] = ack_id
    boundary = 0
    if lock:
        full.acquire_component_lock(nodes, heap, meta, slot)
        if meta[M_COMPONENTS] & C_SWA:
            boundary = swa.acquire_component_lock(nodes, meta, slot)
        if meta[M_COMPONENTS] & C_MAMBA:
            mamba.acquire_component_lock(nodes, meta, slot)
    return OK, n, boundary


@kernel(scratch=("out", "acts"), on_capacity="retry")
def backup_ack(nodes, ctab, pool, heap, meta, nid, ack_id, unlock, swa_boundary, out, acts):
    """Complete backup ``ack_id`` of node ``nid`` (SGLang ``finish_write_through``):
    clear the pending mark on ``nid`` and the ancestors carrying it (a split while
    pending left both fragments marked; an SWA window backup marked ancestors
    further up, maybe not contiguously: the walk goes to the root), emit
    ``A_STORED`` medium CPU per node, parents first (events on), and with
    ``unlock`` release the device path lock of ``backup_commit`` (and the node's
    Mamba lock, and its SWA window lock up to ``swa_boundary``). Returns
    ``(status, nodes)``; ``E_HOST_STATE`` when
    ``ack_id`` is not pending on ``nid``, ``E_STALE`` for a dead id; nothing
    changes then. E_CAPACITY (``meta[M_NEED_*]``) when ``acts`` / ``out`` are
    short."""
    acts_begin(meta, 0)
    s = resolve(nodes, meta, nid)
    if s < 0 or s == ROOT:
        return E_STALE, 0
    if nodes[s, WT_PENDING] != ack_id or ack_id <= 0:
        return E_HOST_STATE, 0
    swa_lock = unlock and (meta[M_COMPONENTS] & C_SWA) != 0
    if swa_lock:
        st, _, _ = swa.check_release(nodes, s, swa_boundary)
        if st != OK:
            return st, 0
    k = 0
    a = s
    while a != ROOT:
        if nodes[a, WT_PENDING] == ack_id:
            k += 1
        a = nodes[a, PARENT]
    events = meta[M_EVENTS] != 0
    if events and not acts_room(acts, out, meta, k, k):
        need(meta, 0, 0, k, k)
        return E_CAPACITY, 0
    a = s
    i = k
    while a != ROOT:
        if nodes[a, WT_PENDING] == ack_id:
            nodes[a, WT_PENDING] = 0
            dup_update(nodes, meta, a)  # the backed-up copy is a duplicate only now
            i -= 1
            if events:
                out[i] = a
        a = nodes[a, PARENT]
    if events:
        for j in range(k):
            emit(acts, meta, A_STORED, FULL, SRC_POOL, out[j], nodes[out[j], KEY_LEN], MEDIUM_CPU)
        meta[M_NOUT] = k
    if unlock:
        if (meta[M_COMPONENTS] & C_MAMBA) and nodes[s, mamba.MAMBA_LOCK] > 0:
            mamba.release_component_lock(nodes, meta, s)
        if swa_lock:
            swa.release_component_lock(nodes, heap, meta, s, swa_boundary)
        full.release_component_lock(nodes, heap, meta, s)
    return OK, k


@helper
def _host_only_path(nodes, s):
    """The host-only nodes from ``s`` up to the first device node (what a load-back
    restores): ``(status, units, nodes)``; ``E_HOST_STATE`` when one of them is
    being loaded already."""
    units = 0
    k = 0
    a = s
    while a != ROOT and not (nodes[a, FLAGS] & F_HAS_FULL_DEV):
        if nodes[a, LOAD_PENDING] != 0:
            return E_HOST_STATE, 0, 0
        units += nodes[a, KEY_LEN]
        k += 1
        a = nodes[a, PARENT]
    return OK, units, k


@kernel(scratch="out", on_capacity="retry")
def load_plan(nodes, ctab, pool, heap, meta, nid, out):
    """What a load-back to node ``nid`` copies (SGLang ``build_load_back_spec``):
    the host-only nodes from ``nid`` up to the first device node, root-first;
    their Full host slots go to ``out[:units]``. Returns ``(status, units,
    nodes)``; units 0 when ``nid`` is on the device. ``E_STALE`` for a dead id,
    ``E_HOST_STATE`` when a node of the path is being loaded already."""
    s = resolve(nodes, meta, nid)
    if s < 0:
        return E_STALE, 0, 0
    st, units, k = _host_only_path(nodes, s)
    if st != OK:
        return st, 0, 0
    if out.shape[0] < units:
        need(meta, 0, 0, units, 0)
        return E_CAPACITY, 0, 0
    hc = pool.shape[1] - 1
    end = units
    a = s
    while a != ROOT and not (nodes[a, FLAGS] & F_HAS_FULL_DEV):
        n = nodes[a, KEY_LEN]
        src = pool[nodes[a, KEY_OFF]:nodes[a, KEY_OFF] + n, hc]
        dst = out[end - n:end]
        for j in range(n):
            dst[j] = src[j]
        end -= n
        a = nodes[a, PARENT]
    return OK, units, k


@kernel(scratch="out", on_capacity="retry")
def swa_load_plan(nodes, ctab, pool, heap, meta, nid, out):
    """The SWA part of a load-back to node ``nid`` (``swa.collect_host_only``): their SWA
    host slots, root-first, to ``out[:units]``, their slots, root-first, to
    ``out[units:units + nodes]`` (``load_commit``'s ``swa_nodes``). Returns ``(status, units,
    nodes)``; ``(OK, 0, 0)`` without SWA on the host tier; ``E_STALE`` for a dead
    id; under write-back ``E_HOST_STATE`` when one of them is pinned by another
    load-back (SGLang rejects the whole load then)."""
    s = resolve(nodes, meta, nid)
    if s < 0:
        return E_STALE, 0, 0
    if not (meta[M_COMPONENTS] & C_SWA) or meta[M_HOST] == 0:
        return OK, 0, 0
    k, units = swa.collect_host_only(nodes, meta, s, out[:0], 0)
    if k == 0:
        return OK, 0, 0
    if out.shape[0] < units + k:
        need(meta, 0, 0, units + k, 0)
        return E_CAPACITY, 0, 0
    swa.collect_host_only(nodes, meta, s, out, units)
    _reverse(out, units, units + k)  # root-first
    if meta[M_HOST] == HOST_WRITE_BACK:
        for i in range(k):
            if nodes[out[units + i], LOAD_PENDING] not in (0, nid):
                return E_HOST_STATE, 0, 0
    _node_values(nodes, pool, out, units, k, swa.host_col(pool))
    return OK, units, k


@kernel(scratch=("out", "acts"), on_capacity="retry")
def load_commit(nodes, ctab, pool, heap, meta, nid, dev_slots, load_id, state_slot, swa_nodes,
                swa_dev, out, acts):
    """Commit the load-back ``load_plan(nid)`` planned: its nodes take
    ``dev_slots`` (int64, one KV index per unit, root-first, exactly the plan's
    units) as their Full device values, marked ``load_id`` (> 0) until
    ``load_ack``; ledgers credit them as protected where they are locked (the
    façade path-locks ``nid`` first), the parents count a device child again;
    ``A_STORED`` medium GPU per node, parents first (events on). With
    ``state_slot >= 0`` node ``nid``'s host-only Mamba state is restored into
    that device slot (SGLang ``set_component_device_value``: it leaves the host
    LRU, joins the device LRU's MRU end, protected while locked); a load may
    restore the state alone (no units, no marks). ``swa_nodes`` / ``swa_dev``
    (SWA on the host tier): the node slots ``swa_load_plan(nid)`` planned,
    root-first, and SWA device slots for them (empty: none); those nodes get SWA
    data again (``swa.publish``: device LRU's
    MRU end, deepest last, protected while locked) and their Full device
    indices, root-first, are written to ``out[at:at + len(swa_dev)]`` (the
    façade maps them to ``swa_dev``: SGLang's ``RebuildFullToSWAMapping``). A
    load may restore SWA alone. Returns ``(status, units, at)``;
    ``E_HOST_LEN`` / ``E_STALE`` / ``E_HOST_STATE`` as the plan, or
    ``E_HOST_STATE`` for a ``state_slot`` while ``nid``'s state is not
    host-only or an SWA node whose SWA data is not on the host only (or whose
    Full data will not be on the device), ``E_HOST_LEN`` for ``swa_dev`` not the
    SWA nodes' units; nothing changed."""
    acts_begin(meta, 0)
    s = resolve(nodes, meta, nid)
    if s < 0:
        return E_STALE, 0, 0
    st, units, k = _host_only_path(nodes, s)
    if st != OK:
        return st, 0, 0
    if units != dev_slots.shape[0]:
        return E_HOST_LEN, units, 0
    if state_slot >= 0 and not ((meta[M_COMPONENTS] & C_MAMBA) and mamba.host_only(nodes, s)):
        return E_HOST_STATE, 0, 0
    ws = swa_dev.shape[0]
    wk = swa_nodes.shape[0]
    if ws or wk:
        wu = _swa_node_units(nodes, meta, swa_nodes, F_HAS_SWA_HOST)
        if wu < 0:
            return E_HOST_STATE, 0, 0
        for i in range(wk):
            a = swa_nodes[i]
            if not (nodes[a, FLAGS] & F_HAS_FULL_DEV):  # restored by this load?
                b = s
                while b != ROOT and b != a and not (nodes[b, FLAGS] & F_HAS_FULL_DEV):
                    b = nodes[b, PARENT]
                if b != a:
                    return E_HOST_STATE, 0, 0
        if wu != ws:
            return E_HOST_LEN, wu, 0
    events = meta[M_EVENTS] != 0
    if not acts_room(acts, out, meta, k if events else 0, k + ws):
        need(meta, 0, 0, k + ws, k)
        return E_CAPACITY, 0, 0
    end = units
    i = k
    a = s
    while a != ROOT and not (nodes[a, FLAGS] & F_HAS_FULL_DEV):
        p = nodes[a, PARENT]
        nodes[a, LOAD_PENDING] = load_id  # pinned: a duplicate only at the ack
        end -= restore_device(nodes, pool, heap, meta, a, dev_slots, end - nodes[a, KEY_LEN])
        i -= 1
        if events:
            out[i] = a
        a = p
    if events:
        for j in range(k):
            emit(acts, meta, A_STORED, FULL, SRC_POOL, out[j], nodes[out[j], KEY_LEN], MEDIUM_GPU)
        meta[M_NOUT] = k
    if state_slot >= 0:
        mamba.attach(nodes, meta, s, state_slot)
        refresh_leaf(nodes, heap, meta, s)
    at = k
    if wk:  # SGLang's SWA commit: root-first, each set_component_device_value
        pos = k
        for i in range(wk):
            a = swa_nodes[i]
            n = nodes[a, KEY_LEN]
            swa.publish(nodes, meta, a)
            src = pool[nodes[a, KEY_OFF]:nodes[a, KEY_OFF] + n, FULL_DEV]
            dst = out[pos:pos + n]
            for j in range(n):
                dst[j] = src[j]
            pos += n
    return OK, units, at


@kernel
def load_ack(nodes, ctab, pool, heap, meta, nid, load_id):
    """Complete load-back ``load_id`` of node ``nid``: clear its mark on ``nid``
    and the ancestors carrying it. Returns ``(status, nodes)``; ``E_HOST_STATE``
    when ``load_id`` is not pending on ``nid``, nothing changed."""
    s = resolve(nodes, meta, nid)
    if s < 0:
        return E_STALE, 0
    if nodes[s, LOAD_PENDING] != load_id or load_id <= 0:
        return E_HOST_STATE, 0
    return OK, _clear_load(nodes, heap, meta, s, load_id)


@helper
def _clear_load(nodes, heap, meta, s, load_id):
    """Clear load mark ``load_id`` from slot ``s`` and the ancestors carrying it
    (each a duplicate now: the host copy stays). Returns the nodes cleared."""
    k = 0
    a = s
    while a != ROOT and nodes[a, LOAD_PENDING] == load_id:
        nodes[a, LOAD_PENDING] = 0
        refresh_leaf(nodes, heap, meta, a)
        dup_update(nodes, meta, a)  # the host copy stays: a duplicate now
        k += 1
        a = nodes[a, PARENT]
    return k


@kernel
def load_lock(nodes, ctab, pool, heap, meta, nid):
    """The two pins a load-back holds until its ack (``inc_host_lock_ref`` and
    ``inc_lock_ref``: the Full host-lock segment and the Full path lock, on a
    Mamba cache the node's Mamba host and device locks, on an SWA cache the host
    and device window locks), in one call. Returns ``(status, delta, stamp,
    swa_host_stamp, swa_stamp)``: ``delta`` the Full units moved evictable ->
    protected, ``stamp`` the Full host-lock boundary (0: nothing host-locked,
    as ``host_lock``), the SWA window locks' boundaries (0: none / the root).
    ``E_STALE`` for a dead id, nothing changed."""
    s = resolve(nodes, meta, nid)
    if s < 0:
        return E_STALE, 0, 0, 0, 0
    stamp, swa_host_stamp = _host_lock(nodes, heap, meta, s)
    delta = full.acquire_component_lock(nodes, heap, meta, s)
    swa_stamp = 0
    if meta[M_COMPONENTS] & C_SWA:
        swa_stamp = swa.acquire_component_lock(nodes, meta, s)
    if meta[M_COMPONENTS] & C_MAMBA:
        mamba.acquire_component_lock(nodes, meta, s)
    refresh_leaf(nodes, heap, meta, s)
    return OK, delta, stamp, swa_host_stamp, swa_stamp


@kernel
def load_finish(nodes, ctab, pool, heap, meta, nid, load_id, stamp, swa_host_stamp, swa_stamp):
    """``load_ack(nid, load_id)`` (none for ``load_id`` 0: a load that restored a
    Mamba state or SWA alone), then the release of what ``load_lock(nid)`` took:
    the path lock (with the node's Mamba lock, the SWA window up to
    ``swa_stamp``) and the host lock (the Full segment up to ``stamp``, 0: none;
    the node's Mamba host lock; the SWA host window up to ``swa_host_stamp``). All are checked
    before any change. Returns ``(status, slot)``: ``E_STALE``;
    ``E_HOST_STATE`` (``load_id`` not pending on ``nid``);
    ``E_NOT_ANCHORED`` / ``E_LOCK_UNDERFLOW`` with the node slot, the path lock
    (released elsewhere); ``E_NO_BOUNDARY`` / ``E_LOCK_UNDERFLOW`` with slot -1,
    the host lock."""
    s = resolve(nodes, meta, nid)
    if s < 0:
        return E_STALE, 0
    if load_id != 0 and (nodes[s, LOAD_PENDING] != load_id or load_id < 0):
        return E_HOST_STATE, 0
    st, bad = full.check_release(nodes, s)
    if st != OK:
        return st, bad
    mamba_on = (meta[M_COMPONENTS] & C_MAMBA) != 0
    if mamba_on:
        st, bad = mamba.check_release(nodes, s)
        if st != OK:
            return st, bad
    swa_on = (meta[M_COMPONENTS] & C_SWA) != 0
    if swa_on:
        st, bad, _ = swa.check_release(nodes, s, swa_stamp)
        if st != OK:
            return st, bad
    k = 0
    if stamp != 0:
        st, k = _host_unlock_check(nodes, s, stamp)
        if st != OK:
            return st, -1
    if mamba_on:
        st, bad = mamba.check_host_release(nodes, s)
        if st != OK:
            return st, -1
    if swa_on:
        st, _ = swa.check_host_release(nodes, s, swa_host_stamp)
        if st != OK:
            return st, -1
    if load_id != 0:
        _clear_load(nodes, heap, meta, s, load_id)
    # SGLang's order: the path lock (components in reverse), then the host lock
    if mamba_on:
        mamba.release_component_lock(nodes, meta, s)
    if swa_on:
        swa.release_component_lock(nodes, heap, meta, s, swa_stamp)
    full.release_component_lock(nodes, heap, meta, s)
    if mamba_on:
        mamba.release_host_lock(nodes, s)
    if swa_on:
        swa.release_host_lock(nodes, heap, meta, s, swa_host_stamp)
    _host_unlock_apply(nodes, heap, meta, s, k)
    return OK, 0


@helper
def _reclaim_duplicates(nodes, pool, heap, meta, num_units, freed, out, acts):
    """Write-back: reclaim the host copies of settled duplicates (SGLang
    ``_reclaim_full_host_duplicates``) in list order until ``num_units`` are
    freed: pass 1 spares evictable device leaves (they will be demoted soon),
    pass 2 takes them; stale members (no longer on both tiers) are swept;
    a node with a backup / load in flight or a host lock is skipped. Returns
    ``(short, freed)``; ``short`` when the buffers cannot hold the next one (a
    call again restarts the passes: what they skipped is skipped again)."""
    hc = pool.shape[1] - 1
    for spare in (True, False):
        if freed >= num_units:
            break
        x = meta[M_DUP_HEAD]
        while x != NIL and freed < num_units:
            nxt = nodes[x, DUP_NEXT]
            f = nodes[x, FLAGS]
            if not (f & F_HAS_FULL_DEV) or not (f & F_HAS_FULL_HOST):
                dup_remove(nodes, meta, x)  # stale
            elif spare and nodes[x, HEAP_POS] >= 0:
                pass
            elif (nodes[x, WT_PENDING] == 0 and nodes[x, LOAD_PENDING] == 0
                    and nodes[x, FULL_HOST_LOCK] == 0):
                n = nodes[x, KEY_LEN]
                if not acts_room(acts, out, meta, 2, n):
                    need(meta, 0, 0, meta[M_NOUT] + n, meta[M_NACTS] + 2)
                    return True, freed
                off = nodes[x, KEY_OFF]
                at = out_put_col(out, meta, pool, off, n, hc)
                emit(acts, meta, A_FREE_HOST, FULL, SRC_OUT, at, n, 0)
                if meta[M_EVENTS]:
                    emit(acts, meta, A_REMOVED, FULL, SRC_POOL, off, n, MEDIUM_CPU)
                nodes[x, FLAGS] = f & ~F_HAS_FULL_HOST
                meta[M_HOST_TOTAL] -= n
                dup_remove(nodes, meta, x)
                freed += n
            x = nxt
    return False, freed


@kernel(scratch=("out", "acts"), on_capacity="resume")
def evict_host(nodes, ctab, pool, heap, meta, num_units, out, acts):
    """Free host units until ``num_units`` are freed or nothing is left (SGLang
    ``evict_host`` for Full, §8.5): under write-back first the host copies of
    settled duplicates (``_reclaim_duplicates``), then evictable host leaves in
    policy order: each is deleted (``A_FREE_HOST`` with its host slots in
    ``out``, ``A_REMOVED`` medium CPU with events on); a parent left a
    host-only leaf joins the heap. Returns ``(status, freed)``;
    ``E_CAPACITY`` (``meta[M_NEED_*]``) when the buffers cannot hold the next
    victim: what was freed so far is reported and a call with the rest
    continues."""
    acts_begin(meta, 0)
    freed = 0
    if meta[M_HOST] == HOST_WRITE_BACK:
        short, freed = _reclaim_duplicates(nodes, pool, heap, meta, num_units, 0, out, acts)
        if short:
            return E_CAPACITY, freed
    while freed < num_units and meta[M_HEAP_N + HEAP_HOST] > 0:
        s = heap[HEAP_HOST, 0]
        n = nodes[s, KEY_LEN]
        if not acts_room(acts, out, meta, 4, 2 * n + 1):
            need(meta, 0, 0, meta[M_NOUT] + 2 * n + 1, meta[M_NACTS] + 4)
            return E_CAPACITY, freed
        freed += delete_host_leaf(nodes, ctab, pool, heap, meta, s, out, acts)
    return OK, freed


@kernel(scratch=("out", "acts"), on_capacity="resume")
def evict_host_aux(nodes, ctab, pool, heap, meta, c, num, out, acts):
    """Free host data of auxiliary component ``c`` (SWA or MAMBA) until ``num`` are
    freed or none is left (SGLang ``evict_host(n, c)``, the component's
    ``drive_host_eviction``; SWA counts tokens, Mamba states): walk the
    component's host LRU from its least recent end, skipping host-locked
    entries; an evictable host leaf is deleted whole (``tree.delete_host_leaf``:
    every component's host data), any other entry loses the component's host
    value only (``A_FREE_HOST(c)``) -- and, for SWA on a Mamba cache, its host
    state too (SGLang's cascade to the lower-priority component). The next entry
    is read before each victim goes. Returns ``(status, freed, Full host units
    freed)``; ``E_CAPACITY`` (``meta[M_NEED_*]``) when the buffers cannot hold
    the next victim: what was freed so far is reported and a call with the rest
    continues."""
    acts_begin(meta, 0)
    lst = LRU_SWA_HOST if c == SWA else LRU_MAMBA_HOST
    freed = 0
    units = 0
    x = lru_tail_unlocked(nodes, lst)
    while freed < num and x != NIL:
        n = nodes[x, KEY_LEN]
        if not acts_room(acts, out, meta, 4, 2 * n + 1):
            need(meta, 0, 0, meta[M_NOUT] + 2 * n + 1, meta[M_NACTS] + 4)
            return E_CAPACITY, freed, units
        nxt = lru_prev_unlocked(nodes, lst, x)
        freed += n if c == SWA else 1
        if nodes[x, HOST_HEAP_POS] >= 0:  # an evictable host leaf: atomic
            units += delete_host_leaf(nodes, ctab, pool, heap, meta, x, out, acts)
        else:
            if c == SWA:
                swa.evict_host_component(nodes, pool, meta, x, out, acts)
            if mamba.has_host(nodes, x):  # Mamba's own, or SWA's cascade to it
                mamba.evict_host_component(nodes, meta, x, out, acts)
            refresh_leaf(nodes, heap, meta, x)
        x = nxt
    return OK, freed, units


@kernel
def path_units(nodes, ctab, pool, heap, meta, top, until):
    """The Full units from node ``top`` up to (not including) node ``until`` or the
    root (``until`` -1 or a dead id: the root); 0 for a dead ``top``. SGLang's
    ``init_load_back`` count (``collect_full_device_indices``)."""
    s = resolve(nodes, meta, top)
    stop = resolve(nodes, meta, until) if until >= 0 else -1
    n = 0
    while s > ROOT and s != stop:
        n += nodes[s, KEY_LEN]
        s = nodes[s, PARENT]
    return n


@kernel
def swa_host_hit(nodes, ctab, pool, heap, meta, nid):
    """SGLang's ``swa_host_hit_length`` of a match whose best node is ``nid``
    (``swa.host_hit_length``); 0 for a dead id."""
    s = resolve(nodes, meta, nid)
    if s < 0:
        return 0
    return swa.host_hit_length(nodes, meta, s)


@kernel(scratch=("out", "acts"), on_capacity="retry")
def finish_state_eviction(nodes, ctab, pool, heap, meta, nid, out, acts):
    """Resume a write-back Mamba round after ``evict_next`` answered
    ``E_NEED_STATE_BACKUP`` for node ``nid`` and the caller tried its backup
    (SGLang ``finish_mamba_state_eviction``): when the node still holds an
    unlocked device state in the Mamba LRU and no load restores it, its state is
    tombstoned (``A_FREE_SLOT(MAMBA)``; a host copy stays, in the host LRU) and
    counted toward the round; a node that became an evictable device leaf or
    lost its Full device value becomes the round's cursor again (the walk
    re-selects it); otherwise nothing changes. Returns ``(status, states
    freed)``; ``E_STALE`` never (a dead node just ends the step)."""
    acts_begin(meta, 0)
    s = resolve(nodes, meta, nid)
    if s < 0 or not mamba.has_data(nodes, s) or nodes[s, mamba.MAMBA_LOCK] > 0 \
            or nodes[s, LOAD_PENDING] != 0:
        return OK, 0
    if nodes[s, HEAP_POS] >= 0 or not (nodes[s, FLAGS] & F_HAS_FULL_DEV):
        meta[M_EVICT_CURSOR + MAMBA] = nid
        return OK, 0
    if not acts_room(acts, out, meta, 1, 1):
        need(meta, 0, 0, 1, 1)
        return E_CAPACITY, 0
    mamba.evict_component(nodes, meta, s, out, acts)
    if meta[M_EVICT_WALK + MAMBA]:
        meta[M_EVICT_DONE + MAMBA] += 1
    return OK, 1


@kernel(scratch=("out", "acts"), on_capacity="retry")
def finish_swa_eviction(nodes, ctab, pool, heap, meta, nid, out, acts):
    """Resume a write-back SWA round after ``evict_next`` answered
    ``E_NEED_STATE_BACKUP`` for node ``nid`` and the caller tried its backup
    (SGLang ``finish_swa_state_eviction``): when the node still holds unlocked
    SWA data in the SWA LRU, it is tombstoned (``A_FREE_SLOT(SWA)``; a host copy
    stays, in the SWA host LRU) and counted toward the round; a node that became
    an evictable device leaf becomes the round's cursor again (the walk
    re-selects it); otherwise nothing changes. The tombstone cascades to the
    node's Mamba state (a host copy stays). Returns ``(status, SWA units freed,
    states freed)``; ``E_STALE`` never (a dead node just ends the step)."""
    acts_begin(meta, 0)
    s = resolve(nodes, meta, nid)
    if s < 0 or not swa.has_data(nodes, s) or nodes[s, LOCK_REF + SWA * N_TIERS] > 0:
        return OK, 0, 0
    if nodes[s, HEAP_POS] >= 0:
        meta[M_EVICT_CURSOR + SWA] = nid
        return OK, 0, 0
    n = nodes[s, KEY_LEN]
    if not acts_room(acts, out, meta, 2, n + 1):
        need(meta, 0, 0, n + 1, 2)
        return E_CAPACITY, 0, 0
    swa.evict_component(nodes, pool, meta, s, out, acts)
    m = 0
    if mamba.has_data(nodes, s):  # the cascade (a host copy stays, in the host LRU)
        mamba.evict_component(nodes, meta, s, out, acts)
        m = 1
    if meta[M_EVICT_WALK + SWA]:
        meta[M_EVICT_DONE + SWA] += n
    return OK, n, m


@kernel(scratch=("out", "acts"), on_capacity="retry")
def path_cap(nodes, ctab, pool, heap, meta, slot, out, acts):
    """SGLang's ``MambaEvictExcessPathStates`` for the live node in ``slot``, run
    where an insert's ``A_PATH_CAP`` row stands (with the host tier the cap runs
    after the walk's backups, before the new leaf's): ``mamba.evict_excess_path_states``
    (a host copy of a dropped state stays). Returns ``(status, states dropped)``;
    ``E_CAPACITY`` (``meta[M_NEED_*]``) when ``out`` / ``acts`` cannot hold one row
    and value per node of the path, nothing changed."""
    acts_begin(meta, 0)
    if slot <= ROOT or slot >= meta[M_HWM] or not (nodes[slot, FLAGS] & F_ALIVE):
        return OK, 0
    k = 0
    a = slot
    while a != ROOT:
        k += 1
        a = nodes[a, PARENT]
    if not acts_room(acts, out, meta, k, k):
        need(meta, 0, 0, k, k)
        return E_CAPACITY, 0
    return OK, mamba.evict_excess_path_states(nodes, meta, slot, out, acts)


@kernel(scratch=("out", "acts"), on_capacity="retry")
def demote_leaf(nodes, ctab, pool, heap, meta, nid, out, acts):
    """Demote node ``nid`` now that its write-back backup is done (SGLang
    ``demote``): it must be an evictable device leaf with a host copy
    (``E_HOST_STATE`` otherwise, nothing changed). Counts toward an open Full
    eviction round (and the SWA and Mamba rounds for what it frees of them).
    Returns ``(status, units)``."""
    acts_begin(meta, 0)
    s = resolve(nodes, meta, nid)
    if s < 0:
        return E_STALE, 0
    if nodes[s, HEAP_POS] < 0 or not (nodes[s, FLAGS] & F_HAS_FULL_HOST):
        return E_HOST_STATE, 0
    n = nodes[s, KEY_LEN]
    if not acts_room(acts, out, meta, 4, n + 1):
        need(meta, 0, 0, n + 1, 4)
        return E_CAPACITY, 0
    state = mamba.has_data(nodes, s)
    window = swa.has_data(nodes, s)
    demote(nodes, pool, heap, meta, s, out, acts)
    if meta[M_EVICT_WALK + FULL]:
        meta[M_EVICT_DONE + FULL] += n
    if window and meta[M_EVICT_WALK + SWA]:
        meta[M_EVICT_DONE + SWA] += n
    if state and meta[M_EVICT_WALK + MAMBA]:
        meta[M_EVICT_DONE + MAMBA] += 1
    return OK, n


@kernel(scratch=("out", "acts"), on_capacity="retry")
def drop_subtree(nodes, ctab, pool, heap, meta, nid, out, acts):
    """Write-back fallback when the backup of device leaf ``nid`` found no host
    memory (SGLang ``drop_subtree_no_host``): delete its host-only descendants
    (deepest first, each node's oldest child first: SGLang's Python core's order)
    and the node itself, unless any of them is locked on either
    tier or has a transfer in flight (then nothing changes: ``(OK, 0, 0)``).
    Counts the node's units toward an open Full eviction round. Returns
    ``(status, device units, host units)``."""
    acts_begin(meta, 0)  # first: a declined drop must report no rows
    s = resolve(nodes, meta, nid)
    if s < 0:
        return E_STALE, 0, 0
    if nodes[s, HEAP_POS] < 0 or (nodes[s, FLAGS] & F_HAS_FULL_HOST):
        return E_HOST_STATE, 0, 0
    if nodes[s, LOAD_PENDING] != 0:
        return OK, 0, 0
    for j in range(N_COMPONENTS * N_TIERS):  # a host lock (write-back pins device nodes too)
        if nodes[s, LOCK_REF + j] != 0:
            return OK, 0, 0
    # count and check the subtree below s (host-only nodes: s is a device leaf)
    k = 0
    units = 0
    x = nodes[s, FIRST_CHILD]
    while x != NIL:  # iterative pre-order walk of the subtree below s
        for j in range(N_COMPONENTS * N_TIERS):
            if nodes[x, LOCK_REF + j] != 0:
                return OK, 0, 0
        if nodes[x, WT_PENDING] != 0 or nodes[x, LOAD_PENDING] != 0:
            return OK, 0, 0
        k += 1
        units += nodes[x, KEY_LEN]
        x = _next_preorder(nodes, s, x)
    n = nodes[s, KEY_LEN]
    if not acts_room(acts, out, meta, 4 * k + 6, 2 * units + k + 2 * n + 2):
        need(meta, 0, 0, 2 * units + k + 2 * n + 2, 4 * k + 6)
        return E_CAPACITY, 0, 0
    # delete host leaves below s until none is left (each deletion may expose its
    # parent): a post-order walk that takes each node's oldest child first (the tail
    # of the child list), SGLang's order (its Python core deletes its stack walk's
    # visits in reverse; the Rust core's order follows its child hash map). Each
    # child list's tail is found once: O(subtree), as the walk above
    freed_host = 0
    x = _oldest_leaf(nodes, s)
    while x != s:
        p = nodes[x, PARENT]
        prv = nodes[x, PREV_SIB]  # the next newer sibling's subtree goes next, then p
        freed_host += delete_host_leaf(nodes, ctab, pool, heap, meta, x, out, acts)
        x = p if prv == NIL else _oldest_leaf(nodes, prv)
    state = mamba.has_data(nodes, s)
    window = swa.has_data(nodes, s)
    freed = delete_leaf(nodes, ctab, pool, heap, meta, s, out, acts)
    if meta[M_EVICT_WALK + FULL]:
        meta[M_EVICT_DONE + FULL] += freed
    if window and meta[M_EVICT_WALK + SWA]:
        meta[M_EVICT_DONE + SWA] += freed
    if state and meta[M_EVICT_WALK + MAMBA]:
        meta[M_EVICT_DONE + MAMBA] += 1
    return OK, freed, freed_host


@helper
def _oldest_leaf(nodes, x):
    """The first node of a post-order walk of ``x``'s subtree that takes each node's
    oldest child first: down through the tails of the child lists (new children go
    to the head, a split's upper part takes its child's place) to a node without
    children (``x`` itself when it has none). O(the lists walked)."""
    while nodes[x, NCHILD] > 0:
        c = nodes[x, FIRST_CHILD]
        while nodes[c, NEXT_SIB] != NIL:
            c = nodes[c, NEXT_SIB]
        x = c
    return x


@helper
def _next_preorder(nodes, top, x):
    """The node after ``x`` in a pre-order walk of ``top``'s subtree (NIL at the end)."""
    c = nodes[x, FIRST_CHILD]
    if c != NIL:
        return c
    while x != top:
        nx = nodes[x, NEXT_SIB]
        if nx != NIL:
            return nx
        x = nodes[x, PARENT]
        if x == top:
            return NIL
    return NIL


@kernel
def host_lock(nodes, ctab, pool, heap, meta, nid):
    """SGLang ``inc_host_lock_ref``: pin node ``nid``'s host copy against host
    eviction: ``host lock_ref += 1`` on it, stamped as a segment boundary
    (``HOST_UUID``, a fresh stamp unless it has one). Returns ``(status, stamp)``;
    stamp 0 (nothing locked) for a node without a host copy (the root included)
    unless under write-back (which pins it anyway, as SGLang). On a Mamba cache
    the node's Mamba host lock is taken too, whatever it holds (never the root),
    as SGLang's Mamba component does; a host-only state leaves the host LRU.
    On an SWA cache the SWA host window lock is taken as well
    (``swa.acquire_host_lock``). Returns ``(status, stamp, swa_stamp)``."""
    s = resolve(nodes, meta, nid)
    if s < 0:
        return E_STALE, 0, 0
    stamp, swa_stamp = _host_lock(nodes, heap, meta, s)
    return OK, stamp, swa_stamp


@helper
def _host_lock(nodes, heap, meta, s):
    """``(Full stamp, SWA stamp)`` of ``inc_host_lock_ref`` on slot ``s``."""
    swa_stamp = 0
    if meta[M_COMPONENTS] & C_SWA:  # SGLang's components in order: Full, SWA, Mamba
        swa_stamp = swa.acquire_host_lock(nodes, meta, s)
    if meta[M_COMPONENTS] & C_MAMBA:  # the node's Mamba host lock, with or without a state
        mamba.acquire_host_lock(nodes, s)
    refresh_leaf(nodes, heap, meta, s)
    if not (nodes[s, FLAGS] & F_HAS_FULL_HOST) and meta[M_HOST] != HOST_WRITE_BACK:
        return 0, swa_stamp  # nothing to pin (write-back pins any anchor, the root too)
    if nodes[s, HOST_UUID] == 0:
        nodes[s, HOST_UUID] = meta[M_HOST_UUID_NEXT]
        meta[M_HOST_UUID_NEXT] += 1
    nodes[s, FULL_HOST_LOCK] += 1
    refresh_leaf(nodes, heap, meta, s)
    return nodes[s, HOST_UUID], swa_stamp


@kernel
def host_unlock(nodes, ctab, pool, heap, meta, nid, stamp, swa_stamp):
    """SGLang ``dec_host_lock_ref``: release the Full host-lock segment from node
    ``nid`` up to the node carrying boundary ``stamp`` (one node unless a split
    extended it; 0: no segment) and, on a Mamba cache, the node's Mamba host
    lock, and on an SWA cache the SWA host window up to ``swa_stamp``. Checked
    before any change: ``E_STALE`` for a dead id,
    ``E_NO_BOUNDARY`` when a stamp is not on the path, ``E_LOCK_UNDERFLOW``
    when a node of a segment (or the node's Mamba host lock) holds no host
    lock. Returns ``(status, nodes)``."""
    s = resolve(nodes, meta, nid)
    if s < 0:
        return E_STALE, 0
    k = 0
    if stamp != 0:
        st, k = _host_unlock_check(nodes, s, stamp)
        if st != OK:
            return st, 0
    mamba_on = (meta[M_COMPONENTS] & C_MAMBA) != 0
    if mamba_on:
        st, _ = mamba.check_host_release(nodes, s)
        if st != OK:
            return st, 0
    swa_on = (meta[M_COMPONENTS] & C_SWA) != 0
    if swa_on:
        st, _ = swa.check_host_release(nodes, s, swa_stamp)
        if st != OK:
            return st, 0
    if mamba_on:
        mamba.release_host_lock(nodes, s)
        refresh_leaf(nodes, heap, meta, s)
    if swa_on:
        swa.release_host_lock(nodes, heap, meta, s, swa_stamp)
    _host_unlock_apply(nodes, heap, meta, s, k)
    return OK, k


@helper
def _host_unlock_check(nodes, s, stamp):
    """``(OK, k)``: the host-lock segment from slot ``s`` up to boundary ``stamp``
    has ``k`` nodes, each holding a host lock; else ``(E_LOCK_UNDERFLOW, 0)`` or
    ``(E_NO_BOUNDARY, 0)``."""
    k = 0
    a = s
    while True:
        if nodes[a, FULL_HOST_LOCK] <= 0:
            return E_LOCK_UNDERFLOW, 0
        k += 1
        if nodes[a, HOST_UUID] == stamp:
            return OK, k
        if a == ROOT:
            return E_NO_BOUNDARY, 0
        a = nodes[a, PARENT]


@helper
def _host_unlock_apply(nodes, heap, meta, s, k):
    a = s
    for _ in range(k):
        nodes[a, FULL_HOST_LOCK] -= 1
        refresh_leaf(nodes, heap, meta, a)
        a = nodes[a, PARENT]


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
