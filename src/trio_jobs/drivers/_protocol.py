"""The driver seam: one protocol, typed records, declared capabilities.

Every driver (memory, PostgreSQL, Redis) implements :class:`JobDriver`; the
conformance suite in :mod:`trio_jobs.testing.conformance` holds each to the same
rules. Times are float seconds since the Unix epoch, decided by the driver's own
clock (the database's, on PostgreSQL). Payloads, results and step outputs are
already in their JSON form.
"""

from __future__ import annotations

import builtins
import copy
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Literal, Protocol, overload, runtime_checkable

import attrs

from .._validate import check_text
from ..errors import ErrorCode, JobsError

if TYPE_CHECKING:
    import trio

    from ._backfills import BackfillLedger
    from ._tasks import TaskStore

__all__ = [
    "AckBatches",
    "AckOptions",
    "BulkAction",
    "AttemptOutcome",
    "AttemptRecord",
    "BulkFilter",
    "BulkPreview",
    "BulkResult",
    "ClaimOptions",
    "ClaimResult",
    "ChildState",
    "ClaimedJob",
    "CounterRow",
    "EnqueueBatch",
    "EnqueueRequest",
    "EnqueueResult",
    "EventRecord",
    "EventStore",
    "Exhausted",
    "Fence",
    "HeartbeatStatus",
    "JobDriver",
    "JobIntrospection",
    "JobPage",
    "JobState",
    "JobView",
    "LeaseGrant",
    "LeaseStore",
    "ListFilter",
    "LIVE_STATES",
    "NackOptions",
    "PROMOTABLE_STATES",
    "QueueStats",
    "RateGrant",
    "RateLimitStore",
    "StepRecord",
    "StepStatus",
    "StepStore",
    "StepView",
    "TERMINAL_STATES",
    "WorkerInfo",
    "DriverTransaction",
    "WakeSource",
    "HeartbeatRequest",
    "Progress",
    "ALL_STATES",
    "ENQUEUE_CHUNK",
    "MAX_BULK_ROWS",
    "MAX_ENQUEUE_BATCH",
    "MAX_JOB_PAGE",
    "MAX_PREVIEW_SAMPLE",
    "MIN_ID_PREFIX",
    "MAX_ATTEMPT_ERROR",
    "MAX_ATTEMPT_LOG",
    "LAPSED_LINE",
    "CANCELLED_LINE",
    "UNWIND_MARGIN",
    "StepMark",
    "first_line",
    "nack_outcome",
]

#: A row's state, as every driver stores and answers it.
JobState = Literal[
    "ready", "delayed", "running", "suspended", "done", "failed", "dead", "cancelled"
]
#: A step record's status.
StepStatus = Literal["started", "completed", "failed", "sleeping", "waiting"]

#: States that hold the idempotency key: a row here dedupes a new enqueue.
LIVE_STATES: frozenset[str] = frozenset({"ready", "delayed", "running", "suspended"})
#: States a run ends in; the same key enqueues a new job at once.
TERMINAL_STATES: frozenset[str] = frozenset({"done", "failed", "dead", "cancelled"})
#: States ``promote`` moves: ``delayed``, or ``ready`` backing off before a retry.
PROMOTABLE_STATES: tuple[str, ...] = ("delayed", "ready")
#: Every state, in the order the operator surface lists them.
ALL_STATES: tuple[str, ...] = (
    "ready",
    "delayed",
    "running",
    "suspended",
    "done",
    "failed",
    "dead",
    "cancelled",
)

#: The most inputs one ``enqueue_many`` takes (``X_JOB_ENQUEUE_BATCH_TOO_LARGE`` past it).
MAX_ENQUEUE_BATCH = 10_000
#: One round trip per this many inputs in ``enqueue_many``.
ENQUEUE_CHUNK = 1_000
#: The most rows one ``list`` page holds (``X_JOB_PAGE_INVALID`` past it).
MAX_JOB_PAGE = 200
#: The most rows one bulk call (``remove_many``, ``requeue_many``, ``promote_many``) moves.
MAX_BULK_ROWS = 1_000
#: Attempts a compensating job's row carries past ``retry.attempts`` to unwind in.
UNWIND_MARGIN = 2
#: The shortest job id prefix ``show``, ``cancel``, ... resolve: the 8 characters
#: ``trio-jobs dev`` and ``trio-jobs list`` print of an id.
MIN_ID_PREFIX = 8
#: The most rows a bulk preview (:meth:`JobIntrospection.preview_many`) samples.
MAX_PREVIEW_SAMPLE = 50
#: The most entries a job's attempt log keeps: the newest; older ones drop off.
MAX_ATTEMPT_LOG = 20
#: The most characters of an error's first line an attempt log entry keeps.
MAX_ATTEMPT_ERROR = 200


# --------------------------------------------------------------------------- enqueue


