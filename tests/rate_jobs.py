"""Jobs and an acquirer for the rate-limit real-process tests
(``tests/drivers/postgres/test_rate_limits.py``).

A worker subprocess serves the jobs with ``python -m trio_jobs.cli worker
rate_jobs --database-url DSN`` (``tests/`` on ``PYTHONPATH``); the budget comes
from ``RATE_LIMIT`` / ``RATE_PER`` in its environment. ``python -m rate_jobs
hammer DSN TRIES`` connects, waits for a line on stdin, then acquires the
budget ``TRIES`` times as fast as it can and prints how many it was granted.
"""

from __future__ import annotations

import os
import sys

import attrs
import trio

from trio_jobs import JobContext, JobsError, Retry, job, open_jobs, rate_limiter
from trio_jobs.drivers.postgres import postgres_driver

TABLES = """
CREATE TABLE rate_effects (
    key text NOT NULL, attempt int NOT NULL, pid int NOT NULL,
    at float8 NOT NULL DEFAULT extract(epoch FROM clock_timestamp()));
"""

VENDOR = rate_limiter(
    "proc.vendor",
    limit=int(os.environ.get("RATE_LIMIT", "8")),
    per=os.environ.get("RATE_PER", "1h"),
)


@attrs.frozen
class Send:
    key: str


@job(
    input=Send,
    tenant="none",
    idempotency_key=lambda i: f"send:{i.key}",
    retry=Retry(attempts=1),
    name="proc.metered",
)
async def metered(ctx: JobContext[Send]) -> None:
    """Acquires the fleet's budget first, then records that it sent."""
    await VENDOR.acquire()
    async with ctx.jobs.transaction() as tx:
        await tx.execute(
            "INSERT INTO rate_effects (key, attempt, pid) VALUES (%s, %s, %s)",
            (ctx.input.key, ctx.attempt, os.getpid()),
        )


@attrs.frozen
class Order:
    key: str
    tenant: str


@job(
    input=Order,
    tenant=lambda o: o.tenant,
    idempotency_key=lambda o: f"order:{o.key}",
    retry=Retry(attempts=1),
    name="proc.tenanted",
)
async def tenanted(ctx: JobContext[Order]) -> None:
    """No limiter of its own: the worker's --rate-per-tenant paces it."""
    async with ctx.jobs.transaction() as tx:
        await tx.execute(
            "INSERT INTO rate_effects (key, attempt, pid) VALUES (%s, %s, %s)",
            (ctx.input.key, ctx.attempt, os.getpid()),
        )


async def hammer(dsn: str, tries: int) -> int:
    granted = 0
    async with open_jobs(postgres_driver(dsn, pool_size=2)):
        print("ready", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)  # the go
        for _ in range(tries):
            try:
                await VENDOR.acquire()
                granted += 1
            except JobsError as exc:
                if exc.code != "X_RATE_LIMITED":
                    raise
    return granted


if __name__ == "__main__":
    command, dsn, tries = sys.argv[1:4]
    assert command == "hammer"
    print(trio.run(hammer, dsn, int(tries)), flush=True)
