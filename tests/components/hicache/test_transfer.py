"""``KVTransfer``: the host tier moving real KV bytes.

The oracle compares slot indices with SGLang's cache, never bytes; these tests
check the bytes. A content model gives every position of a token sequence a KV
row that depends on the whole prefix (a rolling hash, as real KV depends on
every earlier token). The "model" writes those rows into the device buffer
before each insert, as a forward pass does; freed device slots are overwritten
with garbage (another request reusing them). After backups, demotions,
load-backs and host evictions, every match's ``device_indices`` must read back
exactly the rows of its prefix.
"""

import numpy as np
import pytest

from flatradix import (
    EvictParams, InitLoadBackParams, InsertParams, KVTransfer, MatchPrefixParams, RadixKey,
    TokenToKVPoolAllocator, UnifiedRadixCache,
)

_MOD = (1 << 61) - 1


def rows_of(tokens):
    """The KV rows of a sequence: ``(rolling hash of the prefix, position)`` per token."""
    out = np.empty((len(tokens), 2), dtype=np.int64)
    h = 7
    for i, t in enumerate(tokens):
        h = (h * 1_000_003 + int(t) + 1) % _MOD
        out[i] = (h, i)
    return out


def build(kind, policy, page, pool=96, host=160):
    alloc = TokenToKVPoolAllocator(pool, page_size=page)
    cache = UnifiedRadixCache(page_size=page, token_to_kv_pool_allocator=alloc)
    if kind == "torch":
        torch = pytest.importorskip("torch")
        dev = [torch.zeros((pool + 1, 2), dtype=torch.int64),
               torch.zeros((pool + 1, 3), dtype=torch.int32)]   # a second buffer, another shape
    else:
        dev = [np.zeros((pool + 1, 2), dtype=np.int64), np.zeros((pool + 1, 3), dtype=np.int32)]
    xfer = KVTransfer.with_host_buffers(dev, host)
    cache.init_hicache(host_size=host, hicache_write_policy=policy, transfer=xfer,
                       load_back_threshold=1)
    return cache, alloc, dev, xfer


def np_rows(buf, idx):
    a = buf[idx] if isinstance(buf, np.ndarray) else buf[idx].numpy()
    return np.asarray(a)


def write(dev, slots, rows):
    for b in dev:
        if isinstance(b, np.ndarray):
            b[slots, :2] = rows.astype(b.dtype)
            if b.shape[1] > 2:
                b[slots, 2] = (rows[:, 0] % 1000).astype(b.dtype)
        else:
            import torch

            s = torch.from_numpy(np.asarray(slots, dtype=np.int64))
            b[s, :2] = torch.from_numpy(rows.astype(np.int64)).to(b.dtype)
            if b.shape[1] > 2:
                b[s, 2] = torch.from_numpy((rows[:, 0] % 1000).astype(np.int64)).to(b.dtype)


def check_prefix(dev, tokens, indices):
    """The device rows at ``indices`` are those of ``tokens``' prefix, in every buffer."""
    idx = np.asarray(indices, dtype=np.int64)
    want = rows_of(tokens)[:len(idx)]
    a = np_rows(dev[0], idx)
    assert np.array_equal(a, want), "KV rows of the matched prefix differ"
    b = np_rows(dev[1], idx)
    assert np.array_equal(b[:, :2], want.astype(np.int32)) and np.array_equal(
        b[:, 2], (want[:, 0] % 1000).astype(np.int32))


def garbage(dev, alloc, rng):
    """Overwrite every free device slot: another request reusing them."""
    free = np.setdiff1d(np.arange(1, alloc.size + 1), np.asarray(
        _held(alloc), dtype=np.int64))
    for b in dev:
        if isinstance(b, np.ndarray):
            b[free] = rng.integers(-9, 9, size=(len(free), b.shape[1])).astype(b.dtype)
        else:
            import torch

            b[torch.from_numpy(free)] = -5


def _held(alloc):
    return np.flatnonzero(alloc._mark[1:] == 0) + 1


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("policy,page", [("write_through", 1), ("write_through", 4),
                                         ("write_back", 1), ("write_back", 4)])
