"""Where first-run compile time goes: per kernel, type inference vs lowering vs LLVM.

Each scenario runs in a fresh process with an empty Numba cache
(``NUMBA_CACHE_DIR`` in a new temporary directory), with a listener on Numba's
event API (``numba.core.event``: ``numba:compile`` per dispatcher and
signature, ``numba:run_pass`` per compiler pass, ``numba:llvm_lock`` around
LLVM's work). A compile that triggers another (a kernel typing a call to a
helper compiles the helper inside its own type inference) is split: each
function's *self* time excludes the compiles nested in it, so the self times
add up to the total. Wall and CPU time (``time.process_time``) are both
recorded; on a loaded machine trust the CPU time.

Columns of the per-function table (seconds, self time):

* ``typing``   ``nopython_type_inference`` (and the other typing passes)
* ``lower``    ``native_lowering`` less the LLVM time inside it (Numba's own
  lowering of typed IR to LLVM IR)
* ``llvm``     time holding the LLVM lock (LLVM optimisation, codegen)
* ``other``    every other pass (bytecode analysis, IR rewrites, inlining ...)

Scenarios::

    replay      flatradix replay (synthetic workload, Full attention only)
    snippet     the README's first Python snippet
    swa_host    flatradix replay --swa-window 512 --host-capacity 400k (SWA + host tier)
    import      import flatradix + first match_prefix with a warm cache (start-up costs)

Usage::

    python benchmarks/compile_profile.py [SCENARIO ...] [--json-out FILE] [--top 25]

prints, per scenario, the process's wall / CPU time, the compile total and its
split, and the functions that cost most.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

SNIPPET = """
import numpy as np
from flatradix import UnifiedRadixCache, RadixKey, InsertParams, MatchPrefixParams, EvictParams

cache = UnifiedRadixCache(page_size=1)
cache.insert(InsertParams(key=RadixKey([1, 2, 3, 4]), value=np.array([10, 11, 12, 13])))
m = cache.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3, 9])))
receipt = cache.inc_lock_ref(m.last_device_node)
cache.dec_lock_ref(m.last_device_node, receipt)
cache.evict(EvictParams(num_tokens=4)).evicted_indices
"""

FIRST_MATCH = """
import numpy as np
from flatradix import UnifiedRadixCache, RadixKey, MatchPrefixParams
UnifiedRadixCache().match_prefix(MatchPrefixParams(key=RadixKey(np.arange(1, 9, dtype=np.int64))))
"""

SCENARIOS = {
    "replay": ("cli", ["replay", "--no-progress"]),
    "snippet": ("code", SNIPPET),
    "swa_host": ("cli", ["replay", "--no-progress", "--capacity", "100k", "--swa-window", "512",
                         "--host-capacity", "400k"]),
}

TYPING = ("nopython_type_inference", "partial_type_inference", "nopython_rewrites")


def _listener_base():
    from numba.core import event

    return event.Listener


class _Profile:
    """A numba.core.event listener building per-(function, signature) self times
    (made a ``numba.core.event.Listener`` by :func:`_child`)."""

    def on_start(self, event):
        self.notify(event)

    def on_end(self, event):
        self.notify(event)

    def __init__(self):
        self.stack = []    # frames: dict(kind, key, w0, c0, child_w, child_c)
        self.funcs = {}    # key -> row
        self.outside_llvm = [0.0, 0.0]

    @staticmethod
    def _now():
        return time.perf_counter(), time.process_time()

    def _row(self, key):
        r = self.funcs.get(key)
        if r is None:
            r = self.funcs[key] = {"function": key[0], "signature": key[1], "compiles": 0,
                                   "wall": 0.0, "cpu": 0.0, "typing": 0.0, "lower": 0.0,
                                   "llvm": 0.0, "other": 0.0, "passes": {}}
        return r

    def _compile_frame(self):
        for f in reversed(self.stack):
            if f["kind"] == "compile":
                return f
        return None

    def notify(self, ev):
        if ev.is_start:
            w, c = self._now()
            frame = {"kind": ev.kind, "w0": w, "c0": c, "child_w": 0.0, "child_c": 0.0}
            if ev.kind == "numba:compile":
                d = ev.data["dispatcher"]
                fn = d.py_func
                frame["kind"] = "compile"
                frame["key"] = (f"{fn.__module__}.{fn.__qualname__}",
                                "(" + ", ".join(str(a) for a in ev.data["args"]) + ")")
            elif ev.kind == "numba:run_pass":
                frame["kind"] = "pass"
                frame["key"] = ev.data["name"].split(" ")[0]
            else:
                frame["kind"] = "llvm"
            self.stack.append(frame)
            return
        w, c = self._now()
        frame = self.stack.pop()
        dw, dc = w - frame["w0"], c - frame["c0"]
        self_w, self_c = dw - frame["child_w"], dc - frame["child_c"]
        # every enclosing frame excludes what this frame took *as a compile*;
        # passes and the LLVM lock only exclude nested compiles and LLVM time
        if frame["kind"] == "compile":
            for f in reversed(self.stack):   # up to the enclosing compile, which
                f["child_w"] += dw           # passes it on when it ends
                f["child_c"] += dc
                if f["kind"] == "compile":
                    break
            r = self._row(frame["key"])
            r["compiles"] += 1
            r["wall"] += self_w
            r["cpu"] += self_c
            return
        cf = self._compile_frame()
        if frame["kind"] == "llvm":
            # LLVM time inside a pass is taken out of that pass
            for f in reversed(self.stack):
                if f is cf:
                    break
                f["child_w"] += self_w
                f["child_c"] += self_c
            if cf is None:
                self.outside_llvm[0] += self_w
                self.outside_llvm[1] += self_c
            else:
                self._row(cf["key"])["llvm"] += self_c
            return
        # a pass: self CPU time net of nested compiles and LLVM
        if cf is None:
            return
        r = self._row(cf["key"])
        name = frame["key"]
        r["passes"][name] = r["passes"].get(name, 0.0) + self_c
        if name in TYPING:
            r["typing"] += self_c
        elif name == "native_lowering":
            r["lower"] += self_c
        else:
            r["other"] += self_c


def _child(name, out):
    from numba.core import event

    prof = type("Profile", (_Profile, _listener_base()), {})()
    t0 = time.perf_counter(), time.process_time()
    for kind in ("numba:compile", "numba:run_pass", "numba:llvm_lock"):
        event.register(kind, prof)
    kind, arg = SCENARIOS[name] if name in SCENARIOS else ("code", FIRST_MATCH)
    import io
    import contextlib

    t_imp = time.perf_counter()
    import flatradix  # noqa: F401
    import_s = time.perf_counter() - t_imp
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink):
        if kind == "cli":
            from flatradix.cli import main

            rc = main(arg)
            assert rc == 0, rc
        else:
            exec(compile(arg, name, "exec"), {})
    t1 = time.perf_counter(), time.process_time()
    rows = sorted(prof.funcs.values(), key=lambda r: -r["cpu"])
    json.dump({"scenario": name, "wall": t1[0] - t0[0], "cpu": t1[1] - t0[1],
               "import_s": import_s, "outside_llvm_cpu": prof.outside_llvm[1],
               "functions": rows}, open(out, "w"), indent=1)


def run(name, warm_cache=None):
    """Run a scenario in a fresh process; returns its profile (dict)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.TemporaryDirectory() as d:
        env["NUMBA_CACHE_DIR"] = warm_cache or os.path.join(d, "numba")
        out = os.path.join(d, "profile.json")
        t = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--child", name, out], check=True, env=env)
        wall = time.perf_counter() - t
        with open(out) as f:
            prof = json.load(f)
    prof["process_wall"] = wall
    return prof


