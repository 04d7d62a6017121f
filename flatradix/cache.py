"""The façade: SGLang's ``UnifiedRadixCache`` API over the flat-array kernels.

Validates and casts inputs once (``_cast``), calls one kernel per public
operation, turns status codes into exceptions, and hands freed KV indices to
the attached allocator. Holds no tree logic. Thread-safe: every public method
runs under one re-entrant lock (the kernels hold the GIL; see
``docs/architecture.md``).
"""

import math
import threading
from collections.abc import Mapping

import numpy as np

from . import _numba_env  # noqa: F401  (must precede the kernels: cache directory)
from . import inspection
from ._cast import _NID_END, _NID_MIN, as_count, as_flag, as_int, as_int64, as_node_id, is_torch, key_units
from .engine import Engine
from .errors import CacheInvariantError, LockRefError, NodeAccessError, ReceiptError
from .event_sink import EventSink
from .executor import Executor
from .kernels import layout as L
from .hicache import HostTier
from .requests import RequestCachingMixin, holds_state
from .values import ValueBridge, is_swa_allocator
from .types import (
    ComponentType, DecLockRefParams, DecLockRefResult, EvictParams, EvictResult, EvictStep,
    IncLockRefResult, InsertParams, InsertResult, MatchPrefixParams, MatchResult,
    RadixKey, TreeLock,
)

_EMPTY = np.empty(0, dtype=np.int64)
_I64 = np.dtype(np.int64)
_DEFAULT_NS = (None, None)   # the namespace of a key without extra_key / cache_salt
_PLAIN_RECEIPTS = (IncLockRefResult, DecLockRefParams)
_tuple_new = tuple.__new__
_TRACK = 1  # kernels/insert.py: TRACK_ADOPTED
assert len(MatchResult._fields) == 14  # the positional tuples below build all 14 fields
_POLICY_DEFAULTS = {"slru": {"protected_threshold": 2},
                    "tlru": {"threshold": 0, "next_prompt_estimate": 0}}
#: Largest accepted page_size (tokens per page); real models use <= 1024.
MAX_PAGE_SIZE = 1 << 20
#: Largest accepted initial node_capacity: a slot must fit the low 32 bits of a NodeId.
MAX_NODE_CAPACITY = 1 << 31
#: Largest accepted initial pool_capacity (rows of 16 bytes or more each).
MAX_POOL_CAPACITY = 1 << 40
#: Default pool_capacity without an allocator (rows; grown by doubling on demand).
POOL_CAPACITY_DEFAULT = 1 << 16
#: Pool rows reserved per Full KV slot of the allocator when pool_capacity is not
#: given: at least half the pool is then dead rows whenever its top reaches its end
#: (a gap pass, or an in-place compaction, reclaims them).
POOL_ROWS_PER_SLOT = 2
#: Largest pool_capacity taken from an allocator's size (rows): a 4M-token KV pool's;
#: larger trees grow past it by doubling.
POOL_CAPACITY_AUTO_MAX = 1 << 23


def _auto_pool_capacity(allocator):
    """The pool rows a cache reserves when ``pool_capacity`` is not given:
    ``POOL_ROWS_PER_SLOT`` x the allocator's Full KV slots (``size_full``, else
    ``size``), within ``[POOL_CAPACITY_DEFAULT, POOL_CAPACITY_AUTO_MAX]``; the
    default without one. At most ``size`` device tokens are cached, so the pool
    then never grows for them (a growth copies every live row into fresh memory
    in one call: a latency spike), and the dead rows reclaimed each time the top
    reaches the end (by a gap pass, ``Engine.grow_tree``, or else an in-place
    compaction moving the live rows, O(size)) are at least ``size`` (4 x, before
    gap passes, gave a third of the compactions, but twice the fresh memory to
    fault in: slower on a 3,000-request replay). The array is zero-filled lazily by the OS: its pages become resident
    as rows are appended (16 bytes a row for a Full-only cache without events)."""
    if allocator is None:
        return POOL_CAPACITY_DEFAULT
    for name in ("size_full", "size"):
        try:
            size = getattr(allocator, name, None)
        except Exception:  # a property that fails: the allocator's business, not ours
            size = None
        if size is not None:
            break
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size <= 0:
        return POOL_CAPACITY_DEFAULT
    return int(min(max(POOL_ROWS_PER_SLOT * int(size), POOL_CAPACITY_DEFAULT),
                   POOL_CAPACITY_AUTO_MAX))


#: Eviction counts above this are clamped to it (it exceeds any tree; kernels take int64).
_COUNT_CLAMP = 1 << 62


def _components(components):
    """``components`` as a tuple of ComponentType (TypeError / ValueError naming it)."""
    if isinstance(components, (str, bytes)) or not hasattr(components, "__iter__"):
        raise TypeError(f"components must be a tuple of ComponentType, got "
                        f"{type(components).__name__}")
    out = []
    for c in components:
        try:
            out.append(ComponentType(c))
        except (ValueError, TypeError):
            raise ValueError(f"components: {c!r} is not a ComponentType "
                             f"({', '.join(m.name for m in ComponentType)})") from None
    return tuple(out)


#: The default component set (compared by identity: ``tree_components`` may replace it).
_FULL_ONLY = (ComponentType.FULL,)
#: The component sets a cache can be built with, in SGLang's order.
_COMPONENT_SETS = ((ComponentType.FULL,), (ComponentType.FULL, ComponentType.SWA),
                   (ComponentType.FULL, ComponentType.MAMBA),
                   (ComponentType.FULL, ComponentType.SWA, ComponentType.MAMBA))
#: Largest accepted sliding_window_size (tokens).
MAX_WINDOW = 1 << 40


def _check_device(device):
    """``device``: ``"cpu"`` or a CUDA device torch can see (``TypeError`` /
    ``ValueError`` naming it)."""
    if is_torch(device):
        device = str(device)
    if not isinstance(device, str):
        raise TypeError(f"device must be a str (or torch.device), got {type(device).__name__}")
    if device == "cpu":
        return
    kind, _, index = device.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    try:
        import torch
    except ImportError:
        raise ValueError(f"device={device!r} needs torch with CUDA (torch is not installed)") from None
    if not torch.cuda.is_available():
        raise ValueError(f"device={device!r}: torch sees no CUDA device on this machine")
    if index and int(index) >= torch.cuda.device_count():
        raise ValueError(f"device={device!r}: torch sees {torch.cuda.device_count()} CUDA devices")


def _component(component, name="component"):
    try:
        return ComponentType(component)
    except (ValueError, TypeError):
        raise ValueError(f"{name} must be a ComponentType, got {component!r}") from None


def _cat_or_empty(parts):
    """int64 concatenation of ``parts`` (a list of arrays), empty when none."""
    return np.concatenate(parts) if parts else _EMPTY.copy()


