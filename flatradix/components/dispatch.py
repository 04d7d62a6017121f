"""The one dispatch module: the tree core reaches the auxiliary components' rules here.

``COMPONENTS`` names the auxiliary components' modules in order (Full is the
backbone: the core calls ``components/full.py`` itself, on every path). Each hook below is a
stub the core calls from its kernels; at compile time it becomes a chain over
the components of ``COMPONENTS`` that define a rule of that name, each guarded
by the component's bit in ``meta[M_COMPONENTS]`` (and, for the lock hooks, not
in ``skip``): a rule has the same signature in every component (the stub's),
so adding a component is its own module, its columns in ``kernels/layout.py``
and one entry in ``COMPONENTS``. A component module defines ``ID`` (its
``ComponentType`` value) and ``BIT`` (``1 << ID``).

How a chain combines what its rules return (``hook(mode=...)``):

=========  =================================================================
``void``   nothing returned
``sum``    the sum (units or states freed)
``and``    the bitwise and, from ``init`` (validation bits)
``or``     true when any rule answers true
``stamp``  the last non-zero answer (a lock's boundary stamp: one component
           issues them)
``first``  the first non-zero answer (a split request: the core splits there,
           then asks again)
``min``    the smallest answer, from ``init`` (a parameter name)
``sum3``   the sums of answers that are triples (room an operation needs)
``check``  ``(status, x)``: the first answer whose status is not ``OK``, else
           ``(OK, -1)`` (a release checked before any change)
``pick``   the rule of component ``c`` (the stub's first parameter) only, or
           ``init`` when it has none (a step of that component's eviction walk)
=========  =================================================================

``reverse=True`` runs the chain last component first (releases undo locks in
reverse). The chains are built by ``numba.extending.overload`` when a kernel
calling the stub is compiled, and cached with that kernel: a component's rule
is compiled only into the kernels whose hook it defines.

A Full-only cache compiles no auxiliary component (``docs/compile_time.md``):
a chain is chosen from the *type* of ``meta``, which the engine makes tell
whether the tree may hold auxiliary components (:func:`meta_array`): a
C-contiguous ``meta`` (Full only) gets the empty chain, so Numba never types an
SWA or Mamba rule (a branch on ``meta[M_COMPONENTS]`` alone would still be
compiled, ~16 s of a first Full-only run); a strided ``meta`` (``'A'`` layout:
components configured) gets the chain over every component, each guarded by its
bit at run time. The ``always`` hooks (the sanity check: a component not
configured must hold nothing) get the full chain from either.
"""

import importlib
import inspect

import numpy as np
from numba.extending import overload

from ..kernels.layout import C_FULL, FULL, M_COMPONENTS, META_LEN, OK

#: The auxiliary components' modules (``flatradix.components.<name>``), in order
#: (SGLang's ``tree_components`` order after FULL): one entry per component.
COMPONENTS = ("swa", "mamba")
_MODULES = tuple(importlib.import_module(f"{__package__}.{name}") for name in COMPONENTS)
#: SGLang's ``eviction_priority(is_leaf=False)`` per component id, for Python callers
#: (an adapter's cascade check; the kernels ask the ``priority`` hook): Full, the
#: backbone, 2; a component without ``PRIORITY_INTERNAL`` 0.
PRIORITY_INTERNAL = {FULL: 2, **{m.ID: getattr(m, "PRIORITY_INTERNAL", 0) for m in _MODULES}}

def meta_array(components):
    """A zeroed ``meta`` array (int64 ``(META_LEN,)``) for a tree with the component
    bits ``components``: C-contiguous when Full only, else a strided view (every
    other entry of a buffer twice as long; Numba types it as an ``'A'``-layout
    array): the hooks compile the auxiliary components' rules only for the
    latter (module docstring). The engine is the only maker of ``meta``."""
    if components == C_FULL:
        return np.zeros(META_LEN, dtype=np.int64)
    return np.zeros(2 * META_LEN, dtype=np.int64)[::2]


def may_hold_components(meta_type):
    """Whether a kernel typed with ``meta`` of Numba type ``meta_type`` may meet
    auxiliary components (:func:`meta_array`'s strided ``meta``)."""
    return getattr(meta_type, "layout", "C") != "C"


_MODES = ("void", "sum", "and", "or", "stamp", "first", "min", "sum3", "check", "pick")


