#!/usr/bin/env python
"""The trace replay (``flatradix replay``) through flatradix and through SGLang 0.5.23.

    python benchmarks/replay_peer.py                  # re-runs itself in the oracle venv if present
    python benchmarks/replay_peer.py --limit 2000     # first 2,000 requests (quick)
    python benchmarks/replay_peer.py --engines flatradix-req sglang-rust sglang-python --limit 500
    python benchmarks/replay_peer.py --prompt array numpy   # only these prompt containers
    options: --trace FILE --capacity 2M --page-size 16 --max-running 1 --policy lru
             --rounds 1 --driver request|core --json-out FILE --sglang-python PY

Workload: the Mooncake conversation trace at ``../shared/traces/`` (loaded with
``flatradix.replay.load_mooncake``; each hash block expands into 512 distinct
token ids), page 16, a 2M-token KV pool, one request in flight
(``--max-running``), LRU. Missing trace: the script says so and exits 0.

Engines (``--engines``; default ``flatradix-req sglang-rust``):

* ``flatradix-req``: flatradix driven by :func:`replay_flatradix_request`, the
  same loop as SGLang's below, call for call, on flatradix's public objects
  (``UnifiedRadixCache``, ``Req``, ``ReqToTokenPool``,
  ``TokenToKVPoolAllocator``, ``release_kv_cache``): the path a scheduler
  written against SGLang's API takes with flatradix plugged in. One run per
  prompt container (``--prompt``: Python ``list``, ``array('q')`` -- what
  SGLang's ``Req`` holds --, ``numpy``, ``torch``); SGLang always gets
  ``array('q')``. Building each prompt (the trace's hash blocks expanded
  into token ids, then the container: the tokenizer's side) is timed apart
  and left out of this engine's and SGLang's wall (the ``flatradix`` engine
  below times its loop whole, expansion included).
* ``flatradix``: ``flatradix.replay.replay`` itself (the scheduler emulation of
  ``flatradix/replay/scheduler.py``: JIT warm-up untimed, the loop timed).
* ``sglang-rust`` / ``sglang-python`` / ``sglang-flatradix``: SGLang 0.5.23's
  ``UnifiedRadixCache`` (Full component) with its Rust or Python tree core, or
  with flatradix's TreeCore plug-in (``flatradix/sglang``), driven by
  :func:`replay_sglang`, a line-for-line port of the replay's ``Scheduler`` loop onto
  SGLang's public API and objects:

  - admit: the ``Req`` is built first (the scheduler holds it while it
    matches), ``match_prefix(MatchPrefixParams(RadixKey(array('q')), req=req))``
    on the whole prompt, ``cache.lock(node)`` (``inc_lock_ref`` wrapped in SGLang's
    ``TreeLock``), ``allocator.alloc(uncached tail + outputs)``; short of KV:
    ``cache.evict(EvictParams(shortfall))`` and retry, then complete the oldest
    running request and retry, then reject (``cache.unlock``);
  - the request's row of SGLang's ``ReqToTokenPool`` gets the matched prefix
    (``path_device_indices``, as the scheduler reads it) and the new slots;
  - complete, ``--driver request`` (default): SGLang's real request path, a
    ``schedule_batch.Req`` (prompt as ``origin_input_ids``, ``o`` output ids,
    ``kv_committed_len = kv_allocated_len = prompt + outputs``,
    ``FINISH_LENGTH``) released by ``common.release_kv_cache(req, cache,
    checkpoint=True)`` (0.5.23's ``cache_finished_req``). The replay caches
    prompts only; SGLang's switch for exactly that is the serving arg
    ``strip_thinking_cache`` (published here with ``ServerArgs``; each request
    has ``reasoning_tokens = o``): ``owned_kv_len`` is the prompt, the tree
    keeps it page-aligned down, and the prompt's unaligned tail and the output
    slots are freed as over-allocated KV. Same effect as flatradix's
    ``cache_finished_req`` with ``kv_committed_len = prompt``,
    ``kv_allocated_len = prompt + outputs``;
  - ``--driver core``: ``insert`` + ``unlock`` + ``allocator.free`` instead
    (the replay's ``"core"`` driver; flatradix runs with it too).

  The allocator is SGLang's token-granular ``TokenToKVPoolAllocator`` (its
  ``free`` is a ``torch.cat`` onto the free list), as the flatradix replay uses
  flatradix's token-granular one: the emulation allocates ``tail + outputs``
  slots per request, which a page allocator cannot express without changing
  what is evicted, so both engines see the same KV accounting.

Work check: both engines must admit, hit, evict and reject identically: the
per-request hit lengths (-1 = rejected), the totals (hit tokens, evicted
tokens, evict calls, waits, rejections, peak and final tree tokens) and KV
conservation at the end. Any difference is printed and the exit status is 1.

Timing: only the replay loop (trace loading, imports, cache construction,
warm-ups and the prompt containers' construction excluded): wall
(``perf_counter``) and CPU (``process_time``) seconds, requests/s, per-request
admit (match .. request row written) and finish (``release_kv_cache``) latency
p50 / p99 / max in µs, and the Rust core's wall over each engine's, with the
issue-14 targets (>= 5x, p99 <= the Rust core's) marked met / NOT met. Engines run one after the other in
one process; with ``--rounds R`` the order rotates each round and the median is
reported. torch runs single-threaded (``--torch-threads``). ``--free-clock``
also reports the seconds SGLang spends inside its allocator's ``free`` (allocator
work, not tree work; the wrapper adds a call per free). The peak tree size is
read after each completion from ``total_size()`` in flatradix (O(1)) and from
``evictable_size() + protected_size()`` in SGLang (O(1); the Rust core's
``total_size`` walks the tree), so neither engine pays for the bookkeeping.
"""

