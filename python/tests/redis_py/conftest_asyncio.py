"""The asyncio half of redis-py's lock tests: ``r`` and ``create_redis`` on warden's server."""

from __future__ import annotations

from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio
from redis.exceptions import ResponseError

from warden import _core

from ..conftest import lock_owner


class Redis(redis.asyncio.Redis):
    """redis-py's asyncio client, whose ``GET`` of a warden lock answers its
    owner (see ../conftest.py)."""

    async def get(self, name: Any) -> Any:
        try:
            return await super().get(name)
        except ResponseError as error:
            if not _core.is_wrongtype(error):
                raise
            return lock_owner(await self.execute_command("LOCK.INFO", name))


@pytest_asyncio.fixture()
async def create_redis(request: pytest.FixtureRequest) -> Any:
    server = request.getfixturevalue("warden_server")
    clients: list[Any] = []

    async def factory(flushdb: bool = True, **kwargs: Any) -> Any:
        client = Redis(unix_socket_path=server.socket, **kwargs)
        if flushdb:
            await client.flushdb()
        clients.append(client)
        return client

    yield factory
    for client in clients:
        await client.flushdb()
        await client.aclose()


@pytest_asyncio.fixture()
async def r(create_redis: Any) -> Any:
    return await create_redis()
