"""Settles and step records ride out a short PostgreSQL outage, with real disconnects.

The outage is made by a TCP proxy this test runs between its own driver and
the server: ``cut()`` closes every connection through it (libpq sees the server
hang up, as in a restart) and refuses new ones until ``restore()``; ``hold()``
lets statements through but keeps the server's replies back, so a settle can
commit while its answer is lost. Only this test's connections go through its
proxy, and each test has its own schema: the shared server and the other tests
never notice. Nothing is mocked: every statement runs on the real server.

Before this was built, a settle that met the outage was given up: the row stayed
``running`` until its lease lapsed and the job was redelivered with an attempt
counted (25-30 per chaos soak, ``simulation/SOAK.md``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest
import trio
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from trio_jobs import JobContext, Worker, job, open_jobs
from trio_jobs._context import WRITE_BUDGET
from trio_jobs._write_retry import RETRY_CAP
from trio_jobs.drivers import AckOptions, ClaimOptions, NackOptions
from trio_jobs.drivers.postgres import PostgresDriver, postgres_driver
from trio_jobs.errors import ErrorCode, JobsError

from .conftest import FakeClock, req, sql

pytestmark = pytest.mark.postgres


class Proxy:
    """A TCP proxy to the PostgreSQL server, for one test's driver."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.server_port = port
        self.port = 0
        self.refusing = False
        self.connections = 0
        self._released = trio.Event()
        self._released.set()
        self._scopes: set[trio.CancelScope] = set()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, client: trio.SocketStream) -> None:
        async with client:
            if self.refusing:
                return
            # The scope is known to cut() before the server connection opens: a
            # connection still opening when the proxy is cut is hung up too (it
            # used to escape the cut, and a statement then went through).
            with trio.CancelScope() as scope:
                self._scopes.add(scope)
                try:
                    try:
                        server = await trio.open_tcp_stream(self.host, self.server_port)
                    except OSError:
                        return
                    async with server:
                        if self.refusing:
                            return
                        self.connections += 1
                        async with trio.open_nursery() as nursery:
                            both = nursery.cancel_scope
                            nursery.start_soon(self._pump, client, server, False, both)
                            nursery.start_soon(self._pump, server, client, True, both)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass
                finally:
                    self._scopes.discard(scope)

    async def _pump(
        self,
        src: trio.SocketStream,
        dst: trio.SocketStream,
        reply: bool,
        both: trio.CancelScope,
    ) -> None:
        try:
            while True:
                data = await src.receive_some(65536)
                if not data:
                    break
                if reply:
                    await self._released.wait()
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        both.cancel()

    def hold(self) -> None:
        """Statements still reach the server; its replies wait here."""
        self._released = trio.Event()

    def cut(self) -> None:
        """Hang up every connection (dropping held replies) and refuse new ones."""
        self.refusing = True
        for scope in list(self._scopes):
            scope.cancel()
        self._released.set()

    def restore(self) -> None:
        self.refusing = False
        self._released.set()


@pytest.fixture
async def proxy(pg_dsn: str) -> AsyncIterator[Proxy]:
    params = conninfo_to_dict(pg_dsn)
    host = str(params.get("host") or "")
    if not host or host.startswith("/"):
        pytest.skip("the PostgreSQL server is reached over a Unix socket: no TCP to cut")
    proxy = Proxy(host, int(params.get("port") or 5432))
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.serve)
        yield proxy
        nursery.cancel_scope.cancel()


def proxied(pg_dsn: str, proxy: Proxy) -> str:
    params = conninfo_to_dict(pg_dsn)
    params.update(host="127.0.0.1", port=str(proxy.port), sslmode="disable")
    params["application_name"] = f"tj-write-retry-{uuid.uuid4().hex[:8]}"
    return make_conninfo("", **params)


@pytest.fixture
async def pdriver(pg_dsn: str, pg_schema: str, proxy: Proxy) -> AsyncIterator[PostgresDriver]:
    d = postgres_driver(proxied(pg_dsn, proxy), schema=pg_schema)
    await d.open()
    try:
        yield d
    finally:
        proxy.restore()
        await d.close()


async def row(pg_dsn: str, schema: str, job_id: str) -> tuple[Any, ...]:
    rows = await trio.to_thread.run_sync(
        sql, pg_dsn, schema, "SELECT state, attempts FROM trio_jobs_jobs WHERE id = %s", (job_id,)
    )
    return rows[0]


