"""A transfer executor for the host tier: moves the KV bytes a backup or a load-back
names between device KV buffers and host KV buffers.

The tree moves slot indices only. ``init_hicache(transfer=f)`` calls
``f(kind, device_indices, host_indices)`` before it commits each backup
(``kind == "backup"``: device -> host) and each load-back (``"load"``: host ->
device) of KV slots, on a Mamba cache of state slots (``"backup_state"`` /
``"load_state"``), on an SWA cache of SWA pool slots (``"backup_swa"`` /
``"load_swa"``); when ``f`` raises, nothing of that copy is committed. ``KVTransfer``
is such an ``f`` over the engine's own buffers (SGLang's role:
``HiCacheController`` with its host pool's ``backup_from_device_all_layer`` /
``load_to_device_per_layer``), synchronous: every copy is complete when the
call returns, as the tree's step-wise protocol assumes of a transfer callable.

Buffers are numpy arrays or torch tensors, one per KV tensor of the model (for
example a K and a V buffer per layer), each indexed by slot on axis 0. On
CUDA, ``"backup"`` gathers on the device and copies to the host buffer with a
synchronising copy (the call returns once the bytes are on the host);
``"load"`` copies the host rows to the device and scatters them there on the
current stream, so later work on that stream sees them. That CUDA path is not
exercised by this project's tests (no GPU in CI): the CPU paths are.
"""

import sys

import numpy as np

__all__ = ["KVTransfer"]

#: The kinds a transfer callable is called with: KV rows, (Mamba caches) states and
#: (SWA caches) SWA pool rows.
_KINDS = ("backup", "load", "backup_state", "load_state", "backup_swa", "load_swa")


def _is_torch(x):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _describe(b):
    if _is_torch(b):
        return f"torch {str(b.dtype).replace('torch.', '')} {tuple(b.shape)} on {b.device}"
    return f"numpy {b.dtype} {b.shape}"


def _check_buffers(buffers, name):
    if isinstance(buffers, (str, bytes)) or not isinstance(buffers, (list, tuple)):
        raise TypeError(f"{name} must be a list of numpy arrays or torch tensors, got "
                        f"{type(buffers).__name__}")
    if not buffers:
        raise ValueError(f"{name} is empty (one buffer per KV tensor, e.g. K and V per layer)")
    for i, b in enumerate(buffers):
        if not (isinstance(b, np.ndarray) or _is_torch(b)):
            raise TypeError(f"{name}[{i}] must be a numpy array or a torch tensor, got "
                            f"{type(b).__name__}")
        if b.ndim < 1 or b.shape[0] < 1:
            raise ValueError(f"{name}[{i}] must have at least one row (slots on axis 0), got "
                             f"shape {tuple(b.shape)}")
        # both sides are written (backup: host rows, load: device rows)
        if _is_torch(b):
            if b.requires_grad:
                raise ValueError(f"{name}[{i}] requires grad: a KV buffer is written in place "
                                 "(detach it, or build it with requires_grad=False)")
        elif not b.flags.writeable:
            raise ValueError(f"{name}[{i}] is read-only: a KV buffer is written in place")
    return list(buffers)


def _check_pair(device_buffers, host_buffers, dname, hname):
    dev = _check_buffers(device_buffers, dname)
    host = _check_buffers(host_buffers, hname)
    if len(dev) != len(host):
        raise ValueError(f"{dname} has {len(dev)} buffers but {hname} has "
                         f"{len(host)} (one host buffer per device buffer)")
    for i, (d, h) in enumerate(zip(dev, host)):
        if _is_torch(d) != _is_torch(h):
            raise TypeError(f"{hname}[{i}] ({_describe(h)}) and {dname}[{i}] "
                            f"({_describe(d)}) must both be numpy or both torch")
        if d.dtype != h.dtype or tuple(d.shape[1:]) != tuple(h.shape[1:]):
            raise ValueError(f"{hname}[{i}] ({_describe(h)}) must have {dname}"
                             f"[{i}]'s dtype and row shape ({_describe(d)})")
        if _is_torch(h) and h.device.type != "cpu":
            raise ValueError(f"{hname}[{i}] must be on the CPU, got {h.device}")
    return dev, host


