"""PYTHON-API "Debounce and unique periods — on job()": the declaration, the
enqueue-time refusals and the whole path through a worker (memory driver).

The driver rules themselves are in the conformance suite
(``trio_jobs.testing._conformance_debounce``), run against every driver.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import attrs
import pytest

from trio_jobs import Concurrency, ErrorCode, JobContext, JobsError, job
from trio_jobs.testing import open_harness


@attrs.frozen
class Ping:
    user: str
    n: int = 0


seen: list[int] = []


@job(input=Ping, idempotency_key=lambda i: f"ping:{i.user}", debounce="5s", name="debounced")
async def debounced(ctx: JobContext[Ping]) -> int:
    seen.append(ctx.input.n)
    return ctx.input.n


@job(input=Ping, idempotency_key=lambda i: f"once:{i.user}", unique_for="1h", name="unique")
async def unique(ctx: JobContext[Ping]) -> int:
    seen.append(ctx.input.n)
    return ctx.input.n


@pytest.fixture(autouse=True)
def _clear() -> None:
    seen.clear()


def test_the_declaration_lifts_both_as_seconds() -> None:
    assert debounced.debounce == 5.0
    assert debounced.unique_for is None
    assert unique.unique_for == 3600.0
    assert debounced.describe()["debounce"] == 5.0
    assert unique.describe()["unique_for"] == 3600.0

    @job(input=Ping, idempotency_key=lambda i: i.user, debounce=timedelta(minutes=1))
    async def by_timedelta(ctx: JobContext[Ping]) -> None: ...

    assert by_timedelta.debounce == 60.0


@pytest.mark.parametrize("field", ["debounce", "unique_for"])
@pytest.mark.parametrize("bad", [0, -1, "0s", "soon", float("nan"), True, [5]])
def test_a_period_that_is_not_a_positive_duration_is_refused(field: str, bad: Any) -> None:
    with pytest.raises(JobsError) as err:
        job(input=Ping, idempotency_key=lambda i: i.user, **{field: bad})
    assert err.value.code == ErrorCode.X_JOB_DECLARATION_INVALID
    assert field in err.value.message


def test_debounce_with_when_busy_fail_is_refused() -> None:
    with pytest.raises(JobsError) as err:
        job(
            input=Ping,
            idempotency_key=lambda i: i.user,
            debounce="5s",
            concurrency=Concurrency(1, key=lambda i: i.user, when_busy="fail"),
        )
    assert err.value.code == ErrorCode.X_JOB_DECLARATION_INVALID
    assert "debounce" in err.value.message
    assert "when_busy" in err.value.message


@pytest.mark.parametrize("option", [{"delay": "1s"}, {"run_at": 1_900_000_000.0}])
async def test_delay_or_run_at_on_a_debounced_job_is_refused_and_nothing_is_queued(
    option: dict[str, Any], autojump_clock: Any
) -> None:
    async with open_harness(jobs=[debounced]) as h:
        with pytest.raises(JobsError) as err:
            await debounced.enqueue(Ping("a"), **option)
        with pytest.raises(JobsError) as many:
            await debounced.enqueue_many([Ping("b"), Ping("c")], **option)
        assert (await h.jobs.list()).rows == []
    assert err.value.code == ErrorCode.X_INVARIANT
    assert "debounce" in err.value.message
    assert many.value.code == ErrorCode.X_INVARIANT


async def test_a_burst_runs_once_with_the_last_input_after_the_quiet(autojump_clock: Any) -> None:
    async with open_harness(jobs=[debounced]) as h:
        answers = []
        for n in range(1, 4):
            answers.append(await debounced.enqueue(Ping("a", n)))
            h.clock.advance("2s")
            await h.drain()
        assert seen == []  # each enqueue pushed the start out again
        assert [a.deduped for a in answers] == [False, True, True]
        assert len({a.id for a in answers}) == 1
        h.clock.advance("3s")  # 5 s after the last
        await h.drain()
        trace = await h.trace(answers[0].id)
    assert seen == [3]
    assert trace.state == "done"
    assert trace.result == 3


async def test_a_settled_unique_run_answers_for_an_hour(autojump_clock: Any) -> None:
    async with open_harness(jobs=[unique]) as h:
        first = await h.run(unique, Ping("a", 1))
        h.clock.advance("59m")
        again = await unique.enqueue(Ping("a", 2))
        await h.drain()
        h.clock.advance("2m")
        later = await unique.enqueue(Ping("a", 3))
        await h.drain()
    assert first.state == "done"
    assert again.deduped
    assert again.id == first.job_id
    assert not later.deduped
    assert seen == [1, 3]
