"""The host tier (HiCache, SGLang 0.5.23 spec §8): backup, its ack, load-back, host locks.

Host eviction and the write-back steps are in ``core/host_evict.py``, storage
refills in ``core/refill.py``.

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

# the host values a backup, a load-back and a storage refill commit (an SWA window's
# host slots, a Mamba host state) are component inputs of those kernels: they name
# the two components' rules; everything else goes through the dispatch module
from ..components import dispatch, full, mamba, swa
from ..kernels._jit import helper, kernel
from ..kernels.actions import (
    A_STORED, MEDIUM_CPU, MEDIUM_GPU, SRC_POOL, acts_begin, acts_room, emit,
)
from ..kernels.layout import (
    C_FULL, C_MAMBA, C_SWA, E_CAPACITY, E_HOST_LEN, E_HOST_STATE, E_LOCK_UNDERFLOW,
    E_NO_BOUNDARY, E_STALE, FLAGS, FULL, M_COMPONENTS, FULL_DEV, FULL_HOST_LOCK, F_ALIVE,
    F_HAS_FULL_DEV, F_HAS_FULL_HOST, HOST_UUID, HOST_WRITE_BACK, KEY_LEN, KEY_OFF, LOAD_PENDING,
    M_EVENTS, M_HOST, M_HOST_TOTAL, F_HAS_SWA_DEV, F_HAS_SWA_HOST, M_HOST_UUID_NEXT, M_HWM,
    M_NOUT, OK, PARENT, ROOT, WT_PENDING,
)
from ..kernels.dups import dup_update
from ..kernels.order import refresh_leaf
from ..kernels.state import need, resolve
from .tree import restore_device

# E_HOST_STATE, E_HOST_LEN: ``kernels/layout.py``


@kernel(scratch="out", on_capacity="retry")
def backup_plan(nodes, ctab, pool, heap, meta, nid, out):
    """The nodes a write-through backup of node ``nid`` covers (SGLang
    ``_build_backup_kv_action``): ``nid`` and its ancestors up to the first one
    with a host value. Writes their slots to ``out[:k]``, ancestors first.
    Returns ``(status, units, k)`` (``units``: the Full units they lack on the
    host). A node with a Full host copy is planned only when a component's data
    on it needs one (SGLang's incremental backup, ``dispatch.needs_backup``: a
    Mamba state, SWA data within its window): ``k`` is 0
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
        if not (meta[M_COMPONENTS] & ~C_FULL and dispatch.needs_backup(nodes, meta, s, out)):
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
    (``mamba.unbacked``); ``E_HOST_LEN`` when ``host_slots`` is not its length (or not
    empty) or ``swa_host`` not the SWA nodes' units, and ``E_HOST_STATE`` when one of those
    is dead or its SWA data is not on the device only; nothing changes then."""
    if slot <= ROOT or slot >= meta[M_HWM] or not (nodes[slot, FLAGS] & F_ALIVE):
        return E_HOST_STATE, 0, 0
    f = nodes[slot, FLAGS]
    if not (f & F_HAS_FULL_DEV):
        return E_HOST_STATE, 0, 0
    if state_host >= 0 and not ((meta[M_COMPONENTS] & C_MAMBA) and mamba.unbacked(nodes, slot)):
        return E_HOST_STATE, 0, 0
    ws = swa_host.shape[0]
    wk = swa_nodes.shape[0]
    if ws or wk:
        wu = swa.window_units(nodes, meta, swa_nodes, F_HAS_SWA_DEV)
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
    if lock:  # as inc_lock_ref
        full.acquire_component_lock(nodes, heap, meta, slot)
        if meta[M_COMPONENTS] & ~C_FULL:
            boundary = dispatch.lock(nodes, heap, meta, slot, 0)
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
        wu = swa.window_units(nodes, meta, swa_nodes, F_HAS_SWA_HOST)
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
    if meta[M_COMPONENTS] & ~C_FULL:
        swa_stamp = dispatch.lock(nodes, heap, meta, s, 0)
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
    aux = (meta[M_COMPONENTS] & ~C_FULL) != 0
    if aux:
        st, bad = dispatch.check_unlock(nodes, meta, s, 0, swa_stamp)
        if st != OK:
            return st, bad
    k = 0
    if stamp != 0:
        st, k = _host_unlock_check(nodes, s, stamp)
        if st != OK:
            return st, -1
    if aux:
        st, _ = dispatch.check_host_unlock(nodes, meta, s, swa_host_stamp)
        if st != OK:
            return st, -1
    if load_id != 0:
        _clear_load(nodes, heap, meta, s, load_id)
    # SGLang's order: the path lock (components in reverse), then the host lock
    if aux:
        dispatch.unlock(nodes, heap, meta, s, 0, swa_stamp)
    full.release_component_lock(nodes, heap, meta, s)
    if aux:
        dispatch.host_unlock(nodes, heap, meta, s, swa_host_stamp)
    _host_unlock_apply(nodes, heap, meta, s, k)
    return OK, 0


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
    if meta[M_COMPONENTS] & ~C_FULL:  # the components in order (Mamba: the node, always)
        swa_stamp = dispatch.host_lock(nodes, heap, meta, s)
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
    aux = (meta[M_COMPONENTS] & ~C_FULL) != 0
    if aux:  # checked last component first, then released in that order
        st, _ = dispatch.check_host_unlock(nodes, meta, s, swa_stamp)
        if st != OK:
            return st, 0
        dispatch.host_unlock(nodes, heap, meta, s, swa_stamp)
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
