"""Central JIT options: every kernel module decorates through these, never by hand.

``kernel``: an entry kernel (cached, GIL held: short calls must not release the
GIL, see ``docs/architecture.md`` "The GIL"), called only through the engine
(``flatradix.engine.Engine.k``). ``helper``: an njit->njit helper (cached too;
njit-to-njit calls cost nothing).

An entry kernel's *calling convention* is read from its parameter names: the
leading ones among ``STATE`` (the tree arrays, ``engine.TreeArrays``) are the
engine's arrays, passed by the engine in that order; ``scratch`` names the
trailing engine scratch arrays (``"out"``, ``"acts"``) the engine passes after
the caller's arguments; ``on_capacity`` says what an ``E_CAPACITY`` status means:
``"retry"`` (nothing changed: the engine grows what ``meta[M_NEED_*]`` asks for and
calls again, so the caller never sees it), ``"resume"`` (the call made progress and
stopped: the caller executes its actions, calls ``Engine.grow()`` and calls again)
or None (never answered). Every entry kernel is recorded in ``KERNELS`` and its
convention in ``SPECS`` (``tests/test_specialisation.py`` checks that a whole
workload compiles each of them exactly once: no silent re-specialisation costing
cold-start time).
"""

import functools
import inspect
from typing import NamedTuple

from numba import njit, types

_plain_njit = functools.partial(njit, cache=True, nogil=False)
#: every helper dispatcher (``tests/test_specialisation.py``: none compiles a
#: literal-argument specialisation)
HELPERS = []


def _one_signature_per_type(dispatcher):
    """Have calls from jitted code compile ``dispatcher`` for the non-literal
    argument types: Numba types a constant argument (``emit(acts, meta, A_FREE_KV,
    ...)``) as ``Literal[int](1)`` and would compile one specialisation per
    distinct combination of constants (``emit`` 17-20 times, 74-109 literal
    specialisations, 17-23 s of a first replay's compile: ``docs/compile_time.md``).
    With this each helper compiles once per non-literal signature; LLVM still
    inlines the call and folds the constants, so the machine code is the same."""
    typed = dispatcher.get_call_template

    def get_call_template(args, kws):
        return typed(tuple(types.unliteral(a) for a in args),
                     {k: types.unliteral(v) for k, v in kws.items()})

    dispatcher.get_call_template = get_call_template
    return dispatcher


def _njit(fn):
    return _one_signature_per_type(_plain_njit(fn))

KERNELS = []
#: The tree arrays an entry kernel may take first, in this order.
STATE = ("nodes", "ctab", "pool", "heap", "meta")
#: The engine scratch arrays an entry kernel may take last, in this order.
SCRATCH = ("out", "acts")
ON_CAPACITY = (None, "retry", "resume")


class Spec(NamedTuple):
    """An entry kernel's calling convention (see the module docstring)."""

    name: str
    state: tuple
    scratch: tuple
    on_capacity: object
    engine_only: bool


#: dispatcher -> Spec
SPECS = {}


def kernel(fn=None, *, scratch=(), on_capacity=None, engine_only=False):
    """Compile ``fn`` as an entry kernel (``@kernel`` or ``@kernel(scratch=...,
    on_capacity=...)``). ``engine_only``: the engine calls it itself, on arrays it
    is building (growth, reset): not in ``Engine.k``."""
    if fn is None:
        return functools.partial(kernel, scratch=scratch, on_capacity=on_capacity,
                                 engine_only=engine_only)
    if isinstance(scratch, str):
        scratch = (scratch,)
    params = list(inspect.signature(fn).parameters)
    state = []
    for p in params:
        if p not in STATE:
            break
        state.append(p)
    if tuple(state) != tuple(s for s in STATE if s in state):
        raise TypeError(f"{fn.__name__}: the tree arrays must come first, in the order {STATE}")
    if tuple(scratch) != tuple(s for s in SCRATCH if s in scratch) or (
            scratch and tuple(params[-len(scratch):]) != tuple(scratch)):
        raise TypeError(f"{fn.__name__}: scratch {scratch} must be its last parameters, in the "
                        f"order {SCRATCH}")
    if on_capacity not in ON_CAPACITY:
        raise ValueError(f"on_capacity must be one of {ON_CAPACITY}")
    k = _njit(fn)
    KERNELS.append(k)
    SPECS[k] = Spec(fn.__name__, tuple(state), tuple(scratch), on_capacity, engine_only)
    return k


def helper(fn):
    """Compile ``fn`` as an njit helper (cached, one specialisation per non-literal
    signature: ``_one_signature_per_type``)."""
    d = _njit(fn)
    HELPERS.append(d)
    return d
