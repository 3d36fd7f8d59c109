"""Rate limiters, side by side: warden's `RATE.ACQUIRE` (with `WAIT`, and
as a retry loop without it) against what users run instead — Python
`limits` (its Redis moving and fixed window strategies), Node
`rate-limiter-flexible` (RateLimiterRedis on ioredis, and its
RateLimiterQueue) and Go `go-redis/redis_rate` v10 (GCRA in Lua). Prints a
markdown section and writes it, with the raw figures as JSON, to OUT.md and
OUT.json (default bench/results/rate).

    python bench/rate.py [--quick] [--out PREFIX]

WARDEN_MODULE: the module (required); WARDEN_SERVER: the server binary
(default redis-server); WARDEN_RATE_GO: the Go driver (default
target/go-bench, built by `make bench SECTION=rate`; its rows are left out
when absent); WARDEN_RATE_PORT: the server's port (default a free one from
7600); WARDEN_RATE_ONLY: languages to run, comma-separated (python, node, go).

One server for the whole run. Every contender runs CALLERS callers in one
process of its language (bench/rate_python.py, node/bench/rate.mjs, go/bench
rate.go: each documents its clients), each caller wanting to be admitted as
soon as possible, again and again, for SECONDS, on a limiter of RATE per
second, burst BURST, on a fresh key. Rounds take every contender in turn
(a busy machine drifts: it falls on all alike). Around each run, after the
driver's warm-up, `INFO` gives the server's CPU (used_cpu_sys +
used_cpu_user) and commands processed (every command, those a script calls
included); the drivers count the commands they send.

- admissions/s: admissions ÷ the run's length (its start to the last
  admission); ÷ RATE: 1.00 is the configured rate (BURST more over the run
  makes it slightly above).
- over-admission: the most admissions beyond BURST + RATE × d in any stretch
  of d ≤ 1 s of the run, counting the admissions whose request and reply
  both fall inside it (the server made each between the two, so a figure
  above 0 is a real excess, never one the callers' timing made up); the
  JSON also has it over the whole run (over_run).
- most in any 100 ms: the most admissions seen inside any 100 ms (callers'
  clocks; GCRA's bound is BURST + RATE × 0.1 s, which late replies can only
  appear to exceed by bunching).
- wait: from a caller wanting an admission to having it.
- per-caller max/min: admissions of the most and least served caller of a
  run (worst run).
"""

from __future__ import annotations

import json
import math
import os
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
    else ROOT / "bench/results/rate"
)
MODULE = os.environ.get("WARDEN_MODULE") or sys.exit("WARDEN_MODULE: the module to load")
SERVER = os.environ.get("WARDEN_SERVER", "redis-server")
GO = Path(os.environ.get("WARDEN_RATE_GO", ROOT / "target/go-bench"))
ONLY = [x for x in os.environ.get("WARDEN_RATE_ONLY", "").split(",") if x]

RATE = 200  # per second
BURST = 10
CALLERS = 16
SECONDS = 3.0 if QUICK else 10.0
ROUNDS = 1 if QUICK else 3
WINDOW_MS = 100

DRIVERS = {
    "python": [sys.executable, str(ROOT / "bench/rate_python.py")],
    "node": [shutil.which("node") or "node", str(ROOT / "node/bench/rate.mjs")],
    "go": [str(GO), "rate"],
}
LANGUAGES = {
    "python": "Python (redis-py 8, one thread per caller)",
    "node": "Node (ioredis, one process, async callers)",
    "go": "Go (go-redis v9, one goroutine per caller)",
}
WINDOWED = f"{RATE} per 1 s window: no burst of its own, a window admits {RATE} at once"
# (language, client, label, how it is configured and waits)
CONTENDERS = [
    (
        "python",
        "warden-wait",
        "warden `WAIT`",
        f"`RATE.ACQUIRE k {RATE} 1000 BURST {BURST} WAIT 10000`: the server queues the caller",
    ),
    (
        "python",
        "warden-retry",
        "warden, retry loop",
        "the same without `WAIT`; limited: sleep `retry_after`, ask again",
    ),
    (
        "python",
        "limits-moving",
        "`limits` moving window",
        f"`MovingWindowRateLimiter`, `{RATE}/second` ({WINDOWED}); refused: sleep until "
        "`get_window_stats().reset_time`",
    ),
    (
        "python",
        "limits-fixed",
        "`limits` fixed window",
        f"`FixedWindowRateLimiter`, `{RATE}/second` (the same)",
    ),
    (
        "node",
        "warden-wait",
        "warden `WAIT`",
        "as above; a connection per caller (a blocking command holds its connection, as "
        "warden-redis's waiter connections)",
    ),
    ("node", "warden-retry", "warden, retry loop", "as above, one shared connection"),
    (
        "node",
        "rlf",
        "rate-limiter-flexible",
        f"`RateLimiterRedis({{ points: {RATE}, duration: 1 }})` ({WINDOWED}); rejected: sleep "
        "`msBeforeNext`, consume again",
    ),
    (
        "node",
        "rlf-queue",
        "rate-limiter-flexible queue",
        "the same limiter behind `RateLimiterQueue`: `removeTokens(1, key)` waits in an "
        "in-process FIFO",
    ),
    ("go", "warden-wait", "warden `WAIT`", "as above"),
    ("go", "warden-retry", "warden, retry loop", "as above"),
    (
        "go",
        "redis-rate",
        "redis_rate (GCRA)",
        f"`Limit{{Rate: {RATE}, Period: time.Second, Burst: {BURST}}}`; refused: sleep "
        "`RetryAfter`, `Allow` again",
    ),
]


