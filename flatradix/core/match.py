"""``match_prefix``: the longest cached page-aligned prefix of a key (may split a node)."""

from ..components import dispatch, full
from ..kernels._jit import helper, kernel
from ..kernels.children import find_child
from ..kernels.layout import (
    C_FULL, E_CAPACITY, F_HAS_FULL_HOST, FLAGS, KEY_LEN, KEY_OFF, LAST_ACCESS,
    M_COMPONENTS, M_HOST, M_PAGE, PARENT, ROOT,
)
from ..kernels.order import fix
from ..kernels.state import has_room, node_id, tick
from .tree import copy_values, edge_match_len, split_node


@helper
def match_one(nodes, ctab, pool, heap, meta, key, n, ns, out):
    """One match (the body of ``match_prefix``); the caller checked room for a split.
    Returns ``(prefix_len, best_slot, last_visited_slot, full_kv_hit_length,
    host_best_len, host_best_slot)``: the device match, then (host tier on) the
    deepest node valid on either tier and the device length plus SGLang's host
    hit (the Full host units between the two nodes; without a host tier: the
    device match again)."""
    page = meta[M_PAGE]
    aux = (meta[M_COMPONENTS] & ~C_FULL) != 0  # Full alone: no validator beside Full's
    host_on = meta[M_HOST] != 0
    if aux:
        dispatch.walk_begin(meta)
    node = ROOT
    best = ROOT
    best_len = 0
    hbest = ROOT
    hbest_len = 0
    visited = -1
    length = 0
    while length < n:
        child = find_child(nodes, ctab, pool, node, ns, key, length, page)
        if child < 0:
            break
        dev = full.validate(nodes, child)
        if not dev and not (host_on and nodes[child, FLAGS] & F_HAS_FULL_HOST):
            break  # no Full data on either tier (SGLang: a dead node stops the walk)
        visited = child
        m = edge_match_len(nodes, pool, child, key, length, n, page)
        partial = m < nodes[child, KEY_LEN]
        if partial:
            child = split_node(nodes, ctab, pool, heap, meta, child, m)
            visited = child
        if dev:  # device nodes form a root-closed prefix: out[:length] is the device path
            copy_values(pool, nodes[child, KEY_OFF], m, out, length)
        length += m
        node = child
        ok = True
        ok_dev = True
        if aux:  # every component's validator (bit 1: device, bit 2: either tier)
            bits = dispatch.validate(nodes, meta, child, host_on)
            ok_dev = (bits & 1) != 0
            ok = (bits & 2) != 0
        if ok:
            hbest = child
            hbest_len = length
        if ok_dev and dev:
            best = child
            best_len = length
        if partial:
            break
    if host_on and hbest != best:
        # SGLang's host_hit_length: the units of the nodes holding a Full host copy
        # from the best node up to the device match (under write-back a device-only
        # node may lie between them)
        h = 0
        a = hbest
        while a != best and a != ROOT:
            if nodes[a, FLAGS] & F_HAS_FULL_HOST:
                h += nodes[a, KEY_LEN]
            a = nodes[a, PARENT]
        hbest_len = best_len + h
    if aux:
        dispatch.match_end(nodes, meta, hbest)  # SGLang's refresh_lru(MATCH_END)
    t = tick(meta)
    a = hbest  # SGLang stamps from the best match on either tier
    k = 0
    while True:
        nodes[a, LAST_ACCESS] = t - k
        fix(nodes, heap, meta, a)
        if a == ROOT:
            break
        a = nodes[a, PARENT]
        k += 1
    return best_len, best, visited, length, hbest_len, hbest


