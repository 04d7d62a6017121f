"""The replay's parts: ``ReplayConfig`` checks what ``replay`` checks, before
anything is built; ``Scheduler`` instances hold no shared state, so several run
side by side (what a fleet behind a router needs): interleaving two schedulers'
admissions gives each exactly the run it gives alone."""

import dataclasses

import numpy as np
import pytest

from flatradix.replay import ArrivalModel, ReplayConfig, Scheduler, replay, synthetic_workload
from flatradix.replay.config import ARRIVAL_MAX_RUNNING, pool_sizes
from flatradix.replay.outcome import build_result
from flatradix.replay.sim import warm_up_for


def test_config_resolves_the_defaults_by_mode():
    c = ReplayConfig(capacity=1000)
    assert c.max_running == 1 and c.page_size == 16 and c.swa_ratio is None
    a = c.with_(arrival=ArrivalModel())
    # the mode's default follows the change; dataclasses.replace keeps the resolved value
    assert a.max_running == ARRIVAL_MAX_RUNNING
    assert dataclasses.replace(c, arrival=ArrivalModel()).max_running == 1
    s = c.with_(swa_window=64)
    assert (s.swa_ratio, s.swa_eviction_interval, s.swa, s.hybrid) == (0.8, 128, True, True)
    m = ReplayConfig(mamba_states=4, page_size=1)
    assert (m.mamba_chunk, m.mamba, m.triple, m.unbounded) == (64, True, False, True)
    h = ReplayConfig(host_capacity=10)
    assert (h.write_policy, h.load_back_threshold, h.host) == ("write_through", 10, True)


@pytest.mark.parametrize("kw", [
    dict(swa_window=0), dict(swa_ratio=0.5), dict(mamba_states=4),   # page 16 without extra
    dict(mamba_extra_buffer=True), dict(host_capacity=-1), dict(write_policy="x"),
    dict(max_running=0), dict(page_size=0), dict(capacity=0), dict(driver="x"),
    dict(swa_window=1.5), dict(arrival=1),
])
def test_config_raises_what_replay_raises(kw):
    w = synthetic_workload(3)
    with pytest.raises((ValueError, TypeError)) as a:
        ReplayConfig(**kw)
    with pytest.raises((ValueError, TypeError)) as b:
        replay(w, **kw)
    assert (type(a.value), str(a.value)) == (type(b.value), str(b.value))


def _alone(w, cfg, requests):
    s = Scheduler(w, cfg)
    for i in requests:
        s.arrive(i)
        s.admit(i)
    s.drain()
    return build_result(s, 0.0, 0.0)


@pytest.mark.parametrize("kw", [
    dict(capacity=6_000, max_running=3),
    dict(capacity=6_000, arrival=ArrivalModel(rate_scale=50)),
    dict(capacity=20_000, swa_window=4_000, swa_eviction_interval=16, max_running=2,
         page_size=4),
    dict(capacity=20_000, mamba_states=40, mamba_extra_buffer=True, max_running=2),
    dict(capacity=4_000, host_capacity=8_000, max_running=2, load_back_threshold=1),
])
def test_schedulers_side_by_side_are_independent(kw):
    w = synthetic_workload(160, seed=5)
    cfg = ReplayConfig(record_requests=True, record_hits=True, **kw)
    warm_up_for(cfg)
    even, odd = range(0, len(w), 2), range(1, len(w), 2)
    ra, rb = _alone(w, cfg, even), _alone(w, cfg, odd)
    a, b = Scheduler(w, cfg), Scheduler(w, cfg)
    for i in range(len(w)):
        a.arrive(i)     # both clocks move to each arrival, as behind a router
        b.arrive(i)
        (a if i % 2 == 0 else b).admit(i)
    a.drain()
    b.drain()
    ia, ib = build_result(a, 0.0, 0.0), build_result(b, 0.0, 0.0)
    for alone, mixed in ((ra, ia), (rb, ib)):
        assert np.array_equal(alone.hits, mixed.hits)
        d1, d2 = alone.to_dict(), mixed.to_dict()
        for k in ("latency_us", "arrival"):
            d1.pop(k), d2.pop(k)
        assert d1 == d2
        assert alone.hit_tokens > 0 and alone.kv_conserved
    # the two halves partition the requests (a rejected or unserved request is -1)
    assert ((ia.hits >= 0) & (ib.hits >= 0)).sum() == 0


def test_scheduler_run_is_replay():
    w = synthetic_workload(120, seed=2)
    cfg = ReplayConfig(capacity=5_000, max_running=2, record_hits=True)
    s = Scheduler(w, cfg, sizes=pool_sizes(cfg, w))
    s.run()
    mine = build_result(s, 0.0, 0.0)
    theirs = replay(w, capacity=5_000, max_running=2, record_hits=True)
    assert np.array_equal(mine.hits, theirs.hits)
    assert (mine.hit_tokens, mine.evicted_tokens, mine.waits) == \
        (theirs.hit_tokens, theirs.evicted_tokens, theirs.waits)


@pytest.mark.parametrize("max_running", [1, 3])
def test_core_driver_with_cached_outputs_matches_the_reference(max_running):
    """The core driver caching outputs with requests in flight: an insert that finds
    part of the prompt already cached frees those slots as duplicates, and the
    prompt's second insert (priority + 1) passes the tree's slots (it passed the
    freed ones: 'KV slot ... is free in the allocator')."""
    from .test_replay import reference_factory

    w = synthetic_workload(300, seed=3)
    kw = dict(capacity=9_000, driver="core", max_running=max_running, cache_outputs=True,
              record_hits=True)
    mine = replay(w, **kw)
    ref = replay(w, cache_factory=reference_factory, **kw)
    assert np.array_equal(mine.hits, ref.hits) and mine.kv_conserved
    assert (mine.evicted_tokens, mine.waits) == (ref.evicted_tokens, ref.waits)
