"""How warden's commands reach the server from an asyncio client: the same
rules as the sync side (``warden._connection``): a connection checked out for
the request, its own read timeout, no retries, and a failed or cancelled
request closes its connection (which takes a waiter out of the server's queue).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any, Optional

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._core import is_redirect

# read_response(timeout=t) answers None when t passes: the outer wait_for owns the deadline.
_NO_READ_TIMEOUT = 10.0**9


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
    async def open(cls, client: Any, key: str) -> Pinned:
        pinned = cls(client, key)
        if isinstance(client, RedisCluster):
            pinned.node = client.get_node_from_key(key)
            pinned.connection = pinned.node.acquire_connection()
        else:
            pinned.pool = client.connection_pool
            try:
                pinned.connection = await pinned.pool.get_connection()
            except TypeError:  # redis-py < 5.3 wants a command name
                pinned.connection = await pinned.pool.get_connection("_")
        return pinned

    async def call(self, *args: Any, timeout: Optional[float] = None) -> Any:
        """Send one command and read its reply. ``timeout`` None keeps the
        connection's socket timeout; ``math.inf`` waits forever."""
        if self.broken:
            raise RuntimeError("the connection was closed by an earlier failure")
        try:
            await self.connection.send_command(*args)
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


async def call(client: Any, key: str, *args: Any, timeout: Optional[float] = None) -> Any:
    """One command about ``key`` on a connection of its own, never retried;
    a cluster redirect (the command did not run) refreshes the slot map once."""
    for attempt in (0, 1):
        async with await Pinned.open(client, key) as pinned:
            try:
                return await pinned.call(*args, timeout=timeout)
            except ResponseError as error:
                if attempt or not is_redirect(error) or not isinstance(client, RedisCluster):
                    raise
        await client.nodes_manager.initialize()
    raise AssertionError("unreachable")
