"""The value bridge: KV-index kinds at the boundary and the allocator the cache frees into.

The tree only moves spans of int64 KV indices; this module is where they meet
the caller's world: which array kind results come back in (numpy, or torch on
the caller's device), and how freed slots reach the attached allocator --
flatradix's own (``flatradix.pools``: numpy, one call per batch) or SGLang's,
duck-typed (torch tensors). With device values on (``device_values``), the KV
indices live on the caller's device in ``flatradix.device.DeviceValues``'s
arena (``dev``) and never come to the host (``docs/device_values.md``).
"""

import numpy as np

from ._cast import is_torch
from .kernels.layout import VALUES_NONNEG, VALUES_UNCHECKED

_EMPTY = np.empty(0, dtype=np.int64)


class ValueBridge:
    """Index kind, device and allocator of one cache.

    ``allocator``: ``None`` (freed indices are returned to the caller) or an
    object with ``free(indices)`` (SGLang's allocator or
    ``flatradix.TokenToKVPoolAllocator``). The index kind is the allocator's
    ``index_kind`` (flatradix's), ``"torch"`` for other allocators (SGLang's
    hold torch tensors), else the kind of the first inserted value.
    """

    def __init__(self, allocator, device_values=None, debug_checks=False):
        self.allocator = allocator
        #: ``device.DeviceValues`` once the device arena is on (None: host values)
        self.dev = None
        #: the constructor's choice: None (auto), True, False
        self.device_values = device_values
        self.debug_checks = bool(debug_checks)
        self.kind = getattr(allocator, "index_kind", None)
        if self.kind is None and allocator is not None:
            self.kind = "torch"
        self.torch_device = None
        # flatradix's allocators check "every slot held" in one kernel pass
        self.checks_held = hasattr(allocator, "_first_unheld")
        self._bound = self._bound_of = None   # kv_bound's memo
        # an SWA allocator: Full and SWA pools and the Full -> SWA mapping
        self.swa = is_swa_allocator(allocator)
        self._numpy = getattr(allocator, "index_kind", "torch") == "numpy"
        self.mamba = None
        self._mamba_numpy = False
        #: State slots the tree holds (one node each): a donated slot already in
        #: it is refused, frees take slots out (the façade adds adopted ones).
        self.mamba_owned = set()

    # ------------------------------------------------------------------ device values
    def device_ops(self, value=None):
        """The op set the device arena would use for this cache: from the
        allocator's device (a torch allocator not on the CPU; with
        ``device_values=True`` any torch allocator), else from ``value`` (a device
        value; with ``device_values=True`` any torch / cupy value); None when the
        values stay on the host."""
        from . import device as D

        if self.device_values is False:
            return None
        forced = self.device_values is True
        dev = getattr(self.allocator, "device", None)
        kind = getattr(self.allocator, "index_kind", "torch")
        if self.allocator is not None and kind != "numpy" and dev is not None:
            try:
                import torch
            except ImportError:   # pragma: no cover - a torch allocator without torch
                torch = None
            if torch is not None:
                try:
                    d = torch.device(dev)
                except (TypeError, RuntimeError):
                    d = None
                if d is not None and (forced or d.type != "cpu"):
                    return D.TorchOps(d)
        if value is not None and (D.on_device(value) or (forced and D.kind_of(value) in (
                "torch", "cupy"))):
            return D.ops_for(value)
        return None

    def start_device(self, ops, engine):
        """Turn the device arena on (before any value is stored)."""
        from .device import DeviceValues

        self.dev = DeviceValues(ops, debug=self.debug_checks)
        self.dev.bind(engine)
        self.kind = ops.kind

    # ------------------------------------------------------------------ kinds
    def note_kind(self, value):
        """Record the kind (and CUDA device) of the first value seen."""
        if type(value) is np.ndarray:
            if self.kind is None:
                self.kind = "numpy"
            return
        if self.kind is None:
            self.kind = "torch" if is_torch(value) else "numpy"
        if is_torch(value) and value.is_cuda:
            self.torch_device = value.device

    def out(self, a):
        """``a`` (int64 numpy, owned by the caller now) in the cache's index kind
        (host values; never given pool rows of the device arena)."""
        if self.kind == "torch":
            import torch

            t = torch.from_numpy(a)
            if self.torch_device is not None:
                t = t.to(self.torch_device)
            return t
        return a

    def empty(self):
        if self.dev is not None:
            return self.dev.empty()
        return self.out(_EMPTY.copy())

    # ------------------------------------------------------------------ bounds
    def kv_limit(self):
        """Exclusive upper bound of valid KV indices, from the allocator (None: no bound).
        SGLang's KV pools have ``size + page_size`` rows (slot 0 is padding); an SWA
        allocator's Full side has ``size_full``."""
        size = getattr(self.allocator, "size_full", None)
        if size is None:
            size = getattr(self.allocator, "size", None)
        if size is None:
            return None
        return int(size) + int(getattr(self.allocator, "page_size", 1) or 1)

    def kv_bound(self):
        """The insert kernel's ``limit``: the allocator's bound, or VALUES_NONNEG
        (read once per allocator object: pools do not change size)."""
        if self._bound is None or self._bound_of is not self.allocator:
            limit = self.kv_limit()
            self._bound = VALUES_NONNEG if limit is None else limit
            self._bound_of = self.allocator
        return self._bound

    def check_held(self, value, name):
        """With flatradix's allocator attached: ``ValueError`` naming ``name`` unless
        every entry of ``value`` is a distinct slot the allocator has handed out
        (one kernel pass, O(len)). No check with other allocators. Returns whether
        the check applies (then every slot is also inside the allocator's bound)."""
        if not self.checks_held:
            return False
        if not value.shape[0]:
            return True
        code, i = self.allocator._first_unheld(value)
        if code == 1:
            raise ValueError(f"{name}: KV slot {int(value[i])} at {int(i)} is outside the "
                             "allocator's pool")
        if code == 2:
            raise ValueError(f"{name}: KV slot {int(value[i])} at {int(i)} is free in the "
                             "allocator (insert only slots it handed out)")
        if code == 3:
            raise ValueError(f"{name}: KV slot {int(value[i])} at {int(i)} appears twice")
        return True

    def check_swa_peers(self, value, prev, cursor, name):
        """With flatradix's SWA allocator: ``ValueError`` naming ``name`` unless every
        slot of ``value[max(prev, cursor):]`` has an SWA peer (the insert may adopt or
        free them with their peers) and no slot of ``value[prev:cursor]`` has one
        (below the request's SWA cursor the insert keeps or frees Full slots only:
        the request gave those SWA peers back as its window slid). No check with
        other allocators."""
        fn = getattr(self.allocator, "_swa_unmapped", None)
        if fn is None:
            return
        start = max(prev, cursor)
        if start < value.shape[0]:
            i = fn(value[start:])
            if i >= 0:
                raise ValueError(f"{name}: KV slot {int(value[start + i])} at {start + i} has "
                                 "no SWA slot in the allocator's mapping (positions at or past "
                                 "the request's SWA cursor need one)")
        if prev < cursor:
            i = self.allocator._swa_mapped(value[prev:cursor])
            if i >= 0:
                raise ValueError(f"{name}: KV slot {int(value[prev + i])} at {prev + i} still "
                                 "has an SWA slot in the allocator's mapping, below the "
                                 f"request's SWA cursor {cursor} (free the SWA side of the "
                                 "slots below the cursor first: free_swa)")

    # ------------------------------------------------------------------ frees
    def _arg(self, idx):
        """``idx`` (int64 numpy; or a device array with device values) as the
        allocator takes it."""
        if self._numpy:
            return idx
        if type(idx) is not np.ndarray:   # a device array: as it is, or cupy as torch
            from .device import is_cupy, to_torch

            # (SGLang's allocators take torch; one declaring index_kind "cupy" gets cupy)
            if is_cupy(idx) and getattr(self.allocator, "index_kind", None) != "cupy":
                return to_torch(idx)
            return idx
        import torch

        t = torch.from_numpy(np.ascontiguousarray(idx))
        dev = getattr(self.allocator, "device", "cpu")
        return t.to(dev) if str(dev) != "cpu" else t

    def free(self, idx):
        """Give the int64 numpy slots ``idx`` back to the allocator (with an SWA
        allocator: their SWA peers too); no-op when empty or when no allocator is
        attached."""
        alloc = self.allocator
        if alloc is None or idx.shape[0] == 0:
            return
        alloc.free(self._arg(idx))

    def free_split(self, full, swa):
        """One executed batch: first the SWA peers of the Full slots ``swa`` (their
        mapping is read and cleared), then the Full slots ``full`` -- on an SWA
        allocator through ``free_full_segment``, which checks that none still has a
        peer. Both int64 numpy (either may be empty)."""
        alloc = self.allocator
        if alloc is None:
            return
        if not self.swa:
            if full.shape[0]:
                alloc.free(self._arg(full))
            return
        if swa.shape[0]:
            alloc.free_swa_segment(self._arg(swa), start_pos=0)
        if full.shape[0]:
            alloc.free_full_segment(self._arg(full), start_pos=0)

    def set_mamba(self, allocator):
        """Attach the Mamba state allocator (``req_to_token_pool.mamba_allocator``)."""
        self.mamba = allocator
        self._mamba_numpy = getattr(allocator, "index_kind", "torch") == "numpy"

    def mamba_slot(self, value, name, check_held=True):
        """The one state slot of ``value`` (an ``InsertParams.mamba_value``: a
        1-element integer tensor / array / sequence, a 0-d one, or an int), validated: in the
        pool and, with flatradix's allocator, handed out. ``TypeError`` /
        ``ValueError`` naming ``name``; changes nothing. The pool's slots are
        ``1 .. size`` (slot 0 is SGLang's reserved dummy)."""
        slot = one_slot(value, name)
        size = getattr(self.mamba, "size", None)
        # slots 1..size: slot 0 is SGLang's reserved dummy (MambaSlotAllocator)
        if slot < 1 or (isinstance(size, (int, np.integer)) and slot > size):
            raise ValueError(f"{name}: Mamba slot {slot} is outside the state pool "
                             f"[1, {size}]")
        if check_held and hasattr(self.mamba, "is_held") and not self.mamba.is_held([slot])[0]:
            raise ValueError(f"{name}: Mamba slot {slot} is free in the state pool (not "
                             "handed out by mamba_allocator.alloc)")
        if check_held and slot in self.mamba_owned:
            raise ValueError(f"{name}: Mamba slot {slot} is already cached by the tree (a "
                             "node owns it; donate a slot of your own)")
        return slot

    def mamba_out(self, slot):
        """A state slot as a 1-element int64 array of the Mamba allocator's kind."""
        a = np.array([slot], dtype=np.int64)
        if self._mamba_numpy:
            return a
        import torch

        return torch.from_numpy(a)

    def free_mamba(self, idx):
        """Give the int64 numpy state slots ``idx`` back to the Mamba allocator (the
        tree no longer holds them)."""
        if self.mamba is None or idx.size == 0:
            return
        self.mamba_owned.difference_update(idx.tolist())
        if self._mamba_numpy:
            self.mamba.free(idx)
            return
        import torch

        t = torch.from_numpy(np.ascontiguousarray(idx))
        dev = getattr(self.mamba, "device", "cpu")
        self.mamba.free(t.to(dev) if str(dev) != "cpu" else t)

    def set_swa_mapping(self, full, swa):
        """Map the Full slots ``full`` to the SWA slots ``swa`` (int64 numpy, the tree's
        own: a load-back's restored window); flatradix's allocator without its
        argument checks, another through ``set_full_to_swa_mapping``."""
        fast = getattr(self.allocator, "_map_trusted", None)
        if fast is not None:
            fast(full, swa)
        else:
            self.allocator.set_full_to_swa_mapping(self._arg(full), self._arg(swa))

    def swa_recover_locked(self, kept, incoming):
        """SGLang ``RecoverSWAWithLockedFull``'s mapping move: the locked Full slots
        ``kept`` take over the SWA peers of ``incoming`` (whose mapping is cleared;
        the caller frees ``incoming`` Full-only)."""
        alloc = self.allocator
        inc = self._arg(incoming)
        swa = alloc.translate_swa_indices_for_transfer(inc)
        if not self._numpy:
            import torch

            swa = swa.to(torch.int64)
        alloc.clear_full_to_swa_mapping(inc)
        alloc.set_full_to_swa_mapping(self._arg(kept), swa)

    def swa_of(self, full):
        """The SWA slots the Full slots ``full`` map to (int64 numpy; inspection)."""
        out = self.allocator.translate_swa_indices_for_transfer(self._arg(full))
        return np.asarray(out.cpu() if hasattr(out, "cpu") else out, dtype=np.int64)


