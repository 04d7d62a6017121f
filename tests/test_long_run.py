"""Memory under churn: the long-run workload of ``benchmarks/long_run.py`` in
short, plus the two counters that only overflow after very long runs.

* 200k mixed public-API operations in a fixed 20k-token KV pool: every array
  capacity (node table, heap, child table, key/value pool, ``_out`` scratch) is
  the same at the end as after warm-up (50k ops), the namespace map stays under
  its bound, KV is conserved and ``sanity_check()`` passes at every report and
  after the run (``run`` checks those and returns the failures).
* A slot reused 2**31 times is retired instead of overflowing its NodeId
  (generation pushed near the limit by hand, then churned).
* Per-request ``cache_salt`` namespaces do not grow the namespace map without
  bound, and a dropped namespace's id is never reissued.
"""

import numpy as np
import pytest

from benchmarks.long_run import capacities, ns_map_bound, run
from flatradix import (
    EvictParams, InsertParams, MatchPrefixParams, NodeAccessError, RadixKey, UnifiedRadixCache,
)
from flatradix.kernels import layout as L


@pytest.mark.slow
def test_capacities_stop_growing_under_churn():
    with open("/dev/null", "w") as devnull:
        ch, reports, final, failures = run(ops=200_000, pool=20_000, page_size=4, seed=1,
                                           report_every=25_000, warmup=50_000, progress=False,
                                           out=devnull, max_running=8, max_ctx=1024)
    assert not failures, failures
    warm = next(r for r in reports if r["ops"] >= 50_000)
    for k in capacities(ch.cache):
        assert final[k] == warm[k], (k, warm[k], final[k])
        assert all(r[k] == warm[k] for r in reports if r["ops"] >= warm["ops"]), k
    # the pool really was under pressure and churned: the tree filled it, was
    # evicted from, and slots were reused many times
    assert max(r["cached_tokens"] for r in reports) > 10_000
    assert ch.counts["evict_for_alloc"] > 1000
    assert ch.counts["evict"] > 0 and ch.counts["finish"] > 1000 and ch.counts["stale"] > 0
    assert final["max_gen"] > 20
    assert final["ns_map"] <= ns_map_bound(ch.cache)
    # run() drained every request and lock, then checked these; check them here too
    c = ch.cache
    assert c.protected_size() == 0
    assert ch.alloc.available_size() + c.evictable_size() == 20_000
    c.sanity_check()


def test_slot_generation_limit_retires_the_slot():
    c = UnifiedRadixCache(page_size=1)
    r = c.insert(InsertParams(key=RadixKey([1, 2]), value=np.array([5, 6])))
    slot = r.last_device_node & 0xFFFFFFFF
    c.evict(EvictParams(num_tokens=2))
    c._engine.st.nodes[slot, L.GEN] = L.GEN_LIMIT - 2  # as after ~2**31 reuses of this slot
    ids = []
    for _ in range(4):
        r = c.insert(InsertParams(key=RadixKey([1, 2]), value=np.array([5, 6])))
        ids.append(r.last_device_node)
        m = c.match_prefix(MatchPrefixParams(key=RadixKey([1, 2])))
        assert m.last_device_node == r.last_device_node and m.device_prefix_len == 2
        c.inc_lock_ref(r.last_device_node)
        c.dec_lock_ref(r.last_device_node)
        c.sanity_check()
        c.evict(EvictParams(num_tokens=2))
        c.sanity_check()
    # the hot slot served generations 2**31-2 and 2**31-1, then was retired
    assert ids[0] == ((L.GEN_LIMIT - 2) << 32) | slot
    assert ids[1] == ((L.GEN_LIMIT - 1) << 32) | slot
    assert all(0 < i < 2 ** 63 for i in ids) and len(set(ids)) == 4
    assert ids[2] & 0xFFFFFFFF != slot and ids[3] & 0xFFFFFFFF == ids[2] & 0xFFFFFFFF
    assert int(c._engine.meta[L.M_RETIRED]) == 1
    for old in ids:
        with pytest.raises(NodeAccessError):
            c.inc_lock_ref(old)
    c.reset()  # a reset keeps it retired
    assert int(c._engine.meta[L.M_RETIRED]) == 1
    c.sanity_check()
    for k in range(50):
        c.insert(InsertParams(key=RadixKey([k, k + 1]), value=np.array([1, 2])))
    live = c._engine.st.nodes[: int(c._engine.meta[L.M_HWM])]
    assert not (live[slot, L.FLAGS] & L.F_ALIVE)
    c.sanity_check()


def test_namespace_map_is_bounded_under_salt_churn():
    c = UnifiedRadixCache(page_size=1)
    ids = set()
    for i in range(6000):
        key = RadixKey([1, 2, 3], cache_salt=f"session{i}")
        c.insert(InsertParams(key=key, value=np.array([1, 2, 3])))
        ids.add(c._engine.ns.ids[(None, f"session{i}")])
        if i % 5 == 4:
            c.evict(EvictParams(num_tokens=12))  # the oldest sessions' nodes go
        assert len(c._engine.ns.ids) <= 2 * 1024 + c._engine.st.nodes.shape[0]
    assert len(ids) == 6000  # a dropped namespace's id is never reissued
    assert len(c._engine.ns.ids) < 3000
    c.sanity_check()
    # live namespaces still match, dropped ones miss (they hold nothing)
    assert c.match_prefix(RadixKey([1, 2, 3], cache_salt="session5999")).device_prefix_len == 3
    assert c.match_prefix(RadixKey([1, 2, 3], cache_salt="session0")).device_prefix_len == 0
