"""Shared helpers of the SWA tests: an environment (cache + SWA allocator + request
pool + the requests it runs), a tree walk, and the slot-partition check.

The partition check is the independent model every SWA scenario is held to
after each operation:

* Full pool: slots ``1..size_full`` are exactly the disjoint union of the free
  slots, the slots cached in the tree (every live node's Full value) and the
  slots owned by running requests (row positions ``[cache_protected_len,
  kv_committed_len)``).
* SWA pool: slots ``1..size_swa`` are exactly the disjoint union of the free SWA
  slots, the SWA peers of cached nodes that hold SWA data, and the SWA peers of
  request-owned positions at or past the request's SWA cursor.
* The Full -> SWA mapping: a cached node with SWA data maps every Full slot to a
  peer, a tombstone maps none (a stale peer is a bug), a request position below
  its cursor maps none, one at or past it maps one, a free Full slot maps none.
* Ledgers recounted from the walk: ``total_size()``, Full and SWA
  evictable / protected (protected = nodes with a lock_ref > 0), and
  ``sanity_check()``.
"""

import numpy as np
import torch

from flatradix import (
    ComponentType, InsertParams, MatchPrefixParams, RadixKey, Req, ReqToTokenPool,
    SWATokenToKVPoolAllocator, UnifiedRadixCache, inspection,
)
from flatradix.engine import node_id

FULL, SWA = ComponentType.FULL, ComponentType.SWA
FS = (FULL, SWA)


def nodes(cache):
    """``node_info`` of every live non-root node, in DFS order, each with its
    ``path`` (the token units root -> node, the node's own key included)."""
    eng = cache._engine
    st = eng.st.nodes
    out = []
    paths = {}
    for slot, _ in inspection.dfs(st):
        nid = node_id(st, slot)
        if nid == cache.root_node_handle():
            paths[nid] = []
            continue
        info = cache.node_info(nid)
        info["path"] = paths[info["parent"]] + info["key"].tolist()
        paths[nid] = info["path"]
        out.append(info)
    return out


def find(cache, toks):
    """The node whose path is exactly ``toks`` (AssertionError if none)."""
    toks = list(toks)
    for n in nodes(cache):
        if n["path"] == toks:
            return n
    raise AssertionError(f"no node with path {toks}; tree: {[n['path'] for n in nodes(cache)]}")


def shape(cache):
    """``[(path length, key length, has_swa)]`` of every node, DFS order: the tree's
    shape at a glance."""
    return [(len(n["path"]), len(n["key"]), n["has_swa"]) for n in nodes(cache)]


class _Side:
    """One pool of ``StrictSWAAllocator``: slots ``1..size``, a free set."""

    def __init__(self, size):
        self.size = size
        self.free_mark = np.ones(size + 1, dtype=bool)
        self.free_mark[0] = False

    def available_size(self):
        return int(self.free_mark.sum())

    def alloc(self, n):
        free = np.nonzero(self.free_mark)[0]
        if n > len(free):
            return None
        got = free[:n]
        self.free_mark[got] = False
        return torch.from_numpy(got.astype(np.int64))

    def free(self, idx):
        idx = np.asarray(idx, dtype=np.int64)
        assert len(np.unique(idx)) == len(idx), "slot freed twice in one call"
        assert not self.free_mark[idx].any(), f"double free of {idx[self.free_mark[idx]]}"
        self.free_mark[idx] = True

    def is_free(self, idx):
        return self.free_mark[np.asarray(idx, dtype=np.int64)]


