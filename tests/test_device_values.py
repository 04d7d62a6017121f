"""Device values (issue 29): the request path, the host tier and the direct API
with KV indices on torch's ``meta`` device (no data: any host read raises) under
a dispatch-mode counter of host syncs, and the same seeded workloads with CPU
tensors through the device arena giving results identical to numpy values
through the host pool.

Every workload runs four times: ``numpy`` (host values, numpy allocator and
request table), ``arena`` (``device_values=True`` on CPU torch tensors:
``flatradix.device.DeviceKVAllocator`` / ``DeviceReqToTokenPool`` on the CPU),
``meta`` (the same on the meta device, inside ``SyncCounter``: zero syncing
ops, per operation) and ``cupy-standin`` (the arena with cupy's op set over
numpy arrays standing in for cupy's: cupy's code path, run on the CPU). The numpy allocator below is the device one's
twin (same slot order), so the three runs hand out the same slots: the numpy
and arena records (every result: indices, lengths, node ids, sizes) must be
equal, and the meta record equals the arena one with every value replaced by
its length (meta has only shapes).
"""

import random

import numpy as np
import pytest
import torch

import flatradix as F
from flatradix import device as D
from flatradix.device import DeviceKVAllocator, DeviceReqToTokenPool, DeviceValueError
from tests.device_harness import SyncCounter


class NumpyKVAllocator:
    """``DeviceKVAllocator``'s twin on numpy (same slot order)."""

    page_size = 1
    index_kind = "numpy"

    def __init__(self, size):
        self.size = size
        self.free_slots = np.arange(1, size + 1, dtype=np.int64)

    def available_size(self):
        return self.free_slots.shape[0]

    def alloc(self, n):
        if n > self.free_slots.shape[0]:
            return None
        out, self.free_slots = self.free_slots[:n], self.free_slots[n:]
        return out

    def free(self, idx):
        self.free_slots = np.concatenate([self.free_slots, np.asarray(idx, dtype=np.int64)])


class NumpyReqToTokenPool:
    def __init__(self, size, width):
        self.req_to_token = np.zeros((size, width), dtype=np.int32)
        self.free_rows = list(range(size))

    def alloc(self, n=1):
        out, self.free_rows = self.free_rows[:n], self.free_rows[n:]
        return out

    def free(self, row):
        self.free_rows.append(int(row))


def _make(mode, size, width, rows, **kw):
    if mode in ("numpy", "cupy-standin"):
        alloc, rtp = NumpyKVAllocator(size), NumpyReqToTokenPool(rows, width)
    else:
        device = "cpu" if mode == "arena" else "meta"
        alloc, rtp = DeviceKVAllocator(size, device), DeviceReqToTokenPool(rows, width, device)
    cache = F.UnifiedRadixCache(token_to_kv_pool_allocator=alloc, req_to_token_pool=rtp,
                                device_values=(mode in ("arena", "meta")), **kw)
    if mode == "cupy-standin":
        # the cupy op set over numpy arrays standing in for cupy's: the arena path
        # with every array operation cupy's API names
        cache._vals.start_device(D.CupyOps(xp=np), cache._engine)
    assert cache.device_values == (mode != "numpy")
    return cache, alloc, rtp


class Recorder:
    """Results in a comparable form: values as lists (meta: their lengths)."""

    def __init__(self, mode):
        self.mode = mode
        self.log = []

    def v(self, x):
        if x is None:
            return None
        if self.mode == "meta":
            assert x.device.type == "meta"
            return ("len", int(x.shape[0]))
        if self.mode == "arena":
            assert isinstance(x, torch.Tensor) and x.device.type == "cpu"
            return ("len", int(x.shape[0]), [int(a) for a in x.tolist()])
        assert isinstance(x, np.ndarray)
        return ("len", int(x.shape[0]), [int(a) for a in x.tolist()])

    def add(self, *items):
        self.log.append(items)


def _shape_only(log):
    def strip(x):
        if isinstance(x, tuple) and x and x[0] == "len":
            return x[:2]
        if isinstance(x, tuple):
            return tuple(strip(y) for y in x)
        if isinstance(x, list):
            return [strip(y) for y in x]
        return x
    return [strip(e) for e in log]


