"""The script lane: the driver's script calls (``EVALSHA``) over plain Trio
streams, beside coredis.

Every queue operation is one script call, so a call's client cost is the
driver's: through coredis a call costs about 350 µs of CPU on the reference box
(its pool, a writer and a reader task per connection, memory streams, timeout
scopes, telemetry hooks); a plain stream sending the same ``EVALSHA`` and
parsing the RESP2 reply costs about 70 µs. An idle worker's pickup is three such
hops in a row (the enqueue's call, the wake's message, the claim's call), so
this is most of its latency on a loaded box. The wake's subscription is read
here too (``SUBSCRIBE`` on a connection of its own).

The lane speaks only what the scripts need: RESP2, ``AUTH``/``SELECT`` from the
URL, ``EVALSHA`` with ``SCRIPT LOAD`` and one repeat on ``NOSCRIPT``. Its
failures are raised as the coredis exceptions that :func:`~._client.translate`
maps (the one place failures map to codes): a connection that could not be had
is :class:`~._client.NotConnected` (nothing was sent), a connection lost or a
reply not in within ``stream_timeout`` is ``ConnectionError``/``TimeoutError``
(the outcome is unknown), an error reply is the ``ResponseError`` coredis
raises for it. A connection is used by one call at a time and dropped after any
failure or cancellation (its reply would be out of step); idle ones are kept,
up to ``max_connections`` open in all. TLS (``rediss://``) and URLs this module
does not parse are left to coredis (:func:`lane_for` answers ``None``).
"""

from __future__ import annotations

import hashlib
import select
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import coredis.exceptions
import trio

from ._client import NotConnected

__all__ = ["ScriptLane", "lane_for"]

#: Bytes asked of the socket per read.
_READ = 65536


class _Incomplete(Exception):
    """The buffer does not hold a whole reply yet."""


def _error(text: str) -> Exception:
    """The coredis exception of an error reply (what ``translate`` reads)."""
    word = text.partition(" ")[0]
    if word == "LOADING":
        return coredis.exceptions.BusyLoadingError(text)
    if word == "READONLY":
        return coredis.exceptions.ReadOnlyError(text)
    return coredis.exceptions.ResponseError(text)


