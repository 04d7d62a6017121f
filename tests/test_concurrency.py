"""The façade under 8 Python threads (locking model: docs/architecture.md, "The GIL
and threads").

``test_eight_threads_mixed_operations``: 8 threads start together
(``threading.Barrier``) with the switch interval at 1 µs, each running a fixed
number of mixed operations on one shared cache with a real allocator and
request pool: request admission (match + inc_lock_ref, atomically under
``cache.mutex`` or racing and retrying on ``NodeAccessError``), decode,
cache_unfinished_req, cache_finished_req (or is_insert=False), bare matches
holding extra locks, dec_lock_ref, direct inserts, evict, evict_for_alloc,
step-wise eviction rounds, stale-handle probes, sizes and sanity_check.

Half of each thread's keys live in its own namespace (``extra_key``), where only
that thread inserts: every value it matches there must equal, position by
position, what its pure-Python model says that prefix maps to (the model is
updated from the tree's own answers: insert results, the request row rewritten
by checkpoint). The other half share one namespace for contention: there a
locked match's slots must be allocated (not free) while the lock is held.

Every ``CHECK_EVERY`` operations all threads meet at a barrier whose action
(run while every thread waits) checks sanity_check(), that the pool's slots
partition exactly into free / cached / owned by running requests, and
available + evictable + protected + owned == pool. At the end: no exception in
any thread, every lock released (protected_size() == 0), the same invariants.
"""

import sys
import threading

import numpy as np
import pytest

from flatradix import (
    EvictParams, InsertParams, MatchPrefixParams, NodeAccessError, RadixKey, Req,
    ReqToTokenPool, TokenToKVPoolAllocator, UnifiedRadixCache,
)

THREADS = 8
OPS = 1000
CHECK_EVERY = 250
POOL = 3000
PAGE = 2
CTX = 160


@pytest.fixture
def fast_switching():
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def partition_check(cache, alloc, owned):
    """Slots 1..POOL are exactly free + cached + owned, and the ledgers agree."""
    cache.sanity_check()
    free = np.nonzero(alloc.is_free(np.arange(alloc.size + 1)))[0]
    cached = np.asarray(cache.all_values_flatten())
    ev, pr, tot = cache.evictable_size(), cache.protected_size(), cache.total_size()[0]
    assert ev + pr == tot == len(cached)
    every = np.concatenate([free, cached] + [np.asarray(o) for o in owned])
    assert len(every) == alloc.size, (len(free), len(cached), sum(len(o) for o in owned))
    np.testing.assert_array_equal(np.sort(every), np.arange(1, alloc.size + 1))
    assert alloc.available_size() + ev + pr + sum(len(o) for o in owned) == alloc.size


