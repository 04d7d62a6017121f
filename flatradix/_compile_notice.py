"""Say on stderr when a process compiles flatradix's kernels, and how long it took.

Numba compiles a kernel at its first call in an environment (then loads it from
its cache, ``flatradix._numba_env``): on a fresh install the first run of a
program spends tens of seconds there. A listener on Numba's event API
(``numba:compile``) sees every compile of a flatradix function and says so, on
a terminal or not:

* inside :func:`phase` (the replay's warm-up, ``flatradix compile``): one line,
  ``flatradix: compiling kernels (first run; Numba caches them in DIR) ... 41 s``,
  the time appended when the phase ends;
* elsewhere (library calls): one line at the first compile, and at exit one line
  with the total (``flatradix: compiled 23 kernels in 48.1 s (CPU 47.0 s) ...``);
* a command wraps its run in :func:`hold`: compiles before its phase join the
  phase's line, and what compiles after it (a kernel only a late call needs) gets
  one line at the end.

Nothing is written when everything comes from the cache. ``FLATRADIX_QUIET_COMPILE=1``
silences it. :func:`stats` gives the counts and times (tests, reports).
"""

import atexit
import contextlib
import os
import sys
import threading
import time

_lock = threading.RLock()
_state = {
    "depth": 0,          # nesting of flatradix compiles (a kernel types its helpers)
    "t0": None,          # (wall, cpu) at the outermost compile's start
    "compiles": 0,       # flatradix functions compiled (specialisations), all depths
    "entries": 0,        # outermost compiles
    "wall": 0.0,         # seconds in outermost compiles
    "cpu": 0.0,
    "announced": False,  # the start line was written (outside a phase)
    "reported": 0,       # compiles already reported (phase lines, the exit line)
    "reported_at": (0.0, 0.0),   # (wall, cpu) totals when last reported
    "phase": None,       # an open phase: its dict
    "hold": 0,           # open hold() contexts
    "held": None,        # compiles held for the next phase: {"c0", "t"}
}


def _quiet():
    return os.environ.get("FLATRADIX_QUIET_COMPILE", "") not in ("", "0")


def _write(text):
    if _quiet():
        return
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass   # stderr closed or gone: the notice is not worth an error


def _functions(n):
    return f"{n} function" + ("" if n == 1 else "s")


def _cache_dir():
    try:
        import numba

        return numba.config.CACHE_DIR or "Numba's cache"
    except Exception:  # pragma: no cover
        return "Numba's cache"


def _ours(ev):
    d = ev.data.get("dispatcher") if isinstance(ev.data, dict) else None
    mod = getattr(getattr(d, "py_func", None), "__module__", "") or ""
    return mod == "flatradix" or mod.startswith("flatradix.")


def _on_start(ev):
    if not _ours(ev):
        return
    with _lock:
        s = _state
        s["depth"] += 1
        s["compiles"] += 1
        if s["depth"] != 1:
            return
        s["entries"] += 1
        s["t0"] = (time.perf_counter(), time.process_time())
        ph = s["phase"]
        if ph is not None:
            _announce(ph)
        elif s["hold"]:
            if s["held"] is None:   # folded into the next phase's line, or hold()'s
                s["held"] = {"c0": s["compiles"] - 1, "t": time.perf_counter()}
        elif not s["announced"]:
            s["announced"] = True
            _write(f"flatradix: compiling kernels on first use (once: Numba caches them in "
                   f"{_cache_dir()}; `flatradix compile` builds them all ahead)\n")


def _announce(ph):
    if not ph["announced"]:
        ph["announced"] = True
        _write(f"flatradix: compiling kernels{ph['what']} (first run; Numba caches them in "
               f"{_cache_dir()}) ...")


def _report_all():
    """Mark every compile so far as reported."""
    _state["reported"] = _state["compiles"]
    _state["reported_at"] = (_state["wall"], _state["cpu"])


def _on_end(ev):
    if not _ours(ev):
        return
    with _lock:
        s = _state
        s["depth"] -= 1
        if s["depth"] != 0 or s["t0"] is None:
            return
        s["wall"] += time.perf_counter() - s["t0"][0]
        s["cpu"] += time.process_time() - s["t0"][1]
        s["t0"] = None


def stats():
    """A copy of the counters: ``compiles`` (specialisations of flatradix functions
    compiled in this process), ``entries`` (outermost compiles), ``wall`` / ``cpu``
    (seconds spent in them)."""
    with _lock:
        return {k: _state[k] for k in ("compiles", "entries", "wall", "cpu")}


@contextlib.contextmanager
def phase(what=""):
    """A stretch of work that may compile (a warm-up): its compiles are reported as
    one line, ``what`` (e.g. ``" for the SWA replay"``) in it, the time appended
    when the phase ends. Nests: an inner phase joins the outer one."""
    with _lock:
        outer = _state["phase"]
        if outer is None:
            _state["phase"] = ph = {"what": what, "announced": False,
                                    "t": time.perf_counter(), "c0": _state["compiles"]}
            held = _state["held"]
            if held is not None:   # compiles hold() kept back join this line
                _state["held"] = None
                ph.update(c0=held["c0"], t=held["t"])
                _announce(ph)
    if outer is not None:
        yield outer
        return
    try:
        yield ph
    finally:
        with _lock:
            _state["phase"] = None
            if ph["announced"]:
                n = _state["compiles"] - ph["c0"]
                _report_all()
                _write(f" {time.perf_counter() - ph['t']:.1f} s ({_functions(n)})\n")


@contextlib.contextmanager
def hold():
    """A command's whole run (``flatradix replay``): compiles outside a phase are not
    announced when they start but folded into the next phase's line; those left at
    the end (none, or what only a late call compiled) get one line then, unless the
    run ends in an exception (a usage error's line stays the only one)."""
    with _lock:
        _state["hold"] += 1
    ok = False
    try:
        yield
        ok = True
    finally:
        with _lock:
            _state["hold"] -= 1
            if not _state["hold"]:
                _state["held"] = None
                n = _state["compiles"] - _state["reported"]
                if n > 0 and ok:    # after an error, its one line stays the only one
                    w = _state["wall"] - _state["reported_at"][0]
                    c = _state["cpu"] - _state["reported_at"][1]
                    more = " more" if _state["reported"] else ""
                    _report_all()
                    _write(f"flatradix: compiled {_functions(n).replace(' ', more + ' ', 1)} "
                           f"in {w:.1f} s (CPU {c:.1f} s); later runs load them from the "
                           f"cache\n")


def _at_exit():
    s = stats()
    left = s["compiles"] - _state["reported"]
    if left > 0 and _state["announced"]:     # (a library's compiles, announced at the first)
        _write(f"flatradix: compiled {_functions(s['compiles'])} in {s['wall']:.1f} s "
               f"(CPU {s['cpu']:.1f} s); later runs load them from the cache\n")


_installed = False


def install():
    """Register the listener (idempotent; :mod:`flatradix` does it at import)."""
    global _installed
    if _installed:
        return
    from numba.core import event

    class _Listener(event.Listener):
        def on_start(self, ev):
            _on_start(ev)

        def on_end(self, ev):
            _on_end(ev)

    event.register("numba:compile", _Listener())
    atexit.register(_at_exit)
    _installed = True
