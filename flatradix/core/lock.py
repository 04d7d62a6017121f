"""Lock entry kernels: ``inc_lock_ref`` / ``dec_lock_ref`` / ``release_window`` (SGLang §5.7).

Each configured component acquires its own lock extent, in component order,
and releases it in reverse (the rules are in ``flatradix.components``): Full
locks the whole path (``components/full.py``), SWA the window segment up to
its boundary stamp (``components/swa.py``), Mamba the node itself
(``components/mamba.py``). A release is checked for every
component before anything changes, so an unlock without lock, a double unlock,
a release on an ancestor or a window released twice is refused with the tree
untouched.
"""

from ..components import dispatch, full
from ..kernels._jit import kernel
from ..kernels.actions import acts_begin
from ..kernels.layout import (
    C_FULL, E_CAPACITY, E_STALE, FULL, M_COMPONENTS, N_COMPONENTS, OK, ROOT, SWA,
)
from ..kernels.order import refresh_leaf
from ..kernels.state import need, resolve


@kernel
def inc_lock_ref(nodes, heap, meta, nid, skip):
    """Lock node ``nid`` for every configured component not in ``skip`` (a ``C_*``
    bit set; FULL is never skipped). Returns ``(status, delta, boundary)``:
    ``delta`` the Full units moved evictable -> protected, ``boundary`` the SWA
    window's boundary stamp (0: the segment reached the root, or SWA not locked)."""
    s = resolve(nodes, meta, nid)
    if s < 0:
        return E_STALE, 0, 0
    delta = full.acquire_component_lock(nodes, heap, meta, s)
    boundary = 0
    if meta[M_COMPONENTS] & ~C_FULL:
        boundary = dispatch.lock(nodes, heap, meta, s, skip)
    return OK, delta, boundary


@kernel
def dec_lock_ref(nodes, heap, meta, nid, skip, boundary):
    """Release a lock taken by ``inc_lock_ref(nid, skip)``; ``boundary`` is its SWA
    stamp. ``skip`` here also holds SWA when the window was released early, and
    may hold FULL: SGLang releases the Mamba part of a lock alone that way (a
    receipt whose skipped components are all but MAMBA).
    Returns ``(status, x)``.

    ``(E_LOCK_UNDERFLOW, slot)`` when node ``slot`` of a released extent has
    lock_ref 0, ``(E_NOT_ANCHORED, slot)`` when no Full lock is anchored at
    ``nid`` itself (its lock_ref is held by locks on descendants); nothing is
    changed then. Else ``(OK, delta)``: Full units moved protected -> evictable.
    """
    s = resolve(nodes, meta, nid)
    if s < 0:
        return E_STALE, 0
    with_full = not skip & C_FULL
    if with_full:
        st, bad = full.check_release(nodes, s)
        if st != OK:
            return st, bad
    aux = meta[M_COMPONENTS] & ~C_FULL
    if aux:  # checked last component first, then released in that order
        st, bad = dispatch.check_unlock(nodes, meta, s, skip, boundary)
        if st != OK:
            return st, bad
        dispatch.unlock(nodes, heap, meta, s, skip, boundary)
    delta = 0
    if with_full:
        delta = full.release_component_lock(nodes, heap, meta, s)
    else:
        refresh_leaf(nodes, heap, meta, s)  # a Mamba-only release may free the leaf
    return OK, delta


@kernel(scratch=("out", "acts"), on_capacity="retry")
def release_window(nodes, ctab, pool, heap, meta, nid, boundary, skip, out, acts):
    """Early release of the SWA window segment of a lock on ``nid`` (SGLang
    ``dec_swa_lock_only``); the Full lock stays. A segment node whose SWA lock
    drops to 0 while it is an unlocked device leaf loses its SWA data
    (``A_FREE_SLOT(SWA)``). Then the node's Mamba lock (a component of lower
    internal priority than SWA) is released too, unless ``skip`` (the lock's
    skipped components) holds MAMBA. Returns ``(status, x)``: ``(OK, units
    freed)``, ``(E_LOCK_UNDERFLOW, slot)`` with nothing changed, or ``E_CAPACITY``."""
    s = resolve(nodes, meta, nid)
    if s < 0:
        return E_STALE, 0
    acts_begin(meta, 0)
    if s == ROOT:
        return OK, 0
    st, data, count = dispatch.check_early_release(SWA, nodes, meta, s, boundary)
    if st != OK:
        return st, data
    # the cascade: the locks of the components of a lower internal priority
    top = dispatch.priority(SWA, meta)
    comps = meta[M_COMPONENTS]
    for c in range(1, N_COMPONENTS):
        if c != SWA and comps & (1 << c) and not skip & (1 << c) \
                and dispatch.priority(c, meta) < top:
            st, bad = dispatch.check_unlock_of(c, nodes, meta, s, skip, 0)
            if st != OK:
                return st, bad
    if out.shape[0] < data or acts.shape[0] < count:
        need(meta, 0, 0, data, count)
        return E_CAPACITY, 0
    freed = dispatch.early_release(SWA, nodes, pool, heap, meta, s, boundary, out, acts)
    cascaded = False
    for c in range(1, N_COMPONENTS):
        if c != SWA and comps & (1 << c) and not skip & (1 << c) \
                and dispatch.priority(c, meta) < top:
            dispatch.unlock_of(c, nodes, heap, meta, s, skip, 0)
            cascaded = True
    if cascaded:
        refresh_leaf(nodes, heap, meta, s)
    return OK, freed


