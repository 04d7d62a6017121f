"""KV cache events: msgspec structs in the wire format of vLLM's and SGLang's
``KVEventBatch``, LoRA names for ``extra_key`` namespaces, and an optional ZMQ
publisher.

Events are tagged msgpack maps (``type`` = class name; ``None`` fields omitted);
a batch is the positional array ``[ts, events, data_parallel_rank]``. So KV-aware
routers that consume vLLM or SGLang events (Dynamo, llm-d) decode ours.

Block hashes: see ``flatradix/kernels/hashing.py``. Plain keys and keys with
only a ``cache_salt`` get SGLang 0.5.23's hashes bit for bit; a key with an
``extra_key`` gets a chain seeded by ``(extra_key, cache_salt)``, so that no two
namespaces ever share block hashes. SGLang 0.5.23 gives an extra_key namespace
the plain (or salt) chain (``known_bugs.md`` B6), and when the extra_key has a
LoRA name (its ``kv_event_lora_names``) re-hashes every block of it with an
extra_key seed; so for extra_key namespaces, named or not, flatradix's hash
values differ from SGLang's. A LoRA name (``KvEventLoraNames``) changes no hash
here: it only fills ``lora_name`` / ``lora_id``. Routers take block hashes as
opaque ids (Dynamo 1.6.1 hashes the token ids with ``lora_name`` and
``cache_salt`` itself), so this difference does not reach a router's answers.
"""

import hashlib
import time
from collections import deque
from collections.abc import Mapping
from itertools import count
from typing import Optional, Union

