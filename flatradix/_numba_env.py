"""Where Numba caches the compiled kernels (imported before ``flatradix.kernels``).

Numba's cache does not notice changes in *other* modules a cached function
calls (numba#8396), and our kernels span several modules. So the cache
directory is keyed by a hash of every ``kernels/*.py``, ``components/*.py`` and
``core/*.py`` source: an edited or upgraded kernel package never loads a stale object file.

Start-up (:func:`defer_scipy_blas`): Numba's first dispatch in a process imports
``numba.np.arraymath``, whose module body imports ``scipy.linalg.cython_blas``
when scipy is installed (a BLAS check for ``np.dot``; ~0.3 s, scipy's array-API
layer pulls in ``numpy.f2py``). No kernel uses BLAS, so the check is deferred to
the first time a jitted ``np.dot``-like call is typed (by anyone in the process).

Base directory, first writable of: ``$NUMBA_CACHE_DIR`` (the user's choice is
kept, we add a sub-folder), ``~/.cache/flatradix/numba``, a temporary
directory. Without this guard a read-only install in a container with no
writable home fails at import with "no locator available" (numba#4032).
"""

import hashlib
import os
import pathlib
import tempfile

import numba


def _source_hash():
    h = hashlib.sha256()
    here = pathlib.Path(__file__).parent
    for sub in ("kernels", "components", "core"):
        for f in sorted((here / sub).glob("*.py")):
            h.update(f"{sub}/{f.name}".encode())
            h.update(f.read_bytes())
    h.update(numba.__version__.encode())
    return h.hexdigest()[:16]


def _writable(d):
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe = d / ".probe"
        probe.write_bytes(b"")
        probe.unlink()
        return True
    except OSError:
        return False


def configure():
    """Point ``numba.config.CACHE_DIR`` at the source-keyed directory; returns it."""
    tag = _source_hash()
    bases = []
    if os.environ.get("NUMBA_CACHE_DIR"):
        bases.append(pathlib.Path(os.environ["NUMBA_CACHE_DIR"]) / "flatradix")
    bases.append(pathlib.Path.home() / ".cache" / "flatradix" / "numba")
    bases.append(pathlib.Path(tempfile.gettempdir()) / f"flatradix-numba-{os.getuid()}")
    for base in bases:
        d = base / tag
        if _writable(d):
            numba.config.CACHE_DIR = str(d)
            return str(d)
    return None


class _LazyBlasCheck:
    """Truthy when scipy's BLAS is there; asks only when first tested (what
    ``numba.np.arraymath._HAVE_BLAS`` is at import: ``_check_blas()``)."""

    _value = None

    def __bool__(self):
        if self._value is None:
            from numba.np import arraymath

            type(self)._value = bool(arraymath._check_blas())
        return self._value


def defer_scipy_blas():
    """Import ``numba.np.arraymath`` with ``scipy.linalg.cython_blas`` hidden, then
    make its ``_HAVE_BLAS`` flag lazy (:class:`_LazyBlasCheck`), so the process
    imports scipy only if jitted code types a BLAS call. A no-op when arraymath is
    imported already, when scipy is absent, or when Numba's module differs from
    what this expects (then Numba imports scipy as it always did)."""
    import importlib.util
    import sys

    name = "scipy.linalg.cython_blas"
    if "numba.np.arraymath" in sys.modules or name in sys.modules:
        return False
    try:
        if importlib.util.find_spec("scipy") is None:
            return False
    except (ImportError, ValueError):
        return False
    sys.modules[name] = None          # import scipy.linalg.cython_blas -> ImportError
    try:
        from numba.np import arraymath
    finally:
        if sys.modules.get(name, 0) is None:
            del sys.modules[name]
    if getattr(arraymath, "_HAVE_BLAS", None) is False and hasattr(arraymath, "_check_blas"):
        arraymath._HAVE_BLAS = _LazyBlasCheck()
        return True
    return False


CACHE_DIR = configure()
defer_scipy_blas()
