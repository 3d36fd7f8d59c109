"""The near cache of warden.Cache and warden.asyncio.Cache against a real
server (docs/cache.md, "Near cache"), and the race checker:
WARDEN_NEAR_RACE_PAIRS sets its size (10,000 by default; a fifth through
Sentinel). WARDEN_SENTINEL_PORTS: where a Sentinel setup takes its ports."""

from __future__ import annotations

import asyncio
import os
import resource
import select
import threading
import time
from collections.abc import Iterator
from typing import Any, Callable, Optional

import pytest
import redis
import redis.asyncio.sentinel
import redis.sentinel
from servers import SERVER, Sentinels, Server

import warden
import warden.asyncio
from warden import NearCacheStats

KEY = "product:1"
SERVER_NAME = os.path.basename(SERVER)
DEADLINE = 10.0


def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def calls(r: redis.Redis, command: str) -> int:
    stats = r.info("commandstats").get(f"cmdstat_{command}")
    return int(stats["calls"]) if stats else 0


def tracking_ids(r: redis.Redis) -> list[int]:
    return [int(c["id"]) for c in r.client_list() if "t" in c["flags"]]


def loader(value: bytes) -> Callable[[], bytes]:
    return lambda: value


def refuse() -> bytes:
    raise AssertionError("loaded although the server holds the value")


def keep(cache: warden.Cache, key: str) -> Any:
    """Read ``key`` until the near cache answers it from memory."""
    near = cache.near_cache
    assert near is not None

    def hit() -> bool:
        hits = near.stats().hits
        cache.get_or_load(key, refuse)
        return near.stats().hits > hits

    until(hit, f"a near-cache hit on {key}")
    return cache.get_or_load(key, refuse)


@pytest.fixture
def near(r: redis.Redis) -> Iterator[warden.Cache]:
    with warden.Cache(r, near_cache=warden.NearCacheConfig()) as cache:
        yield cache


def test_a_hit_makes_no_round_trip(r: redis.Redis, near: warden.Cache) -> None:
    r.set(KEY, "v1")
    assert keep(near, KEY) == b"v1"
    peeks, gets = calls(r, "cache.peek"), calls(r, "cache.get")
    hits = near.near_cache.stats().hits  # type: ignore[union-attr]
    for _ in range(100):
        assert near.get_or_load(KEY, refuse) == b"v1"
    assert near.near_cache.stats().hits == hits + 100  # type: ignore[union-attr]
    assert (calls(r, "cache.peek"), calls(r, "cache.get")) == (peeks, gets)


# A write, and what a read after it answers (b"loaded": the loader ran).
WRITES: dict[str, tuple[Callable[[redis.Redis], Any], bytes]] = {
    "SET": (lambda r: r.set(KEY, "v2"), b"v2"),
    "DEL": (lambda r: r.delete(KEY), b"loaded"),
    "CACHE.INVALIDATE": (lambda r: r.execute_command("CACHE.INVALIDATE", KEY), b"loaded"),
    "FLUSHALL": (lambda r: r.flushall(), b"loaded"),
    "expiry": (lambda r: until(lambda: not r.exists(KEY), "the key to expire"), b"loaded"),
}


@pytest.mark.parametrize("write", WRITES, ids=list(WRITES))
def test_a_write_drops_the_kept_value(r: redis.Redis, near: warden.Cache, write: str) -> None:
    r.set(KEY, "v1", px=300 if write == "expiry" else None)
    assert keep(near, KEY) == b"v1"
    action, expected = WRITES[write]
    action(r)
    near.sync()
    assert near.get_or_load(KEY, loader(b"loaded"), ttl=60) == expected


def test_invalidation_and_flush_pushes_are_counted(r: redis.Redis, near: warden.Cache) -> None:
    stats = near.near_cache.stats  # type: ignore[union-attr]
    r.set(KEY, "v1")
    keep(near, KEY)
    before = stats()
    r.set(KEY, "v2")
    near.sync()
    assert stats().invalidations == before.invalidations + 1
    assert stats().entries == before.entries - 1
    keep(near, KEY)
    r.flushall()
    near.sync()
    assert stats().flushes == before.flushes + 1
    assert stats().entries == 0


