"""warden for ``redis.asyncio`` clients: the same names as ``warden``."""

from redis.exceptions import LockError, LockNotOwnedError

from .._core import (
    BytesSerializer,
    CacheWaitTimeout,
    JsonSerializer,
    Serializer,
    TextSerializer,
)
from .cache import Cache
from .lock import Lock, ReadLock, ReadWriteLock, WriteLock
from .semaphore import Semaphore

__all__ = [
    "BytesSerializer",
    "Cache",
    "CacheWaitTimeout",
    "JsonSerializer",
    "Lock",
    "LockError",
    "LockNotOwnedError",
    "ReadLock",
    "ReadWriteLock",
    "Semaphore",
    "Serializer",
    "TextSerializer",
    "WriteLock",
]
