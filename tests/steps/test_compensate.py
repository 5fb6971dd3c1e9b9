"""Spec: "Compensation" — ``step.run(name, fn, compensate=...)`` on a
``job(compensates=True)``: charge, reserve, ship; the third fails for good, the
first two are undone, last-in first-out, each recorded as ``compensate:<name>``.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from jobs_support import Item, jobs_on_memory, running_worker, wait_for, wait_state
from trio_jobs import ErrorCode, JobContext, Retry, job, register_error_retry
from trio_jobs.drivers import UNWIND_MARGIN, ClaimOptions, StepRecord
from trio_jobs.testing import open_harness


class World:
    """The outside world a checkout touches, and how it should misbehave."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.ship_fails: int = 10**9  # how many times ship fails
        self.refund_fails: int = 0
        self.release_fails: int = 0
        self.refunded: list[Any] = []
        self.seen_steps_at_first_compensator: list[str] | None = None


def checkout_job(world: World, *, attempts: int = 3, **decl: Any) -> Any:
    @job(
        input=Item,
        idempotency_key=lambda i: i.key,
        compensates=True,
        retry=Retry(attempts=attempts, base="1s"),
        name="checkout",
        **decl,
    )
    async def checkout(ctx: JobContext[Item]) -> str:
        async def look(name: str) -> None:
            if world.seen_steps_at_first_compensator is None:
                view = await ctx.jobs.show(ctx.job_id)
                world.seen_steps_at_first_compensator = [s.name for s in view.steps]
            world.log.append(name)

        async def refund(charge: dict[str, Any]) -> None:
            await look("refund")
            if world.refund_fails > 0:
                world.refund_fails -= 1
                raise ConnectionError("refund API down")
            world.refunded.append(charge)

        def release(reservation: list[Any]) -> None:  # sync compensators are fine
            world.log.append("release")
            if world.release_fails > 0:
                world.release_fails -= 1
                raise ConnectionError("warehouse down")

        def charge() -> dict[str, Any]:
            world.log.append("charge")
            return {"id": "ch_1", "amount": (10, "EUR")}

        def reserve() -> tuple[str, int]:
            world.log.append("reserve")
            return ("res_1", 2)

        def ship() -> None:
            world.log.append("ship")
            if world.ship_fails > 0:
                world.ship_fails -= 1
                raise RuntimeError("carrier refused the parcel")

        async def release_async(r: list[Any]) -> None:
            if world.seen_steps_at_first_compensator is None:
                view = await ctx.jobs.show(ctx.job_id)
                world.seen_steps_at_first_compensator = [s.name for s in view.steps]
            release(r)

        await ctx.step.run("charge", charge, compensate=refund)
        await ctx.step.run("reserve", reserve, compensate=release_async)
        await ctx.step.run("ship", ship)
        return "shipped"

    return checkout


class TestWhen:
    """Only once the run has failed for good — never on a retry, a cancel, a drain or a
    suspension."""

    async def test_never_on_a_retry(self, autojump_clock: Any) -> None:
        world = World()
        world.ship_fails = 2
        checkout = checkout_job(world, attempts=3)
        async with open_harness(jobs=[checkout]) as h:
            trace = await h.run(checkout, Item("o-1"))
        assert trace.state == "done"
        assert trace.attempts == 3
        assert world.log == ["charge", "reserve", "ship", "ship", "ship"]
        assert not any(name.startswith("compensate:") for name in trace.steps)
        assert "unwinding" not in trace.steps

    async def test_never_on_a_sleep_a_drain_or_a_cancel(self, autojump_clock: Any) -> None:
        log: list[str] = []
        gate = trio.Event()

        @job(input=Item, idempotency_key=lambda i: i.key, compensates=True)
        async def pausing(ctx: JobContext[Item]) -> None:
            await ctx.step.run("charge", lambda: "ch", compensate=lambda c: log.append("refund"))
            if ctx.input.group == "sleep":
                await ctx.step.sleep("1h")
            else:
                gate.set()
                await trio.sleep_forever()

        async with jobs_on_memory([pausing]) as (jobs, _driver):
            sleeping = await pausing.enqueue(Item("s", group="sleep"))
            drained = await pausing.enqueue(Item("d", group="drain"))
            async with running_worker(jobs, concurrency=1) as worker:
                await wait_state(jobs, sleeping.id, "delayed")
                await wait_for(gate.is_set)
                await worker.drain()
            assert (await jobs.show(drained.id)).state == "ready"
            gate = trio.Event()
            async with running_worker(jobs, concurrency=1):
                await wait_for(gate.is_set)
                await jobs.cancel(drained.id, reason="changed my mind")
                await trio.sleep(30)
            assert (await jobs.show(drained.id)).state == "cancelled"
            assert (await jobs.show(sleeping.id)).state == "delayed"
        assert log == []

    async def test_a_terminal_code_fails_for_good_at_once(self, autojump_clock: Any) -> None:
        register_error_retry({"X_TEST_CARRIER_REFUSED": "terminal"})
        log: list[str] = []

        @job(
            input=Item,
            idempotency_key=lambda i: i.key,
            compensates=True,
            retry=Retry(attempts=5),
        )
        async def refused(ctx: JobContext[Item]) -> None:
            from trio_jobs import JobsError

            await ctx.step.run(
                "charge", lambda: "ch", compensate=lambda c: log.append(f"refund {c}")
            )

            def ship() -> None:
                raise JobsError("X_TEST_CARRIER_REFUSED", "refused")

            await ctx.step.run("ship", ship)

        async with open_harness(jobs=[refused]) as h:
            trace = await h.run(refused, Item("a"))
        assert log == ["refund ch"]
        assert (trace.state, trace.attempts) == ("dead", 1)
        assert trace.error_code == "X_TEST_CARRIER_REFUSED"


