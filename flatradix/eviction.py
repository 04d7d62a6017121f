"""The cache's device eviction: ``evict``, the step-wise rounds
(``evict_device_start`` / ``evict_device_next_node`` / ``evict_device_end``) and
``evict_for_alloc``. Methods of ``UnifiedRadixCache`` (each takes the cache as
``self``), kept in their own module; the kernels are ``core/evict.py``'s, the
write-back rounds the host tier's.
"""

import numpy as np

from ._cast import as_count
from .config import _COUNT_CLAMP, _component
from .kernels import layout as L
from .types import ComponentType, EvictParams, EvictResult, EvictStep

_EMPTY = np.empty(0, dtype=np.int64)


def _cat_or_empty(parts):
    """int64 concatenation of ``parts`` (a list of arrays), empty when none."""
    return np.concatenate(parts) if parts else _EMPTY.copy()


def evict(self, params):
    """Evict until ``num_tokens`` Full units (and ``swa_num_tokens`` SWA units) are freed.

    ``params``: ``EvictParams`` or an int (``num_tokens``). The Full walk
    deletes least-priority unlocked leaves; then, with SWA, the SWA walk takes
    the least recently used SWA data not covered by a window lock: a victim
    that is an unlocked leaf is deleted whole, any other loses its SWA data
    only (a tombstone). Leaves deleted by one walk count for both components,
    so the SWA walk is skipped when the Full walk freed enough SWA.
    Freed KV indices go to the allocator (or ``EvictResult.evicted_indices``
    -- the Full slots -- without one). Node-granular: may free more than
    asked. Cost O(evicted nodes * log leaves), independent of the tree's
    size. Asking for more than is evictable evicts everything evictable and
    returns what that freed (never an error; counts above 2**62, e.g. 2**63,
    are clamped). Raises ``TypeError`` for a non-int count and
    ``ValueError`` for a negative one, before anything changes.
    With Mamba, the Mamba walk then takes the least recently used states
    not locked (``mamba_num``): an unlocked leaf is deleted whole, another
    node loses its state only; states freed by the Full walk's deletions
    count. ``mamba_num`` / ``swa_num_tokens`` are validated the same way on
    a cache without that component, and ignored.
    """
    mamba_num = 0
    if isinstance(params, EvictParams):
        num = as_count(params.num_tokens, "params.num_tokens")
        swa_num = 0
        if params.swa_num_tokens != 0 or params.mamba_num != 0:
            swa_num = as_count(params.swa_num_tokens, "params.swa_num_tokens")
            mamba_num = as_count(params.mamba_num, "params.mamba_num")
        if not self._swa:
            swa_num = 0
        if not self._mamba:
            mamba_num = 0
    elif isinstance(params, (int, np.integer)) and not isinstance(params, bool):
        num = as_count(params, "params.num_tokens")
        swa_num = 0
    else:
        raise TypeError(f"params must be an EvictParams or an int (params.num_tokens), got "
                        f"{type(params).__name__}")
    num, swa_num = min(num, _COUNT_CLAMP), min(swa_num, _COUNT_CLAMP)
    mamba_num = min(mamba_num, _COUNT_CLAMP)
    no_alloc = self.token_to_kv_pool_allocator is None
    if self.disable or (num == 0 and swa_num == 0 and mamba_num == 0):
        return EvictResult(0, 0, 0, self._vals.empty() if no_alloc else None)
    eng = self._engine
    # per component (counts indexed by component): what to free, what was freed
    want = np.zeros(L.N_COMPONENTS, dtype=np.int64)
    want[L.FULL], want[L.SWA], want[L.MAMBA] = num, swa_num, mamba_num
    with self._mutex:
        if self._hicache.policy == "write_back":  # SGLang's step-wise rounds
            done, parts = self._hicache.write_back_evict(want)
        else:
            done = np.zeros(L.N_COMPONENTS, dtype=np.int64)
            parts = []
            phase = 0
            while True:
                st, phase = eng.k.evict(want, done, phase)
                parts.append(self._executor.run(eng.actions(), eng.out))
                if st == L.OK:
                    break
                eng.grow()  # out / acts too small for the next victim: grow, go on
    if not no_alloc:
        freed = None
    elif self._vals.dev is not None:
        freed = self._vals.dev.cat(parts)
    else:
        freed = self._vals.out(_cat_or_empty(parts))
    return EvictResult(int(done[L.FULL]), int(done[L.SWA]), int(done[L.MAMBA]), freed)

def evict_device_start(self, component=ComponentType.FULL, num_tokens=0):
    """Open a step-wise eviction round of ``num_tokens`` units for ``component``
    (FULL, or SWA / MAMBA when configured; Mamba counts states).

    Raises ``RuntimeError("device eviction already in progress")`` when one is
    open for that component, ``ValueError`` for a component that is not
    configured or a negative count, ``TypeError`` for a non-int count. Counts
    above 2**62 are clamped (the round then runs until nothing evictable is left).
    """
    c = self._check_component(component)
    num = min(as_count(num_tokens, "num_tokens"), _COUNT_CLAMP)
    with self._mutex:
        if self._engine.k.evict_start(c, num) != L.OK:
            raise RuntimeError("device eviction already in progress")

