"""The Python package against what redis-py users write today, on one server
in one run: warden.Lock (threads and asyncio) vs redis-py's Lock (20 threads
on one lock, each hand-off against the cap its critical section allows and
against a FIFO queue's wait), and the warden.Cache decorator vs a plain
cache-aside decorator (48 readers on one hot key). Prints a markdown section.

    python bench/python_clients.py [MODULE.so] [--quick]
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python" / "tests"))  # servers.py
sys.path.insert(0, str(ROOT / "python"))  # the package, installed or not
if len(sys.argv) > 1 and not sys.argv[1].startswith("--"):
    os.environ["WARDEN_MODULE"] = sys.argv[1]
QUICK = "--quick" in sys.argv

import redis  # noqa: E402
import redis.lock  # noqa: E402
from redis.backoff import NoBackoff  # noqa: E402
from redis.retry import Retry  # noqa: E402
from servers import Server  # noqa: E402

import warden  # noqa: E402

SECONDS = 3.0 if QUICK else 6.0
THREADS = 20
WORK = 0.001  # the critical section
READERS = 48
TTL = 0.5
LOAD = 0.05


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else float("nan")


def commands(r: redis.Redis) -> int:
    stats = r.info("commandstats")
    return sum(
        v["calls"] for k, v in stats.items() if not k.startswith(("cmdstat_info", "cmdstat_config"))
    )


def median(samples: list[float]) -> float:
    return sorted(samples)[len(samples) // 2] if samples else float("nan")


def lock_figures(
    waits: list[float], holds: list[float], elapsed: float, r: Any
) -> dict[str, float]:
    """Hand-offs/s, the waits' p50 and p99 (ms), and the measured hold: the
    cap is 1 / hold, a FIFO queue's wait (THREADS - 1) holds."""
    hold = sum(holds) / len(holds) if holds else float("nan")
    return {
        "rate": len(waits) / elapsed,
        "p50": median(waits) * 1000,
        "p99": p99(waits) * 1000,
        "hold": hold * 1000,
        "cap": 1 / hold if holds else float("nan"),
        "fifo": (THREADS - 1) * hold * 1000,
        "commands": commands(r) / max(1, len(waits)),
    }


def contend(r: redis.Redis, make_lock: Callable[[], Any]) -> dict[str, float]:
    r.flushall()
    r.config_resetstat()
    waits: list[float] = []
    holds: list[float] = []
    stop = time.monotonic() + SECONDS

    def worker() -> None:
        lock = make_lock()
        mine: list[float] = []
        held: list[float] = []
        while time.monotonic() < stop:
            started = time.monotonic()
            if not lock.acquire():
                continue
            granted = time.monotonic()
            mine.append(granted - started)
            time.sleep(WORK)
            held.append(time.monotonic() - granted)
            lock.release()
        waits.extend(mine)
        holds.extend(held)

    threads = [threading.Thread(target=worker) for _ in range(THREADS)]
    began = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return lock_figures(waits, holds, time.monotonic() - began, r)


def contend_asyncio(server: Server) -> dict[str, float]:
    """As ``contend``, with THREADS tasks of one event loop on warden.asyncio.Lock."""
    import asyncio

    import warden.asyncio

    sync = server.client()
    sync.flushall()
    sync.config_resetstat()
    waits: list[float] = []
    holds: list[float] = []

    async def run() -> float:
        client = server.async_client(max_connections=200)
        stop = time.monotonic() + SECONDS

        async def worker() -> None:
            lock = warden.asyncio.Lock(client, "bench:lock", timeout=10)
            while time.monotonic() < stop:
                started = time.monotonic()
                if not await lock.acquire():
                    continue
                granted = time.monotonic()
                waits.append(granted - started)
                await asyncio.sleep(WORK)
                holds.append(time.monotonic() - granted)
                await lock.release()

        began = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(THREADS)))
        elapsed = time.monotonic() - began
        await client.aclose()
        return elapsed

    elapsed = asyncio.run(run())
    figures = lock_figures(waits, holds, elapsed, sync)
    sync.close()
    return figures


class CacheAside:
    """What most code does: GET, on a miss load and SET with a TTL."""

    def __init__(self, r: redis.Redis) -> None:
        self.r = r

    def cached(self, key: str, ttl: float) -> Callable[[Callable[[], bytes]], Callable[[], Any]]:
        def decorate(load: Callable[[], bytes]) -> Callable[[], Any]:
            def read() -> Any:
                value = self.r.get(key)
                if value is None:
                    value = load()
                    self.r.set(key, value, px=int(ttl * 1000))
                return value

            return read

        return decorate


