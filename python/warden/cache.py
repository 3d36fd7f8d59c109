"""``warden.Cache``: cache-aside on warden's ``CACHE.*`` leases.

One caller per key loads on a miss; the others wait in the server and are
answered with the value by the fill itself. The loop is the library's: lease
and fill on one pinned connection (a lease ends with the connection that took
it), ``CACHE.ABANDON`` on any failure of the load (``KeyboardInterrupt``
included), a bounded retry when a wait times out, refresh-ahead in a
background thread, negative entries for loaders that return None. With
``near_cache=NearCacheConfig()`` values are also kept in-process
(``warden.near_cache``).
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from typing import Any, Callable, Optional, TypeVar, Union, cast

from . import _core
from ._connection import Pinned, call
from ._core import CacheRequest, CacheWaitTimeout, Number, Serializer
from ._near import NearCacheConfig, now_ms
from .near_cache import NearCache

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


class Cache:
    """A cache of loaded values in plain Redis strings.

    ``lease`` (s) bounds one load: a loader slower than that loses its lease
    and its fill is refused. ``wait`` (s) is how long a caller waits for
    another's load before asking again, ``retries`` times. ``serializer``
    turns values into bytes (default: bytes/str as they are;
    ``warden.JsonSerializer()`` for JSON). ``prefix`` is put before every key.
    A loader returning None stores an empty string for ``negative_ttl``
    seconds (a negative entry), read back as None; a value that is empty or
    starts with a NUL byte is stored behind one NUL byte, so it never reads
    back as a negative entry (every other value is stored as it is).
    Requests that wait (``CACHE.GET`` and the fill after it) run on a pool of
    their own beside the client's (see ``warden._connection``).

    ``near_cache`` (a ``NearCacheConfig``) keeps fresh values in this process
    too, served with no round trip until the server says they changed (see
    ``warden.NearCache``); ``sync()`` and ``close()`` are then for it.
    """

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

    def sync(self) -> None:
        """With a near cache: one round trip of its connection. After a write
        is acknowledged to its writer, a read after ``sync()`` never returns
        the older value. Without one: nothing to do."""
        if self.near_cache is not None:
            self.near_cache.sync()

    def close(self) -> None:
        """Close the near cache's connection and reader (the client stays open)."""
        if self.near_cache is not None:
            self.near_cache.close()

    def __enter__(self) -> Cache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _near_get(self, key: str, refresh: Optional[Number]) -> Optional[bytes]:
        """``key``'s fresh value from the near cache (kept, or peeked), or None:
        ask ``CACHE.GET``. A value due for ``refresh`` goes to the server, which
        hands one caller the reload."""
        near = self.near_cache
        assert near is not None
        margin = 0 if refresh is None else _core.to_ms(refresh)
        data = near.get(key, margin)
        if data is not None:
            return data
        fresh = near.peek(key)
        if fresh is None or (margin and 0 <= fresh[1] <= now_ms() + margin):
            return None
        return fresh[0]

    def _decode(self, data: Any) -> Any:
        value = _core.unstored(data)
        return None if value is None else self.serializer.loads(value)

    def get_or_load(
        self,
        key: str,
        loader: Callable[[], Any],
        ttl: Optional[Number] = None,
        jitter: Optional[Number] = None,
        refresh: Optional[Number] = None,
    ) -> Any:
        """The cached value of ``key``, or ``loader()``'s, stored for ``ttl``
        seconds plus a random ``0..jitter``. With ``refresh``, a read less than
        that many seconds before expiry reloads it in the background."""
        if self.near_cache is not None:
            data = self._near_get(self.prefix + key, refresh)
            if data is not None:
                return self._decode(data)
        request = CacheRequest(
            self.prefix + key,
            self.lease_ms,
            self.wait_ms,
            None if refresh is None else _core.to_ms(refresh),
        )
        for _ in range(self.retries + 1):
            pinned = Pinned(self.redis, request.key, waits=True)
            handed_off = False
            try:
                value, lease = pinned.call(*request.args(), timeout=request.read_timeout())
                if lease is None:
                    if value is not None:
                        return self._decode(value)
                    continue  # waited for another's load in vain: ask again
                if value is not None:  # refresh ahead: serve now, reload behind
                    handed_off = True
                    threading.Thread(
                        target=self._refresh,
                        args=(pinned, request.key, lease, loader, ttl, jitter),
                        name=f"warden-refresh:{request.key}",
                        daemon=True,
                    ).start()
                    return self._decode(value)
                return self._load(pinned, request.key, lease, loader, ttl, jitter)
            finally:
                if not handed_off:
                    pinned.close()
        raise CacheWaitTimeout(f"no value for {request.key!r} after {self.retries + 1} waits")

    def _load(
        self,
        pinned: Pinned,
        key: str,
        lease: int,
        loader: Callable[[], Any],
        ttl: Optional[Number],
        jitter: Optional[Number],
    ) -> Any:
        filled = False
        try:
            value = loader()
            if value is None:
                entry, ttl, jitter = _core.NEGATIVE, self.negative_ttl, None
            else:
                data = self.serializer.dumps(value)
                entry = _core.stored(data)
            pinned.call(*_core.fill_args(key, lease, entry, ttl, jitter))
            filled = True
            # What a hit would answer, so every caller sees one type.
            return None if value is None else self.serializer.loads(data)
        finally:
            if not filled and not pinned.broken:
                try:
                    pinned.call("CACHE.ABANDON", key, lease)
                except Exception:  # the lease lapses anyway
                    logger.debug("could not abandon the lease of %r", key)

    def _refresh(
        self,
        pinned: Pinned,
        key: str,
        lease: int,
        loader: Callable[[], Any],
        ttl: Optional[Number],
        jitter: Optional[Number],
    ) -> None:
        try:
            self._load(pinned, key, lease, loader, ttl, jitter)
        except Exception:
            logger.exception("refreshing %r failed", key)
        finally:
            pinned.close()

    def invalidate(self, key: str, stale: Optional[Number] = None) -> bool:
        """Delete ``key``'s value and revoke its lease (a slow reader's fill is
        refused); with ``stale`` keep serving the old value at most that long
        while one reader reloads it. Update your database first."""
        full = self.prefix + key
        args: list[Any] = ["CACHE.INVALIDATE", full]
        if stale is not None:
            args += ["STALE", _core.to_ms(stale)]
        try:
            return bool(call(self.redis, full, *args))
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
        """Decorate a function whose result is cached under ``key``: a format
        string over its parameters (``"product:{product_id}"``) or a callable
        taking its arguments. In a format string each argument's text is
        percent-encoded (letters, digits and ``_.-~`` stay as they are), so
        distinct arguments give distinct keys; fields must be separated by a
        character such as ``:`` or ``/``, and ``{{...}}`` in the template
        makes a Redis Cluster hash tag. ``ttl`` must be given: seconds, or
        None to keep values until invalidated or evicted. The wrapper's
        ``.invalidate(*args, stale=None, **kwargs)`` invalidates the entry of
        those arguments."""

        expiry = _core.cached_ttl(ttl)
        if isinstance(key, str):
            _core.check_key_template(key)

        def decorate(function: F) -> F:
            if inspect.iscoroutinefunction(function):
                raise TypeError("decorate coroutine functions with warden.asyncio.Cache")
            signature = inspect.signature(function)

            def key_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
                return _core.cache_key(key, signature, args, kwargs)

            @functools.wraps(function)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                return self.get_or_load(
                    key_of(args, kwargs),
                    lambda: function(*args, **kwargs),
                    ttl=expiry,
                    jitter=jitter,
                    refresh=refresh,
                )

            def invalidate(*args: Any, stale: Optional[Number] = None, **kwargs: Any) -> bool:
                return self.invalidate(key_of(args, kwargs), stale=stale)

            wrapper.invalidate = invalidate  # type: ignore[attr-defined]
            return cast(F, wrapper)

        return decorate
