"""Structured logs (spec: "Observability", "Operating a queue", "The deadline
cancels", "Idle cost and pickup latency", the outbox): every event the spec
names is emitted with the job's id, attempt and code, and never a payload
value; ``trio_jobs.logging.configure(json=True)`` renders them as JSON lines."""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Sequence
from typing import Any

import attrs
import orjson
import pytest
import trio

import trio_jobs.logging as tj_logging
from jobs_support import jobs_on_memory, running_worker, wait_for, wait_state
from trio_jobs import JobContext, Retry, Worker, job, open_jobs
from trio_jobs.drivers import ClaimOptions, EnqueueRequest, EnqueueResult
from trio_jobs.drivers.memory import MemoryDriver
from trio_jobs.errors import ErrorCode, JobsError
from trio_jobs.outbox import OutboxBatch, OutboxRow, Relay
from trio_jobs.outbox._codec import encode_job

#: A payload value: it is the input, and the idempotency key is built from it.
SECRET = "tok_live_SECRET_42"


@attrs.frozen
class Card:
    key: str = SECRET


def records(caplog: Any, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == event]


def check_event(record: logging.LogRecord, job_id: str | None = None) -> dict[str, Any]:
    """The record is in the catalogue, at its level, with its fields and the job's
    id, attempt and code, and no payload value anywhere."""
    event = record.event
    assert event in tj_logging.EVENTS, f"{event} is not in trio_jobs.logging.EVENTS"
    level, catalogued, _meaning = tj_logging.EVENTS[event]
    assert record.levelname.lower() == level
    fields = tj_logging.fields_of(record)
    assert set(fields) <= set(catalogued), (
        f"{event}: fields not catalogued: {set(fields) - set(catalogued)}"
    )
    if set(tj_logging.JOB_FIELDS) <= set(catalogued):
        for name in tj_logging.JOB_FIELDS:
            assert fields.get(name) is not None, f"{event} lacks {name}: {fields}"
        assert isinstance(fields["attempt"], int)
        assert str(fields["code"]).startswith("X_")
        if job_id is not None:
            assert fields["job_id"] == job_id
    rendered = tj_logging.JsonFormatter().format(record)
    assert SECRET not in rendered
    assert SECRET not in repr(record.__dict__)
    return fields


# --------------------------------------------------------------------------- the worker's events


class FailingBeats:
    def __init__(self, driver: Any) -> None:
        self.real = driver.heartbeat
        self.failing = False
        driver.heartbeat = self

    async def __call__(self, requests: Sequence[Any], visibility_timeout: float) -> list[str]:
        if self.failing:
            raise JobsError(ErrorCode.X_DRIVER_UNAVAILABLE, "the database is away")
        return await self.real(requests, visibility_timeout)


async def test_heartbeat_failed_and_lease_lost(autojump_clock: Any, caplog: Any) -> None:
    @job(input=Card, idempotency_key=lambda i: f"card:{i.key}", retry=Retry(attempts=3))
    async def holds(ctx: JobContext[Card]) -> None:
        if ctx.attempt == 1:
            await trio.sleep_forever()

    async with jobs_on_memory([holds]) as (jobs, driver):
        beats = FailingBeats(driver)
        enq = await holds.enqueue(Card())
        async with running_worker(jobs, visibility_timeout="30s"):
            await trio.sleep(1)
            beats.failing = True
            await wait_for(lambda: records(caplog, "jobs.lease.lost"))
            beats.failing = False
            await wait_state(jobs, enq.id, "done")
    failed = records(caplog, "jobs.heartbeat.failed")
    assert len(failed) >= 2
    fields = check_event(failed[0], enq.id)
    assert fields["code"] == ErrorCode.X_DRIVER_UNAVAILABLE
    assert fields["cause"] == "JobsError"
    assert fields["attempt"] == 1
    lost = check_event(records(caplog, "jobs.lease.lost")[0], enq.id)
    assert lost["code"] == ErrorCode.X_JOB_LEASE_LOST
    assert lost["queue"] == "default"


