"""Fleet runs and sweeps: :func:`fleet_sweep` (one fleet replay per instance
count, router, policy and capacity, plus the unbounded ceiling per instance
count and router), text reports, CSV files and the plot (hit ratio against the
number of instances, one line per router).

The gap to the ceiling splits in two when ``opt`` is among the policies:
``capacity_gap`` = unbounded - opt at that capacity (what only more memory buys)
and ``policy_gap`` = opt - the policy (what a better eviction policy could buy),
per point (``replay/opt.py`` says when opt is proven optimal)."""

import csv
import math
import os

from .config import OPT_POLICY
from .fleet import fleet_replay
from .parallel import Interrupted, run_all
from .units import _n, format_tokens

#: Columns of a fleet sweep's CSV (and of ``--csv`` for fleet runs).
FLEET_COLUMNS = ("instances", "router", "policy", "capacity", "fleet_capacity",
                 "token_hit_ratio", "hit_tokens", "evicted_tokens", "rejected_requests",
                 "waits", "balance_requests", "balance_prefill_tokens", "min_instance_hit_ratio",
                 "max_instance_hit_ratio", "opt_hit_ratio", "ceiling_hit_ratio", "capacity_gap",
                 "policy_gap", "waited_requests", "wait_ms_p99", "requests_per_s", "wall_s")


def split_capacity(total, instances, page_size):
    """Each instance's pool when ``total`` tokens (``None``: unbounded) are shared
    by ``instances``: whole pages, rounded down."""
    if total is None:
        return None
    per = int(total) // instances
    return per - per % page_size


def _point(r):
    """A fleet result as one row (``FLEET_COLUMNS``)."""
    caps = r.capacity if isinstance(r.capacity, list) else [r.capacity] * r.instances
    inf = any(c == "inf" for c in caps)
    rates = [p["token_hit_ratio"] for p in r.per_instance]
    p = {"instances": r.instances, "router": r.router, "policy": r.policy,
         "capacity": r.capacity, "fleet_capacity": "inf" if inf else sum(caps),
         "token_hit_ratio": r.token_hit_ratio, "hit_tokens": r.hit_tokens,
         "evicted_tokens": r.evicted_tokens, "rejected_requests": r.rejected_requests,
         "waits": r.waits, "balance_requests": r.balance["requests"],
         "balance_prefill_tokens": r.balance["prefill_tokens"],
         "min_instance_hit_ratio": min(rates), "max_instance_hit_ratio": max(rates),
         "requests_per_s": round(r.requests_per_s, 1), "wall_s": round(r.wall_s, 3)}
    if r.arrival:
        p.update(waited_requests=r.arrival["waited_requests"],
                 wait_ms_p99=r.arrival["wait_ms"]["p99"])
    return p


def _run_point(workload, task):
    instances, router, policy, capacity, kwargs = task
    return fleet_replay(workload, instances=instances, router=router, capacity=capacity,
                        policy=policy, **kwargs)


def fleet_sweep(workload, capacities, instances=(2,), routers=("kv",), policies=("lru",),
                split=False, jobs=1, progress=False, backend=None, on_result=None, **kwargs):
    """Fleet replays over every (instances, router, policy, capacity), plus one with
    unbounded pools per (instances, router); ``capacities``: each instance's pool,
    or with ``split`` the fleet's total (shared evenly, whole pages). ``kwargs``:
    :func:`~flatradix.replay.fleet.fleet_replay`'s. ``policy="opt"`` runs only with
    routers that do not read the caches (the others' points are left out, with a
    note). ``jobs`` / ``backend`` / ``on_result``: as
    :func:`~flatradix.replay.parallel.run_all`'s.
    Returns the curve: ``points`` (one dict per run, ``FLEET_COLUMNS``),
    ``unbounded`` (per instances and router), and, with ``opt``, each point's gap
    split (module docstring). Ctrl-C: :class:`Interrupted` carrying the curve of
    the runs that finished (``partial``)."""
    from .fleet import STATELESS_ROUTERS

    page = kwargs.get("page_size", 16)
    notes = []
    tasks = []
    for n in instances:
        for router in routers:
            for pol in policies:
                if pol == OPT_POLICY and router not in STATELESS_ROUTERS:
                    notes.append(f"opt left out with the {router} router (it reads the caches: "
                                 f"the requests each instance gets are not known in advance)")
                    continue
                for c in capacities:
                    cap = split_capacity(c, n, page) if split else c
                    tasks.append((n, router, pol, cap, kwargs))
    unb = [(n, router, policies[0] if policies[0] != OPT_POLICY else "lru", None, kwargs)
           for n in instances for router in routers]
    work = tasks + unb
    try:
        results = run_all(_run_point, workload, work, jobs, on_result=on_result,
                          backend=backend)
    except Interrupted as e:
        if e.finished:
            e.partial = _curve(workload, work, len(tasks), e.results, split, policies,
                               sorted(set(notes)))
        raise
    return _curve(workload, work, len(tasks), results, split, policies, sorted(set(notes)))


