"""Engine adapters for the peer comparison: flatradix and SGLang 0.5.23.

Each engine builds a cache + KV allocator + request table and exposes exactly
the calls a benchmark times. Nothing here is timed; the benchmark loops time
the bound cache methods directly, so no adapter frame sits inside a sample.

Each engine is fed what its own fast path takes:

* flatradix: ``RadixKey(numpy int64 array)`` keys and numpy values (its own
  ``TokenToKVPoolAllocator``), or torch values when it runs on SGLang's
  allocator;
* SGLang: ``RadixKey(array('q'))`` keys and the torch int64 slices its
  ``TokenToKVPoolAllocator.alloc`` returns (as its ``bench_unified_radix_cache.py``
  and scheduler do).

``FreeClock`` wraps an allocator's ``free`` / ``free_segment`` (and an SWA
allocator's ``free_swa`` / ``free_swa_segment`` / ``free_full`` /
``free_full_segment``) and accumulates the seconds spent inside them: SGLang's
``free`` is a ``torch.cat`` onto the free list (tens of µs a call), which is
allocator work, not tree work. Tree-only figures subtract it.

The SWA engines (``swa_engines``) build the same caches with the ``(FULL, SWA)``
components, window ``W`` and each engine's SWA allocator (flatradix's
``SWATokenToKVPoolAllocator``; SGLang's over an ``SWAKVPool`` on the CPU), page
size 1 so SGLang's ``alloc`` hands out the slots of both pools.

The Mamba engines (``mamba_engines``) build them with the ``(FULL, MAMBA)``
components at page 1 (no extra buffer) over each library's
``HybridReqToTokenPool`` (SGLang's on the CPU with the smallest Mamba2 state
shapes); every insert donates a state slot from its ``mamba_allocator``, whose
``free`` the clock also counts.
"""

import os
import sys
import warnings
from array import array
from time import perf_counter

import numpy as np

SGLANG_VENV_DEFAULT = os.path.expanduser("~/.cache/flatradix-sglang-oracle")


class FreeClock:
    """Seconds spent inside ``alloc.free`` / ``alloc.free_segment`` (nested calls
    counted once)."""

    NAMES = ("free", "free_segment")
    #: An SWA allocator's frees (the cache calls them directly).
    SWA_NAMES = NAMES + ("free_swa", "free_swa_segment", "free_full", "free_full_segment")

    def __init__(self, alloc, names=NAMES):
        self.seconds = 0.0
        self.calls = 0
        self._depth = 0
        self.add(alloc, names)

    def add(self, alloc, names=("free",)):
        """Also clock ``names`` of ``alloc`` (a Mamba state allocator's ``free``)."""
        for name in names:
            orig = getattr(alloc, name, None)
            if orig is not None:
                setattr(alloc, name, self._wrap(orig))

    def _wrap(self, orig):
        def timed(*args, **kwargs):
            if self._depth:
                return orig(*args, **kwargs)
            self._depth = 1
            t0 = perf_counter()
            try:
                return orig(*args, **kwargs)
            finally:
                self.seconds += perf_counter() - t0
                self.calls += 1
                self._depth = 0
        return timed


class Ctx:
    """One engine instance: ``cache``, ``alloc``, ``rtp`` (request table), ``clock``."""

    def __init__(self, cache, alloc, rtp, clock):
        self.cache, self.alloc, self.rtp, self.clock = cache, alloc, rtp, clock
        self.admissions = []   # SWA engines: (hit, full KV hit, branching) per rolling admission