def _prompt(rng, prefixes):
    p = list(rng.choice(prefixes))
    return p + [rng.randrange(1000, 1100) for _ in range(rng.randrange(0, 12))]


def request_workload(mode, seed, *, page_size=2, host=None, steps=120, size=160,
                     pool_capacity=64, policy="lru"):
    """Requests through the request path (match, lock, rows written on the
    values' device, checkpoint of running requests, release), direct evictions,
    a step-wise round, path queries and batched matches; a small pool (growth,
    gap passes and compactions) and, with ``host``, the host tier."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1, 50) for _ in range(rng.randrange(2, 14))] for _ in range(5)]
    cache, alloc, rtp = _make(mode, size, 64, 4, page_size=page_size, eviction_policy=policy,
                              pool_capacity=pool_capacity, node_capacity=16)
    if host is not None:
        cache.init_hicache(hicache_write_policy=host, host_size=96, load_back_threshold=2)
    rec = Recorder(mode)
    counter = SyncCounter() if mode == "meta" else None
    running = []

    def op(fn, *a, **kw):
        if counter is None:
            return fn(*a, **kw)
        before = counter.syncs()
        with counter:
            r = fn(*a, **kw)
        assert counter.syncs() == before, (fn.__name__, counter.events[-5:])
        return r

    def finish(entry, checkpoint_first):
        req = entry
        if checkpoint_first is None:   # the core driver: insert + unlock + free
            n = req.kv_committed_len
            aligned = n - n % page_size
            row = rtp.req_to_token[req.req_pool_idx, :req.kv_allocated_len]
            ids = list(req.origin_input_ids) + list(req.output_ids)
            r = op(cache.insert, F.InsertParams(key=F.RadixKey(ids[:aligned]), value=row[:aligned],
                                                prev_prefix_len=req.cache_protected_len))
            op(cache.unlock, req.lock)
            if aligned < row.shape[0]:
                op(alloc.free, row[aligned:])
            rtp.free(req.req_pool_idx)
            rec.add("insert", r.prefix_len, r.last_device_node, cache.evictable_size())
            return
        if checkpoint_first:
            op(cache.cache_unfinished_req, req)
            rec.add("ckpt", req.cache_protected_len, rec.v(req.prefix_indices), req.last_node)
        op(cache.release_kv_cache, req)
        rec.add("release", cache.evictable_size(), cache.protected_size(),
                alloc.available_size())

    for step in range(steps):
        r = rng.random()
        if r < 0.55 or not running:
            ids = _prompt(rng, prefixes)
            outs = [rng.randrange(2000, 2100) for _ in range(rng.randrange(1, 5))]
            req = F.Req(origin_input_ids=ids, output_ids=outs)
            m = op(cache.match_prefix, F.MatchPrefixParams(key=F.RadixKey(ids), req=req))
            rec.add("match", m.device_prefix_len, rec.v(m.device_indices), m.last_device_node,
                    m.best_match_node, m.host_hit_length)
            node = m.last_device_node
            if host is not None and m.host_hit_length:
                loaded = op(cache.init_load_back,
                            F.InitLoadBackParams(m.best_match_node, m.host_hit_length, None, req))
                rec.add("load", tuple(loaded))
                op(cache.check_hicache_events)
                m = op(cache.match_prefix, F.MatchPrefixParams(key=F.RadixKey(ids), req=req))
                rec.add("rematch", m.device_prefix_len, rec.v(m.device_indices))
                node = m.last_device_node
            lk = op(cache.lock, node)
            hit = m.device_prefix_len
            need = len(ids) + len(outs) - hit
            got = alloc.alloc(need)
            if got is None:
                res = op(cache.evict, F.EvictParams(num_tokens=need - alloc.available_size()))
                rec.add("evict-short", res.num_tokens_evicted)
                got = alloc.alloc(need)
            if got is None:
                op(cache.unlock, lk)
                rec.add("reject")
                continue
            row = rtp.alloc(1)[0]
            req.req_pool_idx = row
            if hit:
                rtp.req_to_token[row, :hit] = m.device_indices
            rtp.req_to_token[row, hit:hit + need] = got
            req.last_node, req.lock, req.cache_protected_len = node, lk, hit
            req.prefix_indices = m.device_indices
            req.kv_committed_len = len(ids) + len(outs) - 1
            req.kv_allocated_len = len(ids) + len(outs)
            running.append(req)
            while len(running) > 3:
                finish(running.pop(0), rng.choice((True, False, None)))
        elif r < 0.75:
            finish(running.pop(rng.randrange(len(running))), rng.choice((True, False, None)))
        elif r < 0.82:
            res = op(cache.evict, F.EvictParams(num_tokens=rng.randrange(1, 20)))
            rec.add("evict", res.num_tokens_evicted, res.evicted_indices)
        elif r < 0.88 and running:
            req = rng.choice(running)
            rec.add("path", rec.v(op(cache.path_device_indices, req.last_node)))
        elif r < 0.94:
            keys = [F.RadixKey(_prompt(rng, prefixes)) for _ in range(3)]
            ms = op(cache.match_prefix_batch, [F.MatchPrefixParams(key=k) for k in keys])
            rec.add("batch", [(m.device_prefix_len, rec.v(m.device_indices)) for m in ms])
        else:
            op(cache.evict_device_start, F.ComponentType.FULL, rng.randrange(1, 12))
            while True:
                s = op(cache.evict_device_next_node)
                if not s.made_progress:
                    break
                op(alloc.free, s.freed_indices)
                rec.add("step", s.node_id, rec.v(s.freed_indices))
            op(cache.evict_device_end)
        if host is not None and step % 7 == 0:
            op(cache.check_hicache_events)
        rec.add("sizes", cache.evictable_size(), cache.protected_size(), alloc.available_size())
    while running:
        finish(running.pop(0), False)
    eng = cache._engine
    rec.add("engine", eng.gap_passes, eng.compactions, int(eng.st.pool.shape[0]))
    if mode != "meta":
        cache.sanity_check()
        assert alloc.available_size() + cache.evictable_size() + cache.protected_size() == size
        if mode in ("arena", "cupy-standin"):
            assert not (eng.st.pool[:, 1] >= (1 << 48)).any()   # no tag left anywhere
    return rec.log, counter


def _run_three(**kw):
    logs = {}
    counters = {}
    for mode in ("numpy", "arena", "meta", "cupy-standin"):
        logs[mode], counters[mode] = request_workload(mode, **kw)
    assert logs["numpy"] == logs["arena"]
    assert logs["numpy"] == logs["cupy-standin"]
    assert _shape_only(logs["arena"]) == logs["meta"]
    assert counters["meta"].syncs() == 0 and counters["meta"].ops > 0
    return logs


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("page_size", [1, 4])
def test_request_path_on_device_values(seed, page_size):
    logs = _run_three(seed=seed, page_size=page_size)
    engine = logs["arena"][-1]
    assert engine[0] == "engine"


def test_workload_moves_the_pool_rows():
    """The small pool really grows, runs gap passes or compacts (what the arena's
    remap has to follow)."""
    logs = _run_three(seed=11, page_size=1, steps=200, size=200)
    _, passes, compactions, rows = logs["arena"][-1]
    assert rows > 64 and (passes + compactions) > 0


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
@pytest.mark.parametrize("seed", range(3))
def test_host_tier_on_device_values(policy, seed):
    logs = _run_three(seed=seed, page_size=2, host=policy, size=120)
    assert any(e[0] == "load" for e in logs["arena"]) or seed  # loads happen (seed 0 checked)


def test_direct_api_without_allocator_returns_device_arrays():
    """No allocator: duplicates and evicted indices come back on the values'
    device (the caller frees them); numpy and CPU-arena agree."""
    out = {}
    for mode in ("numpy", "arena"):
        c = F.UnifiedRadixCache(page_size=1, device_values=(mode == "arena"))
        mk = (lambda a: torch.tensor(a)) if mode == "arena" else (lambda a: np.array(a))
        r1 = c.insert(F.InsertParams(key=F.RadixKey([1, 2, 3, 4]), value=mk([10, 11, 12, 13])))
        r2 = c.insert(F.InsertParams(key=F.RadixKey([1, 2, 5, 6]), value=mk([20, 21, 22, 23])))
        m = c.match_prefix(F.MatchPrefixParams(key=F.RadixKey([1, 2, 5, 9])))
        info = c.node_info(m.last_device_node)
        flat = c.all_values_flatten()
        e = c.evict(F.EvictParams(num_tokens=100))
        out[mode] = [x.tolist() for x in (r1.duplicate_indices, r2.duplicate_indices,
                                          m.device_indices, info["value"], flat,
                                          e.evicted_indices)]
        c.sanity_check()
    assert out["numpy"] == out["arena"]
    assert out["arena"][1] == [20, 21] and out["arena"][2] == [10, 11, 22]


def test_out_of_range_values_surface_at_the_sync_point():
    """Default mode: an index outside the allocator's pool is found on the device
    and raised by check_device_values() (and sanity_check), naming the call."""
    alloc = DeviceKVAllocator(16, "cpu")
    c = F.UnifiedRadixCache(page_size=1, token_to_kv_pool_allocator=alloc, device_values=True)
    assert c.device_values
    c.insert(F.InsertParams(key=F.RadixKey([1, 2]), value=torch.tensor([1, 2])))
    c.check_device_values()
    c.insert(F.InsertParams(key=F.RadixKey([3, 4]), value=torch.tensor([3, 17])))
    with pytest.raises(DeviceValueError, match=r"params.value .*a device value 17 lies outside "
                                               r"\[0, 17\)"):
        c.check_device_values()
    c.check_device_values()   # reported once
    c.insert(F.InsertParams(key=F.RadixKey([5]), value=torch.tensor([-1])))
    with pytest.raises(DeviceValueError, match="-1"):
        c.sanity_check()


def test_debug_checks_refuse_before_any_change():
    """debug_checks=True: the host path's checks on a host copy, before any change."""
    from flatradix import TokenToKVPoolAllocator

    alloc = TokenToKVPoolAllocator(16, index_kind="torch")
    c = F.UnifiedRadixCache(page_size=1, token_to_kv_pool_allocator=alloc, device_values=True,
                            debug_checks=True)
    assert c.device_values
    held = alloc.alloc(3)
    c.insert(F.InsertParams(key=F.RadixKey([1, 2, 3]), value=held))
    snap = c._engine.snapshot()
    with pytest.raises(ValueError, match="is free in the allocator"):
        c.insert(F.InsertParams(key=F.RadixKey([4, 5]), value=torch.tensor([9, 10])))
    after = c._engine.snapshot()
    assert all(np.array_equal(snap[k], after[k]) for k in ("nodes", "pool", "meta"))
    c2 = F.UnifiedRadixCache(page_size=1, token_to_kv_pool_allocator=DeviceKVAllocator(8, "cpu"),
                             device_values=True, debug_checks=True)
    with pytest.raises(ValueError, match="outside the allocator's pool"):
        c2.insert(F.InsertParams(key=F.RadixKey([4, 5]), value=torch.tensor([1, 9])))
    assert c2.total_size() == (0, 0)


