"""The cache's device-value methods (issue 29, ``docs/device_values.md``): turning
the device value arena on, and the sync point of its checks. Methods of
``UnifiedRadixCache`` (each takes the cache as ``self``), kept in their own
module; the arena itself is ``flatradix/device.py``.
"""

from .kernels import layout as L


def start(self, value):
    """Turn the device value arena on when this cache's values are device values
    (``device_values``: the allocator's device, else ``value``, the first value
    inserted), before anything is stored; a cache whose first value is a host
    value, one that stored host values, or an SWA / Mamba cache (``ValueError``
    with ``device_values=True``) keeps host values (decided once). ``TypeError``
    naming ``params.value`` for a host value given to a cache built with
    ``device_values=True`` and no device allocator. ``insert`` calls it once the
    value passed its checks (a refused call leaves the choice open)."""
    vals = self._vals
    if vals.dev is not None or vals.device_values is False:
        return
    ops = vals.device_ops(value)
    forced = vals.device_values is True
    if ops is None:
        if forced and value is not None:
            raise TypeError("params.value: a cache built with device_values=True takes "
                            "torch tensors or cupy arrays, got "
                            f"{type(value).__name__}")
        if value is not None:   # the first value is a host value: decided, not asked again
            vals.device_values = False
        return
    if self._swa or self._mamba:
        if forced:
            raise ValueError("device_values=True: device values serve Full-attention "
                             "caches so far; an SWA or Mamba cache keeps its values in "
                             "host memory (device_values=None or False)")
        vals.device_values = False
        return
    meta = self._engine.meta
    if meta[L.M_NLIVE] > 1:   # host values are stored already: they stay there
        vals.device_values = False
        return
    vals.start_device(ops, self._engine)

def device_values(self):
    """Whether the KV indices live on the caller's device (the device value
    arena is on): see the ``device_values`` argument."""
    return self._vals.dev is not None

def check_device_values(self):
    """The sync point of the device checks: raise ``flatradix.device.
    DeviceValueError`` naming the first call since the last check that gave a
    device value out of range (an inserted KV index outside ``[0, allocator
    bound)``, or a slot the tree holds freed as a request's duplicate). One
    small device-to-host copy (it waits for the device); nothing without
    device values. Also run by ``sanity_check()``. The offending call was
    executed: ``reset()`` the cache (and clear its allocator) to go on."""
    with self._mutex:
        if self._vals.dev is not None:
            self._vals.dev.checks.surface()
