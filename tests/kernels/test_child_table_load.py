"""Regression: insert/evict churn must never fill the child table.

The mutating kernels check node slots, pool rows *and* the child table's load
(``kernels/state.py: has_room``) before they change anything, and answer
E_CAPACITY so that the façade purges tombstones or grows the table. Without the
load check, ~2,000 live leaves
after a node-table doubling (the table was sized for the live count, not the
node capacity), or long insert/evict churn (tombstones are only purged by a
rebuild), left no EMPTY entry and the next probe looped forever; the replay's
capacity sweep hung on the Mooncake trace at a 16M-token pool. Each scenario
runs in a subprocess so a regression fails on the timeout instead of hanging.
"""

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

PRELUDE = """
import numpy as np
from flatradix import EvictParams, InsertParams, MatchPrefixParams, RadixKey, UnifiedRadixCache
tok = 0
def ins(c, k):
    global tok
    for _ in range(k):
        tok += 1
        c.insert(InsertParams(key=RadixKey(np.array([tok], np.int64)),
                              value=np.array([tok], np.int64)))
"""

SCENARIOS = {
    # the node table doubles (1024 -> 2048) while the child table keeps its size;
    # live leaves then grow to ~2,100 through evict/insert churn
    "live_after_node_growth": """
c = UnifiedRadixCache(page_size=1)
ins(c, 1100)
for r in range(40):
    c.evict(EvictParams(num_tokens=50))
    ins(c, 80)
    c.match_prefix(MatchPrefixParams(key=RadixKey([10**12])))
""",
    # no growth at all (a large pool): tombstones pile up round after round
    "tombstone_churn": """
c = UnifiedRadixCache(page_size=1, pool_capacity=1 << 20)
for r in range(60):
    ins(c, 700)
    c.evict(EvictParams(num_tokens=10**9))
    c.match_prefix(MatchPrefixParams(key=RadixKey([10**12])))
""",
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_churn_never_fills_the_child_table(name):
    code = textwrap.dedent(PRELUDE) + textwrap.dedent(SCENARIOS[name]) + "c.sanity_check()\nprint('ok')\n"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name}: no answer in 240 s (a child-table probe without an EMPTY entry?)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")
