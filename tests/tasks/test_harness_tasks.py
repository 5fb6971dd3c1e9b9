"""Spec: "Scheduled tasks — task()", the harness: ``open_harness(start=...)``
arms the scheduler at ``start``; ``drain()`` fires every occurrence due by the
harness clock, by the task's ``catch_up``, before it runs due jobs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from trio_jobs import ErrorCode, JobContext, JobsError, Occurrence, task
from trio_jobs.testing import open_harness

PARIS = ZoneInfo("Europe/Paris")
START = datetime(2026, 3, 28, 2, 30, tzinfo=PARIS)  # exactly an occurrence
SEEN: list[datetime] = []


@pytest.fixture(autouse=True)
def _fresh() -> None:
    SEEN.clear()


def _nightly(catch_up: Any) -> Any:
    @task(cron="30 2 * * *", tz="Europe/Paris", catch_up=catch_up, name=f"nightly.{catch_up}")
    async def nightly(ctx: JobContext[Occurrence]) -> None:
        SEEN.append(ctx.input.at)

    return nightly


async def test_start_is_the_clock_origin_and_the_arming_instant(autojump_clock: Any) -> None:
    nightly = _nightly("latest")
    async with open_harness(jobs=[nightly], start=START) as h:
        assert h.clock.now() == START.timestamp()
        await h.drain()
        assert SEEN == [], "an occurrence exactly at the arming instant is not fired"
        h.clock.advance("1d")  # 2026-03-29 02:30 does not happen in Paris: 03:00 does
        await h.drain()
        assert SEEN == [datetime(2026, 3, 29, 3, 0, tzinfo=PARIS)]
        [view] = await h.jobs.tasks()
        assert view.last_fire == SEEN[0]
        assert view.next_fire == datetime(2026, 3, 30, 2, 30, tzinfo=PARIS)
        await h.drain()
        assert len(SEEN) == 1, "one occurrence is one run"


@pytest.mark.parametrize(
    ("catch_up", "expected"),
    [("latest", [5]), ("all", [1, 2, 3, 4, 5]), ("none", [])],
)
async def test_drain_fires_what_fell_due_by_the_catch_up_rule(
    autojump_clock: Any, catch_up: str, expected: list[int]
) -> None:
    nightly = _nightly(catch_up)
    # One slot: the runs start in the order they were fired (oldest first).
    async with open_harness(jobs=[nightly], start=START + timedelta(days=2), concurrency=1) as h:
        h.clock.advance("5d")
        h.clock.advance("2h")  # 5 occurrences fell due, the newest 2 h ago
        await h.drain()
    assert [(at.date() - START.date()).days - 2 for at in SEEN] == expected


async def test_none_fires_an_occurrence_at_most_a_minute_late(autojump_clock: Any) -> None:
    nightly = _nightly("none")
    async with open_harness(jobs=[nightly], start=START) as h:
        # 2026-03-29 03:00 Paris (01:00Z) is 23.5 h after the start: 59 s late.
        h.clock.advance(timedelta(hours=23, minutes=30, seconds=59))
        await h.drain()
    assert SEEN == [datetime(2026, 3, 29, 3, 0, tzinfo=PARIS)]


async def test_a_naive_or_doubled_start_is_refused(autojump_clock: Any) -> None:
    with pytest.raises(JobsError) as caught:
        async with open_harness(start=datetime(2026, 1, 1)):  # noqa: DTZ001
            pass
    assert caught.value.code == ErrorCode.X_CONFIG_INVALID
    with pytest.raises(JobsError):
        async with open_harness(start=datetime(2026, 1, 1, tzinfo=UTC), origin=0.0):
            pass
