"""Human-readable reports, the capacity sweep (sequential or in processes), CSV
files and the sweep plot."""

import csv
import math
import os
import re

from ._progress import progress_bar
from .model import format_bytes
from .sim import (HOST_MODE, HOST_OPS, MAMBA_EXTRA_OPS, MAMBA_MODE, OPS, SWA_FIELDS,
                  SWA_MAMBA_MODE, SWA_MODE, SWA_OPS, hybrid_mode, replay)

_SUFFIX = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}

#: Largest capacity in tokens: the largest pool flatradix allocates (2**40 slots).
MAX_CAPACITY = 1 << 40


class CapacityTooLarge(ValueError):
    """A capacity above :data:`MAX_CAPACITY` (the ``ValueError`` ``parse_capacity``
    raises for it, so a caller can word it for its own unit)."""


def parse_capacity(text):
    """``"inf"`` -> ``None``; ``"2000000"``, ``"2,000,000"``, ``"2M"``, ``"500k"``, ``"1.5G"``,
    ``"2e6"`` -> int tokens.

    Raises ``ValueError`` for anything else (a comma that does not group
    thousands, ``"5,6"``, included), a capacity below 1, or one above
    :data:`MAX_CAPACITY` (2**40 tokens; ``inf`` is the way to say unbounded;
    :class:`CapacityTooLarge`, a ``ValueError``).
    """
    s = str(text).strip().lower().replace("_", "")
    if "," in s:
        # a comma only groups thousands (2,000,000); anything else is a list typed
        # into a one-value option ("5,6" is not 56)
        if not re.fullmatch(r"[1-9]\d{0,2}(,\d{3})+(\.\d*)?[kmgt]?", s):
            raise ValueError(f"capacity takes one value (a comma only groups thousands, "
                             f"as in 2,000,000), got {text!r}")
        s = s.replace(",", "")
    if s in ("inf", "infinity", "unbounded", "none"):
        return None
    mult = 1
    if s and s[-1] in _SUFFIX:
        mult = _SUFFIX[s[-1]]
        s = s[:-1]
    try:
        v = float(s) * mult
    except ValueError:
        raise ValueError(f"capacity must be a token count (e.g. 2000000, 2M, 500k) or 'inf', "
                         f"got {text!r}") from None
    if not math.isfinite(v) or v != int(v) or v < 1:
        raise ValueError(f"capacity must be a whole number of tokens >= 1 or 'inf', got {text!r}")
    if v > MAX_CAPACITY:
        raise CapacityTooLarge(f"capacity {text!r} is more than the largest pool "
                         f"({MAX_CAPACITY:,} tokens); 'inf' is unbounded")
    return int(v)


def _n(x):
    return f"{x:,}"


def _count(n, word, plural=None):
    """``1, "state"`` -> ``"1 state"``; ``2, "state"`` -> ``"2 states"``."""
    return f"{n:,} {word if n == 1 else (plural or word + 's')}"