import argparse
import collections
import datetime
import gc
import json
import os
import platform
import statistics
import sys
import time
from array import array

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if __package__ in (None, ""):
    sys.path.insert(0, HERE)
    try:
        import flatradix  # noqa: F401
    except ImportError:
        sys.path.insert(1, ROOT)
    import engines as E
else:
    from . import engines as E

import numpy as np

TRACE_DEFAULT = os.path.join(os.path.dirname(ROOT), "shared", "traces",
                             "mooncake_conversation_trace.jsonl")
ENGINES = ("flatradix-req", "flatradix", "sglang-rust", "sglang-python", "sglang-flatradix")
TOTALS = ("requests", "served_requests", "rejected_requests", "hit_tokens", "evicted_tokens",
          "evict_calls", "waits", "peak_tree_tokens", "final_tree_tokens", "kv_conserved")


# ------------------------------------------------------------------ flatradix
def replay_flatradix(workload, capacity, page_size, max_running, policy, driver):
    from flatradix.replay import replay

    r = replay(workload, capacity=capacity, page_size=page_size, max_running=max_running,
               policy=policy, driver=driver, record_hits=True)
    out = {k: getattr(r, k) for k in TOTALS}
    out.update(wall_s=r.wall_s, cpu_s=r.cpu_s, hits=r.hits, pool_slots=r.pool_slots,
               core="flatradix")
    return out


# ------------------------------------------------------------------ SGLang
class _SGL:
    """SGLang's pieces, imported once (slow), with the serving args the
    request driver needs (``strip_thinking_cache``) published."""

    _mods = None

    @classmethod
    def get(cls):
        if cls._mods is not None:
            return cls._mods
        E.prepare_sglang_env()
        import torch
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req
        from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.base_prefix_cache import (
            EvictParams, InsertParams, MatchPrefixParams,
        )
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.common import release_kv_cache
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.mem_cache.radix_cache import RadixKey
        from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
        from sglang.srt.runtime_context import get_serving
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

        set_global_server_args_for_scheduler(ServerArgs(model_path="dummy",
                                                        strip_thinking_cache=True))
        if not get_serving().strip_thinking_cache:
            raise RuntimeError("SGLang did not take strip_thinking_cache=True")
        # engines.SGLangEngine would publish plain ServerArgs over ours
        E.SGLangEngine._server_args_set = True
        cls._mods = dict(torch=torch, Req=Req, FINISH_LENGTH=FINISH_LENGTH,
                         TokenToKVPoolAllocator=TokenToKVPoolAllocator, EvictParams=EvictParams,
                         InsertParams=InsertParams, MatchPrefixParams=MatchPrefixParams,
                         CacheInitParams=CacheInitParams, release_kv_cache=release_kv_cache,
                         ReqToTokenPool=ReqToTokenPool, RadixKey=RadixKey,
                         FULL=ComponentType.FULL, UnifiedRadixCache=UnifiedRadixCache,
                         SamplingParams=SamplingParams)
        return cls._mods


