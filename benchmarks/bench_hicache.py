"""asv: the host tier's (HiCache) step costs, as a scheduler drives them.

Each suite builds, in ``setup``, a cache holding 100k tokens of prefix-sharing
sequences (``workloads.SequenceStream``, page 1, flatradix's own allocator, LRU)
with the host tier on (``write_through``, a host pool as large as the device
pool) and every sequence backed up; a timed body then runs a batch of steps
(``number = 1``: ``setup`` rebuilds the tree before every sample):

* ``Backup``: 100 new sequences inserted, each backed up at its first hit,
  submitted (``flush_pending_backups``) and acked (``writing_check``);
* ``Demote``: ``evict(1)`` x 200: the LRU device leaf, backed up, goes host-only;
* ``LoadBack``: 100 sequences demoted untimed, then per sequence the
  ``PrefillAdder``'s calls: ``match_prefix``, ``lock``, ``inc_host_lock_ref``,
  ``init_load_back``, ``dec_host_lock_ref``, ``unlock``, then
  ``ready_to_load_host_cache`` and ``loading_check``;
* ``HostEvict``: everything demoted untimed, then ``evict_host(1)`` x 200 (the
  LRU host leaf deleted, its host slots freed);
* ``MambaLoadBack``: the load-back request on a Full + Mamba cache (a host-only
  state restored and copied into the request's slot; see its docstring);
* ``SWALoadBack``: the load-back request on a Full + SWA cache (the Full host hit
  and its last window of SWA data restored; see its docstring).

``compare_hicache.py`` times these steps against SGLang's cores (``--component
full|swa|mamba``).
"""

import numpy as np

try:
    from . import workloads as W
except ImportError:  # run as a plain module (scripts)
    import workloads as W

import flatradix as fr

TREE_TOKENS = 100_000


def load_back_request(c, params, make_req=None):
    """One request's load-back, as SGLang's ``PrefillAdder`` drives it; with
    ``make_req`` (Mamba) the request built from the match is passed to
    ``init_load_back`` and returned (a Mamba or SWA host hit loads too)."""
    m = c.match_prefix(params)
    lk = c.lock(m.last_device_node)
    req = None if make_req is None else make_req(m)
    if m.host_hit_length > 0 or m.mamba_host_hit_length > 0 or m.swa_host_hit_length > 0:
        h = c.inc_host_lock_ref(m.best_match_node)
        c.init_load_back(fr.InitLoadBackParams(m.best_match_node, m.host_hit_length, None,
                                               req))
        c.dec_host_lock_ref(m.best_match_node, h)
    c.unlock(lk)
    c.ready_to_load_host_cache()
    c.loading_check()
    return req


def _warm():
    """Every step once on a small cache: the kernels are loaded before a sample."""
    alloc = fr.TokenToKVPoolAllocator(64)
    c = fr.UnifiedRadixCache(token_to_kv_pool_allocator=alloc)
    c.init_hicache(host_size=64, hicache_write_policy="write_through")
    key = fr.RadixKey(np.arange(1, 17, dtype=np.int64))
    c.insert(fr.InsertParams(key=key, value=alloc.alloc(16)))
    c.check_hicache_events()
    c.evict(fr.EvictParams(num_tokens=16))
    load_back_request(c, fr.MatchPrefixParams(key=key))
    c.evict(fr.EvictParams(num_tokens=16))
    c.evict_host(16)


class _Timing:
    """asv's settings of every suite here (``number = 1``: setup before each sample)."""

    number = 1
    repeat = (3, 8, 30.0)
    warmup_time = 0
    timeout = 600


class _HostTree(_Timing):
    def setup(self):
        _warm()
        size = TREE_TOKENS + 400_000
        self.alloc = fr.TokenToKVPoolAllocator(size)
        self.cache = fr.UnifiedRadixCache(token_to_kv_pool_allocator=self.alloc)
        self.cache.init_hicache(host_size=size, hicache_write_policy="write_through")
        self.stream = W.SequenceStream(seed=0)
        self.seqs = []
        total = 0
        while total < TREE_TOKENS:
            for s in self.stream.batch():
                self.cache.insert(fr.InsertParams(key=fr.RadixKey(s),
                                                  value=self.alloc.alloc(s.shape[0])))
                self.seqs.append(s)
                total = self.cache.total_size()[0]
            self.cache.check_hicache_events()


