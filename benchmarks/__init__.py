"""flatradix benchmark suite (asv) and peer-comparison scripts.

asv imports this package before any benchmark module. Under asv each commit
gets its own Numba cache directory (``$ASV_ENV_DIR/numba/$ASV_COMMIT``): Numba
does not notice edits in other modules a cached function calls, so two commits
must never share compiled kernels (``../shared/spec/numba_and_interop.md`` §1.5).
Outside asv (plain ``python benchmarks/<script>.py``) nothing is changed.
"""

import os

if os.environ.get("ASV_ENV_DIR") and os.environ.get("ASV_COMMIT"):
    os.environ["NUMBA_CACHE_DIR"] = os.path.join(
        os.environ["ASV_ENV_DIR"], "numba", os.environ["ASV_COMMIT"])
