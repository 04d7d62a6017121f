"""The replay's mode strategies: small objects a :class:`~.scheduler.Scheduler`
delegates the steps to that differ by mode (see :mod:`flatradix.replay.sim` for
the model each one follows).

* the clock (when requests complete): :class:`OrderClock` (FIFO, no clock) and
  :class:`ArrivalClock` (a clock in ms, requests end at their service times);
* the KV pools (how a shortfall is evicted, what a running request does while it
  decodes): :class:`FullKV` and :class:`SwaKV` (both pools' shortfalls, window
  slides);
* the Mamba state slots: :class:`NoStates`, :class:`MambaStates` (one slot a
  request) and :class:`ExtraBufferStates` (SGLang's extra buffer: 3-4 slots,
  states tracked on a grid, a checkpoint after the prefill);
* the host tier: :class:`NoHost`, :class:`HostTier` (Full attention: the match
  loads its host hit back) and :class:`HybridHostTier` (every component's host
  hit loaded together, after the request holds its state slot).

Each holds its scheduler (``s``) and reads and writes the scheduler's counters
(``s.c``), latency samples and per-request arrays; an ``a`` argument is the
:class:`~.scheduler.Admission` of the request being admitted.
"""

import collections
import heapq
import math

import numpy as np

from .. import EvictParams, InitLoadBackParams, Req
from .config import EXTRA_BUFFER_REQ_STATES


# ---------------------------------------------------------------- the clock
class OrderClock:
    """The order mode: no clock (timestamps give the order only); the oldest
    running request completes first."""

    timed = False

    def __init__(self, s, t0):
        self.s = s
        self.clock = t0          # never moves: an admission's "time" in the order mode
        self.running = collections.deque()

    def __len__(self):
        return len(self.running)

    def arrive(self, t):
        """Nothing completes on its own in the order mode."""

    def wait_slot(self, a):
        """Complete the oldest running requests until one of ``max_running`` is free."""
        s, running, cap = self.s, self.running, self.s.cfg.max_running
        while len(running) >= cap:
            s.complete(running.popleft())

    def pop(self):
        """The running request to complete next: the oldest."""
        return self.running.popleft()

    def start(self, a, r):
        """``r`` runs until it is the oldest and a slot or KV is needed."""
        self.running.append(r)


class ArrivalClock:
    """The arrival mode: a clock in ms; a request holds its KV for its service time
    (:meth:`ArrivalModel.service_ms`) and completes at its end, earliest first."""

    timed = True

    def __init__(self, s, t0, model):
        self.s = s
        self.clock = t0
        self.model = model
        self.heap = []           # (end ms, request index, running entry)

    def __len__(self):
        return len(self.heap)

    def arrive(self, t):
        """Move the clock to ``t`` (if later) and complete the requests that ended."""
        if t > self.clock:
            self.clock = t
        heap, complete = self.heap, self.s.complete
        while heap and heap[0][0] <= self.clock:
            complete(heapq.heappop(heap)[2])

    def wait_slot(self, a):
        """Wait for running requests to end until one of ``max_running`` is free
        (each wait counted: ``slot_waits``, the request's ``waited``)."""
        s, cap = self.s, self.s.cfg.max_running
        while len(self.heap) >= cap:
            s.complete(self.pop())
            s.c.slot_waits += 1
            a.waited += 1

    def pop(self):
        """The running request ending first; the clock moves to its end."""
        end, _, r = heapq.heappop(self.heap)
        if end > self.clock:
            self.clock = end
        return r

    def start(self, a, r):
        """``r`` ends after its service time: prefill of the uncached tokens, then decode."""
        end = self.clock + self.model.service_ms(a.n - a.hit, a.o)
        self.s.r_end[a.i] = end
        heapq.heappush(self.heap, (end, a.i, r))


# ---------------------------------------------------------------- KV pools
class FullKV:
    """One KV pool (Full attention): evict the allocator's shortfall."""

    def __init__(self, s):
        self.s = s
        self.evict_call = s.cache.evict
        self.avail = s.alloc.available_size

    def evict(self, need):
        """Evict for an allocation of ``need`` slots; the ``EvictResult``."""
        return self.evict_call(EvictParams(num_tokens=need - self.avail()))

    def start(self, a, req):
        """Nothing happens to a Full-only request's KV while it decodes."""


