"""How warden's commands reach the server from a sync client.

Every request runs on a connection checked out of the pool for its whole
duration, is read with its own timeout whatever the pool's
``socket_timeout``, and is never retried whatever the client's ``Retry``: a
re-sent ``LOCK.ACQUIRE`` whose first grant was lost with the connection would
become a second hold. A request that fails in flight (a read timeout, a
dropped connection) closes its connection, which also takes a waiter out of
the server's queue.

Requests that wait server-side (an acquire with ``WAIT``, ``CACHE.GET`` and
the fill that follows it) never take a connection from the client's own pool:
they run on a pool of their own beside it (``WaitPool``), built from the same
connection class and settings, bounded by the same ``max_connections``.
Waiters parked in the server therefore cannot starve the release, the
renewals or the application of the connections they need. warden's own
requests wait for a free connection of either pool (within their caller's
deadline, if any) rather than raise redis-py's "Too many connections". A pool
of another class (Sentinel's) is used as it is.

Closing the client (``close()``, asyncio ``aclose()``) disconnects its pool,
and the wait pool with it: redis-py has no close hook, so warden wraps the
``disconnect`` method of the one pool object it built a wait pool for (not
the class, not the client: the pool is what every way of closing goes
through, and a pool shared by several clients is closed only when its owner
closes it). Waits parked then, or still waiting for a connection, end with
``ClientClosed`` (a ``ConnectionError``, as a closed connection's request
does), their connections closed (never opened again to wait), and what the
server may have granted them is given back.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from typing import Any, Callable, Optional

from redis.cluster import RedisCluster
from redis.connection import BlockingConnectionPool, ConnectionPool
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import _core
from ._core import (
    ClientClosed,
    Deadline,
    also_on_disconnect,
    gone_pauses,
    hinted,
    is_redirect,
    refuses_command,
    reply_due,
    unblocks_module_waiters,
    withdraw_args,
)

#: What a request that gave up hands a reply it will not deliver: the reply
#: (an acquire's grant, or a refusal, to give back or not), or None when the
#: connection was closed unanswered (a grant may have crossed the close).
Lost = Callable[[Any], None]


class Slots:
    """At most ``max_connections`` of warden's requests at once on one pool,
    so that the pool never raises for them: the others wait for a slot."""

    def __init__(self, count: int) -> None:
        self.free = threading.BoundedSemaphore(count)

    def take(self, deadline: Optional[Deadline]) -> bool:
        """False when ``deadline`` passes first (without one: waits)."""
        left = None if deadline is None else deadline.remaining()
        return self.free.acquire(timeout=left) if left is not None else self.free.acquire()

    def give(self) -> None:
        self.free.release()


def _slots_for(pool: Any) -> Optional[Slots]:
    count = getattr(pool, "max_connections", None)
    return Slots(count) if isinstance(count, int) and 0 < count < 2**31 else None


class WaitPool:
    """The connections of requests that wait server-side beside one pool: the
    same settings and bound, connections of their own. ``unblock_works``:
    whether ``CLIENT UNBLOCK`` takes a warden waiter out here (Redis >= 7.4,
    Valkey >= 8), learnt once from ``INFO server``."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        if type(pool) in (ConnectionPool, BlockingConnectionPool):
            kwargs = dict(pool.connection_kwargs)
            for client_side_cache in ("cache", "cache_config"):
                kwargs.pop(client_side_cache, None)
            # Plain: the slots bound it, and wait only as long as their caller may.
            self.pool = ConnectionPool(
                connection_class=pool.connection_class,
                max_connections=pool.max_connections,
                **kwargs,
            )
            also_on_disconnect(pool, self.close)
        self.slots = _slots_for(self.pool)
        # Learnt once from INFO server: whether CLIENT UNBLOCK takes a module's
        # waiter out (Redis >= 7.4, Valkey >= 8); never sent elsewhere.
        self.unblock_works: Optional[bool] = None
        # Set once ``WARDEN.WITHDRAW`` was refused (a module before 1.1.0, an
        # ACL): waiters are taken out by ``CLIENT UNBLOCK`` or a close then.
        self.no_withdraw = False
        # The requests parked in the server on this pool's connections. No
        # lock: one set operation is atomic, and an interrupt could leave a
        # lock taken (between ``with``'s body and its exit).
        self.waiting: set[Pinned] = set()
        # Counts the closes of the client: a wait that sees it change before
        # it is parked ends (its connection may have been closed under it).
        self.closes = 0

    def close(self, inuse_connections: bool = True) -> None:
        """Close the connections, as the client's pool was (with
        ``inuse_connections``: the parked requests end with ``ClientClosed``,
        and whatever the server may have granted them is given back)."""
        if inuse_connections:
            self.closes += 1
            for pinned in list(self.waiting):
                pinned.client_closed = True
        self.pool.disconnect(inuse_connections)


