"""The Mamba / SSM component (spec §6.3): hand-worked scenarios, bad input, and a
seeded random run that checks the state-slot partition after every operation.

Every expected value here is worked out by hand from the spec's rules (state only
at the exact depth it was produced; a split's upper part holds none; match stops
at the deepest node owning a state; the Mamba LRU refreshes the matched node
only; leaf -> whole-node eviction, internal -> tombstone; single-node lock).
The differential comparison with SGLang's own cache is in ``tests/oracle``.
"""

import numpy as np
import pytest

from flatradix import (
    ComponentType, EvictParams, HybridReqToTokenPool, InsertParams, LockRefError,
    MatchPrefixParams, RadixKey, TokenToKVPoolAllocator, UnifiedRadixCache,
)
from flatradix.errors import ReceiptError

FULL, SWA, MAMBA = ComponentType.FULL, ComponentType.SWA, ComponentType.MAMBA


class Env:
    """A FULL+MAMBA cache with flatradix's pools; ``ins`` allocates both values."""

    def __init__(self, page=1, chunk=64, states=16, extra=False, policy="lru", cap=-1):
        self.alloc = TokenToKVPoolAllocator(4096)
        self.pool = HybridReqToTokenPool(4, 256, mamba_size=states,
                                         enable_mamba_extra_buffer=extra)
        self.ma = self.pool.mamba_allocator
        self.cache = UnifiedRadixCache(
            page_size=page, tree_components=(FULL, MAMBA), token_to_kv_pool_allocator=self.alloc,
            req_to_token_pool=self.pool, mamba_cache_chunk_size=chunk,
            enable_mamba_extra_buffer=extra, eviction_policy=policy,
            mamba_max_states_per_path=cap)
        self.caller = set()  # state slots the caller holds (mamba_exist returns)

    def ins(self, toks):
        """Insert ``toks`` with fresh KV slots and a fresh state; frees what the
        tree did not take (duplicates go through the allocator; a state when
        ``mamba_exist``). Returns the InsertResult."""
        kv = self.alloc.alloc(len(toks))
        st = self.ma.alloc(1)
        r = self.cache.insert(InsertParams(key=RadixKey(list(toks)), value=kv, mamba_value=st))
        n = len(toks) - len(toks) % self.cache.page_size
        self.alloc.free(kv[n:]) if n < len(toks) else None
        if r.mamba_exist:
            self.ma.free(st)
        return r, int(st[0])

    def match(self, toks):
        return self.cache.match_prefix(MatchPrefixParams(key=RadixKey(list(toks))))

    def partition(self):
        """Every state slot is exactly one of: free, in the tree, held by the caller."""
        tree = self.cache.all_mamba_values_flatten().tolist()
        slots = range(1, self.ma.size + 1)          # slot 0 is the reserved dummy
        free = [s for s in slots if not self.ma.is_held([s])[0]]
        assert len(set(tree)) == len(tree)
        assert sorted(tree + free + sorted(self.caller)) == list(slots)
        assert self.cache.mamba_evictable_size() + self.cache.mamba_protected_size() == len(tree)
        assert self.cache.total_size()[1] == len(tree)
        self.cache.sanity_check()


def snap(env):
    c = env.cache
    return (c.all_values_flatten().tolist(), c.all_mamba_values_flatten().tolist(),
            c.evictable_size(), c.protected_size(), c.mamba_evictable_size(),
            c.mamba_protected_size(), env.ma.available_size(), env.alloc.available_size(),
            c.node_count())


def test_new_leaf_takes_the_state_and_an_existing_state_is_kept():
    env = Env()
    r, s1 = env.ins(range(1, 9))
    assert (r.prefix_len, r.mamba_exist) == (0, False)
    assert env.cache.all_mamba_values_flatten().tolist() == [s1]
    assert (env.cache.mamba_evictable_size(), env.cache.total_size()) == (1, (8, 1))
    r, s2 = env.ins(range(1, 9))            # same key: the node has a state
    assert (r.prefix_len, r.mamba_exist) == (8, True)
    assert env.cache.all_mamba_values_flatten().tolist() == [s1]
    assert env.ma.available_size() == env.ma.size - 1   # s2 went back (mamba_exist)
    env.partition()


def test_split_upper_part_has_no_state_and_can_take_one_later():
    env = Env()
    _, s1 = env.ins(range(10))
    _, s2 = env.ins([0, 1, 2, 3, 4, 99])     # splits [0..9] at 5: upper [0..4] stateless
    assert env.cache.node_count() == 3
    assert sorted(env.cache.all_mamba_values_flatten().tolist()) == sorted([s1, s2])
    m = env.match([0, 1, 2, 3, 4])
    assert (m.device_prefix_len, m.full_kv_hit_length) == (0, 5)
    r, s3 = env.ins(range(5))                # ends on the stateless upper node: it takes s3
    assert (r.prefix_len, r.mamba_exist) == (5, False)
    assert env.match(range(5)).device_prefix_len == 5
    assert env.cache.mamba_evictable_size() == 3
    env.partition()


def test_b10_checkpoint_survives_a_mid_edge_split():
    """known_bugs B10 (SGLang issue #22935): the n-1 lookup splits the edge; the
    split part has no state; the identical prompt still hits in full."""
    env = Env()
    _, s8 = env.ins(range(1, 9))
    m7 = env.match(range(1, 8))
    assert (m7.device_prefix_len, m7.full_kv_hit_length) == (0, 7)
    assert env.cache.node_count() == 2       # the split happened
    m8 = env.match(range(1, 9))
    assert m8.device_prefix_len == 8
    assert env.cache.node_info(m8.last_device_node)["mamba_value"] == s8
    assert env.match(range(1, 10)).device_prefix_len == 8
    assert env.cache.mamba_evictable_size() == 1  # the split part is not a state
    env.partition()


def test_branching_seqlen_on_the_checkpoint_grid():
    # chunk 4, page 1: grid 4. Full hit 8, usable prefix 5 -> 8; hit 7 -> 4 (> 5? no: None)
    env = Env(chunk=4)
    env.ins(range(10))
    env.ins(range(5))                       # state at 5 (upper part of the split)
    m = env.match(list(range(8)) + [77])
    assert (m.device_prefix_len, m.full_kv_hit_length, m.mamba_branching_seqlen) == (5, 8, 8)
    m = env.match(list(range(7)) + [77])
    assert (m.device_prefix_len, m.full_kv_hit_length, m.mamba_branching_seqlen) == (5, 7, None)
    # chunk 64 on page 16 (extra buffer): grid 64
    env = Env(page=16, chunk=24, extra=True)   # lcm(24, 16) = 48
    env.ins(range(160))
    m = env.match(list(range(112)) + [5] * 16)
    assert (m.device_prefix_len, m.full_kv_hit_length, m.mamba_branching_seqlen) == (0, 112, 96)
    assert env.cache.mamba_checkpoint_grid == 48


def test_match_refreshes_only_the_matched_state_and_eviction_takes_the_lru_one():
    env = Env()
    _, a = env.ins(range(4))                 # node A [0..3]
    _, b = env.ins(range(8))                 # node B [4..7] under A
    _, c = env.ins([50, 51])                 # node C
    env.match(range(8))                      # refreshes B only (not its ancestor A)
    # Mamba LRU, least recent first: A, C, B
    r = env.cache.evict(EvictParams(num_tokens=0, mamba_num=1))
    assert (r.num_tokens_evicted, r.mamba_num_evicted) == (0, 1)   # A is internal: tombstone
    assert sorted(env.cache.all_mamba_values_flatten().tolist()) == sorted([b, c])
    assert env.cache.node_count() == 3       # Full KV kept
    r = env.cache.evict(EvictParams(num_tokens=0, mamba_num=1))
    assert (r.num_tokens_evicted, r.mamba_num_evicted) == (2, 1)   # C is a leaf: deleted whole
    assert env.cache.node_count() == 2
    assert env.match(range(8)).device_prefix_len == 8              # B's state still there
    assert env.match(range(4)).device_prefix_len == 0              # A was tombstoned
    env.partition()


def test_full_eviction_frees_the_leaf_state_and_chains_collapse():
    env = Env()
    env.ins(range(4))
    env.ins(range(8))
    r = env.cache.evict(EvictParams(num_tokens=100))
    assert (r.num_tokens_evicted, r.mamba_num_evicted) == (8, 2)
    assert env.ma.available_size() == env.ma.size
    assert env.alloc.available_size() == 4096
    env.partition()


