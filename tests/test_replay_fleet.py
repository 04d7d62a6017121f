"""A fleet of instances behind a router (``flatradix/replay/fleet.py``): with one
instance it is the single replay, request by request; each router sends a
hand-worked 3-instance scenario where the rules say; the per-instance figures
add up; ``policy="opt"`` per instance is the single-instance optimum of its
requests. The kv router's view of the caches is checked against Dynamo's
indexer in ``tests/test_router_dynamo.py``."""

import numpy as np
import pytest

from flatradix.replay import ArrivalModel, replay, synthetic_workload
from flatradix.replay.fleet import Fleet, fleet_replay
from flatradix.replay.config import ReplayConfig
from flatradix.replay.sim import warm_up_for

from .test_replay_opt import _workload

#: 1 token a millisecond for prefill and decode: a request of n prompt tokens (none
#: cached) and o outputs holds its KV for n + o ms
CLOCK = ArrivalModel(prefill_tokens_per_s=1000.0, decode_tokens_per_s=1000.0)
LONG = 10 ** 6          # outputs that keep a request running for ~17 minutes


def _timed(prompts, outputs, times):
    w = _workload(prompts, outputs)
    w.timestamps = np.array(times, dtype=float)
    return w


def _fleet(w, router, **kw):
    kw.setdefault("page_size", 1)
    seed = kw.pop("seed", 0)
    cfg = ReplayConfig(**kw)
    warm_up_for(cfg)
    f = Fleet(w, [cfg] * 3, router, seed=seed)
    f.run()
    return f


@pytest.mark.parametrize("kw", [
    dict(capacity=6_000, max_running=3),
    dict(capacity=6_000, arrival=ArrivalModel(rate_scale=60)),
    dict(capacity=20_000, swa_window=4_000, max_running=2, page_size=4),
    dict(capacity=20_000, mamba_states=40, mamba_extra_buffer=True, max_running=2),
    dict(capacity=4_000, host_capacity=8_000, max_running=2, load_back_threshold=1),
])
@pytest.mark.parametrize("router", ["kv", "round-robin", "least-loaded", "prefix-hash",
                                    "random"])
def test_one_instance_is_the_single_replay(kw, router):
    w = synthetic_workload(120, seed=3)
    if router == "kv" and ("swa_window" in kw or "mamba_states" in kw or "host_capacity" in kw):
        with pytest.raises(ValueError, match="kv router"):
            fleet_replay(w, instances=1, router=router, **kw)
        return
    one = replay(w, record_hits=True, **kw)
    f = fleet_replay(w, instances=1, router=router, **kw)
    assert f.hit_tokens == one.hit_tokens and f.evicted_tokens == one.evicted_tokens
    assert f.rejected_requests == one.rejected_requests and f.waits == one.waits
    assert f.per_instance[0]["requests"] == len(w) and f.kv_conserved


def test_kv_router_hand_worked():
    """Seed 8: the kv router's tie draws (numpy default_rng(8).integers(#ties)) are
    2, 0, 0 (of 3) then 1 (of 2). Page 1, unbounded pools, 1 token/ms; requests
    100 ms apart finish before the next unless they decode for long, so the cost
    of instance w is (n - overlap_w) + active_blocks_w + n."""
    A, B, D = [1, 2, 3, 4], [5, 6, 7, 8], list(range(100, 120))
    prompts = [A, B, A + [9], B + [10, 11], D, B + [10, 11], A + [9]]
    outputs = [0, 0, 0, 0, LONG, 0, 0]
    w = _timed(prompts, outputs, [0, 100, 200, 300, 400, 500, 600])
    f = _fleet(w, "kv", arrival=CLOCK, seed=8)
    # r0 A: every cost 8, a tie of 3: draw 2. r1 B: a tie of 3 (no overlap): draw 0.
    # r2 A+[9]: instance 2 holds A (overlap 4): cost 5 + 0 + 5 - 4 = 6 against 10.
    # r3 B+[10, 11]: instance 0 holds B: 12 - 4 = 8 against 12.
    # r4 D (20 tokens, decodes for ~17 minutes): no overlap, a tie of 3: draw 0.
    # r5 B+[10, 11]: instance 0 holds all 6 tokens but runs D (20 active blocks):
    #    cost 0 + 20 + 6 = 26; instances 1 and 2: 6 + 0 + 6 = 12, a tie of 2: draw 1
    #    -> instance 2 (the load term outweighs the overlap).
    # r6 A+[9]: instance 2 holds it (r2): 0 + 0 + 5 = 5.
    assert f.assign.tolist() == [2, 0, 2, 0, 0, 2, 2]
    hits = [f.instances[k].r_hit[i] for i, k in enumerate(f.assign)]
    assert hits == [0, 0, 4, 4, 0, 0, 5]


