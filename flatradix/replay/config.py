"""What one replay is asked to do: :class:`ReplayConfig` (every option of
:func:`~flatradix.replay.sim.replay`, checked and defaulted), the arrival mode's
:class:`ArrivalModel`, and the pool sizes a workload can use (:func:`pool_sizes`).

Nothing here touches a cache: a config is checked before any pool is allocated
or any kernel compiled, so a mistake costs nothing. The modes themselves are
described in :mod:`flatradix.replay.sim`.
"""

import math
from dataclasses import dataclass, field, fields

import numpy as np

#: Write policies of the host tier mode (those the cache's host tier builds).
HOST_WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
#: ``write_policy`` when none is given (SGLang's ``--hicache-write-policy`` default).
DEFAULT_WRITE_POLICY = "write_through"
#: ``load_back_threshold`` when none is given: fewer host tokens are recomputed
#: (SGLang's ``load_back_threshold``).
DEFAULT_LOAD_BACK_THRESHOLD = 10
#: Largest accepted threshold (the cache takes a signed 63-bit int; a threshold
#: past any pool declines every load).
MAX_LOAD_BACK_THRESHOLD = 1 << 40
#: Largest accepted ``swa_host_capacity`` / ``mamba_host_states`` (the cache's
#: host pools take at most 2**40 slots).
MAX_HOST_AUX = 1 << 40

#: ``swa_ratio`` when none is given: SGLang's ``swa_full_tokens_ratio`` default.
DEFAULT_SWA_RATIO = 0.8
#: Tokens that must slide out of the window before the scheduler frees them
#: (SGLang's ``SGLANG_SWA_EVICTION_INTERVAL`` default).
SWA_EVICTION_INTERVAL = 128
#: Largest accepted window (tokens): flatradix's ``MAX_WINDOW``.
MAX_SWA_WINDOW = 1 << 40

#: The Mamba mode's checkpoint chunk when none is given (SGLang's
#: ``mamba_cache_chunk_size`` default).
DEFAULT_MAMBA_CHUNK = 64
#: Largest accepted chunk: the cache takes ``mamba_cache_chunk_size`` below 2**62.
MAX_MAMBA_CHUNK = (1 << 62) - 1

#: State slots each running request holds with the extra buffer: its own and a
#: ping-pong track buffer of 2 (SGLang's with the overlap scheduler).
EXTRA_BUFFER_REQ_STATES = 3
#: The smallest state pool of the extra-buffer mode: a request's 3 slots and the
#: fresh slot its checkpoint after the prefill swaps in.
EXTRA_BUFFER_MIN_STATES = EXTRA_BUFFER_REQ_STATES + 1

#: The offline optimal policy (Belady's rule on the prefix tree: ``replay/opt.py``).
OPT_POLICY = "opt"

#: ``max_running`` of the arrival mode when none is given (a serving engine's
#: running-request cap; SGLang derives its own, typically 2048-4096, from memory).
ARRIVAL_MAX_RUNNING = 1024


@dataclass(frozen=True)
class ArrivalModel:
    """The arrival mode's clock and service times (module docstring).

    Attributes
    ----------
    prefill_tokens_per_s : float > 0
        Prefill speed over a request's uncached prompt tokens (tokens/s).
    decode_tokens_per_s : float > 0
        Decode speed of one request (output tokens/s).
    rate_scale : float > 0
        Arrivals at ``timestamp / rate_scale`` (2.0: the same requests twice as
        fast).
    interval_s : float > 0 or None
        Width of the timeline's buckets; ``None``: a round width giving at most
        about 20 buckets.
    """

    prefill_tokens_per_s: float = 10_000.0
    decode_tokens_per_s: float = 50.0
    rate_scale: float = 1.0
    interval_s: object = None

    def __post_init__(self):
        for name in ("prefill_tokens_per_s", "decode_tokens_per_s", "rate_scale"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0 < v < float("inf")):
                raise ValueError(f"{name} must be a number > 0, got {v!r}")
        if self.interval_s is not None and not (0 < self.interval_s < float("inf")):
            raise ValueError(f"interval_s must be > 0, got {self.interval_s!r}")

    def service_ms(self, uncached_tokens, output_tokens):
        """How long a request holds its KV: ``1000 * (uncached / prefill + output /
        decode)`` ms."""
        return 1e3 * (uncached_tokens / self.prefill_tokens_per_s
                      + output_tokens / self.decode_tokens_per_s)


def _is_int(v):
    return not isinstance(v, bool) and isinstance(v, (int, np.integer))


