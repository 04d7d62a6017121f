"""What a replay reports: :class:`ReplayResult` (one run's figures, ``to_dict()``
the ``--json`` object), the hybrid modes' field lists (:class:`HybridMode`,
:func:`hybrid_mode`), latency summaries and the arrival mode's
:func:`timeline`."""

from dataclasses import asdict, dataclass, field

import numpy as np

OPS = ("match_prefix", "inc_lock_ref", "evict", "cache_finished_req")
#: The SWA mode's operations (``inc_lock_ref`` is ``cache.lock`` there).
SWA_OPS = OPS[:3] + ("evict_sliding_windows", "cache_finished_req")
#: The extra-buffer Mamba mode's operations (``checkpoint``: after each prefill;
#: ``cache_finished_req`` is its new name ``release_kv_cache`` there).
MAMBA_EXTRA_OPS = OPS[:3] + ("checkpoint", "cache_finished_req")
#: The host tier mode's operations (``loading_check``: ``ready_to_load_host_cache``
#: and ``loading_check`` after a load; ``check_hicache_events``: each step's poll).
HOST_OPS = ("match_prefix", "init_load_back", "inc_lock_ref", "evict", "loading_check",
            "cache_finished_req", "check_hicache_events")

@dataclass
class ReplayResult:
    """Figures of one replay (see :func:`~flatradix.replay.sim.replay`); ``to_dict()`` is the ``--json`` object."""

    workload: str
    capacity: object              # int tokens, or "inf"
    pool_slots: int               # allocator size actually used (<= capacity)
    page_size: int
    max_running: int
    policy: str
    cache_outputs: bool
    requests: int
    served_requests: int
    rejected_requests: int
    prompt_tokens: int            # all requests' prompts (a rejected one counts as a miss)
    output_tokens: int
    hit_tokens: int
    token_hit_ratio: float
    evicted_tokens: int
    evict_calls: int
    waits: int                    # completions waited for because KV was short
    peak_tree_tokens: int
    final_tree_tokens: int
    kv_conserved: bool
    wall_s: float                 # the replay loop (JIT warm-up excluded: warmup_s)
    cpu_s: float                  # process CPU time of the loop (wall_s minus waiting for a core)
    requests_per_s: float
    prompt_tokens_per_s: float
    warmup_s: float = 0.0         # first replay in a process: kernel compile / cache load
    latency_us: dict = field(default_factory=dict)   # op -> {count, p50, p99, mean}
    mode: str = "order"           # "order" or "arrival"
    arrival: object = None        # arrival mode: dict (see replay), else None
    notes: list = field(default_factory=list)        # why requests were rejected, etc.
    hits: object = None           # int64 (requests,) per-request hit, -1 rejected (record_hits)
    per_request: object = None    # dict of (requests,) arrays (record_requests)
    # SWA and SWA + Mamba modes (None otherwise; left out of to_dict then)
    swa_window: object = None             # W, tokens
    swa_ratio: object = None              # SWA pool / Full pool (swa_full_tokens_ratio)
    swa_pool_slots: object = None         # SWA allocator size actually used
    swa_evicted_tokens: object = None     # SWA tokens evicted (EvictResult.swa_num_tokens_evicted)
    window_lost_hit_tokens: object = None  # sum of full_kv_hit_length (SWA + Mamba: the
                                           # deepest state on the path) - device_prefix_len
                                           # (host tier: - the hit and declined host hit)
    swa_slid_tokens: object = None        # SWA slots freed by evict_sliding_windows
    peak_swa_tree_tokens: object = None   # SWA tokens the tree held at most (after completions)
    final_swa_tree_tokens: object = None
    # Mamba and SWA + Mamba modes (None otherwise; left out of to_dict then)
    mamba_states: object = None           # N, the state pool asked for
    mamba_pool_slots: object = None       # state slots actually allocated (<= N)
    mamba_chunk: object = None            # mamba_cache_chunk_size
    mamba_extra_buffer: object = None     # bool: served with the extra buffer (ping-pong)
    mamba_evicted_states: object = None   # EvictResult.mamba_num_evicted, summed
    checkpoint_lost_hit_tokens: object = None  # sum of full_kv_hit_length - device_prefix_len
                                               # (SWA + Mamba: - the deepest state on the path;
                                               # host tier: - the hit and declined host hit)
    mamba_waits: object = None            # completions waited for because no state slot was free
    peak_mamba_tree_states: object = None  # states the tree held at most (after completions;
                                           # extra buffer: and checkpoints)
    final_mamba_tree_states: object = None
    # host tier mode (None otherwise; left out of to_dict then). hit_tokens and
    # token_hit_ratio count both tiers there: device_hit_tokens + host_hit_tokens
    host_capacity: object = None          # H, tokens (or "inf")
    host_pool_slots: object = None        # host pool size actually used (<= H)
    write_policy: object = None           # write_through / write_through_selective
    load_back_threshold: object = None    # host hits below this are recomputed
    device_hit_tokens: object = None      # prompt tokens found on the device
    host_hit_tokens: object = None        # prompt tokens loaded back from the host
    miss_tokens: object = None            # prompt tokens computed (prompt - both hits)
    device_hit_ratio: object = None       # device_hit_tokens / prompt_tokens
    host_hit_ratio: object = None         # host_hit_tokens / prompt_tokens
    load_backs: object = None             # loads committed (served requests' and rejected)
    loaded_tokens: object = None          # tokens loaded back (host hits + rejected requests')
    declined_host_tokens: object = None   # host hits not loaded (below the threshold, or
                                          # no device slots): recomputed
    load_evicted_tokens: object = None    # device tokens init_load_back evicted (in
                                          # evicted_tokens too)
    peak_host_tree_tokens: object = None  # host tokens the tree held at most
    final_host_tree_tokens: object = None
    backed_up_tokens: object = None       # Full tokens copied to the host (backups)
    host_evicted_tokens: object = None    # Full host tokens freed (host evictions, and the
                                          # host copies of nodes deleted with them)
    # host tier with the SWA mode (None otherwise; left out of to_dict then)
    swa_host_pool_slots: object = None    # SWA host pool (tokens) actually used
    swa_backed_up_tokens: object = None   # SWA tokens copied to the host
    swa_host_loaded_tokens: object = None  # SWA tokens loaded back (the windows restored)
    swa_host_evicted_tokens: object = None  # SWA host tokens freed
    load_swa_evicted_tokens: object = None  # SWA device tokens the loads evicted (in
                                            # swa_evicted_tokens too)
    peak_swa_host_tree_tokens: object = None  # SWA host tokens the tree held at most
    final_swa_host_tree_tokens: object = None
    # host tier with the Mamba mode (None otherwise; left out of to_dict then)
    mamba_host_pool_slots: object = None  # host state pool (states) actually used
    backed_up_states: object = None       # states copied to the host
    host_state_loads: object = None       # loads that restored a state from the host
    host_evicted_states: object = None    # host states freed
    load_evicted_states: object = None    # device states the loads evicted (in
                                          # mamba_evicted_states too)
    peak_host_tree_states: object = None  # host states the tree held at most
    final_host_tree_states: object = None

    def to_dict(self):
        d = asdict(self)
        d.pop("hits")
        d.pop("per_request")
        for mode in (SWA_MODE, MAMBA_MODE, HOST_MODE):
            if getattr(self, mode.param) is None:
                for k in mode.fields:
                    d.pop(k)
        for fields, param in ((HOST_SWA_FIELDS, "swa_window"), (HOST_MAMBA_FIELDS, "mamba_states")):
            if self.host_capacity is None or getattr(self, param) is None:
                for k in fields:
                    d.pop(k)
        return d


