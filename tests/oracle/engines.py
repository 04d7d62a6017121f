"""The two engines behind one small interface, as a scheduler drives them.

``FlatEngine`` wraps ``flatradix.UnifiedRadixCache``; ``SglEngine`` wraps SGLang
0.5.23's ``UnifiedRadixCache`` with its Python or Rust tree core. Both get a
*recording* allocator: it never hands out slots (the driver assigns the same
KV values to both engines from one counter) and logs every freed index in call
order (see ``normalize.py``, point 2). Each engine has its own req->token table;
the driver writes identical slots into both.

Request operations use each library's real entry points:

* flatradix: ``match_prefix`` + ``inc_lock_ref`` at admission,
  ``cache_unfinished_req`` / ``cache_finished_req`` (SGLang <= 0.5.22 names,
  which flatradix maps onto ``checkpoint`` / ``release_kv_cache``);
* SGLang 0.5.23: ``Req.init_next_round_input`` (``match_kv_cache`` with the
  ``input_len - 1`` cap) + ``tree_cache.lock`` as the prefill adder does,
  ``common.checkpoint_kv_cache`` and ``common.release_kv_cache``.

Mamba configurations (``cfg["mamba_chunk"]`` set) add a state-slot pool on
each side: a recording ``mamba_allocator`` hung on the request pool (flatradix's
``HybridReqToTokenPool``; SGLang's real ``HybridReqToTokenPool`` with tiny state
shapes) that logs every freed slot in call order. Tree ops get their slots from
the driver (``mamba_value``, the same numbers to both engines from one free
list); during a request op the allocator hands out the slots the driver armed
(``_ArmedMambaSlots``): an admitted request's own state (SGLang:
``HybridReqToTokenPool.alloc``; flatradix: set on the ``Req``), and the fork a
running request's checkpoint copies its state into (both libraries'
``mamba_allocator.alloc(1)``, ``None`` when the driver says the pool is full,
which makes both evict one state first). The request path runs on FULL+MAMBA at
page 1 without the extra buffer (``cfg["requests"]``); flatradix refuses it with
the extra buffer or with SWA.

``SglEngine(..., backend)`` can also stand where flatradix stands (the driver's
``--first python|rust``): SGLang's two cores against each other, no flatradix;
``--first sglang-flatradix``: SGLang's controller over flatradix's TreeCore
plug-in (``flatradix/sglang``, loaded through SGLang's plug-in entry point)
against SGLang's controller over its Python or Rust core.

Only the oracle venv (``../shared/tools/setup_sglang_oracle.sh``) can import
this module's SGLang half; the flatradix half imports anywhere.
"""

import dataclasses
import os
import warnings
from array import array
from collections import deque

import numpy as np

import flatradix
from flatradix import InsertParams as FInsertParams
from flatradix import MatchPrefixParams as FMatchPrefixParams
from flatradix import RadixKey as FRadixKey

_BIG = 1 << 40


def _torch_slot(slot):
    """A donated Mamba state slot as SGLang passes it: a 1-element int64 tensor."""
    import torch

    return torch.tensor([int(slot)], dtype=torch.int64)


def _sizes(c, swa, mamba):
    """(evictable, protected[, swa_evictable, swa_protected][, mamba_evictable,
    mamba_protected]) of a cache (either library's names)."""
    out = (c.evictable_size(), c.protected_size())
    if swa:
        out += (c.swa_evictable_size(), c.swa_protected_size())
    if mamba:
        out += (c.mamba_evictable_size(), c.mamba_protected_size())
    return out


def match_extras(m):
    """The MatchResult fields besides length / indices / last_device_node:
    (last_host_node, best_match_node, last_visited_node_id, other scalars)."""
    return (m.last_host_node, m.best_match_node, m.last_visited_node_id,
            (m.host_hit_length, m.full_kv_hit_length, m.swa_host_hit_length, m.swa_branching_seqlen,
             m.mamba_host_hit_length, m.mamba_branching_seqlen, m.cache_protected_len,
             m.full_device_match_len))


def insert_extras(r):
    ranges = r.adopted_ranges
    if ranges is not None:
        ranges = {getattr(k, "name", str(k)): [tuple(int(x) for x in rg) for rg in v]
                  for k, v in ranges.items()}
    return (r.total_len, bool(r.mamba_exist), bool(r.swa_branch_inserted), ranges)


class _FlatRecordingAllocator:
    """flatradix-side stand-in for the KV allocator: records frees in order."""

    index_kind = "numpy"
    device = "cpu"

    def __init__(self, page_size):
        self.page_size = page_size
        self.log = []

    def free(self, idx):
        self.log.extend(np.asarray(idx).tolist())

    def available_size(self):
        return _BIG


