"""Scheduler emulation: replay a :class:`~flatradix.replay.trace.Workload` through
a prefix cache, through the public API only, as SGLang's scheduler drives it.

The model (one pass over the requests, in arrival order):

1. **Admit** request ``i``: if ``max_running`` requests are in flight, one
   completes first. Then ``match_prefix`` on the prompt, ``inc_lock_ref`` on
   the matched node, and allocate KV slots for the uncached tail *and* the
   ``output_length`` tokens the request will decode (reserved at admission, so
   a running request never runs out of KV).
2. **Short of KV**: ``evict`` what the allocator lacks and retry; still short,
   complete a running request (its slots return, its prompt becomes
   evictable) and retry; short with nothing running, the request can never fit
   (its prompt + output tokens exceed the pool): it is **rejected** (its lock
   released; counted as a miss, never a crash).
3. **Complete**: ``cache_finished_req`` caches the prompt (page-aligned down)
   and frees the rest: the prompt's unaligned tail and the output slots.
   Output tokens are never inserted by default, so their ids do not matter;
   with ``cache_outputs=True`` they are inserted too, as fresh token ids (from
   ``Workload.token_base`` up) that never match anything.

Which request completes, and when, is the mode:

* **order** (default, ``arrival=None``): there is no clock; timestamps give the
  order only. The oldest running request completes first (FIFO completion).
  With ``max_running=1`` and unbounded capacity, request ``i`` hits exactly the
  longest page-aligned prefix it shares with any earlier page-aligned prompt.
* **arrival** (``arrival=ArrivalModel(...)``): a clock in ms. Request ``i``
  arrives at ``timestamp / rate_scale``; requests are admitted first come first
  served (one that waits holds back those behind it). Admitted at ``a``, it
  holds its KV until ``a + 1000 * (uncached prompt tokens / prefill_tokens_per_s
  + output tokens / decode_tokens_per_s)`` ms: prefill over what the cache did
  not serve, then decode at a fixed per-request speed; running requests do not
  slow each other down (no batching model: pick throughputs a loaded server
  sustains). Requests complete at their end times, earliest first; a request
  short of KV or of a running slot waits for the next one to end. Its wait is
  admission minus arrival.

Two drivers do step 3:

* ``"request"`` (default): builds a ``flatradix.Req`` with a
  ``ReqToTokenPool`` row ``[prefix | tail | outputs]``, ``kv_committed_len`` =
  prompt length and ``kv_allocated_len`` = prompt + output, and calls
  ``cache.cache_finished_req(req)``, which inserts, frees duplicates and the
  over-allocated slots, unlocks and releases the row.
* ``"core"``: the same effect through ``insert`` / ``dec_lock_ref`` /
  ``allocator.free`` only, for caches without the request API (the pure-Python
  reference model of the tests).

**SWA mode** (``swa_window=W``): the replay serves a hybrid sliding-window
model (Gemma-3, gpt-oss) as SGLang does. The cache has the ``(FULL, SWA)``
components and window ``W``; the KV pools are a
``flatradix.SWATokenToKVPoolAllocator``: the Full pool is ``capacity`` and the
SWA pool ``swa_ratio x capacity`` tokens (SGLang's ``swa_full_tokens_ratio``,
whole pages). Per request, as SGLang's scheduler:

1. ``match_prefix``; ``cache.lock(node)`` (the ``TreeLock`` goes into
   ``req.lock``) and ``req.swa_branching_seqlen`` from the match. The hit is
   ``device_prefix_len``; ``full_kv_hit_length - device_prefix_len`` tokens are
   *lost to the window*: their Full KV is cached but the SWA KV before them was
   dropped (tombstoned), so they cannot be used.
2. The same single allocation of ``uncached + output`` tokens, from both pools
   (each slot is a Full slot with its SWA peer). Short of either:
   ``evict_for_alloc(EvictParams(num_tokens=full shortfall,
   swa_num_tokens=SWA shortfall))``, then the waits and rejections above.
3. Decode: at the decode steps of sequence lengths ``n + 1 .. n + o - 1`` the
   scheduler calls ``evict_sliding_windows(req, seqlen - 1)`` once at least
   ``swa_eviction_interval`` (128, SGLang's ``SGLANG_SWA_EVICTION_INTERVAL``)
   tokens slid out of the window past the request's SWA cursor: the request's
   own SWA slots below the window go back to the SWA pool. There is no clock
   in the order mode, so the decode steps run right after the admission (the
   output KV is reserved there too); in the arrival mode as well (the clock
   only decides when the request completes).
4. ``cache_finished_req``: the prompt is inserted with the request's SWA
   cursor, so its part that slid out of the window is cached as Full-only
   tombstones; SGLang's ``release_swa_prefix_lock`` (off by default there)
   is not modelled.

The SWA replay reports, besides the hits, the evictions per pool (Full tokens
and SWA tokens), the tokens lost to the window, and the SWA slots freed by the
window slides. With a window no request ever slides (``W`` at least the
longest request) and ``swa_ratio=1`` it gives exactly the hits of the
Full-only replay.

**Mamba mode** (``mamba_states=N``): the replay serves a hybrid SSM model
(Qwen3-Next, Nemotron-H) as SGLang does without the Mamba extra buffer. The
cache has the ``(FULL, MAMBA)`` components, page size 1 (SGLang requires it
without the extra buffer) and ``mamba_cache_chunk_size=mamba_chunk`` (which
then only moves ``MatchResult.mamba_branching_seqlen``, unused here); the
request pool is a ``flatradix.HybridReqToTokenPool`` whose
``mamba_allocator`` holds ``N`` state slots. Per request:

1. ``match_prefix`` on the prompt less its last token, ``prompt[:-1]``, as
   SGLang's scheduler matches (``Req._compute_max_prefix_len``: the match key
   is capped at ``input_len - 1``, so at least one token is always computed);
   ``cache.lock(node)`` (the ``TreeLock`` goes into ``req.lock``). The hit is
   ``device_prefix_len``, which ends at the deepest node holding a state;
   ``full_kv_hit_length - device_prefix_len`` of that same match are *lost to
   checkpoint granularity*: their Full KV is cached, but no state was
   checkpointed at their end. A state sits exactly at the end of the prompt
   that donated it, so a prompt repeating an earlier one whole never reaches
   that state (its key stops one token short); it hits the state of a shorter
   earlier prompt that is a prefix of its own, if any. The Full-only and SWA
   modes match the whole prompt (their published figures): a Full-only run
   hits up to ``n`` tokens where this match stops at ``n - 1``.
2. One state slot of its own (``req.mamba_pool_idx``): when none is free,
   ``evict_for_alloc(EvictParams(num_tokens=0, mamba_num=1))`` and retry;
   still none, a running request completes first (its state goes to the tree,
   unlocked) and the request retries, like a request short of KV (SGLang's
   scheduler cannot admit without a state slot either). With nothing running
   the only state left is the one its own match locked (``N = 1``: a copy
   would need a second slot): the request gives its match up, evicts that
   state and matches again.
3. KV as in the Full-only model (step 2 above); a rejected request frees its
   state slot too.
4. ``cache_finished_req``: the finished request donates its state to the tree
   at the end of what it inserts (or frees it, when that node has one).

The Mamba replay reports the tokens lost to checkpoint granularity, the states
evicted (``EvictResult.mamba_num_evicted``, also those of leaves the Full
eviction deleted), the completions waited for because no state slot was free,
and the peak states in the tree.

**Mamba mode with the extra buffer** (``mamba_states=N``,
``mamba_extra_buffer=True``): the same model served as SGLang serves it with
the Mamba extra buffer (non-lazy, overlap scheduler: 2 ping-pong track slots).
The cache is built with ``enable_mamba_extra_buffer=True`` at any page size
(the checkpoint grid ``G = lcm(mamba_chunk, page_size)``, the cache's
``mamba_checkpoint_grid``) and the request pool with
``enable_mamba_extra_buffer=True``. Per request:

1. The ``prompt[:-1]`` match and ``cache.lock`` of the Mamba mode. The request
   needs 3 free state slots (``alloc_mamba``: its own and 2 ping-pong track
   slots), 4 when its prefill will track a state and it runs on after the
   prefill (the checkpoint below swaps a fresh slot into the tracked entry;
   the replay reserves it at admission, so the checkpoint never finds the
   pool empty). Short of them: ``evict_for_alloc(EvictParams(num_tokens=0,
   mamba_num=shortfall))``, then a running request completes first (a state
   wait), then, with nothing running, the request gives its match up (its
   locked state is evicted) and matches again, as the Mamba mode does for its
   one slot.
2. KV as in the Full-only model (rejected: its lock released; it held no state
   slot yet). Admitted: ``HybridReqToTokenPool.alloc_mamba(req)``.
3. The prefill, one forward over the ``e = n - hit`` uncached prompt tokens
   (the replay prefills every prompt in one piece: no chunked prefill), tracks
   a state as SGLang's model runner does
   (``ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend``) when
   ``e >= G``: at ``hit + (e // G) * G``, or at the match's
   ``mamba_branching_seqlen`` when that lies past the hit on the grid (so a
   prompt that leaves a cached path between two states puts a state at the
   branching point). Tracking sets ``mamba_last_track_idx`` to the next entry,
   flips ``mamba_next_track_idx`` and shifts the track seqlens (prev = last,
   last = the tracked seqlen).
4. When the request runs on after its prefill (``o >= 2``: the prefill samples
   its first output token), ``checkpoint(req, n)`` -- SGLang's scheduler calls
   ``cache_unfinished_req`` after every prefill that does not finish the
   request: the key up to the tracked seqlen is cached and the tracked state
   donated (nothing when no state was tracked). Then its decode steps (sequence
   lengths ``n + 1 .. n + o - 1``) track a state at each multiple of ``G``
   they reach.
5. ``release_kv_cache(req)`` at completion: the key up to the last tracked
   state is cached when that state lies within the committed tokens (``n``,
   or ``n + o`` with ``cache_outputs``), else the previous tracked state when
   that does; the request's other slots go back. Without ``cache_outputs`` a
   state tracked in the decode lies past the prompt, so a request that decodes
   past a grid point caches nothing more at completion: its prompt's state is
   the one its checkpoint donated.

Every state therefore lies on the grid, and a hit is a multiple of ``G``. The
report has the Mamba mode's figures (the hit tokens lost to checkpoint
granularity: ``full_kv_hit_length - device_prefix_len`` of the same match;
the Full KV the tree holds ends at the tracked states, so this counts the
Full KV past the deepest state that other requests' paths or evicted states
left), and the text report the ``checkpoint`` calls' latency. Not modelled:
the lazy extra buffer, ``mamba_track_interval`` (SGLang tracks decode states
every ``mamba_track_interval`` tokens, default 256; here every ``G``) and
the extra buffer with SWA (``ValueError``).

**SWA + Mamba mode** (``swa_window=W`` and ``mamba_states=N``): a hybrid model
with sliding-window and SSM layers besides its full-attention ones. The cache
has the ``(FULL, SWA, MAMBA)`` components at page size 1 (no extra buffer),
window ``W`` and chunk ``mamba_chunk``; the KV pools are the SWA mode's (an
``SWATokenToKVPoolAllocator``, the SWA pool :func:`swa_pool_slots`) and the
request pool the Mamba mode's (a ``HybridReqToTokenPool`` of ``N`` state
slots). Each request goes through both modes' steps: the Mamba match
(``prompt[:-1]``) and ``cache.lock``, ``req.swa_branching_seqlen``, its state
slot (evicting a state, waiting, giving its match up as above), the one
allocation from both pools (``evict_for_alloc`` with both shortfalls), the
window slides of its decode, and ``cache_finished_req`` (the prompt cached
with the SWA cursor, the state donated at its end; the cache does not cut the
key at ``swa_branching_seqlen`` then: the state belongs to the whole key).
The hit ends at the deepest node that holds a state *and* has ``W`` tokens of
SWA KV before its end. Of ``full_kv_hit_length - device_prefix_len``, the
tokens beyond the deepest state on the matched path (``S``, read with
``node_info`` right after the match) are *lost to checkpoint granularity*
(``full_kv_hit_length - S``: no state at their end) and the rest *lost to
the window* (``S - device_prefix_len``: a state was there, the SWA KV before
it was dropped); a state the SWA eviction dropped with its node's window
(an SWA tombstone drops the node's state) is no state any more, so it counts
in the former. The report carries both modes' figures: SWA and Full tokens
evicted, states evicted (each counter the unit its eviction freed, whichever
call did it), window slides, state waits, the peak SWA tokens and states in
the tree, and the conservation of all three pools.

**Host tier mode** (``host_capacity=H``): a Full-attention model served with
SGLang's HiCache, a host KV pool of ``H`` tokens behind the device pool. The
cache gets ``init_hicache(host_size=H, hicache_write_policy=write_policy,
load_back_threshold=...)`` (``write_through``: a node is backed up at its first
hit; ``write_through_selective``: at its second; ``write_back``: only when
eviction takes it, and host eviction reclaims duplicate host copies first). The scheduler's HiCache calls, as SGLang's:

1. Every scheduler step polls ``check_hicache_events`` (submit the backups the
   completions queued, complete them: a backed-up node is pinned on the device
   until then). A step here is an admission (after the completions that come
   before it), each completion waited for when KV is short, and the end of the
   run.
2. The match reports ``device_prefix_len`` and ``host_hit_length`` (the tokens
   past the device match held on the host only). When ``host_hit_length > 0``
   the request (``req.last_node`` = the device match) calls
   ``init_load_back(InitLoadBackParams(best_match_node, host_hit_length,
   req=req))``: below ``load_back_threshold`` tokens (SGLang's 10) the load is
   declined and those tokens are recomputed; else they are loaded back (device
   slots allocated, evicting when short) and the request's node is the best
   match node. Then ``inc_lock_ref`` on that node, the allocation of the rest
   (uncached prompt + outputs) as in the Full-only model, and, after a load,
   ``ready_to_load_host_cache`` and ``loading_check`` (transfers are
   synchronous: the load is complete when it is submitted).
3. Device eviction demotes a backed-up leaf (its host copy stays) and deletes
   the others; a backup short of host slots evicts host leaves first.

A request's hit is its device hit plus its **host hit** (the tokens loaded
back); the rest of its prompt is its miss. ``hit_tokens`` and
``token_hit_ratio`` count both tiers (the prefill skips both); the split is in
``device_hit_tokens``, ``host_hit_tokens`` and ``miss_tokens``. The time a
load takes is not modelled (in the arrival mode a request prefills its misses
only). The host pool gets ``min(H, distinct prefix tokens)`` slots (the tree
can never hold more: ``host_pool_slots``). The report also counts the tokens
backed up (``backed_up_tokens``, from the copies the tree asks for; no bytes
move) and those that left the host (``host_evicted_tokens``: backed up minus
what the host holds at the end). Not with the ``"core"`` driver, nor with the
Mamba extra buffer.

**Host tier over a hybrid model** (``host_capacity=H`` with ``swa_window``,
``mamba_states`` or both): the SWA, Mamba or SWA + Mamba mode above, served with
SGLang's HiCache for every component: a backup copies a node's Full KV, the SWA
KV within one window of it and its state; a demotion keeps them on the host; a
load-back restores them. Host pools, as SGLang sizes them from one
``hicache_ratio`` of the device pools, with the ratio ``H / capacity``
(:func:`host_aux_slots`): the SWA host pool ``swa_ratio x H`` tokens (whole
pages), the Mamba host pool ``N x H / capacity`` states (at least one page /
one state); ``swa_host_capacity`` / ``mamba_host_states`` set them instead.
Per request, the hybrid mode's steps with these HiCache calls:

1. The step's ``check_hicache_events``; the match (``prompt[:-1]`` with Mamba)
   and ``cache.lock`` on its device node (SGLang's ``PrefillAdder`` holds that
   lock around the load); with Mamba the request's own state slot (evicting,
   waiting, giving its match up as the Mamba mode does). SGLang's load
   allocates that slot when the request holds none; the replay takes it first,
   so a load never finds the state pool empty (SGLang asserts there), and
   matches again when taking it evicted a state or waited for a completion
   (those may have evicted the match's host part).
2. When any host hit is positive -- ``host_hit_length`` (Full tokens),
   ``swa_host_hit_length`` (the window's SWA tokens on the host only),
   ``mamba_host_hit_length`` (the state on the host only) -- the request, with
   ``req.last_node`` the device match and those two lengths, calls
   ``init_load_back``: the Full part, the window and the state are loaded
   together (``load_back_threshold`` does not apply to a load that restores SWA
   data or a state, as SGLang's), into slots it evicts for when short. Its
   count, SGLang's, is the Full tokens from the loaded node up to the device
   match: a state-only load counts the tokens it made usable. The request's lock
   moves to the loaded node.
3. The allocation of the rest (both pools' shortfalls evicted, as the SWA mode),
   then ``ready_to_load_host_cache`` and ``loading_check``; decode and
   ``cache_finished_req`` as the hybrid mode.

The figures are both modes': device hits, host hits (the count above), misses,
the hybrid mode's evictions per pool and lost hits. ``full_kv_hit_length``
counts Full KV on either tier there, so the lost hits (window, checkpoint) are
measured from the hit plus the host tokens a declined load left
(``declined_host_tokens``, per request too): hit + declined + lost =
``full_kv_hit_length``. Per component: the SWA tokens restored
(``swa_host_loaded_tokens``) and the loads that restored a state
(``host_state_loads``); what the loads evicted on the device
(``load_evicted_tokens``, ``load_swa_evicted_tokens``, ``load_evicted_states``:
each tree grew by what the load restored and shrank by the rest; also in the
evictions); backed up, evicted from the host and the peak host tree per pool.
With ``H = 0`` nothing is backed up (a backup needs Full host slots first): the
run is the hybrid mode's run without a host tier, request by request (tested
under every write policy).

Rows of the ``ReqToTokenPool`` are reused: it has ``min(max_running,
requests)`` rows, each as long as the longest request (prompt + output). The
KV pool never holds more slots than the workload can use
(:func:`unbounded_pool_slots`): a larger capacity gives the same run.
"""

