"""Long differential runs: rounds of ``driver`` over every configuration, one
seed per round, appending each ``ORACLE_RESULT`` line to a log; and a summary of
such logs (operations run without divergence per configuration and core).

In the oracle venv (see driver.py for the environment)::

    python -m tests.oracle.campaign run --backend rust --ops 20000 --hours 5 --log rust.jsonl
    python -m tests.oracle.campaign run --backend rust --ops 50000 --rounds 20 --hours 9 ...
    python -m tests.oracle.campaign summary rust.jsonl python.jsonl

A round stops at its first divergence per configuration (the driver shrinks it
and writes the reproducer to ``--repro-dir``); the campaign goes on with the next
seed, and the summary lists every divergence.
"""

import argparse
import json
import sys
import time
from collections import defaultdict

from . import driver


def run(args):
    t_end = time.monotonic() + args.hours * 3600
    seed = args.first_seed
    names = list(driver.CONFIGS) if args.config == "all" else args.config.split(",")
    rounds = 0
    while time.monotonic() < t_end and (args.rounds is None or rounds < args.rounds):
        rounds += 1
        for name in names:
            if time.monotonic() >= t_end:
                break
            res = driver.run_config(name, args.backend, seed, args.ops, args.episode,
                                    args.shrink_seconds, args.repro_dir)
            with open(args.log, "a") as fh:
                fh.write(json.dumps(res, default=str) + "\n")
            print(f"seed {seed} {name}/{args.backend}: {res['ops']} ops, "
                  f"{res['divergences']} divergences, {res['seconds']} s", flush=True)
        seed += 1
    return 0


def summary(args):
    ops = defaultdict(int)
    secs = defaultdict(float)
    seeds = defaultdict(set)
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
                k = (r["config"], r["backend"])
                seeds[k].add(r["seed"])
                secs[k] += r["seconds"]
                if r["divergences"]:
                    bad.append(r)
                else:
                    ops[k] += r["ops"]
    backends = sorted({b for _, b in list(ops) + list(secs)})
    print(f"{'config':16s}" + "".join(f"{b + ' ops':>16s}{'ms/op':>8s}" for b in backends))
    for name in driver.CONFIGS:
        row = f"{name:16s}"
        for b in backends:
            n = ops.get((name, b), 0)
            row += f"{n:16,d}{(1000 * secs[(name, b)] / n if n else 0):8.2f}"
        print(row)
    print(f"divergences: {len(bad)}")
    for r in bad:
        rep = r.get("reproducer", {})
        print(f"  {r['config']}/{r['backend']} seed {r['seed']}: {r.get('sig')} "
              f"({len(rep.get('ops', []))} ops: {rep.get('path')})")
    return 1 if bad else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--backend", choices=("python", "rust"), required=True)
    r.add_argument("--config", default="all")
    r.add_argument("--ops", type=int, default=20000, help="ops per configuration per round")
    r.add_argument("--hours", type=float, default=1.0)
    r.add_argument("--rounds", type=int, default=None,
                   help="stop after this many rounds (one seed each) even before --hours")
    r.add_argument("--first-seed", type=int, default=1)
    r.add_argument("--episode", type=int, default=5000)
    r.add_argument("--shrink-seconds", type=float, default=900)
    r.add_argument("--repro-dir", default="oracle-repro")
    r.add_argument("--log", required=True)
    s = sub.add_parser("summary")
    s.add_argument("logs", nargs="+")
    args = ap.parse_args(argv)
    return run(args) if args.cmd == "run" else summary(args)


if __name__ == "__main__":
    sys.exit(main())
