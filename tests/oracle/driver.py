"""Differential driver: flatradix against SGLang 0.5.23's own ``UnifiedRadixCache``.

Run in the oracle venv (``../shared/tools/setup_sglang_oracle.sh``), where both
flatradix and sglang import::

    export SGLANG_USE_CPU_ENGINE=1 SGLANG_RUST_BUILD_MODE=never OMP_NUM_THREADS=1 \\
           PYTHONPATH=$PWD:$VENV/peer_stubs          # from the repository root
    $VENV/bin/python -m tests.oracle.driver --config p16-lru --backend rust --ops 100000
    $VENV/bin/python -m tests.oracle.driver --config all --backend python --ops 2000
    $VENV/bin/python -m tests.oracle.driver --replay repro.json   # re-run a reproducer
    $VENV/bin/python -m tests.oracle.driver --config mamba --first python --backend rust
                                 # SGLang's Python core against its Rust core (no flatradix)

A seeded generator produces an operation stream shaped like a scheduler's:
requests that match a prefix (locked while they run), prefill in chunks
(``cache_unfinished_req`` after each chunk), decode (sometimes checkpointed) and
finish (``cache_finished_req``, or abort without insert); prompts built from
shared system prompts, growing multi-turn conversations, fan-out forks and
random tails; namespaces via ``extra_key`` / ``cache_salt``; raw inserts with
``prev_prefix_len`` / ``inserted_len`` / priority, matches that take locks held
across later inserts, explicit evictions and evictions forced by a KV budget,
and rare ``reset()`` s. Each op runs on both engines, which are compared after
every op (``normalize.py`` lists the only differences accepted):

* match: matched length, KV indices, node (by id bijection), and every other
  ``MatchResult`` field (host/best/visited nodes, hit lengths, ...);
* insert: ``prefix_len``, node, ``total_len`` / ``mamba_exist`` /
  ``swa_branch_inserted`` / ``adopted_ranges``; lock: delta;
* requests: matched prefix at admission, then after each checkpoint the
  protected length, last node and the request's whole req->token row;
* Mamba configurations (``MAMBA_CONFIGS``): every insert donates a state
  slot (``mamba_value``), the same number to both engines from one free list,
  and ``mamba_exist`` is compared (the caller then frees the slot, through each
  side's ``mamba_allocator``); with ``requests`` (every Mamba configuration)
  each admitted request draws its own state slot from that list through
  both libraries' ``mamba_allocator`` (SGLang: ``HybridReqToTokenPool.alloc``),
  each checkpoint of a running request forks it into the next armed slot
  (``mamba_allocator.alloc(1)``; when the budget says the pool is full the
  allocator answers None and both evict one state first, compared like every
  eviction), and the slots allocated (in order), the slot each request holds
  after every admission / checkpoint / finish (normalize.py point 8) and the
  frees are compared; with the extra buffer the request's ping-pong track
  slots too (``engines.track`` plays the model runner's tracking; lazy:
  ``engines.track_lazy``, one track slot at admission and the second taken at
  a decode boundary while the budget has room);
  locks with / without the state (``skip_lock_components=(MAMBA,)``), through
  ``lock()`` or ``inc_lock_ref``, released by ``unlock()`` or ``dec_lock_ref``,
  and a Mamba-only release of a held lock (``release_mamba``); ``evict`` with
  ``mamba_num``, Mamba step-wise rounds; Mamba sizes, the freed state slots
  in order, ``all_mamba_values_flatten`` at content checks;
* evict: tokens evicted; every op: the freed KV indices *in order* (the
  eviction order of the policy), evictable and protected sizes, the KV event
  stream (``enable_kv_cache_events=True``); total size every
  ``TOTAL_EVERY`` ops (SGLang's Python core walks the whole tree for it); the
  tree's whole content (every KV index it holds) before each reset and at
  episode ends; flatradix's ``sanity_check()`` every ``CHECK_EVERY`` ops.

The stream is cut into episodes of ``--episode`` ops, each on freshly built
engines, so a divergence replays from an empty cache. On a divergence the
episode's op list is shrunk by delta debugging (fresh engines per try; the same
divergence label must reappear) and printed as a Python literal, and written
to ``--repro-dir``. The last stdout line per configuration is
``ORACLE_RESULT {json}``.
"""

from collections import deque
import math
import sys
from collections import Counter

from . import harness
from .engines import FlatEngine, SglEngine
from .normalize import (
    Divergence, EventHashMap, NodeIdMap, coalesce_removed, compare, event_tuples,
)

# --------------------------------------------------------------------------- configs
# Every eviction policy appears; page sizes 1, 16 and 64 each appear with several
# policies; two EAGLE (bigram) trees. KV events are on everywhere. tlru: a node is
# "TEL-safe" (evicted first) only when threshold - next_prompt_estimate exceeds its
# length plus the branch's trimmed depth, so threshold > next_prompt_estimate is
# needed for T-LRU to differ from LRU at all (SGLang's Rust adapter also clamps
# that difference at 0, which is then equivalent); SGLang validates neither value.
CONFIGS = {
    "p1-lru": dict(page_size=1, policy="lru"),
    "p16-lru": dict(page_size=16, policy="lru"),
    "p64-lru": dict(page_size=64, policy="lru"),
    "p1-lfu": dict(page_size=1, policy="lfu"),
    "p16-fifo": dict(page_size=16, policy="fifo"),
    "p1-mru": dict(page_size=1, policy="mru"),
    "p16-filo": dict(page_size=16, policy="filo"),
    "p64-priority": dict(page_size=64, policy="priority"),
    "p16-slru": dict(page_size=16, policy="slru", policy_config={"protected_threshold": 3}),
    "p1-tlru": dict(page_size=1, policy="tlru",
                    policy_config={"threshold": 48, "next_prompt_estimate": 16}),
    "p64-tlru": dict(page_size=64, policy="tlru",
                     policy_config={"threshold": 3 * 64, "next_prompt_estimate": 64}),
    "p1-eagle-lru": dict(page_size=1, policy="lru", eagle=True),
    "p16-eagle-lfu": dict(page_size=16, policy="lfu", eagle=True),
}

# FULL+SWA configurations (``swa_window`` = W): windows larger than the page (p1-*),
# smaller than it (p16-swa8), equal to it (p16-swa16), not a multiple of it
# (p16-swa40, p64-swa127), EAGLE bigram trees, several policies. The SWA pool
# budget is ``swa_budget`` times the Full one, so SWA evictions (tombstones) and
# out-of-window frees run often. ``slot_space`` bounds the KV slot numbers (the
# allocators' mapping arrays are that long); slots are reused once freed.
SWA_CONFIGS = {
    "p1-swa4-lru": dict(page_size=1, policy="lru", swa_window=4, swa_budget=0.5),
    "p1-swa24-lfu": dict(page_size=1, policy="lfu", swa_window=24, swa_budget=0.4),
    "p16-swa8-lru": dict(page_size=16, policy="lru", swa_window=8, swa_budget=0.5),
    "p16-swa16-priority": dict(page_size=16, policy="priority", swa_window=16, swa_budget=0.5),
    "p16-swa40-lru": dict(page_size=16, policy="lru", swa_window=40, swa_budget=0.6),
    "p64-swa127-slru": dict(page_size=64, policy="slru", policy_config={"protected_threshold": 2},
                            swa_window=127, swa_budget=0.6),
    "p1-eagle-swa7-lru": dict(page_size=1, policy="lru", eagle=True, swa_window=7, swa_budget=0.5),
    "p64-eagle-swa127-lru": dict(page_size=64, policy="lru", eagle=True, swa_window=127,
                                 swa_budget=0.6),
}
for _c in SWA_CONFIGS.values():
    _c["slot_space"] = (1 << 16) * _c["page_size"]
CONFIGS.update(SWA_CONFIGS)

