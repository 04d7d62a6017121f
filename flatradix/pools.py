"""The pools: CPU KV-slot allocators, the request -> token table, the host KV pool.

``TokenToKVPoolAllocator`` keeps its free slots as an int64 stack: ``alloc``
and ``free`` cost O(slots moved), never O(pool) (SGLang's ``free`` concatenates
onto its free list tensor, ~46 µs a call). A free-mask catches double frees
and foreign slots before anything changes.

Both pools are thread-safe: each holds its own ``threading.Lock`` around every
method that reads or moves free slots / rows (a scheduler thread may allocate
while another finishes requests through the cache, which frees into them).
"""

import threading

import numpy as np

from . import _numba_env  # noqa: F401  (cache directory, before the kernels)
from ._cast import _to_numpy, as_count, as_flag, as_int64, is_torch
from .kernels.slots import E_DOUBLE as _S_DOUBLE
from .kernels.slots import E_RANGE as _S_RANGE
from .kernels.slots import E_REPEATED as _S_REPEATED
from .kernels.slots import slots_alloc as _k_alloc
from .kernels.slots import slots_first_unheld as _k_first_unheld
from .kernels.slots import slots_free as _k_free
from .values import one_slot


def _torch():
    import torch

    return torch


#: Largest accepted pool size (slots or rows); the arrays need 9+ bytes per slot.
MAX_POOL_SIZE = 1 << 40


def _pool_size(x, name):
    n = as_count(x, name)
    if n > MAX_POOL_SIZE:
        raise ValueError(f"{name} must be <= {MAX_POOL_SIZE}, got {n}")
    return n


def _kind_and_device(index_kind, device, what):
    """``(index_kind, device)`` checked: ``"numpy"`` / ``"torch"``, and ``"cpu"``
    (``ValueError`` naming the argument)."""
    if index_kind not in ("numpy", "torch"):
        raise ValueError(f"index_kind must be 'numpy' or 'torch', got {index_kind!r}")
    if device != "cpu":
        raise ValueError(f"device: only 'cpu' is supported by this {what}, got {device!r}")
    return index_kind, device


