"""The SWA (sliding-window attention) component (SGLang ``SWAComponent``, spec §6.2).

``W`` = the retain window (``meta[M_SWA_WINDOW]``), ``P`` the page size,
``T = ceil(W / P) * P`` the tail a fresh leaf is capped to.

Value: a node holds SWA data iff its ``F_HAS(SWA)`` bit is set; the data are
the SWA pool slots the allocator maps its Full slots to (the value is not
stored: SGLang's ``SWARebuild`` translates the Full value through the same
mapping). A node with Full data but no SWA data is a *tombstone* (kept: Full is
the backbone). Every node with SWA data is in the SWA device LRU
(``kernels/lru.py``, list ``LRU_SWA``); the SWA ledgers count its length.

Rules (hook names as SGLang's):

* ``validate`` (``create_match_validator``): a tombstone resets the window and
  is rejected; a node with data adds its length and is accepted once ``W``
  contiguous units of SWA data lead to it (from the root: at once).
* ``redistribute_on_node_split``: the upper part inherits the data bit, the lock
  counts and the window-lock boundary stamp (it marks the older edge), and sits
  right behind the child in the LRU.
* ``update_component_on_insert_overlap``: a walked tombstone whose positions are
  at or past the request's SWA cursor is recovered from the request's fresh
  slots (split at the cursor first): with its Full value locked by a running
  request the node keeps its Full slots and takes over the incoming slots' SWA
  peers (``A_SWA_RECOVER_LOCKED``), else its Full value becomes the incoming
  slots and the old ones are freed Full-only; duplicates below the cursor are
  freed Full-only.
* ``commit_insert_component_data``: the new leaf's part at or past the cursor gets
  SWA data (the part below stays a tombstone), capped so the tail holds ``T``
  units; the older part is published first.
* ``refresh_lru``: at match end and insert end, the anchor and its ancestors
  within ``W + P`` units move to the MRU end in path order.
* ``acquire_component_lock``: the window segment from the node up until ``W``
  units are covered (tombstones counted), its last node stamped as the boundary;
  ``release_component_lock`` walks the same segment back to the stamp;
  ``release_window_lock`` (early release) also tombstones a segment node that is
  an unlocked device leaf.
* eviction (``evict_component`` / the walk): from the LRU tail, skipping locked
  entries; a device leaf is deleted whole, any other node tombstoned.
* ``eviction_priority``: leaf 0, internal 1.
"""

from ..kernels._jit import helper, kernel
from ..kernels.actions import (
    out_node_values, out_reverse, A_ADOPTED, A_FREE_HOST, A_FREE_KV, A_FREE_KV_FULL_ONLY, A_FREE_SLOT, A_SWA_RECOVER_LOCKED,
    SRC_IN, SRC_OUT, emit, out_put_col, out_put_span,
)
from ..kernels.layout import (
    C_SWA, E_CAPACITY, E_HOST_STATE, E_LOCK_UNDERFLOW, E_NO_BOUNDARY, E_STALE, F_ALIVE,
    HOST_WRITE_BACK, LOAD_PENDING, M_COMPONENTS, M_HWM, F_HAS_FULL_DEV, F_HAS_FULL_HOST,
    F_HAS_SWA_DEV,
    F_HAS_SWA_HOST, FLAGS, FULL, FULL_DEV, FULL_LOCK, KEY_LEN, KEY_OFF, LOCK_REF, LRU_SWA,
    LRU_SWA_HOST, M_EVICTABLE, M_HOST, M_NLIVE, M_PAGE, M_PROTECTED, M_SWA_HOST_TOTAL, M_SWA_UUID_NEXT,
    M_SWA_WINDOW, M_TOTAL, M_WALK_ACC, N_TIERS, OK, PARENT, ROOT, SWA, SWA_HOST_LOCK,
    SWA_HOST_UUID, SWA_LOCK, SWA_UUID, WT_PENDING,
)
from ..kernels.lru import (
    lru_check_host_list, lru_check_list, lru_check_member, lru_head, lru_in_list, lru_insert_after, lru_move_after, lru_push_front, lru_remove,
)
from ..kernels.order import is_device_leaf, refresh_leaf
from ..kernels.state import need, resolve

#: The component's id (``ComponentType.SWA``) and its ``meta[M_COMPONENTS]`` bit.
ID = SWA
BIT = C_SWA
#: Cascade priority on an internal node (leaf: 0).
PRIORITY_INTERNAL = 1
#: The validator's window before any tombstone: "no hole seen yet".
NO_HOLE = 1 << 62


@helper
def has_data(nodes, s):
    return (nodes[s, FLAGS] & F_HAS_SWA_DEV) != 0


@helper
def has_host(nodes, s):
    return (nodes[s, FLAGS] & F_HAS_SWA_HOST) != 0


@helper
def host_only(nodes, s):
    """SWA data on the host only (a load-back restores it)."""
    return (nodes[s, FLAGS] & (F_HAS_SWA_DEV | F_HAS_SWA_HOST)) == F_HAS_SWA_HOST


