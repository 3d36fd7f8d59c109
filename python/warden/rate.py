"""``warden.RateLimiter``: ``count`` tokens every ``period``, at most ``burst``
at once, on warden's ``RATE.*`` (GCRA, computed exactly by the server).

An ``acquire`` first tries once on an ordinary connection of the client's
pool: tokens that conform now cost one round trip. A limited
answer whose tokens conform before the deadline goes on to wait in the
server's FIFO queue (``RATE.ACQUIRE ... WAIT``), on a connection of the wait
pool beside the client's, exactly as a blocked ``Lock.acquire`` does (see
``warden._connection``): ``WAIT`` is what is left of ``wait`` (counted from
the call) less a margin for the reply's way back. A request whose tokens
cannot conform before the deadline is answered at once, limited, with its
``retry_after``. The deadline passing locally or ``KeyboardInterrupt`` take
the waiter out of the queue at once (``CLIENT UNBLOCK``, or closing its
connection on servers that do not unblock module waiters): it takes nothing.
Tokens of a grant this client read but its caller will not get (too late,
interrupted) are given back with ``RATE.REFUND`` — only a grant read, never
a guess, so a give-back never returns tokens nobody took; a grant lost with
a closed connection costs tokens nobody used (fewer admitted, never more).

Every request states the rate; while the limiter exists the server refuses
another one (redis-py's ``ResponseError``, ``limiter rate is ...``): two
versions of a service cannot silently disagree on the bound. ``set_rate``
changes it on purpose. One object may be shared by threads.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from . import _core, _rate
from ._connection import DeadlinePassed, blocking_call, call, try_call
from ._core import Deadline
from ._rate import Duration, RateDecision, RateInfo

logger = logging.getLogger(__name__)


class RateLimiter(_rate.Limiter):
    """``count`` tokens of ``key`` every ``period`` (seconds or a
    ``timedelta``, a whole number of ms), at most ``burst`` (default
    ``count``) at once, for every client of the server. ``wait``: how long
    ``acquire`` waits in the server's queue, as a lock's ``blocking_timeout``
    (seconds or a ``timedelta``; None, the default, or ``math.inf``: until
    the tokens conform; 0: it does not wait).
    ``max_queue``: ``acquire`` answers at once, limited, instead of queueing
    when that many requests already wait (load shedding)."""

    def acquire(self, cost: int = 1, wait: Optional[Duration] = None) -> RateDecision:
        """Take ``cost`` tokens: at once if they conform (and nobody waits
        ahead), else after waiting in the server's queue up to ``wait``
        (default: the limiter's). A request that cannot conform in time is
        answered at once, limited, with its ``retry_after``; a wait that
        ends unanswered (the deadline passed first) is limited with
        ``retry_after`` None. ``ResponseError`` for what the server refuses
        (another rate, a cost above the burst)."""
        cost = _rate.positive("cost", cost)
        return self._acquire(cost, self._deadline(wait))

    def try_acquire(self, cost: int = 1) -> RateDecision:
        """Take ``cost`` tokens if they conform now and nobody waits ahead."""
        return self._acquire(_rate.positive("cost", cost), None)

    def _acquire(self, cost: int, deadline: Optional[Deadline]) -> RateDecision:
        args = self._acquire_args(cost)

        def lost(reply: Any) -> None:
            if _rate.granted(reply):
                self._give_back(cost)

        # The reply once read, until it is returned: an interrupt in between
        # finds a grant here and gives it back.
        got: list[Any] = []
        try:
            try:
                try_call(self.redis, self.key, args, deadline, lost, got)
            except DeadlinePassed:
                return self._unanswered()
            first = _rate.decision(got[0])
            if deadline is None:
                return first
            if first.allowed:
                if deadline.passed():  # read past the caller's deadline: never a late grant
                    got.clear()
                    self._give_back(cost)
                    return _rate.unanswered(first.burst)
                return first
            if _rate.cannot_conform_in_time(first, deadline):
                return first
            got.clear()
            blocking_call(
                self.redis,
                self.key,
                args,
                deadline,
                _core.queue_args(self.max_queue),
                lost,
                got,
            )
            if not got or got[0] is None:
                return _rate.unanswered(first.burst)
            answer = _rate.decision(got[0])
            if answer.allowed and deadline.passed():
                got.clear()
                self._give_back(cost)  # granted after the caller's deadline: given back
                return _rate.unanswered(answer.burst)
            return answer
        except BaseException:
            if got and _rate.granted(got[0]):
                lost(got[0])
            raise

    def _give_back(self, cost: int) -> None:
        try:
            call(self.redis, self.key, "RATE.REFUND", self.key, cost, timeout=1.0)
            logger.debug("gave back %d tokens of %r its caller did not take", cost, self.key)
        except Exception as error:
            logger.debug("could not give back %d tokens of %r: %s", cost, self.key, error)

    def refund(self, cost: int) -> bool:
        """Give ``cost`` tokens back (``RATE.REFUND``): a reservation whose
        work did not happen. Never beyond a full bucket; the waiters that now
        conform are served. False: no limiter (its bucket is full)."""
        cost = _rate.positive("cost", cost)
        return bool(call(self.redis, self.key, "RATE.REFUND", self.key, cost) == 1)

    def set_rate(self, count: int, period: Duration, burst: Optional[int] = None) -> bool:
        """Change the limiter's rate (``RATE.CONFIG``), keeping the tokens it
        owes, and the rate this object's requests state from now on. False:
        no limiter exists (its bucket is full), the next request creates it at
        the new rate. Waiters that stated the old rate are answered
        ``ResponseError``."""
        args = self._config_args(count, period, burst)
        changed = call(self.redis, self.key, *args)
        self._stated(args)
        return bool(changed == 1)

    def info(self) -> Optional[RateInfo]:
        """The limiter's state (``RATE.INFO``), or None when there is no
        limiter (its bucket is full and nobody waits)."""
        return _rate.info(call(self.redis, self.key, "RATE.INFO", self.key))
