"""The engine: the tree's state arrays, their growth, namespaces, and the one way to call a kernel.

``Engine`` owns every array the kernels mutate (``TreeArrays``: ``nodes, ctab,
pool, heap, meta``, in the order every entry kernel takes them first) and the
two scratch outputs (``out``, ``acts``). Every entry kernel is called through
``Engine.k`` (one callable per kernel, by the kernel's name), which passes the
engine's arrays the kernel takes and, for a kernel whose ``E_CAPACITY`` means
"nothing changed", grows what it reports too small (``meta[M_NEED_*]``) and
calls again: growth and retry live here only. Nothing here knows the public
API: the façade (``flatradix.cache``) validates, calls the engine, and hands the
actions to the executor (``flatradix.executor``); an SGLang TreeCore adapter
drives the same calls (``docs/architecture.md``, "The core API"). See
``kernels/layout.py`` for the arrays' layout.
"""

import operator
from functools import partial
from typing import NamedTuple

import numpy as np

from . import _numba_env  # noqa: F401  (must precede the kernels: cache directory)
# every entry kernel module (each registers its kernels in ``_jit.SPECS``)
from .core import (check, devvals, evict, host, host_evict, insert, lock, match,  # noqa: F401
                   pick, query, refill)
from .components.dispatch import meta_array
from .kernels import hashing  # noqa: F401
from .kernels import layout as L
from .kernels._jit import SPECS, STATE
from .kernels.actions import ACT_NCOL
from .kernels.children import rebuild_children as _k_rebuild_children
from .kernels.state import compact_pool as _k_compact
from .kernels.state import pool_gaps as _k_pool_gaps
from .kernels.state import reset_tree as _k_reset

#: most entries per row the batch-match scratch keeps between calls (2 rows: 32 MiB)
BATCH_KEEP = 1 << 21
#: initial length of the ``out`` scratch and rows of ``acts`` (both grown on demand)
OUT_MIN = 1024
#: a gap pass starts only when the gaps it can use hold this share of the pool
GAP_PASS_MIN = 0.25
ACTS_MIN = 64


class TreeArrays(NamedTuple):
    """The five tree arrays, in the order every entry kernel takes them first.

    ``nodes`` int64 ``(node_capacity, NCOL)``, ``ctab`` int64 ``(2^k, CT_NCOL)``,
    ``pool`` int64 ``(pool_capacity, POOL_NCOL[_EVENTS])``, ``heap`` int64
    ``(HEAP_ROWS, node_capacity)``, ``meta`` int64 ``(META_LEN,)``. Rebuilt (a new
    tuple) whenever an array is replaced by a larger one.
    """

    nodes: np.ndarray
    ctab: np.ndarray
    pool: np.ndarray
    heap: np.ndarray
    meta: np.ndarray


