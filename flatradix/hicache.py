"""HiCache, the host tier (SGLang 0.5.23 ``UnifiedRadixCache`` HiCache API, spec §8).

Full attention, Full + Mamba (spec §6.3 HiCache notes), Full + SWA (spec §6.2
HiCache notes: window backups and load-backs, ``evict_host(n, SWA)``) and Full +
SWA + Mamba, under every write policy.
``init_hicache`` turns the host tier on: a host pool of our own
(``HostKVPool``), the write policy (``write_through`` backs a node up at its
first hit, ``write_through_selective`` at its second, ``write_back`` only when
eviction takes it: backed up, completed at once, then demoted; host eviction
then first reclaims the host copies of nodes still on the device) and an
optional transfer callable that moves the KV bytes (the tree
only moves indices: ``transfer(kind, device_indices, host_indices)`` with
``kind`` ``"backup"`` (device -> host) or ``"load"`` (host -> device) for KV
slots, on a Mamba cache ``"backup_state"`` / ``"load_state"`` for state
slots, on an SWA cache ``"backup_swa"`` / ``"load_swa"`` for SWA pool slots
(device SWA slots, SWA host slots) -- a callable written for Full-only caches
must refuse those; without
one no bytes move, which is what trace replays and tests need).

The step-wise protocol is SGLang's: a backup is committed when an insert asks
for it (the node is locked on the device and marked pending), submitted by
``flush_pending_backups`` and completed by ``writing_check``; a load-back
(``init_load_back`` / ``load_back``) is committed at once, submitted by
``ready_to_load_host_cache`` and completed by ``loading_check``;
``check_hicache_events`` is a scheduler step's poll (flush, writing_check,
loading_check). Transfers are
synchronous, so every transfer is done when its commit returns; the acks are
public so a caller can delay them and interleave other calls, as a scheduler
does. Kernels: ``core/host.py``.
"""

from collections import deque

import numpy as np

from ._cast import as_count, as_flag, as_int, as_node_id
from .errors import LockRefError
from .types import ComponentType, DecLockRefResult, IncLockRefResult
from . import inspection as Q
from .executor import segments
from .kernels.actions import A_BACKUP
from .kernels import layout as L
from .core.insert import BACKUP_NO_STATE as _BACKUP_NO_STATE
from . import hostload, hostrefill
from .pools import HostKVPool
from .requests import holds_state
from .transfer import KVTransfer

_EMPTY = np.empty(0, dtype=np.int64)


def _counts(full=0, swa=0, mamba=0):
    """Counts per component (a list indexed by component id)."""
    out = [0] * L.N_COMPONENTS
    out[L.FULL], out[L.SWA], out[L.MAMBA] = int(full), int(swa), int(mamba)
    return out


#: Largest host pool (tokens), as the device pools' bound.
MAX_HOST_SIZE = 1 << 40


