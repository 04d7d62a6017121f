"""Lock-step driver: one flatradix cache and one reference cache, compared op by op.

Node identity is compared only by behaviour: every (flatradix id, reference id)
pair the two caches return must form a consistent bijection (a split keeps the
lower node's id, so a later match that ends on it must return the *same* id on
both sides), and paths / lock effects of paired handles must agree.
"""

import random

import numpy as np

from flatradix import (
    EvictParams, InsertParams, LockRefError, MatchPrefixParams, NodeAccessError,
    RadixKey, UnifiedRadixCache,
)

from .reference import ReferenceRadixCache

# (policy, config) pairs exercised by the parity tests. tlru/slru configs with
# entries given in *pages* are scaled by the page size (see ``policy_config``).
POLICY_CASES = [
    ("lru", None),
    ("lfu", None),
    ("fifo", None),
    ("mru", None),
    ("filo", None),
    ("priority", None),
    ("slru", None),
    ("slru", {"protected_threshold": 3}),
    ("tlru", None),
    ("tlru", {"threshold_pages": 3, "next_prompt_estimate_pages": 1}),
]


def policy_config(cfg, page_size):
    if cfg is None:
        return None
    out = {}
    for k, v in cfg.items():
        if k.endswith("_pages"):
            out[k[: -len("_pages")]] = v * page_size
        else:
            out[k] = v
    return out


def policy_id(case):
    name, cfg = case
    if not cfg:
        return name
    return name + "-" + "-".join(f"{k}{v}" for k, v in sorted(cfg.items()))


class RecordingAllocator:
    """Minimal allocator: records every ``free`` call (numpy index kind)."""

    index_kind = "numpy"

    def __init__(self):
        self.freed = []

    def free(self, idx):
        self.freed.append(np.asarray(idx, dtype=np.int64).copy())

    def drain(self):
        out = np.concatenate(self.freed) if self.freed else np.empty(0, np.int64)
        self.freed = []
        return out


def _arr(x):
    return np.asarray(x, dtype=np.int64).reshape(-1)


def _same_array(a, b, what):
    a, b = _arr(a).tolist(), _arr(b).tolist()
    assert a == b, f"{what}: flatradix {a} != reference {b}"


def _outcome(fn, *args, **kw):
    """(result, exception class or None)."""
    try:
        return fn(*args, **kw), None
    except (NodeAccessError, LockRefError) as e:
        return None, type(e)