class Worker:
    def __init__(self, i, cache, alloc, rtp, start, checks, errors):
        self.i, self.cache, self.alloc, self.rtp = i, cache, alloc, rtp
        self.start, self.checks, self.errors = start, checks, errors
        self.rng = np.random.default_rng(1000 + i)
        self.model = {}      # own namespace: (page-prefix, position) -> KV slot the tree holds
        self.running = []    # at most 2 requests across operations
        self.held = []       # extra locks
        self.seen = []       # node ids seen (may go stale)
        self.done = {}       # counters
        self.prompts = [list(self.rng.integers(0, 6, size=int(self.rng.integers(8, 60))))
                        for _ in range(6)]

    # ---------------------------------------------------------------- helpers
    def ns(self, own):
        return {"extra_key": f"t{self.i}"} if own else {}

    def key(self):
        own = self.rng.random() < 0.5
        base = self.prompts[int(self.rng.integers(len(self.prompts)))]
        toks = base[: int(self.rng.integers(0, len(base) + 1))] + list(
            self.rng.integers(0, 6, size=int(self.rng.integers(1, 40))))
        return [int(t) for t in toks[: CTX - 40]], own

    def count(self, what):
        self.done[what] = self.done.get(what, 0) + 1

    @staticmethod
    def _at(toks, j):
        """Model key of position j: the tokens up to the end of j's page (nodes hold
        whole pages, so the page, not the token prefix, decides the slot) and j."""
        return tuple(toks[: (j // PAGE + 1) * PAGE]), j

    def check_own(self, toks, indices):
        """Own namespace: matched slots equal the model, position by position."""
        for j, v in enumerate(np.asarray(indices).tolist()):
            want = self.model.get(self._at(toks, j))
            assert want == v, (f"thread {self.i}: position {j} of {toks[:j + 1][-4:]}... "
                               f"matched slot {v}, model says {want}")

    def learn(self, toks, path):
        for j, v in enumerate(np.asarray(path).tolist()):
            self.model[self._at(toks, j)] = v

    def alloc_slots(self, n):
        slots = self.alloc.alloc(n)
        if slots is None:
            self.cache.evict_for_alloc(n)
            slots = self.alloc.alloc(n)
        return slots

    def owned(self):
        out = []
        for r in self.running:
            p = r.cache_protected_len if r.cache_protected_len is not None else len(r.prefix_indices)
            out.append(self.rtp.req_to_token[r.req_pool_idx, p:r.kv_committed_len].copy())
        return out

    # ---------------------------------------------------------------- operations
    def admit(self):
        if len(self.running) >= 2:
            return self.finish()
        toks, own = self.key()
        c = self.cache
        key = RadixKey(toks, **self.ns(own))
        if self.rng.random() < 0.5:
            with c.mutex:  # atomic admission
                m = c.match_prefix(MatchPrefixParams(key=key))
                c.inc_lock_ref(m.last_device_node)
        else:  # racing admission: the node may be evicted in between; retry
            for _ in range(20):
                m = c.match_prefix(MatchPrefixParams(key=key))
                try:
                    c.inc_lock_ref(m.last_device_node)
                    break
                except NodeAccessError:
                    self.count("admit_retry")
            else:
                raise AssertionError("20 admissions in a row lost their node")
        plen = m.device_prefix_len
        assert plen % PAGE == 0 and len(m.device_indices) == plen
        # locked now: the slots are the tree's, not free, and own-namespace ones are exact
        assert not self.alloc.is_free(m.device_indices).any()
        if own:
            self.check_own(toks, m.device_indices)
        slots = self.alloc_slots(len(toks) - plen)
        rows = self.rtp.alloc(1) if slots is not None else None
        if rows is None:
            c.dec_lock_ref(m.last_device_node)
            if slots is not None:
                self.alloc.free(slots)
            self.count("admit_refused")
            return
        row = rows[0]
        self.rtp.write((row, slice(0, plen)), m.device_indices)
        self.rtp.write((row, slice(plen, len(toks))), slots)
        self.running.append(Req(origin_input_ids=toks, req_pool_idx=row,
                                prefix_indices=m.device_indices, last_node=m.last_device_node,
                                kv_committed_len=len(toks), **self.ns(own)))
        self.seen.append(m.last_device_node)
        self.count("admit")

    def decode(self):
        if not self.running:
            return self.admit()
        req = self.running[int(self.rng.integers(len(self.running)))]
        n = int(self.rng.integers(1, 9))
        have = req.kv_committed_len
        if have + n > CTX:
            return self.finish(req)
        slots = self.alloc_slots(n)
        if slots is None:
            self.count("decode_refused")
            return
        self.rtp.write((req.req_pool_idx, slice(have, have + n)), slots)
        new = [int(t) for t in self.rng.integers(0, 6, size=n)]
        req.output_ids = list(req.output_ids) + new
        req.fill_ids = list(req.fill_ids) + new
        req.kv_committed_len = have + n
        self.count("decode")

    def checkpoint(self):
        if not self.running:
            return self.admit()
        req = self.running[int(self.rng.integers(len(self.running)))]
        c = self.cache
        c.cache_unfinished_req(req)
        n = len(req.fill_ids)
        aligned = n - n % PAGE
        if aligned:
            # the request's lock pins its path: the row now holds exactly the tree's slots
            path = c.path_device_indices(req.last_node)
            np.testing.assert_array_equal(path, self.rtp.req_to_token[req.req_pool_idx, :aligned])
            if req.extra_key:
                self.learn(list(req.fill_ids), path)
        self.seen.append(req.last_node)
        self.count("checkpoint")

    def finish(self, req=None):
        if not self.running:
            return self.admit()
        if req is None:
            req = self.running[int(self.rng.integers(len(self.running)))]
        del self.running[next(k for k, r in enumerate(self.running) if r is req)]
        insert = self.rng.random() < 0.9
        committed = req.kv_committed_len
        self.cache.cache_finished_req(req, is_insert=insert)
        aligned = committed - committed % PAGE
        if insert and aligned and req.extra_key:
            # release_kv_cache leaves the tree's slots of [0, aligned) in prefix_indices
            self.learn(list(req.fill_ids)[:committed], np.asarray(req.prefix_indices)[:aligned])
        self.count("finish" if insert else "abort")

    def match(self):
        toks, own = self.key()
        c = self.cache
        with c.mutex:
            m = c.match_prefix(MatchPrefixParams(key=RadixKey(toks, **self.ns(own))))
            if own:
                self.check_own(toks, m.device_indices)
            lock = len(self.held) < 4 and self.rng.random() < 0.5
            if lock:
                c.inc_lock_ref(m.last_device_node)
        if lock:
            self.held.append(m.last_device_node)
            assert not self.alloc.is_free(m.device_indices).any()
        self.seen.append(m.last_device_node)
        self.count("match")

    def unlock(self):
        if not self.held:
            return self.match()
        self.cache.dec_lock_ref(self.held.pop(int(self.rng.integers(len(self.held)))))
        self.count("unlock")

    def insert(self):
        toks, own = self.key()
        n = len(toks) - len(toks) % PAGE
        slots = self.alloc_slots(n)
        if slots is None:
            self.count("insert_refused")
            return
        c = self.cache
        with c.mutex:  # the result and the path it names, seen together
            r = c.insert(InsertParams(key=RadixKey(toks[:n], **self.ns(own)), value=slots))
            path = c.path_device_indices(r.last_device_node) if n else np.empty(0, np.int64)
        p = r.prefix_len
        assert p % PAGE == 0 and len(path) == n
        np.testing.assert_array_equal(path[p:], slots[p:n])
        if own:
            self.check_own(toks[:p], path[:p])
            self.learn(toks[:n], path)
        self.seen.append(r.last_device_node)
        self.count("insert")

    def evict(self):
        r = self.cache.evict(EvictParams(num_tokens=int(self.rng.integers(0, 200))))
        assert r.num_tokens_evicted >= 0 and r.evicted_indices is None
        self.count("evict")

    def evict_steps(self):
        c = self.cache
        with c.mutex:  # one round per cache: hold the lock for the whole round
            c.evict_device_start(num_tokens=int(self.rng.integers(1, 100)))
            total = 0
            while (step := c.evict_device_next_node()).node_id is not None:
                self.alloc.free(step.freed_indices)
                total += step.num_tokens
            assert c.evict_device_end() == total
        self.count("evict_steps")

    def probe(self):
        if not self.seen:
            return self.match()
        node = self.seen[int(self.rng.integers(len(self.seen)))]
        try:
            self.cache.inc_lock_ref(node)
        except NodeAccessError:
            self.count("stale")
            return
        self.cache.dec_lock_ref(node)
        self.count("probe_live")

    def sizes(self):
        c = self.cache
        ev, pr = c.evictable_size(), c.protected_size()
        assert ev >= 0 and pr >= 0
        with c.mutex:
            assert c.evictable_size() + c.protected_size() == c.total_size()[0]
        if self.rng.random() < 0.1:
            c.sanity_check()
        self.count("sizes")

    OPS_TABLE = (("admit", 0.2), ("decode", 0.2), ("checkpoint", 0.08), ("finish", 0.12),
                 ("match", 0.12), ("unlock", 0.05), ("insert", 0.08), ("evict", 0.05),
                 ("evict_steps", 0.03), ("probe", 0.03), ("sizes", 0.04))

    def run(self):
        names, p = zip(*self.OPS_TABLE)
        fns = [getattr(self, n) for n in names]
        cum = np.cumsum(p) / sum(p)
        try:
            self.start.wait(timeout=60)
            for k in range(OPS):
                fns[min(int(np.searchsorted(cum, self.rng.random(), side="right")), len(fns) - 1)]()
                if (k + 1) % CHECK_EVERY == 0:
                    self.checks.wait(timeout=120)
            while self.running:
                self.finish(self.running[-1])
            while self.held:
                self.cache.dec_lock_ref(self.held.pop())
        except threading.BrokenBarrierError:
            self.errors.append((self.i, "barrier broken (another thread failed)"))
        except BaseException as e:  # collected and reported by the main thread
            import traceback

            self.errors.append((self.i, "".join(traceback.format_exception(e))))
            self.start.abort()
            self.checks.abort()


def test_eight_threads_mixed_operations(fast_switching):
    alloc = TokenToKVPoolAllocator(POOL)
    rtp = ReqToTokenPool(THREADS * 2, CTX)
    cache = UnifiedRadixCache(page_size=PAGE, token_to_kv_pool_allocator=alloc,
                              req_to_token_pool=rtp)
    errors, workers, checked = [], [], []

    def quiescent_check():  # runs in one thread while the 7 others wait at the barrier
        try:
            partition_check(cache, alloc, [o for w in workers for o in w.owned()])
            checked.append(cache.total_size()[0])
        except BaseException as e:
            errors.append(("barrier", repr(e)))
            raise

    start = threading.Barrier(THREADS)
    checks = threading.Barrier(THREADS, action=quiescent_check)
    workers.extend(Worker(i, cache, alloc, rtp, start, checks, errors) for i in range(THREADS))
    threads = [threading.Thread(target=w.run, name=f"worker{w.i}") for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
        assert not t.is_alive(), f"{t.name} hangs"
    assert not errors, "\n".join(f"thread {i}: {e}" for i, e in errors)
    assert len(checked) == OPS // CHECK_EVERY and max(checked) > 0
    # every lock released, every request finished: the tree holds only evictable KV
    assert cache.protected_size() == 0
    assert rtp.available_size() == THREADS * 2
    partition_check(cache, alloc, [])
    assert alloc.available_size() + cache.evictable_size() == POOL
    total = {}
    for w in workers:
        for k, v in w.done.items():
            total[k] = total.get(k, 0) + v
    # the run really mixed everything, with contention
    for what in ("admit", "decode", "checkpoint", "finish", "abort", "match", "unlock", "insert",
                 "evict", "evict_steps", "sizes"):
        assert total.get(what, 0) > 0, (what, total)
    assert sum(len(w.model) for w in workers) > 0
    # after everything, each thread's own namespace still answers per its model
    for w in workers:
        for toks in w.prompts:
            m = cache.match_prefix(MatchPrefixParams(key=RadixKey(toks, **w.ns(True))))
            w.check_own(toks, m.device_indices)
    cache.evict(EvictParams(num_tokens=POOL))
    assert cache.total_size()[0] == 0 and alloc.available_size() == POOL


def test_handle_held_across_another_threads_reset(fast_switching):
    cache = UnifiedRadixCache(page_size=1)
    cache.insert(InsertParams(key=RadixKey([1, 2, 3]), value=np.array([7, 8, 9])))
    matched, reset_done, out = threading.Event(), threading.Event(), {}

    def holder():
        m = cache.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3])))
        out["node"] = m.last_device_node
        matched.set()
        reset_done.wait(timeout=30)
        try:
            cache.inc_lock_ref(m.last_device_node)
        except NodeAccessError as e:
            out["error"] = e
        out["path"] = None
        try:
            cache.path_device_indices(m.last_device_node)
        except NodeAccessError:
            out["path"] = "stale"

    def resetter():
        matched.wait(timeout=30)
        cache.reset()
        # a new node takes the freed slot: the old handle must not name it
        out["new"] = cache.insert(InsertParams(key=RadixKey([4, 5]), value=np.array([1, 2]))
                                  ).last_device_node
        reset_done.set()

    ts = [threading.Thread(target=holder), threading.Thread(target=resetter)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    assert isinstance(out.get("error"), NodeAccessError) and out["path"] == "stale"
    assert out["new"] & 0xFFFFFFFF == out["node"] & 0xFFFFFFFF  # same slot, reused ...
    assert out["new"] != out["node"]                              # ... under a new id
    assert cache.protected_size() == 0
    cache.sanity_check()


def test_allocator_from_many_threads(fast_switching):
    alloc = TokenToKVPoolAllocator(4000)
    start = threading.Barrier(THREADS)
    held, errors = [[] for _ in range(THREADS)], []

    def work(i):
        rng = np.random.default_rng(i)
        try:
            start.wait(timeout=30)
            for _ in range(300):
                if held[i] and rng.random() < 0.45:
                    alloc.free(held[i].pop(int(rng.integers(len(held[i])))))
                else:
                    s = alloc.alloc(int(rng.integers(1, 20)))
                    if s is not None:
                        held[i].append(s)
        except BaseException as e:
            errors.append(repr(e))

    ts = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    assert not errors
    out = np.concatenate([s for h in held for s in h])
    assert len(np.unique(out)) == len(out)              # no slot handed out twice
    assert not alloc.is_free(out).any()
    assert alloc.available_size() + len(out) == 4000
    alloc.free(out)
    assert alloc.available_size() == 4000 and alloc.is_free(np.arange(1, 4001)).all()


class _GrowsOnFirstAcquire:
    """The cache's mutex; the first time a call takes it, "another thread" (played
    here, deterministically, inside the lock, which is re-entrant) inserts enough
    nodes to double the node table, which replaces the tree's arrays."""

    def __init__(self, cache):
        self.cache, self.lock, self.fired = cache, cache._mutex, False

    def __enter__(self):
        self.lock.acquire()
        if not self.fired:
            self.fired = True
            c = self.cache
            for i in range(c._engine.st.nodes.shape[0] + 4):
                c.insert(InsertParams(key=RadixKey([100 + i, 7]),
                                      value=np.array([1000 + 2 * i, 1001 + 2 * i])))
        return self

    def __exit__(self, *exc):
        self.lock.release()

    def acquire(self, *a, **k):
        return self.lock.acquire(*a, **k)

    def release(self):
        return self.lock.release()


@pytest.mark.parametrize("how", ["inc_lock_ref", "lock", "inc_lock_ref_batch", "lock_batch",
                                 "dec_lock_ref", "unlock", "dec_lock_ref_batch",
                                 "unlock_batch"])
def test_lock_calls_read_the_arrays_a_concurrent_growth_left(how):
    """A lock or unlock whose arrays are replaced by another thread's growth just
    before it takes the cache lock still changes the live tree (it read the
    arrays before taking the lock once, so the change went to the dropped ones:
    the lock was lost, then sanity_check failed and the release raised)."""
    c = UnifiedRadixCache(page_size=1, node_capacity=4)
    c.insert(InsertParams(key=RadixKey([1, 2, 3]), value=np.array([10, 11, 12])))
    node = c.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3]))).last_device_node
    cap = c._engine.st.nodes.shape[0]
    real = c._mutex
    if how.startswith(("inc", "lock")):
        c._mutex = _GrowsOnFirstAcquire(c)
    if how in ("inc_lock_ref", "dec_lock_ref"):
        r = c.inc_lock_ref(node)
    elif how in ("lock", "unlock"):
        r = c.lock(node)
    elif how in ("inc_lock_ref_batch", "dec_lock_ref_batch"):
        r = c.inc_lock_ref_batch([node])
    else:
        r = c.lock_batch([node])
    c._mutex = real
    assert c.protected_size() == 3
    c.sanity_check()
    if how.startswith(("dec", "unlock")):
        c._mutex = _GrowsOnFirstAcquire(c)
        if how == "dec_lock_ref":
            c.dec_lock_ref(node, r)
        elif how == "unlock":
            c.unlock(r)
        elif how == "dec_lock_ref_batch":
            c.dec_lock_ref_batch([node], r)
        else:
            c.unlock_batch(r)
        c._mutex = real
        assert c.protected_size() == 0
    else:
        c.dec_lock_ref(node)
        assert c.protected_size() == 0
    assert c._engine.st.nodes.shape[0] > cap  # the growth did happen
    c.sanity_check()
