"""Long run: millions of mixed public-API operations in a fixed KV pool.

A scheduler-shaped churn (``Churn``) drives one ``UnifiedRadixCache`` with a
``TokenToKVPoolAllocator`` of ``--pool`` slots and a ``ReqToTokenPool``:
requests are admitted (match_prefix + inc_lock_ref + alloc, evicting when
short), decode (alloc), are checkpointed (cache_unfinished_req) and finished
(cache_finished_req, 10 % aborted with is_insert=False); in between come bare
matches, extra locks held and released, direct inserts, evict, evict_for_alloc,
step-wise eviction rounds and stale-handle probes. Prompts grow from shared
system prompts and earlier conversations; 5 % of requests carry a per-session
``cache_salt`` (new sessions keep appearing: namespace churn), 5 % a LoRA
``extra_key``. Every public call counts as one operation.

Every ``--report-every`` operations it prints peak RSS (``ru_maxrss``), current
RSS (``/proc/self/statm``), ops/s, and every capacity that could grow: node
table rows (and the heap, one entry per row), child-table rows, key/value pool
rows, the ``_out`` scratch, and the namespace id map (the only map the cache
keeps: NodeIds are computed from slot and generation, there is no id map). It
also checks KV conservation (available + evictable + protected + KV held by
running requests == pool) and ``sanity_check()``. After the warm-up
(``--warmup`` operations) the array capacities must not change any more and the
namespace map must stay under its bound; the script exits 1 if they do.

    python benchmarks/long_run.py                      # 10M ops, 200k-token pool
    python benchmarks/long_run.py --ops 1000000 --json-out long_run.json
"""

import argparse
import collections
import json
import os
import resource
import sys
import time

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from flatradix import (  # noqa: E402
    InsertParams, MatchPrefixParams, NodeAccessError, RadixKey, Req, ReqToTokenPool,
    TokenToKVPoolAllocator, UnifiedRadixCache,
)
from flatradix.kernels import layout as L  # noqa: E402