def test_locks_are_single_node_and_the_receipt_remembers_a_skip():
    env = Env()
    env.ins(range(4))
    env.ins(range(8))
    m = env.match(range(8))
    full_lock = env.cache.lock(m.last_device_node, skip_lock_components=(MAMBA,))
    assert (env.cache.mamba_evictable_size(), env.cache.mamba_protected_size()) == (2, 0)
    lk = env.cache.lock(m.last_device_node)
    assert (env.cache.mamba_evictable_size(), env.cache.mamba_protected_size()) == (1, 1)
    # the ancestor's state is not locked: the Mamba walk tombstones it, the locked one stays
    r = env.cache.evict(EvictParams(num_tokens=0, mamba_num=5))
    assert (r.num_tokens_evicted, r.mamba_num_evicted) == (0, 1)
    assert env.cache.mamba_protected_size() == 1
    env.cache.unlock(full_lock)             # drops no Mamba lock (it skipped Mamba)
    assert env.cache.mamba_protected_size() == 1
    env.cache.unlock(lk)
    assert (env.cache.mamba_evictable_size(), env.cache.mamba_protected_size()) == (1, 0)
    before = snap(env)
    with pytest.raises(LockRefError, match="lock_ref=0"):
        env.cache.unlock(lk)                # released twice: refused, nothing changed
    assert snap(env) == before
    env.partition()


def test_a_full_locked_leaf_loses_only_its_state():
    env = Env()
    env.ins(range(4))
    m = env.match(range(4))
    lk = env.cache.lock(m.last_device_node, skip_lock_components=(MAMBA,))
    r = env.cache.evict(EvictParams(num_tokens=0, mamba_num=1))
    assert (r.num_tokens_evicted, r.mamba_num_evicted) == (0, 1)
    assert env.cache.node_count() == 1 and env.cache.protected_size() == 4
    env.cache.unlock(lk)
    env.partition()


def test_mamba_release_needs_the_receipt():
    env = Env()
    env.ins(range(4))
    node = env.match(range(4)).last_device_node
    r = env.cache.inc_lock_ref(node)
    before = snap(env)
    with pytest.raises(ReceiptError, match="Mamba cache needs the lock's receipt"):
        env.cache.dec_lock_ref(node)
    assert snap(env) == before
    env.cache.dec_lock_ref(node, r.to_dec_params())
    env.partition()


def test_step_wise_mamba_round():
    env = Env()
    _, a = env.ins(range(4))
    _, b = env.ins(range(8))
    _, c = env.ins([50, 51])
    env.cache.evict_device_start(MAMBA, 2)
    st1 = env.cache.evict_device_next_node(MAMBA)     # A (internal): tombstone
    assert (st1.node_id, st1.made_progress, st1.mamba_num) == (None, True, 1)
    assert st1.mamba_freed_indices.tolist() == [a]
    env.match(range(8))                                # a refresh between steps
    st2 = env.cache.evict_device_next_node(MAMBA)     # the cursor moved on: B (leaf)
    assert st2.node_id is not None and st2.mamba_freed_indices.tolist() == [b]
    assert st2.freed_indices.tolist() and st2.num_tokens == 4
    st3 = env.cache.evict_device_next_node(MAMBA)     # request met
    assert not st3.made_progress
    assert env.cache.evict_device_end(MAMBA) == 2
    # the controller frees the steps' slots
    env.alloc.free(st2.freed_indices)
    env.ma.free(np.concatenate([st1.mamba_freed_indices, st2.mamba_freed_indices]))
    assert sorted(env.cache.all_mamba_values_flatten().tolist()) == [c]
    env.partition()


def test_sub_page_key_is_a_no_op():
    """The 63-token key on 64-token pages (issue 12): nothing is created, no
    empty-key node, the caller keeps its state; later operations are unaffected."""
    env = Env(page=64, extra=True)
    kv = env.alloc.alloc(63)
    st = env.ma.alloc(1)
    r = env.cache.insert(InsertParams(key=RadixKey(list(range(63))), value=kv, mamba_value=st))
    assert (r.prefix_len, r.mamba_exist, env.cache.node_count()) == (0, True, 0)
    env.alloc.free(kv)
    env.ma.free(st)
    env.ins(range(128))
    env.ins(range(64))
    assert env.match(range(127)).device_prefix_len == 64
    assert env.match(range(128)).device_prefix_len == 128
    env.partition()


class _Kv:
    def __init__(self):
        self.mamba_pool_idx = None
        self.mamba_cow_src_index = None
        self.mamba_needs_clear = True


class _Req:
    def __init__(self):
        self.kv = _Kv()


def test_copy_on_write_allocates_a_request_slot_and_names_the_source():
    env = Env(states=2)
    _, a = env.ins(range(4))
    _, b = env.ins([9, 9])
    req = _Req()
    m = env.cache.match_prefix(MatchPrefixParams(key=RadixKey(list(range(4))), cow_mamba=True,
                                                 req=req))
    assert m.device_prefix_len == 4
    assert int(req.kv.mamba_cow_src_index[0]) == a
    assert req.kv.mamba_needs_clear is False
    # the pool was empty: one state (b's leaf, least recent) was evicted for it
    assert int(req.kv.mamba_pool_idx) == b
    assert env.cache.all_mamba_values_flatten().tolist() == [a]
    env.caller.add(b)
    env.partition()
    # a request that holds a slot keeps it
    req2 = _Req()
    req2.kv.mamba_pool_idx = 123
    env.cache.match_prefix(MatchPrefixParams(key=RadixKey(list(range(4))), cow_mamba=True,
                                             req=req2))
    assert req2.kv.mamba_pool_idx == 123 and int(req2.kv.mamba_cow_src_index[0]) == a


# ---------------------------------------------------------------------- bad input
@pytest.mark.parametrize("value, exc, msg", [
    (None, ValueError, "mamba_value is required"),
    (np.array([1, 2]), ValueError, "exactly one Mamba state slot"),
    (np.array([99]), ValueError, "outside the state pool"),
    (np.array([-1]), ValueError, "outside the state pool"),
    (np.array([0]), ValueError, "outside the state pool"),       # SGLang's dummy slot
    (np.array([5]), ValueError, "is free in the state pool"),
    ("x", TypeError, "mamba_value"),
    (np.array([1.5]), TypeError, "mamba_value"),
])
def test_bad_mamba_value_changes_nothing(value, exc, msg):
    env = Env()
    env.ins(range(4))
    kv = env.alloc.alloc(4)
    before = snap(env)
    with pytest.raises(exc, match=msg):
        env.cache.insert(InsertParams(key=RadixKey([7, 7, 7, 7]), value=kv, mamba_value=value))
    assert snap(env) == before


def test_mamba_parameters_refused_where_they_do_not_apply():
    alloc = TokenToKVPoolAllocator(64)
    plain = UnifiedRadixCache(token_to_kv_pool_allocator=alloc)
    with pytest.raises(ValueError, match="no Mamba component"):
        plain.insert(InsertParams(key=RadixKey([1]), value=alloc.alloc(1), mamba_value=[0]))
    with pytest.raises(ValueError, match="no Mamba component"):
        plain.match_prefix(MatchPrefixParams(key=RadixKey([1]), cow_mamba=True, req=_Req()))
    env = Env()
    with pytest.raises(ValueError, match="params.mamba_num"):
        env.cache.evict(EvictParams(num_tokens=0, mamba_num=-1))
    with pytest.raises(ValueError, match="cow_mamba needs params.req"):
        env.cache.match_prefix(MatchPrefixParams(key=RadixKey([1]), cow_mamba=True))


@pytest.mark.parametrize("kwargs, exc, msg", [
    (dict(page_size=16), ValueError, "needs page_size=1"),
    (dict(mamba_cache_chunk_size=0), ValueError, "mamba_cache_chunk_size"),
    (dict(mamba_cache_chunk_size=1.5), TypeError, "mamba_cache_chunk_size"),
    (dict(enable_mamba_extra_buffer="yes"), TypeError, "enable_mamba_extra_buffer"),
    (dict(req_to_token_pool=None), TypeError, "mamba_allocator"),
    (dict(tree_components=(FULL, MAMBA, SWA)), ValueError, "components must be"),
    (dict(mamba_max_states_per_path=0), ValueError, "mamba_max_states_per_path"),
    (dict(mamba_max_states_per_path=-2), ValueError, "mamba_max_states_per_path"),
    (dict(mamba_max_states_per_path=2.0), TypeError, "mamba_max_states_per_path"),
    (dict(mamba_max_states_per_path=2, tree_components=(FULL,), req_to_token_pool=None),
     ValueError, "no ComponentType.MAMBA"),
])
def test_bad_mamba_construction(kwargs, exc, msg):
    args = dict(page_size=1, tree_components=(FULL, MAMBA),
                token_to_kv_pool_allocator=TokenToKVPoolAllocator(64),
                req_to_token_pool=HybridReqToTokenPool(2, 16, mamba_size=4))
    args.update(kwargs)
    with pytest.raises(exc, match=msg):
        UnifiedRadixCache(**args)


