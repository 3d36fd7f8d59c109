#!/usr/bin/env python3
"""Server instructions per operation, counted by callgrind: a figure a busy
machine does not move. Each workload runs against a redis-server under
`valgrind --tool=callgrind` with instrumentation off; the same driver warms
up, switches counting on for a window, and divides the server's instructions
by the operations done in it.

  hand-off       10 clients contending: LOCK.ACQUIRE … WAIT 0 / INCR /
                 LOCK.RELEASE, against Redis' own blocking hand-off
                 BLPOP token / INCR / RPUSH (per hand-off)
  tracking       the same hand-off with warden.latency-tracking on and off
                 (the cost of the wait and hold histograms)
  lock.acquire   LOCK.ACQUIRE on fresh keys, against SET key owner NX PX
  locks          LOCK.ACQUIRE + LOCK.RELEASE on fresh keys, one client
                 (per pair), against SET NX PX + the safe-release Lua
                 script (bench/lua/safe_release.lua) and against SET NX PX +
                 the server's own compare-and-delete (Valkey 9.0+ DELIFEQ,
                 Redis 8.4+ DELEX IFEQ) where the server has one
  semaphore      SEM.ACQUIRE … LIMIT 5 + SEM.RELEASE, one client, uncontended
                 (per pair), against the Redisson-style Lua semaphore and the
                 sorted set of npm redis-semaphore (bench/lua/, the scripts
                 of make bench SECTION=semaphore)
  bf.add         BF.ADD of new items, warden against RedisBloom
  bf.exists      BF.EXISTS of present items, warden against RedisBloom
  tax            what loading warden costs other commands: SET, INCR, GET,
                 DEL with no module, with warden, and with warden while 1,000
                 cache leases are open on other keys; a CACHE.GET hit against
                 GET — on each server given (Redis 7.0 and 8.2 in make bench)
  targets        the two ratios the SPEC holds warden to, on each server
                 given: a CACHE.GET hit against GET, the lock hand-off
                 against BLPOP's
  filter         what the cache's command filter costs other clients'
                 commands (requirepass set): a transaction on other keys
                 with one lease open against none, an unauthenticated DEL
                 of a leased key and an unauthenticated EXEC against a DEL
                 of another key, an invalidating DEL with 100,000 leases
                 open against a DEL of a free key; then PING's p99 while an
                 unauthenticated connection pipelines refused DELs of a
                 leased key. WARDEN_BENCH_BEFORE=<older libwarden.so> adds
                 its figures beside.

serverCron's work is left out of every figure: it is done per second, not
per operation, so its share per operation grows with a loaded machine (a
slower run does fewer operations a second). WARDEN_BENCH_ONLY=tax,
=targets, =filter or =locks runs that section alone.

Usage: instructions.py WARDEN.so REDISBLOOM.so [SERVER [SERVER ...]]
Prints markdown tables. WARDEN_BENCH_ONLY=semaphore prints the semaphore
rows alone; WARDEN_BENCH_ONLY=tax the tax tables alone.
"""

import glob
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time


def enc(*words):
    words = [w if isinstance(w, bytes) else str(w).encode() for w in words]
    return b"*%d\r\n" % len(words) + b"".join(b"$%d\r\n%s\r\n" % (len(w), w) for w in words)


def free_port():
    """WARDEN_BENCH_PORT where given (servers here run one at a time), else a
    free port."""
    if os.environ.get("WARDEN_BENCH_PORT"):
        return int(os.environ["WARDEN_BENCH_PORT"])
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return port


class Conn:
    def __init__(self, port):
        for _ in range(600):
            try:
                self.s = socket.create_connection(("127.0.0.1", port))
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise SystemExit("the server did not start")
        self.buf = b""

    def line(self):
        while b"\r\n" not in self.buf:
            chunk = self.s.recv(65536)
            if not chunk:
                raise EOFError
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def reply(self):
        line = self.line()
        if line[:1] == b"$" and int(line[1:]) >= 0:
            n = int(line[1:])
            while len(self.buf) < n + 2:
                self.buf += self.s.recv(65536)
            value, self.buf = self.buf[:n], self.buf[n + 2 :]
            return value
        if line[:1] == b"*" and int(line[1:]) > 0:
            return [self.reply() for _ in range(int(line[1:]))]
        if line[:1] == b":":
            return int(line[1:])
        return line

    def call(self, *words):
        self.s.sendall(enc(*words))
        return self.reply()


