"""The executor: turns a kernel's action rows into allocator frees and KV events.

"The tree decides, the cache executes" (SGLang 0.5.23 ``cache_action.py``): every
mutating kernel appends rows to the action buffer (``kernels/actions.py``) and
the façade calls ``execute`` right after it, before anything else touches the
tree (pool rows named by ``A_REMOVED`` are intact until then). Rows run in
order. Frees are batched per pool -- one call for the SWA peers, then one for
the Full slots -- which keeps each pool's free order: SGLang frees a slot's SWA
peer before or after its Full slot, and neither free reads what the other
writes (the Full free never touches the mapping). The one action that reads
the mapping, ``A_SWA_RECOVER_LOCKED``, only touches slots no pending free holds.
"""

import numpy as np

from .kernels import actions as A
from .kernels.layout import MAMBA, SWA

_EMPTY = np.empty(0, dtype=np.int64)


def _cat(parts):
    if not parts:
        return _EMPTY
    return np.concatenate(parts) if len(parts) > 1 else parts[0].copy()


assert (A.ACT_KIND, A.ACT_COMP, A.ACT_SRC, A.ACT_OFF, A.ACT_LEN, A.ACT_AUX,
        A.ACT_NCOL) == (0, 1, 2, 3, 4, 5, 6), "execute unpacks the action columns in this order"


def execute(rows, out, value_in, vals, sink, keep_own=False, adopted=None, mamba_out=None,
            host=None, backups=None, host_mamba=None, path_cap=None, host_swa=None,
            swa_out=None):
    """Execute ``rows`` (int64 ``(k, ACT_NCOL)``, a view of the engine's ``acts``).

    ``out``: the call's ``out`` scratch; ``value_in``: the call's input value
    array (``SRC_IN`` rows), or None; ``vals``: the ``ValueBridge`` (allocator)
    or None to free nothing (the caller frees); ``sink``: the ``EventSink`` or
    None. ``keep_own`` (request path): a slot of an ``SRC_IN`` free equal to the
    tree's own slot at its position (``out[pos]``, the path the insert wrote)
    is the same KV, not a duplicate, and is kept. ``adopted``: a dict
    ``{component: [(start, end), ...]}`` that ``A_ADOPTED`` reports are added to
    (coalesced as SGLang's ``record_adopted_range``). ``mamba_out``: a list the
    Mamba state slots freed are appended to when ``vals`` is None (a step-wise
    round: the controller frees them); with ``vals`` they go to its Mamba
    allocator. ``swa_out``: the same for the Full slots of ``A_FREE_SLOT(SWA)``
    rows (whose SWA peers the controller frees).

    ``host``: the host pool (``flatradix.hicache.HostKVPool``) Full ``A_FREE_HOST`` rows are
    freed to (host eviction), ``host_mamba`` the Mamba host state pool (Mamba rows),
    ``host_swa`` the SWA host pool (SWA rows); a row whose pool is not given is an error
    (``AssertionError``: a host slot is never dropped); ``backups``: called with the node
    slot of each ``A_BACKUP`` row when the row is reached (the façade backs the node up
    there, as SGLang's insert does at that barrier; it makes engine calls, so ``out`` must
    then be a copy); ``path_cap``: called with the node slot of an ``A_PATH_CAP`` row (the
    façade runs the Mamba per-path cap there). Event rows carry their medium (``A_STORED`` /
    ``A_REMOVED`` ``aux``).

    Returns the Full slots freed, concatenated in row order (int64, owned): what
    the caller frees itself when no allocator is attached.
    """
    if rows.shape[0] == 0:
        return _EMPTY
    full = []
    swa = []
    mamba = None
    host_frees = {}   # component -> (its host pool, its slots): one free per pool and call
    # one tolist() instead of per-field numpy scalar reads (column order: actions.ACT_*)
    for kind, comp, src, off, n, aux in rows.tolist():
        if kind == A.A_STORED:
            if sink is not None:
                sink.stored(off, aux)
            continue
        if kind == A.A_REMOVED:
            if sink is not None:
                sink.removed(off, n, aux)
            continue
        if kind == A.A_BACKUP:
            if backups is not None:  # run now: its events fall at the walk's position
                backups(off, aux)
            continue
        if kind == A.A_PATH_CAP:
            if path_cap is None:
                raise AssertionError("A_PATH_CAP row with no path_cap callable given")
            path_cap(off)
            continue
        if kind == A.A_ADOPTED:
            if adopted is not None:
                _adopt(adopted, comp, off, off + n)
            continue
        v = value_in[off:off + n] if src == A.SRC_IN else out[off:off + n]
        if kind == A.A_SWA_RECOVER_LOCKED:
            incoming = value_in[aux:aux + n]
            if vals is not None:
                vals.swa_recover_locked(v, incoming)
            full.append(incoming)
            continue
        if keep_own and src == A.SRC_IN and v.size:
            own = v == out[off:off + v.size]
            if own.any():
                v = v[~own]
        if kind == A.A_FREE_KV:
            if vals is not None and vals.swa:
                swa.append(v)
            full.append(v)
        elif kind == A.A_FREE_KV_FULL_ONLY:
            full.append(v)
        elif kind == A.A_FREE_HOST:
            if comp not in host_frees:
                pool = host_mamba if comp == MAMBA else host_swa if comp == SWA else host
                if pool is None:
                    raise AssertionError(f"A_FREE_HOST of component {comp} with no host pool "
                                         "given")
                host_frees[comp] = (pool, [])
            host_frees[comp][1].append(v)
        elif kind == A.A_FREE_SLOT:
            if comp == MAMBA:  # state slots: their own pool
                if mamba is None:
                    mamba = []
                mamba.append(v)
            else:
                (swa if comp == SWA else full).append(v)
        else:
            raise AssertionError(f"unhandled action kind {kind}")
    for pool, parts in host_frees.values():
        pool.free(np.concatenate(parts) if len(parts) > 1 else parts[0])  # (copies them)
    freed_full = _cat(full)
    if vals is not None:
        vals.free_split(freed_full, _cat(swa) if swa else _EMPTY)
        if mamba is not None:
            vals.free_mamba(_cat(mamba))
    else:
        if mamba is not None and mamba_out is not None:
            mamba_out.append(_cat(mamba))
        if swa and swa_out is not None:
            swa_out.append(_cat(swa))
    return freed_full


def _adopt(adopted, comp, start, end):
    if start >= end:
        return
    ranges = adopted.setdefault(comp, [])
    if ranges and start <= ranges[-1][1]:
        lo, hi = ranges[-1]
        ranges[-1] = (min(lo, start), max(hi, end))
    else:
        ranges.append((start, end))

