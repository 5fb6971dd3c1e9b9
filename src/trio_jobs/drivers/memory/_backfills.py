"""The memory driver's backfill ledger: one row per pass, in the process."""

from __future__ import annotations

import builtins
import copy
from collections.abc import Callable, Sequence

import attrs

from .._backfills import BackfillPage, BackfillRow

__all__ = ["MemoryBackfills"]


class MemoryBackfills:
    """The ledger of :class:`~trio_jobs.drivers.MemoryDriver` (its process is
    its fleet). Each call completes without yielding: atomic, as one statement."""

    def __init__(self, now: Callable[[], float], check_open: Callable[[], None]) -> None:
        self._now = now
        self._check_open = check_open
        self._rows: dict[str, BackfillRow] = {}

    async def record(self, page: BackfillPage) -> None:
        self._check_open()
        now = self._now()
        cursor = copy.deepcopy(page.cursor)
        old = self._rows.get(page.job_id)
        if old is None:
            self._rows[page.job_id] = BackfillRow(
                name=page.name,
                job_id=page.job_id,
                pages=page.pages,
                items=page.items,
                cursor=cursor,
                started_at=now,
                finished_at=now if page.finished else None,
            )
            return
        if page.pages < old.pages:
            return
        finished_at = old.finished_at
        if finished_at is None and page.finished:
            finished_at = now
        self._rows[page.job_id] = attrs.evolve(
            old, pages=page.pages, items=page.items, cursor=cursor, finished_at=finished_at
        )

    async def list(self, name: str | None, limit: int) -> builtins.list[BackfillRow]:
        self._check_open()
        rows = [r for r in self._rows.values() if name is None or r.name == name]
        rows.sort(key=lambda r: (r.started_at, r.job_id), reverse=True)
        return [attrs.evolve(r, cursor=copy.deepcopy(r.cursor)) for r in rows[:limit]]

    async def rows(self, job_ids: Sequence[str]) -> builtins.list[BackfillRow]:
        self._check_open()
        found = (self._rows.get(i) for i in dict.fromkeys(job_ids))
        return [attrs.evolve(r, cursor=copy.deepcopy(r.cursor)) for r in found if r is not None]
