"""How warden's commands reach the server from a sync client.

Every request runs on a connection checked out of the pool for its whole
duration (a blocking ``WAIT`` holds its connection; a cache lease lives as
long as the connection that took it), is read with its own timeout whatever
the pool's ``socket_timeout``, and is never retried whatever the client's
``Retry``: a re-sent ``LOCK.ACQUIRE`` whose first grant was lost with the
connection would become a second hold. A request that fails in flight — a
read timeout, a dropped connection, ``KeyboardInterrupt`` — closes its
connection, which also takes a waiter out of the server's queue.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from redis.cluster import RedisCluster
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._core import is_redirect


def _pool(client: Any, key: str) -> Any:
    if isinstance(client, RedisCluster):
        node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
        return client.get_redis_connection(node).connection_pool
    return client.connection_pool


def _checkout(pool: Any) -> Any:
    try:
        return pool.get_connection()
    except TypeError:  # redis-py < 5.3 wants a command name
        return pool.get_connection("_")


class Pinned:
    """One connection to the server that owns ``key``, checked out until closed."""

    def __init__(self, client: Any, key: str) -> None:
        self.client = client
        self.key = key
        self.pool = _pool(client, key)
        self.connection = _checkout(self.pool)
        self.broken = False

    def call(self, *args: Any, timeout: Optional[float] = None) -> Any:
        """Send one command and read its reply. ``timeout`` None keeps the
        connection's socket timeout; ``math.inf`` waits forever."""
        if self.broken:
            raise RuntimeError("the connection was closed by an earlier failure")
        try:
            self.connection.send_command(*args)
            if timeout is not None and not self.connection.can_read(
                timeout=None if timeout == math.inf else timeout
            ):
                raise RedisTimeoutError(f"no reply to {args[0]} within {timeout:.1f} s")
            return self.connection.read_response()
        except ResponseError:
            raise  # the connection is fine: the server answered
        except BaseException:
            self.broken = True
            raise

    def close(self) -> None:
        if self.broken:
            self.connection.disconnect()
        self.pool.release(self.connection)

    def __enter__(self) -> Pinned:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def call(client: Any, key: str, *args: Any, timeout: Optional[float] = None) -> Any:
    """One command about ``key`` on a connection of its own, never retried;
    a cluster redirect (the command did not run) refreshes the slot map once."""
    for attempt in (0, 1):
        with Pinned(client, key) as pinned:
            try:
                return pinned.call(*args, timeout=timeout)
            except ResponseError as error:
                if attempt or not is_redirect(error) or not isinstance(client, RedisCluster):
                    raise
        client.nodes_manager.initialize()
    raise AssertionError("unreachable")