class UnifiedRadixCache(RequestCachingMixin):
    """Prefix cache of KV indices keyed by token ids (SGLang 0.5.23 ``UnifiedRadixCache``).

    Parameters
    ----------
    page_size : int, >= 1
        Keys are aligned down to whole pages; nodes hold whole pages.
    components : tuple of ComponentType
        ``(FULL,)``, ``(FULL, SWA)``, ``(FULL, MAMBA)`` or ``(FULL, SWA, MAMBA)``
        (SGLang's order). ``tree_components`` is SGLang's keyword for it.
    sliding_window_size : int, keyword-only
        SWA only: the retain window ``W`` in tokens (>= 1), as SGLang's
        ``sliding_window_size``. A match needs ``W`` contiguous tokens with SWA
        data before its end; a running request's lock pins one window of SWA;
        fresh leaves are capped at ``ceil(W / page_size) * page_size`` tokens.
    eviction_policy : str
        One of ``lru, lfu, fifo, mru, filo, priority, slru, tlru`` (case-insensitive).
    eviction_policy_config : dict, optional
        ``slru``: ``protected_threshold`` (2); ``tlru``: ``threshold`` (0),
        ``next_prompt_estimate`` (0). Unknown keys raise ``TypeError``.
    token_to_kv_pool_allocator : optional
        Object with ``free(indices)`` (SGLang's or ``flatradix.TokenToKVPoolAllocator``).
        When given, duplicate and evicted KV indices are freed through it; when
        ``None`` they are returned in the results for the caller to free. SWA
        caches need an SWA allocator (``flatradix.SWATokenToKVPoolAllocator`` or
        SGLang's ``SWATokenToKVPoolAllocator``, duck-typed) with the cache's page
        size: the SWA pool's slots are freed through its Full -> SWA mapping.
    req_to_token_pool : optional
        Needed by ``cache_finished_req`` / ``cache_unfinished_req``. Mamba caches
        need one with a ``mamba_allocator`` (``alloc(n)``, ``free(indices)``,
        ``available_size()``): ``flatradix.HybridReqToTokenPool`` or SGLang's
        ``HybridReqToTokenPool``; evicted states are freed through it.
    mamba_cache_chunk_size : int, keyword-only
        Mamba only (default 64, SGLang's): tokens per Mamba checkpoint chunk; a
        match's ``mamba_branching_seqlen`` lies on the grid
        ``lcm(mamba_cache_chunk_size, page_size)``.
    enable_mamba_extra_buffer : bool, keyword-only
        Mamba only: the request pool keeps extra (ping-pong) state slots so a
        checkpoint can be cached at any chunk boundary. Without it only the
        sequence-end state exists and ``page_size`` must be 1 (SGLang's rule).
    enable_mamba_extra_buffer_lazy : bool, keyword-only
        Mamba with the extra buffer only (SGLang's ``--mamba-radix-cache-strategy
        extra_buffer_lazy``, a server-wide flag there): requests start with one
        track slot and the scheduler adds the second at a track boundary (see
        ``HybridReqToTokenPool``, which must be built alike: ``ValueError``).
        The cache's own difference: when a running request's checkpoint finds
        the state pool empty, the Mamba part of ``req.lock`` is released (and
        the receipt marks MAMBA skipped) before one state is evicted, so the
        request's matched state may be the one evicted (SGLang
        ``MambaComponent._alloc_mamba_slot``; not when the lock's SWA part was
        released early, which released its Mamba part already).
    mamba_max_states_per_path : int, keyword-only
        Mamba only: -1 (default, SGLang's ``--mamba-max-states-per-path``) keeps
        every state; ``c >= 1`` caps the states on a root-to-node path: after an
        insert attached a state, the shallowest states beyond ``c`` on its path
        are freed (their Full KV stays cached), sparing the inserted node,
        Mamba-locked nodes and nodes without exactly one child, so the cap is
        soft (SGLang ``MambaEvictExcessPathStates``). ``ValueError`` for 0 or
        below -1, or for a value other than -1 without Mamba.
    device : str or torch.device
        ``"cpu"`` (values live in host memory; CUDA tensors are accepted and
        returned on their device, with one copy each way), or ``"cuda"`` /
        ``"cuda:N"`` when torch sees a CUDA device (``ValueError`` otherwise).
    is_eagle : bool
        EAGLE bigram tree: every key is viewed as bigrams. A cache with the Mamba
        component is never a bigram tree (SGLang: bigram iff ``is_eagle`` and no
        Mamba), so ``cache.is_eagle`` is then False.
    enable_kv_cache_events : bool
        Queue ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` events
        (``flatradix.events``; needs msgspec), drained by ``take_events()``. When
        off, no hashing work is done at all.
    kv_event_lora_names : dict or flatradix.events.KvEventLoraNames, optional
        ``{extra_key: lora_name}`` (or ``{extra_key: (lora_name, lora_id)}``):
        stores of those ``extra_key`` namespaces carry ``lora_name`` / ``lora_id``,
        the name a router is queried with (SGLang's cache parameter of that
        name). A dict is copied; a ``KvEventLoraNames`` is used live. Hashes do
        not depend on it. Needs msgspec.
    disable : bool
        Hold nothing: match returns empty, insert returns prefix_len 0.
    node_capacity, pool_capacity : int
        Initial sizes (grown by doubling on demand); at most 2**31 / 2**40.
        ``pool_capacity`` (rows, one per cached token) defaults to twice the
        allocator's Full slots, at most 2**23 (``POOL_CAPACITY_AUTO_MAX``), or
        2**16 without an allocator: a cache sized for its KV pool never grows
        its pool for device tokens (a growth copies every live row at once);
        the rows of evicted nodes are reused in place (gap passes; an in-place
        compaction when the dead rows are too scattered).

    Bad input raises ``TypeError`` / ``ValueError`` naming the argument before
    anything changes (``docs/architecture.md``, "Bad input").

    Threads
    -------
    Every public method runs under one re-entrant lock, ``cache.mutex`` (a
    ``threading.RLock``), so calls from several threads are serialised and each
    is atomic; the Numba kernels hold the GIL while they run. Allocator frees
    happen under it too (lock order: cache, then allocator / request pool, which
    have their own locks). What one call cannot give, hold ``cache.mutex`` for
    (re-entrant: the cache's own calls inside are fine):

    * match + lock: another thread may evict the matched node between
      ``match_prefix`` and ``inc_lock_ref`` (then ``NodeAccessError``: retry),
      so hold the lock across both, or retry. A node that could be locked was
      never evicted (ids are never reissued), so its matched indices are valid.
    * a consistent reading of several sizes (each size alone is exact).
    * a step-wise eviction round (one round per cache at a time).

    Not safe: a request (``Req``) used by two threads at once; node handles kept
    across another thread's ``reset()`` (they go stale: ``NodeAccessError``,
    never another node); KV indices of an unlocked match after another thread
    may have evicted them (lock first, then use them).
    """

    def __init__(self, page_size=1, components=_FULL_ONLY, eviction_policy="lru",
                 token_to_kv_pool_allocator=None, req_to_token_pool=None, device="cpu",
                 is_eagle=False, eviction_policy_config=None, disable=False,
                 enable_kv_cache_events=False, node_capacity=1024, pool_capacity=None,
                 kv_event_lora_names=None, *, tree_components=None, sliding_window_size=None,
                 mamba_cache_chunk_size=64, enable_mamba_extra_buffer=False,
                 mamba_max_states_per_path=-1, enable_mamba_extra_buffer_lazy=False):
        if isinstance(page_size, bool) or not isinstance(page_size, (int, np.integer)):
            raise TypeError(f"page_size must be an int, got {type(page_size).__name__}")
        self.page_size = int(page_size)
        if not 1 <= self.page_size <= MAX_PAGE_SIZE:
            raise ValueError(f"page_size must be in [1, {MAX_PAGE_SIZE}], got {self.page_size}")
        if tree_components is not None:
            if components is not _FULL_ONLY and _components(components) != _components(
                    tree_components):
                raise ValueError("components and tree_components disagree (give one of them)")
            components = tree_components
        comps = _components(components)
        if comps not in _COMPONENT_SETS:
            raise ValueError(f"components must be (FULL,), (FULL, SWA), (FULL, MAMBA) or "
                             f"(FULL, SWA, MAMBA), got {comps}")
        self.components = comps
        self._swa = ComponentType.SWA in comps
        if self._swa:
            if sliding_window_size is None:
                raise ValueError("sliding_window_size is required with ComponentType.SWA")
            if isinstance(sliding_window_size, bool) or not isinstance(
                    sliding_window_size, (int, np.integer)):
                raise TypeError("sliding_window_size must be an int, got "
                                f"{type(sliding_window_size).__name__}")
            if not 1 <= sliding_window_size <= MAX_WINDOW:
                raise ValueError(f"sliding_window_size must be in [1, {MAX_WINDOW}], got "
                                 f"{sliding_window_size}")
            if not is_swa_allocator(token_to_kv_pool_allocator):
                raise TypeError("token_to_kv_pool_allocator: an SWA cache needs an SWA allocator "
                                "(flatradix.SWATokenToKVPoolAllocator or SGLang's "
                                "SWATokenToKVPoolAllocator), got "
                                f"{type(token_to_kv_pool_allocator).__name__}")
            alloc_page = getattr(token_to_kv_pool_allocator, "page_size", self.page_size)
            if alloc_page != self.page_size:
                raise ValueError(f"token_to_kv_pool_allocator.page_size={alloc_page} differs from "
                                 f"page_size={self.page_size}")
        elif sliding_window_size is not None:
            raise ValueError("sliding_window_size given, but components has no ComponentType.SWA")
        self._window = int(sliding_window_size) if self._swa else 0
        self._mamba = ComponentType.MAMBA in comps
        chunk = as_int(mamba_cache_chunk_size, "mamba_cache_chunk_size")
        if chunk < 1:
            raise ValueError(f"mamba_cache_chunk_size must be >= 1, got {chunk}")
        extra = as_flag(enable_mamba_extra_buffer, "enable_mamba_extra_buffer")
        lazy = as_flag(enable_mamba_extra_buffer_lazy, "enable_mamba_extra_buffer_lazy")
        if lazy and not (self._mamba and extra):
            raise ValueError("enable_mamba_extra_buffer_lazy needs ComponentType.MAMBA and "
                             "enable_mamba_extra_buffer=True (it is the extra buffer's lazy "
                             "variant)")
        path_cap = as_int(mamba_max_states_per_path, "mamba_max_states_per_path")
        if path_cap == 0 or path_cap < -1:
            raise ValueError("mamba_max_states_per_path must be -1 (unlimited) or >= 1, got "
                             f"{path_cap}")
        if path_cap != -1 and not self._mamba:
            raise ValueError(f"mamba_max_states_per_path={path_cap} given, but components has "
                             "no ComponentType.MAMBA")
        disable_flag = as_flag(disable, "disable")
        if self._mamba:
            malloc = getattr(req_to_token_pool, "mamba_allocator", None)
            if malloc is None or not all(callable(getattr(malloc, m, None))
                                         for m in ("alloc", "free", "available_size")):
                raise TypeError("req_to_token_pool: a Mamba cache needs a request pool with a "
                                "mamba_allocator (alloc, free, available_size): "
                                "flatradix.HybridReqToTokenPool or SGLang's "
                                f"HybridReqToTokenPool, got {type(req_to_token_pool).__name__}")
            pool_extra = getattr(req_to_token_pool, "enable_mamba_extra_buffer", None)
            if pool_extra is not None and bool(pool_extra) != extra:
                raise ValueError(f"enable_mamba_extra_buffer={extra} but req_to_token_pool was "
                                 f"built with enable_mamba_extra_buffer={bool(pool_extra)}: "
                                 "the request path needs both alike (a pool with ping-pong "
                                 "track buffers exactly when the cache caches their states)")
            pool_lazy = getattr(req_to_token_pool, "enable_mamba_extra_buffer_lazy", None)
            if pool_lazy is not None and bool(pool_lazy) != lazy:
                raise ValueError(f"enable_mamba_extra_buffer_lazy={lazy} but req_to_token_pool "
                                 "was built with enable_mamba_extra_buffer_lazy="
                                 f"{bool(pool_lazy)}: build both alike")
            if not extra and self.page_size != 1 and not disable_flag:
                raise ValueError(f"page_size={self.page_size}: a Mamba cache without "
                                 "enable_mamba_extra_buffer caches only sequence-end states and "
                                 "needs page_size=1 (SGLang's rule)")
        #: What a lock's early SWA release also released (SGLang: SWA and every
        #: component of lower internal priority, i.e. Mamba), skipped by the final unlock.
        self._early_mask = L.C_SWA | (L.C_MAMBA if self._mamba and self._swa else 0)
        self.mamba_cache_chunk_size = chunk
        self.enable_mamba_extra_buffer = extra
        self.enable_mamba_extra_buffer_lazy = lazy
        self._path_cap = path_cap
        #: The grid a branching Mamba checkpoint lands on (tokens).
        self.mamba_checkpoint_grid = chunk * self.page_size // math.gcd(chunk, self.page_size)
        if not isinstance(eviction_policy, str) or eviction_policy.lower() not in L.POLICY_NAMES:
            raise ValueError(f"eviction_policy must be one of {', '.join(L.POLICY_NAMES)}; "
                             f"got {eviction_policy!r}")
        self.eviction_policy = eviction_policy.lower()
        if eviction_policy_config is not None and not isinstance(eviction_policy_config, Mapping):
            raise TypeError(f"eviction_policy_config must be a dict or None, got "
                            f"{type(eviction_policy_config).__name__}")
        self._policy_cfg = self._policy_config(self.eviction_policy, eviction_policy_config or {})
        if token_to_kv_pool_allocator is not None and not callable(
                getattr(token_to_kv_pool_allocator, "free", None)):
            raise TypeError("token_to_kv_pool_allocator must have a free(indices) method "
                            f"(got {type(token_to_kv_pool_allocator).__name__})")
        if req_to_token_pool is not None and not (
                hasattr(req_to_token_pool, "req_to_token")
                and callable(getattr(req_to_token_pool, "free", None))):
            raise TypeError("req_to_token_pool must have .req_to_token and a free(row) method "
                            f"(got {type(req_to_token_pool).__name__})")
        _check_device(device)
        ncap = as_count(node_capacity, "node_capacity")
        if ncap > MAX_NODE_CAPACITY:
            raise ValueError(f"node_capacity must be <= {MAX_NODE_CAPACITY}, got {ncap}")
        pcap = (_auto_pool_capacity(token_to_kv_pool_allocator) if pool_capacity is None
                else as_count(pool_capacity, "pool_capacity"))
        if pcap > MAX_POOL_CAPACITY:
            raise ValueError(f"pool_capacity must be <= {MAX_POOL_CAPACITY}, got {pcap}")
        if kv_event_lora_names is not None:
            from .events import lora_name_table  # TypeError / ValueError naming the argument

            kv_event_lora_names = lora_name_table(kv_event_lora_names, "kv_event_lora_names")
        self.kv_event_lora_names = kv_event_lora_names
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.req_to_token_pool = req_to_token_pool
        self.device = device
        # a Mamba tree is never a bigram tree (SGLang: bigram iff is_eagle and no Mamba)
        self.is_eagle = as_flag(is_eagle, "is_eagle") and not self._mamba
        self.disable = as_flag(disable, "disable")
        self.enable_kv_cache_events = (as_flag(enable_kv_cache_events, "enable_kv_cache_events")
                                       and not self.disable)
        # a Full-only cache: lock / unlock take their short path (no receipt parts)
        # while it is enabled (``disable`` is read at each call: it may be set later)
        self._plain_locks = not (self._swa or self._mamba)
        self._mutex = threading.RLock()
        self._vals = ValueBridge(token_to_kv_pool_allocator)
        if self._mamba:
            self._vals.set_mamba(req_to_token_pool.mamba_allocator)
        cfg = self._policy_cfg
        pa = pb = 0
        if self.eviction_policy == "slru":
            pa = cfg["protected_threshold"]
        elif self.eviction_policy == "tlru":
            pa, pb = cfg["threshold"], cfg["next_prompt_estimate"]
        try:
            self._engine = Engine(
                page_size=self.page_size, policy=L.POLICY_NAMES.index(self.eviction_policy),
                policy_a=pa, policy_b=pb, events=self.enable_kv_cache_events,
                components=(L.C_FULL | (L.C_SWA if self._swa else 0)
                            | (L.C_MAMBA if self._mamba else 0)), swa_window=self._window,
                mamba_path_cap=path_cap,
                bigram=self.is_eagle, node_capacity=max(4, ncap), pool_capacity=max(64, pcap))
        except MemoryError as e:
            raise MemoryError(f"node_capacity={ncap}, pool_capacity={pcap}: cannot allocate the "
                              f"initial arrays ({e})") from None
        self._sink = (EventSink(self._engine, self.page_size, self.is_eagle,
                                self.kv_event_lora_names)
                      if self.enable_kv_cache_events else None)
        self._root = self._engine.root
        if self._sink is not None:
            self._sink.cleared()
        self._executor = Executor(self._vals, self._sink)
        #: the host tier (HiCache), off until ``init_hicache``
        self._hicache = HostTier(self)

    @property
    def mutex(self):
        """The cache's ``threading.RLock``: hold it to make several calls one atomic
        step (e.g. ``match_prefix`` + ``inc_lock_ref``). See the class docstring.
        (``lock(node)`` is SGLang's lock call, not this.)"""
        return self._mutex

    # ------------------------------------------------------------------ setup
    @staticmethod
    def _policy_config(name, cfg):
        allowed = _POLICY_DEFAULTS.get(name, {})
        bad = set(cfg) - set(allowed)
        if bad:
            raise TypeError(f"eviction_policy_config: unknown keys {sorted(bad)} for policy "
                            f"{name!r} (allowed: {sorted(allowed)})")
        out = dict(allowed)
        out.update(cfg)
        for k, v in out.items():
            as_int(v, f"eviction_policy_config[{k!r}]")
        if name == "tlru" and not out["threshold"] >= 0:
            raise ValueError("eviction_policy_config['threshold'] must be >= 0")
        if name == "slru" and not out["protected_threshold"] >= 0:
            raise ValueError("eviction_policy_config['protected_threshold'] must be >= 0")
        return out

    # ------------------------------------------------------------------ request-path API
    # The request path (``requests.py``) uses the public API plus exactly these:
    # ``_mutex``, ``_vals`` (the ValueBridge), ``_key``, ``_insert_units``,
    # ``_check_unlock`` and ``_window`` / ``_swa``; each is documented where it is
    # defined.

    def _key(self, key, name="key"):
        """``(units, aligned_len, ns_key, raw_tokens)`` of a RadixKey; changes nothing.

        ``units`` are the key's logical units (int64, bigram pairs packed in EAGLE
        trees), ``aligned_len`` their count aligned down to a page, ``ns_key`` the
        ``(extra_key, cache_salt)`` tuple: namespaces are compared as tuples, never
        concatenated (known_bugs B5). ``TypeError`` / ``ValueError`` naming ``name``.
        """
        if type(key) is RadixKey:
            toks = key.token_ids
            if (type(toks) is np.ndarray and toks.dtype is _I64 and toks.ndim == 1
                    and key.extra_key is None and key.cache_salt is None and not key.is_bigram
                    and not self.is_eagle):
                flags = toks.flags
                if flags.c_contiguous and flags.writeable:  # the common key: as it is
                    n = toks.shape[0]
                    return toks, n - n % self.page_size, _DEFAULT_NS, toks
        if not isinstance(key, RadixKey):
            raise TypeError(f"{name} must be a flatradix.RadixKey, got {type(key).__name__}")
        if key.is_bigram and not self.is_eagle:
            raise ValueError(f"{name}: a bigram key given to a cache built with is_eagle=False "
                             "(bigram and plain keys cannot be mixed)")
        ek, salt = key.extra_key, key.cache_salt
        if ek is not None and type(ek) is not str:
            raise TypeError(f"{name}.extra_key must be a str or None, got {type(ek).__name__}")
        if salt is not None and type(salt) is not str:
            raise TypeError(f"{name}.cache_salt must be a str or None, got {type(salt).__name__}")
        units, raw = key_units(key, self.is_eagle, name)
        n = units.shape[0]
        n -= n % self.page_size
        return units, n, (ek, salt), raw

    def _insert_units(self, units, value, n, nk, prev, inserted_len, priority, limit, name,
                      want_path=False, keep_own=False, cursor=0, track=False, mamba_slot=-1):
        """One insert kernel call on validated arguments (shared by ``insert`` and the
        request path); executes its actions (duplicate frees, SWA recovery, events).

        ``units``/``value``: int64, ``n`` page-aligned (> 0); ``limit``: the
        kernel's bound check (``VALUES_*`` or the allocator's bound). ``want_path``:
        the path's value is returned (a view valid until the next engine call;
        ``path[:prefix_len]`` are the tree's slots). ``keep_own`` (request path):
        duplicates equal to the tree's own slot at their position are not freed.
        ``cursor``: the request's SWA eviction cursor (page-aligned; SWA caches).
        ``track``: SWA caches report adopted ranges. ``mamba_slot``: the state slot
        donated to the target (Mamba caches; validated by the caller).
        Returns ``(prefix_len, target_id, freed, path, adopted, mamba_exist)``; ``freed`` are the
        duplicate slots freed (what the caller frees without an allocator),
        ``adopted`` ``{component: [(start, end)]}`` when tracked on an SWA cache.
        Raises ``ValueError`` naming ``name`` for a bad KV index, nothing changed
        (a namespace first seen by this call is forgotten again).
        ``inserted_len`` beyond ``n`` is clamped to ``n`` (same hit accounting)."""
        if inserted_len > n:
            inserted_len = n
        if prev > n:
            prev = n
        eng = self._engine
        adopted = {} if track else None
        with self._mutex:
            ns = eng.ns.get(nk)
            new_ns = ns is None
            if new_ns:
                ns = eng.ns.intern(nk)
            if want_path:
                eng.ensure_out(2 * n)
            st, plen, target, exist = eng.k.insert(units, value, n, ns, inserted_len, priority,
                                                   limit, prev, cursor, _TRACK if track else 0,
                                                   mamba_slot, n if want_path else 0)
            if st == L.E_BAD_VALUE:
                if new_ns:
                    eng.ns.forget(nk)
                bad = int(value[plen])
                if bad < 0:
                    raise ValueError(f"{name}: KV indices must be >= 0, got {bad} at {plen}")
                raise ValueError(f"{name}: KV index {bad} at {plen} is outside the "
                                 f"allocator's pool (indices must be < {limit})")
            if new_ns and len(eng.ns.ids) > eng.ns.gc_at:
                # after the insert: a refused call changes nothing
                eng.gc_namespaces(self._sink.forget if self._sink is not None else None)
            if self._hicache.on:  # backups run amid the rows (engine calls): copy them
                out = eng.out[:max(n if want_path else 0, int(eng.meta[L.M_NOUT]))].copy()
                freed = self._hicache.run_with_barriers(eng.actions().copy(), out, value,
                                                        keep_own, adopted)
            else:
                out = eng.out
                freed = self._executor.run(eng.actions(), out, value, keep_own=keep_own,
                                           adopted=adopted)
            path = out[:n] if want_path else None
        return plen, target, freed, path, adopted, bool(exist)

    def _check_anchored(self, node, name):
        """Raise (before any change) unless ``dec_lock_ref(node)`` would succeed for
        Full: ``NodeAccessError`` for a stale id, ``LockRefError`` when no lock is
        anchored on the node. O(1): a lock anchored on a node implies lock_ref >= 1
        on its whole path (each parent counts its children's locks). Returns the id."""
        nid = as_node_id(node, name)
        if self.disable:
            return nid
        eng = self._engine
        s = inspection.slot(eng, nid)
        if s < 0:
            raise self._stale(nid, name)
        if s != L.ROOT and inspection.anchored_locks(eng, s) < 1:
            raise LockRefError(f"{name}={nid} holds no lock to release (lock_ref="
                               f"{inspection.lock_ref(eng, s)}, all of it held by locks on "
                               "its descendants)")
        return nid

    def _check_unlock(self, node, receipt, swa_released, name):
        """Raise (before any change) unless releasing the lock on ``node`` with
        ``receipt`` (None: Full-only caches) would succeed -- the check
        ``dec_lock_ref`` makes first, without releasing. Errors as ``dec_lock_ref``,
        naming ``name``. Returns the node id."""
        nid = self._check_anchored(node, f"{name}.node" if receipt is not None else name)
        if self.disable or not (self._swa or self._mamba):
            return nid
        skip, boundary = self._receipt(nid, receipt, f"{name}.receipt")
        if swa_released:
            skip |= self._early_mask
        # (callers hold the cache lock: _check_last_node)
        st, slot = self._engine.k.check_dec(nid, skip, boundary)
        if st == L.E_LOCK_UNDERFLOW:
            self._raise_underflow(int(slot), nid)
        return nid

    def _stale(self, nid, name="node"):
        return NodeAccessError(f"{name}: node id {nid} does not name a live node "
                               "(evicted, split away, from before reset(), or never issued)")

    # ------------------------------------------------------------------ match
    def _empty_match(self):
        r = self._root
        return _tuple_new(MatchResult, (self._vals.empty(), r, r, r, 0, 0, 0, None,
                                        0, None, 0, None, None, None))

    def match_prefix(self, params):
        """Longest cached prefix of ``params.key`` (a ``MatchPrefixParams`` or a ``RadixKey``).

        Returns a ``MatchResult``; ``device_indices`` is int64 1-D of length
        ``device_prefix_len`` (page-aligned). May split a node so the match ends on
        a node boundary; refreshes recency of the matched path. O(len(key)).
        With SWA the prefix ends at the deepest node reached through ``W``
        contiguous tokens of SWA data (or with no tombstone on its path);
        ``full_kv_hit_length`` counts every matched token with Full KV and
        ``swa_branching_seqlen`` is it when it is longer than the usable prefix
        (else None). Raises ``TypeError``/``ValueError`` for a malformed key
        (tree unchanged). A list key that is ``params.req``'s own
        ``origin_input_ids`` / ``fill_ids`` (as SGLang's scheduler passes them)
        is converted through the request's memo: once per request, not per call.
        Mamba with ``cow_mamba`` (spec §6.3): when the best match node
        (``best_match_node``, which may lie past the device match on the host
        tier) owns a *device* state and the request holds no slot, one slot is
        allocated for it (one state evicted first when the pool is empty, the
        best match node locked meanwhile); nothing at all when that node's state
        is not on the device (SGLang's ``finalize_match_result_in_cache``);
        ``RuntimeError("Can not alloc mamba cache ...")`` when nothing is
        evictable -- raised after the match itself (its split and LRU refresh)
        happened, as SGLang's assertion; the request then still holds no slot.
        """
        cow = False
        if type(params) is MatchPrefixParams:
            key = params.key
            if params.req is not None and type(key) is RadixKey and type(key.token_ids) is list:
                key = self._req_key(params.req, key)
            if params.cow_mamba is not False:
                cow = as_flag(params.cow_mamba, "params.cow_mamba") and self._check_cow(params)
        else:
            key = params
        units, n, nk, _ = self._key(key, "params.key")
        eng = self._engine
        ns = eng.ns.get(nk)
        if self.disable or n == 0 or ns is None:  # an unseen namespace caches nothing
            return self._empty_match()
        # The result array is allocated here, at the key's length, and the kernel
        # writes the matched indices straight into it (no scratch + copy).
        idx = np.empty(n, dtype=np.int64)
        with self._mutex:
            st, plen, best, visited, full_hit, host_hit, hbest = eng.k.match_prefix(units, n, ns,
                                                                                    idx)
            h = self._hicache
            shost = 0 if h.swa_pool_host is None else eng.k.swa_host_hit(hbest)
            mhost = 0 if h.mamba_pool_host is None else h.mamba_host_hit(hbest)
        if plen < n:
            idx = idx[:plen]
        vis = None if visited < 0 else visited
        if self._vals.kind == "torch":
            idx = self._vals.out(idx)
        # SWA: how far the match could have gone with the window present (the walk's
        # page-aligned length, when it is past the usable prefix)
        branch = full_hit if self._swa and full_hit > plen + host_hit else None
        mbranch = None
        if self._mamba:
            mbranch = self._mamba_branch(full_hit, plen + host_hit)
            if cow:  # the best match node's device state (SGLang's finaliser), not `best`'s
                self._cow_mamba(params.req, hbest)
        # tuple.__new__ skips the NamedTuple's Python-level __new__ (~0.4 µs)
        return _tuple_new(MatchResult, (idx, best, hbest, hbest, host_hit, plen, full_hit, vis,
                                        shost, branch, mhost, mbranch, None, None))

    def _mamba_branch(self, full_hit, boundary):
        """SGLang's ``mamba_branching_seqlen``: the Full hit aligned down to the
        checkpoint grid ``lcm(mamba_cache_chunk_size, page_size)``, when that is
        past the Mamba boundary (the device prefix plus the host hit; spec §6.3),
        else None."""
        grid = self.mamba_checkpoint_grid
        aligned = full_hit // grid * grid
        return aligned if aligned > boundary else None

    def _check_cow(self, params):
        """Validate a ``cow_mamba`` match's request (before anything changes)."""
        if not self._mamba:
            raise ValueError("params.cow_mamba given, but this cache has no Mamba component")
        req = params.req
        kv = getattr(req, "kv", None)
        if req is None or kv is None or not hasattr(kv, "mamba_pool_idx"):
            raise ValueError("params.cow_mamba needs params.req with a .kv holding "
                             "mamba_pool_idx (SGLang's Req)")
        return True

    def _cow_mamba(self, req, best):
        """Copy-on-write of the best match node ``best``'s device state (SGLang's
        Mamba cache finaliser): the request gets a private slot (allocated when it
        holds none; when the pool is empty one state is evicted with ``best``
        locked meanwhile) and ``req.kv.mamba_cow_src_index`` names the node's
        slot (the copy itself is the caller's, on its stream). Nothing when the
        node has no device state (none, or on the host only)."""
        with self._mutex:
            eng = self._engine
            s = inspection.slot(eng, best)
            src = -1 if s < 0 else inspection.device_state(eng, s)
            if src < 0:
                return
            kv = req.kv
            if not holds_state(kv):
                alloc = self._vals.mamba
                dst = alloc.alloc(1)
                if dst is None:
                    receipt = self.inc_lock_ref(best)
                    try:
                        self.evict(EvictParams(num_tokens=0, mamba_num=1))
                    finally:
                        self.dec_lock_ref(best, receipt.to_dec_params())
                    dst = alloc.alloc(1)
                    if dst is None:
                        raise RuntimeError("Can not alloc mamba cache: the Mamba state pool is "
                                           "empty and nothing is evictable")
                kv.mamba_pool_idx = dst[0]
            src_t = self._vals.mamba_out(src)
            kv.mamba_cow_src_index = src_t
            kv.mamba_needs_clear = False

    # ------------------------------------------------------------------ insert
    def insert(self, params):
        """Insert ``params.key`` -> ``params.value`` (an ``InsertParams``).

        The key and value are page-aligned down (the unaligned tail stays the
        caller's). Returns ``InsertResult(prefix_len, ..., last_device_node)``.
        The slots ``value[prev_prefix_len:prefix_len]`` duplicate cached ones:
        they are freed through the allocator when one is attached, else returned
        in ``duplicate_indices``. O(len(key)).

        SWA caches (spec §6.2): positions below the request's SWA cursor
        (``params.component_evicted_seqlens[SWA]``) are inserted as tombstones and
        their duplicates freed Full-only; a matched tombstone at or past the
        cursor is recovered from ``value`` (its duplicate is then the tree's);
        the new leaf keeps at most ``ceil(W / P) * P`` tokens of SWA data (an
        older part becomes its parent). Mamba caches (spec §6.3):
        ``params.mamba_value`` (a 1-element slot of ``req_to_token_pool.
        mamba_allocator``) is required; the new leaf -- or the node the key ended
        on, when it has no state -- takes it; when that node already has a state,
        ``mamba_exist`` is True and the slot stays the caller's to free.
        ``swa_branch_inserted`` is
        ``len(key) >= params.swa_branching_seqlen`` when the latter is set;
        ``adopted_ranges`` (when tracked) lists per component the ranges whose
        slots the tree took over.

        A key that is empty after page alignment (shorter than a page) is a
        no-op: nothing is touched (SGLang touches the root's recency, which
        nothing reads), ``prefix_len == 0``, ``last_device_node`` is the root
        and the value stays the caller's. ``prev_prefix_len`` and ``inserted_len``
        beyond the key's length mean "all of it" (any int >= 0 is accepted).

        Raises ``TypeError``/``ValueError`` naming the argument for a malformed
        key or value (wrong type, dtype, shape or length, negative or
        out-of-range KV index; with flatradix's allocator attached, a slot it has
        not handed out: free, slot 0, or given twice; with its SWA allocator, a
        slot at or past the SWA cursor without an SWA peer, or one below it and
        past ``prev_prefix_len`` with an SWA peer still), a negative or
        unaligned SWA cursor or SWA parameters on a cache without SWA, before
        anything changes.
        """
        if not isinstance(params, InsertParams):
            raise TypeError(f"params must be a flatradix.InsertParams, got {type(params).__name__}")
        units, n, nk, raw = self._key(params.key, "params.key")
        prev = as_count(params.prev_prefix_len, "params.prev_prefix_len")
        inserted_len = as_count(params.inserted_len, "params.inserted_len")
        priority = as_int(params.priority if params.priority is not None else 0, "params.priority")
        mamba_slot = -1
        if params.mamba_value is not None:
            if not self._mamba:
                raise ValueError("params.mamba_value given, but this cache has no Mamba component")
            mamba_slot = self._vals.mamba_slot(params.mamba_value, "params.mamba_value")
        cursor, branching = self._swa_params(params)
        nlog = units.shape[0]
        if params.value is None:
            value = raw[:nlog].astype(np.int64) if raw.dtype != np.int64 else raw[:nlog]
            value = np.ascontiguousarray(value)
            name = "params.value is None, so the token ids are the KV indices"
            # without an allocator the token ids are values as they are; with one they
            # must be slots of its pool like any value (evicting them frees them there)
            limit = (L.VALUES_UNCHECKED if self.token_to_kv_pool_allocator is None
                     else self._vals.kv_bound())
        else:
            value = as_int64(params.value, "params.value")
            bigram = params.key.is_bigram or self.is_eagle
            ok = value.shape[0] == nlog or (bigram and value.shape[0] == raw.shape[0])
            if not ok:
                k = value.shape[0]
                raise ValueError(f"params.value has {k} {'entry' if k == 1 else 'entries'} but "
                                 f"params.key has {nlog} logical {'unit' if nlog == 1 else 'units'}")
            name = "params.value"
            limit = self._vals.kv_bound()  # checked by the kernel, before anything changes
        if self.disable:
            return InsertResult(prefix_len=0)
        if n == 0:  # documented no-op (see above): no namespace, no clock tick
            if limit != L.VALUES_UNCHECKED and value.shape[0] and (
                    value.min() < 0 or (limit >= 0 and value.max() >= limit)):
                bound = f"[0, {limit})" if limit >= 0 else ">= 0"
                raise ValueError(f"{name}: KV indices must be in {bound}")
            dup_out = None if self.token_to_kv_pool_allocator is not None else self._vals.empty()
            # (SGLang returns before the component commits: swa_branch_inserted False)
            return InsertResult(prefix_len=0, last_device_node=self._root, duplicate_indices=dup_out,
                                mamba_exist=True)
        if self._mamba and mamba_slot < 0:
            raise ValueError("params.mamba_value is required with ComponentType.MAMBA (the "
                             "state slot donated to the inserted node)")
        if limit != L.VALUES_UNCHECKED and self._vals.check_held(value, name):
            # flatradix's allocator: every slot is held (allocated, in 1..size, not
            # given twice), which implies the kernel's bound check: skip that pass
            limit = L.VALUES_UNCHECKED
        if self._swa:
            self._vals.check_swa_peers(value[:n], prev, cursor, name)
        branch_inserted = branching is not None and nlog >= branching
        track = bool(params.track_adopted_ranges)
        plen, target, dup, _, adopted, exist = self._insert_units(
            units, value, n, nk, prev, inserted_len, priority, limit, name, cursor=cursor,
            track=track and (self._swa or self._hicache.on), mamba_slot=mamba_slot)
        if params.value is not None:
            self._vals.note_kind(params.value)
        if mamba_slot >= 0 and not exist:
            self._vals.mamba_owned.add(mamba_slot)
        dup_out = None if self.token_to_kv_pool_allocator is not None else self._vals.out(dup)
        if track:
            if self._swa or self._hicache.on:
                adopted = {ComponentType(c): r for c, r in adopted.items()}
            else:  # only components that adopted something appear (SGLang: {} when none)
                adopted = {ComponentType.FULL: [(plen, n)]} if n > plen else {}
        result = InsertResult(prefix_len=plen, last_device_node=target, adopted_ranges=adopted,
                              duplicate_indices=dup_out, mamba_exist=exist,
                              swa_branch_inserted=branch_inserted)
        if self._hicache.on:
            # a backup's copy failed: raised once all is done, carrying the insert's
            # result (a Mamba caller frees its slot on mamba_exist)
            self._hicache.raise_transfer_error(result)
        return result

    def _swa_params(self, params):
        """``(cursor, swa_branching_seqlen)`` of an ``InsertParams``, validated."""
        evicted = params.component_evicted_seqlens
        if type(evicted) is dict and not evicted and params.swa_branching_seqlen is None:
            return 0, None   # the common case: nothing to check
        if not isinstance(evicted, Mapping):
            raise TypeError("params.component_evicted_seqlens must be a dict, got "
                            f"{type(evicted).__name__}")
        cursor = 0
        for c, v in evicted.items():
            c = _component(c, "params.component_evicted_seqlens key")
            v = as_count(v, f"params.component_evicted_seqlens[{c.name}]")
            if v and c not in self.components:
                raise ValueError(f"params.component_evicted_seqlens[{c.name}]={v}, but this "
                                 f"cache has no {c.name} component")
            if c == ComponentType.SWA:
                if v % self.page_size:
                    raise ValueError(f"params.component_evicted_seqlens[SWA]={v} is not a "
                                     f"multiple of page_size={self.page_size}")
                cursor = v
        branching = params.swa_branching_seqlen
        if branching is not None:
            branching = as_count(branching, "params.swa_branching_seqlen")
            if not self._swa:
                raise ValueError("params.swa_branching_seqlen given, but this cache has no "
                                 "SWA component")
        return cursor, branching

    # ------------------------------------------------------------------ evict
    def evict(self, params):
        """Evict until ``num_tokens`` Full units (and ``swa_num_tokens`` SWA units) are freed.

        ``params``: ``EvictParams`` or an int (``num_tokens``). The Full walk
        deletes least-priority unlocked leaves; then, with SWA, the SWA walk takes
        the least recently used SWA data not covered by a window lock: a victim
        that is an unlocked leaf is deleted whole, any other loses its SWA data
        only (a tombstone). Leaves deleted by one walk count for both components,
        so the SWA walk is skipped when the Full walk freed enough SWA.
        Freed KV indices go to the allocator (or ``EvictResult.evicted_indices``
        -- the Full slots -- without one). Node-granular: may free more than
        asked. Cost O(evicted nodes * log leaves), independent of the tree's
        size. Asking for more than is evictable evicts everything evictable and
        returns what that freed (never an error; counts above 2**62, e.g. 2**63,
        are clamped). Raises ``TypeError`` for a non-int count and
        ``ValueError`` for a negative one, before anything changes.
        With Mamba, the Mamba walk then takes the least recently used states
        not locked (``mamba_num``): an unlocked leaf is deleted whole, another
        node loses its state only; states freed by the Full walk's deletions
        count. ``mamba_num`` / ``swa_num_tokens`` are validated the same way on
        a cache without that component, and ignored.
        """
        mamba_num = 0
        if isinstance(params, EvictParams):
            num = as_count(params.num_tokens, "params.num_tokens")
            swa_num = 0
            if params.swa_num_tokens != 0 or params.mamba_num != 0:
                swa_num = as_count(params.swa_num_tokens, "params.swa_num_tokens")
                mamba_num = as_count(params.mamba_num, "params.mamba_num")
            if not self._swa:
                swa_num = 0
            if not self._mamba:
                mamba_num = 0
        elif isinstance(params, (int, np.integer)) and not isinstance(params, bool):
            num = as_count(params, "params.num_tokens")
            swa_num = 0
        else:
            raise TypeError(f"params must be an EvictParams or an int (params.num_tokens), got "
                            f"{type(params).__name__}")
        num, swa_num = min(num, _COUNT_CLAMP), min(swa_num, _COUNT_CLAMP)
        mamba_num = min(mamba_num, _COUNT_CLAMP)
        no_alloc = self.token_to_kv_pool_allocator is None
        if self.disable or (num == 0 and swa_num == 0 and mamba_num == 0):
            return EvictResult(0, 0, 0, self._vals.empty() if no_alloc else None)
        eng = self._engine
        want = [0] * L.N_COMPONENTS  # per component (counts indexed by component)
        want[L.FULL], want[L.SWA], want[L.MAMBA] = num, swa_num, mamba_num
        with self._mutex:
            if self._hicache.policy == "write_back":  # SGLang's step-wise rounds
                done, parts = self._hicache.write_back_evict(want)
            else:
                done, parts = [0] * L.N_COMPONENTS, []
                phase = 0
                while True:
                    st, f, w, m, phase = eng.k.evict(num - done[L.FULL], swa_num - done[L.SWA],
                                                     mamba_num - done[L.MAMBA], phase)
                    done[L.FULL] += f
                    done[L.SWA] += w
                    done[L.MAMBA] += m
                    parts.append(self._executor.run(eng.actions(), eng.out))
                    if st == L.OK:
                        break
                    eng.grow()  # out / acts too small for the next victim: grow, go on
        freed = self._vals.out(_cat_or_empty(parts)) if no_alloc else None
        return EvictResult(done[L.FULL], done[L.SWA], done[L.MAMBA], freed)

    def evict_device_start(self, component=ComponentType.FULL, num_tokens=0):
        """Open a step-wise eviction round of ``num_tokens`` units for ``component``
        (FULL, or SWA / MAMBA when configured; Mamba counts states).

        Raises ``RuntimeError("device eviction already in progress")`` when one is
        open for that component, ``ValueError`` for a component that is not
        configured or a negative count, ``TypeError`` for a non-int count. Counts
        above 2**62 are clamped (the round then runs until nothing evictable is left).
        """
        c = self._check_component(component)
        num = min(as_count(num_tokens, "num_tokens"), _COUNT_CLAMP)
        with self._mutex:
            if self._engine.k.evict_start(c, num) != L.OK:
                raise RuntimeError("device eviction already in progress")

    def evict_device_next_node(self, component=ComponentType.FULL):
        """One step of the open round; returns an ``EvictStep``.

        Full: the least-priority evictable leaf is deleted. SWA: the round's cursor
        is evicted (a leaf deleted whole, another node tombstoned: ``node_id``
        None, ``made_progress`` True); the cursor starts at the least recently
        used SWA data not covered by a window lock and each step moves it to the
        next more recent unlocked entry, so a refresh between steps does not
        change the next victim (SGLang §5.4; a cursor evicted or window-locked
        since restarts at the least recent unlocked entry).
        The step's slots are *not* freed by the cache: the controller frees
        ``freed_indices`` (Full) and the SWA peers of ``swa_freed_indices``
        (SGLang's "tree decides, cache executes"). ``made_progress`` False ends
        the round (request met, or nothing evictable).
        """
        c = self._check_component(component)
        eng = self._engine
        # the controller frees the step's slots: the executor runs the events only and
        # collects the slots per component
        collect = [[] for _ in range(L.N_COMPONENTS)]
        with self._mutex:
            st, nid, f, w, m = eng.k.evict_next(c)
            if st == L.E_NO_WALK:
                raise RuntimeError("no device eviction in progress: call evict_device_start first")
            if st == L.E_NEED_BACKUP or st == L.E_NEED_STATE_BACKUP:
                # write-back: back the victim up, then demote / drop it (a leaf) or
                # tombstone its SWA data / state (an internal node)
                nid, counts, freed = self._hicache.write_back_step(c, st, nid, w, collect)
            else:
                freed = self._executor.run(eng.actions(), eng.out, free=False, collect=collect)
                if f == 0 and w == 0 and m == 0:
                    return EvictStep(None, self._vals.empty(), 0, False,
                                     swa_freed_indices=self._vals.empty(),
                                     mamba_freed_indices=self._mamba_empty())
                nid = None if nid < 0 else int(nid)
                counts = [0] * L.N_COMPONENTS
                counts[L.FULL], counts[L.SWA], counts[L.MAMBA] = int(f), int(w), int(m)
            states = _cat_or_empty(collect[L.MAMBA])
            if states.size:  # the controller frees them: the tree holds them no more
                self._vals.mamba_owned.difference_update(states.tolist())
        return EvictStep(nid, self._vals.out(freed), counts[L.FULL], True,
                         swa_freed_indices=self._vals.out(_cat_or_empty(collect[L.SWA])),
                         swa_num_tokens=counts[L.SWA],
                         mamba_freed_indices=(self._mamba_slots(states) if self._mamba
                                              else None),
                         mamba_num=counts[L.MAMBA])

    def _mamba_empty(self):
        return self._mamba_slots(_EMPTY) if self._mamba else None

    def _mamba_slots(self, a):
        """int64 state slots as the Mamba allocator's kind."""
        if self._vals._mamba_numpy:
            return a.copy()
        import torch

        return torch.from_numpy(a.copy())

    def evict_device_end(self, component=ComponentType.FULL):
        """Close the open round of ``component`` (idempotent); returns the units it evicted."""
        c = self._check_component(component)
        with self._mutex:
            return int(self._engine.k.evict_end(c))

    def evict_for_alloc(self, params):
        """Evict until the allocator can serve an allocation.

        ``params`` an int ``n``: until the allocator has ``n`` free slots (Full).
        ``params`` an ``EvictParams`` (SGLang's meaning): its counts are the
        allocation's *shortfalls*; evict until the allocator's available Full
        (SWA) slots grew by ``num_tokens`` (``swa_num_tokens``) or nothing is
        left. Needs an allocator with ``available_size()`` (SWA:
        ``full_available_size()`` / ``swa_available_size()``). Returns an
        ``EvictResult`` for an ``EvictParams``, the Full units evicted for an int
        (0 when enough are free already; never an error). The check and the
        eviction run under the cache's lock (other threads' frees through the
        cache cannot interleave).
        """
        alloc = self.token_to_kv_pool_allocator
        if isinstance(params, EvictParams):
            num = as_count(params.num_tokens, "params.num_tokens")
            swa_num = as_count(params.swa_num_tokens, "params.swa_num_tokens")
            mnum = as_count(params.mamba_num, "params.mamba_num")
            if alloc is None:
                raise ValueError("evict_for_alloc needs a token_to_kv_pool_allocator")
            # each freed slot raises the allocator's available size by one (a
            # cascade's collateral frees count): evicting the shortfalls reaches it
            return self.evict(EvictParams(num_tokens=num, swa_num_tokens=swa_num,
                                          mamba_num=mnum))
        num = as_count(params, "num_tokens")
        if alloc is None:
            raise ValueError("evict_for_alloc needs a token_to_kv_pool_allocator")
        with self._mutex:
            avail = alloc.full_available_size() if self._swa else alloc.available_size()
            short = num - avail
            if short <= 0:
                return 0
            return self.evict(EvictParams(num_tokens=short)).num_tokens_evicted

    def _check_component(self, component):
        c = _component(component)
        if c not in self.components:
            raise ValueError(f"component {component!r} is not configured")
        return int(c)

    # ------------------------------------------------------------------ locks
    def inc_lock_ref(self, node, skip_lock_components=()):
        """Lock ``node`` against eviction; returns the receipt (``IncLockRefResult``).

        Full locks the path root -> ``node``; with SWA, the window segment from
        ``node`` up until ``W`` tokens are covered is locked too and the receipt's
        ``component_lock_uuids[SWA]`` names its boundary (``None``: it reached the
        root); with Mamba, the node's own state is locked (not its ancestors'). ``delta``: Full units moved evictable -> protected. Locking the
        root is a no-op. ``skip_lock_components``: ComponentTypes not to lock
        (SWA, MAMBA -- a decode hold skips MAMBA; FULL cannot be skipped:
        ``ValueError``); the receipt remembers them, so a release drops exactly
        what this lock took.
        Raises ``NodeAccessError`` for a stale or never-issued id, ``TypeError``
        for a non-int id; the tree is unchanged then. O(depth).
        """
        nid = as_node_id(node, "node")
        skip = skip_lock_components
        if not (type(skip) is tuple and not skip):
            skip = self._skip_components(skip)
        if self.disable:        # nothing is ever locked; the receipt still has SGLang's shape
            if self._swa and ComponentType.SWA not in skip:
                return IncLockRefResult(0, nid, skip, {ComponentType.SWA: None})
            return IncLockRefResult(0, nid, skip)
        skip_mask = ((L.C_SWA if ComponentType.SWA in skip else 0)
                     | (L.C_MAMBA if ComponentType.MAMBA in skip else 0))
        with self._mutex:  # the arrays are read under the lock: a growth replaces them
            st, delta, boundary = self._engine.k.inc_lock_ref(nid, skip_mask)
        if st == L.E_STALE:
            raise self._stale(nid)
        if self._swa and not skip_mask & L.C_SWA:
            return IncLockRefResult(delta, nid, skip, {ComponentType.SWA: boundary or None})
        return IncLockRefResult(delta, nid, skip)

    @staticmethod
    def _skip_components(skip):
        if isinstance(skip, (str, bytes)) or not hasattr(skip, "__iter__"):
            raise TypeError("skip_lock_components must be a tuple of ComponentType, got "
                            f"{type(skip).__name__}")
        out = tuple(_component(c, "skip_lock_components") for c in skip)
        if ComponentType.FULL in out:
            raise ValueError("skip_lock_components: FULL cannot be skipped (it is the backbone)")
        return out

    def _receipt(self, nid, receipt, name="receipt"):
        """The validated receipt's ``(skip mask, SWA boundary)`` (checks only)."""
        if receipt is None:
            if self._swa or self._mamba:
                raise ReceiptError(f"{name}: {'an SWA' if self._swa else 'a Mamba'} cache needs "
                                   "the lock's receipt (the IncLockRefResult, or lock() / its "
                                   "TreeLock): it says which components the lock took")
            return 0, 0
        if not hasattr(receipt, "node_id"):
            raise TypeError(f"{name} must be the IncLockRefResult of inc_lock_ref (or its "
                            f"to_dec_params()), got {type(receipt).__name__}")
        anchor = receipt.node_id
        if anchor is not None and anchor != nid:
            raise LockRefError(f"lock receipt anchored on node {anchor} released on node {nid}")
        skipped = getattr(receipt, "skipped_lock_components", ()) or ()
        if not isinstance(skipped, (tuple, list, frozenset, set)):
            raise TypeError(f"{name}.skipped_lock_components must be a tuple of ComponentType, "
                            f"got {type(skipped).__name__}")
        if not self._swa and not self._mamba:
            if ComponentType.FULL in skipped:
                # only a Mamba cache releases a lock's Mamba part alone that way;
                # here it would release nothing (and leak the lock)
                raise TypeError(f"{name}.skipped_lock_components holds FULL: a Full-only "
                                "cache's locks always take FULL (the receipt is not one of "
                                "its locks')")
            return 0, 0
        mask = L.C_MAMBA if self._mamba and ComponentType.MAMBA in skipped else 0
        if ComponentType.FULL in skipped:
            # SGLang releases a lock's Mamba part alone with a receipt that skips
            # every other component (MambaComponent._alloc_mamba_slot)
            mask |= L.C_FULL
        if not self._swa:
            return mask, 0
        if ComponentType.SWA in skipped:
            return mask | L.C_SWA, 0
        uuids = getattr(receipt, "component_lock_uuids", None)
        if not isinstance(uuids, Mapping) or ComponentType.SWA not in uuids:
            raise ReceiptError(f"{name}.component_lock_uuids has no ComponentType.SWA entry "
                               "(the window lock's boundary)")
        boundary = uuids[ComponentType.SWA]
        if boundary is None:
            return mask, 0
        if isinstance(boundary, bool) or not isinstance(boundary, (int, np.integer)) or boundary <= 0:
            raise TypeError(f"{name}.component_lock_uuids[SWA] must be a boundary stamp (a "
                            f"positive int) or None, got {boundary!r}")
        return mask, int(boundary)

    def dec_lock_ref(self, node, receipt=None, skip_swa=False):
        """Release a lock taken by ``inc_lock_ref(node)``; returns ``DecLockRefResult``.

        ``receipt`` (the ``IncLockRefResult`` or its ``to_dec_params()``) is optional
        for Full-only caches and required with SWA (``ReceiptError``, a
        ``KeyError``, when it or its SWA entry is missing); it must be anchored on
        ``node``. The release replays exactly what the receipt locked: the SWA
        window up to its boundary unless skipped, or already released early
        (``skip_swa=True``, as ``unlock`` passes after ``release_swa``), then the
        Full path. Raises ``LockRefError`` (a ValueError) when the release would
        take a lock_ref below zero (unlock without lock, double unlock, the window
        released twice) and ``NodeAccessError`` for a stale id; the tree is
        unchanged then. ``TypeError`` for a non-int id or a malformed receipt.
        A disabled cache locked nothing: it returns at once. O(depth).
        """
        nid = as_node_id(node, "node")
        if self._plain_locks and not self.disable and skip_swa is False and (receipt is None or (
                type(receipt) in _PLAIN_RECEIPTS and receipt.node_id == nid
                and not receipt.skipped_lock_components)):
            skip_mask, boundary = 0, 0   # Full-only: what _receipt would return
        else:
            skip_swa = as_flag(skip_swa, "skip_swa") if skip_swa is not False else False
            if self.disable:        # nothing was locked (SGLang returns at once too)
                return DecLockRefResult()
            skip_mask, boundary = self._receipt(nid, receipt) if (
                receipt is not None or self._swa or self._mamba) else (0, 0)
        if skip_swa:
            skip_mask |= self._early_mask
        self._dec(nid, skip_mask, boundary)
        return DecLockRefResult()

    def _dec(self, nid, skip_mask, boundary):
        """One ``dec_lock_ref`` kernel call on a checked release; its refusal raised
        (``_dec_error``), nothing changed then."""
        with self._mutex:  # the arrays are read under the lock: a growth replaces them
            st, x = self._engine.k.dec_lock_ref(nid, skip_mask, boundary)
            if st != L.OK:
                self._dec_error(st, x, nid)

    def _dec_error(self, st, x, nid):
        """Raise what the lock kernel's refusal ``(st, x)`` of a release on ``nid`` means
        (nothing was changed). Under the cache lock."""
        if st == L.E_NOT_ANCHORED:
            slot = int(x)
            raise LockRefError(f"no lock is anchored at node {nid}: its lock_ref="
                               f"{inspection.lock_ref(self._engine, slot)} is held by "
                               "locks on its descendants (release the node that was locked)")
        if st == L.E_LOCK_UNDERFLOW:
            self._raise_underflow(int(x), nid)
        assert st == L.E_STALE, st
        raise self._stale(nid)

    def _raise_underflow(self, slot, nid, what="segment release", name=None, comp=None):
        eng = self._engine
        if comp is not None:  # the kernel says which check failed (a batch's dry run)
            comp, what = {L.FULL: ("FULL", what), L.SWA: ("SWA", what),
                          L.MAMBA: ("Mamba", "release")}[comp]
        elif inspection.lock_ref(eng, slot) <= 0:
            comp = "FULL"
        elif self._mamba and inspection.lock_ref(eng, slot, L.MAMBA) <= 0:
            comp = "Mamba"
            what = "release"
        else:
            comp = "SWA"
        where = f"{name}: " if name else ""
        raise LockRefError(f"{where}{comp} {what} hit lock_ref=0 on node {inspection.nid(eng, slot)} "
                           f"(releasing node {nid}: unlock without lock, twice, or without "
                           "skip_swa after release_swa)")

    def lock(self, node, skip_lock_components=()):
        """``inc_lock_ref`` packed as SGLang's ``TreeLock(node, receipt)`` for ``unlock``
        and ``release_swa``. Errors as ``inc_lock_ref``."""
        nid = as_node_id(node, "node")
        if (self._plain_locks and not self.disable and type(skip_lock_components) is tuple
                and not skip_lock_components):
            # Full-only: the receipt holds nothing but the node (what inc_lock_ref's
            # to_dec_params() would give), so skip building the IncLockRefResult
            with self._mutex:  # the arrays are read under the lock: a growth replaces them
                st, _, _ = self._engine.k.inc_lock_ref(nid, 0)
            if st == L.E_STALE:
                raise self._stale(nid)
            return TreeLock(nid, DecLockRefParams(nid, (), {}, {}))
        return TreeLock(nid, self.inc_lock_ref(nid, skip_lock_components).to_dec_params())

    def unlock(self, lock):
        """Release a ``TreeLock`` (``None``: no-op), SWA skipped when it was released
        early. Errors as ``dec_lock_ref``."""
        if lock is None:
            return
        if not isinstance(lock, TreeLock):
            raise TypeError(f"lock must be a flatradix.TreeLock or None, got {type(lock).__name__}")
        nid = lock.node
        if self._plain_locks and not self.disable and _plain_lock(lock):
            # Full-only, a plain receipt: what dec_lock_ref would check reduces to this
            self._dec(nid, 0, 0)
            return
        self.dec_lock_ref(nid, lock.receipt, skip_swa=lock.swa_released)

    def release_swa(self, lock):
        """Release the SWA window part of ``lock`` early, once (SGLang ``release_swa``):
        the window's nodes become SWA-evictable while the Full path stays locked;
        ``lock.swa_released`` is set and the final ``unlock`` skips SWA. A window
        node left an unlocked device leaf loses its SWA data at once. ``None``, an
        already released lock, a cache without SWA or the root: no-op (still
        marked). ``LockRefError`` when the window holds no lock any more,
        ``ReceiptError`` for a receipt without an SWA entry (one that skipped SWA);
        nothing changed then."""
        if lock is None or self.disable or lock.swa_released:
            return
        if not isinstance(lock, TreeLock):
            raise TypeError(f"lock must be a flatradix.TreeLock or None, got {type(lock).__name__}")
        nid = as_node_id(lock.node, "lock.node")
        anchor = getattr(lock.receipt, "node_id", None)
        if anchor is not None and anchor != nid:
            raise LockRefError(f"lock receipt anchored on node {anchor} released on node {nid}")
        if self._swa and nid != self._root:
            uuids = getattr(lock.receipt, "component_lock_uuids", None)
            if not isinstance(uuids, Mapping) or ComponentType.SWA not in uuids:
                raise ReceiptError("lock.receipt.component_lock_uuids has no ComponentType.SWA "
                                   "entry (the lock skipped SWA: nothing to release early)")
            skip, boundary = self._receipt(nid, lock.receipt, "lock.receipt")
            eng = self._engine
            with self._mutex:
                st, x = eng.k.release_window(nid, boundary, skip)
                if st == L.E_STALE:
                    raise self._stale(nid, "lock.node")
                if st == L.E_LOCK_UNDERFLOW:
                    self._raise_underflow(int(x), nid, "window release")
                self._executor.run(eng.actions(), eng.out)
        lock.swa_released = True

    # ------------------------------------------------------------------ batches
    def match_prefix_batch(self, params):
        """``match_prefix`` of many keys in one kernel call (flatradix extension):
        e.g. scoring a whole waiting queue for a longest-prefix-match policy.

        ``params``: a list (or tuple) of ``MatchPrefixParams`` / ``RadixKey``.
        Returns the list of ``MatchResult`` that ``[match_prefix(p) for p in
        params]`` returns, with the same effects on the tree (splits, recency), in
        order. Each result's ``device_indices`` is a view of one array shared by
        the batch. Every key is validated before anything changes (errors name
        ``params[i].key``). A batch with a ``cow_mamba`` match runs as single
        calls (a copy-on-write may evict a state before the next match).
        O(total key length).
        """
        if not isinstance(params, (list, tuple)):
            raise TypeError(f"params must be a list of MatchPrefixParams / RadixKey, got "
                            f"{type(params).__name__}")
        k = len(params)
        eng = self._engine
        get = eng.ns.get
        key_of = self._key
        parts, lens_l, nss_l = [], [], []
        cow = False
        page = self.page_size
        # the common key (plain int64 numpy tokens, default namespace) skips _key's
        # checks: what they would accept and return for it, inline
        plain_ok = not self.is_eagle
        default_ns = get((None, None))
        if default_ns is None:
            default_ns = -1
        for i, p in enumerate(params):
            if type(p) is MatchPrefixParams:
                key = p.key
                if p.cow_mamba is not False:
                    cow = (as_flag(p.cow_mamba, f"params[{i}].cow_mamba") and self._check_cow(p)
                           or cow)
            else:
                key = p
            if plain_ok and type(key) is RadixKey and key.extra_key is None and (
                    key.cache_salt is None and not key.is_bigram):
                units = key.token_ids
                if type(units) is np.ndarray and units.dtype is _I64 and units.ndim == 1:
                    n = units.shape[0]
                    n -= n % page
                    ns = default_ns if n else -1
                    lens_l.append(n if ns >= 0 else 0)
                    nss_l.append(ns)
                    parts.append(units[:n] if ns >= 0 else units[:0])
                    continue
            units, n, nk, _ = key_of(key, f"params[{i}].key")
            ns = get(nk)
            if ns is None or n == 0:
                ns, n = -1, 0
            lens_l.append(n)
            nss_l.append(ns)
            parts.append(units if n == units.shape[0] else units[:n])
        if self.disable or k == 0:
            return [self._empty_match() for _ in range(k)]
        if cow:  # a copy-on-write may evict a state between two matches: one at a time
            return [self.match_prefix(p) for p in params]
        lens = np.array(lens_l, dtype=np.int64)
        nss = np.array(nss_l, dtype=np.int64)
        offs = np.zeros(k, dtype=np.int64)
        np.cumsum(lens[:-1], out=offs[1:])
        total = int(offs[-1] + lens[-1])
        res = np.empty((k, 6), dtype=np.int64)
        with self._mutex:  # the scratch rows are the engine's: filled and read under the lock
            buf = eng.batch_buffers(total)
            keys, out = buf[0, :total], buf[1, :total]
            np.concatenate(parts, out=keys)
            _, packed = eng.k.match_prefix_batch(keys, offs, lens, nss, out, res)
            idx = out[:packed].copy()  # the packed matched indices (the scratch is reused)
        pos = np.zeros(k + 1, dtype=np.int64)
        np.cumsum(res[:, 0], out=pos[1:])
        idx = self._vals.out(idx)
        swa = self._swa
        mamba = self._mamba
        host = self._hicache
        mamba_host = host.mamba_pool_host is not None
        shosts = mhosts = None
        if host.swa_pool_host is not None or mamba_host:  # host hits, all under one lock
            with self._mutex:
                hb = res[:, 5].tolist()
                if host.swa_pool_host is not None:
                    hit = eng.k.swa_host_hit
                    shosts = [hit(h) for h in hb]
                if mamba_host:
                    mhosts = [host.mamba_host_hit(h) for h in hb]
        results = []
        for i, ((plen, best, vis, full_hit, host_hit, hbest), p0) in enumerate(
                zip(res.tolist(), pos[:-1].tolist())):
            if full_hit == 0 and plen == 0 and vis < 0:
                results.append(_tuple_new(MatchResult, (
                    idx[p0:p0], best, best, best, 0, 0, 0, None, 0, None, 0, None, None, None)))
                continue
            branch = full_hit if swa and full_hit > plen + host_hit else None
            shost = 0 if shosts is None else shosts[i]
            # the Mamba fields as match_prefix computes them (the host-only test read
            # the node after the whole batch: a later key may have changed it, as
            # SGLang's finaliser runs at each match -- only a split can, which keeps
            # the state)
            mbranch = self._mamba_branch(full_hit, plen + host_hit) if mamba else None
            mhost = mhosts[i] if mamba_host else 0
            results.append(_tuple_new(MatchResult, (
                idx[p0:p0 + plen], best, hbest, hbest, host_hit, plen, full_hit,
                None if vis < 0 else vis, shost, branch, mhost, mbranch, None, None)))
        return results

    def inc_lock_ref_batch(self, nodes, skip_lock_components=()):
        """``inc_lock_ref`` of each node of ``nodes`` (a list of NodeIds) in one kernel
        call (flatradix extension, for a batch admission); returns the receipts in
        order. Every id is checked first: a stale one raises ``NodeAccessError``
        naming ``nodes[i]`` and nothing is locked."""
        nids = self._node_ids(nodes)
        skip = skip_lock_components
        if not (type(skip) is tuple and not skip):
            skip = self._skip_components(skip)
        if self.disable:
            return [self.inc_lock_ref(int(x), skip) for x in nids]
        skip_mask = ((L.C_SWA if ComponentType.SWA in skip else 0)
                     | (L.C_MAMBA if ComponentType.MAMBA in skip else 0))
        out = np.empty((nids.shape[0], 2), dtype=np.int64)
        with self._mutex:  # the arrays are read under the lock: a growth replaces them
            st, bad = self._engine.k.inc_lock_ref_batch(nids, skip_mask, out)
        if st == L.E_STALE:
            raise self._stale(int(nids[bad]), f"nodes[{bad}]")
        swa = self._swa and not skip_mask & L.C_SWA
        return [IncLockRefResult(d, nid, skip, {ComponentType.SWA: b or None})
                if swa else IncLockRefResult(d, nid, skip)
                for nid, (d, b) in zip(nids.tolist(), out.tolist())]

    def dec_lock_ref_batch(self, nodes, receipts=None, skip_swa=False):
        """``dec_lock_ref`` of each node of ``nodes`` with its receipt (``receipts[i]``;
        optional for Full-only caches) in one kernel call (flatradix extension).
        ``skip_swa``: one bool for all, or one per node. All or nothing: every
        receipt is checked first, and a release that would fail (stale, unlock
        without lock, released twice in the batch) raises as ``dec_lock_ref``
        naming ``nodes[i]``, with the tree unchanged."""
        nids = self._node_ids(nodes)
        k = nids.shape[0]
        if receipts is not None and (not isinstance(receipts, (list, tuple)) or len(receipts) != k):
            raise TypeError(f"receipts must be a list of {k} receipts (one per node) or None")
        if isinstance(skip_swa, (list, tuple)):
            if len(skip_swa) != k:
                raise TypeError(f"skip_swa must be a bool or a list of {k} bools")
            flags = [as_flag(x, f"skip_swa[{i}]") for i, x in enumerate(skip_swa)]
        else:
            flags = [as_flag(skip_swa, "skip_swa")] * k
        if self.disable:
            return [DecLockRefResult() for _ in range(k)]
        skips = np.zeros(k, dtype=np.int64)
        bounds = np.zeros(k, dtype=np.int64)
        for i, nid in enumerate(nids.tolist()):
            r = None if receipts is None else receipts[i]
            if r is not None or self._swa or self._mamba:
                skips[i], bounds[i] = self._receipt(nid, r, f"receipts[{i}]")
            if flags[i]:
                skips[i] |= self._early_mask
        self._dec_batch(nids, skips, bounds)
        return [DecLockRefResult() for _ in range(k)]

    def _dec_batch(self, nids, skips, bounds):
        """One ``dec_lock_ref_batch`` kernel call on checked arguments (int64 arrays);
        its refusals raised as ``dec_lock_ref_batch`` documents, nothing changed."""
        with self._mutex:  # the arrays are read under the lock: a growth replaces them
            st, i, x, comp = self._engine.k.dec_lock_ref_batch(nids, skips, bounds)
            if st == L.E_NOT_ANCHORED:
                raise LockRefError(f"nodes[{i}]: no lock is anchored at node {int(nids[i])} "
                                   "(its lock_ref is held by locks on its descendants, or the batch "
                                   "released it already)")
            if st == L.E_LOCK_UNDERFLOW:
                self._raise_underflow(int(x), int(nids[i]), name=f"nodes[{i}]", comp=int(comp))
        if st == L.E_STALE:
            raise self._stale(int(nids[i]), f"nodes[{i}]")

    def lock_batch(self, nodes, skip_lock_components=()):
        """``lock`` of each node in one call: a list of ``TreeLock``."""
        nids = self._node_ids(nodes)
        if (self._plain_locks and not self.disable and type(skip_lock_components) is tuple
                and not skip_lock_components):
            # Full-only: each receipt holds nothing but its node (see ``lock``)
            out = np.empty((nids.shape[0], 2), dtype=np.int64)
            with self._mutex:  # the arrays are read under the lock: a growth replaces them
                st, bad = self._engine.k.inc_lock_ref_batch(nids, 0, out)
            if st == L.E_STALE:
                raise self._stale(int(nids[bad]), f"nodes[{bad}]")
            return [TreeLock(nid, DecLockRefParams(nid, (), {}, {})) for nid in nids.tolist()]
        return [TreeLock(nid, r.to_dec_params())
                for nid, r in zip(nids.tolist(), self.inc_lock_ref_batch(nids, skip_lock_components))]

    def unlock_batch(self, locks):
        """``unlock`` of each ``TreeLock`` in one call, all or nothing (``None``
        entries skipped); a lock released early (``release_swa``) skips its window."""
        if not isinstance(locks, (list, tuple)):
            raise TypeError(f"locks must be a list of TreeLock, got {type(locks).__name__}")
        held = [lk for lk in locks if lk is not None]
        for lk in held:
            if not isinstance(lk, TreeLock):
                raise TypeError(f"locks must hold flatradix.TreeLock, got {type(lk).__name__}")
        if not held:
            return
        if self._plain_locks and not self.disable:
            # Full-only plain receipts (as ``unlock``'s short path): no receipt work
            if all(_plain_lock(lk) for lk in held):
                zeros = np.zeros(len(held), dtype=np.int64)
                self._dec_batch(np.array([lk.node for lk in held], dtype=np.int64), zeros, zeros)
                return
        self.dec_lock_ref_batch([lk.node for lk in held], [lk.receipt for lk in held],
                                skip_swa=[lk.swa_released for lk in held])

    def _node_ids(self, nodes):
        """``nodes`` (a list / array of NodeIds) as an int64 array (``TypeError``)."""
        if isinstance(nodes, np.ndarray) and nodes.dtype == np.int64 and nodes.ndim == 1:
            return np.ascontiguousarray(nodes)
        if not isinstance(nodes, (list, tuple, np.ndarray)):
            raise TypeError(f"nodes must be a list of NodeIds, got {type(nodes).__name__}")
        if type(nodes) is list and all(type(x) is int and _NID_MIN <= x < _NID_END
                                       for x in nodes):
            return np.array(nodes, dtype=np.int64).reshape(-1)  # plain ints: one conversion
        return np.array([as_node_id(x, f"nodes[{i}]") for i, x in enumerate(nodes)],
                        dtype=np.int64).reshape(-1)

    # ------------------------------------------------------------------ sizes
    def evictable_size(self):
        """Full units held by unlocked nodes."""
        return int(self._engine.meta[L.M_EVICTABLE + L.FULL])

    def protected_size(self):
        """Full units held by locked nodes."""
        return int(self._engine.meta[L.M_PROTECTED + L.FULL])

    full_evictable_size = evictable_size
    full_protected_size = protected_size

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

    @property
    def mamba_max_states_per_path(self):
        """The per-path Mamba state cap given at construction (-1: off); read-only
        (the kernels read it from the tree's meta array)."""
        return self._path_cap

    def supports_mamba(self):
        return self._mamba

    def supports_prefix_sharing(self):
        return not self.disable

    @property
    def sliding_window_size(self):
        """The SWA retain window in tokens (None without SWA)."""
        return self._window if self._swa else None

    swa_retain_window = sliding_window_size

    # ------------------------------------------------------------------ nodes
    def root_node_handle(self, extra_key=None):
        """NodeId of the root (one root for all namespaces; a new id after ``reset()``)."""
        return self._root

    def is_root(self, node):
        """Whether ``node`` is the current root's id (False for any other int, stale or
        never issued); ``TypeError`` for a non-int."""
        try:
            return as_node_id(node) == self._root
        except NodeAccessError:  # outside int64: never issued
            return False

    def _slot(self, node, name="node"):
        nid = as_node_id(node, name)
        s = inspection.slot(self._engine, nid)
        if s < 0:
            raise self._stale(nid, name)
        return s

    def path_device_indices(self, node):
        """KV indices on the path root -> ``node`` (int64, 1-D). ``NodeAccessError`` if stale."""
        nid = as_node_id(node, "node")
        eng = self._engine
        with self._mutex:
            st, n = eng.k.path_device_indices(nid)
            if st == L.E_STALE:
                raise self._stale(nid)
            return self._vals.out(eng.out[:n].copy())

    def node_info(self, node):
        """Debug view of one node: dict of its fields (key units, value, lock_ref, ...).
        O(len(node)): copies its key and value."""
        with self._mutex:
            return inspection.node_info(self._engine, self._slot(node), as_node_id(node))

    def all_values_flatten(self):
        """Every non-root node's Full device value, concatenated in DFS order."""
        with self._mutex:
            flat = inspection.all_values_flatten(self._engine)
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
                from .kernels import check

                nid = None if slot < 0 else inspection.nid(self._engine, int(slot))
                raise CacheInvariantError(
                    f"Sanity check FAILED: code {int(code)} on node {nid} "
                    f"(see flatradix.kernels.check: {check.__doc__.split(chr(10))[0]})")
            if self._mamba:
                slots = inspection.all_mamba_values_flatten(self._engine).tolist()
                if len(set(slots)) != len(slots) or set(slots) != self._vals.mamba_owned:
                    raise CacheInvariantError(
                        "Sanity check FAILED: Mamba state slots held by two nodes, or the "
                        "tree's slots differ from the slots it is known to hold")

    def reset(self):
        """Drop the whole tree; every old node id goes stale and the root gets a new id.
        Closes any open step-wise eviction round. O(nodes).

        As SGLang's ``reset``: the tree's KV slots are not given back to the
        allocator (clear it too, as SGLang's ``flush_cache`` does), and locks held
        by running requests go stale (releasing them raises ``NodeAccessError``).
        With a host tier the host pools (Full, and SWA / Mamba) are cleared and
        pending backups / loads are dropped (their acks never come)."""
        with self._mutex:
            self._root = self._engine.reset()
            self._vals.mamba_owned.clear()
            self._hicache.clear()
            if self._sink is not None:
                self._sink.cleared()

    # ------------------------------------------------------------------ events
    def take_events(self):
        """Return and clear the queued KV events (oldest first); ``[]`` when events
        are off. Stores of chained pages and consecutive removals are merged as
        SGLang does."""
        if self._sink is None:
            return []
        with self._mutex:
            return self._sink.take()

    def block_hashes(self):
        """Event block hashes of every page cached on device (KV events on), as a set.
        What a router that applied every event so far believes is cached."""
        if self._sink is None:
            raise ValueError("block_hashes() needs enable_kv_cache_events=True")
        with self._mutex:
            return self._sink.block_hashes()

    # ------------------------------------------------------------------ tests
    def _snapshot(self):
        """Copy of the whole state, for "unchanged after an error" tests."""
        with self._mutex:
            return self._engine.snapshot()


    # the request path's inserts back nodes up too: a failed copy is raised at the end
    # of the whole call (the insert's frees, the unlock and the row release done)
    def checkpoint(self, req, up_to, *, finished=False):
        try:
            return super().checkpoint(req, up_to, finished=finished)
        finally:
            if self._hicache.on:
                self._hicache.raise_transfer_error()

    def release_kv_cache(self, req, checkpoint=True):
        try:
            return super().release_kv_cache(req, checkpoint)
        finally:
            if self._hicache.on:
                self._hicache.raise_transfer_error()

    checkpoint.__doc__ = RequestCachingMixin.checkpoint.__doc__
    release_kv_cache.__doc__ = RequestCachingMixin.release_kv_cache.__doc__


