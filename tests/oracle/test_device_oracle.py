"""flatradix's SGLang TreeCore with device values (issue 29), in the oracle venv.

* ``device_probe.py``: the TreeCore's calls on host values, on CPU tensors
  through the device value arena, and on torch's ``meta`` device inside a
  dispatch-mode counter: the same results, zero syncing ops.
* The oracle driver with ``--first sglang-flatradix`` and
  ``FLATRADIX_DEVICE_VALUES=1``: SGLang's controller over flatradix's TreeCore
  with its values in the arena, against SGLang's controller over its Python
  core, on every Full-attention configuration (the arena serves Full trees).

Skipped, saying why, without the venv (``tests/oracle/README.md``).
"""

import json
import os
import subprocess

import pytest

from .suite import ROOT, VENV, env, skip_reason

pytestmark = pytest.mark.oracle

FULL_CONFIGS = ("p1-lru", "p16-lru", "p64-lru", "p1-lfu", "p16-fifo", "p1-mru", "p16-filo",
                "p64-priority", "p16-slru", "p1-tlru", "p64-tlru", "p1-eagle-lru",
                "p16-eagle-lfu")
OPS = int(os.environ.get("FLATRADIX_DEVICE_ORACLE_OPS", "1500"))


@pytest.fixture(scope="module")
def venv():
    reason = skip_reason(f"`{VENV / 'bin' / 'pip'} install numba msgspec`")
    if reason:
        pytest.skip(reason)
    return str(VENV / "bin" / "python")


def test_tree_core_on_meta_values_syncs_nowhere_and_matches_host_values(venv):
    r = subprocess.run([venv, "-m", "tests.oracle.device_probe", "--steps", "300",
                        "--seeds", "3"], cwd=ROOT, env=env(), capture_output=True, text=True,
                       timeout=1500)
    line = [x for x in r.stdout.splitlines() if x.startswith("DEVICE_PROBE ")]
    assert line, (r.stdout + r.stderr)[-3000:]
    report = json.loads(line[-1].split(" ", 1)[1])
    assert report["differences"] == [] and r.returncode == 0, report
    assert report["syncs"] == 0 and report["meta_ops"] > 1000
    assert report["calls_checked"] >= 900


def test_sglang_controller_over_the_arena_matches_sglang(venv):
    e = env()
    e["FLATRADIX_DEVICE_VALUES"] = "1"
    r = subprocess.run([venv, "-m", "tests.oracle.driver", "--config", ",".join(FULL_CONFIGS),
                        "--backend", "python", "--ops", str(OPS), "--first", "sglang-flatradix",
                        "--shrink-seconds", "60"],
                       cwd=ROOT, env=e, capture_output=True, text=True, timeout=3000)
    results = [json.loads(x.split(" ", 1)[1]) for x in r.stdout.splitlines()
               if x.startswith("ORACLE_RESULT ")]
    assert len(results) == len(FULL_CONFIGS), (r.stdout + r.stderr)[-3000:]
    bad = [(x["config"], x.get("detail")) for x in results if x["divergences"]]
    assert not bad, bad
    assert all(x["ops"] >= OPS for x in results)