def test_extra_buffer_cache_and_pool_must_agree():
    for cache_extra, page in ((True, 16), (False, 1)):
        pool = HybridReqToTokenPool(2, 64, mamba_size=8, enable_mamba_extra_buffer=not cache_extra)
        with pytest.raises(ValueError, match="enable_mamba_extra_buffer"):
            UnifiedRadixCache(page_size=page, tree_components=(FULL, MAMBA),
                              token_to_kv_pool_allocator=TokenToKVPoolAllocator(64, page),
                              req_to_token_pool=pool, enable_mamba_extra_buffer=cache_extra)

    class PlainPool:                             # duck-typed, without the ping-pong API
        def __init__(self):
            inner = HybridReqToTokenPool(2, 64, mamba_size=8)
            self.req_to_token, self.free = inner.req_to_token, inner.free
            self.mamba_allocator = inner.mamba_allocator
    cache = UnifiedRadixCache(page_size=16, tree_components=(FULL, MAMBA),
                              token_to_kv_pool_allocator=TokenToKVPoolAllocator(64, 16),
                              req_to_token_pool=PlainPool(), enable_mamba_extra_buffer=True)
    with pytest.raises(TypeError, match="ping-pong track buffers"):
        cache.cache_finished_req(object())


# ---------------------------------------------------------------------- request path
def admit(env, prompt):
    """A scheduler's admission: match, a row, the request's own state slot, KV for
    the uncached part, the lock."""
    from flatradix import Req

    m = env.match(prompt)
    req = Req(origin_input_ids=list(prompt))
    req.req_pool_idx = env.pool.alloc(1)[0]
    req.mamba_pool_idx = int(env.ma.alloc(1)[0])
    n, p = len(prompt), m.device_prefix_len
    env.pool.write((req.req_pool_idx, slice(0, p)), m.device_indices)
    env.pool.write((req.req_pool_idx, slice(p, n)), env.alloc.alloc(n - p))
    req.prefix_indices, req.cache_protected_len = m.device_indices, p
    req.lock, req.last_node = env.cache.lock(m.last_device_node), m.last_device_node
    req.kv_committed_len = n
    return req, m


def test_finished_request_donates_its_state():
    env = Env()
    req, m = admit(env, range(10))
    own = req.mamba_pool_idx
    env.cache.release_kv_cache(req)
    assert env.cache.all_mamba_values_flatten().tolist() == [own]   # adopted, not copied
    assert req.mamba_pool_idx is None and req.req_pool_idx is None
    assert env.ma.available_size() == env.ma.size - 1
    req2, m2 = admit(env, range(10))
    assert m2.device_prefix_len == 10
    env.cache.release_kv_cache(req2)            # same key: the tree has a state (mamba_exist)
    assert env.cache.all_mamba_values_flatten().tolist() == [own]
    assert env.ma.available_size() == env.ma.size - 1   # req2's slot went back
    assert env.alloc.available_size() == 4096 - 10
    env.partition()


def test_running_request_forks_a_copy_and_keeps_its_own():
    env = Env()
    req, _ = admit(env, range(10))
    own = req.mamba_pool_idx
    assert env.cache.checkpoint(req, 10) == 10
    tree = env.cache.all_mamba_values_flatten().tolist()
    assert len(tree) == 1 and tree[0] != own and req.mamba_pool_idx == own
    assert env.cache.mamba_protected_size() == 1          # the request's new lock holds it
    env.cache.checkpoint(req, 10)                         # again: exists -> the fork is freed
    assert env.cache.all_mamba_values_flatten().tolist() == tree
    assert env.ma.available_size() == env.ma.size - 2
    env.caller.add(own)
    env.partition()
    env.cache.release_kv_cache(req, checkpoint=False)     # not checkpointed: own slot freed
    assert req.mamba_pool_idx is None and env.ma.available_size() == env.ma.size - 1
    env.caller.discard(own)
    env.partition()


def test_fork_on_a_full_state_pool_evicts_one_state():
    env = Env(states=2)
    env.ins([7, 7])                                      # a cached state (evictable leaf)
    req, _ = admit(env, range(6))                        # takes the last free slot
    assert env.ma.available_size() == 0
    env.cache.checkpoint(req, 6)
    assert env.match([7, 7]).device_prefix_len == 0      # evicted for the fork
    assert env.match(range(6)).device_prefix_len == 6
    env.caller.add(req.mamba_pool_idx)
    env.partition()


def test_request_without_a_state_is_refused_before_any_change():
    env = Env()
    req, _ = admit(env, range(6))
    env.ma.free([req.mamba_pool_idx])
    held = req.mamba_pool_idx
    before = snap(env)
    with pytest.raises(ValueError, match="is free in the state pool"):
        env.cache.release_kv_cache(req)
    req.mamba_pool_idx = None
    with pytest.raises(ValueError, match="holds none"):
        env.cache.checkpoint(req, 6)
    assert snap(env) == before and req.req_pool_idx is not None and held is not None


def test_disabled_mamba_cache_returns_the_request_state():
    alloc = TokenToKVPoolAllocator(64)
    pool = HybridReqToTokenPool(2, 16, mamba_size=2)
    cache = UnifiedRadixCache(tree_components=(FULL, MAMBA), token_to_kv_pool_allocator=alloc,
                              req_to_token_pool=pool, disable=True)
    from flatradix import Req

    req = Req(origin_input_ids=[1, 2, 3], req_pool_idx=pool.alloc(1)[0],
              mamba_pool_idx=int(pool.mamba_allocator.alloc(1)[0]), kv_committed_len=3)
    pool.write((req.req_pool_idx, slice(0, 3)), alloc.alloc(3))
    cache.release_kv_cache(req)
    assert pool.mamba_allocator.available_size() == 2 and alloc.available_size() == 64


def test_eagle_is_not_bigram_with_mamba():
    env = Env()
    cache = UnifiedRadixCache(tree_components=(FULL, MAMBA), is_eagle=True,
                              token_to_kv_pool_allocator=env.alloc, req_to_token_pool=env.pool)
    assert cache.is_eagle is False


# ---------------------------------------------------------------------- random run
@pytest.mark.parametrize("seed, cap", [(0, -1), (1, -1), (2, -1), (3, 1), (4, 2)])
def test_random_ops_keep_the_state_partition(seed, cap):
    """Seeded random insert / match / lock / unlock / evict (whole and step-wise);
    after every op: sanity_check and the exact three-way partition of the state
    pool, and every lock's release still succeeds (``cap``: the per-path cap)."""
    rng = np.random.default_rng(seed)
    env = Env(page=1, states=24, cap=cap)
    locks = []
    for _ in range(600):
        op = rng.integers(0, 7)
        toks = rng.integers(0, 4, size=rng.integers(1, 12)).tolist()
        if op <= 1:
            if env.ma.available_size() == 0:
                env.cache.evict(EvictParams(num_tokens=0, mamba_num=1))
            if env.ma.available_size() and env.alloc.available_size() >= len(toks):
                env.ins(toks)
        elif op == 2:
            m = env.match(toks)
            if m.device_prefix_len:
                assert env.cache.node_info(m.last_device_node)["mamba_value"] is not None
        elif op == 3:
            m = env.match(toks)
            skip = (MAMBA,) if rng.random() < 0.3 else ()
            locks.append(env.cache.lock(m.last_device_node, skip_lock_components=skip))
        elif op == 4 and locks:
            env.cache.unlock(locks.pop(rng.integers(0, len(locks))))
        elif op == 5:
            env.cache.evict(EvictParams(num_tokens=int(rng.integers(0, 6)),
                                        mamba_num=int(rng.integers(0, 3))))
        else:
            env.cache.evict_device_start(MAMBA, int(rng.integers(1, 4)))
            fk, fm = [], []
            for _ in range(4):
                st = env.cache.evict_device_next_node(MAMBA)
                if not st.made_progress:
                    break
                fk.append(np.asarray(st.freed_indices))
                fm.append(np.asarray(st.mamba_freed_indices))
            env.cache.evict_device_end(MAMBA)
            if fk:
                env.alloc.free(np.concatenate(fk))
                env.ma.free(np.concatenate(fm))
        env.partition()
    for lk in locks:
        env.cache.unlock(lk)
    assert env.cache.mamba_protected_size() == 0 and env.cache.protected_size() == 0
    env.cache.evict(EvictParams(num_tokens=10 ** 6))
    assert env.ma.available_size() == env.ma.size
    env.partition()


