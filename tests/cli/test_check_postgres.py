"""``trio-jobs check --database-url``: the crash runs on a real PostgreSQL, in a
throwaway schema the gate makes and drops; the report as on the memory driver."""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys

import orjson
import psycopg
import pytest
import trio
from click.testing import CliRunner

from pg_schemas import base_dsn, throwaway_schema
from trio_jobs import ErrorCode, JobsError
from trio_jobs.cli import main
from trio_jobs.cli._check import reproduce_command, without_password
from trio_jobs.testing import check_jobs

pytestmark = pytest.mark.postgres

TESTS = pathlib.Path(__file__).resolve().parents[1]
SCHEMA_SAID = re.compile(r"throwaway schema (trio_jobs_check_[0-9a-f]+)")


@pytest.fixture(scope="module")
def dsn() -> str:
    return base_dsn()


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["check", *args])
    return result.exit_code, result.stdout, result.stderr


def schemas(dsn: str) -> set[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'trio\\_jobs\\_check\\_%'"
        ).fetchall()
    return {str(r[0]) for r in rows}


def said_schema(err: str) -> str:
    found = SCHEMA_SAID.search(err)
    assert found is not None, err
    return found.group(1)


def test_a_good_app_passes_on_postgres_as_on_memory_and_its_schema_is_gone(dsn: str) -> None:
    args = ("check_apps.good", "--examples", "2", "--seeds", "2", "--json")
    code, out, err = invoke(*args, "--database-url", dsn)
    assert code == 0, out + err
    assert orjson.loads(out) == orjson.loads(invoke(*args)[1])  # the same report, same shape
    schema = said_schema(err)
    assert "simulation seeds on the memory driver" in err
    assert schema not in schemas(dsn)


def test_the_double_effect_fails_on_postgres_as_on_memory(dsn: str) -> None:
    code, out, err = invoke("check_apps.double", "--seeds", "1", "--json", "--database-url", dsn)
    assert code == 1, out + err
    (failure,) = orjson.loads(out)["jobs"][0]["failures"]
    _code, memory_out, _ = invoke("check_apps.double", "--seeds", "1", "--json")
    (on_memory,) = orjson.loads(memory_out)["jobs"][0]["failures"]
    assert failure["code"] == on_memory["code"] == "X_JOB_CRASH_DIVERGED"
    assert (failure["example"], failure["boundary"]) == (0, "after-fn:charge")
    assert (failure["example"], failure["boundary"]) == (
        on_memory["example"], on_memory["boundary"],
    )  # fmt: skip
    assert failure["reproduce"] == shlex.join(
        ["trio-jobs", "check", "check_apps.double", "--seeds", "1", "--database-url", dsn,
         "--json", "--job", "pay", "--example", "0"]
    )  # fmt: skip
    assert said_schema(err) not in schemas(dsn)


