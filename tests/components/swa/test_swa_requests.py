"""SWA on the request path (spec §5.8, §6.2 "Request caching hooks" and
"Out-of-window freeing") and the reported peer bugs, each as a scenario whose
Full and SWA slots must partition exactly into free / cached / held by running
requests after every operation (``tests/swa_support.py: check_partition``).

Cursor arithmetic used throughout (§6.2): with ``pre_len`` (checkpoint:
``len(key) - 1``; scheduler: ``seqlen - 1``), nothing happens unless
``pre_len - W >= cursor + 1``; then ``cursor = max(cursor, protected)`` and the
new cursor is ``max(cursor, pre_len - ceil(max(W, P) / P) * P)`` floored to a
page, the row's SWA slots in between being freed.
"""

import numpy as np
import pytest

from flatradix import EvictParams

from .swa_support import SWAEnv, check_partition, find, nodes, shape


@pytest.fixture(params=[False, True], ids=["flatradix-alloc", "sglang-contract-alloc"])
def strict(request):
    """Run the scenario with flatradix's SWA allocator and with a double that holds the
    cache to SGLang's allocator contract (torch indices, peer checks)."""
    return request.param

T1 = list(range(1, 2000))


def toks(n, base=T1):
    return base[:n]


def expected_cursor(cursor, protected, pre_len, W, P, interval=1):
    """§6.2's out-of-window rule, written out independently."""
    if pre_len - W < cursor + interval:
        return cursor
    cursor = max(cursor, protected)
    keep = -(-max(W, P) // P) * P
    new = max(cursor, pre_len - keep)
    return new - new % P


def test_expected_cursor_worked_numbers():
    assert expected_cursor(0, 0, 19, 4, 1) == 15       # P 1, W 4, 20 tokens
    assert expected_cursor(0, 0, 4, 4, 1) == 0         # 5 tokens: stays 0
    assert expected_cursor(0, 0, 14, 7, 4) == 4        # bigram P 4, W 7, 16 raw tokens
    assert expected_cursor(0, 0, 1023, 127, 64) == 832


# ----------------------------------------------------------------------------- the helper
def _small_scenario():
    """W 4, P 1: a request of 20 tokens checkpointed (cursor 15) and still running with
    2 more decoded tokens; a second cached branch."""
    e = SWAEnv(W=4, P=1, size=40)
    e.insert([90, 91, 92])
    req, _ = e.admit(toks(20))
    e.cache.checkpoint(req, 20)
    e.decode(req, [77, 78])
    e.check()
    return e, req


def test_partition_helper_catches_a_leaked_slot():
    e, _ = _small_scenario()
    leaked = e.alloc.alloc(1)  # held by nobody the model knows
    with pytest.raises(AssertionError, match="Full pool is not partitioned"):
        e.check()
    e.alloc.free(leaked)
    e.check()


def test_partition_helper_catches_a_wrong_cursor_model():
    e, req = _small_scenario()
    # the request owns [20, 22) live; pretend its cursor were past them
    req.swa_evicted_seqlen, real = 22, req.swa_evicted_seqlen
    with pytest.raises(AssertionError, match="below its cursor keeps its SWA peer"):
        e.check()
    req.swa_evicted_seqlen = real
    e.check()


def test_partition_helper_catches_a_stale_tombstone_mapping():
    e, _ = _small_scenario()
    tomb = next(n for n in nodes(e.cache) if not n["has_swa"])
    free_swa = int(np.nonzero(e.alloc.swa_attn_allocator.is_free(
        np.arange(e.alloc.size_swa + 1)))[0][0])
    e.alloc.full_to_swa_index_mapping[tomb["value"][0]] = free_swa
    with pytest.raises(AssertionError, match="stale Full->SWA mapping"):
        e.check()
    e.alloc.full_to_swa_index_mapping[tomb["value"][0]] = 0
    e.check()


def test_partition_helper_catches_an_swa_slot_freed_behind_the_cache():
    e, _ = _small_scenario()
    live = next(n for n in nodes(e.cache) if n["has_swa"])
    peer = e.alloc.full_to_swa_index_mapping[live["value"][:1]].copy()
    e.alloc.swa_attn_allocator.free(peer)   # mapping still points at it: double-counted
    with pytest.raises(AssertionError, match="SWA pool is not partitioned"):
        e.check()


def test_partition_helper_catches_ledger_drift():
    e, _ = _small_scenario()
    with pytest.raises(AssertionError):
        check_partition(e.cache, e.alloc, [])  # the running request's slots unaccounted


# ----------------------------------------------------------------------------- worked numbers
def test_out_of_window_p1_w4_20_tokens_via_evict_sliding_windows(strict):
    """20 tokens, scheduler pre_len 19 -> cursor 15; the row's SWA slots [0,15) go back."""
    e = SWAEnv(strict=strict, W=4, P=1, size=32)
    req, m = e.admit(toks(20))
    assert m.device_prefix_len == 0
    row = e.row(req)[:20].copy()
    e.cache.evict_sliding_windows(req, 19)
    assert req.swa_evicted_seqlen == 15
    assert e.alloc.swa_available_size() == 32 - 5
    assert (e.alloc.full_to_swa_index_mapping[row[:15]] == 0).all()
    assert (e.alloc.full_to_swa_index_mapping[row[15:]] > 0).all()
    e.check()
    e.cache.evict_sliding_windows(req, 19)      # again: 19 - 4 < 15 + 1, no-op
    assert req.swa_evicted_seqlen == 15
    e.check()


def test_out_of_window_p1_w4_20_tokens_via_checkpoint(strict):
    """checkpoint(20): pre_len = len(key) - 1 = 19 -> cursor 15; the insert makes [0,15)
    a tombstone and the live 5 are capped (T 4): [15,16) + [16,20); the leaf is
    matchable (4 contiguous live tokens at its end)."""
    e = SWAEnv(strict=strict, W=4, P=1, size=32)
    req, _ = e.admit(toks(20))
    assert e.cache.checkpoint(req, 20) == 20
    assert req.swa_evicted_seqlen == 15
    assert req.cache_protected_len == 20
    assert shape(e.cache) == [(15, 15, False), (16, 1, True), (20, 4, True)]
    assert e.cache.total_size() == (20, 5)
    # the request's window lock: leaf (4 >= W) only
    assert (e.cache.swa_protected_size(), e.cache.swa_evictable_size()) == (4, 1)
    assert e.cache.protected_size() == 20
    e.check()
    assert e.match(toks(20)).device_prefix_len == 20
    e.release(req)
    assert e.cache.protected_size() == 0 and e.cache.swa_protected_size() == 0
    e.check()


def test_out_of_window_p1_w4_5_tokens_stays_0(strict):
    e = SWAEnv(strict=strict, W=4, P=1, size=16)
    req, _ = e.admit(toks(5))
    e.cache.evict_sliding_windows(req, 4)
    assert req.swa_evicted_seqlen == 0
    e.cache.checkpoint(req, 5)
    assert req.swa_evicted_seqlen == 0
    assert shape(e.cache) == [(1, 1, True), (5, 4, True)]
    e.check()
    e.release(req)
    e.check()


def test_out_of_window_bigram_p4_w7_16_tokens(strict):
    """EAGLE tree, P 4, W 7 (T 8): 16 raw tokens = 15 bigram units, aligned 12;
    pre_len 14 -> 14 - 8 = 6 -> cursor 4. [0,4) tomb, [4,12) live (8 >= 7): the
    leaf ends at 12 and a match of the 16 raw tokens gets 12."""
    e = SWAEnv(strict=strict, W=7, P=4, size=32, eagle=True)
    req, m = e.admit(toks(16))
    assert m.device_prefix_len == 0
    assert e.cache.checkpoint(req, 16) == 12
    assert req.swa_evicted_seqlen == 4
    assert shape(e.cache) == [(4, 4, False), (12, 8, True)]
    e.check()
    assert e.match(toks(16)).device_prefix_len == 12
    e.release(req)
    e.check()


# ----------------------------------------------------------------------------- branching
def test_branching_checkpoint_inserts_up_to_the_branch_first(strict):
    """W 4, P 2: tree [0,8) is a Full-only tombstone (cursor 8). A request for 12 tokens
    sharing those 8 matches 0 with branching 8. Its first checkpoint inserts only
    the key [0,8): out-of-window first with pre_len = 8 - 1 = 7 (7 - 4 >= 1;
    threshold 7 - 4 = 3 -> page 2 -> cursor 2, the row's SWA [0,2) freed), so the
    insert keeps [0,2) a tombstone (the row's duplicates freed Full-only) and
    recovers [2,8) from the request's own slots (the old ones freed Full-only).
    Then req.swa_branching_seqlen is cleared and the out-of-window slots are
    freed again with pre_len = 12 - 1 = 11: cursor max(2, 8) = 8. The next
    checkpoint inserts the rest."""
    e = SWAEnv(strict=strict, W=4, P=2, size=48)
    e.insert(toks(8), cursor=8)
    old = find(e.cache, toks(8))["value"].copy()
    req, m = e.admit(toks(12))
    assert (m.device_prefix_len, m.swa_branching_seqlen) == (0, 8)
    assert req.swa_branching_seqlen == 8
    row = e.row(req)[:12].copy()
    assert e.cache.checkpoint(req, 12) == 8
    assert req.swa_branching_seqlen is None
    assert req.cache_protected_len == 8
    assert req.swa_evicted_seqlen == 8
    assert shape(e.cache) == [(2, 2, False), (8, 6, True)]
    np.testing.assert_array_equal(find(e.cache, toks(2))["value"], old[:2])
    np.testing.assert_array_equal(find(e.cache, toks(8))["value"], row[2:8])
    np.testing.assert_array_equal(e.row(req)[:8], np.r_[old[:2], row[2:8]])
    assert e.alloc.full_attn_allocator.is_free(np.r_[row[:2], old[2:]]).all()
    e.check()
    assert e.match(toks(8)).device_prefix_len == 8     # 6 contiguous live >= 4
    assert e.cache.checkpoint(req, 12) == 12
    assert shape(e.cache) == [(2, 2, False), (8, 6, True), (12, 4, True)]
    e.check()
    e.release(req)
    e.check()


# ----------------------------------------------------------------------------- peer bugs
def test_peer_stale_mapping_of_a_recovered_tombstone_never_frees_a_live_slot(strict):
    """A tombstone's Full slots have no SWA peer; their former SWA slots are recycled
    to another request. Recovering the tombstone must free its old Full slots
    Full-only (a stale mapping would free the other request's live SWA slot and
    leak a page). W 4, P 2:
    R1 (12 tokens): checkpoint -> cursor 6 (pre_len 11 - 4 = 7 -> 6): [0,6) tomb,
    [6,8) + [8,12) live. R1 finishes. R3 takes the recycled SWA slots. R2 = the
    first 6 tokens + 4 own: matches 0 (branching 6); its checkpoint recovers [0,6)
    from its own slots. Then evict everything evictable, re-admit, finish all."""
    e = SWAEnv(strict=strict, W=4, P=2, size=32)
    r1, _ = e.admit(toks(12))
    e.check()
    r1_swa = e.alloc.full_to_swa_index_mapping[e.row(r1)[:6]].copy()
    e.cache.checkpoint(r1, 12)
    assert r1.swa_evicted_seqlen == 6
    assert shape(e.cache) == [(6, 6, False), (8, 2, True), (12, 4, True)]
    e.check()
    tomb_old = find(e.cache, toks(6))["value"].copy()
    e.release(r1)
    e.check()
    r3, _ = e.admit([500 + i for i in range(6)])
    # R3's SWA peers are exactly the ones the tombstone's Full slots used to map to
    assert set(e.alloc.full_to_swa_index_mapping[e.row(r3)[:6]]) == set(r1_swa)
    e.check()
    r2, m = e.admit(toks(6) + [900, 901, 902, 903])
    assert (m.device_prefix_len, m.full_kv_hit_length, m.swa_branching_seqlen) == (0, 6, 6)
    e.check()
    e.cache.checkpoint(r2, 10)
    assert shape(e.cache)[:1] == [(6, 6, True)]
    assert e.alloc.full_attn_allocator.is_free(tomb_old).all()
    e.check()
    e.cache.checkpoint(r2, 10)
    e.check()
    r = e.cache.evict(EvictParams(num_tokens=100, swa_num_tokens=100))
    assert r.num_tokens_evicted > 0
    e.check()
    e.release(r3)
    e.check()
    e.release(r2)
    e.check()
    e.cache.evict(EvictParams(num_tokens=100, swa_num_tokens=100))
    assert e.cache.total_size() == (0, 0)
    assert (e.alloc.full_available_size(), e.alloc.swa_available_size()) == (32, 32)
    e.check()


def _locked_tombstone_chain(e):
    """W 4, P 1: chain N1 [0,4), N2 [4,8), N3 [8,12) (one insert each, T 4), a request
    R1 on N3 (window = N3), N2's SWA evicted (Full-locked by R1's path):
    N1 live, N2 tomb, N3 live."""
    for n in (4, 8, 12):
        e.insert(toks(n))
    r1, m = e.admit(toks(12) + [700, 701])
    assert m.device_prefix_len == 12
    e.match(toks(4))                          # LRU: N1, N3, N2 -> N2 is the tail
    r = e.cache.evict(EvictParams(swa_num_tokens=4))
    assert (r.num_tokens_evicted, r.swa_num_tokens_evicted) == (0, 4)
    assert shape(e.cache) == [(4, 4, True), (8, 4, False), (12, 4, True)]
    e.check()
    return r1


def test_peer_locked_recovery_with_deferred_duplicate_frees_in_one_insert(strict):
    """One insert emits, in order: a duplicate free (N1, with SWA peers), the locked
    recovery of N2 (the incoming slots' SWA peers move onto N2's locked Full slots,
    the incoming Full slots freed Full-only), a duplicate free (N3). The recovery's
    mapping move must not disturb the deferred frees, nor they it."""
    e = SWAEnv(strict=strict, W=4, P=1, size=40)
    r1 = _locked_tombstone_chain(e)
    n2 = find(e.cache, toks(8))
    w = e.fresh(12)
    w_swa = e.alloc.full_to_swa_index_mapping[w].copy()
    swa_free = e.alloc.swa_available_size()
    r = e.insert(toks(12), value=w)
    assert r.prefix_len == 12
    assert shape(e.cache) == [(4, 4, True), (8, 4, True), (12, 4, True)]
    np.testing.assert_array_equal(find(e.cache, toks(8))["value"], n2["value"])
    np.testing.assert_array_equal(e.alloc.full_to_swa_index_mapping[n2["value"]], w_swa[4:8])
    assert e.alloc.full_attn_allocator.is_free(w).all()
    assert e.alloc.swa_attn_allocator.is_free(np.r_[w_swa[:4], w_swa[8:]]).all()
    assert e.alloc.swa_available_size() == swa_free + 8
    e.check()
    e.release(r1)
    e.check()


def test_peer_locked_recovery_on_the_request_path(strict):
    """The same locked tombstone recovered by a second request's checkpoint: R2 =
    the first 8 tokens + 2 own; it matches N1 only (plen 4, branching 8); its
    checkpoint inserts [0,8) (branch) recovering N2 under R1's Full lock: R2's
    slots for [4,8) lose their Full side and its row is rewritten to N2's slots."""
    e = SWAEnv(strict=strict, W=4, P=1, size=40)
    r1 = _locked_tombstone_chain(e)
    n2_val = find(e.cache, toks(8))["value"].copy()
    r2, m = e.admit(toks(8) + [800, 801])
    assert (m.device_prefix_len, m.swa_branching_seqlen) == (4, 8)
    incoming = e.row(r2)[4:8].copy()
    e.check()
    assert e.cache.checkpoint(r2, 10) == 8
    assert find(e.cache, toks(8))["has_swa"]
    np.testing.assert_array_equal(e.row(r2)[4:8], n2_val)
    assert e.alloc.full_attn_allocator.is_free(incoming).all()
    # pre_len 7: 7 - 4 >= 1 -> cursor max(0, 4) = 4, threshold 3 -> 4; after the branch,
    # cleanup with pre_len 9: 9 - 4 >= 5 -> cursor max(4, 8) = 8
    assert r2.swa_evicted_seqlen == 8
    e.check()
    e.release(r2)
    e.check()
    e.release(r1)
    e.check()


def test_peer_page_larger_than_window_eager_freeing_keeps_the_leaf_live(strict):
    """P 4 > W 2 (T 4): the out-of-window threshold keeps ceil(max(W,P)/P)*P = 4
    tokens, so the last page-aligned leaf is never all-tombstone. 11 tokens:
    scheduler pre_len 10 -> 10 - 4 = 6 -> cursor 4; checkpoint: aligned 8,
    [0,4) tomb, [4,8) live; the leaf matches. Then decode token by token with the
    scheduler's slide and a checkpoint each step: the leaf always matches."""
    W, P = 2, 4
    e = SWAEnv(strict=strict, W=W, P=P, size=64)
    req, _ = e.admit(toks(11))
    e.cache.evict_sliding_windows(req, 10)
    assert req.swa_evicted_seqlen == 4
    e.check()
    e.cache.checkpoint(req, 11)
    assert shape(e.cache) == [(4, 4, False), (8, 4, True)]
    assert e.match(toks(11)).device_prefix_len == 8
    e.check()
    for step in range(12):
        n = req.kv_committed_len
        e.decode(req, [1000 + n])
        want = expected_cursor(req.swa_evicted_seqlen, req.cache_protected_len, n, W, P)
        e.cache.evict_sliding_windows(req, n)      # pre_len = tokens with KV before this one
        assert req.swa_evicted_seqlen == want
        e.check()
        e.cache.checkpoint(req, n + 1)
        aligned = (n + 1) // P * P
        assert req.cache_protected_len == aligned
        assert e.match(list(req.fill_ids)).device_prefix_len == aligned
        e.check()
    e.release(req)
    e.check()


def test_peer_eagle_w127_p64_seq1024_keeps_a_full_window_live(strict):
    """EAGLE, W 127, P 64 (T 128), 1024 raw tokens = 1023 bigram units, aligned 960.
    Scheduler pre_len 1023 -> 1023 - 128 = 895 -> cursor 832 (W alone would give 896
    and leave only 64 < 127 live units before 960: an unmatchable leaf). Tree:
    [0,832) tomb, [832,960) live; a match of the 1024 tokens gets 960. Decoding 64
    more (slide every 8; the first slide past the protected 960 jumps the cursor to
    960, the tree owning the prefix) and checkpointing at 1088 raw (1087 units,
    aligned 1024): [832,960) + [960,1024) live, match 1024."""
    W, P = 127, 64
    e = SWAEnv(strict=strict, W=W, P=P, size=1200, ctx=1100, eagle=True)
    req, m = e.admit(toks(1024))
    assert m.device_prefix_len == 0
    e.cache.evict_sliding_windows(req, 1023)
    assert req.swa_evicted_seqlen == 832
    e.check()
    assert e.cache.checkpoint(req, 1024) == 960
    assert req.swa_evicted_seqlen == 832
    assert shape(e.cache) == [(832, 832, False), (960, 128, True)]
    assert e.match(toks(1024)).device_prefix_len == 960
    e.check()
    for _ in range(8):
        n = req.kv_committed_len
        e.decode(req, [5000 + n + i for i in range(8)])
        e.cache.evict_sliding_windows(req, req.kv_committed_len - 1)
        e.check()
    assert req.kv_committed_len == 1088
    assert req.swa_evicted_seqlen == expected_cursor(832, 960, 1087, W, P) == 960
    assert e.cache.checkpoint(req, 1088) == 1024
    assert shape(e.cache) == [(832, 832, False), (960, 128, True), (1024, 64, True)]
    assert e.match(list(req.fill_ids)).device_prefix_len == 1024
    e.check()
    e.release(req)
    assert e.match(list(req.fill_ids)).device_prefix_len == 1024
    e.check()


def test_finished_release_frees_dead_part_full_only(strict):
    """A finished request whose cursor passed its protected prefix: release frees the
    row's [protected, owned) slots, the part below the cursor Full-only (its SWA
    peers are already gone). W 4, P 1, 12 tokens, slide at pre_len 11 -> cursor 7,
    finish: the insert makes [0,7) a tombstone, [7,8)+[8,12) live."""
    e = SWAEnv(strict=strict, W=4, P=1, size=24)
    req, _ = e.admit(toks(12))
    e.cache.evict_sliding_windows(req, 11)
    assert req.swa_evicted_seqlen == 7
    e.check()
    e.release(req)
    assert shape(e.cache) == [(7, 7, False), (8, 1, True), (12, 4, True)]
    assert (e.alloc.full_available_size(), e.alloc.swa_available_size()) == (12, 19)
    e.check()


def test_release_without_checkpoint_frees_everything_owned(strict):
    e = SWAEnv(strict=strict, W=4, P=1, size=24)
    e.insert(toks(6))
    req, m = e.admit(toks(10))
    assert m.device_prefix_len == 6
    e.cache.evict_sliding_windows(req, 9)     # 9 - 4 >= 1: cursor max(0, 6) = 6, 9-4=5 -> 6
    assert req.swa_evicted_seqlen == 6
    e.release(req, checkpoint=False)
    assert shape(e.cache) == [(2, 2, True), (6, 4, True)]
    assert (e.alloc.full_available_size(), e.alloc.swa_available_size()) == (18, 18)
    e.check()


def test_evict_sliding_windows_interval(strict):
    """eviction_interval k: nothing until pre_len - W >= cursor + k."""
    e = SWAEnv(strict=strict, W=4, P=1, size=32)
    req, _ = e.admit(toks(12))
    e.cache.evict_sliding_windows(req, 11, eviction_interval=8)   # 7 < 0 + 8
    assert req.swa_evicted_seqlen == 0
    e.cache.evict_sliding_windows(req, 11, eviction_interval=7)   # 7 >= 7 -> 11 - 4 = 7
    assert req.swa_evicted_seqlen == 7
    e.check()
    e.release(req)
    e.check()


def test_unaligned_branching_is_not_inserted_by_an_aligned_key(strict):
    """P 2, req.swa_branching_seqlen 5 (> protected 0, <= 10 tokens): the checkpoint's key
    is tokens[:5], page-aligned to 4 < 5: the branch is not inserted, so the
    request keeps swa_branching_seqlen 5."""
    e = SWAEnv(strict=strict, W=4, P=2, size=32)
    req, _ = e.admit(toks(10))
    req.swa_branching_seqlen = 5
    assert e.cache.checkpoint(req, 10) == 4
    assert req.cache_protected_len == 4
    assert req.swa_branching_seqlen == 5


def test_disabled_swa_cache_slide_uses_the_window_alone():
    """Without prefix sharing (disable=True) the threshold is pre_len - W (§6.2 note in
    SGLang's free_swa_out_of_window_slots): P 4, W 2, pre_len 10 -> 8."""
    e = SWAEnv(W=2, P=4, size=32, disable=True)
    req, m = e.admit(toks(11))
    assert m.device_prefix_len == 0
    e.cache.evict_sliding_windows(req, 10)
    assert req.swa_evicted_seqlen == 8
    assert e.alloc.swa_available_size() == 32 - 3
    e.check()
    e.release(req)
    assert (e.alloc.full_available_size(), e.alloc.swa_available_size()) == (32, 32)
    e.check()


def test_disabled_swa_cache_release_frees_dead_part_full_only():
    """Same as above with an allocator holding the cache to SGLang's contract: the row's
    [0, 8) must go back through free_full_segment, [8, 11) with their SWA peers."""
    e = SWAEnv(W=2, P=4, size=32, disable=True, strict=True)
    req, _ = e.admit(toks(11))
    e.cache.evict_sliding_windows(req, 10)
    assert req.swa_evicted_seqlen == 8
    e.release(req)
    assert (e.alloc.full_available_size(), e.alloc.swa_available_size()) == (32, 32)
    e.check()


def test_chunked_prefill_checkpoints(strict):
    """W 4, P 2, 12 tokens cached in two chunks. checkpoint(8): key 8, pre_len 7 ->
    7 - 4 >= 1, threshold 3 -> page 2 -> cursor 2: [0,2) tomb, live [2,8) = 6 > T 4
    -> [2,4) + [4,8); the row's [8,12) stays the request's. checkpoint(12):
    pre_len 11 -> cursor max(2, 8) = 8 (threshold 6): new leaf [8,12) live."""
    e = SWAEnv(strict=strict, W=4, P=2, size=32)
    req, _ = e.admit(toks(12))
    assert e.cache.checkpoint(req, 8) == 8
    assert (req.swa_evicted_seqlen, req.cache_protected_len) == (2, 8)
    assert shape(e.cache) == [(2, 2, False), (4, 2, True), (8, 4, True)]
    e.check()
    assert e.cache.checkpoint(req, 12) == 12
    assert (req.swa_evicted_seqlen, req.cache_protected_len) == (8, 12)
    assert shape(e.cache) == [(2, 2, False), (4, 2, True), (8, 4, True), (12, 4, True)]
    # the window lock: the leaf [8,12) alone (4 >= W)
    assert (e.cache.swa_protected_size(), e.cache.swa_evictable_size()) == (4, 6)
    e.check()
    e.release(req)
    assert (e.alloc.full_available_size(), e.alloc.swa_available_size()) == (20, 22)
    e.check()


def test_release_frees_overallocated_slots_with_their_peers(strict):
    """kv_allocated_len 14 > committed 12 (W 4, P 1, slid to 7): release caches 12
    ([0,7) tomb, [7,8) + [8,12) live) and frees the 2 pre-allocated slots, Full
    and SWA."""
    e = SWAEnv(strict=strict, W=4, P=1, size=24)
    req, _ = e.admit(toks(12))
    e.rtp.write((req.req_pool_idx, slice(12, 14)), e.fresh(2))
    req.kv_allocated_len = 14
    e.cache.evict_sliding_windows(req, 11)
    assert req.swa_evicted_seqlen == 7
    e.release(req)
    assert shape(e.cache) == [(7, 7, False), (8, 1, True), (12, 4, True)]
    assert (e.alloc.full_available_size(), e.alloc.swa_available_size()) == (12, 19)
    e.check()