# ---------------------------------------------------------------------------- flatradix
class FlatradixEngine:
    """flatradix with its own allocator (``alloc="own"``) or SGLang's (``"sglang"``)."""

    def __init__(self, alloc="own"):
        import flatradix

        self.fr = flatradix
        self.alloc_kind = alloc
        self.name = "flatradix" if alloc == "own" else "flatradix+sgl_alloc"
        self.core = "flatradix"

    def build(self, kv_size, page_size=1, max_context_len=8192, rows=8, alloc=None):
        fr = self.fr
        if alloc is not None:
            pass
        elif self.alloc_kind == "own":
            alloc = fr.TokenToKVPoolAllocator(kv_size, page_size=page_size, index_kind="numpy")
        else:
            alloc = sglang_allocator(kv_size, page_size)
        rtp = fr.ReqToTokenPool(rows, max_context_len, index_kind="numpy")
        clock = FreeClock(alloc)
        cache = fr.UnifiedRadixCache(page_size=page_size, token_to_kv_pool_allocator=alloc,
                                     req_to_token_pool=rtp)
        return Ctx(cache, alloc, rtp, clock)

    # keys / params ---------------------------------------------------------
    def key(self, tokens):
        return self.fr.RadixKey(np.asarray(tokens, dtype=np.int64))

    def insert_params(self, key, value, prev_prefix_len=0):
        return self.fr.InsertParams(key=key, value=value, prev_prefix_len=prev_prefix_len)

    def match_params(self, key):
        return self.fr.MatchPrefixParams(key=key)

    def evict_params(self, n):
        return self.fr.EvictParams(num_tokens=n)

    def root(self, ctx):
        return ctx.cache.root_node_handle()

    def tree_tokens(self, ctx):
        return ctx.cache.total_size()[0]

    # timed callables -------------------------------------------------------
    def lock_unlock_fn(self, ctx):
        inc, dec = ctx.cache.inc_lock_ref, ctx.cache.dec_lock_ref

        def lock_unlock(node):
            dec(node, inc(node))
        return lock_unlock

    def match_indices_fn(self, ctx):
        """match + the matched KV indices: flatradix's match already returns them."""
        return ctx.cache.match_prefix

    def match_queue_fn(self, ctx):
        """Score a waiting queue (a list of match params): one batched call."""
        return ctx.cache.match_prefix_batch

    def lock_unlock_batch_fn(self, ctx):
        """Lock then unlock a batch of nodes (a batch admission and its release)."""
        lock_batch, unlock_batch = ctx.cache.lock_batch, ctx.cache.unlock_batch

        def lock_unlock_batch(nodes):
            unlock_batch(lock_batch(nodes))
        return lock_unlock_batch

    def release_fn(self, ctx):
        return ctx.cache.cache_finished_req

    # request preparation (untimed) ----------------------------------------
    def make_request(self, ctx, prompt, output, rolling=False):
        """A finished request holding a row with KV for its committed tokens.
        ``rolling``: admitted first (match + lock + row prefix from the tree)."""
        fr = self.fr
        p = np.asarray(prompt, dtype=np.int64)
        o = np.asarray(output, dtype=np.int64)
        full = np.concatenate([p, o])
        committed = p.shape[0] + o.shape[0] - 1
        row = ctx.rtp.alloc(1)[0]
        req = fr.Req(origin_input_ids=p, output_ids=o, fill_ids=full, req_pool_idx=row,
                     kv_committed_len=committed, kv_allocated_len=committed)
        table = ctx.rtp.req_to_token
        plen = 0
        if rolling:
            m = ctx.cache.match_prefix(fr.MatchPrefixParams(key=fr.RadixKey(p)))
            plen = m.device_prefix_len
            ctx.cache.inc_lock_ref(m.last_device_node)
            req.last_node = m.last_device_node
            idx = m.device_indices
            idx = idx.numpy() if hasattr(idx, "numpy") else idx
            table[row, :plen] = idx
            req.prefix_indices = idx
            req.cache_protected_len = plen
        slots = need_slots(self, ctx, committed - plen)
        table[row, plen:committed] = slots.numpy() if hasattr(slots, "numpy") else slots
        return req


def sglang_allocator(kv_size, page_size=1):
    import torch
    from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator

    if page_size == 1:
        return TokenToKVPoolAllocator(kv_size, torch.float16, "cpu", None, False)
    return PagedTokenToKVPoolAllocator(kv_size, page_size, torch.float16, "cpu", None, False)


# ---------------------------------------------------------------------------- SGLang
def prepare_sglang_env():
    """Environment SGLang's cache needs on a CPU box; call before importing sglang."""
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    os.environ.setdefault("SGLANG_RUST_BUILD_MODE", "never")
    stubs = os.path.join(sys.prefix, "peer_stubs")
    if os.path.isdir(stubs) and stubs not in sys.path:
        sys.path.append(stubs)
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)


def reexec_under(python, script, root, extra_args=()):
    """Run ``script`` again under ``python`` (the SGLang oracle venv's interpreter),
    with ``root`` and the venv's ``peer_stubs`` on ``PYTHONPATH``, SGLang's CPU
    environment set and ``--sglang-python`` dropped from the arguments;
    ``extra_args`` go first. Returns (does nothing) when this process already
    runs in that venv: the venv prefixes are compared, not the interpreters'
    paths (a venv's ``python`` is a symlink to the base interpreter, so
    ``realpath`` would call every venv the same)."""
    venv = os.path.dirname(os.path.dirname(os.path.abspath(python)))
    if os.path.realpath(venv) == os.path.realpath(sys.prefix):
        return
    env = dict(os.environ)
    stubs = os.path.join(venv, "peer_stubs")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, stubs if os.path.isdir(stubs) else None,
                                                    env.get("PYTHONPATH")) if p)
    env.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    env.setdefault("SGLANG_RUST_BUILD_MODE", "never")
    env.setdefault("OMP_NUM_THREADS", "1")
    rest, skip = [], False
    for a in sys.argv[1:]:
        if skip:
            skip = False
        elif a == "--sglang-python":
            skip = True
        elif not a.startswith("--sglang-python="):
            rest.append(a)
    print(f"re-running under {python}", flush=True)
    os.execve(python, [python, os.path.abspath(script), *extra_args] + rest, env)


