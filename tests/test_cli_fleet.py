"""``flatradix replay --instances N`` under the command line's rules (issue 30's,
now for fleets): Ctrl-C / SIGINT stops fleet runs and fleet sweeps within
seconds and keeps the runs that finished (printed and written, marked partial,
exit status 130); a write that fails at the end is one line with exit status 2
and the results still printed; a user's mistake is one line, no traceback."""

import json
import textwrap

import pytest

from . import test_cli_findings as findings
from .test_cli import assert_clean_error, run_cli
from .test_cli_findings import EXIT_WITHIN_S, full  # noqa: F401 (full: the /dev/full fixture)

DRIVER = textwrap.dedent("""
    # flatradix replay with the fleet runs of router SLOW made to hang and each
    # finished run said on stderr ("DONE", in this process): the test interrupts it
    import importlib, multiprocessing, sys, time
    multiprocessing.set_start_method("fork")
    fl = importlib.import_module("flatradix.replay.fleet")
    fr = importlib.import_module("flatradix.replay.fleet_report")
    from flatradix import cli
    slow = sys.argv[1]
    real_replay, real_run_all = fl.fleet_replay, fr.run_all

    def fleet_replay(workload, router="kv", **kw):
        if router == slow and kw.get("capacity") is not None:
            time.sleep(600)
        return real_replay(workload, router=router, **kw)

    def done(r):
        print("DONE", r.instances, r.router, r.capacity, file=sys.stderr, flush=True)

    def single(*a, **kw):
        r = fleet_replay(*a, **kw)
        done(r)
        return r

    def run_all(fn, shared, tasks, jobs=1, on_result=None, backend=None):
        return real_run_all(fn, shared, tasks, jobs, on_result=lambda k, r: done(r),
                            backend=backend)

    fl.fleet_replay, fr.fleet_replay, fr.run_all = single, fleet_replay, run_all
    sys.exit(cli.main(sys.argv[2:]))
""")


def _interrupt(tmp_path, slow, args, finished):
    """test_cli_findings' interrupt runner over this file's fleet driver, the
    signal sent to the process group (a terminal's Ctrl-C)."""
    return findings._interrupt(tmp_path, slow, args, finished, True, driver_source=DRIVER)


def test_interrupted_fleet_runs_keep_the_finished_ones(tmp_path):
    csv = tmp_path / "f.csv"
    # round-robin finishes, random hangs, prefix-hash never starts
    p, out, err, took = _interrupt(
        tmp_path, "random", ["--limit", "60", "--instances", "2", "--router",
                             "round-robin,random,prefix-hash", "--capacity", "6k", "--json",
                             "--no-progress", "--csv", csv], 1)
    assert took < EXIT_WITHIN_S, f"exited {took:.2f} s after SIGINT"
    assert p.returncode == 130 and "Traceback" not in err, err
    assert "interrupted: 1 of 3 runs finished" in err
    runs = json.loads(out)
    assert [(r["instances"], r["router"]) for r in runs] == [(2, "round-robin")]
    assert runs[0]["partial"] == {"finished_runs": 1, "runs": 3}
    # the fleet's row and one per instance
    assert [r.split(",")[0] for r in csv.read_text().splitlines()] == ["instance", "fleet", "0",
                                                                       "1"]


def test_an_interrupted_parallel_fleet_sweep_keeps_its_points(tmp_path):
    csv = tmp_path / "s.csv"
    # 2 processes: round-robin's two points finish, random's two hang (the
    # unbounded runs are queued behind them)
    p, out, err, took = _interrupt(
        tmp_path, "random", ["--limit", "60", "--instances", "2", "--router",
                             "round-robin,random", "--sweep", "4k,8k", "--jobs", "2",
                             "--json", "--no-progress", "--csv", csv], 2)
    assert took < EXIT_WITHIN_S, f"exited {took:.2f} s after SIGINT"
    assert p.returncode == 130 and "Traceback" not in err, err
    curve = json.loads(out)
    assert curve["partial"] == {"finished_runs": 2, "runs": 6}
    assert "interrupted: 2 of 6 runs finished" in err
    assert [(q["router"], q["capacity"]) for q in curve["points"]] == [
        ("round-robin", 4_000), ("round-robin", 8_000)]
    assert curve["unbounded"] == []
    assert len(csv.read_text().splitlines()) == 3


@pytest.mark.parametrize("opt,name,sweep", [
    ("--csv", "r.csv", False), ("--out", "r.json", False),
    ("--csv", "s.csv", True), ("--plot", "s.png", True), ("--out", "s.json", True)])
def test_a_failing_fleet_write_at_the_end_keeps_the_results(full, opt, name, sweep):
    if opt == "--plot":
        pytest.importorskip("matplotlib")
    args = ["--limit", "40", "--no-progress", "--instances", "2", "--router", "round-robin",
            opt, full(name)]
    args += ["--sweep", "4k"] if sweep else ["--capacity", "4k"]
    p = run_cli(*args)
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode == 2, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"flatradix replay: error: {opt}: cannot "
                                                    f"write "), p.stderr
    assert "No space left on device" in lines[0]
    assert ("hit ratio" in p.stdout) if sweep else ("hit tokens" in p.stdout), p.stdout


@pytest.mark.parametrize("args,needles", [
    (["--instances", "2", "--router", "round-robin", "--capacity", "4k,8k"],
     ["argument --capacity"]),
    (["--instances", "2,x"], ["argument --instances"]),
    (["--instances", "2", "--router", "kv", "--policy", "opt"], ["--policy opt in a fleet"]),
    (["--instances", "2", "--prefix-tokens", "8", "--router", "kv"],
     ["--prefix-tokens needs --router prefix-hash"]),
    (["--instances", "2", "--describe"], ["--describe is for a single instance"]),
    (["--sweep", "4k", "--backend", "nope"], ["argument --backend"]),
    (["--sweep", "4k", "--backend", "dask"], ["--backend dask", "DASK_SCHEDULER_ADDRESS"]),
    (["--instances", "2", "--router", "round-robin", "--swa-window", "8,16", "--capacity",
      "4k"], ["--instances runs one"]),
])
def test_fleet_mistakes_are_one_line(args, needles, monkeypatch):
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    assert_clean_error(run_cli("--limit", "10", "--no-progress", *args), *needles)
