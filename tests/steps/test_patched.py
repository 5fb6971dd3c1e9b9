"""PYTHON-API "Versioning — step.patched": a recorded answer per change id, replay-safe.

A deploy is modelled by ``release``: the body each release ships, chosen when the
body runs, as a worker runs whatever code the process has loaded.
"""

from __future__ import annotations

from typing import Any

import pytest

from jobs_support import Item
from trio_jobs import ErrorCode, JobContext, JobsError, Retry, job
from trio_jobs.testing import crash_proof, open_harness

release = {"n": 1}
log: list[str] = []


@job(input=Item, idempotency_key=lambda i: i.key, name="invoice", retry=Retry(attempts=3))
async def invoice(ctx: JobContext[Item]) -> str:
    # Release 1: charge without tax. Release 2 ships the fix behind a patch.
    # Release 3 deprecates the patch once release-1 runs have drained.
    if release["n"] == 1:
        charged = await ctx.step.run("charge", lambda: log.append("charge") or "plain")
    elif release["n"] == 2:
        if await ctx.step.patched("tax"):
            charged = await ctx.step.run("charge-taxed", lambda: log.append("taxed") or "taxed")
        else:
            charged = await ctx.step.run("charge", lambda: log.append("charge") or "plain")
    else:
        await ctx.step.deprecate_patch("tax")
        charged = await ctx.step.run("charge-taxed", lambda: log.append("taxed") or "taxed")
    await ctx.step.sleep("3d")
    await ctx.step.run("nudge", lambda: log.append("nudge"))
    return str(charged)


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    release["n"] = 1
    log.clear()
    yield
    release["n"] = 1


async def test_an_old_run_replays_its_stored_steps_on_patched_code(autojump_clock: Any) -> None:
    async with open_harness(jobs=[invoice]) as h:
        old = await h.run(invoice, Item("old"))
        assert old.state == "delayed"  # sleeping 3d, stored: charge, sleep:1
        release["n"] = 2  # the fix ships while the old run sleeps
        new = await h.run(invoice, Item("new"))
        assert new.steps["patch:tax"].output is True
        h.clock.advance("3d")
        await h.drain()
        old = await h.trace(old.job_id)
        new = await h.trace(new.job_id)
    # The old run's history goes past the patch point: it answers False and
    # replays its stored "charge" (not run again), then wakes and nudges.
    assert old.state == "done"
    assert old.result == "plain"
    assert old.steps["patch:tax"].output is False
    assert old.steps["charge"].executions == 1
    assert "charge-taxed" not in old.steps
    assert list(old.steps) == ["charge", "sleep:1", "patch:tax", "nudge"]
    assert new.state == "done"
    assert new.result == "taxed"
    assert list(new.steps) == ["patch:tax", "charge-taxed", "sleep:1", "nudge"]
    assert log == ["charge", "taxed", "nudge", "nudge"]


async def test_the_first_answer_is_recorded_for_every_later_attempt(autojump_clock: Any) -> None:
    async with open_harness(jobs=[invoice]) as h:
        release["n"] = 2
        run = await h.run(invoice, Item("a"))  # patched -> True, recorded, sleeping
        assert run.steps["patch:tax"].output is True
        h.clock.advance("3d")
        run = await h.drain()  # type: ignore[assignment]
    assert run.state == "done"
    assert run.result == "taxed"
    assert run.steps["charge-taxed"].executions == 1
    assert log == ["taxed", "nudge"]


async def test_deprecate_patch_replays_a_run_that_holds_the_marker(autojump_clock: Any) -> None:
    async with open_harness(jobs=[invoice]) as h:
        release["n"] = 2
        run = await h.run(invoice, Item("a"))
        release["n"] = 3  # every release-1 run has drained; the patch is deprecated
        h.clock.advance("3d")
        run = await h.drain()  # type: ignore[assignment]
        fresh = await h.run(invoice, Item("b"))
        h.clock.advance("3d")
        fresh = await h.trace(fresh.job_id)
        await h.drain()
        fresh = await h.trace(fresh.job_id)
    assert run.state == "done"
    assert run.result == "taxed"
    assert run.steps["charge-taxed"].executions == 1  # replayed past the marker
    assert fresh.state == "done"
    assert "patch:tax" not in fresh.steps  # deprecate_patch records nothing
    assert list(fresh.steps) == ["charge-taxed", "sleep:1", "nudge"]


async def test_patched_is_crash_proof(autojump_clock: Any) -> None:
    release["n"] = 2
    # observe=None compares what the run left: its state, result and every
    # step's stored output (the patch's answer among them).
    report = await crash_proof(invoice, Item("c"), observe=None)
    assert "after-record:patch:tax" in report.points
    assert "before-step:patch:tax" in report.points


@pytest.mark.parametrize("bad", ["", None, 3, "x" * 300, "nul\x00"])
async def test_a_change_id_that_is_not_a_non_empty_string_is_refused(
    bad: Any, autojump_clock: Any
) -> None:
    seen: list[JobsError] = []

    @job(input=Item, idempotency_key=lambda i: i.key, name="bad_patch", retry=Retry(attempts=1))
    async def bad_patch(ctx: JobContext[Item]) -> None:
        for call in (ctx.step.patched, ctx.step.deprecate_patch):
            try:
                await call(bad)
            except JobsError as exc:
                seen.append(exc)

    async with open_harness(jobs=[bad_patch]) as h:
        trace = await h.run(bad_patch, Item("a"))
    assert [e.code for e in seen] == [ErrorCode.X_JOB_DECLARATION_INVALID] * 2
    assert all("change id" in e.message or "name" in e.message for e in seen)
    assert trace.steps == {}  # nothing written


async def test_two_patched_calls_with_one_id_are_a_duplicate_step(autojump_clock: Any) -> None:
    @job(input=Item, idempotency_key=lambda i: i.key, name="twice", retry=Retry(attempts=1))
    async def twice(ctx: JobContext[Item]) -> None:
        await ctx.step.patched("p")
        await ctx.step.patched("p")

    async with open_harness(jobs=[twice]) as h:
        trace = await h.run(twice, Item("a"))
    assert trace.error_code == ErrorCode.X_STEP_DUPLICATE