def sglang_available():
    prepare_sglang_env()
    try:
        import sglang.srt.mem_cache.unified_radix_cache  # noqa: F401
        return True
    except Exception:
        return False


#: The tree-core class each SGLang backend name must build (a missing Rust core
#: falls back to the Python one silently; the check catches it).
TREE_CORES = {"python": ("UnifiedTreeCore",), "rust": ("RustUnifiedTreeCore",),
              "flatradix": ("FlatradixTreeCore", "FlatradixTreeCoreInspector")}


def load_sglang_plugins():
    """Run SGLang's plug-in loader (as its scheduler does at start): registers the
    ``flatradix`` TreeCore when flatradix is installed in SGLang's venv."""
    from sglang.srt.plugins import load_plugins

    load_plugins()


class SGLangEngine:
    """SGLang 0.5.23 ``UnifiedRadixCache`` (Full) with its ``python`` or ``rust`` tree core,
    or (``flatradix``) flatradix's TreeCore plug-in (``flatradix/sglang``: SGLang's
    controller over flatradix's engine; needs flatradix installed in SGLang's venv)."""

    _server_args_set = False

    def __init__(self, backend):
        prepare_sglang_env()
        import torch
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req
        from sglang.srt.mem_cache import base_prefix_cache as bpc
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.common import release_kv_cache
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.mem_cache.radix_cache import RadixKey
        from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

        if not SGLangEngine._server_args_set:  # release_kv_cache reads get_spec()/get_serving()
            set_global_server_args_for_scheduler(ServerArgs(model_path="dummy"))
            SGLangEngine._server_args_set = True
        self.torch = torch
        self.backend = backend
        self.name = f"sglang-{backend}"
        self._Req, self._FINISH_LENGTH, self._SamplingParams = Req, FINISH_LENGTH, SamplingParams
        self._bpc, self._RadixKey = bpc, RadixKey
        self._CacheInitParams, self._URC, self._RTP = CacheInitParams, UnifiedRadixCache, ReqToTokenPool
        self._FULL = ComponentType.FULL
        self._release_kv_cache = release_kv_cache
        self._rid = 0
        self.core = None
        if backend == "flatradix":
            load_sglang_plugins()

    def build(self, kv_size, page_size=1, max_context_len=8192, rows=8, alloc=None):
        alloc = alloc if alloc is not None else sglang_allocator(kv_size, page_size)
        rtp = self._RTP(size=rows, max_context_len=max_context_len, device="cpu",
                        enable_memory_saver=False)
        clock = FreeClock(alloc)
        return Ctx(self._cache(alloc, rtp, page_size, (self._FULL,)), alloc, rtp, clock)

    def _cache(self, alloc, rtp, page_size, components, **kw):
        """SGLang's ``UnifiedRadixCache`` (LRU) on this engine's tree core; raises
        when SGLang built another core (a missing Rust core falls back silently)."""
        cache = self._URC(self._CacheInitParams(
            disable=False, req_to_token_pool=rtp, token_to_kv_pool_allocator=alloc,
            page_size=page_size, eviction_policy="lru", tree_components=components,
            tree_core_backend=self.backend, **kw))
        core = type(cache.tree_core).__name__
        want = TREE_CORES[self.backend]
        if core not in want:
            raise RuntimeError(f"asked for the {self.backend} tree core, got {core}")
        self.core = core
        return cache

    def key(self, tokens):
        if isinstance(tokens, np.ndarray):
            return self._RadixKey(array("q", tokens.tobytes()))
        return self._RadixKey(array("q", tokens))

    def insert_params(self, key, value, prev_prefix_len=0):
        return self._bpc.InsertParams(key=key, value=value, prev_prefix_len=prev_prefix_len)

    def match_params(self, key):
        return self._bpc.MatchPrefixParams(key=key)

    def evict_params(self, n):
        return self._bpc.EvictParams(num_tokens=n)

    def root(self, ctx):
        return ctx.cache.root_node_handle()

    def tree_tokens(self, ctx):
        return ctx.cache.evictable_size() + ctx.cache.protected_size()

    def lock_unlock_fn(self, ctx):
        inc, dec = ctx.cache.inc_lock_ref, ctx.cache.dec_lock_ref

        def lock_unlock(node):
            dec(node, inc(node).to_dec_params())
        return lock_unlock

    def match_queue_fn(self, ctx):
        """Score a waiting queue as SGLang's scheduler does: one match per request."""
        match = ctx.cache.match_prefix

        def match_queue(params):
            return [match(p) for p in params]
        return match_queue

    def lock_unlock_batch_fn(self, ctx):
        """A batch admission's locks and their release: one lock / unlock per node."""
        lock, unlock = ctx.cache.lock, ctx.cache.unlock

        def lock_unlock_batch(nodes):
            for lk in [lock(n) for n in nodes]:
                unlock(lk)
        return lock_unlock_batch

    def match_indices_fn(self, ctx):
        """match + the matched KV indices (0.5.23's match returns none; the
        scheduler reads them off the path: ``prefix_device_indices``)."""
        match, path = ctx.cache.match_prefix, ctx.cache.path_device_indices

        def match_indices(params):
            m = match(params)
            return path(m.last_device_node)[: m.device_prefix_len]
        return match_indices

    def release_fn(self, ctx):
        rel, cache = self._release_kv_cache, ctx.cache

        def release(req):
            rel(req, cache, checkpoint=True)
        return release

    def make_request(self, ctx, prompt, output, rolling=False):
        torch = self.torch
        p = array("q", prompt)
        o = array("q", output)
        committed = len(p) + len(o) - 1
        self._rid += 1
        req = self._Req(rid=f"b{self._rid}", origin_input_text="", origin_input_ids=p,
                        sampling_params=self._SamplingParams(temperature=0,
                                                             max_new_tokens=len(o) + 1))
        req.output_ids = o
        ctx.rtp.alloc([req])
        row = req.kv.req_pool_idx
        plen = 0
        req.last_node = ctx.cache.root_node_handle()
        if rolling:
            m = ctx.cache.match_prefix(self._bpc.MatchPrefixParams(key=self._RadixKey(p)))
            plen = m.device_prefix_len
            req.prefix_len = plen
            req.last_node = m.last_device_node
            req.lock = ctx.cache.lock(m.last_device_node)
            self._admitted(ctx, req, m)
            if plen:
                idx = ctx.cache.path_device_indices(m.last_device_node)[:plen]
                ctx.rtp.write((row, slice(0, plen)), idx.to(torch.int32))
            req.kv.cache_protected_len = plen
        slots = self._need_slots(ctx, committed - plen)
        ctx.rtp.write((row, slice(plen, committed)), slots.to(torch.int32))
        req.kv.kv_committed_len = committed
        req.kv.kv_allocated_len = committed
        req.finished_reason = self._FINISH_LENGTH(length=len(o))
        return req

    # hooks of make_request (the SWA engine overrides them)
    def _admitted(self, ctx, req, m):
        pass

    def _need_slots(self, ctx, n):
        return need_slots(self, ctx, n)