def _allocating(fn, what):
    try:
        return fn()
    except MemoryError as e:
        raise MemoryError(f"{what}: cannot allocate the pool ({e})") from None


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

    ``size`` above 2**40 is a ``ValueError``; one the machine cannot hold a
    ``MemoryError`` naming it. Thread-safe (one lock per allocator).
    """

    def __init__(self, size, page_size=1, index_kind="numpy", device="cpu"):
        self.size = _pool_size(size, "size")
        self.page_size = as_count(page_size, "page_size")
        if self.page_size < 1:
            raise ValueError("page_size must be >= 1")
        self.index_kind, self.device = _kind_and_device(index_kind, device, "allocator")
        self._lock = threading.Lock()
        _allocating(self.clear, f"size={self.size}")

    def clear(self):
        """Every slot free again."""
        # Stack of free slots; the top is the end. Lowest slots are handed out first.
        stack = np.arange(self.size, 0, -1, dtype=np.int64)
        # mark[s] == 1 <=> slot s is free (slot 0 never is).
        mark = np.ones(self.size + 1, dtype=np.uint8)
        mark[0] = 0
        with self._lock:
            self._stack, self._mark, self._top = stack, mark, self.size

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
            with self._lock:
                if n > self._top:  # another thread took them meanwhile
                    return None
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
        with self._lock:
            code, bad = _k_free(self._stack, self._top, self._mark, idx, 1, self.size, False)
            if code == 0:
                self._top += n
                return
        if code == _S_RANGE:
            raise ValueError(f"free_index: slot {int(bad)} outside [1, {self.size}]")
        if code == _S_DOUBLE:
            raise ValueError(f"free_index: double free of slot {int(bad)}")
        if code == _S_REPEATED:
            raise ValueError(f"free_index: slot {int(bad)} is given more than once")

    def _first_unheld(self, idx):
        """``(code, i)``: the first entry of the int64 array ``idx`` that is outside
        ``1..size`` (code 1), free (code 2) or a repeat of an earlier entry (code 3);
        ``(0, -1)`` when all are distinct held slots. O(len), one kernel (the cache
        checks a request's row with it before changing anything)."""
        return _k_first_unheld(self._mark, idx, 1, self.size)

    def is_free(self, indices):
        """Boolean mask (same length): which of ``indices`` are free. Slot 0 (padding)
        is never free. ``ValueError`` for an index outside ``[0, size]``."""
        idx = as_int64(indices, "indices")
        if idx.size and (idx.min() < 0 or idx.max() > self.size):
            raise ValueError(f"indices: slot outside [0, {self.size}]")
        return self._mark[idx] != 0


class ReqToTokenPool:
    """Request rows -> KV slots: ``req_to_token[row, pos]`` is the KV slot of
    token ``pos`` of the request in ``row`` (int64, ``(size, max_context_len)``).

    ``size``, ``max_context_len`` and their product are at most 2**40
    (``ValueError``); CPU only. ``alloc`` / ``free`` / ``clear`` are thread-safe
    (one lock); ``is_allocated(row)`` lets the cache refuse a request whose row
    was already freed before it changes anything.
    """

    def __init__(self, size, max_context_len, index_kind="numpy", device="cpu"):
        self.size = _pool_size(size, "size")
        self.max_context_len = _pool_size(max_context_len, "max_context_len")
        if self.size * self.max_context_len > MAX_POOL_SIZE:
            raise ValueError(f"size * max_context_len must be <= {MAX_POOL_SIZE}, got "
                             f"{self.size} * {self.max_context_len}")
        self.index_kind, self.device = _kind_and_device(index_kind, device, "pool")
        arr = _allocating(lambda: np.zeros((self.size, self.max_context_len), dtype=np.int64),
                          f"size={self.size}, max_context_len={self.max_context_len}")
        self._rows = arr
        self.req_to_token = _torch().from_numpy(arr) if index_kind == "torch" else arr
        self._lock = threading.Lock()
        self.clear()

    def clear(self):
        """Every row free again (contents are left as they are)."""
        with self._lock:
            self._free_rows = list(range(self.size - 1, -1, -1))
            self._is_free = np.ones(self.size, dtype=bool)

    def available_size(self):
        return len(self._free_rows)

    def is_allocated(self, row):
        """Whether ``row`` (an int) is an allocated row (False outside ``[0, size)``)."""
        return 0 <= row < self.size and not self._is_free[row]

    def alloc(self, need_size=1):
        """A list of ``need_size`` free row indices (ints), or ``None`` when fewer are free."""
        n = as_count(need_size, "need_size")
        with self._lock:
            if n > len(self._free_rows):
                return None
            rows = [self._free_rows.pop() for _ in range(n)]
            self._is_free[rows] = False
        return rows

    def free(self, free_index):
        """Free one row (an int) or several (a 1-D integer sequence). ``TypeError`` for
        anything else, ``ValueError`` (nothing freed) for a row that is not allocated
        or given twice."""
        if isinstance(free_index, (int, np.integer)) and not isinstance(free_index, bool):
            rows = [int(free_index)]
        else:
            rows = _to_numpy(free_index, "free_index").tolist()
        with self._lock:
            seen = set()
            for r in rows:
                if not 0 <= r < self.size or self._is_free[r]:
                    raise ValueError(f"free_index: row {r} is not allocated")
                if r in seen:
                    raise ValueError(f"free_index: row {r} is given more than once")
                seen.add(r)
            for r in rows:
                self._is_free[r] = True
                self._free_rows.append(r)

    def write(self, indices, values):
        """``req_to_token[indices] = values`` (``indices`` as numpy indexing; ``values``
        an int or an integer sequence, never a float: ``TypeError`` rather than a
        silent truncation). ``IndexError`` naming ``indices`` when out of range."""
        if isinstance(values, (int, np.integer)) and not isinstance(values, bool):
            vals = values
        else:
            vals = _to_numpy(values, "values")
        try:
            self._rows[indices] = vals
        except IndexError as e:
            raise IndexError(f"indices: {e}") from None


class MambaSlotAllocator:
    """Mamba / SSM state slots ``1 .. size`` (SGLang ``MambaSlotAllocator``: one slot
    holds one request's -- or one cached checkpoint's -- recurrent state; slot 0
    is reserved, SGLang's dummy write target for padded tokens).

    ``alloc(n)`` hands out the lowest free slots first (int64, 1-D; ``None``
    when fewer are free); ``free(indices)`` takes them back, O(len(indices)),
    and refuses (``ValueError``, nothing freed) a slot outside the pool, a free
    one or one given twice. Thread-safe (one lock). ``index_kind`` as
    ``TokenToKVPoolAllocator``'s.
    """

    def __init__(self, size, index_kind="numpy", device="cpu"):
        self.size = _pool_size(size, "size")
        self.index_kind, self.device = _kind_and_device(index_kind, device, "allocator")
        self._lock = threading.Lock()
        _allocating(self.clear, f"size={self.size}")

    def clear(self):
        """Every slot free again."""
        stack = np.arange(self.size, 0, -1, dtype=np.int64)
        held = np.zeros(self.size + 1, dtype=bool)
        with self._lock:
            self._stack, self._held, self._top = stack, held, self.size

    def available_size(self):
        """Free slots."""
        return self._top

    def alloc(self, need_size):
        """``need_size`` free slots (int64, 1-D), or ``None`` when fewer are free."""
        n = as_count(need_size, "need_size")
        with self._lock:
            if n > self._top:
                return None
            idx = self._stack[self._top - n:self._top][::-1].copy()
            self._top -= n
            self._held[idx] = True
        return _torch().from_numpy(idx) if self.index_kind == "torch" else idx

    def free(self, free_index):
        """Return slots. ``ValueError`` (nothing freed) for a slot outside
        ``[1, size]``, a free slot or a slot given twice."""
        idx = as_int64(free_index, "free_index").reshape(-1)
        n = idx.size
        if n == 0:
            return
        with self._lock:
            bad = (idx < 1) | (idx > self.size)
            if bad.any():
                raise ValueError(f"free_index: slot {int(idx[bad.argmax()])} outside "
                                 f"[1, {self.size}]")
            free = ~self._held[idx]
            if free.any():
                raise ValueError(f"free_index: double free of slot {int(idx[free.argmax()])}")
            if n > 1 and np.unique(idx).size != n:
                raise ValueError("free_index: a slot is given more than once")
            self._held[idx] = False
            self._stack[self._top:self._top + n] = idx[::-1]
            self._top += n

    def is_held(self, indices):
        """Boolean mask: which of ``indices`` are handed out (``False`` outside the pool)."""
        idx = as_int64(indices, "indices").reshape(-1)
        ok = (idx >= 1) & (idx <= self.size)
        out = np.zeros(idx.size, dtype=bool)
        out[ok] = self._held[idx[ok]]
        return out


class HybridReqToTokenPool(ReqToTokenPool):
    """A ``ReqToTokenPool`` with a Mamba state pool (SGLang ``HybridReqToTokenPool``):
    ``mamba_allocator`` is a ``MambaSlotAllocator`` of ``mamba_size`` slots.

    The cache frees the states it evicts through ``mamba_allocator.free`` and
    allocates copy-on-write slots through ``mamba_allocator.alloc(1)``.

    ``enable_mamba_extra_buffer`` (SGLang's non-lazy extra buffer): each request
    also holds a *ping-pong track buffer* of ``mamba_ping_pong_track_buffer_size``
    (2, SGLang's with the overlap scheduler; or 1) state slots, into which the
    model runner saves the state at checkpoint-grid boundaries. The scheduler
    (model runner) keeps ``req.mamba_last_track_idx`` (the entry holding the
    latest tracked state), ``req.mamba_next_track_idx``,
    ``req.mamba_last_track_seqlen`` and ``req.mamba_prev_track_seqlen`` (the
    token lengths those states were taken at; ``None``: none since the last
    checkpoint); the cache donates tracked entries to the tree.

    ``enable_mamba_extra_buffer_lazy`` (SGLang's ``--mamba-radix-cache-strategy
    extra_buffer_lazy``; needs the extra buffer and a 2-entry buffer, as SGLang
    needs the overlap scheduler): a request starts with one track slot, entry 0
    (``mamba_ping_pong_empty == [False, True]``, the empty entry's slot -1,
    ``mamba_last_track_idx`` 0), so ``mamba_initial_tracking_slots`` is 1 instead
    of 2. The scheduler fills the other entry at a track boundary with
    ``set_mamba_ping_pong_slot`` (a slot from ``mamba_allocator.alloc(1)``, no
    eviction) and empties the entry it stops tracking with
    ``set_mamba_ping_pong_slot(req, idx, -1)`` after freeing its slot; the cache
    (``enable_mamba_extra_buffer_lazy=True`` on ``UnifiedRadixCache`` too) then
    releases a running request's Mamba lock before it evicts a state for the
    request's fork (SGLang ``MambaComponent._alloc_mamba_slot``).
    """

    def __init__(self, size, max_context_len, mamba_size, index_kind="numpy", device="cpu",
                 enable_mamba_extra_buffer=False, mamba_ping_pong_track_buffer_size=2,
                 enable_mamba_extra_buffer_lazy=False):
        self.enable_mamba_extra_buffer = as_flag(enable_mamba_extra_buffer,
                                                 "enable_mamba_extra_buffer")
        track = as_count(mamba_ping_pong_track_buffer_size, "mamba_ping_pong_track_buffer_size")
        if track not in (1, 2):
            raise ValueError("mamba_ping_pong_track_buffer_size must be 1 or 2, got "
                             f"{track}")
        lazy = as_flag(enable_mamba_extra_buffer_lazy, "enable_mamba_extra_buffer_lazy")
        if lazy and not (self.enable_mamba_extra_buffer and track == 2):
            raise ValueError("enable_mamba_extra_buffer_lazy needs enable_mamba_extra_buffer=True "
                             "and mamba_ping_pong_track_buffer_size=2 (SGLang: the lazy extra "
                             "buffer requires the overlap scheduler's two track entries)")
        self.mamba_ping_pong_track_buffer_size = track
        self.enable_mamba_extra_buffer_lazy = lazy
        #: track slots a request is given at admission (SGLang's name): 1 when lazy
        self.mamba_initial_tracking_slots = (0 if not self.enable_mamba_extra_buffer
                                             else 1 if lazy else track)
        self.mamba_allocator = MambaSlotAllocator(mamba_size, index_kind, device)
        super().__init__(size, max_context_len, index_kind, device)

    def alloc_mamba(self, req):
        """Give ``req`` its state slots, as SGLang's ``alloc(reqs)`` does: its own
        ``req.mamba_pool_idx`` when it holds none, and with the extra buffer a
        ping-pong track buffer when it has none (``req.mamba_ping_pong_track_buffer``
        int64 of the buffer size, ``mamba_ping_pong_empty``, ``mamba_next_track_idx``
        0, ``mamba_last_track_idx`` the other entry, no tracked seqlens). Returns
        True, or False with nothing allocated when the state pool is short."""
        kv = getattr(req, "kv", req)
        if not hasattr(kv, "mamba_pool_idx"):
            raise TypeError(f"req must be a Req with mamba_pool_idx, got {type(req).__name__}")
        own = kv.mamba_pool_idx is None
        ping = self.enable_mamba_extra_buffer and getattr(
            kv, "mamba_ping_pong_track_buffer", None) is None
        n = self.mamba_ping_pong_track_buffer_size
        k = self.mamba_initial_tracking_slots
        got = self.mamba_allocator.alloc(int(own) + (k if ping else 0))
        if got is None:  # one call: all or nothing, even with other threads allocating
            return False
        got = np.asarray(got, dtype=np.int64).reshape(-1)
        if own:
            kv.mamba_pool_idx = int(got[0])
        if ping:
            buf = np.full(n, -1, dtype=np.int64)
            buf[:k] = got[int(own):]
            kv.mamba_ping_pong_track_buffer = buf
            kv.mamba_ping_pong_empty = [False] * k + [True] * (n - k)
            kv.mamba_next_track_idx = 0
            kv.mamba_last_track_idx = (0 if self.enable_mamba_extra_buffer_lazy
                                       else self.get_mamba_ping_pong_other_idx(0))
            kv.mamba_last_track_seqlen = kv.mamba_prev_track_seqlen = None
        return True

    def set_mamba_ping_pong_slot(self, req, idx, value):
        """Fill the empty track entry ``idx`` of ``req``'s ping-pong buffer with a
        state slot, or empty a filled one (``value == -1``; the caller frees its
        slot first). SGLang's name: the lazy extra buffer's scheduler fills the
        second entry at a track boundary and empties the entry it stops tracking.
        ``value``: an int, or a one-element slot array / tensor
        (``mamba_allocator.alloc(1)``'s answer or its element), fresh from the
        allocator. Sets ``mamba_ping_pong_track_buffer[idx]`` and
        ``mamba_ping_pong_empty[idx]``; allocates and frees nothing. O(1).

        Refused before any change, naming the argument (``TypeError`` for a
        non-int ``idx``, else ``ValueError``): the request has no buffer, ``idx``
        is not an entry, filling an entry that holds a slot (its slot would be
        lost: empty it first) or emptying an empty one, a slot outside the state
        pool or not handed out, or the request's own slot or its other entry's.
        Not checked (the pool keeps no owner per slot): a slot the tree or
        another request holds."""
        kv, buf, empty = self._track_buffer(req)
        idx = self._entry(idx, "idx")
        slot = self._one_slot(value, "value", allow_empty=True)
        if slot == -1:
            if empty[idx]:
                raise ValueError(f"idx: track entry {idx} is empty already")
        else:
            if not empty[idx]:
                raise ValueError(f"idx: track entry {idx} holds slot {int(buf[idx])}; free it "
                                 "and empty the entry (value -1) first")
            self._check_fresh(kv, buf, empty, idx, slot, "value")
        buf[idx] = slot
        empty[idx] = slot == -1

    def _track_buffer(self, req):
        """``(kv, buffer, empty flags)`` of ``req``'s ping-pong buffer, checked."""
        kv = getattr(req, "kv", req)
        buf = getattr(kv, "mamba_ping_pong_track_buffer", None)
        if buf is None:
            raise ValueError("req.mamba_ping_pong_track_buffer is None: the request has no "
                             "track buffer (alloc_mamba gives it one)")
        empty = getattr(kv, "mamba_ping_pong_empty", None)
        size = self.mamba_ping_pong_track_buffer_size
        if not isinstance(empty, list) or len(empty) != size:
            raise ValueError(f"req.mamba_ping_pong_empty must be a list of {size} bools, got "
                             f"{empty!r}")
        return kv, buf, empty

    def _entry(self, idx, name):
        size = self.mamba_ping_pong_track_buffer_size
        if isinstance(idx, bool) or not isinstance(idx, (int, np.integer)):
            raise TypeError(f"{name} must be an int track entry, got {type(idx).__name__}")
        if not 0 <= idx < size:
            raise ValueError(f"{name} must be a track entry 0..{size - 1}, got {idx}")
        return int(idx)

    def _one_slot(self, value, name, allow_empty=False):
        """One state slot (``values.one_slot``: an int, or a one-element array /
        tensor, 0-d included) in the pool and handed out (-1 too when
        ``allow_empty``)."""
        slot = one_slot(value, name, "state slot" + (" or -1" if allow_empty else ""))
        if slot == -1 and allow_empty:
            return slot
        alloc = self.mamba_allocator
        if not 1 <= slot <= alloc.size:
            raise ValueError(f"{name}: slot {slot} is outside the state pool [1, {alloc.size}]")
        held = getattr(alloc, "is_held", None)
        if callable(held) and not bool(held([slot])[0]):
            raise ValueError(f"{name}: slot {slot} was not handed out by mamba_allocator")
        return slot

    def _check_fresh(self, kv, buf, empty, idx, slot, name):
        """``slot`` is neither the request's own slot nor another entry's."""
        taken = {int(buf[p]) for p in range(len(empty)) if p != idx and not empty[p]}
        own = getattr(kv, "mamba_pool_idx", None)
        if own is not None:
            taken.add(int(np.asarray(own).reshape(-1)[0]))
        if slot in taken:
            raise ValueError(f"{name}: slot {slot} is already the request's own state or its "
                             "other track entry")

    def get_mamba_ping_pong_other_idx(self, idx):
        """The other entry of a 2-entry buffer (the same one of a 1-entry buffer)."""
        return 1 - idx if self.mamba_ping_pong_track_buffer_size == 2 else idx

    @staticmethod
    def get_mamba_ping_pong_keep_idx(req):
        """The entry holding the latest tracked state (``req.mamba_last_track_idx``)."""
        return getattr(req, "kv", req).mamba_last_track_idx

    def donate_mamba_ping_pong_slot(self, req, new_slot):
        """Hand the latest tracked entry's slot (``req.mamba_last_track_idx``) to the
        tree and put ``new_slot`` (an int or a one-element slot array, fresh from
        ``mamba_allocator``) in its place; returns the donated slot (1-element
        int64 array). Refused before any change (``ValueError`` / ``TypeError``
        naming the argument): an empty tracked entry, and ``new_slot`` as
        ``set_mamba_ping_pong_slot`` refuses a value."""
        kv, buf, empty = self._track_buffer(req)
        keep = self._entry(kv.mamba_last_track_idx, "req.mamba_last_track_idx")
        if empty[keep]:
            raise ValueError(f"req.mamba_ping_pong_track_buffer[{keep}] is empty: no tracked "
                             "state to donate")
        slot = self._one_slot(new_slot, "new_slot")
        self._check_fresh(kv, buf, empty, keep, slot, "new_slot")
        if slot == int(buf[keep]):
            raise ValueError(f"new_slot: slot {slot} is the entry's own (the donated state)")
        donated = np.array([int(buf[keep])], dtype=np.int64)
        buf[keep] = slot
        empty[keep] = False
        return donated

    def clear(self):
        """Every request row and every state slot free again (SGLang's
        ``HybridReqToTokenPool.clear`` clears its ``mamba_allocator`` too: after
        ``cache.reset()`` neither the tree nor a request holds a state)."""
        super().clear()
        self.mamba_allocator.clear()

    def free_mamba_cache(self, req, mamba_ping_pong_track_buffer_to_keep=None):
        """Free the request's state slot ``req.kv.mamba_pool_idx`` (SGLang's name) and
        set the field to None. ``ValueError`` when it holds none (a double free).
        With the extra buffer the ping-pong entries go too, in entry order, but
        ``mamba_ping_pong_track_buffer_to_keep`` (the entry the tree adopted), and
        the request's track fields are cleared."""
        kv = getattr(req, "kv", req)
        idx = kv.mamba_pool_idx
        if idx is None:
            raise ValueError("req.mamba_pool_idx is None: the request holds no Mamba state "
                             "(double free?)")
        keep = mamba_ping_pong_track_buffer_to_keep
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, (int, np.integer))
                                 or not 0 <= keep < self.mamba_ping_pong_track_buffer_size):
            raise ValueError("mamba_ping_pong_track_buffer_to_keep must be None or an entry "
                             f"0..{self.mamba_ping_pong_track_buffer_size - 1}, got {keep!r}")
        if isinstance(idx, (int, np.integer)) and not isinstance(idx, bool):
            idx = np.array([int(idx)], dtype=np.int64)
        elif getattr(idx, "ndim", None) == 0 and hasattr(idx, "reshape"):
            idx = idx.reshape(1)  # a 0-d tensor (SGLang's form: mid[0])
        slots = as_int64(idx, "req.mamba_pool_idx").reshape(-1)
        buf = getattr(kv, "mamba_ping_pong_track_buffer", None)
        extra = self.enable_mamba_extra_buffer and buf is not None
        if extra:
            empty = kv.mamba_ping_pong_empty
            entries = [int(buf[p]) for p in range(len(buf)) if p != keep and not empty[p]]
            if entries:  # one batch: the allocator checks it whole before freeing any
                slots = np.concatenate([slots, np.array(entries, dtype=np.int64)])
        self.mamba_allocator.free(slots)
        kv.mamba_pool_idx = None
        if extra:
            kv.mamba_ping_pong_track_buffer = kv.mamba_ping_pong_empty = None
            kv.mamba_next_track_idx = kv.mamba_last_track_idx = None
            kv.mamba_last_track_seqlen = kv.mamba_prev_track_seqlen = None
            kv.mamba_cow_src_index = None
            kv.mamba_needs_clear = False


