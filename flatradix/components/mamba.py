"""The Mamba / SSM component (SGLang ``MambaComponent``, spec §6.3).

Value: one recurrent-state slot per node that owns a checkpoint, in column
``MAMBA_SLOT`` (``F_HAS(MAMBA)`` set while present), only at the exact depth it
was produced: a state cannot be divided, so a split's upper part holds none.
A node with Full data but no state is a Mamba *tombstone*. Every node with a
state is in the Mamba device LRU (``kernels/lru.py``, list ``LRU_MAMBA``); the
Mamba ledgers count states (1 per node).

Rules (hook names as SGLang's):

* ``validate`` (``create_match_validator``, device only): a state is present.
  So a match's usable prefix ends at the deepest walked node owning a state.
* ``refresh_lru``: at match end only the best node itself moves to the MRU end
  (its ancestors keep their places); the insert walk and insert end touch
  nothing -- a new state enters the LRU when it is committed.
* ``redistribute_on_node_split``: the upper part gets nothing (no state, lock
  count 0); the state stays on the lower part, which keeps its LRU place.
* ``commit_insert_component_data``: a new leaf takes the donated slot; a node
  the key ended on without a state takes it too (fresh access tick); one that
  already has a state moves to the MRU end (fresh tick) and the caller keeps
  its slot (``mamba_exist``).
* ``acquire_component_lock`` / ``release_component_lock``: the node itself
  only (never the root); its state moves evictable <-> protected on 0 <-> 1.
* eviction (``evict_component`` / the walk): from the LRU tail, skipping
  Mamba-locked entries; an evictable device leaf is deleted whole, any other
  node loses its state only (no cascade: Mamba's internal priority is the
  lowest).
* ``eviction_priority``: 0 everywhere.
* ``evict_excess_path_states`` (``mamba_max_states_per_path``, ``meta[M_MAMBA_PATH_CAP]``;
  -1 off): after a commit attached a state, the root->target path keeps at most
  the cap's states: the shallowest ones beyond it lose their state (Full KV
  stays), skipping the target, Mamba-locked nodes and nodes without exactly one
  child -- a soft cap, as SGLang's.

Host tier (HiCache, spec §6.3 / §8): a node may also hold a *host* state
(column ``MAMBA_HOST_SLOT``, bit ``F_HAS(MAMBA, HOST)``, counted in
``meta[M_MAMBA_HOST_TOTAL]``), taken by a backup and kept when the device state
goes (a demotion, a tombstone); a host-only state is in the Mamba *host* LRU
(list ``LRU_MAMBA_HOST``), which ``evict_host(n, MAMBA)`` walks from its tail
skipping host-locked entries. Membership follows SGLang's moves exactly: a
host-only state joins at the MRU end when its device state goes or its last
host lock is released (unless it is in the list already), and leaves when a
device state is set again, its first host lock is taken, or its host state is
freed. ``validate_host`` (the device-or-host validator) accepts either state.

Writes ``MAMBA_SLOT``, ``MAMBA_HOST_SLOT``, ``F_HAS(MAMBA)``, ``F_HAS(MAMBA,
HOST)``, ``LOCK_COL(MAMBA)`` on both tiers, the Mamba ledgers and (through
``kernels/lru.py``) the Mamba LRU links of both lists.
"""

from ..kernels._jit import helper, kernel
from ..kernels.actions import (
    A_FREE_HOST, A_FREE_SLOT, A_PATH_CAP, SRC_OUT, SRC_POOL, acts_begin, acts_room, emit,
)
from ..kernels.layout import (
    C_MAMBA, E_CAPACITY, F_HAS_FULL_HOST, HOST_WRITE_BACK, M_COMPONENTS, E_LOCK_UNDERFLOW, F_ALIVE, F_HAS_FULL_DEV, HEAP_POS, LOAD_PENDING,
    M_EVICT_CURSOR, M_EVICT_DONE, M_EVICT_WALK, M_HOST, M_HWM, M_NLIVE, M_PAGE, F_HAS, FLAGS, HOST, LAST_ACCESS, LOCK_REF, LRU_MAMBA, LRU_MAMBA_HOST,
    LRU_NEXT,
    M_EVICTABLE, M_MAMBA_HOST_TOTAL, M_MAMBA_PATH_CAP, M_NOUT, M_PROTECTED, M_TOTAL, MAMBA,
    MAMBA_HOST_SLOT, MAMBA_SLOT, N_TIERS, NCHILD, NIL, OK, PARENT, ROOT,
)
from ..kernels.lru import (
    lru_check_host_list, lru_check_list, lru_check_member, lru_head, lru_in_list,
    lru_move_to_front, lru_push_front, lru_remove,
)
from ..kernels.order import fix, refresh_leaf
from ..kernels.state import need, resolve, tick

