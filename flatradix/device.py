"""Values on the caller's device: the device value arena (issue 29).

The tree never reads a KV index, it only moves them. On a device (CUDA, or any
non-CPU torch device; cupy arrays), the indices stay there: the engine's pool
keeps, in its ``FULL_DEV`` column, not the KV index of a row but the row itself
(``pool[r, FULL_DEV] == r``), and a ``DeviceArena`` -- one int64 tensor of the
pool's length on the caller's device -- holds the KV index of row ``r`` at
``arena[r]``. Every kernel output that copies Full device values (a match's
indices, an eviction's freed slots, a path) therefore yields *rows*, and the
values are one device gather away; every kernel write of an input value (a new
leaf, an "unevicted" host-only node, an SWA tombstone's recovery, a load-back)
writes a *tag* (``TAG + position in the input``) that the caller claims right
after the call (``core/devvals.claim_values``): the tagged rows are set back
to themselves and the input's device values are copied into those arena rows.

Operations and their cost on the device (no host wait anywhere):

* insert: one device-to-device copy per claimed run of rows (one, for a new
  leaf);
* match: one gather (``DeviceArena.take``): a contiguous run of rows is one
  slice copy, a few runs one concatenation of slices, more runs one
  ``index_select`` whose row positions go up through a pinned staging buffer
  with a non-blocking copy (``Staging``: a ring of pinned buffers, each reused
  only once the CUDA event recorded after its copy has completed -- a buffer
  still in flight is never rewritten; no wait: when every buffer is busy the
  ring grows);
* eviction: the same gather of the victims' rows, handed to the allocator;
* growth and compaction of the pool: one gather of the moved rows into the
  (new or same) arena, rows ``[0, top)`` (``DeviceArena.remap``).

Kinds: torch tensors (``TorchOps``) and cupy arrays (``CupyOps``), each handled
natively (results in the caller's kind, no conversion on the hot path); a value
of the other kind is taken zero-copy (``__cuda_array_interface__``, else
DLPack; ``to_kind``). torch and cupy are optional imports.

Checks without syncs (``docs/device_values.md``): shape, dtype and device are
host metadata and are checked before any change, as on the CPU. The value
checks that need the indices themselves run on the device
(``DeviceChecks``: the range of every inserted KV index and state slot, kept as
a running min / max on the device) and surface at the next sync point the
caller chooses (``UnifiedRadixCache.check_device_values()``, also run by
``sanity_check()``): ``DeviceValueError`` naming the first call whose values
were out of range. ``debug_checks=True`` moves every value to the host first
and runs the CPU path's checks instead (held slots, duplicates, range),
refusing bad input before any change -- a host sync per call, for tests and
debugging.
"""

import numpy as np

#: Kernel input tags: an input value's position ``i`` is written as ``TAG + i``
#: (pool rows and positions stay below 2^40, ``docs/architecture.md`` limits).
TAG = 1 << 48
#: ``DeviceArena.take``: at most this many runs of rows are gathered as a
#: concatenation of slices (measured on an H200: ``torch.cat`` of 10 slices 44
#: µs, a staged ``index_select`` 34-38 µs; ``../shared/spec/architecture.md``).
CAT_MAX = 4
#: Pinned staging buffers kept per device (the ring grows to this many only
#: when every buffer is still in flight; beyond it the oldest is waited for).
RING_MAX = 64
#: Smallest pinned staging buffer, in int64 entries.
STAGE_MIN = 4096

_EMPTY = np.empty(0, dtype=np.int64)


# ---------------------------------------------------------------- kinds
def _mod(x):
    return type(x).__module__


def is_torch(x):
    return _mod(x).startswith("torch")


def is_cupy(x):
    return _mod(x).startswith("cupy")


def kind_of(x):
    """``"torch"``, ``"cupy"``, ``"numpy"`` or None (anything else: a list...)."""
    if type(x) is np.ndarray:
        return "numpy"
    if is_torch(x):
        return "torch"
    if is_cupy(x):
        return "cupy"
    return None


def on_device(x):
    """Whether ``x`` is a device value: a torch tensor not on the CPU, or a cupy array."""
    if is_torch(x):
        return x.device.type != "cpu"
    return is_cupy(x)


def _torch():
    import torch

    return torch


