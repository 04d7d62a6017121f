"""Long differential runs: rounds over every configuration of both drivers (the
device tier's ``driver`` and the host tier's ``hicache_driver``), one seed per
round, appending each ``ORACLE_RESULT`` line to a log; and a summary of such logs
(operations run without divergence per configuration, core and family).

In the oracle venv (see driver.py for the environment)::

    python -m tests.oracle.campaign run --backend rust --ops 20000 --hours 5 --log rust.jsonl
    python -m tests.oracle.campaign run --backend rust --drivers hicache_driver --config all ...
    python -m tests.oracle.campaign summary rust.jsonl python.jsonl

A round stops at its first divergence per configuration (the driver shrinks it
and writes the reproducer to ``--repro-dir``); the campaign goes on with the next
seed, and the summary lists every divergence. Families: Full (the device tier's
Full-only configurations), SWA, Mamba (with Full + SWA + Mamba), host tier (the
HiCache configurations: Full, SWA, Mamba and all three on the host tier).
"""

import argparse
import json
import sys
import time
from collections import defaultdict

from . import driver, hicache_driver

DRIVERS = {"driver": driver, "hicache_driver": hicache_driver}


def family(drv, name):
    """The configuration family of ``name`` in driver ``drv``."""
    if drv == "hicache_driver":
        return "host tier"
    if name in driver.MAMBA_CONFIGS:
        return "Mamba"
    if name in driver.SWA_CONFIGS:
        return "SWA"
    return "Full"


def run(args):
    t_end = time.monotonic() + args.hours * 3600
    seed = args.first_seed
    jobs = []
    for drv in args.drivers.split(","):
        mod = DRIVERS[drv]
        names = list(mod.CONFIGS) if args.config == "all" else [
            n for n in args.config.split(",") if n in mod.CONFIGS]
        jobs += [(drv, mod, n) for n in names]
    rounds = 0
    while time.monotonic() < t_end and (args.rounds is None or rounds < args.rounds):
        rounds += 1
        for drv, mod, name in jobs:
            if time.monotonic() >= t_end:
                break
            res = mod.run_config(name, args.backend, seed, args.ops, args.episode or
                                 mod.SPEC.episode, args.shrink_seconds, args.repro_dir)
            res["driver"] = drv
            with open(args.log, "a") as fh:
                fh.write(json.dumps(res, default=str) + "\n")
            print(f"seed {seed} {drv}:{name}/{args.backend}: {res['ops']} ops, "
                  f"{res['divergences']} divergences, {res['seconds']} s", flush=True)
        seed += 1
    return 0


def summary(args):
    ops = defaultdict(int)
    secs = defaultdict(float)
    bad = []
    for path in args.logs:
        with open(path) as fh:
            for line in fh:
                line = line.strip()
                if line.startswith("ORACLE_RESULT "):
                    line = line[len("ORACLE_RESULT "):]
                if not line.startswith("{"):
                    continue
                r = json.loads(line)
                k = (r.get("driver", "driver"), r["config"], r["backend"])
                secs[k] += r["seconds"]
                if r["divergences"]:
                    bad.append(r)
                else:
                    ops[k] += r["ops"]
    backends = sorted({b for _, _, b in list(ops) + list(secs)})
    print(f"{'config':28s}" + "".join(f"{b + ' ops':>16s}{'ms/op':>8s}" for b in backends))
    fam = defaultdict(int)
    for drv, mod in DRIVERS.items():
        for name in mod.CONFIGS:
            if not any((drv, name, b) in secs for b in backends):
                continue
            row = f"{drv[:1] + ':' + name:28s}"
            for b in backends:
                n = ops.get((drv, name, b), 0)
                fam[(family(drv, name), b)] += n
                row += f"{n:16,d}{(1000 * secs[(drv, name, b)] / n if n else 0):8.2f}"
            print(row)
    print("families (ops without divergence):")
    for f in ("Full", "SWA", "Mamba", "host tier"):
        print(f"  {f:10s}" + "".join(f"{fam.get((f, b), 0):16,d} ({b})" for b in backends))
    print(f"divergences: {len(bad)}")
    for r in bad:
        rep = r.get("reproducer", {})
        print(f"  {r.get('driver', 'driver')}:{r['config']}/{r['backend']} seed {r['seed']}: "
              f"{r.get('sig')} ({len(rep.get('ops', []))} ops: {rep.get('path')})")
    return 1 if bad else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--backend", choices=("python", "rust"), required=True)
    r.add_argument("--drivers", default="driver,hicache_driver",
                   help="comma list of: " + ", ".join(DRIVERS))
    r.add_argument("--config", default="all", help="'all', or a comma list of names")
    r.add_argument("--ops", type=int, default=20000, help="ops per configuration per round")
    r.add_argument("--hours", type=float, default=1.0)
    r.add_argument("--rounds", type=int, default=None,
                   help="stop after this many rounds (one seed each) even before --hours")
    r.add_argument("--first-seed", type=int, default=1)
    r.add_argument("--episode", type=int, default=None,
                   help="ops per fresh pair of engines (default: each driver's)")
    r.add_argument("--shrink-seconds", type=float, default=900)
    r.add_argument("--repro-dir", default="oracle-repro")
    r.add_argument("--log", required=True)
    s = sub.add_parser("summary")
    s.add_argument("logs", nargs="+")
    args = ap.parse_args(argv)
    return run(args) if args.cmd == "run" else summary(args)


if __name__ == "__main__":
    sys.exit(main())
