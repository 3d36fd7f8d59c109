"""``warden.NearCache``: the values of a ``warden.Cache`` kept in-process,
dropped when the server says they changed (docs/cache.md, "Near cache").

One RESP3 connection of its own with ``CLIENT TRACKING on``, made from the
client's connection settings (its class: Sentinel's follows the master), read
by one daemon thread: ``CACHE.PEEK`` replies and invalidation pushes in the
order the server sent them. Callers of any thread pipeline their peeks on it
and wait for their own reply. redis-py's RESP3 parser reads the pushes (its
invalidation handler); redis-py's own client-side cache is not used: it keeps
replies of commands it knows, while a ``CACHE.PEEK`` reply carries an expiry
and a stale mark that decide whether it may be kept at all.

Through Sentinel (``Sentinel(...).master_for(name)``) each connection asks
Sentinel for the master when it is made. A failover with the old master up
closes nothing on it until Sentinel demotes it, seconds later (docs/cache.md):
so ``sync()`` and a check every ``MASTER_CHECK_SECONDS`` ask Sentinel again
and drop the tracking connection (and everything kept) when the master moved.
"""

from __future__ import annotations

import collections
import logging
import select
import threading

try:
    import fcntl
    import termios
except ImportError:  # Windows
    fcntl = termios = None  # type: ignore[assignment]
from typing import Any, Optional

from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError, ResponseError
from redis.retry import Retry

from ._near import NearCacheConfig, NearCacheStats, NearStore, Ticket, invalidated_keys

logger = logging.getLogger(__name__)

# What the push handler returns: read_response(push_request=True) hands it
# back, and no reply is this object.
_PUSH = object()

# How long a peek or sync waits for its reply when the client has no
# socket_timeout: past it the connection is taken as dead (and made again).
REPLY_SECONDS = 10.0
RECONNECT_PAUSES = (0.05, 0.1, 0.2, 0.5, 1.0)
# How often the tracking connection of a Sentinel client is checked to reach
# the master Sentinel names (besides at every ``sync()``).
MASTER_CHECK_SECONDS = 1.0


def _gone(*args: Any, **kwargs: Any) -> None:
    raise ConnectionError("the tracking connection was closed")


class _Request:
    """One command sent on the tracking connection; for a peek, its key and
    the generation noted before the send."""

    __slots__ = ("done", "reply", "failed", "key", "ticket")

    def __init__(self, key: Optional[str] = None, ticket: Optional[Ticket] = None) -> None:
        self.done = threading.Event()
        self.reply: Any = None
        self.failed = False
        self.key = key
        self.ticket = ticket

    def settle(self, reply: Any, failed: bool = False) -> None:
        self.reply, self.failed = reply, failed
        self.done.set()


def socket_of(sock: Any) -> Optional[int]:
    """The descriptor of a connected socket, for ``unread``."""
    try:
        return int(sock.fileno())
    except (AttributeError, OSError, ValueError):
        return None


_NO_BYTES = bytes(4)


def _unread_fionread(fd: int) -> bool:
    count = bytearray(4)  # one per call: hits run on any thread
    fcntl.ioctl(fd, termios.FIONREAD, count, True)
    return count != _NO_BYTES


