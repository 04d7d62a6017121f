"""Adding a component touches its own module, the layout's column list and one
dispatch entry (issue 31's proof): a test-only fourth component, "shadow", that
mirrors each node's Full device value (its first KV index) in a column of its own.

The test copies the package, makes exactly these three edits --

* ``flatradix/components/shadow.py`` (new): the component's rules;
* ``flatradix/kernels/layout.py``: ``("SHADOW", 1)`` appended to ``NODE_COLUMNS``;
* ``flatradix/components/dispatch.py``: ``"shadow"`` appended to ``COMPONENTS``

-- and drives an engine built with ``C_FULL | shadow.BIT`` through the core API
(``Engine.k``: inserts, matches that split, evictions) in a fresh process with its
own Numba cache. Every ``sanity_check`` runs the shadow's own check
(``dispatch.check_node``), and the test reads the column through the node table
against the pool; a corrupted column is reported with the shadow's code.
"""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import flatradix

RULES = textwrap.dedent('''
    """Test-only component "shadow": each node's first Full device KV index + 1 in
    node column ``SHADOW`` (0: no device value), kept by its own rules."""

    from ..kernels._jit import helper
    from ..kernels.layout import F_HAS_FULL_DEV, FLAGS, FULL_DEV, KEY_OFF, M_COMPONENTS, OK, column

    ID = 3
    BIT = 1 << ID
    COL = column("SHADOW")
    BAD = 130  # its sanity_check code


    @helper
    def want(nodes, pool, s):
        """What the column must hold at live node ``s``."""
        if nodes[s, FLAGS] & F_HAS_FULL_DEV:
            return pool[nodes[s, KEY_OFF], FULL_DEV] + 1
        return 0


    @helper
    def split(nodes, pool, meta, u, child):
        nodes[u, COL] = want(nodes, pool, u)
        nodes[child, COL] = want(nodes, pool, child)


    @helper
    def commit_leaf(nodes, pool, meta, leaf, start, end, cursor, track, acts):
        nodes[leaf, COL] = want(nodes, pool, leaf)


    @helper
    def drop_device(nodes, pool, meta, s, at, out, acts):
        nodes[s, COL] = 0


    @helper
    def check_node(nodes, meta, s, n, full_lock, tally):
        on = (meta[M_COMPONENTS] & BIT) != 0
        x = nodes[s, COL]
        if (not on and x != 0) or x < 0:
            return BAD, s
        return OK, -1


    @helper
    def check_end(nodes, meta, hwm, tally):
        return OK, -1
''')

WORKLOAD = textwrap.dedent('''
    import json
    import numpy as np
    from flatradix.components import dispatch, shadow
    from flatradix.engine import Engine
    from flatradix.kernels import layout as L

    assert dispatch.COMPONENTS[-1] == "shadow", dispatch.COMPONENTS
    eng = Engine(page_size=1, policy=L.POLICY_LRU, components=L.C_FULL | shadow.BIT,
                 node_capacity=16, pool_capacity=64)
    rng = np.random.default_rng(7)
    next_value = 1
    checked = splits = 0

    def mirror_ok():
        """Every live node's column holds its mirror (read from the pool here)."""
        global checked
        nodes, pool = eng.st.nodes, eng.st.pool
        for s in eng.live_slots().tolist():
            if s != L.ROOT:
                assert nodes[s, shadow.COL] == shadow.want(nodes, pool, s), s
                checked += 1

    for step in range(400):
        n = int(rng.integers(1, 12))
        key = rng.integers(0, 4, size=n).astype(np.int64)
        if rng.random() < 0.6:
            value = np.arange(next_value, next_value + n, dtype=np.int64)
            next_value += n
            st, plen, target, _ = eng.k.insert(key, value, n, 0, 0, 0, L.VALUES_NONNEG, 0, 0,
                                               0, -1, 0)
            assert st == L.OK
        elif rng.random() < 0.7:
            before = int(eng.meta[L.M_NLIVE])
            eng.k.match_prefix(key, n, 0, np.empty(n, dtype=np.int64))
            splits += int(eng.meta[L.M_NLIVE]) - before
        else:
            want = np.array([int(rng.integers(1, 20)), 0, 0], dtype=np.int64)
            done = np.zeros(3, dtype=np.int64)
            phase = 0
            while True:
                st, phase = eng.k.evict(want, done, phase)
                if st == L.OK:
                    break
                eng.grow()
        code, slot = eng.k.sanity_check()
        assert code == 0, (step, code, slot)
        mirror_ok()
    # a corrupted mirror is the shadow's finding
    s = next(x for x in eng.live_slots().tolist() if x != L.ROOT)
    eng.st.nodes[s, shadow.COL] = -5
    code, slot = eng.k.sanity_check()
    print(json.dumps({"checked": checked, "splits": splits, "code": int(code),
                      "slot_ok": int(slot) == s}))
''')


@pytest.mark.slow
def test_a_fourth_component_is_three_edits(tmp_path):
    """The shadow component, added by touching only ``components/shadow.py``,
    ``kernels/layout.py`` (one column) and ``components/dispatch.py`` (one entry), is
    chained into the tree core's hooks: it keeps its column through the engine's
    inserts, splits and evictions, and ``sanity_check`` runs its check."""
    src = Path(flatradix.__file__).parent
    pkg = tmp_path / "pkg" / "flatradix"
    shutil.copytree(src, pkg, ignore=shutil.ignore_patterns("__pycache__", "replay", "data"))
    (pkg / "components" / "shadow.py").write_text(RULES)
    layout = pkg / "kernels" / "layout.py"
    text = layout.read_text()
    anchor = '    ("DUP_NEXT", 1),     # order they became duplicates; F_DUP marks members) (dups only)\n'
    assert text.count(anchor) == 1
    layout.write_text(text.replace(anchor, anchor + '    ("SHADOW", 1),       # test-only\n'))
    dispatch = pkg / "components" / "dispatch.py"
    text = dispatch.read_text()
    assert text.count('COMPONENTS = ("swa", "mamba")') == 1
    dispatch.write_text(text.replace('COMPONENTS = ("swa", "mamba")',
                                     'COMPONENTS = ("swa", "mamba", "shadow")'))
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "pkg"),
               NUMBA_CACHE_DIR=str(tmp_path / "numba"), FLATRADIX_QUIET_COMPILE="1")
    r = subprocess.run([sys.executable, "-c", WORKLOAD], capture_output=True, text=True,
                       env=env, timeout=1200, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]
    import json

    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["checked"] > 1000 and got["splits"] > 10, got
    assert got["code"] == 130 and got["slot_ok"], got
