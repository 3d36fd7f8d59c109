"""The near-cache bench's Python driver and its writer (bench/near_cache.py
runs them; `make bench SECTION=near-cache`). One run of one client against
a server with the module.

    python bench/near_cache_python.py --client C --port P --prefix K
        [--keys 4] [--seconds 5] [--hits 200000]
    python bench/near_cache_python.py --writer plain --port P
        --prefix K [--keys 4] [--rate 400] [--seconds 5]
    python bench/near_cache_python.py --version

Clients (the reader, one thread, one client object):

- get: a plain `GET` per read on redis-py (no near cache): the baseline.
- redis-py-csc: redis-py's client-side caching, `Redis(protocol=3,
  cache_config=CacheConfig())` (CLIENT TRACKING on its connection; a hit
  first drains the invalidation pushes already on the socket).
- warden: warden's Python near cache, `warden.Cache(r,
  near_cache=warden.NearCacheConfig())` (`warden_reader`).
- warden-yield: the same, the reader calling `time.sleep(0)` every
  YIELD_EVERY reads of the race (it lets go of the GIL, so the near
  cache's tracking thread can apply what arrived, as a reader doing any I/O
  would; the Node driver yields as often).

Keys: PREFIX:0 … PREFIX:KEYS-1, each holding an integer (the writer's n);
PREFIX:hit holds one that nothing writes.

Protocol: after a warm-up it measures the hit latency (HITS reads of
PREFIX:hit, each timed alone with time.perf_counter_ns, the timer's own
cost included) and prints READY; on a line GO on stdin it reads the keys in
turn in a tight loop for SECONDS, noting each read's start
(time.monotonic_ns: CLOCK_MONOTONIC, the clock every driver and the writer
share) and the value it answered, and prints one line `RESULT {json}`.
Reads are kept run-length coded: per key, a run of reads answering the
same value within BUCKET_NS of the run's first is one entry [key, value,
first start, last start, count] (bench/near_cache.py documents the
counting).

The writer: `SET PREFIX:i n` (for every contender but Redisson, whose
driver writes its own map), at RATE writes per second over the keys in turn; after each
acknowledgement it notes (key, n, time.monotonic_ns) and at the end prints
`RESULT {json}` with them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Callable

import redis
from redis.cache import CacheConfig

BUCKET_NS = 2_000
YIELD_EVERY = 100


def pct(xs: list[int], p: float) -> float:
    s = sorted(xs)
    return float(s[min(len(s) - 1, int(len(s) * p / 100))]) if s else float("nan")


def make_reader(client: str, port: int, prefix: str) -> tuple[Callable[[str], Any], Any]:
    if client == "get":
        r = redis.Redis(port=port)
        return r.get, r
    if client == "redis-py-csc":
        r = redis.Redis(port=port, protocol=3, cache_config=CacheConfig())
        return r.get, r
    if client in ("warden", "warden-yield"):
        return warden_reader(port, prefix)
    raise SystemExit(f"unknown client {client}")


def warden_reader(port: int, prefix: str) -> tuple[Callable[[str], Any], Any]:
    """warden's Python near cache (docs/clients/python.md "Near cache"):
    `warden.Cache(r, near_cache=warden.NearCacheConfig())`, its default
    serializer (bytes); a read is `get_or_load(key, loader, ttl=300)`. The
    keys are plain strings the writer SETs, so the loader (which fails) never
    runs."""
    import warden

    def load() -> bytes:
        raise RuntimeError("the loader ran: the key is missing")

    r = redis.Redis(port=port)
    cache = warden.Cache(r, near_cache=warden.NearCacheConfig())

    def get(key: str) -> Any:
        return cache.get_or_load(key, load, ttl=300)

    return get, cache


def reader(args: argparse.Namespace) -> None:
    get, conn = make_reader(args.client, args.port, args.prefix)
    keys = [f"{args.prefix}:{i}" for i in range(args.keys)]
    hit = f"{args.prefix}:hit"
    for _ in range(1000):
        get(hit)
        for k in keys:
            get(k)
    clock = time.perf_counter_ns
    lat = []
    for _ in range(args.hits):
        t0 = clock()
        get(hit)
        lat.append(clock() - t0)
    print("READY", flush=True)
    if sys.stdin.readline().strip() != "GO":
        return
    near = getattr(conn, "near_cache", None)
    s0 = near.stats() if near else None
    now = time.monotonic_ns
    n_keys = args.keys
    entries: list[list[int]] = []
    cur: list[list[int] | None] = [None] * n_keys
    reads = 0
    t_start = now()
    end = t_start + int(args.seconds * 1e9)
    i = 0
    every = YIELD_EVERY if args.client == "warden-yield" else 0
    while True:
        t = now()
        if t >= end:
            break
        v = int(get(keys[i]))
        e = cur[i]
        if e is not None and e[1] == v and t - e[2] <= BUCKET_NS:
            e[3] = t
            e[4] += 1
        else:
            e = [i, v, t, t, 1]
            entries.append(e)
            cur[i] = e
        reads += 1
        i = (i + 1) % n_keys
        if every and reads % every == 0:
            time.sleep(0)
    t_end = now()
    info = {}
    if near and s0:
        s1 = near.stats()
        for k in ("hits", "misses", "invalidations", "flushes"):
            info[f"info_{k}"] = getattr(s1, k) - getattr(s0, k)
    conn.close()
    out = {
        **info,
        "reads": reads,
        "seconds": (t_end - t_start) / 1e9,
        "entries": entries,
        "hit_ns_p50": pct(lat, 50),
        "hit_ns_p99": pct(lat, 99),
        "hits": len(lat),
        "timer": "time.perf_counter_ns around each read",
    }
    print("RESULT " + json.dumps(out), flush=True)


def writer(args: argparse.Namespace) -> None:
    r = redis.Redis(port=args.port)
    r.ping()
    n = [int(r.get(f"{args.prefix}:{i}") or 0) for i in range(args.keys)]
    acks: list[list[int]] = []
    sent = 0
    print("READY", flush=True)
    if sys.stdin.readline().strip() != "GO":
        return
    now = time.monotonic_ns
    t0 = now()
    end = t0 + int(args.seconds * 1e9)
    period = int(1e9 / args.rate)
    j = 0
    while True:
        due = t0 + j * period
        t = now()
        if due >= end:
            break
        if due > t:
            time.sleep((due - t) / 1e9)
        i = j % args.keys
        n[i] += 1
        r.set(f"{args.prefix}:{i}", n[i])
        sent += 1
        acks.append([i, n[i], now()])
        j += 1
    print("RESULT " + json.dumps({"acks": acks, "sent": sent}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--client")
    p.add_argument("--writer", choices=["plain"])
    p.add_argument("--port", type=int)
    p.add_argument("--prefix")
    p.add_argument("--keys", type=int, default=4)
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--hits", type=int, default=200_000)
    p.add_argument("--rate", type=float, default=400)
    p.add_argument("--version", action="store_true")
    args = p.parse_args()
    if args.version:
        import warden

        out = {"redis-py": redis.__version__, "python": sys.version.split()[0]}
        out["warden-redis"] = getattr(warden, "__version__", "?")
        print(json.dumps(out))
        return
    os.environ.setdefault("PYTHONHASHSEED", "0")
    (writer if args.writer else reader)(args)


if __name__ == "__main__":
    main()
