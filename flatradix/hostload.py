"""The host tier's load-backs (SGLang 0.5.23 spec §8.4): ``init_load_back``,
``load_back``, their commit (``_load``), ``ready_to_load_host_cache`` and
``loading_check``. Methods of ``hicache.HostTier`` (each takes the tier as
``self``), kept in their own module; the kernels are ``core/host.py``'s.
"""

import numpy as np

from . import inspection as Q
from ._cast import as_count, as_node_id
from .errors import LockRefError
from .kernels import layout as L
from .kernels.layout import E_HOST_STATE
from .types import EvictParams, InitLoadBackParams


class _Declined(Exception):
    """A load-back given up after its slots were taken (they go back)."""


def _np64(x):
    """An allocator's slots (numpy or torch) as contiguous int64 numpy."""
    if hasattr(x, "cpu"):  # a torch tensor
        x = x.cpu().numpy()
    return np.ascontiguousarray(x, dtype=np.int64)


_EMPTY = np.empty(0, dtype=np.int64)


def init_load_back(self, params):
    """SGLang ``init_load_back(InitLoadBackParams)``: load the host part of a
    match back to the device when ``params.best_match_node`` is host-only,
    ``params.host_hit_length > 0`` or (Mamba) ``params.req.mamba_host_hit_length > 0``
    or (SWA) ``params.req.swa_host_hit_length > 0``. Returns ``(loaded_tokens, node)``:
    the best match node when Full tokens were loaded, else ``(0, params.req.last_node)``
    (the request's device match; ``params.req`` may be None, then the best match node's
    id is returned with 0). On a Mamba or SWA cache with ``req.last_node`` given, the
    count is SGLang's: the Full device tokens from the best node up to it once the load
    is in (a load of the best node's state or SWA window alone counts the nodes it made
    usable); without one, the Full tokens loaded. Checked before any change:
    ``req.last_node`` (``NodeAccessError`` when stale) and, on a Mamba cache,
    ``req.kv.mamba_pool_idx`` (None, or a slot the request holds: handed out by the
    state allocator and not held by the tree; ``ValueError`` / ``TypeError``
    otherwise)."""
    self._check_host("init_load_back")
    if type(params) is not InitLoadBackParams and not (
            hasattr(params, "best_match_node") and hasattr(params, "host_hit_length")):
        raise TypeError("params must be an InitLoadBackParams (best_match_node, "
                        f"host_hit_length, mem_quota, req), got {type(params).__name__}")
    best = as_node_id(params.best_match_node, "params.best_match_node")
    hit = as_count(params.host_hit_length, "params.host_hit_length")
    quota = params.mem_quota
    if quota is not None:
        quota = as_count(quota, "params.mem_quota")
    req = getattr(params, "req", None)
    given_last = getattr(req, "last_node", None) if req is not None else None
    if given_last is not None:
        given_last = as_node_id(given_last, "params.req.last_node")
        self._c._slot(given_last, "params.req.last_node")  # NodeAccessError when stale
    last = best if given_last is None else given_last
    state_hit = 0
    if self._host_mamba is not None and req is not None:
        state_hit = as_count(getattr(req, "mamba_host_hit_length", 0) or 0,
                             "params.req.mamba_host_hit_length")
        self._check_load_req(req, "params.req")
    if self._host_swa is not None and req is not None:
        state_hit += as_count(getattr(req, "swa_host_hit_length", 0) or 0,
                              "params.req.swa_host_hit_length")
    # a load when the best node is host-only or a hit is positive; with no
    # hit, a best node on the device (no units to load) is left as it is
    n, done = self._load(best, quota, "params.best_match_node",
                         hit == 0 and state_hit == 0, req)
    if done and (self._host_mamba is not None or self._host_swa is not None) \
            and given_last is not None:
        # SGLang counts the Full device tokens from the best node up to the
        # request's device node once the load is in (a state-only load too)
        n = self._path_units(best, given_last)
    if n > 0:
        return n, best
    return 0, last

def _path_units(self, top, until):
    """Full units from node ``top`` up to (not including) node ``until`` or the root."""
    with self._mutex:
        return Q.path_units(self._engine, top, until)

