"""``consumer()`` on PostgreSQL: a batch's rows and its cursor commit in one
transaction with the run's fenced step record (``batch.tx`` is the app's
transaction), so a failed ``handle`` or ``save_cursor`` leaves neither, and a
worker SIGKILLed in the middle of a batch leaves neither: a fresh process
resumes at the committed cursor, every row copied exactly once."""

from __future__ import annotations

import importlib
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_jobs import ConsumerBatch, Retry, Worker, consumer, open_jobs
from trio_jobs.drivers.postgres import postgres_driver
from trio_jobs.drivers.postgres._driver import conninfo_with_schema

from .conftest import sql
from .test_processes import Procs, wait_until

pytestmark = pytest.mark.postgres

TESTS = Path(__file__).resolve().parents[2]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))
consumer_jobs = importlib.import_module("consumer_jobs")


def with_tables(pg_dsn: str, schema: str) -> None:
    for statement in consumer_jobs.TABLES.strip().split(";"):
        if statement.strip():
            sql(pg_dsn, schema, statement)


async def _run(dsn: str, handle: Any, ids: list[str]) -> list[Any]:
    async with open_jobs(postgres_driver(dsn), jobs=[handle]) as jobs:
        ids += [e.id for e in await handle.arm()]
        worker = Worker(jobs, queues=["default"], poll_interval="50ms")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(30):
                while [(await jobs.show(i)).state for i in ids] != ["done"] * len(ids):  # noqa: ASYNC110 — bounded wait on the queue
                    await trio.sleep(0.05)
            await worker.drain()
        return [await jobs.show(i) for i in ids]


@pytest.mark.parametrize("fails", ["handle", "save_cursor"])
def test_a_failed_batch_commits_neither_its_rows_nor_its_cursor(
    pg_dsn: str, pg_schema: str, fails: str
) -> None:
    dsn = conninfo_with_schema(pg_dsn, pg_schema)
    with_tables(pg_dsn, pg_schema)
    seen: list[tuple[str | None, list[int]]] = []

    async def copy(batch: ConsumerBatch) -> str:
        seen.append((batch.cursor, list(batch.items)))
        cursor = await consumer_jobs.copy(batch) if batch.items[0] != 7 else None
        if cursor is None:  # batch [7, 8, 9]: written, then it fails (once, in handle)
            for i in batch.items:
                await batch.tx.execute("INSERT INTO cs_target (id, pid) VALUES (%s, 0)", (i,))
            if fails == "handle" and len(seen) == 3:
                raise RuntimeError("the downstream API refused the batch")
            cursor = "9"
        return cursor

    saves: list[str] = []

    async def save(key: str, cursor: str, tx: Any) -> None:
        saves.append(cursor)
        await consumer_jobs.save(key, cursor, tx)
        if fails == "save_cursor" and cursor == "9" and saves.count("9") == 1:
            raise RuntimeError("the cursor table refused the write")

    handle = consumer(
        name=f"pg.mirror.{fails}",
        keys=lambda: ["acct-1"],
        open=consumer_jobs.rows_after,
        handle=copy,
        load_cursor=consumer_jobs.load,
        save_cursor=save,
        batch=3,
        retry=Retry(attempts=3, base="50ms", jitter=False),
    )
    [view] = trio.run(_run, dsn, handle, [])
    assert view.state == "done"
    assert view.attempts == 2
    # the second attempt started at the committed cursor: the failed batch again
    assert [c for c, _items in seen] == [None, "3", "6", "6", "9"]
    assert sql(pg_dsn, pg_schema, "SELECT count(*), count(DISTINCT id) FROM cs_target") == [
        (12, 12)
    ]
    assert sql(pg_dsn, pg_schema, "SELECT key, cursor FROM cs_cursors") == [("acct-1", "12")]
    assert view.consumer is not None
    assert view.consumer["key"] == "acct-1"
    assert view.consumer["last_batch_at"] is not None
    [step] = view.steps
    assert (step.name, step.status, step.output) == (
        "batch",
        "completed",
        {"cursor": "12", "batches": 2, "items": 6},
    )


@pytest.mark.slow
def test_sigkill_mid_batch_commits_nothing_of_it_and_a_fresh_process_resumes(
    pg_dsn: str, pg_schema: str, tmp_path: Path
) -> None:
    dsn = conninfo_with_schema(pg_dsn, pg_schema)
    trio.run(_migrate, dsn)
    with_tables(pg_dsn, pg_schema)
    procs = Procs(dsn, tmp_path)

    try:
        first = procs.worker("--visibility-timeout", "2s", module="consumer_jobs")
        job_id = trio.run(_arm, dsn)
        wait_until(lambda: (tmp_path / "hung-7").exists(), 15, "batch 3 to be handled")
        first.send_signal(signal.SIGKILL)
        first.wait(5)
        # batches 1 and 2 committed with their cursor; batch 3's rows never did
        assert sql(pg_dsn, pg_schema, "SELECT cursor FROM cs_cursors") == [("6",)]
        assert sql(pg_dsn, pg_schema, "SELECT count(*) FROM cs_target") == [(6,)]
        procs.worker(
            "--visibility-timeout", "2s", "--idle-poll-max", "250ms", module="consumer_jobs"
        )
        wait_until(
            lambda: (
                sql(pg_dsn, pg_schema, "SELECT state FROM trio_jobs_jobs WHERE id = %s", (job_id,))[
                    0
                ][0]
                == "done"
            ),
            20,
            "the run to finish",
        )
    finally:
        procs.kill_all()
    rows = sql(pg_dsn, pg_schema, "SELECT id, pid FROM cs_target ORDER BY id")
    assert [i for i, _pid in rows] == list(range(1, 13))  # each once: a plain INSERT
    assert {pid for i, pid in rows if i <= 6} == {first.pid}
    assert first.pid not in {pid for i, pid in rows if i > 6}
    assert sql(pg_dsn, pg_schema, "SELECT cursor FROM cs_cursors") == [("12",)]
    assert sql(
        pg_dsn, pg_schema, "SELECT state, attempts FROM trio_jobs_jobs WHERE id = %s", (job_id,)
    ) == [("done", 2)]


async def _migrate(dsn: str) -> None:
    from trio_jobs.drivers.postgres import migrate

    await migrate(dsn)


async def _arm(dsn: str) -> str:
    async with open_jobs(postgres_driver(dsn), jobs=[consumer_jobs.mirror]):
        [enqueued] = await consumer_jobs.mirror.arm()
        return enqueued.id
