"""Child jobs: ``step.invoke`` and ``step.gather`` (PYTHON-API.md, Wave 3,
"Child jobs"), on the memory driver."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from jobs_support import Item, jobs_on_memory, running_worker, wait_for, wait_state
from trio_jobs import MAX_ENQUEUE_BATCH, ErrorCode, JobContext, JobsError, Retry, job
from trio_jobs.testing import open_harness


@job(input=int, idempotency_key=lambda n: str(n))
async def square(ctx: JobContext[int]) -> int:
    return ctx.input * ctx.input


@job(input=int, idempotency_key=lambda n: str(n), retry=Retry(attempts=1))
async def boom(ctx: JobContext[int]) -> int:
    raise ValueError("no")


def parent_of(calls: list[Any], *, timeout: Any = None, attempts: int = 1) -> Any:
    @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=attempts, base="1s"))
    async def parent(ctx: JobContext[Item]) -> Any:
        one = await ctx.step.invoke("one", square, 3, timeout=timeout)
        many = await ctx.step.gather("many", [(square, n) for n in range(5)])
        calls.append((one, many))
        return {"one": one, "many": many}

    return parent


class TestInvoke:
    async def test_the_parent_suspends_and_resumes_with_its_childrens_results(
        self, autojump_clock: Any
    ) -> None:
        calls: list[Any] = []
        parent = parent_of(calls)
        async with open_harness(jobs=[parent, square]) as h:
            trace = await h.run(parent, Item("a"))
            assert trace.state == "done"
            assert trace.result == {"one": 9, "many": [0, 1, 4, 9, 16]}
            assert calls == [(9, [0, 1, 4, 9, 16])]  # the body resumed exactly once per wait
            view = await h.jobs.show(trace.job_id)
            assert len(view.children) == 6
            assert view.parent_id is None
            kids = [await h.jobs.show(c) for c in view.children]
            assert {k.parent_id for k in kids} == {trace.job_id}
            assert [k.result for k in kids] == [9, 0, 1, 4, 9, 16]
            assert all(k.children == () for k in kids)
            # waiting spent no attempt
            assert view.attempts == 1

    async def test_a_replay_never_enqueues_the_child_again(self, autojump_clock: Any) -> None:
        fail_once: list[int] = []

        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=3, base="1s"))
        async def parent(ctx: JobContext[Item]) -> int:
            got = await ctx.step.invoke("one", square, 4)
            if not fail_once:
                fail_once.append(1)
                raise RuntimeError("after the child")
            return int(got)

        async with open_harness(jobs=[parent, square]) as h:
            trace = await h.run(parent, Item("a"))
            assert trace.state == "done"
            assert trace.result == 16
            view = await h.jobs.show(trace.job_id)
            assert len(view.children) == 1
            assert sum(1 for r in h.driver._rows.values() if r.name == square.name) == 1

    async def test_the_childs_settle_wakes_the_parent_at_once(self, autojump_clock: Any) -> None:
        resumed: list[float] = []
        settled: list[float] = []

        @job(input=int, idempotency_key=lambda n: str(n))
        async def slow(ctx: JobContext[int]) -> int:
            await trio.sleep(100)
            settled.append(trio.current_time())
            return 1

        @job(input=Item, idempotency_key=lambda i: i.key, event_poll="1h")
        async def parent(ctx: JobContext[Item]) -> None:
            await ctx.step.invoke("one", slow, 1)
            resumed.append(trio.current_time())

        async with jobs_on_memory([parent, slow]) as (jobs, _driver):
            enq = await parent.enqueue(Item("a"))
            async with running_worker(jobs, idle_poll_max="10s", concurrency=2):
                await wait_for(lambda: resumed)
                await wait_state(jobs, enq.id, "done")
        assert resumed[0] - settled[0] < 0.01

    async def test_a_failed_child_raises_child_failed_in_the_parent(
        self, autojump_clock: Any
    ) -> None:
        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=1))
        async def parent(ctx: JobContext[Item]) -> None:
            try:
                await ctx.step.invoke("one", boom, 1)
            except JobsError as exc:
                assert exc.code == ErrorCode.X_CHILD_FAILED
                assert exc.meta["child_id"]
                assert "code" in exc.meta  # the child's X_* code (None: a plain exception)
                raise

        async with open_harness(jobs=[parent, boom]) as h:
            trace = await h.run(parent, Item("a"))
            assert trace.state in ("dead", "failed")
            assert trace.error_code == ErrorCode.X_CHILD_FAILED
            assert trace.steps["one"].status == "failed"
            view = await h.jobs.show(trace.job_id)
            child = await h.jobs.show(view.children[0])
            assert child.state in ("dead", "failed")

    async def test_a_failed_child_is_retried_by_a_new_child(self, autojump_clock: Any) -> None:
        tries: list[int] = []

        @job(input=int, idempotency_key=lambda n: str(n), retry=Retry(attempts=1))
        async def flaky(ctx: JobContext[int]) -> int:
            tries.append(1)
            if len(tries) == 1:
                raise ValueError("first")
            return 7

        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=2, base="1s"))
        async def parent(ctx: JobContext[Item]) -> int:
            return int(await ctx.step.invoke("one", flaky, 1))

        async with open_harness(jobs=[parent, flaky]) as h:
            trace = await h.run(parent, Item("a"))
            assert trace.state == "done"
            assert trace.result == 7
            view = await h.jobs.show(trace.job_id)
            assert len(view.children) == 2  # the dead one keeps its row

    async def test_a_timeout_raises_child_timeout_and_the_child_keeps_running(
        self, autojump_clock: Any
    ) -> None:
        @job(input=int, idempotency_key=lambda n: str(n))
        async def slow(ctx: JobContext[int]) -> int:
            await ctx.step.sleep("1h")
            return 1

        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=1))
        async def parent(ctx: JobContext[Item]) -> None:
            await ctx.step.invoke("one", slow, 1, timeout="10m")

        async with open_harness(jobs=[parent, slow]) as h:
            trace = await h.run(parent, Item("a"))
            assert trace.state == "suspended"
            h.clock.advance("10m")
            trace = await h.drain()  # type: ignore[assignment]
            assert trace is not None
            assert trace.error_code == ErrorCode.X_CHILD_TIMEOUT
            view = await h.jobs.show(trace.job_id)
            child = await h.jobs.show(view.children[0])
            assert child.state == "delayed"

    async def test_cancelling_the_parent_cancels_its_live_children(
        self, autojump_clock: Any
    ) -> None:
        @job(input=int, idempotency_key=lambda n: str(n))
        async def slow(ctx: JobContext[int]) -> int:
            await ctx.step.sleep("1h")
            return 1

        @job(input=Item, idempotency_key=lambda i: i.key)
        async def parent(ctx: JobContext[Item]) -> None:
            await ctx.step.gather("all", [(slow, n) for n in range(3)])

        async with open_harness(jobs=[parent, slow]) as h:
            trace = await h.run(parent, Item("a"))
            assert trace.state == "suspended"
            await h.jobs.cancel(trace.job_id)
            view = await h.jobs.show(trace.job_id)
            states = [(await h.jobs.show(c)).state for c in view.children]
        assert view.state == "cancelled"
        assert states == ["cancelled"] * 3


class TestBadInput:
    async def test_a_handle_not_in_open_jobs_is_refused(self, autojump_clock: Any) -> None:
        @job(input=int, idempotency_key=lambda n: str(n))
        async def stranger(ctx: JobContext[int]) -> int:
            return 1

        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=1))
        async def parent(ctx: JobContext[Item]) -> None:
            await ctx.step.invoke("one", stranger, 1)

        async with open_harness(jobs=[parent]) as h:
            trace = await h.run(parent, Item("a"))
            assert trace.error_code == ErrorCode.X_JOB_DECLARATION_INVALID
            assert stranger.name in (trace.last_error or "")
            assert "one" not in trace.steps
            assert [r for r in h.driver._rows.values() if r.name == stranger.name] == []

    async def test_a_gather_past_the_batch_limit_is_refused(self, autojump_clock: Any) -> None:
        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=1))
        async def parent(ctx: JobContext[Item]) -> None:
            await ctx.step.gather("all", [(square, n) for n in range(MAX_ENQUEUE_BATCH + 1)])

        async with open_harness(jobs=[parent, square]) as h:
            trace = await h.run(parent, Item("a"))
            assert trace.error_code == ErrorCode.X_JOB_ENQUEUE_BATCH_TOO_LARGE
            assert "all" not in trace.steps
            assert [r for r in h.driver._rows.values() if r.name == square.name] == []


@pytest.mark.parametrize("n", [1000])
async def test_a_gather_of_a_thousand_children(n: int, autojump_clock: Any) -> None:
    @job(input=Item, idempotency_key=lambda i: i.key)
    async def parent(ctx: JobContext[Item]) -> int:
        got = await ctx.step.gather("all", [(square, k) for k in range(n)])
        return sum(got)

    async with open_harness(jobs=[parent, square]) as h:
        trace = await h.run(parent, Item("a"))
    assert trace.state == "done"
    assert trace.result == sum(k * k for k in range(n))


@job(input=int, idempotency_key=lambda n: str(n), name="cp.kid", retry=Retry(attempts=5))
async def cp_kid(ctx: JobContext[int]) -> int:
    return ctx.input * ctx.input


@job(input=int, idempotency_key=lambda n: str(n), name="cp.parent", retry=Retry(attempts=5))
async def cp_parent(ctx: JobContext[int]) -> int:
    one = await ctx.step.invoke("one", cp_kid, ctx.input)
    many = await ctx.step.gather("many", [(cp_kid, i) for i in range(3)])
    return int(one + sum(many))


async def test_crash_proof_walks_the_child_boundaries(autojump_clock: Any) -> None:
    """A kill before a child's enqueue, after it, and before the parent resumes
    leaves the same end: the parent done with its children's results (state,
    result and every step's stored output compared). That no child is enqueued
    twice is the simulation's check (the children scenario, its planted bug)."""
    from trio_jobs.testing import crash_proof

    report = await crash_proof(cp_parent, 3, observe=None, jobs=[cp_kid])
    for step in ("one", "many"):
        for boundary in ("before-step", "after-enqueue", "before-resume", "after-record"):
            assert f"{boundary}:{step}" in report.points, (boundary, step, report.points)
    assert report.reference[1] == {"one": [9], "many": [0, 1, 4]}
    assert report.reference[0] == 14