@attrs.frozen
class EnqueueRequest:
    """One row to stage. ``run_at=None`` means "due now" on the driver's clock;
    ``delay`` is added to the driver's now."""

    id: str
    run_id: str
    name: str
    queue: str
    payload: Any
    idempotency_key: str
    max_attempts: int
    tenant_id: str | None = None
    concurrency_key: str | None = None
    priority: int = 0
    run_at: float | None = None
    delay: float | None = None
    actor: Mapping[str, Any] | None = None
    trace_context: Mapping[str, str] | None = None
    #: The job was declared ``sensitive=True``: the row says so, so a reader that
    #: holds no handle (the CLI) still redacts its payload, keys and outputs.
    sensitive: bool = False
    #: The run that enqueued this one from ``step.invoke``/``step.gather``: the
    #: row's settle makes that parent due once it has no live child left.
    parent_id: str | None = None
    #: The step's wait this child belongs to (one per ``invoke``/``gather`` call:
    #: the id of its first child); a driver counting waits counts it there.
    parent_wait: str | None = None
    #: ``job(debounce=)`` in seconds: a live row of this key that has not started
    #: takes this request's payload and concurrency key and is due this long
    #: after now (answered deduped); no such row: a new one due then.
    debounce: float | None = None
    #: ``job(unique_for=)`` in seconds: with no live row of this key, the newest
    #: row of it that settled less than this long ago answers, deduped.
    unique_for: float | None = None


class EnqueueBatch(Sequence[EnqueueRequest]):
    """The rows of one ``enqueue_many`` call of one job, staged as columns: what
    varies from row to row (ids, payloads, keys, and tenants or concurrency keys
    when the job declares them) one list each, every other field once.

    A ``Sequence[EnqueueRequest]``: its length, indexes and iteration answer the
    same :class:`EnqueueRequest` objects a row-by-row staging makes (built on
    first use, then kept), and a slice is the batch of those rows, so a driver
    that reads requests needs nothing else. A driver that knows the type (the
    PostgreSQL one) reads the columns instead and builds no request at all.
    """

    __slots__ = (
        "_requests",
        "actor",
        "concurrency_keys",
        "debounce",
        "delay",
        "idempotency_keys",
        "ids",
        "max_attempts",
        "name",
        "payloads",
        "priority",
        "queue",
        "run_at",
        "run_ids",
        "sensitive",
        "tenant_ids",
        "trace_context",
        "unique_for",
    )

    def __init__(
        self,
        *,
        ids: builtins.list[str],
        run_ids: builtins.list[str],
        payloads: builtins.list[Any],
        idempotency_keys: builtins.list[str],
        tenant_ids: builtins.list[str | None] | None,
        concurrency_keys: builtins.list[str | None] | None,
        name: str,
        queue: str,
        max_attempts: int,
        priority: int,
        run_at: float | None,
        delay: float | None,
        actor: Mapping[str, Any] | None,
        trace_context: Mapping[str, str] | None,
        sensitive: bool,
        debounce: float | None,
        unique_for: float | None,
    ) -> None:
        self.ids = ids
        self.run_ids = run_ids
        self.payloads = payloads
        self.idempotency_keys = idempotency_keys
        #: ``None``: every row's is ``None`` (likewise ``concurrency_keys``).
        self.tenant_ids = tenant_ids
        self.concurrency_keys = concurrency_keys
        self.name = name
        self.queue = queue
        self.max_attempts = max_attempts
        self.priority = priority
        self.run_at = run_at
        self.delay = delay
        self.actor = actor
        self.trace_context = trace_context
        self.sensitive = sensitive
        self.debounce = debounce
        self.unique_for = unique_for
        self._requests: builtins.list[EnqueueRequest] | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def requests(self) -> builtins.list[EnqueueRequest]:
        """The rows as :class:`EnqueueRequest` objects (made once, then kept)."""
        made = self._requests
        if made is None:
            n = len(self.ids)
            tenants = self.tenant_ids if self.tenant_ids is not None else [None] * n
            ckeys = self.concurrency_keys if self.concurrency_keys is not None else [None] * n
            made = [
                EnqueueRequest(
                    id=job_id,
                    run_id=run_id,
                    name=self.name,
                    queue=self.queue,
                    payload=payload,
                    idempotency_key=key,
                    max_attempts=self.max_attempts,
                    tenant_id=tenant,
                    concurrency_key=ckey,
                    priority=self.priority,
                    run_at=self.run_at,
                    delay=self.delay,
                    actor=self.actor,
                    trace_context=self.trace_context,
                    sensitive=self.sensitive,
                    debounce=self.debounce,
                    unique_for=self.unique_for,
                )
                for job_id, run_id, payload, key, tenant, ckey in zip(
                    self.ids,
                    self.run_ids,
                    self.payloads,
                    self.idempotency_keys,
                    tenants,
                    ckeys,
                    strict=True,
                )
            ]
            self._requests = made
        return made

    @overload
    def __getitem__(self, index: int) -> EnqueueRequest: ...

    @overload
    def __getitem__(self, index: slice) -> EnqueueBatch: ...

    def __getitem__(self, index: int | slice) -> EnqueueRequest | EnqueueBatch:
        if not isinstance(index, slice):
            return self.requests()[index]
        # The shared fields as they are; the columns (and any requests made) cut.
        part = copy.copy(self)
        part.ids = self.ids[index]
        part.run_ids = self.run_ids[index]
        part.payloads = self.payloads[index]
        part.idempotency_keys = self.idempotency_keys[index]
        if self.tenant_ids is not None:
            part.tenant_ids = self.tenant_ids[index]
        if self.concurrency_keys is not None:
            part.concurrency_keys = self.concurrency_keys[index]
        part._requests = None if self._requests is None else self._requests[index]
        return part

    def __iter__(self) -> Iterator[EnqueueRequest]:
        return iter(self.requests())

    def __eq__(self, other: object) -> bool:
        # Equal to the same rows as a list (or another batch), as a list of the
        # requests would be.
        if isinstance(other, EnqueueBatch):
            return self.requests() == other.requests()
        if isinstance(other, builtins.list):
            return self.requests() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"EnqueueBatch({self.requests()!r})"


