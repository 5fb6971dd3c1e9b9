"""The backfill ledger's seam: what a driver stores for each ``backfill()`` pass.

A pass is one job of a handle :func:`trio_jobs.backfill` returned. Its page steps
write the ledger through :class:`BackfillLedger` (``JobDriver.backfills``), each
page after its ``handle`` ran and before its checkpoint (the step record), so
the row says what was handled. The write is absolute and only moves forward (a
row's ``pages`` never goes down): a page written twice (a crash between the
ledger write and the checkpoint, a worker that lost its lease and has not
noticed yet) leaves the row as one write would. A driver without a ledger
declares ``backfills = None``: its passes run with no bookkeeping.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any, Protocol

import attrs

__all__ = ["MAX_BACKFILL_ROWS", "BackfillLedger", "BackfillPage", "BackfillRow"]

#: The most rows one ``jobs.backfills()`` call answers.
MAX_BACKFILL_ROWS = 1_000


@attrs.frozen
class BackfillPage:
    """One ledger write: pass ``job_id`` of backfill ``name`` has handled
    ``pages`` pages holding ``items`` items in all, and the next page starts at
    ``cursor`` (a JSON form). ``finished``: that page was the last one.

    ``pages=0`` opens the row (a pass that has not finished its first page)."""

    job_id: str
    name: str
    pages: int
    items: int
    cursor: Any = None
    finished: bool = False


@attrs.frozen
class BackfillRow:
    """One pass of a :func:`~trio_jobs.backfill`, as its ledger keeps it.

    ``name`` is the backfill's name, ``job_id`` its job. ``pages`` and ``items``
    count what its ``handle`` has handled so far; ``cursor`` is where the next
    page starts (the JSON form of what ``source`` answered; ``None`` once the
    last page was handled). ``started_at`` and ``finished_at`` are epoch seconds
    on the driver's clock; ``finished_at`` is ``None`` while the pass runs (or
    after it stopped for good before its last page: see the job's state)."""

    name: str
    job_id: str
    pages: int
    items: int
    cursor: Any
    started_at: float
    finished_at: float | None = None


class BackfillLedger(Protocol):
    """The ``x_backfills`` ledger: one row per pass, keyed by its job id."""

    async def record(self, page: BackfillPage) -> None:
        """Write ``page`` to its pass's row, creating it (``started_at`` = the
        driver's now) when absent. An existing row takes the write only when
        ``page.pages`` is at least its own (pages never go down); ``name`` and
        ``started_at`` keep their first values. ``finished`` stamps
        ``finished_at`` with the driver's now, once: a later write keeps it."""
        ...

    async def list(self, name: str | None, limit: int) -> builtins.list[BackfillRow]:
        """The newest ``limit`` rows (1 to :data:`MAX_BACKFILL_ROWS`), newest
        first (by ``started_at``, then by job id, descending); of backfill
        ``name`` only, when given."""
        ...

    async def rows(self, job_ids: Sequence[str]) -> builtins.list[BackfillRow]:
        """The rows of the passes ``job_ids`` (at most :data:`MAX_BACKFILL_ROWS`
        ids), in one round trip: one per id the ledger holds (an id it does not
        hold, a job that is no backfill, is left out), in no order.
        ``trio-jobs show`` and ``list`` read a job's row with it."""
        ...
