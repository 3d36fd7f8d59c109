"""How warden's commands reach the server from an asyncio client: the same
rules as the sync side (``warden._connection``): a connection checked out for
the request, its own read timeout, no retries, a failed request closes its
connection, a pool of its own beside the client's for requests that wait
server-side (on a cluster, one per node), and warden's requests wait for a
free connection of either pool (within their caller's deadline) rather than
raise redis-py's ``MaxConnectionsError``.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from collections.abc import Awaitable
from typing import Any, Callable, Optional

from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import BlockingConnectionPool, ConnectionPool
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import _core
from .._core import (
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

# read_response(timeout=t) answers None when t passes: the outer wait_for owns the deadline.
_NO_READ_TIMEOUT = 10.0**9


_background: set[asyncio.Future[Any]] = set()


def in_background(coroutine: Any) -> asyncio.Future[Any]:
    """Run ``coroutine`` as a task of its own, referenced until done."""
    task: asyncio.Future[Any] = asyncio.ensure_future(coroutine)
    _background.add(task)
    task.add_done_callback(_background.discard)
    return task


async def to_the_end(coroutine: Awaitable[None]) -> None:
    """Run ``coroutine`` (a give-back) to its end even if the calling task is
    cancelled meanwhile: the cancel goes on at once, the give-back in the
    background."""
    await asyncio.shield(in_background(coroutine))


def cancels() -> int:
    """How many cancels of the calling task were requested (0 outside a task)."""
    task = asyncio.current_task()
    return task.cancelling() if task is not None else 0


def swallowed(since: int) -> bool:
    """Whether a cancel requested since ``cancels()`` was ``since`` was never
    raised. Right after an await returns, a cancel requested meanwhile has
    been raised, unless someone caught it: before Python 3.12,
    ``asyncio.wait_for`` (redis-py's send on a connection with a
    ``socket_timeout``) returns its result instead of raising a cancel that
    arrives as the send completes (CPython gh-86296). Counted from the start
    of a request, so a task already cancelled (cleanup code) is not
    cancelled again. A cancel still pending (requested while the task ran:
    raised at its next suspension) is not one."""
    task = asyncio.current_task()
    if task is None or task.cancelling() <= since:
        return False
    return not getattr(task, "_must_cancel", False)


def raise_a_dropped_cancel(since: int) -> None:
    """Raise the cancel ``swallowed`` finds, once a request's effects are
    accounted for."""
    if swallowed(since):
        raise asyncio.CancelledError()


class DeadlinePassed(Exception):
    """No connection was free before the caller's deadline."""


class Slots:
    """At most ``max_connections`` of warden's requests at once on one pool,
    so that the pool never raises for them: the others wait for a slot."""

    def __init__(self, count: int) -> None:
        self.free = asyncio.Semaphore(count)

    async def take(self, deadline: Optional[Deadline]) -> bool:
        """False when ``deadline`` passes first (without one: waits)."""
        left = None if deadline is None else deadline.remaining()
        if left is None:
            await self.free.acquire()
            return True
        if not self.free.locked():
            await self.free.acquire()  # a free slot: taken without suspending
            return True
        # asyncio.wait, not wait_for: a slot taken as the timeout fires (or as
        # the caller is cancelled) is given back, never lost.
        taking = asyncio.ensure_future(self.free.acquire())
        try:
            await asyncio.wait({taking}, timeout=left)
        except BaseException:
            self._drop(taking)
            raise
        if taking.done() and not taking.cancelled():
            return True
        self._drop(taking)
        return False

    def _drop(self, taking: asyncio.Future[Any]) -> None:
        taking.cancel()
        taking.add_done_callback(
            lambda t: None if t.cancelled() or t.exception() else self.free.release()
        )

    def give(self) -> None:
        self.free.release()


def _slots_for(pool: Any) -> Optional[Slots]:
    count = getattr(pool, "max_connections", None)
    return Slots(count) if isinstance(count, int) and 0 < count < 2**31 else None


