"""Node queries and inspection: read-only views of the tree, the only place above
the kernels that reads the node table.

The node queries (``slot``, ``nid``, ``flags``, ``key_len``, ``lock_ref``,
``anchored_locks``, ``device_state``, ``state_host_only``, ``state_needs_backup``,
``has``) read one field of one live node, O(1), and are what the façade and the
host tier use instead of indexing ``nodes[...]`` (``docs/architecture.md``, "The
core API"); an SGLang TreeCore adapter reads nodes through them too. The views
(``node_info``, ``pretty_print``, ``all_values_flatten`` and the DFS they share)
are for debugging and tests: none changes anything and none is on a hot path
(each is O(tree) or O(len(node))). Node ids are packed and unpacked by
``engine.node_id`` / ``engine.slot_of`` only.
"""

import numpy as np

from .engine import node_id
from .kernels import layout as L

_EMPTY = np.empty(0, dtype=np.int64)
#: Components named in ``pretty_print`` and ``node_info``.
_NAMES = {L.FULL: "full", L.SWA: "swa", L.MAMBA: "mamba"}


# ------------------------------------------------------------------ node queries
def slot(engine, nid):
    """The slot of node ``nid``, or -1 when it names no live node."""
    return int(engine.k.resolve_slot(nid))


def nid(engine, s):
    """The NodeId of the live node in slot ``s``."""
    return node_id(engine.st.nodes, s)


def flags(engine, s):
    """The node's ``FLAGS`` (``kernels/layout.py``: value-presence bits)."""
    return int(engine.st.nodes[s, L.FLAGS])


def has(engine, s, c, t=L.DEVICE):
    """Whether component ``c`` holds a value on tier ``t`` at the node."""
    return bool(engine.st.nodes[s, L.FLAGS] & L.F_HAS(c, t))


def key_len(engine, s):
    """The node's edge length in units."""
    return int(engine.st.nodes[s, L.KEY_LEN])


def lock_ref(engine, s, c=L.FULL, t=L.DEVICE):
    """The node's lock count of component ``c`` on tier ``t``."""
    return int(engine.st.nodes[s, L.LOCK_COL(c, t)])


def anchored_locks(engine, s):
    """Full locks anchored at the node itself (its lock_ref less its children's)."""
    nodes = engine.st.nodes
    return int(nodes[s, L.FULL_LOCK] - nodes[s, L.CHILD_LOCK])


def namespace(engine, s):
    """The node's namespace id (``Engine.ns``)."""
    return int(engine.st.nodes[s, L.NS])


def load_pending(engine, s):
    """The load id of a load-back restoring the node while in flight, else 0."""
    return int(engine.st.nodes[s, L.LOAD_PENDING])


def device_state(engine, s):
    """The node's Mamba device state slot, -1 when it holds none."""
    nodes = engine.st.nodes
    return int(nodes[s, L.MAMBA_SLOT]) if nodes[s, L.FLAGS] & L.F_HAS(L.MAMBA) else -1


def host_state(engine, s):
    """The node's Mamba host state slot, -1 when it holds none."""
    nodes = engine.st.nodes
    return int(nodes[s, L.MAMBA_HOST_SLOT]) if nodes[s, L.FLAGS] & L.F_HAS_MAMBA_HOST else -1


_STATE_BITS = L.F_HAS(L.MAMBA) | L.F_HAS_MAMBA_HOST


def state_host_only(engine, s):
    """The node's Mamba state is on the host only (a load-back restores it)."""
    return (int(engine.st.nodes[s, L.FLAGS]) & _STATE_BITS) == L.F_HAS_MAMBA_HOST


def state_needs_backup(engine, s):
    """The node holds a Mamba device state with no host copy."""
    return (int(engine.st.nodes[s, L.FLAGS]) & _STATE_BITS) == L.F_HAS(L.MAMBA)


def path_units(engine, nid, until=None):
    """The Full units from node ``nid`` up to (not including) node ``until`` (a node
    id; None: the root)."""
    return int(engine.k.path_units(nid, -1 if until is None else until))


def meta(engine, field):
    """``meta[field]`` as an int (``L.M_*``: counters and configuration)."""
    return int(engine.st.meta[field])


