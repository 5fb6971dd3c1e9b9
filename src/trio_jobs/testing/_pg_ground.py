"""``trio-jobs check --database-url``: the crash runs on PostgreSQL.

The gate makes a throwaway schema (``trio_jobs_check_<id>``), migrates it, and
runs every crash run of every job in it, emptied before each run (one
statement, ``check_reset`` in ``sql/check.sql``, which refuses any schema not
named so). One driver, on one frozen clock that only moves forward, serves
every run; the schema is dropped when the gate ends, however it ends (a
failure, an error, Ctrl-C). A gate killed outright (SIGKILL) leaves its schema
behind: drop ``trio_jobs_check_*`` schemas by hand.

The app's own tables: the schema holds only the library's after the
migration, so a ``step.transaction`` (or a rollup, an import, an erase) that
writes the app's tables would find them missing. A module's
``trio_jobs_setup(tx)`` hook (sync or async; ``tx`` a
:class:`~trio_jobs.Transaction` on the throwaway schema) runs before every
crash run, right after the schema was emptied: it creates the app's tables
(``CREATE TABLE IF NOT EXISTS``: the tables outlive a run, their rows do not)
and inserts the rows the jobs read, and commits with its transaction.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

import trio

from .._declare import Job
from .._facade import Jobs, Transaction, open_jobs
from .._time import UuidSource
from ..drivers.postgres._bridge import Database, Pool
from ..drivers.postgres._driver import PostgresDriver
from ..drivers.postgres._sql import query
from ._harness import HarnessClock

__all__ = ["PostgresGround", "open_postgres_ground"]

#: The prefix of every schema the gate makes (``check_reset`` refuses any other).
SCHEMA_PREFIX = "trio_jobs_check_"
#: How long dropping the schema may take once the gate is over (shielded).
DROP_BUDGET = 30.0


class _Borrowed:
    """The gate's open driver lent to one run's ``open_jobs``: opening and
    closing it there are no-ops (the gate opens it once and closes it once)."""

    def __init__(self, driver: PostgresDriver) -> None:
        self._driver = driver

    def __getattr__(self, name: str) -> Any:
        return getattr(self._driver, name)

    @contextlib.asynccontextmanager
    async def open_in(self, nursery: trio.Nursery) -> AsyncIterator[None]:
        yield

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None


class PostgresGround:
    """Each run in the gate's throwaway schema, emptied first (see the module's doc)."""

    def __init__(self, driver: PostgresDriver, clock: HarnessClock, schema: str) -> None:
        self.driver = driver
        self.clock = clock
        self.schema = schema
        #: The module's ``trio_jobs_setup(tx)``, or ``None``.
        self.setup: Callable[[Transaction], Any] | None = None

    @contextlib.asynccontextmanager
    async def world(
        self, handles: list[Job[Any, Any]]
    ) -> AsyncIterator[tuple[Jobs, Any, HarnessClock]]:
        await self.driver.db.fetch(query("check_reset"))
        async with open_jobs(_Borrowed(self.driver), jobs=handles) as facade:
            if self.setup is not None:
                async with facade.transaction() as tx:
                    value = self.setup(tx)
                    if inspect.isawaitable(value):
                        await value
            yield facade, self.driver, self.clock

    async def next_wake(self, driver: Any) -> float | None:
        rows = await self.driver.db.fetch(query("check_next_wake"))
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    async def started_step(self, driver: Any) -> bool:
        rows = await self.driver.db.fetch(query("check_started_step"))
        return bool(rows and rows[0][0])


@contextlib.asynccontextmanager
async def open_postgres_ground(dsn: str) -> AsyncIterator[PostgresGround]:
    """A throwaway schema on ``dsn`` for the block, migrated, with a driver
    open on it; the schema is dropped after the block, whatever ends it."""
    schema = SCHEMA_PREFIX + UuidSource().new_id().replace("-", "")[:16]
    probe = PostgresDriver(dsn, migrate=False)
    admin = Database(Pool(await probe._resolve_dsn(), max_size=1))
    try:
        # The name is the gate's own (hex digits): nothing outside goes into the DDL.
        await admin.fetch(f'CREATE SCHEMA "{schema}"')
        try:
            clock = HarnessClock()
            driver = PostgresDriver(dsn, schema=schema, clock=clock, pool_size=4)
            await driver.open()
            try:
                yield PostgresGround(driver, clock, schema)
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(DROP_BUDGET):
                    await driver.close()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(DROP_BUDGET):
                await admin.fetch(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(DROP_BUDGET):
            await admin.pool.close()