class WaitPool:
    """The connections of requests that wait server-side beside one pool (or
    cluster node): same settings and bound, connections of their own;
    ``unblock_works`` as in ``warden._connection.WaitPool``."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        if type(pool) in (ConnectionPool, BlockingConnectionPool) or not isinstance(
            pool, ConnectionPool
        ):
            # A plain pool, or a cluster node (its own bound, no pool object);
            # plain: the slots bound it, and wait only as long as their caller may.
            kwargs = dict(pool.connection_kwargs)
            for client_side_cache in ("cache", "cache_config"):
                kwargs.pop(client_side_cache, None)
            self.pool = ConnectionPool(
                connection_class=pool.connection_class,
                max_connections=pool.max_connections,
                **kwargs,
            )
            if isinstance(pool, ConnectionPool):
                also_on_disconnect(pool, self.close)
        # else: a pool of another class (Sentinel's), used as it is
        self.slots = _slots_for(self.pool)
        # Learnt once from INFO server: whether CLIENT UNBLOCK takes a module's
        # waiter out (Redis >= 7.4, Valkey >= 8); never sent elsewhere.
        self.unblock_works: Optional[bool] = None
        # Set once ``WARDEN.WITHDRAW`` was refused (a module before 1.1.0, an
        # ACL): waiters are taken out by ``CLIENT UNBLOCK`` or a close then.
        self.no_withdraw = False
        # The requests parked in the server on this pool's connections.
        self.waiting: set[Pinned] = set()

    async def close(self, inuse_connections: bool = True) -> None:
        """As ``warden._connection.WaitPool.close``: close the connections as
        the client's pool was; parked requests end with ``ClientClosed``."""
        if inuse_connections:
            for pinned in list(self.waiting):
                pinned.client_closed = True
                if pinned.reading is not None:
                    pinned.reading.cancel()  # redis-py closes its connection
        await self.pool.disconnect(inuse_connections)


_wait_pools: weakref.WeakKeyDictionary[Any, WaitPool] = weakref.WeakKeyDictionary()
_gates: weakref.WeakKeyDictionary[Any, Optional[Slots]] = weakref.WeakKeyDictionary()
# A cluster's nodes cannot be weakly referenced: their pools hang on the client.
_node_wait_pools: weakref.WeakKeyDictionary[Any, dict[str, WaitPool]] = weakref.WeakKeyDictionary()


def node_wait_pool(client: Any, node: Any) -> WaitPool:
    """The wait pool beside one cluster node's connections."""
    pools = _node_wait_pools.setdefault(client, {})
    waits = pools.get(node.name)
    if waits is None:
        waits = pools[node.name] = WaitPool(node)
    return waits


def wait_pool(pool: Any) -> WaitPool:
    """The pool that requests waiting server-side use beside ``pool`` (made once)."""
    waits = _wait_pools.get(pool)
    if waits is None:
        waits = _wait_pools[pool] = WaitPool(pool)
    return waits


def _gate(pool: Any) -> Optional[Slots]:
    if pool not in _gates:
        _gates[pool] = _slots_for(pool)
    return _gates[pool]


