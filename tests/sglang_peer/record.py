"""Record which of SGLang's peer tests a TreeCore passes (regenerates ``python_core_passes.txt``).

    python -m tests.sglang_peer.record                     # SGLang's Python core -> the list
    python -m tests.sglang_peer.record --backend flatradix --compare
                                                           # flatradix on the list: what fails

The run covers SGLang's unit file, its registry tests and its randomized bench
(``harness.py``). CPU-heavy (~1 h on 2 busy cores for the whole unit file on
the Python core); ``--workers 2`` uses pytest-xdist.
"""

import argparse
import collections
import datetime
import pathlib
import sys
import tempfile

from . import harness as H


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="python", help="python, rust or flatradix")
    ap.add_argument("--workers", type=int, default=0, help="pytest-xdist workers (0: none)")
    ap.add_argument("--out", type=pathlib.Path, default=None,
                    help="where to write the passing node ids (default: the recorded list "
                         "for --backend python, nothing otherwise)")
    ap.add_argument("--compare", action="store_true",
                    help="run only the recorded list and report what does not pass")
    ap.add_argument("--junit", type=pathlib.Path, default=None, help="keep the JUnit report here")
    ap.add_argument("--log", type=pathlib.Path, default=None, help="keep pytest's output here")
    args = ap.parse_args(argv)
    py, why = H.oracle_python()
    if py is None:
        print(f"cannot run the peer suite: {why}", file=sys.stderr)
        return 2
    junit = args.junit or pathlib.Path(tempfile.mkdtemp()) / "peer.xml"
    select = H.PASS_LIST if args.compare else None
    H.run(py, args.backend, junit, select=select, files=(H.REGISTRY_FILE, H.BENCH_FILE),
          workers=args.workers or None, log=args.log)
    res = H.outcomes(junit)
    counts = collections.Counter(res.values())
    print(f"{args.backend}: " + ", ".join(f"{counts[k]} {k}" for k in
                                          ("passed", "failed", "error", "skipped")))
    if args.compare:
        want = H.read_list(H.PASS_LIST)
        exc = H.expected_failures()
        bad = [n for n in want if res.get(n) != "passed" and n not in exc]
        for n in bad:
            print(f"  {res.get(n, 'not run')}: {n}")
        fixed = [n for n in want if n in exc and res.get(n) == "passed"]
        for n in fixed:
            print(f"  passes now (remove it from its list): {n}")
        passed = sum(res.get(n) == "passed" for n in want)
        print(f"{passed} of {len(want)} recorded tests pass; {len(bad)} unexpected failures "
              f"({len(exc & set(want))} listed as not expected to pass)")
        return 1 if bad else 0
    out = args.out or (H.PASS_LIST if args.backend == "python" else None)
    if out is not None:
        passed = sorted(n for n, o in res.items() if o == "passed")
        head = [f"# SGLang peer tests that pass on the {args.backend!r} TreeCore "
                f"(tests/sglang_peer/record.py, {datetime.date.today().isoformat()})",
                "# " + ", ".join(f"{counts[k]} {k}" for k in
                                 ("passed", "failed", "error", "skipped"))]
        out.write_text("\n".join(head + passed) + "\n")
        print(f"wrote {len(passed)} node ids to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
