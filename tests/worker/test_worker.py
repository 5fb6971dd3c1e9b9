"""Spec: the worker — "Concurrency, rate limits, queues, retry" (slots, max_in_flight,
when_busy), "One run per key", "Idle cost and pickup latency", "The deadline cancels",
"Dead letter" (the drain), "Operating a queue" (progress, on_settled, the lease that
lapses on the final attempt) and "Observability" (heartbeat failed / lease lost).

Every test drives a real :class:`~trio_jobs.Worker` started with
``await nursery.start(worker.run)`` over the memory driver on Trio's MockClock.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from typing import Any

import attrs
import pytest
import trio

from jobs_support import (
    Item,
    count_acquires,
    events_named,
    jobs_on_memory,
    running_worker,
    wait_for,
    wait_state,
)
from trio_jobs import (
    Concurrency,
    ErrorCode,
    JobContext,
    JobsError,
    Outcome,
    Retry,
    Settled,
    Worker,
    job,
    memory_driver,
)
from trio_jobs.drivers import (
    ClaimOptions,
    EnqueueRequest,
    Progress,
)


class Gates:
    """Per-key events a blocking body waits on, and a record of who ran."""

    def __init__(self) -> None:
        self.events: dict[str, trio.Event] = defaultdict(trio.Event)
        self.started: list[str] = []
        self.start_times: dict[str, float] = {}
        self.running: dict[str, int] = defaultdict(int)
        self.peak: dict[str, int] = defaultdict(int)
        self.aborts: list[Any] = []
        self.abort_times: dict[str, float] = {}

    def open(self, key: str) -> None:
        self.events[key].set()

    def open_all(self, keys: Any) -> None:
        for key in keys:
            self.open(key)


def gated_job(gates: Gates, *, queue: str = "default", name: str | None = None, **decl: Any) -> Any:
    @job(
        input=Item,
        idempotency_key=lambda i: i.key,
        queue=queue,
        name=name or f"gated-{queue}",
        **decl,
    )
    async def gated(ctx: JobContext[Item]) -> str:
        key = ctx.input.key
        gates.started.append(key)
        gates.start_times[key] = trio.current_time()
        gates.running[queue] += 1
        gates.peak[queue] = max(gates.peak[queue], gates.running[queue])
        try:
            await gates.events[key].wait()
        except trio.Cancelled:
            reason = ctx.signal.reason
            gates.aborts.append((key, ctx.signal.aborted, reason.code if reason else None))
            gates.abort_times.setdefault(key, trio.current_time())
            raise
        finally:
            gates.running[queue] -= 1
        return key

    return gated


class ClaimSpy:
    def __init__(self, driver: Any) -> None:
        self.real = driver.claim
        self.times: list[float] = []
        self.asked: list[dict[str, int]] = []
        driver.claim = self

    async def __call__(self, options: ClaimOptions) -> Any:
        self.times.append(trio.current_time())
        self.asked.append(dict(options.queues))
        return await self.real(options)


class SettleSpy:
    """Records every ack/nack the worker sends, with the fence it carried."""

    def __init__(self, driver: Any) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        real_ack, real_nack = driver.ack, driver.nack

        async def ack(job_id: str, options: Any) -> bool:
            self.calls.append(("ack", job_id, options))
            return bool(await real_ack(job_id, options))

        async def nack(job_id: str, options: Any) -> bool:
            self.calls.append(("nack", job_id, options))
            return bool(await real_nack(job_id, options))

        driver.ack, driver.nack = ack, nack


# =========================================================================== slots and queues


class TestSlots:
    """A nursery of slots per queue: the worker's `concurrency`."""

    async def test_slots_per_queue(self, autojump_clock: Any) -> None:
        gates = Gates()
        in_a, in_b = gated_job(gates, queue="a"), gated_job(gates, queue="b")
        async with jobs_on_memory([in_a, in_b]) as (jobs, _driver):
            for n in range(5):
                await in_a.enqueue(Item(f"a{n}"))
                await in_b.enqueue(Item(f"b{n}"))
            async with running_worker(jobs, queues=["a", "b"], concurrency={"a": 2, "b": 1}) as w:
                await wait_for(lambda: gates.running["a"] == 2 and gates.running["b"] == 1)
                await trio.sleep(10)
                assert (w.stats().in_flight, w.stats().capacity) == (3, 3)
                gates.open_all([f"a{n}" for n in range(5)] + [f"b{n}" for n in range(5)])
                await wait_for(lambda: len(gates.started) == 10 and w.stats().in_flight == 0)
            assert dict(gates.peak) == {"a": 2, "b": 1}
            assert w.stats().done == 10

    async def test_an_int_gives_every_queue_that_many(self, autojump_clock: Any) -> None:
        gates = Gates()
        in_a, in_b = gated_job(gates, queue="a"), gated_job(gates, queue="b")
        async with jobs_on_memory([in_a, in_b]) as (jobs, _driver):
            for n in range(5):
                await in_a.enqueue(Item(f"a{n}"))
                await in_b.enqueue(Item(f"b{n}"))
            async with running_worker(jobs, queues=["a", "b"], concurrency=3) as w:
                await wait_for(lambda: gates.running["a"] == 3 and gates.running["b"] == 3)
                await trio.sleep(5)
                assert w.stats().in_flight == 6
                gates.open_all(list(gates.events) + [f"{q}{n}" for q in "ab" for n in range(5)])

    async def test_queues_default_to_those_of_the_registered_jobs(
        self, autojump_clock: Any
    ) -> None:
        gates = Gates()
        in_a, in_b = gated_job(gates, queue="a"), gated_job(gates, queue="b")
        async with jobs_on_memory([in_a, in_b]) as (jobs, _driver):
            worker = Worker(jobs)
            assert worker.queues == ["a", "b"]

    @pytest.mark.parametrize(
        ("value", "code"),
        [
            (0, ErrorCode.X_INVARIANT),
            (-1, ErrorCode.X_CONFIG_INVALID),
            (1.5, ErrorCode.X_CONFIG_INVALID),
        ],
    )
    async def test_a_bad_max_in_flight_is_refused(
        self, value: Any, code: ErrorCode, autojump_clock: Any
    ) -> None:
        async with jobs_on_memory([]) as (jobs, _driver):
            with pytest.raises(JobsError) as info:
                Worker(jobs, max_in_flight=value)
            assert info.value.code == code

    @pytest.mark.parametrize("queues", [[], "a", ["a", ""], ["a\x00"], ["\ud800"], [1]], ids=repr)
    async def test_bad_queues_are_refused(self, queues: Any, autojump_clock: Any) -> None:
        # A NUL reached PostgreSQL's claim as a raw DataError.
        async with jobs_on_memory([]) as (jobs, _driver):
            with pytest.raises(JobsError) as info:
                Worker(jobs, queues=queues)
            assert info.value.code == ErrorCode.X_CONFIG_INVALID


