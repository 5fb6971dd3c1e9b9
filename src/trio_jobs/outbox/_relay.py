"""The relay: moves committed outbox rows onto the queue driver.

One pass is three statements whatever its size: claim a batch (default 500)
under a lease, publish it with ONE ``driver.enqueue_many`` (per 1,000 job rows;
an event row is one ``events.publish``), then ONE ``mark_published_many``. A
batch that fails anywhere falls back to the row loop for that batch: it
publishes in order up to the failing row, releases the rest, and logs
``jobs.outbox.publish-failed`` naming the poison row (its id, seq and attempts,
never its payload). Every row is published under the id it was staged with,
so a batch published again after a crash before its mark adds no job: the
queue driver answers the row it already holds.

Idle, a pass waits ``interval`` (200 ms) doubling to ``idle_poll_max`` (2 s;
5 s while the store's wake is proven); the staging statement's transactional
``pg_notify`` ends the wait at once. A full batch is followed by the next pass
at once.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .._time import Duration, parse_duration
from ..drivers._protocol import ENQUEUE_CHUNK, EnqueueRequest, JobDriver
from ..errors import ErrorCode, JobsError
from ..logging import emit
from ._codec import decode
from ._protocol import OutboxRow, OutboxStore

if TYPE_CHECKING:
    from .._facade import Jobs

__all__ = ["Relay", "RelayStats"]

log = logging.getLogger("trio_jobs.outbox")

#: The relay's idle poll ceiling, and the one while the store's wake is proven.
IDLE_POLL_MAX = 2.0
IDLE_POLL_MAX_PROVEN = 5.0
#: The longest a poison row is held out of the claims between two tries.
POISON_HOLD_MAX = 60.0
#: Rows one purge statement deletes at most.
PURGE_BATCH = 10_000
#: The wake "queue" the relay waits on: a staging commit announces any queue.
ANY_QUEUE = "*"


@attrs.frozen
class RelayStats:
    """What a relay did: rows published, passes, batches published whole, batches
    that fell back to the row loop, poison rows met, rows purged."""

    published: int
    passes: int
    batches: int
    fallbacks: int
    poison: int
    purged: int


def _code(exc: BaseException) -> str:
    """What a log line may say about a failure: its code, or its class. Never
    ``str(exc)``: a driver's message may quote the row."""
    if isinstance(exc, JobsError):
        return str(exc.code)
    return type(exc).__name__


def _job_id_of(row: OutboxRow) -> str | None:
    """The id a job row was staged under (``None`` for an event row, or a row
    this version cannot read): a log line may name it, never the payload."""
    data = row.data
    if isinstance(data, dict) and data.get("kind") == "job" and isinstance(data.get("id"), str):
        return str(data["id"])
    return None


def _job_name_of(row: OutboxRow) -> str | None:
    """The job a job row was staged for (``None`` for an event row)."""
    data = row.data
    if isinstance(data, dict) and data.get("kind") == "job" and isinstance(data.get("name"), str):
        return str(data["name"])
    return None


def _log(level: int, event: str, **fields: Any) -> None:
    emit(log, level, event, **fields)