async def test_timeout_abandoned(autojump_clock: Any, caplog: Any) -> None:
    @job(
        input=Card,
        idempotency_key=lambda i: f"card:{i.key}",
        timeout="5s",
        retry=Retry(attempts=3),
    )
    async def stubborn(ctx: JobContext[Card]) -> None:
        if ctx.attempt == 1:
            with trio.CancelScope(shield=True):
                await trio.sleep(200)  # ignores its abort

    async with jobs_on_memory([stubborn]) as (jobs, _driver):
        enq = await stubborn.enqueue(Card())
        async with running_worker(jobs, visibility_timeout="30s", drain_timeout="30s"):
            await wait_state(jobs, enq.id, "done")
            await wait_for(lambda: records(caplog, "jobs.timeout.abandoned"))
    fields = check_event(records(caplog, "jobs.timeout.abandoned")[0], enq.id)
    assert fields["code"] == ErrorCode.X_JOB_TIMEOUT
    assert fields["attempt"] == 1


async def test_drain_abandoned(autojump_clock: Any, caplog: Any) -> None:
    @job(input=Card, idempotency_key=lambda i: f"card:{i.key}")
    async def deaf(ctx: JobContext[Card]) -> None:
        with trio.CancelScope(shield=True):
            await trio.sleep(100)

    async with jobs_on_memory([deaf]) as (jobs, _driver):
        enq = await deaf.enqueue(Card())
        worker = Worker(jobs, drain_timeout="1s")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await wait_state(jobs, enq.id, "running")
            await worker.drain()
    fields = check_event(records(caplog, "jobs.drain.abandoned")[0], enq.id)
    assert fields["code"] == ErrorCode.X_DRAINING


async def test_settle_unowned(autojump_clock: Any, caplog: Any) -> None:
    @job(input=Card, idempotency_key=lambda i: f"card:{i.key}")
    async def quick(ctx: JobContext[Card]) -> str:
        return "ok"

    async with jobs_on_memory([quick]) as (jobs, driver):

        async def refused(job_id: str, options: Any) -> bool:
            return False  # the fence no longer holds: another claim owns the row

        driver.ack = refused  # type: ignore[method-assign]
        enq = await quick.enqueue(Card())
        async with running_worker(jobs):
            await wait_for(lambda: records(caplog, "jobs.settle.unowned"))
    fields = check_event(records(caplog, "jobs.settle.unowned")[0], enq.id)
    assert fields["code"] == ErrorCode.X_JOB_LEASE_LOST
    assert fields["attempt"] == 1


async def test_claim_exhausted(autojump_clock: Any, caplog: Any) -> None:
    @job(input=Card, idempotency_key=lambda i: f"card:{i.key}", retry=Retry(attempts=1))
    async def doomed(ctx: JobContext[Card]) -> None:
        return None

    async with jobs_on_memory([doomed]) as (jobs, driver):
        enq = await doomed.enqueue(Card())
        # a worker claimed it and died: nothing renews the lease on its final attempt
        held = await driver.claim(
            ClaimOptions(worker_id="dead-worker", queues={"default": 1}, visibility_timeout=5.0)
        )
        assert len(held.jobs) == 1
        async with running_worker(jobs):
            await wait_state(jobs, enq.id, "dead")
            await wait_for(lambda: records(caplog, "jobs.claim.exhausted"))
    fields = check_event(records(caplog, "jobs.claim.exhausted")[0], enq.id)
    assert fields["attempt"] == 1
    assert fields["code"] == ErrorCode.X_JOB_LEASE_LOST


async def test_on_settled_failed(autojump_clock: Any, caplog: Any) -> None:
    def hook(settled: Any) -> None:
        raise ValueError(f"could not mark {SECRET}")  # its message quotes the payload

    @job(input=Card, idempotency_key=lambda i: f"card:{i.key}", on_settled=hook)
    async def noted(ctx: JobContext[Card]) -> str:
        return "ok"

    async with jobs_on_memory([noted]) as (jobs, _driver):
        enq = await noted.enqueue(Card())
        async with running_worker(jobs):
            await wait_for(lambda: records(caplog, "jobs.on_settled.failed"))
    fields = check_event(records(caplog, "jobs.on_settled.failed")[0], enq.id)
    assert fields["code"] == ErrorCode.X_JOB_ON_SETTLED_FAILED
    assert fields["cause"] == "ValueError"
    assert fields["attempt"] == 1


