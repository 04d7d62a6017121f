"""The cache's batched calls (flatradix extensions): ``match_prefix_batch``,
``inc_lock_ref_batch`` / ``dec_lock_ref_batch``, ``lock_batch`` / ``unlock_batch``.
Methods of ``UnifiedRadixCache`` (each takes the cache as ``self``), kept in their
own module; one kernel call each.
"""

import numpy as np

from ._cast import _NID_END, _NID_MIN, as_flag, as_node_id
from .errors import LockRefError
from .kernels import layout as L
from .types import (
    ComponentType, DecLockRefParams, DecLockRefResult, IncLockRefResult, MatchPrefixParams,
    MatchResult, RadixKey, TreeLock,
)

_I64 = np.dtype(np.int64)
_tuple_new = tuple.__new__


def match_prefix_batch(self, params):
    """``match_prefix`` of many keys in one kernel call (flatradix extension):
    e.g. scoring a whole waiting queue for a longest-prefix-match policy.

    ``params``: a list (or tuple) of ``MatchPrefixParams`` / ``RadixKey``.
    Returns the list of ``MatchResult`` that ``[match_prefix(p) for p in
    params]`` returns, with the same effects on the tree (splits, recency), in
    order. Each result's ``device_indices`` is a view of one array shared by
    the batch. Every key is validated before anything changes (errors name
    ``params[i].key``). A batch with a ``cow_mamba`` match runs as single
    calls (a copy-on-write may evict a state before the next match).
    O(total key length).
    """
    if not isinstance(params, (list, tuple)):
        raise TypeError(f"params must be a list of MatchPrefixParams / RadixKey, got "
                        f"{type(params).__name__}")
    k = len(params)
    eng = self._engine
    get = eng.ns.get
    key_of = self._key
    parts, lens_l, nss_l = [], [], []
    cow = False
    page = self.page_size
    # the common key (plain int64 numpy tokens, default namespace) skips _key's
    # checks: what they would accept and return for it, inline
    plain_ok = not self.is_eagle
    default_ns = get((None, None))
    if default_ns is None:
        default_ns = -1
    for i, p in enumerate(params):
        if type(p) is MatchPrefixParams:
            key = p.key
            if p.cow_mamba is not False:
                cow = (as_flag(p.cow_mamba, f"params[{i}].cow_mamba") and self._check_cow(p)
                       or cow)
        else:
            key = p
        if plain_ok and type(key) is RadixKey and key.extra_key is None and (
                key.cache_salt is None and not key.is_bigram):
            units = key.token_ids
            if type(units) is np.ndarray and units.dtype is _I64 and units.ndim == 1:
                n = units.shape[0]
                n -= n % page
                ns = default_ns if n else -1
                lens_l.append(n if ns >= 0 else 0)
                nss_l.append(ns)
                parts.append(units[:n] if ns >= 0 else units[:0])
                continue
        units, n, nk, _ = key_of(key, f"params[{i}].key")
        ns = get(nk)
        if ns is None or n == 0:
            ns, n = -1, 0
        lens_l.append(n)
        nss_l.append(ns)
        parts.append(units if n == units.shape[0] else units[:n])
    if self.disable or k == 0:
        return [self._empty_match() for _ in range(k)]
    if cow:  # a copy-on-write may evict a state between two matches: one at a time
        return [self.match_prefix(p) for p in params]
    lens = np.array(lens_l, dtype=np.int64)
    nss = np.array(nss_l, dtype=np.int64)
    offs = np.zeros(k, dtype=np.int64)
    np.cumsum(lens[:-1], out=offs[1:])
    total = int(offs[-1] + lens[-1])
    res = np.empty((k, 6), dtype=np.int64)
    with self._mutex:  # the scratch rows are the engine's: filled and read under the lock
        buf = eng.batch_buffers(total)
        keys, out = buf[0, :total], buf[1, :total]
        np.concatenate(parts, out=keys)
        _, packed = eng.k.match_prefix_batch(keys, offs, lens, nss, out, res)
        if self._vals.dev is not None:   # pool rows: one gather for the whole queue
            idx = self._vals.dev.take(out[:packed])
        else:
            idx = out[:packed].copy()  # the packed matched indices (the scratch is reused)
    pos = np.zeros(k + 1, dtype=np.int64)
    np.cumsum(res[:, 0], out=pos[1:])
    if self._vals.dev is None:
        idx = self._vals.out(idx)
    swa = self._swa
    mamba = self._mamba
    host = self._hicache
    mamba_host = host.mamba_pool_host is not None
    shosts = mhosts = None
    if host.swa_pool_host is not None or mamba_host:  # host hits, all under one lock
        with self._mutex:
            hb = res[:, 5].tolist()
            if host.swa_pool_host is not None:
                hit = eng.k.swa_host_hit
                shosts = [hit(h) for h in hb]
            if mamba_host:
                mhosts = [host.mamba_host_hit(h) for h in hb]
    results = []
    for i, ((plen, best, vis, full_hit, host_hit, hbest), p0) in enumerate(
            zip(res.tolist(), pos[:-1].tolist())):
        if full_hit == 0 and plen == 0 and vis < 0:
            results.append(_tuple_new(MatchResult, (
                idx[p0:p0], best, best, best, 0, 0, 0, None, 0, None, 0, None, None, None)))
            continue
        branch = full_hit if swa and full_hit > plen + host_hit else None
        shost = 0 if shosts is None else shosts[i]
        # the Mamba fields as match_prefix computes them (the host-only test read
        # the node after the whole batch: a later key may have changed it, as
        # SGLang's finaliser runs at each match -- only a split can, which keeps
        # the state)
        mbranch = self._mamba_branch(full_hit, plen + host_hit) if mamba else None
        mhost = mhosts[i] if mamba_host else 0
        results.append(_tuple_new(MatchResult, (
            idx[p0:p0 + plen], best, hbest, hbest, host_hit, plen, full_hit,
            None if vis < 0 else vis, shost, branch, mhost, mbranch, None, None)))
    return results

