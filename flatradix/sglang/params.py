"""What the ``flatradix`` TreeCore shares across its modules: SGLang's component
names and flatradix's bits for them, the construction checks (``check_params``:
every configuration it does not serve is refused before anything is built) and
the conversions of SGLang's keys and value tensors to the kernels' int64 arrays.
"""

from __future__ import annotations

from array import array

import numpy as np
import torch

from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

from ..kernels import layout as L

FULL, SWA, MAMBA = ComponentType.FULL, ComponentType.SWA, ComponentType.MAMBA
_SERVED = (FULL, SWA, MAMBA)
_BIT = {FULL: L.C_FULL, SWA: L.C_SWA, MAMBA: L.C_MAMBA}
_CT = {L.FULL: FULL, L.SWA: SWA, L.MAMBA: MAMBA}
#: Pool rows reserved per Full KV slot of the allocator (as flatradix's cache).
_POOL_ROWS_PER_SLOT = 2
_POOL_MIN, _POOL_AUTO_MAX = 1 << 16, 1 << 23
_SLOT_MASK = 0xFFFFFFFF
_tuple_new = tuple.__new__
#: ``FLAGS`` presence bit of (component, tier), as ``layout.F_HAS`` computes it
_F_HAS = tuple((L.F_HAS(c, L.DEVICE), L.F_HAS(c, L.HOST)) for c in range(L.N_COMPONENTS))
_EMPTY = np.empty(0, dtype=np.int64)


# ---------------------------------------------------------------- construction
def check_params(params):
    """Refuse, with a ``ValueError`` naming the option, every configuration this
    TreeCore does not serve (before anything is built). Returns the engine's
    policy ``(index, a, b)``."""
    from sglang.srt.mem_cache.utils import get_eviction_strategy

    comps = tuple(params.tree_components or ())
    if not comps or comps[0] != FULL or len(set(comps)) != len(comps) or not set(comps) <= set(
            _SERVED):
        raise ValueError(
            "the flatradix TreeCore serves tree_components (FULL,), (FULL, SWA), (FULL, MAMBA) "
            f"and (FULL, SWA, MAMBA); got {comps}")
    # a disabled cache never reaches its tree: its components' classes do not matter
    if params.component_registry_override and not params.disable:
        raise ValueError("the flatradix TreeCore does not serve component_registry_override "
                         "(custom components): its component rules are its kernels")
    if params.enable_session_radix_cache:
        raise ValueError("the flatradix TreeCore does not serve --enable-session-radix-cache "
                         "(session-aware caching); use the python TreeCore")
    if SWA in comps:
        if params.sliding_window_size is None or params.sliding_window_size <= 0:
            raise ValueError("the SWA tree component requires a positive sliding_window_size")
        if not params.swa_gates_prefix_match:
            raise ValueError("the flatradix TreeCore serves SWA only where tree nodes own the "
                             "SWA state (swa_gates_prefix_match=True), not a per-request SWA "
                             "ring")
        alloc = params.token_to_kv_pool_allocator
        try:
            from sglang.srt.mem_cache.allocator.unified_hybrid_swa import (
                UnifiedSWAAllocatorBase,
            )
        except ImportError:  # pragma: no cover - the allocator module moved
            UnifiedSWAAllocatorBase = ()
        if UnifiedSWAAllocatorBase and isinstance(alloc, UnifiedSWAAllocatorBase):
            raise ValueError("the flatradix TreeCore does not serve the unified SWA allocator "
                             f"({type(alloc).__name__}): its SWA values are the static "
                             "allocator's full->swa mapping")
    # SGLang's own validation of the policy and its options (same errors as its cores)
    strategy = get_eviction_strategy(params.eviction_policy, params.eviction_policy_config)
    name = params.eviction_policy.lower()
    if name not in L.POLICY_NAMES:
        raise ValueError(f"the flatradix TreeCore does not serve eviction_policy {name!r} "
                         f"(it serves {', '.join(L.POLICY_NAMES)})")
    a = b = 0
    if name == "slru":
        a = int(getattr(strategy, "protected_threshold", 2))
    elif name == "tlru":
        a, b = strategy.threshold, strategy.next_prompt_estimate
        if not all(type(v) is int for v in (a, b)):
            raise ValueError("the flatradix TreeCore serves T-LRU with integer threshold and "
                             "next_prompt_estimate only")
    return L.POLICY_NAMES.index(name), a, b


def _pool_capacity(alloc):
    size = None
    for name in ("size_full", "size"):
        try:
            size = getattr(alloc, name, None)
        except Exception:  # an allocator's failing property: its business
            size = None
        if size is not None:
            break
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size <= 0:
        return _POOL_MIN
    return int(min(max(_POOL_ROWS_PER_SLOT * int(size), _POOL_MIN), _POOL_AUTO_MAX))


def _units_of(key, bigram):
    """``(units, n)`` of an SGLang ``RadixKey`` (honouring its ``limit``): int64
    token ids, or (bigram keys, EAGLE trees) pairs packed ``t[i] << 32 | t[i+1]``
    as flatradix's kernels take them; ``n`` is the unit count."""
    raw = key.raw_token_ids()
    if isinstance(raw, array) and raw.typecode == "q":
        toks = np.frombuffer(raw, dtype=np.int64) if len(raw) else _EMPTY
    else:
        toks = np.asarray(raw, dtype=np.int64)
    if bigram:
        if toks.shape[0] < 2:
            return _EMPTY, 0
        if int(toks.min()) < 0 or int(toks.max()) >= 1 << 31:
            raise ValueError("key.token_ids: bigram tokens must lie in [0, 2**31) in a "
                             "flatradix tree")
        units = (toks[:-1] << 32) | toks[1:]
        return units, units.shape[0]
    if not toks.flags.writeable or not toks.flags.c_contiguous:
        toks = np.ascontiguousarray(toks).copy()
    return toks, toks.shape[0]


def _np_values(value, name, copy=True):
    """The values of a value tensor (any device) as int64 numpy: a copy, or with
    ``copy=False`` a view when the tensor is a contiguous CPU int64 one (the
    kernels only read it, and what the core keeps or returns is copied)."""
    if isinstance(value, torch.Tensor):
        a = value.detach().to("cpu", torch.int64).numpy()
        return a.copy() if copy or not a.flags.c_contiguous or not a.flags.writeable else a
    return np.array(value, dtype=np.int64)


def _adopt(adopted, ct, start, end):
    if start >= end:
        return
    ranges = adopted.setdefault(ct, [])
    if ranges and start <= ranges[-1][1]:
        lo, hi = ranges[-1]
        ranges[-1] = (min(lo, start), max(hi, end))
    else:
        ranges.append((start, end))
