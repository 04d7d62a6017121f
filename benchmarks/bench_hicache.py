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
  LRU host leaf deleted, its host slots freed).

``compare_hicache.py`` times the same steps against SGLang's cores.
"""

import numpy as np

try:
    from . import workloads as W
except ImportError:  # run as a plain module (scripts)
    import workloads as W

import flatradix as fr

TREE_TOKENS = 100_000


def load_back_request(c, params):
    """One request's load-back, as SGLang's ``PrefillAdder`` drives it."""
    m = c.match_prefix(params)
    lk = c.lock(m.last_device_node)
    if m.host_hit_length > 0:
        h = c.inc_host_lock_ref(m.best_match_node)
        c.init_load_back(fr.InitLoadBackParams(m.best_match_node, m.host_hit_length))
        c.dec_host_lock_ref(m.best_match_node, h)
    c.unlock(lk)
    c.ready_to_load_host_cache()
    c.loading_check()


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


class _HostTree:
    number = 1
    repeat = (3, 8, 30.0)
    warmup_time = 0
    timeout = 600

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
