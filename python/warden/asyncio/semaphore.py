"""``warden.asyncio.Semaphore``: method for method ``warden.Semaphore`` for
``redis.asyncio`` clients (read that module's notes). The watchdog is a
task, ``lost`` an ``asyncio.Event``, a cancelled ``acquire`` leaves the
server's queue and gives back what it may have been granted. With
``thread_local=True`` (the default) each task holds on its own — share one
object between tasks as you would an ``asyncio.Semaphore``; a task started
while its parent holds sees (and may release) the parent's hold, and its own
acquire takes a hold of its own.
"""

from __future__ import annotations

import contextvars
import itertools
from types import SimpleNamespace
from typing import Any, Literal, Optional, Union

from redis.exceptions import LockError, LockNotOwnedError, ResponseError

from .. import _core
from .._core import SEMAPHORE, LockCommands, Number, lock_error
from ._connection import call, cancels, raise_a_dropped_cancel
from ._holder import Holder, holder_id

# Each task's holds, by semaphore object (its own key, never a reused id).
_task_holds: contextvars.ContextVar[dict[int, SimpleNamespace]] = contextvars.ContextVar(
    "warden_task_semaphore_holds"
)
_keys = itertools.count()


class Semaphore(Holder):
    """At most ``limit`` permits of ``name`` held at once, for
    ``redis.asyncio`` clients. Parameters as ``warden.Semaphore``."""

    commands: LockCommands = SEMAPHORE
    kind = "semaphore"

    def __init__(
        self,
        redis: Any,
        name: Union[str, bytes, memoryview],
        limit: int,
        *,
        permits: int = 1,
        timeout: Optional[Number] = None,
        blocking: bool = True,
        blocking_timeout: Optional[Number] = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        watchdog_timeout: Number = _core.WATCHDOG_TIMEOUT,
        max_queue: Optional[int] = None,
    ) -> None:
        self._key = next(_keys)
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
        self.limit = limit
        self.permits = permits

    @property
    def local(self) -> Any:
        """The hold the calling task sees (its own, or its parent's)."""
        if not self.thread_local:
            return self._shared
        hold = _task_holds.get({}).get(self._key)
        return hold if hold is not None else SimpleNamespace(token=None)

    @local.setter
    def local(self, value: Any) -> None:
        self._shared = value

    def _holding(self) -> bool:
        """The calling task (with ``thread_local=False``: anyone) holds
        through this object, as far as it knows."""
        if self._token is None or self.lost.is_set():
            return False
        return not self.thread_local or getattr(self.local, "task", None) == holder_id()

    def _new_hold(self, owner: bytes, lease_ms: int) -> None:
        if self.thread_local:
            hold = SimpleNamespace(token=None, task=holder_id())
            _task_holds.set({**_task_holds.get({}), self._key: hold})
        super()._new_hold(owner, lease_ms)

    async def acquire(
        self,
        permits: Optional[int] = None,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[Number] = None,
    ) -> bool:
        """Take ``permits`` (default: the object's); with ``blocking`` wait for
        them in the server's queue at most ``blocking_timeout`` seconds (None:
        forever). True once held."""
        if self._holding():
            raise lock_error(
                LockError,
                "This semaphore is already held by this task: release it first "
                "(or use one Semaphore object per concurrent hold)",
                self.name,
            )
        owner = _core.fresh_owner()
        lease_ms = self._lease_ms()
        args = _core.semaphore_args(
            self.name, owner, lease_ms, self.limit, self.permits if permits is None else permits
        )
        fence = await self._acquire(args, owner, blocking, blocking_timeout, lambda sent: True)
        if fence is None:
            return False
        self._new_hold(owner, args[3])
        self._fresh_hold(owner)  # every acquire takes an owner of its own
        self.local.holds = 1
        self.local.fence = fence
        return True

    async def release(self) -> None:
        """Give the permits back; ``LockNotOwnedError`` if the hold was no
        longer ours. One that gets no reply raises its error; the release is
        sent again by a background task until answered or the lease would
        have ended, and the hold forgotten at once (a retry raises
        ``LockError``), as ``warden.Semaphore.release``'s. The end of the
        event loop cancels that task: the lease ends the hold."""
        since = cancels()
        await self._release_hold()
        raise_a_dropped_cancel(since)  # after the hold is accounted for

    async def _release_hold(self) -> None:
        token = self._token
        if token is None:
            raise lock_error(
                LockError,
                "Cannot release a semaphore that's not held or is already released.",
                self.name,
            )
        released = await self._send_release(token)  # a failure in flight: sent again, forgotten
        if self._token == token:  # not another acquirer's, held meanwhile
            self._forget()
        if released != 1:
            raise lock_error(
                LockNotOwnedError, "Cannot release a semaphore that's no longer held", self.name
            )

    async def extend(self, additional_time: Number, replace_ttl: bool = False) -> Literal[True]:
        """Add ``additional_time`` seconds to this hold's lease (or set it with
        ``replace_ttl``)."""
        token = self._token
        if token is None:
            raise lock_error(LockError, "Cannot extend a semaphore that's not held", self.name)
        if self.timeout is None:
            raise lock_error(LockError, "Cannot extend a semaphore with no timeout", self.name)
        ms = _core.to_ms(additional_time)
        if not replace_ttl:
            info = await self._info(token)
            left = -2 if info is None else int(info.get("ttl", -2))
            if left < 0:
                raise lock_error(
                    LockNotOwnedError, "Cannot extend a semaphore that's no longer held", self.name
                )
            ms += left
        return await self._renew(ms, "Cannot extend a semaphore that's no longer held")

    async def reacquire(self) -> Literal[True]:
        """Reset this hold's lease to ``timeout``."""
        if self._token is None:
            raise lock_error(LockError, "Cannot reacquire a semaphore that's not held", self.name)
        if self.timeout is None:
            raise lock_error(LockError, "Cannot reacquire a semaphore with no timeout", self.name)
        return await self._renew(
            _core.to_ms(self.timeout), "Cannot reacquire a semaphore that's no longer held"
        )

    async def owned(self) -> bool:
        """True if the calling task (unless ``thread_local=False``) holds permits."""
        token = self._token
        if token is None:
            return False
        info = await self._info(token)
        return info is not None and int(info.get("permits", 0)) > 0

    async def info(self) -> Optional[dict[str, Any]]:
        """As ``warden.Semaphore.info``."""
        return await self._info(self._token)

    async def _info(self, owner: Optional[bytes]) -> Optional[dict[str, Any]]:
        args = [self.commands.info, self.name] + ([owner] if owner is not None else [])
        try:
            return _core.info_map(await call(self.redis, self.name, *args))
        except ResponseError as error:
            if _core.is_wrongtype(error):
                return None
            raise

    async def set_limit(self, limit: int) -> bool:
        """As ``warden.Semaphore.set_limit``."""
        changed = await call(self.redis, self.name, "SEM.SETLIMIT", self.name, limit)
        self.limit = limit
        return bool(changed == 1)
