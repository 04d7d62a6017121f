"""Human-readable reports and CSV files of replays and sweeps (the sweep
itself: :mod:`.sweep`; its plot: :mod:`.plot`; capacities: :mod:`.units`)."""

import csv
import math
import os

from .model import format_bytes
from .plot import host_figure, plot_formats, plot_sweep, sweep_figure  # noqa: F401
from .result import (HOST_OPS, MAMBA_EXTRA_OPS, MAMBA_MODE, OPS, SWA_FIELDS, SWA_MAMBA_MODE,
                     SWA_MODE, SWA_OPS, hybrid_mode)
from .sweep import (_curve_series, _host_key, _host_label, _host_model,  # noqa: F401
                    _kv_bytes, _point, _series_runs, sweep)
from .units import (MAX_CAPACITY, CapacityTooLarge, _count, _n,  # noqa: F401
                    format_tokens, parse_capacity)


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
    gaps = any("opt_hit_ratio" in p for p in curve["points"])
    head = f"{'policy':>8}{'capacity':>15}" + (f"{'KV memory':>12}" if mem else "")
    lines = [head + f"{'hit ratio':>11}{'evicted':>16}{'rejected':>10}"
             + (f"{'capacity gap':>14}{'policy gap':>12}" if gaps else "")]
    for p in curve["points"] + _finished([curve["unbounded"]]):
        cap = "inf" if p["capacity"] == "inf" else _n(p["capacity"])
        pol = p["policy"] if p is not curve["unbounded"] else "any"
        row = f"{pol:>8}{cap:>15}"
        if mem:
            row += f"{format_bytes(p['kv_bytes']) if p['kv_bytes'] else 'inf':>12}"
        row += (f"{100 * p['token_hit_ratio']:>10.2f}%"
                f"{_n(p['evicted_tokens']):>16}{_n(p['rejected_requests']):>10}")
        if gaps and "policy_gap" in p:
            row += (f"{100 * p['capacity_gap']:>13.2f}%" if "capacity_gap" in p else f"{'-':>14}")
            row += f"{100 * p['policy_gap']:>11.2f}%"
        lines.append(row)
    if gaps:
        lines.append("gap to the unbounded ceiling = capacity gap (unbounded - opt: only more "
                     "memory closes it) + policy gap (opt - the policy)")
    return _partial("\n".join(lines), curve)


def _finished(points):
    """The points of an unbounded list that finished (an interrupted sweep has
    ``None`` for the others)."""
    return [p for p in points if p is not None]


def _partial(text, curve):
    """``text`` with a last line saying the sweep was interrupted, if it was."""
    part = curve.get("partial")
    if not part:
        return text
    return (text + f"\npartial: interrupted, {part['finished_runs']:,} of {part['runs']:,} "
            f"runs finished (the others are missing above)")


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
    for p in curve["points"] + _finished(unbounded):
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
    return _partial("\n".join(lines), curve)


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
    unb = _finished(h["unbounded"])
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
    return _partial("\n".join(lines), curve)


# ---------------------------------------------------------------- CSV
SWEEP_COLUMNS = ("policy", "capacity", "kv_bytes", "token_hit_ratio", "hit_tokens",
                 "evicted_tokens", "rejected_requests", "waits", "peak_tree_tokens", "wall_s",
                 "peak_running", "mean_running", "waited_requests", "wait_ms_p99")

#: Columns a sweep with ``opt`` among its policies appends (``sweep``'s gap split).
GAP_COLUMNS = ("opt_hit_ratio", "capacity_gap", "policy_gap")

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
    Mamba mode :data:`SWA_MAMBA_COLUMNS` and one unbounded row per series. An
    interrupted sweep (``curve["partial"]``) has the rows of the runs that finished."""
    series = _curve_series(curve)
    cols = SWEEP_COLUMNS + (series[0].fields if series else ())
    if any("opt_hit_ratio" in p for p in curve["points"]):
        cols += GAP_COLUMNS
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for p in curve["points"] + _finished(series[3] if series else [curve["unbounded"]]):
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
