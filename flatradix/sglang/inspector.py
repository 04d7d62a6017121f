"""The TreeCore's test-only inspection surface (SGLang's ``UnifiedTreeCoreInspectionInterface``).

SGLang's shared unit suite builds every cache through its test kit, which
requires the TreeCore to implement these 35 methods besides the production
interface: white-box reads of a node (parent, children, key, lock counts, LRU
membership) and deliberate corruptions the suite uses to check that
``sanity_check`` catches them. They read and write the engine's node table
directly (a corruption is meant to bypass the rules); runtime code never calls
them.
"""

from __future__ import annotations

import numpy as np

from sglang.srt.mem_cache.unified_cache.components.base import EvictLayer
from sglang.srt.mem_cache.unified_cache.unified_tree_core_interface import BaseEvictionResult
from sglang.test.kits.unified_radix_cache.unified_tree_core_inspection_interface import (
    UnifiedTreeCoreInspectionInterface,
)

from ..components.dispatch import PRIORITY_INTERNAL
from ..kernels import layout as L
from ..kernels.dups import dup_update as _dup_update
from ..kernels.lru import lru_in_list, lru_push_front, lru_remove
from ..kernels.order import is_device_leaf as _is_device_leaf
from .core import FlatradixTreeCore
from .params import _CT, MAMBA, SWA, _np_values

_LRU = {SWA: (L.LRU_SWA, L.LRU_SWA_HOST), MAMBA: (L.LRU_MAMBA, L.LRU_MAMBA_HOST)}


