"""``warden.asyncio.Lock``: a drop-in for ``redis.asyncio.lock.Lock``, method
for method the same as ``warden.lock`` (read that module's notes). The
watchdog is a task; ``lost`` is an ``asyncio.Event`` of its own for each
hold, and ``lock.lost`` is the event of the calling task's current (or last)
hold, so another task's acquire never clears it; a re-entrant owner is stable
per task. A cancelled ``acquire`` closes its connection, which takes it out of
the server's queue, and gives back what the server may have granted it,
re-entrant or not. What locks and semaphores share is in
``warden.asyncio._holder``.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from redis.exceptions import LockError, LockNotOwnedError, ResponseError

from .. import _core
from .._core import EXCLUSIVE, READ, WRITE, LockCommands, Number, lock_error
from ._connection import call, cancels, raise_a_dropped_cancel
from ._holder import Holder, holder_id


class Lock(Holder):
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
        max_queue: Optional[int] = None,
    ) -> None:
        super().__init__(
            redis,
            name,
            timeout,
            blocking,
            blocking_timeout,
            thread_local,
            raise_on_release_error,
            watchdog_timeout,
            max_queue,
        )
        self.sleep = sleep
        self.reentrant = reentrant

    async def acquire(
        self,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[Number] = None,
        token: Optional[Union[str, bytes]] = None,
        *,
        sleep: Optional[Number] = None,
    ) -> bool:
        """Take the lock; with ``blocking`` wait for it in the server's queue
        at most ``blocking_timeout`` seconds (None: forever). True once held.
        ``sleep`` is accepted, as redis-py's, and unused (nobody polls)."""
        if token is not None:
            owner = _core.encode(token)
        elif self.reentrant:
            owner = _core.reentrant_owner(holder_id())
        else:
            owner = _core.fresh_owner()
        lease_ms = self._lease_ms()
        args = _core.acquire_args(self.commands, self.name, owner, lease_ms)
        reentrant = token is None and self.reentrant
        before = _core.REENTRANT_HOLDS.get(owner, self.name, self.commands) if reentrant else 0
        fresh = token is None and not reentrant
        if not fresh:
            _core.FRESH_OWNERS.share(owner)  # see warden.lock
        # What this owner may hold because of a failed acquire: see warden.lock.
        fence = await self._acquire(
            args,
            owner,
            blocking,
            blocking_timeout,
            lambda sent: token is None and (not reentrant or before == 0 or sent),
            holds_before=before if reentrant else 0,
        )
        if fence is None:
            return False
        if reentrant:
            _core.REENTRANT_HOLDS.add(owner, self.name, self.commands, 1)
        if self._token != owner:
            self._new_hold(owner, args[3])
            if fresh:
                self._fresh_hold(owner)
        elif not fresh and getattr(self.local, "fresh", None) is not None:
            self.local.fresh.shared = True  # re-entered with its own token
        self.local.holds = getattr(self.local, "holds", 0) + 1
        self.local.fence = fence
        return True

    def _gave_back(self, owner: bytes, reply: Any) -> None:
        if self.reentrant:
            _core.REENTRANT_HOLDS.released(owner, self.name, self.commands, reply)

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

    def _owner_holds(self, info: Optional[dict[str, Any]], owner: bytes) -> Optional[int]:
        if info is None:
            return 0
        return int(info.get("holds", 0)) if self._holds_in(info, owner) else 0

    async def release(self) -> None:
        """Give up one hold; ``LockNotOwnedError`` if the lock was no longer
        ours. The hold is forgotten once the server has answered (or the
        release was handed to the background), and only if it is still this
        holder's (another task sharing this object may have acquired
        meanwhile). A release that gets no reply (a connection error, a
        timeout) raises its error, and then, as ``warden.Lock.release``'s:
        of an owner made for this acquisition (no ``token=``, not
        re-entrant, never joined by a ``token=`` acquire) the release is
        sent again by a background task until answered or the lease would
        have ended, and the hold is forgotten at once (watchdog stopped; a
        retry raises ``LockError``; another task's hold granted meanwhile
        through a shared object would be released by a retry, as by any
        stray release); the end of the event loop (``asyncio.run``
        returning) cancels that task, and the lease ends the hold. Of a
        caller-chosen owner the hold is kept, and a retry sends it again."""
        since = cancels()
        await self._release_one()
        raise_a_dropped_cancel(since)  # after the hold is accounted for

    async def _release_one(self) -> None:
        expected = self._token
        if expected is None:
            raise lock_error(
                LockError,
                "Cannot release a lock that's not owned or is already unlocked.",
                self.name,
            )
        try:
            holds_remain = await self.do_release(expected)
        except LockNotOwnedError:
            if self._token == expected:
                self._forget()
            raise
        if self._token != expected:
            return  # another acquirer's hold now: not ours to clear
        if holds_remain:
            self.local.holds = max(1, getattr(self.local, "holds", 1) - 1)
            return
        self._forget()

    async def do_release(self, expected_token: bytes) -> bool:
        """Give up one hold of ``expected_token`` in the server (redis-py's
        hook of the same name): True while re-entrant holds remain, False once
        the lock is let go; ``LockNotOwnedError`` if it held none."""
        released = await self._send_release(expected_token)
        if self.reentrant:
            _core.REENTRANT_HOLDS.released(expected_token, self.name, self.commands, released)
        if released == 0:
            return True
        if released != 1:
            raise lock_error(
                LockNotOwnedError, "Cannot release a lock that's no longer owned", self.name
            )
        return False

    async def extend(self, additional_time: Number, replace_ttl: bool = False) -> Literal[True]:
        """Add ``additional_time`` seconds to the lease (or set it to that with
        ``replace_ttl``). As redis-py's: when that leaves no positive lease
        (0 or a negative time) the lease stays as it is and the answer is
        True if the lock is still ours; a lock with ``timeout=0`` (its lease
        the watchdog's) has no expiry of its own to extend
        (``LockNotOwnedError``)."""
        if self._token is None:
            raise lock_error(LockError, "Cannot extend an unlocked lock", self.name)
        if self.timeout is None:
            raise lock_error(LockError, "Cannot extend a lock with no timeout", self.name)
        message = "Cannot extend a lock that's no longer owned"
        if not self.timeout:
            raise lock_error(LockNotOwnedError, "Cannot extend a lock with no timeout", self.name)
        left = None
        if not replace_ttl:
            left = await call(self.redis, self.name, "PTTL", self.name)
            if left < 0:
                raise lock_error(LockNotOwnedError, message, self.name)
        ms = _core.extended_lease_ms(additional_time, left)
        if ms is None:
            return await self._still_held(message)
        return await self._renew(ms, message)

    async def reacquire(self) -> Literal[True]:
        """Reset the lease to ``timeout``; with ``timeout=0`` (the watchdog's
        lease) nothing to reset: True if the lock is still ours."""
        if self._token is None:
            raise lock_error(LockError, "Cannot reacquire an unlocked lock", self.name)
        if self.timeout is None:
            raise lock_error(LockError, "Cannot reacquire a lock with no timeout", self.name)
        message = "Cannot reacquire a lock that's no longer owned"
        if not self.timeout:
            return await self._still_held(message)
        return await self._renew(_core.to_ms(self.timeout), message)