def test_mamba_part_of_a_lock_released_alone():
    """SGLang's lazy extra-buffer path releases only the Mamba part of a request's
    lock (a receipt that skips every other component), then marks MAMBA skipped
    so the final unlock releases the Full path alone."""
    import dataclasses

    env = Env()
    env.ins(range(6))
    lk = env.cache.lock(env.match(range(6)).last_device_node)
    assert (env.cache.protected_size(), env.cache.mamba_protected_size()) == (6, 1)
    env.cache.dec_lock_ref(lk.node, dataclasses.replace(lk.receipt,
                                                        skipped_lock_components=(FULL,)))
    assert (env.cache.protected_size(), env.cache.mamba_protected_size()) == (6, 0)
    r = env.cache.evict(EvictParams(num_tokens=0, mamba_num=1))   # Full-locked: tombstone
    assert (r.num_tokens_evicted, r.mamba_num_evicted) == (0, 1)
    lk.receipt.skipped_lock_components = (MAMBA,)
    env.cache.unlock(lk)
    assert (env.cache.protected_size(), env.cache.evictable_size()) == (0, 6)
    env.partition()


# ---------------------------------------------------------------------- FULL + SWA + MAMBA
def _triple(window=4, states=8):
    from flatradix import SWATokenToKVPoolAllocator

    alloc = SWATokenToKVPoolAllocator(size=256, size_swa=256, page_size=1)
    pool = HybridReqToTokenPool(2, 64, mamba_size=states)
    cache = UnifiedRadixCache(tree_components=(FULL, SWA, MAMBA), sliding_window_size=window,
                              token_to_kv_pool_allocator=alloc, req_to_token_pool=pool)
    return cache, alloc, pool.mamba_allocator


def test_triple_swa_tombstone_drops_the_state_and_release_swa_drops_the_mamba_lock():
    cache, alloc, ma = _triple()
    kv = alloc.alloc(8)
    cache.insert(InsertParams(key=RadixKey(list(range(8))), value=kv, mamba_value=ma.alloc(1)))
    # the leaf is capped at W=4 tokens of SWA data: [0..3] (SWA, no state) -> [4..7] (SWA, state)
    m = cache.match_prefix(MatchPrefixParams(key=RadixKey(list(range(8)))))
    assert m.device_prefix_len == 8
    lk = cache.lock(m.last_device_node)
    assert (cache.swa_protected_size(), cache.mamba_protected_size()) == (4, 1)
    cache.release_swa(lk)                   # the window and (lower priority) Mamba lock go
    assert (cache.swa_protected_size(), cache.mamba_protected_size()) == (0, 0)
    r = cache.evict(EvictParams(num_tokens=0, swa_num_tokens=8))
    # both nodes are Full-locked (not leaves): SWA tombstoned, the state with it
    assert (r.num_tokens_evicted, r.swa_num_tokens_evicted, r.mamba_num_evicted) == (0, 8, 1)
    assert ma.available_size() == 8 and cache.total_size() == (8, 0)
    cache.unlock(lk)                        # skips SWA and Mamba (released early)
    assert cache.protected_size() == 0
    cache.sanity_check()


def test_copy_on_write_temporary_lock_keeps_other_window_locks():
    """Issue 12's third reported bug: the copy-on-write's temporary lock (taken while
    a state is evicted for the request's slot) must be released with its own
    receipt -- its SWA boundary -- or the release walks to the root, takes other
    holders' window locks, and a later cascade eviction trips on lock_ref 0."""
    cache, alloc, ma = _triple(window=4, states=2)
    kv = alloc.alloc(12)
    cache.insert(InsertParams(key=RadixKey(list(range(12))), value=kv, mamba_value=ma.alloc(1)))
    kv2 = alloc.alloc(4)
    cache.insert(InsertParams(key=RadixKey([50, 51, 52, 53]), value=kv2, mamba_value=ma.alloc(1)))
    holder = cache.lock(cache.match_prefix(
        MatchPrefixParams(key=RadixKey(list(range(12))))).last_device_node)
    swa_locked = cache.swa_protected_size()
    assert ma.available_size() == 0
    req = _Req()
    m = cache.match_prefix(MatchPrefixParams(key=RadixKey(list(range(12))), cow_mamba=True,
                                             req=req))
    assert m.device_prefix_len == 12 and req.kv.mamba_pool_idx is not None
    assert cache.swa_protected_size() == swa_locked      # the holder's window still locked
    cache.sanity_check()
    cache.release_swa(holder)
    cache.unlock(holder)
    assert cache.protected_size() == 0 and cache.swa_protected_size() == 0
    r = cache.evict(EvictParams(num_tokens=100, swa_num_tokens=100, mamba_num=10))
    assert r.num_tokens_evicted == 12 and cache.total_size() == (0, 0)
    cache.sanity_check()


def test_zero_d_slots_as_sglang_pools_hold_them():
    """SGLang's HybridReqToTokenPool.alloc stores ``mamba_pool_idx = mid[0]``, a 0-d
    tensor; a 0-d ``mamba_value`` is one slot too (found by the oracle)."""
    import torch

    env = Env()
    kv = env.alloc.alloc(3)
    st = torch.tensor(int(env.ma.alloc(1)[0]))
    r = env.cache.insert(InsertParams(key=RadixKey([1, 2, 3]), value=kv, mamba_value=st))
    assert not r.mamba_exist and env.cache.all_mamba_values_flatten().tolist() == [int(st)]
    req, _ = admit(env, [1, 2, 3, 4])
    req.mamba_pool_idx = torch.tensor(req.mamba_pool_idx)
    own = int(req.mamba_pool_idx)
    env.cache.release_kv_cache(req)
    assert req.mamba_pool_idx is None and own in env.cache.all_mamba_values_flatten().tolist()
    env.partition()


# ---------------------------------------------------------------------- found by a fresh user
def test_a_slot_the_tree_holds_is_refused():
    env = Env()
    r, s = env.ins([1, 2, 3])
    kv = env.alloc.alloc(3)
    before = snap(env)
    with pytest.raises(ValueError, match="already cached by the tree"):
        env.cache.insert(InsertParams(key=RadixKey([4, 5, 6]), value=kv, mamba_value=[s]))
    assert snap(env) == before
    req, _ = admit(env, [7, 8, 9])
    env.ma.free([req.mamba_pool_idx])
    req.mamba_pool_idx = s                      # a request naming the tree's slot
    before = snap(env)
    with pytest.raises(ValueError, match="already cached by the tree"):
        env.cache.release_kv_cache(req)
    assert snap(env) == before
    # once evicted, the slot is free to be donated again
    env.cache.evict(EvictParams(num_tokens=100))
    env.cache.insert(InsertParams(key=RadixKey([4, 5, 6]), value=kv,
                                  mamba_value=env.ma.alloc(1)))
    env.cache.sanity_check()


def test_sanity_check_catches_a_slot_on_two_nodes():
    from flatradix import CacheInvariantError
    from flatradix.kernels import layout as L

    env = Env()
    env.ins([1, 2, 3])
    env.ins([4, 5, 6])
    nodes = env.cache._engine.st.nodes
    a, b = L.FIRST_SLOT, L.FIRST_SLOT + 1
    nodes[b, L.MAMBA_SLOT] = nodes[a, L.MAMBA_SLOT]
    with pytest.raises(CacheInvariantError, match="two nodes"):
        env.cache.sanity_check()


def test_batch_with_copy_on_write_runs_as_single_calls():
    env = Env(states=2)
    _, a = env.ins(range(4))
    _, b = env.ins([9, 9])
    req = _Req()
    res = env.cache.match_prefix_batch([MatchPrefixParams(key=RadixKey([9, 9])),
                                        MatchPrefixParams(key=RadixKey(list(range(4))),
                                                          cow_mamba=True, req=req)])
    assert [r.device_prefix_len for r in res] == [2, 4]
    # the pool was empty: one state is evicted for the request's slot while the
    # matched node (a's) is locked, so b's leaf goes
    assert int(req.kv.mamba_cow_src_index[0]) == a and int(req.kv.mamba_pool_idx) == b
    with pytest.raises(TypeError, match=r"params\[0\].cow_mamba"):
        env.cache.match_prefix_batch([MatchPrefixParams(key=RadixKey([1]), cow_mamba="yes",
                                                        req=_Req())])


def test_batch_release_names_the_component_that_underflows():
    env = Env()
    env.ins(range(4))
    lk = env.cache.lock(env.match(range(4)).last_device_node)
    before = snap(env)
    with pytest.raises(LockRefError, match=r"nodes\[1\]: FULL segment release hit lock_ref=0"):
        env.cache.unlock_batch([lk, lk])
    hold = env.cache.lock(env.match(range(4)).last_device_node,
                          skip_lock_components=(MAMBA,))
    with pytest.raises(LockRefError, match=r"nodes\[1\]: Mamba release hit lock_ref=0"):
        import dataclasses

        env.cache.dec_lock_ref_batch(
            [lk.node, lk.node], [lk.receipt, dataclasses.replace(lk.receipt)])
    env.cache.unlock_batch([lk, hold])
    assert snap(env) == before[:2] + (4, 0, 1, 0) + before[6:]