def evict_device_next_node(self, component=ComponentType.FULL):
    """One step of the open round; returns an ``EvictStep``.

    Full: the least-priority evictable leaf is deleted. SWA: the round's cursor
    is evicted (a leaf deleted whole, another node tombstoned: ``node_id``
    None, ``made_progress`` True); the cursor starts at the least recently
    used SWA data not covered by a window lock and each step moves it to the
    next more recent unlocked entry, so a refresh between steps does not
    change the next victim (SGLang §5.4; a cursor evicted or window-locked
    since restarts at the least recent unlocked entry).
    The step's slots are *not* freed by the cache: the controller frees
    ``freed_indices`` (Full) and the SWA peers of ``swa_freed_indices``
    (SGLang's "tree decides, cache executes"). ``made_progress`` False ends
    the round (request met, or nothing evictable).
    """
    c = self._check_component(component)
    eng = self._engine
    # the controller frees the step's slots: the executor runs the events only and
    # collects the slots per component
    collect = [[] for _ in range(L.N_COMPONENTS)]
    done = np.zeros(L.N_COMPONENTS, dtype=np.int64)  # the step's counts per component
    with self._mutex:
        st, nid = eng.k.evict_next(c, done)
        if st == L.E_NO_WALK:
            raise RuntimeError("no device eviction in progress: call evict_device_start first")
        if st == L.E_NEED_BACKUP or st == L.E_NEED_STATE_BACKUP:
            # write-back: back the victim up, then demote / drop it (a leaf) or
            # tombstone its SWA data / state (an internal node)
            nid, counts, freed = self._hicache.write_back_step(c, st, nid, int(done[c]),
                                                               collect)
        else:
            freed = self._executor.run(eng.actions(), eng.out, free=False, collect=collect)
            if not done.any():
                return EvictStep(None, self._vals.empty(), 0, False,
                                 swa_freed_indices=self._vals.empty(),
                                 mamba_freed_indices=self._mamba_empty())
            nid = None if nid < 0 else int(nid)
            counts = done.tolist()
        states = _cat_or_empty(collect[L.MAMBA])
        if states.size:  # the controller frees them: the tree holds them no more
            self._vals.mamba_owned.difference_update(states.tolist())
    dev = self._vals.dev
    if dev is not None:   # device arrays already (the executor's gathers)
        return EvictStep(nid, freed, counts[L.FULL], True,
                         swa_freed_indices=dev.cat(collect[L.SWA]),
                         swa_num_tokens=counts[L.SWA], mamba_freed_indices=None,
                         mamba_num=counts[L.MAMBA])
    return EvictStep(nid, self._vals.out(freed), counts[L.FULL], True,
                     swa_freed_indices=self._vals.out(_cat_or_empty(collect[L.SWA])),
                     swa_num_tokens=counts[L.SWA],
                     mamba_freed_indices=(self._mamba_slots(states) if self._mamba
                                          else None),
                     mamba_num=counts[L.MAMBA])

def _mamba_empty(self):
    return self._mamba_slots(_EMPTY) if self._mamba else None

def _mamba_slots(self, a):
    """int64 state slots as the Mamba allocator's kind."""
    if self._vals._mamba_numpy:
        return a.copy()
    import torch

    return torch.from_numpy(a.copy())

def evict_device_end(self, component=ComponentType.FULL):
    """Close the open round of ``component`` (idempotent); returns the units it evicted."""
    c = self._check_component(component)
    with self._mutex:
        return int(self._engine.k.evict_end(c))

def evict_for_alloc(self, params):
    """Evict until the allocator can serve an allocation.

    ``params`` an int ``n``: until the allocator has ``n`` free slots (Full).
    ``params`` an ``EvictParams`` (SGLang's meaning): its counts are the
    allocation's *shortfalls*; evict until the allocator's available Full
    (SWA) slots grew by ``num_tokens`` (``swa_num_tokens``) or nothing is
    left. Needs an allocator with ``available_size()`` (SWA:
    ``full_available_size()`` / ``swa_available_size()``). Returns an
    ``EvictResult`` for an ``EvictParams``, the Full units evicted for an int
    (0 when enough are free already; never an error). The check and the
    eviction run under the cache's lock (other threads' frees through the
    cache cannot interleave).
    """
    alloc = self.token_to_kv_pool_allocator
    if isinstance(params, EvictParams):
        num = as_count(params.num_tokens, "params.num_tokens")
        swa_num = as_count(params.swa_num_tokens, "params.swa_num_tokens")
        mnum = as_count(params.mamba_num, "params.mamba_num")
        if alloc is None:
            raise ValueError("evict_for_alloc needs a token_to_kv_pool_allocator")
        # each freed slot raises the allocator's available size by one (a
        # cascade's collateral frees count): evicting the shortfalls reaches it
        return self.evict(EvictParams(num_tokens=num, swa_num_tokens=swa_num,
                                      mamba_num=mnum))
    num = as_count(params, "num_tokens")
    if alloc is None:
        raise ValueError("evict_for_alloc needs a token_to_kv_pool_allocator")
    with self._mutex:
        avail = alloc.full_available_size() if self._swa else alloc.available_size()
        short = num - avail
        if short <= 0:
            return 0
        return self.evict(EvictParams(num_tokens=short)).num_tokens_evicted

def _check_component(self, component):
    c = _component(component)
    if c not in self.components:
        raise ValueError(f"component {component!r} is not configured")
    return int(c)
