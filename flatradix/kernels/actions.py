"""The action buffer: the one output contract of every mutating kernel.

The tree decides, the cache executes (SGLang 0.5.23 ``unified_cache/cache_action.py``):
a kernel never frees a KV slot or builds an event itself; it appends rows to
``acts`` (int64 ``(capacity, ACT_NCOL)``) and the façade's executor
(``flatradix.executor``) turns them into allocator calls and KV events, in row
order, right after the call. Rows: ``(kind, component, src, off, len, aux)``.

``src`` says where the ``len`` values of a row live: ``SRC_OUT`` -- the call's
``out`` scratch at ``[off, off + len)`` (the kernel copied them there, e.g. an
evicted node's KV indices); ``SRC_IN`` -- the call's input value array at
``[off, off + len)`` (an insert's duplicate slots); ``SRC_POOL`` -- pool rows
``[off, off + len)`` (still intact when the executor runs: compaction only
happens between calls).

=====================  ===================================================================
kind                   executed as (SGLang action)
=====================  ===================================================================
A_FREE_KV              free Full slots and their paired SWA slots (``FreeDeviceKV``:
                       allocator ``free_segment``; ``free`` without SWA)
A_FREE_KV_FULL_ONLY    free Full slots only, their SWA side is gone (``FreeDeviceKVFullOnly``)
A_FREE_SLOT            free component ``comp``'s device data of an evicted / tombstoned node
                       (``FreeComponentDeviceSlot``): the values are the node's *Full*
                       indices; FULL frees them, SWA frees their SWA peers (``free_swa_segment``)
A_SWA_RECOVER_LOCKED   ``RecoverSWAWithLockedFull``: the node keeps its locked Full slots
                       (``len`` values at ``out[off]``), takes over the SWA peers of the
                       incoming slots (input ``[aux, aux + len)``), whose Full side is freed
A_STORED               KV event ``BlockStored`` for the node in slot ``off`` (events on)
A_REMOVED              KV event ``BlockRemoved`` for pool rows ``[off, off + len)`` (events on)
A_ADOPTED              a report, nothing to execute: the insert took ownership of the
                       caller's slots at key positions ``[off, off + len)`` for ``comp``
                       (``InsertResult.adopted_ranges``; emitted only when tracked)
A_FREE_HOST            free host pool slots of ``comp`` (``FreeComponentHostSlot``)
A_BACKUP               HiCache write-through: back up the node in slot ``off`` and its
                       unbacked ancestors, ancestors first (``BackupKV``); run after the
                       call, in row order (``aux`` ``BACKUP_NO_STATE``: without the
                       node's Mamba state)
A_PATH_CAP             HiCache + Mamba per-path cap: run ``MambaEvictExcessPathStates``
                       for the node in slot ``off`` when the row is reached (after the
                       walk's backups, before the new leaf's, as SGLang's action)
=====================  ===================================================================

Consecutive rows of the same free kind, component and source over adjacent
ranges are merged as they are emitted (``emit``), so a Full-only insert's
duplicates are one row and a Full-only eviction round one row in all.

A kernel that could emit sets ``meta[M_NACTS] = 0`` and ``meta[M_NOUT]`` to the
first free entry of ``out`` when it starts, and checks capacity before it
changes anything (``E_CAPACITY`` with ``meta[M_NEED_OUT]`` /
``meta[M_NEED_ACTS]``) or, for an eviction round, before each victim (the
round then resumes where it stopped).
"""

from ._jit import helper
from .layout import FULL_DEV, KEY_LEN, KEY_OFF, M_NACTS, M_NOUT

ACT_KIND = 0
ACT_COMP = 1
ACT_SRC = 2
ACT_OFF = 3
ACT_LEN = 4
ACT_AUX = 5
ACT_NCOL = 6