@kernel(on_capacity="retry")
def match_prefix(nodes, ctab, pool, heap, meta, key, n, ns, out):
    """Walk ``key[:n]`` (n page-aligned, > 0) in namespace ``ns``.

    Writes the walked nodes' KV indices to ``out``; the usable prefix is
    ``out[:prefix_len]``. A match ending inside an edge splits that node so the
    walk ends on a node boundary (SGLang §5.1). Every walked node is evaluated
    by each configured component's validator (Full: a device value; SWA: a
    window of contiguous SWA data, ``components/swa.py``; Mamba: a state,
    ``components/mamba.py``); the deepest node valid for all is the best node,
    and ``prefix_len`` the units up to it. The best node and its ancestors
    within the SWA window move to the SWA LRU's MRU end, the best node alone
    to the Mamba LRU's; the best node is stamped with a fresh tick ``t`` and each ancestor
    ``k`` levels up, root included, with ``t - k`` (SGLang §2.4).

    Host tier on (HiCache, SGLang §8): host-only nodes (a Full host value, no
    device value) are walked too; ``prefix_len`` and ``best_node_id`` are the
    device match (its indices in ``out``), ``host_hit_length`` the units of
    the nodes with a Full host copy from ``host_node_id`` up to it (SGLang's
    Full finaliser), ``host_node_id`` the deepest node valid on either tier
    (SGLang's ``best_match_node`` / ``last_host_node``),
    from which the path is stamped. Without a host tier they are 0 and the
    device best node.

    Returns ``(status, prefix_len, best_node_id, last_visited_node_id,
    full_kv_hit_length, host_hit_length, host_node_id)``;
    ``last_visited_node_id`` is -1 when no child was walked;
    ``full_kv_hit_length`` counts every walked unit (valid or not).
    Requires room for one split (a slot and a child-table entry); E_CAPACITY
    otherwise, nothing changed.
    """
    if not has_room(nodes, ctab, pool, meta, 1, 0):
        return E_CAPACITY, 0, -1, -1, 0, 0, -1
    plen, best, visited, full_hit, hlen, hbest = match_one(nodes, ctab, pool, heap, meta, key,
                                                           n, ns, out)
    vid = node_id(nodes, visited) if visited >= 0 else -1
    return 0, plen, node_id(nodes, best), vid, full_hit, hlen - plen, node_id(nodes, hbest)


@kernel(on_capacity="retry")
def match_prefix_batch(nodes, ctab, pool, heap, meta, keys, offs, lens, nss, out, res):
    """``match_prefix`` of ``k`` keys in order, as ``k`` single calls would do them.

    Key ``i`` is ``keys[offs[i] : offs[i] + lens[i]]`` (page-aligned length) in
    namespace ``nss[i]``; a key with length 0 or namespace -1 matches nothing and
    touches nothing. The matched indices are packed: key ``i``'s come right after
    key ``i - 1``'s in ``out`` (``out`` as long as ``keys``; a walk writes at
    most its key's length past the packed end, which never passes ``offs[i]``).
    ``res[i] = (prefix_len, best_node_id, last_visited_node_id,
    full_kv_hit_length, host_hit_length, host_node_id)``. Requires room for ``k`` splits; E_CAPACITY
    otherwise, nothing changed. Returns ``(status, packed length)``.
    """
    k = lens.shape[0]
    if not has_room(nodes, ctab, pool, meta, k, 0):
        return E_CAPACITY, 0
    w = 0
    for i in range(k):
        n = lens[i]
        if n == 0 or nss[i] < 0:
            res[i, 0] = 0
            res[i, 1] = node_id(nodes, ROOT)
            res[i, 2] = -1
            res[i, 3] = 0
            res[i, 4] = 0
            res[i, 5] = res[i, 1]
            continue
        o = offs[i]
        plen, best, visited, full_hit, hlen, hbest = match_one(
            nodes, ctab, pool, heap, meta, keys[o:o + n], n, nss[i], out[w:w + n])
        w += plen
        res[i, 0] = plen
        res[i, 1] = node_id(nodes, best)
        res[i, 2] = node_id(nodes, visited) if visited >= 0 else -1
        res[i, 3] = full_hit
        res[i, 4] = hlen - plen
        res[i, 5] = node_id(nodes, hbest)
    return 0, w
