"""A database fault is not the job's failure (issue 13), on a real PostgreSQL.

* A deadlock between two ``step.transaction`` bodies: the server aborts one
  (SQLSTATE 40P01). The bridge names it ``X_DRIVER_CONFLICT``; the library runs
  the step's transaction again, ``fn`` included, and the run is neither failed
  nor charged an attempt. Before, the ``DeadlockDetected`` escaped the step as
  the body's own exception: a job with ``Retry(attempts=1)`` was dead-lettered.
* A COMMIT whose answer is lost (the connection drops after the server
  committed): the library reads the step record back before it would run
  ``fn`` again. The record commits with the effects, so it says what happened:
  the effect lands once and the run goes on.
* A transaction that keeps failing past the write budget: the run is handed
  back uncounted with the code in ``last_error``, and completes once the
  database is back.

The lost answer and the outage are made by the TCP proxy of
``test_write_retry.py`` between this test's driver and the server; every
statement runs on the real server.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio

from trio_jobs import JobContext, Retry, Worker, _context, _worker, job, open_jobs
from trio_jobs.drivers.postgres import PostgresDriver
from trio_jobs.errors import ErrorCode

from .conftest import sql
from .test_write_retry import Proxy, events, pdriver, proxy, until

__all__ = ["pdriver", "proxy"]  # fixtures, imported to be found here

pytestmark = pytest.mark.postgres


@attrs.frozen
class Move:
    key: str
    first: int
    second: int


#: How many times each key's ``fn`` ran, and the rendezvous that makes two
#: transactions hold their first lock before either takes its second.
calls: dict[str, int] = {}
arrived: list[str] = []
both_in = trio.Event()


@pytest.fixture(autouse=True)
def _fresh() -> None:
    global both_in
    calls.clear()
    arrived.clear()
    both_in = trio.Event()


@job(input=Move, idempotency_key=lambda i: i.key, name="pgif.move", retry=Retry(attempts=1))
async def move(ctx: JobContext[Move]) -> int:
    async def transfer(tx: Any) -> int:
        key = ctx.input.key
        calls[key] = calls.get(key, 0) + 1
        await tx.execute("UPDATE pgif_acct SET n = n + 1 WHERE id = %s", (ctx.input.first,))
        if calls[key] == 1:
            # Both transactions hold their first row before either asks for its
            # second: a deadlock, which the server breaks by aborting one.
            arrived.append(key)
            if len(arrived) == 2:
                both_in.set()
            with trio.move_on_after(10):
                await both_in.wait()
        await tx.execute("UPDATE pgif_acct SET n = n + 1 WHERE id = %s", (ctx.input.second,))
        await tx.execute("INSERT INTO pgif_effects (key) VALUES (%s)", (key,))
        return calls[key]

    return int(await ctx.step.transaction("transfer", transfer))


@job(input=Move, idempotency_key=lambda i: i.key, name="pgif.once", retry=Retry(attempts=1))
async def once_more(ctx: JobContext[Move]) -> int:
    async def effect(tx: Any) -> str:
        key = ctx.input.key
        calls[key] = calls.get(key, 0) + 1
        await tx.execute("INSERT INTO pgif_effects (key) VALUES (%s)", (key,))
        return "paid"

    paid = await ctx.step.transaction("pay", effect)
    return 1 if paid == "paid" else 0


def _tables(pg_dsn: str, schema: str) -> None:
    sql(
        pg_dsn,
        schema,
        "CREATE TABLE pgif_acct (id int PRIMARY KEY, n int NOT NULL);"
        "INSERT INTO pgif_acct VALUES (1, 0), (2, 0);"
        "CREATE TABLE pgif_effects (key text PRIMARY KEY)",
    )


def _effects(pg_dsn: str, schema: str) -> list[str]:
    return [str(r[0]) for r in sql(pg_dsn, schema, "SELECT key FROM pgif_effects ORDER BY key")]


async def _settled(jobs: Any, job_id: str) -> Any:
    view = await jobs.show(job_id)
    return view if view.state in ("done", "dead", "failed") else None


async def test_a_deadlock_in_step_transaction_is_retried_not_charged(
    pdriver: PostgresDriver, pg_dsn: str, pg_schema: str, caplog: Any
) -> None:
    caplog.set_level(logging.INFO, logger="trio_jobs")
    await trio.to_thread.run_sync(_tables, pg_dsn, pg_schema)
    async with open_jobs(pdriver, jobs=[move]) as jobs:
        a = await move.enqueue(Move("a", 1, 2))
        b = await move.enqueue(Move("b", 2, 1))
        async with trio.open_nursery() as nursery:
            worker = Worker(jobs, concurrency=2, poll_interval="50ms")
            await nursery.start(worker.run)
            views = [
                await until(lambda i=i: _settled(jobs, i), what="settled") for i in (a.id, b.id)
            ]
            stats = worker.stats()
            await worker.drain()
    # Both done on their only attempt: the deadlock charged nothing.
    assert [(v.state, v.attempts) for v in views] == [("done", 1), ("done", 1)]
    assert (stats.retried, stats.dead_lettered, stats.faulted) == (0, 0, 0)
    # The server broke a deadlock (the retry's code says so), and exactly one of
    # the two ran its fn again.
    assert sorted(calls.values()) == [1, 2]
    # Each transfer's effects landed once: the aborted try left nothing.
    assert await trio.to_thread.run_sync(_effects, pg_dsn, pg_schema) == ["a", "b"]
    rows = await trio.to_thread.run_sync(
        sql, pg_dsn, pg_schema, "SELECT id, n FROM pgif_acct ORDER BY id"
    )
    assert [tuple(r) for r in rows] == [(1, 2), (2, 2)]
    retries = events(caplog, "jobs.step.retry")
    assert [r.__dict__["code"] for r in retries] == [ErrorCode.X_DRIVER_CONFLICT]


def _armed_commit(driver: PostgresDriver, proxy: Proxy) -> Callable[[], None]:
    """Make the driver's next transaction hold its COMMIT's answer at the proxy:
    the COMMIT reaches the server, its reply waits. Answers the arming switch."""
    real = driver.transaction
    armed: list[bool] = []

    @asynccontextmanager
    async def transaction() -> AsyncIterator[Any]:
        async with real() as tx:
            yield tx
            if armed:
                armed.clear()
                proxy.hold()  # the COMMIT is sent next; its reply is held

    driver.transaction = transaction  # type: ignore[method-assign]
    return lambda: armed.append(True)


async def test_a_commit_whose_answer_was_lost_reads_the_record_and_does_not_run_fn_again(
    pdriver: PostgresDriver, proxy: Proxy, pg_dsn: str, pg_schema: str, caplog: Any
) -> None:
    caplog.set_level(logging.INFO, logger="trio_jobs")
    await trio.to_thread.run_sync(_tables, pg_dsn, pg_schema)
    arm = _armed_commit(pdriver, proxy)
    async with open_jobs(pdriver, jobs=[once_more]) as jobs:
        arm()
        enq = await once_more.enqueue(Move("c", 0, 0))
        async with trio.open_nursery() as nursery:
            worker = Worker(jobs, poll_interval="50ms", visibility_timeout="20s")
            await nursery.start(worker.run)

            async def committed() -> bool:
                return await trio.to_thread.run_sync(_effects, pg_dsn, pg_schema) == ["c"]

            await until(committed, what="the step's transaction to commit")
            proxy.cut()  # the COMMIT landed; its answer is lost with the connection
            await trio.sleep(0.5)
            proxy.restore()
            view = await until(lambda: _settled(jobs, enq.id), what="settled")
            stats = worker.stats()
            await worker.drain()
    assert (view.state, view.attempts, view.result) == ("done", 1, 1)
    assert calls == {"c": 1}  # fn ran once: the record said the commit had landed
    assert await trio.to_thread.run_sync(_effects, pg_dsn, pg_schema) == ["c"]
    assert [(s.name, s.status, s.executions) for s in view.steps] == [("pay", "completed", 1)]
    assert (stats.retried, stats.faulted, stats.leases_lost) == (0, 0, 0)


#: The write budget for the test below: short, so an outage outlasts it quickly.
BUDGET = 2.0


async def test_a_transaction_that_keeps_failing_is_handed_back_uncounted(
    pdriver: PostgresDriver,
    proxy: Proxy,
    pg_dsn: str,
    pg_schema: str,
    caplog: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.INFO, logger="trio_jobs")
    monkeypatch.setattr(_context, "WRITE_BUDGET", BUDGET)
    monkeypatch.setattr(_worker, "WRITE_BUDGET", BUDGET)
    await trio.to_thread.run_sync(_tables, pg_dsn, pg_schema)
    async with open_jobs(pdriver, jobs=[once_more]) as jobs:
        enq = await once_more.enqueue(Move("d", 0, 0))
        # The database is away before the worker starts its step: the
        # transaction cannot begin for longer than the write budget.
        async with trio.open_nursery() as nursery:
            worker = Worker(jobs, poll_interval="50ms", visibility_timeout="60s")
            real = pdriver.transaction
            cut_once: list[bool] = []

            @asynccontextmanager
            async def transaction() -> AsyncIterator[Any]:
                if not cut_once:
                    cut_once.append(True)
                    proxy.cut()
                async with real() as tx:
                    yield tx

            pdriver.transaction = transaction  # type: ignore[method-assign]
            await nursery.start(worker.run)
            # The transaction's retries end within the write budget; then the
            # hand-back's own retries begin (a nack retried): only now does the
            # database come back, so the hand-back is what lands.
            await until(
                lambda: _true(
                    any(
                        r.__dict__.get("write") == "nack"
                        for r in events(caplog, "jobs.settle.retry")
                    )
                ),
                # A liveness bound, not a speed one: generous, because CI's run on
                # the oldest psycopg (after the whole suite) once took longer
                # than 3 budgets to reach the hand-back's first retry.
                timeout=10 * BUDGET,
                what="the hand-back's retries",
            )
            proxy.restore()
            await until(
                lambda: _true(bool(events(caplog, "jobs.attempt.faulted"))),
                timeout=30.0,
                what="the hand-back",
            )
            view = await until(lambda: _settled(jobs, enq.id), timeout=30.0, what="settled")
            stats = worker.stats()
            await worker.drain()
    assert (view.state, view.attempts) == ("done", 1)
    assert stats.faulted >= 1
    assert (stats.retried, stats.dead_lettered) == (0, 0)
    assert calls == {"d": 1}  # no transaction began during the outage
    faulted = events(caplog, "jobs.attempt.faulted")[0]
    assert faulted.__dict__["code"] == ErrorCode.X_DRIVER_UNAVAILABLE
    assert await trio.to_thread.run_sync(_effects, pg_dsn, pg_schema) == ["d"]


async def _true(value: bool) -> bool:
    return value


async def test_a_retry_whose_transaction_cannot_begin_is_bounded_by_the_budget(
    pdriver: PostgresDriver,
    pg_dsn: str,
    pg_schema: str,
    caplog: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a fault, the retry's wait for a transaction to begin (a connect that
    hangs, a pool held by stuck writes) ends with the write budget: the run is
    handed back uncounted, not left waiting. Here the first try's BEGIN fails and
    every later one hangs until the test lets go."""
    from trio_jobs.drivers.postgres._bridge import unavailable

    caplog.set_level(logging.INFO, logger="trio_jobs")
    monkeypatch.setattr(_context, "WRITE_BUDGET", BUDGET)
    monkeypatch.setattr(_worker, "WRITE_BUDGET", BUDGET)
    await trio.to_thread.run_sync(_tables, pg_dsn, pg_schema)
    async with open_jobs(pdriver, jobs=[once_more]) as jobs:
        enq = await once_more.enqueue(Move("h", 0, 0))
        real = pdriver.transaction
        tries: list[int] = []
        hanging = trio.Event()  # set: transactions begin again

        @asynccontextmanager
        async def transaction() -> AsyncIterator[Any]:
            tries.append(1)
            if len(tries) == 1:
                raise unavailable(None)
            if not hanging.is_set():
                await hanging.wait()
            async with real() as tx:
                yield tx

        pdriver.transaction = transaction  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            worker = Worker(jobs, poll_interval="50ms", visibility_timeout="60s")
            await nursery.start(worker.run)
            # Without the bound the retry would wait here until the test ends.
            await until(
                lambda: _true(bool(events(caplog, "jobs.attempt.faulted"))),
                timeout=10 * BUDGET,
                what="the hand-back",
            )
            hanging.set()
            view = await until(lambda: _settled(jobs, enq.id), timeout=30.0, what="settled")
            stats = worker.stats()
            await worker.drain()
    assert (view.state, view.attempts) == ("done", 1)
    assert stats.faulted >= 1
    assert (stats.retried, stats.dead_lettered) == (0, 0)
    assert calls == {"h": 1}
    faulted = events(caplog, "jobs.attempt.faulted")[0]
    assert faulted.__dict__["code"] == ErrorCode.X_DRIVER_UNAVAILABLE
    assert await trio.to_thread.run_sync(_effects, pg_dsn, pg_schema) == ["h"]
