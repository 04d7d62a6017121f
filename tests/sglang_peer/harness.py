"""Run SGLang's own unified-radix-cache tests (``../shared/peer_tests/sglang-urc``) on a TreeCore.

The peer suite (SGLang's unit file, its registry tests and its randomized
bench) runs in the oracle venv (SGLang 0.5.23, ``tests/oracle/README.md``)
through the suite's ``run.sh BACKEND``; flatradix's TreeCore is the backend
``flatradix``, loaded through its ``sglang.srt.plugins`` entry point (the venv
needs flatradix installed, e.g. ``pip install --no-deps -e .``; this checkout's
code is what runs: the repository root is put first on ``PYTHONPATH``).

``record.py`` runs a backend and records which tests pass
(``python_core_passes.txt``: the criterion is that flatradix passes every test
SGLang's Python core passes, less the listed exceptions);
``test_peer_suite.py`` runs flatradix on that list.
"""

import os
import pathlib
import subprocess
import xml.etree.ElementTree as ET

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
PEER_DIR = REPO.parent / "shared" / "peer_tests" / "sglang-urc"
ORACLE_VENV = pathlib.Path(os.environ.get("FLATRADIX_ORACLE_VENV",
                                          pathlib.Path.home() / ".cache" / "flatradix-sglang-oracle"))
UNIT_FILE = "test_unified_radix_cache_unittest.py"
REGISTRY_FILE = "test_tree_core_registry.py"
BENCH_FILE = "test_unified_radix_cache_bench.py"
PASS_LIST = HERE / "python_core_passes.txt"
EXCEPTIONS = HERE / "exceptions.txt"
NOT_SERVED = HERE / "not_served.txt"


def oracle_python():
    """``(path to the venv's python, None)``, or ``(None, why it cannot run)``."""
    py = ORACLE_VENV / "bin" / "python"
    if not (PEER_DIR / "run.sh").is_file():
        return None, f"SGLang's peer suite is not at {PEER_DIR}"
    if not py.is_file():
        return None, f"no oracle venv at {ORACLE_VENV} (../shared/tools/setup_sglang_oracle.sh)"
    probe = ("import importlib.util as u, sys; from importlib.metadata import entry_points; "
             "ok = u.find_spec('sglang') and u.find_spec('torch') and u.find_spec('pytest'); "
             "eps = [e.value for e in entry_points(group='sglang.srt.plugins') "
             "if e.name == 'flatradix']; "
             "print('missing sglang/torch/pytest' if not ok else "
             "'no flatradix entry point (pip install --no-deps -e .)' if not eps else '')")
    try:
        r = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"the oracle venv's python does not run: {e}"
    why = r.stdout.strip() or (r.stderr.strip().splitlines() or [""])[-1]
    if r.returncode or why:
        return None, f"oracle venv {ORACLE_VENV}: {why or 'probe failed'}"
    return py, None


def run(py, backend, junit, *, select=None, files=(), workers=None, timeout=None,
        extra_args=(), log=None):
    """Run the peer suite on ``backend`` (``run.sh``), writing a JUnit XML report to
    ``junit``. ``select``: a file of node ids to keep (others deselected);
    ``files``: more test files of the suite to collect (registry, bench);
    ``workers``: pytest-xdist workers. Returns the ``CompletedProcess``."""
    env = dict(os.environ)
    env["PY"] = str(py)
    # this checkout first (run.sh appends the caller's PYTHONPATH after its shims)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(HERE)])
    env.pop("FLATRADIX_PEER_SELECT", None)
    if select is not None:
        env["FLATRADIX_PEER_SELECT"] = str(select)
    args = ["bash", str(PEER_DIR / "run.sh"), backend, "-p", "select_plugin",
            f"--junitxml={junit}", "-o", "junit_family=xunit1", *files, *extra_args]
    if workers:
        args += ["-n", str(workers)]
    out = open(log, "w") if log else subprocess.DEVNULL
    try:
        return subprocess.run(args, cwd=PEER_DIR, env=env, stdout=out, stderr=subprocess.STDOUT,
                              timeout=timeout)
    finally:
        if log:
            out.close()


def outcomes(junit):
    """``{node id: "passed" | "failed" | "error" | "skipped"}`` from a JUnit XML report."""
    res = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        cls = case.get("classname", "")
        mod, _, klass = cls.partition(".")
        nodeid = f"{mod.replace('.', '/')}.py::{klass}::{case.get('name')}" if klass else (
            f"{mod}.py::{case.get('name')}")
        kinds = {child.tag for child in case}
        if "failure" in kinds:
            res[nodeid] = "failed"
        elif "error" in kinds:
            res[nodeid] = "error"
        elif "skipped" in kinds:
            res[nodeid] = "skipped"
        else:
            res[nodeid] = "passed"
    return res


def expected_failures():
    """Node ids not expected to pass on flatradix: ``exceptions.txt`` (deliberate,
    with reasons) and ``not_served.txt`` (the host tier, not served yet)."""
    return set(read_list(EXCEPTIONS)) | set(read_list(NOT_SERVED))


def read_list(path):
    """Node ids of a list file (``#`` comments and blank lines skipped); for
    ``exceptions.txt`` the first word of each line."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.append(line.split()[0])
    return out
