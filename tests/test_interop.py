"""Values as torch tensors or numpy arrays come back in the kind inserted; keys
as lists, array('q'), numpy or torch; and the kernels compile once, then later
processes load them from Numba's cache."""

import os
import subprocess
import sys
from array import array

import numpy as np
import pytest
import torch

from flatradix import (
    EvictParams, InsertParams, MatchPrefixParams, RadixKey, Req, ReqToTokenPool,
    TokenToKVPoolAllocator, UnifiedRadixCache,
)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_torch_values_round_trip(dtype):
    c = UnifiedRadixCache(page_size=1)
    c.insert(InsertParams(key=RadixKey(torch.tensor([1, 2, 3, 4])), value=torch.tensor([5, 6, 7, 8], dtype=dtype)))
    m = c.match_prefix(MatchPrefixParams(key=RadixKey(array("q", [1, 2, 3, 9]))))
    assert isinstance(m.device_indices, torch.Tensor) and m.device_indices.dtype == torch.int64
    assert m.device_indices.tolist() == [5, 6, 7]
    r = c.evict(EvictParams(num_tokens=10))
    assert isinstance(r.evicted_indices, torch.Tensor)
    assert sorted(r.evicted_indices.tolist()) == [5, 6, 7, 8]


def test_numpy_values_round_trip_and_results_do_not_alias_scratch():
    c = UnifiedRadixCache(page_size=1)
    c.insert(InsertParams(key=RadixKey([1, 2, 3]), value=np.array([5, 6, 7], dtype=np.int32)))
    m1 = c.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3])))
    c.insert(InsertParams(key=RadixKey([9, 9, 9]), value=np.array([1, 1, 1])))
    c.match_prefix(MatchPrefixParams(key=RadixKey([9, 9, 9])))
    assert isinstance(m1.device_indices, np.ndarray) and m1.device_indices.tolist() == [5, 6, 7]


def test_torch_allocator_and_request_flow():
    alloc = TokenToKVPoolAllocator(64, index_kind="torch")
    rtp = ReqToTokenPool(4, 32, index_kind="torch")
    c = UnifiedRadixCache(page_size=2, token_to_kv_pool_allocator=alloc, req_to_token_pool=rtp)
    req = Req(origin_input_ids=[1, 2, 3, 4, 5], output_ids=[6, 7, 8])
    req.req_pool_idx = rtp.alloc(1)[0]
    slots = alloc.alloc(7)
    rtp.req_to_token[req.req_pool_idx, :7] = slots
    req.last_node = c.root_node_handle()
    c.cache_finished_req(req)
    assert c.total_size()[0] == 6  # 7 committed -> 6 page-aligned, prompt split at 4
    assert alloc.available_size() + c.evictable_size() == 64
    m = c.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3, 4, 5, 6, 7])))
    assert isinstance(m.device_indices, torch.Tensor) and m.device_prefix_len == 6
    c.sanity_check()


@pytest.mark.slow   # compiles kernels in a fresh process (empty cache)
def test_first_process_compiles_later_processes_load_from_cache(tmp_path):
    code = ("import numpy as np\n"
            "from flatradix import UnifiedRadixCache, RadixKey, InsertParams, MatchPrefixParams\n"
            "c = UnifiedRadixCache()\n"
            "c.insert(InsertParams(key=RadixKey(np.arange(4)), value=np.arange(4)))\n"
            "c.match_prefix(MatchPrefixParams(key=RadixKey(np.arange(4))))\n")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), NUMBA_DEBUG_CACHE="1")

    def run():
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, check=True).stdout

    first = run()
    assert "[cache] data saved" in first
    second = run()
    assert "[cache] data saved" not in second
    assert "[cache] data loaded" in second


@pytest.mark.parametrize("ids", [[5, 6, 7], np.array([5, 6, 7]), torch.tensor([5, 6, 7]),
                                 array("q", [5, 6, 7]), (5, 6, 7)],
                         ids=["list", "numpy", "torch", "array", "tuple"])
def test_req_default_fill_ids_is_the_prompt_container(ids):
    """``Req.fill_ids`` defaults to the prompt's own container (no copy, no list round
    trip), whatever it is (issue 14)."""
    r = Req(origin_input_ids=ids)
    assert r.fill_ids is ids


