"""The seam with coredis: the one module that knows its classes (the script
lane, ``_lane.py``, raises coredis's exceptions so that :func:`translate` maps
its failures too).

Three things live here, and nowhere else:

- :func:`connect` builds the client. Its connections answer their handshake
  (``HELLO``, ``AUTH``, ``SELECT``) within ``connect_timeout``: coredis bounds
  only the TCP connect by it, so a server that accepts and never answers held a
  call for ``stream_timeout`` (10 s). Its pool marks a failure to get a
  connection (:class:`NotConnected`): the command was never sent.
- :class:`Scripts` registers each Lua script with coredis (``register_script``:
  ``EVALSHA``, and on ``NOSCRIPT`` the script is loaded and the call repeated),
  for a URL the script lane leaves to coredis (TLS).
- :func:`translate` turns every failure of a call into a :class:`JobsError`:
  the one place coredis's errors (and a script's own refusals) map to codes.

``tests/drivers/redis/test_client.py`` pins every coredis name and signature
this module relies on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import coredis
import coredis.exceptions
import coredis.retry
from anyio import TASK_STATUS_IGNORED
from anyio.abc import TaskStatus
from coredis.commands import Script
from coredis.connection import BaseConnection, TCPConnection, UnixDomainSocketConnection

from ...errors import DriverError, ErrorCode, JobsError, error
from ._scripts import SCRIPT_NAMES, script_source

__all__ = ["NotConnected", "Scripts", "connect", "not_connected", "translate"]


class NotConnected(coredis.exceptions.ConnectionError):
    """No connection could be had (refused, unanswered within ``connect_timeout``,
    or its handshake failed): the command was never sent."""


class _Started:
    """Forwards a connection's ``task_status.started()`` after marking its
    handshake done."""

    def __init__(self, connection: _HandshakeBound, inner: TaskStatus[Any]) -> None:
        self._connection = connection
        self._inner = inner

    def started(self, value: Any = None) -> None:
        self._connection.handshaking = False
        self._inner.started(value)


class _HandshakeBound(BaseConnection):
    """A connection whose handshake requests wait ``connect_timeout``, not
    ``stream_timeout``: connecting (TCP and handshake) is bounded by one setting."""

    handshaking = True
    _handshake_timeout: float | None = None

    async def run(self, *, task_status: TaskStatus[None] = TASK_STATUS_IGNORED) -> None:
        self.handshaking = True
        await super().run(task_status=_Started(self, task_status))

    def create_request(self, command: bytes, *args: Any, **kwargs: Any) -> Any:
        if self.handshaking and kwargs.get("timeout") is None and self._handshake_timeout:
            kwargs["timeout"] = self._handshake_timeout
        return super().create_request(command, *args, **kwargs)


class _TCP(_HandshakeBound, TCPConnection):
    def __init__(self, location: Any, **kwargs: Any) -> None:
        super().__init__(location, **kwargs)
        self._handshake_timeout = kwargs.get("connect_timeout")


class _Unix(_HandshakeBound, UnixDomainSocketConnection):
    def __init__(self, location: Any, **kwargs: Any) -> None:
        super().__init__(location, **kwargs)
        self._handshake_timeout = kwargs.get("connect_timeout")


class _Pool(coredis.ConnectionPool[Any]):
    """A pool whose failure to hand out a connection is :class:`NotConnected`."""

    async def get_connection(self, **kwargs: Any) -> Any:
        try:
            return await super().get_connection(**kwargs)
        except NotConnected:
            raise
        except (coredis.exceptions.ConnectionError, TimeoutError, OSError) as exc:
            raise NotConnected(type(exc).__name__) from exc


def connect(
    url: str, *, connect_timeout: float, stream_timeout: float, max_connections: int
) -> coredis.Redis[str]:
    """The client for ``url`` (no I/O). Raises ``ValueError``/``TypeError`` or a
    coredis error for a URL that does not parse."""
    pool = _Pool.from_url(
        url,
        decode_responses=True,
        connect_timeout=connect_timeout,
        stream_timeout=stream_timeout,
        max_connections=max_connections,
    )
    pool.connection_class = (
        _Unix if issubclass(pool.connection_class, UnixDomainSocketConnection) else _TCP
    )
    return coredis.Redis(
        connection_pool=pool,
        decode_responses=True,
        # A write whose reply was lost must not be sent twice: the caller
        # decides (claims and settles are fenced; a repeated enqueue dedupes on
        # its id).
        retry_policy=coredis.retry.NoRetryPolicy(),
    )


class Scripts:
    """The Lua scripts, each a coredis ``Script`` bound to the client: called by
    digest (``EVALSHA``); a server that forgot one (a restart, ``SCRIPT FLUSH``)
    answers ``NOSCRIPT`` and coredis loads it and repeats the call, once."""

    def __init__(self, client: coredis.Redis[str]) -> None:
        self._client = client
        self._scripts: Mapping[str, Script[str]] = {
            name: client.register_script(script_source(name)) for name in SCRIPT_NAMES
        }

    def sources(self) -> list[str]:
        """Every script's text, to load up front (``SCRIPT LOAD``) when opening."""
        return [str(script.script) for script in self._scripts.values()]

    def call(self, name: str, args: Sequence[str]) -> Any:
        """The awaitable call of script ``name`` with ``args`` (no keys)."""
        return self._scripts[name](args=list(args))