import msgspec


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the event types (tagged by class name)."""


class BlockStored(KVCacheEvent):
    block_hashes: list
    parent_block_hash: Optional[int]
    token_ids: list
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str] = None
    cache_salt: Optional[str] = None
    session_id: Optional[str] = None
    lora_name: Optional[str] = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list
    medium: Optional[str] = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]
    data_parallel_rank: Optional[int] = None


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def encode_batch(batch):
    """msgpack bytes of a ``KVEventBatch``."""
    return _ENCODER.encode(batch)


def decode_batch(data):
    """A ``KVEventBatch`` from msgpack bytes."""
    return _DECODER.decode(data)


def enqueue(queue, event):
    """Append ``event`` to ``queue``, merging it into the tail as SGLang does: a
    ``BlockStored`` whose parent is the tail's last hash (same medium, block size,
    salt, session, LoRA), or a ``BlockRemoved`` of the same medium."""
    if queue:
        tail = queue[-1]
        if (type(event) is BlockStored and type(tail) is BlockStored and tail.block_hashes
                and event.parent_block_hash == tail.block_hashes[-1]
                and (event.medium, event.block_size, event.cache_salt, event.session_id,
                     event.lora_id, event.lora_name)
                == (tail.medium, tail.block_size, tail.cache_salt, tail.session_id,
                    tail.lora_id, tail.lora_name)):
            tail.block_hashes.extend(event.block_hashes)
            tail.token_ids.extend(event.token_ids)
            return
        if type(event) is BlockRemoved and type(tail) is BlockRemoved and event.medium == tail.medium:
            tail.block_hashes.extend(event.block_hashes)
            return
    queue.append(event)


def _digest_words(digest):
    return [int.from_bytes(digest[i:i + 8], "big", signed=True) for i in range(0, 32, 8)]


def namespace_seed(extra_key, cache_salt):
    """Seed digest (4 big-endian int64 words) of a namespace's event chain, or None.

    ``(None, None)``: no seed (SGLang's plain chain). Salt only: SHA-256 of
    ``b"sglang-cache-salt-v1\\0" + salt`` (SGLang 0.5.23). With an extra_key:
    SHA-256 of ``b"flatradix-kv-event-namespace-v1"`` followed, for each of
    (extra_key, cache_salt), by ``0x00`` (None) or ``0x01`` + u64-LE byte length +
    UTF-8 bytes (flatradix; presence and length keep joined strings apart).
    """
    if extra_key is None and cache_salt is None:
        return None
    if extra_key is None:
        return _digest_words(hashlib.sha256(b"sglang-cache-salt-v1\0" + cache_salt.encode()).digest())
    h = hashlib.sha256(b"flatradix-kv-event-namespace-v1")
    for part in (extra_key, cache_salt):
        if part is None:
            h.update(b"\x00")
        else:
            b = part.encode("utf-8")
            h.update(b"\x01" + len(b).to_bytes(8, "little") + b)
    return _digest_words(h.digest())


# ---------------------------------------------------------------- LoRA names
_MAX_LORA_ID = 1 << 63


def _lora_entry(extra_key, lora_name, lora_id, where):
    """``(lora_name, lora_id)`` of one table entry, validated."""
    if type(extra_key) is not str:
        raise TypeError(f"{where}: keys must be extra_key strings, got {type(extra_key).__name__}")
    if type(lora_name) is not str:
        raise TypeError(f"{where}[{extra_key!r}]: the LoRA name must be a str, "
                        f"got {type(lora_name).__name__}")
    if not lora_name:
        raise ValueError(f"{where}[{extra_key!r}]: the LoRA name must not be empty")
    if lora_id is not None:
        if type(lora_id) is not int:
            raise TypeError(f"{where}[{extra_key!r}]: lora_id must be an int or None, "
                            f"got {type(lora_id).__name__}")
        if not 0 <= lora_id < _MAX_LORA_ID:
            raise ValueError(f"{where}[{extra_key!r}]: lora_id must be in [0, 2**63), got {lora_id}")
    return lora_name, lora_id


def _mapping_entry(extra_key, value, where):
    if isinstance(value, tuple):
        if len(value) != 2:
            raise ValueError(f"{where}[{extra_key!r}]: a tuple entry must be (lora_name, lora_id), "
                             f"got {len(value)} items")
        return _lora_entry(extra_key, value[0], value[1], where)
    if not isinstance(value, str):
        raise TypeError(f"{where}[{extra_key!r}] must be a LoRA name (str) or a (name, lora_id) "
                        f"tuple, got {type(value).__name__}")
    return _lora_entry(extra_key, value, None, where)


class KvEventLoraNames:
    """LoRA names of ``extra_key`` namespaces, for KV events (SGLang's
    ``kv_event_lora_names``: the ``lora_name`` a router is asked with).

    Maps an ``extra_key`` (str, compared exactly, as SGLang's default event
    format does) to a LoRA name (non-empty str) and optionally a LoRA id (int in
    ``[0, 2**63)``; vLLM's ``lora_id`` field; SGLang leaves it None). Every
    ``BlockStored`` of a namespace whose extra_key is in the table carries them;
    other namespaces carry ``None``. Block hashes do not depend on the table.

    ``names``: a mapping ``{extra_key: name}`` or ``{extra_key: (name, lora_id)}``.
    Entries can be added later (``register``), e.g. when an adapter loads; a cache
    given this object (not a dict, which it copies) sees them from its next
    store on. A name should not change while blocks of its namespace are cached
    (routers index them under the name they were stored with).

    A router tells namespaces apart by ``(lora_name, cache_salt)`` only: an
    extra_key namespace with no name here looks like the plain namespace to it,
    and two extra keys with one name look like one namespace.

    Raises ``TypeError`` / ``ValueError`` naming the entry before anything is
    stored.
    """

    __slots__ = ("_names",)

    def __init__(self, names=None):
        self._names = {}
        if names is not None:
            self.update(names)

    def update(self, names, name="names"):
        """Add every entry of the mapping ``names`` (all checked first)."""
        if not isinstance(names, Mapping):
            raise TypeError(f"{name} must be a dict {{extra_key: lora_name}} or a "
                            f"flatradix.events.KvEventLoraNames, got {type(names).__name__}")
        staged = {k: _mapping_entry(k, v, name) for k, v in names.items()}
        self._names.update(staged)

    def register(self, extra_key, lora_name, lora_id=None):
        """Name the namespace ``extra_key`` (str): ``lora_name`` (non-empty str),
        ``lora_id`` (int in ``[0, 2**63)`` or None)."""
        self._names[extra_key] = _lora_entry(extra_key, lora_name, lora_id, "register")

    def get(self, extra_key):
        """The LoRA name of ``extra_key``, or None."""
        return self._names.get(extra_key, (None, None))[0]

    def fields(self, extra_key):
        """``(lora_name, lora_id)`` of ``extra_key``; ``(None, None)`` if unnamed."""
        return self._names.get(extra_key, (None, None))

    def __contains__(self, extra_key):
        return extra_key in self._names

    def __len__(self):
        return len(self._names)

    def __repr__(self):
        return f"KvEventLoraNames({dict(self._names)!r})"


def lora_name_table(value, name="kv_event_lora_names"):
    """``value`` as a ``KvEventLoraNames``: None stays None, a table is used as
    is (shared, live), a mapping is validated and copied. ``TypeError`` /
    ``ValueError`` naming ``name`` otherwise."""
    if value is None or isinstance(value, KvEventLoraNames):
        return value
    table = KvEventLoraNames()
    table.update(value, name)
    return table


def lora_fields(table, extra_key):
    """``(lora_name, lora_id)`` for a store in namespace ``extra_key`` (None
    when there is no table, no extra_key, or no entry)."""
    if table is None or extra_key is None:
        return None, None
    return table.fields(extra_key)


class ZmqEventPublisher:
    """Publish ``KVEventBatch`` es on a ZMQ PUB socket, as vLLM and SGLang do.

    Each message is ``[topic, seq (8 bytes big-endian), payload (msgpack)]``. The
    last ``buffer_steps`` payloads are kept; a ROUTER socket on
    ``replay_endpoint`` answers a request ``seq`` (8 bytes) with every buffered
    ``[seq, payload]`` from that sequence on, then ``[-1, b""]``. Publishing runs
    in the caller's thread (no background thread). Needs pyzmq.
    """

    END_SEQ = (-1).to_bytes(8, "big", signed=True)

    def __init__(self, endpoint="tcp://127.0.0.1:5557", replay_endpoint=None, topic="",
                 buffer_steps=10_000, data_parallel_rank=None):
        import zmq

        self._zmq = zmq
        self._ctx = zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.bind(endpoint)
        self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self._replay = None
        self.replay_endpoint = None
        if replay_endpoint is not None:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.bind(replay_endpoint)
            self.replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        self._topic = topic.encode("utf-8")
        self._seq = count()
        self._buffer = deque(maxlen=buffer_steps)
        self.data_parallel_rank = data_parallel_rank

    def publish(self, events, ts=None):
        """Send ``events`` (a list) as one batch; returns its sequence number."""
        batch = KVEventBatch(time.time() if ts is None else ts, list(events), self.data_parallel_rank)
        payload = encode_batch(batch)
        seq = next(self._seq)
        self._buffer.append((seq, payload))
        self._pub.send_multipart((self._topic, seq.to_bytes(8, "big", signed=True), payload))
        self.serve_replay()
        return seq

    def serve_replay(self):
        """Answer pending replay requests (non-blocking)."""
        if self._replay is None:
            return
        while self._replay.poll(0):
            frames = self._replay.recv_multipart()
            identity, start = frames[0], int.from_bytes(frames[-1], "big", signed=True)
            for seq, payload in list(self._buffer):
                if seq >= start:
                    self._replay.send_multipart((identity, b"", seq.to_bytes(8, "big", signed=True), payload))
            self._replay.send_multipart((identity, b"", self.END_SEQ, b""))

    def close(self):
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