def test_a_slot_the_tree_holds_freed_as_a_duplicate_is_reported():
    """A request released with a stale cache_protected_len whose row repeats the
    tree's own slots: host values keep them (flatradix's rule), device values
    free them as SGLang does and report it at the sync point."""
    alloc = DeviceKVAllocator(32, "cpu")
    rtp = DeviceReqToTokenPool(2, 16, "cpu")
    c = F.UnifiedRadixCache(page_size=1, token_to_kv_pool_allocator=alloc, req_to_token_pool=rtp,
                            device_values=True)
    req = F.Req(origin_input_ids=[1, 2, 3, 4])
    req.req_pool_idx = rtp.alloc(1)[0]
    rtp.req_to_token[req.req_pool_idx, :4] = alloc.alloc(4)
    req.kv_committed_len = 4
    c.release_kv_cache(req)
    c.check_device_values()
    m = c.match_prefix(F.MatchPrefixParams(key=F.RadixKey([1, 2, 3, 4])))
    req = F.Req(origin_input_ids=[1, 2, 3, 4])
    req.req_pool_idx = rtp.alloc(1)[0]
    rtp.req_to_token[req.req_pool_idx, :4] = m.device_indices
    req.kv_committed_len = 4      # cache_protected_len left at 0: the row repeats the tree's
    c.release_kv_cache(req)
    with pytest.raises(DeviceValueError, match="a slot the tree holds"):
        c.check_device_values()


