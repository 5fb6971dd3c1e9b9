"""The worker: a nursery of slots per queue, one claimer, one heartbeat task.

A slot is a task of the worker's nursery that runs attempt after attempt: the
claimer hands each claimed job to a parked slot task (or starts one, up to the
worker's capacity), so no task is spawned per job. Each attempt runs in a fresh
copy of the slot's initial ``contextvars`` context (nothing a body sets leaks
into the next job) and in one cancel scope, which carries the job's
``timeout``, the drain and cancellation, and then the ack's write budget. The
slot records *why* it cancels on ``ctx.signal`` before cancelling, and turns
that reason into the spec's outcome once the body has stopped.
"""

from __future__ import annotations

import contextvars
import functools
import heapq
import inspect
import logging
import math
import os
import socket
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs
import outcome
import trio

from . import _ambient, _observe, _rate, _tracing
from ._attempt import Attempt, Phase
from ._context import (
    RESERVED_STEP,
    WRITE_BUDGET,
    BoundaryHook,
    Handback,
    InfraFault,
    JobContext,
    LeaseLost,
    ReplayStop,
    RunState,
    Signal,
    _call,
    _describe,
    unwrap,
)
from ._declare import Job
from ._facade import Actor, Jobs
from ._gc_pause import YOUNG_THRESHOLD, check_young_threshold, raised_young_threshold
from ._observe import WorkerObserver
from ._retry import burial, decide
from ._room import share_room
from ._scheduler import scheduler_for
from ._serialization import UnserializableError, json_form
from ._settled import Outcome, Settled
from ._time import Duration, JitterSource, default_jitter, parse_duration
from ._unwind import unwind
from ._validate import text_fault
from ._write_retry import is_transient, retry_transient, write_retrying
from .drivers._protocol import (
    AckBatches,
    AckOptions,
    ClaimedJob,
    ClaimOptions,
    Exhausted,
    HeartbeatRequest,
    HeartbeatStatus,
    JobDriver,
    NackOptions,
    WorkerInfo,
)
from .errors import ErrorCode, JobsError
from .logging import emit, error_line

__all__ = ["Worker", "WorkerStats"]

log = logging.getLogger("trio_jobs")

#: How often progress is written at most, per run.
PROGRESS_INTERVAL = 1.0
#: The idle poll ceiling, and the one while the driver's wake is proven live.
IDLE_POLL_MAX = 2.0
IDLE_POLL_MAX_PROVEN = 5.0
#: The default prefetch claims ahead for a queue whose attempts held their slot
#: less than this on average (seconds): about PREFETCH_AHEAD seconds of its
#: slots' work, at least its slots and at most PREFETCH_MAX jobs.
PREFETCH_QUICK = 0.1
PREFETCH_AHEAD = 0.05
PREFETCH_MAX = 256
#: ... and at most PREFETCH_PACE seconds of the pace this worker has been
#: finishing the queue's attempts at (its share of a fleet that shares the
#: server: rows it holds ahead are rows the other claimers step over).
PREFETCH_PACE = 0.25
#: Attempts of an ``on_settled`` hook.
ON_SETTLED_TRIES = 3
#: The most acks the ack pipeline sends in one call of the driver's ``ack_many``...
ACK_BATCH = 500
#: ... and the most such calls in flight at once (each its own statement, on rows
#: no other holds: a batch waits on the server while the next one is sent).
ACK_IN_FLIGHT = 2
#: While a call is in flight, a batch of fewer acks than this waits for its
#: answer (or for this many acks, or ACK_HOLD seconds) rather than go as a
#: statement of its own: each statement costs the server about as much as
#: dozens of rows of one, and a fleet of workers that each sent ack after ack
#: spent the server on statements (benchmarks/README.md, "Fleet").
ACK_FILL = 64
ACK_HOLD = 0.5


@attrs.frozen
class WorkerStats:
    """A snapshot of one worker: slots in use, capacity, and what it settled."""

    in_flight: int
    capacity: int
    max_in_flight: int | None
    done: int
    retried: int
    dead_lettered: int
    failed: int
    drained: int
    leases_lost: int
    abandoned: int
    #: Runs handed back uncounted because the library's own statements for them
    #: met an infrastructure fault (a lost connection, a deadlock) past its retries.
    faulted: int = 0
    #: Jobs claimed ahead of need, waiting for a free slot of their queue (not
    #: in ``in_flight``; see ``Worker(prefetch=)``).
    prefetched: int = 0


def _claim_key(claimed: ClaimedJob) -> tuple[str, int]:
    return (claimed.id, claimed.fence.claim)


def _progress_due(state: RunState | None, now: float) -> bool:
    """Progress is written at most once a second per run (the settle writes the last)."""
    return (
        state is not None
        and state.progress_dirty
        and now - state.progress_written_at >= PROGRESS_INTERVAL - 1e-9
    )


def _bounded_shield() -> trio.CancelScope:
    """One shielded scope with the write budget as its own deadline: a write that
    must land past a cancel, but never hangs (one scope, not two, on the settle path)."""
    return trio.CancelScope(shield=True, deadline=trio.current_time() + WRITE_BUDGET)


#: WorkerStats counter -> the outcome an observer and a span are told.
_OUTCOME = {
    "done": "done",
    "retried": "retried",
    "dead_lettered": "dead",
    "failed": "failed",
    "drained": "drained",
    "abandoned": "abandoned",
    "leases_lost": "lease-lost",
    "faulted": "faulted",
}


#: Endings worth a log line of their own: a retry, and a run that failed for good.
_ENDINGS = {
    "retried": (logging.INFO, "jobs.attempt.retried"),
    "dead_lettered": (logging.WARNING, "jobs.job.dead-lettered"),
    "failed": (logging.WARNING, "jobs.job.failed"),
    "faulted": (logging.WARNING, "jobs.attempt.faulted"),
}


def _log(level: int, event: str, **fields: Any) -> None:
    emit(log, level, event, **fields)


