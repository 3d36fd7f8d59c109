"""Runs redis-py's own lock tests against warden.Lock and warden.asyncio.Lock.

The test modules pass ``lock_class=Lock`` (redis-py's); a fixture swaps that
name for warden's class. A server with the module is started for the session.
The tests listed in KNOWN are expected to fail, for the reason given."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import redis

# servers.py: python/tests of this checkout (the scratch dir is target/<dir>/tests).
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "python" / "tests"))

from servers import Server  # noqa: E402

import warden  # noqa: E402
import warden.asyncio  # noqa: E402

GET = "reads the lock key with GET: warden's lock is its own type, not a string"
POLL = "counts the sleeps of a polling loop: warden waits in the server and never sleeps"
KNOWN = {
    "test_lock": GET + "; it also expects no TTL without timeout (warden renews a lease)",
    "test_lock_token": GET,
    "test_lock_token_thread_local_false": GET,
    "test_context_manager": GET,
    "test_blocking_timeout": POLL,
    "test_context_manager_blocking_timeout": POLL,
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        reason = KNOWN.get(item.name)
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))


@pytest.fixture(scope="session")
def warden_server() -> Any:
    s = Server()
    yield s
    s.stop()


@pytest.fixture(autouse=True)
def warden_lock_class(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    module = request.module
    if hasattr(module, "Lock"):
        asynchronous = "test_asyncio" in module.__name__
        monkeypatch.setattr(module, "Lock", warden.asyncio.Lock if asynchronous else warden.Lock)


def _get_client(
    cls: Any, request: pytest.FixtureRequest, flushdb: bool = True, **kwargs: Any
) -> Any:
    kwargs.pop("single_connection_client", None)
    kwargs.pop("from_url", None)
    server = request.getfixturevalue("warden_server")
    client = cls(unix_socket_path=server.socket, **kwargs)
    if flushdb:
        client.flushdb()
        request.addfinalizer(client.flushdb)
    return client


@pytest.fixture()
def r(request: pytest.FixtureRequest) -> Any:
    return _get_client(redis.Redis, request)
