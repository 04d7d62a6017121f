"""The duplicate list (HiCache): nodes holding Full data on both tiers, in the order they
became such a *settled duplicate* (SGLang ``full_host_duplicates``, an insertion-ordered
dict there).

A settled duplicate has a Full device and a Full host value and no backup or load-back in
flight. Write-back host eviction reclaims their host copies first, in this order
(``host.evict_host``). Registration happens where duplicates are born -- a backup's ack, a
load-back's ack (every node of the anchor's path), an insert taking over a host-only node,
the upper part of a split -- and re-checks the node: a member that is no longer a settled
duplicate leaves, a new one is appended, an existing one keeps its place. Other changes
(a demote) leave a stale member, swept when a reclaim pass meets it. A deleted node leaves.

Only this module writes ``DUP_PREV`` / ``DUP_NEXT``, ``F_DUP`` and ``meta[M_DUP_HEAD /
M_DUP_TAIL]``; NIL-terminated doubly linked list over node slots.
"""

from ._jit import helper
from .layout import (
    DUP_NEXT, DUP_PREV, F_DUP, F_HAS_FULL_DEV, F_HAS_FULL_HOST, FLAGS, LOAD_PENDING, M_DUP_HEAD,
    M_DUP_TAIL, NIL, ROOT, WT_PENDING,
)


@helper
def is_settled_duplicate(nodes, s):
    f = nodes[s, FLAGS]
    return (s != ROOT and (f & F_HAS_FULL_DEV) != 0 and (f & F_HAS_FULL_HOST) != 0
            and nodes[s, WT_PENDING] == 0 and nodes[s, LOAD_PENDING] == 0)


@helper
def dup_remove(nodes, meta, s):
    """Unlink member ``s`` (no-op for a non-member)."""
    if not (nodes[s, FLAGS] & F_DUP):
        return
    p = nodes[s, DUP_PREV]
    n = nodes[s, DUP_NEXT]
    if p != NIL:
        nodes[p, DUP_NEXT] = n
    else:
        meta[M_DUP_HEAD] = n
    if n != NIL:
        nodes[n, DUP_PREV] = p
    else:
        meta[M_DUP_TAIL] = p
    nodes[s, DUP_PREV] = NIL
    nodes[s, DUP_NEXT] = NIL
    nodes[s, FLAGS] &= ~F_DUP


@helper
def dup_update(nodes, meta, s):
    """SGLang ``_update_duplicate_tracking``: append ``s`` when it is a settled
    duplicate and not yet a member (a member keeps its place); remove it when it
    is not one."""
    if not is_settled_duplicate(nodes, s):
        dup_remove(nodes, meta, s)
        return
    if nodes[s, FLAGS] & F_DUP:
        return
    t = meta[M_DUP_TAIL]
    nodes[s, DUP_PREV] = t
    nodes[s, DUP_NEXT] = NIL
    if t != NIL:
        nodes[t, DUP_NEXT] = s
    else:
        meta[M_DUP_HEAD] = s
    meta[M_DUP_TAIL] = s
    nodes[s, FLAGS] |= F_DUP
