"""Each entry kernel compiles exactly one specialisation per kind of tree for a
whole workload, helpers none per constant, and a Full-only cache no component code.

The façade casts every argument to one type per parameter (C-contiguous,
writable int64 arrays; Python ints), so a kernel never silently compiles a
second specialisation -- which would cost cold-start time on first use and
disk in the cache. The one deliberate exception is ``meta``: C-contiguous for
a Full-only tree, strided when auxiliary components are configured
(``components.dispatch.meta_array``), so a kernel used by both kinds compiles
twice, the Full-only one without any SWA or Mamba rule. A fresh process runs the workloads of ``flatradix compile``
(``flatradix.precompile.GROUPS``: every public operation of Full-only, SWA,
Mamba and SWA + Mamba caches, page sizes 1 and 16, EAGLE, KV events, list /
numpy / ``array('q')`` values, the request path, step-wise eviction, reset,
growth, the host tier with each of them, storage refills with staging, every
replay mode), then torch values, and reads each kernel's compiled signatures:
one each, and none left out (what ``flatradix compile`` warms is everything).
"""

import subprocess
import sys
import textwrap

import numpy as np

WORKLOAD = textwrap.dedent("""
    import json
    import torch
    import flatradix as F
    from flatradix.kernels._jit import KERNELS
    from flatradix.precompile import GROUPS

    # every workload of `flatradix compile`, in this one process
    for name, (what, run) in GROUPS.items():
        run()
    # torch tensors as keys and values go through the facade's cast: no kernel
    # specialisation of their own
    alloc = F.TokenToKVPoolAllocator(64)
    c = F.UnifiedRadixCache(token_to_kv_pool_allocator=alloc)
    toks = torch.tensor([1, 2, 3, 4])
    c.insert(F.InsertParams(key=F.RadixKey(toks), value=torch.tensor(alloc.alloc(4))))
    m = c.match_prefix(F.MatchPrefixParams(key=F.RadixKey(toks)))
    c.dec_lock_ref(m.last_device_node, c.inc_lock_ref(m.last_device_node))
    c.evict(F.EvictParams(num_tokens=4))
    print(json.dumps({k.py_func.__module__ + "." + k.__name__: [str(a) for a in k.signatures]
                      for k in KERNELS}))
""")


def test_every_kernel_compiles_one_specialisation():
    r = subprocess.run([sys.executable, "-c", WORKLOAD], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    import json

    sigs = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(sigs) >= 15  # every entry kernel module registered its kernels
    # a Full-only and a hybrid tree differ in meta's layout only
    kinds = {k: {s.replace("Array(int64, 1, 'A',", "Array(int64, 1, 'C',") for s in v}
             for k, v in sigs.items()}
    many = {k: v for k, v in sigs.items() if len(kinds[k]) > 1 or len(v) > 2}
    assert not many, f"kernels compiled more than once per kind of tree: {many}"
    both = sum(len(v) == 2 for v in sigs.values())
    assert both >= 15, both   # the workloads run both kinds of tree
    unused = sorted(k for k, v in sigs.items() if not v)
    # `flatradix compile` runs these workloads: every entry kernel must be reached,
    # or a warmed cache would still compile at a user's first call
    assert not unused, f"no workload of flatradix.precompile.GROUPS reaches {unused}"


def _ten_a_i_plus_k(a, i, k):
    return a[i] * 10 + k


def test_a_helper_compiles_once_whatever_constants_it_is_called_with():
    """Numba types a constant argument as a literal and would compile a helper once
    per distinct constant (``emit`` 17-20 times); ``_jit.helper`` compiles one
    signature for them all, and the calls still see their own values."""
    from numba import njit

    from flatradix.kernels import _jit

    h = _jit.helper(_ten_a_i_plus_k)
    _jit.HELPERS.remove(h)

    @njit
    def caller(a):
        return h(a, 0, 1) + h(a, 1, 2) * 1000 + h(a, 2, 3) * 1000_000

    assert caller(np.array([1, 2, 3], dtype=np.int64)) == 11 + 22 * 1000 + 33 * 1000_000
    assert [str(s) for s in h.signatures] == ["(Array(int64, 1, 'C', False, aligned=True), "
                                               "int64, int64)"]


def test_meta_says_whether_components_compile():
    import numba

    from flatradix.components.dispatch import may_hold_components, meta_array
    from flatradix.engine import Engine
    from flatradix.kernels import layout as L

    for comps, aux in ((L.C_FULL, False), (L.C_FULL | L.C_SWA, True),
                       (L.C_FULL | L.C_MAMBA, True), (L.C_FULL | L.C_SWA | L.C_MAMBA, True)):
        m = meta_array(comps)
        assert m.shape == (L.META_LEN,) and m.dtype == np.int64 and not m.any()
        assert may_hold_components(numba.typeof(m)) is aux
        e = Engine(page_size=1, policy=0, components=comps)
        assert may_hold_components(numba.typeof(e.meta)) is aux
        assert int(e.meta[L.M_COMPONENTS]) == comps


FIRST_MATCH = textwrap.dedent("""
    import json, time
    from numba.core import event
    compiled = []

    class L(event.Listener):
        def on_start(self, ev):
            d = ev.data["dispatcher"]
            compiled.append(f"{d.py_func.__module__}.{d.py_func.__qualname__}")

        def on_end(self, ev):
            pass

    event.register("numba:compile", L())
    import numpy as np
    from flatradix import MatchPrefixParams, RadixKey, UnifiedRadixCache
    t = time.process_time()
    m = UnifiedRadixCache().match_prefix(MatchPrefixParams(key=RadixKey(np.arange(1, 9))))
    print(json.dumps({"cpu": time.process_time() - t, "compiled": compiled,
                      "hit": len(m.device_indices)}))
""")


def test_a_full_only_session_compiles_no_component_code(tmp_path):
    """A fresh Numba cache, a Full-only cache's first ``match_prefix``: no SWA,
    Mamba or host-tier function is compiled (issue 30: a run compiles what it uses)."""
    import json
    import os

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), FLATRADIX_QUIET_COMPILE="1")
    r = subprocess.run([sys.executable, "-c", FIRST_MATCH], capture_output=True, text=True,
                       timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["hit"] == 0
    assert any(".core.match." in f for f in got["compiled"]), got["compiled"]
    aux = [f for f in got["compiled"]
           if f.startswith(("flatradix.components.swa", "flatradix.components.mamba",
                            "flatradix.core.host", "flatradix.core.refill"))]
    assert not aux, aux
