"""What the sync and asyncio rate limiters share: their arguments, the
commands they send and the shapes of the server's replies. Nothing here
talks to a server.

Times go in as seconds (int or float, as redis-py takes them) or a
``datetime.timedelta``, and come back as seconds (float): the server's whole
milliseconds, divided by 1000.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Optional, Union

from redis.exceptions import InvalidResponse

from . import _core
from ._core import Deadline, Number

#: A period or a wait: seconds, or a ``timedelta``.
Duration = Union[Number, timedelta]

_MS = timedelta(milliseconds=1)


@dataclass(frozen=True)
class RateDecision:
    """A limiter's answer to one request (``RATE.ACQUIRE``'s five integers).
    True as a bool when the tokens were taken."""

    #: The tokens were taken.
    allowed: bool
    #: The limiter's burst: the most tokens taken at once (the bucket's size).
    burst: int
    #: Whole tokens left.
    remaining: int
    #: Seconds until the request would conform (counting the requests that
    #: wait ahead of it), when it was not allowed; None when allowed, or when
    #: a wait ended without an answer (the deadline passed, it was
    #: unblocked).
    retry_after: Optional[float]
    #: Seconds until the bucket is full again.
    reset_after: float

    @property
    def limited(self) -> bool:
        """Nothing was taken."""
        return not self.allowed

    def __bool__(self) -> bool:
        return self.allowed


@dataclass(frozen=True)
class RateInfo:
    """What ``RATE.INFO`` reports of a limiter."""

    #: Tokens every ``period``.
    count: int
    #: The rate's period, in seconds.
    period: float
    #: The most tokens taken at once.
    burst: int
    #: Whole tokens available now.
    remaining: int
    #: Seconds until the bucket is full again.
    reset_after: float
    #: Requests waiting in the limiter's queue.
    waiters: int


def positive(name: str, value: Any) -> int:
    """``value`` if it is an int of at least 1 (the server checks the top of
    each range)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int of at least 1, not {value!r}")
    return value


def period_ms(period: Duration) -> int:
    """A rate's period in whole milliseconds (at least 1): a period that is
    not a whole number of ms would be rounded into another rate."""
    if isinstance(period, timedelta):
        if period >= _MS and not period % _MS:
            return period // _MS
    elif not isinstance(period, bool) and isinstance(period, (int, float)):
        ms = period * 1000
        if math.isfinite(ms) and ms >= 1 and abs(ms - round(ms)) < 1e-6:
            return int(round(ms))
    raise ValueError(
        f"period must be a whole number of milliseconds, at least 1 ms "
        f"(seconds or a timedelta), not {period!r}"
    )


def seconds(value: Optional[Duration]) -> Optional[Number]:
    return value.total_seconds() if isinstance(value, timedelta) else value


def wait_deadline(wait: Optional[Duration]) -> Optional[Deadline]:
    """The deadline of an acquire that waits up to ``wait``, from now; as a
    lock's ``blocking_timeout``: None (or ``math.inf``) waits until the
    tokens conform, 0 does not wait (None is returned)."""
    wait = seconds(wait)
    if wait is not None and (isinstance(wait, bool) or not isinstance(wait, (int, float))):
        raise ValueError(f"wait must be seconds, a timedelta or None, not {wait!r}")
    if wait is not None and math.isnan(wait):
        raise ValueError("wait must be a number of seconds, a timedelta or None, not nan")
    return _core.deadline(True, wait)


def rate_args(command: str, key: str, count: int, period: int, burst: Optional[int]) -> list[Any]:
    """``command key count period [BURST burst]``: every request states the rate."""
    args: list[Any] = [command, key, count, period]
    if burst is not None:
        args += ["BURST", burst]
    return args


def granted(reply: Any) -> bool:
    """An acquire's reply that took tokens: ``[0, ...]``."""
    return isinstance(reply, list) and len(reply) == 5 and int(reply[0]) == 0


