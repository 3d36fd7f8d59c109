"""What grants the replicas acknowledged cost (`warden.sync-replicas`), side by
side in one run on one master and one replica on loopback, both with the
module loaded. Prints a markdown section and writes it, with the raw figures
as JSON, to OUT.md and OUT.json (default bench/results/sync).

    python bench/sync.py [--quick] [--out PREFIX]

WARDEN_MODULE: the module (required); WARDEN_SERVER: the server binary
(default redis-server); WARDEN_SYNC_PORT: the master's port (default 7500; the
replica takes the next one); WARDEN_BENCH_BEFORE: an older libwarden.so whose
callgrind figures (hand-off, idle tax) are counted beside this module's.

Every client is a redis-py connection sending raw commands over TCP, in
worker processes of up to 10 threads each (one thread per client up to 10
clients). The variants run in slices taken in turn, round after round, so
other work on the machine falls on all alike; `warden.sync-replicas` is set
with CONFIG SET on the master before each slice. Runs:

- uncontended (1, 10 clients, each on its own key): one acquire + release
  pair after another. Variants: `LOCK.ACQUIRE`/`LOCK.RELEASE` with
  sync-replicas 0 and 1; what users run instead for the same safety: redis-py's
  `Lock` (`SET NX PX`, a Lua release) with `WAIT 1 100` after each grant
  (Redisson's pattern), and warden with sync-replicas 0 and `WAIT 1 100` after
  each grant. The grant latency is the acquire (and its WAIT); the pair's
  adds the release. A WAIT answering 0 is counted as unacknowledged.
- the replica round trip: `PING` to the replica from one client (the same
  loopback hop a replica's acknowledgement takes), in the same rounds.
- contended (10 clients, one key): `LOCK.ACQUIRE … WAIT 10000`, `INCR`
  (the hold: ~0 ms; a second run sleeps 1 ms inside), `LOCK.RELEASE`,
  sync-replicas 1 against 0: hand-offs/s.
- GETACKs per grant (INFO warden `sync_getacks` / the grants) for every
  slice with sync-replicas 1, and 50 uncontended clients for the batching.
- server CPU per 1,000 grants: INFO cpu (user + sys) deltas of master and
  replica over each slice.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import shutil
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
    else ROOT / "bench/results/sync"
)
MODULE = os.environ.get("WARDEN_MODULE") or sys.exit("WARDEN_MODULE: the module to load")
SERVER = os.environ.get("WARDEN_SERVER", "redis-server")
PORT = int(os.environ.get("WARDEN_SYNC_PORT", "7500"))
BEFORE = os.environ.get("WARDEN_BENCH_BEFORE")

ROUNDS = 2 if QUICK else 4
SLICE = 1.0 if QUICK else 2.5
LEASE_MS = 10000
WAIT_MS = 100  # the WAIT timeout users give, and warden.sync-timeout's default


def server_name(binary: str) -> str:
    out = subprocess.run([binary, "--version"], check=False, capture_output=True, text=True).stdout
    version = next((w.split("=")[1] for w in out.split() if w.startswith("v=")), "?")
    return ("Valkey " if "valkey" in out.lower() else "Redis ") + version


class Node:
    """One server with the module on a TCP port of loopback."""

    def __init__(self, port: int, replicaof: int | None = None) -> None:
        self.port = port
        self.dir = tempfile.mkdtemp(prefix="warden-sync-")
        args = [
            SERVER,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self.dir,
            "--logfile",
            os.path.join(self.dir, "log"),
            "--loadmodule",
            MODULE,
        ]
        if replicaof:
            args += ["--replicaof", "127.0.0.1", str(replicaof)]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.r = redis.Redis(port=port, decode_responses=True)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.r.ping()
                break
            except redis.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(
                        f"{SERVER} did not start on port {port}: {self.log()}"
                    ) from None
                time.sleep(0.05)

    def log(self) -> str:
        try:
            return Path(self.dir, "log").read_text()[-2000:]
        except OSError:
            return ""

    def cpu(self) -> float:
        info = self.r.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def warden(self) -> dict[str, int]:
        info = self.r.info("warden")
        return {
            k: int(info.get(f"warden_{k}", 0))
            for k in ("sync_acked", "sync_getacks", "sync_timeouts", "grants")
        }

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


def wait_online(master: Node, replica: Node) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        link = replica.r.info("replication").get("master_link_status")
        online = master.r.info("replication").get("slave0", {})
        if link == "up" and isinstance(online, dict) and online.get("state") == "online":
            return
        time.sleep(0.05)
    raise SystemExit(f"the replica did not come online:\n{replica.log()}")


# --- what one client does, in a worker process ------------------------------------------


def client_loop(
    kind: str,
    port: int,
    replica_port: int,
    index: int,
    go: Any,
    stop_at: list[float],
    out: list[Any],
) -> None:
    r = redis.Redis(port=port)
    key = "mutex" if kind.startswith("contended") else f"k:{index}"
    hold = 0.001 if kind == "contended-1ms" else 0.0
    grants: list[float] = []
    pairs: list[float] = []
    unacked = 0
    refused = 0
    if kind == "ping-replica":
        r = redis.Redis(port=replica_port)
    lock = r.lock(f"py:{index}", timeout=LEASE_MS / 1000) if kind == "redis-py+wait" else None
    r.ping()
    go.wait()
    end = stop_at[0]
    perf = time.perf_counter
    while perf() < end:
        t0 = perf()
        if kind == "ping-replica":
            r.ping()
            grants.append(perf() - t0)
            continue
        if lock is not None:
            if not lock.acquire(blocking=False):
                refused += 1
                continue
            if r.execute_command("WAIT", 1, WAIT_MS) < 1:
                unacked += 1
            t1 = perf()
            lock.release()
        else:
            owner = uuid.uuid4().hex
            args = ["LOCK.ACQUIRE", key, owner, LEASE_MS]
            if kind.startswith("contended"):
                args += ["WAIT", 10000]
            if r.execute_command(*args) is None:
                refused += 1
                continue
            if kind == "warden+wait" and r.execute_command("WAIT", 1, WAIT_MS) < 1:
                unacked += 1
            t1 = perf()
            if kind.startswith("contended"):
                r.incr("counter")
                if hold:
                    time.sleep(hold)
            r.execute_command("LOCK.RELEASE", key, owner)
        t2 = perf()
        grants.append(t1 - t0)
        pairs.append(t2 - t0)
    out.append((grants, pairs, unacked, refused))


def process_main(
    kind: str,
    port: int,
    replica_port: int,
    first: int,
    n: int,
    go: Any,
    ready: Any,
    stop_at: Any,
    results: Any,
) -> None:
    out: list[Any] = []
    deadline = [0.0]
    go_local = threading.Event()
    threads = [
        threading.Thread(
            target=client_loop, args=(kind, port, replica_port, first + i, go_local, deadline, out)
        )
        for i in range(n)
    ]
    for t in threads:
        t.start()
    ready.put(n)
    go.wait()
    # The slice's end, in this process's perf_counter: now plus its length.
    deadline[0] = time.perf_counter() + stop_at.value
    go_local.set()
    for t in threads:
        t.join()
    grants = [g for o in out for g in o[0]]
    pairs = [p for o in out for p in o[1]]
    results.put((grants, pairs, sum(o[2] for o in out), sum(o[3] for o in out)))


def run_clients(kind: str, n: int, seconds: float, port: int, replica_port: int) -> dict[str, Any]:
    """n clients doing `kind` for `seconds`: latencies (s) and counts."""
    ctx = mp.get_context("fork")
    go = ctx.Event()
    ready = ctx.Queue()
    results = ctx.Queue()
    stop_at = ctx.Value("d", seconds)
    per = max(1, -(-n // 10))  # clients per process
    procs = []
    first = 0
    while first < n:
        k = min(per, n - first)
        p = ctx.Process(
            target=process_main,
            args=(kind, port, replica_port, first, k, go, ready, stop_at, results),
        )
        p.start()
        procs.append(p)
        first += k
    for _ in procs:
        ready.get(timeout=60)
    time.sleep(0.05)  # every thread connected and waiting
    began = time.perf_counter()
    go.set()
    grants: list[float] = []
    pairs: list[float] = []
    unacked = refused = 0
    for _ in procs:
        g, p, u, f = results.get(timeout=seconds + 120)
        grants += g
        pairs += p
        unacked += u
        refused += f
    elapsed = time.perf_counter() - began
    for p in procs:
        p.join(10)
    return {
        "grants": grants,
        "pairs": pairs,
        "unacked": unacked,
        "refused": refused,
        "elapsed": elapsed,
    }


# --- slices, rounds -----------------------------------------------------------------------


def quantile(samples: list[float], q: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


class Acc:
    """One variant's figures over every slice it ran."""

    def __init__(self) -> None:
        self.grants: list[float] = []
        self.pairs: list[float] = []
        self.ops = 0
        self.seconds = 0.0
        self.unacked = 0
        self.refused = 0
        self.cpu_master = 0.0
        self.cpu_replica = 0.0
        self.getacks = 0
        self.acked = 0
        self.timeouts = 0

    def add(self, run: dict[str, Any], cpu_m: float, cpu_r: float, w: dict[str, int]) -> None:
        self.grants += run["grants"]
        self.pairs += run["pairs"]
        self.ops += len(run["grants"])
        self.seconds += run["elapsed"]
        self.unacked += run["unacked"]
        self.refused += run["refused"]
        self.cpu_master += cpu_m
        self.cpu_replica += cpu_r
        self.getacks += w["sync_getacks"]
        self.acked += w["sync_acked"]
        self.timeouts += w["sync_timeouts"]

    def summary(self) -> dict[str, Any]:
        ms = 1000.0
        return {
            "ops": self.ops,
            "per_s": self.ops / self.seconds if self.seconds else 0.0,
            "grant_p50_ms": quantile(self.grants, 0.5) * ms,
            "grant_p99_ms": quantile(self.grants, 0.99) * ms,
            "pair_p50_ms": quantile(self.pairs, 0.5) * ms,
            "pair_p99_ms": quantile(self.pairs, 0.99) * ms,
            "unacked": self.unacked,
            "refused": self.refused,
            "cpu_master_ms_per_1000": self.cpu_master * 1e6 / max(1, self.ops),
            "cpu_replica_ms_per_1000": self.cpu_replica * 1e6 / max(1, self.ops),
            "getacks": self.getacks,
            "sync_acked": self.acked,
            "sync_timeouts": self.timeouts,
            # Over every grant of the slices (not ÷ sync_acked): under
            # sync-replicas 0 the few grants right after a switch from 1 wait
            # for the marker, and a ratio of those alone read 2.000.
            "getacks_per_grant": self.getacks / self.ops if self.ops else None,
        }