@pytest.mark.parametrize("bad, exc", [("x", TypeError), (0, ValueError), (-1, ValueError),
                                      (1.5, TypeError), (np.array([1, 2]), ValueError)])
def test_req_mamba_pool_idx_validated_at_construction(bad, exc):
    from flatradix import Req

    with pytest.raises(exc, match="mamba_pool_idx"):
        Req(origin_input_ids=[1], mamba_pool_idx=bad)


# ---------------------------------------------------------------- per-path cap
# ``mamba_max_states_per_path`` (SGLang ``MambaEvictExcessPathStates``, spec §6.3):
# after an insert attaches a state, the shallowest states beyond the cap on the
# root -> target path go (their Full KV stays), sparing the target, Mamba-locked
# nodes and nodes without exactly one child.

def _recorded_frees(env):
    freed = []
    free = env.ma.free

    def rec(idx):
        freed.extend(np.asarray(idx).reshape(-1).tolist())
        free(idx)
    env.ma.free = rec
    return freed


def test_path_cap_drops_the_shallowest_state_and_keeps_the_kv():
    env = Env(cap=2)
    _, s1 = env.ins(range(1, 5))
    _, s2 = env.ins(range(1, 9))
    assert sorted(env.cache.all_mamba_values_flatten().tolist()) == [s1, s2]
    freed = _recorded_frees(env)
    _, s3 = env.ins(range(1, 13))           # 3 states on the path > 2: depth 4's goes
    assert freed == [s1]
    assert sorted(env.cache.all_mamba_values_flatten().tolist()) == [s2, s3]
    assert env.cache.total_size() == (12, 2)          # every token's KV stays
    assert env.cache.evictable_size() == 12
    assert env.match(range(1, 5)).device_indices.size == 0   # no state at depth 4 now
    assert env.match(range(1, 9)).device_indices.size == 8
    env.partition()


def test_path_cap_spares_locked_and_branching_nodes_and_the_target():
    env = Env(cap=2)
    _, s1 = env.ins([1, 2, 3, 4])
    _, s2 = env.ins([1, 2, 3, 4, 5, 6])
    _, s3 = env.ins([1, 2, 3, 4, 7, 8])     # [1..4] now has two children; 2 states per path
    freed = _recorded_frees(env)
    _, s4 = env.ins([1, 2, 3, 4, 5, 6, 9])  # path: s1 (2 children), s2, s4 -> s2 goes
    assert freed == [s2]
    lk = env.cache.lock(env.match([1, 2, 3, 4, 5, 6, 9]).last_device_node)
    _, s5 = env.ins([1, 2, 3, 4, 5, 6, 9, 9])  # s1 branches, s4 locked: nothing to drop
    assert freed == [s2]
    assert sorted(env.cache.all_mamba_values_flatten().tolist()) == sorted([s1, s3, s4, s5])
    env.cache.unlock(lk)
    env.partition()


def test_path_cap_drops_several_shallowest_first():
    env = Env(cap=1)
    locks = []
    slots = []
    for n in (2, 4, 6):                     # each locked before the next insert: kept
        _, s = env.ins(range(n))
        slots.append(s)
        locks.append(env.cache.lock(env.match(range(n)).last_device_node))
    assert env.cache.mamba_protected_size() == 3
    for lk in locks:
        env.cache.unlock(lk)
    freed = _recorded_frees(env)
    _, s4 = env.ins(range(8))               # 4 states, cap 1: the three above go, top first
    assert freed == slots
    assert env.cache.all_mamba_values_flatten().tolist() == [s4]
    assert env.cache.mamba_evictable_size() == 1
    env.partition()


def test_path_cap_also_when_a_stateless_split_node_takes_a_state():
    env = Env(cap=1)
    _, s1 = env.ins(range(8))
    freed = _recorded_frees(env)
    r, s2 = env.ins(range(4))               # ends on the split's upper part: takes s2
    assert (r.prefix_len, r.mamba_exist) == (4, False)
    assert freed == []                      # s1 is deeper (below the target): not on its path
    _, s3 = env.ins(range(12))              # path: s2, s1, s3 -> s2 and s1 go, top first
    assert freed == [s2, s1]
    assert env.cache.all_mamba_values_flatten().tolist() == [s3]
    env.partition()


def test_path_cap_off_by_default_keeps_every_state():
    env = Env()
    slots = [env.ins(range(2 * k))[1] for k in range(1, 6)]
    assert sorted(env.cache.all_mamba_values_flatten().tolist()) == sorted(slots)
    assert env.cache.mamba_max_states_per_path == -1


# ---------------------------------------------------------------- (FULL, SWA, MAMBA) request path
def test_triple_request_path_caches_the_whole_key_with_its_state():
    """Page 1, no extra buffer: SWA's branching cut does not apply with Mamba (the
    state belongs to the whole key, SGLang's SWA component leaves the length to
    Mamba); the running request forks its state, slides its window out first,
    and the finished one donates its own."""
    from flatradix import Req

    cache, alloc, ma = _triple(window=4, states=8)
    pool = cache.req_to_token_pool
    req = Req(origin_input_ids=list(range(12)), output_ids=[])
    req.req_pool_idx = pool.alloc(1)[0]
    own = req.mamba_pool_idx = int(ma.alloc(1)[0])
    kv = alloc.alloc(12)
    pool.write((req.req_pool_idx, slice(0, 12)), kv)
    m = cache.match_prefix(MatchPrefixParams(key=RadixKey(list(range(12)))))
    req.prefix_indices, req.cache_protected_len = m.device_indices, 0
    req.lock, req.last_node = cache.lock(m.last_device_node), m.last_device_node
    req.kv_committed_len = 12
    req.swa_branching_seqlen = 4            # SWA alone would stop this insert at 4
    assert cache.checkpoint(req, 12) == 12
    assert req.cache_protected_len == 12 and req.swa_branching_seqlen == 4
    # out of the window before the insert: SWA slots [0, 11 - 4) go back
    assert req.swa_evicted_seqlen == 7
    assert alloc.swa_available_size() == 256 - 12 + 7
    tree = cache.all_mamba_values_flatten().tolist()
    assert len(tree) == 1 and tree[0] != own and req.mamba_pool_idx == own   # a fork
    assert cache.match_prefix(MatchPrefixParams(key=RadixKey(list(range(12))))) \
        .device_prefix_len == 12
    req.output_ids = [50, 51]
    pool.write((req.req_pool_idx, slice(12, 14)), alloc.alloc(2))
    req.kv_committed_len = 14
    cache.release_kv_cache(req)             # finished: its own state is adopted at 14
    assert sorted(cache.all_mamba_values_flatten().tolist()) == sorted(tree + [own])
    assert req.mamba_pool_idx is None and ma.available_size() == 8 - 2
    assert alloc.full_available_size() == 256 - 14
    assert cache.match_prefix(MatchPrefixParams(key=RadixKey(list(range(12)) + [50, 51]))) \
        .device_prefix_len == 14
    cache.sanity_check()


def test_triple_request_path_still_validates_swa_branching_seqlen():
    from flatradix import Req

    cache, alloc, ma = _triple(window=4, states=8)
    pool = cache.req_to_token_pool
    req = Req(origin_input_ids=list(range(8)), output_ids=[])
    req.req_pool_idx = pool.alloc(1)[0]
    req.mamba_pool_idx = int(ma.alloc(1)[0])
    pool.write((req.req_pool_idx, slice(0, 8)), alloc.alloc(8))
    m = cache.match_prefix(MatchPrefixParams(key=RadixKey(list(range(8)))))
    req.prefix_indices, req.cache_protected_len = m.device_indices, 0
    req.lock, req.last_node = cache.lock(m.last_device_node), m.last_device_node
    req.kv_committed_len = 8
    before = (alloc.full_available_size(), alloc.swa_available_size(), ma.available_size(),
              cache.total_size())
    for bad, exc in (("5", TypeError), (-3, ValueError)):
        req.swa_branching_seqlen = bad
        with pytest.raises(exc, match="swa_branching_seqlen"):
            cache.checkpoint(req, 8)
        assert (alloc.full_available_size(), alloc.swa_available_size(), ma.available_size(),
                cache.total_size()) == before
    req.swa_branching_seqlen = None
    assert cache.checkpoint(req, 8) == 8


