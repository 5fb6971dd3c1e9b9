"""The outbox relay's throughput: ``python -m benchmarks.relay [--rows N] [--runs R]``.

Stages ``--rows`` enqueues in the outbox (one transaction, not timed), then
times a :class:`~trio_jobs.outbox.Relay` from its first pass until every row
is published: onto the memory driver (the relay's own cost) and onto the
PostgreSQL driver in the same server (a queue that does work too), at the
default batch of 500, against the row loop (two statements a row). Needs
``DATABASE_URL`` (or the embedded server); each run uses fresh schemas.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from typing import Any

import attrs
import psycopg
import trio

from trio_jobs import JobContext, job, memory_driver, open_jobs
from trio_jobs.drivers.postgres import embedded_dsn, postgres_driver
from trio_jobs.outbox import PostgresOutbox, Relay


class RowLoopOutbox(PostgresOutbox):
    """A store without ``mark_published_many``: the relay keeps the row loop."""

    @property
    def mark_published_many(self) -> None:  # type: ignore[override]
        return None


@attrs.frozen
class Item:
    key: str


@job(input=Item, tenant="none", idempotency_key=lambda i: i.key)
async def item(ctx: JobContext[Item]) -> None:
    return None


def _schema(dsn: str, drop: str | None = None) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        if drop is not None:
            conn.execute(f'DROP SCHEMA "{drop}" CASCADE')
            return drop
        name = f"bench_{uuid.uuid4().hex[:10]}"
        conn.execute(f'CREATE SCHEMA "{name}"')
        return name


async def one_run(dsn: str, rows: int, queue_kind: str, row_loop: bool) -> float:
    schemas = [_schema(dsn), _schema(dsn)]
    try:
        queue: Any = (
            memory_driver() if queue_kind == "memory" else postgres_driver(dsn, schema=schemas[1])
        )
        store = (RowLoopOutbox if row_loop else PostgresOutbox)(dsn, schema=schemas[0])
        async with open_jobs(queue, jobs=[item], outbox=store) as jobs:
            async with jobs.transaction():
                await item.enqueue_many([Item(f"k{i}") for i in range(rows)])
            relay = Relay(jobs)
            started = time.perf_counter()
            while await relay.relay_once():
                pass
            elapsed = time.perf_counter() - started
            assert sum(s.ready for s in await jobs.stats()) == rows
        return rows / elapsed
    finally:
        for s in schemas:
            _schema(dsn, drop=s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    dsn = os.environ.get("DATABASE_URL") or trio.run(embedded_dsn)
    print(f"| queue | path | rows | median rows/s ({args.runs} runs) | runs |")
    print("|---|---|---:|---:|---|")
    for queue_kind in ("memory", "postgres"):
        for row_loop in (False, True):
            rows = args.rows if not row_loop else min(args.rows, 2_000)
            rates = [trio.run(one_run, dsn, rows, queue_kind, row_loop) for _ in range(args.runs)]
            path = "row loop" if row_loop else "batch 500"
            spread = ", ".join(f"{r:,.0f}" for r in rates)
            print(
                f"| {queue_kind} | {path} | {rows:,} | {statistics.median(rates):,.0f} | {spread} |"
            )


if __name__ == "__main__":
    main()