def _host_method(name):
    """The cache's public host-tier method ``name``: ``HostTier.<name>`` of its host
    tier (``cache._hicache``), with that docstring."""
    def method(self, *args, **kwargs):
        return getattr(self._hicache, name)(*args, **kwargs)

    impl = getattr(HostTier, name)
    method.__name__ = name
    method.__qualname__ = f"UnifiedRadixCache.{name}"
    method.__doc__ = impl.__doc__
    method.__wrapped__ = impl  # (inspect.signature shows the real parameters)
    return method


def _host_property(name):
    impl = getattr(HostTier, name, None)

    def get(self):
        return getattr(self._hicache, name)

    def set_(self, value):
        setattr(self._hicache, name, value)

    doc = impl.__doc__ if isinstance(impl, property) else f"The host tier's ``{name}``."
    return property(get, set_ if name == "load_back_threshold" else None, doc=doc)


for _name in HostTier.API:
    setattr(UnifiedRadixCache, _name, _host_method(_name))
for _name in HostTier.PROPERTIES:
    setattr(UnifiedRadixCache, _name, _host_property(_name))
del _name


def _plain_lock(lk):
    """Whether the ``TreeLock`` ``lk`` is one a Full-only cache's ``lock`` makes: an
    int64 node id, a ``DecLockRefParams`` receipt anchored on it that skips
    nothing, no early window release (its release then needs no receipt work)."""
    nid = lk.node
    rec = lk.receipt
    return (type(rec) is DecLockRefParams and type(nid) is int and rec.node_id == nid
            and not rec.skipped_lock_components and lk.swa_released is False
            and _NID_MIN <= nid < _NID_END)


class _NoFree:
    """A value bridge that frees nothing (step-wise eviction: the controller frees)."""

    @staticmethod
    def free(idx):
        pass


_NO_FREE = _NoFree()