#: The component's id (``ComponentType.MAMBA``) and its ``meta[M_COMPONENTS]`` bit.
ID = MAMBA
BIT = C_MAMBA
#: Cascade priority on an internal node (leaf: 0).
PRIORITY_INTERNAL = 0
#: FLAGS bit of a device state; column of the device Mamba lock_ref.
F_HAS_MAMBA_DEV = F_HAS(MAMBA)
MAMBA_LOCK = LOCK_REF + MAMBA * N_TIERS
#: FLAGS bit of a host state; column of the host Mamba lock_ref.
F_HAS_MAMBA_HOST = F_HAS(MAMBA, HOST)
MAMBA_HOST_LOCK = LOCK_REF + MAMBA * N_TIERS + HOST


@helper
def has_data(nodes, s):
    return (nodes[s, FLAGS] & F_HAS_MAMBA_DEV) != 0


@helper
def has_host(nodes, s):
    return (nodes[s, FLAGS] & F_HAS_MAMBA_HOST) != 0


@helper
def validate_host(nodes, s):
    """``create_match_validator`` when host matches count: a state on either tier."""
    return (nodes[s, FLAGS] & (F_HAS_MAMBA_DEV | F_HAS_MAMBA_HOST)) != 0


@helper
def host_only(nodes, s):
    """SGLang ``has_host_value_only``: a host state and no device state."""
    return (nodes[s, FLAGS] & (F_HAS_MAMBA_DEV | F_HAS_MAMBA_HOST)) == F_HAS_MAMBA_HOST


@helper
def unbacked(nodes, s):
    """SGLang ``needs_incremental_backup``: a device state with no host copy."""
    return (nodes[s, FLAGS] & (F_HAS_MAMBA_DEV | F_HAS_MAMBA_HOST)) == F_HAS_MAMBA_DEV


@helper
def host_lru_join(nodes, s):
    """A host-only state joins the host LRU at its MRU end, unless it is in it."""
    if host_only(nodes, s) and not lru_in_list(nodes, LRU_MAMBA_HOST, s):
        lru_push_front(nodes, LRU_MAMBA_HOST, s)


@helper
def refresh_lru(nodes, s):
    """Match end: the best node alone moves to the MRU end (when it owns a state)."""
    if s != ROOT and has_data(nodes, s):
        lru_move_to_front(nodes, LRU_MAMBA, s)


@helper
def attach(nodes, meta, s, slot):
    """Give node ``s`` the state ``slot``: data bit, MRU in the LRU, one unit on
    the ledger (protected when the node is Mamba-locked); a host-only state
    leaves the host LRU (SGLang ``set_component_device_value``)."""
    if lru_in_list(nodes, LRU_MAMBA_HOST, s):
        lru_remove(nodes, LRU_MAMBA_HOST, s)
    nodes[s, MAMBA_SLOT] = slot
    nodes[s, FLAGS] |= F_HAS_MAMBA_DEV
    lru_push_front(nodes, LRU_MAMBA, s)
    if nodes[s, MAMBA_LOCK] > 0:
        meta[M_PROTECTED + MAMBA] += 1
    else:
        meta[M_EVICTABLE + MAMBA] += 1
    meta[M_TOTAL + MAMBA] += 1


@helper
def commit_insert_component_data(nodes, heap, meta, s, new_leaf, slot):
    """Attach the donated ``slot`` to the insert's target ``s`` (see the module
    docstring). Returns ``mamba_exist``: True when ``s`` already had a state
    (the caller keeps -- and frees -- its slot)."""
    if new_leaf:
        attach(nodes, meta, s, slot)
        return False
    if not has_data(nodes, s):
        attach(nodes, meta, s, slot)
        nodes[s, LAST_ACCESS] = tick(meta)
        fix(nodes, heap, meta, s)
        return False
    lru_move_to_front(nodes, LRU_MAMBA, s)
    nodes[s, LAST_ACCESS] = tick(meta)
    fix(nodes, heap, meta, s)
    return True