def test_bytes_survive_backup_demote_load_back_and_host_eviction(kind, policy, page):
    cache, alloc, dev, xfer = build(kind, policy, page)
    rng = np.random.default_rng(3)
    stems = [list(rng.integers(0, 50, size=8)) for _ in range(4)]
    seqs = []
    for step in range(160):
        op = rng.integers(0, 5)
        if op <= 1 or not seqs:                      # a request finishes: insert its KV
            s = stems[rng.integers(0, 4)] + list(rng.integers(0, 50, size=rng.integers(4, 24)))
            s = s[:len(s) // page * page]
            m = cache.match_prefix(MatchPrefixParams(key=RadixKey(s)))
            hit = m.device_prefix_len
            need = len(s) - hit
            if alloc.available_size() < need:
                cache.evict(EvictParams(num_tokens=need - alloc.available_size()))
            new = alloc.alloc(need)
            if new is None:
                continue
            slots = np.concatenate([np.asarray(m.device_indices, dtype=np.int64),
                                    np.asarray(new, dtype=np.int64)])
            write(dev, np.asarray(new, dtype=np.int64), rows_of(s)[hit:])
            cache.insert(InsertParams(key=RadixKey(s), value=slots, prev_prefix_len=hit))
            seqs.append(s)
        elif op == 2:                                # memory pressure: demote / drop
            cache.evict(EvictParams(num_tokens=int(rng.integers(1, 40))))
            garbage(dev, alloc, rng)
        elif op == 3:                                # a request hits the host: load back
            s = seqs[rng.integers(0, len(seqs))]
            m = cache.match_prefix(MatchPrefixParams(key=RadixKey(s)))
            if m.host_hit_length > 0:
                n, node = cache.init_load_back(InitLoadBackParams(
                    best_match_node=m.best_match_node, host_hit_length=m.host_hit_length))
                garbage(dev, alloc, rng)             # slots freed by a load's eviction
                if n:
                    check_prefix(dev, s, cache.path_device_indices(node))
        else:                                        # host pressure
            cache.evict_host(int(rng.integers(1, 30)))
        cache.check_hicache_events()
        for s in seqs[-6:]:
            m = cache.match_prefix(MatchPrefixParams(key=RadixKey(s)))
            check_prefix(dev, s, m.device_indices)
    assert xfer.backed_up_tokens > 0 and xfer.loaded_tokens > 0
    row_bytes = 2 * 8 + 3 * 4
    assert xfer.bytes_copied == (xfer.backed_up_tokens + xfer.loaded_tokens) * row_bytes
    cache.sanity_check()


def test_a_load_back_restores_the_demoted_rows_by_hand():
    cache, alloc, dev, xfer = build("numpy", "write_through", 1, pool=8, host=8)
    toks = [5, 6, 7, 8]
    slots = alloc.alloc(4)
    write(dev, slots, rows_of(toks))
    cache.insert(InsertParams(key=RadixKey(toks), value=slots))   # backed up at the 1st hit
    cache.check_hicache_events()
    host = np.asarray(cache.all_host_values_flatten())
    assert sorted(host.tolist()) == [0, 1, 2, 3]
    assert np.array_equal(xfer.host_buffers[0][host], rows_of(toks))
    cache.evict(EvictParams(num_tokens=4))
    dev[0][:] = -1                                   # the device rows are gone
    m = cache.match_prefix(MatchPrefixParams(key=RadixKey(toks)))
    assert (m.device_prefix_len, m.host_hit_length) == (0, 4)
    n, node = cache.init_load_back(InitLoadBackParams(m.best_match_node, 4))
    assert n == 4
    check_prefix(dev, toks, cache.path_device_indices(node))
    assert (xfer.backed_up_tokens, xfer.loaded_tokens) == (4, 4)


def test_buffers_too_small_for_the_pools_are_refused_up_front_or_fail_the_copy():
    alloc = TokenToKVPoolAllocator(16)
    cache = UnifiedRadixCache(page_size=1, token_to_kv_pool_allocator=alloc)
    dev = [np.zeros((17, 2), dtype=np.int64)]
    small_host = KVTransfer(dev, [np.zeros((2, 2), dtype=np.int64)])   # rows for 2 host slots
    with pytest.raises(ValueError, match=r"transfer: .* 2 rows, the host pool has 16 .*"
                                         r"with_host_buffers\(device_buffers, 16\)"):
        cache.init_hicache(host_size=16, transfer=small_host)
    small_dev = KVTransfer([np.zeros((16, 2), dtype=np.int64)], [np.zeros((16, 2), np.int64)])
    with pytest.raises(ValueError, match="need 17 rows"):
        cache.init_hicache(host_size=16, transfer=small_dev)
    assert not cache.enable_hicache                   # refused: no host tier
    # wrapped in a plain callable the check cannot see it: the backup's copy fails,
    # and nothing of it is committed
    cache.init_hicache(host_size=16, transfer=lambda *a: small_host(*a))
    with pytest.raises(ValueError, match="host_indices"):
        cache.insert(InsertParams(key=RadixKey([1, 2, 3, 4]), value=alloc.alloc(4)))
    # the insert itself happened; its backup did not: no host copy, no pin
    assert cache.evictable_size() == 4 and cache.protected_size() == 0
    assert cache.host_total_size() == 0 and cache.mem_pool_host.available_size() == 16
    assert small_host.backed_up_tokens == 0


def test_bad_buffers_and_calls_are_refused_naming_the_argument():
    d = np.zeros((4, 2), dtype=np.int64)
    for args, err, what in [
            (("x", [d]), TypeError, "device_buffers"),
            (([], [d]), ValueError, "device_buffers"),
            (([d], [d, d]), ValueError, "host_buffers"),
            (([d], [np.zeros((4, 3), dtype=np.int64)]), ValueError, r"host_buffers\[0\]"),
            (([d], [np.zeros((4, 2), dtype=np.int32)]), ValueError, r"host_buffers\[0\]"),
            (([d], [[1, 2]]), TypeError, r"host_buffers\[0\]"),
            (([np.zeros((0, 2))], [d]), ValueError, r"device_buffers\[0\]"),
    ]:
        with pytest.raises(err, match=what):
            KVTransfer(*args)
    ro = np.zeros((4, 2), dtype=np.int64)
    ro.flags.writeable = False
    for args, what in ((([ro], [d]), r"device_buffers\[0\] is read-only"),
                       (([d], [ro]), r"host_buffers\[0\] is read-only")):
        with pytest.raises(ValueError, match=what):
            KVTransfer(*args)
    x = KVTransfer([d], [np.zeros((3, 2), dtype=np.int64)])
    for args, err, what in [
            (("copy", [1], [0]), ValueError, "kind"),
            (("backup", [1, 2], [0]), ValueError, "host_indices"),
            (("backup", [4], [0]), ValueError, "device_indices"),
            (("load", [1], [3]), ValueError, "host_indices"),
            (("load", [[1]], [0]), TypeError, "device_indices"),
            (("load", [1.5], [0]), TypeError, "device_indices"),
    ]:
        with pytest.raises(err, match=what):
            x(*args)
    assert x.bytes_copied == 0 and not x.host_buffers[0].any()
    with pytest.raises(ValueError, match="host_size"):
        KVTransfer.with_host_buffers([d], 0)
    with pytest.raises(TypeError, match="pin_memory"):
        KVTransfer.with_host_buffers([d], 2, pin_memory="no")


def test_torch_buffers_pair_by_library_and_stay_on_the_cpu_host_side():
    torch = pytest.importorskip("torch")
    d = torch.zeros((4, 2), dtype=torch.float16)
    with pytest.raises(TypeError, match=r"host_buffers\[0\]"):
        KVTransfer([d], [np.zeros((4, 2), dtype=np.float16)])
    x = KVTransfer.with_host_buffers([d], 3)
    assert x.host_buffers[0].dtype == torch.float16 and tuple(x.host_buffers[0].shape) == (3, 2)
    d[1] = torch.tensor([1.5, 2.5], dtype=torch.float16)
    x("backup", torch.tensor([1]), np.array([2]))
    assert x.host_buffers[0][2].tolist() == [1.5, 2.5]
    x("load", np.array([3]), np.array([2]))
    assert d[3].tolist() == [1.5, 2.5] and x.bytes_copied == 2 * 2 * 2
    with pytest.raises(ValueError, match=r"device_buffers\[0\] requires grad"):
        KVTransfer([torch.zeros((4, 2), requires_grad=True)], [torch.zeros((4, 2))])
