"""``warden.asyncio.NearCache``: ``warden.NearCache`` for ``redis.asyncio``
clients. The tracking connection is read by a task on the event loop (started
by the first read that misses, or ``sync()``); ``aclose()`` ends it. Through
Sentinel a second task checks every ``MASTER_CHECK_SECONDS``, and ``sync()``
every time, that it reaches the master Sentinel names."""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any, Optional

from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, ResponseError

from .._near import NearCacheConfig, NearCacheStats, NearStore, Ticket, invalidated_keys
from ..near_cache import (
    MASTER_CHECK_SECONDS,
    RECONNECT_PAUSES,
    REPLY_SECONDS,
    master_seen,
    moved,
    sentinel_master,
    socket_of,
    tracking_kwargs,
    unread,
)

logger = logging.getLogger(__name__)

_PUSH = object()


async def _gone(*args: Any, **kwargs: Any) -> None:
    raise ConnectionError("the tracking connection was closed")


class _Request:
    """As in ``warden.near_cache``, settled through a future."""

    __slots__ = ("done", "key", "ticket")

    def __init__(self, key: Optional[str] = None, ticket: Optional[Ticket] = None) -> None:
        self.done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.key = key
        self.ticket = ticket

    def settle(self, reply: Any, failed: bool = False) -> None:
        if not self.done.done():
            self.done.set_result((reply, failed))