@attrs.frozen
class EnqueueResult:
    """What a driver answers per staged row: its ids, and whether a live key deduped it."""

    id: str
    run_id: str
    deduped: bool


# --------------------------------------------------------------------------- claim


@attrs.frozen
class Fence:
    """Who holds a claim: settles, heartbeats and step writes are fenced on it."""

    worker_id: str
    claim: int


@attrs.frozen
class ClaimOptions:
    """``queues`` maps each queue to how many rows this pass may take from it, in
    the order the worker serves them. ``drop_names`` are the jobs declaring
    ``dead_letter=False``: a lapse on their final attempt buries them ``failed``."""

    worker_id: str
    queues: Mapping[str, int]
    visibility_timeout: float
    drop_names: frozenset[str] = frozenset()


@attrs.frozen
class ClaimedJob:
    """A row handed to a worker: its payload, keys, the counted attempt and the fence."""

    id: str
    run_id: str
    name: str
    queue: str
    payload: Any
    tenant_id: str | None
    idempotency_key: str
    concurrency_key: str | None
    attempt: int
    max_attempts: int
    fence: Fence
    created_at: float
    run_at: float
    lease_expires_at: float
    actor: Mapping[str, Any] | None = None
    trace_context: Mapping[str, str] | None = None
    #: An operator promoted the row since it was last handed back (ends a sleep).
    promoted: bool = False
    #: The previous claim of this row lapsed (its worker died or lost the lease).
    lapsed: bool = False
    #: The row's step records, when the driver read them with the claim (saves a
    #: round trip); ``None`` means the runner loads them.
    steps: Sequence[StepRecord] | None = None


@attrs.frozen
class Exhausted:
    """A row the claim itself buried: its lease lapsed on its final attempt."""

    id: str
    run_id: str
    name: str
    queue: str
    payload: Any
    tenant_id: str | None
    state: Literal["dead", "failed"]
    error_code: str | None
    last_error: str
    #: The attempt whose lease lapsed (the row's final one), when the driver reports it.
    attempt: int | None = None


@attrs.frozen
class ClaimResult:
    """What a claim answers: the rows it handed out, and the rows it buried.

    ``next_due`` (optional): the earliest instant, on the driver's clock, at
    which a row not due now may become claimable: a waiting row's due time, or a
    running row's lease lapse (its reap re-offers it). ``math.inf`` when there is
    none, ``None`` when the driver does not say. It may be early (a row since
    claimed or cancelled), never late. A worker whose wake is live sleeps until
    then (within its idle ceiling) instead of polling its way there."""

    jobs: Sequence[ClaimedJob] = ()
    exhausted: Sequence[Exhausted] = ()
    next_due: float | None = None


# --------------------------------------------------------------------------- settle


@attrs.frozen
class Progress:
    """A run's progress: ``done`` of ``total``, with an optional short note."""

    done: float
    total: float
    note: str | None = None


@attrs.frozen
class AckOptions:
    """Settle a claimed row ``done``, fenced on ``fence``, with the body's result."""

    fence: Fence
    result: Any = None
    duration: float | None = None
    progress: Progress | None = None


@attrs.frozen
class NackOptions:
    """Hand a claimed row back.

    ``state`` is where it goes: ``ready``/``delayed``/``suspended`` (live again,
    due at ``run_at`` or now + ``delay``) or ``dead``/``failed`` (for good).
    ``counted=False`` gives back the attempt the claim took (a drain, a sleep, a
    suspension, a ``'wait'`` deferral). ``max_attempts`` raises the row's bound
    (the unwind margin).

    ``busy_key``: the concurrency lease key a ``'wait'`` run found busy. A
    lease store that ``wakes_waiters`` marks the row waiting on that key: the
    first release of a slot of the key makes the first such row due at once
    (and a key no longer held when the hand-back lands makes it due at once
    too), so ``delay`` is only the bound for a wake that never comes.
    """

    fence: Fence
    state: Literal["ready", "delayed", "suspended", "dead", "failed"]
    counted: bool = True
    run_at: float | None = None
    delay: float | None = None
    error_code: str | None = None
    last_error: str | None = None
    progress: Progress | None = None
    duration: float | None = None
    waiting_event: str | None = None
    max_attempts: int | None = None
    busy_key: str | None = None
    #: A ``suspended`` hand-back waiting on the row's children
    #: (``step.invoke``/``step.gather``): due at once when none is live as the
    #: hand-back lands, else when the last live one settles (or at ``run_at``).
    wait_children: bool = False
    #: That wait's id (``EnqueueRequest.parent_wait`` of its children).
    children_wait: str | None = None


