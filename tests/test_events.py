"""KV events: SGLang 0.5.23's hashes bit for bit (vectors recorded from its own
cache by tests/data/gen_kv_event_vectors.py), the scenarios B6/B7/B8 of
known_bugs.md, the msgpack wire format, and a real ZMQ SUB subscriber."""

import hashlib
import json
import pathlib

import msgspec
import numpy as np
import pytest

from flatradix import (
    EvictParams, InsertParams, MatchPrefixParams, RadixKey, UnifiedRadixCache,
)
from flatradix.events import (
    AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, ZmqEventPublisher, decode_batch,
    encode_batch,
)
from flatradix.kernels.hashing import sha256

VECTORS = json.loads((pathlib.Path(__file__).parent / "data" / "kv_event_vectors.json").read_text())


def as_dicts(events):
    out = []
    for ev in events:
        d = {"type": type(ev).__name__}
        for f in ("block_hashes", "parent_block_hash", "token_ids", "block_size", "medium", "cache_salt"):
            if hasattr(ev, f):
                v = getattr(ev, f)
                if f == "token_ids":
                    v = [list(t) if isinstance(t, (tuple, list)) else int(t) for t in v]
                d[f] = v
        out.append(d)
    return out


@pytest.mark.parametrize("case", VECTORS["cases"], ids=[c["name"] for c in VECTORS["cases"]])
def test_hashes_match_sglang_bit_for_bit(case):
    P = case["page_size"]
    c = UnifiedRadixCache(page_size=P, is_eagle=case["eagle"], enable_kv_cache_events=True)
    assert [type(e) for e in c.take_events()] == [AllBlocksCleared]
    for ins in case["inserts"]:
        c.insert(InsertParams(key=RadixKey(ins["tokens"], ins.get("extra_key"), ins.get("cache_salt"))))
    c.evict(EvictParams(num_tokens=10 ** 6))
    assert as_dicts(c.take_events()) == case["events"]


def test_sha256_kernel_matches_hashlib():
    rng = np.random.default_rng(0)
    msg = np.zeros(400, dtype=np.uint8)
    state = np.zeros(8, dtype=np.uint64)
    w = np.zeros(64, dtype=np.uint64)
    for n in [0, 1, 55, 56, 63, 64, 65, 119, 200, 320]:
        data = rng.integers(0, 256, size=n, dtype=np.uint8)
        msg[:n] = data
        sha256(msg, n, state, w)
        got = b"".join(int(x).to_bytes(4, "big") for x in state)
        assert got == hashlib.sha256(data.tobytes()).digest()


def test_b6_namespaces_never_share_hashes():
    def run(with_s1):
        c = UnifiedRadixCache(page_size=2, enable_kv_cache_events=True)
        c.take_events()
        c.insert(InsertParams(key=RadixKey([1, 2, 3, 4])))
        if with_s1:
            c.insert(InsertParams(key=RadixKey([1, 2, 3, 4], extra_key="s1")))
        c.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3, 4])))
        c.evict(EvictParams(num_tokens=4))
        return c.take_events()

    ev = run(True)
    stored = [e for e in ev if isinstance(e, BlockStored)]
    assert len(stored) == 2 and all(len(e.block_hashes) == 2 for e in stored)
    plain, ns = stored[0].block_hashes, stored[1].block_hashes
    assert len(set(plain) | set(ns)) == 4
    assert plain == [e for e in run(False) if isinstance(e, BlockStored)][0].block_hashes
    removed = [e for e in ev if isinstance(e, BlockRemoved)]
    assert len(removed) == 1 and removed[0].block_hashes == ns


def test_b7_every_block_has_its_own_parent():
    c = UnifiedRadixCache(page_size=2, enable_kv_cache_events=True)
    c.take_events()
    c.insert(InsertParams(key=RadixKey([1, 2, 3, 4, 5, 6])))
    c.insert(InsertParams(key=RadixKey([1, 2, 3, 4, 7, 8])))
    c.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3])))
    ev = c.take_events()
    assert len(ev) == 2
    first, second = ev
    h1, h2, h3 = first.block_hashes
    assert first.parent_block_hash is None  # h1's parent; h2 -> h1, h3 -> h2 by the chain
    assert second.block_hashes != [h3] and len(second.block_hashes) == 1
    assert second.parent_block_hash == h2
    for e in ev:
        assert len(e.token_ids) == e.block_size * len(e.block_hashes)
    # the split caused by the match emitted nothing and changed no stored hash
    assert c.block_hashes() == {h1, h2, h3, second.block_hashes[0]}