def _curve(workload, work, n_points, results, split, policies, notes):
    points = [_point(r) for r in results[:n_points] if r is not None]
    unbounded = [_point(r) for r in results[n_points:] if r is not None]
    ceiling = {(u["instances"], u["router"]): u["token_hit_ratio"] for u in unbounded}
    if OPT_POLICY in policies:
        opt = {(p["instances"], p["router"], str(p["capacity"])): p["token_hit_ratio"]
               for p in points if p["policy"] == OPT_POLICY}
        for p in points:
            o = opt.get((p["instances"], p["router"], str(p["capacity"])))
            u = ceiling.get((p["instances"], p["router"]))
            if o is not None:
                p["opt_hit_ratio"] = o
                p["policy_gap"] = o - p["token_hit_ratio"]
            if o is not None and u is not None:
                p["ceiling_hit_ratio"] = u
                p["capacity_gap"] = u - o
    first = next(r for r in results if r is not None)
    curve = {"workload": workload.name, "requests": len(workload),
             "prompt_tokens": workload.prompt_tokens, "page_size": first.page_size,
             "max_running": first.max_running, "mode": first.mode, "split_capacity": split,
             "policies": list(policies), "points": points, "unbounded": unbounded,
             "notes": notes}
    done = sum(r is not None for r in results)
    if done < len(results):
        curve["partial"] = {"finished_runs": done, "runs": len(results)}
    return curve


# ---------------------------------------------------------------- text
def format_fleet(r):
    """A :class:`~flatradix.replay.fleet.FleetResult` as text: the fleet's figures,
    then one row per instance."""
    cap = r.capacity
    cap = ("unbounded" if cap == "inf" else f"{_n(cap)} tokens each" if not isinstance(cap, list)
           else ", ".join("inf" if c == "inf" else _n(c) for c in cap) + " tokens")
    name = os.path.basename(r.workload) if os.sep in r.workload else r.workload
    params = ", ".join(f"{k} {v}" for k, v in r.router_params.items())
    lines = [
        f"flatradix replay (fleet): {name}",
        f"  {r.instances} instances | router {r.router}" + (f" ({params})" if params else "")
        + f" | capacity {cap} | page size {r.page_size} | max running {r.max_running:,} | "
          f"policy {r.policy} | {'arrival times' if r.mode == 'arrival' else 'one pass'}",
        "",
        f"  requests        {_n(r.requests)} ({_n(r.served_requests)} served, "
        f"{_n(r.rejected_requests)} rejected)",
        f"  hit tokens      {_n(r.hit_tokens)} ({100 * r.token_hit_ratio:.2f} % token hit ratio)",
        f"  evicted tokens  {_n(r.evicted_tokens)}",
        f"  load balance    max / mean: requests {r.balance['requests']:.3f}, prefill tokens "
        f"{r.balance['prefill_tokens']:.3f}",
    ]
    if r.arrival:
        w = r.arrival["wait_ms"]
        lines.append(f"  queueing        {_n(r.arrival['waited_requests'])} requests waited; "
                     f"wait p50 {w['p50']:,.0f} ms, p99 {w['p99']:,.0f} ms, max {w['max']:,.0f} ms")
    lines += [f"  wall time       {r.wall_s:.2f} s ({r.requests_per_s:,.0f} requests/s; CPU "
              f"{r.cpu_s:.2f} s)",
              f"  KV conservation {'ok' if r.kv_conserved else 'BROKEN'}", "",
              f"  {'instance':>8}{'requests':>10}{'hit ratio':>11}{'prefill tokens':>16}"
              f"{'evicted':>14}{'rejected':>10}" + (f"{'wait p99 ms':>13}" if r.arrival else "")]
    for p in r.per_instance:
        row = (f"  {p['instance']:>8}{_n(p['requests']):>10}{100 * p['token_hit_ratio']:>10.2f}%"
               f"{_n(p['prefill_tokens']):>16}{_n(p['evicted_tokens']):>14}"
               f"{_n(p['rejected_requests']):>10}")
        if r.arrival:
            row += f"{p['wait_ms']['p99'] or 0:>13,.0f}"
        lines.append(row)
    lines += [f"  note: {s}" for s in r.notes]
    return "\n".join(lines)


