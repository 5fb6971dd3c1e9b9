"""The PostgreSQL driver's backfill ledger: the ``trio_jobs_backfills`` table
(migration 0008), one statement per call (``sql/backfills.sql``)."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..._serialization import dumps
from .._backfills import BackfillPage, BackfillRow

if TYPE_CHECKING:
    from ._driver import PostgresDriver


__all__ = ["PgBackfills"]


class PgBackfills:
    """The ledger of :class:`~trio_jobs.drivers.postgres.PostgresDriver`; its
    times are the database's clock (or the driver's test clock)."""

    def __init__(self, driver: PostgresDriver) -> None:
        self._d = driver

    async def record(self, page: BackfillPage) -> None:
        await self._d._fetch(
            "backfill_record",
            {
                "job_id": page.job_id,
                "name": page.name,
                "pages": int(page.pages),
                "items": int(page.items),
                "cursor": dumps(page.cursor).decode(),
                "finished": bool(page.finished),
            },
        )

    async def list(self, name: str | None, limit: int) -> builtins.list[BackfillRow]:
        rows = await self._d._fetch("backfill_list", {"name": name, "limit": int(limit)})
        return [_row(r) for r in rows]

    async def rows(self, job_ids: Sequence[str]) -> builtins.list[BackfillRow]:
        from ._driver import _uuid_or_none  # (the driver imports this module)

        # An id that is no UUID names no pass (and would fail the cast).
        ids = [k for k in dict.fromkeys(map(_uuid_or_none, job_ids)) if k is not None]
        if not ids:
            return []
        return [_row(r) for r in await self._d._fetch("backfill_rows", {"ids": ids})]


def _row(r: Any) -> BackfillRow:
    return BackfillRow(
        name=r[0],
        job_id=r[1],
        pages=int(r[2]),
        items=int(r[3]),
        cursor=r[4],
        started_at=float(r[5]),
        finished_at=None if r[6] is None else float(r[6]),
    )