def load_back(self, node, mem_quota=None, req=None):
    """SGLang ``load_back``: restore the host-only nodes from ``node`` up to
    its first device ancestor and (Mamba) ``node``'s host-only state, into a
    fresh device slot, copied also into the request's own slot
    (``req.kv.mamba_pool_idx``; one is allocated when the request holds
    none, and given back when the load is not made). Returns True when a
    load was committed (to be completed by ``loading_check``)."""
    self._check_host("load_back")
    node = as_node_id(node, "node")
    if mem_quota is not None:
        mem_quota = as_count(mem_quota, "mem_quota")
    if req is not None and self._host_mamba is not None:
        self._check_load_req(req)
    return self._load(node, mem_quota, req=req)[1]

def _check_load_req(self, req, name="req"):
    """A Mamba load-back's request, checked before any change: ``.kv`` with
    ``mamba_pool_idx`` None or one state slot the request holds (handed out by
    the state allocator, not one the tree holds)."""
    kv = getattr(req, "kv", None)
    if kv is None or not hasattr(kv, "mamba_pool_idx"):
        raise ValueError(f"{name}: a Mamba load-back needs a request with a .kv holding "
                         "mamba_pool_idx (SGLang's Req)")
    if kv.mamba_pool_idx is not None:  # in the pool, handed out, not the tree's
        self._vals.mamba_slot(kv.mamba_pool_idx, f"{name}.kv.mamba_pool_idx")


def _load(self, nid, mem_quota, name="node", host_only=False, req=None):
    """Commit a load-back to node ``nid`` (checked ``mem_quota``); returns
    ``(Full units loaded, committed)``. ``host_only``: nothing at all (no pins
    taken and released) when ``nid`` is on the device. Mamba (SGLang's
    order): the pins, the request's slot, the plan, the threshold and quota,
    the Full slots (evicting), the restored state's slot (one state evicted
    when the pool is empty), the copies, the commit."""
    eng = self._engine
    with self._mutex:
        st, units, _ = eng.k.load_plan(nid)
        if st == L.E_STALE:
            raise self._c._stale(nid, name)
        if host_only and st == L.OK and units == 0:
            return 0, False
        mamba = self._host_mamba is not None
        if st != L.OK and not mamba:
            return 0, False
        # load_plan's host slots, for the transfer (evictions below reuse ``out``)
        host = eng.out[:units].copy() if self._transfer is not None and st == L.OK else None
        wnodes = whost = _EMPTY
        pinned = False
        if self._host_swa is not None:  # the host-only SWA data within the window
            wst, wu, wk = eng.k.swa_load_plan(nid)
            pinned = wst == E_HOST_STATE  # write-back: another load pins one of them
            if wu:
                whost = eng.out[:wu].copy()
                wnodes = eng.out[wu:wu + wk].copy()
        # both pins in one kernel (what inc_host_lock_ref + inc_lock_ref take)
        _, delta, stamp, swa_host_stamp, swa_stamp = eng.k.load_lock(nid)
        stamps = (stamp, swa_host_stamp, swa_stamp)
        slot = nid & 0xFFFFFFFF
        new_req_slot = None
        kv = getattr(req, "kv", None) if req is not None else None
        committed = False
        try:
            if mamba and kv is not None and not self._holds_state(kv) and \
                    self._state_host_only(slot):
                new_req_slot = self._state_device_alloc()
                if new_req_slot is None:
                    raise RuntimeError("Cannot alloc mamba for load_back: the Mamba state "
                                       "pool is empty and nothing is evictable")
                kv.mamba_pool_idx = self._vals.mamba_out(new_req_slot)[0]
            restore = mamba and st == L.OK and self._state_host_only(slot)
            if pinned or (restore and self._hicache_policy == "write_back"
                          and Q.load_pending(eng, slot) not in (0, nid)):
                # SGLang: a node of the spec (the state's, or one of the SWA
                # window's) is pinned by another load-back: the whole spec is
                # rejected (the caller recomputes)
                st, restore = E_HOST_STATE, False
            if st != L.OK:
                units = 0
                wnodes = _EMPTY
            if ((units < max(1, self.load_back_threshold) and not restore
                    and not wnodes.size)
                    or (mem_quota is not None and units + delta > mem_quota)):
                return 0, False
            alloc = self._c.token_to_kv_pool_allocator
            if alloc is None and (units or wnodes.size):
                raise ValueError("load_back needs a token_to_kv_pool_allocator to allocate "
                                 "device slots")
            # SGLang loads Full KV into the Full side alone (no SWA peers)
            full_alloc = alloc.full_attn_allocator if self._swa else alloc
            dev = _EMPTY
            if units:
                avail = alloc.full_available_size() if self._swa else alloc.available_size()
                if avail < units:
                    # a write-back victim's backup copy failure is raised here: the
                    # load is not made, its pins go back
                    self._c.evict(units - avail)
                dev = full_alloc.alloc(units)
                if dev is None:
                    return 0, False
                dev = (_np64(dev) if self._vals.dev is None
                       else self._vals.dev.native(dev, "token_to_kv_pool_allocator.alloc"))
            dstate = -1
            wdev = _EMPTY
            try:  # from here the load's own slots go back if it is not made
                if wnodes.size:  # the SWA window's device slots (SWA evicted when short)
                    wdev = self._swa_device_alloc(whost.shape[0])
                    if wdev is None:  # SGLang's rollback: the Full slots go back
                        wdev = _EMPTY
                        raise _Declined
                if restore:
                    d = self._state_device_alloc()  # may evict (and raise)
                    if d is None:  # SGLang's rollback: the Full slots go back
                        raise _Declined
                    dstate = d
                if not self._load_copies(units, dev, host, slot, dstate, kv) or (
                        wdev.size and not self._copy_slots("load_swa", self._vals.out(wdev),
                                                           whost)):
                    self.raise_transfer_error()
            except BaseException as e:
                if units:
                    self._vals.free(dev)
                if wdev.size:
                    alloc.swa_attn_allocator.free(self._vals.out(wdev))
                if dstate >= 0:
                    self._vals.free_mamba(np.array([dstate], dtype=np.int64))
                if isinstance(e, _Declined):
                    return 0, False
                raise
            load_id = nid if units else 0   # aux data alone: no Full marks
            dv = self._vals.dev
            # device values: the kernel writes tags, the restored rows are claimed
            # and the device slots copied into them (device.DeviceValues)
            st, _, at = eng.k.load_commit(nid, dev if dv is None else dv.tags(units), load_id,
                                          dstate, wnodes, wdev)
            assert st == L.OK, st
            if dv is not None and units:
                dv.write(dv.claim(eng, slot), dev)
            if wdev.size:  # SGLang's RebuildFullToSWAMapping for the restored window
                self._vals.set_swa_mapping(eng.out[at:at + wdev.shape[0]].copy(), wdev)
            self._ex.run(eng.actions(), eng.out, free=False)
            if dstate >= 0:
                self._vals.mamba_owned.add(dstate)
            self.ongoing_load_back[nid] = (load_id, stamps)
            self._load_queue.append(nid)
            committed = True
            return units, True
        finally:
            if not committed:
                self._load_unpin(nid, stamps)
                if new_req_slot is not None:
                    self._vals.free_mamba(np.array([new_req_slot], dtype=np.int64))
                    kv.mamba_pool_idx = None

