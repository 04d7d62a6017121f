"""``insert``: add a page-aligned key and its KV indices, reusing the cached prefix."""

from ._jit import kernel
from .children import find_child
from .actions import A_FREE_KV, A_STORED, SRC_IN, SRC_POOL, acts_begin, emit
from .layout import (
    E_BAD_VALUE, E_CAPACITY, FULL, HIT_COUNT, KEY_LEN, KEY_OFF, LAST_ACCESS, M_EVENTS,
    M_PAGE, OK, PRIORITY, ROOT, VALUES_UNCHECKED,
)
from .order import fix
from .state import has_room, need, node_id, tick
from .tree import add_leaf, copy_values, edge_match_len, split_node


@kernel
def insert(nodes, ctab, pool, heap, meta, key, value, n, ns, inserted_len, priority, limit, prev,
           out_base, out, acts):
    """Insert ``key[:n]`` -> ``value[:n]`` (n page-aligned, > 0) in namespace ``ns``.

    Check first: every entry of ``value`` (all of it, not only ``[:n]``) must be
    ``>= 0`` and, when ``limit >= 0``, ``< limit`` (``limit`` = VALUES_NONNEG:
    only ``>= 0``; VALUES_UNCHECKED: no check). Else ``(E_BAD_VALUE, i, -1)``
    names the first bad entry ``i``, and nothing has changed.

    Walk (SGLang §5.2): touch each walked node with a fresh tick, split a
    partially matched node, raise ``priority`` along the path, and count a hit
    on every walked node that ends past ``inserted_len``. The slots of
    ``value`` that duplicate a walked node's, from ``prev`` (the caller's
    ``prev_prefix_len``) on, are emitted as ``A_FREE_KV`` rows (``SRC_IN``).
    Commit: the unmatched rest becomes one new leaf whose value is a copy of
    ``value[prefix_len:n]`` (``A_STORED`` with events on).

    ``out_base``: when ``>= n``, the cached prefix's KV indices (the tree's,
    not the caller's duplicates) are written to ``out[:prefix_len]``, so
    ``out[:prefix_len] ++ value[prefix_len:n]`` is the path's value (the request
    path needs it); action data goes to ``out[out_base:]``. Pass 0 to skip.

    Returns ``(status, prefix_len, target_node_id)`` where the target is the new
    leaf, else the node the key ended on. Requires two free slots, two
    child-table entries, ``n`` free pool rows, ``out_base`` entries of ``out``
    and room for the actions; E_CAPACITY otherwise (``meta[M_NEED_*]`` say
    how much), with nothing changed.
    """
    if limit != VALUES_UNCHECKED and value.shape[0] > 0:
        lo = value[0]
        hi = value[0]
        for i in range(value.shape[0]):  # branch-free min/max: vectorised
            lo = min(lo, value[i])
            hi = max(hi, value[i])
        if lo < 0 or (limit >= 0 and hi >= limit):
            for i in range(value.shape[0]):
                if value[i] < 0 or (limit >= 0 and value[i] >= limit):
                    return E_BAD_VALUE, i, -1
    want_path = out_base >= n
    need_out = out_base if want_path else 0
    need_acts = 4
    if out.shape[0] < need_out or acts.shape[0] < need_acts:
        need(meta, 0, 0, need_out, need_acts)
        return E_CAPACITY, 0, -1
    if not has_room(nodes, ctab, pool, meta, 2, n):
        return E_CAPACITY, 0, -1
    acts_begin(meta, need_out)
    page = meta[M_PAGE]
    nodes[ROOT, LAST_ACCESS] = tick(meta)
    if priority > nodes[ROOT, PRIORITY]:
        nodes[ROOT, PRIORITY] = priority
    node = ROOT
    length = 0
    while length < n:
        child = find_child(nodes, ctab, pool, node, ns, key, length, page)
        if child < 0:
            break
        nodes[child, LAST_ACCESS] = tick(meta)
        m = edge_match_len(nodes, pool, child, key, length, n, page)
        if m < nodes[child, KEY_LEN]:
            child = split_node(nodes, ctab, pool, heap, meta, child, m)
        if want_path:
            copy_values(pool, nodes[child, KEY_OFF], m, out, length)
        if priority > nodes[child, PRIORITY]:
            nodes[child, PRIORITY] = priority
        dup = max(prev, length)
        if dup < length + m:
            emit(acts, meta, A_FREE_KV, FULL, SRC_IN, dup, length + m - dup, 0)
        if length + m > inserted_len:
            nodes[child, HIT_COUNT] += 1
        fix(nodes, heap, meta, child)
        length += m
        node = child
    prefix_len = length
    target = node
    if length < n:
        target = add_leaf(nodes, ctab, pool, heap, meta, node, ns, key, value, length, n, priority)
        if meta[M_EVENTS]:
            emit(acts, meta, A_STORED, FULL, SRC_POOL, target, n - length, 0)
        if n > inserted_len:
            nodes[target, HIT_COUNT] += 1
            fix(nodes, heap, meta, target)
    return OK, prefix_len, node_id(nodes, target)
