"""Full device eviction: whole rounds (``evict``) and step-wise rounds.

Victims come from the incrementally kept heap of evictable device leaves
(``kernels/order.py``); when a leaf is deleted its parent re-enters the heap
if it became a leaf, so chains collapse bottom-up. Freed KV indices are written
to ``out``; the façade hands them to the allocator.
"""

from ._jit import kernel
from .layout import (
    E_CAPACITY, E_NO_WALK, E_WALK_OPEN, KEY_LEN, M_EVICT_DONE, M_EVICT_REQ, M_EVICT_WALK,
    M_HEAP_N, OK,
)
from .order import heap_pop
from .state import node_id
from .tree import delete_leaf


@kernel
def evict(nodes, ctab, pool, heap, meta, num_tokens, out, spans):
    """Delete least-priority leaves until ``num_tokens`` units are freed or none is left.

    Returns ``(status, n_out, n_spans)``; ``out[:n_out]`` holds the freed KV
    indices (= evicted units) in eviction order, ``spans[:n_spans]`` the deleted
    nodes' pool spans (KV events only). Node-granular: may exceed the request.
    ``E_CAPACITY`` when ``out`` cannot hold the next victim: what was evicted so
    far is reported as usual, and calling again with ``num_tokens - n_out``
    continues the same round (the façade grows ``out`` in between).
    O(evicted nodes * log(leaves)).
    """
    nout = 0
    nspans = 0
    while nout < num_tokens and meta[M_HEAP_N] > 0:
        if nout + nodes[heap[0], KEY_LEN] > out.shape[0]:
            return E_CAPACITY, nout, nspans
        s = heap_pop(nodes, heap, meta)
        nout, nspans = delete_leaf(nodes, ctab, pool, heap, meta, s, out, nout, spans, nspans)
    return OK, nout, nspans


@kernel
def evict_start(meta, num_tokens):
    """Open a step-wise Full eviction round for ``num_tokens`` units."""
    if meta[M_EVICT_WALK]:
        return E_WALK_OPEN
    meta[M_EVICT_WALK] = 1
    meta[M_EVICT_REQ] = num_tokens
    meta[M_EVICT_DONE] = 0
    return OK


@kernel
def evict_next(nodes, ctab, pool, heap, meta, out, spans):
    """Evict the next leaf of the open round.

    Returns ``(status, node_id, n_out, n_spans)``; ``node_id`` is -1 when the
    round's request is met or no evictable leaf is left. ``out[:n_out]`` holds
    the leaf's freed KV indices (``spans`` as in ``evict``). ``(E_CAPACITY, -1,
    needed, 0)`` when ``out`` is shorter than the leaf: nothing changed.
    """
    if not meta[M_EVICT_WALK]:
        return E_NO_WALK, -1, 0, 0
    if meta[M_EVICT_DONE] >= meta[M_EVICT_REQ] or meta[M_HEAP_N] == 0:
        return OK, -1, 0, 0
    if nodes[heap[0], KEY_LEN] > out.shape[0]:
        return E_CAPACITY, -1, nodes[heap[0], KEY_LEN], 0
    s = heap_pop(nodes, heap, meta)
    nid = node_id(nodes, s)
    nout, nspans = delete_leaf(nodes, ctab, pool, heap, meta, s, out, 0, spans, 0)
    meta[M_EVICT_DONE] += nout
    return OK, nid, nout, nspans


@kernel
def evict_end(meta):
    """Close the open round; returns the units it evicted (0 when none was open)."""
    done = meta[M_EVICT_DONE] if meta[M_EVICT_WALK] else 0
    meta[M_EVICT_WALK] = 0
    meta[M_EVICT_REQ] = 0
    meta[M_EVICT_DONE] = 0
    return done
