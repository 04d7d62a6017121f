"""The sweep plot: hit ratio vs capacity (one line per policy and series), or
the host tier's device x host heatmap. Needs matplotlib (``flatradix[plot]``)."""

import math
import os

from .model import format_bytes
from .sweep import _curve_series, _host_key, _host_label, _host_model
from .units import _count, format_tokens

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
            # (an interrupted sweep may lack a series' unbounded run, or every point)
            named = unbounded[j] or next((p for p in finite if p[param] == v), None)
            if named is None:
                continue
            name = series_name(named)
            for k, pol in enumerate(curve["policies"]):
                pts = sorted((p for p in finite if p["policy"] == pol and p[param] == v),
                             key=lambda p: p["capacity"])
                ax.plot([p["capacity"] for p in pts], [100 * p["token_hit_ratio"] for p in pts],
                        marks[k % len(marks)] + "-", color=f"C{j}", markersize=4,
                        label=name + (f" {pol}" if len(curve["policies"]) > 1 else ""))
            if unbounded[j] is not None:
                u = 100 * unbounded[j]["token_hit_ratio"]
                ub = max(ub, u)
                ax.axhline(u, color=f"C{j}", linestyle="--", linewidth=0.8,
                           label=f"{name} unbounded ({u:.2f} %)")
    else:
        for k, pol in enumerate(curve["policies"]):
            pts = sorted((p for p in finite if p["policy"] == pol), key=lambda p: p["capacity"])
            ax.plot([p["capacity"] for p in pts], [100 * p["token_hit_ratio"] for p in pts],
                    "o-", color=f"C{k}", label=pol, markersize=4)
        ub = 0.0
        if curve["unbounded_hit_ratio"] is not None:
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
    ax.set_ylim(0, max(ub * 1.1, 1.0, *(110 * p["token_hit_ratio"] for p in finite)))
    name = os.path.basename(curve["workload"])
    mode = "arrival times" if curve.get("mode") == "arrival" else "one pass"
    ax.set_title(_partial_title(title or (
        f"{name}: {curve['requests']:,} requests\npage {curve['page_size']}, "
        f"max running {curve['max_running']:,}, {mode}"), curve), fontsize=9)
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
    ceiling = 100 * (curve["unbounded_hit_ratio"] or 0.0)   # 0: interrupted before it
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
    fig.suptitle(_partial_title(title or (
        f"{name}: {curve['requests']:,} requests\n"
        + (_host_model(h).strip().replace("; ", "\n") + "\n" if _host_model(h) else "")
        + f"page {curve['page_size']}, "
        f"max running {curve['max_running']:,}, {mode}, host tier {h['write_policy']}, load-back "
        f"threshold {h['load_back_threshold']}\ncells: total % (device + host); unbounded "
        f"device pool" + (f" ({_count(h['mamba_states'], 'state')}, host pool "
                          f"{_host_label(h['capacities'][0])})" if h.get("mamba_states")
                          else "") + f" {ceiling:.2f} %"), curve), fontsize=9)
    return fig


def _partial_title(title, curve):
    """``title`` with a line saying the sweep was interrupted, if it was."""
    part = curve.get("partial")
    if not part:
        return title
    return (f"{title}\npartial (interrupted): {part['finished_runs']:,} of {part['runs']:,} "
            f"runs finished")
