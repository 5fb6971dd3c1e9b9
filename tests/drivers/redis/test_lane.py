"""The script lane (``_lane.py``): the driver's script calls and the wake's
subscription over plain Trio streams, beside coredis. Its replies parse as
coredis's did, its failures are coredis's exceptions (so ``translate`` maps them
in one place), an idle connection the server closed is not used, and a script
the server forgot is loaded and the call repeated once."""

from __future__ import annotations

import uuid
from functools import partial
from typing import Any

import coredis.exceptions
import pytest
import trio

from trio_jobs import JobContext, Worker, job, open_jobs
from trio_jobs.drivers import ClaimOptions
from trio_jobs.drivers.redis import RedisDriver, redis_driver
from trio_jobs.drivers.redis._client import NotConnected
from trio_jobs.drivers.redis._lane import _encode, _Incomplete, _parse, lane_for
from trio_jobs.errors import ErrorCode, JobsError

from .conftest import REDIS_URL, req


def _lane(url: str, **kw: Any) -> Any:
    lane = lane_for(
        url, connect_timeout=kw.get("connect_timeout", 1.0), stream_timeout=5.0, max_connections=4
    )
    assert lane is not None
    return lane


def test_replies_parse_as_resp2() -> None:
    wire = bytearray(b"*5\r\n$3\r\nabc\r\n:-12\r\n$-1\r\n*2\r\n+OK\r\n*0\r\n$0\r\n\r\n")
    value, used = _parse(wire, 0)
    assert value == ["abc", -12, None, ["OK", []], ""]
    assert used == len(wire)
    err, _ = _parse(bytearray(b"-X_INVARIANT the claim is missing; nothing\r\n"), 0)
    assert isinstance(err, coredis.exceptions.ResponseError)
    assert str(err).startswith("X_INVARIANT the claim")
    loading, _ = _parse(bytearray(b"-LOADING Redis is loading\r\n"), 0)
    assert isinstance(loading, coredis.exceptions.BusyLoadingError)
    readonly, _ = _parse(bytearray(b"-READONLY replica\r\n"), 0)
    assert isinstance(readonly, coredis.exceptions.ReadOnlyError)
    for cut in (b"*2\r\n$3\r\nab", b"*2\r\n:1\r\n", b"$5\r\nabc", b":1"):
        with pytest.raises(_Incomplete):
            _parse(bytearray(cut), 0)
    text = "é" * 3
    assert _parse(bytearray(_encode([text])), 0)[0] == [text]


def test_the_lane_reads_the_url_and_leaves_tls_to_coredis() -> None:
    lane = _lane("redis://user:p%40ss@10.0.0.9:6380/3")
    assert lane._address == ("10.0.0.9", 6380)
    assert lane._handshake() == [["AUTH", "user", "p@ss"], ["SELECT", "3"]]
    assert _lane("redis://:secret@h/0")._handshake() == [["AUTH", "secret"]]
    assert _lane("redis://h")._handshake() == []
    unix = _lane("unix:///run/redis.sock?db=2")
    assert unix._address == "/run/redis.sock"
    assert unix._handshake() == [["SELECT", "2"]]
    for url in ("rediss://h:6379/0", "redis://h:6379/0?protocol=2", "http://h"):
        assert lane_for(url, connect_timeout=1, stream_timeout=1, max_connections=1) is None


async def test_a_refused_connection_is_not_connected_and_nothing_was_sent() -> None:
    lane = _lane("redis://127.0.0.1:1/0")
    with pytest.raises(NotConnected):
        await lane.call(lane.sha("return 1"), [])


needs_redis = pytest.mark.skipif(not REDIS_URL, reason="REDIS_URL is unset: no Redis server")


@needs_redis
async def test_a_script_the_server_does_not_have_is_loaded_and_called_once_more() -> None:
    assert REDIS_URL is not None
    lane = _lane(REDIS_URL)
    # A script no server has seen (its text is unique): NOSCRIPT, then loaded.
    sha = lane.sha(f"return {{'{uuid.uuid4().hex}', ARGV[1], 7}}")
    try:
        first = await lane.call(sha, ["x"])
        assert first[1:] == ["x", 7]
        assert await lane.call(sha, ["y"]) == [first[0], "y", 7]
        # A script error reply is the coredis error translate reads.
        with pytest.raises(coredis.exceptions.ResponseError):
            await lane.call(lane.sha("return redis.error_reply('X_INVARIANT no')"), [])
    finally:
        lane.close()


