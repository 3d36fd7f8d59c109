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
    """``count`` consecutive free ports (and their cluster bus ports +10000)."""
    for base in range(low, high - count + 2):
        ports = list(range(base, base + count))
        if all(_free(p) and _free(p + 10000) for p in ports):
            return ports
    raise RuntimeError("no free ports")


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
