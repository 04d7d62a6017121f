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

Routers that hold token ids as u32 (Dynamo 1.6.1 rejects a whole batch holding
one token outside ``[0, 2**32)``) get the blocks they cannot represent in
batches of their own: see ``split_unrepresentable`` and ``ZmqEventPublisher``.
"""

import hashlib
import threading
import time
from collections import deque
from collections.abc import Mapping
from itertools import islice
from typing import Optional, Union

import numpy as np



def _need(module, package, what):
    """``import module``, or a ModuleNotFoundError saying which extra installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        raise ModuleNotFoundError(f"{what} needs {package}: pip install 'flatradix[events]' "
                                  f"(msgspec and pyzmq)", name=module) from None


msgspec = _need("msgspec", "msgspec", "flatradix.events (KV cache events)")


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


# ---------------------------------------------------- unrepresentable tokens
U32_LIMIT = 1 << 32


def _first_wide_unit(token_ids):
    """Index of the first token (int, or EAGLE pair) outside ``[0, 2**32)``, or -1."""
    if not token_ids:
        return -1
    a = np.asarray(token_ids)
    if a.dtype.kind in "iu":
        if int(a.min()) >= 0 and int(a.max()) < U32_LIMIT:
            return -1
        bad = (a < 0) | (a >= U32_LIMIT)
        if bad.ndim > 1:
            bad = bad.reshape(bad.shape[0], -1).any(axis=1)
        return int(np.argmax(bad))
    for i, t in enumerate(token_ids):  # ints beyond int64: numpy gave objects
        if not all(0 <= u < U32_LIMIT for u in (t if isinstance(t, (list, tuple)) else (t,))):
            return i
    return -1


