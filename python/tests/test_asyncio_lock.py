"""warden.asyncio.Lock against a real server."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from redis.exceptions import LockNotOwnedError
from servers import Server

import warden.asyncio


async def info(r: Any, name: str) -> dict[str, Any]:
    reply = await r.execute_command("LOCK.INFO", name)
    if reply is None:
        return {}
    items = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2])
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in items}


async def wait_for(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def test_drop_in_through_lock_class(ar: Any) -> None:
    lock = ar.lock("order:42", timeout=5, lock_class=warden.asyncio.Lock)
    async with lock:
        assert lock.fence > 0
        assert (await info(ar, "order:42"))["owner"] == lock.local.token
        assert await lock.owned()
    assert not await lock.locked()


async def test_fifty_tasks_strictly_increasing_fences_never_two_inside(ar: Any) -> None:
    inside = 0
    overlaps = 0
    fences: list[int] = []

    async def worker() -> None:
        nonlocal inside, overlaps
        lock = warden.asyncio.Lock(ar, "contended", timeout=10, thread_local=False)
        for _ in range(6):
            async with lock:
                inside += 1
                overlaps += inside != 1
                fences.append(lock.fence)  # type: ignore[arg-type]
                await asyncio.sleep(0.0005)
                inside -= 1

    await asyncio.gather(*(worker() for _ in range(50)))
    assert overlaps == 0 and len(fences) == 300
    assert all(a < b for a, b in zip(fences, fences[1:]))


async def test_a_cancelled_wait_leaves_the_server_queue(ar: Any) -> None:
    holder = warden.asyncio.Lock(ar, "queue", timeout=10)
    assert await holder.acquire()
    waiter = asyncio.ensure_future(warden.asyncio.Lock(ar, "queue", timeout=10).acquire())

    async def queued(n: int) -> bool:
        return bool((await info(ar, "queue"))["waiters"] == n)

    await wait_for(lambda: queued(1))
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await wait_for(lambda: queued(0))
    await holder.release()
    assert await ar.exists("queue") == 0  # nobody was granted it


async def test_wait_for_timeout_closes_the_waiting_connection(ar: Any) -> None:
    holder = warden.asyncio.Lock(ar, "wf", timeout=10)
    assert await holder.acquire()
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(warden.asyncio.Lock(ar, "wf", timeout=10).acquire(), 0.2)

    async def empty() -> bool:
        return bool((await info(ar, "wf"))["waiters"] == 0)

    await wait_for(empty)
    await holder.release()


async def test_reentrant_owner_is_per_task(ar: Any) -> None:
    lock = warden.asyncio.Lock(ar, "re", timeout=10, reentrant=True, thread_local=False)
    assert await lock.acquire() and await lock.acquire()
    assert (await info(ar, "re"))["holds"] == 2
    other = warden.asyncio.Lock(ar, "re", timeout=10, reentrant=True, thread_local=False)
    assert not await asyncio.ensure_future(other.acquire(blocking=False))
    await lock.release()
    await lock.release()
    assert not await lock.locked()


async def test_watchdog_keeps_a_short_lease_alive_and_sets_lost(own_server: Server) -> None:
    r = own_server.async_client()
    # A 1 s lease renewed every third of it, over more than two leases (a
    # shorter one is lost whenever a busy machine stalls the event loop).
    lock = warden.asyncio.Lock(r, "dog", watchdog_timeout=1.0)
    assert await lock.acquire()
    await asyncio.sleep(2.5)
    assert await lock.owned() and not lock.lost.is_set()
    own_server.pause()
    try:
        await asyncio.wait_for(lock.lost.wait(), 3)
    finally:
        own_server.resume()
    with pytest.raises(LockNotOwnedError):
        await lock.release()
    await r.aclose()


async def test_extend_and_reacquire(ar: Any) -> None:
    lock = warden.asyncio.Lock(ar, "ext", timeout=10)
    assert await lock.acquire()
    assert await lock.extend(10)
    assert 19000 < await ar.pttl("ext") <= 20000
    assert await lock.reacquire()
    assert 9000 < await ar.pttl("ext") <= 10000
    await lock.release()


async def test_read_write_lock(ar: Any) -> None:
    rw = warden.asyncio.ReadWriteLock(ar, "doc", timeout=10)
    a, b = rw.read_lock(), rw.read_lock()
    assert await a.acquire() and await b.acquire()
    writer = rw.write_lock()
    assert not await writer.acquire(blocking=False)
    pending = asyncio.ensure_future(writer.acquire(blocking_timeout=5))
    await a.release()
    await b.release()
    assert await pending and await writer.owned()
    await writer.release()


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
    holder = warden.asyncio.Lock(r, "bounded", timeout=30)
    assert await holder.acquire()
    got: list[int] = []

    async def wait() -> None:
        lock = warden.asyncio.Lock(r, "bounded", timeout=30, blocking_timeout=20)
        if await lock.acquire():
            got.append(lock.fence)  # type: ignore[arg-type]
            await lock.release()

    waiters = [asyncio.ensure_future(wait()) for _ in range(4)]
    watcher = server.client()

    async def queued() -> bool:
        return bool(watcher.execute_command("LOCK.INFO", "bounded")[b"waiters"] == 4)

    await wait_for(queued)
    await holder.release()  # before: ConnectionError("No connection available.")
    await asyncio.wait_for(asyncio.gather(*waiters), 10)
    assert len(got) == 4 and sorted(got) == got
    assert not watcher.exists("bounded")
    watcher.close()
    await r.aclose()


async def test_lost_belongs_to_the_hold_of_its_task(ar: Any) -> None:
    lock = warden.asyncio.Lock(ar, "shared", watchdog_timeout=1.0)  # thread_local=True
    first_lost = asyncio.Event()
    second_holds = asyncio.Event()

    async def first() -> bool:
        assert await lock.acquire()
        await ar.delete("shared")  # taken away: this task's watchdog reports it
        await asyncio.wait_for(lock.lost.wait(), 5)
        first_lost.set()
        await second_holds.wait()
        return lock.lost.is_set()  # still this task's loss

    async def second() -> bool:
        await first_lost.wait()
        assert await lock.acquire()
        second_holds.set()
        return lock.lost.is_set()  # a new hold, not lost

    seen = await asyncio.wait_for(asyncio.gather(first(), second()), 10)
    assert seen == [True, False]
    await lock.release()


async def test_a_cancel_crossing_a_reentrant_grant_gives_it_back(ar: Any, server: Server) -> None:
    from warden import _core

    sync = server.client()
    assert sync.execute_command("LOCK.ACQUIRE", "crossed", "holder", 30_000)
    lock = warden.asyncio.Lock(ar, "crossed", reentrant=True)  # timeout=None: a watchdog
    task = asyncio.ensure_future(lock.acquire())

    async def queued() -> bool:
        return bool((await info(ar, "crossed"))["waiters"] == 1)

    await wait_for(queued)
    # The loop is blocked here: the task cannot read its grant before the cancel.
    assert sync.execute_command("LOCK.RELEASE", "crossed", "holder") == 1
    owner = _core.reentrant_owner(id(task))
    assert sync.execute_command("LOCK.INFO", "crossed")[b"owner"] == owner
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    async def free() -> bool:
        return not await ar.exists("crossed")

    await wait_for(free)
    sync.close()