def replay_sglang(workload, capacity, page_size, max_running, policy, driver, backend,
                  free_clock=False, timings=False):
    """``flatradix.replay.replay``'s loop on SGLang's ``UnifiedRadixCache``
    (module docstring). Returns the same figures as :func:`replay_flatradix`;
    with ``free_clock``, also ``free_s``: seconds inside the allocator's ``free``;
    with ``timings``, per-request admit / finish times (ns) as
    :func:`replay_flatradix_request`."""
    S = _SGL.get()
    torch = S["torch"]
    RadixKey, MatchPrefixParams = S["RadixKey"], S["MatchPrefixParams"]
    EvictParams, InsertParams = S["EvictParams"], S["InsertParams"]
    Req, FINISH_LENGTH, release_kv_cache = S["Req"], S["FINISH_LENGTH"], S["release_kv_cache"]
    from flatradix.replay import unbounded_pool_slots

    if capacity is None:
        slots = unbounded_pool_slots(workload, max_running)
    else:
        slots = int(capacity)
    n_req = len(workload)
    longest = int((workload.input_lengths + workload.output_lengths).max()) if n_req else 1
    alloc = S["TokenToKVPoolAllocator"](slots, torch.float16, "cpu", None, False)
    free_clock = E.FreeClock(alloc) if free_clock else None
    rtp = S["ReqToTokenPool"](size=max_running, max_context_len=max(longest, 1), device="cpu",
                              enable_memory_saver=False)
    if backend == "flatradix":
        E.load_sglang_plugins()
    cache = S["UnifiedRadixCache"](S["CacheInitParams"](
        disable=False, req_to_token_pool=rtp, token_to_kv_pool_allocator=alloc,
        page_size=page_size, eviction_policy=policy, tree_components=(S["FULL"],),
        tree_core_backend=backend))
    core = type(cache.tree_core).__name__
    if core not in E.TREE_CORES[backend]:  # a missing Rust core falls back to Python silently
        raise RuntimeError(f"asked for SGLang's {backend} tree core, got {core}")
    sampling = S["SamplingParams"](temperature=0, max_new_tokens=1 << 30)
    use_req = driver == "request"
    table = rtp.req_to_token
    int32, int64 = torch.int32, torch.int64
    free_rows = list(range(max_running - 1, -1, -1))   # core driver: rows by hand

    # hot-loop locals (as the replay's Scheduler)
    match, lock, unlock = cache.match_prefix, cache.lock, cache.unlock
    evict, insert, path = cache.evict, cache.insert, cache.path_device_indices
    # Peak tree size: the replay reads total_size() after each completion (O(1) in
    # flatradix); the Rust core's total_size walks the tree (~100 us at 2M tokens), so
    # SGLang gets the O(1) equivalent for a Full-only tree, evictable + protected.
    evictable_size, protected_size = cache.evictable_size, cache.protected_size
    a_alloc, a_free, a_avail = alloc.alloc, alloc.free, alloc.available_size
    B = workload.block_size
    block_offsets = np.arange(B, dtype=np.int64)
    ptr = workload.hash_ptr.tolist()
    hash_ids = workload.hash_ids
    nin = workload.input_lengths.tolist()
    nout = workload.output_lengths.tolist()
    hits = np.full(n_req, -1, dtype=np.int64)
    running = collections.deque()
    hit_tokens = evicted = evict_calls = rejected = waits = peak = 0
    t_admit = np.zeros(n_req, dtype=np.int64)
    t_finish = np.zeros(n_req, dtype=np.int64)
    clock = time.perf_counter_ns
    build_ns = 0

    def complete(r):
        # r = (req, row, ids, lk, hit, n, o, i)
        nonlocal peak
        req, row, ids, lk, hit, n, o, i = r
        t0 = clock()
        if use_req:
            release_kv_cache(req, cache, checkpoint=True)
        else:
            aligned = n - n % page_size
            vals = table[row, :n + o].to(int64)
            if aligned > 0:
                insert(InsertParams(key=RadixKey(ids[:aligned]), value=vals[:aligned],
                                    prev_prefix_len=hit))
            unlock(lk)
            if aligned < n + o:
                a_free(vals[aligned:])
            free_rows.append(row)
        t_finish[i] = clock() - t0
        size = evictable_size() + protected_size()
        if size > peak:
            peak = size

    t_start, c_start = time.perf_counter(), time.process_time()
    for i in range(n_req):
        n, o = nin[i], nout[i]
        tb = clock()  # the trace's token ids, then the container: the tokenizer's side
        toks = (hash_ids[ptr[i]:ptr[i + 1], None] * B + block_offsets).reshape(-1)[:n]
        ids = array("q", toks.tobytes())
        build_ns += clock() - tb
        while len(running) >= max_running:
            complete(running.popleft())
        t0 = clock()
        # the scheduler holds the request while it matches (MatchPrefixParams.req)
        req = (Req(rid=str(i), origin_input_text="", origin_input_ids=ids,
                   sampling_params=sampling) if use_req else None)
        m = match(MatchPrefixParams(key=RadixKey(ids), req=req))
        node = m.last_device_node
        lk = lock(node)
        hit = m.device_prefix_len
        need = n - hit + o
        slots_i = a_alloc(need)
        while slots_i is None:
            evicted += evict(EvictParams(num_tokens=need - a_avail())).num_tokens_evicted
            evict_calls += 1
            slots_i = a_alloc(need)
            if slots_i is None:
                if not running:
                    break
                complete(running.popleft())
                waits += 1
                slots_i = a_alloc(need)
        if slots_i is None:
            unlock(lk)
            rejected += 1
            continue
        hit_tokens += hit
        hits[i] = hit
        if use_req:
            rtp.alloc([req])
            row = req.kv.req_pool_idx
        else:
            row = free_rows.pop()
        if hit:
            table[row, :hit] = path(node)[:hit].to(int32)
        table[row, hit:n + o] = slots_i.to(int32)
        if use_req:
            req.last_node = node
            req.lock = lk
            req.prefix_len = hit
            req.kv.cache_protected_len = hit
            if o:
                req.output_ids = array("q", bytes(8 * o))
                req.reasoning_tokens = o       # strip_thinking_cache: outputs are not cached
            req.kv.kv_committed_len = n + o
            req.kv.kv_allocated_len = n + o
            req.finished_reason = FINISH_LENGTH(length=o)
        t_admit[i] = clock() - t0
        running.append((req, row, ids, lk, hit, n, o, i))
    while running:
        complete(running.popleft())
    # the prompts' construction (the tokenizer's side) is not the engine's
    wall = time.perf_counter() - t_start - build_ns / 1e9
    cpu = time.process_time() - c_start - build_ns / 1e9

    ev, prot = cache.evictable_size(), cache.protected_size()
    conserved = (a_avail() + ev + prot == slots) and prot == 0
    if cache.total_size()[0] != ev + prot:
        raise AssertionError(f"total_size {cache.total_size()} != evictable {ev} + protected {prot}")
    out = dict(requests=n_req, served_requests=n_req - rejected, rejected_requests=rejected,
               hit_tokens=int(hit_tokens), evicted_tokens=int(evicted), evict_calls=evict_calls,
               waits=waits, peak_tree_tokens=int(peak), final_tree_tokens=int(cache.total_size()[0]),
               kv_conserved=bool(conserved), wall_s=wall, cpu_s=cpu, build_s=build_ns / 1e9,
               hits=hits,
               pool_slots=slots, core=core, free_s=free_clock.seconds if free_clock else None)
    if timings:
        served = hits >= 0
        out.update(t_admit=t_admit[served], t_finish=t_finish[served])
    return out


