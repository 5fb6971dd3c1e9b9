"""``trio-jobs migrate`` and ``trio-jobs dev`` against a real server (the test's
schema as the connection's search_path)."""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner

from trio_jobs.cli import main
from trio_jobs.drivers.postgres import SCHEMA_VERSION
from trio_jobs.drivers.postgres._driver import conninfo_with_schema
from trio_jobs.drivers.postgres._sql import migrations

from .conftest import sql

pytestmark = pytest.mark.postgres


def test_migrate_is_idempotent(pg_dsn: str, pg_schema: str) -> None:
    url = conninfo_with_schema(pg_dsn, pg_schema)
    runner = CliRunner()
    first = runner.invoke(main, ["migrate", "--json", "--database-url", url])
    assert first.exit_code == 0, first.output
    known = [v for v, _n, _s in migrations()]
    assert orjson.loads(first.output)["applied"] == known
    again = runner.invoke(main, ["migrate", "--database-url", url, "--json"])
    assert again.exit_code == 0
    assert orjson.loads(again.output) == {
        "ok": True,
        "applied": [],
        "version": SCHEMA_VERSION,
        "database": "--database-url",
    }
    versions = sql(pg_dsn, pg_schema, "SELECT version FROM trio_jobs_migrations ORDER BY 1")
    assert [v for (v,) in versions] == known


def test_dev_runs_the_example_to_completion_and_prints_the_result(
    pg_dsn: str, pg_schema: str
) -> None:
    url = conninfo_with_schema(pg_dsn, pg_schema)
    out = CliRunner().invoke(main, ["dev", "--orgs", "2", "--json", "--database-url", url])
    assert out.exit_code == 0, out.output
    body = orjson.loads(out.output)
    assert [r["state"] for r in body["rows"]] == ["done", "done"]
    for r in body["rows"]:
        assert r["steps"].startswith("provision(1), welcome-email(")  # provision never re-ran
        assert r["steps"].endswith("sleep:1(1), nudge(1)")
    states = sql(pg_dsn, pg_schema, "SELECT state, count(*) FROM trio_jobs_jobs GROUP BY 1")
    assert states == [("done", 2)]  # in the database named, not the embedded one


def test_dev_prints_the_table(pg_dsn: str, pg_schema: str) -> None:
    url = conninfo_with_schema(pg_dsn, pg_schema)
    out = CliRunner().invoke(main, ["dev", "--orgs", "1", "--database-url", url])
    assert out.exit_code == 0, out.output
    assert "trio-jobs dev: examples.onboard_org" in out.output
    assert "done" in out.output
    assert "effects:" in out.output
