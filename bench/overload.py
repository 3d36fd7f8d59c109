"""Overload, side by side: warden's clients (Python sync and asyncio, Node
warden-redis with `wait` and with an AbortSignal, Rust warden-client) against
what users run instead (npm redis-semaphore, redis-py's Lock). Prints a
markdown section and writes it, with the raw figures as JSON, to OUT.md and
OUT.json (default bench/results/overload).

    python bench/overload.py [--quick] [--out PREFIX]

WARDEN_MODULE: the module (required); WARDEN_SERVER: the server binary
(default redis-server, Redis 7.0); WARDEN_OVERLOAD_RUST: the Rust driver
(default target/release/examples/overload; its rows are left out when absent);
WARDEN_OVERLOAD_JAVA_CP: the Java driver's classpath file (default
java/warden-lettuce/target/classpath.txt, written by `make bench
SECTION=overload`; its rows are left out when absent); WARDEN_OVERLOAD_ONLY:
drivers to run, comma-separated (e.g. `java`; default all).

Each run starts its own server (a free port in 7400-7499; from
WARDEN_OVERLOAD_PORT_BASE if set) and one driver
process: node/bench/overload.mjs, bench/overload_python.py,
warden-client/examples/overload.rs, java/warden-lettuce/src/test/java/
io/warden/lettuce/OverloadDriver.java. Their parameters and the JSON line
they print are described at the top of each. Scenarios:

- overload: a semaphore of limit 3 (and a lock: limit 1), each holder 4 ms
  inside, one request a ms for 300 ms, each caller giving up after 50 ms.
  The capacity bound is limit * (arrivals + deadline) / hold: no grant can
  start after the last caller's deadline. Late = granted after the caller's
  deadline (counted as granted, not as goodput: the caller has given up).
- burst: 32 acquires at once on a fresh client object, permits free.
- throughput: 50 callers on a limit of 5, one INCR inside (Node); with each
  client's CPU and the server's per acquisition.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import statistics
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
    else ROOT / "bench/results/overload"
)
MODULE = os.environ.get("WARDEN_MODULE") or sys.exit("WARDEN_MODULE: the module to load")
SERVER = os.environ.get("WARDEN_SERVER", "redis-server")
RUST = Path(os.environ.get("WARDEN_OVERLOAD_RUST", ROOT / "target/release/examples/overload"))
PYTHON = sys.executable
NODE = shutil.which("node") or "node"
JAVA_CP = Path(
    os.environ.get("WARDEN_OVERLOAD_JAVA_CP", ROOT / "java/warden-lettuce/target/classpath.txt")
)


def java_argv() -> list[str]:
    """The Java driver: the module's classes and test classes, then its dependencies."""
    if not JAVA_CP.exists():
        return []
    module = JAVA_CP.parent
    cp = [
        str(module / "test-classes"),
        str(module / "classes"),
        JAVA_CP.read_text().strip(),
    ]
    return [
        shutil.which("java") or "java",
        "-cp",
        ":".join(cp),
        "io.warden.lettuce.OverloadDriver",
    ]


REPEATS = 1 if QUICK else 3
OVERLOAD = {"hold-ms": 4, "interval-ms": 1, "requests": 300, "deadline-ms": 50}
BURST = {"limit": 32, "requests": 32, "rounds": 5 if QUICK else 10}
THROUGHPUT = {"limit": 5, "callers": 50, "seconds": 2 if QUICK else 4}
THROUGHPUT_ROUNDS = 1 if QUICK else 3