#: ``last_error`` of a row :meth:`JobDriver.release_orphans` handed back.
ORPHAN_MESSAGE = (
    "X_DRIVER_UNAVAILABLE: a claim took this row but its answer never reached the worker "
    "(the connection dropped after the claim committed); handed back with the attempt "
    "uncounted"
)


class HeartbeatStatus:
    """What a heartbeat answers per row: ``ok``, ``lost`` or ``cancelled``."""

    OK = "ok"
    LOST = "lost"
    CANCELLED = "cancelled"


@attrs.frozen
class StepMark:
    """The step a run is in, and since when (the driver's clock): what the
    attempt log shows as the step in progress."""

    name: str
    started_at: float


@attrs.frozen
class HeartbeatRequest:
    """Renew one held row's lease (and write its progress, when given).

    ``step``: the step the run is in now (``None``: between steps), written to
    the attempt log's current entry in the same statement."""

    job_id: str
    fence: Fence
    progress: Progress | None = None
    step: StepMark | None = None


# --------------------------------------------------------------------------- attempts

#: How an attempt ended: settled ``done``, ``retried`` (a counted hand-back),
#: ``handed-back`` (uncounted), ``suspended``, buried ``dead``/``failed``, its
#: lease ``lapsed``, or ``cancelled`` by an operator while it ran.
AttemptOutcome = Literal[
    "done", "retried", "handed-back", "suspended", "dead", "failed", "lapsed", "cancelled"
]

#: The error an attempt log entry records when a lease lapsed under its claim.
LAPSED_LINE = "the lease lapsed: the worker holding it died or stopped renewing it"
#: The error an attempt log entry records when an operator cancelled the job
#: while the claim ran (with ``X_ABORTED``).
CANCELLED_LINE = "cancelled by an operator while it ran"


@attrs.frozen
class AttemptRecord:
    """One claim of a job, as its attempt log keeps it (the newest
    :data:`MAX_ATTEMPT_LOG`, oldest first).

    The driver writes it inside the statements it already runs: the claim
    opens the entry (``attempt``, ``worker_id``, ``started_at``); the settle,
    the reap of a lapsed lease, a hand-back of an orphan or an operator's
    cancel closes it (``ended_at``, ``outcome``, and the error's code and the
    first line of its message, at most :data:`MAX_ATTEMPT_ERROR` characters);
    a heartbeat writes the step in progress (``step``, ``step_started_at``).
    ``outcome`` is ``None`` while the claim holds. ``attempt`` is the counted
    attempt the claim took: an uncounted hand-back (``handed-back``,
    ``suspended``) is followed by an entry with the same number."""

    attempt: int
    worker_id: str
    started_at: float
    ended_at: float | None = None
    outcome: str | None = None
    error_code: str | None = None
    error: str | None = None
    step: str | None = None
    step_started_at: float | None = None


def first_line(message: str | None) -> str | None:
    """The first line of an error message, cut at :data:`MAX_ATTEMPT_ERROR`
    characters (an attempt log entry keeps no more)."""
    if not message:
        return None
    line = message.split("\n", 1)[0].rstrip()
    if len(line) > MAX_ATTEMPT_ERROR:
        line = line[: MAX_ATTEMPT_ERROR - 1] + "…"
    return line or None


def nack_outcome(options: NackOptions) -> str:
    """What a hand-back ends its attempt as: ``dead``/``failed`` for good,
    ``suspended``, ``retried`` (counted) or ``handed-back`` (uncounted: a drain,
    a sleep, a busy key, an outage)."""
    if options.state in ("dead", "failed", "suspended"):
        return options.state
    return "retried" if options.counted else "handed-back"


# --------------------------------------------------------------------------- steps


@attrs.frozen
class StepRecord:
    """A step's durable record, keyed by ``(job_id, name)``.

    ``seq`` orders records by when they were first recorded. ``wake_at`` is a
    sleep's wake time; ``event``/``since``/``deadline`` a wait's."""

    name: str
    status: StepStatus
    seq: int
    executions: int = 0
    output: Any = None
    error: str | None = None
    error_code: str | None = None
    wake_at: float | None = None
    event: str | None = None
    since: float | None = None
    deadline: float | None = None
    #: When the step began (its first execution on this claim, a sleep or a
    #: wait when it was recorded) and when it ended (completed or failed), on
    #: the driver's clock as the worker reads it; ``None`` when not recorded.
    started_at: float | None = None
    ended_at: float | None = None


@attrs.frozen
class ChildState:
    """A child job as its parent's ``step.invoke``/``step.gather`` reads it:
    its state, and, once settled, its stored result or its error."""

    id: str
    state: JobState
    result: Any = None
    error_code: str | None = None

    @property
    def settled(self) -> bool:
        return self.state not in LIVE_STATES


