"""Jobs that write the app's own PostgreSQL tables, checked with
``--database-url``: a ``step.transaction`` booking an order, a rollup, a
materialized view's refresh and a subject's erase and export. The gate's
throwaway schema holds only the library's tables: ``trio_jobs_setup(tx)``
creates the app's (``IF NOT EXISTS``: they outlive a run, their rows do not)
and seeds the rows the jobs read, before every crash run.

The observation is the app's rows, read back through the gate's own driver
(the ambient facade inside a run is gone when ``trio_jobs_observe`` runs, so
the module keeps the last one ``trio_jobs_setup`` was handed)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import attrs
from obstore.store import MemoryStore

from trio_jobs import (
    Anonymize,
    Bucket,
    JobContext,
    Retry,
    Transaction,
    define_subject,
    job,
    refresh_view,
    rollup,
    subject_erase,
    subject_export,
)

TABLES = """
CREATE TABLE IF NOT EXISTS ck_orders (id int PRIMARY KEY, cents int NOT NULL);
CREATE TABLE IF NOT EXISTS ck_bookings (order_id int PRIMARY KEY, cents int NOT NULL);
CREATE TABLE IF NOT EXISTS ck_events (org_id int NOT NULL, at timestamptz NOT NULL);
CREATE TABLE IF NOT EXISTS ck_daily (org_id int, day timestamptz, n int NOT NULL,
                                     PRIMARY KEY (org_id, day));
CREATE MATERIALIZED VIEW IF NOT EXISTS ck_totals AS
    SELECT count(*)::int AS n FROM ck_bookings;
CREATE TABLE IF NOT EXISTS ck_members (id int PRIMARY KEY, email text NOT NULL);
CREATE TABLE IF NOT EXISTS ck_notes (id int PRIMARY KEY,
                                     member_id int REFERENCES ck_members (id), body text)
"""
SEED = """
INSERT INTO ck_orders SELECT g, 100 * g FROM generate_series(1, 3) g;
INSERT INTO ck_events SELECT g % 2, now() FROM generate_series(1, 5) g;
INSERT INTO ck_members SELECT g, 'm' || g || '@example.com' FROM generate_series(1, 3) g;
INSERT INTO ck_notes SELECT g, 1 + g % 3, 'note ' || g FROM generate_series(1, 6) g;
REFRESH MATERIALIZED VIEW ck_totals
"""


async def trio_jobs_setup(tx: Transaction) -> None:
    for statement in (TABLES + ";" + SEED).split(";"):
        if statement.strip():
            await tx.execute(statement, ())


@attrs.frozen
class Order:
    id: int


async def _book(tx: Transaction, order_id: int) -> int:
    rows = await tx.execute(
        "INSERT INTO ck_bookings SELECT id, cents FROM ck_orders WHERE id = %s RETURNING cents",
        (order_id,),
    )
    return int(rows[0][0])


@job(
    name="app.book", input=Order, idempotency_key=lambda o: f"book:{o.id}", retry=Retry(attempts=5)
)
async def book(ctx: JobContext[Order]) -> int:
    # A plain INSERT: the step's record commits with it, so a crash never books twice
    # (booking twice would be a unique violation).
    cents = await ctx.step.transaction("book", lambda tx: _book(tx, ctx.input.id))
    await ctx.step.run("notify", lambda: None)
    return int(cents)


DAY = Bucket("day", "UTC")


async def _events_since(tx: Transaction, since: datetime, input: None) -> list[tuple[Any, ...]]:
    return await tx.execute(
        "SELECT org_id, date_trunc('day', at, 'UTC'), count(*)::int FROM ck_events"
        " WHERE at >= %s GROUP BY 1, 2",
        (since,),
    )


daily = rollup(
    name="app.daily",
    into="ck_daily",
    key=["org_id", "day"],
    lookback="2d",
    bucket=DAY,
    source=_events_since,
    map=lambda p, input: {"org_id": p[0], "day": p[1], "n": p[2]},
)

totals = refresh_view(name="app.totals", view="ck_totals")

members = define_subject(
    "ck_members",
    key="id",
    tables={"ck_members": Anonymize({"email": "erased@example.invalid"}), "ck_notes": "delete"},
)


@attrs.frozen
class Member:
    id: int


erase = subject_erase(
    name="app.erase", input=Member, subject=members, key=lambda m: m.id, retry=Retry(attempts=5)
)
exports = MemoryStore()
export = subject_export(
    name="app.export",
    input=Member,
    subject=members,
    key=lambda m: m.id,
    sink=lambda m: exports,
    prefix=lambda m: f"subjects/{m.id}",
)

trio_jobs_examples = {
    "app.book": [Order(1), Order(2)],
    "app.daily": [None],
    "app.totals": [None],
    "app.erase": [Member(1)],
    "app.export": [Member(2)],
}