def counted(server, modules, workload, warmup=2.0, window=5.0, extra=()):
    """Runs `workload(port, stop_event, ops_counter)` under callgrind; returns
    server instructions per operation in the counting window."""
    work = tempfile.mkdtemp(prefix="warden-cg-")
    port = free_port()
    args = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={work}/cg.%p",
        server,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--logfile",
        f"{work}/log",
    ]
    for m in modules:
        args += ["--loadmodule", m]
    args += list(extra)
    vg = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ops = [0]
        stop = threading.Event()
        Conn(port).call("PING")
        driver = threading.Thread(target=workload, args=(port, stop, ops), daemon=True)
        driver.start()
        # A workload that prepares much (100,000 leases) says when it is ready.
        ready = getattr(workload, "ready", None)
        if ready is not None:
            ready.wait(600)
        time.sleep(warmup)
        subprocess.run(
            ["callgrind_control", "-i", "on", str(vg.pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
        )
        start = ops[0]
        time.sleep(window)
        end = ops[0]
        subprocess.run(
            ["callgrind_control", "-d", str(vg.pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
        )
        subprocess.run(
            ["callgrind_control", "-i", "off", str(vg.pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
        )
        stop.set()
        driver.join(30)
        total = 0
        for path in glob.glob(f"{work}/cg.*"):
            with open(path) as f:
                for line in f:
                    if line.startswith("totals:") or line.startswith("summary:"):
                        total += int(line.split()[1])
                        break
            total -= cron_instructions(path)
        n = end - start
        if n <= 0:
            raise SystemExit(f"no operations counted in {workload.__name__}")
        return total / n
    finally:
        try:
            admin = Conn(port)
            if "--requirepass" in extra:
                admin.call("AUTH", extra[list(extra).index("--requirepass") + 1])
            admin.call("SHUTDOWN", "NOSAVE")
        except (OSError, EOFError):
            pass
        try:
            vg.wait(60)
        except subprocess.TimeoutExpired:
            vg.kill()
        shutil.rmtree(work, ignore_errors=True)


def cron_instructions(path):
    """serverCron's inclusive instructions in one callgrind dump."""
    out = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", path],
        capture_output=True,
        text=True,
    ).stdout
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+) .*:serverCron(\.[\w.]+)? ", line)
        if m:
            return int(m.group(1).replace(",", ""))
    return 0


def contention(kind):
    def workload(port, stop, ops):
        if kind == "blpop":
            Conn(port).call("RPUSH", "token", "t")

        def client(i):
            c = Conn(port)
            steps = (
                [
                    ("LOCK.ACQUIRE", "mutex", f"c{i}", 10000, "WAIT", 0),
                    ("INCR", "counter"),
                    ("LOCK.RELEASE", "mutex", f"c{i}"),
                ]
                if kind == "warden"
                else [("BLPOP", "token", 0), ("INCR", "counter"), ("RPUSH", "token", "t")]
            )
            while not stop.is_set():
                for step in steps:
                    c.call(*step)
                ops[0] += 1

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    workload.__name__ = f"hand-off ({kind})"
    return workload


def pipelined(make_command, batch=100):
    """One client, `batch` commands a round trip: the server's own cost per
    command dominates."""

    def workload(port, stop, ops):
        c = Conn(port)
        i = 0
        while not stop.is_set():
            payload = b"".join(enc(*make_command(i + j)) for j in range(batch))
            c.s.sendall(payload)
            for _ in range(batch):
                c.reply()
            i += batch
            ops[0] += batch

    return workload


def preload_then(prepare, make_command):
    def workload(port, stop, ops):
        prepare(Conn(port))
        pipelined(make_command)(port, stop, ops)

    return workload


def with_leases(n, make_command):
    """`make_command` pipelined while another connection holds `n` cache
    leases on other keys (a lease ends with its holder's connection)."""

    def workload(port, stop, ops):
        holder = Conn(port)
        if n:
            holder.s.sendall(b"".join(enc("CACHE.GET", f"lease:{i}", 600000) for i in range(n)))
            for _ in range(n):
                holder.reply()
        c = Conn(port)
        c.call("SET", "hot", "v" * 100)
        pipelined(make_command)(port, stop, ops)
        holder.s.close()

    return workload


TAX_ROWS = [
    ("SET", lambda i: ("SET", f"k{i % 1000}", "vvvvvvvvvv")),
    ("INCR", lambda i: ("INCR", "counter")),
    ("GET", lambda i: ("GET", "hot")),
    ("DEL", lambda i: ("DEL", f"d{i % 1000}")),
]


def server_name(server):
    out = subprocess.run([server, "--version"], capture_output=True, text=True).stdout
    version = next((w.split("=")[1] for w in out.split() if w.startswith("v=")), "?")
    return ("Valkey " if "valkey" in out.lower() else "Redis ") + version


def tax(servers, warden):
    """What loading warden costs the server's other commands (SPEC: within
    3 %, also while leases exist; a cache hit within 10 % of GET)."""
    quick = dict(warmup=1.0, window=3.0)
    print("\n## What loading warden costs other commands (callgrind)\n")
    print("Server instructions per command, one client, pipelines of 100; the same")
    print("binary with no module, with warden loaded, and with warden while another")
    print("connection holds 1,000 cache leases on other keys.\n")
    print("| server | command | no module | warden | ratio | warden + 1,000 leases | ratio |")
    print("|---|---|---:|---:|---:|---:|---:|")
    hits = []
    for server in servers:
        name = server_name(server)
        for command, make in TAX_ROWS:
            bare = counted(server, [], with_leases(0, make), **quick)
            loaded = counted(server, [warden], with_leases(0, make), **quick)
            leased = counted(server, [warden], with_leases(1000, make), **quick)
            print(
                f"| {name} | `{command}` | {bare:,.0f} | {loaded:,.0f} | {loaded / bare:.3f}× "
                f"| {leased:,.0f} | {leased / bare:.3f}× |"
            )
            print(f"  {name} {command}: {bare:,.0f} {loaded:,.0f} {leased:,.0f}", file=sys.stderr)
        for n in (0, 1000):
            get = counted(server, [warden], with_leases(n, lambda i: ("GET", "hot")), **quick)
            hit = counted(
                server, [warden], with_leases(n, lambda i: ("CACHE.GET", "hot", 1000)), **quick
            )
            hits.append((name, n, hit, get))
    print("\n| server | leases open | `CACHE.GET` hit | `GET` | ratio |")
    print("|---|---:|---:|---:|---:|")
    for name, n, hit, get in hits:
        print(f"| {name} | {n:,} | {hit:,.0f} | {get:,.0f} | {hit / get:.3f}× |")


LUA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lua")
NO_LEASE = "922337203685477"


def semaphore_pairs(kind, batch=50):
    """One client acquiring and releasing one permit of a semaphore of limit
    5, `batch` pairs a round trip; an operation is one pair."""

    def workload(port, stop, ops):
        c = Conn(port)
        sha = {}
        for name in (
            "redisson_semaphore_acquire",
            "redisson_semaphore_release",
            "sorted_set_semaphore_acquire",
        ):
            with open(os.path.join(LUA, name + ".lua")) as f:
                sha[name] = c.call("SCRIPT", "LOAD", f.read())
        if kind == "redisson":
            c.call("SET", "rsem", 5)  # Redisson's trySetPermits(5)
        i = 0
        while not stop.is_set():
            now = int(time.time() * 1000)
            commands = []
            for j in range(i, i + batch):
                if kind == "warden":
                    commands += [
                        ("SEM.ACQUIRE", "sem", f"o{j}", 10000, "LIMIT", 5),
                        ("SEM.RELEASE", "sem", f"o{j}"),
                    ]
                elif kind == "redisson":
                    commands += [
                        (
                            "EVALSHA",
                            sha["redisson_semaphore_acquire"],
                            3,
                            "rsem",
                            "{rsem}:timeout",
                            "redisson_sc:{rsem}",
                            1,
                            now + 10000,
                            now,
                            NO_LEASE,
                            f"id{j}",
                        ),
                        (
                            "EVALSHA",
                            sha["redisson_semaphore_release"],
                            3,
                            "rsem",
                            "redisson_sc:{rsem}",
                            "{rsem}:timeout",
                            f"id{j}",
                            1,
                            now,
                        ),
                    ]
                else:
                    commands += [
                        (
                            "EVALSHA",
                            sha["sorted_set_semaphore_acquire"],
                            1,
                            "ssem",
                            5,
                            f"id{j}",
                            10000,
                            now,
                        ),
                        ("ZREM", "ssem", f"id{j}"),
                    ]
            c.s.sendall(b"".join(enc(*w) for w in commands))
            for _ in commands:
                reply = c.reply()
                if isinstance(reply, bytes) and reply.startswith(b"-"):
                    raise SystemExit(f"{kind}: {reply.decode()}")
            i += batch
            ops[0] += batch

    workload.__name__ = f"semaphore ({kind})"
    return workload


def semaphore_rows(server, warden):
    """SEM.ACQUIRE + SEM.RELEASE against the two Lua semaphores: (name, ours,
    theirs, baseline) rows."""
    ours = counted(server, [warden], semaphore_pairs("warden"))
    name = "SEM.ACQUIRE + SEM.RELEASE (limit 5, one client, uncontended)"
    return [
        (
            name,
            ours,
            counted(server, [warden], semaphore_pairs("redisson")),
            "Redisson-style Lua semaphore (acquire script + release script)",
        ),
        (
            name,
            ours,
            counted(server, [warden], semaphore_pairs("sorted_set")),
            "redis-semaphore sorted set (acquire script + ZREM)",
        ),
    ]


NO_COMPARE_AND_DELETE = "not on this server: DELIFEQ is Valkey 9.0+, DELEX IFEQ Redis 8.4+"


def compare_and_delete(server):
    """The server's own compare-and-delete as the words before key and token
    (DELIFEQ key token, DELEX key IFEQ token), or None: asked of the server
    run without valgrind."""
    work = tempfile.mkdtemp(prefix="warden-cad-")
    port = free_port()
    srv = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", work],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        c = Conn(port)
        delifeq, delex = c.call("COMMAND", "INFO", "DELIFEQ", "DELEX")
        try:
            c.call("SHUTDOWN", "NOSAVE")
        except (OSError, EOFError):
            pass
    finally:
        srv.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    # An unknown name's entry is a nil array (`*-1`), a known one its description.
    if isinstance(delifeq, list):
        return "DELIFEQ"
    if isinstance(delex, list):
        return "DELEX IFEQ"
    return None


def lock_pairs(kind, batch=50):
    """One client taking and releasing a lock on a fresh key, `batch` pairs
    a round trip; an operation is one pair. `kind`: "warden", "lua" (SET NX
    PX + the safe-release script), or the compare-and-delete's name."""

    def workload(port, stop, ops):
        c = Conn(port)
        with open(os.path.join(LUA, "safe_release.lua")) as f:
            sha = c.call("SCRIPT", "LOAD", f.read())
        i = 0
        while not stop.is_set():
            commands = []
            for j in range(i, i + batch):
                key = f"lock:{j}"
                if kind == "warden":
                    commands += [
                        ("LOCK.ACQUIRE", key, "owner-1", 30000),
                        ("LOCK.RELEASE", key, "owner-1"),
                    ]
                else:
                    acquire = ("SET", key, "owner-1", "NX", "PX", 30000)
                    if kind == "lua":
                        commands += [acquire, ("EVALSHA", sha, 1, key, "owner-1")]
                    elif kind == "DELIFEQ":
                        commands += [acquire, ("DELIFEQ", key, "owner-1")]
                    else:
                        commands += [acquire, ("DELEX", key, "IFEQ", "owner-1")]
            c.s.sendall(b"".join(enc(*w) for w in commands))
            for _ in range(batch):
                c.reply()
                if c.reply() != 1:
                    raise SystemExit(f"{kind}: a release did not delete its key")
            i += batch
            ops[0] += batch

    workload.__name__ = f"lock pair ({kind})"
    return workload


def lock_rows(server, warden):
    """LOCK.ACQUIRE + LOCK.RELEASE against SET NX PX + the Lua release and
    against SET NX PX + the server's compare-and-delete: printed, with the
    row the server cannot measure saying why."""
    cad = compare_and_delete(server)
    ours = counted(server, [warden], lock_pairs("warden"))
    lua = counted(server, [warden], lock_pairs("lua"))
    name = "LOCK.ACQUIRE + LOCK.RELEASE (fresh keys, one client, pipelines of 50 pairs)"
    print(
        "## Lock acquire + release: server instructions per pair (callgrind, "
        f"{server_name(server)})\n"
    )
    print("Counted with `valgrind --tool=callgrind` on the server over a fixed window;")
    print("serverCron's per-second work left out.\n")
    print_rows([(name, ours, lua, "SET NX PX + safe-release Lua (`EVALSHA`)")])
    if cad is None:
        print(
            f"| {name} | {ours:,.0f} | SET NX PX + DELIFEQ / DELEX IFEQ | {NO_COMPARE_AND_DELETE} "
            "| — |"
        )
    else:
        theirs = counted(server, [warden], lock_pairs(cad))
        print(
            f"| {name} | {ours:,.0f} | SET NX PX + {cad} | {theirs:,.0f} | {ours / theirs:.2f}× |"
        )


def print_rows(rows):
    print("| operation | warden | baseline | baseline instructions | ratio |")
    print("|---|---:|---|---:|---:|")
    for name, ours, theirs, baseline in rows:
        print(f"| {name} | {ours:,.0f} | {baseline} | {theirs:,.0f} | {ours / theirs:.2f}× |")


def targets(servers, warden):
    """SPEC: a CACHE.GET hit within 1.10x of GET, a lock hand-off within
    1.0x of BLPOP's (both on a server with warden loaded)."""
    quick = dict(warmup=1.0, window=3.0)
    rows = []
    for server in servers:
        name = server_name(server)
        hit = counted(
            server, [warden], with_leases(0, lambda i: ("CACHE.GET", "hot", 1000)), **quick
        )
        get = counted(server, [warden], with_leases(0, lambda i: ("GET", "hot")), **quick)
        rows.append((name, "`CACHE.GET` hit", hit, "`GET`", get))
        ours = counted(server, [warden], contention("warden"))
        blpop = counted(server, [warden], contention("blpop"))
        rows.append((name, "lock hand-off, 10 clients", ours, "`BLPOP` token", blpop))
        print(
            f"  {name}: hit {hit:,.0f} GET {get:,.0f}; hand-off {ours:,.0f} BLPOP {blpop:,.0f}",
            file=sys.stderr,
        )
    print("\n## The SPEC's targets (callgrind, serverCron left out)\n")
    print("| server | warden | instructions | against | instructions | ratio |")
    print("|---|---|---:|---|---:|---:|")
    for name, what, ours, baseline, theirs in rows:
        print(
            f"| {name} | {what} | {ours:,.0f} | {baseline} | {theirs:,.0f} | {ours / theirs:.3f}× |"
        )


PASSWORD = "bench-secret"


def leases_then(n, batch, make_command, password=None):
    """`make_command` sent `batch` to a round trip by a connection that does
    not authenticate, while an authenticated one holds `n` cache leases on
    `lease:<i>` (and on `lone`); the other commands of `make_command` are
    counted per command."""

    def workload(port, stop, ops):
        holder = Conn(port)
        if password:
            holder.call("AUTH", password)
        holder.call("CACHE.GET", "lone", 600000)
        for start in range(0, n, 1000):
            holder.s.sendall(
                b"".join(
                    enc("CACHE.GET", f"lease:{i}", 600000)
                    for i in range(start, min(n, start + 1000))
                )
            )
            for _ in range(start, min(n, start + 1000)):
                holder.reply()
        workload.ready.set()
        c = Conn(port)
        i = 0
        while not stop.is_set():
            c.s.sendall(b"".join(enc(*make_command(i + j)) for j in range(batch)))
            for _ in range(batch):
                c.reply()
            i += batch
            ops[0] += batch
        holder.s.close()

    workload.ready = threading.Event()
    return workload


def authenticated(password, make_command):
    """`make_command`, each preceded in its round trip by nothing: the
    connection authenticates once (its first command)."""
    first = [True]

    def make(i):
        if first[0]:
            first[0] = False
            return ("AUTH", password)
        return make_command(i)

    return make


def transaction(key_base):
    """MULTI, SET, INCR, EXEC: one operation is one of the four commands."""
    steps = (("MULTI",), ("SET", f"{key_base}x", "1"), ("INCR", f"{key_base}y"), ("EXEC",))
    return lambda i: steps[i % 4]


def filter_costs(servers, warden, before=None):
    """What the cache's command filter costs other clients' commands: a
    transaction on keys without leases, with one lease open against none;
    an unauthenticated DEL of a leased key against one of a key without a
    lease, and an unauthenticated EXEC; an invalidating DEL with 100,000
    leases open against a DEL of a key without a lease. With `before` (an
    older build of the module), its figures beside."""
    quick = dict(warmup=1.5, window=3.0)
    builds = [("now", warden)] + ([("before", before)] if before else [])
    print("\n## What the cache's command filter costs (callgrind, serverCron left out)\n")
    print("Server instructions per command; `requirepass` set; the rows' ratios are")
    print("against the same command naming no leased key, in the same build.\n")
    print("| server | build | command | instructions | against | instructions | ratio |")
    print("|---|---|---|---:|---|---:|---:|")
    auth = ["--requirepass", PASSWORD]
    for server in servers:
        name = server_name(server)
        for label, module in builds:
            rows = []
            tx_none = counted(
                server,
                [module],
                pipelined(authenticated(PASSWORD, transaction("t")), batch=4),
                extra=auth,
                **quick,
            )
            tx_one = counted(
                server,
                [module],
                leases_then(0, 4, authenticated(PASSWORD, transaction("t")), PASSWORD),
                extra=auth,
                **quick,
            )
            rows.append(
                ("`MULTI SET INCR EXEC` on other keys, one lease open", tx_one, "no lease", tx_none)
            )
            plain = counted(
                server,
                [module],
                leases_then(0, 1, lambda i: ("DEL", "other"), PASSWORD),
                extra=auth,
                **quick,
            )
            leased = counted(
                server,
                [module],
                leases_then(0, 1, lambda i: ("DEL", "lone"), PASSWORD),
                extra=auth,
                **quick,
            )
            execs = counted(
                server,
                [module],
                leases_then(0, 1, lambda i: ("EXEC",), PASSWORD),
                extra=auth,
                **quick,
            )
            rows.append(("unauthenticated `DEL` of a leased key", leased, "of another key", plain))
            rows.append(
                ("unauthenticated `EXEC`, a lease open", execs, "`DEL` of another key", plain)
            )
            unleased = counted(
                server,
                [module],
                leases_then(
                    100_000, 10, authenticated(PASSWORD, lambda i: ("DEL", f"free:{i}")), PASSWORD
                ),
                extra=auth,
                warmup=0.5,
                window=2.0,
            )
            invalidating = counted(
                server,
                [module],
                leases_then(
                    100_000, 10, authenticated(PASSWORD, lambda i: ("DEL", f"lease:{i}")), PASSWORD
                ),
                extra=auth,
                warmup=0.5,
                window=2.0,
            )
            rows.append(
                (
                    "invalidating `DEL`, 100,000 leases open",
                    invalidating,
                    "`DEL` of a free key",
                    unleased,
                )
            )
            for what, ours, against, theirs in rows:
                print(
                    f"| {name} | {label} | {what} | {ours:,.0f} | {against} | {theirs:,.0f} "
                    f"| {ours / theirs:.2f}× |"
                )
                print(f"  {name} {label} {what}: {ours:,.0f} / {theirs:,.0f}", file=sys.stderr)
    ping_p99(servers, warden)


def ping_p99(servers, warden):
    """PING's 99th percentile (no valgrind) while one unauthenticated
    connection pipelines refused DELs of a leased key, 100 a round trip."""
    print(
        "\n| server | `PING` p50 | p99 "
        "| max (ms), one unauthenticated connection pipelining refused `DEL`s of a leased key |"
    )
    print("|---|---:|---:|---:|")
    for server in servers:
        work = tempfile.mkdtemp(prefix="warden-ping-")
        port = free_port()
        srv = subprocess.Popen(
            [
                server,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--dir",
                work,
                "--requirepass",
                PASSWORD,
                "--loadmodule",
                warden,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            holder = Conn(port)
            holder.call("AUTH", PASSWORD)
            holder.call("CACHE.GET", "lone", 600000)
            stop = threading.Event()

            def attack(port=port, stop=stop):
                a = Conn(port)
                payload = b"".join(enc("DEL", "lone") for _ in range(100))
                while not stop.is_set():
                    a.s.sendall(payload)
                    for _ in range(100):
                        a.reply()

            t = threading.Thread(target=attack, daemon=True)
            t.start()
            c = Conn(port)
            c.call("AUTH", PASSWORD)
            samples = []
            end = time.monotonic() + 3.0
            while time.monotonic() < end:
                t0 = time.perf_counter()
                c.call("PING")
                samples.append((time.perf_counter() - t0) * 1000)
            stop.set()
            t.join(5)
            samples.sort()
            p50 = samples[len(samples) // 2]
            p99 = samples[int(len(samples) * 0.99)]
            print(f"| {server_name(server)} | {p50:.2f} | {p99:.2f} | {samples[-1]:.2f} |")
        finally:
            srv.kill()
            srv.wait()
            shutil.rmtree(work, ignore_errors=True)


def reserve_and_fill(c):
    c.call("BF.RESERVE", "bf", "0.01", 10_000_000)
    for start in range(0, 100_000, 1000):
        c.s.sendall(b"".join(enc("BF.ADD", "bf", f"item-{i}") for i in range(start, start + 1000)))
        for _ in range(1000):
            c.reply()


def main():
    warden, redisbloom = sys.argv[1], sys.argv[2]
    servers = sys.argv[3:] or ["redis-server"]
    server = servers[0]
    if not shutil.which("valgrind"):
        raise SystemExit("valgrind is missing: make bench installs it")
    if os.environ.get("WARDEN_BENCH_ONLY") == "tax":
        tax(servers, warden)
        return
    if os.environ.get("WARDEN_BENCH_ONLY") == "semaphore":
        rows = semaphore_rows(server, warden)
        print("## Semaphore acquire + release: server instructions (callgrind)\n")
        print("Counted with `valgrind --tool=callgrind` on the server over a fixed window; one")
        print("client, pipelines of 50 pairs, each pair acquiring and releasing one permit.\n")
        print_rows(rows)
        ratio = rows[0][1] / rows[0][2]
        print(
            f"\nTarget: at most 1/3 of the Redisson-style semaphore's instructions: "
            f"{ratio:.2f}× — {'met' if ratio <= 1 / 3 else 'MISSED'}."
        )
        return
    if os.environ.get("WARDEN_BENCH_ONLY") == "locks":
        lock_rows(server, warden)
        return
    if os.environ.get("WARDEN_BENCH_ONLY") == "targets":
        targets(servers, warden)
        return
    if os.environ.get("WARDEN_BENCH_ONLY") == "filter":
        filter_costs(servers, warden, os.environ.get("WARDEN_BENCH_BEFORE"))
        return
    rows = []

    def row(name, ours, theirs, baseline):
        rows.append((name, ours, theirs, baseline))
        print(
            f"  {name}: warden {ours:,.0f}  {baseline} {theirs:,.0f}  ratio {ours / theirs:.2f}",
            file=sys.stderr,
        )

    row(
        "hand-off (10 clients contending)",
        counted(server, [warden], contention("warden")),
        counted(server, [warden], contention("blpop")),
        "BLPOP token",
    )
    # The cost of the wait and hold histograms: the same hand-off with
    # warden.latency-tracking on (the default) and off.
    row(
        "hand-off, latency tracking on vs off",
        counted(server, [warden], contention("warden")),
        counted(server, [warden], contention("warden"), extra=["--warden.latency-tracking", "no"]),
        "tracking off",
    )
    row(
        "LOCK.ACQUIRE of a free key",
        counted(server, [warden], pipelined(lambda i: ("LOCK.ACQUIRE", f"k{i}", "owner", 600000))),
        counted(
            server, [warden], pipelined(lambda i: ("SET", f"k{i}", "owner", "NX", "PX", 600000))
        ),
        "SET NX PX",
    )
    for r in semaphore_rows(server, warden):
        row(*r)
    reserve = lambda c: c.call("BF.RESERVE", "bf", "0.01", 10_000_000)  # noqa: E731
    row(
        "BF.ADD of a new item",
        counted(server, [warden], preload_then(reserve, lambda i: ("BF.ADD", "bf", f"new-{i}"))),
        counted(
            server, [redisbloom], preload_then(reserve, lambda i: ("BF.ADD", "bf", f"new-{i}"))
        ),
        "RedisBloom",
    )
    row(
        "BF.EXISTS of a present item",
        counted(
            server,
            [warden],
            preload_then(reserve_and_fill, lambda i: ("BF.EXISTS", "bf", f"item-{i % 100_000}")),
        ),
        counted(
            server,
            [redisbloom],
            preload_then(reserve_and_fill, lambda i: ("BF.EXISTS", "bf", f"item-{i % 100_000}")),
        ),
        "RedisBloom",
    )
    print("## Server instructions per operation (callgrind)\n")
    print("Counted with `valgrind --tool=callgrind` on the server over a fixed window; the")
    print("same driver for both sides; serverCron's per-second work left out.\n")
    print_rows(rows)
    targets(servers, warden)
    tax(servers, warden)
    filter_costs(servers, warden, os.environ.get("WARDEN_BENCH_BEFORE"))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