class StepStore(Protocol):
    """Step persistence, on the same store as the queue.

    ``shielded`` is declared (a plain attribute): ``True`` when :meth:`put`
    outlives a cancel of its caller and answers within a bounded time of its own
    (the caller's cancel is raised at its next checkpoint), so the caller needs
    no shielded scope around it; ``False``: the caller shields it."""

    shielded: bool

    async def children(self, ids: Sequence[str]) -> list[ChildState]:
        """The rows ``ids`` (a parent's children), in the order asked; an id no
        row holds (removed) reads as ``cancelled``."""
        ...

    async def load(self, job_id: str) -> list[StepRecord]:
        """Every record of ``job_id``, in ``seq`` order."""
        ...

    async def put(self, job_id: str, fence: Fence, record: StepRecord) -> bool:
        """Insert or replace one record, only while ``fence`` holds the row.

        Answers whether it landed; it is durable when this returns ``True``."""
        ...


@attrs.frozen
class EventRecord:
    """One published event, as the bus stored it (``published_at`` on the bus's clock)."""

    id: int
    name: str
    payload: Any
    published_at: float


class EventStore(Protocol):
    """Where ``publish_event`` stores events and ``step.wait_for_event`` polls them."""

    async def publish(self, name: str, payload: Any) -> None:
        """Store an event and make every run waiting for ``name`` due now."""
        ...

    async def poll(self, name: str, since: float) -> tuple[list[EventRecord], float]:
        """Events named ``name`` published at or after ``since``, oldest first, and
        the bus's own now."""
        ...


# --------------------------------------------------------------------------- leases


@attrs.frozen
class LeaseGrant:
    """``slot`` is the slot taken, or ``None`` when every slot is held. ``own``:
    every holder blocking the call is the same job (its own earlier claim)."""

    slot: int | None
    own: bool = False


class LeaseStore(Protocol):
    """Fleet-wide slot counting: one row per held slot, keyed ``(lease_key, slot)``.

    A lease is renewed by the holder's heartbeat and released by its settle; one
    that is not renewed expires after ``ttl``.

    Declared capability (read as a plain attribute, never probed):
    :attr:`wakes_waiters`."""

    @property
    def wakes_waiters(self) -> bool:
        """Whether every release of a slot (settle, reap, cancel, :meth:`release`)
        makes the first run waiting on its key due at once (see
        ``NackOptions.busy_key``); the worker then hands a busy run back for a
        visibility timeout instead of a poll interval. A store that cannot
        answers ``False`` (the default to declare)."""
        ...

    async def acquire(
        self, lease_key: str, limit: int, job_id: str, fence: Fence, ttl: float
    ) -> LeaseGrant: ...

    async def release(self, job_id: str) -> None: ...

    async def held(self, lease_key: str) -> int: ...


# --------------------------------------------------------------------------- rate limits


@attrs.frozen
class RateGrant:
    """What a rate-limit acquisition answers: ``granted``, or the seconds until
    one would be (``retry_after``, more than 0 when refused; 0 when granted)."""

    granted: bool
    retry_after: float = 0.0


class RateLimitStore(Protocol):
    """Sliding-window rate limits kept in the driver's store (``rate_limiter()``).

    One log per ``(name, key)``: an acquisition at the store's now is granted and
    recorded while fewer than ``limit`` were granted in the ``per`` seconds
    before it, so at most ``limit`` are granted in any interval of length
    ``per``; one refused records nothing and answers when the oldest
    acquisition that must leave the window leaves it. Decided on the store's
    own clock (the database's, the Redis server's), in one atomic statement, so
    acquirers in many processes share one budget.

    Declared capability (read as a plain attribute, never probed):
    :attr:`shared`."""

    @property
    def shared(self) -> bool:
        """Whether every process of the fleet reaches this same store. ``False``
        for a store in one process's memory: a ``scope="shared"`` limiter over it
        refuses (``X_RATE_LIMIT_NOT_SHARED``) unless the worker is the whole
        fleet (``Worker(fleet="single")``)."""
        ...

    async def acquire(self, name: str, key: str, limit: int, per: float) -> RateGrant: ...


# --------------------------------------------------------------------------- stats / views


@attrs.frozen
class QueueStats:
    """Rows per state in one queue; ``depth`` is what waits to run."""

    queue: str
    ready: int = 0
    delayed: int = 0
    running: int = 0
    suspended: int = 0
    done: int = 0
    failed: int = 0
    dead: int = 0
    cancelled: int = 0

    @property
    def depth(self) -> int:
        """Rows waiting to run: ready, delayed and suspended."""
        return self.ready + self.delayed + self.suspended


@attrs.frozen
class StepView:
    """One step of a job as the operator surface shows it."""

    name: str
    status: str
    executions: int
    output: Any = None
    error: str | None = None
    started_at: float | None = None
    ended_at: float | None = None

    @property
    def duration(self) -> float | None:
        """Seconds from start to end, when both are recorded."""
        if self.started_at is None or self.ended_at is None:
            return None
        return max(0.0, self.ended_at - self.started_at)