class Pinned:
    """One connection to the server that owns ``key``, checked out until closed."""

    def __init__(self, client: Any, key: str) -> None:
        self.client = client
        self.key = key
        self.node: Any = None
        self.pool: Any = None
        self.waits: Optional[WaitPool] = None
        self.slots: Optional[Slots] = None
        self.connection: Any = None
        self.broken = False
        # The read of a request parked in the server; ``client_closed`` is set
        # when the client is closed meanwhile.
        self.reading: Optional[asyncio.Future[Any]] = None
        self.client_closed = False

    @classmethod
    async def open(
        cls, client: Any, key: str, waits: bool = False, deadline: Optional[Deadline] = None
    ) -> Pinned:
        """Check a connection out (``DeadlinePassed`` if none is free before
        ``deadline``)."""
        pinned = cls(client, key)
        if isinstance(client, RedisCluster):
            node: Any = client.get_node_from_key(key)
            if waits:
                pinned.waits = node_wait_pool(client, node)
            else:
                pinned.node = node
                pinned.connection = node.acquire_connection()
                return pinned
        elif waits:
            pinned.waits = wait_pool(client.connection_pool)
        if pinned.waits is not None:
            pinned.pool, pinned.slots = pinned.waits.pool, pinned.waits.slots
        else:
            pinned.pool = client.connection_pool
            pinned.slots = _gate(pinned.pool)
        if pinned.slots is not None and not await pinned.slots.take(deadline):
            raise DeadlinePassed()
        try:
            try:
                pinned.connection = await pinned.pool.get_connection()
            except TypeError:  # redis-py < 5.3 wants a command name
                pinned.connection = await pinned.pool.get_connection("_")
        except BaseException:
            if pinned.slots is not None:
                pinned.slots.give()
            raise
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
        except ResponseError as error:
            raise hinted(error) from None  # the connection is fine: the server answered
        except BaseException:
            self.broken = True
            raise

    async def close(self) -> None:
        connection, self.connection = self.connection, None
        if connection is None:
            return
        try:
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
        finally:
            if self.slots is not None:
                self.slots.give()

    def closing(self) -> Awaitable[None]:
        """``close``, awaited in place when a cancel cannot cut it short (no
        task, no loop turn): redis-py's ``release`` keeps a connection that
        goes back to its pool even when its caller is cancelled meanwhile
        (and never suspends while its lock is free). A broken connection is
        closed in a task of its own, which a cancel does not stop."""
        if self.broken:
            return asyncio.shield(self.close())
        return self.close()

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
    deadline: Optional[Deadline] = None,
) -> Any:
    """One command about ``key`` on a connection of its own, never retried;
    a cluster redirect (the command did not run) refreshes the slot map once.
    ``waits``: the command may wait server-side (wait pool).
    ``DeadlinePassed`` if no connection is free before ``deadline``."""
    for attempt in (0, 1):
        async with await Pinned.open(client, key, waits, deadline) as pinned:
            try:
                return await pinned.call(*args, timeout=timeout, on_sent=on_sent)
            except ResponseError as error:
                if attempt or not is_redirect(error) or not isinstance(client, RedisCluster):
                    raise
        await client.nodes_manager.initialize()
    raise AssertionError("unreachable")


# As ``warden._connection.Lost``: a reply the caller will not get, or None.
Lost = Callable[[Any], Awaitable[None]]


async def try_call(client: Any, key: str, args: list[Any], deadline: Deadline, late: Lost) -> Any:
    """As ``warden._connection.try_call``, for asyncio: the reply of ``args``
    within ``deadline``, else ``DeadlinePassed``; a reply still due then (or
    when the caller is cancelled) is read in the background and a grant
    handed to ``late``; ``late(None)`` when the request failed in flight."""
    for attempt in (0, 1):
        pinned = await Pinned.open(client, key, False, deadline)
        handed_off = False
        sent = False
        reply: Any = None  # the reply about to be returned
        try:
            connection = pinned.connection
            try:
                await connection.connect()  # a failure here sent nothing
                sent = True  # a cancel inside the send may leave it sent
                await connection.send_command(*args)
                reading = asyncio.ensure_future(connection.read_response(timeout=_NO_READ_TIMEOUT))
                try:
                    await asyncio.wait({reading}, timeout=deadline.remaining())
                except BaseException:  # cancelled: the reply is read in the background
                    handed_off = True
                    in_background(_read_late(pinned, reading, late))
                    raise
                if not reading.done():
                    # The server answers late (stalled, paused): the caller
                    # times out now; a grant is given back once read.
                    handed_off = True
                    in_background(_read_late(pinned, reading, late))
                    raise DeadlinePassed()
                reply = reading.result()
                return reply
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
                    await pinned.closing()
                except BaseException:
                    # Cancelled while its connection goes back: the reply
                    # read is not returned, so a grant in it is given back.
                    if reply is not None:
                        in_background(late(reply))
                    raise
                if pinned.broken and sent:
                    in_background(late(None))
        await client.nodes_manager.initialize()
    raise AssertionError("unreachable")


# How long a late reply is waited for in the background: past that the
# connection is closed and whatever it may hold is given back.
LATE_REPLY_SECONDS = 30.0


async def _read_late(pinned: Pinned, reading: asyncio.Future[Any], late: Lost) -> None:
    try:
        await asyncio.wait({reading}, timeout=LATE_REPLY_SECONDS)
        if reading.done() and not reading.cancelled():
            error = reading.exception()
            if error is None:
                reply = reading.result()
                if reply is not None:
                    await late(reply)
                return
            if isinstance(error, ResponseError):
                return  # refused: nothing held
        pinned.broken = True
        if not reading.done():
            reading.cancel()  # redis-py closes a connection whose read is cancelled
            try:
                await reading
            except BaseException:
                pass
    finally:
        await pinned.close()
    await late(None)


