"""Parameter and result types, named and shaped as SGLang 0.5.23's.

See ``docs/architecture.md`` for which fields flatradix fills.
"""

from dataclasses import dataclass, field
from enum import IntEnum
from types import MappingProxyType
from typing import Any, NamedTuple, Optional


class ComponentType(IntEnum):
    """Tree components (SGLang ``ComponentType``): FULL is always present."""

    FULL = 0
    SWA = 1
    MAMBA = 2


class RadixKey:
    """A key: token ids plus the namespace they live in.

    Parameters
    ----------
    token_ids : sequence of int
        ``array('q')``, list, 1-D integer numpy array or 1-D int32 / int64 torch tensor.
        Not copied here; the cache converts it once per call.
    extra_key : str or None
        Namespace (LoRA id, ...). ``None`` and ``""`` are *different* namespaces,
        as in SGLang.
    cache_salt : str or None
        Second namespace component; ``""`` is normalised to ``None`` (SGLang).
    is_bigram : bool
        EAGLE bigram view: logical unit ``i`` is the pair ``(t[i], t[i+1])``, so the
        logical length is ``len(token_ids) - 1``.

    Two keys share cached prefixes only when ``(extra_key, cache_salt)`` are equal
    (compared as a tuple, never concatenated: ``known_bugs.md`` B5).
    """

    __slots__ = ("token_ids", "extra_key", "cache_salt", "is_bigram")

    def __init__(self, token_ids, extra_key=None, cache_salt=None, is_bigram=False):
        self.token_ids = token_ids
        self.extra_key = extra_key
        self.cache_salt = cache_salt if cache_salt != "" else None
        self.is_bigram = bool(is_bigram)

    def __len__(self):
        raw = len(self.token_ids)
        if self.is_bigram:
            return max(raw - 1, 0)
        return raw

    def __getitem__(self, idx):
        if not isinstance(idx, slice):
            raise TypeError("RadixKey indices must be slices")
        if idx.step not in (None, 1):
            raise ValueError("RadixKey slices must have step 1")
        start, stop, _ = idx.indices(len(self))
        if self.is_bigram:
            ids = self.token_ids[start:stop + 1] if stop > start else self.token_ids[0:0]
        else:
            ids = self.token_ids[start:stop]
        return RadixKey(ids, self.extra_key, self.cache_salt, self.is_bigram)

    def page_aligned(self, page_size):
        """The key truncated to ``floor(len / page_size) * page_size`` logical units."""
        n = len(self)
        return self[: n - n % page_size] if page_size > 1 else self

    def __repr__(self):
        ids = list(self.token_ids[:10])
        more = "..." if len(self.token_ids) > 10 else ""
        return (f"RadixKey({ids}{more}, extra_key={self.extra_key!r}, "
                f"cache_salt={self.cache_salt!r}, is_bigram={self.is_bigram})")


@dataclass
class MatchPrefixParams:
    key: RadixKey
    cow_mamba: bool = False
    req: Any = None


class MatchResult(NamedTuple):
    """Result of ``match_prefix``.

    ``device_indices``: int64 1-D, the matched KV indices (numpy or torch, the
    kind the cache's values were inserted as), length ``device_prefix_len``.
    Node fields are NodeIds (ints). Without a host tier,
    ``last_device_node == last_host_node == best_match_node``.
    """

    device_indices: Any
    last_device_node: int
    last_host_node: int
    best_match_node: int
    host_hit_length: int = 0
    device_prefix_len: int = 0
    full_kv_hit_length: int = 0
    last_visited_node_id: Optional[int] = None
    swa_host_hit_length: int = 0
    swa_branching_seqlen: Optional[int] = None
    mamba_host_hit_length: int = 0
    mamba_branching_seqlen: Optional[int] = None
    cache_protected_len: Optional[int] = None
    full_device_match_len: Optional[int] = None


@dataclass
class InsertParams:
    """Parameters of ``insert``.

    ``value``: int32/int64 1-D KV indices, one per logical unit of ``key``
    (for a bigram key, ``len(token_ids)`` entries are accepted too: the last
    raw token has no unit). ``None`` uses the token ids themselves (debug).
    ``prev_prefix_len``: the caller already owns tree copies of
    ``[0, prev_prefix_len)``; those positions are not freed as duplicates.
    ``inserted_len``: the same request already inserted ``[0, inserted_len)``;
    hits are counted only on nodes ending past it. ``priority``: max'ed along
    the path (``priority`` eviction policy).

    SWA caches: ``component_evicted_seqlens={ComponentType.SWA: n}`` (keyword
    only; ``set_evicted_seqlen`` / ``get_evicted_seqlen``) is the request's SWA
    cursor -- its slots below position ``n`` (a multiple of the page size) have
    no SWA peer any more, so they are inserted as tombstones and freed Full-only;
    ``swa_branching_seqlen`` (from ``MatchResult``) sets
    ``InsertResult.swa_branch_inserted``.
    """

    key: RadixKey = None
    value: Any = None
    prev_prefix_len: int = 0
    priority: int = 0
    inserted_len: int = 0
    track_adopted_ranges: bool = False
    mamba_value: Any = None
    swa_branching_seqlen: Optional[int] = None
    session_id: Any = None
    component_evicted_seqlens: dict = field(default_factory=dict, kw_only=True)

    def get_evicted_seqlen(self, component):
        """The request's eviction cursor for ``component`` (SWA: positions below it
        have had their SWA slots freed); 0 when unset."""
        return self.component_evicted_seqlens.get(component, 0)

    def set_evicted_seqlen(self, component, length):
        self.component_evicted_seqlens[component] = length