def alloc_slots(eng, ctx, n, evict=None):
    """``n`` KV slots from ``ctx.alloc``; when short, evict ``evict`` tokens (default:
    the shortfall) and try once more. ``None`` when still short."""
    v = ctx.alloc.alloc(n)
    if v is None:
        ctx.cache.evict(eng.evict_params(n - ctx.alloc.available_size() if evict is None else evict))
        v = ctx.alloc.alloc(n)
    return v


def need_slots(eng, ctx, n):
    v = alloc_slots(eng, ctx, n)
    if v is None:
        raise MemoryError(f"cannot allocate {n} KV slots")
    return v


def populate(eng, ctx, keys, seqs):
    """Insert ``seqs`` (engine-native ``keys``) with fresh slots each, evicting
    twice a sequence's length when the pool is short (SGLang's bench does the
    same); a sequence that still does not fit is skipped."""
    for k, s in zip(keys, seqs):
        v = alloc_slots(eng, ctx, len(s), evict=2 * len(s))
        if v is not None:
            ctx.cache.insert(eng.insert_params(k, v))


def make_engines(names):
    out = []
    for n in names:
        if n == "flatradix":
            out.append(FlatradixEngine("own"))
        elif n == "flatradix+sgl_alloc":
            out.append(FlatradixEngine("sglang"))
        elif n.startswith("sglang-"):
            out.append(SGLangEngine(n.split("-", 1)[1]))
        else:
            raise ValueError(f"unknown engine {n!r}")
    return out


