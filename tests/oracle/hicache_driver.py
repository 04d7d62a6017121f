"""Differential driver for the host tier (HiCache): flatradix against SGLang 0.5.23's
own ``UnifiedRadixCache`` with HiCache on (``hicache_peer.py``), Full attention
(``write_through``, ``write_through_selective`` and ``write_back``), Full + Mamba
(the ``*-mamba-*`` configurations), Full + SWA (the ``*-swa*-*`` ones) and Full +
SWA + Mamba (the ``*-swa*-mamba-*`` ones).

Run in the oracle venv (``../shared/tools/setup_sglang_oracle.sh``)::

    export SGLANG_USE_CPU_ENGINE=1 SGLANG_RUST_BUILD_MODE=never OMP_NUM_THREADS=1 \\
           PYTHONPATH=$PWD:$VENV/peer_stubs          # from the repository root
    $VENV/bin/python -m tests.oracle.hicache_driver --config all --backend rust --ops 2000
    $VENV/bin/python -m tests.oracle.hicache_driver --config p4-wt-lru --backend python \\
        --ops 20000 --seed 3
    $VENV/bin/python -m tests.oracle.hicache_driver --replay repro.json
    $VENV/bin/python -m tests.oracle.hicache_driver --config all --first python --backend rust
                                 # SGLang's Python core against its Rust core (no flatradix)
    $VENV/bin/python -m tests.oracle.hicache_driver --self-test --config none --backend rust

A seeded generator produces a stream of raw HiCache calls on small pools (device
12..48 tokens at page 1, 12..20 pages above; host 8..32 pages) so that eviction
(demotes of backed-up leaves, deletes of unbacked ones), host eviction, backups
that find the host pool full and load-backs all happen often:

* ``insert`` with fresh device slots (allocated on both sides in the same order;
  when the pool is short both evict first), ``prev_prefix_len`` 0 or the matched
  device prefix (the request's prefix slots replaced by the tree's own, as a
  scheduler does), ``inserted_len`` 0 / prev / the key's length;
* ``match`` (keys with partial-page tails too), ``lock`` (``lock()`` or
  ``inc_lock_ref`` on the match's device node, held across later ops),
  ``unlock``, ``hlock`` / ``hunlock`` (``inc_host_lock_ref`` on the match's best
  node, held across later ops; ``dec_host_lock_ref``), ``evict``, ``evict_host``;
* the ack protocol, each call its own op so acks arrive late and interleaved with
  everything else: ``flush`` (``flush_pending_backups``), ``wcheck``
  (``writing_check(finish_count=k)``, k None or a count no larger than the
  submitted acks, as SGLang's scheduler passes), ``wdrain``
  (``writing_check(write_back=True)``: submit and complete every backup), ``step``
  (``check_hicache_events``), ``ready`` (``ready_to_load_host_cache``),
  ``lcheck`` (``loading_check(finish_count=k)``);
* ``load``: match + ``init_load_back`` with ``req.last_node`` = the match's device
  node (SGLang asserts a request), ``mem_quota`` None or small, with or without the
  scheduler's pins around the call (``lock(last_device_node)``,
  ``inc_host_lock_ref(best_match)``, ``lock(best_match)``); ``load_back``: match +
  ``load_back(best_match_node, mem_quota, req)`` on a host hit.

Compared after every op (``normalize.py`` conventions; the accepted differences are
listed in ``DIFFERENCES`` below):

* every return value: match (``device_prefix_len``, device indices through the
  slot bijection, ``last_device_node`` / ``last_host_node`` / ``best_match_node``
  / ``last_visited_node_id`` through the node-id bijection, ``host_hit_length``,
  ``full_kv_hit_length`` and every other scalar field), insert (``prefix_len``,
  node, ``total_len`` ...), lock deltas, evicted tokens, ``evict_host``'s count,
  ``init_load_back``'s (count, node), ``load_back``'s bool,
  ``ready_to_load_host_cache``'s -1 / not;
* device slots: a bijection SGLang slot <-> flatradix slot, bound when a slot is
  handed out (the driver's insert allocations, the caches' own load-back
  allocations, positionally) and dropped when freed; every free of either cache
  must be the same slots *in the same order*; allocations and frees must
  interleave alike (a run of frees, then a run of allocations, ...);
* host slots: the same bijection for the host pools (bound at each host
  allocation, positionally); host frees compared as multisets per run;
* the transfers: each submitted backup / load as (host slot, device slot) pairs,
  in order, through both bijections (SGLang's at submission; flatradix's at
  commit, gathered until its submission);
* sizes: evictable / protected (SGLang ``full_evictable_size`` /
  ``full_protected_size``), ``total_size()``, device and host pool availability;
* the protocol state: ``ongoing_write_through`` and ``ongoing_load_back`` keys (in
  order, through the node-id bijection), the backups queued and not yet
  submitted, the submitted write / load acks (each ack's node ids);
* KV events (type, medium, block hashes, token ids, parent, ...) from
  ``take_events()``, after every op;
* Python core only: the tree's host tokens (``host_total_size``) and those on
  evictable host leaves (``host_evictable_size``), from its node arena, after every
  op; every ``TREE_EVERY`` ops the whole tree node by node, paired by path: device
  and host slots through the bijections, the pending backup's ack id, ``lock_ref``,
  host ``lock_ref``, ``hit_count`` (the Rust core exposes no node list);
* ``is_backuped`` of every node a match or insert returns (but the root);
* at each episode's end: release every lock, deliver every ack, compare both
  trees' device values (through the bijection) and both ``sanity_check`` s, then
  evict everything on both tiers: both pools must be whole again.

Full + Mamba (``mamba``: the device state pool's size; SGLang's own
``HybridReqToTokenPool`` and ``HybridLinearKVPool``, its ``MambaPoolHost`` sized
from the same ``hicache_ratio``): every insert donates a fresh state slot (the
caller's goes back on ``mamba_exist``); ``evict`` asks for states too, ``evict_host``
frees host states (``ComponentType.MAMBA``) or Full host tokens; a load sets the
request's ``mamba_host_hit_length`` from its match and sometimes lets the request
hold a state slot already; ``load_back`` also runs on a Mamba-only host hit; a
storage refill mostly stages the state at its end (committed as SGLang's prefetch
commit: the refill's node takes it unless it has a host state, ``mamba_exist``);
``cow`` matches with ``cow_mamba=True`` and a request (holding a slot or not), as
the scheduler does on a hybrid SSM model: the source is the best match node's
device state, none when the match ended past the device on a host-only state.
Compared as well: two more slot bijections (device states, host states; frees in
order and as multisets), the state transfers of each submitted backup / load as
(host state, device state) pairs, ``mamba_exist``, the state the request holds
after a load (then freed once its copy was submitted), the Mamba ledgers and
pools' availability, the host state count (Python core), and per node in the tree
checks its state, host state, Mamba lock_ref and host lock_ref.

Full + SWA (``swa_window``: the sliding window; ``swa_device``: the SWA device
pool, smaller than the Full one; SGLang's own ``SWAKVPool`` and
``SWATokenToKVPoolAllocator``, its SWA host pool sized from the same
``hicache_ratio`` over the SWA side, flatradix given that size): the driver's
insert slots are Full slots each mapped to a fresh SWA slot (SGLang: ``alloc`` at
page 1, its two inner allocators paired with ``set_full_to_swa_mapping`` above);
when either pool is short both sides evict that pool's shortfall (``evict`` with
``swa_num_tokens``); with no ``prev``, an insert may carry the request's SWA cursor
(``set_evicted_seqlen(SWA, c)``, ``c`` a page multiple up to ``len - window``; the
slots below it give their SWA peers back first, ``free_swa_segment``); ``evict``
asks for SWA tokens too, ``evict_host`` frees SWA host tokens
(``ComponentType.SWA``) or Full host tokens; a load sets the request's
``swa_host_hit_length`` from its match; ``load_back`` also runs on an SWA-only host
hit; a storage refill (``insert_host``) stages the SWA data of its last pages (as
SGLang's ``prepare_prefetch`` sizes it, or an odd size) and both sides commit it as
SGLang's prefetch commit does (``op_insert_host``). Compared as well: two more slot
bijections (SWA device slots, bound at each allocation from either allocator side,
frees in order; SWA host slots, frees as multisets), the SWA transfers of each
submitted backup / load as (SWA host slot, SWA device slot) pairs (a write-back
backup's by size, as the Full ones), the SWA ledgers (``swa_evictable_size`` /
``swa_protected_size``) and both device pools' and the SWA host pool's
availability, which components an ``inc_host_lock_ref`` receipt stamps, the tokens holding an SWA host value (Python core), and per node
in the tree checks its SWA device slots (flatradix's: its Full slots through the
allocator's mapping), SWA host slots, SWA lock_ref and host lock_ref.

Full + SWA + Mamba (``swa_window``, ``swa_device`` and ``mamba`` together; SGLang's
``SWAKVPool`` and ``SWATokenToKVPoolAllocator`` beside its ``HybridReqToTokenPool``,
whose state pool its hybrid pool assembler (``_MambaSwaStrategy``) takes for a third
host pool: KV, SWA and Mamba host pools, all sized from the same ``hicache_ratio``;
flatradix given both sizes): both of the above at once. Every insert donates a state
slot and may carry an SWA cursor; the driver's evictions for an insert ask for each
device pool's shortfall and, for the donated state, one state; ``evict`` asks for
tokens, SWA tokens and states (``("evict", n, swa_n, states)``); ``evict_host``
frees Full host tokens, SWA host tokens (an internal node's SWA host eviction takes
its host state along: SGLang's cascade to the lower-priority component, counted as
``evict_host_swa_state_cascade``) or host states; a load carries both
``swa_host_hit_length`` and ``mamba_host_hit_length`` and sometimes the request's
own state slot. Every check of both: the six slot bijections, the KV / SWA / state
transfer pairs, every ledger and pool's availability, both host totals (Python
core), and per node in the tree checks its Mamba and SWA parts. A storage refill
stages the SWA window (as Full + SWA) and, on every Mamba configuration, mostly a
state too. Above page 1 SGLang's Mamba extra buffer is on (as Full + Mamba).

The stream is cut into episodes of ``--episode`` ops on fresh caches. The first
divergence stops a configuration: the op, both sides' values, then the episode
shrunk by delta debugging (fresh caches per try; the same divergence label must
come back), printed as a Python literal and written as JSON for ``--replay``.
Each configuration ends with an ``ORACLE_RESULT {json}`` line.
"""

import contextlib
import io
import sys
from collections import Counter
from types import SimpleNamespace

import numpy as np

from . import harness
from .normalize import Divergence, NodeIdMap, coalesce_removed, compare, event_tuples

# Differences accepted on purpose (each is normalised where the comparison is made):
DIFFERENCES = """
1. ready_to_load_host_cache's return value: SGLang returns the index of the layer
   counter it used (its LayerDoneCounter cycles through 3 producers: 0, 1, 2, 0, ...)
   or -1 when nothing was queued; flatradix has no per-layer counters and returns 0
   or -1. Compared as `returned >= 0`.
2. Slot numbers on both tiers: each side has its own allocators with their own
   free-list orders (SGLang's paged allocator hands out pages, flatradix's
   TokenToKVPoolAllocator lowest slots first), so slots are compared through
   bijections built at allocation (see the module docstring), never as numbers.
3. Node ids: through normalize.NodeIdMap (first appearance binds a pair).
4. Host frees within one run are compared as multisets: the host slot order inside
   one eviction is an allocator detail (the eviction order itself is compared
   through the CPU BlockRemoved events, hash by hash).
5. Rust core: runs of BlockRemoved are coalesced on both sides (normalize point 4).
6. SGLang's own sanity_check (run at every CHECK_EVERY-th op and at episode ends)
   is accepted when its only violations are "Duplicate missing" (Python core) /
   "Full host coexistence missing" (Rust core): both cores register a node that
   holds Full KV on both tiers (`full_host_duplicates`) only where such nodes are
   born (acks, splits, unevicts) and the check expects every settled D+H node
   there; under write_through some path leaves one out. That registry is read
   only by write_back's duplicate reclaim (evict_host), which neither side runs
   here, so nothing observable depends on it. Counted in the stats as
   `sglang_dup_registry_misses`.
7. Mamba: a load-back that must give the request a state slot when the state
   pool is empty and nothing is evictable fails on both sides, but SGLang's
   (an AssertionError in `prepare_load_back`, raised before its try/finally)
   leaves the load's host lock and path lock held for good; flatradix raises
   RuntimeError and releases them. The driver skips such loads
   (`load_skipped_no_state_room`); tests/components/hicache/test_hicache_mamba.py covers flatradix's.
8. Allocator logs: a free or allocation of zero slots is no call and is left out of
   both sides' logs (flatradix's SWA allocator passes empty batches on: a load-back
   that is rolled back frees its fresh Full slots through the composite ``free``,
   which frees their SWA peers, none, on the SWA side; SGLang makes no such call).
9. Rust core: the hash order inside one (coalesced) run of CPU BlockRemoved
   events. A write-back subtree drop (`drop_subtree_no_host`, a backup that found
   no host memory) deletes the host-only descendants in the order of the Rust
   core's child hash map, which varies from process to process (the same 34 ops
   replayed gave both orders); flatradix follows the Python core's order (each
   node's oldest child first), compared exactly there. On the Rust core every CPU
   removal run's hashes are compared as a set (the order of a host eviction's
   victims within one run included: which victims, the trees, ledgers and host
   frees are compared as always); GPU removals keep their order. Counted in the
   stats as `rust_removed_order`.
"""

