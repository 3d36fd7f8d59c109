"""A release whose connection breaks before the server runs it (writes
paused, then ``CLIENT KILL``): the caller gets the ``ConnectionError``, and
the release is sent again on a new connection, so the key is free, not
held by nobody until its lease ends. Only for an owner made for the hold: a
caller's ``token=`` or a re-entrant owner may hold more, and is left to its
lease. Sync and asyncio, each kind of hold.

Then what the background send must not do: a shared object (another
thread's or task's acquire granted once the lock is free) is not released
by a retry of the first release, which finds the object unlocked; a hold
joined by an acquire with its owner as ``token=`` (the same object, another
one, a read lock's downgrade) is never sent again, so that hold survives;
and a watchdog stops at the failed release (no renewal after it) while the
background send retries until the server answers.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable, NamedTuple

import pytest
import redis
from redis.exceptions import LockError, LockNotOwnedError
from servers import Server

import warden
import warden._core
import warden.asyncio

RELEASES = {"lock.release", "sem.release", "rwlock.unlock"}


class Case(NamedTuple):
    name: str
    #: The holder, from the module (``warden`` or ``warden.asyncio``), client and key.
    build: Callable[[Any, Any, str], Any]
    acquire: dict[str, Any]
    info: str
    #: Whether the release is sent again (the key free) or left to the lease.
    freed: bool


CASES = [
    Case("lock", lambda m, r, k: m.Lock(r, k, timeout=30, thread_local=False), {}, "LOCK", True),
    Case("watchdog lock", lambda m, r, k: m.Lock(r, k, thread_local=False), {}, "LOCK", True),
    Case(
        "semaphore",
        lambda m, r, k: m.Semaphore(r, k, 2, timeout=30, thread_local=False),
        {},
        "SEM",
        True,
    ),
    Case(
        "write",
        lambda m, r, k: m.ReadWriteLock(r, k, timeout=30, thread_local=False).write_lock(),
        {},
        "RWLOCK",
        True,
    ),
    Case(
        "read",
        lambda m, r, k: m.ReadWriteLock(r, k, timeout=30, thread_local=False).read_lock(),
        {},
        "RWLOCK",
        True,
    ),
    Case(
        "caller's token",
        lambda m, r, k: m.Lock(r, k, timeout=30, thread_local=False),
        {"token": "mine"},
        "LOCK",
        False,
    ),
    Case(
        "re-entrant",
        lambda m, r, k: m.Lock(r, k, timeout=30, thread_local=False, reentrant=True),
        {},
        "LOCK",
        False,
    ),
]


def info(admin: redis.Redis, kind: str, key: str) -> dict[str, Any]:
    """``kind.INFO key`` as a dict with str keys and values ({} if none)."""
    reply = admin.execute_command(f"{kind}.INFO", key)
    if reply is None:
        return {}
    items = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2])
    return {
        k.decode() if isinstance(k, bytes) else k: v.decode() if isinstance(v, bytes) else v
        for k, v in items
    }


def held(admin: redis.Redis, case: Case, key: str) -> bool:
    fields = info(admin, case.info, key)
    return int(fields.get("used", fields.get("holds", 0))) > 0


def client_ids(admin: redis.Redis) -> set[str]:
    return {str(c["id"]) for c in admin.client_list()}


def releasing(admin: redis.Redis, before: set[str]) -> str:
    """The id of the client's connection whose release the paused server holds."""
    for c in admin.client_list():
        if str(c["id"]) not in before and c.get("cmd") in RELEASES:
            return str(c["id"])
    return ""


def settled(admin: redis.Redis, case: Case, key: str) -> bool:
    """Whether the key is held once the release sent again had its time:
    free within 3 s, or (a release not sent again) still held after 1 s."""
    deadline = time.monotonic() + (3.0 if case.freed else 1.0)
    while time.monotonic() < deadline:
        if not held(admin, case, key):
            return False
        time.sleep(0.02)
    return True