class Relay:
    """Moves rows staged in ``jobs.outbox`` onto ``jobs.driver``.

    >>> async with open_jobs(redis_driver(url), jobs=[...], outbox=postgres_outbox(dsn)) as jobs:
    ...     async with trio.open_nursery() as nursery:
    ...         relay = Relay(jobs)
    ...         await nursery.start(relay.run)     # returns once the relay is serving

    Run one relay per app process, or a few anywhere: claims skip rows another
    relay holds, and a relay that dies strands its batch for ``lease`` at most.
    """

    def __init__(
        self,
        jobs: Jobs,
        *,
        batch_size: int = 500,
        interval: Duration = "200ms",
        idle_poll_max: Duration | None = None,
        lease: Duration = "30s",
        published_retention: Duration = "1h",
        purge_every: Duration = "1h",
    ) -> None:
        if getattr(jobs, "outbox", None) is None:
            raise JobsError(
                ErrorCode.X_CONFIG_INVALID,
                "Relay(jobs) needs a facade with an outbox: "
                "open_jobs(driver, jobs=[...], outbox=postgres_outbox(dsn))",
            )
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise JobsError(
                ErrorCode.X_CONFIG_INVALID, "batch_size must be a whole number, 1 or more"
            )
        self.jobs = jobs
        self.batch_size = batch_size
        self.interval = parse_duration(interval, field="interval")
        self._idle_poll_max_set = (
            parse_duration(idle_poll_max, field="idle_poll_max")
            if idle_poll_max is not None
            else None
        )
        self.lease = parse_duration(lease, field="lease")
        self.published_retention = parse_duration(published_retention, field="published_retention")
        self.purge_every = parse_duration(purge_every, field="purge_every")
        self._counts = dict.fromkeys(
            ("published", "passes", "batches", "fallbacks", "poison", "purged"), 0
        )

    # ------------------------------------------------------------------ public

    @property
    def store(self) -> OutboxStore:
        store = self.jobs.outbox
        assert store is not None
        return store

    @property
    def driver(self) -> JobDriver:
        return self.jobs.driver

    @property
    def idle_poll_max(self) -> float:
        """The idle ceiling: as given, else 2 s, or 5 s while the store's wake is proven."""
        if self._idle_poll_max_set is not None:
            return self._idle_poll_max_set
        wake = self.store.wake
        return IDLE_POLL_MAX_PROVEN if wake is not None and wake.live else IDLE_POLL_MAX

    def stats(self) -> RelayStats:
        return RelayStats(**self._counts)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Relay until cancelled. A pass that fails (the store or the driver is
        down) is logged ``jobs.outbox.relay-failed`` and backs off like an idle one."""
        task_status.started()
        delay = self.interval
        next_purge = trio.current_time() + self.purge_every
        while True:
            if trio.current_time() >= next_purge:
                next_purge = trio.current_time() + self.purge_every
                try:
                    await self.purge()
                except Exception as exc:
                    _log(logging.WARNING, "jobs.outbox.purge-failed", code=_code(exc))
            try:
                _published, claimed, failed = await self._pass()
            except Exception as exc:
                _log(logging.WARNING, "jobs.outbox.relay-failed", code=_code(exc))
                claimed, failed = 0, True
            if failed or claimed == 0:
                await self._wait(delay)
                delay = min(delay * 2, self.idle_poll_max)
                continue
            delay = self.interval
            if claimed >= self.batch_size:
                await trio.lowlevel.checkpoint()  # more are waiting: the next pass now
            else:
                await self._wait(self.interval)

    async def relay_once(self) -> int:
        """One pass: claim a batch, publish it, mark it; answers the rows published."""
        published, _claimed, _failed = await self._pass()
        return published

    async def purge(self) -> int:
        """Delete rows published more than ``published_retention`` ago; answers how many."""
        total = 0
        while True:
            n = await self.store.purge(self.published_retention, PURGE_BATCH)
            total += n
            if n < PURGE_BATCH:
                break
        self._counts["purged"] += total
        return total

    # ------------------------------------------------------------------ a pass

    async def _wait(self, timeout: float) -> None:
        wake = self.store.wake
        if wake is not None:
            await wake.wait([ANY_QUEUE], timeout)
        else:
            await trio.sleep(timeout)

    async def _pass(self) -> tuple[int, int, bool]:
        """Answers (published, claimed, failed)."""
        store = self.store
        batch = await store.claim(self.batch_size, self.lease)
        rows = sorted(batch.rows, key=lambda r: r.seq)
        self._counts["passes"] += 1
        if not rows:
            return 0, 0, False
        mark_many = store.mark_published_many
        if mark_many is None:
            published, failed = await self._row_loop(rows, batch.now)
            return published, len(rows), failed
        try:
            await self._publish(rows, batch.now)
        except Exception:
            # Somewhere in the batch a row failed (or the driver is down): find
            # it row by row, keeping the order up to it.
            self._counts["fallbacks"] += 1
            published, failed = await self._row_loop(rows, batch.now)
            return published, len(rows), failed
        # Published. A crash before this mark republishes the batch after the
        # lease lapses, under the same ids: the queue driver adds no row.
        await mark_many([r.id for r in rows])
        self._counts["batches"] += 1
        self._counts["published"] += len(rows)
        return len(rows), len(rows), False

    async def _row_loop(self, rows: list[OutboxRow], now: float) -> tuple[int, bool]:
        """Two statements a row: publish, mark. Stops at the first failing row,
        names it, and releases it with every row after it."""
        store = self.store
        for index, row in enumerate(rows):
            try:
                await self._publish([row], now)
            except Exception as exc:
                rest = rows[index:]
                down = isinstance(exc, JobsError) and exc.code == ErrorCode.X_DRIVER_UNAVAILABLE
                # A driver that is down fails every row alike: release them all
                # in order and back off. A row the driver refuses is held back
                # (with backoff) so the rows staged after it are not blocked.
                hold = (
                    None
                    if down
                    else min(self.interval * 2 ** min(row.attempts, 16), POISON_HOLD_MAX)
                )
                self._counts["poison"] += 1
                _log(
                    logging.ERROR,
                    "jobs.outbox.publish-failed",
                    job_id=_job_id_of(row),
                    job=_job_name_of(row),
                    attempt=row.attempts,
                    row_id=row.id,
                    seq=row.seq,
                    attempts=row.attempts,
                    code=_code(exc),
                    published=index,
                    released=len(rest),
                    held_for=hold,
                )
                await store.release(rest, poison=row.id, error=_code(exc), hold=hold)
                return index, True
            await store.mark_published(row.id)
            self._counts["published"] += 1
        return len(rows), False

    async def _publish(self, rows: list[OutboxRow], now: float) -> None:
        """Publish ``rows`` in order: runs of job rows as one ``enqueue_many`` per
        1,000, each event row as one ``events.publish``."""
        driver = self.driver
        pending: list[EnqueueRequest] = []

        async def flush() -> None:
            if pending:
                await driver.enqueue_many(list(pending))
                pending.clear()

        for row in rows:
            kind, request, event, payload = decode(row.data)
            if kind == "job":
                assert request is not None
                pending.append(_due(request, row, now))
                if len(pending) >= ENQUEUE_CHUNK:
                    await flush()
            else:
                assert event is not None
                await flush()
                await driver.events.publish(event, payload)
        await flush()


def _due(request: EnqueueRequest, row: OutboxRow, now: float) -> EnqueueRequest:
    """A ``delay`` counts from the commit that staged the row, not from the relay:
    what is left of it at publish time (both times on the store's clock, so the
    queue's clock only ever adds a duration)."""
    if request.delay is None or request.run_at is not None:
        return request
    left = max(0.0, row.staged_at + request.delay - now) if now else request.delay
    return attrs.evolve(request, delay=left)
