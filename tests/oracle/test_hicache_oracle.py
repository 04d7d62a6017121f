"""Differential test of the host tier (HiCache): flatradix against SGLang 0.5.23's own
``UnifiedRadixCache`` with HiCache on CPU, with both of SGLang's tree cores (pure
Python and Rust), on every configuration of ``tests/oracle/hicache_driver.py``
(write_through and write_through_selective; pages 1, 2 and 4; lru, lfu, fifo;
load_back_threshold 1 and 10; small device and host pools), compared after every
op: return values, slots on both tiers through bijections, the transfers, sizes,
the backup / load-back protocol state and the KV events.

SGLang only runs in its own venv (``../shared/tools/setup_sglang_oracle.sh``), so
the driver runs there in two subprocesses, one per SGLang core, side by side; this
file parses their ``ORACLE_RESULT`` lines. The tests skip, saying why, when that
venv is absent or ``FLATRADIX_SKIP_ORACLE=1``.

Knobs (environment): ``FLATRADIX_ORACLE_VENV`` (default
``~/.cache/flatradix-sglang-oracle``), ``FLATRADIX_ORACLE_HICACHE_OPS`` (ops per
configuration and core, default 2000), ``FLATRADIX_ORACLE_SEED`` (default 0),
``FLATRADIX_ORACLE_HICACHE_TOLERATE`` (a comma list of the driver's ``KNOWN``
divergences to go past; empty by default, so a known divergence fails its test).
Long runs: ``python -m tests.oracle.hicache_driver --ops 20000`` (see the driver).
"""

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
VENV = pathlib.Path(os.environ.get("FLATRADIX_ORACLE_VENV",
                                   pathlib.Path.home() / ".cache" / "flatradix-sglang-oracle"))
OPS = int(os.environ.get("FLATRADIX_ORACLE_HICACHE_OPS", "2000"))
SEED = int(os.environ.get("FLATRADIX_ORACLE_SEED", "0"))
TOLERATE = os.environ.get("FLATRADIX_ORACLE_HICACHE_TOLERATE", "")
TIMEOUT_S = int(os.environ.get("FLATRADIX_ORACLE_TIMEOUT", "900"))
BACKENDS = ("python", "rust")

# Mirrors hicache_driver.CONFIGS / MUTANTS (the driver itself only imports in the
# oracle venv); test_config_lists_match checks the copies.
CONFIGS = ("p1-wt-lru", "p1-wt-lru-t10", "p4-wt-lru", "p2-wts-lru", "p2-wts-lru-t10",
           "p1-wt-lfu", "p4-wt-fifo", "p1-wb-lru", "p4-wb-lru", "p2-wb-lfu-t10")
MUTANTS = ("wt-threshold-off-by-one", "load-back-threshold-ignored", "backup-no-host-evict",
           "host-hit-zero", "one-ack-per-backup", "wb-no-reclaim", "wb-always-drop",
           "insert-host-as-write-back")


def _env():
    env = dict(os.environ)
    env.update(SGLANG_USE_CPU_ENGINE="1", SGLANG_RUST_BUILD_MODE="never", OMP_NUM_THREADS="1",
               # the checkout's flatradix first (cwd is ROOT), then the sgl_kernel stub
               PYTHONPATH=os.pathsep.join([str(ROOT), str(VENV / "peer_stubs")]))
    env.pop("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", None)
    return env


def _skip_reason():
    if os.environ.get("FLATRADIX_SKIP_ORACLE") == "1":
        return "FLATRADIX_SKIP_ORACLE=1"
    py = VENV / "bin" / "python"
    if not py.exists():
        return (f"no SGLang oracle venv at {VENV}: build it with "
                "`bash ../shared/tools/setup_sglang_oracle.sh` (.ci/run does)")
    probe = ("import importlib.util as u, sys; missing = [m for m in ('sglang', 'numba', 'msgspec', "
             "'torch') if u.find_spec(m) is None]; print(','.join(missing)); sys.exit(1 if missing else 0)")
    r = subprocess.run([str(py), "-c", probe], cwd=ROOT, env=_env(), capture_output=True, text=True,
                       timeout=120)
    if r.returncode != 0:
        return (f"oracle venv {VENV} lacks: {r.stdout.strip() or r.stderr.strip()[-300:]} "
                "(re-run ../shared/tools/setup_sglang_oracle.sh)")
    return None


