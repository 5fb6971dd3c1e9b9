"""The retry decision, as pure functions: backoff and jitter, and what a failed
attempt comes to.

:func:`decide` and :func:`decide_unwind` answer a :class:`Decision`: the one
settle to write when the run goes back to the queue (a counted ``nack`` after
its backoff, or, for a rate limit, an uncounted one: :func:`deferral`), or a
final failure, which the worker buries with
:func:`burial` (after the run's compensators, when it registered any). No I/O,
no clock: the worker writes what they answer, and a test can read it off.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from ._context import _describe, unwrap
from ._declare import Retry
from ._time import JitterSource
from .drivers._protocol import Fence, NackOptions, Progress
from .errors import ErrorCode, JobsError, retry_class_of

__all__ = [
    "Decision",
    "backoff_delay",
    "burial",
    "decide",
    "decide_unwind",
    "deferral",
    "retry_after_delay",
]


def backoff_delay(retry: Retry, attempt: int, jitter: JitterSource) -> float:
    """The wait before the attempt after ``attempt`` (1-based) failed.

    exponential: ``base * 2**(attempt-1)``; linear: ``base * attempt``; fixed:
    ``base`` — clamped by ``max_delay``, then equal jitter (half fixed, half drawn)
    when ``retry.jitter``: a job that already failed twice never draws a
    near-zero wait.
    """
    n = max(1, attempt)
    base = float(retry.base)
    if retry.backoff == "exponential":
        delay = base * (2.0 ** min(n - 1, 60))
    elif retry.backoff == "linear":
        delay = base * n
    else:
        delay = base
    delay = min(delay, float(retry.max_delay))
    if retry.jitter:
        half = delay / 2.0
        delay = half + jitter.random() * half
    return delay


def retry_after_delay(retry: Retry, seconds: float) -> float:
    """A ``retry-after`` code's own wait, clamped to ``[0, max_delay]``."""
    return max(0.0, min(float(seconds), float(retry.max_delay)))


@attrs.frozen
class Decision:
    """What a failed attempt comes to: the code and message it records, and
    ``retry``, the hand-back to write (counted, or uncounted for a deferral), or ``None`` when the failure is
    final (the run is buried with ``code`` and ``message``: :func:`burial`)."""

    code: str | None
    message: str
    retry: NackOptions | None

    @property
    def final(self) -> bool:
        return self.retry is None


def decide(
    error: BaseException,
    *,
    attempt: int,
    attempts: int,
    retry: Retry | None,
    fence: Fence,
    progress: Progress | None,
    jitter: JitterSource,
) -> Decision:
    """The body's own failure on attempt ``attempt`` of ``attempts``.

    ``X_RATE_LIMITED`` is no failure: the run waits for the budget, deferred
    **uncounted** (:func:`deferral`), whatever the attempt and however the code
    is classified, so it is never dead-lettered for waiting. A ``terminal`` code is final at once; otherwise the run is retried while
    attempts are left, after a ``retry-after`` code's own wait (its
    ``meta["retry_after_seconds"]``, clamped) or the policy's backoff. ``retry``
    is the job's policy (``None`` for a job this worker does not know: the
    default backoff)."""
    error = unwrap(error)
    code = error.code if isinstance(error, JobsError) else None
    if isinstance(error, JobsError) and code == ErrorCode.X_RATE_LIMITED:
        return deferral(
            error, attempt=attempt, retry=retry, fence=fence, progress=progress, jitter=jitter
        )
    klass = retry_class_of(code)
    terminal = klass == "terminal"
    message = _describe(error)
    if terminal:
        return Decision(code, message + " — not retried: this code is classified terminal", None)
    if attempt >= attempts:
        return Decision(
            code,
            f"{message} — {ErrorCode.X_JOB_MAX_ATTEMPTS}: gave up after {attempt} of "
            f"{attempts} attempts",
            None,
        )
    policy = retry if retry is not None else Retry()
    seconds = _retry_after_seconds(error)
    if klass == "retry-after" and retry is not None and seconds is not None:
        delay = retry_after_delay(retry, seconds)
    else:
        # An unclassified code, or a retry-after code without usable seconds (or
        # a job this worker does not know): the ordinary backoff.
        delay = backoff_delay(policy, attempt, jitter)
    return Decision(code, message, _again(fence, delay, code, message, progress))


