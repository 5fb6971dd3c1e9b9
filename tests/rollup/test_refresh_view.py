"""Jobs-And-Workflows.md, "Rollups and materialized views", ``refresh_view()``
on PostgreSQL: each run is ``REFRESH MATERIALIZED VIEW [CONCURRENTLY]`` in one
step; ``concurrently`` needs a unique index on the view; a table, a plain view,
no relation, or ``concurrently`` with no usable unique index is
``X_JOB_REFRESH_VIEW_INVALID``, terminal, with the view left as it was."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from pg_schemas import throwaway_schema
from rollup_support import run_at, sql
from trio_jobs import Retry, refresh_view

from .test_run import crash_proof_on

pytestmark = pytest.mark.postgres

NOW = datetime(2026, 6, 1, 12, tzinfo=UTC)


@pytest.fixture
def dsn() -> Iterator[str]:
    with throwaway_schema("tj_view") as found:
        sql(found, "CREATE TABLE likes (post_id int NOT NULL)")
        sql(
            found,
            "CREATE MATERIALIZED VIEW post_totals AS"
            " SELECT post_id, count(*) AS total FROM likes GROUP BY post_id",
        )
        sql(found, "INSERT INTO likes VALUES (1), (1), (2)")
        yield found


def totals(dsn: str) -> list[tuple[Any, ...]]:
    return sql(dsn, "SELECT post_id, total FROM post_totals ORDER BY post_id")


def refresher(**over: Any) -> Any:
    fields: dict[str, Any] = {
        "name": "totals.refresh",
        "view": "post_totals",
        "retry": Retry(attempts=3, base="1s", jitter=False),
    }
    fields.update(over)
    return refresh_view(**fields)


async def test_a_run_refreshes_the_view_in_one_step(dsn: str) -> None:
    assert totals(dsn) == []
    view = await run_at(dsn, refresher(), NOW)
    assert view.state == "done", view.last_error
    assert view.result == {"view": "post_totals", "concurrently": False}
    assert [s.name for s in view.steps] == ["refresh"]
    assert totals(dsn) == [(1, 2), (2, 1)]


async def test_concurrently_refreshes_with_a_unique_index(dsn: str) -> None:
    sql(dsn, "CREATE UNIQUE INDEX ON post_totals (post_id)")
    assert (await run_at(dsn, refresher(), NOW)).state == "done"  # a concurrent refresh needs rows
    sql(dsn, "INSERT INTO likes VALUES (3)")
    view = await run_at(dsn, refresher(concurrently=True), NOW)
    assert view.state == "done", view.last_error
    assert view.result == {"view": "post_totals", "concurrently": True}
    assert totals(dsn) == [(1, 2), (2, 1), (3, 1)]


@pytest.mark.parametrize(
    ("ddl", "name", "concurrently", "says"),
    [
        ("SELECT 1", "likes", False, "is a table"),
        ("CREATE VIEW plain AS SELECT * FROM likes", "plain", False, "is a plain view"),
        ("SELECT 1", "nowhere", False, "names no relation"),
        ("SELECT 1", "post_totals", True, "concurrently=True needs a unique index"),
        (
            "CREATE INDEX ON post_totals (post_id)",
            "post_totals",
            True,
            "concurrently=True needs a unique index",
        ),
        (
            "CREATE UNIQUE INDEX ON post_totals (post_id) WHERE total > 1",
            "post_totals",
            True,
            "concurrently=True needs a unique index",
        ),
        (
            "CREATE UNIQUE INDEX ON post_totals ((post_id + 0))",
            "post_totals",
            True,
            "concurrently=True needs a unique index",
        ),
    ],
)
async def test_what_cannot_be_refreshed_is_refused_and_left_alone(
    dsn: str, ddl: str, name: str, concurrently: bool, says: str
) -> None:
    sql(dsn, ddl)
    view = await run_at(dsn, refresher(view=name, concurrently=concurrently), NOW)
    assert (view.state, view.error_code, view.attempts) == (
        "dead",
        "X_JOB_REFRESH_VIEW_INVALID",
        1,
    )
    assert says in (view.last_error or "")
    assert totals(dsn) == []  # never refreshed


async def test_a_refresh_killed_at_any_boundary_refreshes_once(dsn: str) -> None:
    """Every boundary killed in turn: the view is refreshed once. It counts its
    own refreshes: its query calls a function that logs a row per refresh,
    inside the run's transaction (rolled back with it)."""
    schema = sql(dsn, "SELECT current_schema()")[0][0]
    sql(dsn, "CREATE TABLE refreshes (n bigserial PRIMARY KEY)")
    # a refresh runs its query with a search path of its own: name the schema
    sql(
        dsn,
        "CREATE FUNCTION count_refresh() RETURNS bigint LANGUAGE sql VOLATILE AS"
        f' $$ INSERT INTO "{schema}".refreshes DEFAULT VALUES RETURNING n $$',
    )
    sql(dsn, "CREATE MATERIALIZED VIEW counted AS SELECT count_refresh() AS n WITH NO DATA")

    def observe() -> Any:
        populated = "SELECT ispopulated FROM pg_matviews WHERE matviewname = 'counted'"
        return sql(dsn, "SELECT count(*) FROM refreshes"), sql(dsn, populated)

    def reset() -> None:
        sql(dsn, "TRUNCATE refreshes")
        sql(dsn, "REFRESH MATERIALIZED VIEW counted WITH NO DATA")

    report = await crash_proof_on(dsn, refresher(view="counted"), observe, reset)
    assert report.points == [
        "before-step:refresh",
        "after-fn:refresh",
        "after-record:refresh",
        "before-settle",
    ]
    assert report.reference == ([(1,)], [(True,)])