class TestMaxInFlight:
    """max_in_flight: max simultaneous runs in one worker process, across every queue;
    a pass splits its room over the queues, hands what an empty queue leaves to the next,
    and starts after the last queue served — no queue starves."""

    async def test_the_room_is_split_over_the_queues(self, autojump_clock: Any) -> None:
        gates = Gates()
        handles = [gated_job(gates, queue=q) for q in "abc"]
        async with jobs_on_memory(handles) as (jobs, _driver):
            for handle in handles:
                for n in range(5):
                    await handle.enqueue(Item(f"{handle.queue}{n}"))
            async with running_worker(
                jobs, queues=["a", "b", "c"], concurrency=10, max_in_flight=3
            ) as w:
                await wait_for(lambda: len(gates.started) == 3)
                await trio.sleep(5)
                assert dict(gates.running) == {"a": 1, "b": 1, "c": 1}
                assert w.stats().max_in_flight == 3
                assert (w.stats().in_flight, w.stats().capacity) == (3, 3)
                gates.open_all([f"{q}{n}" for q in "abc" for n in range(5)])
                await wait_for(lambda: len(gates.started) == 15)
            assert max(gates.peak.values()) <= 3

    @pytest.mark.parametrize("cap", [None, 1, 3, 8])
    async def test_one_queues_room_is_what_the_split_over_queues_gives(
        self, cap: int | None, autojump_clock: Any
    ) -> None:
        # A worker on one queue takes a shorter road to its room; it must answer
        # what the general split answers, in every state of slots and cap.
        async with jobs_on_memory([]) as (jobs, _driver):
            w = Worker(jobs, concurrency=5, max_in_flight=cap)
            for in_flight, held in itertools.product(range(7), range(10)):
                w._in_flight["default"] = in_flight
                w._held = dict.fromkeys(range(held))  # type: ignore[arg-type]
                general = w._room(frozenset({"not-a-queue"}))
                assert w._room() == general, (in_flight, held, cap)

    async def test_a_worker_at_the_cap_claims_nothing(self, autojump_clock: Any) -> None:
        gates = Gates()
        handle = gated_job(gates)
        async with jobs_on_memory([handle]) as (jobs, driver):
            for n in range(3):
                await handle.enqueue(Item(f"k{n}"))
            spy = ClaimSpy(driver)
            async with running_worker(jobs, max_in_flight=1):
                await wait_for(lambda: len(gates.started) == 1)
                before = len(spy.times)
                await trio.sleep(30)
                assert len(spy.times) == before
                opened_at = trio.current_time()
                gates.open("k0")
                # each run that ends frees one claim at once
                await wait_for(lambda: len(gates.started) == 2)
                assert gates.start_times["k1"] - opened_at < 1e-6
                gates.open_all(["k1", "k2"])

    async def test_an_empty_queue_hands_its_room_to_the_next(self, autojump_clock: Any) -> None:
        gates = Gates()
        in_a, in_b = gated_job(gates, queue="a"), gated_job(gates, queue="b")
        async with jobs_on_memory([in_a, in_b]) as (jobs, _driver):
            for n in range(4):
                await in_b.enqueue(Item(f"b{n}"))
            async with running_worker(
                jobs, queues=["a", "b"], concurrency=4, max_in_flight=2, idle_poll_max="10s"
            ):
                start = trio.current_time()
                await wait_for(lambda: gates.running["b"] == 2, timeout=5)
                # no poll interval spent: queue a was empty, so b takes its room at once
                assert trio.current_time() - start < 0.1
                gates.open_all([f"b{n}" for n in range(4)])

    async def test_a_pass_starts_after_the_last_queue_served(self, autojump_clock: Any) -> None:
        gates = Gates()
        handles = [gated_job(gates, queue=q) for q in "abc"]
        async with jobs_on_memory(handles) as (jobs, _driver):
            for handle in handles:
                for n in range(3):
                    await handle.enqueue(Item(f"{handle.queue}{n}"))
            async with running_worker(
                jobs, queues=["a", "b", "c"], concurrency=10, max_in_flight=2
            ):
                await wait_for(lambda: len(gates.started) == 2)
                assert sorted(gates.started) == ["a0", "b0"]
                gates.open("a0")
                await wait_for(lambda: len(gates.started) == 3)
                assert gates.started[2] == "c0"  # c, never b again first
                gates.open("b0")
                await wait_for(lambda: len(gates.started) == 4)
                assert gates.started[3] == "a1"
                gates.open_all([f"{q}{n}" for q in "abc" for n in range(3)])
                await wait_for(lambda: len(gates.started) == 9)

    async def test_no_queue_starves(self, autojump_clock: Any) -> None:
        order: list[str] = []

        def quick(queue: str) -> Any:
            @job(input=Item, idempotency_key=lambda i: i.key, queue=queue, name=f"quick-{queue}")
            async def body(ctx: JobContext[Item]) -> None:
                order.append(queue)
                await trio.sleep(1)

            return body

        handles = [quick(q) for q in "abc"]
        async with jobs_on_memory(handles) as (jobs, _driver):
            for handle in handles:
                for n in range(4):
                    await handle.enqueue(Item(f"{handle.queue}{n}"))
            async with running_worker(jobs, queues=["a", "b", "c"], max_in_flight=1):
                await wait_for(lambda: len(order) == 12)
        # one at a time: each queue gets a turn in every window of three
        for start in range(0, 12, 3):
            assert sorted(order[start : start + 3]) == ["a", "b", "c"], order


# =========================================================================== polling and wake


class TestPolling:
    """The worker waits poll_interval while passes find work, doubling to idle_poll_max
    while they do not; a driver that pushes wakes it at once."""

    @pytest.mark.parametrize("with_wake", [True, False])
    async def test_idle_backoff_doubles_to_idle_poll_max(
        self, with_wake: bool, autojump_clock: Any
    ) -> None:
        driver = memory_driver()
        if not with_wake:
            driver.wake = None
        async with jobs_on_memory([], driver) as (jobs, driver):
            spy = ClaimSpy(driver)
            async with running_worker(
                jobs, queues=["default"], poll_interval="250ms", idle_poll_max="2s"
            ):
                await trio.sleep(9.9)
        gaps = [round(b - a, 3) for a, b in zip(spy.times, spy.times[1:], strict=False)]
        if with_wake:
            # A live wake announces new work and the claim says nothing falls due
            # (ClaimResult.next_due): no backoff to guess with, the ceiling at once.
            assert gaps[:4] == [2.0, 2.0, 2.0, 2.0]
        else:
            assert gaps[:7] == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0, 2.0][: len(gaps[:7])]
            assert len(gaps) >= 6
        assert max(gaps) == 2.0

    @pytest.mark.parametrize("says", [True, False])
    async def test_a_delayed_row_starts_when_it_falls_due_when_the_claim_says_when(
        self, says: bool, autojump_clock: Any
    ) -> None:
        starts: list[float] = []

        @job(input=Item, idempotency_key=lambda i: i.key)
        async def noted(ctx: JobContext[Item]) -> None:
            starts.append(trio.current_time())

        async with jobs_on_memory([noted]) as (jobs, driver):
            spy = ClaimSpy(driver)
            if not says:
                claim = driver.claim

                async def silent(options: Any) -> Any:
                    return attrs.evolve(await claim(options), next_due=None)

                driver.claim = silent  # type: ignore[method-assign]
            async with running_worker(jobs, poll_interval="250ms", idle_poll_max="5s"):
                await trio.sleep(10.1)  # idle at the ceiling
                enqueued_at = trio.current_time()
                await noted.enqueue(Item("later"), delay="3s")
                await wait_for(lambda: starts)
                claims = [t for t in spy.times if t >= enqueued_at]
        if says:
            # woken by the enqueue, told the row falls due in 3 s: one more claim, then
            assert starts[0] - enqueued_at == pytest.approx(3.0, abs=1e-6)
            assert len(claims) == 2
        else:
            # woken by the enqueue, nothing due: the next look is a ceiling later
            assert starts[0] - enqueued_at == pytest.approx(5.0, abs=1e-6)
            assert len(claims) == 2

    async def test_the_memory_drivers_wake_picks_work_up_at_once(self, autojump_clock: Any) -> None:
        starts: list[float] = []

        @job(input=Item, idempotency_key=lambda i: i.key)
        async def noted(ctx: JobContext[Item]) -> None:
            starts.append(trio.current_time())

        async with jobs_on_memory([noted]) as (jobs, _driver):
            async with running_worker(jobs, idle_poll_max="2s"):
                await trio.sleep(60.3)  # long idle: the poll is at its ceiling
                enqueued_at = trio.current_time()
                await noted.enqueue(Item("now"))
                await wait_for(lambda: starts)
        assert starts[0] - enqueued_at < 0.001

    async def test_without_a_wake_the_poll_finds_it_within_idle_poll_max(
        self, autojump_clock: Any
    ) -> None:
        starts: list[float] = []

        @job(input=Item, idempotency_key=lambda i: i.key)
        async def noted(ctx: JobContext[Item]) -> None:
            starts.append(trio.current_time())

        driver = memory_driver()
        driver.wake = None
        async with jobs_on_memory([noted], driver) as (jobs, _driver):
            async with running_worker(jobs, idle_poll_max="2s"):
                await trio.sleep(60.3)
                enqueued_at = trio.current_time()
                await noted.enqueue(Item("later"))
                await wait_for(lambda: starts)
        assert 0 < starts[0] - enqueued_at <= 2.0


# =========================================================================== heartbeats and leases