#: Redis's own error codes (an error reply's first word, by the protocol's
#: convention) for a command the server refused for now, without running it:
#: out of memory, a script running (BUSY), loading its dataset, a read-only
#: replica, a primary down or too few replicas, a failed snapshot. Transient.
#: coredis raises a class of its own for two of them (the code stripped from
#: the text); the rest arrive as a ResponseError whose text starts with the code.
REFUSED_FOR_NOW = frozenset({"OOM", "BUSY", "MASTERDOWN", "NOREPLICAS", "MISCONF"})
_REFUSED_CLASSES: tuple[tuple[type[BaseException], str], ...] = (
    (coredis.exceptions.BusyLoadingError, "LOADING"),
    (coredis.exceptions.ReadOnlyError, "READONLY"),
)


def not_connected(what: str, kind: str = "no connection") -> DriverError:
    """``X_DRIVER_UNAVAILABLE`` for a call that was never sent."""
    detail = f" ({what})" if what else ""
    return DriverError(
        ErrorCode.X_DRIVER_UNAVAILABLE,
        f"could not connect to Redis{detail}: {kind}; nothing was sent. Check the URL "
        "(REDIS_URL) and that the server is up; the call can be retried once it is",
        meta={"kind": kind, "sent": False},
    )


def translate(exc: BaseException, what: str) -> JobsError:
    """The :class:`JobsError` for a failed call ``what`` (a command or a script
    name). The message names the exception class and Redis's error code, never
    the server's text (it may echo keys or arguments), except for a script's own
    refusal, which is ours and names the argument, not its value."""
    kind = type(exc).__name__
    if isinstance(exc, NotConnected | RuntimeError):
        # RuntimeError: coredis's answer from a pool that has exited.
        return not_connected(what, kind)
    refused = next((code for klass, code in _REFUSED_CLASSES if isinstance(exc, klass)), None)
    if refused is None and isinstance(exc, coredis.exceptions.ResponseError):
        word, _, rest = str(exc).partition(" ")
        if word in ErrorCode.__members__:
            # One of our scripts refused its arguments, before writing anything.
            return error(word, f"Redis refused {what}: {rest}", kind=kind)
        if word in REFUSED_FOR_NOW:
            refused = word
    if refused is not None:
        return DriverError(
            ErrorCode.X_DRIVER_UNAVAILABLE,
            f"Redis refused {what} for now ({refused}): nothing was written; the call "
            "can be retried once the server takes it again",
            meta={"kind": kind, "sent": True, "refused": refused},
        )
    if isinstance(exc, coredis.exceptions.ConnectionError | TimeoutError | OSError):
        return DriverError(
            ErrorCode.X_DRIVER_UNAVAILABLE,
            f"Redis did not answer {what} ({kind}): the outcome is unknown, the command may "
            "have landed. A retry is safe (enqueues dedupe on their ids, settles are fenced); "
            "if this repeats, check the server and stream_timeout",
            meta={"kind": kind, "sent": "unknown"},
        )
    return JobsError(
        ErrorCode.X_INVARIANT,
        f"Redis refused {what} ({kind}); this is a bug in the Redis driver or a server it "
        "does not support (Redis 7 or later, standalone)",
        meta={"kind": kind},
    )