import collections
import heapq
import math
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from ._progress import progress_bar
from .. import (ComponentType, EvictParams, HybridReqToTokenPool, InitLoadBackParams,
                InsertParams, MatchPrefixParams, RadixKey, Req, ReqToTokenPool,
                SWATokenToKVPoolAllocator, TokenToKVPoolAllocator, UnifiedRadixCache)

OPS = ("match_prefix", "inc_lock_ref", "evict", "cache_finished_req")
#: The SWA mode's operations (``inc_lock_ref`` is ``cache.lock`` there).
SWA_OPS = OPS[:3] + ("evict_sliding_windows", "cache_finished_req")
#: The extra-buffer Mamba mode's operations (``checkpoint``: after each prefill;
#: ``cache_finished_req`` is its new name ``release_kv_cache`` there).
MAMBA_EXTRA_OPS = OPS[:3] + ("checkpoint", "cache_finished_req")
#: The host tier mode's operations (``loading_check``: ``ready_to_load_host_cache``
#: and ``loading_check`` after a load; ``check_hicache_events``: each step's poll).
HOST_OPS = ("match_prefix", "init_load_back", "inc_lock_ref", "evict", "loading_check",
            "cache_finished_req", "check_hicache_events")

#: Write policies of the host tier mode (those the cache's host tier builds).
HOST_WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
#: ``write_policy`` when none is given (SGLang's ``--hicache-write-policy`` default).
DEFAULT_WRITE_POLICY = "write_through"
#: ``load_back_threshold`` when none is given: fewer host tokens are recomputed
#: (SGLang's ``load_back_threshold``).
DEFAULT_LOAD_BACK_THRESHOLD = 10
#: Largest accepted threshold (the cache takes a signed 63-bit int; a threshold
#: past any pool declines every load).
MAX_LOAD_BACK_THRESHOLD = 1 << 40
#: Largest accepted ``swa_host_capacity`` / ``mamba_host_states`` (the cache's
#: host pools take at most 2**40 slots).
MAX_HOST_AUX = 1 << 40

#: ``swa_ratio`` when none is given: SGLang's ``swa_full_tokens_ratio`` default.
DEFAULT_SWA_RATIO = 0.8
#: Tokens that must slide out of the window before the scheduler frees them
#: (SGLang's ``SGLANG_SWA_EVICTION_INTERVAL`` default).
SWA_EVICTION_INTERVAL = 128
#: Largest accepted window (tokens): flatradix's ``MAX_WINDOW``.
MAX_SWA_WINDOW = 1 << 40

#: The Mamba mode's checkpoint chunk when none is given (SGLang's
#: ``mamba_cache_chunk_size`` default).
DEFAULT_MAMBA_CHUNK = 64
#: Largest accepted chunk: the cache takes ``mamba_cache_chunk_size`` below 2**62.
MAX_MAMBA_CHUNK = (1 << 62) - 1

#: State slots each running request holds with the extra buffer: its own and a
#: ping-pong track buffer of 2 (SGLang's with the overlap scheduler).
EXTRA_BUFFER_REQ_STATES = 3
#: The smallest state pool of the extra-buffer mode: a request's 3 slots and the
#: fresh slot its checkpoint after the prefill swaps in.
EXTRA_BUFFER_MIN_STATES = EXTRA_BUFFER_REQ_STATES + 1

#: ``max_running`` of the arrival mode when none is given (a serving engine's
#: running-request cap; SGLang derives its own, typically 2048-4096, from memory).
ARRIVAL_MAX_RUNNING = 1024


def default_cache_factory(page_size, eviction_policy, token_to_kv_pool_allocator,
                          req_to_token_pool, sliding_window_size=None,
                          mamba_cache_chunk_size=None, enable_mamba_extra_buffer=False):
    """``flatradix.UnifiedRadixCache`` wired to the replay's pools.

    ``sliding_window_size``: the SWA mode's window (tokens); the cache then has
    the ``(FULL, SWA)`` components and the allocator is an
    ``SWATokenToKVPoolAllocator`` (the replay passes it only in that mode).
    ``mamba_cache_chunk_size``: the Mamba mode's chunk; the cache then has the
    ``(FULL, MAMBA)`` components and ``req_to_token_pool`` is a
    ``HybridReqToTokenPool`` (passed only in that mode). Both: the SWA + Mamba
    mode's ``(FULL, SWA, MAMBA)`` cache. ``enable_mamba_extra_buffer``: the
    Mamba mode with the extra buffer (passed only in that mode, with a request
    pool built with it).

    The token pool starts at up to 4x the KV pool: evicted spans leave dead rows
    that the cache compacts away when the pool is full, so headroom makes those
    O(live) compactions rare (sizes only; the results are the same).
    """
    size = getattr(token_to_kv_pool_allocator, "size_full", None) or token_to_kv_pool_allocator.size
    kw = {}
    components = [ComponentType.FULL]
    if sliding_window_size is not None:
        components.append(ComponentType.SWA)
        kw["sliding_window_size"] = sliding_window_size
    if mamba_cache_chunk_size is not None:
        components.append(ComponentType.MAMBA)
        kw["mamba_cache_chunk_size"] = mamba_cache_chunk_size
    if enable_mamba_extra_buffer:
        kw["enable_mamba_extra_buffer"] = True
    if len(components) > 1:
        kw["components"] = tuple(components)
    return UnifiedRadixCache(page_size=page_size, eviction_policy=eviction_policy,
                             token_to_kv_pool_allocator=token_to_kv_pool_allocator,
                             req_to_token_pool=req_to_token_pool,
                             pool_capacity=max(1 << 16, min(4 * size, size + (1 << 25))), **kw)


def swa_pool_slots(capacity, ratio, page_size, bound):
    """SWA pool size (tokens) of the SWA mode: ``int(capacity * ratio)`` rounded
    down to whole pages (SGLang sizes it so), at most ``bound`` (the workload
    can never hold more SWA slots than Full ones). ``capacity`` ``None``:
    unbounded, ``bound``. ``ValueError`` when that is less than one page."""
    if capacity is None or capacity == float("inf"):
        return bound
    swa = int(int(capacity) * float(ratio))
    swa -= swa % page_size
    if swa < page_size:
        raise ValueError(f"the SWA pool ({int(capacity):,} x swa_ratio {ratio:g} = {swa:,} "
                         f"tokens in whole pages) is less than one page of {page_size}")
    return min(swa, bound)