@kernel
def check_dec(nodes, meta, nid, skip, boundary):
    """Whether ``dec_lock_ref(nid, skip, boundary)`` would succeed, changing nothing:
    ``(status, slot)`` as ``dec_lock_ref`` reports it (``(OK, -1)`` when it would)."""
    s = resolve(nodes, meta, nid)
    if s < 0:
        return E_STALE, -1
    if not skip & C_FULL:
        st, bad = full.check_release(nodes, s)
        if st != OK:
            return st, bad
    if meta[M_COMPONENTS] & ~C_FULL:
        return dispatch.check_unlock_forward(nodes, meta, s, skip, boundary)
    return OK, -1


@kernel
def inc_lock_ref_batch(nodes, heap, meta, nids, skip, out):
    """``inc_lock_ref`` of every node of ``nids`` in order (one ``skip`` for all);
    ``out[i] = (delta, boundary)``. Every id is checked first: ``(E_STALE, i)`` for
    the first stale one, nothing locked; else ``(OK, -1)``."""
    k = nids.shape[0]
    for i in range(k):
        if resolve(nodes, meta, nids[i]) < 0:
            return E_STALE, i
    aux = meta[M_COMPONENTS] & ~C_FULL
    for i in range(k):
        s = resolve(nodes, meta, nids[i])
        out[i, 0] = full.acquire_component_lock(nodes, heap, meta, s)
        out[i, 1] = dispatch.lock(nodes, heap, meta, s, skip) if aux else 0
    return OK, -1


@kernel
def dec_lock_ref_batch(nodes, heap, meta, nids, skips, boundaries):
    """``dec_lock_ref`` of every node of ``nids`` in order (``skips[i]`` /
    ``boundaries[i]`` as the single call's). All or nothing: a dry run first
    checks each release against the counts the earlier ones leave (moving lock
    counts only, then moving them back: the state is exactly as before), so
    ``(status, i, slot, component)`` names the first release that would fail (stale id,
    underflow, not anchored -- also when an earlier release of the batch took
    what it needed) with nothing changed, and the component whose check failed;
    else the releases run and ``(OK, -1, -1, FULL)``."""
    k = nids.shape[0]
    for i in range(k):
        if resolve(nodes, meta, nids[i]) < 0:
            return E_STALE, i, -1, FULL
    comps = meta[M_COMPONENTS]
    aux = comps & ~C_FULL
    st = OK
    bad = -1
    fail = k
    comp = FULL
    for i in range(k):
        s = resolve(nodes, meta, nids[i])
        with_full = not skips[i] & C_FULL
        comp = FULL
        st, bad = full.check_release(nodes, s) if with_full else (OK, -1)
        for c in range(1, N_COMPONENTS):  # each component's check, in order
            if st != OK:
                break
            if comps & (1 << c) and not skips[i] & (1 << c):
                comp = c
                st, bad = dispatch.check_unlock_of(c, nodes, meta, s, skips[i], boundaries[i])
        if st != OK:
            fail = i
            break
        if with_full:
            full.shift_counts(nodes, s, -1)
        if aux:
            dispatch.shift_locks(nodes, meta, s, skips[i], boundaries[i], -1)
    for j in range(fail - 1, -1, -1):  # move the counts back, exactly
        sj = resolve(nodes, meta, nids[j])
        if aux:
            dispatch.shift_locks_back(nodes, meta, sj, skips[j], boundaries[j], 1)
        if not skips[j] & C_FULL:
            full.shift_counts(nodes, sj, 1)
    if fail < k:
        return st, fail, bad, comp
    for i in range(k):
        s = resolve(nodes, meta, nids[i])
        if aux:
            dispatch.unlock(nodes, heap, meta, s, skips[i], boundaries[i])
        if not skips[i] & C_FULL:
            full.release_component_lock(nodes, heap, meta, s)
        else:
            refresh_leaf(nodes, heap, meta, s)
    return OK, -1, -1, FULL