class InsertResult(NamedTuple):
    """Result of ``insert``.

    ``prefix_len``: logical units of the (page-aligned) key already cached.
    ``duplicate_indices``: the slots ``value[prev_prefix_len:prefix_len]`` that
    duplicate what the tree holds. With an allocator attached the cache has
    already freed them and this is ``None``; without one the caller must free
    them (flatradix extension; SGLang always frees through its allocator).
    ``adopted_ranges``: with ``track_adopted_ranges``, ``{ComponentType.FULL:
    [(prefix_len, n)]}`` — the half-open logical-unit range whose slots the tree
    took ownership of (``n`` the page-aligned key length) — or ``{}`` when the
    insert adopted nothing; ``None`` without tracking and for an empty
    page-aligned key (both as SGLang 0.5.23).
    ``total_len``, ``inserted_host_node``, ``host_insert_dropped``: ``insert_host``
    only (the key's length, the host node holding its end, whether the refill
    was dropped); ``insert`` leaves them at their defaults.
    """

    prefix_len: int = 0
    total_len: int = 0
    last_device_node: Optional[int] = None
    mamba_exist: bool = False
    swa_branch_inserted: bool = False
    adopted_ranges: Optional[dict] = None
    duplicate_indices: Any = None
    inserted_host_node: Optional[int] = None
    host_insert_dropped: bool = False


@dataclass
class EvictParams:
    num_tokens: int = 0
    swa_num_tokens: int = 0
    mamba_num: int = 0


@dataclass
class InitLoadBackParams:
    """Parameters of ``init_load_back`` (SGLang's names): the match's
    ``best_match_node`` and ``host_hit_length``; ``mem_quota`` (tokens, None: no
    quota) declines a load whose tokens plus the tokens its own lock newly
    protects exceed it; ``req`` (optional here): its ``last_node`` is returned
    when the load is declined."""

    best_match_node: Any = None
    host_hit_length: int = 0
    mem_quota: Optional[int] = None
    req: Any = None


class EvictResult(NamedTuple):
    """Result of ``evict``: device units freed per component (node-granular, so
    possibly more than asked). ``evicted_indices``: the freed KV indices in
    eviction order when no allocator is attached (else ``None``: they went to the
    allocator)."""

    num_tokens_evicted: int = 0
    swa_num_tokens_evicted: int = 0
    mamba_num_evicted: int = 0
    evicted_indices: Any = None


@dataclass
class DecLockRefParams:
    node_id: Optional[int] = None
    skipped_lock_components: tuple = ()
    component_lock_uuids: dict = field(default_factory=dict)
    component_host_lock_uuids: dict = field(default_factory=dict)

    def get_lock_uuid(self, component, lock_host=False):
        table = self.component_host_lock_uuids if lock_host else self.component_lock_uuids
        return table[component]


_NO_UUIDS = MappingProxyType({})


class IncLockRefResult:
    """The lock *receipt*. ``delta``: Full units newly moved evictable -> protected.
    ``component_lock_uuids`` / ``component_host_lock_uuids``: per-component lock
    boundaries: ``{ComponentType.SWA: stamp}`` when the SWA window was locked
    (``None``: the window segment reached the root); empty, read-only mappings
    for Full-only caches. The release replays exactly what was locked."""

    __slots__ = ("delta", "node_id", "skipped_lock_components", "component_lock_uuids",
                 "component_host_lock_uuids")

    def __init__(self, delta=0, node_id=None, skipped_lock_components=(),
                 component_lock_uuids=_NO_UUIDS, component_host_lock_uuids=_NO_UUIDS):
        self.delta = delta
        self.node_id = node_id
        self.skipped_lock_components = skipped_lock_components
        self.component_lock_uuids = component_lock_uuids
        self.component_host_lock_uuids = component_host_lock_uuids

    def to_dec_params(self):
        return DecLockRefParams(self.node_id, tuple(self.skipped_lock_components),
                                dict(self.component_lock_uuids),
                                dict(self.component_host_lock_uuids))

    def __eq__(self, other):
        return type(other) is IncLockRefResult and all(
            getattr(self, f) == getattr(other, f) for f in self.__slots__)

    def __repr__(self):
        return (f"IncLockRefResult(delta={self.delta}, node_id={self.node_id}, "
                f"skipped_lock_components={self.skipped_lock_components})")


@dataclass
class DecLockRefResult:
    delta: Optional[int] = None


@dataclass
class EvictStep:
    """One step of a step-wise eviction round (``evict_device_next_node``).

    ``node_id``: the deleted node (``None`` for a step that only tombstoned SWA
    data, and when the round's request is met or nothing evictable is left).
    ``freed_indices``: the Full KV indices to free; ``swa_freed_indices``: the
    Full indices whose SWA peers to free (an SWA allocator's
    ``free_swa_segment``); the caller (the controller) frees both.
    ``mamba_freed_indices``: the Mamba state slots to free (the request pool's
    ``mamba_allocator.free``; ``None`` without Mamba).
    ``num_tokens`` / ``swa_num_tokens`` / ``mamba_num``: units freed per component.
    ``made_progress``: something was freed (``False`` ends the round).
    ``needs_backup``: always False without a host tier.
    """

    node_id: Optional[int]
    freed_indices: Any
    num_tokens: int
    made_progress: bool
    needs_backup: bool = False
    swa_freed_indices: Any = None
    swa_num_tokens: int = 0
    mamba_freed_indices: Any = None
    mamba_num: int = 0


@dataclass
class TreeLock:
    """What ``lock()`` returns and ``unlock()`` / ``release_swa()`` consume (SGLang
    ``TreeLock``): the locked ``node``, its ``receipt`` (``DecLockRefParams``) and
    whether the SWA window was released early."""

    node: int
    receipt: Any
    swa_released: bool = False