@helper
def unbacked(nodes, s):
    """SWA data on the device with no host copy."""
    return (nodes[s, FLAGS] & (F_HAS_SWA_DEV | F_HAS_SWA_HOST)) == F_HAS_SWA_DEV


@helper
def host_col(pool):
    """The pool column of the SWA host values (right before the Full host column)."""
    return pool.shape[1] - 2


@helper
def validate_host(nodes, meta, s, acc):
    """The host tier's validator (SGLang's with ``match_device_only=False``): SWA
    data on either tier counts; returns ``(ok, acc)`` as ``validate``."""
    if not (nodes[s, FLAGS] & (F_HAS_SWA_DEV | F_HAS_SWA_HOST)):
        return False, 0
    if acc < NO_HOLE:
        acc += nodes[s, KEY_LEN]
    return acc >= meta[M_SWA_WINDOW], acc


@helper
def host_hit_length(nodes, meta, best):
    """SGLang's ``swa_host_hit_length``: from ``best`` toward the root until ``W``
    units of SWA data (either tier) are covered, the units of the nodes whose SWA
    data is on the host only; a node with none ends the walk (``collect_host_only``'s
    units; nothing written: an empty view of ``nodes`` stands for ``out``)."""
    return window_nodes(nodes, meta, best, nodes[ROOT, :0], 0, F_HAS_SWA_HOST, False)[1]


@helper
def collect_unbacked(nodes, meta, s, out, k0):
    """SGLang ``_collect_unbacked_swa_nodes_in_window``: from ``s`` toward the root
    until ``W`` units of SWA data are covered, stopping at a node with a backup in
    flight or with no SWA data on either tier, the nodes whose SWA data has no
    host copy, written deepest first to ``out[k0:]`` when ``out`` is given
    (``out.shape[0] > 0``). Returns ``(nodes, units)``; the caller checked room."""
    return window_nodes(nodes, meta, s, out, k0, F_HAS_SWA_DEV, True)


@helper
def collect_host_only(nodes, meta, s, out, k0):
    """SGLang's SWA ``build_hicache_transfers(LOAD_BACK)``: from ``s`` toward the root
    until ``W`` units of SWA data are covered, the nodes whose SWA data is on the
    host only, as ``collect_unbacked`` writes them; a node with no SWA data on
    either tier ends the walk (SGLang asserts there is none: its validator
    guarantees it for a match's best node)."""
    return window_nodes(nodes, meta, s, out, k0, F_HAS_SWA_HOST, False)


@helper
def window_nodes(nodes, meta, s, out, k0, tier_bit, stop_pending):
    """The window walk of ``collect_unbacked`` / ``collect_host_only``: the nodes
    whose SWA data is on the tier of ``tier_bit`` only; ``stop_pending``: a node
    with a backup in flight ends the walk too."""
    w = meta[M_SWA_WINDOW]
    covered = 0
    k = 0
    units = 0
    a = s
    while a != ROOT and covered < w:
        if stop_pending and nodes[a, WT_PENDING] != 0:
            break
        f = nodes[a, FLAGS] & (F_HAS_SWA_DEV | F_HAS_SWA_HOST)
        if not f:
            break
        n = nodes[a, KEY_LEN]
        covered += n
        if f == tier_bit:
            if out.shape[0] > 0:
                out[k0 + k] = a
            k += 1
            units += n
        a = nodes[a, PARENT]
    return k, units


@helper
def host_lru_join(nodes, s):
    """SGLang's host-LRU insert (``insert_mru``, unless there): a node whose SWA
    data is on the host only, host-locked or not."""
    if host_only(nodes, s) and not lru_in_list(nodes, LRU_SWA_HOST, s):
        lru_push_front(nodes, LRU_SWA_HOST, s)


@helper
def attach_host(nodes, pool, meta, s, host_slots, start):
    """Node ``s`` (SWA data on the device, none on the host) takes
    ``host_slots[start:start + len]`` as its SWA host value (a backup commit)."""
    n = nodes[s, KEY_LEN]
    off = nodes[s, KEY_OFF]
    dst = pool[off:off + n, host_col(pool)]
    src = host_slots[start:start + n]
    for j in range(n):
        dst[j] = src[j]
    nodes[s, FLAGS] |= F_HAS_SWA_HOST
    meta[M_SWA_HOST_TOTAL] += n


@helper
def evict_host_component(nodes, pool, meta, s, out, acts):
    """Free ``s``'s SWA host value (``A_FREE_HOST(SWA)`` with its host slots in
    ``out``); it leaves the SWA host LRU. Returns its units. The caller checked
    room for 1 row and ``len`` values."""
    n = nodes[s, KEY_LEN]
    at = out_put_col(out, meta, pool, nodes[s, KEY_OFF], n, host_col(pool))
    emit(acts, meta, A_FREE_HOST, SWA, SRC_OUT, at, n, 0)
    nodes[s, FLAGS] &= ~F_HAS_SWA_HOST
    meta[M_SWA_HOST_TOTAL] -= n
    if lru_in_list(nodes, LRU_SWA_HOST, s):
        lru_remove(nodes, LRU_SWA_HOST, s)
    return n