def test_request_tokens_are_converted_at_most_once():
    """The request path reads buffer containers without a copy and converts a list
    once per request, again only when the field holds another list or a longer one."""
    from flatradix.requests import _req_tokens

    buf = array("q", range(10, 30))
    r = Req(origin_input_ids=buf)
    a = _req_tokens(r, "fill_ids")
    assert np.shares_memory(a, np.frombuffer(buf, dtype=np.int64))
    t = torch.arange(5, dtype=torch.int64)
    assert np.shares_memory(_req_tokens(Req(origin_input_ids=t), "fill_ids"), t.numpy())
    lst = list(range(40, 60))
    r = Req(origin_input_ids=lst)
    first = _req_tokens(r, "fill_ids")
    assert first.tolist() == lst and _req_tokens(r, "fill_ids") is first
    lst.append(99)  # extended in place: converted again
    again = _req_tokens(r, "fill_ids")
    assert again is not first and again.tolist() == lst
    r.fill_ids = lst[:5]  # replaced
    assert _req_tokens(r, "fill_ids").tolist() == lst[:5]


def test_req_converts_a_list_once_whatever_fields_hold_it(monkeypatch):
    """The same list as the prompt and, explicitly, ``fill_ids``: one conversion,
    and both fields read the one copy (counted)."""
    import flatradix._cast as cast
    from flatradix.requests import _req_tokens

    calls = []
    real = cast._to_numpy

    def counting(x, name):
        if type(x) is list and x:
            calls.append(name)
        return real(x, name)

    monkeypatch.setattr(cast, "_to_numpy", counting)
    lst = list(range(7, 19))
    r = Req(origin_input_ids=lst, fill_ids=lst)
    a, b = _req_tokens(r, "origin_input_ids"), _req_tokens(r, "fill_ids")
    assert a is b and a.tolist() == lst and calls == ["origin_input_ids"]


def test_match_with_req_converts_its_list_prompt_once(monkeypatch):
    """``Req`` converts a list prompt once, when it validates it, and keeps the copy;
    ``match_prefix(MatchPrefixParams(key=RadixKey(req.origin_input_ids), req=req))``
    and ``release_kv_cache`` read that memo: one conversion per request (counted at
    both names the code calls), same result as a plain match."""
    import flatradix._cast as cast
    from flatradix import (InsertParams, MatchPrefixParams, RadixKey, ReqToTokenPool,
                           TokenToKVPoolAllocator, UnifiedRadixCache)

    alloc = TokenToKVPoolAllocator(64)
    rtp = ReqToTokenPool(2, 32)
    c = UnifiedRadixCache(token_to_kv_pool_allocator=alloc, req_to_token_pool=rtp)
    c.insert(InsertParams(key=RadixKey(list(range(8))), value=alloc.alloc(8)))
    prompt = list(range(12))
    calls = []
    real = cast._to_numpy

    def counting(x, name):
        if type(x) is list and x:
            calls.append(len(x))
        return real(x, name)

    monkeypatch.setattr(cast, "_to_numpy", counting)
    import flatradix.requests as requests_mod
    monkeypatch.setattr(requests_mod, "_to_numpy", counting)
    req = Req(origin_input_ids=prompt)
    assert calls == [12]  # validating the list is its conversion, kept in the memo
    m = c.match_prefix(MatchPrefixParams(key=RadixKey(prompt), req=req))
    assert m.device_prefix_len == 8 and calls == [12]
    plain = c.match_prefix(MatchPrefixParams(key=RadixKey(list(prompt))))
    assert calls == [12, 12] and plain.device_prefix_len == 8
    np.testing.assert_array_equal(np.asarray(m.device_indices), np.asarray(plain.device_indices))
    # the request path reuses the memo: no third conversion of the prompt
    req.req_pool_idx = rtp.alloc(1)[0]
    row = np.concatenate([np.asarray(m.device_indices), alloc.alloc(4)])
    rtp.req_to_token[req.req_pool_idx, :12] = row
    c.inc_lock_ref(m.last_device_node)
    req.last_node, req.cache_protected_len = m.last_device_node, 8
    req.kv_committed_len = req.kv_allocated_len = 12
    c.release_kv_cache(req)
    assert calls == [12, 12]
    assert c.evictable_size() == 12 and alloc.available_size() == 64 - 12