def available(lang: str) -> bool:
    if ONLY and lang not in ONLY:
        return False
    return lang != "go" or GO.exists()


def free_port() -> int:
    if os.environ.get("WARDEN_RATE_PORT"):
        return int(os.environ["WARDEN_RATE_PORT"])
    for port in range(7600, 7700):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise SystemExit("no free port in 7600-7699")


class Server:
    def __enter__(self) -> Server:
        self.dir = tempfile.mkdtemp(prefix="warden-rate-")
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
        """Server CPU seconds (sys + user) and commands processed, one INFO."""
        info = self.r.info("all")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"]), int(
            info["total_commands_processed"]
        )


def run(server: Server, lang: str, client: str, key: str) -> dict[str, Any]:
    """One driver run: its RESULT, with the server's CPU and commands around it."""
    argv = DRIVERS[lang] + [
        "--client",
        client,
        "--port",
        str(server.port),
        "--key",
        key,
        "--count",
        str(RATE),
        "--period",
        "1000",
        "--burst",
        str(BURST),
        "--callers",
        str(CALLERS),
        "--seconds",
        str(SECONDS),
    ]
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert proc.stdin and proc.stdout
    try:
        line = proc.stdout.readline()
        if line.strip() != "READY":
            raise RuntimeError(f"no READY: {line.strip()!r}")
        cpu0, cmds0 = server.sample()
        load0 = os.getloadavg()[0]
        proc.stdin.write("GO\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        cpu1, cmds1 = server.sample()
        if not line.startswith("RESULT "):
            raise RuntimeError(f"no RESULT: {line.strip()!r}")
        got = json.loads(line[len("RESULT ") :])
        proc.stdin.close()
        proc.wait(30)
    except Exception as e:  # noqa: BLE001 - a crashed run is reported, the rest goes on
        proc.kill()
        err = (proc.stderr.read() if proc.stderr else "").strip().splitlines()
        return {"crashed": f"{e}; {err[-1] if err else ''}"[:300]}
    got["server_cpu_s"] = cpu1 - cpu0
    got["server_commands"] = cmds1 - cmds0 - 1  # less the first INFO
    got["load"] = [load0, os.getloadavg()[0]]
    return got


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return math.nan
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * p / 100))]


def most_in_window(times: list[float], width: float) -> int:
    s = sorted(times)
    best, j = 0, 0
    for i, t in enumerate(s):
        while s[j] <= t - width:
            j += 1
        best = max(best, i - j + 1)
    return best


