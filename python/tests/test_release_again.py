"""A release whose connection breaks before the server runs it (writes
paused, then ``CLIENT KILL``): the caller gets the ``ConnectionError``, and
the release is sent once more on a new connection, so the key is free, not
held by nobody until its lease ends. Only for an owner made for the hold: a
caller's ``token=`` or a re-entrant owner may hold more, and is left to its
lease. Sync and asyncio, each kind of hold.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable, NamedTuple

import pytest
import redis
from servers import Server

import warden
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


def held(admin: redis.Redis, case: Case, key: str) -> bool:
    reply = admin.execute_command(f"{case.info}.INFO", key)
    if reply is None:
        return False
    items = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2])
    fields = {k.decode() if isinstance(k, bytes) else k: v for k, v in items}
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
