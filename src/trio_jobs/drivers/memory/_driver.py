"""The memory driver.

The reference semantics of the :class:`~trio_jobs.drivers.JobDriver` protocol,
in one process: every rule the conformance suite asserts holds here first.
Every method completes without yielding inside its critical section, so on one
Trio thread each call is atomic, as one statement is on PostgreSQL.
"""

from __future__ import annotations

import builtins
import heapq
import itertools
import math
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from ..._retention import keep_done_option
from ..._time import Clock, Duration, TrioClock
from ...errors import ErrorCode, JobsError
from .._cursor import decode_cursor, encode_cursor
from .._protocol import (
    CANCELLED_LINE,
    LAPSED_LINE,
    LIVE_STATES,
    MAX_ATTEMPT_LOG,
    MAX_BULK_ROWS,
    ORPHAN_MESSAGE,
    TERMINAL_STATES,
    AckBatches,
    AckOptions,
    AttemptRecord,
    BulkAction,
    BulkFilter,
    BulkPreview,
    BulkResult,
    ChildState,
    ClaimedJob,
    ClaimOptions,
    ClaimResult,
    CounterRow,
    EnqueueRequest,
    EnqueueResult,
    EventRecord,
    Exhausted,
    Fence,
    HeartbeatRequest,
    HeartbeatStatus,
    JobPage,
    JobView,
    LeaseGrant,
    ListFilter,
    NackOptions,
    Progress,
    QueueStats,
    StepRecord,
    StepView,
    WorkerInfo,
    first_line,
    nack_outcome,
)
from .._resolve import check_bulk_action, resolved_prefix
from ._backfills import MemoryBackfills
from ._rate import MemoryRateLimits
from ._tasks import MemoryTasks

__all__ = ["MemoryDriver", "memory_driver"]


@attrs.define(eq=False)
class _Row:
    id: str
    run_id: str
    name: str
    queue: str
    payload: Any
    tenant_id: str | None
    idempotency_key: str
    concurrency_key: str | None
    max_attempts: int
    priority: int
    run_at: float
    created_at: float
    seq: int
    actor: Mapping[str, Any] | None
    trace_context: Mapping[str, str] | None
    state: str = "ready"
    attempts: int = 0
    fence: Fence | None = None
    lease_expires_at: float = 0.0
    error_code: str | None = None
    last_error: str | None = None
    progress: Progress | None = None
    result: Any = None
    updated_at: float = 0.0
    promoted: bool = False
    waiting_event: str | None = None
    lapsed: bool = False
    settled_fence: Fence | None = None
    version: int = 0
    tx: object | None = None  # the open transaction that staged it, until commit
    sensitive: bool = False
    #: The concurrency lease key this ready row waits on (a busy-key hand-back).
    busy_key: str | None = None
    #: The newest claims, oldest first (at most MAX_ATTEMPT_LOG).
    attempt_log: list[AttemptRecord] = attrs.Factory(list)
    #: step.invoke/step.gather: the run that enqueued this one and the step's
    #: wait it belongs to, the runs this one enqueued, how many of each of its
    #: waits are live, and the wait (if any) the row's suspension is on.
    parent_id: str | None = None
    parent_wait: str | None = None
    children: list[str] = attrs.Factory(list)
    children_pending: dict[str | None, int] = attrs.Factory(dict)
    wait_children: bool = False
    children_wait: str | None = None
    #: This child's settle already counted down its parent (once per live period).
    child_settled: bool = False
    #: Enqueued by a job declaring ``unique_for=``: its key is remembered when it settles.
    unique: bool = False

    def end_attempt(
        self,
        now: float,
        outcome: str,
        code: str | None = None,
        message: str | None = None,
    ) -> None:
        """Close the open attempt log entry (none open: nothing to close)."""
        log = self.attempt_log
        if log and log[-1].ended_at is None:
            log[-1] = attrs.evolve(
                log[-1],
                ended_at=now,
                outcome=outcome,
                error_code=code,
                error=first_line(message),
            )


def _seq(record: StepRecord) -> int:
    return record.seq


def _key(name: str, tenant_id: str | None, key: str) -> tuple[str, str | None, str]:
    return (name, tenant_id, key)


#: A counter cell holds done, retried, failed, dead, then the summed duration.
_COUNTER_FIELDS = {"done": 0, "retried": 1, "failed": 2, "dead": 3}


def _not_started(row: _Row) -> bool:
    """A row a debounced enqueue may still move: never claimed (a sleep's
    hand-back is uncounted, so the attempt log says it, not ``attempts``)."""
    return not row.attempt_log and row.state in ("ready", "delayed") and row.busy_key is None


def _live_key(row: _Row) -> tuple[str, str | None, str]:
    return _key(row.name, row.tenant_id, row.idempotency_key)


class _Wake:
    """Wakes idle workers when work arrives (the memory driver pushes)."""

    def __init__(self) -> None:
        self._event: trio.Event | None = None
        #: In one process the wake cannot be lost: it is proven from the start.
        self.live = True

    def fire(self) -> None:
        if self._event is not None:
            self._event.set()
            self._event = None

    async def wait(self, queues: Sequence[str], timeout: float) -> bool:
        if self._event is None:
            self._event = trio.Event()
        event = self._event
        if timeout == math.inf:
            await event.wait()  # the caller's scope bounds it (the worker's idle wait)
            return True
        with trio.move_on_after(timeout):
            await event.wait()
            return True
        return False


class _MemoryTx:
    def __init__(self, driver: MemoryDriver) -> None:
        self._driver = driver
        self.staged: list[str] = []
        self.events: list[tuple[str, Any]] = []
        self.step_puts: list[tuple[str, Fence, StepRecord]] = []
        self.finished = trio.Event()

    async def enqueue_many(self, requests: Sequence[EnqueueRequest]) -> list[EnqueueResult]:
        return await self._driver._enqueue_waiting(requests, tx=self)

    async def publish(self, name: str, payload: Any) -> None:
        self.events.append((name, payload))

    async def execute(
        self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()
    ) -> list[tuple[Any, ...]]:
        raise JobsError(
            ErrorCode.X_NOT_IMPLEMENTED,
            "the memory driver runs no SQL; use postgres_driver(dsn) for tx.execute",
        )

    async def put_step(self, job_id: str, fence: Fence, record: StepRecord) -> bool:
        self._driver._check_open()
        if self._driver._owned(job_id, fence) is None:
            return False
        self.step_puts.append((job_id, fence, record))
        return True


