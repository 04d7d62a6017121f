"""The Full component: the backbone every node holds (SGLang ``FullComponent``, spec §6.1).

Value: one KV index per logical unit, the node's pool span (column ``FULL_DEV``),
so a split divides it by moving span bounds. Validator: a device value is
present. Lock: the *path* lock -- every node from the anchor up to (not
including) the root. Eviction: whole device leaves, least priority first
(``kernels/order.py`` heap; ``core/evict.py``), or demoted to the host when
backed up (host tier, ``core/host.py``); an internal node is never evicted
while Full is the backbone.

Writes ``nodes[:, LOCK_COL(FULL, t)]``, ``CHILD_LOCK`` and the Full ledgers.
"""

from ..kernels._jit import helper
from ..kernels.layout import (
    CHILD_LOCK, E_LOCK_UNDERFLOW, E_NOT_ANCHORED, F_HAS_FULL_DEV, FLAGS, FULL, FULL_LOCK,
    KEY_LEN, LOCK_REF, M_EVICTABLE, M_PROTECTED, N_TIERS, OK, PARENT, ROOT,
)
from ..kernels.order import refresh_leaf

#: (Cascade priority on an internal node: 2, above every auxiliary component's --
#: Full, the backbone, is never evicted from an internal node, so no rule reads it.)


@helper
def validate(nodes, s):
    """``create_match_validator`` (device-only): the node holds a Full device value."""
    return (nodes[s, FLAGS] & F_HAS_FULL_DEV) != 0


@helper
def redistribute_on_node_split(nodes, u, child):
    """The upper part ``u`` of a split of ``child``: it inherits the child's Full
    lock counts on both tiers (every path lock through the child also covers
    ``u``), and ``u``'s only child is ``child``, so no lock is anchored at ``u``.
    The value needs nothing: ``u`` takes the first units of the same pool span."""
    for t in range(N_TIERS):
        nodes[u, LOCK_REF + FULL * N_TIERS + t] = nodes[child, LOCK_REF + FULL * N_TIERS + t]
    nodes[u, CHILD_LOCK] = nodes[child, FULL_LOCK]


@helper
def acquire_component_lock(nodes, heap, meta, s):
    """Path lock from ``s`` up to (excluding) the root: ``lock_ref += 1`` on each
    node, its units moving evictable -> protected on 0 -> 1; each parent counts
    its children's locks (``CHILD_LOCK``). Returns the units moved (``delta``)."""
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
    return delta


@helper
def check_release(nodes, s):
    """Whether ``release_component_lock(s)`` would succeed, checked before any change:
    ``(OK, -1)``, ``(E_NOT_ANCHORED, s)`` when no lock is anchored at ``s`` (its
    lock_ref is held by locks on descendants), ``(E_LOCK_UNDERFLOW, slot)`` when a
    node of the path has lock_ref 0."""
    if s != ROOT and nodes[s, FULL_LOCK] > 0 and nodes[s, FULL_LOCK] - nodes[s, CHILD_LOCK] < 1:
        return E_NOT_ANCHORED, s
    a = s
    while a != ROOT:
        if nodes[a, FULL_LOCK] <= 0:
            return E_LOCK_UNDERFLOW, a
        a = nodes[a, PARENT]
    return OK, -1


@helper
def release_component_lock(nodes, heap, meta, s):
    """The reverse of ``acquire_component_lock`` (checked by ``check_release``).
    Returns the units moved protected -> evictable."""
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
    return delta


@helper
def shift_counts(nodes, s, d):
    """Add ``d`` to the Full lock_ref of the path of ``s`` (and to each parent's
    ``CHILD_LOCK``) without ledger or heap changes: a batch release's dry run,
    undone exactly by the opposite shift."""
    a = s
    while a != ROOT:
        nodes[a, FULL_LOCK] += d
        a = nodes[a, PARENT]
        nodes[a, CHILD_LOCK] += d
