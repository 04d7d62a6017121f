"""Cold start: ``import flatradix`` and the first ``match_prefix`` in a fresh process.

asv ``timeraw_*`` benchmarks run their code in a new interpreter (interpreter
start-up itself is not timed):

* ``timeraw_import``            ``import flatradix``
* ``timeraw_first_match_warm``  import + build a cache + first match, Numba cache warm
* ``timeraw_first_match_empty`` the same with an empty Numba cache (compiles)
* ``timeraw_first_ops_empty``   import + insert + match + lock/unlock + evict, empty cache

Targets (issue): warm < 0.5 s, empty < 15 s.

As a script it measures the same in fresh processes and prints medians::

    python benchmarks/bench_cold.py [--repeat 5] [--json-out FILE]
"""

import os
import subprocess
import sys
import tempfile

FIRST_MATCH = """
import numpy as np
import flatradix as fr
cache = fr.UnifiedRadixCache()
cache.match_prefix(fr.MatchPrefixParams(key=fr.RadixKey(np.arange(1, 9, dtype=np.int64))))
"""

FIRST_OPS = """
import numpy as np
import flatradix as fr
alloc = fr.TokenToKVPoolAllocator(1000)
cache = fr.UnifiedRadixCache(token_to_kv_pool_allocator=alloc)
key = fr.RadixKey(np.arange(1, 9, dtype=np.int64))
cache.insert(fr.InsertParams(key=key, value=alloc.alloc(8)))
m = cache.match_prefix(fr.MatchPrefixParams(key=key))
cache.dec_lock_ref(m.last_device_node, cache.inc_lock_ref(m.last_device_node))
cache.evict(fr.EvictParams(num_tokens=8))
"""

EMPTY_CACHE = "import os, tempfile; os.environ['NUMBA_CACHE_DIR'] = tempfile.mkdtemp()"


def _warm_numba_cache():
    """Run the first-use code once in a child so the (per-commit) Numba cache is warm."""
    for code in (FIRST_MATCH, FIRST_OPS):
        subprocess.run([sys.executable, "-c", code], check=True)


def timeraw_import():
    return "import flatradix"


timeraw_import.setup = _warm_numba_cache
timeraw_import.repeat = 5


def timeraw_first_match_warm():
    return FIRST_MATCH


timeraw_first_match_warm.setup = _warm_numba_cache
timeraw_first_match_warm.repeat = 5


def timeraw_first_match_empty():
    return FIRST_MATCH, EMPTY_CACHE


timeraw_first_match_empty.repeat = 2
timeraw_first_match_empty.timeout = 300


def timeraw_first_ops_empty():
    return FIRST_OPS, EMPTY_CACHE


timeraw_first_ops_empty.repeat = 2
timeraw_first_ops_empty.timeout = 300


# ------------------------------------------------------------------ script
_TIMED = """
import time, sys
{setup}
t0 = time.perf_counter()
{code}
print(time.perf_counter() - t0)
"""


def measure(code, empty, env=None):
    """Seconds for ``code`` in a fresh interpreter (start-up excluded)."""
    src = _TIMED.format(setup=EMPTY_CACHE if empty else "", code=code.strip())
    out = subprocess.run([sys.executable, "-c", src], check=True, capture_output=True,
                         text=True, env=env)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    import argparse
    import json
    import statistics

    ap = argparse.ArgumentParser(description="flatradix cold start")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    env = dict(os.environ)
    try:
        import flatradix
    except ImportError:  # a plain checkout: children import the repo's package
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), root) if p)
        sys.path.insert(0, root)
        import flatradix
    print(f"flatradix: {os.path.dirname(flatradix.__file__)}; python {sys.version.split()[0]}")
    # warm runs use a private cache dir, warmed once here (not the user's cache)
    env["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="flatradix-cold-")
    subprocess.run([sys.executable, "-c", FIRST_OPS], check=True, env=env)
    res = {}
    for name, code, empty, reps in (
            ("import", "import flatradix", False, args.repeat),
            ("import + first match_prefix, warm cache", FIRST_MATCH, False, args.repeat),
            ("import + first insert/match/lock/evict, warm cache", FIRST_OPS, False, args.repeat),
            ("import + first match_prefix, empty cache", FIRST_MATCH, True, max(2, args.repeat // 2)),
            ("import + first insert/match/lock/evict, empty cache", FIRST_OPS, True,
             max(2, args.repeat // 2))):
        xs = [measure(code, empty, env) for _ in range(reps)]
        res[name] = {"median_s": statistics.median(xs), "min_s": min(xs), "max_s": max(xs), "runs": xs}
        print(f"{name:55s} median {statistics.median(xs):7.3f} s  (min {min(xs):.3f}, "
              f"max {max(xs):.3f}, {reps} runs)", flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
