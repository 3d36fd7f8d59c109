"""The parts the sync and asyncio halves share: argument mapping, owner tokens,
reply shapes, cache keys and serializers. Nothing here talks to a server."""

from __future__ import annotations

import inspect
import json
import math
import os
import re
import string
import threading
import time
import urllib.parse
import uuid
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol, Union

from redis.exceptions import AskError, LockError, NoPermissionError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

Number = Union[int, float]

#: The lease of a lock created with ``timeout=None``: the watchdog renews it
#: every third of this while the lock is held (Redisson's default).
WATCHDOG_TIMEOUT = 30.0

#: How much longer than its ``WAIT`` a cache wait waits for its reply before
#: the client gives up and closes the connection (the server answers a
#: timed-out waiter within a few ms; the rest covers a busy machine).
READ_MARGIN = 5.0

#: One process-wide prefix for re-entrant owners (stable per thread or task).
PROCESS_ID = f"{uuid.uuid4().hex}:{os.getpid()}"


@dataclass(frozen=True)
class LockCommands:
    """The commands behind one kind of lock."""

    acquire: str
    release: str
    extend: str
    info: str
    #: ``RWLOCK.UNLOCK``'s mode (1.1.0): the release ends a hold of this
    #: kind only (without it an owner's write hold goes first).
    mode: Optional[str] = None


EXCLUSIVE = LockCommands("LOCK.ACQUIRE", "LOCK.RELEASE", "LOCK.EXTEND", "LOCK.INFO")
READ = LockCommands("RWLOCK.READ", "RWLOCK.UNLOCK", "RWLOCK.EXTEND", "RWLOCK.INFO", "READ")
WRITE = LockCommands("RWLOCK.WRITE", "RWLOCK.UNLOCK", "RWLOCK.EXTEND", "RWLOCK.INFO", "WRITE")
SEMAPHORE = LockCommands("SEM.ACQUIRE", "SEM.RELEASE", "SEM.EXTEND", "SEM.INFO")


def to_ms(seconds: Number) -> int:
    """Seconds (int or float, as redis-py takes them) to whole milliseconds, at least 1."""
    return max(1, int(math.ceil(seconds * 1000)))


_CAP = re.compile(r"ttl exceeds warden\.max-lease: expected an integer from 1 to (\d+)")

#: The ``warden.max-lease`` each client learnt from the server's refusals.
_caps: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_caps_lock = threading.Lock()


def lease_cap_of(error: Exception) -> Optional[int]:
    """The cap in the server's refusal of a lease above ``warden.max-lease``
    (``ERR ttl exceeds warden.max-lease: expected an integer from 1 to N
    (ms)``), or None for any other error."""
    match = _CAP.search(str(error))
    return int(match.group(1)) if match else None


def learn_cap(client: Any, cap: int) -> None:
    """Remember ``client``'s server cap (a lower one, learnt later, replaces it)."""
    with _caps_lock:
        try:
            _caps[client] = cap
        except TypeError:  # not weakly referable: asked for each time
            pass


#: The clients whose server refused ``RWLOCK.UNLOCK``'s mode (a module
#: before 1.1.0): their releases go without it.
_no_unlock_mode: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def release_args(client: Any, commands: LockCommands, name: Any, owner: bytes) -> list[Any]:
    """The release of one hold of ``owner``: with the mode where the server
    takes it."""
    if commands.mode is None or _no_unlock_mode.get(client):
        return [commands.release, name, owner]
    return [commands.release, name, owner, commands.mode]


def unlock_mode_refused(client: Any, args: list[Any], error: Exception) -> bool:
    """True (remembered for ``client``) when ``error`` is a server's refusal
    of the mode ``args`` carried: send them again without it."""
    if len(args) != 4 or "wrong number of arguments" not in str(error):
        return False
    with _caps_lock:
        try:
            _no_unlock_mode[client] = True
        except TypeError:  # not weakly referable: asked with a mode each time
            pass
    return True


def capped(client: Any, ms: int) -> int:
    """``ms``, or the cap learnt for ``client`` when that is lower: what a
    grant or renewal asks the server for."""
    cap = _caps.get(client)
    return ms if cap is None else min(ms, cap)


