"""asv: every public cache operation at two tree sizes (100k and 1M cached tokens).

The tree is built in ``setup`` from ``workloads.SequenceStream`` (prefix-sharing
sequences of ~1-2k tokens, page size 1, flatradix's own KV allocator), and the
kernels are JIT-loaded there, so a sample times only the operation. Each timed
body runs a batch of operations (asv reports the batch time):

* read-mostly suites (match, locks, path, sizes) repeat freely;
* mutating suites (insert, evict, request caching, reset) use ``number = 1``,
  so ``setup`` rebuilds the same tree before every sample.
"""

import numpy as np

try:
    from . import workloads as W
except ImportError:  # run as a plain module (scripts)
    import workloads as W

import flatradix as fr

SIZES = [100_000, 1_000_000]
BATCH = 300  # operations per timed call (match, lock_unlock, path)


def build_tree(tree_tokens, page_size=1, seed=0, headroom=400_000, rows=64):
    """A flatradix cache holding ``tree_tokens`` tokens (own allocator, LRU),
    its allocator, request table and the stream that filled it."""
    alloc = fr.TokenToKVPoolAllocator(tree_tokens + headroom, page_size=page_size)
    rtp = fr.ReqToTokenPool(rows, 8192)
    cache = fr.UnifiedRadixCache(page_size=page_size, token_to_kv_pool_allocator=alloc,
                                 req_to_token_pool=rtp)
    stream = W.SequenceStream(seed=seed)
    W.fill_to(cache, alloc, stream, tree_tokens, fr.InsertParams, fr.RadixKey)
    return cache, alloc, rtp, stream


class _Tree:
    params = SIZES
    param_names = ["tree_tokens"]
    timeout = 600

    def setup(self, tree_tokens):
        self.cache, self.alloc, self.rtp, self.stream = build_tree(tree_tokens)


class _MatchKeys(_Tree):
    """BATCH match keys, 1/3 hits, 1/3 partial, 1/3 misses."""

    def setup(self, tree_tokens):
        super().setup(tree_tokens)
        self.params_ = [fr.MatchPrefixParams(key=fr.RadixKey(k)) for k in self.stream.match_keys(BATCH)]
        for p in self.params_:  # first pass splits nodes at partial hits; samples see a steady tree
            self.cache.match_prefix(p)


class MatchPrefix(_MatchKeys):
    """match_prefix: BATCH single calls."""

    def time_match_prefix(self, tree_tokens):
        m = self.cache.match_prefix
        for p in self.params_:
            m(p)


class MatchPrefixBatch(_MatchKeys):
    """match_prefix_batch: the same BATCH keys as one waiting queue, one call
    (compare with time_match_prefix: BATCH single calls)."""

    def time_match_prefix_batch(self, tree_tokens):
        self.cache.match_prefix_batch(self.params_)


class _Nodes(_Tree):
    def setup(self, tree_tokens):
        super().setup(tree_tokens)
        keys = [fr.RadixKey(s) for s in self.stream.sample(BATCH, seed=5)]
        self.nodes = [self.cache.match_prefix(k).last_device_node for k in keys]
        self.cache.dec_lock_ref(self.nodes[0], self.cache.inc_lock_ref(self.nodes[0]))
        self.cache.path_device_indices(self.nodes[0])


class LockUnlock(_Nodes):
    """inc_lock_ref + dec_lock_ref on BATCH matched (leaf-ward) nodes."""

    def time_lock_unlock(self, tree_tokens):
        inc, dec = self.cache.inc_lock_ref, self.cache.dec_lock_ref
        for n in self.nodes:
            dec(n, inc(n))


class LockUnlockBatch(_Nodes):
    """lock_batch + unlock_batch of the same BATCH nodes (one call each)."""

    def time_lock_unlock_batch(self, tree_tokens):
        self.cache.unlock_batch(self.cache.lock_batch(self.nodes))


class PathIndices(_Nodes):
    """path_device_indices of BATCH nodes (KV indices root -> node)."""

    def time_path_device_indices(self, tree_tokens):
        p = self.cache.path_device_indices
        for n in self.nodes:
            p(n)


class Sizes(_Tree):
    def time_sizes(self, tree_tokens):
        c = self.cache
        for _ in range(BATCH):
            c.evictable_size()
            c.protected_size()


class SanityCheck(_Tree):
    """sanity_check(): every invariant, O(tree)."""

    number = 1

    def time_sanity_check(self, tree_tokens):
        self.cache.sanity_check()


class _Mutating(_Tree):
    number = 1
    repeat = (3, 8, 30.0)
    warmup_time = 0