def run_slice(master: Node, replica: Node, acc: Acc, kind: str, n: int, sync: int) -> None:
    master.r.config_set("warden.sync-replicas", sync)
    master.r.delete("mutex")
    m0, r0, w0 = master.cpu(), replica.cpu(), master.warden()
    run = run_clients(kind, n, SLICE, master.port, replica.port)
    m1, r1, w1 = master.cpu(), replica.cpu(), master.warden()
    acc.add(run, m1 - m0, r1 - r0, {k: w1[k] - w0[k] for k in w0})


def busy_elsewhere() -> str:
    """What the machine is doing: load average and the busiest processes over one second (top)."""
    load = os.getloadavg()
    out = subprocess.run(
        ["top", "-b", "-n", "2", "-d", "1", "-o", "%CPU", "-w", "200"],
        check=False,
        capture_output=True,
        text=True,
    ).stdout
    rows = out.split("PID USER")[-1].splitlines()[1:6]  # the second sample: a 1 s interval
    top = ", ".join(f"{r.split()[11]} {r.split()[8]}%" for r in rows if len(r.split()) > 11)
    return f"load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}; busiest processes: {top}"


# --- callgrind: sync-replicas 0 against the module before the feature ---------------------


def instructions(warden: str, before: str | None) -> dict[str, Any]:
    """Hand-off and idle-tax instructions (bench/instructions.py's drivers) for
    this module and, if given, an older one; no replica, sync-replicas 0."""
    sys.path.insert(0, str(ROOT / "bench"))
    import instructions as ins

    builds = [("now", warden)] + ([("before", before)] if before else [])
    handoff = {label: ins.counted(SERVER, [so], ins.contention("warden")) for label, so in builds}
    handoff["BLPOP"] = ins.counted(SERVER, [warden], ins.contention("blpop"))
    quick = {"warmup": 1.0, "window": 3.0}
    tax: dict[str, dict[str, float]] = {}
    for command, make in ins.TAX_ROWS:
        tax[command] = {"no module": ins.counted(SERVER, [], ins.with_leases(0, make), **quick)}
        for label, so in builds:
            tax[command][label] = ins.counted(SERVER, [so], ins.with_leases(0, make), **quick)
        print(f"  {command}: {tax[command]}", file=sys.stderr)
    return {"handoff": handoff, "tax": tax}


