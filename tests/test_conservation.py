"""KV conservation over a long scheduler-style run: after every step,
allocator available + evictable + protected + slots owned by running requests
(their rows past ``cache_protected_len``) == pool size; once every request has
finished, available + evictable + protected == pool size exactly.

The run admits requests (match + lock + alloc of the uncached tail, evicting
when short), grows running requests (cache_unfinished_req), finishes them
(cache_finished_req, or is_insert=False aborts), over shared system prompts and
multi-turn continuations, at page sizes 1 and 16.
"""

import numpy as np
import pytest

from flatradix import (
    EvictParams, MatchPrefixParams, RadixKey, Req, ReqToTokenPool, TokenToKVPoolAllocator,
    UnifiedRadixCache,
)

POOL = 4096


def owned(req):
    protected = req.cache_protected_len
    if protected is None:
        protected = len(req.prefix_indices)
    return req.kv_committed_len - protected


def conserve(cache, alloc, running=()):
    held = sum(owned(r) for r in running)
    assert alloc.available_size() + cache.evictable_size() + cache.protected_size() + held == POOL


def admit(cache, alloc, rtp, tokens, rng, **ns):
    req = Req(origin_input_ids=tokens, **ns)
    m = cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens, **ns)))
    plen = m.device_prefix_len
    need = len(tokens) - plen
    cache.inc_lock_ref(m.last_device_node)
    slots = alloc.alloc(need)
    if slots is None:
        cache.evict(EvictParams(num_tokens=need - alloc.available_size()))
        slots = alloc.alloc(need)
    row = rtp.alloc(1) if slots is not None else None
    if slots is None or row is None:
        cache.dec_lock_ref(m.last_device_node)
        if slots is not None:
            alloc.free(slots)
        return None
    req.req_pool_idx = row[0]
    req.prefix_indices = m.device_indices
    req.last_node = m.last_device_node
    rtp.write((row[0], slice(0, plen)), m.device_indices)
    rtp.write((row[0], slice(plen, len(tokens))), slots)
    req.kv_committed_len = len(tokens)
    return req


def decode(cache, alloc, rtp, req, n, next_tok):
    """Generate n tokens: allocate their slots (evicting when short)."""
    have = req.kv_committed_len
    if have + n > rtp.max_context_len:
        return False
    slots = alloc.alloc(n)
    if slots is None:
        cache.evict(EvictParams(num_tokens=n - alloc.available_size()))
        slots = alloc.alloc(n)
        if slots is None:
            return False
    rtp.write((req.req_pool_idx, slice(have, have + n)), slots)
    req.output_ids = list(req.output_ids) + list(range(next_tok, next_tok + n))
    req.fill_ids = list(req.origin_input_ids) + list(req.output_ids)
    req.kv_committed_len = have + n
    return True


@pytest.mark.slow
@pytest.mark.parametrize("page_size", [1, 16])
def test_kv_conservation_100k_steps(page_size):
    rng = np.random.default_rng(page_size)
    alloc = TokenToKVPoolAllocator(POOL)
    rtp = ReqToTokenPool(64, 1024)
    cache = UnifiedRadixCache(page_size=page_size, token_to_kv_pool_allocator=alloc,
                              req_to_token_pool=rtp)
    systems = [list(rng.integers(0, 50, size=int(rng.integers(8, 200)))) for _ in range(6)]
    finished_prompts = []
    running = []
    next_tok = 10_000
    steps = 100_000 if page_size == 1 else 30_000
    for step in range(steps):
        op = rng.random()
        if op < 0.35 and len(running) < 48:
            if finished_prompts and rng.random() < 0.5:
                base = finished_prompts[int(rng.integers(len(finished_prompts)))]
            else:
                base = systems[int(rng.integers(len(systems)))]
            tail = list(rng.integers(0, 50, size=int(rng.integers(1, 64))))
            ns = {"extra_key": "lora1"} if rng.random() < 0.1 else {}
            req = admit(cache, alloc, rtp, list(base) + tail, rng, **ns)
            if req is not None:
                running.append(req)
        elif op < 0.7 and running:
            req = running[int(rng.integers(len(running)))]
            if decode(cache, alloc, rtp, req, int(rng.integers(1, 24)), next_tok):
                next_tok += 24
                if rng.random() < 0.3:
                    cache.cache_unfinished_req(req)
        elif running:
            req = running.pop(int(rng.integers(len(running))))
            if rng.random() < 0.9:
                cache.cache_finished_req(req)
                if len(finished_prompts) < 200:
                    finished_prompts.append(list(req.origin_input_ids) + list(req.output_ids))
            else:
                cache.cache_finished_req(req, is_insert=False)
        conserve(cache, alloc, running)
        if step % 5000 == 0:
            cache.sanity_check()
    while running:
        cache.cache_finished_req(running.pop())
        conserve(cache, alloc, running)
    conserve(cache, alloc)
    assert cache.protected_size() == 0
    cache.sanity_check()
    cache.evict(EvictParams(num_tokens=POOL))
    assert cache.total_size()[0] == 0
    assert alloc.available_size() == POOL
    assert rtp.available_size() == rtp.size
