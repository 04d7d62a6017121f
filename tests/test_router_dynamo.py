"""End to end: NVIDIA Dynamo's standalone KV indexer (``python -m dynamo.indexer``,
ai-dynamo-runtime 1.6.1, the ``router-test`` extra) routes across two flatradix
caches from their KV events alone.

Two caches (page 4) each publish through their own ``ZmqEventPublisher``; both
are registered as instances of one model on an indexer subprocess. Seeded rounds
of insert / match / lock / unlock / evict / reset run over five namespaces (plain,
a ``cache_salt``, three ``extra_key`` namespaces named by ``kv_event_lora_names``,
one with a salt too), with shared prefixes and a few token ids outside u32.
After every round the test waits until each router's block set equals what a u32
router can represent (an independent model fed with the cache's own events),
then checks, for every query and instance, that the router's predicted overlap
(``POST /query`` with ``lora_name`` and ``cache_salt``) equals the tokens
``match_prefix`` returns. Halfway through, a second indexer joins late: it learns
the past from the publishers' replay sockets while the caches are idle.

Skips, saying why, where Dynamo's indexer is not installed. Seeds 0-3 by default;
``FLATRADIX_ROUTER_SEEDS=0-39`` (a range or a comma list) for a campaign.
"""

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

pytest.importorskip("zmq", reason="needs pyzmq (the events extra)")
pytest.importorskip("msgspec", reason="needs msgspec (the events extra)")
if importlib.util.find_spec("dynamo") is None or importlib.util.find_spec("dynamo.indexer") is None:
    pytest.skip("Dynamo's KV indexer is not installed: pip install -e '.[router-test]' "
                "(ai-dynamo-runtime==1.6.1)", allow_module_level=True)

from flatradix import (  # noqa: E402
    EvictParams, InsertParams, MatchPrefixParams, RadixKey, UnifiedRadixCache,
)
from flatradix.events import BlockRemoved, BlockStored, ZmqEventPublisher  # noqa: E402

PAGE = 4
LORAS = {"ek-a": "lora-a", "ek-b": "lora-b", "ek-c": ("lora-c", 3)}
NAMESPACES = [(None, None), (None, "salt-1"), ("ek-a", None), ("ek-b", "salt-1"), ("ek-c", None)]
# FLATRADIX_ROUTER_SEEDS="0-39" (or "1,5,9") runs a longer campaign
_spec = os.environ.get("FLATRADIX_ROUTER_SEEDS", "0-3")
SEEDS = (list(range(int(_spec.split("-")[0]), int(_spec.split("-")[1]) + 1)) if "-" in _spec
         else [int(x) for x in _spec.split(",")])
ROUNDS, OPS, QUERIES = 12, 40, 12  # QUERIES per namespace and round
WIDE = [-7, 1 << 32, (1 << 40) + 5]
SYNC_DEADLINE_S = 60
AGREEMENT = {}   # seed -> (agreeing pairs, pairs); printed with -s


def _lora_name(extra_key):
    v = LORAS.get(extra_key)
    return v[0] if isinstance(v, tuple) else v