class ReadLock(Lock):
    """The shared side of a ``ReadWriteLock`` (``RWLOCK.READ``)."""

    commands = READ

    def _holds_in(self, info: dict[str, Any], token: bytes) -> bool:
        return bool(_core.text(info.get("mode")) == "read")

    def _owner_holds(self, info: Optional[dict[str, Any]], owner: bytes) -> Optional[int]:
        return None  # RWLOCK.INFO counts readers without naming them

    async def _may_give_back_without_mode(self, owner: bytes) -> bool:
        # A server before 1.1.0 ends an owner's write holds before its read
        # holds: a read granted while its owner writes (a downgrade) and given
        # back would end the write hold instead, and let readers in beside the
        # writer. Kept then: it ends with its lease.
        try:
            reply = await call(self.redis, self.name, "RWLOCK.INFO", self.name, timeout=1.0)
        except Exception:
            return False
        info = _core.info_map(reply)
        writer = None if info is None else info.get("writer")
        return writer is None or _core.encode(writer) != owner


class WriteLock(Lock):
    """The exclusive side of a ``ReadWriteLock`` (``RWLOCK.WRITE``)."""

    commands = WRITE

    def _holds_in(self, info: dict[str, Any], token: bytes) -> bool:
        writer = info.get("writer")
        return writer is not None and _core.encode(writer) == token

    def _owner_holds(self, info: Optional[dict[str, Any]], owner: bytes) -> Optional[int]:
        # RWLOCK.INFO's holds count a downgraded writer's reads too.
        if _core.REENTRANT_HOLDS.get(owner, self.name, READ):
            return None
        return super()._owner_holds(info, owner)


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