#: Per client: this process's requests parked in the server's queue (sent
#: with ``WAIT``, their wait not over yet), by command and key. A hint only,
#: kept without a lock (a lock held across lines could stay held when an
#: interrupt lands on the line that would release it): a race loses an entry
#: (that acquire tries first), and an entry is there only from the send to
#: the end of the wait, never while a request waits for a connection.
_queued: weakref.WeakKeyDictionary[Any, dict[tuple[Any, str], set[object]]] = (
    weakref.WeakKeyDictionary()
)


def queued(client: Any, command: Any, key: str) -> bool:
    """Whether a request of this process is parked for ``command`` on ``key``:
    then the server would answer a try nil (it never lets a try overtake a
    waiter), and an acquire goes straight to waiting (one round trip, not two)."""
    counts = _queued.get(client)
    return bool(counts and counts.get((command, key)))


def parked(client: Any, command: Any, key: str) -> object:
    """Notes a request parked in the server's queue (``queued``); ``unparked``
    with the object returned takes the note back (again: nothing)."""
    me = object()
    try:
        counts = _queued.get(client)
        if counts is None:
            counts = _queued.setdefault(client, {})
    except TypeError:  # not weakly referable: every acquire tries first
        return me
    counts.setdefault((command, key), set()).add(me)
    return me


def unparked(client: Any, command: Any, key: str, me: object) -> None:
    counts = _queued.get(client)
    if counts is None:
        return
    waiters = counts.get((command, key))
    if waiters is not None:
        waiters.discard(me)
        if not waiters:
            counts.pop((command, key), None)


def extended_lease_ms(additional_time: Number, left_ms: Optional[int]) -> Optional[int]:
    """The lease ``extend(additional_time)`` asks for, in ms: ``additional_time``
    added to the ``left_ms`` it has (None: ``replace_ttl``, it replaces it).
    None when that is not positive: as redis-py's ``Lock`` (8.2), such an
    extend leaves the lease as it is (and still checks the hold is ours)."""
    ms = int(additional_time * 1000) + (left_ms or 0)
    return ms if ms > 0 else None


class Deadline:
    """A caller's deadline on the monotonic clock, counted from its call (not
    from when a connection was free); ``at`` None is no deadline (forever)."""

    __slots__ = ("at",)

    def __init__(self, seconds: Optional[Number]) -> None:
        self.at = None if seconds is None else time.monotonic() + seconds

    def remaining(self) -> Optional[float]:
        """Seconds left (never below 0); None without a deadline."""
        return None if self.at is None else max(0.0, self.at - time.monotonic())

    def passed(self) -> bool:
        return self.at is not None and time.monotonic() >= self.at

    def wait_ms(self) -> Optional[int]:
        """The ``WAIT`` to send now: 0 (forever) without a deadline, else the
        time left less ``margin_ms`` (the grant's way back), at least 1;
        None when nothing is left (send nothing: report the timeout)."""
        if self.at is None:
            return 0
        left = round((self.at - time.monotonic()) * 1000, 3)  # no 49.999… for 50
        if left <= 0:
            return None
        return max(1, int(left - margin_ms(left)))


def margin_ms(left_ms: float) -> float:
    """What a blocking request keeps of its caller's time left for the reply
    to reach the caller: a tenth, between 1 and 5 ms."""
    return min(5.0, max(1.0, left_ms / 10))


#: The requests ``WARDEN.WITHDRAW key owner`` takes out of a queue (their key
#: and owner are their first two arguments).
WITHDRAWABLE = frozenset({"LOCK.ACQUIRE", "RWLOCK.READ", "RWLOCK.WRITE", "SEM.ACQUIRE"})


def refuses_command(error: Exception) -> bool:
    """Whether a server's error refuses the command itself there: an ACL
    (``NOPERM``), or a server without it (a module before 1.1.0, a renamed
    command). Not a passing state (``BUSY``, ``LOADING``, a redirect)."""
    text = str(error)
    # redis-py raises NOPERM as NoPermissionError, without the code.
    return (
        isinstance(error, NoPermissionError)
        or text.startswith("NOPERM")
        or "unknown command" in text.lower()
    )


def known_client_id(connection: Any, link: Any) -> tuple[bool, Optional[int]]:
    """``(True, id)`` when ``connection`` already asked ``CLIENT ID`` over
    ``link`` (its socket: sync ``_sock``, asyncio ``_writer``), whose server
    connection keeps that id; ``id`` None: refused (an ACL without
    ``CLIENT``). ``(False, None)`` on a new link: a reconnect is a new client."""
    known = getattr(connection, "_warden_client_id", None)
    if known is not None and link is not None and known[0] is link:
        return True, known[1]
    return False, None