@dataclass(frozen=True)
class ReplayConfig:
    """Every option of one replay, checked and defaulted at construction
    (:func:`~flatradix.replay.sim.replay` documents each; the modes are in
    :mod:`flatradix.replay.sim`'s docstring).

    Construction raises what ``replay`` raises for an option (``ValueError`` for
    an invalid value or combination, ``TypeError`` for a wrong type) before
    anything is allocated; the fields then hold the resolved values: the
    defaults filled in (``max_running`` by mode, ``swa_ratio``,
    ``mamba_chunk``, ``write_policy``, ``load_back_threshold``), ints as
    Python ints. ``config.with_(capacity=...)`` gives a checked variant (a sweep
    point). ``capacity`` ``None`` or ``math.inf``: unbounded.
    """

    capacity: object = None
    page_size: int = 16
    max_running: object = None
    policy: str = "lru"
    cache_outputs: bool = False
    driver: str = "request"
    record_hits: bool = False
    record_requests: bool = False
    check: bool = True
    arrival: object = None
    swa_window: object = None
    swa_ratio: object = None
    swa_eviction_interval: int = SWA_EVICTION_INTERVAL
    mamba_states: object = None
    mamba_chunk: object = None
    mamba_extra_buffer: bool = False
    host_capacity: object = None
    write_policy: object = None
    load_back_threshold: object = None
    swa_host_capacity: object = None
    mamba_host_states: object = None
    # the options as given (with_() re-resolves the defaults from them)
    _given: dict = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        given = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        for k, v in _check(dict(given)).items():
            object.__setattr__(self, k, v)
        object.__setattr__(self, "_given", given)

    # ------------------------------------------------------------ the mode
    @property
    def swa(self):
        """The SWA mode (a sliding window)."""
        return self.swa_window is not None

    @property
    def mamba(self):
        """The Mamba mode (a state pool)."""
        return self.mamba_states is not None

    @property
    def extra(self):
        """The Mamba mode with the extra buffer."""
        return self.mamba_extra_buffer

    @property
    def host(self):
        """The host tier mode (a host pool)."""
        return self.host_capacity is not None

    @property
    def hybrid(self):
        """A hybrid model: SWA, Mamba or both."""
        return self.swa or self.mamba

    @property
    def triple(self):
        """The SWA + Mamba mode."""
        return self.swa and self.mamba

    @property
    def timed(self):
        """The arrival mode (a clock)."""
        return self.arrival is not None

    @property
    def unbounded(self):
        """An unbounded device pool."""
        return self.capacity is None or self.capacity == float("inf")

    def with_(self, **changes):
        """A checked copy with ``changes``, the other options as first given (so a
        default that depends on the mode, as ``max_running``'s, follows the change;
        ``dataclasses.replace`` keeps the resolved values instead)."""
        return ReplayConfig(**dict(self._given, **changes))

    def to_kwargs(self):
        """The options as :func:`~flatradix.replay.sim.replay` keywords (as given)."""
        return dict(self._given)


def _check(o):
    """The options ``o`` (a dict of ReplayConfig's fields as given) checked and
    resolved; raises as :func:`~flatradix.replay.sim.replay` documents."""
    if o["driver"] not in ("request", "core"):
        raise ValueError(f"driver must be 'request' or 'core', got {o['driver']!r}")
    _check_swa(o)
    _check_mamba(o)
    _check_host(o)
    arrival = o["arrival"]
    timed = arrival is not None
    if timed and not isinstance(arrival, ArrivalModel):
        raise TypeError(f"arrival must be an ArrivalModel or None, got {type(arrival).__name__}")
    if o["max_running"] is None:
        o["max_running"] = ARRIVAL_MAX_RUNNING if timed else 1
    o["max_running"] = int(o["max_running"])
    if o["max_running"] < 1:
        raise ValueError(f"max_running must be >= 1, got {o['max_running']}")
    o["page_size"] = int(o["page_size"])
    if o["page_size"] < 1:
        raise ValueError(f"page_size must be >= 1, got {o['page_size']}")
    cap = o["capacity"]
    if not (cap is None or cap == float("inf")) and int(cap) < 1:
        raise ValueError(f"capacity must be >= 1 token, got {cap}")
    if o["policy"] == OPT_POLICY:
        for what in ("swa_window", "mamba_states", "host_capacity"):
            if o[what] is not None:
                raise ValueError(f"policy 'opt' (Belady's offline optimum) models Full "
                                 f"attention without a host tier: not with {what}")
        o["driver"] = "core"     # the optimal cache is driven through the core calls
    return o