def _zeros_like_rows(buffers, rows, pin_memory):
    """Zeroed host buffers of ``rows`` rows, one per buffer (its dtype and row shape;
    CPU torch for torch, pinned when asked, by default for a CUDA buffer)."""
    out = []
    for d in buffers:
        if _is_torch(d):
            import torch

            pin = d.is_cuda if pin_memory is None else pin_memory
            out.append(torch.zeros((rows, *d.shape[1:]), dtype=d.dtype, device="cpu",
                                   pin_memory=pin))
        else:
            out.append(np.zeros((rows, *d.shape[1:]), dtype=d.dtype))
    return out


def _row_bytes(buffers):
    """Bytes one slot holds over every buffer."""
    n = 0
    for d in buffers:
        per_row = int(np.prod(d.shape[1:], dtype=np.int64))
        n += per_row * (d.element_size() if _is_torch(d) else d.itemsize)
    return n


def _as_index(x, name):
    """``x`` (the tree's indices: numpy or a CPU torch tensor) as an int64 numpy array."""
    if _is_torch(x):
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.ndim != 1 or a.dtype.kind not in "iu":
        raise TypeError(f"{name} must be a 1-D integer array, got {a.dtype} {a.shape}")
    return a.astype(np.int64, copy=False)


class KVTransfer:
    """Copy KV rows between device buffers and host buffers; pass it as
    ``init_hicache(transfer=KVTransfer(device_buffers, host_buffers))``.

    Parameters
    ----------
    device_buffers : list of arrays / tensors
        The device KV pool: buffer ``i`` has shape ``(D, *row_shape_i)``, one row
        per device KV slot (``D`` > the allocator's largest slot; SGLang's pools
        keep row 0 for padding, as flatradix's allocator, whose slots are
        ``1..size``). numpy arrays, or torch tensors on any device.
    host_buffers : list of arrays / tensors
        The host KV pool: as many buffers, buffer ``i`` of shape
        ``(H, *row_shape_i)`` with ``device_buffers[i]``'s dtype, ``H`` >= the
        host pool's size (host slots ``0..H-1``), numpy arrays or CPU torch
        tensors, of the same library as their device buffer.

    device_state_buffers, host_state_buffers : lists of arrays / tensors, optional
        A Mamba cache's state pool and its host copy, as the KV buffers (one per
        state tensor, e.g. conv and temporal state per layer; slot on axis 0:
        the device side needs more rows than the state allocator's largest slot,
        the host side ``mamba_pool_host``'s size).
    device_swa_buffers, host_swa_buffers : lists of arrays / tensors, optional
        An SWA cache's SWA KV pool (the sliding-window layers' K and V, indexed
        by SWA slot: more rows than the allocator's ``size_swa``) and its host
        copy (``swa_pool_host``'s size), as the KV buffers.

    Calls
    -----
    ``transfer(kind, device_indices, host_indices)``: ``kind`` ``"backup"``
    copies ``device[device_indices] -> host[host_indices]`` in every buffer,
    ``"load"`` the other way; ``"backup_state"`` / ``"load_state"`` the same
    over the state buffers, ``"backup_swa"`` / ``"load_swa"`` over the SWA
    buffers (``ValueError`` without them). Indices: 1-D integer arrays (numpy or torch) of
    one length. Checked before any copy: ``ValueError`` for an unknown kind,
    lengths that differ, an index outside a buffer (naming the argument and
    the buffer's rows); ``TypeError`` for indices that are not 1-D integers.
    Mutates the destination buffers' rows only. O(len(indices) x row bytes).
    A copy that fails midway (a device error) may leave the destination rows of
    earlier buffers written; the tree commits nothing then, so those rows
    belong to no cached node (their slots go back to their pool).

    Attributes ``backed_up_tokens``, ``loaded_tokens``, ``backed_up_states``,
    ``loaded_states``, ``backed_up_swa_tokens``, ``loaded_swa_tokens`` and
    ``bytes_copied`` count what was moved (ints, for monitoring).

    Raises ``TypeError`` / ``ValueError`` at construction for buffers that
    are not arrays, differ in count, dtype, row shape or library, are
    read-only (or require grad), or a host buffer that is not on the CPU.
    ``init_hicache`` refuses one whose buffers have fewer rows than the
    allocator's slots (``device_rows`` must exceed its largest slot) or the
    host pool's size (``host_rows``), naming the size they need.
    """

    def __init__(self, device_buffers, host_buffers, device_state_buffers=None,
                 host_state_buffers=None, device_swa_buffers=None, host_swa_buffers=None):
        dev, host = _check_pair(device_buffers, host_buffers, "device_buffers", "host_buffers")
        self.device_buffers = dev
        self.host_buffers = host
        #: rows every device / host buffer has (``init_hicache`` checks them against
        #: the allocator's slots and the host pool's size)
        self.device_rows = min(int(d.shape[0]) for d in dev)
        self.host_rows = min(int(h.shape[0]) for h in host)
        self._row_bytes = _row_bytes(dev)
        self.device_state_buffers = self.host_state_buffers = None
        self.device_state_rows = self.host_state_rows = 0
        if (device_state_buffers is None) != (host_state_buffers is None):
            raise ValueError("device_state_buffers and host_state_buffers go together (a Mamba "
                             "cache's state pool and its host copy), got one of them")
        if device_state_buffers is not None:
            sdev, shost = _check_pair(device_state_buffers, host_state_buffers,
                                      "device_state_buffers", "host_state_buffers")
            self.device_state_buffers, self.host_state_buffers = sdev, shost
            self.device_state_rows = min(int(d.shape[0]) for d in sdev)
            self.host_state_rows = min(int(h.shape[0]) for h in shost)
            self._state_bytes = _row_bytes(sdev)
        self.device_swa_buffers = self.host_swa_buffers = None
        self.device_swa_rows = self.host_swa_rows = 0
        if (device_swa_buffers is None) != (host_swa_buffers is None):
            raise ValueError("device_swa_buffers and host_swa_buffers go together (an SWA "
                             "cache's SWA pool and its host copy), got one of them")
        if device_swa_buffers is not None:
            wdev, whost = _check_pair(device_swa_buffers, host_swa_buffers,
                                      "device_swa_buffers", "host_swa_buffers")
            self.device_swa_buffers, self.host_swa_buffers = wdev, whost
            self.device_swa_rows = min(int(d.shape[0]) for d in wdev)
            self.host_swa_rows = min(int(h.shape[0]) for h in whost)
            self._swa_bytes = _row_bytes(wdev)
        self.backed_up_tokens = 0
        self.loaded_tokens = 0
        self.backed_up_states = 0
        self.loaded_states = 0
        self.backed_up_swa_tokens = 0
        self.loaded_swa_tokens = 0
        self.bytes_copied = 0

    @classmethod
    def with_host_buffers(cls, device_buffers, host_size, pin_memory=None,
                          device_state_buffers=None, host_state_size=None,
                          device_swa_buffers=None, host_swa_size=None):
        """A ``KVTransfer`` with fresh host buffers of ``host_size`` rows (zeroed),
        each of its device buffer's dtype and row shape (numpy for numpy; CPU
        torch for torch, pinned when ``pin_memory`` is True, by default when
        the device buffer is on CUDA). ``host_size``: the host pool's size in
        tokens, ``init_hicache``'s ``host_size`` (with ``hicache_ratio`` the pool
        is ``(int(D * ratio) // page_size + 1) * page_size`` slots for a device
        allocator of D slots; ``init_hicache`` names the size if it differs).
        ``device_state_buffers`` with ``host_state_size`` (``mamba_pool_host``'s
        size) does the same for a Mamba cache's states, ``device_swa_buffers``
        with ``host_swa_size`` (``swa_pool_host``'s size) for an SWA cache's
        SWA pool."""
        from ._cast import as_count, as_flag

        dev = _check_buffers(device_buffers, "device_buffers")
        rows = as_count(host_size, "host_size")
        if pin_memory is not None:
            pin_memory = as_flag(pin_memory, "pin_memory")
        if rows < 1:
            raise ValueError("host_size must be >= 1")
        sdev = shost = None
        if (device_state_buffers is None) != (host_state_size is None):
            raise ValueError("device_state_buffers and host_state_size go together")
        if device_state_buffers is not None:
            sdev = _check_buffers(device_state_buffers, "device_state_buffers")
            srows = as_count(host_state_size, "host_state_size")
            if srows < 1:
                raise ValueError("host_state_size must be >= 1")
            shost = _zeros_like_rows(sdev, srows, pin_memory)
        wdev = whost = None
        if (device_swa_buffers is None) != (host_swa_size is None):
            raise ValueError("device_swa_buffers and host_swa_size go together")
        if device_swa_buffers is not None:
            wdev = _check_buffers(device_swa_buffers, "device_swa_buffers")
            wrows = as_count(host_swa_size, "host_swa_size")
            if wrows < 1:
                raise ValueError("host_swa_size must be >= 1")
            whost = _zeros_like_rows(wdev, wrows, pin_memory)
        return cls(dev, _zeros_like_rows(dev, rows, pin_memory), sdev, shost, wdev, whost)

    def __call__(self, kind, device_indices, host_indices):
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {', '.join(map(repr, _KINDS))}, got {kind!r}")
        group = kind.split("_", 1)[1] if "_" in kind else ""
        dev_bufs, host_bufs, drows, hrows, row_bytes = {
            "": (self.device_buffers, self.host_buffers, self.device_rows, self.host_rows,
                 self._row_bytes),
            "state": (self.device_state_buffers, self.host_state_buffers,
                      self.device_state_rows, self.host_state_rows,
                      getattr(self, "_state_bytes", 0)),
            "swa": (self.device_swa_buffers, self.host_swa_buffers, self.device_swa_rows,
                    self.host_swa_rows, getattr(self, "_swa_bytes", 0)),
        }[group]
        if dev_bufs is None:
            raise ValueError(f"{kind}: this KVTransfer has no {group} buffers (give "
                             f"device_{group}_buffers and host_{group}_buffers)")
        di = _as_index(device_indices, "device_indices")
        hi = _as_index(host_indices, "host_indices")
        n = di.shape[0]
        if hi.shape[0] != n:
            raise ValueError(f"device_indices has {n} slots but host_indices has "
                             f"{hi.shape[0]}")
        if n == 0:
            return
        what = f"{group} buffers" if group else "buffers"
        if di.min() < 0 or di.max() >= drows:
            raise ValueError(f"device_indices: slots must lie in [0, {drows}) "
                             f"(the device {what}' rows)")
        if hi.min() < 0 or hi.max() >= hrows:
            raise ValueError(f"host_indices: slots must lie in [0, {hrows}) "
                             f"(the host {what}' rows)")
        backup = kind.startswith("backup")
        for d, h in zip(dev_bufs, host_bufs):
            if _is_torch(d):
                self._copy_torch(backup, d, h, di, hi)
            elif backup:
                h[hi] = d[di]
            else:
                d[di] = h[hi]
        counter = {"": "tokens", "state": "states", "swa": "swa_tokens"}[group]
        name = ("backed_up_" if backup else "loaded_") + counter
        setattr(self, name, getattr(self, name) + n)
        self.bytes_copied += n * row_bytes

    @staticmethod
    def _copy_torch(backup, d, h, di, hi):
        import torch

        hi_t = torch.from_numpy(hi)
        di_t = torch.from_numpy(di).to(d.device)
        if backup:
            h.index_copy_(0, hi_t, d.index_select(0, di_t).to("cpu"))
        else:
            d.index_copy_(0, di_t, h.index_select(0, hi_t).to(d.device))
