"""How warden's commands reach the server from an asyncio client: the same
rules as the sync side (``warden._connection``): a connection checked out for
the request, its own read timeout, no retries, and a failed or cancelled
request closes its connection (which takes a waiter out of the server's queue).
Requests that wait server-side run on a pool of their own beside the client's,
with the same settings and bound (see ``warden._connection``); on a cluster,
one such pool per node.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from typing import Any, Callable, Optional

from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import BlockingConnectionPool, ConnectionPool
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._core import is_redirect

# read_response(timeout=t) answers None when t passes: the outer wait_for owns the deadline.
_NO_READ_TIMEOUT = 10.0**9


_wait_pools: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
# A cluster's nodes cannot be weakly referenced: their pools hang on the client.
_node_wait_pools: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def node_wait_pool(client: Any, node: Any) -> Any:
    """The wait pool beside one cluster node's connections."""
    pools = _node_wait_pools.setdefault(client, {})
    waits = pools.get(node.name)
    if waits is None:
        waits = pools[node.name] = _new_wait_pool(node)
    return waits


def wait_pool(pool: Any) -> Any:
    """The pool that requests waiting server-side use beside ``pool``: same
    connection settings and bound, connections of its own."""
    waits = _wait_pools.get(pool)
    if waits is None:
        waits = _new_wait_pool(pool)
        if waits is pool:
            return pool
        _wait_pools[pool] = waits
    return waits


def _new_wait_pool(pool: Any) -> Any:
    kwargs = dict(pool.connection_kwargs)
    for client_side_cache in ("cache", "cache_config"):
        kwargs.pop(client_side_cache, None)
    waits: Any
    if isinstance(pool, BlockingConnectionPool):
        waits = BlockingConnectionPool(
            connection_class=pool.connection_class,
            max_connections=pool.max_connections,
            timeout=pool.timeout,
            **kwargs,
        )
    elif type(pool) is ConnectionPool or not isinstance(pool, ConnectionPool):
        # A plain pool, or a cluster node (its own bound, no pool object).
        waits = ConnectionPool(
            connection_class=pool.connection_class,
            max_connections=pool.max_connections,
            **kwargs,
        )
    else:
        return pool  # a pool of another class (Sentinel's): used as it is
    return waits


class Pinned:
    """One connection to the server that owns ``key``, checked out until closed."""

    def __init__(self, client: Any, key: str) -> None:
        self.client = client
        self.key = key
        self.node: Any = None
        self.pool: Any = None
        self.connection: Any = None
        self.broken = False

    @classmethod
    async def open(cls, client: Any, key: str, waits: bool = False) -> Pinned:
        pinned = cls(client, key)
        if isinstance(client, RedisCluster):
            node: Any = client.get_node_from_key(key)
            if waits:
                pinned.pool = node_wait_pool(client, node)
            else:
                pinned.node = node
                pinned.connection = node.acquire_connection()
        else:
            pinned.pool = client.connection_pool
            if waits:
                pinned.pool = wait_pool(pinned.pool)
        if pinned.pool is not None:
            try:
                pinned.connection = await pinned.pool.get_connection()
            except TypeError:  # redis-py < 5.3 wants a command name
                pinned.connection = await pinned.pool.get_connection("_")
        return pinned

    async def call(
        self,
        *args: Any,
        timeout: Optional[float] = None,
        on_sent: Optional[Callable[[], None]] = None,
    ) -> Any:
        """Send one command and read its reply. ``timeout`` None keeps the
        connection's socket timeout; ``math.inf`` waits forever. ``on_sent``
        runs once the whole command is on its way (the server will run it)."""
        if self.broken:
            raise RuntimeError("the connection was closed by an earlier failure")
        try:
            await self.connection.send_command(*args)
            if on_sent is not None:
                on_sent()
            if timeout is None:
                return await self.connection.read_response()
            read = self.connection.read_response(timeout=_NO_READ_TIMEOUT)
            if timeout == math.inf:
                return await read
            try:
                return await asyncio.wait_for(read, timeout)
            except asyncio.TimeoutError:
                raise RedisTimeoutError(f"no reply to {args[0]} within {timeout:.1f} s") from None
        except ResponseError:
            raise  # the connection is fine: the server answered
        except BaseException:
            self.broken = True
            raise

    async def close(self) -> None:
        connection, self.connection = self.connection, None
        if connection is None:
            return
        if self.broken:
            await connection.disconnect(nowait=True)
        if self.node is not None:
            release = getattr(self.node, "release", None)
            if release is not None:
                release(connection)
            else:  # redis-py < 5.1
                self.node._free.append(connection)
        else:
            await self.pool.release(connection)

    async def __aenter__(self) -> Pinned:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def call(
    client: Any,
    key: str,
    *args: Any,
    timeout: Optional[float] = None,
    waits: bool = False,
    on_sent: Optional[Callable[[], None]] = None,
) -> Any:
    """One command about ``key`` on a connection of its own, never retried;
    a cluster redirect (the command did not run) refreshes the slot map once.
    ``waits``: the command may wait server-side (wait pool)."""
    for attempt in (0, 1):
        async with await Pinned.open(client, key, waits) as pinned:
            try:
                return await pinned.call(*args, timeout=timeout, on_sent=on_sent)
            except ResponseError as error:
                if attempt or not is_redirect(error) or not isinstance(client, RedisCluster):
                    raise
        await client.nodes_manager.initialize()
    raise AssertionError("unreachable")