_lock = threading.Lock()
_wait_pools: weakref.WeakKeyDictionary[Any, WaitPool] = weakref.WeakKeyDictionary()
_gates: weakref.WeakKeyDictionary[Any, Optional[Slots]] = weakref.WeakKeyDictionary()


def wait_pool(pool: Any) -> WaitPool:
    """The pool that requests waiting server-side use beside ``pool`` (made once)."""
    waits = _wait_pools.get(pool)
    if waits is not None:
        return waits
    with _lock:
        waits = _wait_pools.get(pool)
        if waits is None:
            waits = _wait_pools[pool] = WaitPool(pool)
        return waits


def _gate(pool: Any) -> Optional[Slots]:
    try:
        return _gates[pool]  # made once per pool: no lock once there
    except KeyError:
        pass
    with _lock:
        if pool not in _gates:
            _gates[pool] = _slots_for(pool)
        return _gates[pool]


def _pool(client: Any, key: str) -> Any:
    if isinstance(client, RedisCluster):
        node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
        return client.get_redis_connection(node).connection_pool
    return client.connection_pool


class DeadlinePassed(Exception):
    """No connection was free before the caller's deadline."""


def _checkout(pool: Any) -> Any:
    try:
        return pool.get_connection()
    except TypeError:  # redis-py < 5.3 wants a command name
        return pool.get_connection("_")


class Pinned:
    """One connection to the server that owns ``key``, checked out until closed."""

    def __init__(
        self, client: Any, key: str, waits: bool = False, deadline: Optional[Deadline] = None
    ) -> None:
        self.client = client
        self.key = key
        pool = _pool(client, key)
        self.waits: Optional[WaitPool] = wait_pool(pool) if waits else None
        self.pool = self.waits.pool if self.waits is not None else pool
        self.slots = self.waits.slots if self.waits is not None else _gate(pool)
        if self.slots is not None and not self.slots.take(deadline):
            raise DeadlinePassed()
        try:
            self.connection = _checkout(self.pool)
        except BaseException:
            if self.slots is not None:
                self.slots.give()
            raise
        self.broken = False
        # Set when the client is closed while this connection waits server-side.
        self.client_closed = False

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
        except ResponseError as error:
            raise hinted(error) from None  # the connection is fine: the server answered
        except BaseException:
            self.broken = True
            raise

    def close(self) -> None:
        try:
            if self.broken:
                self.connection.disconnect()
            self.pool.release(self.connection)
        finally:
            if self.slots is not None:
                self.slots.give()

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
    deadline: Optional[Deadline] = None,
) -> Any:
    """One command about ``key`` on a connection of its own, never retried;
    a cluster redirect (the command did not run) refreshes the slot map once.
    ``waits``: the command may wait server-side (it runs on a connection of
    the wait pool). ``DeadlinePassed`` if no connection is free before
    ``deadline``."""
    for attempt in (0, 1):
        with Pinned(client, key, waits, deadline) as pinned:
            try:
                return pinned.call(*args, timeout=timeout, on_sent=on_sent)
            except ResponseError as error:
                if attempt or not is_redirect(error) or not isinstance(client, RedisCluster):
                    raise
        client.nodes_manager.initialize()
    raise AssertionError("unreachable")


def try_call(
    client: Any,
    key: str,
    args: list[Any],
    deadline: Optional[Deadline],
    late: Lost,
    got: list[Any],
) -> None:
    """Send ``args`` (an acquire that does not wait) and read its reply into
    ``got`` (within ``deadline``, if any); ``DeadlinePassed`` when no
    connection or no reply came in time. A reply still due then is read in
    the background and handed to ``late`` (a grant: given back); ``late(None)``
    when the request failed in flight (a grant may have crossed the close of
    its connection). Once in ``got`` the reply is the caller's to record or
    give back, whatever interrupts it from there."""
    for attempt in (0, 1):
        pinned = Pinned(client, key, False, deadline)
        handed_off = False
        sent = False
        try:
            connection = pinned.connection
            try:
                connection.connect()  # a failure here sent nothing
                sent = True  # an interrupt inside the send may leave it sent
                connection.send_command(*args)
                if deadline is not None and not connection.can_read(timeout=deadline.remaining()):
                    # The server answers late (stalled, paused): the caller
                    # times out now; the reply is read, and a grant given
                    # back, on this connection's own time (in order after it).
                    handed_off = True
                    threading.Thread(target=_read_late, args=(pinned, late), daemon=True).start()
                    raise DeadlinePassed()
                got.append(connection.read_response())
                return
            except ResponseError as error:
                sent = False  # answered: nothing held
                if attempt or not is_redirect(error) or not isinstance(client, RedisCluster):
                    raise hinted(error) from None
            except DeadlinePassed:
                raise
            except BaseException:
                pinned.broken = True
                raise
        finally:
            if not handed_off:
                try:
                    pinned.close()
                finally:
                    # Unanswered: whatever the server may have granted is given back.
                    if pinned.broken and sent and not got:
                        late(None)
        client.nodes_manager.initialize()
    raise AssertionError("unreachable")