class MemoryDriver:
    """The in-process driver. See :func:`memory_driver`."""

    name = "memory"
    #: How often a waiting run re-checks for its event when the job declares no
    #: ``event_poll`` (the protocol's default).
    event_poll_default = 30.0

    def __init__(self, *, clock: Clock | None = None, keep_done: bool = True) -> None:
        self.clock: Clock = clock if clock is not None else TrioClock()
        #: False: a job that settles done is deleted by its ack (done_retention=0).
        self.keep_done = keep_done
        self._rows: dict[str, _Row] = {}
        self._live: dict[tuple[str, str | None, str], str] = {}
        #: The newest settled row of each key enqueued with ``unique_for=``.
        self._settled_keys: dict[tuple[str, str | None, str], str] = {}
        self._steps: dict[str, dict[str, StepRecord]] = {}
        self._events: list[EventRecord] = []
        self._leases: dict[tuple[str, int], tuple[str, Fence, float]] = {}
        #: Runs waiting on a busy key, by lease key: (priority, seq, job id) heaps.
        self._busy_waits: dict[str, list[tuple[int, int, str]]] = {}
        self._paused: set[str] = set()
        self._workers: dict[str, tuple[WorkerInfo, float]] = {}
        self._counters: dict[tuple[float, str], list[float]] = {}
        #: The queue each counter cell's job settled in (the last one).
        self._counter_queues: dict[tuple[float, str], str] = {}
        self._due: dict[str, list[tuple[int, float, int, int, str]]] = {}
        self._scheduled: list[tuple[float, int, int, str]] = []
        self._running: list[tuple[float, int, str]] = []
        self._seq = itertools.count(1)
        self._claims = itertools.count(1)
        self._event_ids = itertools.count(1)
        self._wake = _Wake()
        self.steps = _MemorySteps(self)
        self.events = _MemoryEvents(self)
        self.leases: _MemoryLeases | None = _MemoryLeases(self)
        self.rate_limits: MemoryRateLimits | None = MemoryRateLimits(self)
        self.introspect: _MemoryIntrospection | None = _MemoryIntrospection(self)
        self.wake: _Wake | None = self._wake
        self.backfills: MemoryBackfills | None = MemoryBackfills(self.now, self._check_open)
        self.tasks: MemoryTasks | None = MemoryTasks(self)
        #: The batched ack (the worker's ack pipeline, as on PostgreSQL): each
        #: ack of a batch settled as ack() settles it, in one step of the loop.
        self.acks: AckBatches | None = _MemoryAcks(self)
        self.opened = False
        self.closed = False

    # ------------------------------------------------------------------ lifecycle

    async def open(self) -> None:
        self.opened = True
        self.closed = False

    async def close(self) -> None:
        self.closed = True

    @asynccontextmanager
    async def open_in(self, nursery: trio.Nursery) -> AsyncIterator[None]:
        """Open for the block (the memory driver has no background tasks)."""
        await self.open()
        try:
            yield
        finally:
            await self.close()

    def now(self) -> float:
        return self.clock.now()

    def _check_open(self) -> None:
        if self.closed:
            raise JobsError(
                ErrorCode.X_DRIVER_UNAVAILABLE,
                "the memory driver is closed; open a new one with open_jobs(memory_driver())",
            )

    # ------------------------------------------------------------------ indexing

    def _index(self, row: _Row) -> None:
        """Put a live, committed, not-running row where the claim will find it."""
        row.version += 1
        if row.tx is not None or row.state not in ("ready", "delayed", "suspended"):
            return
        if row.run_at <= self.now():
            heapq.heappush(
                self._due.setdefault(row.queue, []),
                (row.priority, row.run_at, row.seq, row.version, row.id),
            )
        else:
            heapq.heappush(self._scheduled, (row.run_at, row.version, row.seq, row.id))

    def _index_running(self, row: _Row) -> None:
        row.version += 1
        heapq.heappush(self._running, (row.lease_expires_at, row.version, row.id))

    def _promote_scheduled(self, now: float) -> None:
        scheduled = self._scheduled
        while scheduled and scheduled[0][0] <= now:
            _run_at, version, _seq, job_id = heapq.heappop(scheduled)
            row = self._rows.get(job_id)
            if row is None or row.version != version:
                continue
            heapq.heappush(
                self._due.setdefault(row.queue, []),
                (row.priority, row.run_at, row.seq, row.version, row.id),
            )

    # ------------------------------------------------------------------ enqueue

    async def enqueue_many(self, requests: Sequence[EnqueueRequest]) -> list[EnqueueResult]:
        return await self._enqueue_waiting(requests, tx=None)

    async def _enqueue_waiting(
        self, requests: Sequence[EnqueueRequest], tx: _MemoryTx | None
    ) -> list[EnqueueResult]:
        # A key held by a row another open transaction only staged is decided by
        # that transaction: wait for it, as PostgreSQL waits on the live-key index.
        while True:
            blocker = self._staged_blocker(requests, tx)
            if blocker is None:
                return self._enqueue(requests, tx=tx)
            await blocker.finished.wait()

    def _staged_blocker(
        self, requests: Sequence[EnqueueRequest], tx: _MemoryTx | None
    ) -> _MemoryTx | None:
        for req in requests:
            held = self._live.get(_key(req.name, req.tenant_id, req.idempotency_key))
            if held is None:
                continue
            row = self._rows.get(held)
            if row is not None and row.tx is not None and row.tx is not tx:
                return row.tx  # type: ignore[return-value]
        return None

    def _enqueue(
        self, requests: Sequence[EnqueueRequest], tx: _MemoryTx | None
    ) -> list[EnqueueResult]:
        self._check_open()
        now = self.now()
        out: list[EnqueueResult] = []
        woke = False
        for req in requests:
            key = _key(req.name, req.tenant_id, req.idempotency_key)
            existing = self._live.get(key)
            if existing is not None:
                row = self._rows[existing]
                if req.debounce is not None and _not_started(row):
                    self._debounce(row, req, now)
                out.append(EnqueueResult(row.id, row.run_id, True))
                continue
            if req.id in self._rows:
                # Republished under the id it was staged with: no second row.
                row = self._rows[req.id]
                out.append(EnqueueResult(row.id, row.run_id, True))
                continue
            if req.unique_for is not None:
                settled = self._rows.get(self._settled_keys.get(key, ""))
                if (
                    settled is not None
                    and settled.state in TERMINAL_STATES
                    and settled.updated_at + req.unique_for > now
                ):
                    out.append(EnqueueResult(settled.id, settled.run_id, True))
                    continue
            if req.debounce is not None:
                run_at = now + req.debounce
            else:
                run_at = req.run_at if req.run_at is not None else now + (req.delay or 0.0)
            row = _Row(
                id=req.id,
                run_id=req.run_id,
                name=req.name,
                queue=req.queue,
                payload=req.payload,
                tenant_id=req.tenant_id,
                idempotency_key=req.idempotency_key,
                concurrency_key=req.concurrency_key,
                max_attempts=req.max_attempts,
                priority=req.priority,
                run_at=run_at,
                created_at=now,
                seq=next(self._seq),
                actor=req.actor,
                trace_context=req.trace_context,
                state="ready" if run_at <= now else "delayed",
                updated_at=now,
                tx=tx,
                sensitive=req.sensitive,
                parent_id=req.parent_id,
                parent_wait=req.parent_wait,
                unique=req.unique_for is not None,
            )
            self._rows[row.id] = row
            self._live[key] = row.id
            if tx is not None:
                tx.staged.append(row.id)
            else:
                self._adopt(row)
                self._index(row)
                woke = True
            out.append(EnqueueResult(row.id, row.run_id, False))
        if woke:
            self._wake.fire()
        return out

    def _debounce(self, row: _Row, req: EnqueueRequest, now: float) -> None:
        """A later enqueue of a debounced key: the run takes its input and starts
        ``debounce`` after it."""
        row.payload = req.payload
        row.concurrency_key = req.concurrency_key
        row.run_at = now + (req.debounce or 0.0)
        row.state = "delayed"
        row.updated_at = now
        self._index(row)  # a new version: the row's old heap entries are stale

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[_MemoryTx]:
        self._check_open()
        tx = _MemoryTx(self)
        try:
            yield tx
        except BaseException:
            self._discard(tx)
            raise
        # Step records first: a fence lost since put_step (the lease lapsed while
        # the transaction stayed open) applies nothing of the transaction.
        for job_id, fence, _record in tx.step_puts:
            if self._owned(job_id, fence) is None:
                self._discard(tx)
                raise JobsError(
                    ErrorCode.X_JOB_LEASE_LOST,
                    "the job's lease lapsed before the step's transaction committed; "
                    "nothing of it was applied",
                )
        for job_id, _fence, record in tx.step_puts:
            self.steps._store(job_id, record)
        for job_id in tx.staged:
            row = self._rows.get(job_id)
            if row is not None:
                row.tx = None
                self._adopt(row)
                self._index(row)
        for name, payload in tx.events:
            self._publish(name, payload)
        tx.finished.set()
        self._wake.fire()

    def _discard(self, tx: _MemoryTx) -> None:
        for job_id in tx.staged:
            row = self._rows.pop(job_id, None)
            if row is not None and self._live.get(_live_key(row)) == job_id:
                del self._live[_live_key(row)]
        tx.finished.set()

    # ------------------------------------------------------------------ claim

    async def claim(self, options: ClaimOptions) -> ClaimResult:
        self._check_open()
        now = self.now()
        exhausted = self._reap(now, options)
        self._promote_scheduled(now)
        taken: list[ClaimedJob] = []
        for queue, want in options.queues.items():
            if want <= 0 or queue in self._paused:
                continue
            heap = self._due.get(queue)
            while heap and want > 0:
                _prio, _run_at, _seq, version, job_id = heapq.heappop(heap)
                row = self._rows.get(job_id)
                if row is None or row.version != version:
                    continue
                taken.append(self._take(row, options, now))
                want -= 1
        return ClaimResult(jobs=taken, exhausted=exhausted, next_due=self._next_due())

    def _next_due(self) -> float:
        """The earliest scheduled due time or running lease lapse, over every
        queue (so early, never late). Stale heap tops are dropped first."""
        rows = self._rows
        scheduled, running = self._scheduled, self._running
        while scheduled:
            row = rows.get(scheduled[0][3])
            if row is not None and row.version == scheduled[0][1]:
                break
            heapq.heappop(scheduled)
        while running:
            row = rows.get(running[0][2])
            if row is not None and row.version == running[0][1] and row.state == "running":
                break
            heapq.heappop(running)
        first = scheduled[0][0] if scheduled else math.inf
        if running and running[0][0] < first:
            first = running[0][0]
        return first

    def _reap(self, now: float, options: ClaimOptions) -> list[Exhausted]:
        """Lapsed leases: bury rows on their final attempt, re-offer the rest."""
        exhausted: list[Exhausted] = []
        running = self._running
        while running and running[0][0] <= now:
            _exp, version, job_id = heapq.heappop(running)
            row = self._rows.get(job_id)
            if row is None or row.version != version or row.state != "running":
                continue
            self._release_leases(row.id)
            if row.attempts >= row.max_attempts:
                state = "failed" if row.name in options.drop_names else "dead"
                row.state = state
                row.error_code = ErrorCode.X_JOB_LEASE_LOST
                row.last_error = (
                    f"{ErrorCode.X_JOB_LEASE_LOST}: the lease lapsed on the final attempt "
                    f"({row.attempts} of {row.max_attempts}); the worker holding it died or "
                    f"stopped renewing it — {ErrorCode.X_JOB_MAX_ATTEMPTS}"
                )
                row.fence = None
                row.updated_at = now
                row.version += 1
                self._free_key(row)
                self._child_settled(row)
                self._count(row.name, row.queue, now, state)
                row.end_attempt(now, "lapsed", ErrorCode.X_JOB_LEASE_LOST, LAPSED_LINE)
                exhausted.append(
                    Exhausted(
                        id=row.id,
                        run_id=row.run_id,
                        name=row.name,
                        queue=row.queue,
                        payload=row.payload,
                        tenant_id=row.tenant_id,
                        state=state,  # type: ignore[arg-type]
                        error_code=row.error_code,
                        last_error=row.last_error,
                        attempt=row.attempts,
                    )
                )
            else:
                row.end_attempt(now, "lapsed", ErrorCode.X_JOB_LEASE_LOST, LAPSED_LINE)
                row.state = "ready"
                row.run_at = row.lease_expires_at
                row.fence = None
                row.promoted = False
                row.updated_at = now
                row.version += 1
                row.lapsed = True
                heapq.heappush(
                    self._due.setdefault(row.queue, []),
                    (row.priority, row.run_at, row.seq, row.version, row.id),
                )
        return exhausted

    def _take(self, row: _Row, options: ClaimOptions, now: float) -> ClaimedJob:
        lapsed, row.lapsed = row.lapsed, False
        row.state = "running"
        row.attempts += 1
        row.fence = Fence(options.worker_id, next(self._claims))
        row.lease_expires_at = now + options.visibility_timeout
        row.updated_at = now
        row.waiting_event = None
        row.wait_children = False
        row.busy_key = None
        promoted, row.promoted = row.promoted, False
        del row.attempt_log[: max(0, len(row.attempt_log) - MAX_ATTEMPT_LOG + 1)]
        row.attempt_log.append(AttemptRecord(row.attempts, options.worker_id, now))
        self._index_running(row)
        return ClaimedJob(
            id=row.id,
            run_id=row.run_id,
            name=row.name,
            queue=row.queue,
            payload=row.payload,
            tenant_id=row.tenant_id,
            idempotency_key=row.idempotency_key,
            concurrency_key=row.concurrency_key,
            attempt=row.attempts,
            max_attempts=row.max_attempts,
            fence=row.fence,
            created_at=row.created_at,
            run_at=row.run_at,
            lease_expires_at=row.lease_expires_at,
            actor=row.actor,
            trace_context=row.trace_context,
            promoted=promoted,
            lapsed=lapsed,
            steps=sorted(self._steps[row.id].values(), key=_seq) if row.id in self._steps else [],
        )

    def _owned(self, job_id: str, fence: Fence, now: float | None = None) -> _Row | None:
        # ``now``: the caller's one reading of the clock, as one statement has one now().
        row = self._rows.get(job_id)
        if row is None:
            return None
        if row.state != "running" or (row.fence is not fence and row.fence != fence):
            return None
        if row.lease_expires_at <= (self.now() if now is None else now):
            return None
        return row

    def _adopt(self, row: _Row) -> None:
        """A committed child counts up its parent's live children."""
        parent = self._rows.get(row.parent_id) if row.parent_id is not None else None
        if parent is not None:
            parent.children.append(row.id)
            pending = parent.children_pending
            pending[row.parent_wait] = pending.get(row.parent_wait, 0) + 1

    def _child_settled(self, row: _Row) -> None:
        """A child left the live states: its parent counts it down, and the last
        one makes a parent suspended on its children due at once."""
        if row.parent_id is None or row.child_settled:
            return
        row.child_settled = True
        parent = self._rows.get(row.parent_id)
        if parent is None:
            return
        pending = parent.children_pending
        left = pending.get(row.parent_wait, 0) - 1
        if left > 0:
            pending[row.parent_wait] = left
        else:
            pending.pop(row.parent_wait, None)
        now = self.now()
        if (
            left <= 0
            and parent.state == "suspended"
            and parent.wait_children
            and parent.children_wait in (None, row.parent_wait)
            and parent.run_at > now
        ):
            parent.run_at = now
            parent.updated_at = now
            self._index(parent)
            self._wake.fire()

    def _free_key(self, row: _Row) -> None:
        key = _live_key(row)
        if self._live.get(key) == row.id:
            del self._live[key]
            if row.unique:
                self._settled_keys[key] = row.id

    def _count(
        self, name: str, queue: str, now: float, field: str, duration: float | None = None
    ) -> None:
        bucket = math.floor(now / 60.0) * 60.0
        self._counter_queues[(bucket, name)] = queue
        cell = self._counters.setdefault((bucket, name), [0, 0, 0, 0, 0.0])
        cell[_COUNTER_FIELDS[field]] += 1
        if duration is not None:
            cell[4] += duration

    # ------------------------------------------------------------------ settle

    async def ack(self, job_id: str, options: AckOptions) -> bool:
        self._check_open()
        now = self.now()
        row = self._owned(job_id, options.fence, now)
        if row is None:
            return False
        row.state = "done"
        row.result = options.result
        row.settled_fence = options.fence
        row.fence = None
        row.updated_at = now
        if options.progress is not None:
            row.progress = options.progress
        row.version += 1
        self._free_key(row)
        self._child_settled(row)
        self._release_leases(job_id)
        self._count(row.name, row.queue, now, "done", options.duration)
        row.end_attempt(now, "done")
        if not self.keep_done and row.parent_id is None and not row.unique:
            # done_retention=0: as the PostgreSQL ack's DELETE (a child's parent
            # reads its result from the row, a unique_for= row keeps its key taken)
            del self._rows[job_id]
            self._steps.pop(job_id, None)
        return True

    async def nack(self, job_id: str, options: NackOptions) -> bool:
        self._check_open()
        now = self.now()
        row = self._owned(job_id, options.fence, now)
        if row is None:
            return False
        if not options.counted:
            row.attempts -= 1
        if options.max_attempts is not None:
            row.max_attempts = max(row.max_attempts, options.max_attempts)
        if options.progress is not None:
            row.progress = options.progress
        if options.error_code is not None or options.last_error is not None:
            row.error_code = options.error_code
            row.last_error = options.last_error
        row.fence = None
        row.updated_at = now
        row.end_attempt(now, nack_outcome(options), options.error_code, options.last_error)
        self._release_leases(job_id)
        if options.state in ("dead", "failed"):
            row.state = options.state
            row.version += 1
            self._free_key(row)
            self._child_settled(row)
            self._count(row.name, row.queue, now, options.state, options.duration)
            return True
        run_at = options.run_at if options.run_at is not None else now + (options.delay or 0.0)
        busy = options.busy_key
        if busy is not None and options.state == "ready":
            if self._key_held(busy, now):
                row.busy_key = busy
                heapq.heappush(
                    self._busy_waits.setdefault(busy, []), (row.priority, row.seq, row.id)
                )
            else:
                run_at = now  # released between the busy acquire and now: due at once
        if options.wait_children and (
            row.children_pending.get(options.children_wait, 0) <= 0
            if options.children_wait is not None
            else not row.children_pending
        ):
            run_at = now  # the last child settled while this run was running
        row.run_at = run_at
        row.waiting_event = options.waiting_event
        row.wait_children = options.wait_children
        row.children_wait = options.children_wait
        if options.state == "suspended":
            row.state = "suspended"
        elif options.state == "delayed":
            row.state = "delayed"
        else:
            row.state = "ready"
        if options.counted:
            self._count(row.name, row.queue, now, "retried", options.duration)
        self._index(row)
        if run_at <= now:
            self._wake.fire()
        return True

    async def release_orphans(self, worker_id: str, held: frozenset[int]) -> list[str]:
        self._check_open()
        now = self.now()
        orphans = sorted(
            row.id
            for row in self._rows.values()
            if row.state == "running"
            and row.fence is not None
            and row.fence.worker_id == worker_id
            and row.fence.claim not in held
            and row.lease_expires_at > now
        )
        for job_id in orphans:
            row = self._rows[job_id]
            assert row.fence is not None
            await self.nack(
                job_id,
                NackOptions(
                    fence=row.fence,
                    state="ready",
                    counted=False,
                    error_code=ErrorCode.X_DRIVER_UNAVAILABLE,
                    last_error=ORPHAN_MESSAGE,
                ),
            )
        return orphans

    async def heartbeat(
        self, requests: Sequence[HeartbeatRequest], visibility_timeout: float
    ) -> list[str]:
        self._check_open()
        now = self.now()
        out: list[str] = []
        for req in requests:
            row = self._rows.get(req.job_id)
            if row is not None and row.state == "cancelled" and row.fence is None:
                out.append(HeartbeatStatus.CANCELLED)
                continue
            owned = self._owned(req.job_id, req.fence, now)
            if owned is None:
                out.append(HeartbeatStatus.LOST)
                continue
            owned.lease_expires_at = now + visibility_timeout
            if req.progress is not None:
                owned.progress = req.progress
            log = owned.attempt_log
            if log and log[-1].ended_at is None:
                step = req.step
                log[-1] = attrs.evolve(
                    log[-1],
                    step=step.name if step is not None else None,
                    step_started_at=step.started_at if step is not None else None,
                )
            self._index_running(owned)
            if self._leases:
                for lkey, (holder, fence, _exp) in list(self._leases.items()):
                    if holder == req.job_id and fence == req.fence:
                        self._leases[lkey] = (holder, fence, now + visibility_timeout)
            out.append(HeartbeatStatus.OK)
        return out

    async def attempt_log(self, job_id: str) -> builtins.list[AttemptRecord]:
        self._check_open()
        row = self._rows.get(str(job_id))
        return [] if row is None or row.tx is not None else builtins.list(row.attempt_log)

    async def stats(self) -> list[QueueStats]:
        self._check_open()
        counts: dict[str, dict[str, int]] = {}
        for row in self._rows.values():
            if row.tx is not None:
                continue
            per = counts.setdefault(row.queue, {})
            per[row.state] = per.get(row.state, 0) + 1
        return [QueueStats(queue=q, **c) for q, c in sorted(counts.items())]

    # ------------------------------------------------------------------ events

    def _publish(self, name: str, payload: Any) -> None:
        now = self.now()
        self._events.append(EventRecord(next(self._event_ids), name, payload, now))
        for row in self._rows.values():
            if row.state == "suspended" and row.waiting_event == name and row.run_at > now:
                row.run_at = now
                self._index(row)
        self._wake.fire()

    # ------------------------------------------------------------------ leases

    def _release_leases(self, job_id: str) -> None:
        if not self._leases:
            return
        for lkey in [k for k, v in self._leases.items() if v[0] == job_id]:
            del self._leases[lkey]
            self._wake_waiter(lkey[0])

    def _key_held(self, lease_key: str, now: float) -> bool:
        return any(k == lease_key and v[2] > now for (k, _slot), v in self._leases.items())

    def _wake_waiter(self, lease_key: str) -> None:
        """A slot of ``lease_key`` came free: the first run waiting on it (by
        priority, then enqueue order) is due now."""
        heap = self._busy_waits.get(lease_key)
        now = self.now()
        while heap:
            _prio, _seq, job_id = heapq.heappop(heap)
            row = self._rows.get(job_id)
            if row is None or row.busy_key != lease_key or row.state != "ready":
                continue  # claimed, cancelled or woken since: a stale entry
            row.busy_key = None
            if row.run_at > now:
                row.run_at = now
                row.updated_at = now
                self._index(row)
                self._wake.fire()
                break
            # already due (its bound passed): it is claimable anyway; wake the next
        if heap is not None and not heap:
            del self._busy_waits[lease_key]


