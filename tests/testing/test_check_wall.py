"""The gate's determinism check sees a body branch on the wall clock read
outside a step (``testing/_wall.py``): the body's module reads a moved clock,
one instant on a run's first attempt and others on its replays."""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from datetime import UTC, date
from time import time as wall_time
from typing import Any

import pytest

from check_apps import wallclock
from trio_jobs import ErrorCode, JobContext, Retry, job
from trio_jobs.testing import check_jobs
from trio_jobs.testing._wall import FIRST, REPLAYS, moved_wall


def branching(name: str, morning: Callable[[], bool]) -> Any:
    """A job that takes one step or another on ``morning()``, read outside a step."""

    @job(name=name, input=None, idempotency_key=lambda _: name, retry=Retry(attempts=5))
    async def body(ctx: JobContext[None]) -> None:
        await ctx.step.run("first", lambda: None)
        if morning():
            await ctx.step.run("this-way", lambda: None)
        else:
            await ctx.step.run("that-way", lambda: None)
        await ctx.step.run("last", lambda: None)

    return body


DEADLINE: dict[str, float] = {}

READS = {
    "datetime.now(UTC).hour": lambda: datetime.datetime.now(UTC).hour < 12,
    "naive datetime.now().weekday()": lambda: datetime.datetime.now().weekday() < 5,  # noqa: DTZ005
    "date.today().day": lambda: date.today().day < 20,  # noqa: DTZ011
    "datetime.datetime.utcnow().year": lambda: datetime.datetime.utcnow().year == 2030,  # noqa: DTZ003
    "time.time() against a day": lambda: time.time() < FIRST.timestamp() + 86_400,
    "from time import time": lambda: wall_time() < FIRST.timestamp() + 3_600,
    "time.localtime().tm_mon": lambda: time.localtime().tm_mon == 1,
    "time.gmtime().tm_hour": lambda: time.gmtime().tm_hour < 12,
}


@pytest.mark.parametrize("read", list(READS))
async def test_a_branch_on_the_clock_outside_a_step_is_nondeterministic(read: str) -> None:
    report = await check_jobs([branching("clocked", READS[read])], seeds=0)
    (failure,) = report.jobs[0].failures
    assert failure.code == ErrorCode.X_JOB_NONDETERMINISTIC
    assert "where the recorded run has 'this-way'" in failure.message
    assert "(step 2 of 3)" in failure.message


async def test_the_wallclock_app_names_the_first_differing_step() -> None:
    report = await check_jobs(wallclock, examples=2, seeds=0)
    (failure,) = report.jobs[0].failures
    assert failure.code == ErrorCode.X_JOB_NONDETERMINISTIC
    assert failure.example == 0
    assert (
        "a replay asked for step 'full-report' where the recorded run has 'summary' "
        "(step 2 of 3)" in failure.message
    )


async def test_a_clock_read_inside_a_step_or_not_branched_on_passes() -> None:
    seen: list[str] = []

    @job(name="stamped", input=None, idempotency_key=lambda _: "s", retry=Retry(attempts=5))
    async def stamped(ctx: JobContext[None]) -> str:
        seen.append(datetime.datetime.now(UTC).isoformat())  # read, never branched on
        day = await ctx.step.run("day", lambda: date.today().isoformat())  # noqa: DTZ011
        if day.endswith("-14"):  # branches on what the step recorded: the same every replay
            await ctx.step.run("fortnight", lambda: None)
        await ctx.step.sleep("1h")
        await ctx.step.run("after", lambda: None)
        return str(day)

    # No observe hook: the stored outputs (the day included) must match after every crash.
    report = await check_jobs([stamped], seeds=0)
    assert report.ok, report.to_json()
    assert {s[:10] for s in seen} >= {"2030-01-14", "2031-05-31", "2030-03-01"}


async def test_the_body_sees_real_values_of_the_clock_types() -> None:
    given = datetime.datetime(2020, 5, 1, tzinfo=UTC)
    checks: list[bool] = []

    @job(name="types", input=None, idempotency_key=lambda _: "t", retry=Retry(attempts=5))
    async def types_(ctx: JobContext[None]) -> None:
        now = datetime.datetime.now(UTC)
        made = datetime.datetime(2021, 1, 1, tzinfo=UTC)
        checks.append(
            isinstance(given, datetime.datetime)
            and type(now) is type(given)
            and type(made) is type(given)
            and issubclass(type(given), datetime.datetime)
            and isinstance(date.today(), date)  # noqa: DTZ011
            and (now - made).days > 0
        )
        await ctx.step.run("a", lambda: None)

    assert (await check_jobs([types_], seeds=0)).ok
    assert checks
    assert all(checks)


def test_the_real_clock_is_back_after_the_block_and_outside_an_attempt() -> None:
    names = {"datetime": datetime, "time": time, "date": date, "wall_time": wall_time}
    before = {n: globals()[n] for n in names}

    def inside() -> None:
        with moved_wall(branching("x", lambda: True).run):
            assert all(globals()[n] is not before[n] for n in names)  # swapped for the block
            # No attempt is running: the stand-ins answer the real time.
            assert abs(globals()["time"].time() - wall_time()) < 60
            assert globals()["datetime"].datetime.now(UTC).year < 2030
            raise RuntimeError("the block fails")

    with pytest.raises(RuntimeError):
        inside()
    assert {n: globals()[n] for n in names} == before


def test_the_instants_differ_in_every_calendar_field() -> None:
    for other in REPLAYS:
        assert other.hour // 12 != FIRST.hour // 12 or other.weekday() >= 5
        assert (other.day, other.month, other.weekday()) != (
            FIRST.day,
            FIRST.month,
            FIRST.weekday(),
        )
    assert {r.year for r in REPLAYS} | {FIRST.year} == {2030, 2031}