class Indexer:
    """One ``python -m dynamo.indexer`` subprocess, spoken to over HTTP on 127.0.0.1.
    (Dynamo 1.6.1 binds its HTTP port on all interfaces; it has no host flag.)"""

    def __init__(self, log_path):
        for _ in range(3):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            self.log_path = log_path
            self.log = open(log_path, "ab")
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dynamo.indexer", "--port", str(port), "--threads", "1"],
                stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            self.url = f"http://127.0.0.1:{port}"
            deadline = time.time() + 60
            while time.time() < deadline and self.proc.poll() is None:
                try:
                    with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                        if r.status == 200:
                            return
                except OSError:
                    time.sleep(0.1)
            self.stop()   # port taken meanwhile, or a slow start: try another port
        pytest.fail(f"dynamo.indexer did not come up; log:\n{self.tail()}")

    def tail(self, n=4000):
        with open(self.log_path, "rb") as f:
            return f.read()[-n:].decode("utf-8", "replace")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def call(self, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode("utf-8", "replace")

    def register(self, iid, pub, model):
        status, out = self.call("/register", {
            "instance_id": iid, "endpoint": pub.endpoint, "replay_endpoint": pub.replay_endpoint,
            "model_name": model, "block_size": PAGE})
        assert status == 201, out

    def unregister(self, iid, model):
        self.call("/unregister", {"instance_id": iid, "model_name": model})

    def blocks(self, model, iids):
        """Block hashes (int64) each instance holds in the router's tree."""
        status, dump = self.call("/dump")
        assert status == 200, dump
        out = {iid: set() for iid in iids}
        for ev in dump.get(f"{model}:default", {}).get("events", []):
            stored = ev["event"]["data"].get("stored")
            if stored is not None and ev["worker_id"] in out:
                out[ev["worker_id"]].update(
                    int(np.uint64(b["block_hash"]).astype(np.int64)) for b in stored["blocks"])
        return out

    def overlap(self, model, tokens, extra_key, salt):
        """Tokens the router predicts each instance has cached, by instance id."""
        body = {"token_ids": tokens, "model_name": model}
        if extra_key is not None:
            body["lora_name"] = _lora_name(extra_key)
        if salt is not None:
            body["cache_salt"] = salt
        status, out = self.call("/query", body)
        assert status == 200, out
        return {int(i): sum(dp.values()) for i, dp in out["scores"].items()}


@pytest.fixture
def indexers(tmp_path):
    d = tmp_path
    started = []

    def start(name):
        ix = Indexer(d / f"{name}.log")
        started.append(ix)
        return ix

    yield start
    for ix in started:
        ix.stop()


class Visible:
    """Independent model of what a u32 router holds for one cache: the cache's
    own event stream, where a block counts when its tokens fit u32 and its
    parent counts."""

    def __init__(self):
        self.vis = {}

    def apply(self, events):
        for ev in events:
            if isinstance(ev, BlockStored):
                parent = ev.parent_block_hash
                for i, h in enumerate(ev.block_hashes):
                    toks = np.asarray(ev.token_ids[i * PAGE:(i + 1) * PAGE])
                    self.vis[h] = (bool(((toks >= 0) & (toks < 1 << 32)).all())
                                   and (parent is None or self.vis[parent]))
                    parent = h
            elif isinstance(ev, BlockRemoved):
                for h in ev.block_hashes:
                    del self.vis[h]
            else:
                self.vis.clear()

    def blocks(self):
        return {h for h, v in self.vis.items() if v}


class Instance:
    def __init__(self, iid):
        self.iid = iid
        self.cache = UnifiedRadixCache(page_size=PAGE, enable_kv_cache_events=True,
                                       kv_event_lora_names=LORAS)
        self.pub = ZmqEventPublisher("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*")
        self.model = Visible()
        self.locks = []

    def flush(self, always=False):
        ev = self.cache.take_events()
        self.model.apply(ev)
        if ev or always:
            self.pub.publish(ev)


def _key(rng, prefixes):
    toks = list(prefixes[int(rng.integers(len(prefixes)))])
    toks = toks[:int(rng.integers(0, len(toks) + 1))] + [
        int(x) for x in rng.integers(0, 6, size=int(rng.integers(0, 14)))]
    if toks and rng.random() < 0.05:
        toks[int(rng.integers(len(toks)))] = WIDE[int(rng.integers(len(WIDE)))]
    return toks


def _op(rng, inst, prefixes):
    c = inst.cache
    r = rng.random()
    ek, salt = NAMESPACES[int(rng.integers(len(NAMESPACES)))]
    key = RadixKey(_key(rng, prefixes), ek, salt)
    if r < 0.45:
        c.insert(InsertParams(key=key))
    elif r < 0.60:
        c.match_prefix(MatchPrefixParams(key=key))
    elif r < 0.75:
        m = c.match_prefix(MatchPrefixParams(key=key))
        if not c.is_root(m.last_device_node):
            inst.locks.append((m.last_device_node, c.inc_lock_ref(m.last_device_node)))
    elif r < 0.85:
        if inst.locks:
            node, receipt = inst.locks.pop(int(rng.integers(len(inst.locks))))
            c.dec_lock_ref(node, receipt)
    elif r < 0.99:
        c.evict(EvictParams(num_tokens=int(rng.integers(1, 48))))
    else:
        c.reset()
        inst.locks.clear()   # their ids went stale with the tree


def _wait_synced(routers, model, insts):
    want = {i.iid: i.model.blocks() for i in insts}
    deadline = time.time() + SYNC_DEADLINE_S
    while True:
        got = [r.blocks(model, want) for r in routers]
        if all(g == want for g in got):
            return
        if time.time() > deadline:
            diff = {(k, iid): (len(g[iid] - want[iid]), len(want[iid] - g[iid]))
                    for k, g in enumerate(got) for iid in want if g[iid] != want[iid]}
            pytest.fail(f"routers never matched the caches' blocks ((router, instance): "
                        f"(extra, missing)) {diff}\n{routers[-1].tail()}")
        time.sleep(0.05)


@pytest.mark.parametrize("seed", SEEDS)
def test_dynamo_router_predicts_match_prefix_for_every_query_and_instance(seed, indexers):
    early = indexers(f"early-{seed}")
    rng = np.random.default_rng(seed)
    model = f"flatradix-seed{seed}"
    insts = [Instance(10 * seed + k + 1) for k in range(2)]
    for inst in insts:
        early.register(inst.iid, inst.pub, model)
    routers = [early]
    prefixes = [[int(x) for x in rng.integers(0, 40, size=int(rng.integers(4, 24)))] for _ in range(5)]
    agree = pairs = 0
    try:
        for inst in insts:   # the constructor's AllBlocksCleared is seq 0
            inst.flush(always=True)
        for rnd in range(ROUNDS):
            if rnd == ROUNDS // 2:   # a router joining late learns the past by replay
                late = indexers(f"late-{seed}")
                for inst in insts:
                    late.register(inst.iid, inst.pub, model)
                routers.append(late)
            for _ in range(OPS):
                inst = insts[int(rng.integers(2))]
                _op(rng, inst, prefixes)
                inst.flush()
            for inst in insts:   # one batch each per round, so a late router sees a gap
                inst.flush(always=True)
            _wait_synced(routers, model, insts)
            for ek, salt in NAMESPACES:
                for _ in range(QUERIES):
                    toks = _key(rng, prefixes)
                    if any(not 0 <= t < 1 << 32 for t in toks):
                        continue   # a router takes u32 tokens only
                    want = {i.iid: len(i.cache.match_prefix(MatchPrefixParams(
                        key=RadixKey(toks, ek, salt))).device_indices) for i in insts}
                    for r in routers:
                        got = r.overlap(model, toks, ek, salt)
                        for iid, n in want.items():
                            pairs += 1
                            agree += got.get(iid, 0) == n
                            assert got.get(iid, 0) == n, (
                                f"seed {seed} round {rnd}: router {routers.index(r)} predicts "
                                f"{got.get(iid, 0)} tokens of {toks} in namespace {(ek, salt)} on "
                                f"instance {iid}; match_prefix gives {n}")
    finally:
        AGREEMENT[seed] = (agree, pairs)
        print(f"seed {seed}: {agree}/{pairs} (query, instance, router) pairs agree")
        for inst in insts:
            inst.pub.close()
    assert pairs > 0


# ---------------------------------------------------------------- the fleet's kv router
def test_fleet_kv_router_sees_what_dynamo_indexer_sees(indexers):
    """A fleet replay (3 instances, the kv router, page 4, pools small enough to
    evict) publishes each instance's KV events to Dynamo's indexer as its router
    reads them. At every 4th routing decision, once the indexer holds the same
    blocks as the router's index: for each instance, the overlap the router saw
    (pages x page size) equals the tokens Dynamo's indexer predicts for the same
    prompt, and the tokens the instance's cache matches."""
    from flatradix.replay import synthetic_workload
    from flatradix.replay.config import ReplayConfig
    from flatradix.replay.fleet import Fleet
    from flatradix.replay.sim import warm_up_for

    w = synthetic_workload(160, seed=7)
    cfg = ReplayConfig(capacity=9_000, page_size=PAGE, max_running=2)
    warm_up_for(cfg)
    fleet = Fleet(w, [cfg] * 3, "kv", seed=1)
    ix = indexers("fleet")
    model = "flatradix-fleet"
    pubs = [ZmqEventPublisher("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*")
            for _ in fleet.instances]
    iids = [101, 102, 103]
    for iid, pub in zip(iids, pubs):
        ix.register(iid, pub, model)
    for pub in pubs:
        pub.publish([])     # seq 0: the indexer has seen each publisher
    apply = fleet.index.apply

    def apply_and_publish(k, events):
        apply(k, events)
        pubs[k].publish(events)

    fleet.index.apply = apply_and_publish
    route = fleet.router.route
    checked = removed = seen = 0

    def checking_route(f, i, toks):
        nonlocal checked, seen
        k = route(f, i, toks)
        if i % 4:
            return k
        want = {iid: set(f.index.digests[j]) for j, iid in enumerate(iids)}
        deadline = time.time() + SYNC_DEADLINE_S
        while ix.blocks(model, iids) != want:
            assert time.time() < deadline, f"the indexer never held the router's blocks\n{ix.tail()}"
            time.sleep(0.05)
        got = ix.overlap(model, [int(t) for t in toks], None, None)
        for j, iid in enumerate(iids):
            mine = f.last_overlaps[j] * PAGE
            assert got.get(iid, 0) == mine, (i, j, got, f.last_overlaps)
            seen += mine > 0
            cache = f.instances[j].cache
            assert len(cache.match_prefix(MatchPrefixParams(key=RadixKey(toks))).device_indices) \
                == mine, (i, j)
            checked += 1
        return k

    fleet.router.route = checking_route
    try:
        for i in range(len(w)):
            fleet.step(i)
            removed += sum(s.c.evicted for s in fleet.instances) > 0
    finally:
        for pub in pubs:
            pub.close()
    assert checked == 3 * len(range(0, len(w), 4))
    # the checks saw cached prefixes, and evictions (removals) happened before them
    assert seen > 10 and removed > 20 and sum(s.c.hit_tokens for s in fleet.instances) > 0
