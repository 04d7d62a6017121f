"""Scheduler emulation: replay a :class:`~flatradix.replay.trace.Workload` through
a prefix cache, through the public API only, as SGLang's scheduler drives it.

The model (one pass over the requests, in arrival order; timestamps define the
order only, there is no clock):

1. **Admit** request ``i``: if ``max_running`` requests are in flight, the
   oldest completes first (FIFO completion). Then ``match_prefix`` on the
   prompt, ``inc_lock_ref`` on the matched node, and allocate KV slots for the
   uncached tail *and* the ``output_length`` tokens the request will decode
   (reserved at admission, so a running request never runs out of KV).
2. **Short of KV**: ``evict`` what the allocator lacks and retry; still short,
   complete the oldest running request (its slots return, its prompt becomes
   evictable) and retry; short with nothing running, the request can never fit:
   it is **rejected** (its lock released; counted as a miss, never a crash).
3. **Complete**: ``cache_finished_req`` caches the prompt (page-aligned down)
   and frees the rest: the prompt's unaligned tail and the output slots.
   Output tokens are never inserted by default, so their ids do not matter;
   with ``cache_outputs=True`` they are inserted too, as fresh token ids (from
   ``Workload.token_base`` up) that never match anything.

So with ``max_running=1`` and unbounded capacity, request ``i`` hits exactly the
longest page-aligned prefix it shares with any earlier page-aligned prompt.

Two drivers do step 3:

* ``"request"`` (default): builds a ``flatradix.Req`` with a
  ``ReqToTokenPool`` row ``[prefix | tail | outputs]``, ``kv_committed_len`` =
  prompt length and ``kv_allocated_len`` = prompt + output, and calls
  ``cache.cache_finished_req(req)``, which inserts, frees duplicates and the
  over-allocated slots, unlocks and releases the row.
* ``"core"``: the same effect through ``insert`` / ``dec_lock_ref`` /
  ``allocator.free`` only, for caches without the request API (the pure-Python
  reference model of the tests).

Rows of the ``ReqToTokenPool`` are reused: it has ``max_running`` rows, each as
long as the longest request (prompt + output).
"""

import collections
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from ..cache import UnifiedRadixCache
from ..pools import ReqToTokenPool, TokenToKVPoolAllocator
from ..requests import Req
from ..types import EvictParams, InsertParams, MatchPrefixParams, RadixKey

OPS = ("match_prefix", "inc_lock_ref", "evict", "cache_finished_req")


def default_cache_factory(page_size, eviction_policy, token_to_kv_pool_allocator,
                          req_to_token_pool):
    """``flatradix.UnifiedRadixCache`` wired to the replay's pools.

    The token pool starts at up to 4x the KV pool: evicted spans leave dead rows
    that the cache compacts away when the pool is full, so headroom makes those
    O(live) compactions rare (sizes only; the results are the same).
    """
    size = token_to_kv_pool_allocator.size
    return UnifiedRadixCache(page_size=page_size, eviction_policy=eviction_policy,
                             token_to_kv_pool_allocator=token_to_kv_pool_allocator,
                             req_to_token_pool=req_to_token_pool,
                             pool_capacity=max(1 << 16, min(4 * size, size + (1 << 25))))


@dataclass
class ReplayResult:
    """Figures of one replay (see :func:`replay`); ``to_dict()`` is the ``--json`` object."""

    workload: str
    capacity: object              # int tokens, or "inf"
    pool_slots: int               # allocator size actually used
    page_size: int
    max_running: int
    policy: str
    cache_outputs: bool
    requests: int
    served_requests: int
    rejected_requests: int
    prompt_tokens: int            # all requests' prompts (a rejected one counts as a miss)
    output_tokens: int
    hit_tokens: int
    token_hit_ratio: float
    evicted_tokens: int
    evict_calls: int
    waits: int                    # completions forced early because KV was short
    peak_tree_tokens: int
    final_tree_tokens: int
    kv_conserved: bool
    wall_s: float                 # the replay loop (JIT warm-up excluded: warmup_s)
    cpu_s: float                  # process CPU time of the loop (wall_s minus waiting for a core)
    requests_per_s: float
    prompt_tokens_per_s: float
    warmup_s: float = 0.0         # first replay in a process: kernel compile / cache load
    latency_us: dict = field(default_factory=dict)   # op -> {count, p50, p99, mean}
    hits: object = None           # int64 (requests,) per-request hit, -1 rejected (record_hits)

    def to_dict(self):
        d = asdict(self)
        d.pop("hits")
        return d


def _latency(samples_ns):
    a = np.asarray(samples_ns, dtype=np.int64)
    if a.size == 0:
        return {"count": 0, "p50": None, "p99": None, "mean": None}
    p50, p99 = np.percentile(a, [50, 99]) / 1e3
    return {"count": int(a.size), "p50": round(float(p50), 2), "p99": round(float(p99), 2),
            "mean": round(float(a.mean()) / 1e3, 2)}


