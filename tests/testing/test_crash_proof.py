"""crash_proof: kill a job at every boundary, resume it, compare the world."""

from __future__ import annotations

import attrs
import pytest

from trio_jobs import JobContext, JobsError, Retry, job
from trio_jobs.testing import crash_proof


@attrs.frozen
class In:
    n: int


ledger: dict[str, int] = {}


def _bump(key: str) -> int:
    ledger[key] = ledger.get(key, 0) + 1
    return ledger[key]


@job(input=In, idempotency_key=lambda i: f"k{i.n}", retry=Retry(attempts=3))
async def replay_safe(ctx: JobContext[In]) -> int:
    a = await ctx.step.run("a", lambda: {"v": 1})
    await ctx.step.sleep("1h")
    b = await ctx.step.run("b", lambda: {"v": 2})
    return int(a["v"]) + int(b["v"])


async def test_a_replay_safe_job_survives_every_boundary() -> None:
    report = await crash_proof(replay_safe, In(1), observe=lambda: dict(ledger), reset=ledger.clear)
    assert report.points == [
        "before-step:a",
        "after-fn:a",
        "after-record:a",
        "before-step:sleep:1",
        "after-record:sleep:1",
        "before-step:b",
        "after-fn:b",
        "after-record:b",
        "before-settle",
    ]
    assert report.boundaries == 9
    assert report.unknown_outcomes == 0


@job(input=In, idempotency_key=lambda i: f"k{i.n}", retry=Retry(attempts=3))
async def effect_outside_a_step(ctx: JobContext[In]) -> None:
    _bump("emails")  # runs again on every attempt: not replay-safe
    await ctx.step.run("a", lambda: 1)


async def test_an_effect_outside_a_step_diverges_and_names_the_boundary() -> None:
    with pytest.raises(JobsError) as err:
        await crash_proof(
            effect_outside_a_step, In(1), observe=lambda: dict(ledger), reset=ledger.clear
        )
    assert err.value.code == "X_JOB_CRASH_DIVERGED"
    assert err.value.meta["boundary"] == "before-step:a"
    assert err.value.meta["reference"] == {"emails": 1}
    assert err.value.meta["got"] == {"emails": 2}


@job(input=In, idempotency_key=lambda i: f"k{i.n}", retry=Retry(attempts=3))
async def effect_inside_a_step(ctx: JobContext[In]) -> None:
    await ctx.step.run("send", lambda: _bump("emails"))


async def test_an_effect_in_a_step_is_doubled_by_a_kill_after_its_fn() -> None:
    # The honest at-least-once window: fn ran, its record did not land.
    with pytest.raises(JobsError) as err:
        await crash_proof(
            effect_inside_a_step, In(1), observe=lambda: dict(ledger), reset=ledger.clear
        )
    assert err.value.meta["boundary"] == "after-fn:send"


@job(input=In, idempotency_key=lambda i: f"k{i.n}", retry=Retry(attempts=3))
async def pays_once(ctx: JobContext[In]) -> None:
    await ctx.step.run("pay", lambda: _bump("charges"), once=True)


async def test_a_once_step_killed_after_started_surfaces_unknown_never_a_double() -> None:
    report = await crash_proof(pays_once, In(1), observe=lambda: dict(ledger), reset=ledger.clear)
    assert report.points == [
        "before-step:pay",
        "after-started:pay",
        "after-fn:pay",
        "after-record:pay",
        "before-settle",
    ]
    assert report.unknown_outcomes == 2


@job(input=In, idempotency_key=lambda i: f"k{i.n}", retry=Retry(attempts=1))
async def no_attempt_to_spare(ctx: JobContext[In]) -> None:
    await ctx.step.run("a", lambda: 1)


async def test_a_crash_spends_an_attempt() -> None:
    with pytest.raises(JobsError) as err:
        await crash_proof(no_attempt_to_spare, In(1), observe=lambda: None)
    assert err.value.code == "X_JOB_CRASH_DIVERGED"
    assert err.value.meta["state"] == "dead"
