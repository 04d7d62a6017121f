#!/usr/bin/env python
"""KV indices on a CUDA device: the request path with no host sync, timed per call.

    python benchmarks/device_check.py                    # CUDA: the check and the figures
    python benchmarks/device_check.py --limit 200        # quicker
    python benchmarks/device_check.py --busy same        # matmuls queued on the cache's own stream
    python benchmarks/device_check.py --smoke            # CPU only: what the test suite runs

**Not yet run on a GPU** (no CUDA machine was available when it was written;
``docs/device_values.md`` says so too). It is meant to run in one prepared shot:
every piece it uses runs in the test suite on CPU tensors and on torch's ``meta``
device (``--smoke``, ``tests/test_device_values.py``).

What it does, on ``--device`` (default ``cuda``):

1. Replays the first ``--limit`` (1,000) requests of the Mooncake conversation
   trace (``../shared/traces/mooncake_conversation_trace.jsonl``, else the packaged
   ``mooncake:sample``: 500 requests) through flatradix's request path, the loop
   of ``benchmarks/replay_peer.py``'s ``flatradix-req`` engine: ``match_prefix``,
   ``lock``, the allocator (``evict`` on a shortfall), the request row written on
   the device, and at the end ``release_kv_cache`` (``--driver request``) or
   ``insert`` + ``unlock`` + ``free`` (``--driver core``; ``both``, the default,
   runs each). The KV allocator and ``req_to_token`` live on the device
   (``flatradix.device.DeviceKVAllocator`` / ``DeviceReqToTokenPool``, as SGLang's).
2. Twice: ``device_values=True`` (the device value arena, issue 29) with
   ``torch.cuda.set_sync_debug_mode("error")`` -- any synchronizing CUDA call
   raises --, and ``device_values=False`` (the host pool: every insert copies its
   indices to the host, every match copies them back) with the debug mode off.
   Runs alternate (``--rounds``).
3. Meanwhile ``--busy side`` (default) queues 4096x4096 matmuls on a side stream
   whenever the previous batch is done, so the GPU is never idle; ``same`` queues
   them on the current stream (a sync then waits for the queue: the worst case);
   ``none``.
4. Prints, per operation (match, insert, evict, release, unlock), the CPU wall
   per call (µs: p50, p99, mean) of each path and their ratio, and checks that
   both paths admitted, hit and evicted identically, that the device checks
   found nothing (``check_device_values()``, after the loop: a sync point) and
   that KV slots are conserved. Exit status 1 on any difference.

``--smoke``: the same loop on the CPU (CPU tensors, ``device_values=True``
against the host pool; then ``meta`` tensors, where any host read raises), the
first 40 requests of ``mooncake:sample``, no timing table: a test of the
script itself.
"""

import argparse
import collections
import json
import pathlib
import sys
import time
from array import array

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

TRACE = REPO.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"
OPS = ("match", "insert", "evict", "release", "unlock")


def load(trace, limit):
    from flatradix.replay import load_mooncake, load_trace

    if trace is None:
        trace = str(TRACE) if TRACE.is_file() else "mooncake:sample"
    if trace.startswith("mooncake:"):
        return trace, load_trace(trace, limit=limit)
    return trace, load_mooncake(trace, limit=limit)


class Busy:
    """Keeps the GPU busy with queued matmuls (``mode``: side / same / none)."""

    def __init__(self, torch, device, mode, batch=64):
        self.mode = mode
        self.torch = torch
        self.batch = batch
        self.queued = 0
        if mode == "none":
            return
        self.a = torch.randn(4096, 4096, device=device, dtype=torch.float16)
        self.b = torch.randn(4096, 4096, device=device, dtype=torch.float16)
        self.stream = torch.cuda.Stream(device) if mode == "side" else None
        self.ev = None

    def poke(self):
        """Queue another batch when the last one is done (``Event.query``: no wait)."""
        if self.mode == "none" or (self.ev is not None and not self.ev.query()):
            return
        torch = self.torch
        if self.stream is not None:
            with torch.cuda.stream(self.stream):
                for _ in range(self.batch):
                    self.a @ self.b
                self.ev = torch.cuda.Event()
                self.ev.record(self.stream)
        else:
            for _ in range(self.batch):
                self.a @ self.b
            self.ev = torch.cuda.Event()
            self.ev.record()
        self.queued += self.batch