class _MemorySteps:
    #: Not declared: a put here has no checkpoint, but a wrapper of this store
    #: (the simulation's, with its faults) may add them; the step write shields it.
    shielded = False

    def __init__(self, driver: MemoryDriver) -> None:
        self._d = driver

    async def load(self, job_id: str) -> list[StepRecord]:
        self._d._check_open()
        return sorted(self._d._steps.get(job_id, {}).values(), key=lambda r: r.seq)

    async def put(self, job_id: str, fence: Fence, record: StepRecord) -> bool:
        self._d._check_open()
        if self._d._owned(job_id, fence) is None:
            return False
        self._store(job_id, record)
        return True

    async def children(self, ids: Sequence[str]) -> list[ChildState]:
        self._d._check_open()
        out: list[ChildState] = []
        for job_id in ids:
            row = self._d._rows.get(job_id)
            if row is None or row.tx is not None:
                out.append(ChildState(job_id, "cancelled", None, ErrorCode.X_ABORTED))
            else:
                out.append(ChildState(job_id, row.state, row.result, row.error_code))  # type: ignore[arg-type]
        return out

    def _store(self, job_id: str, record: StepRecord) -> None:
        steps = self._d._steps.setdefault(job_id, {})
        old = steps.get(record.name)
        if old is not None and old.seq != record.seq:
            record = attrs.evolve(record, seq=old.seq)
        steps[record.name] = record