@helper
def acquire_host_lock(nodes, meta, s):
    """The host window segment lock (SGLang's SWA ``acquire_component_lock`` with
    ``lock_host``): from ``s`` up until ``W`` units are covered, host lock_ref += 1
    on each; an entry of the SWA host LRU with a host value leaves it on 0 -> 1;
    the node where the window is reached is stamped (``SWA_HOST_UUID``) as the
    boundary. Returns the stamp, 0 when the segment reached the root."""
    w = meta[M_SWA_WINDOW]
    covered = 0
    boundary = 0
    a = s
    while a != ROOT and covered < w:
        if nodes[a, SWA_HOST_LOCK] == 0 and has_host(nodes, a) \
                and lru_in_list(nodes, LRU_SWA_HOST, a):
            lru_remove(nodes, LRU_SWA_HOST, a)
        nodes[a, SWA_HOST_LOCK] += 1
        covered += nodes[a, KEY_LEN]
        if covered >= w:
            boundary = _stamp(nodes, meta, a, SWA_HOST_UUID)
        a = nodes[a, PARENT]
    return boundary


@helper
def _stamp(nodes, meta, a, col):
    """Node ``a``'s window-lock boundary stamp in column ``col`` (``SWA_UUID`` /
    ``SWA_HOST_UUID``), a fresh one (never reused) when it has none."""
    if nodes[a, col] == 0:
        nodes[a, col] = meta[M_SWA_UUID_NEXT]
        meta[M_SWA_UUID_NEXT] += 1
    return nodes[a, col]


@helper
def check_host_release(nodes, s, boundary):
    """Whether the host window segment ``[s, boundary]`` can be released (every
    node's SWA host lock_ref > 0, the boundary on the path): ``(OK, nodes)``,
    ``(E_LOCK_UNDERFLOW, slot)`` or ``(E_NO_BOUNDARY, -1)``. ``boundary`` 0: the
    segment reaches the root."""
    count = 0
    a = s
    while a != ROOT:
        if nodes[a, SWA_HOST_LOCK] <= 0:
            return E_LOCK_UNDERFLOW, a
        count += 1
        if boundary != 0 and nodes[a, SWA_HOST_UUID] == boundary:
            return OK, count
        a = nodes[a, PARENT]
    if boundary != 0:
        return E_NO_BOUNDARY, -1
    return OK, count


@helper
def release_host_lock(nodes, heap, meta, s, boundary):
    """The reverse of ``acquire_host_lock`` over ``[s, boundary]`` (checked by
    ``check_host_release``): a node whose host lock drops to 0 while its SWA data is
    on the host only rejoins the SWA host LRU (MRU) unless there, and is re-checked
    for the leaf heaps."""
    a = s
    while a != ROOT:
        if nodes[a, SWA_HOST_LOCK] == 1 and host_only(nodes, a) \
                and not lru_in_list(nodes, LRU_SWA_HOST, a):
            lru_push_front(nodes, LRU_SWA_HOST, a)
        nodes[a, SWA_HOST_LOCK] -= 1
        if nodes[a, SWA_HOST_LOCK] == 0:
            refresh_leaf(nodes, heap, meta, a)
        if boundary != 0 and nodes[a, SWA_HOST_UUID] == boundary:
            break
        a = nodes[a, PARENT]


@helper
def refresh_lru(nodes, meta, anchor):
    """``reset_node_and_window_ancestors_mru`` with window ``W + P``: from ``anchor``
    toward the root while fewer than ``W + P`` units were passed, each node with
    SWA data moves to the MRU end behind the previously moved one (so the
    anchor ends up most recent, its ancestors right behind in path order)."""
    window = meta[M_SWA_WINDOW] + meta[M_PAGE]
    prev = lru_head(LRU_SWA)
    acc = 0
    s = anchor
    while s != ROOT and acc < window:
        if has_data(nodes, s):
            lru_move_after(nodes, LRU_SWA, prev, s)
            prev = s
        acc += nodes[s, KEY_LEN]
        s = nodes[s, PARENT]


@helper
def publish(nodes, meta, s):
    """Give node ``s`` (a tombstone) SWA data (SGLang: the ``SWARebuild`` /
    ``set_component_device_value`` of a node): data bit, MRU in the LRU, its
    length on the SWA ledger (protected when a window lock covers it)."""
    n = nodes[s, KEY_LEN]
    nodes[s, FLAGS] |= F_HAS_SWA_DEV
    if lru_in_list(nodes, LRU_SWA_HOST, s):  # its host copy is a duplicate now
        lru_remove(nodes, LRU_SWA_HOST, s)
    lru_push_front(nodes, LRU_SWA, s)
    if nodes[s, SWA_LOCK] > 0:
        meta[M_PROTECTED + SWA] += n
    else:
        meta[M_EVICTABLE + SWA] += n
    meta[M_TOTAL + SWA] += n


