"""Backoff and jitter as pure functions."""

from __future__ import annotations

from ._declare import Retry
from ._time import JitterSource

__all__ = ["backoff_delay", "retry_after_delay"]


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