#: ``ReplayResult`` fields of the SWA mode.
SWA_FIELDS = ("swa_window", "swa_ratio", "swa_pool_slots", "swa_evicted_tokens",
              "window_lost_hit_tokens", "swa_slid_tokens", "peak_swa_tree_tokens",
              "final_swa_tree_tokens")
#: ``ReplayResult`` fields of the Mamba mode.
MAMBA_FIELDS = ("mamba_states", "mamba_pool_slots", "mamba_chunk", "mamba_extra_buffer",
                "mamba_evicted_states",
                "checkpoint_lost_hit_tokens", "mamba_waits", "peak_mamba_tree_states",
                "final_mamba_tree_states")
#: ``ReplayResult`` fields of the host tier mode.
HOST_FIELDS = ("host_capacity", "host_pool_slots", "write_policy", "load_back_threshold",
               "device_hit_tokens", "host_hit_tokens", "miss_tokens", "device_hit_ratio",
               "host_hit_ratio", "load_backs", "loaded_tokens", "declined_host_tokens",
               "load_evicted_tokens", "peak_host_tree_tokens", "final_host_tree_tokens",
               "backed_up_tokens", "host_evicted_tokens")
#: ``ReplayResult`` fields of the host tier with the SWA mode.
HOST_SWA_FIELDS = ("swa_host_pool_slots", "swa_backed_up_tokens", "swa_host_loaded_tokens",
                   "swa_host_evicted_tokens", "load_swa_evicted_tokens",
                   "peak_swa_host_tree_tokens", "final_swa_host_tree_tokens")