@pytest.fixture
def admin(server: Server) -> Any:
    a = server.client()
    a.flushall()
    yield a
    a.execute_command("CLIENT", "UNPAUSE")
    a.close()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_sync_a_release_cut_off_is_sent_again(
    server: Server, admin: redis.Redis, case: Case
) -> None:
    key = f"cut-sync-{case.name}"
    before = client_ids(admin)
    r = server.client()
    holder = case.build(warden, r, key)
    assert holder.acquire(**case.acquire)
    errors: list[BaseException] = []

    def release() -> None:
        try:
            holder.release()
        except BaseException as error:
            errors.append(error)

    admin.execute_command("CLIENT", "PAUSE", 10000, "WRITE")
    try:
        thread = threading.Thread(target=release)
        thread.start()
        deadline = time.monotonic() + 5
        while not (victim := releasing(admin, before)):
            assert time.monotonic() < deadline, "the release never reached the server"
            time.sleep(0.01)
        admin.execute_command("CLIENT", "KILL", "ID", victim)
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
    thread.join(10)
    assert len(errors) == 1 and isinstance(errors[0], redis.ConnectionError), errors
    assert settled(admin, case, key) is not case.freed
    r.close()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_asyncio_a_release_cut_off_is_sent_again(
    server: Server, admin: redis.Redis, case: Case
) -> None:
    key = f"cut-asyncio-{case.name}"

    async def main() -> None:
        before = client_ids(admin)
        r = server.async_client()
        holder = case.build(warden.asyncio, r, key)
        assert await holder.acquire(**case.acquire)
        admin.execute_command("CLIENT", "PAUSE", 10000, "WRITE")
        try:
            release = asyncio.ensure_future(holder.release())
            deadline = time.monotonic() + 5
            while not (victim := releasing(admin, before)):
                assert time.monotonic() < deadline, "the release never reached the server"
                await asyncio.sleep(0.01)
            admin.execute_command("CLIENT", "KILL", "ID", victim)
        finally:
            admin.execute_command("CLIENT", "UNPAUSE")
        with pytest.raises(redis.ConnectionError):
            await asyncio.wait_for(release, 10)
        assert await asyncio.to_thread(settled, admin, case, key) is not case.freed
        await r.aclose()

    asyncio.run(main())


# --- what the background send must not do ----------------------------------


def wait_for(what: Callable[[], bool], seconds: float, message: str) -> None:
    deadline = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < deadline, message
        time.sleep(0.01)


def cut(admin: redis.Redis, before: set[str]) -> None:
    """Kill the connection of the release the paused server holds."""
    victim = ""

    def found() -> bool:
        nonlocal victim
        victim = releasing(admin, before)
        return bool(victim)

    wait_for(found, 5, "the release never reached the server")
    admin.execute_command("CLIENT", "KILL", "ID", victim)


def cut_every_release(admin: redis.Redis, before: set[str], seconds: float) -> int:
    """For ``seconds`` (writes paused), kill every connection whose release
    the server holds: how many were killed."""
    killed = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        victim = releasing(admin, before)
        if victim:
            admin.execute_command("CLIENT", "KILL", "ID", victim)
            killed += 1
        time.sleep(0.005)
    return killed