def test_invalidate_drops_the_key_at_once(r: redis.Redis, near: warden.Cache) -> None:
    r.set(KEY, "v1")
    keep(near, KEY)
    assert near.invalidate(KEY)
    # No sync: this process's own invalidation is read back at once.
    assert near.get_or_load(KEY, loader(b"v2"), ttl=60) == b"v2"


def test_a_stale_value_is_not_kept_and_goes_through_cache_get(
    r: redis.Redis, near: warden.Cache
) -> None:
    r.set(KEY, "v1")
    keep(near, KEY)
    r.execute_command("CACHE.INVALIDATE", KEY, "STALE", 10_000)
    near.sync()
    gets = calls(r, "cache.get")
    loads = []
    assert near.get_or_load(KEY, lambda: loads.append(1) or b"v2", ttl=60) == b"v1"
    assert calls(r, "cache.get") == gets + 1  # CACHE.GET served it, and granted the reload
    assert near.near_cache.stats().entries == 0  # type: ignore[union-attr]
    until(lambda: r.get(KEY) == b"v2", "the reload")
    assert keep(near, KEY) == b"v2"
    assert loads == [1]


def test_concurrent_misses_load_once(r: redis.Redis, near: warden.Cache) -> None:
    loads = 0
    barrier = threading.Barrier(20)
    results: list[Any] = []

    def load() -> bytes:
        nonlocal loads
        loads += 1
        time.sleep(0.1)
        return b"v1"

    def read() -> None:
        barrier.wait()
        results.append(near.get_or_load(KEY, load, ttl=60))

    threads = [threading.Thread(target=read) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert loads == 1
    assert results == [b"v1"] * 20


@pytest.mark.parametrize(
    ("config", "left"),
    [
        (warden.NearCacheConfig(max_entries=3), ["k2", "k3", "k4"]),
        (warden.NearCacheConfig(max_bytes=10), ["k3", "k4"]),  # 4 bytes each
    ],
    ids=["entries", "bytes"],
)
def test_bounds_drop_the_least_recently_used(
    r: redis.Redis, config: warden.NearCacheConfig, left: list[str]
) -> None:
    with warden.Cache(r, near_cache=config) as cache:
        for i in range(5):
            r.set(f"k{i}", f"v{i}:{i}")
            keep(cache, f"k{i}")
        near = cache.near_cache
        assert near is not None
        assert list(near.store.entries) == left
        assert near.stats().bytes == 4 * len(left)
        hits = near.stats().hits
        cache.get_or_load("k0", refuse)
        assert near.stats().hits == hits  # dropped: asked again


def test_a_value_over_max_bytes_is_not_kept(r: redis.Redis) -> None:
    with warden.Cache(r, near_cache=warden.NearCacheConfig(max_bytes=3)) as cache:
        r.set(KEY, "four")
        for _ in range(3):
            assert cache.get_or_load(KEY, refuse) == b"four"
        assert cache.near_cache.stats().hits == 0  # type: ignore[union-attr]


def test_killing_the_tracking_connection_flushes(r: redis.Redis, near: warden.Cache) -> None:
    cache = near.near_cache
    assert cache is not None
    r.set(KEY, "v1")
    keep(near, KEY)
    (tracking,) = tracking_ids(r)
    assert tracking == cache.client_id
    flushes = cache.stats().flushes
    r.client_kill_filter(_id=tracking)
    until(lambda: cache.stats().flushes > flushes, "the flush")
    r.set(KEY, "v2")  # while it may still be down: no invalidation reaches it
    near.sync()
    assert near.get_or_load(KEY, refuse) == b"v2"
    until(lambda: cache.connected and tracking_ids(r) not in ([], [tracking]), "a new connection")
    assert keep(near, KEY) == b"v2"


def test_a_server_restart_flushes(own_server: Server) -> None:
    r = own_server.client()
    with warden.Cache(r, near_cache=warden.NearCacheConfig()) as near:
        cache = near.near_cache
        assert cache is not None
        r.set(KEY, "v1")
        keep(near, KEY)
        flushes = cache.stats().flushes
        own_server.restart()
        r.set(KEY, "v2")
        until(lambda: cache.stats().flushes > flushes, "the flush")
        assert near.get_or_load(KEY, refuse) == b"v2"
        until(lambda: cache.connected, "the connection made again")
        assert keep(near, KEY) == b"v2"
    r.close()


def readable(fd: Optional[int], seconds: float = 10) -> bool:
    """Whether ``fd`` has bytes to read within ``seconds`` (poll(2): any
    descriptor number)."""
    assert fd is not None
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(seconds * 1000))


