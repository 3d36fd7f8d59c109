"""The rate bench's Python driver (bench/rate.py runs it; `make bench
SECTION=rate`): CALLERS threads, each wanting to be admitted by one rate
limiter as soon as possible, again and again, for SECONDS. One run of one
client against a server with the module.

    python bench/rate_python.py --client C --port P --key K [--count 200]
        [--period 1000] [--burst 10] [--callers 16] [--seconds 10]
    python bench/rate_python.py --version

Clients (redis-py, one connection per thread from its pool):

- warden-wait: `RATE.ACQUIRE key count period BURST b WAIT 10000`, one
  command per admission: the server queues the caller and answers when its
  token conforms.
- warden-retry: `RATE.ACQUIRE key count period BURST b` (no WAIT); when
  limited, sleep its retry_after (ms) and ask again.
- limits-moving, limits-fixed: the `limits` package's
  MovingWindowRateLimiter / FixedWindowRateLimiter on its RedisStorage,
  `RateLimitItemPerSecond(count)` (limits has no burst: a window admits
  `count` at once); when `hit` is refused, sleep until
  `get_window_stats(...).reset_time` and hit again (limits has no wait of
  its own).

Protocol: after a warm-up (connections open, scripts loaded, on KEY:warm) it
prints READY; on a line GO on stdin it runs, then prints one line
`RESULT {json}`: "admits" (per caller, ms from the start of the run of each
admission), "waits" (ms from the caller wanting an admission to having it,
in the order of "admits" flattened), "sent" (commands redis-py sent during the run, counted at
its connections), "refused" (replies that admitted nothing), "errors",
"error_sample". A caller stops asking at
SECONDS; an admission it already asked for is still counted.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import threading
import time
from typing import Any, Callable

import redis
import redis.connection

SENT = itertools.count()
# Replies that admitted nothing (warden-wait: answered limited despite WAIT).
REFUSED = itertools.count()
COUNTING = False

_send = redis.connection.AbstractConnection.send_command
_pack_many = redis.connection.AbstractConnection.pack_commands


def _counted_send(self: Any, *args: Any, **kwargs: Any) -> Any:
    if COUNTING:
        next(SENT)
    return _send(self, *args, **kwargs)


def _counted_pack_many(self: Any, commands: Any) -> Any:
    commands = list(commands)
    if COUNTING:
        for _ in commands:
            next(SENT)
    return _pack_many(self, commands)


redis.connection.AbstractConnection.send_command = _counted_send  # type: ignore[method-assign]
redis.connection.AbstractConnection.pack_commands = _counted_pack_many  # type: ignore[method-assign]


def versions() -> dict[str, str]:
    from importlib import metadata

    return {"redis-py": metadata.version("redis"), "limits": metadata.version("limits")}


def connected(r: redis.Redis, n: int) -> None:
    """Opens n connections of r's pool now (their handshakes are not the run's)."""
    pool = r.connection_pool
    conns = [pool.get_connection() for _ in range(n)]
    for c in conns:
        pool.release(c)


def admitter(a: argparse.Namespace) -> Callable[[str], None]:
    """A function that returns once the caller is admitted on `key`."""
    if a.client.startswith("warden"):
        r = redis.Redis(port=a.port, max_connections=a.callers + 4)
        connected(r, a.callers)
        rate = [a.count, a.period, "BURST", a.burst]
        if a.client == "warden-wait":

            def admit(key: str) -> None:
                while True:
                    reply = r.execute_command("RATE.ACQUIRE", key, *rate, "WAIT", 10000)
                    if reply[0] == 0:
                        return
                    next(REFUSED)

            return admit

        def retry(key: str) -> None:
            while True:
                reply = r.execute_command("RATE.ACQUIRE", key, *rate)
                if reply[0] == 0:
                    return
                next(REFUSED)
                time.sleep(reply[3] / 1000)

        return retry
    from limits import RateLimitItemPerSecond
    from limits.storage import RedisStorage
    from limits.strategies import FixedWindowRateLimiter, MovingWindowRateLimiter

    if a.period != 1000:
        sys.exit("limits: --period 1000 only (RateLimitItemPerSecond)")
    storage = RedisStorage(f"redis://127.0.0.1:{a.port}", max_connections=a.callers + 4)
    limiter = {"limits-moving": MovingWindowRateLimiter, "limits-fixed": FixedWindowRateLimiter}[
        a.client
    ](storage)
    connected(storage.storage, a.callers)
    item = RateLimitItemPerSecond(a.count)

    def hit(key: str) -> None:
        while not limiter.hit(item, key):
            next(REFUSED)
            reset = limiter.get_window_stats(item, key).reset_time
            time.sleep(max(0.0, reset - time.time()))

    return hit


def main() -> None:
    global COUNTING
    if "--version" in sys.argv:
        print(json.dumps(versions()))
        return
    p = argparse.ArgumentParser()
    p.add_argument("--client", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--count", type=int, default=200)
    p.add_argument("--period", type=int, default=1000)
    p.add_argument("--burst", type=int, default=10)
    p.add_argument("--callers", type=int, default=16)
    p.add_argument("--seconds", type=float, default=10)
    a = p.parse_args()
    admit = admitter(a)

    # Warm-up: every thread's connection open, the scripts loaded.
    warm = [threading.Thread(target=admit, args=(a.key + ":warm",)) for _ in range(a.callers)]
    for t in warm:
        t.start()
    for t in warm:
        t.join()
    print("READY", flush=True)
    if sys.stdin.readline().strip() != "GO":
        return

    admits: list[list[float]] = [[] for _ in range(a.callers)]
    waits: list[list[float]] = [[] for _ in range(a.callers)]
    errors: list[str] = []
    start = threading.Event()
    t0 = 0.0

    def caller(i: int) -> None:
        start.wait()
        end = t0 + a.seconds
        while (asked := time.perf_counter()) < end:
            try:
                admit(a.key)
            except Exception as e:  # noqa: BLE001 - counted and reported
                errors.append(repr(e))
                time.sleep(0.01)
                continue
            now = time.perf_counter()
            admits[i].append((now - t0) * 1000)
            waits[i].append((now - asked) * 1000)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(a.callers)]
    for t in threads:
        t.start()
    COUNTING = True
    sent0, refused0 = next(SENT), next(REFUSED)
    t0 = time.perf_counter()
    start.set()
    for t in threads:
        t.join()
    sent, refused = next(SENT) - sent0 - 1, next(REFUSED) - refused0 - 1
    COUNTING = False
    result = {
        "admits": admits,
        "waits": [w for ws in waits for w in ws],
        "sent": sent,
        "refused": refused,
        "errors": len(errors),
        "error_sample": errors[0][:200] if errors else "",
    }
    print("RESULT " + json.dumps(result), flush=True)
    sys.stdin.readline()


if __name__ == "__main__":
    main()