def inc_lock_ref_batch(self, nodes, skip_lock_components=()):
    """``inc_lock_ref`` of each node of ``nodes`` (a list of NodeIds) in one kernel
    call (flatradix extension, for a batch admission); returns the receipts in
    order. Every id is checked first: a stale one raises ``NodeAccessError``
    naming ``nodes[i]`` and nothing is locked."""
    nids = self._node_ids(nodes)
    skip = skip_lock_components
    if not (type(skip) is tuple and not skip):
        skip = self._skip_components(skip)
    if self.disable:
        return [self.inc_lock_ref(int(x), skip) for x in nids]
    skip_mask = ((L.C_SWA if ComponentType.SWA in skip else 0)
                 | (L.C_MAMBA if ComponentType.MAMBA in skip else 0))
    out = np.empty((nids.shape[0], 2), dtype=np.int64)
    with self._mutex:  # the arrays are read under the lock: a growth replaces them
        st, bad = self._engine.k.inc_lock_ref_batch(nids, skip_mask, out)
    if st == L.E_STALE:
        raise self._stale(int(nids[bad]), f"nodes[{bad}]")
    swa = self._swa and not skip_mask & L.C_SWA
    return [IncLockRefResult(d, nid, skip, {ComponentType.SWA: b or None})
            if swa else IncLockRefResult(d, nid, skip)
            for nid, (d, b) in zip(nids.tolist(), out.tolist())]

def dec_lock_ref_batch(self, nodes, receipts=None, skip_swa=False):
    """``dec_lock_ref`` of each node of ``nodes`` with its receipt (``receipts[i]``;
    optional for Full-only caches) in one kernel call (flatradix extension).
    ``skip_swa``: one bool for all, or one per node. All or nothing: every
    receipt is checked first, and a release that would fail (stale, unlock
    without lock, released twice in the batch) raises as ``dec_lock_ref``
    naming ``nodes[i]``, with the tree unchanged."""
    nids = self._node_ids(nodes)
    k = nids.shape[0]
    if receipts is not None and (not isinstance(receipts, (list, tuple)) or len(receipts) != k):
        raise TypeError(f"receipts must be a list of {k} receipts (one per node) or None")
    if isinstance(skip_swa, (list, tuple)):
        if len(skip_swa) != k:
            raise TypeError(f"skip_swa must be a bool or a list of {k} bools")
        flags = [as_flag(x, f"skip_swa[{i}]") for i, x in enumerate(skip_swa)]
    else:
        flags = [as_flag(skip_swa, "skip_swa")] * k
    if self.disable:
        return [DecLockRefResult() for _ in range(k)]
    skips = np.zeros(k, dtype=np.int64)
    bounds = np.zeros(k, dtype=np.int64)
    for i, nid in enumerate(nids.tolist()):
        r = None if receipts is None else receipts[i]
        if r is not None or self._swa or self._mamba:
            skips[i], bounds[i] = self._receipt(nid, r, f"receipts[{i}]")
        if flags[i]:
            skips[i] |= self._early_mask
    self._dec_batch(nids, skips, bounds)
    return [DecLockRefResult() for _ in range(k)]

