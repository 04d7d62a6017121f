"""The tree's memory layout: the single place a reader learns the node table.

All tree state lives in a handful of C-contiguous numpy arrays owned by the
engine (``flatradix.engine.TreeArrays``) and mutated only by the ``@njit``
kernels of this package and of ``flatradix.components``. Every entry kernel
takes the five tree arrays first, in this order (dispatch costs ~40 ns per
array argument, so there are few):

``nodes``  NodeTable = int64 ``(node_capacity, NCOL)``
    The node table, one row per *slot*. Columns below (``NODE_COLUMNS``); each
    names the kernel module that may write it. Row ``ROOT`` (slot 0) is the
    root; rows ``SENTINEL0 .. SENTINEL0 + N_SENTINELS - 1`` are the head/tail
    sentinels of the auxiliary LRU lists (``kernels/lru.py``), never alive.
``ctab``   ChildTable = int64 ``(child_capacity, CT_NCOL)``
    Open-addressing child table keyed by ``(parent slot, namespace, page
    key)``; power-of-two capacity, linear probing, tombstones
    (``kernels/children.py``).
``pool``   Pool = int64 ``(pool_capacity, POOL_NCOL or POOL_NCOL_EVENTS)``
    Token and value pool. A node's edge key is the span
    ``pool[KEY_OFF : KEY_OFF + KEY_LEN, TOK]``; its Full device value (KV
    indices, one per logical unit) is the *same* span of column ``FULL_DEV``,
    and with the host tier its Full host value the same span of the last column.
    Value spans coincide with key spans because a Full value always has one
    entry per logical unit, so a split is two span updates and copies nothing.
    An SWA value is not stored: it is the SWA allocator's mapping of the Full
    value (``flatradix.values``), so a node holds SWA data iff its
    ``F_HAS(SWA)`` bit is set. Space of removed nodes is counted in
    ``meta[M_POOL_DEAD]`` and reclaimed by compaction (``kernels/state.py:
    compact_pool``) or, without copying, by a gap pass: new spans go to
    ``meta[M_POOL_CUR]`` inside a dead gap ``[M_POOL_CUR, M_POOL_LIM)`` that the
    engine took from ``kernels/state.py: pool_gaps`` (``flatradix/engine.py``).
``heap``   Heaps = int64 ``(HEAP_ROWS, node_capacity)``
    Binary min-heaps of node slots, one per heap id (``HEAP_DEVICE``: every
    *evictable device leaf*; ``HEAP_HOST``: every *evictable host leaf*, host
    tier), then the three rows of a step-wise Full round's
    snapshot heap (``WALK_K0/K1/NID``), ordered by the eviction policy
    (``kernels/order.py``). Kept incrementally, so an eviction round costs
    O(evicted * log leaves), never O(tree).
``meta``   Meta = int64 ``(META_LEN,)``
    Counters and configuration (indices ``M_*``, generated from ``META_FIELDS``).

Scratch outputs, passed only to the kernels that write them:

``out``    int64 1-D, grown on demand (never sized by the pool)
    Values referenced by actions (freed KV indices) and path queries
    (``match_prefix`` writes into its own result array instead).
``acts``   Actions = int64 ``(action_capacity, ACT_NCOL)``
    The action buffer (``kernels/actions.py``): what the tree asks the façade to
    execute (free KV slots, recover an SWA window, emit a KV event).

Node handles (``NodeId``) handed to callers are ``(GEN << 32) | slot``. A
slot's ``GEN`` is bumped whenever its node is freed (and for every live node
on ``reset()``), so an id is never issued twice and a stale id is detected in
O(1) by comparing generations.

Units: key lengths and sizes are *logical units* (tokens; for EAGLE bigram
trees, token pairs packed by the façade into one int64 each). Page keys hash
the first ``page_size`` units of an edge.

Column and meta numbers are generated below from ordered lists, so adding a
column is one line; ``tests/kernels/test_layout.py`` checks that no two
overlap and that the walk-hot columns stay in the first two cache lines.
"""