def _chain_source(name, params, mods, mode, init, skip, always=False):
    args = ", ".join(params)
    call_args = ", ".join(params[1:] if mode == "pick" else params)
    lines = [f"def impl({args}):", f"    comps = meta[{M_COMPONENTS}]"]
    if mode in ("sum", "stamp"):
        lines.append("    r = 0")
    elif mode in ("and", "min"):
        lines.append(f"    r = {init}")
    elif mode == "sum3":
        lines.append("    r0 = 0")
        lines.append("    r1 = 0")
        lines.append("    r2 = 0")
    elif mode == "or":
        lines.append("    r = False")
    for i, m in enumerate(mods):
        cond = "True" if always else (
            f"comps & {m.BIT}" + (f" and not skip & {m.BIT}" if skip else ""))
        if mode == "pick":
            cond = f"{params[0]} == {m.ID}"
        lines.append(f"    if {cond}:")
        call = f"F{i}({call_args})"
        if mode == "void":
            lines.append(f"        {call}")
        elif mode == "sum":
            lines.append(f"        r += {call}")
        elif mode == "and":
            lines.append(f"        r &= {call}")
        elif mode == "or":
            lines.append(f"        if {call}:")
            lines.append("            r = True")
        elif mode == "stamp":
            lines.append(f"        x = {call}")
            lines.append("        if x != 0:")
            lines.append("            r = x")
        elif mode == "first":
            lines.append(f"        x = {call}")
            lines.append("        if x != 0:")
            lines.append("            return x")
        elif mode == "min":
            lines.append(f"        x = {call}")
            lines.append("        if x < r:")
            lines.append("            r = x")
        elif mode == "sum3":
            lines.append(f"        a, b, c = {call}")
            lines.append("        r0 += a")
            lines.append("        r1 += b")
            lines.append("        r2 += c")
        elif mode == "check":
            lines.append(f"        st, x = {call}")
            lines.append(f"        if st != {OK}:")
            lines.append("            return st, x")
        elif mode == "pick":
            lines.append(f"        return {call}")
    if mode == "void":
        lines.append("    return")
    elif mode == "first":
        lines.append("    return 0")
    elif mode == "sum3":
        lines.append("    return r0, r1, r2")
    elif mode == "check":
        lines.append(f"    return {OK}, -1")
    elif mode == "pick":
        lines.append(f"    return {init}")
    else:
        lines.append("    return r")
    return "\n".join(lines) + "\n"


def hook(mode="void", reverse=False, skip=False, init=0, rule=None, always=False):
    """Make the stub below a dispatch hook (see the module docstring); ``rule``: the
    components' rule it calls (default: the stub's name); ``always``: every rule
    runs, configured or not (a check that a component not configured holds nothing)."""
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}")

    def deco(stub):
        name = rule or stub.__name__
        params = list(inspect.signature(stub).parameters)
        if "meta" not in params or (skip and "skip" not in params):
            raise TypeError(f"hook {stub.__name__}: its parameters must include meta"
                            + (" and skip" if skip else ""))
        order = tuple(reversed(_MODULES)) if reverse else _MODULES
        mods = [m for m in order if hasattr(m, name)]
        for m in mods:
            got = list(inspect.signature(getattr(m, name).py_func).parameters)
            want = params[1:] if mode == "pick" else params
            if got != want:
                raise TypeError(f"{m.__name__}.{name}{tuple(got)}: a hook's rule takes the "
                                f"hook's parameters {tuple(want)}")
        src = _chain_source(name, params, mods, mode, init, skip, always)
        env = {f"F{i}": getattr(m, name) for i, m in enumerate(mods)}
        exec(compile(src, f"<dispatch.{name}>", "exec"), env)
        impl = env["impl"]
        bare = impl
        if not always:      # the Full-only chain: no rule at all
            bare_env = {}
            exec(compile(_chain_source(name, params, [], mode, init, skip),
                         f"<dispatch.{name}.full_only>", "exec"), bare_env)
            bare = bare_env["impl"]
        typer_env = {"impl": impl, "bare": bare, "aux": may_hold_components}
        exec(f"def typer({', '.join(params)}):\n    return impl if aux(meta) else bare\n",
             typer_env)
        overload(stub)(typer_env["typer"])
        stub.chain_source = src  # for readers and tests: what the chain compiles to
        return stub

    return deco


# ---------------------------------------------------------------- match
@hook()
def walk_begin(meta):
    """A match walk starts: reset the component's validator state (kept in
    ``meta[M_WALK_ACC + 2 * ID]`` / ``+ 1``: device / host walk)."""


@hook("and", init=3)
def validate(nodes, meta, s, host_on):
    """SGLang's ``create_match_validator`` at walked node ``s``: bit 1 when ``s``
    is valid on the device, bit 2 when valid on either tier (``host_on``: the host
    tier is on; else bit 2 equals bit 1)."""


