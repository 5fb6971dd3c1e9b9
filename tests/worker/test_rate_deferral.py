"""Spec: "Concurrency, rate limits, queues, retry", the fleet budget row, and "The
final attempt": ``X_RATE_LIMITED`` raised by a body defers the run to its
retry-after with the attempt **uncounted**. It is never dead-lettered for
waiting, ``JobView.attempts`` does not move, ``final_attempt`` does not change,
and the deferred run is presented again under the same attempt number.
"""

from __future__ import annotations

from typing import Any

import pytest

from jobs_support import FixedJitter, Item, jobs_on_memory, running_worker, wait_state
from trio_jobs import ErrorCode, JobContext, JobsError, Retry, job, register_error_retry
from trio_jobs._retry import decide
from trio_jobs.drivers import Fence

LIMITED = JobsError(
    ErrorCode.X_RATE_LIMITED, "the vendor's budget is spent", meta={"retry_after_seconds": 7}
)


def _limited_then_done(times: int, attempts: int) -> tuple[Any, list[tuple[int, bool]]]:
    seen: list[tuple[int, bool]] = []

    @job(
        input=Item,
        idempotency_key=lambda i: i.key,
        name="rate.send",
        retry=Retry(attempts=attempts, base="1s", jitter=False),
    )
    async def send(ctx: JobContext[Item]) -> str:
        seen.append((ctx.attempt, ctx.final_attempt))
        if len(seen) <= times:
            raise LIMITED
        return "sent"

    return send, seen


async def test_a_job_rate_limited_twice_with_two_attempts_is_not_dead(autojump_clock: Any) -> None:
    """The issue's reproduction: attempts=2, rate limited twice, used to end dead."""
    send, seen = _limited_then_done(times=2, attempts=2)
    async with jobs_on_memory([send]) as (jobs, _driver):
        enqueued = await send.enqueue(Item("a"))
        async with running_worker(jobs) as worker:
            view = await wait_state(jobs, enqueued.id, "done", "dead", "failed")
    assert view.state == "done"
    assert view.result == "sent"
    assert view.attempts == 1
    # presented again under the same attempt number, final_attempt unchanged
    assert seen == [(1, False), (1, False), (1, False)]
    stats = worker.stats()
    assert (stats.retried, stats.dead_lettered) == (0, 0)


async def test_a_single_attempt_job_keeps_waiting_on_its_final_attempt(
    autojump_clock: Any,
) -> None:
    send, seen = _limited_then_done(times=5, attempts=1)
    async with jobs_on_memory([send]) as (jobs, _driver):
        enqueued = await send.enqueue(Item("a"))
        async with running_worker(jobs):
            view = await wait_state(jobs, enqueued.id, "done", "dead", "failed")
    assert view.state == "done"
    assert view.attempts == 1
    assert seen == [(1, True)] * 6


async def test_the_run_waits_its_retry_after_uncounted_and_says_why(autojump_clock: Any) -> None:
    send, _seen = _limited_then_done(times=1, attempts=3)
    async with jobs_on_memory([send]) as (jobs, driver):
        enqueued = await send.enqueue(Item("a"))
        before = driver.now()
        async with running_worker(jobs):
            view = await wait_state(jobs, enqueued.id, "ready", "delayed")
            deferred_at = driver.now()
            assert view.attempts == 0  # the claim's attempt given back
            assert view.error_code == ErrorCode.X_RATE_LIMITED
            assert view.last_error is not None
            assert "uncounted" in view.last_error
            # due at its retry-after (7 s), not the backoff (1 s)
            assert before + 7.0 <= view.run_at <= deferred_at + 7.0
            done = await wait_state(jobs, enqueued.id, "done")
        log = await driver.attempt_log(enqueued.id)
    assert done.attempts == 1
    assert [(e.attempt, e.outcome) for e in log] == [(1, "handed-back"), (1, "done")]


async def test_a_counted_failure_after_a_deferral_counts_once(autojump_clock: Any) -> None:
    """Uncounted deferrals never move the count an ordinary failure spends."""
    seen: list[int] = []

    @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=2, jitter=False))
    async def flaky(ctx: JobContext[Item]) -> None:
        seen.append(ctx.attempt)
        if len(seen) in (1, 2, 4):
            raise LIMITED
        raise RuntimeError("boom")

    async with jobs_on_memory([flaky]) as (jobs, _driver):
        enqueued = await flaky.enqueue(Item("a"))
        async with running_worker(jobs):
            view = await wait_state(jobs, enqueued.id, "dead")
    # 1 limited, 1 limited, 1 fails (counted), 2 limited, 2 fails: dead after 2 counted
    assert seen == [1, 1, 1, 2, 2]
    assert view.attempts == 2
    assert view.error_code is None  # the RuntimeError's: exhaustion never replaces it


# --------------------------------------------------------------------------- the pure decision


def _decide(error: BaseException, *, attempt: int, attempts: int) -> Any:
    return decide(
        error,
        attempt=attempt,
        attempts=attempts,
        retry=Retry(attempts=attempts, base=1.0, max_delay=60.0, jitter=False),
        fence=Fence("w", 1),
        progress=None,
        jitter=FixedJitter(0.0),
    )


@pytest.mark.parametrize(("attempt", "attempts"), [(1, 1), (1, 3), (3, 3), (5, 3)])
def test_the_decision_defers_uncounted_on_any_attempt(attempt: int, attempts: int) -> None:
    decision = _decide(LIMITED, attempt=attempt, attempts=attempts)
    assert not decision.final
    assert decision.retry.counted is False
    assert decision.retry.state == "ready"
    assert decision.retry.delay == 7.0
    assert decision.retry.error_code == ErrorCode.X_RATE_LIMITED


def test_the_deferral_is_clamped_by_max_delay_and_falls_back_to_the_backoff() -> None:
    late = JobsError(ErrorCode.X_RATE_LIMITED, meta={"retry_after_seconds": 3600})
    assert _decide(late, attempt=1, attempts=3).retry.delay == 60.0
    bare = JobsError(ErrorCode.X_RATE_LIMITED, "no seconds given")
    decision = _decide(bare, attempt=2, attempts=2)
    assert decision.retry.counted is False
    assert decision.retry.delay == 2.0  # exponential backoff of attempt 2, base 1 s


def test_an_app_classification_cannot_make_a_rate_limit_dead_letter() -> None:
    register_error_retry({"X_RATE_LIMITED": "terminal"})
    decision = _decide(LIMITED, attempt=1, attempts=1)
    assert decision.retry is not None
    assert decision.retry.counted is False


def test_an_app_retry_after_code_still_counts() -> None:
    register_error_retry({"X_TEST_VENDOR_BUSY": "retry-after"})
    busy = JobsError("X_TEST_VENDOR_BUSY", meta={"retry_after_seconds": 7})
    assert _decide(busy, attempt=1, attempts=2).retry.counted is True
    assert _decide(busy, attempt=2, attempts=2).final