def test_pool_clear_frees_the_state_slots_and_the_cap_is_read_only():
    env = Env(cap=2)
    env.ins(range(4))
    req, _ = admit(env, range(6))
    assert env.ma.available_size() == env.ma.size - 2
    env.cache.reset()                       # SGLang flush_cache: reset, then the pools
    env.pool.clear()
    assert env.ma.available_size() == env.ma.size
    assert env.pool.available_size() == env.pool.size
    with pytest.raises(AttributeError):
        env.cache.mamba_max_states_per_path = 1
    assert env.cache.mamba_max_states_per_path == 2



# ---------------------------------------------------------------- extra buffer request path
class ExtraEnv:
    """FULL+MAMBA at page 16 with the extra buffer (2-entry ping-pong track buffers)."""

    def __init__(self, states=16, chunk=64):
        from flatradix import Req

        self.alloc = TokenToKVPoolAllocator(4096, page_size=16)
        self.pool = HybridReqToTokenPool(4, 512, mamba_size=states,
                                         enable_mamba_extra_buffer=True)
        self.ma = self.pool.mamba_allocator
        self.cache = UnifiedRadixCache(
            page_size=16, tree_components=(FULL, MAMBA), token_to_kv_pool_allocator=self.alloc,
            req_to_token_pool=self.pool, mamba_cache_chunk_size=chunk,
            enable_mamba_extra_buffer=True)
        self.Req = Req

    def admit(self, prompt):
        req = self.Req(origin_input_ids=list(prompt), output_ids=[])
        req.req_pool_idx = self.pool.alloc(1)[0]
        assert self.pool.alloc_mamba(req)
        m = self.cache.match_prefix(MatchPrefixParams(key=RadixKey(list(prompt)[:-1])))
        req.prefix_indices, req.cache_protected_len = m.device_indices, m.device_prefix_len
        req.lock, req.last_node = self.cache.lock(m.last_device_node), m.last_device_node
        self.pool.write((req.req_pool_idx, slice(0, m.device_prefix_len)), m.device_indices)
        return req

    def grow(self, req, n):
        """Give the row KV up to ``n`` tokens (pages as a paged allocator does)."""
        have = req.kv_committed_len or req.cache_protected_len
        self.pool.write((req.req_pool_idx, slice(have, n)), self.alloc.alloc(n - have))
        req.kv_committed_len = n
        req.fill_ids = (list(req.origin_input_ids) + list(req.output_ids))[:n]

    @staticmethod
    def track(req, seqlen):
        """The model runner saved the state at ``seqlen`` into the next entry."""
        req.mamba_last_track_idx = req.mamba_next_track_idx
        req.mamba_next_track_idx = 1 - req.mamba_next_track_idx
        req.mamba_prev_track_seqlen, req.mamba_last_track_seqlen = req.mamba_last_track_seqlen, seqlen


def test_extra_buffer_running_request_donates_the_tracked_entry():
    env = ExtraEnv()
    req = env.admit(range(200))
    own, (e0, e1) = req.mamba_pool_idx, req.mamba_ping_pong_track_buffer.tolist()
    assert env.ma.available_size() == 16 - 3 and req.mamba_last_track_idx == 1
    env.grow(req, 128)
    assert env.cache.checkpoint(req, 128) == 0           # nothing tracked: nothing cached
    assert req.cache_protected_len == 0 and env.cache.total_size() == (0, 0)
    env.track(req, 128)                                  # into entry 0 (slot e0)
    assert env.cache.checkpoint(req, 128) == 128
    fresh = req.mamba_ping_pong_track_buffer[0]
    assert env.cache.all_mamba_values_flatten().tolist() == [e0]   # donated, not copied
    assert req.mamba_ping_pong_track_buffer.tolist() == [fresh, e1] and fresh not in (own, e0, e1)
    assert req.mamba_last_track_seqlen is None and req.cache_protected_len == 128
    assert env.ma.available_size() == 16 - 4
    assert env.cache.checkpoint(req, 128) == 0           # consumed: the next one caches nothing
    # finished at 200 tokens, the state tracked at 192 (entry 1, slot e1) is adopted
    env.grow(req, 200)
    env.track(req, 192)
    env.cache.release_kv_cache(req)
    assert sorted(env.cache.all_mamba_values_flatten().tolist()) == sorted([e0, e1])
    assert env.ma.available_size() == 16 - 2             # own and the fresh entry went back
    assert req.mamba_pool_idx is None and req.mamba_ping_pong_track_buffer is None
    assert env.cache.total_size() == (192, 2)            # the 8-token tail is not cached
    assert env.alloc.available_size() == 4096 - 192
    env.cache.sanity_check()


def test_extra_buffer_finish_past_the_latest_state_falls_back_to_the_previous():
    env = ExtraEnv()
    req = env.admit(range(100))
    env.grow(req, 100)
    env.track(req, 64)                                   # entry 0
    env.track(req, 128)                                  # entry 1: beyond the 100 tokens
    e0 = int(req.mamba_ping_pong_track_buffer[0])
    env.cache.release_kv_cache(req)                      # SGLang: the previous state, at 64
    assert env.cache.all_mamba_values_flatten().tolist() == [e0]
    assert env.cache.total_size() == (64, 1) and env.ma.available_size() == 16 - 1
    req = env.admit(range(100))                          # nothing tracked: all three go back
    env.grow(req, 100)
    env.cache.release_kv_cache(req)
    assert env.cache.total_size() == (64, 1) and env.ma.available_size() == 16 - 1
    env.cache.sanity_check()


def test_extra_buffer_node_with_a_state_frees_the_donated_one_and_abort_frees_all():
    env = ExtraEnv()
    a = env.admit(range(80))
    env.grow(a, 80)
    env.track(a, 64)
    env.cache.release_kv_cache(a)                        # the tree: [0..64) with a state
    b = env.admit(range(80))
    assert b.cache_protected_len == 64
    env.grow(b, 80)
    env.track(b, 64)                                     # the same checkpoint again
    e0 = int(b.mamba_ping_pong_track_buffer[0])
    before = env.ma.available_size()
    assert env.cache.checkpoint(b, 80) == 64
    # mamba_exist: the donated state is freed, the fresh one stays in the entry
    assert env.ma.available_size() == before and not env.ma.is_held([e0])[0]
    env.cache.release_kv_cache(b, checkpoint=False)      # abort: own and both entries back
    assert env.ma.available_size() == 16 - 1 and env.cache.total_size() == (64, 1)
    env.cache.sanity_check()


def test_extra_buffer_bad_track_fields_change_nothing():
    env = ExtraEnv()
    req = env.admit(range(100))
    env.grow(req, 100)
    env.track(req, 64)
    before = (env.ma.available_size(), env.alloc.available_size(), env.cache.total_size(),
              req.mamba_ping_pong_track_buffer.tolist())
    for field, value, exc, msg in (
            ("mamba_last_track_seqlen", 128, ValueError, "exceeds the 100 tokens"),
            ("mamba_last_track_seqlen", -1, ValueError, "mamba_last_track_seqlen"),
            ("mamba_last_track_idx", 2, ValueError, "not an entry"),
            ("mamba_ping_pong_track_buffer", None, ValueError, "holds 2 track slots"),
            ("mamba_ping_pong_track_buffer", np.array([[1, 2]]), ValueError, "must be 1-D"),
            ("mamba_ping_pong_empty", None, ValueError, "mamba_ping_pong_empty"),
            ("mamba_ping_pong_empty", [False], ValueError, "mamba_ping_pong_empty")):
        saved = getattr(req, field)
        setattr(req, field, value)
        with pytest.raises(exc, match=msg):
            env.cache.checkpoint(req, 100)
        setattr(req, field, saved)
        assert (env.ma.available_size(), env.alloc.available_size(), env.cache.total_size(),
                req.mamba_ping_pong_track_buffer.tolist()) == before
    freed = int(req.mamba_ping_pong_track_buffer[0])
    env.ma.free([freed])                                 # an entry the pool does not hold
    with pytest.raises(ValueError, match="is free in the state pool"):
        env.cache.checkpoint(req, 100)
    env.ma.alloc(1)


def test_alloc_mamba_is_all_or_nothing():
    pool = HybridReqToTokenPool(2, 16, mamba_size=2, enable_mamba_extra_buffer=True)
    from flatradix import Req

    req = Req(origin_input_ids=[1, 2])
    assert pool.alloc_mamba(req) is False               # 3 slots needed, 2 in the pool
    assert pool.mamba_allocator.available_size() == 2 and req.mamba_pool_idx is None
    with pytest.raises(ValueError, match="mamba_ping_pong_track_buffer_size"):
        HybridReqToTokenPool(2, 16, mamba_size=2, mamba_ping_pong_track_buffer_size=3)