class Pair:
    def __init__(self, page_size=1, policy="lru", config=None, is_eagle=False, allocator=False,
                 small=False):
        """``small``: start flatradix with tiny arrays, so that node-table / child-table
        growth and pool compaction happen throughout the stream."""
        cfg = policy_config(config, page_size)
        cap = dict(node_capacity=4, pool_capacity=64) if small else {}
        self.allocator = allocator
        self.fa = RecordingAllocator() if allocator else None
        self.ra = RecordingAllocator() if allocator else None
        self.f = UnifiedRadixCache(page_size=page_size, eviction_policy=policy,
                                   eviction_policy_config=cfg, is_eagle=is_eagle,
                                   token_to_kv_pool_allocator=self.fa, **cap)
        self.r = ReferenceRadixCache(page_size=page_size, eviction_policy=policy,
                                     eviction_policy_config=cfg, is_eagle=is_eagle,
                                     token_to_kv_pool_allocator=self.ra)
        self.page_size = page_size
        self.is_eagle = is_eagle
        self.f2r, self.r2f = {}, {}
        self.alive = set()  # paired handles not yet seen dead on both sides
        self.nchecks = 0
        self.sample_rng = random.Random(0)
        self.root = self.bind(self.f.root_node_handle(), self.r.root_node_handle())
        self.log = []  # op log for failure messages

    # ---------------------------------------------------------------- identity
    def bind(self, fid, rid):
        fid, rid = int(fid), int(rid)
        assert self.f2r.get(fid, rid) == rid, \
            f"flatradix node {fid} was paired with reference node {self.f2r[fid]}, now with {rid}"
        assert self.r2f.get(rid, fid) == fid, \
            f"reference node {rid} was paired with flatradix node {self.r2f[rid]}, now with {fid}"
        if fid not in self.f2r:
            self.alive.add((fid, rid))
        self.f2r[fid] = rid
        self.r2f[rid] = fid
        return fid, rid

    def compare_info(self, node):
        """node_info of a paired node: every field equal (ids via the bijection).
        The root's priority is not compared (SGLang: -sys.maxsize, flatradix:
        INT64_MIN; it never orders anything)."""
        fid, rid = node
        fi = self.f.node_info(fid)
        ri = self.r.node_info(rid)
        if ri["parent"] is not None:
            assert fi["parent"] is not None, f"node_info({fid}): no parent"
            self.bind(fi["parent"], ri["parent"])
        else:
            assert fi["parent"] is None, f"node_info({fid}): root has a parent"
            fi.pop("priority"), ri.pop("priority")
        for k in ri:
            if k in ("node_id", "parent"):
                continue
            fv, rv = fi[k], ri[k]
            if isinstance(rv, np.ndarray):
                _same_array(fv, rv, f"node_info[{k!r}] of {node}")
            else:
                assert fv == rv, f"node_info[{k!r}] of {node}: flatradix {fv} != reference {rv}"

    # ---------------------------------------------------------------- ops
    def match(self, key):
        self.log.append(("match", key))
        fm = self.f.match_prefix(MatchPrefixParams(key=key))
        rm = self.r.match_prefix(key)
        assert fm.device_prefix_len == rm.device_prefix_len, "match device_prefix_len"
        assert fm.full_kv_hit_length == rm.full_kv_hit_length, "match full_kv_hit_length"
        _same_array(fm.device_indices, rm.device_indices, "match device_indices")
        assert len(_arr(fm.device_indices)) == fm.device_prefix_len
        assert fm.last_device_node == fm.best_match_node == fm.last_host_node
        node = self.bind(fm.best_match_node, rm.best_match_node)
        if rm.last_visited_node_id is None:
            assert fm.last_visited_node_id is None, "last_visited_node_id should be None"
        else:
            assert fm.last_visited_node_id is not None, "last_visited_node_id is None"
            self.bind(fm.last_visited_node_id, rm.last_visited_node_id)
        return node, fm.device_prefix_len

    def insert(self, key, value, prev_prefix_len=0, priority=0, inserted_len=0):
        self.log.append(("insert", key, None if value is None else list(_arr(value)),
                         prev_prefix_len, priority, inserted_len))
        kw = dict(prev_prefix_len=prev_prefix_len, priority=priority, inserted_len=inserted_len)
        fr = self.f.insert(InsertParams(key=key, value=value, **kw))
        rr = self.r.insert(InsertParams(key=key, value=value, **kw))
        assert fr.prefix_len == rr.prefix_len, f"insert prefix_len {fr.prefix_len} != {rr.prefix_len}"
        assert fr.mamba_exist == rr.mamba_exist
        if self.allocator:
            assert fr.duplicate_indices is None and rr.duplicate_indices is None
            _same_array(self.fa.drain(), self.ra.drain(), "insert freed duplicates")
        else:
            _same_array(fr.duplicate_indices, rr.duplicate_indices, "insert duplicate_indices")
        node = self.bind(fr.last_device_node, rr.last_device_node)
        return node, fr.prefix_len

    def evict(self, num, as_params=True):
        self.log.append(("evict", num))
        fr = self.f.evict(EvictParams(num_tokens=num) if as_params else num)
        rr = self.r.evict(num)
        assert fr.num_tokens_evicted == rr.num_tokens_evicted, \
            f"evicted {fr.num_tokens_evicted} != {rr.num_tokens_evicted}"
        if self.allocator:
            assert fr.evicted_indices is None
            _same_array(self.fa.drain(), self.ra.drain(), "evict freed indices")
        else:
            _same_array(fr.evicted_indices, rr.evicted_indices, "evicted_indices")
        return fr.num_tokens_evicted

    def inc(self, node):
        self.log.append(("inc", node))
        fid, rid = node
        fr, fe = _outcome(self.f.inc_lock_ref, fid)
        rr, re_ = _outcome(self.r.inc_lock_ref, rid)
        assert fe == re_, f"inc_lock_ref: flatradix raised {fe}, reference raised {re_}"
        if fe is None:
            assert fr.delta == rr.delta, f"inc_lock_ref delta {fr.delta} != {rr.delta}"
        return fe is None

    def dec(self, node):
        self.log.append(("dec", node))
        fid, rid = node
        _, fe = _outcome(self.f.dec_lock_ref, fid)
        _, re_ = _outcome(self.r.dec_lock_ref, rid)
        assert fe == re_, f"dec_lock_ref: flatradix raised {fe}, reference raised {re_}"
        return fe is None

    def path(self, node):
        self.log.append(("path", node))
        fid, rid = node
        fp, fe = _outcome(self.f.path_device_indices, fid)
        rp, re_ = _outcome(self.r.path_device_indices, rid)
        assert fe == re_, f"path_device_indices: flatradix raised {fe}, reference raised {re_}"
        if fe is None:
            _same_array(fp, rp, "path_device_indices")

    def reset(self):
        self.log.append(("reset",))
        self.f.reset()
        self.r.reset()
        self.root = self.bind(self.f.root_node_handle(), self.r.root_node_handle())

    # ---------------------------------------------------------------- state
    def check(self, full=None):
        """Compare the two caches. ``node_info`` is compared for every paired
        handle on a full check (every 8th call by default, and whenever asked),
        else for a random sample of 4."""
        f, r = self.f, self.r
        self.nchecks += 1
        if full is None:
            full = self.nchecks % 8 == 0
        f.sanity_check()
        fs = (f.evictable_size(), f.protected_size(), f.total_size(), f.node_count())
        rs = r.ledger()
        if full:
            r.check()
            assert rs == (r.evictable_size(), r.protected_size(), r.total_size(), r.node_count())
        assert fs == rs, f"(evictable, protected, total, nodes): flatradix {fs} != reference {rs}"
        assert fs[0] + fs[1] == fs[2][0]
        assert f.is_root(f.root_node_handle())
        # every paired handle: both live with equal node_info, or both stale
        nodes = sorted(self.alive)
        if not full and len(nodes) > 4:
            nodes = self.sample_rng.sample(nodes, 4)
        for node in nodes:
            if node[1] in r._live:
                self.compare_info(node)
            else:
                try:
                    f.node_info(node[0])
                except NodeAccessError:
                    self.alive.discard(node)
                else:
                    raise AssertionError(f"flatradix node {node[0]} is live, its reference "
                                         f"twin {node[1]} is gone")

    def history(self, last=30):
        return "\n".join(repr(x) for x in self.log[-last:])


