"""What a job body sees: ``JobContext``, its abort signal, and durable steps."""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import types
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypeVar, cast

import attrs
import trio

from . import _ambient, _tracing
from ._enqueue import _MISSING as _MISSING_ACTOR
from ._enqueue import stage_requests
from ._serialization import UnserializableError, converter, json_form
from ._time import Duration, parse_duration
from ._validate import check_text, storable
from ._write_retry import is_transient, retry_delay, retry_transient, write_retrying
from .drivers._protocol import (
    ENQUEUE_CHUNK,
    MAX_ENQUEUE_BATCH,
    EnqueueRequest,
    Progress,
    StepMark,
    StepRecord,
)
from .errors import ErrorCode, JobAbortedError, JobsError
from .logging import emit

if TYPE_CHECKING:
    from ._declare import Job
    from ._facade import Actor, Jobs, Transaction
    from .drivers._protocol import ClaimedJob, JobDriver

__all__ = ["JobContext", "Signal", "Steps", "run_to_completion"]

I = TypeVar("I")
T = TypeVar("T")

_log = logging.getLogger("trio_jobs")

RESERVED_STEP = "unwinding"
COMPENSATE_PREFIX = "compensate:"
#: A ``step.patched`` marker's record is named ``patch:<change_id>``.
PATCH_PREFIX = "patch:"
MAX_STEP_NAME = 200
#: The bounded budget for a shielded write after the body was cancelled.
WRITE_BUDGET = 10.0


class Signal:
    """A job's abort signal. ``reason`` is a :class:`JobAbortedError` with one of
    ``X_ABORTED``, ``X_DRAINING``, ``X_JOB_TIMEOUT``, ``X_JOB_SLOT_LOST`` or
    ``X_JOB_LEASE_LOST`` once aborted, ``None`` before.

    When it aborts, the body's cancel scope is cancelled too, so every checkpoint
    in the body raises ``trio.Cancelled``.
    """

    __slots__ = ("_deadline", "_parent", "_reason", "_scopes")

    def __init__(self, parent: Signal | None = None) -> None:
        self._reason: JobAbortedError | None = None
        self._scopes: list[trio.CancelScope] = []
        self._deadline = math.inf
        # A step's signal: this step's ceiling and the run's abort, whichever first.
        self._parent = parent

    @property
    def reason(self) -> JobAbortedError | None:
        if (
            self._reason is None
            and self._deadline != math.inf
            and trio.current_time() >= self._deadline
        ):
            whose = "the job's timeout" if self._parent is None else "the step's step_timeout"
            self._reason = JobAbortedError(
                ErrorCode.X_JOB_TIMEOUT, f"{whose} passed; the attempt fails and retries"
            )
        if self._reason is None and self._parent is not None:
            return self._parent.reason
        return self._reason

    @property
    def aborted(self) -> bool:
        return self.reason is not None

    def raise_if_aborted(self) -> None:
        """Raise the reason when aborted: call it between steps in a long loop."""
        reason = self.reason
        if reason is not None:
            raise reason

    def abort(self, code: ErrorCode, message: str) -> bool:
        """Abort with ``code`` (the first reason wins) and cancel the body."""
        if self.reason is not None:
            return False
        self._reason = JobAbortedError(code, message)
        for scope in self._scopes:
            scope.cancel()
        return True

    def _detach(self, scope: trio.CancelScope) -> None:
        """Stop cancelling ``scope`` on an abort (the body it ran is done)."""
        if scope in self._scopes:
            self._scopes.remove(scope)

    def _attach(self, scope: trio.CancelScope, deadline: float = math.inf) -> None:
        self._scopes.append(scope)
        self._deadline = min(self._deadline, deadline)
        if self._reason is not None:
            scope.cancel()


class Handback(BaseException):
    """Internal: the body hands the run back (a sleep or an event wait)."""

    def __init__(
        self,
        state: str,
        run_at: float,
        waiting_event: str | None = None,
        *,
        wait_children: bool = False,
        children_wait: str | None = None,
    ) -> None:
        super().__init__(state)
        self.state = state
        self.run_at = run_at
        self.waiting_event = waiting_event
        self.wait_children = wait_children
        self.children_wait = children_wait


class ReplayStop(BaseException):
    """Internal: an unwinding replay reached a step that never completed."""


class LeaseLost(BaseException):
    """Internal: a fenced write did not land."""


class InfraFault(BaseException):
    """Internal: one of the library's own statements for this run (a step record,
    the transaction of ``step.transaction``, an event poll) met a transient driver
    failure (``X_DRIVER_UNAVAILABLE``, ``X_DRIVER_CONFLICT``) and still failed after
    its retries within the write budget. It is not the body's failure: the worker
    hands the run back **uncounted**, with the code in ``last_error``. A
    ``BaseException``, like :class:`Handback`, so a body's ``except Exception``
    cannot turn it into a failure of its own."""

    def __init__(self, error: JobsError) -> None:
        super().__init__(error.code)
        self.error = error


@attrs.define
class Compensator:
    step: str
    fn: Callable[..., Any]
    output: Any
    once: bool = False


BoundaryHook = Callable[[str, "str | None"], Awaitable[None]]