class HostTier:
    """The host tier a ``UnifiedRadixCache`` owns (``cache._hicache``; off until
    ``init_hicache``). See the module docstring.

    The cache exposes ``API`` (methods) and ``PROPERTIES`` as its own public
    methods (delegating here, with these docstrings), and uses of this object only
    what ``CACHE_USES`` lists. What this object uses of its cache (read once at
    construction or called): ``_engine``, ``_vals``, ``_sink``, ``_mutex``,
    ``_executor``, ``_swa``, ``_mamba``, ``page_size``, ``token_to_kv_pool_allocator``,
    ``evict``, ``_stale``, ``_slot``, ``_key``.
    """

    #: The cache's public host-tier methods (SGLang's names).
    API = ("init_hicache", "flush_pending_backups", "writing_check", "check_hicache_events",
           "inc_host_lock_ref", "dec_host_lock_ref", "insert_host", "is_backuped",
           "init_load_back", "load_back", "ready_to_load_host_cache", "loading_check",
           "evict_host", "host_total_size", "all_host_values_flatten", "host_evictable_size",
           "swa_host_total_size", "mamba_host_total_size")
    #: The cache's public host-tier attributes (read-only but ``load_back_threshold``).
    PROPERTIES = ("enable_hicache", "hicache_write_policy", "mem_pool_host", "swa_pool_host",
                  "mamba_pool_host", "load_back_threshold", "write_through_threshold",
                  "ongoing_write_through", "ongoing_load_back")
    #: whether a request's ``kv`` holds a Mamba state slot (``requests.holds_state``)
    _holds_state = staticmethod(holds_state)
    # load-backs (``hostload.py``) and storage refills (``hostrefill.py``)
    init_load_back = hostload.init_load_back
    _path_units = hostload._path_units
    load_back = hostload.load_back
    _check_load_req = hostload._check_load_req
    _load = hostload._load
    _swa_device_alloc = hostload._swa_device_alloc
    _state_host_only = hostload._state_host_only
    mamba_host_hit = hostload.mamba_host_hit
    _state_device_alloc = hostload._state_device_alloc
    _load_copies = hostload._load_copies
    _load_unpin = hostload._load_unpin
    ready_to_load_host_cache = hostload.ready_to_load_host_cache
    loading_check = hostload.loading_check
    _load_finish_error = hostload._load_finish_error
    insert_host = hostrefill.insert_host
    _prefetch_staging = hostrefill._prefetch_staging

    #: What the cache's own code uses of this object.
    CACHE_USES = ("on", "policy", "swa_pool_host", "mamba_pool_host", "run_with_barriers",
                  "raise_transfer_error", "mamba_host_hit", "holds_state", "write_back_evict",
                  "write_back_step", "clear")

    def __init__(self, cache):
        self._c = cache
        self._engine = cache._engine
        self._vals = cache._vals
        self._sink = cache._sink
        self._mutex = cache._mutex
        self._ex = cache._executor
        self._swa = cache._swa
        self._mamba = cache._mamba
        self._host = self._host_mamba = self._host_swa = None
        self._hicache_policy = None
        self._transfer = None
        self._transfer_error = None
        self.load_back_threshold = None
        self.write_through_threshold = None
        self.ongoing_write_through = self.ongoing_load_back = None

    @property
    def on(self):
        """Whether the host tier is on (``init_hicache`` was called)."""
        return self._host is not None

    @property
    def policy(self):
        """The write policy (``"write_through"``, ...), None while off."""
        return self._hicache_policy

    def init_hicache(self, server_args=None, params=None, *, hicache_write_policy=None,
                     host_size=None, hicache_ratio=None, load_back_threshold=10,
                     transfer=None, mamba_host_size=None, swa_host_size=None):
        """Turn the host tier on (SGLang ``init_hicache``).

        ``server_args``: optional object read for ``hicache_write_policy`` and
        ``hicache_ratio`` as SGLang's server args (keywords win); SGLang's
        ``hicache_size`` (GB per rank) is not read: flatradix sizes its pool in
        tokens (``host_size``). ``host_size``: host pool slots (tokens); else from ``hicache_ratio``
        as SGLang sizes it: ``(int(D * ratio) // page_size + 1) * page_size`` for a
        device allocator of ``size`` D (an SWA allocator: its Full side,
        ``size_full``). ``load_back_threshold``: fewer host tokens than this are
        recomputed, not loaded (SGLang's default 10) -- unless the load also
        restores a Mamba state or SWA data (SGLang loads those whatever the Full
        count: on an SWA cache every load of a demoted prefix restores its window).
        ``transfer``: see the module docstring. Mamba caches get a host state
        pool too (``mamba_pool_host``): ``mamba_host_size`` states, else from
        ``hicache_ratio`` as SGLang's ``MambaPoolHost``: ``int(S * ratio) + 1`` for
        a state pool of ``S`` states; the ``transfer`` callable then also gets
        ``"backup_state"`` / ``"load_state"`` calls with state slots. SWA caches
        get an SWA host pool (``swa_pool_host``): ``swa_host_size`` tokens, else
        from ``hicache_ratio`` as SGLang sizes its SWA host pool over the
        allocator's SWA side (``size_swa``, same formula); the ``transfer``
        callable then also gets ``"backup_swa"`` / ``"load_swa"`` calls. Raises
        ``ValueError`` for an unknown policy, a missing size (or a
        host size below 1 for Mamba or SWA, or one given to a cache without that
        component), a KVTransfer on an SWA cache without SWA buffers (or too few
        rows for the SWA pools), a
        ``KVTransfer`` whose buffers are smaller than the pools (or without state
        buffers on a Mamba cache), or a second call; ``TypeError`` for a
        non-number ratio or size, a non-callable ``transfer``; nothing changes
        then.
        """
        def arg(name, given):
            if given is not None:
                return given
            return getattr(server_args, name, None) if server_args is not None else None

        policy = arg("hicache_write_policy", hicache_write_policy) or "write_through"
        if policy not in L.HOST_POLICY_NAMES[1:]:
            raise ValueError(f"hicache_write_policy must be one of "
                             f"{', '.join(L.HOST_POLICY_NAMES[1:])}, got {policy!r}")
        if self._host is not None:
            raise ValueError("init_hicache: the host tier is already on")
        ratio = arg("hicache_ratio", hicache_ratio)
        if host_size is None and ratio is not None:
            if isinstance(ratio, bool) or not isinstance(ratio, (int, float, np.integer,
                                                                  np.floating)):
                raise TypeError(f"hicache_ratio must be a number, got {type(ratio).__name__}")
            dev = self._full_slots()
            if dev is None:
                raise ValueError("hicache_ratio needs a token_to_kv_pool_allocator with a size "
                                 "(or give host_size)")
            if not 0 < ratio < float("inf"):
                raise ValueError(f"hicache_ratio must be > 0 and finite, got {ratio}")
            # SGLang's host pool sizing: whole pages, one page more than the ratio gives
            host_size = (int(dev * ratio) // self._c.page_size + 1) * self._c.page_size
        if host_size is None:
            raise ValueError("init_hicache needs host_size (tokens) or hicache_ratio")
        host_size = as_count(host_size, "host_size")
        if host_size > MAX_HOST_SIZE:
            raise ValueError(f"host_size must be <= {MAX_HOST_SIZE} (2**40) tokens, got "
                             f"{host_size}")
        state_size = None
        if self._mamba:
            if mamba_host_size is not None:
                state_size = as_count(mamba_host_size, "mamba_host_size")
                if state_size < 1:
                    raise ValueError("mamba_host_size must be >= 1: every backup of a node "
                                     "with a state needs a host state slot (with none, nothing "
                                     "would ever be backed up)")
            elif ratio is not None:
                states = getattr(self._vals.mamba, "size", None)
                if not isinstance(states, (int, np.integer)):
                    raise ValueError("hicache_ratio needs a mamba_allocator with a size (or "
                                     "give mamba_host_size)")
                state_size = int(int(states) * ratio) + 1   # SGLang's MambaPoolHost sizing
            else:
                raise ValueError("init_hicache on a Mamba cache needs mamba_host_size (states) "
                                 "or hicache_ratio")
            if state_size > MAX_HOST_SIZE:
                raise ValueError(f"mamba_host_size must be <= {MAX_HOST_SIZE}, got {state_size}")
        elif mamba_host_size is not None:
            raise ValueError("mamba_host_size given, but this cache has no Mamba component")
        swa_size = None
        if self._swa:
            if swa_host_size is not None:
                swa_size = as_count(swa_host_size, "swa_host_size")
                if swa_size < 1:
                    raise ValueError("swa_host_size must be >= 1")
            elif ratio is not None:
                dev_swa = getattr(self._c.token_to_kv_pool_allocator, "size_swa", None)
                if not isinstance(dev_swa, (int, np.integer)):
                    raise ValueError("hicache_ratio needs an SWA allocator with a size_swa (or "
                                     "give swa_host_size)")
                # SGLang sizes the SWA host pool as the Full one, over the SWA side
                swa_size = (int(int(dev_swa) * ratio) // self._c.page_size + 1) * self._c.page_size
            else:
                raise ValueError("init_hicache on an SWA cache needs swa_host_size (tokens) or "
                                 "hicache_ratio")
            if swa_size > MAX_HOST_SIZE:
                raise ValueError(f"swa_host_size must be <= {MAX_HOST_SIZE}, got {swa_size}")
            if isinstance(transfer, KVTransfer):
                if transfer.device_swa_buffers is None:
                    raise ValueError("transfer: an SWA cache's KVTransfer needs "
                                     "device_swa_buffers and host_swa_buffers (the SWA pool "
                                     "is backed up and loaded too)")
                size_swa = getattr(self._c.token_to_kv_pool_allocator, "size_swa", None)
                if isinstance(size_swa, (int, np.integer)) and \
                        transfer.device_swa_rows <= size_swa:
                    raise ValueError(f"transfer: its device SWA buffers have "
                                     f"{transfer.device_swa_rows} rows, the allocator hands "
                                     f"out SWA slots up to {size_swa} (they need "
                                     f"{size_swa + 1} rows)")
                if transfer.host_swa_rows < swa_size:
                    raise ValueError(f"transfer: its host SWA buffers have "
                                     f"{transfer.host_swa_rows} rows, the SWA host pool has "
                                     f"{swa_size} slots")
        elif swa_host_size is not None:
            raise ValueError("swa_host_size given, but this cache has no SWA component")
        thr = as_int(load_back_threshold, "load_back_threshold")
        if thr < 0:
            raise ValueError(f"load_back_threshold must be >= 0, got {thr}")
        if transfer is not None and not callable(transfer):
            raise TypeError(f"transfer must be callable, got {type(transfer).__name__}")
        if isinstance(transfer, KVTransfer):
            if transfer.host_rows < host_size:
                raise ValueError(f"transfer: its host buffers have {transfer.host_rows} rows, the "
                                 f"host pool has {host_size} slots (build them with "
                                 f"KVTransfer.with_host_buffers(device_buffers, {host_size}))")
            dev_size = self._full_slots()
            if isinstance(dev_size, int) and transfer.device_rows <= dev_size:
                raise ValueError(f"transfer: its device buffers have {transfer.device_rows} "
                                 f"rows, the allocator hands out slots up to {dev_size} (they "
                                 f"need {dev_size + 1} rows: row 0 is padding)")
            if state_size is not None:
                if transfer.device_state_buffers is None:
                    raise ValueError("transfer: a Mamba cache's KVTransfer needs "
                                     "device_state_buffers and host_state_buffers (the states "
                                     "are backed up and loaded too)")
                states = getattr(self._vals.mamba, "size", None)
                if isinstance(states, (int, np.integer)) and \
                        transfer.device_state_rows <= states:
                    raise ValueError(f"transfer: its device state buffers have "
                                     f"{transfer.device_state_rows} rows, the state pool hands "
                                     f"out slots up to {states} (they need {states + 1} rows)")
                if transfer.host_state_rows < state_size:
                    raise ValueError(f"transfer: its host state buffers have "
                                     f"{transfer.host_state_rows} rows, the Mamba host pool has "
                                     f"{state_size} slots")
        with self._mutex:
            self._host = HostKVPool(host_size)
            self._host_mamba = HostKVPool(state_size) if state_size is not None else None
            self._host_swa = HostKVPool(swa_size) if swa_size is not None else None
            pools = self._ex.host_pools
            pools[L.FULL], pools[L.SWA], pools[L.MAMBA] = (self._host, self._host_swa,
                                                          self._host_mamba)
            self.load_back_threshold = thr
            self._transfer = transfer
            self._hicache_policy = policy
            self._transfer_error = None
            self.write_through_threshold = 1 if policy == "write_through" else 2
            self._engine.enable_host(L.HOST_POLICY_NAMES.index(policy),
                                     self.write_through_threshold)
            self.ongoing_write_through = {}   # ack id (the node's id) -> node id
            self._wt_swa = {}                 # ack id -> its SWA window lock's boundary
            # anchor node id -> (its load id: 0 for a load of aux data alone, its lock stamps)
            self.ongoing_load_back = {}
            self._write_queue = []            # backups committed, not yet submitted
            self._write_acks = deque()        # submitted backups: one list of ack ids each
            self._load_queue = []             # loads committed, not yet submitted
            self._load_acks = deque()

    def clear(self):
        """Empty the host pools and drop every pending backup / load (``reset``)."""
        if self._host is None:
            return
        for pool in (self._host, self._host_mamba, self._host_swa):
            if pool is not None:
                pool.clear()
        self.ongoing_write_through.clear()
        self._wt_swa.clear()
        self.ongoing_load_back.clear()
        self._write_queue, self._load_queue = [], []
        self._write_acks.clear()
        self._load_acks.clear()

    def _full_slots(self):
        """The allocator's Full slots (an SWA allocator's Full side, ``size_full``:
        its ``size`` is the smaller of its two sides), or None."""
        alloc = self._c.token_to_kv_pool_allocator
        n = getattr(alloc, "size_full", None)
        return getattr(alloc, "size", None) if n is None else n

    @property
    def enable_hicache(self):
        return self._host is not None

    @property
    def hicache_write_policy(self):
        return self._hicache_policy

    @property
    def mem_pool_host(self):
        """The host pool (``HostKVPool``), or None without a host tier."""
        return self._host

    @property
    def swa_pool_host(self):
        """The SWA host pool (``HostKVPool`` of SWA token slots; SGLang's SWA
        ``MHATokenToKVPoolHost``), or None without SWA on the host tier."""
        return self._host_swa

    @property
    def mamba_pool_host(self):
        """The Mamba host state pool (``HostKVPool`` of state slots; SGLang's
        ``MambaPoolHost``), or None without Mamba on the host tier."""
        return self._host_mamba

    def _check_host(self, what):
        if self._host is None:
            raise ValueError(f"{what}: this cache has no host tier (call init_hicache first)")

    def _copy(self, kind, slot, host):
        """Run the transfer callable for a backup of the node in ``slot`` (its device
        indices to ``host``) before the commit. When it raises, the host slots go
        back, the exception is kept for the caller to raise once the call's other
        actions have run (``_raise_transfer_error``), and False is returned: nothing
        was committed."""
        if self._transfer is None:
            return True
        st, n = self._engine.k.node_device_values(slot)
        assert st == L.OK, st
        try:
            dev = self._vals.dev   # device values: the node's rows, gathered there
            self._transfer(kind, self._vals.out(self._engine.out[:n].copy()) if dev is None
                           else dev.take(self._engine.out[:n]), host)
        except Exception as e:  # noqa: BLE001 -- re-raised by the public call
            self._host.free(host)
            if self._transfer_error is None:
                self._transfer_error = e
            return False
        return True

    def _copy_slots(self, kind, device, host):
        """Run the transfer callable for ``kind`` (``"load"`` of KV slots, or the
        component kinds ``"backup_state"`` / ``"load_state"`` / ``"backup_swa"`` /
        ``"load_swa"``) over the given device and host slots; False (the exception
        kept, as ``_copy``) when it raises."""
        if self._transfer is None:
            return True
        try:
            self._transfer(kind, device, host)
        except Exception as e:  # noqa: BLE001 -- re-raised by the public call
            if self._transfer_error is None:
                self._transfer_error = e
            return False
        return True

    def _state_host_alloc(self):
        """One Mamba host state slot, evicting one host state first when the pool
        is empty (SGLang's reclaim ``evict_host(1, MAMBA)``); None when none can
        be found. Under the cache lock."""
        h = self._host_mamba.alloc(1)
        if h is None:
            self._evict_host_states(1)
            h = self._host_mamba.alloc(1)
        return h

    def raise_transfer_error(self, insert_result=None):
        """Raise the first exception a transfer callable raised during this call
        (the state is consistent: that backup was not committed). An insert's
        result rides on it as ``insert_result`` (the insert itself is done)."""
        e, self._transfer_error = self._transfer_error, None
        if e is not None:
            if insert_result is not None:
                try:
                    e.insert_result = insert_result
                except AttributeError:  # an exception type without a __dict__
                    pass
            raise e

    def run_with_barriers(self, rows, out, value, keep_own, adopted, pre=None):
        """Execute an insert's action rows (a copy, and ``out`` a copy: the barriers
        make engine calls) with its barriers run at their place: an ``A_BACKUP``
        row's backup (``_run_backup``), an ``A_PATH_CAP`` row's per-path cap
        (``_run_path_cap``), as SGLang runs those actions among the insert's.
        Returns the Full slots freed (``Executor.run``). Under the cache lock."""
        freed = []
        for seg, barrier in segments(rows):
            freed.append(self._ex.run(seg, out, value, keep_own=keep_own, adopted=adopted,
                                      pre=pre))
            if barrier is not None:
                kind, _, _, off, _, aux = barrier
                if kind == A_BACKUP:
                    self._run_backup(off, aux)
                else:
                    self._run_path_cap(off)
        if self._vals.dev is not None:
            return self._vals.dev.cat(freed)
        return np.concatenate(freed) if len(freed) > 1 else freed[0]

    # ------------------------------------------------------------------ backup
    def _run_backup(self, s, aux=0):
        """Back up the node in slot ``s`` (an insert's ``A_BACKUP`` row, run when the
        executor reaches it: at its place among the insert's events, as SGLang's
        barrier). The row covers its node and its unbacked ancestors (ancestors first);
        every node of it gets its own host slots (host leaves are evicted when the
        pool is short) and, on a Mamba cache, a host state slot for a device state
        without one (one host state evicted when the state pool is empty), its
        own ack id (its node id, as SGLang), a device lock until the ack, and is
        queued for the next ``flush_pending_backups``. A node that needs nothing
        (backed up already) is skipped; a node whose host slots cannot be found
        ends its row silently, as SGLang's controller does (the node stays
        unbacked; a later hit retries). ``aux`` ``BACKUP_NO_STATE``: node ``s``'s
        Mamba state is left out (it came with the insert's commit, after SGLang
        ran this backup). Under the cache lock."""
        eng = self._engine
        st, _, k = eng.k.backup_plan(Q.nid(eng, s))
        if st != L.OK or k == 0:
            return
        chain = eng.out[:k].tolist()
        mamba = self._host_mamba is not None
        for c in chain:
            n = 0 if Q.has(eng, c, L.FULL, L.HOST) else Q.key_len(eng, c)
            state = mamba and Q.state_needs_backup(eng, c) and not (
                c == s and aux == _BACKUP_NO_STATE)
            wnodes, wdev = self._swa_backup_plan(c)
            if n == 0 and not state and not wnodes.size:
                continue  # nothing left to back up on this node
            cid = Q.nid(eng, c)
            r = self._backup_node(c, n, state, wnodes, wdev, cid, True)
            if r is not True:
                break  # no host room, or a failed copy: this node and the rest stay unbacked
            self._write_queue.append(cid)

    def _swa_backup_plan(self, slot):
        """``(nodes, Full device indices)`` of the SWA data within the window of the
        node in ``slot`` that has no host copy (``host.swa_backup_plan``, root-first;
        empty without SWA on the host tier). Under the cache lock."""
        if self._host_swa is None:
            return _EMPTY, _EMPTY
        eng = self._engine
        _, wu, wk = eng.k.swa_backup_plan(slot)
        if not wu:
            return _EMPTY, _EMPTY
        return eng.out[wu:wu + wk].copy(), eng.out[:wu].copy()

    def _backup_node(self, c, n, state, wnodes, wdev, ack, lock):
        """One node's backup (the node in slot ``c``): ``n`` Full host slots (host
        leaves evicted when short), a host state slot when ``state``, SWA host
        slots for the window nodes ``wnodes`` (Full device indices ``wdev``), in
        SGLang's order (Full, then its pools by name: mamba, swa; a slot that
        cannot be found gives the others back), the copies, then the commit
        (pending mark ``ack``, with ``lock`` the device lock until the ack) and
        ``ongoing_write_through``. Returns True when committed, False when host
        slots could not be found, None when a copy failed (its exception kept for
        ``_raise_transfer_error``; every slot given back). Under the cache lock."""
        host = self._host.alloc(n)
        if host is None:
            self._evict_host_units(n - self._host.available_size())
            host = self._host.alloc(n)
            if host is None:
                return False
        hstate = self._state_host_alloc() if state else None
        hswa = self._swa_host_alloc(wdev.shape[0]) if wnodes.size and (
            hstate is not None or not state) else _EMPTY
        if (state and hstate is None) or hswa is None:  # SGLang's rollback
            self._free_backup_slots(host, hstate, None)
            return False
        if n and not self._copy("backup", c, host):  # (the Full host slots went back)
            self._free_backup_slots(None, hstate, hswa)
            return None
        if (state and not self._copy_slots(
                "backup_state", np.array([Q.device_state(self._engine, c)],
                                         dtype=np.int64), hstate)) \
                or (hswa.size and not self._copy_slots(
                    "backup_swa", self._vals.out(self._vals.swa_of(wdev)), hswa)):
            self._free_backup_slots(host if n else None, hstate, hswa)
            return None
        st, _, boundary = self._engine.k.backup_commit(c, host, -1 if hstate is None
                                                       else int(hstate[0]), wnodes, hswa, ack,
                                                       lock)
        assert st == L.OK, st
        self.ongoing_write_through[ack] = ack
        if boundary:
            self._wt_swa[ack] = int(boundary)
        return True

    def _free_backup_slots(self, host, hstate, hswa):
        """Give a backup's host slots back (None / empty: none of that pool)."""
        if host is not None and host.size:
            self._host.free(host)
        if hstate is not None:
            self._host_mamba.free(hstate)
        if hswa is not None and hswa.size:
            self._host_swa.free(hswa)

    def _swa_host_alloc(self, n):
        """``n`` SWA host slots; when the pool is short, ``n`` SWA host units are
        evicted first (SGLang's reclaim ``evict_host(n, SWA)``, the whole request,
        not the shortfall). None when they cannot be found. Under the cache lock."""
        h = self._host_swa.alloc(n)
        if h is None:
            self._evict_host_swa(n)
            h = self._host_swa.alloc(n)
        return h

    def _run_path_cap(self, s):
        """An insert's ``A_PATH_CAP`` row (Mamba's per-path cap with the host tier, at
        its place among the insert's backups, as SGLang's action): the cap's
        tombstones, their state slots freed. Under the cache lock."""
        eng = self._engine
        st, _ = eng.k.path_cap(s)
        assert st == L.OK, st
        self._ex.run(eng.actions(), eng.out)

    def flush_pending_backups(self):
        """Submit the queued backups as one transfer with one ack (SGLang
        ``flush_pending_backups``); ``writing_check`` then completes it."""
        if self._host is None:
            return
        with self._mutex:
            if self._write_queue:
                self._write_acks.append(self._write_queue)
                self._write_queue = []

    def writing_check(self, write_back=False, finish_count=None):
        """Complete submitted backups (SGLang ``writing_check``): the oldest
        ``finish_count`` acks (every submitted one when None; transfers here are
        synchronous, so each is complete). Per node of an ack: its pending mark is
        cleared (on both fragments if it was split meanwhile), its device lock
        released and, with events on, a ``BlockStored`` medium ``CPU_PINNED``
        queued, parents first. Backups not yet submitted
        (``flush_pending_backups``) wait; ``write_back=True`` submits them first."""
        write_back = as_flag(write_back, "write_back")
        if self._host is None:
            return
        with self._mutex:
            if write_back:
                self.flush_pending_backups()
            k = len(self._write_acks) if finish_count is None else min(
                as_count(finish_count, "finish_count"), len(self._write_acks))
            eng = self._engine
            for _ in range(k):
                for ack in self._write_acks.popleft():
                    del self.ongoing_write_through[ack]
                    # write-through holds a device lock until the ack; write-back none
                    st, _ = eng.k.backup_ack(ack, ack, self._hicache_policy != "write_back",
                                             self._wt_swa.pop(ack, 0))
                    assert st == L.OK, st
                    self._ex.run(eng.actions(), eng.out, free=False)

    def check_hicache_events(self):
        """One scheduler step's HiCache poll (SGLang ``check_hicache_events``):
        ``flush_pending_backups``, then ``writing_check`` and ``loading_check``."""
        if self._host is None:
            return
        with self._mutex:
            self.flush_pending_backups()
            self.writing_check()
            self.loading_check()

    def inc_host_lock_ref(self, node):
        """SGLang ``inc_host_lock_ref``: pin ``node``'s host copy against host eviction
        (a scheduler pins a match's ``best_match_node`` around ``init_load_back``). Returns
        the receipt (``IncLockRefResult``; ``component_host_lock_uuids`` ``{FULL: stamp}``;
        empty when the node has no host copy, except under write-back, which pins any node,
        as SGLang). On a Mamba cache the node's Mamba host lock is taken as well, whatever
        it holds (SGLang's Mamba component; never the root), and ``dec_host_lock_ref``
        releases it with any receipt of this node. On an SWA cache the SWA host window lock
        is taken too (the receipt's ``{SWA: stamp}``; None when it reached the root). A host
        lock does not keep a device-only node from device eviction (as SGLang's): pin such a
        node with ``inc_lock_ref`` too, or release the receipt before it can be evicted (a
        release on a deleted node raises ``NodeAccessError``). ``NodeAccessError`` for a
        stale id. O(1)."""
        nid = as_node_id(node, "node")
        with self._mutex:
            stamp = swa_stamp = 0
            if self._host is not None:
                st, stamp, swa_stamp = self._engine.k.host_lock(nid)
                if st == L.E_STALE:
                    raise self._c._stale(nid)
            else:
                self._c._slot(nid)  # NodeAccessError for a stale id
        uuids = {ComponentType.FULL: int(stamp)} if stamp else {}
        if self._host_swa is not None:
            uuids[ComponentType.SWA] = int(swa_stamp) or None
        return IncLockRefResult(None, nid, (), {}, uuids)   # delta None, as SGLang's

    def dec_host_lock_ref(self, node, params):
        """SGLang ``dec_host_lock_ref``: release what ``inc_host_lock_ref`` returned
        (``params``: the receipt or its ``to_dec_params()``): the host lock from
        ``node`` up to the receipt's boundary (a split since may have extended the
        segment upwards). Checked first: ``NodeAccessError`` (stale id),
        ``LockRefError`` (a receipt of another node, boundary not on the path, or no
        host lock left);
        nothing changes then. Returns a ``DecLockRefResult``. O(segment)."""
        nid = as_node_id(node, "node")
        uuids = getattr(params, "component_host_lock_uuids", None)
        anchor = getattr(params, "node_id", None)
        if anchor is not None and anchor != nid:
            raise LockRefError(f"dec_host_lock_ref: the receipt is anchored on node {anchor}, "
                               f"released on node {nid}")
        if uuids is None:
            raise TypeError("params must be the IncLockRefResult of inc_host_lock_ref or its "
                            f"to_dec_params(), got {type(params).__name__}")
        if not hasattr(uuids, "get"):
            raise TypeError("params.component_host_lock_uuids must be a dict, got "
                            f"{type(uuids).__name__}")
        stamp = uuids.get(ComponentType.FULL)
        swa_stamp = uuids.get(ComponentType.SWA)
        for c, x in ((ComponentType.FULL, stamp), (ComponentType.SWA, swa_stamp)):
            if x is not None and (isinstance(x, bool) or not isinstance(x, (int, np.integer))):
                raise TypeError(f"params.component_host_lock_uuids[{c.name}] must be an int "
                                f"stamp, got {type(x).__name__}")
        with self._mutex:
            if self._host is None or not (stamp or self._host_mamba is not None
                                          or self._host_swa is not None):
                self._c._slot(nid)  # NodeAccessError for a stale id, also with an empty receipt
                return DecLockRefResult()
            # checks the id too; on a Mamba cache the node's Mamba host lock goes as well,
            # on an SWA cache the SWA host window
            st, _ = self._engine.k.host_unlock(nid, int(stamp or 0), int(swa_stamp or 0))
        if st == L.E_STALE:
            raise self._c._stale(nid)
        if st != L.OK:
            raise LockRefError(f"dec_host_lock_ref: node {nid} holds no host lock of the "
                               f"receipt's segment (boundary {stamp}"
                               + (", or no Mamba host lock" if self._host_mamba is not None
                                  else "") + ")")
        return DecLockRefResult()

    def is_backuped(self, node):
        """Whether ``node`` holds a Full host value (SGLang ``is_backuped``)."""
        s = self._c._slot(node)
        return Q.has(self._engine, s, L.FULL, L.HOST)

    # ------------------------------------------------------------------ write-back
    def _write_back_backup(self, nid):
        """Back up the unbacked device node ``nid`` before its demotion or, in an
        SWA or Mamba round, before its tombstone (write-back: that node only; its
        Mamba device state too when it has no host copy, and the SWA data of its
        window without one; ``_backup_node``), then complete it at once
        as SGLang's eviction does (``writing_check(write_back=True)``). Returns
        False when no host slots could be found (host eviction included; for the
        state: one host state evicted first). Under the cache lock."""
        s = nid & 0xFFFFFFFF
        eng = self._engine
        state = self._host_mamba is not None and Q.state_needs_backup(eng, s)
        wnodes, wdev = self._swa_backup_plan(s)
        r = self._backup_node(s, Q.key_len(eng, s), state, wnodes, wdev, nid, False)
        if r is None:
            self.raise_transfer_error()  # the victim stays on the device, unbacked
        if not r:
            return False
        self._write_queue.append(nid)
        self.writing_check(write_back=True)
        return True

    def _swa_victim(self, nid, units, collect=None):
        """A write-back SWA round's internal victim (``E_NEED_STATE_BACKUP`` with the
        ``units`` of unbacked SWA data in its window, SGLang's SWA
        ``InternalStateBackup``): that much SWA host room evicted first when the
        SWA host pool is short, the node backed up (``_write_back_backup``: its
        Full KV and that SWA data), then its SWA data tombstoned when it still
        qualifies (``host.finish_swa_eviction``; a Mamba state on it goes too).
        Returns what it freed per component; with ``collect`` (a list per
        component) the caller frees the slots (``Executor.run``). Under the cache
        lock."""
        eng = self._engine
        if self._host_swa.available_size() < units:
            self._evict_host_swa(units)
        if self.ongoing_write_through:  # another backup may cover the node: finish it
            self.writing_check(write_back=True)
        self._write_back_backup(nid)
        st, k, m = eng.k.finish_swa_eviction(nid)
        assert st == L.OK, st
        self._ex.run(eng.actions(), eng.out, free=collect is None, collect=collect)
        return _counts(swa=int(k), mamba=int(m))

    def _state_victim(self, nid, collect=None):
        """A write-back Mamba round's internal victim (``E_NEED_STATE_BACKUP``,
        SGLang's ``InternalStateBackup``): one host state evicted first when the
        state pool is empty, the node backed up (``_write_back_backup``), then its
        state tombstoned when it still qualifies (``host.finish_state_eviction``).
        Returns what it freed per component (``collect`` as ``_swa_victim``). Under
        the cache lock."""
        eng = self._engine
        if self._host_mamba.available_size() < 1:
            self._evict_host_states(1)
        if self.ongoing_write_through:  # another backup may cover the node: finish it
            self.writing_check(write_back=True)
        self._write_back_backup(nid)
        st, k = eng.k.finish_state_eviction(nid)
        assert st == L.OK, st
        self._ex.run(eng.actions(), eng.out, free=collect is None, collect=collect)
        return _counts(mamba=int(k))

    def _write_back_victim(self, nid, collect=None):
        """The deferred demote of an evicted write-back victim: back it up and
        demote it, or, when the host is full, drop it with its host-only subtree
        (SGLang ``drop_subtree_no_host``; declined while any of it is locked or in
        flight: the node then stays on the device). Executes the step's actions
        (``collect`` as ``_swa_victim``) and returns ``(what it freed per
        component, the freed Full slots)``."""
        eng = self._engine
        s = nid & 0xFFFFFFFF
        had_state = self._mamba and Q.has(eng, s, L.MAMBA)
        swa_units = Q.key_len(eng, s) if self._swa and Q.has(eng, s, L.SWA) else 0
        if self._write_back_backup(nid):
            st, n = eng.k.demote_leaf(nid)
            assert st == L.OK, st
        else:
            st, n, _ = eng.k.drop_subtree(nid)
            assert st == L.OK, st
        freed = self._ex.run(eng.actions(), eng.out, free=collect is None, collect=collect)
        n = int(n)
        return _counts(n, swa_units if n > 0 else 0, int(had_state and n > 0)), freed

    def write_back_step(self, c, st, nid, units, collect):
        """One step of a step-wise round of component ``c`` under write-back that
        ``evict_next`` answered ``st`` (``E_NEED_BACKUP``: the leaf victim ``nid``;
        ``E_NEED_STATE_BACKUP``: the internal victim ``nid``, ``units`` its unbacked
        SWA data). The slots go to ``collect`` (the controller frees them). Returns
        ``(the deleted node's id or None, what it freed per component, the freed
        Full slots)``. Under the cache lock."""
        if st == L.E_NEED_BACKUP:
            counts, freed = self._write_back_victim(nid, collect)
            return int(nid), counts, freed
        if c == L.SWA:
            return None, self._swa_victim(nid, units, collect), _EMPTY
        return None, self._state_victim(nid, collect), _EMPTY

    def write_back_evict(self, want):
        """``evict`` under write-back (``want``: the units to free per component):
        SGLang's step-wise rounds (a victim's backup runs before its demotion; an
        SWA or Mamba round's internal victim is backed up before its tombstone):
        the Full round, then each auxiliary component's round for what the earlier
        rounds did not free. Returns ``(freed per component, freed slots parts)``."""
        done, parts = self._write_back_round(L.FULL, int(want[L.FULL]))
        for c in range(L.N_COMPONENTS):
            if c != L.FULL and want[c] > done[c]:
                more, more_parts = self._write_back_round(c, int(want[c] - done[c]))
                for x in range(L.N_COMPONENTS):  # a leaf victim frees every component
                    done[x] += more[x]
                parts += more_parts
        self.writing_check(write_back=True)
        return done, parts

    def _write_back_round(self, c, num):
        eng = self._engine
        if eng.k.evict_start(c, num) != L.OK:
            raise RuntimeError("device eviction already in progress")
        done = _counts()
        step = np.zeros(L.N_COMPONENTS, dtype=np.int64)
        parts = []
        try:
            while True:
                st, nid = eng.k.evict_next(c, step)
                if st == L.E_NEED_BACKUP:
                    counts, freed = self._write_back_victim(nid)
                    parts.append(freed)
                elif st == L.E_NEED_STATE_BACKUP:
                    counts = (self._swa_victim(nid, int(step[L.SWA])) if c == L.SWA
                              else self._state_victim(nid))
                else:
                    parts.append(self._ex.run(eng.actions(), eng.out))
                    if not step.any():
                        break
                    counts = step.tolist()
                for x in range(L.N_COMPONENTS):
                    done[x] += counts[x]
        finally:
            eng.k.evict_end(c)
        return done, parts

    # ------------------------------------------------------------------ host eviction
    def evict_host(self, num_tokens, component_type=None):
        """SGLang ``evict_host(num_tokens, component_type=FULL)``: free host data of
        one component, returning what it freed of that component (may exceed the request:
        whole nodes). Full: host leaves in policy order (tokens; under write-back the
        duplicates' host copies first). ``ComponentType.MAMBA`` (a Mamba cache):
        ``num_tokens`` host *states* from the Mamba host LRU's least recent end, skipping
        host-locked ones; a host leaf goes whole (its Full host value too), another node
        loses its host state only. ``ComponentType.SWA`` (an SWA cache): SWA host tokens
        from the SWA host LRU the same way. The host slots go back to their pools.
        ``ValueError`` for another component or a cache without a host tier; nothing changes
        then."""
        self._check_host("evict_host")
        ct = L.FULL
        if component_type is not None:
            if isinstance(component_type, bool) or not isinstance(component_type,
                                                                   (int, np.integer)):
                raise ValueError(f"component_type must be a ComponentType, got "
                                 f"{component_type!r}")
            ct = int(component_type)
            ok = ((L.FULL,) + ((L.SWA,) if self._host_swa is not None else ())
                  + ((L.MAMBA,) if self._host_mamba is not None else ()))
            if ct not in ok:
                raise ValueError("component_type must be "
                                 + " or ".join(f"ComponentType.{ComponentType(c).name}"
                                               for c in ok)
                                 + f" (what this cache's host tier holds), got {component_type!r}")
        n = min(as_count(num_tokens, "num_tokens"), 1 << 62)  # a huge count: everything
        with self._mutex:
            if ct == L.MAMBA:
                return self._evict_host_states(n)
            if ct == L.SWA:
                return self._evict_host_swa(n)
            return self._evict_host_units(n)

    def _evict_host_units(self, n):
        return self._evict_host_with(self._engine.k.evict_host, n)

    def _evict_host_swa(self, n):
        return self._evict_host_with(self._engine.k.evict_host_aux, n, L.SWA)

    def _evict_host_states(self, n):
        return self._evict_host_with(self._engine.k.evict_host_aux, n, L.MAMBA)

    def _evict_host_with(self, kernel, n, *args):
        """Run a host-eviction kernel (``(status, freed, ...)``; ``args`` before the
        count) until ``n`` of its component are freed or nothing is left,
        executing each call's frees; grows the buffers on ``E_CAPACITY`` and goes
        on. Returns what it freed."""
        eng = self._engine
        done = 0
        while True:
            r = kernel(*args, n - done)
            done += r[1]
            self._ex.run(eng.actions(), eng.out, free=False)
            if r[0] == L.OK:
                return done
            eng.grow()

    # ------------------------------------------------------------------ sizes
    def host_total_size(self):
        """Tokens holding a Full host copy."""
        return int(self._engine.meta[L.M_HOST_TOTAL])

    def all_host_values_flatten(self):
        """Every node's Full host slots, concatenated in DFS order (int64 numpy)."""
        from . import inspection

        with self._mutex:
            return inspection.all_host_values_flatten(self._engine)

    def host_evictable_size(self):
        """Tokens of the evictable host leaves (what ``evict_host`` can free now)."""
        return int(self._engine.meta[L.M_HOST_EVICTABLE])

    def swa_host_total_size(self):
        """Tokens holding an SWA host value (0 without SWA on the host tier)."""
        return int(self._engine.meta[L.M_SWA_HOST_TOTAL])

    def mamba_host_total_size(self):
        """Mamba states held on the host (0 without Mamba on the host tier)."""
        return int(self._engine.meta[L.M_MAMBA_HOST_TOTAL])