@hook()
def match_end(nodes, meta, s):
    """SGLang's ``refresh_lru(MATCH_END)`` of the match's best node ``s``."""


@hook()
def insert_end(nodes, meta, s):
    """SGLang's ``refresh_lru(INSERT_END)`` of the insert's target ``s`` (not the root)."""


# ---------------------------------------------------------------- structure
@hook()
def split(nodes, pool, meta, u, child):
    """SGLang's ``redistribute_on_node_split``: ``u`` is the new upper part of
    ``child``; the component moves what belongs to the older edge."""


@hook()
def drop_device(nodes, pool, meta, s, at, out, acts):
    """Node ``s`` loses its device data (a deleted device leaf, or a demotion):
    the component frees its own (``out[at:at + len]`` holds the node's Full
    indices, emitted by the caller). The caller checked room for a row and a
    value per component."""


@hook()
def drop_host(nodes, pool, meta, s, out, acts):
    """Node ``s`` is deleted: the component frees its host data (``A_FREE_HOST``)."""


@hook()
def to_host_only(nodes, meta, s):
    """Node ``s`` was demoted (host-only from now): its host-only data joins the
    component's host LRU."""


@hook("or")
def needs_backup(nodes, meta, s, out):
    """Whether ``s`` holds device data of the component with no host copy that a
    backup of ``s`` copies (``out``: scratch for a window walk, may be empty)."""


# ---------------------------------------------------------------- locks
@hook("stamp", skip=True)
def lock(nodes, heap, meta, s, skip):
    """SGLang's ``acquire_component_lock`` from node ``s``; returns the lock's
    boundary stamp (0: none)."""


@hook("check", reverse=True, skip=True)
def check_unlock(nodes, meta, s, skip, stamp):
    """Whether ``unlock`` would succeed: ``(OK, -1)`` or ``(status, slot)``."""


@hook(reverse=True, skip=True)
def unlock(nodes, heap, meta, s, skip, stamp):
    """SGLang's ``release_component_lock`` (checked by ``check_unlock``)."""


@hook("check", skip=True, rule="check_unlock")
def check_unlock_forward(nodes, meta, s, skip, stamp):
    """``check_unlock`` in component order (``lock.check_dec``)."""


@hook("pick", init="(0, -1)", rule="check_unlock")
def check_unlock_of(c, nodes, meta, s, skip, stamp):
    """``check_unlock`` of component ``c`` only (a batch names the one that failed)."""


@hook("pick", rule="unlock")
def unlock_of(c, nodes, heap, meta, s, skip, stamp):
    """``unlock`` of component ``c`` only (a cascade of an early release)."""


@hook(skip=True)
def shift_locks(nodes, meta, s, skip, stamp, d):
    """Add ``d`` to the component's lock counts of the lock on ``s`` (a batch
    release's dry run; undone by the opposite shift, ``shift_locks_back``)."""


@hook(reverse=True, skip=True, rule="shift_locks")
def shift_locks_back(nodes, meta, s, skip, stamp, d):
    """``shift_locks`` last component first (undoing a dry run)."""


@hook("pick", init="(0, 0, 0)")
def check_early_release(c, nodes, meta, s, stamp):
    """Whether component ``c``'s part of a lock on ``s`` (boundary ``stamp``) can be
    released early (SGLang ``dec_swa_lock_only``): ``(OK, values, rows)`` (the
    room the release needs) or ``(status, slot, 0)``."""


@hook("pick")
def early_release(c, nodes, pool, heap, meta, s, stamp, out, acts):
    """Release component ``c``'s part of a lock on ``s`` early (checked by
    ``check_early_release``); returns the units it freed at once."""


@hook("stamp")
def host_lock(nodes, heap, meta, s):
    """SGLang's ``acquire_component_lock(lock_host=True)``; returns its stamp."""


@hook("check", reverse=True)
def check_host_unlock(nodes, meta, s, stamp):
    """Whether ``host_unlock`` would succeed: ``(OK, -1)`` or ``(status, x)``."""


@hook(reverse=True)
def host_unlock(nodes, heap, meta, s, stamp):
    """The reverse of ``host_lock`` (checked by ``check_host_unlock``)."""


# ---------------------------------------------------------------- insert
@hook("sum3")
def insert_room(meta, n):
    """The room an insert of ``n`` units needs beyond Full's, for the component's
    rules: ``(node slots, out values, action rows)``."""


