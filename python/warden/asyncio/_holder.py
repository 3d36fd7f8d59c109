"""What an asyncio ``Lock`` and ``Semaphore`` share, as ``warden._holder``
for sync clients (read that module's notes: try first, then wait within the
deadline). The watchdog is a task; ``lost`` is an ``asyncio.Event`` of its
own for each hold, and ``holder.lost`` is the event of the calling task's
current (or last) hold, so another task's acquire never clears it. A
cancelled ``acquire`` takes its waiter out of the server's queue at once
(``WARDEN.WITHDRAW key owner``; where that is refused, ``CLIENT UNBLOCK``,
or closing its connection where that does not work),
gives back what the server may have granted it, and is cancelled.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections.abc import Awaitable
from types import SimpleNamespace, TracebackType
from typing import Any, Callable, Literal, Optional, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import LockError, LockNotOwnedError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import _core
from .._core import LockCommands, Number, lock_error
from ._connection import (
    DeadlinePassed,
    Lost,
    blocking_call,
    call,
    cancels,
    in_background,
    swallowed,
    to_the_end,
    try_call,
)

#: A give-back not sent: a release without a mode would end another hold.
_KEPT = object()

logger = logging.getLogger(__name__)

_H = TypeVar("_H", bound="Holder")


def holder_id() -> int:
    """The calling task (or, outside one, thread)."""
    task = asyncio.current_task()
    return id(task) if task is not None else threading.get_ident()


class _Watchdog:
    """Renews one hold's lease every third of it; sets ``lost`` when it
    cannot. With ``end`` (a lease asked for beyond the server's
    ``warden.max-lease``: capped and renewed) only until then, the last
    renewal asking for what remains; see ``warden._holder._Watchdog``."""

    def __init__(
        self,
        holder: Holder,
        owner: bytes,
        lease_ms: int,
        lost: asyncio.Event,
        end: Optional[float] = None,
        start: Optional[float] = None,
    ) -> None:
        self.holder, self.owner, self.lease_ms = holder, owner, lease_ms
        self.lost = lost  # this hold's, not whichever hold the holder has later
        self.deadline = (time.monotonic() if start is None else start) + lease_ms / 1000
        self.end = end
        self.task = in_background(self.run())

    def stop(self) -> None:
        self.task.cancel()

    async def run(self) -> None:
        holder = self.holder
        pause = max(0.0, self.deadline - time.monotonic() - 2 * self.lease_ms / 3000)
        while True:
            await asyncio.sleep(pause)
            lease = self.lease_ms / 1000
            started = time.monotonic()
            remaining = self.deadline - started
            if remaining <= 0:
                return self._lost("its lease ended before it could be renewed")
            ms = self.lease_ms
            if self.end is not None:
                if self.end <= self.deadline:
                    return  # the lease already runs to the end asked for
                ms = min(ms, max(1, int((self.end - started) * 1000)))
            try:
                # Bounded as a whole: a new connection's handshake too.
                renewed = await asyncio.wait_for(
                    call(
                        holder.redis,
                        holder.name,
                        holder.commands.extend,
                        holder.name,
                        self.owner,
                        ms,
                        timeout=remaining,
                    ),
                    remaining,
                )
            except ResponseError as error:
                if _core.is_wrongtype(error):
                    return self._lost("the key now holds another type")
                renewed = None
                cap = _core.lease_cap_of(error)
                if cap is not None and cap < ms:  # the cap was lowered: renew at it
                    _core.learn_cap(holder.redis, cap)
                    self.lease_ms = min(self.lease_ms, cap)
                    pause = 0
                    continue
                logger.warning("renewing %s %r failed: %s", holder.kind, holder.name, error)
            except Exception as error:
                renewed = None
                logger.warning("renewing %s %r failed: %s", holder.kind, holder.name, error)
            if renewed is None:
                pause = max(0.01, min(lease / 3, (self.deadline - time.monotonic()) / 2))
                continue
            if renewed != 1:
                return self._lost("it is no longer held by this owner")
            self.deadline = started + ms / 1000
            pause = lease / 3

    def _lost(self, why: str) -> None:
        logger.warning("%s %r lost: %s", self.holder.kind, self.holder.name, why)
        self.lost.set()


# Each task's own hold events, by holder: a task sees the event of the hold it
# took even when another task (sharing the holder's thread-local state) takes
# the next one.
_task_lost: contextvars.ContextVar[dict[int, asyncio.Event]] = contextvars.ContextVar(
    "warden_task_lost"
)


class Holder:
    """One name's holds as seen by this process: a ``Lock`` or a ``Semaphore``."""

    commands: LockCommands
    #: What the messages call it.
    kind = "lock"

    def __init__(
        self,
        redis: Any,
        name: Any,
        timeout: Optional[Number],
        blocking: bool,
        blocking_timeout: Optional[Number],
        thread_local: bool,
        raise_on_release_error: bool,
        watchdog_timeout: Number,
        max_queue: Optional[int] = None,
    ) -> None:
        self.redis = redis
        self.max_queue = _core.check_max_queue(max_queue)
        self.name: Any = name
        self.timeout = timeout
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        self.thread_local = bool(thread_local)
        self.raise_on_release_error = raise_on_release_error
        self.watchdog_timeout = watchdog_timeout
        self.local: Any = threading.local() if self.thread_local else SimpleNamespace()
        self.local.token = None

    @property
    def lost(self) -> asyncio.Event:
        """Set when the watchdog could not renew the lease in time: stop the
        work the hold protects. Each hold has its own event (read it after
        ``acquire``); this is the calling task's current or last one."""
        event = _task_lost.get({}).get(id(self)) if self.thread_local else None
        if event is None:
            event = getattr(self.local, "lost", None)
        if event is None:
            event = self.local.lost = asyncio.Event()
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
        fresh: Optional[_core.FreshHold] = getattr(self.local, "fresh", None)
        if fresh is not None:
            _core.FRESH_OWNERS.discard(fresh)
        self.local.token = None
        self.local.fence = None
        self.local.holds = 0
        self.local.watchdog = None
        self.local.fresh = None
        self.local.lease_end = None

    def _fresh_hold(self, owner: bytes) -> None:
        """The hold just recorded is of ``owner``, made for it alone (not a
        caller's ``token=``, not re-entrant): its release may be sent again
        (``_core.FRESH_OWNERS``)."""
        self.local.fresh = _core.FRESH_OWNERS.add(owner)

    def _lease_end(self) -> float:
        """As ``warden._holder.Holder._lease_end``."""
        now = time.monotonic()
        end: Optional[float] = getattr(self.local, "lease_end", None)
        if end is None:
            end = now + self._lease_ms() / 1000
        dog: Optional[_Watchdog] = getattr(self.local, "watchdog", None)
        if dog is not None:
            end = max(end, dog.deadline, now + dog.lease_ms / 1000)
        return end

    def _lease_ms(self) -> int:
        """What an acquire asks the server for: the lease (the watchdog's
        without ``timeout``), at most the server's cap as learnt."""
        return _core.capped(
            self.redis, _core.to_ms(self.timeout if self.timeout else self.watchdog_timeout)
        )

    def _renews(self, granted_ms: int, asked_ms: Optional[int], start: float) -> None:
        """As ``warden._holder.Holder._renews``: the watchdog (``asked_ms``
        None) or the renewer of a lease asked for beyond the cap."""
        dog: Optional[_Watchdog] = getattr(self.local, "watchdog", None)
        if asked_ms is not None and dog is not None:
            dog.stop()
            self.local.watchdog = dog = None
        if dog is not None:
            return  # the watchdog goes on
        if asked_ms is None or granted_ms < asked_ms:
            end = None if asked_ms is None else start + asked_ms / 1000
            self.local.watchdog = _Watchdog(
                self, self.local.token, granted_ms, self.lost, end, start
            )

    async def __aenter__(self: _H) -> _H:
        if await self.acquire():
            return self
        raise lock_error(
            LockError, f"Unable to acquire {self.kind} within the time specified", self.name
        )

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
            logger.warning(
                "%s was unlocked or no longer owned when exiting context manager.",
                self.kind.capitalize(),
            )

    async def acquire(self) -> bool:
        raise NotImplementedError

    async def release(self) -> None:
        raise NotImplementedError

    async def owned(self) -> bool:
        raise NotImplementedError

    # --- the parts of acquire and release ---------------------------------

    async def _acquire(
        self,
        args: list[Any],
        owner: bytes,
        blocking: Optional[bool],
        blocking_timeout: Optional[Number],
        may_hold: Callable[[bool], bool],
        holds_before: int = 0,
    ) -> Optional[int]:
        """As ``warden._holder.Holder._acquire``: try on an ordinary
        connection, then wait in the server's queue within the deadline (at
        once while another request of this process waits on the key)."""
        since = cancels()
        deadline = _core.deadline(
            self.blocking if blocking is None else blocking,
            self.blocking_timeout if blocking_timeout is None else blocking_timeout,
        )

        async def lost(reply: Any) -> None:
            if reply is not None:
                await self._give_back(owner)
            elif holds_before:
                await self._give_back_if_added(owner, holds_before)
            elif may_hold(True):
                await self._give_back(owner)

        def honour_a_dropped_cancel(fence: Optional[int]) -> Optional[int]:
            # A cancel a send dropped (``swallowed``) is raised once the reply
            # is in hand: a grant the caller will not get is given back.
            if swallowed(since):
                if fence is not None:
                    in_background(lost(fence))
                raise asyncio.CancelledError()
            return fence

        async def on_time(fence: Optional[int]) -> Optional[int]:
            # The last moment before the caller has it: a grant that reaches
            # it past its deadline (a busy loop, the wait connection's slow
            # return to its pool) is given back, never handed on.
            if fence is not None and deadline is not None and deadline.passed():
                await to_the_end(lost(fence))
                return None
            return fence

        async def wait(deadline: _core.Deadline) -> Optional[int]:
            try:
                reply = await blocking_call(
                    self.redis,
                    self.name,
                    args,
                    deadline,
                    _core.queue_args(self.max_queue),
                    lost,
                    # WARDEN.WITHDRAW takes out every request of the owner:
                    # not for a caller's own token= (another task may wait on it).
                    withdraw=may_hold(True),
                )
            except ResponseError as error:
                if _core.is_wrongtype(error):
                    raise _core.wrong_type(error, self.name) from None
                raise
            return None if reply is None else int(reply)

        async def under_cap(send: Callable[[], Awaitable[Optional[int]]]) -> Optional[int]:
            for attempt in (0, 1, 2):
                try:
                    return await send()
                except ResponseError as error:
                    # Above the server's cap: nothing was granted; learn it,
                    # and ask again for the cap (a renewer makes up the rest).
                    cap = _core.lease_cap_of(error)
                    if cap is None or cap >= args[3] or attempt == 2:
                        raise
                    _core.learn_cap(self.redis, cap)
                    args[3] = cap
            raise AssertionError("unreachable: the last attempt returns or raises")

        # A request of this process already waits for the key: the server
        # would answer a try nil, so this one goes straight to waiting. Not a
        # holder asking again: the server grants it at once, behind waiters
        # too, and a wait's abort may give back twice (once per unconfirmed
        # close): for a holder, a hold it had before, and the lock with it.
        queued = deadline is not None and _core.queued(self.redis, args[0], self.name)
        if queued and not holds_before and deadline is not None:
            waiting_deadline = deadline
            return await on_time(
                honour_a_dropped_cancel(await under_cap(lambda: wait(waiting_deadline)))
            )
        try:
            fence = await under_cap(lambda: self._request(args, owner, may_hold, deadline, lost))
        except DeadlinePassed:
            return None
        honour_a_dropped_cancel(fence)
        if fence is not None and deadline is not None and deadline.passed():
            # The reply came after the caller's deadline: never a late grant.
            await to_the_end(lost(fence))
            return None
        if fence is not None or deadline is None:
            return fence
        return await on_time(honour_a_dropped_cancel(await wait(deadline)))

    async def _request(
        self,
        args: list[Any],
        owner: bytes,
        may_hold: Callable[[bool], bool],
        deadline: Optional[_core.Deadline],
        lost: Lost,
    ) -> Optional[int]:
        """Send an acquire that does not wait: its fencing token, or None
        (busy). With a deadline its reply is awaited only until then
        (``DeadlinePassed``; ``try_call`` gives back a late grant). If it
        fails in flight or is cancelled, what ``owner`` may hold because of it
        (``may_hold(sent)``) is given back."""
        if deadline is not None and deadline.at is not None:
            try:
                fence = await try_call(self.redis, self.name, args, deadline, lost)
            except ResponseError as error:
                if _core.is_wrongtype(error):
                    raise _core.wrong_type(error, self.name) from None
                raise  # the server refused it
            return None if fence is None else int(fence)
        sent: list[bool] = []
        try:
            fence = await call(
                self.redis,
                self.name,
                *args,
                on_sent=lambda: sent.append(True),
                deadline=deadline,
            )
        except ResponseError as error:
            if _core.is_wrongtype(error):
                raise _core.wrong_type(error, self.name) from None
            raise  # the server refused it
        except DeadlinePassed:
            raise  # it never went
        except BaseException:
            # A grant may have crossed the close of the connection: give it
            # back, in the background (we may be cancelled).
            if may_hold(bool(sent)):
                in_background(lost(None))
            raise
        return None if fence is None else int(fence)

    def _new_hold(self, owner: bytes, lease_ms: int) -> None:
        """``owner`` now holds, granted ``lease_ms``: a new ``lost`` event (the
        calling task's), and a watchdog if the lease is the watchdog's, or a
        renewer if the lease asked for is beyond the server's cap."""
        self._forget()
        self.local.token = owner
        self.local.holds = 0
        self.local.lease_end = time.monotonic() + lease_ms / 1000
        lost = self.local.lost = asyncio.Event()
        if self.thread_local:
            _task_lost.set({**_task_lost.get({}), id(self): lost})
        asked = _core.to_ms(self.timeout) if self.timeout else None
        self._renews(lease_ms, asked, time.monotonic())

    async def _unlock(
        self, owner: bytes, timeout: Optional[float] = None, giving_back: bool = False
    ) -> Any:
        """As ``warden._holder.Holder._unlock``."""
        args = _core.release_args(self.redis, self.commands, self.name, owner)
        if len(args) == 4:
            try:
                return await call(self.redis, self.name, *args, timeout=timeout)
            except ResponseError as error:
                if not _core.unlock_mode_refused(self.redis, args, error):
                    raise
        if giving_back and not await self._may_give_back_without_mode(owner):
            return _KEPT
        return await call(self.redis, self.name, *args[:3], timeout=timeout)

    async def _may_give_back_without_mode(self, owner: bytes) -> bool:
        """Whether a release without a mode ends the hold a give-back means."""
        return True

    async def _give_back(self, owner: bytes) -> None:
        try:
            released = await self._unlock(owner, timeout=1.0, giving_back=True)
            if released is not _KEPT:
                self._gave_back(owner, released)
        except Exception:
            logger.debug("could not give back %s %r after a failed wait", self.kind, self.name)

    async def _give_back_if_added(self, owner: bytes, before: int) -> None:
        """As ``warden._holder.Holder._give_back_if_added``."""
        try:
            info = await call(self.redis, self.name, self.commands.info, self.name, timeout=1.0)
        except Exception:
            return
        held = self._owner_holds(_core.info_map(info), owner)
        if held is not None and held > before:
            await self._give_back(owner)

    def _owner_holds(self, info: Optional[dict[str, Any]], owner: bytes) -> Optional[int]:
        """``owner``'s holds as the info command shows them; None: not shown."""
        return None

    def _gave_back(self, owner: bytes, reply: Any) -> None:
        """Account for the reply of a give-back."""

    async def _send_release(self, token: bytes) -> Any:
        """The release's reply (a key of another type: -1). A failure in
        flight of a caller's owner leaves the hold as it was, watchdog and
        all, as redis-py's ``Lock`` (8.2) keeps its token; one that got no
        reply of an owner made for this hold alone is handed to the
        background and the hold forgotten at once, as
        ``warden._holder.Holder._send_release``'s."""
        try:
            return await self._unlock(token)
        except ResponseError as error:
            if not _core.is_wrongtype(error):
                raise
            return -1
        except (RedisConnectionError, RedisTimeoutError):
            fresh: Optional[_core.FreshHold] = getattr(self.local, "fresh", None)
            if (
                fresh is not None
                and self._token == token
                and _core.FRESH_OWNERS.fresh(fresh, token)
            ):
                end = self._lease_end()
                self.local.fresh = None  # the release sent again owns it now
                self._forget()
                self._release_again(fresh, end)
            raise

    def _release_again(self, fresh: _core.FreshHold, end: float) -> None:
        """As ``warden._holder.Holder._release_again``, in a task of its own:
        the end of the event loop (``asyncio.run`` returning) cancels it, and
        the lease ends the hold."""
        token = fresh.owner

        async def again() -> None:
            pause = _core.RELEASE_AGAIN_BACKOFF
            try:
                while not fresh.shared:
                    left = max(0.01, min(end - time.monotonic(), _core.RELEASE_AGAIN_SECONDS))
                    try:
                        # Bounded as a whole: a new connection's handshake too.
                        await asyncio.wait_for(self._unlock(token, timeout=left), left + 0.1)
                        return
                    except ResponseError:
                        return  # answered: nothing more to send
                    except Exception as error:
                        if time.monotonic() + pause >= end:
                            logger.warning(
                                "could not send the release of %s %r again (%s): its lease ends it",
                                self.kind,
                                self.name,
                                error,
                            )
                            return
                        logger.debug(
                            "sending the release of %s %r again failed: %s",
                            self.kind,
                            self.name,
                            error,
                        )
                    await asyncio.sleep(pause)
                    pause = min(2 * pause, _core.RELEASE_AGAIN_BACKOFF_MAX)
            finally:
                _core.FRESH_OWNERS.discard(fresh)

        in_background(again())

    async def _still_held(self, message: str) -> Literal[True]:
        """True if this holder still holds (an extend or reacquire that
        changes no lease); ``LockNotOwnedError`` with ``message`` if not."""
        if not await self.owned():
            raise lock_error(LockNotOwnedError, message, self.name)
        return True

    async def _renew(self, ms: int, message: str) -> Literal[True]:
        """Set the lease to ``ms`` from now; above the server's cap, capped
        and renewed until then."""
        lease = _core.capped(self.redis, ms)
        for attempt in (0, 1, 2):
            started = time.monotonic()
            try:
                renewed = await call(
                    self.redis, self.name, self.commands.extend, self.name, self._token, lease
                )
            except ResponseError as error:
                cap = _core.lease_cap_of(error)
                if cap is not None and cap < lease and attempt < 2:
                    _core.learn_cap(self.redis, cap)
                    lease = cap
                    continue
                if not _core.is_wrongtype(error):
                    raise
                renewed = 0
            break
        if renewed != 1:
            raise lock_error(LockNotOwnedError, message, self.name)
        self.local.lease_end = time.monotonic() + lease / 1000
        if self.timeout:  # a lease of its own (the watchdog's goes on as it was)
            self._renews(lease, ms, started)
        return True