class RunState:
    """Everything one attempt of one job holds. Internal."""

    def __init__(
        self,
        *,
        jobs: Jobs,
        driver: JobDriver,
        handle: Job[Any, Any],
        claimed: ClaimedJob,
        input: Any,
        steps: list[StepRecord],
        unwinding: bool,
        boundary: BoundaryHook | None,
        event_poll: float,
    ) -> None:
        self.jobs = jobs
        self.driver = driver
        self.handle = handle
        self.claimed = claimed
        self.input = input
        if steps:
            self.records: dict[str, StepRecord] = {r.name: r for r in steps}
            self.next_seq = max(r.seq for r in steps) + 1
        else:  # a first run (the common case)
            self.records = {}
            self.next_seq = 1
        self.used: set[str] = set()
        self.sleeps = 0
        self.compensators: list[Compensator] = []
        self.unwinding = unwinding
        self.unknown_compensation: str | None = None
        self.signal = Signal()
        #: Who enqueued the run (built once: the context and the ambient actor share it).
        self.actor: Actor | None = None
        #: How the body ended, for the worker's slower verdicts: (its result,
        #: its own exception, a hand-back or an infrastructure fault).
        self.verdict: tuple[Any, BaseException | None, Handback | InfraFault | None] = (
            None,
            None,
            None,
        )
        self.boundary = boundary
        self.event_poll = event_poll
        self.progress: Progress | None = None
        self.progress_dirty = False
        #: Called when the body reports progress (the worker's progress writer).
        self.on_progress: Callable[[], None] | None = None
        self.progress_written_at = -math.inf
        self._lost = False
        #: Told when a fenced write finds the lease gone (the worker's attempt).
        self.on_lost: Callable[[], None] | None = None
        #: Whether this attempt records spans (``_tracing.recording()``, asked once).
        self.traced = False
        #: The steps running now and since when (the heartbeat reports the newest).
        self.running_steps: dict[str, float] = {}

    @property
    def step_now(self) -> StepMark | None:
        """The step in progress, for the heartbeat (the newest, when a body runs
        several at once); ``None`` between steps."""
        if not self.running_steps:
            return None
        name = next(reversed(self.running_steps))
        return StepMark(name, self.running_steps[name])

    @property
    def lost(self) -> bool:
        """Whether the lease is gone as this run knows it: a fenced write was
        refused, or the worker found it lost."""
        return self._lost

    @lost.setter
    def lost(self, value: bool) -> None:
        self._lost = value
        if value and self.on_lost is not None:
            self.on_lost()

    # ------------------------------------------------------------------ writes

    async def put(self, record: StepRecord) -> None:
        """A fenced, durable step write; a refused fence is a lost lease.

        A transient driver failure (``X_DRIVER_UNAVAILABLE``) is retried with
        capped backoff within the write budget, while the lease holds as the
        worker knows it (``self.lost``). A retry first reads the record back: a
        write that landed but whose answer was lost is recognised, not redone."""
        driver, claimed = self.driver, self.claimed
        if driver.steps.shielded:
            # The store's put outlives a cancel and is bounded by its own budget:
            # no shielded scope a write (a quarter of a step's CPU). Only a retry
            # takes one, within what is left of this write's budget.
            began = trio.current_time()
            try:
                landed = await driver.steps.put(claimed.id, claimed.fence, record)
            except JobsError as first:
                if not is_transient(first):
                    raise
                landed = await self._put_again(record, first, began + WRITE_BUDGET)
        else:
            landed = False
            with trio.CancelScope(
                shield=True, deadline=trio.current_time() + WRITE_BUDGET
            ) as scope:
                try:
                    landed = await driver.steps.put(claimed.id, claimed.fence, record)
                except JobsError as first:
                    if not is_transient(first):
                        raise
                    landed = await self._put_again(record, first, scope.deadline)
            if scope.cancelled_caught and not self._gone():
                # The write hung for the whole budget: its outcome is unknown, which a
                # replay resolves (the claim carries whatever landed).
                raise InfraFault(_hung(record.name))
        if not landed:
            self._refused()
        self.records[record.name] = record

    def _again(self, record: StepRecord) -> Callable[[], Awaitable[bool]]:
        """A retry of ``record``'s write: it first reads the record back, so a
        write that landed but whose answer was lost is recognised, not redone."""
        driver, claimed = self.driver, self.claimed

        async def again() -> bool:
            stored = await driver.steps.load(claimed.id)
            return any(r == record for r in stored) or await driver.steps.put(
                claimed.id, claimed.fence, record
            )

        return again

    async def _put_again(self, record: StepRecord, first: JobsError, deadline: float) -> bool:
        """The retries of a put whose first try failed (transient), shielded until
        ``deadline``; the budget spent with the database still away, or a hung
        retry, is an :class:`InfraFault` (the worker hands the run back uncounted)."""
        landed = False
        with trio.CancelScope(shield=True, deadline=deadline) as scope:
            try:
                key, event, fields = self._about(record.name)()
                landed = await retry_transient(
                    self._again(record),
                    first,
                    deadline=deadline,
                    gone=self._gone,
                    key=key,
                    event=event,
                    fields=fields,
                )
            except JobsError as exc:
                if not is_transient(exc) or self._gone():
                    raise
                raise InfraFault(exc) from None
        if scope.cancelled_caught and not self._gone():
            raise InfraFault(_hung(record.name))
        return landed

    def _refused(self) -> NoReturn:
        self.lost = True
        self.signal.abort(
            ErrorCode.X_JOB_LEASE_LOST,
            "a step write was refused: this worker no longer holds the job's lease",
        )
        raise LeaseLost()

    def _gone(self) -> bool:
        """Whether retrying this run's writes is pointless: the lease is lost as the
        worker knows it, or the driver closed."""
        return self.lost or self.driver.closed

    def _about(self, step: str) -> Callable[[], tuple[str, str, dict[str, Any]]]:
        claimed = self.claimed
        return lambda: (
            f"{claimed.id}:{claimed.fence.claim}:{step}",
            "jobs.step.retry",
            {
                "job_id": claimed.id,
                "job": claimed.name,
                "attempt": claimed.attempt,
                "worker_id": claimed.fence.worker_id,
            },
        )

    async def read(self, step: str, call: Callable[[], Awaitable[T]]) -> T:
        """One of the library's reads for this run (an event poll, a step record
        read back), retried through a transient driver failure within the write
        budget; still failing, it is an :class:`InfraFault`, not the body's."""
        deadline = trio.current_time() + WRITE_BUDGET
        try:
            return await write_retrying(
                call, deadline=deadline, gone=self._gone, about=self._about(step)
            )
        except JobsError as exc:
            if not is_transient(exc) or self._gone():
                raise
            raise InfraFault(exc) from None

    def seq_for(self, name: str) -> int:
        old = self.records.get(name)
        if old is not None:
            return old.seq
        seq = self.next_seq
        self.next_seq += 1
        return seq

    async def hit(self, boundary: str, step: str | None) -> None:
        if self.boundary is not None:
            await self.boundary(boundary, step)

    def claim_name(self, name: object, *, what: str) -> str:
        if type(name) is str and name in _NAMES_OK:
            if name in self.used:
                raise _duplicate(name)
            self.used.add(name)
            return name
        if not isinstance(name, str) or not name or len(name) > MAX_STEP_NAME:
            raise JobsError(
                ErrorCode.X_JOB_DECLARATION_INVALID,
                f"{what} needs a name: a non-empty string of at most {MAX_STEP_NAME} characters",
            )
        check_text(name, what=f"the {what} name", code=ErrorCode.X_JOB_DECLARATION_INVALID)
        if name == RESERVED_STEP or name.startswith(COMPENSATE_PREFIX):
            raise JobsError(
                ErrorCode.X_JOB_DECLARATION_INVALID,
                f"step names 'unwinding' and 'compensate:*' are the framework's; rename the {what}",
            )
        if name in self.used:
            raise _duplicate(name)
        if type(name) is str:
            if len(_NAMES_OK) >= _NAMES_KEPT:
                _NAMES_OK.clear()
            _NAMES_OK.add(name)
        self.used.add(name)
        return name

    def refuse_past_abort(self, name: str) -> None:
        reason = self.signal.reason
        if reason is not None and not _ambient.complete_var.get():
            raise JobAbortedError(
                ErrorCode.X_ABORTED,
                f"step {name!r} was not started: the run was aborted ({reason.code}); nothing was written",
                meta={"step": name, "reason": reason.code},
            )


