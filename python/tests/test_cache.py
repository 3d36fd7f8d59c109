"""warden.Cache and warden.asyncio.Cache against a real server."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import redis
from servers import Server

import warden
import warden.asyncio


def cache_info(r: Any, key: str) -> dict[str, Any]:
    reply = r.execute_command("CACHE.INFO", key)
    items = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2])
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in items}


def test_fifty_concurrent_callers_load_once(r: redis.Redis) -> None:
    cache = warden.Cache(r)
    loads = 0

    @cache.cached(key="product:{product_id}", ttl=60)
    def product(product_id: int) -> str:
        nonlocal loads
        loads += 1
        time.sleep(0.1)
        return f"product {product_id}"

    results: list[Any] = []
    barrier = threading.Barrier(50)

    def call() -> None:
        barrier.wait()
        results.append(product(42))

    threads = [threading.Thread(target=call) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert loads == 1
    assert results == [b"product 42"] * 50
    assert r.get("product:42") == b"product 42"  # a plain string
    assert 59_000 < r.pttl("product:42") <= 60_000


def test_a_failing_loader_abandons_and_the_next_caller_loads(r: redis.Redis) -> None:
    cache = warden.Cache(r)
    calls = 0

    def flaky() -> bytes:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("database down")
        return b"v"

    with pytest.raises(RuntimeError):
        cache.get_or_load("k", flaky, ttl=60)
    assert cache_info(r, "k")["lease"] is None
    assert cache.get_or_load("k", flaky, ttl=60) == b"v"
    assert calls == 2


def test_waiters_get_the_lease_when_the_loader_fails(r: redis.Redis) -> None:
    cache = warden.Cache(r)
    started = threading.Event()
    calls = 0

    def loader() -> bytes:
        nonlocal calls
        calls += 1
        if calls == 1:
            started.set()
            time.sleep(0.2)
            raise RuntimeError("first load fails")
        return b"second"

    errors: list[BaseException] = []
    first = threading.Thread(
        target=lambda: errors.append(pytest.raises(RuntimeError, cache.get_or_load, "w", loader))
    )
    first.start()
    started.wait(5)
    assert cache.get_or_load("w", loader, ttl=60) == b"second"
    first.join()
    assert calls == 2


def test_keyboard_interrupt_in_the_loader_abandons(r: redis.Redis) -> None:
    cache = warden.Cache(r)

    def interrupted() -> bytes:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cache.get_or_load("ki", interrupted)
    assert cache_info(r, "ki")["lease"] is None


def test_none_is_cached_as_a_negative_entry(r: redis.Redis) -> None:
    cache = warden.Cache(r, negative_ttl=5)
    loads = 0

    @cache.cached(key=lambda user_id: f"user:{user_id}", ttl=60)
    def user(user_id: str) -> Any:
        nonlocal loads
        loads += 1
        return None

    assert user("nobody") is None and user("nobody") is None
    assert loads == 1
    assert r.get("user:nobody") == b"" and r.pttl("user:nobody") <= 5000


def test_json_serializer_invalidate_and_stale(r: redis.Redis) -> None:
    cache = warden.Cache(r, serializer=warden.JsonSerializer(), prefix="c:")
    version = 1

    @cache.cached(key="price:{item}", ttl=60)
    def price(item: str) -> dict[str, Any]:
        return {"item": item, "version": version}

    assert price("a") == {"item": "a", "version": 1}
    version = 2
    assert price("a")["version"] == 1
    assert price.invalidate("a")  # type: ignore[attr-defined]
    assert price("a")["version"] == 2
    version = 3
    assert price.invalidate("a", stale=10)  # type: ignore[attr-defined]
    assert price(item="a")["version"] in (2, 3)  # served stale while it reloads
    deadline = time.monotonic() + 5
    while price("a")["version"] != 3:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_refresh_ahead_reloads_in_the_background(r: redis.Redis) -> None:
    cache = warden.Cache(r)
    loads: list[float] = []
    reload_may_finish = threading.Event()

    def loader() -> bytes:
        loads.append(time.monotonic())
        if len(loads) > 1:  # the reload ends only once the stale value was served
            reload_may_finish.wait(10)
        return str(len(loads)).encode()

    # A 30 s value read 0.15 s (or, on a busy machine, more) after its fill:
    # less than 29.9 s before it expires, so due for a refresh.
    assert cache.get_or_load("hot", loader, ttl=30, refresh=29.9) == b"1"
    time.sleep(0.15)
    # Served at once: the reload is still held back.
    assert cache.get_or_load("hot", loader, ttl=30, refresh=29.9) == b"1"
    reload_may_finish.set()
    deadline = time.monotonic() + 10
    while r.get("hot") != b"2":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert len(loads) == 2


def test_a_stuck_loader_makes_waiters_give_up_after_bounded_retries(
    r: redis.Redis, server: Server
) -> None:
    holder = server.client(single_connection_client=True)
    assert holder.execute_command("CACHE.GET", "stuck", 60_000)[1] is not None  # never fills
    cache = warden.Cache(r, wait=0.1, retries=2)
    started = time.monotonic()
    with pytest.raises(warden.CacheWaitTimeout):
        cache.get_or_load("stuck", lambda: b"x")
    assert time.monotonic() - started < 30  # three 0.1 s waits, not the 60 s lease
    holder.close()


async def test_async_fifty_tasks_load_once(ar: Any) -> None:
    cache = warden.asyncio.Cache(ar)
    loads = 0

    @cache.cached(key="product:{product_id}", ttl=60)
    async def product(product_id: int) -> str:
        nonlocal loads
        loads += 1
        await asyncio.sleep(0.1)
        return f"product {product_id}"

    results = await asyncio.gather(*(product(7) for _ in range(50)))
    assert loads == 1 and results == [b"product 7"] * 50


async def test_async_a_cancelled_loader_abandons(ar: Any) -> None:
    cache = warden.asyncio.Cache(ar)
    started = asyncio.Event()

    async def forever() -> bytes:
        started.set()
        await asyncio.sleep(3600)
        return b"never"

    task = asyncio.ensure_future(cache.get_or_load("slow", forever))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    reply = await ar.execute_command("CACHE.INFO", "slow")
    lease = reply.get(b"lease", reply.get("lease")) if isinstance(reply, dict) else reply[5]
    assert lease is None
    assert await cache.get_or_load("slow", lambda: asyncio.sleep(0, b"now")) == b"now"


async def test_async_a_failing_loader_abandons(ar: Any) -> None:
    cache = warden.asyncio.Cache(ar, serializer=warden.JsonSerializer())

    @cache.cached(key="k:{n}", ttl=60)
    async def boom(n: int) -> Any:
        raise ValueError(n)

    with pytest.raises(ValueError):
        await boom(1)

    @cache.cached(key="k:{n}", ttl=60)
    async def fine(n: int) -> Any:
        return [n]

    assert await fine(1) == [1]
    assert await fine.invalidate(1)  # type: ignore[attr-defined]


def test_distinct_arguments_never_share_a_key(r: redis.Redis) -> None:
    cache = warden.Cache(r)

    @cache.cached("pair:{a}:{b}", ttl=60)
    def pair(a: str, b: str) -> str:
        return f"{a}|{b}"

    assert pair("1:2", "3") == b"1:2|3"
    assert pair("1", "2:3") == b"1|2:3"  # before: served "1:2|3"
    assert pair("1:2", "3") == b"1:2|3"
    assert r.get("pair:1%3A2:3") == b"1:2|3"  # readable: only separators are escaped
    assert r.get("pair:1:2%3A3") == b"1|2:3"


def test_an_argument_cannot_make_a_hash_tag_and_templates_must_separate_fields(
    r: redis.Redis,
) -> None:
    cache = warden.Cache(r)

    @cache.cached("{{tenant:{tenant}}}:user:{user}", ttl=60)
    def user(tenant: str, user: str) -> str:
        return user

    assert user("acme", "{x}") == b"{x}"
    assert r.get("{tenant:acme}:user:%7Bx%7D") == b"{x}"  # one hash tag, the template's
    with pytest.raises(ValueError):
        cache.cached("pair:{a}{b}", ttl=60)


def test_an_empty_value_is_not_a_negative_entry(r: redis.Redis) -> None:
    cache = warden.Cache(r, serializer=warden.TextSerializer())
    loads = 0

    def empty() -> str:
        nonlocal loads
        loads += 1
        return ""

    assert cache.get_or_load("empty", empty, ttl=60) == ""
    assert cache.get_or_load("empty", empty, ttl=60) == ""  # before: None
    assert loads == 1
    raw = warden.Cache(r)
    assert raw.get_or_load("nul", lambda: b"\x00x", ttl=60) == b"\x00x"
    assert raw.get_or_load("nul", lambda: b"other", ttl=60) == b"\x00x"
    assert raw.get_or_load("none", lambda: None, ttl=60) is None
    assert raw.get_or_load("none", lambda: b"other", ttl=60) is None
    assert r.get("none") == b""  # a negative entry is the empty string


def test_cached_asks_for_a_ttl(r: redis.Redis) -> None:
    cache = warden.Cache(r)
    with pytest.raises(TypeError, match="ttl"):
        cache.cached("forever:{n}")

    @cache.cached("forever:{n}", ttl=None)  # chosen: kept until invalidated
    def forever(n: int) -> str:
        return str(n)

    assert forever(1) == b"1"
    assert r.pttl("forever:1") == -1


async def test_async_empty_values_and_escaped_keys(ar: Any) -> None:
    cache = warden.asyncio.Cache(ar, serializer=warden.TextSerializer())
    with pytest.raises(TypeError, match="ttl"):
        cache.cached("k:{a}")

    @cache.cached("k:{a}:{b}", ttl=60)
    async def join(a: str, b: str) -> str:
        return a + b

    assert await join("", "") == "" and await join("", "") == ""
    assert await join("1:2", "3") == "1:23"
    assert await join("1", "2:3") == "12:3"