# (label, how the deadline is given, driver, --client, kinds it runs)
DRIVERS = {
    "node": [NODE, str(ROOT / "node/bench/overload.mjs")],
    "python": [PYTHON, str(ROOT / "bench/overload_python.py")],
    "rust": [str(RUST)],
    "java": java_argv(),
}
CLIENTS = [
    (
        "Python warden.Semaphore/Lock (threads)",
        "blocking_timeout=0.05",
        "python",
        "warden-sync",
        "sem lock",
    ),
    (
        "Python warden.asyncio",
        "blocking_timeout=0.05",
        "python",
        "warden-asyncio",
        "sem lock",
    ),
    (
        "Python warden.asyncio, its pools warm (a second run on the client)",
        "blocking_timeout=0.05",
        "python",
        "warden-asyncio-warm",
        "sem",
    ),
    ("Node warden-redis", "wait: 50", "node", "warden-wait", "sem lock"),
    (
        "Node warden-redis",
        "signal: AbortSignal.timeout(50)",
        "node",
        "warden-signal",
        "sem lock",
    ),
    (
        "Node warden-redis",
        "wait: 50, maxQueue: 2 × limit",
        "node",
        "warden-shed",
        "sem lock",
    ),
    ("Rust warden-client", ".wait(50 ms)", "rust", "warden-wait", "sem lock"),
    (
        "Rust warden-client",
        "tokio::time::timeout(50 ms, ..)",
        "rust",
        "warden-timeout",
        "sem lock",
    ),
    (
        "Java warden-lettuce (a thread per request)",
        "tryAcquire(Duration.ofMillis(50))",
        "java",
        "warden-lettuce",
        "sem lock",
    ),
    (
        "Java warden-lettuce",
        "tryAcquireAsync(Duration.ofMillis(50))",
        "java",
        "warden-lettuce-async",
        "sem lock",
    ),
    (
        "npm redis-semaphore (Semaphore / Mutex)",
        "acquireTimeout: 50",
        "node",
        "redis-semaphore",
        "sem lock",
    ),
    (
        "redis-py Lock (threads)",
        "blocking_timeout=0.05",
        "python",
        "redis-py-lock",
        "lock",
    ),
]
BURSTS = [
    ("Python warden.Semaphore (threads)", "python", "warden-sync"),
    ("Python warden.asyncio.Semaphore", "python", "warden-asyncio"),
    ("Node warden-redis", "node", "warden-wait"),
    ("Rust warden-client", "rust", "warden-wait"),
    ("Java warden-lettuce (threads)", "java", "warden-lettuce"),
    ("npm redis-semaphore", "node", "redis-semaphore"),
]
ANCHORS = ("redis-semaphore", "redis-py-lock")
# Drivers whose deadline lives only in the caller (an AbortSignal, a dropped
# future): the server never learns it, so a grant decided before the cancel
# arrives can still reach the caller after its deadline.
LOCAL_DEADLINE = ("warden-signal", "warden-timeout")
# The targets (on-time grants ÷ the capacity bound): with the deadline passed
# to the server, >= 0.8 and none late; with it only in the caller, >= 0.5
# (late ones counted and shown, not judged: no client can hold a grant
# against a deadline it was never told).
TARGET_PASSED, TARGET_LOCAL = 0.8, 0.5
# Load shedding (QUEUE n) refuses callers up front by design, trading grants
# for latency: shown, not judged against the goodput targets.
SHEDDING = ("warden-shed",)
# A second run on the same client (its connections open): what a running
# service sees; shown beside the judged first run, not judged.
WARM = ("warden-asyncio-warm",)
KINDS = {"sem": ("semaphore, limit 3", 3), "lock": ("lock (limit 1)", 1)}


def bound(limit: int) -> float:
    p = OVERLOAD
    window = p["requests"] * p["interval-ms"] + p["deadline-ms"]
    return min(p["requests"], limit * window / p["hold-ms"])


def free_port() -> int:
    base = int(os.environ.get("WARDEN_OVERLOAD_PORT_BASE", "7400"))
    for port in range(base, base + 100):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise SystemExit(f"no free port in {base}-{base + 99}")


