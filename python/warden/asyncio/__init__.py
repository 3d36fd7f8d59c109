"""warden for ``redis.asyncio`` clients: the same names as ``warden``."""

from redis.exceptions import LockError, LockNotOwnedError

from .._core import (
    BytesSerializer,
    CacheWaitTimeout,
    JsonSerializer,
    Serializer,
    TextSerializer,
)
from .._rate import RateDecision, RateInfo
from .cache import Cache
from .lock import Lock, ReadLock, ReadWriteLock, WriteLock
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