# Divergences found by this driver and reported, not yet fixed in flatradix. Never
# accepted by default (the tests fail on them); ``--tolerate NAME,...`` lets an
# exploratory run go past them to look for more, counting each tolerated case in
# the stats as ``tolerated:NAME``. Fixed so far (regression tests in
# tests/components/hicache/test_hicache.py): "host-lock-delta" (inc_host_lock_ref's receipt delta is
# None, as SGLang's) and "insert-event-order" (a walked node's backup runs at its
# place among the insert's events, as SGLang's barrier).
KNOWN = {}
TOLERATE = set()

# --------------------------------------------------------------------------- configs
# device / host: pool sizes in tokens (page multiples); min_pages / max_pages: key
# length bounds in pages (the threshold-10 ones lean long, so host hits reach 10);
# lbt: load_back_threshold (SGLang's init_hicache sets 10; the driver sets both
# sides alike); tokens: the key alphabet (small: lots of shared prefixes and splits).
CONFIGS = {
    "p1-wt-lru": dict(page_size=1, policy="lru", write_policy="write_through",
                      device=16, host=20, max_pages=6, lbt=1),
    "p1-wt-lru-t10": dict(page_size=1, policy="lru", write_policy="write_through",
                          device=48, host=64, min_pages=6, max_pages=20, lbt=10),
    "p4-wt-lru": dict(page_size=4, policy="lru", write_policy="write_through",
                      device=16 * 4, host=18 * 4, max_pages=6, lbt=1),
    "p2-wts-lru": dict(page_size=2, policy="lru", write_policy="write_through_selective",
                       device=12 * 2, host=8 * 2, max_pages=6, lbt=1),
    "p2-wts-lru-t10": dict(page_size=2, policy="lru", write_policy="write_through_selective",
                           device=20 * 2, host=28 * 2, min_pages=4, max_pages=12, lbt=10),
    "p1-wt-lfu": dict(page_size=1, policy="lfu", write_policy="write_through",
                      device=12, host=16, max_pages=6, lbt=1),
    "p4-wt-fifo": dict(page_size=4, policy="fifo", write_policy="write_through",
                       device=20 * 4, host=32 * 4, max_pages=6, lbt=10),
    "p1-wb-lru": dict(page_size=1, policy="lru", write_policy="write_back",
                      device=16, host=20, max_pages=6, lbt=1),
    "p4-wb-lru": dict(page_size=4, policy="lru", write_policy="write_back",
                      device=16 * 4, host=12 * 4, max_pages=6, lbt=1),
    "p2-wb-lfu-t10": dict(page_size=2, policy="lfu", write_policy="write_back",
                          device=20 * 2, host=28 * 2, min_pages=4, max_pages=12, lbt=10),
    # (FULL, MAMBA): ``mamba`` device states (SGLang sizes the host state pool from the
    # same hicache_ratio), ``chunk`` the Mamba cache chunk; above page 1 the extra buffer
    "p1-mamba-wt-lru": dict(page_size=1, policy="lru", write_policy="write_through",
                            device=16, host=20, max_pages=6, lbt=1, mamba=6),
    "p1-mamba-wts-lfu": dict(page_size=1, policy="lfu", write_policy="write_through_selective",
                             device=20, host=16, max_pages=6, lbt=1, mamba=8),
    "p1-mamba-wt-lru-t10": dict(page_size=1, policy="lru", write_policy="write_through",
                                device=48, host=64, min_pages=6, max_pages=20, lbt=10,
                                mamba=10),
    "p4-mamba-wt-fifo": dict(page_size=4, policy="fifo", write_policy="write_through",
                             device=16 * 4, host=20 * 4, max_pages=6, lbt=1, mamba=6, chunk=4),
    "p1-mamba-wb-lru": dict(page_size=1, policy="lru", write_policy="write_back",
                            device=16, host=20, max_pages=6, lbt=1, mamba=6),
    "p4-mamba-wb-lfu": dict(page_size=4, policy="lfu", write_policy="write_back",
                            device=16 * 4, host=12 * 4, max_pages=6, lbt=1, mamba=8, chunk=4),
    # the per-path state cap (mamba_max_states_per_path) with the host tier
    "p1-mamba-cap2-wt-lru": dict(page_size=1, policy="lru", write_policy="write_through",
                                 device=24, host=24, max_pages=8, lbt=1, mamba=8, path_cap=2),
    "p1-mamba-cap1-wb-lru": dict(page_size=1, policy="lru", write_policy="write_back",
                                 device=24, host=24, max_pages=8, lbt=1, mamba=8, path_cap=1),
    # (FULL, SWA): ``swa_window`` W, ``swa_device`` the SWA device pool (smaller than the
    # Full one: SWA evictions, tombstones); SGLang sizes the SWA host pool from the same
    # hicache_ratio over it (p1-swa4: 13 tokens, p1-swa8: 8, p4-swa8: 44 / 28 under
    # write-back, p2-swa5: 32), so backups often evict SWA host values
    "p1-swa4-wt-lru": dict(page_size=1, policy="lru", write_policy="write_through",
                           device=16, host=20, max_pages=6, lbt=1, swa_window=4, swa_device=10),
    "p1-swa8-wts-lfu": dict(page_size=1, policy="lfu", write_policy="write_through_selective",
                            device=24, host=12, max_pages=6, lbt=1, swa_window=8,
                            swa_device=16),
    "p4-swa8-wt-lru": dict(page_size=4, policy="lru", write_policy="write_through",
                           device=16 * 4, host=18 * 4, max_pages=6, lbt=1, swa_window=8,
                           swa_device=10 * 4),
    "p2-swa5-wt-fifo-t10": dict(page_size=2, policy="fifo", write_policy="write_through",
                                device=20 * 2, host=20 * 2, min_pages=4, max_pages=12, lbt=10,
                                swa_window=5, swa_device=16 * 2),
    "p1-swa4-wb-lru": dict(page_size=1, policy="lru", write_policy="write_back",
                           device=16, host=20, max_pages=6, lbt=1, swa_window=4, swa_device=10),
    "p4-swa8-wb-lfu": dict(page_size=4, policy="lfu", write_policy="write_back",
                           device=16 * 4, host=12 * 4, max_pages=6, lbt=1, swa_window=8,
                           swa_device=10 * 4),
    # (FULL, SWA, MAMBA): both of the above (SGLang's _MambaSwaStrategy host stack: KV,
    # SWA and Mamba host pools, all sized from the same hicache_ratio: p1-swa4-mamba
    # 20 / 13 tokens, 8 states; p1-swa8-mamba 12 / 8 tokens, 4 states)
    "p1-swa4-mamba-wt-lru": dict(page_size=1, policy="lru", write_policy="write_through",
                                 device=16, host=20, max_pages=6, lbt=1, swa_window=4,
                                 swa_device=10, mamba=6),
    "p1-swa8-mamba-wts-lfu": dict(page_size=1, policy="lfu",
                                  write_policy="write_through_selective", device=24, host=12,
                                  max_pages=10, lbt=1, swa_window=8, swa_device=16, mamba=8),
    "p1-swa4-mamba-wb-lru": dict(page_size=1, policy="lru", write_policy="write_back",
                                 device=16, host=20, max_pages=6, lbt=1, swa_window=4,
                                 swa_device=10, mamba=6),
    "p4-swa8-mamba-wt-fifo": dict(page_size=4, policy="fifo", write_policy="write_through",
                                  device=16 * 4, host=20 * 4, max_pages=6, lbt=1, swa_window=8,
                                  swa_device=10 * 4, mamba=6, chunk=4),
}

# Self-test: deliberately wrong flatradix façades (FlatSide applies ``mutant``); each
# must be caught within SELFTEST_OPS ops.
MUTANTS = {
    # backs up at the 2nd hit under write_through (threshold 2 instead of 1)
    "wt-threshold-off-by-one": ("p1-wt-lru", dict(wt_threshold_delta=1)),
    # loads host hits shorter than load_back_threshold
    "load-back-threshold-ignored": ("p4-wt-fifo", dict(ignore_lbt=True)),
    # a backup that finds the host pool short gives up instead of evicting host leaves
    "backup-no-host-evict": ("p1-wt-lru", dict(backup_no_host_evict=True)),
    # match_prefix reports host_hit_length 0
    "host-hit-zero": ("p4-wt-lru", dict(host_hit_zero=True)),
    # flush_pending_backups submits one ack per backup instead of one merged ack
    "one-ack-per-backup": ("p1-wt-lfu", dict(ack_per_backup=True)),
    # write-back host eviction skips the reclaim of duplicate host copies
    "wb-no-reclaim": ("p4-wb-lru", dict(wb_no_reclaim=True)),
    # write-back eviction drops every victim instead of backing it up
    "wb-always-drop": ("p1-wb-lru", dict(wb_always_drop=True)),
    # insert_host under write-through runs the write-back rules (no refill, no drop)
    "insert-host-as-write-back": ("p2-wts-lru", dict(insert_host_as_wb=True)),
    # Mamba: a backup finds no host state slot (the node's backup gives up)
    "mamba-no-state-backup": ("p1-mamba-wt-lru", dict(no_state_backup=True)),
    # Mamba: match_prefix reports mamba_host_hit_length 0 (no state-only load-back)
    "mamba-host-hit-zero": ("p1-mamba-wts-lfu", dict(mamba_host_hit_zero=True)),
    # Mamba: a load-back never gives the request a slot of its own (no copy)
    "mamba-no-request-state": ("p4-mamba-wt-fifo", dict(no_request_state=True)),
    # SWA: match_prefix reports swa_host_hit_length 0 (no window-only load-back)
    "swa-host-hit-zero": ("p1-swa4-wt-lru", dict(swa_host_hit_zero=True)),
    # SWA: a backup leaves the SWA window out (Full host copies only)
    "swa-backup-no-window": ("p4-swa8-wt-lru", dict(swa_no_window_backup=True)),
    # SWA: a load-back restores the Full KV only (no SWA window to the device)
    "swa-load-no-window": ("p2-swa5-wt-fifo-t10", dict(swa_no_window_load=True)),
    # SWA: flatradix built with a window one token larger than SGLang's
    "swa-window-larger": ("p1-swa4-wt-lru", dict(swa_window=5)),
    # SWA + Mamba: evict_host(n, SWA) of an internal node keeps its Mamba host state
    # (no cascade to the lower-priority component)
    "swa-host-evict-no-state-cascade": ("p1-swa4-mamba-wt-lru", dict(swa_no_state_cascade=True)),
    # storage prefetch: a staged SWA window shorter than one window below a non-root
    # anchor is kept (the commit's all-or-nothing rule read with a 1-token window)
    "prefetch-swa-short-window-kept": ("p4-swa8-wt-lru", dict(prefetch_window_one=True)),
    # storage prefetch: the staged Mamba state is freed instead of given to the node
    "prefetch-state-dropped": ("p1-mamba-wt-lru", dict(prefetch_state_dropped=True)),
    # Mamba: a cow_mamba match copies the last device node's state, not the best match
    # node's device state (issue 33)
    "mamba-cow-from-device-node": ("p1-mamba-wt-lru", dict(cow_from_device_node=True)),
}

SELFTEST_OPS = 2000
MAX_LOCKS = 4
MAX_HOST_LOCKS = 3
CHECK_EVERY = 32
TREE_EVERY = 4
QUOTAS = (None, None, None, 1, 2, 4, 8)  # mem_quota in pages (None: no quota)
WEIGHTS = dict(insert=7, match=3, lock=1, unlock=1, evict=3, evict_host=1, flush=2, wcheck=2,
               step=1, load=4, load_back=1, ready=2, lcheck=2, hlock=1, hunlock=1, wdrain=1,
               insert_host=2)
MAMBA_WEIGHTS = dict(cow=2)  # the Mamba configurations' own ops (the others' streams unchanged)


