"""``trio-jobs tasks``, ``pause-task NAME``, ``resume-task NAME`` (each with
``--json``) against PostgreSQL, in process through click's runner. The CLI
imports no job module: it reads what a scheduler registered in the store."""

from __future__ import annotations

import orjson
import trio
from click.testing import CliRunner

from trio_jobs import JobContext, Occurrence, open_jobs, task
from trio_jobs._scheduler import fire_due
from trio_jobs.cli import main
from trio_jobs.drivers.postgres import postgres_driver
from trio_jobs.drivers.postgres._driver import conninfo_with_schema


@task(cron="*/5 * * * *", tz="Europe/Paris", name="cli.report", catch_up="latest")
async def report(ctx: JobContext[Occurrence]) -> None:
    return None


async def _register(dsn: str, schema: str) -> None:
    async with open_jobs(postgres_driver(dsn, schema=schema), jobs=[report]) as jobs:
        assert await fire_due(jobs, [report], "cli-test") == 0  # armed now: nothing due


def test_tasks_pause_and_resume_from_the_command_line(pg_dsn: str, pg_schema: str) -> None:
    trio.run(_register, pg_dsn, pg_schema)
    url = conninfo_with_schema(pg_dsn, pg_schema)
    cli = CliRunner()

    out = cli.invoke(main, ["tasks", "--json", "--database-url", url])
    assert out.exit_code == 0, out.output
    [row] = orjson.loads(out.output)["tasks"]
    assert row["name"] == "cli.report"
    assert row["schedule"] == "*/5 * * * *"
    assert row["tz"] == "Europe/Paris"
    assert row["paused"] is False
    assert row["last_fire"] is None
    assert row["next_fire"].endswith(("+01:00", "+02:00"))

    out = cli.invoke(main, ["pause-task", "cli.report", "--json", "--database-url", url])
    assert out.exit_code == 0, out.output
    assert orjson.loads(out.output) == {
        "ok": True,
        "action": "pause-task",
        "task": "cli.report",
        "paused_tasks": ["cli.report"],
    }
    out = cli.invoke(main, ["tasks", "--database-url", url])
    assert out.exit_code == 0
    assert "cli.report" in out.output
    assert "yes" in out.output

    out = cli.invoke(main, ["resume-task", "cli.report", "--database-url", url])
    assert out.exit_code == 0, out.output
    assert out.output.strip() == "resumed cli.report; paused tasks: none"

    out = cli.invoke(main, ["pause-task", "no.such.task", "--json", "--database-url", url])
    assert out.exit_code != 0
    assert orjson.loads(out.output)["error"]["code"] == "X_TASK_NOT_FOUND"
    out = cli.invoke(main, ["resume-task", "no.such.task", "--database-url", url])
    assert out.exit_code != 0
    assert out.output.startswith("X_TASK_NOT_FOUND")
