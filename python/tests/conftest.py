from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from servers import Cluster, Server


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.stop()


@pytest.fixture
def own_server() -> Iterator[Server]:
    """A server of the test's own (paused or killed by it)."""
    s = Server()
    yield s
    s.stop()


@pytest.fixture
def r(server: Server) -> Iterator[redis.Redis]:
    client = server.client()
    client.flushall()
    yield client
    client.close()


@pytest_asyncio.fixture
async def ar(server: Server) -> AsyncIterator[Any]:
    client = server.async_client()
    await client.flushall()
    yield client
    await client.aclose()


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    yield c
    c.stop()


def no_retries() -> dict[str, Any]:
    return {"retry": Retry(NoBackoff(), 0)}
