"""warden.RateLimiter and warden.asyncio.RateLimiter against a real server.

Rates are chosen so that what a test asserts is an order or a count, never a
speed: the tokens a test waits for conform hundreds of ms apart, and the
ones that must not come are a minute away.
"""

from __future__ import annotations

import asyncio
import math
import signal
import threading
import time
from datetime import timedelta
from typing import Any, Callable

import pytest
import redis
from redis.cluster import RedisCluster
from redis.exceptions import ResponseError
from servers import Cluster, Server

import warden
import warden.asyncio
from warden import RateDecision, RateInfo, _rate


def wait_for(condition: Callable[[], Any], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


async def await_for(condition: Callable[[], Any], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


def waiters(limiter: warden.RateLimiter) -> int:
    info = limiter.info()
    return 0 if info is None else info.waiters


async def async_waiters(limiter: warden.asyncio.RateLimiter) -> int:
    info = await limiter.info()
    return 0 if info is None else info.waiters


def refunds(r: Any) -> int:
    """RATE.REFUND commands the server ran."""
    return int(r.info("commandstats").get("cmdstat_rate.refund", {}).get("calls", 0))


# --- the pure parts ----------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ([0, 10, 9, -1, 100], RateDecision(True, 10, 9, None, 0.1)),
        ([0, 2, 0, -1, 11994], RateDecision(True, 2, 0, None, 11.994)),
        ([1, 2, 0, 5985, 11985], RateDecision(False, 2, 0, 5.985, 11.985)),
        # warden.sync-replicas: the replicas did not acknowledge, given back.
        ([1, 5, 0, 0, 0], RateDecision(False, 5, 0, 0.0, 0.0)),
    ],
)
def test_replies_read_as_decisions(reply: list[int], expected: RateDecision) -> None:
    decision = _rate.decision(reply)
    assert decision == expected
    assert bool(decision) is decision.allowed is (not decision.limited)


@pytest.mark.parametrize("reply", [None, [0, 1], [0, 1, 2, 3, 4, 5], b"OK"])
def test_a_reply_that_is_not_five_integers_is_invalid(reply: Any) -> None:
    with pytest.raises(redis.exceptions.InvalidResponse):
        _rate.decision(reply)


@pytest.mark.parametrize(
    ("period", "ms"),
    [
        (1, 1000),
        (0.001, 1),
        (2.5, 2500),
        (86400, 86_400_000),
        (timedelta(minutes=1), 60_000),
        (timedelta(milliseconds=7), 7),
    ],
)
def test_periods_go_on_the_wire_in_ms(period: Any, ms: int) -> None:
    assert _rate.period_ms(period) == ms


# --- sync --------------------------------------------------------------------


def test_allowed_then_limited_with_the_servers_five_integers(r: redis.Redis) -> None:
    # 10 a minute, burst 2: a token every 6 s.
    limiter = warden.RateLimiter(r, "partner:api", 10, timedelta(minutes=1), burst=2)
    first = limiter.acquire()
    assert (first.allowed, first.burst, first.remaining, first.retry_after) == (True, 2, 1, None)
    assert first.reset_after == 6.0  # a full bucket less one token, exactly
    second = limiter.try_acquire()
    assert (second.allowed, second.remaining, second.retry_after) == (True, 0, None)
    assert 11.0 < second.reset_after <= 12.0
    third = limiter.acquire(wait=0)  # no wait: answered at once
    assert (third.allowed, third.limited, third.burst, third.remaining) == (False, True, 2, 0)
    assert third.retry_after is not None and 5.0 < third.retry_after <= 6.0
    assert 11.0 < third.reset_after <= 12.0
    assert not third
    info = limiter.info()
    assert info is not None
    assert (info.count, info.period, info.burst, info.remaining, info.waiters) == (
        10,
        60.0,
        2,
        0,
        0,
    )


def test_the_rate_each_request_states_goes_on_the_wire(r: redis.Redis) -> None:
    warden.RateLimiter(r, "stated", 3, 1.5).acquire(2)
    info = warden.RateLimiter(r, "stated", 3, timedelta(milliseconds=1500)).info()
    assert info is not None
    # reset_after counts down from 1.0 s (2 tokens of 0.5 s) as time passes.
    assert 0.5 < info.reset_after <= 1.0
    assert info == RateInfo(
        count=3, period=1.5, burst=3, remaining=1, reset_after=info.reset_after, waiters=0
    )