# ---------------------------------------------------------------------------- SWA
def sglang_swa_allocator(kv_size, swa_size, page_size=1):
    """SGLang's ``SWATokenToKVPoolAllocator`` over a CPU ``SWAKVPool`` of one tiny
    layer per pool (head 1 x dim 1: the KV buffers cost next to nothing)."""
    import torch
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    kv = SWAKVPool(size=kv_size, size_swa=swa_size, page_size=page_size, dtype=torch.float16,
                   head_num=1, head_dim=1, swa_attention_layer_ids=[0],
                   full_attention_layer_ids=[1], device="cpu")
    return SWATokenToKVPoolAllocator(kv_size, swa_size, page_size, torch.float16, "cpu", kv, False)


def swa_cursor(n, window):
    """Where a finished request of ``n`` tokens left its SWA cursor at page 1: the
    scheduler's last slide (``pre_len = n - 1``) freed its SWA below
    ``n - 1 - window``."""
    return max(0, n - 1 - window)


class _HybridDriving:
    """What the two-component engines ((FULL, SWA) and (FULL, MAMBA)) share:
    ``cache.lock`` / ``unlock``, the tree's (Full, second component) sizes, and
    the insert preparation hooks the benchmark drives (``insert_item``,
    ``inserted``). ``self._params``: the module with ``InsertParams`` /
    ``EvictParams``. ``second``: the second component's name in the benchmark's
    operations and checks (``second_unit``: what it counts); ``second_batch``:
    its ``evict_<second>`` batch (None: the benchmark's Full batch)."""

    second_batch = None

    def tree_tokens(self, ctx):
        return tuple(ctx.cache.total_size())

    def lock_unlock_fn(self, ctx, skip=()):
        """``unlock(lock(node))``; ``skip``: ``skip_lock_components`` of the lock."""
        lock, unlock = ctx.cache.lock, ctx.cache.unlock
        if not skip:
            def lock_unlock(node):
                unlock(lock(node))
            return lock_unlock

        def lock_unlock_skip(node):
            unlock(lock(node, skip_lock_components=skip))
        return lock_unlock_skip

    def inserted(self, ctx, params, result):
        """After ``cache.insert(params)`` (untimed): what the caller does with the result."""


class _SWADriving(_HybridDriving):
    """(FULL, SWA): SGLang's SWA parameters, both pools' sizes."""

    second, second_unit = "swa", "tokens"

    def insert_params(self, key, value, prev_prefix_len=0, cursor=0):
        return self._params.InsertParams(key=key, value=value, prev_prefix_len=prev_prefix_len,
                                         component_evicted_seqlens={self._SWA: cursor})

    def evict_params(self, n, swa_n=0):
        return self._params.EvictParams(num_tokens=n, swa_num_tokens=swa_n)

    def evicted(self, r):
        return r.num_tokens_evicted, r.swa_num_tokens_evicted

    def available(self, ctx):
        return ctx.alloc.full_available_size(), ctx.alloc.swa_available_size()

    def protected(self, ctx):
        return ctx.cache.protected_size(), ctx.cache.swa_protected_size()

    def match_result(self, m):
        return (m.device_prefix_len, m.full_kv_hit_length, m.swa_branching_seqlen)

    def swa_size(self, kv_size):
        return max(1, int(kv_size * self.swa_ratio))

    def insert_item(self, ctx, key, seq, evict=True):
        """The ``InsertParams`` of ``seq`` as a finished request whose window slid:
        fresh slots of both pools (``evict``: evict twice its length from a short
        pool first, else None when short), the SWA slots below its cursor
        (``swa_cursor``) freed first (what the scheduler's slides did)."""
        n = len(seq)
        v = alloc_slots_swa(self, ctx, n, evict=2 * n) if evict else ctx.alloc.alloc(n)
        if v is None:
            return None
        c = swa_cursor(n, self.window)
        if c:
            ctx.alloc.free_swa(v[:c])
        return self.insert_params(key, v, 0, c)