class Insert(_Mutating):
    """insert of 100 new prefix-sharing sequences (~1-2k tokens, ~130 new each);
    KV slots allocated untimed, duplicates freed through the allocator."""

    def setup(self, tree_tokens):
        super().setup(tree_tokens)
        seqs = [s for _ in range(60) for s in self.stream.batch()][:100]
        self.params_ = [fr.InsertParams(key=fr.RadixKey(s), value=self.alloc.alloc(s.shape[0]))
                        for s in seqs]

    def time_insert(self, tree_tokens):
        ins = self.cache.insert
        for p in self.params_:
            ins(p)


class Evict(_Mutating):
    """evict(2,500 tokens) x 10 (LRU leaves; freed through the allocator)."""

    def time_evict(self, tree_tokens):
        ev = self.cache.evict
        p = fr.EvictParams(num_tokens=2500)
        for _ in range(10):
            ev(p)


class EvictStepwise(_Mutating):
    """evict_device_start / next_node x ~ / end for 25,000 tokens (the controller frees)."""

    def time_evict_stepwise(self, tree_tokens):
        c = self.cache
        c.evict_device_start(num_tokens=25_000)
        while c.evict_device_next_node().node_id is not None:
            pass
        c.evict_device_end()


class _Requests(_Mutating):
    """50 finished / running requests prepared untimed: a row holding fresh KV
    for every committed token (prompt = a cached sequence's prefix + new tokens)."""

    n_req = 50

    def setup(self, tree_tokens):
        super().setup(tree_tokens)
        self.reqs = []
        for i, s in enumerate(self.stream.sample(self.n_req, seed=11)):
            full = np.concatenate([s, np.arange(1, 65, dtype=np.int64) + 5 * W.VOCAB + i * 64])
            prompt, out = full[:-32], full[-32:]
            committed = full.shape[0] - 1
            row = self.rtp.alloc(1)[0]
            self.rtp.req_to_token[row, :committed] = self.alloc.alloc(committed)
            self.reqs.append(fr.Req(origin_input_ids=prompt, output_ids=out,
                                    fill_ids=full[:committed], req_pool_idx=row,
                                    kv_committed_len=committed))


class CacheFinishedReq(_Requests):
    def time_cache_finished_req(self, tree_tokens):
        f = self.cache.cache_finished_req
        for r in self.reqs:
            f(r)


class CacheUnfinishedReq(_Requests):
    def time_cache_unfinished_req(self, tree_tokens):
        f = self.cache.cache_unfinished_req
        for r in self.reqs:
            f(r)


class RequestPath(_Mutating):
    """The scheduler's request path, end to end, for 50 requests whose prompt
    (a cached sequence's prefix + new tokens) comes in a ``container``: admit
    (``Req`` built, ``match_prefix`` with ``req``, ``cache.lock``, KV for the
    uncached part, the row written) then ``release_kv_cache``. Tracks what
    ``benchmarks/replay_peer.py`` measures against SGLang, per container."""

    params = (SIZES, ["list", "array", "numpy", "torch"])
    param_names = ["tree_tokens", "container"]

    def setup(self, tree_tokens, container):
        super().setup(tree_tokens)
        from array import array

        make = {"list": lambda t: t.tolist(), "array": lambda t: array("q", t.tobytes()),
                "numpy": lambda t: t}.get(container)
        if make is None:
            try:
                import torch
            except ImportError:  # asv skips a parameter whose setup says so
                raise NotImplementedError("torch is not installed in this environment")
            make = torch.from_numpy
        self.prompts = []
        for i, s in enumerate(self.stream.sample(50, seed=13)):
            full = np.concatenate([s, np.arange(1, 33, dtype=np.int64) + 7 * W.VOCAB + i * 32])
            self.prompts.append(make(full))

    def time_request_path(self, tree_tokens, container):
        c, rtp, alloc = self.cache, self.rtp, self.alloc
        table = rtp.req_to_token
        for ids in self.prompts:
            req = fr.Req(origin_input_ids=ids)
            m = c.match_prefix(fr.MatchPrefixParams(key=fr.RadixKey(ids), req=req))
            req.lock = c.lock(m.last_device_node)
            req.last_node = m.last_device_node
            n, hit = len(ids), m.device_prefix_len
            req.req_pool_idx = row = rtp.alloc(1)[0]
            table[row, :hit] = m.device_indices
            table[row, hit:n] = alloc.alloc(n - hit)
            req.cache_protected_len = hit
            req.kv_committed_len = req.kv_allocated_len = n
            c.release_kv_cache(req)


class Reset(_Mutating):
    def time_reset(self, tree_tokens):
        self.cache.reset()