def test_kv_router_counts_the_prefill_in_flight():
    """A 3,000-token prompt prefills for 3 s (1 token/ms): while it does, its
    instance's prefill term holds it. Seed 8 as above (draws 2, then 0 of 3)."""
    big = list(range(1000, 4000))
    A = [1, 2, 3, 4, 5, 6]
    w = _timed([A, big, A + [7]], [0, 0, 0], [0, 100, 200])
    cfg = ReplayConfig(page_size=1, arrival=CLOCK)
    warm_up_for(cfg)
    f = Fleet(w, [cfg] * 3, "kv", seed=8)
    # r0 A: a tie of 3, draw 2. r1 big: a tie of 3 (nothing it shares), draw 0.
    assert [f.step(0), f.step(1)] == [2, 0]
    for s in f.instances:
        s.arrive(2)
    # at 200 ms: big (admitted at 100 ms, nothing cached) prefills until 3,100 ms
    assert [f.prefilling(k) for k in range(3)] == [3000, 0, 0]
    assert [s.active_blocks for s in f.instances] == [3000, 0, 0]
    # r2 A+[7]: instance 2 holds A: (7 - 6) + 0 + 7 = 8; instance 1: 7 + 0 + 7 = 14;
    # instance 0: (3,000 + 7) + (3,000 + 7) = 6,014
    assert f.step(2) == 2


def test_least_loaded_hand_worked():
    prompts = [[1], [2], [3], [4], [5]]
    outputs = [LONG, LONG, 0, LONG, 0]
    w = _timed(prompts, outputs, [0, 1, 2, 10, 11])
    f = _fleet(w, "least-loaded", arrival=CLOCK)
    # r0: none running: instance 0. r1: running [1, 0, 0]: 1. r2: [1, 1, 0]: 2 (ends at
    # 3 ms). r3 at 10 ms: [1, 1, 0]: 2. r4 at 11 ms: [1, 1, 1], routed so far [1, 1, 2]:
    # the first with the fewest routed, 0.
    assert f.assign.tolist() == [0, 1, 2, 2, 0]


def test_round_robin_and_random_hand_worked():
    w = _workload([[i] for i in range(7)], [0] * 7)
    assert _fleet(w, "round-robin").assign.tolist() == [0, 1, 2, 0, 1, 2, 0]
    # random: one draw a request, numpy default_rng(seed).integers(3)
    rng = np.random.default_rng(5)
    assert _fleet(w, "random", seed=5).assign.tolist() == [int(rng.integers(3))
                                                           for _ in range(7)]


def _ring_owner(head, n):
    """The documented rule, computed apart: 160 points an instance at
    blake2b-64("instance-{k}-{v}") (little-endian), the opening's int64 bytes hashed
    the same way, the first point at or after it (wrapping) owns it."""
    import bisect
    import hashlib

    def h(b):
        return int.from_bytes(hashlib.blake2b(b, digest_size=8).digest(), "little")

    ring = sorted((h(f"instance-{k}-{v}".encode()), k) for k in range(n) for v in range(160))
    x = h(np.array(head, dtype=np.int64).tobytes())
    return ring[bisect.bisect_left([p for p, _ in ring], x) % len(ring)][1]