VOCAB = 50_000
_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_now_bytes():
    """Current resident set size, from ``/proc/self/statm`` (resident pages)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def rss_peak_bytes():
    """Peak resident set size of this process (``ru_maxrss`` is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def capacities(cache):
    """Every capacity of the cache that could grow (rows / entries)."""
    return {
        "node_rows": int(cache._engine.st.nodes.shape[0]),
        "heap_rows": int(cache._engine.st.heap.shape[0]),
        "ctab_rows": int(cache._engine.st.ctab.shape[0]),
        "pool_rows": int(cache._engine.st.pool.shape[0]),
        "out_len": int(cache._engine.out.shape[0]),
    }


def ns_map_bound(cache):
    """The namespace map never exceeds its GC threshold ``live + max(1024, live,
    slots / 4)`` (live namespaces <= live nodes <= node rows); with the node
    table fixed that is a constant."""
    rows = int(cache._engine.st.nodes.shape[0])
    return 2 * rows + 1024 + rows // 4


class Churn:
    """A seeded, single-threaded scheduler driving the public API.

    ``step()`` runs one action; ``ops`` counts the public calls made so far.
    ``conserve()`` asserts KV conservation; ``running`` holds the live requests.
    """

    def __init__(self, pool=200_000, page_size=4, seed=0, max_running=32, max_ctx=2048,
                 policy="lru"):
        self.pool = pool
        self.page_size = page_size
        self.max_running = max_running
        self.max_ctx = max_ctx
        self.alloc = TokenToKVPoolAllocator(pool)
        self.rtp = ReqToTokenPool(max_running + 1, max_ctx)
        self.cache = UnifiedRadixCache(page_size=page_size, eviction_policy=policy,
                                       token_to_kv_pool_allocator=self.alloc,
                                       req_to_token_pool=self.rtp)
        self.rng = np.random.default_rng(seed)
        rng = self.rng
        self.systems = [rng.integers(0, VOCAB, size=int(rng.integers(32, 1024)))
                        for _ in range(32)]
        self.histories = []          # (tokens, namespace kwargs) of finished requests
        self.running = []
        self.held = []               # extra locks: node ids
        self.known = collections.deque(maxlen=4096)  # node ids seen, many stale by now
        self.session = 0
        self.next_tok = VOCAB
        self.ops = 0
        self.counts = collections.Counter()

    # ----------------------------------------------------------------- helpers
    def _namespace(self):
        r = self.rng.random()
        if r < 0.90:
            return {}
        if r < 0.95:
            return {"extra_key": f"lora{int(self.rng.integers(4))}"}
        if self.rng.random() < 0.3:
            self.session += 1
        return {"cache_salt": f"session{self.session}"}

    def _prompt(self):
        rng = self.rng
        if self.histories and rng.random() < 0.5:
            base, ns = self.histories[int(rng.integers(len(self.histories)))]
        else:
            base, ns = self.systems[int(rng.integers(len(self.systems)))], self._namespace()
        tail = rng.integers(0, VOCAB, size=int(rng.integers(1, 128)))
        return np.concatenate([base, tail])[: self.max_ctx - 128], ns

    def _alloc(self, n):
        slots = self.alloc.alloc(n)
        self.ops += 1
        if slots is None:
            self.cache.evict_for_alloc(n)
            slots = self.alloc.alloc(n)
            self.ops += 2
            self.counts["evict_for_alloc"] += 1
        return slots

    def owned(self, req):
        protected = req.cache_protected_len
        if protected is None:
            protected = len(req.prefix_indices)
        return req.kv_committed_len - protected

    def conserve(self):
        held = sum(self.owned(r) for r in self.running)
        c = self.cache
        total = self.alloc.available_size() + c.evictable_size() + c.protected_size() + held
        assert total == self.pool, f"KV conservation: {total} != pool {self.pool}"
        assert c.evictable_size() + c.protected_size() == c.total_size()[0]

    # ----------------------------------------------------------------- actions
    def admit(self):
        if len(self.running) >= self.max_running:
            return self.finish()
        toks, ns = self._prompt()
        c = self.cache
        m = c.match_prefix(MatchPrefixParams(key=RadixKey(toks, **ns)))
        c.inc_lock_ref(m.last_device_node)
        self.ops += 2
        plen = m.device_prefix_len
        slots = self._alloc(len(toks) - plen)
        rows = self.rtp.alloc(1) if slots is not None else None
        if rows is None:
            c.dec_lock_ref(m.last_device_node)
            self.ops += 1
            if slots is not None:
                self.alloc.free(slots)
                self.ops += 1
            self.counts["admit_refused"] += 1
            return
        row = rows[0]
        self.rtp.write((row, slice(0, plen)), m.device_indices)
        self.rtp.write((row, slice(plen, len(toks))), slots)
        self.running.append(Req(origin_input_ids=toks, output_ids=[], fill_ids=toks,
                                req_pool_idx=row, prefix_indices=m.device_indices,
                                last_node=m.last_device_node, kv_committed_len=len(toks),
                                kv_allocated_len=len(toks), **ns))
        self.known.append(m.last_device_node)
        self.counts["admit"] += 1

    def decode(self):
        if not self.running:
            return self.admit()
        req = self.running[int(self.rng.integers(len(self.running)))]
        n = int(self.rng.integers(1, 33))
        have = req.kv_committed_len
        if have + n > self.max_ctx:
            return self.finish(req)
        slots = self._alloc(n)
        if slots is None:
            self.counts["decode_refused"] += 1
            return
        self.rtp.write((req.req_pool_idx, slice(have, have + n)), slots)
        new = np.arange(self.next_tok, self.next_tok + n, dtype=np.int64)
        self.next_tok += n
        req.output_ids.extend(new.tolist())
        req.fill_ids = np.concatenate([req.fill_ids, new])
        req.kv_committed_len = req.kv_allocated_len = have + n
        self.counts["decode"] += 1

    def checkpoint(self):
        if not self.running:
            return self.admit()
        req = self.running[int(self.rng.integers(len(self.running)))]
        self.cache.cache_unfinished_req(req)
        self.ops += 1
        self.known.append(req.last_node)
        self.counts["checkpoint"] += 1

    def finish(self, req=None):
        if not self.running:
            return self.admit()
        if req is None:
            req = self.running[int(self.rng.integers(len(self.running)))]
        # by identity: Req is a dataclass whose == compares numpy arrays
        del self.running[next(i for i, r in enumerate(self.running) if r is req)]
        insert = self.rng.random() < 0.9
        self.cache.cache_finished_req(req, is_insert=insert)
        self.ops += 1
        if insert:
            ns = {k: getattr(req, k) for k in ("extra_key", "cache_salt") if getattr(req, k)}
            item = (np.asarray(req.fill_ids[: self.max_ctx - 256]), ns)
            if len(self.histories) < 256:
                self.histories.append(item)
            else:
                self.histories[int(self.rng.integers(256))] = item
        self.counts["finish" if insert else "abort"] += 1

    def match(self):
        toks, ns = self._prompt()
        m = self.cache.match_prefix(MatchPrefixParams(key=RadixKey(toks, **ns)))
        self.ops += 1
        self.known.append(m.last_device_node)
        if len(self.held) < 8 and self.rng.random() < 0.3:
            self.cache.inc_lock_ref(m.last_device_node)
            self.ops += 1
            self.held.append(m.last_device_node)
        self.counts["match"] += 1

    def unlock(self):
        if not self.held:
            return self.match()
        node = self.held.pop(int(self.rng.integers(len(self.held))))
        self.cache.dec_lock_ref(node)
        self.ops += 1
        self.counts["unlock"] += 1

    def insert(self):
        toks, ns = self._prompt()
        n = len(toks) - len(toks) % self.page_size
        slots = self._alloc(n)
        if slots is None:
            self.counts["insert_refused"] += 1
            return
        r = self.cache.insert(InsertParams(key=RadixKey(toks[:n], **ns), value=slots))
        self.ops += 1
        self.known.append(r.last_device_node)
        self.counts["insert"] += 1

    def evict(self):
        self.cache.evict(int(self.rng.integers(0, 1000)))
        self.ops += 1
        self.counts["evict"] += 1

    def evict_steps(self):
        c = self.cache
        c.evict_device_start(num_tokens=int(self.rng.integers(1, 500)))
        self.ops += 1
        while True:
            step = c.evict_device_next_node()
            self.ops += 1
            if step.node_id is None:
                break
            self.alloc.free(step.freed_indices)  # the controller frees a step's slots
            self.ops += 1
        c.evict_device_end()
        self.ops += 1
        self.counts["evict_steps"] += 1

    def stale_probe(self):
        if not self.known:
            return self.match()
        node = self.known[int(self.rng.integers(len(self.known)))]
        try:
            self.cache.inc_lock_ref(node)
        except NodeAccessError:
            self.counts["stale"] += 1
        else:
            self.cache.dec_lock_ref(node)
            self.ops += 1
            self.counts["probe_live"] += 1
        self.ops += 1

    ACTIONS = (("admit", 0.22), ("decode", 0.30), ("checkpoint", 0.06), ("finish", 0.16),
               ("match", 0.10), ("unlock", 0.04), ("insert", 0.06), ("evict", 0.01),
               ("evict_steps", 0.01), ("stale_probe", 0.04))

    def step(self):
        if not hasattr(self, "_cum"):
            names, p = zip(*self.ACTIONS)
            self._fns = [getattr(self, n) for n in names]
            self._cum = np.cumsum(p) / sum(p)
        i = int(np.searchsorted(self._cum, self.rng.random(), side="right"))
        self._fns[min(i, len(self._fns) - 1)]()

    def drain(self):
        """Finish every running request and release every extra lock."""
        while self.running:
            self.finish(self.running[-1])
        while self.held:
            self.cache.dec_lock_ref(self.held.pop())
            self.ops += 1

    def max_generation(self):
        hwm = int(self.cache._engine.meta[L.M_HWM])
        return int(self.cache._engine.st.nodes[:hwm, L.GEN].max())


def report_line(ch, t0, extra=""):
    c = ch.cache
    wall = time.perf_counter() - t0
    cap = capacities(c)
    return {
        "ops": ch.ops, "wall_s": round(wall, 1), "ops_per_s": round(ch.ops / wall),
        "peak_rss_mib": round(rss_peak_bytes() / 2**20, 1),
        "rss_mib": round(rss_now_bytes() / 2**20, 1),
        **cap,
        "ns_map": len(c._engine.ns.ids), "ns_bound": ns_map_bound(c),
        "slots_used": int(c._engine.meta[L.M_HWM]), "live_nodes": c.node_count(),
        "cached_tokens": c.total_size()[0], "available": ch.alloc.available_size(),
        "running": len(ch.running),
        "max_gen": ch.max_generation(), "retired": int(c._engine.meta[L.M_RETIRED]),
    }


def run(ops, pool, page_size, seed, report_every, warmup, progress=True, out=sys.stdout,
        max_running=32, max_ctx=2048):
    """Run ``ops`` operations; returns ``(churn, reports, final, failures)``."""
    ch = Churn(pool=pool, page_size=page_size, seed=seed, max_running=max_running,
               max_ctx=max_ctx)
    t0 = time.perf_counter()
    reports = []
    bar = None
    if progress:
        try:
            from tqdm import tqdm

            bar = tqdm(total=ops, unit="op", unit_scale=True, file=sys.stderr, mininterval=5)
        except ImportError:
            bar = None
    next_report = report_every
    warm = None
    failures = []
    last = 0
    while ch.ops < ops:
        ch.step()
        if bar is not None and ch.ops - last >= 10_000:
            bar.update(ch.ops - last)
            last = ch.ops
        if ch.ops >= next_report:
            next_report += report_every
            ch.conserve()
            ch.cache.sanity_check()
            rep = report_line(ch, t0)
            reports.append(rep)
            print(json.dumps(rep), file=out, flush=True)
            if warm is None and ch.ops >= warmup:
                warm = rep
            elif warm is not None:
                for k in capacities(ch.cache):
                    if rep[k] != warm[k]:
                        failures.append(f"{k} grew after warm-up: {warm[k]} at {warm['ops']:,} "
                                        f"ops -> {rep[k]} at {rep['ops']:,} ops")
                if rep["ns_map"] > warm["ns_bound"]:
                    failures.append(f"namespace map {rep['ns_map']} above its bound "
                                    f"{warm['ns_bound']} at {rep['ops']:,} ops")
    if bar is not None:
        bar.close()
    ch.drain()
    ch.conserve()
    c = ch.cache
    assert c.protected_size() == 0
    c.sanity_check()
    final = report_line(ch, t0)
    return ch, reports, final, failures


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", type=int, default=10_000_000, help="public API calls (10M)")
    ap.add_argument("--pool", type=int, default=200_000, help="KV pool size in tokens (200k)")
    ap.add_argument("--page-size", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--report-every", type=int, default=1_000_000)
    ap.add_argument("--warmup", type=int, default=1_000_000,
                    help="ops after which capacities must stay fixed (1M)")
    ap.add_argument("--json-out", help="write every report and the final state here")
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args(argv)
    print(f"long run: {a.ops:,} ops, pool {a.pool:,} tokens, page {a.page_size}, seed {a.seed}",
          flush=True)
    ch, reports, final, failures = run(a.ops, a.pool, a.page_size, a.seed, a.report_every,
                                       a.warmup, progress=not a.no_progress)
    print(json.dumps({"final": final, "counts": dict(ch.counts)}), flush=True)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"args": vars(a), "reports": reports, "final": final,
                       "counts": dict(ch.counts), "failures": failures}, f, indent=1)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures), flush=True)
        return 1
    print("ok: capacities fixed after warm-up, KV conserved, sanity_check passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
