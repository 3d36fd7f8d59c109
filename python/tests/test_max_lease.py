"""Leases and the server's cap (``warden.max-lease``): a lease asked for above
it is capped and renewed until it ends; the watchdog's lease is the cap when
that is lower. Against a server started with ``--warden.max-lease 1000``;
the timings leave wide margins (held at 2 s, gone by 5 s)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
import redis
from redis.exceptions import LockNotOwnedError
from servers import Server
from test_overload import async_wait_for, lock_waiters, wait_for

import warden
import warden.asyncio

CAP_MS = 1000


@pytest.fixture(scope="module")
def capped() -> Iterator[Server]:
    s = Server(extra=("--warden.max-lease", str(CAP_MS)))
    yield s
    s.stop()


@pytest.fixture
def cr(capped: Server) -> Iterator[redis.Redis]:
    client = capped.client()
    client.flushall()
    client.config_set("warden.max-lease", str(CAP_MS))
    yield client
    client.close()


@pytest_asyncio.fixture
async def acr(capped: Server) -> AsyncIterator[Any]:
    client = capped.async_client()
    await client.flushall()
    await client.config_set("warden.max-lease", str(CAP_MS))
    yield client
    await client.aclose()


def extends(r: redis.Redis) -> int:
    stats = r.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k.endswith(".extend"))


def test_a_lease_over_the_cap_is_held_until_it_ends(cr: redis.Redis) -> None:
    lock = warden.Lock(cr, "job", timeout=3)
    write = warden.ReadWriteLock(cr, "rw", timeout=3).write_lock()
    permit = warden.Semaphore(cr, "sem", limit=1, timeout=3)
    assert lock.acquire(blocking=False)
    assert write.acquire(blocking=False)
    assert permit.acquire(blocking=False)
    assert 0 < cr.pttl("job") <= CAP_MS  # the server holds at most the cap
    time.sleep(2)
    assert lock.owned() and write.owned() and permit.owned()
    assert not lock.lost.is_set()
    time.sleep(3)  # 5 s: the 3 s lease asked for has ended
    assert not lock.owned() and not write.owned() and not permit.owned()
    assert not cr.exists("job") and not cr.exists("rw")


def test_the_watchdog_renews_at_the_cap(cr: redis.Redis) -> None:
    lock = warden.Lock(cr, "job")  # no lease: the watchdog's 30 s, capped to 1 s
    assert lock.acquire(blocking=False)
    assert 0 < cr.pttl("job") <= CAP_MS
    time.sleep(2.5)
    assert lock.owned() and not lock.lost.is_set()
    lock.release()
    assert not cr.exists("job")


def test_a_cap_lowered_at_run_time_is_followed(cr: redis.Redis) -> None:
    lock = warden.Lock(cr, "job")
    assert lock.acquire(blocking=False)
    cr.config_set("warden.max-lease", "600")
    time.sleep(2.5)
    assert lock.owned() and not lock.lost.is_set()
    assert 0 < cr.pttl("job") <= 600
    lock.release()


def test_release_stops_renewal(cr: redis.Redis) -> None:
    lock = warden.Lock(cr, "job", timeout=30)
    assert lock.acquire(blocking=False)
    time.sleep(0.6)
    lock.release()
    before = extends(cr)
    time.sleep(1.5)
    assert extends(cr) == before
    assert not cr.exists("job")


def test_extend_over_the_cap(cr: redis.Redis) -> None:
    lock = warden.Lock(cr, "job", timeout=0.5)
    assert lock.acquire(blocking=False)
    assert lock.extend(3, replace_ttl=True)
    time.sleep(2)
    assert lock.owned()
    time.sleep(3)
    assert not lock.owned()


def test_a_deleted_key_stops_renewal_and_shows_the_loss(cr: redis.Redis) -> None:
    lock = warden.Lock(cr, "job", timeout=60)
    assert lock.acquire(blocking=False)
    cr.delete("job")
    assert lock.lost.wait(3)
    before = extends(cr)
    time.sleep(1)
    assert extends(cr) == before
    with pytest.raises(LockNotOwnedError):
        lock.release()


async def test_async_a_lease_over_the_cap_is_held_until_it_ends(acr: Any) -> None:
    lock = warden.asyncio.Lock(acr, "job", timeout=3)
    permit = warden.asyncio.Semaphore(acr, "sem", limit=1, timeout=3)
    assert await lock.acquire(blocking=False)
    assert await permit.acquire(blocking=False)
    assert 0 < await acr.pttl("job") <= CAP_MS
    await asyncio.sleep(2)
    assert await lock.owned() and await permit.owned()
    await asyncio.sleep(3)
    assert not await lock.owned() and not await permit.owned()


async def test_async_the_watchdog_renews_at_the_cap(acr: Any) -> None:
    lock = warden.asyncio.Lock(acr, "job")
    assert await lock.acquire(blocking=False)
    assert 0 < await acr.pttl("job") <= CAP_MS
    await asyncio.sleep(2.5)
    assert await lock.owned() and not lock.lost.is_set()
    await lock.release()
    before = sum(
        int(v["calls"]) for k, v in (await acr.info("commandstats")).items() if "extend" in k
    )
    await asyncio.sleep(1.5)
    after = sum(
        int(v["calls"]) for k, v in (await acr.info("commandstats")).items() if "extend" in k
    )
    assert after == before and not await acr.exists("job")


async def test_async_a_deleted_key_stops_renewal_and_shows_the_loss(acr: Any) -> None:
    lock = warden.asyncio.Lock(acr, "job", timeout=60)
    assert await lock.acquire(blocking=False)
    await acr.delete("job")
    await asyncio.wait_for(lock.lost.wait(), 3)
    with pytest.raises(LockNotOwnedError):
        await lock.release()


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_a_wait_behind_one_of_its_own_learns_the_cap(
    capped: Server, cr: redis.Redis, flavour: str
) -> None:
    # A second acquire while a request of the same client waits skips the
    # try and waits at once: the cap refusal comes to the wait, which learns
    # it and asks again (never a ResponseError to the caller).
    cr.execute_command("LOCK.ACQUIRE", "job", "holder", CAP_MS)
    got: list[Any] = []
    if flavour == "sync":
        c = capped.client()
        waiting = warden.Lock(c, "job", timeout=0.5)
        first = threading.Thread(target=lambda: got.append(waiting.acquire(blocking_timeout=10)))
        first.start()
        wait_for(lambda: lock_waiters(cr, "job") == 1)
        second = warden.Lock(c, "job", timeout=3)
        assert second.acquire(blocking_timeout=10)
        first.join(10)
        assert 0 < cr.pttl("job") <= CAP_MS
        second.release()
        c.close()
    else:

        async def main() -> None:
            c = capped.async_client()
            first = asyncio.ensure_future(
                warden.asyncio.Lock(c, "job", timeout=0.5).acquire(blocking_timeout=10)
            )
            await async_wait_for(lambda: lock_waiters(cr, "job") == 1)
            second = warden.asyncio.Lock(c, "job", timeout=3)
            assert await second.acquire(blocking_timeout=10)
            got.append(await first)
            assert 0 < cr.pttl("job") <= CAP_MS
            await second.release()
            await c.aclose()

        asyncio.run(main())
    assert got == [True]