def format_fleet_sweep(curve):
    """The fleet sweep as a table: one row per run, then the unbounded ones; the gap
    columns with ``opt``."""
    gaps = OPT_POLICY in curve["policies"]
    head = (f"{'instances':>9}{'router':>14}{'policy':>8}{'capacity':>13}{'fleet total':>13}"
            f"{'hit ratio':>11}{'balance':>9}{'evicted':>15}{'rejected':>10}")
    if gaps:
        head += f"{'opt':>9}{'capacity gap':>14}{'policy gap':>12}"
    lines = [head]
    for p in curve["points"] + curve["unbounded"]:
        unb = p["fleet_capacity"] == "inf"
        row = (f"{p['instances']:>9}{p['router']:>14}{('any' if unb else p['policy']):>8}"
               f"{('inf' if unb else _n(p['capacity'])):>13}"
               f"{('inf' if unb else _n(p['fleet_capacity'])):>13}"
               f"{100 * p['token_hit_ratio']:>10.2f}%{p['balance_requests']:>9.2f}"
               f"{_n(p['evicted_tokens']):>15}{_n(p['rejected_requests']):>10}")
        if gaps and "opt_hit_ratio" in p:
            row += f"{100 * p['opt_hit_ratio']:>8.2f}%"
            row += (f"{100 * p['capacity_gap']:>13.2f}%" if "capacity_gap" in p else f"{'-':>14}")
            row += f"{100 * p['policy_gap']:>11.2f}%"
        lines.append(row)
    lines += [f"note: {n}" for n in curve.get("notes", ())]
    part = curve.get("partial")
    if part:
        lines.append(f"partial: interrupted, {part['finished_runs']:,} of {part['runs']:,} runs "
                     f"finished (the others are missing above)")
    return "\n".join(lines)


# ---------------------------------------------------------------- CSV
def _cell(v):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, list):
        return " ".join(map(str, v))
    return repr(v) if isinstance(v, float) else v


def write_fleet_sweep_csv(curve, path):
    """One row per run of a fleet sweep (the unbounded ones last), :data:`FLEET_COLUMNS`."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(FLEET_COLUMNS)
        for p in curve["points"] + curve["unbounded"]:
            w.writerow([_cell(p.get(c)) for c in FLEET_COLUMNS])


def write_fleets_csv(results, path):
    """One row per fleet run, :data:`FLEET_COLUMNS`, then one row per instance
    (``instance`` column: ``fleet`` for the fleet's row)."""
    cols = ("instance",) + FLEET_COLUMNS + ("requests", "prefill_tokens")
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in results:
            p = _point(r)
            p.update(instance="fleet", requests=r.requests,
                     prefill_tokens=sum(q["prefill_tokens"] for q in r.per_instance))
            w.writerow([_cell(p.get(c)) for c in cols])
            for q in r.per_instance:
                row = dict(q, instances=r.instances, router=r.router, policy=r.policy,
                           fleet_capacity=p["fleet_capacity"])
                w.writerow([_cell(row.get(c)) for c in cols])


# ---------------------------------------------------------------- plot
def fleet_figure(curve, title=None):
    """Hit ratio against the number of instances, one line per router (and
    capacity, and policy when several), the unbounded ceiling of each router
    dashed. Returns the matplotlib ``Figure``."""
    from .plot import plot_formats

    plot_formats()
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    routers = list(dict.fromkeys(p["router"] for p in curve["points"] + curve["unbounded"]))
    caps = list(dict.fromkeys(p["fleet_capacity" if curve["split_capacity"] else "capacity"]
                              for p in curve["points"]))
    pols = curve["policies"]
    marks, styles = "os^vDP*X", ["-", "-.", ":", (0, (5, 1))]
    for j, router in enumerate(routers):
        for c_i, cap in enumerate(caps):
            for p_i, pol in enumerate(pols):
                key = "fleet_capacity" if curve["split_capacity"] else "capacity"
                pts = sorted((p for p in curve["points"] if p["router"] == router
                              and p[key] == cap and p["policy"] == pol),
                             key=lambda p: p["instances"])
                if not pts:
                    continue
                label = router
                if len(caps) > 1:
                    label += f", {format_tokens(cap)}" + (" total" if curve["split_capacity"]
                                                          else " each")
                if len(pols) > 1:
                    label += f", {pol}"
                ax.plot([p["instances"] for p in pts], [100 * p["token_hit_ratio"] for p in pts],
                        marks[c_i % len(marks)], linestyle=styles[p_i % len(styles)],
                        color=f"C{j}", label=label, markersize=5)
        unb = sorted((u for u in curve["unbounded"] if u["router"] == router),
                     key=lambda p: p["instances"])
        if unb:
            ax.plot([u["instances"] for u in unb], [100 * u["token_hit_ratio"] for u in unb],
                    "--", color=f"C{j}", linewidth=0.8, label=f"{router} unbounded")
    ns = sorted({p["instances"] for p in curve["points"] + curve["unbounded"]})
    ax.set_xticks(ns)
    ax.set_xlabel("instances")
    ax.set_ylabel("token hit ratio (%)")
    ax.set_ylim(0, None)
    name = os.path.basename(curve["workload"])
    mode = "arrival times" if curve.get("mode") == "arrival" else "one pass"
    t = title or (f"{name}: {curve['requests']:,} requests, page {curve['page_size']}, max "
                  f"running {curve['max_running']:,} per instance, {mode}")
    if curve.get("partial"):
        t += (f"\npartial (interrupted): {curve['partial']['finished_runs']} of "
              f"{curve['partial']['runs']} runs")
    ax.set_title(t, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def plot_fleet_sweep(curve, path, title=None):
    """Write :func:`fleet_figure` to ``path``."""
    import matplotlib.pyplot as plt

    fig = fleet_figure(curve, title)
    fig.savefig(path)
    plt.close(fig)
    return path
