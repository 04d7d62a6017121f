"""One serving engine's scheduler over one cache, as the replay emulates it
(the model: :mod:`flatradix.replay.sim`'s docstring).

A :class:`Scheduler` owns its pools, its cache and its figures, so several
run side by side (a fleet behind a router). Its steps:

* :meth:`Scheduler.arrive` -- the clock moves to a request's arrival (the
  arrival mode completes the requests that ended);
* :meth:`Scheduler.admit` -- one request: wait for a running slot, match and
  lock, take a Mamba state slot, load the host hit back, allocate its KV
  (:meth:`Scheduler.evict` and waits when short), then reject it or start it;
* :meth:`Scheduler.complete` -- a running request finishes: its prompt is cached;
* :meth:`Scheduler.drain` -- the end of the trace: every running request completes.

What differs by mode is delegated to the strategy objects of
:mod:`flatradix.replay.modes` (clock, KV pools, state slots, host tier);
:func:`~flatradix.replay.outcome.build_result` turns a finished scheduler into
a :class:`~flatradix.replay.result.ReplayResult`.
"""

import collections
import time

import numpy as np

from .. import (ComponentType, EvictParams, HybridReqToTokenPool, InsertParams,
                MatchPrefixParams, RadixKey, ReqToTokenPool, SWATokenToKVPoolAllocator,
                TokenToKVPoolAllocator, UnifiedRadixCache)
from ._progress import progress_bar
from .config import pool_sizes
from .modes import (ArrivalClock, ExtraBufferStates, FullKV, HostTier, HybridHostTier,
                    MambaStates, NoHost, NoStates, OrderClock, SwaKV)


def default_cache_factory(page_size, eviction_policy, token_to_kv_pool_allocator,
                          req_to_token_pool, sliding_window_size=None,
                          mamba_cache_chunk_size=None, enable_mamba_extra_buffer=False,
                          enable_kv_cache_events=False):
    """``flatradix.UnifiedRadixCache`` wired to the replay's pools.

    ``sliding_window_size``: the SWA mode's window (tokens); the cache then has
    the ``(FULL, SWA)`` components and the allocator is an
    ``SWATokenToKVPoolAllocator`` (the replay passes it only in that mode).
    ``mamba_cache_chunk_size``: the Mamba mode's chunk; the cache then has the
    ``(FULL, MAMBA)`` components and ``req_to_token_pool`` is a
    ``HybridReqToTokenPool`` (passed only in that mode). Both: the SWA + Mamba
    mode's ``(FULL, SWA, MAMBA)`` cache. ``enable_mamba_extra_buffer``: the
    Mamba mode with the extra buffer (passed only in that mode, with a request
    pool built with it). ``enable_kv_cache_events``: the cache queues KV events (a
    fleet's kv router reads them).

    The token pool starts at up to 4x the KV pool: evicted spans leave dead rows
    that the cache compacts away when the pool is full, so headroom makes those
    O(live) compactions rare (sizes only; the results are the same).
    """
    size = getattr(token_to_kv_pool_allocator, "size_full", None) or token_to_kv_pool_allocator.size
    kw = {}
    components = [ComponentType.FULL]
    if sliding_window_size is not None:
        components.append(ComponentType.SWA)
        kw["sliding_window_size"] = sliding_window_size
    if mamba_cache_chunk_size is not None:
        components.append(ComponentType.MAMBA)
        kw["mamba_cache_chunk_size"] = mamba_cache_chunk_size
    if enable_mamba_extra_buffer:
        kw["enable_mamba_extra_buffer"] = True
    if len(components) > 1:
        kw["components"] = tuple(components)
    if enable_kv_cache_events:
        kw["enable_kv_cache_events"] = True
    return UnifiedRadixCache(page_size=page_size, eviction_policy=eviction_policy,
                             token_to_kv_pool_allocator=token_to_kv_pool_allocator,
                             req_to_token_pool=req_to_token_pool,
                             pool_capacity=max(1 << 16, min(4 * size, size + (1 << 25))), **kw)


