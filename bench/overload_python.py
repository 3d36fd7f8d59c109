"""The overload bench's driver for the Python package and redis-py's Lock, with
redis-py's default pools (bench/overload.py runs it; `make bench
SECTION=overload`). One run of one scenario against a server with the module;
prints one JSON object on stdout.

Parameters (``--name value``; times in ms):
  --port P          the server, 127.0.0.1:P
  --client C        warden-sync (warden.Semaphore/Lock, a thread per request,
                    blocking_timeout=deadline), warden-asyncio
                    (warden.asyncio.*, a task per request, blocking_timeout),
                    warden-asyncio-warm (the same, measured on a second run
                    of the scenario on the same client: its pools warm),
                    redis-py-lock (redis.lock(), a thread per request,
                    blocking_timeout; its default sleep=0.1; --kind lock only)
  --scenario S      overload or burst
  --kind K          sem (a semaphore of --limit) or lock (limit 1)
  --key KEY
  overload: --limit --hold-ms --interval-ms --requests --deadline-ms
    one request every interval; each holds hold-ms once granted. Prints
    {"granted","late","max_inside","errors","error_sample",
     "lat_ms":[acquire latency of each grant]}; late = granted after
    deadline-ms from the call (held like any grant: the caller cannot tell);
    "span_ms": from the first call to the last (a loaded machine stretches it);
    "held_ms": each hold, from the grant reaching the caller to the release's reply.
  burst: --limit --requests --rounds
    per round a fresh client (connected: one PING), `requests` acquires at
    once with permits free. Prints {"first_ms":[per round],"all_ms":[per
    round],"errors","error_sample"}.
  --version prints the packages' versions (their installed metadata).
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

import redis
import redis.asyncio

import warden
import warden.asyncio

TTL = 10.0  # seconds: each hold's lease, far longer than any hold here


def versions() -> dict[str, str]:
    # The package imported (a checkout on PYTHONPATH, or installed).
    project = Path(warden.__file__).resolve().parents[1] / "pyproject.toml"
    if project.exists():
        line = next(x for x in project.read_text().splitlines() if x.startswith("version"))
        own = line.split("=", 1)[1].strip().strip('"')
    else:
        own = metadata.version("warden-redis")
    return {
        "warden-redis (Python)": own,
        "redis-py": metadata.version("redis"),
        "python": sys.version.split()[0],
    }


def parse(argv: list[str]) -> dict[str, str]:
    return {argv[i].lstrip("-"): argv[i + 1] for i in range(0, len(argv) - 1, 2)}


class Tally:
    """What the callers saw, counted under one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lat: list[float] = []
        self.held: list[float] = []
        self.late = 0
        self.inside = 0
        self.max_inside = 0
        self.errors = 0
        self.error_sample = ""

    def granted(self, waited_ms: float, deadline_ms: float) -> None:
        with self.lock:
            self.lat.append(waited_ms)
            self.late += waited_ms > deadline_ms
            self.inside += 1
            self.max_inside = max(self.max_inside, self.inside)

    def left(self) -> None:
        with self.lock:
            self.inside -= 1

    def released(self, held_ms: float) -> None:
        with self.lock:
            self.held.append(held_ms)

    def failed(self, e: BaseException) -> None:
        with self.lock:
            self.errors += 1
            self.error_sample = f"{type(e).__name__}: {e}"[:200]

    def overload_row(self, span_ms: float) -> dict[str, Any]:
        return {
            "span_ms": span_ms,
            "granted": len(self.lat),
            "late": self.late,
            "max_inside": self.max_inside,
            "errors": self.errors,
            "error_sample": self.error_sample,
            "lat_ms": self.lat,
            "held_ms": self.held,
        }


def sync_holder(p: dict[str, str], r: redis.Redis, deadline_s: float) -> Any:
    limit = 1 if p["kind"] == "lock" else int(p["limit"])
    if p["client"] == "redis-py-lock":
        if p["kind"] != "lock":
            raise SystemExit("redis-py-lock: --kind lock only")
        return r.lock(p["key"], timeout=TTL, blocking_timeout=deadline_s)
    if p["kind"] == "lock":
        return warden.Lock(r, p["key"], timeout=TTL, blocking_timeout=deadline_s)
    return warden.Semaphore(r, p["key"], limit, timeout=TTL, blocking_timeout=deadline_s)


def async_holder(p: dict[str, str], r: Any, deadline_s: float) -> Any:
    if p["kind"] == "lock":
        return warden.asyncio.Lock(r, p["key"], timeout=TTL, blocking_timeout=deadline_s)
    return warden.asyncio.Semaphore(
        r, p["key"], int(p["limit"]), timeout=TTL, blocking_timeout=deadline_s
    )


def sync_overload(p: dict[str, str]) -> dict[str, Any]:
    r = redis.Redis(port=int(p["port"]))
    r.ping()
    deadline_ms = float(p["deadline-ms"])
    hold_s = float(p["hold-ms"]) / 1000
    tally = Tally()

    def caller() -> None:
        t0 = time.monotonic()
        try:
            holder = sync_holder(p, r, deadline_ms / 1000)
            if not holder.acquire():
                return
            tally.granted((time.monotonic() - t0) * 1000, deadline_ms)
            t1 = time.monotonic()
            time.sleep(hold_s)
            tally.left()
            holder.release()
            tally.released((time.monotonic() - t1) * 1000)
        except Exception as e:
            tally.failed(e)

    threads = []
    start = time.monotonic()
    for i in range(int(p["requests"])):
        due = start + i * float(p["interval-ms"]) / 1000
        time.sleep(max(0.0, due - time.monotonic()))
        t = threading.Thread(target=caller)
        t.start()
        threads.append(t)
    span_ms = (time.monotonic() - start) * 1000
    for t in threads:
        t.join()
    return tally.overload_row(span_ms)