class SwaKV:
    """The SWA mode's two pools (each slot a Full slot with its SWA peer): evict both
    shortfalls (SGLang's ``evict_to_free_tokens``); a running request's window
    slides as it decodes."""

    def __init__(self, s):
        self.s = s
        cfg = s.cfg
        self.evict_for_alloc = s.cache.evict_for_alloc
        self.slide = s.cache.evict_sliding_windows
        self.avail = s.alloc.full_available_size
        self.s_avail = s.alloc.swa_available_size
        self.W, self.interval = cfg.swa_window, cfg.swa_eviction_interval

    def evict(self, need):
        """Evict each pool's shortfall for ``need`` slots; the ``EvictResult``."""
        return self.evict_for_alloc(EvictParams(num_tokens=max(0, need - self.avail()),
                                                swa_num_tokens=max(0, need - self.s_avail())))

    def start(self, a, req):
        """The decode steps (sequence lengths ``n + 1 .. n + o - 1``): the scheduler
        slides the window (``pre_len = seqlen - 1``) once ``interval`` tokens left it."""
        s, W, interval, s_avail, slide = self.s, self.W, self.interval, self.s_avail, self.slide
        req.swa_branching_seqlen = a.m.swa_branching_seqlen
        n, o = a.n, a.o
        pre = max(n, W + interval)
        last = n + o - 2
        pc, lat = s.pc, s.lat_slide
        while pre <= last:
            free0 = s_avail()
            t = pc()
            slide(req, pre)
            lat.append(pc() - t)
            s.c.slid += s_avail() - free0
            pre = max(pre + 1, req.swa_evicted_seqlen + W + interval)


# ---------------------------------------------------------------- Mamba states
class NoStates:
    """No Mamba layers: no state slot to take."""

    def acquire(self, a):
        """Nothing to take."""

    def release(self, a):
        """Nothing to give back."""

    def start(self, a, req):
        """Nothing to track."""


class MambaStates:
    """The Mamba mode: a request takes one state slot of its own at admission
    (evicting a cached state, waiting for a running request, or giving its own
    match up when nothing else is left) and donates it at completion."""

    def __init__(self, s):
        self.s = s
        pool = s.req_pool.mamba_allocator
        self.alloc, self.free, self.avail = pool.alloc, pool.free, pool.available_size

    def acquire(self, a):
        """Take ``a``'s state slot (``a.mslot``); ``a.touched``: the tree changed
        since its match (an eviction or a completion came first)."""
        s, alloc = self.s, self.alloc
        mslot = alloc(1)
        a.touched = mslot is None
        while mslot is None:
            s.evict_state()
            mslot = alloc(1)
            if mslot is None:
                if len(s.running):
                    s.complete_next()
                    s.host.poll()
                    s.c.m_waits += 1
                    a.waited += 1
                else:
                    # N = 1: the one state is the one this match locked, and a copy
                    # needs a second slot: give the match up and match again
                    s.unlock(a.tree_lock)
                    s.evict_state()
                    s.match_and_lock(a)
                    mslot = alloc(1)
                    if mslot is None:
                        raise AssertionError("no Mamba state slot free or evictable with "
                                             "nothing running: a state leaked")
        a.mslot = int(mslot[0])

    def release(self, a):
        """A rejected request's slot goes back."""
        self.free(np.array([a.mslot], dtype=np.int64))

    def start(self, a, req):
        """The state is donated at completion (``cache_finished_req``)."""