def _parse(buf: bytearray, pos: int) -> tuple[Any, int]:
    """One RESP2 reply from ``buf`` at ``pos``: (value, next position); an error
    reply is an exception *value* (raised by the caller once the whole reply is
    read). Raises :class:`_Incomplete` when more bytes are needed."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise _Incomplete
    kind = buf[pos]
    if kind == 36:  # $ bulk string
        n = int(buf[pos + 1 : end])
        if n < 0:
            return None, end + 2
        start = end + 2
        if len(buf) < start + n + 2:
            raise _Incomplete
        return buf[start : start + n].decode("utf-8"), start + n + 2
    if kind == 58:  # : integer
        return int(buf[pos + 1 : end]), end + 2
    if kind == 42:  # * array
        n = int(buf[pos + 1 : end])
        if n < 0:
            return None, end + 2
        pos = end + 2
        out = []
        for _ in range(n):
            value, pos = _parse(buf, pos)
            out.append(value)
        return out, pos
    if kind == 43:  # + simple string
        return buf[pos + 1 : end].decode("utf-8"), end + 2
    if kind == 45:  # - error
        return _error(buf[pos + 1 : end].decode("utf-8", "replace")), end + 2
    raise coredis.exceptions.ConnectionError("the server's reply is not RESP2")


def _encode(args: Sequence[str]) -> bytes:
    """One command as RESP2. ASCII text (ids, numbers, the settles' fields: the
    common case) is framed as one string and encoded once, its lengths those of
    the strings; other text is framed by its UTF-8 bytes, argument by argument."""
    text = "".join([f"${len(a)}\r\n{a}\r\n" for a in args])
    if text.isascii():
        return f"*{len(args)}\r\n{text}".encode()
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a.encode("utf-8")
        parts.append(b"$%d\r\n" % len(b))
        parts.append(b)
        parts.append(b"\r\n")
    return b"".join(parts)


class _Conn:
    __slots__ = ("buf", "stream")

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buf = bytearray()

    async def request(self, payload: bytes) -> Any:
        await self.stream.send_all(payload)
        return await self.reply()

    async def reply(self) -> Any:
        buf = self.buf
        while True:
            if buf:
                try:
                    value, used = _parse(buf, 0)
                except _Incomplete:
                    pass
                else:
                    del buf[:used]
                    return value
            data = await self.stream.receive_some(_READ)
            if not data:
                raise coredis.exceptions.ConnectionError("the server closed the connection")
            buf += data

    def gone(self) -> bool:
        """Whether this idle connection is readable: nothing is owed to it, so
        that is the server's EOF (it closed, or restarted) or garbage."""
        try:
            readable, _, _ = select.select([self.stream.socket.fileno()], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def close(self) -> None:
        self.stream.socket.close()


class ScriptLane:
    """``EVALSHA`` calls over a small pool of plain connections (see the module)."""

    def __init__(
        self,
        address: tuple[str, int] | str,
        *,
        username: str | None,
        password: str | None,
        db: int,
        connect_timeout: float,
        stream_timeout: float,
        max_connections: int,
    ) -> None:
        self._address = address
        self._auth = [username, password] if username else [password] if password else []
        self._db = db
        self._connect_timeout = connect_timeout
        self._stream_timeout = stream_timeout
        self._idle: list[_Conn] = []
        self._room = trio.Semaphore(max(1, max_connections))
        self._sources: dict[str, str] = {}
        self.closed = False

    def sha(self, source: str) -> str:
        """The digest of ``source`` (remembered, for a ``SCRIPT LOAD`` on ``NOSCRIPT``)."""
        digest = hashlib.sha1(source.encode("utf-8")).hexdigest()
        self._sources[digest] = source
        return digest

    async def _connect(self) -> _Conn:
        try:
            with trio.fail_after(self._connect_timeout):
                if isinstance(self._address, str):
                    stream: trio.SocketStream = await trio.open_unix_socket(self._address)
                else:
                    stream = await trio.open_tcp_stream(*self._address)
                conn = _Conn(stream)
                try:
                    for command in self._handshake():
                        answer = await conn.request(_encode(command))
                        if isinstance(answer, Exception):
                            raise answer
                except BaseException:
                    conn.close()
                    raise
        except (OSError, TimeoutError, trio.TooSlowError, coredis.exceptions.RedisError) as exc:
            raise NotConnected(type(exc).__name__) from exc
        return conn

    def _handshake(self) -> list[list[str]]:
        out = []
        if self._auth:
            out.append(["AUTH", *[a or "" for a in self._auth]])
        if self._db:
            out.append(["SELECT", str(self._db)])
        return out

    async def call(self, sha: str, args: Sequence[str]) -> Any:
        """``EVALSHA sha 0 *args``: the script's reply, or the coredis exception
        for its failure (see the module)."""
        if self.closed:
            raise RuntimeError("the script lane is closed")
        payload = _encode(["EVALSHA", sha, "0", *args])
        async with self._room:
            conn = None
            while self._idle:
                conn = self._idle.pop()
                if not conn.gone():
                    break
                conn.close()
                conn = None
            if conn is None:
                conn = await self._connect()
            ok = False
            try:
                try:
                    with trio.fail_after(self._stream_timeout):
                        reply = await conn.request(payload)
                        if isinstance(reply, coredis.exceptions.ResponseError) and str(
                            reply
                        ).startswith("NOSCRIPT"):
                            loaded = await conn.request(
                                _encode(["SCRIPT", "LOAD", self._sources[sha]])
                            )
                            if isinstance(loaded, Exception):
                                raise loaded
                            reply = await conn.request(payload)
                except trio.TooSlowError:
                    raise TimeoutError("no reply within stream_timeout") from None
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    raise coredis.exceptions.ConnectionError(type(exc).__name__) from None
                ok = True
            finally:
                if ok and not self.closed:
                    self._idle.append(conn)
                else:
                    conn.close()
        if isinstance(reply, Exception):
            raise reply
        return reply

    @asynccontextmanager
    async def subscribe(self, channel: str) -> AsyncIterator[_Messages]:
        """A subscription to ``channel`` on a connection of its own: yields an
        iterator of its messages (``{"type": "message", "data": ...}``) that
        raises ``ConnectionError`` when the connection ends."""
        conn = await self._connect()
        try:
            await conn.stream.send_all(_encode(["SUBSCRIBE", channel]))
            with trio.fail_after(self._connect_timeout):
                first = await conn.reply()
            if isinstance(first, Exception):
                raise first
            yield _Messages(conn)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError) as exc:
            raise coredis.exceptions.ConnectionError(type(exc).__name__) from None
        finally:
            conn.close()

    def close(self) -> None:
        """Close every idle connection; one in use closes when its call ends."""
        self.closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class _Messages:
    """The messages of a subscription's connection (an iterator object, not an
    async generator: nothing is left to finalize when its reader is cancelled)."""

    def __init__(self, conn: _Conn) -> None:
        self._conn = conn

    def __aiter__(self) -> _Messages:
        return self

    async def __anext__(self) -> dict[str, Any]:
        while True:
            try:
                reply = await self._conn.reply()
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise coredis.exceptions.ConnectionError(type(exc).__name__) from None
            if isinstance(reply, list) and len(reply) == 3:
                return {"type": reply[0], "channel": reply[1], "data": reply[2]}


def lane_for(
    url: str, *, connect_timeout: float, stream_timeout: float, max_connections: int
) -> ScriptLane | None:
    """The lane for ``url``, or ``None`` when the script calls stay on coredis
    (TLS, or a URL form this module does not read)."""
    try:
        parts = urlsplit(url)
        query = parse_qs(parts.query)
        if parts.scheme == "redis":
            address: tuple[str, int] | str = (parts.hostname or "localhost", parts.port or 6379)
            path = parts.path.lstrip("/")
            db = int(path) if path else int(query.get("db", ["0"])[0])
        elif parts.scheme == "unix":
            address = unquote(parts.path)
            db = int(query.get("db", ["0"])[0])
        else:
            return None
        if set(query) - {"db"}:
            return None  # options coredis reads (timeouts, protocol...): its own
        username = unquote(parts.username) if parts.username else None
        password = unquote(parts.password) if parts.password else None
        if parts.scheme == "unix" and "password" in query:
            return None
    except ValueError:
        return None
    return ScriptLane(
        address,
        username=username,
        password=password,
        db=db,
        connect_timeout=connect_timeout,
        stream_timeout=stream_timeout,
        max_connections=max_connections,
    )
