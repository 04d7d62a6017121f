"""The device value arena (``flatradix/device.py``) against a numpy model, on CPU
torch tensors, on torch's ``meta`` device (no data: the dispatch counter proves no
host read), and with numpy standing in for cupy (its op set and its DLPack
conversions)."""

import numpy as np
import pytest
import torch

from flatradix import device as D
from tests.device_harness import SyncCounter


def _ref_runs(rows):
    out = []
    for r in rows.tolist():
        if out and out[-1][0] + out[-1][1] == r:
            out[-1][1] += 1
        else:
            out.append([r, 1])
    return out


@pytest.mark.parametrize("seed", range(20))
def test_runs_of_matches_a_hand_loop(seed):
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 50, size=int(rng.integers(1, 40)))
    if seed % 3 == 0:
        rows = np.arange(7, 7 + rows.shape[0])
    starts, lens = D.runs_of(rows.astype(np.int64))
    assert [[int(s), int(n)] for s, n in zip(starts, lens)] == _ref_runs(rows)


def _cupy():
    """cupy itself, where it can run (a CUDA device); else the test is skipped
    saying why (its op set runs on the CPU as ``numpy-as-cupy``)."""
    cp = pytest.importorskip("cupy", reason="cupy is not installed (it needs CUDA); its op "
                             "set runs on the CPU as numpy-as-cupy")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no device")
    except Exception as e:  # noqa: BLE001 -- any CUDA runtime failure means: no device
        pytest.skip(f"cupy is installed but no CUDA device answers ({e})")
    return cp


def _host(x):
    if isinstance(x, torch.Tensor):
        return np.asarray(x.cpu())
    return np.asarray(x.get() if hasattr(x, "get") else x)


def _arena_ops(kind):
    if kind == "torch-cpu":
        return D.TorchOps("cpu")
    if kind == "cupy":
        return D.CupyOps(xp=_cupy())
    return D.CupyOps(xp=np)   # numpy standing in for cupy


def _src(kind, a):
    """Host int64 ``a`` as a value of ``kind`` (a copy)."""
    if kind == "torch-cpu":
        return torch.from_numpy(a.copy())
    if kind == "cupy":
        return _cupy().asarray(a)
    return a.copy()


