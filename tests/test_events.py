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
    assert c._engine.st.pool.shape[1] == 2


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

    # the publisher welcomes a new subscriber with an empty batch: from then on
    # the subscription is live (no slow-joiner loss)
    assert sub.poll(10_000), "no welcome batch"
    _, seq, payload = sub.recv_multipart()
    assert int.from_bytes(seq, "big", signed=True) == 0 and decode_batch(payload).events == []

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
    # nothing is published from here on: the publisher's own thread answers
    replayed = []
    deadline = time.time() + 10
    while time.time() < deadline:
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


# ------------------------------------------------------------------ publisher
def _seq(n):
    return n.to_bytes(8, "big", signed=True)


def _ask_replay(zmq, pub, frames):
    """Send one replay request; return the answer's frames, message by message,
    up to and including the end marker. Nothing is published meanwhile."""
    import time

    req = zmq.Context.instance().socket(zmq.DEALER)
    req.connect(pub.replay_endpoint)
    req.send_multipart(frames)
    out = []
    deadline = time.time() + 10
    try:
        while time.time() < deadline:
            if req.poll(100):
                msg = req.recv_multipart()
                out.append(msg)
                if msg[1] == ZmqEventPublisher.END_SEQ:
                    return out
        pytest.fail(f"no end marker within the deadline; got {out}")
    finally:
        req.close(0)


def test_replay_is_served_while_idle_and_refuses_what_it_no_longer_holds():
    zmq = pytest.importorskip("zmq")
    with ZmqEventPublisher("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*",
                           buffer_steps=3) as pub:
        sent = [encode_batch(KVEventBatch(float(i), [BlockRemoved([i], "GPU")])) for i in range(5)]
        for i in range(5):
            assert pub.publish([BlockRemoved([i], "GPU")], ts=float(i)) == i
        assert pub.buffered()[:2] == (2, 5)
        ans = _ask_replay(zmq, pub, [b"", _seq(3)])
        assert ans == [[b"", _seq(3), sent[3]], [b"", _seq(4), sent[4]], [b"", pub.END_SEQ, b""]]
        assert _ask_replay(zmq, pub, [b"", _seq(5)]) == [[b"", pub.END_SEQ, b""]]  # up to date
        for start, words in [(1, b"batches 1..1 are no longer buffered"), (0, b"0..1"),
                             (6, b"not in [0, 5]"), (-1, b"not in [0, 5]")]:
            (end,) = _ask_replay(zmq, pub, [b"", _seq(start)])
            assert end[:3] == [b"", pub.END_SEQ, b""] and end[3].startswith(b"replay: ")
            assert words in end[3]
        (end,) = _ask_replay(zmq, pub, [b"", b"\x01\x02"])
        assert end[:3] == [b"", pub.END_SEQ, b""] and b"8-byte" in end[3]


def test_subscribers_joining_an_idle_publisher_are_welcomed_then_replayed():
    """A router that joins late learns the next seq from the welcome batch (so it
    sees its gap at once) and gets the past by replay; the test publishes
    nothing after the first four batches."""
    zmq = pytest.importorskip("zmq")
    ctx = zmq.Context.instance()
    with ZmqEventPublisher("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*") as pub:
        for i in range(4):
            pub.publish([BlockRemoved([i], "GPU")], ts=float(i))
        subs = []
        for want in (4, 5):   # each new subscriber gets its own welcome, seen by all
            sub = ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(pub.endpoint)
            subs.append(sub)
            for s in subs:   # (batches 0..3 may still be in flight when sub 1 joins)
                while True:
                    assert s.poll(10_000), f"no welcome {want}"
                    _, seq, payload = s.recv_multipart()
                    seq = int.from_bytes(seq, "big", signed=True)
                    if not decode_batch(payload).events:
                        break
                    assert seq < 4
                assert seq == want
        ans = _ask_replay(zmq, pub, [b"", _seq(0)])
        assert [int.from_bytes(m[1], "big", signed=True) for m in ans] == [0, 1, 2, 3, 4, 5, -1]
        assert [[e.block_hashes for e in decode_batch(m[2]).events] for m in ans[:6]] == [
            [[0]], [[1]], [[2]], [[3]], [], []]
        for s in subs:
            s.close(0)