# --------------------------------------------------------------------------- the two sides
class FlatSide:
    """flatradix's ``UnifiedRadixCache`` with its host tier, its own device
    allocator (``TokenToKVPoolAllocator``) and host pool, every allocation and free
    the cache makes logged in call order (the driver's own ones are not)."""

    name = "flatradix"

    def __init__(self, cfg):
        import flatradix
        from flatradix.kernels import layout as L

        self.fr = flatradix
        P = self.P = cfg["page_size"]
        mut = cfg.get("mutant", {})
        self.log = []
        self._quiet = False  # the driver's own allocations / frees are not logged
        self.mamba = bool(cfg.get("mamba"))
        self.swa = cfg.get("swa_window") is not None
        extra = {}
        if self.swa:
            # its two sides logged on their own (load-backs allocate from each)
            CT = flatradix.ComponentType
            self.alloc = flatradix.SWATokenToKVPoolAllocator(cfg["device"], cfg["swa_device"],
                                                             page_size=P)
            self._logged(self.alloc.full_attn_allocator, "d")
            self._logged(self.alloc.swa_attn_allocator, "w")
            self._alloc, self._free = self._quietly(self.alloc.alloc), \
                self._quietly(self.alloc.free)
            extra = dict(tree_components=(CT.FULL, CT.SWA),
                         sliding_window_size=mut.get("swa_window", cfg["swa_window"]))
        else:
            self.alloc = flatradix.TokenToKVPoolAllocator(cfg["device"], page_size=P)
            self._alloc, self._free = self._logged(self.alloc, "d")
        if self.mamba:
            CT = flatradix.ComponentType
            self.rtp = flatradix.HybridReqToTokenPool(4, 256, mamba_size=cfg["mamba"],
                                                      enable_mamba_extra_buffer=P > 1)
            self.malloc = self.rtp.mamba_allocator
            self._malloc, self._mfree = self._logged(self.malloc, "m")
            extra.update(tree_components=extra.get("tree_components", (CT.FULL,)) + (CT.MAMBA,),
                         req_to_token_pool=self.rtp, mamba_cache_chunk_size=cfg.get("chunk", 8),
                         enable_mamba_extra_buffer=P > 1,
                         mamba_max_states_per_path=cfg.get("path_cap", -1))
        self.cache = c = flatradix.UnifiedRadixCache(
            page_size=P, eviction_policy=cfg["policy"], token_to_kv_pool_allocator=self.alloc,
            enable_kv_cache_events=True,
            # tiny initial arrays: table growth and pool compaction run early and often
            node_capacity=8, pool_capacity=128, **extra)
        # flatradix moves the bytes at commit (the transfer callable); they are
        # submitted (merged, one ack) at flush / ready: gathered until then
        self.backups, self.loads = [], []
        self.state_backups, self.state_loads = [], []
        self.swa_backups, self.swa_loads = [], []

        def transfer(kind, dev, host):
            pairs = list(zip(np.asarray(host).tolist(), np.asarray(dev).tolist()))
            {"backup": self.backups, "load": self.loads, "backup_state": self.state_backups,
             "load_state": self.state_loads, "backup_swa": self.swa_backups,
             "load_swa": self.swa_loads}[kind].append(pairs)

        hextra = {}
        ratio = (cfg["host"] - P + 0.5) / cfg["device"]  # the hicache_ratio the peer derives
        if self.mamba:  # SGLang's MambaPoolHost sizing
            hextra["mamba_host_size"] = int(self.malloc.size * ratio) + 1
        if self.swa:  # SGLang's SWA host pool: the Full pool's sizing over the SWA side
            hextra["swa_host_size"] = (int(cfg["swa_device"] * ratio) // P + 1) * P
        c.init_hicache(host_size=cfg["host"], hicache_write_policy=cfg["write_policy"],
                       load_back_threshold=cfg["lbt"], transfer=transfer, **hextra)
        self._logged(c.mem_pool_host, "h")
        if self.mamba:
            self._logged(c.mamba_pool_host, "s")
        if self.swa:
            self._logged(c.swa_pool_host, "v")
        # ---- self-test mutants (never in a real configuration); the host tier's
        # internals are its object's (``c._hicache``)
        h = c._hicache
        if mut.get("wt_threshold_delta"):
            c._engine.st.meta[L.M_WT_THRESHOLD] += mut["wt_threshold_delta"]
        if mut.get("ignore_lbt"):
            c.load_back_threshold = 0
        if mut.get("backup_no_host_evict"):
            run_backup = h._run_backup

            def no_host_evict(*a):  # (slot, aux): the barrier passes both
                h._evict_host_units = lambda n: 0
                try:
                    return run_backup(*a)
                finally:
                    del h._evict_host_units
            h._run_backup = no_host_evict
        if mut.get("wb_no_reclaim"):
            evict_units = h._evict_host_units

            def no_reclaim(n):  # host eviction as under write-through: no duplicate reclaim
                meta = c._engine.st.meta
                meta[L.M_HOST] = L.HOST_WRITE_THROUGH
                try:
                    return evict_units(n)
                finally:
                    meta[L.M_HOST] = L.HOST_WRITE_BACK
            h._evict_host_units = no_reclaim
        if mut.get("wb_always_drop"):
            h._write_back_backup = lambda nid: False
        if mut.get("insert_host_as_wb"):
            insert_host = c.insert_host

            def as_write_back(*a, **k):
                meta = c._engine.st.meta
                old, meta[L.M_HOST] = meta[L.M_HOST], L.HOST_WRITE_BACK
                try:
                    return insert_host(*a, **k)
                finally:
                    meta[L.M_HOST] = old
            c.insert_host = as_write_back
        if self.mamba:  # count SGLang's InternalStateBackup steps (write-back)
            state_victim = h._state_victim

            def counted(*a, **k):
                self.state_victims += 1
                return state_victim(*a, **k)
            self.state_victims = 0
            h._state_victim = counted
        if mut.get("no_state_backup"):
            h._state_host_alloc = lambda: None
        if mut.get("mamba_host_hit_zero"):
            match0 = c.match_prefix
            c.match_prefix = lambda params: match0(params)._replace(mamba_host_hit_length=0)
        if mut.get("no_request_state"):
            h._holds_state = lambda kv: True
        if mut.get("cow_from_device_node"):
            match_c = c.match_prefix

            def cow_from_device_node(params):  # the copy-on-write of issue 33's old code
                if not getattr(params, "cow_mamba", False):
                    return match_c(params)
                m = match_c(flatradix.MatchPrefixParams(key=params.key))
                c._cow_mamba(params.req, m.last_device_node)
                return m
            c.match_prefix = cow_from_device_node
        if mut.get("swa_host_hit_zero"):
            match_s = c.match_prefix
            c.match_prefix = lambda params: match_s(params)._replace(swa_host_hit_length=0)
        if mut.get("swa_no_window_backup") or mut.get("swa_no_window_load"):
            # the backup / load plan finds no SWA data to copy (the engine's caller of
            # that kernel replaced)
            plan = "swa_backup_plan" if mut.get("swa_no_window_backup") else "swa_load_plan"
            setattr(c._engine.k, plan, lambda *a: (L.OK, 0, 0))
        if mut.get("swa_no_state_cascade"):
            evict_swa = h._evict_host_swa

            def no_cascade(n):  # the internal nodes' host states hidden from the kernel
                nodes = c._engine.st.nodes
                hidden = np.flatnonzero((nodes[:, L.FLAGS] & L.F_HAS_MAMBA_HOST != 0)
                                        & (nodes[:, L.HOST_HEAP_POS] < 0))
                nodes[hidden, L.FLAGS] &= ~L.F_HAS_MAMBA_HOST
                try:
                    return evict_swa(n)
                finally:  # the kernel may have grown the arrays (rows keep their numbers)
                    c._engine.st.nodes[hidden, L.FLAGS] |= L.F_HAS_MAMBA_HOST
            h._evict_host_swa = no_cascade
        if mut.get("prefetch_window_one") or mut.get("prefetch_state_dropped"):
            refill = c.insert_host

            def mutated(*a, **k):
                meta = c._engine.st.meta
                if mut.get("prefetch_state_dropped") and k.get("mamba_host_value") is not None:
                    c.mamba_pool_host.free(np.array([k.pop("mamba_host_value")]))
                old = meta[L.M_SWA_WINDOW]
                if mut.get("prefetch_window_one"):
                    meta[L.M_SWA_WINDOW] = 1
                try:
                    return refill(*a, **k)
                finally:
                    c._engine.st.meta[L.M_SWA_WINDOW] = old
            c.insert_host = mutated
        if mut.get("host_hit_zero"):
            match = c.match_prefix
            c.match_prefix = lambda params: match(params)._replace(host_hit_length=0)
        if mut.get("ack_per_backup"):
            def flush_each():
                with c._mutex:
                    for cid in h._write_queue:
                        h._write_acks.append([cid])
                    h._write_queue = []
            h.flush_pending_backups = flush_each
        c.take_events()

    def _logged(self, pool, tier):
        """Log every ``pool.alloc`` / ``pool.free`` the cache makes as ``(tier +
        "alloc" | tier + "free", slots)``; returns the unlogged pair (the driver's
        own calls)."""
        alloc, free = pool.alloc, pool.free

        def logged_alloc(n):
            out = alloc(n)
            if out is not None and not self._quiet:
                self.log.append((tier + "alloc", np.asarray(out).reshape(-1).tolist()))
            return out

        def logged_free(idx):
            if not self._quiet:
                self.log.append((tier + "free", np.asarray(idx).reshape(-1).tolist()))
            return free(idx)

        pool.alloc, pool.free = logged_alloc, logged_free
        return alloc, free

    def _quietly(self, fn):
        """``fn`` with the logging off (the driver's own calls into the SWA allocator,
        which reach the logged sides)."""
        def call(*a, **k):
            self._quiet = True
            try:
                return fn(*a, **k)
            finally:
                self._quiet = False
        return call

    # -- slots the driver hands to inserts (not logged)
    def alloc_slots(self, n):
        out = self._alloc(n)
        return None if out is None else np.asarray(out).tolist()

    def free_slots(self, slots):
        self._free(np.asarray(slots, dtype=np.int64))

    def swa_peers(self, slots):
        """The SWA slots Full slots map to (0: none)."""
        if not slots:
            return []
        return np.asarray(self.alloc.translate_swa_indices_for_transfer(
            np.asarray(slots, dtype=np.int64))).tolist()

    def free_swa(self, slots):
        self._quietly(self.alloc.free_swa_segment)(np.asarray(slots, dtype=np.int64))

    def alloc_state(self):
        out = self._malloc(1)
        return None if out is None else int(np.asarray(out).reshape(-1)[0])

    def free_state(self, slot):
        self._mfree(np.asarray([slot], dtype=np.int64))

    def take_log(self):
        out, self.log = self.log, []
        return out

    def root(self):
        return self.cache.root_node_handle()

    def insert(self, toks, value, prev, inserted, state=None, cursor=0):
        fr = self.fr
        extra = {} if state is None else dict(mamba_value=np.asarray([state], dtype=np.int64))
        params = fr.InsertParams(
            key=fr.RadixKey(np.asarray(toks, dtype=np.int64)),
            value=np.asarray(value, dtype=np.int64), prev_prefix_len=prev, inserted_len=inserted,
            **extra)
        if cursor:
            params.set_evicted_seqlen(fr.ComponentType.SWA, cursor)
        return self.cache.insert(params)

    def match(self, toks):
        return self.cache.match_prefix(self.fr.MatchPrefixParams(
            key=self.fr.RadixKey(np.asarray(toks, dtype=np.int64))))

    def match_cow(self, toks, state=None):
        from .hicache_peer import cow_match

        return cow_match(self.fr.MatchPrefixParams, self.fr.RadixKey(
            np.asarray(toks, dtype=np.int64)), self.cache.match_prefix, state)

    def path_device_indices(self, node, n):
        return np.asarray(self.cache.path_device_indices(node))[:n].tolist() if n else []

    def node_depth(self, node):
        return self.fr.inspection.path_units(self.cache._engine, node)

    def _req(self, last_node, mamba_host_hit=0, state=None, swa_host_hit=0):
        from .hicache_peer import _ReqKV

        return SimpleNamespace(last_node=last_node, mamba_host_hit_length=mamba_host_hit,
                               swa_host_hit_length=swa_host_hit, kv=_ReqKV(state))

    def init_load_back(self, best, hit, mem_quota, last_node, mamba_host_hit=0, state=None,
                       swa_host_hit=0):
        from .hicache_peer import _slot

        req = self._req(last_node, mamba_host_hit, state, swa_host_hit)
        r = self.cache.init_load_back(self.fr.InitLoadBackParams(
            best_match_node=best, host_hit_length=hit, mem_quota=mem_quota, req=req))
        return r, _slot(req.kv.mamba_pool_idx)

    def load_back(self, node, mem_quota, last_node, state=None):
        from .hicache_peer import _slot

        req = self._req(last_node, 0, state)
        r = self.cache.load_back(node, mem_quota, req=req)
        return r, _slot(req.kv.mamba_pool_idx)

    def host_lock(self, node):
        return self.cache.inc_host_lock_ref(node)

    def host_alloc(self, n):
        out = self.cache.mem_pool_host.alloc(n)  # logged halloc
        return None if out is None else out.tolist()

    def host_free(self, slots):
        if slots:
            self.cache.mem_pool_host.free(np.asarray(slots, dtype=np.int64))

    def insert_host(self, anchor, toks, host_slots, path_toks, swa_slots=None, state_slot=None):
        return self.cache.insert_host(
            anchor, self.fr.RadixKey(np.asarray(toks, dtype=np.int64)),
            np.asarray(host_slots, dtype=np.int64),
            swa_host_value=None if swa_slots is None else np.asarray(swa_slots, dtype=np.int64),
            mamba_host_value=state_slot)

    def swa_host_alloc(self, n):
        out = self.cache.swa_pool_host.alloc(n)  # logged valloc
        return None if out is None else out.tolist()

    def state_host_alloc(self):
        out = self.cache.mamba_pool_host.alloc(1)  # logged salloc
        return None if out is None else int(out[0])

    def host_unlock(self, node, h):
        self.cache.dec_host_lock_ref(node, h.to_dec_params())

    def evict(self, n, states=0, swa=0):
        if self.swa and self.mamba:
            r = self.cache.evict(self.fr.EvictParams(num_tokens=n, swa_num_tokens=swa,
                                                     mamba_num=states))
            return r.num_tokens_evicted, r.swa_num_tokens_evicted, r.mamba_num_evicted
        if self.swa:
            r = self.cache.evict(self.fr.EvictParams(num_tokens=n, swa_num_tokens=swa))
            return r.num_tokens_evicted, r.swa_num_tokens_evicted
        r = self.cache.evict(self.fr.EvictParams(num_tokens=n, mamba_num=states))
        return r.num_tokens_evicted if not self.mamba else (r.num_tokens_evicted,
                                                            r.mamba_num_evicted)

    def take_submitted(self):
        """(backups, loads, state backups, state loads, SWA backups, SWA loads)
        submitted since the last call: each a list of (host, device) pairs.
        flatradix records the pairs at commit; a commit's pairs are submitted once
        its queue is empty again (flush / ready submit the whole queue; no op both
        commits and submits)."""
        h = self.cache._hicache

        def flat(xs):
            return [p for x in xs for p in x]
        b = l = bs = ls = wb = wl = []
        if (self.backups or self.state_backups or self.swa_backups) and not h._write_queue:
            b, bs, wb = flat(self.backups), flat(self.state_backups), flat(self.swa_backups)
            self.backups, self.state_backups, self.swa_backups = [], [], []
        if (self.loads or self.state_loads or self.swa_loads) and not h._load_queue:
            l, ls, wl = flat(self.loads), flat(self.state_loads), flat(self.swa_loads)
            self.loads, self.state_loads, self.swa_loads = [], [], []
        return b, l, bs, ls, wb, wl

    # -- state views (the queues are private to flatradix's façade: read for the oracle)
    def sizes(self):
        c = self.cache
        out = dict(evictable=c.evictable_size(), protected=c.protected_size(),
                   total=tuple(c.total_size()), device_available=self.alloc.available_size(),
                   host_available=c.mem_pool_host.available_size())
        if self.swa:
            out.update(swa_evictable=c.swa_evictable_size(),
                       swa_protected=c.swa_protected_size(),
                       full_available=self.alloc.full_available_size(),
                       swa_available=self.alloc.swa_available_size(),
                       swa_host_available=c.swa_pool_host.available_size())
        if self.mamba:
            out.update(mamba_evictable=c.mamba_evictable_size(),
                       mamba_protected=c.mamba_protected_size(),
                       state_available=self.malloc.available_size(),
                       state_host_available=c.mamba_pool_host.available_size())
        return out

    def protocol(self):
        c = self.cache
        h = c._hicache
        return dict(ongoing_write_through=list(c.ongoing_write_through),
                    ongoing_load_back=list(c.ongoing_load_back),
                    write_queue=list(h._write_queue), write_acks=[list(a) for a in h._write_acks],
                    load_queue=list(h._load_queue), load_acks=[list(a) for a in h._load_acks])

    def host_ledger(self):
        c = self.cache
        out = (c.host_total_size(), c.host_evictable_size())
        if self.swa:
            out += (c.swa_host_total_size(),)
        return out + (c.mamba_host_total_size(),) if self.mamba else out

    def values(self):
        return np.asarray(self.cache.all_values_flatten()).tolist()

    def state_values(self):
        return np.asarray(self.cache.all_mamba_values_flatten()).reshape(-1).tolist()

    def tree(self):
        """{path tokens: (device slots | None, host slots | None, write-through ack id
        | None, lock_ref, host lock_ref, hit_count)} of every non-root node
        (flatradix's arrays, read-only)."""
        from flatradix import inspection
        from flatradix.kernels import layout as L

        eng = self.cache._engine
        nodes = eng.st.nodes
        paths, out = {L.ROOT: ()}, {}
        with self.cache._mutex:
            for s, _ in inspection.dfs(nodes):
                if s == L.ROOT:
                    continue
                info = inspection.node_info(eng, s, 0)
                path = paths[int(nodes[s, L.PARENT])] + tuple(info["key"].tolist())
                paths[s] = path
                pending = int(nodes[s, L.WT_PENDING])
                row = (info["value"].tolist() if not info["evicted"] else None,
                       info["host_value"].tolist() if info["backuped"] else None,
                       pending or None, info["lock_ref"], int(nodes[s, L.FULL_HOST_LOCK]),
                       info["hit_count"])
                if self.mamba:
                    f = int(nodes[s, L.FLAGS])
                    row += ((int(nodes[s, L.MAMBA_SLOT]) if f & L.F_HAS(L.MAMBA) else None,
                             int(nodes[s, L.MAMBA_HOST_SLOT]) if f & L.F_HAS_MAMBA_HOST else None,
                             int(nodes[s, L.LOCK_COL(L.MAMBA)]),
                             int(nodes[s, L.LOCK_COL(L.MAMBA, L.HOST)])),)
                if self.swa:
                    f = int(nodes[s, L.FLAGS])
                    pool = eng.st.pool
                    off, n = int(nodes[s, L.KEY_OFF]), int(nodes[s, L.KEY_LEN])
                    row += ((self.swa_peers(pool[off:off + n, L.FULL_DEV].tolist())
                             if f & L.F_HAS_SWA_DEV else None,
                             pool[off:off + n, pool.shape[1] - 2].tolist()
                             if f & L.F_HAS_SWA_HOST else None,
                             int(nodes[s, L.LOCK_COL(L.SWA)]),
                             int(nodes[s, L.LOCK_COL(L.SWA, L.HOST)])),)
                out[path] = row
        return out

    def check(self):
        self.cache.sanity_check()


class SglSide:
    """SGLang's cache (``hicache_peer.SglHiCache``) behind the same interface."""

    def __init__(self, cfg, core):
        from .hicache_peer import SglHiCache

        self.name = f"sglang-{core}"
        self.core = core
        self.h = SglHiCache(core, cfg["page_size"], cfg["device"], cfg["host"],
                            cfg["write_policy"], cfg["policy"], cfg["lbt"],
                            mamba_states=cfg.get("mamba", 0), chunk=cfg.get("chunk", 8),
                            path_cap=cfg.get("path_cap", -1), swa_window=cfg.get("swa_window"),
                            swa_tokens=cfg.get("swa_device"))
        self.mamba = self.h.mamba
        self.swa = self.h.swa
        self.cache = self.h.cache
        self._d2h = self._h2d = 0

    def alloc_slots(self, n):
        return self.h.alloc_slots(n)

    def free_slots(self, slots):
        self.h.free_slots(slots)

    def swa_peers(self, slots):
        return self.h.swa_peers(slots)

    def free_swa(self, slots):
        self.h.free_swa(slots)

    def alloc_state(self):
        return self.h.alloc_state()

    def free_state(self, slot):
        self.h.free_state(slot)

    def take_log(self):
        return self.h.take_log()

    def root(self):
        return self.h.root

    def insert(self, toks, value, prev, inserted, state=None, cursor=0):
        return self.h.insert(toks, value, prev, inserted, state, cursor)

    def match(self, toks):
        return self.h.match(toks)

    def match_cow(self, toks, state=None):
        return self.h.match_cow(toks, state)

    def path_device_indices(self, node, n):
        return self.h.path_device_indices(node, n)

    def node_depth(self, node):
        n = self.cache.tree_core.node_by_id(node)  # the Python core (a --first side)
        d = 0
        while n is not self.cache.tree_core.root_node:
            d += len(n.key)
            n = n.parent
        return d

    def init_load_back(self, best, hit, mem_quota, last_node, mamba_host_hit=0, state=None,
                       swa_host_hit=0):
        return self.h.init_load_back(best, hit, mem_quota, last_node, mamba_host_hit, state,
                                     swa_host_hit)

    def load_back(self, node, mem_quota, last_node, state=None):
        return self.h.load_back(node, mem_quota, last_node, state)

    def host_lock(self, node):
        return self.cache.inc_host_lock_ref(node)

    def host_alloc(self, n):
        return self.h.host_alloc(n)

    def host_free(self, slots):
        self.h.host_free(slots)

    def insert_host(self, anchor, toks, host_slots, path_toks, swa_slots=None, state_slot=None):
        return self.h.insert_host(anchor, toks, host_slots, path_toks, swa_slots, state_slot)

    def swa_host_alloc(self, n):
        out = self.h.swa_host_pool.alloc(n)  # logged valloc
        return None if out is None else out.tolist()

    def state_host_alloc(self):
        out = self.h.state_host_pool.alloc(1)  # logged salloc
        return None if out is None else int(out[0])

    def host_unlock(self, node, h):
        self.cache.dec_host_lock_ref(node, h.to_dec_params())

    def evict(self, n, states=0, swa=0):
        return self.h.evict(n, states, swa)

    def take_submitted(self):
        e = self.h.engine

        def flat(xs, start):
            return [p for x in xs[start:] for p in x]
        out = (flat(e.d2h, self._d2h), flat(e.h2d, self._h2d), flat(e.d2h_state, self._d2h),
               flat(e.h2d_state, self._h2d), flat(e.d2h_swa, self._d2h),
               flat(e.h2d_swa, self._h2d))
        self._d2h, self._h2d = len(e.d2h), len(e.h2d)
        return out

    def sizes(self):
        c = self.cache
        out = dict(evictable=c.full_evictable_size(), protected=c.full_protected_size(),
                   total=tuple(c.total_size()), device_available=self.h.alloc.available_size(),
                   host_available=self.h.host_available())
        if self.swa:
            a = self.h.alloc
            out.update(swa_evictable=c.swa_evictable_size(),
                       swa_protected=c.swa_protected_size(),
                       full_available=a.full_available_size(),
                       swa_available=a.swa_available_size(),
                       swa_host_available=self.h.swa_host_available())
        if self.mamba:
            out.update(mamba_evictable=c.mamba_evictable_size(),
                       mamba_protected=c.mamba_protected_size(),
                       state_available=self.h.malloc.available_size(),
                       state_host_available=self.h.state_host_available())
        return out

    def protocol(self):
        c, h = self.cache, self.h
        return dict(ongoing_write_through=list(c.ongoing_write_through),
                    ongoing_load_back=list(c.ongoing_load_back),
                    write_queue=h.write_queue(), write_acks=h.write_acks(),
                    load_queue=h.load_queue(), load_acks=h.load_acks())

    def host_ledger(self):
        if self.core != "python":
            return None
        out = self.h.host_ledger()
        if self.swa:
            out += (self.h.swa_host_total(),)
        if self.mamba:
            tc = self.cache.tree_core
            M = self.h.S.ComponentType.MAMBA
            out = out + (sum(1 for n in tc._node_arena.values() if n is not tc.root_node
                             and n.component_data[M].host_value is not None),)
        return out

    def values(self):
        return self.cache.all_values_flatten().tolist()

    def state_values(self):
        return self.cache.all_mamba_values_flatten().reshape(-1).tolist()

    def tree(self):
        """``FlatSide.tree`` from the Python core's node arena (None: Rust core)."""
        if self.core != "python":
            return None
        tc = self.cache.tree_core
        FULL = self.h.S.ComponentType.FULL
        paths, out = {}, {}

        def path(n):
            if n is tc.root_node:
                return ()
            if n.id not in paths:
                paths[n.id] = path(n.parent) + tuple(n.key.token_ids)
            return paths[n.id]

        for n in tc._node_arena.values():
            if n is tc.root_node:
                continue
            cd = n.component_data[FULL]
            row = (None if cd.value is None else cd.value.tolist(),
                   None if cd.host_value is None else cd.host_value.tolist(),
                   n.write_through_pending_id, cd.lock_ref, cd.host_lock_ref, n.hit_count)
            if self.mamba:
                md = n.component_data[self.h.S.ComponentType.MAMBA]
                row += ((None if md.value is None else int(md.value.reshape(-1)[0]),
                         None if md.host_value is None else int(md.host_value.reshape(-1)[0]),
                         md.lock_ref, md.host_lock_ref),)
            if self.swa:
                sd = n.component_data[self.h.S.ComponentType.SWA]
                row += ((None if sd.value is None else sd.value.tolist(),
                         None if sd.host_value is None else sd.host_value.tolist(),
                         sd.lock_ref, sd.host_lock_ref),)
            out[path(n)] = row
        return out

    def check(self):
        """SGLang's own ``sanity_check``, less one rule (DIFFERENCES 6): its cores'
        write_back duplicate registry (Python ``full_host_duplicates``, Rust "full
        host coexistence") can miss a settled D+H node under write_through, which
        never reads that registry."""
        try:
            with contextlib.redirect_stdout(io.StringIO()), \
                    contextlib.redirect_stderr(io.StringIO()):  # it prints the tree first
                self.cache.sanity_check()
        except AssertionError as e:
            lines = str(e).splitlines()
            head = lines[0] if lines else ""
            n = int(head.split("(")[1].split()[0]) if head.startswith("Sanity check FAILED (") \
                else -1
            # Python core: "Duplicate missing: [ids]"; Rust core: "Full host
            # coexistence missing: [NodeIdx_(n)]" (the same registry)
            dup = [ln for ln in lines[1:] if ln.strip().startswith(
                ("Duplicate missing:", "Full host coexistence missing:"))]
            if n != len(dup) or self.h.cc is None or \
                    self.cache.cache_controller.write_policy == "write_back":
                raise
            self.dup_registry_misses = getattr(self, "dup_registry_misses", 0) + 1


# --------------------------------------------------------------------------- executor
class SlotMap:
    """Bijection first-side slot <-> second-side slot for one tier (device or host),
    for the slots currently handed out."""

    def __init__(self, tier):
        self.tier = tier
        self.a2b, self.b2a = {}, {}

    def bind(self, what, a, b):
        if len(a) != len(b):
            raise Divergence(f"{what}.{self.tier}_alloc_len", f"first={a} second={b}")
        for x, y in zip(a, b):
            if x in self.a2b or y in self.b2a:
                raise Divergence(f"{what}.{self.tier}_slot_accounting",
                                 f"slot handed out while held: first {x} "
                                 f"(held: {x in self.a2b}), second {y} (held: {y in self.b2a})")
            self.a2b[x] = y
            self.b2a[y] = x

    def to_a(self, what, bs):
        try:
            return [self.b2a[y] for y in bs]
        except KeyError as e:
            raise Divergence(f"{what}.{self.tier}_slot_unknown",
                             f"second side's slot {e.args[0]} was never handed out") from None

    def release(self, what, a, b, ordered):
        ma = self.to_a(what, b)
        if (ma if ordered else sorted(ma)) != (list(a) if ordered else sorted(a)):
            raise Divergence(f"{what}.{self.tier}_frees",
                             f"first={list(a)} second={list(b)} (second mapped: {ma})")
        for y in b:
            x = self.b2a.pop(y)
            del self.a2b[x]


def _runs(log, tier):
    """A side's log entries of one tier as runs: [(kind, slots)], consecutive
    entries of the same kind merged."""
    out = []
    for kind, slots in log:
        if kind[0] != tier or not slots:  # an empty free / allocation is no call at all
            continue
        k = kind[1:]
        if out and out[-1][0] == k:
            out[-1][1].extend(slots)
        else:
            out.append((k, list(slots)))
    return out


def _removed_sets(events):
    """Events with each CPU ``Removed`` event's hashes as a sorted tuple (DIFFERENCES
    9); GPU removals keep their order."""
    return [("Removed", tuple(sorted(e[1])), e[2]) if e[0] == "Removed" and e[2] != "GPU"
            else e for e in events]


def _atoms(events):
    """Events as a sorted multiset, removals split per block (tolerating
    ``insert-event-order``: the same events, in another order or grouping)."""
    out = []
    for e in events:
        if e[0] == "Removed":
            out.extend(("Removed", h, e[2]) for h in e[1])
        else:
            out.append(e)
    return sorted(out, key=repr)


def _host_locked(r):
    """An ``inc_host_lock_ref`` receipt: [(component, stamped)] (the stamps are each
    side's own numbers; a component present with None reached the root)."""
    return sorted((int(k), v is not None) for k, v in (r.component_host_lock_uuids or {}).items())


def _match_fields(m):
    """The MatchResult fields besides indices and nodes."""
    return (m.device_prefix_len, m.host_hit_length, m.full_kv_hit_length, m.swa_host_hit_length,
            m.swa_branching_seqlen, m.mamba_host_hit_length, m.mamba_branching_seqlen,
            m.cache_protected_len, m.full_device_match_len)


class Executor:
    """Applies ops to both sides and compares them. Every decision it takes
    depends only on the ops and on values already found equal, so an op list
    replays identically on fresh caches; ops that do not apply (an unlock with no
    lock held) are skipped, so the shrinker may delete ops freely."""

    def __init__(self, cfg, backend, first="flatradix"):
        self.cfg = cfg
        self.P = cfg["page_size"]
        self.a, self.b = self._both(
            "construct",
            lambda: FlatSide(cfg) if first == "flatradix" else SglSide(cfg, first),
            lambda: SglSide(cfg, backend))
        self.coalesce = backend == "rust" or first == "rust"
        self.ids = NodeIdMap()
        self.root_a = self.a.root()
        self.ids.bind("root", self.root_a, self.b.root())
        self.dev = SlotMap("device")
        self.host = SlotMap("host")
        self.mamba = bool(cfg.get("mamba"))
        self.mdev = SlotMap("state")          # Mamba device state slots
        self.req_states = []                  # finished requests' slots, freed after submission
        self.shost = SlotMap("state_host")    # Mamba host state slots
        self.swa = cfg.get("swa_window") is not None
        self.swadev = SlotMap("swa")          # SWA device slots
        self.swahost = SlotMap("swa_host")    # SWA host slots
        self.locks = []
        self.host_locks = []
        self.nops = 0
        self.stats = Counter()
        self._sync("init")

    # ----------------------------------------------------------- helpers
    def _both(self, what, fa, fb):
        """Call one operation on each side; an exception on either is a divergence."""
        try:
            x = fa()
        except Exception as e:  # noqa: BLE001 - any error is a finding
            x = e
        try:
            y = fb()
        except Exception as e:  # noqa: BLE001
            y = e
        if isinstance(x, Exception) or isinstance(y, Exception):
            ea = f"{type(x).__name__}: {x}" if isinstance(x, Exception) else "ok"
            eb = f"{type(y).__name__}: {y}" if isinstance(y, Exception) else "ok"
            side = ("both" if isinstance(x, Exception) and isinstance(y, Exception)
                    else "first" if isinstance(x, Exception) else "second")
            err = x if isinstance(x, Exception) else y
            raise Divergence(f"{what}.raised.{side}.{type(err).__name__}",
                             f"{self.a.name if hasattr(self, 'a') else 'first'}: {ea} | "
                             f"SGLang: {eb}")
        return x, y

    def _tolerated(self, name):
        if name in TOLERATE:
            self.stats[f"tolerated:{name}"] += 1
            return True
        return False

    def bind_node(self, what, x, y):
        self.ids.bind(what, x, y)

    def _drain(self, what):
        """Replay both sides' allocation / free logs into the slot bijections."""
        la, lb = self.a.take_log(), self.b.take_log()
        for tier, smap, ordered in (("d", self.dev, True), ("h", self.host, False),
                                    ("m", self.mdev, True), ("s", self.shost, False),
                                    ("w", self.swadev, True), ("v", self.swahost, False)):
            ra, rb = _runs(la, tier), _runs(lb, tier)
            compare(f"{what}.{smap.tier}_alloc_free_runs",
                    [(k, len(s)) for k, s in ra], [(k, len(s)) for k, s in rb])
            for (k, sa), (_, sb) in zip(ra, rb):
                if k == "alloc":
                    smap.bind(what, sa, sb)
                    self.stats[f"{smap.tier}_alloc_slots"] += len(sa)
                else:
                    smap.release(what, sa, sb, ordered)
                    self.stats[f"{smap.tier}_free_slots"] += len(sa)
                    if tier in "hv" and what == "insert":  # a backup made room
                        self.stats[f"insert_{smap.tier}_evict_slots"] += len(sa)

    def _map_nodes(self, what, xs, ys):
        compare(f"{what}.len", len(xs), len(ys))
        for x, y in zip(xs, ys):
            self.bind_node(what, x, y)

    def _sync(self, what):
        self._drain(what)
        (ba, la, bsa, lsa, wba, wla), (bb, lb, bsb, lsb, wbb, wlb) = (self.a.take_submitted(),
                                                                      self.b.take_submitted())
        for kind, pa, pb, hmap, dmap, unit in (
                ("backup", ba, bb, self.host, self.dev, "tokens"),
                ("load", la, lb, self.host, self.dev, "tokens"),
                ("backup_state", bsa, bsb, self.shost, self.mdev, "states"),
                ("load_state", lsa, lsb, self.shost, self.mdev, "states"),
                ("backup_swa", wba, wbb, self.swahost, self.swadev, "swa_tokens"),
                ("load_swa", wla, wlb, self.swahost, self.swadev, "swa_tokens")):
            if not (pa or pb):
                continue
            if kind.startswith("backup") and self.cfg["write_policy"] == "write_back":
                # write-back backs a victim up at eviction and then frees its device
                # slots; host room for it may come from host copies freed in the same
                # op; either tier's slots may be handed out again within the op, so the
                # bijections are rebound before this comparison: compare the amount
                # backed up here; every node's device and host slots are compared by
                # the whole-tree checks, the order by the CPU events
                compare(f"{what}.submitted_backup_{unit}", len(pa), len(pb))
                self.stats[f"submitted_backup_{unit}"] += len(pa)
                continue
            mb = [(hmap.b2a.get(hh, ("?", hh)), dmap.b2a.get(d, ("?", d))) for hh, d in pb]
            compare(f"{what}.submitted_{kind}_pairs(host,device)", pa, mb)
            self.stats[f"submitted_{kind.split('_')[0]}_{unit}"] += len(pa)
        if self.req_states and not self.a.protocol()["load_queue"] and \
                not self.b.protocol()["load_queue"]:
            for ka, kb in self.req_states:
                self._free_state(f"{what}.req_state_free", ka, kb)
            self.req_states = []
        compare(f"{what}.sizes", self.a.sizes(), self.b.sizes())
        pa, pb = self.a.protocol(), self.b.protocol()
        for k in ("ongoing_write_through", "ongoing_load_back", "write_queue", "load_queue"):
            self._map_nodes(f"{what}.{k}", pa[k], pb[k])
        for k in ("write_acks", "load_acks"):
            compare(f"{what}.{k}.shape", [len(x) for x in pa[k]], [len(x) for x in pb[k]])
            for xa, xb in zip(pa[k], pb[k]):
                self._map_nodes(f"{what}.{k}", xa, xb)
        ha, hb = self.a.host_ledger(), self.b.host_ledger()
        if ha is not None and hb is not None:
            compare(f"{what}.host_ledger(host_total,host_evictable[,swa_host_total]"
                    f"[,mamba_host_total])", ha, hb)
        ea = event_tuples(self.a.cache.take_events())
        eb = event_tuples(self.b.cache.take_events())
        if self.coalesce:
            ea, eb = coalesce_removed(ea), coalesce_removed(eb)
            if ea != eb and _removed_sets(ea) == _removed_sets(eb):
                self.stats["rust_removed_order"] += 1  # DIFFERENCES 9
                eb = ea
        if not (ea != eb and what == "insert" and _atoms(ea) == _atoms(eb)
                and self._tolerated("insert-event-order")):
            compare(f"{what}.events", ea, eb)
        for e in ea:
            self.stats[f"event_{e[0]}_{e[6] if e[0] == 'Stored' else e[2]}"] += 1

    def _tree(self, what):
        """Node by node (paired by path): device and host slots through the
        bijections, the pending backup's ack id (a node id), lock_ref, host
        lock_ref, hit_count. Python core only (the Rust core exposes no node list)."""
        tb = self.b.tree()
        if tb is None:
            return
        ta = self.a.tree()
        compare(f"{what}.tree.paths", sorted(ta), sorted(tb))
        for path, (da, ha, pa, *rest_a) in ta.items():
            db, hb, pb, *rest_b = tb[path]
            if self.swa:
                (wa, wha, *wla), (wb, whb, *wlb) = rest_a.pop(), rest_b.pop()
                if (wa is None) != (wb is None) or (
                        wa is not None and wa != self.swadev.to_a(what, wb)):
                    raise Divergence(f"{what}.tree.swa_value",
                                     f"node {path}: first={wa} second={wb}")
                if (wha is None) != (whb is None) or (
                        wha is not None and wha != [self.swahost.b2a.get(x) for x in whb]):
                    raise Divergence(f"{what}.tree.swa_host_value",
                                     f"node {path}: first={wha} second={whb}")
                compare(f"{what}.tree.swa(lock_ref,host_lock_ref)@{path}", wla, wlb)
            if self.mamba:
                (ma, mha, *mla), (mb, mhb, *mlb) = rest_a.pop(), rest_b.pop()
                if (ma is None) != (mb is None) or (
                        ma is not None and ma != self.mdev.to_a(what, [mb])[0]):
                    raise Divergence(f"{what}.tree.mamba_value",
                                     f"node {path}: first={ma} second={mb}")
                if (mha is None) != (mhb is None) or (
                        mha is not None and mha != self.shost.b2a.get(mhb)):
                    raise Divergence(f"{what}.tree.mamba_host_value",
                                     f"node {path}: first={mha} second={mhb}")
                compare(f"{what}.tree.mamba(lock_ref,host_lock_ref)@{path}", mla, mlb)
            if (da is None) != (db is None) or (da is not None and da != self.dev.to_a(what, db)):
                raise Divergence(f"{what}.tree.device_value",
                                 f"node {path}: first={da} second={db}")
            if (ha is None) != (hb is None) or \
                    (ha is not None and ha != [self.host.b2a.get(x) for x in hb]):
                raise Divergence(f"{what}.tree.host_value", f"node {path}: first={ha} second={hb}")
            if pa is None or pb is None:
                compare(f"{what}.tree.write_through_pending@{path}", pa, pb)
            else:
                self.bind_node(f"{what}.tree.write_through_pending", pa, pb)
            compare(f"{what}.tree.(lock_ref,host_lock_ref,hit_count)@{path}", rest_a, rest_b)
        self.stats["tree_checks"] += 1

    def apply(self, op):
        kind = op[0]
        getattr(self, "op_" + kind)(*op[1:])
        self._sync(kind)
        if getattr(self.a, "state_victims", 0):
            self.stats["write_back_state_backups"] += self.a.state_victims
            self.a.state_victims = 0
        self.nops += 1
        self.stats[kind] += 1
        if self.nops % CHECK_EVERY == 0:
            self._both("sanity_check", self.a.check, self.b.check)
            self.stats["sglang_dup_registry_misses"] = getattr(self.b, "dup_registry_misses", 0)
        if self.nops % TREE_EVERY == 0:
            self._tree("tree")

    # ----------------------------------------------------------- ops
    def _match(self, what, toks):
        ma, mb = self._both(what, lambda: self.a.match(toks), lambda: self.b.match(toks))
        return self._match_compare(what, toks, ma, mb)

    def _match_compare(self, what, toks, ma, mb):
        """Compare two sides' ``MatchResult`` of ``toks`` (fields, device indices,
        nodes, ``is_backuped``)."""
        compare(f"{what}.fields(device_prefix_len,host_hit_length,full_kv_hit_length,...)",
                _match_fields(ma), _match_fields(mb))
        n = ma.device_prefix_len
        ia, ib = self._both(f"{what}.indices",
                            lambda: self.a.path_device_indices(ma.last_device_node, n),
                            lambda: self.b.path_device_indices(mb.last_device_node, n))
        if n:
            compare(f"{what}.device_indices(path_device_indices)", ia,
                    self.dev.to_a(what, ib))
            # flatradix's MatchResult carries device_indices too (SGLang's has none):
            # they must be the path's
            if getattr(ma, "device_indices", None) is not None:
                compare(f"{what}.device_indices(first side)",
                        np.asarray(ma.device_indices).tolist(), ia)
        self.bind_node(f"{what}.last_device_node", ma.last_device_node, mb.last_device_node)
        self.bind_node(f"{what}.last_host_node", ma.last_host_node, mb.last_host_node)
        self.bind_node(f"{what}.best_match_node", ma.best_match_node, mb.best_match_node)
        if ma.last_visited_node_id is None or mb.last_visited_node_id is None:
            compare(f"{what}.last_visited_node_id", ma.last_visited_node_id,
                    mb.last_visited_node_id)
        else:
            self.bind_node(f"{what}.last_visited_node_id", ma.last_visited_node_id,
                           mb.last_visited_node_id)
        for f in ("last_device_node", "best_match_node"):
            self._backuped(f"{what}.{f}", getattr(ma, f), getattr(mb, f))
        self.stats["match_device_tokens"] += n
        self.stats["match_host_tokens"] += ma.host_hit_length
        if self.swa:
            self.stats["match_swa_host_tokens"] += ma.swa_host_hit_length
        return ma, mb

    def _backuped(self, what, na, nb):
        """``is_backuped`` of a (non-root) node on both sides."""
        if na == self.root_a:
            return
        xa, xb = self._both(f"{what}.is_backuped", lambda: self.a.cache.is_backuped(na),
                            lambda: self.b.cache.is_backuped(nb))
        compare(f"{what}.is_backuped", bool(xa), bool(xb))

    def op_match(self, toks):
        self._match("match", toks)

    def op_cow(self, toks, held):
        """``match_prefix(MatchPrefixParams(key, cow_mamba=True, req=req))`` as SGLang's
        scheduler calls it on a hybrid SSM model: the best match node's *device* state
        is named as the copy's source and the request gets a slot when it holds none
        (one state evicted first when the pool is empty, the best node locked
        meanwhile); nothing when that node's state is not on the device (it may lie
        past the device match, on the host only). ``held``: the request holds a state
        slot already. Compared: the match, the request's slot, the source slot (both
        through the state bijection), ``mamba_needs_clear``; a failed allocation
        (SGLang asserts, flatradix raises RuntimeError) on both sides alike, then the
        match is compared by a second, plain one."""
        sa = sb = None
        if held:
            sa, sb = self._state("cow.req_state")
            self._drain("cow.req_state")
        (ma, ka), (mb, kb) = self._both("cow", lambda: self.a.match_cow(toks, sa),
                                        lambda: self.b.match_cow(toks, sb))
        self._drain("cow")
        compare("cow.alloc_failed", ma is None, mb is None)
        if ma is None:
            self.stats["cow_alloc_failed"] += 1
            if sa is not None:
                self._free_state("cow.req_state_free", sa, sb)
            self._match("cow.rematch", toks)
            return
        self._match_compare("cow", toks, ma, mb)
        (dst_a, src_a, clear_a), (dst_b, src_b, clear_b) = ka, kb
        if (src_a is None) != (src_b is None):
            raise Divergence("cow.mamba_cow_src_index", f"first={src_a} second={src_b}")
        if src_a is not None:
            compare("cow.mamba_cow_src_index", src_a, self.mdev.to_a("cow", [src_b])[0])
            self.stats["cow_copies"] += 1
            self.stats["cow_slot_taken"] += sa is None
        elif ma.best_match_node != ma.last_device_node:
            self.stats["cow_past_device_match"] += 1
        compare("cow.mamba_needs_clear", clear_a, clear_b)
        self._req_state_done("cow", dst_a, dst_b)

    def _anchor_depth(self, m):
        """The tokens up to a match's ``last_host_node``: ``device_prefix_len +
        host_hit_length``, except under write-back with Mamba, where SGLang's host
        hit leaves out device-only nodes between the device match and the best
        node, and with SWA, whose validators can reject the nodes the walk ended on
        (an SWA tombstone: ``last_host_node`` lies deeper than both hits); their
        depth is read from the first side's tree (the refill's events compare the
        rest)."""
        if not (self.swa or self.mamba and self.cfg["write_policy"] == "write_back"):
            return m.device_prefix_len + m.host_hit_length
        return self.a.node_depth(m.last_host_node)

    def _walk_meets_node(self, toks, depth):
        """Whether a node hangs below depth ``depth`` of ``toks``'s path on the refill's
        first page (a walk from an anchor there would enter it), from the first
        side's tree."""
        head = tuple(toks[:depth + self.P])
        return any(len(k) > depth and k[:len(head)] == head for k in self.a.tree())

    def op_insert_host(self, toks, pages, back, swa_pages=None, state=False):
        """A storage prefetch's refill (SGLang ``_handle_prefetch_result``): after a
        match, up to ``pages`` pages of ``toks`` past its device + host hit get
        fresh host slots and are inserted below ``last_host_node``
        (``insert_host``); the caller then frees the slots the result leaves to it
        (``host_value[:prefix_len]``, all of them when dropped). A full host pool
        skips the refill on both sides. ``back`` > 0: the prefetch started
        ``back`` pages earlier on the path (others inserted below its anchor
        meanwhile): the anchor is the ``last_host_node`` of a match that far up,
        and the walk meets the nodes cached since (refills, splits).

        Hybrid (SGLang's prefetch commit): on an SWA cache the refill stages the SWA
        data of its last pages (``swa_pages`` 0: as SGLang's ``prepare_prefetch``
        sizes it -- one window of pages, or the whole key under the root when it is
        shorter, none below a non-root anchor then; > 0: that many pages, capped
        to the key, which SGLang's commit keeps or frees by its own rules), on a
        Mamba cache (``state``) the state at its end; the caches free what they do
        not keep."""
        ma, mb = self._match("insert_host.match", toks)
        P = self.P
        depth = self._anchor_depth(ma)
        n = min((len(toks) - depth) // P, pages) * P
        if n <= 0:
            return
        if back and depth:
            cut = max(0, depth - back * P)
            n += depth - cut
            depth = cut
            if cut:
                ma, mb = self._match("insert_host.match_anchor", toks[:cut])
                got = self._anchor_depth(ma)
                compare("insert_host.anchor_(device_prefix_len,host_hit_length)",
                        (ma.device_prefix_len, ma.host_hit_length),
                        (mb.device_prefix_len, mb.host_hit_length))
                if self.mamba or self.swa:
                    # Mamba's or SWA's validator may stop the anchor's match above
                    # ``cut`` (a node without a state, an SWA hole): the refill starts
                    # there
                    n += depth - got
                    depth = got
                else:
                    compare("insert_host.anchor_depth(cut)", got, cut)
                ba, bb = self._both("insert_host.anchor_backuped",
                                    lambda: self.a.cache.is_backuped(ma.last_host_node),
                                    lambda: self.b.cache.is_backuped(mb.last_host_node))
                compare("insert_host.anchor_backuped", bool(ba), bool(bb))
                if not ba and self.cfg["write_policy"] != "write_back":
                    # SGLang refills the nodes below a device-only anchor and breaks its
                    # own write-through invariant (a host copy under a parent without
                    # one: its sanity check fails, the Rust core panics at a later
                    # eviction); flatradix drops the refill there (tests/components/hicache/test_hicache.py)
                    self.stats["insert_host_unbacked_anchor_skipped"] += 1
                    return
            else:
                ma = SimpleNamespace(last_host_node=self.root_a)
                mb = SimpleNamespace(last_host_node=self.b.root())
        elif self.mamba and depth and self.cfg["write_policy"] != "write_back" and \
                not self.a.cache.is_backuped(ma.last_host_node):
            # Mamba's validator can end the match above nodes that are cached on the
            # device only, so the refill would walk them below a device-only anchor:
            # SGLang's invariant-breaking case above, skipped the same way
            self.stats["insert_host_unbacked_anchor_skipped"] += 1
            return
        elif self.swa and depth and self.cfg["write_policy"] != "write_back" and \
                not self.a.cache.is_backuped(ma.last_host_node) and \
                self._walk_meets_node(toks, depth):
            # SWA's validators can end the match above a node the refill's walk then
            # meets (an SWA tombstone, a node split by the match): the same
            # device-only-anchor case, skipped the same way (seed 501 of
            # p1-swa8-wts-lfu: SGLang gave a split node a host copy below the
            # un-backed anchor, flatradix dropped the refill)
            self.stats["insert_host_unbacked_anchor_skipped"] += 1
            return
        xa, xb = self._both("insert_host.host_alloc", lambda: self.a.host_alloc(n),
                            lambda: self.b.host_alloc(n))
        if (xa is None) != (xb is None):
            raise Divergence("insert_host.host_alloc_failed", f"first={xa} second={xb}")
        if xa is None:
            self.stats["insert_host_no_room"] += 1
            return
        sa = sb = ta = tb = None
        if self.swa and swa_pages is not None:
            pp, wp = n // P, -(-self.cfg["swa_window"] // P)
            k = min(swa_pages, pp) if swa_pages else (wp if pp >= wp else pp if not depth else 0)
            if k:
                sa, sb = self._both("insert_host.swa_staging", lambda: self.a.swa_host_alloc(k * P),
                                    lambda: self.b.swa_host_alloc(k * P))
                if (sa is None) != (sb is None):
                    raise Divergence("insert_host.swa_staging_failed", f"first={sa} second={sb}")
                self.stats["insert_host_swa_staged" if sa else "insert_host_swa_no_room"] += k * P
        if self.mamba and state:
            ta, tb = self._both("insert_host.state_staging", self.a.state_host_alloc,
                                self.b.state_host_alloc)
            if (ta is None) != (tb is None):
                raise Divergence("insert_host.state_staging_failed", f"first={ta} second={tb}")
            self.stats["insert_host_state_staged" if ta is not None else
                       "insert_host_state_no_room"] += 1
        path, rest = toks[:depth + n], toks[depth:depth + n]
        ra, rb = self._both("insert_host", lambda: self.a.insert_host(
            ma.last_host_node, rest, xa, path, sa, ta), lambda: self.b.insert_host(
            mb.last_host_node, rest, xb, path, sb, tb))
        compare("insert_host.(prefix_len,total_len,host_insert_dropped)",
                (ra.prefix_len, ra.total_len, bool(ra.host_insert_dropped)),
                (rb.prefix_len, rb.total_len, bool(rb.host_insert_dropped)))
        if ta is not None and not ra.host_insert_dropped:
            compare("insert_host.mamba_exist", bool(ra.mamba_exist), bool(rb.mamba_exist))
            self.stats["insert_host_state_kept" if not ra.mamba_exist else
                       "insert_host_state_freed"] += 1
        if ra.inserted_host_node is None or rb.inserted_host_node is None:
            compare("insert_host.inserted_host_node", ra.inserted_host_node,
                    rb.inserted_host_node)
        else:
            self.bind_node("insert_host.inserted_host_node", ra.inserted_host_node,
                           rb.inserted_host_node)
        k = n if ra.host_insert_dropped else ra.prefix_len
        self._both("insert_host.host_free", lambda: self.a.host_free(xa[:k]),
                   lambda: self.b.host_free(xb[:k]))
        self.stats["insert_host_dropped" if ra.host_insert_dropped else "insert_host_tokens"] += (
            n if ra.host_insert_dropped else n - ra.prefix_len)

    def _alloc(self, what, n):
        xa, xb = self._both(what, lambda: self.a.alloc_slots(n), lambda: self.b.alloc_slots(n))
        if (xa is None) != (xb is None):
            raise Divergence(f"{what}.alloc_failed", f"first={xa} second={xb}")
        if xa is not None:
            self.dev.bind(what, xa, xb)
            if self.swa:  # and their fresh SWA peers
                self.swadev.bind(what, self.a.swa_peers(xa), self.b.swa_peers(xb))
        return xa, xb

    def _driver_free(self, what, xa, xb):
        if self.swa:
            pa, pb = self.a.swa_peers(xa), self.b.swa_peers(xb)
        self._both(what, lambda: self.a.free_slots(xa), lambda: self.b.free_slots(xb))
        self.dev.release(what, xa, xb, True)
        if self.swa:
            self.swadev.release(what, [x for x in pa if x], [y for y in pb if y], True)

    def _driver_free_swa(self, what, xa, xb):
        """Free the SWA peers of Full slots the driver holds (a request's slid window)."""
        pa, pb = self.a.swa_peers(xa), self.b.swa_peers(xb)
        self._both(what, lambda: self.a.free_swa(xa), lambda: self.b.free_swa(xb))
        self.swadev.release(what, pa, pb, True)

    def _make_room(self, what, n):
        """Evict for an allocation of ``n`` slots: ``n`` Full tokens; Full + SWA: each
        pool's shortfall (the sizes were found equal at the last sync, so SGLang's
        view decides for both)."""
        if not self.swa:
            ea, eb = self._both(what, lambda: self.a.evict(n), lambda: self.b.evict(n))
            compare(f"{what}.num_evicted", ea, eb)
            return
        sz = self.b.sizes()
        fs, ss = max(0, n - sz["full_available"]), max(0, n - sz["swa_available"])
        ea, eb = self._both(what, lambda: self.a.evict(fs, swa=ss),
                            lambda: self.b.evict(fs, swa=ss))
        compare(f"{what}.(num_evicted,swa_num_evicted)", ea, eb)
        self.stats["insert_evict_swa_short"] += ss > 0

    def _state(self, what):
        """One Mamba state slot on each side for the caller (None when the pools
        are empty even after one state was evicted on both sides)."""
        sa, sb = self._both(what, self.a.alloc_state, self.b.alloc_state)
        if sa is None or sb is None:
            if (sa is None) != (sb is None):
                raise Divergence(f"{what}.state_alloc_failed", f"first={sa} second={sb}")
            ea, eb = self._both(f"{what}.evict", lambda: self.a.evict(0, 1),
                                lambda: self.b.evict(0, 1))
            compare(f"{what}.evict.(num_evicted,[swa_num_evicted,]mamba_num_evicted)", ea, eb)
            self._drain(f"{what}.evict")
            sa, sb = self._both(what, self.a.alloc_state, self.b.alloc_state)
            if (sa is None) != (sb is None):
                raise Divergence(f"{what}.state_alloc_failed", f"first={sa} second={sb}")
            if sa is None:
                return None, None
        self.mdev.bind(what, [sa], [sb])
        return sa, sb

    def _free_state(self, what, sa, sb):
        self._both(what, lambda: self.a.free_state(sa), lambda: self.b.free_state(sb))
        self.mdev.release(what, [sa], [sb], True)

    def op_insert(self, toks, use_prev, il_pick, cur=0):
        """``cur`` (SWA): with no ``prev``, the request's SWA cursor -- its slots
        below it gave their SWA peers back (its window slid past them) -- picked
        from ``cur`` among the page multiples up to ``len - window``."""
        n = len(toks)
        sa = sb = None
        if self.mamba:
            sa, sb = self._state("insert.state")
            if sa is None:
                self.stats["insert_no_state"] += 1
                return
        va, vb = self._alloc("insert.alloc", n)
        if va is None:
            self._make_room("insert.evict", n)
            self._drain("insert.evict")
            va, vb = self._alloc("insert.alloc", n)
            if va is None:
                self.stats["insert_noalloc"] += 1
                if sa is not None:
                    self._free_state("insert.state_free", sa, sb)
                return
        ma, mb = self._match("insert.match", toks)
        prev = ma.device_prefix_len if use_prev else 0
        il = (0, prev, n)[il_pick]
        if prev:
            # the request's prefix slots are the tree's: give back the fresh ones
            pa = self.a.path_device_indices(ma.last_device_node, prev)
            pb = self.b.path_device_indices(mb.last_device_node, prev)
            self._driver_free("insert.prefix_free", va[:prev], vb[:prev])
            va[:prev], vb[:prev] = pa, pb
        cursor = 0
        if self.swa and cur and not prev:
            cursor = cur % (max(0, n - self.cfg["swa_window"]) // self.P + 1) * self.P
            if cursor:
                self._driver_free_swa("insert.cursor_free_swa", va[:cursor], vb[:cursor])
                self.stats["insert_swa_cursor"] += 1
        ra, rb = self._both("insert", lambda: self.a.insert(toks, va, prev, il, sa, cursor),
                            lambda: self.b.insert(toks, vb, prev, il, sb, cursor))
        compare("insert.prefix_len", ra.prefix_len, rb.prefix_len)
        if self.mamba:
            compare("insert.mamba_exist", bool(ra.mamba_exist), bool(rb.mamba_exist))
            if ra.mamba_exist:  # the node had a state: the caller's goes back
                self._drain("insert")
                self._free_state("insert.state_free", sa, sb)
                self.stats["insert_mamba_exist"] += 1
        compare("insert.total_len", ra.total_len, rb.total_len)
        self.bind_node("insert.last_device_node", ra.last_device_node, rb.last_device_node)
        self._backuped("insert.last_device_node", ra.last_device_node, rb.last_device_node)
        self.stats["insert_tokens"] += n

    def op_lock(self, toks, kind):
        ma, mb = self._match("lock.match", toks)
        if len(self.locks) >= MAX_LOCKS:
            return
        na, nb = ma.last_device_node, mb.last_device_node
        if kind == 0:
            ha, hb = self._both("lock", lambda: self.a.cache.lock(na),
                                lambda: self.b.cache.lock(nb))
            self.locks.append((0, na, nb, ha, hb))
        else:
            ra, rb = self._both("inc_lock_ref", lambda: self.a.cache.inc_lock_ref(na),
                                lambda: self.b.cache.inc_lock_ref(nb))
            compare("inc_lock_ref.delta", ra.delta, rb.delta)
            self.locks.append((1, na, nb, ra.to_dec_params(), rb.to_dec_params()))

    def _unlock(self, k):
        kind, na, nb, ha, hb = self.locks.pop(k % len(self.locks))
        if kind == 0:
            self._both("unlock", lambda: self.a.cache.unlock(ha), lambda: self.b.cache.unlock(hb))
        else:
            self._both("dec_lock_ref", lambda: self.a.cache.dec_lock_ref(na, ha),
                       lambda: self.b.cache.dec_lock_ref(nb, hb))

    def op_unlock(self, k):
        if self.locks:
            self._unlock(k)

    def op_unlock_all(self):
        while self.locks:
            self._unlock(len(self.locks) - 1)
        while self.host_locks:
            self._hunlock(len(self.host_locks) - 1)

    def op_hlock(self, toks):
        """``inc_host_lock_ref`` on the match's best node, held across later ops."""
        ma, mb = self._match("hlock.match", toks)
        if len(self.host_locks) >= MAX_HOST_LOCKS:
            return
        na, nb = ma.best_match_node, mb.best_match_node
        ra, rb = self._both("inc_host_lock_ref", lambda: self.a.host_lock(na),
                            lambda: self.b.host_lock(nb))
        if not (ra.delta != rb.delta and self._tolerated("host-lock-delta")):
            compare("inc_host_lock_ref.delta", ra.delta, rb.delta)
        if self.swa:  # the SWA window's stamp (None: the segment reached the root)
            compare("inc_host_lock_ref.locked(component,stamped)", _host_locked(ra),
                    _host_locked(rb))
        else:
            compare("inc_host_lock_ref.locked", bool(ra.component_host_lock_uuids),
                    bool(rb.component_host_lock_uuids))
        self.host_locks.append((na, nb, ra, rb))
        uuids = ra.component_host_lock_uuids or {}
        if not (uuids.get(0) if self.swa else uuids):
            # nothing locked (no host copy): the node may be deleted by a later
            # eviction, and releasing a receipt on a deleted node is a misuse (SGLang's
            # Rust core panics and poisons its mutex): release it now (SWA: no Full
            # stamp; the SWA window's host count alone does not keep the node)
            self._hunlock(len(self.host_locks) - 1)
            self.stats["hlock_empty"] += 1

    def _hunlock(self, k):
        na, nb, ra, rb = self.host_locks.pop(k % len(self.host_locks))
        self._both("dec_host_lock_ref", lambda: self.a.host_unlock(na, ra),
                   lambda: self.b.host_unlock(nb, rb))

    def op_hunlock(self, k):
        if self.host_locks:
            self._hunlock(k)

    def op_evict(self, n, states=None, mstates=None):
        if self.swa and self.mamba:  # SWA tokens ``states``, Mamba states ``mstates``
            m = n if states is None else states
            k = n if mstates is None else mstates
            ea, eb = self._both("evict", lambda: self.a.evict(n, k, swa=m),
                                lambda: self.b.evict(n, k, swa=m))
            compare("evict.(num_evicted,swa_num_evicted,mamba_num_evicted)", ea, eb)
            self.stats["evicted_tokens"] += ea[0]
            self.stats["evicted_swa_tokens"] += ea[1]
            self.stats["evicted_states"] += ea[2]
            return
        if self.swa:  # ``states``: SWA tokens here (the wind-down asks for ``n``)
            m = n if states is None else states
            ea, eb = self._both("evict", lambda: self.a.evict(n, swa=m),
                                lambda: self.b.evict(n, swa=m))
            compare("evict.(num_evicted,swa_num_evicted)", ea, eb)
            self.stats["evicted_tokens"] += ea[0]
            self.stats["evicted_swa_tokens"] += ea[1]
            return
        if not self.mamba:
            ea, eb = self._both("evict", lambda: self.a.evict(n), lambda: self.b.evict(n))
            compare("evict.num_evicted", ea, eb)
            self.stats["evicted_tokens"] += ea
            return
        m = n if states is None else states  # the wind-down evicts every state too
        ea, eb = self._both("evict", lambda: self.a.evict(n, m), lambda: self.b.evict(n, m))
        compare("evict.(num_evicted,mamba_num_evicted)", ea, eb)
        self.stats["evicted_tokens"] += ea[0]
        self.stats["evicted_states"] += ea[1]

    def op_evict_host(self, n, component=0):
        """``component`` 0 Full, 1 SWA (host tokens), 2 Mamba (host states)."""
        if component:
            CTa = self.a.fr.ComponentType if hasattr(self.a, "fr") else self.a.h.S.ComponentType
            CTb = self.b.h.S.ComponentType
            name = ("SWA", "MAMBA")[component - 1]
            cascade = component == 1 and self.mamba
            before = self.b.sizes()["state_host_available"] if cascade else 0
            ea, eb = self._both(f"evict_host({name})",
                                lambda: self.a.cache.evict_host(n, CTa[name]),
                                lambda: self.b.cache.evict_host(n, CTb[name]))
            compare(f"evict_host({name}).num_evicted", ea, eb)
            if cascade:  # host states the SWA eviction took along
                self.stats["evict_host_swa_state_cascade"] += \
                    self.b.sizes()["state_host_available"] - before
            self.stats["evict_host_states" if component == 2 else "evict_host_swa_tokens"] += ea
            return
        ea, eb = self._both("evict_host", lambda: self.a.cache.evict_host(n),
                            lambda: self.b.cache.evict_host(n))
        compare("evict_host.num_evicted", ea, eb)
        self.stats["evict_host_tokens"] += ea
        self.stats["evict_host_nonzero"] += ea > 0

    def op_flush(self):
        self._both("flush_pending_backups", self.a.cache.flush_pending_backups,
                   self.b.cache.flush_pending_backups)

    def op_wcheck(self, fc):
        # SGLang's scheduler never passes more than the acks submitted (its own
        # writing_check pops that many); the queues were found equal at the last sync
        if fc is not None:
            fc = min(fc, len(self.b.protocol()["write_acks"]))
        self._both("writing_check", lambda: self.a.cache.writing_check(finish_count=fc),
                   lambda: self.b.cache.writing_check(finish_count=fc))

    def op_wdrain(self):
        """``writing_check(write_back=True)``: submit what is queued, then complete
        every backup (blocking)."""
        self._both("writing_check(write_back=True)",
                   lambda: self.a.cache.writing_check(write_back=True),
                   lambda: self.b.cache.writing_check(write_back=True))

    def op_lcheck(self, fc):
        if fc is not None:
            fc = min(fc, len(self.b.protocol()["load_acks"]))
        self._both("loading_check", lambda: self.a.cache.loading_check(finish_count=fc),
                   lambda: self.b.cache.loading_check(finish_count=fc))

    def op_step(self):
        self._both("check_hicache_events", self.a.cache.check_hicache_events,
                   self.b.cache.check_hicache_events)

    def op_ready(self):
        ra, rb = self._both("ready_to_load_host_cache", self.a.cache.ready_to_load_host_cache,
                            self.b.cache.ready_to_load_host_cache)
        # DIFFERENCES 1: SGLang cycles its producer index 0, 1, 2; flatradix returns 0
        compare("ready_to_load_host_cache.submitted(>=0)", ra >= 0, rb >= 0)

    def _no_state_room(self):
        """The Mamba state pool is empty and no state is evictable (sizes were found
        equal at the last sync, so SGLang's view decides for both): a load-back that
        must give the request a slot then fails -- SGLang with an AssertionError
        that leaves the load's host lock and path lock held (DIFFERENCES 7) -- so
        the driver skips it."""
        sz = self.b.sizes()
        return self.mamba and sz["state_available"] == 0 and sz["mamba_evictable"] == 0

    def _req_state_done(self, what, ka, kb):
        """The request's Mamba slot after a load (its own, or one the load gave it):
        the same on both sides; then the request goes and frees it."""
        self._drain(what)
        if (ka is None) != (kb is None):
            raise Divergence(f"{what}.req_mamba_pool_idx", f"first={ka} second={kb}")
        if ka is not None:
            compare(f"{what}.req_mamba_pool_idx", ka, self.mdev.to_a(what, [kb])[0])
            # freed once the load's copy into it was submitted (compared through the map)
            self.req_states.append((ka, kb))
            self.stats["load_req_states"] += 1

    def op_load(self, toks, quota, pins, held=False):
        """match + init_load_back as the scheduler's PrefillAdder does it: with
        ``pins``, lock(last_device_node), a host lock and lock(best_match_node) are
        held around the call (``inc_host_lock_ref(best_match_node)`` in between).
        ``held`` (Mamba): the request holds a state slot already, taken before the
        match (taking it may evict a state)."""
        sa = sb = None
        if self.mamba and held:  # the request holds a state already (the copy's target)
            sa, sb = self._state("load.req_state")
            self._drain("load.req_state")
        ma, mb = self._match("load.match", toks)
        q = None if quota is None else quota * self.P
        if pins:
            la, lb = self._both("load.pin_last", lambda: self.a.cache.lock(ma.last_device_node),
                                lambda: self.b.cache.lock(mb.last_device_node))
            ha, hb = self._both("load.pin_host", lambda: self.a.host_lock(ma.best_match_node),
                                lambda: self.b.host_lock(mb.best_match_node))
            ka, kb = self._both("load.pin_best", lambda: self.a.cache.lock(ma.best_match_node),
                                lambda: self.b.cache.lock(mb.best_match_node))
        def unpin():
            if pins:
                self._both("load.unpin", lambda: (self.a.cache.unlock(ka),
                                                  self.a.host_unlock(ma.best_match_node, ha),
                                                  self.a.cache.unlock(la)),
                           lambda: (self.b.cache.unlock(kb),
                                    self.b.host_unlock(mb.best_match_node, hb),
                                    self.b.cache.unlock(lb)))

        if sa is None and self._no_state_room():
            self.stats["load_skipped_no_state_room"] += 1
            unpin()
            return
        (ra, ka_), (rb, kb_) = self._both(
            "init_load_back",
            lambda: self.a.init_load_back(ma.best_match_node, ma.host_hit_length, q,
                                          ma.last_device_node, ma.mamba_host_hit_length, sa,
                                          swa_host_hit=ma.swa_host_hit_length),
            lambda: self.b.init_load_back(mb.best_match_node, mb.host_hit_length, q,
                                          mb.last_device_node, mb.mamba_host_hit_length, sb,
                                          swa_host_hit=mb.swa_host_hit_length))
        self._req_state_done("init_load_back", ka_, kb_)
        unpin()
        compare("init_load_back.loaded", ra[0], rb[0])
        self.bind_node("init_load_back.node", ra[1], rb[1])
        self.stats["load_tokens"] += ra[0]
        self.stats["load_nonzero"] += ra[0] > 0
        self.stats["load_declined_with_host_hit"] += ra[0] == 0 and ma.host_hit_length > 0
        if self.swa:
            self.stats["load_with_swa_host_hit"] += ma.swa_host_hit_length > 0

    def op_load_back(self, toks, quota, held=False):
        sa = sb = None
        if self.mamba and held:  # taken before the match: taking it may evict a state
            sa, sb = self._state("load_back.req_state")
            self._drain("load_back.req_state")
        ma, mb = self._match("load_back.match", toks)
        if ma.host_hit_length == 0 and not ma.mamba_host_hit_length and \
                not ma.swa_host_hit_length:
            if sa is not None:
                self._free_state("load_back.req_state_free", sa, sb)
            return
        q = None if quota is None else quota * self.P
        if sa is None and self._no_state_room():
            self.stats["load_skipped_no_state_room"] += 1
            return
        (ra, ka_), (rb, kb_) = self._both(
            "load_back",
            lambda: self.a.load_back(ma.best_match_node, q, ma.last_device_node, sa),
            lambda: self.b.load_back(mb.best_match_node, q, mb.last_device_node, sb))
        compare("load_back.loaded", bool(ra), bool(rb))
        self._req_state_done("load_back", ka_, kb_)
        self.stats["load_back_true"] += bool(ra)

    def op_content(self):
        """Both trees' device values (through the bijection) and both sanity checks."""
        va, vb = self._both("content", self.a.values, self.b.values)
        compare("content.all_values_flatten(sorted, mapped)", sorted(va),
                sorted(self.dev.to_a("content", vb)))
        if self.mamba:
            sa, sb = self._both("content.states", self.a.state_values, self.b.state_values)
            compare("content.all_mamba_values_flatten(sorted, mapped)", sorted(sa),
                    sorted(self.mdev.to_a("content", sb)))
        self._both("content.sanity_check", self.a.check, self.b.check)
        self._tree("content")
        self.stats["sglang_dup_registry_misses"] = getattr(self.b, "dup_registry_misses", 0)


WIND_DOWN = [("unlock_all",), ("step",), ("ready",), ("lcheck", None), ("step",), ("content",),
             ("evict", 1 << 30), ("evict_host", 1 << 30), ("content",)]


class Generator:
    def __init__(self, cfg, rng):
        self.cfg = cfg
        self.rng = rng
        P = self.P = cfg["page_size"]
        self.min_pages = cfg.get("min_pages", 1)
        self.max_pages = cfg["max_pages"]
        self.bases = [[rng.randrange(1, 6) for _ in range(self.max_pages * P)]
                      for _ in range(rng.choice((2, 3, 4)))]
        self.swa = cfg.get("swa_window") is not None
        self.mamba = bool(cfg.get("mamba"))
        weights = dict(WEIGHTS, **(MAMBA_WEIGHTS if self.mamba else {}))
        self.kinds = list(weights)
        self.weights = [weights[k] for k in self.kinds]

    def key(self, tail=False):
        r, P = self.rng, self.P
        lo = self.min_pages if r.random() < 0.7 else 1
        k = list(r.choice(self.bases)[:r.randint(lo, self.max_pages) * P])
        if r.random() < 0.3 and len(k) > P:
            k[-r.randint(1, P)] = r.randrange(6, 9)
        if tail and r.random() < 0.3:
            k += [r.randrange(1, 9) for _ in range(r.randint(1, P + 1))]
        return tuple(k)

    def next(self):
        r, P = self.rng, self.P
        kind = r.choices(self.kinds, self.weights)[0]
        if kind == "insert":
            if self.swa:
                return ("insert", self.key(), r.random() < 0.5, r.randrange(3),
                        r.randrange(1, 1 << 16) if r.random() < 0.25 else 0)
            return ("insert", self.key(), r.random() < 0.5, r.randrange(3))
        if kind == "match":
            return ("match", self.key(tail=True))
        if kind == "cow":
            return ("cow", self.key(tail=True), r.random() < 0.25)
        if kind == "insert_host":
            op = ("insert_host", self.key(), r.randint(1, 4), r.choice((0, 0, 1, 2, 4)))
            if self.swa or self.mamba:  # the components' staging (hybrid only: the Full
                # configurations keep their streams)
                op += (r.choice((0, 0, 0, 1, 2, 3)) if self.swa else None,
                       self.mamba and r.random() < 0.8)
            return op
        if kind == "lock":
            return ("lock", self.key(tail=True), r.randrange(2))
        if kind == "hlock":
            return ("hlock", self.key(tail=True))
        if kind in ("unlock", "hunlock"):
            return (kind, r.randrange(1 << 16))
        if kind == "unlock":
            return ("unlock", r.randrange(1 << 16))
        mamba = bool(self.cfg.get("mamba"))
        if kind == "evict":
            if self.swa and mamba:
                return ("evict", r.choice((0, r.randint(1, 6 * P))),
                        r.choice((0, 0, 1, P, r.randint(1, 6 * P))), r.choice((0, 0, 1, 2)))
            if self.swa:
                return ("evict", r.choice((0, r.randint(1, 6 * P))),
                        r.choice((0, 0, 1, P, r.randint(1, 6 * P))))
            if mamba:
                return ("evict", r.choice((0, r.randint(1, 6 * P))), r.choice((0, 0, 1, 2)))
            return ("evict", r.randint(1, 6 * P))
        if kind == "evict_host":
            if self.swa and mamba:  # Full / SWA (cascading to internal nodes' states) / Mamba
                c = r.choice((0, 0, 1, 1, 2))
                return ("evict_host", (r.randint(1, 8 * P), r.randint(1, 4 * P),
                                       r.randint(1, 3))[c], c) if c else \
                    ("evict_host", r.randint(1, 8 * P))
            if mamba and r.random() < 0.4:
                return ("evict_host", r.randint(1, 3), 2)
            if self.swa and r.random() < 0.4:
                return ("evict_host", r.randint(1, 4 * P), 1)
            return ("evict_host", r.randint(1, 8 * P))
        if kind in ("wcheck", "lcheck"):
            return (kind, None if r.random() < 0.4 else r.randrange(4))
        if kind == "load":
            if mamba:
                return ("load", self.key(tail=True), r.choice(QUOTAS), r.random() < 0.5,
                        r.random() < 0.25)
            return ("load", self.key(tail=True), r.choice(QUOTAS), r.random() < 0.5)
        if kind == "load_back":
            if mamba:
                return ("load_back", self.key(tail=True), r.choice(QUOTAS), r.random() < 0.25)
            return ("load_back", self.key(tail=True), r.choice(QUOTAS))
        return (kind,)


# --------------------------------------------------------------------------- running
def _play(cfg, backend, first, rng, n, ops):
    """One episode (``harness.Spec.play``): ``n`` generated ops and the wind-down,
    on fresh caches, each appended to ``ops`` then applied."""
    gen = Generator(cfg, rng)
    todo = [gen.next() for _ in range(n)] + WIND_DOWN
    ex = Executor(cfg, backend, first)
    try:
        for op in todo:
            ops.append(op)
            ex.apply(op)
    except Divergence as d:
        d.stats = ex.stats
        raise
    return ex.stats


def replay(cfg, backend, ops, first="flatradix"):
    """Run ``ops`` on fresh caches; return the Divergence raised, or None."""
    try:
        ex = Executor(cfg, backend, first)
        for op in ops:
            ex.apply(op)
    except Divergence as d:
        return d
    return None


SPEC = harness.Spec(
    module="hicache_driver", repro_prefix="hicache-repro", seed_tag="hicache/",
    configs=CONFIGS, mutants=MUTANTS, play=_play, replay=replay,
    groups={"all": list(CONFIGS), "none": []}, episode=1000, shrink_seconds=300,
    selftest_ops=SELFTEST_OPS, known=KNOWN, tolerate=TOLERATE)


def run_config(name, backend, seed, total_ops, episode, shrink_s, repro_dir, log=print, cfg=None,
               first="flatradix"):
    """``harness.run_config`` of this driver."""
    return harness.run_config(SPEC, name, backend, seed, total_ops, episode, shrink_s, repro_dir,
                              log, cfg, first)


def main(argv=None):
    return harness.main(SPEC, argv, __doc__.split("\n\n")[0])


if __name__ == "__main__":
    sys.exit(main())
