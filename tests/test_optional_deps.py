"""Optional dependencies: without an extra, the feature that needs it says which
extra to install (a ``ModuleNotFoundError`` naming the module, so ``except
ImportError`` and ``pytest.importorskip`` still work); the core never needs it."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# sys.modules[name] = None makes `import name` raise ModuleNotFoundError, as when
# the package is not installed
BLOCK = "import sys\nfor m in {mods!r}:\n    sys.modules[m] = None\n"


def _run(mods, code):
    r = subprocess.run([sys.executable, "-c", BLOCK.format(mods=mods) + code],
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_events_without_msgspec_names_the_extra():
    out = _run(["msgspec"], """
try:
    import flatradix.events
except ModuleNotFoundError as e:
    print(e.name, "|", e)
import flatradix
try:
    flatradix.UnifiedRadixCache(enable_kv_cache_events=True)
except ImportError as e:
    print(e.name, "|", e)
c = flatradix.UnifiedRadixCache()          # the core does not need it
print("core ok", c.evictable_size())
""")
    lines = out.strip().splitlines()
    want = ("msgspec | flatradix.events (KV cache events) needs msgspec: pip install "
            "'flatradix[events]' (msgspec and pyzmq)")
    assert lines == [want, want, "core ok 0"], out


def test_the_publisher_without_pyzmq_names_the_extra():
    out = _run(["zmq"], """
from flatradix.events import ZmqEventPublisher
try:
    ZmqEventPublisher("tcp://127.0.0.1:5999")
except ModuleNotFoundError as e:
    print(e.name, "|", e)
""")
    assert out.strip() == ("zmq | ZmqEventPublisher needs pyzmq: pip install "
                           "'flatradix[events]' (msgspec and pyzmq)"), out
