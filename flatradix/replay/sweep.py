"""The capacity sweep: one replay per (policy, capacity) and series value, plus
the unbounded ceiling, sequentially or in processes; the curve as a JSON-ready
dict that :mod:`.report` prints and writes and :mod:`.plot` draws."""

import math

from ._progress import progress_bar
from .result import HOST_MODE, MAMBA_MODE, SWA_MAMBA_MODE, SWA_MODE, hybrid_mode
from .sim import ReplayConfig, replay, warm_up_for
from .config import OPT_POLICY
from .parallel import Interrupted, run_all
from .units import _count, _n, format_tokens


def _kv_bytes(r, bytes_per_token, swa_bytes_per_token=None):
    """KV memory of a run's pools (None: unbounded, or no bytes per token)."""
    if not bytes_per_token or r.capacity == "inf":
        return None
    b = r.capacity * bytes_per_token
    if r.swa_window is not None and swa_bytes_per_token is not None:
        b += r.swa_pool_slots * swa_bytes_per_token
    return b


def _point(r, bytes_per_token=None, swa_bytes_per_token=None):
    p = {"policy": r.policy, "capacity": r.capacity,
         "kv_bytes": _kv_bytes(r, bytes_per_token, swa_bytes_per_token),
         "token_hit_ratio": r.token_hit_ratio, "hit_tokens": r.hit_tokens,
         "evicted_tokens": r.evicted_tokens, "rejected_requests": r.rejected_requests,
         "waits": r.waits, "peak_tree_tokens": r.peak_tree_tokens, "wall_s": round(r.wall_s, 3)}
    if r.mode == "arrival":
        p.update(peak_running=r.arrival["peak_running"], mean_running=r.arrival["mean_running"],
                 waited_requests=r.arrival["waited_requests"],
                 wait_ms_p99=r.arrival["wait_ms"]["p99"])
    mode = hybrid_mode(r)
    if mode is not None:
        p.update({k: getattr(r, k) for k in mode.fields})
    return p


def _run_point(workload, task):
    """One sweep point: ``task`` = (policy, capacity, replay keywords)."""
    policy, capacity, kwargs = task
    return replay(workload, capacity=capacity, policy=policy, **kwargs)


def _tick(bar, result):
    if bar is not None:
        cap = "inf" if result.capacity == "inf" else format_tokens(result.capacity)
        mode = hybrid_mode(result)
        series = "" if mode is None else "".join(
            f" {label}={getattr(result, param)}" for param, label in zip(mode.params, mode.labels))
        bar.set_postfix_str(f"{result.policy}{series} {cap}: {100 * result.token_hit_ratio:.2f} %",
                            refresh=False)
        bar.update(1)


def _curve_series(curve):
    """``(HybridMode, series param, values, unbounded points)`` of a hybrid mode's
    sweep curve (one series per window / state pool), or ``None`` for a Full-only
    curve."""
    if curve.get("host"):
        h = curve["host"]
        return (hybrid_mode(h["unbounded"][0]) or HOST_MODE, "host_capacity", h["capacities"],
                h["unbounded"])
    if curve.get("swa_mamba"):
        sm = curve["swa_mamba"]
        values = sm["windows"] if sm["series"] == "swa_window" else sm["states"]
        return SWA_MAMBA_MODE, sm["series"], values, sm["unbounded"]
    if curve.get("swa"):
        return SWA_MODE, "swa_window", curve["swa"]["windows"], curve["swa"]["unbounded"]
    if curve.get("mamba"):
        return MAMBA_MODE, "mamba_states", curve["mamba"]["states"], curve["mamba"]["unbounded"]
    return None


def _series_runs(swa_windows, mamba_states, host_capacities=None):
    """``(HybridMode or None, series param or None, [replay kwargs per series value])``
    of a sweep's windows, state pools or host pools; ``ValueError`` when windows and
    state pools both list several, or host pools come with either."""
    windows, states = list(swa_windows or ()), list(mamba_states or ())
    hosts = list(host_capacities or ())
    if hosts:
        for name, values in (("swa_windows", windows), ("mamba_states", states)):
            if len(values) > 1:
                raise ValueError(f"host_capacities (the host tier) with {len(values)} "
                                 f"{name}: a host tier sweep varies the host pool (its grid "
                                 f"is device x host); give one value")
        fixed = {}
        if windows:
            fixed["swa_window"] = windows[0]
        if states:
            fixed["mamba_states"] = states[0]
        mode = hybrid_mode(dict(host_capacity=0, **fixed))
        return mode, "host_capacity", [dict(host_capacity=h, **fixed) for h in hosts]
    if windows and states:
        if len(windows) > 1 and len(states) > 1:
            raise ValueError(f"swa_windows ({len(windows)}) and mamba_states ({len(states)}) "
                             f"both list several values: an SWA + Mamba sweep varies one of "
                             f"them (one series axis)")
        param = "swa_window" if len(windows) > 1 else "mamba_states"
        return SWA_MAMBA_MODE, param, [dict(swa_window=w, mamba_states=n)
                                       for w in windows for n in states]
    if windows:
        return SWA_MODE, "swa_window", [dict(swa_window=w) for w in windows]
    if states:
        return MAMBA_MODE, "mamba_states", [dict(mamba_states=n) for n in states]
    return None, None, [{}]