def test_bad_metadata_is_refused_before_any_change():
    c = F.UnifiedRadixCache(page_size=1, token_to_kv_pool_allocator=DeviceKVAllocator(8, "meta"))
    assert c.device_values
    with pytest.raises(TypeError, match="params.value must hold integers"):
        c.insert(F.InsertParams(key=F.RadixKey([1, 2]),
                                value=torch.zeros(2, device="meta")))
    with pytest.raises(ValueError, match="params.value is on cpu"):
        c.insert(F.InsertParams(key=F.RadixKey([1, 2]), value=torch.tensor([1, 2])))
    with pytest.raises(ValueError, match="params.value has 3 entries"):
        c.insert(F.InsertParams(key=F.RadixKey([1, 2]),
                                value=torch.zeros(3, dtype=torch.int64, device="meta")))
    assert c.total_size() == (0, 0)
    with pytest.raises(TypeError, match="device_values=True takes torch tensors"):
        F.UnifiedRadixCache(device_values=True).insert(
            F.InsertParams(key=F.RadixKey([1]), value=np.array([1])))
    with pytest.raises(ValueError, match="Full-attention caches"):
        F.UnifiedRadixCache(device_values=True, token_to_kv_pool_allocator=DeviceKVAllocator(
            8, "cpu"), tree_components=(F.ComponentType.FULL, F.ComponentType.MAMBA),
            req_to_token_pool=F.HybridReqToTokenPool(2, 8, 4))


