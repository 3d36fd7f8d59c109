"""warden's client on a local Redis Cluster: every request reaches the key's master."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import redis
import redis.asyncio.cluster
from redis.cluster import RedisCluster
from redis.exceptions import MovedError, ResponseError
from servers import Cluster

import warden
import warden.asyncio

NAMES = [f"lock:{i}" for i in range(12)]  # spread over the three masters


def holder_of(cluster: Cluster, name: str) -> Any:
    """The port of the master that holds lock ``name`` (None: nobody holds it)."""
    for s in cluster.servers:
        try:
            reply = s.client().execute_command("LOCK.INFO", name)
        except ResponseError as error:  # MovedError on redis-py >= 5.1
            if "MOVED" not in str(error) and not isinstance(error, MovedError):
                raise
            continue  # another master's slot
        return s.port if reply is not None else None
    raise AssertionError(f"no master serves {name}")


def test_locks_and_cache_are_routed_to_the_keys_master(cluster: Cluster) -> None:
    rc = RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    locks = [warden.Lock(rc, name, timeout=10) for name in NAMES]
    for lock in locks:
        assert lock.acquire() and lock.owned()
    assert {holder_of(cluster, name) for name in NAMES} == set(cluster.ports)

    blocked = warden.Lock(rc, NAMES[0], timeout=10, thread_local=False)
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(blocked.acquire(blocking_timeout=5)))
    t.start()
    locks[0].release()
    t.join(5)
    assert got == [True]
    blocked.release()
    for lock in locks[1:]:
        lock.release()

    cache = warden.Cache(rc)
    loads = 0

    @cache.cached(key="item:{n}", ttl=60)
    def item(n: int) -> str:
        nonlocal loads
        loads += 1
        return str(n)

    assert [item(n) for n in range(12)] == [str(n).encode() for n in range(12)]
    assert [item(n) for n in range(12)] == [str(n).encode() for n in range(12)]
    assert loads == 12
    rw = warden.ReadWriteLock(rc, "{doc}:rw", timeout=10)
    with rw.read_lock(), rw.read_lock():
        assert not rw.write_lock().acquire(blocking=False)
    rc.close()


async def test_asyncio_cluster(cluster: Cluster) -> None:
    rc = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    await rc.initialize()
    fences: list[int] = []

    async def worker(name: str) -> None:
        lock = warden.asyncio.Lock(rc, name, timeout=10, thread_local=False)
        for _ in range(3):
            async with lock:
                fences.append(lock.fence)  # type: ignore[arg-type]

    await asyncio.gather(*(worker(name) for name in NAMES for _ in range(3)))
    assert len(fences) == len(NAMES) * 9
    assert {holder_of(cluster, n) for n in NAMES} == {None}
    cache = warden.asyncio.Cache(rc)
    assert await cache.get_or_load("x", lambda: asyncio.sleep(0, b"1")) == b"1"
    await rc.aclose()