A_FREE_KV = 1
A_FREE_KV_FULL_ONLY = 2
A_FREE_SLOT = 3
A_SWA_RECOVER_LOCKED = 4
A_STORED = 5
A_REMOVED = 6
A_ADOPTED = 7
A_FREE_HOST = 8
A_BACKUP = 9
A_PATH_CAP = 10
ACTION_NAMES = {A_FREE_KV: "FreeDeviceKV", A_FREE_KV_FULL_ONLY: "FreeDeviceKVFullOnly",
                A_FREE_SLOT: "FreeComponentDeviceSlot", A_SWA_RECOVER_LOCKED: "RecoverSWAWithLockedFull",
                A_STORED: "BlockStored", A_REMOVED: "BlockRemoved", A_ADOPTED: "adopted range",
                A_FREE_HOST: "FreeComponentHostSlot", A_BACKUP: "BackupKV"}

MEDIUM_GPU = 0
MEDIUM_CPU = 1

SRC_OUT = 0
SRC_IN = 1
SRC_POOL = 2


@helper
def acts_begin(meta, out_base):
    """Start a call's output: no rows yet, action data from ``out[out_base]`` on."""
    meta[M_NACTS] = 0
    meta[M_NOUT] = out_base


@helper
def acts_room(acts, out, meta, rows, values):
    """Whether ``rows`` more rows and ``values`` more ``out`` entries fit."""
    return (meta[M_NACTS] + rows <= acts.shape[0]
            and meta[M_NOUT] + values <= out.shape[0])


@helper
def emit(acts, meta, kind, comp, src, off, n, aux):
    """Append a row (merged into the previous one when it is the same free kind,
    component and source over the adjacent range). The caller checked room."""
    i = meta[M_NACTS]
    if (i > 0 and (kind <= A_FREE_SLOT or kind == A_FREE_HOST) and acts[i - 1, 0] == kind and acts[i - 1, 1] == comp
            and acts[i - 1, 2] == src and acts[i - 1, 3] + acts[i - 1, 4] == off):
        acts[i - 1, 4] += n
        return
    acts[i, 0] = kind
    acts[i, 1] = comp
    acts[i, 2] = src
    acts[i, 3] = off
    acts[i, 4] = n
    acts[i, 5] = aux
    meta[M_NACTS] = i + 1


@helper
def out_put_col(out, meta, pool, off, n, col):
    """Copy column ``col`` of pool rows ``[off, off + n)`` to ``out``; returns their
    offset in ``out``. The caller checked room."""
    at = meta[M_NOUT]
    src = pool[off:off + n, col]
    dst = out[at:at + n]
    for j in range(n):
        dst[j] = src[j]
    meta[M_NOUT] = at + n
    return at


@helper
def out_put_span(out, meta, pool, off, n):
    """Copy the Full values of pool rows ``[off, off + n)`` to ``out``; returns
    their offset in ``out``. The caller checked room."""
    at = meta[M_NOUT]
    src = pool[off:off + n, FULL_DEV]
    dst = out[at:at + n]
    for j in range(n):
        dst[j] = src[j]
    meta[M_NOUT] = at + n
    return at


@helper
def out_node_values(nodes, pool, out, slots_at, k, col):
    """``out[:units]`` = the values in pool column ``col`` of the ``k`` nodes whose
    slots are ``out[slots_at:slots_at + k]`` (root-first), concatenated; the
    caller checked that they fit before ``slots_at``."""
    pos = 0
    for i in range(k):
        a = out[slots_at + i]
        n = nodes[a, KEY_LEN]
        src = pool[nodes[a, KEY_OFF]:nodes[a, KEY_OFF] + n, col]
        dst = out[pos:pos + n]
        for j in range(n):
            dst[j] = src[j]
        pos += n


@helper
def out_reverse(a, lo, hi):
    """Reverse ``a[lo:hi]`` in place."""
    hi -= 1
    while lo < hi:
        t = a[lo]
        a[lo] = a[hi]
        a[hi] = t
        lo += 1
        hi -= 1
