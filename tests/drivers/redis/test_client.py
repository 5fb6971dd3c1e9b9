"""The seam with coredis (``drivers/redis/_client.py``): the names it relies on,
the one translation of failures into codes, and what the caller is told when
Redis does not answer.

A server that accepts a connection and never answers fails the call after
``connect_timeout`` ("could not connect ... nothing was sent"), not after
``stream_timeout``; a command sent whose reply never comes is "the outcome is
unknown: the command may have landed", because it may have: the enqueue below
lands on the real server while its caller hears the timeout.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import coredis
import coredis.exceptions
import coredis.retry
import pytest
import trio
from coredis.commands import Script
from coredis.connection import BaseConnection, TCPConnection, UnixDomainSocketConnection
from coredis.parser import Parser

from trio_jobs.drivers.redis import redis_driver
from trio_jobs.drivers.redis._client import (
    REFUSED_FOR_NOW,
    NotConnected,
    Scripts,
    connect,
    translate,
)
from trio_jobs.errors import DriverError, ErrorCode, JobsError

from .conftest import REDIS_URL, req

needs_redis = pytest.mark.skipif(
    not REDIS_URL, reason="REDIS_URL is unset: no Redis server to test the Redis driver against"
)


# --------------------------------------------------------------------------- the names relied on


def _params(fn: Any) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(fn).parameters)


def test_the_coredis_names_and_signatures_the_seam_relies_on() -> None:
    # connect(): a pool subclass built from a URL, its connection class swapped.
    assert issubclass(coredis.ConnectionPool, object)
    assert inspect.iscoroutinefunction(coredis.ConnectionPool.get_connection)
    assert any(
        p.kind is p.VAR_KEYWORD for p in _params(coredis.ConnectionPool.get_connection).values()
    )
    pool = coredis.ConnectionPool.from_url(
        "redis://127.0.0.1:1/0",
        decode_responses=True,
        connect_timeout=1.0,
        stream_timeout=2.0,
        max_connections=3,
    )
    assert pool.connection_class is TCPConnection
    unix = coredis.ConnectionPool.from_url("unix:///tmp/none.sock", decode_responses=True)
    assert unix.connection_class is UnixDomainSocketConnection
    assert issubclass(TCPConnection, BaseConnection)
    assert issubclass(UnixDomainSocketConnection, BaseConnection)
    redis_init = _params(coredis.Redis.__init__)
    assert {"connection_pool", "decode_responses", "retry_policy"} <= set(redis_init)
    assert callable(coredis.retry.NoRetryPolicy)
    # The handshake bound: run(task_status=) calls task_status.started() once the
    # handshake is done, and every handshake request goes through
    # create_request(..., timeout=None).
    run = _params(BaseConnection.run)
    assert run["task_status"].kind is inspect.Parameter.KEYWORD_ONLY
    create = _params(BaseConnection.create_request)
    assert create["timeout"].default is None
    source = inspect.getsource(BaseConnection)
    assert 'self.create_request(b"HELLO"' in source
    # Scripts: register_script answers a Script called with (keys, args) that
    # reloads itself on NOSCRIPT.
    assert inspect.signature(coredis.Redis.register_script).return_annotation in (
        "Script[AnyStr]",
        Script,
    )
    assert list(_params(Script.__call__))[:3] == ["self", "keys", "args"]
    assert "NoScriptError" in inspect.getsource(Script.__call__)
    # translate(): which Redis error codes coredis turns into classes of its own
    # (their code stripped from the text), and which arrive as a ResponseError
    # whose text starts with the code.
    classes = Parser.EXCEPTION_CLASSES
    assert classes["LOADING"] is coredis.exceptions.BusyLoadingError
    assert classes["READONLY"] is coredis.exceptions.ReadOnlyError
    assert classes["NOSCRIPT"] is coredis.exceptions.NoScriptError
    assert not REFUSED_FOR_NOW & set(classes)
    assert not any(code.startswith("X_") for code in classes)
    assert issubclass(coredis.exceptions.BusyLoadingError, coredis.exceptions.ConnectionError)
    assert issubclass(coredis.exceptions.ReadOnlyError, coredis.exceptions.ResponseError)
    assert issubclass(NotConnected, coredis.exceptions.ConnectionError)


def test_connect_builds_connections_whose_handshake_is_bounded() -> None:
    client = connect(
        "redis://127.0.0.1:1/0", connect_timeout=0.5, stream_timeout=9.0, max_connections=2
    )
    pool = client.connection_pool
    assert issubclass(pool.connection_class, TCPConnection)
    assert pool.connection_class is not TCPConnection
    scripts = Scripts(client)
    assert all("local P = ARGV[1]" in s for s in scripts.sources())


# --------------------------------------------------------------------------- one translation


def _refusal(text: str) -> coredis.exceptions.ResponseError:
    return coredis.exceptions.ResponseError(text)


@pytest.mark.parametrize(
    ("exc", "code", "phrase"),
    [
        (NotConnected("OSError"), ErrorCode.X_DRIVER_UNAVAILABLE, "nothing was sent"),
        (RuntimeError("pool exited"), ErrorCode.X_DRIVER_UNAVAILABLE, "nothing was sent"),
        (TimeoutError("EVALSHA timed out"), ErrorCode.X_DRIVER_UNAVAILABLE, "may have landed"),
        (
            coredis.exceptions.ConnectionError("Connection lost while receiving response"),
            ErrorCode.X_DRIVER_UNAVAILABLE,
            "the outcome is unknown",
        ),
        (_refusal("OOM command not allowed"), ErrorCode.X_DRIVER_UNAVAILABLE, "(OOM)"),
        (_refusal("BUSY Redis is busy running a script"), ErrorCode.X_DRIVER_UNAVAILABLE, "(BUSY)"),
        (
            _refusal("NOREPLICAS Not enough good replicas"),
            ErrorCode.X_DRIVER_UNAVAILABLE,
            "nothing",
        ),
        (
            coredis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"),
            ErrorCode.X_DRIVER_UNAVAILABLE,
            "(LOADING)",
        ),
        (
            coredis.exceptions.ReadOnlyError("You can't write against a read only replica."),
            ErrorCode.X_DRIVER_UNAVAILABLE,
            "(READONLY)",
        ),
        (
            _refusal("X_JOB_INPUT_INVALID row 2: run_at must be an instant; nothing was written"),
            ErrorCode.X_JOB_INPUT_INVALID,
            "row 2: run_at",
        ),
        (_refusal("X_INVARIANT the claim must be a whole number"), ErrorCode.X_INVARIANT, "claim"),
        (
            _refusal("ERR value is not a valid float key:secret"),
            ErrorCode.X_INVARIANT,
            "ResponseError",
        ),
        (
            coredis.exceptions.WrongTypeError("Operation against a key"),
            ErrorCode.X_INVARIANT,
            "bug",
        ),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v)[:30],
)
def test_every_failure_maps_to_a_code_in_one_place(
    exc: BaseException, code: ErrorCode, phrase: str
) -> None:
    got = translate(exc, "enqueue")
    assert got.code == code
    assert phrase in got.message, got.message
    assert "secret" not in got.message  # the server's text is never echoed
    assert isinstance(got, DriverError) == (code == ErrorCode.X_DRIVER_UNAVAILABLE)


# --------------------------------------------------------------------------- unanswered


@asynccontextmanager
async def _silent_server() -> AsyncIterator[int]:
    """A TCP server that accepts every connection and never answers."""

    async def accept_and_say_nothing(stream: trio.SocketStream) -> None:
        async with stream:
            await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            partial(trio.serve_tcp, accept_and_say_nothing, 0, host="127.0.0.1")
        )
        yield int(listeners[0].socket.getsockname()[1])
        nursery.cancel_scope.cancel()


async def test_a_server_that_never_answers_fails_after_connect_timeout_not_stream_timeout() -> None:
    async with _silent_server() as port:
        driver = redis_driver(
            f"redis://127.0.0.1:{port}/0",
            prefix="tj-silent",
            connect_timeout="200ms",
            stream_timeout="1h",
        )
        # Not a speed assertion: 60 s tells connect_timeout (200 ms) from
        # stream_timeout (an hour), which the open used to wait for.
        with trio.move_on_after(60) as guard, pytest.raises(JobsError) as caught:
            await driver.open()
    assert not guard.cancel_called, "the open waited for stream_timeout"
    err = caught.value
    assert err.code == ErrorCode.X_DRIVER_UNAVAILABLE
    assert "could not connect to Redis" in err.message
    assert "nothing was sent" in err.message
    assert err.meta["sent"] is False
    assert driver.closed or not driver.opened


class _Relay:
    """A TCP relay to the real server whose replies the test can swallow."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.mute = False
        self.port = 0

    async def _pump(self, src: trio.SocketStream, dst: trio.SocketStream, replies: bool) -> None:
        try:
            while data := await src.receive_some(65536):
                if not (replies and self.mute):
                    await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _handle(self, client: trio.SocketStream) -> None:
        upstream = await trio.open_tcp_stream(*self.target)
        async with client, upstream, trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, client, upstream, False)
            nursery.start_soon(self._pump, upstream, client, True)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                partial(trio.serve_tcp, self._handle, 0, host="127.0.0.1")
            )
            self.port = int(listeners[0].socket.getsockname()[1])
            task_status.started()


