"""Issue 30's command-line findings, each as its test: Ctrl-C / SIGINT stops at
once in every mode and keeps the runs that finished (printed and written,
marked partial); a write that fails at the end (a full disk, a path that passed
the early check) is one line with exit status 2 and the results still printed;
``--kv-memory -1GiB`` is refused by its own type; no abbreviated options; a
sweep capacity given twice runs once; without tqdm a terminal is told how to
get progress bars; a torch int16 value is refused."""

import importlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from flatradix.cli import main
from flatradix.replay import report, synthetic_workload
from flatradix.replay.parallel import Interrupted

from .test_cli import ROOT, assert_clean_error, run_cli

sweep_module = importlib.import_module("flatradix.replay.sweep")

# how long the runs have to stop after SIGINT (issue 30: 2 s; loaded CI machines
# get slack, the figure measured is in the assertion message)
EXIT_WITHIN_S = 2.0 if os.environ.get("CI") is None else 5.0


# ---------------------------------------------------------------- options
@pytest.mark.parametrize("args,needles", [
    # argparse took -1GiB for an option: "expected one argument" (--kv-memory -1GiB and
    # --cap 5 are rows of test_cli.py's table, quoted in docs/replay.md)
    (["--capacity", "-5"], ["argument --capacity", ">= 1", "'-5'"]),
    (["--sweep", "-2M"], ["argument --sweep", "'-2M'"]),
    # abbreviations are off
    (["--lim", "5"], ["unrecognized arguments: --lim 5"]),
])
def test_option_findings(args, needles):
    p = run_cli(*args)
    assert_clean_error(p, *needles)


def test_sweep_capacity_given_twice_runs_once(capsys):
    # 2M twice, and 2,000,000 tokens as bytes (1 byte a token): one point each
    assert main(["replay", "--limit", "30", "--sweep", "2M,1M,2M,2000000B",
                 "--kv-bytes-per-token", "1", "--json", "--no-progress"]) == 0
    curve = json.loads(capsys.readouterr().out)
    assert [p["capacity"] for p in curve["points"]] == [2_000_000, 1_000_000]


def test_progress_hint_without_tqdm(monkeypatch, capsys):
    from flatradix.replay import _progress

    class Tty:
        def isatty(self):
            return True

        def write(self, s):
            sys.__stderr__.write(s)

    monkeypatch.setitem(sys.modules, "tqdm", None)      # import tqdm fails
    monkeypatch.setattr(_progress, "_hinted", False)
    lines = []
    monkeypatch.setattr(_progress.sys, "stderr", Tty())
    monkeypatch.setattr("builtins.print", lambda *a, **k: lines.append(" ".join(map(str, a))))
    assert _progress.progress_bar(10, True) is None
    assert _progress.progress_bar(10, True) is None     # said once per process
    assert lines == [_progress.TQDM_HINT]
    assert "pip install 'flatradix[replay]'" in lines[0]
    lines.clear()
    monkeypatch.setattr(_progress, "_hinted", False)
    assert _progress.progress_bar(10, False) is None    # --no-progress: nothing said
    assert lines == []


def test_torch_int16_value_is_refused():
    torch = pytest.importorskip("torch")
    from flatradix import InsertParams, RadixKey, UnifiedRadixCache

    c = UnifiedRadixCache(page_size=1)
    c.insert(InsertParams(key=RadixKey([1, 2]), value=np.array([7, 8])))
    before = c._snapshot()
    for dt in (torch.int16, torch.int8, torch.uint8):
        with pytest.raises(TypeError, match=r"params.value must be a torch int32 or int64 "
                                            r"tensor, got torch\.(u?int(8|16))"):
            c.insert(InsertParams(key=RadixKey([1, 2, 3]), value=torch.tensor([7, 8, 9],
                                                                                dtype=dt)))
    from .conftest import assert_state_equal
    assert_state_equal(before, c._snapshot())
    for dt in (torch.int32, torch.int64):     # the documented dtypes
        c.insert(InsertParams(key=RadixKey([1, 2, 3]), value=torch.tensor([7, 8, 9], dtype=dt)))


# ---------------------------------------------------------------- late writes
@pytest.fixture()
def full(tmp_path):
    """``name`` -> a path that passes the early output check and fails when written
    (a link to /dev/full: No space left on device)."""
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")

    def make(name):
        p = tmp_path / name
        p.symlink_to("/dev/full")
        return p
    return make