class Backup(_HostTree):
    def setup(self):
        super().setup()
        seqs = [s for _ in range(60) for s in self.stream.batch()][:100]
        self.params_ = [fr.InsertParams(key=fr.RadixKey(s), value=self.alloc.alloc(s.shape[0]))
                        for s in seqs]

    def time_backup_step(self):
        c = self.cache
        for p in self.params_:
            c.insert(p)
            c.flush_pending_backups()
            c.writing_check()


class Demote(_HostTree):
    def time_demote(self):
        ev = self.cache.evict
        p = fr.EvictParams(num_tokens=1)
        for _ in range(200):
            ev(p)


class LoadBack(_HostTree):
    def setup(self):
        super().setup()
        self.cache.evict(fr.EvictParams(num_tokens=TREE_TOKENS))   # all host-only
        rng = np.random.default_rng(1)
        picks = rng.choice(len(self.seqs), size=100, replace=False)
        self.params_ = [fr.MatchPrefixParams(key=fr.RadixKey(self.seqs[i])) for i in picks]

    def time_load_back(self):
        c = self.cache
        for p in self.params_:
            load_back_request(c, p)


class HostEvict(_HostTree):
    def setup(self):
        super().setup()
        self.cache.evict(fr.EvictParams(num_tokens=TREE_TOKENS))

    def time_host_evict(self):
        eh = self.cache.evict_host
        for _ in range(200):
            eh(1)


def _demoted_picks(c, insert, evict_params):
    """The hybrid suites' tree: 2,000 sequences of the stream, each inserted with
    ``insert(seq)`` and backed up (the acks after each batch), then all demoted
    (``evict(evict_params)``); returns the match params of 100 of them, picked
    alike in every suite."""
    stream = W.SequenceStream(seed=0)
    seqs = []
    while len(seqs) < 2000:
        for s in stream.batch():
            insert(s)
            seqs.append(s)
        c.check_hicache_events()
    c.evict(evict_params)  # all host-only
    picks = np.random.default_rng(1).choice(len(seqs), size=100, replace=False)
    return [fr.MatchPrefixParams(key=fr.RadixKey(seqs[i])) for i in picks]


# ------------------------------------------------------------------ Full + Mamba
MAMBA_STATES = 4096


class MambaLoadBack(_Timing):
    """Full + Mamba with the host tier (``write_through``): 2,000 sequences of the
    same stream, each inserted with a state and backed up (KV and state); setup
    demotes them all (states to the host); the timed body loads 100 of them back
    per request as a scheduler does -- ``match_prefix`` (a host-only state:
    ``mamba_host_hit_length`` 1), ``lock``, ``inc_host_lock_ref``, ``init_load_back``
    with a request holding no state slot (the load gives it one: the state is
    restored into a fresh slot and copied into the request's), the releases,
    ``ready_to_load_host_cache``, ``loading_check`` -- then frees the request's slot.
    Compare with ``LoadBack``: the state's extra steps."""

    def setup(self):
        _warm()
        size = 600_000
        self.alloc = fr.TokenToKVPoolAllocator(size)
        self.pool = fr.HybridReqToTokenPool(8, 4096, mamba_size=MAMBA_STATES)
        ma = self.pool.mamba_allocator
        c = self.cache = fr.UnifiedRadixCache(
            tree_components=(fr.ComponentType.FULL, fr.ComponentType.MAMBA),
            token_to_kv_pool_allocator=self.alloc, req_to_token_pool=self.pool)
        c.init_hicache(host_size=size, mamba_host_size=MAMBA_STATES,
                       hicache_write_policy="write_through", load_back_threshold=1)

        def insert(s):
            st = ma.alloc(1)
            r = c.insert(fr.InsertParams(key=fr.RadixKey(s), value=self.alloc.alloc(
                s.shape[0]), mamba_value=st))
            if r.mamba_exist:
                ma.free(st)

        self.params_ = _demoted_picks(c, insert, fr.EvictParams(num_tokens=size,
                                                                 mamba_num=MAMBA_STATES))

    def time_mamba_load_back(self):
        c, ma = self.cache, self.pool.mamba_allocator
        for p in self.params_:
            req = load_back_request(c, p, _Req)
            if req.kv.mamba_pool_idx is not None:
                ma.free(np.asarray([int(req.kv.mamba_pool_idx)]))


