"""A sliding-window log of acquisitions, in one process.

The memory driver's rate-limit store, a ``scope="process"`` limiter and a
worker's per-tenant starts (``Worker(rate_per_tenant=...)``) all count with it.
Pure: the caller passes the instant, from whatever clock it decides by.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

__all__ = ["MIN_WAIT", "SlidingLog"]

#: The shortest wait a refusal answers: a refused run is due again strictly
#: later, even on a frozen clock (the harness's).
MIN_WAIT = 0.001

#: Buckets are swept for expired logs once every this many takes.
_SWEEP_EVERY = 1024


class SlidingLog:
    """At most ``limit`` takes per bucket in any interval of length ``per``.

    A take at ``now`` counts the bucket's takes in ``(now - per, now]``: under
    ``limit`` it is recorded and granted, else it is refused with the seconds
    until the oldest take that must leave the window leaves it. Each bucket keeps
    only the takes of its last window (at most ``limit`` timestamps); a bucket
    whose window has emptied is dropped by a periodic sweep."""

    def __init__(self) -> None:
        self._logs: dict[Hashable, tuple[deque[float], float]] = {}
        self._takes = 0

    def take(self, bucket: Hashable, limit: int, per: float, now: float) -> float | None:
        """Record one take at ``now`` and answer ``None``, or answer how many
        seconds until one would be granted (recording nothing)."""
        self._takes += 1
        if self._takes % _SWEEP_EVERY == 0:
            self._sweep(now)
        found = self._logs.get(bucket)
        hits = found[0] if found is not None else deque()
        while hits and hits[0] <= now - per:
            hits.popleft()
        if len(hits) < limit:
            # A clock that stepped back must not record a take before the last:
            # the log stays ordered, so the oldest take is always first.
            hits.append(max(now, hits[-1]) if hits else now)
            self._logs[bucket] = (hits, per)
            return None
        self._logs[bucket] = (hits, per)
        return max(MIN_WAIT, hits[len(hits) - limit] + per - now)

    def count(self, bucket: Hashable, per: float, now: float) -> int:
        """How many takes of ``bucket`` fall in ``(now - per, now]``."""
        found = self._logs.get(bucket)
        if found is None:
            return 0
        return sum(1 for h in found[0] if h > now - per)

    def _sweep(self, now: float) -> None:
        logs = self._logs
        for bucket in [b for b, (hits, per) in logs.items() if not hits or hits[-1] <= now - per]:
            del logs[bucket]

    def __len__(self) -> int:
        return len(self._logs)