class Counters:
    """A scheduler's running totals (tokens, states, calls; ``peak_*`` the largest
    tree sizes seen after a completion or checkpoint)."""

    __slots__ = (
        "hit_tokens", "evicted", "evict_calls", "rejected", "waits", "slot_waits", "peak",
        # the hybrid modes: SWA tokens and states evicted, hits lost to the window and to
        # checkpoint granularity, window slides, state waits, peak SWA tokens / states
        "swa_evicted", "m_evicted", "lost_w", "lost_c", "slid", "m_waits", "peak_aux", "peak_m",
        # the host tier: hits per tier, loads, what they evicted, peak host trees
        "dev_hits", "host_hits", "load_backs", "loaded", "declined", "load_evicted",
        "swa_loaded", "state_loads", "load_swa_evicted", "load_m_evicted", "peak_host",
        "peak_swa_host", "peak_m_host")

    def __init__(self):
        for k in self.__slots__:
            setattr(self, k, 0)


class Admission:
    """One request on its way in: its sizes and key, its match, lock and hit, the
    slots it got, and the completions it waited for (``waited``)."""

    __slots__ = ("i", "n", "o", "toks", "key", "m", "node", "tree_lock", "hit", "prefix",
                 "got", "s_hit", "mslot", "touched", "hreq", "waited", "ev0", "sev0", "mev0",
                 "dec0")

    def __init__(self, i, n, o, toks, key, c):
        self.i, self.n, self.o, self.toks, self.key = i, n, o, toks, key
        self.got = self.waited = 0
        self.s_hit = self.mslot = self.hreq = self.tree_lock = None
        self.touched = False
        # the counters before it: what it evicted, what its declined loads left
        self.ev0, self.sev0, self.mev0, self.dec0 = c.evicted, c.swa_evicted, c.m_evicted, \
            c.declined