def replay(workload, *, device, device_values, driver, page_size=16, capacity=None,
           busy=None, timed=True):
    """The request loop (see the module docstring) on ``device``. Returns
    ``(per-request hits, totals dict, {op: [ns per call]}, the cache)``: the caller
    runs ``cache.check_device_values()`` (a sync point) once syncs are allowed."""
    import torch

    import flatradix as F
    from flatradix.device import DeviceKVAllocator, DeviceReqToTokenPool
    from flatradix.replay import unbounded_pool_slots

    max_running = 1
    slots = unbounded_pool_slots(workload, max_running) if capacity is None else int(capacity)
    n_req = len(workload)
    longest = int((workload.input_lengths + workload.output_lengths).max()) if n_req else 1
    alloc = DeviceKVAllocator(slots, device)
    rtp = DeviceReqToTokenPool(max_running, max(longest, 1), device)
    cache = F.UnifiedRadixCache(page_size=page_size, token_to_kv_pool_allocator=alloc,
                                req_to_token_pool=rtp, device_values=device_values)
    table = rtp.req_to_token
    use_req = driver == "request"
    B = workload.block_size
    offsets = np.arange(B, dtype=np.int64)
    ptr = workload.hash_ptr.tolist()
    hash_ids = workload.hash_ids
    nin, nout = workload.input_lengths.tolist(), workload.output_lengths.tolist()
    hits = np.full(n_req, -1, dtype=np.int64)
    times = collections.defaultdict(list)
    clock = time.perf_counter_ns
    tot = collections.Counter()
    running = collections.deque()
    free_rows = [0]

    def timed_call(op, fn, *a):
        t0 = clock()
        r = fn(*a)
        if timed:
            times[op].append(clock() - t0)
        return r

    def complete(r):
        req, row, ids, lk, hit, n, o = r
        if use_req:
            timed_call("release", cache.release_kv_cache, req)
        else:
            aligned = n - n % page_size
            vals = table[row, :n + o]
            if aligned > 0:
                timed_call("insert", cache.insert, F.InsertParams(
                    key=F.RadixKey(ids[:aligned]), value=vals[:aligned], prev_prefix_len=hit))
            timed_call("unlock", cache.unlock, lk)
            if aligned < n + o:
                alloc.free(vals[aligned:])
            free_rows.append(row)

    for i in range(n_req):
        if busy is not None:
            busy.poke()
        n, o = nin[i], nout[i]
        ids = array("q", (hash_ids[ptr[i]:ptr[i + 1], None] * B + offsets).reshape(-1)[:n].tobytes())
        while running:
            complete(running.popleft())
        req = F.Req(origin_input_ids=ids, rid=str(i)) if use_req else None
        m = timed_call("match", cache.match_prefix, F.MatchPrefixParams(key=F.RadixKey(ids),
                                                                         req=req))
        lk = cache.lock(m.last_device_node)
        hit = m.device_prefix_len
        need = n - hit + o
        got = alloc.alloc(need)
        while got is None:
            res = timed_call("evict", cache.evict, F.EvictParams(
                num_tokens=need - alloc.available_size()))
            tot["evicted"] += res.num_tokens_evicted
            tot["evict_calls"] += 1
            got = alloc.alloc(need)
            if got is None:
                break
        if got is None:
            cache.unlock(lk)
            tot["rejected"] += 1
            continue
        hits[i] = hit
        tot["hit_tokens"] += hit
        if use_req:
            req.req_pool_idx = row = rtp.alloc(1)[0]
        else:
            row = free_rows.pop()
        if hit:
            table[row, :hit] = m.device_indices
        table[row, hit:n + o] = got
        if use_req:
            req.last_node = m.last_device_node
            req.lock = lk
            req.cache_protected_len = hit
            if o:
                req.output_ids = array("q", bytes(8 * o))
            req.kv_committed_len = n
            req.kv_allocated_len = n + o
        running.append((req, row, ids, lk, hit, n, o))
    while running:
        complete(running.popleft())
    tot["tree_tokens"] = cache.evictable_size() + cache.protected_size()
    tot["free_slots"] = alloc.available_size()
    tot["conserved"] = int(tot["tree_tokens"] + tot["free_slots"] == slots)
    return hits, dict(tot), dict(times), cache


def _pct(ns):
    if not ns:
        return None
    a = np.asarray(ns, dtype=np.float64) / 1e3
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
            "mean": float(a.mean()), "calls": int(a.size)}


