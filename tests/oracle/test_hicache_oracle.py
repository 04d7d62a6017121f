"""Differential test of the host tier (HiCache): flatradix against SGLang 0.5.23's own
``UnifiedRadixCache`` with HiCache on CPU, with both of SGLang's tree cores (pure
Python and Rust), on every configuration of ``tests/oracle/hicache_driver.py``
(write_through, write_through_selective and write_back; pages 1, 2 and 4; lru, lfu,
fifo; load_back_threshold 1 and 10; small device and host pools; Full attention,
Full + Mamba, Full + SWA and Full + SWA + Mamba), compared after every op: return
values, slots on both tiers (KV, Mamba states, SWA KV) through bijections, the
transfers, sizes, the backup / load-back protocol state and the KV events.

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

import os
import sys

import pytest

from .suite import BACKENDS, ROOT, as_tuples, run_drivers, skip_reason, tail

pytestmark = pytest.mark.oracle   # python -m pytest -m "not oracle" leaves these out

OPS = int(os.environ.get("FLATRADIX_ORACLE_HICACHE_OPS", "2000"))
TOLERATE = os.environ.get("FLATRADIX_ORACLE_HICACHE_TOLERATE", "")
TIMEOUT_S = int(os.environ.get("FLATRADIX_ORACLE_TIMEOUT", "900"))

# Mirrors hicache_driver.CONFIGS / MUTANTS (the driver itself only imports in the
# oracle venv); test_config_lists_match checks the copies.
CONFIGS = ("p1-wt-lru", "p1-wt-lru-t10", "p4-wt-lru", "p2-wts-lru", "p2-wts-lru-t10",
           "p1-wt-lfu", "p4-wt-fifo", "p1-wb-lru", "p4-wb-lru", "p2-wb-lfu-t10",
           "p1-mamba-wt-lru", "p1-mamba-wts-lfu", "p1-mamba-wt-lru-t10", "p4-mamba-wt-fifo",
           "p1-mamba-wb-lru", "p4-mamba-wb-lfu", "p1-mamba-cap2-wt-lru", "p1-mamba-cap1-wb-lru",
           "p1-swa4-wt-lru", "p1-swa8-wts-lfu", "p4-swa8-wt-lru", "p2-swa5-wt-fifo-t10",
           "p1-swa4-wb-lru", "p4-swa8-wb-lfu", "p1-swa4-mamba-wt-lru", "p1-swa8-mamba-wts-lfu",
           "p1-swa4-mamba-wb-lru", "p4-swa8-mamba-wt-fifo")
MUTANTS = ("wt-threshold-off-by-one", "load-back-threshold-ignored", "backup-no-host-evict",
           "host-hit-zero", "one-ack-per-backup", "wb-no-reclaim", "wb-always-drop",
           "insert-host-as-write-back", "mamba-no-state-backup", "mamba-host-hit-zero",
           "mamba-no-request-state", "swa-host-hit-zero", "swa-backup-no-window",
           "swa-load-no-window", "swa-window-larger", "swa-host-evict-no-state-cascade",
           "prefetch-swa-short-window-kept", "prefetch-state-dropped",
           "mamba-cow-from-device-node")


@pytest.fixture(scope="module")
def hicache_runs(tmp_path_factory):
    """Run the driver for both SGLang cores in parallel; {(config, backend): result}."""
    reason = skip_reason("build it again: tests/oracle/README.md, The oracle venv")
    if reason:
        pytest.skip(reason)
    return run_drivers("tests.oracle.hicache_driver", "hicache oracle", OPS, 20,
                       tmp_path_factory.mktemp("hicache-oracle-repro"), TIMEOUT_S,
                       extra=("--tolerate", TOLERATE) if TOLERATE else ())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("config", CONFIGS)
def test_no_divergence(hicache_runs, config, backend):
    results, logs = hicache_runs
    res = results.get((config, backend))
    if res is None:
        pytest.fail(f"driver produced no result for {config}/{backend}; its output:\n"
                    + tail(logs[backend]))
    if res["divergences"]:
        rep = res.get("reproducer", {})
        pytest.fail(f"{config}/{backend}: flatradix diverges from SGLang's HiCache after "
                    f"{res['ops']} ops: {rep.get('detail', res.get('sig'))}\nshrunk reproducer "
                    f"({len(rep.get('ops', []))} ops; replay with `python -m "
                    f"tests.oracle.hicache_driver --replay {rep.get('path')}` in the oracle "
                    f"venv):\nops = {as_tuples(rep.get('ops'))!r}")
    assert res["ops"] == OPS


def test_self_test_catches_mutants(hicache_runs):
    """Deliberately wrong flatradix façades must diverge within the op budget (the
    comparisons have teeth): see hicache_driver.MUTANTS."""
    results, logs = hicache_runs
    st = results.get(("selftest", "rust"))
    if st is None:
        pytest.fail("driver produced no self-test result; its output:\n" + tail(logs["rust"]))
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