def remember_client_id(connection: Any, link: Any, client_id: Optional[int]) -> None:
    """``CLIENT ID``'s answer over ``link`` (held, so that a new socket is
    never taken for it)."""
    connection._warden_client_id = (link, client_id)


def withdraw_args(args: Sequence[Any]) -> Optional[tuple[Any, Any]]:
    """``(key, owner)`` of a waiting request that ``WARDEN.WITHDRAW`` can take
    out of its queue, or None (a rate limiter's, a cache read's)."""
    if len(args) >= 3 and str(args[0]).upper() in WITHDRAWABLE:
        return args[1], args[2]
    return None


def unblocks_module_waiters(info: Any) -> bool:
    """Whether a server's ``INFO server`` (raw reply) names one whose ``CLIENT
    UNBLOCK`` takes a module's waiter out of its queue: Redis >= 7.4, Valkey
    >= 8. Older ones must not be sent it: Redis 7.0 crashes on ``CLIENT
    UNBLOCK`` of a client held back by ``CLIENT PAUSE``."""
    text = info.decode() if isinstance(info, bytes) else str(info)

    def version(name: str) -> Optional[tuple[int, int]]:
        found = re.search(rf"^{name}_version:(\d+)\.(\d+)", text, re.M)
        return None if found is None else (int(found[1]), int(found[2]))

    valkey = version("valkey")
    if valkey is not None:
        return valkey >= (8, 0)
    redis_version = version("redis")
    return redis_version is not None and redis_version >= (7, 4)


def reply_due(unblocked: Any, unblock_works: Optional[bool]) -> Optional[float]:
    """After ``CLIENT UNBLOCK`` of a parked waiter answered ``unblocked``
    (None: not sent, or it failed; it is sent only where ``unblock_works``):
    how long the waiter's reply may be awaited, as it was sent (the wait
    ended or was unblocked), or None when it is not due."""
    if unblocked == 1 or unblocked == 0 and unblock_works:
        return 1.0
    return 0.0 if unblocked is None else None


def gone_pauses() -> Iterator[float]:
    """The pauses between checks that the server no longer lists a closed
    waiter connection (its grants end there): a second at most in all."""
    give_up = time.monotonic() + 1.0
    pause = 0.001
    while time.monotonic() < give_up:
        yield pause
        pause = min(0.02, pause * 2)


def also_on_disconnect(pool: Any, then: Callable[..., Any]) -> None:
    """Make ``pool.disconnect(...)`` (what closing its client calls) run
    ``then(...)`` with the same arguments afterwards (awaited, for an asyncio
    pool): redis-py has no close hook, so this one pool object's method is
    wrapped, nothing of its class. The wrapper holds the pool weakly: the
    pool still goes with its last reference."""
    method = pool.disconnect
    func = getattr(method, "__func__", None)
    target = weakref.ref(pool)

    def own(*args: Any, **kwargs: Any) -> Any:
        if func is None:  # already a plain function on the object
            return method(*args, **kwargs)
        alive = target()
        return None if alive is None else func(alive, *args, **kwargs)

    if inspect.iscoroutinefunction(method):

        async def disconnect_async(*args: Any, **kwargs: Any) -> None:
            try:
                await own(*args, **kwargs)
            finally:
                await then(*args, **kwargs)

        pool.disconnect = disconnect_async
    else:

        def disconnect(*args: Any, **kwargs: Any) -> None:
            try:
                own(*args, **kwargs)
            finally:
                then(*args, **kwargs)

        pool.disconnect = disconnect


class ClientClosed(RedisConnectionError):
    """The client was closed while this request waited server-side."""


# Longer than this is forever: the server's largest WAIT (2^46 ms) and the
# longest timeout a thread or socket accepts (threading.TIMEOUT_MAX).
FOREVER_SECONDS = min(2**46 / 1000, threading.TIMEOUT_MAX)

#: A release that got no reply, of an owner made for its hold, is sent again
#: in the background until it is answered or the hold's lease would have
#: ended: each send waits at most this long for its reply ...
RELEASE_AGAIN_SECONDS = 5.0
#: ... and the next goes this long after the last failed, doubling each time
#: up to ``RELEASE_AGAIN_BACKOFF_MAX``.
RELEASE_AGAIN_BACKOFF = 0.05
RELEASE_AGAIN_BACKOFF_MAX = 1.0