# --- the report -----------------------------------------------------------------------------


def fmt(x: float | None, digits: int = 2) -> str:
    if x is None or math.isnan(x):
        return "—"
    return f"{x:,.{digits}f}"


def main() -> None:
    started = time.time()
    load_before = busy_elsewhere()
    master = Node(PORT)
    replica = Node(PORT + 1, replicaof=PORT)
    figures: dict[str, Any] = {}
    try:
        wait_online(master, replica)
        uncontended = [
            ("warden, sync-replicas 0", "warden", 0),
            ("warden, sync-replicas 1", "warden", 1),
            ("redis-py `Lock` + `WAIT 1 100`", "redis-py+wait", 0),
            ("warden, sync-replicas 0, + `WAIT 1 100`", "warden+wait", 0),
        ]
        contended = [("sync-replicas 0", "contended", 0), ("sync-replicas 1", "contended", 1)]
        contended_1ms = [
            ("sync-replicas 0", "contended-1ms", 0),
            ("sync-replicas 1", "contended-1ms", 1),
        ]
        plan: list[tuple[str, str, str, int, int]] = []  # (group, label, kind, clients, sync)
        for n in (1, 10):
            plan += [
                (f"uncontended-{n}", label, kind, n, sync) for label, kind, sync in uncontended
            ]
        plan.append(("replica-rtt", "PING to the replica", "ping-replica", 1, 0))
        plan += [("contended", label, kind, 10, sync) for label, kind, sync in contended]
        plan += [("contended-1ms", label, kind, 10, sync) for label, kind, sync in contended_1ms]
        plan += [("uncontended-50", label, kind, 50, sync) for label, kind, sync in uncontended[:2]]
        accs = {(g, label): Acc() for g, label, *_ in plan}
        loads: list[float] = []  # the 1-minute load average after each round
        for rnd in range(ROUNDS):
            for group, label, kind, n, sync in plan:
                run_slice(master, replica, accs[(group, label)], kind, n, sync)
            print(
                f"  round {rnd + 1}/{ROUNDS} done ({time.time() - started:.0f} s)", file=sys.stderr
            )
            loads.append(os.getloadavg()[0])
        for (group, label), acc in accs.items():
            figures.setdefault(group, {})[label] = acc.summary()
        master.r.config_set("warden.sync-replicas", 0)
        offset_lag = master.r.info("replication").get("slave0", {})
    finally:
        replica.stop()
        master.stop()
    load_after = busy_elsewhere()
    ins = None
    if os.environ.get("WARDEN_SYNC_CALLGRIND", "1") != "0" and shutil.which("valgrind"):
        ins = instructions(MODULE, BEFORE)
    figures["instructions"] = ins
    figures["meta"] = {
        "server": server_name(SERVER),
        "module": MODULE,
        "before": BEFORE,
        "quick": QUICK,
        "rounds": ROUNDS,
        "slice_s": SLICE,
        "load_before": load_before,
        "load_after": load_after,
        "replica": offset_lag,
        "load_per_round": loads,
        "seconds": time.time() - started,
        "cores": os.cpu_count(),
    }
    report = render(figures)
    print(report)
    OUT.with_suffix(".md").write_text(report)
    OUT.with_suffix(".json").write_text(json.dumps(figures, indent=1, default=str) + "\n")


