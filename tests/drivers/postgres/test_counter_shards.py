"""The per-minute counters row is sharded (migration 0031): settles of one job
name in one minute from different server connections write different rows, so
one settle's open transaction holds up no other's, and the history read sums
the shards.

The fleet benchmark found every lock waiter at 16 and 32 worker processes to be
an ack queued on the one ``(minute, name)`` row; here a transaction holding
another connection's shard of that minute open (the slowest settle there could
be) must not hold up an ack of the same name.
"""

from __future__ import annotations

import psycopg
import pytest
import trio

from trio_jobs.drivers import AckOptions, ClaimOptions
from trio_jobs.drivers.postgres import PostgresDriver, postgres_driver

from .conftest import req, sql

pytestmark = pytest.mark.postgres

UPSERT = """
INSERT INTO trio_jobs_counters AS c (bucket, name, shard, done, duration)
SELECT floor(trio_jobs_now() / 60) * 60, 'job', mod(pg_backend_pid(), 16)::smallint, 1, 0
ON CONFLICT (bucket, name, shard) DO UPDATE SET done = c.done + 1
"""


async def test_an_open_settle_of_another_connection_holds_up_no_ack(
    pg_dsn: str, pg_schema: str
) -> None:
    # One pooled connection: every statement of this driver runs on one backend.
    driver = postgres_driver(pg_dsn, schema=pg_schema, pool_size=1)
    await driver.open()
    try:
        await _one_settle_open_beside_acks(driver, pg_dsn, pg_schema)
    finally:
        await driver.close()


async def _one_settle_open_beside_acks(driver: PostgresDriver, pg_dsn: str, pg_schema: str) -> None:
    await driver.enqueue_many([req(f"k{i}") for i in range(3)])
    got = await driver.claim(
        ClaimOptions(worker_id="w", queues={"default": 3}, visibility_timeout=60.0)
    )
    assert len(got.jobs) == 3
    assert await driver.ack(got.jobs[0].id, AckOptions(fence=got.jobs[0].fence))
    # The driver's one backend, and the shard its settles write.
    theirs = {int((await driver.db.fetch("SELECT pg_backend_pid()"))[0][0]) % 16}
    assert sql(pg_dsn, pg_schema, "SELECT shard FROM trio_jobs_counters") == [(next(iter(theirs)),)]
    # Another connection whose shard none of the driver's connections shares.
    others: list[psycopg.Connection] = []
    try:
        holder = None
        for _ in range(64):
            conn = psycopg.connect(pg_dsn, autocommit=True, prepare_threshold=None)
            others.append(conn)
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()
            assert pid is not None
            if int(pid[0]) % 16 not in theirs:
                holder = conn
                break
        assert holder is not None, "no connection found on a shard of its own"
        with holder.transaction():
            holder.execute(f'SET LOCAL search_path TO "{pg_schema}"')
            holder.execute(UPSERT)
            # Its shard row is locked and uncommitted: an ack of the same job
            # name in the same minute goes by it.
            with trio.fail_after(10):
                for job in got.jobs[1:]:
                    assert await driver.ack(job.id, AckOptions(fence=job.fence))
    finally:
        for conn in others:
            conn.close()
    shards = sql(
        pg_dsn, pg_schema, "SELECT count(*), sum(done) FROM trio_jobs_counters WHERE name = 'job'"
    )
    assert shards[0][0] >= 2  # the holder's row and the driver's
    history = await driver.introspect.counters("job", 0.0)
    assert sum(r.done for r in history) == 4  # three acks and the holder's one
