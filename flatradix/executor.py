"""The executor: turns a kernel's action rows into allocator frees and KV events.

"The tree decides, the cache executes" (SGLang 0.5.23 ``cache_action.py``): every
mutating kernel appends rows to the action buffer (``kernels/actions.py``) and
the controller runs them right after the call, before anything else touches
the tree (pool rows named by ``A_REMOVED`` are intact until then). Rows run in
order. Frees are batched per pool -- one call for the SWA peers, then one for
the Full slots -- which keeps each pool's free order: SGLang frees a slot's SWA
peer before or after its Full slot, and neither free reads what the other
writes (the Full free never touches the mapping). The one action that reads
the mapping, ``A_SWA_RECOVER_LOCKED``, only touches slots no pending free holds.

The executor runs no kernel. The two *barrier* rows, ``A_BACKUP`` and
``A_PATH_CAP`` (an insert's backups and its Mamba per-path cap, which SGLang
runs at their place among the insert's actions), are the controller's: it cuts
the rows at them (``segments``), runs each segment here and the barrier itself
in between (the host tier's ``run_barrier``).
"""

import numpy as np

from .kernels import actions as A
from .kernels.layout import FULL, MAMBA, N_COMPONENTS, SWA

_EMPTY = np.empty(0, dtype=np.int64)
#: The row kinds the controller runs itself, between segments.
BARRIERS = (A.A_BACKUP, A.A_PATH_CAP)


def _cat(parts):
    if not parts:
        return _EMPTY
    return np.concatenate(parts) if len(parts) > 1 else parts[0].copy()


assert (A.ACT_KIND, A.ACT_COMP, A.ACT_SRC, A.ACT_OFF, A.ACT_LEN, A.ACT_AUX,
        A.ACT_NCOL) == (0, 1, 2, 3, 4, 5, 6), "the executor unpacks the action columns in this order"


def segments(rows):
    """``rows`` cut after each barrier row: a list of ``(segment, barrier)`` pairs
    (``barrier``: that row as a tuple ``(kind, comp, src, off, len, aux)``, None after
    the last segment). ``rows`` must be a copy when the barriers make engine calls."""
    kinds = rows[:, A.ACT_KIND]
    at = np.flatnonzero((kinds == A.A_BACKUP) | (kinds == A.A_PATH_CAP)).tolist()
    out = []
    start = 0
    for i in at:
        out.append((rows[start:i], tuple(rows[i].tolist())))
        start = i + 1
    out.append((rows[start:], None))
    return out


