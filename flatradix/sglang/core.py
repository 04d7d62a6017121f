"""``FlatradixTreeCore``: SGLang 0.5.23's ``UnifiedTreeCoreInterface`` over flatradix's engine.

SGLang splits its cache into a controller (``UnifiedRadixCache``: allocators,
transfers, requests) and a TreeCore that owns the tree and decides: it returns
what to free and what to back up as ``CacheAction``s and results, and the
controller executes them. flatradix's engine has the same split -- a kernel
mutates the node table and appends action rows (``kernels/actions.py``), a
caller executes them -- so this class is a thin translation layer:

* one kernel call per interface call (``Engine.k``: grow-and-retry), on the
  engine's arrays; no tree rule is re-implemented here;
* the kernel's action rows become SGLang's objects (``FreeDeviceKV``,
  ``FreeDeviceKVFullOnly``, ``RecoverSWAWithLockedFull``, the eviction results'
  ``device_frees`` / ``tracker``); KV events are built from the ``A_STORED`` /
  ``A_REMOVED`` rows by flatradix's event sink and handed out as SGLang's
  event structs;
* values cross as torch tensors on the controller's KV device. On a non-CPU
  device (a Full-attention tree) they stay there: the engine's pool holds rows
  and ``flatradix.device``'s arena the KV indices (``docs/device_values.md``),
  so no call copies an index to the host; otherwise (the CPU, SWA / Mamba trees)
  the engine's host pool holds them and results are copies of it.
  ``FLATRADIX_DEVICE_VALUES=1`` turns the arena on for CPU tensors too (tests),
  ``0`` off.

Node handles are flatradix's NodeIds (``GEN << 32 | slot``): never reissued, a
stale one raises ``KeyError`` (``flatradix.errors.NodeAccessError``).

Where SGLang's two cores disagree flatradix follows the Rust core; the
deliberate differences and what is refused at construction are listed in
``docs/sglang_plugin.md``.
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch

from sglang.srt.mem_cache.base_prefix_cache import (
    DecLockRefResult,
    IncLockRefResult,
    InsertResult,
    MatchResult,
)
from sglang.srt.mem_cache.unified_cache.cache_action import (
    FreeComponentDeviceSlot,
    FreeDeviceKV,
    FreeDeviceKVFullOnly,
    RecoverSWAWithLockedFull,
)
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.events import KVCacheEventRecorder, KvEventLoraNames
from sglang.srt.mem_cache.unified_cache.unified_tree_core_interface import (
    DecSwaLockOnlyResult,
    EvictDeviceLeafResult,
    EvictDeviceNextNodeResult,
    InsertStepResult,
    UnifiedTreeCoreInterface,
)

from .. import _numba_env  # noqa: F401  (the kernels' cache directory, before them)
from ..core.insert import TRACK_ADOPTED as _TRACK
from ..engine import Engine
from ..errors import NodeAccessError
from ..kernels import actions as A
from ..kernels import layout as L
from .hashes import StorageHashes
from .host import HostTierRefusals
from .params import (
    _BIT, _CT, _F_HAS, _SLOT_MASK, FULL, MAMBA, SWA, _adopt, _np_values, _pool_capacity,
    _tuple_new, _units_of, check_params,
)
from .reads import TreeReads


class FlatradixTreeCore(StorageHashes, TreeReads, HostTierRefusals, UnifiedTreeCoreInterface):
    """SGLang's TreeCore on flatradix's engine (see the module docstring).

    Its interface methods are spread by concern: the request path (locks,
    eviction, match, insert) here, storage hashes in ``hashes.py``, read-only
    walks and sizes in ``reads.py``, the host tier's refusals in ``host.py``;
    shared names and the construction checks in ``params.py``.

    Built by SGLang's controller through the registry (``flatradix.sglang``);
    ``params`` is its ``CacheInitParams``, ``components`` its component objects
    (read for their configuration only: the rules are flatradix's kernels).
    """

    supports_rotation_base = False

    def __init__(self, params, components):
        policy, pa, pb = check_params(params)
        self.tree_components = tuple(params.tree_components)
        self._swa_on = SWA in self.tree_components
        self._mamba_on = MAMBA in self.tree_components
        self.page_size = int(params.page_size)
        self.is_eagle = bool(params.is_eagle) and not self._mamba_on
        alloc = params.token_to_kv_pool_allocator
        self._allocator = alloc
        if alloc is not None:
            device = torch.device(alloc.device)
            if device.type == "cuda" and device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
            self.device = device
        else:
            self.device = torch.device("cpu")
        self._cpu = self.device.type == "cpu"
        self._window = int(params.swa_retain_window) if self._swa_on else 0
        path_cap = -1
        self._mamba_grid = 1
        if self._mamba_on and not params.disable:  # (a disabled tree never matches)
            comp = components.get(MAMBA) if components else None
            chunk = getattr(comp, "mamba_cache_chunk_size", None)
            if chunk is None:
                from sglang.srt.runtime_context import mamba_cache_chunk_size

                chunk = mamba_cache_chunk_size()
            grid = getattr(comp, "mamba_checkpoint_grid", None)
            self._mamba_grid = int(grid) if grid else (
                chunk * self.page_size // math.gcd(chunk, self.page_size))
            try:
                from sglang.srt.runtime_context import get_exec

                path_cap = int(get_exec().mamba.mamba_max_states_per_path)
            except Exception:  # no server args: SGLang's default (off)
                path_cap = -1
            if path_cap < 1:
                path_cap = -1
        self.enable_hicache = False
        self.is_host_memory_buffer_only = False
        self._storage = self._linker = False
        self._hash_spans = []  # [start tick, end tick or None]: storage / linker on
        self._backfilled_at = -1
        self._hash_memo = {}  # node id -> ((len, parent, prior), hashes)
        self._hash_override = {}  # node id -> hashes (the inspection's set_node_hash_values)
        self.write_through_threshold = 256
        self.is_write_back = False
        self.has_swa_host_pool = False
        self.write_back_duplicate_reclaim_digest = 0
        events = bool(params.enable_kv_cache_events)
        self._eng = Engine(
            page_size=self.page_size, policy=policy, policy_a=pa, policy_b=pb,
            components=sum(_BIT[c] for c in self.tree_components), swa_window=self._window,
            mamba_path_cap=path_cap, events=events, bigram=self.is_eagle,
            node_capacity=1024, pool_capacity=_pool_capacity(alloc))
        # SGLang's own recorder holds the queue (it merges chained stores as SGLang
        # does); the sink builds its events from the kernels' event rows
        self.kv_events = KVCacheEventRecorder(
            enabled=events, page_size=self.page_size,
            dynamo_format=bool(params.dynamo_kv_event_format),
            lora_names=(params.kv_event_lora_names if params.kv_event_lora_names is not None
                        else KvEventLoraNames()))
        self._sink = None
        if events:
            from .events import SglangEventSink

            self._sink = SglangEventSink(self._eng, self.page_size, self.is_eagle, self.kv_events)
        self._insert_state = None
        self._match_out = np.empty(1024, dtype=np.int64)
        self._empty_t = torch.empty((0,), dtype=torch.int64, device=self.device)
        self._dev = None   # flatradix.device.DeviceValues: device values (Full trees)
        flag = os.environ.get("FLATRADIX_DEVICE_VALUES", "")
        if (self.tree_components == (FULL,) and flag != "0"
                and (self.device.type != "cpu" or flag == "1")):
            from ..device import DeviceValues, TorchOps

            self._dev = DeviceValues(TorchOps(self.device))
            self._dev.bind(self._eng)
        self._reset_state()

    # ------------------------------------------------------------------ helpers
    def _reset_state(self):
        self._root = self._eng.root
        self._insert_state = None
        self._hash_memo.clear()
        self._hash_override.clear()
        self._empty_match_result = MatchResult(
            device_prefix_len=0, last_device_node=self._root, last_host_node=self._root,
            best_match_node=self._root, cache_actions=[])

    def _slot(self, nid):
        """The live slot of NodeId ``nid``; ``NodeAccessError`` (a ``KeyError``) when stale."""
        if type(nid) is not int:
            if isinstance(nid, bool) or not isinstance(nid, (int, np.integer)):
                raise NodeAccessError(f"node id must be an int, got {type(nid).__name__}")
            nid = int(nid)
        nodes, meta = self._eng.st.nodes, self._eng.st.meta
        s = nid & _SLOT_MASK
        if (nid < 0 or s >= meta[L.M_HWM] or not nodes[s, L.FLAGS] & L.F_ALIVE
                or int(nodes[s, L.GEN]) != nid >> 32):
            raise NodeAccessError(f"node id {nid} does not name a live node")
        return s

    def _nid(self, s):
        return (int(self._eng.st.nodes[s, L.GEN]) << 32) | int(s)

    def _t(self, a):
        """A torch tensor on the core's device holding a copy of int64 array ``a``
        (device values: through the pinned staging, no host wait)."""
        if self._dev is not None:
            return self._dev.ops.send(np.array(a, dtype=np.int64))
        t = torch.from_numpy(np.array(a, dtype=np.int64))
        return t if self._cpu else t.to(self.device)

    def _full_t(self, s):
        """The Full device value of the node in slot ``s`` as a new tensor."""
        if self._dev is None:
            return self._t(self._full_np(s))
        nodes = self._eng.st.nodes
        return self._dev.arena.take_span(int(nodes[s, L.KEY_OFF]), int(nodes[s, L.KEY_LEN]))

    def _values_t(self, a):
        """Kernel output ``a`` (Full device values; pool rows with device values) as a
        tensor on the device."""
        return self._t(a) if self._dev is None else self._dev.take(a)

    def _rows(self, s):
        """The pool rows of the node in slot ``s`` (device values: what the
        arena is gathered at)."""
        nodes = self._eng.st.nodes
        off = int(nodes[s, L.KEY_OFF])
        return np.arange(off, off + int(nodes[s, L.KEY_LEN]), dtype=np.int64)

    def _full_np(self, s):
        nodes, pool = self._eng.st.nodes, self._eng.st.pool
        off, n = int(nodes[s, L.KEY_OFF]), int(nodes[s, L.KEY_LEN])
        return pool[off:off + n, L.FULL_DEV]

    def _nk(self, s):
        """The ``(extra_key, cache_salt)`` namespace of the node in slot ``s``."""
        return self._eng.ns.key_of(int(self._eng.st.nodes[s, L.NS]))

    def _has(self, s, c, tier=L.DEVICE):
        return bool(self._eng.st.nodes[s, L.FLAGS] & _F_HAS[c][tier])

    def _key(self, key):
        """``(units, n, ns)`` of a RadixKey: page-aligned unit count, namespace id
        (None when the namespace was never inserted). Converts the key to a bigram
        view in an EAGLE tree, as SGLang's cores do (in place)."""
        key, _ = key.maybe_to_bigram_view(self.is_eagle)
        units, n = _units_of(key, key.is_bigram)
        n -= n % self.page_size
        return units, n, (key.extra_key, key.cache_salt)

    def _prepare(self, rows, out):
        """Device values: the ``SRC_OUT`` rows' values gathered in one go (before an
        insert's input is written into the arena); ``{(off, n): tensor}``."""
        want = [(off, n) for kind, comp, src, off, n, aux in rows.tolist()
                if src == A.SRC_OUT and n and kind in (A.A_FREE_KV, A.A_FREE_KV_FULL_ONLY,
                                                        A.A_FREE_SLOT)]
        if not want:
            return {}
        g = self._dev.take(np.concatenate([out[o:o + n] for o, n in want]))
        got, at = {}, 0
        for o, n in want:
            got[(o, n)] = g[at:at + n]
            at += n
        return got

    def _convert(self, rows, out, value_in, *, frees=None, actions=None, adopted=None,
                 session_id=None, removed_nk=None, pre=None):
        """Turn a kernel's action rows into SGLang objects, in row order.

        Free rows go to ``frees`` (``{ComponentType: [tensor]}``, an eviction
        result's ``device_frees``) when given, else become actions; KV events
        are queued in the sink (stores attributed to ``session_id``, removals of
        a node in namespace ``removed_nk``); ``A_ADOPTED`` reports extend
        ``adopted``. Device values: the frees are device tensors, the input's or
        gathered (``pre``: ``_prepare``'s, made here when None)."""
        sink = self._sink
        dev = self._dev
        pre = self._prepare(rows, out) if dev is not None and pre is None else pre
        for kind, comp, src, off, n, aux in rows.tolist():
            if kind == A.A_STORED:
                if sink is not None:
                    sink.stored(off, aux, session_id)
                continue
            if kind == A.A_REMOVED:
                if sink is not None:
                    assert removed_nk is not None, "a removal event of an unknown namespace"
                    sink.removed(off, n, aux, removed_nk)
                continue
            if kind == A.A_ADOPTED:
                if adopted is not None:
                    _adopt(adopted, _CT[comp], off, off + n)
                continue
            v = value_in[off:off + n] if src == A.SRC_IN else out[off:off + n]
            if dev is not None:   # device tensors already: the input's, or gathered
                vt = v if src == A.SRC_IN else pre.get((off, n), self._empty_t)
            else:
                vt = self._t(v)
            if kind == A.A_FREE_KV:
                actions.append(FreeDeviceKV([vt]))
            elif kind == A.A_FREE_KV_FULL_ONLY:
                actions.append(FreeDeviceKVFullOnly([vt]))
            elif kind == A.A_FREE_SLOT:
                if frees is not None:
                    frees[_CT[comp]].append(vt)
                else:
                    actions.append(FreeComponentDeviceSlot([vt], component_type=_CT[comp]))
            elif kind == A.A_SWA_RECOVER_LOCKED:
                kept = np.array(v)
                actions.append(RecoverSWAWithLockedFull(
                    self._node_holding(kept), self._t(kept),
                    self._t(value_in[aux:aux + n])))
            else:
                raise NotImplementedError(
                    f"flatradix TreeCore: action {A.ACTION_NAMES.get(kind, kind)} is not "
                    "served yet (host tier)")

    def _node_holding(self, kept):
        """The node whose Full value is ``kept`` (an SWA recovery under a Full lock
        keeps the node's own slots): found through the slot of its first unit."""
        nodes, pool = self._eng.st.nodes, self._eng.st.pool
        for s in self._eng.live_slots():
            if s == L.ROOT or not nodes[s, L.FLAGS] & L.F_HAS_FULL_DEV:
                continue
            off, n = int(nodes[s, L.KEY_OFF]), int(nodes[s, L.KEY_LEN])
            if n == kept.shape[0] and np.array_equal(pool[off:off + n, L.FULL_DEV], kept):
                return self._nid(s)
        raise AssertionError("flatradix TreeCore: no node holds the recovered Full value")

    # ==== Tree API ====
    def reset(self):
        if self._insert_state is not None:
            self._insert_state = None
        for c in (L.FULL, L.SWA, L.MAMBA):
            self._eng.k.evict_end(c)
        self._eng.reset()
        self._reset_state()

    def node_by_id(self, node_id):
        raise NotImplementedError("node_by_id: the flatradix TreeCore has no Python tree nodes "
                                  "(as SGLang's Rust core)")

    @property
    def root_node(self):
        raise NotImplementedError("root_node: the flatradix TreeCore has no Python tree nodes "
                                  "(as SGLang's Rust core); use root_node_handle()")

    def is_backuped(self, node_id):
        return self._has(self._slot(node_id), L.FULL, L.HOST)

    def is_root(self, node_id):
        return self._slot(node_id) == L.ROOT

    def root_node_handle(self, extra_key=None):
        return self._root

    # ==== locks ====
    def _skip_mask(self, comps, release=False):
        """The ``C_*`` bit set of skipped components. FULL is never skipped by a
        lock; a release may skip it (SGLang releases a lock's Mamba part alone
        with a receipt that skips every other component)."""
        m = 0
        for c in comps:
            c = ComponentType(c)
            if c == FULL and not release:
                raise ValueError("skip_lock_components: FULL cannot be skipped")
            m |= _BIT[c]
        return m

    def inc_lock_ref(self, node_id, skip_lock_components=()):
        skipped = tuple(skip_lock_components)
        skip = self._skip_mask(skipped) if skipped else 0
        if type(node_id) is not int:
            self._slot(node_id)  # the TypeError / KeyError naming it
        st, delta, boundary = self._eng.k.inc_lock_ref(node_id, skip)
        if st == L.E_STALE:
            self._slot(node_id)  # raises NodeAccessError
        result = IncLockRefResult(delta=int(delta), node_id=node_id,
                                  skipped_lock_components=skipped)
        if self._swa_on and SWA not in skipped:
            result.set_lock_uuid(SWA, int(boundary) or None)
        return result

    def _receipt(self, node_id, params, extra_skip=0):
        """``(skip mask, SWA boundary)`` of a release receipt, checked as SGLang's
        core checks it (the anchor; a missing SWA entry is a ``KeyError``)."""
        assert params.node_id == node_id, (
            f"lock receipt anchored on node {params.node_id} released on node {node_id}")
        comps = params.skipped_lock_components
        skip = (self._skip_mask(comps, release=True) if comps else 0) | extra_skip
        boundary = 0
        if self._swa_on and not skip & L.C_SWA:
            boundary = params.get_lock_uuid(SWA) or 0
        return skip, boundary

    def _dec(self, node_id, skip, boundary):
        st, x = self._eng.k.dec_lock_ref(node_id, skip, boundary)
        if st == L.E_STALE:
            self._slot(node_id)  # raises NodeAccessError
        if st == L.E_LOCK_UNDERFLOW:
            raise AssertionError(f"lock release hit lock_ref=0 on node {self._nid(int(x))}")
        if st == L.E_NOT_ANCHORED:
            raise AssertionError(f"lock release on node {node_id}: no lock is anchored there "
                                 "(its lock_ref is held by locks on descendants)")
        if st == L.E_NO_BOUNDARY:
            raise AssertionError(f"SWA lock boundary {boundary} is not on node {node_id}'s path")
        return int(x)

    def dec_lock_ref(self, node_id, params, skip_swa=False):
        if type(node_id) is not int:
            self._slot(node_id)  # the TypeError / KeyError naming it
        extra = 0
        if skip_swa and self._swa_on:
            extra = L.C_SWA | (L.C_MAMBA if self._mamba_on else 0)
        skip, boundary = self._receipt(node_id, params, extra)
        self._dec(node_id, skip, boundary)
        return DecLockRefResult()

    def inc_full_pin(self, node_id):
        self._slot(node_id)
        self._eng.k.inc_lock_ref(node_id, L.C_SWA | L.C_MAMBA)

    def dec_full_pin(self, node_id):
        self._slot(node_id)
        self._dec(node_id, L.C_SWA | L.C_MAMBA, 0)

    def dec_swa_lock_only(self, node_id, params):
        result = DecSwaLockOnlyResult()
        s = self._slot(node_id)
        assert params.node_id == node_id, (
            f"lock receipt anchored on node {params.node_id} released on node {node_id}")
        if s == L.ROOT or not self._swa_on:
            return result
        skip = self._skip_mask(params.skipped_lock_components, release=True)
        boundary = params.get_lock_uuid(SWA) or 0
        eng = self._eng
        st, x = eng.k.release_window(node_id, boundary, skip)
        if st == L.E_LOCK_UNDERFLOW:
            raise AssertionError(f"SWA window release hit lock_ref=0 on node {self._nid(int(x))}")
        self._convert(eng.actions(), eng.out, None, frees=result.device_frees)
        return result

    # ==== device eviction (pick, then evict) ====
    def evict_device_start(self, component_type, request_cnt):
        c = int(ComponentType(component_type))
        st = self._eng.k.evict_start(c, int(request_cnt))
        assert st == L.OK, f"{ComponentType(component_type)} device eviction already in progress"

    def evict_device_next_node(self, component_type, tracker):
        ct = component_type if type(component_type) is ComponentType else ComponentType(
            component_type)
        result = EvictDeviceNextNodeResult()
        eng = self._eng
        st, nid, f, w, m = eng.k.evict_pick(int(ct), tracker.get(ct, 0))
        assert st != L.E_NO_WALK, f"{ct} device eviction not started"
        if st == L.E_NEED_STATE_BACKUP:
            self._host_not_served("a write-back internal backup")
        if nid >= 0 and not (f or w or m):  # a picked leaf: the common step
            result.node_id = int(nid)
            result.made_progress = True
            return result
        if eng.meta[L.M_NACTS]:  # an internal SWA / Mamba step's frees
            self._convert(eng.actions(), eng.out, None, frees=result.device_frees)
        tracker_out = result.tracker
        if f:
            tracker_out[FULL] = int(f)
        if w:
            tracker_out[SWA] = int(w)
        if m:
            tracker_out[MAMBA] = int(m)
        if nid >= 0:
            result.node_id = int(nid)
        result.made_progress = result.node_id is not None or bool(tracker_out)
        return result

    def evict_device_leaf(self, node_id, is_write_back):
        result = EvictDeviceLeafResult()
        # the namespace of its removal event (events on); else the kernel resolves the id
        nk = self._nk(self._slot(node_id)) if self._sink is not None else None
        eng = self._eng
        st, n, w, m, had_host = eng.k.evict_leaf_at(node_id)
        if st == L.E_STALE:
            self._slot(node_id)  # raises NodeAccessError
        assert st != L.E_NOT_LEAF, f"node {node_id} is not a D-leaf"
        if st == L.E_NEED_BACKUP:
            self._host_not_served("a write-back backup")
        acts = eng.acts
        if (eng.meta[L.M_NACTS] == 1 and acts[0, A.ACT_KIND] == A.A_FREE_SLOT
                and acts[0, A.ACT_SRC] != A.SRC_IN):
            # a Full-only leaf without events: one free row of its Full indices
            off, k = int(acts[0, A.ACT_OFF]), int(acts[0, A.ACT_LEN])
            result.device_frees[_CT[int(acts[0, A.ACT_COMP])]].append(
                self._values_t(eng.out[off:off + k]))
        else:
            self._convert(eng.actions(), eng.out, None, frees=result.device_frees,
                          removed_nk=nk)
        tracker = result.tracker
        if n:
            tracker[FULL] = int(n)
        if w:
            tracker[SWA] = int(w)
        if m:
            tracker[MAMBA] = int(m)
        if not had_host:
            result.unbacked_tokens = int(n)
        return result

    def evict_device_end(self, component_type):
        self._eng.k.evict_end(int(ComponentType(component_type)))

    # ==== match ====
    def match_prefix(self, params):
        units, n, nk = self._key(params.key)
        eng = self._eng
        ns = eng.ns.get(nk)
        if n == 0 or ns is None:
            return self._empty_match_result
        idx = self._match_out  # the kernel writes the matched indices (SGLang's match returns
        if idx.shape[0] < n:   # none): a scratch kept between calls
            idx = self._match_out = np.empty(max(n, 2 * idx.shape[0]), dtype=np.int64)
        st, plen, best, visited, full_hit, host_hit, hbest = eng.k.match_prefix(units, n, ns, idx)
        plen, full_hit, host_hit = int(plen), int(full_hit), int(host_hit)
        best, hbest = int(best), int(hbest)
        swa_branch = None
        if self._swa_on:
            aligned = full_hit // self.page_size * self.page_size
            swa_branch = aligned if aligned > plen + host_hit else None
        mamba_branch = None
        if self._mamba_on:
            aligned = full_hit // self._mamba_grid * self._mamba_grid
            mamba_branch = aligned if aligned > plen + host_hit else None
        # MatchResult's fields in order (tuple.__new__ skips the NamedTuple's Python
        # __new__): device_prefix_len, last_device_node, last_host_node,
        # best_match_node, host_hit_length, swa_host_hit_length, swa_branching_seqlen,
        # mamba_host_hit_length, mamba_branching_seqlen, cache_protected_len,
        # full_kv_hit_length, cache_actions, last_visited_node_id, full_device_match_len
        return _tuple_new(MatchResult, (
            plen, best, hbest if self.enable_hicache else best, hbest, host_hit, 0, swa_branch,
            0, mamba_branch, None, full_hit, [], None if visited < 0 else int(visited), None))

    def match_full_device_prefix(self, key):
        units, n, nk = self._key(key)
        eng = self._eng
        ns = eng.ns.get(nk)
        nodes, pool = eng.st.nodes, eng.st.pool
        s = L.ROOT
        matched = pinned = 0
        if ns is None:
            return 0, self._root, 0
        from ..core.tree import edge_match_len
        from ..kernels.children import find_child

        while matched < n:
            c = find_child(nodes, eng.st.ctab, pool, s, ns, units, matched, self.page_size)
            if c < 0 or not nodes[c, L.FLAGS] & L.F_HAS_FULL_DEV:
                break
            m = edge_match_len(nodes, pool, c, units, matched, n, self.page_size)
            if m == 0:
                break
            matched += m
            s = c
            pinned += int(nodes[c, L.KEY_LEN])
            if m < nodes[c, L.KEY_LEN]:
                break
        return matched, self._nid(s), pinned

    @property
    def empty_match_result(self):
        return self._empty_match_result

    def is_full_device_evicted(self, node_id):
        s = self._slot(node_id)
        return s != L.ROOT and not self._has(s, L.FULL)

    def collect_full_device_indices(self, from_node_id, until_node_id):
        eng = self._eng
        if until_node_id == self._root and type(from_node_id) is int:
            # the whole device path (the scheduler's prefix read): one kernel call, which
            # resolves the id and skips a host-only tail (then: the checked walk below)
            st, n = eng.k.path_device_indices(from_node_id)
            if st == L.OK and (from_node_id == self._root or eng.st.nodes[
                    from_node_id & _SLOT_MASK, L.FLAGS] & L.F_HAS_FULL_DEV):
                if self._dev is not None:   # pool rows: one gather on the device
                    return self._dev.take(eng.out[:n]) if n else self._empty_t
                if self._cpu:
                    return torch.from_numpy(eng.out[:n].copy()) if n else self._empty_t
                return self._t(eng.out[:n]) if n else self._empty_t
        nodes = eng.st.nodes
        until = self._slot(until_node_id)
        s = self._slot(from_node_id)
        parts = []
        while s != until:
            assert s != L.ROOT, "collect_full_device_indices: until is not an ancestor"
            assert self._has(s, L.FULL), f"node {self._nid(s)} has no Full device value"
            parts.append(self._full_np(s) if self._dev is None else self._rows(s))
            s = int(nodes[s, L.PARENT])
        if not parts:
            return self._empty_t
        parts.reverse()
        return self._values_t(np.concatenate(parts))

    # ==== insert ====
    def begin_insert(self, params):
        if self._insert_state is not None:
            raise RuntimeError("concurrent insert walks")
        key = params.key
        units, n, nk = self._key(key)
        dev = self._dev
        if dev is not None:   # device values: never read on the host
            if params.value is None:   # the raw token ids (SGLang's cores store those)
                value = dev.ops.send(np.asarray(key.raw_token_ids()[:n], dtype=np.int64))
            else:
                value = dev.native(params.value, "params.value")
                value = value[:n] if value.shape[0] > n else value
        elif params.value is not None:
            value = _np_values(params.value[:n] if len(params.value) > n else params.value,
                               "params.value", copy=False)
        else:  # SGLang's cores store the raw token ids then (the first n of them)
            value = np.asarray(key.raw_token_ids()[:n], dtype=np.int64).copy()
        if value.shape[0] < n:
            raise ValueError(f"params.value: {value.shape[0]} values for a key of {n} units")
        if n == 0:
            return InsertStepResult(actions=[], result=InsertResult(
                prefix_len=0, mamba_exist=True, last_device_node=self._root))
        priority = params.priority if params.priority is not None else 0
        mamba_slot = -1
        if self._mamba_on:
            mv = params.mamba_value
            if mv is None:
                raise ValueError("params.mamba_value: a Mamba tree needs the request's state "
                                 "slot")
            slots = _np_values(mv, "params.mamba_value").reshape(-1)
            if slots.shape[0] != 1 or slots[0] < 0:
                raise ValueError("params.mamba_value: one state slot (>= 0) expected, got "
                                 f"{slots.tolist()}")
            mamba_slot = int(slots[0])
        cursor = params.get_evicted_seqlen(SWA) if self._swa_on else 0
        track = bool(params.track_adopted_ranges)
        # the kernel reports adopted ranges where they can be other than the new leaf
        # (SWA recoveries); a Full-only tree adopts exactly the new leaf's units
        track_k = track and self._swa_on
        eng = self._eng
        ns = eng.ns.get(nk)
        new_ns = ns is None
        if new_ns:
            ns = eng.ns.intern(nk)
        st, plen, target, exist = eng.k.insert(
            units, value if dev is None else dev.tags(value.shape[0]), n, ns,
            min(int(params.inserted_len), n), int(priority),
            L.VALUES_NONNEG if dev is None else L.VALUES_UNCHECKED,
            min(int(params.prev_prefix_len), n), int(cursor),
            _TRACK if track_k else 0, mamba_slot, 0)
        if st in (L.E_BAD_VALUE, L.E_BAD_CURSOR):  # refused before any change
            if new_ns:
                eng.ns.forget(nk)
            if st == L.E_BAD_VALUE:
                raise ValueError(f"params.value: KV index {int(value[plen])} at {int(plen)} "
                                 "is negative")
            raise ValueError(f"params.component_evicted_seqlens[SWA]={cursor} is not "
                             f"page-aligned (page_size={self.page_size})")
        if new_ns and len(eng.ns.ids) > eng.ns.gc_at:  # per-request salts: bounded
            eng.gc_namespaces(self._sink.forget if self._sink is not None else None)
        actions = []
        adopted = {} if track_k else None
        pre = None
        if dev is not None:   # the tagged rows take the input (after the frees' gathers)
            runs = dev.claim(eng, int(target) & _SLOT_MASK)
            pre = self._prepare(eng.actions(), eng.out)
            dev.write(runs, value)
            dev.record(value[:n], 0, None, "params.value")
        self._convert(eng.actions(), eng.out, value, actions=actions, adopted=adopted,
                      session_id=params.session_id, pre=pre)
        if track and not track_k:  # only components that adopted something appear
            adopted = {FULL: [(int(plen), n)]} if n > plen else {}
        result = InsertResult(prefix_len=int(plen), last_device_node=int(target),
                              mamba_exist=bool(exist), adopted_ranges=adopted)
        if self._swa_on and params.swa_branching_seqlen is not None:
            result.swa_branch_inserted = len(key) >= params.swa_branching_seqlen
        return InsertStepResult(actions=actions, result=result)

    def resume_insert(self):
        raise RuntimeError("no in-flight insert")

    def has_ongoing_insert(self):
        return self._insert_state is not None

    def end_insert(self):
        self._insert_state = None
        return []

    def set_component_device_value(self, node_id, component_type, value):
        s = self._slot(node_id)
        ct = ComponentType(component_type)
        if ct == SWA and self._has(s, L.SWA):
            return  # the kernel published the window already; its value is the mapping's
        raise NotImplementedError(f"set_component_device_value({ct.name}) on a node without it: "
                                  "not served by the flatradix TreeCore")

    def _swa_value(self, s):
        full = self._t(self._full_np(s))
        alloc = self._allocator
        return alloc.translate_swa_indices_for_transfer(full).to(torch.int64)

    def get_component_device_value(self, node_id, component_type):
        s = self._slot(node_id)
        ct = ComponentType(component_type)
        if ct not in self.tree_components:
            return None
        if ct == FULL:
            return self._full_t(s) if self._has(s, L.FULL) else None
        if ct == SWA:
            return self._swa_value(s) if self._has(s, L.SWA) else None
        if not self._has(s, L.MAMBA):
            return None
        return self._t(np.array([self._eng.st.nodes[s, L.MAMBA_SLOT]], dtype=np.int64))

    # ==== others ====
    def sanity_check(self, ongoing_write_through, ongoing_load_back):
        code, slot = self._eng.k.sanity_check()
        if code:
            raise AssertionError(f"flatradix TreeCore: invariant {int(code)} broken at slot "
                                 f"{int(slot)} (flatradix/core/check.py lists the codes)")
        if self._dev is not None:   # the sync point of the device checks
            self._dev.checks.surface()