async def counted(pg_dsn: str, schema: str, name: str) -> tuple[int, int, int, int]:
    rows = await trio.to_thread.run_sync(
        sql,
        pg_dsn,
        schema,
        "SELECT coalesce(sum(done), 0), coalesce(sum(retried), 0), coalesce(sum(failed), 0), "
        "coalesce(sum(dead), 0) FROM trio_jobs_counters WHERE name = %s",
        (name,),
    )
    return tuple(int(x) for x in rows[0])  # type: ignore[return-value]


async def until(check: Any, *, timeout: float = 30.0, what: str = "condition") -> Any:
    with trio.move_on_after(timeout):
        while True:
            value = await check()
            if value:
                return value
            await trio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def events(caplog: Any, event: str) -> list[logging.LogRecord]:
    return [
        r for r in caplog.records if r.name == "trio_jobs" and getattr(r, "event", None) == event
    ]


# --------------------------------------------------------------------------- the driver


async def _claim_one(d: PostgresDriver, key: str, name: str = "job") -> Any:
    await d.enqueue_many([req(key, name=name)])
    got = await d.claim(ClaimOptions("w1", {"default": 1}, 30.0))
    assert len(got.jobs) == 1
    return got.jobs[0]


async def _lost_answer(
    d: PostgresDriver, proxy: Proxy, pg_dsn: str, schema: str, job_id: str, call: Any, state: str
) -> None:
    """Run ``call`` while replies are held; once the row shows ``state`` (the
    statement committed), hang up: the call raises, its answer lost."""
    proxy.hold()
    failure: list[BaseException] = []

    async def settle() -> None:
        try:
            await call()
        except JobsError as exc:
            failure.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(settle)

        async def committed() -> bool:
            return (await row(pg_dsn, schema, job_id))[0] == state

        await until(committed, what=f"the settle to commit ({state})")
        proxy.cut()
    assert failure, "the settle should have lost its answer"
    assert isinstance(failure[0], JobsError)
    assert failure[0].code == ErrorCode.X_DRIVER_UNAVAILABLE
    proxy.restore()


async def test_an_ack_whose_answer_was_lost_answers_landed_when_retried(
    pdriver: PostgresDriver, proxy: Proxy, pg_dsn: str, pg_schema: str
) -> None:
    d = pdriver
    job = await _claim_one(d, "a", "acked")
    ack = AckOptions(fence=job.fence, result={"r": 1}, duration=0.5)
    await _lost_answer(d, proxy, pg_dsn, pg_schema, job.id, lambda: d.ack(job.id, ack), "done")
    assert await d.ack(job.id, ack)  # the retry recognises its own landed settle
    assert await row(pg_dsn, pg_schema, job.id) == ("done", 1)
    assert await counted(pg_dsn, pg_schema, "acked") == (1, 0, 0, 0)  # counted once
    view = await d.introspect.show(job.id)  # type: ignore[union-attr]
    assert view.result == {"r": 1}
    assert view.worker_id is None
    # after a clean answer, a second settle is refused as ever
    assert not await d.ack(job.id, ack)


async def test_a_nack_whose_answer_was_lost_answers_landed_when_retried(
    pdriver: PostgresDriver, proxy: Proxy, pg_dsn: str, pg_schema: str
) -> None:
    d = pdriver
    job = await _claim_one(d, "n", "nacked")
    nack = NackOptions(fence=job.fence, state="ready", counted=True, delay=60.0, error_code="X_E")
    await _lost_answer(d, proxy, pg_dsn, pg_schema, job.id, lambda: d.nack(job.id, nack), "ready")
    assert await d.nack(job.id, nack)
    assert await row(pg_dsn, pg_schema, job.id) == ("ready", 1)
    assert await counted(pg_dsn, pg_schema, "nacked") == (0, 1, 0, 0)
    assert not await d.nack(job.id, nack)


async def test_an_uncounted_hand_back_whose_answer_was_lost_gives_the_attempt_back_once(
    pdriver: PostgresDriver, proxy: Proxy, pg_dsn: str, pg_schema: str
) -> None:
    d = pdriver
    job = await _claim_one(d, "u", "drained")
    nack = NackOptions(fence=job.fence, state="ready", counted=False)
    await _lost_answer(d, proxy, pg_dsn, pg_schema, job.id, lambda: d.nack(job.id, nack), "ready")
    assert await d.nack(job.id, nack)
    assert await row(pg_dsn, pg_schema, job.id) == ("ready", 0)
    assert await counted(pg_dsn, pg_schema, "drained") == (0, 0, 0, 0)


