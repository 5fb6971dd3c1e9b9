"""Shared by tests/rollup: a PostgreSQL schema holding the queue and the app's
tables, a frozen clock, and one run of a job to rest on it."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg

from trio_jobs import Job, JobView, Worker, open_jobs, postgres_driver


class Frozen:
    """The driver's clock, frozen at one instant (``now - lookback`` is decided on it)."""

    def __init__(self, at: datetime) -> None:
        self.at = at.timestamp()

    def now(self) -> float:
        return self.at


def sql(dsn: str, statement: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


async def run_at(dsn: str, handle: Job[Any, Any], now: datetime, input: Any = None) -> JobView:
    """Enqueue ``handle`` and run it to rest on a worker whose clock reads ``now``."""
    async with open_jobs(postgres_driver(dsn, clock=Frozen(now)), jobs=[handle]) as jobs:
        enqueued = await handle.enqueue(input)
        await Worker(jobs, queues=[handle.queue], fleet="single").run_until_quiet()
        return await jobs.show(enqueued.id)
