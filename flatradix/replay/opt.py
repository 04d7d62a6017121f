"""The offline optimal policy, ``policy="opt"``: a prefix cache that knows the
whole trace and evicts the page whose next use lies farthest in the future
(Belady's rule on a tree).

:class:`OptimalCache` has the calls the replay's ``"core"`` driver makes
(``match_prefix``, ``inc_lock_ref`` / ``dec_lock_ref``, ``insert``, ``evict``,
the sizes), on whole pages: a page is a page-aligned token prefix
(:func:`~flatradix.replay.pages.page_ids`), its *next use* the first later
request whose page-aligned prompt contains it. ``evict(n)`` removes unlocked
leaf pages, farthest next use first (a page never used again first of all; ties:
the deepest), until ``n`` tokens are free. A page's ancestors are used whenever
it is, so their next use is never later than its own: the cache stays
prefix-closed, and every page it holds is a hit when next used.

What is proven, and what is not. In the order mode with one request at a time
(``max_running=1``) on a Full-attention model, the replay is a paging problem
over unit-size pages: each request needs its prompt's pages (its hit: those
already held) plus ``uncached + outputs`` free slots at once, then its prompt's
pages are held and the rest freed; the capacity left for cached pages varies
with time and a page may be dropped right after it is inserted. For paging with
unit pages, evicting the page requested farthest in the future is optimal
(Belady 1966; Mattson et al. 1970), also with a capacity that varies over time
and with bypass (an exchange argument, step by step, evicting as late as
possible); and since a page's ancestors are never used later than it, the
pages Belady holds are always a prefix-closed tree, so its page hits are prefix
hits. Hence here ``opt`` gives the most hit tokens of any eviction schedule,
including every policy flatradix has (which evict whole nodes: a coarser choice)
-- ``tests/test_replay_opt.py`` checks this against a brute-force search of every
eviction choice on small traces. Not proven: with ``max_running > 1`` or in the
arrival mode, when a request waits and which completion frees its KV depends on
the evictions, so the problem is no longer paging and Belady's rule is a
heuristic there (reported as ``opt`` all the same); hybrid models (SWA, Mamba)
and the host tier are not modelled (refused). In a fleet, each instance runs it
over the requests routed to it, known in advance only for a router that does
not read the caches (round-robin, random, prefix-hash): the best case of that
routing, not of the fleet.
"""

import heapq

import numpy as np

from .. import EvictResult, InsertResult, MatchResult
from .pages import page_ids

#: ``next use`` of a page no later request needs
NEVER = 1 << 62
ROOT = 0


class Future:
    """The requests an instance will serve, in order, as page ids: ``next_use(ids,
    now)`` is, per id, the position (in that order) of the first request after
    position ``now`` whose page-aligned prompt holds it (:data:`NEVER` if none).

    ``workload``: a :class:`~flatradix.replay.trace.Workload`; ``requests``: its
    request indices in the order the instance admits them (default: all)."""

    def __init__(self, workload, page_size, requests=None):
        self.page_size = page_size
        req = np.arange(len(workload)) if requests is None else np.asarray(requests)
        self.requests = req.tolist()
        ids, pos = [], []
        for q, j in enumerate(self.requests):
            n = int(workload.input_lengths[j]) // page_size
            if n:
                ids.append(page_ids(workload.tokens(j), page_size, n)[0])
                pos.append(np.full(n, q, dtype=np.int64))
        ids = np.concatenate(ids) if ids else np.empty(0, np.uint64)
        pos = np.concatenate(pos) if pos else np.empty(0, np.int64)
        self.uniq, rank = np.unique(ids, return_inverse=True)
        self.keys = np.sort((rank.astype(np.int64) << 32) | pos)

    def next_use(self, ids, now):
        """First position > ``now`` using each of ``ids`` (uint64 array); int64."""
        out = np.full(len(ids), NEVER, dtype=np.int64)
        if not len(ids) or not len(self.uniq):
            return out
        r = np.searchsorted(self.uniq, ids)
        known = (r < len(self.uniq)) & (self.uniq[np.minimum(r, len(self.uniq) - 1)] == ids)
        q = (r.astype(np.int64) << 32) | (now + 1)
        at = np.searchsorted(self.keys, q)
        ok = known & (at < len(self.keys))
        hit = self.keys[np.minimum(at, len(self.keys) - 1)]
        ok &= (hit >> 32) == r
        out[ok] = hit[ok] & 0xFFFFFFFF
        return out


class _Page:
    __slots__ = ("parent", "children", "lock", "next", "depth", "values")

    def __init__(self, parent, depth, values, nxt):
        self.parent, self.depth, self.values, self.next = parent, depth, values, nxt
        self.children = 0
        self.lock = 0