def test_a_refused_first_device_value_leaves_the_choice_open():
    """Auto mode, no allocator: the arena starts with the first device value that
    is accepted, not with one refused (the state after an error is the state
    before it)."""
    c = F.UnifiedRadixCache(page_size=1)
    with pytest.raises(ValueError, match="params.value has 3 entries"):
        c.insert(F.InsertParams(key=F.RadixKey([1, 2]),
                                value=torch.zeros(3, dtype=torch.int64, device="meta")))
    with pytest.raises(TypeError, match="params.value must hold integers"):
        c.insert(F.InsertParams(key=F.RadixKey([1, 2]), value=torch.zeros(2, device="meta")))
    assert not c.device_values and c.total_size() == (0, 0)
    c.insert(F.InsertParams(key=F.RadixKey([1, 2]),
                            value=torch.zeros(2, dtype=torch.int64, device="meta")))
    assert c.device_values and c.total_size() == (2, 0)


def test_auto_mode_keeps_host_values_for_cpu_tensors():
    c = F.UnifiedRadixCache(page_size=1)
    c.insert(F.InsertParams(key=F.RadixKey([1]), value=torch.tensor([5])))
    assert not c.device_values          # a CPU tensor: host values, as before
    c = F.UnifiedRadixCache(page_size=1, device_values=False,
                            token_to_kv_pool_allocator=DeviceKVAllocator(8, "meta"))
    assert not c.device_values


def test_device_check_smoke_runs_on_the_cpu():
    """benchmarks/device_check.py --smoke: the Mooncake sample through the request
    path on CPU tensors (arena against host values: identical) and on meta; the
    meta replay inside the sync counter: zero syncing ops."""
    from benchmarks.device_check import load, replay, smoke

    assert smoke(limit=20) == 0
    _, wl = load("mooncake:sample", 12)
    with SyncCounter() as sc:
        hits, tot, _, _ = replay(wl, device="meta", device_values=True, driver="request",
                                 timed=False, capacity=20_000)
    assert sc.syncs() == 0 and sc.ops > 100, sc.events[:5]
    assert tot["evict_calls"] > 0 and (hits > 0).any()


def test_sanity_check_finds_a_row_that_does_not_name_itself():
    """The arena's invariant (every device row's FULL_DEV names the row) is checked:
    a missed claim (a tag left behind) would be found."""
    from flatradix.errors import CacheInvariantError

    c = F.UnifiedRadixCache(page_size=1, device_values=True)
    c.insert(F.InsertParams(key=F.RadixKey([1, 2, 3]), value=torch.tensor([7, 8, 9])))
    c.sanity_check()
    c._engine.st.pool[1, 1] = (1 << 48) + 1   # as if the insert's claim had been skipped
    with pytest.raises(CacheInvariantError, match="pool row 1 .* not its own row"):
        c.sanity_check()