@pytest.fixture(scope="module")
def hicache_runs(tmp_path_factory):
    """Run the driver for both SGLang cores in parallel; {(config, backend): result}."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    repro = tmp_path_factory.mktemp("hicache-oracle-repro")
    procs = {}
    t0 = time.monotonic()
    for backend in BACKENDS:
        cmd = [str(VENV / "bin" / "python"), "-m", "tests.oracle.hicache_driver", "--config", "all",
               "--backend", backend, "--ops", str(OPS), "--seed", str(SEED),
               "--shrink-seconds", "20", "--repro-dir", str(repro)]
        if TOLERATE:
            cmd += ["--tolerate", TOLERATE]
        if backend == "rust":
            cmd.append("--self-test")
        procs[backend] = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True)
    results, logs = {}, {}
    for backend, p in procs.items():
        try:
            out, _ = p.communicate(timeout=max(1, TIMEOUT_S - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            out += f"\n[killed after {TIMEOUT_S} s]"
        logs[backend] = out
        for line in out.splitlines():
            if line.startswith("ORACLE_RESULT "):
                res = json.loads(line[len("ORACLE_RESULT "):])
                results[(res["config"], res["backend"])] = res
            elif line.startswith("ORACLE_SELFTEST "):
                results[("selftest", backend)] = json.loads(line[len("ORACLE_SELFTEST "):])
    print(f"hicache oracle: {len(results)} results in {time.monotonic() - t0:.0f} s")
    return results, logs


def _as_tuples(x):
    """JSON lists back into the driver's op tuples (for printing)."""
    return [tuple(tuple(f) if isinstance(f, list) else f for f in op) for op in x or []]


def _tail(text, n=4000):
    return text if len(text) <= n else "..." + text[-n:]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("config", CONFIGS)
def test_no_divergence(hicache_runs, config, backend):
    results, logs = hicache_runs
    res = results.get((config, backend))
    if res is None:
        pytest.fail(f"driver produced no result for {config}/{backend}; its output:\n"
                    + _tail(logs[backend]))
    if res["divergences"]:
        rep = res.get("reproducer", {})
        pytest.fail(f"{config}/{backend}: flatradix diverges from SGLang's HiCache after "
                    f"{res['ops']} ops: {rep.get('detail', res.get('sig'))}\nshrunk reproducer "
                    f"({len(rep.get('ops', []))} ops; replay with `python -m "
                    f"tests.oracle.hicache_driver --replay {rep.get('path')}` in the oracle "
                    f"venv):\nops = {_as_tuples(rep.get('ops'))!r}")
    assert res["ops"] == OPS


def test_self_test_catches_mutants(hicache_runs):
    """Deliberately wrong flatradix façades must diverge within the op budget (the
    comparisons have teeth): see hicache_driver.MUTANTS."""
    results, logs = hicache_runs
    st = results.get(("selftest", "rust"))
    if st is None:
        pytest.fail("driver produced no self-test result; its output:\n" + _tail(logs["rust"]))
    assert sorted(st) == sorted(MUTANTS)
    missed = [name for name, r in st.items() if not r["caught"]]
    assert not missed, f"mutants not detected: {missed}: {st}"


def test_config_lists_match():
    """``CONFIGS`` / ``MUTANTS`` above are copies of the driver's (which imports only
    in the oracle venv)."""
    src = (ROOT / "tests" / "oracle" / "hicache_driver.py").read_text()
    found = []
    for head in ("\nCONFIGS = {", "\nMUTANTS = {"):
        block = src.split(head, 1)[1].split("\n}\n", 1)[0]
        found.append(tuple(ln.split('"')[1] for ln in block.splitlines()
                           if ln.startswith('    "')))
    assert found == [CONFIGS, MUTANTS]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