def test_info_of_a_missing_limiter_is_none(r: redis.Redis) -> None:
    assert warden.RateLimiter(r, "nobody", 5, 1).info() is None


def test_waiters_are_granted_in_the_order_they_asked(r: redis.Redis) -> None:
    # 2 a second, burst 2, emptied: the first waiter's 2 tokens conform at
    # 1 s; the second asks for 1 (which alone would conform at 0.5 s) and
    # comes after it, at 1.5 s.
    limiter = warden.RateLimiter(r, "fifo", 2, 1, wait=30)
    assert limiter.acquire(2)
    granted: list[tuple[str, bool]] = []

    def ask(name: str, cost: int) -> None:
        granted.append((name, limiter.acquire(cost).allowed))

    first = threading.Thread(target=ask, args=("two tokens", 2))
    first.start()
    wait_for(lambda: waiters(limiter) == 1)
    second = threading.Thread(target=ask, args=("one token", 1))
    second.start()
    first.join(30)
    second.join(30)
    assert granted == [("two tokens", True), ("one token", True)]


def test_a_wait_that_cannot_conform_in_time_is_answered_at_once(r: redis.Redis) -> None:
    # One token a minute: the next one is 60 s away, past the 5 s wait.
    limiter = warden.RateLimiter(r, "slow", 1, 60, wait=5)
    assert limiter.acquire()
    started = time.monotonic()
    d = limiter.acquire()
    assert time.monotonic() - started < 5
    assert not d.allowed and d.retry_after is not None and 55 < d.retry_after <= 60
    assert waiters(limiter) == 0


def test_the_waiters_ahead_count_toward_conforming_in_time(r: redis.Redis) -> None:
    # 2 every 4 s, burst 2, emptied: a waiter ahead takes the tokens of the
    # first 4 s, so one more token conforms at 6 s: past a 4.5 s wait asked
    # up to 1.5 s after the start (time a busy machine may take to queue it).
    limiter = warden.RateLimiter(r, "ahead", 2, 4)
    assert limiter.acquire(2)
    ahead = threading.Thread(target=limiter.acquire, args=(2, 30))
    ahead.start()
    wait_for(lambda: waiters(limiter) == 1)
    started = time.monotonic()
    d = limiter.acquire(1, wait=4.5)
    assert time.monotonic() - started < 4.5
    assert not d.allowed and d.retry_after is not None and d.retry_after > 4.5
    ahead.join(30)


def test_keyboard_interrupt_while_waiting_takes_nothing(r: redis.Redis) -> None:
    # A token a minute, burst 2, one left: a request for 2 waits a minute.
    limiter = warden.RateLimiter(r, "sigint", 1, 60, burst=2)
    assert limiter.acquire()
    main = threading.main_thread().ident
    assert threading.get_ident() == main
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)

    def interrupt() -> None:
        wait_for(lambda: waiters(limiter) == 1)
        signal.pthread_kill(main, signal.SIGINT)  # type: ignore[arg-type]

    t = threading.Thread(target=interrupt)
    t.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            limiter.acquire(2, wait=120)
        t.join(5)
    finally:
        signal.signal(signal.SIGINT, previous)
    wait_for(lambda: waiters(limiter) == 0)
    info = limiter.info()
    assert info is not None and info.remaining == 1  # the waiter took nothing
    assert limiter.try_acquire()  # and nobody waits ahead


def test_a_grant_read_after_the_deadline_is_given_back(own_server: Server) -> None:
    r = own_server.client()
    limiter = warden.RateLimiter(r, "late", 1, 60, wait=0.3)
    assert limiter.info() is None  # a connection in the pool, open before the pause
    own_server.pause()
    try:
        d = limiter.acquire()
    finally:
        own_server.resume()
    assert not d.allowed and d.retry_after is None  # unanswered in time
    # The server granted it once resumed; the client read it late, gave it back.
    wait_for(lambda: refunds(r) == 1)
    assert limiter.info() is None  # a full bucket again
    r.close()


def test_refund_gives_tokens_back(r: redis.Redis) -> None:
    limiter = warden.RateLimiter(r, "reserve", 5, 60)
    assert limiter.acquire(5).remaining == 0
    assert limiter.refund(2) is True
    info = limiter.info()
    assert info is not None and info.remaining == 2
    assert limiter.acquire(2).allowed
    assert warden.RateLimiter(r, "no-such-limiter", 5, 60).refund(1) is False