class Executor:
    """Runs action rows for one cache: ``vals`` (the ``ValueBridge``: allocator
    frees), ``sink`` (the ``EventSink`` or None), and ``host_pools``, the host
    pools indexed by component (``HostKVPool``; None without that pool: set by the
    host tier)."""

    def __init__(self, vals, sink):
        self.vals = vals
        self.sink = sink
        self.host_pools = [None] * N_COMPONENTS

    def run(self, rows, out, value_in=None, *, free=True, collect=None, keep_own=False,
            adopted=None, pre=None):
        """Execute ``rows`` (int64 ``(k, ACT_NCOL)``, e.g. ``Engine.actions()``).

        ``out``: the call's ``out`` scratch; ``value_in``: the call's input value
        array (``SRC_IN`` rows), or None. ``free`` False: no device slot is freed
        (a step-wise round: the controller frees them); the Full slots are
        returned as always, the other components' go to ``collect[c]`` (a list per
        component, each gathering int64 arrays: SWA the Full slots whose SWA peers
        the caller frees, MAMBA the state slots). ``keep_own`` (request path): a
        slot of an ``SRC_IN`` free equal to the tree's own slot at its position
        (``out[pos]``, the path the insert wrote) is the same KV, not a duplicate,
        and is kept. ``adopted``: a dict ``{component: [(start, end), ...]}`` that
        ``A_ADOPTED`` reports are added to (coalesced as SGLang's
        ``record_adopted_range``). ``A_FREE_HOST`` rows go to ``host_pools[comp]``
        (an ``AssertionError`` when that pool is absent: a host slot is never
        dropped); a barrier row is an ``AssertionError`` (``segments``). Event rows
        carry their medium (``A_STORED`` / ``A_REMOVED`` ``aux``).

        Returns the Full slots freed, concatenated in row order (int64, owned):
        what the caller frees itself when no allocator is attached.

        Device values (``vals.dev``): ``value_in`` is the call's device input,
        the Full values of ``SRC_OUT`` rows are pool rows gathered from the
        arena (``pre``: ``prepare``'s gathers, made before the call's input was
        written into the arena; made here when None), frees hand the allocator
        device arrays and the return value is one.
        """
        if self.vals.dev is not None:
            return self._run_device(rows, out, value_in, free, collect, keep_own, adopted, pre)
        if rows.shape[0] == 0:
            return _EMPTY
        sink = self.sink
        vals = self.vals if free else None
        per = [[] for _ in range(N_COMPONENTS)]   # device slots to free, per component
        host_frees = {}   # component -> its slots: one free per host pool and call
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
            if kind == A.A_ADOPTED:
                if adopted is not None:
                    _adopt(adopted, comp, off, off + n)
                continue
            if kind in BARRIERS:
                raise AssertionError(f"barrier row {kind} given to Executor.run (cut the rows "
                                     "with executor.segments)")
            v = value_in[off:off + n] if src == A.SRC_IN else out[off:off + n]
            if kind == A.A_SWA_RECOVER_LOCKED:
                incoming = value_in[aux:aux + n]
                if vals is not None:
                    vals.swa_recover_locked(v, incoming)
                per[FULL].append(incoming)
                continue
            if keep_own and src == A.SRC_IN and v.size:
                own = v == out[off:off + v.size]
                if own.any():
                    v = v[~own]
            if kind == A.A_FREE_KV:
                if vals is not None and vals.swa:
                    per[SWA].append(v)
                per[FULL].append(v)
            elif kind == A.A_FREE_KV_FULL_ONLY:
                per[FULL].append(v)
            elif kind == A.A_FREE_HOST:
                if self.host_pools[comp] is None:
                    raise AssertionError(f"A_FREE_HOST of component {comp} with no host pool")
                host_frees.setdefault(comp, []).append(v)
            elif kind == A.A_FREE_SLOT:
                per[comp].append(v)
            else:
                raise AssertionError(f"unhandled action kind {kind}")
        return self._flush(per, host_frees, vals, collect, _cat, _EMPTY)

    def _flush(self, per, host_frees, vals, collect, cat, empty):
        """The end of a run: free the host slots (one call per host pool), the
        device slots through ``vals`` (None: ``free=False``, the non-Full ones go
        to ``collect``); ``cat`` / ``empty`` build the arrays (numpy, or device
        arrays with device values). Returns the Full slots freed."""
        for comp, parts in host_frees.items():
            self.host_pools[comp].free(np.concatenate(parts) if len(parts) > 1 else parts[0])
        freed_full = cat(per[FULL])
        if vals is not None:
            vals.free_split(freed_full, cat(per[SWA]) if per[SWA] else empty)
            if per[MAMBA]:
                vals.free_mamba(cat(per[MAMBA]))
        else:
            for comp in range(N_COMPONENTS):
                if comp != FULL and per[comp]:
                    if collect is None:
                        raise AssertionError(f"component {comp}'s slots freed with free=False "
                                             "and nowhere to collect them")
                    collect[comp].append(cat(per[comp]))
        return freed_full


    # ------------------------------------------------------------------ device values
    def prepare(self, rows, out):
        """Device values: gather, in one arena gather, the Full values every
        ``SRC_OUT`` row of ``rows`` names (pool rows in ``out``), before the call's
        input is written into the arena (an SWA recovery frees the rows it then
        overwrites). Returns ``{(off, len): device array}`` for ``run(pre=)``."""
        want = []
        for kind, comp, src, off, n, aux in rows.tolist():
            if src == A.SRC_OUT and n and kind in _DEVICE_KINDS and comp != MAMBA:
                want.append((off, n))
        if not want:
            return {}
        dev = self.vals.dev
        if len(want) == 1:
            off, n = want[0]
            return {(off, n): dev.take(out[off:off + n])}
        rows_at = np.concatenate([out[off:off + n] for off, n in want])
        g = dev.take(rows_at)
        got = {}
        at = 0
        for off, n in want:
            got[(off, n)] = g[at:at + n]
            at += n
        return got

    def _run_device(self, rows, out, value_in, free, collect, keep_own, adopted, pre):
        dev = self.vals.dev
        if rows.shape[0] == 0:
            return dev.empty()
        if pre is None:
            pre = self.prepare(rows, out)
        sink = self.sink
        vals = self.vals if free else None
        per = [[] for _ in range(N_COMPONENTS)]
        host_frees = {}
        for kind, comp, src, off, n, aux in rows.tolist():
            if kind == A.A_STORED:
                if sink is not None:
                    sink.stored(off, aux)
                continue
            if kind == A.A_REMOVED:
                if sink is not None:
                    sink.removed(off, n, aux)
                continue
            if kind == A.A_ADOPTED:
                if adopted is not None:
                    _adopt(adopted, comp, off, off + n)
                continue
            if kind in BARRIERS:
                raise AssertionError(f"barrier row {kind} given to Executor.run (cut the rows "
                                     "with executor.segments)")
            if kind == A.A_FREE_HOST:   # host slots: host values as ever
                if self.host_pools[comp] is None:
                    raise AssertionError(f"A_FREE_HOST of component {comp} with no host pool")
                host_frees.setdefault(comp, []).append(
                    value_in[off:off + n] if src == A.SRC_IN else out[off:off + n])
                continue
            if comp == MAMBA or kind == A.A_SWA_RECOVER_LOCKED:
                raise AssertionError("device values serve Full-attention caches: action "
                                     f"{A.ACTION_NAMES.get(kind, kind)} of component {comp}")
            if src == A.SRC_IN:
                v = value_in[off:off + n]
                if keep_own and n:
                    # a duplicate equal to the tree's own slot would be freed while
                    # the tree holds it: checked on the device (no host read)
                    tree = pre.get(("path", off, n))
                    if tree is None:
                        tree = dev.take(out[off:off + n])
                    dev.record_none_equal(v, tree, "request row (req_to_token_pool)")
                    # the request path rewrites the row (the tree's slots) after this
                    # call: the allocator gets a copy, not a view of the row
                    v = dev.ops.clone(v)
            elif n:
                v = pre[(off, n)]
            else:
                continue
            if kind == A.A_FREE_KV:
                if vals is not None and vals.swa:
                    per[SWA].append(v)
                per[FULL].append(v)
            elif kind == A.A_FREE_KV_FULL_ONLY:
                per[FULL].append(v)
            elif kind == A.A_FREE_SLOT:
                per[comp].append(v)
            else:
                raise AssertionError(f"unhandled action kind {kind}")
        return self._flush(per, host_frees, vals, collect, dev.cat, dev.empty())


#: action kinds whose values are Full device values (pool rows with device values on)
_DEVICE_KINDS = (A.A_FREE_KV, A.A_FREE_KV_FULL_ONLY, A.A_FREE_SLOT, A.A_SWA_RECOVER_LOCKED)


def _adopt(adopted, comp, start, end):
    if start >= end:
        return
    ranges = adopted.setdefault(comp, [])
    if ranges and start <= ranges[-1][1]:
        lo, hi = ranges[-1]
        ranges[-1] = (min(lo, start), max(hi, end))
    else:
        ranges.append((start, end))