def to_torch(x, device=None):
    """``x`` (a cupy array, or anything exporting ``__cuda_array_interface__`` or
    ``__dlpack__``) as a torch tensor sharing its memory (no copy).
    ``__cuda_array_interface__`` first (6 µs on an H200, DLPack 10 µs;
    ``../shared/spec/numba_and_interop.md`` 2.2). ``device``: the torch device
    the result must be on (a ``ValueError`` when it is not)."""
    torch = _torch()
    if is_torch(x):
        t = x
    elif hasattr(x, "__cuda_array_interface__") and device is not None:
        t = torch.as_tensor(x, device=device)
    else:
        t = torch.from_dlpack(x)
    if device is not None and t.device != torch.device(device):
        raise ValueError(f"a value on {t.device} given to a cache whose values live on {device}")
    return t


def to_cupy(x, xp=None):
    """``x`` (a torch tensor, or anything exporting ``__cuda_array_interface__`` or
    ``__dlpack__``) as an array of the cupy-like module ``xp`` (default cupy)
    sharing its memory. ``xp`` is a parameter so that the conversion path runs on
    the CPU with numpy standing in for cupy (both take DLPack)."""
    if xp is None:
        import cupy as xp
    if type(x) is getattr(xp, "ndarray", None):
        return x
    if hasattr(x, "__cuda_array_interface__") and hasattr(xp, "asarray") and xp.__name__ == "cupy":
        return xp.asarray(x)   # 12 µs against 28 for from_dlpack (H200)
    return xp.from_dlpack(x)


# ---------------------------------------------------------------- staging
class Staging:
    """Host int64 arrays up to a torch device, without waiting for the device.

    On CUDA: a ring of pinned host buffers; ``send(a)`` copies ``a`` into a free
    buffer, starts a non-blocking copy to a fresh device tensor on the current
    stream and records a CUDA event after it. A buffer is reused only once its
    event has completed (``Event.query()``, which never blocks): the copy cannot
    read a buffer rewritten under it. When every buffer is in flight a new one is
    pinned (up to ``RING_MAX``; then the oldest is waited for, the one wait this
    class can make, counted in ``waits``). A pageable copy is never made: behind
    a busy GPU one took 28 ms of CPU (``../shared/spec/architecture.md``).

    On another device: CPU, ``torch.from_numpy`` (no copy; the caller uses the
    result before it rewrites ``a``); ``meta``, an empty meta tensor of the
    length (no data exists there); any other device, ``.to(device)``.
    """

    def __init__(self, device):
        torch = _torch()
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self._ring = []   # [pinned tensor, its numpy view, event or None]
        self._next = 0
        self.waits = 0
        self.pinned = 0

    def send(self, a):
        """``a`` (int64 numpy, 1-D) as an int64 tensor on the device."""
        torch = _torch()
        n = a.shape[0]
        if not self.cuda:
            if self.device.type == "cpu":
                return torch.from_numpy(a)
            if self.device.type == "meta":
                return torch.empty(n, dtype=torch.int64, device="meta")
            return torch.from_numpy(np.ascontiguousarray(a)).to(self.device)
        slot = self._free_slot(n)
        pinned, view, _ = slot
        view[:n] = a
        out = torch.empty(n, dtype=torch.int64, device=self.device)
        out.copy_(pinned[:n], non_blocking=True)
        ev = slot[2]
        if ev is None:
            ev = slot[2] = torch.cuda.Event()
        ev.record()
        return out

    def _free_slot(self, n):
        torch = _torch()
        ring = self._ring
        k = len(ring)
        for i in range(k):
            j = (self._next + i) % k
            slot = ring[j]
            if slot[1].shape[0] >= n and (slot[2] is None or slot[2].query()):
                self._next = (j + 1) % k
                return slot
        size = STAGE_MIN
        while size < n:
            size *= 2
        if k < RING_MAX:
            pinned = torch.empty(size, dtype=torch.int64, pin_memory=True)
            self.pinned += 1
            slot = [pinned, pinned.numpy(), None]
            ring.append(slot)
            return slot
        # every buffer in flight: wait for the oldest (a host wait, counted)
        j = self._next % k
        slot = ring[j]
        if slot[2] is not None:
            slot[2].synchronize()
            self.waits += 1
        if slot[1].shape[0] < n:
            pinned = torch.empty(size, dtype=torch.int64, pin_memory=True)
            slot[0], slot[1] = pinned, pinned.numpy()
        self._next = (j + 1) % k
        return slot


