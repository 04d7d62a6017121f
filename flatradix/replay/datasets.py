"""Named traces: a real sample shipped in the package, public traces fetched once.

``--trace NAME`` (and :func:`flatradix.replay.load_trace`) takes these names
besides file paths (an existing file of the same name wins):

* ``mooncake:sample`` -- the first 500 requests of Mooncake's conversation
  trace, packaged (``flatradix/replay/data``, 38 KB gzipped; its source and
  licence are in ``data/README.md``). Works offline, in a bare clone.
* ``mooncake:conversation`` -- the whole conversation trace (12,031 requests,
  3.0 MB) from the Mooncake repository (Apache-2.0), downloaded on first use
  into the user cache and checked against its sha256; later uses read the
  cached file.

Where the cache is: ``$FLATRADIX_TRACE_DIR``, else
``$XDG_CACHE_HOME/flatradix/traces``, else ``~/.cache/flatradix/traces``.
``$FLATRADIX_TRACE_MIRROR``: a base URL (``https://...``, ``file:///...``) or a
directory holding the files under their cache names
(``mooncake_conversation_trace.jsonl``), used instead of the public URL (an
offline machine, a proxy; the checksum still applies). A file you downloaded
yourself can also be given as a path: ``--trace conversation_trace.jsonl``.
"""

import hashlib
import os
import pathlib
import shutil
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from ._progress import progress_bar


@dataclass(frozen=True)
class NamedTrace:
    """A trace known by name.

    ``url`` is None for a trace shipped in the package (``packaged``: its file
    name under ``flatradix/replay/data``). ``filename`` is its name in the user
    cache and in a mirror; ``sha256`` and ``size`` (bytes) check a download.
    """

    name: str
    description: str
    filename: str
    sha256: str
    size: int
    url: str = None
    packaged: str = None
    source: str = ""
    licence: str = ""


_MOONCAKE = "https://github.com/kvcache-ai/Mooncake (FAST25-release/traces)"

TRACES = {t.name: t for t in (
    NamedTrace("mooncake:sample",
               "the first 500 requests of Mooncake's conversation trace (packaged)",
               filename="mooncake_conversation_sample.jsonl.gz",
               sha256="456fe741375bc7debbd1ab4e62f4295a37edf25eef883fbaf8ad9ad1850f28b2",
               size=37882, packaged="mooncake_conversation_sample.jsonl.gz",
               source=_MOONCAKE, licence="Apache-2.0"),
    NamedTrace("mooncake:conversation",
               "Mooncake's FAST'25 conversation trace: 12,031 requests, one hour of chat "
               "traffic (downloaded once, 3.0 MB)",
               filename="mooncake_conversation_trace.jsonl",
               sha256="b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
               size=3029533,
               url=("https://raw.githubusercontent.com/kvcache-ai/Mooncake/main/"
                    "FAST25-release/traces/conversation_trace.jsonl"),
               source=_MOONCAKE, licence="Apache-2.0"),
)}


class TraceDownloadError(OSError):
    """A named trace could not be fetched or failed its checksum (the message says
    which URL, why, and how to get the file by hand)."""

    def __init__(self, message):
        super().__init__(message)
        self.strerror = message


def is_name(spec):
    """True when ``spec`` names a trace of :data:`TRACES` and no file of that name exists."""
    return isinstance(spec, str) and spec in TRACES and not os.path.exists(spec)


def looks_like_name(spec):
    """``spec`` has the ``source:variant`` shape of a trace name (no such file exists)."""
    if not isinstance(spec, str) or os.path.exists(spec) or ":" not in spec:
        return False
    prefix = spec.split(":", 1)[0]
    return prefix in {n.split(":", 1)[0] for n in TRACES}