def _check_swa(o):
    if o["swa_window"] is None:
        if o["swa_ratio"] is not None:
            raise ValueError("swa_ratio needs swa_window (the SWA mode)")
        return
    w = o["swa_window"]
    if not _is_int(w):
        raise TypeError(f"swa_window must be an int, got {type(w).__name__}")
    w = o["swa_window"] = int(w)
    if not 1 <= w <= MAX_SWA_WINDOW:
        raise ValueError(f"swa_window must be in [1, {MAX_SWA_WINDOW}] tokens, got {w}")
    ratio = DEFAULT_SWA_RATIO if o["swa_ratio"] is None else o["swa_ratio"]
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float, np.number)) \
            or not 0 < float(ratio) <= 1:
        raise ValueError(f"swa_ratio must be a number in (0, 1], got {ratio!r}")
    o["swa_ratio"] = float(ratio)
    interval = o["swa_eviction_interval"]
    if not _is_int(interval) or interval < 1:
        raise ValueError(f"swa_eviction_interval must be an int >= 1, got {interval!r}")
    o["swa_eviction_interval"] = int(interval)
    if o["driver"] != "request":
        raise ValueError("the SWA mode (swa_window) needs driver='request' (the request "
                         "path moves the SWA cursor)")


def _check_mamba(o):
    extra = o["mamba_extra_buffer"]
    if not isinstance(extra, (bool, np.bool_)):
        raise TypeError(f"mamba_extra_buffer must be a bool, got {type(extra).__name__}")
    extra = o["mamba_extra_buffer"] = bool(extra)
    states = o["mamba_states"]
    if extra and states is None:
        raise ValueError("mamba_extra_buffer needs mamba_states (the Mamba mode)")
    if extra and o["swa_window"] is not None:
        raise ValueError("mamba_extra_buffer with swa_window: the SWA + Mamba replay runs "
                         "without the extra buffer only (page 1); drop one of the two")
    if states is None:
        if o["mamba_chunk"] is not None:
            raise ValueError("mamba_chunk needs mamba_states (the Mamba mode)")
        return
    if not _is_int(states):
        raise TypeError(f"mamba_states must be an int, got {type(states).__name__}")
    states = o["mamba_states"] = int(states)
    if states < 1:
        raise ValueError(f"mamba_states must be >= 1 (state slots), got {states}")
    chunk = DEFAULT_MAMBA_CHUNK if o["mamba_chunk"] is None else o["mamba_chunk"]
    if not _is_int(chunk) or not 1 <= chunk <= MAX_MAMBA_CHUNK:
        raise ValueError(f"mamba_chunk must be an int in [1, {MAX_MAMBA_CHUNK}], got "
                         f"{chunk!r}")
    o["mamba_chunk"] = int(chunk)
    if extra and states < EXTRA_BUFFER_MIN_STATES:
        raise ValueError(f"mamba_extra_buffer needs mamba_states >= "
                         f"{EXTRA_BUFFER_MIN_STATES} (a running request holds "
                         f"{EXTRA_BUFFER_REQ_STATES} state slots, its own and 2 ping-pong "
                         f"track slots, and its checkpoint swaps a fresh one in), got "
                         f"{states}")
    if not extra and int(o["page_size"]) != 1:
        raise ValueError(f"the Mamba mode (mamba_states) needs page_size=1 (SGLang serves "
                         f"Mamba hybrids without the extra buffer at page 1; "
                         f"mamba_extra_buffer=True takes any page size), got {o['page_size']}")
    if o["driver"] != "request":
        raise ValueError("the Mamba mode (mamba_states) needs driver='request' (the request "
                         "path donates the state)")


