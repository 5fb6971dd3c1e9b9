"""Spec: "The deadline cancels" — "A cancelled body writes nothing", and the
"Past the cancel" table.

Once ``ctx.signal`` is aborted with a coded reason, ``step.run`` / ``step.sleep`` /
``step.wait_for_event`` refuse to write and raise ``X_ABORTED``; a transaction and an
``enqueue`` (and ``publish_event``) rethrow that reason; ``run_to_completion(fn)``
lets writes land.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from jobs_support import Item, jobs_on_memory, running_worker, wait_for, wait_state
from trio_jobs import (
    ErrorCode,
    JobContext,
    JobsError,
    Retry,
    job,
    publish_event,
    run_to_completion,
)


@job(input=Item, idempotency_key=lambda i: i.key, name="side-job")
async def side_job(ctx: JobContext[Item]) -> None:
    return None


def aborting_job(
    after_abort: Any, *, record: list[Any], blocked: trio.Event | None = None, **decl: Any
) -> Any:
    """Blocks until aborted, then runs ``after_abort(ctx)`` inside its cancel handler."""
    decl.setdefault("retry", Retry(attempts=1))

    @job(input=Item, idempotency_key=lambda i: i.key, name="aborting", **decl)
    async def aborting(ctx: JobContext[Item]) -> None:
        await ctx.step.run("first", lambda: "kept")
        if ctx.attempt > 1 or ctx.input.group == "second-run":
            return
        try:
            if blocked is not None:
                blocked.set()
            await trio.sleep_forever()
        except trio.Cancelled:
            record.append(("reason", ctx.signal.reason.code if ctx.signal.reason else None))
            with trio.CancelScope(shield=True):
                await after_abort(ctx)
            raise

    return aborting


async def attempt(record: list[Any], label: str, call: Any) -> None:
    try:
        await call()
    except JobsError as exc:
        record.append((label, exc.code))
    else:
        record.append((label, "landed"))


async def drain_while_blocked(handle: Any, record: list[Any]) -> tuple[Any, Any]:
    async with jobs_on_memory([handle, side_job]) as (jobs, _driver):
        enq = await handle.enqueue(Item("a"))
        async with running_worker(jobs) as worker:
            await wait_state(jobs, enq.id, "running")
            await trio.sleep(1)
            await worker.drain()
        view = await jobs.show(enq.id)
        rows = (await jobs.list(name=side_job.name)).rows
        return view, rows


class TestPastTheAbort:
    async def test_steps_refuse_to_write_and_raise_aborted(self, autojump_clock: Any) -> None:
        record: list[Any] = []
        called: list[str] = []

        async def after(ctx: JobContext[Item]) -> None:
            await attempt(record, "run", lambda: ctx.step.run("late", lambda: called.append("x")))
            await attempt(record, "sleep", lambda: ctx.step.sleep("1h"))
            await attempt(
                record,
                "wait",
                lambda: ctx.step.wait_for_event("late-wait", "evt", schema=dict, timeout="1h"),
            )
            await attempt(
                record,
                "once",
                lambda: ctx.step.run("late-once", lambda: called.append("y"), once=True),
            )

        view, _rows = await drain_while_blocked(aborting_job(after, record=record), record)
        assert record == [
            ("reason", ErrorCode.X_DRAINING),
            ("run", ErrorCode.X_ABORTED),
            ("sleep", ErrorCode.X_ABORTED),
            ("wait", ErrorCode.X_ABORTED),
            ("once", ErrorCode.X_ABORTED),
        ]
        assert called == []
        assert [s.name for s in view.steps] == ["first"]  # nothing written past the abort
        assert (view.state, view.attempts) == ("ready", 0)

    async def test_enqueue_publish_and_transactions_rethrow_the_reason(
        self, autojump_clock: Any
    ) -> None:
        record: list[Any] = []
        reasons: list[Any] = []

        async def after(ctx: JobContext[Item]) -> None:
            await attempt(record, "enqueue", lambda: side_job.enqueue(Item("side")))
            await attempt(record, "publish", lambda: publish_event("evt", {"x": 1}))

            async def in_tx() -> None:
                async with ctx.jobs.transaction():
                    pass

            await attempt(record, "transaction", in_tx)
            try:
                ctx.signal.raise_if_aborted()
            except JobsError as exc:
                reasons.append(exc is ctx.signal.reason)

        _view, rows = await drain_while_blocked(aborting_job(after, record=record), record)
        assert record == [
            ("reason", ErrorCode.X_DRAINING),
            ("enqueue", ErrorCode.X_DRAINING),
            ("publish", ErrorCode.X_DRAINING),
            ("transaction", ErrorCode.X_DRAINING),
        ]
        assert reasons == [True]
        assert rows == []  # the enqueue never landed

    async def test_run_to_completion_lets_writes_land(self, autojump_clock: Any) -> None:
        record: list[Any] = []

        async def after(ctx: JobContext[Item]) -> None:
            await attempt(
                record, "step", lambda: run_to_completion(lambda: ctx.step.run("saved", lambda: 7))
            )
            await attempt(
                record, "enqueue", lambda: run_to_completion(lambda: side_job.enqueue(Item("s")))
            )

        view, rows = await drain_while_blocked(aborting_job(after, record=record), record)
        assert record == [
            ("reason", ErrorCode.X_DRAINING),
            ("step", "landed"),
            ("enqueue", "landed"),
        ]
        assert [(s.name, s.output) for s in view.steps] == [("first", "kept"), ("saved", 7)]
        assert len(rows) == 1

    async def test_a_timed_out_body_writes_nothing_either(self, autojump_clock: Any) -> None:
        record: list[Any] = []

        async def after(ctx: JobContext[Item]) -> None:
            await attempt(record, "run", lambda: ctx.step.run("late", lambda: 1))
            await attempt(record, "enqueue", lambda: side_job.enqueue(Item("side")))

        handle = aborting_job(after, record=record, timeout="3s")
        async with jobs_on_memory([handle, side_job]) as (jobs, _driver):
            enq = await handle.enqueue(Item("a"))
            async with running_worker(jobs):
                view = await wait_state(jobs, enq.id, "dead")
            rows = (await jobs.list(name=side_job.name)).rows
        assert record == [
            ("reason", ErrorCode.X_JOB_TIMEOUT),
            ("run", ErrorCode.X_ABORTED),
            ("enqueue", ErrorCode.X_JOB_TIMEOUT),
        ]
        assert [s.name for s in view.steps] == ["first"]
        assert rows == []
        assert view.error_code == ErrorCode.X_JOB_TIMEOUT

    async def test_an_operator_cancel_is_x_aborted(self, autojump_clock: Any) -> None:
        record: list[Any] = []

        async def after(ctx: JobContext[Item]) -> None:
            await attempt(record, "enqueue", lambda: side_job.enqueue(Item("side")))

        blocked = trio.Event()
        handle = aborting_job(after, record=record, blocked=blocked)
        async with jobs_on_memory([handle, side_job]) as (jobs, _driver):
            enq = await handle.enqueue(Item("a"))
            async with running_worker(jobs):
                await blocked.wait()
                await jobs.cancel(enq.id)
                await wait_for(lambda: len(record) == 2)
        assert record == [("reason", ErrorCode.X_ABORTED), ("enqueue", ErrorCode.X_ABORTED)]


class TestTheStepSignal:
    """fn receives a signal: this step's ceiling and the run's cancellation, whichever
    fires first."""

    async def test_the_runs_abort_reaches_the_steps_signal(self, autojump_clock: Any) -> None:
        seen: list[Any] = []
        entered = trio.Event()

        @job(input=Item, idempotency_key=lambda i: i.key, step_timeout="1h")
        async def stepping(ctx: JobContext[Item]) -> None:
            async def fn(signal: Any) -> None:
                entered.set()
                try:
                    await trio.sleep_forever()
                except trio.Cancelled:
                    seen.append((signal.aborted, signal.reason.code if signal.reason else None))
                    raise

            await ctx.step.run("outbound", fn)

        async with jobs_on_memory([stepping]) as (jobs, _driver):
            enq = await stepping.enqueue(Item("a"))
            async with running_worker(jobs) as worker:
                await entered.wait()
                await worker.drain()
            view = await jobs.show(enq.id)
        assert seen == [(True, ErrorCode.X_DRAINING)]
        assert [s.name for s in view.steps] == []  # a half-finished step is never recorded

    async def test_the_step_ceiling_names_itself_on_the_steps_signal(
        self, autojump_clock: Any
    ) -> None:
        seen: list[str] = []

        @job(
            input=Item, idempotency_key=lambda i: i.key, step_timeout="1s", retry=Retry(attempts=1)
        )
        async def slow_step(ctx: JobContext[Item]) -> None:
            async def fn(signal: Any) -> None:
                try:
                    await trio.sleep(5)
                except trio.Cancelled:
                    seen.append(str(signal.reason))
                    raise

            await ctx.step.run("slow", fn)

        async with jobs_on_memory([slow_step]) as (jobs, _driver):
            enq = await slow_step.enqueue(Item("a"))
            async with running_worker(jobs):
                view = await wait_state(jobs, enq.id, "dead")
        assert view.error_code == ErrorCode.X_JOB_TIMEOUT
        assert len(seen) == 1
        assert "step_timeout" in seen[0]
        assert "job's timeout" not in seen[0]

    async def test_a_step_whose_fn_finished_still_lands_after_a_drain(
        self, autojump_clock: Any
    ) -> None:
        calls: list[int] = []
        entered = trio.Event()

        @job(input=Item, idempotency_key=lambda i: i.key)
        async def stubborn_step(ctx: JobContext[Item]) -> str:
            async def fn() -> str:
                calls.append(ctx.attempt)
                entered.set()
                with trio.CancelScope(shield=True):
                    await trio.sleep(2)  # finishes its call despite the drain
                return "sent"

            return str(await ctx.step.run("send", fn))

        async with jobs_on_memory([stubborn_step]) as (jobs, _driver):
            enq = await stubborn_step.enqueue(Item("a"))
            async with running_worker(jobs) as worker:
                await entered.wait()
                await worker.drain()
            view = await jobs.show(enq.id)
            assert [(s.name, s.status) for s in view.steps] == [("send", "completed")]
            assert (view.state, view.attempts) == ("ready", 0)
            async with running_worker(jobs):
                view = await wait_state(jobs, enq.id, "done")
        assert calls == [1]  # replayed from storage, never sent twice
        assert view.result == "sent"


@pytest.mark.parametrize("code", ["X_ABORTED", "X_DRAINING", "X_JOB_TIMEOUT", "X_JOB_LEASE_LOST"])
def test_signal_reasons_are_aborted_errors(code: str) -> None:
    from trio_jobs import Signal
    from trio_jobs.errors import JobAbortedError

    signal = Signal()
    assert not signal.aborted
    signal.raise_if_aborted()
    assert signal.abort(ErrorCode(code), "why")
    assert not signal.abort(ErrorCode.X_ABORTED, "second reason loses")
    assert isinstance(signal.reason, JobAbortedError)
    assert signal.reason.code == code
    with pytest.raises(JobAbortedError):
        signal.raise_if_aborted()
