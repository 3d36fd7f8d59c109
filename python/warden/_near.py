"""The near cache's memory, shared by ``warden.near_cache`` and
``warden.asyncio.near_cache``: values kept in-process (LRU, bounded by count
and bytes), a generation per key read in flight, and the counters.

Nothing here does I/O. The connection side calls ``begin`` before it sends
``CACHE.PEEK``, ``finish`` with the reply (or ``abandon``), ``drop`` for an
invalidation push and ``flush`` for a flush push or a lost connection.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional

#: A read's ticket: (flushes so far, invalidations of its key so far).
Ticket = tuple[int, int]


@dataclass(frozen=True)
class NearCacheConfig:
    """An opt-in near cache for ``warden.Cache`` (``near_cache=``): at most
    ``max_entries`` values and ``max_bytes`` bytes of values in-process,
    least recently used dropped first."""

    max_entries: int = 10_000
    max_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.max_entries < 1 or self.max_bytes < 1:
            raise ValueError("max_entries and max_bytes must be at least 1")


@dataclass(frozen=True)
class NearCacheStats:
    """``hits``: reads served from memory; ``misses``: reads that went to the
    server; ``invalidations``: keys the server (or ``invalidate``) said
    changed; ``flushes``: times everything was dropped (a flush push, a
    connection lost or made again, close)."""

    hits: int
    misses: int
    invalidations: int
    flushes: int
    entries: int
    bytes: int


def now_ms() -> int:
    return int(time.time() * 1000)


class NearStore:
    """The kept values and their bookkeeping, under one lock (any thread)."""

    def __init__(self, config: NearCacheConfig) -> None:
        self.max_entries = config.max_entries
        self.max_bytes = config.max_bytes
        self.lock = threading.Lock()
        # key -> (stored value, expires_at ms (-1 none)); oldest use first.
        self.entries: OrderedDict[str, tuple[bytes, int]] = OrderedDict()
        self.bytes = 0
        self.epoch = 0  # moves on at every flush
        # Only keys with reads in flight: how many, and how often invalidated since.
        self.reading: dict[str, int] = {}
        self.moved: dict[str, int] = {}
        self.hits = 0
        self.misses = 0
        self.invalidations = 0
        self.flushes = 0

    def get(self, key: str, margin_ms: int = 0) -> Optional[bytes]:
        """The kept value of ``key``, or None (a miss, counted). A value due to
        expire within ``margin_ms`` is a miss too (kept, unless expired)."""
        now = time.time() * 1000
        with self.lock:
            entry = self.entries.get(key)
            if entry is not None:
                expires_at = entry[1]
                if expires_at < 0 or now < expires_at - margin_ms:
                    self.entries.move_to_end(key)
                    self.hits += 1
                    return entry[0]
                if now >= expires_at:
                    self._remove(key)
            self.misses += 1
            return None

    def begin(self, key: str) -> Ticket:
        """Note the generation of ``key`` before its ``CACHE.PEEK`` is sent."""
        with self.lock:
            self.reading[key] = self.reading.get(key, 0) + 1
            return (self.epoch, self.moved.get(key, 0))

    def finish(self, key: str, ticket: Ticket, reply: Any) -> Optional[tuple[bytes, int]]:
        """``CACHE.PEEK``'s reply for a read begun with ``ticket``: the fresh
        ``(value, expires_at)``, kept if nothing moved the key's generation
        since, or None (a miss or a stale value: the caller asks
        ``CACHE.GET``)."""
        fresh = _fresh(reply)
        with self.lock:
            if fresh is not None and ticket == (self.epoch, self.moved.get(key, 0)):
                self._keep(key, fresh)
            self._done(key)
        return fresh

    def abandon(self, key: str) -> None:
        """A read begun but never answered."""
        with self.lock:
            self._done(key)

    def drop(self, keys: list[str]) -> None:
        """The server (or this process) says ``keys`` changed."""
        with self.lock:
            for key in keys:
                self.invalidations += 1
                self._remove(key)
                if key in self.reading:
                    self.moved[key] = self.moved.get(key, 0) + 1

    def flush(self) -> None:
        with self.lock:
            self.epoch += 1
            self.flushes += 1
            self.entries.clear()
            self.bytes = 0

    def stats(self) -> NearCacheStats:
        with self.lock:
            return NearCacheStats(
                self.hits,
                self.misses,
                self.invalidations,
                self.flushes,
                len(self.entries),
                self.bytes,
            )

    def _keep(self, key: str, fresh: tuple[bytes, int]) -> None:
        size = len(fresh[0])
        self._remove(key)
        if size > self.max_bytes:
            return
        self.entries[key] = fresh
        self.bytes += size
        while len(self.entries) > self.max_entries or self.bytes > self.max_bytes:
            _, (value, _) = self.entries.popitem(last=False)
            self.bytes -= len(value)

    def _remove(self, key: str) -> None:
        entry = self.entries.pop(key, None)
        if entry is not None:
            self.bytes -= len(entry[0])

    def _done(self, key: str) -> None:
        left = self.reading[key] - 1
        if left:
            self.reading[key] = left
        else:
            del self.reading[key]
            self.moved.pop(key, None)


def _fresh(reply: Any) -> Optional[tuple[bytes, int]]:
    """``(value, expires_at)`` from a ``CACHE.PEEK`` reply that is neither
    nil, stale nor already expired."""
    if not isinstance(reply, list) or len(reply) != 3 or reply[2] != 0:
        return None
    value, expires_at = reply[0], int(reply[1])
    if not isinstance(value, bytes) or (0 <= expires_at <= now_ms()):
        return None
    return value, expires_at


def invalidated_keys(push: Any) -> Optional[list[str]]:
    """The keys of an ``invalidate`` push; None for a flush (a null list)."""
    keys = push[1] if len(push) > 1 else None
    if keys is None:
        return None
    return [k.decode("utf-8", "surrogateescape") if isinstance(k, bytes) else str(k) for k in keys]
