"""A sliding-window log of acquisitions, in one process, with a queue of the
refused.

The memory driver's rate-limit store, a ``scope="process"`` limiter and a
worker's per-tenant starts (``Worker(rate_per_tenant=...)``) all count with it.
Pure: the caller passes the instant, from whatever clock it decides by. The
PostgreSQL statement (``sql/rate.sql``) and the Redis script (``rate_acquire``)
decide the same way; :func:`promise` is their shared arithmetic.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence

import attrs

__all__ = [
    "MAX_EXACT_WAIT",
    "MAX_SHORT_WAIT",
    "MIN_WAIT",
    "SlidingLog",
    "exact_wait",
    "promise",
    "short_wait",
]

#: The shortest wait a refusal answers: a refused run is due again strictly
#: later, even on a frozen clock (the harness's).
MIN_WAIT = 0.001

#: The longest wait a limiter waits out in the body instead of raising (see
#: :func:`short_wait`).
MAX_SHORT_WAIT = 0.25

#: The longest wait a refusal answers as it is, without taking a place in the
#: queue (see :func:`exact_wait`).
MAX_EXACT_WAIT = 1.0

#: Buckets are swept for expired logs once every this many takes.
_SWEEP_EVERY = 1024


def short_wait(limit: int, per: float) -> float:
    """The longest refusal ``RateLimiter.acquire`` waits out in the body
    instead of raising: the smaller of :data:`MAX_SHORT_WAIT` and a slot's share
    of the window (``per / limit``). A run promised a slot comes back a few
    milliseconds before the grant in that slot leaves the window about as often
    as after (pickup latencies differ); it waits that out rather than being
    handed back again."""
    return min(MAX_SHORT_WAIT, per / limit)


def exact_wait(limit: int, per: float) -> float:
    """The longest wait a refusal answers as it is (until the grant that must
    leave the window leaves) instead of a place in the queue: a quarter of the
    window, at most :data:`MAX_EXACT_WAIT`, and never less than
    :func:`short_wait`. A promised run whose slot's previous grant came late
    (a slow pickup) takes that slot when it frees, instead of going to the back
    of the queue and leaving the slot empty for the rest of the queue."""
    return max(short_wait(limit, per), min(MAX_EXACT_WAIT, per / 4))


def promise(base: Sequence[float], n: int, per: float) -> float:
    """The instant promised to the ``n``-th refusal (from 0) of a queue opened
    when the window held the grants ``base`` (its last ``limit``, oldest
    first): the grants' slots free at ``base[i] + per``, then every ``per``
    after, so refusal ``n`` is promised slot ``n % limit`` of round
    ``n // limit + 1``."""
    return base[n % len(base)] + per * (1 + n // len(base))


@attrs.define
class _Bucket:
    per: float
    hits: deque[float] = attrs.field(factory=deque)
    # The queue of refused takes: the window's grants when it opened, and how
    # many places it has promised (0: no queue).
    base: list[float] = attrs.field(factory=list)
    queued: int = 0

    def frontier(self) -> float | None:
        """The last instant promised, ``None`` without a queue."""
        if not self.queued or not self.base:
            return None
        return promise(self.base, self.queued - 1, self.per)


class SlidingLog:
    """At most ``limit`` takes per bucket in any interval of length ``per``,
    and the refused spread over the windows to come.

    A take at ``now`` counts the bucket's takes in ``(now - per, now]``: under
    ``limit`` it is recorded and granted. At ``limit`` it is refused, recording
    no take, and answers the seconds until its turn:

    - when the grant that must leave the window leaves within
      :func:`exact_wait`, that wait (a promised run back a little early, or
      whose slot's last grant came late);
    - else its place in the queue of the refused: the first refusal of a full
      window is promised the instant its oldest grant leaves, the next one the
      instant the next grant leaves, and so on around the window, one place per
      slot per round (:func:`promise`). Refused runs then come back one per
      freed slot, not all at the first one. The queue lasts while its last
      promise is ahead; the first refusal after that opens a new one.

    A grant is decided by the window alone: the queue only says when to come
    back. Each bucket keeps the takes of its last window and the queue's base
    (at most ``limit`` instants each); a bucket whose window and queue have
    both passed is dropped by a periodic sweep."""

    def __init__(self) -> None:
        self._logs: dict[Hashable, _Bucket] = {}
        self._takes = 0

    def take(self, bucket: Hashable, limit: int, per: float, now: float) -> float | None:
        """Record one take at ``now`` and answer ``None``, or answer how many
        seconds until this one's turn (recording no take)."""
        self._takes += 1
        if self._takes % _SWEEP_EVERY == 0:
            self._sweep(now)
        found = self._logs.get(bucket)
        if found is None:
            found = self._logs[bucket] = _Bucket(per)
        found.per = per
        hits = found.hits
        while hits and hits[0] <= now - per:
            hits.popleft()
        if len(hits) < limit:
            # A clock that stepped back must not record a take before the last:
            # the log stays ordered, so the oldest take is always first.
            hits.append(max(now, hits[-1]) if hits else now)
            return None
        wait = hits[len(hits) - limit] + per - now
        if wait <= exact_wait(limit, per):
            return max(MIN_WAIT, wait)
        frontier = found.frontier()
        if (
            frontier is None
            or frontier <= now
            or len(found.base) != limit
            or promise(found.base, found.queued, per) < now + wait
        ):
            # No queue ahead (or another limit's), or one the window has
            # outrun (others took the slots it promised, so its next place
            # would come before a grant can leave): open one on this window.
            found.base = list(hits)[len(hits) - limit :]
            found.queued = 0
        at = promise(found.base, found.queued, per)
        found.queued += 1
        return max(MIN_WAIT, at - now)

    def count(self, bucket: Hashable, per: float, now: float) -> int:
        """How many takes of ``bucket`` fall in ``(now - per, now]``."""
        found = self._logs.get(bucket)
        if found is None:
            return 0
        return sum(1 for h in found.hits if h > now - per)

    def _sweep(self, now: float) -> None:
        logs = self._logs
        for bucket in [b for b, found in logs.items() if _passed(found, now)]:
            del logs[bucket]

    def __len__(self) -> int:
        return len(self._logs)


def _passed(found: _Bucket, now: float) -> bool:
    frontier = found.frontier()
    if frontier is not None and frontier > now:
        return False
    return not found.hits or found.hits[-1] <= now - found.per