def format_tokens(n):
    """``2000000`` -> ``"2M"``, ``65536`` -> ``"65.5k"`` (3 significant digits)."""
    for unit, size in (("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:g}"


def kv_lines(capacity, bytes_per_token, layout=None, swa_tokens=None, mamba_states=None,
             host_tokens=None, host_swa_tokens=None, host_states=None):
    """Report lines for the KV sizing: the model's layout and what ``capacity``
    tokens cost at ``bytes_per_token`` (the full-attention pool); with
    ``swa_tokens`` (the SWA mode's SWA pool, tokens) also that pool, at the
    layout's ``swa_kv_bytes_per_token``, and the sum; with ``mamba_states``
    (the Mamba mode's state pools, a list of state counts) what each costs at
    the layout's ``mamba_state_bytes()``, on top of the full-attention pool (and
    of the SWA pool in the SWA + Mamba mode); with ``host_tokens`` (the host
    tier mode's host pool, tokens, or ``"inf"``) what that pool costs in host
    memory at the same bytes per token (SGLang's host pool holds the same KV
    layout); with ``host_swa_tokens`` / ``host_states`` (the SWA host pool in
    tokens, the Mamba host pool in states) what those cost too, at the layout's
    SWA bytes per token and state bytes."""
    lines = list(layout.describe(swa_replayed=swa_tokens is not None,
                                 mamba_replayed=bool(mamba_states))) if layout is not None \
        else [f"KV {bytes_per_token:,} bytes/token (--kv-bytes-per-token)"]
    if capacity not in (None, "inf"):
        lines.append(f"full-attention pool {_n(capacity)} tokens = "
                     f"{format_bytes(capacity * bytes_per_token)} "
                     f"({_n(capacity * bytes_per_token)} bytes)")
        if swa_tokens is not None and layout is not None:
            sb = swa_tokens * layout.swa_kv_bytes_per_token
            total = capacity * bytes_per_token + sb
            lines.append(f"sliding-window pool {_n(swa_tokens)} tokens = {format_bytes(sb)} "
                         f"({_n(sb)} bytes); both pools {format_bytes(total)} ({_n(total)} bytes)")
    state_bytes = layout.mamba_state_bytes() if layout is not None else None
    besides = ("the full-attention and sliding-window pools" if swa_tokens is not None
               else "the full-attention pool")
    for n in (mamba_states or ()) if state_bytes else ():
        lines.append(f"Mamba state pool {_count(n, 'state')} = {format_bytes(n * state_bytes)} "
                     f"({_n(n * state_bytes)} bytes), besides {besides}")
    if host_tokens not in (None, "inf", math.inf) and bytes_per_token:
        hb = host_tokens * bytes_per_token
        lines.append(f"host pool {_n(host_tokens)} tokens = {format_bytes(hb)} ({_n(hb)} bytes) "
                     f"of host memory")
    if host_swa_tokens and layout is not None and layout.swa_kv_bytes_per_token:
        hb = host_swa_tokens * layout.swa_kv_bytes_per_token
        lines.append(f"SWA host pool {_n(host_swa_tokens)} tokens = {format_bytes(hb)} "
                     f"({_n(hb)} bytes) of host memory")
    if host_states and state_bytes:
        hb = host_states * state_bytes
        lines.append(f"Mamba host pool {_count(host_states, 'state')} = {format_bytes(hb)} "
                     f"({_n(hb)} bytes) of host memory")
    return lines


def _lost_line(label, lost, prompt_tokens, why):
    share = 100 * lost / prompt_tokens if prompt_tokens else 0.0
    return f"  {label:<16}{_n(lost)} ({share:.2f} % of prompt tokens: Full KV cached, {why})"


def _hybrid_lines(r):
    """The hybrid mode's report lines (lost hits, evictions per pool, peak tree
    size), or None for a Full-only run."""
    mode = hybrid_mode(r)
    if mode is not None and mode.host:
        def share(x):
            return f"{100 * x / r.prompt_tokens:.2f} %" if r.prompt_tokens else "0.00 %"
        declined = (f"; {_n(r.declined_host_tokens)} more on the host recomputed (below the "
                    f"threshold or no device room)" if r.declined_host_tokens else "")
        rejected = r.loaded_tokens - r.host_hit_tokens
        rejected = (f"; {_n(rejected)} loaded for requests then rejected" if rejected else "")
        restored = ""
        if mode.base is not None:
            parts = []
            if r.swa_window is not None:
                parts.append(f"{_count(r.swa_host_loaded_tokens, 'SWA token')}")
            if r.mamba_states is not None:
                parts.append(f"{_count(r.host_state_loads, 'state')}")
            restored = f"; restored {' and '.join(parts)}"
        lines = [
            f"  device hits     {_n(r.device_hit_tokens)} ({share(r.device_hit_tokens)})",
            f"  host hits       {_n(r.host_hit_tokens)} ({share(r.host_hit_tokens)}: loaded "
            f"back, {_count(r.load_backs, 'load')}{restored}{rejected}{declined})",
            f"  misses          {_n(r.miss_tokens)} ({share(r.miss_tokens)}: computed)",
        ]
        if mode.base is None:
            return lines + [
                f"  evicted tokens  {_n(r.evicted_tokens)} from the device "
                f"({_n(r.evict_calls)} evict calls; {_n(r.load_evicted_tokens)} by load-backs), "
                f"demoted when backed up",
                f"  peak tree size  {_n(r.peak_tree_tokens)} device tokens, "
                f"{_n(r.peak_host_tree_tokens)} host tokens",
                f"  host tier       {_count(r.backed_up_tokens, 'token')} backed up, "
                f"{_count(r.host_evicted_tokens, 'token')} evicted from the host",
            ]
        # the model's own lines (lost hits, device evictions per pool...), then the host
        # tier per component: Full tokens, SWA tokens, states
        def per_component(full, swa, states, unit="token"):
            parts = [f"Full {_count(full, unit)}"]
            if r.swa_window is not None:
                parts.append(f"SWA {_count(swa, unit)}")
            if r.mamba_states is not None:
                parts.append(f"Mamba {_count(states, 'state')}")
            return ", ".join(parts)
        by_load = per_component(r.load_evicted_tokens, r.load_swa_evicted_tokens,
                                r.load_evicted_states)
        backed = per_component(r.backed_up_tokens, r.swa_backed_up_tokens, r.backed_up_states)
        gone = per_component(r.host_evicted_tokens, r.swa_host_evicted_tokens,
                             r.host_evicted_states)
        peak = per_component(r.peak_host_tree_tokens, r.peak_swa_host_tree_tokens,
                             r.peak_host_tree_states)
        return lines + _hybrid_lines_of(r, mode.base) + [
            f"  by load-backs   {by_load} evicted from the device (in the evictions above)",
            f"  backed up       {backed}",
            f"  host evicted    {gone}",
            f"  peak host tree  {peak}",
        ]
    return _hybrid_lines_of(r, mode)


def _hybrid_lines_of(r, mode):
    """The lines of a device-side hybrid mode (SWA, Mamba, SWA + Mamba), or None."""
    if mode is SWA_MAMBA_MODE:
        return [
            _lost_line("lost to window", r.window_lost_hit_tokens, r.prompt_tokens,
                       "a state at its end, its window's SWA KV dropped"),
            _lost_line("lost to ckpt", r.checkpoint_lost_hit_tokens, r.prompt_tokens,
                       "no Mamba state at its end"),
            f"  evicted         Full {_count(r.evicted_tokens, 'token')}, SWA "
            f"{_count(r.swa_evicted_tokens, 'token')}, Mamba "
            f"{_count(r.mamba_evicted_states, 'state')} ({_count(r.evict_calls, 'evict call')})",
            f"  window slides   {_n(r.swa_slid_tokens)} SWA slots freed "
            f"({_n(r.latency_us.get('evict_sliding_windows', {}).get('count', 0))} calls)",
            f"  state waits     {_count(r.mamba_waits, 'completion')} waited for a free state "
            f"slot",
            f"  peak tree size  {_count(r.peak_tree_tokens, 'Full token')}, "
            f"{_count(r.peak_swa_tree_tokens, 'SWA token')}, "
            f"{_count(r.peak_mamba_tree_states, 'Mamba state')}",
        ]
    if mode is SWA_MODE:
        return [
            _lost_line("lost to window", r.window_lost_hit_tokens, r.prompt_tokens,
                       "its SWA KV dropped"),
            f"  evicted tokens  Full {_n(r.evicted_tokens)}, SWA {_n(r.swa_evicted_tokens)} "
            f"({_n(r.evict_calls)} evict calls)",
            f"  window slides   {_n(r.swa_slid_tokens)} SWA slots freed "
            f"({_n(r.latency_us.get('evict_sliding_windows', {}).get('count', 0))} calls)",
            f"  peak tree size  {_n(r.peak_tree_tokens)} Full tokens, "
            f"{_n(r.peak_swa_tree_tokens)} SWA tokens",
        ]
    if mode is MAMBA_MODE:
        return [
            _lost_line("lost to ckpt", r.checkpoint_lost_hit_tokens, r.prompt_tokens,
                       "no Mamba state at its end"),
            f"  evicted         Full {_count(r.evicted_tokens, 'token')}, Mamba "
            f"{_count(r.mamba_evicted_states, 'state')} "
            f"({_count(r.evict_calls, 'evict call')})",
            f"  state waits     {_count(r.mamba_waits, 'completion')} waited for a free state "
            f"slot",
            f"  peak tree size  {_count(r.peak_tree_tokens, 'Full token')}, "
            f"{_count(r.peak_mamba_tree_states, 'Mamba state')}",
        ]
    return None


def format_report(r, kv=None):
    """A ``ReplayResult`` as an aligned text block. ``kv``: lines from
    :func:`kv_lines` to show under the header."""
    cap = "unbounded" if r.capacity == "inf" else f"{_n(r.capacity)} tokens"
    name = os.path.basename(r.workload) if os.sep in r.workload else r.workload
    mode = ""
    if r.mode == "arrival":
        a = r.arrival
        mode = (f" | arrival times x{a['rate_scale']:g}, prefill {a['prefill_tokens_per_s']:,.0f} "
                f"tok/s, decode {a['decode_tokens_per_s']:,.0f} tok/s")
    swa = r.swa_window is not None
    mamba = r.mamba_states is not None
    lines = [
        f"flatradix replay: {name}",
        f"  page size {r.page_size} | capacity {cap} | max running {r.max_running:,} | "
        f"policy {r.policy}" + (" | outputs cached" if r.cache_outputs else "") + mode,
    ]
    if swa:
        lines.append(f"  sliding window {_n(r.swa_window)} tokens | SWA pool {_n(r.swa_pool_slots)} "
                     f"tokens (swa ratio {r.swa_ratio:g})")
    extra = bool(r.mamba_extra_buffer)
    if mamba and extra:
        grid = r.mamba_chunk * r.page_size // math.gcd(r.mamba_chunk, r.page_size)
        lines.append(f"  Mamba state pool {_count(r.mamba_states, 'state')} | chunk "
                     f"{_n(r.mamba_chunk)} | extra buffer (grid {_n(grid)}, 3 slots a "
                     f"running request)")
    elif mamba:
        lines.append(f"  Mamba state pool {_count(r.mamba_states, 'state')} | chunk "
                     f"{_n(r.mamba_chunk)} (no extra buffer)")
    host = r.host_capacity is not None
    if host:
        hcap = "unbounded" if r.host_capacity == "inf" else f"{_n(r.host_capacity)} tokens"
        aux = ""
        if swa:
            aux += f" | SWA host pool {_n(r.swa_host_pool_slots)} tokens"
        if mamba:
            aux += f" | Mamba host pool {_count(r.mamba_host_pool_slots, 'state')}"
        lines.append(f"  host tier {hcap} (pool {_n(r.host_pool_slots)}){aux} | "
                     f"{r.write_policy} | load-back threshold {_n(r.load_back_threshold)}")
    lines += [f"  {s}" for s in (kv or [])]
    lines += [
        "",
        f"  requests        {_n(r.requests)} ({_n(r.served_requests)} served, "
        f"{_n(r.rejected_requests)} rejected)",
        f"  prompt tokens   {_n(r.prompt_tokens)}",
        f"  hit tokens      {_n(r.hit_tokens)} ({100 * r.token_hit_ratio:.2f} % token hit ratio"
        + (": device + host)" if host else ")"),
    ]
    hybrid = _hybrid_lines(r)
    if hybrid:
        lines += hybrid
    else:
        lines += [
            f"  evicted tokens  {_n(r.evicted_tokens)} ({_n(r.evict_calls)} evict calls)",
            f"  peak tree size  {_n(r.peak_tree_tokens)} tokens",
        ]
    lines += [
        f"  wall time       {r.wall_s:.2f} s ({r.requests_per_s:,.0f} requests/s, "
        f"{r.prompt_tokens_per_s / 1e6:,.1f} M prompt tokens/s; CPU {r.cpu_s:.2f} s)",
        f"  KV conservation {'ok' if r.kv_conserved else 'BROKEN'}",
    ]
    if r.warmup_s >= 0.05:
        lines.append(f"  JIT warm-up     {r.warmup_s:.2f} s (kernels compiled or loaded; not in "
                     f"the wall time)")
    if r.mode == "arrival":
        a = r.arrival
        w = a["wait_ms"]
        states = f", {_n(r.mamba_waits)} (no Mamba state slot)" if mamba else ""
        lines += [
            f"  arrival span    {a['span_s']:,.1f} s; running requests peak {a['peak_running']:,}, "
            f"mean {a['mean_running']:,.2f}",
            f"  waits           {_n(a['waited_requests'])} requests waited, for "
            f"{_n(a['kv_waits'])} completions (KV short) and {_n(a['slot_waits'])} (no running "
            f"slot){states}; wait p50 {w['p50']:,.0f} ms, p99 {w['p99']:,.0f} ms, "
            f"max {w['max']:,.0f} ms",
            "",
            f"  {'from s':>9}{'arrived':>9}{'rejected':>9}{'waited':>8}{'running':>9}"
            f"{'(mean)':>9}{'queued':>8}{'max wait ms':>13}",
        ]
        for b in a["timeline"]:
            lines.append(f"  {b['t_s']:>9,.0f}{b['arrivals']:>9,}{b['rejected']:>9,}"
                         f"{b['waited']:>8,}{b['running_max']:>9,}{b['running_mean']:>9.2f}"
                         f"{b['queued_max']:>8,}{b['wait_ms_max']:>13,.0f}")
    lines += [f"  note: {s}" for s in r.notes]
    w = 23 if swa or host else 20
    lines += [
        "",
        f"  {'cache op':<{w}}{'calls':>10}{'p50 us':>10}{'p99 us':>10}",
    ]
    ops = (HOST_OPS + (("evict_sliding_windows",) if swa else ()) if host else SWA_OPS if swa
           else MAMBA_EXTRA_OPS if extra else OPS)
    for op in ops:
        s = r.latency_us.get(op, {})
        if not s or not s["count"]:
            lines.append(f"  {op:<{w}}{0:>10}{'-':>10}{'-':>10}")
        else:
            lines.append(f"  {op:<{w}}{_n(s['count']):>10}{s['p50']:>10.1f}{s['p99']:>10.1f}")
    return "\n".join(lines)


# ---------------------------------------------------------------- sweep
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


_worker_workload = None


def _init_worker(workload):
    global _worker_workload
    _worker_workload = workload


def _run_point(task):
    policy, capacity, kwargs = task
    return replay(_worker_workload, capacity=capacity, policy=policy, **kwargs)


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
          host_capacities=None, **kwargs):
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
        Processes to run the replays in (``concurrent.futures``); the figures
        are the same as ``jobs=1``'s (only ``wall_s`` differs).
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
    results = [None] * len(tasks)
    try:
        if jobs == 1:
            for k, (p, c, j) in enumerate(tasks):
                results[k] = replay(workload, capacity=c, policy=p, progress=progress,
                                    **kwargs, **runs[j])
                _tick(bar, results[k])
        else:
            from concurrent.futures import ProcessPoolExecutor, as_completed

            with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), initializer=_init_worker,
                                     initargs=(workload,)) as ex:
                futs = {ex.submit(_run_point, (p, c, dict(kwargs, **runs[j]))): k
                        for k, (p, c, j) in enumerate(tasks)}
                for f in as_completed(futs):
                    results[futs[f]] = f.result()
                    _tick(bar, results[futs[f]])
    finally:
        if bar is not None:
            bar.close()
    unbs = results[len(results) - nu:]
    unb = unbs[0]
    bpt = (bytes_per_token, swa_bytes_per_token)
    curve = {
        "workload": workload.name, "requests": len(workload),
        "prompt_tokens": workload.prompt_tokens, "page_size": unb.page_size,
        "max_running": unb.max_running, "mode": unb.mode, "policies": policies,
        "cache_outputs": unb.cache_outputs, "kv_bytes_per_token": bytes_per_token,
        "arrival": ({k: v for k, v in unb.arrival.items()
                     if k in ("prefill_tokens_per_s", "decode_tokens_per_s", "rate_scale")}
                    if unb.arrival else None),
        "unbounded": _point(unb, *bpt),
        "unbounded_hit_ratio": unb.token_hit_ratio,
        "points": [_point(r, *bpt) for r in results[:len(results) - nu]],
    }
    if mode is not None and mode.host:
        curve["host"] = {"capacities": [("inf" if h == math.inf else h)
                                        for h in host_capacities],
                         "write_policy": unb.write_policy,
                         "load_back_threshold": unb.load_back_threshold,
                         "swa_window": unb.swa_window, "swa_ratio": unb.swa_ratio,
                         "swa_kv_bytes_per_token": swa_bytes_per_token,
                         "mamba_states": unb.mamba_states, "mamba_chunk": unb.mamba_chunk,
                         "swa_host_capacity": kwargs.get("swa_host_capacity"),
                         "mamba_host_states": kwargs.get("mamba_host_states"),
                         "unbounded": [_point(r, *bpt) for r in unbs]}
    elif mode is SWA_MAMBA_MODE:
        curve["swa_mamba"] = {"series": axis, "windows": list(swa_windows),
                              "states": list(mamba_states), "ratio": unb.swa_ratio,
                              "chunk": unb.mamba_chunk,
                              "swa_kv_bytes_per_token": swa_bytes_per_token,
                              "unbounded": [_point(r, *bpt) for r in unbs]}
    elif mode is SWA_MODE:
        curve["swa"] = {"windows": list(swa_windows), "ratio": unb.swa_ratio,
                        "swa_kv_bytes_per_token": swa_bytes_per_token,
                        "unbounded": [_point(r, *bpt) for r in unbs]}
    elif mode is MAMBA_MODE:
        curve["mamba"] = {"states": list(mamba_states), "chunk": unb.mamba_chunk,
                          "extra_buffer": unb.mamba_extra_buffer,
                          "unbounded": [_point(r, *bpt) for r in unbs]}
    return curve


