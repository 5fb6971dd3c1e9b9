"""``check_jobs``: the gate in Python (the spec's "The crash-proof CI gate")."""

from __future__ import annotations

import importlib

import pytest

from check_apps import clock, double, good, race
from trio_jobs import ErrorCode, JobsError
from trio_jobs.testing import check_jobs
from trio_jobs.testing._check import draw_examples


async def test_a_sound_app_passes_with_counts() -> None:
    report = await check_jobs(good, examples=3, seeds=4)
    assert report.ok
    by_name = {j.name: j for j in report.jobs}
    # 3 drawn inputs of checkout, the one input of a job that takes none
    assert (by_name["checkout"].examples, by_name["nightly"].examples) == (3, 1)
    assert by_name["checkout"].boundaries == 3 * 9
    assert by_name["checkout"].seeds == 4
    assert report.to_json()["jobs"][0]["failures"] == []


async def test_a_double_effect_is_a_crash_divergence_at_after_fn() -> None:
    report = await check_jobs(double, seeds=1, reproduce=lambda j, k, s: f"{j}/{k}/{s}")
    assert not report.ok
    (failure,) = report.jobs[0].failures
    assert failure.code == ErrorCode.X_JOB_CRASH_DIVERGED
    assert (failure.example, failure.boundary, failure.seed) == (0, "after-fn:charge", None)
    assert failure.reproduce == "pay/0/None"


async def test_a_clock_read_outside_a_step_is_nondeterministic_naming_the_step() -> None:
    report = await check_jobs(clock, examples=2, seeds=1)
    (failure,) = report.jobs[0].failures
    assert failure.code == ErrorCode.X_JOB_NONDETERMINISTIC
    assert "where the recorded run has 'upload-" in failure.message
    assert "(step 2 of 2)" in failure.message


async def test_a_replay_reordering_steps_is_nondeterministic() -> None:
    from trio_jobs import JobContext, Retry, job

    flips = iter(range(1000))

    @job(name="flip", input=None, idempotency_key=lambda _: "flip", retry=Retry(attempts=5))
    async def flip(ctx: JobContext[None]) -> None:
        names = ["a", "b"] if next(flips) % 2 == 0 else ["b", "a"]  # outside state
        for name in names:
            await ctx.step.run(name, lambda: None)

    report = await check_jobs([flip], seeds=0)
    (failure,) = report.jobs[0].failures
    assert failure.code == ErrorCode.X_JOB_NONDETERMINISTIC


async def test_steps_asked_from_a_nursery_may_come_in_any_order() -> None:
    import trio

    from trio_jobs import JobContext, Retry, job

    @job(name="fan", input=None, idempotency_key=lambda _: "fan", retry=Retry(attempts=5))
    async def fan(ctx: JobContext[None]) -> None:
        async with trio.open_nursery() as nursery:
            for name in ("a", "b", "c"):
                nursery.start_soon(ctx.step.run, name, lambda: None)

    report = await check_jobs([fan], seeds=0)
    assert report.ok, report.to_json()


async def test_a_race_fails_the_app_invariant_with_a_seed() -> None:
    report = await check_jobs(race, seeds=3)
    failures = report.jobs[0].failures
    assert [f.code for f in failures] == [ErrorCode.X_SIMULATION_INVARIANT]
    assert failures[0].seed is not None
    assert failures[0].example is None  # one deposit alone races nothing
    assert "a deposit was lost" in failures[0].message


async def test_examples_are_the_same_every_time_and_distinct() -> None:
    first = draw_examples(good.checkout, 10)
    again = draw_examples(good.checkout, 10)
    assert first == again
    assert len({o.id for o in first}) == 10  # distinct idempotency keys


async def test_an_input_hypothesis_cannot_build_names_the_job_and_the_fix() -> None:
    module = importlib.import_module("check_apps.unbuildable")
    with pytest.raises(JobsError) as info:
        await check_jobs(module)
    assert info.value.code == ErrorCode.X_CONFIG_INVALID
    assert "odd" in info.value.message
    assert "trio_jobs_examples" in info.value.message


async def test_a_hook_that_raises_stops_the_gate_without_its_text() -> None:
    module = importlib.import_module("check_apps.hook_raises")
    with pytest.raises(JobsError) as info:
        await check_jobs(module)
    assert info.value.code == ErrorCode.X_CONFIG_INVALID
    assert "trio_jobs_reset() raised KeyError" in info.value.message
    assert "the-secret-table" not in info.value.message


async def test_bad_arguments_are_refused() -> None:
    with pytest.raises(JobsError, match="no job named"):
        await check_jobs(good, job="nope")
    with pytest.raises(JobsError, match="module of jobs"):
        await check_jobs([])
    with pytest.raises(JobsError, match="past checkout's"):
        await check_jobs(good, job="checkout", examples=2, example=5)


async def test_a_webhook_receivers_inputs_are_drawn_and_checked() -> None:
    """A receiver's input holds any JSON payload, which from_type cannot draw: the
    gate draws an event id, a JSON payload and path parameters instead."""
    from trio_jobs import ReceivedWebhook, Verified, webhook_receiver

    async def handle(ctx: object) -> None:
        return None

    hook = webhook_receiver(
        name="hooks.checked", path="/hooks/c", verify=lambda i: Verified("e"), handle=handle
    )
    drawn = draw_examples(hook, 5)
    assert len(drawn) == 5
    assert all(isinstance(v, ReceivedWebhook) for v in drawn)
    assert len({v.event_id for v in drawn}) == 5
    report = await check_jobs([hook], examples=3, seeds=3)
    assert report.ok