def test_b8_every_free_path_emits_removal():
    c = UnifiedRadixCache(page_size=2, enable_kv_cache_events=True)
    c.take_events()
    c.insert(InsertParams(key=RadixKey([1, 2, 3, 4])))
    c.insert(InsertParams(key=RadixKey([1, 2, 5, 6])))
    # drop the [5, 6] leaf through the step-wise (controller-driven) path
    c.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3, 4])))
    c.evict_device_start(num_tokens=2)
    step = c.evict_device_next_node()
    assert step.num_tokens == 2
    c.evict_device_end()
    c.evict(EvictParams(num_tokens=100))
    c.reset()
    ev = c.take_events()
    stored = [h for e in ev if isinstance(e, BlockStored) for h in e.block_hashes]
    removed = [h for e in ev if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert len(stored) == 3 and sorted(stored) == sorted(removed)
    assert isinstance(ev[-1], AllBlocksCleared)
    assert sum(isinstance(e, AllBlocksCleared) for e in ev) == 1


def test_events_off_means_no_queue_and_no_hash_columns():
    c = UnifiedRadixCache(page_size=1)
    c.insert(InsertParams(key=RadixKey([1, 2, 3])))
    assert c.take_events() == []
    assert c._pool.shape[1] == 2


def test_wire_format_is_tagged_maps_in_a_positional_batch():
    batch = KVEventBatch(1.5, [BlockStored([1, 2], None, [7, 8], 1, None, "GPU"),
                               BlockRemoved([1], "GPU"), AllBlocksCleared()], 0)
    raw = msgspec.msgpack.decode(encode_batch(batch))
    assert raw[0] == 1.5 and raw[2] == 0
    assert raw[1][0] == {"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None,
                         "token_ids": [7, 8], "block_size": 1, "lora_id": None, "medium": "GPU"}
    assert raw[1][2] == {"type": "AllBlocksCleared"}
    assert decode_batch(encode_batch(batch)) == batch


def test_zmq_subscriber_rebuilds_live_blocks():
    zmq = pytest.importorskip("zmq")
    pub = ZmqEventPublisher("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*")
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub.endpoint)
    import time

    # slow-joiner: wait until the subscription is live
    for _ in range(100):
        pub.publish([])
        if sub.poll(50):
            sub.recv_multipart()
            break
    else:
        pytest.fail("SUB socket never connected")
    while sub.poll(10):
        sub.recv_multipart()

    rng = np.random.default_rng(7)
    c = UnifiedRadixCache(page_size=4, enable_kv_cache_events=True)
    live = set()
    seqs = []
    for step in range(300):
        r = rng.random()
        toks = [int(x) for x in rng.integers(0, 6, size=int(rng.integers(1, 40)))]
        if r < 0.6:
            c.insert(InsertParams(key=RadixKey(toks, cache_salt=("a" if rng.random() < 0.2 else None))))
        elif r < 0.8:
            c.match_prefix(MatchPrefixParams(key=RadixKey(toks)))
        elif r < 0.98:
            c.evict(EvictParams(num_tokens=int(rng.integers(1, 30))))
        else:
            c.reset()
        ev = c.take_events()
        if ev:
            seqs.append(pub.publish(ev))
    got = 0
    deadline = time.time() + 10
    while got < len(seqs) and time.time() < deadline:
        if not sub.poll(100):
            continue
        _, seq, payload = sub.recv_multipart()
        assert int.from_bytes(seq, "big", signed=True) == seqs[got]
        for e in decode_batch(payload).events:
            if isinstance(e, BlockStored):
                live.update(e.block_hashes)
            elif isinstance(e, BlockRemoved):
                assert set(e.block_hashes) <= live
                live.difference_update(e.block_hashes)
            else:
                live.clear()
        got += 1
    assert got == len(seqs)
    assert live == c.block_hashes()
    # replay: ask for everything from the 3rd batch of the run on
    req = ctx.socket(zmq.DEALER)
    req.connect(pub.replay_endpoint)
    req.send_multipart([b"", seqs[2].to_bytes(8, "big", signed=True)])
    replayed = []
    while True:
        pub.serve_replay()
        if req.poll(100):
            _, seq, payload = req.recv_multipart()
            s = int.from_bytes(seq, "big", signed=True)
            if s == -1:
                break
            replayed.append(s)
    assert replayed == seqs[2:]
    sub.close(0)
    req.close(0)
    pub.close()


# ------------------------------------------------------------------ LoRA names
LORAS = {"ek-a": "adapter-a", "ek-b": ("adapter-b", 7)}


def _stores(cache, keys):
    cache.take_events()
    for toks, ek, salt in keys:
        cache.insert(InsertParams(key=RadixKey(toks, ek, salt)))
    return [e for e in cache.take_events() if isinstance(e, BlockStored)]


