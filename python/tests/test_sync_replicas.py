"""The clients need no change for ``warden.sync-replicas``: a grant the
replicas did not acknowledge in time is a busy answer, an unacknowledged
extend a lost hold."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from redis.exceptions import LockNotOwnedError
from servers import Server, free_ports

import warden


@pytest.fixture
def pair() -> Iterator[tuple[Server, Server]]:
    master_port, replica_port = free_ports(2, 7300, 7399)
    master = Server(port=master_port)
    replica = Server(port=replica_port, extra=("--replicaof", "127.0.0.1", str(master_port)))
    try:
        r = master.client()
        deadline = time.monotonic() + 20
        # A write the replica acknowledged: it streams, not just loads.
        while r.set("streaming", 1) and r.execute_command("WAIT", 1, 100) != 1:
            assert time.monotonic() < deadline, "the replica never streamed"
        r.config_set("warden.sync-replicas", 1)
        r.config_set("warden.sync-timeout", 100)
        yield master, replica
    finally:
        replica.stop()
        master.stop()


def test_grants_the_replica_did_not_acknowledge_are_busy_answers(
    pair: tuple[Server, Server],
) -> None:
    master, replica = pair
    r: redis.Redis = master.client()
    held = warden.Lock(r, "held", timeout=30)
    assert held.acquire(blocking=False), "acknowledged: granted"
    replica.pause()
    try:
        assert not warden.Lock(r, "k", timeout=30).acquire(blocking=False)
        assert not warden.Lock(r, "k", timeout=30).acquire(blocking_timeout=0.3)
        assert not warden.Semaphore(r, "s", 2, timeout=30).acquire(blocking=False)
        rw = warden.ReadWriteLock(r, "rw", timeout=30)
        assert not rw.read_lock().acquire(blocking=False)
        with pytest.raises(LockNotOwnedError):
            held.extend(30)
        for command in ("LOCK.INFO", "SEM.INFO"):
            assert r.execute_command(command, "k" if command == "LOCK.INFO" else "s") is None
        assert r.execute_command("RWLOCK.INFO", "rw") is None
    finally:
        replica.resume()
    assert warden.Lock(r, "k", timeout=30).acquire(blocking=False)