def _swa_device_alloc(self, n):
    """``n`` SWA device slots (int64 numpy), the SWA shortfall evicted first when
    the SWA side is short (SGLang's ``_evict_swa_for_device_alloc``); None when
    they cannot be found. Under the cache lock."""
    side = self._c.token_to_kv_pool_allocator.swa_attn_allocator
    d = side.alloc(n)
    if d is None:
        short = n - self._c.token_to_kv_pool_allocator.swa_available_size()
        if short > 0:
            self._c.evict(EvictParams(num_tokens=0, swa_num_tokens=short))
        d = side.alloc(n)
    return None if d is None else _np64(d)

def _state_host_only(self, slot):
    return Q.state_host_only(self._engine, slot)

def mamba_host_hit(self, nid):
    """SGLang's ``mamba_host_hit_length`` of a match whose best match node is
    ``nid``: 1 when that node's state is on the host only (a load-back restores
    it), else 0."""
    return 1 if self._state_host_only(int(nid) & 0xFFFFFFFF) else 0

def _state_device_alloc(self):
    """One Mamba device state slot (an int), one state evicted first when the
    pool is empty (SGLang ``evict_for_alloc(mamba_num=1)``); None when none
    can be found. Under the cache lock."""
    alloc = self._vals.mamba
    d = alloc.alloc(1)
    if d is None:
        self._c.evict(EvictParams(num_tokens=0, mamba_num=1))
        d = alloc.alloc(1)
    if d is None:
        return None
    return int(np.asarray(d.cpu() if hasattr(d, "cpu") else d).reshape(-1)[0])