class TestUnwind:
    async def test_lifo_recorded_and_the_row_keeps_the_original_error(
        self, autojump_clock: Any
    ) -> None:
        world = World()
        checkout = checkout_job(world, attempts=2)
        async with open_harness(jobs=[checkout]) as h:
            trace = await h.run(checkout, Item("o-1"))
        assert world.log == ["charge", "reserve", "ship", "ship", "release", "refund"]
        assert list(trace.steps) == [
            "charge",
            "reserve",
            "ship",
            "unwinding",
            "compensate:reserve",
            "compensate:charge",
        ]
        assert trace.steps["compensate:reserve"].status == "completed"
        assert trace.steps["compensate:charge"].status == "completed"
        # each compensator got its step's stored (JSON) output
        assert world.refunded == [{"id": "ch_1", "amount": [10, "EUR"]}]
        # the row's error is the original failure
        assert trace.state == "dead"
        assert trace.error_code is None
        assert trace.last_error is not None
        assert trace.last_error.startswith("RuntimeError: carrier refused the parcel")
        assert ErrorCode.X_JOB_COMPENSATION_FAILED not in trace.last_error

    async def test_unwinding_is_written_before_the_first_compensator(
        self, autojump_clock: Any
    ) -> None:
        world = World()
        checkout = checkout_job(world, attempts=1)
        async with open_harness(jobs=[checkout]) as h:
            await h.run(checkout, Item("o-1"))
        assert world.seen_steps_at_first_compensator == ["charge", "reserve", "ship", "unwinding"]

    async def test_the_row_carries_the_unwind_margin(self, autojump_clock: Any) -> None:
        world = World()
        checkout = checkout_job(world, attempts=3)
        assert UNWIND_MARGIN == 2
        assert checkout.max_attempts == 3 + UNWIND_MARGIN
        async with open_harness(jobs=[checkout]) as h:
            enq = await checkout.enqueue(Item("o-1"))
            view = await h.jobs.show(enq.id)
        assert view.max_attempts == 5

    async def test_a_replay_skips_what_ran(self, autojump_clock: Any) -> None:
        world = World()
        world.refund_fails = 1
        checkout = checkout_job(world, attempts=1)
        async with open_harness(jobs=[checkout]) as h:
            trace = await h.run(checkout, Item("o-1"))
        # attempt 1: ship fails for good, release ok, refund throws -> back to the queue;
        # attempt 2 replays only to re-register compensators, skips release, refunds.
        assert world.log == ["charge", "reserve", "ship", "release", "refund", "refund"]
        assert trace.steps["compensate:reserve"].executions == 1
        assert trace.steps["compensate:charge"].executions == 2
        assert trace.steps["compensate:charge"].status == "completed"
        assert trace.state == "dead"
        assert trace.attempts == 2
        assert trace.last_error is not None
        assert trace.last_error.startswith("RuntimeError: carrier refused the parcel")

    async def test_a_compensator_that_keeps_throwing_is_compensation_failed(
        self, autojump_clock: Any
    ) -> None:
        world = World()
        world.refund_fails = 10**9
        checkout = checkout_job(world, attempts=2)
        async with open_harness(jobs=[checkout]) as h:
            trace = await h.run(checkout, Item("o-1"))
            assert trace.state == "dead"
            assert trace.error_code == ErrorCode.X_JOB_COMPENSATION_FAILED
            assert trace.last_error is not None
            assert "'charge'" in trace.last_error  # names the step
            assert "carrier refused the parcel" in trace.last_error  # and the original
            assert trace.attempts == 2 + UNWIND_MARGIN
            assert world.log.count("refund") == 1 + UNWIND_MARGIN
            assert world.log.count("release") == 1
            assert trace.steps["compensate:charge"].status == "failed"
            # fix it, then `trio-jobs retry ID`: the unwind continues, never the forward path
            world.refund_fails = 0
            world.log.clear()
            await h.jobs.requeue(trace.job_id)
            trace = await h.drain()
        assert trace is not None
        assert world.log == ["refund"]
        assert trace.steps["compensate:charge"].status == "completed"
        assert trace.steps["compensate:reserve"].executions == 1
        assert trace.state == "dead"
        assert trace.last_error is not None
        assert trace.last_error.startswith("RuntimeError: carrier refused the parcel")

    async def test_a_failed_compensation_records_its_code_as_a_failed_step_does(
        self, autojump_clock: Any
    ) -> None:
        from trio_jobs import JobsError

        @job(
            input=Item,
            idempotency_key=lambda i: i.key,
            compensates=True,
            retry=Retry(attempts=1),
            name="coded-unwind",
        )
        async def coded(ctx: JobContext[Item]) -> None:
            def refund(_out: Any) -> None:
                raise JobsError("X_REFUND_DECLINED", "the bank declined the refund")

            def ship() -> None:
                raise JobsError("X_CARRIER_DOWN", "no carrier today")

            await ctx.step.run("charge", lambda: 1, compensate=refund)
            await ctx.step.run("ship", ship)

        async with open_harness(jobs=[coded]) as h:
            trace = await h.run(coded, Item("o-1"))
            records = {r.name: r for r in await h.driver.steps.load(trace.job_id)}
        assert trace.error_code == ErrorCode.X_JOB_COMPENSATION_FAILED
        assert records["ship"].error_code == "X_CARRIER_DOWN"
        assert records["compensate:charge"].status == "failed"
        assert records["compensate:charge"].error_code == "X_REFUND_DECLINED"
        assert records["compensate:charge"].error is not None
        assert "declined" in records["compensate:charge"].error

    async def test_compensate_without_compensates_is_a_declaration_error(
        self, autojump_clock: Any
    ) -> None:
        calls: list[str] = []

        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=3))
        async def undeclared(ctx: JobContext[Item]) -> None:
            await ctx.step.run("charge", lambda: calls.append("charge"), compensate=lambda c: None)

        async with open_harness(jobs=[undeclared]) as h:
            trace = await h.run(undeclared, Item("a"))
        assert calls == []
        assert (trace.state, trace.attempts) == ("dead", 1)
        assert trace.error_code == ErrorCode.X_JOB_DECLARATION_INVALID

    async def test_a_timed_out_final_attempt_still_unwinds(self, autojump_clock: Any) -> None:
        refunds: list[float] = []

        async def refund(charge: str) -> None:
            await trio.sleep(1)  # a compensator may await: it gets its own budget
            refunds.append(trio.current_time())

        @job(
            input=Item,
            idempotency_key=lambda i: i.key,
            compensates=True,
            timeout="5s",
            retry=Retry(attempts=1),
        )
        async def slow(ctx: JobContext[Item]) -> None:
            await ctx.step.run("charge", lambda: "ch", compensate=refund)
            await trio.sleep(60)  # the carrier hangs past the job's timeout

        async with open_harness(jobs=[slow]) as h:
            trace = await h.run(slow, Item("a"))
        assert len(refunds) == 1
        assert trace.steps["compensate:charge"].status == "completed"
        assert trace.steps["compensate:charge"].executions == 1
        assert trace.state == "dead"
        assert trace.error_code == ErrorCode.X_JOB_TIMEOUT