def test_set_rate_changes_the_rate_and_keeps_what_is_owed(r: redis.Redis) -> None:
    limiter = warden.RateLimiter(r, "config", 10, 1)
    assert limiter.acquire(10)
    assert limiter.set_rate(20, 1, burst=20) is True
    assert (limiter.count, limiter.period, limiter.burst) == (20, 1.0, 20)
    d = limiter.acquire(10)  # states the new rate
    assert d.allowed and d.burst == 20 and d.remaining == 0
    with pytest.raises(ResponseError, match="limiter rate is 20 per 1000 ms burst 20"):
        warden.RateLimiter(r, "config", 10, 1).acquire()
    assert warden.RateLimiter(r, "config-missing", 1, 1).set_rate(2, 1) is False


def test_set_rate_answers_the_waiters_of_the_old_rate_with_an_error(r: redis.Redis) -> None:
    limiter = warden.RateLimiter(r, "reconfigured", 1, 60, wait=120)
    assert limiter.acquire()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            limiter.acquire()
        except ResponseError as error:
            errors.append(error)

    t = threading.Thread(target=wait)
    t.start()
    wait_for(lambda: waiters(limiter) == 1)
    assert warden.RateLimiter(r, "reconfigured", 1, 60).set_rate(2, 60)
    t.join(10)
    assert [str(e) for e in errors] == ["the limiter's rate was changed while this request waited"]


def test_another_rate_is_refused_with_the_servers_message(r: redis.Redis) -> None:
    assert warden.RateLimiter(r, "api:calls", 10, 1, burst=2).acquire()
    with pytest.raises(ResponseError) as refused:
        warden.RateLimiter(r, "api:calls", 5, 1).acquire()
    assert str(refused.value) == (
        "limiter rate is 10 per 1000 ms burst 2, not 5 per 1000 ms burst 5"
    )
    info = warden.RateLimiter(r, "api:calls", 10, 1, burst=2).info()
    assert info is not None and info.remaining == 1  # nothing changed


def test_max_queue_sheds_instead_of_queueing(r: redis.Redis) -> None:
    limiter = warden.RateLimiter(r, "shed", 1, 60, burst=2)
    assert limiter.acquire()
    errors: list[BaseException] = []

    def wait_ahead() -> None:
        try:
            limiter.acquire(2, wait=120)
        except ResponseError as error:
            errors.append(error)

    ahead = threading.Thread(target=wait_ahead)
    ahead.start()
    wait_for(lambda: waiters(limiter) == 1)
    shedding = warden.RateLimiter(r, "shed", 1, 60, burst=2, wait=300, max_queue=1)
    started = time.monotonic()
    d = shedding.acquire()  # would conform in 2 min, within its wait: shed
    assert time.monotonic() - started < 5
    assert not d.allowed and d.retry_after is not None
    assert waiters(limiter) == 1
    assert shedding.set_rate(2, 60)  # ends the wait ahead
    ahead.join(10)
    assert len(errors) == 1


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda r: warden.RateLimiter(r, "k", 0, 1), "count must be an int"),
        (lambda r: warden.RateLimiter(r, "k", 1.5, 1), "count must be an int"),
        (lambda r: warden.RateLimiter(r, "k", True, 1), "count must be an int"),
        (lambda r: warden.RateLimiter(r, "k", 1, 0), "period must be a whole number"),
        (lambda r: warden.RateLimiter(r, "k", 1, 0.0005), "period must be a whole number"),
        (lambda r: warden.RateLimiter(r, "k", 1, 1.0001), "period must be a whole number"),
        (
            lambda r: warden.RateLimiter(r, "k", 1, timedelta(microseconds=1500)),
            "period must be a whole number",
        ),
        (lambda r: warden.RateLimiter(r, "k", 1, math.inf), "period must be a whole number"),
        (lambda r: warden.RateLimiter(r, "k", 1, "1"), "period must be a whole number"),
        (lambda r: warden.RateLimiter(r, "k", 1, 1, burst=0), "burst must be an int"),
        (lambda r: warden.RateLimiter(r, "k", 1, 1, wait=math.nan), "wait must be"),
        (lambda r: warden.RateLimiter(r, "k", 1, 1, wait="1"), "wait must be"),
        (lambda r: warden.RateLimiter(r, "k", 1, 1, max_queue=-1), "max_queue"),
        (lambda r: warden.RateLimiter(r, "k", 1, 1).acquire(0), "cost must be an int"),
        (lambda r: warden.RateLimiter(r, "k", 1, 1).try_acquire(-1), "cost must be an int"),
        (lambda r: warden.RateLimiter(r, "k", 1, 1).refund(0), "cost must be an int"),
        (lambda r: warden.RateLimiter(r, "k", 1, 1).set_rate(1, 0), "period must be"),
    ],
)
def test_invalid_arguments_are_refused_before_sending(
    r: redis.Redis, make: Callable[[redis.Redis], Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        make(r)
    assert not r.exists("k")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda r: warden.RateLimiter(r, "k", 1_000_001, 0.001).acquire(),
            "invalid count: expected an integer from 1 to 1000000 per ms of the period",
        ),
        (
            lambda r: warden.RateLimiter(r, "k", 1, 86_400.001).acquire(),
            "invalid period: expected an integer from 1 to 86400000 (ms)",
        ),
        (
            lambda r: warden.RateLimiter(r, "k", 1, 1, burst=10**9 + 1).acquire(),
            "invalid BURST: expected an integer from 1 to 1000000000",
        ),
        (
            lambda r: warden.RateLimiter(r, "k", 10, 1, burst=2).acquire(3),
            "invalid COST: expected an integer from 1 to the burst",
        ),
        (
            lambda r: warden.RateLimiter(r, "k", 10, 1).acquire(11, wait=1),
            "invalid COST: expected an integer from 1 to the burst",
        ),
    ],
)
def test_out_of_range_arguments_are_the_servers_errors(
    r: redis.Redis, make: Callable[[redis.Redis], Any], message: str
) -> None:
    with pytest.raises(ResponseError) as refused:
        make(r)
    assert str(refused.value) == message
    assert not r.exists("k")