@helper
def _path_cap_eligible(nodes, s, tail):
    """A state the per-path cap may drop: not the tail's, unlocked, on a node with
    exactly one child (so never a leaf)."""
    return (s != tail and has_data(nodes, s) and nodes[s, MAMBA_LOCK] == 0
            and nodes[s, NCHILD] == 1)


@helper
def evict_excess_path_states(nodes, meta, tail, out, acts):
    """SGLang ``MambaEvictExcessPathStates`` (spec §6.3, per-path cap): with
    ``c = meta[M_MAMBA_PATH_CAP] >= 0`` and ``h`` states on the root->``tail``
    path, drop the states of the ``h - c`` shallowest eligible nodes
    (``_path_cap_eligible``; fewer when not enough are eligible), each as
    ``evict_component`` does (Full KV kept, no cascade). Frees are emitted
    shallowest first. Two bottom-up passes, no allocation: the first counts,
    the second keeps the deepest ``m - (h - c)`` of the ``m`` eligible states
    and drops the rest; the freed slots, written deepest first, are then
    reversed in ``out``. Returns the states dropped. The caller checked room
    for one row and one ``out`` value per node on the path."""
    cap = meta[M_MAMBA_PATH_CAP]
    if cap < 0:
        return 0
    held = 0
    eligible = 0
    s = tail
    while s != ROOT:
        if has_data(nodes, s):
            held += 1
            if _path_cap_eligible(nodes, s, tail):
                eligible += 1
        s = nodes[s, PARENT]
    excess = held - cap
    if excess <= 0 or eligible == 0:
        return 0
    keep = max(eligible - excess, 0)
    lo = meta[M_NOUT]
    dropped = 0
    joined = 0
    s = tail
    while s != ROOT:
        p = nodes[s, PARENT]
        if _path_cap_eligible(nodes, s, tail):
            if keep > 0:
                keep -= 1
            else:
                joined += 1 if has_host(nodes, s) else 0
                evict_component(nodes, meta, s, out, acts)
                dropped += 1
        s = p
    if joined > 1:
        # host copies joined the host LRU deepest first; SGLang drops (and joins)
        # shallowest first: reverse the block they form at the host LRU's MRU end
        x = nodes[lru_head(LRU_MAMBA_HOST), LRU_NEXT + LRU_MAMBA_HOST]
        for _ in range(joined):
            nxt = nodes[x, LRU_NEXT + LRU_MAMBA_HOST]
            lru_move_to_front(nodes, LRU_MAMBA_HOST, x)
            x = nxt
    hi = meta[M_NOUT] - 1
    while lo < hi:  # the emitted row(s) are one run of out: shallowest first
        t = out[lo]
        out[lo] = out[hi]
        out[hi] = t
        lo += 1
        hi -= 1
    return dropped


@helper
def put_slot(nodes, meta, s, out):
    """Copy ``s``'s state slot to ``out``; returns its offset there (room checked)."""
    at = meta[M_NOUT]
    out[at] = nodes[s, MAMBA_SLOT]
    meta[M_NOUT] = at + 1
    return at


@helper
def drop(nodes, meta, s):
    """Forget ``s``'s state (ledger, LRU, column) -- the caller emitted its free."""
    if nodes[s, MAMBA_LOCK] > 0:
        meta[M_PROTECTED + MAMBA] -= 1
    else:
        meta[M_EVICTABLE + MAMBA] -= 1
    meta[M_TOTAL + MAMBA] -= 1
    nodes[s, FLAGS] &= ~F_HAS_MAMBA_DEV
    nodes[s, MAMBA_SLOT] = NIL
    lru_remove(nodes, LRU_MAMBA, s)
    host_lru_join(nodes, s)  # a host copy stays: host-only now


@helper
def attach_host(nodes, meta, s, hslot):
    """A backup's commit: ``s`` takes the host state ``hslot`` beside its device
    state (SGLang ``commit_hicache_transfer``, BACKUP_HOST)."""
    nodes[s, MAMBA_HOST_SLOT] = hslot
    nodes[s, FLAGS] |= F_HAS_MAMBA_HOST
    meta[M_MAMBA_HOST_TOTAL] += 1
    host_lru_join(nodes, s)


@helper
def forget_host(nodes, meta, s):
    """Forget ``s``'s host state (column, bit, count, host LRU) -- the caller
    emitted its free."""
    nodes[s, FLAGS] &= ~F_HAS_MAMBA_HOST
    nodes[s, MAMBA_HOST_SLOT] = NIL
    meta[M_MAMBA_HOST_TOTAL] -= 1
    if lru_in_list(nodes, LRU_MAMBA_HOST, s):
        lru_remove(nodes, LRU_MAMBA_HOST, s)


