"""The constructor arguments of ``UnifiedRadixCache``: their checks, defaults and limits.

``validate`` checks every argument before anything is built (``TypeError`` /
``ValueError`` naming it) and sets the cache's configuration attributes
(``page_size``, ``components``, ``eviction_policy``, the SWA window, the Mamba
settings); the cache then builds its engine from them. The limits below are
public (tests and users size against them).
"""

import math
from collections.abc import Mapping

import numpy as np

from ._cast import as_count, as_flag, as_int, is_torch
from .kernels import layout as L
from .types import ComponentType
from .values import is_swa_allocator

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
FULL_ONLY = (ComponentType.FULL,)
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


def validate(cache, page_size, components, eviction_policy, token_to_kv_pool_allocator,
             req_to_token_pool, device, is_eagle, eviction_policy_config, disable,
             node_capacity, pool_capacity, kv_event_lora_names, tree_components,
             sliding_window_size, mamba_cache_chunk_size, enable_mamba_extra_buffer,
             mamba_max_states_per_path, enable_mamba_extra_buffer_lazy):
    """Check ``UnifiedRadixCache``'s arguments (its docstring says what is accepted)
    and set ``cache``'s configuration attributes. Returns the initial ``(node
    capacity, pool capacity, KV-event LoRA names)``."""
    if isinstance(page_size, bool) or not isinstance(page_size, (int, np.integer)):
        raise TypeError(f"page_size must be an int, got {type(page_size).__name__}")
    cache.page_size = int(page_size)
    if not 1 <= cache.page_size <= MAX_PAGE_SIZE:
        raise ValueError(f"page_size must be in [1, {MAX_PAGE_SIZE}], got {cache.page_size}")
    if tree_components is not None:
        if components is not FULL_ONLY and _components(components) != _components(
                tree_components):
            raise ValueError("components and tree_components disagree (give one of them)")
        components = tree_components
    comps = _components(components)
    if comps not in _COMPONENT_SETS:
        raise ValueError(f"components must be (FULL,), (FULL, SWA), (FULL, MAMBA) or "
                         f"(FULL, SWA, MAMBA), got {comps}")
    cache.components = comps
    cache._swa = ComponentType.SWA in comps
    if cache._swa:
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
        alloc_page = getattr(token_to_kv_pool_allocator, "page_size", cache.page_size)
        if alloc_page != cache.page_size:
            raise ValueError(f"token_to_kv_pool_allocator.page_size={alloc_page} differs from "
                             f"page_size={cache.page_size}")
    elif sliding_window_size is not None:
        raise ValueError("sliding_window_size given, but components has no ComponentType.SWA")
    cache._window = int(sliding_window_size) if cache._swa else 0
    cache._mamba = ComponentType.MAMBA in comps
    chunk = as_int(mamba_cache_chunk_size, "mamba_cache_chunk_size")
    if chunk < 1:
        raise ValueError(f"mamba_cache_chunk_size must be >= 1, got {chunk}")
    extra = as_flag(enable_mamba_extra_buffer, "enable_mamba_extra_buffer")
    lazy = as_flag(enable_mamba_extra_buffer_lazy, "enable_mamba_extra_buffer_lazy")
    if lazy and not (cache._mamba and extra):
        raise ValueError("enable_mamba_extra_buffer_lazy needs ComponentType.MAMBA and "
                         "enable_mamba_extra_buffer=True (it is the extra buffer's lazy "
                         "variant)")
    path_cap = as_int(mamba_max_states_per_path, "mamba_max_states_per_path")
    if path_cap == 0 or path_cap < -1:
        raise ValueError("mamba_max_states_per_path must be -1 (unlimited) or >= 1, got "
                         f"{path_cap}")
    if path_cap != -1 and not cache._mamba:
        raise ValueError(f"mamba_max_states_per_path={path_cap} given, but components has "
                         "no ComponentType.MAMBA")
    disable_flag = as_flag(disable, "disable")
    if cache._mamba:
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
        if not extra and cache.page_size != 1 and not disable_flag:
            raise ValueError(f"page_size={cache.page_size}: a Mamba cache without "
                             "enable_mamba_extra_buffer caches only sequence-end states and "
                             "needs page_size=1 (SGLang's rule)")
    #: What a lock's early SWA release also released (SGLang: SWA and every
    #: component of lower internal priority, i.e. Mamba), skipped by the final unlock.
    cache._early_mask = L.C_SWA | (L.C_MAMBA if cache._mamba and cache._swa else 0)
    cache.mamba_cache_chunk_size = chunk
    cache.enable_mamba_extra_buffer = extra
    cache.enable_mamba_extra_buffer_lazy = lazy
    cache._path_cap = path_cap
    #: The grid a branching Mamba checkpoint lands on (tokens).
    cache.mamba_checkpoint_grid = chunk * cache.page_size // math.gcd(chunk, cache.page_size)
    if not isinstance(eviction_policy, str) or eviction_policy.lower() not in L.POLICY_NAMES:
        raise ValueError(f"eviction_policy must be one of {', '.join(L.POLICY_NAMES)}; "
                         f"got {eviction_policy!r}")
    cache.eviction_policy = eviction_policy.lower()
    if eviction_policy_config is not None and not isinstance(eviction_policy_config, Mapping):
        raise TypeError(f"eviction_policy_config must be a dict or None, got "
                        f"{type(eviction_policy_config).__name__}")
    cache._policy_cfg = _policy_config(cache.eviction_policy, eviction_policy_config or {})
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
    return ncap, pcap, kv_event_lora_names
