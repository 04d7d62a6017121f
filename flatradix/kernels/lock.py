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

from ..components import full, mamba, swa
from ._jit import kernel
from .actions import acts_begin
from .layout import C_FULL, C_MAMBA, C_SWA, E_CAPACITY, FULL, MAMBA, SWA, E_STALE, M_COMPONENTS, OK, ROOT
from .order import refresh_leaf
from .state import need, resolve


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
    if meta[M_COMPONENTS] & C_SWA and not skip & C_SWA:
        boundary = swa.acquire_component_lock(nodes, meta, s)
    if meta[M_COMPONENTS] & C_MAMBA and not skip & C_MAMBA:
        mamba.acquire_component_lock(nodes, meta, s)
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
    with_swa = meta[M_COMPONENTS] & C_SWA and not skip & C_SWA
    with_mamba = meta[M_COMPONENTS] & C_MAMBA and not skip & C_MAMBA
    if with_mamba:
        st, bad = mamba.check_release(nodes, s)
        if st != OK:
            return st, bad
    if with_swa:
        st, bad, _ = swa.check_release(nodes, s, boundary)
        if st != OK:
            return st, bad
    if with_mamba:
        mamba.release_component_lock(nodes, meta, s)
    if with_swa:
        swa.release_component_lock(nodes, heap, meta, s, boundary)
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
    st, data, count = swa.check_release(nodes, s, boundary)
    if st != OK:
        return st, data
    with_mamba = meta[M_COMPONENTS] & C_MAMBA and not skip & C_MAMBA
    if with_mamba:
        st, bad = mamba.check_release(nodes, s)
        if st != OK:
            return st, bad
    if out.shape[0] < data or acts.shape[0] < count:
        need(meta, 0, 0, data, count)
        return E_CAPACITY, 0
    freed = swa.release_window_lock(nodes, pool, heap, meta, s, boundary, out, acts)
    if with_mamba:
        mamba.release_component_lock(nodes, meta, s)
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
    if meta[M_COMPONENTS] & C_SWA and not skip & C_SWA:
        st, bad, _ = swa.check_release(nodes, s, boundary)
        if st != OK:
            return st, bad
    if meta[M_COMPONENTS] & C_MAMBA and not skip & C_MAMBA:
        st, bad = mamba.check_release(nodes, s)
        if st != OK:
            return st, bad
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
    with_swa = meta[M_COMPONENTS] & C_SWA and not skip & C_SWA
    with_mamba = meta[M_COMPONENTS] & C_MAMBA and not skip & C_MAMBA
    for i in range(k):
        s = resolve(nodes, meta, nids[i])
        out[i, 0] = full.acquire_component_lock(nodes, heap, meta, s)
        out[i, 1] = swa.acquire_component_lock(nodes, meta, s) if with_swa else 0
        if with_mamba:
            mamba.acquire_component_lock(nodes, meta, s)
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
    swa_on = meta[M_COMPONENTS] & C_SWA
    mamba_on = meta[M_COMPONENTS] & C_MAMBA
    st = OK
    bad = -1
    fail = k
    for i in range(k):
        s = resolve(nodes, meta, nids[i])
        with_swa = swa_on and not skips[i] & C_SWA
        with_mamba = mamba_on and not skips[i] & C_MAMBA
        with_full = not skips[i] & C_FULL
        comp = FULL
        st, bad = full.check_release(nodes, s) if with_full else (OK, -1)
        if st == OK and with_swa:
            comp = SWA
            st, bad, _ = swa.check_release(nodes, s, boundaries[i])
        if st == OK and with_mamba:
            comp = MAMBA
            st, bad = mamba.check_release(nodes, s)
        if st != OK:
            fail = i
            break
        if with_full:
            full.shift_counts(nodes, s, -1)
        if with_swa:
            swa.shift_counts(nodes, s, boundaries[i], -1)
        if with_mamba:
            mamba.shift_counts(nodes, s, -1)
    for j in range(fail - 1, -1, -1):  # move the counts back, exactly
        sj = resolve(nodes, meta, nids[j])
        if mamba_on and not skips[j] & C_MAMBA:
            mamba.shift_counts(nodes, sj, 1)
        if swa_on and not skips[j] & C_SWA:
            swa.shift_counts(nodes, sj, boundaries[j], 1)
        if not skips[j] & C_FULL:
            full.shift_counts(nodes, sj, 1)
    if fail < k:
        return st, fail, bad, comp
    for i in range(k):
        s = resolve(nodes, meta, nids[i])
        if mamba_on and not skips[i] & C_MAMBA:
            mamba.release_component_lock(nodes, meta, s)
        if swa_on and not skips[i] & C_SWA:
            swa.release_component_lock(nodes, heap, meta, s, boundaries[i])
        if not skips[i] & C_FULL:
            full.release_component_lock(nodes, heap, meta, s)
        else:
            refresh_leaf(nodes, heap, meta, s)
    return OK, -1, -1, FULL
