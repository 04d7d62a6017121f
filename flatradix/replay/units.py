"""Token counts: parsing a capacity (``2M``, ``2,000,000``, ``inf``) and writing
counts for people (``2M``, ``1,234``, ``3 states``)."""

import math
import re

_SUFFIX = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}

#: Largest capacity in tokens: the largest pool flatradix allocates (2**40 slots).
MAX_CAPACITY = 1 << 40


class CapacityTooLarge(ValueError):
    """A capacity above :data:`MAX_CAPACITY` (the ``ValueError`` ``parse_capacity``
    raises for it, so a caller can word it for its own unit)."""


def parse_capacity(text):
    """``"inf"`` -> ``None``; ``"2000000"``, ``"2,000,000"``, ``"2M"``, ``"500k"``, ``"1.5G"``,
    ``"2e6"`` -> int tokens.

    Raises ``ValueError`` for anything else (a comma that does not group
    thousands, ``"5,6"``, included), a capacity below 1, or one above
    :data:`MAX_CAPACITY` (2**40 tokens; ``inf`` is the way to say unbounded;
    :class:`CapacityTooLarge`, a ``ValueError``).
    """
    s = str(text).strip().lower().replace("_", "")
    if "," in s:
        # a comma only groups thousands (2,000,000); anything else is a list typed
        # into a one-value option ("5,6" is not 56)
        if not re.fullmatch(r"[1-9]\d{0,2}(,\d{3})+(\.\d*)?[kmgt]?", s):
            raise ValueError(f"capacity takes one value (a comma only groups thousands, "
                             f"as in 2,000,000), got {text!r}")
        s = s.replace(",", "")
    if s in ("inf", "infinity", "unbounded", "none"):
        return None
    mult = 1
    if s and s[-1] in _SUFFIX:
        mult = _SUFFIX[s[-1]]
        s = s[:-1]
    try:
        v = float(s) * mult
    except ValueError:
        raise ValueError(f"capacity must be a token count (e.g. 2000000, 2M, 500k) or 'inf', "
                         f"got {text!r}") from None
    if not math.isfinite(v) or v != int(v) or v < 1:
        raise ValueError(f"capacity must be a whole number of tokens >= 1 or 'inf', got {text!r}")
    if v > MAX_CAPACITY:
        raise CapacityTooLarge(f"capacity {text!r} is more than the largest pool "
                         f"({MAX_CAPACITY:,} tokens); 'inf' is unbounded")
    return int(v)


def _n(x):
    return f"{x:,}"


def _count(n, word, plural=None):
    """``1, "state"`` -> ``"1 state"``; ``2, "state"`` -> ``"2 states"``."""
    return f"{n:,} {word if n == 1 else (plural or word + 's')}"


def format_tokens(n):
    """``2000000`` -> ``"2M"``, ``65536`` -> ``"65.5k"`` (3 significant digits)."""
    for unit, size in (("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:g}"
