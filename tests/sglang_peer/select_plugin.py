"""pytest plug-in for the peer runs: keep only the tests listed in ``$FLATRADIX_PEER_SELECT``.

``run.sh`` always appends SGLang's whole unit file to the command line, so a
run of a recorded subset (node ids, one a line) deselects the rest here.
Loaded with ``-p select_plugin`` (its directory on ``PYTHONPATH``).
"""

import os


def pytest_collection_modifyitems(config, items):
    path = os.environ.get("FLATRADIX_PEER_SELECT")
    if not path:
        return
    with open(path) as f:
        wanted = {line.strip() for line in f if line.strip() and not line.startswith("#")}
    keep, drop = [], []
    for item in items:
        (keep if item.nodeid in wanted else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