def format_sweep(curve):
    """The sweep as a text table (one row per point, then the unbounded run; SWA
    mode: with the window, the hits lost to it and the SWA evictions, and one
    unbounded row per window; Mamba mode the same with the state pool, the hits
    lost to checkpoint granularity and the states evicted; SWA + Mamba mode both
    modes' columns, one unbounded row per series)."""
    if curve.get("host"):
        return _format_host_sweep(curve)
    if _curve_series(curve):
        return _format_hybrid_sweep(curve)
    mem = curve.get("kv_bytes_per_token")
    head = f"{'policy':>8}{'capacity':>15}" + (f"{'KV memory':>12}" if mem else "")
    lines = [head + f"{'hit ratio':>11}{'evicted':>16}{'rejected':>10}"]
    for p in curve["points"] + [curve["unbounded"]]:
        cap = "inf" if p["capacity"] == "inf" else _n(p["capacity"])
        pol = p["policy"] if p is not curve["unbounded"] else "any"
        row = f"{pol:>8}{cap:>15}"
        if mem:
            row += f"{format_bytes(p['kv_bytes']) if p['kv_bytes'] else 'inf':>12}"
        lines.append(row + f"{100 * p['token_hit_ratio']:>10.2f}%"
                     f"{_n(p['evicted_tokens']):>16}{_n(p['rejected_requests']):>10}")
    return "\n".join(lines)


