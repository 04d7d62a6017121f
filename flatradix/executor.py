"""The executor: turns a kernel's action rows into allocator frees and KV events.

"The tree decides, the cache executes" (SGLang 0.5.23 ``cache_action.py``): every
mutating kernel appends rows to the action buffer (``kernels/actions.py``) and
the façade calls ``execute`` right after it, before anything else touches the
tree (pool rows named by ``A_REMOVED`` are intact until then). Rows run in
order; frees into one pool are batched into one allocator call per pool and
call, which keeps each pool's free order and never reorders a free across an
action that reads the allocator's state.
"""

import numpy as np

from .kernels import actions as A

_EMPTY = np.empty(0, dtype=np.int64)


def _values(row, out, value_in):
    src, off, n = int(row[A.ACT_SRC]), int(row[A.ACT_OFF]), int(row[A.ACT_LEN])
    if src == A.SRC_IN:
        return value_in[off:off + n]
    return out[off:off + n]


def execute(rows, out, value_in, vals, sink, keep_own=False):
    """Execute ``rows`` (int64 ``(k, ACT_NCOL)``, a view of the engine's ``acts``).

    ``out``: the call's ``out`` scratch; ``value_in``: the call's input value
    array (``SRC_IN`` rows), or None; ``vals``: the ``ValueBridge`` (allocator);
    ``sink``: the ``EventSink`` or None. ``keep_own`` (request path): a slot of
    an ``SRC_IN`` free equal to the tree's own slot at its position
    (``out[pos]``, the path the insert wrote) is the same KV, not a duplicate,
    and is kept.

    Returns the Full slots freed, concatenated in row order (int64, owned): what
    the caller frees itself when no allocator is attached.
    """
    full = []
    for row in rows:
        kind = int(row[A.ACT_KIND])
        if kind == A.A_STORED:
            if sink is not None:
                sink.stored(int(row[A.ACT_OFF]))
        elif kind == A.A_REMOVED:
            if sink is not None:
                sink.removed(int(row[A.ACT_OFF]), int(row[A.ACT_LEN]))
        elif kind in (A.A_FREE_KV, A.A_FREE_KV_FULL_ONLY, A.A_FREE_SLOT):
            v = _values(row, out, value_in)
            if keep_own and int(row[A.ACT_SRC]) == A.SRC_IN and v.size:
                off = int(row[A.ACT_OFF])
                own = v == out[off:off + v.size]
                if own.any():
                    v = v[~own]
            full.append(v)
        else:
            raise AssertionError(f"unhandled action kind {kind}")
    if not full:
        return _EMPTY
    freed = np.concatenate(full) if len(full) > 1 else full[0].copy()
    vals.free(freed)
    return freed