#: ``ReplayResult`` fields of the host tier with the Mamba mode.
HOST_MAMBA_FIELDS = ("mamba_host_pool_slots", "backed_up_states", "host_state_loads",
                     "host_evicted_states", "load_evicted_states", "peak_host_tree_states",
                     "final_host_tree_states")


@dataclass(frozen=True)
class HybridMode:
    """What reports need to know of a hybrid mode: ``params`` the ``replay``
    arguments (and ``ReplayResult`` fields) set in that mode, one of which a
    series of runs varies (``param``: the first); ``labels`` their names in
    tables and plots (``label``: the first); ``lost`` the fields of the hit
    tokens the mode loses (Full KV cached, unusable); ``evicted`` the fields of
    its own evictions; ``fields`` all its ``ReplayResult`` fields;
    ``per_request`` its per-request arrays (``record_requests``)."""

    name: str
    params: tuple
    labels: tuple
    lost: tuple
    evicted: tuple
    fields: tuple
    per_request: tuple
    #: a host tier mode over a hybrid model: that model's mode (SWA, Mamba, SWA + Mamba)
    base: object = None

    @property
    def param(self):
        return self.params[0]

    @property
    def host(self):
        """Whether the mode drives the host tier (``host_capacity`` set)."""
        return "host_capacity" in self.params

    @property
    def label(self):
        return self.labels[0]


SWA_MODE = HybridMode("swa", ("swa_window",), ("W",), ("window_lost_hit_tokens",),
                      ("swa_evicted_tokens",), SWA_FIELDS,
                      ("swa_evicted_tokens", "full_kv_hit_tokens", "window_lost_hit_tokens"))
MAMBA_MODE = HybridMode("mamba", ("mamba_states",), ("states",),
                        ("checkpoint_lost_hit_tokens",), ("mamba_evicted_states",),
                        MAMBA_FIELDS, ("mamba_evicted_states", "full_kv_hit_tokens",
                                       "checkpoint_lost_hit_tokens"))
#: The SWA + Mamba mode: both modes' fields (a series varies the window or the
#: state pool, not both).
SWA_MAMBA_MODE = HybridMode(
    "swa+mamba", ("swa_window", "mamba_states"), ("W", "states"),
    ("window_lost_hit_tokens", "checkpoint_lost_hit_tokens"),
    ("swa_evicted_tokens", "mamba_evicted_states"), SWA_FIELDS + MAMBA_FIELDS,
    ("swa_evicted_tokens", "mamba_evicted_states", "full_kv_hit_tokens",
     "window_lost_hit_tokens", "checkpoint_lost_hit_tokens"))
#: The host tier mode (HiCache): a series varies the host pool; it loses no hit
#: (``lost`` and ``evicted`` empty: its own figures are the hits per tier).
HOST_MODE = HybridMode("host", ("host_capacity",), ("host",), (), (), HOST_FIELDS,
                       ("device_hit_tokens", "host_hit_tokens", "miss_tokens",
                        "host_match_tokens", "declined_host_tokens"))


def _host_over(base, host_fields):
    """The host tier mode over the hybrid model ``base``: a series varies the host
    pool (the window and state pool are fixed); both modes' figures."""
    return HybridMode("host+" + base.name, ("host_capacity",) + base.params,
                      ("host",) + base.labels, base.lost, base.evicted,
                      HOST_FIELDS + base.fields + host_fields,
                      HOST_MODE.per_request + base.per_request, base)


HOST_SWA_MODE = _host_over(SWA_MODE, HOST_SWA_FIELDS)
HOST_MAMBA_MODE = _host_over(MAMBA_MODE, HOST_MAMBA_FIELDS)
HOST_SWA_MAMBA_MODE = _host_over(SWA_MAMBA_MODE, HOST_SWA_FIELDS + HOST_MAMBA_FIELDS)
#: Most params first: a run matches the first mode whose params it all sets.
HYBRID_MODES = (HOST_SWA_MAMBA_MODE, HOST_SWA_MODE, HOST_MAMBA_MODE, SWA_MAMBA_MODE, SWA_MODE,
                MAMBA_MODE, HOST_MODE)


def hybrid_mode(run):
    """The :class:`HybridMode` of a ``ReplayResult`` or of a sweep point (dict) (the
    host tier modes' too: :data:`HOST_MODE`, and over a hybrid model
    :data:`HOST_SWA_MODE`, :data:`HOST_MAMBA_MODE`, :data:`HOST_SWA_MAMBA_MODE`),
    or ``None`` for a Full-only run."""
    for mode in HYBRID_MODES:   # the modes with most params first
        get = run.get if isinstance(run, dict) else lambda k: getattr(run, k)
        if all(get(p) is not None for p in mode.params):
            return mode
    return None