class _MemoryAcks:
    """``AckBatches`` for the memory driver: a batch is its acks, one after
    another through :meth:`MemoryDriver.ack` (no await between them: one
    statement), one answer each in order."""

    def __init__(self, driver: MemoryDriver) -> None:
        self._d = driver

    async def ack_many(self, acks: Sequence[tuple[str, AckOptions]]) -> builtins.list[bool]:
        ack = self._d.ack
        return [await ack(job_id, options) for job_id, options in acks]


class _MemoryEvents:
    def __init__(self, driver: MemoryDriver) -> None:
        self._d = driver

    async def publish(self, name: str, payload: Any) -> None:
        self._d._check_open()
        self._d._publish(name, payload)

    async def poll(self, name: str, since: float) -> tuple[list[EventRecord], float]:
        self._d._check_open()
        found = [e for e in self._d._events if e.name == name and e.published_at >= since]
        return found, self._d.now()


class _MemoryLeases:
    #: A release makes the first run waiting on its key due (NackOptions.busy_key).
    wakes_waiters = True

    def __init__(self, driver: MemoryDriver) -> None:
        self._d = driver

    async def acquire(
        self, lease_key: str, limit: int, job_id: str, fence: Fence, ttl: float
    ) -> LeaseGrant:
        d = self._d
        d._check_open()
        if d._owned(job_id, fence) is None:
            # Fenced like every write: a claim that lapsed takes no slot.
            return LeaseGrant(slot=None)
        now = d.now()
        holders: list[str] = []
        free: int | None = None
        for slot in range(limit):
            held = d._leases.get((lease_key, slot))
            if held is None or held[2] <= now:
                if free is None:
                    free = slot
                continue
            if held[0] == job_id and held[1] == fence:
                return LeaseGrant(slot=slot)
            holders.append(held[0])
        if free is not None:
            d._leases[(lease_key, free)] = (job_id, fence, now + ttl)
            return LeaseGrant(slot=free)
        return LeaseGrant(slot=None, own=bool(holders) and all(h == job_id for h in holders))

    async def release(self, job_id: str) -> None:
        self._d._release_leases(job_id)

    async def held(self, lease_key: str) -> int:
        now = self._d.now()
        return sum(1 for (k, _s), v in self._d._leases.items() if k == lease_key and v[2] > now)


