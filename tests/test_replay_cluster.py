"""Sweeps on a cluster: the same points through joblib (its local process pool,
or a Dask distributed cluster of two workers started here) give the figures the
local process pool gives, for the capacity sweep and the fleet sweep."""

import importlib.util

import pytest

from flatradix.replay import synthetic_workload
from flatradix.replay.fleet_report import fleet_sweep
from flatradix.replay.sweep import sweep

pytestmark = pytest.mark.skipif(importlib.util.find_spec("joblib") is None,
                                reason="needs joblib: pip install 'flatradix[cluster]'")

TIMING = ("wall_s", "requests_per_s")


def _figures(curve):
    def strip(p):
        return None if p is None else {k: v for k, v in p.items() if k not in TIMING}
    out = dict(curve)
    for k in ("points", "unbounded"):
        v = curve[k]
        out[k] = [strip(p) for p in v] if isinstance(v, list) else strip(v)
    return out


W = synthetic_workload(200, seed=11)


@pytest.fixture(scope="module")
def pool_curves():
    return (sweep(W, [4_000, 16_000], policies=["lru", "lfu"], jobs=2, max_running=2),
            fleet_sweep(W, [8_000], instances=[2, 3], routers=["round-robin", "prefix-hash"],
                        policies=["lru", "opt"], jobs=2))


def test_loky_gives_the_process_pools_figures(pool_curves):
    a = sweep(W, [4_000, 16_000], policies=["lru", "lfu"], jobs=2, backend=("loky", None),
              max_running=2)
    assert _figures(a) == _figures(pool_curves[0])


@pytest.fixture(scope="module")
def dask_cluster():
    """A local Dask distributed cluster of two single-threaded worker processes:
    its scheduler's address."""
    if importlib.util.find_spec("distributed") is None:
        pytest.skip("needs dask.distributed: pip install 'flatradix[dask]'")
    from dask.distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster:
        assert len(cluster.workers) == 2
        yield cluster.scheduler_address


def test_a_dask_cluster_gives_the_process_pools_figures(pool_curves, dask_cluster):
    a = sweep(W, [4_000, 16_000], policies=["lru", "lfu"], jobs=2,
              backend=("dask", dask_cluster), max_running=2)
    f = fleet_sweep(W, [8_000], instances=[2, 3], routers=["round-robin", "prefix-hash"],
                    policies=["lru", "opt"], jobs=2, backend=("dask", dask_cluster))
    assert _figures(a) == _figures(pool_curves[0])
    assert _figures(f) == _figures(pool_curves[1])
    assert len(f["points"]) == 8 and len(f["unbounded"]) == 4


def test_ctrl_c_on_a_dask_sweep_returns_at_once(dask_cluster, monkeypatch):
    """The CLI on the cluster, a terminal's Ctrl-C (its process group) mid-sweep:
    exit status 130 (or 0 if it finished first), no traceback, within the
    command line's limit; the cluster's workers (not in that group) live on."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from .test_cli import ROOT
    from .test_cli_findings import EXIT_WITHIN_S

    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen([sys.executable, "-m", "flatradix", "replay", "--limit", "20000",
                          "--instances", "2", "--router", "round-robin", "--sweep",
                          "100k,200k,400k,800k", "--jobs", "2", "--backend",
                          f"dask:{dask_cluster}", "--no-progress"],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        time.sleep(6)
        t = time.monotonic()
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=60)
        took = time.monotonic() - t
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert "Traceback" not in err, err
    assert p.returncode in (130, 0), err
    assert took < EXIT_WITHIN_S, f"exited {took:.2f} s after SIGINT"
    from dask.distributed import Client

    with Client(dask_cluster) as c:
        assert len(c.scheduler_info()["workers"]) == 2


def test_dask_without_an_address_is_refused(monkeypatch):
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    if importlib.util.find_spec("distributed") is None:
        pytest.skip("needs dask.distributed")
    with pytest.raises(ValueError, match="DASK_SCHEDULER_ADDRESS"):
        sweep(W, [4_000], backend=("dask", None))
