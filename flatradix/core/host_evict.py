"""Host-tier eviction and the write-back steps (SGLang 0.5.23 spec §8.5): ``evict_host``
(Full host leaves, under write-back the duplicates' host copies first),
``evict_host_aux`` (an auxiliary component's host data, through the dispatch
module), and the steps of a write-back eviction round: ``demote_leaf``,
``drop_subtree`` (no host room), ``finish_swa_eviction`` (an SWA round's internal
victim once backed up; Mamba's is ``components/mamba.py: finish_state_eviction``).
See ``core/host.py`` for the tier's states.
"""

from ..components import dispatch
from ..kernels._jit import helper, kernel
from ..kernels.actions import (
    A_FREE_HOST, A_REMOVED, MEDIUM_CPU, SRC_OUT, SRC_POOL, acts_begin, acts_room, emit,
    out_put_col,
)
from ..kernels.layout import (
    DUP_NEXT, E_CAPACITY, E_HOST_STATE, HOST, SWA_LOCK, E_STALE, FIRST_CHILD, FLAGS, FULL,
    M_COMPONENTS, FULL_HOST_LOCK, F_HAS_FULL_DEV, F_HAS_FULL_HOST, HEAP_HOST, HEAP_POS,
    HOST_HEAP_POS, HOST_WRITE_BACK, KEY_LEN, KEY_OFF, LOAD_PENDING, LOCK_REF, M_DUP_HEAD,
    M_EVENTS, M_EVICT_CURSOR, M_EVICT_DONE, M_EVICT_WALK, M_HEAP_N, M_HOST, M_HOST_TOTAL, SWA,
    M_NACTS, M_NOUT, NCHILD, NEXT_SIB, NIL, N_COMPONENTS, N_TIERS, OK, PARENT, PREV_SIB, ROOT,
    WT_PENDING,
)
from ..kernels.dups import dup_remove
from ..kernels.lru import lru_list, lru_prev_unlocked, lru_tail_unlocked
from ..kernels.order import refresh_leaf
from ..kernels.state import need, resolve
from .tree import delete_host_leaf, delete_leaf, demote


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
    lst = lru_list(c, HOST)
    comps = meta[M_COMPONENTS]
    top = dispatch.priority(c, meta)
    freed = 0
    units = 0
    x = lru_tail_unlocked(nodes, lst)
    while freed < num and x != NIL:
        n = nodes[x, KEY_LEN]
        if not acts_room(acts, out, meta, 4, 2 * n + 1):
            need(meta, 0, 0, meta[M_NOUT] + 2 * n + 1, meta[M_NACTS] + 4)
            return E_CAPACITY, freed, units
        nxt = lru_prev_unlocked(nodes, lst, x)
        freed += dispatch.held_host(c, nodes, meta, x)
        if nodes[x, HOST_HEAP_POS] >= 0:  # an evictable host leaf: atomic
            units += delete_host_leaf(nodes, ctab, pool, heap, meta, x, out, acts)
        else:
            dispatch.drop_host_of(c, nodes, pool, meta, x, out, acts)
            for d in range(1, N_COMPONENTS):  # the cascade to lower-priority components
                if d != c and comps & (1 << d) and dispatch.priority(d, meta) < top \
                        and dispatch.held_host(d, nodes, meta, x) > 0:
                    dispatch.drop_host_of(d, nodes, pool, meta, x, out, acts)
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
    if s < 0 or dispatch.held(SWA, nodes, meta, s) == 0 or nodes[s, SWA_LOCK] > 0:
        return OK, 0, 0
    if nodes[s, HEAP_POS] >= 0:
        meta[M_EVICT_CURSOR + SWA] = nid
        return OK, 0, 0
    n = nodes[s, KEY_LEN]
    if not acts_room(acts, out, meta, 2, n + 1):
        need(meta, 0, 0, n + 1, 2)
        return E_CAPACITY, 0, 0
    dispatch.evict_internal(SWA, nodes, pool, meta, s, out, acts)
    m = 0
    comps = meta[M_COMPONENTS]
    top = dispatch.priority(SWA, meta)
    for d in range(1, N_COMPONENTS):  # the cascade (host copies stay, in the host LRUs)
        if d != SWA and comps & (1 << d) and dispatch.priority(d, meta) < top \
                and dispatch.held(d, nodes, meta, s) > 0:
            m += dispatch.evict_internal(d, nodes, pool, meta, s, out, acts)
    if meta[M_EVICT_WALK + SWA]:
        meta[M_EVICT_DONE + SWA] += n
    return OK, n, m


@helper
def _count_round(nodes, meta, s, n):
    """Device leaf ``s`` (``n`` Full units) is about to be demoted or deleted by a
    write-back step: what it frees counts toward each component's open round."""
    if meta[M_EVICT_WALK + FULL]:
        meta[M_EVICT_DONE + FULL] += n
    comps = meta[M_COMPONENTS]
    for c in range(1, N_COMPONENTS):
        if comps & (1 << c) and meta[M_EVICT_WALK + c]:
            meta[M_EVICT_DONE + c] += dispatch.held(c, nodes, meta, s)


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
    _count_round(nodes, meta, s, n)
    demote(nodes, pool, heap, meta, s, out, acts)
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
    _count_round(nodes, meta, s, n)
    freed = delete_leaf(nodes, ctab, pool, heap, meta, s, out, acts)
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
