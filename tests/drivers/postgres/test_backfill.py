"""``backfill()`` on PostgreSQL: a pass pages an app table with a real worker,
keeps its ledger in ``trio_jobs_backfills`` (migration 0008), answers
``jobs.backfills()`` and ``trio-jobs backfills --json``, and, killed with
SIGKILL mid-page, resumes at that page in a fresh process."""

from __future__ import annotations

import importlib
import signal
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from click.testing import CliRunner

from trio_jobs import Worker, open_jobs
from trio_jobs.cli import main
from trio_jobs.drivers.postgres import postgres_driver
from trio_jobs.drivers.postgres._driver import conninfo_with_schema

from .conftest import sql
from .test_processes import Procs, wait_until

pytestmark = pytest.mark.postgres

TESTS = Path(__file__).resolve().parents[2]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))
# tests/backfill_jobs.py: the backfill the worker subprocesses serve.
backfill_jobs = importlib.import_module("backfill_jobs")
copy_rows = backfill_jobs.copy_rows


def with_tables(pg_dsn: str, schema: str) -> None:
    for statement in backfill_jobs.TABLES.strip().split(";"):
        if statement.strip():
            sql(pg_dsn, schema, statement)


def handled(pg_dsn: str, schema: str) -> list[tuple[Any, ...]]:
    return sql(pg_dsn, schema, "SELECT first_id, pid FROM bf_handled ORDER BY at")


def ledger(pg_dsn: str, schema: str) -> list[tuple[Any, ...]]:
    return sql(
        pg_dsn,
        schema,
        "SELECT name, pages, items, cursor::text, finished_at IS NOT NULL FROM trio_jobs_backfills",
    )