def render(f: dict[str, Any]) -> str:
    meta = f["meta"]
    rtt = f["replica-rtt"]["PING to the replica"]
    lines = [
        "## Grants the replicas acknowledged: what `warden.sync-replicas 1` costs",
        "",
        (
            f"Server: {meta['server']}, one master and one replica on loopback, the module on both "
            f"({meta['module']}). {meta['rounds']} rounds of {meta['slice_s']:g} s slices taken in "
            f"turn; {meta['cores']} cores shared with other work. Before the run: "
            f"{meta['load_before']}. Load average after each round: "
            f"{', '.join(f'{x:.1f}' for x in meta['load_per_round'])}. After: {meta['load_after']}."
        ),
        "",
        (
            "Clients: redis-py raw commands over TCP (`LOCK.ACQUIRE key owner 10000`, "
            "`LOCK.RELEASE`), redis-py's own `Lock` for `SET NX PX`; one thread per client in up "
            "to 10 processes. The grant is the acquire (with its `WAIT`); the pair adds the "
            "release. Replica round trip (`PING` to the replica, one client): p50 "
            f"{fmt(rtt['grant_p50_ms'], 3)} ms, p99 {fmt(rtt['grant_p99_ms'], 3)} ms."
        ),
        "",
    ]
    for n in (1, 10):
        rows = f[f"uncontended-{n}"]
        lines += [
            f"**Uncontended, {n} client{'s' if n > 1 else ''}** (each on its own key):",
            "",
            (
                "| variant | pairs/s | grant p50 ms | grant p99 ms | pair p50 ms | pair p99 ms "
                "| not acknowledged | GETACKs / grant | master CPU ms / 1,000 "
                "| replica CPU ms / 1,000 |"
            ),
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for label, s in rows.items():
            lines.append(
                f"| {label} | {fmt(s['per_s'], 0)} | {fmt(s['grant_p50_ms'], 3)} "
                f"| {fmt(s['grant_p99_ms'], 3)} | {fmt(s['pair_p50_ms'], 3)} "
                f"| {fmt(s['pair_p99_ms'], 3)} "
                f"| {s['unacked'] + s['refused'] + s['sync_timeouts']} "
                f"| {fmt(s['getacks_per_grant'], 3)} | {fmt(s['cpu_master_ms_per_1000'], 1)} "
                f"| {fmt(s['cpu_replica_ms_per_1000'], 1)} |"
            )
        s0, s1 = rows["warden, sync-replicas 0"], rows["warden, sync-replicas 1"]
        add50 = s1["grant_p50_ms"] - s0["grant_p50_ms"]
        add99 = s1["grant_p99_ms"] - s0["grant_p99_ms"]
        bound50 = rtt["grant_p50_ms"] + 1.0
        bound99 = rtt["grant_p99_ms"] + 1.0
        met = add50 <= bound50 and add99 <= bound99
        cpu_met = s1["cpu_master_ms_per_1000"] <= 1.5 * s0["cpu_master_ms_per_1000"]
        lines += [
            "",
            (
                f"sync-replicas 1 adds {fmt(add50, 3)} ms to the grant's p50, {fmt(add99, 3)} ms "
                f"to its p99 (target: ≤ one replica round trip + 1 ms = {fmt(bound50, 3)} / "
                f"{fmt(bound99, 3)} ms: {'met' if met else 'MISSED'}); master CPU per pair "
                f"{fmt(s1['cpu_master_ms_per_1000'] / s0['cpu_master_ms_per_1000'])}×"
                + (
                    f" (target for one client ≤ 1.5×: {'met' if cpu_met else 'MISSED'})"
                    if n == 1
                    else ""
                )
                + ", replica's "
                f"{fmt(s1['cpu_replica_ms_per_1000'] / s0['cpu_replica_ms_per_1000'])}×."
            ),
            "",
        ]
        f[f"uncontended-{n}"]["_target"] = {
            "added_p50_ms": add50,
            "added_p99_ms": add99,
            "bound_p50_ms": bound50,
            "bound_p99_ms": bound99,
            "met": met,
        }
    for group, hold in (
        ("contended", "~0 ms: one `INCR`"),
        ("contended-1ms", "1 ms: `INCR` and a 1 ms sleep"),
    ):
        rows = f[group]
        s0, s1 = rows["sync-replicas 0"], rows["sync-replicas 1"]
        ratio = s1["per_s"] / s0["per_s"] if s0["per_s"] else float("nan")
        lines += [
            (
                f"**Contended: 10 clients on one key**, `LOCK.ACQUIRE … WAIT 10000`, held {hold}, "
                "`LOCK.RELEASE`:"
            ),
            "",
            (
                "| sync-replicas | hand-offs/s | wait p50 ms | wait p99 ms | GETACKs / grant "
                "| master CPU ms / 1,000 | replica CPU ms / 1,000 | timeouts |"
            ),
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for label, s in rows.items():
            lines.append(
                f"| {label.split()[-1]} | {fmt(s['per_s'], 0)} | {fmt(s['grant_p50_ms'], 3)} "
                f"| {fmt(s['grant_p99_ms'], 3)} | {fmt(s['getacks_per_grant'], 3)} "
                f"| {fmt(s['cpu_master_ms_per_1000'], 1)} | {fmt(s['cpu_replica_ms_per_1000'], 1)} "
                f"| {s['sync_timeouts']} |"
            )
        lines += [
            "",
            (
                f"sync 1 ÷ sync 0: {fmt(ratio)}× the hand-offs/s (target ≥ 0.9×: "
                f"{'met' if ratio >= 0.9 else 'MISSED'}); master CPU per hand-off "
                f"{fmt(s1['cpu_master_ms_per_1000'] / s0['cpu_master_ms_per_1000'])}×."
            ),
            "",
        ]
        rows["_ratio"] = ratio
    lines += [
        (
            "**Batching: GETACKs per acknowledged grant** (sync-replicas 1; `INFO warden` "
            "`sync_getacks` ÷ the grants over the slices):"
        ),
        "",
        "| clients | workload | grants/s | GETACKs / grant |",
        "|---:|---|---:|---:|",
    ]
    for n in (1, 10, 50):
        s = f[f"uncontended-{n}"]["warden, sync-replicas 1"]
        lines.append(
            f"| {n} | uncontended, own keys | {fmt(s['per_s'], 0)} "
            f"| {fmt(s['getacks_per_grant'], 3)} |"
        )
    s = f["contended"]["sync-replicas 1"]
    lines.append(
        f"| 10 | contended, one key | {fmt(s['per_s'], 0)} | {fmt(s['getacks_per_grant'], 3)} |"
    )
    ins = f.get("instructions")
    if ins:
        h = ins["handoff"]
        lines += [
            "",
            "**sync-replicas 0: unchanged?** Server instructions (callgrind, serverCron left out; "
            "bench/instructions.py's drivers, no replica), this module"
            + (" against the one before `warden.sync-replicas`" if "before" in h else "")
            + ":",
            "",
        ]
        cols = ["now"] + (["before"] if "before" in h else [])
        lines += [
            "| operation | " + " | ".join(cols) + (" | now ÷ before |" if "before" in h else " |"),
            "|---|" + "---:|" * (len(cols) + (1 if "before" in h else 0)),
        ]

        def row(name: str, vals: dict[str, float]) -> str:
            cells = " | ".join(f"{vals[c]:,.0f}" for c in cols)
            ratio = f" | {vals['now'] / vals['before']:.3f}×" if "before" in vals else ""
            return f"| {name} | {cells}{ratio} |"

        lines.append(row(f"hand-off, 10 clients (`BLPOP` token: {h['BLPOP']:,.0f})", h))
        for command, vals in ins["tax"].items():
            lines.append(row(f"`{command}` (no module: {vals['no module']:,.0f})", vals))
    lines += ["", f"Run took {meta['seconds']:.0f} s{' (QUICK)' if meta['quick'] else ''}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