async def test_a_burial_whose_answer_was_lost_is_counted_once(
    pdriver: PostgresDriver, proxy: Proxy, pg_dsn: str, pg_schema: str
) -> None:
    d = pdriver
    job = await _claim_one(d, "b", "buried")
    nack = NackOptions(fence=job.fence, state="dead", error_code="X_E", last_error="gave up")
    await _lost_answer(d, proxy, pg_dsn, pg_schema, job.id, lambda: d.nack(job.id, nack), "dead")
    assert await d.nack(job.id, nack)
    assert await counted(pg_dsn, pg_schema, "buried") == (0, 0, 0, 1)


async def test_a_retry_whose_first_try_never_reached_the_server_lands_it(
    pdriver: PostgresDriver, proxy: Proxy, pg_dsn: str, pg_schema: str
) -> None:
    d = pdriver
    job = await _claim_one(d, "f", "first")
    proxy.cut()
    with pytest.raises(JobsError) as err:
        await d.ack(job.id, AckOptions(fence=job.fence))
    assert err.value.code == ErrorCode.X_DRIVER_UNAVAILABLE
    assert await row(pg_dsn, pg_schema, job.id) == ("running", 1)
    proxy.restore()
    assert await d.ack(job.id, AckOptions(fence=job.fence))
    assert await counted(pg_dsn, pg_schema, "first") == (1, 0, 0, 0)


async def test_a_retry_after_the_lease_lapsed_is_refused(
    pg_dsn: str, pg_schema: str, proxy: Proxy, clock: FakeClock
) -> None:
    d = postgres_driver(proxied(pg_dsn, proxy), schema=pg_schema, clock=clock)
    await d.open()
    try:
        job = await _claim_one(d, "l", "lapsed")
        proxy.cut()
        with pytest.raises(JobsError):
            await d.ack(job.id, AckOptions(fence=job.fence))
        clock.advance(31.0)
        proxy.restore()
        assert not await d.ack(job.id, AckOptions(fence=job.fence))
        assert await row(pg_dsn, pg_schema, job.id) == ("running", 1)
        # reaped and claimed by another worker: the old claim's retry is still refused
        again = await d.claim(ClaimOptions("w2", {"default": 1}, 30.0))
        assert [j.id for j in again.jobs] == [job.id]
        proxy.cut()
        with pytest.raises(JobsError):
            await d.ack(job.id, AckOptions(fence=job.fence))
        proxy.restore()
        assert not await d.ack(job.id, AckOptions(fence=job.fence))
        assert await d.ack(job.id, AckOptions(fence=again.jobs[0].fence))
        assert await counted(pg_dsn, pg_schema, "lapsed") == (1, 0, 0, 0)
    finally:
        proxy.restore()
        await d.close()


async def test_the_batched_ack_answers_each_row_on_its_own(
    driver: PostgresDriver, pg_dsn: str, pg_schema: str
) -> None:
    """``ack_many`` with retries and first tries in one statement."""
    d = driver
    await d.enqueue_many([req(k, name="batch") for k in ("a", "b", "c", "d")])
    jobs = {j.idempotency_key: j for j in (await d.claim(_claim4())).jobs}
    a, b, c, e = jobs["a"], jobs["b"], jobs["c"], jobs["d"]
    assert await d.ack(a.id, AckOptions(fence=a.fence))  # landed earlier, answer "lost"
    landed = await d._flush_acks(
        [
            (a.id, AckOptions(fence=a.fence), True),  # a retry of a landed ack
            (b.id, AckOptions(fence=b.fence), False),  # a first try
            (c.id, AckOptions(fence=c.fence), True),  # a retry whose first try never landed
            (e.id, AckOptions(fence=b.fence), True),  # a retry with a fence not its own
        ]
    )
    assert landed == {1, 2, 3}
    assert await counted(pg_dsn, pg_schema, "batch") == (3, 0, 0, 0)
    assert (await row(pg_dsn, pg_schema, e.id))[0] == "running"


def _claim4() -> ClaimOptions:
    return ClaimOptions("w1", {"default": 4}, 30.0)