# ---------------------------------------------------------------- ops
class TorchOps:
    """The arena's operations on a torch device (int64 tensors)."""

    kind = "torch"

    def __init__(self, device):
        torch = _torch()
        self.torch = torch
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.staging = Staging(self.device)
        self.i64 = torch.int64

    def accepts(self, x):
        return is_torch(x) and x.device == self.device

    def native(self, x, name):
        """``x`` (torch on this device, or a cupy / DLPack value there) as a 1-D
        integer tensor of this kind, without a copy (``TypeError`` /
        ``ValueError`` naming ``name``: host metadata only)."""
        torch = self.torch
        if not is_torch(x):
            try:
                x = to_torch(x, self.device)
            except (TypeError, AttributeError, RuntimeError, BufferError) as e:
                raise TypeError(f"{name} must be a torch tensor or cupy array on "
                                f"{self.device}, got {type(x).__name__} ({e})") from None
        elif x.device != self.device:
            raise ValueError(f"{name} is on {x.device}, the cache's values live on "
                             f"{self.device}")
        if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            raise TypeError(f"{name} must hold integers, got torch dtype {x.dtype}")
        if x.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(x.shape)}")
        return x.detach()

    def zeros(self, n):
        return self.torch.zeros(n, dtype=self.i64, device=self.device)

    def empty(self, n):
        return self.torch.empty(n, dtype=self.i64, device=self.device)

    def int64(self, x):
        return x if x.dtype == self.i64 else x.to(self.i64)

    def copy(self, dst, src):
        dst.copy_(src)

    def clone(self, x):
        return x.clone() if x.dtype == self.i64 else x.to(self.i64)

    def cat(self, parts):
        return self.torch.cat(parts)

    def take(self, t, idx):
        return t.index_select(0, idx)

    def put(self, t, idx, src):
        t.index_copy_(0, idx, self.int64(src))

    def send(self, a):
        return self.staging.send(a)

    def aminmax(self, x, out):
        """``out[0], out[1] = min(x), max(x)`` on the device (``x`` non-empty)."""
        self.torch.aminmax(x, out=(out[0], out[1]))

    def to_caller(self, t, kind):
        return t if kind == "torch" else to_cupy(t)


class CupyOps:
    """The arena's operations on a cupy device (int64 arrays). ``xp`` is the
    cupy module, or numpy standing in for it on the CPU (tests)."""

    kind = "cupy"

    def __init__(self, xp=None):
        if xp is None:
            import cupy as xp
        self.xp = xp
        self.device = getattr(xp.cuda, "Device", lambda: "cpu")() if hasattr(xp, "cuda") else "cpu"
        self._pinned = None
        self.i64 = xp.int64

    def accepts(self, x):
        return type(x) is self.xp.ndarray

    def native(self, x, name):
        xp = self.xp
        if type(x) is not xp.ndarray:
            try:
                x = to_cupy(x, xp)
            except (TypeError, AttributeError, RuntimeError, BufferError) as e:
                raise TypeError(f"{name} must be a cupy array or torch tensor on the cache's "
                                f"device, got {type(x).__name__} ({e})") from None
        if x.dtype.kind not in "iu":
            raise TypeError(f"{name} must hold integers, got dtype {x.dtype}")
        if x.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(x.shape)}")
        return x

    def zeros(self, n):
        return self.xp.zeros(n, dtype=self.i64)

    def empty(self, n):
        return self.xp.empty(n, dtype=self.i64)

    def int64(self, x):
        return x if x.dtype == self.i64 else x.astype(self.i64)

    def copy(self, dst, src):
        dst[...] = src

    def clone(self, x):
        return x.astype(self.i64, copy=True)

    def cat(self, parts):
        return self.xp.concatenate(parts)

    def take(self, t, idx):
        return self.xp.take(t, idx, axis=0)

    def put(self, t, idx, src):
        t[idx] = src

    def send(self, a):
        """Host int64 ``a`` up to the device: cupy through a ring of pinned buffers
        (each reused once the event recorded after its copy is done, as
        ``Staging``) and an asynchronous ``set`` on the current stream; the numpy
        stand-in copies."""
        xp = self.xp
        if xp.__name__ != "cupy":
            return xp.array(a, dtype=self.i64)
        import cupyx

        n = a.shape[0]
        if self._pinned is None:
            self._pinned = []   # [pinned numpy buffer, event or None]
        slot = None
        for s in self._pinned:
            if s[0].shape[0] >= n and (s[1] is None or s[1].done):
                slot = s
                break
        if slot is None:
            size = STAGE_MIN
            while size < n:
                size *= 2
            if len(self._pinned) >= RING_MAX:   # every buffer in flight: wait for one
                slot = self._pinned.pop(0)
                if slot[1] is not None:
                    slot[1].synchronize()
                if slot[0].shape[0] < n:
                    slot[0] = cupyx.empty_pinned((size,), dtype=np.int64)
            else:
                slot = [cupyx.empty_pinned((size,), dtype=np.int64), None]
            self._pinned.append(slot)
        buf = slot[0]
        buf[:n] = a
        out = xp.empty(n, dtype=self.i64)
        stream = xp.cuda.get_current_stream()
        out.set(buf[:n], stream=stream)
        slot[1] = xp.cuda.Event()
        slot[1].record(stream)
        return out

    def aminmax(self, x, out):
        out[0] = x.min()
        out[1] = x.max()

    def to_caller(self, t, kind):
        return t if kind == "cupy" else to_torch(t)


