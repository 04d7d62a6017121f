"""Read-only queries: path indices, node lookup by key without side effects."""

from ..kernels._jit import kernel
from ..kernels.layout import E_CAPACITY, E_STALE, F_HAS_FULL_DEV, FLAGS, KEY_LEN, KEY_OFF, OK, PARENT, ROOT
from ..kernels.state import need, resolve
from .tree import copy_values


@kernel(scratch="out", on_capacity="retry")
def path_device_indices(nodes, pool, meta, nid, out):
    """KV indices on the path root -> ``nid``, written to ``out``. Returns ``(status, n)``.

    With a host tier only the device part of the path counts: host-only nodes
    (below every device node of the path) are skipped.
    ``(E_CAPACITY, n)`` when ``out`` is shorter than the path's ``n`` units
    (nothing written; ``meta[M_NEED_OUT]`` says so).
    """
    s = resolve(nodes, meta, nid)
    if s < 0:
        return E_STALE, 0
    while s != ROOT and not (nodes[s, FLAGS] & F_HAS_FULL_DEV):
        s = nodes[s, PARENT]
    n = 0
    a = s
    while a != ROOT:
        n += nodes[a, KEY_LEN]
        a = nodes[a, PARENT]
    if n > out.shape[0]:
        need(meta, 0, 0, n, 0)
        return E_CAPACITY, n
    end = n
    a = s
    while a != ROOT:
        ln = nodes[a, KEY_LEN]
        off = nodes[a, KEY_OFF]
        copy_values(pool, off, ln, out, end - ln)
        end -= ln
        a = nodes[a, PARENT]
    return OK, n


@kernel
def resolve_slot(nodes, meta, nid):
    """Slot of node ``nid`` or -1 when stale (for the façade's read-only helpers)."""
    return resolve(nodes, meta, nid)