class HeartbeatControl:
    """Wraps driver.heartbeat: fail (raise) or hang selected renewals."""

    def __init__(self, driver: Any) -> None:
        self.real = driver.heartbeat
        self.mode = "ok"
        self.fail_next = 0
        self.calls: list[tuple[float, list[Any]]] = []
        driver.heartbeat = self

    async def __call__(self, requests: Any, visibility_timeout: float) -> list[str]:
        self.calls.append((trio.current_time(), list(requests)))
        if self.fail_next > 0:
            self.fail_next -= 1
            raise JobsError(ErrorCode.X_DRIVER_UNAVAILABLE, "the database is away")
        if self.mode == "fail":
            raise JobsError(ErrorCode.X_DRIVER_UNAVAILABLE, "the database is away")
        if self.mode == "hang":
            await trio.sleep_forever()
        return await self.real(requests, visibility_timeout)


class TestHeartbeats:
    async def test_heartbeats_renew_a_long_run(self, autojump_clock: Any, caplog: Any) -> None:
        @job(input=Item, idempotency_key=lambda i: i.key)
        async def long_run(ctx: JobContext[Item]) -> str:
            await trio.sleep(200)  # far past the 30 s visibility window
            return "done"

        async with jobs_on_memory([long_run]) as (jobs, driver):
            beats = HeartbeatControl(driver)
            enq = await long_run.enqueue(Item("a"))
            async with running_worker(jobs, visibility_timeout="30s") as worker:
                view = await wait_state(jobs, enq.id, "done")
            assert view.attempts == 1
            assert worker.stats().leases_lost == 0
        renewals = [t for t, reqs in beats.calls if any(r.job_id == enq.id for r in reqs)]
        # every third of the window
        assert len(renewals) >= 19
        assert all(b - a <= 10.0 + 1e-6 for a, b in itertools.pairwise(renewals))
        assert not events_named(caplog, "jobs.lease.lost")
        assert not events_named(caplog, "jobs.heartbeat.failed")

    async def test_one_failed_renewal_is_a_warning_only(
        self, autojump_clock: Any, caplog: Any
    ) -> None:
        @job(input=Item, idempotency_key=lambda i: i.key)
        async def long_run(ctx: JobContext[Item]) -> None:
            await trio.sleep(60)

        async with jobs_on_memory([long_run]) as (jobs, driver):
            beats = HeartbeatControl(driver)
            beats.fail_next = 1
            enq = await long_run.enqueue(Item("a"))
            async with running_worker(jobs, visibility_timeout="30s"):
                view = await wait_state(jobs, enq.id, "done")
        # The failed try is retried at once within the beat (a transient failure):
        # one warning, and the renewal lands.
        retried = events_named(caplog, "jobs.heartbeat.retry")
        assert len(retried) == 1
        assert retried[0].levelname == "WARNING"
        assert retried[0].code == ErrorCode.X_DRIVER_UNAVAILABLE  # type: ignore[attr-defined]
        assert not events_named(caplog, "jobs.heartbeat.failed")
        assert not events_named(caplog, "jobs.lease.lost")
        assert (view.state, view.attempts) == ("done", 1)

    @pytest.mark.parametrize("mode", ["fail", "hang"])
    async def test_a_whole_window_without_a_renewal_is_a_lost_lease(
        self, mode: str, autojump_clock: Any, caplog: Any
    ) -> None:
        gates = Gates()
        handle = gated_job(gates)
        async with jobs_on_memory([handle]) as (jobs, driver):
            beats = HeartbeatControl(driver)
            settles = SettleSpy(driver)
            enq = await handle.enqueue(Item("a"))
            async with running_worker(jobs, visibility_timeout="30s") as worker:
                await wait_for(lambda: gates.started)
                started = gates.start_times["a"]
                beats.mode = mode
                await wait_for(lambda: gates.aborts)
                lost_at = gates.abort_times["a"]
                assert gates.aborts == [("a", True, ErrorCode.X_JOB_LEASE_LOST)]
                assert worker.stats().leases_lost == 1
                beats.mode = "ok"
                gates.open("a")
                # the queue is free to hand the job out again: a lapse counts
                view = await wait_state(jobs, enq.id, "done")
        # measured from the last renewal that landed (the claim): one whole window
        assert lost_at - started == pytest.approx(30.0, abs=1e-6)
        lost = events_named(caplog, "jobs.lease.lost")
        assert len(lost) == 1
        assert lost[0].levelname == "ERROR"
        assert lost[0].code == ErrorCode.X_JOB_LEASE_LOST  # type: ignore[attr-defined]
        assert len(events_named(caplog, "jobs.heartbeat.failed")) >= 2
        # nothing was written on behalf of the lost claim
        first = [c for c in settles.calls if c[2].fence.claim == 1]
        assert first == []
        assert view.attempts == 2

    async def test_a_lease_lapsed_on_the_drivers_clock_is_lost(
        self, autojump_clock: Any, caplog: Any
    ) -> None:
        writes: list[Any] = []

        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=3))
        async def stuck(ctx: JobContext[Item]) -> None:
            if ctx.attempt > 1:
                return
            try:
                await trio.sleep_forever()
            except trio.Cancelled:
                writes.append(("reason", ctx.signal.reason.code if ctx.signal.reason else None))
                try:
                    await ctx.step.run("late", lambda: "never")
                except JobsError as exc:
                    writes.append(("step", exc.code))
                raise

        async with jobs_on_memory([stuck]) as (jobs, driver):
            settles = SettleSpy(driver)
            enq = await stuck.enqueue(Item("a"))
            async with running_worker(jobs, visibility_timeout="30s"):
                await wait_state(jobs, enq.id, "running")
                await trio.sleep(1)
                driver.clock.shift(45)  # the database's clock says the lease lapsed
                await wait_for(lambda: writes)
                view = await wait_state(jobs, enq.id, "done")
        assert writes == [
            ("reason", ErrorCode.X_JOB_LEASE_LOST),
            ("step", ErrorCode.X_ABORTED),
        ]
        assert len(events_named(caplog, "jobs.lease.lost")) == 1
        assert [c for c in settles.calls if c[2].fence.claim == 1] == []
        assert "late" not in [s.name for s in view.steps]
        assert view.attempts == 2


class TestLeaseLapseOnTheFinalAttempt:
    """A lease that lapses on a row's FINAL attempt is settled dead by the next claim."""

    async def _crash_holding(self, driver: Any) -> None:
        """A worker that claimed the row and died: nothing renews its lease."""
        result = await driver.claim(
            ClaimOptions(worker_id="dead-worker", queues={"default": 1}, visibility_timeout=5.0)
        )
        assert len(result.jobs) == 1

    @pytest.mark.parametrize("dead_letter", [True, False])
    async def test_settled_by_the_next_claim(
        self, dead_letter: bool, autojump_clock: Any, caplog: Any
    ) -> None:
        settled: list[Settled] = []
        ran: list[int] = []

        @job(
            input=Item,
            idempotency_key=lambda i: i.key,
            retry=Retry(attempts=1, dead_letter=dead_letter),
            on_settled=settled.append,
        )
        async def doomed(ctx: JobContext[Item]) -> None:
            ran.append(ctx.attempt)

        async with jobs_on_memory([doomed]) as (jobs, driver):
            enq = await doomed.enqueue(Item("a"))
            await self._crash_holding(driver)
            async with running_worker(jobs) as worker:
                view = await wait_state(jobs, enq.id, "dead" if dead_letter else "failed")
                await wait_for(lambda: settled)
            stats = worker.stats()
        assert ran == []  # never handed out again
        assert view.error_code == ErrorCode.X_JOB_LEASE_LOST
        assert view.last_error is not None
        assert "lapsed" in view.last_error
        exhausted = events_named(caplog, "jobs.claim.exhausted")
        assert [r.job_id for r in exhausted] == [enq.id]  # type: ignore[attr-defined]
        if dead_letter:
            assert [s.outcome for s in settled] == [Outcome.DEAD_LETTERED]
            assert (stats.dead_lettered, stats.failed) == (1, 0)
        else:
            assert [s.outcome for s in settled] == [Outcome.DROPPED]
            assert (stats.dead_lettered, stats.failed) == (0, 1)
        assert settled[0].input == Item("a")
        assert settled[0].code == ErrorCode.X_JOB_LEASE_LOST

    async def test_a_lapse_before_the_final_attempt_is_re_offered_and_counted(
        self, autojump_clock: Any
    ) -> None:
        ran: list[int] = []

        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=2))
        async def survivor(ctx: JobContext[Item]) -> None:
            ran.append(ctx.attempt)

        async with jobs_on_memory([survivor]) as (jobs, driver):
            enq = await survivor.enqueue(Item("a"))
            await self._crash_holding(driver)
            async with running_worker(jobs):
                view = await wait_state(jobs, enq.id, "done")
        assert ran == [2]
        assert view.attempts == 2