# ------------------------------------------------------------------ views
def dfs(nodes):
    """``(slot, depth)`` of every live node in DFS (stack) order from the root."""
    stack = [(L.ROOT, 0)]
    while stack:
        s, depth = stack.pop()
        yield s, depth
        kids = []
        c = int(nodes[s, L.FIRST_CHILD])
        while c != L.NIL:
            kids.append(c)
            c = int(nodes[c, L.NEXT_SIB])
        for c in reversed(kids):
            stack.append((c, depth + 1))


def components_of(meta):
    """The configured component ids, in order (FULL first)."""
    mask = int(meta[L.M_COMPONENTS])
    return [c for c in (L.FULL, L.SWA, L.MAMBA) if mask & (1 << c)]


def node_info(engine, slot, nid):
    """Dict of one live node's fields (copies of its key and Full value). O(len(node))."""
    nodes, pool, meta = engine.st.nodes, engine.st.pool, engine.st.meta
    row = nodes[slot]
    off, n = int(row[L.KEY_OFF]), int(row[L.KEY_LEN])
    parent = int(row[L.PARENT])
    info = {
        "node_id": nid,
        "parent": None if parent < 0 else node_id(nodes, parent),
        "key": pool[off:off + n, L.TOK].copy(),
        "value": (pool[off:off + n, L.FULL_DEV].copy() if row[L.FLAGS] & L.F_HAS_FULL_DEV
                  else pool[off:off, L.FULL_DEV].copy()),
        "lock_ref": int(row[L.FULL_LOCK]),
        "num_children": int(row[L.NCHILD]),
        "last_access": int(row[L.LAST_ACCESS]),
        "creation": int(row[L.CREATION]),
        "hit_count": int(row[L.HIT_COUNT]),
        "priority": int(row[L.PRIORITY]),
        "evictable_leaf": bool(row[L.HEAP_POS + L.HEAP_DEVICE] >= 0),
    }
    if meta[L.M_HOST]:
        backed = bool(row[L.FLAGS] & L.F_HAS_FULL_HOST)
        info["host_value"] = (pool[off:off + n, pool.shape[1] - 1].copy() if backed
                              else pool[off:off, L.FULL_DEV].copy())
        info["backuped"] = backed
        info["evicted"] = not (row[L.FLAGS] & L.F_HAS_FULL_DEV)
        info["write_through_pending"] = bool(row[L.WT_PENDING])
        info["evictable_host_leaf"] = bool(row[L.HOST_HEAP_POS] >= 0)
    for c in components_of(meta):
        if c != L.FULL:
            name = _NAMES[c]
            info[f"{name}_lock_ref"] = int(row[L.LOCK_COL(c)])
            info[f"has_{name}"] = bool(row[L.FLAGS] & L.F_HAS(c))
    if L.MAMBA in components_of(meta):
        info["mamba_value"] = (int(row[L.MAMBA_SLOT]) if row[L.FLAGS] & L.F_HAS(L.MAMBA)
                               else None)
    return info


def all_values_flatten(engine):
    """Every non-root node's Full device value, concatenated in DFS order (owned)."""
    nodes, pool = engine.st.nodes, engine.st.pool
    parts = [pool[int(nodes[s, L.KEY_OFF]):int(nodes[s, L.KEY_OFF] + nodes[s, L.KEY_LEN]),
                  L.FULL_DEV]
             for s, _ in dfs(nodes) if s != L.ROOT and nodes[s, L.FLAGS] & L.F_HAS_FULL_DEV]
    return np.concatenate(parts) if parts else _EMPTY.copy()


def device_rows_not_self(engine):
    """Device values (``flatradix/device.py``): the first ``(node id, pool row,
    value)`` of a live node with Full device data whose row does not name itself
    in ``FULL_DEV``, or None. O(live rows), vectorised."""
    nodes, pool = engine.st.nodes, engine.st.pool
    live = engine.live_slots()
    live = live[(live != L.ROOT) & ((nodes[live, L.FLAGS] & L.F_HAS_FULL_DEV) != 0)]
    if not live.size:
        return None
    offs, lens = nodes[live, L.KEY_OFF], nodes[live, L.KEY_LEN]
    starts = np.cumsum(lens) - lens
    rows = np.repeat(offs - starts, lens) + np.arange(int(lens.sum()), dtype=np.int64)
    bad = np.flatnonzero(pool[rows, L.FULL_DEV] != rows)
    if not bad.size:
        return None
    r = int(rows[bad[0]])
    s = int(live[np.searchsorted(starts, bad[0], side="right") - 1])
    return node_id(nodes, s), r, int(pool[r, L.FULL_DEV])


