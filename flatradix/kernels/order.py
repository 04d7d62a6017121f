"""Eviction order of the evictable device leaves: an indexed binary min-heap.

Owns ``heap``, ``nodes[:, HEAP_POS]``, ``nodes[:, HOST_HEAP_POS]`` and
``meta[M_HEAP_N + h]``. Every heap helper takes a heap id ``h`` (a row of
``heap``; the node's position is in column ``pos_col(h)``); heap ``HEAP_HOST``
holds exactly the *evictable host leaves* with the host tier on (SGLang's
``evictable_host_leaves``: non-root, Full host value but no device value, no
lock on either tier, no load-back restoring it, no child), in the same policy
order, and ``meta[M_HOST_EVICTABLE]`` counts their units; heap ``HEAP_DEVICE`` holds
exactly the *evictable device leaves* (SGLang's ``evictable_device_leaves``:
non-root, Full device value present, every component's lock_ref == 0, no child
holding a Full device value). Membership is refreshed by ``refresh_leaf`` after
every mutation that can change it, and a node whose policy inputs change
(``LAST_ACCESS``, ``HIT_COUNT``, ``PRIORITY``) is re-sifted by ``fix``. So the
order is maintained incrementally and an eviction round pops in
O(log leaves) per evicted node instead of re-heapifying every leaf as SGLang's
cores do at each round start.

Priority keys (smaller is evicted first; SGLang 0.5.23 ``evict_policy.py``,
``rust_tree_core_notes.md`` §5), ties broken by slot index as in SGLang's Rust
core:

========  ===============================================================
lru       (last_access, 0)
lfu       (hit_count, last_access)
fifo      (creation, 0)
mru       (-last_access, 0)
filo      (-creation, 0)
priority  (priority, last_access)
slru      (1 if hit_count >= A else 0, last_access)     A = protected_threshold
tlru      (-1 if (cached - key_len) >= max(hist + B - A, 0) else 0, last_access)
          A = threshold, B = next_prompt_estimate
========  ===============================================================
"""

from ._jit import helper
from .layout import (
    CREATION, F_ALIVE, F_HAS_FULL_DEV, F_HAS_FULL_HOST, FLAGS, HEAP_DEVICE, HEAP_HOST, HEAP_POS,
    HIT_COUNT, HOST_HEAP_POS, KEY_LEN, LAST_ACCESS, LOAD_PENDING, LOCK_REF, M_HEAP_N, M_HOST,
    M_HOST_EVICTABLE, M_POLICY, M_POLICY_A, M_POLICY_B, NCHILD,
    N_COMPONENTS, N_TIERS, NDEVCHILD, NIL, POLICY_FIFO, POLICY_FILO, POLICY_LFU,
    POLICY_LRU, POLICY_MRU, POLICY_PRIORITY, POLICY_SLRU, PRIORITY, ROOT,
    TLRU_CACHED, TLRU_HIST,
)


@helper
def priority_key(nodes, meta, s):
    """The policy's ``(k0, k1)`` priority of slot ``s``."""
    p = meta[M_POLICY]
    la = nodes[s, LAST_ACCESS]
    if p == POLICY_LRU:
        return la, 0
    if p == POLICY_LFU:
        return nodes[s, HIT_COUNT], la
    if p == POLICY_FIFO:
        return nodes[s, CREATION], 0
    if p == POLICY_MRU:
        return -la, 0
    if p == POLICY_FILO:
        return -nodes[s, CREATION], 0
    if p == POLICY_PRIORITY:
        return nodes[s, PRIORITY], la
    if p == POLICY_SLRU:
        return (1 if nodes[s, HIT_COUNT] >= meta[M_POLICY_A] else 0), la
    # tlru
    budget = nodes[s, TLRU_HIST] + meta[M_POLICY_B] - meta[M_POLICY_A]
    if budget < 0:
        budget = 0
    safe = (nodes[s, TLRU_CACHED] - nodes[s, KEY_LEN]) >= budget
    return (-1 if safe else 0), la


@helper
def _less(nodes, meta, a, b):
    a0, a1 = priority_key(nodes, meta, a)
    b0, b1 = priority_key(nodes, meta, b)
    if a0 != b0:
        return a0 < b0
    if a1 != b1:
        return a1 < b1
    return a < b


@helper
def pos_col(h):
    """Column of ``nodes`` holding a node's position in heap ``h``."""
    return HEAP_POS if h == HEAP_DEVICE else HOST_HEAP_POS


@helper
def _place(nodes, heap, h, i, s):
    heap[h, i] = s
    nodes[s, pos_col(h)] = i


@helper
def _sift_up(nodes, heap, meta, h, i):
    s = heap[h, i]
    while i > 0:
        p = (i - 1) >> 1
        if not _less(nodes, meta, s, heap[h, p]):
            break
        _place(nodes, heap, h, i, heap[h, p])
        i = p
    _place(nodes, heap, h, i, s)