@pytest.mark.parametrize("descriptors", ["low", "past 1024"])
def test_no_hit_while_an_invalidation_waits_unread(r: redis.Redis, descriptors: str) -> None:
    """The reader thread is held inside one push; a second acknowledged
    invalidation waits unread in the socket: no hit for its key, whatever the
    socket's descriptor number (``select`` cannot watch one past 1024)."""
    held: list[int] = []
    if descriptors != "low":
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard != resource.RLIM_INFINITY and hard < 1200:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard}")
        if soft != resource.RLIM_INFINITY and soft < 1200:
            resource.setrlimit(
                resource.RLIMIT_NOFILE,
                (1200 if hard == resource.RLIM_INFINITY else min(hard, 4096), hard),
            )
        held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    release = threading.Event()
    try:
        with warden.Cache(r, near_cache=warden.NearCacheConfig()) as cache:
            near = cache.near_cache
            assert near is not None
            for key in ("block", KEY):
                r.set(key, "old")
                assert keep(cache, key) == b"old"
            original = near._on_push
            inside = threading.Event()

            def slow(push: Any) -> Any:
                if b"block" in (push[1] or []):
                    inside.set()
                    release.wait(10)
                return original(push)

            near._connection._parser.set_invalidation_push_handler(slow)
            try:
                r.execute_command("CACHE.INVALIDATE", "block")
                assert inside.wait(10), "the reader took the first push"
                r.execute_command("CACHE.INVALIDATE", KEY)
                # The server answers the writer before it writes the push
                # (docs/cache.md): wait until the push is in the socket,
                # asked with poll(2), not the near cache's own check.
                assert readable(near._fd), "the second push reached the socket"
                hits = near.stats().hits
                assert near.get(KEY) is None
                assert near.stats().hits == hits
            finally:
                release.set()
    finally:
        release.set()
        for fd in held:
            os.close(fd)


def test_close_releases_the_connection_and_the_reader(r: redis.Redis) -> None:
    cache = warden.Cache(r, near_cache=warden.NearCacheConfig())
    r.set(KEY, "v1")
    keep(cache, KEY)
    assert len(tracking_ids(r)) == 1
    cache.close()
    assert not [t for t in threading.enumerate() if t.name == "warden-near-cache"]
    until(lambda: tracking_ids(r) == [], "the tracking connection to close")
    assert cache.near_cache.stats().entries == 0  # type: ignore[union-attr]
    assert cache.get_or_load(KEY, refuse) == b"v1"  # from the server


def test_refresh_ahead_goes_to_the_server_when_due(r: redis.Redis, near: warden.Cache) -> None:
    r.set(KEY, "v1", ex=60)
    keep(near, KEY)
    gets = calls(r, "cache.get")
    reloaded = threading.Event()

    def reload() -> bytes:
        reloaded.set()
        return b"v2"

    # Due: 60 s left is less than refresh=120 s.
    assert near.get_or_load(KEY, reload, ttl=60, refresh=120) == b"v1"
    assert calls(r, "cache.get") == gets + 1
    assert reloaded.wait(DEADLINE)


