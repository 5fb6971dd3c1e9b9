"""The migrator: numbered ``migrations/NNNN_*.sql`` files, applied in order.

Idempotent and safe to race: every run takes a transaction-scoped advisory lock
(per schema), records each applied version in ``trio_jobs_migrations``, and
applies all pending versions in one transaction, so a failure leaves the schema
where it was.
"""

from __future__ import annotations

from ...errors import ErrorCode, JobsError
from ._bridge import Database
from ._sql import migrations

__all__ = ["LATEST", "migrate", "schema_version"]

VERSIONS_TABLE = "trio_jobs_migrations"
LATEST: int = migrations()[-1][0]

_LOCK = "SELECT pg_advisory_xact_lock(hashtext('trio_jobs.migrate:' || current_schema()))"
_CREATE = f"""CREATE TABLE IF NOT EXISTS {VERSIONS_TABLE} (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)"""


async def schema_version(db: Database) -> int:
    """The highest applied version, 0 for a database never migrated."""
    rows = await db.fetch(f"SELECT to_regclass('{VERSIONS_TABLE}') IS NOT NULL")
    if not rows[0][0]:
        return 0
    rows = await db.fetch(f"SELECT coalesce(max(version), 0) FROM {VERSIONS_TABLE}")
    return int(rows[0][0])


async def migrate(db: Database) -> list[int]:
    """Apply every pending migration; answers the versions applied (none: up to date)."""
    applied_now: list[int] = []
    async with db.transaction() as tx:
        if current_schema_missing(await tx.execute("SELECT current_schema()")):
            raise JobsError(
                ErrorCode.X_CONFIG_INVALID,
                "the connection has no current schema to migrate (its search_path names "
                "no existing schema); create the schema or fix the search_path",
            )
        await tx.execute(_LOCK)
        await tx.execute(_CREATE)
        done = {int(r[0]) for r in await tx.execute(f"SELECT version FROM {VERSIONS_TABLE}")}
        newest = max(done, default=0)
        if newest > LATEST:
            raise too_new(newest)
        for version, name, sql in migrations():
            if version in done:
                continue
            await tx.execute(sql)
            await tx.execute(
                f"INSERT INTO {VERSIONS_TABLE} (version, name) VALUES (%s, %s)", (version, name)
            )
            applied_now.append(version)
    return applied_now


def current_schema_missing(rows: list[tuple[object, ...]]) -> bool:
    return not rows or rows[0][0] is None


def too_new(version: int) -> JobsError:
    return JobsError(
        ErrorCode.X_CONFIG_INVALID,
        f"the database schema is at version {version}, newer than this trio-jobs knows "
        f"({LATEST}); upgrade trio-jobs on this host",
        meta={"schema_version": version, "known": LATEST},
    )


def out_of_date(version: int) -> JobsError:
    return JobsError(
        ErrorCode.X_CONFIG_INVALID,
        f"the database schema is at version {version}, this trio-jobs needs {LATEST}; "
        "run `trio-jobs migrate` (or open the driver with migrate=True)",
        meta={"schema_version": version, "required": LATEST},
    )