def _latency(samples_ns):
    a = np.asarray(samples_ns, dtype=np.int64)
    if a.size == 0:
        return {"count": 0, "p50": None, "p99": None, "mean": None}
    p50, p99 = np.percentile(a, [50, 99]) / 1e3
    return {"count": int(a.size), "p50": round(float(p50), 2), "p99": round(float(p99), 2),
            "mean": round(float(a.mean()) / 1e3, 2)}


def _nice_interval(span_ms):
    """A round bucket width (ms) giving at most ~20 buckets over ``span_ms``."""
    raw = max(span_ms / 20.0, 1.0)
    scale = 10.0 ** np.floor(np.log10(raw))
    for m in (1, 2, 5, 10):
        if m * scale >= raw:
            return float(m * scale)
    return float(10 * scale)


def _pcts_ms(a):
    if a.size == 0:
        return {"p50": None, "p99": None, "max": None, "mean": None}
    p50, p99 = np.percentile(a, [50, 99])
    return {"p50": round(float(p50), 1), "p99": round(float(p99), 1),
            "max": round(float(a.max()), 1), "mean": round(float(a.mean()), 1)}


def timeline(arrive_ms, decide_ms, end_ms, served, interval_ms):
    """Concurrency over time of an arrival-mode run, in buckets of ``interval_ms``.

    ``arrive_ms``, ``decide_ms`` (admission, or rejection), ``end_ms``: float
    ``(requests,)``; ``served``: bool ``(requests,)``. A served request runs over
    ``[decide, end)``; a request waits over ``[arrive, decide)``.

    Returns ``(buckets, peak_running, mean_running)``: one dict per bucket with
    ``t_s`` (bucket start, s), ``arrivals``, ``rejected``, ``waited`` (requests
    arriving in the bucket that waited), ``running_max``, ``running_mean``
    (time-weighted), ``queued_max``, ``wait_ms_max``; the peak and the
    time-weighted mean of running requests over the whole run.
    """
    t0 = float(arrive_ms.min())
    t_end = float(max(decide_ms.max(), end_ms[served].max() if served.any() else t0))
    holds = served & (end_ms > decide_ms)

    def steps(up, down):
        # events sorted by time, decrements first at equal times; value after each
        t = np.concatenate((down, up))
        d = np.concatenate((np.full(down.size, -1), np.full(up.size, 1)))
        order = np.lexsort((d, t))
        t, v = t[order], np.cumsum(d[order])
        integral = np.concatenate(([0.0], np.cumsum(v[:-1] * np.diff(t)))) if t.size else t
        return t, v, integral

    def value_at(st, x):
        t, v, _ = st
        k = np.searchsorted(t, x, side="right") - 1
        return np.where(k >= 0, v[np.maximum(k, 0)] if v.size else 0, 0)

    def area(st, x):
        t, v, integral = st
        if t.size == 0:
            return np.zeros_like(x)
        k = np.searchsorted(t, x, side="right") - 1
        kk = np.maximum(k, 0)
        return np.where(k >= 0, integral[kk] + v[kk] * (x - t[kk]), 0.0)

    run = steps(decide_ms[holds], end_ms[holds])
    wait = decide_ms > arrive_ms
    que = steps(arrive_ms[wait], decide_ms[wait])
    width = float(interval_ms)
    nb = max(1, int(np.ceil((t_end - t0) / width)) if t_end > t0 else 1)
    edges = t0 + width * np.arange(nb + 1)
    bucket_of = np.minimum(((arrive_ms - t0) // width).astype(np.int64), nb - 1)
    rejected = ~served
    wait_ms = decide_ms - arrive_ms
    run_area = area(run, edges)
    buckets = []
    for b in range(nb):
        a, z = edges[b], edges[b + 1]

        def peak(st):
            t, v, _ = st
            lo, hi = np.searchsorted(t, a, side="right"), np.searchsorted(t, z, side="left")
            m = int(value_at(st, np.array([a]))[0])
            return max(m, int(v[lo:hi].max())) if hi > lo else m

        mine = bucket_of == b
        buckets.append({
            "t_s": round(float(a - t0) / 1e3, 3), "arrivals": int(mine.sum()),
            "rejected": int((mine & rejected).sum()), "waited": int((mine & wait).sum()),
            "running_max": peak(run),
            "running_mean": round(float(run_area[b + 1] - run_area[b]) / width, 2),
            "queued_max": peak(que),
            "wait_ms_max": round(float(wait_ms[mine].max()), 1) if mine.any() else 0.0,
        })
    span = t_end - t0
    mean = float(area(run, np.array([t_end]))[0]) / span if span > 0 else 0.0
    peak_all = int(run[1].max()) if run[1].size else 0
    return buckets, peak_all, round(mean, 2)