class StrictSWAAllocator:
    """A duck-typed stand-in for SGLang's ``SWATokenToKVPoolAllocator`` (torch
    indices, keyword-only ``start_pos``) that enforces its peer contract as hard
    errors: ``free`` / ``free_segment`` / ``free_swa*`` need every slot mapped to an
    SWA peer ("caller wants free_full"), ``free_full*`` needs none mapped
    ("caller wants free_segment"). Written for these tests from the contract in
    hybrid_api.md and the spec's action table (§3.8)."""

    def __init__(self, size, size_swa, page_size=1):
        self.page_size = page_size
        self.size_full, self.size_swa = size, size_swa
        self.full_attn_allocator = _Side(size)
        self.swa_attn_allocator = _Side(size_swa)
        self.full_to_swa_index_mapping = np.zeros(size + page_size + 1, dtype=np.int64)
        self.calls = []

    @property
    def size(self):
        return min(self.size_full, self.size_swa)

    def clear(self):
        self.full_attn_allocator = _Side(self.size_full)
        self.swa_attn_allocator = _Side(self.size_swa)
        self.full_to_swa_index_mapping[:] = 0

    def available_size(self):
        return min(self.full_available_size(), self.swa_available_size())

    def full_available_size(self):
        return self.full_attn_allocator.available_size()

    def swa_available_size(self):
        return self.swa_attn_allocator.available_size()

    def alloc(self, n):
        if n > self.full_available_size() or n > self.swa_available_size():
            return None
        full = self.full_attn_allocator.alloc(n)
        swa = self.swa_attn_allocator.alloc(n)
        self.full_to_swa_index_mapping[full.numpy()] = swa.numpy()
        return full

    @staticmethod
    def _np(x):
        assert isinstance(x, torch.Tensor), f"SGLang's allocator takes torch tensors, got {type(x)}"
        return x.numpy().astype(np.int64)

    def translate_swa_indices_for_transfer(self, kv_indices):
        return torch.from_numpy(self.full_to_swa_index_mapping[self._np(kv_indices)].copy())

    translate_loc_from_full_to_swa = translate_swa_indices_for_transfer

    def set_full_to_swa_mapping(self, full_indices, swa_indices):
        f, w = self._np(full_indices), self._np(swa_indices)
        assert f.shape == w.shape
        self.full_to_swa_index_mapping[f] = w

    def clear_full_to_swa_mapping(self, full_indices):
        self.full_to_swa_index_mapping[self._np(full_indices)] = 0

    def free_swa(self, free_index):
        f = self._np(free_index)
        if not f.size:
            return
        swa = self.full_to_swa_index_mapping[f]
        assert (swa > 0).all(), f"swa.peer_mapped: Full slots {f[swa <= 0]} have no SWA peer " \
                                "(caller wants free_full)"
        self.swa_attn_allocator.free(swa)
        self.full_to_swa_index_mapping[f] = 0

    def free_swa_segment(self, free_index, *, start_pos):
        assert start_pos % self.page_size == 0
        self.calls.append(("free_swa_segment", len(free_index)))
        self.free_swa(free_index)

    def free_full(self, free_index):
        f = self._np(free_index)
        if not f.size:
            return
        assert (self.full_to_swa_index_mapping[f] == 0).all(), \
            f"swa.peer_released: Full slots {f} still map to SWA slots (caller wants free)"
        self.full_attn_allocator.free(f)

    def free_full_segment(self, free_index, *, start_pos):
        assert start_pos % self.page_size == 0
        self.calls.append(("free_full_segment", len(free_index)))
        self.free_full(free_index)

    def free(self, free_index):
        self.calls.append(("free", len(free_index)))
        self.free_swa(free_index)
        self.free_full(free_index)

    def free_segment(self, free_index, *, start_pos):
        assert start_pos % self.page_size == 0
        self.free(free_index)


class SWAEnv:
    """An SWA cache (window ``W``, page ``P``) with flatradix's SWA allocator (or, with
    ``strict``, the SGLang-contract double above) and a request pool; ``reqs`` are
    the running requests the partition counts."""

    def __init__(self, W, P=1, size=64, size_swa=None, rows=4, ctx=64, eagle=False,
                 strict=False, disable=False):
        self.W, self.P = W, P
        kind = StrictSWAAllocator if strict else SWATokenToKVPoolAllocator
        self.alloc = kind(size, size if size_swa is None else size_swa, page_size=P)
        self.rtp = ReqToTokenPool(rows, ctx)
        self.cache = UnifiedRadixCache(
            page_size=P, tree_components=FS, sliding_window_size=W, is_eagle=eagle,
            token_to_kv_pool_allocator=self.alloc, req_to_token_pool=self.rtp, disable=disable)
        self.reqs = []

    # ---------------------------------------------------------------- plain API
    def fresh(self, n, swa_dead=0):
        """``n`` fresh Full slots with SWA peers; the first ``swa_dead`` lose their
        peer (as a request's out-of-window frees do)."""
        v = self.alloc.alloc(n)
        assert v is not None, "pool exhausted"
        if swa_dead:
            self.alloc.free_swa_segment(v[:swa_dead], start_pos=0)
        return v

    def insert(self, toks, value=None, cursor=0, prev=0, **kw):
        """Insert ``toks``; ``value`` defaults to fresh slots whose peers below
        ``cursor`` are already freed. Returns the InsertResult."""
        if value is None:
            value = self.fresh(len(toks), swa_dead=min(cursor, len(toks)))
        p = InsertParams(key=RadixKey(list(toks)), value=value, prev_prefix_len=prev, **kw)
        if cursor:
            p.set_evicted_seqlen(SWA, cursor)
        return self.cache.insert(p)

    def match(self, toks):
        return self.cache.match_prefix(MatchPrefixParams(key=RadixKey(list(toks))))

    # ---------------------------------------------------------------- requests
    def admit(self, toks, rid=None):
        """A scheduler's admission: match, lock the matched node, a row holding the
        matched prefix's slots then fresh ones."""
        c = self.cache
        toks = list(toks)
        m = c.match_prefix(MatchPrefixParams(key=RadixKey(toks, is_bigram=c.is_eagle)))
        plen = m.device_prefix_len
        lock = c.lock(m.last_device_node)
        row = self.rtp.alloc(1)[0]
        self.rtp.write((row, slice(0, plen)), m.device_indices)
        self.rtp.write((row, slice(plen, len(toks))), self.fresh(len(toks) - plen))
        req = Req(origin_input_ids=toks, req_pool_idx=row, prefix_indices=m.device_indices,
                  last_node=m.last_device_node, lock=lock, kv_committed_len=len(toks),
                  swa_branching_seqlen=m.swa_branching_seqlen, rid=rid)
        self.reqs.append(req)
        return req, m

    def decode(self, req, new):
        """Append tokens ``new`` with fresh slots (their KV now computed)."""
        have = req.kv_committed_len
        self.rtp.write((req.req_pool_idx, slice(have, have + len(new))), self.fresh(len(new)))
        req.output_ids = list(req.output_ids) + list(new)
        req.fill_ids = list(req.fill_ids) + list(new)
        req.kv_committed_len = have + len(new)

    def release(self, req, checkpoint=True):
        self.cache.release_kv_cache(req, checkpoint=checkpoint)
        self.reqs.remove(req)

    def row(self, req):
        return np.asarray(self.rtp.req_to_token[req.req_pool_idx])

    # ---------------------------------------------------------------- the model
    def check(self):
        check_partition(self.cache, self.alloc, self.reqs)