@helper
def evict_component(nodes, pool, meta, s, out, acts):
    """Tombstone ``s``'s SWA data (unlocked): ``A_FREE_SLOT(SWA)`` with its Full
    indices (the allocator frees their SWA peers), ledger, LRU. Returns the units.
    The caller checked room for 1 row and ``len`` values."""
    n = nodes[s, KEY_LEN]
    at = out_put_span(out, meta, pool, nodes[s, KEY_OFF], n)
    emit(acts, meta, A_FREE_SLOT, SWA, SRC_OUT, at, n, 0)
    meta[M_EVICTABLE + SWA] -= n
    meta[M_TOTAL + SWA] -= n
    nodes[s, FLAGS] &= ~F_HAS_SWA_DEV
    lru_remove(nodes, LRU_SWA, s)
    host_lru_join(nodes, s)  # a host copy stays, in the SWA host LRU
    return n


@helper
def release_deleted(nodes, meta, s):
    """Drop the SWA data of a node being deleted whole (its Full indices were
    already put in ``out`` by the caller; ``delete_leaf`` emits the row)."""
    n = nodes[s, KEY_LEN]
    meta[M_EVICTABLE + SWA] -= n
    meta[M_TOTAL + SWA] -= n
    nodes[s, FLAGS] &= ~F_HAS_SWA_DEV
    lru_remove(nodes, LRU_SWA, s)


@helper
def redistribute_on_node_split(nodes, u, child):
    """Upper part ``u`` of a split of ``child``: SWA lock counts copied (both
    tiers), the boundary stamps migrate to ``u`` (they mark the older edge), and
    ``u`` (when it has data) sits right behind ``child`` in the LRU. The data bits
    are inherited; the ledger is unchanged (the span is divided)."""
    nodes[u, FLAGS] |= nodes[child, FLAGS] & (F_HAS_SWA_DEV | F_HAS_SWA_HOST)
    for t in range(N_TIERS):
        nodes[u, LOCK_REF + SWA * N_TIERS + t] = nodes[child, LOCK_REF + SWA * N_TIERS + t]
    nodes[u, SWA_UUID] = nodes[child, SWA_UUID]
    nodes[child, SWA_UUID] = 0
    nodes[u, SWA_HOST_UUID] = nodes[child, SWA_HOST_UUID]
    nodes[child, SWA_HOST_UUID] = 0
    if has_data(nodes, u):
        lru_insert_after(nodes, LRU_SWA, child, u)
    if has_host(nodes, u) and nodes[u, SWA_HOST_LOCK] == 0:
        # SGLang: host-locked halves stay out of the host LRU; a host-only upper
        # part sits right behind the child when the child is listed, else MRU
        if not has_data(nodes, u):
            if lru_in_list(nodes, LRU_SWA_HOST, child):
                lru_insert_after(nodes, LRU_SWA_HOST, child, u)
            else:
                lru_push_front(nodes, LRU_SWA_HOST, u)
        if not has_data(nodes, child) and not lru_in_list(nodes, LRU_SWA_HOST, child):
            lru_push_front(nodes, LRU_SWA_HOST, child)


@helper
def overlap_split(nodes, meta, s, length, m, prev, cursor):
    """Rule of ``dispatch.overlap_split``: the walked node ``s`` (key units
    ``[length, length + m)``) is split at the request's SWA cursor before its SWA
    data is recovered from the request's slots (``overlap``); returns the units of
    the upper part to split off (0: none)."""
    end = length + m
    if prev >= end or has_data(nodes, s):
        return 0
    live = cursor if cursor > length else length
    if live >= end or live == length:
        return 0
    return live - length


@helper
def overlap(nodes, pool, meta, s, length, m, value, prev, cursor, track, out, acts):
    """SGLang's ``update_component_on_insert_overlap``: recover the SWA data of the
    walked node ``s`` (key units ``[length, length + m)``; after ``overlap_split``
    ``s`` is the part at and past ``cursor``) from the request's slots ``value``.

    Returns ``consumed_from``, the first key position (relative to ``length``)
    whose slot the tree took over (``m``: none), so the caller frees duplicates
    only below it. With its Full value locked by a running request the node
    keeps its Full slots and takes over the incoming slots' SWA peers
    (``A_SWA_RECOVER_LOCKED``), else its Full value becomes the incoming slots
    and the old ones are freed Full-only. With ``track``, the adopted ranges are
    reported (``A_ADOPTED``). The caller checked room (2 rows per walked node
    here, ``m`` values)."""
    end = length + m
    if prev >= end or has_data(nodes, s):
        return m
    live = cursor if cursor > length else length
    if live >= end:
        return m
    off = nodes[s, KEY_OFF]
    k = end - live
    if track:
        emit(acts, meta, A_ADOPTED, SWA, SRC_IN, live, k, 0)
    at = out_put_span(out, meta, pool, off, k)
    if nodes[s, FULL_LOCK] > 0:
        emit(acts, meta, A_SWA_RECOVER_LOCKED, SWA, SRC_OUT, at, k, live)
    else:
        if track:
            emit(acts, meta, A_ADOPTED, FULL, SRC_IN, live, k, 0)
        emit(acts, meta, A_FREE_KV_FULL_ONLY, SWA, SRC_OUT, at, k, 0)
        dst = pool[off:off + k, FULL_DEV]
        src = value[live:end]
        for j in range(k):
            dst[j] = src[j]
    publish(nodes, meta, s)
    return live - length