class FlatradixSWAEngine(_SWADriving, FlatradixEngine):
    """flatradix, components ``(FULL, SWA)``, with its own SWA allocator or SGLang's."""

    def __init__(self, alloc="own", window=512, swa_ratio=0.8):
        super().__init__(alloc)
        self.window, self.swa_ratio = window, swa_ratio
        self._SWA, self._params = self.fr.ComponentType.SWA, self.fr

    def build(self, kv_size, page_size=1, max_context_len=8192, rows=8, alloc=None):
        fr = self.fr
        if alloc is None:
            if self.alloc_kind == "own":
                alloc = fr.SWATokenToKVPoolAllocator(kv_size, self.swa_size(kv_size),
                                                     page_size=page_size)
            else:
                alloc = sglang_swa_allocator(kv_size, self.swa_size(kv_size), page_size)
        rtp = fr.ReqToTokenPool(rows, max_context_len, index_kind="numpy")
        clock = FreeClock(alloc, FreeClock.SWA_NAMES)
        cache = fr.UnifiedRadixCache(page_size=page_size, token_to_kv_pool_allocator=alloc,
                                     req_to_token_pool=rtp,
                                     components=(fr.ComponentType.FULL, self._SWA),
                                     sliding_window_size=self.window)
        return Ctx(cache, alloc, rtp, clock)

    def make_request(self, ctx, prompt, output, rolling=False, slide=True):
        """A finished request holding a row with KV for its committed tokens, whose
        window the scheduler slid during decode (``slide``: ``evict_sliding_windows``
        at ``pre_len = committed - 1``). ``rolling``: admitted first (match,
        ``cache.lock``, ``swa_branching_seqlen``, row prefix from the tree; the
        match's lengths are appended to ``ctx.admissions``)."""
        fr = self.fr
        p = np.asarray(prompt, dtype=np.int64)
        o = np.asarray(output, dtype=np.int64)
        full = np.concatenate([p, o])
        committed = p.shape[0] + o.shape[0] - 1
        row = ctx.rtp.alloc(1)[0]
        req = fr.Req(origin_input_ids=p, output_ids=o, fill_ids=full, req_pool_idx=row,
                     kv_committed_len=committed, kv_allocated_len=committed)
        table = ctx.rtp.req_to_token
        plen = 0
        if rolling:
            m = ctx.cache.match_prefix(fr.MatchPrefixParams(key=fr.RadixKey(p)))
            plen = m.device_prefix_len
            ctx.admissions.append(self.match_result(m))
            req.lock = ctx.cache.lock(m.last_device_node)
            req.last_node = m.last_device_node
            req.swa_branching_seqlen = m.swa_branching_seqlen
            idx = m.device_indices
            idx = idx.numpy() if hasattr(idx, "numpy") else idx
            table[row, :plen] = idx
            req.prefix_indices = idx
            req.cache_protected_len = plen
        slots = need_slots_swa(self, ctx, committed - plen)
        table[row, plen:committed] = slots.numpy() if hasattr(slots, "numpy") else slots
        if slide:
            ctx.cache.evict_sliding_windows(req, committed - 1)
        return req


class SGLangSWAEngine(_SWADriving, SGLangEngine):
    """SGLang 0.5.23 ``UnifiedRadixCache`` with ``(FULL, SWA)`` and its SWA allocator."""

    def __init__(self, backend, window=512, swa_ratio=0.8):
        super().__init__(backend)
        from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

        self.window, self.swa_ratio = window, swa_ratio
        self._SWA, self._params = ComponentType.SWA, self._bpc

    def build(self, kv_size, page_size=1, max_context_len=8192, rows=8, alloc=None):
        alloc = alloc if alloc is not None else sglang_swa_allocator(
            kv_size, self.swa_size(kv_size), page_size)
        rtp = self._RTP(size=rows, max_context_len=max_context_len, device="cpu",
                        enable_memory_saver=False)
        clock = FreeClock(alloc, FreeClock.SWA_NAMES)
        cache = self._cache(alloc, rtp, page_size, (self._FULL, self._SWA),
                            sliding_window_size=self.window)
        return Ctx(cache, alloc, rtp, clock)

    def make_request(self, ctx, prompt, output, rolling=False, slide=True):
        """As ``FlatradixSWAEngine.make_request``, with SGLang's ``Req``."""
        req = super().make_request(ctx, prompt, output, rolling=rolling)
        if slide:
            ctx.cache.evict_sliding_windows(req, req.kv.kv_committed_len - 1)
        return req

    def _admitted(self, ctx, req, m):
        ctx.admissions.append(self.match_result(m))
        req.swa_branching_seqlen = m.swa_branching_seqlen

    def _need_slots(self, ctx, n):
        return need_slots_swa(self, ctx, n)


def alloc_slots_swa(eng, ctx, n, evict=None):
    """``n`` slots of both pools from an SWA allocator; when either pool is short,
    evict ``evict`` tokens (default: the shortfall) from each short pool
    (``EvictParams(num_tokens, swa_num_tokens)``) and try once more."""
    v = ctx.alloc.alloc(n)
    if v is None:
        full_short = n - ctx.alloc.full_available_size()
        swa_short = n - ctx.alloc.swa_available_size()
        full_n = (full_short if evict is None else evict) if full_short > 0 else 0
        swa_n = (swa_short if evict is None else evict) if swa_short > 0 else 0
        ctx.cache.evict(eng.evict_params(full_n, swa_n))
        v = ctx.alloc.alloc(n)
    return v


