"""The scenarios of ``../shared/spec/known_bugs.md`` that concern the Full tree,
each with the values stated there."""

import numpy as np
import pytest

from flatradix import (
    EvictParams, InsertParams, LockRefError, MatchPrefixParams, RadixKey, UnifiedRadixCache,
)


def ins(c, toks, value=None, **ns):
    v = None if value is None else np.asarray(value, dtype=np.int64)
    return c.insert(InsertParams(key=RadixKey(list(toks), **ns), value=v)).prefix_len


def match(c, toks, **ns):
    return c.match_prefix(MatchPrefixParams(key=RadixKey(list(toks), **ns)))


def invariant(c):
    c.sanity_check()
    ev, pr, tot = c.evictable_size(), c.protected_size(), c.total_size()[0]
    assert ev >= 0 and pr >= 0 and ev + pr == tot


def test_b1_sub_page_key_gives_empty_match():
    c = UnifiedRadixCache(page_size=4)
    ins(c, range(1, 9))
    for toks in ([1, 2, 3], []):
        m = match(c, toks)
        assert m.device_prefix_len == 0
        assert len(m.device_indices) == 0
        assert m.last_device_node == c.root_node_handle()
        assert c.node_count() == 1
    m = match(c, range(1, 8))
    assert m.device_prefix_len == 4
    assert c.node_count() <= 2
    assert ins(c, [9, 9, 9]) == 0
    assert c.node_count() <= 2
    assert c.total_size()[0] == c.evictable_size() == 8
    invariant(c)


def test_b2_lock_includes_matched_node():
    c = UnifiedRadixCache(page_size=1)
    ins(c, [1, 2, 3, 4])
    assert ins(c, [1, 2, 3, 5, 6]) == 3
    m = match(c, [1, 2, 3, 5, 6])
    receipt = c.inc_lock_ref(m.last_device_node)
    assert (c.protected_size(), c.evictable_size()) == (5, 1)
    assert c.evict(EvictParams(num_tokens=100)).num_tokens_evicted == 1
    assert match(c, [1, 2, 3, 5, 6]).device_prefix_len == 5
    assert match(c, [1, 2, 3, 4]).device_prefix_len == 3
    assert c.total_size()[0] == 5
    c.dec_lock_ref(m.last_device_node, receipt)
    assert (c.protected_size(), c.evictable_size()) == (0, 5)
    invariant(c)


def test_b4_split_under_lock_and_unbalanced_unlock():
    c = UnifiedRadixCache(page_size=1)
    ins(c, range(1, 7))
    node = match(c, range(1, 7)).last_device_node
    c.inc_lock_ref(node)
    assert ins(c, [1, 2, 3, 7]) == 3
    assert (c.protected_size(), c.evictable_size(), c.total_size()[0]) == (6, 1, 7)
    invariant(c)
    c.dec_lock_ref(node)
    assert (c.protected_size(), c.evictable_size()) == (0, 7)
    before = c._snapshot()
    with pytest.raises(LockRefError, match="lock_ref=0"):
        c.dec_lock_ref(node)
    after = c._snapshot()
    np.testing.assert_array_equal(before["nodes"], after["nodes"])
    assert (c.protected_size(), c.evictable_size()) == (0, 7)
    c.inc_lock_ref(node)
    assert c.protected_size() == 6
    invariant(c)


@pytest.mark.parametrize("probe", [
    dict(extra_key="a", cache_salt="bc"),
    dict(cache_salt="abc"),
    dict(extra_key="abc"),
    dict(extra_key="ab"),
    dict(),
    dict(extra_key="ab", cache_salt="c"),
])
def test_b5_namespaces_never_collide(probe):
    # lora "ab" + salt "c"; SGLang folds the LoRA id into extra_key.
    c = UnifiedRadixCache(page_size=1)
    ins(c, [1, 2, 3, 4], extra_key="ab", cache_salt="c")
    expected = 4 if probe == dict(extra_key="ab", cache_salt="c") else 0
    assert match(c, [1, 2, 3, 4], **probe).device_prefix_len == expected
    invariant(c)


def test_b5_lora_name_vs_salt_and_lora_uid():
    c = UnifiedRadixCache(page_size=1)
    ins(c, [1, 2, 3, 4], cache_salt="X")
    assert match(c, [1, 2, 3, 4], extra_key="X").device_prefix_len == 0
    ins(c, [1, 2, 3, 4], extra_key="ab#uid=1")
    assert match(c, [1, 2, 3, 4], extra_key="ab#uid=2").device_prefix_len == 0
    # None and "" are different extra_key namespaces (SGLang's choice, documented);
    # an empty cache_salt is normalised to None.
    ins(c, [5, 6], extra_key="")
    assert match(c, [5, 6]).device_prefix_len == 0
    assert match(c, [5, 6], extra_key="", cache_salt="").device_prefix_len == 2
    # Separate namespaces never share nodes: 4 namespaces -> 4 distinct subtrees.
    assert c.node_count() == 3
    invariant(c)


def test_b12_eagle_bigram_short_inputs():
    c = UnifiedRadixCache(page_size=4, is_eagle=True)
    ins(c, range(1, 10))
    assert c.total_size()[0] == 8
    assert match(c, [1, 2, 3, 4]).device_prefix_len == 0
    assert match(c, [1, 2, 3, 4, 5]).device_prefix_len == 4
    assert match(c, [1, 2, 3, 4, 5, 6]).device_prefix_len == 4
    assert ins(c, [7, 8, 9, 10]) == 0
    assert c.total_size()[0] == 8
    invariant(c)


def test_b16_no_ghost_hit_after_eviction():
    c = UnifiedRadixCache(page_size=1)
    ins(c, [1, 2, 3], [10, 11, 12])
    r = c.evict(EvictParams(num_tokens=3))
    assert r.num_tokens_evicted == 3
    np.testing.assert_array_equal(r.evicted_indices, [10, 11, 12])
    assert c.total_size()[0] == 0
    assert match(c, [1, 2, 3]).device_prefix_len == 0
    assert ins(c, [1, 2, 3], [20, 21, 22]) == 0
    m = match(c, [1, 2, 3])
    assert m.device_prefix_len == 3
    np.testing.assert_array_equal(m.device_indices, [20, 21, 22])
    invariant(c)
