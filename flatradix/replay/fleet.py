"""A fleet: a trace through N instances behind a router (``flatradix replay
--instances N --router R``).

Each instance is a :class:`~flatradix.replay.scheduler.Scheduler` with its own
pools and cache (the same options, or a capacity each). Per request, in arrival
order: every instance's clock moves to its arrival (the arrival mode completes
what ended), the router picks an instance from the instances' state at that
moment, and that instance admits it as a lone engine would. With one instance
the run is exactly :func:`~flatradix.replay.sim.replay`'s.

Routers (:data:`ROUTERS`):

* ``kv``: the cost NVIDIA Dynamo's KV router minimises (docs "Routing Concepts",
  ``lib/kv-router/src/scheduling/selector`` in ai-dynamo/dynamo), per instance
  ``w``, in blocks of the page size ``P``::

      cost_w = overlap_weight * prefill_blocks_w + decode_blocks_w
      prefill_blocks_w = (active_prefill_tokens_w + prompt - overlap_w * P) / P
      decode_blocks_w  = active_blocks_w + ceil(prompt / P)

  ``overlap_w``: the request's leading pages instance ``w`` holds, read from its
  KV events (:class:`~flatradix.replay.pages.BlockIndex`, as Dynamo's indexer
  reads them; a test checks it against Dynamo's own indexer fed the same
  events); ``active_blocks_w``: the prompt blocks of its running requests;
  ``active_prefill_tokens_w``: the uncached prompt tokens of its requests still
  prefilling (arrival mode: admitted less than ``uncached / prefill_tps`` ago;
  the order mode has no clock: 0). Lowest cost wins; ties at random (seeded), as
  Dynamo at temperature 0. ``overlap_weight`` 1.0 is Dynamo's default
  (``--router-kv-overlap-score-weight``). Simplifications: blocks shared by
  running requests count once each request (Dynamo dedups them with
  ``assume_kv_reuse``), output blocks are not tracked (Dynamo's default), no
  softmax temperature. A running request's blocks are load, not overlap, until it
  completes (the replay caches a prompt at completion; SGLang after the prefill).
  Full attention without a host tier (the events it reads).
* ``prefix-hash``: consistent hashing of the prompt's first ``prefix_tokens``
  tokens (default: two hash blocks of the trace) on a ring of 160 points per
  instance: the same opening always goes to the same instance (session
  affinity), whatever the caches hold or the load.
* ``least-loaded``: the fewest requests in flight (running); ties: the fewest
  requests routed so far, then the lowest index.
* ``round-robin``: instance ``i mod N`` for the ``i``-th request.
* ``random``: uniform, seeded.
"""

import bisect
import hashlib
import heapq
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from ._progress import progress_bar
from .config import OPT_POLICY, ReplayConfig, pool_sizes
from .outcome import _pcts_ms, conservation, check
from .pages import BlockIndex, page_ids
from .scheduler import Scheduler, default_cache_factory

#: Router names (``--router``).
ROUTERS = ("kv", "prefix-hash", "least-loaded", "round-robin", "random")
#: ``overlap_weight`` when none is given: Dynamo's ``kv_overlap_score_weight`` default.
DEFAULT_OVERLAP_WEIGHT = 1.0
#: Hash blocks of the prompt the prefix-hash router hashes by default: one is often a
#: system prompt every request shares (all of Mooncake's conversation trace starts with
#: the same 512-token block: one instance would get everything); two tell its 7,373
#: conversations apart.
PREFIX_BLOCKS = 2
#: Points each instance has on the prefix-hash ring.
RING_POINTS = 160
#: Routers that never read the caches: ``policy="opt"`` can know their assignment.
STATELESS_ROUTERS = ("prefix-hash", "round-robin", "random")


# ---------------------------------------------------------------- routers
class RoundRobin:
    name = "round-robin"

    def __init__(self, fleet):
        self.n = len(fleet.instances)
        self.next = 0

    def route(self, fleet, i, toks):
        k = self.next
        self.next = (k + 1) % self.n
        return k