# How long a late reply is waited for in the background: past that the
# connection is closed and whatever it may hold is given back.
LATE_REPLY_SECONDS = 30.0


def _read_late(pinned: Pinned, late: Lost) -> None:
    connection = pinned.connection
    try:
        if connection.can_read(timeout=LATE_REPLY_SECONDS):
            reply = connection.read_response()
            if reply is not None:
                late(reply)
            return
        pinned.broken = True
    except ResponseError:
        return  # refused: nothing held
    except Exception:
        pinned.broken = True
    finally:
        pinned.close()
    late(None)


def blocking_call(
    client: Any,
    key: str,
    args: list[Any],
    deadline: Deadline,
    extra: list[Any],
    lost: Lost,
    got: list[Any],
    withdraw: bool = True,
) -> None:
    """Send ``args`` with ``WAIT`` (what is left of ``deadline`` less a margin,
    computed when it is sent) and ``extra`` on a connection of the wait pool,
    and read the reply into ``got``; nothing there when the deadline passes
    first (also while waiting for a connection). Once in ``got`` the reply is
    the caller's to record or give back, whatever interrupts it from there. A
    grant the caller will not get (it raced an interrupt or the deadline
    before it was read) is handed to ``lost``, which gives it back;
    ``lost(None)``: the connection was closed with the request unanswered (a
    grant may have crossed the close).

    Past the deadline, or on ``KeyboardInterrupt``, the waiter is taken out of
    the server's queue at once: ``WARDEN.WITHDRAW key owner`` for a lock,
    read-write lock or semaphore request, else ``CLIENT UNBLOCK`` on an
    ordinary connection (either way its nil is read and the connection
    kept), or, where neither takes it out (a rate limiter's wait on Redis <
    7.4), by closing its connection. Closing
    the client ends the request with ``ClientClosed``, also while it waits
    for a connection."""
    closes = wait_pool(_pool(client, key)).closes
    try:
        pinned = Pinned(client, key, waits=True, deadline=deadline)
    except DeadlinePassed:
        return
    connection = pinned.connection
    client_id: Optional[int] = None
    note: Optional[object] = None
    # True from the send until the acquire's reply is read (into ``got``):
    # the server may grant this connection what its caller never sees.
    sent = False
    waits = pinned.waits
    assert waits is not None

    def closed() -> bool:
        return pinned.client_closed or waits.closes != closes

    try:
        waits.waiting.add(pinned)
        wait = deadline.wait_ms()
        if wait is None:
            return
        parked = False
        try:
            if closed():  # its connection may be closed: not reopened to wait
                raise ClientClosed("the client was closed while this request waited")
            connection.connect()  # a no-op when connected
            # Its health check (a PING past health_check_interval) may open a
            # new socket: first, so that the id is the one of the socket sent on.
            connection.check_health()
            known, client_id = _core.known_client_id(connection, connection._sock)
            request = (*args, "WAIT", wait, *extra)
            # Parked in the server's queue from the send to the end of the wait:
            # another acquire of this client on the key skips its try. Noted
            # before the send: the server may queue it before the send returns
            # (a thread switch inside it), and a try then would be answered nil.
            note = _core.parked(client, args[0], key)
            sent = True  # an interrupt inside the send may leave it sent
            # CLIENT ID rides along the first wait of a connection (no round
            # trip of its own): the id to unblock, kept while its socket lives.
            connection.send_packed_command(
                connection.pack_commands([request] if known else [("CLIENT", "ID"), request]),
                check_health=False,
            )
            if not known:
                try:
                    client_id = int(connection.read_response())
                except ResponseError:  # an ACL without CLIENT: close to abort instead
                    client_id = None
                _core.remember_client_id(connection, connection._sock, client_id)
            if closed():  # sent on a connection opened again after the close
                raise ClientClosed("the client was closed while this request waited")
            parked = True
            ready = connection.can_read(timeout=deadline.remaining())
            parked = False
            _core.unparked(client, args[0], key, note)
            if closed():
                raise ClientClosed("the client was closed while this request waited")
            if not ready:
                if _abort(client, key, args if withdraw else [], pinned, client_id, lost):
                    sent = False
                return
            got.append(connection.read_response())
        except ResponseError as error:
            sent = False
            raise hinted(error) from None
        except BaseException as error:
            if closed():  # its connection was closed under it
                if isinstance(error, Exception):
                    raise ClientClosed("the client was closed while this request waited") from None
            elif parked and not got:  # the connection is sound: only the wait is unwanted
                if _abort(client, key, args if withdraw else [], pinned, client_id, lost):
                    sent = False
            raise
    finally:
        # Every step guarded: an interrupt in one still closes the connection
        # and gives back what it may hold (a grant in ``got`` is the caller's).
        try:
            if note is not None:
                _core.unparked(client, args[0], key, note)
            waits.waiting.discard(pinned)
            if sent and not got:
                pinned.broken = True
        finally:
            try:
                pinned.close()
            finally:
                if sent and not got:
                    # Closed first, given back once the server has dropped the
                    # waiter: a grant made until then is covered too.
                    gone = _until_gone(client, key, client_id)
                    lost(None)
                    if not gone:  # not confirmed: once more, a round trip later
                        lost(None)


