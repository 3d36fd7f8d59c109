"""Give-backs never take a hold the owner had before, and never leak a grant.

1. A re-entrant holder asking again, interrupted or cancelled before its
   request left: nothing was granted, and the hold it had stays (a blind
   give-back of "what it may hold" took it, and the lock with it).
2. ReadWriteLock(reentrant=True): a read asked while writing (a downgrade)
   and interrupted on its reply is not given back with ``RWLOCK.UNLOCK key
   owner``, which ends the owner's write hold first (readers would get in
   beside the writer).
3. asyncio: a cancel landing while the connection that read a grant (a
   try's or a wait's) goes back to its pool, or while a grant read past the
   deadline is given back: the grant is given back, not leaked.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.connection
import redis.connection
from servers import Server

import warden
import warden.asyncio
from warden import _core


def info(r: redis.Redis, command: str, name: str) -> dict[str, Any]:
    reply = r.execute_command(command, name)
    if reply is None:
        return {}
    items = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2])
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in items}


async def settled(condition: Any, timeout: float = 10.0) -> None:
    """Waits for what a background give-back leaves (a busy machine runs it late)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


@pytest.fixture
def watcher(server: Server) -> Iterator[redis.Redis]:
    r = server.client()
    r.flushall()
    yield r
    r.close()


