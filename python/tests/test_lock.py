"""warden.Lock and warden.ReadWriteLock against a real server."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis
import redis.connection
from conftest import no_retries
from redis.exceptions import LockError, LockNotOwnedError, ResponseError
from servers import Server

import warden


def info(r: redis.Redis, name: str, command: str = "LOCK.INFO") -> dict[str, Any]:
    reply = r.execute_command(command, name)
    if reply is None:
        return {}
    items = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2])
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in items}


def wait_for(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def test_drop_in_through_lock_class(r: redis.Redis) -> None:
    lock = r.lock("order:42", timeout=5, lock_class=warden.Lock)
    assert isinstance(lock, warden.Lock)
    assert lock.acquire()
    assert isinstance(lock.fence, int) and lock.fence > 0
    assert info(r, "order:42")["owner"] == lock.local.token
    assert 4000 < r.pttl("order:42") <= 5000
    assert lock.locked() and lock.owned()
    lock.release()
    assert not lock.locked() and lock.fence is None
    with pytest.raises(LockError):
        lock.release()


def test_twenty_threads_strictly_increasing_fences_never_two_inside(r: redis.Redis) -> None:
    inside = 0
    fences: list[int] = []
    overlaps = 0

    def worker() -> None:
        nonlocal inside, overlaps
        lock = warden.Lock(r, "contended", timeout=10)
        for _ in range(15):
            with lock:
                inside += 1
                if inside != 1:
                    overlaps += 1
                fences.append(lock.fence)  # type: ignore[arg-type]
                time.sleep(0.0005)
                inside -= 1

    threads = [threading.Thread(target=worker) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == 0
    assert len(fences) == 300
    assert all(a < b for a, b in zip(fences, fences[1:]))


def test_blocking_timeout_waits_in_the_server_then_gives_up(r: redis.Redis) -> None:
    holder = warden.Lock(r, "busy", timeout=10)
    assert holder.acquire()
    other = warden.Lock(r, "busy", timeout=10, blocking_timeout=0.3)
    started = time.monotonic()
    assert not other.acquire()
    assert 0.25 < time.monotonic() - started < 2
    assert info(r, "busy")["waiters"] == 0
    assert not other.acquire(blocking=False)
    holder.release()
    assert other.acquire(blocking=False)
    other.release()


def test_release_hands_the_lock_to_a_waiter(r: redis.Redis) -> None:
    holder = warden.Lock(r, "handoff", timeout=10)
    assert holder.acquire()
    got: list[int] = []
    waiter = warden.Lock(r, "handoff", timeout=10)
    t = threading.Thread(target=lambda: got.append(int(waiter.acquire()) and waiter.fence or 0))
    t.start()
    wait_for(lambda: info(r, "handoff")["waiters"] == 1)
    first = holder.fence
    holder.release()
    t.join(5)
    assert got and got[0] > first  # type: ignore[operator]


def test_read_timeout_is_wait_plus_margin_whatever_the_socket_timeout(server: Server) -> None:
    r = server.client(socket_timeout=0.1)
    holder = warden.Lock(r, "slow", timeout=10, thread_local=False)
    assert holder.acquire()
    threading.Timer(0.5, holder.release).start()
    assert warden.Lock(r, "slow", timeout=10, blocking_timeout=3).acquire()


def test_a_killed_wait_is_not_sent_again_whatever_the_retry(server: Server) -> None:
    r = server.client()  # redis-py's default Retry: 3 retries on a new connection
    holder = warden.Lock(r, "killed", timeout=10)
    assert holder.acquire()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            warden.Lock(r, "killed", timeout=10, blocking_timeout=5).acquire()
        except BaseException as error:
            errors.append(error)

    t = threading.Thread(target=wait)
    t.start()
    wait_for(lambda: info(r, "killed")["waiters"] == 1)
    for client in r.client_list():
        if client["cmd"] == "lock.acquire":
            r.client_kill_filter(_id=client["id"])
    t.join(5)
    assert errors and isinstance(errors[0], redis.ConnectionError)
    assert info(r, "killed")["waiters"] == 0
    holder.release()
    assert r.exists("killed") == 0


def test_a_fresh_owner_per_acquire_unless_reentrant(r: redis.Redis) -> None:
    lock = warden.Lock(r, "reent", timeout=10)
    assert lock.acquire()
    assert not lock.acquire(blocking=False)
    lock.release()
    lock = warden.Lock(r, "reent", timeout=10, reentrant=True)
    assert lock.acquire() and lock.acquire()
    assert info(r, "reent")["holds"] == 2
    lock.release()
    assert lock.owned()
    lock.release()
    assert not lock.locked()


def test_extend_adds_time_and_reacquire_resets_it(r: redis.Redis) -> None:
    lock = warden.Lock(r, "ext", timeout=10)
    assert lock.acquire()
    assert lock.extend(10)
    assert 19000 < r.pttl("ext") <= 20000
    assert lock.extend(5, replace_ttl=True)
    assert r.pttl("ext") <= 5000
    assert lock.reacquire()
    assert 9000 < r.pttl("ext") <= 10000
    r.delete("ext")
    with pytest.raises(LockNotOwnedError):
        lock.extend(1)


def test_a_key_of_another_type_is_a_wrongtype_error(r: redis.Redis) -> None:
    r.set("taken", "data")
    with pytest.raises(ResponseError, match="^WRONGTYPE"):
        warden.Lock(r, "taken", blocking_timeout=0.1).acquire()
    with pytest.raises(LockError, match="^WRONGTYPE"):  # redis-py's Lock raises LockError
        with warden.Lock(r, "taken", blocking_timeout=0.1):
            pass
    assert r.get("taken") == b"data"


def test_watchdog_keeps_a_short_lease_alive(r: redis.Redis) -> None:
    # A 1 s lease renewed every third of it, over more than two leases (a
    # shorter one is lost whenever a busy machine stalls the renewing thread).
    lock = warden.Lock(r, "dog", watchdog_timeout=1.0)
    assert lock.acquire()
    time.sleep(2.5)
    assert lock.owned() and not lock.lost.is_set()
    assert 0 < r.pttl("dog") <= 1000
    lock.release()
    assert not lock.locked()


def test_watchdog_sets_lost_when_the_server_pauses_past_the_lease(own_server: Server) -> None:
    r = own_server.client(**no_retries())
    lock = warden.Lock(r, "paused", watchdog_timeout=0.5)
    assert lock.acquire()
    own_server.pause()
    try:
        assert lock.lost.wait(3)
    finally:
        own_server.resume()
    with pytest.raises(LockNotOwnedError):
        lock.release()


def test_watchdog_sets_lost_when_the_lock_is_taken_away(r: redis.Redis) -> None:
    lock = warden.Lock(r, "stolen", watchdog_timeout=0.3)
    assert lock.acquire()
    r.delete("stolen")
    assert lock.lost.wait(2)


def test_readers_share_and_a_writer_waits_for_them(r: redis.Redis) -> None:
    rw = warden.ReadWriteLock(r, "doc", timeout=10)
    a, b = rw.read_lock(), rw.read_lock()
    assert a.acquire() and b.acquire()
    assert info(r, "doc", "RWLOCK.INFO")["readers"] == 2
    writer = rw.write_lock()
    assert not writer.acquire(blocking=False)
    done = threading.Event()

    def write() -> None:
        with writer:
            done.set()

    t = threading.Thread(target=write)
    t.start()
    wait_for(lambda: info(r, "doc", "RWLOCK.INFO")["waiters"] == 1)
    a.release()
    assert not done.is_set()
    b.release()
    t.join(5)
    assert done.is_set() and writer.fence is None and not writer.locked()


def test_a_writer_may_downgrade(r: redis.Redis) -> None:
    rw = warden.ReadWriteLock(r, "down", timeout=10, reentrant=True)
    writer, reader = rw.write_lock(), rw.read_lock()
    assert writer.acquire() and writer.owned()
    assert reader.acquire()
    writer.release()
    assert info(r, "down", "RWLOCK.INFO")["mode"] in ("read", b"read")
    reader.release()
    assert not reader.locked()


def test_a_bounded_pool_full_of_waiters_still_releases(server: Server) -> None:
    # Every connection the application allows is taken by a waiter parked in
    # the server: the release must still go out, at once, to hand the lock on.
    pool = redis.BlockingConnectionPool(
        connection_class=redis.UnixDomainSocketConnection,
        path=server.socket,
        max_connections=4,
        timeout=2,
    )
    r = redis.Redis(connection_pool=pool)
    watcher = server.client()
    holder = warden.Lock(r, "bounded", timeout=30)
    assert holder.acquire()
    got: list[int] = []

    def wait() -> None:
        lock = warden.Lock(r, "bounded", timeout=30, blocking_timeout=20)
        if lock.acquire():
            got.append(lock.fence)  # type: ignore[arg-type]
            lock.release()

    waiters = [threading.Thread(target=wait) for _ in range(4)]
    for t in waiters:
        t.start()
    wait_for(lambda: info(watcher, "bounded")["waiters"] == 4)
    holder.release()  # before: ConnectionError("No connection available.")
    for t in waiters:
        t.join(10)
    assert len(got) == 4 and sorted(got) == got
    assert not watcher.exists("bounded")
    watcher.close()
    r.close()


def test_lost_belongs_to_the_hold_of_its_thread(r: redis.Redis) -> None:
    lock = warden.Lock(r, "shared", watchdog_timeout=1.0)  # thread_local=True
    first_lost = threading.Event()
    second_holds = threading.Event()
    first_done = threading.Event()
    seen: list[bool] = []

    def first() -> None:
        assert lock.acquire()
        r.delete("shared")  # taken away: this thread's watchdog reports it
        assert lock.lost.wait(5)
        first_lost.set()
        assert second_holds.wait(5)
        seen.append(lock.lost.is_set())  # still this thread's loss
        first_done.set()

    def second() -> None:
        assert first_lost.wait(5)
        assert lock.acquire()
        seen.append(lock.lost.is_set())  # a new hold, not lost
        second_holds.set()
        assert first_done.wait(5)
        lock.release()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(seen) == [False, True]
    with pytest.raises(LockError):
        lock.release()  # the main thread holds nothing


def test_an_interrupt_crossing_a_reentrant_grant_gives_it_back(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    read = redis.connection.AbstractConnection.read_response
    armed = [True]
    caller = threading.get_ident()

    def interrupted(self: Any, *args: Any, **kwargs: Any) -> Any:
        reply = read(self, *args, **kwargs)
        # The acquire's reply: read, never recorded (only this thread's: an
        # earlier test's watchdog may still be reading on another).
        if armed and threading.get_ident() == caller:
            armed.clear()
            raise KeyboardInterrupt
        return reply

    monkeypatch.setattr(redis.connection.AbstractConnection, "read_response", interrupted)
    lock = warden.Lock(r, "interrupted", reentrant=True)  # timeout=None: a watchdog
    with pytest.raises(KeyboardInterrupt):
        lock.acquire()
    wait_for(lambda: not r.exists("interrupted"))
    with lock:
        assert info(r, "interrupted")["holds"] == 1
    assert not r.exists("interrupted")
