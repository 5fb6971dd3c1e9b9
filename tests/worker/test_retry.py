"""Spec: "Concurrency, rate limits, queues, retry" (the retry rows), "Dead letter"
and "The final attempt".

Backoff is asserted twice: as pure functions with an injected jitter source, and
through a real worker by reading the row's ``run_at`` right after each hand-back.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from jobs_support import FixedJitter, Item, jobs_on_memory, running_worker, wait_for, wait_state
from trio_jobs import (
    ErrorCode,
    JobContext,
    JobsError,
    Outcome,
    Retry,
    Settled,
    job,
    register_error_retry,
)
from trio_jobs._retry import backoff_delay, retry_after_delay
from trio_jobs.drivers import NackOptions

TERMINAL_NOTE = "not retried: this code is classified terminal"


# --------------------------------------------------------------------------- pure functions


class TestBackoffShapes:
    """retry.backoff: 'exponential' | 'linear' | 'fixed'."""

    def test_exponential_doubles_from_base(self) -> None:
        retry = Retry(backoff="exponential", base=2.0, jitter=False)
        assert [backoff_delay(retry, n, FixedJitter(0.0)) for n in (1, 2, 3, 4, 5)] == [
            2.0,
            4.0,
            8.0,
            16.0,
            32.0,
        ]

    def test_linear_grows_by_base(self) -> None:
        retry = Retry(backoff="linear", base=3.0, jitter=False)
        assert [backoff_delay(retry, n, FixedJitter(0.0)) for n in (1, 2, 3, 4)] == [
            3.0,
            6.0,
            9.0,
            12.0,
        ]

    def test_fixed_stays_at_base(self) -> None:
        retry = Retry(backoff="fixed", base=5.0, jitter=False)
        assert [backoff_delay(retry, n, FixedJitter(0.0)) for n in (1, 2, 3, 10)] == [5.0] * 4

    def test_a_declared_retry_resolves_durations_before_backoff(self) -> None:
        @job(
            idempotency_key=lambda i: i.key,
            input=Item,
            retry=Retry(base="250ms", max_delay="1m", jitter=False),
        )
        async def declared(ctx: JobContext[Item]) -> None:
            return None

        assert declared.retry.base == 0.25
        assert declared.retry.max_delay == 60.0
        assert backoff_delay(declared.retry, 3, FixedJitter(0.0)) == 1.0


class TestMaxDelayClamp:
    """retry.max_delay clamps every backoff shape."""

    @pytest.mark.parametrize("backoff", ["exponential", "linear", "fixed"])
    def test_clamped_without_jitter(self, backoff: Any) -> None:
        retry = Retry(backoff=backoff, base=40.0, max_delay=50.0, jitter=False)
        assert all(backoff_delay(retry, n, FixedJitter(0.0)) <= 50.0 for n in range(1, 40))
        assert backoff_delay(retry, 30, FixedJitter(0.0)) == (40.0 if backoff == "fixed" else 50.0)

    def test_huge_attempt_numbers_do_not_overflow(self) -> None:
        retry = Retry(backoff="exponential", base=1.0, max_delay=3600.0, jitter=False)
        assert backoff_delay(retry, 10_000, FixedJitter(0.0)) == 3600.0

    def test_clamp_then_equal_jitter_keeps_the_fixed_half(self) -> None:
        retry = Retry(backoff="exponential", base=10.0, max_delay=15.0, jitter=True)
        # 10 * 2**3 = 80, clamped to 15: half (7.5) fixed, half drawn.
        assert backoff_delay(retry, 4, FixedJitter(0.0)) == 7.5
        assert backoff_delay(retry, 4, FixedJitter(0.5)) == 11.25


class TestEqualJitter:
    """retry.jitter is EQUAL jitter — half fixed, half rolled — and on by default."""

    def test_jitter_is_on_by_default(self) -> None:
        assert Retry().jitter is True

    def test_half_is_fixed_half_is_drawn(self) -> None:
        retry = Retry(backoff="fixed", base=8.0)
        assert backoff_delay(retry, 1, FixedJitter(0.0)) == 4.0
        assert backoff_delay(retry, 1, FixedJitter(0.5)) == 6.0
        assert backoff_delay(retry, 1, FixedJitter(0.999)) == pytest.approx(7.996)

    def test_one_draw_per_delay(self) -> None:
        jitter = FixedJitter(0.25)
        backoff_delay(Retry(base=1.0), 3, jitter)
        assert jitter.draws == 1
        backoff_delay(Retry(base=1.0, jitter=False), 3, jitter)
        assert jitter.draws == 1

    def test_a_seeded_source_gives_the_same_delays(self) -> None:
        retry = Retry(backoff="exponential", base=1.0)
        first = [backoff_delay(retry, n, random.Random(42)) for n in range(1, 8)]
        second = [backoff_delay(retry, n, random.Random(42)) for n in range(1, 8)]
        assert first == second
        draws = random.Random(7)
        expected_draws = random.Random(7)
        for n in range(1, 8):
            full = 2.0 ** (n - 1)
            assert backoff_delay(retry, n, draws) == full / 2 + expected_draws.random() * full / 2

    def test_never_near_zero_after_failures(self) -> None:
        """Never full jitter: a job that has failed twice gets at least half its wait."""
        retry = Retry(backoff="exponential", base=1.0)
        source = random.Random(1234)
        for _ in range(500):
            assert backoff_delay(retry, 3, source) >= 2.0

    @given(
        backoff=st.sampled_from(["exponential", "linear", "fixed"]),
        base=st.floats(min_value=0.001, max_value=1000.0),
        cap=st.floats(min_value=1.0, max_value=100_000.0),
        attempt=st.integers(min_value=1, max_value=200),
        draw=st.floats(min_value=0.0, max_value=0.999999),
    )
    def test_bounds(self, backoff: Any, base: float, cap: float, attempt: int, draw: float) -> None:
        cap = max(cap, base)
        retry = Retry(backoff=backoff, base=base, max_delay=cap, jitter=True)
        plain = Retry(backoff=backoff, base=base, max_delay=cap, jitter=False)
        full = backoff_delay(plain, attempt, FixedJitter(0.0))
        assert full <= cap
        got = backoff_delay(retry, attempt, FixedJitter(draw))
        assert full / 2 <= got <= full
        assert math.isfinite(got)


class TestRetryAfterDelay:
    def test_the_responders_seconds_replace_the_delay(self) -> None:
        assert retry_after_delay(Retry(max_delay=3600.0), 30) == 30.0

    def test_clamped_by_max_delay(self) -> None:
        assert retry_after_delay(Retry(max_delay=60.0), 7200) == 60.0

    def test_never_negative(self) -> None:
        assert retry_after_delay(Retry(max_delay=60.0), -5) == 0.0


# --------------------------------------------------------------------------- through the worker


class NackSpy:
    """Wraps ``driver.nack``: after each hand-back that landed, reads the row."""

    def __init__(self, jobs: Any, driver: Any) -> None:
        self.jobs = jobs
        self.driver = driver
        self.real = driver.nack
        self.delays: list[float] = []
        self.options: list[NackOptions] = []
        driver.nack = self

    async def __call__(self, job_id: str, options: NackOptions) -> bool:
        landed = await self.real(job_id, options)
        if landed:
            self.options.append(options)
            if options.state == "ready":
                view = await self.jobs.show(job_id)
                assert view.updated_at is not None
                self.delays.append(view.run_at - view.updated_at)
        return landed


def failing_job(
    retry: Retry,
    *,
    error: Any = lambda attempt: RuntimeError("boom"),
    on_settled: Any = None,
    log: list[Any] | None = None,
) -> Any:
    @job(
        input=Item,
        idempotency_key=lambda i: i.key,
        retry=retry,
        on_settled=on_settled,
        name=f"failing-{id(retry)}",
    )
    async def body(ctx: JobContext[Item]) -> None:
        if log is not None:
            log.append((ctx.attempt, ctx.final_attempt))
        raise error(ctx.attempt)

    return body


@pytest.mark.parametrize(
    ("backoff", "expected"),
    [
        # base 10s, jitter drawn at 0.5: three quarters of each full delay.
        ("exponential", [7.5, 15.0, 30.0]),
        ("linear", [7.5, 15.0, 22.5]),
        ("fixed", [7.5, 7.5, 7.5]),
    ],
)
async def test_backoff_sets_the_rows_run_at(
    backoff: Any, expected: list[float], autojump_clock: Any
) -> None:
    handle = failing_job(Retry(attempts=4, backoff=backoff, base="10s"))
    async with jobs_on_memory([handle]) as (jobs, driver):
        spy = NackSpy(jobs, driver)
        enq = await handle.enqueue(Item("a"))
        async with running_worker(jobs, jitter=FixedJitter(0.5)):
            view = await wait_state(jobs, enq.id, "dead")
        assert spy.delays == pytest.approx(expected)
        assert view.attempts == 4


async def test_max_delay_clamps_the_rows_run_at(autojump_clock: Any) -> None:
    handle = failing_job(Retry(attempts=4, backoff="exponential", base="10s", max_delay="25s"))
    async with jobs_on_memory([handle]) as (jobs, driver):
        spy = NackSpy(jobs, driver)
        enq = await handle.enqueue(Item("a"))
        async with running_worker(jobs, jitter=FixedJitter(0.0)):
            await wait_state(jobs, enq.id, "dead")
        # 10, 20, 40 -> 25; equal jitter at draw 0 keeps half of each.
        assert spy.delays == pytest.approx([5.0, 10.0, 12.5])


async def test_a_retry_is_picked_up_when_it_falls_due(autojump_clock: Any) -> None:
    """A retry the worker itself handed back starts when it falls due, not a poll later."""
    starts: list[float] = []

    @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=3, base="1500ms"))
    async def flaky(ctx: JobContext[Item]) -> None:
        starts.append(trio.current_time())
        if ctx.attempt < 3:
            raise RuntimeError("flaky")

    async with jobs_on_memory([flaky]) as (jobs, _driver):
        enq = await flaky.enqueue(Item("a"))
        async with running_worker(jobs, jitter=FixedJitter(0.0), idle_poll_max="10s"):
            await wait_state(jobs, enq.id, "done")
    # draw 0: waits of 0.75 s and 1.5 s.
    assert starts[1] - starts[0] == pytest.approx(0.75, abs=0.01)
    assert starts[2] - starts[1] == pytest.approx(1.5, abs=0.01)


class TestAttempts:
    """retry.attempts counts runs, the first included."""

    @pytest.mark.parametrize("attempts", [1, 2, 5])
    async def test_attempts_counts_runs(self, attempts: int, autojump_clock: Any) -> None:
        runs: list[Any] = []
        handle = failing_job(Retry(attempts=attempts, base="1s"), log=runs)
        async with jobs_on_memory([handle]) as (jobs, _driver):
            enq = await handle.enqueue(Item("a"))
            async with running_worker(jobs):
                view = await wait_state(jobs, enq.id, "dead")
        assert [a for a, _f in runs] == list(range(1, attempts + 1))
        assert view.attempts == attempts
        assert view.max_attempts == attempts

    async def test_a_success_after_failures_is_done(self, autojump_clock: Any) -> None:
        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=3, base="1s"))
        async def second_time_lucky(ctx: JobContext[Item]) -> str:
            if ctx.attempt == 1:
                raise RuntimeError("first")
            return "ok"

        async with jobs_on_memory([second_time_lucky]) as (jobs, _driver):
            enq = await second_time_lucky.enqueue(Item("a"))
            async with running_worker(jobs) as worker:
                view = await wait_state(jobs, enq.id, "done")
            assert view.attempts == 2
            assert view.result == "ok"
            stats = worker.stats()
            assert (stats.done, stats.retried, stats.dead_lettered) == (1, 1, 0)


class TestTerminalCodes:
    """A `terminal` thrown code stops on the attempt that failed."""

    async def test_terminal_code_stops_early_and_says_so(self, autojump_clock: Any) -> None:
        register_error_retry({"X_TEST_CARD_DECLINED": "terminal"})
        settled: list[Settled] = []
        runs: list[Any] = []
        handle = failing_job(
            Retry(attempts=5),
            error=lambda a: JobsError("X_TEST_CARD_DECLINED", "the card was declined"),
            on_settled=settled.append,
            log=runs,
        )
        async with jobs_on_memory([handle]) as (jobs, _driver):
            enq = await handle.enqueue(Item("a"))
            async with running_worker(jobs):
                view = await wait_state(jobs, enq.id, "dead")
        assert len(runs) == 1
        assert view.attempts == 1
        assert view.error_code == "X_TEST_CARD_DECLINED"
        assert view.last_error is not None
        assert TERMINAL_NOTE in view.last_error
        assert ErrorCode.X_JOB_MAX_ATTEMPTS not in view.last_error
        assert [s.outcome for s in settled] == [Outcome.DEAD_LETTERED]
        assert settled[0].code == "X_TEST_CARD_DECLINED"

    async def test_builtin_terminal_code_is_terminal_too(self, autojump_clock: Any) -> None:
        handle = failing_job(
            Retry(attempts=3),
            error=lambda a: JobsError(ErrorCode.X_JOB_EVENT_INVALID, "bad event"),
        )
        async with jobs_on_memory([handle]) as (jobs, _driver):
            enq = await handle.enqueue(Item("a"))
            async with running_worker(jobs):
                view = await wait_state(jobs, enq.id, "dead")
        assert view.attempts == 1
        assert view.last_error is not None
        assert TERMINAL_NOTE in view.last_error

    async def test_an_unclassified_code_takes_the_ordinary_path(self, autojump_clock: Any) -> None:
        handle = failing_job(
            Retry(attempts=3, base="4s"),
            error=lambda a: JobsError("X_TEST_UNCLASSIFIED", "who knows"),
        )
        async with jobs_on_memory([handle]) as (jobs, driver):
            spy = NackSpy(jobs, driver)
            enq = await handle.enqueue(Item("a"))
            async with running_worker(jobs, jitter=FixedJitter(0.5)):
                view = await wait_state(jobs, enq.id, "dead")
        assert view.attempts == 3
        assert spy.delays == pytest.approx([3.0, 6.0])
        assert view.error_code == "X_TEST_UNCLASSIFIED"
        assert view.last_error is not None
        assert TERMINAL_NOTE not in view.last_error


class TestRetryAfter:
    """A `retry-after` code: meta["retry_after_seconds"] replaces the delay, clamped by max_delay."""

    async def test_the_responders_seconds_replace_the_backoff(self, autojump_clock: Any) -> None:
        register_error_retry({"X_TEST_VENDOR_BUSY": "retry-after"})
        handle = failing_job(
            Retry(attempts=3, base="1s"),
            error=lambda a: JobsError(
                "X_TEST_VENDOR_BUSY", "wait", meta={"retry_after_seconds": 30}
            ),
        )
        async with jobs_on_memory([handle]) as (jobs, driver):
            spy = NackSpy(jobs, driver)
            enq = await handle.enqueue(Item("a"))
            async with running_worker(jobs, jitter=FixedJitter(0.5)):
                view = await wait_state(jobs, enq.id, "dead")
        assert spy.delays == pytest.approx([30.0, 30.0])
        # never the attempt count: it still spends attempts.
        assert view.attempts == 3
        assert view.error_code == "X_TEST_VENDOR_BUSY"

    async def test_clamped_by_max_delay(self, autojump_clock: Any) -> None:
        register_error_retry({"X_TEST_VENDOR_BUSY": "retry-after"})
        handle = failing_job(
            Retry(attempts=2, base="1s", max_delay="1m"),
            error=lambda a: JobsError(
                "X_TEST_VENDOR_BUSY", "wait", meta={"retry_after_seconds": 7200}
            ),
        )
        async with jobs_on_memory([handle]) as (jobs, driver):
            spy = NackSpy(jobs, driver)
            enq = await handle.enqueue(Item("a"))
            async with running_worker(jobs):
                await wait_state(jobs, enq.id, "dead")
        assert spy.delays == pytest.approx([60.0])

    @pytest.mark.parametrize("meta", [{}, {"retry_after_seconds": "soon"}])
    async def test_without_usable_seconds_it_backs_off_as_usual(
        self, meta: Any, autojump_clock: Any
    ) -> None:
        register_error_retry({"X_TEST_VENDOR_BUSY": "retry-after"})
        handle = failing_job(
            Retry(attempts=2, base="4s"),
            error=lambda a: JobsError("X_TEST_VENDOR_BUSY", "wait", meta=meta),
        )
        async with jobs_on_memory([handle]) as (jobs, driver):
            spy = NackSpy(jobs, driver)
            enq = await handle.enqueue(Item("a"))
            async with running_worker(jobs, jitter=FixedJitter(0.5)):
                view = await wait_state(jobs, enq.id, "dead", timeout=600)
        assert spy.delays == pytest.approx([3.0])
        assert view.attempts == 2


class TestExhaustion:
    """Attempts exhausted: the row moves to dead-letter; error_code is kept."""

    async def test_dead_with_the_original_code_and_max_attempts_in_last_error(
        self, autojump_clock: Any
    ) -> None:
        settled: list[Settled] = []
        handle = failing_job(
            Retry(attempts=2, base="1s"),
            error=lambda a: JobsError("X_TEST_FLAKY", f"failed on attempt {a}"),
            on_settled=settled.append,
        )
        async with jobs_on_memory([handle]) as (jobs, _driver):
            enq = await handle.enqueue(Item("a"))
            async with running_worker(jobs) as worker:
                view = await wait_state(jobs, enq.id, "dead")
                await wait_for_settled(settled)
            assert worker.stats().dead_lettered == 1
        assert view.error_code == "X_TEST_FLAKY"
        assert view.last_error is not None
        assert "failed on attempt 2" in view.last_error
        assert ErrorCode.X_JOB_MAX_ATTEMPTS in view.last_error
        assert [s.outcome for s in settled] == [Outcome.DEAD_LETTERED]
        assert settled[0].code == "X_TEST_FLAKY"
        assert settled[0].error is not None
        assert ErrorCode.X_JOB_MAX_ATTEMPTS in settled[0].error
        assert settled[0].input == Item("a")
        assert settled[0].result is None

    async def test_a_plain_exception_has_no_error_code(self, autojump_clock: Any) -> None:
        handle = failing_job(Retry(attempts=1), error=lambda a: ValueError("nope"))
        async with jobs_on_memory([handle]) as (jobs, _driver):
            enq = await handle.enqueue(Item("a"))
            async with running_worker(jobs):
                view = await wait_state(jobs, enq.id, "dead")
        assert view.error_code is None
        assert view.last_error is not None
        assert view.last_error.startswith("ValueError: nope")
        assert ErrorCode.X_JOB_MAX_ATTEMPTS in view.last_error

    async def test_dead_letter_false_buries_failed_and_reports_dropped(
        self, autojump_clock: Any
    ) -> None:
        settled: list[Settled] = []
        handle = failing_job(
            Retry(attempts=2, base="1s", dead_letter=False),
            error=lambda a: JobsError("X_TEST_FLAKY", "nope"),
            on_settled=settled.append,
        )
        async with jobs_on_memory([handle]) as (jobs, _driver):
            enq = await handle.enqueue(Item("a"))
            async with running_worker(jobs) as worker:
                view = await wait_state(jobs, enq.id, "failed")
                await wait_for_settled(settled)
            stats = worker.stats()
            queue = {s.queue: s for s in await jobs.stats()}["default"]
        assert view.attempts == 2
        assert view.error_code == "X_TEST_FLAKY"
        assert [s.outcome for s in settled] == [Outcome.DROPPED]
        assert (stats.failed, stats.dead_lettered) == (1, 0)
        assert (queue.failed, queue.dead) == (1, 0)


async def wait_for_settled(settled: list[Settled], n: int = 1) -> None:
    await wait_for(lambda: len(settled) >= n, timeout=60, what="on_settled")


class TestFinalAttempt:
    """final_attempt is true when a failure of this attempt will not be retried for want
    of attempts — the same comparison the runner dead-letters on."""

    async def test_true_exactly_on_the_last_attempt(self, autojump_clock: Any) -> None:
        runs: list[Any] = []
        handle = failing_job(Retry(attempts=3, base="1s"), log=runs)
        async with jobs_on_memory([handle]) as (jobs, _driver):
            enq = await handle.enqueue(Item("a"))
            async with running_worker(jobs):
                await wait_state(jobs, enq.id, "dead")
        assert runs == [(1, False), (2, False), (3, True)]

    async def test_a_compensating_job_compares_against_retry_attempts(
        self, autojump_clock: Any
    ) -> None:
        """The row carries the unwind margin; final_attempt still means retry.attempts."""
        runs: list[Any] = []

        @job(
            input=Item,
            idempotency_key=lambda i: i.key,
            compensates=True,
            retry=Retry(attempts=2, base="1s"),
        )
        async def comp(ctx: JobContext[Item]) -> None:
            runs.append((ctx.attempt, ctx.final_attempt))
            raise RuntimeError("boom")

        async with jobs_on_memory([comp]) as (jobs, _driver):
            enq = await comp.enqueue(Item("a"))
            async with running_worker(jobs):
                view = await wait_state(jobs, enq.id, "dead")
        assert runs == [(1, False), (2, True)]
        assert view.max_attempts == 4
        assert view.attempts == 2

    async def test_attempts_one_is_final_at_once(self, autojump_clock: Any) -> None:
        runs: list[Any] = []
        handle = failing_job(Retry(attempts=1), log=runs)
        async with jobs_on_memory([handle]) as (jobs, _driver):
            enq = await handle.enqueue(Item("a"))
            async with running_worker(jobs):
                await wait_state(jobs, enq.id, "dead")
        assert runs == [(1, True)]

    async def test_not_at_most_once_more_a_terminal_code_stops_earlier(
        self, autojump_clock: Any
    ) -> None:
        register_error_retry({"X_TEST_FATAL": "terminal"})
        runs: list[Any] = []
        handle = failing_job(
            Retry(attempts=3), error=lambda a: JobsError("X_TEST_FATAL", "fatal"), log=runs
        )
        async with jobs_on_memory([handle]) as (jobs, _driver):
            enq = await handle.enqueue(Item("a"))
            async with running_worker(jobs):
                await wait_state(jobs, enq.id, "dead")
        assert runs == [(1, False)]

    async def test_represented_under_the_same_number_after_a_sleep(
        self, autojump_clock: Any
    ) -> None:
        seen: list[Any] = []

        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=2, base="1s"))
        async def sleeper(ctx: JobContext[Item]) -> None:
            seen.append(("before", ctx.attempt, ctx.final_attempt))
            await ctx.step.sleep("1m")
            seen.append(("after", ctx.attempt, ctx.final_attempt))
            if ctx.attempt == 1:
                raise RuntimeError("fail after the sleep")

        async with jobs_on_memory([sleeper]) as (jobs, _driver):
            enq = await sleeper.enqueue(Item("a"))
            async with running_worker(jobs):
                view = await wait_state(jobs, enq.id, "done")
        assert seen == [
            ("before", 1, False),  # hands back at the sleep, uncounted
            ("before", 1, False),  # presented again under the same number
            ("after", 1, False),
            ("before", 2, True),  # the retry
            ("after", 2, True),
        ]
        assert view.attempts == 2

    async def test_represented_under_the_same_number_after_a_drain(
        self, autojump_clock: Any
    ) -> None:
        seen: list[Any] = []
        gate = trio.Event()

        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=1))
        async def drained(ctx: JobContext[Item]) -> None:
            seen.append((ctx.attempt, ctx.final_attempt))
            gate.set()
            if len(seen) == 1:
                await trio.sleep_forever()

        async with jobs_on_memory([drained]) as (jobs, _driver):
            enq = await drained.enqueue(Item("a"))
            async with running_worker(jobs) as worker:
                await gate.wait()
                await worker.drain()
            view = await jobs.show(enq.id)
            assert (view.state, view.attempts) == ("ready", 0)
            async with running_worker(jobs):
                view = await wait_state(jobs, enq.id, "done")
        assert seen == [(1, True), (1, True)]
        assert view.attempts == 1
