"""The PostgreSQL driver with ``dsn`` through a real PgBouncer in transaction mode.

The conformance suite, unchanged, with ``dsn`` through the pooler and
``listen_dsn`` direct; a worker through the pooler without ``listen_dsn`` (the
wake's probe fails, one warning, the worker polls); ``schema=`` carried in the
statements (the pooler here refuses a startup ``options`` outright); and the
pooler's faults — a restart under load, ``server_idle_timeout`` closing server
connections, ``max_client_conn`` reached — ridden out with no attempt counted
and one warning, not one a statement. The end-to-end worker tests run through
the pooler in ``test_pgbouncer_e2e.py``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
import trio
from psycopg.conninfo import make_conninfo

from trio_jobs import JobContext, JobsError, Worker, job, open_jobs
from trio_jobs.drivers.postgres import postgres_driver
from trio_jobs.testing.conformance import ManualClock, Target

from .conftest import direct_dsn, skip_without_bouncer, sql
from .pgbouncer import Bouncer
from .test_conformance import TestPostgresConformance

pytestmark = [pytest.mark.postgres, pytest.mark.server_side]


class TestConformanceThroughPgBouncer(TestPostgresConformance):
    """Every conformance rule with ``dsn`` through the pooler, ``listen_dsn`` direct."""

    @pytest.fixture
    async def target(
        self, pg_dsn: str, pg_schema: str, pgbouncer: Bouncer
    ) -> AsyncIterator[Target]:
        clock = ManualClock()
        driver = postgres_driver(pgbouncer.dsn(), schema=pg_schema, clock=clock, listen_dsn=pg_dsn)
        await driver.open()
        yield Target(driver, clock.advance)
        await driver.close()


def events(caplog: Any, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == name]


@job(name="pooled.noop", input=int, idempotency_key=lambda i: f"noop:{i}")
async def noop(ctx: JobContext[int]) -> int:
    await ctx.step.run("one", lambda: ctx.input)
    return ctx.input


async def run_until_done(jobs: Any, n: int, worker: Worker, timeout: float = 60) -> None:
    with trio.fail_after(timeout):
        while (await jobs.stats())[0].done < n:  # noqa: ASYNC110 — bounded wait on the queue
            await trio.sleep(0.05)


# ------------------------------------------------------------------ schema and statements


async def test_the_tables_land_in_the_schema_through_a_pooler_that_drops_nothing(
    pg_dsn: str, pg_schema: str, pgbouncer: Bouncer
) -> None:
    """The pooler refuses startup ``options`` (no ``ignore_startup_parameters``):
    the driver sends none, and its tables and rows are in ``schema=``'s schema."""
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(pgbouncer.dsn(options="-c search_path=public")).close()
    async with open_jobs(postgres_driver(pgbouncer.dsn(), schema=pg_schema), jobs=[noop]):
        got = await noop.enqueue(1)
    rows = sql(pg_dsn, pg_schema, "SELECT id::text FROM trio_jobs_jobs")
    assert rows == [(got.id,)]
    assert sql(
        pg_dsn,
        pg_schema,
        "SELECT to_regclass(%s) IS NOT NULL",
        (f'"{pg_schema}".trio_jobs_jobs',),
    ) == [(True,)]


async def test_a_search_path_in_the_dsn_options_becomes_the_schema(
    pg_dsn: str, pg_schema: str, pgbouncer: Bouncer
) -> None:
    """A DSN that names its schema in ``options`` (as a direct connection would)
    works through the pooler: the driver lifts it out and names it itself."""
    dsn = pgbouncer.dsn(options=f"-c search_path={pg_schema}")
    async with open_jobs(postgres_driver(dsn), jobs=[noop]) as jobs:
        got = await noop.enqueue(2)
        assert jobs.driver.schema == pg_schema
    assert sql(pg_dsn, pg_schema, "SELECT id::text FROM trio_jobs_jobs") == [(got.id,)]


async def test_a_schema_the_database_lacks_is_refused(pgbouncer: Bouncer) -> None:
    driver = postgres_driver(pgbouncer.dsn(), schema="tj_no_such_schema_here")
    with pytest.raises(JobsError) as caught:
        await driver.open()
    assert caught.value.code == "X_CONFIG_INVALID"
    assert "CREATE SCHEMA" in str(caught.value)


