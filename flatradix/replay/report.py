"""Human-readable reports, the capacity sweep and its plot."""

import math
import os

from .sim import OPS, replay

_SUFFIX = {"k": 10**3, "m": 10**6, "g": 10**9}


def parse_capacity(text):
    """``"inf"`` -> ``None``; ``"2000000"``, ``"2M"``, ``"500k"``, ``"1.5G"``, ``"2e6"`` -> int tokens.

    Raises ``ValueError`` for anything else, or a capacity below 1.
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
    return int(v)


def _n(x):
    return f"{x:,}"


def format_report(r):
    """A ``ReplayResult`` as an aligned text block."""
    cap = "unbounded" if r.capacity == "inf" else f"{_n(r.capacity)} tokens"
    name = os.path.basename(r.workload) if os.sep in r.workload else r.workload
    lines = [
        f"flatradix replay: {name}",
        f"  page size {r.page_size} | capacity {cap} | max running {r.max_running} | "
        f"policy {r.policy}" + (" | outputs cached" if r.cache_outputs else ""),
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


def sweep(workload, capacities, progress=False, **kwargs):
    """Replay once per capacity (``None`` = unbounded) plus once unbounded.

    Returns the curve as a JSON-ready dict: ``points`` (one per capacity, in the
    order given) with ``capacity``, ``token_hit_ratio``, ``hit_tokens``,
    ``evicted_tokens``, ``rejected_requests``, ``peak_tree_tokens``, ``wall_s``;
    ``unbounded`` the same for the unbounded run (its ``token_hit_ratio`` is
    the ceiling every finite capacity approaches). ``kwargs`` go to ``replay``.
    """
    def point(r):
        return {"capacity": r.capacity, "token_hit_ratio": r.token_hit_ratio,
                "hit_tokens": r.hit_tokens, "evicted_tokens": r.evicted_tokens,
                "rejected_requests": r.rejected_requests,
                "peak_tree_tokens": r.peak_tree_tokens, "wall_s": round(r.wall_s, 3)}

    points = [point(replay(workload, capacity=c, progress=progress, **kwargs))
              for c in capacities]
    unb = replay(workload, capacity=None, progress=progress, **kwargs)
    return {
        "workload": workload.name, "requests": len(workload),
        "prompt_tokens": workload.prompt_tokens, "page_size": unb.page_size,
        "max_running": unb.max_running, "policy": unb.policy,
        "cache_outputs": unb.cache_outputs, "unbounded": point(unb),
        "unbounded_hit_ratio": unb.token_hit_ratio, "points": points,
    }


def format_sweep(curve):
    lines = [f"{'capacity':>14}{'hit ratio':>11}{'evicted':>16}{'rejected':>10}"]
    for p in curve["points"] + [curve["unbounded"]]:
        cap = "inf" if p["capacity"] == "inf" else _n(p["capacity"])
        lines.append(f"{cap:>14}{100 * p['token_hit_ratio']:>10.2f}%"
                     f"{_n(p['evicted_tokens']):>16}{_n(p['rejected_requests']):>10}")
    return "\n".join(lines)


def plot_sweep(curve, path):
    """Draw hit ratio vs capacity (log x) with the unbounded hit ratio as a line.

    Needs matplotlib (``pip install flatradix[plot]``); uses the Agg backend.
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install 'flatradix[plot]'") from None
    pts = sorted((p for p in curve["points"] if p["capacity"] != "inf"),
                 key=lambda p: p["capacity"])
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    ax.plot([p["capacity"] for p in pts], [100 * p["token_hit_ratio"] for p in pts],
            "o-", color="tab:blue", label=f"{curve['policy']}, finite capacity")
    ub = 100 * curve["unbounded_hit_ratio"]
    ax.axhline(ub, color="tab:red", linestyle="--", label=f"unbounded ({ub:.2f} %)")
    ax.set_xscale("log")
    ax.set_xlabel("KV capacity (tokens)")
    ax.set_ylabel("token hit ratio (%)")
    ax.set_ylim(0, max(ub * 1.1, 1.0))
    name = os.path.basename(curve["workload"])
    ax.set_title(f"{name}: {curve['requests']:,} requests, page {curve['page_size']}, "
                 f"max running {curve['max_running']}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
