"""The differential oracle's one harness, shared by both drivers (``driver.py``: the
device tier's tree ops and request path; ``hicache_driver.py``: the host tier):
seeded episodes, the delta-debugging shrinker, one configuration's run, the
self-test of the mutants and the command line.

A driver describes itself with a ``Spec``: its configurations and mutants, how to
play an episode (``play``: generate and apply ``n`` ops on fresh engines,
appending each op to ``ops`` before applying it, raising ``Divergence`` at the
first disagreement) and how to replay a list of ops (``replay``). Everything a run
prints (``ORACLE_RESULT`` / ``ORACLE_SELFTEST`` lines, parsed by ``suite.py``) and
writes (reproducer JSON files for ``--replay``) has one format.
"""

import argparse
import dataclasses
import hashlib
import json
import os
import random
import tempfile
import time
from collections import Counter
from typing import Callable, Optional

from .normalize import Divergence


@dataclasses.dataclass
class Spec:
    """A driver, as the harness runs it."""

    module: str                # ``python -m tests.oracle.<module>`` (replay hints)
    repro_prefix: str          # reproducer file names
    seed_tag: str              # mixed into the episode seeds (keeps each driver's streams)
    configs: dict
    mutants: dict
    play: Callable             # play(cfg, backend, first, rng, n, ops) -> stats (Counter)
    replay: Callable           # replay(cfg, backend, ops, first) -> Divergence | None
    groups: dict               # --config names standing for lists of configurations
    episode: int = 1000        # ops per fresh pair of engines
    shrink_seconds: float = 300
    selftest_ops: int = 2000
    shorten_tokens: bool = False  # the shrinker also cuts token tuples
    known: dict = dataclasses.field(default_factory=dict)   # --tolerate names
    firsts: tuple = ("flatradix", "python", "rust")  # --first choices
    tolerate: Optional[set] = None  # the driver's set of tolerated KNOWN names


def episode_seed(spec, seed, config, ep):
    h = hashlib.sha256(f"{spec.seed_tag}{seed}/{config}/{ep}".encode()).digest()
    return int.from_bytes(h[:8], "little")


