"""The tree engine: ``@njit(cache=True)`` kernels over the arrays of ``layout.py``.

Only the façade (``flatradix.cache``) imports this package. Import
``flatradix._numba_env`` first (the façade does) so the Numba cache directory
is keyed by the kernels' source hash.
"""
