"""What a sync ``Lock`` and ``Semaphore`` share: the holder's state (owner,
fence, the ``lost`` event of each hold), the watchdog that renews a lease,
the acquire, and the give-back of an acquire that was interrupted.

An acquire first tries once without waiting, on an ordinary connection of
the client's pool: a free lock or permit costs one round trip and no waiter
connection. Only a busy answer goes on to wait in the server's queue, on a
connection of the wait pool beside the client's (see ``warden._connection``,
so waiters never starve a release or a renewal), with ``WAIT`` = what is left
of ``blocking_timeout`` (counted from the call) less a margin for the reply's
way back. Waiting for a wait-pool connection happens only within that time;
``max_queue`` sheds load (``QUEUE``: busy at once when that many already
wait). A grant that reaches the client after the deadline is given back at
once and the acquire answers False; ``KeyboardInterrupt`` or the deadline
passing locally take the waiter out of the queue at once
(``WARDEN.WITHDRAW key owner``; where that is refused, ``CLIENT UNBLOCK``, or
closing its connection on servers that do not unblock warden's waiters), and
whatever the server may have granted meanwhile is given back.

Each hold has its own ``lost`` event: ``holder.lost`` is the event of the
calling thread's current (or last) hold (with ``thread_local=False``, of the
object's), so another thread's acquire never clears it.
"""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace, TracebackType
from typing import Any, Callable, Literal, Optional, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import LockError, LockNotOwnedError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import _core
from ._connection import DeadlinePassed, Lost, blocking_call, call, try_call
from ._core import LockCommands, Number, lock_error

#: A give-back not sent: a release without a mode would end another hold.
_KEPT = object()

logger = logging.getLogger(__name__)

_H = TypeVar("_H", bound="Holder")


