"""Overload through the Python clients, one JSON object per row on stdout.

The scenario: a semaphore of limit 3, each holder 4 ms inside, one request a
millisecond for 300 ms, each caller giving up after 50 ms (blocking_timeout);
the capacity bound is ~263 grants. Run through warden.Semaphore (a thread per
caller) and warden.asyncio.Semaphore (a task per caller), default pools. The
lock variant (limit 1, same arrivals, bound ~88) runs warden.Lock against
redis-py's own polling Lock (its default sleep=0.1, and sleep=0.005). Then a
burst of 32 acquires with free permits (limit 32) on a fresh client: time to
the first grant and to all 32.

Per row: granted, late (granted after the caller's 50 ms), max_inside
(counted in-process), errors (and the first), p50/p99 of the granted
acquires' latency (ms). The server is started here (TCP on 127.0.0.1).

Usage: overload_python.py MODULE [SERVER] [--runs N]
The warden package imported is whichever is first on sys.path (PYTHONPATH=
another checkout's python/ measures that client); each row names it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable

import redis
import redis.asyncio

import warden
import warden.asyncio

ARRIVALS = 300  # one a ms
HOLD = 0.004
DEADLINE = 0.05


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, binary: str, module: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="warden-overload-")
        self.port = free_port()
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--loadmodule", module],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                if redis.Redis(port=self.port).ping():
                    return
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError(f"{binary} did not start") from None
                time.sleep(0.02)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 2)


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.inside = self.most = self.granted = self.late = 0
        self.latencies: list[float] = []
        self.errors: list[str] = []

    def enter(self, waited: float) -> None:
        with self.lock:
            self.granted += 1
            self.late += waited > DEADLINE
            self.latencies.append(waited)
            self.inside += 1
            self.most = max(self.most, self.inside)

    def leave(self) -> None:
        with self.lock:
            self.inside -= 1

    def row(self, **fields: Any) -> dict[str, Any]:
        return {
            **fields,
            "granted": self.granted,
            "late": self.late,
            "max_inside": self.most,
            "errors": len(self.errors),
            "first_error": self.errors[0] if self.errors else None,
            "p50_ms": pct(self.latencies, 0.5),
            "p99_ms": pct(self.latencies, 0.99),
        }


def run_threads(make: Callable[[redis.Redis], Any], port: int) -> Tally:
    """One thread per caller, each started at its arrival."""
    r = redis.Redis(port=port)
    r.flushall()
    tally = Tally()
    start = time.monotonic() + 0.2
    gate = threading.Barrier(ARRIVALS + 1)

    def caller(i: int) -> None:
        gate.wait()
        at = start + i / 1000
        time.sleep(max(0.0, at - time.monotonic()))
        called = time.monotonic()
        try:
            holder = make(r)
            if holder.acquire(blocking_timeout=DEADLINE):
                tally.enter(time.monotonic() - called)
                time.sleep(HOLD)
                tally.leave()
                holder.release()
        except Exception as error:  # counted, the run goes on
            tally.errors.append(repr(error))

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(ARRIVALS)]
    for t in threads:
        t.start()
    gate.wait()
    for t in threads:
        t.join()
    r.close()
    return tally


def run_tasks(make: Callable[[Any], Any], port: int) -> Tally:
    """One task per caller, each started at its arrival."""

    async def main() -> Tally:
        r = redis.asyncio.Redis(port=port)
        await r.flushall()
        tally = Tally()
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.1

        async def caller(i: int) -> None:
            await asyncio.sleep(max(0.0, start + i / 1000 - loop.time()))
            called = time.monotonic()
            try:
                holder = make(r)
                if await holder.acquire(blocking_timeout=DEADLINE):
                    tally.enter(time.monotonic() - called)
                    await asyncio.sleep(HOLD)
                    tally.leave()
                    await holder.release()
            except Exception as error:
                tally.errors.append(repr(error))

        await asyncio.gather(*(caller(i) for i in range(ARRIVALS)))
        await r.aclose()
        return tally

    return asyncio.run(main())


def burst_threads(port: int) -> list[dict[str, Any]]:
    """32 threads acquire at once on a fresh client, release, then again (warm)."""
    redis.Redis(port=port).flushall()
    r = redis.Redis(port=port)  # fresh: no connection yet
    rows = []
    for pool in ("fresh", "warm"):
        sems = [warden.Semaphore(r, "burst", 32, timeout=10, thread_local=False) for _ in range(32)]
        done: list[float] = []
        errors: list[str] = []
        gate = threading.Barrier(33)

        def one(sem: Any) -> None:
            gate.wait()
            try:
                if sem.acquire(blocking_timeout=1):
                    done.append(time.monotonic())
            except Exception as error:
                errors.append(repr(error))

        threads = [threading.Thread(target=one, args=(s,)) for s in sems]
        for t in threads:
            t.start()
        gate.wait()
        started = time.monotonic()
        for t in threads:
            t.join()
        rows.append(burst_row(f"warden.Semaphore (threads, {pool} client)", started, done, errors))
        for sem in sems:
            if sem.fence is not None:
                sem.release()
    return rows


def burst_tasks(port: int) -> list[dict[str, Any]]:
    """32 tasks acquire at once on a fresh client, release, then again (warm);
    and the floor: 32 plain SETs on a fresh redis-py client."""

    async def main() -> list[dict[str, Any]]:
        r = redis.asyncio.Redis(port=port)
        await r.flushall()
        await r.aclose()
        rows = []
        r = redis.asyncio.Redis(port=port)  # fresh: no connection yet
        for pool in ("fresh", "warm"):
            done: list[float] = []
            errors: list[str] = []
            sems = [
                warden.asyncio.Semaphore(r, "burst", 32, timeout=10, thread_local=False)
                for _ in range(32)
            ]

            async def one(sem: Any) -> None:
                try:
                    if await sem.acquire(blocking_timeout=1):
                        done.append(time.monotonic())
                except Exception as error:
                    errors.append(repr(error))

            started = time.monotonic()
            await asyncio.gather(*(one(sem) for sem in sems))
            rows.append(burst_row(f"warden.asyncio.Semaphore ({pool} client)", started, done, errors))

            async def release(sem: Any) -> None:
                if sem.fence is not None:
                    await sem.release()

            await asyncio.gather(*(asyncio.create_task(release(sem)) for sem in sems))
        await r.aclose()
        r = redis.asyncio.Redis(port=port)
        done, errors = [], []

        async def plain() -> None:
            await r.set("plain", 1)
            done.append(time.monotonic())

        started = time.monotonic()
        await asyncio.gather(*(plain() for _ in range(32)))
        rows.append(burst_row("redis.asyncio SET, the floor (fresh client)", started, done, errors))
        await r.aclose()
        return rows

    return asyncio.run(main())


def burst_row(client: str, started: float, done: list[float], errors: list[str]) -> dict[str, Any]:
    return {
        "scenario": "burst32",
        "client": client,
        "granted": len(done),
        "first_ms": round((min(done) - started) * 1000, 2) if done else None,
        "all_ms": round((max(done) - started) * 1000, 2) if done else None,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
    }


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    runs = 3
    if "--runs" in sys.argv:
        runs = int(sys.argv[sys.argv.index("--runs") + 1])
        args = [a for a in args if a != str(runs)]
    module = os.path.abspath(args[0])
    binary = args[1] if len(args) > 1 else "redis-server"
    source = os.path.dirname(os.path.dirname(os.path.abspath(warden.__file__)))
    server = Server(binary, module)
    port = server.port
    common = {"server": os.path.basename(binary), "warden": source}
    try:
        cases: list[tuple[str, str, Callable[[], Tally]]] = [
            ("semaphore", "warden.Semaphore (threads)",
             lambda: run_threads(lambda r: warden.Semaphore(r, "sem", 3, timeout=10), port)),
            ("semaphore", "warden.asyncio.Semaphore",
             lambda: run_tasks(lambda r: warden.asyncio.Semaphore(r, "sem", 3, timeout=10), port)),
            ("lock", "warden.Lock (threads)",
             lambda: run_threads(lambda r: warden.Lock(r, "lock", timeout=10), port)),
            ("lock", "warden.asyncio.Lock",
             lambda: run_tasks(lambda r: warden.asyncio.Lock(r, "lock", timeout=10), port)),
            ("lock", "redis.lock.Lock sleep=0.1 (threads)",
             lambda: run_threads(lambda r: r.lock("lock", timeout=10), port)),
            ("lock", "redis.lock.Lock sleep=0.005 (threads)",
             lambda: run_threads(lambda r: r.lock("lock", timeout=10, sleep=0.005), port)),
            ("lock", "redis.asyncio.lock.Lock sleep=0.005",
             lambda: run_tasks(lambda r: r.lock("lock", timeout=10, sleep=0.005), port)),
        ]
        info = redis.Redis(port=port)
        for run in range(runs):
            for scenario, client, go in cases:
                grants = info.info("warden")["warden_grants"]
                tally = go()
                row = tally.row(scenario=scenario, client=client, run=run, **common)
                if client.startswith("warden"):
                    # Granted by the server, never used: given back late, or lost.
                    row["given_back"] = info.info("warden")["warden_grants"] - grants - tally.granted
                print(json.dumps(row), flush=True)
            for burst in (burst_threads, burst_tasks):
                for row in burst(port):
                    print(json.dumps({**row, "run": run, **common}), flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
