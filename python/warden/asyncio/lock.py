"""``warden.asyncio.Lock``: a drop-in for ``redis.asyncio.lock.Lock``, method
for method the same as ``warden.lock`` (read that module's notes). The
watchdog is a task; ``lost`` is an ``asyncio.Event`` of its own for each
hold, and ``lock.lost`` is the event of the calling task's current (or last)
hold, so another task's acquire never clears it; a re-entrant owner is stable
per task. A cancelled ``acquire`` closes its connection, which takes it out of
the server's queue, and gives back what the server may have granted it,
re-entrant or not.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from types import SimpleNamespace, TracebackType
from typing import Any, Literal, Optional, Union

from redis.exceptions import LockError, LockNotOwnedError, ResponseError

from .. import _core
from .._core import EXCLUSIVE, READ, WRITE, LockCommands, Number, lock_error
from ._connection import call

logger = logging.getLogger(__name__)

_background: set[asyncio.Task[Any]] = set()


def _in_background(coroutine: Any, name: str) -> asyncio.Task[Any]:
    task: asyncio.Task[Any] = asyncio.ensure_future(coroutine)
    _background.add(task)
    task.add_done_callback(_background.discard)
    return task


class _Watchdog:
    """Renews one holder's lease every third of it; sets ``lost`` when it cannot."""

    def __init__(self, lock: Lock, owner: bytes, lease_ms: int, lost: asyncio.Event) -> None:
        self.lock, self.owner, self.lease_ms = lock, owner, lease_ms
        self.lost = lost  # this hold's, not whichever hold the lock has later
        self.deadline = time.monotonic() + lease_ms / 1000
        self.task = _in_background(self.run(), f"warden-watchdog:{lock.name}")

    def stop(self) -> None:
        self.task.cancel()

    async def run(self) -> None:
        lease = self.lease_ms / 1000
        pause = lease / 3
        while True:
            await asyncio.sleep(pause)
            started = time.monotonic()
            remaining = self.deadline - started
            if remaining <= 0:
                return self._lost("its lease ended before it could be renewed")
            try:
                # Bounded as a whole: a new connection's handshake too.
                renewed = await asyncio.wait_for(
                    call(
                        self.lock.redis,
                        self.lock.name,
                        self.lock.commands.extend,
                        self.lock.name,
                        self.owner,
                        self.lease_ms,
                        timeout=remaining,
                    ),
                    remaining,
                )
            except ResponseError as error:
                if _core.is_wrongtype(error):
                    return self._lost("the key now holds another type")
                renewed = None
                logger.warning("renewing lock %r failed: %s", self.lock.name, error)
            except Exception as error:
                renewed = None
                logger.warning("renewing lock %r failed: %s", self.lock.name, error)
            if renewed is None:
                pause = max(0.01, min(lease / 3, (self.deadline - time.monotonic()) / 2))
                continue
            if renewed != 1:
                return self._lost("it is no longer held by this owner")
            self.deadline = started + lease
            pause = lease / 3

    def _lost(self, why: str) -> None:
        logger.warning("lock %r lost: %s", self.lock.name, why)
        self.lost.set()


# Each task's own hold events, by lock: a task sees the event of the hold it
# took even when another task (sharing the lock's thread-local state) takes
# the next one.
_task_lost: contextvars.ContextVar[dict[int, asyncio.Event]] = contextvars.ContextVar(
    "warden_task_lost"
)


def _holder() -> int:
    task = asyncio.current_task()
    return id(task) if task is not None else threading.get_ident()


