"""Where Numba caches the compiled kernels (imported before ``flatradix.kernels``).

Numba's cache does not notice changes in *other* modules a cached function
calls (numba#8396), and our kernels span several modules. So the cache
directory is keyed by a hash of every ``kernels/*.py`` and ``components/*.py``
source: an edited or upgraded kernel package never loads a stale object file.

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
    for sub in ("kernels", "components"):
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


CACHE_DIR = configure()
