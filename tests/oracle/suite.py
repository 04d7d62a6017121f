"""What the oracle's pytest files share: the SGLang venv, its environment, the
skip reason, and running a driver for both SGLang cores side by side.

``test_oracle.py`` (``driver.py``) and ``test_hicache_oracle.py``
(``hicache_driver.py``) run their driver in the SGLang venv as two subprocesses,
one per SGLang tree core, and read the ``ORACLE_RESULT`` / ``ORACLE_SELFTEST``
lines they print.
"""

import json
import os
import pathlib
import subprocess
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
VENV = pathlib.Path(os.environ.get("FLATRADIX_ORACLE_VENV",
                                   pathlib.Path.home() / ".cache" / "flatradix-sglang-oracle"))
SEED = int(os.environ.get("FLATRADIX_ORACLE_SEED", "0"))
BACKENDS = ("python", "rust")


def env():
    """The drivers' environment: SGLang on the CPU, the checkout's flatradix first
    (cwd is ROOT), then the venv's ``sgl_kernel`` stub."""
    e = dict(os.environ)
    e.update(SGLANG_USE_CPU_ENGINE="1", SGLANG_RUST_BUILD_MODE="never", OMP_NUM_THREADS="1",
             PYTHONPATH=os.pathsep.join([str(ROOT), str(VENV / "peer_stubs")]))
    e.pop("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", None)
    return e


def skip_reason(fix_hint):
    """Why the oracle cannot run here (None when it can); ``fix_hint`` ends the
    message for a venv that lacks a package."""
    if os.environ.get("FLATRADIX_SKIP_ORACLE") == "1":
        return "FLATRADIX_SKIP_ORACLE=1"
    py = VENV / "bin" / "python"
    if not py.exists():
        return (f"no SGLang oracle venv at {VENV} (a Python 3.11 venv with sglang==0.5.23 "
                "installed --no-deps, torch, the pure-Python packages SGLang's cache imports, "
                "numba and msgspec): tests/oracle/README.md, 'The oracle venv', says how to "
                "build it from a clone; in the project's workspace "
                "`bash ../shared/tools/setup_sglang_oracle.sh` does (.ci/run runs it); "
                "FLATRADIX_ORACLE_VENV points elsewhere")
    probe = ("import importlib.util as u, sys; missing = [m for m in ('sglang', 'numba', "
             "'msgspec', 'torch') if u.find_spec(m) is None]; print(','.join(missing)); "
             "sys.exit(1 if missing else 0)")
    r = subprocess.run([str(py), "-c", probe], cwd=ROOT, env=env(), capture_output=True,
                       text=True, timeout=120)
    if r.returncode != 0:
        return (f"oracle venv {VENV} lacks: {r.stdout.strip() or r.stderr.strip()[-300:]} "
                f"({fix_hint})")
    return None


def run_drivers(module, label, ops, shrink_seconds, repro, timeout_s, extra=()):
    """Run ``python -m module --config all`` for both SGLang cores in parallel (the
    Rust one with ``--self-test``); returns ``({(config, backend): result,
    ("selftest", backend): mutants}, {backend: output})``."""
    procs = {}
    t0 = time.monotonic()
    for backend in BACKENDS:
        cmd = [str(VENV / "bin" / "python"), "-m", module, "--config", "all",
               "--backend", backend, "--ops", str(ops), "--seed", str(SEED),
               "--shrink-seconds", str(shrink_seconds), "--repro-dir", str(repro), *extra]
        if backend == "rust":
            cmd.append("--self-test")
        procs[backend] = subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True)
    results, logs = {}, {}
    for backend, p in procs.items():
        try:
            out, _ = p.communicate(timeout=max(1, timeout_s - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            out += f"\n[killed after {timeout_s} s]"
        logs[backend] = out
        for line in out.splitlines():
            if line.startswith("ORACLE_RESULT "):
                res = json.loads(line[len("ORACLE_RESULT "):])
                results[(res["config"], res["backend"])] = res
            elif line.startswith("ORACLE_SELFTEST "):
                results[("selftest", backend)] = json.loads(line[len("ORACLE_SELFTEST "):])
    print(f"{label}: {len(results)} results in {time.monotonic() - t0:.0f} s")
    return results, logs


def as_tuples(x):
    """JSON lists back into the driver's op tuples (for printing)."""
    return [tuple(tuple(f) if isinstance(f, list) else f for f in op) for op in x or []]


def tail(text, n=4000):
    return text if len(text) <= n else "..." + text[-n:]