def test_prefix_hash_hand_worked():
    """Block size 1: the opening is the first two tokens. [1, 2] hashes to instance 2,
    [3, 4] to 1, [11, 12] to 0, a lone [1] to 0 (the ring above); what follows the
    opening, the caches (a pool of 5 tokens: little stays) and the load (two requests
    in flight) do not matter."""
    prompts = [[1, 2, 50], [3, 4], [11, 12, 13, 14], [1, 2, 60, 61], [3, 4, 70], [11, 12],
               [1]]
    w = _workload(prompts, [0] * 7)
    f = _fleet(w, "prefix-hash", capacity=5, max_running=2)
    assert f.assign.tolist() == [2, 1, 0, 2, 1, 0, 0]
    assert f.assign.tolist() == [_ring_owner(p[:2], 3) for p in prompts]


def test_prefix_hash_is_sticky_and_consistent():
    # the same opening (two blocks: 32 tokens of the synthetic trace) always lands on
    # the same instance, whatever follows it
    w = synthetic_workload(400, seed=6)
    f = _fleet(w, "prefix-hash", capacity=50_000)
    first = {}
    for i, k in enumerate(f.assign.tolist()):
        head = tuple(w.tokens(i)[:32])
        assert first.setdefault(head, k) == k
    # consistent hashing: 3 -> 4 instances moves about 1/4 of the openings (never
    # between the old three)
    heads = [np.arange(16, dtype=np.int64) + 16 * j for j in range(3000)]
    from flatradix.replay.fleet import PrefixHash, _Probe

    def owners(n):
        r = PrefixHash(_Probe(n, type("F", (), {"seed": 0, "prefix_tokens": 16})()))
        return [r.route(None, 0, h) for h in heads]

    a, b = owners(3), owners(4)
    moved = [x != y for x, y in zip(a, b)]
    assert all(y == 3 for x, y, m in zip(a, b, moved) if m)
    assert 0.15 < sum(moved) / len(heads) < 0.35
    assert all(0.2 < a.count(k) / len(a) < 0.47 for k in range(3))


def test_fleet_figures_add_up():
    w = synthetic_workload(300, seed=9)
    f = fleet_replay(w, instances=3, router="round-robin", capacity=8_000, max_running=2,
                     arrival=ArrivalModel(rate_scale=40))
    per = f.per_instance
    assert [p["requests"] for p in per] == [100, 100, 100]
    assert sum(p["hit_tokens"] for p in per) == f.hit_tokens
    assert sum(p["prompt_tokens"] for p in per) == f.prompt_tokens
    assert sum(p["evicted_tokens"] for p in per) == f.evicted_tokens
    assert f.balance["requests"] == 1.0
    pre = [p["prefill_tokens"] for p in per]
    assert f.balance["prefill_tokens"] == round(max(pre) / (sum(pre) / 3), 4)
    for p in per:
        assert p["prefill_tokens"] <= p["prompt_tokens"] - p["hit_tokens"]
        assert set(p["wait_ms"]) == {"p50", "p99", "max", "mean"}
    d = f.to_dict()
    assert d["instances"] == 3 and d["router"] == "round-robin" and "token_hit_ratio" in d
    assert f.arrival["waited_requests"] == sum(p["waited_requests"] for p in per)


def test_opt_in_a_fleet_is_each_instances_own_optimum():
    w = synthetic_workload(240, seed=2)
    f = fleet_replay(w, instances=3, router="round-robin", capacity=6_000, policy="opt")
    for k, p in enumerate(f.per_instance):
        mine = np.arange(k, len(w), 3)
        sub = _subset(w, mine)
        assert replay(sub, capacity=6_000, policy="opt").hit_tokens == p["hit_tokens"]
        assert replay(sub, capacity=6_000, policy="lru").hit_tokens <= p["hit_tokens"]
    for router in ("kv", "least-loaded"):
        with pytest.raises(ValueError, match="does not read the caches"):
            fleet_replay(w, instances=2, router=router, policy="opt")


