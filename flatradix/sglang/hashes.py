"""Storage page hashes of the ``flatradix`` TreeCore (SGLang's L3 page keys).

A node's hashes are a function of its root path's pages and namespace, so they
are computed on demand with SGLang's own hash function
(``get_storage_hash_str``, memoised per node), never stored per token. Whether a
node *has* them follows SGLang's core: a node created while KV events, storage
or the external linker were on, or present at a backfill, is hashed; others read
as unhashed (None / []).

A mixin of ``FlatradixTreeCore`` (``core.py``): it reads the core's engine
(``self._eng``) and node helpers (``_slot``, ``_nid``, ``_has``, ``_nk``,
``_dfs_slots``).
"""

from __future__ import annotations

from array import array

from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.unified_tree_core_interface import (
    BufferBackupSnapshot,
    BufferBackupState,
)

from ..kernels import layout as L


class StorageHashes:
    """SGLang's storage-hash methods of the TreeCore interface (see the module)."""

    @property
    def enable_storage(self):
        return self._storage

    @enable_storage.setter
    def enable_storage(self, value):
        self._hashing_changed(bool(value), self.enable_external_cache_linker)
        self._storage = bool(value)

    @property
    def enable_external_cache_linker(self):
        return self._linker

    @enable_external_cache_linker.setter
    def enable_external_cache_linker(self, value):
        self._hashing_changed(self.enable_storage, bool(value))
        self._linker = bool(value)

    def _hashing_changed(self, storage, linker):
        on = storage or linker
        if on and not (self._storage or self._linker):
            self._hash_spans.append([int(self._eng.meta[L.M_CLOCK]), None])
        elif not on and (self._storage or self._linker) and self._hash_spans:
            self._hash_spans[-1][1] = int(self._eng.meta[L.M_CLOCK])

    def _is_hashed(self, s):
        if s == L.ROOT or self.kv_events.enabled:
            return True
        t = int(self._eng.st.nodes[s, L.CREATION])
        if t <= self._backfilled_at:
            return True
        return any(a <= t and (b is None or t < b) for a, b in self._hash_spans)

    def _node_key(self, s):
        """The node's key as SGLang's ``RadixKey`` (raw token ids, a copy)."""
        nodes, pool = self._eng.st.nodes, self._eng.st.pool
        off, n = int(nodes[s, L.KEY_OFF]), int(nodes[s, L.KEY_LEN])
        units = pool[off:off + n, L.TOK]
        if self.is_eagle:
            raw = (units >> 32).tolist() + ([int(units[-1]) & 0xFFFFFFFF] if n else [])
        else:
            raw = units.tolist()
        ek, salt = self._nk(s)
        return RadixKey(array("q", raw), ek, is_bigram=self.is_eagle, cache_salt=salt)

    def _storage_chain(self, s):
        """SGLang's storage hashes of node ``s``'s pages (hex strings), chained
        from its parent's last page (or the namespace seed under the root)."""
        from sglang.srt.mem_cache.utils import get_storage_hash_str

        nodes = self._eng.st.nodes
        if len(self._hash_memo) > 2 * int(self._eng.meta[L.M_NLIVE]) + 1024:
            self._hash_memo.clear()  # entries of dead nodes
        path = []
        a = s
        while a != L.ROOT:
            path.append(a)
            a = int(nodes[a, L.PARENT])
        prior = None
        hashes = []
        for a in reversed(path):
            memo = self._hash_memo.get(self._nid(a))
            stamp = (int(nodes[a, L.KEY_LEN]), int(nodes[a, L.PARENT]), prior)
            if memo is not None and memo[0] == stamp:
                hashes = memo[1]
            else:
                hashes = get_storage_hash_str(self._node_key(a), prior, page_size=self.page_size)
                self._hash_memo[self._nid(a)] = (stamp, hashes)
            if hashes:
                prior = hashes[-1]
        return list(hashes)

    def _hash_values(self, s):
        """The node's hash list (SGLang's ``node.hash_value``), None when unhashed."""
        nid = self._nid(s)
        if nid in self._hash_override:
            return self._hash_override[nid]
        if s == L.ROOT:
            return []
        if not self._is_hashed(s):
            return None
        return self._storage_chain(s)

    def get_last_hash_value(self, node_id):
        hv = self._hash_values(self._slot(node_id))
        return hv[-1] if hv else None

    def get_prefix_hash_values(self, node_id):
        nodes = self._eng.st.nodes
        s = self._slot(node_id)
        chunks = []
        a = int(nodes[s, L.PARENT]) if s != L.ROOT else -1
        while a >= 0:
            hv = self._hash_values(a)
            if hv is None:
                break
            chunks.append(hv)
            a = int(nodes[a, L.PARENT]) if a != L.ROOT else -1
        return [h for chunk in reversed(chunks) for h in chunk]

    def get_hash_values(self, node_id):
        return self._hash_values(self._slot(node_id)) or []

    def snapshot_buffer_backup(self, node_id, pass_prefix_keys):
        try:
            s = self._slot(node_id)
        except KeyError:
            return None
        if s == L.ROOT or not self._has(s, L.FULL):
            return None
        hv = self._hash_values(s)
        if not hv:
            return None
        p = int(self._eng.st.nodes[s, L.PARENT])
        return BufferBackupSnapshot(
            node_id=node_id, parent_node_id=self._nid(p), parent_is_root=p == L.ROOT,
            parent_last_hash=self.get_last_hash_value(self._nid(p)), hash_values=list(hv),
            key=self._node_key(s),
            prefix_keys=self.get_prefix_hash_values(node_id) if pass_prefix_keys else None)

    def validate_buffer_backup(self, node_id, expected_key_length):
        try:
            s = self._slot(node_id)
        except KeyError:
            return None
        nodes = self._eng.st.nodes
        if (s == L.ROOT or not self._has(s, L.FULL)
                or int(nodes[s, L.KEY_LEN]) != expected_key_length):
            return None
        p = int(nodes[s, L.PARENT])
        return BufferBackupState(parent_node_id=self._nid(p), parent_is_root=p == L.ROOT,
                                 parent_last_hash=self.get_last_hash_value(self._nid(p)))

    def backfill_missing_hash_values(self):
        filled = sum(1 for s in self._dfs_slots() if self._hash_values(s) is None)
        self._backfilled_at = int(self._eng.meta[L.M_CLOCK])
        for nid, hv in list(self._hash_override.items()):
            if hv is None:
                del self._hash_override[nid]
        return filled
