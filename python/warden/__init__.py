"""warden for redis-py: server-side locks, read-write locks, semaphores,
cache leases and rate limiters.

``warden.Lock`` is a drop-in for ``redis.lock.Lock``
(``r.lock(name, lock_class=warden.Lock)``); ``warden.Semaphore`` lets at
most N holders in at once; ``warden.Cache`` loads each missing value once
however many callers ask; ``warden.RateLimiter`` admits ``count`` per
``period``, its waiters queued in the server. ``warden.asyncio`` has the same
names for ``redis.asyncio`` clients.
"""

from importlib.metadata import PackageNotFoundError, version

from redis.exceptions import LockError, LockNotOwnedError

from ._core import BytesSerializer, CacheWaitTimeout, JsonSerializer, Serializer, TextSerializer
from ._near import NearCacheConfig, NearCacheStats
from ._rate import RateDecision, RateInfo
from .cache import Cache
from .lock import Lock, ReadLock, ReadWriteLock, WriteLock
from .near_cache import NearCache
from .rate import RateLimiter
from .semaphore import Semaphore

try:
    # The installed distribution's version (pyproject.toml), never a second copy.
    __version__ = version("warden-redis")
except PackageNotFoundError:  # imported from a source tree, not installed
    __version__ = "0+unknown"

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
    "__version__",
]