@helper
def evict_host_component(nodes, meta, s, out, acts):
    """Free ``s``'s host state: ``A_FREE_HOST(MAMBA)`` with its host slot. Returns
    1. The caller checked room for 1 row and 1 value."""
    at = meta[M_NOUT]
    out[at] = nodes[s, MAMBA_HOST_SLOT]
    meta[M_NOUT] = at + 1
    emit(acts, meta, A_FREE_HOST, MAMBA, SRC_OUT, at, 1, 0)
    forget_host(nodes, meta, s)
    return 1


@helper
def acquire_host_lock(nodes, s):
    """SGLang's Mamba ``acquire_component_lock(lock_host=True)``: the node itself
    (never the root), with or without a host state; the first lock takes a
    host-only state out of the host LRU."""
    if s == ROOT:
        return
    if nodes[s, MAMBA_HOST_LOCK] == 0 and lru_in_list(nodes, LRU_MAMBA_HOST, s):
        lru_remove(nodes, LRU_MAMBA_HOST, s)
    nodes[s, MAMBA_HOST_LOCK] += 1


@helper
def check_host_release(nodes, s):
    """``(OK, -1)`` when ``release_host_lock(s)`` would succeed, else
    ``(E_LOCK_UNDERFLOW, s)`` (SGLang: "Mamba release hit host_lock_ref=0")."""
    if s != ROOT and nodes[s, MAMBA_HOST_LOCK] <= 0:
        return E_LOCK_UNDERFLOW, s
    return OK, -1


@helper
def release_host_lock(nodes, s):
    """The reverse of ``acquire_host_lock`` (checked first): the last release puts
    a host-only state back in the host LRU (MRU) unless it is there. The caller
    refreshes the leaf heaps."""
    if s == ROOT:
        return
    nodes[s, MAMBA_HOST_LOCK] -= 1
    if nodes[s, MAMBA_HOST_LOCK] == 0:
        host_lru_join(nodes, s)


@helper
def evict_component(nodes, meta, s, out, acts):
    """Tombstone ``s``'s state: ``A_FREE_SLOT(MAMBA)`` with its slot, ledger, LRU.
    Returns 1 (states freed). The caller checked room for 1 row and 1 value."""
    at = put_slot(nodes, meta, s, out)
    emit(acts, meta, A_FREE_SLOT, MAMBA, SRC_OUT, at, 1, 0)
    drop(nodes, meta, s)
    return 1


@helper
def acquire_component_lock(nodes, meta, s):
    """Lock the node itself (never the root): ``lock_ref += 1``, its state moving
    evictable -> protected on 0 -> 1."""
    if s == ROOT:
        return
    if nodes[s, MAMBA_LOCK] == 0 and has_data(nodes, s):
        meta[M_EVICTABLE + MAMBA] -= 1
        meta[M_PROTECTED + MAMBA] += 1
    nodes[s, MAMBA_LOCK] += 1


@helper
def check_release(nodes, s):
    """Whether ``release_component_lock(s)`` would succeed: ``(OK, -1)`` or
    ``(E_LOCK_UNDERFLOW, s)`` (SGLang: "Mamba release hit lock_ref=0")."""
    if s != ROOT and nodes[s, MAMBA_LOCK] <= 0:
        return E_LOCK_UNDERFLOW, s
    return OK, -1


@helper
def release_component_lock(nodes, meta, s):
    """The reverse of ``acquire_component_lock`` (checked by ``check_release``); the
    caller refreshes the node's leaf membership (the Full release does)."""
    if s == ROOT:
        return
    if nodes[s, MAMBA_LOCK] == 1 and has_data(nodes, s):
        meta[M_PROTECTED + MAMBA] -= 1
        meta[M_EVICTABLE + MAMBA] += 1
    nodes[s, MAMBA_LOCK] -= 1


@helper
def shift_counts(nodes, s, d):
    """Add ``d`` to the node's Mamba lock_ref without ledger changes (a batch
    release's dry run; see ``full.shift_counts``)."""
    if s != ROOT:
        nodes[s, MAMBA_LOCK] += d