def split_unrepresentable(events, wide):
    """Order-preserving runs ``[(is_wide, [events]), ...]`` of ``events``.

    A block is *wide* when one of its token ids is outside ``[0, 2**32)`` (the
    token type of routers such as Dynamo), or when its parent is wide (a router
    query, made of u32 tokens, can never reach it). A ``BlockStored`` is cut
    before its first wide block: the head stays, the tail (its
    ``parent_block_hash`` set to the head's last hash) goes to a wide run. A
    ``BlockRemoved`` is split into its narrow and wide hashes (a set removal, so
    their order is free). Concatenating the runs gives the same stream, block
    for block. Input events are not modified.

    ``wide``: the set of live wide block hashes, updated in place (stores add,
    removals drop, ``AllBlocksCleared`` empties it); keep one per event stream.
    """
    runs = []

    def put(is_wide, ev):
        if runs and runs[-1][0] == is_wide:
            runs[-1][1].append(ev)
        else:
            runs.append((is_wide, [ev]))

    for ev in events:
        kind = type(ev)
        if kind is BlockStored:
            n = len(ev.block_hashes)
            bs = ev.block_size
            if ev.parent_block_hash is not None and ev.parent_block_hash in wide:
                cut = 0
            else:
                unit = _first_wide_unit(ev.token_ids)
                cut = n if unit < 0 else min(unit // max(bs, 1), max(n - 1, 0))
            if cut == n:
                put(False, ev)
                continue
            if cut:
                put(False, msgspec.structs.replace(
                    ev, block_hashes=ev.block_hashes[:cut], token_ids=ev.token_ids[:cut * bs]))
            tail = msgspec.structs.replace(
                ev, block_hashes=ev.block_hashes[cut:], token_ids=ev.token_ids[cut * bs:],
                parent_block_hash=ev.block_hashes[cut - 1] if cut else ev.parent_block_hash)
            wide.update(tail.block_hashes)
            put(True, tail)
        elif kind is BlockRemoved:
            gone = [h for h in ev.block_hashes if h in wide]
            if not gone:
                put(False, ev)
                continue
            keep = [h for h in ev.block_hashes if h not in wide]
            if keep:
                put(False, msgspec.structs.replace(ev, block_hashes=keep))
            wide.difference_update(gone)
            put(True, msgspec.structs.replace(ev, block_hashes=gone))
        else:
            if kind is AllBlocksCleared:
                wide.clear()
            put(False, ev)
    return runs


# --------------------------------------------------------------- publisher
def _check_endpoint(value, name, optional=False):
    if optional and value is None:
        return
    if type(value) is not str or not value:
        raise TypeError(f"{name} must be a ZMQ endpoint string such as 'tcp://127.0.0.1:5557', "
                        f"got {value!r}")


def _check_int(value, name, low):
    if type(value) is not int:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")


class ZmqEventPublisher:
    """Publish ``KVEventBatch`` es over ZMQ and serve replays, as vLLM and SGLang
    do; a KV-aware router (e.g. ``python -m dynamo.indexer``) is pointed at
    ``endpoint`` and ``replay_endpoint``.

    Parameters
    ----------
    endpoint : str
        Where the publishing socket binds (``tcp://127.0.0.1:*`` picks a free
        port; ``self.endpoint`` is the bound address). Subscribers connect a SUB
        socket to it.
    replay_endpoint : str, optional
        Where the ROUTER socket for replay requests binds (``self.replay_endpoint``);
        None: no replay.
    topic : str
        First frame of every message.
    buffer_steps : int >= 1
        At most this many batches are kept for replay (oldest dropped first).
    buffer_bytes : int >= 0
        ... and at most this many payload bytes (msgpack), except that the newest
        batch is always kept: the buffer holds at most
        ``max(buffer_bytes, size of the newest batch)`` bytes of payloads.
    data_parallel_rank : int >= 0, optional
        Written into every batch.

    Wire format: each message is ``[topic, seq (8 bytes big-endian), payload]``;
    ``seq`` counts batches from 0. A replay request is a message whose last frame
    is a start ``seq`` (8 bytes big-endian), e.g. ``[b"", seq]`` from a DEALER;
    the answer is every buffered ``[b"", seq, payload]`` from ``start`` on, then
    the end marker ``[b"", -1, b""]``. A start older than the oldest buffered
    batch (the batches between are lost), negative, or beyond the next sequence
    number gets no batches and the end marker with a fourth frame, a UTF-8 error
    message (``[b"", -1, b"", b"replay: ..."]``); routers that read three frames
    see an empty replay.

    A background thread owned by the publisher does all the socket work: it
    sends what ``publish`` queued, answers replay requests, and welcomes every
    new subscriber with an empty batch (the socket is an XPUB, which reports
    subscriptions). A router learns the sequence number from that batch, so one
    that joins while the cache is idle sees its gap and asks for the replay at
    once (Dynamo 1.6.1 asks only when a batch arrives), and the thread answers
    it. The thread sleeps in ``zmq.Poller.poll`` until there is work (no polling
    loop); ``close()`` stops it.

    Blocks a u32 router cannot represent (``split_unrepresentable``) go out in
    batches of their own (each with its own ``seq``, in stream order), so the
    rest of a batch never goes down with them. Dynamo 1.6.1 drops such a batch
    (measured: its decoder refuses the token, then its gap replay skips the
    batch again) and keeps every other block.

    ``publish`` and ``close`` may be called from any thread. Use as a context
    manager or call ``close()``: it stops the thread and closes the sockets,
    dropping what was not sent yet. Needs pyzmq. Bad arguments raise
    ``TypeError`` / ``ValueError`` naming them before any socket is opened; a
    bind failure raises ``zmq.ZMQError``.
    """

    END_SEQ = (-1).to_bytes(8, "big", signed=True)

    def __init__(self, endpoint="tcp://127.0.0.1:5557", replay_endpoint=None, topic="",
                 buffer_steps=10_000, buffer_bytes=256 << 20, data_parallel_rank=None):
        _check_endpoint(endpoint, "endpoint")
        _check_endpoint(replay_endpoint, "replay_endpoint", optional=True)
        if type(topic) is not str:
            raise TypeError(f"topic must be a str, got {type(topic).__name__}")
        _check_int(buffer_steps, "buffer_steps", 1)
        _check_int(buffer_bytes, "buffer_bytes", 0)
        if data_parallel_rank is not None:
            _check_int(data_parallel_rank, "data_parallel_rank", 0)
        zmq = _need("zmq", "pyzmq", "ZmqEventPublisher")

        self._zmq = zmq
        self._lock = threading.Lock()       # publish / close, and the outbox socket
        self._buf_lock = threading.Lock()   # seq counter and replay buffer (read by the thread)
        self._closed = False
        self._topic = topic.encode("utf-8")
        self._next_seq = 0
        self._buffer = deque()  # (seq, payload), seqs consecutive
        self._buffered_bytes = 0
        self._wide = set()
        self.buffer_steps = buffer_steps
        self.buffer_bytes = buffer_bytes
        self.data_parallel_rank = data_parallel_rank
        self.replay_endpoint = None
        ctx = zmq.Context.instance()
        opened = []
        try:
            pub = ctx.socket(zmq.XPUB)
            opened.append(pub)
            pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscriber's subscription, not only the first
            pub.bind(endpoint)
            self.endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
            replay = None
            if replay_endpoint is not None:
                replay = ctx.socket(zmq.ROUTER)
                opened.append(replay)
                replay.bind(replay_endpoint)
                self.replay_endpoint = replay.getsockopt_string(zmq.LAST_ENDPOINT)
            inbox, outbox = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
            opened += [inbox, outbox]
            for sock in (inbox, outbox):  # never block publish (the thread drains it)
                sock.setsockopt(zmq.SNDHWM, 0)
                sock.setsockopt(zmq.RCVHWM, 0)
            addr = f"inproc://flatradix-kv-events-{id(self):x}-{time.monotonic_ns()}"
            inbox.bind(addr)
            outbox.connect(addr)
        except BaseException:
            for sock in opened:
                sock.close(linger=0)
            raise
        self._outbox = outbox
        # the thread owns pub, replay and inbox from here on (ZMQ sockets are not thread-safe)
        self._thread = threading.Thread(target=self._run, args=(pub, replay, inbox),
                                        name="flatradix-kv-events", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ publishing
    def publish(self, events, ts=None):
        """Queue ``events`` (a list of ``BlockStored`` / ``BlockRemoved`` /
        ``AllBlocksCleared``, oldest first) as one batch, or as several
        consecutive batches when some blocks have token ids outside
        ``[0, 2**32)``; ``ts``: seconds since the epoch (default: now). Returns
        the sequence number (int) of the last batch. An empty list makes an
        empty batch. Never blocks on the network. ``RuntimeError`` after
        ``close()``."""
        events = list(events)
        ts = time.time() if ts is None else ts
        with self._lock:
            if self._closed:
                raise RuntimeError("ZmqEventPublisher.publish after close()")
            runs = split_unrepresentable(events, self._wide) or [(False, [])]
            for _, evs in runs:
                payload = encode_batch(KVEventBatch(ts, evs, self.data_parallel_rank))
                with self._buf_lock:
                    seq = self._next_seq
                    self._next_seq += 1
                    self._buffer.append((seq, payload))
                    self._buffered_bytes += len(payload)
                    while len(self._buffer) > 1 and (len(self._buffer) > self.buffer_steps
                                                     or self._buffered_bytes > self.buffer_bytes):
                        self._buffered_bytes -= len(self._buffer.popleft()[1])
                self._outbox.send_multipart((b"batch", seq.to_bytes(8, "big", signed=True), payload))
        return seq

    def buffered(self):
        """``(oldest seq, next seq, payload bytes)`` of the replay buffer; the
        buffer holds the batches ``oldest .. next - 1``."""
        with self._buf_lock:
            oldest = self._buffer[0][0] if self._buffer else self._next_seq
            return oldest, self._next_seq, self._buffered_bytes

    # ------------------------------------------------------------ the thread
    def _replay_for(self, frames):
        """``(batches, error)`` answering one request (error: str or None)."""
        raw = frames[-1] if len(frames) >= 2 else b""
        if len(raw) != 8:
            return [], ("replay: a request must end with an 8-byte big-endian start "
                        f"sequence number (got {len(raw)} bytes)")
        start = int.from_bytes(raw, "big", signed=True)
        with self._buf_lock:
            oldest = self._buffer[0][0] if self._buffer else self._next_seq
            nxt = self._next_seq
            if oldest <= start <= nxt:
                return list(islice(self._buffer, start - oldest, None)), None
        if start < 0 or start > nxt:
            return [], f"replay: start sequence {start} is not in [0, {nxt}] (next to publish: {nxt})"
        return [], (f"replay: batches {start}..{oldest - 1} are no longer buffered "
                    f"(buffer holds {oldest}..{nxt - 1}; buffer_steps={self.buffer_steps}, "
                    f"buffer_bytes={self.buffer_bytes})")

    def _answer(self, replay, frames):
        batches, error = self._replay_for(frames)
        identity = frames[0]
        for seq, payload in batches:
            replay.send_multipart((identity, b"", seq.to_bytes(8, "big", signed=True), payload))
        end = (identity, b"", self.END_SEQ, b"")
        if error is not None:
            end += (error.encode("utf-8"),)
        replay.send_multipart(end)

    def _run(self, pub, replay, inbox):
        zmq = self._zmq
        poller = zmq.Poller()
        for sock in (inbox, pub, replay):
            if sock is not None:
                poller.register(sock, zmq.POLLIN)
        try:
            while True:
                ready = dict(poller.poll())  # sleeps until there is work
                if inbox in ready:
                    for msg in _drain(zmq, inbox):
                        if msg[0] == b"stop":
                            return
                        pub.send_multipart((self._topic, msg[1], msg[2]))
                if pub in ready and any(m[0][:1] == b"\x01" for m in _drain(zmq, pub)):
                    try:
                        self.publish([])  # welcome: queued like any batch, so in seq order
                    except RuntimeError:  # closed meanwhile
                        pass
                if replay is not None and replay in ready:
                    for frames in _drain(zmq, replay):
                        self._answer(replay, frames)
        finally:
            for sock in (pub, replay, inbox):
                if sock is not None:
                    sock.close(linger=0)

    # ------------------------------------------------------------ lifetime
    def close(self):
        """Stop the thread (joined) and close the sockets; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._outbox.send_multipart((b"stop",))
        self._thread.join()
        self._outbox.close(linger=0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _drain(zmq, sock):
    """Every message waiting on ``sock`` (a list of frame lists), without blocking."""
    out = []
    while True:
        try:
            out.append(sock.recv_multipart(zmq.NOBLOCK))
        except zmq.Again:
            return out