class SWATokenToKVPoolAllocator:
    """KV slots of a hybrid sliding-window model: a Full pool, an SWA pool and the
    Full -> SWA slot mapping (SGLang ``SWATokenToKVPoolAllocator``'s API, on flat
    arrays).

    Parameters
    ----------
    size : int
        Full slots (usable ``1 .. size``).
    size_swa : int
        SWA slots (usable ``1 .. size_swa``); SGLang sizes it
        ``swa_full_tokens_ratio`` times the Full pool.
    page_size, index_kind, device
        As ``TokenToKVPoolAllocator`` (CPU only).

    ``alloc(n)`` takes ``n`` slots of each pool and maps each Full slot to its SWA
    slot; the cache frees through ``free_segment`` (both), ``free_full_segment``
    (Full only: the SWA peer must already be gone) and ``free_swa_segment`` (the
    SWA peers of the given Full slots, whose mapping is cleared). A Full slot
    with no SWA peer maps to 0. Every free checks its whole batch first
    (``ValueError`` naming ``free_index``, nothing freed): a Full slot that is
    not held, an SWA free of a slot without a peer, a Full-only free of a slot
    that still has one. ``full_attn_allocator`` / ``swa_attn_allocator`` are the
    two ``TokenToKVPoolAllocator`` sides. Thread-safe (one lock around each call,
    then the sides' own). O(slots moved) per call.
    """

    def __init__(self, size, size_swa, page_size=1, index_kind="numpy", device="cpu"):
        _pool_size(size_swa, "size_swa")  # checked first, so an error names the right one
        self.full_attn_allocator = TokenToKVPoolAllocator(size, page_size, index_kind, device)
        self.swa_attn_allocator = TokenToKVPoolAllocator(size_swa, page_size, index_kind, device)
        self.size_full = self.full_attn_allocator.size
        self.size_swa = self.swa_attn_allocator.size
        self.page_size = self.full_attn_allocator.page_size
        self.index_kind = index_kind
        self.device = device
        self._lock = threading.Lock()
        self.full_to_swa_index_mapping = _allocating(
            lambda: np.zeros(self.size_full + self.page_size + 1, dtype=np.int64),
            f"size={self.size_full}")

    @property
    def size(self):
        """Slots a request can get on both sides: ``min(size_full, size_swa)`` (SGLang)."""
        return min(self.size_full, self.size_swa)

    def clear(self):
        with self._lock:
            self.full_attn_allocator.clear()
            self.swa_attn_allocator.clear()
            self.full_to_swa_index_mapping[:] = 0

    def available_size(self):
        return min(self.full_available_size(), self.swa_available_size())

    def full_available_size(self):
        return self.full_attn_allocator.available_size()

    def swa_available_size(self):
        return self.swa_attn_allocator.available_size()

    def _out(self, a):
        return _torch().from_numpy(a) if self.index_kind == "torch" else a

    def alloc(self, need_size):
        """``need_size`` Full slots (int64, 1-D), each mapped to a fresh SWA slot, or
        ``None`` when either side has fewer free."""
        n = as_count(need_size, "need_size")
        with self._lock:
            if n > self.full_available_size() or n > self.swa_available_size():
                return None
            full = _to_numpy(self.full_attn_allocator.alloc(n), "full")
            swa = _to_numpy(self.swa_attn_allocator.alloc(n), "swa")
            self.full_to_swa_index_mapping[full] = swa
        return self._out(full)

    # --------------------------------------------------------------- mapping
    def _full_slots(self, x, name):
        idx = as_int64(x, name)
        if idx.size and (idx.min() < 1 or idx.max() > self.size_full):
            raise ValueError(f"{name}: slot outside [1, {self.size_full}]")
        return idx

    def translate_swa_indices_for_transfer(self, kv_indices):
        """The SWA slots the Full slots ``kv_indices`` map to (0: no SWA peer)."""
        return self._out(self.full_to_swa_index_mapping[self._full_slots(kv_indices, "kv_indices")])

    translate_loc_from_full_to_swa = translate_swa_indices_for_transfer

    def set_full_to_swa_mapping(self, full_indices, swa_indices):
        full = self._full_slots(full_indices, "full_indices")
        swa = as_int64(swa_indices, "swa_indices")
        if swa.shape != full.shape:
            raise ValueError(f"swa_indices: {swa.size} entries for {full.size} full_indices")
        if swa.size and (swa.min() < 0 or swa.max() > self.size_swa):
            raise ValueError(f"swa_indices: slot outside [0, {self.size_swa}]")
        with self._lock:
            self.full_to_swa_index_mapping[full] = swa

    def _map_trusted(self, full, swa):
        """``set_full_to_swa_mapping`` for int64 numpy slots the cache vouches for (a
        load-back's: Full slots of the tree, SWA slots it was just handed), without
        the argument checks."""
        with self._lock:
            self.full_to_swa_index_mapping[full] = swa

    def clear_full_to_swa_mapping(self, full_indices):
        full = self._full_slots(full_indices, "full_indices")
        with self._lock:
            self.full_to_swa_index_mapping[full] = 0

    # --------------------------------------------------------------- frees
    def free_swa(self, free_index):
        """Free the SWA peers of the Full slots ``free_index`` and clear their mapping."""
        full = self._full_slots(free_index, "free_index")
        if not full.size:
            return
        with self._lock:
            swa = self.full_to_swa_index_mapping[full]
            if (swa <= 0).any():
                i = int(np.argmax(swa <= 0))
                raise ValueError(f"free_index: Full slot {int(full[i])} has no SWA peer to free")
            self.swa_attn_allocator.free(swa)
            self.full_to_swa_index_mapping[full] = 0

    def free_swa_segment(self, free_index, start_pos=0):
        self.free_swa(free_index)

    def free_full_segment(self, free_index, start_pos=0):
        """Free Full slots whose SWA peers are already gone (``ValueError`` if one has
        a peer: freeing it would leak the SWA slot)."""
        full = self._full_slots(free_index, "free_index")
        if not full.size:
            return
        with self._lock:
            peers = self.full_to_swa_index_mapping[full]
            if (peers != 0).any():
                i = int(np.argmax(peers != 0))
                raise ValueError(f"free_index: Full slot {int(full[i])} still has SWA slot "
                                 f"{int(peers[i])} (free it with free_segment)")
            self.full_attn_allocator.free(full)

    def free(self, free_index):
        """Free Full slots and their SWA peers (slots without a peer: Full only)."""
        full = self._full_slots(free_index, "free_index")
        if not full.size:
            return
        with self._lock:
            code, i = self.full_attn_allocator._first_unheld(full)
            if code:
                raise ValueError(f"free_index: Full slot {int(full[i])} is not held "
                                 "(free, outside the pool, or given twice)")
            swa = self.full_to_swa_index_mapping[full]
            swa = swa[swa > 0]
            self.swa_attn_allocator.free(swa)
            self.full_to_swa_index_mapping[full] = 0
            self.full_attn_allocator.free(full)

    def free_segment(self, free_index, start_pos=0):
        self.free(free_index)

    def _first_unheld(self, idx):
        """As ``TokenToKVPoolAllocator._first_unheld``, on the Full side."""
        return self.full_attn_allocator._first_unheld(idx)

    def _swa_unmapped(self, idx):
        """Index of the first Full slot of ``idx`` (int64) with no SWA peer, or -1."""
        bad = self.full_to_swa_index_mapping[idx] <= 0
        return int(np.argmax(bad)) if bad.any() else -1

    def _swa_mapped(self, idx):
        """Index of the first Full slot of ``idx`` (int64) that has an SWA peer, or -1."""
        bad = self.full_to_swa_index_mapping[idx] > 0
        return int(np.argmax(bad)) if bad.any() else -1