#: Sweep table headings of the hybrid modes' fields: the series columns
#: (``HybridMode.params``), lost and evicted columns.
_SWEEP_HEADINGS = {"swa_window": "window", "mamba_states": "states",
                   "window_lost_hit_tokens": "lost to W",
                   "checkpoint_lost_hit_tokens": "lost to ckpt",
                   "swa_evicted_tokens": "SWA evicted", "mamba_evicted_states": "states evicted"}


def _format_hybrid_sweep(curve):
    mem = curve.get("kv_bytes_per_token")
    mode, _, _, unbounded = _curve_series(curve)
    pool = "swa_window" in mode.params    # the SWA pool column
    head = (f"{'policy':>8}" + "".join(f"{_SWEEP_HEADINGS[k]:>9}" for k in mode.params)
            + f"{'capacity':>15}" + (f"{'SWA pool':>13}" if pool else "")
            + (f"{'KV memory':>12}" if mem else ""))
    if mode is SWA_MAMBA_MODE:
        sm = curve["swa_mamba"]
        title = (f"sliding-window + Mamba replay: page 1, SWA pool = {sm['ratio']:g} x "
                 f"capacity, chunk {sm['chunk']}, states = the state pool")
    elif mode is SWA_MODE:
        title = f"sliding-window replay: SWA pool = {curve['swa']['ratio']:g} x capacity"
    elif curve["mamba"].get("extra_buffer"):
        title = (f"Mamba replay with the extra buffer: page {curve['page_size']}, chunk "
                 f"{curve['mamba']['chunk']}, states = the state pool")
    else:
        title = f"Mamba replay: page 1, chunk {curve['mamba']['chunk']}, states = the state pool"
    lines = [title, head + f"{'hit ratio':>11}"
             + "".join(f"{_SWEEP_HEADINGS[k]:>13}" for k in mode.lost) + f"{'evicted':>16}"
             + "".join(f"{_SWEEP_HEADINGS[k]:>16}" for k in mode.evicted) + f"{'rejected':>10}"]
    for p in curve["points"] + unbounded:
        unb = p["capacity"] == "inf"
        cap = "inf" if unb else _n(p["capacity"])
        row = (f"{'any' if unb else p['policy']:>8}"
               + "".join(f"{_n(p[k]):>9}" for k in mode.params) + f"{cap:>15}")
        if pool:
            row += f"{'inf' if unb else _n(p['swa_pool_slots']):>13}"
        if mem:
            row += f"{format_bytes(p['kv_bytes']) if p['kv_bytes'] else 'inf':>12}"
        lines.append(row + f"{100 * p['token_hit_ratio']:>10.2f}%"
                     + "".join(f"{_n(p[k]):>13}" for k in mode.lost)
                     + f"{_n(p['evicted_tokens']):>16}"
                     + "".join(f"{_n(p[k]):>16}" for k in mode.evicted)
                     + f"{_n(p['rejected_requests']):>10}")
    return "\n".join(lines)


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


