"""warden.Lock and warden.asyncio.Lock do what redis-py 8.2's Lock does when
an extend leaves no positive lease, a lock has no timeout of its own
(``timeout=0``: warden's watchdog lease), a release fails in flight or
another acquirer takes the lock meanwhile, and ``acquire`` is given
redis-py's arguments. One table per behaviour, each row run on both."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Optional

import pytest
import redis
from redis.exceptions import LockError, LockNotOwnedError

import warden
import warden._holder
import warden.asyncio
import warden.asyncio._holder

NAME = "parity"

# What an extend did to the lease (ms left before: `old`, after: `new`).
ADDED = "the time is added to what was left"
SET = "the lease is set to the time"
KEPT = "the lease is left as it was, the answer True"
REFUSED = "LockNotOwnedError, the lock still held"  # nothing of its own to extend
NOT_OWNED = "LockNotOwnedError"  # the lease had ended

# timeout, additional_time, replace_ttl, lease ended before the extend, outcome
EXTEND = [
    pytest.param(10, 10, False, False, ADDED, id="add-10s"),
    pytest.param(10, 10, True, False, SET, id="replace-with-10s"),
    pytest.param(10, -5, False, False, ADDED, id="add-minus-5s-shortens"),
    pytest.param(10, 0.0004, True, False, KEPT, id="replace-with-under-1ms-keeps"),
    pytest.param(10, 0, True, False, KEPT, id="replace-with-0-keeps"),
    pytest.param(10, -1, True, False, KEPT, id="replace-with-negative-keeps"),
    pytest.param(10, -20, False, False, KEPT, id="add-past-zero-keeps"),
    pytest.param(0, 0, True, False, REFUSED, id="timeout-0-replace-with-0"),
    pytest.param(0, 0, False, False, REFUSED, id="timeout-0-add-0"),
    pytest.param(0, 10, False, False, REFUSED, id="timeout-0-add-10s"),
    pytest.param(10, 0, True, True, NOT_OWNED, id="ended-replace-with-0"),
    pytest.param(10, -20, False, True, NOT_OWNED, id="ended-add-past-zero"),
    pytest.param(10, 10, False, True, NOT_OWNED, id="ended-add-10s"),
]

RESET = "the lease is reset to timeout"
HELD = "True, the lock still held with its watchdog lease"

# timeout, lease ended before the reacquire, outcome
REACQUIRE = [
    pytest.param(10, False, RESET, id="timeout-10s"),
    pytest.param(0, False, HELD, id="timeout-0-keeps"),
    pytest.param(0, True, NOT_OWNED, id="timeout-0-ended"),
    pytest.param(10, True, NOT_OWNED, id="timeout-10s-ended"),
]

# What happens to the release command: it fails in flight, or another acquirer
# (through the same object: thread_local=False, or tasks on one loop) takes
# the lock before it is sent (the lease having ended) or after its answer.
FAILS = "the connection fails"
TIMES_OUT = "the reply times out"
OTHER_BEFORE = "the lease ended and another acquirer took the lock before the release"
OTHER_AFTER = "another acquirer took the lock after the release"

OURS = "still ours: a retry releases it"
THEIRS = "the other acquirer's, which can release it"
# A fresh owner's release that got no reply is handed to the background,
# which sends it again (the lock was held by nobody until its lease ended):
# the object forgets the hold at once, and a retry is a release of an
# unlocked lock. A caller's token= keeps redis-py's behaviour (OURS).
SENT_AGAIN = "handed to the release sent again: the object holds nothing, a retry raises LockError"

# timeout, token=, what happens, what release raises, whose hold the object keeps
RELEASE = [
    pytest.param(
        10, None, FAILS, redis.ConnectionError, SENT_AGAIN, id="connection-error-sent-again"
    ),
    pytest.param(
        None,
        None,
        FAILS,
        redis.ConnectionError,
        SENT_AGAIN,
        id="connection-error-sent-again-watched",
    ),
    pytest.param(10, None, TIMES_OUT, redis.TimeoutError, SENT_AGAIN, id="timeout-sent-again"),
    pytest.param(10, "mine", FAILS, redis.ConnectionError, OURS, id="connection-error-token"),
    pytest.param(None, "mine", TIMES_OUT, redis.TimeoutError, OURS, id="timeout-token-watched"),
    pytest.param(10, None, OTHER_AFTER, None, THEIRS, id="another-acquirer-after"),
    pytest.param(None, None, OTHER_AFTER, None, THEIRS, id="another-acquirer-after-watched"),
    pytest.param(10, None, OTHER_BEFORE, LockNotOwnedError, THEIRS, id="another-acquirer-before"),
]


def check_extend(outcome: str, additional_time: float, old: int, new: int) -> None:
    if outcome == ADDED:
        want = old + int(additional_time * 1000)
        assert want - 2000 < new <= want
    elif outcome == SET:
        assert additional_time * 1000 - 2000 < new <= additional_time * 1000
    else:  # KEPT, REFUSED: nothing changed the lease
        assert 1000 < new <= old


def release_fault(real: Callable[..., Any], lock: Any, fault: str) -> Callable[..., Any]:
    """``warden._holder.call`` with ``fault`` on the first release it sends."""
    fired = []

    def call(client: Any, name: Any, command: str, *args: Any, **kwargs: Any) -> Any:
        if command != lock.commands.release or fired:
            return real(client, name, command, *args, **kwargs)
        fired.append(command)
        if fault == FAILS:
            raise redis.ConnectionError("Connection closed by server.")
        if fault == TIMES_OUT:
            raise redis.TimeoutError("Timeout reading from socket")
        if fault == OTHER_BEFORE:
            assert lock.acquire(blocking=False)
        reply = real(client, name, command, *args, **kwargs)
        if fault == OTHER_AFTER:
            assert lock.acquire(blocking=False)
        return reply

    return call


def async_release_fault(real: Callable[..., Any], lock: Any, fault: str) -> Callable[..., Any]:
    """``warden.asyncio._holder.call`` with ``fault`` on the first release."""
    fired = []

    async def call(client: Any, name: Any, command: str, *args: Any, **kwargs: Any) -> Any:
        if command != lock.commands.release or fired:
            return await real(client, name, command, *args, **kwargs)
        fired.append(command)
        if fault == FAILS:
            raise redis.ConnectionError("Connection closed by server.")
        if fault == TIMES_OUT:
            raise redis.TimeoutError("Timeout reading from socket")
        if fault == OTHER_BEFORE:
            assert await lock.acquire(blocking=False)
        reply = await real(client, name, command, *args, **kwargs)
        if fault == OTHER_AFTER:
            assert await lock.acquire(blocking=False)
        return reply

    return call


# --- sync -------------------------------------------------------------------


@pytest.mark.parametrize("timeout, additional_time, replace_ttl, ended, outcome", EXTEND)
def test_extend(
    r: redis.Redis,
    timeout: float,
    additional_time: float,
    replace_ttl: bool,
    ended: bool,
    outcome: str,
) -> None:
    lock = warden.Lock(r, NAME, timeout=timeout)
    assert lock.acquire(blocking=False)
    if ended:
        r.delete(NAME)
    old = r.pttl(NAME)
    if outcome in (REFUSED, NOT_OWNED):
        with pytest.raises(LockNotOwnedError):
            lock.extend(additional_time, replace_ttl=replace_ttl)
    else:
        assert lock.extend(additional_time, replace_ttl=replace_ttl) is True
    if outcome == NOT_OWNED:
        assert not lock.locked()
        return
    assert lock.owned()
    check_extend(outcome, additional_time, old, r.pttl(NAME))
    lock.release()


@pytest.mark.parametrize("timeout, ended, outcome", REACQUIRE)
def test_reacquire(r: redis.Redis, timeout: float, ended: bool, outcome: str) -> None:
    lock = warden.Lock(r, NAME, timeout=timeout)
    assert lock.acquire(blocking=False)
    if ended:
        r.delete(NAME)
        with pytest.raises(LockNotOwnedError):
            lock.reacquire()
        return
    assert r.pexpire(NAME, 5000)
    assert lock.reacquire() is True
    assert lock.owned()
    if outcome == RESET:
        assert 8000 < r.pttl(NAME) <= 10000
    else:  # the watchdog's lease, which pexpire shortened: its next renewal restores it
        assert 1000 < r.pttl(NAME) <= 5000
    lock.release()


@pytest.mark.parametrize("timeout, token, fault, raises, after", RELEASE)
def test_release(
    r: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    timeout: Optional[float],
    token: Optional[str],
    fault: str,
    raises: Optional[type[Exception]],
    after: str,
) -> None:
    lock = warden.Lock(r, NAME, timeout=timeout, thread_local=False)
    assert lock.acquire(blocking=False, token=token)
    ours = lock.local.token
    if fault == OTHER_BEFORE:
        r.delete(NAME)
    monkeypatch.setattr(warden._holder, "call", release_fault(warden._holder.call, lock, fault))
    if raises is None:
        lock.release()
    else:
        with pytest.raises(raises):
            lock.release()
    holder = lock.local.token
    if after == SENT_AGAIN:
        assert holder is None and lock.local.watchdog is None
        with pytest.raises(LockError) as retry:
            lock.release()  # the retry: nothing is sent
        assert not isinstance(retry.value, LockNotOwnedError)
        deadline = time.monotonic() + 5
        while lock.locked():
            assert time.monotonic() < deadline, "the release was not sent again"
            time.sleep(0.01)
        return
    assert holder is not None and (holder == ours) == (after != THEIRS)
    assert lock.owned() and lock.locked()
    lock.release()  # the retry, or the other acquirer's own release
    assert not lock.locked()
    assert lock.local.token is None


# redis-py's acquire(sleep, blocking, blocking_timeout, token): sleep first.
# args, kwargs, the lock busy, the answer
SYNC_ACQUIRE = [
    pytest.param((0.025,), {}, False, True, id="sleep-positional"),
    pytest.param((), {"sleep": 0.025}, False, True, id="sleep-keyword"),
    pytest.param((), {"sleep": 0.025, "blocking": False}, True, False, id="sleep-busy"),
    pytest.param((0.025, False), {}, True, False, id="blocking-second"),
]


@pytest.mark.parametrize("args, kwargs, busy, answer", SYNC_ACQUIRE)
def test_acquire_takes_redis_py_arguments(
    r: redis.Redis, args: tuple[Any, ...], kwargs: dict[str, Any], busy: bool, answer: bool
) -> None:
    other = warden.Lock(r, NAME)
    if busy:
        assert other.acquire(blocking=False)
    lock = warden.Lock(r, NAME, sleep=0.5, blocking_timeout=0.05)
    assert lock.acquire(*args, **kwargs) is answer
    (lock if answer else other).release()


# --- asyncio ----------------------------------------------------------------


@pytest.mark.parametrize("timeout, additional_time, replace_ttl, ended, outcome", EXTEND)
async def test_async_extend(
    ar: Any,
    timeout: float,
    additional_time: float,
    replace_ttl: bool,
    ended: bool,
    outcome: str,
) -> None:
    lock = warden.asyncio.Lock(ar, NAME, timeout=timeout)
    assert await lock.acquire(blocking=False)
    if ended:
        await ar.delete(NAME)
    old = await ar.pttl(NAME)
    if outcome in (REFUSED, NOT_OWNED):
        with pytest.raises(LockNotOwnedError):
            await lock.extend(additional_time, replace_ttl=replace_ttl)
    else:
        assert await lock.extend(additional_time, replace_ttl=replace_ttl) is True
    if outcome == NOT_OWNED:
        assert not await lock.locked()
        return
    assert await lock.owned()
    check_extend(outcome, additional_time, old, await ar.pttl(NAME))
    await lock.release()


@pytest.mark.parametrize("timeout, ended, outcome", REACQUIRE)
async def test_async_reacquire(ar: Any, timeout: float, ended: bool, outcome: str) -> None:
    lock = warden.asyncio.Lock(ar, NAME, timeout=timeout)
    assert await lock.acquire(blocking=False)
    if ended:
        await ar.delete(NAME)
        with pytest.raises(LockNotOwnedError):
            await lock.reacquire()
        return
    assert await ar.pexpire(NAME, 5000)
    assert await lock.reacquire() is True
    assert await lock.owned()
    if outcome == RESET:
        assert 8000 < await ar.pttl(NAME) <= 10000
    else:
        assert 1000 < await ar.pttl(NAME) <= 5000
    await lock.release()


@pytest.mark.parametrize("timeout, token, fault, raises, after", RELEASE)
async def test_async_release(
    ar: Any,
    monkeypatch: pytest.MonkeyPatch,
    timeout: Optional[float],
    token: Optional[str],
    fault: str,
    raises: Optional[type[Exception]],
    after: str,
) -> None:
    lock = warden.asyncio.Lock(ar, NAME, timeout=timeout, thread_local=False)
    assert await lock.acquire(blocking=False, token=token)
    ours = lock.local.token
    if fault == OTHER_BEFORE:
        await ar.delete(NAME)
    real = warden.asyncio._holder.call
    monkeypatch.setattr(warden.asyncio._holder, "call", async_release_fault(real, lock, fault))
    if raises is None:
        await lock.release()
    else:
        with pytest.raises(raises):
            await lock.release()
    holder = lock.local.token
    if after == SENT_AGAIN:
        assert holder is None and lock.local.watchdog is None
        with pytest.raises(LockError) as retry:
            await lock.release()  # the retry: nothing is sent
        assert not isinstance(retry.value, LockNotOwnedError)
        deadline = time.monotonic() + 5
        while await lock.locked():
            assert time.monotonic() < deadline, "the release was not sent again"
            await asyncio.sleep(0.01)
        return
    assert holder is not None and (holder == ours) == (after != THEIRS)
    assert await lock.owned() and await lock.locked()
    await lock.release()
    assert not await lock.locked()
    assert lock.local.token is None


# redis-py's asyncio acquire(blocking, blocking_timeout, token, *, sleep).
ASYNC_ACQUIRE = [
    pytest.param((), {"sleep": 0.025}, False, True, id="sleep-keyword"),
    pytest.param((False,), {"sleep": 0.025}, True, False, id="blocking-first-with-sleep"),
    pytest.param((False,), {}, True, False, id="blocking-first"),
]


@pytest.mark.parametrize("args, kwargs, busy, answer", ASYNC_ACQUIRE)
async def test_async_acquire_takes_redis_py_arguments(
    ar: Any, args: tuple[Any, ...], kwargs: dict[str, Any], busy: bool, answer: bool
) -> None:
    other = warden.asyncio.Lock(ar, NAME)
    if busy:
        assert await other.acquire(blocking=False)
    lock = warden.asyncio.Lock(ar, NAME, sleep=0.5, blocking_timeout=0.05)
    assert await lock.acquire(*args, **kwargs) is answer
    await (lock if answer else other).release()