def smoke(limit=40, capacity=60_000):
    """CPU tensors (device arena vs host pool, identical results) and meta tensors,
    on a pool small enough to evict."""
    _, wl = load("mooncake:sample", limit)
    bad = 0
    for driver in ("request", "core"):
        kw = dict(driver=driver, timed=False, capacity=capacity)
        h_dev, t_dev, _, c_dev = replay(wl, device="cpu", device_values=True, **kw)
        c_dev.check_device_values()   # the sync point: raises on a bad device value
        h_host, t_host, _, _ = replay(wl, device="cpu", device_values=False, **kw)
        h_meta, t_meta, _, _ = replay(wl, device="meta", device_values=True, **kw)
        same = (np.array_equal(h_dev, h_host) and np.array_equal(h_dev, h_meta)
                and t_dev == t_host and t_dev["conserved"] == 1)
        meta_tot = {k: v for k, v in t_meta.items() if k != "conserved"}
        same = same and meta_tot == {k: v for k, v in t_dev.items() if k != "conserved"}
        print(f"smoke {driver}: {len(wl)} requests, hits {int((h_dev > 0).sum())}, "
              f"totals {t_dev}: {'identical' if same else 'DIFFERENT'} on cpu-arena / host pool "
              "/ meta")
        bad += not same
    return bad


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default=None)
    ap.add_argument("--limit", type=int, default=1000)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--driver", choices=("request", "core", "both"), default="both")
    ap.add_argument("--busy", choices=("side", "same", "none"), default="side")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--capacity", type=int, default=2_000_000,
                    help="KV slots (tokens) of the device allocator (default 2M: evictions "
                         "happen within the first 1,000 requests)")
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    if args.smoke:
        return 1 if smoke() else 0
    import torch

    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        print("device_check: no CUDA device here (torch.cuda.is_available() is False); "
              "--smoke runs the CPU check")
        return 2
    name, wl = load(args.trace, args.limit)
    cuda = torch.device(args.device).type == "cuda"
    busy = Busy(torch, args.device, args.busy if cuda else "none")
    drivers = ("request", "core") if args.driver == "both" else (args.driver,)
    print(f"device_check: {len(wl)} requests of {name}, device {args.device}, page "
          f"{args.page_size}, busy GPU: {busy.mode}, torch {torch.__version__}")
    for d in drivers:   # JIT warm-up, untimed
        for dv in (True, False):
            replay(wl.head(20), device=args.device, device_values=dv, driver=d,
                   page_size=args.page_size, timed=False, capacity=args.capacity)
    if cuda:
        torch.cuda.synchronize()
    results = {}
    bad = 0
    for rnd in range(args.rounds):
        for d in drivers:
            order = (True, False) if rnd % 2 == 0 else (False, True)
            for dv in order:
                if cuda:
                    torch.cuda.set_sync_debug_mode("error" if dv else 0)
                try:
                    hits, tot, times, cache = replay(wl, device=args.device, device_values=dv,
                                                     driver=d, page_size=args.page_size,
                                                     busy=busy, capacity=args.capacity)
                finally:
                    if cuda:
                        torch.cuda.set_sync_debug_mode(0)
                cache.check_device_values()   # the sync point, once syncs are allowed
                key = (d, "arena" if dv else "host")
                prev = results.get(key)
                if prev is not None:
                    for op, ns in times.items():
                        prev[2].setdefault(op, []).extend(ns)
                else:
                    results[key] = (hits, tot, times)
    if cuda:
        torch.cuda.synchronize()
    out = {"trace": name, "requests": len(wl), "device": args.device, "busy": busy.mode,
           "torch": torch.__version__, "drivers": {}}
    for d in drivers:
        (ha, ta, xa), (hh, th, xh) = results[(d, "arena")], results[(d, "host")]
        same = np.array_equal(ha, hh) and ta == th and ta["conserved"] == 1
        bad += not same
        print(f"\n--driver {d}: results {'identical' if same else 'DIFFERENT'} "
              f"(hit tokens {ta['hit_tokens']}, evicted {ta.get('evicted', 0)}, conserved "
              f"{bool(ta['conserved'])})")
        print(f"{'op':8} {'arena p50':>10} {'p99':>9} {'mean':>9} | {'host p50':>10} "
              f"{'p99':>9} {'mean':>9} | host/arena (mean)  calls")
        rows = {}
        for op in OPS:
            a, h = _pct(xa.get(op, [])), _pct(xh.get(op, []))
            if a is None and h is None:
                continue
            rows[op] = {"arena": a, "host": h}
            ratio = (h["mean"] / a["mean"]) if a and h and a["mean"] else float("nan")
            print(f"{op:8} {a['p50']:10.1f} {a['p99']:9.1f} {a['mean']:9.1f} | "
                  f"{h['p50']:10.1f} {h['p99']:9.1f} {h['mean']:9.1f} | {ratio:8.2f}x  "
                  f"{a['calls']}")
        out["drivers"][d] = {"identical": bool(same), "ops_us": rows, "totals": ta}
    if args.json_out:
        pathlib.Path(args.json_out).write_text(json.dumps(out, indent=1))
    print("\nno synchronizing CUDA call in the arena runs (set_sync_debug_mode('error') "
          "raised none)" if cuda else "")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
