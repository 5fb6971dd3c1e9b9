"""Scheduled tasks on PostgreSQL, in process and in real time (a few seconds):
the scheduler fires each occurrence once, an idle one issues only its lease
renewals, and the operator surface reads the store. The store's own rules are
in the conformance suite (tests/drivers/task_store.py); failover under SIGKILL
is in test_task_processes.py."""

from __future__ import annotations

import itertools
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest
import trio

from trio_jobs import JobContext, Occurrence, Worker, open_jobs, task
from trio_jobs.drivers.postgres import postgres_driver

pytestmark = pytest.mark.postgres


@task(every="1s", name="pg.tick", catch_up="latest")
async def tick(ctx: JobContext[Occurrence]) -> None:
    return None


async def test_each_occurrence_fires_once_and_the_operator_reads_the_store(
    pg_dsn: str, pg_schema: str
) -> None:
    driver = postgres_driver(pg_dsn, schema=pg_schema)
    async with open_jobs(driver, jobs=[tick]) as jobs, trio.open_nursery() as nursery:
        worker = Worker(jobs, idle_poll_max="250ms")
        await nursery.start(worker.run)
        await trio.sleep(3.5)
        await jobs.pause_task("pg.tick")
        await trio.sleep(0.2)
        page = await jobs.list(name="pg.tick", limit=200)
        await trio.sleep(1.5)
        paused = await jobs.list(name="pg.tick", limit=200)
        [view] = await jobs.tasks()
        await worker.drain()
    keys = sorted(r.idempotency_key for r in page.rows)
    assert len(keys) == len(set(keys)) >= 3
    instants = [datetime.fromisoformat(k.split(":", 2)[2].replace("Z", "+00:00")) for k in keys]
    assert all((b - a).total_seconds() == 1 for a, b in itertools.pairwise(instants))
    assert len(paused.rows) == len(page.rows), "a paused task fires nothing"
    assert view.paused
    assert view.next_fire is None
    assert view.schedule == "every:1"
    assert view.tz == "UTC"
    assert view.last_fire is not None
    assert view.last_fire.astimezone(UTC) == instants[-1]


async def test_an_idle_scheduler_issues_only_its_renewals(pg_dsn: str, pg_schema: str) -> None:
    hour = (datetime.now(UTC).hour + 12) % 24  # nothing falls due in the window
    daily = [task(cron=f"{i} {hour} * * *", name=f"pg.daily.{i}")(tick.run) for i in range(50)]
    driver = postgres_driver(pg_dsn, schema=pg_schema)
    named: Counter[str] = Counter()
    inner = driver._fetch

    async def counted(name: str, params: Any) -> Any:
        if name.startswith("task_"):
            named[name] += 1
        return await inner(name, params)

    driver._fetch = counted  # type: ignore[method-assign]
    async with open_jobs(driver, jobs=daily) as jobs, trio.open_nursery() as nursery:
        worker = Worker(jobs)
        await nursery.start(worker.run)
        await trio.sleep(0.5)
        named.clear()
        await trio.sleep(10.0)
        seen = dict(named)
        await worker.drain()
    assert seen == {"task_lead": 1}, "one renewal in 10 s for fifty tasks, no fire"