@helper
def unevict_split(nodes, meta, s, length, m, cursor):
    """Rule of ``dispatch.unevict_split``: the host-only node ``s`` (key units
    ``[length, length + m)``) that just took the request's slots is split at the
    cursor before its part past it gets SWA data (``unevict``); returns the units
    of the upper part (a tombstone) to split off (0: none)."""
    end = length + m
    if has_data(nodes, s):
        return 0
    live = cursor if cursor > length else length
    if live >= end or live == length:
        return 0
    return live - length


@helper
def unevict(nodes, meta, s, length, m, cursor, track, acts):
    """SGLang ``recover_after_unevict``: the host-only node ``s`` (key units
    ``[length, length + m)``; after ``unevict_split`` its part at or past
    ``cursor``) just took the request's slots as its Full device value and gets
    SWA data from them (their SWA peers). With ``track`` the adopted range is
    reported (``A_ADOPTED``)."""
    end = length + m
    if has_data(nodes, s):
        return
    live = cursor if cursor > length else length
    if live >= end:
        return
    publish(nodes, meta, s)
    if track:
        emit(acts, meta, A_ADOPTED, SWA, SRC_IN, live, end - live, 0)


@helper
def free_dups(nodes, meta, start, end, cursor, acts):
    """Rule of ``dispatch.free_dups``: free the request's slots ``value[start:end]``
    that duplicate the tree's, the part below the SWA ``cursor`` Full-only (its SWA
    peers are gone), the rest with their SWA peers (SGLang's duplicate free of
    ``_insert_overlap_step``). Returns True (the frees are emitted)."""
    if start >= end:
        return True
    cut = cursor if cursor > start else start
    if cut > end:
        cut = end
    if cut > start:
        emit(acts, meta, A_FREE_KV_FULL_ONLY, SWA, SRC_IN, start, cut - start, 0)
    if cut < end:
        emit(acts, meta, A_FREE_KV, SWA, SRC_IN, cut, end - cut, 0)
    return True


@helper
def _tail(meta):
    """``T = ceil(W / P) * P``: the units of SWA data a fresh leaf keeps."""
    page = meta[M_PAGE]
    return (meta[M_SWA_WINDOW] + page - 1) // page * page


@helper
def commit_split(nodes, meta, leaf, start, end, cursor):
    """Rule of ``dispatch.commit_split``: the new ``leaf`` holds key units
    ``[end - len, end)``, its key ``[start, end)``: split first at the cursor (the
    part below it stays a tombstone), then so the leaf keeps exactly ``T`` units
    of SWA data (the older part becomes its parent). Returns the units of the
    next upper part to split off, 0 when none is left."""
    n = nodes[leaf, KEY_LEN]
    live = cursor if cursor > start else start
    if live >= end:
        return 0
    pos = end - n
    if pos < live:
        return live - pos
    tail = _tail(meta)
    return n - tail if n > tail else 0


@helper
def commit_upper(nodes, meta, u, leaf, start, end, cursor):
    """Rule of ``dispatch.commit_upper``: ``u`` was split off the new ``leaf`` at
    this component's request (``commit_split``): the part at or past the cursor
    gets SWA data (published before the leaf, so the tail is more recent)."""
    live = cursor if cursor > start else start
    if end - nodes[leaf, KEY_LEN] - nodes[u, KEY_LEN] >= live:
        publish(nodes, meta, u)


@helper
def commit_leaf(nodes, pool, meta, leaf, start, end, cursor, track, acts):
    """SGLang's ``commit_insert_component_data`` for the new ``leaf`` (key units
    ``[start, end)``; after the splits ``commit_split`` asked for): its part at or
    past the cursor gets SWA data. With ``track`` the adopted range is reported
    (``A_ADOPTED``)."""
    live = cursor if cursor > start else start
    if live >= end:
        return
    if track:
        emit(acts, meta, A_ADOPTED, SWA, SRC_IN, live, end - live, 0)
    publish(nodes, meta, leaf)