class OptimalCache:
    """Belady's rule on a prefix tree of pages (module docstring), for the replay's
    ``"core"`` driver. ``future``: the :class:`Future` of the requests it will be
    asked to match, in order (each ``match_prefix`` call is the next one)."""

    def __init__(self, page_size, token_to_kv_pool_allocator, future):
        self.page_size = page_size
        self.allocator = token_to_kv_pool_allocator
        self.future = future
        self.now = -1           # position of the last request matched
        self.pages = {}         # page id -> _Page
        self.heap = []          # (-next use, -depth, page id): evictable leaves, lazily
        self._evictable = self._protected = 0

    # ------------------------------------------------------------ queries
    def _ids(self, tokens):
        return page_ids(np.asarray(tokens), self.page_size)[0].tolist()

    def match_prefix(self, params):
        """The longest cached page-aligned prefix of the key; the next request in
        the future begins now."""
        self.now += 1
        key = np.asarray(params.key.token_ids)
        ids = self._ids(key)
        vals, node = [], ROOT
        for pid in ids:
            p = self.pages.get(pid)
            if p is None:
                break
            vals.append(p.values)
            node = pid
        hit = len(vals) * self.page_size
        v = np.concatenate(vals) if vals else np.empty(0, np.int64)
        return MatchResult(v, node, node, node, 0, hit, hit, None)

    def _path(self, node):
        while node != ROOT:
            yield node, self.pages[node]
            node = self.pages[node].parent

    def inc_lock_ref(self, node):
        for _, p in self._path(node):
            if p.lock == 0:
                self._evictable -= self.page_size
                self._protected += self.page_size
            p.lock += 1

    def dec_lock_ref(self, node, receipt=None):
        free = [(pid, p) for pid, p in self._path(node) if p.lock == 1]
        for _, p in self._path(node):
            p.lock -= 1
        if not free:
            return
        self._evictable += len(free) * self.page_size
        self._protected -= len(free) * self.page_size
        # used by the request that held them: their next use is later now
        nxt = self.future.next_use(np.array([pid for pid, _ in free], np.uint64), self.now)
        for (pid, p), t in zip(free, nxt.tolist()):
            p.next = t
            if p.children == 0:
                heapq.heappush(self.heap, (-t, -p.depth, pid))

    # ------------------------------------------------------------ insert / evict
    def insert(self, params):
        """Hold the key's pages; the values of pages already held are duplicates,
        freed (``[prev_prefix_len, prefix_len)``)."""
        page = self.page_size
        key = np.asarray(params.key.token_ids)
        value = np.array(params.value, dtype=np.int64)     # pages keep views of it
        ids = page_ids(key, page)[0]
        n = len(ids)
        pos = 0
        parent = ROOT
        while pos < n and int(ids[pos]) in self.pages:
            parent = int(ids[pos])
            pos += 1
        prev = int(params.prev_prefix_len) // page
        if pos > prev:
            self.allocator.free(value[prev * page:pos * page])
        if pos < n:
            nxts = self.future.next_use(ids[pos:], self.now).tolist()
            if parent != ROOT:
                self.pages[parent].children += 1
            for k in range(pos, n):
                pid = int(ids[k])
                # (a view: the caller's row copy, made for this insert)
                self.pages[pid] = _Page(parent, k + 1, value[k * page:(k + 1) * page],
                                        nxts[k - pos])
                if k + 1 < n:
                    self.pages[pid].children = 1
                parent = pid
            self._evictable += (n - pos) * page
            leaf = self.pages[parent]
            heapq.heappush(self.heap, (-leaf.next, -leaf.depth, parent))
        return InsertResult(prefix_len=pos * page, last_device_node=parent)

    def evict(self, params):
        """Evict unlocked leaf pages, farthest next use first, until
        ``params.num_tokens`` tokens are freed (or none is left)."""
        want = int(params.num_tokens)
        done, freed = 0, []
        heap, pages = self.heap, self.pages
        while done < want and heap:
            neg_next, _, pid = heapq.heappop(heap)
            p = pages.get(pid)
            if p is None or p.lock or p.children or -neg_next != p.next:
                continue        # stale entry
            del pages[pid]
            freed.append(p.values)
            done += self.page_size
            self._evictable -= self.page_size
            if p.parent != ROOT:
                q = pages[p.parent]
                q.children -= 1
                if q.children == 0 and q.lock == 0:
                    heapq.heappush(heap, (-q.next, -q.depth, p.parent))
        if freed:
            self.allocator.free(np.concatenate(freed))
        return EvictResult(num_tokens_evicted=done)

    def path_device_indices(self, node):
        """The slots of the pages from the root to ``node``."""
        vals = [p.values for _, p in self._path(node)][::-1]
        return np.concatenate(vals) if vals else np.empty(0, np.int64)

    # ------------------------------------------------------------ sizes
    def evictable_size(self):
        return self._evictable

    def protected_size(self):
        return self._protected

    def total_size(self):
        return self._evictable + self._protected, 0


def opt_factory(future):
    """A replay ``cache_factory`` building an :class:`OptimalCache` over ``future``."""
    def factory(page_size, eviction_policy, token_to_kv_pool_allocator, req_to_token_pool,
                **kw):
        if kw:
            raise ValueError(f"policy 'opt' models Full attention only, not {sorted(kw)}")
        return OptimalCache(page_size, token_to_kv_pool_allocator, future)
    return factory