# ------------------------------------------------------------------ Full + SWA
SWA_WINDOW = 256


class SWALoadBack(_Timing):
    """Full + SWA (window ``SWA_WINDOW``) with the host tier (``write_through``):
    2,000 sequences of the same stream, each backed up (KV and the SWA data of its
    window); setup demotes them all; the timed body loads 100 of them back per
    request as a scheduler does -- ``match_prefix`` (``swa_host_hit_length``: the
    last window's host-only SWA tokens), ``lock``, ``inc_host_lock_ref`` (the SWA
    host window too), ``init_load_back`` (the Full host hit into Full slots, the
    window into fresh SWA slots, then mapped), the releases,
    ``ready_to_load_host_cache``, ``loading_check``. Compare with ``LoadBack``: the
    window's extra steps."""

    def setup(self):
        _warm_swa()
        size = 600_000
        self.alloc = fr.SWATokenToKVPoolAllocator(size, size)
        c = self.cache = fr.UnifiedRadixCache(
            tree_components=(fr.ComponentType.FULL, fr.ComponentType.SWA),
            sliding_window_size=SWA_WINDOW, token_to_kv_pool_allocator=self.alloc)
        c.init_hicache(host_size=size, swa_host_size=size, hicache_write_policy="write_through",
                       load_back_threshold=1)
        self.params_ = _demoted_picks(
            c, lambda s: c.insert(fr.InsertParams(key=fr.RadixKey(s), value=self.alloc.alloc(
                s.shape[0]))), fr.EvictParams(num_tokens=size, swa_num_tokens=size))

    def time_swa_load_back(self):
        c = self.cache
        for p in self.params_:
            load_back_request(c, p, _SWAReq)


def _warm_swa():
    """The SWA load-back's kernels once on a small cache (loaded before a sample)."""
    _warm()
    alloc = fr.SWATokenToKVPoolAllocator(64, 64)
    c = fr.UnifiedRadixCache(tree_components=(fr.ComponentType.FULL, fr.ComponentType.SWA),
                             sliding_window_size=4, token_to_kv_pool_allocator=alloc)
    c.init_hicache(host_size=64, swa_host_size=64, load_back_threshold=1)
    key = fr.RadixKey(np.arange(1, 17, dtype=np.int64))
    c.insert(fr.InsertParams(key=key, value=alloc.alloc(16)))
    c.check_hicache_events()
    c.evict(fr.EvictParams(num_tokens=16, swa_num_tokens=16))
    load_back_request(c, fr.MatchPrefixParams(key=key), _SWAReq)


class _SWAReq:
    """The request fields an SWA load-back reads."""

    __slots__ = ("last_node", "swa_host_hit_length")

    def __init__(self, m):
        self.last_node = m.last_device_node
        self.swa_host_hit_length = m.swa_host_hit_length


class _KV:
    __slots__ = ("mamba_pool_idx",)

    def __init__(self):
        self.mamba_pool_idx = None


class _Req:
    """The request fields a Mamba load-back reads and writes."""

    __slots__ = ("last_node", "mamba_host_hit_length", "kv")

    def __init__(self, m):
        self.last_node = m.last_device_node
        self.mamba_host_hit_length = m.mamba_host_hit_length
        self.kv = _KV()
