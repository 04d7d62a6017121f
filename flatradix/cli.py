"""The flatradix command (also: python -m flatradix).

``flatradix replay`` replays a request trace (or the built-in synthetic
workload) through the cache and reports hit ratio, evictions and per-operation
latency; see ``flatradix replay --help`` and ``flatradix.replay``.

A user's mistake is never a traceback: every error is one line on stderr,
``flatradix replay: error: ...`` naming the option, file or line, and the exit
status is 2. Output files are checked before anything runs.

Layout: this module holds the entry point and the top-level parser;
``cli_options`` the option types, ``cli_replay`` the replay command,
``precompile`` the compile command.
"""

import os
import sys

from .cli_options import POLICIES, Parser, UsageError  # noqa: F401  (importable from here)


def build_parser():
    """The ``flatradix`` argument parser (its subcommands' parsers included)."""
    p = Parser(prog="flatradix", description=__doc__.split("\n\n")[0])
    from . import __version__
    from . import cli_replay

    p.add_argument("--version", action="version", version=f"flatradix {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    cli_replay.add_parser(sub)
    from . import precompile

    precompile.add_parser(sub)     # flatradix compile (its own module)
    p.set_defaults(subparser=None)
    return p


def main(argv=None):
    """Entry point of the ``flatradix`` console script; returns the exit status."""
    from . import cli_replay

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # named by the subcommand that was given them (flatradix replay: error: ...)
        (args.subparser or parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "compile":
        from . import precompile

        return precompile.run(args)
    if args.command != "replay":
        parser.print_help()
        return 2
    from ._compile_notice import hold

    try:
        with hold():     # the run's compiles: one stderr line (flatradix/_compile_notice.py)
            return cli_replay.run(args)
    except UsageError as e:
        print(f"flatradix replay: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("flatradix replay: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `flatradix replay | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