class TestCrashes:
    async def _die_holding(self, driver: Any, *records: StepRecord) -> None:
        claim = await driver.claim(
            ClaimOptions(worker_id="dies", queues={"default": 1}, visibility_timeout=5.0)
        )
        (held,) = claim.jobs
        for record in records:
            assert await driver.steps.put(held.id, held.fence, record)

    async def test_a_crash_on_the_final_attempt_still_unwinds(self, autojump_clock: Any) -> None:
        """The row carries 2 attempts past retry.attempts; the claim re-offers it and it
        unwinds."""
        refunds: list[Any] = []

        @job(input=Item, idempotency_key=lambda i: i.key, compensates=True, retry=Retry(attempts=1))
        async def checkout(ctx: JobContext[Item]) -> None:
            await ctx.step.run("charge", lambda: {"id": "new"}, compensate=refunds.append)
            await ctx.step.run("ship", lambda: None)

        async with jobs_on_memory([checkout]) as (jobs, driver):
            enq = await checkout.enqueue(Item("a"))
            await self._die_holding(
                driver,
                StepRecord(
                    name="charge", status="completed", seq=1, executions=1, output={"id": "ch_1"}
                ),
            )
            async with running_worker(jobs):
                view = await wait_state(jobs, enq.id, "dead")
        assert refunds == [{"id": "ch_1"}]  # the stored output, never a re-run charge
        assert [s.name for s in view.steps] == ["charge", "unwinding", "compensate:charge"]
        assert "ship" not in [s.name for s in view.steps]
        assert view.error_code == ErrorCode.X_JOB_LEASE_LOST
        assert view.attempts == 2

    async def test_two_more_lapses_bury_it_with_unwinding_visible(
        self, autojump_clock: Any
    ) -> None:
        @job(input=Item, idempotency_key=lambda i: i.key, compensates=True, retry=Retry(attempts=1))
        async def checkout(ctx: JobContext[Item]) -> None:
            await ctx.step.run("charge", lambda: "ch", compensate=lambda c: None)

        async with jobs_on_memory([checkout]) as (jobs, driver):
            enq = await checkout.enqueue(Item("a"))
            charged = StepRecord(
                name="charge", status="completed", seq=1, executions=1, output="ch"
            )
            await self._die_holding(driver, charged)
            await trio.sleep(6)
            unwinding = StepRecord(
                name="unwinding", status="completed", seq=2, executions=1, output={}
            )
            await self._die_holding(driver, unwinding)
            await trio.sleep(6)
            await self._die_holding(driver)
            await trio.sleep(6)
            result = await driver.claim(
                ClaimOptions(worker_id="next", queues={"default": 1}, visibility_timeout=5.0)
            )
            view = await jobs.show(enq.id)
        assert result.jobs == []
        assert [e.id for e in result.exhausted] == [enq.id]
        assert view.state == "dead"
        assert view.attempts == 1 + UNWIND_MARGIN
        assert "unwinding" in [s.name for s in view.steps]

    async def test_once_with_compensate_and_an_unknown_outcome_stops_the_unwind(
        self, autojump_clock: Any
    ) -> None:
        refunds: list[Any] = []

        @job(input=Item, idempotency_key=lambda i: i.key, compensates=True, retry=Retry(attempts=1))
        async def checkout(ctx: JobContext[Item]) -> None:
            await ctx.step.run("reserve", lambda: "r", compensate=lambda r: refunds.append(r))
            await ctx.step.run("charge", lambda: "ch", compensate=refunds.append, once=True)

        async with jobs_on_memory([checkout]) as (jobs, driver):
            enq = await checkout.enqueue(Item("a"))
            await self._die_holding(
                driver,
                StepRecord(name="reserve", status="completed", seq=1, executions=1, output="r"),
                StepRecord(name="charge", status="started", seq=2, executions=1),
            )
            async with running_worker(jobs):
                view = await wait_state(jobs, enq.id, "dead")
        assert refunds == []  # stopped at once: resolve the step, then retry
        assert view.error_code == ErrorCode.X_JOB_COMPENSATION_FAILED
        assert view.last_error is not None
        assert "'charge'" in view.last_error


@pytest.mark.parametrize("attempts", [1, 3])
async def test_max_attempts_is_attempts_plus_margin(attempts: int, autojump_clock: Any) -> None:
    @job(
        input=Item,
        idempotency_key=lambda i: i.key,
        compensates=True,
        retry=Retry(attempts=attempts),
    )
    async def comp(ctx: JobContext[Item]) -> None:
        return None

    @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=attempts))
    async def plain(ctx: JobContext[Item]) -> None:
        return None

    assert comp.max_attempts == attempts + UNWIND_MARGIN
    assert plain.max_attempts == attempts
