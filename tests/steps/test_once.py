"""Spec: "Durable steps" — ``step.run(name, fn, once=True)``: at most once, ever.

``started`` is persisted before ``fn``; a replay finding it (or ``failed``) without
``completed`` stops with terminal ``X_STEP_OUTCOME_UNKNOWN`` and never calls ``fn``.
The operator resolves the step (ran / not ran), then requeues.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from jobs_support import Item, jobs_on_memory, running_worker, wait_state
from trio_jobs import ErrorCode, JobContext, JobsError, Retry, job
from trio_jobs.drivers import ClaimOptions, StepRecord
from trio_jobs.testing import open_harness

TERMINAL_NOTE = "not retried: this code is classified terminal"


class Crash(BaseException):
    """Stands in for the process dying inside fn (not an ordinary Exception)."""


def charge_job(calls: list[str], *, fail_first: BaseException | None = None, **decl: Any) -> Any:
    decl.setdefault("retry", Retry(attempts=3, base="1s"))

    @job(input=Item, idempotency_key=lambda i: i.key, name="charge-once", **decl)
    async def charge(ctx: JobContext[Item]) -> Any:
        def do_charge() -> dict[str, str]:
            calls.append(f"charge@{ctx.attempt}")
            if fail_first is not None and len(calls) == 1:
                raise fail_first
            return {"charge": "ch_1"}

        receipt = await ctx.step.run("charge", do_charge, once=True)
        await ctx.step.run("after", lambda: calls.append("after"))
        return receipt

    return charge


class TestOnce:
    async def test_started_is_persisted_before_fn(self, autojump_clock: Any) -> None:
        seen: list[list[tuple[str, str]]] = []

        @job(input=Item, idempotency_key=lambda i: i.key)
        async def careful(ctx: JobContext[Item]) -> None:
            async def fn() -> str:
                view = await ctx.jobs.show(ctx.job_id)
                seen.append([(s.name, s.status) for s in view.steps])
                return "ok"

            await ctx.step.run("charge", fn, once=True)

        async with open_harness(jobs=[careful]) as h:
            trace = await h.run(careful, Item("a"))
        assert seen == [[("charge", "started")]]
        assert trace.steps["charge"].status == "completed"
        assert trace.steps["charge"].output == "ok"
        assert trace.steps["charge"].executions == 1

    async def test_a_completed_once_step_replays_like_any_step(self, autojump_clock: Any) -> None:
        calls: list[str] = []

        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=2, base="1s"))
        async def then_fails(ctx: JobContext[Item]) -> None:
            await ctx.step.run("charge", lambda: calls.append("charge") or "ch_1", once=True)
            if ctx.attempt == 1:
                raise RuntimeError("a later failure")

        async with open_harness(jobs=[then_fails]) as h:
            trace = await h.run(then_fails, Item("a"))
        assert trace.state == "done"
        assert calls == ["charge"]
        assert trace.steps["charge"].executions == 1

    @pytest.mark.parametrize("failure", [Crash("killed"), ConnectionError("reset mid-call")])
    async def test_a_replay_after_fn_died_is_outcome_unknown(
        self, failure: BaseException, autojump_clock: Any
    ) -> None:
        calls: list[str] = []
        charge = charge_job(calls, fail_first=failure)
        async with open_harness(jobs=[charge]) as h:
            trace = await h.run(charge, Item("a"))
        # fn ran once; the replay found `failed` without `completed` and never called it
        assert calls == ["charge@1"]
        assert trace.state == "dead"
        assert trace.attempts == 2
        assert trace.error_code == ErrorCode.X_STEP_OUTCOME_UNKNOWN
        assert trace.last_error is not None
        assert TERMINAL_NOTE in trace.last_error
        assert "resolve-step" in trace.last_error
        assert trace.steps["charge"].status == "failed"
        assert "after" not in trace.steps

    async def test_a_replay_after_the_lease_lapsed_is_outcome_unknown(
        self, autojump_clock: Any
    ) -> None:
        """The worker died between `started` and an outcome: its lease lapses."""
        calls: list[str] = []
        charge = charge_job(calls)
        async with jobs_on_memory([charge]) as (jobs, driver):
            enq = await charge.enqueue(Item("a"))
            claim = await driver.claim(
                ClaimOptions(worker_id="dies", queues={"default": 1}, visibility_timeout=5.0)
            )
            (held,) = claim.jobs
            assert await driver.steps.put(
                held.id,
                held.fence,
                StepRecord(name="charge", status="started", seq=1, executions=1),
            )
            async with running_worker(jobs):
                view = await wait_state(jobs, enq.id, "dead")
        assert calls == []  # fn is never called on the replay
        assert view.error_code == ErrorCode.X_STEP_OUTCOME_UNKNOWN
        assert view.attempts == 2  # the lapse counted one, the replay stopped on the next
        assert [(s.name, s.status) for s in view.steps] == [("charge", "started")]

    async def test_resolved_as_ran_then_requeued(self, autojump_clock: Any) -> None:
        calls: list[str] = []
        charge = charge_job(calls, fail_first=Crash("killed"))
        async with open_harness(jobs=[charge]) as h:
            trace = await h.run(charge, Item("a"))
            assert trace.error_code == ErrorCode.X_STEP_OUTCOME_UNKNOWN
            # the operator checked the provider: it did charge
            await h.jobs.resolve_step(trace.job_id, "charge", ran=True, output={"charge": "ch_9"})
            await h.jobs.requeue(trace.job_id)
            trace = await h.drain()
        assert trace is not None
        assert trace.state == "done"
        assert trace.result == {"charge": "ch_9"}  # the resolved output, fn not called again
        assert calls == ["charge@1", "after"]

    async def test_resolved_as_not_ran_then_requeued(self, autojump_clock: Any) -> None:
        calls: list[str] = []
        charge = charge_job(calls, fail_first=Crash("killed"))
        async with open_harness(jobs=[charge]) as h:
            trace = await h.run(charge, Item("a"))
            await h.jobs.resolve_step(trace.job_id, "charge", ran=False)
            await h.jobs.requeue(trace.job_id)
            trace = await h.drain()
        assert trace is not None
        assert trace.state == "done"
        assert calls == ["charge@1", "charge@1", "after"]  # requeued: attempts start over
        assert trace.steps["charge"].status == "completed"
        assert trace.result == {"charge": "ch_1"}

    async def test_only_an_unknown_outcome_can_be_resolved(self, autojump_clock: Any) -> None:
        calls: list[str] = []
        charge = charge_job(calls)
        async with open_harness(jobs=[charge]) as h:
            trace = await h.run(charge, Item("a"))
            assert trace.state == "done"
            with pytest.raises(JobsError) as info:
                await h.jobs.resolve_step(trace.job_id, "charge", ran=False)
        assert info.value.code == ErrorCode.X_INVARIANT

    async def test_a_drained_once_step_is_not_recorded_done(self, autojump_clock: Any) -> None:
        """A drain mid-fn leaves `started`: the next attempt cannot know, so it stops."""
        calls: list[str] = []
        entered = trio.Event()

        @job(input=Item, idempotency_key=lambda i: i.key)
        async def slow_charge(ctx: JobContext[Item]) -> None:
            async def fn() -> None:
                calls.append("charge")
                entered.set()
                await trio.sleep_forever()

            await ctx.step.run("charge", fn, once=True)

        async with jobs_on_memory([slow_charge]) as (jobs, _driver):
            enq = await slow_charge.enqueue(Item("a"))
            async with running_worker(jobs) as worker:
                await entered.wait()
                await worker.drain()
            view = await jobs.show(enq.id)
            assert (view.state, view.attempts) == ("ready", 0)
            assert [(s.name, s.status) for s in view.steps] == [("charge", "started")]
            async with running_worker(jobs):
                view = await wait_state(jobs, enq.id, "dead")
        assert calls == ["charge"]
        assert view.error_code == ErrorCode.X_STEP_OUTCOME_UNKNOWN