def ops_for(value):
    """The op set for a device value's kind and device."""
    if is_torch(value):
        return TorchOps(value.device)
    if is_cupy(value):
        return CupyOps()
    raise TypeError(f"not a device value: {type(value).__name__}")


# ---------------------------------------------------------------- runs
def runs_of(rows):
    """``(starts, lengths)`` of the maximal runs of consecutive values in ``rows``
    (int64 1-D numpy, non-empty)."""
    if rows.shape[0] == 1:
        return rows[:1], np.ones(1, dtype=np.int64)
    brk = np.flatnonzero(np.diff(rows) != 1)
    starts_at = np.empty(brk.shape[0] + 1, dtype=np.int64)
    starts_at[0] = 0
    starts_at[1:] = brk + 1
    ends_at = np.empty_like(starts_at)
    ends_at[:-1] = starts_at[1:]
    ends_at[-1] = rows.shape[0]
    return rows[starts_at], ends_at - starts_at


# ---------------------------------------------------------------- the arena
class DeviceArena:
    """The KV indices of the pool's rows, on the caller's device.

    ``t``: int64 device array of ``capacity`` rows (``ops`` kind); row ``r``
    mirrors the engine pool's row ``r``. Never read on the host.
    """

    def __init__(self, ops, capacity):
        self.ops = ops
        self.t = ops.zeros(int(capacity))
        self.gathers = self.copies = 0   # counters for tests and benchmarks

    @property
    def capacity(self):
        return int(self.t.shape[0])

    def ensure(self, capacity):
        """Grow to at least ``capacity`` rows (rows kept; new rows zero)."""
        cap = self.capacity
        if capacity <= cap:
            return
        t = self.ops.zeros(int(capacity))
        self.ops.copy(t[:cap], self.t)
        self.t = t

    def write(self, row, src, pos, n):
        """``arena[row:row + n] = src[pos:pos + n]`` (one device copy)."""
        self.ops.copy(self.t[row:row + n], src[pos:pos + n])
        self.copies += 1

    def write_runs(self, runs, src):
        """Copy input values into their claimed rows: ``runs`` int64 ``(k, 3)``
        numpy ``(row, pos, n)``; ``src`` the input's device array. One copy per
        run up to ``CAT_MAX`` runs, else one scatter of staged positions."""
        k = runs.shape[0]
        if k == 0:
            return
        if k <= CAT_MAX:
            for row, pos, n in runs.tolist():
                self.write(row, src, pos, n)
            return
        rows = np.concatenate([np.arange(r, r + n, dtype=np.int64) for r, _, n in runs.tolist()])
        pos = np.concatenate([np.arange(p, p + n, dtype=np.int64) for _, p, n in runs.tolist()])
        ops = self.ops
        ops.put(self.t, ops.send(rows), ops.take(ops.int64(src), ops.send(pos)))
        self.copies += 1

    def take(self, rows):
        """The values of pool rows ``rows`` (int64 1-D numpy) as a new device
        array (never a view of the arena: its rows are reused once freed)."""
        n = rows.shape[0]
        ops = self.ops
        self.gathers += 1
        if n == 0:
            return ops.empty(0)
        first = int(rows[0])
        if int(rows[-1]) - first == n - 1 and (n < 3 or _contiguous(rows)):
            return ops.clone(self.t[first:first + n])
        starts, lens = runs_of(rows)
        if starts.shape[0] <= CAT_MAX:
            return ops.cat([self.t[s:s + m] for s, m in zip(starts.tolist(), lens.tolist())])
        return ops.take(self.t, ops.send(rows))

    def take_span(self, off, n):
        """The values of the pool rows ``[off, off + n)`` as a new device array."""
        self.gathers += 1
        return self.ops.clone(self.t[off:off + n])

    def remap(self, src_rows, capacity):
        """After the pool moved its rows (compaction, growth): row ``i`` of the
        new layout takes the value of old row ``src_rows[i]`` (int64 numpy, the
        pool's ``FULL_DEV`` column of rows ``[0, top)`` before it is set back to
        the rows themselves), and the arena holds ``capacity`` rows. One staged
        gather."""
        ops = self.ops
        n = src_rows.shape[0]
        moved = ops.take(self.t, ops.send(src_rows)) if n else None
        if capacity > self.capacity:
            self.t = ops.zeros(int(capacity))
        if n:
            ops.copy(self.t[:n], moved)
        self.gathers += 1


