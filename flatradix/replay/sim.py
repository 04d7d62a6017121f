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

import functools
import time

import numpy as np

from .config import (  # noqa: F401  (the replay's options and sizes, importable from here)
    ARRIVAL_MAX_RUNNING, DEFAULT_LOAD_BACK_THRESHOLD, DEFAULT_MAMBA_CHUNK, DEFAULT_SWA_RATIO,
    DEFAULT_WRITE_POLICY, EXTRA_BUFFER_MIN_STATES, EXTRA_BUFFER_REQ_STATES, HOST_WRITE_POLICIES,
    MAX_HOST_AUX, MAX_LOAD_BACK_THRESHOLD, MAX_MAMBA_CHUNK, MAX_SWA_WINDOW, OPT_POLICY,
    SWA_EVICTION_INTERVAL, ArrivalModel, PoolSizes, ReplayConfig, host_aux_slots, pool_sizes,
    swa_pool_slots, unbounded_pool_slots)
from .outcome import build_result
from .result import (  # noqa: F401  (what a replay reports, importable from here)
    HOST_FIELDS, HOST_MAMBA_FIELDS, HOST_MAMBA_MODE, HOST_MODE, HOST_OPS, HOST_SWA_FIELDS,
    HOST_SWA_MAMBA_MODE, HOST_SWA_MODE, HYBRID_MODES, MAMBA_EXTRA_OPS, MAMBA_FIELDS,
    MAMBA_MODE, OPS, SWA_FIELDS, SWA_MAMBA_MODE, SWA_MODE, SWA_OPS, HybridMode, ReplayResult,
    hybrid_mode, timeline)
from .scheduler import Scheduler, default_cache_factory  # noqa: F401


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
    page_size, policy : the cache's ``page_size`` and ``eviction_policy``; ``policy="opt"``:
        Belady's offline optimum on the prefix tree (``replay/opt.py``: what is proven
        optimal and what is not), Full attention without a host tier, run through
        the ``"core"`` calls.
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
    cfg = ReplayConfig(
        capacity=capacity, page_size=page_size, max_running=max_running, policy=policy,
        cache_outputs=cache_outputs, driver=driver, record_hits=record_hits,
        record_requests=record_requests, check=check, arrival=arrival, swa_window=swa_window,
        swa_ratio=swa_ratio, swa_eviction_interval=swa_eviction_interval,
        mamba_states=mamba_states, mamba_chunk=mamba_chunk,
        mamba_extra_buffer=mamba_extra_buffer, host_capacity=host_capacity,
        write_policy=write_policy, load_back_threshold=load_back_threshold,
        swa_host_capacity=swa_host_capacity, mamba_host_states=mamba_host_states)
    return run_config(workload, cfg, cache_factory=cache_factory, progress=progress)


def run_config(workload, cfg, cache_factory=None, progress=False):
    """:func:`replay` of a checked :class:`ReplayConfig`: the pools sized, the
    kernels warmed up, one :class:`~flatradix.replay.scheduler.Scheduler` run over
    every request; returns its :class:`ReplayResult`."""
    if cfg.timed and not getattr(workload, "has_timestamps", True):
        raise ValueError(f"{workload.name}: the arrival mode needs timestamps, and this trace "
                         f"has none")
    sizes = pool_sizes(cfg, workload)
    warmup_s = warm_up_for(cfg, notice=bool(progress))
    if cfg.policy == OPT_POLICY:
        from .opt import Future, opt_factory

        cache_factory = opt_factory(Future(workload, cfg.page_size))
    sched = Scheduler(workload, cfg, cache_factory=cache_factory, sizes=sizes)
    wall, cpu = sched.run(progress)
    return build_result(sched, wall, cpu, warmup_s)


def warm_up_for(cfg, notice=False):
    """:func:`warm_up` for the mode of ``cfg`` (the Full-only kernels always, the
    mode's too), its driver and its ``check`` only: a run compiles what it calls and
    nothing else (``docs/compile_time.md``); returns seconds. One stderr line when it
    compiles (``notice`` is kept for callers and ignored)."""
    from .._compile_notice import phase

    with phase(" for this replay"):
        warmup_s = warm_up(driver=cfg.driver, check=cfg.check)
        if cfg.hybrid or cfg.host:
            warmup_s += warm_up(swa=cfg.swa, mamba=cfg.mamba, extra=cfg.extra, host=cfg.host,
                                check=cfg.check)
    return warmup_s


_warm = set()


def warm_up(swa=False, notice=False, mamba=False, extra=False, host=False, driver=None,
            check=True):
    """Compile (or load from Numba's cache) every kernel the replay calls, once per
    process (and once more for the SWA mode when ``swa``, for the Mamba mode when
    ``mamba``, with the extra buffer when ``extra`` too, for the SWA + Mamba mode
    when both, for the host tier mode when ``host``), so the timed loop measures the
    cache and not the JIT. ``driver``: the Full-only mode's driver (``None``: both);
    ``check``: the warm-up runs call ``sanity_check`` too (compiling its kernels).
    When it compiles, one line on stderr says so and how long it took
    (``flatradix._compile_notice``; ``notice`` is kept for callers and ignored).
    Returns seconds."""
    kind = ("swa+mamba" if swa and mamba else "swa" if swa else
            ("mamba+extra" if extra else "mamba") if mamba else "full")
    if host:
        kind = "host" if kind == "full" else "host+" + kind
    if kind != "full":
        driver = None
    if any((kind, d, c) in _warm for d in {driver, None} for c in {bool(check), True}):
        return 0.0
    from .._compile_notice import phase
    from .trace import Workload

    with phase(f" for the {kind.replace('+', ' + ')} replay"):
        return _warm_up(kind, swa, Workload, driver=driver, check=bool(check))


def _warm_up(kind, swa, Workload, driver=None, check=True):
    t = time.perf_counter()
    _warm.add((kind, driver, check))
    run = functools.partial(replay, check=check)
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
            run(two, capacity=10, page_size=1, host_capacity=h, load_back_threshold=1)
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
                run(two, capacity=10, page_size=1, host_capacity=h, load_back_threshold=1,
                       write_policy=policy, **kw)
    elif kind == "swa+mamba":
        run(tiny, capacity=16, page_size=1, max_running=2, swa_window=2, swa_ratio=0.5,
               swa_eviction_interval=1, mamba_states=1)
    elif kind == "swa":
        run(tiny, capacity=16, page_size=1, max_running=2, swa_window=2, swa_ratio=0.5,
               swa_eviction_interval=1)
    elif kind == "mamba":
        run(tiny, capacity=16, page_size=1, max_running=2, mamba_states=1)
    elif kind == "mamba+extra":
        # chunk 2: the prefills track, checkpoints donate, decodes track
        run(tiny, capacity=16, page_size=1, max_running=2, mamba_states=8, mamba_chunk=2,
               mamba_extra_buffer=True)
    else:
        for d in ("request", "core") if driver is None else (driver,):
            run(tiny, capacity=16, page_size=1, max_running=2, driver=d)
    return time.perf_counter() - t
