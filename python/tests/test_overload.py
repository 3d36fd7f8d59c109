"""The overload rule, sync and asyncio: an acquire tries first on the client's
pool, waits only within its deadline (WAIT = the time left), never raises a
pool error with many waiters, takes an aborted waiter out at once and never
hands a grant to a caller past its deadline."""

from __future__ import annotations

import asyncio
import re
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.connection
import redis.connection
from redis.exceptions import ResponseError
from servers import Server

import warden
import warden._holder
import warden.asyncio
import warden.asyncio._holder
from warden import _core


def sem_info(r: redis.Redis, name: str) -> dict[str, Any]:
    reply = r.execute_command("SEM.INFO", name)
    if reply is None:
        return {}
    items = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2])
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in items}


def lock_waiters(r: redis.Redis, name: str) -> int:
    reply = r.execute_command("LOCK.INFO", name)
    items = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2])
    return int({k.decode() if isinstance(k, bytes) else k: v for k, v in items}["waiters"])


def wait_for(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def hold_until_a_waiter_queues(watcher: redis.Redis, name: str) -> None:
    """Take the one permit of ``name``; give it back once a waiter queues."""
    watcher.execute_command("SEM.ACQUIRE", name, "holder", 30_000, "LIMIT", 1)
    threading.Timer(
        0.0,
        lambda: (
            wait_for(lambda: sem_info(watcher, name).get("waiters") == 1),
            watcher.execute_command("SEM.RELEASE", name, "holder"),
        ),
    ).start()


async def async_wait_for(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


def unblocks_waiters(r: redis.Redis) -> bool:
    """CLIENT UNBLOCK takes a warden waiter out: Redis >= 7.4, Valkey >= 8."""
    server = r.info("server")
    if "valkey_version" in server:
        return tuple(map(int, str(server["valkey_version"]).split(".")[:2])) >= (8, 0)
    return tuple(map(int, str(server["redis_version"]).split(".")[:2])) >= (7, 4)


def clients(r: redis.Redis) -> int:
    return int(r.info("clients")["connected_clients"])


@pytest.fixture
def watcher(server: Server) -> Iterator[redis.Redis]:
    r = server.client()
    r.flushall()
    yield r
    r.close()


# --- the deadline ------------------------------------------------------------


def test_wait_ms_is_the_time_left_less_a_margin(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(_core.time, "monotonic", lambda: now[0])
    cases = [  # (deadline s, s elapsed before the send, WAIT sent)
        (None, 0.0, 0),  # no deadline: forever
        (1.0, 0.0, 995),  # margin capped at 5 ms
        (0.05, 0.0, 45),
        (0.05, 0.02, 27),  # 30 ms left, margin 3 ms
        (0.05, 0.045, 4),  # 5 ms left, margin 1 ms
        (0.05, 0.0495, 1),  # never WAIT 0 for a finite deadline
        (0.05, 0.05, None),  # nothing left: nothing is sent
        (0.05, 0.2, None),
    ]
    for seconds, elapsed, wait in cases:
        now[0] = 100.0
        deadline = _core.Deadline(seconds)
        now[0] += elapsed
        assert deadline.wait_ms() == wait, (seconds, elapsed)


def monitored(server: Server) -> tuple[list[str], threading.Event, threading.Thread]:
    """The commands the server runs, as MONITOR lines, until ``stop`` is set
    and a ``PING`` follows (the caller sends one after the stop: every line
    before it is read, however far behind this thread is)."""
    lines: list[str] = []
    stop = threading.Event()
    ready = threading.Event()

    def run() -> None:
        with server.client().monitor() as m:
            ready.set()
            while True:
                line = m.next_command()["command"]
                if stop.is_set() and line == "PING":
                    return
                lines.append(line)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    ready.wait(5)
    time.sleep(0.05)
    return lines, stop, t


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_the_wait_sent_is_what_is_left_after_waiting_for_a_connection(
    server: Server, watcher: redis.Redis, flavour: str
) -> None:
    # A pool of 1: the second waiter gets its wait connection only when the
    # first is granted, 300 ms into its own 600 ms, and sends what is left.
    watcher.execute_command("SEM.ACQUIRE", "left", "holder", 30_000, "LIMIT", 1)
    # The holder lets go 300 ms after the second call starts (not before it:
    # a slow machine must not shorten the second caller's wait for its connection).
    release = threading.Timer(0.3, lambda: watcher.execute_command("SEM.RELEASE", "left", "holder"))
    lines, stop, t = monitored(server)
    results: list[Any] = []

    if flavour == "sync":
        r = server.client(max_connections=1)

        def one(seconds: float) -> None:
            sem = warden.Semaphore(r, "left", 1, timeout=0.05)
            results.append(sem.acquire(blocking_timeout=seconds))

        first = threading.Thread(target=one, args=(10,))
        first.start()
        wait_for(lambda: sem_info(watcher, "left").get("waiters") == 1)
        release.start()
        one(0.6)
        first.join(5)
    else:

        async def main() -> None:
            r = server.async_client(max_connections=1)

            async def one(seconds: float) -> None:
                sem = warden.asyncio.Semaphore(r, "left", 1, timeout=0.05)
                results.append(await sem.acquire(blocking_timeout=seconds))

            first = asyncio.ensure_future(one(10))
            await async_wait_for(lambda: sem_info(watcher, "left").get("waiters") == 1)
            release.start()
            await one(0.6)
            await first
            await r.aclose()

        asyncio.run(main())
    stop.set()
    watcher.ping()  # the monitor reads up to it
    t.join(5)
    waits = [int(m.group(1)) for m in map(re.compile(r"WAIT (\d+)").search, lines) if m]
    assert results == [True, True] or results == [True, False]
    assert waits[0] >= 9_000
    if len(waits) > 1:
        # At most 600 - 300 (its wait for a connection) - the margin: counted from the call.
        assert 1 <= waits[1] <= 300
    else:
        # A machine so busy that the connection came after the deadline: the
        # second call sent no wait at all, and says it got nothing.
        assert results == [True, False]


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_no_grant_reaches_a_caller_past_its_deadline(
    watcher: redis.Redis, server: Server, flavour: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The grant arrives, but the deadline has passed by then (as a busy
    # machine would make it): it is given back and the acquire answers False.
    watcher.execute_command("SEM.ACQUIRE", "late", "holder", 30_000, "LIMIT", 1)
    real = _core.Deadline.passed
    monkeypatch.setattr(_core.Deadline, "passed", lambda self: True)
    threading.Timer(0.2, lambda: watcher.execute_command("SEM.RELEASE", "late", "holder")).start()
    if flavour == "sync":
        got = warden.Semaphore(server.client(), "late", 1, timeout=30).acquire(blocking_timeout=5)
    else:

        async def main() -> bool:
            r = server.async_client()
            sem = warden.asyncio.Semaphore(r, "late", 1, timeout=30)
            try:
                return await sem.acquire(blocking_timeout=5)
            finally:
                await r.aclose()

        got = asyncio.run(main())
    monkeypatch.setattr(_core.Deadline, "passed", real)
    assert got is False
    wait_for(lambda: sem_info(watcher, "late") == {})  # given back: nothing held


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_a_try_answered_after_the_deadline_is_given_back(
    watcher: redis.Redis, server: Server, flavour: str
) -> None:
    # The semaphore is free, but the server holds the try back (CLIENT PAUSE
    # WRITE, as a failover does) far past the caller's deadline: the acquire
    # answers False, and the grant the server makes later is given back.
    r = server.client()
    r.ping()  # a pooled connection, opened before the pause
    watcher.execute_command("CLIENT", "PAUSE", 1000, "WRITE")
    try:
        if flavour == "sync":
            got = warden.Semaphore(r, "stalled", 1, timeout=30).acquire(blocking_timeout=0.05)
        else:

            async def main() -> bool:
                ar = server.async_client()
                await ar.ping()
                sem = warden.asyncio.Semaphore(ar, "stalled", 1, timeout=30)
                got = await sem.acquire(blocking_timeout=0.05)
                # The loop must outlive the server's late answer to give it back.
                await async_wait_for(lambda: watcher.exists("stalled") == 0)
                await ar.aclose()
                return got

            got = asyncio.run(main())
    finally:
        watcher.execute_command("CLIENT", "UNPAUSE")
    assert got is False
    wait_for(lambda: sem_info(watcher, "stalled") == {})  # given back: nothing held
    r.close()


# --- many waiters, the default pool -------------------------------------------


def test_300_threads_waiting_on_the_default_pool_raise_nothing(
    server: Server, watcher: redis.Redis
) -> None:
    r = server.client()  # redis-py's default pool: 100 connections
    watcher.execute_command("SEM.ACQUIRE", "many", "holder", 30_000, "LIMIT", 1)
    errors: list[BaseException] = []
    granted: list[bool] = []
    go = threading.Barrier(301)

    def one() -> None:
        go.wait()
        try:
            sem = warden.Semaphore(r, "many", 1, timeout=10)
            if sem.acquire(blocking_timeout=1):
                granted.append(True)
                sem.release()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=one) for _ in range(300)]
    for t in threads:
        t.start()
    go.wait()
    time.sleep(0.3)
    watcher.execute_command("SEM.RELEASE", "many", "holder")
    for t in threads:
        t.join(30)
    assert errors == []
    assert granted  # the released permit went to a waiter, and on
    wait_for(lambda: sem_info(watcher, "many") == {})
    r.close()


async def test_300_tasks_waiting_on_the_default_pool_raise_nothing(
    server: Server, watcher: redis.Redis
) -> None:
    r = server.async_client()  # redis-py's default pool: 100 connections
    watcher.execute_command("LOCK.ACQUIRE", "many", "holder", 30_000)

    async def one() -> bool:
        lock = warden.asyncio.Lock(r, "many", timeout=10)
        if await lock.acquire(blocking_timeout=1):
            await lock.release()
            return True
        return False

    tasks = [asyncio.ensure_future(one()) for _ in range(300)]
    await asyncio.sleep(0.3)
    watcher.execute_command("LOCK.RELEASE", "many", "holder")
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert [e for e in results if isinstance(e, BaseException)] == []
    assert any(results)
    assert not watcher.exists("many")
    await r.aclose()


# --- the fast path --------------------------------------------------------------


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
def test_a_free_acquire_opens_no_waiter_connection(
    server: Server, watcher: redis.Redis, kind: str
) -> None:
    before = clients(watcher)
    r = server.client()
    for _ in range(3):
        holder: Any = (
            warden.Lock(r, "free", timeout=10)
            if kind == "lock"
            else warden.Semaphore(r, "free", 2, timeout=10)
        )
        assert holder.acquire(blocking_timeout=5)
        holder.release()
    assert clients(watcher) == before + 1  # one ordinary connection, reused
    r.close()


async def test_a_free_acquire_opens_no_waiter_connection_asyncio(
    server: Server, watcher: redis.Redis
) -> None:
    before = clients(watcher)
    r = server.async_client()
    for _ in range(3):
        sem = warden.asyncio.Semaphore(r, "free", 2, timeout=10)
        assert await sem.acquire(blocking_timeout=5)
        await sem.release()
    assert clients(watcher) == before + 1
    await r.aclose()


# --- aborts -----------------------------------------------------------------------


@pytest.mark.parametrize("withdraw", [True, False], ids=["withdraw", "acl-denies-withdraw"])
async def test_a_cancelled_wait_leaves_no_waiter_and_no_grant(
    server: Server, watcher: redis.Redis, withdraw: bool
) -> None:
    # WARDEN.WITHDRAW takes the waiter out on every server, and its
    # connection is kept; where the user may not send it (an ACL, as with a
    # module before 1.1.0), CLIENT UNBLOCK does on Redis >= 7.4 and Valkey >=
    # 8, else the connection is closed.
    watcher.execute_command(
        "ACL", "SETUSER", "nowithdraw", "on", ">pw", "~*", "&*", "+@all", "-warden.withdraw"
    )
    user = {} if withdraw else {"username": "nowithdraw", "password": "pw"}
    r = server.async_client(**user)
    watcher.execute_command("SEM.ACQUIRE", "cancel", "holder", 30_000, "LIMIT", 1)
    # Opened beforehand: the connection counts below see only the waiter's.
    await warden.asyncio.Semaphore(r, "other", 1, timeout=1).acquire()
    sem = warden.asyncio.Semaphore(r, "cancel", 1, timeout=30)
    task = asyncio.ensure_future(sem.acquire(blocking_timeout=30))
    await async_wait_for(lambda: sem_info(watcher, "cancel").get("waiters") == 1)
    parked = clients(watcher)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sem_info(watcher, "cancel")["waiters"] == 0  # out at once, not at its WAIT
    if withdraw or unblocks_waiters(watcher):
        assert clients(watcher) == parked  # answered nil: its connection kept
    else:
        wait_for(lambda: clients(watcher) == parked - 1)  # closed
    watcher.execute_command("SEM.RELEASE", "cancel", "holder")
    assert sem_info(watcher, "cancel") == {}  # nobody was granted it
    await r.aclose()


def client_id_calls(r: redis.Redis) -> int:
    return int(r.info("commandstats").get("cmdstat_client|id", {}).get("calls", 0))


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
@pytest.mark.parametrize("withdraw", [True, False], ids=["withdraw", "acl-denies-withdraw"])
def test_a_wait_connection_asks_its_client_id_once_per_socket(
    server: Server,
    watcher: redis.Redis,
    flavour: str,
    withdraw: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # CLIENT ID (the id to unblock) goes with the first wait of a connection
    # only: a second wait on the same socket uses the id it learnt, and a new
    # socket (the server closed the old one) asks again. Each wait that
    # the client gives up on (the server's WAIT is longer, as a server busy
    # elsewhere would) is out of the queue at once, by WITHDRAW or by CLIENT
    # UNBLOCK of that id (kept connection), else by closing it.
    monkeypatch.setattr(_core.Deadline, "wait_ms", lambda self: 30_000)
    watcher.execute_command(
        "ACL", "SETUSER", "nowithdraw", "on", ">pw", "~*", "&*", "+@all", "-warden.withdraw"
    )
    user = {} if withdraw else {"username": "nowithdraw", "password": "pw"}
    kept = withdraw or unblocks_waiters(watcher)
    watcher.execute_command("LOCK.ACQUIRE", "ids", "holder", 30_000)
    watcher.config_resetstat()
    asked: list[int] = []

    def after_round() -> None:
        assert lock_waiters(watcher, "ids") == 0  # out at once, not at its WAIT
        asked.append(client_id_calls(watcher))

    def kill_the_clients() -> None:
        # The server closes the wait connection (the one that last sent the WAIT).
        for line in watcher.execute_command("CLIENT", "LIST").decode().splitlines():
            fields = dict(f.split("=", 1) for f in line.split(" ") if "=" in f)
            if fields.get("cmd") == "lock.acquire":
                watcher.execute_command("CLIENT", "KILL", "ID", fields["id"])

    if flavour == "sync":
        r = server.client(max_connections=1, **user)  # one wait connection, reused
        lock = warden.Lock(r, "ids", timeout=10)
        for round in range(3):
            if round == 2:
                kill_the_clients()
            assert lock.acquire(blocking_timeout=0.3) is False
            after_round()
        r.close()
    else:

        async def main() -> None:
            r = server.async_client(max_connections=1, **user)
            lock = warden.asyncio.Lock(r, "ids", timeout=10)
            for round in range(3):
                if round == 2:
                    kill_the_clients()
                assert await lock.acquire(blocking_timeout=0.3) is False
                after_round()
            await r.aclose()

        asyncio.run(main())
    second = 1 if kept else 2  # a closed connection is a new socket
    assert asked == [1, second, second + 1]
    watcher.execute_command("LOCK.RELEASE", "ids", "holder")
    assert not watcher.exists("ids")  # nobody was granted it


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
@pytest.mark.parametrize("where", ["try-free", "try-busy", "wait", "release"])
async def test_a_cancel_a_send_drops_is_raised_once_the_reply_is_in_hand(
    server: Server, watcher: redis.Redis, kind: str, where: str
) -> None:
    # Before Python 3.12, asyncio.wait_for (redis-py's send on a connection
    # with a socket_timeout) returns instead of raising a cancel that arrives
    # as the send completes (CPython gh-86296): the task would go on waiting,
    # be granted, and never see its cancel. Played here exactly as wait_for
    # does it: the cancel lands in the send and is caught there.
    acquire, release = (
        ("LOCK.ACQUIRE", "LOCK.RELEASE") if kind == "lock" else ("SEM.ACQUIRE", "SEM.RELEASE")
    )
    r = server.async_client()
    me = asyncio.current_task()
    assert me is not None
    armed: list[bytes] = []
    send = redis.asyncio.connection.AbstractConnection.send_packed_command

    async def dropping(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
        await send(self, command, *args, **kwargs)
        packed = b"".join(command) if isinstance(command, list) else bytes(command)
        if armed and asyncio.current_task() is me and armed[0] in packed:
            if armed[0] != b"WAIT" or b"WAIT" in packed:
                armed.clear()
                me.cancel()
                try:
                    await asyncio.sleep(0)
                except asyncio.CancelledError:
                    pass  # dropped, as wait_for drops it

    def make() -> Any:
        if kind == "lock":
            return warden.asyncio.Lock(r, "dropped", timeout=30)
        return warden.asyncio.Semaphore(r, "dropped", 1, timeout=30)

    def waiters() -> int:
        if kind == "lock":
            return lock_waiters(watcher, "dropped") if watcher.exists("dropped") else 0
        return int(sem_info(watcher, "dropped").get("waiters", 0))

    def hold_elsewhere() -> None:
        if kind == "lock":
            watcher.execute_command(acquire, "dropped", "holder", 30_000)
        else:
            watcher.execute_command(acquire, "dropped", "holder", 30_000, "LIMIT", 1)

    holder = make()
    if where == "release":
        assert await holder.acquire()
    elif where != "try-free":
        hold_elsewhere()
    armed.append(
        {"try-free": acquire, "try-busy": acquire, "wait": "WAIT", "release": release}[
            where
        ].encode()
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(redis.asyncio.connection.AbstractConnection, "send_packed_command", dropping)
        with pytest.raises(asyncio.CancelledError):
            if where == "release":
                await holder.release()
            else:
                await holder.acquire(blocking_timeout=5)
    me.uncancel()
    assert not armed  # the send it was meant for ran
    assert holder.local.token is None  # nothing held here
    assert waiters() == 0  # out of the queue at once
    if where in ("try-busy", "wait"):
        watcher.execute_command(release, "dropped", "holder")

    async def free() -> bool:
        return not watcher.exists("dropped")

    deadline = time.monotonic() + 5
    while not await free():  # the grant it was not given, given back
        assert time.monotonic() < deadline, "still held"
        await asyncio.sleep(0.01)
    await r.aclose()


async def test_a_cancelled_task_may_still_acquire_and_release_in_its_cleanup(
    server: Server, watcher: redis.Redis
) -> None:
    # A task that was cancelled and caught it (cleanup code) has a cancel
    # count above 0: its later requests are not taken for dropped cancels.
    r = server.async_client()
    me = asyncio.current_task()
    assert me is not None
    me.cancel()
    try:
        await asyncio.sleep(1)
    except asyncio.CancelledError:
        pass
    assert me.cancelling() == 1
    lock = warden.asyncio.Lock(r, "cleanup", timeout=30)
    assert await lock.acquire(blocking_timeout=5)
    await lock.release()
    sem = warden.asyncio.Semaphore(r, "cleanup-sem", 1, timeout=30)
    assert await sem.acquire(blocking_timeout=5)
    await sem.release()
    me.uncancel()
    assert not watcher.exists("cleanup") and not watcher.exists("cleanup-sem")
    await r.aclose()


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_a_health_check_that_reconnects_makes_the_wait_ask_its_id_again(
    server: Server, watcher: redis.Redis, flavour: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # redis-py's health check (a PING past health_check_interval) reconnects
    # a connection whose PING fails: the wait then goes on a new socket, a
    # new client of the server, and must not keep the id it learnt on the
    # old one (an abort would unblock whichever client has that id now).
    monkeypatch.setattr(_core.Deadline, "wait_ms", lambda self: 30_000)
    watcher.execute_command("LOCK.ACQUIRE", "health", "holder", 30_000)
    watcher.config_resetstat()
    armed: list[bool] = []
    asked: list[int] = []
    if flavour == "sync":
        check = redis.connection.AbstractConnection.check_health

        def reconnecting(self: Any) -> None:
            if armed and getattr(self, "_warden_client_id", None):  # the wait's connection
                armed.clear()
                self.disconnect()
                self.connect()
            check(self)

        monkeypatch.setattr(redis.connection.AbstractConnection, "check_health", reconnecting)
        r = server.client(max_connections=1)
        lock = warden.Lock(r, "health", timeout=10)
        for round in range(2):
            armed[:] = [True] if round == 1 else []
            assert lock.acquire(blocking_timeout=0.3) is False
            assert lock_waiters(watcher, "health") == 0
            asked.append(client_id_calls(watcher))
        r.close()
    else:
        acheck = redis.asyncio.connection.AbstractConnection.check_health

        async def areconnecting(self: Any) -> None:
            if armed and getattr(self, "_warden_client_id", None):  # the wait's connection
                armed.clear()
                await self.disconnect()
                await self.connect()
            await acheck(self)

        monkeypatch.setattr(
            redis.asyncio.connection.AbstractConnection, "check_health", areconnecting
        )

        async def main() -> None:
            r = server.async_client(max_connections=1)
            lock = warden.asyncio.Lock(r, "health", timeout=10)
            for round in range(2):
                armed[:] = [True] if round == 1 else []
                assert await lock.acquire(blocking_timeout=0.3) is False
                assert lock_waiters(watcher, "health") == 0
                asked.append(client_id_calls(watcher))
            await r.aclose()

        asyncio.run(main())
    assert asked == [1, 2]  # asked again on the new socket
    watcher.execute_command("LOCK.RELEASE", "health", "holder")
    assert not watcher.exists("health")


async def test_a_cancel_leaves_another_wait_with_the_same_token_queued(
    server: Server, watcher: redis.Redis
) -> None:
    # Two tasks wait with the caller's own token= (the same owner): the
    # cancel of one must not withdraw the other (WARDEN.WITHDRAW takes out
    # every request of an owner, so the client does not send it for token=).
    r = server.async_client()
    watcher.execute_command("LOCK.ACQUIRE", "shared", "holder", 30_000)
    lock = warden.asyncio.Lock(r, "shared", timeout=30)
    first = asyncio.ensure_future(lock.acquire(blocking_timeout=30, token="t"))
    await async_wait_for(lambda: lock_waiters(watcher, "shared") == 1)
    second = asyncio.ensure_future(lock.acquire(blocking_timeout=30, token="t"))
    await async_wait_for(lambda: lock_waiters(watcher, "shared") == 2)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert not second.done()  # still waiting
    watcher.execute_command("LOCK.RELEASE", "shared", "holder")
    assert await asyncio.wait_for(second, 10) is True
    assert watcher.execute_command("LOCK.RELEASE", "shared", "t") == 1  # "t" held it
    await r.aclose()


def test_a_deadline_the_server_misses_takes_the_waiter_out(
    own_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server answers nothing in time (the WAIT it was sent is longer than
    # the caller's deadline, as a server busy elsewhere would): at the
    # deadline the client takes the waiter out itself and answers False.
    watcher = own_server.client()
    watcher.execute_command("LOCK.ACQUIRE", "missed", "holder", 30_000)
    monkeypatch.setattr(_core.Deadline, "wait_ms", lambda self: 30_000)
    r = own_server.client()
    assert warden.Lock(r, "missed", timeout=10).acquire(blocking_timeout=0.2) is False
    wait_for(lambda: lock_waiters(watcher, "missed") == 0)
    watcher.execute_command("LOCK.RELEASE", "missed", "holder")
    assert not watcher.exists("missed")
    r.close()
    watcher.close()


def test_an_abort_while_writes_are_paused_leaves_the_server_up(
    own_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The waiting acquire reaches the server during CLIENT PAUSE WRITE and is
    # held back there, so WITHDRAW finds nothing queued. Redis 7.0 crashes on
    # a CLIENT UNBLOCK naming such a client: the client must not send one
    # where UNBLOCK cannot end a module's wait (it closes the connection).
    watcher = own_server.client()
    watcher.execute_command("LOCK.ACQUIRE", "paused", "holder", 30_000)
    monkeypatch.setattr(_core.Deadline, "wait_ms", lambda self: 30_000)
    send = redis.connection.AbstractConnection.send_packed_command

    def paused_send(self: Any, command: Any, check_health: bool = True) -> None:
        if b"WAIT" in b"".join(command):
            watcher.execute_command("CLIENT", "PAUSE", 1000, "WRITE")
        send(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", paused_send)
    r = own_server.client()
    assert warden.Lock(r, "paused", timeout=10).acquire(blocking_timeout=0.3) is False
    assert watcher.ping()  # still up
    watcher.execute_command("CLIENT", "UNPAUSE")
    wait_for(lambda: lock_waiters(watcher, "paused") == 0)
    watcher.execute_command("LOCK.RELEASE", "paused", "holder")
    assert not watcher.exists("paused")  # nobody was granted it
    r.close()
    watcher.close()


@pytest.mark.parametrize(
    ("info", "works"),
    [
        (b"# Server\r\nredis_version:7.0.15\r\n", False),
        (b"# Server\r\nredis_version:7.2.4\r\n", False),
        (b"# Server\r\nredis_version:7.4.0\r\n", True),
        (b"# Server\r\nredis_version:8.2.3\r\n", True),
        (b"# Server\r\nredis_version:7.2.4\r\nvalkey_version:7.2.9\r\n", False),
        (b"# Server\r\nredis_version:7.2.4\r\nvalkey_version:9.1.2\r\n", True),
        (b"", False),
    ],
)
def test_unblock_is_sent_only_where_it_ends_a_module_wait(info: bytes, works: bool) -> None:
    assert _core.unblocks_module_waiters(info) is works


@pytest.mark.parametrize(
    ("error", "refused"),
    [
        (redis.exceptions.NoPermissionError("this user has no permissions"), True),
        (redis.exceptions.ResponseError("unknown command 'WARDEN.WITHDRAW'"), True),
        (redis.exceptions.ResponseError("BUSY Redis is busy running a script"), False),
        (redis.exceptions.BusyLoadingError("Redis is loading the dataset"), False),
        (redis.exceptions.ResponseError("MOVED 3999 127.0.0.1:6381"), False),
    ],
)
def test_withdraw_is_turned_off_only_when_the_command_is_refused(
    error: Exception, refused: bool
) -> None:
    assert _core.refuses_command(error) is refused


def held_permit(server: Server) -> tuple[redis.Redis, threading.Event, Any]:
    """A watching client, and the only permit of "race", held until
    ``free_the_permit()`` (once; ``freed`` is set then)."""
    watcher = server.client()
    watcher.execute_command("SEM.ACQUIRE", "race", "holder", 30_000, "LIMIT", 1)
    freed = threading.Event()

    def free_the_permit() -> None:
        if not freed.is_set():
            freed.set()
            watcher.execute_command("SEM.RELEASE", "race", "holder")

    return watcher, freed, free_the_permit


@pytest.mark.parametrize("withdraw", [True, False], ids=["withdraw", "no-withdraw"])
@pytest.mark.parametrize("moment", ["local deadline", "interrupt inside the send"])
def test_a_grant_racing_an_aborted_wait_is_given_back(
    own_server: Server, monkeypatch: pytest.MonkeyPatch, moment: str, withdraw: bool
) -> None:
    # The only permit is freed while the waiter is being taken out: the
    # server grants it to the waiter before it drops the connection. The
    # grant must be given back, whenever in the abort it happens. (Without
    # WARDEN.WITHDRAW, as where it is refused: the unblock-or-close path.)
    watcher, freed, free_the_permit = held_permit(own_server)
    if not withdraw:
        monkeypatch.setattr(warden._connection, "_withdrawn", lambda *args: False)

    if moment == "local deadline":
        # The server is sent a longer WAIT than the caller has (as a server
        # busy elsewhere would miss it): the client aborts at the deadline,
        # and the permit is freed as its first give-back is on its way.
        monkeypatch.setattr(_core.Deadline, "wait_ms", lambda self: 30_000)
        give_back = warden._holder.Holder._give_back

        def racing_give_back(self: Any, owner: bytes) -> None:
            give_back(self, owner)
            free_the_permit()

        monkeypatch.setattr(warden._holder.Holder, "_give_back", racing_give_back)
        expected: Any = False
    else:
        # KeyboardInterrupt once the waiting acquire is written, before the
        # client has noted it as sent; the permit was granted to it meanwhile.
        send = redis.connection.AbstractConnection.send_packed_command

        def interrupted_send(self: Any, command: Any, check_health: bool = True) -> None:
            send(self, command, check_health)
            if b"WAIT" in b"".join(command) and not freed.is_set():
                free_the_permit()
                wait_for(lambda: sem_info(watcher, "race").get("waiters") == 0)
                raise KeyboardInterrupt()

        monkeypatch.setattr(
            redis.connection.AbstractConnection, "send_packed_command", interrupted_send
        )
        expected = KeyboardInterrupt
    r = own_server.client()
    sem = warden.Semaphore(r, "race", 1, timeout=30)
    try:
        got: Any = sem.acquire(blocking_timeout=0.3)
    except KeyboardInterrupt as interrupt:
        got = type(interrupt)
    assert got is expected
    # (Where WITHDRAW or CLIENT UNBLOCK takes the waiter out, its nil is read:
    # no give-back.)
    assert freed.is_set() or moment == "local deadline" and (withdraw or unblocks_waiters(watcher))
    wait_for(lambda: sem_info(watcher, "race").get("waiters", 0) == 0)
    free_the_permit()
    assert sem_info(watcher, "race") == {}  # nothing held by anyone
    r.close()
    watcher.close()


@pytest.mark.parametrize("withdraw", [True, False], ids=["withdraw", "no-withdraw"])
@pytest.mark.parametrize(
    "moment", ["local deadline", "cancel while parked", "cancel inside the send"]
)
async def test_a_grant_racing_an_aborted_wait_is_given_back_asyncio(
    own_server: Server, monkeypatch: pytest.MonkeyPatch, moment: str, withdraw: bool
) -> None:
    # As the sync test above: the only permit is freed while the waiter is
    # being taken out; the grant must be given back whenever it happens.
    watcher, freed, free_the_permit = held_permit(own_server)
    if not withdraw:

        async def not_withdrawn(*args: Any) -> bool:
            return False

        monkeypatch.setattr(warden.asyncio._connection, "_withdrawn", not_withdrawn)

    if moment == "cancel inside the send":
        # Cancelled once the waiting acquire is written, before the client has
        # noted it as sent; the permit was granted to it meanwhile.
        send = redis.asyncio.connection.AbstractConnection.send_packed_command

        async def cancelled_send(self: Any, command: Any, check_health: bool = True) -> None:
            await send(self, command, check_health)
            if b"WAIT" in b"".join(command) and not freed.is_set():
                free_the_permit()
                wait_for(lambda: sem_info(watcher, "race").get("waiters") == 0)
                raise asyncio.CancelledError()

        monkeypatch.setattr(
            redis.asyncio.connection.AbstractConnection, "send_packed_command", cancelled_send
        )
    else:
        # The waiter is taken out (its deadline passes locally: the server was
        # sent a longer WAIT; or its task is cancelled), and the permit is
        # freed as its first give-back is on its way.
        monkeypatch.setattr(_core.Deadline, "wait_ms", lambda self: 30_000)
        give_back = warden.asyncio._holder.Holder._give_back

        async def racing_give_back(self: Any, owner: bytes) -> None:
            await give_back(self, owner)
            free_the_permit()

        monkeypatch.setattr(warden.asyncio._holder.Holder, "_give_back", racing_give_back)
        # A busy server notices a closed connection late: the close reaches
        # it 100 ms after the client closed its end.
        disconnect = redis.asyncio.connection.AbstractConnection.disconnect

        async def late_disconnect(self: Any, nowait: bool = False, **kwargs: Any) -> None:
            if self._writer is not None and not freed.is_set():
                writer, self._reader, self._writer = self._writer, None, None
                asyncio.get_running_loop().call_later(0.1, writer.close)
            await disconnect(self, nowait, **kwargs)

        monkeypatch.setattr(
            redis.asyncio.connection.AbstractConnection, "disconnect", late_disconnect
        )
    r = own_server.async_client()
    sem = warden.asyncio.Semaphore(r, "race", 1, timeout=30)
    task = asyncio.ensure_future(
        sem.acquire(blocking_timeout=0.3 if moment == "local deadline" else 30)
    )
    if moment == "cancel while parked":
        await async_wait_for(lambda: sem_info(watcher, "race").get("waiters") == 1)
        task.cancel()
    try:
        got: Any = await task
    except asyncio.CancelledError:
        got = asyncio.CancelledError
    assert got is (False if moment == "local deadline" else asyncio.CancelledError)
    # (Where WITHDRAW or CLIENT UNBLOCK takes the waiter out, its nil is read:
    # no give-back.)
    assert freed.is_set() or (
        moment != "cancel inside the send" and (withdraw or unblocks_waiters(watcher))
    )
    await async_wait_for(lambda: sem_info(watcher, "race").get("waiters", 0) == 0)
    free_the_permit()
    # Nothing held by anyone, once a give-back still under way in the
    # background is done.
    await async_wait_for(lambda: sem_info(watcher, "race") == {}, 10)
    await r.aclose()
    watcher.close()


# --- load shedding ------------------------------------------------------------------


def has_queue(r: redis.Redis) -> bool:
    try:
        r.execute_command("LOCK.ACQUIRE", "probe:queue", "o", 1, "WAIT", 1, "QUEUE", 0)
    except ResponseError:
        return False
    return True


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_max_queue_sheds_at_once(server: Server, watcher: redis.Redis, flavour: str) -> None:
    if not has_queue(watcher):
        pytest.skip("this module has no QUEUE")
    watcher.execute_command("SEM.ACQUIRE", "shed", "holder", 30_000, "LIMIT", 1)
    r = server.client()
    queued = threading.Thread(
        target=lambda: warden.Semaphore(r, "shed", 1, timeout=1).acquire(blocking_timeout=3)
    )
    queued.start()
    wait_for(lambda: sem_info(watcher, "shed").get("waiters") == 1)
    shed = int(watcher.info("warden")["warden_shed"])
    if flavour == "sync":
        got = warden.Semaphore(r, "shed", 1, max_queue=1).acquire(blocking_timeout=30)
    else:

        async def main() -> bool:
            ar = server.async_client()
            try:
                sem = warden.asyncio.Semaphore(ar, "shed", 1, max_queue=1)
                return await sem.acquire(blocking_timeout=30)
            finally:
                await ar.aclose()

        got = asyncio.run(main())
    assert got is False  # answered at once, not after 30 s
    assert int(watcher.info("warden")["warden_shed"]) == shed + 1
    watcher.execute_command("SEM.RELEASE", "shed", "holder")
    queued.join(5)
    r.close()


def test_max_queue_must_be_a_count(r: redis.Redis) -> None:
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError):
            warden.Lock(r, "x", max_queue=bad)  # type: ignore[arg-type]


# --- errors ---------------------------------------------------------------------------


async def test_asyncio_a_key_of_another_type_is_a_wrongtype_error(ar: Any) -> None:
    await ar.set("data", "x")
    for holder in (
        warden.asyncio.Lock(ar, "data", blocking_timeout=0.1),
        warden.asyncio.Semaphore(ar, "data", 2, blocking_timeout=0.1),
    ):
        with pytest.raises(ResponseError, match="^WRONGTYPE"):
            await holder.acquire()
    assert await ar.get("data") == b"x"


def test_a_server_without_the_module_says_so() -> None:
    plain = Server(module=None)
    try:
        with pytest.raises(ResponseError, match="warden module loaded"):
            warden.Lock(plain.client(), "x").acquire()
    finally:
        plain.stop()


# --- deadlines beyond the timers ------------------------------------------------------


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
@pytest.mark.parametrize("seconds", [float("inf"), 7.04e10, 1e11, 1e300])
def test_a_deadline_beyond_any_timer_waits_forever(
    server: Server, watcher: redis.Redis, flavour: str, seconds: float
) -> None:
    # As redis-py's Lock: inf (or a time no timer or WAIT can hold) is no
    # deadline: the acquire waits (WAIT 0) until the lock is free.
    watcher.execute_command("LOCK.ACQUIRE", "forever", "holder", 30_000)
    lines, stop, t = monitored(server)

    # Freed once the acquire waits in the queue (not after a fixed time: on a
    # busy machine the acquire's first try may come later than that).
    def release_when_queued() -> None:
        try:
            wait_for(lambda: lock_waiters(watcher, "forever") == 1, timeout=20)
        finally:  # never left waiting forever: the asserts below say what went wrong
            watcher.execute_command("LOCK.RELEASE", "forever", "holder")

    threading.Thread(target=release_when_queued, daemon=True).start()
    if flavour == "sync":
        r = server.client()
        got = warden.Lock(r, "forever", timeout=10).acquire(blocking_timeout=seconds)
        r.close()
    else:

        async def main() -> bool:
            ar = server.async_client()
            try:
                return await warden.asyncio.Lock(ar, "forever", timeout=10).acquire(
                    blocking_timeout=seconds
                )
            finally:
                await ar.aclose()

        got = asyncio.run(main())
    stop.set()
    watcher.ping()
    t.join(5)
    assert got is True
    assert [line for line in lines if "WAIT" in line][0].endswith("WAIT 0")


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_a_nan_deadline_is_a_value_error(server: Server, flavour: str) -> None:
    if flavour == "sync":
        r = server.client()
        with pytest.raises(ValueError, match="blocking_timeout"):
            warden.Lock(r, "nan", timeout=10).acquire(blocking_timeout=float("nan"))
        r.close()
    else:

        async def main() -> None:
            ar = server.async_client()
            with pytest.raises(ValueError, match="blocking_timeout"):
                await warden.asyncio.Lock(ar, "nan", timeout=10).acquire(
                    blocking_timeout=float("nan")
                )
            await ar.aclose()

        asyncio.run(main())


# --- closing the client ----------------------------------------------------------


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_closing_the_client_ends_its_waits(
    server: Server, watcher: redis.Redis, flavour: str
) -> None:
    # Closing the client closes the connections its waits are parked on too:
    # they end at once with ClientClosed (a ConnectionError), leave the
    # server's queue, and nothing is granted to the closed client later.
    watcher.execute_command("SEM.ACQUIRE", "closing", "holder", 30_000, "LIMIT", 1)
    results: list[Any] = []
    if flavour == "sync":
        r = server.client()

        def wait() -> None:
            try:
                results.append(warden.Semaphore(r, "closing", 1, timeout=30).acquire())
            except redis.ConnectionError as error:
                results.append(type(error))

        threads = [threading.Thread(target=wait) for _ in range(3)]
        for thread in threads:
            thread.start()
        wait_for(lambda: sem_info(watcher, "closing").get("waiters") == 3)
        r.close()
        for thread in threads:
            thread.join()
    else:

        async def main() -> None:
            r = server.async_client()
            sem = warden.asyncio.Semaphore(r, "closing", 1, timeout=30)
            tasks = [asyncio.ensure_future(sem.acquire()) for _ in range(3)]
            await async_wait_for(lambda: sem_info(watcher, "closing").get("waiters") == 3)
            await r.aclose()
            for task in tasks:
                try:
                    results.append(await task)
                except redis.ConnectionError as error:
                    results.append(type(error))

        asyncio.run(main())
    assert results == [_core.ClientClosed] * 3
    assert sem_info(watcher, "closing")["waiters"] == 0
    watcher.execute_command("SEM.RELEASE", "closing", "holder")
    assert sem_info(watcher, "closing") == {}  # granted to nobody


# --- an interrupt at any moment ----------------------------------------------


class Interrupted(BaseException):
    """What a signal handler raises at an arbitrary moment."""


def interrupt_at(moment: int, armed_by: str) -> Any:
    """A trace function raising ``Interrupted`` at the ``moment``-th line warden
    runs once the acquire's grant was read (the reply of the request whose
    caller is the function ``armed_by``), counting from 1; the count is in
    ``state["lines"]`` when no interrupt came (the moment was past the end)."""
    warden_dir = warden.__file__.rsplit("/", 1)[0]
    state = {"armed": False, "lines": 0}

    def on_return(frame: Any, event: str, arg: Any) -> Any:
        caller = frame.f_back
        if (
            event == "return"
            and isinstance(arg, int)
            and caller.f_code.co_name == armed_by
            and (armed_by != "blocking_call" or caller.f_locals.get("client_id") is not None)
        ):
            state["armed"] = True
        return on_return

    def on_line(frame: Any, event: str, arg: Any) -> Any:
        if event == "line" and state["armed"]:
            state["lines"] += 1
            if state["lines"] == moment:
                raise Interrupted()
        return on_line

    def trace(frame: Any, event: str, arg: Any) -> Any:
        code = frame.f_code
        if code.co_name == "read_response" and frame.f_back.f_code.co_name == armed_by:
            return on_return
        if code.co_filename.startswith(warden_dir):
            return on_line
        return None

    trace.state = state  # type: ignore[attr-defined]
    return trace


@pytest.mark.parametrize("path", ["try", "wait"])
def test_an_interrupt_anywhere_after_the_grant_is_read_leaves_nothing_held(
    server: Server, watcher: redis.Redis, path: str
) -> None:
    # Whatever line the interrupt lands on between the grant's reply and the
    # acquire's return, the permit ends either recorded (the holder releases
    # it) or given back: never held by nobody.
    r = server.client()
    moment = 0
    while True:
        moment += 1
        if path == "wait":
            hold_until_a_waiter_queues(watcher, "intr")
        sem = warden.Semaphore(r, "intr", 1, timeout=30)
        trace = interrupt_at(moment, "try_call" if path == "try" else "blocking_call")
        sys.settrace(trace)
        try:
            got: Any = sem.acquire(blocking_timeout=5)
        except Interrupted:
            got = Interrupted
        finally:
            sys.settrace(None)
        if sem._token is not None:
            sem.release()
        wait_for(lambda: sem_info(watcher, "intr").get("waiters", 0) == 0)
        assert sem_info(watcher, "intr") == {}, f"held by nobody after line {moment}"
        if got is not Interrupted:
            assert got is True
            break
    assert moment > 10  # the moments were lines indeed
    r.close()


@pytest.mark.parametrize("path", ["try", "wait"])
def test_a_grant_recorded_past_the_deadline_is_released(
    server: Server, watcher: redis.Redis, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    # The process is slow between the grant's reply and the acquire's return
    # (as a thread waiting for the GIL is): the deadline passes there. The
    # acquire answers False and the permit is free again.
    new_hold = warden._holder.Holder._new_hold

    def slow_new_hold(self: Any, owner: bytes, lease_ms: int) -> None:
        new_hold(self, owner, lease_ms)
        time.sleep(0.3)

    monkeypatch.setattr(warden._holder.Holder, "_new_hold", slow_new_hold)
    if path == "wait":
        hold_until_a_waiter_queues(watcher, "slow")
    r = server.client()
    sem = warden.Semaphore(r, "slow", 1, timeout=30)
    assert sem.acquire(blocking_timeout=0.2) is False
    assert sem._token is None
    assert sem_info(watcher, "slow") == {}
    r.close()


async def test_a_grant_past_the_deadline_once_its_connection_is_back_is_given_back_asyncio(
    server: Server, watcher: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The wait's reply came in time, but its connection's return to the pool
    # took past the deadline (a busy loop): the acquire answers False and the
    # permit is free again.
    r = server.async_client()
    pool = redis.asyncio.connection.ConnectionPool
    release = pool.release

    async def slow_release(self: Any, connection: Any) -> Any:
        done = await release(self, connection)
        if self is not r.connection_pool:  # the wait pool
            await asyncio.sleep(0.3)
        return done

    monkeypatch.setattr(pool, "release", slow_release)
    hold_until_a_waiter_queues(watcher, "slow-aio")
    sem = warden.asyncio.Semaphore(r, "slow-aio", 1, timeout=30)
    assert await sem.acquire(blocking_timeout=0.2) is False
    assert sem._token is None
    await async_wait_for(lambda: sem_info(watcher, "slow-aio") == {})
    await r.aclose()


def test_a_wait_whose_client_closes_before_its_send_ends_with_client_closed(
    server: Server, watcher: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The client is closed after the wait took its connection, before the
    # wait is sent: it must not reconnect and wait on the server anyway.
    watcher.execute_command("SEM.ACQUIRE", "late-close", "holder", 30_000, "LIMIT", 1)
    r = server.client()
    send = redis.connection.AbstractConnection.send_packed_command

    def closing_send(self: Any, command: Any, check_health: bool = True) -> None:
        if b"WAIT" in b"".join(command):
            r.connection_pool.disconnect()
        send(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", closing_send)
    results: list[Any] = []

    def wait() -> None:  # without a deadline: only the close can end it
        try:
            results.append(warden.Semaphore(r, "late-close", 1, timeout=30).acquire())
        except Exception as error:
            results.append(type(error))

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    thread.join(5)
    assert results == [_core.ClientClosed]
    assert sem_info(watcher, "late-close")["waiters"] == 0
    watcher.execute_command("SEM.RELEASE", "late-close", "holder")
    assert sem_info(watcher, "late-close") == {}


def acquire_calls(r: redis.Redis, command: str) -> int:
    stats = r.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
@pytest.mark.parametrize("kind", ["lock", "semaphore"])
def test_an_acquire_behind_a_wait_of_its_own_client_waits_at_once(
    server: Server, watcher: redis.Redis, flavour: str, kind: str
) -> None:
    # The server never lets a try overtake a waiter: while a request of this
    # client waits for the key, an acquire goes straight to waiting (one
    # command, not a try and then a wait). Another client still tries first.
    command = "lock.acquire" if kind == "lock" else "sem.acquire"
    if kind == "lock":
        watcher.execute_command("LOCK.ACQUIRE", "busy", "holder", 30_000)
    else:
        watcher.execute_command("SEM.ACQUIRE", "busy", "holder", 30_000, "LIMIT", 1)

    def waiters() -> int:
        if kind == "lock":
            return lock_waiters(watcher, "busy") if watcher.exists("busy") else 0
        return int(sem_info(watcher, "busy").get("waiters", 0))

    def make(module: Any, client: Any) -> Any:
        if kind == "lock":
            return module.Lock(client, "busy", timeout=10)
        return module.Semaphore(client, "busy", 1, timeout=10)

    sent: dict[str, int] = {}
    if flavour == "sync":
        r, other = server.client(), server.client()
        got: list[bool] = []
        first = make(warden, r)
        queued = threading.Thread(target=lambda: got.append(first.acquire(blocking_timeout=30)))
        queued.start()
        wait_for(lambda: waiters() == 1)
        for name, client in (("same", r), ("other", other)):
            before = acquire_calls(watcher, command)
            assert not make(warden, client).acquire(blocking_timeout=0.2)
            sent[name] = acquire_calls(watcher, command) - before
        watcher.execute_command(command.upper().replace("ACQUIRE", "RELEASE"), "busy", "holder")
        queued.join(10)
        assert got == [True]  # the first in the queue got it (held by its thread)
        watcher.delete("busy")
        r.close()
        other.close()
    else:

        async def main() -> None:
            r, other = server.async_client(), server.async_client()
            first = make(warden.asyncio, r)
            queued = asyncio.ensure_future(first.acquire(blocking_timeout=30))
            await async_wait_for(lambda: waiters() == 1)
            for name, client in (("same", r), ("other", other)):
                before = acquire_calls(watcher, command)
                assert not await make(warden.asyncio, client).acquire(blocking_timeout=0.2)
                sent[name] = acquire_calls(watcher, command) - before
            watcher.execute_command(command.upper().replace("ACQUIRE", "RELEASE"), "busy", "holder")
            assert await queued  # held by its task
            watcher.delete("busy")
            await r.aclose()
            await other.aclose()

        asyncio.run(main())
    assert sent == {"same": 1, "other": 2}
    assert waiters() == 0


def lock_info(r: redis.Redis, name: str) -> dict[str, Any]:
    reply = r.execute_command("LOCK.INFO", name)
    items = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2])
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in items}


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
@pytest.mark.parametrize("interrupted", [False, True])
def test_a_holder_asking_again_behind_a_wait_of_its_own_client_keeps_its_hold(
    server: Server, watcher: redis.Redis, flavour: str, interrupted: bool
) -> None:
    # A re-entrant holder's acquire is granted at once, behind waiters too:
    # it tries even while a request of its client waits for the key. An
    # interrupt or cancel landing on the first reply it reads gives back that
    # one grant, never the hold it had before (the lock stays its own, the
    # waiter keeps waiting). Through the wait path, the abort's two
    # give-backs took both holds and handed the lock to the waiter.
    armed: list[bool] = []
    sent: dict[str, int] = {}
    if flavour == "sync":
        r = server.client()
        send = redis.connection.AbstractConnection.send_packed_command
        read = redis.connection.AbstractConnection.read_response
        caller = threading.get_ident()

        def sending(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
            packed = b"".join(command) if isinstance(command, list) else bytes(command)
            if interrupted and threading.get_ident() == caller and b"LOCK.ACQUIRE" in packed:
                armed.append(True)
            return send(self, command, *args, **kwargs)

        def reading(self: Any, *args: Any, **kwargs: Any) -> Any:
            reply = read(self, *args, **kwargs)
            if armed and threading.get_ident() == caller:
                armed.clear()
                raise KeyboardInterrupt
            return reply

        mine = warden.Lock(r, "again", reentrant=True, timeout=30)
        assert mine.acquire()
        got: list[bool] = []
        other = warden.Lock(r, "again", timeout=30)
        waiter = threading.Thread(target=lambda: got.append(other.acquire(blocking_timeout=30)))
        waiter.start()
        wait_for(lambda: lock_waiters(watcher, "again") == 1)
        before = acquire_calls(watcher, "lock.acquire")
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(redis.connection.AbstractConnection, "send_packed_command", sending)
            patch.setattr(redis.connection.AbstractConnection, "read_response", reading)
            if interrupted:
                with pytest.raises(KeyboardInterrupt):
                    mine.acquire(blocking_timeout=5)
            else:
                assert mine.acquire(blocking_timeout=5)
        sent["calls"] = acquire_calls(watcher, "lock.acquire") - before
        holds = 1 if interrupted else 2
        wait_for(lambda: lock_info(watcher, "again")["holds"] == holds)
        assert lock_info(watcher, "again")["owner"] == mine.local.token
        assert lock_waiters(watcher, "again") == 1
        for _ in range(holds):
            mine.release()
        waiter.join(10)
        assert got == [True]
        r.close()
    else:

        async def main() -> None:
            r = server.async_client()
            me = asyncio.current_task()
            assert me is not None
            send = redis.asyncio.connection.AbstractConnection.send_packed_command
            read = redis.asyncio.connection.AbstractConnection.read_response

            async def sending(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
                packed = b"".join(command) if isinstance(command, list) else bytes(command)
                if interrupted and asyncio.current_task() is me and b"LOCK.ACQUIRE" in packed:
                    armed.append(True)
                return await send(self, command, *args, **kwargs)

            async def reading(self: Any, *args: Any, **kwargs: Any) -> Any:
                reply = await read(self, *args, **kwargs)
                if armed:
                    armed.clear()
                    assert me is not None
                    me.cancel()
                    if asyncio.current_task() is me:
                        await asyncio.sleep(0)  # the cancel lands here
                return reply

            mine = warden.asyncio.Lock(r, "again", reentrant=True, timeout=30)
            assert await mine.acquire()
            waiter = asyncio.ensure_future(
                warden.asyncio.Lock(r, "again", timeout=30).acquire(blocking_timeout=30)
            )
            await async_wait_for(lambda: lock_waiters(watcher, "again") == 1)
            before = acquire_calls(watcher, "lock.acquire")
            with pytest.MonkeyPatch.context() as patch:
                connection = redis.asyncio.connection.AbstractConnection
                patch.setattr(connection, "send_packed_command", sending)
                patch.setattr(connection, "read_response", reading)
                if interrupted:
                    with pytest.raises(asyncio.CancelledError):
                        await mine.acquire(blocking_timeout=5)
                    me.uncancel()
                else:
                    assert await mine.acquire(blocking_timeout=5)
            sent["calls"] = acquire_calls(watcher, "lock.acquire") - before
            holds = 1 if interrupted else 2
            await async_wait_for(lambda: lock_info(watcher, "again")["holds"] == holds)
            assert lock_info(watcher, "again")["owner"] == mine.local.token
            assert lock_waiters(watcher, "again") == 1
            for _ in range(holds):
                await mine.release()
            assert await asyncio.wait_for(waiter, 10)
            await r.aclose()

        asyncio.run(main())
    assert sent == {"calls": 1}


def test_a_wait_for_a_connection_does_not_keep_a_free_lock_from_a_try(
    server: Server, watcher: redis.Redis
) -> None:
    # A request of this client that waits for a wait-pool connection is not
    # in the server's queue: another acquire of the key must still try first
    # (a free lock is granted at once, not behind that connection).
    r = server.client(max_connections=1)
    watcher.execute_command("LOCK.ACQUIRE", "held-long", "x", 30_000)
    watcher.execute_command("LOCK.ACQUIRE", "k", "x", 30_000)
    parked = threading.Thread(
        target=lambda: warden.Lock(r, "held-long", timeout=10).acquire(blocking_timeout=8),
        daemon=True,
    )
    parked.start()  # holds the only wait-pool connection
    wait_for(lambda: lock_waiters(watcher, "held-long") == 1)
    behind = threading.Thread(
        target=lambda: warden.Lock(r, "k", timeout=10).acquire(blocking_timeout=5),
        daemon=True,
    )
    behind.start()  # its try is busy; it waits for a wait-pool connection
    time.sleep(0.3)
    watcher.execute_command("LOCK.RELEASE", "k", "x")
    lock = warden.Lock(r, "k", timeout=10)
    assert lock.acquire(blocking_timeout=2)  # tried first: granted at once
    lock.release()
    watcher.execute_command("LOCK.RELEASE", "held-long", "x")
    parked.join(10)
    behind.join(10)
    watcher.delete("held-long", "k")
    r.close()
