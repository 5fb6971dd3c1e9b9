"""The Redis driver's backfill ledger: a hash per pass and a sorted set of
passes by start, written and read by one script each (``backfill_record``,
``backfill_list`` in ``lua/queue.lua``); times are the server's clock."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..._serialization import dumps, loads
from .._backfills import BackfillPage, BackfillRow

if TYPE_CHECKING:
    from ._driver import RedisDriver

__all__ = ["RedisBackfills"]


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


class RedisBackfills:
    """The ledger of :class:`~trio_jobs.drivers.redis.RedisDriver`."""

    def __init__(self, driver: RedisDriver) -> None:
        self._d = driver

    async def record(self, page: BackfillPage) -> None:
        await self._d._script(
            "backfill_record",
            [
                page.job_id,
                page.name,
                str(int(page.pages)),
                str(int(page.items)),
                dumps(page.cursor).decode(),
                "1" if page.finished else "0",
            ],
        )

    async def list(self, name: str | None, limit: int) -> builtins.list[BackfillRow]:
        reply = await self._d._script("backfill_list", [name or "", str(int(limit))])
        return [_row(r) for r in reply]

    async def rows(self, job_ids: Sequence[str]) -> builtins.list[BackfillRow]:
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return []
        return [_row(r) for r in await self._d._script("backfill_rows", ids)]


def _row(reply: Any) -> BackfillRow:
    job_id, row_name, pages, items, cursor, started, finished = reply
    finished_at = _text(finished)
    return BackfillRow(
        name=_text(row_name),
        job_id=_text(job_id),
        pages=int(_text(pages)),
        items=int(_text(items)),
        cursor=loads(_text(cursor)),
        started_at=float(_text(started)),
        finished_at=float(finished_at) if finished_at else None,
    )