def test_triple_extra_buffer_keeps_the_window_behind_the_tracked_state():
    """SGLang ``swa_retain_floor``: with a tracked state at ``t`` the SWA slide
    stops at ``t - W`` (a later match may land on that checkpoint and needs its
    window); without one it goes to ``pre_len - W`` (page 1)."""
    from flatradix import Req, SWATokenToKVPoolAllocator

    alloc = SWATokenToKVPoolAllocator(size=256, size_swa=256, page_size=1)
    pool = HybridReqToTokenPool(2, 64, mamba_size=8, enable_mamba_extra_buffer=True)
    cache = UnifiedRadixCache(tree_components=(FULL, SWA, MAMBA), sliding_window_size=4,
                              token_to_kv_pool_allocator=alloc, req_to_token_pool=pool,
                              mamba_cache_chunk_size=8, enable_mamba_extra_buffer=True)
    reqs = []
    for tracked in (None, 8):
        req = Req(origin_input_ids=list(range(100, 120)) if tracked else list(range(20)),
                  output_ids=[], cache_protected_len=0, kv_committed_len=20)
        req.req_pool_idx = pool.alloc(1)[0]
        assert pool.alloc_mamba(req)
        pool.write((req.req_pool_idx, slice(0, 20)), alloc.alloc(20))
        if tracked:
            ExtraEnv.track(req, tracked)
        cache.evict_sliding_windows(req, 19)
        reqs.append(req)
    assert [r.swa_evicted_seqlen for r in reqs] == [15, 4]
    assert alloc.swa_available_size() == 256 - 40 + 15 + 4
    # the checkpoint caches [0, 8) with the tracked state; the window behind it is live
    req = reqs[1]
    m = cache.match_prefix(MatchPrefixParams(key=RadixKey(list(range(100, 120)))))
    req.lock, req.last_node = cache.lock(m.last_device_node), m.last_device_node
    assert cache.checkpoint(req, 20) == 8
    assert cache.match_prefix(MatchPrefixParams(key=RadixKey(list(range(100, 108))))) \
        .device_prefix_len == 8
    bad = reqs[0]
    bad.mamba_last_track_seqlen = "8"
    before = (alloc.swa_available_size(), alloc.full_available_size(), cache.total_size())
    with pytest.raises(TypeError, match="mamba_last_track_seqlen"):
        cache.checkpoint(bad, 20)
    assert bad.swa_evicted_seqlen == 15
    assert (alloc.swa_available_size(), alloc.full_available_size(), cache.total_size()) == before
    cache.sanity_check()



def test_extra_buffer_entries_and_tracked_lengths_validated_before_any_change():
    """A fresh user's findings: every ping-pong entry is checked (not only the
    donated one), a tracked length below the cached prefix or off the page grid
    is refused, and an abort validates before it frees anything."""
    env = ExtraEnv()
    a = env.admit(range(140))
    env.grow(a, 140)
    env.track(a, 128)
    env.cache.release_kv_cache(a)                        # the tree: [0..128) with a state
    tree_slot = env.cache.all_mamba_values_flatten().tolist()[0]
    b = env.admit(range(140))
    assert b.cache_protected_len == 128
    env.grow(b, 140)

    def snapshot():
        return (env.ma.available_size(), env.alloc.available_size(), env.cache.total_size(),
                b.mamba_ping_pong_track_buffer.tolist(), b.mamba_pool_idx, b.cache_protected_len)
    before = snapshot()
    e0, e1 = b.mamba_ping_pong_track_buffer.tolist()
    cases = [  # (fields, message, also refused by an abort, which caches nothing)
        (dict(mamba_last_track_seqlen=64, mamba_last_track_idx=0), "below req.cache_protected_len",
         False),
        (dict(mamba_last_track_seqlen=136, mamba_last_track_idx=0), "not a multiple of page_size",
         False),
        (dict(mamba_ping_pong_track_buffer=np.array([e0, tree_slot])), "already cached by the tree",
         True),
        (dict(mamba_ping_pong_track_buffer=np.array([e0, e0])), "another entry", True),
        (dict(mamba_ping_pong_track_buffer=np.array([b.mamba_pool_idx, e1])), "own state", True),
    ]
    for fields, msg, abort in cases:
        saved = {k: getattr(b, k) for k in fields}
        for k, v in fields.items():
            setattr(b, k, v)
        calls = [lambda: env.cache.checkpoint(b, 140), lambda: env.cache.release_kv_cache(b)]
        if abort:
            calls.append(lambda: env.cache.release_kv_cache(b, checkpoint=False))
        for call in calls:
            with pytest.raises(ValueError, match=msg):
                call()
            assert snapshot()[:3] == before[:3] and b.mamba_pool_idx == before[4]
        for k, v in saved.items():
            setattr(b, k, v)
        assert snapshot() == before
    env.track(b, 128)
    env.cache.release_kv_cache(b)                        # valid again: cached, all freed
    assert env.ma.available_size() == 16 - 1
    env.cache.sanity_check()


def test_ping_pong_pool_api_refusals():
    from flatradix import Req

    pool = HybridReqToTokenPool(2, 16, mamba_size=8, enable_mamba_extra_buffer=True)
    with pytest.raises(TypeError, match="req must be a Req"):
        pool.alloc_mamba(None)
    req = Req(origin_input_ids=[1, 2])
    assert pool.alloc_mamba(req) and pool.mamba_allocator.available_size() == 5
    for bad in ("0", 5, -1, True):
        with pytest.raises(ValueError, match="mamba_ping_pong_track_buffer_to_keep"):
            pool.free_mamba_cache(req, bad)
    assert pool.mamba_allocator.available_size() == 5 and req.mamba_pool_idx is not None
    with pytest.raises(ValueError, match="one state slot"):
        pool.donate_mamba_ping_pong_slot(req, np.array([], dtype=np.int64))
    pool.free_mamba_cache(req, 1)
    assert pool.mamba_allocator.available_size() == 7    # entry 1 kept (the tree's now)


# ---------------------------------------------------------------- lazy extra buffer
class LazyEnv(ExtraEnv):
    """``ExtraEnv`` with SGLang's lazy extra buffer: one track slot at admission."""

    def __init__(self, states=16, chunk=64):
        from flatradix import Req

        self.alloc = TokenToKVPoolAllocator(4096, page_size=16)
        self.pool = HybridReqToTokenPool(4, 512, mamba_size=states, enable_mamba_extra_buffer=True,
                                         enable_mamba_extra_buffer_lazy=True)
        self.ma = self.pool.mamba_allocator
        self.cache = UnifiedRadixCache(
            page_size=16, tree_components=(FULL, MAMBA), token_to_kv_pool_allocator=self.alloc,
            req_to_token_pool=self.pool, mamba_cache_chunk_size=chunk,
            enable_mamba_extra_buffer=True, enable_mamba_extra_buffer_lazy=True)
        self.Req = Req

    def track_decode(self, req, seqlen):
        """A decode step at a track boundary, as SGLang's lazy scheduler runs it: a
        slot for the empty entry (none when the pool is empty: in place), the
        state written there, the entry it stopped tracking freed and emptied."""
        other = 1 - req.mamba_next_track_idx
        got = self.ma.alloc(1)
        if got is not None:
            self.pool.set_mamba_ping_pong_slot(req, other, got)
            req.mamba_next_track_idx = other
        req.mamba_last_track_idx = req.mamba_next_track_idx
        req.mamba_last_track_seqlen = seqlen
        old = 1 - req.mamba_next_track_idx
        if not req.mamba_ping_pong_empty[old]:
            self.ma.free(req.mamba_ping_pong_track_buffer[old:old + 1])
            self.pool.set_mamba_ping_pong_slot(req, old, -1)


def test_lazy_pool_gives_one_track_slot_and_fills_the_other_on_demand():
    env = LazyEnv()
    assert env.pool.mamba_initial_tracking_slots == 1
    req = env.admit(range(100))
    e0 = int(req.mamba_ping_pong_track_buffer[0])
    assert req.mamba_ping_pong_track_buffer.tolist() == [e0, -1]
    assert req.mamba_ping_pong_empty == [False, True]
    assert (req.mamba_next_track_idx, req.mamba_last_track_idx) == (0, 0)
    assert env.ma.available_size() == 16 - 2               # own + one track slot
    env.grow(req, 64)
    env.track_decode(req, 64)                              # entry 1 filled, entry 0 emptied
    e1 = int(req.mamba_ping_pong_track_buffer[1])
    assert req.mamba_ping_pong_track_buffer.tolist() == [-1, e1] and e1 != e0
    assert req.mamba_ping_pong_empty == [True, False] and req.mamba_last_track_idx == 1
    assert env.ma.available_size() == 16 - 2 and not env.ma.is_held([e0])[0]
    assert env.cache.checkpoint(req, 64) == 64             # donates entry 1, a fresh slot in
    assert env.cache.all_mamba_values_flatten().tolist() == [e1]
    assert req.mamba_ping_pong_empty == [True, False] and env.ma.available_size() == 16 - 3
    env.grow(req, 100)
    env.cache.release_kv_cache(req)                        # nothing tracked since: all back
    assert env.ma.available_size() == 16 - 1 and env.cache.total_size() == (64, 1)
    env.cache.sanity_check()
    # the non-lazy pool is unchanged: two track slots up front
    assert HybridReqToTokenPool(2, 16, mamba_size=4, enable_mamba_extra_buffer=True) \
        .mamba_initial_tracking_slots == 2