def _until_gone(client: Any, key: str, client_id: Optional[int]) -> bool:
    """Wait (at most a second) until the server no longer lists the closed
    connection ``client_id``: False when that is not confirmed (its id
    unknown, the check failed or it is still listed)."""
    if client_id is None:
        return False
    for pause in gone_pauses():
        try:
            if not call(client, key, "CLIENT", "LIST", "ID", client_id, timeout=1.0):
                return True
        except Exception:
            return False
        time.sleep(pause)
    return False


def _withdrawn(client: Any, key: str, waits: WaitPool, args: list[Any]) -> bool:
    """``WARDEN.WITHDRAW key owner`` for a parked request it can take out:
    True when the server took it out (answered nil on its own connection,
    never granted after). False when there was nothing to take out (a grant
    on its way), or the server refuses it (then never asked again)."""
    target = withdraw_args(args)
    if target is None or waits.no_withdraw:
        return False
    try:
        return bool(call(client, key, "WARDEN.WITHDRAW", *target, timeout=1.0))
    except ResponseError as error:
        waits.no_withdraw = refuses_command(error)
        return False
    except Exception:
        return False


def _unblock_works(client: Any, key: str, waits: WaitPool) -> bool:
    """Whether ``CLIENT UNBLOCK`` takes a warden waiter out on this server,
    learnt once from ``INFO server`` (False when that fails: the connection
    is closed instead). Never sent to older servers: Redis 7.0 crashes on
    ``CLIENT UNBLOCK`` of a client held back by ``CLIENT PAUSE``."""
    if waits.unblock_works is None:
        try:
            info = call(client, key, "INFO", "server", timeout=1.0)
        except Exception:
            return False
        waits.unblock_works = unblocks_module_waiters(info)
    return waits.unblock_works


def _abort(
    client: Any,
    key: str,
    args: list[Any],
    pinned: Pinned,
    client_id: Optional[int],
    lost: Lost,
) -> bool:
    """Take a parked waiter out of the server's queue: True once its reply was
    read (a grant given back, the connection kept); False: it is still
    unanswered (the caller closes the connection and gives back what it may
    hold)."""
    waits, connection = pinned.waits, pinned.connection
    assert waits is not None
    unblocked: Any = None
    if connection.can_read(timeout=0):
        pass  # answered meanwhile: read below
    elif _withdrawn(client, key, waits, args):
        unblocked = 1  # answered nil on its connection, as an unblock is
    elif client_id is not None and _unblock_works(client, key, waits):
        try:
            unblocked = call(client, key, "CLIENT", "UNBLOCK", client_id, timeout=1.0)
        except Exception:
            unblocked = None
    due = reply_due(unblocked, waits.unblock_works)
    if due is not None and connection.can_read(timeout=due):
        try:
            reply = connection.read_response()
        except ResponseError:
            return True
        except Exception:
            return False
        if reply is not None:
            lost(reply)
        return True
    return False