_TIERS = ((86400.0, 60.0), (7 * 86400.0, 300.0), (30 * 86400.0, 3600.0))


class _MemoryIntrospection:
    def __init__(self, driver: MemoryDriver) -> None:
        self._d = driver

    def _row(self, job_id: str) -> _Row:
        row = self._d._rows.get(str(job_id))
        if row is None or row.tx is not None:
            raise JobsError(
                ErrorCode.X_JOB_NOT_FOUND,
                "no job has that id; list jobs with `trio-jobs list` to find it",
            )
        return row

    def _view(self, row: _Row, *, steps: bool) -> JobView:
        step_views: builtins.list[StepView] = []
        if steps:
            for rec in sorted(self._d._steps.get(row.id, {}).values(), key=lambda r: r.seq):
                step_views.append(
                    StepView(
                        rec.name,
                        rec.status,
                        rec.executions,
                        rec.output,
                        rec.error,
                        started_at=rec.started_at,
                        ended_at=rec.ended_at,
                    )
                )
        return JobView(
            id=row.id,
            run_id=row.run_id,
            name=row.name,
            queue=row.queue,
            state=row.state,  # type: ignore[arg-type]
            attempts=row.attempts,
            max_attempts=row.max_attempts,
            tenant_id=row.tenant_id,
            idempotency_key=row.idempotency_key,
            concurrency_key=row.concurrency_key,
            run_at=row.run_at,
            created_at=row.created_at,
            error_code=row.error_code,
            last_error=row.last_error,
            progress=row.progress,
            result=row.result,
            steps=step_views,
            payload=row.payload,
            priority=row.priority,
            updated_at=row.updated_at,
            worker_id=row.fence.worker_id if row.fence is not None else None,
            sensitive=row.sensitive,
            attempt_log=tuple(row.attempt_log) if steps else (),
            parent_id=row.parent_id,
            children=tuple(row.children) if steps else (),
        )

    async def show(self, job_id: str) -> JobView:
        self._d._check_open()
        return self._view(self._row(job_id), steps=True)

    async def resolve_id(self, prefix: str) -> str:
        self._d._check_open()
        matches = sorted(
            job_id
            for job_id, row in self._d._rows.items()
            if row.tx is None and job_id.startswith(prefix)
        )
        return resolved_prefix(matches, len(matches))

    def _matches(self, row: _Row, f: ListFilter | BulkFilter) -> bool:
        if row.tx is not None:
            return False
        if f.queue is not None and row.queue != f.queue:
            return False
        if f.name is not None and row.name != f.name:
            return False
        if f.state is not None and row.state != f.state:
            return False
        if f.tenant_id is not None and row.tenant_id != f.tenant_id:
            return False
        if isinstance(f, ListFilter):
            if f.id_prefix is not None and not row.id.startswith(f.id_prefix.lower()):
                return False
            if f.created_from is not None and row.created_at < f.created_from:
                return False
            if f.created_to is not None and row.created_at >= f.created_to:
                return False
        return True

    async def list(self, filter: ListFilter) -> JobPage:
        self._d._check_open()
        f = filter  # validated where it was built (ListFilter's validators)
        rows = [r for r in self._d._rows.values() if self._matches(r, f)]
        rows.sort(key=lambda r: (r.created_at, r.id), reverse=True)
        keyed = [((r.created_at, r.id), r) for r in rows]
        if f.after is not None:
            mark = decode_cursor(f.after)
            keyed = [kr for kr in keyed if kr[0] < mark]
            page = keyed[: f.limit]
            has_more = len(keyed) > f.limit
            has_prev = True
        elif f.before is not None:
            mark = decode_cursor(f.before)
            older = [kr for kr in keyed if kr[0] > mark]
            page = older[-f.limit :]
            has_prev = len(older) > f.limit
            has_more = True
        else:
            page = keyed[: f.limit]
            has_more = len(keyed) > f.limit
            has_prev = False
        views = [self._view(r, steps=False) for _k, r in page]
        after = encode_cursor(*page[-1][0]) if page and has_more else None
        before = encode_cursor(*page[0][0]) if page and has_prev else None
        return JobPage(rows=views, after=after, before=before)

    async def requeue(self, job_id: str, from_step: str | None = None) -> JobView:
        d = self._d
        d._check_open()
        row = self._row(job_id)
        if row.state in LIVE_STATES:
            raise JobsError(
                ErrorCode.X_JOB_NOT_REQUEUEABLE,
                f"the job is {row.state}; only a done, failed, dead or cancelled job can be requeued",
            )
        holder = d._live.get(_live_key(row))
        if holder is not None and holder != row.id:
            raise JobsError(
                ErrorCode.X_JOB_DUPLICATE,
                f"a live job ({holder}) holds this job's idempotency key; wait for it to settle",
                meta={"holder": holder},
            )
        steps = d._steps.get(row.id, {})
        if from_step is not None:
            cut = steps.get(from_step)
            if cut is None:
                raise JobsError(
                    ErrorCode.X_INVARIANT,
                    "the job recorded no step by that name; `trio-jobs show ID` lists its steps",
                )
            for name in [n for n, r in steps.items() if r.seq >= cut.seq]:
                del steps[name]
        self._requeue_row(row)
        return self._view(row, steps=True)

    def _requeue_row(self, row: _Row) -> None:
        d = self._d
        now = d.now()
        row.state = "ready"
        row.attempts = 0
        row.run_at = now
        row.error_code = None
        row.last_error = None
        row.result = None
        row.updated_at = now
        d._live[_live_key(row)] = row.id
        d._index(row)
        d._wake.fire()

    async def cancel(self, job_id: str, reason: str | None = None) -> JobView:
        d = self._d
        d._check_open()
        row = self._row(job_id)
        if row.state not in LIVE_STATES:
            raise JobsError(
                ErrorCode.X_JOB_NOT_CANCELLABLE,
                f"the job already ended {row.state}; only a live job can be cancelled",
            )
        now = d.now()
        if row.state == "running":
            row.end_attempt(now, "cancelled", ErrorCode.X_ABORTED, CANCELLED_LINE)
        row.state = "cancelled"
        row.fence = None
        row.error_code = ErrorCode.X_ABORTED
        row.last_error = f"{ErrorCode.X_ABORTED}: cancelled" + (f": {reason}" if reason else "")
        row.updated_at = now
        row.version += 1
        d._free_key(row)
        d._child_settled(row)
        d._release_leases(row.id)
        # Cancelling a parent cancels its live children (and theirs).
        for child_id in row.children:
            child = d._rows.get(child_id)
            if child is not None and child.state in LIVE_STATES and child.tx is None:
                await self.cancel(child_id, "its parent was cancelled")
        return self._view(row, steps=True)

    async def remove(self, job_id: str) -> None:
        d = self._d
        d._check_open()
        row = self._row(job_id)
        if row.state == "running":
            raise JobsError(
                ErrorCode.X_JOB_NOT_REMOVABLE,
                "the job is running; cancel it first (`trio-jobs cancel ID`), then remove it",
            )
        self._drop(row)

    def _drop(self, row: _Row) -> None:
        d = self._d
        d._free_key(row)
        d._child_settled(row)
        d._release_leases(row.id)
        row.version += 1
        del d._rows[row.id]
        d._steps.pop(row.id, None)

    def _bulk_rows(self, f: BulkFilter) -> builtins.list[_Row]:
        rows = [r for r in self._d._rows.values() if self._matches(r, f)]
        rows.sort(key=lambda r: (r.created_at, r.id))
        return rows

    async def remove_many(self, filter: BulkFilter) -> BulkResult:
        self._d._check_open()
        check_bulk_action("remove", filter)
        rows = self._bulk_rows(filter)
        for row in rows[:MAX_BULK_ROWS]:
            self._drop(row)
        return BulkResult(
            affected=min(len(rows), MAX_BULK_ROWS), remaining=max(0, len(rows) - MAX_BULK_ROWS)
        )

    async def requeue_many(self, filter: BulkFilter) -> BulkResult:
        d = self._d
        d._check_open()
        check_bulk_action("requeue", filter)
        movable = []
        for row in self._bulk_rows(filter):
            holder = d._live.get(_live_key(row))
            if holder is None:
                movable.append(row)
        moved = 0
        for row in movable:
            if moved >= MAX_BULK_ROWS:
                break
            if d._live.get(_live_key(row)) is not None:
                continue  # an earlier row in this batch took the key
            self._requeue_row(row)
            moved += 1
        remaining = sum(1 for r in self._bulk_rows(filter) if d._live.get(_live_key(r)) is None)
        return BulkResult(affected=moved, remaining=remaining)

    def _promotable(self, row: _Row, now: float) -> bool:
        return row.state == "delayed" or (row.state == "ready" and row.run_at > now)

    def _promote_row(self, row: _Row, now: float) -> None:
        row.run_at = now
        row.state = "ready"
        row.promoted = True
        row.updated_at = now
        self._d._index(row)

    async def promote(self, job_id: str) -> JobView:
        d = self._d
        d._check_open()
        row = self._row(job_id)
        now = d.now()
        if not self._promotable(row, now):
            raise JobsError(
                ErrorCode.X_INVARIANT,
                f"the job is {row.state} and not waiting on its run_at; only a delayed job, "
                "or a ready one backing off before a retry, can be promoted",
            )
        self._promote_row(row, now)
        d._wake.fire()
        return self._view(row, steps=True)

    async def promote_many(self, filter: BulkFilter) -> BulkResult:
        d = self._d
        d._check_open()
        check_bulk_action("promote", filter)
        now = d.now()
        rows = [r for r in self._bulk_rows(filter) if self._promotable(r, now)]
        for row in rows[:MAX_BULK_ROWS]:
            self._promote_row(row, now)
        d._wake.fire()
        return BulkResult(
            affected=min(len(rows), MAX_BULK_ROWS), remaining=max(0, len(rows) - MAX_BULK_ROWS)
        )

    async def preview_many(
        self, action: BulkAction, filter: BulkFilter, sample: int
    ) -> BulkPreview:
        d = self._d
        d._check_open()
        check_bulk_action(action, filter)
        rows = self._bulk_rows(filter)
        if action == "promote":
            now = d.now()
            rows = [r for r in rows if self._promotable(r, now)]
        elif action == "requeue":
            # What calling requeue_many until nothing remains moves: per key no
            # live job holds, its oldest row (the others then find it held).
            taken: set[tuple[str, str | None, str]] = set()
            movable = []
            for row in rows:
                key = _live_key(row)
                if key not in taken and d._live.get(key) is None:
                    taken.add(key)
                    movable.append(row)
            rows = movable
        return BulkPreview(
            count=len(rows), sample=[self._view(r, steps=False) for r in rows[:sample]]
        )

    async def resolve_step(self, job_id: str, step: str, *, ran: bool, output: Any = None) -> None:
        d = self._d
        d._check_open()
        row = self._row(job_id)
        if row.state == "running":
            raise JobsError(
                ErrorCode.X_INVARIANT, "the job is running; resolve its step once it has stopped"
            )
        steps = d._steps.get(row.id, {})
        rec = steps.get(step)
        if rec is None or rec.status not in ("started", "failed"):
            raise JobsError(
                ErrorCode.X_INVARIANT,
                "only a `once` step whose outcome is unknown (started or failed) can be resolved",
            )
        if ran:
            steps[step] = attrs.evolve(
                rec, status="completed", output=output, error=None, error_code=None
            )
        else:
            del steps[step]

    async def pause_queue(self, queue: str) -> None:
        self._d._paused.add(queue)

    async def resume_queue(self, queue: str) -> None:
        self._d._paused.discard(queue)
        self._d._wake.fire()

    async def paused_queues(self) -> builtins.list[str]:
        return sorted(self._d._paused)

    async def record_worker(self, info: WorkerInfo, ttl: float) -> None:
        now = self._d.now()
        self._d._workers[info.id] = (attrs.evolve(info, last_heartbeat=now), now + ttl)

    async def remove_worker(self, worker_id: str) -> None:
        self._d._workers.pop(worker_id, None)

    async def workers(self) -> builtins.list[WorkerInfo]:
        now = self._d.now()
        live = {k: v for k, v in self._d._workers.items() if v[1] > now}
        self._d._workers = live
        return sorted((v[0] for v in live.values()), key=lambda w: w.started_at)

    async def purge(self, done_before: float, dead_before: float, limit: int) -> int:
        d = self._d
        d._check_open()
        gone = 0
        for row in builtins.list(d._rows.values()):
            if gone >= limit:
                break
            if row.tx is not None or row.state not in TERMINAL_STATES:
                continue  # a live row (or one an open transaction staged) never goes
            cut = done_before if row.state == "done" else dead_before
            if row.updated_at < cut:
                self._drop(row)
                gone += 1
        return gone

    async def counters(self, name: str | None, since: float) -> builtins.list[CounterRow]:
        d = self._d
        now = d.now()
        merged: dict[tuple[float, str], list[float]] = {}
        queues: dict[tuple[float, str], str] = {}
        for (bucket, job_name), cell in list(d._counters.items()):
            age = now - bucket
            if age > _TIERS[-1][0]:
                del d._counters[(bucket, job_name)]
                d._counter_queues.pop((bucket, job_name), None)
                continue
            if bucket < since or (name is not None and job_name != name):
                continue
            width = next(w for limit, w in _TIERS if age <= limit)
            tier_bucket = math.floor(bucket / width) * width
            acc = merged.setdefault((tier_bucket, job_name), [0, 0, 0, 0, 0.0])
            for i in range(5):
                acc[i] += cell[i]
            queue = d._counter_queues.get((bucket, job_name))
            if queue is not None:
                queues[(tier_bucket, job_name)] = queue
        return [
            CounterRow(
                b, n, int(c[0]), int(c[1]), int(c[2]), int(c[3]), c[4], queue=queues.get((b, n))
            )
            for (b, n), c in sorted(merged.items())
        ]


def memory_driver(
    *, clock: Clock | None = None, done_retention: Duration | None = None
) -> MemoryDriver:
    """The in-process driver, for tests, fixtures and the harness.

    Without a ``clock`` it follows Trio's clock, so under ``autojump_clock`` due
    times, backoffs and lease expiry move with virtual time. It implements
    ``leases``, ``introspect`` and ``backfills``: its process is its whole fleet.
    ``done_retention=0`` keeps no done rows, as the PostgreSQL driver's option.
    """
    return MemoryDriver(clock=clock, keep_done=keep_done_option(done_retention, "memory"))
