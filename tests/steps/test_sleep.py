"""Spec: "Durable steps" — ``step.sleep(duration)``: persists a wake time, releases the
worker, and the job resumes later in any worker. No held connection, no timer in memory.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import trio

from jobs_support import Item, jobs_on_memory, running_worker, wait_for, wait_state
from trio_jobs import ErrorCode, JobContext, JobsError, Retry, job
from trio_jobs.testing import open_harness


def sleeper(log: list[str], *durations: Any, names: list[str | None] | None = None) -> Any:
    @job(input=Item, idempotency_key=lambda i: i.key, name="sleeper")
    async def body(ctx: JobContext[Item]) -> str:
        await ctx.step.run("before", lambda: log.append("before"))
        for index, duration in enumerate(durations):
            name = names[index] if names else None
            await ctx.step.sleep(duration, name=name)
            log.append(f"woke {index + 1}")
        await ctx.step.run("after", lambda: log.append("after"))
        return "awake"

    return body


class TestDurableSleep:
    async def test_a_sleeping_run_is_delayed_and_holds_nothing(self, autojump_clock: Any) -> None:
        log: list[str] = []
        body = sleeper(log, "3d")
        async with open_harness(jobs=[body]) as h:
            trace = await h.run(body, Item("a"))
            view = await h.jobs.show(trace.job_id)
            assert trace.state == "delayed"
            assert trace.attempts == 0  # a sleep hand-back is uncounted
            assert view.run_at - h.driver.now() == pytest.approx(3 * 86400, abs=0.01)
            assert trace.steps["sleep:1"].status == "sleeping"
            assert all(w.stats().in_flight == 0 for w in h.workers)
            h.clock.advance("2d")
            trace2 = await h.drain()
            assert trace2 is not None
            assert trace2.state == "delayed"  # not yet
            h.clock.advance("1d")
            trace3 = await h.drain()
        assert trace3 is not None
        assert trace3.state == "done"
        assert trace3.result == "awake"
        assert trace3.attempts == 1
        assert log == ["before", "woke 1", "after"]  # before ran once: replayed after the sleep
        assert trace3.steps["before"].executions == 1
        assert trace3.steps["sleep:1"].status == "completed"

    async def test_positional_names(self, autojump_clock: Any) -> None:
        log: list[str] = []
        body = sleeper(log, "1h", timedelta(minutes=30), 60)
        async with open_harness(jobs=[body]) as h:
            trace = await h.run(body, Item("a"))
            for _ in range(3):
                h.clock.advance("1h")
                trace = await h.drain()  # type: ignore[assignment]
        assert trace is not None
        assert trace.state == "done"
        assert list(trace.steps) == ["before", "sleep:1", "sleep:2", "sleep:3", "after"]
        # code between steps re-runs on each replay; the steps themselves ran once
        assert log == [
            "before",
            "woke 1",
            "woke 1",
            "woke 2",
            "woke 1",
            "woke 2",
            "woke 3",
            "after",
        ]

    async def test_an_explicit_name(self, autojump_clock: Any) -> None:
        log: list[str] = []
        body = sleeper(log, "1m", "1m", names=["cool-off", None])
        async with open_harness(jobs=[body]) as h:
            await h.run(body, Item("a"))
            h.clock.advance("1m")
            await h.drain()
            h.clock.advance("1m")
            trace = await h.drain()
        assert trace is not None
        assert list(trace.steps) == ["before", "cool-off", "sleep:2", "after"]

    async def test_promote_ends_a_sleep_early(self, autojump_clock: Any) -> None:
        log: list[str] = []
        body = sleeper(log, "3d")
        async with open_harness(jobs=[body]) as h:
            trace = await h.run(body, Item("a"))
            assert trace.state == "delayed"
            view = await h.jobs.promote(trace.job_id)
            assert view.state == "ready"
            trace = await h.drain()  # type: ignore[assignment]
        assert trace is not None
        assert trace.state == "done"
        assert log == ["before", "woke 1", "after"]

    async def test_a_worker_resumes_the_run_when_it_falls_due(self, autojump_clock: Any) -> None:
        woke: list[float] = []

        @job(input=Item, idempotency_key=lambda i: i.key)
        async def nap(ctx: JobContext[Item]) -> None:
            await ctx.step.sleep("90s")
            woke.append(trio.current_time())

        async with jobs_on_memory([nap]) as (jobs, _driver):
            async with running_worker(jobs, idle_poll_max="10s"):
                began = trio.current_time()
                enq = await nap.enqueue(Item("a"))
                view = await wait_state(jobs, enq.id, "delayed")
                assert view.attempts == 0
                await wait_for(lambda: woke, timeout=600)
                view = await wait_state(jobs, enq.id, "done")
        assert woke[0] - began == pytest.approx(90.0, abs=0.01)
        assert view.attempts == 1

    async def test_a_zero_sleep_does_not_hand_back(self, autojump_clock: Any) -> None:
        log: list[str] = []
        body = sleeper(log, 0)
        async with open_harness(jobs=[body]) as h:
            trace = await h.run(body, Item("a"))
        assert trace.state == "done"
        assert log == ["before", "woke 1", "after"]

    @pytest.mark.parametrize("bad", ["soon", -1, True])
    async def test_a_bad_duration_is_refused(self, bad: Any, autojump_clock: Any) -> None:
        codes: list[str] = []

        @job(input=Item, idempotency_key=lambda i: i.key)
        async def bad_sleep(ctx: JobContext[Item]) -> None:
            try:
                await ctx.step.sleep(bad)
            except JobsError as exc:
                codes.append(exc.code)

        async with open_harness(jobs=[bad_sleep]) as h:
            trace = await h.run(bad_sleep, Item("a"))
        assert trace.state == "done"
        assert codes == [ErrorCode.X_CONFIG_INVALID]

    async def test_a_failure_after_the_sleep_retries_without_sleeping_again(
        self, autojump_clock: Any
    ) -> None:
        log: list[str] = []

        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=2, base="1s"))
        async def bumpy(ctx: JobContext[Item]) -> None:
            await ctx.step.sleep("1h")
            log.append(f"after sleep @{ctx.attempt}")
            if ctx.attempt == 1:
                raise RuntimeError("boom")

        async with open_harness(jobs=[bumpy]) as h:
            await h.run(bumpy, Item("a"))
            h.clock.advance("1h")
            trace = await h.drain()
        assert trace is not None
        assert trace.state == "done"
        assert log == ["after sleep @1", "after sleep @2"]
        assert trace.steps["sleep:1"].executions == 1
