"""The parts the sync and asyncio halves share: argument mapping, owner tokens,
reply shapes, cache keys and serializers. Nothing here talks to a server."""

from __future__ import annotations

import inspect
import json
import math
import os
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol, Union

from redis.exceptions import AskError, LockError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

Number = Union[int, float]

#: The lease of a lock created with ``timeout=None``: the watchdog renews it
#: every third of this while the lock is held (Redisson's default).
WATCHDOG_TIMEOUT = 30.0

#: How much longer than its ``WAIT`` a blocking request waits for its reply
#: before the client gives up and closes the connection (the server answers a
#: timed-out waiter within a few ms; the rest covers a busy machine).
READ_MARGIN = 5.0

#: One process-wide prefix for re-entrant owners (stable per thread or task).
PROCESS_ID = f"{uuid.uuid4().hex}:{os.getpid()}"


@dataclass(frozen=True)
class LockCommands:
    """The commands behind one kind of lock."""

    acquire: str
    release: str
    extend: str
    info: str


EXCLUSIVE = LockCommands("LOCK.ACQUIRE", "LOCK.RELEASE", "LOCK.EXTEND", "LOCK.INFO")
READ = LockCommands("RWLOCK.READ", "RWLOCK.UNLOCK", "RWLOCK.EXTEND", "RWLOCK.INFO")
WRITE = LockCommands("RWLOCK.WRITE", "RWLOCK.UNLOCK", "RWLOCK.EXTEND", "RWLOCK.INFO")


def to_ms(seconds: Number) -> int:
    """Seconds (int or float, as redis-py takes them) to whole milliseconds, at least 1."""
    return max(1, int(math.ceil(seconds * 1000)))


def wait_ms(blocking: bool, blocking_timeout: Optional[Number]) -> Optional[int]:
    """The ``WAIT`` of an acquire: None for no wait, 0 for forever."""
    if not blocking:
        return None
    if blocking_timeout is None:
        return 0
    if blocking_timeout <= 0:
        return None
    return to_ms(blocking_timeout)


def read_timeout(wait: Optional[int]) -> Optional[float]:
    """The client-side read timeout of a request that waits ``wait`` ms (0 =
    forever: ``math.inf``); None (no ``WAIT``) keeps the connection's own."""
    if wait is None:
        return None
    if wait == 0:
        return math.inf
    return wait / 1000 + READ_MARGIN


def acquire_args(
    commands: LockCommands, name: str, owner: bytes, lease_ms: int, wait: Optional[int]
) -> list[Any]:
    args: list[Any] = [commands.acquire, name, owner, lease_ms]
    if wait is not None:
        args += ["WAIT", wait]
    return args


def fresh_owner() -> bytes:
    """A new owner for one acquisition (redis-py's token shape)."""
    return uuid.uuid4().hex.encode()


def reentrant_owner(holder: int) -> bytes:
    """A stable owner for one thread (or task) of this process."""
    return f"{PROCESS_ID}:{holder}".encode()


def encode(value: Union[str, bytes]) -> bytes:
    return value.encode() if isinstance(value, str) else value


def text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def info_map(reply: Any) -> Optional[dict[str, Any]]:
    """``LOCK.INFO``/``RWLOCK.INFO``/``CACHE.INFO`` as a dict with str keys,
    whether the connection speaks RESP2 (flat list) or RESP3 (map, bytes keys)."""
    if reply is None:
        return None
    if isinstance(reply, dict):
        items = list(reply.items())
    else:
        items = list(zip(reply[::2], reply[1::2]))
    return {text(k): v for k, v in items}


def lock_error(cls: type[LockError], message: str, name: str) -> LockError:
    """redis-py's lock exceptions, with ``lock_name`` where the installed version has it."""
    try:
        return cls(message, lock_name=name)  # type: ignore[call-arg,unused-ignore]
    except TypeError:
        return cls(message)


def is_wrongtype(error: ResponseError) -> bool:
    """A key of another type: for a lock, someone else's data holds the name."""
    return str(error).startswith("WRONGTYPE")


def is_redirect(error: ResponseError) -> bool:
    """A cluster redirect: the command did not run, so sending it again is safe."""
    message = str(error)
    return isinstance(error, AskError) or message.startswith(("MOVED", "ASK"))


# --- cache ---------------------------------------------------------------


class Serializer(Protocol):
    """How a cache turns values into the plain strings it stores, and back."""

    def dumps(self, value: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


class BytesSerializer:
    """Values are ``bytes`` (``str`` is stored UTF-8 encoded): the default."""

    def dumps(self, value: Any) -> bytes:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        if isinstance(value, str):
            return value.encode()
        raise TypeError(
            f"BytesSerializer stores bytes or str, not {type(value).__name__}: "
            "use warden.JsonSerializer() or your own serializer"
        )

    def loads(self, data: bytes) -> Any:
        return data


class TextSerializer:
    """Values are ``str``, stored UTF-8 encoded."""

    def dumps(self, value: Any) -> bytes:
        return str(value).encode()

    def loads(self, data: bytes) -> Any:
        return data.decode()


class JsonSerializer:
    """Values are anything ``json.dumps`` takes."""

    def dumps(self, value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":")).encode()

    def loads(self, data: bytes) -> Any:
        return json.loads(data)


def cache_key(
    key: Union[str, Callable[..., str]],
    signature: inspect.Signature,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> str:
    """The cache key of one call: a format string over the parameters, or a callable."""
    if callable(key):
        return key(*args, **kwargs)
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return key.format(**bound.arguments)


@dataclass(frozen=True)
class CacheRequest:
    """One ``CACHE.GET``: what to send and how long to read."""

    key: str
    lease_ms: int
    wait_ms: int
    refresh_ms: Optional[int]

    def args(self) -> list[Any]:
        args: list[Any] = ["CACHE.GET", self.key, self.lease_ms, "WAIT", self.wait_ms]
        if self.refresh_ms is not None:
            args += ["REFRESH", self.refresh_ms]
        return args

    def read_timeout(self) -> Optional[float]:
        return read_timeout(self.wait_ms)


def fill_args(
    key: str, lease: int, data: bytes, ttl: Optional[Number], jitter: Optional[Number]
) -> list[Any]:
    args: list[Any] = ["CACHE.FILL", key, lease, data]
    if ttl is not None:
        args += ["PX", to_ms(ttl)]
        if jitter:
            args += ["JITTER", to_ms(jitter)]
    return args


class CacheWaitTimeout(RedisTimeoutError):
    """Every wait for another caller's load timed out (the loader is stuck)."""