KINDS = ["torch-cpu", "numpy-as-cupy", "cupy"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", range(6))
def test_arena_follows_a_numpy_model(kind, seed):
    """Writes (runs and spans), gathers (one run, a few, many), growth and a
    compaction's remap, against a plain numpy array of the same rows."""
    rng = np.random.default_rng(seed)
    ops = _arena_ops(kind)
    cap = 64
    arena = D.DeviceArena(ops, cap)
    model = np.zeros(cap, dtype=np.int64)
    for _ in range(200):
        op = rng.integers(0, 6)
        if op == 0:   # a new leaf: one run
            n = int(rng.integers(1, 10))
            row = int(rng.integers(0, arena.capacity - n))
            src_np = rng.integers(0, 1 << 40, size=n + 3)
            src = _src(kind, src_np)
            arena.write(row, src, 2, n - 1 if n > 1 else 1)
            m = n - 1 if n > 1 else 1
            model[row:row + m] = src_np[2:2 + m]
        elif op == 1:  # claimed runs (few or many), distinct rows
            k = int(rng.integers(1, 9))
            rows = rng.choice(arena.capacity // 4, size=k, replace=False) * 4
            src_np = rng.integers(0, 1 << 40, size=4 * k)
            src = _src(kind, src_np)
            runs = np.array([[int(r), 4 * i, int(rng.integers(1, 5))] for i, r in enumerate(rows)],
                            dtype=np.int64)
            arena.write_runs(runs, src)
            for r, p, n in runs.tolist():
                model[r:r + n] = src_np[p:p + n]
        elif op == 2:  # a gather of arbitrary rows
            n = int(rng.integers(0, 30))
            if rng.integers(0, 2):
                start = int(rng.integers(0, arena.capacity - n))
                rows = np.arange(start, start + n, dtype=np.int64)
            else:
                rows = rng.integers(0, arena.capacity, size=n).astype(np.int64)
            got = arena.take(rows)
            assert _host(got).tolist() == model[rows].tolist()
        elif op == 3:  # a span
            n = int(rng.integers(0, 12))
            off = int(rng.integers(0, arena.capacity - n))
            got = arena.take_span(off, n)
            assert _host(got).tolist() == model[off:off + n].tolist()
        elif op == 4 and arena.capacity < 1024:  # growth
            new = arena.capacity * 2
            arena.ensure(new)
            model = np.concatenate([model, np.zeros(new - model.shape[0], dtype=np.int64)])
        elif op == 5:  # a compaction: rows [0, n) take the values of some old rows
            n = int(rng.integers(0, arena.capacity // 2))
            src_rows = rng.choice(arena.capacity, size=n, replace=False).astype(np.int64)
            grow = bool(rng.integers(0, 2)) and arena.capacity < 1024
            new_cap = arena.capacity * 2 if grow else arena.capacity
            moved = model[src_rows].copy()
            arena.remap(src_rows, new_cap)
            if grow:
                model = np.zeros(new_cap, dtype=np.int64)
            model[:n] = moved
        assert arena.capacity == model.shape[0]
    # rows that were not moved keep their value only when the compaction did not grow;
    # the model follows the same rule, so the whole arena agrees
    assert _host(arena.t).tolist() == model.tolist()


def test_gathers_are_copies_not_views():
    ops = D.TorchOps("cpu")
    arena = D.DeviceArena(ops, 16)
    arena.write(0, torch.arange(100, 116), 0, 16)
    got = [arena.take(np.arange(2, 6)), arena.take(np.array([1, 2, 9, 10])),
           arena.take(np.array([1, 3, 5, 7, 9, 11])), arena.take_span(4, 3)]
    before = [g.tolist() for g in got]
    arena.write(0, torch.zeros(16, dtype=torch.int64), 0, 16)
    assert [g.tolist() for g in got] == before


def test_meta_arena_runs_without_a_host_read():
    """Every arena operation on meta tensors: shapes right, zero syncing ops."""
    ops = D.TorchOps("meta")
    with SyncCounter() as sc:
        arena = D.DeviceArena(ops, 64)
        src = torch.empty(40, dtype=torch.int32, device="meta")
        arena.write(3, src, 5, 10)
        arena.write_runs(np.array([[0, 0, 2], [10, 2, 3]], dtype=np.int64), src)
        arena.write_runs(np.array([[i * 6, i, 2] for i in range(8)], dtype=np.int64), src)
        assert arena.take(np.arange(5, 15)).shape == (10,)
        assert arena.take(np.array([1, 2, 7, 8, 30])).shape == (5,)
        assert arena.take(np.array([1, 3, 5, 7, 9, 11, 13])).shape == (7,)
        assert arena.take(np.empty(0, dtype=np.int64)).shape == (0,)
        assert arena.take_span(4, 6).shape == (6,)
        arena.ensure(128)
        arena.remap(np.arange(20, 0, -1, dtype=np.int64), 256)
        assert arena.capacity == 256 and arena.t.device.type == "meta"
        checks = D.DeviceChecks(ops)
        for i in range(3 * D.DeviceChecks.ROWS):   # folds twice, on the device
            checks.record(src, 0, 100, f"call {i}")
    assert sc.syncs() == 0, sc.events
    assert sc.ops > 0


def test_meta_host_reads_are_counted_and_refused():
    """The counter sees what a careless path would do (and meta refuses it)."""
    t = torch.zeros(4, dtype=torch.int64, device="meta")
    with SyncCounter() as sc:
        for f in (lambda: t[0].item(), lambda: t.cpu(), lambda: t[t > 0],
                  lambda: torch.from_numpy(np.arange(3)).to("meta"), lambda: t.tolist()):
            try:
                f()
            except (RuntimeError, NotImplementedError):
                pass
    assert sc.counts["scalar"] >= 1 and sc.counts["d2h"] >= 1
    assert sc.counts["data_dependent"] >= 1 and sc.counts["h2d_pageable"] == 1


@pytest.mark.parametrize("kind", KINDS)
def test_device_checks_name_the_first_bad_call(kind):
    ops = _arena_ops(kind)
    checks = D.DeviceChecks(ops)

    def v(*xs):
        return _src(kind, np.array(xs, dtype=np.int64))

    checks.record(v(1, 2, 3), 0, 10, "insert #1")
    checks.surface()   # in range: nothing
    checks.record(v(4, 5), 0, 10, "insert #2")
    checks.record(v(9, 10), 0, 10, "insert #3")
    checks.record(v(-1), 0, 10, "insert #4")
    with pytest.raises(D.DeviceValueError, match=r"insert #3: a device value 10 lies outside"):
        checks.surface()
    checks.surface()   # cleared
    checks.record(v(0), 1, None, "state #1")
    with pytest.raises(D.DeviceValueError, match=r"state #1: a device value 0"):
        checks.surface()


@pytest.mark.parametrize("kind", KINDS)
def test_device_checks_fold_on_the_device_when_full(kind, monkeypatch):
    monkeypatch.setattr(D.DeviceChecks, "ROWS", 4)
    ops = _arena_ops(kind)
    checks = D.DeviceChecks(ops)

    def v(*xs):
        return _src(kind, np.array(xs, dtype=np.int64))

    for i in range(9):
        checks.record(v(i), 0, 100, f"insert #{i}")
    checks.record(v(7), 1, 8, "slot #1")
    checks.surface()
    for i in range(6):
        checks.record(v(50 + (60 if i == 1 else 0)), 0, 100, f"insert #{i}")
    checks.record(v(3), 0, 100, "insert #last")
    with pytest.raises(D.DeviceValueError, match=r"one of the calls insert #0 \.\. insert #3"):
        checks.surface()


def test_dlpack_conversions_share_memory_with_numpy_standing_in_for_cupy():
    """cupy's conversion path on the CPU: numpy arrays export and take DLPack as
    cupy arrays do, so ``to_torch`` / ``to_cupy(xp=numpy)`` run the same calls."""
    a = np.arange(6, dtype=np.int64)
    t = D.to_torch(a)
    assert isinstance(t, torch.Tensor) and t.device.type == "cpu"
    t[0] = 42
    assert a[0] == 42                       # zero-copy, numpy -> torch
    back = D.to_cupy(t, xp=np)
    back[1] = 43
    assert t[1].item() == 43 and a[1] == 43  # zero-copy, torch -> numpy
    assert D.to_cupy(a, xp=np) is a
    with pytest.raises(ValueError, match="on cpu given to a cache whose values live on meta"):
        D.to_torch(a, device="cpu") if False else D.to_torch(torch.zeros(1), device="meta")


def test_ops_accept_the_other_kind_and_refuse_bad_metadata():
    tops = D.TorchOps("cpu")
    x = tops.native(np.arange(3, dtype=np.int32), "value")   # a cupy-like value, zero-copy
    assert isinstance(x, torch.Tensor) and x.dtype == torch.int32
    with pytest.raises(TypeError, match="value must hold integers"):
        tops.native(torch.zeros(3), "value")
    with pytest.raises(ValueError, match="value must be 1-D"):
        tops.native(torch.zeros((2, 2), dtype=torch.int64), "value")
    with pytest.raises(ValueError, match="value is on meta"):
        tops.native(torch.zeros(2, dtype=torch.int64, device="meta"), "value")
    with pytest.raises(TypeError, match="value must be a torch tensor or cupy array"):
        tops.native([1, 2], "value")
    cops = D.CupyOps(xp=np)
    y = cops.native(torch.arange(4), "value")   # torch -> "cupy" through DLPack
    assert type(y) is np.ndarray and y.tolist() == [0, 1, 2, 3]
    with pytest.raises(TypeError, match="value must hold integers"):
        cops.native(np.zeros(3), "value")


def test_kind_helpers():
    assert D.kind_of(np.zeros(1)) == "numpy" and D.kind_of(torch.zeros(1)) == "torch"
    assert D.kind_of([1]) is None
    assert not D.on_device(torch.zeros(1)) and D.on_device(torch.zeros(1, device="meta"))
    assert not D.on_device(np.zeros(1))
    st = D.Staging("cpu")
    a = np.arange(5, dtype=np.int64)
    assert st.send(a).data_ptr() == a.ctypes.data   # CPU: no copy
    m = D.Staging("meta").send(a)
    assert m.device.type == "meta" and m.shape == (5,)