def test_a_key_of_another_type_is_wrongtype(r: redis.Redis) -> None:
    r.set("plain", "data")
    with pytest.raises(ResponseError, match="^WRONGTYPE"):
        warden.RateLimiter(r, "plain", 1, 1).acquire()


@pytest.mark.parametrize("wait", [None, math.inf, 10**12, timedelta(days=365)])
def test_without_a_deadline_acquire_waits_until_the_tokens_conform(
    r: redis.Redis, wait: Any
) -> None:
    limiter = warden.RateLimiter(r, "forever", 10, 1, burst=1, wait=wait)
    assert limiter.acquire() and limiter.acquire()  # the second waited ~100 ms


@pytest.mark.parametrize("wait", [0, 0.0, -1, timedelta(0)])
def test_a_wait_of_zero_does_not_wait(r: redis.Redis, wait: Any) -> None:
    limiter = warden.RateLimiter(r, "no-wait", 1, 60, wait=wait)
    assert limiter.acquire()
    d = limiter.acquire()
    assert not d.allowed and d.retry_after is not None and 55 < d.retry_after <= 60


def test_limiters_on_a_cluster_reach_each_keys_master(cluster: Cluster) -> None:
    rc = RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    limiters = [warden.RateLimiter(rc, f"rate:{i}", 10, 1, burst=1, wait=5) for i in range(12)]
    for limiter in limiters:
        assert limiter.acquire() and limiter.acquire()  # the second waited in its queue
        assert limiter.refund(1)
    rc.close()


# --- asyncio -----------------------------------------------------------------


async def test_async_allowed_then_limited(ar: Any) -> None:
    limiter = warden.asyncio.RateLimiter(ar, "partner:api", 10, 60, burst=2)
    first = await limiter.acquire()
    assert first == RateDecision(True, 2, 1, None, 6.0)
    assert (await limiter.try_acquire()).allowed
    third = await limiter.acquire(wait=0)
    assert not third and third.retry_after is not None and 5.0 < third.retry_after <= 6.0
    info = await limiter.info()
    assert info is not None and (info.count, info.period, info.burst, info.remaining) == (
        10,
        60.0,
        2,
        0,
    )
    assert await warden.asyncio.RateLimiter(ar, "nobody", 1, 1).info() is None


