"""warden for ``redis.asyncio`` clients: the same names as ``warden``."""

from redis.exceptions import LockError, LockNotOwnedError

from .._core import (
    BytesSerializer,
    CacheWaitTimeout,
    JsonSerializer,
    Serializer,
    TextSerializer,
)
from .._near import NearCacheConfig, NearCacheStats
from .._rate import RateDecision, RateInfo
from .cache import Cache
from .lock import Lock, ReadLock, ReadWriteLock, WriteLock
from .near_cache import NearCache
from .rate import RateLimiter
from .semaphore import Semaphore

__all__ = [
    "BytesSerializer",
    "Cache",
    "CacheWaitTimeout",
    "JsonSerializer",
    "Lock",
    "LockError",
    "LockNotOwnedError",
    "NearCache",
    "NearCacheConfig",
    "NearCacheStats",
    "RateDecision",
    "RateInfo",
    "RateLimiter",
    "ReadLock",
    "ReadWriteLock",
    "Semaphore",
    "Serializer",
    "TextSerializer",
    "WriteLock",
]
