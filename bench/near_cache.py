"""Near caches, side by side: each ecosystem's own client-side
cache — redis-py's (`protocol=3, cache_config=CacheConfig()`), node-redis'
`clientSideCache` (RESP3), Redisson's `RLocalCachedMap` — and a plain `GET`
per read, on the same race, with warden's near caches beside them as they
land. Prints a markdown section and writes it, with the raw figures as
JSON, to OUT.md and OUT.json (default bench/results/near-cache).

    python bench/near_cache.py [--quick] [--out PREFIX]

WARDEN_MODULE: the module (required); WARDEN_SERVER: the server binary
(default redis-server); WARDEN_NEAR_PORT: the server's port (default a free
one from 7400); WARDEN_NEAR_ONLY: languages to run, comma-separated
(python, node, java, rust, go); WARDEN_NEAR_JAVA: `java -cp … class` for
the Java driver (set by `make bench SECTION=near-cache`; its rows are left
out when absent); WARDEN_NEAR_RUST, WARDEN_NEAR_GO: the Rust and Go
drivers (rows left out when absent; Go's default: target/go-bench near, built
by the make target); WARDEN_NEAR_NOTE_<LANG>
(e.g. WARDEN_NEAR_NOTE_RUST): a note on that driver's build, printed with it.

One server for the whole run; every contender in turn, on its own keys.

- **The race.** A writer (its own process and connection: the Python
  driver's --writer; for Redisson a second RedissonClient in the driver's
  JVM, writing through its own `RLocalCachedMap.fastPut`, since the map is a
  hash and its invalidations are its own pub/sub) writes n+1 to KEYS keys
  in turn, WRITE_RATE writes per second in all, for SECONDS; after each
  acknowledgement it notes (key, n, ack time). warden's near caches read
  the same plain string keys (`CACHE.PEEK` answers a string key; a `SET`
  invalidates it). One reader thread in the contender's process reads the keys in
  turn through the contender's near cache in a tight loop, noting (key,
  value, read start). All use CLOCK_MONOTONIC, shared by every process on
  the machine.
- **Stale read:** a read that started more than one round trip after the
  acknowledgement of a newer value, yet answered an older one. The round
  trip is the median of RTT_PINGS `PING`s on a raw socket just before the
  contender's run (stated per row). With one writer writing each key in
  turn, a read of value v on key k is stale iff the ack of v+1 on k came
  more than a round trip before the read started. The drivers keep reads
  run-length coded (per key, reads answering the same value within 2 µs of
  the run's first are one entry with first and last start and a count); an
  entry that straddles the threshold counts its reads after it pro rata
  (an error of at most 2 µs of reads per value change). "Longest stale":
  the most by which a stale read started after the newer value's ack.
- **reads/s:** reads ÷ the race's length. **Server commands / read:**
  commands the server processed during the race, less the writer's, ÷
  reads: 1.0 for a plain `GET`, about the miss ratio for a near cache
  (hit ratio = 1 − it; Redisson's pings and pub/sub count too).
- **Hit latency:** HITS reads of a key nothing writes, after a warm-up,
  each timed alone in-process (the timer's own cost included), before the
  race: median and p99.

warden's near caches: Python, Node, Java and Go from their packages in
this checkout; Rust from warden-client/examples/near_cache.rs (built with
--features near-bench by the make target, when warden-client has it and it
builds). A driver that cannot start says why in its row.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[1]
QUICK = "--quick" in sys.argv
OUT = (
    Path(sys.argv[sys.argv.index("--out") + 1])
    if "--out" in sys.argv
    else ROOT / "bench/results/near-cache"
)
MODULE = os.environ.get("WARDEN_MODULE") or sys.exit("WARDEN_MODULE: the module to load")
SERVER = os.environ.get("WARDEN_SERVER", "redis-server")
ONLY = [x for x in os.environ.get("WARDEN_NEAR_ONLY", "").split(",") if x]

KEYS = 4
WRITE_RATE = 400  # writes per second, over all keys: each key every 10 ms
SECONDS = 3.0 if QUICK else 10.0
HITS = 50_000 if QUICK else 200_000
RTT_PINGS = 2_000

DRIVERS: dict[str, list[str]] = {
    "python": [sys.executable, str(ROOT / "bench/near_cache_python.py")],
    "node": [shutil.which("node") or "node", str(ROOT / "node/bench/near_cache.mjs")],
    "java": shlex.split(os.environ.get("WARDEN_NEAR_JAVA", "")),
    "rust": shlex.split(os.environ.get("WARDEN_NEAR_RUST", "")),
    "go": shlex.split(os.environ.get("WARDEN_NEAR_GO", ""))
    or ([str(ROOT / "target/go-bench"), "near"] if (ROOT / "target/go-bench").exists() else []),
}
# (language, client, label, how, writer: plain (a SET per write) | own (the driver's), hook)
CONTENDERS = [
    (
        "python",
        "get",
        "plain `GET` (no near cache)",
        "redis-py 8, one `GET` per read",
        "plain",
        False,
    ),
    (
        "python",
        "redis-py-csc",
        "redis-py client-side cache",
        "`Redis(protocol=3, cache_config=CacheConfig())`: CLIENT TRACKING on its connection",
        "plain",
        False,
    ),
    (
        "python",
        "warden",
        "warden near cache",
        "`warden.Cache(r, near_cache=warden.NearCacheConfig())`, "
        "`get_or_load(k, loader, ttl=300)`: its tracking connection read by a daemon thread",
        "plain",
        False,
    ),
    (
        "python",
        "warden-yield",
        "warden near cache, reader yields",
        "the same; the reader calls `time.sleep(0)` every 100 reads (the GIL goes to the tracking "
        "thread, as it would in a reader doing any I/O)",
        "plain",
        False,
    ),
    (
        "node",
        "get",
        "plain `GET` (no near cache)",
        "node-redis 5, `await client.get(k)`",
        "plain",
        False,
    ),
    (
        "node",
        "node-redis-csc",
        "node-redis clientSideCache",
        "`createClient({RESP: 3, clientSideCache: {ttl: 0, maxEntries: 0}})`; the reader yields to "
        "the event loop (`setImmediate`) every 100 reads, or no invalidation is ever read",
        "plain",
        False,
    ),
    (
        "node",
        "warden",
        "warden near cache",
        "`warden.cache({ ttl: 300000, near: true })` on node-redis, `getOrLoad(k, loader)`; the "
        "reader yields every 100 reads, as above",
        "plain",
        False,
    ),
    (
        "java",
        "redisson",
        "Redisson RLocalCachedMap",
        "`getLocalCachedMap(LocalCachedMapOptions.name(…))` defaults (sync strategy INVALIDATE "
        "over its pub/sub); the writer: a second RedissonClient's `fastPut`",
        "own",
        False,
    ),
    (
        "java",
        "warden",
        "warden near cache",
        "`NearCache.builder(warden).build()` defaults on Lettuce, "
        "`getOrLoadString(k, ttl, loader)`",
        "plain",
        False,
    ),
    (
        "rust",
        "warden",
        "warden near cache",
        "warden-client `cache().near(NearConfig::default())`, `get_or_load(k, lease, loader)` "
        "on a 2-worker tokio runtime",
        "plain",
        False,
    ),
    (
        "go",
        "warden",
        "warden near cache",
        "`NewNearCache(w)` defaults; `Load[int64](ctx, w, k, ttl, loader, WithNear(near))`",
        "plain",
        False,
    ),
]


# WARDEN_NEAR_NOTE_<LANG>: a note on a driver's build, appended to its row's "how".
for i, c in enumerate(CONTENDERS):
    note = os.environ.get(f"WARDEN_NEAR_NOTE_{c[0].upper()}")
    if note and c[1] == "warden":
        CONTENDERS[i] = (*c[:3], f"{c[3]} ({note})", *c[4:])


def available(lang: str) -> bool:
    return bool(DRIVERS[lang]) and (not ONLY or lang in ONLY)


def free_port() -> int:
    if os.environ.get("WARDEN_NEAR_PORT"):
        return int(os.environ["WARDEN_NEAR_PORT"])
    for port in range(7400, 7500):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise SystemExit("no free port in 7400-7499")


class Server:
    def __enter__(self) -> Server:
        self.dir = tempfile.mkdtemp(prefix="warden-near-")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--loadmodule", MODULE],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.r = redis.Redis(port=self.port)
        for _ in range(300):
            try:
                self.r.ping()
                return self
            except redis.ConnectionError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.01)
        self.proc.kill()
        raise SystemExit(f"{SERVER} with {MODULE} did not start on port {self.port}")

    def __exit__(self, *exc: Any) -> None:
        self.r.close()
        self.proc.terminate()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def sample(self) -> tuple[float, int]:
        info = self.r.info("all")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"]), int(
            info["total_commands_processed"]
        )

    def rtt_ns(self) -> float:
        """Median PING round trip on a raw socket (no client library in it)."""
        with socket.create_connection(("127.0.0.1", self.port)) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            xs = []
            for _ in range(RTT_PINGS):
                t0 = time.monotonic_ns()
                s.sendall(b"PING\r\n")
                got = b""
                while not got.endswith(b"\r\n"):
                    got += s.recv(64)
                xs.append(time.monotonic_ns() - t0)
        return pct(xs, 50)


def pct(xs: list[Any], p: float) -> float:
    s = sorted(xs)
    return float(s[min(len(s) - 1, int(len(s) * p / 100))]) if s else math.nan


def start(argv: list[str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=ROOT,
    )  # fmt: skip
    assert proc.stdout
    line = proc.stdout.readline()
    if line.strip() != "READY":
        proc.kill()
        err = (proc.stderr.read() if proc.stderr else "").strip().splitlines()
        last = err[-1].split(": ", 1)[-1] if err else line.strip()
        raise RuntimeError(f"did not start: {last}"[:300])
    return proc


def result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout and proc.stdin
    line = proc.stdout.readline()
    if not line.startswith("RESULT "):
        err = (proc.stderr.read() if proc.stderr else "").strip().splitlines()
        raise RuntimeError(f"no RESULT: {line.strip()[:80]!r}; {err[-1] if err else ''}"[:300])
    proc.stdin.close()
    proc.wait(30)
    got: dict[str, Any] = json.loads(line[len("RESULT ") :])
    return got


def go(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin
    proc.stdin.write("GO\n")
    proc.stdin.flush()


def stale(entries: list[list[int]], acks: list[list[int]], rtt: float) -> dict[str, Any]:
    """Stale reads (module docstring): entries [key, value, first, last, count];
    acks [key, n, t]."""
    ack = {(k, n): t for k, n, t in acks}
    count = 0.0
    longest = 0
    values = 0
    for k, v, first, last, c in entries:
        a = ack.get((k, v + 1))
        if a is None:
            continue
        thr = a + rtt
        if first > thr:
            count += c
        elif last > thr:
            count += c * (last - thr) / max(1, last - first)
        else:
            continue
        values += 1
        longest = max(longest, last - a)
    return {"stale": round(count), "stale_longest_ms": longest / 1e6, "stale_entries": values}


def run(server: Server, lang: str, client: str, writer_mode: str, prefix: str) -> dict[str, Any]:
    r = server.r
    for i in range(KEYS):
        r.set(f"{prefix}:{i}", 0)
    r.set(f"{prefix}:hit", 0)
    common = [
        "--port",
        str(server.port),
        "--prefix",
        prefix,
        "--keys",
        str(KEYS),
        "--seconds",
        str(SECONDS),
    ]
    argv = DRIVERS[lang] + ["--client", client, *common, "--hits", str(HITS)]
    if writer_mode == "own":
        argv += ["--rate", str(WRITE_RATE)]
    w = None
    try:
        d = start(argv)
        if writer_mode != "own":
            w = start(
                DRIVERS["python"] + ["--writer", writer_mode, *common, "--rate", str(WRITE_RATE)]
            )
        rtt = server.rtt_ns()
        cpu0, cmds0 = server.sample()
        load0 = os.getloadavg()[0]
        go(d)
        if w:
            go(w)
        got = result(d)
        wrote = result(w) if w else {"acks": got.pop("acks"), "sent": got.pop("writer_sent")}
        cpu1, cmds1 = server.sample()
    except Exception as e:  # noqa: BLE001 - a crashed run is reported, the rest goes on
        for p in (d if "d" in locals() else None, w):
            if p and p.poll() is None:
                p.kill()
        return {"crashed": str(e)[:300]}
    reads = got["reads"]
    return {
        "rtt_us": rtt / 1000,
        "reads": reads,
        "reads_per_s": reads / got["seconds"],
        "writes": len(wrote["acks"]),
        **stale(got.pop("entries"), wrote["acks"], rtt),
        "server_cmds_per_read": (cmds1 - cmds0 - 1 - wrote["sent"]) / reads if reads else math.nan,
        "server_cpu_ms": (cpu1 - cpu0) * 1000,
        "hit_us_p50": got["hit_ns_p50"] / 1000,
        "hit_us_p99": got["hit_ns_p99"] / 1000,
        "timer": got.get("timer", ""),
        "load": [load0, os.getloadavg()[0]],
        **{k: v for k, v in got.items() if k.startswith("info")},
    }


def busy_elsewhere() -> str:
    """Load average and the busiest processes over one second (top)."""
    load = os.getloadavg()
    out = subprocess.run(
        ["top", "-b", "-n", "2", "-d", "1", "-o", "%CPU", "-w", "200"],
        check=False,
        capture_output=True,
        text=True,
    ).stdout
    rows = out.split("PID USER")[-1].splitlines()[1:6]
    top = ", ".join(f"{r.split()[11]} {r.split()[8]}%" for r in rows if len(r.split()) > 11)
    return f"load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}; busiest processes: {top}"


def versions(server: Server) -> dict[str, str]:
    out: dict[str, str] = {}
    info = server.r.info("server")
    mods = {m[b"name"].decode(): m[b"ver"] for m in server.r.execute_command("MODULE", "LIST")}
    out["server"] = f"Redis {info['redis_version']} ({shutil.which(SERVER) or SERVER})"
    out["module"] = f"warden {mods.get('warden', '?')} ({MODULE})"
    for lang in DRIVERS:
        if not available(lang):
            continue
        got = subprocess.run(
            DRIVERS[lang] + ["--version"], capture_output=True, text=True, cwd=ROOT
        )
        try:
            out.update(json.loads(got.stdout.strip().splitlines()[-1]))
        except (ValueError, IndexError):
            out[lang] = "?"
    return out


def fmt(x: float, digits: int = 2) -> str:
    if isinstance(x, float) and math.isnan(x):
        return "—"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}" if abs(x) < 10 else f"{x:.1f}"


def ratio(r: dict[str, Any], name: str, digits: int) -> str:
    """A ratio to the language's plain GET row; "no GET row" when it has none."""
    return f"{r[name]:.{digits}f}×" if name in r else "no `GET` row"


