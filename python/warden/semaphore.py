"""``warden.Semaphore``: at most ``limit`` permits held at once, on warden's
``SEM.*``.

Built like ``warden.Lock`` (``warden._holder``): a blocked ``acquire`` waits
in the server's FIFO queue (``SEM.ACQUIRE ... WAIT``), never overtaken by a
later request even one asking fewer permits; each grant carries a fencing
token; ``timeout=None`` means a lease renewed by a watchdog thread until
release, and ``sem.lost`` (the calling thread's hold's event) is set if it
could not be. Every acquire is a fresh owner (the server allows one hold per
owner). One object holds at most one hold per thread (``thread_local=False``:
one in all): share the object between threads, each thread takes its own
hold. Errors the server answers (another limit, invalid permits) are
redis-py's ``ResponseError``.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from redis.exceptions import LockError, LockNotOwnedError, ResponseError

from . import _core
from ._connection import call
from ._core import SEMAPHORE, LockCommands, Number, lock_error
from ._holder import Holder


class Semaphore(Holder):
    """At most ``limit`` permits of ``name`` held at once, by every client of
    the server. ``permits`` is what an acquire asks for unless it says
    otherwise; ``timeout`` the lease in seconds (None: ``watchdog_timeout``,
    renewed while held); ``blocking``, ``blocking_timeout`` and ``max_queue``
    as for ``warden.Lock``."""

    commands: LockCommands = SEMAPHORE
    kind = "semaphore"

    def __init__(
        self,
        redis: Any,
        name: str,
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

    def _holding(self) -> bool:
        """This thread (with ``thread_local=False``: anyone) holds through this
        object, as far as it knows."""
        return self._token is not None and not self.lost.is_set()

    def acquire(
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
                "This semaphore is already held here: release it first "
                "(or use one Semaphore object per concurrent hold)",
                self.name,
            )
        owner = _core.fresh_owner()
        lease_ms = self._lease_ms()
        args = _core.semaphore_args(
            self.name, owner, lease_ms, self.limit, self.permits if permits is None else permits
        )

        def record(fence: int) -> None:
            self._new_hold(owner, args[3])
            self._fresh_hold(owner)  # every acquire takes an owner of its own
            self.local.holds = 1
            self.local.fence = fence

        fence = self._acquire(args, owner, blocking, blocking_timeout, lambda sent: True, record)
        return fence is not None

    def release(self) -> None:
        """Give the permits back (to the waiters at once); ``LockNotOwnedError``
        if the hold was no longer ours (its lease ended, or it was deleted).
        One that gets no reply (a connection error, a timeout) raises its
        error; every acquire takes an owner of its own, so the release is
        handed to the background, which sends it again until it is answered
        or the lease would have ended, and this object forgets the hold at
        once (watchdog stopped; a retry raises ``LockError``), as
        ``Lock.release``'s. A process that exits right after drops that
        send: the lease ends the hold."""
        token = self._token
        if token is None:
            raise lock_error(
                LockError,
                "Cannot release a semaphore that's not held or is already released.",
                self.name,
            )
        released = self._send_release(token)  # a failure in flight: sent again, forgotten
        if self._token == token:  # not another acquirer's, held meanwhile
            self._forget()
        if released != 1:
            raise lock_error(
                LockNotOwnedError, "Cannot release a semaphore that's no longer held", self.name
            )

    def extend(self, additional_time: Number, replace_ttl: bool = False) -> Literal[True]:
        """Add ``additional_time`` seconds to this hold's lease (or set it to
        that with ``replace_ttl``)."""
        token = self._token
        if token is None:
            raise lock_error(LockError, "Cannot extend a semaphore that's not held", self.name)
        if self.timeout is None:
            raise lock_error(LockError, "Cannot extend a semaphore with no timeout", self.name)
        ms = _core.to_ms(additional_time)
        if not replace_ttl:
            info = self._info(token)
            left = -2 if info is None else int(info.get("ttl", -2))
            if left < 0:
                raise lock_error(
                    LockNotOwnedError, "Cannot extend a semaphore that's no longer held", self.name
                )
            ms += left
        return self._renew(ms, "Cannot extend a semaphore that's no longer held")

    def reacquire(self) -> Literal[True]:
        """Reset this hold's lease to ``timeout``."""
        if self._token is None:
            raise lock_error(LockError, "Cannot reacquire a semaphore that's not held", self.name)
        if self.timeout is None:
            raise lock_error(LockError, "Cannot reacquire a semaphore with no timeout", self.name)
        return self._renew(
            _core.to_ms(self.timeout), "Cannot reacquire a semaphore that's no longer held"
        )

    def owned(self) -> bool:
        """True if this thread (unless ``thread_local=False``) holds permits."""
        token = self._token
        if token is None:
            return False
        info = self._info(token)
        return info is not None and int(info.get("permits", 0)) > 0

    def info(self) -> Optional[dict[str, Any]]:
        """``SEM.INFO``: None if nobody holds or waits; else ``limit``,
        ``used``, ``holders``, ``waiters`` and, while this thread holds,
        ``permits`` and ``ttl`` (ms) of its hold."""
        return self._info(self._token)

    def _info(self, owner: Optional[bytes]) -> Optional[dict[str, Any]]:
        args = [self.commands.info, self.name] + ([owner] if owner is not None else [])
        try:
            return _core.info_map(call(self.redis, self.name, *args))
        except ResponseError as error:
            if _core.is_wrongtype(error):
                return None
            raise

    def set_limit(self, limit: int) -> bool:
        """Change the semaphore's limit (``SEM.SETLIMIT``); this object states
        the new one from now on. False if the semaphore does not exist (no
        holders): the next acquire creates it with its own ``LIMIT``."""
        changed = call(self.redis, self.name, "SEM.SETLIMIT", self.name, limit)
        self.limit = limit
        return bool(changed == 1)