@attrs.frozen
class JobView:
    """One job as the operator surface shows it (``steps`` may be empty in a list row)."""

    id: str
    run_id: str
    name: str
    queue: str
    state: JobState
    attempts: int
    max_attempts: int
    tenant_id: str | None
    idempotency_key: str
    concurrency_key: str | None
    run_at: float
    created_at: float
    error_code: str | None = None
    last_error: str | None = None
    progress: Progress | None = None
    result: Any = None
    steps: Sequence[StepView] = ()
    payload: Any = None
    priority: int = 0
    updated_at: float | None = None
    worker_id: str | None = None
    #: Whether the row was enqueued for a job declared ``sensitive=True``;
    #: ``None`` when the row does not say (enqueued before the flag was stored):
    #: a reader without the job's handle then treats it as sensitive.
    sensitive: bool | None = None
    #: The newest claims of the job, oldest first (``show`` fills it; a list
    #: row leaves it empty): see :class:`AttemptRecord`.
    attempt_log: Sequence[AttemptRecord] = ()
    #: For a run of a :func:`~trio_jobs.consumer` (``show`` fills it; ``None``
    #: otherwise): ``{"key", "last_batch_at", "lag"}`` — the run's key, when its
    #: last batch committed (Unix seconds, or ``None``) and what ``lag=`` last
    #: answered (or ``None``).
    consumer: Mapping[str, Any] | None = None
    #: The run whose ``step.invoke``/``step.gather`` enqueued this one (``None``
    #: for a job with no parent), and the ids of the runs this one enqueued so
    #: (``show`` fills it; empty for a leaf), oldest first.
    parent_id: str | None = None
    children: Sequence[str] = ()


@attrs.frozen
class JobPage:
    """A keyset page of jobs, newest first; pass ``after``/``before`` to move."""

    rows: Sequence[JobView]
    after: str | None = None
    before: str | None = None


def _check_state(_inst: object, _attr: attrs.Attribute[Any], state: str | None) -> None:
    if state is not None and state not in ALL_STATES:
        raise JobsError(ErrorCode.X_INVARIANT, f"state must be one of {ALL_STATES}")


def _check_limit(_inst: object, _attr: attrs.Attribute[Any], limit: int) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_JOB_PAGE:
        raise JobsError(
            ErrorCode.X_JOB_PAGE_INVALID,
            f"limit must be between 1 and {MAX_JOB_PAGE}; page with .after for more",
        )


def _check_text(_inst: object, attr: attrs.Attribute[Any], value: str | None) -> None:
    # A filter value no driver can store matches no row; PostgreSQL would
    # raise on it instead, so every driver refuses it the same way.
    if isinstance(value, str):
        check_text(value, what=f"the {attr.name} filter", code=ErrorCode.X_INVARIANT)


def _check_cursors(inst: ListFilter, _attr: attrs.Attribute[Any], before: str | None) -> None:
    if before is not None and inst.after is not None:
        raise JobsError(ErrorCode.X_INVARIANT, "pass after or before, not both")


@attrs.frozen
class ListFilter:
    """What ``list`` filters on, and the page it asks for.

    Validated once, where it is built (every layer after it trusts it): a
    ``state`` outside :data:`ALL_STATES` or both ``after`` and ``before`` is
    ``X_INVARIANT``, and so is a text filter holding a character no driver
    stores (NUL); a ``limit`` outside 1..:data:`MAX_JOB_PAGE` is
    ``X_JOB_PAGE_INVALID``. (A cursor that does not decode is the driver's
    ``X_JOB_PAGE_INVALID``.)"""

    queue: str | None = attrs.field(default=None, validator=_check_text)
    name: str | None = attrs.field(default=None, validator=_check_text)
    state: str | None = attrs.field(default=None, validator=_check_state)
    tenant_id: str | None = attrs.field(default=None, validator=_check_text)
    id_prefix: str | None = attrs.field(default=None, validator=_check_text)
    created_from: float | None = None
    created_to: float | None = None
    limit: int = attrs.field(default=50, validator=_check_limit)
    after: str | None = None
    before: str | None = attrs.field(default=None, validator=_check_cursors)


@attrs.frozen
class BulkFilter:
    """What a bulk operation (``remove_many``, ``requeue_many``, ``promote_many``) touches.

    Validated where it is built: a ``state`` outside :data:`ALL_STATES`, or a
    text filter holding a character no driver stores (NUL), is ``X_INVARIANT``."""

    state: str = attrs.field(validator=_check_state)
    queue: str | None = attrs.field(default=None, validator=_check_text)
    name: str | None = attrs.field(default=None, validator=_check_text)
    tenant_id: str | None = attrs.field(default=None, validator=_check_text)


BulkAction = Literal["remove", "requeue", "promote"]


@attrs.frozen
class BulkPreview:
    """What a bulk operation would do, written nowhere: ``count`` rows would move
    if it were called until ``remaining`` is 0 now, and ``sample`` is the first
    of them, in the order it would take them (oldest first)."""

    count: int
    sample: Sequence[JobView] = ()


@attrs.frozen
class BulkResult:
    """A bulk operation's answer: rows it changed and rows still left (call again until 0).

    It unpacks as the pair the spec answers: ``affected, remaining = await
    jobs.remove_many(state="dead")``.
    """

    affected: int
    remaining: int

    def __iter__(self) -> Iterator[int]:
        return iter((self.affected, self.remaining))


@attrs.frozen
class WorkerInfo:
    """A live worker: id, host, pid, start, queues, slots, in-flight job ids, last heartbeat."""

    id: str
    host: str
    pid: int
    started_at: float
    queues: Sequence[str]
    slots: Mapping[str, int]
    in_flight: Sequence[str] = ()
    last_heartbeat: float = 0.0