class ExtraBufferStates:
    """The Mamba mode with SGLang's extra buffer: 3 state slots a running request
    (its own and 2 ping-pong track slots), 4 when its checkpoint after the prefill
    swaps a fresh one in; states tracked on the grid ``lcm(chunk, page)`` by the
    prefill and the decode; ``checkpoint`` after a prefill that does not finish."""

    def __init__(self, s):
        self.s = s
        cfg = s.cfg
        self.avail = s.req_pool.mamba_allocator.available_size
        self.alloc_mamba = s.req_pool.alloc_mamba
        self.other_idx = s.req_pool.get_mamba_ping_pong_other_idx
        self.ckpt = s.cache.checkpoint
        # the checkpoint grid (the cache's mamba_checkpoint_grid)
        chunk, page = cfg.mamba_chunk, cfg.page_size
        self.grid = chunk * page // math.gcd(chunk, page)

    def want(self, hit, n, o):
        """alloc_mamba's slots, and the checkpoint's fresh slot when the prefill
        tracks a state and the request runs on after it."""
        return EXTRA_BUFFER_REQ_STATES + int(o >= 2 and n - hit >= self.grid)

    def acquire(self, a):
        """Make the slots ``a`` needs free: evict states, then wait for running
        requests, then give the match up (its locked state is evicted)."""
        s, avail = self.s, self.avail
        want = self.want(a.m.device_prefix_len, a.n, a.o)
        while avail() < want:
            s.evict_state(want - avail())
            if avail() >= want:
                break
            if len(s.running):
                s.complete_next()
                s.c.m_waits += 1
                a.waited += 1
            elif a.m.device_prefix_len > 0:
                # the only state left is the one this match locked
                s.unlock(a.tree_lock)
                s.evict_state(want - avail())
                s.match_and_lock(a)
                want = self.want(a.m.device_prefix_len, a.n, a.o)
            else:
                raise AssertionError(f"{want} Mamba state slots neither free nor evictable "
                                     f"with nothing running: a state leaked")

    def release(self, a):
        """A rejected request held no slot yet."""

    def track(self, req, seqlen):
        """The model runner saved the state at ``seqlen`` into the next ping-pong entry."""
        req.mamba_last_track_idx = req.mamba_next_track_idx
        req.mamba_next_track_idx = self.other_idx(req.mamba_next_track_idx)
        req.mamba_prev_track_seqlen = req.mamba_last_track_seqlen
        req.mamba_last_track_seqlen = seqlen

    def start(self, a, req):
        """Its slots (reserved above: the KV step only frees states), the prefill's
        tracked state, the checkpoint and the decode's tracked states."""
        s, grid, n, o, hit = self.s, self.grid, a.n, a.o, a.hit
        if not self.alloc_mamba(req):
            raise AssertionError("alloc_mamba failed after the state slots were reserved")
        # the prefill over n - hit tokens tracks a state (SGLang's model runner): at
        # hit + (e // G) * G, or at the match's branching point on the grid
        e = n - hit
        if e >= grid:
            at = hit + e // grid * grid
            branch = a.m.mamba_branching_seqlen
            if branch is not None and hit < branch < n and (branch - hit) % grid == 0:
                at = branch
            self.track(req, at)
        if o >= 2:
            # it runs on: SGLang's cache_unfinished_req after the prefill
            t = s.pc()
            self.ckpt(req, n)
            s.lat_ckpt.append(s.pc() - t)
            s.note_sizes()
            # decode steps at seqlens n + 1 .. n + o - 1: a state at each grid point
            g = (n // grid + 1) * grid
            while g < n + o:
                self.track(req, g)
                g += grid


# ---------------------------------------------------------------- the host tier
class NoHost:
    """No host tier: the hit is the device match."""

    active = False

    def __init__(self, s):
        self.s = s

    def begin(self, a):
        """Nothing to poll."""

    def poll(self):
        """Nothing to poll."""

    def match(self, a):
        """The device match, locked."""
        self.s.match_and_lock(a)

    def load(self, a):
        """The hit is the device match."""
        a.hit = a.m.device_prefix_len
        a.prefix = a.m.device_indices

    def loaded(self, a):
        """No load to complete."""

    def record(self, a):
        """No host figures."""

    def served(self, a):
        """No host figures."""

    def request(self, a, row, committed):
        """The ``Req`` its completion passes to ``cache_finished_req`` (the request
        driver), or ``None`` (the core driver)."""
        s = self.s
        if not s.use_req:
            return None
        return Req(origin_input_ids=a.toks[:a.n], fill_ids=a.toks, req_pool_idx=row,
                   prefix_indices=a.m.device_indices, last_node=a.node,
                   kv_committed_len=committed, kv_allocated_len=a.n + a.o,
                   mamba_pool_idx=a.mslot)

    def note_sizes(self):
        """No host pool."""


class HostTier:
    """The host tier over a Full-attention model: each scheduler step polls
    ``check_hicache_events``; a match's host hit is loaded back (``init_load_back``)
    before the lock, unless below ``load_back_threshold``."""

    active = True

    def __init__(self, s):
        self.s = s
        cache = s.cache
        self.check_events = cache.check_hicache_events
        self.init_load_back = cache.init_load_back
        self.ready_to_load = cache.ready_to_load_host_cache
        self.loading_check = cache.loading_check
        self.path_indices = cache.path_device_indices
        self.host_total = cache.host_total_size
        n = len(s.workload)
        self.r_dev_hit = np.zeros(n, dtype=np.int64)
        self.r_host_hit = np.zeros(n, dtype=np.int64)
        self.r_host_match = np.zeros(n, dtype=np.int64)
        self.r_declined = np.zeros(n, dtype=np.int64)

    def begin(self, a):
        """A scheduler step's poll; the ``Req`` that will ask for the load."""
        self.poll()
        a.hreq = Req(origin_input_ids=a.toks[:a.n], fill_ids=a.toks)

    def poll(self):
        """A scheduler step's HiCache poll: submit and complete the backups the
        completions queued (they pin their nodes on the device until then)."""
        s = self.s
        t = s.pc()
        self.check_events()
        s.lat_events.append(s.pc() - t)

    def match(self, a):
        """Match, load the host hit back (SGLang's PrefillAdder: ``init_load_back``
        with ``req.last_node`` the device match), lock the request's node."""
        s, c, pc = self.s, self.s.c, self.s.pc
        t0 = pc()
        m = s.match(s.params(a.key))
        s.lat_match.append(pc() - t0)
        a.m, a.tree_lock = m, None
        node = m.last_device_node
        a.hit = m.device_prefix_len
        a.prefix = m.device_indices
        a.got = 0
        if m.host_hit_length > 0:
            req = a.hreq
            req.last_node = node
            before = s.total_size()[0]
            t = pc()
            got, lnode = self.init_load_back(InitLoadBackParams(m.best_match_node,
                                                                m.host_hit_length, req=req))
            s.lat_load.append(pc() - t)
            # what its allocation evicted: the tree grew by the load, shrank by that
            ev = before + got - s.total_size()[0]
            c.load_evicted += ev
            c.evicted += ev
            if got:
                c.load_backs += 1
                c.loaded += got
                node = lnode
                a.hit += got
                a.prefix = self.path_indices(node)
                a.got = got
            else:
                c.declined += m.host_hit_length
        t1 = pc()
        s.lock(node)
        s.lat_lock.append(pc() - t1)
        a.node = node

    def load(self, a):
        """Loaded in :meth:`match` already."""

    def loaded(self, a):
        """The load is submitted with the batch and, synchronous, complete at once."""
        if a.got:
            self._loading_check()

    def _loading_check(self):
        s = self.s
        t = s.pc()
        if self.ready_to_load() == 0:
            self.loading_check()
            s.lat_loading.append(s.pc() - t)

    def record(self, a):
        """Its match's host hit and what a declined load left."""
        self.r_host_match[a.i] = a.m.host_hit_length
        self.r_declined[a.i] = self.s.c.declined - a.dec0

    def served(self, a):
        """Its hit split per tier."""
        c = self.s.c
        self.r_dev_hit[a.i] = a.hit - a.got
        self.r_host_hit[a.i] = a.got
        c.dev_hits += a.hit - a.got
        c.host_hits += a.got

    def request(self, a, row, committed):
        """The request that asked for the load, ready for ``cache_finished_req``."""
        req = a.hreq
        req.req_pool_idx = row
        req.prefix_indices = a.prefix
        req.last_node = a.node
        req.kv_committed_len = committed
        req.kv_allocated_len = a.n + a.o
        return req

    def note_sizes(self):
        """The peak host tree sizes."""
        c = self.s.c
        h = self.host_total()
        if h > c.peak_host:
            c.peak_host = h


class HybridHostTier(HostTier):
    """The host tier over a hybrid model (SWA, Mamba, SWA + Mamba): the request
    holds its lock on the device match and its state slot; any component's host
    hit (Full tokens, the SWA window, the state) is loaded back together, then
    the lock moves to the loaded node."""

    def __init__(self, s):
        super().__init__(s)
        cache, cfg = s.cache, s.cfg
        self.swa, self.mamba = cfg.swa, cfg.mamba
        self.swa_host_total = cache.swa_host_total_size if cfg.swa else None
        self.m_host_total = cache.mamba_host_total_size if cfg.mamba else None

    def match(self, a):
        """The device match, locked (SGLang's PrefillAdder holds that lock around
        the load)."""
        self.s.match_and_lock(a)

    def load(self, a):
        """The request holds its state slot before the load (the load copies the
        restored state into it; taken first, a load never finds the state pool
        empty), then every component's host hit is loaded."""
        s = self.s
        if self.mamba:
            a.hreq.mamba_pool_idx = a.mslot
            if a.touched:
                # the slot cost an eviction or a completion (its backups, host
                # evictions): the match's host part may be gone; match again (the
                # device match was locked: it is still there)
                s.unlock(a.tree_lock)
                s.match_and_lock(a)
        self._load(a)

    def _load(self, a):
        s, c, m = self.s, self.s.c, a.m
        a.hit = m.device_prefix_len
        a.prefix = m.device_indices
        a.got = 0
        s_hh = m.swa_host_hit_length if self.swa else 0
        m_hh = m.mamba_host_hit_length if self.mamba else 0
        if not (m.host_hit_length or s_hh or m_hh):
            return
        req = a.hreq
        req.last_node = a.node
        if self.swa:
            req.swa_host_hit_length = s_hh
        if self.mamba:
            req.mamba_host_hit_length = m_hh
        moved = s.moved
        before = s.aux_sizes()
        full0, swa0 = moved["load"], moved["load_swa"]
        t = s.pc()
        got, lnode = self.init_load_back(InitLoadBackParams(m.best_match_node,
                                                            m.host_hit_length, req=req))
        s.lat_load.append(s.pc() - t)
        after = s.aux_sizes()
        # what its allocations evicted: each tree grew by what the load restored and
        # shrank by that (a Full eviction takes the leaves' SWA KV and states along)
        got_full, got_swa = moved["load"] - full0, moved["load_swa"] - swa0
        got_state = int(bool(got) and m_hh > 0)
        ev = before[0] + got_full - after[0]
        c.load_evicted += ev
        c.evicted += ev
        ev = before[1] + got_swa - after[1]
        c.load_swa_evicted += ev
        c.swa_evicted += ev
        ev = before[2] + got_state - after[2]
        c.load_m_evicted += ev
        c.m_evicted += ev
        if not got:
            c.declined += m.host_hit_length
            return
        c.load_backs += 1
        c.loaded += got
        c.swa_loaded += got_swa
        c.state_loads += got_state
        t = s.pc()
        new_lock = s.lock(lnode)
        s.unlock(a.tree_lock)
        s.lat_lock.append(s.pc() - t)
        a.prefix = self.path_indices(lnode)
        a.node, a.tree_lock = lnode, new_lock
        a.hit += got
        a.got = got

    def loaded(self, a):
        """Every hybrid admission checks the loads (a state or window may have
        been restored)."""
        self._loading_check()

    def note_sizes(self):
        """The peak host tree sizes, per component."""
        super().note_sizes()
        c = self.s.c
        if self.swa:
            h = self.swa_host_total()
            if h > c.peak_swa_host:
                c.peak_swa_host = h
        if self.mamba:
            h = self.m_host_total()
            if h > c.peak_m_host:
                c.peak_m_host = h
