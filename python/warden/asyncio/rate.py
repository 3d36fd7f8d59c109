"""``warden.asyncio.RateLimiter``: method for method ``warden.RateLimiter``
for ``redis.asyncio`` clients (read that module's notes). A cancelled
``acquire`` leaves the server's queue at once (``CLIENT UNBLOCK``, or closing
its connection where that does not work) and takes nothing: a grant read
after the cancel is given back (``RATE.REFUND``), and the cancel goes on.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from .. import _core, _rate
from .._core import Deadline
from .._rate import Duration, RateDecision, RateInfo
from ._connection import DeadlinePassed, blocking_call, call, to_the_end, try_call

logger = logging.getLogger(__name__)


class RateLimiter(_rate.Limiter):
    """``count`` tokens of ``key`` every ``period``, at most ``burst`` at
    once, for ``redis.asyncio`` clients. Parameters as
    ``warden.RateLimiter``."""

    async def acquire(self, cost: int = 1, wait: Optional[Duration] = None) -> RateDecision:
        """As ``warden.RateLimiter.acquire``."""
        cost = _rate.positive("cost", cost)
        return await self._acquire(cost, self._deadline(wait))

    async def try_acquire(self, cost: int = 1) -> RateDecision:
        """As ``warden.RateLimiter.try_acquire``."""
        return await self._acquire(_rate.positive("cost", cost), None)

    async def _acquire(self, cost: int, deadline: Optional[Deadline]) -> RateDecision:
        args = self._acquire_args(cost)

        async def lost(reply: Any) -> None:
            if _rate.granted(reply):
                await self._give_back(cost)

        try:
            # Without a deadline too: a reply still due when the caller is
            # cancelled is read in the background, and a grant given back.
            reply = await try_call(self.redis, self.key, args, deadline or Deadline(None), lost)
        except DeadlinePassed:
            return self._unanswered()
        first = _rate.decision(reply)
        if deadline is None:
            return first
        if first.allowed:
            if deadline.passed():  # read past the caller's deadline: never a late grant
                await to_the_end(self._give_back(cost))
                return _rate.unanswered(first.burst)
            return first
        if _rate.cannot_conform_in_time(first, deadline):
            return first
        # Past the deadline blocking_call gives a grant back itself (None).
        reply = await blocking_call(
            self.redis, self.key, args, deadline, _core.queue_args(self.max_queue), lost
        )
        if reply is None:
            return _rate.unanswered(first.burst)
        return _rate.decision(reply)

    async def _give_back(self, cost: int) -> None:
        try:
            await call(self.redis, self.key, "RATE.REFUND", self.key, cost, timeout=1.0)
            logger.debug("gave back %d tokens of %r its caller did not take", cost, self.key)
        except Exception as error:
            logger.debug("could not give back %d tokens of %r: %s", cost, self.key, error)

    async def refund(self, cost: int) -> bool:
        """As ``warden.RateLimiter.refund``."""
        cost = _rate.positive("cost", cost)
        return bool(await call(self.redis, self.key, "RATE.REFUND", self.key, cost) == 1)

    async def set_rate(self, count: int, period: Duration, burst: Optional[int] = None) -> bool:
        """As ``warden.RateLimiter.set_rate``."""
        args = self._config_args(count, period, burst)
        changed = await call(self.redis, self.key, *args)
        self._stated(args)
        return bool(changed == 1)

    async def info(self) -> Optional[RateInfo]:
        """As ``warden.RateLimiter.info``."""
        return _rate.info(await call(self.redis, self.key, "RATE.INFO", self.key))