def host_aux_slots(workload, host_capacity, capacity, pool_slots, page_size, swa_ratio=None,
                   mamba_slots=None, swa_host_capacity=None, mamba_host_states=None,
                   cache_outputs=False, notes=None):
    """Host pool sizes of the SWA and Mamba components in the host tier mode:
    ``(SWA host tokens or None, host states or None)``.

    SGLang sizes every host pool from one ``hicache_ratio`` of its device pool
    (the Full, SWA and Mamba host pools alike); the replay takes that ratio as
    ``host_capacity / capacity`` (``capacity``: the Full device pool asked, in
    tokens; ``None``, unbounded: ``pool_slots``, the pool allocated). So by
    default the SWA host pool is ``int(host_capacity * swa_ratio)`` tokens in
    whole pages (the ratio times the SWA device pool, ``swa_ratio`` x the Full
    one) and the Mamba host pool ``int(mamba_slots * host_capacity /
    capacity)`` states (``mamba_slots``: the device state pool); each at least
    one page / one state (the cache's host pools need a slot; with no Full host
    slot nothing is ever backed up, so it stays empty).
    ``swa_host_capacity`` / ``mamba_host_states`` (ints >= 1) replace those.
    ``host_capacity`` ``math.inf``: both as large as the workload can use.
    Either is capped at what the workload can use: SWA tokens at the distinct
    prefix tokens (the Full host pool's bound), states at one per request (each
    request donates at most one state; ``notes``, a list: a line is appended for
    each pool so capped). ``swa_ratio`` / ``mamba_slots`` ``None``: that component
    is absent (``None`` returned for it)."""
    tokens_bound = workload.distinct_prefix_blocks() * workload.block_size + (
        workload.output_tokens if cache_outputs else 0)
    states_bound = max(1, len(workload))
    inf = host_capacity == math.inf
    ratio = None if inf else int(host_capacity) / (capacity if capacity else max(1, pool_slots))

    def sized(given, bound, default, what):
        # the pool asked for (or the default), capped at what the workload can use
        h = int(given) if given is not None else bound if inf else default()
        if h > bound and not inf and notes is not None:
            notes.append(f"{what[0]} host pool sized to {bound:,} {what[1]}: this workload "
                         f"can never use more{what[2]}, so {h:,} {what[1]} gives the same run")
        return max(1, min(h, bound))

    def swa_default():
        h = int(int(host_capacity) * float(swa_ratio))
        return max(page_size, h - h % page_size)

    swa_h = None if swa_ratio is None else sized(
        swa_host_capacity, tokens_bound, swa_default, ("SWA", "tokens", ""))
    states_h = None if mamba_slots is None else sized(
        mamba_host_states, states_bound, lambda: max(1, int(mamba_slots * ratio)),
        ("Mamba", "states", " (one a request)"))
    return swa_h, states_h


@dataclass(frozen=True)
class ArrivalModel:
    """The arrival mode's clock and service times (module docstring).

    Attributes
    ----------
    prefill_tokens_per_s : float > 0
        Prefill speed over a request's uncached prompt tokens (tokens/s).
    decode_tokens_per_s : float > 0
        Decode speed of one request (output tokens/s).
    rate_scale : float > 0
        Arrivals at ``timestamp / rate_scale`` (2.0: the same requests twice as
        fast).
    interval_s : float > 0 or None
        Width of the timeline's buckets; ``None``: a round width giving at most
        about 20 buckets.
    """

    prefill_tokens_per_s: float = 10_000.0
    decode_tokens_per_s: float = 50.0
    rate_scale: float = 1.0
    interval_s: object = None

    def __post_init__(self):
        for name in ("prefill_tokens_per_s", "decode_tokens_per_s", "rate_scale"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0 < v < float("inf")):
                raise ValueError(f"{name} must be a number > 0, got {v!r}")
        if self.interval_s is not None and not (0 < self.interval_s < float("inf")):
            raise ValueError(f"interval_s must be > 0, got {self.interval_s!r}")

    def service_ms(self, uncached_tokens, output_tokens):
        """How long a request holds its KV: ``1000 * (uncached / prefill + output /
        decode)`` ms."""
        return 1e3 * (uncached_tokens / self.prefill_tokens_per_s
                      + output_tokens / self.decode_tokens_per_s)


@dataclass
class ReplayResult:
    """Figures of one replay (see :func:`replay`); ``to_dict()`` is the ``--json`` object."""

    workload: str
    capacity: object              # int tokens, or "inf"
    pool_slots: int               # allocator size actually used (<= capacity)
    page_size: int
    max_running: int
    policy: str
    cache_outputs: bool
    requests: int
    served_requests: int
    rejected_requests: int
    prompt_tokens: int            # all requests' prompts (a rejected one counts as a miss)
    output_tokens: int
    hit_tokens: int
    token_hit_ratio: float
    evicted_tokens: int
    evict_calls: int
    waits: int                    # completions waited for because KV was short
    peak_tree_tokens: int
    final_tree_tokens: int
    kv_conserved: bool
    wall_s: float                 # the replay loop (JIT warm-up excluded: warmup_s)
    cpu_s: float                  # process CPU time of the loop (wall_s minus waiting for a core)
    requests_per_s: float
    prompt_tokens_per_s: float
    warmup_s: float = 0.0         # first replay in a process: kernel compile / cache load
    latency_us: dict = field(default_factory=dict)   # op -> {count, p50, p99, mean}
    mode: str = "order"           # "order" or "arrival"
    arrival: object = None        # arrival mode: dict (see replay), else None
    notes: list = field(default_factory=list)        # why requests were rejected, etc.
    hits: object = None           # int64 (requests,) per-request hit, -1 rejected (record_hits)
    per_request: object = None    # dict of (requests,) arrays (record_requests)
    # SWA and SWA + Mamba modes (None otherwise; left out of to_dict then)
    swa_window: object = None             # W, tokens
    swa_ratio: object = None              # SWA pool / Full pool (swa_full_tokens_ratio)
    swa_pool_slots: object = None         # SWA allocator size actually used
    swa_evicted_tokens: object = None     # SWA tokens evicted (EvictResult.swa_num_tokens_evicted)
    window_lost_hit_tokens: object = None  # sum of full_kv_hit_length (SWA + Mamba: the
                                           # deepest state on the path) - device_prefix_len
                                           # (host tier: - the hit and declined host hit)
    swa_slid_tokens: object = None        # SWA slots freed by evict_sliding_windows
    peak_swa_tree_tokens: object = None   # SWA tokens the tree held at most (after completions)
    final_swa_tree_tokens: object = None
    # Mamba and SWA + Mamba modes (None otherwise; left out of to_dict then)
    mamba_states: object = None           # N, the state pool asked for
    mamba_pool_slots: object = None       # state slots actually allocated (<= N)
    mamba_chunk: object = None            # mamba_cache_chunk_size
    mamba_extra_buffer: object = None     # bool: served with the extra buffer (ping-pong)
    mamba_evicted_states: object = None   # EvictResult.mamba_num_evicted, summed
    checkpoint_lost_hit_tokens: object = None  # sum of full_kv_hit_length - device_prefix_len
                                               # (SWA + Mamba: - the deepest state on the path;
                                               # host tier: - the hit and declined host hit)
    mamba_waits: object = None            # completions waited for because no state slot was free
    peak_mamba_tree_states: object = None  # states the tree held at most (after completions;
                                           # extra buffer: and checkpoints)
    final_mamba_tree_states: object = None
    # host tier mode (None otherwise; left out of to_dict then). hit_tokens and
    # token_hit_ratio count both tiers there: device_hit_tokens + host_hit_tokens
    host_capacity: object = None          # H, tokens (or "inf")
    host_pool_slots: object = None        # host pool size actually used (<= H)
    write_policy: object = None           # write_through / write_through_selective
    load_back_threshold: object = None    # host hits below this are recomputed
    device_hit_tokens: object = None      # prompt tokens found on the device
    host_hit_tokens: object = None        # prompt tokens loaded back from the host
    miss_tokens: object = None            # prompt tokens computed (prompt - both hits)
    device_hit_ratio: object = None       # device_hit_tokens / prompt_tokens
    host_hit_ratio: object = None         # host_hit_tokens / prompt_tokens
    load_backs: object = None             # loads committed (served requests' and rejected)
    loaded_tokens: object = None          # tokens loaded back (host hits + rejected requests')
    declined_host_tokens: object = None   # host hits not loaded (below the threshold, or
                                          # no device slots): recomputed
    load_evicted_tokens: object = None    # device tokens init_load_back evicted (in
                                          # evicted_tokens too)
    peak_host_tree_tokens: object = None  # host tokens the tree held at most
    final_host_tree_tokens: object = None
    backed_up_tokens: object = None       # Full tokens copied to the host (backups)
    host_evicted_tokens: object = None    # Full host tokens freed (host evictions, and the
                                          # host copies of nodes deleted with them)
    # host tier with the SWA mode (None otherwise; left out of to_dict then)
    swa_host_pool_slots: object = None    # SWA host pool (tokens) actually used
    swa_backed_up_tokens: object = None   # SWA tokens copied to the host
    swa_host_loaded_tokens: object = None  # SWA tokens loaded back (the windows restored)
    swa_host_evicted_tokens: object = None  # SWA host tokens freed
    load_swa_evicted_tokens: object = None  # SWA device tokens the loads evicted (in
                                            # swa_evicted_tokens too)
    peak_swa_host_tree_tokens: object = None  # SWA host tokens the tree held at most
    final_swa_host_tree_tokens: object = None
    # host tier with the Mamba mode (None otherwise; left out of to_dict then)
    mamba_host_pool_slots: object = None  # host state pool (states) actually used
    backed_up_states: object = None       # states copied to the host
    host_state_loads: object = None       # loads that restored a state from the host
    host_evicted_states: object = None    # host states freed
    load_evicted_states: object = None    # device states the loads evicted (in
                                          # mamba_evicted_states too)
    peak_host_tree_states: object = None  # host states the tree held at most
    final_host_tree_states: object = None

    def to_dict(self):
        d = asdict(self)
        d.pop("hits")
        d.pop("per_request")
        for mode in (SWA_MODE, MAMBA_MODE, HOST_MODE):
            if getattr(self, mode.param) is None:
                for k in mode.fields:
                    d.pop(k)
        for fields, param in ((HOST_SWA_FIELDS, "swa_window"), (HOST_MAMBA_FIELDS, "mamba_states")):
            if self.host_capacity is None or getattr(self, param) is None:
                for k in fields:
                    d.pop(k)
        return d


#: ``ReplayResult`` fields of the SWA mode.
SWA_FIELDS = ("swa_window", "swa_ratio", "swa_pool_slots", "swa_evicted_tokens",
              "window_lost_hit_tokens", "swa_slid_tokens", "peak_swa_tree_tokens",
              "final_swa_tree_tokens")
#: ``ReplayResult`` fields of the Mamba mode.
MAMBA_FIELDS = ("mamba_states", "mamba_pool_slots", "mamba_chunk", "mamba_extra_buffer",
                "mamba_evicted_states",
                "checkpoint_lost_hit_tokens", "mamba_waits", "peak_mamba_tree_states",
                "final_mamba_tree_states")
#: ``ReplayResult`` fields of the host tier mode.
HOST_FIELDS = ("host_capacity", "host_pool_slots", "write_policy", "load_back_threshold",
               "device_hit_tokens", "host_hit_tokens", "miss_tokens", "device_hit_ratio",
               "host_hit_ratio", "load_backs", "loaded_tokens", "declined_host_tokens",
               "load_evicted_tokens", "peak_host_tree_tokens", "final_host_tree_tokens",
               "backed_up_tokens", "host_evicted_tokens")
#: ``ReplayResult`` fields of the host tier with the SWA mode.
HOST_SWA_FIELDS = ("swa_host_pool_slots", "swa_backed_up_tokens", "swa_host_loaded_tokens",
                   "swa_host_evicted_tokens", "load_swa_evicted_tokens",
                   "peak_swa_host_tree_tokens", "final_swa_host_tree_tokens")
#: ``ReplayResult`` fields of the host tier with the Mamba mode.
HOST_MAMBA_FIELDS = ("mamba_host_pool_slots", "backed_up_states", "host_state_loads",
                     "host_evicted_states", "load_evicted_states", "peak_host_tree_states",
                     "final_host_tree_states")


@dataclass(frozen=True)
class HybridMode:
    """What reports need to know of a hybrid mode: ``params`` the ``replay``
    arguments (and ``ReplayResult`` fields) set in that mode, one of which a
    series of runs varies (``param``: the first); ``labels`` their names in
    tables and plots (``label``: the first); ``lost`` the fields of the hit
    tokens the mode loses (Full KV cached, unusable); ``evicted`` the fields of
    its own evictions; ``fields`` all its ``ReplayResult`` fields;
    ``per_request`` its per-request arrays (``record_requests``)."""

    name: str
    params: tuple
    labels: tuple
    lost: tuple
    evicted: tuple
    fields: tuple
    per_request: tuple
    #: a host tier mode over a hybrid model: that model's mode (SWA, Mamba, SWA + Mamba)
    base: object = None

    @property
    def param(self):
        return self.params[0]

    @property
    def host(self):
        """Whether the mode drives the host tier (``host_capacity`` set)."""
        return "host_capacity" in self.params

    @property
    def label(self):
        return self.labels[0]


SWA_MODE = HybridMode("swa", ("swa_window",), ("W",), ("window_lost_hit_tokens",),
                      ("swa_evicted_tokens",), SWA_FIELDS,
                      ("swa_evicted_tokens", "full_kv_hit_tokens", "window_lost_hit_tokens"))
MAMBA_MODE = HybridMode("mamba", ("mamba_states",), ("states",),
                        ("checkpoint_lost_hit_tokens",), ("mamba_evicted_states",),
                        MAMBA_FIELDS, ("mamba_evicted_states", "full_kv_hit_tokens",
                                       "checkpoint_lost_hit_tokens"))