def _unread_select(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


# FIONREAD: any descriptor number (``select`` watches none past 1024) and
# safe from any thread (a ``poll`` object is not); select where there is none.
_unread = _unread_fionread if hasattr(termios, "FIONREAD") else _unread_select


def unread(fd: Optional[int]) -> bool:
    """Whether the tracking connection has bytes its reader has not taken
    yet: invalidations may be among them, so no hit is served until the
    reader has applied them (a spinning reader thread holds the GIL the
    tracking thread needs; a coroutine that never awaits keeps the loop from
    reading at all). One ``ioctl(FIONREAD)``, about 0.5 µs; a socket closed
    under us answers True (no hit: the reader flushes)."""
    if fd is None:
        return False
    try:
        return _unread(fd)
    except (OSError, ValueError):
        return True


def sentinel_master(pool: Any) -> Any:
    """The pool's ``get_master_address`` when it is a Sentinel pool of the
    master (``master_for``), else None. It asks Sentinel (and notes the
    answer in the pool, whose connections to another server are then closed
    when they are given back)."""
    if getattr(pool, "is_master", False) and hasattr(pool, "sentinel_manager"):
        return getattr(pool, "get_master_address", None)
    return None


def moved(connection: Any, master: Any) -> bool:
    """Whether ``connection`` reaches another server than ``master``, the
    ``(host, port)`` Sentinel names."""
    return master is not None and (connection.host, connection.port) != tuple(master)


def master_seen(known: Any, master: Any) -> bool:
    """Whether ``master`` (what Sentinel named now) is another server than
    ``known`` (what the near cache saw last, None at first)."""
    return known is None or tuple(known) != tuple(master)


def tracking_kwargs(pool: Any) -> dict[str, Any]:
    """The client's connection settings for a RESP3 tracking connection."""
    kwargs = dict(pool.connection_kwargs)
    for client_side_cache in ("cache", "cache_config"):
        kwargs.pop(client_side_cache, None)
    timeout = kwargs.get("socket_timeout")
    # One try per attempt: the reader's own pauses space them out, and a
    # server that is down does not hold the constructor for redis-py's
    # retries (about 4 s).
    kwargs["retry"] = Retry(NoBackoff(), 0)
    kwargs.update(
        protocol=3,
        decode_responses=False,
        # The reader waits for pushes forever; replies have their own deadline.
        socket_timeout=None,
        socket_connect_timeout=kwargs.get("socket_connect_timeout") or timeout or REPLY_SECONDS,
        health_check_interval=0,
    )
    return kwargs


class NearCache:
    """The near cache of one ``warden.Cache`` (``Cache(r,
    near_cache=NearCacheConfig())``): ``get`` answers from memory or with one
    ``CACHE.PEEK`` on the tracking connection; ``sync()`` waits one round trip
    of it; ``stats()``; ``close()``."""

    def __init__(self, redis: Any, config: NearCacheConfig) -> None:
        if isinstance(redis, RedisCluster):
            raise TypeError("the near cache needs a single server (or Sentinel), not a cluster")
        pool = redis.connection_pool
        self._connection_class = pool.connection_class
        self._kwargs = tracking_kwargs(pool)
        timeout = pool.connection_kwargs.get("socket_timeout")
        self.reply_seconds: float = timeout or REPLY_SECONDS
        self.store = NearStore(config)
        # Held to send, so that requests are queued in the order they are sent.
        self._send_lock = threading.Lock()
        self._connection: Any = None  # None while down
        self._fd: Optional[int] = None  # the connection's socket, for unread()
        self._pending: collections.deque[_Request] = collections.deque()
        self.client_id: Optional[int] = None
        self._closed = threading.Event()
        self._first_attempt = threading.Event()
        self._master = sentinel_master(pool)
        self._pool = pool
        # The master Sentinel named last, and the lock under which a change of
        # it closes the client's idle connections (see check_master).
        self._known_master: Any = None
        self._master_lock = threading.Lock()
        self._reader = threading.Thread(target=self._run, name="warden-near-cache", daemon=True)
        self._reader.start()
        self._watcher: Optional[threading.Thread] = None
        if self._master is not None:
            self._watcher = threading.Thread(
                target=self._watch, name="warden-near-cache-master", daemon=True
            )
            self._watcher.start()
        # The first reads find the connection made (or known to be down).
        self._first_attempt.wait(self.reply_seconds)

    @property
    def connected(self) -> bool:
        return self._connection is not None

    def get(self, key: str, margin_ms: int = 0) -> Optional[bytes]:
        """The kept value (0 round trips), or None (a miss, or due within
        ``margin_ms``, or pushes wait unread on the tracking connection)."""
        if unread(self._fd):
            return None
        return self.store.get(key, margin_ms)

    def peek(self, key: str) -> Optional[tuple[bytes, int]]:
        """``CACHE.PEEK key`` on the tracking connection: a fresh ``(value,
        expires_at)``, kept when nothing moved the key meanwhile; None when
        the key holds no fresh value or the connection is down (ask
        ``CACHE.GET``)."""
        # The reader keeps the reply (or not) in stream order, then settles it.
        request = self._send(_Request(key, self.store.begin(key)), "CACHE.PEEK", key)
        if request is None or request.failed:
            return None
        fresh: Optional[tuple[bytes, int]] = request.reply
        return fresh

    def sync(self) -> None:
        """One round trip on the tracking connection: every invalidation the
        server queued before it has been applied when it returns (at once
        while the connection is down: nothing is kept then). Through
        Sentinel it first asks Sentinel for the master, and drops a tracking
        connection to a server that no longer is (everything kept goes)."""
        self.check_master()
        self._send(_Request(), "PING")

    def check_master(self) -> None:
        """Through Sentinel: drop the tracking connection, and everything
        kept, when Sentinel names another master than the one it reaches (a
        failed-over master that is still up keeps its connections until
        Sentinel demotes it, and hears no write made on the new one). A
        Sentinel that does not answer changes nothing: the connection is
        kept, and so is what it tracks.

        A change also closes the client's idle connections (a miss reads
        through them). redis-py does so too, but only in the call that first
        sees the change, and after it noted the new master: a thread that
        asks in between is told nothing moved, and may read the old master
        through an idle connection. Here the close comes before the change is
        noted, under one lock, so no check returns before it. While the
        tracking connection is down nothing is asked (``sync()`` returns at
        once; its reconnect asks Sentinel)."""
        connection = self._connection
        if self._master is None or connection is None:
            return
        try:
            master = self._master()
        except Exception as error:
            logger.debug("near cache: no master from Sentinel (%s)", error)
            return
        with self._master_lock:
            if master_seen(self._known_master, master):
                self._pool.disconnect(inuse_connections=False)
                self._known_master = tuple(master)
        if moved(connection, master):
            logger.info("near cache: the master moved to %s:%s", *master)
            self._lost(connection)
            # Before it returns (the reader flushes too, later): sync() then
            # leaves nothing old kept. After the close: no reply of the old
            # server is read after it.
            self.store.flush()

    def _watch(self) -> None:
        while not self._closed.wait(MASTER_CHECK_SECONDS):
            self.check_master()

    def invalidated(self, key: str) -> None:
        """This process invalidated ``key``: drop it at once."""
        self.store.drop([key])

    def stats(self) -> NearCacheStats:
        return self.store.stats()

    def close(self) -> None:
        """Close the tracking connection and stop its reader (dropping everything)."""
        self._closed.set()
        with self._send_lock:
            connection = self._connection
            self._fd = -1 if connection is not None else None
        if connection is not None:
            connection.disconnect()
        for thread in (self._reader, self._watcher):
            if thread is not None and thread is not threading.current_thread():
                thread.join()

    # The caller's side.

    def _send(self, request: _Request, *args: Any) -> Optional[_Request]:
        """Send one command and wait for its reply (settled by the reader);
        None when the connection is down or the reply did not come in time."""
        with self._send_lock:
            connection = self._connection
            if connection is not None:
                self._pending.append(request)
                try:
                    connection.send_command(*args, check_health=False)
                except Exception:
                    self._pending.pop()
                    connection = None
                    self._lost(self._connection)
                    # Before sync() returns: the reader may not have seen it yet.
                    self.store.flush()
        if connection is None:
            if request.key is not None:
                self.store.abandon(request.key)
            return None
        if not request.done.wait(self.reply_seconds):
            self._lost(connection)
            self.store.flush()
            return None
        return request

    def _lost(self, connection: Any) -> None:
        """Close ``connection``: the reader sees it, flushes and connects again.
        Until then no hit is served: its descriptor number may be reused by
        another socket at once, which ``unread`` must not ask (-1 answers
        True)."""
        if connection is self._connection:
            self._fd = -1
        try:
            connection.disconnect()
        except Exception:
            logger.debug("closing the tracking connection failed", exc_info=True)

    # The reader's side.

    def _on_push(self, push: Any) -> Any:
        keys = invalidated_keys(push)
        if keys is None:
            self.store.flush()
        else:
            self.store.drop(keys)
        return _PUSH

    def _open(self) -> Any:
        connection = self._connection_class(**self._kwargs)
        try:
            connection.connect()
            connection._parser.set_invalidation_push_handler(self._on_push)
            connection.send_command("CLIENT", "TRACKING", "ON", check_health=False)
            connection.read_response()
            connection.send_command("CLIENT", "ID", check_health=False)
            self.client_id = int(connection.read_response())
        except BaseException:
            connection.disconnect()
            raise
        # redis-py connects a closed connection again on its next send: this
        # one would then track nothing while the reader read on. Never again.
        connection.connect = connection.connect_check_health = _gone
        return connection

    def _run(self) -> None:
        failures = 0
        while not self._closed.is_set():
            try:
                connection = self._open()
            except Exception as error:
                self._first_attempt.set()
                pause = RECONNECT_PAUSES[min(failures, len(RECONNECT_PAUSES) - 1)]
                failures += 1
                # Said once per outage: a near cache that cannot connect
                # serves no hit, which must not go unnoticed.
                log = logger.warning if failures == 1 else logger.debug
                log("near cache: cannot connect (%s), again in %.2f s", error, pause)
                self._closed.wait(pause)
                continue
            failures = 0
            self.store.flush()  # what was kept before this connection may be old
            with self._send_lock:
                self._connection = connection
                self._fd = socket_of(connection._sock)
            self._first_attempt.set()
            if self._closed.is_set():  # closed while connecting: close() saw no connection
                connection.disconnect()
            try:
                self._read(connection)
            except Exception as error:
                if not self._closed.is_set():
                    logger.info("near cache: tracking connection lost (%s)", error)
            finally:
                # Flushed first: a caller that finds no connection finds nothing kept.
                self.store.flush()
                with self._send_lock:
                    self._connection = None
                    self._fd = None
                    pending, self._pending = self._pending, collections.deque()
                for request in pending:
                    if request.key is not None:
                        self.store.abandon(request.key)
                    request.settle(None, failed=True)
                connection.disconnect()
        self.store.flush()

    def _read(self, connection: Any) -> None:
        while True:
            try:
                reply: Any = connection.read_response(push_request=True)
            except ResponseError as error:  # an answer: the connection is fine
                reply = error
            if reply is _PUSH:
                continue
            with self._send_lock:
                request = self._pending.popleft()
            if request.key is not None and request.ticket is not None:
                reply = self.store.finish(request.key, request.ticket, reply)
            request.settle(reply)