def _dec_batch(self, nids, skips, bounds):
    """One ``dec_lock_ref_batch`` kernel call on checked arguments (int64 arrays);
    its refusals raised as ``dec_lock_ref_batch`` documents, nothing changed."""
    with self._mutex:  # the arrays are read under the lock: a growth replaces them
        st, i, x, comp = self._engine.k.dec_lock_ref_batch(nids, skips, bounds)
        if st == L.E_NOT_ANCHORED:
            raise LockRefError(f"nodes[{i}]: no lock is anchored at node {int(nids[i])} "
                               "(its lock_ref is held by locks on its descendants, or the batch "
                               "released it already)")
        if st == L.E_LOCK_UNDERFLOW:
            self._raise_underflow(int(x), int(nids[i]), name=f"nodes[{i}]", comp=int(comp))
    if st == L.E_STALE:
        raise self._stale(int(nids[i]), f"nodes[{i}]")

def lock_batch(self, nodes, skip_lock_components=()):
    """``lock`` of each node in one call: a list of ``TreeLock``."""
    nids = self._node_ids(nodes)
    if (self._plain_locks and not self.disable and type(skip_lock_components) is tuple
            and not skip_lock_components):
        # Full-only: each receipt holds nothing but its node (see ``lock``)
        out = np.empty((nids.shape[0], 2), dtype=np.int64)
        with self._mutex:  # the arrays are read under the lock: a growth replaces them
            st, bad = self._engine.k.inc_lock_ref_batch(nids, 0, out)
        if st == L.E_STALE:
            raise self._stale(int(nids[bad]), f"nodes[{bad}]")
        return [TreeLock(nid, DecLockRefParams(nid, (), {}, {})) for nid in nids.tolist()]
    return [TreeLock(nid, r.to_dec_params())
            for nid, r in zip(nids.tolist(), self.inc_lock_ref_batch(nids, skip_lock_components))]

def unlock_batch(self, locks):
    """``unlock`` of each ``TreeLock`` in one call, all or nothing (``None``
    entries skipped); a lock released early (``release_swa``) skips its window."""
    if not isinstance(locks, (list, tuple)):
        raise TypeError(f"locks must be a list of TreeLock, got {type(locks).__name__}")
    held = [lk for lk in locks if lk is not None]
    for lk in held:
        if not isinstance(lk, TreeLock):
            raise TypeError(f"locks must hold flatradix.TreeLock, got {type(lk).__name__}")
    if not held:
        return
    if self._plain_locks and not self.disable:
        # Full-only plain receipts (as ``unlock``'s short path): no receipt work
        if all(_plain_lock(lk) for lk in held):
            zeros = np.zeros(len(held), dtype=np.int64)
            self._dec_batch(np.array([lk.node for lk in held], dtype=np.int64), zeros, zeros)
            return
    self.dec_lock_ref_batch([lk.node for lk in held], [lk.receipt for lk in held],
                            skip_swa=[lk.swa_released for lk in held])

def _node_ids(self, nodes):
    """``nodes`` (a list / array of NodeIds) as an int64 array (``TypeError``)."""
    if isinstance(nodes, np.ndarray) and nodes.dtype == np.int64 and nodes.ndim == 1:
        return np.ascontiguousarray(nodes)
    if not isinstance(nodes, (list, tuple, np.ndarray)):
        raise TypeError(f"nodes must be a list of NodeIds, got {type(nodes).__name__}")
    if type(nodes) is list and all(type(x) is int and _NID_MIN <= x < _NID_END
                                   for x in nodes):
        return np.array(nodes, dtype=np.int64).reshape(-1)  # plain ints: one conversion
    return np.array([as_node_id(x, f"nodes[{i}]") for i, x in enumerate(nodes)],
                    dtype=np.int64).reshape(-1)


def _plain_lock(lk):
    """Whether the ``TreeLock`` ``lk`` is one a Full-only cache's ``lock`` makes: an
    int64 node id, a ``DecLockRefParams`` receipt anchored on it that skips
    nothing, no early window release (its release then needs no receipt work)."""
    nid = lk.node
    rec = lk.receipt
    return (type(rec) is DecLockRefParams and type(nid) is int and rec.node_id == nid
            and not rec.skipped_lock_components and lk.swa_released is False
            and _NID_MIN <= nid < _NID_END)
