"""What a ``flatradix replay`` run ends with: its files and its stdout
(:class:`Outputs`), the results printed (:func:`emit_runs`), a sweep's finished
runs kept through Ctrl-C (:func:`keep_partial`). Shared by the single-instance
runs (``cli_replay``) and the fleet's (``cli_fleet``)."""

import json
import os
import sys


class Outputs:
    """The files and stdout a run ends with. A write that fails (a full disk, a
    path that passed the early check but cannot be written) costs nothing else:
    the other outputs are still written and the results still printed; each
    failure is one line on stderr and the exit status 2 (:meth:`finish`)."""

    def __init__(self, args):
        self.args = args
        self.errors = []

    def write(self, option, path, fn):
        """``fn()`` writes ``path`` (given as ``option``); a failure is noted."""
        if not path:
            return
        try:
            fn()
        except (OSError, ValueError, RuntimeError) as e:
            # (ValueError / RuntimeError: matplotlib's own refusals of a plot file)
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            self.errors.append(f"{option}: cannot write {path}: {why}")

    def emit(self, data, text):
        """``data`` as JSON to ``--out`` (if given), and to stdout with ``--json``;
        else ``text`` (a string, or a function making it) to stdout."""
        args = self.args
        js = json.dumps(data, indent=2)

        def out():
            with open(args.out, "w") as f:
                f.write(js + "\n")

        self.write("--out", args.out, out)
        try:
            print(js if args.json else (text() if callable(text) else text))
            sys.stdout.flush()
        except BrokenPipeError:
            raise
        except OSError as e:
            # stdout itself cannot be written (e.g. redirected to a full disk)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            self.errors.append(f"stdout: cannot write the results: {e.strerror or e}")

    def finish(self, interrupted=None):
        """The exit status: 130 when ``interrupted`` (``(finished, runs)``: what
        the outputs hold, said on stderr), else 2 after a failed write, else 0."""
        for e in self.errors:
            print(f"flatradix replay: error: {e}", file=sys.stderr)
        if interrupted is not None:
            done, runs = interrupted
            print(f"flatradix replay: interrupted: {done:,} of {runs:,} runs finished; the "
                  f"results above and the files written hold those (marked partial)",
                  file=sys.stderr)
            return 130
        return 2 if self.errors else 0


def keep_partial(sweep):
    """``(curve, None)`` of ``sweep()``; interrupted with finished runs, ``(the partial
    curve, (finished, runs))``."""
    from .replay.parallel import Interrupted

    try:
        return sweep(), None
    except Interrupted as e:
        if e.partial is None:
            raise
        return e.partial, (e.finished, len(e.results))


def emit_runs(out, plan, results, runs, interrupted, report):
    """Print ``results`` (JSON, or ``report(result)`` each) through ``out`` and return
    the exit status: each result's JSON with the ``kv`` block, and, when
    ``interrupted`` (``(finished, runs)``), marked partial; one object when a single
    run was asked for (``runs``), else a list."""
    dicts = []
    for r in results:
        d = r.to_dict()
        if plan.kv:
            d["kv"] = plan.kv
        if interrupted:
            d["partial"] = {"finished_runs": interrupted[0], "runs": interrupted[1]}
        dicts.append(d)

    def text():
        t = "\n\n".join(report(r) for r in results)
        if interrupted:
            t += (f"\n\npartial: interrupted, {interrupted[0]:,} of {interrupted[1]:,} runs "
                  f"finished")
        return t

    out.emit(dicts[0] if runs == 1 else dicts, text)
    return out.finish(interrupted)
