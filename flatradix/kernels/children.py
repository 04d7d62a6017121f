"""Open-addressing child table: ``(parent slot, namespace, page key) -> child slot``.

Owns ``ctab``; writes ``meta[M_CT_LIVE]`` and ``meta[M_CT_TOMB]``. Capacity is a
power of two; linear probing; deleted entries become tombstones until the façade
rebuilds the table (``rebuild_children``) once live + tombstones exceed
``CT_MAX_LOAD`` of the capacity. For ``page_size > 1`` the page key is a 64-bit
mix of the page's units, and every hit is confirmed against the child's stored
first page, so hash collisions can never join two different pages.
"""

import numpy as np

from ._jit import helper, kernel
from .layout import (
    CT_CHILD, CT_EMPTY, CT_NS, CT_PAGEKEY, CT_PARENT, CT_TOMB, F_ALIVE, FLAGS,
    KEY_LEN, KEY_OFF, M_CT_LIVE, M_CT_TOMB, M_HWM, M_PAGE, NS, PARENT, ROOT, TOK,
)


@helper
def mix64(x):
    """splitmix64 finaliser (public-domain constants by S. Vigna)."""
    x = np.uint64(x)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x = x ^ (x >> np.uint64(31))
    return x


@helper
def page_key(units, start, page):
    """Page key of ``units[start : start + page]``: the unit itself when page == 1."""
    if page == 1:
        return units[start]
    h = np.uint64(0x9E3779B97F4A7C15)
    for i in range(page):
        h = mix64(h ^ np.uint64(units[start + i]))
    return np.int64(h)


@helper
def _slot_hash(parent, ns, pkey, mask):
    h = mix64(np.uint64(parent) * np.uint64(0x9E3779B97F4A7C15)
              ^ mix64(np.uint64(ns) + np.uint64(0x632BE59BD9B4E019))
              ^ np.uint64(pkey))
    return np.int64(h & np.uint64(mask))


@helper
def find_child(nodes, ctab, pool, parent, ns, units, start, page):
    """Child slot of ``parent`` whose edge starts with page ``units[start:start+page]``, or -1."""
    pkey = page_key(units, start, page)
    mask = ctab.shape[0] - 1
    i = _slot_hash(parent, ns, pkey, mask)
    while True:
        c = ctab[i, CT_CHILD]
        if c == CT_EMPTY:
            return -1
        if (c >= 0 and ctab[i, CT_PARENT] == parent and ctab[i, CT_NS] == ns
                and ctab[i, CT_PAGEKEY] == pkey):
            if page == 1:
                return c
            off = nodes[c, KEY_OFF]
            same = True
            for j in range(page):
                if pool[off + j, TOK] != units[start + j]:
                    same = False
                    break
            if same:
                return c
        i = (i + 1) & mask


@helper
def _find_entry(ctab, parent, ns, pkey, child):
    """Table index of the entry pointing at ``child``, or -1."""
    mask = ctab.shape[0] - 1
    i = _slot_hash(parent, ns, pkey, mask)
    while True:
        c = ctab[i, CT_CHILD]
        if c == CT_EMPTY:
            return -1
        if c == child and ctab[i, CT_PARENT] == parent:
            return i
        i = (i + 1) & mask


@helper
def add_child_entry(ctab, meta, parent, ns, pkey, child):
    """Insert ``(parent, ns, pkey) -> child`` (the key must not be present)."""
    mask = ctab.shape[0] - 1
    i = _slot_hash(parent, ns, pkey, mask)
    while ctab[i, CT_CHILD] >= 0:
        i = (i + 1) & mask
    if ctab[i, CT_CHILD] == CT_TOMB:
        meta[M_CT_TOMB] -= 1
    ctab[i, CT_PARENT] = parent
    ctab[i, CT_NS] = ns
    ctab[i, CT_PAGEKEY] = pkey
    ctab[i, CT_CHILD] = child
    meta[M_CT_LIVE] += 1


@helper
def edge_page_key(nodes, pool, meta, slot):
    """Page key of the first page of ``slot``'s edge."""
    return page_key(pool[:, TOK], nodes[slot, KEY_OFF], meta[M_PAGE])


@helper
def remove_child_entry(nodes, ctab, pool, meta, slot):
    """Tombstone the entry under which ``slot`` hangs from its parent."""
    pkey = edge_page_key(nodes, pool, meta, slot)
    i = _find_entry(ctab, nodes[slot, PARENT], nodes[slot, NS], pkey, slot)
    ctab[i, CT_CHILD] = CT_TOMB
    meta[M_CT_LIVE] -= 1
    meta[M_CT_TOMB] += 1


@helper
def repoint_child_entry(nodes, ctab, pool, meta, old, new):
    """Make the entry that points at ``old`` point at ``new`` (same parent, same page)."""
    pkey = edge_page_key(nodes, pool, meta, old)
    i = _find_entry(ctab, nodes[old, PARENT], nodes[old, NS], pkey, old)
    ctab[i, CT_CHILD] = new


@kernel(engine_only=True)
def rebuild_children(nodes, ctab, pool, meta):
    """Refill an empty (all ``CT_EMPTY``) ``ctab`` from the node table. O(nodes)."""
    meta[M_CT_LIVE] = 0
    meta[M_CT_TOMB] = 0
    for s in range(meta[M_HWM]):
        if s != ROOT and (nodes[s, FLAGS] & F_ALIVE) and nodes[s, KEY_LEN] > 0:
            add_child_entry(ctab, meta, nodes[s, PARENT], nodes[s, NS],
                            edge_page_key(nodes, pool, meta, s), s)