class HostKVPool:
    """A host KV pool of ``size`` token slots (flatradix's own; SGLang's
    ``mem_pool_host`` role): ``alloc(n)`` -> int64 slots or None when fewer than
    ``n`` are free, ``free(indices)`` (1-D integers; O(freed), one kernel pass;
    ``ValueError``, nothing freed, for a slot outside the pool, not handed out or
    given twice; ``TypeError`` for non-integers),
    ``all_held(idx)`` (that check alone), ``available_size()``, ``clear()``.
    Slots are handed out lowest first after a ``clear``; then the last batch
    freed goes out first, in the order it was given. The free stack and the free marks are
    ``kernels/slots.py``'s, shared with ``TokenToKVPoolAllocator`` (valid slots
    ``0..size-1`` here). Used by the host tier (``flatradix.hicache``) for its
    host pools; not thread-safe by itself (the cache's lock covers it)."""

    def __init__(self, size):
        self.size = as_count(size, "size")
        self.clear()

    def available_size(self):
        return self._n

    def alloc(self, n):
        n = as_count(n, "n")
        if n > self._n:
            return None
        out = np.empty(n, dtype=np.int64)
        if n:
            _k_alloc(self._free, self._n, self._mark, out)
            self._n -= n
        return out

    def free(self, indices):
        # 1-D integers (list, numpy, torch): TypeError / ValueError naming ``indices``
        idx = as_int64(indices, "indices")
        k = idx.shape[0]
        if k == 0:
            return
        code, _ = _k_free(self._free, self._n, self._mark, idx, 0, self.size - 1, True)
        if code != 0:
            raise ValueError(f"indices: host slots outside 0..{self.size - 1}, not handed out, "
                             "or given twice (a double free); nothing freed")
        self._n += k

    def all_held(self, idx):
        """Whether every slot of ``idx`` (1-D integers: list, numpy, torch) lies in
        the pool, is handed out, and appears once; False for anything else.
        O(len(idx)), one kernel pass."""
        try:
            idx = as_int64(idx, "idx")
        except (TypeError, ValueError):
            return False
        return idx.shape[0] == 0 or _k_first_unheld(self._mark, idx, 0, self.size - 1)[0] == 0

    def clear(self):
        # Free stack, top at the end (slot 0 on top); mark[s] == 1 <=> slot s free.
        self._free = np.arange(self.size - 1, -1, -1, dtype=np.int64)
        self._mark = np.ones(self.size, dtype=np.uint8)
        self._n = self.size