#: Step names that passed claim_name's checks of the name alone (type, length,
#: storable text, not the framework's): a step name is checked once per
#: process, not once per run (bounded; cleared when full).
_NAMES_OK: set[str] = set()
_NAMES_KEPT = 10_000


def _duplicate(name: str) -> JobsError:
    return JobsError(
        ErrorCode.X_STEP_DUPLICATE,
        f"two steps share the name {name!r} in one run; step names are the persistence key — rename one",
        meta={"step": name},
    )


_ARITY: dict[Any, bool] = {}


def _wants_signal(fn: Callable[..., Any]) -> bool:
    # A lambda is a new object every call; its code object is not: cache on it.
    code = getattr(fn, "__code__", None)
    if (
        code is not None
        and not getattr(fn, "__defaults__", None)
        and not hasattr(fn, "__self__")
        # inspect.signature follows these: two wrappers sharing a code object may
        # present different signatures.
        and not hasattr(fn, "__wrapped__")
        and not hasattr(fn, "__signature__")
    ):
        found = _ARITY.get(code)
        if found is None:
            found = _ARITY[code] = _signature_wants_signal(fn)
        return found
    return _signature_wants_signal(fn)


def _signature_wants_signal(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    required = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    return len(required) >= 1


#: Types whose values are never awaitable (``inspect.isawaitable`` on them
#: falls through to an ABC check: a sync step fn answering plain data).
_PLAIN = frozenset({int, float, str, bool, type(None), dict, list, tuple, bytes})


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    value = fn(*args)
    kind = type(value)
    if kind is types.CoroutineType:
        return await value
    if kind not in _PLAIN and inspect.isawaitable(value):
        value = await value
    return value


class Steps:
    """``ctx.step``: memoized steps, durable timers and event waits."""

    def __init__(self, state: RunState) -> None:
        self._s = state

    async def run(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        compensate: Callable[..., Any] | None = None,
        once: bool = False,
    ) -> Any:
        """Run ``fn`` once ever and answer what was stored (its JSON form), on the
        first run too. On a replay, answer the stored output without calling ``fn``.

        An exception from ``fn`` is recorded and re-raised unchanged. ``once=True``:
        ``started`` is persisted before ``fn``; a replay finding it without
        ``completed`` stops with terminal ``X_STEP_OUTCOME_UNKNOWN``.
        ``compensate(output)`` undoes the step if the run fails for good (needs
        ``job(compensates=True)``). ``fn`` may take one argument: this step's
        :class:`Signal` (its ``step_timeout`` and the run's abort).
        """
        s = self._s
        name = s.claim_name(name, what="step.run")
        _check_compensate(s, name, compensate)
        rec = s.records.get(name)
        if rec is not None and rec.status == "completed":
            if compensate is not None:
                s.compensators.append(Compensator(name, compensate, rec.output, once))
            return rec.output
        if s.unwinding:
            if once and compensate is not None and rec is not None:
                s.unknown_compensation = name
            raise ReplayStop()
        if once and rec is not None and rec.status in ("started", "failed"):
            raise JobsError(
                ErrorCode.X_STEP_OUTCOME_UNKNOWN,
                f"once step {name!r} started on an earlier attempt and never recorded an outcome; "
                f"resolve it (`trio-jobs resolve-step ID {name} --ran --output JSON` or --not-ran), "
                "then `trio-jobs retry ID`",
                meta={"step": name},
            )
        s.refuse_past_abort(name)
        executions = (rec.executions if rec is not None else 0) + 1
        seq = s.seq_for(name)
        if s.boundary is not None:
            await s.hit("before-step", name)
        started_at = s.driver.now()
        if once:
            await s.put(
                StepRecord(
                    name=name,
                    status="started",
                    seq=seq,
                    executions=executions,
                    started_at=started_at,
                )
            )
            if s.boundary is not None:
                await s.hit("after-started", name)
        timeout = s.handle.step_timeout
        wants_signal = _wants_signal(fn)
        # One child span of the attempt's span per executed step (a no-op without
        # OpenTelemetry); a replayed step is not executed and has none.
        s.running_steps[name] = started_at
        with _tracing.step_span(name, executions, once, s.traced), _running(s, name):
            try:
                if timeout is None and not wants_signal:
                    # No ceiling and no signal to hand over: the run's own scope
                    # and signal are the step's (a scope per step costs ~20%).
                    value = await _call(fn)
                else:
                    step_signal = Signal(parent=s.signal)
                    deadline = trio.current_time() + timeout if timeout is not None else math.inf
                    with trio.CancelScope(deadline=deadline) as scope:
                        step_signal._attach(scope, deadline)
                        args = (step_signal,) if wants_signal else ()
                        value = await _call(fn, *args)
                    if scope.cancelled_caught:
                        raise JobsError(
                            ErrorCode.X_JOB_TIMEOUT,
                            f"step {name!r} ran past its step_timeout of {timeout}s",
                            meta={"step": name},
                        )
            except (trio.Cancelled, Handback, ReplayStop, LeaseLost, InfraFault, KeyboardInterrupt):
                raise
            except BaseException as exc:
                await _record_failure(s, name, seq, executions, exc, started_at)
                raise
        if s.boundary is not None:
            await s.hit("after-fn", name)
        try:
            output = _output_form(name, value)
        except JobsError as error:
            await _record_failure(s, name, seq, executions, error, started_at)
            raise
        await s.put(
            StepRecord(
                name=name,
                status="completed",
                seq=seq,
                executions=executions,
                output=output,
                started_at=started_at,
                ended_at=s.driver.now(),
            )
        )
        if s.boundary is not None:
            await s.hit("after-record", name)
        if compensate is not None:
            s.compensators.append(Compensator(name, compensate, output, once))
        return output

    async def transaction(
        self,
        name: str,
        fn: Callable[[Transaction], Any],
        *,
        compensate: Callable[..., Any] | None = None,
    ) -> Any:
        """Run ``fn(tx)`` in a transaction of the queue's database that also
        writes this step's record: the app's writes through ``tx`` (and the
        enqueues and ``publish_event`` calls inside ``fn``) commit together with
        the record, or not at all. A crash anywhere before the commit leaves
        neither, so the step's effects land exactly once; a replay answers the
        stored output without calling ``fn``.

        Answers the stored JSON form of what ``fn`` returned, like :meth:`run`.
        An exception from ``fn`` rolls the transaction back, is recorded and is
        re-raised unchanged. ``compensate`` is as for :meth:`run`. The record is
        fenced on the claim inside the transaction: a worker that lost the
        job's lease commits nothing. ``fn`` should write only through ``tx``: a
        write on another connection is outside the guarantee.
        """
        s = self._s
        name = s.claim_name(name, what="step.transaction")
        _check_compensate(s, name, compensate)
        if not callable(fn):
            raise JobsError(
                ErrorCode.X_JOB_DECLARATION_INVALID,
                f"step {name!r}: step.transaction takes a function of the transaction",
            )
        if s.jobs.outbox is not None:
            raise JobsError(
                ErrorCode.X_NOT_IMPLEMENTED,
                f"step {name!r}: step.transaction needs the step records and the app's tables "
                "in one database, and with outbox= the queue lives elsewhere; use step.run "
                "with an idempotent write (an upsert keyed by ctx.job_id), or put the queue "
                "in the app's database (open_jobs(postgres_driver(dsn)))",
                meta={"step": name},
            )
        rec = s.records.get(name)
        if rec is not None and rec.status == "completed":
            if compensate is not None:
                s.compensators.append(Compensator(name, compensate, rec.output, False))
            return rec.output
        if s.unwinding:
            raise ReplayStop()
        s.refuse_past_abort(name)
        executions = (rec.executions if rec is not None else 0) + 1
        seq = s.seq_for(name)
        await s.hit("before-step", name)
        s.running_steps[name] = s.driver.now()
        with _tracing.step_span(name, executions, False, s.traced), _running(s, name):
            record = await _transact(s, name, fn, seq, executions, s.handle.step_timeout)
        s.records[name] = record
        await s.hit("after-record", name)
        if compensate is not None:
            s.compensators.append(Compensator(name, compensate, record.output, False))
        return record.output

    async def sleep(self, duration: Duration, *, name: str | None = None) -> None:
        """A durable timer: persist the wake time and hand the run back (``delayed``).

        The run resumes in any worker once the time has come; nothing is held.
        The default name is positional: ``sleep:1``, ``sleep:2``, ...
        """
        s = self._s
        seconds = parse_duration(duration, field="step.sleep duration", allow_zero=True)
        s.sleeps += 1
        step_name = s.claim_name(
            name if name is not None else f"sleep:{s.sleeps}", what="step.sleep"
        )
        rec = s.records.get(step_name)
        if rec is not None and rec.status == "completed":
            return
        if rec is not None and rec.status == "sleeping" and rec.wake_at is not None:
            if s.driver.now() >= rec.wake_at or s.claimed.promoted:
                if s.unwinding:
                    return
                s.refuse_past_abort(step_name)
                await s.put(
                    attrs.evolve(rec, status="completed", executions=1, ended_at=s.driver.now())
                )
                return
            if s.unwinding:
                raise ReplayStop()
            raise Handback("delayed", rec.wake_at)
        if s.unwinding:
            raise ReplayStop()
        s.refuse_past_abort(step_name)
        if seconds == 0:
            return
        await s.hit("before-step", step_name)
        now = s.driver.now()
        wake_at = now + seconds
        await s.put(
            StepRecord(
                name=step_name,
                status="sleeping",
                seq=s.seq_for(step_name),
                executions=1,
                wake_at=wake_at,
                started_at=now,
            )
        )
        await s.hit("after-record", step_name)
        raise Handback("delayed", wake_at)

    async def patched(self, change_id: str) -> bool:
        """Whether this run takes the patched path at this point of the body.

        ``True`` in a run that reaches this call on code that has the patch;
        ``False`` in a run whose stored steps already go past this point (it
        recorded steps this attempt has not replayed yet) without the patch's
        marker: it replays the old path. The first answer is recorded as the
        step ``patch:<change_id>``, so every later attempt of the run answers
        the same.

        >>> if await ctx.step.patched("fix-rounding"):
        ...     total = await ctx.step.run("total", lambda: round_half_even(amount))
        ... else:
        ...     total = await ctx.step.run("total", lambda: round(amount))
        """
        s = self._s
        name = s.claim_name(_patch_name(change_id, "step.patched"), what="step.patched")
        rec = s.records.get(name)
        if rec is not None and rec.status == "completed":
            return bool(rec.output)
        # Past this point already: a stored step (not the framework's unwind
        # records) this attempt has not reached. Steps run at once in a nursery
        # may reach it in another order; either way the answer is recorded.
        answer = not any(
            other not in s.used
            and other != RESERVED_STEP
            and not other.startswith(COMPENSATE_PREFIX)
            for other in s.records
        )
        if s.unwinding:
            # The unwind replays the body to find its compensations and writes
            # no step: the answer the run would have recorded, unrecorded.
            return answer
        s.refuse_past_abort(name)
        await s.hit("before-step", name)
        now = s.driver.now()
        await s.put(
            StepRecord(
                name=name,
                status="completed",
                seq=s.seq_for(name),
                executions=1,
                output=answer,
                started_at=now,
                ended_at=now,
            )
        )
        await s.hit("after-record", name)
        return answer

    async def deprecate_patch(self, change_id: str) -> None:
        """Stand where ``patched(change_id)`` stood once every run that took the
        old path has settled: it records nothing, and a run holding the marker
        replays past it unchanged. The next release can delete the line."""
        s = self._s
        s.claim_name(_patch_name(change_id, "step.deprecate_patch"), what="step.deprecate_patch")

    async def wait_for_event(
        self,
        name: str,
        event: str,
        *,
        schema: type[T] | Any,
        match: Callable[[T], bool] | None = None,
        timeout: Duration,
    ) -> T | None:
        """Suspend until an event named ``event``, published at or after the wait
        began, matches (``match(payload)``, or any when ``None``), or ``timeout``
        passes. Answers the payload parsed by ``schema``, or ``None`` on timeout.

        A payload ``schema`` refuses is terminal ``X_JOB_EVENT_INVALID``."""
        s = self._s
        step_name = s.claim_name(name, what="step.wait_for_event")
        if schema is None:
            raise JobsError(
                ErrorCode.X_JOB_DECLARATION_INVALID,
                "wait_for_event needs schema= (an attrs class or type)",
            )
        if not isinstance(event, str) or not event:
            raise JobsError(
                ErrorCode.X_JOB_DECLARATION_INVALID, "wait_for_event needs an event name"
            )
        check_text(event, what="the event name", code=ErrorCode.X_JOB_DECLARATION_INVALID)
        if match is not None and not callable(match):
            raise JobsError(
                ErrorCode.X_JOB_DECLARATION_INVALID,
                "match must be a predicate over the parsed payload",
            )
        try:
            timeout_s = parse_duration(timeout, field="wait_for_event timeout")
        except JobsError as exc:
            raise JobsError(ErrorCode.X_JOB_DECLARATION_INVALID, exc.message) from None
        rec = s.records.get(step_name)
        if rec is not None and rec.status == "completed":
            return (
                None
                if rec.output is None
                else cast("T", _parse_event(schema, rec.output, step_name))
            )
        if s.unwinding:
            raise ReplayStop()
        s.refuse_past_abort(step_name)
        events = s.driver.events
        if rec is None or rec.status != "waiting" or rec.since is None or rec.deadline is None:
            await s.hit("before-step", step_name)
            _none, now = await s.read(step_name, lambda: events.poll(event, math.inf))
            rec = StepRecord(
                name=step_name,
                status="waiting",
                seq=s.seq_for(step_name),
                executions=1,
                event=event,
                since=now,
                deadline=now + timeout_s,
                started_at=now,
            )
            await s.put(rec)
            await s.hit("after-record", step_name)
        assert rec.since is not None
        assert rec.deadline is not None
        since = rec.since
        found, now = await s.read(step_name, lambda: events.poll(event, since))
        for record in found:
            parsed = _parse_event(schema, record.payload, step_name)
            if match is None or match(parsed):
                s.refuse_past_abort(step_name)
                await s.put(
                    attrs.evolve(rec, status="completed", output=record.payload, ended_at=now)
                )
                return cast("T", parsed)
        if now >= rec.deadline:
            s.refuse_past_abort(step_name)
            await s.put(attrs.evolve(rec, status="completed", output=None, ended_at=now))
            return None
        poll = s.handle.event_poll if s.handle.event_poll is not None else s.event_poll
        raise Handback("suspended", min(rec.deadline, now + poll), waiting_event=event)

    async def invoke(
        self, name: str, job: Job[Any, Any], input: Any, *, timeout: Duration | None = None
    ) -> Any:
        """Enqueue ``job`` with ``input`` as this run's child, once (its
        idempotency key is this run's id and the step name), suspend without a
        slot, and answer the child's stored result once it settles.

        A child that ends dead, failed or cancelled raises ``X_CHILD_FAILED``
        (``meta``: ``child_id``, the child's ``code``); ``timeout`` elapsed first
        raises ``X_CHILD_TIMEOUT`` (the child keeps running). Both are recorded
        like any step failure and take the ordinary retry path.

        >>> receipt = await ctx.step.invoke("charge", charge_card, Charge(order_id=oid))
        """
        return (await _children(self._s, name, [(job, input)], timeout, what="step.invoke"))[0]

    async def gather(
        self,
        name: str,
        calls: Sequence[tuple[Job[Any, Any], Any]],
        *,
        timeout: Duration | None = None,
    ) -> list[Any]:
        """Enqueue one child per ``(job, input)`` in ``calls`` in one batch, suspend
        until all have settled, and answer their results in the order of
        ``calls``. The first failure in ``calls`` order raises ``X_CHILD_FAILED``;
        more than ``MAX_ENQUEUE_BATCH`` calls is ``X_JOB_ENQUEUE_BATCH_TOO_LARGE``.

        >>> parts = await ctx.step.gather("resize", [(resize, Img(k)) for k in keys])
        """
        return await _children(self._s, name, calls, timeout, what="step.gather")


async def _children(
    s: RunState,
    name: str,
    calls: Sequence[tuple[Job[Any, Any], Any]],
    timeout: Duration | None,
    *,
    what: str,
) -> list[Any]:
    """``step.invoke``/``step.gather``: the children enqueued in the transaction
    that records the step (``waiting``, their ids), so a replay finds them and
    never enqueues again; the run suspended until the last one settles."""
    step_name = s.claim_name(name, what=what)
    calls = list(calls)
    if len(calls) > MAX_ENQUEUE_BATCH:
        raise JobsError(
            ErrorCode.X_JOB_ENQUEUE_BATCH_TOO_LARGE,
            f"{what} {step_name!r} takes at most {MAX_ENQUEUE_BATCH} calls, got {len(calls)}; "
            "split it into several steps; nothing was enqueued",
            meta={"step": step_name},
        )
    timeout_s: float | None = None
    if timeout is not None:
        try:
            timeout_s = parse_duration(timeout, field=f"{what} timeout")
        except JobsError as exc:
            raise JobsError(ErrorCode.X_JOB_DECLARATION_INVALID, exc.message) from None
    for call in calls:
        handle = call[0] if isinstance(call, tuple) and len(call) == 2 else None
        if handle is None or s.jobs.handle(getattr(handle, "name", "")) is not handle:
            raise JobsError(
                ErrorCode.X_JOB_DECLARATION_INVALID,
                f"{what} {step_name!r}: {getattr(handle, 'name', handle)!r} is not a job handle "
                "passed to open_jobs(jobs=[...]); register it there (calls are (job, input) pairs); "
                "nothing was enqueued",
                meta={"step": step_name},
            )
    rec = s.records.get(step_name)
    if rec is not None and rec.status == "completed":
        return list(rec.output)
    if s.unwinding:
        raise ReplayStop()
    s.refuse_past_abort(step_name)
    if rec is None or rec.status != "waiting" or not isinstance(rec.output, dict):
        # A driver that cannot run children refuses here, before any write.
        await s.driver.steps.children([])
        rec = await _enqueue_children(s, step_name, calls, timeout_s, rec)
    ids: list[str] = list(rec.output["children"])
    states = await s.read(step_name, lambda: s.driver.steps.children(ids))
    now = s.driver.now()
    if all(c.settled for c in states):
        await s.hit("before-resume", step_name)
        s.refuse_past_abort(step_name)
        for child in states:
            if child.state != "done":
                error = JobsError(
                    ErrorCode.X_CHILD_FAILED,
                    f"{what} {step_name!r}: child {child.id} ended {child.state}"
                    + (f" ({child.error_code})" if child.error_code else "")
                    + "; see `trio-jobs show` for the child",
                    meta={"step": step_name, "child_id": child.id, "code": child.error_code},
                )
                await _record_failure(s, step_name, rec.seq, rec.executions, error, rec.started_at)
                raise error
        results = [child.result for child in states]
        await s.put(attrs.evolve(rec, status="completed", output=results, ended_at=now))
        await s.hit("after-record", step_name)
        return results
    if rec.deadline is not None and now >= rec.deadline:
        s.refuse_past_abort(step_name)
        live = next(c.id for c in states if not c.settled)
        error = JobsError(
            ErrorCode.X_CHILD_TIMEOUT,
            f"{what} {step_name!r}: child {live} had not settled within the timeout "
            "(it keeps running)",
            meta={"step": step_name, "child_id": live},
        )
        await _record_failure(s, step_name, rec.seq, rec.executions, error, rec.started_at)
        raise error
    # The last child's settle makes the run due; the poll is only a backstop.
    poll = s.handle.event_poll if s.handle.event_poll is not None else s.event_poll
    wake = now + poll if rec.deadline is None else min(rec.deadline, now + poll)
    wait = rec.output.get("wait") or (ids[0] if ids else None)
    raise Handback("suspended", wake, wait_children=True, children_wait=wait)


def child_requests(
    s: RunState,
    step_name: str,
    calls: list[tuple[Job[Any, Any], Any]],
    old: StepRecord | None,
) -> list[EnqueueRequest]:
    """The rows a step's children are: each under the key ``<run id>:<step>``
    (``:<index>`` per call of a gather, ``#<execution>`` after a failed one),
    naming this run as their parent and the step's wait (its first child's id)."""
    claimed = s.claimed
    key = f"{claimed.run_id}:{step_name}"
    requests: list[EnqueueRequest] = []
    for index, (handle, value) in enumerate(calls):
        (staged,) = stage_requests(
            s.jobs,
            handle,
            [value],
            run_ids=[None],
            delay=None,
            run_at=None,
            tenant_id=None,
            priority=0,
            actor=_MISSING_ACTOR,
        )
        child_key = key if len(calls) == 1 and old is None else f"{key}:{index}"
        if old is not None:
            child_key += f"#{old.executions + 1}"
        requests.append(
            attrs.evolve(
                staged,
                idempotency_key=child_key,
                parent_id=claimed.id,
                # a child is enqueued once per parent step, under the step's own key
                debounce=None,
                unique_for=None,
            )
        )
    # The step's wait: its first child's id names it on every child.
    wait = requests[0].id if requests else None
    requests = [attrs.evolve(r, parent_wait=wait) for r in requests]
    return requests


async def _enqueue_children(
    s: RunState,
    step_name: str,
    calls: list[tuple[Job[Any, Any], Any]],
    timeout_s: float | None,
    old: StepRecord | None,
) -> StepRecord:
    """Stage the children and write the step's ``waiting`` record in one
    transaction: both land, or neither."""
    claimed = s.claimed
    requests = child_requests(s, step_name, calls, old)
    wait = requests[0].id if requests else None
    await s.hit("before-step", step_name)
    now = s.driver.now()
    executions = (old.executions if old is not None else 0) + 1
    seq = s.seq_for(step_name)

    async def write() -> StepRecord:
        async with s.driver.transaction() as tx:
            ids: list[str] = []
            for start in range(0, len(requests), ENQUEUE_CHUNK):
                got = await tx.enqueue_many(requests[start : start + ENQUEUE_CHUNK])
                ids.extend(r.id for r in got)
            record = StepRecord(
                name=step_name,
                status="waiting",
                seq=seq,
                executions=executions,
                output={"children": ids, "wait": wait},
                deadline=now + timeout_s if timeout_s is not None else None,
                started_at=now,
            )
            if not await tx.put_step(claimed.id, claimed.fence, record):
                raise LeaseLost()
        return record

    try:
        record = await write()
    except LeaseLost:
        s.lost = True
        s.signal.abort(
            ErrorCode.X_JOB_LEASE_LOST,
            "a step write was refused: this worker no longer holds the job's lease",
        )
        raise
    except JobsError as exc:
        if exc.code == ErrorCode.X_JOB_LEASE_LOST:
            s.lost = True
            raise LeaseLost() from None
        if not is_transient(exc):
            raise
        raise InfraFault(exc) from None
    s.records[step_name] = record
    await s.hit("after-enqueue", step_name)
    return record


def _patch_name(change_id: object, what: str) -> str:
    if (
        not isinstance(change_id, str)
        or not change_id
        or len(change_id) > MAX_STEP_NAME - len(PATCH_PREFIX)
    ):
        raise JobsError(
            ErrorCode.X_JOB_DECLARATION_INVALID,
            f"{what} needs a change id: a non-empty string of at most "
            f'{MAX_STEP_NAME - len(PATCH_PREFIX)} characters ("fix-rounding")',
        )
    return PATCH_PREFIX + change_id


def _check_compensate(s: RunState, name: str, compensate: Callable[..., Any] | None) -> None:
    if compensate is None:
        return
    if not s.handle.compensates:
        raise JobsError(
            ErrorCode.X_JOB_DECLARATION_INVALID,
            f"step {name!r} has compensate= but the job does not declare compensates=True",
        )
    if not callable(compensate):
        raise JobsError(
            ErrorCode.X_JOB_DECLARATION_INVALID,
            "compensate must be a function of the output",
        )


class _TxFault(Exception):
    """Internal to ``step.transaction``: one try met a transient driver failure.
    ``unknown``: the connection was lost during the COMMIT, so it may have landed."""

    def __init__(self, error: JobsError, *, unknown: bool = False) -> None:
        super().__init__(error.code)
        self.error = error
        self.unknown = unknown


def unwrap(exc: BaseException) -> BaseException:
    """The one exception a group of one wraps (groups of one, all the way down):
    what a body raised through a nursery."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _transient_of(exc: BaseException) -> JobsError | None:
    """The transient driver error ``exc`` is (or wraps alone in a group), if any."""
    exc = unwrap(exc)
    if isinstance(exc, JobsError) and is_transient(exc):
        return exc
    return None


async def _transact(
    s: RunState,
    name: str,
    fn: Callable[[Transaction], Any],
    seq: int,
    executions: int,
    timeout: float | None,
) -> StepRecord:
    """``step.transaction``'s body, tried again through an infrastructure fault.

    A try that meets a transient driver failure (a lost connection, an admin
    shutdown or a failover: ``X_DRIVER_UNAVAILABLE``; a deadlock or a
    serialization failure: ``X_DRIVER_CONFLICT``) rolled back, in ``fn`` or in
    the library's own record and commit, is the library's to retry, not the
    body's failure: it is run again, ``fn`` included, with capped backoff within
    the write budget (counted from the first fault). A COMMIT whose answer was
    lost may have landed: the step record commits with the effects, so it is
    read back first, and a record that landed is the answer (``fn`` is not run
    again). Past the budget the run is handed back uncounted (:class:`InfraFault`).
    """
    claimed = s.claimed
    tries = 0
    budget_end = math.inf
    while True:
        try:
            return await _transact_once(s, name, fn, seq, executions, timeout, budget_end)
        except _TxFault as fault:
            error = fault.error
            if fault.unknown:
                found = await s.read(name, lambda: s.driver.steps.load(claimed.id))
                for stored in found:
                    if (stored.name, stored.status, stored.executions) == (
                        name,
                        "completed",
                        executions,
                    ):
                        return stored
            tries += 1
            now = trio.current_time()
            budget_end = min(budget_end, now + WRITE_BUDGET)
            delay = retry_delay(f"{claimed.id}:{claimed.fence.claim}:{name}", tries)
            if s._gone() or now + delay >= budget_end:
                raise InfraFault(error) from None
            emit(
                _log,
                logging.WARNING,
                "jobs.step.retry",
                job_id=claimed.id,
                job=claimed.name,
                attempt=claimed.attempt,
                worker_id=claimed.fence.worker_id,
                code=error.code,
                retry=tries,
                retry_in=round(delay, 3),
            )
            # In the run's scope: a drain or a cancel ends the wait, not the budget.
            await trio.sleep(delay)


async def _transact_once(
    s: RunState,
    name: str,
    fn: Callable[[Transaction], Any],
    seq: int,
    executions: int,
    timeout: float | None,
    budget_end: float = math.inf,
) -> StepRecord:
    """One try: ``fn(tx)``, then the fenced record in the same transaction, then
    the commit. The record and the commit run shielded on a bounded budget, so a
    drained step still lands. A transient failure anywhere is a :class:`_TxFault`
    (nothing landed, or, at the COMMIT, maybe); a refused fence is a lost lease,
    safe either way: the effects and the record land together or not at all.

    A retry (``budget_end`` set by the first fault) waits for its transaction to
    begin only until the budget ends: a connection that cannot be had (a connect
    that hangs, a pool held by stuck writes) is the same fault again, not a wait
    the budget does not bound."""
    started_at = s.driver.now()
    manager = s.jobs.transaction()
    try:
        if budget_end == math.inf:
            tx = await manager.__aenter__()
        else:
            with trio.CancelScope(deadline=budget_end) as begin:
                tx = await manager.__aenter__()
            if begin.cancelled_caught:
                raise _TxFault(_no_transaction(name))
    except JobsError as exc:
        if is_transient(exc):
            raise _TxFault(exc) from None
        raise
    try:
        deadline = trio.current_time() + timeout if timeout is not None else math.inf
        with trio.CancelScope(deadline=deadline) as scope:
            value = await _call(fn, tx)
        if scope.cancelled_caught:
            raise JobsError(
                ErrorCode.X_JOB_TIMEOUT,
                f"step {name!r} ran past its step_timeout of {timeout}s",
                meta={"step": name},
            )
        output = _output_form(name, value)
        # Still inside the transaction: a crash here rolls the effects back.
        await s.hit("after-fn", name)
    except BaseException as exc:
        with trio.CancelScope(shield=True, deadline=trio.current_time() + WRITE_BUDGET):
            with contextlib.suppress(Exception):
                await manager.__aexit__(type(exc), exc, exc.__traceback__)
        fault = _transient_of(exc)
        if fault is not None:
            raise _TxFault(fault) from None
        if not isinstance(
            exc, (trio.Cancelled, Handback, ReplayStop, LeaseLost, InfraFault, KeyboardInterrupt)
        ):
            await _record_failure(s, name, seq, executions, exc, started_at)
        raise
    record = StepRecord(
        name=name,
        status="completed",
        seq=seq,
        executions=executions,
        output=output,
        started_at=started_at,
        ended_at=s.driver.now(),
    )
    landed = False
    with trio.CancelScope(shield=True, deadline=trio.current_time() + WRITE_BUDGET) as scope:
        try:
            landed = await tx.driver_tx.put_step(s.claimed.id, s.claimed.fence, record)
        except BaseException as exc:
            with contextlib.suppress(Exception):
                await manager.__aexit__(type(exc), exc, exc.__traceback__)
            fault = _transient_of(exc)
            if fault is not None:
                raise _TxFault(fault) from None
            raise
        if landed:
            try:
                await manager.__aexit__(None, None, None)
            except JobsError as exc:
                if is_transient(exc):
                    # A lost connection leaves the commit's outcome unknown; a
                    # conflict at the commit rolled it back.
                    raise _TxFault(
                        exc, unknown=exc.code == ErrorCode.X_DRIVER_UNAVAILABLE
                    ) from None
                if exc.code != ErrorCode.X_JOB_LEASE_LOST:
                    raise
                landed = False
        else:
            refused = JobsError(ErrorCode.X_JOB_LEASE_LOST, "the step's fence was refused")
            with contextlib.suppress(Exception):
                await manager.__aexit__(JobsError, refused, None)
    if scope.cancelled_caught and not s._gone():
        # The record or the commit hung for the whole budget: whether it landed is
        # unknown, which a replay resolves (the claim carries the record if it did).
        raise InfraFault(_hung(name))
    if scope.cancelled_caught or not landed:
        s.lost = True
        s.signal.abort(
            ErrorCode.X_JOB_LEASE_LOST,
            "a step's transaction was refused: this worker no longer holds the job's lease",
        )
        raise LeaseLost()
    return record


def _no_transaction(step: str) -> JobsError:
    return JobsError(
        ErrorCode.X_DRIVER_UNAVAILABLE,
        f"step {step!r}: no transaction could begin within the {WRITE_BUDGET:g} s write budget; "
        "the run is handed back uncounted",
        meta={"step": step},
    )


def _hung(step: str) -> JobsError:
    return JobsError(
        ErrorCode.X_DRIVER_UNAVAILABLE,
        f"the write of step {step!r} got no answer within the {WRITE_BUDGET:g} s write budget; "
        "the run is handed back uncounted and a replay resolves whether it landed",
        meta={"step": step},
    )


def _output_form(name: str, value: Any) -> Any:
    """A step's output as stored, or terminal ``X_STEP_OUTPUT_UNSERIALIZABLE``."""
    try:
        return json_form(value)
    except UnserializableError as exc:
        raise JobsError(
            ErrorCode.X_STEP_OUTPUT_UNSERIALIZABLE,
            f"step {name!r} returned a value with no JSON form ({exc}); return plain data "
            "(a cursor or a small view), not an object graph",
            meta={"step": name},
        ) from None


def failed_record(
    name: str,
    seq: int,
    executions: int,
    exc: BaseException,
    *,
    started_at: float | None = None,
    ended_at: float | None = None,
) -> StepRecord:
    """A step's (or a compensation's) ``failed`` record: the exception's type and
    message as ``error``, its ``X_*`` code when it is a :class:`JobsError`."""
    return StepRecord(
        name=name,
        status="failed",
        seq=seq,
        executions=executions,
        error=_describe(exc),
        error_code=exc.code if isinstance(exc, JobsError) else None,
        started_at=started_at,
        ended_at=ended_at,
    )


async def _record_failure(
    s: RunState,
    name: str,
    seq: int,
    executions: int,
    exc: BaseException,
    started_at: float | None = None,
) -> None:
    """Record a step's failure (in its own statement), unless the run was aborted."""
    if s.signal.reason is not None:
        return
    record = failed_record(
        name, seq, executions, exc, started_at=started_at, ended_at=s.driver.now()
    )
    await s.put(record)
    await s.hit("after-record", name)


class _running:
    """While a step's function runs: the heartbeat reports it as in progress.
    (A class, not a generator: it is entered once per executed step.)"""

    __slots__ = ("_name", "_s")

    def __init__(self, s: RunState, name: str) -> None:
        self._s = s
        self._name = name

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self._s.running_steps.pop(self._name, None)


def _parse_event(schema: Any, payload: Any, step: str) -> Any:
    try:
        if isinstance(schema, type) and attrs.has(schema) and not isinstance(payload, dict):
            raise TypeError("not an object")
        return converter.structure(payload, schema)
    except Exception:
        raise JobsError(
            ErrorCode.X_JOB_EVENT_INVALID,
            f"the event payload for step {step!r} does not match its schema",
            meta={"step": step},
        ) from None


def _describe(exc: BaseException) -> str:
    """What a failure records (``last_error``, a step's error): the exception's
    text, made storable by every driver (a NUL in a library's message would make
    PostgreSQL refuse the settle and leave the run held until its lease lapsed)."""
    if isinstance(exc, JobsError):
        return storable(str(exc))
    text = str(exc)
    return storable(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


class JobContext(Generic[I]):
    """What the body receives: input, steps, the abort signal, progress, ids."""

    def __init__(self, state: RunState) -> None:
        self._state = state
        self.input: I = state.input
        self.step = Steps(state)
        self.signal = state.signal
        claimed = state.claimed
        self.job_id: str = claimed.id
        self.run_id: str = claimed.run_id
        self.attempt: int = claimed.attempt
        self.final_attempt: bool = claimed.attempt >= state.handle.retry.attempts
        self.tenant_id: str | None = claimed.tenant_id
        self.actor: Actor | None = state.actor
        self.jobs: Jobs = state.jobs
        self.name: str = state.handle.name

    def progress(self, done: float, total: float, note: str | None = None) -> None:
        """Record progress; the worker writes it at most once a second, and always
        the last value before the run settles."""
        for value in (done, total):
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
            ):
                raise JobsError(ErrorCode.X_INVARIANT, "progress(done, total) takes finite numbers")
        if note is not None and not isinstance(note, str):
            raise JobsError(ErrorCode.X_INVARIANT, "progress note must be a string")
        self._state.progress = Progress(float(done), float(total), note[:500] if note else None)
        self._state.progress_dirty = True
        if self._state.on_progress is not None:
            self._state.on_progress()

    def __repr__(self) -> str:
        return f"<JobContext {self.name} job_id={self.job_id} attempt={self.attempt}>"


async def run_to_completion(fn: Callable[[], Awaitable[T] | T]) -> T:
    """Run ``fn`` to its end even past the abort: shielded from cancellation, and
    its writes (enqueues, transactions, steps) land although ``ctx.signal`` is
    aborted. Keep it short: the drain budget still bounds the process."""
    token = _ambient.complete_var.set(True)
    try:
        with trio.CancelScope(shield=True):
            return cast("T", await _call(fn))
        raise AssertionError("unreachable: a shielded scope is never cancelled")
    finally:
        _ambient.complete_var.reset(token)
