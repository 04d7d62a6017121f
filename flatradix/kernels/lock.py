"""Lock entry kernels: ``inc_lock_ref`` / ``dec_lock_ref`` (SGLang §5.7).

Each configured component acquires its own lock extent, in component order,
and releases it in reverse (the rules are in ``flatradix.components``): Full
locks the whole path (``components/full.py``). A release is checked for every
component before anything changes, so an unlock without lock, a double unlock
or a release on an ancestor is refused with the tree untouched.
"""

from ..components import full
from ._jit import kernel
from .layout import E_STALE, OK
from .state import resolve


@kernel
def inc_lock_ref(nodes, heap, meta, nid, skip):
    """Lock node ``nid`` for every configured component not in ``skip`` (a ``C_*``
    bit set; FULL is never skipped). Returns ``(status, delta)``: Full units moved
    evictable -> protected."""
    s = resolve(nodes, meta, nid)
    if s < 0:
        return E_STALE, 0
    delta = full.acquire_component_lock(nodes, heap, meta, s)
    return OK, delta


@kernel
def dec_lock_ref(nodes, heap, meta, nid, skip):
    """Release a lock taken by ``inc_lock_ref(nid, skip)``. Returns ``(status, x)``.

    ``(E_LOCK_UNDERFLOW, slot)`` when node ``slot`` of a released extent has
    lock_ref 0, ``(E_NOT_ANCHORED, slot)`` when no Full lock is anchored at
    ``nid`` itself (its lock_ref is held by locks on descendants); nothing is
    changed then. Else ``(OK, delta)``: Full units moved protected -> evictable.
    """
    s = resolve(nodes, meta, nid)
    if s < 0:
        return E_STALE, 0
    st, bad = full.check_release(nodes, s)
    if st != OK:
        return st, bad
    delta = full.release_component_lock(nodes, heap, meta, s)
    return OK, delta
