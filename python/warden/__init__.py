"""warden for redis-py: server-side locks, read-write locks, semaphores and
cache leases.

``warden.Lock`` is a drop-in for ``redis.lock.Lock``
(``r.lock(name, lock_class=warden.Lock)``); ``warden.Semaphore`` lets at
most N holders in at once; ``warden.Cache`` loads each missing value once
however many callers ask. ``warden.asyncio`` has the same names for
``redis.asyncio`` clients.
"""

from importlib.metadata import PackageNotFoundError, version

from redis.exceptions import LockError, LockNotOwnedError

from ._core import BytesSerializer, CacheWaitTimeout, JsonSerializer, Serializer, TextSerializer
from .cache import Cache
from .lock import Lock, ReadLock, ReadWriteLock, WriteLock
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
    "ReadLock",
    "ReadWriteLock",
    "Semaphore",
    "Serializer",
    "TextSerializer",
    "WriteLock",
    "__version__",
]
