"""Read-only walks and sizes of the ``flatradix`` TreeCore: the size ledgers,
SGLang's ordering and path queries (``dfs_weight_order``, ``collect_path_info``),
the whole-tree reads (``all_values_flatten``, ``walk_for_kv_canary``,
``pretty_print``). None of them changes the tree; the hot request path is not
here (``core.py``).

A mixin of ``FlatradixTreeCore`` (``core.py``): it reads the core's engine
(``self._eng``) and node helpers (``_slot``, ``_nid``, ``_has``, ``_full_np``,
``_t``).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from sglang.srt.mem_cache.unified_cache.unified_tree_core_interface import (
    RadixCacheWalkResult,
    TreePathNodeInfo,
)

from ..kernels import layout as L
from .params import FULL, MAMBA, SWA, ComponentType


class TreeReads:
    """The TreeCore interface's read-only walks and sizes (see the module)."""

    def is_write_through_compatible(self):
        nodes = self._eng.st.nodes
        for s in self._eng.live_slots():
            if s == L.ROOT:
                continue
            f = int(nodes[s, L.FLAGS])
            if not f & L.F_HAS_FULL_HOST:
                if f & (L.F_HAS_SWA_HOST | L.F_HAS_MAMBA_HOST):
                    return False
            else:
                p = int(nodes[s, L.PARENT])
                if p != L.ROOT and not nodes[p, L.FLAGS] & L.F_HAS_FULL_HOST:
                    return False
        return True

    def _children(self, s):
        nodes = self._eng.st.nodes
        c = int(nodes[s, L.FIRST_CHILD])
        out = []
        while c != L.NIL:
            out.append(c)
            c = int(nodes[c, L.NEXT_SIB])
        return out

    def dfs_weight_order(self, node_ids):
        slots = [self._slot(n) for n in node_ids]
        nodes = self._eng.st.nodes
        at = {}
        for i, s in enumerate(slots):
            at.setdefault(s, []).append(i)
        weight = defaultdict(int)
        kids = defaultdict(list)  # the ancestors of the requested nodes only
        for s, idx in at.items():
            a = s
            w = len(idx)
            while True:
                first = a not in weight
                weight[a] += w
                if a == L.ROOT:
                    break
                p = int(nodes[a, L.PARENT])
                if first:
                    kids[p].append(a)
                a = p
        order = []
        stack = [(L.ROOT, False)]
        while stack:
            s, done = stack.pop()
            if done:
                order.extend(at.get(s, ()))
                continue
            stack.append((s, True))
            ch = sorted(kids.get(s, ()), key=lambda c: (-weight[c], int(nodes[c, L.CREATION])))
            for c in reversed(ch):
                stack.append((c, False))
        return order

    def collect_path_info(self, end_node_ids):
        nodes = self._eng.st.nodes
        paths = []
        for nid in end_node_ids:
            s = self._slot(nid)
            chain = []
            while s != L.ROOT:
                chain.append(s)
                s = int(nodes[s, L.PARENT])
            path = []
            start = 0
            for s in reversed(chain):
                n = int(nodes[s, L.KEY_LEN])
                path.append(TreePathNodeInfo(
                    self._nid(s), self._nid(int(nodes[s, L.PARENT])), start, start + n,
                    n if nodes[s, L.FLAGS] & L.F_HAS_FULL_DEV else None,
                    int(nodes[s, L.NCHILD])))
                start += n
            paths.append(tuple(path))
        return tuple(paths)

    # ==== sizes ====
    def _ledger(self, field, c):
        if c not in self.tree_components:
            return 0
        return int(self._eng.meta[field + int(c)])

    def evictable_size(self):
        return self._ledger(L.M_EVICTABLE, FULL)

    def protected_size(self):
        return self._ledger(L.M_PROTECTED, FULL)

    def component_evictable_size(self, component_type):
        return self._ledger(L.M_EVICTABLE, ComponentType(component_type))

    def component_protected_size(self, component_type):
        return self._ledger(L.M_PROTECTED, ComponentType(component_type))

    def adjust_component_size(self, node_id, component_type, delta):
        raise NotImplementedError("adjust_component_size: not served by the flatradix TreeCore "
                                  "(no component whose backing changes in place)")

    def full_evictable_size(self):
        return self._ledger(L.M_EVICTABLE, FULL)

    def full_protected_size(self):
        return self._ledger(L.M_PROTECTED, FULL)

    def swa_evictable_size(self):
        return self._ledger(L.M_EVICTABLE, SWA)

    def mamba_evictable_size(self):
        return self._ledger(L.M_EVICTABLE, MAMBA)

    def swa_protected_size(self):
        return self._ledger(L.M_PROTECTED, SWA)

    def mamba_protected_size(self):
        return self._ledger(L.M_PROTECTED, MAMBA)

    def total_size(self):
        meta = self._eng.meta
        full = int(meta[L.M_TOTAL + L.FULL])
        aux = 0
        if self._swa_on:
            aux += int(meta[L.M_TOTAL + L.SWA])
        if self._mamba_on:
            aux += int(meta[L.M_TOTAL + L.MAMBA])
        return full, aux

    def _dfs_slots(self):
        """Every live non-root slot, depth-first (children in list order)."""
        stack = list(reversed(self._children(L.ROOT)))
        out = []
        while stack:
            s = stack.pop()
            out.append(s)
            stack.extend(reversed(self._children(s)))
        return out

    def all_values_flatten(self):
        get = self._full_np if self._dev is None else self._rows
        parts = [get(s) for s in self._dfs_slots() if self._has(s, L.FULL)]
        return self._values_t(np.concatenate(parts)) if parts else self._empty_t.clone()

    def all_mamba_values_flatten(self):
        nodes = self._eng.st.nodes
        vals = [int(nodes[s, L.MAMBA_SLOT]) for s in self._dfs_slots() if self._has(s, L.MAMBA)]
        return self._t(np.array(vals, dtype=np.int64))

    def walk_for_kv_canary(self, unlocked_only, swa_resident_only):
        nodes = self._eng.st.nodes
        slots, pos, prev = [], [], []
        stack = [(c, 0, -1) for c in reversed(self._children(L.ROOT))]
        while stack:
            s, depth, last = stack.pop()
            n = int(nodes[s, L.KEY_LEN])
            # (device values: pool rows here, gathered at the end)
            vals = ((self._full_np if self._dev is None else self._rows)(s)
                    if self._has(s, L.FULL) else None)
            child_last = last
            if vals is not None and n:
                locked = any(nodes[s, L.LOCK_COL(c)] for c in (L.FULL, L.SWA, L.MAMBA))
                keep = not (unlocked_only and locked) and not (
                    swa_resident_only and self._swa_on and not self._has(s, L.SWA))
                if keep:
                    slots.append(vals.copy())
                    pos.append(np.arange(depth, depth + n, dtype=np.int64))
                    pv = np.empty(n, dtype=np.int64)
                    pv[0] = last
                    pv[1:] = vals[:-1]
                    prev.append(pv)
                child_last = int(vals[-1])
            for c in reversed(self._children(s)):
                stack.append((c, depth + n, child_last))
        cat = (lambda p: self._t(np.concatenate(p)) if p else self._empty_t.clone())
        if self._dev is not None and slots:
            rows, prow = np.concatenate(slots), np.concatenate(prev)
            prev_t = self._dev.take(np.maximum(prow, 0))
            none = np.flatnonzero(prow < 0)   # a path's first unit: no previous slot (-1)
            if none.size:
                prev_t.index_fill_(0, self._dev.ops.send(none), -1)
            return RadixCacheWalkResult(slot_indices=self._dev.take(rows), positions=cat(pos),
                                        prev_slot_indices=prev_t)
        return RadixCacheWalkResult(slot_indices=cat(slots), positions=cat(pos),
                                    prev_slot_indices=cat(prev))

    def pretty_print(self):
        nodes, pool = self._eng.st.nodes, self._eng.st.pool
        stack = [(c, 0) for c in reversed(self._children(L.ROOT))]
        print(f"root {self._root}")
        while stack:
            s, d = stack.pop()
            off, n = int(nodes[s, L.KEY_OFF]), int(nodes[s, L.KEY_LEN])
            toks = pool[off:off + min(n, 10), L.TOK].tolist()
            print(" " * (2 * d + 2) + f"{self._nid(s)} len={n} {toks} "
                  f"lock={int(nodes[s, L.FULL_LOCK])}")
            stack.extend((c, d + 1) for c in reversed(self._children(s)))
