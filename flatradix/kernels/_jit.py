"""Central JIT options: every kernel module decorates through these, never by hand.

``kernel``: an entry kernel called from the façade (cached, GIL held: short
calls must not release the GIL, see ``docs/architecture.md`` "The GIL").
``helper``: an njit->njit helper (cached too; njit-to-njit calls cost nothing).
"""

import functools

from numba import njit

kernel = functools.partial(njit, cache=True, nogil=False)
helper = functools.partial(njit, cache=True, nogil=False)