import numpy as np

DTYPE = np.int64
INT64_MIN = np.iinfo(np.int64).min

#: Slot of the root node (never freed; its id changes on reset()).
ROOT = 0
#: "No node" sentinel for slot-valued columns.
NIL = -1

# ---------------------------------------------------------------- components
#: Component type ids, as SGLang's ``ComponentType``.
FULL = 0
SWA = 1
MAMBA = 2
N_COMPONENTS = 3
#: ``meta[M_COMPONENTS]`` bit of each configured component.
C_FULL = 1 << FULL
C_SWA = 1 << SWA
C_MAMBA = 1 << MAMBA
#: Tiers.
DEVICE = 0
HOST = 1
N_TIERS = 2

# ---------------------------------------------------------------- aux LRU lists
#: One intrusive LRU list per auxiliary component and tier (Full has none: its
#: eviction order is the leaf heaps): list id ``LRU_ID(c, t)`` for c in SWA,
#: MAMBA and t in DEVICE, HOST. A host list orders the nodes whose component
#: data is on the host only (SGLang's ``host_lru_lists``).
N_LRU = N_COMPONENTS - 1
#: Lists in all (link columns ``LRU_PREV`` / ``LRU_NEXT`` are this wide).
N_LRU_LISTS = N_LRU * N_TIERS


def LRU_ID(c, t=DEVICE):
    """List id of the LRU of auxiliary component ``c`` on tier ``t``."""
    return (c - 1) + t * N_LRU


LRU_SWA = SWA - 1
LRU_MAMBA = MAMBA - 1
LRU_SWA_HOST = LRU_SWA + N_LRU
LRU_MAMBA_HOST = LRU_MAMBA + N_LRU

#: Sentinel slots: list ``l`` has head ``SENTINEL0 + 2l`` (its next is the most
#: recently used entry) and tail ``SENTINEL0 + 2l + 1`` (its prev is the least
#: recently used). Never alive, never freed, never popped. Rows for the host
#: tier's lists are reserved (2 per auxiliary component and tier in all).
SENTINEL0 = 1
N_SENTINELS = 2 * (N_COMPONENTS - 1) * N_TIERS
#: First slot a node can take.
FIRST_SLOT = SENTINEL0 + N_SENTINELS


# ---------------------------------------------------------------- heaps
#: Heap ids (rows of ``heap``): the device-leaf heap and the host-leaf heap (HiCache:
#: host-only leaves, for ``evict_host``). A node's position in heap ``h`` is in column
#: ``HEAP_POS`` (device, a hot column) or ``HOST_HEAP_POS`` (host); ``order.pos_col(h)``.
HEAP_DEVICE = 0
HEAP_HOST = 1
N_HEAPS = 2
#: Rows of ``heap`` after the heaps: a step-wise Full round's own heap of
#: ``(key0, key1, node id)`` entries, snapshotted at the round's start (SGLang
#: heapifies the evictable leaves with their keys then; ``core/evict.py``).
WALK_K0 = N_HEAPS
WALK_K1 = N_HEAPS + 1
WALK_NID = N_HEAPS + 2
HEAP_ROWS = N_HEAPS + 3