def test_replay_buffer_is_bounded_in_bytes_but_keeps_the_newest_batch():
    pytest.importorskip("zmq")
    payload = lambda n: encode_batch(KVEventBatch(0.0, [BlockRemoved(list(range(n)), "GPU")]))
    sizes = [len(payload(n)) for n in (10, 10, 10, 200)]
    limit = sizes[0] * 2 + 1
    with ZmqEventPublisher("tcp://127.0.0.1:*", buffer_bytes=limit) as pub:
        for n in (10, 10, 10):
            pub.publish([BlockRemoved(list(range(n)), "GPU")], ts=0.0)
        assert pub.buffered() == (1, 3, 2 * sizes[0])
        pub.publish([BlockRemoved(list(range(200)), "GPU")], ts=0.0)  # alone over the limit
        assert sizes[3] > limit and pub.buffered() == (3, 4, sizes[3])


def test_close_stops_the_thread_and_publish_after_close_raises():
    import threading

    pytest.importorskip("zmq")
    before = {t for t in threading.enumerate() if t.name == "flatradix-kv-events"}
    pub = ZmqEventPublisher("tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*")
    mine = {t for t in threading.enumerate() if t.name == "flatradix-kv-events"} - before
    assert len(mine) == 1 and all(t.daemon for t in mine)
    pub.close()
    pub.close()
    assert not any(t.is_alive() for t in mine)
    with pytest.raises(RuntimeError, match="close"):
        pub.publish([])


@pytest.mark.parametrize("kwargs, exc, name", [
    (dict(endpoint=5557), TypeError, "endpoint"), (dict(replay_endpoint=b"tcp://x"), TypeError, "replay_endpoint"),
    (dict(topic=b"t"), TypeError, "topic"), (dict(buffer_steps=0), ValueError, "buffer_steps"),
    (dict(buffer_steps=2.0), TypeError, "buffer_steps"), (dict(buffer_bytes=-1), ValueError, "buffer_bytes"),
    (dict(data_parallel_rank=-1), ValueError, "data_parallel_rank"),
])
def test_publisher_bad_arguments_name_themselves(kwargs, exc, name):
    with pytest.raises(exc, match=name):
        ZmqEventPublisher(**kwargs)


# ------------------------------------------------- blocks a u32 router cannot hold
def test_split_cuts_stores_at_the_first_wide_block_and_follows_it():
    from flatradix.events import split_unrepresentable

    W = 1 << 32
    wide = set()
    events = [
        BlockStored([1, 2, 3], None, [5, 6, 7, 8, W, 9], 2, None, "GPU", lora_name="L"),
        BlockStored([4], 3, [1, 1], 2, None, "GPU"),          # child of a wide block
        BlockStored([5], None, [2, 2], 2, None, "GPU"),
        BlockRemoved([2, 3, 5], "GPU"),
        BlockStored([6], None, [-1, 0], 2, None, "GPU"),
        AllBlocksCleared(),
        BlockStored([7], 6, [0, 0], 2, None, "GPU"),          # 6 was cleared: narrow again
    ]
    runs = split_unrepresentable(events, wide)
    assert [(w, as_dicts(evs)) for w, evs in runs] == [
        (False, as_dicts([BlockStored([1, 2], None, [5, 6, 7, 8], 2, None, "GPU")])),
        (True, as_dicts([BlockStored([3], 2, [W, 9], 2, None, "GPU"), BlockStored([4], 3, [1, 1], 2, None, "GPU")])),
        (False, as_dicts([BlockStored([5], None, [2, 2], 2, None, "GPU"), BlockRemoved([2, 5], "GPU")])),
        (True, as_dicts([BlockRemoved([3], "GPU"), BlockStored([6], None, [-1, 0], 2, None, "GPU")])),
        (False, as_dicts([AllBlocksCleared(), BlockStored([7], 6, [0, 0], 2, None, "GPU")])),
    ]
    assert runs[1][1][0].lora_name == "L" and wide == set()
    assert events[0].block_hashes == [1, 2, 3]  # input untouched


