"""flatradix's SGLang TreeCore with device values (issue 29), run in the oracle venv.

    python -m tests.oracle.device_probe [--steps N] [--seed S]

One seeded stream of TreeCore calls (``begin_insert`` / ``end_insert`` with KV
indices or without (the token ids), ``match_prefix`` + ``collect_full_device_
indices``, locks, the pick-then-evict rounds, ``get_component_device_value``,
``all_values_flatten``, ``walk_for_kv_canary``, ``reset``) on three TreeCores:

* ``host``: CPU tensors, host values (``FLATRADIX_DEVICE_VALUES=0``);
* ``arena``: CPU tensors through the device value arena (``=1``);
* ``meta``: an allocator on torch's ``meta`` device (the arena, no data: any
  host read raises), every call inside ``tests.device_harness.SyncCounter``.

``host`` and ``arena`` must return the same values; ``meta`` the same lengths
and zero syncing ops. Prints ``DEVICE_PROBE {json}`` (read by
``tests/test_device_values.py``); exit status 1 on a difference.
"""

import argparse
import json
import os
import random
import sys
from array import array

import torch

from flatradix.sglang import _factory as make_tree_core
from sglang.srt.mem_cache.base_prefix_cache import (
    DecLockRefParams,
    InsertParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

from tests.device_harness import SyncCounter

FULL = ComponentType.FULL


class _Alloc:
    """What the TreeCore reads of an allocator: its device and size."""

    page_size = 1

    def __init__(self, size, device):
        self.size = size
        self.device = device


def _core(mode, page):
    os.environ["FLATRADIX_DEVICE_VALUES"] = "0" if mode == "host" else "1"
    device = "meta" if mode == "meta" else "cpu"
    params = CacheInitParams(disable=False, req_to_token_pool=None,
                             token_to_kv_pool_allocator=_Alloc(4096, device), page_size=page,
                             eviction_policy="lru", tree_components=(FULL,))
    core = make_tree_core(params, {})
    assert (core._dev is not None) == (mode != "host"), mode
    return core, torch.device(device)


def _v(mode, t):
    if t is None:
        return None
    if mode == "meta":
        assert t.device.type == "meta", t.device
        return ("len", int(t.shape[0]))
    return ("len", int(t.shape[0]), t.tolist())


def _frees(mode, res):
    """The step's device frees, drained (SGLang's results insist)."""
    out = {int(c): [_v(mode, t) for t in ts] for c, ts in res.device_frees.items() if ts}
    res.device_frees.clear()
    return out


def _actions(mode, acts):
    out = []
    for a in acts:
        ts = getattr(a, "indices", None) or getattr(a, "device_indices", None) or []
        if isinstance(ts, torch.Tensor):
            ts = [ts]
        out.append((type(a).__name__, [_v(mode, t) for t in ts]))
    return out


def stream(mode, seed, steps, page=2):
    rng = random.Random(seed)
    core, device = _core(mode, page)
    counter = SyncCounter() if mode == "meta" else None
    log = []
    locks = []
    prefixes = [[rng.randrange(1, 40) for _ in range(rng.randrange(2, 10))] for _ in range(4)]
    next_slot = [1]

    def call(fn, *a):
        if counter is None:
            return fn(*a)
        with counter:
            return fn(*a)

    def key():
        return list(rng.choice(prefixes)) + [rng.randrange(100, 130)
                                             for _ in range(rng.randrange(0, 8))]

    for _ in range(steps):
        r = rng.random()
        if r < 0.35:
            toks = key()
            n = len(toks)
            if rng.random() < 0.8:
                vals = torch.arange(next_slot[0], next_slot[0] + n, dtype=torch.int64)
                next_slot[0] += n
                value = vals.to(device)
            else:
                value = None
            st = call(core.begin_insert, InsertParams(key=RadixKey(array("q", toks)),
                                                      value=value,
                                                      prev_prefix_len=rng.randrange(0, n + 1)))
            call(core.end_insert)
            log.append(("insert", st.result.prefix_len, st.result.last_device_node,
                        _actions(mode, st.actions)))
        elif r < 0.6:
            toks = key()
            m = call(core.match_prefix, MatchPrefixParams(key=RadixKey(array("q", toks))))
            idx = call(core.collect_full_device_indices, m.last_device_node,
                       core.root_node_handle())
            log.append(("match", m.device_prefix_len, m.last_device_node, _v(mode, idx)))
            if rng.random() < 0.5 and m.device_prefix_len:
                locks.append((m.last_device_node,
                              call(core.inc_lock_ref, m.last_device_node)))
        elif r < 0.7 and locks:
            nid, receipt = locks.pop(rng.randrange(len(locks)))
            try:
                call(core.dec_lock_ref, nid, DecLockRefParams(
                    node_id=nid, skipped_lock_components=receipt.skipped_lock_components))
                log.append(("unlock", nid))
            except KeyError:   # evicted / reset meanwhile
                log.append(("unlock-stale", nid))
        elif r < 0.85:
            call(core.evict_device_start, FULL, rng.randrange(1, 16))
            tracker = {}
            for _ in range(20):
                step = call(core.evict_device_next_node, FULL, tracker)
                row = ["pick", step.node_id, _frees(mode, step)]
                if step.node_id is not None:
                    leaf = call(core.evict_device_leaf, step.node_id, False)
                    row.append(_frees(mode, leaf))
                    for c, k in leaf.tracker.items():
                        tracker[c] = tracker.get(c, 0) + k
                log.append(tuple(row))
                if not step.made_progress:
                    break
            call(core.evict_device_end, FULL)
        elif r < 0.93:
            log.append(("flat", _v(mode, call(core.all_values_flatten))))
            w = call(core.walk_for_kv_canary, False, False)
            log.append(("canary", _v(mode, w.slot_indices), _v(mode, w.prev_slot_indices),
                        _v(mode, w.positions)))
            m = call(core.match_prefix, MatchPrefixParams(key=RadixKey(array("q", key()))))
            log.append(("value", _v(mode, call(core.get_component_device_value,
                                              m.last_device_node, FULL))))
        elif r < 0.95:
            call(core.reset)
            locks.clear()
            log.append(("reset",))
        log.append(("sizes", core.evictable_size(), core.protected_size(), core.total_size()))
    if mode != "meta":
        core.sanity_check(None, None)
    return log, (None if counter is None else (counter.syncs(), counter.ops,
                                               dict(counter.counts)))


def _shape_only(x):
    if isinstance(x, tuple) and x and x[0] == "len":
        return x[:2]
    if isinstance(x, (tuple, list)):
        return type(x)(_shape_only(y) for y in x)
    if isinstance(x, dict):
        return {k: _shape_only(v) for k, v in x.items()}
    return x


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args(argv)
    report = {"streams": 0, "calls_checked": 0, "syncs": 0, "meta_ops": 0, "differences": []}
    for seed in range(args.seed, args.seed + args.seeds):
        host, _ = stream("host", seed, args.steps)
        arena, _ = stream("arena", seed, args.steps)
        meta, (syncs, ops, counts) = stream("meta", seed, args.steps)
        report["streams"] += 1
        report["calls_checked"] += len(host)
        report["syncs"] += syncs
        report["meta_ops"] += ops
        if host != arena:
            i = next(i for i, (a, b) in enumerate(zip(host, arena)) if a != b)
            report["differences"].append(f"seed {seed}: host/arena differ at {i}: "
                                         f"{host[i]!r} != {arena[i]!r}")
        elif _shape_only(arena) != meta:
            i = next(i for i, (a, b) in enumerate(zip(_shape_only(arena), meta)) if a != b)
            report["differences"].append(f"seed {seed}: arena/meta differ at {i}: "
                                         f"{_shape_only(arena)[i]!r} != {meta[i]!r}")
        if syncs:
            report["differences"].append(f"seed {seed}: {syncs} syncing ops on meta: {counts}")
    print("DEVICE_PROBE " + json.dumps(report))
    return 1 if report["differences"] else 0


if __name__ == "__main__":
    sys.exit(main())