async def test_asyncio_hit_invalidation_and_aclose(ar: Any) -> None:
    async with warden.asyncio.Cache(ar, near_cache=warden.NearCacheConfig()) as cache:
        near = cache.near_cache
        assert near is not None
        await ar.set(KEY, "v1")

        async def keep_async() -> Any:
            deadline = time.monotonic() + DEADLINE
            while True:
                hits = near.stats().hits
                value = await cache.get_or_load(KEY, refuse_async)
                if near.stats().hits > hits:
                    return value
                assert time.monotonic() < deadline, "no near-cache hit"

        assert await keep_async() == b"v1"
        peeks = (await ar.info("commandstats")).get("cmdstat_cache.peek", {}).get("calls")
        for _ in range(50):
            assert await cache.get_or_load(KEY, refuse_async) == b"v1"
        assert (await ar.info("commandstats"))["cmdstat_cache.peek"]["calls"] == peeks
        await ar.set(KEY, "v2")
        await cache.sync()
        assert await cache.get_or_load(KEY, refuse_async) == b"v2"
        assert await cache.invalidate(KEY)
        assert await cache.get_or_load(KEY, loaded_async, ttl=60) == b"loaded"
        flushes = near.stats().flushes
        await ar.client_kill_filter(_id=near.client_id)
        deadline = time.monotonic() + DEADLINE
        while near.stats().flushes == flushes:
            assert time.monotonic() < deadline, "no flush"
            await asyncio.sleep(0.005)
        await ar.flushall()
    assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert not near.connected


