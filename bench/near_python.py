"""The Python near cache's hit against a CACHE.GET hit, in-process, on this
machine: the median of batches of hits in a tight loop (one thread, a server
on a unix socket with the module loaded).

    python bench/near_python.py [--hits N]

WARDEN_MODULE: the module (required); WARDEN_SERVER: the server binary
(default redis-server). PYTHONPATH must reach python/ (warden) and
python/tests (servers.py).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

from servers import Server

import warden

BATCH = 1000


def median_us(action: Callable[[], object], count: int) -> float:
    """The median time of one call, in µs, over batches of BATCH calls."""
    batches = []
    for _ in range(max(1, count // BATCH)):
        start = time.perf_counter_ns()
        for _ in range(BATCH):
            action()
        batches.append((time.perf_counter_ns() - start) / BATCH / 1000)
    return statistics.median(batches)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hits", type=int, default=1_000_000)
    args = parser.parse_args()
    server = Server()
    try:
        r = server.client()
        r.set("product:1", b"x" * 100)
        plain = warden.Cache(r)
        with warden.Cache(r, near_cache=warden.NearCacheConfig()) as near:
            store = near.near_cache
            assert store is not None
            while store.stats().hits == 0:
                near.get_or_load("product:1", bytes)

            def never() -> bytes:
                raise AssertionError("loaded")

            rows = [
                (
                    "near cache: Cache.get_or_load hit",
                    median_us(lambda: near.get_or_load("product:1", never), args.hits),
                ),
                (
                    "near cache: NearCache.get alone",
                    median_us(lambda: store.get("product:1"), args.hits),
                ),
                (
                    "CACHE.GET hit: Cache.get_or_load, no near cache",
                    median_us(lambda: plain.get_or_load("product:1", never), args.hits // 50),
                ),
                (
                    "CACHE.GET hit: r.execute_command",
                    median_us(
                        lambda: r.execute_command("CACHE.GET", "product:1", 10000), args.hits // 50
                    ),
                ),
            ]
        for name, us in rows:
            print(f"{name:50} {us:8.2f} µs")
        r.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
