"""PostgreSQL restarted twice under load: no job dead, no effect doubled (issue 13).

A throwaway cluster of this test's own (``cluster.py``) serves one worker that
runs ``Retry(attempts=1)`` jobs of every step kind: ``step.run``, a ``once``
step, ``step.transaction``, ``step.sleep`` and ``step.wait_for_event``. While
they run, the cluster is restarted twice (``pg_ctl restart -m fast``: every
session is ended with SQLSTATE 57P01, the server is away for a moment). The
library's own statements (claims, step records, the transactions of
``step.transaction``, settles, heartbeats, event polls) meet the restart; each
is retried within the write budget, and a run whose statement still failed is
handed back uncounted. With one attempt each, a fault charged to a job would
dead-letter it.

Before this was built, 4 of 4 ``step.transaction`` jobs with ``attempts=1`` were
dead-lettered by one routine ``pg_ctl restart``.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from typing import Any

import attrs
import psycopg
import pytest
import trio

from trio_jobs import JobContext, Retry, Worker, job, open_jobs
from trio_jobs.drivers.postgres import postgres_driver

from .cluster import Cluster, binaries_missing

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

#: Jobs of each kind.
PER_KIND = 60


@attrs.frozen
class Work:
    key: str


#: How many times each (key, step) fn ran, in this process.
calls: Counter[tuple[str, str]] = Counter()


async def _work(tag: str, ctx: JobContext[Work]) -> str:
    calls[(ctx.input.key, tag)] += 1
    await trio.sleep(0.2)  # long enough for a restart to land mid-run
    return tag


@job(input=Work, idempotency_key=lambda i: i.key, name="rs.run", retry=Retry(attempts=1))
async def runs(ctx: JobContext[Work]) -> int:
    await ctx.step.run("a", lambda: _work("a", ctx))
    await ctx.step.run("b", lambda: _work("b", ctx))
    return 2


@job(input=Work, idempotency_key=lambda i: i.key, name="rs.once", retry=Retry(attempts=1))
async def once(ctx: JobContext[Work]) -> int:
    await ctx.step.run("charge", lambda: _work("charge", ctx), once=True)
    return 1


@job(input=Work, idempotency_key=lambda i: i.key, name="rs.tx", retry=Retry(attempts=1))
async def transact(ctx: JobContext[Work]) -> int:
    async def pay(tx: Any) -> str:
        calls[(ctx.input.key, "pay")] += 1
        await tx.execute("INSERT INTO rs_effects (key) VALUES (%s)", (ctx.input.key,))
        await trio.sleep(0.2)
        return "paid"

    await ctx.step.transaction("pay", pay)
    return 1


@job(input=Work, idempotency_key=lambda i: i.key, name="rs.sleep", retry=Retry(attempts=1))
async def sleeps(ctx: JobContext[Work]) -> int:
    await ctx.step.run("a", lambda: _work("a", ctx))
    await ctx.step.sleep("300ms")
    await ctx.step.run("b", lambda: _work("b", ctx))
    return 2


@job(
    input=Work,
    idempotency_key=lambda i: i.key,
    name="rs.event",
    retry=Retry(attempts=1),
    event_poll="200ms",
)
async def waits(ctx: JobContext[Work]) -> int:
    got = await ctx.step.wait_for_event("wait", "rs.never", schema=dict, timeout="600ms")
    await ctx.step.run("after", lambda: _work("after", ctx))
    return 0 if got is None else 1


JOBS = [runs, once, transact, sleeps, waits]


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    missing = binaries_missing()
    if missing is not None:
        pytest.skip(f"no throwaway PostgreSQL cluster: {missing}")
    with Cluster() as c:
        with psycopg.connect(c.dsn(), autocommit=True) as conn:
            conn.execute("CREATE TABLE rs_effects (key text NOT NULL)")
        yield c


def _read(dsn: str, statement: str) -> list[tuple[Any, ...]] | None:
    """A read on a fresh connection; None while the server is away."""
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=2) as conn:
            return list(conn.execute(statement).fetchall())
    except psycopg.OperationalError:
        return None


async def test_two_restarts_under_load_kill_no_job_and_double_no_effect(
    cluster: Cluster, caplog: Any
) -> None:
    caplog.set_level(logging.INFO, logger="trio_jobs")
    calls.clear()
    dsn = cluster.dsn()
    total = PER_KIND * len(JOBS)
    async with open_jobs(postgres_driver(dsn), jobs=JOBS) as jobs:
        # Interleaved, so every kind is in flight whenever a restart lands.
        for i in range(PER_KIND):
            for handle in JOBS:
                await handle.enqueue(Work(f"{handle.name}:{i}"))
        async with trio.open_nursery() as nursery:
            worker = Worker(jobs, concurrency=16, poll_interval="50ms", visibility_timeout="30s")
            await nursery.start(worker.run)
            # Restart while runs are in flight, twice.
            restarts = 0
            for pause in (0.5, 1.5):
                await trio.sleep(pause)
                assert worker.stats().in_flight > 0, "the restart should meet work in flight"
                await trio.to_thread.run_sync(cluster.restart)
                restarts += 1
            states: dict[str, int] = {}
            with trio.move_on_after(120):
                while True:
                    rows = await trio.to_thread.run_sync(
                        _read, dsn, "SELECT state, count(*) FROM trio_jobs_jobs GROUP BY state"
                    )
                    if rows is not None:
                        states = {str(s): int(n) for s, n in rows}
                        if (
                            states.get("done", 0) + states.get("dead", 0) + states.get("failed", 0)
                            == total
                        ):
                            break
                    await trio.sleep(0.2)
            stats = worker.stats()
            await worker.drain()
    assert restarts == 2
    # None dead: every job done on its only attempt (a charged fault would have
    # dead-lettered it; a lapsed lease would show two attempts).
    assert states == {"done": total}, states
    attempts = await trio.to_thread.run_sync(
        _read, dsn, "SELECT attempts, count(*) FROM trio_jobs_jobs GROUP BY attempts"
    )
    assert attempts == [(1, total)]
    assert (stats.retried, stats.dead_lettered, stats.failed) == (0, 0, 0)
    # None doubled: each step.transaction's effect landed once, and each once
    # step's fn ran once (a second run would have been X_STEP_OUTCOME_UNKNOWN).
    effects = await trio.to_thread.run_sync(
        _read, dsn, "SELECT key, count(*) FROM rs_effects GROUP BY key"
    )
    assert effects is not None
    assert sorted(k for k, _n in effects) == sorted(f"rs.tx:{i}" for i in range(PER_KIND))
    assert all(n == 1 for _k, n in effects)
    assert [calls[(f"rs.once:{i}", "charge")] for i in range(PER_KIND)] == [1] * PER_KIND
    # The restarts were felt: some of the library's statements met them and were retried.
    felt = Counter(
        getattr(r, "event", None)
        for r in caplog.records
        if r.name == "trio_jobs"
        and getattr(r, "event", None)
        in (
            "jobs.step.retry",
            "jobs.settle.retry",
            "jobs.claim.failed",
            "jobs.heartbeat.failed",
            "jobs.attempt.faulted",
        )
    )
    assert sum(felt.values()) > 0, felt
    print(f"restarts felt as {dict(felt)}; handed back uncounted: {stats.faulted}")
