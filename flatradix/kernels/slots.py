"""Slot allocator kernels (``flatradix.pools.TokenToKVPoolAllocator``, slots
``1..size``, and ``flatradix.pools.HostKVPool``, slots ``0..size-1``).

``stack[:top]`` holds the free slots (the top is the end); ``mark[s] == 1`` iff
slot ``s`` is free. Valid slots are ``lo..hi`` (inclusive). One pass each,
O(slots moved), never O(pool).
"""

from ._jit import kernel

OK = 0
E_RANGE = 1       # a slot outside 1..size
E_DOUBLE = 2      # a slot that is already free
E_REPEATED = 3    # a slot given twice in one call


@kernel
def slots_free(stack, top, mark, idx, lo, hi, reverse):
    """Push ``idx`` onto the free stack (``idx[-1]`` on top, or ``idx[0]`` with
    ``reverse``: the host pool's order). Returns ``(status, bad_slot)``; on an
    error nothing is freed (marks set so far are undone). Stack writes stay in
    bounds: without ``reverse`` entry ``i`` is written once the first ``i + 1``
    entries are distinct held slots (at most ``len(stack) - top`` of them);
    with ``reverse`` the stack is written only after the whole batch checked."""
    n = idx.shape[0]
    for i in range(n):
        s = idx[i]
        code = OK
        if s < lo or s > hi:
            code = E_RANGE
        elif mark[s]:
            code = E_DOUBLE
            for j in range(i):
                if idx[j] == s:
                    code = E_REPEATED
                    break
        if code != OK:
            for j in range(i):
                mark[idx[j]] = 0
            return code, s
        mark[s] = 1
        if not reverse:
            stack[top + i] = s
    if reverse:
        for i in range(n):
            stack[top + n - 1 - i] = idx[i]
    return OK, 0


@kernel
def slots_first_unheld(mark, idx, lo, hi):
    """First entry of ``idx`` that is not a distinct held slot: ``(E_RANGE, i)``
    outside ``lo..hi``, ``(E_DOUBLE, i)`` free, ``(E_REPEATED, i)`` given earlier
    in ``idx``; ``(OK, -1)`` when all are distinct held slots. Two passes; held
    slots are marked 2 during the first and restored to 0 before returning (the
    kernel holds the GIL, so no other thread sees the marks)."""
    code = OK
    bad = -1
    n = 0
    for i in range(idx.shape[0]):
        s = idx[i]
        if s < lo or s > hi:
            code = E_RANGE
        elif mark[s] == 1:
            code = E_DOUBLE
        elif mark[s] == 2:
            code = E_REPEATED
        if code != OK:
            bad = i
            break
        mark[s] = 2
        n = i + 1
    for i in range(n):
        mark[idx[i]] = 0
    return code, bad


@kernel
def slots_alloc(stack, top, mark, out):
    """Pop ``len(out)`` slots (lowest first) into ``out``; the caller checked ``top``."""
    n = out.shape[0]
    for i in range(n):
        s = stack[top - 1 - i]
        out[i] = s
        mark[s] = 0