def _contiguous(rows):
    d = np.diff(rows)
    return bool((d == 1).all())


# ---------------------------------------------------------------- checks
class DeviceValueError(ValueError):
    """A device value failed a check that ran on the device (a KV index or state
    slot out of range), raised at the next sync point
    (``UnifiedRadixCache.check_device_values()``). The call that passed it has
    already been executed: the cache holds the bad value until ``reset()``."""


class DeviceChecks:
    """Range checks of device values without a host read.

    Each checked call writes its values' min and max into the next row of a
    device ring (one ``aminmax`` launch) and its description and bounds into a
    host list; ``surface()`` (a sync point) reads the ring (one device-to-host
    copy) and raises ``DeviceValueError`` naming the first call out of its
    bounds. When the ring is full its rows are folded, on the device, into one
    running (min, max) per distinct bounds (no host read); a failure found
    there names the range of calls folded.
    """

    ROWS = 256

    def __init__(self, ops):
        self.ops = ops
        self.mm = ops.zeros(2 * self.ROWS).reshape(self.ROWS, 2)
        self.what = []     # host: (description, lo, hi) per written row
        self.folded = {}   # (lo, hi) -> [device (2,) min/max, first call, last call]
        self.checked = 0

    def record(self, values, lo, hi, what):
        """Check later that ``lo <= values < hi`` (``hi`` None: no upper bound)."""
        if values.shape[0] == 0:
            return
        if len(self.what) == self.ROWS:
            self._fold()
        self.ops.aminmax(self.ops.int64(values), self.mm[len(self.what)])
        self.what.append((what, lo, hi))
        self.checked += 1

    def _fold(self):
        ops = self.ops
        groups = {}
        for i, (desc, lo, hi) in enumerate(self.what):
            groups.setdefault((lo, hi), []).append((i, desc))
        for bounds, items in groups.items():
            idx = np.array([i for i, _ in items], dtype=np.int64)
            blk = ops.take(self.mm, ops.send(idx))
            red = ops.cat([blk[:, 0].min().reshape(1), blk[:, 1].max().reshape(1)])
            f = self.folded.get(bounds)
            if f is None:
                self.folded[bounds] = [red, items[0][1], items[-1][1]]
            else:
                both = ops.cat([f[0].reshape(1, 2), red.reshape(1, 2)])
                f[0] = ops.cat([both[:, 0].min().reshape(1), both[:, 1].max().reshape(1)])
                f[2] = items[-1][1]
        self.what = []

    def surface(self):
        """The sync point: read what was recorded since the last call (one
        device-to-host copy) and raise ``DeviceValueError`` for the first call
        out of range; the records are cleared either way."""
        if not self.what and not self.folded:
            return
        ops = self.ops
        n = len(self.what)
        parts = [self.mm[:n]] + [f[0].reshape(1, 2) for f in self.folded.values()]
        both = ops.cat(parts)
        host = np.asarray(both.cpu() if ops.kind == "torch" else
                          (both.get() if hasattr(both, "get") else both), dtype=np.int64)
        named = [(desc, lo, hi) for desc, lo, hi in self.what] + [
            (f"one of the calls {f[1]} .. {f[2]}", lo, hi)
            for (lo, hi), f in self.folded.items()]
        self.what = []
        self.folded = {}
        for (desc, lo, hi), (mn, mx) in zip(named, host.tolist()):
            if mn < lo or (hi is not None and mx >= hi):
                bad = mn if mn < lo else mx
                raise DeviceValueError(
                    f"{desc}: a device value {bad} lies outside [{lo}, "
                    f"{'inf' if hi is None else hi}) (checked on the device; the call was "
                    "executed: reset() the cache, or use debug_checks=True to refuse such "
                    "input before any change)")