CONTAINERS = ("list", "array", "numpy", "torch")


def _container(kind):
    """``toks`` (int64 numpy) -> the prompt container a scheduler would hold."""
    if kind == "list":
        return lambda t: t.tolist()
    if kind == "array":
        return lambda t: array("q", t.tobytes())
    if kind == "numpy":
        return lambda t: t
    if kind == "torch":
        import torch

        return torch.from_numpy
    raise ValueError(f"prompt container {kind!r} not one of {CONTAINERS}")


def replay_flatradix_request(workload, capacity, page_size, max_running, policy, driver,
                             container="array", timings=False):
    """:func:`replay_sglang`'s loop, call for call, on flatradix's public API: the
    path a scheduler written against SGLang's API takes with flatradix plugged in
    (``match_prefix`` on ``RadixKey(prompt)``, ``cache.lock``, the allocator with
    ``evict`` on a shortfall, the request row from ``path_device_indices`` plus
    the new slots, a ``flatradix.Req`` holding the prompt in ``container``,
    ``release_kv_cache(req)`` with ``kv_committed_len = prompt`` -- the same
    caching as SGLang's ``strip_thinking_cache`` -- at the end). ``driver
    "core"``: ``insert`` + ``unlock`` + ``free`` instead, as in replay_sglang.
    With ``timings``: per-request admit and finish times (ns, int64 arrays)."""
    import flatradix as F
    from flatradix.replay import unbounded_pool_slots

    make = _container(container)
    slots = unbounded_pool_slots(workload, max_running) if capacity is None else int(capacity)
    n_req = len(workload)
    longest = int((workload.input_lengths + workload.output_lengths).max()) if n_req else 1
    alloc = F.TokenToKVPoolAllocator(slots)
    rtp = F.ReqToTokenPool(max_running, max(longest, 1))
    cache = F.UnifiedRadixCache(page_size=page_size, eviction_policy=policy,
                                token_to_kv_pool_allocator=alloc, req_to_token_pool=rtp)
    use_req = driver == "request"
    table = rtp.req_to_token
    RadixKey, MatchPrefixParams, EvictParams = F.RadixKey, F.MatchPrefixParams, F.EvictParams
    InsertParams, Req = F.InsertParams, F.Req
    match, lock, unlock = cache.match_prefix, cache.lock, cache.unlock
    evict, insert, path = cache.evict, cache.insert, cache.path_device_indices
    release = cache.release_kv_cache
    evictable_size, protected_size = cache.evictable_size, cache.protected_size
    a_alloc, a_free, a_avail = alloc.alloc, alloc.free, alloc.available_size
    r_alloc = rtp.alloc
    free_rows = list(range(max_running - 1, -1, -1))
    B = workload.block_size
    block_offsets = np.arange(B, dtype=np.int64)
    ptr = workload.hash_ptr.tolist()
    hash_ids = workload.hash_ids
    nin = workload.input_lengths.tolist()
    nout = workload.output_lengths.tolist()
    hits = np.full(n_req, -1, dtype=np.int64)
    t_admit = np.zeros(n_req, dtype=np.int64)
    t_finish = np.zeros(n_req, dtype=np.int64)
    clock = time.perf_counter_ns
    build_ns = 0
    running = collections.deque()
    hit_tokens = evicted = evict_calls = rejected = waits = peak = 0

    def complete(r):
        nonlocal peak
        req, row, ids, lk, hit, n, o, i = r
        t0 = clock()
        if use_req:
            release(req)
        else:
            aligned = n - n % page_size
            vals = table[row, :n + o]
            if aligned > 0:
                insert(InsertParams(key=RadixKey(ids[:aligned]), value=vals[:aligned],
                                    prev_prefix_len=hit))
            unlock(lk)
            if aligned < n + o:
                a_free(vals[aligned:])
            free_rows.append(row)
        t_finish[i] = clock() - t0
        size = evictable_size() + protected_size()
        if size > peak:
            peak = size

    t_start, c_start = time.perf_counter(), time.process_time()
    for i in range(n_req):
        n, o = nin[i], nout[i]
        tb = clock()  # the trace's token ids, then the container: the tokenizer's side
        toks = (hash_ids[ptr[i]:ptr[i + 1], None] * B + block_offsets).reshape(-1)[:n]
        ids = make(toks)
        build_ns += clock() - tb
        while len(running) >= max_running:
            complete(running.popleft())
        t0 = clock()
        # the scheduler holds the request while it matches (MatchPrefixParams.req)
        req = Req(origin_input_ids=ids, rid=str(i)) if use_req else None
        m = match(MatchPrefixParams(key=RadixKey(ids), req=req))
        node = m.last_device_node
        lk = lock(node)
        hit = m.device_prefix_len
        need = n - hit + o
        slots_i = a_alloc(need)
        while slots_i is None:
            evicted += evict(EvictParams(num_tokens=need - a_avail())).num_tokens_evicted
            evict_calls += 1
            slots_i = a_alloc(need)
            if slots_i is None:
                if not running:
                    break
                complete(running.popleft())
                waits += 1
                slots_i = a_alloc(need)
        if slots_i is None:
            unlock(lk)
            rejected += 1
            continue
        hit_tokens += hit
        hits[i] = hit
        if use_req:
            row = req.req_pool_idx = r_alloc(1)[0]
        else:
            row = free_rows.pop()
        if hit:
            table[row, :hit] = path(node)[:hit]
        table[row, hit:n + o] = slots_i
        if use_req:
            req.last_node = node
            req.lock = lk
            req.cache_protected_len = hit
            if o:
                req.output_ids = array("q", bytes(8 * o))
            req.kv_committed_len = n          # outputs not cached (strip_thinking_cache)
            req.kv_allocated_len = n + o
        t_admit[i] = clock() - t0
        running.append((req, row, ids, lk, hit, n, o, i))
    while running:
        complete(running.popleft())
    # the prompts' construction (the tokenizer's side) is not the engine's
    wall = time.perf_counter() - t_start - build_ns / 1e9
    cpu = time.process_time() - c_start - build_ns / 1e9
    ev, prot = cache.evictable_size(), cache.protected_size()
    conserved = (a_avail() + ev + prot == slots) and prot == 0
    out = dict(requests=n_req, served_requests=n_req - rejected, rejected_requests=rejected,
               hit_tokens=int(hit_tokens), evicted_tokens=int(evicted), evict_calls=evict_calls,
               waits=waits, peak_tree_tokens=int(peak), final_tree_tokens=int(cache.total_size()[0]),
               kv_conserved=bool(conserved), wall_s=wall, cpu_s=cpu, build_s=build_ns / 1e9,
               hits=hits, pool_slots=slots,
               core=f"flatradix/{container}")
    if timings:
        served = hits >= 0
        out.update(t_admit=t_admit[served], t_finish=t_finish[served])
    return out


