"""Each entry kernel compiles exactly one specialisation for a whole workload.

The façade casts every argument to one type per parameter (C-contiguous,
writable int64 arrays; Python ints), so a kernel never silently compiles a
second specialisation -- which would cost cold-start time on first use and
disk in the cache. A fresh process runs the workloads of ``flatradix compile``
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
    print(json.dumps({k.py_func.__module__ + "." + k.__name__: len(k.signatures) for k in KERNELS}))
""")


def test_every_kernel_compiles_one_specialisation():
    r = subprocess.run([sys.executable, "-c", WORKLOAD], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    import json

    counts = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(counts) >= 15  # every entry kernel module registered its kernels
    many = {k: n for k, n in counts.items() if n > 1}
    assert not many, f"kernels compiled more than once: {many}"
    unused = sorted(k for k, n in counts.items() if n == 0)
    # `flatradix compile` runs these workloads: every entry kernel must be reached,
    # or a warmed cache would still compile at a user's first call
    assert not unused, f"no workload of flatradix.precompile.GROUPS reaches {unused}"