def test_a_pass_pages_an_app_table_and_keeps_its_ledger(
    pg_dsn: str, pg_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn = conninfo_with_schema(pg_dsn, pg_schema)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hung-7").touch()  # as if page 3 had hung once already: this run does not
    job_id, view, rows, other = trio.run(_run_pass, dsn, pg_dsn, pg_schema)
    assert view.result == {"pages": 5, "items": 12}
    assert [s.name for s in view.steps] == [f"page:{n}" for n in range(1, 6)]
    assert view.steps[1].output == {"cursor": 6, "items": 6}
    assert [first for first, _pid in handled(pg_dsn, pg_schema)] == [1, 4, 7, 10, 0]
    assert sql(pg_dsn, pg_schema, "SELECT count(*) FROM bf_target") == [(12,)]
    [row] = rows
    assert (row.name, row.job_id, row.pages, row.items, row.cursor) == (
        "proc.copy-rows",
        job_id,
        5,
        12,
        None,
    )
    assert row.finished_at is not None
    assert row.started_at <= row.finished_at
    assert other == []

    # the operator's view of the same ledger
    out = CliRunner().invoke(main, ["backfills", "--json", "--database-url", dsn])
    assert out.exit_code == 0, out.output
    assert orjson.loads(out.output) == {
        "backfills": [
            {
                "name": "proc.copy-rows",
                "job_id": job_id,
                "pages": 5,
                "items": 12,
                "cursor": None,
                "started_at": row.started_at,
                "finished_at": row.finished_at,
            }
        ]
    }
    text = CliRunner().invoke(main, ["backfills", "--database-url", dsn])
    assert text.exit_code == 0, text.output
    assert job_id in text.output
    assert "proc.copy-rows" in text.output
    none = CliRunner().invoke(main, ["backfills", "--name", "nope", "--database-url", dsn])
    assert none.output.strip() == "no backfill pass of nope"

    # the job's own views carry its ledger row under "backfill"
    ledger_row = orjson.loads(out.output)["backfills"][0]
    shown = CliRunner().invoke(main, ["show", job_id, "--json", "--database-url", dsn])
    assert shown.exit_code == 0, shown.output
    assert orjson.loads(shown.output)["backfill"] == ledger_row
    listed = CliRunner().invoke(main, ["list", "--json", "--database-url", dsn])
    assert listed.exit_code == 0, listed.output
    assert [r["backfill"] for r in orjson.loads(listed.output)["rows"]] == [ledger_row]
    plain = CliRunner().invoke(main, ["show", job_id, "--database-url", dsn])
    assert "5 page(s), 12 item(s) handled; done" in plain.output


def test_the_backfills_command_refuses_a_bad_limit_before_any_io() -> None:
    url = "postgresql://nobody@127.0.0.1:1/none"
    out = CliRunner().invoke(main, ["backfills", "--limit", "0", "--database-url", url, "--json"])
    assert out.exit_code == 2, out.output
    assert "X_CONFIG_INVALID" in out.output


@pytest.mark.slow
def test_sigkill_mid_page_resumes_at_that_page_in_a_fresh_process(
    pg_dsn: str, pg_schema: str, tmp_path: Path
) -> None:
    dsn = conninfo_with_schema(pg_dsn, pg_schema)
    trio.run(_migrate, dsn)
    with_tables(pg_dsn, pg_schema)
    procs = Procs(dsn, tmp_path)

    try:
        first = procs.worker("--visibility-timeout", "2s", module="backfill_jobs")
        job_id = trio.run(_enqueue, dsn)
        wait_until(lambda: (tmp_path / "hung-7").exists(), 15, "page 3 to be handled")
        first.send_signal(signal.SIGKILL)
        first.wait(5)
        # pages 1 and 2 are checkpointed; page 3 was handled, never checkpointed
        assert ledger(pg_dsn, pg_schema) == [("proc.copy-rows", 2, 6, "6", False)]
        # the pass in flight, as the operator sees it: its rows so far and cursor
        in_flight = {"pages": 2, "items": 6, "cursor": 6, "finished_at": None}
        shown = CliRunner().invoke(main, ["show", job_id, "--json", "--database-url", dsn])
        assert shown.exit_code == 0, shown.output
        row = orjson.loads(shown.output)["backfill"]
        assert {k: row[k] for k in in_flight} == in_flight
        assert (row["name"], row["job_id"]) == ("proc.copy-rows", job_id)
        listed = CliRunner().invoke(main, ["list", "--json", "--database-url", dsn])
        [listed_row] = orjson.loads(listed.output)["rows"]
        assert listed_row["state"] == "running"
        assert listed_row["backfill"] == row
        steps = sql(
            pg_dsn,
            pg_schema,
            "SELECT name, status FROM trio_jobs_steps WHERE job_id = %s ORDER BY seq",
            (job_id,),
        )
        assert steps == [("page:1", "completed"), ("page:2", "completed")]
        procs.worker(
            "--visibility-timeout", "2s", "--idle-poll-max", "250ms", module="backfill_jobs"
        )
        wait_until(
            lambda: sql(pg_dsn, pg_schema, "SELECT state FROM trio_jobs_jobs")[0][0] == "done",
            20,
            "the pass to finish",
        )
    finally:
        procs.kill_all()
    log = handled(pg_dsn, pg_schema)
    pids = [pid for _first, pid in log]
    # the killed process handled pages 1-3; the fresh one resumed at page 3
    assert [first for first, _pid in log] == [1, 4, 7, 7, 10, 0]
    assert pids[0] == pids[1] == pids[2] == first.pid
    assert pids[3] == pids[4] == pids[5] != first.pid
    assert sql(pg_dsn, pg_schema, "SELECT count(*) FROM bf_target") == [(12,)]
    assert ledger(pg_dsn, pg_schema) == [("proc.copy-rows", 5, 12, "null", True)]
    assert sql(pg_dsn, pg_schema, "SELECT state, attempts FROM trio_jobs_jobs") == [("done", 2)]


async def _run_pass(dsn: str, pg_dsn: str, schema: str) -> tuple[Any, ...]:
    async with open_jobs(postgres_driver(dsn), jobs=[copy_rows]) as jobs:
        with_tables(pg_dsn, schema)
        enqueued = await copy_rows.enqueue(None)
        worker = Worker(jobs, queues=["default"], poll_interval="50ms")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(20):
                while (await jobs.show(enqueued.id)).state != "done":  # noqa: ASYNC110 — bounded wait on the queue
                    await trio.sleep(0.05)
            await worker.drain()
        return (
            enqueued.id,
            await jobs.show(enqueued.id),
            await jobs.backfills(),
            await jobs.backfills(name="other"),
        )


async def _migrate(dsn: str) -> None:
    from trio_jobs.drivers.postgres import migrate

    await migrate(dsn)


async def _enqueue(dsn: str) -> str:
    async with open_jobs(postgres_driver(dsn), jobs=[copy_rows]):
        return (await copy_rows.enqueue(None)).id