async def test_async_waiters_are_granted_in_the_order_they_asked(ar: Any) -> None:
    limiter = warden.asyncio.RateLimiter(ar, "fifo", 2, 1, wait=30)
    assert await limiter.acquire(2)
    granted: list[str] = []

    async def ask(name: str, cost: int) -> None:
        if (await limiter.acquire(cost)).allowed:
            granted.append(name)

    first = asyncio.ensure_future(ask("two tokens", 2))
    await await_for(lambda: async_waiters(limiter), timeout=5)
    second = asyncio.ensure_future(ask("one token", 1))
    await asyncio.wait_for(asyncio.gather(first, second), 30)
    assert granted == ["two tokens", "one token"]


async def test_async_a_wait_that_cannot_conform_in_time_is_answered_at_once(ar: Any) -> None:
    limiter = warden.asyncio.RateLimiter(ar, "slow", 1, 60)
    assert await limiter.acquire()
    started = time.monotonic()
    d = await limiter.acquire(wait=timedelta(seconds=5))
    assert time.monotonic() - started < 5
    assert not d.allowed and d.retry_after is not None and 55 < d.retry_after <= 60


async def test_async_a_cancelled_wait_takes_nothing(ar: Any) -> None:
    limiter = warden.asyncio.RateLimiter(ar, "cancelled", 1, 60, burst=2, wait=120)
    assert await limiter.acquire()
    waiting = asyncio.ensure_future(limiter.acquire(2))
    await await_for(lambda: async_waiters(limiter))
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    info = await limiter.info()
    assert info is not None and (info.waiters, info.remaining) == (0, 1)
    assert await limiter.try_acquire()


async def test_async_a_cancel_crossing_a_grant_gives_it_back(own_server: Server) -> None:
    ar = own_server.async_client()
    limiter = warden.asyncio.RateLimiter(ar, "crossed", 1, 60)
    assert await limiter.info() is None  # a connection in the pool before the pause
    own_server.pause()
    try:
        trying = asyncio.ensure_future(limiter.try_acquire())
        await asyncio.sleep(0.1)  # sent, its reply held by the paused server
        trying.cancel()
        with pytest.raises(asyncio.CancelledError):
            await trying
    finally:
        own_server.resume()
    admin = own_server.client()

    async def given_back() -> bool:
        return refunds(admin) == 1

    await await_for(given_back)  # read in the background, given back
    assert await limiter.info() is None
    admin.close()
    await ar.aclose()


async def test_async_refund_set_rate_and_errors(ar: Any) -> None:
    limiter = warden.asyncio.RateLimiter(ar, "config", 10, 1)
    assert (await limiter.acquire(10)).remaining == 0
    assert await limiter.refund(4) is True
    assert await limiter.set_rate(20, 1, burst=20) is True
    assert (await limiter.acquire(10)).allowed
    with pytest.raises(ResponseError) as refused:
        await warden.asyncio.RateLimiter(ar, "config", 10, 1).acquire()
    assert str(refused.value) == (
        "limiter rate is 20 per 1000 ms burst 20, not 10 per 1000 ms burst 10"
    )
    assert await warden.asyncio.RateLimiter(ar, "missing", 1, 1).refund(1) is False
    assert await warden.asyncio.RateLimiter(ar, "missing", 1, 1).set_rate(2, 1) is False
    with pytest.raises(ValueError, match="cost must be an int"):
        await limiter.acquire(0)


async def test_async_max_queue_sheds_instead_of_queueing(ar: Any) -> None:
    limiter = warden.asyncio.RateLimiter(ar, "shed", 1, 60, burst=2, wait=120)
    assert await limiter.acquire()
    ahead = asyncio.ensure_future(limiter.acquire(2))
    await await_for(lambda: async_waiters(limiter))
    shedding = warden.asyncio.RateLimiter(ar, "shed", 1, 60, burst=2, wait=300, max_queue=1)
    d = await shedding.acquire()
    assert not d.allowed and d.retry_after is not None
    assert await async_waiters(limiter) == 1
    ahead.cancel()
    with pytest.raises(asyncio.CancelledError):
        await ahead
    assert await async_waiters(limiter) == 0


def test_names_match_between_sync_and_asyncio() -> None:
    for name in ("acquire", "try_acquire", "refund", "set_rate", "info", "period"):
        assert hasattr(warden.RateLimiter, name) and hasattr(warden.asyncio.RateLimiter, name)
    assert warden.asyncio.RateDecision is warden.RateDecision
