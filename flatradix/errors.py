"""Exceptions raised by flatradix (all raised by the façade, never inside a kernel)."""


class NodeAccessError(KeyError):
    """A node id that does not name a live node: evicted, split away, from before
    ``reset()``, or never issued. A ``KeyError`` so that code written against
    SGLang's tree cores (which raise ``KeyError``) still catches it. O(1) to
    detect; the tree is unchanged."""

    def __str__(self):  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "stale node id"


class LockRefError(ValueError, AssertionError):
    """A lock release that would take a ``lock_ref`` below zero (unlock without a
    lock, double unlock) or a receipt released on another node. A ``ValueError``
    (bad input) that is also an ``AssertionError``, which is what SGLang's cores
    raise for it. The tree is unchanged."""


class CacheInvariantError(AssertionError):
    """``sanity_check()`` found a broken invariant (a flatradix bug)."""


class ReceiptError(LockRefError, KeyError):
    """A lock receipt that lacks what the release needs: no receipt at all, or no
    ``component_lock_uuids[ComponentType.SWA]`` entry, on a cache whose lock took
    an SWA window. A ``LockRefError`` that is also the ``KeyError`` SGLang's
    ``get_lock_uuid`` raises. The tree is unchanged."""

    def __str__(self):
        return str(self.args[0]) if self.args else "lock receipt incomplete"
