"""The flatradix command (also: python -m flatradix).

``flatradix replay`` replays a request trace (or the built-in synthetic
workload) through the cache and reports hit ratio, evictions and per-operation
latency; see ``flatradix replay --help`` and ``flatradix.replay``.
"""

import argparse
import json
import sys

POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru", "tlru")


def _int_at_least(lo):
    """argparse type: an integer >= ``lo``."""
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {v}")
        return v
    return parse


_positive_int = _int_at_least(1)
_nonnegative_int = _int_at_least(0)


def _capacity(text):
    from .replay.report import parse_capacity

    try:
        return parse_capacity(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _capacities(text):
    caps = [_capacity(t) for t in text.split(",") if t.strip()]
    if not caps:
        raise argparse.ArgumentTypeError("--sweep needs at least one capacity")
    return caps


def build_parser():
    p = argparse.ArgumentParser(prog="flatradix", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    r = sub.add_parser(
        "replay", help="replay a request trace through the prefix cache",
        description=(
            "Replay requests through flatradix.UnifiedRadixCache as a scheduler drives it: "
            "match_prefix, inc_lock_ref, allocate the uncached tail and the outputs "
            "(evicting when short; a request that cannot fit even then is rejected), "
            "cache_finished_req on completion (the prompt is cached; outputs are not). "
            "Without --trace, a built-in deterministic synthetic workload is used "
            "(multi-turn chats over shared system prompts)."))
    r.add_argument("--trace", metavar="FILE",
                   help="Mooncake JSONL trace (timestamp, input_length, output_length, hash_ids); "
                        "default: the synthetic workload")
    r.add_argument("--block-size", type=_positive_int, default=None, metavar="B",
                   help="tokens per hash id (default: 512 for a trace, 16 for the synthetic "
                        "workload)")
    r.add_argument("--page-size", type=_positive_int, default=16, metavar="P",
                   help="cache page size (default: 16)")
    r.add_argument("--capacity", type=_capacity, default=None, metavar="TOKENS|inf",
                   help="KV pool size in tokens (2000000, 2M, 500k) or inf (default: inf)")
    r.add_argument("--max-running", type=_positive_int, default=1, metavar="N",
                   help="requests in flight at once, FIFO completion (default: 1)")
    r.add_argument("--policy", choices=POLICIES, default="lru",
                   help="eviction policy (default: lru)")
    r.add_argument("--limit", type=_positive_int, default=None, metavar="N",
                   help="replay only the first N requests (synthetic: generate N; default 3000)")
    r.add_argument("--seed", type=_nonnegative_int, default=0, help="synthetic workload seed (default: 0)")
    r.add_argument("--cache-outputs", action="store_true",
                   help="also insert output tokens (fresh ids that never match)")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.add_argument("--sweep", type=_capacities, default=None, metavar="C1,C2,...",
                   help="replay once per capacity (and once unbounded); print the "
                        "hit-ratio-vs-capacity curve as JSON")
    r.add_argument("--out", metavar="FILE", help="with --sweep: write the curve's JSON here")
    r.add_argument("--plot", metavar="FILE.png",
                   help="with --sweep: plot the curve (needs matplotlib: flatradix[plot])")
    r.add_argument("--no-progress", action="store_true",
                   help="no progress bar (it is shown only on a terminal anyway)")
    p.set_defaults(subparser=None)
    r.set_defaults(subparser=r)
    return p


def _load(args):
    from .replay.trace import MOONCAKE_BLOCK_SIZE, load_mooncake, synthetic_workload

    if args.trace:
        return load_mooncake(args.trace, block_size=args.block_size or MOONCAKE_BLOCK_SIZE,
                             limit=args.limit)
    return synthetic_workload(num_requests=args.limit or 3000, block_size=args.block_size or 16,
                              seed=args.seed)


def _replay(args, parser):
    from .replay.report import format_report, format_sweep, plot_sweep, sweep
    from .replay.sim import replay
    from .replay.trace import TraceFormatError
    from .cache import UnifiedRadixCache

    if args.plot and not args.sweep:
        parser.error("--plot needs --sweep C1,C2,...")
    if args.out and not args.sweep:
        parser.error("--out needs --sweep C1,C2,...")
    try:
        workload = _load(args)
    except (OSError, TraceFormatError) as e:
        print(f"flatradix replay: error: {e}", file=sys.stderr)
        return 2
    kw = dict(page_size=args.page_size, max_running=args.max_running, policy=args.policy,
              cache_outputs=args.cache_outputs, progress=not args.no_progress)
    try:
        # a cache the options cannot build (e.g. a page size beyond the pool) is a
        # usage error, reported like one
        UnifiedRadixCache(page_size=args.page_size, eviction_policy=args.policy)
    except (ValueError, TypeError) as e:
        print(f"flatradix replay: error: {e}", file=sys.stderr)
        return 2
    if args.sweep:
        curve = sweep(workload, args.sweep, **kw)
        text = json.dumps(curve, indent=2)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text + "\n")
        if args.plot:
            try:
                plot_sweep(curve, args.plot)
            except RuntimeError as e:
                print(f"flatradix replay: error: {e}", file=sys.stderr)
                return 2
        if args.json or not args.out:
            print(text)
        else:
            print(format_sweep(curve))
        return 0
    result = replay(workload, capacity=args.capacity, **kw)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(format_report(result))
    return 0


def main(argv=None):
    """Entry point of the ``flatradix`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command != "replay":
        parser.print_help()
        return 2
    try:
        return _replay(args, args.subparser)
    except BrokenPipeError:  # e.g. `flatradix replay | head`: stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