# =========================================================================== the deadline


class TestTimeout:
    """A job's timeout aborts ctx.signal BEFORE it fails the attempt."""

    async def test_the_signal_aborts_before_the_attempt_fails(
        self, autojump_clock: Any, caplog: Any
    ) -> None:
        seen: list[Any] = []

        @job(
            input=Item,
            idempotency_key=lambda i: i.key,
            timeout="5s",
            retry=Retry(attempts=2, base="1s"),
        )
        async def slow(ctx: JobContext[Item]) -> None:
            started = trio.current_time()
            try:
                await trio.sleep_forever()
            except trio.Cancelled:
                with trio.CancelScope(shield=True):
                    view = await ctx.jobs.show(ctx.job_id)
                reason = ctx.signal.reason
                seen.append(
                    (
                        ctx.signal.aborted,
                        reason.code if reason else None,
                        view.state,
                        view.attempts,
                        trio.current_time() - started,
                    )
                )
                raise

        async with jobs_on_memory([slow]) as (jobs, _driver):
            enq = await slow.enqueue(Item("a"))
            async with running_worker(jobs):
                await wait_for(lambda: seen)
                view = await wait_state(jobs, enq.id, "ready")
                assert (view.attempts, view.error_code) == (1, ErrorCode.X_JOB_TIMEOUT)
                view = await wait_state(jobs, enq.id, "dead")
        # aborted, with the row still running under this attempt: it has not failed yet
        assert seen[0] == (True, ErrorCode.X_JOB_TIMEOUT, "running", 1, pytest.approx(5.0))
        assert len(seen) == 2
        assert view.attempts == 2  # each timed-out attempt is counted
        assert view.error_code == ErrorCode.X_JOB_TIMEOUT
        # a body that stops because it was cancelled is the intended end: nothing logged
        assert not events_named(caplog, "jobs.timeout.abandoned")

    async def test_the_verdict_is_read_off_the_signal(self, autojump_clock: Any) -> None:
        @job(input=Item, idempotency_key=lambda i: i.key, timeout="2s", retry=Retry(attempts=1))
        async def rethrows(ctx: JobContext[Item]) -> None:
            try:
                await trio.sleep_forever()
            except trio.Cancelled:
                raise ValueError("my own error for the cut-short child") from None

        async with jobs_on_memory([rethrows]) as (jobs, _driver):
            enq = await rethrows.enqueue(Item("a"))
            async with running_worker(jobs):
                view = await wait_state(jobs, enq.id, "dead")
        assert view.error_code == ErrorCode.X_JOB_TIMEOUT

    async def test_a_body_within_its_timeout_is_untouched(self, autojump_clock: Any) -> None:
        @job(input=Item, idempotency_key=lambda i: i.key, timeout="5s")
        async def quick(ctx: JobContext[Item]) -> bool:
            await trio.sleep(4.9)
            return ctx.signal.aborted

        async with jobs_on_memory([quick]) as (jobs, _driver):
            enq = await quick.enqueue(Item("a"))
            async with running_worker(jobs):
                view = await wait_state(jobs, enq.id, "done")
        assert view.result is False

    async def test_step_timeout_is_a_ceiling_on_one_step(self, autojump_clock: Any) -> None:
        seen: list[Any] = []

        @job(
            input=Item,
            idempotency_key=lambda i: i.key,
            step_timeout="2s",
            retry=Retry(attempts=2, base="1s"),
        )
        async def stepped(ctx: JobContext[Item]) -> None:
            await ctx.step.run("fast", lambda: "ok")

            async def slow(signal: Any) -> str:
                if ctx.attempt == 2:
                    return "second time"
                try:
                    await trio.sleep(10)
                except trio.Cancelled:
                    seen.append(
                        ("step", signal.aborted, signal.reason.code if signal.reason else None)
                    )
                    raise
                return "unreachable"

            try:
                await ctx.step.run("slow", slow)
            except JobsError as exc:
                seen.append(("raised", exc.code, exc.meta.get("step"), ctx.signal.aborted))
                raise
            await trio.sleep(5)  # the whole job may run past the step's ceiling

        async with jobs_on_memory([stepped]) as (jobs, _driver):
            enq = await stepped.enqueue(Item("a"))
            async with running_worker(jobs):
                view = await wait_state(jobs, enq.id, "done")
        assert seen == [
            ("step", True, ErrorCode.X_JOB_TIMEOUT),
            ("raised", ErrorCode.X_JOB_TIMEOUT, "slow", False),
        ]
        steps = {s.name: s for s in view.steps}
        assert steps["fast"].executions == 1
        assert steps["slow"].executions == 2
        assert steps["slow"].output == "second time"
        assert view.attempts == 2

    async def test_a_body_ignoring_the_timeout_is_named_abandoned(
        self, autojump_clock: Any, caplog: Any
    ) -> None:
        ran: list[int] = []

        @job(input=Item, idempotency_key=lambda i: i.key, timeout="5s", retry=Retry(attempts=3))
        async def stubborn(ctx: JobContext[Item]) -> str:
            ran.append(ctx.attempt)
            if ctx.attempt == 1:
                with trio.CancelScope(shield=True):
                    await trio.sleep(200)  # ignores the signal
            return f"attempt {ctx.attempt}"

        async with jobs_on_memory([stubborn]) as (jobs, driver):
            settles = SettleSpy(driver)
            enq = await stubborn.enqueue(Item("a"))
            async with running_worker(jobs, visibility_timeout="30s", drain_timeout="30s") as w:
                view = await wait_state(jobs, enq.id, "done")
                await wait_for(lambda: events_named(caplog, "jobs.timeout.abandoned"))
                assert w.stats().abandoned == 1
        abandoned = events_named(caplog, "jobs.timeout.abandoned")
        assert abandoned[0].levelname == "WARNING"
        # nothing settled for the abandoned claim; its lapse counted an attempt
        assert [c for c in settles.calls if c[2].fence.claim == 1] == []
        assert ran == [1, 2]
        assert view.attempts == 2
        assert view.result == "attempt 2"


# =========================================================================== drain and stop


