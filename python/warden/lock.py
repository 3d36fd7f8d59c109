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
release or a renewal. What locks and semaphores share is in
``warden._holder``.
"""

from __future__ import annotations

import threading
from typing import Any, Literal, Optional, Union

from redis.exceptions import LockError, LockNotOwnedError, ResponseError

from . import _core
from ._connection import call
from ._core import EXCLUSIVE, READ, WRITE, LockCommands, Number, lock_error
from ._holder import Holder


class Lock(Holder):
    """A distributed lock held in the server. See redis-py's ``Lock`` for the
    parameters; ``sleep`` is accepted and unused (nobody polls).

    ``reentrant=True`` gives every thread a stable owner, so a thread may
    acquire again (each acquire needs its release); by default each acquire
    takes a fresh owner and a second acquire from the same thread waits like
    anyone else. ``watchdog_timeout`` is the lease, in seconds, renewed while a
    lock with ``timeout=None`` is held. ``max_queue``: an acquire that finds
    that many already waiting answers False at once (load shedding).
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

    # --- redis-py's interface ---------------------------------------------

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
        lease_ms = self._lease_ms()
        args = _core.acquire_args(self.commands, self.name, owner, lease_ms)
        reentrant = token is None and self.reentrant
        before = _core.REENTRANT_HOLDS.get(owner, self.name, self.commands) if reentrant else 0
        fresh = token is None and not reentrant
        if not fresh:
            # A caller-chosen owner may join a live hold of an owner made for
            # it alone (this object's, another's, a downgrade's): that hold's
            # release is then never sent again (it could take this one).
            _core.FRESH_OWNERS.share(owner)
        # What this owner may hold because of this acquire if it fails in
        # flight: a fresh owner, or a re-entrant one that held nothing, at
        # most this grant; a re-entrant owner that already held is granted at
        # once once the request is sent.

        def record(fence: int) -> None:
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

        fence = self._acquire(
            args,
            owner,
            blocking,
            blocking_timeout,
            lambda sent: token is None and (not reentrant or before == 0 or sent),
            record,
            holds_before=before if reentrant else 0,
        )
        return fence is not None

    def _gave_back(self, owner: bytes, reply: Any) -> None:
        if self.reentrant:
            _core.REENTRANT_HOLDS.released(owner, self.name, self.commands, reply)

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

    def _owner_holds(self, info: Optional[dict[str, Any]], owner: bytes) -> Optional[int]:
        if info is None:
            return 0
        return int(info.get("holds", 0)) if self._holds_in(info, owner) else 0

    def release(self) -> None:
        """Give up one hold; ``LockNotOwnedError`` if the lock was no longer
        ours. The hold is forgotten once the server has answered (or the
        release was handed to the background, below), and only if it is
        still this holder's (with ``thread_local=False`` another thread may
        have acquired meanwhile).

        A release that gets no reply (a connection error, a timeout) raises
        its error, and then:

        * of an owner made for this acquisition (no ``token=``, not
          re-entrant, and never joined by an acquire with it as ``token=``):
          the release is handed to the background, which sends it again on
          a new connection until it is answered or the lease would have
          ended, and this holder forgets the hold at once (watchdog
          stopped): a retry raises ``LockError`` as on an unlocked lock.
          With ``thread_local=False`` another thread's acquire may have been
          granted meanwhile: a retry then releases that hold, as any stray
          release of a shared object would. A process that exits right
          after drops the background send: the lease ends the hold;
        * of a caller-chosen owner (``token=``, re-entrant): the hold is kept,
          watchdog and all, as redis-py's ``Lock`` keeps its token, and a
          retry sends the release again."""
        expected = self._token
        if expected is None:
            raise lock_error(
                LockError,
                "Cannot release a lock that's not owned or is already unlocked.",
                self.name,
            )
        try:
            holds_remain = self.do_release(expected)
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

    def do_release(self, expected_token: bytes) -> bool:
        """Give up one hold of ``expected_token`` in the server (redis-py's
        hook of the same name): True while re-entrant holds remain, False once
        the lock is let go; ``LockNotOwnedError`` if it held none."""
        released = self._send_release(expected_token)
        if self.reentrant:
            _core.REENTRANT_HOLDS.released(expected_token, self.name, self.commands, released)
        if released == 0:
            return True
        if released != 1:
            raise lock_error(
                LockNotOwnedError, "Cannot release a lock that's no longer owned", self.name
            )
        return False

    def extend(self, additional_time: Number, replace_ttl: bool = False) -> Literal[True]:
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
            left = call(self.redis, self.name, "PTTL", self.name)
            if left < 0:
                raise lock_error(LockNotOwnedError, message, self.name)
        ms = _core.extended_lease_ms(additional_time, left)
        if ms is None:
            return self._still_held(message)
        return self._renew(ms, message)

    def reacquire(self) -> Literal[True]:
        """Reset the lease to ``timeout``; with ``timeout=0`` (the watchdog's
        lease) nothing to reset: True if the lock is still ours."""
        if self._token is None:
            raise lock_error(LockError, "Cannot reacquire an unlocked lock", self.name)
        if self.timeout is None:
            raise lock_error(LockError, "Cannot reacquire a lock with no timeout", self.name)
        message = "Cannot reacquire a lock that's no longer owned"
        if not self.timeout:
            return self._still_held(message)
        return self._renew(_core.to_ms(self.timeout), message)


class ReadLock(Lock):
    """The shared side of a ``ReadWriteLock`` (``RWLOCK.READ``)."""

    commands = READ

    def _holds_in(self, info: dict[str, Any], token: bytes) -> bool:
        # RWLOCK.INFO counts readers without naming them.
        return bool(_core.text(info.get("mode")) == "read")

    def _owner_holds(self, info: Optional[dict[str, Any]], owner: bytes) -> Optional[int]:
        return None  # RWLOCK.INFO counts readers without naming them

    def _may_give_back_without_mode(self, owner: bytes) -> bool:
        # A server before 1.1.0 ends an owner's write holds before its read
        # holds: a read granted while its owner writes (a downgrade) and given
        # back would end the write hold instead, and let readers in beside the
        # writer. Kept then: it ends with its lease.
        try:
            reply = call(self.redis, self.name, "RWLOCK.INFO", self.name, timeout=1.0)
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