def deadline(blocking: bool, blocking_timeout: Optional[Number]) -> Optional[Deadline]:
    """The deadline of an acquire that may wait (None: it only tries);
    ``math.inf`` or any time past ``FOREVER_SECONDS`` waits forever, as None."""
    if blocking_timeout is not None and math.isnan(blocking_timeout):
        raise ValueError("blocking_timeout must be a number of seconds or None, not nan")
    if not blocking or (blocking_timeout is not None and blocking_timeout <= 0):
        return None
    if blocking_timeout is not None and blocking_timeout >= FOREVER_SECONDS:
        blocking_timeout = None
    return Deadline(blocking_timeout)


def read_timeout(wait: Optional[int]) -> Optional[float]:
    """The client-side read timeout of a request that waits ``wait`` ms (0 =
    forever: ``math.inf``); None (no ``WAIT``) keeps the connection's own."""
    if wait is None:
        return None
    if wait == 0:
        return math.inf
    return wait / 1000 + READ_MARGIN


def check_max_queue(max_queue: Optional[int]) -> Optional[int]:
    if max_queue is not None and (
        isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 0
    ):
        raise ValueError(f"max_queue must be a non-negative int or None, not {max_queue!r}")
    return max_queue


def queue_args(max_queue: Optional[int]) -> list[Any]:
    """What a blocking request adds after its ``WAIT`` to shed load: answered
    nil at once when ``max_queue`` requests already wait."""
    return [] if max_queue is None else ["QUEUE", max_queue]


def acquire_args(commands: LockCommands, name: str, owner: bytes, lease_ms: int) -> list[Any]:
    """An acquire that only tries; a wait adds ``WAIT`` and ``queue_args``."""
    return [commands.acquire, name, owner, lease_ms]


def semaphore_args(name: str, owner: bytes, lease_ms: int, limit: int, permits: int) -> list[Any]:
    args: list[Any] = [SEMAPHORE.acquire, name, owner, lease_ms, "LIMIT", limit]
    if permits != 1:
        args += ["PERMITS", permits]
    return args


def fresh_owner() -> bytes:
    """A new owner for one acquisition (redis-py's token shape)."""
    return uuid.uuid4().hex.encode()


def reentrant_owner(holder: int) -> bytes:
    """A stable owner for one thread (or task) of this process."""
    return f"{PROCESS_ID}:{holder}".encode()


class HoldCounts:
    """How many holds each re-entrant owner of this process has on each key,
    as far as this process knows: one owner is shared by every ``Lock`` object
    of its thread (or task), so no single object can tell."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holds: dict[tuple[bytes, str, str], int] = {}

    def get(self, owner: bytes, name: Any, commands: LockCommands) -> int:
        with self._lock:
            return self._holds.get((owner, str(name), commands.acquire), 0)

    def add(self, owner: bytes, name: Any, commands: LockCommands, n: int) -> None:
        key = (owner, str(name), commands.acquire)
        with self._lock:
            holds = self._holds.get(key, 0) + n
            if holds > 0:
                self._holds[key] = holds
            else:
                self._holds.pop(key, None)

    def released(self, owner: bytes, name: Any, commands: LockCommands, reply: Any) -> None:
        """Account for a release's answer: 0 one hold fewer, else none left."""
        if reply == 0:
            self.add(owner, name, commands, -1)
        else:
            with self._lock:
                self._holds.pop((owner, str(name), commands.acquire), None)


#: The holds of this process's re-entrant owners (threads and tasks alike).
REENTRANT_HOLDS = HoldCounts()


class FreshHold:
    """One live hold of an owner this process made for it alone (a ``Lock``'s
    acquire without ``token=``, not re-entrant; every semaphore acquire).
    ``shared``: an acquire with a caller-chosen owner (``token=``) named it
    while it lived, so that owner may hold more than this hold (sticky)."""

    __slots__ = ("owner", "shared", "__weakref__")

    def __init__(self, owner: bytes) -> None:
        self.owner = owner
        self.shared = False