def _format_host_sweep(curve):
    """The host tier sweep: one row per (host pool, policy, capacity) with the hit
    ratio split by tier, the unbounded row, then per policy the grid of total hit
    ratios (host pools down, device capacities across)."""
    mem = curve.get("kv_bytes_per_token")
    h = curve["host"]
    mode = _curve_series(curve)[0]
    lost = mode.lost    # the hybrid model's lost hits (empty for Full attention)
    lines = [f"host tier replay{_host_model(h)}: {h['write_policy']}, load-back threshold "
             f"{h['load_back_threshold']}; hit ratio = (device + host hits) / prompt tokens",
             f"{'policy':>8}{'host':>15}{'capacity':>15}" + (f"{'KV memory':>12}" if mem else "")
             + f"{'hit ratio':>11}{'device':>9}{'host':>9}"
             + "".join(f"{_SWEEP_HEADINGS[k]:>13}" for k in lost)
             + f"{'evicted':>16}{'loaded':>14}{'rejected':>10}"]
    unb = h["unbounded"]
    for p in curve["points"] + unb:
        is_unb = p["capacity"] == "inf"
        cap = "inf" if is_unb else _n(p["capacity"])
        hc = p["host_capacity"]
        # with Mamba the unbounded KV pool's state pool still evicts: its host pool counts
        any_host = is_unb and p.get("mamba_states") is None
        row = (f"{'any' if is_unb else p['policy']:>8}"
               f"{('any' if any_host else 'inf' if hc == 'inf' else _n(hc)):>15}{cap:>15}")
        if mem:
            row += f"{format_bytes(p['kv_bytes']) if p['kv_bytes'] else 'inf':>12}"
        lines.append(row + f"{100 * p['token_hit_ratio']:>10.2f}%"
                     f"{100 * p['device_hit_ratio']:>8.2f}%{100 * p['host_hit_ratio']:>8.2f}%"
                     + "".join(f"{_n(p[k]):>13}" for k in lost)
                     + f"{_n(p['evicted_tokens']):>16}{_n(p['loaded_tokens']):>14}"
                     f"{_n(p['rejected_requests']):>10}")
    caps = sorted({p["capacity"] for p in curve["points"] if p["capacity"] != "inf"})
    hosts = sorted(h["capacities"], key=_host_key)
    corner = "host \\ device"
    for pol in curve["policies"]:
        cell = {(p["host_capacity"], p["capacity"]): p for p in curve["points"]
                if p["policy"] == pol}
        lines += ["", f"total hit ratio (%), {pol}: host pool (rows) x device pool (columns)",
                  f"{corner:>14}" + "".join(f"{format_tokens(c):>9}" for c in caps)]
        for hc in hosts:
            lines.append(f"{_host_label(hc):>14}" + "".join(
                f"{100 * cell[(hc, c)]['token_hit_ratio']:>9.2f}" if (hc, c) in cell else
                f"{'-':>9}" for c in caps))
    return "\n".join(lines)


