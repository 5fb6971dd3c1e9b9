"""The conformance rules of the backfill ledger (``JobDriver.backfills``),
mixed into :class:`~trio_jobs.testing.conformance.DriverConformance`.

A driver that declares no ledger (``backfills = None``) skips them with the
reason."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import pytest

from ..drivers._backfills import BackfillPage

if TYPE_CHECKING:
    from .conformance import Target

__all__ = ["BackfillConformance"]


def _ledger(target: Target) -> Any:
    ledger = target.driver.backfills
    if ledger is None:
        pytest.skip(f"the {target.driver.name} driver declares no backfill ledger")
    return ledger


def _id() -> str:
    return str(uuid.uuid4())


class BackfillConformance:
    """Every rule of the backfill ledger."""

    async def test_backfill_record_opens_a_row_started_at_the_drivers_now(
        self, target: Target
    ) -> None:
        ledger = _ledger(target)
        job = _id()
        before = target.driver.now()
        await ledger.record(BackfillPage(job, "users.email", 0, 0))
        [row] = await ledger.list(None, 10)
        assert (row.name, row.job_id, row.pages, row.items, row.cursor) == (
            "users.email",
            job,
            0,
            0,
            None,
        )
        assert row.started_at == pytest.approx(before, abs=5.0)
        assert row.finished_at is None

    async def test_backfill_pages_move_forward_only_and_keep_the_first_start(
        self, target: Target
    ) -> None:
        ledger = _ledger(target)
        job = _id()
        await ledger.record(BackfillPage(job, "bf", 0, 0))
        [opened] = await ledger.list(None, 10)
        await target.advance(10)
        await ledger.record(BackfillPage(job, "bf", 3, 300, {"after": 300}))
        # A late write of an earlier page (a worker that lost its lease, a crash
        # between the ledger and the checkpoint) is ignored.
        await ledger.record(BackfillPage(job, "bf", 2, 200, {"after": 200}))
        [row] = await ledger.list(None, 10)
        assert (row.pages, row.items, row.cursor) == (3, 300, {"after": 300})
        assert row.started_at == opened.started_at
        # The same page written again takes the write (its values are the same).
        await ledger.record(BackfillPage(job, "bf", 3, 300, {"after": 300}))
        assert (await ledger.list(None, 10))[0].pages == 3
        # A row is never renamed.
        await ledger.record(BackfillPage(job, "other", 4, 400, {"after": 400}))
        [row] = await ledger.list(None, 10)
        assert (row.name, row.pages) == ("bf", 4)

    async def test_backfill_finished_is_stamped_once_at_the_drivers_now(
        self, target: Target
    ) -> None:
        ledger = _ledger(target)
        job = _id()
        await ledger.record(BackfillPage(job, "bf", 1, 10, "c1"))
        await target.advance(60)
        at = target.driver.now()
        await ledger.record(BackfillPage(job, "bf", 2, 15, None, finished=True))
        [row] = await ledger.list(None, 10)
        assert (row.pages, row.items, row.cursor) == (2, 15, None)
        assert row.finished_at == pytest.approx(at, abs=5.0)
        assert row.finished_at >= row.started_at + 59
        await target.advance(60)
        await ledger.record(BackfillPage(job, "bf", 2, 15, None, finished=True))
        assert (await ledger.list(None, 10))[0].finished_at == row.finished_at

    async def test_backfill_a_first_write_may_be_the_last_page(self, target: Target) -> None:
        ledger = _ledger(target)
        job = _id()
        await ledger.record(BackfillPage(job, "bf", 1, 0, None, finished=True))
        [row] = await ledger.list(None, 10)
        assert row.finished_at == row.started_at

    async def test_backfill_cursor_round_trips_its_json_form(self, target: Target) -> None:
        ledger = _ledger(target)
        cursors: list[Any] = [
            "c-1",
            12,
            2.5,
            True,
            ["a", 1, None],
            {"id": 10, "at": "2026-01-01T00:00:00Z", "nested": {"k": [1, 2]}},
            'naïve ✓ \n "quoted"',
            "",
        ]
        jobs = [_id() for _ in cursors]
        for job, cursor in zip(jobs, cursors, strict=True):
            await ledger.record(BackfillPage(job, "bf", 1, 1, cursor))
        got = {r.job_id: r.cursor for r in await ledger.list(None, 100)}
        assert [got[j] for j in jobs] == cursors

    async def test_backfill_counts_past_32_bits(self, target: Target) -> None:
        ledger = _ledger(target)
        job = _id()
        await ledger.record(BackfillPage(job, "bf", 70_000, 5_000_000_000, 1))
        [row] = await ledger.list(None, 10)
        assert (row.pages, row.items) == (70_000, 5_000_000_000)

    async def test_backfill_list_is_newest_first_filtered_and_limited(self, target: Target) -> None:
        ledger = _ledger(target)
        made = []
        for i in range(5):
            job = _id()
            await ledger.record(BackfillPage(job, "even" if i % 2 == 0 else "odd", 0, 0))
            made.append(job)
            await target.advance(1)
        rows = await ledger.list(None, 10)
        assert [r.job_id for r in rows] == made[::-1]
        assert [r.job_id for r in await ledger.list(None, 2)] == made[::-1][:2]
        assert [r.job_id for r in await ledger.list("even", 10)] == [made[4], made[2], made[0]]
        assert [r.job_id for r in await ledger.list("odd", 1)] == [made[3]]
        assert await ledger.list("none-such", 10) == []

    async def test_backfill_rows_started_together_order_by_job_id(self, target: Target) -> None:
        ledger = _ledger(target)
        jobs = sorted(_id() for _ in range(3))
        for job in jobs:
            await ledger.record(BackfillPage(job, "bf", 0, 0))
        assert [r.job_id for r in await ledger.list(None, 10)] == jobs[::-1]

    async def test_backfill_rows_of_given_passes_answer_those_the_ledger_holds(
        self, target: Target
    ) -> None:
        ledger = _ledger(target)
        one, two, absent = _id(), _id(), _id()
        await ledger.record(BackfillPage(one, "bf", 2, 7, {"after": 7}))
        await target.advance(1)
        await ledger.record(BackfillPage(two, "bf", 1, 3, None, True))
        listed = {r.job_id: r for r in await ledger.list(None, 10)}
        got = await ledger.rows([two, absent, one, "not-a-uuid", one])
        assert sorted(got, key=lambda r: r.job_id) == sorted(
            listed.values(), key=lambda r: r.job_id
        )
        assert await ledger.rows([]) == []
        assert await ledger.rows([absent]) == []
        [row] = await ledger.rows([one])
        assert (row.name, row.pages, row.items, row.cursor) == ("bf", 2, 7, {"after": 7})