def shrink(spec, cfg, backend, ops, sig, budget_s, log=print, first="flatradix"):
    """Delta-debug ``ops`` to a short list that still raises a divergence labelled
    ``sig``: complement removal at growing granularity down to single ops; with
    ``spec.shorten_tokens`` then halves of token tuples. Returns ``(ops, tries,
    completed within the budget)``."""
    t_end = time.monotonic() + budget_s
    tries = 0

    def fails(cand):
        nonlocal tries
        tries += 1
        d = spec.replay(cfg, backend, cand, first)
        return d is not None and d.sig == sig

    cur = list(ops)
    n = 2
    while len(cur) >= 2 and time.monotonic() < t_end:
        chunk = max(1, len(cur) // n)
        removed = False
        start = 0
        while start < len(cur) and time.monotonic() < t_end:
            cand = cur[:start] + cur[start + chunk:]
            if cand and fails(cand):
                cur = cand
                removed = True
            else:
                start += chunk
        if removed:
            n = max(n - 1, 2)
        elif chunk == 1:
            break
        else:
            n = min(len(cur), n * 2)
    if spec.shorten_tokens:  # cut halves off either end of each token tuple
        for i in range(len(cur)):
            for j, field in enumerate(cur[i]):
                if not (isinstance(field, tuple) and len(field) > 1):
                    continue
                step = len(field) // 2
                while step >= 1 and time.monotonic() < t_end:
                    f = cur[i][j]
                    for cand_f in (f[:len(f) - step], f[step:]):
                        if not cand_f:
                            continue
                        cand = cur[:i] + [cur[i][:j] + (cand_f,) + cur[i][j + 1:]] + cur[i + 1:]
                        if fails(cand):
                            cur = cand
                            break
                    else:
                        step //= 2
    return cur, tries, time.monotonic() < t_end


def run_config(spec, name, backend, seed, total_ops, episode, shrink_s, repro_dir, log=print,
               cfg=None, first="flatradix"):
    """``total_ops`` ops of configuration ``name`` in episodes of ``episode`` ops;
    the first divergence is shrunk, written as a reproducer and ends the run.
    Returns the ``ORACLE_RESULT`` dict."""
    cfg = dict(spec.configs[name] if cfg is None else cfg)
    t0 = time.monotonic()
    done = ep = 0
    stats = Counter()
    result = dict(config=name, backend=backend, seed=seed, episode=episode, first=first)
    while done < total_ops:
        n = min(episode, total_ops - done)
        rng = random.Random(episode_seed(spec, seed, name, ep))
        ops = []
        try:
            stats.update(spec.play(cfg, backend, first, rng, n, ops))
        except Divergence as d:
            log(f"DIVERGENCE {name}/{backend} episode {ep} op #{len(ops) - 1}: {d}")
            log(f"  op: {ops[-1]!r}"[:2000] if ops else "  (constructing the engines)")
            small, tries, complete = shrink(spec, cfg, backend, ops, d.sig, shrink_s, log, first)
            again = spec.replay(cfg, backend, small, first)
            repro = dict(config=name, backend=backend, sig=d.sig, cfg=cfg,
                         detail=str(again) if again else str(d), ops=small, first=first)
            path = None
            if repro_dir:
                os.makedirs(repro_dir, exist_ok=True)
                path = os.path.join(repro_dir,
                                    f"{spec.repro_prefix}-{name}-{backend}-{seed}-{ep}.json")
                with open(path, "w") as fh:
                    json.dump(repro, fh)
            log(f"SHRUNK to {len(small)} ops ({tries} replays, "
                f"{'minimal' if complete else 'time budget hit'}):")
            log(f"  divergence: {again if again else d}")
            log("  ops = " + repr(small))
            if path:
                log(f"  written to {path}; replay: python -m tests.oracle.{spec.module} "
                    f"--replay {path}")
            stats.update(getattr(d, "stats", {}) or {})
            result.update(ops=done + max(len(ops) - 1, 0), divergences=1, sig=d.sig,
                          reproducer=dict(repro, path=path),
                          seconds=round(time.monotonic() - t0, 1), stats=dict(stats))
            return result
        done += n
        ep += 1
    result.update(ops=done, divergences=0, episodes=ep, seconds=round(time.monotonic() - t0, 1),
                  stats=dict(stats))
    return result


def main(spec, argv=None, description=""):
    """The command line both drivers share (``--help`` lists it)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--config", default="all",
                    help=f"a name, a comma list, or {', '.join(repr(g) for g in spec.groups)}: "
                         + ", ".join(spec.configs))
    ap.add_argument("--backend", default="python", choices=("python", "rust"))
    ap.add_argument("--ops", type=int, default=2000, help="operations per configuration")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--episode", type=int, default=spec.episode,
                    help="ops per fresh pair of engines")
    ap.add_argument("--shrink-seconds", type=float, default=spec.shrink_seconds)
    ap.add_argument("--repro-dir", default=os.environ.get(
        "FLATRADIX_ORACLE_REPRO_DIR", os.path.join(tempfile.gettempdir(), "flatradix-oracle-repro")))
    ap.add_argument("--replay", help="a reproducer JSON written by a failing run")
    ap.add_argument("--self-test", action="store_true",
                    help="also check that every deliberately wrong flatradix (MUTANTS) is caught")
    ap.add_argument("--selftest-ops", type=int, default=spec.selftest_ops)
    ap.add_argument("--first", default="flatradix", choices=spec.firsts,
                    help="the side compared with --backend's: flatradix, or one of SGLang's "
                         "own cores (checks the driver's protocol without flatradix)"
                         + (", or sglang-flatradix: SGLang's controller over flatradix's "
                            "TreeCore plug-in" if "sglang-flatradix" in spec.firsts else ""))
    if spec.tolerate is not None:
        ap.add_argument("--tolerate", default="",
                        help="comma list of KNOWN divergences to go past (exploratory runs "
                             "only): " + ", ".join(spec.known))
    args = ap.parse_args(argv)
    if spec.tolerate is not None:
        for name in filter(None, args.tolerate.split(",")):
            if name not in spec.known:
                ap.error(f"unknown --tolerate {name!r}; known: {', '.join(spec.known)}")
            spec.tolerate.add(name)

    if args.replay:
        with open(args.replay) as fh:
            rep = json.load(fh)
        ops = [tuple(tuple(x) if isinstance(x, list) else x for x in op) for op in rep["ops"]]
        cfg = rep.get("cfg") or spec.configs[rep["config"]]
        d = spec.replay(dict(cfg), rep["backend"], ops, rep.get("first", "flatradix"))
        print(f"{len(ops)} ops on {rep['config']}/{rep['backend']}: {d if d else 'no divergence'}")
        return 1 if d else 0

    names = (list(spec.groups[args.config]) if args.config in spec.groups
             else args.config.split(","))
    for nm in names:
        if nm not in spec.configs:
            ap.error(f"unknown config {nm!r}; known: {', '.join(spec.configs)}")
    failed = 0
    if args.self_test:
        # a mutant must be caught for its own fault, not by a KNOWN divergence of
        # flatradix itself: those are gone past while the mutants run
        saved = set(spec.tolerate or ())
        if spec.tolerate is not None:
            spec.tolerate.update(spec.known)
        st = {}
        for mname, (base, mut) in spec.mutants.items():
            res = run_config(spec, f"mutant:{mname}", args.backend, args.seed, args.selftest_ops,
                             args.episode, 2, None, log=lambda *a: None,
                             cfg=dict(spec.configs[base], mutant=mut))
            st[mname] = dict(caught=bool(res["divergences"]), after_ops=res["ops"],
                             sig=res.get("sig"),
                             shrunk_ops=len(res.get("reproducer", {}).get("ops", [])))
            print(f"mutant {mname}: {'caught' if res['divergences'] else 'MISSED'} after "
                  f"{res['ops']} ops ({res.get('sig')})", flush=True)
            failed += not res["divergences"]
        if spec.tolerate is not None:
            spec.tolerate.clear()
            spec.tolerate.update(saved)
        print("ORACLE_SELFTEST " + json.dumps(st), flush=True)
    for nm in names:
        res = run_config(spec, nm, args.backend, args.seed, args.ops, args.episode,
                         args.shrink_seconds, args.repro_dir, first=args.first)
        if spec.tolerate:
            res["tolerated"] = sorted(spec.tolerate)
        failed += res["divergences"]
        print(f"{nm}/{args.backend}: {res['ops']} ops, {res['divergences']} divergences, "
              f"{res['seconds']} s", flush=True)
        print("ORACLE_RESULT " + json.dumps(res, default=str), flush=True)
    return 1 if failed else 0