# FULL+MAMBA and FULL+SWA+MAMBA configurations (``mamba_chunk`` = SGLang's
# ``mamba_cache_chunk_size``; a match's ``mamba_branching_seqlen`` lies on the grid
# lcm(chunk, page)). SGLang needs ``mamba_extra_buffer`` (ping-pong state slots)
# at page size > 1. In SGLang a model's chunk size is max(its chunk, page) and one
# divides the other; ``p16-mamba-c24-lfu`` (grid 48) and ``p64-mamba-c16-fifo``
# (chunk below the page) go off that path on purpose: only the grid differs.
# ``mamba_budget``: the state pool's size in states (inserts evict ``mamba_num``
# to stay under it). EAGLE + Mamba: SGLang builds no bigram tree (``is_eagle`` is
# ignored when Mamba is configured), so keys are plain. ``requests``: the request
# path (admit / extend / decode / finish) runs in every Mamba configuration,
# mixed with raw inserts of donated state slots, matches, locks and evictions.
# Without the extra buffer each request holds its own state slot (a running
# request's checkpoint forks it, a finished one donates it); with it the tracked
# ping-pong entry is donated. ``mamba_lazy``: SGLang's lazy extra buffer.
MAMBA_CONFIGS = {
    "p1-mamba-lru": dict(page_size=1, policy="lru", mamba_chunk=64, mamba_budget=24),
    "p1-mamba-lfu": dict(page_size=1, policy="lfu", mamba_chunk=8, mamba_budget=16),
    "p16-mamba-lru": dict(page_size=16, policy="lru", mamba_chunk=64, mamba_extra_buffer=True,
                          mamba_budget=16),
    "p16-mamba-c24-lfu": dict(page_size=16, policy="lfu", mamba_chunk=24, mamba_extra_buffer=True,
                              mamba_budget=12),
    "p64-mamba-priority": dict(page_size=64, policy="priority", mamba_chunk=64,
                               mamba_extra_buffer=True, mamba_budget=10),
    "p64-mamba-c16-fifo": dict(page_size=64, policy="fifo", mamba_chunk=16,
                               mamba_extra_buffer=True, mamba_budget=10),
    "p16-mamba-slru": dict(page_size=16, policy="slru", policy_config={"protected_threshold": 2},
                           mamba_chunk=128, mamba_extra_buffer=True, mamba_budget=12),
    "p1-eagle-mamba-lru": dict(page_size=1, policy="lru", eagle=True, mamba_chunk=64,
                               mamba_budget=20),
    # the per-path state cap (--mamba-max-states-per-path), with the request path
    "p1-mamba-cap2-lru": dict(page_size=1, policy="lru", mamba_chunk=16, mamba_budget=24,
                              mamba_path_cap=2),
    "p16-mamba-cap1-lfu": dict(page_size=16, policy="lfu", mamba_chunk=64,
                               mamba_extra_buffer=True, mamba_budget=16, mamba_path_cap=1),
    # FULL+SWA+MAMBA (SGLang's own fixtures run p1/W128 and p64/W64 stacks)
    "p1-swa16-mamba-lru": dict(page_size=1, policy="lru", swa_window=16, swa_budget=0.5,
                               mamba_chunk=64, mamba_budget=20),
    "p64-swa127-mamba-lru": dict(page_size=64, policy="lru", swa_window=127, swa_budget=0.6,
                                 mamba_chunk=64, mamba_extra_buffer=True, mamba_budget=10),
    "p16-swa32-mamba-cap2-lru": dict(page_size=16, policy="lru", swa_window=32, swa_budget=0.6,
                                     mamba_chunk=32, mamba_extra_buffer=True, mamba_budget=14,
                                     mamba_path_cap=2),
    # the lazy extra buffer (SGLang's extra_buffer_lazy strategy): one track slot
    # per request, the second taken at a decode boundary without eviction
    "p16-mamba-lazy-lru": dict(page_size=16, policy="lru", mamba_chunk=32,
                               mamba_extra_buffer=True, mamba_lazy=True, mamba_budget=18),
    "p16-swa32-mamba-lazy-lfu": dict(page_size=16, policy="lfu", swa_window=32, swa_budget=0.6,
                                     mamba_chunk=64, mamba_extra_buffer=True, mamba_lazy=True,
                                     mamba_budget=10),
}
for _c in MAMBA_CONFIGS.values():
    _c["requests"] = True
    _c["mamba_space"] = 1 << 12
    if "swa_window" in _c:
        _c["slot_space"] = (1 << 16) * _c["page_size"]
CONFIGS.update(MAMBA_CONFIGS)

# Self-test: flatradix-only changes the driver must catch (a configuration plus
# ``mutant``, see engines.FlatEngine). Policy swaps check that the eviction order
# is really compared; dropped insert arguments check hit counts (lfu/slru),
# priorities and duplicate frees.
MUTANTS = {
    "lru-as-fifo": ("p1-lru", dict(policy="fifo")),
    "slru-as-lfu": ("p16-slru", dict(policy="lfu", policy_config=None)),
    "slru-threshold-2": ("p16-slru", dict(policy_config={"protected_threshold": 2})),
    "tlru-as-lru": ("p64-tlru", dict(policy="lru", policy_config=None)),
    "tlru-threshold": ("p1-tlru", dict(policy_config={"threshold": 40, "next_prompt_estimate": 16})),
    "mru-as-filo": ("p1-mru", dict(policy="filo")),
    "priority-dropped": ("p64-priority", dict(drop_priority=True)),
    "inserted_len-dropped": ("p1-lfu", dict(drop_inserted_len=True)),
    "prev_prefix_len-dropped": ("p16-lru", dict(drop_prev=True)),
    "swa-window-larger": ("p16-swa40-lru", dict(swa_window=48)),
    "swa-cursor-dropped": ("p1-swa24-lfu", dict(drop_cursor=True)),
    "step-round-restarted": ("p1-swa24-lfu", dict(restart_round=True)),
    "mamba-chunk-32": ("p1-mamba-lru", dict(mamba_chunk=32)),
    "mamba-lru-as-fifo": ("p16-mamba-lru", dict(policy="fifo")),
    # the Mamba request path: a full pool's fork evicting two states instead of one,
    # a running request's checkpoint donating its own state instead of a fork
    "mamba-fork-evicts-2": ("p1-mamba-lfu", dict(fork_evicts_2=True)),
    "mamba-checkpoint-donates": ("p1-mamba-lru", dict(checkpoint_donates=True)),
    # the per-path cap: off, or one state more per path
    "mamba-path-cap-off": ("p1-mamba-cap2-lru", dict(mamba_path_cap=-1)),
    "mamba-path-cap-2": ("p16-mamba-cap1-lfu", dict(mamba_path_cap=2)),
    # the extra buffer: flatradix's request tracks into the other ping-pong entry
    "mamba-track-no-flip": ("p64-mamba-c16-fifo", dict(track_no_flip=True)),
    # ... a checkpoint donating the other entry, a finish freeing the adopted one
    "mamba-donate-other": ("p64-mamba-priority", dict(donate_other=True)),
    "mamba-finish-keeps-none": ("p64-mamba-c16-fifo", dict(finish_keeps_none=True)),
    # FULL+SWA+MAMBA with the extra buffer: the SWA window behind the tracked state freed
    "swa-retain-floor-dropped": ("p16-swa32-mamba-cap2-lru", dict(drop_retain_floor=True)),
    # the lazy extra buffer: a full pool's fork evicting without releasing the
    # request's Mamba lock first (the extra buffer's rule)
    "mamba-lazy-keeps-lock": ("p16-mamba-lazy-lru", dict(lazy_keeps_lock=True)),
}

# (extra_key, cache_salt) namespaces; index 0 is the default namespace.
NAMESPACES = [(None, None), ("lora-a", None), (None, "salt-1"), ("lora-a", "salt-1"),
              ("", None), ("lora-b", None)]
NS_WEIGHTS = [10, 2, 2, 1, 1, 1]

MAX_LIVE = 6          # requests in flight
MAX_LOCKS = 8         # extra locks held by "match+lock" ops
VALUE_NONE, BIGRAM, TRACK = 1, 2, 4   # raw insert / match flags (see Executor.op_insert)
# Fresh KV slots (Full configurations) start at SLOT_BASE and wrap back to it, and a
# ``value=None`` insert (token ids become the values) is only sent when every token is
# below it: a token id cached as a value never equals a slot a request holds at the
# same position (the request path keeps such a slot as the tree's own KV).
SLOT_BASE = 1 << 30
SKIP_SWA, CURSOR, BRANCH = 8, 16, 32  # SWA: lock without the window / insert with a cursor /
                                      # with a swa_branching_seqlen