class Random:
    name = "random"

    def __init__(self, fleet):
        self.n = len(fleet.instances)
        self.rng = np.random.default_rng(fleet.seed)

    def route(self, fleet, i, toks):
        return int(self.rng.integers(self.n))


class LeastLoaded:
    name = "least-loaded"

    def __init__(self, fleet):
        pass

    def route(self, fleet, i, toks):
        return min(range(len(fleet.instances)),
                   key=lambda k: (len(fleet.instances[k].running), fleet.routed[k], k))


class PrefixHash:
    """Consistent hashing of the prompt's first ``prefix_tokens`` tokens."""

    name = "prefix-hash"

    def __init__(self, fleet):
        self.tokens = fleet.prefix_tokens
        ring = []
        for k in range(len(fleet.instances)):
            for v in range(RING_POINTS):
                ring.append((_h64(f"instance-{k}-{v}".encode()), k))
        ring.sort()
        self.points = [p for p, _ in ring]
        self.owner = [k for _, k in ring]

    def route(self, fleet, i, toks):
        h = _h64(np.ascontiguousarray(toks[:self.tokens], dtype=np.int64).tobytes())
        at = bisect.bisect_left(self.points, h) % len(self.points)
        return self.owner[at]


class KvRouter:
    """Dynamo's KV router cost (module docstring)."""

    name = "kv"

    def __init__(self, fleet):
        self.weight = fleet.overlap_weight
        self.rng = np.random.default_rng(fleet.seed)
        self.page = fleet.page_size

    def route(self, fleet, i, toks):
        page, n = self.page, len(toks)
        ids = page_ids(toks, page)[0].tolist()
        fleet.apply_events()
        index = fleet.index
        request_blocks = -(-n // page)
        best, ties = None, []
        for k in range(len(fleet.instances)):
            overlap = index.overlap(k, ids)
            fleet.last_overlaps[k] = overlap
            prefill = (fleet.prefilling(k) + n - overlap * page) / page
            decode = fleet.instances[k].active_blocks + request_blocks
            cost = self.weight * prefill + decode
            if best is None or cost < best:
                best, ties = cost, [k]
            elif cost == best:
                ties.append(k)
        return ties[0] if len(ties) == 1 else ties[int(self.rng.integers(len(ties)))]


_ROUTER_CLASSES = {c.name: c for c in (KvRouter, PrefixHash, LeastLoaded, RoundRobin, Random)}


def _h64(data):
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


# ---------------------------------------------------------------- the fleet
class Fleet:
    """N schedulers behind one router over ``workload``: ``configs`` one
    :class:`ReplayConfig` per instance (page size, mode and policy shared),
    ``router`` a name of :data:`ROUTERS`. ``seed``: the random router's and the
    kv router's tie-breaks; ``overlap_weight``: the kv router's; ``prefix_tokens``:
    the prefix-hash router's (default: two hash blocks of the trace)."""

    def __init__(self, workload, configs, router="kv", seed=0,
                 overlap_weight=DEFAULT_OVERLAP_WEIGHT, prefix_tokens=None, cache_factory=None):
        if router not in _ROUTER_CLASSES:
            raise ValueError(f"router must be one of {', '.join(ROUTERS)}, got {router!r}")
        cfg = configs[0]
        self.workload, self.configs, self.cfg = workload, configs, cfg
        self.page_size = cfg.page_size
        self.seed = seed
        self.overlap_weight = float(overlap_weight)
        self.prefix_tokens = int(prefix_tokens or PREFIX_BLOCKS * workload.block_size)
        kv = router == "kv"
        if kv and (cfg.hybrid or cfg.host):
            raise ValueError("the kv router reads Full-attention KV events: not with "
                             "swa_window, mamba_states or host_capacity (route those with "
                             "prefix-hash, least-loaded, round-robin or random)")
        factory = cache_factory
        if kv:
            if cfg.policy == OPT_POLICY:
                raise ValueError(_OPT_ROUTERS)
            factory = _events_factory(cache_factory or default_cache_factory)
        futures = self._opt_futures(router) if cfg.policy == OPT_POLICY else None
        self.instances = []
        for k, c in enumerate(configs):
            f = factory
            if futures is not None:
                from .opt import opt_factory
                f = opt_factory(futures[k])
            self.instances.append(Scheduler(workload, c, cache_factory=f))
        n = len(configs)
        self.routed = [0] * n
        self.assign = np.full(len(workload), -1, dtype=np.int64)
        self.index = BlockIndex(n, self.page_size) if kv else None
        self.last_overlaps = [0] * n
        self._prefill = [[] for _ in range(n)]    # arrival mode: (end ms, tokens) heaps
        self._prefill_tokens = [0] * n
        self.router = _ROUTER_CLASSES[router](self)

    def _opt_futures(self, router):
        # Belady needs each instance's future requests: known up front only when the
        # router never reads the caches (a dry run of the router gives them)
        if router not in STATELESS_ROUTERS:
            raise ValueError(_OPT_ROUTERS)
        from .opt import Future

        n = len(self.configs)
        probe = _ROUTER_CLASSES[router](_Probe(n, self))
        mine = [[] for _ in range(n)]
        for i in range(len(self.workload)):
            mine[probe.route(None, i, self.workload.tokens(i))].append(i)
        return [Future(self.workload, self.page_size, m) for m in mine]

    # ------------------------------------------------------------ router inputs
    def apply_events(self):
        """Hand every instance's queued KV events to the router's index."""
        for k, s in enumerate(self.instances):
            ev = s.cache.take_events()
            if ev:
                self.index.apply(k, ev)

    def prefilling(self, k):
        """Uncached prompt tokens of instance ``k``'s requests still prefilling."""
        heap = self._prefill[k]
        now = self.instances[k].running.clock
        while heap and heap[0][0] <= now:
            self._prefill_tokens[k] -= heapq.heappop(heap)[1]
        return self._prefill_tokens[k]

    # ------------------------------------------------------------ the run
    def step(self, i):
        """Request ``i``: every clock to its arrival, routed, admitted."""
        for s in self.instances:
            s.arrive(i)
        s0 = self.instances[0]
        toks = s0.tokens(i)[0][:s0.nin[i]]
        k = self.router.route(self, i, toks)
        s = self.instances[k]
        self.assign[i] = k
        self.routed[k] += 1
        s.admit(i)
        if self.cfg.timed and s.r_hit[i] >= 0:
            uncached = s.nin[i] - int(s.r_hit[i])
            end = s.r_decide[i] + 1e3 * uncached / self.cfg.arrival.prefill_tokens_per_s
            heapq.heappush(self._prefill[k], (end, uncached))
            self._prefill_tokens[k] += uncached
        return k

    def run(self, progress=False):
        """Every request through the fleet, then every instance drained; returns
        ``(wall seconds, CPU seconds)``."""
        n_req = len(self.workload)
        bar = progress_bar(n_req, progress, unit="req", smoothing=0.1)
        t0, c0 = time.perf_counter(), time.process_time()
        step = self.step
        for i in range(n_req):
            step(i)
            if bar is not None and i % 64 == 63:
                bar.update(64)
        for s in self.instances:
            s.drain()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if bar is not None:
            bar.close()
        return wall, cpu


def _events_factory(factory):
    """``factory`` building caches that queue KV events (what the kv router reads)."""
    def with_events(*a, **kw):
        return factory(*a, enable_kv_cache_events=True, **kw)
    return with_events


class _Probe:
    """What a stateless router's constructor reads, for a dry run."""

    def __init__(self, n, fleet):
        self.instances = [None] * n
        self.seed = fleet.seed
        self.prefix_tokens = fleet.prefix_tokens


_OPT_ROUTERS = ("policy 'opt' in a fleet needs the requests each instance will get in "
                "advance: a router that does not read the caches (prefix-hash, round-robin, "
                "random)")


# ---------------------------------------------------------------- the result
@dataclass
class FleetResult:
    """Figures of a fleet replay (:func:`fleet_replay`); ``to_dict()`` is the
    ``--json`` object. Per instance (``per_instance``): requests routed, hit
    ratio over its own prompt tokens, prefill tokens computed (prompt - hit of
    the requests it served), evictions, waits, peak tree; with ``--arrival`` its
    waits (``wait_ms``). ``balance``: max / mean over the instances of requests
    and prefill tokens (1.0: even)."""

    workload: str
    instances: int
    router: str
    capacity: object            # per instance: int tokens, "inf", or a list
    policy: str
    page_size: int
    max_running: int
    mode: str
    requests: int
    served_requests: int
    rejected_requests: int
    prompt_tokens: int
    hit_tokens: int
    token_hit_ratio: float
    evicted_tokens: int
    waits: int
    balance: dict
    per_instance: list
    kv_conserved: bool
    wall_s: float
    cpu_s: float
    requests_per_s: float
    warmup_s: float = 0.0
    router_params: dict = field(default_factory=dict)
    arrival: object = None      # arrival mode: fleet-wide waits (wait_ms, waited_requests)
    notes: list = field(default_factory=list)

    def to_dict(self):
        return asdict(self)


def _instance(s, k, mine, workload):
    c, cfg = s.c, s.cfg
    prompt = int(workload.input_lengths[mine].sum())
    served = mine[s.r_hit[mine] >= 0]
    prefill = int((workload.input_lengths[served] - s.r_hit[served]).sum())
    d = {"instance": k, "capacity": "inf" if cfg.unbounded else int(cfg.capacity),
         "pool_slots": s.sizes.slots, "requests": int(len(mine)),
         "served_requests": int(len(served)), "rejected_requests": int(c.rejected),
         "prompt_tokens": prompt, "hit_tokens": int(c.hit_tokens),
         "token_hit_ratio": c.hit_tokens / prompt if prompt else 0.0,
         "prefill_tokens": prefill, "evicted_tokens": int(c.evicted),
         "evict_calls": int(c.evict_calls), "waits": int(c.waits),
         "peak_tree_tokens": int(c.peak)}
    if cfg.timed:
        wait = s.r_decide[mine] - s.arrive_ms[mine]
        d.update(waited_requests=int((wait > 0).sum()), wait_ms=_pcts_ms(wait),
                 slot_waits=int(c.slot_waits))
    return d


def _max_over_mean(xs):
    m = sum(xs) / len(xs) if xs else 0
    return round(max(xs) / m, 4) if m else 1.0


def fleet_result(fleet, wall, cpu, warmup_s=0.0):
    """The :class:`FleetResult` of a run :class:`Fleet` (each instance checked
    first when its config says ``check``)."""
    w, cfg = fleet.workload, fleet.cfg
    conserved = True
    per = []
    for k, s in enumerate(fleet.instances):
        conserved &= conservation(s)[0]
        if s.cfg.check:
            check(s)
        per.append(_instance(s, k, np.flatnonzero(fleet.assign == k), w))
    hit = sum(p["hit_tokens"] for p in per)
    rejected = sum(p["rejected_requests"] for p in per)
    caps = [p["capacity"] for p in per]
    notes = []
    arrival = None
    if cfg.timed:
        decide = np.zeros(len(w))
        for k, s in enumerate(fleet.instances):
            mine = fleet.assign == k
            decide[mine] = s.r_decide[mine]
        wait = decide - fleet.instances[0].arrive_ms
        arrival = {"waited_requests": int((wait > 0).sum()), "wait_ms": _pcts_ms(wait),
                   "prefill_tokens_per_s": cfg.arrival.prefill_tokens_per_s,
                   "decode_tokens_per_s": cfg.arrival.decode_tokens_per_s,
                   "rate_scale": cfg.arrival.rate_scale}
    if rejected:
        notes.append(f"{rejected:,} request{'' if rejected == 1 else 's'} rejected (more KV "
                     f"than an instance's pool, or short with nothing running)")
    return FleetResult(
        workload=w.name, instances=len(fleet.instances), router=fleet.router.name,
        capacity=caps[0] if len(set(map(str, caps))) == 1 else caps, policy=cfg.policy,
        page_size=cfg.page_size, max_running=cfg.max_running,
        mode="arrival" if cfg.timed else "order", requests=len(w),
        served_requests=len(w) - rejected, rejected_requests=rejected,
        prompt_tokens=w.prompt_tokens, hit_tokens=hit,
        token_hit_ratio=hit / w.prompt_tokens if w.prompt_tokens else 0.0,
        evicted_tokens=sum(p["evicted_tokens"] for p in per),
        waits=sum(p["waits"] for p in per),
        balance={"requests": _max_over_mean([p["requests"] for p in per]),
                 "prefill_tokens": _max_over_mean([p["prefill_tokens"] for p in per])},
        per_instance=per, kv_conserved=bool(conserved), wall_s=wall, cpu_s=cpu,
        requests_per_s=len(w) / wall if wall > 0 else float("inf"),
        warmup_s=round(warmup_s, 3),
        router_params=_router_params(fleet), arrival=arrival, notes=notes)


def _router_params(fleet):
    name = fleet.router.name
    if name == "kv":
        return {"overlap_weight": fleet.overlap_weight, "seed": fleet.seed,
                "block_size": fleet.page_size}
    if name == "prefix-hash":
        return {"prefix_tokens": fleet.prefix_tokens, "ring_points": RING_POINTS}
    if name == "random":
        return {"seed": fleet.seed}
    return {}


def fleet_replay(workload, instances=2, router="kv", capacity=None, seed=0,
                 overlap_weight=DEFAULT_OVERLAP_WEIGHT, prefix_tokens=None, progress=False,
                 cache_factory=None, **options):
    """Replay ``workload`` through ``instances`` schedulers behind ``router``;
    returns a :class:`FleetResult`.

    ``capacity``: each instance's KV pool (tokens; ``None`` unbounded), or a
    list of one per instance. ``options``: :func:`~flatradix.replay.sim.replay`'s
    (``page_size``, ``policy``, ``max_running``, ``arrival``, the modes...), the
    same for every instance. ``ValueError`` for an unknown router, ``instances <
    1``, a capacity list of another length, the kv router with a hybrid model or a
    host tier, ``policy="opt"`` with a router that reads the caches."""
    from .sim import warm_up_for

    instances = int(instances)
    if instances < 1:
        raise ValueError(f"instances must be >= 1, got {instances}")
    caps = list(capacity) if isinstance(capacity, (list, tuple)) else [capacity] * instances
    if len(caps) != instances:
        raise ValueError(f"capacity lists {len(caps)} pools for {instances} instances")
    base = ReplayConfig(**options)
    configs = [base.with_(capacity=c) for c in caps]
    if base.timed and not getattr(workload, "has_timestamps", True):
        raise ValueError(f"{workload.name}: the arrival mode needs timestamps, and this trace "
                         f"has none")
    for c in configs:
        pool_sizes(c, workload)         # an SWA pool below a page: refused before the run
    warmup_s = warm_up_for(base)
    if router == "kv":
        warmup_s += _warm_events()
    fleet = Fleet(workload, configs, router, seed=seed, overlap_weight=overlap_weight,
                  prefix_tokens=prefix_tokens, cache_factory=cache_factory)
    wall, cpu = fleet.run(progress)
    return fleet_result(fleet, wall, cpu, warmup_s)


_events_warm = []


def _warm_events():
    """Compile (or load) the KV event kernels once per process; seconds."""
    if _events_warm:
        return 0.0
    _events_warm.append(True)
    t = time.perf_counter()
    from .. import EvictParams, InsertParams, RadixKey, TokenToKVPoolAllocator

    alloc = TokenToKVPoolAllocator(64)
    c = default_cache_factory(1, "lru", alloc, None, enable_kv_cache_events=True)
    v = alloc.alloc(8)
    c.insert(InsertParams(key=RadixKey(np.arange(8, dtype=np.int64)), value=v))
    c.evict(EvictParams(num_tokens=8))
    c.take_events()
    return time.perf_counter() - t