def sweep(workload, capacities, policies=("lru",), jobs=1, progress=False,
          bytes_per_token=None, swa_windows=None, swa_bytes_per_token=None, mamba_states=None,
          host_capacities=None, backend=None, **kwargs):
    """Replay once per (policy, capacity), plus once unbounded; in the SWA mode
    once per (window, policy, capacity), plus once unbounded per window; in the
    Mamba mode the same per state pool; in the SWA + Mamba mode (both given) the
    same per window or per state pool, whichever lists several.

    Parameters
    ----------
    capacities : list of int or None
        Token capacities (``None`` = unbounded), in the order to report.
    policies : sequence of str
        Eviction policies; every capacity is replayed with each.
    jobs : int >= 1
        Processes to run the replays in (:func:`~flatradix.replay.parallel.run_all`);
        the figures are the same as ``jobs=1``'s (only ``wall_s`` differs).
    backend : (name, address) or None
        Run the points through joblib on a cluster instead (``run_all``'s
        ``backend``: ``("dask", "tcp://host:8786")``, ``("ray", None)``,
        ``("loky", None)``); the same figures.
    progress : bool
        A bar per finished run on a terminal (and each run's own bar when
        ``jobs == 1``).
    bytes_per_token : int, optional
        KV bytes per token: each point gets ``kv_bytes = capacity * bytes_per_token``.
    swa_windows : list of int, optional
        The SWA mode: the sliding windows (tokens) to replay, each as a series
        (``swa_ratio`` goes in ``kwargs``).
    swa_bytes_per_token : int, optional
        SWA mode: the SWA pool's bytes per token; ``kv_bytes`` then adds
        ``swa_pool_slots * swa_bytes_per_token``.
    mamba_states : list of int, optional
        The Mamba mode: the state pools (states) to replay, each as a series
        (``mamba_chunk`` goes in ``kwargs``); ``kv_bytes`` stays the
        full-attention pool's. With ``swa_windows``: the SWA + Mamba mode, whose
        series are the windows or the state pools: one of the two lists must
        hold a single value (``ValueError`` otherwise).
    host_capacities : list of int (or math.inf), optional
        The host tier mode: the host pools (tokens) to replay, each crossed with
        every capacity: a device x host grid (``write_policy``,
        ``load_back_threshold``, ``swa_host_capacity`` and ``mamba_host_states``
        go in ``kwargs``). With ``swa_windows`` / ``mamba_states`` (one value
        each: ``ValueError`` for several) the host tier over that hybrid model.
    kwargs : passed to :func:`~flatradix.replay.sim.replay`.

    Returns the curve as a JSON-ready dict: ``points`` (policy-major: every
    capacity of the first policy, then the next policy...) each with
    ``policy``, ``capacity``, ``kv_bytes``, ``token_hit_ratio``, ``hit_tokens``,
    ``evicted_tokens``, ``rejected_requests``, ``waits``, ``peak_tree_tokens``,
    ``wall_s`` (arrival mode: also ``peak_running``, ``mean_running``,
    ``waited_requests``, ``wait_ms_p99``); ``unbounded`` the same for one
    unbounded run (no eviction happens, so every policy gives it; run with the
    first policy) and ``unbounded_hit_ratio``, the ceiling every finite
    capacity approaches. SWA mode: every point also has the
    ``ReplayResult`` SWA fields (``swa_window``, ``swa_pool_slots``,
    ``swa_evicted_tokens``, ``window_lost_hit_tokens``...), ``unbounded`` is the
    first window's, and ``swa`` holds ``windows``, ``ratio`` and
    ``unbounded`` (one point per window: the window still drops hits there).
    Mamba mode: the points have the ``ReplayResult`` Mamba fields
    (``mamba_states``, ``checkpoint_lost_hit_tokens``, ``mamba_evicted_states``...),
    ``unbounded`` is the first pool's, and ``mamba`` holds ``states``,
    ``chunk``, ``extra_buffer`` (``mamba_extra_buffer=True`` in ``kwargs``: the
    extra-buffer Mamba mode) and ``unbounded`` (one point per state pool). SWA + Mamba mode:
    the points have both modes' fields, and ``swa_mamba`` holds ``series``
    (``"swa_window"`` or ``"mamba_states"``: what the series vary),
    ``windows``, ``states``, ``ratio``, ``chunk``, ``swa_kv_bytes_per_token``
    and ``unbounded`` (one point per series). Host tier mode: the points
    (host-major: every capacity of every policy for the first host pool, then
    the next) have the ``ReplayResult`` host fields (``host_capacity``,
    ``device_hit_tokens``, ``host_hit_tokens``, ``miss_tokens``...;
    ``token_hit_ratio`` is device + host hits over prompt tokens), and
    ``host`` holds ``capacities``, ``write_policy``, ``load_back_threshold`` and
    ``unbounded``: one point, the unbounded device pool with the first host
    pool (a device pool that never evicts never reaches the host, so every
    host pool gives its hits; with Mamba the state pool stays ``mamba_states``
    and evicts, so a host tier can beat that point). Over a hybrid model
    (``swa_windows`` / ``mamba_states``, one value each) ``host`` also holds
    ``swa_window``, ``swa_ratio``, ``swa_kv_bytes_per_token``, ``mamba_states``,
    ``mamba_chunk``, ``swa_host_capacity`` and ``mamba_host_states`` (``None``
    where not given), and the points the hybrid mode's fields too.

    Ctrl-C / SIGINT raises :class:`~flatradix.replay.parallel.Interrupted` at once
    (a ``KeyboardInterrupt``; runs still going or queued are dropped) with the
    curve of the runs that finished as its ``partial``: only those points, each
    missing unbounded run ``None``, and ``partial``: ``{"finished_runs", "runs"}``
    (``partial`` ``None`` when none finished).
    """
    policies = list(policies)
    if not policies:
        raise ValueError("sweep needs at least one policy")
    jobs = int(jobs)
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    # replay kwargs per series
    mode, axis, runs = _series_runs(swa_windows, mamba_states, host_capacities)
    # one unbounded run per series (the host tier mode: one in all, see above)
    nu = 1 if mode is not None and mode.host else len(runs)
    tasks = ([(p, c, k) for k in range(len(runs)) for p in policies for c in capacities]
             + [(policies[0], None, k) for k in range(nu)])
    # a refresh per finished run (runs take seconds: no need to rate-limit)
    bar = progress_bar(len(tasks), progress, unit="run", desc="sweep", mininterval=0)
    # in this process, each run shows its own bar too
    each = dict(kwargs, progress=progress) if jobs == 1 and backend is None else kwargs
    work = [(p, c, dict(each, **runs[j])) for p, c, j in tasks]
    if jobs > 1 and len(work) > 1:
        _warm_up_here(work)
    try:
        results = run_all(_run_point, workload, work, jobs,
                          on_result=lambda k, r: _tick(bar, r), backend=backend)
    except Interrupted as e:
        if not e.finished:
            raise
        e.partial = _curve(workload, policies, capacities, e.results, nu, mode, axis,
                           swa_windows, mamba_states, host_capacities, bytes_per_token,
                           swa_bytes_per_token, kwargs)
        raise
    finally:
        if bar is not None:
            bar.close()
    return _curve(workload, policies, capacities, results, nu, mode, axis, swa_windows,
                  mamba_states, host_capacities, bytes_per_token, swa_bytes_per_token, kwargs)


