"""Migrations: idempotent, locked, recorded; replaying them gives the shipped schema."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import psycopg
import pytest
import trio

from trio_jobs.drivers.postgres import SCHEMA_VERSION, migrate, postgres_driver
from trio_jobs.drivers.postgres._sql import migrations, schema_sql
from trio_jobs.errors import JobsError

from .conftest import sql

pytestmark = pytest.mark.postgres

_CATALOG = """
SELECT 'column', c.table_name || '.' || c.column_name,
       c.data_type || ' ' || c.is_nullable || ' ' ||
       coalesce(regexp_replace(c.column_default, 'tj_[0-9a-f]+\\.', '', 'g'), '')
FROM information_schema.columns c WHERE c.table_schema = %(s)s
UNION ALL
SELECT 'index', i.tablename || '.' || i.indexname,
       regexp_replace(i.indexdef, 'tj_[0-9a-f]+\\.', '', 'g')
FROM pg_indexes i WHERE i.schemaname = %(s)s
UNION ALL
SELECT 'constraint', t.relname || '.' || k.conname, pg_get_constraintdef(k.oid)
FROM pg_constraint k JOIN pg_class t ON t.oid = k.conrelid
JOIN pg_namespace n ON n.oid = t.relnamespace WHERE n.nspname = %(s)s
UNION ALL
SELECT 'function', p.proname, pg_get_function_arguments(p.oid) || ' -> ' ||
       pg_get_function_result(p.oid) || ' ' || md5(p.prosrc)
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %(s)s
UNION ALL
SELECT 'sequence', s.sequencename, s.data_type::text FROM pg_sequences s WHERE s.schemaname = %(s)s
UNION ALL
SELECT 'trigger', c.relname || '.' || t.tgname,
       regexp_replace(pg_get_triggerdef(t.oid), 'tj_[0-9a-f]+\\.', '', 'g')
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %(s)s AND NOT t.tgisinternal
ORDER BY 1, 2, 3
"""


@pytest.fixture
def other_schema(pg_dsn: str) -> Iterator[str]:
    name = f"tj_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    yield name
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{name}" CASCADE')


def _catalog(dsn: str, schema: str) -> list[tuple[object, ...]]:
    rows = sql(dsn, schema, _CATALOG, {"s": schema})
    return [r for r in rows if "trio_jobs_migrations" not in str(r[1])]


async def test_replaying_the_migrations_gives_the_shipped_schema(
    pg_dsn: str, pg_schema: str, other_schema: str
) -> None:
    assert await migrate(pg_dsn, schema=pg_schema) == [v for v, _n, _s in migrations()]
    with psycopg.connect(pg_dsn, autocommit=True, options=f"-c search_path={other_schema}") as c:
        c.execute(schema_sql().encode())
    replayed, shipped = _catalog(pg_dsn, pg_schema), _catalog(pg_dsn, other_schema)
    assert replayed
    assert replayed == shipped


async def test_migrate_is_idempotent_and_records_versions(pg_dsn: str, pg_schema: str) -> None:
    versions = [v for v, _n, _s in migrations()]
    assert versions[-1] == SCHEMA_VERSION
    assert await migrate(pg_dsn, schema=pg_schema) == versions
    assert await migrate(pg_dsn, schema=pg_schema) == []
    rows = sql(pg_dsn, pg_schema, "SELECT version, name FROM trio_jobs_migrations ORDER BY 1")
    assert [r[0] for r in rows] == versions
    assert rows[0][1] == "0001_initial.sql"


async def test_racing_migrators_apply_each_version_once(pg_dsn: str, pg_schema: str) -> None:
    applied: list[list[int]] = []

    async def one() -> None:
        applied.append(await migrate(pg_dsn, schema=pg_schema))

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(one)
    versions = tuple(v for v, _n, _s in migrations())
    assert sorted(map(tuple, applied)) == [(), (), (), versions]


async def test_migrate_false_refuses_an_out_of_date_schema(pg_dsn: str, pg_schema: str) -> None:
    driver = postgres_driver(pg_dsn, schema=pg_schema, migrate=False)
    with pytest.raises(JobsError) as err:
        await driver.open()
    assert err.value.code == "X_CONFIG_INVALID"
    assert "trio-jobs migrate" in err.value.message
    await migrate(pg_dsn, schema=pg_schema)
    await driver.open()
    await driver.close()


async def test_constructing_does_no_io() -> None:
    driver = postgres_driver("postgresql://nobody@127.0.0.1:1/none")
    assert driver.name == "postgres"
    with pytest.raises(JobsError) as err:
        await driver.enqueue_many([])
    assert err.value.code == "X_DRIVER_UNAVAILABLE"
    with pytest.raises(JobsError) as err:
        await driver.open()
    assert err.value.code == "X_DRIVER_UNAVAILABLE"


async def test_0020_moves_an_open_attempt_entry_to_its_columns_and_reads_the_same(
    pg_dsn: str, pg_schema: str
) -> None:
    """Logs written before 0020 (an open entry on a running row, the entry an
    ack left open on a done row, closed entries only) read back the same after
    it, and the open entry now lives in the row's columns."""
    with psycopg.connect(pg_dsn, autocommit=True, options=f"-c search_path={pg_schema}") as c:
        c.execute(
            "CREATE TABLE trio_jobs_migrations (version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for version, name, text in migrations():
            if version >= 20:
                break
            c.execute(text.encode())
            c.execute("INSERT INTO trio_jobs_migrations VALUES (%s, %s)", (version, name))
        closed = {
            "attempt": 1,
            "worker_id": "w1",
            "started_at": 10.0,
            "ended_at": 11.0,
            "outcome": "retried",
            "error_code": "X_BOOM",
            "error": "boom",
        }
        open_running = {
            "attempt": 2,
            "worker_id": "w2",
            "started_at": 12.0,
            "step": "charge",
            "step_started_at": 12.5,
        }
        open_done = {"attempt": 1, "worker_id": "w3", "started_at": 20.0}
        rows = [
            ("running", 2, [closed, open_running]),
            ("done", 1, [open_done]),
            ("ready", 1, [closed]),
            ("ready", 0, None),
        ]
        for k, (state, attempts, log) in enumerate(rows):
            c.execute(
                "INSERT INTO trio_jobs_jobs (id, run_id, name, queue, idempotency_key,"
                " max_attempts, state, attempts, run_at, created_at, updated_at, attempt_log)"
                " VALUES (gen_random_uuid(), gen_random_uuid(), 'j', 'q', %s, 5, %s, %s, 1, 1,"
                " 30, %s::jsonb)",
                (f"k{k}", state, attempts, None if log is None else json.dumps(log)),
            )
        before = dict(
            c.execute(
                "SELECT idempotency_key, trio_jobs_attempt_read(attempt_log, state, updated_at)"
                " FROM trio_jobs_jobs"
            ).fetchall()
        )
    assert await migrate(pg_dsn, schema=pg_schema) == [v for v, _n, _s in migrations() if v >= 20]
    after = dict(
        sql(
            pg_dsn,
            pg_schema,
            "SELECT idempotency_key, trio_jobs_attempt_view(attempt_log, attempts, attempt_worker,"
            " attempt_at, attempt_step, attempt_step_at, state, updated_at) FROM trio_jobs_jobs",
        )
    )
    assert after == before
    assert before["k1"] == [{**open_done, "ended_at": 30.0, "outcome": "done"}]
    columns = sql(
        pg_dsn,
        pg_schema,
        "SELECT idempotency_key, attempt_log, attempt_at, attempt_worker, attempt_step,"
        " attempt_step_at FROM trio_jobs_jobs ORDER BY idempotency_key",
    )
    assert columns == [
        ("k0", [closed], 12.0, "w2", "charge", 12.5),
        ("k1", None, 20.0, "w3", None, None),
        ("k2", [closed], None, None, None, None),
        ("k3", None, None, None, None, None),
    ]
