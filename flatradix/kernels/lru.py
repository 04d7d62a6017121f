"""Intrusive LRU lists of the auxiliary components (SWA, Mamba), one per (component, tier).

Only this module writes ``nodes[:, LRU_PREV + l]`` and ``nodes[:, LRU_NEXT + l]``
(``l = LRU_ID(c, t)``). Each list is doubly linked through those columns between
two sentinel slots that are never alive and never popped (vLLM's
``FreeKVCacheBlockQueue`` style): ``lru_head(l)`` (its next is the most recently
used entry) and ``lru_tail(l)`` (its prev is the least recently used one), so
every real entry has a prev and a next and no verb branches on an end. A node is
in list ``l`` iff its ``LRU_PREV + l`` is not NIL (``state.node_alloc`` clears
the links of a fresh slot).

Verbs: ``lru_push_front`` (SGLang ``insert_mru``), ``lru_insert_after``,
``lru_remove``, ``lru_move_to_front`` (``reset_node_mru``), ``lru_move_after``,
``lru_pop_tail``; walks: ``lru_tail_unlocked`` (``get_lru_no_lock``) and
``lru_prev_unlocked`` (``get_prev_no_lock``: one step from the tail toward the
head), which skip entries whose lock_ref of the list's (component, tier) is
held. Every verb is O(1).
"""

from ._jit import helper
from .layout import (
    DEVICE, F_ALIVE, FIRST_SLOT, FLAGS, LOCK_REF, LRU_NEXT, LRU_PREV, M_EVICTABLE, M_PROTECTED,
    M_TOTAL, N_LRU, N_LRU_LISTS, N_TIERS, NIL, SENTINEL0,
)


@helper
def lru_list(c, t=DEVICE):
    """The list id of auxiliary component ``c``'s LRU on tier ``t`` (``layout.LRU_ID``)."""
    return (c - 1) + t * N_LRU


@helper
def lru_head(lst):
    return SENTINEL0 + 2 * lst


@helper
def lru_tail(lst):
    return SENTINEL0 + 2 * lst + 1


@helper
def lru_lock_col(lst):
    """Lock column of the (component, tier) that list ``lst`` orders (a host list
    skips host-locked entries)."""
    return LOCK_REF + (lst % N_LRU + 1) * N_TIERS + lst // N_LRU


@helper
def lru_init(nodes):
    """Empty every list (the sentinels' rows are otherwise untouched)."""
    for lst in range(N_LRU_LISTS):
        h = lru_head(lst)
        t = lru_tail(lst)
        nodes[h, LRU_PREV + lst] = NIL
        nodes[h, LRU_NEXT + lst] = t
        nodes[t, LRU_PREV + lst] = h
        nodes[t, LRU_NEXT + lst] = NIL


@helper
def lru_in_list(nodes, lst, s):
    return nodes[s, LRU_PREV + lst] != NIL


@helper
def lru_insert_after(nodes, lst, prev, s):
    """Link ``s`` (not in the list) right behind ``prev`` (a member or the head),
    i.e. as slightly less recently used than ``prev``."""
    nxt = nodes[prev, LRU_NEXT + lst]
    nodes[s, LRU_PREV + lst] = prev
    nodes[s, LRU_NEXT + lst] = nxt
    nodes[nxt, LRU_PREV + lst] = s
    nodes[prev, LRU_NEXT + lst] = s


@helper
def lru_push_front(nodes, lst, s):
    """Link ``s`` (not in the list) as the most recently used entry."""
    lru_insert_after(nodes, lst, lru_head(lst), s)


@helper
def lru_remove(nodes, lst, s):
    """Unlink ``s`` (a member)."""
    prv = nodes[s, LRU_PREV + lst]
    nxt = nodes[s, LRU_NEXT + lst]
    nodes[prv, LRU_NEXT + lst] = nxt
    nodes[nxt, LRU_PREV + lst] = prv
    nodes[s, LRU_PREV + lst] = NIL
    nodes[s, LRU_NEXT + lst] = NIL