def freed_within(admin: redis.Redis, key: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while admin.exists(key):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def extends(admin: redis.Redis) -> int:
    """How many ``LOCK.EXTEND`` the server ran (the watchdog's renewals)."""
    stats = admin.info("commandstats").get("cmdstat_lock.extend")
    return int(stats["calls"]) if stats else 0


def test_sync_a_retry_on_a_shared_object_finds_it_unlocked(
    server: Server, admin: redis.Redis
) -> None:
    """A holds, B waits on the same object (thread_local=False); A's release
    is cut. The object forgets A's hold at once: A's retry raises LockError
    (nothing sent), the release sent again frees the lock for B, and B's
    hold is left alone."""
    key = "shared-sync"
    before = client_ids(admin)
    r = server.client()
    lock = warden.Lock(r, key, timeout=30, thread_local=False)
    assert lock.acquire()
    ours = lock.local.token
    granted: list[Any] = []
    b = threading.Thread(
        target=lambda: granted.append((lock.acquire(blocking_timeout=10), lock.local.token))
    )
    b.start()
    wait_for(lambda: int(info(admin, "LOCK", key).get("waiters", 0)) == 1, 5, "B never waited")
    errors: list[Any] = []
    first = threading.Event()

    def a() -> None:
        for _ in (0, 1):  # the release, and A's retry of it
            try:
                lock.release()
                errors.append(None)
            except BaseException as error:
                errors.append(error)
            first.set()

    admin.execute_command("CLIENT", "PAUSE", 10000, "WRITE")
    try:
        thread = threading.Thread(target=a)
        thread.start()
        cut(admin, before)
        assert first.wait(5)
        time.sleep(0.3)  # A's retry, the writes still paused: B not granted yet
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
    thread.join(10)
    b.join(10)
    assert isinstance(errors[0], redis.ConnectionError), errors
    assert isinstance(errors[1], LockError), errors
    assert not isinstance(errors[1], LockNotOwnedError), errors
    assert granted and granted[0][0] is True, granted
    theirs = granted[0][1]
    assert theirs is not None and theirs != ours
    time.sleep(0.2)
    assert info(admin, "LOCK", key).get("owner") == theirs.decode(), "B's hold was released"
    assert lock.local.token == theirs
    lock.release()
    assert not info(admin, "LOCK", key)
    r.close()


def test_asyncio_a_retry_on_a_shared_object_finds_it_unlocked(
    server: Server, admin: redis.Redis
) -> None:
    """As the sync test, with two tasks sharing one asyncio Lock."""
    key = "shared-asyncio"

    async def main() -> None:
        before = client_ids(admin)
        r = server.async_client()
        lock = warden.asyncio.Lock(r, key, timeout=30)
        assert await lock.acquire()
        ours = lock.local.token

        async def b() -> tuple[bool, Any]:
            return await lock.acquire(blocking_timeout=10), lock.local.token

        other = asyncio.ensure_future(b())
        deadline = time.monotonic() + 5
        while int(info(admin, "LOCK", key).get("waiters", 0)) != 1:
            assert time.monotonic() < deadline, "B never waited"
            await asyncio.sleep(0.01)
        admin.execute_command("CLIENT", "PAUSE", 10000, "WRITE")
        try:
            release = asyncio.ensure_future(lock.release())
            await asyncio.to_thread(cut, admin, before)
            with pytest.raises(redis.ConnectionError):
                await asyncio.wait_for(release, 5)
            retry = asyncio.ensure_future(lock.release())
            await asyncio.wait([retry], timeout=0.3)  # the writes still paused
        finally:
            admin.execute_command("CLIENT", "UNPAUSE")
        with pytest.raises(LockError) as raised:
            await asyncio.wait_for(retry, 10)
        assert not isinstance(raised.value, LockNotOwnedError)
        got, theirs = await asyncio.wait_for(other, 10)
        assert got is True and theirs is not None and theirs != ours
        await asyncio.sleep(0.2)
        assert info(admin, "LOCK", key).get("owner") == theirs.decode(), "B's hold was released"
        assert lock.local.token == theirs
        await lock.release()
        assert not info(admin, "LOCK", key)
        await r.aclose()

    asyncio.run(main())


class Joined(NamedTuple):
    name: str
    #: The first holder and the one that joins its hold with its owner as
    #: ``token=``, from the module, client and key.
    build: Callable[[Any, Any, str], tuple[Any, Any]]
    info: str
    #: The client talks to a module before 1.1.0: releases without a mode.
    no_mode: bool


def _same_object(m: Any, r: Any, k: str) -> tuple[Any, Any]:
    lock = m.Lock(r, k, timeout=30, thread_local=False)
    return lock, lock


def _downgrade(m: Any, r: Any, k: str) -> tuple[Any, Any]:
    rw = m.ReadWriteLock(r, k, timeout=30, thread_local=False)
    return rw.write_lock(), rw.read_lock()


JOINED = [
    Joined("same object", _same_object, "LOCK", False),
    Joined(
        "another object",
        lambda m, r, k: (
            m.Lock(r, k, timeout=30, thread_local=False),
            m.Lock(r, k, timeout=30, thread_local=False),
        ),
        "LOCK",
        False,
    ),
    Joined("downgrade without the mode", _downgrade, "RWLOCK", True),
]


def the_release_ran(admin: redis.Redis, case: Joined, key: str, owner: bytes) -> None:
    """What the cut release would have done had it run before the cut (its
    reply lost): the same release, sent by the test once the writes resume."""
    if case.info == "LOCK":
        admin.execute_command("LOCK.RELEASE", key, owner)
    else:
        admin.execute_command("RWLOCK.UNLOCK", key, owner)  # no mode: as before 1.1.0


def joined_survives(admin: redis.Redis, case: Joined, key: str, owner: bytes) -> bool:
    fields = info(admin, case.info, key)
    if case.info == "LOCK":
        return fields.get("owner") == owner.decode() and int(fields.get("holds", 0)) == 1
    return fields.get("mode") == "read" and int(fields.get("readers", 0)) == 1


@pytest.mark.parametrize("case", JOINED, ids=[c.name for c in JOINED])
def test_sync_a_joined_hold_is_never_sent_again(
    server: Server, admin: redis.Redis, case: Joined
) -> None:
    """The first hold's owner was made for it, but a second acquire named it
    as ``token=``: the owner holds twice. The first release is cut; had it
    run, a release sent again would take the second hold. Not sent again:
    the first holder keeps its hold (as with ``token=``), the second survives."""
    key = f"joined-sync-{case.name}"
    before = client_ids(admin)
    r = server.client()
    if case.no_mode:
        warden._core._no_unlock_mode[r] = True
    first, second = case.build(warden, r, key)
    assert first.acquire()
    owner = first.local.token
    assert second.acquire(token=owner)
    errors: list[BaseException] = []

    def release() -> None:
        try:
            first.release()
        except BaseException as error:
            errors.append(error)

    admin.execute_command("CLIENT", "PAUSE", 10000, "WRITE")
    try:
        thread = threading.Thread(target=release)
        thread.start()
        cut(admin, before)
        thread.join(5)
        time.sleep(0.3)  # a release sent again would be held by the pause
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
    assert len(errors) == 1 and isinstance(errors[0], redis.ConnectionError), errors
    time.sleep(0.3)  # for a release sent again to run
    the_release_ran(admin, case, key, owner)
    time.sleep(0.2)
    assert joined_survives(admin, case, key, owner), info(admin, case.info, key)
    assert first.local.token == owner  # kept, as redis-py's with token=
    second.release()
    r.close()


@pytest.mark.parametrize("case", JOINED, ids=[c.name for c in JOINED])
def test_asyncio_a_joined_hold_is_never_sent_again(
    server: Server, admin: redis.Redis, case: Joined
) -> None:
    key = f"joined-asyncio-{case.name}"

    async def main() -> None:
        before = client_ids(admin)
        r = server.async_client()
        if case.no_mode:
            warden._core._no_unlock_mode[r] = True
        first, second = case.build(warden.asyncio, r, key)
        assert await first.acquire()
        owner = first.local.token
        assert await second.acquire(token=owner)
        admin.execute_command("CLIENT", "PAUSE", 10000, "WRITE")
        try:
            release = asyncio.ensure_future(first.release())
            await asyncio.to_thread(cut, admin, before)
            with pytest.raises(redis.ConnectionError):
                await asyncio.wait_for(release, 5)
            await asyncio.sleep(0.3)  # a release sent again would be held by the pause
        finally:
            admin.execute_command("CLIENT", "UNPAUSE")
        await asyncio.sleep(0.3)  # for a release sent again to run
        the_release_ran(admin, case, key, owner)
        await asyncio.sleep(0.2)
        assert joined_survives(admin, case, key, owner), info(admin, case.info, key)
        assert first.local.token == owner
        await second.release()
        await r.aclose()

    asyncio.run(main())


# Sent again while the server keeps cutting it: a watchdog lease of 6 s
# (renewed every 2 s), the release and what is sent again cut for this long.
CUT_FOR = 1.5


def test_sync_a_watchdog_stops_at_a_release_sent_again(own_server: Server) -> None:
    """The release of a watchdog lock is cut, and so is every send of it
    for a while: no renewal is sent after the release, and once the writes
    resume a later send frees the key (well before its lease would end)."""
    admin = own_server.client()
    key = "watchdog-sync"
    before = client_ids(admin)
    r = own_server.client()
    lock = warden.Lock(r, key, watchdog_timeout=6, thread_local=False)
    assert lock.acquire()
    renewals = extends(admin)
    errors: list[BaseException] = []

    def release() -> None:
        try:
            lock.release()
        except BaseException as error:
            errors.append(error)

    admin.execute_command("CLIENT", "PAUSE", 10000, "WRITE")
    try:
        thread = threading.Thread(target=release)
        thread.start()
        released = time.monotonic()
        killed = cut_every_release(admin, before, CUT_FOR)
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
    thread.join(5)
    assert len(errors) == 1 and isinstance(errors[0], redis.ConnectionError), errors
    freed = freed_within(admin, key, 2.5)
    time.sleep(max(0.0, released + 3 - time.monotonic()))  # past the watchdog's first renewal
    assert extends(admin) == renewals, "the watchdog renewed after the release"
    assert freed, "the key was not freed by a send after the cuts"
    assert killed >= 3, f"sent again {killed - 1} times only"
    assert lock.local.token is None
    r.close()
    admin.close()


def test_asyncio_a_watchdog_stops_at_a_release_sent_again(own_server: Server) -> None:
    admin = own_server.client()
    key = "watchdog-asyncio"

    async def main() -> None:
        before = client_ids(admin)
        r = own_server.async_client()
        lock = warden.asyncio.Lock(r, key, watchdog_timeout=6)
        assert await lock.acquire()
        renewals = extends(admin)
        admin.execute_command("CLIENT", "PAUSE", 10000, "WRITE")
        try:
            release = asyncio.ensure_future(lock.release())
            released = time.monotonic()
            killed = await asyncio.to_thread(cut_every_release, admin, before, CUT_FOR)
        finally:
            admin.execute_command("CLIENT", "UNPAUSE")
        with pytest.raises(redis.ConnectionError):
            await asyncio.wait_for(release, 5)
        freed = await asyncio.to_thread(freed_within, admin, key, 2.5)
        await asyncio.sleep(max(0.0, released + 3 - time.monotonic()))
        assert extends(admin) == renewals, "the watchdog renewed after the release"
        assert freed, "the key was not freed by a send after the cuts"
        assert killed >= 3, f"sent again {killed - 1} times only"
        assert lock.local.token is None
        await r.aclose()

    asyncio.run(main())
    admin.close()
