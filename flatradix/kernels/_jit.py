"""Central JIT options: every kernel module decorates through these, never by hand.

``kernel``: an entry kernel called from the façade (cached, GIL held: short
calls must not release the GIL, see ``docs/architecture.md`` "The GIL").
``helper``: an njit->njit helper (cached too; njit-to-njit calls cost nothing).

Every entry kernel is recorded in ``KERNELS`` (``tests/test_specialisation.py``
checks that a whole workload compiles each of them exactly once: no silent
re-specialisation costing cold-start time).
"""

import functools

from numba import njit

_njit = functools.partial(njit, cache=True, nogil=False)
KERNELS = []


def kernel(fn):
    k = _njit(fn)
    KERNELS.append(k)
    return k


helper = functools.partial(njit, cache=True, nogil=False)