@attrs.frozen
class CounterRow:
    """History for one job name in one time bucket (tiers: 1 min / 24 h, 5 min / 7 d, 1 h / 30 d)."""

    bucket: float
    name: str
    done: int = 0
    retried: int = 0
    failed: int = 0
    dead: int = 0
    duration: float = 0.0
    #: The queue the job settled in (the last one, should a job name have moved
    #: between queues within the bucket); ``None`` for a row written before
    #: counters carried it.
    queue: str | None = None


class JobIntrospection(Protocol):
    """The operator surface. The CLI, the dashboard and tests read nothing else."""

    async def show(self, job_id: str) -> JobView: ...
    async def resolve_id(self, prefix: str) -> str:
        """The id of the one job whose id starts with ``prefix``: the start of a
        lowercase canonical id, at least :data:`MIN_ID_PREFIX` characters (the
        facade checks its form). ``X_JOB_NOT_FOUND`` when no job matches;
        ``X_ID_AMBIGUOUS`` when several do, with up to five of them in
        ``meta["matches"]``."""
        ...

    async def list(self, filter: ListFilter) -> JobPage: ...
    async def requeue(self, job_id: str, from_step: str | None = None) -> JobView: ...
    async def cancel(self, job_id: str, reason: str | None = None) -> JobView: ...
    async def remove(self, job_id: str) -> None: ...
    async def remove_many(self, filter: BulkFilter) -> BulkResult: ...
    async def requeue_many(self, filter: BulkFilter) -> BulkResult: ...
    async def promote(self, job_id: str) -> JobView: ...
    async def promote_many(self, filter: BulkFilter) -> BulkResult: ...
    async def preview_many(
        self, action: BulkAction, filter: BulkFilter, sample: int
    ) -> BulkPreview:
        """A dry run of ``<action>_many(filter)``, writing nothing: how many rows it
        would move, called until ``remaining`` is 0, and the first ``sample`` of
        them (0 to :data:`MAX_PREVIEW_SAMPLE`), oldest first. A filter the action
        refuses is refused alike (``remove`` of running rows, ``requeue`` of live
        ones, ``promote`` of a state it does not move)."""
        ...

    async def resolve_step(
        self, job_id: str, step: str, *, ran: bool, output: Any = None
    ) -> None: ...
    async def pause_queue(self, queue: str) -> None: ...
    async def resume_queue(self, queue: str) -> None: ...
    async def paused_queues(self) -> builtins.list[str]: ...
    async def record_worker(self, info: WorkerInfo, ttl: float) -> None: ...
    async def remove_worker(self, worker_id: str) -> None: ...
    async def workers(self) -> builtins.list[WorkerInfo]: ...
    async def counters(self, name: str | None, since: float) -> builtins.list[CounterRow]: ...
    async def purge(self, done_before: float, dead_before: float, limit: int) -> int:
        """Retention: delete up to ``limit`` terminal rows and their steps, ``done``
        rows settled before ``done_before``, ``dead``/``failed``/``cancelled`` ones
        before ``dead_before``; answers how many went. A live row never goes."""
        ...


class AckBatches(Protocol):
    """The optional batched ack: the worker's ack pipeline hands it the acks
    its slots finished, a batch at a time, while the slots go on to their next
    attempts (``docs/explanation/design-choices.md``, "Acks leave the slot")."""

    async def ack_many(self, acks: Sequence[tuple[str, AckOptions]]) -> list[bool]:
        """Each ``(job_id, options)`` settled as :meth:`JobDriver.ack` would, in
        as few statements as the driver can: one answer per ack, in order
        (``True``: landed; ``False``: refused by its fence). A failure raises for
        the whole batch (``JobsError``), and the driver then treats the next
        settle of each of its claims as a retry whose first try may have landed,
        as :meth:`JobDriver.ack` does after a call that raised."""
        ...


# --------------------------------------------------------------------------- the driver