class NearCache:
    """As ``warden.NearCache``; ``peek``, ``sync`` and ``aclose`` are coroutines."""

    def __init__(self, redis: Any, config: NearCacheConfig) -> None:
        if isinstance(redis, RedisCluster):
            raise TypeError("the near cache needs a single server (or Sentinel), not a cluster")
        pool = redis.connection_pool
        self._connection_class = pool.connection_class
        self._kwargs = tracking_kwargs(pool)
        self._kwargs["retry"] = Retry(NoBackoff(), 0)  # asyncio's own kind
        self.reply_seconds: float = pool.connection_kwargs.get("socket_timeout") or REPLY_SECONDS
        self.store = NearStore(config)
        self._send_lock: Optional[asyncio.Lock] = None
        self._connection: Any = None
        self._fd: Optional[int] = None  # the connection's socket, for unread()
        self._pending: collections.deque[_Request] = collections.deque()
        self.client_id: Optional[int] = None
        self._closed = False
        self._reader: Optional[asyncio.Task[None]] = None
        self._master = sentinel_master(pool)  # a coroutine function here
        self._pool = pool
        self._known_master: Any = None
        self._master_lock: Optional[asyncio.Lock] = None
        self._watcher: Optional[asyncio.Task[None]] = None
        self._first_attempt: Optional[asyncio.Event] = None

    @property
    def connected(self) -> bool:
        return self._connection is not None

    def get(self, key: str, margin_ms: int = 0) -> Optional[bytes]:
        """As ``warden.NearCache.get``: no hit while the tracking connection
        has bytes its reader task has not taken (a coroutine that never awaits
        keeps the loop from reading them)."""
        if unread(self._fd) or self._buffered():
            return None
        return self.store.get(key, margin_ms)

    def _buffered(self) -> bool:
        """Whether the loop read bytes the reader task has not parsed yet."""
        stream = getattr(self._connection, "_reader", None)
        return bool(getattr(stream, "_buffer", None))

    async def start(self) -> None:
        """Start the reader (once) and wait for its first connection attempt."""
        if self._reader is None and not self._closed:
            self._send_lock = asyncio.Lock()
            self._master_lock = asyncio.Lock()
            self._first_attempt = asyncio.Event()
            self._reader = asyncio.get_running_loop().create_task(self._run())
            if self._master is not None:
                self._watcher = asyncio.get_running_loop().create_task(self._watch())
        if self._first_attempt is not None:
            await self._first_attempt.wait()

    async def peek(self, key: str) -> Optional[tuple[bytes, int]]:
        """As ``warden.NearCache.peek``."""
        await self.start()
        # The reader keeps the reply (or not) in stream order, then settles it.
        fresh: Optional[tuple[bytes, int]] = await self._send(
            _Request(key, self.store.begin(key)), "CACHE.PEEK", key
        )
        return fresh

    async def sync(self) -> None:
        """As ``warden.NearCache.sync``."""
        await self.start()
        await self.check_master()
        await self._send(_Request(), "PING")

    async def check_master(self) -> None:
        """As ``warden.NearCache.check_master`` (redis-py's asyncio pool
        awaits its close of idle connections after noting the new master: the
        same window). The change is noted once the close is done: a check
        cancelled during it leaves the next one to close again."""
        connection = self._connection
        if self._master is None or self._master_lock is None or connection is None:
            return
        try:
            master = await self._master()
        except Exception as error:
            logger.debug("near cache: no master from Sentinel (%s)", error)
            return
        async with self._master_lock:
            if master_seen(self._known_master, master):
                await self._pool.disconnect(inuse_connections=False)
                self._known_master = tuple(master)
        if moved(connection, master) and self._connection is connection:
            logger.info("near cache: the master moved to %s:%s", *master)
            await self._lost(connection)
            self.store.flush()

    async def _watch(self) -> None:
        while not self._closed:
            await asyncio.sleep(MASTER_CHECK_SECONDS)
            await self.check_master()

    def invalidated(self, key: str) -> None:
        self.store.drop([key])

    def stats(self) -> NearCacheStats:
        return self.store.stats()

    async def aclose(self) -> None:
        """Close the tracking connection and end its reader task."""
        self._closed = True
        tasks = (self._watcher, self._reader)
        self._reader = self._watcher = None
        for task in tasks:
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        self.store.flush()

    async def _send(self, request: _Request, *args: Any) -> Any:
        """Send one command and wait for its reply; None when the connection
        is down, failed, or the reply did not come in time."""
        assert self._send_lock is not None
        async with self._send_lock:
            connection = self._connection
            if connection is not None:
                self._pending.append(request)
                try:
                    await connection.send_command(*args, check_health=False)
                except Exception:
                    # Left in the queue: the reader fails it with the connection.
                    self.store.flush()  # before sync() returns
                    await self._lost(connection)
                    return None
        if connection is None:
            if request.key is not None:
                self.store.abandon(request.key)
            return None
        try:
            reply, failed = await asyncio.wait_for(asyncio.shield(request.done), self.reply_seconds)
        except asyncio.TimeoutError:
            self.store.flush()
            await self._lost(connection)
            return None
        return None if failed else reply

    async def _lost(self, connection: Any) -> None:
        """Close ``connection``: the reader sees it, flushes and connects again.
        As in ``warden.NearCache._lost``, no hit until then (-1: its
        descriptor number may be reused at once)."""
        reader = self._reader
        if reader is not None and self._connection is connection:
            self._fd = -1
            try:
                await connection.disconnect(nowait=True)
            except Exception:
                logger.debug("closing the tracking connection failed", exc_info=True)

    async def _on_push(self, push: Any) -> Any:
        keys = invalidated_keys(push)
        if keys is None:
            self.store.flush()
        else:
            self.store.drop(keys)
        return _PUSH

    async def _open(self) -> Any:
        connection = self._connection_class(**self._kwargs)
        try:
            await connection.connect()
            connection._parser.set_invalidation_push_handler(self._on_push)
            await connection.send_command("CLIENT", "TRACKING", "ON", check_health=False)
            await connection.read_response()
            await connection.send_command("CLIENT", "ID", check_health=False)
            self.client_id = int(await connection.read_response())
        except BaseException:
            await connection.disconnect(nowait=True)
            raise
        # As in warden.near_cache: never connected again behind the reader's back.
        connection.connect = connection.connect_check_health = _gone
        return connection

    async def _run(self) -> None:
        assert self._send_lock is not None and self._first_attempt is not None
        failures = 0
        try:
            while not self._closed:
                try:
                    connection = await self._open()
                except Exception as error:
                    self._first_attempt.set()
                    pause = RECONNECT_PAUSES[min(failures, len(RECONNECT_PAUSES) - 1)]
                    failures += 1
                    log = logger.warning if failures == 1 else logger.debug
                    log("near cache: cannot connect (%s), again in %.2f s", error, pause)
                    await asyncio.sleep(pause)
                    continue
                if self._closed:
                    # Closed while it connected, and the cancel dropped on the
                    # way (a Sentinel query's send: asyncio.wait_for before
                    # Python 3.12, CPython gh-86296): it would read forever.
                    await connection.disconnect(nowait=True)
                    break
                failures = 0
                self.store.flush()
                self._connection = connection
                writer = getattr(connection, "_writer", None)
                self._fd = socket_of(writer.get_extra_info("socket") if writer else None)
                self._first_attempt.set()
                try:
                    await self._read(connection)
                except Exception as error:
                    logger.info("near cache: tracking connection lost (%s)", error)
                finally:
                    # No await before the queue is swapped: no send slips in.
                    self._connection = None
                    self._fd = None
                    pending, self._pending = self._pending, collections.deque()
                    self.store.flush()
                    for request in pending:
                        if request.key is not None:
                            self.store.abandon(request.key)
                        request.settle(None, failed=True)
                    await connection.disconnect(nowait=True)
        finally:
            self._first_attempt.set()
            self.store.flush()

    async def _read(self, connection: Any) -> None:
        while True:
            try:
                reply: Any = await connection.read_response(push_request=True)
            except ResponseError as error:
                reply = error
            if reply is _PUSH:
                continue
            request = self._pending.popleft()
            if request.key is not None and request.ticket is not None:
                reply = self.store.finish(request.key, request.ticket, reply)
            request.settle(reply)
