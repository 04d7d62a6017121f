"""Bad input gets a clear error naming the argument (or a documented no-op), and
the state is exactly as before: the cache's full ``_snapshot()``, the
allocator's free stack and marks, the request pool's rows and free list, and
every field of the request involved are compared before and after each case.
After a refused request call the same request is finished correctly, and KV
conservation (available + evictable + protected == pool) is checked.

| input | entry point | outcome |
|---|---|---|
| page_size 0 / -4 / 1.0 / None / 2**21 / 2**63; components None / "FULL" / (7,) / (FULL, MAMBA, SWA) / (FULL, MAMBA) without a Mamba pool / (SWA,) / (SWA, FULL); unknown or non-str policy; policy config not a dict, unknown key, 2**63, float; allocator without free(); pool without req_to_token; device 5; flags "no" / None / 2; node_capacity / pool_capacity -1, 1.5, 2**63, 2**41 | constructor | TypeError / ValueError naming the argument |
| params None / dict / str / int, key None; token_ids None / str / dict / scalar / 0-d / 2-D / float / NaN / bool / torch float or bool / array('d') / 2**63 / uint64 >= 2**63 / < -2**63; extra_key / cache_salt not str; bigram key in a non-EAGLE cache; EAGLE token outside [0, 2**31) | match_prefix, insert | TypeError / ValueError naming params.key[...] |
| value str / dict / 0-d / 2-D / float / NaN / bool / torch float / 2**63 / negative / >= pool / too long / too short; value None with tokens outside the pool | insert | TypeError / ValueError naming params.value |
| prev_prefix_len / inserted_len negative, float, None; priority float / str / +-2**63; mamba_value given | insert | TypeError / ValueError naming the field |
| empty key, key shorter than a page | match_prefix, insert | documented no-op: empty result / prefix_len 0 at the root, snapshot unchanged, slots stay the caller's |
| namespace never inserted | match_prefix | documented no-op (empty result, nothing touched) |
| prev_prefix_len / inserted_len = 2**63 | insert | accepted: same result and state as len(key) |
| count -1 / 1.5 / "3" / None / dict / bool; EvictParams num_tokens -5 / None, swa_num_tokens -1, mamba_num "x" | evict | TypeError / ValueError naming the count |
| count 0 | evict | documented no-op |
| more than evictable: 10**9, 2**63, 2**64 | evict, evict_for_alloc, evict_device_start | documented clamp: every unlocked leaf goes, locked paths stay, result == evictable before |
| component 7 / None / "FULL" / SWA; num_tokens -1 / 1.5 / None; second start; next without start | evict_device_start / next_node / end | ValueError / TypeError / RuntimeError; end without start is a documented no-op (0) |
| num_tokens -1 / None / 1.5; no allocator; fewer than available | evict_for_alloc | error naming num_tokens; 0 and no change |
| stale id (evicted, before reset), never issued ((7<<32)|1, 12345678901, -1, 2**63, 2**64, -2**63-1, uint64 2**63) | inc_lock_ref, dec_lock_ref, path_device_indices, node_info | NodeAccessError ("does not name a live node") |
| id "3" / 1.0 / None / True / [1] / receipt object | inc_lock_ref, dec_lock_ref, path_device_indices, node_info, is_root | TypeError naming node |
| skip_lock_components None / 5 / "x" / ("x",) / (FULL,) | inc_lock_ref | TypeError / ValueError, nothing locked |
| receipt "abc" / {} / 5; skip_swa "yes" / None / 2; receipt of another node; unlock without lock; double unlock; unlock of an ancestor whose lock_ref is held by a descendant | dec_lock_ref | TypeError naming receipt / LockRefError |
| lock / unlock the root | inc_lock_ref, dec_lock_ref | documented no-op |
| component 7 / None / "x"; file "x" / 5; block_hashes with events off | component_*_size, pretty_print, block_hashes | ValueError / TypeError naming it |
| req None / str / dict / int; req_pool_idx -1 / 99 / unallocated / "x" / 1.0 / None; last_node stale / never issued / 2**63 / "x" / unlocked; kv_committed_len -1 / 2**63 / > row / > tokens; kv_allocated_len < committed / > row / "x"; cache_protected_len -1 / > tokens / "x"; cache_inserted_len -1 / "x"; priority "high" / 2**63; extra_key 5; cache_salt b"x"; origin_input_ids None / str; output_ids None; fill_ids str / floats / None; prefix_indices "x"; row holding a free slot, slot 0, a slot > pool or a slot twice; is_insert / checkpoint not bool; up_to -1 / None / 1.5 / > tokens; a second release; a cache without pools | cache_finished_req, cache_unfinished_req, release_kv_cache, checkpoint | TypeError / ValueError / NodeAccessError / LockRefError naming the field; nothing changed (tree, allocator, row pool, request) |
| size -1 / None / 1.5 / 2**41 / 2**63, page_size 0, index_kind "x", device "cuda"; need_size -1 / None / 1.5 / "3"; free_index None / int / str / float / 2-D / 2**63 / -1 / 0 / > size / already free / repeated; is_free outside [0, size] | TokenToKVPoolAllocator | TypeError / ValueError naming the argument, free slots unchanged; alloc(2**63) is a documented None |
| size / max_context_len -1, None, 2**41, product > 2**40; device / index_kind; need_size -1; free_index None / str / float / bool / 2**63 / unallocated / repeated; write float / str values, out-of-range rows | ReqToTokenPool | TypeError / ValueError / IndexError naming the argument, rows unchanged |
| origin_input_ids None / str / int / floats / bools / float array; output_ids None; fill_ids str; prefix_indices str; req_pool_idx str / -1; last_node str / 2**63; extra_key int; cache_salt bytes; priority str / 2**63; cache_inserted_len -1 / None; kv_committed_len -1; cache_protected_len float | Req(...) | TypeError / ValueError naming the field |
| non-contiguous (arr[::2], torch t[::2]) and read-only arrays as keys, values, slots, request tokens, row values | match_prefix, insert, alloc.free, is_free, cache_finished_req, ReqToTokenPool.write | accepted: same result and same state as a contiguous writable copy |
"""

import copy
import io
from array import array

import numpy as np
import pytest
import torch

from flatradix import (
    ComponentType, EvictParams, IncLockRefResult, InsertParams, LockRefError, MatchPrefixParams,
    NodeAccessError, RadixKey, Req, ReqToTokenPool, TokenToKVPoolAllocator, UnifiedRadixCache,
)

from .conftest import assert_state_equal

POOL = 64
H = 2 ** 63
FULL, SWA = ComponentType.FULL, ComponentType.SWA


