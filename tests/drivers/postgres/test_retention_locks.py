"""The retention purge holds no lock the claim or the ack waits on.

A purge batch deletes terminal rows only (picked ``FOR UPDATE SKIP LOCKED``),
their step and lease rows with them; the claim takes ready rows and the ack
settles running ones. So a purge batch left open (the slowest it could be)
must not hold up either: each is run beside one under a deadline.
"""

from __future__ import annotations

import psycopg
import pytest
import trio

from trio_jobs.drivers import AckOptions, ClaimOptions
from trio_jobs.drivers.postgres import PostgresDriver
from trio_jobs.drivers.postgres._sql import query

from .conftest import req, sql

pytestmark = pytest.mark.postgres


async def test_an_open_purge_batch_holds_up_no_claim_and_no_ack(
    driver: PostgresDriver, pg_dsn: str, pg_schema: str
) -> None:
    await driver.enqueue_many([req(f"k{i}") for i in range(30)])
    first = await driver.claim(
        ClaimOptions(worker_id="w", queues={"default": 20}, visibility_timeout=60.0)
    )
    assert len(first.jobs) == 20
    for job in first.jobs[:10]:
        assert await driver.ack(job.id, AckOptions(fence=job.fence))
    # The ten settled rows are long past their retention.
    sql(pg_dsn, pg_schema, "UPDATE trio_jobs_jobs SET updated_at = 0 WHERE state = 'done'")
    now = driver.now()
    with psycopg.connect(pg_dsn, autocommit=True, prepare_threshold=None) as purger:
        with purger.transaction():
            purger.execute(f'SET LOCAL search_path TO "{pg_schema}"')
            purger.execute(
                query("purge_jobs"),
                {
                    "done_before": now,
                    "dead_before": now,
                    "limit": 1000,
                    "now": None,
                    "after_created": None,
                    "after_id": None,
                    "after_updated": None,
                },
            )
            # The batch is open: its rows deleted, its locks held, nothing committed.
            with trio.fail_after(10):
                more = await driver.claim(
                    ClaimOptions(worker_id="w2", queues={"default": 10}, visibility_timeout=60.0)
                )
                assert len(more.jobs) == 10
                for job in [*first.jobs[10:], *more.jobs]:
                    assert await driver.ack(job.id, AckOptions(fence=job.fence))
    # The purge committed after both: its ten rows gone, the twenty acked rows kept.
    assert sql(pg_dsn, pg_schema, "SELECT state, count(*) FROM trio_jobs_jobs GROUP BY 1") == [
        ("done", 20)
    ]


async def test_a_sweep_goes_on_after_its_last_batch_and_never_back(
    driver: PostgresDriver, pg_dsn: str, pg_schema: str
) -> None:
    """The batches of one sweep each start after the last row the batch before
    deleted (the dead index entries of a big backlog are stepped over once, not
    once a batch): a row the first batch skipped because another transaction
    held it stays through the rest of that sweep, even once it is free, and
    goes at the next sweep."""
    from trio_jobs._retention import purge_expired

    await driver.enqueue_many([req(f"k{i:02d}") for i in range(25)])
    got = await driver.claim(
        ClaimOptions(worker_id="w", queues={"default": 25}, visibility_timeout=60.0)
    )
    for job in got.jobs:
        assert await driver.ack(job.id, AckOptions(fence=job.fence))
    # Long expired, created one a second, oldest first.
    sql(
        pg_dsn,
        pg_schema,
        "UPDATE trio_jobs_jobs j SET created_at = 1000 + o.n, updated_at = 1000 + o.n "
        "FROM (SELECT id, row_number() OVER (ORDER BY idempotency_key) AS n "
        "FROM trio_jobs_jobs) o WHERE j.id = o.id",
    )
    oldest = sql(pg_dsn, pg_schema, "SELECT id FROM trio_jobs_jobs ORDER BY created_at LIMIT 1")
    now = driver.now()
    with psycopg.connect(pg_dsn, prepare_threshold=None) as holder:
        holder.execute(f'SET search_path TO "{pg_schema}"')
        holder.execute("SELECT 1 FROM trio_jobs_jobs WHERE id = %s FOR UPDATE", (oldest[0][0],))
        assert driver.introspect is not None
        # The first batch of ten skips the held row and takes the next ten.
        first = await driver.introspect.purge(now, now, 10)
        assert first == 10
        holder.rollback()  # the oldest row is free again
    # The rest of the same sweep: it goes on after the tenth row it deleted.
    rest = [await driver.introspect.purge(now, now, 10) for _ in range(2)]
    assert rest == [10, 4]
    assert sql(pg_dsn, pg_schema, "SELECT id FROM trio_jobs_jobs") == oldest
    # A batch that came short ended the sweep: the next call starts a new one,
    # from the oldest row, even with the same cut-offs.
    assert await driver.introspect.purge(now, now, 10) == 1
    await driver.enqueue_many([req("late")])
    sql(pg_dsn, pg_schema, "UPDATE trio_jobs_jobs SET state = 'dead', updated_at = 2000")
    swept = await purge_expired(driver, now=now + 1, done_retention=1.0, dead_retention=1.0)
    assert swept.removed == 1
    assert sql(pg_dsn, pg_schema, "SELECT count(*) FROM trio_jobs_jobs") == [(0,)]