#: The SWA + Mamba mode: both modes' fields (a series varies the window or the
#: state pool, not both).
SWA_MAMBA_MODE = HybridMode(
    "swa+mamba", ("swa_window", "mamba_states"), ("W", "states"),
    ("window_lost_hit_tokens", "checkpoint_lost_hit_tokens"),
    ("swa_evicted_tokens", "mamba_evicted_states"), SWA_FIELDS + MAMBA_FIELDS,
    ("swa_evicted_tokens", "mamba_evicted_states", "full_kv_hit_tokens",
     "window_lost_hit_tokens", "checkpoint_lost_hit_tokens"))
#: The host tier mode (HiCache): a series varies the host pool; it loses no hit
#: (``lost`` and ``evicted`` empty: its own figures are the hits per tier).
HOST_MODE = HybridMode("host", ("host_capacity",), ("host",), (), (), HOST_FIELDS,
                       ("device_hit_tokens", "host_hit_tokens", "miss_tokens",
                        "host_match_tokens", "declined_host_tokens"))


def _host_over(base, host_fields):
    """The host tier mode over the hybrid model ``base``: a series varies the host
    pool (the window and state pool are fixed); both modes' figures."""
    return HybridMode("host+" + base.name, ("host_capacity",) + base.params,
                      ("host",) + base.labels, base.lost, base.evicted,
                      HOST_FIELDS + base.fields + host_fields,
                      HOST_MODE.per_request + base.per_request, base)


HOST_SWA_MODE = _host_over(SWA_MODE, HOST_SWA_FIELDS)
HOST_MAMBA_MODE = _host_over(MAMBA_MODE, HOST_MAMBA_FIELDS)
HOST_SWA_MAMBA_MODE = _host_over(SWA_MAMBA_MODE, HOST_SWA_FIELDS + HOST_MAMBA_FIELDS)
#: Most params first: a run matches the first mode whose params it all sets.
HYBRID_MODES = (HOST_SWA_MAMBA_MODE, HOST_SWA_MODE, HOST_MAMBA_MODE, SWA_MAMBA_MODE, SWA_MODE,
                MAMBA_MODE, HOST_MODE)


def hybrid_mode(run):
    """The :class:`HybridMode` of a ``ReplayResult`` or of a sweep point (dict) (the
    host tier modes' too: :data:`HOST_MODE`, and over a hybrid model
    :data:`HOST_SWA_MODE`, :data:`HOST_MAMBA_MODE`, :data:`HOST_SWA_MAMBA_MODE`),
    or ``None`` for a Full-only run."""
    for mode in HYBRID_MODES:   # the modes with most params first
        get = run.get if isinstance(run, dict) else lambda k: getattr(run, k)
        if all(get(p) is not None for p in mode.params):
            return mode
    return None


def _latency(samples_ns):
    a = np.asarray(samples_ns, dtype=np.int64)
    if a.size == 0:
        return {"count": 0, "p50": None, "p99": None, "mean": None}
    p50, p99 = np.percentile(a, [50, 99]) / 1e3
    return {"count": int(a.size), "p50": round(float(p50), 2), "p99": round(float(p99), 2),
            "mean": round(float(a.mean()) / 1e3, 2)}


_warm = set()


def warm_up(swa=False, notice=False, mamba=False, extra=False, host=False):
    """Compile (or load from Numba's cache) every kernel the replay calls, once per
    process (and once more for the SWA mode when ``swa``, for the Mamba mode when
    ``mamba``, with the extra buffer when ``extra`` too, for the SWA + Mamba mode
    when both, for the host tier mode when ``host``), so the timed loop measures the
    cache and not the JIT. When it compiles, one line on stderr says so and how long
    it took (``flatradix._compile_notice``; ``notice`` is kept for callers and
    ignored). Returns seconds."""
    kind = ("swa+mamba" if swa and mamba else "swa" if swa else
            ("mamba+extra" if extra else "mamba") if mamba else "full")
    if host:
        kind = "host" if kind == "full" else "host+" + kind
    if kind in _warm:
        return 0.0
    from .._compile_notice import phase
    from .trace import Workload

    with phase(f" for the {kind.replace('+', ' + ')} replay"):
        return _warm_up(kind, swa, Workload)


def _warm_up(kind, swa, Workload):
    t = time.perf_counter()
    _warm.add(kind)
    tiny = Workload("warm-up", 4, np.zeros(4), np.array([8, 10, 7, 4], dtype=np.int64),
                    np.full(4, 2, dtype=np.int64), np.array([0, 2, 5, 7, 8], dtype=np.int64),
                    np.array([0, 1, 0, 1, 2, 0, 3, 4], dtype=np.int64))
    if kind == "host":
        # r0 [0,1], r1 [2,3], r2 = r0 (8 tokens + 1 each), a pool of 10, one at a time:
        # r1 demotes r0's prefix, r2 loads it back (demoting r1's); with a host of 12,
        # r1's backup evicts r0's host copy first
        two = Workload("warm-up", 4, np.zeros(3), np.full(3, 8, dtype=np.int64),
                       np.ones(3, dtype=np.int64), np.array([0, 2, 4, 6], dtype=np.int64),
                       np.array([0, 1, 2, 3, 0, 1], dtype=np.int64))
        for h in (16, 12):
            replay(two, capacity=10, page_size=1, host_capacity=h, load_back_threshold=1)
    elif kind.startswith("host+"):
        # the same over the hybrid model: loads restore the windows / states too
        two = Workload("warm-up", 4, np.zeros(3), np.full(3, 8, dtype=np.int64),
                       np.ones(3, dtype=np.int64), np.array([0, 2, 4, 6], dtype=np.int64),
                       np.array([0, 1, 2, 3, 0, 1], dtype=np.int64))
        kw = {}
        if "swa" in kind:
            kw.update(swa_window=2, swa_ratio=1.0, swa_eviction_interval=1)
        if "mamba" in kind:
            kw.update(mamba_states=2)
        for h in (16, 12):
            for policy in ("write_through", "write_back"):
                replay(two, capacity=10, page_size=1, host_capacity=h, load_back_threshold=1,
                       write_policy=policy, **kw)
    elif kind == "swa+mamba":
        replay(tiny, capacity=16, page_size=1, max_running=2, swa_window=2, swa_ratio=0.5,
               swa_eviction_interval=1, mamba_states=1)
    elif kind == "swa":
        replay(tiny, capacity=16, page_size=1, max_running=2, swa_window=2, swa_ratio=0.5,
               swa_eviction_interval=1)
    elif kind == "mamba":
        replay(tiny, capacity=16, page_size=1, max_running=2, mamba_states=1)
    elif kind == "mamba+extra":
        # chunk 2: the prefills track, checkpoints donate, decodes track
        replay(tiny, capacity=16, page_size=1, max_running=2, mamba_states=8, mamba_chunk=2,
               mamba_extra_buffer=True)
    else:
        for driver in ("request", "core"):
            replay(tiny, capacity=16, page_size=1, max_running=2, driver=driver)
    return time.perf_counter() - t


def unbounded_pool_slots(workload, max_running, cache_outputs=False):
    """KV slots that an unbounded run can never exceed.

    Tree: at most ``distinct_prefix_blocks * block_size`` prompt tokens (plus
    every output token with ``cache_outputs``); in flight: at most the
    ``max_running`` largest requests (prompt + output) at once.
    """
    if len(workload) == 0:
        return 1
    tree = workload.distinct_prefix_blocks() * workload.block_size
    if cache_outputs:
        tree += workload.output_tokens
    sizes = workload.input_lengths + workload.output_lengths
    k = min(int(max_running), sizes.size)
    inflight = int(sizes.max()) if k == 1 else int(np.sort(sizes)[sizes.size - k:].sum())
    return max(1, tree + inflight)


def _nice_interval(span_ms):
    """A round bucket width (ms) giving at most ~20 buckets over ``span_ms``."""
    raw = max(span_ms / 20.0, 1.0)
    scale = 10.0 ** np.floor(np.log10(raw))
    for m in (1, 2, 5, 10):
        if m * scale >= raw:
            return float(m * scale)
    return float(10 * scale)


def _pcts_ms(a):
    if a.size == 0:
        return {"p50": None, "p99": None, "max": None, "mean": None}
    p50, p99 = np.percentile(a, [50, 99])
    return {"p50": round(float(p50), 1), "p99": round(float(p99), 1),
            "max": round(float(a.max()), 1), "mean": round(float(a.mean()), 1)}


