"""The one stderr line a compiling run prints (``flatradix._compile_notice``), the
``flatradix compile`` command's interface, and the deferred scipy import.

The notice is checked in fresh processes with a probe function in a
``flatradix.*`` module compiled without Numba's cache, so it compiles every time
whatever the state of the cache (each process takes ~1-2 s).
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = """
import sys, types, numba
import flatradix
mod = types.ModuleType("flatradix._probe")
sys.modules["flatradix._probe"] = mod
exec("def helper(x):\\n    return x + 1\\ndef probe(x):\\n    return helper(x) * 2\\n", mod.__dict__)
mod.helper = numba.njit(mod.helper)
mod.probe = numba.njit(mod.probe)
def other(x):
    return x - 1
other = numba.njit(other)          # not flatradix's: never announced
"""


def _run(code, **env):
    e = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    e.pop("FLATRADIX_QUIET_COMPILE", None)
    e.update(env)
    r = subprocess.run([sys.executable, "-c", PROBE + code], capture_output=True, text=True,
                       env=e, timeout=300)
    assert r.returncode == 0, r.stderr
    return r


def test_a_library_compile_says_so_once_and_the_total_at_exit():
    r = _run("assert mod.probe(1) == 4\nassert mod.probe(2) == 6\n"
             "from flatradix._compile_notice import stats\ns = stats()\n"
             "assert s['compiles'] == 2 and s['entries'] == 1, s\nprint('ok')")
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2, r.stderr
    assert lines[0].startswith("flatradix: compiling kernels on first use") \
        and "flatradix compile" in lines[0], lines[0]
    assert lines[1].startswith("flatradix: compiled 2 functions in "), lines[1]
    assert r.stdout.strip() == "ok"


def test_a_phase_is_one_line_with_its_time():
    r = _run("from flatradix._compile_notice import phase\n"
             "with phase(' for this test'):\n    mod.probe(1)\n    other(1)\n"
             "with phase(' again'):\n    mod.probe(2)\n")   # cached in-process: silent
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("flatradix: compiling kernels for this test (first run; "
                               "Numba caches them in "), lines[0]
    assert lines[0].endswith(" s (2 functions)"), lines[0]


def test_no_line_without_a_flatradix_compile_and_quiet_when_asked():
    assert _run("other(1)").stderr == ""
    assert _run("mod.probe(1)", FLATRADIX_QUIET_COMPILE="1").stderr == ""


def test_the_replay_warm_up_reports_through_a_phase(monkeypatch, capsys):
    """``warm_up`` wraps its compiles in a phase (one line; nothing when cached)."""
    from flatradix import _compile_notice
    from flatradix.replay import sim

    seen = []
    monkeypatch.setattr(sim, "_warm", set())
    monkeypatch.setattr(sim, "_warm_up",
                        lambda kind, swa, W, **kw: seen.append(_compile_notice._state["phase"]) or 0.5)
    assert sim.warm_up(swa=True) == 0.5
    assert seen and seen[0] is not None and "swa replay" in seen[0]["what"]
    assert capsys.readouterr().err == ""     # nothing compiled: nothing said


def test_compile_command_lists_and_refuses_bad_options():
    from flatradix import precompile
    from flatradix.cli import main

    assert set(precompile.GROUPS) >= {"full", "swa", "mamba", "host", "replay"}
    r = subprocess.run([sys.executable, "-m", "flatradix", "compile", "--list"],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0 and r.stdout.split()[0] == "full", r.stderr
    assert main(["compile", "--only", "nope"]) == 2
    assert main(["compile", "--jobs", "0"]) == 2
    with pytest.raises(SystemExit):
        main(["compile", "--onl", "full"])        # no abbreviations


def test_scipy_is_not_imported_by_the_first_kernel_call():
    pytest.importorskip("scipy")
    code = ("import sys, numpy as np\nimport flatradix as F\n"
            "c = F.UnifiedRadixCache()\n"
            "c.insert(F.InsertParams(key=F.RadixKey([1, 2]), value=np.array([1, 2])))\n"
            "c.match_prefix(F.MatchPrefixParams(key=F.RadixKey([1, 2])))\n"
            "assert 'scipy.linalg' not in sys.modules, 'scipy.linalg imported'\n"
            "import numba\n"
            "@numba.njit\ndef dot(a, b):\n    return np.dot(a, b)\n"
            "assert dot(np.ones(3), np.ones(3)) == 3.0\n"          # BLAS still there
            "assert 'scipy.linalg' in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_compile_command_stops_at_once_on_an_interrupt(tmp_path, sig):
    """SIGINT or SIGTERM while the workloads compile (an empty cache): exit status 130
    within a few seconds, one line, no worker left behind."""
    import signal
    import time

    env = dict(os.environ, PYTHONPATH=ROOT, NUMBA_CACHE_DIR=str(tmp_path))
    # SIGINT as a terminal delivers it: a suite started in the background by a
    # non-interactive shell inherits SIGINT ignored, and so would the command
    p = subprocess.Popen([sys.executable, "-m", "flatradix", "compile", "--jobs", "2"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    head = p.stderr.readline()            # the workloads have started
    from flatradix.precompile import GROUPS

    assert head.startswith(f"flatradix compile: {len(GROUPS)} workloads"), head
    time.sleep(2)
    p.send_signal(getattr(signal, sig))
    t = time.monotonic()
    out, err = p.communicate(timeout=60)
    err = head + err
    assert time.monotonic() - t < 20, err      # (seconds idle; a loaded CI box is slower)
    assert p.returncode == 130, (p.returncode, err)
    assert err.strip().splitlines()[-1] == ("flatradix compile: interrupted (what finished is "
                                            "cached)"), err
    assert "Traceback" not in err
    mine = f"NUMBA_CACHE_DIR={tmp_path}".encode()
    left = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if mine in f.read().split(b"\0"):
                    left.append(pid)
        except (OSError, ValueError):
            pass
    assert left == [], f"workers left running: {left}"


def test_a_hold_folds_earlier_compiles_into_the_phase_line_and_reports_late_ones():
    r = _run("from flatradix._compile_notice import hold, phase\n"
             "with hold():\n    mod.helper(1)\n    with phase(' for this run'):\n"
             "        mod.probe(1)\n"
             "with hold():\n    other(1)\n")          # nothing of ours: nothing said
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("flatradix: compiling kernels for this run (first run; "), lines
    assert lines[0].endswith(" s (2 functions)"), lines
    # a compile after the phase: one line at the end of the hold, none at exit
    r = _run("from flatradix._compile_notice import hold, phase\n"
             "with hold():\n    with phase(' for this run'):\n        mod.helper(1)\n"
             "    mod.probe(1)\n")
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].endswith(" s (1 function)"), r.stderr
    assert lines[1].startswith("flatradix: compiled 1 more function in "), lines
    # an error inside the hold: its own line stays the only one
    r = _run("from flatradix._compile_notice import hold\n"
             "try:\n    with hold():\n        mod.probe(1)\n        raise ValueError\n"
             "except ValueError:\n    pass\n")
    assert r.stderr == ""


def test_a_replay_warms_up_its_own_driver_and_check_only(monkeypatch):
    """The warm-up compiles what the run calls: its driver, and ``sanity_check``
    only when the run checks (issue 30: a run compiles only what it uses)."""
    from flatradix.replay import sim
    from flatradix.replay.config import ReplayConfig

    calls = []
    monkeypatch.setattr(sim, "_warm", set())
    monkeypatch.setattr(sim, "_warm_up", lambda kind, swa, W, driver=None, check=True:
                        calls.append((kind, driver, check)) or sim._warm.add((kind, driver, check))
                        or 0.25)
    assert sim.warm_up_for(ReplayConfig(check=False)) == 0.25
    assert calls == [("full", "request", False)]
    assert sim.warm_up_for(ReplayConfig(check=False)) == 0.0         # once per process
    assert sim.warm_up_for(ReplayConfig(check=True)) == 0.25         # now with the checker
    assert sim.warm_up_for(ReplayConfig(driver="core", check=False)) == 0.25
    assert calls[1:] == [("full", "request", True), ("full", "core", False)]
    calls.clear()
    assert sim.warm_up() == 0.25                                     # both drivers, checked
    assert sim.warm_up(driver="request", check=False) == 0.0         # covered by it
    assert sim.warm_up_for(ReplayConfig(swa_window=64, check=False)) == 0.25
    assert calls == [("full", None, True), ("swa", None, False)]


def test_the_cli_replay_runs_sanity_check_only_with_check(monkeypatch, capsys):
    from flatradix import cache
    from flatradix.cli import main

    n = []
    real = cache.UnifiedRadixCache.sanity_check
    monkeypatch.setattr(cache.UnifiedRadixCache, "sanity_check",
                        lambda self: n.append(1) or real(self))
    assert main(["replay", "--no-progress", "--limit", "40"]) == 0
    assert n == [] and "KV conservation ok" in capsys.readouterr().out
    assert main(["replay", "--no-progress", "--limit", "40", "--check"]) == 0
    assert n and "KV conservation ok" in capsys.readouterr().out


def test_a_parallel_sweep_compiles_in_the_parent_first(monkeypatch):
    """``--sweep --jobs N`` on a cold cache: the parent warms the kernels up once
    before the workers start (they inherit or load them), not each worker."""
    import importlib

    from flatradix.replay.trace import synthetic_workload

    sweep = importlib.import_module("flatradix.replay.sweep")
    order = []
    monkeypatch.setattr(sweep, "warm_up_for", lambda cfg: order.append(("warm", cfg)))

    def run_all(fn, shared, tasks, jobs=1, on_result=None, backend=None):
        order.append(("run", jobs))
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep, "run_all", run_all)
    w = synthetic_workload(20, seed=1)
    with pytest.raises(KeyboardInterrupt):
        sweep.sweep(w, [100, 200], jobs=2, swa_windows=[8], check=False)
    assert [o[0] for o in order] == ["warm", "run"]
    cfg = order[0][1]
    assert cfg.swa_window == 8 and cfg.check is False and cfg.capacity == 100
    order.clear()
    with pytest.raises(KeyboardInterrupt):
        sweep.sweep(w, [100, 200], jobs=1)
    assert order == [("run", 1)]       # one process: its first run warms up
