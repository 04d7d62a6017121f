"""The host tier's storage refills (SGLang 0.5.23 spec §8.6): ``insert_host`` and the
prefetch staging of the hybrid components. Methods of ``hicache.HostTier`` (each
takes the tier as ``self``), kept in their own module; the kernels are
``core/refill.py``'s.
"""

import operator

import numpy as np

from . import inspection as Q
from ._cast import as_int, as_int64, as_node_id
from .kernels import layout as L
from .types import InsertResult


def insert_host(self, node, key, host_value, hash_value=None, *, swa_host_value=None,
                mamba_host_value=None):
    """Add ``key`` with the host slots ``host_value`` below ``node`` (SGLang's tree
    ``insert_host``, spec §8.6: a storage prefetch's refill of the host tier).

    ``node``: the anchor, a NodeId (the match's ``last_host_node``); ``key``: a
    ``RadixKey`` of page-aligned length in the anchor's namespace (the tokens
    after the anchor); ``host_value``: int64 1-D host slots of
    ``mem_pool_host`` (one per token, handed out by ``alloc`` and not given to
    the tree yet). ``hash_value``: the storage page hashes (``len(key) //
    page_size`` of them) SGLang keeps on the nodes; accepted and checked for
    length, not stored: flatradix derives the event block hashes from the
    tokens, which for SGLang's storage hashing are the same.

    The walk touches the anchor and each matched node, splits a partially
    matched one and, under write-through (either kind), gives a node without
    a host copy its part of ``host_value`` (CPU ``BlockStored``); the rest
    becomes a new host-only node (CPU ``BlockStored``) -- dropped under
    write-through when the node it would hang from (not the root) has no host
    copy. Under write-back matched nodes take nothing.

    Hybrid models (SGLang's prefetch commit, phase ``PREFETCH``; the storage
    fetch of every pool must have succeeded -- SGLang discards a partial hybrid
    prefetch whole before this call): ``swa_host_value``, int64 1-D slots of
    ``swa_pool_host`` staging the SWA data of the key's *last*
    ``len(swa_host_value)`` units (whole pages, at most ``len(key)``; SGLang
    stages ``ceil(W / P)`` pages, fewer only under the root when the key is
    shorter). All or nothing: below a non-root anchor a staging shorter than
    ``ceil(W / P)`` pages, or a refill that inserted no node, keeps none of it;
    else each node from ``inserted_host_node`` up to the anchor within the staged
    span takes its part as its SWA host value unless it has one (a node the span
    starts inside is split there first). ``mamba_host_value``: one slot of
    ``mamba_pool_host`` staging the state at the key's end; ``inserted_host_node``
    takes it unless it already has a host state. **The cache owns the staging:**
    what the tree does not take it frees to ``swa_pool_host`` /
    ``mamba_pool_host`` itself (SGLang's commit and drop path do the same).

    Returns an ``InsertResult``: ``prefix_len`` (write-back: the matched length;
    write-through: the length of matched nodes that already had a host copy),
    ``total_len`` (the key's length), ``inserted_host_node`` (the new node,
    else the node the key ended on when it holds a host copy, else None; an
    empty key: None, as SGLang's),
    ``host_insert_dropped`` and, with ``mamba_host_value``, ``mamba_exist``
    (the staged state was freed: the node had a host state, or there was no
    node). Mutation: the tree and the host ledgers; of the Full slots nothing
    is freed: the caller frees ``host_value[:prefix_len]`` to
    ``mem_pool_host`` (all of it when dropped), as SGLang's controller does.

    Not checked (no owner is kept per host slot, as ``insert``'s device
    slots): a host slot the tree already holds; the host tier's slots are then
    owned twice and a later host eviction fails in ``HostKVPool.free``.

    Errors, nothing changed: ``ValueError`` without a host tier, for a key
    that is not page-aligned or not in the anchor's namespace, a
    ``host_value`` of another length, a host slot outside the pool, not handed
    out, or given twice, a ``hash_value`` of another length; an
    ``swa_host_value`` / ``mamba_host_value`` on a cache without that host pool,
    of the wrong length or shape, or with slots the pool has not handed out (or
    twice); ``TypeError`` for a non-``RadixKey`` key; ``NodeAccessError`` for a
    stale anchor. O(len(key)).
    """
    self._check_host("insert_host")
    nid = as_node_id(node, "node")
    units, n, nk, _ = self._c._key(key, "key")
    if n != units.shape[0]:
        raise ValueError(f"key: {units.shape[0]} units is not a multiple of page_size="
                         f"{self._c.page_size} (storage refills whole pages)")
    host = as_int64(host_value, "host_value")
    if host.ndim != 1 or host.shape[0] != n:
        raise ValueError(f"host_value must be 1-D with one host slot per key unit ({n}), "
                         f"got shape {tuple(host.shape)}")
    pool = self._host
    if not pool.all_held(host):
        raise ValueError(f"host_value: host slots must lie in 0..{pool.size - 1}, be handed "
                         "out by mem_pool_host and be distinct")
    if hash_value is not None:
        if isinstance(hash_value, (str, bytes)) or not hasattr(hash_value, "__len__"):
            raise TypeError("hash_value must be a list of page hashes or None, got "
                            f"{type(hash_value).__name__}")
        if len(hash_value) != n // self._c.page_size:
            raise ValueError(f"hash_value has {len(hash_value)} page hashes, the key "
                             f"{n // self._c.page_size} pages")
    staging = self._prefetch_staging(swa_host_value, mamba_host_value, n)
    eng = self._engine
    with self._mutex:
        slot = Q.slot(eng, nid)
        if slot < 0:
            raise self._c._stale(nid)
        ns = eng.ns.get(nk)
        if slot != L.ROOT and (ns is None or Q.namespace(eng, slot) != ns):
            raise ValueError("key: its namespace (extra_key, cache_salt) is not the anchor "
                             "node's")
        if ns is None:
            ns = eng.ns.intern(nk)
        st, plen, inserted, dropped = eng.k.insert_host(nid, units, host, n, ns)
        assert st == L.OK, st
        self._ex.run(eng.actions(), eng.out, free=False)
        exist = False
        if staging is not None:  # the walk's actions ran first, as SGLang's
            vals, n_swa, mamba_at = staging
            st, exist = eng.k.prefetch_commit(nid, -1 if dropped else inserted, n, vals,
                                              n_swa, mamba_at)
            assert st == L.OK, st
            self._ex.run(eng.actions(), eng.out, vals, free=False)
    return InsertResult(prefix_len=int(plen), total_len=n, mamba_exist=bool(exist),
                        inserted_host_node=None if inserted < 0 else int(inserted),
                        host_insert_dropped=bool(dropped))

