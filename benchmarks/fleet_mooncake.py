"""Fleet planning on the Mooncake conversation trace (issue 32): the hit ratio
of 1, 4 and 8 instances at a fixed total KV memory, per router (kv,
prefix-hash, least-loaded, round-robin, random) and policy (lru, and opt where
the router lets each instance know its requests in advance), with the unbounded
ceiling of each fleet; then the fleet replay's speed against N.

    python benchmarks/fleet_mooncake.py [--arrival] [--jobs 2] [--out docs/fleet_mooncake]
    python benchmarks/fleet_mooncake.py --scaling

Writes OUT.json (the sweep's curve), OUT.csv and OUT.png (hit ratio against
instances, one line per router). Skips, saying so, when ../shared/traces/ is
absent (``--trace mooncake:conversation`` downloads the trace: docs/replay.md).
"""

import argparse
import json
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flatradix.replay import ArrivalModel, load_trace  # noqa: E402
from flatradix.replay.fleet import ROUTERS, fleet_replay  # noqa: E402
from flatradix.replay.fleet_report import (fleet_sweep, format_fleet_sweep,  # noqa: E402
                                           plot_fleet_sweep, write_fleet_sweep_csv)

TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"


def _say(k, r):
    print(f"  done: {r.instances} x {r.router} {r.policy} {r.capacity}: "
          f"{100 * r.token_hit_ratio:.2f} % ({r.cpu_s:.0f} s CPU)", file=sys.stderr, flush=True)


def sweep(args, w):
    kw = dict(page_size=16)
    if args.arrival:
        kw["arrival"] = ArrivalModel()
    t = time.time()
    # one instance: every router is the same; round-robin is the cheapest to run
    one = fleet_sweep(w, args.totals, instances=[1], routers=["round-robin"],
                      policies=args.policies, split=True, jobs=args.jobs, on_result=_say, **kw)
    curve = fleet_sweep(w, args.totals, instances=[n for n in args.instances if n > 1],
                        routers=args.routers, policies=args.policies, split=True,
                        jobs=args.jobs, on_result=_say, **kw)
    curve["points"] = one["points"] + curve["points"]
    curve["unbounded"] = one["unbounded"] + curve["unbounded"]
    curve["elapsed_s"] = round(time.time() - t, 1)
    print(format_fleet_sweep(curve))
    print(f"({curve['elapsed_s']} s, load {os.getloadavg()[0]:.1f})")
    out = pathlib.Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(curve, indent=1) + "\n")
    write_fleet_sweep_csv(curve, out.with_suffix(".csv"))
    plot_fleet_sweep(curve, out.with_suffix(".png"), title=(
        f"Mooncake conversation trace ({len(w):,} requests), page 16, "
        f"{'arrival times' if args.arrival else 'one pass'}; total KV memory split evenly"))


def scaling(args, w):
    """requests/s of the fleet replay (one process) against N, round-robin and kv, at
    a per-instance pool of 2M tokens: the tree work is the same requests spread
    over N caches; the router and the N clocks are the overhead."""
    print(f"{'instances':>9}{'router':>14}{'requests/s':>12}{'CPU s':>8}{'wall s':>8}")
    for n in args.instances:
        for router in ("round-robin", "kv"):
            r = fleet_replay(w, instances=n, router=router, capacity=2_000_000, page_size=16)
            print(f"{n:>9}{router:>14}{len(w) / r.cpu_s:>12,.0f}{r.cpu_s:>8.2f}{r.wall_s:>8.2f}",
                  flush=True)
    print(f"(requests/s over CPU seconds; load {os.getloadavg()[0]:.1f})")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arrival", action="store_true")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--totals", default="8000000,32000000")
    p.add_argument("--instances", default="1,4,8")
    p.add_argument("--out", default=str(ROOT / "docs" / "fleet_mooncake"))
    p.add_argument("--routers", default=",".join(ROUTERS))
    p.add_argument("--policies", default="lru,opt")
    p.add_argument("--scaling", action="store_true")
    p.add_argument("--limit", type=int, default=None)
    args = p.parse_args()
    args.totals = [int(x) for x in args.totals.split(",")]
    args.instances = [int(x) for x in args.instances.split(",")]
    args.routers = args.routers.split(",")
    args.policies = args.policies.split(",")
    if not TRACE.exists():
        print(f"skipped: {TRACE} not found")
        return 0
    w = load_trace(str(TRACE), limit=args.limit)
    (scaling if args.scaling else sweep)(args, w)
    return 0


if __name__ == "__main__":
    sys.exit(main())
