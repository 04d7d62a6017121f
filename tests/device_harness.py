"""Device-value test harness: a dispatch-mode counter of host syncs (and, re-exported,
``flatradix.device``'s device allocators, which never read their values).

``SyncCounter`` is a ``TorchDispatchMode``: every aten op any torch code runs
inside it passes through ``__torch_dispatch__``, which counts the ops that make
the host wait for the device on CUDA:

* ``scalar``: a scalar read (``.item()``, ``int(t)``, ``bool(t)``, ``if t``:
  ``aten._local_scalar_dense``, ``is_nonzero``, ``equal``);
* ``d2h``: a device-to-host copy (``.cpu()``, ``.to("cpu")``, ``.tolist()``,
  ``copy_`` into a CPU tensor from a device one);
* ``data_dependent``: an op whose output size depends on the data (``nonzero``,
  boolean-mask indexing, ``masked_select``, ``unique``, ``repeat_interleave``
  without ``output_size``): CUDA syncs to size the result;
* ``h2d_pageable``: a host-to-device copy from pageable memory (CUDA waits for
  the queue before it: 28 ms behind a busy GPU, ``../shared/spec/architecture.md``).

On the ``meta`` device every one of these raises anyway (no data), so a run on
meta values that completes proves the code path reads no value on the host; the
counter also names what was attempted (``events``) when a test catches it.
"""

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

_SCALAR = {aten._local_scalar_dense.default, aten.is_nonzero.default, aten.equal.default}
_DATA_DEP = {aten.nonzero.default, aten.masked_select.default, aten._unique2.default,
             aten.unique_dim.default, aten.unique_consecutive.default,
             aten.masked_scatter.default}


def _is_dev(t):
    return isinstance(t, torch.Tensor) and t.device.type != "cpu"


def _is_cpu(t):
    return isinstance(t, torch.Tensor) and t.device.type == "cpu"


def _pinned(t):
    try:
        return t.is_pinned()
    except RuntimeError:
        return False


class SyncCounter(TorchDispatchMode):
    """Count the host-syncing ops run inside (see the module docstring).

    ``counts``: a ``Counter`` by category; ``events``: ``(category, op name)``
    in order; ``ops``: every aten op seen (for reports)."""

    def __init__(self):
        super().__init__()
        self.counts = Counter()
        self.events = []
        self.ops = 0

    def _hit(self, cat, func):
        self.counts[cat] += 1
        self.events.append((cat, str(func)))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops += 1
        if func in _SCALAR:
            self._hit("scalar", func)
        elif func in _DATA_DEP:
            self._hit("data_dependent", func)
        elif func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
            self._hit("data_dependent", func)
        elif func in (aten.index.Tensor, aten.index_put_.default, aten.index_put.default):
            idx = args[1] if len(args) > 1 else ()
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in idx or ()):
                self._hit("data_dependent", func)
        elif func is aten._to_copy.default:
            src = args[0]
            dev = kwargs.get("device")
            dev = torch.device(dev) if dev is not None else src.device
            if _is_dev(src) and dev.type == "cpu":
                self._hit("d2h", func)
            elif _is_cpu(src) and dev.type != "cpu" and not _pinned(src):
                self._hit("h2d_pageable", func)
        elif func in (aten.copy_.default, aten._copy_from.default):
            dst, src = args[0], args[1]
            if _is_cpu(dst) and _is_dev(src):
                self._hit("d2h", func)
            elif _is_dev(dst) and _is_cpu(src) and not _pinned(src):
                self._hit("h2d_pageable", func)
        return func(*args, **kwargs)

    def syncs(self):
        """The number of syncing ops seen (every category)."""
        return sum(self.counts.values())


from flatradix.device import DeviceKVAllocator, DeviceReqToTokenPool  # noqa: E402,F401