class Scheduler:
    """One engine: its pools, its cache (``cache_factory``, default
    :func:`default_cache_factory`), its strategies and its figures, for
    ``workload`` (a :class:`~flatradix.replay.trace.Workload`) under ``cfg`` (a
    :class:`~flatradix.replay.config.ReplayConfig`).

    ``sizes``: the :class:`~flatradix.replay.config.PoolSizes` (default: computed
    from ``cfg`` and ``workload``). Per-request arrays are indexed by the
    request's index in ``workload``: a scheduler admits any subset of it, in
    order (:meth:`arrive` then :meth:`admit` for each, :meth:`drain` at the end).
    ``MemoryError`` when the pools cannot be allocated; ``ValueError`` for a
    host tier on a cache without one.
    """

    def __init__(self, workload, cfg, cache_factory=None, sizes=None):
        self.workload, self.cfg = workload, cfg
        self.sizes = sizes = sizes if sizes is not None else pool_sizes(cfg, workload)
        self.notes = list(sizes.notes)
        self.c = Counters()
        #: prompt pages of the running requests (a router's load term)
        self.active_blocks = 0
        self.pc = time.perf_counter_ns
        self._build_pools(cache_factory)
        self._bind()
        self._records()
        self.kv = SwaKV(self) if cfg.swa else FullKV(self)
        self.states = (ExtraBufferStates(self) if cfg.extra else MambaStates(self) if cfg.mamba
                       else NoStates())
        self.host = (HybridHostTier(self) if cfg.host and cfg.hybrid else
                     HostTier(self) if cfg.host else NoHost(self))
        t0 = self.arrive_l[0] if len(workload) else 0.0
        self.running = (ArrivalClock(self, t0, cfg.arrival) if cfg.timed
                        else OrderClock(self, t0))

    # ------------------------------------------------------------ construction
    def _build_pools(self, cache_factory):
        cfg, sz, w = self.cfg, self.sizes, self.workload
        n_req = len(w)
        longest = int((w.input_lengths + w.output_lengths).max()) if n_req else 1
        if cfg.swa:
            self.alloc = SWATokenToKVPoolAllocator(sz.slots, sz.swa_slots,
                                                   page_size=cfg.page_size)
        else:
            self.alloc = TokenToKVPoolAllocator(sz.slots)
        rows = max(1, min(cfg.max_running, n_req))
        if cfg.mamba:
            self.req_pool = HybridReqToTokenPool(rows, max(longest, 1), mamba_size=sz.m_slots,
                                                 enable_mamba_extra_buffer=cfg.extra)
        else:
            self.req_pool = ReqToTokenPool(rows, max(longest, 1))
        fkw = {}
        if cfg.swa:
            fkw["sliding_window_size"] = cfg.swa_window
        if cfg.mamba:
            fkw["mamba_cache_chunk_size"] = cfg.mamba_chunk
        if cfg.extra:
            fkw["enable_mamba_extra_buffer"] = True
        factory = cache_factory or default_cache_factory
        self.cache = cache = factory(cfg.page_size, cfg.policy, self.alloc, self.req_pool, **fkw)
        self.moved = collections.Counter()
        if cfg.host:
            if not hasattr(cache, "init_hicache"):
                raise ValueError("the host tier mode needs a cache with init_hicache "
                                 "(flatradix.UnifiedRadixCache)")
            moved = self.moved

            def count_copies(kind, device_indices, host_indices):
                # every copy the tree asks for, counted per kind (no bytes move)
                moved[kind] += len(host_indices)

            hkw = {}
            if cfg.swa:
                hkw["swa_host_size"] = sz.swa_h_slots
            if cfg.mamba:
                hkw["mamba_host_size"] = sz.mh_slots
            cache.init_hicache(host_size=sz.h_slots, hicache_write_policy=cfg.write_policy,
                               load_back_threshold=cfg.load_back_threshold,
                               transfer=count_copies, **hkw)

    def _bind(self):
        # the calls and data the hot path uses, bound once
        cfg, cache, w = self.cfg, self.cache, self.workload
        self.match = cache.match_prefix
        # a hybrid cache's lock is a TreeLock (its release replays the receipt)
        self.lock = cache.lock if cfg.hybrid else cache.inc_lock_ref
        self.unlock = cache.unlock if cfg.hybrid else cache.dec_lock_ref
        self.evict_for_alloc = cache.evict_for_alloc if cfg.hybrid else None
        self.use_req = cfg.driver == "request"
        self.finished = ((cache.release_kv_cache if cfg.extra else cache.cache_finished_req)
                         if self.use_req else None)
        self.total_size = cache.total_size
        self.a_alloc, self.a_free = self.alloc.alloc, self.alloc.free
        self.a_avail = (self.alloc.full_available_size if cfg.swa
                        else self.alloc.available_size)
        self.table = self.req_pool.req_to_token
        self.params = lambda key: MatchPrefixParams(key=RadixKey(key))
        self.B = w.block_size
        self.block_offsets = np.arange(w.block_size, dtype=np.int64)
        self.ptr = w.hash_ptr.tolist()
        self.nin = w.input_lengths.tolist()
        self.nout = w.output_lengths.tolist()
        # request i's output tokens (cache_outputs): fresh ids from token_base, after
        # those of the requests before it
        self.fresh = (w.token_base + np.concatenate(([0], np.cumsum(w.output_lengths)))).tolist() \
            if cfg.cache_outputs else None
        # the SWA + Mamba mode reads its two aux ledgers apart (total_size lumps them)
        if cfg.triple:
            self.node_info = cache.node_info
            self.swa_size = lambda: cache.swa_evictable_size() + cache.swa_protected_size()
            self.m_size = lambda: cache.mamba_evictable_size() + cache.mamba_protected_size()
        for op in ("match", "lock", "evict", "finish", "slide", "ckpt", "load", "loading",
                   "events"):
            setattr(self, "lat_" + op, [])

    def _records(self):
        # per request: hit (-1 rejected), evicted to admit it, completions waited for,
        # admission (or rejection) and end times; the hybrid modes' figures
        cfg, n = self.cfg, len(self.workload)
        self.r_hit = np.full(n, -1, dtype=np.int64)
        self.r_evicted = np.zeros(n, dtype=np.int64)
        self.r_waited = np.zeros(n, dtype=np.int64)
        self.r_decide = np.full(n, np.nan)
        self.r_end = np.full(n, np.nan)
        hyb = cfg.hybrid
        self.r_full_hit = np.zeros(n, dtype=np.int64) if hyb else None
        # the hit Mamba alone would give on the tree at admission: the deepest state on
        # the matched path (SWA mode: the full hit; Mamba mode: the hit)
        self.r_state_hit = np.zeros(n, dtype=np.int64) if hyb else None
        self.r_base = np.zeros(n, dtype=np.int64) if hyb else None  # hit + declined host hit
        self.r_swa_evicted = np.zeros(n, dtype=np.int64) if cfg.swa else None
        self.r_m_evicted = np.zeros(n, dtype=np.int64) if cfg.mamba else None
        scale = cfg.arrival.rate_scale if cfg.timed else 1.0
        self.arrive_ms = self.workload.timestamps / scale
        self.arrive_l = self.arrive_ms.tolist()

    # ------------------------------------------------------------ steps
    def tokens(self, i):
        """Request ``i``'s token ids: its prompt (its hash blocks expanded), then its
        output tokens with ``cache_outputs``; and its ``(prompt, output)`` lengths."""
        n, o = self.nin[i], self.nout[i]
        p = self.ptr
        toks = (self.workload.hash_ids[p[i]:p[i + 1], None] * self.B
                + self.block_offsets).reshape(-1)[:n]
        if self.fresh is not None and o:
            f = self.fresh[i]
            toks = np.concatenate((toks, np.arange(f, f + o, dtype=np.int64)))
        return toks, n, o

    def arrive(self, i):
        """The clock moves to request ``i``'s arrival (arrival mode: the requests
        that ended by then complete)."""
        self.running.arrive(self.arrive_l[i])

    def match_and_lock(self, a):
        """Match ``a``'s key and lock the device match (``a.m``, ``a.node``,
        ``a.tree_lock``; SWA + Mamba: ``a.s_hit``, the deepest state on the path)."""
        pc = self.pc
        t0 = pc()
        m = self.match(self.params(a.key))
        t1 = pc()
        a.m, a.node = m, m.last_device_node
        a.tree_lock = self.lock(a.node)
        self.lat_lock.append(pc() - t1)
        self.lat_match.append(t1 - t0)
        if self.cfg.triple:
            a.s_hit = self.state_hit(m)

    def state_hit(self, m):
        """The SWA + Mamba mode: the end of the deepest node holding a state on the
        matched path (read at the match: the unlocked nodes below the hit may be
        evicted before admission); from the node at the Full hit up to the hit's
        node, which holds one (or is the root)."""
        hit, depth = m.device_prefix_len, m.full_kv_hit_length
        nid = m.last_visited_node_id
        while depth > hit:
            info = self.node_info(nid)
            if info["has_mamba"]:
                return depth
            depth -= len(info["key"])
            nid = info["parent"]
        return hit

    def admit(self, i):
        """Admit request ``i`` (after :meth:`arrive`): returns whether it was served
        (``False``: rejected, its prompt and outputs can never fit)."""
        toks, n, o = self.tokens(i)
        c = self.c
        # the Mamba mode matches prompt[:-1], as SGLang's scheduler (at least one token
        # is computed); the Full-only and SWA modes the whole prompt
        a = Admission(i, n, o, toks, toks[:n - 1] if self.cfg.mamba and n else toks[:n], c)
        self.running.wait_slot(a)
        host = self.host
        host.begin(a)
        host.match(a)
        self.states.acquire(a)
        host.load(a)
        # what both tiers could serve: the hit and the host tokens a declined load left
        base = a.hit + (c.declined - a.dec0)
        if a.s_hit is not None and base > a.s_hit:
            a.s_hit = base    # a restored state, or one a declined load left on the host
        slots = self.alloc_kv(a)
        host.loaded(a)
        self.r_evicted[i] = c.evicted - a.ev0
        if self.r_swa_evicted is not None:
            self.r_swa_evicted[i] = c.swa_evicted - a.sev0
        if self.r_m_evicted is not None:
            self.r_m_evicted[i] = c.m_evicted - a.mev0
        self.r_waited[i] = a.waited
        self.r_decide[i] = self.running.clock
        host.record(a)
        if slots is None:
            self.reject(a)
            return False
        self.start(a, slots, base)
        return True

    def alloc_kv(self, a):
        """KV slots for ``a``'s uncached prompt and its outputs: evict when short,
        then wait for running requests; ``None`` when nothing is left to wait for."""
        need = a.n - a.hit + a.o
        a_alloc, c, pc = self.a_alloc, self.c, self.pc
        slots = a_alloc(need)
        while slots is None:
            t = pc()
            self.evict(need)
            self.lat_evict.append(pc() - t)
            slots = a_alloc(need)
            if slots is None:
                if not len(self.running):
                    break
                self.complete_next()
                self.host.poll()      # a step ended: the completion's backups go through
                c.waits += 1
                a.waited += 1
                slots = a_alloc(need)
        return slots

    def evict(self, need):
        """Evict for an allocation of ``need`` KV slots (the mode's pools); counts
        what it evicted (what a Full eviction deleted with its leaves counts for the
        hybrid modes too)."""
        res = self.kv.evict(need)
        c = self.c
        c.evicted += res.num_tokens_evicted
        c.swa_evicted += res.swa_num_tokens_evicted
        c.m_evicted += res.mamba_num_evicted
        c.evict_calls += 1

    def evict_state(self, count=1):
        """The Mamba modes: evict ``count`` states (a leaf's deletes its Full and SWA
        KV too)."""
        c, pc = self.c, self.pc
        t = pc()
        res = self.evict_for_alloc(EvictParams(num_tokens=0, mamba_num=count))
        self.lat_evict.append(pc() - t)
        c.evict_calls += 1
        c.evicted += res.num_tokens_evicted
        c.swa_evicted += res.swa_num_tokens_evicted
        c.m_evicted += res.mamba_num_evicted

    def reject(self, a):
        """``a`` can never fit: its lock and its state slot go back."""
        self.unlock(a.tree_lock if self.cfg.hybrid else a.node)
        if a.mslot is not None:
            self.states.release(a)
        self.c.rejected += 1

    def start(self, a, slots, base):
        """``a`` is admitted: its request row, its ``Req``, the mode's prefill and
        decode steps; it runs until the clock completes it."""
        cfg, c, i, n, o, hit = self.cfg, self.c, a.i, a.n, a.o, a.hit
        c.hit_tokens += hit
        self.r_hit[i] = hit
        self.host.served(a)
        row = self.req_pool.alloc(1)[0]
        self.table[row, :hit] = a.prefix
        self.table[row, hit:n + o] = slots
        req = self.host.request(a, row, n + o if cfg.cache_outputs else n)
        if cfg.hybrid:
            req.lock = a.tree_lock
            full_hit = a.m.full_kv_hit_length
            self.r_full_hit[i] = full_hit
            # the deepest state: Mamba alone on this tree would hit it (SWA: no state to
            # lack; Mamba: the hit)
            s_hit = a.s_hit if cfg.triple else full_hit if cfg.swa else base
            self.r_state_hit[i] = s_hit
            self.r_base[i] = base
            c.lost_w += s_hit - base
            c.lost_c += full_hit - s_hit
        self.states.start(a, req)
        self.kv.start(a, req)
        self.active_blocks += -(-n // cfg.page_size)
        self.running.start(a, (req, row, a.toks, a.node, hit, n, o))

    def complete(self, r):
        """A running request finishes: its prompt (and outputs with
        ``cache_outputs``) is cached, the rest of its slots freed."""
        req, row, toks, node, hit, n, o = r
        self.active_blocks -= -(-n // self.cfg.page_size)
        pc = self.pc
        t = pc()
        if self.use_req:
            self.finished(req)
        else:
            self._complete_core(row, toks, node, hit, n, o)
        self.lat_finish.append(pc() - t)
        self.note_sizes()

    def _complete_core(self, row, toks, node, hit, n, o):
        # the core driver: cache_finished_req's effect through insert / dec_lock_ref /
        # allocator.free
        cfg = self.cfg
        page = cfg.page_size
        committed = n + o if cfg.cache_outputs else n
        aligned = committed - committed % page
        vals = self.table[row, :n + o].copy()
        insert = self.cache.insert
        if aligned > 0:
            res = insert(InsertParams(key=RadixKey(toks[:aligned]), value=vals[:aligned],
                                      prev_prefix_len=hit))
            pa = n - n % page
            if cfg.cache_outputs and 0 < pa < aligned:
                # what checkpoint does on a Full-only tree: the prompt again, priority + 1,
                # with the tree's slots (ours past the hit that the tree already held were
                # duplicates, freed by the insert)
                prompt = vals[:pa]
                if res.prefix_len > hit:
                    prompt = np.asarray(self.cache.path_device_indices(
                        res.last_device_node))[:pa]
                insert(InsertParams(key=RadixKey(toks[:pa]), value=prompt,
                                    prev_prefix_len=pa, inserted_len=pa, priority=1))
        self.unlock(node)
        if aligned < n + o:
            self.a_free(vals[aligned:])
        self.req_pool.free(row)

    def complete_next(self):
        """Complete the running request the clock picks (the oldest, or the earliest
        ending)."""
        self.complete(self.running.pop())

    def note_sizes(self):
        """The peak tree sizes (after each completion; extra buffer: each checkpoint
        too)."""
        c = self.c
        size, aux_size = self.total_size()
        if size > c.peak:
            c.peak = size
        self.host.note_sizes()
        if self.cfg.triple:
            aux_size = self.swa_size()
            m = self.m_size()
            if m > c.peak_m:
                c.peak_m = m
        if aux_size > c.peak_aux:
            c.peak_aux = aux_size

    def aux_sizes(self):
        """The tree's Full tokens, SWA tokens and states on the device."""
        size, aux_size = self.total_size()
        if self.cfg.triple:
            return size, self.swa_size(), self.m_size()
        return size, aux_size if self.cfg.swa else 0, aux_size if self.cfg.mamba else 0

    def drain(self):
        """The end of the trace: every running request completes (and, with a host
        tier, the last step's backups go through)."""
        while len(self.running):
            self.complete_next()
        if self.host.active:
            self.host.poll()
            self.note_sizes()

    def run(self, progress=False):
        """Every request of the workload through this scheduler, in order; returns
        ``(wall seconds, CPU seconds)`` of the loop. ``progress``: a bar on a
        terminal."""
        n_req = len(self.workload)
        bar = progress_bar(n_req, progress, unit="req", smoothing=0.1)
        step = 0
        arrive, admit = self.arrive, self.admit
        t_start, c_start = time.perf_counter(), time.process_time()
        for i in range(n_req):
            arrive(i)
            admit(i)
            step += 1
            if bar is not None and step == 64:
                bar.update(step)
                step = 0
        self.drain()
        wall = time.perf_counter() - t_start
        cpu = time.process_time() - c_start
        if bar is not None:
            bar.update(step)
            bar.close()
        return wall, cpu