# ---------------------------------------------------------------- device pools
class DeviceKVAllocator:
    """A page-1 KV slot allocator on a torch device that never reads its slots
    (as SGLang's ``TokenToKVPoolAllocator`` at page size 1): the free list is a
    device tensor, ``alloc(n)`` slices it (None when fewer than ``n`` are free:
    the count is host metadata), ``free(t)`` concatenates. Slots ``1..size``
    (slot 0 is SGLang's padding slot). Works on ``meta`` (no data), CPU and
    CUDA."""

    page_size = 1

    def __init__(self, size, device):
        self.size = int(size)
        self.device = _torch().device(device)
        self.freed = 0
        self.clear()

    def clear(self):
        self.free_slots = _torch().arange(1, self.size + 1, dtype=_torch().int64, device=self.device)
        self.n_free = self.size

    def available_size(self):
        return self.n_free

    def alloc(self, need_size):
        if need_size > self.n_free:
            return None
        out = self.free_slots[:need_size]
        self.free_slots = self.free_slots[need_size:]
        self.n_free -= need_size
        return out

    def free(self, free_index):
        if free_index.numel() == 0:
            return
        assert free_index.device == self.device, (free_index.device, self.device)
        self.free_slots = _torch().cat((self.free_slots, free_index.to(_torch().int64)))
        self.n_free += free_index.numel()
        self.freed += free_index.numel()


class DeviceReqToTokenPool:
    """SGLang's request -> token table with ``req_to_token`` on a torch device
    (int32, as SGLang's); rows are handed out on the host."""

    def __init__(self, size, max_context_len, device):
        self.size = size
        self.device = _torch().device(device)
        self.req_to_token = _torch().zeros((size, max_context_len), dtype=_torch().int32,
                                        device=self.device)
        self.free_rows = list(range(size))

    def available_size(self):
        return len(self.free_rows)

    def alloc(self, need_size=1):
        if need_size > len(self.free_rows):
            return None
        out, self.free_rows = self.free_rows[:need_size], self.free_rows[need_size:]
        return out

    def free(self, free_index):
        self.free_rows.append(int(free_index))


