"""The other process of the pickup-latency benchmark (``benchmarks/postgres.py``).

    python -m benchmarks._pg_enqueuer DSN SCHEMA COUNT INTERVAL

Opens its own PostgreSQL driver on ``SCHEMA`` (already migrated by the worker's
process) and enqueues ``COUNT`` jobs of ``bench.pg.pickup``, one at a time,
``INTERVAL`` seconds apart (past the driver's 250 ms notify throttle, so every
enqueue carries its ``pg_notify``). After each enqueue returns — its commit
has landed — it prints ``INPUT MONOTONIC_SECONDS``: ``time.perf_counter()`` is
``CLOCK_MONOTONIC`` on Linux, the same clock in every process, so the worker's
process can subtract it from the moment the body started.
"""

from __future__ import annotations

import sys
import time
import uuid

import trio

from trio_jobs.drivers import EnqueueRequest
from trio_jobs.drivers.postgres import postgres_driver

PICKUP_NAME = "bench.pg.pickup"


async def _main(dsn: str, schema: str, count: int, interval: float) -> None:
    driver = postgres_driver(dsn, schema=schema, migrate=False, pool_size=1)
    await driver.open()
    try:
        # Warm the connection (and psycopg's prepared statement) before the first sample.
        await driver.stats()
        for i in range(count):
            await trio.sleep(interval)
            request = EnqueueRequest(
                id=str(uuid.uuid4()),
                run_id=str(uuid.uuid4()),
                name=PICKUP_NAME,
                queue="default",
                payload=i,
                idempotency_key=f"pickup:{i}",
                max_attempts=1,
            )
            await driver.enqueue_many([request])
            committed = time.perf_counter()
            print(f"{i} {committed:.9f}", flush=True)
    finally:
        await driver.close()


if __name__ == "__main__":
    dsn, schema, count, interval = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    trio.run(_main, dsn, schema, count, interval)