SKIP_MAMBA, TREE_LOCK, LOCK_NODE = 64, 128, 256  # Mamba: lock without the state / through
                                      # lock() instead of inc_lock_ref / insert: lock the node
DEC_UNLOCK = 1 << 8                   # ('unlock', k): k & DEC_UNLOCK -> dec_lock_ref
SELFTEST_OPS = 5000  # a mutant must diverge within this many ops
TOTAL_EVERY = 16
CHECK_EVERY = 64


def geometry(P):
    """Length scale of a config: (unit tokens, max context, KV budget in pages)."""
    if P == 1:
        return 8, 400, 1200
    if P == 16:
        return 16, 1024, 160
    return 64, 1536, 64


# --------------------------------------------------------------------------- executor
class SlotSpace:
    """The oracle's allocator for one KV pool of an SWA configuration: pages handed
    out first-in first-out from a free list, the same to both engines, and taken
    back when freed (the frees are compared first). A Full page returns once every
    slot handed out from it was freed; an SWA page is freed whole (SGLang frees its
    SWA side by page). A slot freed twice or never handed out breaks the count:
    that is reported as a divergence of the engines' slot accounting."""

    def __init__(self, page_size, npages):
        self.P = page_size
        self.free = deque(range(1, npages))
        self.held = {}  # page -> slots handed out and not freed

    def page(self):
        p = self.free.popleft()
        self.held[p] = 0
        return p

    def take(self, page):
        self.held[page] += 1

    def release_slots(self, slots, what):
        for x in slots:
            p = x // self.P
            if self.held.get(p, 0) <= 0:
                raise Divergence(f"{what}.slot_accounting", f"slot {x} freed but not held")
            self.held[p] -= 1
            if self.held[p] == 0:
                del self.held[p]
                self.free.append(p)

    def release_pages(self, pages, what):
        for p in pages:
            if p not in self.held:
                raise Divergence(f"{what}.slot_accounting", f"SWA page {p} freed but not held")
            del self.held[p]
            self.free.append(p)


class ReqState:
    __slots__ = ("rid", "prompt", "ns", "prio", "row", "protected", "extend_end",
                 "output", "committed", "admitted", "swa", "cursor", "mslot", "pp", "track")

    def __init__(self, rid, prompt, ns, prio):
        self.rid, self.prompt, self.ns, self.prio = rid, prompt, ns, prio
        self.row = []
        self.protected = 0
        self.extend_end = 0
        self.output = []
        self.committed = 0
        self.admitted = 0
        self.swa = []      # SWA slot of each row position (SWA configs)
        self.cursor = 0    # SWA cursor (positions below it have no SWA slot of the request)
        self.mslot = None  # Mamba: the request's own state slot
        self.pp = []       # Mamba extra buffer: its ping-pong track slots
        self.track = None  # ... and the seqlen tracked since the last checkpoint


