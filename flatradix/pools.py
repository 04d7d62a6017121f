"""CPU KV-slot allocator and request -> token table, on flat arrays.

``TokenToKVPoolAllocator`` keeps its free slots as an int64 stack: ``alloc``
and ``free`` cost O(slots moved), never O(pool) (SGLang's ``free`` concatenates
onto its free list tensor, ~46 µs a call). A free-mask catches double frees
and foreign slots before anything changes.
"""

import numpy as np

from . import _numba_env  # noqa: F401  (cache directory, before the kernels)
from ._cast import as_int64, as_count, is_torch
from .kernels.slots import E_DOUBLE as _S_DOUBLE
from .kernels.slots import E_RANGE as _S_RANGE
from .kernels.slots import E_REPEATED as _S_REPEATED
from .kernels.slots import slots_alloc as _k_alloc
from .kernels.slots import slots_free as _k_free


def _torch():
    import torch

    return torch


class TokenToKVPoolAllocator:
    """KV-cache slot allocator. Slot 0 is reserved (padding), as in SGLang, so the
    usable slots are ``1 .. size``.

    Parameters
    ----------
    size : int
        Usable slots.
    page_size : int
        Recorded for schedulers that read it; allocation is per slot.
    index_kind : {"numpy", "torch"}
        Array type ``alloc`` returns (int64, 1-D, on the CPU).
    """

    def __init__(self, size, page_size=1, index_kind="numpy", device="cpu"):
        self.size = as_count(size, "size")
        self.page_size = as_count(page_size, "page_size")
        if self.page_size < 1:
            raise ValueError("page_size must be >= 1")
        if index_kind not in ("numpy", "torch"):
            raise ValueError(f"index_kind must be 'numpy' or 'torch', got {index_kind!r}")
        if device != "cpu":
            raise ValueError(f"device: only 'cpu' is supported by this allocator, got {device!r}")
        self.index_kind = index_kind
        self.device = device
        self.clear()

    def clear(self):
        """Every slot free again."""
        # Stack of free slots; the top is the end. Lowest slots are handed out first.
        self._stack = np.arange(self.size, 0, -1, dtype=np.int64)
        self._top = self.size
        # _mark[s] == 1 <=> slot s is free (slot 0 never is).
        self._mark = np.ones(self.size + 1, dtype=np.uint8)
        self._mark[0] = 0

    def available_size(self):
        """Free slots."""
        return self._top

    def _out(self, a):
        return _torch().from_numpy(a) if self.index_kind == "torch" else a

    def alloc(self, need_size):
        """``need_size`` free slots (int64, 1-D), or ``None`` when fewer are free.
        O(need_size)."""
        n = as_count(need_size, "need_size")
        if n > self._top:
            return None
        idx = np.empty(n, dtype=np.int64)
        if n:
            _k_alloc(self._stack, self._top, self._mark, idx)
            self._top -= n
        return self._out(idx)

    def free(self, free_index):
        """Return slots to the pool. Raises ``ValueError`` (and frees nothing) on a slot
        outside ``1..size``, a slot that is already free, or a slot given twice.
        O(len(free_index)), one pass (``kernels/slots.py``)."""
        idx = as_int64(free_index, "free_index")
        n = idx.size
        if n == 0:
            return
        code, bad = _k_free(self._stack, self._top, self._mark, idx, self.size)
        if code == _S_RANGE:
            raise ValueError(f"free_index: slot {int(bad)} outside [1, {self.size}]")
        if code == _S_DOUBLE:
            raise ValueError(f"free_index: double free of slot {int(bad)}")
        if code == _S_REPEATED:
            raise ValueError(f"free_index: slot {int(bad)} is given more than once")
        self._top += n

    def is_free(self, indices):
        """Boolean mask: which of ``indices`` are free (for tests and checks)."""
        return self._mark[as_int64(indices, "indices")] != 0


class ReqToTokenPool:
    """Request rows -> KV slots: ``req_to_token[row, pos]`` is the KV slot of
    token ``pos`` of the request in ``row`` (int64, ``(size, max_context_len)``).
    """

    def __init__(self, size, max_context_len, index_kind="numpy", device="cpu"):
        self.size = as_count(size, "size")
        self.max_context_len = as_count(max_context_len, "max_context_len")
        if index_kind not in ("numpy", "torch"):
            raise ValueError(f"index_kind must be 'numpy' or 'torch', got {index_kind!r}")
        self.index_kind = index_kind
        self.device = device
        arr = np.zeros((self.size, self.max_context_len), dtype=np.int64)
        self._rows = arr
        self.req_to_token = _torch().from_numpy(arr) if index_kind == "torch" else arr
        self.clear()

    def clear(self):
        self._free_rows = list(range(self.size - 1, -1, -1))
        self._is_free = np.ones(self.size, dtype=bool)

    def available_size(self):
        return len(self._free_rows)

    def alloc(self, need_size=1):
        """A list of ``need_size`` free row indices, or ``None``."""
        n = as_count(need_size, "need_size")
        if n > len(self._free_rows):
            return None
        rows = [self._free_rows.pop() for _ in range(n)]
        self._is_free[rows] = False
        return rows

    def free(self, free_index):
        rows = [free_index] if isinstance(free_index, (int, np.integer)) else list(free_index)
        for r in rows:
            if not 0 <= r < self.size or self._is_free[r]:
                raise ValueError(f"free_index: row {r} is not allocated")
        for r in rows:
            self._is_free[r] = True
            self._free_rows.append(int(r))

    def write(self, indices, values):
        """``req_to_token[indices] = values`` (``indices`` as numpy indexing)."""
        if is_torch(values):
            values = values.numpy()
        self._rows[indices] = values
