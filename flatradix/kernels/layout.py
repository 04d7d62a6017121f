"""The tree's memory layout: the single place a reader learns the node table.

All tree state lives in a handful of C-contiguous numpy arrays owned by the
façade (``flatradix.cache.UnifiedRadixCache``) and mutated only by the
``@njit`` kernels of this package. They are passed to every entry kernel in
this order (dispatch costs ~40 ns per array argument, so there are few):

``nodes``  int64 ``(node_capacity, NCOL)``
    The node table, one row per *slot*. Columns below; each names the kernel
    module that may write it. Row ``ROOT`` (slot 0) is the root.
``ctab``   int64 ``(child_capacity, CT_NCOL)``
    Open-addressing child table keyed by ``(parent slot, namespace, page
    key)``; power-of-two capacity, linear probing, tombstones
    (``kernels/children.py``).
``pool``   int64 ``(pool_capacity, POOL_NCOL)``
    Token and value pool. A node's edge key is the span
    ``pool[KEY_OFF : KEY_OFF + KEY_LEN, TOK]``; its Full device value (KV
    indices, one per logical unit) is the *same* span of column ``FULL_DEV``.
    Value spans coincide with key spans because a Full/SWA value always has
    one entry per logical unit, so a split is two span updates and copies
    nothing. Space of removed nodes is counted in ``meta[POOL_DEAD]`` and
    reclaimed by compaction (``kernels/state.py: compact_pool``).
``heap``   int64 ``(node_capacity,)``
    Binary min-heap of the slots of every *evictable device leaf*, ordered by
    the eviction policy (``kernels/order.py``). It is kept incrementally, so an
    eviction round costs O(evicted * log leaves), never O(tree).
``meta``   int64 ``(META_LEN,)``
    Counters and configuration (indices ``M_*`` below).
``out``    int64, grown on demand (never sized by the pool)
    Scratch output: freed KV indices and path queries (``match_prefix`` writes
    into its own result array instead). Kernels that could overflow it return
    ``E_CAPACITY`` with the length they need; the façade copies what it needs
    out of it before the next call.

Node handles (``NodeId``) handed to callers are ``(GEN << 32) | slot``. A
slot's ``GEN`` is bumped whenever its node is freed (and for every live node
on ``reset()``), so an id is never issued twice and a stale id is detected in
O(1) by comparing generations.

Units: key lengths and sizes are *logical units* (tokens; for EAGLE bigram
trees, token pairs packed by the façade into one int64 each). Page keys hash
the first ``page_size`` units of an edge.
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
#: Tiers.
DEVICE = 0
HOST = 1
N_TIERS = 2

# ---------------------------------------------------------------- node table
# Column order is for the cache: rows are 320 bytes (5 cache lines) and the
# façade allocates the table 64-byte aligned, so columns 0-7 and 8-15 are one
# line each. Everything a lock walk or a match walk reads per node is in them.
# --- line 0: links, edge span, flags, lock counts
PARENT = 0        # parent slot; NIL for the root
KEY_OFF = 1       # start of the edge key (and value) span in ``pool``
KEY_LEN = 2       # edge length in logical units (multiple of page_size; 0 for root)
FLAGS = 3         # bit set: F_ALIVE, and F_HAS(c, t) value-presence bits
# Per (component, tier) columns: index = base + c * N_TIERS + t.
LOCK_REF = 4      # lock_ref (tier DEVICE) / host_lock_ref (tier HOST), cols 4-9; kernels/lock.py
# --- line 1 (cols 8-15; 8-9 are the Mamba lock counts)
CHILD_LOCK = 10   # sum of the children's Full lock_ref: lock_ref - CHILD_LOCK = locks
                  # anchored at this node, so a release without one is refused in O(1)
NDEVCHILD = 11    # number of children holding a Full device value (O(1) D-leaf test)
HEAP_POS = 12     # position in ``heap`` while an evictable device leaf, else NIL
LAST_ACCESS = 13  # logical clock tick of last access (see TICK)
NS = 14           # namespace id (interned (extra_key, cache_salt) by the façade)
GEN = 15          # generation of this slot; NodeId = GEN << 32 | slot (< GEN_LIMIT)
# --- lines 2-4: the rest
NCHILD = 16       # number of children
FIRST_CHILD = 17  # intrusive child list, for DFS / checks / reset
NEXT_SIB = 18     # next sibling; for a free slot: next free slot
PREV_SIB = 19     # previous sibling
# Policy inputs (written by kernels/match.py, kernels/insert.py; read by kernels/order.py);
# LAST_ACCESS above is one of them.
CREATION = 20     # logical clock tick of creation (inherited by a split's upper part)
HIT_COUNT = 21    # insert-driven hit counter (LFU / SLRU)
PRIORITY = 22     # request priority, max'ed along insert paths (``priority`` policy)
LRU_PREV = 23     # aux-component LRU links (SWA, Mamba); Full uses the heap instead
LRU_NEXT = 29
MAMBA_SLOT = 35   # Mamba state slot per tier (+ t); NIL when absent
SWA_UUID = 37     # SWA window-lock boundary stamp (0 = none)
TLRU_CACHED = 38  # T-LRU: root-path depth in units (maintained only under tlru)
TLRU_HIST = 39    # T-LRU: high-water depth of the branch
NCOL = 40


def LOCK_COL(c, t=DEVICE):
    """Column of the lock count of component ``c`` on tier ``t``."""
    return LOCK_REF + c * N_TIERS + t


#: Column of the Full device lock_ref (the one every Full-only path touches).
FULL_LOCK = LOCK_REF + FULL * N_TIERS + DEVICE

F_ALIVE = 1


def F_HAS(c, t=DEVICE):
    """FLAGS bit: component ``c`` holds a value on tier ``t``."""
    return 1 << (1 + c * N_TIERS + t)


F_HAS_FULL_DEV = 1 << 1

# ---------------------------------------------------------------- pool columns
TOK = 0           # key units
FULL_DEV = 1      # Full device value (KV pool slot per unit)
POOL_NCOL = 2
#: With KV events on, 4 more columns hold each page's SHA-256 digest at the page's
#: first row (kernels/hashing.py); ``pool[row, HASH0]`` is the event block hash.
HASH0 = 2
POOL_NCOL_EVENTS = 6

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
M_CLOCK = 0           # logical clock (next tick to hand out)
M_PAGE = 1            # page_size
M_POLICY = 2          # eviction policy id (POLICY_*)
M_POLICY_A = 3        # policy parameter (slru threshold, tlru threshold)
M_POLICY_B = 4        # policy parameter (tlru next_prompt_estimate)
M_HWM = 5             # slots ever used (high-water mark); slots >= HWM are untouched
M_FREE_HEAD = 6       # head of the free-slot list (linked through NEXT_SIB)
M_NFREE = 7           # slots on the free list
M_NLIVE = 8           # live nodes, root included
M_POOL_TOP = 9        # pool rows in use (live + dead)
M_POOL_DEAD = 10      # pool rows of removed nodes, reclaimable by compaction
M_CT_LIVE = 11        # live child-table entries
M_CT_TOMB = 12        # tombstoned child-table entries
M_HEAP_N = 13         # heap size
M_EVICTABLE = 14      # + c: evictable units per component (device tier)
M_PROTECTED = 17      # + c: protected units per component (device tier)
M_TOTAL = 20          # + c: units held on device per component (evictable + protected)
M_EVICT_WALK = 24     # 1 while a step-wise Full eviction round is open
M_EVICT_REQ = 25      # request of the open round
M_EVICT_DONE = 26     # units evicted so far in the open round
M_EVENTS = 27         # 1 when KV events are on: eviction kernels report removed spans
M_BIGRAM = 28         # 1 for an EAGLE bigram tree (units pack two tokens)
M_RETIRED = 29        # slots retired for good: their generation reached GEN_LIMIT
META_LEN = 32

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
E_CAPACITY = 3        # the façade did not reserve enough capacity (a bug)
E_WALK_OPEN = 4       # a step-wise eviction round is already open
E_NO_WALK = 5         # no step-wise eviction round is open
E_NOT_LEAF = 6        # node is not an evictable device leaf
E_NOT_ANCHORED = 7    # release of a node whose lock_ref is held only by descendants' locks
E_BAD_VALUE = 8       # a KV index < 0 or >= the allocator's bound (insert; nothing changed)

#: ``insert``'s ``limit`` argument: no check of the values (they are token ids) /
#: only ``>= 0`` (no allocator bound known)
VALUES_UNCHECKED = -2
VALUES_NONNEG = -1
# sanity_check codes (kernels/check.py) start at 100.