def test_sync_holder_interrupted_before_its_send_keeps_its_hold(
    server: Server, watcher: redis.Redis
) -> None:
    r = server.client()
    mine = warden.Lock(r, "a1", reentrant=True, timeout=30)
    assert mine.acquire()
    send = redis.connection.AbstractConnection.send_packed_command
    me = threading.get_ident()

    def sending(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
        packed = b"".join(command) if isinstance(command, list) else bytes(command)
        if threading.get_ident() == me and b"LOCK.ACQUIRE" in packed:
            raise KeyboardInterrupt  # before a byte is written: nothing granted
        return send(self, command, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(redis.connection.AbstractConnection, "send_packed_command", sending)
        with pytest.raises(KeyboardInterrupt):
            mine.acquire(blocking_timeout=5)
    assert mine.local.token is not None  # the holder believes it holds
    assert info(watcher, "LOCK.INFO", "a1").get("owner") == mine.local.token
    r.close()


def test_asyncio_holder_cancelled_before_its_send_keeps_its_hold(
    server: Server, watcher: redis.Redis
) -> None:
    async def main() -> None:
        r = server.async_client(socket_timeout=5)
        mine = warden.asyncio.Lock(r, "a2", reentrant=True, timeout=30)
        assert await mine.acquire()
        me = asyncio.current_task()
        assert me is not None
        connection = redis.asyncio.connection.AbstractConnection
        send = connection.send_packed_command

        async def sending(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
            packed = b"".join(command) if isinstance(command, list) else bytes(command)
            if asyncio.current_task() is me and b"LOCK.ACQUIRE" in packed:
                me.cancel()
                await asyncio.sleep(0)  # lands before a byte is written
            return await send(self, command, *args, **kwargs)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(connection, "send_packed_command", sending)
            with pytest.raises(asyncio.CancelledError):
                await mine.acquire(blocking_timeout=5)
            me.uncancel()
        await asyncio.sleep(0.2)  # the background give-back
        assert mine.local.token is not None
        assert info(watcher, "LOCK.INFO", "a2").get("owner") == mine.local.token
        await r.aclose()

    asyncio.run(main())


def test_rw_downgrade_interrupted_on_its_reply_keeps_the_write_hold(
    server: Server, watcher: redis.Redis
) -> None:
    r = server.client()
    rw = warden.ReadWriteLock(r, "a3", reentrant=True, timeout=30)
    wl, rl = rw.write_lock(), rw.read_lock()
    assert wl.acquire()
    C = redis.connection.AbstractConnection
    send, read = C.send_packed_command, C.read_response
    armed: list[bool] = []

    def sending(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
        packed = b"".join(command) if isinstance(command, list) else bytes(command)
        if b"RWLOCK.READ" in packed:
            armed.append(True)
        return send(self, command, *args, **kwargs)

    def reading(self: Any, *args: Any, **kwargs: Any) -> Any:
        reply = read(self, *args, **kwargs)
        if armed:
            armed.clear()
            raise KeyboardInterrupt  # the read grant read, not recorded
        return reply

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(C, "send_packed_command", sending)
        patch.setattr(C, "read_response", reading)
        with pytest.raises(KeyboardInterrupt):
            rl.acquire(blocking_timeout=5)
    assert wl.local.token is not None
    assert info(watcher, "RWLOCK.INFO", "a3").get("mode") == b"write"
    other = warden.ReadWriteLock(server.client(), "a3", timeout=30).read_lock()
    assert not other.acquire(blocking=False)
    r.close()


@pytest.mark.parametrize("path", ["try", "wait"])
def test_asyncio_a_cancel_as_the_granted_connection_goes_back_leaks_no_grant(
    server: Server, watcher: redis.Redis, path: str
) -> None:
    name = f"a5-{path}"

    async def main() -> None:
        r = server.async_client()
        me = asyncio.current_task()
        assert me is not None
        mine = warden.asyncio.Lock(r, name, timeout=30)
        pool = redis.asyncio.connection.ConnectionPool
        release = pool.release
        armed = [True]

        async def releasing(self: Any, connection: Any) -> Any:
            # A cancel that lands while the connection that read the grant
            # goes back to its pool (a timer firing at a suspension there).
            done = await release(self, connection)
            held = info(watcher, "LOCK.INFO", name)
            if armed and held and held["owner"] != b"other":
                armed.clear()
                assert me is not None
                asyncio.get_running_loop().call_soon(me.cancel)
                await asyncio.sleep(0)
            return done

        if path == "wait":
            assert watcher.execute_command("LOCK.ACQUIRE", name, "other", 30_000)

            def free_it() -> None:  # once the acquire waits in the queue
                freer = server.client()
                while info(freer, "LOCK.INFO", name).get("waiters") != 1:
                    time.sleep(0.01)
                freed.append(freer.execute_command("LOCK.RELEASE", name, "other"))

            freed: list[int] = []
            freeing = threading.Thread(target=free_it)
            freeing.start()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(pool, "release", releasing)
            with pytest.raises(asyncio.CancelledError):
                await mine.acquire(blocking_timeout=5)
            me.uncancel()
        if path == "wait":
            freeing.join()
            assert freed == [1]
        assert not armed, "the cancel landed"
        await settled(lambda: info(watcher, "LOCK.INFO", name) == {})
        assert mine.local.token is None
        await r.aclose()

    asyncio.run(main())


def _after_turns(loop: asyncio.AbstractEventLoop, turns: int, fn: Any) -> None:
    if turns == 0:
        fn()
    else:
        loop.call_soon(_after_turns, loop, turns - 1, fn)


def _stall_the_loop(seconds: float) -> None:
    time.sleep(seconds)


def test_asyncio_a_cancel_during_the_give_back_of_a_late_grant_leaks_nothing(
    server: Server, watcher: redis.Redis
) -> None:
    # A grant read past the caller's deadline (the loop stalled) is given
    # back; a cancel landing while that give-back waits for a connection (the
    # client's idle one is busy: it connects) must not leave the lock held by
    # nobody. Cancels land 0..11 loop turns after the grant is readable.
    async def one(turns: int) -> Any:
        loop = asyncio.get_running_loop()
        name = f"late:{turns}"
        holder = warden.Lock(watcher, name)  # sync: its release blocks the loop
        assert holder.acquire()
        client = server.async_client()
        waiter = asyncio.ensure_future(
            warden.asyncio.Lock(client, name).acquire(blocking_timeout=0.1)
        )
        await settled(lambda: info(watcher, "LOCK.INFO", name).get("waiters") == 1)
        busy = asyncio.ensure_future(client.blpop(f"nothing:{turns}", 1))
        await asyncio.sleep(0.02)
        holder.release()  # granted to the waiter
        _stall_the_loop(0.15)  # the grant is read past the deadline
        _after_turns(loop, turns, waiter.cancel)  # an enclosing timeout, say
        try:
            got = await waiter
        except asyncio.CancelledError:
            got = None
        assert not got  # read past its deadline: never handed on
        await busy
        try:
            await settled(lambda: not watcher.exists(name), 5.0)
            return None
        except AssertionError:
            return (turns, info(watcher, "LOCK.INFO", name))
        finally:
            await client.aclose()

    async def main() -> None:
        leaked = [leak for turns in range(12) if (leak := await one(turns))]
        assert not leaked, f"held by nobody after the acquire gave up: {leaked}"

    asyncio.run(main())


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
@pytest.mark.parametrize("case", ["read-released-first", "read-granted-late"])
def test_a_downgraded_writer_keeps_its_write_hold(
    server: Server, watcher: redis.Redis, flavour: str, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ReadWriteLock(reentrant=True): a read taken while writing, then let go
    # first (nested blocks) or given back (granted past its deadline), ends
    # the read hold only (`RWLOCK.UNLOCK key owner READ`): the write hold
    # stays and no other reader gets in.
    name = f"down-{flavour}-{case}"
    if case == "read-granted-late":
        passed = _core.Deadline.passed
        monkeypatch.setattr(
            _core.Deadline, "passed", lambda self: self.at is not None or passed(self)
        )

    def check() -> None:
        lock = info(watcher, "RWLOCK.INFO", name)
        assert (lock.get("mode"), lock.get("holds")) == (b"write", 1)
        assert watcher.execute_command("RWLOCK.READ", name, "other", 30_000) is None

    if flavour == "sync":
        r = server.client()
        rw = warden.ReadWriteLock(r, name, reentrant=True, timeout=30)
        wl, rl = rw.write_lock(), rw.read_lock()
        with wl:
            if case == "read-released-first":
                with rl:
                    pass
            else:
                assert rl.acquire(blocking_timeout=5) is False
            check()
        r.close()
    else:

        async def main() -> None:
            r = server.async_client()
            rw = warden.asyncio.ReadWriteLock(r, name, reentrant=True, timeout=30)
            wl, rl = rw.write_lock(), rw.read_lock()
            async with wl:
                if case == "read-released-first":
                    async with rl:
                        pass
                else:
                    assert await rl.acquire(blocking_timeout=5) is False
                # A give-back in the background: the read hold goes.
                await settled(lambda: info(watcher, "RWLOCK.INFO", name).get("holds") == 1)
                check()
            await r.aclose()

        asyncio.run(main())
    assert not watcher.exists(name)


PREV_MODULE = os.environ.get("WARDEN_PREV_MODULE")


@pytest.mark.skipif(not PREV_MODULE, reason="WARDEN_PREV_MODULE: the release before 1.1.0")
@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_a_module_before_the_unlock_mode_gets_releases_without_it(flavour: str) -> None:
    # Before 1.1.0 RWLOCK.UNLOCK takes no mode: the client learns it from the
    # refusal, sends the form without, and never gives back a read with it
    # while its owner writes (that would end the write hold).
    old = Server(module=PREV_MODULE)
    try:
        watcher = old.client()
        if flavour == "sync":
            r = old.client()
            rw = warden.ReadWriteLock(r, "old", reentrant=True, timeout=30)
            wl, rl = rw.write_lock(), rw.read_lock()
            with rl:
                assert info(watcher, "RWLOCK.INFO", "old")["mode"] == b"read"
            assert not watcher.exists("old")
            with wl:
                rl._give_back(wl.local.token)  # a read it could not deliver
                assert info(watcher, "RWLOCK.INFO", "old")["mode"] == b"write"
            r.close()
        else:

            async def main() -> None:
                r = old.async_client()
                rw = warden.asyncio.ReadWriteLock(r, "old", reentrant=True, timeout=30)
                wl, rl = rw.write_lock(), rw.read_lock()
                async with rl:
                    assert info(watcher, "RWLOCK.INFO", "old")["mode"] == b"read"
                assert not watcher.exists("old")
                async with wl:
                    await rl._give_back(wl.local.token)
                    assert info(watcher, "RWLOCK.INFO", "old")["mode"] == b"write"
                await r.aclose()

            asyncio.run(main())
        assert not watcher.exists("old")
        watcher.close()
    finally:
        old.stop()