async def test_a_search_path_of_two_schemas_is_refused(pg_dsn: str) -> None:
    # (make_conninfo: the embedded server's DSN carries a query string already)
    driver = postgres_driver(make_conninfo(pg_dsn, options="-c search_path=a,b"))
    with pytest.raises(JobsError) as caught:
        await driver.open()
    assert caught.value.code == "X_CONFIG_INVALID"
    assert "schema=" in str(caught.value)


async def prepared_count(driver: Any) -> int:
    """Run one statement eight times on one pooled connection: how many
    statements that session holds prepared on the server."""
    await driver.open()
    try:
        async with driver.db.pool.connection() as conn:
            for _ in range(8):
                await conn.execute("SELECT 1 WHERE %s::int = 1", (1,))
            cur = await conn.execute("SELECT count(*) FROM pg_prepared_statements")
            return int((await cur.fetchall())[0][0])
    finally:
        await driver.close()


async def test_statements_are_prepared_only_on_a_direct_connection_or_when_told(
    pg_dsn: str, pg_schema: str, pgbouncer: Bouncer
) -> None:
    """psycopg prepares a statement after its fifth run; behind a pooler the
    sixth lands on another server connection. By default the driver prepares
    only where the connection proves to reach the server itself."""
    direct = postgres_driver(pg_dsn, schema=pg_schema)
    assert await prepared_count(direct) >= 1
    assert direct.prepared_statements
    pooled = postgres_driver(pgbouncer.dsn(), schema=pg_schema)
    await pooled.open()
    try:
        assert not pooled.prepared_statements
        async with pooled.db.pool.connection() as conn:
            assert conn.prepare_threshold is None
    finally:
        await pooled.close()
    assert (
        await prepared_count(postgres_driver(pg_dsn, schema=pg_schema, prepared_statements=False))
        == 0
    )
    told = postgres_driver(pgbouncer.dsn(), schema=pg_schema, prepared_statements=True)
    await told.open()
    try:
        assert told.prepared_statements
        async with told.db.pool.connection() as conn:
            assert conn.prepare_threshold is not None
    finally:
        await told.close()


# ------------------------------------------------------------------ the wake


async def test_with_listen_dsn_direct_the_wake_is_live(
    pg_dsn: str, pg_schema: str, pgbouncer: Bouncer, caplog: Any
) -> None:
    caplog.set_level(logging.INFO, logger="trio_jobs")
    async with open_jobs(
        postgres_driver(pgbouncer.dsn(), schema=pg_schema, listen_dsn=pg_dsn), jobs=[noop]
    ) as jobs:
        worker = Worker(jobs, poll_interval="50ms")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(20):
                while not jobs.driver.wake.live:  # noqa: ASYNC110 — bounded wait on the probe
                    await trio.sleep(0.05)
            for i in range(5):
                await noop.enqueue(i)
            await run_until_done(jobs, 5, worker)
            await worker.drain()
    assert not events(caplog, "jobs.wake.unverified")


async def test_without_listen_dsn_the_worker_warns_once_and_polls(
    pg_schema: str, pgbouncer: Bouncer, caplog: Any
) -> None:
    caplog.set_level(logging.INFO, logger="trio_jobs")
    async with open_jobs(postgres_driver(pgbouncer.dsn(), schema=pg_schema), jobs=[noop]) as jobs:
        worker = Worker(jobs, poll_interval="50ms")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(30):
                while not events(caplog, "jobs.wake.unverified"):  # noqa: ASYNC110
                    await trio.sleep(0.1)
            for i in range(5):
                await noop.enqueue(i)
            await run_until_done(jobs, 5, worker)
            await worker.drain()
        assert not jobs.driver.wake.live
    (warning,) = events(caplog, "jobs.wake.unverified")
    assert "listen_dsn" in warning.getMessage()


# ------------------------------------------------------------------ the pooler's faults


@pytest.fixture
def own_bouncer(request: Any) -> Iterator[Bouncer]:
    """A PgBouncer of the test's own (its settings from ``request.param``)."""
    skip_without_bouncer()
    with Bouncer(direct_dsn(), settings=getattr(request, "param", None)) as bouncer:
        yield bouncer