def aligned_zeros(rows, cols, align=64):
    """A zeroed C-contiguous int64 ``(rows, cols)`` array whose data starts on an
    ``align``-byte boundary (a view into a slightly larger buffer), so node-table
    rows (NCOL * 8 bytes) and child-table rows (32 bytes) never straddle cache
    lines more than their size needs (``kernels/layout.py``: column order)."""
    n = rows * cols
    buf = np.zeros(n + align // 8, dtype=np.int64)
    skip = (-buf.ctypes.data % align) // 8
    return buf[skip:skip + n].reshape(rows, cols)


def ct_capacity_for(nslots):
    """Power-of-two child-table size that keeps ``nslots`` entries under the load limit."""
    cap = 16
    while cap * L.CT_MAX_LOAD < nslots + 2:
        cap *= 2
    return cap


def node_id(nodes, slot):
    """The NodeId of the live node in ``slot``: ``GEN << 32 | slot`` (``kernels/state.node_id``)."""
    return (int(nodes[slot, L.GEN]) << 32) | int(slot)


def slot_of(nid):
    """The slot part of a NodeId."""
    return nid & 0xFFFFFFFF


class Namespaces:
    """``(extra_key, cache_salt)`` tuples interned to the int ids of column ``NS``.

    Ids come from a counter and are never reused, so a match that looked an id
    up without the lock can at worst miss (the namespace was dropped and
    re-interned meanwhile), never see another namespace's nodes. Entries no
    live node uses are dropped once the map reaches ``gc_at`` (O(slots),
    amortised O(1) per new namespace; the façade runs it after a successful
    insert), so per-request salts do not grow it without bound. Namespaces are
    compared as tuples, never concatenated (``known_bugs.md`` B5).
    """

    def __init__(self):
        self.ids = {(None, None): 0}
        self._keys = {0: (None, None)}
        self._next = 1
        self.gc_at = 1024

    def get(self, nk):
        """Id of ``nk`` or None (never creates)."""
        return self.ids.get(nk)

    def intern(self, nk):
        """Id of ``nk``, creating it."""
        ns = self.ids.get(nk)
        if ns is None:
            ns = self._next
            self._next += 1
            self.ids[nk] = ns
            self._keys[ns] = nk
        return ns

    def forget(self, nk):
        """Drop ``nk`` again (an insert that created it was refused)."""
        ns = self.ids.pop(nk)
        del self._keys[ns]

    def key_of(self, ns):
        """The ``(extra_key, cache_salt)`` of id ``ns``."""
        return self._keys[ns]

    def gc(self, used, hwm, dropped=None):
        """Drop every namespace whose id is not in ``used`` (the live nodes' ids);
        ``dropped(nk)`` is called for each. Sets the next threshold."""
        used = set(used)
        used.add(0)
        for nk, ns in list(self.ids.items()):
            if ns not in used:
                del self.ids[nk]
                del self._keys[ns]
                if dropped is not None:
                    dropped(nk)
        n = len(self.ids)
        self.gc_at = n + max(1024, n, hwm // 4)


class Engine:
    """The tree's arrays and the call-and-grow helper.

    Parameters (all validated by the façade): ``page_size``; ``policy`` (an index
    of ``POLICY_NAMES``) and its two parameters; ``components`` (``C_*`` bit
    set); ``swa_window`` (units; 0 without SWA); ``mamba_path_cap``
    (``mamba_max_states_per_path``, -1: off); ``events`` / ``bigram``
    flags; initial ``node_capacity`` / ``pool_capacity``.

    Growth is amortised O(1): arrays double (the pool only when more than 3/4 of
    it would be live; otherwise its dead rows are reused by a gap pass, or by an
    in-place compaction) only after a kernel answered ``E_CAPACITY``, so the fast
    path pays no capacity check in Python. Not thread-safe by itself (the
    façade holds its lock around every call).
    """

    def __init__(self, *, page_size, policy, policy_a=0, policy_b=0, components=L.C_FULL,
                 swa_window=0, mamba_path_cap=-1, events=False, bigram=False,
                 node_capacity=1024, pool_capacity=1 << 16):
        self.events = bool(events)
        self.ns = Namespaces()
        ncap = max(node_capacity, L.FIRST_SLOT + 8)
        self.pool_ncol = L.POOL_NCOL_EVENTS if self.events else L.POOL_NCOL
        nodes = aligned_zeros(ncap, L.NCOL)
        heap = np.full((L.HEAP_ROWS, ncap), -1, dtype=np.int64)
        ctab = aligned_zeros(ct_capacity_for(ncap), L.CT_NCOL)
        pool = np.zeros((max(64, pool_capacity), self.pool_ncol), dtype=np.int64)
        meta = meta_array(components)   # its type says whether components compile
        meta[L.M_EVENTS] = int(self.events)
        meta[L.M_BIGRAM] = int(bigram)
        meta[L.M_CLOCK] = L.TICK
        meta[L.M_PAGE] = page_size
        meta[L.M_POLICY] = policy
        meta[L.M_POLICY_A] = policy_a
        meta[L.M_POLICY_B] = policy_b
        meta[L.M_COMPONENTS] = components
        meta[L.M_SWA_WINDOW] = swa_window
        meta[L.M_MAMBA_PATH_CAP] = mamba_path_cap
        meta[L.M_SWA_UUID_NEXT] = 1
        self.out = np.zeros(OUT_MIN, dtype=np.int64)
        self.acts = np.zeros((ACTS_MIN, ACT_NCOL), dtype=np.int64)
        self.k = _Kernels()
        self.st = TreeArrays(nodes, ctab, pool, heap, meta)
        self.batch = np.zeros((2, 0), dtype=np.int64)  # match_prefix_batch: keys, indices
        self.root = int(_k_reset(nodes, ctab, meta))
        self._gaps, self._gap_i = None, 0  # the gap pass under way (``_next_gap``)
        # counters for tests and benchmarks: gap passes started, in-place compactions
        # (a doubling's copy into a new array is not counted)
        self.gap_passes = self.compactions = 0
        #: called with the engine after the pool's rows moved (a compaction, in
        #: place or into a doubled pool): the device value arena follows them
        #: (``device.DeviceValues.pool_moved``); None without one
        self.on_pool_moved = None

    @property
    def st(self):
        """The tree arrays (``TreeArrays``); replaced, never resized in place, by a growth."""
        return self._st

    @st.setter
    def st(self, arrays):
        self._st = arrays
        self.k.bind(self)

    @property
    def meta(self):
        return self._st.meta

    def enable_host(self, policy, threshold):
        """Turn the host tier on (HiCache): the pool gains its last column, the
        Full host values (``kernels/layout.py``; on an SWA cache the SWA host
        values before it), and ``meta`` the write policy and the write-through
        hit threshold. Existing nodes stay device-only."""
        st = self.st
        if st.meta[L.M_HOST] == L.HOST_OFF:
            extra = 2 if st.meta[L.M_COMPONENTS] & L.C_SWA else 1
            pool = np.zeros((st.pool.shape[0], self.pool_ncol + extra), dtype=np.int64)
            # only the rows in use: the rest stay untouched (not resident) in both
            top = int(st.meta[L.M_POOL_TOP])
            pool[:top, :self.pool_ncol] = st.pool[:top]
            self.pool_ncol += extra
            self.st = st = TreeArrays(st.nodes, st.ctab, pool, st.heap, st.meta)
        st.meta[L.M_HOST] = policy
        st.meta[L.M_WT_THRESHOLD] = threshold

    def reset(self):
        """Drop the tree (every id goes stale); returns the new root's NodeId."""
        st = self.st
        self.root = int(_k_reset(st.nodes, st.ctab, st.meta))
        self._gaps = None
        return self.root

    # ------------------------------------------------------------------ calls
    def actions(self):
        """The rows the last call wrote to ``acts`` (a view, valid until the next call)."""
        return self.acts[:int(self.st.meta[L.M_NACTS])]

    # ------------------------------------------------------------------ growth
    def grow(self):
        """Grow what the last ``E_CAPACITY`` answer asked for (``meta[M_NEED_*]``)."""
        meta = self.st.meta
        slots, units = int(meta[L.M_NEED_SLOTS]), int(meta[L.M_NEED_UNITS])
        self.ensure_out(int(meta[L.M_NEED_OUT]))
        self.ensure_acts(int(meta[L.M_NEED_ACTS]))
        if slots or units:
            self.grow_tree(slots, units)
        meta[L.M_NEED_SLOTS] = meta[L.M_NEED_UNITS] = 0
        meta[L.M_NEED_OUT] = meta[L.M_NEED_ACTS] = 0

    def grow_tree(self, slots, units):
        """Make room for ``slots`` new nodes (and child-table entries) and ``units``
        pool rows: doubles the node table / heap, rebuilds the child table (purging
        tombstones); for the pool, the next gap of the pass under way, else a
        doubling (live + ``units`` above 3/4 of it), a new gap pass, or an
        in-place compaction."""
        nodes, ctab, pool, heap, meta = self.st
        ncap = nodes.shape[0]
        if meta[L.M_NFREE] + ncap - meta[L.M_HWM] < slots:
            new_cap = ncap * 2
            while meta[L.M_NFREE] + new_cap - meta[L.M_HWM] < slots:
                new_cap *= 2
            new = aligned_zeros(new_cap, L.NCOL)
            new[:ncap] = nodes
            nodes = new
            new_heap = np.full((L.HEAP_ROWS, new_cap), -1, dtype=np.int64)
            new_heap[:, :ncap] = heap
            heap = new_heap
        ccap = ctab.shape[0]
        # headroom: after a rebuild live entries fill at most ~2/3 of the allowed
        # load, so the next rebuild is >= cap/5 operations away (amortised O(1))
        need_ct = ct_capacity_for(int(meta[L.M_NLIVE]) * 3 // 2 + slots)
        if (need_ct > ccap or (meta[L.M_CT_LIVE] + meta[L.M_CT_TOMB] + slots) * L.CT_LOAD_DEN
                > ccap * L.CT_LOAD_NUM):
            ctab = aligned_zeros(max(need_ct, ccap), L.CT_NCOL)
            ctab[:, L.CT_CHILD] = L.CT_EMPTY
            _k_rebuild_children(nodes, ctab, pool, meta)
        pcap = pool.shape[0]
        moved = False
        if units and not self._pool_room(units) and not self._next_gap(units):
            live = int(meta[L.M_POOL_TOP]) - int(meta[L.M_POOL_DEAD])
            new_cap = pcap
            while live + units > new_cap // 2 and live + units > new_cap - new_cap // 4:
                new_cap *= 2
            if new_cap != pcap:
                new_pool = np.zeros((new_cap, self.pool_ncol), dtype=np.int64)
                _k_compact(nodes, pool, new_pool, meta)
                pool = new_pool
                moved = True
            elif not self._start_gap_pass(nodes, pcap, units):
                _k_compact(nodes, pool, pool, meta)  # in place (no allocation)
                self.compactions += 1
                moved = True
        self.st = TreeArrays(nodes, ctab, pool, heap, meta)
        if moved and self.on_pool_moved is not None:
            self.on_pool_moved(self)

    # ------------------------------------------------------------------ gap passes
    # Appending at the top and compacting when the pool is full copies every live
    # span each time the top comes round, all in one call (3-5 ms on a 2M-row
    # pool). An eviction-heavy workload (LRU: the oldest spans die first) leaves
    # most dead rows in long runs, so instead the cursor walks through the dead
    # gaps a scan found (``pool_gaps``), placing each new span in the next gap
    # that holds it (next fit; a gap too short for the span waits for the next
    # pass or compaction). Only when the gaps are too few to be worth a pass
    # does the pool compact.

    def _pool_room(self, units):
        """``state.has_room``'s pool test: ``units`` rows free at the cursor."""
        meta = self.st.meta
        lim = int(meta[L.M_POOL_LIM]) or self.st.pool.shape[0]
        return int(meta[L.M_POOL_CUR]) + units <= lim

    def _next_gap(self, units):
        """Move the cursor to the next scanned gap of at least ``units`` rows;
        False (the pass over) when none is left."""
        gaps = self._gaps
        if gaps is None:
            return False
        i = self._gap_i
        while i < gaps.shape[0]:
            start, end = int(gaps[i, 0]), int(gaps[i, 1])
            i += 1
            if end - start >= units:
                self._gap_i = i
                meta = self.st.meta
                meta[L.M_POOL_CUR] = start
                meta[L.M_POOL_LIM] = end
                return True
        self._end_gap_pass()
        return False

    def _end_gap_pass(self):
        """Back to appending on top (``state.cursor_on_top``)."""
        self._gaps = None
        meta = self.st.meta
        meta[L.M_POOL_CUR] = meta[L.M_POOL_TOP]
        meta[L.M_POOL_LIM] = 0

    def _start_gap_pass(self, nodes, pcap, units):
        """Scan the dead gaps and start a pass when those holding ``units`` rows
        or more add up to at least ``GAP_PASS_MIN`` of the pool; False (the caller
        compacts) otherwise."""
        meta = self.st.meta
        gaps = np.empty(2 * (int(meta[L.M_NLIVE]) + 1), dtype=np.int64)
        k, rows = _k_pool_gaps(nodes, meta, pcap, units, gaps)
        if rows < pcap * GAP_PASS_MIN:
            return False
        self._gaps, self._gap_i = gaps[:2 * k].reshape(k, 2), 0
        self.gap_passes += 1
        return self._next_gap(units)

    def batch_buffers(self, n):
        """Two int64 scratch rows of ``n`` entries for ``match_prefix_batch`` (the
        queue's keys back to back, and the indices the kernel writes), kept and
        reused while ``n`` <= ``BATCH_KEEP`` so a scheduler scoring its queue every
        step touches warm pages instead of faulting in fresh ones; larger queues
        get fresh arrays that are dropped after the call."""
        if n > BATCH_KEEP:
            return np.empty((2, n), dtype=np.int64)
        if self.batch.shape[1] < n:
            self.batch = np.zeros((2, max(n, 2 * self.batch.shape[1])), dtype=np.int64)
        return self.batch

    def ensure_out(self, n):
        """Make ``out`` hold at least ``n`` entries. It is sized by what calls need
        (a key's length, an eviction's victims), never by the pool: it doubles on
        demand, so it stays small."""
        if self.out.shape[0] < n:
            self.out = np.empty(max(n, 2 * self.out.shape[0]), dtype=np.int64)

    def ensure_acts(self, rows):
        if self.acts.shape[0] < rows:
            self.acts = np.zeros((max(rows, 2 * self.acts.shape[0]), ACT_NCOL), dtype=np.int64)

    # ------------------------------------------------------------------ reading
    def live_slots(self):
        """Slots of the live nodes (root included), ascending."""
        nodes, meta = self.st.nodes, self.st.meta
        hwm = int(meta[L.M_HWM])
        return np.nonzero((nodes[:hwm, L.FLAGS] & L.F_ALIVE) != 0)[0]

    def gc_namespaces(self, dropped=None):
        """Drop the namespaces no live node is in (their ids are never reissued)."""
        used = np.unique(self.st.nodes[self.live_slots(), L.NS]).tolist()
        self.ns.gc(used, int(self.st.meta[L.M_HWM]), dropped)

    def snapshot(self):
        """Copy of the whole state, for "unchanged after an error" tests."""
        return {name: arr.copy() for name, arr in self.st._asdict().items()} | {
            "ns": dict(self.ns.ids), "root": self.root}


_PICK = {name: i for i, name in enumerate(STATE)}
E_CAPACITY = L.E_CAPACITY


class _Kernels:
    """``Engine.k``: the entry kernels, one attribute per kernel name, each called
    with the caller's arguments only (``eng.k.inc_lock_ref(nid, skip)``).

    A kernel never answering ``E_CAPACITY`` and taking no scratch is a
    ``functools.partial`` over the engine's current arrays (no Python frame on the
    hot path; rebound whenever ``Engine.st`` is replaced). The others read the
    arrays at each call: a ``"retry"`` kernel is called again after
    ``Engine.grow()`` until it answers something else (the caller never sees
    ``E_CAPACITY``), a ``"resume"`` kernel returns its ``E_CAPACITY`` to the caller
    (which executes the call's actions, calls ``Engine.grow()`` and calls again).
    The engine's own kernels over arrays it is building (``state.reset_tree``,
    ``state.compact_pool``, ``state.pool_gaps``, ``children.rebuild_children``) are
    called by the engine itself. A pool kernel (``kernels/slots.py``: no tree array)
    is not here."""

    _partials = None

    def bind(self, eng):
        """(Re)bind to ``eng``'s current arrays: every kernel the first time, the
        partials after (the closures read the arrays at each call)."""
        if self._partials is None:
            self._partials = []
            for k, spec in SPECS.items():
                if not spec.state or spec.engine_only:
                    continue
                if hasattr(self, spec.name):
                    raise RuntimeError(f"two entry kernels named {spec.name}")
                setattr(self, spec.name, _caller(eng, k, spec))
                if spec.on_capacity is None and not spec.scratch:
                    self._partials.append((k, spec))
            return
        for k, spec in self._partials:
            setattr(self, spec.name, _caller(eng, k, spec))


def _caller(eng, k, spec):
    if spec.on_capacity is None and not spec.scratch:
        st = eng.st
        arrays = st if spec.state == STATE else tuple(st[_PICK[n]] for n in spec.state)
        return partial(k, *arrays)
    if spec.state != STATE:
        pick = operator.itemgetter(*(_PICK[n] for n in spec.state))
        if len(spec.state) == 1:
            pick1 = pick
            pick = lambda t: (pick1(t),)  # noqa: E731
    else:
        pick = None
    retry = spec.on_capacity == "retry"
    sc = spec.scratch
    grow = eng.grow
    # (one closure per shape, so a call costs one Python frame and no lookups)
    if pick is None and sc == ("out", "acts"):
        def call(*args):
            while True:
                r = k(*eng._st, *args, eng.out, eng.acts)
                if not retry or r[0] != E_CAPACITY:
                    return r
                grow()
    elif pick is None and sc == ("out",):
        def call(*args):
            while True:
                r = k(*eng._st, *args, eng.out)
                if not retry or r[0] != E_CAPACITY:
                    return r
                grow()
    elif pick is None and not sc:
        def call(*args):
            while True:
                r = k(*eng._st, *args)
                if not retry or r[0] != E_CAPACITY:
                    return r
                grow()
    else:
        def call(*args):
            while True:
                t = eng._st
                extra = (eng.out, eng.acts)[:len(sc)] if sc[:1] == ("out",) else (eng.acts,)
                r = k(*(t if pick is None else pick(t)), *args, *extra)
                if not retry or r[0] != E_CAPACITY:
                    return r
                grow()
    call.__name__ = call.__qualname__ = spec.name
    call.__doc__ = k.__doc__
    return call
