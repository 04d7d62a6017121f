"""Full device eviction: whole rounds (``evict``) and step-wise rounds.

Victims come from the incrementally kept heap of evictable device leaves
(``kernels/order.py``); when a leaf is deleted its parent re-enters the heap
if it became a leaf, so chains collapse bottom-up. Freed KV indices are written
to ``out``; the façade hands them to the allocator.
"""

from ._jit import kernel
from .actions import acts_begin, acts_room
from .layout import (
    E_CAPACITY, E_NO_WALK, E_WALK_OPEN, HEAP_DEVICE, KEY_LEN, M_EVICT_DONE, M_EVICT_REQ,
    M_EVICT_WALK, M_HEAP_N, M_NACTS, M_NOUT, OK,
)
from .order import heap_pop
from .state import need, node_id
from .tree import delete_leaf


@kernel
def evict(nodes, ctab, pool, heap, meta, num_tokens, out, acts):
    """Delete least-priority leaves until ``num_tokens`` units are freed or none is left.

    Returns ``(status, n_freed)``; each deleted leaf emits its actions
    (``tree.delete_leaf``: ``A_FREE_SLOT`` with its KV indices in ``out``,
    ``A_REMOVED`` with events on), in eviction order. Node-granular: may exceed
    the request. ``E_CAPACITY`` when ``out`` or ``acts`` cannot hold the next
    victim (``meta[M_NEED_OUT]`` / ``[M_NEED_ACTS]`` say what it needs): what
    was evicted so far is reported as usual, and calling again with
    ``num_tokens - n_freed`` continues the same round (the façade executes the
    actions and grows the buffers in between). O(evicted nodes * log(leaves)).
    """
    acts_begin(meta, 0)
    freed = 0
    while freed < num_tokens and meta[M_HEAP_N + HEAP_DEVICE] > 0:
        s = heap[HEAP_DEVICE, 0]
        if not acts_room(acts, out, meta, 2, nodes[s, KEY_LEN]):
            need(meta, 0, 0, meta[M_NOUT] + nodes[s, KEY_LEN], meta[M_NACTS] + 2)
            return E_CAPACITY, freed
        heap_pop(nodes, heap, meta, HEAP_DEVICE)
        freed += delete_leaf(nodes, ctab, pool, heap, meta, s, out, acts)
    return OK, freed


@kernel
def evict_start(meta, component, num_tokens):
    """Open a step-wise eviction round of ``component`` for ``num_tokens`` units."""
    if meta[M_EVICT_WALK + component]:
        return E_WALK_OPEN
    meta[M_EVICT_WALK + component] = 1
    meta[M_EVICT_REQ + component] = num_tokens
    meta[M_EVICT_DONE + component] = 0
    return OK


@kernel
def evict_next(nodes, ctab, pool, heap, meta, component, out, acts):
    """Evict the next leaf of the open round of ``component``.

    Returns ``(status, node_id, n_freed)``; ``node_id`` is -1 when the round's
    request is met or no evictable leaf is left. The leaf's actions are emitted
    as in ``evict``. ``E_CAPACITY`` (``meta[M_NEED_*]``) when the buffers
    cannot hold the leaf: nothing changed.
    """
    if not meta[M_EVICT_WALK + component]:
        return E_NO_WALK, -1, 0
    acts_begin(meta, 0)
    if (meta[M_EVICT_DONE + component] >= meta[M_EVICT_REQ + component]
            or meta[M_HEAP_N + HEAP_DEVICE] == 0):
        return OK, -1, 0
    s = heap[HEAP_DEVICE, 0]
    if not acts_room(acts, out, meta, 2, nodes[s, KEY_LEN]):
        need(meta, 0, 0, nodes[s, KEY_LEN], 2)
        return E_CAPACITY, -1, 0
    heap_pop(nodes, heap, meta, HEAP_DEVICE)
    nid = node_id(nodes, s)
    n = delete_leaf(nodes, ctab, pool, heap, meta, s, out, acts)
    meta[M_EVICT_DONE + component] += n
    return OK, nid, n


@kernel
def evict_end(meta, component):
    """Close the open round of ``component``; returns the units it evicted (0 when
    none was open)."""
    done = meta[M_EVICT_DONE + component] if meta[M_EVICT_WALK + component] else 0
    meta[M_EVICT_WALK + component] = 0
    meta[M_EVICT_REQ + component] = 0
    meta[M_EVICT_DONE + component] = 0
    return done
