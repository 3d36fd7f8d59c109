"""What a restart costs on `redis.conf.example`, and what `appendfsync always`
costs to avoid it, side by side in one run. Prints a markdown section and
writes it, with the raw figures as JSON, to OUT.md and OUT.json (default
bench/results/durability).

    python bench/durability.py [--quick] [--out PREFIX]

WARDEN_MODULE: the module (required); WARDEN_SERVER: the server binary
(default redis-server).

Two servers with the module run at once, each with an AOF in its own
directory on the same disk: one on `appendfsync everysec`, one on
`appendfsync always`. Every client is a redis-py connection sending raw
commands over TCP, one thread each (1, 10 and 50 clients, each on its own
key): `LOCK.ACQUIRE` then `LOCK.RELEASE`, pair after pair. The variants run
in slices taken in turn, round after round, so other work on the machine
falls on both alike. Server CPU from `INFO cpu` over each slice.

Then the restart: each configuration (the file's own, and the file with
`appendfsync always` and `warden.grace auto`) is started, waits out its
start-up window, grants a lock on key `held`, is killed (SIGKILL) and
started again on its AOF; the figure is the time from the restarted server
answering `PING` to the first `LOCK.ACQUIRE` of a free key that is granted
(polled every 10 ms), and whether `held` still has its holder.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[1]
QUICK = "--quick" in sys.argv
OUT = (
    Path(sys.argv[sys.argv.index("--out") + 1])
    if "--out" in sys.argv
    else ROOT / "bench/results/durability"
)
MODULE = os.environ.get("WARDEN_MODULE") or sys.exit("WARDEN_MODULE: the module to load")
SERVER = os.environ.get("WARDEN_SERVER", "redis-server")

ROUNDS = 2 if QUICK else 4
SLICE = 1.0 if QUICK else 2.5
LEASE_MS = 10000


def example_settings() -> list[tuple[str, str]]:
    """redis.conf.example's settings, but the harness's port, address and directory."""
    out = []
    for line in (ROOT / "redis.conf.example").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, value = line.partition(" ")
        if name not in ("port", "bind", "dir", "protected-mode", "loadmodule"):
            out.append((name, value.strip()))
    return out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Node:
    """One server with the module on a TCP port of loopback, its files in a directory of its own."""

    def __init__(self, settings: list[tuple[str, str]]) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="warden-durability-")
        self.args = [SERVER]
        for name, value in settings:
            self.args += [f"--{name}", *value.split()]
        self.args += [
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            self.dir,
            "--logfile",
            os.path.join(self.dir, "log"),
            "--loadmodule",
            MODULE,
        ]
        self.r = redis.Redis(port=self.port, decode_responses=True)
        self.start()

    def start(self) -> float:
        """Starts the server; returns when it answered PING (perf_counter)."""
        self.process = subprocess.Popen(
            self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                self.r.ping()
                return time.perf_counter()
            except (redis.ConnectionError, redis.BusyLoadingError):
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"{SERVER} did not start: {self.log()}") from None
                time.sleep(0.005)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        self.r.connection_pool.disconnect()

    def log(self) -> str:
        try:
            return Path(self.dir, "log").read_text()[-2000:]
        except OSError:
            return ""

    def cpu(self) -> float:
        info = self.r.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def grace_left(self) -> int:
        return int(self.r.info("warden").get("warden_grace_remaining_ms", 0))

    def stop(self) -> None:
        try:
            self.r.shutdown(nosave=True)
        except (redis.ConnectionError, redis.ResponseError):
            pass
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def quantile(samples: list[float], q: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def run_clients(port: int, n: int, seconds: float) -> tuple[list[float], float]:
    """n clients doing acquire + release pairs on their own keys: pair latencies (s), elapsed."""
    go = threading.Event()
    out: list[list[float]] = []
    lock = threading.Lock()

    def loop(index: int) -> None:
        r = redis.Redis(port=port)
        r.ping()
        pairs: list[float] = []
        go.wait()
        end = time.perf_counter() + seconds
        perf = time.perf_counter
        while perf() < end:
            owner = uuid.uuid4().hex
            t0 = perf()
            if r.execute_command("LOCK.ACQUIRE", f"k:{index}", owner, LEASE_MS) is None:
                continue
            r.execute_command("LOCK.RELEASE", f"k:{index}", owner)
            pairs.append(perf() - t0)
        with lock:
            out.append(pairs)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    began = time.perf_counter()
    go.set()
    for t in threads:
        t.join()
    return [p for o in out for p in o], time.perf_counter() - began


def throughput(settings: list[tuple[str, str]]) -> dict[str, Any]:
    """everysec against always, interleaved slices."""
    base = [(n, v) for n, v in settings if n not in ("appendfsync", "warden.grace")] + [
        ("warden.grace", "0")
    ]
    nodes = {fsync: Node(base + [("appendfsync", fsync)]) for fsync in ("everysec", "always")}
    acc: dict[tuple[str, int], dict[str, Any]] = {}
    try:
        for _ in range(ROUNDS):
            for n in (1, 10, 50):
                for fsync, node in nodes.items():
                    a = acc.setdefault((fsync, n), {"pairs": [], "seconds": 0.0, "cpu": 0.0})
                    c0 = node.cpu()
                    pairs, elapsed = run_clients(node.port, n, SLICE)
                    a["cpu"] += node.cpu() - c0
                    a["pairs"] += pairs
                    a["seconds"] += elapsed
    finally:
        for node in nodes.values():
            node.stop()
    figures: dict[str, Any] = {}
    for (fsync, n), a in acc.items():
        ops = len(a["pairs"])
        figures.setdefault(str(n), {})[fsync] = {
            "pairs_per_s": ops / a["seconds"] if a["seconds"] else 0.0,
            "pair_p50_ms": quantile(a["pairs"], 0.5) * 1000,
            "pair_p99_ms": quantile(a["pairs"], 0.99) * 1000,
            "cpu_ms_per_1000": a["cpu"] * 1e6 / max(1, ops),
            "pairs": ops,
        }
    return figures


def restart(settings: list[tuple[str, str]]) -> dict[str, Any]:
    """The time from a restarted server answering to its first grant of a free key."""
    node = Node(settings)
    try:
        started = time.monotonic()
        while node.grace_left() > 0:
            if time.monotonic() - started > 120:
                raise SystemExit(f"the start-up window did not end: {node.log()}")
            time.sleep(0.1)
        assert node.r.execute_command("LOCK.ACQUIRE", "held", "a", 30000) is not None
        node.kill()
        answered = node.start()
        tries = 0
        while node.r.execute_command("LOCK.ACQUIRE", f"free:{tries}", "b", 30000) is None:
            tries += 1
            time.sleep(0.01)
        granted = time.perf_counter()
        held = node.r.execute_command("LOCK.INFO", "held")
        owner = (
            held.get("owner")
            if isinstance(held, dict)
            else (held[held.index("owner") + 1] if held else None)
        )
        return {
            "next_holder_ms": (granted - answered) * 1000,
            "held_kept": owner == "a",
            "window_logged": "grace auto: no window" in node.log(),
        }
    finally:
        node.stop()


def fmt(x: float, digits: int = 2) -> str:
    return f"{x:,.{digits}f}"


def main() -> None:
    t0 = time.time()
    settings = example_settings()
    proposed = [(n, v) for n, v in settings if n not in ("appendfsync", "warden.grace")]
    proposed += [("appendfsync", "always"), ("warden.grace", "auto")]
    everysec_file = [(n, v) for n, v in settings if n != "appendfsync"] + [
        ("appendfsync", "everysec")
    ]
    figures: dict[str, Any] = {"throughput": throughput(settings)}
    figures["restart"] = {
        "appendfsync everysec, warden.grace 41000": restart(
            [(n, v) for n, v in everysec_file if n != "warden.grace"] + [("warden.grace", "41000")]
        ),
        "appendfsync always, warden.grace auto": restart(proposed),
    }
    figures["meta"] = {
        "server": SERVER,
        "module": MODULE,
        "quick": QUICK,
        "rounds": ROUNDS,
        "slice_s": SLICE,
        "seconds": time.time() - t0,
        "cores": os.cpu_count(),
        "load": os.getloadavg(),
    }
    lines = [
        "## A restart on the production configuration, and what `appendfsync always` costs",
        "",
        f"{SERVER}, {ROUNDS} rounds of {SLICE} s slices per variant, interleaved; "
        f"1-minute load average at the end {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores.",
        "",
        "| clients | everysec pairs/s | always pairs/s | always / everysec | p50 / p99 ms everysec "
        "| p50 / p99 ms always | server CPU ms per 1,000 pairs (everysec → always) |",
        "|---|---|---|---|---|---|---|",
    ]
    for n, row in figures["throughput"].items():
        e, a = row["everysec"], row["always"]
        ratio = a["pairs_per_s"] / e["pairs_per_s"] if e["pairs_per_s"] else float("nan")
        lines.append(
            f"| {n} | {fmt(e['pairs_per_s'], 0)} | {fmt(a['pairs_per_s'], 0)} | {ratio:.2f}× | "
            f"{fmt(e['pair_p50_ms'])} / {fmt(e['pair_p99_ms'])} | {fmt(a['pair_p50_ms'])} / "
            f"{fmt(a['pair_p99_ms'])} | {fmt(e['cpu_ms_per_1000'])} → {fmt(a['cpu_ms_per_1000'])} |"
        )
    lines += [
        "",
        "| configuration | first new holder after a kill -9 restart "
        "| the held lock kept its holder |",
        "|---|---|---|",
    ]
    for name, r in figures["restart"].items():
        lines.append(
            f"| {name} | {fmt(r['next_holder_ms'], 0)} ms | {'yes' if r['held_kept'] else 'no'} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{OUT}.md").write_text(text)
    Path(f"{OUT}.json").write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
