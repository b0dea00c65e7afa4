"""The request path's Lua scripts over one pipelined Redis connection.

Every request runs four scripts (the per-address window, the key/tenant RPM windows, the quota
reservation, its settlement). Through redis-py's asyncio client each costs ~55-70 µs of Python
(pool checkout, timeouts, RESP3 parser, one send per command); here ~10 µs: commands from every
task go to one connection (those of one event-loop iteration in one write) and the replies, which
Redis sends in order, are matched first in first out. A caller that is cancelled leaves its reply
to be read and dropped, so the connection never desynchronises. Redis runs commands one at a
time anyway, so one connection costs it nothing.

    lane = ScriptLane.for_client(redis)                        # one per connection pool
    reply = await lane.run(script, keys=[...], args=[...])     # script: redis.register_script(...)

A Redis that stops answering with the socket still open (a stopped or wedged server) fails the
calls waiting on it with redis-py's ``TimeoutError`` after the pool's ``socket_timeout``.

Only plain TCP and unix-socket connections (with optional AUTH and SELECT) take the lane; other
setups (TLS, credential providers, a Redis Cluster client, ...) run the same scripts through
redis-py. Errors are redis-py's exceptions (``ConnectionError``, ``ResponseError``), so callers
handle both paths alike.

Commands are packed and replies parsed by ``hiredis`` (redis-py's own C speed-up, a dependency of
pagegate) when it imports: ~4 µs to pack a reservation's 19 arguments and ~0.6 µs to read its
reply, against ~18 and ~9.5 µs for the pure-Python ``pack``/``parse`` below, which remain the
fallback."""

from __future__ import annotations

import asyncio
import collections
import weakref
from typing import Any

from redis._parsers.base import BaseParser
from redis.asyncio import Redis
from redis.asyncio.connection import Connection, UnixDomainSocketConnection
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

try:
    import hiredis
except ImportError:  # pragma: no cover - hiredis is a dependency; the pure-Python path stays correct
    hiredis = None

# one lane per connection pool; a lane keeps no reference to its pool, so both go together
_lanes: weakref.WeakKeyDictionary[Any, ScriptLane] = weakref.WeakKeyDictionary()


class _Incomplete(Exception):
    pass


def _encode(arg: Any) -> bytes:
    """redis-py's argument encoding: bytes as they are, str as UTF-8, numbers by ``repr``."""
    if isinstance(arg, bytes):
        return arg
    if isinstance(arg, str):
        return arg.encode()
    if isinstance(arg, int | float) and not isinstance(arg, bool):
        return repr(arg).encode()
    raise TypeError(f"cannot send {type(arg).__name__} to Redis")


def pack(*parts: Any) -> bytes:
    """One RESP command."""
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        b = _encode(part)
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def pack_fast(*parts: Any) -> bytes:
    """``pack`` through hiredis when it is installed (same bytes; booleans refused alike)."""
    return hiredis.pack_command(parts)


if hiredis is None:  # pragma: no cover
    pack_fast = pack  # noqa: F811


def redis_error(message: str) -> Exception:
    """An error reply as redis-py raises it: ``LOADING`` is a ``BusyLoadingError`` (a
    ``ConnectionError``: Redis is restarting), ``READONLY`` a ``ReadOnlyError``, ``NOSCRIPT`` a
    ``NoScriptError``, the rest a ``ResponseError`` (found by QA: every error reply was a
    ``ResponseError``, so a settlement answered ``LOADING`` was dropped instead of retried)."""
    return BaseParser.parse_error(message)