class Executor:
    """Applies abstract ops to both engines and compares them. Every decision it
    takes (slot numbers, budget evictions) depends only on the ops and on values
    already found equal, so an op list replays identically on fresh engines.
    Ops that do not apply to the current state (a request that is gone, ...) are
    skipped, which lets the shrinker delete ops freely."""

    def __init__(self, cfg, backend, first="flatradix"):
        self.cfg = cfg
        self.P = cfg["page_size"]
        self.mamba = cfg.get("mamba_chunk") is not None
        # SGLang ignores is_eagle when Mamba is configured (no bigram tree)
        self.eagle = cfg.get("eagle", False) and not self.mamba
        self.requests = cfg.get("requests", True)
        self.extra = self.mamba and bool(cfg.get("mamba_extra_buffer"))
        self.lazy = self.extra and bool(cfg.get("mamba_lazy"))
        if self.mamba:  # the checkpoint grid lcm(chunk, page)
            self.grid = cfg["mamba_chunk"] * cfg["page_size"] // math.gcd(cfg["mamba_chunk"],
                                                                          cfg["page_size"])
        self.unit, self.max_ctx, self.cap_pages = geometry(self.P)
        nrows = MAX_LIVE + 2
        ctx = self.max_ctx + 2 * self.P
        self.f, self.s = self._both(
            "construct",
            lambda: (FlatEngine(cfg, nrows, ctx) if first == "flatradix"
                     else SglEngine(cfg, nrows, ctx, first.replace("sglang-", ""))),
            lambda: SglEngine(cfg, nrows, ctx, backend))
        self.ids = NodeIdMap()
        self.ids.bind("root", self.f.root(), self.s.root())
        self.hmap = EventHashMap()
        self.coalesce = backend == "rust"
        self.first_page = -(-SLOT_BASE // self.P)
        self.next_page = self.first_page
        self.swa = cfg.get("swa_window") is not None
        if self.swa:
            npages = cfg["slot_space"] // self.P
            self.full_space = SlotSpace(self.P, npages)
            self.swa_space = SlotSpace(self.P, npages)
            self.cap_swa_pages = max(8, int(self.cap_pages * cfg.get("swa_budget", 1.0)))
        if self.swa or self.mamba:
            self.uuids = NodeIdMap()
        if self.mamba:
            # Mamba state slots, donated to both engines alike: first in, first out
            self.mamba_free = deque(range(1, cfg["mamba_space"] + 1))
            self.mamba_held = set()
            self.cap_mamba = cfg.get("mamba_budget", 16)
            self.last_mamba_freed = []
        self.branch_keys = deque(maxlen=8)  # (tokens, ns) at matches' mamba_branching_seqlen
        self.reqs = {}
        self.locks = []
        self.nops = 0
        self.stats = Counter()
        self._sync("init", (None, None))

    # ----------------------------------------------------------- helpers
    def _both(self, what, fn_f, fn_s):
        """Call one operation on each engine; an exception on either side is a divergence."""
        try:
            a = fn_f()
        except Exception as e:  # noqa: BLE001 - any engine error is a finding
            a = e
        try:
            b = fn_s()
        except Exception as e:  # noqa: BLE001
            b = e
        if isinstance(a, Exception) or isinstance(b, Exception):
            fa = f"{type(a).__name__}: {a}" if isinstance(a, Exception) else "ok"
            fb = f"{type(b).__name__}: {b}" if isinstance(b, Exception) else "ok"
            side = ("both" if isinstance(a, Exception) and isinstance(b, Exception)
                    else "flatradix" if isinstance(a, Exception) else "sglang")
            err = a if isinstance(a, Exception) else b
            raise Divergence(f"{what}.raised.{side}.{type(err).__name__}",
                             f"flatradix: {fa} | SGLang: {fb}")
        return a, b

    def _slots(self, row, start, end):
        """KV slots for row positions [start, end): whole pages from the shared
        counter, a partial page continued in place (as a paged allocator does).
        SWA configurations take pages from the slot spaces and map each new Full
        slot to an SWA slot at the same offset of a fresh SWA page, on both engines."""
        P = self.P
        if self.swa:
            return self._swa_slots(row, start, end)
        out = []
        for pos in range(start, end):
            if pos % P == 0:
                out.append(self.next_page * P)
                self.next_page += 1
                if self.next_page * P >= (1 << 31) - P:  # SGLang rows are int32
                    self.next_page = self.first_page
            else:
                out.append((row[pos - 1] if pos - 1 < len(row) else out[-1]) + 1)
        return out

    def _swa_slots(self, row, start, end):
        P = self.P
        out, swa = [], []
        for pos in range(start, end):
            if pos % P == 0:
                fp, sp = self.full_space.page(), self.swa_space.page()
                f, w = fp * P, sp * P
            else:
                prev = row[pos - 1] if pos - 1 < len(row) else out[-1]
                f = prev + 1
                w = (swa[-1] if swa else self.f.swa_peer(prev)) + 1
            self.full_space.take(f // P)
            out.append(f)
            swa.append(w)
        if out:
            self._both("map", lambda: self.f.set_swa_mapping(out, swa),
                       lambda: self.s.set_swa_mapping(out, swa))
        return out

    def _return_slots(self, what, full, swa_pages):
        """Slots both engines freed go back to the slot spaces (SWA configs)."""
        if self.swa:
            self.full_space.release_slots(full, what)
            self.swa_space.release_pages(swa_pages, what)

    @staticmethod
    def _new_pages(start, end, P):
        return max(0, -(-end // P) - (-(-start // P)))

    def _usage_pages(self):
        ev, prot = self.f.sizes()[:2]
        used = (ev + prot) // self.P
        for r in self.reqs.values():
            used += max(0, -(-r.committed // self.P) - r.protected // self.P)
        return used

    def _swa_usage_pages(self):
        sizes = self.f.sizes()
        used = (sizes[2] + sizes[3]) // self.P
        for r in self.reqs.values():
            live = max(r.cursor, r.protected)
            used += max(0, -(-r.committed // self.P) - live // self.P)
        return used

    def _make_room(self, pages):
        """Evict what a scheduler would before allocating ``pages`` pages: Full
        first, then (SWA configs) the SWA pool's shortfall as ``swa_num_tokens``."""
        over = self._usage_pages() + pages - self.cap_pages
        if over > 0:
            self.stats["budget_evict"] += 1
            a, b = self._both("budget_evict", lambda: self.f.evict(over * self.P),
                              lambda: self.s.evict(over * self.P))
            compare("budget_evict.num_evicted", a, b)
            self.stats["evicted_tokens"] += a[0]
        if self.swa:
            over = self._swa_usage_pages() + pages - self.cap_swa_pages
            if over > 0:
                self.stats["budget_evict_swa"] += 1
                a, b = self._both("budget_evict_swa", lambda: self.f.evict(0, over * self.P),
                                  lambda: self.s.evict(0, over * self.P))
                compare("budget_evict_swa.num_evicted", a, b)
                self.stats["evicted_tokens"] += a[0]
                self.stats["evicted_swa_tokens"] += a[1]

    def _mamba_used(self):
        """States in the pool: the tree's and the live requests' own."""
        sizes = self.f.sizes()
        return sizes[-2] + sizes[-1] + sum((r.mslot is not None) + sum(x >= 0 for x in r.pp)
                                           for r in self.reqs.values())

    def _make_mamba_room(self, n=1):
        """Evict Mamba states (``mamba_num``) before donating (or giving a request)
        ``n`` more, as a scheduler would when the state pool is full."""
        over = self._mamba_used() + n - self.cap_mamba
        if over > 0:
            self.stats["budget_evict_mamba"] += 1
            a, b = self._both("budget_evict_mamba", lambda: self.f.evict(0, 0, over),
                              lambda: self.s.evict(0, 0, over))
            compare("budget_evict_mamba.num_evicted(full,swa,mamba)", a, b)
            self._count_evicted(a)

    def _count_evicted(self, a):
        self.stats["evicted_tokens"] += a[0]
        self.stats["evicted_swa_tokens"] += a[1]
        if self.mamba:
            self.stats["evicted_mamba_states"] += a[2]

    def _mamba_slot(self):
        slot = self.mamba_free.popleft()
        self.mamba_held.add(slot)
        return slot

    def _arm_mamba(self, avail):
        """Before a request op: both engines' ``mamba_allocator`` may hand out the
        next slots of the free list while ``avail`` lasts (each free in the op adds
        one: an eviction makes room)."""
        slots = [self.mamba_free[i] for i in range(min(3, len(self.mamba_free)))]
        self.f.arm_mamba(slots, avail)
        self.s.arm_mamba(slots, avail)

    def _take_mamba_allocs(self, what):
        """After a request op: the slots each engine allocated, compared in order;
        they leave the free list (before the op's frees come back through _sync)."""
        a, b = self.f.take_mamba_allocs(), self.s.take_mamba_allocs()
        compare(f"{what}.mamba_allocs", a, b)
        for x in a:
            if not self.mamba_free or self.mamba_free[0] != x:
                raise Divergence(f"{what}.mamba_slot_accounting",
                                 f"Mamba slot {x} allocated out of the armed order")
            self.mamba_held.add(self.mamba_free.popleft())
        return a

    def _fork_avail(self):
        """Free state slots for a running request's checkpoint (its fork): the
        budget's room, or -- at the budget -- 0 when a state is evictable (both
        libraries then evict one, ``EvictParams(mamba_num=1)``) and 1 when none is
        (a scheduler would not have admitted that much; no engine can evict)."""
        avail = self.cap_mamba - self._mamba_used()
        if avail <= 0:
            avail = 0 if self.f.sizes()[-2] > 0 else 1
        return avail

    def _sync(self, what, ns):
        """Compare frees, sizes and events accumulated since the last sync."""
        freed = self.f.take_frees()
        compare(f"{what}.freed_indices", freed, self.s.take_frees())
        if self.swa:
            swa_pages = self.f.take_swa_frees()
            compare(f"{what}.freed_swa_pages", swa_pages, self.s.take_swa_frees())
            self._return_slots(what, freed, swa_pages)
        if self.mamba:
            states = self.f.take_mamba_frees()
            compare(f"{what}.freed_mamba_slots", states, self.s.take_mamba_frees())
            self.last_mamba_freed = states
            for x in states:  # back to the free list once both freed it
                if x not in self.mamba_held:
                    raise Divergence(f"{what}.mamba_slot_accounting",
                                     f"Mamba slot {x} freed but not held")
                self.mamba_held.discard(x)
                self.mamba_free.append(x)
        compare(f"{what}.sizes(evictable,protected[,swa_ev,swa_prot][,mamba_ev,mamba_prot])",
                self.f.sizes(), self.s.sizes())
        fe = event_tuples(self.f.take_events())
        se = event_tuples(self.s.take_events())
        learn = ns[0] is not None
        fe = self.hmap.translate(fe, se, learn)
        if self.coalesce:
            fe, se = coalesce_removed(fe), coalesce_removed(se)
        compare(f"{what}.events", fe, se)

    def check_total(self, what, content=False):
        total = self.f.total()
        compare(f"{what}.total_size", total, self.s.total())
        sizes = self.f.sizes()
        compare(f"{what}.total==evictable+protected", total[0], sizes[0] + sizes[1])
        aux = (sizes[2] + sizes[3] if self.swa else 0) + (sizes[-2] + sizes[-1] if self.mamba else 0)
        if self.swa or self.mamba:  # SWA tokens and Mamba states lumped together
            compare(f"{what}.aux_total==swa+mamba(evictable+protected)", total[1], aux)
        if content:  # O(tree) on both sides: at resets and episode ends only
            compare(f"{what}.all_values_flatten(sorted)", self.f.values(), self.s.values())
            if self.mamba:
                mv = self.f.mamba_values()
                compare(f"{what}.all_mamba_values_flatten(sorted)", mv, self.s.mamba_values())
                own = {r.mslot for r in self.reqs.values()}  # the live requests' states
                own.update(x for r in self.reqs.values() for x in r.pp)
                compare(f"{what}.mamba_values_held", mv, sorted(self.mamba_held - own))

    def key_units(self, toks):
        return max(0, len(toks) - 1) if self.eagle else len(toks)

    # ----------------------------------------------------------- ops
    def apply(self, op):
        kind = op[0]
        getattr(self, "op_" + kind)(*op[1:])
        self.nops += 1
        self.stats[kind] += 1
        if self.nops % TOTAL_EVERY == 0:
            self.check_total(kind)
        if self.nops % CHECK_EVERY == 0:
            self.f.check()

    def op_match(self, toks, nsi, lock, flags=0):
        ns = NAMESPACES[nsi]
        bigram = bool(flags & BIGRAM) and self.eagle
        (fl, fi, fn, fx), (sl, si, sn, sx) = self._both(
            "match", lambda: self.f.match(toks, ns, bigram), lambda: self.s.match(toks, ns, bigram))
        compare("match.prefix_len", fl, sl)
        compare("match.indices", fi, si)
        self.ids.bind("match", fn, sn)
        self.ids.bind("match.last_host_node", fx[0], sx[0])
        self.ids.bind("match.best_match_node", fx[1], sx[1])
        if fx[2] is None or sx[2] is None:
            compare("match.last_visited_node_id", fx[2], sx[2])
        else:
            self.ids.bind("match.last_visited_node_id", fx[2], sx[2])
        compare("match.other_fields", fx[3], sx[3])
        self.stats["match_tokens"] += fl
        if self.mamba:
            self.stats["match_full_hit_tokens"] += fx[3][1]
            branch = fx[3][5]  # mamba_branching_seqlen: where a scheduler would checkpoint
            if branch is not None:
                self.stats["mamba_branching"] += 1
                self.branch_keys.append((tuple(toks[:branch]), nsi))
        if lock and len(self.locks) < MAX_LOCKS:
            self._lock(fn, sn, flags)
        self._sync("match", ns)

    def _lock(self, fn, sn, flags):
        skip = bool(flags & SKIP_SWA) and self.swa
        if self.mamba:
            # A lock without the SWA window must not hold the Mamba state either: an
            # SWA eviction of the node cascades to its state, and SGLang asserts that
            # no Mamba lock stands in the way (both cores; SWA-and-below, as the
            # release's skip_swa means). SGLang itself only ever skips MAMBA.
            kw = dict(skip_mamba=bool(flags & SKIP_MAMBA) or skip, tree_lock=bool(flags & TREE_LOCK))
            (fh, fr), (sh, sr) = self._both("lock", lambda: self.f.lock(fn, skip, **kw),
                                            lambda: self.s.lock(sn, skip, **kw))
        else:
            (fh, fr), (sh, sr) = self._both("lock", lambda: self.f.lock(fn, skip),
                                            lambda: self.s.lock(sn, skip))
        self.compare_receipt("lock", fr, sr)
        self.locks.append((fh, sh))

    def compare_receipt(self, what, fr, sr):
        """A lock's delta, and its SWA window boundary (None / a stamp, stamps
        compared through a bijection as node ids are)."""
        compare(f"{what}.delta", fr[0], sr[0])
        fu = {int(k): v for k, v in fr[1].items()}
        su = {int(k): v for k, v in sr[1].items()}
        compare(f"{what}.component_lock_uuids.keys", sorted(fu), sorted(su))
        for k in fu:
            if fu[k] is None or su[k] is None:
                compare(f"{what}.component_lock_uuids[{k}]", fu[k], su[k])
            else:
                self.uuids.bind(f"{what}.component_lock_uuids", fu[k], su[k])

    def op_unlock(self, k):
        if not self.locks:
            return
        fh, sh = self.locks.pop(k % len(self.locks))
        if self.mamba:  # Mamba configs also release through dec_lock_ref
            dec = bool(k & DEC_UNLOCK)
            self._both("unlock", lambda: self.f.unlock(fh, dec), lambda: self.s.unlock(sh, dec))
        else:
            self._both("unlock", lambda: self.f.unlock(fh), lambda: self.s.unlock(sh))
        self._sync("unlock", (None, None))

    def op_release_mamba(self, k):
        """Release only the Mamba part of a held lock, as SGLang's lazy extra buffer
        does before evicting for a state slot (``MambaComponent._alloc_mamba_slot``:
        a lock not SWA-released whose receipt did not skip Mamba)."""
        if not self.locks or not self.mamba:
            return
        fh, sh = self.locks[k % len(self.locks)]
        MAMBA = 2
        if sh.swa_released or any(int(c) == MAMBA for c in sh.receipt.skipped_lock_components):
            return
        self._both("release_mamba", lambda: self.f.release_mamba(fh),
                   lambda: self.s.release_mamba(sh))
        self._sync("release_mamba", (None, None))

    def op_release_swa(self, k):
        """Early SWA release of a held lock (``release_swa``); the later unlock skips SWA."""
        if not self.locks or not self.swa:
            return
        fh, sh = self.locks[k % len(self.locks)]
        if any(int(c) == 1 for c in fh.receipt.skipped_lock_components):
            return  # a lock that skipped SWA has no window to release (both raise KeyError)
        self._both("release_swa", lambda: self.f.release_swa(fh), lambda: self.s.release_swa(sh))
        compare("release_swa.swa_released", fh.swa_released, sh.swa_released)
        self._sync("release_swa", (None, None))

    def op_insert(self, toks, nsi, prev, inserted, prio, flags=0):
        """Raw insert with fresh KV slots. ``flags``: VALUE_NONE (``value=None``: the
        tree stores the token ids), BIGRAM (EAGLE key marked ``is_bigram`` by the caller),
        TRACK (``track_adopted_ranges=True``)."""
        ns = NAMESPACES[nsi]
        n = self.key_units(toks)
        bigram = bool(flags & BIGRAM) and self.eagle
        mslot = None
        if self.mamba:  # every insert donates one state slot (SGLang asserts one)
            self._make_mamba_room()
            mslot = self._mamba_slot()
        if flags & VALUE_NONE and all(t < SLOT_BASE for t in toks) and not self.swa:
            values = None  # token ids become "KV indices" (below SLOT_BASE: see there)
        else:
            self._make_room(self._new_pages(0, n, self.P))
            values = self._slots([], 0, n)
        track = bool(flags & TRACK)
        cursor = branching = None
        if self.swa:
            P = self.P
            aligned = n - n % P
            # a request's SWA cursor: its slots below it already gave their SWA peers back
            cursor = (inserted * 7 + prio * 3 + n) % (aligned // P + 1) * P if flags & CURSOR else 0
            if cursor:
                self._both("free_swa", lambda: self.f.free_swa(values[:cursor]),
                           lambda: self.s.free_swa(values[:cursor]))
            if flags & BRANCH:
                branching = max(P, (prev + inserted) % (n + P + 1))
        mkw = dict(mamba_slot=mslot) if self.mamba else {}
        (fl, fn, fx), (sl, sn, sx) = self._both(
            "insert",
            lambda: self.f.insert(toks, ns, values, min(prev, n), min(inserted, n), prio, bigram, track,
                                  cursor or 0, branching, **mkw),
            lambda: self.s.insert(toks, ns, values, min(prev, n), min(inserted, n), prio, bigram, track,
                                  cursor or 0, branching, **mkw))
        compare("insert.prefix_len", fl, sl)
        self.ids.bind("insert", fn, sn)
        compare("insert.other_fields(total_len,mamba_exist,swa_branch_inserted,adopted_ranges)", fx, sx)
        if self.mamba:
            if fx[1]:  # mamba_exist: the tree kept its own state; the caller frees the slot
                self.stats["mamba_exist"] += 1
                self._both("free_mamba", lambda: self.f.free_mamba(mslot),
                           lambda: self.s.free_mamba(mslot))
            if flags & LOCK_NODE and len(self.locks) < MAX_LOCKS:  # re-anchor, as checkpoint does
                self._lock(fn, sn, flags)
        self._sync("insert", ns)

    def op_evict(self, n, swa_n=0, mamba_n=0):
        swa_n = swa_n if self.swa else 0
        if self.mamba:
            a, b = self._both("evict", lambda: self.f.evict(n, swa_n, mamba_n),
                              lambda: self.s.evict(n, swa_n, mamba_n))
            compare("evict.num_evicted(full,swa,mamba)", a, b)
        else:
            a, b = self._both("evict", lambda: self.f.evict(n, swa_n), lambda: self.s.evict(n, swa_n))
            compare("evict.num_evicted(full,swa)", a, b)
        self._count_evicted(a)
        self._sync("evict", (None, None))

    def op_evict_steps(self, ct, n, k, key=None, nsi=0):
        """A step-wise eviction round (``evict_device_start`` / ``_next_node`` /
        ``_end``), step by step; with ``key``, a match of it between the first and
        second steps (an LRU refresh the round's cursor must survive). ``key ==
        "next"``: the path to the node the round takes next by the tree's order
        (read from flatradix's arrays after its first step, matched on both)."""
        if (ct == 1 and not self.swa) or (ct == 2 and not self.mamba):
            return
        got = {}
        target = {}

        def refresh(side, eng):
            def run():
                if key == "next":
                    if side == "f":
                        target["k"] = self.f.next_victim_key(ct)
                    if target.get("k") is None:
                        return
                    toks, ns = target["k"]
                else:
                    toks, ns = key, NAMESPACES[nsi]
                got[side] = eng.match(toks, ns)
            return run if key is not None else None
        a, b = self._both("evict_steps",
                          lambda: self.f.evict_steps(ct, n, k, refresh("f", self.f)),
                          lambda: self.s.evict_steps(ct, n, k, refresh("s", self.s)))
        compare("evict_steps.steps", len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b)):
            compare(f"evict_steps[{i}].(made_progress,full,swa,mamba)", x[1:], y[1:])
            if x[0] is None or y[0] is None:
                compare(f"evict_steps[{i}].node", x[0], y[0])
            else:
                self.ids.bind(f"evict_steps[{i}].node", x[0], y[0])
            self._count_evicted(x[2:])
        if "f" in got or "s" in got:
            (fl, fi, fn, _), (sl, si, sn, _) = got.get("f"), got.get("s")
            compare("evict_steps.match.prefix_len", fl, sl)
            compare("evict_steps.match.indices", fi, si)
            self.ids.bind("evict_steps.match", fn, sn)
        self._sync("evict_steps", (None, None))

    def op_admit(self, rid, prompt, nsi, prio):
        if rid in self.reqs or len(self.reqs) >= MAX_LIVE or not prompt or not self.requests:
            return
        ns = NAMESPACES[nsi]
        # the request's own state slot, with the extra buffer its two ping-pong track
        # slots too (lazy: one; a full pool evicts first)
        n_states = 1 + (1 if self.lazy else 2) * self.extra
        if self.mamba:
            self._make_mamba_room(n_states)
            self._arm_mamba(n_states)
        (fl, fi, fn, fw), (sl, si, sn, sw) = self._both(
            "admit", lambda: self.f.req_admit(rid, prompt, ns, prio),
            lambda: self.s.req_admit(rid, prompt, ns, prio))
        mslot = None
        if self.mamba:
            got = self._take_mamba_allocs("admit")
            compare("admit.mamba_allocs.count", len(got), n_states)
            mslot = got[0]
            if self.extra:
                want = got[1:] + [-1] * self.lazy  # lazy: the second entry empty
                compare("admit.mamba_ping_pong", self.f.req_ping_pong(rid), want)
                compare("admit.mamba_ping_pong(SGLang)", self.s.req_ping_pong(rid), want)
            compare("admit.req_mamba_pool_idx", self.f.req_mamba(rid), mslot)
            compare("admit.req.kv.mamba_pool_idx(SGLang)", self.s.req_mamba(rid), mslot)
        compare("admit.prefix_len", fl, sl)
        compare("admit.indices", fi, si)
        self.ids.bind("admit", fn, sn)
        compare("admit.swa(cursor,branching_seqlen)", fw, sw)
        r = ReqState(rid, prompt, ns, prio)
        r.row = list(fi)
        r.protected = r.extend_end = r.committed = r.admitted = fl
        r.mslot = mslot
        if self.extra:
            r.pp = list(got[1:]) + [-1] * self.lazy
        self.reqs[rid] = r
        self.stats["admit_hit_tokens"] += fl
        self.stats["admit_tokens"] += len(prompt)
        if fi:
            self._both("admit.write", lambda: self.f.req_write(rid, 0, fi),
                       lambda: self.s.req_write(rid, 0, fi))
        self._sync("admit", ns)

    def _grow(self, r, end):
        """Commit row positions [r.committed, end) with fresh slots."""
        start = r.committed
        self._make_room(self._new_pages(start, end, self.P))
        slots = self._slots(r.row, start, end)
        del r.row[start:]
        r.row.extend(slots)
        r.committed = end
        self._both("write", lambda: self.f.req_write(r.rid, start, slots),
                   lambda: self.s.req_write(r.rid, start, slots))

    def _progress(self, r):
        self._both("progress", lambda: self.f.req_progress(r.rid, r.output, r.committed),
                   lambda: self.s.req_progress(r.rid, r.output, r.committed))

    def _track(self, r, seqlen, decode=False):
        """Extra buffer: the model runner saved the state at ``seqlen`` tokens into
        the request's next ping-pong entry (SGLang's non-lazy tracking: last entry
        = next, next flips, prev seqlen = last). Lazy (``engines.track_lazy``): a
        decode step first takes a slot for the empty entry while the budget has
        room (no eviction), then frees the entry it stopped tracking."""
        if self.lazy and decode:
            self._arm_mamba(max(0, self.cap_mamba - self._mamba_used()))
        self._both("track", lambda: self.f.req_track(r.rid, seqlen, decode),
                   lambda: self.s.req_track(r.rid, seqlen, decode))
        if self.lazy and decode:
            got = self._take_mamba_allocs("track")
            self.stats["mamba_lazy_prealloc" if got else "mamba_lazy_in_place"] += 1
            pp = self.f.req_ping_pong(r.rid)
            compare("track.mamba_ping_pong", pp, self.s.req_ping_pong(r.rid))
            r.pp = pp
        r.track = seqlen
        self.stats["mamba_tracked"] += 1

    def _checkpoint(self, r, what):
        up_to = r.committed
        if self.mamba:  # the fork of the request's state (SGLang _alloc_mamba_slot)
            avail = self._fork_avail()
            self.stats["mamba_fork_evict" if avail == 0 else "mamba_fork"] += 1
            self._arm_mamba(avail)
        (fp, fn, frow, fw), (sp, sn, srow, sw) = self._both(
            what, lambda: self.f.req_checkpoint(r.rid, up_to),
            lambda: self.s.req_checkpoint(r.rid, up_to))
        if self.mamba:
            # one fork per checkpoint of a running request: SGLang allocates it
            # before it knows whether anything gets cached or the node already
            # holds a state (it frees the fork then, compared with the frees);
            # extra buffer: a fresh slot for the ping-pong entry it donates, only
            # when a state was tracked since the last checkpoint
            got = self._take_mamba_allocs(what)
            compare(f"{what}.mamba_allocs.count", len(got),
                    int(not self.extra or bool(r.track)))
            if self.extra:
                pp = self.f.req_ping_pong(r.rid)
                compare(f"{what}.mamba_ping_pong", pp, self.s.req_ping_pong(r.rid))
                r.pp = pp
                r.track = None
            compare(f"{what}.req_mamba_pool_idx", self.f.req_mamba(r.rid), r.mslot)
            compare(f"{what}.req.kv.mamba_pool_idx(SGLang)", self.s.req_mamba(r.rid), r.mslot)
        compare(f"{what}.cache_protected_len", fp, sp)
        self.ids.bind(what, fn, sn)
        compare(f"{what}.req_to_token_row", frow, srow)
        compare(f"{what}.swa(cursor,branching_seqlen)", fw, sw)
        r.protected = fp
        r.row[:up_to] = frow
        if fw is not None:
            r.cursor = fw[0]
        self.stats["checkpoint"] += 1

    def op_slide(self, rid):
        """The scheduler's per-decode SWA slide: ``evict_sliding_windows(req, seqlen - 1)``."""
        r = self.reqs.get(rid)
        if r is None or not self.swa or r.committed < 1:
            return
        pre = r.committed - 1
        fw, sw = self._both("slide", lambda: self.f.req_slide(rid, pre),
                            lambda: self.s.req_slide(rid, pre))
        compare("slide.swa(cursor,branching_seqlen)", fw, sw)
        r.cursor = fw[0]
        self.stats["slide"] += 1
        self._sync("slide", r.ns)

    def op_req_release_swa(self, rid):
        """``release_swa_prefix_lock``: the request's window moved past its prefix."""
        r = self.reqs.get(rid)
        if r is None or not self.swa:
            return
        self._both("req_release_swa", lambda: self.f.req_release_swa(rid),
                   lambda: self.s.req_release_swa(rid))
        self._sync("req_release_swa", r.ns)

    def op_extend(self, rid, n, first_tok, ckpt_at_end):
        """One prefill chunk of ``n`` prompt tokens (chunk ends page-aligned, as
        SGLang's PrefillAdder truncates them); a chunk that does not finish the
        prompt is cached with ``cache_unfinished_req``."""
        r = self.reqs.get(rid)
        if r is None or r.extend_end >= len(r.prompt):
            return
        P, L = self.P, len(r.prompt)
        a = r.extend_end
        b = min(a + max(1, n), L)
        if b < L and P > 1:
            b = b // P * P
            if b <= a:
                b = min(L, (a // P + 1) * P)
        self._grow(r, b)
        if self.extra and b - a >= self.grid:  # the model runner tracks a state
            self._track(r, a + (b - a) // self.grid * self.grid)
        r.extend_end = b
        if b == L:
            r.output.append(first_tok)  # the first sampled token (no KV yet)
        self._progress(r)
        if b < L or ckpt_at_end:
            self._checkpoint(r, "cache_unfinished_req")
        self._sync("extend", r.ns)

    def op_decode(self, rid, toks, ckpt):
        r = self.reqs.get(rid)
        if r is None or r.extend_end < len(r.prompt):
            return
        k = min(len(toks), self.max_ctx - r.committed - 1)
        if k <= 0:
            return
        c0 = r.committed
        self._grow(r, r.committed + k)  # KV of the previously sampled tokens
        if self.extra and r.committed // self.grid > c0 // self.grid:
            self._track(r, r.committed // self.grid * self.grid, decode=True)
        r.output.extend(toks[:k])
        self._progress(r)
        if ckpt:
            self._checkpoint(r, "cache_unfinished_req(decode)")
        self._sync("decode", r.ns)

    def op_finish(self, rid, insert):
        r = self.reqs.get(rid)
        if r is None or r.extend_end <= r.admitted:
            return  # nothing allocated yet: a scheduler prefills in the admitting batch
        del self.reqs[rid]
        what = "cache_finished_req" if insert else "abort"
        fm, sm = self._both(what, lambda: self.f.req_release(rid, insert),
                            lambda: self.s.req_release(rid, insert))
        self._sync("finish", r.ns)
        if self.mamba:
            # Afterwards the request holds no state: freed (abort, or the node
            # already had one) or the tree's. normalize.py point 8: SGLang leaves
            # req.kv.mamba_pool_idx naming a state the tree adopted.
            freed = r.mslot in self.last_mamba_freed
            self.stats["mamba_freed_at_finish" if freed else "mamba_donated"] += 1
            kept = None if freed else r.mslot
            compare(f"{what}.req_mamba_pool_idx",
                    fm, kept if self.f.name == "sglang" else None)  # (--first python|rust)
            compare(f"{what}.req.kv.mamba_pool_idx(SGLang; the tree's state when not freed)",
                    sm, kept)

    def op_reset(self):
        """Finish every request and drop every lock (a scheduler flushes only when
        idle), then ``reset()`` both trees."""
        for rid in sorted(self.reqs):
            if self.reqs[rid].extend_end <= self.reqs[rid].admitted:
                self.op_extend(rid, 1, 1, False)
            self.op_finish(rid, True)
        while self.locks:
            self.op_unlock(0)
        self.check_total("reset", content=True)
        self._both("reset", self.f.reset, self.s.reset)
        self.ids.bind("reset.root", self.f.root(), self.s.root())
        self._sync("reset", (None, None))
        if self.mamba:  # the tree dropped its states unfreed: a flushing scheduler clears the pool
            self.mamba_free.extend(sorted(self.mamba_held))
            self.mamba_held.clear()

    def finish_episode(self):
        self.check_total("episode_end", content=True)
        self.f.check()


# --------------------------------------------------------------------------- generator
class Generator:
    """Seeded scheduler-shaped op stream. Reads the executor's state only to pick
    plausible ops; the executor skips ops that no longer apply."""

    def __init__(self, cfg, rng):
        self.rng = rng
        self.P = cfg["page_size"]
        self.mamba = cfg.get("mamba_chunk") is not None
        self.eagle = cfg.get("eagle", False) and not self.mamba  # see MAMBA_CONFIGS
        self.requests = cfg.get("requests", True)
        self.unit, self.max_ctx, _ = geometry(self.P)
        self.swa = cfg.get("swa_window") is not None
        self.sys_prompts = [self.tokens(self.span(1, 8)) for _ in range(4)]
        self.convs = []          # [ns index, tokens]
        self.req_conv = {}       # rid -> conv slot (or None)
        self.next_rid = 0

    def span(self, lo_units, hi_units):
        """A length between lo and hi units, not page-aligned in general."""
        return self.rng.randint(lo_units * self.unit, hi_units * self.unit) + self.rng.randrange(self.unit)

    def tokens(self, n):
        rng = self.rng
        r = rng.random()
        if r < 0.2:  # small alphabet: many accidental partial matches, mid-page splits
            return tuple(rng.randint(1, 3) for _ in range(n))
        if r < 0.22:  # ids at the edges of the token domain
            if self.eagle:  # flatradix's documented EAGLE domain (normalize.py, point 6)
                return tuple(rng.choice((0, 2 ** 31 - 1, rng.randrange(2 ** 31))) for _ in range(n))
            return tuple(rng.choice((0, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1, rng.randrange(2 ** 32)))
                         for _ in range(n))
        return tuple(rng.randrange(1, 150000) for _ in range(n))

    def ns(self):
        return self.rng.choices(range(len(NAMESPACES)), NS_WEIGHTS)[0]

    def lock_flags(self):
        """Mamba configs: how a lock is taken (without the state, through ``lock()``)."""
        rng = self.rng
        return (SKIP_MAMBA if rng.random() < 0.3 else 0) | (TREE_LOCK if rng.random() < 0.3 else 0)

    def cut(self, toks):
        return toks[:self.rng.randint(0, len(toks))]

    def source_key(self, ex):
        """A key for a raw insert / match, and its namespace."""
        rng = self.rng
        if self.mamba:
            # A state sits only where a key ended: reuse whole keys (plus a tail),
            # and the branching points matches reported (what a scheduler
            # checkpoints a state at), so that prefixes do match.
            r = rng.random()
            tail = self.tokens(self.span(0, 2)) if rng.random() < 0.5 else ()
            if r < 0.2 and ex.branch_keys:
                toks, nsi = ex.branch_keys.popleft()
                return (toks + tail)[: self.max_ctx], nsi
            if r < 0.45 and self.convs:
                nsi, toks = rng.choice(self.convs)
                return (toks + tail)[: self.max_ctx], nsi
            if r < 0.5:
                return rng.choice(self.sys_prompts) + tail, self.ns()
        r = rng.random()
        if r < 0.3 and self.convs:
            nsi, toks = rng.choice(self.convs)
            key = self.cut(toks) + (self.tokens(self.span(0, 2)) if rng.random() < 0.5 else ())
        elif r < 0.5:
            nsi, key = self.ns(), self.cut(rng.choice(self.sys_prompts)) + self.tokens(self.span(0, 2))
        elif r < 0.7 and ex.reqs:
            req = ex.reqs[rng.choice(sorted(ex.reqs))]
            nsi = NAMESPACES.index(req.ns)
            key = self.cut(req.prompt + tuple(req.output))
        elif r < 0.75:
            nsi, key = self.ns(), self.tokens(rng.randrange(0, self.P + 2))  # short / sub-page
        else:
            nsi, key = self.ns(), self.tokens(self.span(0, 4))
        if rng.random() < 0.15:
            nsi = self.ns()  # same tokens, maybe another namespace
        return key[: self.max_ctx], nsi

    def prompt(self, ex):
        rng = self.rng
        r = rng.random()
        conv = None
        if r < 0.35 and self.convs:  # next turn of a conversation
            conv = rng.randrange(len(self.convs))
            nsi, hist = self.convs[conv]
            prompt = hist + self.tokens(self.span(0, 2) + 1)
        elif r < 0.6:  # new conversation on a shared system prompt
            nsi = self.ns()
            prompt = rng.choice(self.sys_prompts) + self.tokens(self.span(0, 3) + 1)
        elif r < 0.75 and (self.convs or ex.reqs):  # fan-out from a history / running prompt
            if self.convs and (not ex.reqs or rng.random() < 0.5):
                nsi, base = rng.choice(self.convs)
            else:
                req = ex.reqs[rng.choice(sorted(ex.reqs))]
                nsi, base = NAMESPACES.index(req.ns), req.prompt
            prompt = self.cut(base) + self.tokens(self.span(0, 2) + 1)
        elif r < 0.85 and self.convs:  # exact repeat
            nsi, prompt = rng.choice(self.convs)
        else:
            nsi, prompt = self.ns(), self.tokens(self.span(0, 4) + 1)
        limit = self.max_ctx * 2 // 3
        if len(prompt) > limit:
            prompt = prompt[len(prompt) - limit:] if rng.random() < 0.5 else prompt[:limit]
            conv = None
        if conv is None and len(prompt) < limit // 2:
            if len(self.convs) < 40:
                self.convs.append([nsi, prompt])
                conv = len(self.convs) - 1
            elif rng.random() < 0.3:
                conv = rng.randrange(len(self.convs))
                self.convs[conv] = [nsi, prompt]
        return prompt or (1,), nsi, conv

    def next(self, ex):
        rng = self.rng
        prefill = [rid for rid, r in ex.reqs.items() if r.extend_end < len(r.prompt)]
        decode = [rid for rid, r in ex.reqs.items() if r.extend_end >= len(r.prompt)]
        choices = []
        if not self.requests:
            prefill = decode = ()  # (and no admissions: ex.reqs stays empty)
        elif len(ex.reqs) < MAX_LIVE:
            choices.append(("admit", 0.10 if ex.reqs else 0.5))
        if prefill:
            choices.append(("extend", 0.15))
        if decode:
            choices.append(("decode", 0.22))
            choices.append(("finish", 0.07))
        if ex.reqs:
            choices.append(("abort", 0.01))
        choices += [("insert", 0.12), ("match", 0.16), ("evict", 0.03 if self.mamba else 0.05),
                    ("evict_steps", 0.01), ("reset", 0.002)]
        if ex.locks:
            choices.append(("unlock", 0.05))
        if self.mamba:
            choices.append(("evict_steps", 0.02))  # (more rounds: Mamba's own walk)
            if ex.locks:
                choices.append(("release_mamba", 0.02))
        if self.swa:
            if decode:
                choices.append(("slide", 0.10))
            if ex.reqs:
                choices.append(("req_release_swa", 0.01))
            if ex.locks:
                choices.append(("release_swa", 0.03))
        kind = rng.choices([c[0] for c in choices], [c[1] for c in choices])[0]
        if kind == "admit":
            prompt, nsi, conv = self.prompt(ex)
            rid = self.next_rid
            self.next_rid += 1
            self.req_conv[rid] = conv
            prio = rng.choice((0, 0, 0, 1, 2, 3, -1))
            return ("admit", rid, prompt, nsi, prio)
        if kind == "extend":
            return ("extend", rng.choice(sorted(prefill)), self.span(0, 3) + 1,
                    rng.randrange(1, 150000), rng.random() < 0.1)
        if kind == "decode":
            rid = rng.choice(sorted(decode))
            n = rng.choice((1, 1, 2, 3, self.unit, rng.randint(1, 2 * self.unit)))
            return ("decode", rid, self.tokens(n), rng.random() < 0.1)
        if kind in ("finish", "abort"):
            rid = rng.choice(sorted(decode if kind == "finish" else ex.reqs))
            insert = kind == "finish" and rng.random() < 0.95
            r = ex.reqs[rid]
            conv = self.req_conv.pop(rid, None)
            if insert and conv is not None and conv < len(self.convs):
                hist = r.prompt + tuple(r.output)
                if len(hist) < self.max_ctx * 2 // 3:
                    self.convs[conv] = [NAMESPACES.index(r.ns), hist]
            return ("finish", rid, insert)
        if kind == "insert":
            key, nsi = self.source_key(ex)
            n = max(0, len(key) - 1) if self.eagle else len(key)
            P = self.P
            prev = rng.choice((0, 0, rng.randint(0, n)))
            inserted = rng.choice((0, 0, rng.randint(0, n)))
            if P > 1:  # schedulers pass page-aligned lengths
                prev, inserted = prev // P * P, inserted // P * P
            flags = ((VALUE_NONE if rng.random() < 0.03 else 0) | (BIGRAM if rng.random() < 0.3 else 0)
                     | (TRACK if rng.random() < 0.2 else 0))
            if self.swa:
                flags |= (CURSOR if rng.random() < 0.3 else 0) | (BRANCH if rng.random() < 0.1 else 0)
            if self.mamba:
                flags |= self.lock_flags() | (LOCK_NODE if rng.random() < 0.15 else 0)
            if not self.requests and key and rng.random() < 0.4:
                # no requests grow conversations: inserted keys seed later keys
                if len(self.convs) < 40:
                    self.convs.append([nsi, key])
                else:
                    self.convs[rng.randrange(len(self.convs))] = [nsi, key]
            return ("insert", key, nsi, prev, inserted, rng.choice((0, 0, 1, 2, 5)), flags)
        if kind == "match":
            key, nsi = self.source_key(ex)
            flags = BIGRAM if rng.random() < 0.3 else 0
            if self.swa and rng.random() < 0.2:
                flags |= SKIP_SWA
            if self.mamba:
                flags |= self.lock_flags()
            return ("match", key, nsi, rng.random() < 0.3, flags)
        if kind == "unlock":
            return ("unlock", rng.randrange(1 << 16))
        if kind == "release_mamba":
            return ("release_mamba", rng.randrange(1 << 16))
        if kind == "evict" and self.mamba:
            n = rng.choice((0, 0, 1, self.P, rng.randint(1, 4 * self.unit), 10 ** 6 if rng.random() < 0.1 else 1))
            swa_n = (rng.choice((0, 0, 1, self.P, rng.randint(1, 4 * self.unit))) if self.swa else 0)
            mamba_n = rng.choice((0, 1, 1, 2, rng.randint(1, 8), 10 ** 6 if rng.random() < 0.1 else 1))
            return ("evict", n, swa_n, mamba_n)
        if kind == "evict":
            n = rng.choice((1, self.P, rng.randint(1, 4 * self.unit), 10 ** 6 if rng.random() < 0.1 else 1))
            if self.swa:
                swa_n = rng.choice((0, 0, 1, self.P, rng.randint(1, 4 * self.unit),
                                    10 ** 6 if rng.random() < 0.1 else 1))
                if rng.random() < 0.5:
                    n = 0
                return ("evict", n, swa_n)
            return ("evict", n)
        if kind == "evict_steps":
            ct = 1 if self.swa and rng.random() < 0.6 else 0
            if self.mamba and rng.random() < 0.6:
                ct = 2
            n = rng.choice((1, self.P, rng.randint(1, 4 * self.unit), 10 ** 6))
            if ct == 2:
                n = rng.choice((1, 1, 2, rng.randint(1, 8), 10 ** 6))
            k = rng.choice((1, 2, 3, rng.randint(1, 12)))
            r = rng.random()
            key, nsi = ("next", 0) if r < 0.5 else self.source_key(ex) if r < 0.8 else (None, 0)
            return ("evict_steps", ct, n, k, key, nsi)
        if kind in ("slide", "req_release_swa"):
            return (kind, rng.choice(sorted(decode if kind == "slide" else ex.reqs)))
        if kind == "release_swa":
            return ("release_swa", rng.randrange(1 << 16))
        return ("reset",)


# --------------------------------------------------------------------------- running
def _play(cfg, backend, first, rng, n, ops):
    """One episode of ``n`` ops on fresh engines (``harness.Spec.play``): each op
    is generated from the engines' state, appended to ``ops``, then applied."""
    gen = Generator(cfg, rng)
    ex = Executor(cfg, backend, first)
    try:
        for _ in range(n):
            op = gen.next(ex)
            ops.append(op)
            ex.apply(op)
        ex.finish_episode()
    except Divergence as d:
        d.stats = ex.stats
        raise
    return ex.stats


def replay(cfg, backend, ops, first="flatradix"):
    """Run ``ops`` on fresh engines; return the Divergence raised, or None."""
    try:
        ex = Executor(cfg, backend, first)
        for op in ops:
            ex.apply(op)
        ex.finish_episode()
    except Divergence as d:
        return d
    return None


SPEC = harness.Spec(
    module="driver", repro_prefix="repro", seed_tag="", configs=CONFIGS, mutants=MUTANTS,
    play=_play, replay=replay, groups={"all": list(CONFIGS), "mamba": list(MAMBA_CONFIGS)},
    episode=5000, shrink_seconds=600, selftest_ops=SELFTEST_OPS, shorten_tokens=True,
    # sglang-flatradix: SGLang's controller over flatradix's TreeCore plug-in (needs
    # flatradix installed in the venv)
    firsts=("flatradix", "python", "rust", "sglang-flatradix"))


def run_config(name, backend, seed, total_ops, episode, shrink_s, repro_dir, log=print, cfg=None,
               first="flatradix"):
    """``harness.run_config`` of this driver."""
    return harness.run_config(SPEC, name, backend, seed, total_ops, episode, shrink_s, repro_dir,
                              log, cfg, first)


def main(argv=None):
    return harness.main(SPEC, argv, __doc__.split("\n\n")[0])


if __name__ == "__main__":
    sys.exit(main())