@pytest.mark.parametrize("opt,name,sweep", [
    ("--csv", "r.csv", False), ("--out", "r.json", False), ("--per-request", "q.csv", False),
    ("--csv", "s.csv", True), ("--plot", "s.png", True), ("--out", "s.json", True)])
def test_a_failing_write_at_the_end_keeps_the_results(full, opt, name, sweep):
    if opt == "--plot":
        pytest.importorskip("matplotlib")
    args = ["--limit", "40", "--no-progress", opt, full(name)]
    args += ["--sweep", "4k"] if sweep else ["--capacity", "4k"]
    p = run_cli(*args)
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode == 2, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"flatradix replay: error: {opt}: cannot "
                                                    f"write "), p.stderr
    assert "No space left on device" in lines[0]
    # the results were printed all the same
    assert ("hit ratio" in p.stdout) if sweep else ("hit tokens" in p.stdout), p.stdout


def test_csv_to_dev_full_and_json_kept(full):
    p = run_cli("--limit", "40", "--capacity", "4k", "--csv", "/dev/full", "--json",
                "--no-progress")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip() == ("flatradix replay: error: --csv: cannot write /dev/full: No "
                                "space left on device")
    assert json.loads(p.stdout)["requests"] == 40


def test_an_unwritable_path_under_proc():
    # as root the early check lets /proc/version through; the write then fails
    p = run_cli("--limit", "20", "--capacity", "4k", "--out", "/proc/version", "--no-progress")
    assert_one_line = p.stderr.strip().splitlines()
    assert "Traceback" not in p.stderr and p.returncode == 2, p.stderr
    assert len(assert_one_line) == 1 and "--out" in assert_one_line[0]
    if "cannot write /proc/version:" in p.stderr and "permission denied" not in p.stderr:
        assert "hit tokens" in p.stdout     # a late failure: the results printed


# ---------------------------------------------------------------- interrupts
def test_an_interrupted_sweep_keeps_the_finished_points(monkeypatch, tmp_path):
    real = sweep_module._run_point
    calls = []

    def run_point(workload, task):
        calls.append(task[1])
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(workload, task)

    monkeypatch.setattr(sweep_module, "_run_point", run_point)
    w = synthetic_workload(60, seed=1)
    with pytest.raises(Interrupted) as e:
        sweep_module.sweep(w, [2_000, 4_000, 8_000, 16_000], policies=["lru"])
    curve = e.value.partial
    assert e.value.finished == 2 and isinstance(e.value, KeyboardInterrupt)
    assert curve["partial"] == {"finished_runs": 2, "runs": 5}
    assert [p["capacity"] for p in curve["points"]] == [2_000, 4_000]
    assert curve["unbounded"] is None and curve["unbounded_hit_ratio"] is None
    # the same figures as an uninterrupted sweep's points
    monkeypatch.setattr(sweep_module, "_run_point", real)
    whole = sweep_module.sweep(w, [2_000, 4_000], policies=["lru"])
    for a, b in zip(curve["points"], whole["points"]):
        a, b = dict(a), dict(b)
        a.pop("wall_s"), b.pop("wall_s")
        assert a == b
    # what the CLI writes of it
    text = report.format_sweep(curve)
    assert "partial: interrupted, 2 of 5 runs finished" in text and "any" not in text
    report.write_sweep_csv(curve, tmp_path / "p.csv")
    assert len((tmp_path / "p.csv").read_text().splitlines()) == 3
    if importlib.util.find_spec("matplotlib"):
        report.plot_sweep(curve, tmp_path / "p.png")


def test_a_sweep_interrupted_before_any_point_has_no_partial(monkeypatch):
    def run_point(workload, task):
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep_module, "_run_point", run_point)
    with pytest.raises(KeyboardInterrupt) as e:
        sweep_module.sweep(synthetic_workload(5), [1_000])
    assert isinstance(e.value, Interrupted)
    assert e.value.finished == 0 and e.value.partial is None


