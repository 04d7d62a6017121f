"""``flatradix replay --instances N``: the fleet's option group and checks, the
fleet runs and fleet sweeps (the fleet itself is ``flatradix.replay.fleet``)."""

from . import cli_options as options
from .cli_options import UsageError
from .cli_output import Outputs, emit_runs, keep_partial


def fleet_options(r):
    """A fleet: N instances behind a router."""
    g = r.add_argument_group(
        "fleet",
        "Replay through N instances (each its own pools and cache, the options above) "
        "behind a router: kv (NVIDIA Dynamo's KV router cost: overlap_weight x prefill "
        "blocks + decode blocks, the overlap read from each instance's KV events), "
        "prefix-hash (consistent hashing of the prompt's first tokens), least-loaded, "
        "round-robin, random (seeded). Reports the fleet's and each instance's hit ratio, "
        "the load balance (max / mean of requests and prefill tokens), evictions and, with "
        "--arrival, waits. With --sweep: every capacity x instance count x router, plus "
        "the unbounded ceiling; --plot draws hit ratio against instances per router.")
    g.add_argument("--instances", type=options.instance_counts, default=None,
                   metavar="N[,N...]", help="instances in the fleet; several run once each")
    g.add_argument("--router", type=options.routers, default=None, metavar="R[,R...]",
                   help=f"with --instances: {', '.join(options.ROUTERS)}; several run once "
                        f"each (default: kv)")
    g.add_argument("--router-seed", type=options.nonnegative_int, default=None, metavar="S",
                   help="with --instances: seed of the random router and of the kv router's "
                        "tie-breaks (default: 0)")
    g.add_argument("--overlap-weight", type=options.nonnegative_float, default=None,
                   metavar="W", help="with --router kv: the weight of the prefill blocks in "
                                     "the cost (Dynamo's kv_overlap_score_weight; default 1)")
    g.add_argument("--prefix-tokens", type=options.positive_int, default=None, metavar="T",
                   help="with --router prefix-hash: tokens of the prompt hashed (default: "
                        "two hash blocks of the trace)")
    g.add_argument("--split-capacity", action="store_true",
                   help="with --instances: --capacity / --kv-memory / --sweep give the fleet's "
                        "total, shared evenly by the instances (whole pages); default: each "
                        "instance's pool")


def check_fleet(args, need):
    """The fleet's and the opt policy's option combinations."""
    pols = {p for group in (args.policy or ()) for p in group}
    hybrid = [o for o, v in (("--swa-window", args.swa_window),
                             ("--mamba-states", args.mamba_states),
                             ("--host-capacity", args.host_capacity)) if v]
    need("opt" not in pols or not hybrid,
         f"--policy opt (Belady's offline optimum) models Full attention without a host "
         f"tier: not with {hybrid[0] if hybrid else ''}")
    if not args.instances:
        for opt, v in (("--router", args.router), ("--router-seed", args.router_seed),
                       ("--overlap-weight", args.overlap_weight),
                       ("--prefix-tokens", args.prefix_tokens),
                       ("--split-capacity", args.split_capacity)):
            need(v is None or v is False, f"{opt} needs --instances (a fleet)")
        return
    routers = args.router or ["kv"]
    for opt, v in (("--per-request", args.per_request), ("--describe", args.describe)):
        need(not v, f"{opt} is for a single instance, not --instances")
    if "kv" in routers:
        need(not hybrid, f"--router kv reads Full-attention KV events: not with "
                         f"{hybrid[0] if hybrid else ''} (route those with prefix-hash, "
                         f"least-loaded, round-robin or random)")
        import importlib.util

        need(importlib.util.find_spec("msgspec") is not None,
             "--router kv reads the instances' KV events, which need msgspec: pip install "
             "'flatradix[events]'")
    need(args.overlap_weight is None or "kv" in routers, "--overlap-weight needs --router kv")
    need(args.prefix_tokens is None or "prefix-hash" in routers,
         "--prefix-tokens needs --router prefix-hash")
    stateful = [r for r in routers if r in ("kv", "least-loaded")]
    need("opt" not in pols or args.sweep or not stateful,
         f"--policy opt in a fleet needs the requests each instance gets in advance: a router "
         f"that does not read the caches (prefix-hash, round-robin, random), not "
         f"{stateful[0] if stateful else ''}")


def _fleet_kwargs(args, plan, kw):
    """``fleet_replay`` keywords every fleet run shares (the instance count, router,
    policy and capacity apart)."""
    fkw = dict(kw, seed=args.router_seed or 0, prefix_tokens=args.prefix_tokens)
    if args.overlap_weight is not None:
        fkw["overlap_weight"] = args.overlap_weight
    param, values = plan.series
    if param is not None:
        if len(values) > 1:
            raise UsageError(f"--instances runs one {param.replace('_', ' ')} at a time, got "
                             f"{len(values)}: give one value")
        fkw[param] = values[0]
    return fkw


def run_fleet(args, plan, workload, kw):
    """The fleet runs (or sweep), their outputs and report. Returns the
    exit status."""
    fkw = _fleet_kwargs(args, plan, kw)
    if args.sweep:
        return _sweep(args, plan, workload, fkw)
    from .replay.fleet import fleet_replay
    from .replay.fleet_report import format_fleet, split_capacity, write_fleets_csv

    runs = [(n, r, p) for n in args.instances for r in (args.router or ["kv"])
            for p in plan.policies]
    results, interrupted = [], None
    try:
        for n, router, pol in runs:
            cap = (split_capacity(plan.capacity, n, args.page_size) if args.split_capacity
                   else plan.capacity)
            results.append(fleet_replay(workload, instances=n, router=router, capacity=cap,
                                        policy=pol, progress=plan.progress, **fkw))
    except KeyboardInterrupt:
        if not results:
            raise
        interrupted = (len(results), len(runs))
    out = Outputs(args)
    out.write("--csv", args.csv, lambda: write_fleets_csv(results, args.csv))
    return emit_runs(out, plan, results, len(runs), interrupted, format_fleet)


def _sweep(args, plan, workload, fkw):
    from .replay.fleet_report import (fleet_sweep, format_fleet_sweep, plot_fleet_sweep,
                                      write_fleet_sweep_csv)
    curve, interrupted = keep_partial(lambda: fleet_sweep(
        workload, plan.sweep_caps, instances=args.instances, routers=args.router or ["kv"],
        policies=plan.policies, split=args.split_capacity, jobs=args.jobs,
        backend=args.backend, progress=plan.progress, **fkw))
    if plan.kv:
        curve["kv"] = plan.kv
    out = Outputs(args)
    out.write("--csv", args.csv, lambda: write_fleet_sweep_csv(curve, args.csv))
    out.write("--plot", args.plot, lambda: plot_fleet_sweep(curve, args.plot))
    out.emit(curve, lambda: format_fleet_sweep(curve))
    return out.finish(interrupted)