_warm = False


def warm_up():
    """Compile (or load from Numba's cache) every kernel the replay calls, once per
    process, so the timed loop measures the cache and not the JIT. Returns seconds."""
    global _warm
    if _warm:
        return 0.0
    from .trace import Workload

    t = time.perf_counter()
    _warm = True
    tiny = Workload("warm-up", 4, np.zeros(4), np.array([8, 10, 7, 4], dtype=np.int64),
                    np.full(4, 2, dtype=np.int64), np.array([0, 2, 5, 7, 8], dtype=np.int64),
                    np.array([0, 1, 0, 1, 2, 0, 3, 4], dtype=np.int64))
    for driver in ("request", "core"):
        replay(tiny, capacity=16, page_size=1, max_running=2, driver=driver)
    return time.perf_counter() - t


def unbounded_pool_slots(workload, max_running, cache_outputs=False):
    """KV slots that an unbounded run can never exceed.

    Tree: at most ``distinct_prefix_blocks * block_size`` prompt tokens (plus
    every output token with ``cache_outputs``); in flight: at most
    ``max_running`` requests of the longest prompt + output.
    """
    if len(workload) == 0:
        return 1
    tree = workload.distinct_prefix_blocks() * workload.block_size
    if cache_outputs:
        tree += workload.output_tokens
    longest = int((workload.input_lengths + workload.output_lengths).max())
    return max(1, tree + max_running * longest)


def _progress_bar(total, enabled):
    if not enabled or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, file=sys.stderr, unit="req", smoothing=0.1, leave=False)