class TestDrain:
    """drain(): every held job hears X_DRAINING and goes back uncounted."""

    async def test_drain_aborts_every_held_job_and_hands_it_back(self, autojump_clock: Any) -> None:
        gates = Gates()
        handle = gated_job(gates)
        returned: list[str] = []
        async with jobs_on_memory([handle]) as (jobs, _driver):
            ids = [(await handle.enqueue(Item(f"k{n}"))).id for n in range(3)]
            worker = Worker(jobs)

            async def run_worker(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
                await worker.run(task_status=task_status)
                returned.append("run returned")

            async with trio.open_nursery() as nursery:
                await nursery.start(run_worker)
                await wait_for(lambda: len(gates.started) == 3)
                await worker.drain()
                returned.append("drain returned")
            views = [await jobs.show(i) for i in ids]
        assert returned == ["run returned", "drain returned"]
        assert sorted(gates.aborts) == [(f"k{n}", True, ErrorCode.X_DRAINING) for n in range(3)]
        assert [(v.state, v.attempts) for v in views] == [("ready", 0)] * 3
        assert worker.stats().drained == 3
        assert worker.stats().in_flight == 0

    async def test_an_app_error_raised_on_the_drain_is_still_an_interruption(
        self, autojump_clock: Any
    ) -> None:
        started = trio.Event()

        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=1))
        async def unwinds(ctx: JobContext[Item]) -> None:
            started.set()
            try:
                await trio.sleep_forever()
            except trio.Cancelled:
                raise RuntimeError("child killed by the shutdown") from None

        async with jobs_on_memory([unwinds]) as (jobs, _driver):
            enq = await unwinds.enqueue(Item("a"))
            async with running_worker(jobs) as worker:
                await started.wait()
                await worker.drain()
            view = await jobs.show(enq.id)
        assert (view.state, view.attempts, view.error_code) == ("ready", 0, None)

    async def test_a_worker_runs_once(self, autojump_clock: Any) -> None:
        async with jobs_on_memory([]) as (jobs, _driver):
            worker = Worker(jobs)
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                with pytest.raises(JobsError) as info:
                    await worker.run()
                await worker.drain()
        assert info.value.code == ErrorCode.X_CONFIG_INVALID

    async def test_drain_twice_and_before_run_are_no_ops(self, autojump_clock: Any) -> None:
        gates = Gates()
        handle = gated_job(gates)
        async with jobs_on_memory([handle]) as (jobs, _driver):
            enq = await handle.enqueue(Item("a"))
            worker = Worker(jobs)
            with trio.fail_after(1):
                await worker.drain()  # before run(): nothing to do
            gates.open("a")
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await wait_state(jobs, enq.id, "done")
                async with trio.open_nursery() as both:
                    both.start_soon(worker.drain)
                    both.start_soon(worker.drain)
                with trio.fail_after(1):
                    await worker.drain()

    async def test_cancelling_the_scope_around_run_hands_jobs_back(
        self, autojump_clock: Any
    ) -> None:
        gates = Gates()
        handle = gated_job(gates)
        async with jobs_on_memory([handle]) as (jobs, _driver):
            ids = [(await handle.enqueue(Item(f"k{n}"))).id for n in range(2)]
            worker = Worker(jobs)
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await wait_for(lambda: len(gates.started) == 2)
                nursery.cancel_scope.cancel()
            views = [await jobs.show(i) for i in ids]
        assert sorted(gates.aborts) == [
            ("k0", True, ErrorCode.X_DRAINING),
            ("k1", True, ErrorCode.X_DRAINING),
        ]
        assert [(v.state, v.attempts) for v in views] == [("ready", 0)] * 2

    async def test_stop_waits_for_held_work_without_aborting_it(self, autojump_clock: Any) -> None:
        gates = Gates()
        handle = gated_job(gates)
        async with jobs_on_memory([handle]) as (jobs, _driver):
            first = await handle.enqueue(Item("a"))
            worker = Worker(jobs)
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await wait_for(lambda: gates.started)
                nursery.start_soon(worker.stop)
                await trio.sleep(5)
                later = await handle.enqueue(Item("b"))  # not claimed: stop() stopped claiming
                await trio.sleep(5)
                assert gates.started == ["a"]
                gates.open("a")
            assert (await jobs.show(first.id)).state == "done"
            assert (await jobs.show(later.id)).state == "ready"
        assert gates.aborts == []

    async def test_a_drain_during_stop_aborts_what_stop_was_waiting_for(
        self, autojump_clock: Any
    ) -> None:
        """stop() aborts nothing — until a drain lands on it: the teardown already
        waiting adopts the drain and every held job hears the abort."""
        gates = Gates()
        handle = gated_job(gates)
        async with jobs_on_memory([handle]) as (jobs, _driver):
            enq = await handle.enqueue(Item("a"))
            worker = Worker(jobs)
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await wait_for(lambda: gates.started)
                nursery.start_soon(worker.stop)
                await trio.sleep(5)
                assert gates.aborts == []
                await worker.drain()
            view = await jobs.show(enq.id)
        assert gates.aborts == [("a", True, ErrorCode.X_DRAINING)]
        assert (view.state, view.attempts) == ("ready", 0)

    async def test_a_body_ignoring_the_drain_is_named_abandoned(
        self, autojump_clock: Any, caplog: Any
    ) -> None:
        started = trio.Event()

        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=3))
        async def stubborn(ctx: JobContext[Item]) -> None:
            started.set()
            if ctx.attempt == 1:
                with trio.CancelScope(shield=True):
                    await trio.sleep(100)

        async with jobs_on_memory([stubborn]) as (jobs, driver):
            settles = SettleSpy(driver)
            enq = await stubborn.enqueue(Item("a"))
            async with running_worker(jobs, drain_timeout="5s") as worker:
                await started.wait()
                drain_began = trio.current_time()
                await worker.drain()
            drained = events_named(caplog, "jobs.drain.abandoned")
            assert len(drained) == 1
            assert drained[0].levelname == "WARNING"
            assert worker.stats().abandoned == 1
            assert worker.stats().drained == 0
            assert trio.current_time() - drain_began >= 5.0
            # nothing settled for it: the lease lapses and the queue redelivers it, counted
            assert [c for c in settles.calls if c[1] == enq.id] == []
            async with running_worker(jobs):
                view = await wait_state(jobs, enq.id, "done")
        assert view.attempts == 2


# =========================================================================== progress


class TestProgress:
    """progress(done, total, note): one write a second per run at most, and always the
    last before the run settles."""

    async def test_at_most_one_write_a_second_and_the_last_always(
        self, autojump_clock: Any
    ) -> None:
        finished = trio.Event()

        @job(input=Item, idempotency_key=lambda i: i.key)
        async def busy(ctx: JobContext[Item]) -> None:
            for n in range(1, 41):
                ctx.progress(n, 40)
                await trio.sleep(0.1)
            ctx.progress(40, 40, "all done")
            finished.set()

        async with jobs_on_memory([busy]) as (jobs, _driver):
            enq = await busy.enqueue(Item("a"))
            changes: list[tuple[float, Any]] = []
            async with running_worker(jobs, heartbeat_interval="1500ms", visibility_timeout="30s"):
                while True:
                    view = await jobs.show(enq.id)
                    if not changes or view.progress != changes[-1][1]:
                        changes.append((trio.current_time(), view.progress))
                    if view.state == "done":
                        break
                    await trio.sleep(0.05)
        assert view.progress == Progress(40.0, 40.0, "all done")
        written = [(t, p) for t, p in changes if p is not None]
        assert len(written) >= 3
        # every write but the settle's own is at least a second after the one before
        times = [t for t, _p in written[:-1]]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert all(g >= 1.0 - 0.051 for g in gaps), gaps

    async def test_progress_is_visible_while_running(self, autojump_clock: Any) -> None:
        gate = trio.Event()

        @job(input=Item, idempotency_key=lambda i: i.key)
        async def reporting(ctx: JobContext[Item]) -> None:
            ctx.progress(3, 10, "three")
            await gate.wait()

        async with jobs_on_memory([reporting]) as (jobs, _driver):
            enq = await reporting.enqueue(Item("a"))
            async with running_worker(jobs):
                await wait_state(jobs, enq.id, "running")
                await trio.sleep(1.5)
                assert (await jobs.show(enq.id)).progress == Progress(3.0, 10.0, "three")
                gate.set()
                await wait_state(jobs, enq.id, "done")

    async def test_the_last_progress_lands_with_a_failure_too(self, autojump_clock: Any) -> None:
        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=1))
        async def failing(ctx: JobContext[Item]) -> None:
            ctx.progress(7, 9)
            raise RuntimeError("x")

        async with jobs_on_memory([failing]) as (jobs, _driver):
            enq = await failing.enqueue(Item("a"))
            async with running_worker(jobs):
                view = await wait_state(jobs, enq.id, "dead")
        assert view.progress == Progress(7.0, 9.0, None)

    @pytest.mark.parametrize("bad", [math.nan, math.inf, "3", True])
    async def test_progress_takes_finite_numbers(self, bad: Any, autojump_clock: Any) -> None:
        seen: list[str] = []

        @job(input=Item, idempotency_key=lambda i: i.key)
        async def reporting(ctx: JobContext[Item]) -> None:
            try:
                ctx.progress(bad, 10)
            except JobsError as exc:
                seen.append(exc.code)

        async with jobs_on_memory([reporting]) as (jobs, _driver):
            enq = await reporting.enqueue(Item("a"))
            async with running_worker(jobs):
                await wait_state(jobs, enq.id, "done")
        assert seen == [ErrorCode.X_INVARIANT]


# =========================================================================== on_settled


async def wait_settled(settled: list[Any], n: int = 1) -> None:
    await wait_for(lambda: len(settled) >= n, timeout=120, what="on_settled")


