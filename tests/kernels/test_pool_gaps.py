"""The key/value pool's gap passes (``Engine._start_gap_pass``, ``kernels/state.py:
pool_gaps``): when the pool's top reaches its end, new spans go into the dead gaps
left by evicted nodes (next fit) instead of compacting, which copies every live
span. Hand-worked layouts: which offsets the new spans take, that live spans do
not move, that a pool whose gaps are all too short still compacts, and that the
tree's keys, values and KV events are those of a cache that never reused a row.
"""

import numpy as np
import pytest

from flatradix import EvictParams, InsertParams, MatchPrefixParams, RadixKey, UnifiedRadixCache
from flatradix.errors import CacheInvariantError
from flatradix.events import BlockRemoved, BlockStored
from flatradix.kernels import layout as L


def _key(i, n):
    return list(range(1000 * i, 1000 * i + n))


def _cache(**kw):
    # page 1, a 64-row pool (the smallest the engine keeps), no allocator: values
    # are the caller's own numbers
    return UnifiedRadixCache(page_size=1, pool_capacity=64, **kw)


def _insert(c, i, n):
    c.insert(InsertParams(key=RadixKey(_key(i, n)), value=np.arange(n, dtype=np.int64) + 100 * i))


def _offset(c, i, n):
    """Pool offset of the node holding key ``i``."""
    m = c.match_prefix(MatchPrefixParams(key=RadixKey(_key(i, n))))
    assert m.device_prefix_len == n
    eng = c._engine
    return int(eng.st.nodes[int(m.last_device_node) & 0xFFFFFFFF, L.KEY_OFF])


def _values(c, i, n):
    m = c.match_prefix(MatchPrefixParams(key=RadixKey(_key(i, n))))
    return m.device_prefix_len, np.asarray(m.device_indices).tolist()


def _touch(c, *keys):
    for i, n in keys:
        assert c.match_prefix(MatchPrefixParams(key=RadixKey(_key(i, n)))).device_prefix_len == n


def test_a_new_span_fills_the_evicted_rows_and_live_spans_stay_put():
    c = _cache()
    for i in range(4):  # A..D: rows [0,16) [16,32) [32,48) [48,64): the pool is full
        _insert(c, i, 16)
    assert [_offset(c, i, 16) for i in range(4)] == [0, 16, 32, 48]
    _touch(c, (2, 16), (3, 16))  # A and B are now the least recently used
    assert c.evict(EvictParams(num_tokens=32)).num_tokens_evicted == 32
    _insert(c, 4, 16)  # E: the pool's top is at its end; A's rows are dead
    _insert(c, 5, 16)  # F: B's rows, the same gap
    eng = c._engine
    assert (eng.gap_passes, eng.compactions) == (1, 0)
    assert [_offset(c, i, 16) for i in (2, 3, 4, 5)] == [32, 48, 0, 16]
    meta = eng.st.meta
    assert (int(meta[L.M_POOL_TOP]), int(meta[L.M_POOL_DEAD])) == (64, 0)
    assert eng.st.pool.shape[0] == 64  # no growth, nothing copied
    for i in (2, 3, 4, 5):
        assert _values(c, i, 16) == (16, list(range(100 * i, 100 * i + 16)))
    for i in (0, 1):
        assert _values(c, i, 16) == (0, [])
    c.sanity_check()


def test_next_fit_skips_a_gap_too_short_for_the_span():
    c = _cache()
    sizes = {0: 8, 1: 16, 2: 8, 3: 16, 4: 16}  # A B C D E: [0,8) [8,24) [24,32) [32,48) [48,64)
    for i, n in sizes.items():
        _insert(c, i, n)
    _touch(c, (1, 16), (2, 8), (4, 16))  # LRU order: A, D, then the touched ones
    assert c.evict(EvictParams(num_tokens=24)).num_tokens_evicted == 24  # A and D
    _insert(c, 5, 8)   # F (8): the first gap [0, 8)
    _insert(c, 6, 16)  # G (16): the cursor's gap is used up; the next one, [32, 48)
    assert [_offset(c, i, n) for i, n in ((5, 8), (6, 16))] == [0, 32]
    assert [_offset(c, i, sizes[i]) for i in (1, 2, 4)] == [8, 24, 48]
    assert (c._engine.gap_passes, c._engine.compactions) == (1, 0)
    for i, n in ((1, 16), (2, 8), (4, 16), (5, 8), (6, 16)):
        assert _values(c, i, n) == (n, list(range(100 * i, 100 * i + n)))
    c.sanity_check()