async def settled_once(pg_dsn: str, schema: str) -> list[tuple[object, ...]]:
    """(state, attempts) of every row, counted."""
    return sql(pg_dsn, schema, "SELECT state, attempts, count(*) FROM trio_jobs_jobs GROUP BY 1, 2")


async def test_a_pooler_restart_under_load_counts_no_attempt(
    pg_dsn: str, pg_schema: str, own_bouncer: Bouncer, caplog: Any
) -> None:
    caplog.set_level(logging.INFO, logger="trio_jobs")
    n = 300
    async with open_jobs(
        postgres_driver(own_bouncer.dsn(), schema=pg_schema, listen_dsn=pg_dsn), jobs=[noop]
    ) as jobs:
        await noop.enqueue_many(list(range(n)))
        worker = Worker(jobs, poll_interval="50ms", concurrency={"default": 8})
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(30):
                while (await jobs.stats())[0].done < n // 4:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            for _ in range(2):
                await trio.to_thread.run_sync(own_bouncer.restart)
                await trio.sleep(0.3)
            await run_until_done(jobs, n, worker)
            await worker.drain()
    assert await settled_once(pg_dsn, pg_schema) == [("done", 1, n)]
    assert len(events(caplog, "jobs.driver.unavailable")) <= 2  # one an outage
    # A failed claim is logged once a try, and the tries back off (from the 50 ms
    # poll interval, doubling): an outage of up to 30 s takes at most 11 tries,
    # where a claim loop without its backoff would log hundreds. How many an
    # outage takes depends on how long the pooler took to restart (two on a
    # quiet box, three seen with the suite on both cores).
    assert len(events(caplog, "jobs.claim.failed")) <= 2 * 11


@pytest.mark.parametrize("own_bouncer", [{"server_idle_timeout": "1"}], indirect=True)
async def test_server_idle_timeout_closing_server_connections_is_invisible(
    pg_dsn: str, pg_schema: str, own_bouncer: Bouncer, caplog: Any
) -> None:
    caplog.set_level(logging.INFO, logger="trio_jobs")
    async with open_jobs(
        postgres_driver(own_bouncer.dsn(), schema=pg_schema, listen_dsn=pg_dsn), jobs=[noop]
    ) as jobs:
        worker = Worker(jobs, poll_interval="50ms")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            for burst in range(2):
                await noop.enqueue_many(list(range(burst * 20, burst * 20 + 20)))
                await run_until_done(jobs, 20 * (burst + 1), worker)
                # Idle past the timeout: the pooler closes its server connections.
                await trio.sleep(2.5)
            await worker.drain()
    assert await settled_once(pg_dsn, pg_schema) == [("done", 1, 40)]
    assert not events(caplog, "jobs.driver.unavailable")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("own_bouncer", [{"max_client_conn": "6"}], indirect=True)
async def test_max_client_conn_reached_is_ridden_out(
    pg_dsn: str, pg_schema: str, own_bouncer: Bouncer, caplog: Any
) -> None:
    """Every client slot taken: the worker's connects are refused until one frees
    (a warning once), then it runs everything with no attempt counted."""
    caplog.set_level(logging.INFO, logger="trio_jobs")
    async with open_jobs(
        postgres_driver(own_bouncer.dsn(), schema=pg_schema, listen_dsn=pg_dsn), jobs=[noop]
    ) as jobs:
        await noop.enqueue_many(list(range(40)))
        # Take every slot the worker has not: its pool holds one idle connection now.
        hogs = []
        while True:
            try:
                hogs.append(psycopg.connect(own_bouncer.dsn(), autocommit=True))
            except psycopg.OperationalError:
                break
        worker = Worker(jobs, poll_interval="50ms", concurrency={"default": 8})
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await trio.sleep(1.5)
            for hog in hogs:
                hog.close()
            await run_until_done(jobs, 40, worker)
            await worker.drain()
    assert hogs
    assert await settled_once(pg_dsn, pg_schema) == [("done", 1, 40)]
    assert len(events(caplog, "jobs.driver.unavailable")) == 1