def over_admission(pairs: list[tuple[float, float]], horizon_ms: float = 1000.0) -> float:
    """The most admissions beyond BURST + RATE × d in any stretch [a, a + d] (d ≤ horizon),
    counting only admissions asked for and seen admitted inside it: the server made each
    between its caller's asking and the reply, so none is placed inside the stretch by timing
    alone and a figure above 0 is a real excess. pairs: (asked, admitted) ms."""
    pairs = sorted(pairs)
    worst = 0.0
    for i, (a, _) in enumerate(pairs):
        done = []
        for asked, admitted in pairs[i:]:
            if asked > a + horizon_ms:
                break
            if admitted <= a + horizon_ms:
                done.append(admitted)
        done.sort()
        for m, b in enumerate(done):
            worst = max(worst, (m + 1) - BURST - RATE * (b - a) / 1000)
    return worst


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "crashed" not in r]
    per_run = []
    for r in ok:
        counts = [len(a) for a in r["admits"]]
        times = [t for a in r["admits"] for t in a]
        n = len(times)
        length = max(times) / 1000 if times else math.nan
        pairs = [(t - w, t) for t, w in zip(times, r["waits"])]
        per_run.append(
            {
                "admitted": n,
                "seconds": length,
                "per_s": n / length if n else 0.0,
                "over_run": max(0.0, n - (BURST + RATE * length)) if n else 0.0,
                "over": over_admission(pairs),
                "most_100ms": most_in_window(times, WINDOW_MS),
                "max_min": (max(counts) / min(counts)) if counts and min(counts) else math.inf,
                "counts": counts,
                "sent": r["sent"],
                "refused": r.get("refused", 0),
                "server_commands": r["server_commands"],
                "server_cpu_ms": r["server_cpu_s"] * 1000,
                "errors": r["errors"],
                "load": r["load"],
            }
        )
    waits = [w for r in ok for w in r["waits"]]
    n = sum(x["admitted"] for x in per_run)
    secs = sum(x["seconds"] for x in per_run if x["admitted"])
    nan = math.nan
    return {
        "runs": len(runs),
        "crashed": [r["crashed"] for r in runs if "crashed" in r],
        "admitted": n,
        "per_s": n / secs if secs else nan,
        "over_max": max((x["over"] for x in per_run), default=nan),
        "over_run_max": max((x["over_run"] for x in per_run), default=nan),
        "most_100ms": max((x["most_100ms"] for x in per_run), default=0),
        "sent_per": sum(x["sent"] for x in per_run) / n if n else nan,
        "refused_per": sum(x["refused"] for x in per_run) / n if n else nan,
        "server_commands_per": sum(x["server_commands"] for x in per_run) / n if n else nan,
        "cpu_ms_per_1000": sum(x["server_cpu_ms"] for x in per_run) * 1000 / n if n else nan,
        "wait_p50": pct(waits, 50),
        "wait_p99": pct(waits, 99),
        "max_min": max((x["max_min"] for x in per_run), default=nan),
        "errors": sum(x["errors"] for x in per_run) + len(runs) - len(ok),
        "error_sample": next(
            (
                r.get("crashed") or r.get("error_sample")
                for r in runs
                if r.get("crashed") or r.get("error_sample")
            ),
            "",
        ),
        "per_run": per_run,
    }


def fmt(x: float, digits: int = 2) -> str:
    if isinstance(x, float) and math.isnan(x):
        return "—"
    if isinstance(x, float) and math.isinf(x):
        return "∞"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}" if abs(x) < 10 else f"{x:.1f}"


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
        argv = DRIVERS[lang] + ["--version"]
        got = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
        try:
            out.update(json.loads(got.stdout.strip().splitlines()[-1]))
        except (ValueError, IndexError):
            out[lang] = "?"
    return out


