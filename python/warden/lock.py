"""``warden.Lock``: a drop-in for ``redis.lock.Lock`` on warden's ``LOCK.*``.

``r.lock(name, ..., lock_class=warden.Lock)`` keeps redis-py's constructor,
methods and exceptions. A blocked ``acquire`` waits in the server's FIFO queue
(``LOCK.ACQUIRE ... WAIT``) instead of polling every ``sleep`` seconds, each
grant carries a fencing token (``lock.fence``), and ``timeout=None`` means a
lease renewed by a watchdog thread until release (``lock.lost`` is set if it
could not be renewed in time).

Each hold has its own ``lost`` event: ``lock.lost`` is the event of the
calling thread's current (or last) hold (with ``thread_local=False``, of the
lock's), so another thread's acquire never clears it. An acquire that is
interrupted (``KeyboardInterrupt``, a read timeout, a dropped connection)
gives back what the server may have granted it, re-entrant or not. Waiting
acquires run on connections of their own beside the client's pool (see
``warden._connection``), so a bounded pool full of waiters never starves a
release or a renewal.
"""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace, TracebackType
from typing import Any, Literal, Optional, Union

from redis.exceptions import LockError, LockNotOwnedError, ResponseError

from . import _core
from ._connection import call
from ._core import EXCLUSIVE, READ, WRITE, LockCommands, Number, lock_error

logger = logging.getLogger(__name__)


class _Watchdog(threading.Thread):
    """Renews one holder's lease every third of it; sets ``lost`` when it cannot."""

    def __init__(self, lock: Lock, owner: bytes, lease_ms: int, lost: threading.Event) -> None:
        super().__init__(name=f"warden-watchdog:{lock.name}", daemon=True)
        self.lock, self.owner, self.lease_ms = lock, owner, lease_ms
        self.lost = lost  # this hold's, not whichever hold the lock has later
        self.stopped = threading.Event()
        self.deadline = time.monotonic() + lease_ms / 1000

    def run(self) -> None:
        lease = self.lease_ms / 1000
        pause = lease / 3
        while not self.stopped.wait(pause):
            started = time.monotonic()
            remaining = self.deadline - started
            if remaining <= 0:
                return self._lost("its lease ended before it could be renewed")
            # Also a renewal stuck before its send (a new connection's
            # handshake with a paused server) must not outlive the lease.
            overdue = threading.Timer(
                remaining, self._lost, ("its lease ended before it could be renewed",)
            )
            overdue.daemon = True
            overdue.start()
            try:
                renewed = call(
                    self.lock.redis,
                    self.lock.name,
                    self.lock.commands.extend,
                    self.lock.name,
                    self.owner,
                    self.lease_ms,
                    timeout=remaining,
                )
            except ResponseError as error:
                if _core.is_wrongtype(error):
                    return self._lost("the key now holds another type")
                renewed = None
                logger.warning("renewing lock %r failed: %s", self.lock.name, error)
            except Exception as error:
                renewed = None
                logger.warning("renewing lock %r failed: %s", self.lock.name, error)
            finally:
                overdue.cancel()
            if self.stopped.is_set() or self.lost.is_set():
                return
            if renewed is None:  # try again soon, while the lease lasts
                pause = max(0.01, min(lease / 3, (self.deadline - time.monotonic()) / 2))
                continue
            if renewed != 1:
                return self._lost("it is no longer held by this owner")
            self.deadline = started + lease
            pause = lease / 3

    def _lost(self, why: str) -> None:
        if not self.stopped.is_set():
            logger.warning("lock %r lost: %s", self.lock.name, why)
            self.lost.set()


