"""Jobs-And-Workflows.md, "Rollups and materialized views", ``rollup()`` on
PostgreSQL: each run reads from the first instant of the bucket holding
``now - lookback`` in the bucket's zone (a day of Europe/Paris across both
changes, Kolkata's half-hour offset), maps every point, and writes ONE upsert on
``key``: every bucket or none. A re-run writes the same values (an unchanged
bucket is not rewritten), a late row inside ``lookback`` moves its bucket, one
older does not. Faults the run finds (no unique constraint covering ``key``, a
bad row) are ``X_JOB_ROLLUP_INVALID``, terminal, with nothing written; on the
memory driver a rollup is ``X_NOT_IMPLEMENTED``."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from jobs_support import jobs_on_memory
from pg_schemas import throwaway_schema
from rollup_support import run_at, sql
from trio_jobs import Bucket, ErrorCode, Retry, Worker, rollup

pytestmark = pytest.mark.postgres

TABLES = """
CREATE TABLE events (id bigserial PRIMARY KEY, org_id text NOT NULL, at timestamptz NOT NULL);
CREATE TABLE daily_signups (
    id bigserial PRIMARY KEY,
    org_id text NOT NULL,
    day timestamptz NOT NULL,
    signups integer NOT NULL,
    UNIQUE (org_id, day)
);
"""


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


@pytest.fixture
def dsn() -> Iterator[str]:
    with throwaway_schema("tj_rollup") as found:
        for statement in TABLES.split(";"):
            if statement.strip():
                sql(found, statement)
        yield found


def add(dsn: str, *events: tuple[str, datetime]) -> None:
    for org, at in events:
        sql(dsn, "INSERT INTO events (org_id, at) VALUES (%s, %s)", (org, at))


def per_day(zone: str, unit: str = "day") -> Any:
    async def source(tx: Any, since: datetime, input: Any) -> list[tuple[Any, ...]]:
        return await tx.execute(
            "SELECT org_id, date_trunc(%s, at, %s), count(*)::int FROM events"
            " WHERE at >= %s GROUP BY 1, 2 ORDER BY 1, 2",
            (unit, zone, since),
        )

    return source


def to_row(point: tuple[Any, ...], input: Any) -> dict[str, Any]:
    org, day, count = point
    return {"org_id": org, "day": day, "signups": count}


def signups(zone: str = "Europe/Paris", unit: str = "day", **over: Any) -> Any:
    fields: dict[str, Any] = {
        "name": "signups.daily",
        "into": "daily_signups",
        "key": ["org_id", "day"],
        "lookback": "2d",
        "bucket": Bucket(unit, zone),
        "source": per_day(zone, unit),
        "map": to_row,
        "retry": Retry(attempts=3, base="1s", jitter=False),
    }
    fields.update(over)
    return rollup(**fields)


def table(dsn: str, into: str = "daily_signups") -> list[tuple[Any, ...]]:
    return sql(dsn, f"SELECT org_id, day, signups FROM {into} ORDER BY org_id, day")


# ------------------------------------------------------------------------ since, DST


async def test_a_paris_day_across_the_spring_change_is_read_whole(dsn: str) -> None:
    add(
        dsn,
        ("a", utc(2026, 3, 28, 22, 59)),  # 23:59 CET, the 28th: older than the first bucket
        ("a", utc(2026, 3, 28, 23, 0)),  # 00:00 CET, the 29th: its first instant
        ("a", utc(2026, 3, 29, 0, 59)),  # 01:59 CET, just before the change
        ("a", utc(2026, 3, 29, 1, 0)),  # 03:00 CEST, the change
        ("a", utc(2026, 3, 29, 21, 59)),  # 23:59 CEST, its last minute (a 23-hour day)
        ("b", utc(2026, 3, 30, 8)),
    )
    # now - 2d = 2026-03-29 10:00Z, 12:00 CEST on the 29th
    view = await run_at(dsn, signups(), utc(2026, 3, 31, 10))
    assert view.state == "done", view.last_error
    assert view.result == {"since": "2026-03-29T00:00:00+01:00", "rows": 2}
    assert [s.name for s in view.steps] == ["upsert"]
    assert table(dsn) == [("a", utc(2026, 3, 28, 23), 4), ("b", utc(2026, 3, 29, 22), 1)]


async def test_a_paris_day_across_the_autumn_change_is_read_whole(dsn: str) -> None:
    add(
        dsn,
        ("a", utc(2026, 10, 24, 21, 59)),  # 23:59 CEST, the 24th
        ("a", utc(2026, 10, 24, 22, 0)),  # 00:00 CEST, the 25th: its first instant
        ("a", utc(2026, 10, 25, 0, 30)),  # 02:30 CEST
        ("a", utc(2026, 10, 25, 1, 30)),  # 02:30 CET, the repeated hour
        ("a", utc(2026, 10, 25, 22, 59)),  # 23:59 CET, its last minute (a 25-hour day)
        ("a", utc(2026, 10, 25, 23, 0)),  # 00:00 CET, the 26th
    )
    # now - 1d = 2026-10-25 22:30Z, 23:30 CET on the 25th
    view = await run_at(dsn, signups(lookback="1d"), utc(2026, 10, 26, 22, 30))
    assert view.state == "done", view.last_error
    assert view.result == {"since": "2026-10-25T00:00:00+02:00", "rows": 2}
    assert table(dsn) == [("a", utc(2026, 10, 24, 22), 4), ("a", utc(2026, 10, 25, 23), 1)]


async def test_a_paris_hour_in_the_repeated_hour_is_its_own_bucket(dsn: str) -> None:
    add(
        dsn,
        ("a", utc(2026, 10, 25, 0, 40)),  # 02:40 CEST: the first pass
        ("a", utc(2026, 10, 25, 1, 0)),  # 02:00 CET: the second pass starts
        ("a", utc(2026, 10, 25, 1, 50)),  # 02:50 CET
    )
    # now - 30m = 01:20Z = 02:20 CET: the bucket is the second pass, from 01:00Z
    view = await run_at(dsn, signups(unit="hour", lookback="30m"), utc(2026, 10, 25, 1, 50))
    assert view.state == "done", view.last_error
    assert view.result == {"since": "2026-10-25T02:00:00+01:00", "rows": 1}
    assert table(dsn) == [("a", utc(2026, 10, 25, 1), 2)]


async def test_a_half_hour_zone_starts_its_days_on_the_half_hour(dsn: str) -> None:
    add(
        dsn,
        ("a", utc(2026, 1, 1, 18, 29)),  # 23:59 IST, the 1st
        ("a", utc(2026, 1, 1, 18, 30)),  # 00:00 IST, the 2nd: the first bucket's first instant
        ("a", utc(2026, 1, 2, 18, 29)),  # 23:59 IST, the 2nd
    )
    # now - 1d = 2026-01-02 06:00Z = 11:30 IST on the 2nd
    view = await run_at(dsn, signups("Asia/Kolkata", lookback="1d"), utc(2026, 1, 3, 6))
    assert view.state == "done", view.last_error
    assert view.result == {"since": "2026-01-02T00:00:00+05:30", "rows": 1}
    assert table(dsn) == [("a", utc(2026, 1, 1, 18, 30), 2)]


# -------------------------------------------------------------- idempotent, late rows


async def test_a_rerun_writes_the_same_values_and_leaves_unchanged_buckets_alone(
    dsn: str,
) -> None:
    add(dsn, ("a", utc(2026, 6, 1, 8)), ("a", utc(2026, 6, 2, 8)), ("b", utc(2026, 6, 2, 9)))
    job = signups("UTC")
    now = utc(2026, 6, 2, 12)
    assert (await run_at(dsn, job, now)).state == "done"
    first = sql(dsn, "SELECT org_id, day, signups, xmin::text FROM daily_signups ORDER BY 1, 2")
    # a late row for b's bucket, inside lookback
    add(dsn, ("b", utc(2026, 6, 2, 10)))
    view = await run_at(dsn, job, now)
    assert view.result == {"since": "2026-05-31T00:00:00+00:00", "rows": 3}
    second = sql(dsn, "SELECT org_id, day, signups, xmin::text FROM daily_signups ORDER BY 1, 2")
    assert [r[:3] for r in second] == [
        ("a", utc(2026, 6, 1), 1),
        ("a", utc(2026, 6, 2), 1),
        ("b", utc(2026, 6, 2), 2),
    ]
    # a's buckets were not rewritten (same row version); b's moved
    assert [r[3] for r in second[:2]] == [r[3] for r in first[:2]]
    assert second[2][3] != first[2][3]


async def test_a_row_older_than_lookback_does_not_move_its_bucket(dsn: str) -> None:
    add(dsn, ("a", utc(2026, 6, 1, 8)))
    job = signups("UTC", lookback="1d")
    assert (await run_at(dsn, job, utc(2026, 6, 1, 20))).state == "done"
    add(dsn, ("a", utc(2026, 6, 1, 9)))  # lands two days late
    view = await run_at(dsn, job, utc(2026, 6, 3, 20))
    assert view.result == {"since": "2026-06-02T00:00:00+00:00", "rows": 0}
    assert table(dsn) == [("a", utc(2026, 6, 1), 1)]  # kept its last value


async def test_a_table_named_with_its_schema_is_written(dsn: str) -> None:
    schema = sql(dsn, "SELECT current_schema()")[0][0]
    add(dsn, ("a", utc(2026, 6, 1, 8)))
    job = signups("UTC", into=f"{schema}.daily_signups")
    view = await run_at(dsn, job, utc(2026, 6, 1, 20))
    assert view.state == "done", view.last_error
    assert table(dsn) == [("a", utc(2026, 6, 1), 1)]


async def test_a_key_covering_every_column_writes_new_buckets_only(dsn: str) -> None:
    sql(dsn, "CREATE TABLE active_days (org_id text, day timestamptz, PRIMARY KEY (org_id, day))")
    add(dsn, ("a", utc(2026, 6, 1, 8)), ("a", utc(2026, 6, 2, 8)))
    job = signups(
        "UTC",
        into="active_days",
        map=lambda p, _: {"org_id": p[0], "day": p[1]},
    )
    assert (await run_at(dsn, job, utc(2026, 6, 2, 20))).state == "done"
    assert (await run_at(dsn, job, utc(2026, 6, 2, 21))).state == "done"
    assert sql(dsn, "SELECT count(*) FROM active_days") == [(2,)]


# ------------------------------------------------------------ refused at the first run


@pytest.mark.parametrize(
    ("ddl", "into", "says"),
    [
        (
            "CREATE TABLE t (org_id text, day timestamptz, signups int)",
            "t",
            "no unique constraint on t covers key (org_id, day)",
        ),
        (
            "CREATE TABLE t (org_id text UNIQUE, day timestamptz, signups int)",
            "t",
            "no unique constraint on t covers key (org_id, day)",
        ),
        (
            "CREATE TABLE t (org_id text, day timestamptz, signups int, UNIQUE (org_id, day, signups))",
            "t",
            "no unique constraint on t covers key",
        ),
        (
            "CREATE TABLE t (org_id text, day timestamptz, signups int);"
            " CREATE UNIQUE INDEX ON t (org_id, day) WHERE signups > 0",
            "t",
            "no unique constraint on t covers key",
        ),
        (
            "CREATE TABLE t (org_id text, day timestamptz, signups int);"
            " CREATE UNIQUE INDEX ON t (lower(org_id), day)",
            "t",
            "no unique constraint on t covers key",
        ),
        (
            "CREATE TABLE t (org_id text, day timestamptz, signups int,"
            " UNIQUE (org_id, day) DEFERRABLE)",
            "t",
            "no unique constraint on t covers key",
        ),
        ("CREATE TABLE t (org_id text, signups int, UNIQUE (org_id))", "t", "t lacks"),
        ("CREATE VIEW t AS SELECT * FROM daily_signups", "t", "is a plain view"),
        ("SELECT 1", "nowhere", "names no table"),
    ],
)
async def test_a_target_the_upsert_cannot_use_is_refused_before_anything_is_read(
    dsn: str, ddl: str, into: str, says: str
) -> None:
    for statement in ddl.split(";"):
        sql(dsn, statement)
    add(dsn, ("a", utc(2026, 6, 1, 8)))
    read: list[datetime] = []

    def source(tx: Any, since: datetime, input: Any) -> list[Any]:
        read.append(since)
        return []

    view = await run_at(dsn, signups("UTC", into=into, source=source), utc(2026, 6, 1, 20))
    assert (view.state, view.error_code, view.attempts) == ("dead", "X_JOB_ROLLUP_INVALID", 1)
    assert says in (view.last_error or "")
    assert read == []


async def test_a_table_with_the_constraint_added_later_runs(dsn: str) -> None:
    sql(dsn, "CREATE TABLE t (org_id text, day timestamptz, signups int)")
    add(dsn, ("a", utc(2026, 6, 1, 8)))
    job = signups("UTC", into="t")
    assert (await run_at(dsn, job, utc(2026, 6, 1, 20))).error_code == "X_JOB_ROLLUP_INVALID"
    sql(dsn, "ALTER TABLE t ADD UNIQUE (day, org_id)")  # any order of the key
    assert (await run_at(dsn, job, utc(2026, 6, 1, 21))).state == "done"
    assert table(dsn, "t") == [("a", utc(2026, 6, 1), 1)]


# ----------------------------------------------------------------- every bucket or none


@pytest.mark.parametrize(
    ("map", "says"),
    [
        (lambda p, _: [p[0], p[1], p[2]], "map must answer a dict of column to value"),
        (
            lambda p, _: {"org_id": p[0], "day": p[1]} if p[0] == "b" else to_row(p, _),
            "rows of different columns",
        ),
        (lambda p, _: {**to_row(p, _), "colour": "red"}, "'colour' that 'daily_signups' lacks"),
        (lambda p, _: {"org_id": p[0], "signups": p[2]}, "lack the key column(s) day"),
        (lambda p, _: {**to_row(p, _), "org_id": "same"}, "two rows for one bucket"),
        (lambda p, _: {**to_row(p, _), "signups": "secret-value"}, "SQLSTATE 22P02"),
        (lambda p, _: {**to_row(p, _), "signups": object()}, "cannot be written"),
    ],
)
async def test_a_bad_row_writes_no_bucket_and_is_terminal(dsn: str, map: Any, says: str) -> None:
    add(dsn, ("a", utc(2026, 6, 1, 8)), ("b", utc(2026, 6, 1, 9)))
    view = await run_at(dsn, signups("UTC", map=map), utc(2026, 6, 1, 20))
    assert (view.state, view.error_code, view.attempts) == ("dead", "X_JOB_ROLLUP_INVALID", 1)
    assert says in (view.last_error or "")
    assert "secret-value" not in (view.last_error or "")
    assert table(dsn) == []


async def test_a_map_that_raises_midway_writes_no_bucket(dsn: str) -> None:
    add(dsn, ("a", utc(2026, 6, 1, 8)), ("b", utc(2026, 6, 1, 9)))

    def flaky(point: tuple[Any, ...], input: Any) -> dict[str, Any]:
        if point[0] == "b":
            raise RuntimeError("lookup failed")
        return to_row(point, input)

    view = await run_at(
        dsn, signups("UTC", map=flaky, retry=Retry(attempts=1)), utc(2026, 6, 1, 20)
    )
    assert view.state == "dead"
    assert "lookup failed" in (view.last_error or "")
    assert table(dsn) == []


async def test_a_source_that_answers_no_list_is_refused(dsn: str) -> None:
    view = await run_at(dsn, signups("UTC", source=lambda tx, s, i: 3), utc(2026, 6, 1, 20))
    assert (view.state, view.error_code) == ("dead", "X_JOB_ROLLUP_INVALID")
    assert "source must answer a list of points; it answered a int" in (view.last_error or "")


# ------------------------------------------------------------------------- crash_proof


async def test_a_rollup_killed_at_any_boundary_upserts_once(dsn: str) -> None:
    """Every boundary of the run killed in turn, on PostgreSQL: the table ends as
    the clean run left it, and exactly one upsert statement committed (a
    statement trigger logs each one, inside the run's transaction): the upsert
    commits with its step record, or neither does."""
    sql(dsn, "CREATE TABLE upserts (n bigserial PRIMARY KEY)")
    sql(
        dsn,
        "CREATE FUNCTION log_upsert() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN INSERT INTO upserts DEFAULT VALUES; RETURN NULL; END $$",
    )
    sql(
        dsn,
        "CREATE TRIGGER log_upsert AFTER INSERT ON daily_signups"
        " FOR EACH STATEMENT EXECUTE FUNCTION log_upsert()",
    )
    add(dsn, ("a", utc(2026, 6, 1, 8)), ("a", utc(2026, 6, 1, 9)), ("b", utc(2026, 6, 2, 8)))

    def observe() -> Any:
        return table(dsn), sql(dsn, "SELECT count(*) FROM upserts")

    def reset() -> None:
        sql(dsn, "TRUNCATE daily_signups, upserts")

    report = await crash_proof_on(dsn, signups("UTC"), observe, reset)
    assert report.points == [
        "before-step:upsert",
        "after-fn:upsert",
        "after-record:upsert",
        "before-settle",
    ]
    assert report.reference == (
        [("a", utc(2026, 6, 1), 2), ("b", utc(2026, 6, 2), 1)],
        [(1,)],
    )


async def crash_proof_on(dsn: str, job: Any, observe: Any, reset: Any) -> Any:
    """``crash_proof`` with each run on PostgreSQL in ``dsn``'s schema (the queue
    emptied before each run), the rollup's clock frozen on 2026-06-02 12:00 UTC."""
    import contextlib

    from trio_jobs import open_jobs, postgres_driver
    from trio_jobs.testing import HarnessClock
    from trio_jobs.testing._crash import _crash_proof

    class Ground:
        @contextlib.asynccontextmanager
        async def world(self, handles: list[Any]) -> Any:
            for name in ("trio_jobs_jobs", "trio_jobs_steps"):
                with contextlib.suppress(Exception):
                    sql(dsn, f"DELETE FROM {name}")
            clock = HarnessClock(utc(2026, 6, 2, 12).timestamp())
            driver = postgres_driver(dsn, clock=clock)
            async with open_jobs(driver, jobs=handles) as facade:
                yield facade, driver, clock

        async def next_wake(self, driver: Any) -> float | None:
            rows = sql(
                dsn,
                "SELECT min(CASE WHEN state = 'running' THEN lease_expires_at"
                " ELSE run_at END) FROM trio_jobs_jobs"
                " WHERE state IN ('ready', 'delayed', 'running', 'suspended')",
            )
            return rows[0][0]

        async def started_step(self, driver: Any) -> bool:
            return bool(sql(dsn, "SELECT 1 FROM trio_jobs_steps WHERE status = 'started'"))

    return await _crash_proof(job, None, observe=observe, reset=reset, jobs=None, ground=Ground())


# ---------------------------------------------------------------------------- drivers


async def test_on_the_memory_driver_a_rollup_is_not_implemented(autojump_clock: Any) -> None:
    job = signups("UTC", retry=Retry(attempts=1))
    async with jobs_on_memory([job]) as (jobs, _driver):
        enqueued = await job.enqueue(None)
        await Worker(jobs, queues=["default"]).run_until_quiet()
        view = await jobs.show(enqueued.id)
    assert (view.state, view.error_code) == ("dead", ErrorCode.X_NOT_IMPLEMENTED)
    assert "postgres_driver" in (view.last_error or "")