def owned(req, rtp):
    """``(full slots, positions)`` the running request owns: row ``[protected, committed)``."""
    p = req.cache_protected_len
    if p is None:
        p = len(req.prefix_indices)
    c = req.kv_committed_len
    row = np.asarray(rtp.req_to_token[req.req_pool_idx])
    return row[p:c].astype(np.int64), np.arange(p, c)


def check_partition(cache, alloc, reqs, rtp=None):
    """The slot partition of both pools and the ledgers (see the module docstring).
    Raises AssertionError naming what broke."""
    cache.sanity_check()
    rtp = rtp if rtp is not None else cache.req_to_token_pool
    mapping = alloc.full_to_swa_index_mapping
    nf, ns = alloc.size_full, alloc.size_swa
    walk = nodes(cache)

    cached, live_full, tomb_full = [], [], []
    ev = pr = sev = spr = swa_total = 0
    for n in walk:
        v = np.asarray(n["value"], dtype=np.int64)
        cached.append(v)
        k = len(v)
        if n["lock_ref"] > 0:
            pr += k
        else:
            ev += k
        if n["has_swa"]:
            live_full.append(v)
            swa_total += k
            if n["swa_lock_ref"] > 0:
                spr += k
            else:
                sev += k
        else:
            tomb_full.append(v)
    full_total = sum(len(v) for v in cached)
    assert cache.total_size() == (full_total, swa_total), (
        cache.total_size(), full_total, swa_total)
    assert (cache.evictable_size(), cache.protected_size()) == (ev, pr), "Full ledgers"
    assert (cache.swa_evictable_size(), cache.swa_protected_size()) == (sev, spr), "SWA ledgers"

    own_full, own_live, own_dead = [], [], []
    for r in reqs:
        if r.req_pool_idx is None:
            continue
        slots, pos = owned(r, rtp)
        own_full.append(slots)
        cur = r.swa_evicted_seqlen or 0
        own_live.append(slots[pos >= cur])
        own_dead.append(slots[pos < cur])

    cat = lambda parts: np.concatenate(parts) if parts else np.empty(0, np.int64)  # noqa: E731
    full_free = np.nonzero(alloc.full_attn_allocator.is_free(np.arange(nf + 1)))[0]
    every_full = np.concatenate([full_free, cat(cached), cat(own_full)])
    assert len(every_full) == nf and np.array_equal(np.sort(every_full), np.arange(1, nf + 1)), (
        f"Full pool is not partitioned: {len(full_free)} free + {full_total} cached + "
        f"{len(cat(own_full))} owned != {nf} (or a slot is in two places / missing)")

    assert (mapping[full_free] == 0).all(), "a free Full slot still maps to an SWA slot"
    assert (mapping[cat(tomb_full)] == 0).all(), "a tombstone keeps a stale Full->SWA mapping"
    assert (mapping[cat(own_dead)] == 0).all(), "a request slot below its cursor keeps its SWA peer"
    live = np.concatenate([mapping[cat(live_full)], mapping[cat(own_live)]])
    assert (live > 0).all(), "a live SWA position has no SWA peer"
    swa_free = np.nonzero(alloc.swa_attn_allocator.is_free(np.arange(ns + 1)))[0]
    every_swa = np.concatenate([swa_free, live])
    assert len(every_swa) == ns and np.array_equal(np.sort(every_swa), np.arange(1, ns + 1)), (
        f"SWA pool is not partitioned: {len(swa_free)} free + {len(live)} live != {ns} "
        "(or a slot is in two places / missing)")


def fresh_cache(W, P=1, **kw):
    """Just an SWA cache + allocator (no requests)."""
    return SWAEnv(W, P, **kw)


__all__ = ["FULL", "SWA", "FS", "SWAEnv", "nodes", "find", "shape", "check_partition",
           "owned", "fresh_cache", "UnifiedRadixCache"]