async def blocking_call(
    client: Any,
    key: str,
    args: list[Any],
    deadline: Deadline,
    extra: list[Any],
    lost: Lost,
    withdraw: bool = True,
) -> Any:
    """As ``warden._connection.blocking_call``, for asyncio: send ``args``
    with ``WAIT`` (what is left of ``deadline`` less a margin) and ``extra``
    on a connection of the wait pool; the reply, or None when the deadline
    passes first. Past the deadline, or when the calling task is cancelled,
    the waiter leaves the server's queue at once (``WARDEN.WITHDRAW`` for a
    lock, read-write lock or semaphore request, else ``CLIENT UNBLOCK``, or
    closing its connection where neither works); a grant that raced it
    goes to ``lost`` (given back), and the cancel goes on."""
    since = cancels()
    try:
        pinned = await Pinned.open(client, key, waits=True, deadline=deadline)
    except DeadlinePassed:
        return None
    connection = pinned.connection
    reading: Optional[asyncio.Future[Any]] = None
    client_id: Optional[int] = None
    note: Optional[object] = None
    # True from the send until the acquire's reply is read: the server may
    # grant this connection what its caller never sees.
    unanswered = False
    reply: Any = None
    aborting: Optional[asyncio.Future[Any]] = None
    waits = pinned.waits
    assert waits is not None
    waits.waiting.add(pinned)
    try:
        wait = deadline.wait_ms()
        if wait is None:
            return None
        try:
            if not connection.is_connected:
                await connection.connect()
            # As in warden._connection: the health check first (it may reconnect).
            await connection.check_health()
            known, client_id = _core.known_client_id(connection, connection._writer)
            request = (*args, "WAIT", wait, *extra)
            # Parked in the server's queue from the send to the end of the wait:
            # another acquire of this client on the key skips its try. Noted
            # before the send: the server may queue it before the send returns
            # (a yield inside it), and a try then would be answered nil.
            note = _core.parked(client, args[0], key)
            unanswered = True  # a cancel inside the send may leave it sent
            # CLIENT ID rides along the first wait of a connection (no round
            # trip of its own): the id to unblock, kept while its link lives.
            await connection.send_packed_command(
                connection.pack_commands([request] if known else [("CLIENT", "ID"), request]),
                check_health=False,
            )
            if not known:
                try:
                    client_id = int(await connection.read_response())
                except ResponseError:  # an ACL without CLIENT: close to abort instead
                    client_id = None
                _core.remember_client_id(connection, connection._writer, client_id)
            # The read runs as a task of its own: a cancel of the caller leaves
            # it intact, so the waiter's nil can be read and the connection kept.
            reading = asyncio.ensure_future(connection.read_response(timeout=_NO_READ_TIMEOUT))
            pinned.reading = reading
            if swallowed(since):
                # A cancel dropped in the send: out of the queue as for one
                # that lands while parked (below), not after the whole wait.
                raise asyncio.CancelledError()
            await asyncio.wait({reading}, timeout=deadline.remaining())
            _core.unparked(client, args[0], key, note)
            if pinned.client_closed:
                raise ClientClosed("the client was closed while this request waited")
            if not reading.done():
                aborting = in_background(
                    _abort(client, key, args if withdraw else [], pinned, reading, client_id, lost)
                )
                await asyncio.shield(aborting)
                return None
            reply = reading.result()
            unanswered = False
        except ResponseError as error:
            unanswered = False
            raise hinted(error) from None
        except BaseException as error:
            if pinned.client_closed:  # its connection was closed under it
                if isinstance(error, Exception):
                    raise ClientClosed("the client was closed while this request waited") from None
            elif aborting is None and reading is not None and not reading.done():
                # Cancelled while parked: out of the queue now, the cancel goes
                # on at once even if cancelled again meanwhile.
                aborting = in_background(
                    _abort(client, key, args if withdraw else [], pinned, reading, client_id, lost)
                )
                try:
                    await asyncio.shield(aborting)
                except BaseException:
                    pass
            raise
        if reply is not None and deadline.passed():
            await to_the_end(lost(reply))  # the caller has given up: never a late grant
            reply = None
        return reply
    finally:
        if note is not None:
            _core.unparked(client, args[0], key, note)
        waits.waiting.discard(pinned)
        if aborting is None:
            try:
                if unanswered:
                    await asyncio.shield(
                        in_background(
                            _let_go(client, key, pinned, reading, client_id, lost, unanswered)
                        )
                    )
                else:  # answered (or never sent): the connection goes back
                    await pinned.closing()
            except BaseException:
                # Cancelled after the reply was read: the caller never sees it.
                if not unanswered and reply is not None:
                    in_background(lost(reply))
                raise