DRIVER = textwrap.dedent("""
    # flatradix replay with each finished run said on stderr ("DONE") and the runs
    # of capacity SLOW made to hang: the test interrupts it mid-sweep
    import importlib, multiprocessing, sys, time
    multiprocessing.set_start_method("fork")
    sw = importlib.import_module("flatradix.replay.sweep")
    sim = importlib.import_module("flatradix.replay.sim")
    from flatradix import cli
    slow = int(sys.argv[1])
    real_point, real_tick, real_replay = sw._run_point, sw._tick, sim.replay

    def run_point(workload, task):
        if task[1] == slow:
            time.sleep(600)
        return real_point(workload, task)

    def tick(bar, r):
        print("DONE", r.capacity, file=sys.stderr, flush=True)
        real_tick(bar, r)

    depth = [0]

    def replay(workload, capacity=None, **kw):
        # (the kernels' warm-up calls replay too: only the outer runs count)
        if depth[0] == 0 and capacity == slow and kw.get("policy") == "fifo":
            time.sleep(600)
        depth[0] += 1
        try:
            r = real_replay(workload, capacity=capacity, **kw)
        finally:
            depth[0] -= 1
        if depth[0] == 0:
            print("DONE", r.policy, file=sys.stderr, flush=True)
        return r

    sw._run_point, sw._tick, sim.replay = run_point, tick, replay
    sys.exit(cli.main(sys.argv[2:]))
""")


def _interrupt(tmp_path, slow, args, finished, group, driver_source=DRIVER):
    """Run the driver (``driver_source``: a script that makes the runs of ``slow``
    hang and says "DONE" on stderr for each finished run), wait for ``finished``
    runs, SIGINT it (its process group with ``group``: a terminal's Ctrl-C), and
    return (process, stdout, stderr, seconds from the signal to its exit)."""
    driver = tmp_path / "driver.py"
    driver.write_text(driver_source)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen([sys.executable, str(driver), str(slow), "replay", *map(str, args)],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    done, seen = 0, []
    try:
        while done < finished:
            line = p.stderr.readline()
            seen.append(line)
            assert line, f"the run ended before {finished} runs finished: {''.join(seen)}"
            done += line.startswith("DONE")
        time.sleep(0.2)     # the interrupt lands while the slow runs are going
        t = time.monotonic()
        if group:
            os.killpg(p.pid, signal.SIGINT)
        else:
            p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        return p, out, "".join(seen) + err, time.monotonic() - t
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


@pytest.mark.parametrize("group", [False, True], ids=["sigint", "ctrl-c"])
def test_a_parallel_sweep_stops_at_once_and_keeps_its_points(tmp_path, group):
    csv = tmp_path / "s.csv"
    # points 1k, 2k, (3000: hangs), 4k, and the unbounded run, in 2 processes
    p, out, err, took = _interrupt(
        tmp_path, 3000, ["--limit", "100", "--sweep", "1k,2k,3000,4k", "--jobs", "2", "--json",
                         "--no-progress", "--csv", csv], 3, group)
    assert took < EXIT_WITHIN_S, f"exited {took:.2f} s after SIGINT"
    assert p.returncode == 130 and "Traceback" not in err, err
    curve = json.loads(out)
    k = curve["partial"]["finished_runs"]
    # the other worker may finish the unbounded run before the signal lands
    assert k in (3, 4) and curve["partial"]["runs"] == 5
    assert f"interrupted: {k} of 5 runs finished" in err
    got = [q["capacity"] for q in curve["points"]] + (["inf"] if curve["unbounded"] else [])
    assert len(got) == k and 3000 not in got
    rows = csv.read_text().splitlines()
    assert len(rows) == 1 + k, rows


def test_interrupted_runs_keep_the_finished_policies(tmp_path):
    csv = tmp_path / "r.csv"
    p, out, err, took = _interrupt(
        tmp_path, 5000, ["--limit", "100", "--capacity", "5000", "--policy", "lru,lfu,fifo",
                         "--json", "--no-progress", "--csv", csv], 2, False)
    assert took < EXIT_WITHIN_S, f"exited {took:.2f} s after SIGINT"
    assert p.returncode == 130 and "Traceback" not in err, err
    runs = json.loads(out)
    assert [r["policy"] for r in runs] == ["lru", "lfu"]
    assert all(r["partial"] == {"finished_runs": 2, "runs": 3} for r in runs)
    assert len(csv.read_text().splitlines()) == 3


def test_a_real_parallel_sweep_stops_within_seconds(tmp_path):
    # no stand-ins: a sweep of real replays in 2 processes, interrupted after its
    # workers started
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen([sys.executable, "-m", "flatradix", "replay", "--limit", "20000",
                          "--sweep", "100k,200k,400k,800k", "--jobs", "2", "--no-progress"],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        time.sleep(4)
        t = time.monotonic()
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=60)
        took = time.monotonic() - t
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert "Traceback" not in err, err
    assert p.returncode in (130, 0), err     # 0: it finished before the signal
    assert took < EXIT_WITHIN_S, f"exited {took:.2f} s after SIGINT"
