"""flatradix: SGLang's UnifiedRadixCache prefix cache on a Numba flat-array engine.

Import everything from here::

    from flatradix import UnifiedRadixCache, RadixKey, InsertParams, MatchPrefixParams
"""

__version__ = "0.1.0"

from . import _compile_notice

_compile_notice.install()   # one line on stderr when a run compiles kernels

from .cache import UnifiedRadixCache
from .errors import CacheInvariantError, LockRefError, NodeAccessError
from .pools import (
    HostKVPool, HybridReqToTokenPool, MambaSlotAllocator, ReqToTokenPool,
    SWATokenToKVPoolAllocator, TokenToKVPoolAllocator,
)
from .requests import Req
from .transfer import KVTransfer
from .types import (
    ComponentType, DecLockRefParams, DecLockRefResult, EvictParams, EvictResult, InitLoadBackParams,
    EvictStep, IncLockRefResult, InsertParams, InsertResult, MatchPrefixParams,
    MatchResult, RadixKey, TreeLock,
)

__all__ = [
    "UnifiedRadixCache", "RadixKey", "MatchPrefixParams", "MatchResult", "InsertParams",
    "InsertResult", "EvictParams", "EvictResult", "InitLoadBackParams", "EvictStep", "IncLockRefResult",
    "DecLockRefParams", "DecLockRefResult", "ComponentType", "NodeAccessError",
    "LockRefError", "CacheInvariantError", "TokenToKVPoolAllocator", "ReqToTokenPool", "Req",
    "SWATokenToKVPoolAllocator", "TreeLock", "HybridReqToTokenPool", "MambaSlotAllocator",
    "HostKVPool", "KVTransfer",
]