def run_engine(name, workload, args):
    kw = dict(capacity=args.capacity, page_size=args.page_size, max_running=args.max_running,
              policy=args.policy, driver=args.driver)
    if name == "flatradix":
        return replay_flatradix(workload, **kw)
    if name.startswith("flatradix-req/"):
        return replay_flatradix_request(workload, container=name.split("/", 1)[1], timings=True,
                                        **kw)
    return replay_sglang(workload, backend=name.split("-", 1)[1], free_clock=args.free_clock,
                         timings=True, **kw)


def _pct(a, q):
    return float(np.percentile(a, q)) / 1e3 if a is not None and len(a) else float("nan")


# ------------------------------------------------------------------ driver
def compare(ref_name, ref, name, res, workload):
    """Differences between two engines' figures (empty when they did the same work)."""
    diffs = [f"{k}: {ref_name} {ref[k]} vs {name} {res[k]}" for k in TOTALS if ref[k] != res[k]]
    if not res["kv_conserved"]:
        diffs.append(f"{name}: KV conservation broken")
    bad = np.flatnonzero(ref["hits"] != res["hits"])
    if bad.size:
        i = int(bad[0])
        diffs.append(f"per-request hits differ on {bad.size} request(s); first: request {i} "
                     f"(input {int(workload.input_lengths[i])}, output "
                     f"{int(workload.output_lengths[i])}): {ref_name} {int(ref['hits'][i])} vs "
                     f"{name} {int(res['hits'][i])}")
    return diffs