# --------------------------------------------------------------------------- a worker


gate = trio.Event()
ran: list[str] = []


@attrs.frozen
class Key:
    key: str


@job(input=Key, idempotency_key=lambda i: i.key, name="pgwr.gated")
async def gated(ctx: JobContext[Key]) -> str:
    ran.append(f"{ctx.input.key}:{ctx.attempt}")
    await gate.wait()
    return "ok"


@job(input=Key, idempotency_key=lambda i: i.key, name="pgwr.stepped")
async def stepped(ctx: JobContext[Key]) -> int:
    async def effect() -> int:
        ran.append(f"{ctx.input.key}:{ctx.attempt}")
        await gate.wait()
        return 41

    return int(await ctx.step.run("effect", effect)) + 1


@pytest.fixture(autouse=True)
def _fresh() -> None:
    global gate
    gate = trio.Event()
    ran.clear()


async def _running(jobs: Any, nursery: trio.Nursery, **options: Any) -> Worker:
    worker = Worker(jobs, poll_interval="50ms", **options)
    await nursery.start(worker.run)
    return worker


async def test_a_worker_whose_ack_meets_an_outage_settles_once_it_is_back(
    pdriver: PostgresDriver, proxy: Proxy, pg_dsn: str, pg_schema: str, caplog: Any
) -> None:
    caplog.set_level(logging.INFO, logger="trio_jobs")
    async with open_jobs(pdriver, jobs=[gated]) as jobs:
        enq = await gated.enqueue(Key("k"))
        async with trio.open_nursery() as nursery:
            worker = await _running(jobs, nursery, visibility_timeout="10s")
            await until(lambda: _true(ran == ["k:1"]), what="the body to start")
            proxy.cut()  # the server is gone (every session hung up)...
            gate.set()  # ...as the body returns and the worker settles
            await trio.sleep(1.5)
            assert (await row(pg_dsn, pg_schema, enq.id)) == ("running", 1)
            proxy.restore()  # back after 1.5 s

            async def done() -> bool:
                return (await row(pg_dsn, pg_schema, enq.id))[0] == "done"

            await until(done, timeout=10.0, what="the settle to land")
            assert worker.stats().done == 1
            await worker.drain()
    assert await row(pg_dsn, pg_schema, enq.id) == ("done", 1)  # no attempt counted
    assert ran == ["k:1"]  # never redelivered
    assert await counted(pg_dsn, pg_schema, "pgwr.gated") == (1, 0, 0, 0)
    assert events(caplog, "jobs.settle.retry")
    assert not events(caplog, "jobs.settle.unowned")
    assert not events(caplog, "jobs.settle.failed")


async def test_a_worker_whose_ack_committed_but_lost_its_answer_counts_it_done_once(
    pdriver: PostgresDriver, proxy: Proxy, pg_dsn: str, pg_schema: str, caplog: Any
) -> None:
    caplog.set_level(logging.INFO, logger="trio_jobs")
    async with open_jobs(pdriver, jobs=[gated]) as jobs:
        enq = await gated.enqueue(Key("r"))
        async with trio.open_nursery() as nursery:
            worker = await _running(jobs, nursery, visibility_timeout="10s")
            await until(lambda: _true(ran == ["r:1"]), what="the body to start")
            # Idle pooled connections for the ack: once replies are held, a new
            # connection cannot finish its handshake, so an ack that had to open
            # one would never reach the server (on a loaded box the claim and the
            # heartbeat could hold every connection the pool had).
            async with trio.open_nursery() as warm:
                for _ in range(6):
                    warm.start_soon(pdriver.db.fetch, "SELECT pg_sleep(0.05)")
            proxy.hold()
            gate.set()

            async def committed() -> bool:
                return (await row(pg_dsn, pg_schema, enq.id))[0] == "done"

            await until(committed, what="the ack to commit")
            proxy.cut()  # its answer is lost with the connection
            await trio.sleep(1.0)
            proxy.restore()
            await until(lambda: _true(worker.stats().done == 1), timeout=10.0, what="done")
            await worker.drain()
    assert await row(pg_dsn, pg_schema, enq.id) == ("done", 1)
    assert await counted(pg_dsn, pg_schema, "pgwr.gated") == (1, 0, 0, 0)
    assert worker.stats().leases_lost == 0
    assert events(caplog, "jobs.settle.retry")
    assert not events(caplog, "jobs.settle.unowned")