def _full_pool_with_one_cached_state(env):
    """The tree holds [0, 64) with one state; a running request matched it (its
    lock holds that state) and tracked a state at 128; the state pool is empty."""
    a = env.admit(range(100))
    env.grow(a, 100)
    env.track_decode(a, 64)
    env.cache.release_kv_cache(a)
    req = env.admit(range(200))
    assert req.cache_protected_len == 64
    env.grow(req, 128)
    env.track_decode(req, 128)
    env.ma.alloc(env.ma.available_size())                  # other requests took the rest
    return req


def test_lazy_fork_on_an_empty_pool_releases_the_request_mamba_lock_first():
    # SGLang MambaComponent._alloc_mamba_slot with the lazy buffer: the request's
    # own matched state (its only evictable candidate) is evicted for its fork
    env = LazyEnv(states=4)
    req = _full_pool_with_one_cached_state(env)
    old = req.last_node
    assert env.cache.mamba_evictable_size() == 0           # locked by the request
    assert env.cache.checkpoint(req, 128) == 128
    assert env.cache.mamba_evictable_size() == 0 and env.cache.mamba_protected_size() == 1
    assert env.cache.total_size()[1] == 1                  # [0,64)'s state evicted, [64,128)'s new
    assert env.cache.match_prefix(MatchPrefixParams(key=RadixKey(list(range(64))))) \
        .device_prefix_len == 0                            # no state left at 64
    assert req.last_node != old
    env.cache.sanity_check()
    env.grow(req, 200)
    env.cache.release_kv_cache(req)                        # the receipt skip: no double release
    env.cache.sanity_check()
    assert env.cache.protected_size() == 0 and env.cache.mamba_protected_size() == 0


def test_non_lazy_fork_on_the_same_empty_pool_finds_nothing_evictable():
    env = ExtraEnv(states=5)
    a = env.admit(range(100))
    env.grow(a, 100)
    env.track(a, 64)
    env.cache.release_kv_cache(a)
    req = env.admit(range(200))
    env.grow(req, 128)
    env.track(req, 128)
    env.ma.alloc(env.ma.available_size())
    before = snap(env)
    with pytest.raises(RuntimeError, match="no state is evictable"):
        env.cache.checkpoint(req, 128)
    assert snap(env) == before


def test_lazy_lock_release_skips_a_lock_without_its_mamba_part():
    env = LazyEnv(states=4)
    req = _full_pool_with_one_cached_state(env)
    env.cache.unlock(req.lock)                             # re-lock as a decode hold
    req.lock = env.cache.lock(req.last_node, skip_lock_components=(MAMBA,))
    assert env.cache.mamba_evictable_size() == 1
    assert env.cache.checkpoint(req, 128) == 128           # evicts the unlocked state
    assert env.cache.total_size()[1] == 1
    env.grow(req, 200)
    env.cache.release_kv_cache(req)
    env.cache.sanity_check()
    assert env.cache.protected_size() == 0 and env.cache.mamba_protected_size() == 0


def test_set_mamba_ping_pong_slot_refusals_change_nothing():
    env = LazyEnv()
    req = env.admit(range(40))
    own, e0 = req.mamba_pool_idx, int(req.mamba_ping_pong_track_buffer[0])
    stranger = env.ma.alloc(1)
    free = int(env.ma.alloc(1)[0])
    env.ma.free(np.array([free]))
    with pytest.raises(TypeError, match="idx must be an int"):
        env.pool.set_mamba_ping_pong_slot(req, True, stranger)
    for idx, value, msg in ((2, stranger, "track entry 0..1"),
                            (1, free, "not handed out"), (1, 0, "outside the state pool"),
                            (1, 99, "outside the state pool"), (1, own, "already the request"),
                            (1, e0, "already the request"), (1, np.array([1, 2]), "one state slot")):
        with pytest.raises(ValueError, match=msg):
            env.pool.set_mamba_ping_pong_slot(req, idx, value)
        assert req.mamba_ping_pong_track_buffer.tolist() == [e0, -1]
        assert req.mamba_ping_pong_empty == [False, True]
    with pytest.raises(ValueError, match="no track buffer"):
        env.pool.set_mamba_ping_pong_slot(env.Req(origin_input_ids=[1]), 0, stranger)


@pytest.mark.parametrize("pool_kw, cache_kw, msg", [
    (dict(enable_mamba_extra_buffer_lazy=True), {}, "needs enable_mamba_extra_buffer=True"),
    (dict(enable_mamba_extra_buffer=True, enable_mamba_extra_buffer_lazy=True,
          mamba_ping_pong_track_buffer_size=1), {}, "track_buffer_size=2"),
    (dict(enable_mamba_extra_buffer=True), dict(enable_mamba_extra_buffer=True,
                                                enable_mamba_extra_buffer_lazy=True),
     "req_to_token_pool was built with enable_mamba_extra_buffer_lazy=False"),
    (dict(enable_mamba_extra_buffer=True, enable_mamba_extra_buffer_lazy=True),
     dict(enable_mamba_extra_buffer=True), "enable_mamba_extra_buffer_lazy=False but"),
    (dict(), dict(enable_mamba_extra_buffer_lazy=True), "needs ComponentType.MAMBA and"),
])
def test_lazy_flag_refused_where_it_does_not_apply(pool_kw, cache_kw, msg):
    with pytest.raises(ValueError, match=msg):
        pool = HybridReqToTokenPool(2, 64, mamba_size=4, **pool_kw)
        UnifiedRadixCache(page_size=16, tree_components=(FULL, MAMBA), req_to_token_pool=pool,
                          token_to_kv_pool_allocator=TokenToKVPoolAllocator(256, page_size=16),
                          **cache_kw)
    with pytest.raises(ValueError, match="needs ComponentType.MAMBA"):
        UnifiedRadixCache(page_size=16, enable_mamba_extra_buffer_lazy=True)


def test_ping_pong_helpers_refuse_what_would_lose_or_share_a_slot():
    # fresh-user findings: filling a filled entry lost its slot; donate checked
    # nothing; free_mamba_cache freed the own slot before failing on an entry
    env = LazyEnv()
    req = env.admit(range(100))
    own, e0 = int(req.mamba_pool_idx), int(req.mamba_ping_pong_track_buffer[0])
    s = env.ma.alloc(1)
    before = (req.mamba_ping_pong_track_buffer.tolist(), list(req.mamba_ping_pong_empty),
              env.ma.available_size())
    with pytest.raises(ValueError, match="holds slot"):
        env.pool.set_mamba_ping_pong_slot(req, 0, s)
    with pytest.raises(ValueError, match="empty already"):
        env.pool.set_mamba_ping_pong_slot(req, 1, -1)
    with pytest.raises(TypeError, match="idx"):
        env.pool.set_mamba_ping_pong_slot(req, "1", s)
    for bad, msg in ((np.array([-1]), "outside"), (np.array([999]), "outside"),
                     (own, "already the request"), (e0, "entry's own")):
        with pytest.raises(ValueError, match=msg):
            env.pool.donate_mamba_ping_pong_slot(req, bad)
    req.mamba_ping_pong_empty = tuple(req.mamba_ping_pong_empty)
    with pytest.raises(ValueError, match="mamba_ping_pong_empty must be a list"):
        env.pool.set_mamba_ping_pong_slot(req, 1, s)
    req.mamba_ping_pong_empty = list(req.mamba_ping_pong_empty)
    assert (req.mamba_ping_pong_track_buffer.tolist(), list(req.mamba_ping_pong_empty),
            env.ma.available_size()) == before
    assert env.pool.donate_mamba_ping_pong_slot(req, int(s[0])).tolist() == [e0]  # an int works
    env.ma.free(np.array([e0]))
    # an entry freed elsewhere: the whole free is refused, the own slot kept
    env.ma.free(req.mamba_ping_pong_track_buffer[0:1])
    with pytest.raises(ValueError, match="double free"):
        env.pool.free_mamba_cache(req)
    assert req.mamba_pool_idx == own and env.ma.is_held([own])[0]