def all_host_values_flatten(engine):
    """Every node's Full host value (host pool slots), concatenated in DFS order (owned)."""
    nodes, pool = engine.st.nodes, engine.st.pool
    if not engine.st.meta[L.M_HOST]:
        return _EMPTY.copy()
    hc = pool.shape[1] - 1
    parts = [pool[int(nodes[s, L.KEY_OFF]):int(nodes[s, L.KEY_OFF] + nodes[s, L.KEY_LEN]), hc]
             for s, _ in dfs(nodes) if s != L.ROOT and nodes[s, L.FLAGS] & L.F_HAS_FULL_HOST]
    return np.concatenate(parts) if parts else _EMPTY.copy()


def all_swa_host_values_flatten(engine):
    """Every node's SWA host value (SWA host pool slots), concatenated in DFS order
    (owned; empty without SWA on the host tier)."""
    nodes, pool = engine.st.nodes, engine.st.pool
    meta = engine.st.meta
    if not meta[L.M_HOST] or not meta[L.M_COMPONENTS] & L.C_SWA:
        return _EMPTY.copy()
    hc = pool.shape[1] - 2
    parts = [pool[int(nodes[s, L.KEY_OFF]):int(nodes[s, L.KEY_OFF] + nodes[s, L.KEY_LEN]), hc]
             for s, _ in dfs(nodes) if s != L.ROOT and nodes[s, L.FLAGS] & L.F_HAS_SWA_HOST]
    return np.concatenate(parts) if parts else _EMPTY.copy()


def all_swa_full_values_flatten(engine):
    """The Full device values of the nodes holding SWA data, in DFS order (owned): the
    allocator maps them to the SWA slots the tree holds."""
    nodes, pool = engine.st.nodes, engine.st.pool
    parts = [pool[int(nodes[s, L.KEY_OFF]):int(nodes[s, L.KEY_OFF] + nodes[s, L.KEY_LEN]),
                  L.FULL_DEV]
             for s, _ in dfs(nodes) if s != L.ROOT and nodes[s, L.FLAGS] & L.F_HAS_SWA_DEV]
    return np.concatenate(parts) if parts else _EMPTY.copy()


def all_mamba_values_flatten(engine):
    """Every node's Mamba device state slot in DFS order (int64, owned)."""
    nodes = engine.st.nodes
    bit = L.F_HAS(L.MAMBA)
    return np.array([int(nodes[s, L.MAMBA_SLOT]) for s, _ in dfs(nodes)
                     if s != L.ROOT and nodes[s, L.FLAGS] & bit], dtype=np.int64)


def all_mamba_host_values_flatten(engine):
    """Every node's Mamba host state slot in DFS order (int64, owned)."""
    nodes = engine.st.nodes
    bit = L.F_HAS_MAMBA_HOST
    return np.array([int(nodes[s, L.MAMBA_HOST_SLOT]) for s, _ in dfs(nodes)
                     if s != L.ROOT and nodes[s, L.FLAGS] & bit], dtype=np.int64)


def pretty_lines(engine):
    """One line per node in DFS order: indentation, id, key head, Full lock_ref, and
    for each component whether it holds a device value."""
    nodes, pool, meta = engine.st.nodes, engine.st.pool, engine.st.meta
    comps = components_of(meta)
    lines = []
    for s, depth in dfs(nodes):
        row = nodes[s]
        off, n = int(row[L.KEY_OFF]), int(row[L.KEY_LEN])
        head = pool[off:off + min(n, 8), L.TOK].tolist()
        has = " ".join(f"{_NAMES[c]}={'yes' if row[L.FLAGS] & L.F_HAS(c) else 'no'}"
                       for c in comps)
        if meta[L.M_HOST] and s != L.ROOT:
            has += (" tier=" + ("D+H" if row[L.FLAGS] & L.F_HAS_FULL_HOST else "D")
                    if row[L.FLAGS] & L.F_HAS_FULL_DEV else " tier=H")
        lines.append(f"{'  ' * depth}[{node_id(nodes, s)}] len={n} key={head}"
                     f"{'...' if n > 8 else ''} full_lock={int(row[L.FULL_LOCK])} {has}")
    return lines