def deferral(
    error: JobsError,
    *,
    attempt: int,
    retry: Retry | None,
    fence: Fence,
    progress: Progress | None,
    jitter: JitterSource,
) -> Decision:
    """A body refused by a rate limit (``X_RATE_LIMITED``): the run goes back
    ``ready``, due after the error's ``meta["retry_after_seconds"]`` (clamped by
    ``max_delay``; without usable seconds, the policy's backoff), with the
    attempt **uncounted**: the attempt number, ``final_attempt`` and the road to
    the dead letter stay where they were."""
    policy = retry if retry is not None else Retry()
    seconds = _retry_after_seconds(error)
    if seconds is not None:
        delay = retry_after_delay(policy, seconds)
    else:
        delay = backoff_delay(policy, attempt, jitter)
    message = (
        f"{_describe(error)} — deferred {delay:.3f}s with the attempt uncounted: "
        "a rate limit is waited for, never failed"
    )
    return Decision(
        error.code,
        message,
        NackOptions(
            fence=fence,
            state="ready",
            counted=False,
            delay=delay,
            error_code=error.code,
            last_error=message,
            progress=progress,
        ),
    )


def _retry_after_seconds(error: BaseException) -> float | None:
    """``meta["retry_after_seconds"]`` when it is a finite number, else ``None``."""
    seconds: Any = error.meta.get("retry_after_seconds") if isinstance(error, JobsError) else None
    if (
        isinstance(seconds, int | float)
        and not isinstance(seconds, bool)
        and math.isfinite(seconds)
    ):
        return float(seconds)
    return None


def decide_unwind(
    error: BaseException,
    *,
    step: str,
    code: str | None,
    message: str,
    attempt: int,
    max_attempts: int,
    retry: Retry,
    fence: Fence,
    jitter: JitterSource,
) -> Decision:
    """The compensation of ``step`` failed while unwinding a run that failed for
    good with ``code``/``message``: the unwind is retried on a counted attempt
    while attempts are left, else the run is buried
    ``X_JOB_COMPENSATION_FAILED`` naming the original failure."""
    cause = _describe(error)
    if attempt < max_attempts:
        return Decision(
            code,
            message,
            _again(
                fence,
                backoff_delay(retry, attempt, jitter),
                code,
                f"{message}; compensation of step {step!r} failed ({cause}), retrying the unwind",
                None,
            ),
        )
    return Decision(
        ErrorCode.X_JOB_COMPENSATION_FAILED,
        f"{ErrorCode.X_JOB_COMPENSATION_FAILED}: compensation of step {step!r} failed "
        f"({cause}); fix it, then `trio-jobs retry ID`. Original failure: {message}",
        None,
    )


def _again(
    fence: Fence, delay: float, code: str | None, last_error: str, progress: Progress | None
) -> NackOptions:
    """The counted hand-back of a run retried after ``delay``."""
    return NackOptions(
        fence=fence,
        state="ready",
        counted=True,
        delay=delay,
        error_code=code,
        last_error=last_error,
        progress=progress,
    )


def burial(
    fence: Fence, *, drop: bool, code: str | None, message: str, progress: Progress | None
) -> NackOptions:
    """The settle of a run that failed for good: ``failed`` for a job declared
    without a dead letter (``Retry(dead_letter=False)``), else ``dead``."""
    return NackOptions(
        fence=fence,
        state="failed" if drop else "dead",
        counted=True,
        error_code=code,
        last_error=message,
        progress=progress,
    )