class FreshOwners:
    """The live holds of owners made for one hold each, by owner, so that an
    acquire with a caller's ``token=`` can mark the hold it joins as shared:
    only a hold never shared may have its release sent again (a second
    release of a shared owner could end another's hold). An entry lives
    while its hold does: added at the grant, removed once the hold ends
    (released, lost, forgotten) or its release sent again is done; held
    weakly, so a holder dropped while holding leaves nothing behind. Kept
    without a lock (one held across lines could stay held when an
    interrupt lands on the line that would release it): each step is one
    dict operation, and an owner is only ever added once."""

    def __init__(self) -> None:
        self._holds: weakref.WeakValueDictionary[bytes, FreshHold] = weakref.WeakValueDictionary()

    def add(self, owner: bytes) -> FreshHold:
        hold = self._holds[owner] = FreshHold(owner)
        return hold

    def discard(self, hold: FreshHold) -> None:
        if self._holds.get(hold.owner) is hold:
            self._holds.pop(hold.owner, None)

    def share(self, owner: bytes) -> None:
        """An acquire with the caller-chosen ``owner`` is about to be sent:
        a live fresh hold of that owner is shared from now on."""
        hold = self._holds.get(owner)
        if hold is not None:
            hold.shared = True

    def fresh(self, hold: Optional[FreshHold], owner: bytes) -> bool:
        """Whether ``hold`` is ``owner``'s live hold, never shared."""
        if hold is None or hold.owner != owner or hold.shared:
            return False
        return self._holds.get(owner) is hold

    def __len__(self) -> int:
        return len(self._holds)


#: The live holds of the owners this process made for one hold each.
FRESH_OWNERS = FreshOwners()


def encode(value: Union[str, bytes]) -> bytes:
    return value.encode() if isinstance(value, str) else value


def text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def info_map(reply: Any) -> Optional[dict[str, Any]]:
    """``LOCK.INFO``/``RWLOCK.INFO``/``SEM.INFO``/``CACHE.INFO`` as a dict with str keys,
    whether the connection speaks RESP2 (flat list) or RESP3 (map, bytes keys)."""
    if reply is None:
        return None
    if isinstance(reply, dict):
        items = list(reply.items())
    else:
        items = list(zip(reply[::2], reply[1::2]))
    return {text(k): v for k, v in items}


def lock_error(cls: type[LockError], message: str, name: str) -> LockError:
    """redis-py's lock exceptions, with ``lock_name`` where the installed version has it."""
    try:
        return cls(message, lock_name=name)  # type: ignore[call-arg,unused-ignore]
    except TypeError:
        return cls(message)


class WrongTypeError(LockError, ResponseError):
    """The name holds a key of another type (someone's data): the server's
    ``WRONGTYPE`` error, also a ``LockError`` as redis-py's lock raises when
    it cannot take a name."""


def wrong_type(error: ResponseError, name: Any) -> WrongTypeError:
    return lock_error(WrongTypeError, str(error), name)  # type: ignore[return-value]


def is_wrongtype(error: ResponseError) -> bool:
    """A key of another type: for a lock, someone else's data holds the name."""
    return str(error).startswith("WRONGTYPE")


def hinted(error: ResponseError) -> ResponseError:
    """``error``, told that warden is not loaded when the server does not
    know a warden command."""
    message = str(error)
    prefixes = ("LOCK.", "RWLOCK.", "SEM.", "CACHE.", "RATE.")
    if message.startswith("unknown command") and any(
        f"'{prefix}" in message.upper() for prefix in prefixes
    ):
        return type(error)(
            f"{message} (is the warden module loaded? loadmodule /path/to/libwarden.so)"
        )
    return error


def is_redirect(error: ResponseError) -> bool:
    """A cluster redirect: the command did not run, so sending it again is safe."""
    message = str(error)
    return isinstance(error, AskError) or message.startswith(("MOVED", "ASK"))


# --- cache ---------------------------------------------------------------


class Serializer(Protocol):
    """How a cache turns values into the plain strings it stores, and back."""

    def dumps(self, value: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


class BytesSerializer:
    """Values are ``bytes`` (``str`` is stored UTF-8 encoded): the default."""

    def dumps(self, value: Any) -> bytes:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        if isinstance(value, str):
            return value.encode()
        raise TypeError(
            f"BytesSerializer stores bytes or str, not {type(value).__name__}: "
            "use warden.JsonSerializer() or your own serializer"
        )

    def loads(self, data: bytes) -> Any:
        return data


class TextSerializer:
    """Values are ``str``, stored UTF-8 encoded."""

    def dumps(self, value: Any) -> bytes:
        return str(value).encode()

    def loads(self, data: bytes) -> Any:
        return data.decode()


class JsonSerializer:
    """Values are anything ``json.dumps`` takes."""

    def dumps(self, value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":")).encode()

    def loads(self, data: bytes) -> Any:
        return json.loads(data)


