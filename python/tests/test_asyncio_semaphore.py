"""warden.asyncio.Semaphore against a real server."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from redis.exceptions import LockError, LockNotOwnedError, ResponseError
from servers import Server

import warden.asyncio


async def info(r: Any, name: str) -> dict[str, Any]:
    reply = await r.execute_command("SEM.INFO", name)
    if reply is None:
        return {}
    items = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2])
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in items}


async def used(r: Any, name: str) -> int:
    return int((await info(r, name)).get("used", 0))


async def waiters(r: Any, name: str) -> int:
    return int((await info(r, name)).get("waiters", 0))


async def wait_for(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def test_one_object_shared_by_many_tasks_never_exceeds_the_limit(ar: Any) -> None:
    sem = warden.asyncio.Semaphore(ar, "pool", 3, timeout=10)  # a hold per task
    inside = 0
    most = 0
    fences: set[int] = set()

    async def worker() -> None:
        nonlocal inside, most
        for _ in range(5):
            async with sem:
                inside += 1
                most = max(most, inside)
                fences.add(sem.fence)  # type: ignore[arg-type]
                await asyncio.sleep(0.001)
                inside -= 1

    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(12))), 30)
    assert 0 < most <= 3 and len(fences) == 60
    assert not await ar.exists("pool")


async def test_mixed_permits_never_exceed_the_limit(ar: Any) -> None:
    inside = 0
    most = 0

    async def worker(permits: int) -> None:
        nonlocal inside, most
        sem = warden.asyncio.Semaphore(ar, "weights", 4, permits=permits, timeout=10)
        for _ in range(5):
            async with sem:
                inside += permits
                most = max(most, inside)
                await asyncio.sleep(0.001)
                inside -= permits

    await asyncio.wait_for(asyncio.gather(*(worker(1 + i % 4) for i in range(10))), 30)
    assert 0 < most <= 4


async def test_a_large_request_is_not_overtaken_by_later_small_ones(ar: Any) -> None:
    holder = warden.asyncio.Semaphore(ar, "fifo", 3, timeout=10)
    assert await holder.acquire()
    granted: list[str] = []
    go: dict[str, asyncio.Event] = {}

    async def take(label: str, permits: int) -> None:
        sem = warden.asyncio.Semaphore(ar, "fifo", 3, timeout=10)
        go[label] = asyncio.Event()
        assert await sem.acquire(permits, blocking_timeout=20)
        granted.append(label)
        await go[label].wait()
        await sem.release()

    tasks = [asyncio.ensure_future(take("big", 3))]
    await wait_for(lambda: _is(waiters(ar, "fifo"), 1))
    for i in range(2):
        tasks.append(asyncio.ensure_future(take(f"small{i}", 1)))
        await wait_for(lambda i=i: _is(waiters(ar, "fifo"), 2 + i))  # type: ignore[misc]
    assert granted == [] and await used(ar, "fifo") == 1
    await holder.release()
    await wait_for(lambda: _true(granted == ["big"]))
    assert await used(ar, "fifo") == 3 and await waiters(ar, "fifo") == 2
    go["big"].set()
    await wait_for(lambda: _true(len(granted) == 3))
    assert sorted(granted[1:]) == ["small0", "small1"]
    go["small0"].set()
    go["small1"].set()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert not await ar.exists("fifo")


async def _is(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


async def _true(value: bool) -> bool:
    return value


async def test_async_with_releases_when_the_block_raises(ar: Any) -> None:
    sem = warden.asyncio.Semaphore(ar, "raises", 2, timeout=10)
    with pytest.raises(ValueError):
        async with sem:
            assert await used(ar, "raises") == 1
            raise ValueError("work failed")
    assert not await ar.exists("raises") and sem.fence is None
    full = warden.asyncio.Semaphore(ar, "raises", 1, permits=1, timeout=10)
    assert await full.acquire()
    with pytest.raises(LockError):
        async with warden.asyncio.Semaphore(ar, "raises", 1, blocking_timeout=0.1):
            pass
    await full.release()


async def test_watchdog_keeps_a_hold_alive_past_its_lease(ar: Any) -> None:
    # 1 s leases: a shorter one is lost whenever a busy machine stalls the loop.
    sem = warden.asyncio.Semaphore(ar, "long", 2, watchdog_timeout=1.0)
    assert await sem.acquire()
    await asyncio.sleep(2.5)  # more than two leases
    assert await sem.owned() and not sem.lost.is_set()
    await sem.release()
    assert not await ar.exists("long")


async def test_lost_is_set_when_the_key_is_deleted_and_stays_with_its_task(ar: Any) -> None:
    sem = warden.asyncio.Semaphore(ar, "deleted", 2, watchdog_timeout=1.0)
    first_lost = asyncio.Event()
    second_holds = asyncio.Event()

    async def first() -> bool:
        assert await sem.acquire()
        await ar.delete("deleted")  # the hold is gone: its watchdog reports it
        await asyncio.wait_for(sem.lost.wait(), 5)
        first_lost.set()
        await second_holds.wait()
        lost = sem.lost.is_set()  # still this task's loss
        with pytest.raises(LockNotOwnedError):
            await sem.release()
        return lost

    async def second() -> bool:
        await first_lost.wait()
        assert await sem.acquire()
        second_holds.set()
        lost = sem.lost.is_set()  # a new hold, not lost
        await sem.release()
        return lost

    seen = await asyncio.wait_for(asyncio.gather(first(), second()), 10)
    assert seen == [True, False]
    assert not await ar.exists("deleted")


async def test_a_second_acquire_in_one_task_is_refused(ar: Any) -> None:
    sem = warden.asyncio.Semaphore(ar, "twice", 3, timeout=10)
    assert await sem.acquire()
    with pytest.raises(LockError):
        await sem.acquire()

    async def child() -> bool:  # sees its parent's hold, takes one of its own
        held = await sem.acquire()
        await sem.release()
        return held

    assert await asyncio.ensure_future(child())
    assert await used(ar, "twice") == 1
    await sem.release()


async def test_a_cancelled_wait_leaves_the_queue(ar: Any) -> None:
    holder = warden.asyncio.Semaphore(ar, "queue", 2, permits=2, timeout=10)
    assert await holder.acquire()
    waiter = asyncio.ensure_future(warden.asyncio.Semaphore(ar, "queue", 2).acquire())
    await wait_for(lambda: _is(waiters(ar, "queue"), 1))
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await wait_for(lambda: _is(waiters(ar, "queue"), 0))
    await holder.release()
    assert await used(ar, "queue") == 0  # nobody was granted the released permits


async def test_a_cancel_crossing_a_grant_gives_the_permits_back(ar: Any, server: Server) -> None:
    sync = server.client()
    assert sync.execute_command(
        "SEM.ACQUIRE", "crossed", "holder", 30_000, "LIMIT", 3, "PERMITS", 3
    )
    sem = warden.asyncio.Semaphore(ar, "crossed", 3, permits=2)  # timeout=None: a watchdog
    task = asyncio.ensure_future(sem.acquire())
    await wait_for(lambda: _is(waiters(ar, "crossed"), 1))
    # The loop is blocked here: the task cannot read its grant before the cancel.
    assert sync.execute_command("SEM.RELEASE", "crossed", "holder") == 1
    assert sync.execute_command("SEM.INFO", "crossed")[b"used"] == 2
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_for(lambda: _is(used(ar, "crossed"), 0))
    sync.close()


async def test_a_bounded_pool_full_of_waiters_still_releases(server: Server) -> None:
    import redis.asyncio

    pool = redis.asyncio.BlockingConnectionPool(
        connection_class=redis.asyncio.UnixDomainSocketConnection,
        path=server.socket,
        max_connections=4,
        timeout=2,
    )
    r = redis.asyncio.Redis(connection_pool=pool)
    await r.flushall()
    holder = warden.asyncio.Semaphore(r, "bounded", 2, permits=2, timeout=30)
    assert await holder.acquire()
    got: list[int] = []

    async def wait() -> None:
        sem = warden.asyncio.Semaphore(r, "bounded", 2, permits=2, timeout=30)
        if await sem.acquire(blocking_timeout=20):
            got.append(sem.fence)  # type: ignore[arg-type]
            await sem.release()

    waiting = [asyncio.ensure_future(wait()) for _ in range(4)]
    watcher = server.client()

    async def queued() -> bool:
        return bool(watcher.execute_command("SEM.INFO", "bounded")[b"waiters"] == 4)

    await wait_for(queued)
    await holder.release()  # on the client's own pool, beside the 4 waits
    await asyncio.wait_for(asyncio.gather(*waiting), 10)
    assert len(got) == 4 and sorted(got) == got
    assert not watcher.exists("bounded")
    watcher.close()
    await r.aclose()


async def test_server_errors_and_set_limit(ar: Any) -> None:
    sem = warden.asyncio.Semaphore(ar, "bound", 1, timeout=10)
    assert await sem.acquire()
    with pytest.raises(ResponseError, match="semaphore limit is 1, not 2"):
        await warden.asyncio.Semaphore(ar, "bound", 2).acquire()
    with pytest.raises(ResponseError, match="invalid permits"):
        await warden.asyncio.Semaphore(ar, "bound", 1).acquire(2)
    assert await sem.set_limit(2) and sem.limit == 2
    other = warden.asyncio.Semaphore(ar, "bound", 2, timeout=10)
    assert await other.acquire(blocking=False)
    held = await other.info()
    assert held is not None and (held["limit"], held["used"], held["permits"]) == (2, 2, 1)
    assert await other.extend(10)
    assert 19000 < (await other.info())["ttl"] <= 20000  # type: ignore[index]
    await other.release()
    await sem.release()
    assert await sem.info() is None