@helper
def acquire_component_lock(nodes, meta, s):
    """Window segment lock from ``s`` up until ``W`` units are covered (tombstones
    counted, their lock counted too): ``lock_ref += 1`` on each, data moving
    evictable -> protected on 0 -> 1; the node where the window is reached is
    stamped (once) as the boundary. Returns the boundary stamp, 0 when the
    segment reached the root."""
    w = meta[M_SWA_WINDOW]
    covered = 0
    boundary = 0
    a = s
    while a != ROOT and covered < w:
        if nodes[a, SWA_LOCK] == 0 and has_data(nodes, a):
            n = nodes[a, KEY_LEN]
            meta[M_EVICTABLE + SWA] -= n
            meta[M_PROTECTED + SWA] += n
        nodes[a, SWA_LOCK] += 1
        covered += nodes[a, KEY_LEN]
        if covered >= w:
            boundary = _stamp(nodes, meta, a, SWA_UUID)
        a = nodes[a, PARENT]
    return boundary


@helper
def check_release(nodes, s, boundary):
    """Whether the segment ``[s, boundary]`` can be released (every node's SWA
    lock_ref > 0), checked before any change: ``(OK, units of data, nodes)`` or
    ``(E_LOCK_UNDERFLOW, slot, 0)``. ``boundary`` 0: the segment reaches the root."""
    data = 0
    count = 0
    a = s
    while a != ROOT:
        if nodes[a, SWA_LOCK] <= 0:
            return E_LOCK_UNDERFLOW, a, 0
        if has_data(nodes, a):
            data += nodes[a, KEY_LEN]
        count += 1
        if boundary != 0 and nodes[a, SWA_UUID] == boundary:
            break
        a = nodes[a, PARENT]
    return OK, data, count


@helper
def release_component_lock(nodes, heap, meta, s, boundary):
    """The reverse of ``acquire_component_lock`` over ``[s, boundary]`` (checked by
    ``check_release``)."""
    a = s
    while a != ROOT:
        if nodes[a, SWA_LOCK] == 1 and has_data(nodes, a):
            n = nodes[a, KEY_LEN]
            meta[M_PROTECTED + SWA] -= n
            meta[M_EVICTABLE + SWA] += n
        nodes[a, SWA_LOCK] -= 1
        if nodes[a, SWA_LOCK] == 0:
            refresh_leaf(nodes, heap, meta, a)
        if boundary != 0 and nodes[a, SWA_UUID] == boundary:
            break
        a = nodes[a, PARENT]


@helper
def release_window_lock(nodes, pool, heap, meta, s, boundary, out, acts):
    """Early release of the window segment ``[s, boundary]`` (SGLang
    ``release_window_lock``; checked by ``check_release``; room for one row and
    the segment's data per node checked by the caller): like
    ``release_component_lock``, and a node whose SWA lock drops to 0 while it is
    an unlocked device leaf loses its SWA data at once (``A_FREE_SLOT(SWA)``).
    Returns the units freed."""
    freed = 0
    a = s
    while a != ROOT:
        nodes[a, SWA_LOCK] -= 1
        if nodes[a, SWA_LOCK] == 0:
            refresh_leaf(nodes, heap, meta, a)
            if has_data(nodes, a):
                n = nodes[a, KEY_LEN]
                meta[M_PROTECTED + SWA] -= n
                meta[M_EVICTABLE + SWA] += n
                if is_device_leaf(nodes, a):
                    freed += evict_component(nodes, pool, meta, a, out, acts)
        if boundary != 0 and nodes[a, SWA_UUID] == boundary:
            break
        a = nodes[a, PARENT]
    return freed


@helper
def shift_counts(nodes, s, boundary, d):
    """Add ``d`` to the SWA lock_ref of the window segment ``[s, boundary]`` without
    ledger or heap changes (a batch release's dry run; see ``full.shift_counts``)."""
    a = s
    while a != ROOT:
        nodes[a, SWA_LOCK] += d
        if boundary != 0 and nodes[a, SWA_UUID] == boundary:
            break
        a = nodes[a, PARENT]


# ---------------------------------------------------------------- dispatch rules
# The rules ``components/dispatch.py`` chains (each hook's signature, there).
@helper
def walk_begin(meta):
    meta[M_WALK_ACC + 2 * SWA] = NO_HOLE
    meta[M_WALK_ACC + 2 * SWA + 1] = NO_HOLE


@helper
def validate(nodes, meta, s, host_on):
    """``create_match_validator`` (``swa_gates_prefix_match``): bit 1 when ``W``
    contiguous units of SWA data on the device lead to ``s`` (from the root: at
    once; a tombstone resets the window and is rejected), bit 2 the same with
    SWA data on either tier counted (the host tier's validator; without one,
    bit 1's answer)."""
    acc = meta[M_WALK_ACC + 2 * SWA]
    if not has_data(nodes, s):
        ok = False
        acc = 0
    else:
        if acc < NO_HOLE:
            acc += nodes[s, KEY_LEN]
        ok = acc >= meta[M_SWA_WINDOW]
    meta[M_WALK_ACC + 2 * SWA] = acc
    bits = 1 if ok else 0
    if host_on:
        hacc = meta[M_WALK_ACC + 2 * SWA + 1]
        hok, hacc = validate_host(nodes, meta, s, hacc)
        meta[M_WALK_ACC + 2 * SWA + 1] = hacc
        if hok:
            bits |= 2
    elif ok:
        bits |= 2
    return bits