def parse(buf: bytes | bytearray, pos: int = 0) -> tuple[Any, int]:
    """One RESP2 reply from ``buf[pos:]`` → (value, position after it); raises _Incomplete.
    Error replies come back as exception instances (not raised)."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise _Incomplete
    kind, line = buf[pos:pos + 1], bytes(buf[pos + 1:end])
    pos = end + 2
    if kind == b":":
        return int(line), pos
    if kind == b"$":
        n = int(line)
        if n < 0:
            return None, pos
        if len(buf) < pos + n + 2:
            raise _Incomplete
        return bytes(buf[pos:pos + n]), pos + n + 2
    if kind == b"*":
        n = int(line)
        if n < 0:
            return None, pos
        items = []
        for _ in range(n):
            item, pos = parse(buf, pos)
            items.append(item)
        return items, pos
    if kind == b"+":
        return line, pos
    if kind == b"-":
        return redis_error(line.decode(errors="replace")), pos
    raise RedisConnectionError(f"unexpected reply from Redis: {bytes(buf[pos - 2 - len(line) - 1:pos])!r}")


class _Protocol(asyncio.Protocol):
    """``timeout_s``: when replies are awaited and none has come for this long, Redis has stopped
    answering (a stopped or wedged server keeps the socket open): every waiter gets
    ``TimeoutError`` and the connection is dropped (the next call reconnects). One timer per
    connection, not one per command: the request path pays nothing for it."""

    def __init__(self, timeout_s: float | None = None) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiters: collections.deque[asyncio.Future] = collections.deque()
        self.buf = bytearray()
        self.lost: BaseException | None = None
        self.outgoing: list[bytes] = []  # commands of this loop iteration, written in one send
        self.reader = hiredis.Reader(replyError=ResponseError) if hiredis is not None else None
        self.timeout_s = timeout_s
        self.last_read = 0.0  # loop time of the last reply (or of the first command awaited since)
        self._watch: asyncio.TimerHandle | None = None
        self._watch_loop: asyncio.AbstractEventLoop | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._watch is not None:
            self.last_read = self._watch_loop.time()
        if self.reader is not None:
            self._received_hiredis(data)
            return
        self.buf += data
        pos = 0
        try:
            while self.waiters:
                value, pos = parse(self.buf, pos)
                self._deliver(value)
        except _Incomplete:
            pass
        except Exception as exc:  # a reply we cannot read: this connection is done
            self._broken(exc)
            return
        if pos:
            del self.buf[:pos]

    def _received_hiredis(self, data: bytes) -> None:
        reader = self.reader
        try:
            reader.feed(data)
            while self.waiters:
                value = reader.gets()
                if value is False:  # hiredis: no whole reply yet (a nil reply is None)
                    break
                if isinstance(value, ResponseError):  # hiredis gives every error reply as one class
                    value = redis_error(str(value))
                self._deliver(value)
        except Exception as exc:
            self._broken(exc)

    def _deliver(self, value: Any) -> None:
        fut = self.waiters.popleft()
        if not fut.done():  # a cancelled caller: its reply is dropped
            if isinstance(value, Exception):  # an error reply (redis_error); BusyLoadingError is no ResponseError
                fut.set_exception(value)
            else:
                fut.set_result(value)

    def _broken(self, exc: Exception) -> None:
        """A reply we cannot read: this connection is done."""
        self._fail(RedisConnectionError(f"bad reply from Redis: {exc!r}"))
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(RedisConnectionError(f"connection to Redis lost: {exc!r}" if exc else "Redis closed the connection"))

    def _fail(self, exc: BaseException) -> None:
        self.lost = exc
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_exception(exc)

    def send(self, data: bytes) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        if self.lost is not None or self.transport is None or self.transport.is_closing():
            # the connection is gone (reset while the caller was on its way): no reply will come,
            # and no watchdog looks at a lost connection, so the call fails now rather than never
            fut.set_exception(self.lost or RedisConnectionError("the connection to Redis is closed"))
            return fut
        if self.timeout_s is not None and not self.waiters:
            self.last_read = loop.time()  # the clock starts with the first reply awaited
            if self._watch is None:
                self._watch_loop = loop
                self._watch = loop.call_later(self.timeout_s, self._check)
        self.waiters.append(fut)
        if not self.outgoing:
            loop.call_soon(self._flush)
        self.outgoing.append(data)
        return fut

    def _flush(self) -> None:
        data, self.outgoing = b"".join(self.outgoing), []
        if self.lost is None and not self.transport.is_closing():
            self.transport.write(data)

    def _check(self) -> None:
        self._watch = None
        if not self.waiters or self.lost is not None:
            return
        silent = self._watch_loop.time() - self.last_read
        if silent < self.timeout_s:
            self._watch = self._watch_loop.call_later(self.timeout_s - silent, self._check)
            return
        self._fail(RedisTimeoutError(f"Redis sent no reply for {silent:.1f} s"))
        if self.transport is not None:
            self.transport.abort()


class ScriptLane:
    """See the module docstring. ``run`` is safe to call from many tasks at once."""

    def __init__(self, redis: Redis) -> None:
        pool = getattr(redis, "connection_pool", None)  # a RedisCluster client has none: redis-py
        kwargs = dict(getattr(pool, "connection_kwargs", {}))
        self._address: tuple[str, Any] | None = None
        if pool is None:
            pass
        elif pool.connection_class is Connection:
            self._address = ("tcp", (kwargs.get("host", "localhost"), int(kwargs.get("port", 6379))))
        elif pool.connection_class is UnixDomainSocketConnection:
            self._address = ("unix", kwargs.get("path"))
        if kwargs.get("credential_provider") is not None:
            self._address = None
        self.enabled = self._address is not None  # False: scripts go through redis-py
        self._username = kwargs.get("username")
        self._password = kwargs.get("password")
        self._db = int(kwargs.get("db") or 0)
        self._connect_timeout = float(kwargs.get("socket_connect_timeout") or 5)
        timeout = kwargs.get("socket_timeout")
        self._timeout = float(timeout) if timeout else None  # no reply for this long: TimeoutError
        self._proto: _Protocol | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connecting: asyncio.Task | None = None  # the one connection attempt every caller awaits

    @classmethod
    def for_client(cls, redis: Redis) -> ScriptLane:
        """The lane of ``redis``'s connection pool (one connection per pool and process)."""
        pool = getattr(redis, "connection_pool", redis)
        lane = _lanes.get(pool)
        if lane is None:
            lane = _lanes[pool] = cls(redis)
        return lane

    async def run(self, script: AsyncScript, *, keys: list[Any], args: list[Any]) -> Any:
        """``EVALSHA`` the script (loading it once when Redis does not know it)."""
        if not self.enabled:
            return await script(keys=keys, args=args)
        command = pack_fast("EVALSHA", script.sha, len(keys), *keys, *args)
        try:
            return await self._send(command)
        except NoScriptError:
            await self._send(pack("SCRIPT", "LOAD", script.script))
            return await self._send(command)

    async def _send(self, command: bytes) -> Any:
        proto = self._proto
        if proto is None or proto.lost is not None or self._loop is not asyncio.get_running_loop():
            proto = await self._connect()
        return await proto.send(command)

    async def _connect(self) -> _Protocol:
        """The connection, made once for every caller waiting meanwhile: an attempt that fails
        fails them all at once (one after the other, each waiting out its own attempt, the last
        of a blackholed Redis's callers waited their number times the timeout)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # first use, or a new event loop (tests): start afresh
            self._loop, self._connecting, self._proto = loop, None, None
        if self._proto is not None and self._proto.lost is None:
            return self._proto
        if self._connecting is None:
            self._connecting = attempt = loop.create_task(self._open())
            attempt.add_done_callback(self._opened)
        return await asyncio.shield(self._connecting)

    def _opened(self, attempt: asyncio.Task) -> None:
        if self._connecting is attempt:
            self._connecting = None
        if not attempt.cancelled() and attempt.exception() is None:  # (also marks a failure as seen)
            self._proto = attempt.result()

    async def _open(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        kind, where = self._address
        try:
            def protocol() -> _Protocol:
                return _Protocol(self._timeout)

            if kind == "tcp":
                connect = loop.create_connection(protocol, *where)
            else:
                connect = loop.create_unix_connection(protocol, where)
            transport, proto = await asyncio.wait_for(connect, self._connect_timeout)
            try:
                setup = []
                if self._password is not None:
                    auth = ("AUTH", self._username, self._password) if self._username else ("AUTH", self._password)
                    setup.append(proto.send(pack(*auth)))
                if self._db:
                    setup.append(proto.send(pack("SELECT", self._db)))
                if setup:  # (a server that accepts and never answers: bounded without a socket_timeout)
                    await asyncio.wait_for(asyncio.gather(*setup), self._connect_timeout)
            except BaseException:
                transport.close()
                raise
        except (OSError, TimeoutError) as exc:
            raise RedisConnectionError(f"cannot connect to Redis at {where}: {exc!r}") from exc
        return proto

    async def aclose(self) -> None:
        proto, self._proto = self._proto, None
        if proto is not None and proto.transport is not None:
            proto.transport.close()