def _warm_up_here(work):
    """Compile (or load) the sweep's kernels in this process before the workers
    start, so a cold Numba cache is filled once, not by every worker at once
    (forked workers inherit the compiled kernels; spawned ones load them)."""
    p, c, kw = work[0]
    kw = {k: v for k, v in kw.items() if k not in ("progress", "cache_factory")}
    warm_up_for(ReplayConfig(capacity=c, policy=p, **kw))


def _curve(workload, policies, capacities, results, nu, mode, axis, swa_windows, mamba_states,
           host_capacities, bytes_per_token, swa_bytes_per_token, kwargs):
    """The sweep's curve of ``results`` (the points, then ``nu`` unbounded runs).
    An interrupted sweep has ``None`` for the runs that did not finish: its curve
    has the finished points only, ``None`` for each unbounded run missing, and
    ``partial``: ``{"finished_runs", "runs"}``."""
    done = [r for r in results if r is not None]
    unbs = results[len(results) - nu:]
    meta = unbs[0] if unbs[0] is not None else done[0]   # the runs share these
    bpt = (bytes_per_token, swa_bytes_per_token)

    def point(r):
        return None if r is None else _point(r, *bpt)

    unb = unbs[0]
    curve = {
        "workload": workload.name, "requests": len(workload),
        "prompt_tokens": workload.prompt_tokens, "page_size": meta.page_size,
        "max_running": meta.max_running, "mode": meta.mode, "policies": policies,
        "cache_outputs": meta.cache_outputs, "kv_bytes_per_token": bytes_per_token,
        "arrival": ({k: v for k, v in meta.arrival.items()
                     if k in ("prefill_tokens_per_s", "decode_tokens_per_s", "rate_scale")}
                    if meta.arrival else None),
        "unbounded": point(unb),
        "unbounded_hit_ratio": None if unb is None else unb.token_hit_ratio,
        "points": [_point(r, *bpt) for r in results[:len(results) - nu] if r is not None],
    }
    if len(done) < len(results):
        curve["partial"] = {"finished_runs": len(done), "runs": len(results)}
    if OPT_POLICY in policies and mode is None:
        _gaps(curve)
    if mode is not None and mode.host:
        curve["host"] = {"capacities": [("inf" if h == math.inf else h)
                                        for h in host_capacities],
                         "write_policy": meta.write_policy,
                         "load_back_threshold": meta.load_back_threshold,
                         "swa_window": meta.swa_window, "swa_ratio": meta.swa_ratio,
                         "swa_kv_bytes_per_token": swa_bytes_per_token,
                         "mamba_states": meta.mamba_states, "mamba_chunk": meta.mamba_chunk,
                         "swa_host_capacity": kwargs.get("swa_host_capacity"),
                         "mamba_host_states": kwargs.get("mamba_host_states"),
                         "unbounded": [point(r) for r in unbs]}
    elif mode is SWA_MAMBA_MODE:
        curve["swa_mamba"] = {"series": axis, "windows": list(swa_windows),
                              "states": list(mamba_states), "ratio": meta.swa_ratio,
                              "chunk": meta.mamba_chunk,
                              "swa_kv_bytes_per_token": swa_bytes_per_token,
                              "unbounded": [point(r) for r in unbs]}
    elif mode is SWA_MODE:
        curve["swa"] = {"windows": list(swa_windows), "ratio": meta.swa_ratio,
                        "swa_kv_bytes_per_token": swa_bytes_per_token,
                        "unbounded": [point(r) for r in unbs]}
    elif mode is MAMBA_MODE:
        curve["mamba"] = {"states": list(mamba_states), "chunk": meta.mamba_chunk,
                          "extra_buffer": meta.mamba_extra_buffer,
                          "unbounded": [point(r) for r in unbs]}
    return curve