def _load_copies(self, units, dev, host, slot, dstate, kv):
    """Run the transfer callable for a load: the Full slots, then the node's
    state into ``dstate`` and into the request's own slot. False when one
    raised (kept for ``_raise_transfer_error``)."""
    if self._transfer is None:
        return True
    if units and not self._copy_slots("load", dev if self._vals.dev is not None
                                      else self._vals.out(dev), host):
        return False
    if dstate >= 0:
        hs = np.array([Q.host_state(self._engine, slot)], dtype=np.int64)
        targets = [dstate]
        if kv is not None and kv.mamba_pool_idx is not None:
            targets.append(int(kv.mamba_pool_idx))
        for t in targets:
            if not self._copy_slots("load_state", np.array([t], dtype=np.int64), hs):
                return False
    return True

def _load_unpin(self, nid, stamps):
    """Undo ``load_lock(nid)`` (a load that is not committed): the path lock,
    then the host lock (``stamps``: its Full, SWA host and SWA boundaries; the
    node's Mamba locks too). Under the cache lock."""
    eng = self._engine
    stamp, swa_host_stamp, swa_stamp = stamps
    st, x = eng.k.dec_lock_ref(nid, 0, swa_stamp)
    assert st == L.OK, (st, x)
    if stamp or self._host_mamba is not None or self._host_swa is not None:
        st, _ = eng.k.host_unlock(nid, stamp, swa_host_stamp)
        assert st == L.OK, st

def ready_to_load_host_cache(self):
    """Submit the committed loads as one transfer with one ack (SGLang
    ``ready_to_load_host_cache``); returns 0, or -1 when none was queued."""
    if self._host is None:
        return -1
    with self._mutex:
        if not self._load_queue:
            return -1
        self._load_acks.append(self._load_queue)
        self._load_queue = []
        return 0

def loading_check(self, finish_count=None):
    """Complete submitted load-backs (SGLang ``loading_check``): the oldest
    ``finish_count`` acks (all when None) release their device lock and their
    pin; the nodes keep both copies. When a caller's stray release (an unlock
    or a ``dec_host_lock_ref`` too many) took one of a load's pins, that load
    is completed all the same and its other pin released, the ack's other
    loads too, then ``LockRefError`` names the pin that was taken."""
    if self._host is None:
        return
    with self._mutex:
        k = len(self._load_acks) if finish_count is None else min(
            as_count(finish_count, "finish_count"), len(self._load_acks))
        eng = self._engine
        error = None
        for _ in range(k):
            for nid in self._load_acks.popleft():
                load_id, stamps = self.ongoing_load_back.pop(nid)
                # the ack, the path lock's and the host lock's release, in one kernel
                st, x = eng.k.load_finish(nid, load_id, *stamps)
                if st != L.OK:
                    e = self._load_finish_error(nid, stamps, st, x)
                    error = error or e   # the other loads of the ack complete all the same
        if error is not None:
            raise error

def _load_finish_error(self, nid, stamps, st, x):
    """A load whose own pin a caller's stray release took (an unlock or a
    dec_host_lock_ref too many): the load is completed (marks cleared), the
    pin still held is released, and the ``LockRefError`` naming the taken one
    is returned for ``loading_check`` to raise once its ack is done. Under the
    cache lock."""
    eng = self._engine
    stamp, swa_host_stamp, swa_stamp = stamps
    assert st != E_HOST_STATE and st != L.E_STALE, st
    eng.k.load_ack(nid, nid)
    if x < 0:  # the host lock was taken: release the path lock
        eng.k.dec_lock_ref(nid, 0, swa_stamp)
        return LockRefError(f"loading_check: the load-back's host lock on node {nid} was "
                            "released by another call (a dec_host_lock_ref too many)")
    if stamp or swa_host_stamp:
        # the path lock was taken: release the host lock if its segment holds it
        eng.k.host_unlock(nid, stamp, swa_host_stamp)
    return LockRefError(f"loading_check: the load-back's path lock on node {nid} was "
                        "released by another call (an unlock too many)")