def _prefetch_staging(self, swa_host_value, mamba_host_value, n):
    """``insert_host``'s SWA / Mamba staging checked and packed for
    ``prefetch_commit``: ``(slots, n_swa, mamba_at)`` (int64: the SWA slots, then
    the state), or None when neither is given. Raises as ``insert_host`` says."""
    if swa_host_value is None and mamba_host_value is None:
        return None
    parts = []
    n_swa = 0
    if swa_host_value is not None:
        if self._host_swa is None:
            raise ValueError("swa_host_value: this cache has no SWA host pool "
                             "(init_hicache(swa_host_size=...) on an SWA cache)")
        swa_slots = as_int64(swa_host_value, "swa_host_value")
        n_swa = swa_slots.shape[0] if swa_slots.ndim == 1 else -1
        if n_swa < 0 or n_swa % self._c.page_size or n_swa > n:
            raise ValueError(f"swa_host_value must be 1-D, whole pages of page_size="
                             f"{self._c.page_size} and at most the key's {n} units, got "
                             f"shape {tuple(swa_slots.shape)}")
        if not self._host_swa.all_held(swa_slots):
            raise ValueError(f"swa_host_value: SWA host slots must lie in "
                             f"0..{self._host_swa.size - 1}, be handed out by "
                             "swa_pool_host and be distinct")
        parts.append(swa_slots)
    mamba_at = -1
    if mamba_host_value is not None:
        if self._host_mamba is None:
            raise ValueError("mamba_host_value: this cache has no Mamba host pool "
                             "(init_hicache(mamba_host_size=...) on a Mamba cache)")
        if isinstance(mamba_host_value, bool):
            raise TypeError("mamba_host_value must be a host state slot (int), got bool")
        try:  # an int, or a 0-d integer array / tensor (SGLang's slot tensors)
            slot = operator.index(mamba_host_value)
        except TypeError:
            state = as_int64(mamba_host_value, "mamba_host_value").reshape(-1)
        else:
            state = np.array([as_int(slot, "mamba_host_value")], dtype=np.int64)
        if state.shape[0] != 1 or not self._host_mamba.all_held(state):
            raise ValueError(f"mamba_host_value must be one host state slot in "
                             f"0..{self._host_mamba.size - 1} handed out by "
                             f"mamba_pool_host, got {mamba_host_value!r}")
        mamba_at = n_swa
        parts.append(state)
    return np.concatenate(parts), n_swa, mamba_at