async def test_asyncio_closed_while_it_connects_again_ends_its_reader(
    ar: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # aclose() lands while the reader opens a new tracking connection, and
    # the cancel is dropped on the way (as asyncio.wait_for drops one before
    # Python 3.12, CPython gh-86296: a Sentinel query's send): the reader
    # must not go on to read the new connection forever.
    real_open = warden.asyncio.near_cache.NearCache._open
    opening = asyncio.Event()

    async def open_dropping_a_cancel(self: Any) -> Any:
        if self.client_id is None:  # the first connection
            return await real_open(self)
        opening.set()
        connecting = asyncio.ensure_future(asyncio.sleep(0.2))
        try:
            await asyncio.shield(connecting)
        except asyncio.CancelledError:
            await connecting  # the send completed: its result returned, the cancel lost
        return await real_open(self)

    monkeypatch.setattr(warden.asyncio.near_cache.NearCache, "_open", open_dropping_a_cancel)
    cache = warden.asyncio.Cache(ar, near_cache=warden.NearCacheConfig())
    near = cache.near_cache
    assert near is not None
    await near.sync()
    await ar.client_kill_filter(_id=near.client_id)
    await asyncio.wait_for(opening.wait(), DEADLINE)
    closing = asyncio.ensure_future(cache.aclose())
    await asyncio.wait({closing}, timeout=DEADLINE)  # (no cancel of its own)
    if not closing.done():
        closing.cancel()
    assert closing.done() and not closing.cancelled(), "aclose() waits for its reader forever"
    assert not near.connected


async def refuse_async() -> bytes:
    return refuse()


async def loaded_async() -> bytes:
    return b"loaded"


# The race checker.

PAIRS = int(os.environ.get("WARDEN_NEAR_RACE_PAIRS", "10000"))
THREADS = 4
KEYS_PER_THREAD = 3


class Race:
    """Write/read pairs on THREADS threads, each owning a few keys: SET k
    v+1 and GET k (the server's truth, y) on a writer of its own, then
    ``sync()``, then three reads through the near cache (x). A read is stale
    when x < y. ``disturb`` runs its events spread over the pairs."""

    def __init__(self, near: warden.Cache, writer: Callable[[], redis.Redis]) -> None:
        self.near = near
        self.writer = writer
        self.done = 0
        self.stale: list[tuple[str, int, int]] = []
        self.errors = 0
        self.chaos: list[str] = []
        self.lock = threading.Lock()
        # Set: every write waits for the replica (WAIT 1) first, so that a
        # failover takes no acknowledged write back (that would be lost, not
        # stale). Cleared at the failover: the writers then follow the new
        # master.
        self.replicated = threading.Event()

    def pairs(self, worker: int, count: int) -> None:
        plain = self.writer()
        following = [self.replicated.is_set()]
        keys = [f"race:{worker}:{i}" for i in range(KEYS_PER_THREAD)]
        values = dict.fromkeys(keys, 0)

        def write(key: str) -> None:
            if following[0] and not self.replicated.is_set():
                # Failed over: the next command asks Sentinel for the master,
                # as a writer that follows at once (another process, a
                # client listening to +switch-master) would.
                plain.connection_pool.disconnect()
                following[0] = False
            plain.set(key, values[key])
            if following[0] and plain.wait(1, 1000) < 1:
                raise redis.TimeoutError("the replica did not acknowledge the write")

        for n in range(count):
            key = keys[n % len(keys)]
            values[key] += 1
            try:
                retried(lambda: write(key))  # noqa: B023
                y = int(retried(lambda: plain.get(key)))  # noqa: B023
                self.near.sync()
                reads = [int(self.near.get_or_load(key, refuse)) for _ in range(3)]
                if min(reads) < y:
                    with self.lock:
                        self.stale.append((key, min(reads), y))
            except (redis.ConnectionError, redis.TimeoutError, AssertionError, ValueError):
                with self.lock:
                    self.errors += 1
            with self.lock:
                self.done += 1
        plain.close()

    def disturb(
        self, total: int, running: threading.Event, events: list[tuple[str, Callable[[], bool]]]
    ) -> None:
        for i, (name, event) in enumerate(events):
            until(lambda: self.done >= total * (i + 1) // (len(events) + 1), "progress")  # noqa: B023
            if not running.is_set():
                break
            if event():
                self.chaos.append(name)

    def run(self, pairs: int, events: list[tuple[str, Callable[[], bool]]]) -> NearCacheStats:
        """Run ``pairs`` pairs (rounded down to THREADS) with ``events``; the
        near cache's counters after."""
        running = threading.Event()
        running.set()
        per_thread = pairs // THREADS
        workers = [
            threading.Thread(target=self.pairs, args=(w, per_thread)) for w in range(THREADS)
        ]
        chaos = threading.Thread(target=self.disturb, args=(per_thread * THREADS, running, events))
        for t in [*workers, chaos]:
            t.start()
        for t in workers:
            t.join()
        running.clear()
        chaos.join()
        return self.near.near_cache.stats()  # type: ignore[union-attr]

    def check(self, stats: NearCacheStats, what: str, pairs: int, events: int) -> None:
        print(
            f"\nnear-cache race{what and ' ' + what} ({SERVER_NAME}):"
            f" pairs={self.done} stale={len(self.stale)} errors={self.errors}"
            f" hits={stats.hits} flushes={stats.flushes} chaos={','.join(self.chaos)}"
        )
        assert self.stale == [], self.stale[:20]
        assert self.done == pairs // THREADS * THREADS
        assert stats.hits > 0
        assert stats.flushes >= len(self.chaos)
        assert len(self.chaos) == events


def retried(action: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + DEADLINE
    while True:
        try:
            return action()
        except (redis.ConnectionError, redis.TimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def test_race_no_read_after_sync_returns_an_older_value(own_server: Server) -> None:
    own_server.args[own_server.args.index("--appendonly") + 1] = "yes"
    own_server.restart()  # now with appendonly: values survive the restarts
    client = own_server.client()
    admin = own_server.client()
    with warden.Cache(client, near_cache=warden.NearCacheConfig()) as near:
        race = Race(near, own_server.client)

        def kill() -> bool:
            client_id = near.near_cache.client_id  # type: ignore[union-attr]
            return client_id is not None and bool(
                retried(lambda: admin.client_kill_filter(_id=client_id))
            )

        def restart() -> bool:
            own_server.restart()
            return True

        events = [("kill", kill), ("restart", restart)] * 2
        stats = race.run(PAIRS, events)
    client.close()
    admin.close()
    race.check(stats, "", PAIRS, len(events))


# Through Sentinel: a master, a replica and a Sentinel, the application's
# client from redis.sentinel.Sentinel(...).master_for(name), and a
# SENTINEL FAILOVER between kills of the tracking connection, the old master
# left up (Sentinel demotes it, and closes its connections, only seconds
# later). A fifth of the pairs: each waits for the replica until the failover.

SENTINEL_PAIRS = max(PAIRS // 5, THREADS)


@pytest.fixture
def sentinels() -> Iterator[Sentinels]:
    s = Sentinels()
    yield s
    s.stop()


def kill_tracking_on_master(sentinels: Sentinels, client_id: Callable[[], Any]) -> bool:
    """Kill the tracking connection ``client_id()`` on the master Sentinel
    names now, once it is there (a failover moves it: a while to connect)."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        admin = redis.Redis("127.0.0.1", sentinels.master_port())
        try:
            tracking = client_id()
            if tracking is not None and tracking in tracking_ids(admin):
                return bool(admin.client_kill_filter(_id=tracking))
        except (redis.ConnectionError, redis.ResponseError):
            pass  # a connection to the old master, closed meanwhile
        finally:
            admin.close()
        time.sleep(0.01)
    return False


def test_race_through_a_sentinel_failover(sentinels: Sentinels) -> None:
    manager = redis.sentinel.Sentinel([("127.0.0.1", sentinels.port)])
    app = manager.master_for(sentinels.name)
    with warden.Cache(app, near_cache=warden.NearCacheConfig()) as near:
        cache = near.near_cache
        assert cache is not None
        race = Race(near, lambda: manager.master_for(sentinels.name))
        race.replicated.set()

        def kill() -> bool:
            near.sync()
            return kill_tracking_on_master(sentinels, lambda: cache.client_id)

        def failover() -> bool:
            sentinels.failover()
            race.replicated.clear()
            return True

        events = [("kill", kill), ("failover", failover), ("kill", kill)]
        stats = race.run(SENTINEL_PAIRS, events)
    app.close()
    manager.close()
    race.check(stats, "through Sentinel", SENTINEL_PAIRS, len(events))


def noted_elsewhere(pool: Any, master: tuple[str, int]) -> None:
    """What another thread's redis-py ``get_master_address`` has done the
    moment before it closes the pool's idle connections: noted the new
    master (on the pool's proxy in redis.sentinel, the pool in asyncio)."""
    getattr(pool, "proxy", pool).master_address = master


def test_no_read_after_sync_uses_an_idle_connection_to_the_old_master(
    sentinels: Sentinels,
) -> None:
    """Another thread has just noted the new master and not yet closed the
    client's idle connections (redis-py's window): a ``sync()`` here still
    leaves no read on the old master, which is up and holds the old value."""
    manager = redis.sentinel.Sentinel(
        [("127.0.0.1", sentinels.port)], socket_timeout=10, sentinel_kwargs={"socket_timeout": 10}
    )
    app = manager.master_for(sentinels.name)
    with warden.Cache(app, near_cache=warden.NearCacheConfig()) as near:
        app.set(KEY, b"old")
        assert app.wait(1, 30000) == 1
        near.sync()
        # Read through the client: an idle connection to this master stays.
        assert near.get_or_load(KEY, refuse) == b"old"
        sentinels.failover()
        new = redis.Redis("127.0.0.1", sentinels.master_port(), socket_timeout=10)
        new.set(KEY, b"new")
        noted_elsewhere(app.connection_pool, ("127.0.0.1", sentinels.master_port()))
        near.sync()
        assert near.get_or_load(KEY, refuse) == b"new"
        new.close()
    app.close()
    manager.close()


async def test_asyncio_no_read_after_sync_uses_an_idle_connection_to_the_old_master(
    sentinels: Sentinels,
) -> None:
    """As above, for warden.asyncio and redis.asyncio.sentinel."""
    manager = redis.asyncio.sentinel.Sentinel(
        [("127.0.0.1", sentinels.port)], socket_timeout=10, sentinel_kwargs={"socket_timeout": 10}
    )
    app = manager.master_for(sentinels.name)
    async with warden.asyncio.Cache(app, near_cache=warden.NearCacheConfig()) as near:
        await app.set(KEY, b"old")
        assert await app.wait(1, 30000) == 1
        await near.sync()
        assert await near.get_or_load(KEY, refuse_async) == b"old"
        await asyncio.to_thread(sentinels.failover)
        new = redis.Redis("127.0.0.1", sentinels.master_port(), socket_timeout=10)
        new.set(KEY, b"new")
        noted_elsewhere(app.connection_pool, ("127.0.0.1", sentinels.master_port()))
        await near.sync()
        assert await near.get_or_load(KEY, refuse_async) == b"new"
        new.close()
    await app.aclose()


# The near cache's memory alone (no server): the generation per read.

FRESH = [b"v1", -1, 0]


@pytest.mark.parametrize(
    ("between", "kept"),
    [
        (lambda store: None, True),
        (lambda store: store.drop([KEY]), False),
        (lambda store: store.drop(["other"]), True),
        (lambda store: store.flush(), False),
    ],
    ids=["nothing", "its-invalidation", "another-key", "a-flush"],
)
def test_a_reply_is_kept_only_if_nothing_moved_its_generation(
    between: Callable[[Any], None], kept: bool
) -> None:
    store = warden._near.NearStore(warden.NearCacheConfig())
    ticket = store.begin(KEY)
    between(store)
    assert store.finish(KEY, ticket, FRESH) == (b"v1", -1)  # served either way
    assert (store.get(KEY) == b"v1") is kept
    assert store.reading == {} and store.moved == {}


@pytest.mark.parametrize(
    "reply",
    [None, [b"v1", -1, 1], [b"v1", 1, 0]],
    ids=["nil", "stale", "expired"],
)
def test_only_fresh_replies_are_kept(reply: Any) -> None:
    store = warden._near.NearStore(warden.NearCacheConfig())
    assert store.finish(KEY, store.begin(KEY), reply) is None
    assert store.get(KEY) is None


async def test_race_asyncio_no_read_after_sync_returns_an_older_value(own_server: Server) -> None:
    """The race checker for warden.asyncio: tasks instead of threads (a fifth
    of the pairs), the tracking connection killed and the server restarted."""
    own_server.args[own_server.args.index("--appendonly") + 1] = "yes"
    await asyncio.to_thread(own_server.restart)
    client = own_server.async_client()
    admin = own_server.async_client()
    total = max(PAIRS // 5 // THREADS, 1) * THREADS
    done = errors = 0
    stale: list[tuple[str, int, int]] = []
    chaos: list[str] = []

    async def again(action: Callable[[], Any]) -> Any:
        deadline = time.monotonic() + DEADLINE
        while True:
            try:
                return await action()
            except (redis.ConnectionError, redis.TimeoutError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.01)

    async with warden.asyncio.Cache(client, near_cache=warden.NearCacheConfig()) as cache:
        near = cache.near_cache
        assert near is not None

        async def pairs(worker: int) -> None:
            nonlocal done, errors
            plain = own_server.async_client()
            keys = [f"race:{worker}:{i}" for i in range(KEYS_PER_THREAD)]
            for n in range(total // THREADS):
                key = keys[n % len(keys)]
                try:
                    await again(lambda: plain.set(key, n))  # noqa: B023
                    y = int(await again(lambda: plain.get(key)))  # noqa: B023
                    await cache.sync()
                    reads = [int(await cache.get_or_load(key, refuse_async)) for _ in range(3)]
                    if min(reads) < y:
                        stale.append((key, min(reads), y))
                except (redis.ConnectionError, redis.TimeoutError, AssertionError, ValueError):
                    errors += 1
                done += 1
            await plain.aclose()

        async def disturb() -> None:
            events = ["kill", "restart", "kill"]
            for i, event in enumerate(events):
                deadline = time.monotonic() + DEADLINE
                while done < total * (i + 1) // (len(events) + 1):
                    assert time.monotonic() < deadline, "no progress"
                    await asyncio.sleep(0.001)
                if event == "kill" and near.client_id is not None:
                    if await again(lambda: admin.client_kill_filter(_id=near.client_id)):
                        chaos.append(event)
                elif event == "restart":
                    await asyncio.to_thread(own_server.restart)
                    chaos.append(event)

        await asyncio.gather(disturb(), *[pairs(w) for w in range(THREADS)])
        stats = near.stats()
    await client.aclose()
    await admin.aclose()
    print(
        f"\nnear-cache race asyncio: pairs={done} stale={len(stale)} errors={errors}"
        f" hits={stats.hits} flushes={stats.flushes} chaos={','.join(chaos)}"
    )
    assert stale == []
    assert done == total
    assert stats.hits > 0
    assert stats.flushes >= len(chaos) == 3


async def test_race_asyncio_through_a_sentinel_failover(sentinels: Sentinels) -> None:
    """The Sentinel race checker for warden.asyncio: tasks instead of threads,
    redis.asyncio.sentinel.Sentinel(...).master_for(name) as the client."""
    manager = redis.asyncio.sentinel.Sentinel([("127.0.0.1", sentinels.port)])
    app = manager.master_for(sentinels.name)
    total = max(SENTINEL_PAIRS // THREADS, 1) * THREADS
    done = errors = 0
    stale: list[tuple[str, int, int]] = []
    chaos: list[str] = []
    replicated = True  # as Race.replicated

    async def again(action: Callable[[], Any]) -> Any:
        deadline = time.monotonic() + DEADLINE
        while True:
            try:
                return await action()
            except (redis.ConnectionError, redis.TimeoutError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.01)

    async with warden.asyncio.Cache(app, near_cache=warden.NearCacheConfig()) as cache:
        near = cache.near_cache
        assert near is not None

        async def pairs(worker: int) -> None:
            nonlocal done, errors
            plain = manager.master_for(sentinels.name)
            following = replicated
            keys = [f"race:{worker}:{i}" for i in range(KEYS_PER_THREAD)]
            values = dict.fromkeys(keys, 0)

            async def write(key: str) -> None:
                nonlocal following
                if following and not replicated:
                    await plain.connection_pool.disconnect()  # as in Race.pairs
                    following = False
                await plain.set(key, values[key])
                if following and await plain.wait(1, 1000) < 1:
                    raise redis.TimeoutError("the replica did not acknowledge the write")

            for n in range(total // THREADS):
                key = keys[n % len(keys)]
                values[key] += 1
                try:
                    await again(lambda: write(key))  # noqa: B023
                    y = int(await again(lambda: plain.get(key)))  # noqa: B023
                    await cache.sync()
                    reads = [int(await cache.get_or_load(key, refuse_async)) for _ in range(3)]
                    if min(reads) < y:
                        stale.append((key, min(reads), y))
                except (redis.ConnectionError, redis.TimeoutError, AssertionError, ValueError):
                    errors += 1
                done += 1
            await plain.aclose()

        async def kill() -> bool:
            await cache.sync()
            return await asyncio.to_thread(
                kill_tracking_on_master, sentinels, lambda: near.client_id
            )

        async def failover() -> bool:
            nonlocal replicated
            await asyncio.to_thread(sentinels.failover)
            replicated = False
            return True

        async def disturb() -> None:
            events = [("kill", kill), ("failover", failover), ("kill", kill)]
            for i, (name, event) in enumerate(events):
                deadline = time.monotonic() + DEADLINE
                while done < total * (i + 1) // (len(events) + 1):
                    assert time.monotonic() < deadline, "no progress"
                    await asyncio.sleep(0.001)
                if await event():
                    chaos.append(name)

        await asyncio.gather(disturb(), *[pairs(w) for w in range(THREADS)])
        stats = near.stats()
    await app.aclose()
    await manager.aclose()
    print(
        f"\nnear-cache race asyncio through Sentinel ({SERVER_NAME}): pairs={done}"
        f" stale={len(stale)} errors={errors} hits={stats.hits} flushes={stats.flushes}"
        f" chaos={','.join(chaos)}"
    )
    assert stale == []
    assert done == total
    assert stats.hits > 0
    assert stats.flushes >= len(chaos) == 3
