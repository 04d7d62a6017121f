"""Human-readable reports, the capacity sweep (sequential or in processes), CSV
files and the sweep plot."""

import csv
import math
import os

from ._progress import progress_bar
from .model import format_bytes
from .sim import OPS, replay

_SUFFIX = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}

#: Largest capacity in tokens: the largest pool flatradix allocates (2**40 slots).
MAX_CAPACITY = 1 << 40


def parse_capacity(text):
    """``"inf"`` -> ``None``; ``"2000000"``, ``"2M"``, ``"500k"``, ``"1.5G"``, ``"2e6"`` -> int tokens.

    Raises ``ValueError`` for anything else, a capacity below 1, or one above
    :data:`MAX_CAPACITY` (2**40 tokens; ``inf`` is the way to say unbounded).
    """
    s = str(text).strip().lower().replace("_", "").replace(",", "")
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
        raise ValueError(f"capacity {text!r} is more than the largest pool "
                         f"({MAX_CAPACITY:,} tokens); 'inf' is unbounded")
    return int(v)


def _n(x):
    return f"{x:,}"


def format_tokens(n):
    """``2000000`` -> ``"2M"``, ``65536`` -> ``"65.5k"`` (3 significant digits)."""
    for unit, size in (("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:g}"


def kv_lines(capacity, bytes_per_token, layout=None):
    """Report lines for the KV sizing: the model's layout and what ``capacity``
    tokens cost at ``bytes_per_token`` (the full-attention pool)."""
    lines = list(layout.describe()) if layout is not None else [
        f"KV {bytes_per_token:,} bytes/token (--kv-bytes-per-token)"]
    if capacity not in (None, "inf"):
        lines.append(f"full-attention pool {_n(capacity)} tokens = "
                     f"{format_bytes(capacity * bytes_per_token)} "
                     f"({_n(capacity * bytes_per_token)} bytes)")
    return lines


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
    lines = [
        f"flatradix replay: {name}",
        f"  page size {r.page_size} | capacity {cap} | max running {r.max_running:,} | "
        f"policy {r.policy}" + (" | outputs cached" if r.cache_outputs else "") + mode,
    ]
    lines += [f"  {s}" for s in (kv or [])]
    lines += [
        "",
        f"  requests        {_n(r.requests)} ({_n(r.served_requests)} served, "
        f"{_n(r.rejected_requests)} rejected)",
        f"  prompt tokens   {_n(r.prompt_tokens)}",
        f"  hit tokens      {_n(r.hit_tokens)} ({100 * r.token_hit_ratio:.2f} % token hit ratio)",
        f"  evicted tokens  {_n(r.evicted_tokens)} ({_n(r.evict_calls)} evict calls)",
        f"  peak tree size  {_n(r.peak_tree_tokens)} tokens",
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
        lines += [
            f"  arrival span    {a['span_s']:,.1f} s; running requests peak {a['peak_running']:,}, "
            f"mean {a['mean_running']:,.2f}",
            f"  waits           {_n(a['waited_requests'])} requests waited, for "
            f"{_n(a['kv_waits'])} completions (KV short) and {_n(a['slot_waits'])} (no running "
            f"slot); wait p50 {w['p50']:,.0f} ms, p99 {w['p99']:,.0f} ms, max {w['max']:,.0f} ms",
            "",
            f"  {'from s':>9}{'arrived':>9}{'rejected':>9}{'waited':>8}{'running':>9}"
            f"{'(mean)':>9}{'queued':>8}{'max wait ms':>13}",
        ]
        for b in a["timeline"]:
            lines.append(f"  {b['t_s']:>9,.0f}{b['arrivals']:>9,}{b['rejected']:>9,}"
                         f"{b['waited']:>8,}{b['running_max']:>9,}{b['running_mean']:>9.2f}"
                         f"{b['queued_max']:>8,}{b['wait_ms_max']:>13,.0f}")
    lines += [f"  note: {s}" for s in r.notes]
    lines += [
        "",
        f"  {'cache op':<20}{'calls':>10}{'p50 us':>10}{'p99 us':>10}",
    ]
    for op in OPS:
        s = r.latency_us.get(op, {})
        if not s or not s["count"]:
            lines.append(f"  {op:<20}{0:>10}{'-':>10}{'-':>10}")
        else:
            lines.append(f"  {op:<20}{_n(s['count']):>10}{s['p50']:>10.1f}{s['p99']:>10.1f}")
    return "\n".join(lines)


# ---------------------------------------------------------------- sweep
def _point(r, bytes_per_token=None):
    p = {"policy": r.policy, "capacity": r.capacity,
         "kv_bytes": (r.capacity * bytes_per_token
                      if bytes_per_token and r.capacity != "inf" else None),
         "token_hit_ratio": r.token_hit_ratio, "hit_tokens": r.hit_tokens,
         "evicted_tokens": r.evicted_tokens, "rejected_requests": r.rejected_requests,
         "waits": r.waits, "peak_tree_tokens": r.peak_tree_tokens, "wall_s": round(r.wall_s, 3)}
    if r.mode == "arrival":
        p.update(peak_running=r.arrival["peak_running"], mean_running=r.arrival["mean_running"],
                 waited_requests=r.arrival["waited_requests"],
                 wait_ms_p99=r.arrival["wait_ms"]["p99"])
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
        bar.set_postfix_str(f"{result.policy} {cap}: {100 * result.token_hit_ratio:.2f} %",
                            refresh=False)
        bar.update(1)


def sweep(workload, capacities, policies=("lru",), jobs=1, progress=False,
          bytes_per_token=None, **kwargs):
    """Replay once per (policy, capacity), plus once unbounded.

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
    kwargs : passed to :func:`~flatradix.replay.sim.replay`.

    Returns the curve as a JSON-ready dict: ``points`` (policy-major: every
    capacity of the first policy, then the next policy...) each with
    ``policy``, ``capacity``, ``kv_bytes``, ``token_hit_ratio``, ``hit_tokens``,
    ``evicted_tokens``, ``rejected_requests``, ``waits``, ``peak_tree_tokens``,
    ``wall_s`` (arrival mode: also ``peak_running``, ``mean_running``,
    ``waited_requests``, ``wait_ms_p99``); ``unbounded`` the same for one
    unbounded run (no eviction happens, so every policy gives it; run with the
    first policy) and ``unbounded_hit_ratio``, the ceiling every finite
    capacity approaches.
    """
    policies = list(policies)
    if not policies:
        raise ValueError("sweep needs at least one policy")
    jobs = int(jobs)
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    tasks = [(p, c) for p in policies for c in capacities] + [(policies[0], None)]
    # a refresh per finished run (runs take seconds: no need to rate-limit)
    bar = progress_bar(len(tasks), progress, unit="run", desc="sweep", mininterval=0)
    results = [None] * len(tasks)
    try:
        if jobs == 1:
            for k, (p, c) in enumerate(tasks):
                results[k] = replay(workload, capacity=c, policy=p, progress=progress, **kwargs)
                _tick(bar, results[k])
        else:
            from concurrent.futures import ProcessPoolExecutor, as_completed

            with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), initializer=_init_worker,
                                     initargs=(workload,)) as ex:
                futs = {ex.submit(_run_point, (p, c, kwargs)): k for k, (p, c) in enumerate(tasks)}
                for f in as_completed(futs):
                    results[futs[f]] = f.result()
                    _tick(bar, results[futs[f]])
    finally:
        if bar is not None:
            bar.close()
    unb = results[-1]
    return {
        "workload": workload.name, "requests": len(workload),
        "prompt_tokens": workload.prompt_tokens, "page_size": unb.page_size,
        "max_running": unb.max_running, "mode": unb.mode, "policies": policies,
        "cache_outputs": unb.cache_outputs, "kv_bytes_per_token": bytes_per_token,
        "arrival": ({k: v for k, v in unb.arrival.items()
                     if k in ("prefill_tokens_per_s", "decode_tokens_per_s", "rate_scale")}
                    if unb.arrival else None),
        "unbounded": _point(unb, bytes_per_token),
        "unbounded_hit_ratio": unb.token_hit_ratio,
        "points": [_point(r, bytes_per_token) for r in results[:-1]],
    }


def format_sweep(curve):
    """The sweep as a text table (one row per point, then the unbounded run)."""
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


def _cell(v):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return repr(v)      # full precision: read back equal
    return v


def write_sweep_csv(curve, path):
    """One row per sweep point and one for the unbounded run (``capacity`` ``inf``),
    columns :data:`SWEEP_COLUMNS` (empty where a figure does not apply)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(SWEEP_COLUMNS)
        for p in curve["points"] + [curve["unbounded"]]:
            w.writerow([_cell(p.get(c)) for c in SWEEP_COLUMNS])


def write_runs_csv(results, path, bytes_per_token=None):
    """One row per ``ReplayResult``, columns :data:`RUN_COLUMNS` plus ``kv_bytes``."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(RUN_COLUMNS + ("kv_bytes",))
        for r in results:
            d = r.to_dict()
            a = d.get("arrival") or {}
            d.update(peak_running=a.get("peak_running"), mean_running=a.get("mean_running"),
                     waited_requests=a.get("waited_requests"),
                     wait_ms_p99=(a.get("wait_ms") or {}).get("p99"))
            kvb = (r.capacity * bytes_per_token
                   if bytes_per_token and r.capacity != "inf" else None)
            w.writerow([_cell(d.get(c)) for c in RUN_COLUMNS] + [_cell(kvb)])


def write_per_request_csv(results, path):
    """One row per request of each run (``record_requests=True``), columns
    :data:`PER_REQUEST_COLUMNS`: ``arrival_ms`` (trace time / rate scale),
    ``hit_tokens``, ``evicted_tokens`` (evicted to admit it), ``waited``
    (running requests it waited for), ``wait_ms`` and ``finish_ms`` (arrival
    mode only), ``rejected`` (0/1)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(PER_REQUEST_COLUMNS)
        for r in results:
            pr = r.per_request
            cols = [pr[c].tolist() for c in PER_REQUEST_COLUMNS[2:]]
            for i, row in enumerate(zip(*cols)):
                w.writerow([r.policy, i] + [_cell(v) if not isinstance(v, bool) else int(v)
                                            for v in row])


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
    memory above them when the curve has ``kv_bytes_per_token``). Returns the
    matplotlib ``Figure`` (Agg backend). ``RuntimeError`` without matplotlib."""
    plot_formats()
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, NullLocator

    finite = [p for p in curve["points"] if p["capacity"] != "inf"]
    caps = sorted({p["capacity"] for p in finite})
    bpt = curve.get("kv_bytes_per_token")
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
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
            ax.set_xticklabels([f"{format_bytes(c * bpt)}\n{format_tokens(c)}" for c in caps],
                               fontsize=7)
        else:
            ax.set_xticklabels([format_tokens(c) for c in caps], fontsize=8)
        if len(caps) > 12:
            plt.setp(ax.get_xticklabels(), rotation=45, ha="right")
    ax.set_xlabel(f"KV memory (full-attention pool, {bpt:,} bytes/token) / tokens" if bpt
                  else "KV capacity (tokens)")
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