async def async_overload(p: dict[str, str]) -> dict[str, Any]:
    r = redis.asyncio.Redis(port=int(p["port"]))
    await r.ping()
    if p["client"].endswith("-warm"):
        # A service's steady state: the first run opens the connections.
        await async_overload_on(r, {**p, "key": p["key"] + "-warm-up"})
    row = await async_overload_on(r, p)
    await r.aclose()
    return row


async def async_overload_on(r: Any, p: dict[str, str]) -> dict[str, Any]:
    deadline_ms = float(p["deadline-ms"])
    hold_s = float(p["hold-ms"]) / 1000
    tally = Tally()

    async def caller() -> None:
        t0 = time.monotonic()
        try:
            holder = async_holder(p, r, deadline_ms / 1000)
            if not await holder.acquire():
                return
            tally.granted((time.monotonic() - t0) * 1000, deadline_ms)
            t1 = time.monotonic()
            await asyncio.sleep(hold_s)
            tally.left()
            await holder.release()
            tally.released((time.monotonic() - t1) * 1000)
        except Exception as e:
            tally.failed(e)

    tasks = []
    start = time.monotonic()
    for i in range(int(p["requests"])):
        due = start + i * float(p["interval-ms"]) / 1000
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        tasks.append(asyncio.create_task(caller()))
    span_ms = (time.monotonic() - start) * 1000
    await asyncio.gather(*tasks)
    return tally.overload_row(span_ms)


def burst_row(rounds: list[list[float]], tally: Tally) -> dict[str, Any]:
    done = [times for times in rounds if times]
    return {
        "first_ms": [min(t) for t in done],
        "all_ms": [max(t) for t in done],
        "errors": tally.errors,
        "error_sample": tally.error_sample,
    }


def sync_burst_round(p: dict[str, str], tally: Tally) -> list[float]:
    n = int(p["requests"])
    r = redis.Redis(port=int(p["port"]))
    r.ping()
    times: list[float] = []
    gate = threading.Barrier(n + 1)
    # A hold is released by the thread that took it, once all are in.
    all_in = threading.Barrier(n)
    start: list[float] = []

    def caller() -> None:
        holder = sync_holder(p, r, 5.0)
        gate.wait()
        held = False
        try:
            held = holder.acquire()
            if not held:
                raise TimeoutError("not granted in 5 s")
            with tally.lock:
                times.append((time.monotonic() - start[0]) * 1000)
        except Exception as e:
            tally.failed(e)
        all_in.wait()
        if held:
            holder.release()

    threads = [threading.Thread(target=caller) for _ in range(n)]
    for t in threads:
        t.start()
    start.append(time.monotonic())
    gate.wait()
    for t in threads:
        t.join()
    r.close()
    return times


def sync_burst(p: dict[str, str]) -> dict[str, Any]:
    tally = Tally()
    rounds = [sync_burst_round(p, tally) for _ in range(int(p["rounds"]))]
    return burst_row(rounds, tally)


async def async_burst_round(p: dict[str, str], tally: Tally) -> list[float]:
    n = int(p["requests"])
    r = redis.asyncio.Redis(port=int(p["port"]))
    await r.ping()
    times: list[float] = []
    # A hold is released by the task that took it, once all are in.
    all_in = asyncio.Event()
    errors = tally.errors
    start = time.monotonic()

    async def caller() -> None:
        holder = async_holder(p, r, 5.0)
        held = False
        try:
            held = await holder.acquire()
            if not held:
                raise TimeoutError("not granted in 5 s")
            times.append((time.monotonic() - start) * 1000)
        except Exception as e:
            tally.failed(e)
        if len(times) + tally.errors - errors >= n:
            all_in.set()
        await all_in.wait()
        if held:
            await holder.release()

    await asyncio.gather(*(caller() for _ in range(n)))
    await r.aclose()
    return times


async def async_burst(p: dict[str, str]) -> dict[str, Any]:
    tally = Tally()
    rounds = [await async_burst_round(p, tally) for _ in range(int(p["rounds"]))]
    return burst_row(rounds, tally)


def main() -> None:
    if "--version" in sys.argv:
        print(json.dumps(versions()))
        return
    p = parse(sys.argv[1:])
    runs: dict[tuple[str, str], Callable[[dict[str, str]], Any]] = {
        ("overload", "sync"): sync_overload,
        ("burst", "sync"): sync_burst,
        ("overload", "async"): lambda p: asyncio.run(async_overload(p)),
        ("burst", "async"): lambda p: asyncio.run(async_burst(p)),
    }
    style = "async" if p["client"].startswith("warden-asyncio") else "sync"
    print(json.dumps(runs[(p["scenario"], style)](p)))


if __name__ == "__main__":
    main()
