"""Page identities: a 64-bit id for every page-aligned token prefix, and the
router's view of what each instance caches, built from its KV events.

:func:`page_ids` names each whole page of a token sequence by its *prefix*: page
``k``'s id is a hash of tokens ``[0, (k + 1) * page)``, so two sequences share a
page id exactly when they share that prefix (up to 64-bit hash collisions:
~2**-64 a pair). The hash is ``G(m) = sum_j mix(t_j) * R**j mod 2**64`` over
the first ``m`` tokens (``mix(t + K1)``: splitmix64's finaliser of a salted token,
so the sum is no linear function of the tokens and no token weighs 0), finished
with ``mix(G(m) ^ mix(m * K2 + K1))``; numpy computes a
whole prompt's page ids at once, and ``G`` continues from a parent page (the
events name a stored block's parent).

:class:`BlockIndex` is what a KV-aware router keeps (NVIDIA Dynamo's indexer
does the same with its own hash): per instance, the page ids it holds on the
device, applied from its ``BlockStored`` / ``BlockRemoved`` /
``AllBlocksCleared`` events (each event names blocks by the cache's own digest;
a stored block's tokens and parent give its page id here). The overlap of a
request with an instance is the number of its leading pages held there: the
cache's ``match_prefix`` length in pages (a prefix cache holds every ancestor of
a page it holds, so one binary search finds it).
"""

from array import array

import numpy as np

_U = np.uint64
_R = _U(0x9E3779B97F4A7C15)          # odd: its powers never vanish mod 2**64
_M1, _M2 = _U(0xBF58476D1CE4E5B9), _U(0x94D049BB133111EB)
_S30, _S27, _S31 = _U(30), _U(27), _U(31)
_K1, _K2 = _U(0xD6E8FEB86659FD93), _U(0xA0761D6478BD642F)   # token and length salts

_powers = np.ones(1, dtype=_U)


def _mix(x):
    """splitmix64's finaliser, elementwise on uint64 (wrapping)."""
    x = x ^ (x >> _S30)
    x = x * _M1
    x = x ^ (x >> _S27)
    x = x * _M2
    return x ^ (x >> _S31)


def _pow(end):
    """``R**j`` for ``j < end`` (uint64, wrapping), grown on demand."""
    global _powers
    if _powers.size < end:
        n = max(end, 2 * _powers.size)
        p = np.full(n, _R, dtype=_U)
        p[0] = 1
        with np.errstate(over="ignore"):
            _powers = np.cumprod(p, dtype=_U)
    return _powers


def page_ids(tokens, page_size, n_pages=None, g0=0, pos0=0):
    """Ids of the whole pages of ``tokens`` (the first ``n_pages``; default all
    whole pages) as a continuation of a prefix of ``pos0`` tokens whose hash sum
    is ``g0`` (0, 0: from the start). Returns ``(ids, sums)``: uint64
    ``(n_pages,)`` each, ``sums[k]`` the hash sum at the end of page ``k`` (to
    continue from it)."""
    t = np.asarray(tokens)
    n = t.shape[0] // page_size if n_pages is None else int(n_pages)
    m = n * page_size
    if n <= 0:
        return np.empty(0, dtype=_U), np.empty(0, dtype=_U)
    with np.errstate(over="ignore"):
        w = _mix(t[:m].astype(np.int64).view(_U) + _K1) * _pow(pos0 + m)[pos0:pos0 + m]
        sums = np.cumsum(w, dtype=_U)[page_size - 1::page_size] + _U(g0)
        ends = np.arange(pos0 + page_size, pos0 + m + 1, page_size, dtype=np.int64).view(_U)
        ids = _mix(sums ^ _mix(ends * _K2 + _K1))
    return ids, sums


class BlockIndex:
    """Per instance, the page ids on its device, from its KV events (Full
    attention; blocks of ``page_size`` tokens, the cache's page).

    ``apply(k, events)`` applies instance ``k``'s events in order;
    ``overlap(k, ids)`` is how many leading ids of a request's :func:`page_ids` it
    holds."""

    def __init__(self, instances, page_size):
        self.page_size = page_size
        self.held = [set() for _ in range(instances)]
        # per instance: event digest -> (page id, hash sum, tokens to its end)
        self.digests = [{} for _ in range(instances)]

    def apply(self, k, events):
        """Apply instance ``k``'s events (``flatradix.events`` objects, in order):
        device stores and removals (host-tier copies, ``medium`` CPU, are not on
        the device: skipped)."""
        held, digests, page = self.held[k], self.digests[k], self.page_size
        for ev in events:
            kind = type(ev).__name__
            if kind == "BlockStored":
                if ev.medium not in (None, "GPU"):
                    continue
                g, pos = 0, 0
                if ev.parent_block_hash is not None:
                    _, g, pos = digests[ev.parent_block_hash]
                hashes = ev.block_hashes
                n = len(hashes)
                toks = np.frombuffer(array("q", ev.token_ids), dtype=np.int64)
                ids, sums = page_ids(toks, page, n, g, pos)
                ids = ids.tolist()
                digests.update(zip(hashes, zip(ids, sums.tolist(),
                                               range(pos + page, pos + (n + 1) * page, page))))
                held.update(ids)
            elif kind == "BlockRemoved":
                if ev.medium not in (None, "GPU"):
                    continue
                for h in ev.block_hashes:
                    held.discard(digests.pop(h)[0])
            elif kind == "AllBlocksCleared":
                held.clear()
                digests.clear()

    def overlap(self, k, ids):
        """Leading entries of ``ids`` (a list of page ids) instance ``k`` holds: a
        binary search (what an instance holds is prefix-closed)."""
        held = self.held[k]
        lo, hi = 0, len(ids)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if ids[mid - 1] in held:
                lo = mid
            else:
                hi = mid - 1
        return lo