# ----------------------------------------------------------------------------- fixtures
class Env:
    """A cache (page 2) with an allocator of 64 slots and a 4-row request pool.

    Tree: [1,2] -> {[3..8], [9,9]} (12 units) and, with ``with_req``, one admitted
    request for [1,2,3,4,50,51,52] (prefix 4 matched -> [3..8] split at [3,4]; the
    path [1,2],[3,4] is locked by it; its row holds 4 tree slots + 3 own slots).
    """

    def __init__(self, with_req=True, page_size=2):
        self.alloc = TokenToKVPoolAllocator(POOL)
        self.rtp = ReqToTokenPool(4, 32)
        self.cache = UnifiedRadixCache(page_size=page_size, token_to_kv_pool_allocator=self.alloc,
                                       req_to_token_pool=self.rtp)
        c = self.cache
        c.insert(InsertParams(key=RadixKey([1, 2, 3, 4, 5, 6, 7, 8]), value=self.alloc.alloc(8)))
        c.insert(InsertParams(key=RadixKey([1, 2, 9, 9]), value=self.alloc.alloc(4)))
        self.reqs = []
        self.req = self.admit([1, 2, 3, 4, 50, 51, 52]) if with_req else None

    @classmethod
    def bare(cls, cache):
        """An Env around a cache without pools (state: the cache; pools are dummies)."""
        e = cls.__new__(cls)
        e.cache, e.alloc, e.rtp, e.reqs, e.req = cache, TokenToKVPoolAllocator(1), ReqToTokenPool(1, 1), [], None
        return e

    def admit(self, toks, **ns):
        c = self.cache
        m = c.match_prefix(MatchPrefixParams(key=RadixKey(toks, **ns)))
        c.inc_lock_ref(m.last_device_node)
        plen = m.device_prefix_len
        row = self.rtp.alloc(1)[0]
        self.rtp.write((row, slice(0, plen)), m.device_indices)
        self.rtp.write((row, slice(plen, len(toks))), self.alloc.alloc(len(toks) - plen))
        req = Req(origin_input_ids=list(toks), req_pool_idx=row, prefix_indices=m.device_indices,
                  last_node=m.last_device_node, kv_committed_len=len(toks), **ns)
        self.reqs.append(req)
        return req

    def node(self, toks):
        """Id of the node a match of ``toks`` ends on (matching refreshes recency only)."""
        return self.cache.match_prefix(MatchPrefixParams(key=RadixKey(toks))).last_device_node

    def owned(self):
        n = 0
        for r in self.reqs:
            if r.req_pool_idx is not None:
                p = r.cache_protected_len if r.cache_protected_len is not None else len(r.prefix_indices)
                n += r.kv_committed_len - p
        return n

    def conserve(self):
        c = self.cache
        assert (self.alloc.available_size() + c.evictable_size() + c.protected_size()
                + self.owned()) == POOL
        c.sanity_check()

    def state(self):
        a, r = self.alloc, self.rtp
        s = {"cache": self.cache._snapshot(),
             "alloc": (a._top, a._stack[:a._top].copy(), a._mark.copy()),
             "rtp": (list(r._free_rows), r._is_free.copy(), r._rows.copy())}
        for i, req in enumerate(self.reqs):
            # (_np_cache: Req's memo of its token lists as arrays, not request state)
            s[f"req{i}"] = {k: (v.copy() if isinstance(v, np.ndarray) else copy.deepcopy(v))
                            for k, v in vars(req).items() if k != "_np_cache"}
        return s


def assert_same(a, b, path="state"):
    if isinstance(a, dict) and "nodes" in a:
        assert_state_equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (tuple, list)) and not isinstance(a, str):
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, (np.ndarray, torch.Tensor)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=path)
    else:
        assert a == b, path


def unchanged(env, fn, exc, match=None):
    """``fn()`` raises ``exc`` (message matching ``match``) and nothing changed."""
    before = env.state()
    with pytest.raises(exc, match=match):
        fn()
    assert_same(before, env.state())
    env.cache.sanity_check()


def noop(env, fn):
    """``fn()`` succeeds and changes nothing; returns its result."""
    before = env.state()
    out = fn()
    assert_same(before, env.state())
    env.cache.sanity_check()
    return out


@pytest.fixture
def env():
    return Env()


@pytest.fixture
def tree():
    return Env(with_req=False)


def ip(key, value=None, **kw):
    return InsertParams(key=key, value=value, **kw)


def case(fn, exc, match, id):
    return pytest.param(fn, exc, match, id=id)


# ----------------------------------------------------------------------------- constructor
CTOR = [
    (dict(page_size=0), ValueError, "page_size"), (dict(page_size=-4), ValueError, "page_size"),
    (dict(page_size=1.0), TypeError, "page_size"), (dict(page_size=None), TypeError, "page_size"),
    (dict(page_size=2 ** 21), ValueError, "page_size"), (dict(page_size=H), ValueError, "page_size"),
    (dict(components=None), TypeError, "components"), (dict(components="FULL"), TypeError, "components"),
    (dict(components=(7,)), ValueError, "components"), (dict(components=(0, 2, 1)), ValueError, "components"),
    (dict(components=(0, 2)), TypeError, "mamba_allocator"),
    (dict(components=(1,)), ValueError, "components"), (dict(components=(1, 0)), ValueError, "components"),
    (dict(eviction_policy="random"), ValueError, "eviction_policy"),
    (dict(eviction_policy=None), ValueError, "eviction_policy"),
    (dict(eviction_policy=5), ValueError, "eviction_policy"),
    (dict(eviction_policy="slru", eviction_policy_config={"bogus": 1}), TypeError, "eviction_policy_config"),
    (dict(eviction_policy_config=5), TypeError, "eviction_policy_config"),
    (dict(eviction_policy_config="x"), TypeError, "eviction_policy_config"),
    (dict(eviction_policy="slru", eviction_policy_config={"protected_threshold": H}), ValueError,
     "eviction_policy_config"),
    (dict(eviction_policy="slru", eviction_policy_config={"protected_threshold": 1.5}), TypeError,
     "eviction_policy_config"),
    (dict(eviction_policy="tlru", eviction_policy_config={"threshold": -1}), ValueError,
     "eviction_policy_config"),
    (dict(eviction_policy="slru", eviction_policy_config={"protected_threshold": -5}), ValueError,
     "protected_threshold"),
    (dict(token_to_kv_pool_allocator="x"), TypeError, "token_to_kv_pool_allocator"),
    (dict(token_to_kv_pool_allocator=object()), TypeError, "token_to_kv_pool_allocator"),
    (dict(req_to_token_pool=5), TypeError, "req_to_token_pool"),
    (dict(device=5), TypeError, "device"), (dict(device=None), TypeError, "device"),
    (dict(device="banana"), ValueError, "device must be 'cpu', 'cuda' or 'cuda:N'"),
    (dict(device="cuda:x"), ValueError, "device"),
    (dict(page_size=-16), ValueError, r"page_size must be in \[1, "),
    (dict(sliding_window_size=4), ValueError, "sliding_window_size given, but components has no"),
    (dict(is_eagle="no"), TypeError, "is_eagle"), (dict(is_eagle=None), TypeError, "is_eagle"),
    (dict(disable="yes"), TypeError, "disable"),
    (dict(enable_kv_cache_events=2), TypeError, "enable_kv_cache_events"),
    (dict(node_capacity=-1), ValueError, "node_capacity"), (dict(node_capacity=1.5), TypeError, "node_capacity"),
    (dict(node_capacity=H), ValueError, "node_capacity"), (dict(pool_capacity=-1), ValueError, "pool_capacity"),
    (dict(pool_capacity=2 ** 41), ValueError, "pool_capacity"),
]


