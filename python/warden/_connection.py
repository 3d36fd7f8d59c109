"""How warden's commands reach the server from a sync client.

Every request runs on a connection checked out of the pool for its whole
duration (a blocking ``WAIT`` holds its connection; a cache lease lives as
long as the connection that took it), is read with its own timeout whatever
the pool's ``socket_timeout``, and is never retried whatever the client's
``Retry``: a re-sent ``LOCK.ACQUIRE`` whose first grant was lost with the
connection would become a second hold. A request that fails in flight — a
read timeout, a dropped connection, ``KeyboardInterrupt`` — closes its
connection, which also takes a waiter out of the server's queue.

Requests that wait server-side (an acquire with ``WAIT``, ``CACHE.GET`` and
the fill that follows it) never take a connection from the client's own pool:
they run on a pool of their own beside it, built from the same connection
class and settings, bounded by the same ``max_connections`` (and, for a
``BlockingConnectionPool``, the same ``timeout``). Waiters parked in the
server therefore cannot starve the release, the renewals or the application
of the connections they need, however small the bounded pool. A pool of
another class (Sentinel's) is used as it is.
"""

from __future__ import annotations

import math
import threading
import weakref
from typing import Any, Callable, Optional

from redis.cluster import RedisCluster
from redis.connection import BlockingConnectionPool, ConnectionPool
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._core import is_redirect


def _pool(client: Any, key: str, waits: bool = False) -> Any:
    if isinstance(client, RedisCluster):
        node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
        pool = client.get_redis_connection(node).connection_pool
    else:
        pool = client.connection_pool
    return wait_pool(pool) if waits else pool


_wait_pools: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_wait_pools_lock = threading.Lock()


def wait_pool(pool: Any) -> Any:
    """The pool that requests waiting server-side use beside ``pool``: same
    connection settings and bound, its own connections (made once per pool)."""
    if type(pool) not in (ConnectionPool, BlockingConnectionPool):
        return pool
    with _wait_pools_lock:
        waits = _wait_pools.get(pool)
        if waits is None:
            kwargs = dict(pool.connection_kwargs)
            for client_side_cache in ("cache", "cache_config"):
                kwargs.pop(client_side_cache, None)
            if isinstance(pool, BlockingConnectionPool):
                kwargs["timeout"] = pool.timeout
            waits = type(pool)(
                connection_class=pool.connection_class,
                max_connections=pool.max_connections,
                **kwargs,
            )
            _wait_pools[pool] = waits
        return waits


def _checkout(pool: Any) -> Any:
    try:
        return pool.get_connection()
    except TypeError:  # redis-py < 5.3 wants a command name
        return pool.get_connection("_")


class Pinned:
    """One connection to the server that owns ``key``, checked out until closed."""

    def __init__(self, client: Any, key: str, waits: bool = False) -> None:
        self.client = client
        self.key = key
        self.pool = _pool(client, key, waits)
        self.connection = _checkout(self.pool)
        self.broken = False

    def call(
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
            self.connection.send_command(*args)
            if on_sent is not None:
                on_sent()
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


def call(
    client: Any,
    key: str,
    *args: Any,
    timeout: Optional[float] = None,
    waits: bool = False,
    on_sent: Optional[Callable[[], None]] = None,
) -> Any:
    """One command about ``key`` on a connection of its own, never retried;
    a cluster redirect (the command did not run) refreshes the slot map once.
    ``waits``: the command may wait server-side (it runs on a connection of
    the wait pool)."""
    for attempt in (0, 1):
        with Pinned(client, key, waits) as pinned:
            try:
                return pinned.call(*args, timeout=timeout, on_sent=on_sent)
            except ResponseError as error:
                if attempt or not is_redirect(error) or not isinstance(client, RedisCluster):
                    raise
        client.nodes_manager.initialize()
    raise AssertionError("unreachable")
