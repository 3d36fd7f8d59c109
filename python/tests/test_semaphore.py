"""warden.Semaphore against a real server."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import pytest
import redis
import redis.connection
from redis.exceptions import LockError, LockNotOwnedError, ResponseError
from servers import Server

import warden


def info(r: redis.Redis, name: str) -> dict[str, Any]:
    """SEM.INFO as a dict; {} when the semaphore does not exist."""
    reply = r.execute_command("SEM.INFO", name)
    if reply is None:
        return {}
    items = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2])
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in items}


def used(r: redis.Redis, name: str) -> int:
    return int(info(r, name).get("used", 0))


def waiters(r: redis.Redis, name: str) -> int:
    return int(info(r, name).get("waiters", 0))


def wait_for(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def test_acquire_takes_permits_and_release_gives_them_back(r: redis.Redis) -> None:
    sem = warden.Semaphore(r, "api", 3, permits=2, timeout=10)
    assert sem.acquire()
    assert isinstance(sem.fence, int) and sem.fence > 0
    held = sem.info()
    assert held is not None
    assert (held["limit"], held["used"], held["holders"], held["permits"]) == (3, 2, 1, 2)
    assert 9000 < held["ttl"] <= 10000
    assert sem.owned()
    other = warden.Semaphore(r, "api", 3)
    assert other.acquire(blocking=False)  # 2 + 1 fit
    assert not warden.Semaphore(r, "api", 3).acquire(blocking=False)
    assert other.fence > sem.fence  # type: ignore[operator]
    sem.release()
    assert sem.fence is None and not sem.owned()
    assert used(r, "api") == 1
    other.release()
    assert not r.exists("api")  # no holders, no semaphore
    assert sem.info() is None
    with pytest.raises(LockError):
        sem.release()


def test_never_more_than_limit_permits_held_by_many_threads(r: redis.Redis) -> None:
    sem = warden.Semaphore(r, "pool", 3, timeout=10)  # one object, a hold per thread
    inside = 0
    most = 0
    counted = threading.Lock()

    def worker(permits: int) -> None:
        nonlocal inside, most
        for _ in range(8):
            assert sem.acquire(permits)
            try:
                with counted:
                    inside += permits
                    most = max(most, inside)
                time.sleep(0.001)
                with counted:
                    inside -= permits
            finally:
                sem.release()

    threads = [threading.Thread(target=worker, args=(1 + i % 3,)) for i in range(9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert 0 < most <= 3
    assert not r.exists("pool")


def test_a_large_request_is_not_overtaken_by_later_small_ones(r: redis.Redis) -> None:
    holder = warden.Semaphore(r, "fifo", 3, timeout=10)
    assert holder.acquire()  # 1 of 3 used: a request for 1 would fit, one for 3 not
    granted: list[str] = []
    releases: dict[str, threading.Event] = {}

    def take(label: str, permits: int) -> None:
        sem = warden.Semaphore(r, "fifo", 3, timeout=10)
        releases[label] = threading.Event()
        assert sem.acquire(permits, blocking_timeout=20)
        granted.append(label)
        assert releases[label].wait(20)
        sem.release()

    big = threading.Thread(target=take, args=("big", 3))
    big.start()
    wait_for(lambda: waiters(r, "fifo") == 1)
    smalls = [threading.Thread(target=take, args=(f"small{i}", 1)) for i in range(2)]
    for i, t in enumerate(smalls):
        t.start()
        wait_for(lambda i=i: waiters(r, "fifo") == 2 + i)  # type: ignore[misc]
    assert granted == [] and used(r, "fifo") == 1  # the small ones queue behind the big one
    holder.release()
    wait_for(lambda: granted == ["big"])
    assert used(r, "fifo") == 3 and waiters(r, "fifo") == 2
    releases["big"].set()
    wait_for(lambda: len(granted) == 3)
    assert granted[:1] == ["big"] and sorted(granted[1:]) == ["small0", "small1"]
    for label in ("small0", "small1"):
        releases[label].set()
    for t in [big, *smalls]:
        t.join(10)
    assert not r.exists("fifo")


def test_with_releases_when_the_block_raises(r: redis.Redis) -> None:
    sem = warden.Semaphore(r, "raises", 2, timeout=10)
    with pytest.raises(ValueError):
        with sem:
            assert used(r, "raises") == 1
            raise ValueError("work failed")
    assert not r.exists("raises") and sem.fence is None


def test_with_raises_lock_error_when_no_permits_come(r: redis.Redis) -> None:
    full = warden.Semaphore(r, "full", 1, timeout=10)
    assert full.acquire()
    with pytest.raises(LockError):
        with warden.Semaphore(r, "full", 1, blocking_timeout=0.1):
            pass
    assert waiters(r, "full") == 0
    full.release()


def test_watchdog_keeps_a_hold_alive_past_its_lease(r: redis.Redis) -> None:
    # 1 s leases: a shorter one is lost whenever a busy machine stalls the
    # renewing thread.
    sem = warden.Semaphore(r, "long", 2, watchdog_timeout=1.0)
    assert sem.acquire()
    time.sleep(2.5)  # more than two leases
    assert sem.owned() and not sem.lost.is_set()
    assert 0 < sem.info()["ttl"] <= 1000  # type: ignore[index]
    sem.release()
    assert not r.exists("long")


def test_lost_is_set_when_the_key_is_deleted_and_stays_with_its_hold(r: redis.Redis) -> None:
    sem = warden.Semaphore(r, "deleted", 2, watchdog_timeout=1.0)  # thread_local=True
    first_lost = threading.Event()
    second_holds = threading.Event()
    first_done = threading.Event()
    seen: list[bool] = []

    def first() -> None:
        assert sem.acquire()
        r.delete("deleted")  # the hold is gone: this thread's watchdog reports it
        assert sem.lost.wait(5)
        first_lost.set()
        assert second_holds.wait(5)
        seen.append(sem.lost.is_set())  # still this thread's loss
        first_done.set()
        with pytest.raises(LockNotOwnedError):
            sem.release()

    def second() -> None:
        assert first_lost.wait(5)
        assert sem.acquire()
        seen.append(sem.lost.is_set())  # a new hold, not lost
        second_holds.set()
        assert first_done.wait(5)
        sem.release()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(seen) == [False, True]
    assert not r.exists("deleted")


def test_a_second_acquire_on_one_object_in_one_thread_is_refused(r: redis.Redis) -> None:
    sem = warden.Semaphore(r, "twice", 3, timeout=10)
    assert sem.acquire()
    with pytest.raises(LockError):
        sem.acquire()
    assert used(r, "twice") == 1
    sem.release()
    assert sem.acquire()  # released: may take a new hold
    sem.release()


def test_keyboard_interrupt_while_waiting_leaves_the_queue(r: redis.Redis) -> None:
    holder = warden.Semaphore(r, "sigint", 2, permits=2, timeout=10)
    assert holder.acquire()
    main = threading.main_thread().ident
    assert threading.get_ident() == main
    # A process started in the background inherits SIGINT ignored, and Python
    # then installs no handler: SIGINT must raise KeyboardInterrupt here.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)

    def interrupt() -> None:
        wait_for(lambda: waiters(r, "sigint") == 1)
        signal.pthread_kill(main, signal.SIGINT)  # type: ignore[arg-type]

    t = threading.Thread(target=interrupt)
    t.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            warden.Semaphore(r, "sigint", 2, timeout=10).acquire(blocking_timeout=30)
        t.join(5)
    finally:
        signal.signal(signal.SIGINT, previous)
    wait_for(lambda: waiters(r, "sigint") == 0)
    holder.release()
    assert used(r, "sigint") == 0  # nobody was granted the released permits


def test_an_interrupt_crossing_a_grant_gives_the_permits_back(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    read = redis.connection.AbstractConnection.read_response
    armed = [True]

    def interrupted(self: Any, *args: Any, **kwargs: Any) -> Any:
        reply = read(self, *args, **kwargs)
        if armed:  # the acquire's reply: read, never recorded
            armed.clear()
            raise KeyboardInterrupt
        return reply

    monkeypatch.setattr(redis.connection.AbstractConnection, "read_response", interrupted)
    sem = warden.Semaphore(r, "crossed", 4, permits=3)  # timeout=None: a watchdog
    with pytest.raises(KeyboardInterrupt):
        sem.acquire()
    wait_for(lambda: used(r, "crossed") == 0)
    assert sem.fence is None
    with sem:
        assert used(r, "crossed") == 3
    assert used(r, "crossed") == 0


def test_a_bounded_pool_full_of_waiters_still_releases(server: Server) -> None:
    pool = redis.BlockingConnectionPool(
        connection_class=redis.UnixDomainSocketConnection,
        path=server.socket,
        max_connections=4,
        timeout=2,
    )
    r = redis.Redis(connection_pool=pool)
    watcher = server.client()
    holder = warden.Semaphore(r, "bounded", 2, permits=2, timeout=30)
    assert holder.acquire()
    got: list[int] = []

    def wait() -> None:
        sem = warden.Semaphore(r, "bounded", 2, permits=2, timeout=30, blocking_timeout=20)
        if sem.acquire():
            got.append(sem.fence)  # type: ignore[arg-type]
            sem.release()

    waiting = [threading.Thread(target=wait) for _ in range(4)]
    for t in waiting:
        t.start()
    wait_for(lambda: waiters(watcher, "bounded") == 4)
    holder.release()  # on the client's own pool, beside the 4 waits
    for t in waiting:
        t.join(10)
    assert len(got) == 4 and sorted(got) == got
    assert not watcher.exists("bounded")
    watcher.close()
    r.close()


def test_server_errors_surface_as_response_errors(r: redis.Redis) -> None:
    sem = warden.Semaphore(r, "bound", 10, timeout=10)
    assert sem.acquire()
    with pytest.raises(ResponseError, match="semaphore limit is 10, not 20"):
        warden.Semaphore(r, "bound", 20).acquire()
    with pytest.raises(ResponseError, match="invalid permits"):
        warden.Semaphore(r, "bound", 10).acquire(11)
    with pytest.raises(ResponseError, match="invalid permits"):
        warden.Semaphore(r, "bound", 10, permits=0).acquire()
    with pytest.raises(ResponseError, match="invalid limit"):
        warden.Semaphore(r, "other", 0).acquire()
    assert used(r, "bound") == 1
    sem.release()


def test_a_key_of_another_type_is_a_wrongtype_error(r: redis.Redis) -> None:
    r.set("data", "x")
    sem = warden.Semaphore(r, "data", 2, blocking_timeout=0.1)
    with pytest.raises(ResponseError, match="^WRONGTYPE"):
        sem.acquire()
    assert sem.info() is None
    assert r.get("data") == b"x"


def test_set_limit_grants_the_waiters_that_now_fit(r: redis.Redis) -> None:
    assert not warden.Semaphore(r, "resize", 1).set_limit(5)  # no semaphore yet
    sem = warden.Semaphore(r, "resize", 1, timeout=10)
    assert sem.acquire()
    got: list[bool] = []
    t = threading.Thread(
        target=lambda: got.append(warden.Semaphore(r, "resize", 1, timeout=10).acquire())
    )
    t.start()
    wait_for(lambda: waiters(r, "resize") == 1)
    assert sem.set_limit(2)
    t.join(5)
    assert got == [True] and used(r, "resize") == 2
    # The waiter stated the old limit when it queued; a new acquire must state the new one.
    assert sem.limit == 2
    with pytest.raises(ResponseError, match="semaphore limit is 2, not 1"):
        warden.Semaphore(r, "resize", 1).acquire(blocking=False)


def test_a_lowered_limit_refuses_a_waiter_that_no_longer_fits(r: redis.Redis) -> None:
    sem = warden.Semaphore(r, "shrink", 4, timeout=10)
    assert sem.acquire()
    errors: list[BaseException] = []

    def take_four() -> None:
        try:
            warden.Semaphore(r, "shrink", 4, permits=4, timeout=10).acquire(blocking_timeout=20)
        except ResponseError as error:
            errors.append(error)

    t = threading.Thread(target=take_four)
    t.start()
    wait_for(lambda: waiters(r, "shrink") == 1)
    assert sem.set_limit(2)
    t.join(5)
    assert len(errors) == 1 and "lowered" in str(errors[0])
    sem.release()
    assert not r.exists("shrink")


def test_extend_adds_to_this_holds_lease_and_reacquire_resets_it(r: redis.Redis) -> None:
    sem = warden.Semaphore(r, "ext", 2, timeout=10)
    assert sem.acquire()
    assert sem.extend(10)
    assert 19000 < sem.info()["ttl"] <= 20000  # type: ignore[index]
    assert sem.extend(5, replace_ttl=True)
    assert sem.info()["ttl"] <= 5000  # type: ignore[index]
    assert sem.reacquire()
    assert 9000 < sem.info()["ttl"] <= 10000  # type: ignore[index]
    r.delete("ext")
    with pytest.raises(LockNotOwnedError):
        sem.extend(1)
    with pytest.raises(LockNotOwnedError):
        sem.release()