async def test_a_worker_whose_step_record_meets_an_outage_records_it_once_back(
    pdriver: PostgresDriver, proxy: Proxy, pg_dsn: str, pg_schema: str, caplog: Any
) -> None:
    caplog.set_level(logging.INFO, logger="trio_jobs")
    async with open_jobs(pdriver, jobs=[stepped]) as jobs:
        enq = await stepped.enqueue(Key("s"))
        async with trio.open_nursery() as nursery:
            worker = await _running(jobs, nursery, visibility_timeout="10s")
            await until(lambda: _true(ran == ["s:1"]), what="the step to start")
            proxy.cut()
            gate.set()  # the step's fn returns: its record meets the outage
            await trio.sleep(1.5)
            proxy.restore()
            await until(lambda: _true(worker.stats().done == 1), timeout=10.0, what="done")
            await worker.drain()
        view = await jobs.show(enq.id)
    assert (view.state, view.attempts, view.result) == ("done", 1, 42)
    assert [(s.name, s.status, s.executions) for s in view.steps] == [("effect", "completed", 1)]
    assert ran == ["s:1"]  # the effect ran once
    assert events(caplog, "jobs.step.retry")


async def test_retries_stop_when_the_lease_is_gone_and_the_run_is_redelivered(
    pdriver: PostgresDriver, proxy: Proxy, pg_dsn: str, pg_schema: str, caplog: Any
) -> None:
    caplog.set_level(logging.INFO, logger="trio_jobs")
    async with open_jobs(pdriver, jobs=[gated]) as jobs:
        enq = await gated.enqueue(Key("g"))
        async with trio.open_nursery() as nursery:
            # A 3 s lease: shorter than the outage below and than the write budget.
            worker = await _running(jobs, nursery, visibility_timeout="3s")
            await until(lambda: _true(ran == ["g:1"]), what="the body to start")
            proxy.cut()
            began = trio.current_time()
            gate.set()
            await until(
                lambda: _true(events(caplog, "jobs.settle.unowned")),
                timeout=3.0 + RETRY_CAP + 3.0,
                what="the settle to give up",
            )
            assert trio.current_time() - began <= 3.0 + RETRY_CAP + 1.5
            assert events(caplog, "jobs.settle.retry")
            await trio.sleep(max(0.0, 4.5 - (trio.current_time() - began)))
            proxy.restore()  # back after 4.5 s: the lease lapsed meanwhile

            async def done() -> bool:
                return (await row(pg_dsn, pg_schema, enq.id))[0] == "done"

            await until(done, timeout=15.0, what="the redelivery to finish")
            await worker.drain()
    assert await row(pg_dsn, pg_schema, enq.id) == ("done", 2)  # redelivered, as before
    assert ran == ["g:1", "g:2"]
    assert await counted(pg_dsn, pg_schema, "pgwr.gated") == (1, 0, 0, 0)


async def test_a_drain_during_the_retries_completes_within_the_budget(
    pdriver: PostgresDriver, proxy: Proxy, pg_dsn: str, pg_schema: str, caplog: Any
) -> None:
    caplog.set_level(logging.INFO, logger="trio_jobs")
    async with open_jobs(pdriver, jobs=[gated]) as jobs:
        enq = await gated.enqueue(Key("d"))
        async with trio.open_nursery() as nursery:
            worker = await _running(jobs, nursery, visibility_timeout="10s", drain_timeout="1s")
            await until(lambda: _true(ran == ["d:1"]), what="the body to start")
            proxy.cut()
            gate.set()
            await until(lambda: _true(events(caplog, "jobs.settle.retry")), what="a retry")
            began = trio.current_time()

            async def back() -> None:
                await trio.sleep(1.5)
                proxy.restore()

            nursery.start_soon(back)
            await worker.drain()  # SIGTERM while the database is down
            drained_in = trio.current_time() - began
    assert drained_in < WRITE_BUDGET
    assert 1.5 <= drained_in <= 1.5 + RETRY_CAP + 2.0
    assert await row(pg_dsn, pg_schema, enq.id) == ("done", 1)
    assert (worker.stats().done, worker.stats().abandoned) == (1, 0)
    assert not events(caplog, "jobs.settle.unowned")


async def _true(value: object) -> bool:
    return bool(value)