# ---------------------------------------------------------------- CSV
SWEEP_COLUMNS = ("policy", "capacity", "kv_bytes", "token_hit_ratio", "hit_tokens",
                 "evicted_tokens", "rejected_requests", "waits", "peak_tree_tokens", "wall_s",
                 "peak_running", "mean_running", "waited_requests", "wait_ms_p99")

RUN_COLUMNS = ("policy", "capacity", "pool_slots", "page_size", "max_running", "mode",
               "requests", "served_requests", "rejected_requests", "prompt_tokens",
               "output_tokens", "hit_tokens", "token_hit_ratio", "evicted_tokens", "evict_calls",
               "waits", "peak_tree_tokens", "wall_s", "peak_running", "mean_running",
               "waited_requests", "wait_ms_p99")

PER_REQUEST_COLUMNS = ("policy", "request", "arrival_ms", "prompt_tokens", "output_tokens",
                       "hit_tokens", "evicted_tokens", "waited", "wait_ms", "finish_ms",
                       "rejected")

#: Columns the SWA mode appends to each CSV (absent otherwise).
SWA_COLUMNS = SWA_FIELDS
SWA_PER_REQUEST_COLUMNS = (SWA_MODE.param,) + SWA_MODE.per_request
#: Columns the Mamba mode appends to each CSV (absent otherwise).
MAMBA_COLUMNS = MAMBA_MODE.fields
MAMBA_PER_REQUEST_COLUMNS = (MAMBA_MODE.param,) + MAMBA_MODE.per_request
#: Columns the SWA + Mamba mode appends to each CSV (absent otherwise): both modes'.
SWA_MAMBA_COLUMNS = SWA_MAMBA_MODE.fields
SWA_MAMBA_PER_REQUEST_COLUMNS = SWA_MAMBA_MODE.params + SWA_MAMBA_MODE.per_request


def _runs_mode(results):
    """The hybrid mode of a list of runs (they share it), or None."""
    return next((m for m in map(hybrid_mode, results) if m is not None), None)


def _cell(v):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return repr(v)      # full precision: read back equal
    return v


def write_sweep_csv(curve, path):
    """One row per sweep point and one for the unbounded run (``capacity`` ``inf``),
    columns :data:`SWEEP_COLUMNS` (empty where a figure does not apply); the SWA
    mode adds :data:`SWA_COLUMNS` and one unbounded row per window, the Mamba
    mode :data:`MAMBA_COLUMNS` and one unbounded row per state pool, the SWA +
    Mamba mode :data:`SWA_MAMBA_COLUMNS` and one unbounded row per series."""
    series = _curve_series(curve)
    cols = SWEEP_COLUMNS + (series[0].fields if series else ())
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for p in curve["points"] + (series[3] if series else [curve["unbounded"]]):
            w.writerow([_cell(p.get(c)) for c in cols])


def write_runs_csv(results, path, bytes_per_token=None, swa_bytes_per_token=None):
    """One row per ``ReplayResult``, columns :data:`RUN_COLUMNS` plus ``kv_bytes``
    (plus :data:`SWA_COLUMNS` in the SWA mode, ``kv_bytes`` then counting the SWA
    pool at ``swa_bytes_per_token`` too; plus :data:`MAMBA_COLUMNS` in the Mamba
    mode, :data:`SWA_MAMBA_COLUMNS` in the SWA + Mamba mode)."""
    mode = _runs_mode(results)
    extra = mode.fields if mode else ()
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(RUN_COLUMNS + ("kv_bytes",) + extra)
        for r in results:
            d = r.to_dict()
            a = d.get("arrival") or {}
            d.update(peak_running=a.get("peak_running"), mean_running=a.get("mean_running"),
                     waited_requests=a.get("waited_requests"),
                     wait_ms_p99=(a.get("wait_ms") or {}).get("p99"))
            kvb = _kv_bytes(r, bytes_per_token, swa_bytes_per_token)
            w.writerow([_cell(d.get(c)) for c in RUN_COLUMNS] + [_cell(kvb)]
                       + [_cell(d.get(c)) for c in extra])