def main() -> None:
    began = time.monotonic()
    before = busy_elsewhere()
    rows: list[dict[str, Any]] = []
    with Server() as server:
        v = versions(server)
        for n, (lang, client, label, how, writer_mode, hook) in enumerate(CONTENDERS):
            row = {"language": lang, "client": client, "label": label, "how": how, "hook": hook}
            if not available(lang):
                row["crashed"] = "not run: no driver (see the module docstring)"
            else:
                row.update(run(server, lang, client, writer_mode, f"near:{n}:{lang}:{client}"))
            rows.append(row)
            print(f"{lang} {client}: " + (row.get("crashed") or f"{row['reads']} reads, "
                  f"{row['stale']} stale"), file=sys.stderr)  # fmt: skip
    after = busy_elsewhere()

    for r in rows:
        base = next(
            (
                x
                for x in rows
                if x["language"] == r["language"] and x["client"] == "get" and "crashed" not in x
            ),
            None,
        )
        if base and "crashed" not in r:
            r["reads_vs_get"] = r["reads_per_s"] / base["reads_per_s"]
            r["hit_vs_get"] = r["hit_us_p50"] / base["hit_us_p50"]

    ran = [r for r in rows if "crashed" not in r]
    text = [
        "## Near caches: stale reads and hit latency, side by side",
        "",
        "Server: " + v.pop("server") + "; module: " + v.pop("module") + ".  ",
        "Packages: " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".  ",
        f"The race: one writer writes n+1 to {KEYS} keys in turn, {WRITE_RATE} writes/s in all "
        f"(each key every {KEYS * 1000 // WRITE_RATE} ms), noting each acknowledgement; one reader "
        "thread in the contender's process reads the keys in turn through its near cache in a "
        f"tight loop for {SECONDS:g} s{' (QUICK)' if QUICK else ''}. A **stale read** started more "
        f"than one round trip (the median of {RTT_PINGS} raw-socket `PING`s just before the run, "
        "per row) after a newer value's acknowledgement, yet answered the older value; longest "
        "stale: by how much the last such read started after that acknowledgement. Hit latency: "
        f"{HITS:,} reads of a key nothing writes, each timed alone in-process (the timer "
        "included). Server commands / read: the server's commands during the race, less the "
        "writer's, ÷ reads (1.0: no near cache; about the miss ratio otherwise).  ",
        f"Machine: {os.cpu_count()} cores shared with other work (the figures move with it). "
        f"Before: {before}. After: {after}. Load average (1 min) at each run's start: "
        + ", ".join(f"{r['language']} {r['client']} {r['load'][0]:.1f}" for r in ran)
        + ".",
        "",
        "| language | client | stale reads (of reads) | longest stale ms | RTT µs "
        "| reads/s (÷ `GET`) | server commands / read (hit ratio) "
        "| hit p50 / p99 µs (÷ `GET` p50) | writes |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "crashed" in r:
            text.append(f"| {r['language']} | {r['label']} | {r['crashed'][:200]} | | | | | | |")
            continue
        hr = max(0.0, 1 - r["server_cmds_per_read"])
        text.append(
            f"| {r['language']} | {r['label']} | {r['stale']:,} ({r['stale'] / r['reads']:.2%}) "
            f"| {fmt(r['stale_longest_ms']) if r['stale'] else '—'} | {r['rtt_us']:.0f} "
            f"| {r['reads_per_s']:,.0f} ({ratio(r, 'reads_vs_get', 1)}) "
            f"| {r['server_cmds_per_read']:.3f} ({hr:.1%}) "
            f"| {fmt(r['hit_us_p50'])} / {fmt(r['hit_us_p99'])} ({ratio(r, 'hit_vs_get', 3)}) "
            f"| {r['writes']:,} |"
        )
    text += ["", "How each is configured:", ""]
    for r in rows:
        text.append(
            f"- {r['label']} ({r['language']}): {r['how']}"
            + (" — hook, awaiting its branch" if r["hook"] and "crashed" in r else "")
        )
    text.append(f"\n({time.monotonic() - began:.0f} s.)")
    md = "\n".join(text) + "\n"
    print(md, end="")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.with_suffix(".md").write_text(md)
    doc = {
        "versions": v,
        "server": SERVER,
        "module": MODULE,
        "quick": QUICK,
        "params": {
            "keys": KEYS,
            "write_rate": WRITE_RATE,
            "seconds": SECONDS,
            "hits": HITS,
            "rtt_pings": RTT_PINGS,
        },
        "machine": {"cores": os.cpu_count(), "before": before, "after": after},
        "rows": rows,
    }
    OUT.with_suffix(".json").write_text(json.dumps(doc, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