def _check_host(o):
    h = o["host_capacity"]
    if h is None:
        for what in ("write_policy", "load_back_threshold", "swa_host_capacity",
                     "mamba_host_states"):
            if o[what] is not None:
                raise ValueError(f"{what} needs host_capacity (the host tier mode)")
        return
    if o["mamba_extra_buffer"]:
        raise ValueError("host_capacity (the host tier) with mamba_extra_buffer: the replay "
                         "drives the host tier of the Mamba mode without the extra buffer "
                         "only (page 1); drop one of the two")
    if isinstance(h, bool) or not isinstance(h, (int, np.integer, float)) or (
            isinstance(h, float) and h != math.inf):
        raise TypeError(f"host_capacity must be an int (tokens) or math.inf, got {h!r}")
    if h < 0:
        raise ValueError(f"host_capacity must be >= 0 tokens, got {h}")
    policy = DEFAULT_WRITE_POLICY if o["write_policy"] is None else o["write_policy"]
    if policy not in HOST_WRITE_POLICIES:
        raise ValueError(f"write_policy must be one of {', '.join(HOST_WRITE_POLICIES)}, "
                         f"got {policy!r}")
    o["write_policy"] = policy
    t = DEFAULT_LOAD_BACK_THRESHOLD if o["load_back_threshold"] is None \
        else o["load_back_threshold"]
    if not _is_int(t):
        raise TypeError(f"load_back_threshold must be an int, got {type(t).__name__}")
    t = o["load_back_threshold"] = int(t)
    if not 0 <= t <= MAX_LOAD_BACK_THRESHOLD:
        raise ValueError(f"load_back_threshold must be in [0, {MAX_LOAD_BACK_THRESHOLD}] "
                         f"tokens, got {t}")
    if o["driver"] != "request":
        raise ValueError("the host tier mode (host_capacity) needs driver='request' (the "
                         "core driver's caches have no host tier)")
    for what, on, mode in (
            ("swa_host_capacity", o["swa_window"] is not None, "swa_window (the SWA mode)"),
            ("mamba_host_states", o["mamba_states"] is not None,
             "mamba_states (the Mamba mode)")):
        given = o[what]
        if given is None:
            continue
        if not on:
            raise ValueError(f"{what} needs {mode}")
        if not _is_int(given):
            raise TypeError(f"{what} must be an int, got {type(given).__name__}")
        if not 1 <= int(given) <= MAX_HOST_AUX:
            raise ValueError(f"{what} must be in [1, {MAX_HOST_AUX}] (the cache's host "
                             f"pool needs a slot), got {int(given)}")


# ---------------------------------------------------------------- pool sizes
def unbounded_pool_slots(workload, max_running, cache_outputs=False):
    """KV slots that an unbounded run can never exceed.

    Tree: at most ``distinct_prefix_blocks * block_size`` prompt tokens (plus
    every output token with ``cache_outputs``); in flight: at most the
    ``max_running`` largest requests (prompt + output) at once.
    """
    if len(workload) == 0:
        return 1
    tree = workload.distinct_prefix_blocks() * workload.block_size
    if cache_outputs:
        tree += workload.output_tokens
    sizes = workload.input_lengths + workload.output_lengths
    k = min(int(max_running), sizes.size)
    inflight = int(sizes.max()) if k == 1 else int(np.sort(sizes)[sizes.size - k:].sum())
    return max(1, tree + inflight)


def swa_pool_slots(capacity, ratio, page_size, bound):
    """SWA pool size (tokens) of the SWA mode: ``int(capacity * ratio)`` rounded
    down to whole pages (SGLang sizes it so), at most ``bound`` (the workload
    can never hold more SWA slots than Full ones). ``capacity`` ``None``:
    unbounded, ``bound``. ``ValueError`` when that is less than one page."""
    if capacity is None or capacity == float("inf"):
        return bound
    swa = int(int(capacity) * float(ratio))
    swa -= swa % page_size
    if swa < page_size:
        raise ValueError(f"the SWA pool ({int(capacity):,} x swa_ratio {ratio:g} = {swa:,} "
                         f"tokens in whole pages) is less than one page of {page_size}")
    return min(swa, bound)


def host_aux_slots(workload, host_capacity, capacity, pool_slots, page_size, swa_ratio=None,
                   mamba_slots=None, swa_host_capacity=None, mamba_host_states=None,
                   cache_outputs=False, notes=None):
    """Host pool sizes of the SWA and Mamba components in the host tier mode:
    ``(SWA host tokens or None, host states or None)``.

    SGLang sizes every host pool from one ``hicache_ratio`` of its device pool
    (the Full, SWA and Mamba host pools alike); the replay takes that ratio as
    ``host_capacity / capacity`` (``capacity``: the Full device pool asked, in
    tokens; ``None``, unbounded: ``pool_slots``, the pool allocated). So by
    default the SWA host pool is ``int(host_capacity * swa_ratio)`` tokens in
    whole pages (the ratio times the SWA device pool, ``swa_ratio`` x the Full
    one) and the Mamba host pool ``int(mamba_slots * host_capacity /
    capacity)`` states (``mamba_slots``: the device state pool); each at least
    one page / one state (the cache's host pools need a slot; with no Full host
    slot nothing is ever backed up, so it stays empty).
    ``swa_host_capacity`` / ``mamba_host_states`` (ints >= 1) replace those.
    ``host_capacity`` ``math.inf``: both as large as the workload can use.
    Either is capped at what the workload can use: SWA tokens at the distinct
    prefix tokens (the Full host pool's bound), states at one per request (each
    request donates at most one state; ``notes``, a list: a line is appended for
    each pool so capped). ``swa_ratio`` / ``mamba_slots`` ``None``: that component
    is absent (``None`` returned for it)."""
    tokens_bound = workload.distinct_prefix_blocks() * workload.block_size + (
        workload.output_tokens if cache_outputs else 0)
    states_bound = max(1, len(workload))
    inf = host_capacity == math.inf
    ratio = None if inf else int(host_capacity) / (capacity if capacity else max(1, pool_slots))

    def sized(given, bound, default, what):
        # the pool asked for (or the default), capped at what the workload can use
        h = int(given) if given is not None else bound if inf else default()
        if h > bound and not inf and notes is not None:
            notes.append(f"{what[0]} host pool sized to {bound:,} {what[1]}: this workload "
                         f"can never use more{what[2]}, so {h:,} {what[1]} gives the same run")
        return max(1, min(h, bound))

    def swa_default():
        h = int(int(host_capacity) * float(swa_ratio))
        return max(page_size, h - h % page_size)

    swa_h = None if swa_ratio is None else sized(
        swa_host_capacity, tokens_bound, swa_default, ("SWA", "tokens", ""))
    states_h = None if mamba_slots is None else sized(
        mamba_host_states, states_bound, lambda: max(1, int(mamba_slots * ratio)),
        ("Mamba", "states", " (one a request)"))
    return swa_h, states_h