def need_slots_swa(eng, ctx, n):
    v = alloc_slots_swa(eng, ctx, n)
    if v is None:
        raise MemoryError(f"cannot allocate {n} KV slots in both pools")
    return v


def populate_hybrid(eng, ctx, keys, seqs):
    """As ``populate``, for the two-component engines: each sequence prepared by
    ``eng.insert_item`` (SWA: a finished request whose window slid; Mamba: with a
    donated state), inserted, then ``eng.inserted``; a sequence whose slots the
    pools cannot give is skipped."""
    insert = ctx.cache.insert
    for k, s in zip(keys, seqs):
        p = eng.insert_item(ctx, k, s)
        if p is not None:
            eng.inserted(ctx, p, insert(p))


populate_swa = populate_hybrid  # the SWA mode's name (profile_ops.py)


def swa_engines(names, window, swa_ratio):
    return _hybrid_engines(names, FlatradixSWAEngine, SGLangSWAEngine, window, swa_ratio)


# ---------------------------------------------------------------------------- Mamba
def sglang_hybrid_req_pool(rows, max_context_len, states):
    """SGLang's ``HybridReqToTokenPool`` on the CPU (what its ``MambaComponent``
    asserts) with ``states`` Mamba state slots of the smallest Mamba2 shapes (one
    layer, a few bytes a slot); its ``mamba_allocator`` is SGLang's
    ``MambaSlotAllocator`` (slots 1..states, ``free`` a ``torch.cat``)."""
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

    shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=2, n_groups=1,
                                    num_heads=1, head_dim=2, state_size=1, conv_kernel=2)
    return HybridReqToTokenPool(
        size=rows, mamba_size=states, mamba_spec_state_size=rows,
        max_context_len=max_context_len, device="cpu", enable_memory_saver=False,
        cache_params=Mamba2CacheParams(shape=shape, layers=[0]), mamba_layer_ids=[0],
        enable_mamba_extra_buffer=False, speculative_num_draft_tokens=3)


