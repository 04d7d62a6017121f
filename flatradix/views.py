"""The cache's read-only views: sizes and configuration queries (``evictable_size``,
``total_size``, ``supports_swa``, ...: the engine's ledgers, O(1)), the node views
(``path_device_indices``, ``node_info``, ``all_values_flatten``,
``all_mamba_values_flatten``, ``pretty_print``) and ``sanity_check``. Methods of
``UnifiedRadixCache`` (each takes the cache as ``self``), kept in their own module.
"""

from . import inspection
from ._cast import as_node_id
from .errors import CacheInvariantError
from .config import _component
from .kernels import layout as L


def evictable_size(self):
    """Full units held by unlocked nodes."""
    return int(self._engine.meta[L.M_EVICTABLE + L.FULL])

def protected_size(self):
    """Full units held by locked nodes."""
    return int(self._engine.meta[L.M_PROTECTED + L.FULL])


def component_evictable_size(self, component):
    """Units held by unlocked nodes for ``component`` (0 for one not configured).
    ``ValueError`` naming ``component`` when it is not a ComponentType."""
    return int(self._engine.meta[L.M_EVICTABLE + int(_component(component))])

def component_protected_size(self, component):
    """Units held by locked nodes for ``component`` (0 for one not configured)."""
    return int(self._engine.meta[L.M_PROTECTED + int(_component(component))])

def swa_evictable_size(self):
    """SWA tokens held by nodes outside every window lock (0 without SWA)."""
    return int(self._engine.meta[L.M_EVICTABLE + L.SWA])

def swa_protected_size(self):
    """SWA tokens held by nodes inside a window lock (0 without SWA)."""
    return int(self._engine.meta[L.M_PROTECTED + L.SWA])

def mamba_evictable_size(self):
    """Mamba states held by nodes without a Mamba lock (0 without Mamba)."""
    return int(self._engine.meta[L.M_EVICTABLE + L.MAMBA])

def mamba_protected_size(self):
    """Mamba states held by Mamba-locked nodes (0 without Mamba)."""
    return int(self._engine.meta[L.M_PROTECTED + L.MAMBA])

def all_mamba_values_flatten(self):
    """Every node's Mamba device state slot, in DFS order (int64 1-D, the Mamba
    allocator's kind; empty without Mamba)."""
    with self._mutex:
        flat = inspection.all_mamba_values_flatten(self._engine)
    return self._mamba_slots(flat) if self._mamba else flat

def total_size(self):
    """``(full_units, aux_units)`` held on device: Full tokens, and the auxiliary
    components' units lumped together (SWA tokens + Mamba states; 0 for
    Full-only), as SGLang."""
    meta = self._engine.meta
    return int(meta[L.M_TOTAL + L.FULL]), int(meta[L.M_TOTAL + L.SWA] + meta[L.M_TOTAL + L.MAMBA])

def node_count(self):
    """Live nodes, root excluded."""
    return int(self._engine.meta[L.M_NLIVE]) - 1

def available_and_evictable_str(self):
    """What can be allocated now or after eviction, one line per pool (SGLang's
    format: the first line starts with ``"Available full tokens: "``, an SWA
    cache's second line with ``"Available swa: "``, as SGLang names the component)."""
    alloc = self.token_to_kv_pool_allocator
    if self._swa:
        avail = alloc.full_available_size()
        ev = self.evictable_size()
        swa_avail, swa_ev = alloc.swa_available_size(), self.swa_evictable_size()
        return (f"Available full tokens: {avail + ev} (available: {avail} + evictable: {ev})\n"
                f"Available swa: {swa_avail + swa_ev} (available: {swa_avail} + "
                f"evictable: {swa_ev})\n")
    avail = alloc.available_size() if alloc is not None else 0
    ev = self.evictable_size()
    return (f"Available full tokens: {avail + ev} (available: {avail} + evictable: {ev})\n")

def supports_swa(self):
    return self._swa

