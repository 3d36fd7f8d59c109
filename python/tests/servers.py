"""Real servers with the module loaded, for the tests and the benchmark.

``WARDEN_SERVER`` names the server binary (default ``redis-server``),
``WARDEN_MODULE`` the module (default: the release build of this checkout).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import redis
import redis.sentinel

ROOT = Path(__file__).resolve().parents[2]
SERVER = os.environ.get("WARDEN_SERVER", "redis-server")
MODULE = os.environ.get("WARDEN_MODULE", str(ROOT / "target/release/libwarden.so"))


class Server:
    """One server on a unix socket in a temp dir (or on a TCP port)."""

    def __init__(
        self, port: int = 0, extra: tuple[str, ...] = (), module: Optional[str] = MODULE
    ) -> None:
        self.dir = tempfile.mkdtemp(prefix="warden-py-")
        self.port = port
        self.socket = os.path.join(self.dir, "redis.sock")
        self.log = os.path.join(self.dir, "server.log")
        args = [
            SERVER,
            "--port",
            str(port),
            "--unixsocket",
            self.socket,
            "--dir",
            self.dir,
            "--save",
            "",
            "--appendonly",
            "no",
            # A replica's first sync starts at once (the default waits 5 s
            # for more replicas to join it).
            "--repl-diskless-sync-delay",
            "0",
            "--logfile",
            self.log,
            *(("--loadmodule", module) if module else ()),
            *extra,
        ]
        if port:
            args += ["--bind", "127.0.0.1"]
        self.args = args
        self.start()

    def start(self) -> None:
        self.process = subprocess.Popen(
            self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                if self.client().ping():
                    break
            except redis.ConnectionError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{SERVER} did not start:\n{self.log_text()}")
            time.sleep(0.02)

    def log_text(self) -> str:
        try:
            return Path(self.log).read_text()
        except OSError:
            return ""

    def client(self, **options: Any) -> redis.Redis:
        return redis.Redis(unix_socket_path=self.socket, **options)

    def async_client(self, **options: Any) -> Any:
        import redis.asyncio

        return redis.asyncio.Redis(unix_socket_path=self.socket, **options)

    def restart(self) -> None:
        """Shut down (SIGTERM: the AOF, if on, is written out) and start again
        with the same settings and socket."""
        self.resume()
        self.process.terminate()
        self.process.wait()
        self.start()

    def pause(self) -> None:
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        self.resume()
        self.process.kill()
        self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def free_ports(count: int, low: int = 7100, high: int = 7199) -> list[int]:
    """``count`` consecutive free ports (and their cluster bus ports +10000),
    from this pytest-xdist worker's own share of ``low``-``high``: two workers
    that find the same ports free at once would both take them."""
    low, high = _share(low, high)
    for base in range(low, high - count + 2):
        ports = list(range(base, base + count))
        if all(_free(p) and _free(p + 10000) for p in ports):
            return ports
    raise RuntimeError("no free ports")


def _share(low: int, high: int) -> tuple[int, int]:
    """This worker's slice of ``low``-``high`` (all of it outside pytest-xdist)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or workers <= 1:
        return low, high
    size = (high - low + 1) // workers
    start = low + int(worker[2:]) * size
    return start, start + size - 1


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Cluster:
    """Three masters with the module, slots split by redis-cli."""

    def __init__(self, ports: Optional[list[int]] = None) -> None:
        ports = ports or free_ports(3, 7150)
        self.servers = [
            Server(p, ("--cluster-enabled", "yes", "--cluster-node-timeout", "5000")) for p in ports
        ]
        self.ports = ports
        try:
            subprocess.run(
                [
                    "redis-cli",
                    "--cluster",
                    "create",
                    *[f"127.0.0.1:{p}" for p in ports],
                    "--cluster-yes",
                ],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + 20
            for s in self.servers:
                while s.client().cluster("info").get("cluster_state") != "ok":
                    if time.monotonic() > deadline:
                        raise RuntimeError("cluster did not come up")
                    time.sleep(0.1)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for s in self.servers:
            s.stop()


# Where a Sentinel setup takes its three ports: "low-high".
SENTINEL_PORTS = os.environ.get("WARDEN_SENTINEL_PORTS", "7500-7599")


class Sentinels:
    """A master with the module, a replica of it (both on TCP ports, with
    ``extra`` settings) and one Sentinel (the same binary, ``--sentinel``)
    monitoring them as ``name``, quorum 1."""

    def __init__(self, name: str = "m", extra: tuple[str, ...] = ()) -> None:
        low, high = (int(p) for p in SENTINEL_PORTS.split("-"))
        master_port, replica_port, self.port = free_ports(3, low, high)
        self.name = name
        self.servers: list[Server] = []
        self.dir = tempfile.mkdtemp(prefix="warden-py-sentinel-")
        self.process: Optional[subprocess.Popen[bytes]] = None
        try:
            self.master = Server(master_port, extra)
            self.servers.append(self.master)
            self.replica = Server(
                replica_port, (*extra, "--replicaof", "127.0.0.1", str(master_port))
            )
            self.servers.append(self.replica)
            conf = os.path.join(self.dir, "sentinel.conf")
            Path(conf).write_text(
                f"port {self.port}\nbind 127.0.0.1\ndir {self.dir}\n"
                f"logfile {os.path.join(self.dir, 'sentinel.log')}\n"
                f"sentinel monitor {name} 127.0.0.1 {master_port} 1\n"
                f"sentinel down-after-milliseconds {name} 2000\n"
                f"sentinel failover-timeout {name} 10000\n"
            )
            self.process = subprocess.Popen(
                [SERVER, conf, "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            self.until(
                lambda: len(self.ask("SENTINEL", "REPLICAS", name) or []) == 1, "the replica"
            )
            # Sentinel lists the replica from its first handshake, before its
            # sync: a WAIT 1 right after would count no replica.
            self.until(self.replica_linked, "the replica's sync")
        except BaseException:
            self.stop()
            raise

    def client(self) -> redis.Redis:
        return redis.Redis("127.0.0.1", self.port, socket_timeout=10)

    def replica_linked(self) -> bool:
        replica = self.replica.client()
        try:
            return replica.info("replication").get("master_link_status") == "up"
        finally:
            replica.close()

    def ask(self, *command: Any) -> Any:
        """One command to the Sentinel (None when it does not answer yet)."""
        sentinel = self.client()
        try:
            return sentinel.execute_command(*command)
        except redis.ConnectionError:
            return None
        finally:
            sentinel.close()

    def master_port(self) -> int:
        address = self.ask("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.name)
        return int(address[1]) if address else 0

    def failover(self) -> None:
        """``SENTINEL FAILOVER``, until Sentinel names the replica as master
        (the old master stays up: Sentinel demotes it seconds later)."""

        # Sentinel lists a replica before it counts it as promotable (fresh
        # INFO, link up): NOGOODSLAVE until then.
        def started() -> bool:
            try:
                return bool(self.ask("SENTINEL", "FAILOVER", self.name))
            except redis.ResponseError as error:
                if "NOGOODSLAVE" not in str(error):
                    raise
                return False

        self.until(started, "SENTINEL FAILOVER to start")
        # Both answers: GET-MASTER-ADDR-BY-NAME names the promoted replica
        # while the failover still runs; SENTINEL MASTERS, which redis-py's
        # Sentinel client asks, names the old master until it has ended. A
        # writer that reconnected in between would write to the old master,
        # and lose those writes to the failover.
        self.until(
            lambda: (
                self.master_port() == self.replica.port
                and self.discovered_port() == self.replica.port
            ),
            "the new master",
        )

    def discovered_port(self) -> int:
        """The master's port as redis-py's Sentinel client finds it."""
        manager = redis.sentinel.Sentinel(
            [("127.0.0.1", self.port)], sentinel_kwargs={"socket_timeout": 5}
        )
        try:
            return int(manager.discover_master(self.name)[1])
        except redis.ConnectionError:  # MasterNotFoundError included
            return 0
        finally:
            for sentinel in manager.sentinels:
                sentinel.close()

    def until(self, condition: Any, what: str, seconds: float = 30) -> None:
        deadline = time.monotonic() + seconds
        while not condition():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
        for s in self.servers:
            s.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