#: Characters an argument keeps in a cache key; every other one is
#: percent-encoded (``%`` included), so an argument can never produce the
#: separators or hash-tag braces of the key's template.
KEY_SAFE = frozenset(string.ascii_letters + string.digits + "_.-~")


def escape_key_part(value: str) -> str:
    """``value`` for a cache key: readable, and injective (percent-encoding)."""
    return urllib.parse.quote(value, safe="")


class _KeyFormatter(string.Formatter):
    """``str.format`` whose replacement fields come out escaped."""

    def format_field(self, value: Any, format_spec: str) -> str:
        return escape_key_part(super().format_field(value, format_spec))


_KEY_FORMATTER = _KeyFormatter()


def check_key_template(template: str) -> None:
    """Two fields must be told apart in every key: the text between them
    needs a character that escaped arguments never contain (``:`` or ``/``,
    not letters, digits, ``_.-~``), else ``{a}{b}`` would give ``1`` + ``23``
    and ``12`` + ``3`` one key."""
    fields = 0
    for literal, field, _spec, _conversion in _KEY_FORMATTER.parse(template):
        if fields and field is not None and not (set(literal) - KEY_SAFE - {"%"}):
            raise ValueError(
                f"cache key {template!r}: separate {{{field}}} from the field before it "
                "with a character such as ':' or '/'"
            )
        if field is not None:
            fields += 1


def cache_key(
    key: Union[str, Callable[..., str]],
    signature: inspect.Signature,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> str:
    """The cache key of one call: a format string over the parameters (each
    argument's text percent-encoded, see ``escape_key_part``), or a callable."""
    if callable(key):
        return key(*args, **kwargs)
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return _KEY_FORMATTER.vformat(key, (), bound.arguments)


@dataclass(frozen=True)
class CacheRequest:
    """One ``CACHE.GET``: what to send and how long to read."""

    key: str
    lease_ms: int
    wait_ms: int
    refresh_ms: Optional[int]

    def args(self) -> list[Any]:
        args: list[Any] = ["CACHE.GET", self.key, self.lease_ms, "WAIT", self.wait_ms]
        if self.refresh_ms is not None:
            args += ["REFRESH", self.refresh_ms]
        return args

    def read_timeout(self) -> Optional[float]:
        return read_timeout(self.wait_ms)


#: What a negative entry (a loader that returned None) stores: the empty
#: string. A value whose bytes are empty or start with ``VALUE_ESCAPE`` is
#: stored behind one ``VALUE_ESCAPE`` byte, so no value reads back as a
#: negative entry; every other value is stored as its plain bytes.
NEGATIVE = b""
VALUE_ESCAPE = b"\x00"


def stored(data: bytes) -> bytes:
    """A serialized value as the cache stores it (see ``NEGATIVE``)."""
    if data == NEGATIVE or data.startswith(VALUE_ESCAPE):
        return VALUE_ESCAPE + data
    return data


def unstored(entry: Any) -> Optional[bytes]:
    """The serialized value of a stored entry; None for a negative entry."""
    data: bytes = encode(entry)
    if data == NEGATIVE:
        return None
    if data.startswith(VALUE_ESCAPE):
        return data[len(VALUE_ESCAPE) :]
    return data


def fill_args(
    key: str, lease: int, data: bytes, ttl: Optional[Number], jitter: Optional[Number]
) -> list[Any]:
    args: list[Any] = ["CACHE.FILL", key, lease, data]
    if ttl is not None:
        args += ["PX", to_ms(ttl)]
        if jitter:
            args += ["JITTER", to_ms(jitter)]
    return args


class Unset:
    """The type of ``UNSET``: a parameter the caller must give."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET = Unset()


def cached_ttl(ttl: Union[Number, None, Unset]) -> Optional[Number]:
    """``cached()``'s ttl, which must be chosen: seconds, or None for values
    kept until invalidated (or evicted)."""
    if isinstance(ttl, Unset):
        raise TypeError(
            "cached() needs ttl=: the seconds a value is kept, or ttl=None to keep "
            "values until they are invalidated or evicted"
        )
    return ttl


class CacheWaitTimeout(RedisTimeoutError):
    """Every wait for another caller's load timed out (the loader is stuck)."""