def replay(workload, capacity=None, page_size=16, max_running=1, policy="lru",
           cache_outputs=False, cache_factory=None, driver="request", progress=False,
           record_hits=False, check=True):
    """Replay ``workload`` through a cache; returns a :class:`ReplayResult`.

    Parameters
    ----------
    workload : Workload
    capacity : int or None
        KV slots of the pool (tokens). ``None`` (or ``math.inf``): unbounded, the
        pool is sized by :func:`unbounded_pool_slots` so nothing is ever evicted.
    page_size, policy : the cache's ``page_size`` and ``eviction_policy``.
    max_running : int >= 1
        Requests in flight at once (FIFO completion).
    cache_outputs : bool
        Also insert each request's output tokens (fresh ids, never matched).
    cache_factory : callable, optional
        ``f(page_size, eviction_policy, token_to_kv_pool_allocator,
        req_to_token_pool) -> cache``; default ``flatradix.UnifiedRadixCache``.
    driver : {"request", "core"}
        How completions are cached (module docstring).
    progress : bool
        tqdm bar on stderr (shown only when stderr is a TTY and tqdm is installed).
    record_hits : bool
        Keep the per-request hit lengths in ``ReplayResult.hits``.
    check : bool
        After the run, verify KV conservation (allocator available + evictable +
        protected == pool, nothing protected) and call ``sanity_check()`` when
        the cache has one; ``AssertionError`` if it fails.
    """
    if driver not in ("request", "core"):
        raise ValueError(f"driver must be 'request' or 'core', got {driver!r}")
    max_running = int(max_running)
    if max_running < 1:
        raise ValueError(f"max_running must be >= 1, got {max_running}")
    page_size = int(page_size)
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    unbounded = capacity is None or capacity == float("inf")
    if unbounded:
        slots = unbounded_pool_slots(workload, max_running, cache_outputs)
    else:
        slots = int(capacity)
        if slots < 1:
            raise ValueError(f"capacity must be >= 1 token, got {capacity}")
    warmup_s = warm_up()
    n_req = len(workload)
    longest = int((workload.input_lengths + workload.output_lengths).max()) if n_req else 1
    alloc = TokenToKVPoolAllocator(slots)
    req_pool = ReqToTokenPool(max_running, max(longest, 1))
    factory = cache_factory or default_cache_factory
    cache = factory(page_size, policy, alloc, req_pool)
    table = req_pool.req_to_token
    use_req = driver == "request"

    # hot-loop locals
    pc = time.perf_counter_ns
    match = cache.match_prefix
    lock = cache.inc_lock_ref
    unlock = cache.dec_lock_ref
    evict = cache.evict
    insert = cache.insert
    finished = cache.cache_finished_req if use_req else None
    total_size = cache.total_size
    a_alloc, a_free, a_avail = alloc.alloc, alloc.free, alloc.available_size
    B = workload.block_size
    block_offsets = np.arange(B, dtype=np.int64)
    ptr = workload.hash_ptr.tolist()
    hash_ids = workload.hash_ids
    nin = workload.input_lengths.tolist()
    nout = workload.output_lengths.tolist()
    fresh = workload.token_base
    lat_match, lat_lock, lat_evict, lat_finish = [], [], [], []
    hits = np.full(n_req, -1, dtype=np.int64) if record_hits else None
    running = collections.deque()
    hit_tokens = evicted = evict_calls = rejected = waits = peak = 0

    def complete(r):
        # r = (req_or_None, row, tokens, node, hit, n, o)
        nonlocal peak
        req, row, toks, node, hit, n, o = r
        t = pc()
        if use_req:
            finished(req)
        else:
            committed = n + o if cache_outputs else n
            aligned = committed - committed % page_size
            vals = table[row, :n + o].copy()
            if aligned > 0:
                insert(InsertParams(key=RadixKey(toks[:aligned]), value=vals[:aligned],
                                    prev_prefix_len=hit))
                pa = n - n % page_size
                if cache_outputs and 0 < pa < aligned:
                    # what checkpoint does on a Full-only tree: the prompt again, priority + 1
                    insert(InsertParams(key=RadixKey(toks[:pa]), value=vals[:pa],
                                        prev_prefix_len=pa, inserted_len=pa, priority=1))
            unlock(node)
            if aligned < n + o:
                a_free(vals[aligned:])
            req_pool.free(row)
        lat_finish.append(pc() - t)
        size = total_size()[0]
        if size > peak:
            peak = size

    bar = _progress_bar(n_req, progress)
    step = 0
    t_start, c_start = time.perf_counter(), time.process_time()
    for i in range(n_req):
        n, o = nin[i], nout[i]
        toks = (hash_ids[ptr[i]:ptr[i + 1], None] * B + block_offsets).reshape(-1)[:n]
        if cache_outputs and o:
            toks = np.concatenate((toks, np.arange(fresh, fresh + o, dtype=np.int64)))
            fresh += o
        while len(running) >= max_running:
            complete(running.popleft())
        t0 = pc()
        m = match(MatchPrefixParams(key=RadixKey(toks[:n])))
        t1 = pc()
        node = m.last_device_node
        lock(node)
        lat_lock.append(pc() - t1)
        lat_match.append(t1 - t0)
        hit = m.device_prefix_len
        need = n - hit + o
        slots_i = a_alloc(need)
        while slots_i is None:
            t = pc()
            evicted += evict(EvictParams(num_tokens=need - a_avail())).num_tokens_evicted
            lat_evict.append(pc() - t)
            evict_calls += 1
            slots_i = a_alloc(need)
            if slots_i is None:
                if not running:
                    break
                complete(running.popleft())
                waits += 1
                slots_i = a_alloc(need)
        if slots_i is None:
            unlock(node)
            rejected += 1
        else:
            hit_tokens += hit
            if hits is not None:
                hits[i] = hit
            row = req_pool.alloc(1)[0]
            table[row, :hit] = m.device_indices
            table[row, hit:n + o] = slots_i
            req = None
            if use_req:
                committed = n + o if cache_outputs else n
                req = Req(origin_input_ids=toks[:n], fill_ids=toks, req_pool_idx=row,
                          prefix_indices=m.device_indices, last_node=node,
                          kv_committed_len=committed, kv_allocated_len=n + o)
            running.append((req, row, toks, node, hit, n, o))
        step += 1
        if bar is not None and step == 64:
            bar.update(step)
            step = 0
    while running:
        complete(running.popleft())
    wall = time.perf_counter() - t_start
    cpu = time.process_time() - c_start
    if bar is not None:
        bar.update(step)
        bar.close()

    ev, prot = cache.evictable_size(), cache.protected_size()
    conserved = (a_avail() + ev + prot == slots) and prot == 0
    if check:
        if not conserved:
            raise AssertionError(f"KV conservation broken after the replay: available {a_avail()} "
                                 f"+ evictable {ev} + protected {prot} != pool {slots}")
        sanity = getattr(cache, "sanity_check", None)
        if sanity is not None:
            sanity()
    prompt_tokens = workload.prompt_tokens
    return ReplayResult(
        workload=workload.name, capacity="inf" if unbounded else slots, pool_slots=slots,
        page_size=page_size, max_running=max_running, policy=policy,
        cache_outputs=bool(cache_outputs), requests=n_req, served_requests=n_req - rejected,
        rejected_requests=rejected, prompt_tokens=prompt_tokens,
        output_tokens=workload.output_tokens, hit_tokens=int(hit_tokens),
        token_hit_ratio=(hit_tokens / prompt_tokens) if prompt_tokens else 0.0,
        evicted_tokens=int(evicted), evict_calls=evict_calls, waits=waits,
        peak_tree_tokens=int(peak), final_tree_tokens=int(total_size()[0]),
        kv_conserved=bool(conserved), wall_s=wall, cpu_s=cpu,
        requests_per_s=n_req / wall if wall > 0 else float("inf"),
        prompt_tokens_per_s=prompt_tokens / wall if wall > 0 else float("inf"),
        warmup_s=round(warmup_s, 3),
        latency_us={"match_prefix": _latency(lat_match), "inc_lock_ref": _latency(lat_lock),
                    "evict": _latency(lat_evict), "cache_finished_req": _latency(lat_finish)},
        hits=hits,
    )
