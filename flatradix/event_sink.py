"""The KV event sink: builds ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` events.

The kernels emit ``A_STORED`` (a new node's slot) and ``A_REMOVED`` (a deleted
node's pool span, whose page digests are still in place) actions; the executor
hands them here, in order. A stored node is hashed once
(``kernels/hashing.py: hash_node``: each page's SHA-256 chained from the
parent's last page, or from the namespace seed under the root) and its digests
stay in the pool rows, so a removal reads them back. The queue merges chained
stores and consecutive removals as SGLang does (``flatradix.events.enqueue``).
With events off nothing here runs: the cache builds no sink.
"""

import numpy as np

from .engine import node_id
from .kernels import layout as L


#: Event medium per action ``aux`` (``kernels/actions.py``: MEDIUM_GPU, MEDIUM_CPU).
_MEDIA = ("GPU", "CPU_PINNED")


class EventSink:
    """Event queue of one cache (``enable_kv_cache_events=True``)."""

    def __init__(self, engine, page_size, bigram, lora_names=None):
        from . import events  # msgspec is needed only with events on

        self._ev = events
        self._engine = engine
        self.lora_names = lora_names  # extra_key -> LoRA name / id (events.lora_fields)
        self.page_size = page_size
        self.bigram = bigram
        self.queue = []
        self._seeds = {}
        self._msg = np.zeros(page_size * 16 + 128, dtype=np.uint8)
        self._state = np.zeros(8, dtype=np.uint64)
        self._w = np.zeros(64, dtype=np.uint64)

    def take(self):
        """Return and clear the queued events (oldest first)."""
        out, self.queue = self.queue, []
        return out

    def cleared(self):
        self._ev.enqueue(self.queue, self._ev.AllBlocksCleared())

    def forget(self, nk):
        """Drop the cached seed of a namespace the engine forgot."""
        self._seeds.pop(nk, None)

    def _seed(self, nk):
        seed = self._seeds.get(nk)
        if seed is None:
            words = self._ev.namespace_seed(*nk)
            seed = (np.array(words if words else [0, 0, 0, 0], dtype=np.int64), words is not None)
            self._seeds[nk] = seed
        return seed

    def page_hashes(self, off, n):
        """Event block hashes of the pages in pool rows ``[off, off + n)``."""
        return self._engine.st.pool[off:off + n:self.page_size, L.HASH0].tolist()

    def stored(self, slot, medium=0):
        """Hash the node in ``slot`` and queue its ``BlockStored`` (``medium`` 0: GPU,
        1: CPU_PINNED, the host tier)."""
        eng = self._engine
        nodes, pool = eng.st.nodes, eng.st.pool
        nk = eng.ns.key_of(int(nodes[slot, L.NS]))
        seed, has_seed = self._seed(nk)
        eng.k.hash_node(node_id(nodes, slot), seed, has_seed, self._msg, self._state, self._w)
        off, n = int(nodes[slot, L.KEY_OFF]), int(nodes[slot, L.KEY_LEN])
        p = int(nodes[slot, L.PARENT])
        parent_hash = None
        if p != L.ROOT:
            last = int(nodes[p, L.KEY_OFF] + nodes[p, L.KEY_LEN]) - self.page_size
            parent_hash = int(pool[last, L.HASH0])
        toks = pool[off:off + n, L.TOK]
        if self.bigram:
            token_ids = [[int(u) >> 32, int(u) & 0xFFFFFFFF] for u in toks]
        else:
            token_ids = toks.tolist()
        lora_name, lora_id = self._ev.lora_fields(self.lora_names, nk[0])
        self._ev.enqueue(self.queue, self._ev.BlockStored(
            block_hashes=self.page_hashes(off, n), parent_block_hash=parent_hash,
            token_ids=token_ids, block_size=self.page_size, lora_id=lora_id,
            medium=_MEDIA[medium],
            cache_salt=nk[1], lora_name=lora_name))

    def removed(self, off, n, medium=0):
        """Queue the ``BlockRemoved`` of pool rows ``[off, off + n)`` (``medium`` as
        ``stored``)."""
        self._ev.enqueue(self.queue, self._ev.BlockRemoved(
            block_hashes=self.page_hashes(off, n), medium=_MEDIA[medium]))

    def block_hashes(self):
        """Event block hashes of every page cached on device: what a router that
        applied every event so far believes is cached."""
        eng = self._engine
        nodes = eng.st.nodes
        out = set()
        for s in eng.live_slots():
            if s != L.ROOT and nodes[s, L.FLAGS] & L.F_HAS_FULL_DEV:
                out.update(self.page_hashes(int(nodes[s, L.KEY_OFF]), int(nodes[s, L.KEY_LEN])))
        return out
