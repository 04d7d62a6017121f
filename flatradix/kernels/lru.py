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
from .layout import LOCK_REF, LRU_NEXT, LRU_PREV, N_LRU, N_LRU_LISTS, N_TIERS, NIL, SENTINEL0


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