@helper
def lru_move_after(nodes, lst, prev, s):
    """Move member ``s`` right behind ``prev`` (a member other than ``s``, or the head)."""
    lru_remove(nodes, lst, s)
    lru_insert_after(nodes, lst, prev, s)


@helper
def lru_move_to_front(nodes, lst, s):
    lru_move_after(nodes, lst, lru_head(lst), s)


@helper
def lru_pop_tail(nodes, lst):
    """Unlink and return the least recently used entry (NIL when empty)."""
    s = nodes[lru_tail(lst), LRU_PREV + lst]
    if s == lru_head(lst):
        return NIL
    lru_remove(nodes, lst, s)
    return s


@helper
def lru_prev_unlocked(nodes, lst, s):
    """The nearest entry *more* recently used than ``s`` (a member or the tail) whose
    lock_ref is 0 -- the next victim of a walk from the tail; NIL when there is none."""
    col = lru_lock_col(lst)
    h = lru_head(lst)
    x = nodes[s, LRU_PREV + lst]
    while x != h and nodes[x, col] > 0:
        x = nodes[x, LRU_PREV + lst]
    return NIL if x == h else x


@helper
def lru_tail_unlocked(nodes, lst):
    """The least recently used entry whose lock_ref is 0; NIL when there is none."""
    return lru_prev_unlocked(nodes, lst, lru_tail(lst))


@helper
def lru_check_member(nodes, s, on, lst, bit, lock_col, full_lock):
    """(``sanity_check``) Node ``s`` against an auxiliary component's list ``lst``
    (data bit ``bit``, lock column ``lock_col``; ``on``: configured): ``(k, has data,
    locked)``
    with ``k`` 0 when they hold, 1 for data / a lock on a cache without the
    component or a lock_ref below 0 or above the node's Full lock_ref, 2 when
    its LRU membership disagrees with the data bit."""
    has = (nodes[s, FLAGS] & bit) != 0
    lk = nodes[s, lock_col]
    if not on:
        if has or lk != 0 or lru_in_list(nodes, lst, s):
            return 1, False, False
        return 0, False, False
    if lk < 0 or lk > full_lock:
        return 1, has, lk > 0
    if has != lru_in_list(nodes, lst, s):
        return 2, has, lk > 0
    return 0, has, lk > 0


@helper
def lru_check_list(nodes, meta, hwm, lst, c, bit, members, evictable, protected):
    """(``sanity_check``) The LRU list ``lst`` of component ``c`` against the recount: -2 when it
    holds, a bad entry's slot (or NIL for a wrong length / tail link) when the
    list is broken, -3 when the ledgers disagree."""
    h, t = lru_head(lst), lru_tail(lst)
    count = 0
    prev = h
    x = nodes[h, LRU_NEXT + lst]
    while x != t:
        if (x < FIRST_SLOT or x >= hwm or count > hwm or nodes[x, LRU_PREV + lst] != prev
                or not (nodes[x, FLAGS] & F_ALIVE) or not (nodes[x, FLAGS] & bit)):
            return x
        count += 1
        prev = x
        x = nodes[x, LRU_NEXT + lst]
    if nodes[t, LRU_PREV + lst] != prev or count != members:
        return NIL
    if (evictable != meta[M_EVICTABLE + c] or protected != meta[M_PROTECTED + c]
            or evictable + protected != meta[M_TOTAL + c]):
        return -3
    return -2


@helper
def lru_check_host_list(nodes, hwm, lst, listed):
    """(``sanity_check``) Host LRU ``lst`` runs sentinel to sentinel through ``listed`` live nodes:
    -2, else the bad entry (NIL for a count or tail mismatch)."""
    h, t = lru_head(lst), lru_tail(lst)
    count = 0
    prev = h
    x = nodes[h, LRU_NEXT + lst]
    while x != t:
        if (x < FIRST_SLOT or x >= hwm or count > hwm
                or nodes[x, LRU_PREV + lst] != prev
                or not (nodes[x, FLAGS] & F_ALIVE)):
            return x
        count += 1
        prev = x
        x = nodes[x, LRU_NEXT + lst]
    if nodes[t, LRU_PREV + lst] != prev or count != listed:
        return NIL
    return -2