@helper
def match_end(nodes, meta, s):
    refresh_lru(nodes, meta, s)  # SGLang anchors it on best_match_node


@helper
def insert_end(nodes, meta, s):
    refresh_lru(nodes, meta, s)


@helper
def split(nodes, pool, meta, u, child):
    redistribute_on_node_split(nodes, u, child)


@helper
def drop_device(nodes, pool, meta, s, at, out, acts):
    """A deleted or demoted node's SWA data: the SWA peers of its Full indices
    (``out[at:at + len]``) are freed (``A_FREE_SLOT(SWA)``: the cascade)."""
    if has_data(nodes, s):
        emit(acts, meta, A_FREE_SLOT, SWA, SRC_OUT, at, nodes[s, KEY_LEN], 0)
        release_deleted(nodes, meta, s)


@helper
def drop_host(nodes, pool, meta, s, out, acts):
    if has_host(nodes, s):
        evict_host_component(nodes, pool, meta, s, out, acts)


@helper
def to_host_only(nodes, meta, s):
    host_lru_join(nodes, s)


@helper
def needs_backup(nodes, meta, s, out):
    """SWA data within ``s``'s window with no host copy (host tier on)."""
    return meta[M_HOST] != 0 and collect_unbacked(nodes, meta, s, out[:0], 0)[0] > 0


@helper
def lock(nodes, heap, meta, s, skip):
    return acquire_component_lock(nodes, meta, s)


@helper
def check_unlock(nodes, meta, s, skip, stamp):
    st, x, _ = check_release(nodes, s, stamp)
    return st, x


@helper
def unlock(nodes, heap, meta, s, skip, stamp):
    release_component_lock(nodes, heap, meta, s, stamp)


@helper
def shift_locks(nodes, meta, s, skip, stamp, d):
    shift_counts(nodes, s, stamp, d)


@helper
def host_lock(nodes, heap, meta, s):
    return acquire_host_lock(nodes, meta, s)


@helper
def check_host_unlock(nodes, meta, s, stamp):
    st, x = check_host_release(nodes, s, stamp)
    return st, (x if st != OK else -1)


@helper
def host_unlock(nodes, heap, meta, s, stamp):
    release_host_lock(nodes, heap, meta, s, stamp)


@helper
def held(nodes, meta, s):
    """SWA units the node holds on the device."""
    return nodes[s, KEY_LEN] if has_data(nodes, s) else 0


@helper
def priority(meta):
    return PRIORITY_INTERNAL


@helper
def evict_internal(nodes, pool, meta, x, out, acts):
    """Tombstone ``x``'s SWA data (an SWA walk's victim that is not an evictable
    device leaf; a host copy stays, in the SWA host LRU). Returns the units."""
    return evict_component(nodes, pool, meta, x, out, acts)


@helper
def internal_backup(nodes, meta, x, out):
    """Write-back, an SWA round's internal victim ``x`` with no Full host copy:
    SGLang's SWA ``InternalStateBackup`` when its SWA data has no host copy and
    SWA data within its window has none: the units of that data (the host room
    the caller reserves); -1 when no backup is needed first."""
    if has_host(nodes, x) or not (nodes[x, FLAGS] & F_HAS_FULL_DEV):
        return -1
    _, units = collect_unbacked(nodes, meta, x, out[:0], 0)
    return units if units else -1


@helper
def check_early_release(nodes, meta, s, stamp):
    return check_release(nodes, s, stamp)


@helper
def early_release(nodes, pool, heap, meta, s, stamp, out, acts):
    return release_window_lock(nodes, pool, heap, meta, s, stamp, out, acts)