def mamba_max_states_per_path(self):
    """The per-path Mamba state cap given at construction (-1: off); read-only
    (the kernels read it from the tree's meta array)."""
    return self._path_cap

def supports_mamba(self):
    return self._mamba

def supports_prefix_sharing(self):
    return not self.disable

def sliding_window_size(self):
    """The SWA retain window in tokens (None without SWA)."""
    return self._window if self._swa else None


def path_device_indices(self, node):
    """KV indices on the path root -> ``node`` (int64, 1-D; with device values a
    device array: one gather). ``NodeAccessError`` if stale."""
    nid = as_node_id(node, "node")
    eng = self._engine
    with self._mutex:
        st, n = eng.k.path_device_indices(nid)
        if st == L.E_STALE:
            raise self._stale(nid)
        if self._vals.dev is not None:
            return self._vals.dev.take(eng.out[:n])
        return self._vals.out(eng.out[:n].copy())


def node_info(self, node):
    """Debug view of one node: dict of its fields (key units, value, lock_ref, ...).
    O(len(node)): copies its key and value."""
    with self._mutex:
        info = inspection.node_info(self._engine, self._slot(node), as_node_id(node))
        if self._vals.dev is not None:   # pool rows: the device values (a gather)
            info["value"] = self._vals.dev.take(info["value"])
        return info


def all_values_flatten(self):
    """Every non-root node's Full device value, concatenated in DFS order."""
    with self._mutex:
        flat = inspection.all_values_flatten(self._engine)
        if self._vals.dev is not None:   # pool rows: one gather
            return self._vals.dev.take(flat)
    return self._vals.out(flat)


def pretty_print(self, file=None):
    """Print one line per node in DFS order (format informative only) to ``file``
    (a text stream with ``write``; ``None``: stdout). Changes nothing."""
    if file is not None and not callable(getattr(file, "write", None)):
        raise TypeError(f"file must be a text stream with write() or None, got "
                        f"{type(file).__name__}")
    with self._mutex:
        lines = inspection.pretty_lines(self._engine)
        lines.append(f"#tokens: {self.total_size()[0]}, evictable: {self.evictable_size()}, "
                     f"protected: {self.protected_size()}")
    print("\n".join(lines), file=file)


def sanity_check(self):
    """Recompute every invariant (tree links, child table, lock counts, the
    evictable-leaf heap, size ledgers incl. evictable + protected == total,
    the free node-slot list, the accounting of the tree's own pool rows) in one
    kernel; with Mamba, that no state slot is held by two nodes. The tree is
    not compared with the allocators (a slot the tree holds but an allocator
    lists as free, or a host slot on two nodes, is not seen here: the tests'
    partition checks do that). Raises ``CacheInvariantError``
    (an ``AssertionError``) naming the failed check and node. O(tree)."""
    with self._mutex:
        code, slot = self._engine.k.sanity_check()
        if code != 0:
            from .core import check

            nid = None if slot < 0 else inspection.nid(self._engine, int(slot))
            raise CacheInvariantError(
                f"Sanity check FAILED: code {int(code)} on node {nid} "
                f"(see flatradix.core.check: {check.__doc__.split(chr(10))[0]})")
        if self._mamba:
            slots = inspection.all_mamba_values_flatten(self._engine).tolist()
            if len(set(slots)) != len(slots) or set(slots) != self._vals.mamba_owned:
                raise CacheInvariantError(
                    "Sanity check FAILED: Mamba state slots held by two nodes, or the "
                    "tree's slots differ from the slots it is known to hold")
        if self._vals.dev is not None:
            # device values: every device row names itself (no tag left behind)
            bad = inspection.device_rows_not_self(self._engine)
            if bad is not None:
                raise CacheInvariantError(
                    f"Sanity check FAILED: device values: pool row {bad[1]} of node "
                    f"{bad[0]} holds {bad[2]}, not its own row (a claim was missed)")
            self._vals.dev.checks.surface()   # the sync point: DeviceValueError