def by_function(rows):
    """Rows merged per function: ``signatures`` counts its specialisations."""
    out = {}
    for r in rows:
        m = out.get(r["function"])
        if m is None:
            m = out[r["function"]] = dict(r, signatures=0, passes={})
            for k in ("compiles", "wall", "cpu", "typing", "lower", "llvm", "other"):
                m[k] = 0
        m["signatures"] += 1
        for k in ("compiles", "wall", "cpu", "typing", "lower", "llvm", "other"):
            m[k] += r[k]
    return sorted(out.values(), key=lambda r: -r["cpu"])


def summarise(prof, top=25):
    fs = by_function(prof["functions"])
    tot = {k: sum(r[k] for r in fs) for k in ("wall", "cpu", "typing", "lower", "llvm", "other")}
    lines = [f"## {prof['scenario']}",
             f"process wall {prof['process_wall']:.1f} s; in-process wall {prof['wall']:.1f} s, "
             f"CPU {prof['cpu']:.1f} s; import flatradix {prof['import_s']:.2f} s",
             f"compiling: {len(fs)} functions, {len(prof['functions'])} specialisations (self "
             f"times add up), wall {tot['wall']:.1f} s, "
             f"CPU {tot['cpu']:.1f} s = typing {tot['typing']:.1f} + lowering "
             f"{tot['lower']:.1f} + LLVM {tot['llvm']:.1f} + other passes {tot['other']:.1f} "
             f"(+ {tot['cpu'] - tot['typing'] - tot['lower'] - tot['llvm'] - tot['other']:.1f} "
             f"outside passes); LLVM outside compiles {prof['outside_llvm_cpu']:.1f} s", "",
             "| function | sigs | CPU s | typing | lower | LLVM | other |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in fs[:top]:
        fn = r["function"].replace("flatradix.", "")
        lines.append(f"| `{fn}` | {r['signatures']} | {r['cpu']:.2f} | {r['typing']:.2f} | {r['lower']:.2f} | "
                     f"{r['llvm']:.2f} | {r['other']:.2f} |")
    rest = fs[top:]
    if rest:
        lines.append(f"| {len(rest)} more | {sum(r['signatures'] for r in rest)} | "
                     f"{sum(r['cpu'] for r in rest):.2f} | "
                     f"{sum(r['typing'] for r in rest):.2f} | {sum(r['lower'] for r in rest):.2f}"
                     f" | {sum(r['llvm'] for r in rest):.2f} | {sum(r['other'] for r in rest):.2f} |")
    by_mod = {}
    for r in fs:
        mod = r["function"].rsplit(".", 1)[0].replace("flatradix.", "")
        by_mod[mod] = by_mod.get(mod, 0.0) + r["cpu"]
    lines += ["", "by module: " + ", ".join(f"{m} {s:.1f}" for m, s in
                                             sorted(by_mod.items(), key=lambda kv: -kv[1]))]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenarios", nargs="*", default=list(SCENARIOS))
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--json-out")
    ap.add_argument("--from-json", help="summarise a --json-out file again, no run")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args(argv)
    if a.child:
        _child(*a.child)
        return 0
    if a.from_json:
        for p in json.load(open(a.from_json)):
            print(summarise(p, a.top))
            print()
        return 0
    profs = []
    for name in a.scenarios:
        p = run(name)
        profs.append(p)
        print(summarise(p, a.top), flush=True)
        print()
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(profs, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