class Lock:
    """A distributed lock held in the server, for ``redis.asyncio`` clients.
    Parameters as ``warden.Lock``."""

    commands: LockCommands = EXCLUSIVE

    def __init__(
        self,
        redis: Any,
        name: Union[str, bytes, memoryview],
        timeout: Optional[float] = None,
        sleep: float = 0.1,
        blocking: bool = True,
        blocking_timeout: Optional[Number] = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        *,
        reentrant: bool = False,
        watchdog_timeout: Number = _core.WATCHDOG_TIMEOUT,
    ) -> None:
        self.redis = redis
        self.name: Any = name
        self.timeout = timeout
        self.sleep = sleep
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        self.thread_local = bool(thread_local)
        self.raise_on_release_error = raise_on_release_error
        self.reentrant = reentrant
        self.watchdog_timeout = watchdog_timeout
        self.local: Any = threading.local() if self.thread_local else SimpleNamespace()
        self.local.token = None

    @property
    def lost(self) -> asyncio.Event:
        """Set when the watchdog could not renew the lease in time: stop the
        work the lock protects. Each hold has its own event (read it after
        ``acquire``); this is the calling task's current or last one."""
        event = _task_lost.get({}).get(id(self)) if self.thread_local else None
        if event is None:
            event = getattr(self.local, "lost", None)
        if event is None:
            event = self.local.lost = asyncio.Event()
        return event

    def _new_hold_event(self) -> asyncio.Event:
        event = self.local.lost = asyncio.Event()
        if self.thread_local:
            _task_lost.set({**_task_lost.get({}), id(self): event})
        return event

    @property
    def _token(self) -> Optional[bytes]:
        return getattr(self.local, "token", None)

    @property
    def fence(self) -> Optional[int]:
        """The fencing token of the current grant (None when not held)."""
        return getattr(self.local, "fence", None) if self._token is not None else None

    def _forget(self) -> None:
        dog: Optional[_Watchdog] = getattr(self.local, "watchdog", None)
        if dog is not None:
            dog.stop()
        self.local.token = None
        self.local.fence = None
        self.local.holds = 0
        self.local.watchdog = None

    def _lease_ms(self) -> int:
        return _core.to_ms(self.timeout if self.timeout else self.watchdog_timeout)

    async def __aenter__(self) -> Lock:
        if await self.acquire():
            return self
        raise lock_error(LockError, "Unable to acquire lock within the time specified", self.name)

    async def __aexit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        try:
            await self.release()
        except LockError:
            if self.raise_on_release_error:
                raise
            logger.warning("Lock was unlocked or no longer owned when exiting context manager.")

    async def acquire(
        self,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[Number] = None,
        token: Optional[Union[str, bytes]] = None,
    ) -> bool:
        """Take the lock; with ``blocking`` wait for it in the server's queue
        at most ``blocking_timeout`` seconds (None: forever). True once held."""
        if token is not None:
            owner = _core.encode(token)
        elif self.reentrant:
            owner = _core.reentrant_owner(_holder())
        else:
            owner = _core.fresh_owner()
        wait = _core.wait_ms(
            self.blocking if blocking is None else blocking,
            self.blocking_timeout if blocking_timeout is None else blocking_timeout,
        )
        lease_ms = self._lease_ms()
        args = _core.acquire_args(self.commands, self.name, owner, lease_ms, wait)
        reentrant = token is None and self.reentrant
        before = _core.REENTRANT_HOLDS.get(owner, self.name, self.commands) if reentrant else 0
        sent: list[bool] = []
        try:
            fence = await call(
                self.redis,
                self.name,
                *args,
                timeout=_core.read_timeout(wait),
                waits=wait is not None,
                on_sent=lambda: sent.append(True),
            )
        except ResponseError as error:
            if _core.is_wrongtype(error):
                return False
            raise
        except BaseException:
            # A grant may have crossed the close of the connection: give back
            # what this owner may hold because of this acquire (see
            # warden.lock), in the background: we may be cancelled.
            if token is None and (not reentrant or before == 0 or sent):
                _in_background(self._give_back(owner), f"warden-give-back:{self.name}")
            raise
        if fence is None:
            return False
        if reentrant:
            _core.REENTRANT_HOLDS.add(owner, self.name, self.commands, 1)
        if self._token != owner:
            self._forget()
            self.local.token = owner
            self.local.holds = 0
            lost = self._new_hold_event()
            if not self.timeout:
                self.local.watchdog = _Watchdog(self, owner, lease_ms, lost)
        self.local.holds = getattr(self.local, "holds", 0) + 1
        self.local.fence = int(fence)
        return True

    async def _give_back(self, owner: bytes) -> None:
        try:
            released = await call(
                self.redis, self.name, self.commands.release, self.name, owner, timeout=1.0
            )
            if self.reentrant:
                _core.REENTRANT_HOLDS.released(owner, self.name, self.commands, released)
        except Exception:
            logger.debug("could not give back lock %r after a failed wait", self.name)

    async def locked(self) -> bool:
        """True if anyone holds this lock."""
        return bool(await call(self.redis, self.name, "EXISTS", self.name))

    async def owned(self) -> bool:
        """True if this holder holds it."""
        token = self._token
        if token is None:
            return False
        try:
            reply = await call(self.redis, self.name, self.commands.info, self.name)
        except ResponseError as error:
            if _core.is_wrongtype(error):
                return False
            raise
        info = _core.info_map(reply)
        return info is not None and self._holds_in(info, token)

    def _holds_in(self, info: dict[str, Any], token: bytes) -> bool:
        owner = info.get("owner")
        return owner is not None and _core.encode(owner) == token

    async def release(self) -> None:
        """Give up one hold; ``LockNotOwnedError`` if the lock was no longer ours."""
        token = self._token
        if token is None:
            raise lock_error(
                LockError,
                "Cannot release a lock that's not owned or is already unlocked.",
                self.name,
            )
        try:
            released = await call(self.redis, self.name, self.commands.release, self.name, token)
        except ResponseError as error:
            if not _core.is_wrongtype(error):
                raise
            released = -1
        except BaseException:
            self._forget()
            raise
        if self.reentrant:
            _core.REENTRANT_HOLDS.released(token, self.name, self.commands, released)
        if released == 0:
            self.local.holds = max(1, getattr(self.local, "holds", 1) - 1)
            return
        self._forget()
        if released != 1:
            raise lock_error(
                LockNotOwnedError, "Cannot release a lock that's no longer owned", self.name
            )

    async def extend(self, additional_time: Number, replace_ttl: bool = False) -> Literal[True]:
        """Add ``additional_time`` seconds to the lease (or set it with ``replace_ttl``)."""
        if self._token is None:
            raise lock_error(LockError, "Cannot extend an unlocked lock", self.name)
        if self.timeout is None:
            raise lock_error(LockError, "Cannot extend a lock with no timeout", self.name)
        ms = _core.to_ms(additional_time)
        if not replace_ttl:
            left = await call(self.redis, self.name, "PTTL", self.name)
            if left < 0:
                raise lock_error(
                    LockNotOwnedError, "Cannot extend a lock that's no longer owned", self.name
                )
            ms += left
        return await self._renew(ms, "Cannot extend a lock that's no longer owned")

    async def reacquire(self) -> Literal[True]:
        """Reset the lease to ``timeout``."""
        if self._token is None:
            raise lock_error(LockError, "Cannot reacquire an unlocked lock", self.name)
        if self.timeout is None:
            raise lock_error(LockError, "Cannot reacquire a lock with no timeout", self.name)
        return await self._renew(
            _core.to_ms(self.timeout), "Cannot reacquire a lock that's no longer owned"
        )

    async def _renew(self, ms: int, message: str) -> Literal[True]:
        try:
            renewed = await call(
                self.redis, self.name, self.commands.extend, self.name, self._token, ms
            )
        except ResponseError as error:
            if not _core.is_wrongtype(error):
                raise
            renewed = 0
        if renewed != 1:
            raise lock_error(LockNotOwnedError, message, self.name)
        return True


class ReadLock(Lock):
    """The shared side of a ``ReadWriteLock`` (``RWLOCK.READ``)."""

    commands = READ

    def _holds_in(self, info: dict[str, Any], token: bytes) -> bool:
        return bool(_core.text(info.get("mode")) == "read")


class WriteLock(Lock):
    """The exclusive side of a ``ReadWriteLock`` (``RWLOCK.WRITE``)."""

    commands = WRITE

    def _holds_in(self, info: dict[str, Any], token: bytes) -> bool:
        writer = info.get("writer")
        return writer is not None and _core.encode(writer) == token


class ReadWriteLock:
    """As ``warden.ReadWriteLock``, for ``redis.asyncio`` clients."""

    def __init__(self, redis: Any, name: str, **lock_options: Any) -> None:
        self.redis = redis
        self.name = name
        self.lock_options = lock_options

    def read_lock(self) -> ReadLock:
        return ReadLock(self.redis, self.name, **self.lock_options)

    def write_lock(self) -> WriteLock:
        return WriteLock(self.redis, self.name, **self.lock_options)