def write_per_request_csv(results, path):
    """One row per request of each run (``record_requests=True``), columns
    :data:`PER_REQUEST_COLUMNS`: ``arrival_ms`` (trace time / rate scale),
    ``hit_tokens``, ``evicted_tokens`` (evicted to admit it), ``waited``
    (running requests it waited for), ``wait_ms`` and ``finish_ms`` (arrival
    mode only), ``rejected`` (0/1); the SWA mode adds
    :data:`SWA_PER_REQUEST_COLUMNS` (``full_kv_hit_tokens``: the match's
    ``full_kv_hit_length``; ``window_lost_hit_tokens``: that minus the hit), the
    Mamba mode :data:`MAMBA_PER_REQUEST_COLUMNS` (``checkpoint_lost_hit_tokens``:
    the full hit minus the hit), the SWA + Mamba mode
    :data:`SWA_MAMBA_PER_REQUEST_COLUMNS` (the full hit minus the hit split in
    ``window_lost_hit_tokens`` and ``checkpoint_lost_hit_tokens``)."""
    mode = _runs_mode(results)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(PER_REQUEST_COLUMNS + ((mode.params + mode.per_request) if mode else ()))
        for r in results:
            pr = r.per_request
            cols = [pr[c].tolist() for c in PER_REQUEST_COLUMNS[2:]]
            extra = []
            if mode:
                cols += [pr[c].tolist() for c in mode.per_request]
                extra = [getattr(r, p) for p in mode.params]
            for i, row in enumerate(zip(*cols)):
                vals = [_cell(v) if not isinstance(v, bool) else int(v) for v in row]
                if mode:
                    k = len(PER_REQUEST_COLUMNS) - 2
                    vals = vals[:k] + extra + vals[k:]
                w.writerow([r.policy, i] + vals)