class TestOnSettled:
    async def test_completed_carries_input_and_result(self, autojump_clock: Any) -> None:
        settled: list[Settled] = []
        states: list[str] = []

        async def hook(s: Settled) -> None:
            states.append((await hook_jobs[0].show(s.job_id)).state)
            settled.append(s)

        hook_jobs: list[Any] = []

        @job(input=Item, idempotency_key=lambda i: i.key, on_settled=hook)
        async def works(ctx: JobContext[Item]) -> Any:
            return {"rows": 3, "at": (1, 2)}

        async with jobs_on_memory([works]) as (jobs, _driver):
            hook_jobs.append(jobs)
            enq = await works.enqueue(Item("a"))
            async with running_worker(jobs):
                await wait_settled(settled)
        assert settled == [
            Settled(Outcome.COMPLETED, enq.id, Item("a"), {"rows": 3, "at": [1, 2]}, None, None)
        ]
        assert states == ["done"]  # called after the row is settled

    async def test_dead_lettered(self, autojump_clock: Any) -> None:
        settled: list[Settled] = []

        @job(
            input=Item,
            idempotency_key=lambda i: i.key,
            retry=Retry(attempts=1),
            on_settled=settled.append,
        )
        async def fails(ctx: JobContext[Item]) -> None:
            raise JobsError("X_TEST_BROKEN", "broken")

        async with jobs_on_memory([fails]) as (jobs, _driver):
            enq = await fails.enqueue(Item("a"))
            async with running_worker(jobs):
                await wait_settled(settled)
            view = await jobs.show(enq.id)
        assert settled[0].outcome == Outcome.DEAD_LETTERED
        assert settled[0].code == "X_TEST_BROKEN"
        assert settled[0].error == view.last_error
        assert settled[0].input == Item("a")

    async def test_input_is_none_when_the_stored_payload_no_longer_parses(
        self, autojump_clock: Any
    ) -> None:
        settled: list[Settled] = []

        @job(input=Item, idempotency_key=lambda i: i.key, on_settled=settled.append)
        async def strict(ctx: JobContext[Item]) -> None:
            raise AssertionError("the body never runs")

        async with jobs_on_memory([strict]) as (jobs, driver):
            await driver.enqueue_many(
                [
                    EnqueueRequest(
                        id="00000000-0000-4000-8000-000000000001",
                        run_id="00000000-0000-4000-8000-000000000002",
                        name=strict.name,
                        queue="default",
                        payload={"renamed_field": 1},
                        idempotency_key="old",
                        max_attempts=3,
                    )
                ]
            )
            async with running_worker(jobs):
                await wait_settled(settled)
        assert settled[0].outcome == Outcome.DEAD_LETTERED
        assert settled[0].input is None
        assert settled[0].code == ErrorCode.X_JOB_INPUT_INVALID

    async def test_three_tries_then_logged_and_the_row_untouched(
        self, autojump_clock: Any, caplog: Any
    ) -> None:
        tries: list[float] = []

        async def broken_hook(s: Settled) -> None:
            tries.append(trio.current_time())
            raise ConnectionError("hook target down")

        @job(input=Item, idempotency_key=lambda i: i.key, on_settled=broken_hook)
        async def works(ctx: JobContext[Item]) -> str:
            return "ok"

        async with jobs_on_memory([works]) as (jobs, _driver):
            enq = await works.enqueue(Item("a"))
            async with running_worker(jobs) as worker:
                await wait_for(lambda: events_named(caplog, "jobs.on_settled.failed"))
                await trio.sleep(5)
                view = await jobs.show(enq.id)
                assert worker.stats().done == 1
        assert len(tries) == 3
        assert tries[-1] - tries[0] < 1e-6  # back to back
        (record,) = events_named(caplog, "jobs.on_settled.failed")
        assert record.levelname == "ERROR"
        assert record.code == ErrorCode.X_JOB_ON_SETTLED_FAILED  # type: ignore[attr-defined]
        assert (view.state, view.result, view.error_code, view.last_error) == (
            "done",
            "ok",
            None,
            None,
        )

    async def test_a_hook_that_recovers_is_not_reported(
        self, autojump_clock: Any, caplog: Any
    ) -> None:
        tries: list[int] = []

        def flaky_hook(s: Settled) -> None:  # sync hooks are fine too
            tries.append(1)
            if len(tries) < 3:
                raise ConnectionError("flaky")

        @job(input=Item, idempotency_key=lambda i: i.key, on_settled=flaky_hook)
        async def works(ctx: JobContext[Item]) -> None:
            return None

        async with jobs_on_memory([works]) as (jobs, _driver):
            await works.enqueue(Item("a"))
            async with running_worker(jobs):
                await wait_for(lambda: len(tries) == 3)
                await trio.sleep(1)
        assert len(tries) == 3
        assert not events_named(caplog, "jobs.on_settled.failed")

    async def test_on_settled_timeout_aborts_the_hook(
        self, autojump_clock: Any, caplog: Any
    ) -> None:
        seen: list[float] = []

        async def hangs(s: Settled) -> None:
            try:
                await trio.sleep_forever()
            except trio.Cancelled:
                seen.append(trio.current_time())
                raise

        @job(input=Item, idempotency_key=lambda i: i.key, on_settled=hangs, on_settled_timeout="2s")
        async def works(ctx: JobContext[Item]) -> None:
            return None

        async with jobs_on_memory([works]) as (jobs, _driver):
            enq = await works.enqueue(Item("a"))
            async with running_worker(jobs) as worker:
                view = await wait_state(jobs, enq.id, "done")
                done_at = trio.current_time()
                await wait_for(lambda: worker.stats().in_flight == 0)
                freed_at = trio.current_time()
        assert len(seen) == 1
        assert seen[0] - done_at == pytest.approx(2.0, abs=0.02)
        assert freed_at - done_at <= 2.05  # the worker gets its slot back
        assert len(events_named(caplog, "jobs.on_settled.failed")) == 1
        assert view.state == "done"

    async def test_a_slow_hook_is_not_a_lost_lease(self, autojump_clock: Any, caplog: Any) -> None:
        """The hook runs after the row is settled: the worker stops renewing that row
        and never reports its (released) lease as lost."""
        finished: list[float] = []

        async def slow_hook(s: Settled) -> None:
            await trio.sleep(25)  # inside on_settled_timeout, past a heartbeat or two
            finished.append(trio.current_time())

        @job(input=Item, idempotency_key=lambda i: i.key, on_settled=slow_hook)
        async def works(ctx: JobContext[Item]) -> None:
            return None

        async with jobs_on_memory([works]) as (jobs, _driver):
            await works.enqueue(Item("a"))
            async with running_worker(jobs, visibility_timeout="30s") as worker:
                await wait_for(lambda: finished)
                stats = worker.stats()
        assert stats.leases_lost == 0
        assert not events_named(caplog, "jobs.lease.lost")
        assert not events_named(caplog, "jobs.heartbeat.failed")

    async def test_three_tries_share_one_timeout(self, autojump_clock: Any, caplog: Any) -> None:
        tries: list[float] = []

        async def slow_and_broken(s: Settled) -> None:
            tries.append(trio.current_time())
            await trio.sleep(1)
            raise ConnectionError("down")

        @job(
            input=Item,
            idempotency_key=lambda i: i.key,
            on_settled=slow_and_broken,
            on_settled_timeout="2500ms",
        )
        async def works(ctx: JobContext[Item]) -> None:
            return None

        async with jobs_on_memory([works]) as (jobs, _driver):
            await works.enqueue(Item("a"))
            async with running_worker(jobs):
                await wait_for(lambda: events_named(caplog, "jobs.on_settled.failed"))
        assert len(tries) == 3
        assert tries[2] - tries[0] == pytest.approx(2.0)

    async def test_never_called_for_a_retry_or_a_sleep(self, autojump_clock: Any) -> None:
        settled: list[Settled] = []

        @job(
            input=Item,
            idempotency_key=lambda i: i.key,
            retry=Retry(attempts=2, base="1s"),
            on_settled=settled.append,
        )
        async def bumpy(ctx: JobContext[Item]) -> str:
            await ctx.step.sleep("1m")
            if ctx.attempt == 1:
                raise RuntimeError("once")
            return "ok"

        async with jobs_on_memory([bumpy]) as (jobs, _driver):
            await bumpy.enqueue(Item("a"))
            async with running_worker(jobs):
                await wait_for(lambda: settled)
                await trio.sleep(120)
        assert [s.outcome for s in settled] == [Outcome.COMPLETED]

    async def test_never_called_for_a_drain_or_a_cancel(self, autojump_clock: Any) -> None:
        settled: list[Settled] = []
        gates = Gates()
        handle = gated_job(gates, on_settled=settled.append)
        async with jobs_on_memory([handle]) as (jobs, _driver):
            drained = await handle.enqueue(Item("drained"))
            cancelled = await handle.enqueue(Item("cancelled"))
            async with running_worker(jobs) as worker:
                await wait_for(lambda: len(gates.started) == 2)
                await jobs.cancel(cancelled.id, reason="the operator said so")
                await wait_for(lambda: len(gates.aborts) == 1)
                await worker.drain()
            await trio.sleep(60)
            assert (await jobs.show(drained.id)).state == "ready"
            assert (await jobs.show(cancelled.id)).state == "cancelled"
        assert settled == []

    async def test_the_hook_runs_with_the_facade_installed(self, autojump_clock: Any) -> None:
        followups: list[str] = []

        @job(input=Item, idempotency_key=lambda i: i.key, name="followup")
        async def followup(ctx: JobContext[Item]) -> None:
            followups.append(ctx.input.key)

        async def hook(s: Settled) -> None:
            await followup.enqueue(Item(f"after-{s.input.key}"))

        @job(input=Item, idempotency_key=lambda i: i.key, on_settled=hook, name="first")
        async def first(ctx: JobContext[Item]) -> None:
            return None

        async with jobs_on_memory([first, followup]) as (jobs, _driver):
            await first.enqueue(Item("a"))
            async with running_worker(jobs):
                await wait_for(lambda: followups)
        assert followups == ["after-a"]