def _gaps(curve):
    """With ``opt`` among the policies, each point's gap to the unbounded ceiling,
    split: ``capacity_gap`` = unbounded - opt at that capacity (only more memory
    closes it), ``policy_gap`` = opt - the point's policy (a better policy could
    close it); ``opt_hit_ratio`` beside them."""
    opt = {p["capacity"]: p["token_hit_ratio"] for p in curve["points"]
           if p["policy"] == OPT_POLICY}
    ceiling = curve["unbounded_hit_ratio"]
    for p in curve["points"]:
        o = opt.get(p["capacity"])
        if o is None:
            continue
        p["opt_hit_ratio"] = o
        p["policy_gap"] = o - p["token_hit_ratio"]
        if ceiling is not None:
            p["capacity_gap"] = ceiling - o


def _host_key(h):
    """Sort key of host capacities: ascending, ``inf`` last."""
    return math.inf if h in ("inf", math.inf) else h


def _host_label(h):
    return "inf" if h in ("inf", math.inf) else format_tokens(h) if h else "0"


def _host_model(h):
    """`` over ...``: the hybrid model of a host tier sweep (``curve["host"]``), or ""."""
    parts = []
    if h.get("swa_window") is not None:
        parts.append(f"sliding window {_n(h['swa_window'])} (SWA pool {h['swa_ratio']:g} x "
                     f"capacity)")
    if h.get("mamba_states") is not None:
        parts.append(f"{_count(h['mamba_states'], 'Mamba state')} (page 1, chunk "
                     f"{h['mamba_chunk']})")
    if not parts:
        return ""
    pools = []
    if h.get("swa_window") is not None:
        pools.append("SWA host pool " + (f"{_n(h['swa_host_capacity'])} tokens"
                                         if h.get("swa_host_capacity") else
                                         f"{h['swa_ratio']:g} x host"))
    if h.get("mamba_states") is not None:
        pools.append("Mamba host pool " + (_count(h["mamba_host_states"], "state")
                                           if h.get("mamba_host_states") else
                                           "states x host / capacity"))
    return f" over {' + '.join(parts)}; {', '.join(pools)}"