@hook("first")
def overlap_split(nodes, meta, s, length, m, prev, cursor):
    """An insert walked node ``s`` (key units ``[length, length + m)``): the units
    of its upper part the component needs split off before ``overlap`` (0: none;
    ``s`` stays the lower part). ``prev``: the caller's ``prev_prefix_len``;
    ``cursor``: the request's SWA cursor."""


@hook("min", init="m")
def overlap(nodes, pool, meta, s, length, m, value, prev, cursor, track, out, acts):
    """SGLang's ``update_component_on_insert_overlap`` at walked node ``s``: the
    component takes over what it needs of the request's slots ``value``; returns
    ``consumed_from`` (relative to ``length``: ``m`` when nothing was taken), the
    duplicates are freed below it only."""


@hook("or")
def free_dups(nodes, meta, start, end, cursor, acts):
    """Free the request's duplicate slots ``value[start:end]`` the component's way;
    False when no component did (the core frees them whole, ``A_FREE_KV``)."""


@hook("first")
def unevict_split(nodes, meta, s, length, m, cursor):
    """A host-only node ``s`` took the insert's slots (SGLang's
    ``_unevict_node_on_insert``): the units of its upper part to split off before
    ``unevict`` (0: none)."""


@hook()
def unevict(nodes, meta, s, length, m, cursor, track, acts):
    """SGLang's ``recover_after_unevict`` at ``s`` (after ``unevict_split``)."""


@hook("first")
def commit_split(nodes, meta, leaf, start, end, cursor):
    """The insert's new ``leaf`` (key units ``[start, end)``): the units of the next
    upper part the component needs split off it (0: none left)."""


@hook()
def commit_upper(nodes, meta, u, leaf, start, end, cursor):
    """``u`` was split off the new ``leaf`` at a ``commit_split`` request."""


@hook()
def commit_leaf(nodes, pool, meta, leaf, start, end, cursor, track, acts):
    """SGLang's ``commit_insert_component_data`` for the new ``leaf``, after its
    splits (before its ``BlockStored`` events)."""


@hook("stamp")
def commit_target(nodes, heap, meta, target, new_leaf, slot, out, acts):
    """SGLang's ``commit_insert_component_data`` for the insert's target (the new
    leaf, else the node the key ended on), after the walk's events and hit counts:
    ``COMMITTED`` when the target took the component's donated value (``slot``),
    ``EXISTED`` when it had one (``mamba_exist``: the caller keeps its slot), 0
    when the component donates none."""


#: ``commit_target``'s answers.
COMMITTED = 1
EXISTED = 2


# ---------------------------------------------------------------- per component
@hook("pick")
def held(c, nodes, meta, s):
    """Units of component ``c`` the node holds on the device (what deleting it frees)."""


@hook("pick")
def held_host(c, nodes, meta, s):
    """Units of component ``c`` the node holds on the host."""


@hook("pick")
def drop_host_of(c, nodes, pool, meta, s, out, acts):
    """Free component ``c``'s host value at ``s`` (``A_FREE_HOST(c)``); returns the
    units freed."""


@hook("pick")
def priority(c, meta):
    """SGLang's ``eviction_priority(is_leaf=False)`` of component ``c``: evicting a
    component's data at an internal node also evicts every component's of a lower
    priority (Full: 2, the backbone, never)."""


@hook("pick")
def evict_internal(c, nodes, pool, meta, x, out, acts):
    """Component ``c``'s eviction of ``x``, a node that is not an evictable device
    leaf (SGLang's ``evict_component``): its data is tombstoned; returns the units."""


@hook("pick", init=-1)
def internal_backup(c, nodes, meta, x, out):
    """Write-back: before component ``c``'s round tombstones ``x`` (no Full host
    copy), whether the component's data must be backed up first (SGLang's
    ``InternalStateBackup``): -1 no, else the host units the caller reserves."""


# ---------------------------------------------------------------- checks
@hook("check", always=True)
def check_node(nodes, meta, s, n, full_lock, tally):
    """``sanity_check`` of the component at live non-root node ``s`` (``n`` units,
    Full lock_ref ``full_lock``), run whether the component is configured or not
    (then it must hold nothing): ``(0, -1)``, or ``(code, slot)``; the component
    counts what it recounts in its row of ``tally`` (int64 ``(N_COMPONENTS + 1,
    8)``, indexed by ``ID``)."""


@hook("check", always=True)
def check_end(nodes, meta, hwm, tally):
    """``sanity_check`` of the component after the node walk: its lists and
    ledgers against ``tally``: ``(0, -1)``, or ``(code, slot)``."""