# =========================================================================== concurrency caps


def keyed(gates: Gates, when_busy: Any, settled: list[Settled] | None = None) -> Any:
    return gated_job(
        gates,
        name=f"keyed-{when_busy}",
        concurrency=Concurrency(limit=1, key=lambda i: i.group, when_busy=when_busy),
        on_settled=settled.append if settled is not None else None,
    )


class TestOneRunPerKey:
    async def test_when_busy_fail_refuses_without_running_the_body(
        self, autojump_clock: Any
    ) -> None:
        gates = Gates()
        settled: list[Settled] = []
        handle = keyed(gates, "fail", settled)
        async with jobs_on_memory([handle]) as (jobs, _driver):
            holder = await handle.enqueue(Item("holder", group="acct-1"))
            async with running_worker(jobs) as worker:
                await wait_for(lambda: gates.started == ["holder"])
                busy = await handle.enqueue(Item("busy", group="acct-1"))
                other = await handle.enqueue(Item("other", group="acct-2"))
                view = await wait_state(jobs, busy.id, "failed")
                await wait_for(
                    lambda: gates.started == ["holder", "other"] or len(gates.started) == 2
                )
                assert sorted(gates.started) == ["holder", "other"]
                stats = worker.stats()
                queue = {q.queue: q for q in await jobs.stats()}["default"]
                gates.open_all(["holder", "other"])
                await wait_state(jobs, holder.id, "done")
                await wait_state(jobs, other.id, "done")
                # `trio-jobs retry ID` re-queues it
                await jobs.requeue(busy.id)
                gates.open("busy")
                retried = await wait_state(jobs, busy.id, "done")
        assert view.error_code == ErrorCode.X_JOB_KEY_BUSY
        assert view.last_error is not None
        assert ErrorCode.X_JOB_KEY_BUSY in view.last_error
        assert "retry" in view.last_error  # carries its fix
        assert view.state == "failed"  # not a dead letter
        assert (stats.failed, stats.dead_lettered) == (1, 0)
        assert (queue.failed, queue.dead) == (1, 0)
        refused = [s for s in settled if s.outcome == Outcome.REFUSED]
        assert len(refused) == 1
        assert (refused[0].job_id, refused[0].code) == (busy.id, ErrorCode.X_JOB_KEY_BUSY)
        assert refused[0].input == Item("busy", group="acct-1")
        assert retried.attempts == 1

    async def test_when_busy_wait_stays_queued_without_burning_an_attempt(
        self, autojump_clock: Any
    ) -> None:
        gates = Gates()
        handle = keyed(gates, "wait")
        async with jobs_on_memory([handle]) as (jobs, _driver):
            holder = await handle.enqueue(Item("holder", group="acct-1"))
            async with running_worker(jobs) as worker:
                await wait_for(lambda: gates.started == ["holder"])
                waiting = await handle.enqueue(Item("waiting", group="acct-1"))
                samples = []
                for _ in range(40):
                    await trio.sleep(0.77)
                    view = await jobs.show(waiting.id)
                    samples.append((view.state, view.attempts))
                # queued between claims; a claim that meets the cap hands it straight back
                assert set(samples) <= {("ready", 0), ("running", 1)}
                assert ("ready", 0) in samples
                assert gates.started == ["holder"]
                gates.open_all(["holder", "waiting"])
                await wait_state(jobs, holder.id, "done")
                view = await wait_state(jobs, waiting.id, "done")
                stats = worker.stats()
        assert view.attempts == 1  # the deferrals burned none
        assert stats.retried == 0
        assert view.error_code is None

    async def test_a_waiting_run_starts_when_the_key_frees_and_is_not_claimed_meanwhile(
        self, autojump_clock: Any
    ) -> None:
        """A busy run waits on its key: a release makes it due at once, and while
        the holder runs it is not claimed again each poll (each claim a slot taken
        and handed back)."""
        gates = Gates()
        handle = keyed(gates, "wait")
        async with jobs_on_memory([handle]) as (jobs, driver):
            asked = count_acquires(driver)
            holder = await handle.enqueue(Item("holder", group="acct-1"))
            async with running_worker(jobs), running_worker(jobs):
                await wait_for(lambda: gates.started == ["holder"])
                waiting = await handle.enqueue(Item("waiting", group="acct-1"))
                await trio.sleep(300)  # the holder runs on for 300 s (10 visibility windows)
                tries = asked.count(waiting.id)
                gates.open("holder")
                released = trio.current_time()
                await wait_for(lambda: "waiting" in gates.start_times)
                gates.open("waiting")
                await wait_state(jobs, holder.id, "done")
                view = await wait_state(jobs, waiting.id, "done")
        # claimed once at its enqueue, then at most once per visibility timeout (the
        # bound for a wake that never comes), not every 1 s poll
        assert 1 <= tries <= 1 + 300 // 30
        assert gates.start_times["waiting"] - released < 0.1  # due at the release
        assert view.attempts == 1

    async def test_a_cap_holds_across_workers(self, autojump_clock: Any) -> None:
        """concurrency: N is max simultaneous runs of this job, fleet-wide."""
        running = [0]
        peak = [0]

        @job(input=Item, idempotency_key=lambda i: i.key, concurrency=2, name="fleet-capped")
        async def capped(ctx: JobContext[Item]) -> None:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            try:
                await trio.sleep(3)
            finally:
                running[0] -= 1

        async with jobs_on_memory([capped]) as (jobs, _driver):
            ids = [(await capped.enqueue(Item(f"k{n}"))).id for n in range(6)]
            async with running_worker(jobs, concurrency=4), running_worker(jobs, concurrency=4):
                for i in ids:
                    await wait_state(jobs, i, "done")
        assert peak == [2]

    async def test_a_plain_cap_always_waits(self, autojump_clock: Any) -> None:
        gates = Gates()
        handle = gated_job(gates, name="capped", concurrency=2)
        async with jobs_on_memory([handle]) as (jobs, _driver):
            ids = [(await handle.enqueue(Item(f"k{n}"))).id for n in range(4)]
            async with running_worker(jobs, concurrency=8):
                await wait_for(lambda: len(gates.started) == 2)
                await trio.sleep(20.13)
                assert len(gates.started) == 2
                views = [await jobs.show(i) for i in ids]
                running = [v for v in views if v.state == "running" and v.attempts == 1]
                assert len(running) >= 2
                assert all(v.attempts <= 1 for v in views)
                gates.open_all([f"k{n}" for n in range(4)])
                for i in ids:
                    await wait_state(jobs, i, "done")
        assert max(gates.peak.values()) == 2

    async def test_heartbeats_keep_a_long_holders_key_busy(self, autojump_clock: Any) -> None:
        """The lease rows are renewed with the job's heartbeat: a holder running far past
        the visibility window still holds its key."""
        gates = Gates()
        handle = keyed(gates, "fail")
        async with jobs_on_memory([handle]) as (jobs, _driver):
            await handle.enqueue(Item("holder", group="acct-1"))
            async with running_worker(jobs, visibility_timeout="30s"):
                await wait_for(lambda: gates.started == ["holder"])
                await trio.sleep(100)
                busy = await handle.enqueue(Item("busy", group="acct-1"))
                view = await wait_state(jobs, busy.id, "failed", "running", "done")
                gates.open_all(["holder", "busy"])
        assert view.state == "failed"
        assert view.error_code == ErrorCode.X_JOB_KEY_BUSY

    async def test_a_run_is_never_refused_by_its_own_leftover_lease(
        self, autojump_clock: Any
    ) -> None:
        gates = Gates()
        handle = keyed(gates, "fail")
        async with jobs_on_memory([handle]) as (jobs, driver):
            enq = await handle.enqueue(Item("a", group="acct-1"))
            # An earlier claim of this very run took the slot, then its worker died:
            # the claim lapses (30 s) while the slot's own lease (60 s) lingers.
            old = await driver.claim(ClaimOptions("old-worker", {handle.queue: 1}, 30.0))
            [claimed] = old.jobs
            grant = await driver.leases.acquire(
                handle.lease_key("acct-1"), 1, enq.id, claimed.fence, 60.0
            )
            assert grant.slot == 0
            await trio.sleep(31)
            gates.open("a")
            async with running_worker(jobs):
                view = await wait_state(jobs, enq.id, "done", "failed")
        assert view.state == "done"  # waited out its own leftover, never refused
        assert view.error_code is None
        assert view.attempts == 2  # the lapsed claim counts, as any lapse does

    async def test_a_key_that_throws_at_claim_takes_the_ordinary_retry_path(
        self, autojump_clock: Any
    ) -> None:
        broken = [False]
        ran: list[int] = []

        def key(i: Item) -> str:
            if broken[0]:
                raise RuntimeError("key lookup failed")
            return i.group

        @job(
            input=Item,
            idempotency_key=lambda i: i.key,
            concurrency=Concurrency(limit=1, key=key, when_busy="fail"),
            retry=Retry(attempts=3, base="10s"),
        )
        async def keyed_job(ctx: JobContext[Item]) -> None:
            ran.append(ctx.attempt)

        async with jobs_on_memory([keyed_job]) as (jobs, _driver):
            enq = await keyed_job.enqueue(Item("a"))
            broken[0] = True
            async with running_worker(jobs):
                view = await wait_for(
                    lambda: _view_if(jobs, enq.id, lambda v: v.attempts == 1 and v.state == "ready")
                )
                assert ran == []
                broken[0] = False
                view = await wait_state(jobs, enq.id, "done")
        assert ran == [2]
        assert view.attempts == 2

    async def test_concurrency_without_a_lease_store_is_refused_at_run(
        self, autojump_clock: Any
    ) -> None:
        gates = Gates()
        capped = gated_job(gates, name="capped", concurrency=2)
        keyed_cap = keyed(gates, "wait")
        plain = gated_job(gates, name="plain")
        driver = memory_driver()
        driver.leases = None
        async with jobs_on_memory([capped, keyed_cap, plain], driver) as (jobs, _driver):
            worker = Worker(jobs)
            async with trio.open_nursery() as nursery:
                with pytest.raises(JobsError) as info:
                    await nursery.start(worker.run)
        assert info.value.code == ErrorCode.X_JOB_CONCURRENCY_UNENFORCEABLE
        assert info.value.meta["jobs"] == ["capped", "keyed-wait"]
        assert "capped" in str(info.value)
        assert "keyed-wait" in str(info.value)
        assert "plain" not in info.value.meta["jobs"]