def _subset(w, idx):
    from flatradix.replay.trace import Workload

    ptr = w.hash_ptr
    ids = np.concatenate([w.hash_ids[ptr[i]:ptr[i + 1]] for i in idx])
    lens = np.diff(ptr)[idx]
    return Workload("sub", w.block_size, w.timestamps[idx], w.input_lengths[idx],
                    w.output_lengths[idx], np.concatenate(([0], np.cumsum(lens))), ids)


@pytest.mark.parametrize("bad,match", [
    (dict(router="nope"), "router must be one of"),
    (dict(instances=0), "instances must be >= 1"),
    (dict(capacity=[1_000, 2_000], instances=3), "2 pools for 3 instances"),
    (dict(router="kv", swa_window=64), "kv router"),
])
def test_fleet_refuses(bad, match):
    kw = dict(instances=2, router="round-robin")
    kw.update(bad)
    with pytest.raises(ValueError, match=match):
        fleet_replay(synthetic_workload(5), **kw)


# ---------------------------------------------------------------- the command line
def test_cli_fleet_json_and_csv(tmp_path, capsys):
    import csv
    import json

    from flatradix.cli import main

    csv_path = tmp_path / "f.csv"
    assert main(["replay", "--limit", "90", "--instances", "3", "--router", "kv,round-robin",
                 "--capacity", "8k", "--json", "--no-progress", "--csv", str(csv_path)]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert [(r["instances"], r["router"]) for r in runs] == [(3, "kv"), (3, "round-robin")]
    for r in runs:
        assert 0 <= r["token_hit_ratio"] <= 1 and len(r["per_instance"]) == 3
    rows = list(csv.DictReader(open(csv_path)))
    assert [r["instance"] for r in rows] == ["fleet", "0", "1", "2"] * 2


def test_cli_fleet_sweep_over_instances(tmp_path, capsys):
    import json

    from flatradix.cli import main

    pytest.importorskip("matplotlib")
    png = tmp_path / "f.png"
    assert main(["replay", "--limit", "90", "--instances", "1,2", "--router",
                 "round-robin,prefix-hash", "--policy", "lru,opt", "--sweep", "16k",
                 "--split-capacity", "--json", "--no-progress", "--plot", str(png)]) == 0
    curve = json.loads(capsys.readouterr().out)
    pts = curve["points"]
    assert {(p["instances"], p["router"], p["policy"]) for p in pts} == {
        (n, r, p) for n in (1, 2) for r in ("round-robin", "prefix-hash") for p in ("lru", "opt")}
    for p in pts:
        assert p["fleet_capacity"] == 16_000 and p["capacity"] == 16_000 // p["instances"]
        assert p["opt_hit_ratio"] >= p["token_hit_ratio"]
        assert p["capacity_gap"] + p["policy_gap"] == pytest.approx(
            p["ceiling_hit_ratio"] - p["token_hit_ratio"])
    assert len(curve["unbounded"]) == 4 and png.stat().st_size > 0


@pytest.mark.parametrize("args,needle", [
    (["--router", "kv"], "--router needs --instances"),
    (["--split-capacity"], "--split-capacity needs --instances"),
    (["--instances", "2", "--router", "kv", "--swa-window", "64"], "--router kv reads"),
    (["--instances", "2", "--router", "kv", "--policy", "opt"], "--policy opt in a fleet"),
    (["--policy", "opt", "--mamba-states", "4"], "--policy opt"),
    (["--instances", "2", "--overlap-weight", "2", "--router", "random"],
     "--overlap-weight needs --router kv"),
    (["--instances", "2", "--per-request", "x.csv"], "--per-request is for a single instance"),
    (["--backend", "dask"], "--backend runs sweep points"),
    (["--instances", "0"], "argument --instances"),
    (["--instances", "2", "--router", "nope"], "argument --router"),
])
def test_cli_fleet_refuses(args, needle, capsys):
    from flatradix.cli import main

    try:
        rc = main(["replay", *args])
    except SystemExit as e:      # argparse's own errors
        rc = e.code
    assert rc == 2
    assert needle in capsys.readouterr().err