# ---------------------------------------------------------------- dispatch rules
# The rules ``components/dispatch.py`` chains (each hook's signature, there).
@helper
def validate(nodes, meta, s, host_on):
    """``create_match_validator``: bit 1 when ``s`` owns a device state (so a
    match's usable prefix ends at the deepest walked node owning one), bit 2 when
    it owns one on either tier (the host tier's validator; without one, bit 1's
    answer)."""
    f = nodes[s, FLAGS]
    bits = 1 if f & F_HAS_MAMBA_DEV else 0
    if host_on:
        if f & (F_HAS_MAMBA_DEV | F_HAS_MAMBA_HOST):
            bits |= 2
    elif bits:
        bits |= 2
    return bits


@helper
def match_end(nodes, meta, s):
    refresh_lru(nodes, s)  # SGLang refreshes best_match_node's state


@helper
def commit_target(nodes, heap, meta, target, new_leaf, slot, out, acts):
    """SGLang's ``commit_insert_component_data`` (see the module docstring): the
    target takes the donated state ``slot`` unless it has one (``mamba_exist``,
    the caller keeps its slot); once a state was attached, the
    per-path cap runs (SGLang's ``MambaEvictExcessPathStates``): with the host
    tier as an ``A_PATH_CAP`` action, so it runs after the walk's backups (they
    may copy a state it drops) and before the leaf's. Returns 2 (``EXISTED``) or
    1 (``COMMITTED``)."""
    if commit_insert_component_data(nodes, heap, meta, target, new_leaf, slot):
        return 2  # dispatch.EXISTED
    if meta[M_MAMBA_PATH_CAP] >= 0:
        if meta[M_HOST] != 0:
            emit(acts, meta, A_PATH_CAP, MAMBA, SRC_POOL, target, 0, 0)
        else:
            evict_excess_path_states(nodes, meta, target, out, acts)
    return 1  # dispatch.COMMITTED


@helper
def drop_device(nodes, pool, meta, s, at, out, acts):
    """A deleted or demoted node's state is freed (``A_FREE_SLOT(MAMBA)``: the
    cascade; a host copy stays, in the host LRU)."""
    if has_data(nodes, s):
        evict_component(nodes, meta, s, out, acts)


@helper
def drop_host(nodes, pool, meta, s, out, acts):
    if has_host(nodes, s):
        evict_host_component(nodes, meta, s, out, acts)


@helper
def to_host_only(nodes, meta, s):
    host_lru_join(nodes, s)


@helper
def needs_backup(nodes, meta, s, out):
    """A device state with no host copy."""
    return unbacked(nodes, s)


@helper
def lock(nodes, heap, meta, s, skip):
    acquire_component_lock(nodes, meta, s)
    return 0


@helper
def check_unlock(nodes, meta, s, skip, stamp):
    return check_release(nodes, s)


@helper
def unlock(nodes, heap, meta, s, skip, stamp):
    release_component_lock(nodes, meta, s)


@helper
def shift_locks(nodes, meta, s, skip, stamp, d):
    shift_counts(nodes, s, d)


@helper
def host_lock(nodes, heap, meta, s):
    acquire_host_lock(nodes, s)
    return 0


@helper
def check_host_unlock(nodes, meta, s, stamp):
    return check_host_release(nodes, s)


@helper
def host_unlock(nodes, heap, meta, s, stamp):
    release_host_lock(nodes, s)
    refresh_leaf(nodes, heap, meta, s)


@helper
def held(nodes, meta, s):
    """States the node holds on the device (0 or 1)."""
    return 1 if has_data(nodes, s) else 0


@helper
def priority(meta):
    return PRIORITY_INTERNAL


@helper
def evict_internal(nodes, pool, meta, x, out, acts):
    """Tombstone ``x``'s state (a Mamba walk's victim that is not an evictable
    device leaf; a host copy stays, in the host LRU). Returns 1."""
    return evict_component(nodes, meta, x, out, acts)


@helper
def internal_backup(nodes, meta, x, out):
    """Write-back, a Mamba round's internal victim ``x`` with no Full host copy:
    SGLang's ``InternalStateBackup`` when its state has no host copy (0 host units
    to reserve); -1 when no backup is needed first."""
    return 0 if needs_backup(nodes, meta, x, out) else -1