@helper
def insert_room(meta, n):
    """An insert of ``n`` units: per walked node up to 4 rows more (recovery, 2
    adopted, duplicates), the leaf 2 adopted + 3 stored; recovered Full values
    (``n`` at most); the cursor splits one walked node or the leaf, the cap the
    leaf once (2 slots)."""
    return 2, n, 4 * min(n // meta[M_PAGE] + 1, meta[M_NLIVE]) + 4


# ---------------------------------------------------------------- host-tier entry kernels
# (SWA's own steps of the host protocol; the engine offers them as ``Engine.k.<name>``)


@helper
def window_units(nodes, meta, swa_nodes, tier_bit):
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


@kernel(scratch="out", on_capacity="retry")
def swa_backup_plan(nodes, ctab, pool, heap, meta, slot, out):
    """The SWA part of the backup of the live node in ``slot`` (SGLang's SWA
    ``build_hicache_transfers(BACKUP_HOST)``, read just before its commit): the
    nodes within its window whose SWA data has no host copy
    (``collect_unbacked``), none past a node with a backup in flight. Their
    Full device indices, root-first, go to ``out[:units]`` (the façade translates
    them to SWA slots for the copy), their slots, root-first, to
    ``out[units:units + nodes]`` (``backup_commit``'s ``swa_nodes``: SGLang
    commits the nodes it planned). Returns ``(status, units, nodes)``;
    ``(OK, 0, 0)`` on a cache without SWA on the host tier or a dead slot."""
    if slot <= ROOT or slot >= meta[M_HWM] or not (nodes[slot, FLAGS] & F_ALIVE):
        return OK, 0, 0
    if not (meta[M_COMPONENTS] & C_SWA) or meta[M_HOST] == 0:
        return OK, 0, 0
    k, units = collect_unbacked(nodes, meta, slot, out[:0], 0)
    if k == 0:
        return OK, 0, 0
    if out.shape[0] < units + k:
        need(meta, 0, 0, units + k, 0)
        return E_CAPACITY, 0, 0
    collect_unbacked(nodes, meta, slot, out, units)
    out_reverse(out, units, units + k)  # root-first
    out_node_values(nodes, pool, out, units, k, FULL_DEV)
    return OK, units, k


@kernel(scratch="out", on_capacity="retry")
def swa_load_plan(nodes, ctab, pool, heap, meta, nid, out):
    """The SWA part of a load-back to node ``nid`` (``collect_host_only``): their SWA
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
    k, units = collect_host_only(nodes, meta, s, out[:0], 0)
    if k == 0:
        return OK, 0, 0
    if out.shape[0] < units + k:
        need(meta, 0, 0, units + k, 0)
        return E_CAPACITY, 0, 0
    collect_host_only(nodes, meta, s, out, units)
    out_reverse(out, units, units + k)  # root-first
    if meta[M_HOST] == HOST_WRITE_BACK:
        for i in range(k):
            if nodes[out[units + i], LOAD_PENDING] not in (0, nid):
                return E_HOST_STATE, 0, 0
    out_node_values(nodes, pool, out, units, k, host_col(pool))
    return OK, units, k


@kernel
def swa_host_hit(nodes, ctab, pool, heap, meta, nid):
    """SGLang's ``swa_host_hit_length`` of a match whose best node is ``nid``
    (``host_hit_length``); 0 for a dead id."""
    s = resolve(nodes, meta, nid)
    if s < 0:
        return 0
    return host_hit_length(nodes, meta, s)


@helper
def held_host(nodes, meta, s):
    """SWA units the node holds on the host."""
    return nodes[s, KEY_LEN] if has_host(nodes, s) else 0


@helper
def drop_host_of(nodes, pool, meta, s, out, acts):
    return evict_host_component(nodes, pool, meta, s, out, acts)


# ---------------------------------------------------------------- sanity_check rules
# ``tally[ID]``: SWA nodes, evictable units, protected units, host units, host-listed
@helper
def check_node(nodes, meta, s, n, full_lock, tally):
    """Codes 116-118 / 125 of ``core/check.py`` at node ``s``."""
    on = (meta[M_COMPONENTS] & C_SWA) != 0
    f = nodes[s, FLAGS]
    sh = (f & F_HAS_SWA_HOST) != 0
    if sh:
        # a Full host copy under it, except under write-back, whose duplicate
        # reclaim may free the Full host copy of a device node and keep its SWA's
        if not (on and meta[M_HOST] != 0) or not (
                f & F_HAS_FULL_HOST or (meta[M_HOST] == HOST_WRITE_BACK and f & F_HAS_FULL_DEV)):
            return 125, s
        tally[ID, 3] += n
    slk = nodes[s, SWA_HOST_LOCK]
    if slk < 0 or (slk > 0 and not on):
        return 125, s
    listed = lru_in_list(nodes, LRU_SWA_HOST, s)
    h_only = sh and not (f & F_HAS_SWA_DEV)
    if (listed and not h_only) or (h_only and slk == 0 and not listed):
        return 125, s
    if listed:
        tally[ID, 4] += 1
    k, has, locked = lru_check_member(nodes, s, on, LRU_SWA, F_HAS_SWA_DEV, SWA_LOCK, full_lock)
    if k != 0:
        return 115 + k, s
    if has:
        tally[ID, 0] += 1
        if locked:
            tally[ID, 2] += n
        else:
            tally[ID, 1] += n
    return OK, -1


@helper
def check_end(nodes, meta, hwm, tally):
    """Codes 117 / 118 / 125 of ``core/check.py``: the SWA lists and ledgers."""
    x = lru_check_list(nodes, meta, hwm, LRU_SWA, SWA, F_HAS_SWA_DEV, tally[ID, 0],
                       tally[ID, 1], tally[ID, 2])
    if x != -2:
        return (117, x) if x != -3 else (118, -1)
    if tally[ID, 3] != meta[M_SWA_HOST_TOTAL]:
        return 125, -1
    x = lru_check_host_list(nodes, hwm, LRU_SWA_HOST, tally[ID, 4])
    if x != -2:
        return 125, x
    return OK, -1