def default_mamba_states(kv_size):
    """State slots when not given: one per 400 KV slots (1,250 at the benchmark's
    500,000-slot pool: fewer than its sequences, so inserts evict states)."""
    return max(16, kv_size // 400)


def alloc_state(eng, ctx):
    """One Mamba state slot from the request pool's ``mamba_allocator``; when none
    is free, evict one state first (``EvictParams(num_tokens=0, mamba_num=1)``,
    a scheduler's per-request shortfall). None when still short."""
    malloc = ctx.rtp.mamba_allocator
    st = malloc.alloc(1)
    if st is None:
        ctx.cache.evict(eng.evict_params(0, 1))
        st = malloc.alloc(1)
    return st


class _MambaDriving(_HybridDriving):
    """(FULL, MAMBA) at page 1, no extra buffer: each inserted sequence donates a
    state slot (``InsertParams.mamba_value``, one slot from the request pool's
    ``mamba_allocator``), which the caller frees when ``InsertResult.mamba_exist``
    (the node already had one); ``EvictParams(num_tokens, mamba_num)``."""

    second, second_unit = "mamba", "states"

    def __init__(self, chunk=64, states=None, evict_batch=8):
        self.chunk, self.states, self.second_batch = chunk, states, evict_batch

    def mamba_size(self, kv_size):
        return self.states or default_mamba_states(kv_size)

    def insert_params(self, key, value, prev_prefix_len=0, state=None):
        return self._params.InsertParams(key=key, value=value, prev_prefix_len=prev_prefix_len,
                                         mamba_value=state)

    def evict_params(self, n, mamba_n=0):
        return self._params.EvictParams(num_tokens=n, mamba_num=mamba_n)

    def evicted(self, r):
        return r.num_tokens_evicted, r.mamba_num_evicted

    def available(self, ctx):
        return ctx.alloc.available_size(), ctx.rtp.mamba_allocator.available_size()

    def protected(self, ctx):
        return ctx.cache.protected_size(), ctx.cache.mamba_protected_size()

    def match_result(self, m):
        return (m.device_prefix_len, m.full_kv_hit_length, m.mamba_branching_seqlen)

    def lock_decode_fn(self, ctx):
        """A decoding request's hold: ``lock(node, skip_lock_components=(MAMBA,))``
        (its own state slot carries the recurrence; the tree's stays evictable)."""
        return self.lock_unlock_fn(ctx, skip=(self._MAMBA,))

    def insert_item(self, ctx, key, seq, evict=True):
        """The ``InsertParams`` of ``seq`` as a finished request: fresh KV slots
        (``evict``: evict twice its length when short, else None when short) and
        its sequence-end state (``alloc_state``)."""
        n = len(seq)
        v = alloc_slots(self, ctx, n, evict=2 * n) if evict else ctx.alloc.alloc(n)
        if v is None:
            return None
        st = alloc_state(self, ctx)
        if st is None:
            ctx.alloc.free(v)
            return None
        return self.insert_params(key, v, 0, st)

    def inserted(self, ctx, params, result):
        if result.mamba_exist:  # the node kept its own state: the donated one is the caller's
            ctx.rtp.mamba_allocator.free(params.mamba_value)


class FlatradixMambaEngine(_MambaDriving, FlatradixEngine):
    """flatradix, components ``(FULL, MAMBA)``, with its own KV allocator and
    ``HybridReqToTokenPool`` or SGLang's."""

    def __init__(self, alloc="own", chunk=64, states=None, evict_batch=8):
        FlatradixEngine.__init__(self, alloc)
        _MambaDriving.__init__(self, chunk, states, evict_batch)
        self._MAMBA, self._params = self.fr.ComponentType.MAMBA, self.fr

    def build(self, kv_size, page_size=1, max_context_len=8192, rows=8, alloc=None):
        fr = self.fr
        states = self.mamba_size(kv_size)
        own = self.alloc_kind == "own"
        if alloc is None:
            alloc = (fr.TokenToKVPoolAllocator(kv_size, page_size=page_size, index_kind="numpy")
                     if own else sglang_allocator(kv_size, page_size))
        if own:
            rtp = fr.HybridReqToTokenPool(rows, max_context_len, mamba_size=states)
        else:
            rtp = sglang_hybrid_req_pool(rows, max_context_len, states)
        clock = FreeClock(alloc)
        clock.add(rtp.mamba_allocator)
        cache = fr.UnifiedRadixCache(page_size=page_size, token_to_kv_pool_allocator=alloc,
                                     req_to_token_pool=rtp,
                                     tree_components=(fr.ComponentType.FULL, self._MAMBA),
                                     mamba_cache_chunk_size=self.chunk,
                                     enable_mamba_extra_buffer=False)
        return Ctx(cache, alloc, rtp, clock)


class SGLangMambaEngine(_MambaDriving, SGLangEngine):
    """SGLang 0.5.23 ``UnifiedRadixCache`` with ``(FULL, MAMBA)`` over its
    ``HybridReqToTokenPool``. Its ``MambaComponent`` reads the chunk size from the
    global server args (``_mamba_cache_chunk_size``, preset as SGLang's own test
    fixtures do: a dummy model has no HF config) and the per-path state cap from
    ``get_exec().mamba`` (must stay -1, off: flatradix has none)."""

    def __init__(self, backend, chunk=64, states=None, evict_batch=8):
        SGLangEngine.__init__(self, backend)
        _MambaDriving.__init__(self, chunk, states, evict_batch)
        from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

        self._MAMBA, self._params = ComponentType.MAMBA, self._bpc

    def build(self, kv_size, page_size=1, max_context_len=8192, rows=8, alloc=None):
        from sglang.srt.runtime_context import get_exec, get_server_args

        get_server_args()._mamba_cache_chunk_size = self.chunk
        cap = get_exec().mamba.mamba_max_states_per_path
        if cap != -1:
            raise RuntimeError(f"SGLang's mamba_max_states_per_path is {cap}, not -1 (off)")
        alloc = alloc if alloc is not None else sglang_allocator(kv_size, page_size)
        rtp = sglang_hybrid_req_pool(rows, max_context_len, self.mamba_size(kv_size))
        clock = FreeClock(alloc)
        clock.add(rtp.mamba_allocator)
        cache = self._cache(alloc, rtp, page_size, (self._FULL, self._MAMBA),
                            enable_mamba_extra_buffer=False)
        return Ctx(cache, alloc, rtp, clock)


def _hybrid_engines(names, flat_cls, sgl_cls, *args):
    out = []
    for n in names:
        if n == "flatradix":
            out.append(flat_cls("own", *args))
        elif n == "flatradix+sgl_alloc":
            out.append(flat_cls("sglang", *args))
        elif n.startswith("sglang-"):
            out.append(sgl_cls(n.split("-", 1)[1], *args))
        else:
            raise ValueError(f"unknown engine {n!r}")
    return out


def mamba_engines(names, chunk, states=None, evict_batch=8):
    return _hybrid_engines(names, FlatradixMambaEngine, SGLangMambaEngine, chunk, states,
                           evict_batch)