class _CuttingRelay:
    """A TCP relay to the real server whose connections the test can hang up."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self.scopes: list[trio.CancelScope] = []
        #: Hang up right after passing on the next request (its reply is lost).
        self.cut_after_request = False
        self.mute = False

    async def _handle(self, client: trio.SocketStream) -> None:
        upstream = await trio.open_tcp_stream(*self.target)
        with trio.CancelScope() as scope:
            self.scopes.append(scope)
            async with client, upstream, trio.open_nursery() as nursery:
                nursery.start_soon(self._pump, client, upstream, True)
                nursery.start_soon(self._pump, upstream, client, False)

    async def _pump(self, src: trio.SocketStream, dst: trio.SocketStream, requests: bool) -> None:
        try:
            while data := await src.receive_some(65536):
                cutting = requests and self.cut_after_request
                if cutting:
                    self.cut_after_request = False
                    self.mute = True  # its reply is swallowed
                if requests or not self.mute:
                    await dst.send_all(data)
                if cutting:
                    await trio.sleep(0.2)  # the server has run it
                    self.cut()
                    self.mute = False
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    def cut(self) -> None:
        for scope in self.scopes:
            scope.cancel()
        self.scopes.clear()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                partial(trio.serve_tcp, self._handle, 0, host="127.0.0.1")
            )
            self.port = int(listeners[0].socket.getsockname()[1])
            task_status.started()


def _target() -> tuple[str, int]:
    assert REDIS_URL is not None
    host, port = REDIS_URL.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    return host, int(port)


@needs_redis
async def test_an_idle_connection_the_server_closed_is_not_used(redis_prefix: str) -> None:
    relay = _CuttingRelay(_target())
    async with trio.open_nursery() as nursery:
        await nursery.start(relay.run)
        driver = redis_driver(f"redis://127.0.0.1:{relay.port}/0", prefix=redis_prefix)
        await driver.open()
        try:
            assert driver._lane is not None
            await driver.enqueue_many([req("before")])
            idle = len(driver._lane._idle)
            assert idle >= 1
            relay.cut()  # every connection hung up: the lane's idle ones see EOF
            await trio.sleep(0.2)
            # Not "the outcome is unknown": the dead connection is never sent to.
            await driver.enqueue_many([req("after")])
            got = await driver.claim(ClaimOptions("w1", {"default": 5}, 30.0))
            assert sorted(j.payload["key"] for j in got.jobs) == ["after", "before"]
        finally:
            await driver.close()
        nursery.cancel_scope.cancel()


@needs_redis
async def test_a_call_whose_connection_drops_says_the_outcome_is_unknown(
    redis_prefix: str,
) -> None:
    relay = _CuttingRelay(_target())
    async with trio.open_nursery() as nursery:
        await nursery.start(relay.run)
        driver = redis_driver(f"redis://127.0.0.1:{relay.port}/0", prefix=redis_prefix)
        await driver.open()
        try:
            await driver.enqueue_many([req("first")])
            request = req("unseen")
            relay.cut_after_request = True
            with pytest.raises(JobsError) as caught:
                await driver.enqueue_many([request])
            assert caught.value.code == ErrorCode.X_DRIVER_UNAVAILABLE
            assert caught.value.meta["sent"] == "unknown"
            # It landed; the retry on a fresh connection dedupes onto it.
            [again] = await driver.enqueue_many([request])
            assert again.deduped
            assert again.id == request.id
        finally:
            await driver.close()
        nursery.cancel_scope.cancel()


@job(name="lane.wake", input=int, idempotency_key=lambda i: f"lw:{i}")
async def woken(ctx: JobContext[int]) -> None:
    return None


@needs_redis
async def test_the_wake_subscribes_through_the_lane_and_comes_back_after_a_cut(
    redis_prefix: str,
) -> None:
    relay = _CuttingRelay(_target())
    async with trio.open_nursery() as nursery:
        await nursery.start(relay.run)
        driver = redis_driver(f"redis://127.0.0.1:{relay.port}/0", prefix=redis_prefix)
        async with open_jobs(driver, jobs=[woken]) as jobs:
            worker = Worker(jobs, concurrency=2)
            await nursery.start(worker.run)
            wake = driver.wake
            assert wake is not None
            with trio.fail_after(20):
                while not wake.live:  # noqa: ASYNC110 — the probe's round trip
                    await trio.sleep(0.01)
            sessions = wake.sessions
            relay.cut()
            with trio.fail_after(20):
                while wake.sessions == sessions or not wake.live:  # noqa: ASYNC110
                    await trio.sleep(0.02)
            assert isinstance(driver, RedisDriver)
            await worker.drain()
        nursery.cancel_scope.cancel()


@needs_redis
async def test_without_the_lane_the_scripts_and_the_wake_go_through_coredis(
    redis_url: str, redis_prefix: str
) -> None:
    # The path a rediss:// URL takes (lane_for answers None): coredis's
    # registered scripts and its pub/sub.
    driver = redis_driver(redis_url, prefix=redis_prefix)
    async with open_jobs(driver, jobs=[woken]) as jobs:
        driver._close_lane()
        assert driver._lane is None
        await woken.enqueue_many(range(20))
        worker = Worker(jobs, concurrency=4)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            wake = driver.wake
            assert wake is not None
            # live: the probe published through coredis came back on its pub/sub.
            with trio.fail_after(20):
                while worker.stats().done < 20 or not wake.live:  # noqa: ASYNC110
                    await trio.sleep(0.02)
            await woken.enqueue(99)
            with trio.fail_after(20):
                while worker.stats().done < 21:  # noqa: ASYNC110
                    await trio.sleep(0.02)
            await worker.drain()
        assert sum(s.done for s in await driver.stats()) == 21
