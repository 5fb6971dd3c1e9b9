"""The retry decision is a pure function: the one settle a failed attempt writes.

``_retry.decide`` (the body's own failure), ``decide_unwind`` (a compensator's)
and ``burial`` answer data; the worker only writes what they say.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from trio_jobs import Retry, register_error_retry
from trio_jobs._retry import burial, decide, decide_unwind
from trio_jobs.drivers import Fence
from trio_jobs.errors import ErrorCode, JobsError, _reset_error_retry_for_tests

FENCE = Fence(worker_id="w", claim=7)


class Half:
    def random(self) -> float:
        return 0.5


@pytest.fixture(autouse=True)
def _classes() -> Iterator[None]:
    _reset_error_retry_for_tests()
    register_error_retry({"X_CARD_DECLINED": "terminal", "X_VENDOR_BUSY": "retry-after"})
    yield
    _reset_error_retry_for_tests()


def _decide(error: BaseException, attempt: int = 1, attempts: int = 3, **kw: object) -> object:
    return decide(
        error,
        attempt=attempt,
        attempts=attempts,
        retry=kw.get("retry", Retry(attempts=attempts, base=2.0, max_delay=60.0)),  # type: ignore[arg-type]
        fence=FENCE,
        progress=None,
        jitter=Half(),
    )


def test_an_unclassified_failure_with_attempts_left_is_retried_after_the_backoff() -> None:
    d = _decide(ValueError("boom"), attempt=2)
    assert not d.final  # type: ignore[attr-defined]
    nack = d.retry  # type: ignore[attr-defined]
    assert (nack.state, nack.counted, nack.fence) == ("ready", True, FENCE)
    # exponential 2 s * 2**(2-1) = 4 s, equal jitter at 0.5: 2 + 0.5 * 2 = 3 s
    assert nack.delay == pytest.approx(3.0)
    assert (nack.error_code, nack.last_error) == (None, "ValueError: boom")


def test_the_last_attempt_is_final_and_says_so() -> None:
    d = _decide(JobsError("X_FLAKY", "no"), attempt=3, attempts=3)
    assert d.final  # type: ignore[attr-defined]
    assert d.code == "X_FLAKY"  # type: ignore[attr-defined]
    assert d.message.endswith("X_JOB_MAX_ATTEMPTS: gave up after 3 of 3 attempts")  # type: ignore[attr-defined]


def test_a_terminal_code_is_final_on_its_first_attempt() -> None:
    d = _decide(JobsError("X_CARD_DECLINED", "declined"), attempt=1, attempts=5)
    assert d.final  # type: ignore[attr-defined]
    assert "not retried: this code is classified terminal" in d.message  # type: ignore[attr-defined]


def test_a_retry_after_code_waits_its_own_seconds_clamped() -> None:
    busy = JobsError("X_VENDOR_BUSY", "later", meta={"retry_after_seconds": 600})
    assert _decide(busy).retry.delay == 60.0  # type: ignore[attr-defined]
    soon = JobsError("X_VENDOR_BUSY", "later", meta={"retry_after_seconds": 5})
    assert _decide(soon).retry.delay == 5.0  # type: ignore[attr-defined]
    # without usable seconds: the ordinary backoff (2 s at attempt 1, jittered to 1.5 s)
    vague = JobsError("X_VENDOR_BUSY", "later", meta={"retry_after_seconds": True})
    assert _decide(vague).retry.delay == pytest.approx(1.5)  # type: ignore[attr-defined]


def test_a_job_this_worker_does_not_know_takes_the_default_backoff() -> None:
    d = _decide(RuntimeError("?"), attempt=1, attempts=3, retry=None)
    assert d.retry.delay == pytest.approx(Retry().base * 0.75)  # type: ignore[attr-defined]


def test_a_failed_compensation_retries_the_unwind_then_is_compensation_failed() -> None:
    args = {
        "step": "charge",
        "code": "X_FLAKY",
        "message": "X_FLAKY: no",
        "max_attempts": 3,
        "retry": Retry(attempts=3, base=1.0),
        "fence": FENCE,
        "jitter": Half(),
    }
    again = decide_unwind(ValueError("refund down"), attempt=2, **args)  # type: ignore[arg-type]
    assert again.retry is not None
    assert again.code == "X_FLAKY"
    assert again.retry.last_error == (
        "X_FLAKY: no; compensation of step 'charge' failed (ValueError: refund down), "
        "retrying the unwind"
    )
    done = decide_unwind(ValueError("refund down"), attempt=3, **args)  # type: ignore[arg-type]
    assert done.final
    assert done.code == ErrorCode.X_JOB_COMPENSATION_FAILED
    assert done.message.endswith("Original failure: X_FLAKY: no")


def test_a_burial_is_dead_unless_the_job_drops_its_dead() -> None:
    dead = burial(FENCE, drop=False, code="X_A", message="m", progress=None)
    failed = burial(FENCE, drop=True, code="X_A", message="m", progress=None)
    assert (dead.state, failed.state) == ("dead", "failed")
    assert dead.counted
    assert failed.counted