async def _view_if(jobs: Any, job_id: str, test: Any) -> Any:
    view = await jobs.show(job_id)
    return view if test(view) else None


# =========================================================================== tenancy and cancel


class TestTenantAtRun:
    async def test_a_row_queued_under_another_tenant_is_refused_before_the_body(
        self, autojump_clock: Any
    ) -> None:
        ran: list[str] = []

        @job(input=Item, idempotency_key=lambda i: i.key, tenant=lambda i: i.group)
        async def tenanted(ctx: JobContext[Item]) -> None:
            ran.append(ctx.input.key)

        async with jobs_on_memory([tenanted]) as (jobs, driver):
            await driver.enqueue_many(
                [
                    EnqueueRequest(
                        id="00000000-0000-4000-8000-00000000000a",
                        run_id="00000000-0000-4000-8000-00000000000b",
                        name=tenanted.name,
                        queue="default",
                        payload={"key": "a", "group": "org-a"},
                        idempotency_key="a",
                        max_attempts=3,
                        tenant_id="org-b",
                    )
                ]
            )
            async with running_worker(jobs):
                view = await wait_state(jobs, "00000000-0000-4000-8000-00000000000a", "dead")
        assert ran == []
        assert view.error_code == ErrorCode.X_JOB_TENANT_MISMATCH
        assert view.attempts == 1  # terminal
        assert view.last_error is not None
        assert "terminal" in view.last_error

    async def test_the_row_tenant_is_reported_on_the_context(self, autojump_clock: Any) -> None:
        tenants: list[Any] = []

        @job(input=Item, idempotency_key=lambda i: i.key, tenant=lambda i: i.group)
        async def tenanted(ctx: JobContext[Item]) -> None:
            tenants.append(ctx.tenant_id)

        async with jobs_on_memory([tenanted]) as (jobs, _driver):
            enq = await tenanted.enqueue(Item("a", group="org-a"))
            async with running_worker(jobs):
                await wait_state(jobs, enq.id, "done")
        assert tenants == ["org-a"]


class TestOperatorCancel:
    async def test_cancel_aborts_a_running_job_at_its_next_heartbeat(
        self, autojump_clock: Any
    ) -> None:
        gates = Gates()
        handle = gated_job(gates)
        async with jobs_on_memory([handle]) as (jobs, driver):
            settles = SettleSpy(driver)
            enq = await handle.enqueue(Item("a"))
            async with running_worker(jobs, visibility_timeout="30s") as worker:
                await wait_for(lambda: gates.started)
                cancelled_at = trio.current_time()
                view = await jobs.cancel(enq.id, reason="wrong account")
                assert view.state == "cancelled"
                await wait_for(lambda: gates.aborts)
                heard_at = gates.abort_times["a"]
                await wait_for(lambda: worker.stats().in_flight == 0)
            view = await jobs.show(enq.id)
        assert gates.aborts == [("a", True, ErrorCode.X_ABORTED)]
        assert heard_at - cancelled_at <= 10.0 + 1e-6  # within one heartbeat interval
        assert view.state == "cancelled"
        assert view.last_error is not None
        assert "wrong account" in view.last_error
        assert settles.calls == []  # nothing written over the cancel


class TestOperatorSurface:
    async def test_the_worker_reports_itself_while_it_runs(self, autojump_clock: Any) -> None:
        gates = Gates()
        handle = gated_job(gates)
        async with jobs_on_memory([handle]) as (jobs, _driver):
            enq = await handle.enqueue(Item("a"))
            async with running_worker(jobs, concurrency=3) as worker:
                await wait_for(lambda: gates.started)
                await trio.sleep(11)  # one heartbeat
                (info,) = await jobs.workers()
                assert info.id == worker.id
                assert list(info.queues) == ["default"]
                assert dict(info.slots) == {"default": 3}
                assert list(info.in_flight) == [enq.id]
                gates.open("a")
                await wait_state(jobs, enq.id, "done")
            assert await jobs.workers() == []

    async def test_uncounted_hand_backs_move_no_counter(self, autojump_clock: Any) -> None:
        entered = trio.Event()
        slow_calls: list[int] = []

        async def _slow_until_second_run() -> None:
            slow_calls.append(1)
            if len(slow_calls) == 1:
                await trio.sleep_forever()

        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=3, base="1s"))
        async def bumpy(ctx: JobContext[Item]) -> None:
            await ctx.step.sleep("1m")  # a suspension: uncounted
            if ctx.attempt == 1:
                raise RuntimeError("one counted retry")
            entered.set()
            await ctx.step.run("slow", _slow_until_second_run)

        async with jobs_on_memory([bumpy]) as (jobs, _driver):
            enq = await bumpy.enqueue(Item("a"))
            async with running_worker(jobs) as worker:
                await entered.wait()
                await worker.drain()  # a drained attempt: uncounted
            async with running_worker(jobs):
                view = await wait_state(jobs, enq.id, "done")
            rows = await jobs.counters(bumpy)
        assert view.attempts == 2
        assert sum(r.done for r in rows) == 1
        assert sum(r.retried for r in rows) == 1
        assert sum(r.dead + r.failed for r in rows) == 0