class Workload:
    """Keys with shared prefixes: a few "system prompts" + random suffixes over a
    small vocabulary (so keys diverge mid-page and nodes split), re-use and
    extension of earlier keys, several namespaces."""

    NAMESPACES = [(None, None), ("", None), ("lora-a", None), (None, "salt"),
                  ("lora-a", "salt"), ("", "")]

    def __init__(self, rng, page_size, is_eagle, namespaces, n_prompts=4, vocab=4):
        self.rng = rng
        self.page_size = page_size
        self.is_eagle = is_eagle
        self.vocab = vocab
        self.namespaces = self.NAMESPACES if namespaces else [(None, None)]
        self.prompts = []
        for i in range(n_prompts):
            n = rng.randint(2, 6) * page_size + rng.randint(0, page_size)
            self.prompts.append([rng.randint(0, vocab - 1) for _ in range(n)])
        if is_eagle:  # exercise the bigram packing with tokens near 2**31
            self.prompts.append([(1 << 31) - 1 - rng.randint(0, 2) for _ in range(3 * page_size)])
        self.recent = []
        self.counter = 1

    def tokens(self):
        rng = self.rng
        if self.recent and rng.random() < 0.4:
            toks, ns = rng.choice(self.recent)
            toks = list(toks)
            r = rng.random()
            if r < 0.3:
                toks = toks[: rng.randint(0, len(toks))]
            elif r < 0.6:
                toks = toks + [rng.randint(0, self.vocab - 1) for _ in range(rng.randint(1, 2 * self.page_size + 1))]
            if rng.random() < 0.15:
                ns = rng.choice(self.namespaces)
            return toks, ns
        prompt = rng.choice(self.prompts)
        r = rng.random()
        if r < 0.4:
            cut = len(prompt)
        elif r < 0.7:  # near a page boundary
            cut = min(len(prompt), rng.randint(1, 4) * self.page_size + rng.randint(-1, 1))
        else:
            cut = rng.randint(0, len(prompt))
        suffix = [rng.randint(0, self.vocab - 1) for _ in range(rng.randint(0, 2 * self.page_size + 2))]
        return prompt[:cut] + suffix, rng.choice(self.namespaces)

    def key(self):
        toks, ns = self.tokens()
        self.recent.append((toks, ns))
        if len(self.recent) > 40:
            self.recent.pop(0)
        ids = toks if self.rng.random() < 0.5 else np.asarray(toks, dtype=np.int64)
        bigram = self.is_eagle and self.rng.random() < 0.5
        return RadixKey(ids, extra_key=ns[0], cache_salt=ns[1], is_bigram=bigram)

    def value(self, key):
        """Fresh unique KV indices for ``key`` (one per logical unit; for EAGLE
        keys sometimes one per raw token). Rarely None (token ids as values)."""
        rng = self.rng
        if rng.random() < 0.03:
            return None
        n = len(key)
        if self.is_eagle and len(key.token_ids) > 0 and rng.random() < 0.5:
            n = len(key.token_ids)
        v = np.arange(self.counter, self.counter + n, dtype=np.int64)
        self.counter += n
        return v if rng.random() < 0.7 else v.tolist()