def cache_dir():
    """The directory downloaded traces are kept in (not created here)."""
    if os.environ.get("FLATRADIX_TRACE_DIR"):
        return pathlib.Path(os.environ["FLATRADIX_TRACE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "flatradix" / "traces"


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _packaged(t):
    from importlib import resources

    p = resources.files("flatradix.replay").joinpath("data", t.packaged)
    if isinstance(p, pathlib.Path):
        return str(p)
    # a zipped install: copy it out once, into the cache
    dest = cache_dir() / t.filename
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        with resources.as_file(p) as src:
            shutil.copyfile(src, dest)
    return str(dest)


def _source_url(t):
    mirror = os.environ.get("FLATRADIX_TRACE_MIRROR")
    if not mirror:
        return t.url
    if "://" not in mirror:
        return pathlib.Path(mirror).resolve().joinpath(t.filename).as_uri()
    return mirror.rstrip("/") + "/" + urllib.parse.quote(t.filename)


def _by_hand(t, dest, url):
    where = "it" if url == t.url else t.url
    return (f"download {where} yourself and pass it as --trace FILE, or put it at {dest} "
            f"(sha256 {t.sha256})")


def fetch(name, progress=False, timeout=60.0):
    """Path of the named trace's file, downloading it once into :func:`cache_dir`.

    A cached file is used when its size and sha256 match; otherwise it is fetched
    again (from ``$FLATRADIX_TRACE_MIRROR`` when set), written to a temporary file
    beside it, checked, and moved into place, so an interrupted download never
    leaves a partial file under the final name. ``progress``: a tqdm bar on a
    terminal. One line on stderr says what is downloaded, from where, to where.

    Raises
    ------
    KeyError
        ``name`` is not in :data:`TRACES` (the message lists the names).
    TraceDownloadError
        (an ``OSError``) the download failed or the file's checksum differs.
    """
    t = TRACES.get(name)
    if t is None:
        raise KeyError(f"unknown trace {name!r}; known: {', '.join(TRACES)}")
    if t.packaged:
        return _packaged(t)
    dest = cache_dir() / t.filename
    if dest.is_file() and dest.stat().st_size == t.size and _sha256(dest) == t.sha256:
        return str(dest)
    url = _source_url(t)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TraceDownloadError(f"cannot create the trace cache {dest.parent}: "
                                 f"{e.strerror or e}; set FLATRADIX_TRACE_DIR to a writable "
                                 f"directory") from None
    print(f"flatradix: downloading {t.name} ({t.size / 1e6:.1f} MB) from {url} to {dest} "
          f"(once)", file=sys.stderr, flush=True)
    fd, tmp = tempfile.mkstemp(prefix=t.filename + ".", suffix=".part", dir=dest.parent)
    try:
        h = hashlib.sha256()
        n = 0
        try:
            with os.fdopen(fd, "wb") as out, \
                    urllib.request.urlopen(url, timeout=timeout) as resp:
                bar = progress_bar(t.size, progress, unit="B", unit_scale=True,
                                   desc="downloading trace")
                try:
                    for chunk in iter(lambda: resp.read(1 << 16), b""):
                        out.write(chunk)
                        h.update(chunk)
                        n += len(chunk)
                        if bar is not None:
                            bar.update(len(chunk))
                finally:
                    if bar is not None:
                        bar.close()
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", None) or getattr(e, "strerror", None) or e
            raise TraceDownloadError(f"could not download {t.name} from {url}: {reason}; "
                                     + _by_hand(t, dest, url)) from None
        if n != t.size or h.hexdigest() != t.sha256:
            raise TraceDownloadError(
                f"{t.name} from {url} is not the expected file ({n:,} bytes, sha256 "
                f"{h.hexdigest()}; expected {t.size:,} bytes, sha256 {t.sha256}); "
                + _by_hand(t, dest, url))
        os.replace(tmp, dest)
        tmp = None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return str(dest)


def resolve(spec, progress=False):
    """The file to read for ``spec``: a path as given, or a named trace's file
    (:func:`fetch`). A name-shaped spec (``mooncake:...``) that is neither a file
    nor a known name raises ``FileNotFoundError`` listing the names."""
    if is_name(spec):
        return fetch(spec, progress=progress)
    if looks_like_name(spec):
        raise FileNotFoundError(2, f"No such file or directory, nor a trace name "
                                   f"(known: {', '.join(TRACES)})", spec)
    return spec