def decision(reply: Any) -> RateDecision:
    """``RATE.ACQUIRE``'s reply: ``[limited, burst, remaining, retry_after,
    reset_after]`` (ms; ``retry_after`` -1 when taken)."""
    if not isinstance(reply, list) or len(reply) != 5:
        raise InvalidResponse(f"RATE.ACQUIRE answered {reply!r}, not five integers")
    limited, burst, remaining, retry, reset = (int(word) for word in reply)
    return RateDecision(
        allowed=limited == 0,
        burst=burst,
        remaining=max(0, remaining),
        retry_after=retry / 1000 if limited and retry >= 0 else None,
        reset_after=max(0, reset) / 1000,
    )


def unanswered(burst: int) -> RateDecision:
    """Not allowed, and no retry-after known: a wait that ended unanswered
    (its deadline passed, it was unblocked), or a grant that came too late
    and was given back."""
    return RateDecision(allowed=False, burst=burst, remaining=0, retry_after=None, reset_after=0.0)


def info(reply: Any) -> Optional[RateInfo]:
    """``RATE.INFO``'s reply (RESP2 or RESP3), or None: no limiter."""
    fields = _core.info_map(reply)
    if fields is None:
        return None

    def field(name: str) -> int:
        return int(fields.get(name, 0))

    return RateInfo(
        count=field("count"),
        period=field("period") / 1000,
        burst=field("burst"),
        remaining=field("remaining"),
        reset_after=field("reset_after") / 1000,
        waiters=field("waiters"),
    )


def cannot_conform_in_time(first: RateDecision, deadline: Deadline) -> bool:
    """A limited answer whose tokens conform only after the caller's deadline:
    waiting would be answered the same at once, so it is the answer."""
    left = deadline.remaining()
    return first.retry_after is not None and left is not None and first.retry_after > left


class Limiter:
    """What a sync and an asyncio ``RateLimiter`` share: the key, the rate
    each request states, the wait and the load shedding."""

    def __init__(
        self,
        redis: Any,
        key: str,
        count: int,
        period: Duration,
        burst: Optional[int] = None,
        wait: Optional[Duration] = None,
        max_queue: Optional[int] = None,
    ) -> None:
        self.redis = redis
        self.key = key
        self.count = positive("count", count)
        self.period_ms = period_ms(period)
        self.burst = None if burst is None else positive("burst", burst)
        wait_deadline(wait)  # checked now, counted from each call
        self.wait = wait
        self.max_queue = _core.check_max_queue(max_queue)

    def __repr__(self) -> str:
        burst = "" if self.burst is None else f", burst={self.burst}"
        return (
            f"{type(self).__name__}({self.key!r}, {self.count} per {self.period_ms} ms{burst}, "
            f"wait={self.wait!r}, max_queue={self.max_queue!r})"
        )

    @property
    def period(self) -> float:
        """The rate's period, in seconds."""
        return self.period_ms / 1000

    def _acquire_args(self, cost: int) -> list[Any]:
        args = rate_args("RATE.ACQUIRE", self.key, self.count, self.period_ms, self.burst)
        return args + ["COST", cost]

    def _deadline(self, wait: Optional[Duration]) -> Optional[Deadline]:
        """An acquire's deadline: ``wait``, or the limiter's when None."""
        return wait_deadline(self.wait if wait is None else wait)

    def _unanswered(self) -> RateDecision:
        """For an acquire that got no reply: the burst stated (the server's
        default: ``count``)."""
        return unanswered(self.burst if self.burst is not None else min(self.count, 10**9))

    def _config_args(self, count: int, period: Duration, burst: Optional[int]) -> list[Any]:
        """``RATE.CONFIG`` of a new rate (checked); ``_stated`` records it."""
        count = positive("count", count)
        burst = None if burst is None else positive("burst", burst)
        return rate_args("RATE.CONFIG", self.key, count, period_ms(period), burst)

    def _stated(self, config_args: list[Any]) -> None:
        """The rate of a ``RATE.CONFIG`` sent: stated from now on."""
        self.count, self.period_ms = config_args[2], config_args[3]
        self.burst = config_args[5] if len(config_args) > 4 else None