def one_slot(value, name, what="Mamba state slot"):
    """The one int of a state slot given as an int, a 0-d integer tensor / array
    (SGLang's ``HybridReqToTokenPool.alloc`` stores ``mamba_pool_idx = mid[0]``) or
    a 1-element one (``mamba_allocator.alloc(1)``). ``TypeError`` / ``ValueError``
    naming ``name`` (the size error says ``what`` it must hold)."""
    from ._cast import as_int64

    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    if getattr(value, "ndim", None) == 0 and hasattr(value, "reshape"):
        value = value.reshape(1)
    arr = as_int64(value, name).reshape(-1)
    if arr.size != 1:
        raise ValueError(f"{name} must hold exactly one {what}, got {arr.size}")
    return int(arr[0])


def is_swa_allocator(alloc):
    """Whether ``alloc`` has the SWA allocator API the SWA component drives
    (SGLang's ``SWATokenToKVPoolAllocator`` or flatradix's)."""
    return all(callable(getattr(alloc, name, None)) for name in (
        "free_swa_segment", "free_full_segment", "set_full_to_swa_mapping",
        "clear_full_to_swa_mapping", "translate_swa_indices_for_transfer",
        "full_available_size", "swa_available_size"))


def check_range(host, limit, name):
    """``debug_checks``: the insert kernel's bound check on a host copy of device
    values (``ValueError`` naming ``name``, as the kernel's ``E_BAD_VALUE``)."""
    if not host.shape[0] or limit == VALUES_UNCHECKED:
        return
    neg = np.flatnonzero(host < 0)
    big = np.flatnonzero(host >= limit) if limit >= 0 else neg[:0]
    if neg.size and (not big.size or neg[0] < big[0]):
        i = int(neg[0])
        raise ValueError(f"{name}: KV indices must be >= 0, got {int(host[i])} at {i}")
    if big.size:
        i = int(big[0])
        raise ValueError(f"{name}: KV index {int(host[i])} at {i} is outside the allocator's "
                         f"pool (indices must be < {limit})")