@dataclass(frozen=True)
class PoolSizes:
    """The pools one replay allocates (slots; ``None`` where the mode has no such
    pool): each is what was asked, capped at what the workload can use (a
    larger pool gives the same run; ``notes`` say which were capped)."""

    slots: int                  # Full KV pool (tokens)
    swa_slots: object = None    # SWA KV pool (tokens)
    m_slots: object = None      # Mamba state pool (states)
    h_slots: object = None      # Full host pool (tokens)
    swa_h_slots: object = None  # SWA host pool (tokens)
    mh_slots: object = None     # Mamba host pool (states)
    notes: tuple = ()


def pool_sizes(cfg, workload):
    """:class:`PoolSizes` of ``cfg`` (a :class:`ReplayConfig`) on ``workload``;
    ``ValueError`` for an SWA pool below one page."""
    n_req = len(workload)
    notes = []
    bound = unbounded_pool_slots(workload, cfg.max_running, cfg.cache_outputs)
    capacity = None if cfg.unbounded else int(cfg.capacity)
    slots = bound if capacity is None else min(capacity, bound)
    if capacity is not None and slots < capacity:
        notes.append(f"pool sized to {slots:,} tokens: this workload can never use more, "
                     f"so {capacity:,} tokens gives the same run")
    swa_slots = None
    if cfg.swa:
        swa_slots = swa_pool_slots(capacity, cfg.swa_ratio, cfg.page_size, bound)
    m_slots = None
    if cfg.extra:
        # each request allocates 3 states at admission and one at its checkpoint: a
        # pool of 4 per request never runs short
        m_slots = max(EXTRA_BUFFER_MIN_STATES, min(cfg.mamba_states, 4 * n_req))
        if m_slots < cfg.mamba_states:
            notes.append(f"state pool sized to {m_slots:,} states: this workload can never "
                         f"use more (4 a request)")
    elif cfg.mamba:
        # each request allocates one state, so no run uses more than one per request
        m_slots = max(1, min(cfg.mamba_states, n_req))
        if m_slots < cfg.mamba_states:
            notes.append(f"state pool sized to {m_slots:,} state{'' if m_slots == 1 else 's'}: "
                         f"this workload can never use more")
    h_slots = swa_h_slots = mh_slots = None
    if cfg.host:
        # the tree never holds more distinct tokens than the prompts' distinct prefixes
        # (and the outputs, when cached): a host pool beyond that gives the same run
        h = cfg.host_capacity
        h_bound = workload.distinct_prefix_blocks() * workload.block_size + (
            workload.output_tokens if cfg.cache_outputs else 0)
        h_slots = h_bound if h == math.inf else min(int(h), h_bound)
        if h != math.inf and h_slots < int(h):
            notes.append(f"host pool sized to {h_slots:,} tokens: this workload can never use "
                         f"more, so {int(h):,} tokens gives the same run")
        if cfg.hybrid:
            swa_h_slots, mh_slots = host_aux_slots(
                workload, h, capacity, slots, cfg.page_size,
                cfg.swa_ratio if cfg.swa else None, cfg.mamba_states if cfg.mamba else None,
                cfg.swa_host_capacity, cfg.mamba_host_states, cfg.cache_outputs, notes)
    return PoolSizes(slots, swa_slots, m_slots, h_slots, swa_h_slots, mh_slots, tuple(notes))