@pytest.mark.parametrize("kw,exc,msg", CTOR, ids=[str(k) for k, _, _ in CTOR])
def test_bad_constructor(kw, exc, msg):
    with pytest.raises(exc, match=msg):
        UnifiedRadixCache(**kw)


def test_cuda_device_refused_where_torch_sees_none():
    """device="cuda" on a machine without a CUDA device is an error, not accepted
    silently (issue 15); where torch sees one, the cache builds."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        UnifiedRadixCache(device="cuda")
        with pytest.raises(ValueError, match="CUDA devices"):
            UnifiedRadixCache(device=f"cuda:{torch.cuda.device_count()}")
    else:
        with pytest.raises(ValueError, match="sees no CUDA device"):
            UnifiedRadixCache(device="cuda")


def test_value_length_message_is_grammatical():
    """"has 1 entry" / "1 logical unit", not "1 entries" (issue 15)."""
    c = UnifiedRadixCache()
    with pytest.raises(ValueError, match=r"params.value has 1 entry but params.key has 2 logical units"):
        c.insert(InsertParams(key=RadixKey([1, 2]), value=np.array([5])))
    with pytest.raises(ValueError, match=r"has 2 entries but params.key has 1 logical unit$"):
        c.insert(InsertParams(key=RadixKey([1]), value=np.array([5, 6])))


def test_unknown_policy_lists_valid_names():
    with pytest.raises(ValueError, match="lru, lfu, fifo, mru, filo, priority, slru, tlru"):
        UnifiedRadixCache(eviction_policy="nope")


# ----------------------------------------------------------------------------- keys
BAD_KEYS = [
    (lambda: None, TypeError, "params.key"),
    (lambda: {"key": [1, 2]}, TypeError, "params.key"),
    (lambda: "tokens", TypeError, "params.key"),
    (lambda: 5, TypeError, "params.key"),
    (lambda: MatchPrefixParams(key=None), TypeError, "params.key"),
    (lambda: RadixKey(None), TypeError, "params.key.token_ids"),
    (lambda: RadixKey("abcd"), TypeError, "params.key.token_ids"),
    (lambda: RadixKey({1: 2}), TypeError, "params.key.token_ids"),
    (lambda: RadixKey(5), TypeError, "params.key.token_ids"),
    (lambda: RadixKey(np.int64(5)), TypeError, "params.key.token_ids"),
    (lambda: RadixKey(np.array(5)), ValueError, "params.key.token_ids"),
    (lambda: RadixKey(np.zeros((2, 2), dtype=np.int64)), ValueError, "params.key.token_ids"),
    (lambda: RadixKey([1.0, 2.0]), TypeError, "params.key.token_ids"),
    (lambda: RadixKey(np.array([np.nan, 1.0])), TypeError, "params.key.token_ids"),
    (lambda: RadixKey([True, False]), TypeError, "params.key.token_ids"),
    (lambda: RadixKey(torch.tensor([1.0, 2.0])), TypeError, "params.key.token_ids"),
    (lambda: RadixKey(torch.tensor([True, False])), TypeError, "params.key.token_ids"),
    (lambda: RadixKey(array("d", [1.0, 2.0])), TypeError, "params.key.token_ids"),
    (lambda: RadixKey([H, 1]), ValueError, "params.key.token_ids"),
    (lambda: RadixKey([-H - 1, 1]), ValueError, "params.key.token_ids"),
    (lambda: RadixKey(np.array([H, 1], dtype=np.uint64)), ValueError, "params.key.token_ids"),
    (lambda: RadixKey([1, 2], extra_key=5), TypeError, "params.key.extra_key"),
    (lambda: RadixKey([1, 2], extra_key=b"x"), TypeError, "params.key.extra_key"),
    (lambda: RadixKey([1, 2], cache_salt=b"x"), TypeError, "params.key.cache_salt"),
    (lambda: RadixKey([1, 2], cache_salt={}), TypeError, "params.key.cache_salt"),
    (lambda: RadixKey([1, 2, 3], is_bigram=True), ValueError, "bigram"),
]
KEY_IDS = ["params None", "params dict", "params str", "params int", "key None", "ids None",
           "ids str", "ids dict", "ids int", "ids np scalar", "ids 0-d", "ids 2-D", "ids float",
           "ids NaN", "ids bool", "ids torch float", "ids torch bool", "ids array d",
           "ids 2**63", "ids < -2**63", "ids uint64 2**63", "extra_key int", "extra_key bytes",
           "cache_salt bytes", "cache_salt dict", "bigram in non-EAGLE"]


@pytest.mark.parametrize("make,exc,msg", BAD_KEYS, ids=KEY_IDS)
def test_bad_match(tree, make, exc, msg):
    def call():
        p = make()
        return tree.cache.match_prefix(p if isinstance(p, MatchPrefixParams) or not
                                       isinstance(p, RadixKey) else MatchPrefixParams(key=p))
    unchanged(tree, call, exc, msg)


@pytest.mark.parametrize("make,exc,msg", BAD_KEYS[4:], ids=KEY_IDS[4:])
def test_bad_insert_key(tree, make, exc, msg):
    def call():
        p = make()
        key = p.key if isinstance(p, MatchPrefixParams) else p
        return tree.cache.insert(ip(key, np.array([20, 21])))
    unchanged(tree, call, exc, msg)


@pytest.mark.parametrize("toks", [[2 ** 31, 1, 2], [-1, 1, 2]], ids=["2**31", "-1"])
def test_eagle_tokens_out_of_range(toks):
    c = UnifiedRadixCache(page_size=1, is_eagle=True)
    c.insert(InsertParams(key=RadixKey([1, 2, 3, 4], is_bigram=True)))
    e = Env.bare(c)
    unchanged(e, lambda: c.match_prefix(RadixKey(toks, is_bigram=True)), ValueError,
              r"params.key.token_ids: bigram tokens must lie in \[0, 2\*\*31\)")
    unchanged(e, lambda: c.insert(ip(RadixKey(toks, is_bigram=True))), ValueError, "bigram tokens")


# ----------------------------------------------------------------------------- insert
BAD_INSERTS = [
    (lambda: ip(RadixKey([1, 2]), "ab"), TypeError, "params.value"),
    (lambda: ip(RadixKey([1, 2]), {}), TypeError, "params.value"),
    (lambda: ip(RadixKey([1, 2]), np.array(3)), ValueError, "params.value"),
    (lambda: ip(RadixKey([1, 2]), np.array([[20, 21]])), ValueError, "params.value"),
    (lambda: ip(RadixKey([1, 2]), np.array([20.0, 21.0])), TypeError, "params.value"),
    (lambda: ip(RadixKey([1, 2]), [20, 21.5]), TypeError, "params.value"),
    (lambda: ip(RadixKey([1, 2]), np.array([np.nan, 1.0])), TypeError, "params.value"),
    (lambda: ip(RadixKey([1, 2]), np.array([True, False])), TypeError, "params.value"),
    (lambda: ip(RadixKey([1, 2]), torch.tensor([1.0, 2.0])), TypeError, "params.value"),
    (lambda: ip(RadixKey([1, 2]), [H, 1]), ValueError, "params.value"),
    (lambda: ip(RadixKey([1, 2]), np.array([H, 1], dtype=np.uint64)), ValueError, "params.value"),
    (lambda: ip(RadixKey([1, 2]), np.array([-1, 2])), ValueError, "params.value"),
    (lambda: ip(RadixKey([1, 2]), np.array([1, 10_000])), ValueError, "params.value"),
    (lambda: ip(RadixKey([1, 2]), np.array([1, POOL + 1])), ValueError, "params.value"),
    (lambda: ip(RadixKey([1, 2]), np.array([20, 21, 22])), ValueError, "params.value"),
    (lambda: ip(RadixKey([1, 2, 3, 4]), np.array([20, 21])), ValueError, "params.value"),
    (lambda: ip(RadixKey([500, 501])), ValueError, "params.value is None"),
    (lambda: ip(RadixKey([-5, 6])), ValueError, "params.value is None"),
    (lambda: ip(RadixKey([1, 2]), np.array([20, 21]), prev_prefix_len=-1), ValueError, "params.prev_prefix_len"),
    (lambda: ip(RadixKey([1, 2]), np.array([20, 21]), prev_prefix_len=1.5), TypeError, "params.prev_prefix_len"),
    (lambda: ip(RadixKey([1, 2]), np.array([20, 21]), prev_prefix_len=None), TypeError, "params.prev_prefix_len"),
    (lambda: ip(RadixKey([1, 2]), np.array([20, 21]), inserted_len=-3), ValueError, "params.inserted_len"),
    (lambda: ip(RadixKey([1, 2]), np.array([20, 21]), inserted_len=None), TypeError, "params.inserted_len"),
    (lambda: ip(RadixKey([1, 2]), np.array([20, 21]), priority=1.5), TypeError, "params.priority"),
    (lambda: ip(RadixKey([1, 2]), np.array([20, 21]), priority="x"), TypeError, "params.priority"),
    (lambda: ip(RadixKey([1, 2]), np.array([20, 21]), priority=H), ValueError, "params.priority"),
    (lambda: ip(RadixKey([1, 2]), np.array([20, 21]), priority=-H), ValueError, "params.priority"),
    (lambda: ip(RadixKey([1, 2]), np.array([20, 21]), mamba_value=np.array([3])), ValueError, "mamba_value"),
    (lambda: "not params", TypeError, "InsertParams"),
    (lambda: None, TypeError, "InsertParams"),
    (lambda: {"key": RadixKey([1, 2])}, TypeError, "InsertParams"),
]
INSERT_IDS = ["value str", "value dict", "value 0-d", "value 2-D", "value float", "value float in list",
              "value NaN", "value bool", "value torch float", "value 2**63", "value uint64 2**63",
              "value negative", "value 10000", "value > pool", "value too long", "value too short",
              "value None, tokens > pool", "value None, negative tokens", "prev -1", "prev float",
              "prev None", "inserted_len -3", "inserted_len None", "priority float", "priority str",
              "priority 2**63", "priority -2**63", "mamba_value", "params str", "params None",
              "params dict"]


@pytest.mark.parametrize("make,exc,msg", BAD_INSERTS, ids=INSERT_IDS)
def test_bad_insert_leaves_state_unchanged(tree, make, exc, msg):
    unchanged(tree, lambda: tree.cache.insert(make()), exc, msg)


@pytest.mark.parametrize("toks", [[], [7]], ids=["empty", "shorter than a page"])
def test_empty_and_sub_page_keys_are_noops(tree, toks):
    c, root = tree.cache, tree.cache.root_node_handle()
    for ns in ({}, {"extra_key": "never-seen"}):
        m = noop(tree, lambda: c.match_prefix(MatchPrefixParams(key=RadixKey(toks, **ns))))
        assert (m.device_prefix_len, len(m.device_indices), m.last_device_node) == (0, 0, root)
        slots = tree.alloc.alloc(len(toks))
        r = noop(tree, lambda: c.insert(ip(RadixKey(toks, **ns), slots)))
        assert (r.prefix_len, r.last_device_node, r.mamba_exist) == (0, root, True)
        assert not tree.alloc.is_free(slots).any()  # the slots are still the caller's
        tree.alloc.free(slots)
    assert "never-seen" not in {k[0] for k in c._engine.ns.ids}


def test_match_in_unseen_namespace_is_a_noop(tree):
    m = noop(tree, lambda: tree.cache.match_prefix(RadixKey([1, 2, 3, 4], cache_salt="other")))
    assert m.device_prefix_len == 0 and m.last_device_node == tree.cache.root_node_handle()


@pytest.mark.parametrize("field", ["prev_prefix_len", "inserted_len"])
def test_huge_prefix_lengths_mean_the_whole_key(field):
    a, b = Env(with_req=False), Env(with_req=False)
    key = [1, 2, 3, 4, 70, 71]
    va, vb = a.alloc.alloc(6), b.alloc.alloc(6)
    ra = a.cache.insert(ip(RadixKey(key), va, **{field: H}))
    rb = b.cache.insert(ip(RadixKey(key), vb, **{field: len(key)}))
    assert ra == rb and ra.prefix_len == 4
    assert_same(a.state(), b.state())
    # the tree holds 10 slots; with prev_prefix_len >= prefix_len nothing of the 6 new
    # ones is a duplicate (the caller owns [0, 4)), else value[0:4] is freed
    assert a.alloc.available_size() == POOL - 10 - 6 + (0 if field == "prev_prefix_len" else 4)


# ----------------------------------------------------------------------------- evict
BAD_EVICT = [
    (-1, ValueError, "num_tokens"), (1.5, TypeError, "num_tokens"), ("3", TypeError, "num_tokens"),
    (None, TypeError, "num_tokens"), ({}, TypeError, "num_tokens"), (True, TypeError, "num_tokens"),
    (np.float64(3), TypeError, "num_tokens"), (EvictParams(num_tokens=-5), ValueError, "params.num_tokens"),
    (EvictParams(num_tokens=None), TypeError, "params.num_tokens"),
    (EvictParams(num_tokens=1, swa_num_tokens=-1), ValueError, "params.swa_num_tokens"),
    (EvictParams(num_tokens=1, mamba_num="x"), TypeError, "params.mamba_num"),
]


@pytest.mark.parametrize("arg,exc,msg", BAD_EVICT, ids=[repr(a)[:40] for a, _, _ in BAD_EVICT])
def test_bad_evict(env, arg, exc, msg):
    unchanged(env, lambda: env.cache.evict(arg), exc, msg)


def test_evict_zero_is_a_noop(env):
    r = noop(env, lambda: env.cache.evict(0))
    assert r.num_tokens_evicted == 0


@pytest.mark.parametrize("n", [10 ** 9, H, 2 ** 64, EvictParams(num_tokens=H)],
                         ids=["1e9", "2**63", "2**64", "EvictParams(2**63)"])
def test_evict_more_than_exists_evicts_every_unlocked_leaf(env, n):
    c = env.cache
    evictable, protected = c.evictable_size(), c.protected_size()
    assert (evictable, protected) == (6, 4)  # [5..8], [9,9] unlocked; [1,2], [3,4] locked
    avail = env.alloc.available_size()
    r = c.evict(n)
    assert r.num_tokens_evicted == evictable
    assert (c.evictable_size(), c.protected_size(), c.total_size()[0]) == (0, protected, protected)
    assert env.alloc.available_size() == avail + evictable
    assert c.evict(5).num_tokens_evicted == 0
    env.conserve()


def test_evict_for_alloc_bad_and_clamped(env):
    c = env.cache
    unchanged(env, lambda: c.evict_for_alloc(-1), ValueError, "num_tokens")
    unchanged(env, lambda: c.evict_for_alloc(None), TypeError, "num_tokens")
    unchanged(env, lambda: c.evict_for_alloc(1.5), TypeError, "num_tokens")
    assert noop(env, lambda: c.evict_for_alloc(env.alloc.available_size())) == 0
    bare = UnifiedRadixCache()
    with pytest.raises(ValueError, match="token_to_kv_pool_allocator"):
        bare.evict_for_alloc(3)
    evictable = c.evictable_size()
    assert c.evict_for_alloc(H) == evictable == 6
    assert c.evictable_size() == 0
    env.conserve()


def test_stepwise_eviction_bad_input(env):
    c = env.cache
    for comp, exc in ((7, ValueError), (None, ValueError), ("FULL", ValueError), (SWA, ValueError)):
        unchanged(env, lambda: c.evict_device_start(component=comp, num_tokens=2), exc, "component")
        unchanged(env, lambda: c.evict_device_next_node(comp), exc, "component")
        unchanged(env, lambda: c.evict_device_end(comp), exc, "component")
    for n, exc in ((-1, ValueError), (1.5, TypeError), (None, TypeError), ("2", TypeError)):
        unchanged(env, lambda: c.evict_device_start(num_tokens=n), exc, "num_tokens")
    unchanged(env, lambda: c.evict_device_next_node(), RuntimeError, "evict_device_start")
    assert noop(env, lambda: c.evict_device_end()) == 0
    c.evict_device_start(num_tokens=1)
    unchanged(env, lambda: c.evict_device_start(num_tokens=1), RuntimeError, "already in progress")
    c.evict_device_end()


def test_stepwise_eviction_of_more_than_exists(env):
    c = env.cache
    evictable = c.evictable_size()
    c.evict_device_start(num_tokens=H)
    freed = []
    while (step := c.evict_device_next_node()).node_id is not None:
        freed.extend(np.asarray(step.freed_indices).tolist())
    assert c.evict_device_end() == evictable == len(freed) == 6
    env.alloc.free(np.array(freed))
    env.conserve()


# ----------------------------------------------------------------------------- node ids
def _stale(env):
    """Id of the [9,9] node after evicting every unlocked leaf (it is gone)."""
    gone = env.node([1, 2, 9, 9])
    assert env.cache.evict(EvictParams(num_tokens=H)).num_tokens_evicted == 6
    assert env.cache.evictable_size() == 0
    return gone


def _stale_ids(env):
    gone = _stale(env)
    return [gone, (7 << 32) | 1, 12345678901, -1, H, 2 ** 64, -H - 1, np.uint64(H)]


def test_stale_and_never_issued_node_ids(env):
    c = env.cache
    for bad in _stale_ids(env):
        for fn in (c.inc_lock_ref, c.dec_lock_ref, c.path_device_indices, c.node_info):
            unchanged(env, lambda: fn(bad), NodeAccessError, "does not name a live node")
            unchanged(env, lambda: fn(bad), KeyError)
        assert c.is_root(bad) is False


@pytest.mark.parametrize("bad", ["3", 1.0, None, True, [1], IncLockRefResult(0, 1)],
                         ids=["str", "float", "None", "bool", "list", "receipt"])
def test_node_ids_of_the_wrong_type(env, bad):
    c = env.cache
    for fn in (c.inc_lock_ref, c.dec_lock_ref, c.path_device_indices, c.node_info, c.is_root):
        unchanged(env, lambda: fn(bad), TypeError, "node")


def test_node_ids_never_reused_across_reset():
    cache = UnifiedRadixCache(page_size=2)  # no allocator: token ids double as values
    tree = Env.bare(cache)
    seen = {cache.root_node_handle()}
    for round_ in range(3):
        for i in range(5):
            r = cache.insert(InsertParams(key=RadixKey([100 + round_, i, 7, 7])))
            assert r.last_device_node not in seen
            seen.add(r.last_device_node)
        old = cache.root_node_handle()
        cache.reset()
        assert cache.root_node_handle() != old
        assert cache.root_node_handle() not in seen
        seen.add(cache.root_node_handle())
        unchanged(tree, lambda: cache.inc_lock_ref(r.last_device_node), NodeAccessError, "live node")


@pytest.mark.parametrize("skip,exc", [(None, TypeError), (5, TypeError), ("x", TypeError),
                                      (("x",), ValueError), ((FULL,), ValueError),
                                      ((SWA, 9), ValueError)],
                         ids=["None", "int", "str", "('x',)", "(FULL,)", "(SWA, 9)"])
def test_bad_skip_lock_components_locks_nothing(env, skip, exc):
    node = env.node([1, 2, 9, 9])
    unchanged(env, lambda: env.cache.inc_lock_ref(node, skip_lock_components=skip), exc,
              "skip_lock_components")


def test_skip_of_absent_components_is_accepted(env):
    node = env.node([1, 2, 9, 9])
    r = env.cache.inc_lock_ref(node, skip_lock_components=[SWA, ComponentType.MAMBA])
    assert (r.delta, r.skipped_lock_components) == (2, (SWA, ComponentType.MAMBA))
    env.cache.dec_lock_ref(node, r)
    env.conserve()


def test_unlock_errors(env):
    c = env.cache
    node = env.node([1, 2, 9, 9])
    unchanged(env, lambda: c.dec_lock_ref(node), LockRefError, "lock_ref=0")
    receipt = c.inc_lock_ref(node)
    other = env.req.last_node
    unchanged(env, lambda: c.dec_lock_ref(other, receipt), LockRefError, "anchored")
    for bad in ("abc", {}, 5):
        unchanged(env, lambda: c.dec_lock_ref(node, bad), TypeError, "receipt")
    for bad in ("yes", None, 2):
        unchanged(env, lambda: c.dec_lock_ref(node, receipt, skip_swa=bad), TypeError, "skip_swa")
    # [1,2] is locked only through the request's lock on [3,4]: releasing it is refused
    parent = c.node_info(other)["parent"]
    unchanged(env, lambda: c.dec_lock_ref(parent), LockRefError, "anchored")
    c.dec_lock_ref(node, receipt)
    unchanged(env, lambda: c.dec_lock_ref(node, receipt), ValueError, "lock_ref=0")
    unchanged(env, lambda: c.dec_lock_ref(node, receipt), AssertionError)  # what SGLang callers catch
    unchanged(env, lambda: c.dec_lock_ref(node, receipt.to_dec_params()), LockRefError, "lock_ref=0")
    # receipts no lock of this Full-only cache gives: refused, not a silent no-op
    lk = c.lock(node)
    for skipped, what in ((5, "skipped_lock_components must be a tuple"),
                          ((ComponentType.FULL,), "holds FULL")):
        bad = copy.deepcopy(lk)
        bad.receipt.skipped_lock_components = skipped
        unchanged(env, lambda: c.unlock(bad), TypeError, what)
        unchanged(env, lambda: c.unlock_batch([bad]), TypeError, what)
        unchanged(env, lambda: c.dec_lock_ref(node, bad.receipt), TypeError, what)
    c.unlock(lk)


def test_lock_and_unlock_of_the_root_are_noops(env):
    root = env.cache.root_node_handle()
    assert noop(env, lambda: env.cache.inc_lock_ref(root)).delta == 0
    noop(env, lambda: env.cache.dec_lock_ref(root))
    noop(env, lambda: env.cache.dec_lock_ref(root))  # any number of times


def test_other_entry_points(env):
    c = env.cache
    for comp in (7, None, "x"):
        unchanged(env, lambda: c.component_evictable_size(comp), ValueError, "component")
        unchanged(env, lambda: c.component_protected_size(comp), ValueError, "component")
    assert c.component_evictable_size(SWA) == 0 and c.component_evictable_size(FULL) == 6
    for f in ("x", 5):
        unchanged(env, lambda: c.pretty_print(file=f), TypeError, "file")
    buf = io.StringIO()
    noop(env, lambda: c.pretty_print(file=buf))
    assert buf.getvalue().count("\n") == c.node_count() + 2  # one line per node + root + totals
    unchanged(env, lambda: c.block_hashes(), ValueError, "enable_kv_cache_events")
    assert noop(env, lambda: c.take_events()) == []


# ----------------------------------------------------------------------------- requests


REQ_FIELDS = [
    ("req_pool_idx", lambda e: -1, ValueError, r"req.req_pool_idx=-1 outside \[0, 4\)"),
    ("req_pool_idx", lambda e: 99, ValueError, "req.req_pool_idx=99 outside"),
    ("req_pool_idx", lambda e: 3, ValueError, "req.req_pool_idx=3 is not an allocated row"),
    ("req_pool_idx", lambda e: "x", TypeError, "req.req_pool_idx"),
    ("req_pool_idx", lambda e: 1.0, TypeError, "req.req_pool_idx"),
    ("req_pool_idx", lambda e: None, ValueError, "req.req_pool_idx is None"),
    ("last_node", _stale, NodeAccessError, "req.last_node"),
    ("last_node", lambda e: 12345678901, NodeAccessError, "req.last_node"),
    ("last_node", lambda e: H, NodeAccessError, "req.last_node"),
    ("last_node", lambda e: "x", TypeError, "req.last_node"),
    ("last_node", lambda e: e.node([1, 2, 9, 9]), LockRefError, "req.last_node"),
    ("kv_committed_len", lambda e: -1, ValueError, "req.kv_committed_len"),
    ("kv_committed_len", lambda e: H, ValueError, "req.kv_committed_len"),
    ("kv_committed_len", lambda e: 100, ValueError, "req.kv_committed_len"),
    ("kv_committed_len", lambda e: 9, ValueError, "req.kv_committed_len"),
    ("kv_allocated_len", lambda e: 3, ValueError, "req.kv_allocated_len"),
    ("kv_allocated_len", lambda e: 100, ValueError, "req.kv_allocated_len"),
    ("kv_allocated_len", lambda e: "x", TypeError, "req.kv_allocated_len"),
    ("cache_protected_len", lambda e: -1, ValueError, "req.cache_protected_len"),
    ("cache_protected_len", lambda e: 100, ValueError, "req.cache_protected_len"),
    ("cache_protected_len", lambda e: "x", TypeError, "req.cache_protected_len"),
    ("cache_inserted_len", lambda e: -1, ValueError, "req.cache_inserted_len"),
    ("cache_inserted_len", lambda e: "x", TypeError, "req.cache_inserted_len"),
    ("priority", lambda e: "high", TypeError, "req.priority"),
    ("priority", lambda e: H, ValueError, "req.priority"),
    ("extra_key", lambda e: 5, TypeError, "req.extra_key"),
    ("cache_salt", lambda e: b"x", TypeError, "req.cache_salt"),
    ("origin_input_ids", lambda e: None, TypeError, "req.origin_input_ids"),
    ("origin_input_ids", lambda e: "abcdefg", TypeError, "req.origin_input_ids"),
    ("output_ids", lambda e: None, TypeError, "req.output_ids"),
    ("fill_ids", lambda e: "abcdefg", TypeError, "req.fill_ids"),
    ("fill_ids", lambda e: [1.5] * 7, TypeError, "req.fill_ids"),
    ("prefix_indices", lambda e: "x", TypeError, "req.prefix_indices"),
]


def _finished(env, req):
    return env.cache.cache_finished_req(req)


def _aborted(env, req):
    return env.cache.cache_finished_req(req, is_insert=False)


def _unfinished(env, req):
    return env.cache.cache_unfinished_req(req)


def _release(env, req):
    return env.cache.release_kv_cache(req)


def _checkpoint(env, req):
    return env.cache.checkpoint(req, 7)


REQ_CALLS = [_finished, _aborted, _unfinished, _release, _checkpoint]
# fields an entry point never reads (checked: the call succeeds with them)
NOT_READ = {
    _aborted: {"cache_inserted_len": ("x", -1), "priority": ("high", H), "extra_key": (5,),
               "cache_salt": (b"x",), "fill_ids": ([1.5] * 7,)},
    _unfinished: {"kv_committed_len": (-1, H, 100, 9), "kv_allocated_len": (3, 100, "x"),
                  "output_ids": (None,)},
    _checkpoint: {"kv_committed_len": (-1, H, 100, 9), "kv_allocated_len": (3, 100, "x"),
                  "output_ids": (None,)},
}


def _reads(call, field, value):
    return value not in NOT_READ.get(call, {}).get(field, ()) if not isinstance(value, list) else (
        not any(v == value for v in NOT_READ.get(call, {}).get(field, ()) if isinstance(v, list)))


def _finish_cleanly(env, req, saved):
    """After a refused call the request is intact: restoring the field lets it finish,
    and every slot is accounted for."""
    for k, v in saved.items():
        setattr(req, k, v)
    env.cache.cache_finished_req(req)
    env.conserve()
    assert env.cache.protected_size() == 0
    assert env.alloc.available_size() + env.cache.evictable_size() == POOL


@pytest.mark.parametrize("call", REQ_CALLS, ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("field,make,exc,msg", REQ_FIELDS,
                         ids=[f"{f}={i}" for i, (f, *_) in enumerate(REQ_FIELDS)])
def test_bad_request_fields(env, call, field, make, exc, msg):
    req = env.req
    value = make(env)
    saved = {field: getattr(req, field)}
    setattr(req, field, value)
    if not _reads(call, field, value):
        call(env, req)  # this entry point never reads the field: accepted, and harmless
        for k, v in saved.items():
            setattr(req, k, v)
        if req.req_pool_idx is not None:
            env.cache.cache_finished_req(req)
        env.conserve()
        assert env.cache.protected_size() == 0
        return
    unchanged(env, lambda: call(env, req), exc, msg)
    _finish_cleanly(env, req, saved)


@pytest.mark.parametrize("call", REQ_CALLS, ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("bad", [None, "x", {}, 5], ids=["None", "str", "dict", "int"])
def test_request_of_the_wrong_type(env, call, bad):
    unchanged(env, lambda: call(env, bad), TypeError, "req must be a Req")
    _finish_cleanly(env, env.req, {})


@pytest.mark.parametrize("slot,msg", [(60, "is free in the allocator"), (0, "outside the allocator"),
                                      (POOL + 1, "outside the allocator"), ("dup", "appears twice")],
                         ids=["free slot", "slot 0", "slot > pool", "repeated slot"])
def test_request_row_holding_a_bad_slot(env, slot, msg):
    req = env.req
    row = env.rtp.req_to_token[req.req_pool_idx]
    keep = int(row[5])
    row[5] = row[4] if slot == "dup" else slot
    for call in REQ_CALLS:
        unchanged(env, lambda: call(env, req), ValueError, msg)
    row[5] = keep
    _finish_cleanly(env, req, {})


def test_request_flags_and_up_to(env):
    c, req = env.cache, env.req
    for bad in ("yes", None, 2):
        unchanged(env, lambda: c.cache_finished_req(req, is_insert=bad), TypeError, "is_insert")
        unchanged(env, lambda: c.release_kv_cache(req, checkpoint=bad), TypeError, "checkpoint")
    for bad, exc in ((-1, ValueError), (None, TypeError), (1.5, TypeError), (8, ValueError)):
        unchanged(env, lambda: c.checkpoint(req, bad), exc, "up_to")
    _finish_cleanly(env, req, {})


def test_second_release_is_refused(env):
    req = env.req
    env.cache.cache_finished_req(req)
    env.conserve()
    for call in REQ_CALLS:
        unchanged(env, lambda: call(env, req), ValueError, "req.req_pool_idx is None")


def test_cache_without_pools(env):
    bare = UnifiedRadixCache(page_size=2)
    before = bare._snapshot()
    for call in (bare.cache_finished_req, bare.cache_unfinished_req, bare.release_kv_cache):
        with pytest.raises(ValueError, match="needs req_to_token_pool"):
            call(env.req)
    assert_state_equal(before, bare._snapshot())


# ----------------------------------------------------------------------------- pools
def alloc_state(a):
    return a._top, a._stack[:a._top].copy(), a._mark.copy()


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(size=-1), ValueError, "size"), (dict(size=None), TypeError, "size"),
    (dict(size=1.5), TypeError, "size"), (dict(size=2 ** 41), ValueError, "size"),
    (dict(size=H), ValueError, "size"), (dict(size=4, page_size=0), ValueError, "page_size"),
    (dict(size=4, index_kind="x"), ValueError, "index_kind"),
    (dict(size=4, device="cuda"), ValueError, "device"),
], ids=["-1", "None", "float", "2**41", "2**63", "page 0", "kind", "device"])
def test_bad_allocator_constructor(kw, exc, msg):
    with pytest.raises(exc, match=msg):
        TokenToKVPoolAllocator(**kw)


def test_bad_allocator_calls():
    a = TokenToKVPoolAllocator(16)
    held = a.alloc(4)  # slots 1..4
    assert held.tolist() == [1, 2, 3, 4]
    cases = [
        (lambda: a.alloc(-1), ValueError, "need_size"), (lambda: a.alloc(None), TypeError, "need_size"),
        (lambda: a.alloc(1.5), TypeError, "need_size"), (lambda: a.alloc("3"), TypeError, "need_size"),
        (lambda: a.free(None), TypeError, "free_index"), (lambda: a.free(3), TypeError, "free_index"),
        (lambda: a.free("ab"), TypeError, "free_index"),
        (lambda: a.free(np.array([1.0])), TypeError, "free_index"),
        (lambda: a.free(np.array([[1]])), ValueError, "free_index"),
        (lambda: a.free([H]), ValueError, "free_index"),
        (lambda: a.free([1, -1]), ValueError, "free_index: slot -1 outside"),
        (lambda: a.free([0]), ValueError, "free_index: slot 0 outside"),
        (lambda: a.free([17]), ValueError, "free_index: slot 17 outside"),
        (lambda: a.free([1, 9]), ValueError, "free_index: double free of slot 9"),
        (lambda: a.free([2, 3, 2]), ValueError, "free_index: slot 2 is given more than once"),
        (lambda: a.is_free([-1]), ValueError, "indices"), (lambda: a.is_free([17]), ValueError, "indices"),
        (lambda: a.is_free(None), TypeError, "indices"),
    ]
    for fn, exc, msg in cases:
        before = alloc_state(a)
        with pytest.raises(exc, match=msg):
            fn()
        assert_same(before, alloc_state(a))
    before = alloc_state(a)
    assert a.alloc(H) is None and a.alloc(13) is None  # documented: None when short
    assert_same(before, alloc_state(a))
    assert a.is_free([0, 1, 4, 5, 16]).tolist() == [False, False, False, True, True]


def rtp_state(r):
    return list(r._free_rows), r._is_free.copy(), r._rows.copy()


@pytest.mark.parametrize("args,kw,exc,msg", [
    ((-1, 4), {}, ValueError, "size"), ((None, 4), {}, TypeError, "size"),
    ((2 ** 41, 1), {}, ValueError, "size"), ((4, -1), {}, ValueError, "max_context_len"),
    ((4, 2 ** 41), {}, ValueError, "max_context_len"), ((2 ** 21, 2 ** 20), {}, ValueError, "max_context_len"),
    ((4, 4), dict(device="cuda"), ValueError, "device"), ((4, 4), dict(index_kind="x"), ValueError, "index_kind"),
], ids=["size -1", "size None", "size 2**41", "ctx -1", "ctx 2**41", "product", "device", "kind"])
def test_bad_req_to_token_pool_constructor(args, kw, exc, msg):
    with pytest.raises(exc, match=msg):
        ReqToTokenPool(*args, **kw)


def test_bad_req_to_token_pool_calls():
    r = ReqToTokenPool(4, 8)
    rows = r.alloc(2)
    assert rows == [0, 1]
    cases = [
        (lambda: r.alloc(-1), ValueError, "need_size"), (lambda: r.alloc(None), TypeError, "need_size"),
        (lambda: r.free(None), TypeError, "free_index"), (lambda: r.free("a"), TypeError, "free_index"),
        (lambda: r.free(1.5), TypeError, "free_index"), (lambda: r.free(True), TypeError, "free_index"),
        (lambda: r.free(H), ValueError, "free_index"), (lambda: r.free(3), ValueError, "row 3 is not allocated"),
        (lambda: r.free([0, 0]), ValueError, "row 0 is given more than once"),
        (lambda: r.free([1, 3]), ValueError, "row 3 is not allocated"),
        (lambda: r.write((0, slice(0, 2)), np.array([1.7, 2.2])), TypeError, "values"),
        (lambda: r.write((0, slice(0, 2)), "ab"), TypeError, "values"),
        (lambda: r.write((0, slice(0, 2)), 1.5), TypeError, "values"),
        (lambda: r.write((99, slice(0, 2)), np.array([1, 2])), IndexError, "indices"),
    ]
    for fn, exc, msg in cases:
        before = rtp_state(r)
        with pytest.raises(exc, match=msg):
            fn()
        assert_same(before, rtp_state(r))
    assert r.alloc(H) is None
    r.free([0, 1])
    assert r.available_size() == 4 and sorted(r.alloc(4)) == [0, 1, 2, 3]


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(origin_input_ids=None), TypeError, "origin_input_ids"),
    (dict(origin_input_ids="abc"), TypeError, "origin_input_ids"),
    (dict(origin_input_ids=5), TypeError, "origin_input_ids"),
    (dict(origin_input_ids=[1.5]), TypeError, "origin_input_ids"),
    (dict(origin_input_ids=[True]), TypeError, "origin_input_ids"),
    (dict(origin_input_ids=np.array([1.0])), TypeError, "origin_input_ids"),
    (dict(output_ids=None), TypeError, "output_ids"), (dict(fill_ids="ab"), TypeError, "fill_ids"),
    (dict(prefix_indices="x"), TypeError, "prefix_indices"),
    (dict(req_pool_idx="x"), TypeError, "req_pool_idx"), (dict(req_pool_idx=-1), ValueError, "req_pool_idx"),
    (dict(last_node="x"), TypeError, "last_node"), (dict(last_node=H), NodeAccessError, "last_node"),
    (dict(extra_key=5), TypeError, "extra_key"), (dict(cache_salt=b"x"), TypeError, "cache_salt"),
    (dict(priority="high"), TypeError, "priority"), (dict(priority=H), ValueError, "priority"),
    (dict(cache_inserted_len=-1), ValueError, "cache_inserted_len"),
    (dict(cache_inserted_len=None), TypeError, "cache_inserted_len"),
    (dict(kv_committed_len=-1), ValueError, "kv_committed_len"),
    (dict(cache_protected_len=1.5), TypeError, "cache_protected_len"),
], ids=lambda v: str(v)[:40] if isinstance(v, dict) else "")
def test_bad_req_construction(kw, exc, msg):
    args = dict(origin_input_ids=[1, 2, 3])
    args.update(kw)
    with pytest.raises(exc, match=msg):
        Req(**args)


# ----------------------------------------------------------------------------- odd arrays accepted
def _odd(arr, how):
    """``arr`` as a non-contiguous view, a read-only array, or a torch strided view."""
    arr = np.asarray(arr, dtype=np.int64)
    if how == "strided":
        big = np.zeros(2 * len(arr), dtype=np.int64)
        big[::2] = arr
        out = big[::2]
        assert not out.flags.c_contiguous or len(arr) <= 1
        return out
    if how == "readonly":
        out = arr.copy()
        out.setflags(write=False)
        return out
    big = torch.zeros(2 * len(arr), dtype=torch.int64)
    big[::2] = torch.from_numpy(arr)
    out = big[::2]
    assert not out.is_contiguous() or len(arr) <= 1
    return out


ODD = ["strided", "readonly", "torch-strided"]


@pytest.mark.parametrize("how", ODD)
def test_odd_arrays_match_like_contiguous_copies(how):
    a, b = Env(), Env()
    toks = [1, 2, 3, 4, 5, 6, 9]
    ma = a.cache.match_prefix(MatchPrefixParams(key=RadixKey(_odd(toks, how))))
    mb = b.cache.match_prefix(MatchPrefixParams(key=RadixKey(np.array(toks, dtype=np.int64))))
    assert ma.device_prefix_len == mb.device_prefix_len == 6
    np.testing.assert_array_equal(ma.device_indices, mb.device_indices)
    assert ma[1:] == mb[1:]
    assert_same(a.state(), b.state())


@pytest.mark.parametrize("how", ODD)
def test_odd_arrays_insert_like_contiguous_copies(how):
    a, b = Env(), Env()
    toks = [1, 2, 3, 4, 80, 81, 82, 83]
    va, vb = a.alloc.alloc(8), b.alloc.alloc(8)
    ra = a.cache.insert(ip(RadixKey(_odd(toks, how)), _odd(va, how)))
    rb = b.cache.insert(ip(RadixKey(np.array(toks)), vb.copy()))
    assert ra == rb and ra.prefix_len == 4
    assert_same(a.state(), b.state())
    prefix = a.cache.match_prefix(RadixKey([1, 2, 3, 4])).device_indices
    assert len(prefix) == 4 and not set(prefix.tolist()) & set(va[4:].tolist())
    np.testing.assert_array_equal(a.cache.path_device_indices(ra.last_device_node),
                                  np.concatenate([prefix, va[4:]]))
    assert a.alloc.is_free(va[:4]).all()  # the duplicates were freed


@pytest.mark.parametrize("how", ODD)
def test_odd_arrays_accepted_by_the_pools(how):
    a, b = TokenToKVPoolAllocator(16), TokenToKVPoolAllocator(16)
    sa, sb = a.alloc(6), b.alloc(6)
    a.free(_odd(sa[[1, 3, 5]], how))
    b.free(sb[[1, 3, 5]].copy())
    assert_same(alloc_state(a), alloc_state(b))
    assert a.is_free(_odd([1, 2, 3, 4], how)).tolist() == b.is_free([1, 2, 3, 4]).tolist() == [
        False, True, False, True]
    ra, rb = ReqToTokenPool(2, 8), ReqToTokenPool(2, 8)
    ra.write((0, slice(0, 3)), _odd([5, 6, 7], how))
    rb.write((0, slice(0, 3)), np.array([5, 6, 7]))
    assert_same(rtp_state(ra), rtp_state(rb))


@pytest.mark.parametrize("how", ["strided", "readonly"])
def test_odd_arrays_in_a_request_like_contiguous_copies(how):
    a, b = Env(), Env()
    for e, conv in ((a, lambda x: _odd(x, how)), (b, lambda x: np.array(x, dtype=np.int64))):
        req = e.req
        req.origin_input_ids = conv(req.origin_input_ids)
        req.fill_ids = conv(req.fill_ids)
        req.prefix_indices = conv(req.prefix_indices)
        e.cache.cache_unfinished_req(req)
        e.cache.cache_finished_req(req)
        e.conserve()
    assert_same(a.state(), b.state())
    assert a.cache.total_size()[0] == 12  # 10 + [50, 51] (52 is the unaligned tail, freed)


def test_bool_among_int_token_ids_counts_as_int(tree):
    """Python's bool is an int subclass: a bool among ints is the token 0/1 (as in
    SGLang's cores); an all-bool list or a bool array is refused (BAD_KEYS)."""
    a = tree.cache.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3, 4])))
    b = tree.cache.match_prefix(MatchPrefixParams(key=RadixKey([True, 2, 3, 4])))
    assert a.device_prefix_len == b.device_prefix_len == 4
    np.testing.assert_array_equal(a.device_indices, b.device_indices)