async def _withdrawn(client: Any, key: str, waits: WaitPool, args: list[Any]) -> bool:
    """As ``warden._connection._withdrawn``: ``WARDEN.WITHDRAW key owner``,
    True when the server took the parked request out."""
    target = withdraw_args(args)
    if target is None or waits.no_withdraw:
        return False
    try:
        return bool(await call(client, key, "WARDEN.WITHDRAW", *target, timeout=1.0))
    except ResponseError as error:
        waits.no_withdraw = refuses_command(error)
        return False
    except Exception:
        return False


async def _unblock_works(client: Any, key: str, waits: WaitPool) -> bool:
    """As ``warden._connection._unblock_works``."""
    if waits.unblock_works is None:
        try:
            info = await call(client, key, "INFO", "server", timeout=1.0)
        except Exception:
            return False
        waits.unblock_works = unblocks_module_waiters(info)
    return waits.unblock_works


async def _abort(
    client: Any,
    key: str,
    args: list[Any],
    pinned: Pinned,
    reading: asyncio.Future[Any],
    client_id: Optional[int],
    lost: Lost,
) -> None:
    """Take a parked waiter out of the server's queue, then let go of its
    connection (``_let_go``): kept once its reply was read (a grant in it
    given back), else closed."""
    waits = pinned.waits
    assert waits is not None
    answered = False
    try:
        unblocked: Any = None
        if reading.done():
            pass  # answered meanwhile
        elif await _withdrawn(client, key, waits, args):
            unblocked = 1  # answered nil on its connection, as an unblock is
        elif client_id is not None and await _unblock_works(client, key, waits):
            try:
                unblocked = await call(client, key, "CLIENT", "UNBLOCK", client_id, timeout=1.0)
            except Exception:
                unblocked = None
        due = reply_due(unblocked, waits.unblock_works)
        if due and not reading.done():
            await asyncio.wait({reading}, timeout=due)
        if reading.done() and not reading.cancelled():
            error = reading.exception()
            if error is None:
                answered = True
                reply = reading.result()
                if reply is not None:
                    await lost(reply)
            else:
                answered = isinstance(error, ResponseError)  # refused: nothing held
    finally:
        await _let_go(client, key, pinned, reading, client_id, lost, not answered)


async def _let_go(
    client: Any,
    key: str,
    pinned: Pinned,
    reading: Optional[asyncio.Future[Any]],
    client_id: Optional[int],
    lost: Lost,
    unanswered: bool,
) -> None:
    """Give the waiter connection back to its pool; ``unanswered`` (the server
    may still grant it): close it, and give back what it may hold once the
    server has dropped it, so a grant made until then is covered too."""
    if unanswered:
        pinned.broken = True
        if reading is not None and not reading.done():
            reading.cancel()  # redis-py closes a connection whose read is cancelled
            try:
                await reading
            except BaseException:
                pass
    await pinned.close()
    if unanswered:
        gone = await _until_gone(client, key, client_id)
        await lost(None)
        if not gone:  # not confirmed: once more, a round trip later
            await lost(None)


async def _until_gone(client: Any, key: str, client_id: Optional[int]) -> bool:
    """As ``warden._connection._until_gone``: True once the server no longer
    lists the closed connection ``client_id``."""
    if client_id is None:
        return False
    for pause in gone_pauses():
        try:
            if not await call(client, key, "CLIENT", "LIST", "ID", client_id, timeout=1.0):
                return True
        except Exception:
            return False
        await asyncio.sleep(pause)
    return False