@needs_redis
async def test_a_reply_that_never_comes_says_the_command_may_have_landed(
    redis_url: str, redis_prefix: str
) -> None:
    assert REDIS_URL is not None
    host, port = REDIS_URL.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    relay = _Relay((host, int(port)))
    request = req("landed-unseen")
    async with trio.open_nursery() as nursery:
        await nursery.start(relay.run)
        driver = redis_driver(
            f"redis://127.0.0.1:{relay.port}/0", prefix=redis_prefix, stream_timeout="300ms"
        )
        await driver.open()
        try:
            relay.mute = True  # Redis runs what it is sent; its answers are lost
            with trio.fail_after(60), pytest.raises(JobsError) as caught:
                await driver.enqueue_many([request])
        finally:
            await driver.close()
        nursery.cancel_scope.cancel()
    err = caught.value
    assert err.code == ErrorCode.X_DRIVER_UNAVAILABLE
    assert "the outcome is unknown" in err.message
    assert "may have landed" in err.message
    assert "could not connect" not in err.message
    assert err.meta["sent"] == "unknown"
    # It did land; and the caller's retry of the same request is safe: it dedupes
    # onto the row under the id it staged.
    direct = redis_driver(redis_url, prefix=redis_prefix)
    await direct.open()
    try:
        state = await direct.client.hget(f"{redis_prefix}:job:{request.id}", "st")
        assert state == "ready"
        [again] = await direct.enqueue_many([request])
        assert again.deduped
        assert again.id == request.id
    finally:
        await direct.close()