def timeline(arrive_ms, decide_ms, end_ms, served, interval_ms):
    """Concurrency over time of an arrival-mode run, in buckets of ``interval_ms``.

    ``arrive_ms``, ``decide_ms`` (admission, or rejection), ``end_ms``: float
    ``(requests,)``; ``served``: bool ``(requests,)``. A served request runs over
    ``[decide, end)``; a request waits over ``[arrive, decide)``.

    Returns ``(buckets, peak_running, mean_running)``: one dict per bucket with
    ``t_s`` (bucket start, s), ``arrivals``, ``rejected``, ``waited`` (requests
    arriving in the bucket that waited), ``running_max``, ``running_mean``
    (time-weighted), ``queued_max``, ``wait_ms_max``; the peak and the
    time-weighted mean of running requests over the whole run.
    """
    t0 = float(arrive_ms.min())
    t_end = float(max(decide_ms.max(), end_ms[served].max() if served.any() else t0))
    holds = served & (end_ms > decide_ms)

    def steps(up, down):
        # events sorted by time, decrements first at equal times; value after each
        t = np.concatenate((down, up))
        d = np.concatenate((np.full(down.size, -1), np.full(up.size, 1)))
        order = np.lexsort((d, t))
        t, v = t[order], np.cumsum(d[order])
        integral = np.concatenate(([0.0], np.cumsum(v[:-1] * np.diff(t)))) if t.size else t
        return t, v, integral

    def value_at(st, x):
        t, v, _ = st
        k = np.searchsorted(t, x, side="right") - 1
        return np.where(k >= 0, v[np.maximum(k, 0)] if v.size else 0, 0)

    def area(st, x):
        t, v, integral = st
        if t.size == 0:
            return np.zeros_like(x)
        k = np.searchsorted(t, x, side="right") - 1
        kk = np.maximum(k, 0)
        return np.where(k >= 0, integral[kk] + v[kk] * (x - t[kk]), 0.0)

    run = steps(decide_ms[holds], end_ms[holds])
    wait = decide_ms > arrive_ms
    que = steps(arrive_ms[wait], decide_ms[wait])
    width = float(interval_ms)
    nb = max(1, int(np.ceil((t_end - t0) / width)) if t_end > t0 else 1)
    edges = t0 + width * np.arange(nb + 1)
    bucket_of = np.minimum(((arrive_ms - t0) // width).astype(np.int64), nb - 1)
    rejected = ~served
    wait_ms = decide_ms - arrive_ms
    run_area = area(run, edges)
    buckets = []
    for b in range(nb):
        a, z = edges[b], edges[b + 1]

        def peak(st):
            t, v, _ = st
            lo, hi = np.searchsorted(t, a, side="right"), np.searchsorted(t, z, side="left")
            m = int(value_at(st, np.array([a]))[0])
            return max(m, int(v[lo:hi].max())) if hi > lo else m

        mine = bucket_of == b
        buckets.append({
            "t_s": round(float(a - t0) / 1e3, 3), "arrivals": int(mine.sum()),
            "rejected": int((mine & rejected).sum()), "waited": int((mine & wait).sum()),
            "running_max": peak(run),
            "running_mean": round(float(run_area[b + 1] - run_area[b]) / width, 2),
            "queued_max": peak(que),
            "wait_ms_max": round(float(wait_ms[mine].max()), 1) if mine.any() else 0.0,
        })
    span = t_end - t0
    mean = float(area(run, np.array([t_end]))[0]) / span if span > 0 else 0.0
    peak_all = int(run[1].max()) if run[1].size else 0
    return buckets, peak_all, round(mean, 2)


def replay(workload, capacity=None, page_size=16, max_running=None, policy="lru",
           cache_outputs=False, cache_factory=None, driver="request", progress=False,
           record_hits=False, check=True, arrival=None, record_requests=False, swa_window=None,
           swa_ratio=None, swa_eviction_interval=SWA_EVICTION_INTERVAL, mamba_states=None,
           mamba_chunk=None, mamba_extra_buffer=False, host_capacity=None, write_policy=None,
           load_back_threshold=None, swa_host_capacity=None, mamba_host_states=None):
    """Replay ``workload`` through a cache; returns a :class:`ReplayResult`.

    Parameters
    ----------
    workload : Workload
    capacity : int or None
        KV slots of the pool (tokens). ``None`` (or ``math.inf``): unbounded.
        The pool gets ``min(capacity, unbounded_pool_slots(...))`` slots: more
        than the workload can use changes nothing (``pool_slots`` says what
        was allocated).
    page_size, policy : the cache's ``page_size`` and ``eviction_policy``.
    max_running : int >= 1 or None
        Requests in flight at once. ``None``: 1 in the order mode,
        :data:`ARRIVAL_MAX_RUNNING` in the arrival mode.
    cache_outputs : bool
        Also insert each request's output tokens (fresh ids, never matched).
    cache_factory : callable, optional
        ``f(page_size, eviction_policy, token_to_kv_pool_allocator,
        req_to_token_pool) -> cache``; default ``flatradix.UnifiedRadixCache``.
    driver : {"request", "core"}
        How completions are cached (module docstring).
    progress : bool
        tqdm bar on stderr (shown only when stderr is a TTY and tqdm is installed).
    record_hits : bool
        Keep the per-request hit lengths in ``ReplayResult.hits``.
    check : bool
        After the run, verify KV conservation (allocator available + evictable +
        protected == pool, nothing protected; the same for the SWA pool and
        for the Mamba state pool in those modes; in the host tier modes every
        host pool: available + held by the tree == pool) and call ``sanity_check()``
        when the cache has one; ``AssertionError`` if it fails.
    arrival : ArrivalModel or None
        ``None``: the order mode; else the arrival mode (module docstring). Its
        result's ``arrival`` dict holds the model's parameters, ``span_s``,
        ``peak_running``, ``mean_running``, ``waited_requests``, ``wait_ms``
        (p50 / p99 / max / mean over all requests), ``kv_waits`` (completions
        waited for because KV was short: ``waits``), ``slot_waits`` (completions
        waited for because ``max_running`` requests were running),
        ``interval_s`` and ``timeline`` (see :func:`timeline`).
    record_requests : bool
        Keep per-request arrays in ``ReplayResult.per_request``: ``arrival_ms``
        (timestamp / rate scale), ``prompt_tokens``, ``output_tokens``,
        ``hit_tokens`` (0 when rejected), ``evicted_tokens`` (evicted to admit
        it), ``waited`` (completions it waited for), ``wait_ms`` and
        ``finish_ms`` (arrival mode; NaN otherwise), ``rejected`` (bool); SWA
        mode also ``swa_evicted_tokens`` (SWA tokens evicted to admit it),
        ``full_kv_hit_tokens`` (its match's ``full_kv_hit_length``; 0 when
        rejected) and ``window_lost_hit_tokens`` (that minus the hit); Mamba
        mode ``mamba_evicted_states`` (states evicted to admit it),
        ``full_kv_hit_tokens`` (of its ``prompt[:-1]`` match) and
        ``checkpoint_lost_hit_tokens``; SWA + Mamba mode all five
        (``swa_evicted_tokens``, ``mamba_evicted_states``,
        ``full_kv_hit_tokens``, ``window_lost_hit_tokens``,
        ``checkpoint_lost_hit_tokens``; the two lost add up to the full hit
        minus the hit).
    swa_window : int >= 1 or None
        The SWA mode's sliding window ``W`` in tokens (module docstring);
        ``None``: a Full-only model. With ``mamba_states``: the SWA + Mamba
        mode.
    swa_ratio : float in (0, 1] or None
        SWA mode: SWA pool / Full pool (SGLang's ``swa_full_tokens_ratio``);
        ``None``: :data:`DEFAULT_SWA_RATIO`. The SWA pool is
        :func:`swa_pool_slots` tokens.
    swa_eviction_interval : int >= 1
        SWA mode: tokens that slide out of a running request's window before the
        scheduler calls ``evict_sliding_windows`` (default 128, SGLang's).
    mamba_states : int >= 1 or None
        The Mamba mode's state pool ``N`` (module docstring); ``None``: no
        Mamba layers. The pool gets ``min(N, requests)`` slots (no run uses
        more: ``mamba_pool_slots``). With ``swa_window``: the SWA + Mamba mode
        (page size 1, both modes' options and figures).
    mamba_chunk : int in [1, MAX_MAMBA_CHUNK] or None
        Mamba mode: the cache's ``mamba_cache_chunk_size`` (``None``:
        :data:`DEFAULT_MAMBA_CHUNK`, SGLang's 64); without the extra buffer it
        only moves ``MatchResult.mamba_branching_seqlen``; with it, the
        checkpoint grid is ``lcm(mamba_chunk, page_size)``.
    mamba_extra_buffer : bool
        Mamba mode: serve with SGLang's Mamba extra buffer (module docstring):
        any ``page_size``, 3 state slots per running request (``mamba_states``
        at least :data:`EXTRA_BUFFER_MIN_STATES`), prefill and decode states
        tracked on the grid, a ``checkpoint`` after each prefill, and
        ``release_kv_cache``. The pool gets ``min(N, 4 x requests)`` slots. Not
        with ``swa_window``.
    host_capacity : int >= 0, math.inf or None
        The host tier mode's host pool ``H`` in tokens (module docstring);
        ``None``: no host tier; ``math.inf``: as large as the workload can
        use. The pool gets ``min(H, distinct prefix tokens)`` slots
        (``host_pool_slots``; with ``cache_outputs`` plus the output tokens).
        With ``swa_window`` / ``mamba_states``: the host tier over that hybrid
        model (not with ``mamba_extra_buffer``).
    write_policy : str or None
        Host tier mode: ``"write_through"`` (the default),
        ``"write_through_selective"`` or ``"write_back"``.
    load_back_threshold : int >= 0 or None
        Host tier mode: host hits of fewer tokens are recomputed, not loaded
        (``None``: :data:`DEFAULT_LOAD_BACK_THRESHOLD`, SGLang's 10).
    swa_host_capacity : int >= 1 or None
        Host tier over the SWA mode: the SWA host pool in tokens; ``None``: SGLang's
        sizing, ``swa_ratio x host_capacity`` in whole pages (:func:`host_aux_slots`;
        at most what the workload can use: ``swa_host_pool_slots``).
    mamba_host_states : int >= 1 or None
        Host tier over the Mamba mode: the host state pool; ``None``: SGLang's
        sizing, ``mamba_states x host_capacity / capacity`` states, at least 1
        (at most one a request: ``mamba_host_pool_slots``).

    With ``record_requests`` the host tier mode adds ``device_hit_tokens``,
    ``host_hit_tokens`` (loaded back; ``hit_tokens`` is their sum),
    ``miss_tokens`` (prompt - hit; the whole prompt when rejected) and
    ``host_match_tokens`` (its match's ``host_hit_length``: loaded, or declined)
    and ``declined_host_tokens`` (those of a declined load); over a hybrid model
    the hybrid mode's arrays too, its lost hits measured from the hit plus the
    declined tokens.

    Raises ``ValueError`` for an invalid option (also: SWA options without
    ``swa_window``, Mamba options without ``mamba_states``, host tier options
    without ``host_capacity``, the ``"core"`` driver in a hybrid or host tier
    mode, a Mamba page size other than 1 without the extra buffer, the extra
    buffer with ``swa_window`` or fewer than 4 states, an SWA pool below one
    page, ``host_capacity`` with ``mamba_extra_buffer``, ``swa_host_capacity`` /
    ``mamba_host_states`` without ``host_capacity`` or without their mode, or
    below 1), ``TypeError`` for a non-int window, state
    count, host capacity, threshold, SWA host capacity or host state count or a
    non-bool ``mamba_extra_buffer``, and
    ``MemoryError`` when the pools cannot be allocated.
    """
    if driver not in ("request", "core"):
        raise ValueError(f"driver must be 'request' or 'core', got {driver!r}")
    swa = swa_window is not None
    if swa:
        if isinstance(swa_window, bool) or not isinstance(swa_window, (int, np.integer)):
            raise TypeError(f"swa_window must be an int, got {type(swa_window).__name__}")
        swa_window = int(swa_window)
        if not 1 <= swa_window <= MAX_SWA_WINDOW:
            raise ValueError(f"swa_window must be in [1, {MAX_SWA_WINDOW}] tokens, got "
                             f"{swa_window}")
        swa_ratio = DEFAULT_SWA_RATIO if swa_ratio is None else swa_ratio
        if isinstance(swa_ratio, bool) or not isinstance(swa_ratio, (int, float, np.number)) \
                or not 0 < float(swa_ratio) <= 1:
            raise ValueError(f"swa_ratio must be a number in (0, 1], got {swa_ratio!r}")
        swa_ratio = float(swa_ratio)
        if isinstance(swa_eviction_interval, bool) or not isinstance(
                swa_eviction_interval, (int, np.integer)) or swa_eviction_interval < 1:
            raise ValueError(f"swa_eviction_interval must be an int >= 1, got "
                             f"{swa_eviction_interval!r}")
        swa_eviction_interval = int(swa_eviction_interval)
        if driver != "request":
            raise ValueError("the SWA mode (swa_window) needs driver='request' (the request "
                             "path moves the SWA cursor)")
    elif swa_ratio is not None:
        raise ValueError("swa_ratio needs swa_window (the SWA mode)")
    if not isinstance(mamba_extra_buffer, (bool, np.bool_)):
        raise TypeError(f"mamba_extra_buffer must be a bool, got "
                        f"{type(mamba_extra_buffer).__name__}")
    extra = bool(mamba_extra_buffer)
    mamba = mamba_states is not None
    if extra and not mamba:
        raise ValueError("mamba_extra_buffer needs mamba_states (the Mamba mode)")
    if extra and swa:
        raise ValueError("mamba_extra_buffer with swa_window: the SWA + Mamba replay runs "
                         "without the extra buffer only (page 1); drop one of the two")
    if mamba:
        if isinstance(mamba_states, bool) or not isinstance(mamba_states, (int, np.integer)):
            raise TypeError(f"mamba_states must be an int, got {type(mamba_states).__name__}")
        mamba_states = int(mamba_states)
        if mamba_states < 1:
            raise ValueError(f"mamba_states must be >= 1 (state slots), got {mamba_states}")
        mamba_chunk = DEFAULT_MAMBA_CHUNK if mamba_chunk is None else mamba_chunk
        if isinstance(mamba_chunk, bool) or not isinstance(mamba_chunk, (int, np.integer)) \
                or not 1 <= mamba_chunk <= MAX_MAMBA_CHUNK:
            raise ValueError(f"mamba_chunk must be an int in [1, {MAX_MAMBA_CHUNK}], got "
                             f"{mamba_chunk!r}")
        mamba_chunk = int(mamba_chunk)
        if extra and mamba_states < EXTRA_BUFFER_MIN_STATES:
            raise ValueError(f"mamba_extra_buffer needs mamba_states >= "
                             f"{EXTRA_BUFFER_MIN_STATES} (a running request holds "
                             f"{EXTRA_BUFFER_REQ_STATES} state slots, its own and 2 ping-pong "
                             f"track slots, and its checkpoint swaps a fresh one in), got "
                             f"{mamba_states}")
        if not extra and int(page_size) != 1:
            raise ValueError(f"the Mamba mode (mamba_states) needs page_size=1 (SGLang serves "
                             f"Mamba hybrids without the extra buffer at page 1; "
                             f"mamba_extra_buffer=True takes any page size), got {page_size}")
        if driver != "request":
            raise ValueError("the Mamba mode (mamba_states) needs driver='request' (the request "
                             "path donates the state)")
    elif mamba_chunk is not None:
        raise ValueError("mamba_chunk needs mamba_states (the Mamba mode)")
    host = host_capacity is not None
    if host:
        if extra:
            raise ValueError("host_capacity (the host tier) with mamba_extra_buffer: the replay "
                             "drives the host tier of the Mamba mode without the extra buffer "
                             "only (page 1); drop one of the two")
        if isinstance(host_capacity, bool) or not isinstance(
                host_capacity, (int, np.integer, float)) or (
                isinstance(host_capacity, float) and host_capacity != math.inf):
            raise TypeError(f"host_capacity must be an int (tokens) or math.inf, got "
                            f"{host_capacity!r}")
        if host_capacity < 0:
            raise ValueError(f"host_capacity must be >= 0 tokens, got {host_capacity}")
        write_policy = DEFAULT_WRITE_POLICY if write_policy is None else write_policy
        if write_policy not in HOST_WRITE_POLICIES:
            raise ValueError(f"write_policy must be one of {', '.join(HOST_WRITE_POLICIES)}, "
                             f"got {write_policy!r}")
        load_back_threshold = (DEFAULT_LOAD_BACK_THRESHOLD if load_back_threshold is None
                               else load_back_threshold)
        if isinstance(load_back_threshold, bool) or not isinstance(load_back_threshold,
                                                                   (int, np.integer)):
            raise TypeError(f"load_back_threshold must be an int, got "
                            f"{type(load_back_threshold).__name__}")
        load_back_threshold = int(load_back_threshold)
        if not 0 <= load_back_threshold <= MAX_LOAD_BACK_THRESHOLD:
            raise ValueError(f"load_back_threshold must be in [0, {MAX_LOAD_BACK_THRESHOLD}] "
                             f"tokens, got {load_back_threshold}")
        if driver != "request":
            raise ValueError("the host tier mode (host_capacity) needs driver='request' (the "
                             "core driver's caches have no host tier)")
        for given, what, mode_on, mode in (
                (swa_host_capacity, "swa_host_capacity", swa, "swa_window (the SWA mode)"),
                (mamba_host_states, "mamba_host_states", mamba,
                 "mamba_states (the Mamba mode)")):
            if given is None:
                continue
            if not mode_on:
                raise ValueError(f"{what} needs {mode}")
            if isinstance(given, bool) or not isinstance(given, (int, np.integer)):
                raise TypeError(f"{what} must be an int, got {type(given).__name__}")
            if not 1 <= int(given) <= MAX_HOST_AUX:
                raise ValueError(f"{what} must be in [1, {MAX_HOST_AUX}] (the cache's host "
                                 f"pool needs a slot), got {int(given)}")
    else:
        for given, what in ((write_policy, "write_policy"),
                            (load_back_threshold, "load_back_threshold"),
                            (swa_host_capacity, "swa_host_capacity"),
                            (mamba_host_states, "mamba_host_states")):
            if given is not None:
                raise ValueError(f"{what} needs host_capacity (the host tier mode)")
    hybrid = swa or mamba
    timed = arrival is not None
    if timed and not isinstance(arrival, ArrivalModel):
        raise TypeError(f"arrival must be an ArrivalModel or None, got {type(arrival).__name__}")
    if max_running is None:
        max_running = ARRIVAL_MAX_RUNNING if timed else 1
    max_running = int(max_running)
    if max_running < 1:
        raise ValueError(f"max_running must be >= 1, got {max_running}")
    page_size = int(page_size)
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    if timed and not getattr(workload, "has_timestamps", True):
        raise ValueError(f"{workload.name}: the arrival mode needs timestamps, and this trace "
                         f"has none")
    n_req = len(workload)
    notes = []
    unbounded = capacity is None or capacity == float("inf")
    bound = unbounded_pool_slots(workload, max_running, cache_outputs)
    if unbounded:
        slots = bound
    else:
        if int(capacity) < 1:
            raise ValueError(f"capacity must be >= 1 token, got {capacity}")
        slots = min(int(capacity), bound)
        if slots < int(capacity):
            notes.append(f"pool sized to {slots:,} tokens: this workload can never use more, "
                         f"so {int(capacity):,} tokens gives the same run")
    swa_slots = None
    if swa:
        swa_slots = swa_pool_slots(None if unbounded else int(capacity), swa_ratio, page_size,
                                   bound)
    m_slots = None
    if extra:
        # each request allocates 3 states at admission and one at its checkpoint: a
        # pool of 4 per request never runs short
        m_slots = max(EXTRA_BUFFER_MIN_STATES, min(mamba_states, 4 * n_req))
        if m_slots < mamba_states:
            notes.append(f"state pool sized to {m_slots:,} states: this workload can never "
                         f"use more (4 a request)")
    elif mamba:
        # each request allocates one state, so no run uses more than one per request
        m_slots = max(1, min(mamba_states, n_req))
        if m_slots < mamba_states:
            notes.append(f"state pool sized to {m_slots:,} state{'' if m_slots == 1 else 's'}: "
                         f"this workload can never use more")
    h_slots = None
    if host:
        # the tree never holds more distinct tokens than the prompts' distinct prefixes
        # (and the outputs, when cached): a host pool beyond that gives the same run
        h_bound = workload.distinct_prefix_blocks() * workload.block_size + (
            workload.output_tokens if cache_outputs else 0)
        h_slots = h_bound if host_capacity == math.inf else min(int(host_capacity), h_bound)
        if host_capacity != math.inf and h_slots < int(host_capacity):
            notes.append(f"host pool sized to {h_slots:,} tokens: this workload can never use "
                         f"more, so {int(host_capacity):,} tokens gives the same run")
    swa_h_slots = mh_slots = None
    if host and (swa or mamba):
        swa_h_slots, mh_slots = host_aux_slots(
            workload, host_capacity, None if unbounded else int(capacity), slots, page_size,
            swa_ratio if swa else None, mamba_states if mamba else None, swa_host_capacity,
            mamba_host_states, cache_outputs, notes)
    from .._compile_notice import phase

    with phase(" for this replay"):     # one stderr line when it compiles
        warmup_s = warm_up()
        if hybrid or host:
            warmup_s += warm_up(swa=swa, mamba=mamba, extra=extra, host=host)
    longest = int((workload.input_lengths + workload.output_lengths).max()) if n_req else 1
    if swa:
        alloc = SWATokenToKVPoolAllocator(slots, swa_slots, page_size=page_size)
        a_avail = alloc.full_available_size
        s_avail = alloc.swa_available_size
    else:
        alloc = TokenToKVPoolAllocator(slots)
        a_avail = alloc.available_size
    rows = max(1, min(max_running, n_req))
    if mamba:
        req_pool = HybridReqToTokenPool(rows, max(longest, 1), mamba_size=m_slots,
                                        enable_mamba_extra_buffer=extra)
        m_alloc, m_free = req_pool.mamba_allocator.alloc, req_pool.mamba_allocator.free
        m_avail = req_pool.mamba_allocator.available_size
    else:
        req_pool = ReqToTokenPool(rows, max(longest, 1))
    factory = cache_factory or default_cache_factory
    fkw = {}
    if swa:
        fkw["sliding_window_size"] = swa_window
    if mamba:
        fkw["mamba_cache_chunk_size"] = mamba_chunk
    if extra:
        fkw["enable_mamba_extra_buffer"] = True
    cache = factory(page_size, policy, alloc, req_pool, **fkw)
    if host:
        if not hasattr(cache, "init_hicache"):
            raise ValueError("the host tier mode needs a cache with init_hicache "
                             "(flatradix.UnifiedRadixCache)")
        # every copy the tree asks for, counted per kind (no bytes move): the units
        # backed up and loaded of each component
        moved = collections.Counter()

        def count_copies(kind, device_indices, host_indices):
            moved[kind] += len(host_indices)

        hkw = {}
        if swa:
            hkw["swa_host_size"] = swa_h_slots
        if mamba:
            hkw["mamba_host_size"] = mh_slots
        cache.init_hicache(host_size=h_slots, hicache_write_policy=write_policy,
                           load_back_threshold=load_back_threshold, transfer=count_copies,
                           **hkw)
        host_pool = cache.mem_pool_host
    table = req_pool.req_to_token
    use_req = driver == "request"

    # hot-loop locals
    pc = time.perf_counter_ns
    match = cache.match_prefix
    # a hybrid cache's lock is a TreeLock (its release replays the receipt)
    lock = cache.lock if hybrid else cache.inc_lock_ref
    unlock = cache.unlock if hybrid else cache.dec_lock_ref
    evict = cache.evict
    evict_for_alloc = cache.evict_for_alloc if hybrid else None
    slide = cache.evict_sliding_windows if swa else None
    insert = cache.insert
    finished = (cache.release_kv_cache if extra else cache.cache_finished_req) if use_req \
        else None
    ckpt = cache.checkpoint if extra else None
    alloc_mamba = req_pool.alloc_mamba if extra else None
    other_idx = req_pool.get_mamba_ping_pong_other_idx if extra else None
    # the extra buffer's checkpoint grid (the cache's mamba_checkpoint_grid)
    grid = mamba_chunk * page_size // math.gcd(mamba_chunk, page_size) if extra else None
    total_size = cache.total_size
    a_alloc, a_free = alloc.alloc, alloc.free
    B = workload.block_size
    block_offsets = np.arange(B, dtype=np.int64)
    ptr = workload.hash_ptr.tolist()
    hash_ids = workload.hash_ids
    nin = workload.input_lengths.tolist()
    nout = workload.output_lengths.tolist()
    fresh = workload.token_base
    lat_match, lat_lock, lat_evict, lat_finish, lat_slide = [], [], [], [], []
    lat_ckpt = []
    # the host tier mode's calls and figures
    check_events = cache.check_hicache_events if host else None
    init_load_back = cache.init_load_back if host else None
    ready_to_load = cache.ready_to_load_host_cache if host else None
    loading_check = cache.loading_check if host else None
    path_indices = cache.path_device_indices if host else None
    host_total = cache.host_total_size if host else None
    swa_host_total = cache.swa_host_total_size if host and swa else None
    m_host_total = cache.mamba_host_total_size if host and mamba else None
    lat_load, lat_loading, lat_events = [], [], []
    dev_hits = host_hits = load_backs = loaded = declined = load_evicted = peak_host = 0
    # the hybrid host tier modes: SWA tokens loaded back, loads that restored a state, SWA
    # tokens and states the loads evicted, peak SWA host tokens and host states
    swa_loaded = state_loads = load_swa_evicted = load_m_evicted = 0
    peak_swa_host = peak_m_host = 0
    r_dev_hit = np.zeros(n_req, dtype=np.int64) if host else None
    r_host_hit = np.zeros(n_req, dtype=np.int64) if host else None
    r_host_match = np.zeros(n_req, dtype=np.int64) if host else None
    r_declined = np.zeros(n_req, dtype=np.int64) if host else None
    W, interval = swa_window, swa_eviction_interval
    # the hybrid modes' own figures: SWA tokens and Mamba states evicted, hit tokens
    # lost to the window and to checkpoint granularity, peak SWA tokens / states in the
    # tree (the SWA + Mamba mode reads its two aux ledgers apart: total_size lumps them)
    triple = swa and mamba
    node_info = cache.node_info if triple else None
    if triple:
        swa_ev_size, swa_prot_size = cache.swa_evictable_size, cache.swa_protected_size
        m_ev_size, m_prot_size = cache.mamba_evictable_size, cache.mamba_protected_size
    swa_evicted = m_evicted = lost_w = lost_c = slid = peak_aux = peak_m = m_waits = 0
    r_full_hit = np.zeros(n_req, dtype=np.int64) if hybrid else None
    # the hit Mamba alone would give on the tree at admission: the deepest state on the
    # matched path (SWA mode: the full hit; Mamba mode: the hit)
    r_state_hit = np.zeros(n_req, dtype=np.int64) if hybrid else None
    r_base = np.zeros(n_req, dtype=np.int64) if hybrid else None   # hit + declined host hit
    r_swa_evicted = np.zeros(n_req, dtype=np.int64) if swa else None
    r_m_evicted = np.zeros(n_req, dtype=np.int64) if mamba else None
    # per request: hit (-1 rejected), evicted to admit it, completions waited for
    r_hit = np.full(n_req, -1, dtype=np.int64)
    r_evicted = np.zeros(n_req, dtype=np.int64)
    r_waited = np.zeros(n_req, dtype=np.int64)
    r_decide = np.full(n_req, np.nan)
    r_end = np.full(n_req, np.nan)
    arrive = workload.timestamps / (arrival.rate_scale if timed else 1.0)
    arrive_l = arrive.tolist()
    running = collections.deque()   # order mode: FIFO; arrival mode: heap of (end, seq, r)
    heappush, heappop = heapq.heappush, heapq.heappop
    hit_tokens = evicted = evict_calls = rejected = waits = slot_waits = peak = 0
    clock = float(arrive[0]) if n_req else 0.0
    running_l = [] if timed else running

    def complete(r):
        # r = (req_or_None, row, tokens, node, hit, n, o)
        req, row, toks, node, hit, n, o = r
        t = pc()
        if use_req:
            finished(req)
        else:
            committed = n + o if cache_outputs else n
            aligned = committed - committed % page_size
            vals = table[row, :n + o].copy()
            if aligned > 0:
                insert(InsertParams(key=RadixKey(toks[:aligned]), value=vals[:aligned],
                                    prev_prefix_len=hit))
                pa = n - n % page_size
                if cache_outputs and 0 < pa < aligned:
                    # what checkpoint does on a Full-only tree: the prompt again, priority + 1
                    insert(InsertParams(key=RadixKey(toks[:pa]), value=vals[:pa],
                                        prev_prefix_len=pa, inserted_len=pa, priority=1))
            unlock(node)
            if aligned < n + o:
                a_free(vals[aligned:])
            req_pool.free(row)
        lat_finish.append(pc() - t)
        note_sizes()

    def note_sizes():
        # the peak tree sizes (after each completion; extra buffer: each checkpoint too)
        nonlocal peak, peak_aux, peak_m, peak_host, peak_swa_host, peak_m_host
        size, aux_size = total_size()
        if size > peak:
            peak = size
        if host:
            h = host_total()
            if h > peak_host:
                peak_host = h
            if swa:
                h = swa_host_total()
                if h > peak_swa_host:
                    peak_swa_host = h
            if mamba:
                h = m_host_total()
                if h > peak_m_host:
                    peak_m_host = h
        if triple:
            aux_size = swa_ev_size() + swa_prot_size()
            m_size = m_ev_size() + m_prot_size()
            if m_size > peak_m:
                peak_m = m_size
        if aux_size > peak_aux:
            peak_aux = aux_size

    def track(req, seqlen):
        # the model runner saved the state at seqlen into the next ping-pong entry
        req.mamba_last_track_idx = req.mamba_next_track_idx
        req.mamba_next_track_idx = other_idx(req.mamba_next_track_idx)
        req.mamba_prev_track_seqlen = req.mamba_last_track_seqlen
        req.mamba_last_track_seqlen = seqlen

    def extra_want(hit, n, o):
        # extra buffer: alloc_mamba's slots, and the checkpoint's fresh slot when the
        # prefill tracks a state and the request runs on after it
        return EXTRA_BUFFER_REQ_STATES + int(o >= 2 and n - hit >= grid)

    def match_and_lock(key):
        t0 = pc()
        m = match(MatchPrefixParams(key=RadixKey(key)))
        t1 = pc()
        node = m.last_device_node
        tree_lock = lock(node)
        lat_lock.append(pc() - t1)
        lat_match.append(t1 - t0)
        return m, node, tree_lock

    def poll():
        # the host tier mode: a scheduler step's HiCache poll (submit and complete the
        # backups the completions queued; they pin their nodes on the device until then)
        t = pc()
        check_events()
        lat_events.append(pc() - t)

    def match_load_lock(key, req):
        # the host tier mode: match, load the host hit back (SGLang's PrefillAdder:
        # init_load_back with req.last_node the device match), lock the request's node.
        # Returns (match, node, hit, prefix indices, tokens loaded)
        nonlocal load_backs, loaded, declined, load_evicted, evicted
        t0 = pc()
        m = match(MatchPrefixParams(key=RadixKey(key)))
        lat_match.append(pc() - t0)
        node = m.last_device_node
        hit = m.device_prefix_len
        prefix = m.device_indices
        got = 0
        if m.host_hit_length > 0:
            req.last_node = node
            before = total_size()[0]
            t = pc()
            got, lnode = init_load_back(InitLoadBackParams(m.best_match_node,
                                                           m.host_hit_length, req=req))
            lat_load.append(pc() - t)
            # what its allocation evicted: the tree grew by the load, shrank by that
            ev = before + got - total_size()[0]
            load_evicted += ev
            evicted += ev
            if got:
                load_backs += 1
                loaded += got
                node = lnode
                hit += got
                prefix = path_indices(node)
            else:
                declined += m.host_hit_length
        t1 = pc()
        lock(node)
        lat_lock.append(pc() - t1)
        return m, node, hit, prefix, got

    def aux_sizes():
        # the tree's Full tokens, SWA tokens and states (device), for what a load evicted
        size, aux_size = total_size()
        if triple:
            return size, swa_ev_size() + swa_prot_size(), m_ev_size() + m_prot_size()
        return size, aux_size if swa else 0, aux_size if mamba else 0

    def hybrid_load(m, node, tree_lock, req):
        # the hybrid host tier modes: the request holds its lock on the device match
        # (SGLang's PrefillAdder holds it around the load) and, with Mamba, its own state
        # slot; a host hit of any component (Full, the SWA window, the state) is loaded
        # back (init_load_back with req.last_node the device match and the match's
        # swa_host_hit_length / mamba_host_hit_length on req), then the request's lock
        # moves to the loaded node. Returns (node, tree lock, hit, prefix indices, Full
        # tokens the hit gained)
        nonlocal load_backs, loaded, declined, load_evicted, evicted, swa_evicted, m_evicted
        nonlocal swa_loaded, state_loads, load_swa_evicted, load_m_evicted
        hit = m.device_prefix_len
        prefix = m.device_indices
        s_hh = m.swa_host_hit_length if swa else 0
        m_hh = m.mamba_host_hit_length if mamba else 0
        if not (m.host_hit_length or s_hh or m_hh):
            return node, tree_lock, hit, prefix, 0
        req.last_node = node
        if swa:
            req.swa_host_hit_length = s_hh
        if mamba:
            req.mamba_host_hit_length = m_hh
        before = aux_sizes()
        full0, swa0 = moved["load"], moved["load_swa"]
        t = pc()
        got, lnode = init_load_back(InitLoadBackParams(m.best_match_node, m.host_hit_length,
                                                       req=req))
        lat_load.append(pc() - t)
        after = aux_sizes()
        # what its allocations evicted: each tree grew by what the load restored and
        # shrank by that (a Full eviction takes the leaves' SWA KV and states along)
        got_full, got_swa = moved["load"] - full0, moved["load_swa"] - swa0
        got_state = int(bool(got) and m_hh > 0)
        ev = before[0] + got_full - after[0]
        load_evicted += ev
        evicted += ev
        ev = before[1] + got_swa - after[1]
        load_swa_evicted += ev
        swa_evicted += ev
        ev = before[2] + got_state - after[2]
        load_m_evicted += ev
        m_evicted += ev
        if not got:
            declined += m.host_hit_length
            return node, tree_lock, hit, prefix, 0
        load_backs += 1
        loaded += got
        swa_loaded += got_swa
        state_loads += got_state
        t = pc()
        new_lock = lock(lnode)
        unlock(tree_lock)
        lat_lock.append(pc() - t)
        prefix = path_indices(lnode)
        return lnode, new_lock, hit + got, prefix, got

    def state_hit(m):
        # the SWA + Mamba mode: the end of the deepest node holding a state on the matched
        # path (read now: the unlocked nodes below the hit may be evicted before admission);
        # from the node at the Full hit up to the hit's node, which holds one (or is the root)
        hit, depth = m.device_prefix_len, m.full_kv_hit_length
        nid = m.last_visited_node_id
        while depth > hit:
            info = node_info(nid)
            if info["has_mamba"]:
                return depth
            depth -= len(info["key"])
            nid = info["parent"]
        return hit

    def evict_state(count=1):
        # the Mamba modes: `count` states (a leaf's deletes its Full and SWA KV too)
        nonlocal evicted, swa_evicted, m_evicted, evict_calls
        t = pc()
        res = evict_for_alloc(EvictParams(num_tokens=0, mamba_num=count))
        lat_evict.append(pc() - t)
        evict_calls += 1
        evicted += res.num_tokens_evicted
        swa_evicted += res.swa_num_tokens_evicted
        m_evicted += res.mamba_num_evicted

    def complete_next():
        # the oldest (order mode) or the earliest-ending (arrival mode) running request
        nonlocal clock
        if timed:
            end, _, r = heappop(running_l)
            if end > clock:
                clock = end
            complete(r)
        else:
            complete(running.popleft())

    bar = progress_bar(n_req, progress, unit="req", smoothing=0.1)
    step = 0
    t_start, c_start = time.perf_counter(), time.process_time()
    for i in range(n_req):
        n, o = nin[i], nout[i]
        toks = (hash_ids[ptr[i]:ptr[i + 1], None] * B + block_offsets).reshape(-1)[:n]
        if cache_outputs and o:
            toks = np.concatenate((toks, np.arange(fresh, fresh + o, dtype=np.int64)))
            fresh += o
        if timed:
            if arrive_l[i] > clock:
                clock = arrive_l[i]
            while running_l and running_l[0][0] <= clock:
                complete(heappop(running_l)[2])
        waited = 0
        while len(running_l) >= max_running:
            complete_next()
            if timed:
                slot_waits += 1
                waited += 1
        # the Mamba mode matches prompt[:-1], as SGLang's scheduler (at least one
        # token is computed); the Full-only and SWA modes the whole prompt
        key = toks[:n - 1] if mamba and n else toks[:n]
        ev0, sev0, mev0, dec0 = evicted, swa_evicted, m_evicted, declined
        if host:
            poll()
            hreq = Req(origin_input_ids=toks[:n], fill_ids=toks)
        if host and not hybrid:
            m, node, hit, prefix, got = match_load_lock(key, hreq)
            tree_lock = None
        else:
            m, node, tree_lock = match_and_lock(key)
        s_hit = state_hit(m) if triple else None
        mslot = None
        if extra:
            # alloc_mamba's 3 slots (+ the checkpoint's) must be free: evict states, then
            # wait for running requests, then give the match up, as the Mamba mode
            want = extra_want(m.device_prefix_len, n, o)
            while m_avail() < want:
                evict_state(want - m_avail())
                if m_avail() >= want:
                    break
                if running_l:
                    complete_next()
                    m_waits += 1
                    waited += 1
                elif m.device_prefix_len > 0:
                    # the only state left is the one this match locked
                    unlock(tree_lock)
                    evict_state(want - m_avail())
                    m, node, tree_lock = match_and_lock(key)
                    want = extra_want(m.device_prefix_len, n, o)
                else:
                    raise AssertionError(f"{want} Mamba state slots neither free nor evictable "
                                         f"with nothing running: a state leaked")
        elif mamba:
            # a state slot of its own: evict a state when none is free, then wait for
            # running requests (as when short of KV)
            mslot = m_alloc(1)
            touched = mslot is None     # the tree changed since the match
            while mslot is None:
                evict_state()
                mslot = m_alloc(1)
                if mslot is None:
                    if running_l:
                        complete_next()
                        if host:
                            poll()
                        m_waits += 1
                        waited += 1
                    else:
                        # N = 1: the one state is the one this match locked, and a copy
                        # needs a second slot: give the match up and match again
                        unlock(tree_lock)
                        evict_state()
                        m, node, tree_lock = match_and_lock(key)
                        s_hit = state_hit(m) if triple else None
                        mslot = m_alloc(1)
                        if mslot is None:
                            raise AssertionError("no Mamba state slot free or evictable with "
                                                 "nothing running: a state leaked")
            mslot = int(mslot[0])
        if host and hybrid:
            # the request holds its state slot before the load (the load copies the
            # restored state into it; SGLang's load allocates it when the request holds
            # none: taken first, a load never finds the state pool empty)
            if mamba:
                hreq.mamba_pool_idx = mslot
                if touched:
                    # the slot cost an eviction or a completion (its backups, host
                    # evictions): the match's host part may be gone; match again (the
                    # device match was locked: it is still there)
                    unlock(tree_lock)
                    m, node, tree_lock = match_and_lock(key)
                    s_hit = state_hit(m) if triple else None
            node, tree_lock, hit, prefix, got = hybrid_load(m, node, tree_lock, hreq)
        elif not host:
            hit = m.device_prefix_len
            prefix = m.device_indices
        # what both tiers could serve: the hit and the host tokens a declined load left
        base = hit + (declined - dec0 if host else 0)
        if triple and base > s_hit:
            s_hit = base    # a restored state, or one a declined load left on the host
        need = n - hit + o
        slots_i = a_alloc(need)
        while slots_i is None:
            t = pc()
            if swa:
                # SGLang's evict_to_free_tokens: each pool's shortfall
                res = evict_for_alloc(EvictParams(num_tokens=max(0, need - a_avail()),
                                                  swa_num_tokens=max(0, need - s_avail())))
            else:
                res = evict(EvictParams(num_tokens=need - a_avail()))
            evicted += res.num_tokens_evicted
            # what a Full eviction deleted with its leaves counts for the hybrid modes too
            swa_evicted += res.swa_num_tokens_evicted
            m_evicted += res.mamba_num_evicted
            lat_evict.append(pc() - t)
            evict_calls += 1
            slots_i = a_alloc(need)
            if slots_i is None:
                if not running_l:
                    break
                complete_next()
                if host:
                    poll()      # a step ended: the completion's backups go through
                waits += 1
                waited += 1
                slots_i = a_alloc(need)
        if host and (got or hybrid):
            # the load is submitted with the batch and, synchronous, complete at once
            t = pc()
            if ready_to_load() == 0:
                loading_check()
                lat_loading.append(pc() - t)
        r_evicted[i] = evicted - ev0
        if swa:
            r_swa_evicted[i] = swa_evicted - sev0
        if mamba:
            r_m_evicted[i] = m_evicted - mev0
        r_waited[i] = waited
        r_decide[i] = clock
        if host:
            r_host_match[i] = m.host_hit_length
            r_declined[i] = declined - dec0
        if slots_i is None:
            unlock(tree_lock if hybrid else node)
            if mslot is not None:
                m_free(np.array([mslot], dtype=np.int64))
            rejected += 1
        else:
            hit_tokens += hit
            r_hit[i] = hit
            if host:
                r_dev_hit[i] = hit - got
                r_host_hit[i] = got
                dev_hits += hit - got
                host_hits += got
            row = req_pool.alloc(1)[0]
            table[row, :hit] = prefix
            table[row, hit:n + o] = slots_i
            req = None
            if host:
                # the request that asked for the load
                req = hreq
                req.req_pool_idx = row
                req.prefix_indices = prefix
                req.last_node = node
                req.kv_committed_len = n + o if cache_outputs else n
                req.kv_allocated_len = n + o
            elif use_req:
                committed = n + o if cache_outputs else n
                req = Req(origin_input_ids=toks[:n], fill_ids=toks, req_pool_idx=row,
                          prefix_indices=m.device_indices, last_node=node,
                          kv_committed_len=committed, kv_allocated_len=n + o,
                          mamba_pool_idx=mslot)
            if hybrid:
                req.lock = tree_lock
                full_hit = m.full_kv_hit_length
                r_full_hit[i] = full_hit
                # the deepest state: Mamba alone on this tree would hit it (SWA: no state
                # to lack; Mamba: the hit)
                s_hit = s_hit if triple else full_hit if swa else base
                r_state_hit[i] = s_hit
                r_base[i] = base
                lost_w += s_hit - base
                lost_c += full_hit - s_hit
            if extra:
                # its 3 state slots (reserved above: the KV step only frees states)
                if not alloc_mamba(req):
                    raise AssertionError("alloc_mamba failed after the state slots were "
                                         "reserved")
                # the prefill over n - hit tokens tracks a state (SGLang's model runner):
                # at hit + (e // G) * G, or at the match's branching point on the grid
                e = n - hit
                if e >= grid:
                    at = hit + e // grid * grid
                    branch = m.mamba_branching_seqlen
                    if branch is not None and hit < branch < n and (branch - hit) % grid == 0:
                        at = branch
                    track(req, at)
                if o >= 2:
                    # it runs on: SGLang's cache_unfinished_req after the prefill
                    t = pc()
                    ckpt(req, n)
                    lat_ckpt.append(pc() - t)
                    note_sizes()
                    # decode steps at seqlens n + 1 .. n + o - 1: a state at each grid point
                    g = (n // grid + 1) * grid
                    while g < n + o:
                        track(req, g)
                        g += grid
            if swa:
                req.swa_branching_seqlen = m.swa_branching_seqlen
                # decode steps: seqlen n + 1 .. n + o - 1; the scheduler slides the
                # window (pre_len = seqlen - 1) once `interval` tokens left it
                pre = max(n, W + interval)
                last = n + o - 2
                while pre <= last:
                    free0 = s_avail()
                    t = pc()
                    slide(req, pre)
                    lat_slide.append(pc() - t)
                    slid += s_avail() - free0
                    pre = max(pre + 1, req.swa_evicted_seqlen + W + interval)
            r = (req, row, toks, node, hit, n, o)
            if timed:
                end = clock + arrival.service_ms(n - hit, o)
                r_end[i] = end
                heappush(running_l, (end, i, r))
            else:
                running.append(r)
        step += 1
        if bar is not None and step == 64:
            bar.update(step)
            step = 0
    while running_l:
        complete_next()
    if host:
        poll()          # the last completions' backups
        note_sizes()
    wall = time.perf_counter() - t_start
    cpu = time.process_time() - c_start
    if bar is not None:
        bar.update(step)
        bar.close()

    ev, prot = cache.evictable_size(), cache.protected_size()
    conserved = (a_avail() + ev + prot == slots) and prot == 0
    aux_msg = ""
    aux = []
    if swa:
        aux.append(("SWA", s_avail(), cache.swa_evictable_size(), cache.swa_protected_size(),
                    swa_slots))
    if mamba:
        aux.append(("Mamba states", m_avail(), cache.mamba_evictable_size(),
                    cache.mamba_protected_size(), m_slots))
    if host:
        # host slots: free, or holding a node's host copy (nothing is in flight now)
        aux.append(("host", host_pool.available_size(), host_total(), 0, h_slots))
        if swa:
            aux.append(("SWA host", cache.swa_pool_host.available_size(), swa_host_total(), 0,
                        swa_h_slots))
        if mamba:
            aux.append(("Mamba host states", cache.mamba_pool_host.available_size(),
                        m_host_total(), 0, mh_slots))
    for name, x_avail, x_ev, x_prot, x_pool in aux:
        if not (x_avail + x_ev + x_prot == x_pool and x_prot == 0):
            conserved = False
            aux_msg += (f"; {name}: available {x_avail} + evictable {x_ev} + protected {x_prot} "
                        f"!= pool {x_pool}")
    if check:
        if not conserved:
            raise AssertionError(f"KV conservation broken after the replay: available {a_avail()} "
                                 f"+ evictable {ev} + protected {prot} != pool {slots}{aux_msg}")
        sanity = getattr(cache, "sanity_check", None)
        if sanity is not None:
            sanity()
    served = r_hit >= 0
    if rejected:
        sizes = workload.input_lengths + workload.output_lengths
        too_big = int((sizes > slots).sum())
        what = "1 request" if rejected == 1 else f"{rejected:,} requests"
        if too_big == rejected:
            notes.append(f"{what} rejected: {'it needs' if rejected == 1 else 'each needs'} "
                         f"more KV than the whole pool (prompt + output tokens > {slots:,}; "
                         f"the largest request needs {int(sizes.max()):,})")
        elif swa:
            notes.append(f"{what} rejected: short of KV with nothing running (each request "
                         f"needs its uncached prompt + outputs in both pools at admission; the "
                         f"SWA pool holds {swa_slots:,} tokens)")
        else:
            notes.append(f"{what} rejected: short of KV with nothing running")
    arrival_d = None
    if timed:
        wait_ms = r_decide - arrive
        span = float(max(np.nanmax(r_end) if served.any() else 0.0, r_decide.max())
                     - arrive.min()) if n_req else 0.0
        interval = (arrival.interval_s * 1e3 if arrival.interval_s is not None
                    else _nice_interval(span))
        buckets, peak_run, mean_run = (timeline(arrive, r_decide, r_end, served, interval)
                                       if n_req else ([], 0, 0.0))
        arrival_d = {
            "prefill_tokens_per_s": arrival.prefill_tokens_per_s,
            "decode_tokens_per_s": arrival.decode_tokens_per_s,
            "rate_scale": arrival.rate_scale, "span_s": round(span / 1e3, 3),
            "peak_running": peak_run, "mean_running": mean_run,
            "waited_requests": int((wait_ms > 0).sum()), "wait_ms": _pcts_ms(wait_ms),
            "kv_waits": int(waits), "slot_waits": int(slot_waits),
            "interval_s": round(interval / 1e3, 3), "timeline": buckets,
        }
        if slot_waits:
            times = "once" if slot_waits == 1 else f"{slot_waits:,} times"
            notes.append(f"admissions waited {times} for a running slot (max running "
                         f"{max_running:,}): raise --max-running to model a larger batch")
    per_request = None
    if record_requests:
        per_request = {
            "arrival_ms": arrive, "prompt_tokens": workload.input_lengths.copy(),
            "output_tokens": workload.output_lengths.copy(),
            "hit_tokens": np.where(served, r_hit, 0), "evicted_tokens": r_evicted,
            "waited": r_waited, "wait_ms": (r_decide - arrive) if timed else np.full(n_req, np.nan),
            "finish_ms": r_end, "rejected": ~served,
        }
        if hybrid:
            # the mode's HybridMode.per_request arrays
            arrays = {"swa_evicted_tokens": r_swa_evicted, "mamba_evicted_states": r_m_evicted,
                      "full_kv_hit_tokens": np.where(served, r_full_hit, 0),
                      "window_lost_hit_tokens": np.where(served, r_state_hit - r_base, 0),
                      "checkpoint_lost_hit_tokens": np.where(served, r_full_hit - r_state_hit,
                                                             0)}
            mode = SWA_MAMBA_MODE if triple else SWA_MODE if swa else MAMBA_MODE
            per_request.update((k, arrays[k]) for k in mode.per_request)
        if host:
            per_request.update(
                device_hit_tokens=np.where(served, r_dev_hit, 0),
                host_hit_tokens=np.where(served, r_host_hit, 0),
                miss_tokens=workload.input_lengths - np.where(served, r_hit, 0),
                host_match_tokens=r_host_match, declined_host_tokens=r_declined)
    prompt_tokens = workload.prompt_tokens
    latency = {"match_prefix": _latency(lat_match), "inc_lock_ref": _latency(lat_lock),
               "evict": _latency(lat_evict), "cache_finished_req": _latency(lat_finish)}
    if extra:
        latency["checkpoint"] = _latency(lat_ckpt)
    swa_kw = {}
    if host:
        latency.update(init_load_back=_latency(lat_load), loading_check=_latency(lat_loading),
                       check_hicache_events=_latency(lat_events))
        swa_kw.update(
            host_capacity="inf" if host_capacity == math.inf else int(host_capacity),
            host_pool_slots=h_slots, write_policy=write_policy,
            load_back_threshold=load_back_threshold, device_hit_tokens=int(dev_hits),
            host_hit_tokens=int(host_hits), miss_tokens=int(workload.prompt_tokens - hit_tokens),
            device_hit_ratio=dev_hits / workload.prompt_tokens if workload.prompt_tokens else 0.0,
            host_hit_ratio=host_hits / workload.prompt_tokens if workload.prompt_tokens else 0.0,
            load_backs=int(load_backs), loaded_tokens=int(loaded),
            declined_host_tokens=int(declined), load_evicted_tokens=int(load_evicted),
            peak_host_tree_tokens=int(peak_host), final_host_tree_tokens=int(host_total()),
            backed_up_tokens=int(moved["backup"]),
            host_evicted_tokens=int(moved["backup"] - host_total()))
        if swa:
            swa_kw.update(
                swa_host_pool_slots=swa_h_slots, swa_backed_up_tokens=int(moved["backup_swa"]),
                swa_host_loaded_tokens=int(swa_loaded),
                swa_host_evicted_tokens=int(moved["backup_swa"] - swa_host_total()),
                load_swa_evicted_tokens=int(load_swa_evicted),
                peak_swa_host_tree_tokens=int(peak_swa_host),
                final_swa_host_tree_tokens=int(swa_host_total()))
        if mamba:
            swa_kw.update(
                mamba_host_pool_slots=mh_slots, backed_up_states=int(moved["backup_state"]),
                host_state_loads=int(state_loads),
                host_evicted_states=int(moved["backup_state"] - m_host_total()),
                load_evicted_states=int(load_m_evicted), peak_host_tree_states=int(peak_m_host),
                final_host_tree_states=int(m_host_total()))
    if swa:
        latency["evict_sliding_windows"] = _latency(lat_slide)
        if not unbounded and swa_slots < int(int(capacity) * swa_ratio) - page_size:
            notes.append(f"SWA pool sized to {swa_slots:,} tokens: this workload can never use "
                         f"more")
        final_swa = (cache.swa_evictable_size() + cache.swa_protected_size() if triple
                     else total_size()[1])
        swa_kw.update(swa_window=swa_window, swa_ratio=swa_ratio, swa_pool_slots=swa_slots,
                      swa_evicted_tokens=int(swa_evicted), window_lost_hit_tokens=int(lost_w),
                      swa_slid_tokens=int(slid), peak_swa_tree_tokens=int(peak_aux),
                      final_swa_tree_tokens=int(final_swa))
    if mamba:
        final_m = (cache.mamba_evictable_size() + cache.mamba_protected_size() if triple
                   else total_size()[1])
        swa_kw.update(mamba_states=mamba_states, mamba_pool_slots=m_slots,
                      mamba_chunk=mamba_chunk, mamba_extra_buffer=extra,
                      mamba_evicted_states=int(m_evicted),
                      checkpoint_lost_hit_tokens=int(lost_c), mamba_waits=int(m_waits),
                      peak_mamba_tree_states=int(peak_m if triple else peak_aux),
                      final_mamba_tree_states=int(final_m))
    return ReplayResult(
        workload=workload.name, capacity="inf" if unbounded else int(capacity), pool_slots=slots,
        page_size=page_size, max_running=max_running, policy=policy,
        cache_outputs=bool(cache_outputs), requests=n_req, served_requests=n_req - rejected,
        rejected_requests=rejected, prompt_tokens=prompt_tokens,
        output_tokens=workload.output_tokens, hit_tokens=int(hit_tokens),
        token_hit_ratio=(hit_tokens / prompt_tokens) if prompt_tokens else 0.0,
        evicted_tokens=int(evicted), evict_calls=evict_calls, waits=waits,
        peak_tree_tokens=int(peak), final_tree_tokens=int(total_size()[0]),
        kv_conserved=bool(conserved), wall_s=wall, cpu_s=cpu,
        requests_per_s=n_req / wall if wall > 0 else float("inf"),
        prompt_tokens_per_s=prompt_tokens / wall if wall > 0 else float("inf"),
        warmup_s=round(warmup_s, 3),
        latency_us=latency, mode="arrival" if timed else "order", arrival=arrival_d,
        notes=notes, hits=r_hit if record_hits else None, per_request=per_request, **swa_kw,
    )
