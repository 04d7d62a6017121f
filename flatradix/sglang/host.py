"""The host tier (HiCache), storage and the external cache linker in the
``flatradix`` TreeCore: not served yet. SGLang's controller calls
``set_hicache_enabled()`` when it wires a host tier; that refuses with a
``ValueError`` naming the option, so no later call can give a wrong answer. The
other host-tier methods raise ``NotImplementedError`` (reached only by a caller
that bypasses the controller).

A mixin of ``FlatradixTreeCore`` (``core.py``).
"""

from __future__ import annotations

from sglang.srt.mem_cache.unified_cache.unified_tree_core_interface import (
    DriveHostEvictionResult,
)

from ..kernels import layout as L
from .params import SWA, ComponentType


class HostTierRefusals:
    """The TreeCore interface's host-tier methods (see the module)."""

    def inc_host_lock_ref(self, node_id):
        self._host_not_served("inc_host_lock_ref")

    def dec_host_lock_ref(self, node_id, params):
        self._host_not_served("dec_host_lock_ref")

    def finish_mamba_state_eviction(self, node_id):
        self._host_not_served("finish_mamba_state_eviction")

    def finish_swa_state_eviction(self, node_id):
        self._host_not_served("finish_swa_state_eviction")

    def drop_subtree_no_host(self, node_id):
        self._host_not_served("drop_subtree_no_host")

    def demote(self, node_id):
        self._host_not_served("demote")

    def drive_host_eviction(self, component_type, num_tokens):
        if not self.enable_hicache:
            return DriveHostEvictionResult()
        self._host_not_served("drive_host_eviction")

    def evict_excess_path_states(self, tail_node_id, device_frees, host_frees, cache_actions):
        self._host_not_served("evict_excess_path_states")

    # ==== HiCache ====
    def _host_not_served(self, what):
        raise NotImplementedError(f"{what}: the flatradix TreeCore does not serve the host tier "
                                  "(HiCache) yet")

    def set_hicache_enabled(self):
        raise ValueError("the flatradix TreeCore does not serve the host tier (HiCache) yet; "
                         "use the rust or python TreeCore with --enable-hierarchical-cache")

    def set_host_memory_buffer_only(self):
        self.set_hicache_enabled()

    def insert_host(self, node_id, key, host_value, hash_value):
        self._host_not_served("insert_host")

    def build_backup_spec(self, node_id):
        self._host_not_served("build_backup_spec")

    def build_storage_backup_spec(self, node_id, pass_prefix_keys):
        self._host_not_served("build_storage_backup_spec")

    def build_hicache_transfers(self, component_type, node_id, phase, *, host_indices=None,
                                token_ids=None, prefetch_tokens=0, staging_tokens=0,
                                last_hash=None):
        self._host_not_served("build_hicache_transfers")

    def build_load_back_spec(self, node_id, req=None):
        self._host_not_served("build_load_back_spec")

    def prefetch_anchor_info(self, node_id):
        s = self._slot(node_id)
        return self._eng.ns.key_of(int(self._eng.st.nodes[s, L.NS]))

    def commit_hicache_transfers(self, node_id, phase, comp_xfers, *, cache_actions,
                                 insert_result=None, pool_storage_result=None):
        self._host_not_served("commit_hicache_transfers")

    def commit_backup(self, node_id, host_indices, comp_xfers):
        self._host_not_served("commit_backup")

    def commit_load_back(self, node_id, device_indices, kv_xfer, comp_xfers):
        self._host_not_served("commit_load_back")

    def finish_load_back(self, anchor_node_id):
        self._host_not_served("finish_load_back")

    # ==== external cache linker ====
    def build_external_linker_offload_transfers(self, node_id):
        self._host_not_served("the external cache linker")

    def mark_external_cache_stored_path(self, from_node_id, until_node_id):
        self._host_not_served("the external cache linker")

    def mark_external_linker_offload_pending(self, node_id):
        self._host_not_served("the external cache linker")

    def finish_external_linker_offload(self, node_ids, ack_id, success):
        self._host_not_served("the external cache linker")

    def mark_write_through_pending(self, node_ids, ack_id):
        self._host_not_served("mark_write_through_pending")

    def finish_write_through(self, node_ids, ack_id):
        self._host_not_served("finish_write_through")

    # ==== SWA windows (host tier), host values ====
    def swa_tombstone_ranges(self, key, start, end, component_type=SWA):
        self._host_not_served("swa_tombstone_ranges")

    def attach_swa_window(self, key, window_start, window_end, swa_values,
                          component_type=SWA):
        self._host_not_served("attach_swa_window")

    def component_has_host_value_only(self, node_id, component_type):
        s = self._slot(node_id)
        c = int(ComponentType(component_type))
        return self._has(s, c, L.HOST) and not self._has(s, c)