class Server:
    """One server with the module, on a free port, for one run."""

    def __enter__(self) -> Server:
        self.dir = tempfile.mkdtemp(prefix="warden-overload-")
        for _ in range(5):  # another process may take the port meanwhile
            self.port = free_port()
            self.proc = subprocess.Popen(
                [
                    SERVER,
                    "--port",
                    str(self.port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    self.dir,
                    "--loadmodule",
                    MODULE,
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
            self.client = redis.Redis(port=self.port)
            for _ in range(200):
                try:
                    self.client.ping()
                    return self
                except redis.ConnectionError:
                    if self.proc.poll() is not None:
                        break
                    time.sleep(0.01)
            self.proc.kill()
            self.proc.wait()
        raise SystemExit(f"{SERVER} with {MODULE} did not start")

    def __exit__(self, *exc: Any) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def run(driver: str, params: dict[str, Any]) -> dict[str, Any]:
    """One driver process against a server of its own: its JSON line."""
    with Server() as server:
        argv = DRIVERS[driver] + [a for k, v in params.items() for a in (f"--{k}", str(v))]
        argv += ["--port", str(server.port)]
        env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"crashed": f"exit {done.returncode}: {tail}"[:200]}
    return json.loads(lines[-1])


def pct(samples: list[float], p: float) -> float:
    if not samples:
        return math.nan
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]


def span(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:g}" if lo == hi else f"{lo:g}–{hi:g}"


def ms(x: float) -> str:
    return "—" if math.isnan(x) else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


ONLY = [d for d in os.environ.get("WARDEN_OVERLOAD_ONLY", "").split(",") if d]


def available(driver: str) -> bool:
    if ONLY and driver not in ONLY:
        return False
    if driver == "java":
        return bool(DRIVERS["java"])
    return driver != "rust" or RUST.exists()


def versions(server_bin: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for driver in ("node", "python", "rust", "java"):
        if available(driver):
            got = subprocess.run(
                DRIVERS[driver] + ["--version"],
                capture_output=True,
                text=True,
                env=dict(os.environ, PYTHONPATH=str(ROOT / "python")),
            )
            out.update(json.loads(got.stdout) if got.returncode == 0 else {driver: "?"})
    # The redis crate warden-client is built with (Cargo.lock names its version
    # among the client's dependencies when the lock holds more than one).
    lock = (ROOT / "Cargo.lock").read_text()
    client = re.search(r'name = "warden-client"\n.*?dependencies = \[(.*?)\]', lock, re.S)
    dep = re.search(r'"redis( [^"]+)?"', client.group(1)) if client else None
    if dep and available("rust"):
        only = re.search(r'name = "redis"\nversion = "([^"]+)"', lock)
        out["redis-rs"] = dep.group(1).strip() if dep.group(1) else only.group(1) if only else "?"
    with Server() as s:
        info = s.client.info("server")
        mods = {m[b"name"].decode(): m[b"ver"] for m in s.client.execute_command("MODULE", "LIST")}
    out = {
        "server": (
            f"Valkey {info['valkey_version']}"
            if "valkey_version" in info
            else f"Redis {info['redis_version']}"
        )
        + f" ({server_bin})",
        "module": f"warden {mods.get('warden', '?')} ({MODULE})",
        **out,
    }
    return out


def overload() -> tuple[list[str], list[dict[str, Any]]]:
    rows: list[dict[str, Any]] = []
    for kind, (_, limit) in KINDS.items():
        runs: dict[int, list[dict[str, Any]]] = {}
        for _ in range(REPEATS):  # interleaved: a busy machine drifts
            for i, (_, _, driver, client, kinds) in enumerate(CLIENTS):
                if kind in kinds.split() and available(driver):
                    params = {
                        "client": client,
                        "scenario": "overload",
                        "kind": kind,
                        "key": f"overload:{kind}",
                        "limit": limit,
                        **OVERLOAD,
                    }
                    runs.setdefault(i, []).append(run(driver, params))
        for i, got in runs.items():
            label, how, driver, client, _ = CLIENTS[i]
            ok = [r for r in got if "crashed" not in r]
            lat = [x for r in ok for x in r["lat_ms"]]
            row = {
                "kind": kind,
                "limit": limit,
                "client": label,
                "deadline": how,
                "driver": driver,
                "variant": client,
                "runs": len(got),
                "bound": bound(limit),
                "granted": [r["granted"] for r in ok],
                "late": [r["late"] for r in ok],
                "on_time": [r["granted"] - r["late"] for r in ok],
                "max_inside": max((r["max_inside"] for r in ok), default=0),
                "errors": sum(r["errors"] for r in ok) + len(got) - len(ok),
                "error_sample": next(
                    (
                        r.get("crashed") or r["error_sample"]
                        for r in got
                        if r.get("crashed") or r["error_sample"]
                    ),
                    "",
                ),
                "p50_ms": pct(lat, 50),
                "p99_ms": pct(lat, 99),
                "span_ms": [r["span_ms"] for r in ok],
                # What a hold really took on this machine (grant reaching the
                # caller to the release's reply): the bound a client can reach.
                "held_ms": statistics.fmean(h)
                if (h := [x for r in ok for x in r.get("held_ms", [])])
                else math.nan,
            }
            if client in SHEDDING:
                row["judged"] = "sheds by design"
            elif client in WARM:
                row["judged"] = "shown"
            elif client not in ANCHORS:
                local = client in LOCAL_DEADLINE
                share = TARGET_LOCAL if local else TARGET_PASSED
                row["meets_target"] = bool(ok) and (
                    min(row["on_time"]) >= share * row["bound"]
                    and (local or max(row["late"]) == 0)
                    and row["max_inside"] <= limit
                    and row["errors"] == 0
                )
            rows.append(row)
    lines = []
    for kind, (what, limit) in KINDS.items():
        b = bound(limit)
        lines += [
            f"\n**Overload, {what}**: one request a ms for {OVERLOAD['requests']} ms, each holder "
            f"{OVERLOAD['hold-ms']} ms inside, each caller giving up after "
            f"{OVERLOAD['deadline-ms']} ms. "
            f"Capacity bound {limit} × ({OVERLOAD['requests']} + {OVERLOAD['deadline-ms']}) / "
            f"{OVERLOAD['hold-ms']} = **{b:g}** grants. {REPEATS} run(s) each, ranges min–max; "
            "latency of the grants, all runs; arrivals: ms from the first call to the last "
            f"(a loaded machine stretches the {OVERLOAD['requests'] * OVERLOAD['interval-ms']} ms, "
            "which lowers the load and lets more through). "
            f"Target: on time ≥ {TARGET_PASSED} of the bound and 0 late with the deadline "
            f"passed; ≥ {TARGET_LOCAL} with it only in the caller (an AbortSignal, a "
            "dropped future), where late grants are shown, not judged.\n",
            "| client | deadline given as | granted | on time (÷ bound) | late | max inside "
            "| errors "
            "| p50 ms | p99 ms | arrivals ms | hold ms, measured | on time ÷ bound at that hold "
            "| target |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in (r for r in rows if r["kind"] == kind):
            if not r["granted"]:
                cells = ["—"] * 4
            else:
                frac = f"{min(r['on_time']) / b:.2f}–{max(r['on_time']) / b:.2f}"
                cells = [
                    span(r["granted"]),
                    f"{span(r['on_time'])} ({frac})",
                    span(r["late"]),
                    f"{r['max_inside']}" + (" ⚠" if r["max_inside"] > limit else ""),
                ]
            err = f"{r['errors']}" + (f" ({r['error_sample'][:60]})" if r["errors"] else "")
            target = (
                r.get("judged", "anchor")
                if "meets_target" not in r
                else "✓"
                if r["meets_target"]
                else "✗"
            )
            lines.append(
                f"| {r['client']} | `{r['deadline']}` | "
                + " | ".join(cells)
                + f" | {err} | {ms(r['p50_ms'])} | {ms(r['p99_ms'])} "
                f"| {max(r['span_ms'], default=math.nan):.0f} | {ms(r['held_ms'])} "
                f"| {held_fraction(r)} | {target} |"
            )
    return lines, rows


def held_fraction(r: dict[str, Any]) -> str:
    """On-time grants against the bound a hold of the measured length allows."""
    if not r["on_time"] or math.isnan(r["held_ms"]):
        return "—"
    p = OVERLOAD
    b = min(
        p["requests"],
        r["limit"] * (p["requests"] * p["interval-ms"] + p["deadline-ms"]) / r["held_ms"],
    )
    return f"{min(r['on_time']) / b:.2f}–{max(r['on_time']) / b:.2f}"


def burst() -> tuple[list[str], list[dict[str, Any]]]:
    rows = []
    for label, driver, client in BURSTS:
        if not available(driver):
            continue
        r = run(
            driver,
            {
                "client": client,
                "scenario": "burst",
                "kind": "sem",
                "key": "burst",
                **BURST,
            },
        )
        first, last = r.get("first_ms", []), r.get("all_ms", [])
        row = {
            "client": label,
            "variant": client,
            "first_ms": first,
            "all_ms": last,
            "errors": r.get("errors", 1),
            "error_sample": r.get("crashed") or r.get("error_sample", ""),
        }
        if first:
            row["first_median"], row["all_median"] = (
                statistics.median(first),
                statistics.median(last),
            )
        if client not in ANCHORS:
            row["meets_target"] = (
                bool(first)
                and row["first_median"] <= 2
                and row["all_median"] <= 5
                and row["errors"] == 0
            )
        rows.append(row)
    lines = [
        f"\n**Burst**: {BURST['requests']} acquires at once with free permits "
        f"(limit {BURST['limit']}) "
        f"on a fresh client object (the application's connection open), {BURST['rounds']} rounds: "
        "median (max) ms from the burst's start. Target: first ≤ 2 ms, all ≤ 5 ms.\n",
        "| client | first grant | all 32 | errors | target |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        if r["first_ms"]:
            cells = [
                f"{ms(r['first_median'])} ({ms(max(r['first_ms']))})",
                f"{ms(r['all_median'])} ({ms(max(r['all_ms']))})",
            ]
        else:
            cells = ["—", "—"]
        err = f"{r['errors']}" + (f" ({r['error_sample'][:60]})" if r["errors"] else "")
        target = "anchor" if "meets_target" not in r else "✓" if r["meets_target"] else "✗"
        lines.append(f"| {r['client']} | " + " | ".join(cells) + f" | {err} | {target} |")
    return lines, rows


def per_acquisition(runs: list[dict[str, Any]], field: str) -> float:
    """A per-acquisition figure over several runs, each weighted by its acquisitions."""
    n = sum(r["acquisitions"] for r in runs)
    return sum(r[field] * r["acquisitions"] for r in runs) / n if n else math.nan


def throughput() -> tuple[list[str], list[dict[str, Any]]]:
    got: dict[str, list[dict[str, Any]]] = {"warden-wait": [], "redis-semaphore": []}
    for _ in range(THROUGHPUT_ROUNDS):
        for client in got:
            got[client].append(
                run(
                    "node",
                    {
                        "client": client,
                        "scenario": "throughput",
                        "kind": "sem",
                        "key": "throughput",
                        **THROUGHPUT,
                    },
                )
            )
    rows = []
    for client, runs in got.items():
        ok = [r for r in runs if "crashed" not in r]
        lat = [x for r in ok for x in r["lat_ms"]]
        n, secs = sum(r["acquisitions"] for r in ok), sum(r["seconds"] for r in ok)
        rows.append(
            {
                "client": "Node warden-redis"
                if client == "warden-wait"
                else "npm redis-semaphore (Semaphore)",
                "variant": client,
                "rate": n / secs if secs else math.nan,
                "rates": [r["rate"] for r in ok],
                "p50_ms": pct(lat, 50),
                "p99_ms": pct(lat, 99),
                "max_inside": max((r["max_inside"] for r in ok), default=0),
                "client_cpu_us": per_acquisition(ok, "client_cpu_us"),
                "server_cpu_us": per_acquisition(ok, "server_cpu_us"),
                "errors": sum(r["errors"] for r in ok) + len(runs) - len(ok),
                "error_sample": next(
                    (
                        r.get("crashed") or r["error_sample"]
                        for r in runs
                        if r.get("crashed") or r["error_sample"]
                    ),
                    "",
                ),
            }
        )
    w, a = rows
    rate_ratio, p99_ratio = w["rate"] / a["rate"], w["p99_ms"] / a["p99_ms"]
    summary = {
        "rate_ratio": rate_ratio,
        "p99_ratio": p99_ratio,
        "meets_target": rate_ratio >= 1.2 and p99_ratio <= 0.2 and w["errors"] == 0,
    }
    lines = [
        f"\n**Throughput**: {THROUGHPUT['callers']} callers on a limit of {THROUGHPUT['limit']}, "
        f"one INCR inside, each looping for {THROUGHPUT['seconds']} s ({THROUGHPUT_ROUNDS} "
        "round(s), alternating; the libraries' default waits). Target: ≥ 1.2× redis-semaphore's "
        "acquisitions/s, p99 ≤ 1/5 of its. CPU per acquisition: the Node process's "
        "(`process.cpuUsage()`) and the server's (`INFO cpu`, user + sys), over the callers' "
        "loops: the figure a busy machine moves least.\n",
        "| client | acquisitions/s (rounds) | p50 wait ms | p99 wait ms | max inside "
        "| client CPU µs / acquisition | server CPU µs / acquisition | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        err = f"{r['errors']}" + (f" ({r['error_sample'][:60]})" if r["errors"] else "")
        lines.append(
            f"| {r['client']} | {r['rate']:,.0f} ({span([round(x) for x in r['rates']])}) "
            f"| {ms(r['p50_ms'])} | {ms(r['p99_ms'])} "
            f"| {r['max_inside']} | {r['client_cpu_us']:.0f} | {r['server_cpu_us']:.0f} | {err} |"
        )
    lines.append(
        f"\nwarden-redis ÷ redis-semaphore: **{rate_ratio:.2f}×** acquisitions/s, p99 "
        f"**1/{1 / p99_ratio:.1f}** of its ({'✓' if summary['meets_target'] else '✗'} target)."
    )
    return lines, rows + [summary]


def main() -> None:
    began = time.monotonic()
    v = versions(shutil.which(SERVER) or SERVER)
    sections: dict[str, Any] = {}
    doc: dict[str, Any] = {"versions": dict(v)}
    text = [
        "## Overload: warden's clients against redis-semaphore and redis-py's Lock",
        "",
    ]
    text.append("Server: " + v.pop("server") + "; module: " + v.pop("module") + ".  ")
    text.append("Packages: " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".  ")
    text.append(
        "Capacity bounds: "
        + ", ".join(f"{what} {bound(limit):g}" for what, limit in KINDS.values())
        + f"{' (QUICK)' if QUICK else ''}."
    )
    for name, section in (
        ("overload", overload),
        ("burst", burst),
        ("throughput", throughput),
    ):
        if name == "throughput" and not available("node"):
            continue
        lines, rows = section()
        sections[name] = rows
        text += lines
    text.append(f"\n({time.monotonic() - began:.0f} s on {os.cpu_count()} cores.)")
    md = "\n".join(text) + "\n"
    print(md, end="")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.with_suffix(".md").write_text(md)
    doc |= {
        "server": SERVER,
        "module": MODULE,
        "quick": QUICK,
        "params": {
            "overload": OVERLOAD,
            "burst": BURST,
            "throughput": THROUGHPUT,
            "repeats": REPEATS,
        },
        "bounds": {k: bound(limit) for k, (_, limit) in KINDS.items()},
        **sections,
    }
    OUT.with_suffix(".json").write_text(json.dumps(doc, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