def _number(fields, align=1):
    """Assign consecutive indices to ``(name, width)`` fields; returns
    ``({name: first index}, total)`` with the total rounded up to ``align``."""
    at = {}
    i = 0
    for name, width in fields:
        at[name] = i
        i += width
    return at, -(-i // align) * align


# ---------------------------------------------------------------- node table
#: Columns in table order. Rows are NCOL int64 (a multiple of 8: whole 64-byte
#: lines) and the table is allocated 64-byte aligned, so HOT_COLUMNS (the first
#: 16) are lines 0 and 1: everything a lock walk or a match walk reads per node.
#: Writer of each column in the comment.
NODE_COLUMNS = (
    # --- line 0
    ("PARENT", 1),       # parent slot; NIL for the root (state, tree)
    ("KEY_OFF", 1),      # start of the edge key (and value) span in ``pool`` (tree, state.compact_pool)
    ("KEY_LEN", 1),      # edge length in logical units (multiple of page_size; 0 for root) (tree)
    ("FLAGS", 1),        # bit set: F_ALIVE, F_HAS(c, t) value-presence bits (state, tree, components)
    ("LOCK_REF", N_COMPONENTS * N_TIERS),  # lock_ref per (c, t) at LOCK_COL(c, t); 6 cols, into line 1
                         # (lock.py and each component's lock rule; tree.split_node copies)
    # --- line 1
    ("CHILD_LOCK", 1),   # sum of the children's Full lock_ref: lock_ref - CHILD_LOCK = locks
                         # anchored at this node, so a release without one is refused in O(1) (lock)
    ("NDEVCHILD", 1),    # children holding a Full device value (O(1) D-leaf test) (tree)
    ("HEAP_POS", 1),     # position in the device-leaf heap while an evictable device leaf,
                         # else NIL (order)
    ("LAST_ACCESS", 1),  # logical clock tick of last access (see TICK) (match, insert, tree)
    ("NS", 1),           # namespace id (interned (extra_key, cache_salt) by the façade) (tree)
    ("GEN", 1),          # generation of this slot; NodeId = GEN << 32 | slot (< GEN_LIMIT) (state)
    # --- lines 2-4
    ("NCHILD", 1),       # number of children (tree)
    ("FIRST_CHILD", 1),  # intrusive child list, for DFS / checks / reset (state, tree)
    ("NEXT_SIB", 1),     # next sibling; for a free slot: next free slot (state, tree)
    ("PREV_SIB", 1),     # previous sibling (state, tree)
    ("CREATION", 1),     # logical clock tick of creation (inherited by a split's upper part) (tree)
    ("HIT_COUNT", 1),    # insert-driven hit counter (LFU / SLRU) (insert, tree)
    ("PRIORITY", 1),     # request priority, max'ed along insert paths (insert, tree)
    ("LRU_PREV", N_LRU_LISTS),  # aux LRU links at LRU_PREV + LRU_ID(c, t) (lru only)
    ("LRU_NEXT", N_LRU_LISTS),  # (lru only)
    ("MAMBA_SLOT", 1),   # Mamba device state slot; NIL when absent (components.mamba)
    ("MAMBA_HOST_SLOT", 1),  # HiCache: Mamba host state slot; NIL when absent (components.mamba)
    ("SWA_UUID", 1),     # SWA window-lock boundary stamp (0 = none) (components.swa)
    ("SWA_HOST_UUID", 1),  # HiCache: SWA host window-lock boundary stamp (0 = none)
                         # (components.swa)
    ("TLRU_CACHED", 1),  # T-LRU: root-path depth in units (maintained only under tlru) (tree)
    ("TLRU_HIST", 1),    # T-LRU: high-water depth of the branch (tree)
    ("HOST_HEAP_POS", 1),  # position in the host-leaf heap while an evictable host leaf, else
                         # NIL (order)
    ("WT_PENDING", 1),   # HiCache: ack id of the node's backup while in flight, else 0 (host)
    ("LOAD_PENDING", 1), # HiCache: load id of a load-back restoring the node while in flight,
                         # else 0 (host)
    ("HOST_UUID", 1),    # HiCache: boundary stamp of the Full host-lock segments ending here
                         # (0 = none; a split moves it up) (host)
    ("DUP_PREV", 1),     # HiCache: links of the duplicate list (Full on both tiers, in the
    ("DUP_NEXT", 1),     # order they became duplicates; F_DUP marks members) (dups only)
)
_COL, NCOL = _number(NODE_COLUMNS, align=8)
PARENT = _COL["PARENT"]
KEY_OFF = _COL["KEY_OFF"]
KEY_LEN = _COL["KEY_LEN"]
FLAGS = _COL["FLAGS"]
LOCK_REF = _COL["LOCK_REF"]
CHILD_LOCK = _COL["CHILD_LOCK"]
NDEVCHILD = _COL["NDEVCHILD"]
HEAP_POS = _COL["HEAP_POS"]
LAST_ACCESS = _COL["LAST_ACCESS"]
NS = _COL["NS"]
GEN = _COL["GEN"]
NCHILD = _COL["NCHILD"]
FIRST_CHILD = _COL["FIRST_CHILD"]
NEXT_SIB = _COL["NEXT_SIB"]
PREV_SIB = _COL["PREV_SIB"]
CREATION = _COL["CREATION"]
HIT_COUNT = _COL["HIT_COUNT"]
PRIORITY = _COL["PRIORITY"]
LRU_PREV = _COL["LRU_PREV"]
LRU_NEXT = _COL["LRU_NEXT"]
MAMBA_SLOT = _COL["MAMBA_SLOT"]
MAMBA_HOST_SLOT = _COL["MAMBA_HOST_SLOT"]
SWA_UUID = _COL["SWA_UUID"]
SWA_HOST_UUID = _COL["SWA_HOST_UUID"]
TLRU_CACHED = _COL["TLRU_CACHED"]
TLRU_HIST = _COL["TLRU_HIST"]
HOST_HEAP_POS = _COL["HOST_HEAP_POS"]
WT_PENDING = _COL["WT_PENDING"]
LOAD_PENDING = _COL["LOAD_PENDING"]
HOST_UUID = _COL["HOST_UUID"]
DUP_PREV = _COL["DUP_PREV"]
DUP_NEXT = _COL["DUP_NEXT"]


def column(name):
    """The node-table column of ``name`` in ``NODE_COLUMNS`` (a component's own
    columns are read through this, so adding one is one entry of the list)."""
    return _COL[name]


#: Columns a match or lock walk reads per node: they must stay in lines 0-1.
HOT_COLUMNS = ("PARENT", "KEY_OFF", "KEY_LEN", "FLAGS", "LOCK_REF", "CHILD_LOCK", "NDEVCHILD",
               "HEAP_POS", "LAST_ACCESS", "NS", "GEN")


def LOCK_COL(c, t=DEVICE):
    """Column of the lock count of component ``c`` on tier ``t``."""
    return LOCK_REF + c * N_TIERS + t


#: Column of the Full device lock_ref (the one every Full-only path touches).
FULL_LOCK = LOCK_REF + FULL * N_TIERS + DEVICE
#: Column of the SWA device lock_ref (window segment locks).
SWA_LOCK = LOCK_REF + SWA * N_TIERS + DEVICE

F_ALIVE = 1


def F_HAS(c, t=DEVICE):
    """FLAGS bit: component ``c`` holds a value on tier ``t``."""
    return 1 << (1 + c * N_TIERS + t)


F_HAS_FULL_DEV = 1 << (1 + FULL * N_TIERS + DEVICE)
F_HAS_SWA_DEV = 1 << (1 + SWA * N_TIERS + DEVICE)
F_HAS_FULL_HOST = 1 << (1 + FULL * N_TIERS + HOST)
F_HAS_MAMBA_HOST = 1 << (1 + MAMBA * N_TIERS + HOST)
F_HAS_SWA_HOST = 1 << (1 + SWA * N_TIERS + HOST)
#: FLAGS bit: the node is in the duplicate list (``kernels/dups.py``).
F_DUP = 1 << (1 + N_COMPONENTS * N_TIERS)
#: Column of the Full host lock_ref (a load-back's anchor, SGLang's host lock).
FULL_HOST_LOCK = LOCK_REF + FULL * N_TIERS + HOST
#: Column of the SWA host lock_ref (host window segment locks).
SWA_HOST_LOCK = LOCK_REF + SWA * N_TIERS + HOST

# ---------------------------------------------------------------- pool columns
TOK = 0           # key units
FULL_DEV = 1      # Full device value (KV pool slot per unit)
POOL_NCOL = 2
#: With KV events on, 4 more columns hold each page's SHA-256 digest at the page's
#: first row (kernels/hashing.py); ``pool[row, HASH0]`` is the event block hash.
HASH0 = 2
POOL_NCOL_EVENTS = 6
#: With the host tier on (HiCache), one more column, the *last* one
#: (``pool.shape[1] - 1``), holds each unit's Full host value (host pool slot):
#: the same span as the key, so a split moves it for free too. An SWA cache's
#: host tier adds the SWA host values (SWA host pool slots) right before it
#: (``pool.shape[1] - 2``; ``components/swa.py: host_col``).

# ---------------------------------------------------------------- child table
CT_PARENT = 0
CT_NS = 1
CT_PAGEKEY = 2
CT_CHILD = 3      # child slot, or CT_EMPTY / CT_TOMB
CT_NCOL = 4
CT_EMPTY = -1
CT_TOMB = -2
#: Maximum fill (live + tombstones) of the child table: CT_LOAD_NUM / CT_LOAD_DEN. A
#: kernel that could pass it answers E_CAPACITY and the façade rebuilds the table, so a
#: probe always meets an empty entry.
CT_LOAD_NUM = 3
CT_LOAD_DEN = 5
CT_MAX_LOAD = CT_LOAD_NUM / CT_LOAD_DEN

# ---------------------------------------------------------------- meta
#: Meta slots in order (``M_<name>``); per-component and per-heap blocks are
#: indexed ``M_X + c`` / ``M_X + h``.
META_FIELDS = (
    ("CLOCK", 1),         # logical clock (next tick to hand out)
    ("PAGE", 1),          # page_size
    ("POLICY", 1),        # eviction policy id (POLICY_*)
    ("POLICY_A", 1),      # policy parameter (slru threshold, tlru threshold)
    ("POLICY_B", 1),      # policy parameter (tlru next_prompt_estimate)
    ("HWM", 1),           # slots ever used (high-water mark); slots >= HWM are untouched
    ("FREE_HEAD", 1),     # head of the free-slot list (linked through NEXT_SIB)
    ("NFREE", 1),         # slots on the free list
    ("NLIVE", 1),         # live nodes, root included
    ("POOL_TOP", 1),      # pool rows in use (live + dead)
    ("POOL_DEAD", 1),     # pool rows of removed nodes below POOL_TOP (gap passes, compaction)
    ("POOL_CUR", 1),      # the row a new leaf's span starts at (== POOL_TOP outside a gap pass)
    ("POOL_LIM", 1),      # end of the dead gap the cursor fills (0: no gap pass, the pool's end)
    ("CT_LIVE", 1),       # live child-table entries
    ("CT_TOMB", 1),       # tombstoned child-table entries
    ("HEAP_N", N_HEAPS),  # + h: size of heap h
    ("EVICTABLE", N_COMPONENTS),  # + c: evictable units per component (device tier)
    ("PROTECTED", N_COMPONENTS),  # + c: protected units per component (device tier)
    ("TOTAL", N_COMPONENTS),      # + c: units held on device per component (evictable + protected)
    ("EVICT_WALK", N_COMPONENTS),  # + c: 1 while a step-wise eviction round of c is open
    ("EVICT_REQ", N_COMPONENTS),   # + c: request of that round
    ("EVICT_DONE", N_COMPONENTS),  # + c: units of c evicted so far in that round
    ("EVICT_CURSOR", N_COMPONENTS),  # + c: SWA round's LRU cursor (a node id; NIL: none)
    ("WALK_ACC", 2 * N_COMPONENTS),  # + 2c, + 2c + 1: component c's match-validator state
                                     # (device walk, host walk), reset at each walk's start
    ("WALK_N", 1),        # entries of a step-wise Full round's snapshot heap (heap rows WALK_*)
    ("WALK_PARENT", 1),   # node id of that round's last victim's parent (NIL: none)
    ("EVENTS", 1),        # 1 when KV events are on: mutating kernels emit event actions
    ("BIGRAM", 1),        # 1 for an EAGLE bigram tree (units pack two tokens)
    ("RETIRED", 1),       # slots retired for good: their generation reached GEN_LIMIT
    ("COMPONENTS", 1),    # bit set C_* of the configured components (FULL always)
    ("SWA_WINDOW", 1),    # SWA retain window W in units (0 without SWA)
    ("MAMBA_PATH_CAP", 1),  # mamba_max_states_per_path (-1: off)
    ("SWA_UUID_NEXT", 1),  # next SWA window-lock boundary stamp (never reused, > 0)
    ("NACTS", 1),         # rows written to ``acts`` by the last kernel call
    ("NOUT", 1),          # entries of ``out`` holding action data after the last call
    ("NEED_SLOTS", 1),    # after E_CAPACITY: free node slots (and child-table entries) the call needs
    ("NEED_UNITS", 1),    # after E_CAPACITY: free pool rows the call needs
    ("NEED_OUT", 1),      # after E_CAPACITY: entries of ``out`` the call needs
    ("NEED_ACTS", 1),     # after E_CAPACITY: rows of ``acts`` the call needs
    ("HOST", 1),          # HiCache write policy (HOST_*; HOST_OFF: no host tier)
    ("WT_THRESHOLD", 1),  # hit count at which an insert backs a node up (write-through)
    ("HOST_TOTAL", 1),    # units holding a Full host value
    ("MAMBA_HOST_TOTAL", 1),  # Mamba states held on the host (components.mamba)
    ("SWA_HOST_TOTAL", 1),  # units holding an SWA host value (components.swa)
    ("HOST_EVICTABLE", 1),  # units of the evictable host leaves (host-leaf heap)
    ("HOST_UUID_NEXT", 1),  # next Full host-lock boundary stamp (never reused, > 0)
    ("DUP_HEAD", 1),      # first / last slot of the duplicate list (NIL: empty) (dups)
    ("DUP_TAIL", 1),
)
_META, META_LEN = _number(META_FIELDS, align=8)
M_CLOCK = _META["CLOCK"]
M_PAGE = _META["PAGE"]
M_POLICY = _META["POLICY"]
M_POLICY_A = _META["POLICY_A"]
M_POLICY_B = _META["POLICY_B"]
M_HWM = _META["HWM"]
M_FREE_HEAD = _META["FREE_HEAD"]
M_NFREE = _META["NFREE"]
M_NLIVE = _META["NLIVE"]
M_POOL_TOP = _META["POOL_TOP"]
M_POOL_DEAD = _META["POOL_DEAD"]
M_POOL_CUR = _META["POOL_CUR"]
M_POOL_LIM = _META["POOL_LIM"]
M_CT_LIVE = _META["CT_LIVE"]
M_CT_TOMB = _META["CT_TOMB"]
M_HEAP_N = _META["HEAP_N"]
M_EVICTABLE = _META["EVICTABLE"]
M_PROTECTED = _META["PROTECTED"]
M_TOTAL = _META["TOTAL"]
M_EVICT_WALK = _META["EVICT_WALK"]
M_EVICT_REQ = _META["EVICT_REQ"]
M_EVICT_DONE = _META["EVICT_DONE"]
M_EVICT_CURSOR = _META["EVICT_CURSOR"]
M_WALK_ACC = _META["WALK_ACC"]
M_WALK_N = _META["WALK_N"]
M_WALK_PARENT = _META["WALK_PARENT"]
M_EVENTS = _META["EVENTS"]
M_BIGRAM = _META["BIGRAM"]
M_RETIRED = _META["RETIRED"]
M_COMPONENTS = _META["COMPONENTS"]
M_SWA_WINDOW = _META["SWA_WINDOW"]
M_MAMBA_PATH_CAP = _META["MAMBA_PATH_CAP"]
M_SWA_UUID_NEXT = _META["SWA_UUID_NEXT"]
M_NACTS = _META["NACTS"]
M_NOUT = _META["NOUT"]
M_NEED_SLOTS = _META["NEED_SLOTS"]
M_NEED_UNITS = _META["NEED_UNITS"]
M_NEED_OUT = _META["NEED_OUT"]
M_NEED_ACTS = _META["NEED_ACTS"]
M_HOST = _META["HOST"]
M_WT_THRESHOLD = _META["WT_THRESHOLD"]
M_HOST_TOTAL = _META["HOST_TOTAL"]
M_MAMBA_HOST_TOTAL = _META["MAMBA_HOST_TOTAL"]
M_SWA_HOST_TOTAL = _META["SWA_HOST_TOTAL"]
M_HOST_EVICTABLE = _META["HOST_EVICTABLE"]
M_HOST_UUID_NEXT = _META["HOST_UUID_NEXT"]
M_DUP_HEAD = _META["DUP_HEAD"]
M_DUP_TAIL = _META["DUP_TAIL"]

#: ``meta[M_HOST]``: the HiCache write policy (SGLang ``hicache_write_policy``).
HOST_OFF = 0
HOST_WRITE_THROUGH = 1
HOST_WRITE_THROUGH_SELECTIVE = 2
HOST_WRITE_BACK = 3
HOST_POLICY_NAMES = ("", "write_through", "write_through_selective", "write_back")

#: A slot whose generation reaches GEN_LIMIT is retired (never reused): one more id
#: ``GEN << 32 | slot`` would overflow int64. Under churn the free list is LIFO, so a
#: hot slot can be reused ~2**31 times (weeks of a busy server); then it costs one
#: dead row instead of wrapping ids (which would reissue old ids or make them negative).
GEN_LIMIT = 1 << 31

#: Clock units per tick. A match stamps its best node with a fresh tick ``t`` and
#: each ancestor ``k`` levels up with ``t - k`` (SGLang: ``t - k * 1e-5`` on a
#: float clock advancing by 1.0), so ordering matches SGLang's float clock.
TICK = 100000

# ---------------------------------------------------------------- policies
POLICY_LRU = 0
POLICY_LFU = 1
POLICY_FIFO = 2
POLICY_MRU = 3
POLICY_FILO = 4
POLICY_PRIORITY = 5
POLICY_SLRU = 6
POLICY_TLRU = 7
POLICY_NAMES = ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru", "tlru")

# ---------------------------------------------------------------- status codes
OK = 0
E_STALE = 1           # node id does not name a live node
E_LOCK_UNDERFLOW = 2  # a release would take a lock_ref below zero
E_CAPACITY = 3        # not enough room (slots, pool rows, child table, out, acts): grow and retry
E_WALK_OPEN = 4       # a step-wise eviction round is already open
E_NO_WALK = 5         # no step-wise eviction round is open
E_NOT_LEAF = 6        # node is not an evictable device leaf
E_NOT_ANCHORED = 7    # release of a node whose lock_ref is held only by descendants' locks
E_BAD_VALUE = 8       # a KV index < 0 or >= the allocator's bound (insert; nothing changed)
E_BAD_CURSOR = 9      # an SWA eviction cursor that is not page-aligned (insert; nothing changed)
E_NO_BOUNDARY = 10    # an SWA window release whose boundary stamp is not on the path
E_NEED_BACKUP = 11    # write-back: the step's victim has no host copy; back it up, then
                      # demote it (host.demote_leaf) or drop it (host.drop_subtree)
E_NEED_STATE_BACKUP = 12  # write-back, a Mamba round: the victim is an internal node whose
                      # state and Full KV have no host copy; back it up, then
                      # host.finish_state_eviction (SGLang's InternalStateBackup)
#: a host-tier plan / commit whose node is not in the state the step needs (a backup
#: of a node without device data, a load of a node already on the device, an ack
#: whose id is not pending on the node); nothing changed (``core/host.py``)
E_HOST_STATE = 20
#: the slots given to a host-tier commit are not as many as the plan's units
E_HOST_LEN = 21

#: ``insert``'s ``limit`` argument: no check of the values (they are token ids) /
#: only ``>= 0`` (no allocator bound known)
VALUES_UNCHECKED = -2
VALUES_NONNEG = -1
# sanity_check codes (core/check.py) start at 100.