def main() -> None:
    began = time.monotonic()
    before = busy_elsewhere()
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with Server() as server:
        v = versions(server)
        # The idle server over one run's length: its cron, part of every run's CPU.
        c0, _ = server.sample()
        time.sleep(SECONDS)
        c1, _ = server.sample()
        idle_ms = (c1 - c0) * 1000
        for rnd in range(ROUNDS):
            for lang, client, _, _ in CONTENDERS:
                if not available(lang):
                    continue
                key = f"rate:{lang}:{client}:{rnd}"
                got = run(server, lang, client, key)
                results.setdefault((lang, client), []).append(got)
                print(
                    f"round {rnd + 1}/{ROUNDS} {lang} {client}: "
                    + (got.get("crashed") or f"{sum(len(a) for a in got['admits'])} admitted"),
                    file=sys.stderr,
                )
    after = busy_elsewhere()

    rows = []
    for lang, client, label, how in CONTENDERS:
        if (lang, client) in results:
            rows.append(
                {
                    "language": lang,
                    "client": client,
                    "label": label,
                    "how": how,
                    **summarize(results[(lang, client)]),
                }
            )
    for r in rows:
        anchor = next(
            x for x in rows if x["language"] == r["language"] and x["client"] == "warden-wait"
        )
        r["cpu_vs_warden_wait"] = r["cpu_ms_per_1000"] / anchor["cpu_ms_per_1000"]
        r["sent_vs_warden_wait"] = r["sent_per"] / anchor["sent_per"]

    text = [
        "## Rate limiters: warden's `RATE.ACQUIRE` against limits, rate-limiter-flexible and "
        "redis_rate",
        "",
        "Server: " + v.pop("server") + "; module: " + v.pop("module") + ".  ",
        "Packages: " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".  ",
        f"A limiter of **{RATE} per second, burst {BURST}**; {CALLERS} callers in one process, "
        f"each wanting to be admitted as soon as possible, again and again, for {SECONDS:g} s; a "
        f"fresh key per run; {ROUNDS} round(s), every contender in "
        f"turn{' (QUICK)' if QUICK else ''}. The bound: at most {BURST} + {RATE} × d admissions in "
        f"any d s ({BURST + RATE * WINDOW_MS // 1000} in any {WINDOW_MS} ms); over-admission is "
        "the most beyond it in any stretch up to 1 s, counting the admissions whose request and "
        "reply both fall inside (a real excess, not one the timing made up).  ",
        f"Machine: {os.cpu_count()} cores shared with other work. Before: {before}. After: "
        f"{after}. Load average (1 min) at each run's start: "
        + ", ".join(f"{x['load'][0]:.1f}" for r in rows for x in r["per_run"])
        + ".  ",
        f"Server CPU includes its idle cron: {idle_ms:.0f} ms over {SECONDS:g} s idle (about "
        f"{idle_ms / (RATE * SECONDS + BURST) * 1000:.1f} ms per 1,000 admissions at the "
        "configured rate).",
        "",
        "How each is configured and waits:",
        "",
    ]
    for lang, client, label, how in CONTENDERS:
        if (lang, client) in results and (
            lang == "python" or client not in ("warden-wait", "warden-retry") or how != "as above"
        ):
            text.append(f"- {label} ({lang}): {how}")
    text.append("")
    for lang, title in LANGUAGES.items():
        mine = [r for r in rows if r["language"] == lang]
        if not mine:
            continue
        text += [
            f"**{title}**:",
            "",
            "| client | admissions/s (÷ rate) | over-admission | most in any 100 ms "
            "| commands sent / admission | server commands / admission "
            "| server CPU ms / 1,000 admissions (÷ warden `WAIT`) | wait p50 / p99 ms "
            "| per-caller max/min | errors |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in mine:
            err = f"{r['errors']}" + (f" ({r['error_sample'][:60]})" if r["errors"] else "")
            text.append(
                f"| {r['label']} | {r['per_s']:.1f} ({r['per_s'] / RATE:.3f}) "
                f"| {r['over_max']:.0f} | {r['most_100ms']} | {fmt(r['sent_per'])} "
                f"| {fmt(r['server_commands_per'])} "
                f"| {fmt(r['cpu_ms_per_1000'], 1)} ({r['cpu_vs_warden_wait']:.2f}×) "
                f"| {fmt(r['wait_p50'], 1)} / {fmt(r['wait_p99'], 1)} | {fmt(r['max_min'])} "
                f"| {err} |"
            )
        anchor = next(r for r in mine if r["client"] == "warden-wait")
        text.append("")
        text.append(
            "Against warden `WAIT` (each ÷ warden's): "
            + "; ".join(
                f"{r['label']}: commands sent {r['sent_vs_warden_wait']:.1f}×, server commands "
                f"{r['server_commands_per'] / anchor['server_commands_per']:.1f}×, server CPU "
                f"{r['cpu_vs_warden_wait']:.2f}×, p99 wait "
                f"{r['wait_p99'] / anchor['wait_p99']:.1f}×, most in 100 ms "
                f"{r['most_100ms'] / anchor['most_100ms']:.1f}×"
                for r in mine
                if r is not anchor
            )
            + "."
        )
        text.append("")
    waits = [r for r in rows if r["client"] == "warden-wait"]
    refused = sum(x["refused"] for r in waits for x in r["per_run"])
    text.append(
        f"warden `WAIT` requests answered limited (none expected: the wait, 10 s, is far longer "
        f"than the queue): {refused}."
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
            "rate_per_s": RATE,
            "burst": BURST,
            "callers": CALLERS,
            "seconds": SECONDS,
            "rounds": ROUNDS,
            "window_ms": WINDOW_MS,
        },
        "machine": {"cores": os.cpu_count(), "before": before, "after": after},
        "idle_server_cpu_ms": idle_ms,
        "rows": rows,
    }
    OUT.with_suffix(".json").write_text(json.dumps(doc, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