@helper
def _sift_down(nodes, heap, meta, h, i):
    n = meta[M_HEAP_N + h]
    s = heap[h, i]
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and _less(nodes, meta, heap[h, c + 1], heap[h, c]):
            c += 1
        if not _less(nodes, meta, heap[h, c], s):
            break
        _place(nodes, heap, h, i, heap[h, c])
        i = c
    _place(nodes, heap, h, i, s)


@helper
def heap_push(nodes, heap, meta, h, s):
    """Add slot ``s`` to heap ``h``."""
    i = meta[M_HEAP_N + h]
    meta[M_HEAP_N + h] = i + 1
    _place(nodes, heap, h, i, s)
    _sift_up(nodes, heap, meta, h, i)


@helper
def heap_remove(nodes, heap, meta, h, s):
    """Remove slot ``s`` (a member) from heap ``h``."""
    i = nodes[s, pos_col(h)]
    nodes[s, pos_col(h)] = NIL
    n = meta[M_HEAP_N + h] - 1
    meta[M_HEAP_N + h] = n
    if i == n:
        return
    _place(nodes, heap, h, i, heap[h, n])
    fix_at(nodes, heap, meta, h, i)


@helper
def fix_at(nodes, heap, meta, h, i):
    if i > 0 and _less(nodes, meta, heap[h, i], heap[h, (i - 1) >> 1]):
        _sift_up(nodes, heap, meta, h, i)
    else:
        _sift_down(nodes, heap, meta, h, i)


@helper
def fix(nodes, heap, meta, s):
    """Re-sift slot ``s`` in every heap it is in, after its priority inputs changed."""
    i = nodes[s, HEAP_POS]
    if i >= 0:
        fix_at(nodes, heap, meta, HEAP_DEVICE, i)
    i = nodes[s, HOST_HEAP_POS]
    if i >= 0:
        fix_at(nodes, heap, meta, HEAP_HOST, i)


@helper
def heap_pop(nodes, heap, meta, h):
    """Remove and return the slot of heap ``h`` with the smallest priority (-1 when empty)."""
    if meta[M_HEAP_N + h] == 0:
        return -1
    s = heap[h, 0]
    heap_remove(nodes, heap, meta, h, s)
    return s


@helper
def is_device_leaf(nodes, s):
    """SGLang's D-leaf predicate, O(1) through the NDEVCHILD counter."""
    if s == ROOT or not (nodes[s, FLAGS] & F_ALIVE) or not (nodes[s, FLAGS] & F_HAS_FULL_DEV):
        return False
    if nodes[s, NDEVCHILD] != 0:
        return False
    for c in range(N_COMPONENTS):
        if nodes[s, LOCK_REF + c * N_TIERS] != 0:
            return False
    return True


@helper
def is_host_leaf(nodes, s):
    """SGLang's H-leaf predicate: a host-only node (Full host value, no device
    value) with no child, no lock on either tier and no load-back restoring it."""
    f = nodes[s, FLAGS]
    if s == ROOT or not (f & F_ALIVE) or (f & F_HAS_FULL_DEV) or not (f & F_HAS_FULL_HOST):
        return False
    if nodes[s, NCHILD] != 0 or nodes[s, LOAD_PENDING] != 0:
        return False
    for j in range(N_COMPONENTS * N_TIERS):
        if nodes[s, LOCK_REF + j] != 0:
            return False
    return True


@helper
def refresh_host_leaf(nodes, heap, meta, s):
    """Bring ``s``'s membership of the host-leaf heap (and ``M_HOST_EVICTABLE``) in
    line with the H-leaf predicate."""
    leaf = is_host_leaf(nodes, s)
    inside = nodes[s, HOST_HEAP_POS] >= 0
    if leaf and not inside:
        heap_push(nodes, heap, meta, HEAP_HOST, s)
        meta[M_HOST_EVICTABLE] += nodes[s, KEY_LEN]
    elif inside and not leaf:
        heap_remove(nodes, heap, meta, HEAP_HOST, s)
        meta[M_HOST_EVICTABLE] -= nodes[s, KEY_LEN]


@helper
def refresh_leaf(nodes, heap, meta, s):
    """Bring ``s``'s membership of the device-leaf heap in line with the D-leaf
    predicate (and, with the host tier on, of the host-leaf heap)."""
    leaf = is_device_leaf(nodes, s)
    inside = nodes[s, HEAP_POS] >= 0
    if leaf and not inside:
        heap_push(nodes, heap, meta, HEAP_DEVICE, s)
    elif inside and not leaf:
        heap_remove(nodes, heap, meta, HEAP_DEVICE, s)
    if meta[M_HOST]:
        refresh_host_leaf(nodes, heap, meta, s)
