"""``match_prefix``: the longest cached page-aligned prefix of a key (may split a node)."""

from ._jit import kernel
from .children import find_child
from .layout import (
    E_CAPACITY, F_HAS_FULL_DEV, FLAGS, KEY_LEN, KEY_OFF, LAST_ACCESS, M_PAGE, PARENT,
    ROOT,
)
from .order import fix
from .state import has_room, node_id, tick
from .tree import copy_values, edge_match_len, split_node


@kernel
def match_prefix(nodes, ctab, pool, heap, meta, key, n, ns, out):
    """Walk ``key[:n]`` (n page-aligned, > 0) in namespace ``ns``.

    Writes the matched KV indices to ``out[:prefix_len]``. A match ending inside
    an edge splits that node so the prefix ends on a node boundary (SGLang
    §5.1). Stamps the best node with a fresh tick ``t`` and each ancestor ``k``
    levels up, root included, with ``t - k`` (SGLang §2.4).

    Returns ``(status, prefix_len, best_node_id, last_visited_node_id)``;
    ``last_visited_node_id`` is -1 when no child was walked. Requires room for one
    split (a slot and a child-table entry); E_CAPACITY otherwise, nothing changed.
    """
    if not has_room(nodes, ctab, pool, meta, 1, 0):
        return E_CAPACITY, 0, -1, -1
    page = meta[M_PAGE]
    node = ROOT
    visited = -1
    length = 0
    while length < n:
        child = find_child(nodes, ctab, pool, node, ns, key, length, page)
        if child < 0 or not (nodes[child, FLAGS] & F_HAS_FULL_DEV):
            break
        visited = child
        m = edge_match_len(nodes, pool, child, key, length, n, page)
        if m < nodes[child, KEY_LEN]:
            child = split_node(nodes, ctab, pool, heap, meta, child, m)
            visited = child
        copy_values(pool, nodes[child, KEY_OFF], m, out, length)
        length += m
        node = child
    t = tick(meta)
    best = node
    a = node
    k = 0
    while True:
        nodes[a, LAST_ACCESS] = t - k
        fix(nodes, heap, meta, a)
        if a == ROOT:
            break
        a = nodes[a, PARENT]
        k += 1
    vid = node_id(nodes, visited) if visited >= 0 else -1
    return 0, length, node_id(nodes, best), vid

