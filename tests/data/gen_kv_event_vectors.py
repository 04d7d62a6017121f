"""Record KV-event hash test vectors from SGLang 0.5.23's own cache (run once, in
the oracle venv of ../shared/tools/setup_sglang_oracle.sh):

    SGLANG_USE_CPU_ENGINE=1 SGLANG_RUST_BUILD_MODE=never \\
    PYTHONPATH=$VENV/peer_stubs $VENV/bin/python tests/data/gen_kv_event_vectors.py

Writes tests/data/kv_event_vectors.json: for each case, the exact inputs (page
size, EAGLE flag, the inserts with their namespaces, then one evict of
everything) and the events SGLang emitted (tagged dicts), for both of its tree
cores. tests/test_events.py replays the inputs through flatradix and compares.
"""

import json
import pathlib
import sys
from array import array

import torch

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

CASES = [
    {"name": "plain_p1", "page_size": 1, "eagle": False,
     "inserts": [{"tokens": [1, 2, 3, 4]}, {"tokens": [1, 2, 5, 6, 7]}]},
    {"name": "plain_p2_chain", "page_size": 2, "eagle": False,
     "inserts": [{"tokens": [1, 2, 3, 4, 5, 6]}, {"tokens": [1, 2, 3, 4, 7, 8]}]},
    {"name": "plain_p4_big_tokens", "page_size": 4, "eagle": False,
     "inserts": [{"tokens": [151000, 3, 99999, 7, 4294967295, 0, 12, 13]}]},
    {"name": "salt_p2", "page_size": 2, "eagle": False,
     "inserts": [{"tokens": [1, 2, 3, 4], "cache_salt": "s1"},
                 {"tokens": [1, 2, 3, 4], "cache_salt": "s2"},
                 {"tokens": [1, 2, 3, 4, 9, 9], "cache_salt": "s1"}]},
    {"name": "plain_p16_long", "page_size": 16, "eagle": False,
     "inserts": [{"tokens": list(range(1000, 1064))}, {"tokens": list(range(1000, 1032)) + list(range(5, 37))}]},
    {"name": "eagle_p1", "page_size": 1, "eagle": True,
     "inserts": [{"tokens": [1, 2, 3, 4, 5]}, {"tokens": [1, 2, 3, 9, 9]}]},
    {"name": "eagle_p4", "page_size": 4, "eagle": True,
     "inserts": [{"tokens": list(range(1, 10))}]},
]


def run(case, backend):
    P = case["page_size"]
    alloc = TokenToKVPoolAllocator(4096, torch.float16, "cpu", None, False)
    params = CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=alloc,
                             page_size=P, eviction_policy="lru", is_eagle=case["eagle"],
                             enable_kv_cache_events=True, tree_components=(ComponentType.FULL,),
                             tree_core_backend=backend)
    cache = UnifiedRadixCache(params)
    cache.take_events()
    for ins in case["inserts"]:
        toks = array("q", ins["tokens"])
        key = RadixKey(toks, ins.get("extra_key"), cache_salt=ins.get("cache_salt"))
        n = len(toks) - (1 if case["eagle"] else 0)
        n -= n % P
        value = alloc.alloc(n) if n else torch.empty(0, dtype=torch.int64)
        cache.insert(InsertParams(key=key, value=value))
    cache.evict(EvictParams(num_tokens=10 ** 6))
    out = []
    for ev in cache.take_events():
        d = {"type": type(ev).__name__}
        for f in ("block_hashes", "parent_block_hash", "token_ids", "block_size", "medium", "cache_salt"):
            if hasattr(ev, f):
                v = getattr(ev, f)
                if f == "token_ids":
                    v = [list(t) if isinstance(t, (tuple, list)) else int(t) for t in v]
                d[f] = v
        out.append(d)
    return type(cache.tree_core).__name__, out


def main():
    result = {"sglang": "0.5.23", "cases": []}
    for case in CASES:
        per_backend = {}
        for backend in ("python", "rust"):
            core, events = run(case, backend)
            per_backend[core] = events
        cores = list(per_backend)
        assert per_backend[cores[0]] == per_backend[cores[-1]], (case["name"], per_backend)
        result["cases"].append(dict(case, events=per_backend[cores[0]], cores=cores))
    path = pathlib.Path(__file__).with_name("kv_event_vectors.json")
    path.write_text(json.dumps(result, indent=1) + "\n")
    print("wrote", path, file=sys.stderr)


if __name__ == "__main__":
    main()
