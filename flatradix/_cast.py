"""Validate and cast inputs once, at the façade boundary.

Kernels see only C-contiguous, writable int64 arrays (one Numba specialisation
each); anything else is rejected here with a ``TypeError`` / ``ValueError``
naming the argument, before any state changes.
"""

from array import array
import operator

import numpy as np

from .errors import NodeAccessError

_INT_KINDS = "iu"
_I64 = np.dtype(np.int64)
_MAX_BIGRAM_TOKEN = 1 << 31


def is_torch(x):
    return type(x).__module__.startswith("torch")


def _to_numpy(x, name):
    """A 1-D integer numpy view or copy of ``x`` (list, array('q'), numpy, torch)."""
    if isinstance(x, np.ndarray):
        a = x
    elif is_torch(x):
        t = x.detach()
        if t.is_cuda:
            t = t.cpu()  # one device->host copy (see docs/architecture.md: CUDA)
        if t.dtype.is_floating_point or t.dtype.is_complex or str(t.dtype) == "torch.bool":
            raise TypeError(f"{name} must hold integers, got torch dtype {t.dtype}")
        if str(t.dtype) not in ("torch.int32", "torch.int64"):
            # a narrower index (int8 / int16 / uint8...) is no KV index or token id
            raise TypeError(f"{name} must be a torch int32 or int64 tensor, got {t.dtype}")
        a = t.contiguous().numpy()
    elif isinstance(x, array):
        if x.typecode not in "bBhHiIlLqQ":
            raise TypeError(f"{name} must hold integers, got array('{x.typecode}')")
        a = np.frombuffer(x, dtype=np.dtype(x.typecode)) if len(x) else np.empty(0, np.int64)
    elif isinstance(x, (list, tuple, range)):
        if not len(x):
            return np.empty(0, np.int64)
        if type(x[0]) is not bool:
            # fast path: array('q') converts through __index__ in C (~25 % faster
            # than numpy's inference) and refuses exactly what is refused below
            # (floats, strings, nesting: TypeError; beyond int64: OverflowError);
            # a refusal falls through for the precise message
            try:
                return np.frombuffer(array("q", x), dtype=_I64)
            except (TypeError, OverflowError):
                pass
        # numpy infers the dtype in C (a per-element isinstance check in Python cost
        # ~5x more): Python ints give int64 (uint64 / object beyond), and anything
        # else gives a dtype refused below, so no float is ever truncated. All-bool
        # lists are refused; a bool among ints is an int (Python's bool is an int
        # subclass, and SGLang's cores take it as 0/1), so it counts as 0/1.
        try:
            a = np.asarray(x)
        except (ValueError, TypeError) as e:  # ragged nesting
            raise ValueError(f"{name} must be 1-D integer sequence: {e}") from None
        if a.dtype.kind == "O":
            if a.ndim == 1 and all(type(v) is int for v in x):
                raise ValueError(f"{name}: integer out of int64 range")
            raise TypeError(f"{name} must hold integers")
        if a.dtype.kind not in _INT_KINDS:
            if a.dtype.kind == "f" and a.ndim == 1 and all(
                    isinstance(v, (int, np.integer)) for v in x):
                # ints beyond int64 mixed with small ones: numpy falls back to float64
                raise ValueError(f"{name}: integer out of int64 range")
            raise TypeError(f"{name} must hold integers, got {'bools' if a.dtype.kind == 'b' else a.dtype}")
    else:
        raise TypeError(f"{name} must be a 1-D integer sequence (list, array('q'), numpy "
                        f"array or torch tensor), got {type(x).__name__}")
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if a.dtype.kind not in _INT_KINDS:
        raise TypeError(f"{name} must hold integers, got dtype {a.dtype}")
    if a.dtype.kind == "u" and a.dtype.itemsize == 8 and a.size and a.max() > np.iinfo(np.int64).max:
        raise ValueError(f"{name}: integer out of int64 range")
    return a


def as_int64(x, name):
    """``x`` as a C-contiguous, writable int64 1-D array (copies only when needed)."""
    if type(x) is np.ndarray and x.dtype is _I64 and x.ndim == 1:
        flags = x.flags
        if flags.c_contiguous and flags.writeable:
            return x
    a = _to_numpy(x, name)
    if a.dtype != np.int64 or not a.flags.c_contiguous or not a.flags.writeable:
        a = np.array(a, dtype=np.int64, order="C")
    return a


def key_units(key, bigram_tree, name="key"):
    """Logical units of ``key`` as int64.

    Plain keys: the token ids. Bigram keys (or any key of an EAGLE cache): unit
    ``i`` packs the pair ``(t[i], t[i+1])`` as ``t[i] << 32 | t[i+1]``; tokens must
    lie in ``[0, 2**31)`` for that.
    """
    toks = key.token_ids
    if type(toks) is np.ndarray and toks.dtype is _I64 and toks.ndim == 1 and not (
            key.is_bigram or bigram_tree):
        flags = toks.flags  # fast path: already what the kernels take
        if flags.c_contiguous and flags.writeable:
            return toks, toks
    toks = _to_numpy(toks, f"{name}.token_ids")
    if not (key.is_bigram or bigram_tree):
        if toks.dtype != np.int64 or not toks.flags.c_contiguous or not toks.flags.writeable:
            toks = np.array(toks, dtype=np.int64, order="C")
        return toks, toks
    t = toks.astype(np.int64)
    if t.size and (t.min() < 0 or t.max() >= _MAX_BIGRAM_TOKEN):
        raise ValueError(f"{name}.token_ids: bigram tokens must lie in [0, 2**31)")
    if t.size < 2:
        return np.empty(0, np.int64), t
    return (t[:-1] << 32) | t[1:], t


def as_count(x, name):
    """A non-negative Python int (bool and floats are refused)."""
    if type(x) is int and x >= 0:  # the common case, first
        return x
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    x = int(x)
    if x < 0:
        raise ValueError(f"{name} must be >= 0, got {x}")
    return x


def as_int(x, name):
    """A Python int in [-2**62, 2**62) (bool and floats are refused)."""
    if type(x) is int and -(1 << 62) <= x < (1 << 62):  # the common case, first
        return x
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    x = int(x)
    if not -(1 << 62) <= x < (1 << 62):
        raise ValueError(f"{name} out of range: {x}")
    return x


def as_flag(x, name):
    """A bool (``bool``, ``numpy.bool_`` or the ints 0 / 1); anything else is a TypeError
    (``"no"`` or ``None`` would otherwise be read as a truth value)."""
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)) and x in (0, 1):
        return bool(x)
    raise TypeError(f"{name} must be a bool, got {type(x).__name__} {x!r}")


_NID_MIN = -(1 << 63)
_NID_END = 1 << 63


def as_node_id(x, name="node"):
    """A node id: an int (NodeId, or anything with ``__index__``); bool and other
    objects are a ``TypeError``. An int outside int64 was never issued:
    ``NodeAccessError`` (a ``KeyError``), as for any other never-issued id."""
    if type(x) is int and _NID_MIN <= x < _NID_END:  # the common case, first
        return x
    if isinstance(x, bool):
        raise TypeError(f"{name} must be a NodeId (int), got bool")
    try:
        v = operator.index(x)
    except TypeError:
        raise TypeError(f"{name} must be a NodeId (int), got {type(x).__name__}") from None
    if not _NID_MIN <= v < _NID_END:
        raise NodeAccessError(f"{name}: node id {v} does not name a live node (never issued: "
                              "node ids are int64)")
    return v
