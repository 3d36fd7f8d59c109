"""How late a timed-out `LOCK.ACQUIRE ... WAIT 10` is answered: 200 tries
against a held lock, lateness = elapsed - 10 ms. Usage: wait_lateness.py MODULE"""

import os
import statistics
import subprocess
import sys
import tempfile
import time

import redis


def main():
    module = os.path.abspath(sys.argv[1])
    tries = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    d = tempfile.mkdtemp()
    sock = os.path.join(d, "s.sock")
    server = subprocess.Popen(
        [
            "redis-server",
            "--port",
            "0",
            "--unixsocket",
            sock,
            "--save",
            "",
            "--dir",
            d,
            "--loadmodule",
            module,
        ],
        stdout=open(os.path.join(d, "log"), "w"),
    )
    try:
        r = redis.Redis(unix_socket_path=sock, protocol=2)
        for _ in range(200):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.02)
        r.execute_command("LOCK.ACQUIRE", "k", "holder", 3_600_000)
        late = []
        for _ in range(tries):
            t = time.perf_counter()
            assert r.execute_command("LOCK.ACQUIRE", "k", "waiter", 1000, "WAIT", 10) is None
            late.append((time.perf_counter() - t) * 1000 - 10)
        late.sort()
        print(
            f"WAIT 10 lateness over {tries} tries: median {statistics.median(late):.1f} ms, "
            f"p99 {late[int(len(late) * 0.99) - 1]:.1f} ms, max {late[-1]:.1f} ms"
        )
    finally:
        server.kill()
        if os.environ.get("SHOWLOG"):
            print(open(os.path.join(d, "log")).read()[-3000:])


main()