class _Watchdog(threading.Thread):
    """Renews one hold's lease every third of it; sets ``lost`` when it cannot.

    Without ``end`` it renews until stopped (the watchdog of a hold without
    ``timeout``). With ``end`` (a lease asked for beyond the server's
    ``warden.max-lease``: capped and renewed) it renews until that moment,
    the last renewal asking only for what remains, and then stops: the hold
    lapses at ``end`` unless released first. A cap the server refuses a
    renewal with (lowered at run time) is learnt and the renewal resent."""

    def __init__(
        self,
        holder: Holder,
        owner: bytes,
        lease_ms: int,
        lost: threading.Event,
        end: Optional[float] = None,
        start: Optional[float] = None,
    ) -> None:
        super().__init__(name=f"warden-watchdog:{holder.name}", daemon=True)
        self.holder, self.owner, self.lease_ms = holder, owner, lease_ms
        self.lost = lost  # this hold's, not whichever hold the holder has later
        self.stopped = threading.Event()
        self.deadline = (time.monotonic() if start is None else start) + lease_ms / 1000
        self.end = end

    def run(self) -> None:
        holder = self.holder
        pause = max(0.0, self.deadline - time.monotonic() - 2 * self.lease_ms / 3000)
        while not self.stopped.wait(pause):
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
            # Also a renewal stuck before its send (a new connection's
            # handshake with a paused server) must not outlive the lease.
            overdue = threading.Timer(
                remaining, self._lost, ("its lease ended before it could be renewed",)
            )
            overdue.daemon = True
            overdue.start()
            try:
                renewed = call(
                    holder.redis,
                    holder.name,
                    holder.commands.extend,
                    holder.name,
                    self.owner,
                    ms,
                    timeout=remaining,
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
            finally:
                overdue.cancel()
            if self.stopped.is_set() or self.lost.is_set():
                return
            if renewed is None:  # try again soon, while the lease lasts
                pause = max(0.01, min(lease / 3, (self.deadline - time.monotonic()) / 2))
                continue
            if renewed != 1:
                return self._lost("it is no longer held by this owner")
            self.deadline = started + ms / 1000
            pause = lease / 3

    def _lost(self, why: str) -> None:
        if not self.stopped.is_set():
            logger.warning("%s %r lost: %s", self.holder.kind, self.holder.name, why)
            self.lost.set()


class Holder:
    """One name's holds as seen by this process: a ``Lock`` or a ``Semaphore``."""

    commands: LockCommands
    #: What the messages call it.
    kind = "lock"

    def __init__(
        self,
        redis: Any,
        name: str,
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
        self.name = name
        self.timeout = timeout
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        self.thread_local = bool(thread_local)
        self.raise_on_release_error = raise_on_release_error
        self.watchdog_timeout = watchdog_timeout
        self.local: Any = threading.local() if self.thread_local else SimpleNamespace()
        self.local.token = None

    # --- what this holder knows -------------------------------------------

    @property
    def lost(self) -> threading.Event:
        """Set when the watchdog could not renew the lease in time (or found
        the hold taken away): stop the work the hold protects. Each hold has
        its own event (read it after ``acquire``); this is the calling
        thread's current or last one."""
        event: Optional[threading.Event] = getattr(self.local, "lost", None)
        if event is None:
            event = self.local.lost = threading.Event()
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
            dog.stopped.set()
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
        """When the current hold's lease would end at the latest, as far as
        this holder knows (a renewal in flight may add at most a lease)."""
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
        """Start what renews the current hold, granted ``granted_ms`` at
        ``start``: the watchdog (``asked_ms`` None), or, for a lease asked for
        beyond the cap, a renewer until it ends. A renewer of an earlier
        lease of this hold is stopped."""
        dog: Optional[_Watchdog] = getattr(self.local, "watchdog", None)
        if asked_ms is not None and dog is not None:
            dog.stopped.set()
            self.local.watchdog = dog = None
        if dog is not None:
            return  # the watchdog goes on
        if asked_ms is None or granted_ms < asked_ms:
            end = None if asked_ms is None else start + asked_ms / 1000
            dog = _Watchdog(self, self.local.token, granted_ms, self.lost, end, start)
            self.local.watchdog = dog
            dog.start()

    # --- the context manager ----------------------------------------------

    def __enter__(self: _H) -> _H:
        if self.acquire():
            return self
        raise lock_error(
            LockError, f"Unable to acquire {self.kind} within the time specified", self.name
        )

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        try:
            self.release()
        except LockError:
            if self.raise_on_release_error:
                raise
            logger.warning(
                "%s was unlocked or no longer owned when exiting context manager.",
                self.kind.capitalize(),
            )

    def acquire(self) -> bool:
        raise NotImplementedError

    def release(self) -> None:
        raise NotImplementedError

    def owned(self) -> bool:
        raise NotImplementedError

    # --- the parts of acquire and release ---------------------------------

    def _acquire(
        self,
        args: list[Any],
        owner: bytes,
        blocking: Optional[bool],
        blocking_timeout: Optional[Number],
        may_hold: Callable[[bool], bool],
        record: Callable[[int], None],
        holds_before: int = 0,
    ) -> Optional[int]:
        """Try ``args`` once on an ordinary connection; if busy and blocking,
        wait in the server's queue until the deadline (counted from now;
        at once, without the try, while another request of this process
        waits for the same command and key):
        the fencing token (``record``-ed as this holder's), or None. If a
        request fails in flight, what ``owner`` may hold because of it
        (``may_hold(sent)``) is given back, as is a grant that came too late
        or that an interrupt kept from being recorded. ``holds_before``: the
        holds a re-entrant owner already has, which the server grants at once
        even behind waiters: it always tries, and a request of unknown outcome
        is given back only if the server shows a hold more."""
        deadline = _core.deadline(
            self.blocking if blocking is None else blocking,
            self.blocking_timeout if blocking_timeout is None else blocking_timeout,
        )

        def lost(reply: Any) -> None:
            if reply is not None:
                self._give_back(owner)
            elif holds_before:
                self._give_back_if_added(owner, holds_before)
            elif may_hold(True):
                self._give_back(owner)

        # The acquire's reply once read, until the hold is recorded: an
        # interrupt at any moment in between finds it here and gives it back.
        got: list[Any] = []
        recorded = False

        def wait(deadline: _core.Deadline) -> None:
            try:
                blocking_call(
                    self.redis,
                    self.name,
                    args,
                    deadline,
                    _core.queue_args(self.max_queue),
                    lost,
                    got,
                    # WARDEN.WITHDRAW takes out every request of the owner:
                    # not for a caller's own token= (another thread may wait on it).
                    withdraw=may_hold(True),
                )
            except ResponseError as error:
                if _core.is_wrongtype(error):
                    raise _core.wrong_type(error, self.name) from None
                raise

        # A request of this process already waits for the key: the server
        # would answer a try nil, so this one goes straight to waiting. Not a
        # holder asking again: the server grants it at once, behind waiters
        # too, and a wait's abort may give back twice (once per unconfirmed
        # close): for a holder, a hold it had before, and the lock with it.
        at_once = (
            not holds_before
            and deadline is not None
            and _core.queued(self.redis, args[0], self.name)
        )
        try:
            try:
                for attempt in (0, 1, 2):
                    try:
                        if deadline is not None and at_once:
                            wait(deadline)
                        else:
                            self._request(args, owner, may_hold, deadline, lost, got)
                        break
                    except ResponseError as error:
                        # Above the server's cap: nothing was granted; learn
                        # it, and ask again for the cap (a renewer makes up
                        # the rest of the lease).
                        cap = _core.lease_cap_of(error)
                        if cap is None or cap >= args[3] or attempt == 2:
                            raise
                        _core.learn_cap(self.redis, cap)
                        args[3] = cap
                        got.clear()
            except DeadlinePassed:
                return None
            if not at_once and (not got or got[0] is None) and deadline is not None:
                got.clear()
                wait(deadline)
            if not got or got[0] is None:
                return None
            fence = int(got[0])
            if deadline is not None and deadline.passed():
                got.clear()
                lost(fence)  # the reply came after the caller's deadline: never a late grant
                return None
            record(fence)
            recorded = True
            # The last moment before the caller has it: a grant that reaches
            # it past its deadline (a busy process) is released, never handed on.
            if deadline is not None and deadline.passed():
                got.clear()
                self._unrecord()
                return None
            got.clear()
            return fence
        except BaseException:
            if got and got[0] is not None:
                if recorded:
                    self._unrecord()
                else:
                    lost(int(got[0]))
                    if self._token == owner and may_hold(False):
                        self._forget()  # recorded in part: this hold was its only one
            raise

    def _unrecord(self) -> None:
        """Release the hold just recorded, as its caller would (the acquire
        reports it never got it). If that release fails in flight the hold
        is forgotten all the same (watchdog stopped): the acquire answers that
        it holds nothing, and the lease bounds what this costs."""
        token = self._token
        try:
            self.release()
        except BaseException as error:
            if self._token == token:
                self._forget()
            if not isinstance(error, Exception):
                raise
            logger.debug("could not release %s %r taken too late", self.kind, self.name)

    def _request(
        self,
        args: list[Any],
        owner: bytes,
        may_hold: Callable[[bool], bool],
        deadline: Optional[_core.Deadline],
        lost: Lost,
        got: list[Any],
    ) -> None:
        """Send an acquire that does not wait and read its reply (a fencing
        token, or None when busy) into ``got``. With a deadline its reply is
        awaited only until then (``DeadlinePassed``; ``try_call`` gives back
        a late grant)."""
        try:
            try_call(self.redis, self.name, args, deadline, lost, got)
        except ResponseError as error:
            if _core.is_wrongtype(error):
                raise _core.wrong_type(error, self.name) from None
            raise  # the server refused it

    def _new_hold(self, owner: bytes, lease_ms: int) -> None:
        """``owner`` now holds, granted ``lease_ms``: a new ``lost`` event,
        and a watchdog if the lease is the watchdog's, or a renewer if the
        lease asked for is beyond the server's cap."""
        self._forget()
        self.local.token = owner
        self.local.holds = 0
        self.local.lease_end = time.monotonic() + lease_ms / 1000
        self.local.lost = threading.Event()
        asked = _core.to_ms(self.timeout) if self.timeout else None
        self._renews(lease_ms, asked, time.monotonic())

    def _unlock(
        self, owner: bytes, timeout: Optional[float] = None, giving_back: bool = False
    ) -> Any:
        """One release of ``owner``'s holds, of this kind only where the
        server takes a mode (``RWLOCK.UNLOCK``'s, 1.1.0); a server that
        refuses it is asked again without, and from then on. A give-back
        without a mode is sent only where it ends the hold it means
        (``_KEPT`` if not)."""
        args = _core.release_args(self.redis, self.commands, self.name, owner)
        if len(args) == 4:
            try:
                return call(self.redis, self.name, *args, timeout=timeout)
            except ResponseError as error:
                if not _core.unlock_mode_refused(self.redis, args, error):
                    raise
        if giving_back and not self._may_give_back_without_mode(owner):
            return _KEPT
        return call(self.redis, self.name, *args[:3], timeout=timeout)

    def _may_give_back_without_mode(self, owner: bytes) -> bool:
        """Whether a release without a mode ends the hold a give-back means."""
        return True

    def _give_back(self, owner: bytes) -> None:
        try:
            released = self._unlock(owner, timeout=1.0, giving_back=True)
            if released is not _KEPT:
                self._gave_back(owner, released)
        except Exception:  # the lease bounds what this costs
            logger.debug("could not give back %s %r after a failed wait", self.kind, self.name)

    def _give_back_if_added(self, owner: bytes, before: int) -> None:
        """Invariant: a give-back never takes a hold the owner had before.
        A holder's request of unknown outcome (it failed in flight: it may
        not have reached the server) is given back only if the server shows
        ``owner`` with more than its ``before`` holds; where it cannot tell
        (read holds), kept: a hold too many ends with its lease, never with a
        second holder."""
        try:
            info = call(self.redis, self.name, self.commands.info, self.name, timeout=1.0)
        except Exception:
            return
        held = self._owner_holds(_core.info_map(info), owner)
        if held is not None and held > before:
            self._give_back(owner)

    def _owner_holds(self, info: Optional[dict[str, Any]], owner: bytes) -> Optional[int]:
        """``owner``'s holds as the info command shows them; None: not shown."""
        return None

    def _gave_back(self, owner: bytes, reply: Any) -> None:
        """Account for the reply of a give-back."""

    def _send_release(self, token: bytes) -> Any:
        """The release's reply (a key of another type: -1). A failure in
        flight (a dropped connection, a timeout, an interrupt) of a caller's
        owner (``token=``, re-entrant, or one a ``token=`` acquire joined)
        leaves the hold as it was, watchdog and all, as redis-py's ``Lock``
        (8.2) keeps its token: the release may not have reached the server,
        and the caller can send it again. One that got no reply (a
        connection error or a timeout) of an owner made for this hold alone
        (and never joined) is handed to the background instead (see
        ``_release_again``): the hold is forgotten at once (watchdog
        stopped), so this holder no longer holds, and the error raised."""
        try:
            return self._unlock(token)
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
        """Send the release of ``fresh``'s owner again, in a thread of its own
        (a paused server would hold the caller), until it is answered (any
        reply) or the hold's lease would have ended at ``end`` (it ends the
        hold then anyway), each send at most ``RELEASE_AGAIN_SECONDS``, the
        next ``RELEASE_AGAIN_BACKOFF`` later, doubling up to
        ``RELEASE_AGAIN_BACKOFF_MAX``: the first may never have run, and the
        hold would stay, held by nobody, until its lease ends. Safe for an
        owner made for this hold alone: a second release ends this hold or
        answers that it has none, never another's; it stops if an acquire
        with that owner as ``token=`` marks it shared meanwhile. A daemon
        thread: a process that exits meanwhile drops it (the lease ends the
        hold)."""
        token = fresh.owner

        def again() -> None:
            pause = _core.RELEASE_AGAIN_BACKOFF
            try:
                while not fresh.shared:
                    left = end - time.monotonic()
                    try:
                        self._unlock(
                            token, timeout=max(0.01, min(left, _core.RELEASE_AGAIN_SECONDS))
                        )
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
                    time.sleep(pause)
                    pause = min(2 * pause, _core.RELEASE_AGAIN_BACKOFF_MAX)
            finally:
                _core.FRESH_OWNERS.discard(fresh)

        threading.Thread(target=again, name=f"warden-release:{self.name}", daemon=True).start()

    def _still_held(self, message: str) -> Literal[True]:
        """True if this holder still holds (an extend or reacquire that
        changes no lease); ``LockNotOwnedError`` with ``message`` if not."""
        if not self.owned():
            raise lock_error(LockNotOwnedError, message, self.name)
        return True

    def _renew(self, ms: int, message: str) -> Literal[True]:
        """Set the lease to ``ms`` from now; above the server's cap, capped
        and renewed until then."""
        lease = _core.capped(self.redis, ms)
        for attempt in (0, 1, 2):
            started = time.monotonic()
            try:
                renewed = call(
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