def test_lora_names_fill_stores_of_named_extra_keys_and_change_no_hash():
    keys = [([1, 2, 3, 4], None, None), ([1, 2, 3, 4], "ek-a", None), ([1, 2, 3, 4], "ek-b", "s"),
            ([1, 2, 3, 4], "ek-z", None), ([1, 2, 3, 4], None, "s"), ([1, 2, 3, 4, 5, 6], "ek-a", None)]
    named = _stores(UnifiedRadixCache(page_size=2, enable_kv_cache_events=True,
                                      kv_event_lora_names=LORAS), keys)
    plain = _stores(UnifiedRadixCache(page_size=2, enable_kv_cache_events=True), keys)
    assert [(e.lora_name, e.lora_id) for e in named] == [
        (None, None), ("adapter-a", None), ("adapter-b", 7), (None, None), (None, None),
        ("adapter-a", None)]
    assert [e.cache_salt for e in named] == [None, None, "s", None, "s", None]
    assert [(e.block_hashes, e.parent_block_hash) for e in named] == [
        (e.block_hashes, e.parent_block_hash) for e in plain]
    assert all(e.lora_name is None and e.lora_id is None for e in plain)
    # the extension of "ek-a" chains to its first store and carries the same name
    assert named[5].parent_block_hash == named[1].block_hashes[-1]
    raw = msgspec.msgpack.decode(encode_batch(KVEventBatch(0.0, [named[2]])))[1][0]
    assert raw["lora_name"] == "adapter-b" and raw["lora_id"] == 7 and raw["cache_salt"] == "s"


def test_lora_names_merge_only_within_one_name():
    c = UnifiedRadixCache(page_size=1, enable_kv_cache_events=True, kv_event_lora_names=LORAS)
    c.take_events()
    c.insert(InsertParams(key=RadixKey([1, 2], "ek-a")))
    c.insert(InsertParams(key=RadixKey([1, 2, 3], "ek-a")))   # chained: merged into one event
    c.insert(InsertParams(key=RadixKey([1, 2, 3], "ek-b")))   # other namespace: its own event
    ev = c.take_events()
    assert [(e.lora_name, len(e.block_hashes)) for e in ev] == [("adapter-a", 3), ("adapter-b", 3)]


def test_lora_table_is_live_and_a_dict_is_copied():
    from flatradix.events import KvEventLoraNames

    table = KvEventLoraNames({"ek-a": "adapter-a"})
    d = {"ek-a": "adapter-a"}
    live = UnifiedRadixCache(page_size=1, enable_kv_cache_events=True, kv_event_lora_names=table)
    copied = UnifiedRadixCache(page_size=1, enable_kv_cache_events=True, kv_event_lora_names=d)
    table.register("ek-new", "adapter-new", 3)
    d["ek-new"] = "adapter-new"
    assert live.kv_event_lora_names is table and copied.kv_event_lora_names is not d
    for c, want in ((live, ("adapter-new", 3)), (copied, (None, None))):
        (e,) = _stores(c, [([5, 6], "ek-new", None)])
        assert (e.lora_name, e.lora_id) == want


@pytest.mark.parametrize("bad, exc", [
    (["ek-a"], TypeError), ("adapter", TypeError), ({1: "x"}, TypeError), ({"e": 5}, TypeError),
    ({"e": ""}, ValueError), ({"e": ("x", "7")}, TypeError), ({"e": ("x", True)}, TypeError),
    ({"e": ("x", -1)}, ValueError), ({"e": ("x", 1 << 63)}, ValueError), ({"e": ("x",)}, ValueError),
    ({"e": ("x", 1, 2)}, ValueError), ({"ok": "fine", "e": None}, TypeError),
])
def test_kv_event_lora_names_bad_input_names_the_argument(bad, exc):
    with pytest.raises(exc, match="kv_event_lora_names"):
        UnifiedRadixCache(page_size=1, enable_kv_cache_events=True, kv_event_lora_names=bad)


def test_lora_table_register_checks_before_storing():
    from flatradix.events import KvEventLoraNames

    t = KvEventLoraNames({"a": "A"})
    for args, exc in [((5, "x"), TypeError), (("b", ""), ValueError), (("b", "x", -2), ValueError),
                      (("b", "x", 1.0), TypeError)]:
        with pytest.raises(exc, match="register"):
            t.register(*args)
    with pytest.raises(TypeError, match="names"):
        t.update({"c": "C", "d": 3})   # one bad entry: none of them is stored
    assert len(t) == 1 and t.fields("a") == ("A", None) and "c" not in t and t.get("zz") is None