class FlatradixTreeCoreInspector(FlatradixTreeCore, UnifiedTreeCoreInspectionInterface):
    """``FlatradixTreeCore`` with SGLang's inspection methods (test kits only)."""

    def contains_node(self, node_id):
        try:
            self._slot(node_id)
        except KeyError:
            return False
        return True

    def get_parent_node_id(self, node_id):
        s = self._slot(node_id)
        return None if s == L.ROOT else self._nid(int(self._eng.st.nodes[s, L.PARENT]))

    def get_child_node_ids(self, node_id):
        return [self._nid(c) for c in self._children(self._slot(node_id))]

    def get_node_key_length(self, node_id):
        return int(self._eng.st.nodes[self._slot(node_id), L.KEY_LEN])

    def get_node_token_ids(self, node_id):
        s = self._slot(node_id)
        nodes, pool = self._eng.st.nodes, self._eng.st.pool
        off, n = int(nodes[s, L.KEY_OFF]), int(nodes[s, L.KEY_LEN])
        units = pool[off:off + n, L.TOK]
        if not self.is_eagle:
            return units.tolist()
        if n == 0:
            return []
        return (units >> 32).tolist() + [int(units[-1]) & 0xFFFFFFFF]

    def is_node_key_bigram(self, node_id):
        self._slot(node_id)
        return self.is_eagle

    def get_component_host_value(self, node_id, component_type):
        self._slot(node_id)
        return None

    def get_component_device_lock_ref(self, node_id, component_type):
        s = self._slot(node_id)
        c = int(component_type)
        if _CT.get(c) not in self.tree_components:
            return 0
        return int(self._eng.st.nodes[s, L.LOCK_COL(c)])

    def get_component_host_lock_ref(self, node_id, component_type):
        s = self._slot(node_id)
        c = int(component_type)
        if _CT.get(c) not in self.tree_components:
            return 0
        return int(self._eng.st.nodes[s, L.LOCK_COL(c, L.HOST)])

    def get_node_hit_count(self, node_id):
        return int(self._eng.st.nodes[self._slot(node_id), L.HIT_COUNT])

    def get_write_through_pending_id(self, node_id):
        v = int(self._eng.st.nodes[self._slot(node_id), L.WT_PENDING])
        return v or None

    def is_external_cache_stored(self, node_id):
        self._slot(node_id)
        return False

    def _in_lru(self, node_id, component_type, tier):
        s = self._slot(node_id)
        lists = _LRU.get(component_type)
        if lists is None or component_type not in self.tree_components:
            return False
        return bool(lru_in_list(self._eng.st.nodes, lists[tier], s))

    def is_node_in_device_lru(self, node_id, component_type):
        return self._in_lru(node_id, component_type, 0)

    def is_node_in_host_lru(self, node_id, component_type):
        return self._in_lru(node_id, component_type, 1)

    def get_component_device_lru_node_ids(self, component_type):
        lists = _LRU.get(component_type)
        if lists is None or component_type not in self.tree_components:
            return []
        nodes = self._eng.st.nodes
        lst = lists[0]
        head, tail = L.SENTINEL0 + 2 * lst, L.SENTINEL0 + 2 * lst + 1
        out = []
        x = int(nodes[head, L.LRU_NEXT + lst])
        while x != tail:
            out.append(self._nid(x))
            x = int(nodes[x, L.LRU_NEXT + lst])
        return out

    def is_device_evictable_leaf(self, node_id):
        try:
            s = self._slot(node_id)
        except KeyError:
            return False
        return int(self._eng.st.nodes[s, L.HEAP_POS]) >= 0

    def is_host_evictable_leaf(self, node_id):
        try:
            s = self._slot(node_id)
        except KeyError:
            return False
        return int(self._eng.st.nodes[s, L.HOST_HEAP_POS]) >= 0

    def is_device_leaf(self, node_id):
        return bool(_is_device_leaf(self._eng.st.nodes, self._slot(node_id)))

    def get_all_node_ids(self):
        return [self._root] + [self._nid(s) for s in self._dfs_slots()]

    def set_node_hash_values(self, node_id, hash_values):
        self._slot(node_id)
        self._hash_override[node_id] = None if hash_values is None else list(hash_values)

    def set_component_device_value_raw(self, node_id, component_type, value):
        s = self._slot(node_id)
        c = int(component_type)
        nodes = self._eng.st.nodes
        bit = L.F_HAS(c)
        if value is None:
            nodes[s, L.FLAGS] &= ~bit
            if c == L.MAMBA:
                nodes[s, L.MAMBA_SLOT] = L.NIL
            return
        if c == L.FULL and self._dev is not None:   # device values: into the arena rows
            n = int(nodes[s, L.KEY_LEN])
            v = self._dev.native(value.reshape(-1), "value")
            if v.shape[0] != n:
                raise ValueError(f"value: {v.shape[0]} Full values for a node of {n} units")
            off = int(nodes[s, L.KEY_OFF])
            self._eng.st.pool[off:off + n, L.FULL_DEV] = np.arange(off, off + n)
            self._dev.arena.write(off, v, 0, n)
            nodes[s, L.FLAGS] |= bit
            return
        v = _np_values(value, "value").reshape(-1)
        if c == L.FULL:
            n = int(nodes[s, L.KEY_LEN])
            if v.shape[0] != n:
                raise ValueError(f"value: {v.shape[0]} Full values for a node of {n} units")
            off = int(nodes[s, L.KEY_OFF])
            self._eng.st.pool[off:off + n, L.FULL_DEV] = v
        elif c == L.MAMBA:
            nodes[s, L.MAMBA_SLOT] = int(v[0])
        nodes[s, L.FLAGS] |= bit

    def set_component_host_value_raw(self, node_id, component_type, value):
        raise NotImplementedError("set_component_host_value_raw: the host tier is not served "
                                  "by the flatradix TreeCore yet")

    def set_component_device_lock_ref(self, node_id, component_type, lock_ref):
        assert lock_ref >= 0
        self._eng.st.nodes[self._slot(node_id), L.LOCK_COL(int(component_type))] = lock_ref

    def remove_node_from_device_lru(self, node_id, component_type):
        s = self._slot(node_id)
        lst = _LRU[component_type][0]
        assert lru_in_list(self._eng.st.nodes, lst, s)
        lru_remove(self._eng.st.nodes, lst, s)

    def insert_node_into_host_lru(self, node_id, component_type):
        s = self._slot(node_id)
        lst = _LRU[component_type][1]
        assert not lru_in_list(self._eng.st.nodes, lst, s)
        lru_push_front(self._eng.st.nodes, lst, s)

    def set_component_evictable_size(self, component_type, value):
        assert value >= 0
        self._eng.meta[L.M_EVICTABLE + int(component_type)] = value

    def set_component_protected_size(self, component_type, value):
        assert value >= 0
        self._eng.meta[L.M_PROTECTED + int(component_type)] = value

    def update_duplicate_tracking(self, node_id):
        s = self._slot(node_id)
        if self._eng.meta[L.M_HOST]:
            _dup_update(self._eng.st.nodes, self._eng.meta, s)

    def advance_insert_walk_once(self):
        raise RuntimeError("no in-flight insert")

    def evict_component(self, node_id, component_type, target):
        if target != EvictLayer.DEVICE or component_type not in (SWA, MAMBA):
            raise NotImplementedError(f"evict_component({component_type.name}, {target}): "
                                      "the flatradix TreeCore inspector serves an auxiliary "
                                      "component's device layer")
        self._slot(node_id)
        result = BaseEvictionResult()
        eng = self._eng
        st, units = eng.k.evict_component_at(node_id, int(component_type))
        self._convert(eng.actions(), eng.out, None, frees=result.device_frees)
        if units:
            result.tracker[component_type] += int(units)
        return result

    def validate_cascade_evict(self, node_id, component_type, target):
        """SGLang's cascade check: evicting ``component_type`` from the node also
        evicts every component of lower or equal priority (all equal on an
        evictable leaf; ``PRIORITY_INTERNAL`` on an internal node); a lock on one
        whose internal priority is below the trigger's is a stranded lock:
        ``AssertionError``."""
        s = self._slot(node_id)
        nodes = self._eng.st.nodes
        leaf = int(nodes[s, L.HEAP_POS]) >= 0
        trig = int(component_type)
        for c in self.tree_components:
            c = int(c)
            if c == trig or not self._has(s, c):
                continue
            prio = 0 if leaf else PRIORITY_INTERNAL[c]
            if prio > (0 if leaf else PRIORITY_INTERNAL[trig]):
                continue
            if PRIORITY_INTERNAL[c] >= PRIORITY_INTERNAL[trig]:
                continue  # a legitimate pin of a higher tier is spared
            assert nodes[s, L.LOCK_COL(c)] == 0, (
                f"cascade eviction of {component_type.name} on node {node_id} hits a locked "
                f"{_CT[c].name}")

    def cleanup_tombstone_ancestors(self, node_id):
        self._slot(node_id)
        return BaseEvictionResult()

    def finalize_component_match_result(self, component_type, result, params, value_chunks,
                                        best_value_len):
        ct = component_type
        if ct == SWA and self._swa_on:
            boundary = result.device_prefix_len + result.host_hit_length
            aligned = result.full_kv_hit_length // self.page_size * self.page_size
            return result._replace(swa_branching_seqlen=aligned if aligned > boundary else None)
        if ct == MAMBA and self._mamba_on:
            boundary = result.device_prefix_len + result.host_hit_length
            aligned = result.full_kv_hit_length // self._mamba_grid * self._mamba_grid
            return result._replace(
                mamba_branching_seqlen=aligned if aligned > boundary else None)
        return result

    def build_backup_node_ids(self, node_id, write_back=False):
        self._host_not_served("build_backup_node_ids")