class Lock:
    """A distributed lock held in the server. See redis-py's ``Lock`` for the
    parameters; ``sleep`` is accepted and unused (nobody polls).

    ``reentrant=True`` gives every thread a stable owner, so a thread may
    acquire again (each acquire needs its release); by default each acquire
    takes a fresh owner and a second acquire from the same thread waits like
    anyone else. ``watchdog_timeout`` is the lease, in seconds, renewed while a
    lock with ``timeout=None`` is held.
    """

    commands: LockCommands = EXCLUSIVE

    def __init__(
        self,
        redis: Any,
        name: str,
        timeout: Optional[Number] = None,
        sleep: Number = 0.1,
        blocking: bool = True,
        blocking_timeout: Optional[Number] = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        *,
        reentrant: bool = False,
        watchdog_timeout: Number = _core.WATCHDOG_TIMEOUT,
    ) -> None:
        self.redis = redis
        self.name = name
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

    # --- what this holder knows -------------------------------------------

    @property
    def lost(self) -> threading.Event:
        """Set when the watchdog could not renew the lease in time (or found
        the lock taken away): stop the work the lock protects. Each hold has
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
        self.local.token = None
        self.local.fence = None
        self.local.holds = 0
        self.local.watchdog = None

    def _lease_ms(self) -> int:
        return _core.to_ms(self.timeout if self.timeout else self.watchdog_timeout)

    # --- redis-py's interface ---------------------------------------------

    def __enter__(self) -> Lock:
        if self.acquire():
            return self
        raise lock_error(LockError, "Unable to acquire lock within the time specified", self.name)

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
            logger.warning("Lock was unlocked or no longer owned when exiting context manager.")

    def acquire(
        self,
        sleep: Optional[Number] = None,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[Number] = None,
        token: Optional[Union[str, bytes]] = None,
    ) -> bool:
        """Take the lock; with ``blocking`` wait for it in the server's queue
        at most ``blocking_timeout`` seconds (None: forever). True once held."""
        if token is not None:
            owner = _core.encode(token)
        elif self.reentrant:
            owner = _core.reentrant_owner(threading.get_ident())
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
            fence = call(
                self.redis,
                self.name,
                *args,
                timeout=_core.read_timeout(wait),
                waits=wait is not None,
                on_sent=lambda: sent.append(True),
            )
        except ResponseError as error:
            if _core.is_wrongtype(error):
                return False  # the name holds someone's data: never ours
            raise
        except BaseException:
            # The connection is closed (the server dropped the waiter), but a
            # grant may have crossed the close: give back what this owner may
            # hold because of this acquire. A fresh owner, or a re-entrant one
            # that held nothing, holds at most this grant; a re-entrant owner
            # that already held is granted at once once the request is sent.
            if token is None and (not reentrant or before == 0 or sent):
                self._give_back(owner)
            raise
        if fence is None:
            return False
        if reentrant:
            _core.REENTRANT_HOLDS.add(owner, self.name, self.commands, 1)
        if self._token != owner:
            self._forget()
            self.local.token = owner
            self.local.holds = 0
            self.local.lost = lost = threading.Event()
            if not self.timeout:
                dog = _Watchdog(self, owner, lease_ms, lost)
                self.local.watchdog = dog
                dog.start()
        self.local.holds = getattr(self.local, "holds", 0) + 1
        self.local.fence = int(fence)
        return True

    def _give_back(self, owner: bytes) -> None:
        try:
            released = call(
                self.redis, self.name, self.commands.release, self.name, owner, timeout=1.0
            )
            if self.reentrant:
                _core.REENTRANT_HOLDS.released(owner, self.name, self.commands, released)
        except Exception:  # the lease bounds what this costs
            logger.debug("could not give back lock %r after a failed wait", self.name)

    def locked(self) -> bool:
        """True if anyone holds this lock."""
        return bool(call(self.redis, self.name, "EXISTS", self.name))

    def owned(self) -> bool:
        """True if this holder (thread, unless ``thread_local=False``) holds it."""
        token = self._token
        if token is None:
            return False
        try:
            info = _core.info_map(call(self.redis, self.name, self.commands.info, self.name))
        except ResponseError as error:
            if _core.is_wrongtype(error):
                return False
            raise
        return info is not None and self._holds_in(info, token)

    def _holds_in(self, info: dict[str, Any], token: bytes) -> bool:
        owner = info.get("owner")
        return owner is not None and _core.encode(owner) == token

    def release(self) -> None:
        """Give up one hold; ``LockNotOwnedError`` if the lock was no longer ours."""
        token = self._token
        if token is None:
            raise lock_error(
                LockError,
                "Cannot release a lock that's not owned or is already unlocked.",
                self.name,
            )
        try:
            released = call(self.redis, self.name, self.commands.release, self.name, token)
        except ResponseError as error:
            if not _core.is_wrongtype(error):
                raise
            released = -1
        except BaseException:
            self._forget()
            raise
        if self.reentrant:
            _core.REENTRANT_HOLDS.released(token, self.name, self.commands, released)
        if released == 0:  # re-entrant holds remain
            self.local.holds = max(1, getattr(self.local, "holds", 1) - 1)
            return
        self._forget()
        if released != 1:
            raise lock_error(
                LockNotOwnedError, "Cannot release a lock that's no longer owned", self.name
            )

    def extend(self, additional_time: Number, replace_ttl: bool = False) -> Literal[True]:
        """Add ``additional_time`` seconds to the lease (or set it to that with
        ``replace_ttl``)."""
        if self._token is None:
            raise lock_error(LockError, "Cannot extend an unlocked lock", self.name)
        if self.timeout is None:
            raise lock_error(LockError, "Cannot extend a lock with no timeout", self.name)
        ms = _core.to_ms(additional_time)
        if not replace_ttl:
            left = call(self.redis, self.name, "PTTL", self.name)
            if left < 0:
                raise lock_error(
                    LockNotOwnedError, "Cannot extend a lock that's no longer owned", self.name
                )
            ms += left
        return self._renew(ms, "Cannot extend a lock that's no longer owned")

    def reacquire(self) -> Literal[True]:
        """Reset the lease to ``timeout``."""
        if self._token is None:
            raise lock_error(LockError, "Cannot reacquire an unlocked lock", self.name)
        if self.timeout is None:
            raise lock_error(LockError, "Cannot reacquire a lock with no timeout", self.name)
        return self._renew(
            _core.to_ms(self.timeout), "Cannot reacquire a lock that's no longer owned"
        )

    def _renew(self, ms: int, message: str) -> Literal[True]:
        try:
            renewed = call(self.redis, self.name, self.commands.extend, self.name, self._token, ms)
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
        # RWLOCK.INFO counts readers without naming them.
        return bool(_core.text(info.get("mode")) == "read")


class WriteLock(Lock):
    """The exclusive side of a ``ReadWriteLock`` (``RWLOCK.WRITE``)."""

    commands = WRITE

    def _holds_in(self, info: dict[str, Any], token: bytes) -> bool:
        writer = info.get("writer")
        return writer is not None and _core.encode(writer) == token


class ReadWriteLock:
    """Readers share, a writer excludes everyone; waiting writers are not
    starved. ``read_lock()`` and ``write_lock()`` return locks with
    ``Lock``'s interface, built with this object's parameters."""

    def __init__(self, redis: Any, name: str, **lock_options: Any) -> None:
        self.redis = redis
        self.name = name
        self.lock_options = lock_options

    def read_lock(self) -> ReadLock:
        return ReadLock(self.redis, self.name, **self.lock_options)

    def write_lock(self) -> WriteLock:
        return WriteLock(self.redis, self.name, **self.lock_options)