class Worker:
    """Claims jobs of the facade's handles and runs each in a slot.

    ``concurrency`` is the worker's slots per queue (an ``int`` gives every
    served queue that many); a job's own ``concurrency`` is the fleet-wide cap,
    enforced on top. ``prefetch`` is how many jobs a queue may hold claimed
    ahead of need, not yet started (an ``int``, or a mapping per queue; ``0``
    none; ``None``, the default: while the queue's attempts are quick, about
    50 ms of its slots' work, at most 0.25 s of the pace this worker has been
    finishing them at, at least its slots, at most 256). ``max_in_flight`` caps the whole process. ``observer``
    (a :class:`WorkerObserver`, e.g. ``trio_jobs.web.PrometheusObserver()``)
    is told when slots are taken and freed, attempts end and leases are lost.
    ``rate_per_tenant=(limit, per)`` caps the bodies of one tenant this process
    starts in any ``per`` (a run over it is deferred uncounted before its body
    starts); ``fleet="single"`` says this worker is the whole fleet, so a shared
    ``rate_limiter`` may live in the memory driver. ``gc_young_threshold``
    (10,000 by default) is the garbage collector's youngest-generation threshold
    while the worker runs: raised to it if the process's is lower (CPython's is
    700), put back when the last running worker ends; ``None`` leaves the
    collector alone (docs/explanation/design-choices.md).

    >>> async with trio.open_nursery() as nursery:
    ...     await nursery.start(worker.run)   # returns once the worker is claiming
    ...     await worker.drain()              # what SIGTERM does
    """

    def __init__(
        self,
        jobs: Jobs,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int | Mapping[str, int] = 8,
        max_in_flight: int | None = None,
        poll_interval: Duration = "250ms",
        idle_poll_max: Duration | None = None,
        visibility_timeout: Duration = "30s",
        drain_timeout: Duration = "30s",
        heartbeat_interval: Duration | None = None,
        worker_id: str | None = None,
        jitter: JitterSource | None = None,
        boundary: BoundaryHook | None = None,
        event_poll: Duration | None = None,
        observer: WorkerObserver | None = None,
        fleet: _rate.Fleet = "many",
        rate_per_tenant: tuple[int, Duration] | None = None,
        prefetch: int | Mapping[str, int] | None = None,
        gc_young_threshold: int | None = YOUNG_THRESHOLD,
    ) -> None:
        if not isinstance(jobs, Jobs):
            raise JobsError(
                ErrorCode.X_CONFIG_INVALID, "Worker(jobs) takes the facade open_jobs yielded"
            )
        self.jobs = jobs
        if queues is None:
            queues = sorted({h.queue for h in jobs.handles.values()}) or ["default"]
        if (
            isinstance(queues, str)
            or not queues
            or not all(isinstance(q, str) and q and text_fault(q) is None for q in queues)
        ):
            raise JobsError(
                ErrorCode.X_CONFIG_INVALID,
                "queues must be a non-empty list of queue names (without NUL characters)",
            )
        self.queues: list[str] = list(dict.fromkeys(queues))
        self.slots: dict[str, int] = {}
        for q in self.queues:
            n = concurrency.get(q, 0) if isinstance(concurrency, Mapping) else concurrency
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise JobsError(
                    ErrorCode.X_CONFIG_INVALID,
                    f"concurrency for queue {q!r} must be a whole number, 1 or more",
                )
            self.slots[q] = n
        if max_in_flight is not None and (
            isinstance(max_in_flight, bool)
            or not isinstance(max_in_flight, int)
            or max_in_flight < 1
        ):
            code = ErrorCode.X_INVARIANT if max_in_flight == 0 else ErrorCode.X_CONFIG_INVALID
            raise JobsError(
                code, "max_in_flight must be a whole number, 1 or more (or None for no cap)"
            )
        self.max_in_flight = max_in_flight
        #: The collector's youngest-generation threshold while this worker runs
        #: (raised to it if lower; None: untouched; see _gc_pause).
        self.gc_young_threshold = check_young_threshold(gc_young_threshold)
        #: Claimed ahead of need, per queue: how many jobs beyond its slots a
        #: queue may hold claimed and not yet started, as given; a queue not
        #: given one (``prefetch=None``, or missing from the mapping) claims
        #: as many as its slots ahead while its bodies are quick (see _room).
        self.prefetch: dict[str, int | None] = {}
        for q in self.queues:
            extra = prefetch.get(q) if isinstance(prefetch, Mapping) else prefetch
            if extra is not None and (
                isinstance(extra, bool) or not isinstance(extra, int) or extra < 0
            ):
                raise JobsError(
                    ErrorCode.X_CONFIG_INVALID,
                    f"prefetch for queue {q!r} must be a whole number, 0 or more "
                    "(or None: its slots while its jobs are quick)",
                )
            self.prefetch[q] = extra
        #: Per queue, a moving average of how long its attempts held a slot
        #: (inf before the first): the default prefetch claims ahead only
        #: while it is under PREFETCH_QUICK.
        self._took: dict[str, float] = dict.fromkeys(self.queues, math.inf)
        #: Per queue, a moving average of the time between two of its attempts
        #: freeing their slot, and when the last did (the worker's own pace).
        self._gap: dict[str, float] = dict.fromkeys(self.queues, math.inf)
        self._freed_at: dict[str, float] = dict.fromkeys(self.queues, math.inf)
        self.poll_interval = parse_duration(poll_interval, field="poll_interval")
        # None: 2 s, and 5 s while the driver's wake is proven live (the spec's default).
        self._idle_poll_max_set = (
            parse_duration(idle_poll_max, field="idle_poll_max")
            if idle_poll_max is not None
            else None
        )
        self.visibility_timeout = parse_duration(visibility_timeout, field="visibility_timeout")
        self.drain_timeout = parse_duration(drain_timeout, field="drain_timeout", allow_zero=True)
        self.heartbeat_interval = (
            parse_duration(heartbeat_interval, field="heartbeat_interval")
            if heartbeat_interval is not None
            else self.visibility_timeout / 3.0
        )
        if self.heartbeat_interval >= self.visibility_timeout:
            raise JobsError(
                ErrorCode.X_CONFIG_INVALID,
                "heartbeat_interval must be shorter than visibility_timeout",
            )
        self.event_poll = (
            parse_duration(event_poll, field="event_poll") if event_poll is not None else None
        )
        self.id = worker_id if worker_id is not None else jobs.ids.new_id()
        self._jitter = jitter if jitter is not None else default_jitter()
        self._boundary = boundary
        #: "single": this worker is the whole fleet (a shared rate limit may live
        #: in its memory); and its per-tenant starts (see _rate).
        self.fleet = _rate.check_fleet(fleet)
        self._tenant_rate = _rate.tenant_rate(rate_per_tenant)
        # Keyed by claim, not by job id: after a lease lapses the same worker may
        # claim the job again while the stale slot is still unwinding.
        self._held: dict[tuple[str, int], Attempt] = {}
        self._progress_wanted = trio.Event()
        self._in_flight: dict[str, int] = dict.fromkeys(self.queues, 0)
        # Of those, per queue: the attempts a slot task runs now (never more
        # than the queue's slots), and those whose ack the pipeline holds (the
        # body is done: they leave the queue's room to the next claim).
        self._running: dict[str, int] = dict.fromkeys(self.queues, 0)
        self._acking: dict[str, int] = dict.fromkeys(self.queues, 0)
        self._rotation = 0
        self._started = False
        self._stopping = False
        self._draining = False
        self._drain_waited = False
        self._finished = trio.Event() if _in_trio() else None
        self._slot_freed: trio.Event | None = None
        # The slot tasks (see _dispatch): parked ones wait for an attempt.
        self._parked: list[trio.lowlevel.Task] = []
        # Claimed, not yet started (claimed ahead of need, or no slot task was
        # free), per queue, in claim order; _ready_n counts them all.
        self._ready: dict[str, deque[Attempt]] = {q: deque() for q in self.queues}
        self._ready_n = 0
        self._services: trio.Nursery | None = None
        self._slot_tasks = 0
        self._slots_closing = False
        self._wait_scope: trio.CancelScope | None = None
        self._idle: trio.Event | None = None
        # When the rows this worker handed back (retries, sleeps, event waits)
        # fall due, on the driver's clock: an idle wait never outlasts the next.
        self._due_at: list[float] = []
        #: What the last claim said of the next row to fall due (driver clock):
        #: None when the driver does not say.
        self._next_due: float | None = None
        self._counts = dict.fromkeys(
            (
                "done",
                "retried",
                "dead_lettered",
                "failed",
                "drained",
                "leases_lost",
                "abandoned",
                "faulted",
            ),
            0,
        )
        self._started_at = 0.0
        self._observer = _observe.guarded(observer)
        #: Told of every attempt's move before it is checked (the simulation
        #: fails on an illegal one); None in production.
        self._on_move: Callable[[Attempt, Phase, Phase], None] | None = None
        #: A claim failed with a transient error: it may have committed rows
        #: whose answer never came (see _release_orphans).
        self._orphans_possible = False
        # The ack pipeline (see _ack_loop): the driver's batched ack while the
        # worker runs (None: each slot awaits its own ack), and the acks the
        # slots handed it: (attempt, options, write deadline, when the slot was
        # taken or None for no observer), in the order handed.
        self._ack_sink: AckBatches | None = None
        self._acks: list[tuple[Attempt, AckOptions, float, float | None]] = []
        self._acks_kick: trio.Event | None = None
        self._acks_closing = False
        self._acks_sending = 0
        self._acks_sent = 0
        #: Awaited before the pipeline takes each batch; None in production. The
        #: simulation's arbiter grants it, so which acks form a batch is the
        #: seed's choice, never Trio's scheduler order.
        self._ack_gate: Callable[[], Awaitable[None]] | None = None

    # ------------------------------------------------------------------ public

    def stats(self) -> WorkerStats:
        capacity = sum(self.slots.values())
        if self.max_in_flight is not None:
            capacity = min(capacity, self.max_in_flight)
        return WorkerStats(
            in_flight=len(self._held) - self._ready_n,
            capacity=capacity,
            max_in_flight=self.max_in_flight,
            prefetched=self._ready_n,
            **self._counts,
        )

    @property
    def idle_poll_max(self) -> float:
        """The idle poll ceiling: as given, else 2 s, or 5 s while the wake is proven."""
        if self._idle_poll_max_set is not None:
            return self._idle_poll_max_set
        wake = self.driver.wake
        return IDLE_POLL_MAX_PROVEN if wake is not None and wake.live else IDLE_POLL_MAX

    @property
    def driver(self) -> JobDriver:
        """The driver this worker claims from: its facade's."""
        return self.jobs.driver

    def _check_capabilities(self) -> None:
        if self.driver.leases is None:
            capped = sorted(
                h.name
                for h in self.jobs.handles.values()
                if h.concurrency is not None and h.queue in self.queues
            )
            if capped:
                raise JobsError(
                    ErrorCode.X_JOB_CONCURRENCY_UNENFORCEABLE,
                    f"the {self.driver.name} driver has no lease store, so it cannot hold a fleet-wide "
                    f"concurrency cap; these jobs declare one: {', '.join(capped)}",
                    meta={"jobs": capped},
                )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Claim and run jobs until :meth:`drain` or :meth:`stop`; returns normally
        after either. Cancelling the scope around it is a drain with no budget."""
        await self._serve(task_status=task_status, until_quiet=False)

    async def run_until_quiet(self) -> None:
        """Claim and run every due job until nothing is due and nothing is held
        (the harness and the simulation use this)."""
        await self._serve(task_status=trio.TASK_STATUS_IGNORED, until_quiet=True)

    async def drain(self) -> None:
        """Abort every held job with ``X_DRAINING``, wait up to ``drain_timeout``
        for the bodies, hand them back uncounted (or name them abandoned), and
        return once :meth:`run` has returned. A no-op before ``run()`` started."""
        if not self._started:
            return
        if not self._drain_waited:
            self._drain_waited = True
            self.begin_drain()
            with trio.move_on_after(self.drain_timeout):
                await self._wait_idle()
            for held in list(self._held.values()):
                # A settle in flight (retrying an outage, within its budget) is not a
                # body still running: its own answer names how the run ended.
                if held.phase not in (Phase.ABANDONED, Phase.SETTLED, Phase.SETTLING):
                    held.move(Phase.ABANDONED)
                    self._count("abandoned", held)
                    _log(
                        logging.WARNING,
                        "jobs.drain.abandoned",
                        job_id=held.claimed.id,
                        job=held.claimed.name,
                        attempt=held.claimed.attempt,
                        code=ErrorCode.X_DRAINING,
                    )
        assert self._finished is not None
        await self._finished.wait()

    def begin_drain(self) -> None:
        """The synchronous half of :meth:`drain`: stop claiming and abort every held
        job's signal with ``X_DRAINING`` now (a signal handler or the simulation
        calls it); :meth:`drain` then waits."""
        if not self._started or self._draining:
            return
        self._draining = True
        self._stop_claiming()
        self._hand_back_unstarted()
        for held in list(self._held.values()):
            held.abort(ErrorCode.X_DRAINING, f"worker {self.id} is draining (SIGTERM or drain())")

    async def stop(self) -> None:
        """Stop claiming and wait for held work without aborting it; then ``run()`` returns."""
        if not self._started:
            return
        self._stop_claiming()
        assert self._finished is not None
        await self._finished.wait()

    # ------------------------------------------------------------------ the loop

    def _stop_claiming(self) -> None:
        self._stopping = True
        if self._wait_scope is not None:
            self._wait_scope.cancel()
        if self._slot_freed is not None:
            self._slot_freed.set()

    async def _wait_idle(self) -> None:
        while self._held:
            self._idle = trio.Event()
            await self._idle.wait()

    async def _serve(self, *, task_status: trio.TaskStatus[None], until_quiet: bool) -> None:
        if self._started and not until_quiet:
            raise JobsError(ErrorCode.X_CONFIG_INVALID, "a Worker runs once; make a new Worker")
        self._check_capabilities()
        scheduler = None if until_quiet else scheduler_for(self.jobs, self.queues, self.id)
        self._started = True
        if self._finished is None or self._finished.is_set():
            self._finished = trio.Event()
        self._stopping = False
        self._started_at = self.driver.now()
        self._observer.worker_started(self.id, self.stats().capacity)
        fleet = _ambient.fleet_var.set(self.fleet)  # the slots inherit it
        gc_raised = raised_young_threshold(self.gc_young_threshold)
        gc_raised.__enter__()
        try:
            async with trio.open_nursery() as services:
                # (open until the slots and the acks are done: a drain's
                # hand-backs of unstarted jobs run here, see _hand_back_unstarted)
                self._services = services
                services.start_soon(self._heartbeat_loop)
                services.start_soon(self._progress_loop)
                services.start_soon(self._watch_cancel)
                if scheduler is not None:  # the tasks of the queues it serves
                    services.start_soon(scheduler.run)
                # Slots and settle hooks live in their own nursery, which exits
                # only once every one of them has finished; the ack pipeline
                # around it exits after that, once every ack they handed it
                # has its answer.
                self._slots_closing = False
                async with trio.open_nursery() as acking:
                    sink = self.driver.acks
                    self._ack_sink = sink
                    self._acks_closing = False
                    if sink is not None:
                        acking.start_soon(self._ack_loop, sink, acking)
                    try:
                        async with trio.open_nursery() as work:
                            task_status.started()
                            try:
                                await self._claim_loop(work, until_quiet=until_quiet)
                            finally:
                                self._close_slots()
                    finally:
                        self._ack_sink = None
                        self._acks_closing = True
                        if self._acks_kick is not None:
                            self._acks_kick.set()
                services.cancel_scope.cancel()
        finally:
            gc_raised.__exit__(None, None, None)
            self._services = None
            _ambient.fleet_var.reset(fleet)
            self._finished.set()
            self._observer.worker_stopped(self.id, self.stats().capacity)
            intro = self.driver.introspect
            if intro is not None and not until_quiet:
                with _bounded_shield():
                    try:
                        await intro.remove_worker(self.id)
                    except Exception:
                        pass

    def _room(self, skip: frozenset[str] = frozenset()) -> dict[str, int]:
        """This worker's free room split over its queues (:func:`_room.share_room`).

        A queue's room is its slots plus its prefetch (:meth:`_prefetch_of`:
        jobs claimed ahead of need, started as its slots free up), less its
        *active* attempts (held, their ack not yet handed to the pipeline); the
        attempts whose ack the pipeline holds may take as much again, so a
        queue never holds more than ``2 * (slots + prefetch)`` rows.
        ``max_in_flight`` caps the active attempts of the whole process (a
        worker at the cap claims nothing)."""
        slots, in_flight, acking = self.slots, self._in_flight, self._acking
        limit: dict[str, int] = {}
        used: dict[str, int] = {}
        active_n = 0
        for q in self.queues:
            active = in_flight[q] - acking[q]
            active_n += active
            limit[q] = slots[q] + self._prefetch_of(q)
            used[q] = max(active, in_flight[q] - limit[q])
        return share_room(
            self.queues,
            limit,
            used,
            held=active_n,
            max_in_flight=self.max_in_flight,
            rotation=self._rotation,
            skip=skip,
        )

    def _prefetch_of(self, q: str) -> int:
        """Queue ``q``'s prefetch now: as given; by default its slots while its
        attempts are quick (a job claimed ahead waits about one attempt for its
        slot: a long wait for a long job another worker could have run), else 0."""
        given = self.prefetch[q]
        if given is not None:
            return given
        took, slots = self._took[q], self.slots[q]
        if took >= PREFETCH_QUICK:
            return 0
        ahead = int(slots * PREFETCH_AHEAD / took) if took > 0 else PREFETCH_MAX
        gap = self._gap[q]
        if 0 < gap < math.inf:
            # No more than PREFETCH_PACE of what this worker has been getting through.
            ahead = min(ahead, int(PREFETCH_PACE / gap))
        return max(slots, min(ahead, PREFETCH_MAX))

    def _took_slot(self, q: str, seconds: float) -> None:
        took = self._took[q]
        self._took[q] = seconds if took == math.inf else 0.8 * took + 0.2 * seconds
        now = trio.current_time()
        last, self._freed_at[q] = self._freed_at[q], now
        if last < math.inf:
            gap = self._gap[q]
            # An idle spell counts as one slow gap, not as the pace of the next burst.
            between = min(max(0.0, now - last), PREFETCH_PACE)
            self._gap[q] = between if gap == math.inf else 0.95 * gap + 0.05 * between

    def _claim_due(self) -> bool:
        """Whether to claim now: room for a batch (half the prefetch: a claim
        asks for a batch, not for the one row an attempt just freed), or any
        room while a slot task could start a job and none is waiting."""
        want = self._room()
        if not want:
            return False
        low = sum(self._prefetch_of(q) for q in want) // 2
        if sum(want.values()) >= max(1, low):
            return True
        return self._ready_n == 0 and sum(self._running.values()) < self._capacity()

    async def _claim_pass(self, nursery: trio.Nursery, drop: frozenset[str]) -> tuple[int, bool]:
        """One pass: claim the room, then hand what a queue that came back short
        leaves to the queues that filled their share. Answers how many jobs were
        claimed and whether the claim buried any rows."""
        claimed_n = 0
        buried = False
        skip: frozenset[str] = frozenset()
        while True:
            want = self._room(skip)
            if not want:
                break
            result = await self.driver.claim(
                ClaimOptions(
                    worker_id=self.id,
                    queues=want,
                    visibility_timeout=self.visibility_timeout,
                    drop_names=drop,
                )
            )
            self._next_due = result.next_due
            for ex in result.exhausted:
                nursery.start_soon(self._exhausted, ex)
            buried = buried or bool(result.exhausted)
            now = trio.current_time()
            got = dict.fromkeys(want, 0)
            # Whether spans record, asked once per claim, not once per attempt (an
            # os.environ lookup inside OpenTelemetry while no SDK is installed).
            traced = _tracing.recording() if result.jobs else False
            for claimed in result.jobs:
                held = Attempt(claimed, now, self._on_move)
                held.traced = traced
                if self._draining:
                    # Claimed by a statement that was in flight when the drain began:
                    # hand it straight back, uncounted.
                    held.abort(ErrorCode.X_DRAINING, f"worker {self.id} is draining")
                self._held[_claim_key(claimed)] = held
                self._in_flight[claimed.queue] += 1
                got[claimed.queue] = got.get(claimed.queue, 0) + 1
                self._dispatch(nursery, held)
            claimed_n += len(result.jobs)
            served = [q for q in want if got[q] > 0]
            if served:
                # The next pass starts after the last queue served: none starves.
                self._rotation = (self.queues.index(served[-1]) + 1) % len(self.queues)
            short = frozenset(q for q in want if got[q] < want[q])
            if short == frozenset(want):
                break  # every queue asked came back short: nothing more is due
            skip |= short
        return claimed_n, buried

    async def _claim_loop(self, nursery: trio.Nursery, *, until_quiet: bool) -> None:
        _ambient.role_var.set("claim")
        delay = self.poll_interval
        drop = frozenset(h.name for h in self.jobs.handles.values() if not h.retry.dead_letter)
        while not self._stopping:
            if not self._claim_due():
                self._slot_freed = trio.Event()
                await self._slot_freed.wait()
                continue
            try:
                if self._orphans_possible:
                    await self._release_orphans()
                claimed_n, buried = await self._claim_pass(nursery, drop)
            except JobsError as exc:
                _log(logging.WARNING, "jobs.claim.failed", code=exc.code, worker_id=self.id)
                # The claim may have committed with its answer lost: its rows run
                # under this worker, unknown to it. Hand them back before the next.
                self._orphans_possible = self._orphans_possible or is_transient(exc)
                await self._idle_wait(delay)
                delay = min(delay * 2, self.idle_poll_max)
                continue
            if claimed_n:
                delay = self.poll_interval
                if self._room() and not until_quiet:
                    # Room left: every queue came back short, nothing more is due.
                    await self._idle_wait(self._quiet_delay(delay))
                else:
                    await trio.lowlevel.checkpoint()
                continue
            if until_quiet:
                if not self._held:
                    if buried:
                        continue  # the claim buried rows: look again before calling it quiet
                    return
                self._slot_freed = trio.Event()
                await self._slot_freed.wait()
                continue
            await self._idle_wait(self._quiet_delay(delay))
            delay = min(delay * 2, self.idle_poll_max)

    async def _release_orphans(self) -> None:
        """Hand back, uncounted, the rows a claim took whose answer never came (a
        failed claim may have committed): the driver's ``release_orphans`` with
        the claims this worker holds."""
        held = frozenset(claim for _id, claim in self._held)
        released = await self.driver.release_orphans(self.id, held)
        self._orphans_possible = False
        if released:
            _log(
                logging.WARNING,
                "jobs.claim.orphans-released",
                worker_id=self.id,
                count=len(released),
                code=ErrorCode.X_DRIVER_UNAVAILABLE,
            )

    def _quiet_delay(self, delay: float) -> float:
        """How long to wait after a claim that left nothing due. The backoff
        guesses when a row another worker delayed falls due; a driver that says
        when the next one does (``ClaimResult.next_due``), behind a live wake that
        announces new work, makes the guess moot: wait up to the idle ceiling
        (``_idle_wait`` stops at that row's due time)."""
        next_due = self._next_due
        if next_due is None:
            return delay
        wake = self.driver.wake
        if wake is None or not wake.live:
            return delay
        if next_due <= self.driver.now():
            return delay  # due, yet not claimed (a paused queue): keep backing off
        return self.idle_poll_max

    async def _idle_wait(self, timeout: float) -> None:
        next_due = self._next_due
        if self._due_at or next_due is not None:
            now = self.driver.now()
            while self._due_at and self._due_at[0] <= now:
                heapq.heappop(self._due_at)  # due: the claim before this wait saw it
            if self._due_at:
                timeout = min(timeout, self._due_at[0] - now)
            if next_due is not None and next_due > now:
                timeout = min(timeout, next_due - now)
        # The one scope of the wait carries its timeout: the wake waits without one.
        with trio.CancelScope(deadline=trio.current_time() + timeout) as scope:
            self._wait_scope = scope
            try:
                if self._stopping:
                    return
                wake = self.driver.wake
                if wake is not None:
                    await wake.wait(self.queues, math.inf)
                else:
                    await trio.sleep_forever()
            finally:
                # (the scope is gone: a hand-back or a stop has no wait to end)
                self._wait_scope = None

    # ------------------------------------------------------------------ service tasks

    async def _heartbeat_loop(self) -> None:
        _ambient.role_var.set("heartbeat")
        intro = self.driver.introspect
        while True:
            if intro is not None:
                try:
                    await intro.record_worker(self._info(), self.visibility_timeout)
                except Exception:
                    pass
            next_beat = trio.current_time() + self.heartbeat_interval
            while trio.current_time() < next_beat:
                # Wake when a lease window closes too: the window is measured from the
                # last renewal that landed, so a renewal that hangs is caught when the
                # window closes, the same as one that rejects.
                await trio.sleep_until(min(next_beat, self._next_window_close()))
                self._check_windows()
            await self._beat(progress_only=False)

    def _window_close(self, held: Attempt) -> float:
        return held.last_landed + self.visibility_timeout

    def _watched(self) -> list[Attempt]:
        return [h for h in self._held.values() if h.watched]

    def _next_window_close(self) -> float:
        return min((self._window_close(h) for h in self._watched()), default=math.inf)

    def _check_windows(self) -> None:
        now = trio.current_time()
        for held in self._watched():
            if now >= self._window_close(held):
                self._lease_lost(held)

    async def _watch_cancel(self) -> None:
        """Cancelling the scope around run() is a drain with no budget: every held
        job's signal aborts with X_DRAINING, which cancels its (shielded) body."""
        try:
            await trio.sleep_forever()
        finally:
            if self._held:
                self._draining = True
                self._stop_claiming()
                self._hand_back_unstarted()
                for held in list(self._held.values()):
                    held.abort(ErrorCode.X_DRAINING, f"worker {self.id} was cancelled")

    def _progress_marked(self) -> None:
        self._progress_wanted.set()

    def _progress_pending(self) -> bool:
        return any(h.state is not None and h.state.progress_dirty for h in self._held.values())

    async def _progress_loop(self) -> None:
        """Write reported progress at most once a second; asleep while no body
        reports any (no wake-up per second per worker for nothing)."""
        _ambient.role_var.set("progress")
        while True:
            await self._progress_wanted.wait()
            await trio.sleep(PROGRESS_INTERVAL)
            self._progress_wanted = trio.Event()
            if self._progress_pending():
                await self._beat(progress_only=True)
            if self._progress_pending():  # not due yet, or its write failed
                self._progress_wanted.set()

    def _info(self) -> WorkerInfo:
        return WorkerInfo(
            id=self.id,
            host=socket.gethostname(),
            pid=os.getpid(),
            started_at=self._started_at,
            queues=list(self.queues),
            slots=dict(self.slots),
            in_flight=[h.claimed.id for h in self._held.values()],
        )

    async def _beat(self, *, progress_only: bool) -> None:
        now = trio.current_time()
        batch: list[Attempt] = []
        for held in list(self._held.values()):
            if held.phase in (Phase.ABANDONED, Phase.SETTLED):
                continue
            state = held.state
            if (
                state is not None
                and state.signal.reason is not None
                and held.phase is not Phase.SETTLING
            ):
                # (A settle in flight is renewed: the body has ended, and the settle
                # may be retrying an outage within its budget.)
                if held.abort_at is None:
                    held.abort_at = now
                if now - held.abort_at >= self.drain_timeout:
                    # The body ignores its abort: stop renewing so the lease lapses
                    # and the queue redelivers the job (the attempt is counted).
                    held.move(Phase.ABANDONED)
                    self._count("abandoned", held)
                    continue
            if progress_only and not _progress_due(state, now):
                continue
            batch.append(held)
        if not batch:
            return
        requests = []
        carried: list[RunState] = []
        for held in batch:
            progress = None
            if held.state is not None and _progress_due(held.state, now):
                progress = held.state.progress
                held.state.progress_dirty = False
                held.state.progress_written_at = now
                carried.append(held.state)
            step = held.state.step_now if held.state is not None else None
            requests.append(HeartbeatRequest(held.claimed.id, held.claimed.fence, progress, step))
        statuses: list[str] | None = None
        cause, failed_code = "timeout", str(ErrorCode.X_DRIVER_UNAVAILABLE)
        # Bounded by the heartbeat interval and by the first lease window to close.
        budget = min(self.heartbeat_interval, min(self._window_close(h) for h in batch) - now)
        with trio.move_on_after(max(0.0, budget)) as scope:
            try:
                # A transient failure (a dropped connection, a deadlock the server
                # broke) is retried within the same budget: a renewal is idempotent.
                statuses = await write_retrying(
                    lambda: self.driver.heartbeat(requests, self.visibility_timeout),
                    deadline=scope.deadline,
                    gone=lambda: self.driver.closed,
                    about=lambda: (
                        f"heartbeat:{self.id}",
                        "jobs.heartbeat.retry",
                        {"worker_id": self.id, "jobs": len(requests)},
                    ),
                )
            except Exception as exc:
                statuses = None
                cause = type(exc).__name__
                if isinstance(exc, JobsError):
                    failed_code = str(exc.code)
        if statuses is None:
            # The progress it carried did not land: the next beat carries it again
            # (a settle always writes the last value anyway).
            for state in carried:
                state.progress_dirty = True
            for held in batch:
                _log(
                    logging.WARNING,
                    "jobs.heartbeat.failed",
                    job_id=held.claimed.id,
                    job=held.claimed.name,
                    attempt=held.claimed.attempt,
                    code=failed_code,
                    worker_id=self.id,
                    cause=cause,
                )
                if held.phase is not Phase.SETTLED and trio.current_time() >= self._window_close(
                    held
                ):
                    self._lease_lost(held)
            return
        landed = trio.current_time()
        for held, status in zip(batch, statuses, strict=True):
            if status == HeartbeatStatus.OK:
                held.last_landed = landed
            elif status == HeartbeatStatus.CANCELLED:
                held.abort(ErrorCode.X_ABORTED, "an operator cancelled the job")
            elif held.phase in (Phase.SETTLED, Phase.ABANDONED):
                pass  # settled while the renewal was in flight, or left to lapse
            elif held.phase is Phase.SETTLING:
                # This worker's settle of the row is in flight and may have just
                # landed (the row is then no longer running): the settle's own
                # answer decides, in _settle_write.
                held.lost_while_settling = True
            else:
                self._lease_lost(held)

    def _lease_lost(self, held: Attempt) -> None:
        if held.phase in (Phase.LOST, Phase.SETTLED) or (
            held.state is not None
            and held.state.signal.reason is not None
            and held.state.signal.reason.code == ErrorCode.X_JOB_LEASE_LOST
        ):
            return
        self._count("leases_lost", held, ErrorCode.X_JOB_LEASE_LOST)
        _log(
            logging.ERROR,
            "jobs.lease.lost",
            job_id=held.claimed.id,
            job=held.claimed.name,
            attempt=held.claimed.attempt,
            queue=held.claimed.queue,
            code=ErrorCode.X_JOB_LEASE_LOST,
            worker_id=self.id,
        )
        held.abort(
            ErrorCode.X_JOB_LEASE_LOST, "the job's lease lapsed: another worker may hold it now"
        )
        held.lose()

    # ------------------------------------------------------------------ a slot

    def _dispatch(self, nursery: trio.Nursery, held: Attempt) -> None:
        """Start a claimed attempt when its queue has a free slot and a slot task
        can take it: hand it to a parked slot task, or start one while there
        are fewer than the worker's capacity. Else queue it (claimed ahead of
        need) for the next slot task that finishes one of that queue's jobs."""
        q = held.claimed.queue
        running = self._running
        if running[q] < self.slots[q] and not self._ready[q]:
            if self._parked:
                running[q] += 1
                trio.lowlevel.reschedule(self._parked.pop(), outcome.Value(held))
                return
            if self._slot_tasks < self._capacity():
                running[q] += 1
                self._slot_tasks += 1
                nursery.start_soon(self._slot_task, held)
                return
        self._ready[q].append(held)
        self._ready_n += 1

    def _next_ready(self) -> Attempt | None:
        """A slot task finished an attempt: the next claimed one whose queue has
        a free slot (queues in order), counted running; None when there is none."""
        if not self._ready_n:
            return None
        running, slots = self._running, self.slots
        for q, ready in self._ready.items():
            if ready and running[q] < slots[q]:
                self._ready_n -= 1
                running[q] += 1
                return ready.popleft()
        return None

    def _left(self, held: Attempt) -> None:
        """A slot task is done with ``held`` (settled, or its ack handed to the
        pipeline): a slot of its queue is free; a parked slot task takes any
        waiting attempt that this frees beyond the one the leaving task takes."""
        self._running[held.claimed.queue] -= 1

    def _wake_parked(self) -> None:
        while self._parked and self._ready_n:
            nxt = self._next_ready()
            if nxt is None:
                return
            trio.lowlevel.reschedule(self._parked.pop(), outcome.Value(nxt))

    def _hand_back_unstarted(self) -> None:
        """A drain: every attempt claimed ahead of need and not yet started goes
        back to its queue at once, uncounted (its body never ran)."""
        nursery = self._services
        if nursery is None or not self._ready_n:
            return
        for ready in self._ready.values():
            while ready:
                held = ready.popleft()
                self._ready_n -= 1
                nursery.start_soon(self._unstarted_back, held)

    async def _unstarted_back(self, held: Attempt) -> None:
        claimed = held.claimed
        try:
            with _bounded_shield():
                if await self._nack(
                    held, NackOptions(fence=claimed.fence, state="ready", counted=False)
                ):
                    self._count("drained", held, ErrorCode.X_DRAINING)
        except Exception:
            self._slot_failed(claimed)
        finally:
            self._freed(held, None)

    def _capacity(self) -> int:
        total = sum(self.slots.values())
        return total if self.max_in_flight is None else min(total, self.max_in_flight)

    def _close_slots(self) -> None:
        """The claimer stopped: parked slot tasks end; busy ones end after their attempt."""
        self._slots_closing = True
        parked, self._parked = self._parked, []
        for task in parked:
            trio.lowlevel.reschedule(task, outcome.Value(None))

    async def _slot_task(self, first: Attempt) -> None:
        """Run attempts one after another, each in a fresh copy of this task's
        initial context, parking between them.

        The common attempt (:meth:`_fast`) runs inline in one cancel scope that
        this task keeps across attempts: entering a Trio cancel scope is the
        dearest step of a no-op job, and a scope that nothing cancelled can carry
        the next attempt as well (its deadline is set per attempt). A scope that
        was cancelled (a timeout, a drain, an abort, a spent write budget) cannot
        be reused: the task leaves it, runs the rest of that attempt outside it,
        and opens a fresh one. Parking inside the shielded scope is safe: parked
        tasks are ended by :meth:`_close_slots`, which the claimer always calls."""
        task = trio.lowlevel.current_task()
        pristine = contextvars.copy_context()
        parked = self._parked

        def abort(_raise_cancel: Any) -> trio.lowlevel.Abort:
            parked.remove(task)
            return trio.lowlevel.Abort.SUCCEEDED

        held: Attempt | None = first
        nxt: Attempt | None
        try:
            while held is not None:
                rest: Callable[[], Awaitable[None]] | None = None
                with trio.CancelScope(shield=True) as scope:
                    while held is not None:
                        rest = await self._fast(held, scope)
                        if rest is not None or scope.cancel_called:
                            break
                        self._left(held)
                        # The next attempt, inline (one wake a job: the claimer's).
                        nxt = self._next_ready()
                        held = None  # (the finished attempt dies here, not at the next)
                        if nxt is not None:
                            held = nxt
                            self._wake_parked()
                            task.context = pristine.copy()
                            await trio.lowlevel.cancel_shielded_checkpoint()
                        elif not self._slots_closing:
                            task.context = pristine.copy()
                            parked.append(task)
                            held = await trio.lowlevel.wait_task_rescheduled(abort)
                    else:
                        return
                if rest is not None:
                    await rest()
                    rest = None
                assert held is not None
                self._left(held)
                nxt = self._next_ready()
                held = None
                if nxt is not None:
                    held = nxt
                    self._wake_parked()
                    task.context = pristine.copy()
                    # The next step runs in the fresh context; no Cancelled here
                    # (the attempt is ours now, and _slot answers for it).
                    await trio.lowlevel.cancel_shielded_checkpoint()
                elif not self._slots_closing:
                    task.context = pristine.copy()
                    held = await self._park(task)
        finally:
            self._slot_tasks -= 1
            if held is not None:
                self._left(held)

    async def _park(self, task: trio.lowlevel.Task) -> Attempt | None:
        self._parked.append(task)

        def abort(_raise_cancel: Any) -> trio.lowlevel.Abort:
            self._parked.remove(task)
            return trio.lowlevel.Abort.SUCCEEDED

        held: Attempt | None = await trio.lowlevel.wait_task_rescheduled(abort)
        return held

    def _fast_handle(self, held: Attempt) -> Job[Any, Any] | None:
        """The attempt's job when the attempt may take the inline path: nothing
        to await before its body (no concurrency lease, its steps came with the
        claim, no tenant to check or rate to spend), no unwind, no span, no
        ``on_settled`` hook, no abort already pending. Else None: the general
        path (:meth:`_slot`) runs it, in scopes of its own."""
        claimed = held.claimed
        handle = self.jobs.handle(claimed.name)
        if (
            handle is None
            or held.traced
            or held.pending is not None
            or handle.concurrency is not None
            or handle.on_settled is not None
            or claimed.steps is None
            or claimed.tenant_id is not None
            or self._tenant_rate is not None
            or (handle.compensates and claimed.attempt > handle.retry.attempts)
        ):
            return None
        for r in claimed.steps:
            if r.name == RESERVED_STEP:
                return None
        return handle

    async def _fast(
        self, held: Attempt, scope: trio.CancelScope
    ) -> Callable[[], Awaitable[None]] | None:
        """One attempt in the slot task's own ``scope`` (shielded, uncancelled,
        deadline infinite on entry), flat: the body, then its ack on the same
        scope under the write budget. Answers None when the attempt is over;
        otherwise what is left of it (the general path, or a slower verdict),
        which the slot task runs outside ``scope``."""
        handle = self._fast_handle(held)
        if handle is None:
            return functools.partial(self._slot, held)
        claimed = held.claimed
        try:
            value = handle.parse(claimed.payload)
        except JobsError:
            return functools.partial(self._slot, held)
        _ambient.role_var.set(f"job:{claimed.id}")
        observer = self._observer
        quiet = observer is _observe.NOOP_OBSERVER
        if not quiet:
            observer.slot_taken(claimed.queue, claimed.name)
        began = trio.current_time()
        rest: Callable[[], Awaitable[None]] | None = None
        handed = False
        try:
            state = RunState(
                jobs=self.jobs,
                driver=self.driver,
                handle=handle,
                claimed=claimed,
                input=value,
                steps=claimed.steps,  # type: ignore[arg-type]
                unwinding=False,
                boundary=self._boundary,
                event_poll=self.event_poll or self.driver.event_poll_default,
            )
            if claimed.actor:
                state.actor = Actor.from_json(claimed.actor)
            state.on_progress = self._progress_marked
            held.attach(state)
            ctx: JobContext[Any] = JobContext(state)
            timeout = handle.timeout
            started = began
            if timeout is not None:
                deadline = began + timeout
                scope.deadline = deadline
                state.signal._attach(scope, deadline)
            else:
                state.signal._attach(scope)
            # The body, with the ambient context set (what _body does, flat).
            held.start()
            result: Any = None
            exc: BaseException | None = None
            handback: Handback | InfraFault | None = None
            tokens = (
                _ambient.run_var.set(state),
                _ambient.facade_var.set(self.jobs),
                _ambient.actor_var.set(state.actor),
                _ambient.tx_var.set(None),
            )
            try:
                result = handle.run(ctx)
                if inspect.isawaitable(result):
                    result = await result
            except (Handback, InfraFault) as hb:
                handback = hb
            except (LeaseLost, ReplayStop):
                pass
            except trio.Cancelled:
                # This scope's own cancellation (the shield keeps out every
                # other): the signal says why, and the slower verdict settles it.
                result = None
                if state.signal.reason is None:
                    # Nothing aborted it: never ack a body that did not finish.
                    exc = JobsError(
                        ErrorCode.X_INVARIANT,
                        "the attempt's cancel scope was cancelled with no reason on its "
                        "signal (a bug of the worker's slot loop)",
                    )
            except BaseException as err:
                found = unwrap(err)
                if isinstance(found, Handback | InfraFault):
                    handback = found
                elif isinstance(found, LeaseLost | ReplayStop | trio.Cancelled):
                    pass
                elif isinstance(found, KeyboardInterrupt | SystemExit):
                    raise
                else:
                    exc = found
            finally:
                _ambient.run_var.reset(tokens[0])
                _ambient.facade_var.reset(tokens[1])
                _ambient.actor_var.reset(tokens[2])
                _ambient.tx_var.reset(tokens[3])
            state.verdict = (result, exc, handback)
            output: Any = None
            slow = (
                exc is not None
                or handback is not None
                or state.lost
                or held.phase is not Phase.RUNNING
                or state.signal.reason is not None
                or scope.cancel_called
            )
            if not slow:
                try:
                    output = json_form(result)
                except UnserializableError:
                    slow = True
            if slow:
                rest = functools.partial(self._rest, held, handle, state, value, started, began)
                return rest  # _rest frees the slot: not the finally below
            if state.boundary is not None:
                await state.hit("before-settle", None)
            # An abort from here on (a drain, a lost lease) no longer reaches
            # the ack: the body is done.
            state.signal._detach(scope)
            now = trio.current_time()
            ack = AckOptions(
                fence=claimed.fence, result=output, duration=now - started, progress=state.progress
            )
            if self._ack_sink is not None:
                # Handed to the ack pipeline: the slot goes on to its next
                # attempt; the attempt is held (renewed) until the ack's answer,
                # its room going to the next claim (see _room), and only what
                # settling needs stays alive meanwhile (Attempt.let_go).
                if timeout is not None:
                    scope.deadline = math.inf
                held.settling()
                held.let_go()
                del state, ctx
                self._hand_ack(held, ack, now + WRITE_BUDGET, None if quiet else began)
                handed = True
                self._took_slot(claimed.queue, now - began)
                return None
            # The ack's write budget on the same scope.
            scope.deadline = now + WRITE_BUDGET
            # What only the body needed dies now, not after the ack's round trip
            # (fewer objects alive across the wait: less for the collector).
            held.let_go()
            del ctx, tokens, value, result, state
            try:
                # (a partial, not a lambda: no Python frame on the ack's wake)
                landed = await self._settle_write(
                    claimed,
                    "ack",
                    functools.partial(self.driver.ack, claimed.id, ack),
                    held,
                    scope=scope,
                )
            except trio.Cancelled:
                landed = False  # the write budget ran out: the ack is unowned
            if landed:
                self._count("done", held)
            else:
                self._unowned(held)
            if not scope.cancel_called:
                scope.deadline = math.inf
        except Exception:
            self._slot_failed(claimed)
        finally:
            if rest is None and not handed:
                self._took_slot(claimed.queue, trio.current_time() - began)
                self._freed(held, None if quiet else began)
        return None

    # ------------------------------------------------------------------ the ack pipeline

    def _hand_ack(
        self, held: Attempt, ack: AckOptions, deadline: float, began: float | None
    ) -> None:
        """Queue a finished attempt's ack for :meth:`_ack_loop` (its write budget
        runs until ``deadline``); the slot does not wait for it."""
        acks = self._acks
        acks.append((held, ack, deadline, began))
        if (len(acks) == 1 or len(acks) == ACK_FILL) and self._acks_kick is not None:
            self._acks_kick.set()
        # The body is done: its room goes to the next claim (see _room).
        self._acking[held.claimed.queue] += 1
        if self._slot_freed is not None:
            self._slot_freed.set()

    async def _ack_loop(self, sink: AckBatches, nursery: trio.Nursery) -> None:
        """The ack pipeline: sends the acks the slots handed off, a batch per
        call of the driver's ``ack_many`` (up to ``ACK_IN_FLIGHT`` calls at
        once; the acks handed meanwhile form the next batch, and a batch of
        fewer than ``ACK_FILL`` waits for a call in flight, at most
        ``ACK_HOLD`` seconds, unless the worker is closing), and settles each
        attempt by its answer (:meth:`_acked`). It owns the acks in flight: shielded, so a cancel of
        the worker still sends them (each within its write budget), and it
        returns only once the slots are gone and every ack has its answer."""
        _ambient.role_var.set("ack")
        hold_until: float | None = None
        with trio.CancelScope(shield=True):
            while True:
                if not self._acks or self._acks_sending >= ACK_IN_FLIGHT:
                    if not self._acks and not self._acks_sending and self._acks_closing:
                        return
                    self._acks_kick = trio.Event()
                    await self._acks_kick.wait()
                    continue
                if self._acks_sending and len(self._acks) < ACK_FILL and not self._acks_closing:
                    # A small batch waits for the call in flight (ACK_FILL).
                    now = trio.current_time()
                    if hold_until is None:
                        hold_until = now + ACK_HOLD
                    # Against the deadline itself, not ``now - start < ACK_HOLD``:
                    # the two can disagree in the last bit, and a hold whose
                    # deadline had passed would then wait on it again and again
                    # without time moving (a seeded simulation spun so).
                    if now < hold_until:
                        self._acks_kick = trio.Event()
                        with trio.move_on_at(hold_until):
                            await self._acks_kick.wait()
                        continue
                hold_until = None
                if self._ack_gate is not None:
                    await self._ack_gate()
                batch = self._acks[:ACK_BATCH]
                del self._acks[:ACK_BATCH]
                self._acks_sending += 1
                self._acks_sent += 1
                nursery.start_soon(self._send_acks, sink, batch, nursery, self._acks_sent)
                # Let the send start before the next batch forms: what the slots
                # hand over meanwhile joins it.
                await trio.lowlevel.cancel_shielded_checkpoint()

    async def _send_acks(
        self,
        sink: AckBatches,
        batch: list[tuple[Attempt, AckOptions, float, float | None]],
        nursery: trio.Nursery,
        n: int,
    ) -> None:
        """One batch (the ``n``-th): its ``ack_many`` call (shielded, bounded by
        the batch's earliest write budget), then each attempt settled by its answer."""
        _ambient.role_var.set(f"ack:{n}")
        try:
            with trio.CancelScope(shield=True):
                await self._send_batch(sink, batch, nursery)
        finally:
            self._acks_sending -= 1
            if self._acks_kick is not None:
                self._acks_kick.set()

    async def _send_batch(
        self,
        sink: AckBatches,
        batch: list[tuple[Attempt, AckOptions, float, float | None]],
        nursery: trio.Nursery,
    ) -> None:
        answers: list[bool] | None = None
        failure: JobsError | None = None
        try:
            # The earliest budget of the batch bounds the call (handed in order).
            with trio.move_on_at(batch[0][2]):
                answers = await sink.ack_many([(h.claimed.id, o) for h, o, _d, _b in batch])
            if answers is None:
                # The budget ran out with the statement in flight: it may have
                # landed. The acks with budget left retry as after a lost answer.
                failure = JobsError(
                    ErrorCode.X_DRIVER_UNAVAILABLE,
                    "the batched ack's answer did not come within its write budget",
                )
        except JobsError as exc:
            failure = exc
        except Exception:
            log.exception(
                "jobs.worker.ack-failed",
                extra={"event": "jobs.worker.ack-failed", "worker_id": self.id},
            )
        if answers is not None and len(answers) == len(batch):
            for (held, _o, _d, began), landed in zip(batch, answers, strict=True):
                self._acked(held, landed, began)
            return
        for held, options, deadline, began in batch:
            if failure is not None and is_transient(failure):
                # The rest of the write budget, in a task of the pipeline's own.
                nursery.start_soon(self._ack_retry, held, options, deadline, failure, began)
                continue
            if failure is not None:
                _log(logging.ERROR, "jobs.settle.failed", code=failure.code, worker_id=self.id)
            self._acked(held, False, began)

    async def _ack_retry(
        self,
        held: Attempt,
        options: AckOptions,
        deadline: float,
        first: JobsError,
        began: float | None,
    ) -> None:
        """An ack whose batch failed transiently: retried alone with
        :meth:`_write_after` within what is left of its write budget (the
        driver knows the retry may follow a first try that landed)."""
        claimed = held.claimed
        _ambient.role_var.set(f"ack:{claimed.id}:{claimed.fence.claim}")
        landed = False
        try:
            with trio.CancelScope(shield=True, deadline=deadline):
                landed = await self._write_after(
                    claimed,
                    "ack",
                    functools.partial(self.driver.ack, claimed.id, options),
                    self._lease_gone(held),
                    deadline,
                    first,
                )
        except Exception:
            self._slot_failed(claimed)
        finally:
            self._acked(held, landed, began)

    def _acked(self, held: Attempt, landed: bool, began: float | None) -> None:
        """A handed ack's answer: the attempt settles (counted done) or is
        unowned, and its slot's room is free."""
        self._acking[held.claimed.queue] -= 1
        try:
            self._settle_phase(held, landed)
            if landed:
                self._count("done", held)
            else:
                self._unowned(held)
        except Exception:
            self._slot_failed(held.claimed)
        finally:
            self._freed(held, began)

    async def _write_after(
        self,
        claimed: ClaimedJob,
        write: str,
        call: Callable[[], Awaitable[bool]],
        gone: Callable[[], bool],
        deadline: float,
        first: JobsError,
    ) -> bool:
        """A settle's first try raised ``first``: the rest of :meth:`_write` (a
        transient failure retried within the budget; anything else given up)."""
        try:
            if not is_transient(first):
                raise first
            return bool(
                await retry_transient(
                    call,
                    first,
                    deadline=deadline,
                    gone=gone,
                    key=f"{claimed.id}:{claimed.fence.claim}",
                    event="jobs.settle.retry",
                    fields={
                        "job_id": claimed.id,
                        "job": claimed.name,
                        "attempt": claimed.attempt,
                        "worker_id": self.id,
                        "write": write,
                    },
                )
            )
        except JobsError as exc:
            _log(logging.ERROR, "jobs.settle.failed", code=exc.code, worker_id=self.id)
            return False

    async def _rest(
        self,
        held: Attempt,
        handle: Job[Any, Any],
        state: RunState,
        value: Any,
        started: float,
        began: float,
    ) -> None:
        """What is left of an inline attempt whose verdict is not a plain ack:
        settled outside the slot's scope, as the general path settles it."""
        try:
            await self._verdict(held, handle, state, value, started)
        except trio.Cancelled:
            raise
        except Exception:
            self._slot_failed(held.claimed)
        finally:
            self._took_slot(held.claimed.queue, trio.current_time() - began)
            self._freed(held, began if self._observer is not _observe.NOOP_OBSERVER else None)

    def _slot_failed(self, claimed: ClaimedJob) -> None:
        log.exception(
            "jobs.worker.slot-failed",
            extra={
                "event": "jobs.worker.slot-failed",
                "job_id": claimed.id,
                "job": claimed.name,
                "attempt": claimed.attempt,
            },
        )

    def _freed(self, held: Attempt, began: float | None) -> None:
        """The slot is done with ``held``: tell the observer (``began``: when the
        slot was taken, None for no observer), forget the attempt, free its room."""
        claimed = held.claimed
        if began is not None:
            ran = trio.current_time() - began if held.ran else None
            self._observer.slot_freed(claimed.queue, claimed.name, ran)
        self._held.pop((claimed.id, claimed.fence.claim), None)
        # The attempt and its run state point at each other (a refused write
        # tells the attempt): break the cycle, so both go with the slot and not
        # with the next collection of the garbage collector.
        held.detach()
        self._in_flight[claimed.queue] -= 1
        if self._slot_freed is not None:
            self._slot_freed.set()
        if not self._held and self._idle is not None:
            self._idle.set()

    async def _slot(self, held: Attempt) -> None:
        _ambient.role_var.set(f"job:{held.claimed.id}")
        claimed = held.claimed
        self._observer.slot_taken(claimed.queue, claimed.name)
        began = trio.current_time()
        try:
            with _tracing.attempt_span(claimed, self.id, held.traced) as span:
                try:
                    await self._execute(held)
                finally:
                    # No counted ending: a sleep, a wait or a deferral handed it back.
                    _tracing.end_attempt(span, *(held.outcome or ("handed-back", None)))
        except trio.Cancelled:
            raise
        except Exception:
            self._slot_failed(claimed)
        finally:
            self._took_slot(claimed.queue, trio.current_time() - began)
            self._freed(held, began)

    async def _execute(self, held: Attempt) -> None:
        claimed = held.claimed
        handle = self.jobs.handle(claimed.name)
        held.handle = handle
        if handle is None:
            await self._fail(
                held,
                None,
                JobsError(
                    ErrorCode.X_CONFIG_INVALID,
                    f"no job named {claimed.name!r} is registered with this worker; pass it in open_jobs(jobs=[...])",
                ),
                None,
                None,
            )
            return
        try:
            value = handle.parse(claimed.payload)
        except JobsError as exc:
            await self._fail(held, handle, exc, None, None)
            return
        if claimed.tenant_id is not None:
            try:
                declared = handle.tenant_of(value)
            except JobsError as exc:
                await self._fail(held, handle, exc, value, None)
                return
            if declared is not None and declared != claimed.tenant_id:
                await self._fail(
                    held,
                    handle,
                    JobsError(
                        ErrorCode.X_JOB_TENANT_MISMATCH,
                        f"{handle.name}: the row's tenant differs from the tenant its input declares; "
                        "refused before the body ran",
                    ),
                    value,
                    None,
                )
                return
        if handle.concurrency is not None:
            if not await self._take_lease(held, handle, value):
                return
        try:
            steps = (
                list(claimed.steps)
                if claimed.steps is not None
                else await self.driver.steps.load(claimed.id)
            )
        except JobsError as exc:
            await self._fault(held, exc, None)
            return
        if self._tenant_rate is not None:
            # After the lease: a run handed back over `concurrency` spends no start.
            over = self._tenant_rate.refuse(claimed, self.driver.now())
            if over is not None:
                if await self._nack(held, over):
                    _rate.deferred(claimed, over, self.id)
                return
        unwinding = any(r.name == RESERVED_STEP for r in steps) or (
            handle.compensates and claimed.attempt > handle.retry.attempts
        )
        state = RunState(
            jobs=self.jobs,
            driver=self.driver,
            handle=handle,
            claimed=claimed,
            input=value,
            steps=steps,
            unwinding=unwinding,
            boundary=self._boundary,
            event_poll=self.event_poll or self.driver.event_poll_default,
        )
        state.actor = Actor.from_json(claimed.actor)
        state.on_progress = self._progress_marked
        state.traced = held.traced
        # An abort between the claim and now (a drain, a lost lease) applies here.
        held.attach(state)
        if unwinding:
            await unwind(self, held, handle, state, None)
            return
        ctx: JobContext[Any] = JobContext(state)
        started = trio.current_time()
        fast = await self._attempt(held, handle, state, lambda: handle.run(ctx), started)
        if fast is not None:
            # The body returned and its ack went out inside the attempt's scope.
            landed, output = fast
            if landed:
                self._count("done", held)
                if handle.on_settled is not None:
                    await self._on_settled(
                        handle, held, Settled(Outcome.COMPLETED, claimed.id, value, output)
                    )
            else:
                self._unowned(held)
            return
        await self._verdict(held, handle, state, value, started)

    async def _verdict(
        self, held: Attempt, handle: Job[Any, Any], state: RunState, value: Any, started: float
    ) -> None:
        """Settle an attempt whose body ended other than by returning a value to
        ack: an abort, a hand-back, a fault, a failure (or an ack that still
        goes out here: an output with no JSON form is a failure)."""
        claimed = held.claimed
        result, body_exc, handback = state.verdict
        if await self._aborted_verdict(held, handle, state, body_exc):
            return
        duration = trio.current_time() - started
        if isinstance(handback, InfraFault):
            await self._fault(held, handback.error, state, duration)
            return
        if handback is not None:
            await self._nack(
                held,
                NackOptions(
                    fence=claimed.fence,
                    state=handback.state,  # type: ignore[arg-type]
                    counted=False,
                    run_at=handback.run_at,
                    waiting_event=handback.waiting_event,
                    wait_children=handback.wait_children,
                    children_wait=handback.children_wait,
                    progress=state.progress,
                    duration=duration,
                ),
            )
            return
        timeout_reason = state.signal.reason
        if timeout_reason is not None and timeout_reason.code == ErrorCode.X_JOB_TIMEOUT:
            await self._fail(held, handle, timeout_reason, value, state)
            return
        if body_exc is not None:
            await self._fail(held, handle, body_exc, value, state)
            return
        try:
            output = json_form(result)
        except UnserializableError as err:
            await self._fail(
                held,
                handle,
                JobsError(
                    ErrorCode.X_STEP_OUTPUT_UNSERIALIZABLE,
                    f"{handle.name} returned a value with no JSON form ({err}); return plain data",
                ),
                value,
                state,
            )
            return
        await state.hit("before-settle", None)
        ack = AckOptions(
            fence=claimed.fence, result=output, duration=duration, progress=state.progress
        )
        landed = await self._settle_write(
            claimed, "ack", lambda: self.driver.ack(claimed.id, ack), held
        )
        if landed:
            self._count("done", held)
            if handle.on_settled is not None:
                await self._on_settled(
                    handle, held, Settled(Outcome.COMPLETED, claimed.id, value, output)
                )
        else:
            self._unowned(held)

    async def _take_lease(self, held: Attempt, handle: Job[Any, Any], value: Any) -> bool:
        claimed = held.claimed
        try:
            ckey = handle.concurrency_key_for(value)
        except Exception as exc:
            await self._fail(held, handle, exc, value, None)
            return False
        leases = self.driver.leases
        assert leases is not None
        assert handle.concurrency is not None
        lease_key = handle.lease_key(ckey)
        try:
            grant = await leases.acquire(
                lease_key,
                handle.concurrency,
                claimed.id,
                claimed.fence,
                self.visibility_timeout,
            )
        except JobsError as exc:
            await self._fault(held, exc, None)
            return False
        if grant.slot is not None:
            return True
        if handle.when_busy == "fail" and not grant.own:
            message = (
                f"{ErrorCode.X_JOB_KEY_BUSY}: another run holds this job's concurrency key; "
                "the body never ran — `trio-jobs retry ID` re-queues it"
            )
            busy = NackOptions(
                fence=claimed.fence,
                state="failed",
                counted=True,
                error_code=ErrorCode.X_JOB_KEY_BUSY,
                last_error=message,
            )
            landed = await self._settle_write(
                claimed, "nack", lambda: self.driver.nack(claimed.id, busy), held
            )
            if landed:
                self._count("failed", held, ErrorCode.X_JOB_KEY_BUSY)
                await self._on_settled(
                    handle,
                    held,
                    Settled(
                        Outcome.REFUSED, claimed.id, value, None, message, ErrorCode.X_JOB_KEY_BUSY
                    ),
                )
            return False
        # 'wait' (or our own leftover lease): stay queued, attempt uncounted. A lease
        # store that wakes waiters makes the run due when a slot of its key frees,
        # so it waits up to a visibility timeout (the bound for a wake that never
        # comes: a holder whose lease ran out with no settle or reap); otherwise
        # it is tried again a poll later.
        woken = not grant.own and leases.wakes_waiters
        await self._nack(
            held,
            NackOptions(
                fence=claimed.fence,
                state="ready",
                counted=False,
                delay=max(self.visibility_timeout, self.poll_interval)
                if woken
                else self.poll_interval,
                busy_key=lease_key if woken else None,
            ),
        )
        return False

    async def _attempt(
        self,
        held: Attempt,
        handle: Job[Any, Any],
        state: RunState,
        fn: Callable[[], Any],
        started: float,
    ) -> tuple[bool, Any] | None:
        """The body and, when it simply returned, its ack, in one cancel scope.

        The scope carries the job's ``timeout`` while the body runs, then the
        write budget while the ack goes out (one scope per attempt on the common
        path). Answers (landed, output) when the ack went out; otherwise None,
        with the body's outcome on ``state.verdict`` for the slower verdicts,
        which settle in a scope of their own (a cancelled scope cannot be reused)."""
        claimed = held.claimed
        deadline = trio.current_time() + handle.timeout if handle.timeout is not None else math.inf
        state.verdict = (None, None, None)
        acking = False
        landed = False
        output: Any = None
        try:
            # Shielded: the body stops only through its signal (the timeout, a drain,
            # a lost lease, a cancel), so it always hears the reason before it sees
            # trio.Cancelled. Cancelling the scope around run() reaches the body
            # through _watch_cancel, which aborts it with X_DRAINING.
            with trio.CancelScope(deadline=deadline, shield=True) as scope:
                state.signal._attach(scope, deadline)
                result, exc, handback = await self._body(held, state, fn)
                state.verdict = (result, exc, handback)
                if (
                    exc is not None
                    or handback is not None
                    or state.lost
                    or held.phase is not Phase.RUNNING
                    or state.signal.reason is not None
                ):
                    return None
                try:
                    output = json_form(result)
                except UnserializableError:
                    return None
                await state.hit("before-settle", None)
                # The ack's write budget on the same scope; an abort from here on
                # (a drain, a lost lease) no longer cancels it: the body is done.
                state.signal._detach(scope)
                scope.deadline = trio.current_time() + WRITE_BUDGET
                ack = AckOptions(
                    fence=claimed.fence,
                    result=output,
                    duration=trio.current_time() - started,
                    progress=state.progress,
                )
                acking = True
                landed = await self._settle_write(
                    claimed, "ack", lambda: self.driver.ack(claimed.id, ack), held, scope=scope
                )
        except trio.Cancelled:
            await self._cancelled_under(held, state, hand_back=not acking)
            raise
        if not acking:
            return None  # the scope was cancelled under the body: its verdict is slower
        return landed, output

    async def _guarded(
        self, held: Attempt, state: RunState, fn: Callable[[], Any]
    ) -> tuple[Any, BaseException | None, Handback | InfraFault | None]:
        """Run ``fn`` (a compensator, a replay) in a cancel scope of its own with
        the ambient context set; answers what :meth:`_body` answers."""
        handle = state.handle
        deadline = trio.current_time() + handle.timeout if handle.timeout is not None else math.inf
        result: Any = None
        exc: BaseException | None = None
        handback: Handback | InfraFault | None = None
        try:
            with trio.CancelScope(deadline=deadline, shield=True) as scope:
                state.signal._attach(scope, deadline)
                result, exc, handback = await self._body(held, state, fn)
        except trio.Cancelled:
            await self._cancelled_under(held, state, hand_back=True)
            raise
        return result, exc, handback

    async def _cancelled_under(self, held: Attempt, state: RunState, *, hand_back: bool) -> None:
        """The worker's own scope is going away under a run: a drain with no
        budget. The run is handed back uncounted (unless its lease is gone, or
        ``hand_back`` is false: its ack was already on its way)."""
        held.abort(ErrorCode.X_DRAINING, f"worker {self.id} was cancelled")
        with _bounded_shield():
            if hand_back and not state.lost:
                await self._nack(
                    held,
                    NackOptions(
                        fence=state.claimed.fence,
                        state="ready",
                        counted=False,
                        progress=state.progress,
                    ),
                )
                self._count("drained", held, ErrorCode.X_DRAINING)

    async def _body(
        self, held: Attempt, state: RunState, fn: Callable[[], Any]
    ) -> tuple[Any, BaseException | None, Handback | InfraFault | None]:
        """Run ``fn`` with the ambient context set, inside the caller's shielded
        scope. Answers its result, the body's own exception, or how the run was
        handed back without a verdict: a sleep or a wait (:class:`Handback`), or
        an infrastructure fault the library's statements met (:class:`InfraFault`).
        The scope's own cancellation propagates (the caller's ``with`` absorbs it)."""
        result: Any = None
        exc: BaseException | None = None
        handback: Handback | InfraFault | None = None
        held.start()
        tokens = (
            _ambient.run_var.set(state),
            _ambient.facade_var.set(self.jobs),
            _ambient.actor_var.set(state.actor),
            _ambient.tx_var.set(None),
        )
        try:
            result = await _call(fn)
        except (Handback, InfraFault) as hb:
            handback = hb
        except (LeaseLost, ReplayStop):
            pass
        except trio.Cancelled:
            raise
        except BaseException as err:
            found = unwrap(err)
            if isinstance(found, Handback | InfraFault):
                handback = found
            elif isinstance(found, LeaseLost | ReplayStop):
                pass
            elif isinstance(found, KeyboardInterrupt | SystemExit):
                raise
            else:
                exc = found
        finally:
            _ambient.run_var.reset(tokens[0])
            _ambient.facade_var.reset(tokens[1])
            _ambient.actor_var.reset(tokens[2])
            _ambient.tx_var.reset(tokens[3])
        return result, exc, handback

    async def _aborted_verdict(
        self, held: Attempt, handle: Job[Any, Any], state: RunState, exc: BaseException | None
    ) -> bool:
        """Settle a run whose signal aborted for a reason that is not a failure."""
        claimed = held.claimed
        if held.phase is Phase.ABANDONED:
            how = "returned" if exc is None else f"raised {type(exc).__name__}"
            _log(
                logging.WARNING,
                "jobs.timeout.abandoned",
                job_id=claimed.id,
                job=claimed.name,
                attempt=claimed.attempt,
                how=how,
                code=state.signal.reason.code if state.signal.reason else None,
            )
            return True
        reason = state.signal.reason
        if state.lost:
            return True
        if reason is None:
            return False
        if reason.code in (
            ErrorCode.X_JOB_LEASE_LOST,
            ErrorCode.X_ABORTED,
            ErrorCode.X_JOB_SLOT_LOST,
        ):
            return True
        if reason.code == ErrorCode.X_DRAINING:
            await self._nack(
                held,
                NackOptions(
                    fence=claimed.fence,
                    state="ready",
                    counted=False,
                    progress=state.progress,
                ),
            )
            self._count("drained", held, ErrorCode.X_DRAINING)
            return True
        return False

    # ------------------------------------------------------------------ settling

    def _lease_gone(self, held: Attempt | None) -> Callable[[], bool]:
        """Whether retrying a write for ``held`` is pointless: the driver closed, or
        the claim's lease is surely gone as this worker knows it (lost, or its
        window closed with no renewal landing: the database's lease ended earlier)."""
        driver = self.driver
        lost_before = held is not None and held.phase is Phase.LOST

        def gone() -> bool:
            if driver.closed:
                return True
            if held is None:
                return False
            return (
                lost_before
                or held.phase is Phase.LOST
                or trio.current_time() >= self._window_close(held)
            )

        return gone

    async def _settle_write(
        self,
        claimed: ClaimedJob,
        write: str,
        call: Callable[[], Awaitable[bool]],
        held: Attempt | None = None,
        *,
        scope: trio.CancelScope | None = None,
    ) -> bool:
        """One settle (``write``: ack or nack), shielded on the write budget: the
        attempt's own ``scope`` when the caller set its deadline to the budget,
        else a scope of its own. A transient driver failure is retried within
        the budget while the lease holds as this worker knows it
        (``_write_retry``); the driver recognises a retry whose first try
        landed, so a landed settle is never called unowned."""
        landed = False
        gone = self._lease_gone(held)  # (before the move: it notes a loss known now)
        if held is not None:
            held.settling()
        try:
            if scope is not None:
                # The first try bare (the common case: one frame less on its wake).
                try:
                    landed = bool(await call())
                except JobsError as first:
                    landed = await self._write_after(
                        claimed, write, call, gone, scope.deadline, first
                    )
            else:
                with _bounded_shield() as own:
                    landed = await self._write(claimed, write, call, gone, own.deadline)
        finally:
            if held is not None:
                self._settle_phase(held, landed)
        return landed

    def _settle_phase(self, held: Attempt, landed: bool) -> None:
        """A settle's answer moves its attempt: SETTLED when it landed, else
        LOST (a lost lease the heartbeat heard while it was in flight is
        reported as one)."""
        if landed:
            held.move(Phase.SETTLED)
        elif held.lost_while_settling:
            # The heartbeat's `lost` was the truth: the row was not ours to settle.
            self._lease_lost(held)
        elif held.phase is Phase.SETTLING:
            held.move(Phase.LOST)  # unowned: the caller says so

    async def _write(
        self,
        claimed: ClaimedJob,
        write: str,
        call: Callable[[], Awaitable[bool]],
        gone: Callable[[], bool],
        deadline: float,
    ) -> bool:
        """A settle's first try, then (after a failure) :meth:`_write_after`."""
        try:
            return bool(await call())
        except JobsError as first:
            return await self._write_after(claimed, write, call, gone, deadline, first)

    def _count(
        self,
        key: str,
        held: Attempt | None,
        code: str | None = None,
        *,
        queue: str = "",
        name: str = "",
        error: str | None = None,
    ) -> None:
        """Count an ending in :meth:`stats`, tell the observer, and keep it on
        ``held`` for the attempt's span; ``error``: the failure's message, whose
        first line the ending's log line carries (:meth:`_error`)."""
        self._counts[key] += 1
        if held is not None:
            queue, name = held.claimed.queue, held.claimed.name
            held.outcome = (_OUTCOME[key], code)
        if key == "leases_lost":
            self._observer.lease_lost(queue, name)
        else:
            self._observer.attempt_ended(queue, name, _OUTCOME[key])
        logged = _ENDINGS.get(key)
        if held is not None and logged is not None:
            _log(
                logged[0],
                logged[1],
                job_id=held.claimed.id,
                job=name,
                attempt=held.claimed.attempt,
                # a run that spent its attempts on errors without a code died of that
                code=code if code is not None or key == "retried" else ErrorCode.X_JOB_MAX_ATTEMPTS,
                error=self._error(self.jobs.handle(name), error, held.claimed),
                queue=queue,
                worker_id=self.id,
            )

    @staticmethod
    def _error(
        handle: Job[Any, Any] | None, message: str | None, claimed: ClaimedJob
    ) -> str | None:
        """What a log line may say of a failure: the first line of its message,
        with the job's payload and keys that it quotes redacted; nothing for a
        job declared ``sensitive`` (or one this worker does not know)."""
        if message is None or handle is None or handle.sensitive:
            return None
        secrets = (claimed.payload, claimed.idempotency_key, claimed.concurrency_key)
        return error_line(message, redact=secrets)

    def _unowned(self, held: Attempt) -> None:
        if held.outcome is None:
            held.outcome = ("unowned", ErrorCode.X_JOB_LEASE_LOST)
        _log(
            logging.WARNING,
            "jobs.settle.unowned",
            job_id=held.claimed.id,
            job=held.claimed.name,
            attempt=held.claimed.attempt,
            code=ErrorCode.X_JOB_LEASE_LOST,
            worker_id=self.id,
        )

    async def _nack(self, held: Attempt, options: NackOptions) -> bool:
        claimed = held.claimed
        landed = await self._settle_write(
            claimed, "nack", lambda: self.driver.nack(claimed.id, options), held
        )
        if not landed:
            self._unowned(held)
        elif options.state in ("ready", "delayed", "suspended"):
            # A retry or a sleep this worker handed back starts when it falls due,
            # not a poll later.
            run_at = (
                options.run_at
                if options.run_at is not None
                else self.driver.now() + (options.delay or 0.0)
            )
            heapq.heappush(self._due_at, run_at)
            scope = self._wait_scope
            if scope is not None:
                # An idle wait under way (it may be long: see _quiet_delay) ends
                # when this hand-back falls due.
                due = trio.current_time() + max(0.0, run_at - self.driver.now())
                if due < scope.deadline:
                    scope.deadline = due
        return landed

    async def _fault(
        self,
        held: Attempt,
        error: JobsError,
        state: RunState | None,
        duration: float | None = None,
    ) -> None:
        """Hand the run back **uncounted**: the library's own statements for it (a
        step record, ``step.transaction``'s transaction, an event poll, the step
        load or a concurrency lease) met an infrastructure fault and still failed
        after their retries. Only the body's own exceptions count attempts; the
        fault's code and message go to ``last_error`` so an operator sees why."""
        claimed = held.claimed
        message = (
            f"{_describe(error)} — handed back with the attempt uncounted: an infrastructure "
            "fault, not the job's failure"
        )
        if await self._nack(
            held,
            NackOptions(
                fence=claimed.fence,
                state="ready",
                counted=False,
                delay=self.poll_interval,
                error_code=error.code,
                last_error=message,
                progress=state.progress if state is not None else None,
                duration=duration,
            ),
        ):
            self._count("faulted", held, error.code, error=message)

    async def _fail(
        self,
        held: Attempt,
        handle: Job[Any, Any] | None,
        error: BaseException,
        value: Any,
        state: RunState | None,
    ) -> None:
        claimed = held.claimed
        decision = decide(
            error,
            attempt=claimed.attempt,
            attempts=handle.retry.attempts if handle is not None else claimed.max_attempts,
            retry=handle.retry if handle is not None else None,
            fence=claimed.fence,
            progress=state.progress if state else None,
            jitter=self._jitter,
        )
        if decision.retry is not None:
            if await self._nack(held, decision.retry):
                if decision.retry.counted:
                    self._count("retried", held, decision.code, error=decision.message)
                else:
                    _rate.deferred(held.claimed, decision.retry, self.id)
            return
        if handle is not None and handle.compensates and state is not None and state.compensators:
            await unwind(self, held, handle, state, (decision.code, decision.message))
            return
        await self._bury(held, handle, decision.code, decision.message, value, state)

    async def _bury(
        self,
        held: Attempt,
        handle: Job[Any, Any] | None,
        code: str | None,
        message: str,
        value: Any,
        state: RunState | None,
    ) -> None:
        claimed = held.claimed
        drop = handle is not None and not handle.retry.dead_letter
        if state is not None:
            await state.hit("before-settle", None)
        landed = await self._nack(
            held,
            burial(
                claimed.fence,
                drop=drop,
                code=code,
                message=message,
                progress=state.progress if state else None,
            ),
        )
        if not landed:
            return
        self._count("failed" if drop else "dead_lettered", held, code, error=message)
        if handle is not None:
            outcome = Outcome.DROPPED if drop else Outcome.DEAD_LETTERED
            await self._on_settled(
                handle, held, Settled(outcome, claimed.id, value, None, message, code)
            )

    async def _exhausted(self, ex: Exhausted) -> None:
        _ambient.role_var.set(f"exhausted:{ex.id}")
        _log(
            logging.WARNING,
            "jobs.claim.exhausted",
            job_id=ex.id,
            job=ex.name,
            error=error_line(ex.last_error),
            attempt=ex.attempt,
            queue=ex.queue,
            code=ex.error_code,
            worker_id=self.id,
        )
        self._count(
            "dead_lettered" if ex.state == "dead" else "failed",
            None,
            ex.error_code,
            queue=ex.queue,
            name=ex.name,
        )
        handle = self.jobs.handle(ex.name)
        if handle is None:
            return
        try:
            value = handle.parse(ex.payload)
        except JobsError:
            value = None
        outcome = Outcome.DEAD_LETTERED if ex.state == "dead" else Outcome.DROPPED
        await self._run_hook(
            handle,
            ex.tenant_id,
            None,
            Settled(outcome, ex.id, value, None, ex.last_error, ex.error_code),
            ex.attempt,
        )

    async def _on_settled(self, handle: Job[Any, Any], held: Attempt, settled: Settled) -> None:
        await self._run_hook(
            handle, held.claimed.tenant_id, held.claimed.actor, settled, held.claimed.attempt
        )

    async def _run_hook(
        self,
        handle: Job[Any, Any],
        tenant_id: str | None,
        actor: Any,
        settled: Settled,
        attempt: int | None = None,
    ) -> None:
        hook = handle.on_settled
        if hook is None:
            return
        signal = Signal()
        deadline = trio.current_time() + handle.on_settled_timeout
        last: BaseException | None = None
        tokens = (
            _ambient.run_var.set(None),
            _ambient.facade_var.set(self.jobs),
            _ambient.actor_var.set(Actor.from_json(actor)),
        )
        try:
            with trio.CancelScope(deadline=deadline) as scope:
                signal._attach(scope, deadline)
                for _try in range(ON_SETTLED_TRIES):
                    try:
                        await _call(hook, settled)
                        return
                    except trio.Cancelled:
                        raise
                    except Exception as exc:
                        last = exc
        finally:
            _ambient.run_var.reset(tokens[0])
            _ambient.facade_var.reset(tokens[1])
            _ambient.actor_var.reset(tokens[2])
        _log(
            logging.ERROR,
            "jobs.on_settled.failed",
            job_id=settled.job_id,
            job=handle.name,
            attempt=attempt,
            code=ErrorCode.X_JOB_ON_SETTLED_FAILED,
            cause=type(last).__name__ if last is not None else "timeout",
        )


def _in_trio() -> bool:
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True
