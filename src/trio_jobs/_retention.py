"""Retention: terminal rows are kept for a while, then purged.

A ``done`` row is kept ``done_retention`` (14 days) after it settled; a
``dead``, ``failed`` or ``cancelled`` row ``dead_retention`` (90 days). Then the
hourly purge deletes it with its step records. A live row (``ready``,
``delayed``, ``running``, ``suspended``) is never touched, however old. Once a
row is terminal its idempotency key is already free (the key window is the
live one), so a purge never changes what an enqueue answers.

``trio-jobs worker`` runs :class:`Retention` beside its worker; an app running
its own :class:`~trio_jobs.Worker` starts it the same way::

    async with trio.open_nursery() as nursery:
        await nursery.start(Retention(jobs.driver).run)   # purges now, then hourly
"""

from __future__ import annotations

import logging

import attrs
import trio

from ._time import Duration, parse_duration
from .drivers._protocol import MAX_BULK_ROWS, JobDriver
from .errors import ErrorCode, JobsError
from .logging import emit

__all__ = ["DEAD_RETENTION", "DONE_RETENTION", "PurgeResult", "Retention", "purge_expired"]

log = logging.getLogger("trio_jobs")

#: How long a ``done`` row is kept after it settled: 14 days, in seconds.
DONE_RETENTION = 14 * 86_400.0
#: How long a ``dead``, ``failed`` or ``cancelled`` row is kept: 90 days, in seconds.
DEAD_RETENTION = 90 * 86_400.0


@attrs.frozen
class PurgeResult:
    """What one purge deleted: terminal rows (with their steps), and the cut-offs used."""

    removed: int
    done_before: float
    dead_before: float


def keep_done_option(done_retention: Duration | None, driver: str) -> bool:
    """A driver's ``done_retention`` option: ``None`` keeps done rows (until the
    purge), 0 keeps none (the ack deletes the row). Anything else is refused."""
    if done_retention is None:
        return True
    if parse_duration(done_retention, field="done_retention", allow_zero=True) == 0:
        return False
    raise JobsError(
        ErrorCode.X_CONFIG_INVALID,
        f"done_retention of the {driver} driver is 0 (keep no done rows) or None (keep them"
        " until the purge); how long a kept done row lives is Retention(done_retention=...)",
    )


def done_ttl_option(done_retention: Duration, driver: str) -> float:
    """A TTL driver's ``done_retention`` option (Redis): how long a done row is
    kept before the store expires it, in seconds, or 0 to keep none (the ack
    deletes the row). Anything else is refused, saying what to pass."""
    try:
        return parse_duration(done_retention, field="done_retention", allow_zero=True)
    except JobsError as exc:
        why = exc.message.rpartition(": ")[2]
        if why == "it must be positive":  # parse_duration's word: 0 is allowed here
            why = "it is below 0"
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            f"done_retention of the {driver} driver is how long a done row is kept before"
            f' {driver} expires it (a duration: "14d", "2h", a number of seconds) or 0'
            f" (keep no done rows: the ack deletes them); got {done_retention!r} ({why})",
        ) from None


async def purge_expired(
    driver: JobDriver,
    now: float | None = None,
    *,
    done_retention: Duration = DONE_RETENTION,
    dead_retention: Duration = DEAD_RETENTION,
    batch: int = MAX_BULK_ROWS,
) -> PurgeResult:
    """Delete every terminal row whose retention ran out, ``batch`` rows a statement.

    ``now`` defaults to the driver's clock (the database's, on PostgreSQL). A
    driver without an operator surface is ``X_NOT_IMPLEMENTED``."""
    done_s = parse_duration(done_retention, field="done_retention")
    dead_s = parse_duration(dead_retention, field="dead_retention")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise JobsError(ErrorCode.X_CONFIG_INVALID, "batch must be a whole number, 1 or more")
    intro = driver.introspect
    if intro is None:
        raise JobsError(
            ErrorCode.X_NOT_IMPLEMENTED,
            f"the {driver.name} driver has no operator surface, so nothing to purge with",
        )
    at = driver.now() if now is None else float(now)
    done_before, dead_before = at - done_s, at - dead_s
    removed = 0
    while True:
        n = await intro.purge(done_before, dead_before, batch)
        removed += n
        if n < batch:
            return PurgeResult(removed, done_before, dead_before)


class Retention:
    """The periodic purge, a service started with ``nursery.start(retention.run)``.

    Purges once at start, then every ``every`` (an hour). Running it in every
    worker process is safe: each purge deletes what has expired and skips rows
    another purge holds."""

    def __init__(
        self,
        driver: JobDriver,
        *,
        every: Duration = "1h",
        done_retention: Duration = DONE_RETENTION,
        dead_retention: Duration = DEAD_RETENTION,
    ) -> None:
        self.driver = driver
        self.every = parse_duration(every, field="every")
        self.done_retention = parse_duration(done_retention, field="done_retention")
        self.dead_retention = parse_duration(dead_retention, field="dead_retention")
        #: Rows deleted so far.
        self.removed = 0
        #: Purges run so far.
        self.runs = 0

    async def purge_once(self) -> PurgeResult:
        result = await purge_expired(
            self.driver, done_retention=self.done_retention, dead_retention=self.dead_retention
        )
        self.removed += result.removed
        self.runs += 1
        if result.removed:
            emit(log, logging.INFO, "jobs.purge.done", removed=result.removed)
        return result

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Purge now and then every ``every`` until cancelled. A failed purge is
        logged ``jobs.purge.failed`` and tried again at the next tick; a driver
        that cannot purge is logged ``jobs.purge.unsupported`` once, and the
        service returns."""
        task_status.started()
        while True:
            try:
                await self.purge_once()
            except JobsError as exc:
                if exc.code == ErrorCode.X_NOT_IMPLEMENTED:
                    emit(log, logging.WARNING, "jobs.purge.unsupported", driver=self.driver.name)
                    return
                emit(log, logging.WARNING, "jobs.purge.failed", code=exc.code)
            except Exception as exc:
                emit(log, logging.WARNING, "jobs.purge.failed", code=type(exc).__name__)
            await trio.sleep(self.every)
