"""Full path locks: ``inc_lock_ref`` / ``dec_lock_ref`` (SGLang §5.7).

Owns ``nodes[:, LOCK_REF ...]``, ``CHILD_LOCK`` and the evictable/protected
ledgers' lock transitions. A lock on node X increments every node from X up to
(excluding) the root; each 0 -> 1 moves the node's units evictable -> protected.
``CHILD_LOCK`` of a node is the sum of its children's lock_ref, so
``lock_ref - CHILD_LOCK`` counts the locks *anchored* at the node. A release of
X needs one (else it would steal a descendant holder's lock and leave a child
locked more than its parent), and every node of the path must be above zero:
both are checked before anything changes, so an unlock without lock, a double
unlock or a release on an ancestor is refused with the tree untouched.
"""

from ._jit import kernel
from .layout import (
    CHILD_LOCK, E_LOCK_UNDERFLOW, E_NOT_ANCHORED, E_STALE, F_HAS_FULL_DEV, FLAGS, FULL, FULL_LOCK, KEY_LEN,
    M_EVICTABLE, M_PROTECTED, OK, PARENT, ROOT,
)
from .order import refresh_leaf
from .state import resolve


@kernel
def inc_lock_ref(nodes, heap, meta, nid):
    """Lock the path of node ``nid``. Returns ``(status, delta)``: units moved to protected."""
    s = resolve(nodes, meta, nid)
    if s < 0:
        return E_STALE, 0
    delta = 0
    a = s
    while a != ROOT:
        if nodes[a, FULL_LOCK] == 0 and nodes[a, FLAGS] & F_HAS_FULL_DEV:
            n = nodes[a, KEY_LEN]
            meta[M_EVICTABLE + FULL] -= n
            meta[M_PROTECTED + FULL] += n
            delta += n
        nodes[a, FULL_LOCK] += 1
        refresh_leaf(nodes, heap, meta, a)
        a = nodes[a, PARENT]
        nodes[a, CHILD_LOCK] += 1
    return OK, delta


@kernel
def dec_lock_ref(nodes, heap, meta, nid):
    """Release a lock taken by ``inc_lock_ref(nid)``. Returns ``(status, delta)``.

    ``(E_LOCK_UNDERFLOW, slot)`` when node ``slot`` of the path has lock_ref 0,
    ``(E_NOT_ANCHORED, slot)`` when no lock is anchored at ``nid`` itself (its
    lock_ref is held by locks on descendants); nothing is changed then.
    """
    s = resolve(nodes, meta, nid)
    if s < 0:
        return E_STALE, 0
    if s != ROOT and nodes[s, FULL_LOCK] > 0 and nodes[s, FULL_LOCK] - nodes[s, CHILD_LOCK] < 1:
        return E_NOT_ANCHORED, s
    a = s
    while a != ROOT:
        if nodes[a, FULL_LOCK] <= 0:
            return E_LOCK_UNDERFLOW, a
        a = nodes[a, PARENT]
    delta = 0
    a = s
    while a != ROOT:
        nodes[a, FULL_LOCK] -= 1
        if nodes[a, FULL_LOCK] == 0:
            if nodes[a, FLAGS] & F_HAS_FULL_DEV:
                n = nodes[a, KEY_LEN]
                meta[M_PROTECTED + FULL] -= n
                meta[M_EVICTABLE + FULL] += n
                delta += n
            refresh_leaf(nodes, heap, meta, a)
        a = nodes[a, PARENT]
        nodes[a, CHILD_LOCK] -= 1
    return OK, delta