async def test_a_job_failure_logs_nothing_that_quotes_the_payload(
    autojump_clock: Any, caplog: Any
) -> None:
    @job(input=Card, idempotency_key=lambda i: f"card:{i.key}", retry=Retry(attempts=2))
    async def loud(ctx: JobContext[Card]) -> None:
        raise RuntimeError(f"declined {ctx.input.key}")

    async with jobs_on_memory([loud]) as (jobs, _driver):
        enq = await loud.enqueue(Card())
        async with running_worker(jobs):
            await wait_state(jobs, enq.id, "dead")
    for record in caplog.records:
        if record.name.startswith("trio_jobs"):
            assert SECRET not in tj_logging.JsonFormatter().format(record)
            assert SECRET not in record.getMessage()


# --------------------------------------------------------------------------- the outbox relay


class FakeOutbox:
    """Just enough of an outbox store for one relay pass over ``rows``."""

    name = "fake"
    wake = None
    mark_published_many = None

    def __init__(self, rows: list[OutboxRow]) -> None:
        self.rows = rows
        self.released: list[str] = []

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def transaction(self) -> Any:
        raise NotImplementedError

    async def claim(self, limit: int, lease: float) -> OutboxBatch:
        rows, self.rows = self.rows[:limit], self.rows[limit:]
        return OutboxBatch(rows, now=1.0 if rows else 0.0)

    async def mark_published(self, row_id: str) -> None:
        return None

    async def release(self, rows: Sequence[OutboxRow], **kw: Any) -> None:
        self.released += [r.id for r in rows]

    async def purge(self, older_than: float, limit: int) -> int:
        return 0


class RefusingDriver(MemoryDriver):
    async def enqueue_many(self, requests: Sequence[EnqueueRequest]) -> list[EnqueueResult]:
        raise JobsError(ErrorCode.X_INVARIANT, f"refused {requests[0].payload}")


async def test_outbox_publish_failed_names_the_job_never_its_payload(caplog: Any) -> None:
    request = EnqueueRequest(
        id="6a0f4b5e-1d2c-4c3b-9a8e-7f6d5c4b3a21",
        run_id="0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d",
        name="charge",
        queue="default",
        payload={"card": SECRET},
        idempotency_key=f"charge:{SECRET}",
        max_attempts=3,
    )
    row = OutboxRow(
        seq=1, id="row-1", data=encode_job(request), staged_at=0.0, attempts=2, lease_until=9.0
    )
    store = FakeOutbox([row])
    async with open_jobs(RefusingDriver(), jobs=[], outbox=store) as jobs:  # type: ignore[arg-type]
        published = await Relay(jobs).relay_once()
    assert published == 0
    fields = check_event(records(caplog, "jobs.outbox.publish-failed")[0], request.id)
    assert fields["code"] == ErrorCode.X_INVARIANT
    assert fields["attempt"] == 2
    assert fields["row_id"] == "row-1"


# --------------------------------------------------------------------------- the wake (PostgreSQL)


@pytest.fixture
def pg_dsn() -> str:
    dsn = os.environ.get("DATABASE_URL")
    if not dsn:
        pytest.skip("set DATABASE_URL to check the wake's events against PostgreSQL")
    return dsn