# ---------------------------------------------------------------- plot
def plot_formats():
    """File name extensions matplotlib can write (``RuntimeError`` without matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        from matplotlib.figure import Figure
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install 'flatradix[plot]'") from None
    return sorted(Figure().canvas.get_supported_filetypes())


def plot_sweep(curve, path, title=None):
    """Write :func:`sweep_figure` to ``path`` (any format matplotlib writes, by its
    extension). Needs matplotlib (``pip install flatradix[plot]``)."""
    import matplotlib.pyplot as plt

    fig = sweep_figure(curve, title)
    fig.savefig(path)
    plt.close(fig)
    return path


def sweep_figure(curve, title=None):
    """Hit ratio vs capacity (log x), one line per policy, the unbounded hit ratio
    dashed; a tick at every swept capacity, labelled with its tokens (and KV
    memory above them when the curve has ``kv_bytes_per_token``). SWA mode: one
    line per (window, policy) and one dashed unbounded line per window, a
    window's lines in one colour; Mamba mode the same per state pool, SWA +
    Mamba mode per window or state pool (whichever the series vary). Host tier
    mode: :func:`host_figure`, a heatmap. Returns the matplotlib ``Figure`` (Agg
    backend). ``RuntimeError`` without matplotlib."""
    plot_formats()
    if curve.get("host"):
        return host_figure(curve, title)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, NullLocator

    finite = [p for p in curve["points"] if p["capacity"] != "inf"]
    caps = sorted({p["capacity"] for p in finite})
    bpt = curve.get("kv_bytes_per_token")
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    swa = curve.get("swa") or curve.get("swa_mamba")
    series = _curve_series(curve)
    if series:
        mode, param, values, unbounded = series

        def series_name(p):
            parts = []
            if p.get("swa_window") is not None:
                parts.append(f"W={format_tokens(p['swa_window'])}")
            if p.get("mamba_states") is not None:
                n = p["mamba_states"]
                parts.append(f"{format_tokens(n)} state{'' if n == 1 else 's'}")
            return ", ".join(parts)

        marks = "os^vDP*X"
        ub = 0.0
        for j, v in enumerate(values):
            name = series_name(unbounded[j])
            for k, pol in enumerate(curve["policies"]):
                pts = sorted((p for p in finite if p["policy"] == pol and p[param] == v),
                             key=lambda p: p["capacity"])
                ax.plot([p["capacity"] for p in pts], [100 * p["token_hit_ratio"] for p in pts],
                        marks[k % len(marks)] + "-", color=f"C{j}", markersize=4,
                        label=name + (f" {pol}" if len(curve["policies"]) > 1 else ""))
            u = 100 * unbounded[j]["token_hit_ratio"]
            ub = max(ub, u)
            ax.axhline(u, color=f"C{j}", linestyle="--", linewidth=0.8,
                       label=f"{name} unbounded ({u:.2f} %)")
    else:
        for k, pol in enumerate(curve["policies"]):
            pts = sorted((p for p in finite if p["policy"] == pol), key=lambda p: p["capacity"])
            ax.plot([p["capacity"] for p in pts], [100 * p["token_hit_ratio"] for p in pts],
                    "o-", color=f"C{k}", label=pol, markersize=4)
        ub = 100 * curve["unbounded_hit_ratio"]
        ax.axhline(ub, color="0.4", linestyle="--", label=f"unbounded ({ub:.2f} %)")
    if caps:
        ax.set_xscale("log")
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(caps)
        if bpt:
            mem = {p["capacity"]: p["kv_bytes"] for p in finite}
            ax.set_xticklabels([f"{format_bytes(mem[c] or c * bpt)}\n{format_tokens(c)}"
                                for c in caps], fontsize=7)
        else:
            ax.set_xticklabels([format_tokens(c) for c in caps], fontsize=8)
        if len(caps) > 12:
            plt.setp(ax.get_xticklabels(), rotation=45, ha="right")
    if swa:
        ax.set_xlabel((f"KV memory (both pools) / full-attention pool tokens (SWA pool "
                       f"{swa['ratio']:g} x)") if bpt else
                      f"full-attention pool (tokens); SWA pool {swa['ratio']:g} x")
    else:
        ax.set_xlabel((f"KV memory (full-attention pool, {bpt:,} bytes/token) / tokens" if bpt
                       else "KV capacity (tokens)")
                      + ("; one line per Mamba state pool" if series else ""))
    if curve.get("swa_mamba"):
        ax.set_xlabel(ax.get_xlabel() + f"; Mamba chunk {curve['swa_mamba']['chunk']}")
    elif (curve.get("mamba") or {}).get("extra_buffer"):
        ax.set_xlabel(ax.get_xlabel() + f" (extra buffer, chunk {curve['mamba']['chunk']})")
    ax.set_ylabel("token hit ratio (%)")
    ax.set_ylim(0, max(ub * 1.1, 1.0))
    name = os.path.basename(curve["workload"])
    mode = "arrival times" if curve.get("mode") == "arrival" else "one pass"
    ax.set_title(title or (f"{name}: {curve['requests']:,} requests\npage {curve['page_size']}, "
                           f"max running {curve['max_running']:,}, {mode}"), fontsize=9)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


def host_figure(curve, title=None):
    """The host tier sweep as a heatmap, one panel per policy: device pool
    across (each swept capacity; with ``kv_bytes_per_token`` its KV memory
    too), host pool up, each cell the token hit ratio (device + host hits over
    prompt tokens) with its device / host split below it; the colour scale runs
    from 0 to the unbounded device pool's hit ratio (the ceiling). Returns the
    matplotlib ``Figure`` (Agg backend). ``RuntimeError`` without matplotlib."""
    plot_formats()
    import matplotlib.pyplot as plt
    import numpy as np

    h = curve["host"]
    hosts = sorted(h["capacities"], key=_host_key)
    caps = sorted({p["capacity"] for p in curve["points"] if p["capacity"] != "inf"})
    bpt = curve.get("kv_bytes_per_token")
    pols = curve["policies"]
    ceiling = 100 * curve["unbounded_hit_ratio"]
    grids = []
    for pol in pols:
        cell = {(p["host_capacity"], p["capacity"]): p for p in curve["points"]
                if p["policy"] == pol}
        grids.append([[cell.get((hc, c)) for c in caps] for hc in hosts])
    top = max([ceiling] + [100 * p["token_hit_ratio"] for g in grids for row in g
                           for p in row if p is not None])
    w = max(6.5, 1.1 * len(caps) + 2.5) if len(pols) == 1 else max(4.5, 1.1 * len(caps) + 2.5)
    fig, axes = plt.subplots(1, len(pols), figsize=(w * len(pols), max(3.5, 0.7 * len(hosts)
                                                                       + 2.2)),
                             dpi=120, squeeze=False, constrained_layout=True)

    def mem_label(tokens):
        return f"{format_bytes(tokens * bpt)}\n{format_tokens(tokens)}" if bpt else \
            format_tokens(tokens)

    image = None
    for ax, pol, grid in zip(axes[0], pols, grids):
        vals = np.array([[np.nan if p is None else 100 * p["token_hit_ratio"] for p in row]
                         for row in grid], dtype=float)
        image = ax.imshow(vals, origin="lower", aspect="auto", cmap="viridis", vmin=0,
                          vmax=max(top, 1e-9))
        for i, row in enumerate(grid):
            for j, p in enumerate(row):
                if p is None:
                    continue
                v = 100 * p["token_hit_ratio"]
                ax.text(j, i, f"{v:.1f} %\n{100 * p['device_hit_ratio']:.1f} + "
                        f"{100 * p['host_hit_ratio']:.1f}", ha="center", va="center",
                        fontsize=7, color="black" if v > 0.6 * top else "white")
        ax.set_xticks(range(len(caps)))
        ax.set_xticklabels([mem_label(c) for c in caps], fontsize=7)
        ax.set_yticks(range(len(hosts)))
        ax.set_yticklabels([("inf" if hc in ("inf", math.inf) else
                             mem_label(hc) if hc else "0") for hc in hosts], fontsize=7)
        ax.set_xlabel("device KV pool" + (f" (memory at {bpt:,} B/token / tokens)" if bpt
                                          else " (tokens)"), fontsize=8)
        ax.set_ylabel("host pool" + (" (memory / tokens)" if bpt else " (tokens)"), fontsize=8)
        if len(pols) > 1:
            ax.set_title(pol, fontsize=9)
    cb = fig.colorbar(image, ax=axes[0].tolist(), fraction=0.05, pad=0.02)
    cb.set_label("token hit ratio, device + host (%)", fontsize=8)
    cb.ax.tick_params(labelsize=7)
    name = os.path.basename(curve["workload"])
    mode = "arrival times" if curve.get("mode") == "arrival" else "one pass"
    fig.suptitle(title or (
        f"{name}: {curve['requests']:,} requests\n"
        + (_host_model(h).strip().replace("; ", "\n") + "\n" if _host_model(h) else "")
        + f"page {curve['page_size']}, "
        f"max running {curve['max_running']:,}, {mode}, host tier {h['write_policy']}, load-back "
        f"threshold {h['load_back_threshold']}\ncells: total % (device + host); unbounded "
        f"device pool" + (f" ({_count(h['mamba_states'], 'state')}, host pool "
                          f"{_host_label(h['capacities'][0])})" if h.get("mamba_states")
                          else "") + f" {ceiling:.2f} %"), fontsize=9)
    return fig
