"""``warden.asyncio.Cache``: ``warden.Cache`` for ``redis.asyncio`` clients
and coroutine functions. A cancelled loader abandons its lease; a cancelled
wait closes its connection (the server drops the waiter)."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Awaitable
from typing import Any, Callable, Optional, TypeVar, Union, cast

from .. import _core
from .._core import CacheRequest, CacheWaitTimeout, Number, Serializer
from .._near import NearCacheConfig, now_ms
from ._connection import Pinned, call, in_background
from .near_cache import NearCache

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


class Cache:
    """As ``warden.Cache``; loaders are coroutine functions. With
    ``near_cache``: ``await sync()``, ``await aclose()`` (or ``async with``)."""

    def __init__(
        self,
        redis: Any,
        *,
        prefix: str = "",
        lease: Number = 10,
        wait: Number = 10,
        retries: int = 3,
        serializer: Optional[Serializer] = None,
        negative_ttl: Optional[Number] = 30,
        near_cache: Optional[NearCacheConfig] = None,
    ) -> None:
        self.redis = redis
        self.prefix = prefix
        self.lease_ms = _core.to_ms(lease)
        self.wait_ms = _core.to_ms(wait)
        self.retries = retries
        self.serializer: Serializer = serializer or _core.BytesSerializer()
        self.negative_ttl = negative_ttl
        self.near_cache = None if near_cache is None else NearCache(redis, near_cache)

    async def sync(self) -> None:
        """As ``warden.Cache.sync``."""
        if self.near_cache is not None:
            await self.near_cache.sync()

    async def aclose(self) -> None:
        """As ``warden.Cache.close``."""
        if self.near_cache is not None:
            await self.near_cache.aclose()

    async def __aenter__(self) -> Cache:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _near_get(self, key: str, refresh: Optional[Number]) -> Optional[bytes]:
        """As ``warden.Cache._near_get``."""
        near = self.near_cache
        assert near is not None
        margin = 0 if refresh is None else _core.to_ms(refresh)
        data = near.get(key, margin)
        if data is not None:
            return data
        fresh = await near.peek(key)
        if fresh is None or (margin and 0 <= fresh[1] <= now_ms() + margin):
            return None
        return fresh[0]

    def _decode(self, data: Any) -> Any:
        value = _core.unstored(data)
        return None if value is None else self.serializer.loads(value)

    async def get_or_load(
        self,
        key: str,
        loader: Callable[[], Awaitable[Any]],
        ttl: Optional[Number] = None,
        jitter: Optional[Number] = None,
        refresh: Optional[Number] = None,
    ) -> Any:
        """The cached value of ``key``, or ``await loader()``'s (see ``warden.Cache``)."""
        if self.near_cache is not None:
            data = await self._near_get(self.prefix + key, refresh)
            if data is not None:
                return self._decode(data)
        request = CacheRequest(
            self.prefix + key,
            self.lease_ms,
            self.wait_ms,
            None if refresh is None else _core.to_ms(refresh),
        )
        for _ in range(self.retries + 1):
            pinned = await Pinned.open(self.redis, request.key, waits=True)
            handed_off = False
            try:
                value, lease = await pinned.call(*request.args(), timeout=request.read_timeout())
                if lease is None:
                    if value is not None:
                        return self._decode(value)
                    continue
                if value is not None:  # refresh ahead: serve now, reload behind
                    handed_off = True
                    in_background(self._refresh(pinned, request.key, lease, loader, ttl, jitter))
                    return self._decode(value)
                return await self._load(pinned, request.key, lease, loader, ttl, jitter)
            finally:
                if not handed_off:
                    await pinned.close()
        raise CacheWaitTimeout(f"no value for {request.key!r} after {self.retries + 1} waits")

    async def _load(
        self,
        pinned: Pinned,
        key: str,
        lease: int,
        loader: Callable[[], Awaitable[Any]],
        ttl: Optional[Number],
        jitter: Optional[Number],
    ) -> Any:
        filled = False
        try:
            value = await loader()
            if value is None:
                entry, ttl, jitter = _core.NEGATIVE, self.negative_ttl, None
            else:
                data = self.serializer.dumps(value)
                entry = _core.stored(data)
            await pinned.call(*_core.fill_args(key, lease, entry, ttl, jitter))
            filled = True
            # What a hit would answer, so every caller sees one type.
            return None if value is None else self.serializer.loads(data)
        finally:
            if not filled and not pinned.broken:
                # Also when cancelled: the abandon runs before the
                # CancelledError goes on (a second cancel drops the
                # connection instead, which ends the lease too).
                try:
                    await pinned.call("CACHE.ABANDON", key, lease)
                except Exception:
                    logger.debug("could not abandon the lease of %r", key)

    async def _refresh(
        self,
        pinned: Pinned,
        key: str,
        lease: int,
        loader: Callable[[], Awaitable[Any]],
        ttl: Optional[Number],
        jitter: Optional[Number],
    ) -> None:
        try:
            await self._load(pinned, key, lease, loader, ttl, jitter)
        except Exception:
            logger.exception("refreshing %r failed", key)
        finally:
            await pinned.close()

    async def invalidate(self, key: str, stale: Optional[Number] = None) -> bool:
        """As ``warden.Cache.invalidate``."""
        full = self.prefix + key
        args: list[Any] = ["CACHE.INVALIDATE", full]
        if stale is not None:
            args += ["STALE", _core.to_ms(stale)]
        try:
            return bool(await call(self.redis, full, *args))
        finally:
            if self.near_cache is not None:  # read-your-writes in this process
                self.near_cache.invalidated(full)

    def cached(
        self,
        key: Union[str, Callable[..., str]],
        ttl: Union[Number, None, _core.Unset] = _core.UNSET,
        jitter: Optional[Number] = None,
        refresh: Optional[Number] = None,
    ) -> Callable[[F], F]:
        """As ``warden.Cache.cached``, for coroutine functions."""

        expiry = _core.cached_ttl(ttl)
        if isinstance(key, str):
            _core.check_key_template(key)

        def decorate(function: F) -> F:
            if not inspect.iscoroutinefunction(function):
                raise TypeError("decorate plain functions with warden.Cache")
            signature = inspect.signature(function)

            def key_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
                return _core.cache_key(key, signature, args, kwargs)

            @functools.wraps(function)
            async def wrapper(*args: Any, **kwargs: Any) -> Any:
                return await self.get_or_load(
                    key_of(args, kwargs),
                    lambda: function(*args, **kwargs),
                    ttl=expiry,
                    jitter=jitter,
                    refresh=refresh,
                )

            async def invalidate(*args: Any, stale: Optional[Number] = None, **kwargs: Any) -> bool:
                return await self.invalidate(key_of(args, kwargs), stale=stale)

            wrapper.invalidate = invalidate  # type: ignore[attr-defined]
            return cast(F, wrapper)

        return decorate