@runtime_checkable
class JobDriver(Protocol):
    """What every driver implements. Optional capabilities are attributes that
    are ``None`` when the driver lacks them: ``leases``, ``rate_limits``,
    ``introspect``, ``wake``, ``backfills``, ``tasks``, ``acks``.
    Declared capabilities are plain attributes every driver provides (the worker
    reads them, never probes them): :attr:`closed`, :attr:`event_poll_default`,
    ``LeaseStore.wakes_waiters``, ``RateLimitStore.shared`` and ``WakeSource.live``."""

    @property
    def name(self) -> str: ...

    @property
    def closed(self) -> bool:
        """``True`` once :meth:`close` ran (``False`` when built and after
        :meth:`open`): a write that fails on a closed driver is final, never
        retried."""
        ...

    @property
    def event_poll_default(self) -> float:
        """Seconds between a waiting run's re-checks for its event when the job
        declares no ``event_poll``. ``30.0`` is the default to declare; a driver
        whose publish makes its waiters due at once may declare a longer backstop
        (PostgreSQL: ``900.0``)."""
        ...

    @property
    def steps(self) -> StepStore: ...

    @property
    def events(self) -> EventStore: ...

    @property
    def leases(self) -> LeaseStore | None: ...

    @property
    def rate_limits(self) -> RateLimitStore | None: ...

    @property
    def introspect(self) -> JobIntrospection | None: ...

    @property
    def wake(self) -> WakeSource | None: ...

    @property
    def backfills(self) -> BackfillLedger | None:
        """The backfill ledger (``drivers/_backfills.py``), or ``None``: a
        ``backfill()`` pass then runs with no bookkeeping."""

    @property
    def tasks(self) -> TaskStore | None:
        """The scheduled tasks' store (watermarks, leases, pauses); ``None``: the
        driver runs no scheduler."""
        ...

    @property
    def acks(self) -> AckBatches | None:
        """Many slots' acks in one call (:class:`AckBatches`), or ``None``: every
        slot then awaits its own :meth:`ack`."""
        ...

    def transaction(self) -> AbstractAsyncContextManager[DriverTransaction]:
        """A transaction that enqueues and publishes join; it commits on a clean exit."""
        ...

    async def open(self) -> None:
        """Connect and prepare (migrations, pools). Constructing does no I/O.

        For a driver used outside ``open_jobs``: whatever background tasks it
        needs run outside any nursery of the caller (the fallback)."""
        ...

    def open_in(self, nursery: trio.Nursery) -> AbstractAsyncContextManager[None]:
        """Open like :meth:`open` for the block, every background task of the
        driver (write combiners, push sessions) running in ``nursery``; leaving
        the block closes it (:meth:`close`) and its tasks are gone. ``open_jobs``
        enters it in a task of its own nursery, so the driver's tasks are
        descendants of the task that entered ``open_jobs``. A driver with no
        background tasks opens, yields and closes."""
        ...

    async def close(self) -> None: ...

    def now(self) -> float:
        """The driver's notion of now, for the worker's local decisions only."""
        ...

    async def enqueue_many(self, requests: Sequence[EnqueueRequest]) -> list[EnqueueResult]:
        """Stage up to ``ENQUEUE_CHUNK`` rows in one round trip, deduped on the live
        ``(name, tenant_id, idempotency_key)``; answers one result per request in order."""
        ...

    async def claim(self, options: ClaimOptions) -> ClaimResult: ...

    async def ack(self, job_id: str, options: AckOptions) -> bool: ...

    async def nack(self, job_id: str, options: NackOptions) -> bool: ...

    async def heartbeat(
        self, requests: Sequence[HeartbeatRequest], visibility_timeout: float
    ) -> list[str]:
        """Renew each held row's lease (and its concurrency leases) in one round
        trip; one :class:`HeartbeatStatus` value per request."""
        ...

    async def release_orphans(self, worker_id: str, held: frozenset[int]) -> list[str]:
        """Hand back, **uncounted**, every row running under ``worker_id`` whose
        lease still holds and whose claim is not in ``held`` (the claims the worker
        knows it holds): rows a claim took whose answer never reached the worker
        (the connection dropped after the claim committed). Each goes back
        ``ready``, due at once, its concurrency leases released, with
        ``X_DRIVER_UNAVAILABLE`` as its error. Answers their ids. A worker calls it
        after a claim failed, before it claims again; otherwise such rows would
        wait for their lease to lapse and be counted."""
        ...

    async def stats(self) -> list[QueueStats]: ...

    async def attempt_log(self, job_id: str) -> list[AttemptRecord]:
        """The job's attempt log, oldest first (at most :data:`MAX_ATTEMPT_LOG`
        entries; empty for an id no row has). The claims, settles, reaps and
        heartbeats write it in their own statements: reading it is the only
        call it costs."""
        ...


class DriverTransaction(Protocol):
    """A driver-side transaction: staged enqueues and events commit or vanish with it."""

    async def enqueue_many(self, requests: Sequence[EnqueueRequest]) -> list[EnqueueResult]: ...

    async def publish(self, name: str, payload: Any) -> None: ...

    async def execute(
        self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()
    ) -> list[tuple[Any, ...]]: ...

    async def put_step(self, job_id: str, fence: Fence, record: StepRecord) -> bool:
        """Write one step record inside this transaction, only while ``fence``
        holds the row (``ctx.step.transaction``): it commits with the app's
        writes or vanishes with them. Answers whether the fence held; the
        record is durable once the transaction commits. A fence that holds at
        this call must still hold at the commit (the row stays locked, or the
        commit applies nothing)."""
        ...


class WakeSource(Protocol):
    """A push hook: a driver that can announce new work offers one.

    Declared capability (read as a plain attribute, never probed): :attr:`live`."""

    @property
    def live(self) -> bool:
        """``True`` once the wake is proven to deliver (the worker then idles up
        to 5 s between polls instead of 2 s); ``False`` (the default to declare)
        until then. Polling stays the guarantee."""
        ...

    async def wait(self, queues: Sequence[str], timeout: float) -> bool:
        """Return ``True`` when work may have arrived on ``queues``, ``False`` on timeout.

        ``timeout`` may be ``math.inf``: the caller's cancel scope bounds the wait
        (the worker's idle wait does so, one scope for the wait and its timeout)."""
        ...