@pytest.mark.postgres
@pytest.mark.parametrize("probe_returns", [True, False], ids=["live", "unverified"])
async def test_wake_live_and_unverified(
    pg_dsn: str, probe_returns: bool, caplog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uuid

    import psycopg

    from trio_jobs.drivers import _push_wake
    from trio_jobs.drivers.postgres import postgres_driver

    monkeypatch.setattr(_push_wake, "PROBE_TIMEOUT", 1.0)
    schema = f"tj_logs_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        if not probe_returns:
            # PgBouncer in transaction mode: a probe sent through the pool never arrives
            from trio_jobs.drivers.postgres import PostgresDriver

            async def lost(self: Any, token: str) -> None:
                return None

            monkeypatch.setattr(PostgresDriver, "_send_probe", lost)
        driver = postgres_driver(pg_dsn, schema=schema)
        async with open_jobs(driver, jobs=[]) as jobs:
            event = "jobs.wake.live" if probe_returns else "jobs.wake.unverified"
            async with trio.open_nursery() as nursery:
                worker = Worker(jobs, queues=["default"])
                await nursery.start(worker.run)
                with trio.fail_after(15):
                    await wait_for(lambda: records(caplog, event), step=0.05)
                await worker.drain()
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    fields = check_event(records(caplog, event)[0])
    assert fields["channel"]


# --------------------------------------------------------------------------- rendering


def test_configure_renders_json_lines_with_the_events_fields() -> None:
    out = io.StringIO()
    tj_logging.configure(json=True, stream=out)
    log = logging.getLogger("trio_jobs")
    log.error(
        "jobs.lease.lost",
        extra={
            "event": "jobs.lease.lost",
            "job_id": "j1",
            "attempt": 2,
            "queue": "default",
            "code": ErrorCode.X_JOB_LEASE_LOST,
            "worker_id": "w1",
        },
    )
    try:
        raise ValueError(f"boom {SECRET}")
    except ValueError:
        logging.getLogger("trio_jobs.postgres").exception(
            "jobs.worker.slot-failed",
            extra={"event": "jobs.worker.slot-failed", "job_id": "j2", "attempt": 1},
        )
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (orjson.loads(line) for line in lines)
    assert first["event"] == "jobs.lease.lost"
    assert first["level"] == "error"
    assert first["logger"] == "trio_jobs"
    assert (first["job_id"], first["attempt"], first["code"]) == ("j1", 2, "X_JOB_LEASE_LOST")
    assert first["ts"].endswith("Z")
    assert second["exception"] == "ValueError"
    assert "message withheld" in second["traceback"]
    assert SECRET not in out.getvalue()


def test_configure_again_replaces_its_handler_and_text_mode_is_one_line() -> None:
    out = io.StringIO()
    tj_logging.configure(json=True, stream=io.StringIO())
    tj_logging.configure(json=False, stream=out)
    logger = logging.getLogger("trio_jobs")
    assert len([h for h in logger.handlers if h.get_name() == "trio_jobs.logging"]) == 1
    assert logger.propagate is False
    logger.warning(
        "jobs.settle.unowned",
        extra={
            "event": "jobs.settle.unowned",
            "job_id": "j",
            "attempt": 1,
            "code": "X_JOB_LEASE_LOST",
        },
    )
    line = out.getvalue().strip()
    assert "jobs.settle.unowned" in line
    assert "job_id=j attempt=1 code=X_JOB_LEASE_LOST" in line


def test_every_catalogued_job_event_lists_the_job_fields() -> None:
    spec_named = {
        "jobs.lease.lost",
        "jobs.heartbeat.failed",
        "jobs.timeout.abandoned",
        "jobs.settle.unowned",
        "jobs.claim.exhausted",
        "jobs.wake.live",
        "jobs.wake.unverified",
        "jobs.outbox.publish-failed",
        "jobs.on_settled.failed",
    }
    assert spec_named <= set(tj_logging.EVENTS)
    for event in spec_named - {"jobs.wake.live", "jobs.wake.unverified"}:
        assert set(tj_logging.JOB_FIELDS) <= set(tj_logging.EVENTS[event][1]), event


@pytest.mark.postgres
async def test_the_postgres_claim_reports_the_exhausted_attempt(pg_dsn: str) -> None:
    """``jobs.claim.exhausted`` names the attempt: the driver's ``Exhausted`` carries it."""
    import uuid

    import psycopg

    from trio_jobs.drivers.postgres import postgres_driver

    class Clock:
        t = 1_800_000_000.0

        def now(self) -> float:
            return self.t

    @job(input=Card, idempotency_key=lambda i: f"card:{i.key}", retry=Retry(attempts=1))
    async def doomed(ctx: JobContext[Card]) -> None:
        return None

    clock = Clock()
    schema = f"tj_logs_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        async with open_jobs(
            postgres_driver(pg_dsn, schema=schema, clock=clock), jobs=[doomed]
        ) as jobs:
            enq = await doomed.enqueue(Card())
            options = ClaimOptions(worker_id="w1", queues={"default": 1}, visibility_timeout=5.0)
            first = await jobs.driver.claim(options)
            assert [j.attempt for j in first.jobs] == [1]
            clock.t += 60  # the holder died: its lease lapsed on the final attempt
            second = await jobs.driver.claim(attrs.evolve(options, worker_id="w2"))
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    assert second.jobs == []
    assert [(e.id, e.attempt, e.state) for e in second.exhausted] == [(enq.id, 1, "dead")]