def run_stream(pair, rng, steps, namespaces=True, max_total=None, **workload):
    """Random operation stream applied to ``pair``; checks after every op. When the
    tree holds more than ``max_total`` units, half of that is evicted."""
    if max_total is None:
        max_total = max(800, 60 * pair.page_size)
    wl = Workload(rng, pair.page_size, pair.is_eagle, namespaces, **workload)
    held = []      # (fid, rid) of locks we took
    known = []     # recent handles (possibly stale later)

    def remember(node):
        known.append(node)
        if len(known) > 60:
            known.pop(0)

    pair.check()
    for _ in range(steps):
        x = rng.random()
        if x < 0.33:
            key = wl.key()
            n = len(key)
            r = rng.random()
            if r < 0.5:
                prev = 0
            elif r < 0.8:  # request-like: the prefix this request matched first
                node, prev = pair.match(key)
                pair.check()
            else:
                prev = rng.randint(0, n + 1)
            inserted_len = 0 if rng.random() < 0.7 else rng.randint(0, n + 1)
            node, _ = pair.insert(key, wl.value(key), prev, rng.randint(-3, 3), inserted_len)
            remember(node)
        elif x < 0.58:
            node, _ = pair.match(wl.key())
            remember(node)
            if rng.random() < 0.5 and pair.inc(node):
                held.append(node)
        elif x < 0.68:
            if held:
                node = held.pop(rng.randrange(len(held)))
                pair.dec(node)
        elif x < 0.78:
            total = pair.f.total_size()[0]
            r = rng.random()
            if r < 0.05:
                num = total + 3
            elif r < 0.5:
                num = rng.choice([0, 1, pair.page_size, 2 * pair.page_size])
            else:
                num = rng.randint(0, total // 4 + 1)
            pair.evict(num, as_params=rng.random() < 0.5)
        elif x < 0.86:
            if known:
                pair.path(rng.choice(known))
        elif x < 0.91:
            if known:
                node = rng.choice(known)
                if pair.inc(node):
                    held.append(node)
        elif x < 0.94:
            # a release that must fail on both sides (stale handle, or lock_ref 0 on
            # the path). Releases that would succeed on a node we did not lock are
            # caller bugs that corrupt the lock nesting; not generated here (see
            # test_release_of_unlocked_ancestor_keeps_invariants).
            if known:
                node = rng.choice(known)
                if not pair.r.dec_would_succeed(node[1]):
                    pair.dec(node)
        elif x < 0.95:
            pair.inc(pair.root)
            pair.dec(pair.root)
        elif x < 0.952:
            pair.reset()
            held.clear()
        else:
            key = wl.key()
            node, _ = pair.insert(key, wl.value(key))
            remember(node)
        pair.check()
        if pair.f.total_size()[0] > max_total:
            pair.evict(max_total // 2)
            pair.check()
        if len(held) > 12:
            pair.dec(held.pop(0))
            pair.check()
    # unlock everything we hold (tolerating counts stolen by rogue decs), then drain
    for node in held:
        pair.dec(node)
        pair.check()
    pair.check(full=True)
    pair.evict(pair.f.total_size()[0] + 1)
    pair.check(full=True)
