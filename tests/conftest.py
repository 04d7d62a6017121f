"""Shared fixtures: warm the JIT once per session so test time goes to examples."""

import numpy as np
import pytest

import flatradix
from flatradix import InsertParams, MatchPrefixParams, RadixKey


@pytest.fixture(scope="session", autouse=True)
def _warm_jit():
    c = flatradix.UnifiedRadixCache(page_size=1)
    c.insert(InsertParams(key=RadixKey([1, 2, 3]), value=np.array([1, 2, 3])))
    c.match_prefix(MatchPrefixParams(key=RadixKey([1, 2])))
    c.sanity_check()
    yield


def assert_state_equal(a, b):
    """Two ``UnifiedRadixCache._snapshot()`` dicts are identical."""
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], np.ndarray):
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        else:
            assert a[k] == b[k], k