def test_the_reproduce_line_runs_on_postgres_and_fails_alone_the_same_way(dsn: str) -> None:
    _code, out, _ = invoke(
        "check_apps.wallclock", "--examples", "2", "--seeds", "1", "--json", "--database-url", dsn
    )
    (failure,) = orjson.loads(out)["jobs"][0]["failures"]
    assert failure["code"] == "X_JOB_NONDETERMINISTIC"
    assert "recorded run has 'summary' (step 2 of 3)" in failure["message"]
    words = shlex.split(failure["reproduce"])
    assert words[words.index("--database-url") + 1] == dsn
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}
    env.pop("DATABASE_URL", None)  # check never reads it: the line carries the URL
    done = subprocess.run(
        [sys.executable, "-m", "trio_jobs.cli", *words[1:]],
        capture_output=True, env=env, cwd=TESTS, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    (again,) = orjson.loads(done.stdout)["jobs"][0]["failures"]
    assert (again["code"], again["example"], again["boundary"], again["message"]) == (
        failure["code"], failure["example"], failure["boundary"], failure["message"],
    )  # fmt: skip
    assert said_schema(done.stderr.decode()) not in schemas(dsn)


async def test_a_step_transaction_job_is_checked_on_postgres(dsn: str) -> None:
    from check_apps import transfer
    from trio_jobs.drivers.postgres import postgres_driver

    notes: list[str] = []

    class Notes:
        def job_started(self, *a: object) -> None: ...
        def boundary_done(self, *a: object) -> None: ...
        def seed_done(self, *a: object) -> None: ...
        def job_done(self, *a: object) -> None: ...
        def note(self, text: str) -> None:
            notes.append(text)

    report = await check_jobs(
        transfer,
        seeds=1,
        driver=postgres_driver(dsn),
        progress=Notes(),  # type: ignore[arg-type]
    )
    assert report.ok, report.to_json()
    assert report.jobs[0].boundaries > 0
    (note,) = notes
    assert said_schema(note) not in schemas(dsn)


async def test_only_a_seed_runs_no_crash_run_and_makes_no_schema(dsn: str) -> None:
    from check_apps import race
    from trio_jobs.drivers.postgres import postgres_driver

    before = schemas(dsn)
    report = await check_jobs(race, job="deposit", seed=0, driver=postgres_driver(dsn))
    assert report.jobs[0].boundaries == 0
    assert schemas(dsn) <= before


def test_ctrl_c_drops_the_schema(dsn: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "trio_jobs.cli", "check", "check_apps.good", "--examples", "50",
         "--json", "--database-url", dsn],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=TESTS, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # said once the schema exists, before the first run
        schema = said_schema(line)
        assert schema in schemas(dsn)
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, err
    assert schema not in schemas(dsn), err


def test_a_reset_never_empties_a_schema_the_gate_did_not_make(dsn: str) -> None:
    from trio_jobs.drivers.postgres import postgres_driver
    from trio_jobs.drivers.postgres._sql import query

    async def go(schema_dsn: str) -> None:
        driver = postgres_driver(schema_dsn)
        await driver.open()
        try:
            with pytest.raises(psycopg.errors.RaiseException, match="only its own throwaway"):
                await driver.db.fetch(query("check_reset"))
            await driver.db.fetch("SELECT 1 FROM trio_jobs_jobs")  # the tables are still there
        finally:
            await driver.close()

    with throwaway_schema("tj_app") as schema_dsn:
        trio.run(go, schema_dsn)


def test_a_password_is_left_out_of_the_reproduce_line() -> None:
    line = reproduce_command(
        "app.jobs", 20, 100, True, "pay", 0, None,
        "postgresql://ci:s3cret@db.example:5432/app?sslmode=require",
    )  # fmt: skip
    assert "s3cret" not in line
    assert "--database-url" in line
    assert "db.example" in line
    plain = "postgresql://ci@db.example/app"
    assert without_password(plain) == plain
    assert "s3cret" not in without_password("host=db user=ci password=s3cret dbname=app")


def test_bad_database_urls_exit_2() -> None:
    code, _, err = invoke("check_apps.good", "--database-url", " ")
    assert (code, "--database-url is empty" in err) == (2, True)
    code, out, _ = invoke(
        "check_apps.good", "--seeds", "1", "--json", "--database-url",
        "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1",
    )  # fmt: skip
    assert code == 2
    assert orjson.loads(out)["error"]["code"] in {"X_DRIVER_UNAVAILABLE", "X_CONFIG_INVALID"}


async def test_a_driver_the_gate_cannot_run_on_is_refused() -> None:
    from check_apps import good
    from trio_jobs import redis_driver

    with pytest.raises(JobsError) as info:
        await check_jobs(good, seeds=1, driver=redis_driver("redis://127.0.0.1:6379/0"))
    assert info.value.code == ErrorCode.X_NOT_IMPLEMENTED
    assert "memory driver or PostgreSQL" in info.value.message


async def test_the_apps_own_tables_come_from_its_setup_hook(dsn: str) -> None:
    """trio_jobs_setup(tx) makes the app's tables in the throwaway schema and seeds
    them before every crash run: a step.transaction over them, a rollup, a view's
    refresh and a subject's erase and export are each walked at every boundary."""
    from check_apps import tables_pg
    from trio_jobs import postgres_driver

    report = await check_jobs(tables_pg, seeds=0, driver=postgres_driver(dsn))
    assert report.ok, report.to_json()
    found = {j.name: j.boundaries for j in report.jobs}
    assert set(found) == {"app.book", "app.daily", "app.totals", "app.erase", "app.export"}
    assert all(n >= 4 for n in found.values()), found
    # The tables were the gate's: none is left in the public schema.
    with psycopg.connect(dsn, autocommit=True) as conn:
        left = conn.execute("SELECT to_regclass('public.ck_orders')").fetchone()
    assert left is not None
    assert left[0] is None


async def test_a_write_outside_the_step_over_the_apps_table_fails_the_gate(dsn: str) -> None:
    from check_apps import tables_pg_double
    from trio_jobs import postgres_driver

    report = await check_jobs(tables_pg_double, seeds=0, driver=postgres_driver(dsn))
    (failure,) = report.jobs[0].failures
    assert failure.code == ErrorCode.X_JOB_CRASH_DIVERGED
    assert failure.boundary == "after-fn:pay"
    assert "state dead against done" in failure.message


async def test_a_setup_hook_that_raises_stops_the_gate_as_a_usage_error(dsn: str) -> None:
    from check_apps import tables_pg_double
    from trio_jobs import postgres_driver

    def setup(tx: object) -> None:
        raise RuntimeError("secret-ddl-text")

    with pytest.raises(JobsError) as info:
        await check_jobs(tables_pg_double, seeds=0, setup=setup, driver=postgres_driver(dsn))
    assert info.value.code == ErrorCode.X_CONFIG_INVALID
    assert "trio_jobs_setup(tx) raised RuntimeError" in info.value.message
    assert "secret-ddl-text" not in info.value.message


def test_the_cli_runs_the_setup_hook_and_exits_1_on_the_planted_bug(dsn: str) -> None:
    code, out, err = invoke(
        "check_apps.tables_pg_double", "--seeds", "0", "--json", "--database-url", dsn
    )
    assert code == 1, out + err
    (failure,) = orjson.loads(out)["jobs"][0]["failures"]
    assert (failure["code"], failure["boundary"]) == ("X_JOB_CRASH_DIVERGED", "after-fn:pay")