def machine_info():
    info = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
            "python": platform.python_version(), "cpus": os.cpu_count(),
            "loadavg_start": os.getloadavg()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import subprocess

        info["commit"] = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"],
                                        capture_output=True, text=True).stdout.strip() or "?"
    except Exception:
        pass
    return info


def _sglang_importable():
    import importlib.util

    E.prepare_sglang_env()
    try:
        return importlib.util.find_spec("sglang.srt.mem_cache.unified_radix_cache") is not None
    except (ImportError, ValueError):
        return False


def main(argv=None):
    from flatradix.replay import load_mooncake, parse_capacity

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default=TRACE_DEFAULT, help="Mooncake JSONL (default: %(default)s)")
    ap.add_argument("--limit", type=int, default=None, help="replay only the first N requests")
    ap.add_argument("--capacity", type=parse_capacity, default=2_000_000,
                    help="KV pool in tokens (2M, 500k, inf; default 2M)")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--max-running", type=int, default=1)
    ap.add_argument("--policy", default="lru")
    ap.add_argument("--driver", choices=("request", "core"), default="request",
                    help="how a finished request is cached (module docstring)")
    ap.add_argument("--engines", nargs="+", choices=ENGINES, default=None,
                    help="default: flatradix-req sglang-rust (flatradix-req alone without "
                         "SGLang). flatradix-req: flatradix driven call for call as "
                         "SGLang's cores are (one run per --prompt container); flatradix: "
                         "flatradix.replay's own scheduler emulation")
    ap.add_argument("--prompt", nargs="+", choices=CONTAINERS, default=list(CONTAINERS),
                    help="prompt containers for flatradix-req (default: all); SGLang's Req "
                         "holds array('q')")
    ap.add_argument("--rounds", type=int, default=1, help="replays per engine, order rotated")
    ap.add_argument("--free-clock", action="store_true",
                    help="also report the seconds SGLang spends inside its allocator's free "
                         "(a torch.cat onto the free list; adds a wrapper call per free)")
    ap.add_argument("--torch-threads", type=int, default=1)
    ap.add_argument("--sglang-python", default=None,
                    help=f"interpreter with SGLang (default {E.SGLANG_VENV_DEFAULT}/bin/python "
                         "when it exists and this one lacks SGLang)")
    ap.add_argument("--no-reexec", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args(argv)

    wants_sglang = args.engines is None or any(e.startswith("sglang") for e in args.engines)
    if wants_sglang and not args.no_reexec:
        py = args.sglang_python
        if py is None and not _sglang_importable():
            cand = os.path.join(E.SGLANG_VENV_DEFAULT, "bin", "python")
            py = cand if os.path.exists(cand) else None
        if py:
            E.reexec_under(py, __file__, ROOT, ("--no-reexec",))
    have_sglang = _sglang_importable()
    names = args.engines or (["flatradix-req", "sglang-rust"] if have_sglang else ["flatradix-req"])
    names = [x for n in names for x in ([f"flatradix-req/{c}" for c in args.prompt]
                                        if n == "flatradix-req" else [n])]
    if not have_sglang and any(n.startswith("sglang") for n in names):
        sys.exit("SGLang is not importable here: create the oracle venv "
                 "(../shared/tools/setup_sglang_oracle.sh) or pass --sglang-python")
    if not have_sglang and args.engines is None:
        print("SGLang not importable: flatradix only (see --sglang-python)")
    if not os.path.exists(args.trace):
        print(f"trace not found: {args.trace} (skipped)")
        return 0

    t = time.perf_counter()
    w = load_mooncake(args.trace, limit=args.limit)
    load_s = time.perf_counter() - t
    info = machine_info()
    cap = "inf" if args.capacity is None else f"{args.capacity:,}"
    print(f"workload: {os.path.basename(args.trace)}, {len(w):,} requests, {w.prompt_tokens:,} "
          f"prompt tokens (loaded in {load_s:.1f} s); page {args.page_size}, capacity {cap}, "
          f"max_running {args.max_running}, {args.policy}, driver {args.driver}")
    print(f"machine: {info.get('cpu', '?')}, {info['cpus']} CPUs, python {info['python']}, "
          f"flatradix {info.get('commit', '?')}, {info['date']}", flush=True)

    if any(n.startswith("sglang") for n in names):
        t = time.perf_counter()
        _SGL.get()
        torch = _SGL.get()["torch"]
        if args.torch_threads:
            torch.set_num_threads(args.torch_threads)
        print(f"sglang imported in {time.perf_counter() - t:.1f} s", flush=True)
    # Warm-ups (untimed): flatradix's kernels, SGLang's code paths.
    warm = w.head(min(len(w), 50))
    for n in names:
        run_engine(n, warm, argparse.Namespace(**{**vars(args), "capacity": 20_000}))

    runs = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            gc.collect()
            res = run_engine(n, w, args)
            runs[n].append(res)
            print(f"  round {r + 1} {n:14s} [{res['core']}] wall {res['wall_s']:9.2f} s  cpu "
                  f"{res['cpu_s']:9.2f} s  {len(w) / res['wall_s']:>10,.0f} req/s  hit "
                  f"{res['hit_tokens']:,}  evicted {res['evicted_tokens']:,}  rejected "
                  f"{res['rejected_requests']}"
                  + (f"  (+ prompt build {res['build_s']:.2f} s)"
                     if res.get("build_s") is not None else "")
                  + (f"  (allocator free {res['free_s']:.2f} s)" if res.get("free_s") is not None
                     else ""), flush=True)

    ref_name = names[0]
    ref = runs[ref_name][0]
    diffs = []
    for n in names:
        for res in runs[n]:
            diffs += compare(ref_name, ref, n, res, w)
    diffs = list(dict.fromkeys(diffs))

    med = {n: {k: statistics.median(x[k] for x in runs[n]) for k in ("wall_s", "cpu_s")}
           for n in names}
    for n in names:   # per-call latency, pooled over the rounds (us)
        for k in ("t_admit", "t_finish"):
            xs = [x[k] for x in runs[n] if x.get(k) is not None]
            a = np.concatenate(xs) if xs else None
            med[n][k[2:] + "_p50_us"] = _pct(a, 50)
            med[n][k[2:] + "_p99_us"] = _pct(a, 99)
            med[n][k[2:] + "_max_us"] = _pct(a, 100)
    pt = ref["hit_tokens"] / w.prompt_tokens if w.prompt_tokens else 0.0
    print()
    print(f"hit tokens {ref['hit_tokens']:,} ({100 * pt:.2f} %), evicted tokens "
          f"{ref['evicted_tokens']:,} in {ref['evict_calls']:,} evict calls, rejected "
          f"{ref['rejected_requests']}, waits {ref['waits']}, peak tree {ref['peak_tree_tokens']:,}")
    print()
    rust = med.get("sglang-rust")
    print("| engine | wall s | cpu s | requests/s | admit p50 / p99 / max us | finish p50 / p99 / "
          "max us | Rust core / engine (wall) |")
    print("|---|---|---|---|---|---|---|")
    for n in names:
        m = med[n]
        ratio = f"{rust['wall_s'] / m['wall_s']:.2f}x" if rust else "–"
        lat = "".join(f" {m[k + '_p50_us']:,.0f} / {m[k + '_p99_us']:,.0f} / {m[k + '_max_us']:,.0f} |"
                      for k in ("admit", "finish"))
        print(f"| {n} | {m['wall_s']:.2f} | {m['cpu_s']:.2f} | {len(w) / m['wall_s']:,.0f} |"
              f"{lat} {ratio} |")
    if rust:
        print()
        for n in names:
            if not n.startswith("flatradix"):
                continue
            m = med[n]
            ratio = rust["wall_s"] / m["wall_s"]
            p99 = all(m[k] <= rust[k] for k in ("admit_p99_us", "finish_p99_us"))
            print(f"  {n}: [{'met' if ratio >= 5 else 'NOT met'}] >= 5x the Rust core "
                  f"({ratio:.2f}x wall, {rust['cpu_s'] / m['cpu_s']:.2f}x cpu); "
                  f"[{'met' if p99 else 'NOT met'}] p99 admit and finish <= the Rust core's")
    info["loadavg_end"] = os.getloadavg()
    print(f"\nload average at start {info['loadavg_start'][0]:.2f}, at end "
          f"{info['loadavg_end'][0]:.2f} ({info['cpus']} CPUs)")
    if diffs:
        print("\nwork check FAILED: the engines did not do the same work:")
        for d in diffs:
            print("  " + d)
    else:
        print(f"work check: passed ({', '.join(names)}: identical per-request hits, totals and "
              "KV conservation)")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"machine": info, "args": {k: v for k, v in vars(args).items()},
                       "requests": len(w), "prompt_tokens": w.prompt_tokens,
                       "runs": {n: [{k: v for k, v in x.items()
                                     if k not in ("hits", "t_admit", "t_finish")} for x in rs]
                                for n, rs in runs.items()},
                       "median": med, "work_check": not diffs, "diffs": diffs}, f, indent=1)
        print(f"wrote {args.json_out}")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