U32 = __import__("typing").Annotated[int, msgspec.Meta(ge=0, lt=1 << 32)]


class _U32Stored(msgspec.Struct, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: "int | None"
    token_ids: list[U32]


class _U32Removed(msgspec.Struct, tag="BlockRemoved"):
    block_hashes: list[int]


class _U32Cleared(msgspec.Struct, tag="AllBlocksCleared"):
    pass


class _U32Batch(msgspec.Struct, array_like=True):
    ts: float
    events: list["_U32Stored | _U32Removed | _U32Cleared"]
    data_parallel_rank: "int | None" = None


def visible_model():
    """Independent model of a u32 router's blocks, fed with the full event
    stream: a block is visible when its tokens fit u32 and its parent is visible."""
    vis = {}

    def apply(ev):
        if isinstance(ev, BlockStored):
            parent, bs = ev.parent_block_hash, ev.block_size
            for i, h in enumerate(ev.block_hashes):
                toks = np.asarray(ev.token_ids[i * bs:(i + 1) * bs]).ravel()
                vis[h] = bool(((toks >= 0) & (toks < 1 << 32)).all()) and (parent is None or vis[parent])
                parent = h
        elif isinstance(ev, BlockRemoved):
            for h in ev.block_hashes:
                del vis[h]
        else:
            vis.clear()
    return vis, apply


def test_wide_tokens_never_sink_other_blocks_of_a_batch():
    """A u32 consumer (decoding like Dynamo: one wide token fails its batch)
    ends with exactly the blocks it can represent; a full consumer with all."""
    zmq = pytest.importorskip("zmq")
    import time

    strict = msgspec.msgpack.Decoder(_U32Batch)
    pub = ZmqEventPublisher("tcp://127.0.0.1:*")
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub.endpoint)
    assert sub.poll(10_000), "no welcome batch"
    sub.recv_multipart()
    rng = np.random.default_rng(3)
    c = UnifiedRadixCache(page_size=2, enable_kv_cache_events=True)
    vis, apply = visible_model()
    full, narrow = set(), set()
    sent, dropped = 1, 0   # after the welcome
    for step in range(200):
        toks = [int(x) for x in rng.integers(0, 4, size=int(rng.integers(2, 12)))]
        if rng.random() < 0.15:
            toks[int(rng.integers(len(toks)))] = int(rng.choice([-5, 1 << 32, (1 << 40) + 3]))
        if rng.random() < 0.7:
            c.insert(InsertParams(key=RadixKey(toks)))
        elif rng.random() < 0.95:
            c.evict(EvictParams(num_tokens=int(rng.integers(1, 8))))
        else:
            c.reset()
        ev = c.take_events()
        for e in ev:
            apply(e)
        if ev:
            last = pub.publish(ev)
            deadline = time.time() + 10
            while sent <= last and time.time() < deadline:
                if not sub.poll(100):
                    continue
                _, seq, payload = sub.recv_multipart()
                assert int.from_bytes(seq, "big", signed=True) == sent
                sent += 1
                for e in decode_batch(payload).events:
                    if isinstance(e, BlockStored):
                        full.update(e.block_hashes)
                    elif isinstance(e, BlockRemoved):
                        full.difference_update(e.block_hashes)
                    else:
                        full.clear()
                try:
                    batch = strict.decode(payload)
                except msgspec.ValidationError:
                    dropped += 1
                    continue
                for e in batch.events:
                    if isinstance(e, _U32Stored):
                        assert e.parent_block_hash is None or e.parent_block_hash in narrow
                        narrow.update(e.block_hashes)
                    elif isinstance(e, _U32Removed):
                        # a batch of wide removals decodes too (no tokens): never mixed
                        held = set(e.block_hashes) & narrow
                        assert held in (set(), set(e.block_hashes))
                        narrow.difference_update(e.block_hashes)
                    else:
                        narrow.clear()
            assert sent == last + 1
            assert full == c.block_hashes()
            assert narrow == {h for h, v in vis.items() if v}
    assert dropped > 0 and len(narrow) < len(full)  # the run did exercise wide blocks
    sub.close(0)
    pub.close()