def hot_key(
    r: redis.Redis, decorate: Callable[[Callable[[], bytes]], Callable[[], Any]]
) -> dict[str, float]:
    r.flushall()
    r.config_resetstat()
    loads: list[float] = []
    lock = threading.Lock()

    @decorate
    def load() -> bytes:
        with lock:
            loads.append(time.monotonic())
        time.sleep(LOAD)
        return b"x" * 100

    reads: list[float] = []
    stop = time.monotonic() + SECONDS

    def reader() -> None:
        mine = []
        while time.monotonic() < stop:
            started = time.monotonic()
            load()
            mine.append(time.monotonic() - started)
        reads.extend(mine)

    threads = [threading.Thread(target=reader) for _ in range(READERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # An expiry is a burst of loads that start within one load time of each other.
    bursts = 0
    last = -1.0
    for at in sorted(loads):
        if at - last > LOAD:
            bursts += 1
            last = at
    return {
        "loads": len(loads) / max(1, bursts),
        "bursts": bursts,
        "p99": p99(reads) * 1000,
        "p50": median(reads) * 1000,
        "commands": commands(r) / max(1, len(reads)),
    }


def main() -> None:
    server = Server()
    try:
        r = server.client(retry=Retry(NoBackoff(), 0), max_connections=200)
        w = contend(r, lambda: warden.Lock(r, "bench:lock", timeout=10))
        wa = contend_asyncio(server)
        p = contend(r, lambda: redis.lock.Lock(r, "bench:lock", timeout=10))
        p01 = contend(r, lambda: redis.lock.Lock(r, "bench:lock", timeout=10, sleep=0.01))
        cache = warden.Cache(r)
        c = hot_key(r, lambda f: cache.cached("bench:hot", ttl=TTL)(f))
        cr = hot_key(r, lambda f: cache.cached("bench:hot", ttl=TTL, refresh=0.2)(f))
        a = hot_key(r, CacheAside(r).cached("bench:hot", ttl=TTL))
    finally:
        server.stop()
    print(f"## Python package (python/), {SECONDS:.0f} s per case, {server_name()}\n")
    print(
        f"{THREADS} threads (asyncio: tasks) on one lock, {WORK * 1000:.0f} ms critical "
        "section (`time.sleep`, asyncio `asyncio.sleep`; the hold column is as measured). "
        "Cap: 1 / the hold. FIFO wait: a fair queue's, "
        f"{THREADS - 1} holds ahead.\n"
    )
    print(
        "| client | acquisitions/s | ÷ cap | hold ms | p50 / p99 wait ms | p99 ÷ p50 "
        "| p50 ÷ FIFO wait | server commands per acquisition |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, m in (
        ("`warden.Lock` (`LOCK.ACQUIRE ... WAIT`)", w),
        ("`warden.asyncio.Lock`", wa),
        ("redis-py `Lock` (`SET NX PX`, polls every 0.1 s: its default)", p),
        ("redis-py `Lock`, `sleep=0.01`", p01),
    ):
        print(
            f"| {name} | {m['rate']:.0f} | {m['rate'] / m['cap']:.2f} | {m['hold']:.2f} "
            f"| {m['p50']:.1f} / {m['p99']:.0f} | {m['p99'] / max(m['p50'], 1e-9):.2f} "
            f"| {m['p50'] / m['fifo']:.2f} | {m['commands']:.2f} |"
        )
    print(
        f"\n{READERS} readers on one hot key (TTL {TTL * 1000:.0f} ms, "
        f"{LOAD * 1000:.0f} ms load):\n"
    )
    print("| decorator | loads per expiry | p50 / p99 read | server commands per read |")
    print("|---|---|---|---|")
    for name, m in (
        ("`warden.Cache.cached`", c),
        ("`warden.Cache.cached(refresh=0.2)`", cr),
        ("plain cache-aside (`GET`, load, `SET PX`)", a),
    ):
        print(
            f"| {name} | {m['loads']:.2f} | {m['p50']:.1f} / {m['p99']:.1f} ms "
            f"| {m['commands']:.2f} |"
        )


def server_name() -> str:
    import subprocess

    out = subprocess.run(
        [os.environ.get("WARDEN_SERVER", "redis-server"), "--version"],
        capture_output=True,
        text=True,
    ).stdout
    return out.split(" sha=")[0].strip()


if __name__ == "__main__":
    main()