@helper
def insert_room(meta, n):
    """An insert of ``n`` units: with the per-path cap, one value and one row per
    node of the target's path (every node holds a page; a split adds one)."""
    if meta[M_MAMBA_PATH_CAP] < 0:
        return 0, 0, 0
    path_nodes = min(n // meta[M_PAGE] + 2, meta[M_NLIVE] + 2)
    return 0, path_nodes, path_nodes


@helper
def held_host(nodes, meta, s):
    """Host states the node holds (0 or 1)."""
    return 1 if has_host(nodes, s) else 0


@helper
def drop_host_of(nodes, pool, meta, s, out, acts):
    return evict_host_component(nodes, meta, s, out, acts)


# ---------------------------------------------------------------- host-tier entry kernels
# (Mamba's own steps; the engine offers them as ``Engine.k.<name>``)
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
    if s < 0 or not has_data(nodes, s) or nodes[s, MAMBA_LOCK] > 0 \
            or nodes[s, LOAD_PENDING] != 0:
        return OK, 0
    if nodes[s, HEAP_POS] >= 0 or not (nodes[s, FLAGS] & F_HAS_FULL_DEV):
        meta[M_EVICT_CURSOR + MAMBA] = nid
        return OK, 0
    if not acts_room(acts, out, meta, 1, 1):
        need(meta, 0, 0, 1, 1)
        return E_CAPACITY, 0
    evict_component(nodes, meta, s, out, acts)
    if meta[M_EVICT_WALK + MAMBA]:
        meta[M_EVICT_DONE + MAMBA] += 1
    return OK, 1


@kernel(scratch=("out", "acts"), on_capacity="retry")
def path_cap(nodes, ctab, pool, heap, meta, slot, out, acts):
    """SGLang's ``MambaEvictExcessPathStates`` for the live node in ``slot``, run
    where an insert's ``A_PATH_CAP`` row stands (with the host tier the cap runs
    after the walk's backups, before the new leaf's): ``evict_excess_path_states``
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
    return OK, evict_excess_path_states(nodes, meta, slot, out, acts)


# ---------------------------------------------------------------- sanity_check rules
# ``tally[ID]``: Mamba nodes, evictable states, protected states, host states, host-listed
@helper
def check_node(nodes, meta, s, n, full_lock, tally):
    """Codes 119-121 / 124 of ``core/check.py`` at node ``s``."""
    on = (meta[M_COMPONENTS] & C_MAMBA) != 0
    f = nodes[s, FLAGS]
    if (f & F_HAS_MAMBA_DEV) != 0 and nodes[s, MAMBA_SLOT] < 0:
        return 119, s
    if (f & F_HAS_MAMBA_DEV) == 0 and nodes[s, MAMBA_SLOT] != NIL:
        return 119, s
    mh = (f & F_HAS_MAMBA_HOST) != 0
    if mh != (nodes[s, MAMBA_HOST_SLOT] != NIL) or (mh and nodes[s, MAMBA_HOST_SLOT] < 0):
        return 124, s
    if mh:
        # a Full host copy under it, except under write-back, whose duplicate
        # reclaim may free the Full host copy of a device node and keep its state's
        if not (on and meta[M_HOST] != 0) or not (
                f & F_HAS_FULL_HOST or (meta[M_HOST] == HOST_WRITE_BACK and f & F_HAS_FULL_DEV)):
            return 124, s
        tally[ID, 3] += 1
    hlk = nodes[s, MAMBA_HOST_LOCK]
    if hlk < 0 or (hlk > 0 and not on):
        return 124, s
    listed = lru_in_list(nodes, LRU_MAMBA_HOST, s)
    h_only = mh and not (f & F_HAS_MAMBA_DEV)
    if (listed and not h_only) or (h_only and hlk == 0 and not listed):
        return 124, s
    if listed:
        tally[ID, 4] += 1
    k, has, locked = lru_check_member(nodes, s, on, LRU_MAMBA, F_HAS_MAMBA_DEV, MAMBA_LOCK,
                                      full_lock)
    if k != 0:
        return 118 + k, s
    if has:
        tally[ID, 0] += 1
        if locked:
            tally[ID, 2] += 1
        else:
            tally[ID, 1] += 1
    return OK, -1


@helper
def check_end(nodes, meta, hwm, tally):
    """Codes 120 / 121 / 124 of ``core/check.py``: the Mamba lists and ledgers."""
    x = lru_check_list(nodes, meta, hwm, LRU_MAMBA, MAMBA, F_HAS_MAMBA_DEV, tally[ID, 0],
                       tally[ID, 1], tally[ID, 2])
    if x != -2:
        return (120, x) if x != -3 else (121, -1)
    if tally[ID, 3] != meta[M_MAMBA_HOST_TOTAL]:
        return 124, -1
    x = lru_check_host_list(nodes, hwm, LRU_MAMBA_HOST, tally[ID, 4])
    if x != -2:
        return 124, x
    return OK, -1