def test_gaps_all_shorter_than_the_span_compact_instead():
    c = _cache()
    for i in range(8):  # eight spans of 8 rows fill the pool
        _insert(c, i, 8)
    _touch(c, (1, 8), (3, 8), (5, 8), (7, 8))
    assert c.evict(EvictParams(num_tokens=32)).num_tokens_evicted == 32  # 0, 2, 4, 6
    _insert(c, 8, 16)  # four 8-row gaps: none holds 16 rows
    eng = c._engine
    assert (eng.gap_passes, eng.compactions) == (0, 1)
    # compaction packed the survivors in pool order, then the new span went on top
    assert [_offset(c, i, 8) for i in (1, 3, 5, 7)] == [0, 8, 16, 24]
    assert _offset(c, 8, 16) == 32
    assert int(eng.st.meta[L.M_POOL_TOP]) == 48
    for i, n in ((1, 8), (3, 8), (5, 8), (7, 8), (8, 16)):
        assert _values(c, i, n) == (n, list(range(100 * i, 100 * i + n)))
    c.sanity_check()


def test_removed_events_name_the_evicted_pages_before_their_rows_are_reused():
    c = _cache(enable_kv_cache_events=True)
    for i in range(4):
        _insert(c, i, 16)
    stored = {}
    for e in c.take_events():
        if isinstance(e, BlockStored):
            stored[tuple(e.token_ids)] = list(e.block_hashes)
    _touch(c, (2, 16), (3, 16))
    c.evict(EvictParams(num_tokens=32))
    _insert(c, 4, 16)  # reuses A's rows (its page hashes are overwritten)
    ev = c.take_events()
    removed = [h for e in ev if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert sorted(removed) == sorted(stored[tuple(_key(0, 16))] + stored[tuple(_key(1, 16))])
    new = [e for e in ev if isinstance(e, BlockStored)]
    assert len(new) == 1 and new[0].token_ids == _key(4, 16)
    assert c._engine.gap_passes == 1
    # what a router that applied every event believes is cached is the tree
    assert c._sink.block_hashes() == set(stored[tuple(_key(2, 16))] + stored[tuple(_key(3, 16))]
                                        + list(new[0].block_hashes))


@pytest.mark.parametrize("corrupt", ["cursor_in_live_span", "cursor_off_top"])
def test_sanity_check_sees_a_cursor_over_live_rows(corrupt):
    c = _cache()
    for i in range(2):
        _insert(c, i, 16)
    c.sanity_check()
    meta = c._engine.st.meta
    if corrupt == "cursor_in_live_span":  # a gap that would overwrite key 1's rows
        meta[L.M_POOL_CUR], meta[L.M_POOL_LIM] = 8, 40
    else:  # outside a pass the cursor is the top
        meta[L.M_POOL_CUR] = 8
    with pytest.raises(CacheInvariantError, match="code 126"):
        c.sanity_check()


def _straddling_pool():
    """A B C D at [0,16) [16,32) [32,48) [48,56); C and D evicted; E (16) opens a
    gap pass over [32, 64) -- the dead rows and the never-used tail -- at 32."""
    c = _cache()
    for i, n in ((0, 16), (1, 16), (2, 16), (3, 8)):
        _insert(c, i, n)
    _touch(c, (0, 16), (1, 16))
    assert c.evict(EvictParams(num_tokens=24)).num_tokens_evicted == 24
    _insert(c, 4, 16)
    assert c._engine.gap_passes == 1 and _offset(c, 4, 16) == 32
    return c


def test_a_span_across_the_old_top_revives_dead_rows_and_raises_the_top():
    c = _straddling_pool()
    meta = c._engine.st.meta
    assert (int(meta[L.M_POOL_TOP]), int(meta[L.M_POOL_DEAD])) == (56, 8)
    _insert(c, 5, 16)  # F: [48, 64), 8 dead rows below the old top and 8 new ones
    assert _offset(c, 5, 16) == 48
    assert (int(meta[L.M_POOL_TOP]), int(meta[L.M_POOL_DEAD])) == (64, 0)
    assert c._engine.compactions == 0 and c._engine.st.pool.shape[0] == 64
    for i in (0, 1, 4, 5):
        assert _values(c, i, 16) == (16, list(range(100 * i, 100 * i + 16)))
    c.sanity_check()


def test_reset_during_a_gap_pass_starts_the_pool_over():
    c = _straddling_pool()
    assert int(c._engine.st.meta[L.M_POOL_LIM]) == 64  # the pass is under way
    c.reset()
    meta = c._engine.st.meta
    assert [int(meta[f]) for f in (L.M_POOL_TOP, L.M_POOL_DEAD, L.M_POOL_CUR,
                                   L.M_POOL_LIM)] == [0, 0, 0, 0]
    _insert(c, 6, 16)
    assert _offset(c, 6, 16) == 0 and int(meta[L.M_POOL_CUR]) == 16
    assert _values(c, 4, 16) == (0, [])
    c.sanity_check()
