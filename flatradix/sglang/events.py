"""KV events of the SGLang TreeCore, in SGLang 0.5.23's own types and hashes.

The kernels emit ``A_STORED`` / ``A_REMOVED`` rows (``kernels/actions.py``)
exactly where SGLang's cores record a store or a removal; this sink turns them
into SGLang's ``BlockStored`` / ``BlockRemoved`` and queues them in SGLang's own
``KVCacheEventRecorder`` (which merges chained stores as SGLang does), so the
controller's ``take_events`` sees what SGLang's Python core would publish:

* block hashes: SGLang's event chain, i.e. each page's SHA-256 chained from the
  parent's last page, seeded by the cache salt only (an ``extra_key`` does not
  change them); flatradix's hash kernel computes it into the pool's digest
  columns (``kernels/hashing.py``; flatradix's own cache seeds extra_key
  namespaces too, ``flatradix.events``);
* then SGLang's namespacing of the published hashes: a LoRA-named ``extra_key``
  (``kv_event_lora_names``), or every namespace in the Dynamo format
  (``namespaced_block_hash``);
* ``session_id`` of the insert that stored the node; bigram pages as token pairs.
"""

from sglang.srt.disaggregation.kv_events import (
    BlockRemoved,
    BlockStored,
    StorageMedium,
    kv_event_namespace_seed,
    namespaced_block_hash,
)

from ..event_sink import EventSink
from ..kernels import layout as L

_MEDIA = (StorageMedium.GPU, StorageMedium.CPU)


class SglangEventSink(EventSink):
    """An ``EventSink`` building SGLang's events into ``recorder`` (SGLang's
    ``KVCacheEventRecorder``: ``enqueue`` / ``take`` / ``record_all_cleared``)."""

    def __init__(self, engine, page_size, bigram, recorder):
        super().__init__(engine, page_size, bigram, None)
        self.recorder = recorder

    def take(self):
        return self.recorder.take()

    def cleared(self):
        self.recorder.record_all_cleared()

    def _seed(self, nk):
        # SGLang's event chain is seeded by the cache salt alone
        return super()._seed((None, nk[1]))

    def forget(self, nk):
        super().forget((None, nk[1]))

    def _namespace_seed(self, nk):
        """SGLang's seed for publishing a namespace's hashes (None: as computed)."""
        extra_key, salt = nk
        rec = self.recorder
        if rec.dynamo_format:
            return kv_event_namespace_seed(extra_key=extra_key, cache_salt=salt)
        named = extra_key if rec.lora_names.get(extra_key) is not None else None
        return kv_event_namespace_seed(extra_key=named, cache_salt=None)

    def _lora_name(self, extra_key):
        rec = self.recorder
        if rec.dynamo_format:
            return rec.lora_names.resolve(extra_key)
        return rec.lora_names.get(extra_key)

    def stored(self, slot, medium=0, session_id=None):
        """Hash the node in ``slot`` (its digests stay in the pool rows) and queue
        its ``BlockStored``."""
        eng = self._engine
        nodes, pool = eng.st.nodes, eng.st.pool
        nk = eng.ns.key_of(int(nodes[slot, L.NS]))
        seed, has_seed = self._seed(nk)
        eng.k.hash_node((int(nodes[slot, L.GEN]) << 32) | int(slot), seed, has_seed,
                        self._msg, self._state, self._w)
        off, n = int(nodes[slot, L.KEY_OFF]), int(nodes[slot, L.KEY_LEN])
        ns_seed = self._namespace_seed(nk)
        p = int(nodes[slot, L.PARENT])
        parent = None
        if p != L.ROOT:
            last = int(nodes[p, L.KEY_OFF] + nodes[p, L.KEY_LEN]) - self.page_size
            parent = namespaced_block_hash(int(pool[last, L.HASH0]), namespace_seed=ns_seed)
        hashes = [namespaced_block_hash(h, namespace_seed=ns_seed)
                  for h in self.page_hashes(off, n)]
        toks = pool[off:off + n, L.TOK]
        if self.bigram:
            token_ids = [(int(u) >> 32, int(u) & 0xFFFFFFFF) for u in toks]
        else:
            token_ids = toks.tolist()
        self.recorder.enqueue(BlockStored(
            block_hashes=hashes, parent_block_hash=parent, token_ids=token_ids,
            block_size=self.page_size, lora_id=None, medium=_MEDIA[medium],
            cache_salt=nk[1], session_id=session_id, lora_name=self._lora_name(nk[0])))

    def removed(self, off, n, medium=0, nk=(None, None)):
        """Queue the ``BlockRemoved`` of pool rows ``[off, off + n)`` of a node in
        namespace ``nk``."""
        ns_seed = self._namespace_seed(nk)
        self.recorder.enqueue(BlockRemoved(
            block_hashes=[namespaced_block_hash(h, namespace_seed=ns_seed)
                          for h in self.page_hashes(off, n)],
            medium=_MEDIA[medium]))