# ---------------------------------------------------------------- the cache's side
class DeviceValues:
    """One cache's device values: the arena, the input tags, the claims, the
    checks (the engine side of ``flatradix.values.ValueBridge`` when the arena
    is on; ``docs/device_values.md``).

    ``ops``: the op set (its kind -- torch / cupy -- is what results come back
    in); ``debug``: ``debug_checks`` (every value checked on the host before any
    change: a sync per call).
    """

    def __init__(self, ops, debug=False):
        self.ops = ops
        self.kind = ops.kind
        self.device = ops.device
        self.debug = bool(debug)
        self.arena = None
        self.checks = DeviceChecks(ops)
        self._tags = np.empty(0, dtype=np.int64)
        self._runs = np.zeros((8, 3), dtype=np.int64)
        self._empty = ops.empty(0)
        self.calls = 0   # checked calls, for the checks' descriptions

    # ------------------------------------------------------------------ engine
    def bind(self, eng):
        """Mirror ``eng``'s pool: an arena of its rows, following its moves."""
        self.arena = DeviceArena(self.ops, eng.st.pool.shape[0])
        eng.on_pool_moved = self.pool_moved
        # rows the pool holds already (a cache made device-valued before its first
        # value has none with device data; the column is made self-referencing)
        from .kernels.layout import FULL_DEV, M_POOL_TOP

        top = int(eng.st.meta[M_POOL_TOP])
        eng.st.pool[:top, FULL_DEV] = np.arange(top, dtype=np.int64)

    def pool_moved(self, eng):
        """``Engine.on_pool_moved``: the rows ``[0, top)`` were compacted (in place or
        into a larger pool); their ``FULL_DEV`` column still names the old rows.
        One staged gather moves the arena's values the same way, then the column
        is set back to the rows themselves."""
        from .kernels.layout import FULL_DEV, M_POOL_TOP

        pool = eng.st.pool
        top = int(eng.st.meta[M_POOL_TOP])
        src = pool[:top, FULL_DEV].copy()
        if top and not (0 <= src.min() and src.max() < self.arena.capacity):
            raise AssertionError("device values: a pool row names no arena row "
                                 f"({int(src.min())} .. {int(src.max())} of "
                                 f"{self.arena.capacity})")
        self.arena.remap(src, pool.shape[0])
        pool[:top, FULL_DEV] = np.arange(top, dtype=np.int64)

    def tags(self, n):
        """``TAG + arange(n)``: the host value array a kernel is given for an input
        of ``n`` device values (a view of a kept buffer)."""
        if self._tags.shape[0] < n:
            self._tags = TAG + np.arange(max(n, 2 * self._tags.shape[0], 1024), dtype=np.int64)
        return self._tags[:n]

    def claim(self, eng, slot):
        """Run ``claim_values`` from ``slot`` (the call's deepest written node):
        the tagged rows on its path go back to themselves; returns their runs
        ``(row, input position, length)`` (a view, valid until the next claim)."""
        k = eng.k.claim_values(slot, self._runs)
        if k < 0:
            self._runs = np.zeros((max(-k, 2 * self._runs.shape[0]), 3), dtype=np.int64)
            k = eng.k.claim_values(slot, self._runs)
        return self._runs[:k]

    # ------------------------------------------------------------------ values
    def native(self, x, name):
        """A caller's device value (torch or cupy, any integer dtype) as a 1-D array
        of the arena's kind, no copy; metadata checked (``TypeError`` /
        ``ValueError`` naming ``name``)."""
        return self.ops.native(x, name)

    def host_copy(self, x):
        """``debug_checks`` only: ``x`` as an int64 numpy copy (a device -> host sync)."""
        if self.kind == "torch":
            return x.detach().to("cpu").numpy().astype(np.int64)
        return np.asarray(x.get() if hasattr(x, "get") else x, dtype=np.int64)

    def write(self, runs, src):
        """Copy ``src`` (the call's device input) into its claimed rows."""
        if runs.shape[0]:
            self.arena.write_runs(runs, src)

    def take(self, rows):
        """The device values of pool rows ``rows`` (int64 numpy): a new array."""
        return self.arena.take(rows)

    def resolve(self, path, src):
        """The device values of a path the kernel wrote (``path``: int64 numpy, pool
        rows, or tags ``TAG + i`` where the call took its input's value ``i``,
        which is ``src[i]``): one gather when there is no tag, else slices of
        the arena and of ``src`` concatenated in order."""
        n = path.shape[0]
        tagged = path >= TAG
        if not tagged.any():
            return self.arena.take(path)
        ops = self.ops
        parts = []
        cut = np.flatnonzero(np.diff(tagged.view(np.int8))) + 1
        bounds = [0] + cut.tolist() + [n]
        for a, b in zip(bounds[:-1], bounds[1:]):
            if tagged[a]:
                i = int(path[a] - TAG)
                parts.append(ops.clone(src[i:i + (b - a)]))
            else:
                parts.append(self.arena.take(path[a:b]))
        return parts[0] if len(parts) == 1 else ops.cat(parts)

    def empty(self):
        return self.ops.empty(0)

    def cat(self, parts):
        """Concatenation of device arrays (a new array; empty when none)."""
        if not parts:
            return self.ops.empty(0)
        if len(parts) == 1:
            return parts[0]
        return self.ops.cat(parts)

    def record(self, values, lo, hi, what):
        """Range-check ``values`` on the device (``DeviceChecks``)."""
        self.calls += 1
        self.checks.record(values, lo, hi, f"{what} (checked call #{self.calls})")

    def record_none_equal(self, a, b, what):
        """Check on the device that no entry of ``a`` equals the entry of ``b`` at
        its position (the request path's slots it would free while the tree holds
        them)."""
        if a.shape[0] == 0:
            return
        self.calls += 1
        eq = (a == b)
        flag = eq.to(self.ops.i64) if self.kind == "torch" else eq.astype(self.ops.i64)
        self.checks.record(flag, 0, 1, f"{what} (checked call #{self.calls}): a slot the tree "
                           "holds at that position would be freed as a duplicate")