class _FlatRecordingSWAAllocator:
    """flatradix-side SWA allocator stand-in (duck-typed, as SGLang's): the driver
    sets the Full -> SWA mapping itself; frees are recorded per pool -- Full slots
    in call order, SWA as *page ids* in call order, which is how SGLang's
    allocator frees its SWA side -- and checked: an SWA free of a slot without a
    peer, or a Full-only free of a slot that still has one, raises."""

    index_kind = "numpy"
    device = "cpu"

    def __init__(self, page_size, size):
        self.page_size = page_size
        self.size_full = size
        self.mapping = np.zeros(size + page_size + 1, dtype=np.int64)
        self.log = []
        self.swa_log = []

    def set_full_to_swa_mapping(self, full, swa):
        self.mapping[np.asarray(full, dtype=np.int64)] = np.asarray(swa, dtype=np.int64)

    def clear_full_to_swa_mapping(self, full):
        self.mapping[np.asarray(full, dtype=np.int64)] = 0

    def translate_swa_indices_for_transfer(self, full):
        return self.mapping[np.asarray(full, dtype=np.int64)].copy()

    def full_available_size(self):
        return _BIG

    swa_available_size = available_size = full_available_size

    def free_swa_segment(self, idx, start_pos=0):
        idx = np.asarray(idx, dtype=np.int64)
        if not idx.size:
            return
        swa = self.mapping[idx]
        if (swa <= 0).any():
            raise AssertionError(f"SWA free of Full slots without an SWA peer: "
                                 f"{idx[swa <= 0][:8].tolist()}")
        P = self.page_size
        pages = swa // P
        keep = np.ones(pages.size, dtype=bool)
        keep[1:] = pages[1:] != pages[:-1]
        self.swa_log.extend(pages[keep].tolist())
        full_pages = np.unique(idx // P)
        self.mapping[(full_pages[:, None] * P + np.arange(P)[None, :]).reshape(-1)] = 0

    def swa_peer(self, full):
        return int(self.mapping[full])

    def free_full_segment(self, idx, start_pos=0):
        idx = np.asarray(idx, dtype=np.int64)
        if idx.size and (self.mapping[idx] != 0).any():
            raise AssertionError(f"Full-only free of slots with a live SWA peer: "
                                 f"{idx[self.mapping[idx] != 0][:8].tolist()}")
        self.log.extend(idx.tolist())

    def free(self, idx):
        idx = np.asarray(idx, dtype=np.int64)
        mapped = idx[self.mapping[idx] > 0]
        self.free_swa_segment(mapped)
        self.free_full_segment(idx)


class _ArmedMambaSlots:
    """The hand-out side of both recording ``mamba_allocator`` s. Outside a
    request op it is disarmed and ``alloc`` raises (tree ops get their state slots
    from the driver as ``mamba_value``). The driver arms it before a request op
    with the next slots of its one free list and an availability: ``alloc(n)``
    hands out the next ``n`` armed slots (recorded in ``alloc_log``) while
    ``avail >= n``, else returns ``None`` (a full pool); every free during the op
    adds to ``avail`` (an eviction makes room), and ``available_size()`` reports
    it. Both engines get the same slots and the same availability."""

    def _arm_init(self):
        self.armed = None
        self.avail = None
        self.alloc_log = []

    def arm(self, slots, avail):
        self.armed = deque(int(x) for x in slots)
        self.avail = int(avail)

    def disarm(self):
        self.armed = self.avail = None
        out, self.alloc_log = self.alloc_log, []
        return out

    def _armed_alloc(self, need_size, torch_mod):
        if self.armed is None:
            raise AssertionError("the oracle driver assigns Mamba state slots itself "
                                 "(mamba_allocator.alloc outside a request op)")
        if need_size > self.avail:
            return None
        if need_size > len(self.armed):
            raise AssertionError(f"mamba_allocator.alloc({need_size}): more slots than the "
                                 "driver armed for this op")
        out = [self.armed.popleft() for _ in range(need_size)]
        self.avail -= need_size
        self.alloc_log.extend(out)
        return torch_mod.tensor(out, dtype=torch_mod.int64)

    def _freed(self, n):
        if self.avail is not None:
            self.avail += n

    def _available(self):
        return _BIG if self.avail is None else self.avail


class _FlatRecordingMambaAllocator(_ArmedMambaSlots):
    """flatradix-side ``req_to_token_pool.mamba_allocator``: hands out only what
    the driver armed (``_ArmedMambaSlots``) and records every freed slot in call
    order."""

    index_kind = "torch"
    device = "cpu"

    def __init__(self, size):
        self.size = size  # slots 1..size (0 is SGLang's reserved dummy slot)
        self.log = []
        self._arm_init()

    def alloc(self, need_size):
        import torch

        return self._armed_alloc(need_size, torch)

    def free(self, idx):
        v = np.asarray(idx).reshape(-1).tolist()
        self.log.extend(v)
        self._freed(len(v))

    def available_size(self):
        return self._available()


def ping_pong(req):
    """A request's extra-buffer ping-pong track slots (``req.kv`` on SGLang's Req)."""
    buf = getattr(req, "kv", req).mamba_ping_pong_track_buffer
    return None if buf is None else [int(x) for x in np.asarray(buf).reshape(-1)]


def track(req, seqlen):
    """The model runner's non-lazy tracking (SGLang ``ScheduleBatch`` / result
    processor): the state at ``seqlen`` tokens went to the next ping-pong entry;
    it becomes the last one, the next flips, the previous seqlen is kept."""
    kv = getattr(req, "kv", req)
    kv.mamba_last_track_idx = kv.mamba_next_track_idx
    kv.mamba_next_track_idx = 1 - kv.mamba_next_track_idx
    kv.mamba_prev_track_seqlen = kv.mamba_last_track_seqlen
    kv.mamba_last_track_seqlen = seqlen


def track_lazy(pool, req, seqlen, decode):
    """The model runner's tracking with the lazy extra buffer (SGLang
    ``ScheduleBatch`` / result processor, no overlap lookahead, no speculation).

    A prefill chunk writes the state at ``seqlen`` into the entry it tracks, in
    place (the entry becomes the last one, nothing flips). A decode step at a
    track boundary first gives the empty other entry a slot from
    ``mamba_allocator.alloc(1)`` (no eviction: on a full pool the state is
    written in place) and tracks into it; afterwards the entry it stopped
    tracking is freed and emptied (SGLang ``mamba_lazy_prealloc_at_boundary`` /
    ``mamba_lazy_post_decode_at_boundary``). The previous seqlen stays None."""
    kv = getattr(req, "kv", req)
    if decode:
        other = 1 - kv.mamba_next_track_idx
        if kv.mamba_ping_pong_empty[other]:
            got = pool.mamba_allocator.alloc(1)
            if got is not None:
                pool.set_mamba_ping_pong_slot(req, other, got[0])
                kv.mamba_next_track_idx = other
            else:
                kv.mamba_last_track_seqlen = None
    kv.mamba_last_track_idx = kv.mamba_next_track_idx
    kv.mamba_last_track_seqlen = seqlen
    if decode:
        old = 1 - kv.mamba_next_track_idx
        if not kv.mamba_ping_pong_empty[old]:
            pool.mamba_allocator.free(kv.mamba_ping_pong_track_buffer[old:old + 1])
            pool.set_mamba_ping_pong_slot(req, old, -1)


def mamba_idx(req):
    """A request's ``mamba_pool_idx`` (``req.kv`` on SGLang's Req) as an int, or None."""
    v = getattr(getattr(req, "kv", req), "mamba_pool_idx", None)
    return None if v is None else int(np.asarray(v).reshape(-1)[0])


def mamba_components(cfg, CT):
    """The component tuple of a configuration, in SGLang's order."""
    return ((CT.FULL,) + ((CT.SWA,) if cfg.get("swa_window") is not None else ())
            + ((CT.MAMBA,) if cfg.get("mamba_chunk") is not None else ()))


def _skips(CT, skip_swa, skip_mamba):
    return (((CT.SWA,) if skip_swa else ()) + ((CT.MAMBA,) if skip_mamba else ()))


class _SameCalls:
    """The calls both engines make alike: the Mamba state slots (``self.malloc``: the
    recording state allocator) and the lock release (``self.cache``: the engine's
    cache; both libraries spell these calls the same)."""

    def unlock(self, handle, dec=False):
        """``unlock(lock)``, or (``dec``) ``dec_lock_ref(node, receipt, skip_swa)``."""
        if dec:
            self.cache.dec_lock_ref(handle.node, handle.receipt, skip_swa=handle.swa_released)
        else:
            self.cache.unlock(handle)

    def take_mamba_frees(self):
        out, self.malloc.log = self.malloc.log, []
        return out

    def arm_mamba(self, slots, avail):
        """Let the next request op allocate state slots: ``slots`` in order while
        ``avail`` (plus what it frees) lasts (``_ArmedMambaSlots``)."""
        self.malloc.arm(slots, avail)

    def take_mamba_allocs(self):
        """Disarm; the slots handed out since ``arm_mamba``, in order."""
        return self.malloc.disarm()

    def free_mamba(self, slot):
        """The caller frees a donated state slot the tree did not adopt (``mamba_exist``)."""
        self.malloc.free(_torch_slot(slot))

    def mamba_values(self):
        return sorted(np.asarray(self.cache.all_mamba_values_flatten()).reshape(-1).tolist())


class FlatEngine(_SameCalls):
    name = "flatradix"

    def __init__(self, cfg, max_reqs, max_ctx):
        # ``mutant``: deliberate flatradix-only changes for the driver's self-test
        # (driver.MUTANTS): another policy / policy config, or an insert argument
        # dropped. Empty in every real configuration.
        mut = cfg.get("mutant", {})
        self.mut = mut
        self.cfg = cfg
        self.P = cfg["page_size"]
        self.swa = cfg.get("swa_window") is not None
        self.mamba = cfg.get("mamba_chunk") is not None
        kw = {}
        if self.swa:
            self.alloc = _FlatRecordingSWAAllocator(self.P, cfg["slot_space"])
            kw = dict(components=(flatradix.ComponentType.FULL, flatradix.ComponentType.SWA),
                      sliding_window_size=mut.get("swa_window", cfg["swa_window"]))
        else:
            self.alloc = _FlatRecordingAllocator(self.P)
        if self.mamba:
            # flatradix's own HybridReqToTokenPool (its free_mamba_cache frees a
            # request's state), with the recording allocator in place of its free list
            self.rtp = flatradix.HybridReqToTokenPool(
                size=max_reqs, max_context_len=max_ctx, mamba_size=2,
                enable_mamba_extra_buffer=cfg.get("mamba_extra_buffer", False),
                enable_mamba_extra_buffer_lazy=cfg.get("mamba_lazy", False))
            self.malloc = _FlatRecordingMambaAllocator(cfg["mamba_space"])
            self.rtp.mamba_allocator = self.malloc
            kw.pop("components", None)
            kw.update(tree_components=mamba_components(cfg, flatradix.ComponentType),
                      mamba_cache_chunk_size=mut.get("mamba_chunk", cfg["mamba_chunk"]),
                      enable_mamba_extra_buffer=cfg.get("mamba_extra_buffer", False),
                      enable_mamba_extra_buffer_lazy=cfg.get("mamba_lazy", False),
                      mamba_max_states_per_path=mut.get("mamba_path_cap",
                                                                cfg.get("mamba_path_cap", -1)))
            if mut.get("donate_other"):  # self-test: the checkpoint donates the stale entry
                donate = self.rtp.donate_mamba_ping_pong_slot

                def donate_other(req, new_slot):
                    req.mamba_last_track_idx = 1 - req.mamba_last_track_idx
                    try:
                        return donate(req, new_slot)
                    finally:
                        req.mamba_last_track_idx = 1 - req.mamba_last_track_idx
                self.rtp.donate_mamba_ping_pong_slot = donate_other
            if mut.get("finish_keeps_none"):  # self-test: the adopted entry is freed too
                free_cache = self.rtp.free_mamba_cache
                self.rtp.free_mamba_cache = lambda req, mamba_ping_pong_track_buffer_to_keep=None: \
                    free_cache(req)
        else:
            self.rtp = flatradix.ReqToTokenPool(size=max_reqs, max_context_len=max_ctx)
        self.cache = flatradix.UnifiedRadixCache(
            page_size=self.P, eviction_policy=mut.get("policy", cfg["policy"]),
            eviction_policy_config=mut.get("policy_config", cfg.get("policy_config")),
            token_to_kv_pool_allocator=self.alloc, req_to_token_pool=self.rtp,
            is_eagle=cfg.get("eagle", False), enable_kv_cache_events=cfg.get("events", True),
            # tiny initial arrays: node-table growth, child-table rebuilds and pool
            # compaction run early and often instead of once per episode
            node_capacity=8, pool_capacity=128, **kw)
        self.reqs = {}
        if mut.get("checkpoint_donates"):  # self-test: a running request donates its own state
            self.cache._mamba_fork = lambda own: own
        if mut.get("drop_retain_floor"):  # self-test: SWA slides past a tracked state
            self.cache._swa_retain_floor = lambda req: None
        if mut.get("lazy_keeps_lock"):  # self-test: the fork's eviction keeps the Mamba lock
            self.cache.enable_mamba_extra_buffer_lazy = False

    # ------------------------------------------------------------ tree ops
    def root(self):
        return self.cache.root_node_handle()

    def _key(self, toks, ns, bigram=False):
        return FRadixKey(np.asarray(toks, dtype=np.int64), ns[0], ns[1], is_bigram=bigram)

    def insert(self, toks, ns, values, prev, inserted, prio, bigram=False, track=False,
               cursor=0, branching=None, mamba_slot=None):
        if self.mut:
            prev = 0 if self.mut.get("drop_prev") else prev
            inserted = 0 if self.mut.get("drop_inserted_len") else inserted
            prio = 0 if self.mut.get("drop_priority") else prio
            cursor = 0 if self.mut.get("drop_cursor") else cursor
        params = FInsertParams(key=self._key(toks, ns, bigram),
                               value=None if values is None else np.asarray(values, dtype=np.int64),
                               prev_prefix_len=prev, inserted_len=inserted,
                               priority=prio, track_adopted_ranges=track,
                               swa_branching_seqlen=branching,
                               mamba_value=None if mamba_slot is None else _torch_slot(mamba_slot))
        if cursor:
            params.set_evicted_seqlen(flatradix.ComponentType.SWA, cursor)
        r = self.cache.insert(params)
        return r.prefix_len, r.last_device_node, insert_extras(r)

    def match(self, toks, ns, bigram=False):
        m = self.cache.match_prefix(FMatchPrefixParams(key=self._key(toks, ns, bigram)))
        return m.device_prefix_len, m.device_indices.tolist(), m.last_device_node, match_extras(m)

    def lock(self, node, skip_swa=False, skip_mamba=False, tree_lock=False):
        """Lock as a scheduler holding a ``TreeLock``; returns ``(lock, (delta, uuids))``.
        ``tree_lock``: through ``lock()`` (no delta: ``None``), else ``inc_lock_ref``."""
        skip = _skips(flatradix.ComponentType, skip_swa, skip_mamba)
        if tree_lock:
            h = self.cache.lock(node, skip_lock_components=skip)
            return h, (None, dict(h.receipt.component_lock_uuids))
        r = self.cache.inc_lock_ref(node, skip_lock_components=skip)
        return flatradix.TreeLock(node, r.to_dec_params()), (r.delta, dict(r.component_lock_uuids))

    def release_mamba(self, handle):
        """SGLang's lazy extra-buffer path (``MambaComponent._alloc_mamba_slot``):
        release only the Mamba part of a held lock, then mark it skipped."""
        CT = flatradix.ComponentType
        keep = tuple(c for c in mamba_components(self.cfg, CT) if c != CT.MAMBA)
        self.cache.dec_lock_ref(handle.node, dataclasses.replace(
            handle.receipt, skipped_lock_components=keep))
        handle.receipt.skipped_lock_components = (
            tuple(handle.receipt.skipped_lock_components) + (CT.MAMBA,))

    def release_swa(self, handle):
        self.cache.release_swa(handle)

    def evict(self, n, swa=0, mamba=0):
        if self.mamba:
            r = self.cache.evict(flatradix.EvictParams(num_tokens=n, swa_num_tokens=swa,
                                                       mamba_num=mamba))
            return r.num_tokens_evicted, r.swa_num_tokens_evicted, r.mamba_num_evicted
        r = self.cache.evict(flatradix.EvictParams(num_tokens=n, swa_num_tokens=swa))
        return r.num_tokens_evicted, r.swa_num_tokens_evicted

    def next_victim_key(self, ct):
        """``(tokens, namespace)`` of the path root -> the node a round of ``ct`` (0
        FULL, 1 SWA, 2 MAMBA) would take next by the tree's own order -- the
        least-priority evictable leaf, or the least recent unlocked SWA / Mamba
        entry -- or None (also in EAGLE trees, whose units are token pairs). For
        the driver's refresh between steps."""
        from flatradix.kernels import layout as L
        from flatradix.kernels.lru import lru_lock_col

        if self.cache.is_eagle:
            return None
        eng = self.cache._engine
        nodes, heap, meta, pool = eng.st.nodes, eng.st.heap, eng.meta, eng.st.pool
        if ct == 0:
            if meta[L.M_HEAP_N + L.HEAP_DEVICE] == 0:
                return None
            s = int(heap[L.HEAP_DEVICE, 0])
        else:
            lst = L.LRU_SWA if ct == 1 else L.LRU_MAMBA
            head = L.SENTINEL0 + 2 * lst
            s = int(nodes[head + 1, L.LRU_PREV + lst])
            col = lru_lock_col(lst)
            while s != head and nodes[s, col] > 0:
                s = int(nodes[s, L.LRU_PREV + lst])
            if s == head:
                return None
        ns_id = int(nodes[s, L.NS])
        parts = []
        while s != eng.root and s >= 0:
            off, n = int(nodes[s, L.KEY_OFF]), int(nodes[s, L.KEY_LEN])
            parts.append(pool[off:off + n, L.TOK].tolist())
            s = int(nodes[s, L.PARENT])
        ns = next(k for k, v in eng.ns.ids.items() if v == ns_id)
        return tuple(t for p in reversed(parts) for t in p), ns

    def evict_steps(self, ct, n, k, between=None):
        """A step-wise round of component ``ct`` (0 FULL, 1 SWA, 2 MAMBA) for ``n``
        units, at most ``k`` steps, the controller freeing each step's slots (SWA
        peers, then Full, then Mamba states), ``between()`` after the first step.
        Returns per step ``(deleted node or None, made_progress, full units, swa
        units, mamba states)``."""
        c = self.cache
        comp = flatradix.ComponentType(ct)
        out = []
        c.evict_device_start(comp, n)
        try:
            for i in range(k):
                st = c.evict_device_next_node(comp)
                if self.swa:
                    self.alloc.free_swa_segment(st.swa_freed_indices)
                    self.alloc.free_full_segment(st.freed_indices)
                else:
                    self.alloc.free(st.freed_indices)
                if self.mamba:
                    self.malloc.free(st.mamba_freed_indices)
                out.append((st.node_id, st.made_progress, st.num_tokens, st.swa_num_tokens,
                            st.mamba_num if self.mamba else 0))
                if not st.made_progress:
                    break
                if self.mut.get("restart_round"):  # self-test: a round that forgets its cursor
                    done = c.evict_device_end(comp)
                    n = max(n - done, 0)
                    c.evict_device_start(comp, n)
                if i == 0 and between is not None:
                    between()
        finally:
            c.evict_device_end(comp)
        return out

    def sizes(self):
        return _sizes(self.cache, self.swa, self.mamba)

    def total(self):
        return tuple(self.cache.total_size())

    def take_frees(self):
        out, self.alloc.log = self.alloc.log, []
        return out

    def take_swa_frees(self):
        out, self.alloc.swa_log = self.alloc.swa_log, []
        return out


    def swa_peer(self, full):
        return self.alloc.swa_peer(full)

    def set_swa_mapping(self, full, swa):
        self.alloc.set_full_to_swa_mapping(full, swa)

    def free_swa(self, full):
        self.alloc.free_swa_segment(full)

    def take_events(self):
        return self.cache.take_events()

    def values(self):
        """Every KV index the tree holds, sorted (a multiset of the tree's content)."""
        return sorted(self.cache.all_values_flatten().tolist())

    def reset(self):
        self.cache.reset()

    def check(self):
        self.cache.sanity_check()

    # ------------------------------------------------------------ requests
    def req_admit(self, rid, prompt, ns, prio):
        """Match ``prompt[:-1]`` (the scheduler's ``input_len - 1`` cap), lock the
        matched node and take a request row. Returns (prefix_len, indices, node)."""
        row = self.rtp.alloc(1)[0]
        plen, idx, node, extras = self.match(prompt[:-1], ns)
        # token containers: array('q') (what an SGLang Req holds) or lists, alternately
        seq = (lambda t: array("q", t)) if rid % 2 else list
        req = flatradix.Req(origin_input_ids=seq(prompt), output_ids=seq(()), fill_ids=seq(prompt),
                            req_pool_idx=row, last_node=node, extra_key=ns[0], cache_salt=ns[1],
                            priority=prio, cache_protected_len=plen, cache_inserted_len=0,
                            kv_committed_len=0, kv_allocated_len=0, rid=rid,
                            swa_branching_seqlen=extras[3][3])
        req.prefix_indices = np.asarray(idx, dtype=np.int64)
        if self.mamba:
            # the request's own state slot, drawn as SGLang's HybridReqToTokenPool.alloc
            # draws it; odd requests hold a plain int, even ones SGLang's own form,
            # mid[0] (a 0-d tensor)
            if self.rtp.enable_mamba_extra_buffer:
                # the own slot, then the ping-pong track slots (SGLang's alloc order)
                if not self.rtp.alloc_mamba(req):
                    raise AssertionError("Not enough space for mamba cache (driver armed none)")
            else:
                mid = self.malloc.alloc(1)
                if mid is None:
                    raise AssertionError("Not enough space for mamba cache (driver armed none)")
                req.mamba_pool_idx = int(mid[0]) if rid % 2 else mid[0]
        if self.swa or self.mamba or rid % 2:
            req.lock = self.cache.lock(node)  # a TreeLock, as SGLang's scheduler holds it
        else:  # Full-only: a lock held by node id alone (no receipt) is released too
            # (a tree with SWA or Mamba needs the receipt: ReceiptError without it)
            self.cache.inc_lock_ref(node)
        self.reqs[rid] = req
        return plen, idx, node, self.req_swa_state(rid)

    def req_write(self, rid, start, slots):
        req = self.reqs[rid]
        self.rtp.req_to_token[req.req_pool_idx, start:start + len(slots)] = slots

    def req_progress(self, rid, output, committed):
        req = self.reqs[rid]
        req.output_ids = list(output) if isinstance(req.origin_input_ids, list) else array("q", output)
        req.kv_committed_len = committed
        req.kv_allocated_len = committed

    def req_checkpoint(self, rid, up_to):
        """``cache_unfinished_req`` at ``up_to`` tokens; returns
        (cache_protected_len, last_node, row[:up_to])."""
        req = self.reqs[rid]
        req.fill_ids = (req.origin_input_ids + req.output_ids)[:up_to]
        if self.mut.get("fork_evicts_2"):  # self-test: a full pool's fork evicts two states
            evict = type(self.cache).evict

            def evict2(params):
                if params.mamba_num == 1 and params.num_tokens == 0:
                    params = flatradix.EvictParams(num_tokens=0, mamba_num=2)
                return evict(self.cache, params)
            self.cache.evict = evict2
            try:
                self.cache.cache_unfinished_req(req)
            finally:
                del self.cache.evict
        else:
            self.cache.cache_unfinished_req(req)
        row = self.rtp.req_to_token[req.req_pool_idx, :up_to].tolist()
        return req.cache_protected_len, req.last_node, row, self.req_swa_state(rid)

    def req_swa_state(self, rid):
        """(SWA cursor, swa_branching_seqlen) of a request (``None`` without SWA)."""
        if not self.swa:
            return None
        req = self.reqs[rid]
        return req.swa_evicted_seqlen, req.swa_branching_seqlen

    def req_slide(self, rid, pre_len):
        """The scheduler's per-decode SWA slide (``evict_sliding_windows``)."""
        self.cache.evict_sliding_windows(self.reqs[rid], pre_len)
        return self.req_swa_state(rid)

    def req_release_swa(self, rid):
        """Early SWA release of the request's lock (``release_swa_prefix_lock``)."""
        self.cache.release_swa_prefix_lock(self.reqs[rid])

    def req_row(self, rid, n):
        return self.rtp.req_to_token[self.reqs[rid].req_pool_idx, :n].tolist()

    def req_mamba(self, rid):
        """The request's ``mamba_pool_idx`` (an int or None)."""
        return mamba_idx(self.reqs[rid])

    def req_ping_pong(self, rid):
        return ping_pong(self.reqs[rid])

    def req_track(self, rid, seqlen, decode=False):
        req = self.reqs[rid]
        if self.mut.get("track_no_flip"):  # self-test: the state lands in the entry just donated
            req.mamba_next_track_idx = 1 - req.mamba_next_track_idx
        if self.cfg.get("mamba_lazy"):
            track_lazy(self.rtp, req, seqlen, decode)
        else:
            track(req, seqlen)

    def req_release(self, rid, insert):
        """``cache_finished_req``; returns the request's ``mamba_pool_idx`` afterwards."""
        req = self.reqs.pop(rid)
        req.fill_ids = req.origin_input_ids + req.output_ids
        self.cache.cache_finished_req(req, is_insert=insert)
        return mamba_idx(req)


# ---------------------------------------------------------------- SGLang
def sglang_env():
    """The environment the oracle venv needs (set before importing sglang)."""
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    os.environ.setdefault("SGLANG_RUST_BUILD_MODE", "never")
    os.environ.setdefault("OMP_NUM_THREADS", "1")


_SGL = None


def _align_python_core_leaf_hit():
    """normalize.py point 7: SGLang's two cores disagree on one hit count, and the
    oracle holds the Python core to the Rust core's rule (flatradix's choice).

    A new leaf counts a hit when it ends past ``inserted_len``. The Rust core
    takes its end as the inserted key's end; the Python core as ``prefix_len +
    len(leaf)`` measured *after* the SWA component split the leaf (at the cursor,
    or to cap it), which is short of the key's end by the split-off parts, so a
    leaf of a key ending past ``inserted_len`` can miss its hit. Only FULL+SWA
    trees split a new leaf, and only hit-count policies (lfu, slru) see it. The
    replacement below is the Python core's own method with the Rust core's end."""
    from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore

    orig = UnifiedTreeCore._should_backup_after_insert
    if getattr(orig, "_flatradix_aligned", False):
        return

    def aligned(self, state):
        if not self.is_write_back and state.is_new_leaf:
            leaf_end = state.total_prefix_length + len(state.key)  # the key's end
            return (leaf_end > state.params.inserted_len
                    and self._inc_hit_count_and_check(state.target_node))
        return orig(self, state)

    aligned._flatradix_aligned = True
    UnifiedTreeCore._should_backup_after_insert = aligned


def _sgl():
    """Import SGLang's pieces once (slow: ~15-30 s of imports)."""
    global _SGL
    if _SGL is not None:
        return _SGL
    sglang_env()
    import logging

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    import torch

    # Tiny tensors only: intra-op threads cost more than they give, and they spin
    # against other processes on a busy machine.
    torch.set_num_threads(1)
    from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH, Req
    from sglang.srt.mem_cache.allocator.base import BaseTokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import (
        EvictParams, InsertParams, MatchPrefixParams, TreeLock,
    )
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    # release_kv_cache reads get_spec()/get_serving(): publish server args once.
    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy"))
    _align_python_core_leaf_hit()

    class RecordingAllocator(BaseTokenToKVPoolAllocator):
        """SGLang-side stand-in for the KV allocator: every free path of the base
        class (free_segment(s), free_full, free groups) ends in ``free``, which
        records the indices in call order. The base class's page-alignment
        assertions stay active."""

        def __init__(self, page_size):
            super().__init__(_BIG, page_size, torch.float16, "cpu", None, False)
            self.log = []

        def alloc(self, need_size):
            raise AssertionError("the oracle driver assigns KV slots itself")

        def free(self, free_index):
            if free_index.numel() == 0:
                return
            if self.free_group is None:
                self.log.extend(free_index.tolist())
            else:
                self.free_group.append(free_index.clone())

        def available_size(self):
            return _BIG

        def clear(self):
            self.log = []

    class _Side:
        """Stand-in for one side of SGLang's ``SWATokenToKVPoolAllocator`` (its
        ``full_attn_allocator`` / ``swa_attn_allocator``): records what reaches it
        -- Full: slots, SWA: page ids -- and hands nothing out (the driver assigns
        slots and sets the Full -> SWA mapping). The SWA allocator's own code --
        mapping reads, clears, page conversion, its checks -- stays SGLang's."""

        size = _BIG
        debug_mode = False

        def __init__(self, page_size, pages):
            self.page_size = page_size
            self.pages = pages
            self.log = []

        def _rec(self, x):
            v = x.tolist()
            if self.pages and self.page_size > 1:
                v = [i // self.page_size for i in v]
                v = [p for i, p in enumerate(v) if i == 0 or v[i - 1] != p]
            self.log.extend(v)

        def free(self, x):
            self._rec(x)

        def free_segment(self, x, start_pos=0):
            self._rec(x)

        def free_page_ids(self, x):
            self.log.extend(x.tolist())

        def available_size(self):
            return 0

        def free_group_begin(self):
            pass

        def free_group_end(self):
            pass

    from sglang.srt.mem_cache.allocator.mamba import MambaSlotAllocator

    class RecordingMambaAllocator(_ArmedMambaSlots, MambaSlotAllocator):
        """SGLang-side ``mamba_allocator``: hands out only what the driver armed
        (``_ArmedMambaSlots``; ``alloc`` is what ``HybridReqToTokenPool.alloc`` and
        ``MambaComponent._alloc_mamba_slot`` call) and records every freed slot in
        call order."""

        def __init__(self, size):
            super().__init__(size=1, device="cpu")  # no free list worth the name
            self.size = size
            self.log = []
            self._arm_init()

        def alloc(self, need_size):
            return self._armed_alloc(need_size, torch)

        def free(self, free_index):
            v = free_index.reshape(-1).tolist()
            self.log.extend(v)
            self._freed(len(v))

        def available_size(self):
            return self._available()

    def make_hybrid_req_pool(size, max_ctx, extra_buffer, mamba_space, lazy=False):
        """SGLang's real ``HybridReqToTokenPool`` (what ``MambaComponent`` asserts),
        with the smallest Mamba2 state shapes (one layer, a few bytes per slot) and
        a recording ``mamba_allocator`` in place of its slot free list. Its state
        pool spans every slot number the driver hands out: a running request's
        checkpoint copies its state into the fork (``mamba_pool.copy_from``)."""
        from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
        from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

        shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=2, n_groups=1,
                                        num_heads=1, head_dim=2, state_size=1, conv_kernel=2)
        pool = HybridReqToTokenPool(
            size=size, mamba_size=mamba_space + 1, mamba_spec_state_size=size,
            max_context_len=max_ctx,
            device="cpu", enable_memory_saver=False,
            cache_params=Mamba2CacheParams(shape=shape, layers=[0]), mamba_layer_ids=[0],
            enable_mamba_extra_buffer=extra_buffer, enable_mamba_extra_buffer_lazy=lazy,
            speculative_num_draft_tokens=3)
        pool.mamba_allocator = RecordingMambaAllocator(mamba_space)
        return pool

    def make_swa_allocator(page_size, size):
        from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
        from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

        kv = SWAKVPool(size=size, size_swa=size, page_size=page_size, dtype=torch.float16,
                       head_num=1, head_dim=1, swa_attention_layer_ids=[0],
                       full_attention_layer_ids=[1], device="cpu")
        alloc = SWATokenToKVPoolAllocator(size=size, size_swa=size, page_size=page_size,
                                          dtype=torch.float16, device="cpu", kvcache=kv,
                                          need_sort=False)
        alloc.full_attn_allocator = _Side(page_size, pages=False)
        alloc.swa_attn_allocator = _Side(page_size, pages=True)
        return alloc

    _SGL = dict(torch=torch, Req=Req, FINISH_LENGTH=FINISH_LENGTH, FINISH_ABORT=FINISH_ABORT,
                RecordingAllocator=RecordingAllocator, make_swa_allocator=make_swa_allocator,
                make_hybrid_req_pool=make_hybrid_req_pool,
                EvictParams=EvictParams,
                InsertParams=InsertParams, MatchPrefixParams=MatchPrefixParams, TreeLock=TreeLock,
                CacheInitParams=CacheInitParams, checkpoint_kv_cache=checkpoint_kv_cache,
                release_kv_cache=release_kv_cache, ReqToTokenPool=ReqToTokenPool,
                RadixKey=RadixKey, ComponentType=ComponentType, UnifiedRadixCache=UnifiedRadixCache,
                SamplingParams=SamplingParams,
                sampling=SamplingParams(temperature=0, max_new_tokens=1 << 30))
    return _SGL


class SglEngine(_SameCalls):
    name = "sglang"

    def __init__(self, cfg, max_reqs, max_ctx, backend):
        S = self.S = _sgl()
        self.torch = S["torch"]
        self.cfg = cfg
        self.P = cfg["page_size"]
        self.swa = cfg.get("swa_window") is not None
        self.mamba = cfg.get("mamba_chunk") is not None
        CT = S["ComponentType"]
        self.comps = mamba_components(cfg, CT)
        kw = dict(tree_components=self.comps)
        if self.swa:
            self.alloc = S["make_swa_allocator"](self.P, cfg["slot_space"])
            kw.update(sliding_window_size=cfg["swa_window"])
        else:
            self.alloc = S["RecordingAllocator"](self.P)
        if self.mamba:
            # MambaComponent (Python core) and the Rust adapter read the chunk size
            # from the global server args at construction: SGLang's own fixtures
            # preset ``_mamba_cache_chunk_size`` (a dummy model has no HF config to
            # derive it from); the per-path state cap (``--mamba-max-states-per-path``,
            # -1 = off) through the runtime context's override, as a launcher sets it.
            from sglang.srt.runtime_context import get_context, get_exec, get_server_args

            get_server_args()._mamba_cache_chunk_size = cfg["mamba_chunk"]
            cap = cfg.get("mamba_path_cap", -1)
            get_context().override("flatradix-oracle", mamba_max_states_per_path=cap)
            if get_exec().mamba.mamba_max_states_per_path != cap:
                raise RuntimeError(f"mamba_max_states_per_path did not become {cap}")
            extra = cfg.get("mamba_extra_buffer", False)
            # the lazy extra buffer is a server-wide flag in SGLang, derived once
            # when the config is published (--mamba-radix-cache-strategy
            # extra_buffer_lazy): set on the published leaf, as publication would
            lazy = bool(cfg.get("mamba_lazy", False))
            get_exec().mamba._set("enable_mamba_extra_buffer_lazy", lazy)
            if get_exec().mamba.enable_mamba_extra_buffer_lazy != lazy:
                raise RuntimeError(f"enable_mamba_extra_buffer_lazy did not become {lazy}")
            self.rtp = S["make_hybrid_req_pool"](max_reqs, max_ctx, extra, cfg["mamba_space"],
                                                 lazy)
            self.malloc = self.rtp.mamba_allocator
            kw.update(enable_mamba_extra_buffer=extra, enable_mamba_extra_buffer_lazy=lazy)
        else:
            self.rtp = S["ReqToTokenPool"](size=max_reqs, max_context_len=max_ctx, device="cpu",
                                           enable_memory_saver=False)
        if backend == "flatradix":  # flatradix's TreeCore plug-in under SGLang's controller
            from sglang.srt.plugins import load_plugins

            load_plugins()
        self.cache = S["UnifiedRadixCache"](S["CacheInitParams"](
            disable=False, req_to_token_pool=self.rtp, token_to_kv_pool_allocator=self.alloc,
            page_size=self.P, eviction_policy=cfg["policy"],
            eviction_policy_config=cfg.get("policy_config"), is_eagle=cfg.get("eagle", False),
            enable_kv_cache_events=cfg.get("events", True), tree_core_backend=backend, **kw))
        core = type(self.cache.tree_core).__name__
        want = {"python": ("UnifiedTreeCore",), "rust": ("RustUnifiedTreeCore",),
                "flatradix": ("FlatradixTreeCore", "FlatradixTreeCoreInspector")}[backend]
        if core not in want:  # a missing Rust core falls back to Python silently
            raise RuntimeError(f"SGLang built a {core}, not the {backend} tree core")
        self.core = core
        self.reqs = {}

    def root(self):
        return self.cache.root_node_handle()

    def _key(self, toks, ns, bigram=False):
        return self.S["RadixKey"](array("q", toks), ns[0], is_bigram=bigram, cache_salt=ns[1])

    def insert(self, toks, ns, values, prev, inserted, prio, bigram=False, track=False,
               cursor=0, branching=None, mamba_slot=None):
        params = self.S["InsertParams"](
            key=self._key(toks, ns, bigram),
            value=None if values is None else self.torch.tensor(values, dtype=self.torch.int64),
            prev_prefix_len=prev, inserted_len=inserted, priority=prio, track_adopted_ranges=track,
            swa_branching_seqlen=branching,
            mamba_value=None if mamba_slot is None else _torch_slot(mamba_slot))
        if cursor:
            params.set_evicted_seqlen(self.S["ComponentType"].SWA, cursor)
        r = self.cache.insert(params)
        return r.prefix_len, r.last_device_node, insert_extras(r)

    def match(self, toks, ns, bigram=False):
        m = self.cache.match_prefix(self.S["MatchPrefixParams"](key=self._key(toks, ns, bigram)))
        n = m.device_prefix_len
        idx = self.cache.path_device_indices(m.last_device_node)[:n].tolist() if n else []
        return n, idx, m.last_device_node, match_extras(m)

    def lock(self, node, skip_swa=False, skip_mamba=False, tree_lock=False):
        skip = _skips(self.S["ComponentType"], skip_swa, skip_mamba)
        if tree_lock:
            h = self.cache.lock(node, skip_lock_components=skip)
            return h, (None, dict(h.receipt.component_lock_uuids))
        r = self.cache.inc_lock_ref(node, skip)
        return self.S["TreeLock"](node, r.to_dec_params()), (r.delta, dict(r.component_lock_uuids))

    def release_mamba(self, handle):
        """``FlatEngine.release_mamba``: the very calls of SGLang's
        ``MambaComponent._alloc_mamba_slot`` (lazy extra buffer)."""
        CT = self.S["ComponentType"]
        self.cache.dec_lock_ref(handle.node, dataclasses.replace(
            handle.receipt,
            skipped_lock_components=tuple(c for c in self.cache.tree_components if c != CT.MAMBA)))
        handle.receipt.skipped_lock_components += (CT.MAMBA,)

    def release_swa(self, handle):
        self.cache.release_swa(handle)

    def evict(self, n, swa=0, mamba=0):
        r = self.cache.evict(self.S["EvictParams"](num_tokens=n, swa_num_tokens=swa,
                                                   mamba_num=mamba))
        if self.mamba:
            return r.num_tokens_evicted, r.swa_num_tokens_evicted, r.mamba_num_evicted
        return r.num_tokens_evicted, r.swa_num_tokens_evicted

    def next_victim_key(self, ct):
        return None  # only read from flatradix's arrays (see FlatEngine)

    def evict_steps(self, ct, n, k, between=None):
        """``FlatEngine.evict_steps`` through SGLang's controller loop, one step at a
        time: the tree core's round, the cache's ``_evict_device_next_node`` and
        ``_evict_device_leaf`` (which apply each step's frees)."""
        c = self.cache
        comp = self.S["ComponentType"](ct)
        tracker = {t: 0 for t in c.tree_components}
        out = []
        c.tree_core.evict_device_start(comp, n)
        try:
            for i in range(k):
                before = dict(tracker)
                node, progress = c._evict_device_next_node(comp, tracker)
                if node is not None:
                    c._evict_device_leaf(node, tracker)
                CT = self.S["ComponentType"]
                delta = {t: tracker[t] - before[t] for t in tracker}
                out.append((node, bool(progress or node is not None), delta[CT.FULL],
                            delta.get(CT.SWA, 0), delta.get(CT.MAMBA, 0)))
                if not out[-1][1]:
                    break
                if i == 0 and between is not None:
                    between()
        finally:
            c.tree_core.evict_device_end(comp)
        return out

    def sizes(self):
        return _sizes(self.cache, self.swa, self.mamba)

    def total(self):
        return tuple(self.cache.total_size())

    def take_frees(self):
        side = self.alloc.full_attn_allocator if self.swa else self.alloc
        out, side.log = side.log, []
        return out

    def take_swa_frees(self):
        side = self.alloc.swa_attn_allocator
        out, side.log = side.log, []
        return out


    def swa_peer(self, full):
        return int(self.alloc.full_to_swa_index_mapping[full])

    def set_swa_mapping(self, full, swa):
        t = self.torch
        self.alloc.set_full_to_swa_mapping(t.tensor(full, dtype=t.int64), t.tensor(swa, dtype=t.int64))

    def free_swa(self, full):
        t = self.torch
        self.alloc.free_swa_segment(t.tensor(full, dtype=t.int64), start_pos=0)

    def take_events(self):
        return self.cache.take_events()

    def values(self):
        return sorted(self.cache.all_values_flatten().tolist())

    def reset(self):
        self.cache.reset()

    def check(self):
        pass

    # ------------------------------------------------------------ requests
    def req_admit(self, rid, prompt, ns, prio):
        S = self.S
        req = S["Req"](rid=str(rid), origin_input_text="", origin_input_ids=array("q", prompt),
                       sampling_params=S["sampling"], extra_key=ns[0], cache_salt=ns[1],
                       priority=prio)
        if req.cache_salt != ns[1] or req.extra_key != ns[0]:
            raise RuntimeError("Req() rewrote the namespace")
        self.rtp.alloc([req])  # Mamba: HybridReqToTokenPool.alloc draws req.kv.mamba_pool_idx
        req.init_next_round_input(self.cache)  # match_kv_cache with the input_len - 1 cap
        req.lock = self.cache.lock(req.last_node)  # as PrefillAdder admits it
        self.reqs[rid] = req
        n = req.prefix_len
        idx = self.cache.path_device_indices(req.last_node)[:n].tolist() if n else []
        return n, idx, req.last_node, self.req_swa_state(rid)

    def req_write(self, rid, start, slots):
        req = self.reqs[rid]
        self.rtp.req_to_token[req.kv.req_pool_idx, start:start + len(slots)] = self.torch.tensor(
            slots, dtype=self.torch.int32)

    def req_progress(self, rid, output, committed):
        req = self.reqs[rid]
        if len(output) != len(req.output_ids):
            req.output_ids.extend(output[len(req.output_ids):])
        req.kv.kv_committed_len = committed
        req.kv.kv_allocated_len = committed

    def req_checkpoint(self, rid, up_to):
        req = self.reqs[rid]
        req.refresh_fill_ids()
        req.extend_end = up_to
        self.S["checkpoint_kv_cache"](req, self.cache)
        row = self.rtp.req_to_token[req.kv.req_pool_idx, :up_to].tolist()
        return req.kv.cache_protected_len, req.last_node, row, self.req_swa_state(rid)

    def req_swa_state(self, rid):
        if not self.swa:
            return None
        req = self.reqs[rid]
        return req.kv.get_evicted_seqlen(self.S["ComponentType"].SWA), req.swa_branching_seqlen

    def req_slide(self, rid, pre_len):
        self.cache.evict_sliding_windows(self.reqs[rid], pre_len)
        return self.req_swa_state(rid)

    def req_release_swa(self, rid):
        self.cache.release_swa_prefix_lock(self.reqs[rid])

    def req_row(self, rid, n):
        return self.rtp.req_to_token[self.reqs[rid].kv.req_pool_idx, :n].tolist()

    def req_release(self, rid, insert):
        req = self.reqs.pop(rid)
        req.finished_reason = (self.S["FINISH_LENGTH"](length=len(req.output_ids)) if insert
                               else self.S["FINISH_ABORT"]())
        self.S["release_kv_cache"](req, self.cache, checkpoint=insert)
        return mamba_idx(req)

    def req_mamba(self, rid):
        return mamba_idx(self.reqs[rid])

    def req_ping_pong(self, rid):
        return ping_pong(self.reqs[rid])

    def req_track(self, rid, seqlen, decode=False):
        if self.cfg.get("mamba_lazy"):
            track_lazy(self.rtp, self.reqs[rid], seqlen, decode)
        else:
            track(self.reqs[rid], seqlen)
