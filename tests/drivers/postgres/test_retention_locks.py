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
                {"done_before": now, "dead_before": now, "limit": 1000, "now": None},
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
