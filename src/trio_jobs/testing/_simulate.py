"""``simulate_jobs``: many workers over one driver, on a seeded scheduler and a virtual clock.

Every driver call a worker makes waits for a permit. The arbiter grants one
permit at a time, and only when every task is blocked, choosing among the
waiting calls with a ``random.Random(seed)`` over a stable ordering of them.
So the interleaving that matters (which call reaches the driver first) is the
seed's, not Trio's scheduler's. When nothing waits for a permit, the arbiter
jumps the virtual clock to the next deadline. Faults are drawn from the same
seed at the same points.

The arbiter is no task: it runs between Trio's scheduler passes (see
:class:`_Arbiter`), so a permit costs no pass of its own, and a task the seed
picks again goes on without yielding at all.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import inspect
import math
import random
import sys
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any, Literal, overload

import attrs
import orjson
import trio

from .. import _ambient
from .._attempt import LEGAL, Attempt, Phase
from .._declare import Job
from .._facade import Jobs, open_jobs
from .._store import INLINE as store_inline
from .._task import tasks_of
from .._time import UuidSource
from .._worker import Worker
from ..drivers._protocol import (
    LIVE_STATES,
    MAX_ENQUEUE_BATCH,
    TERMINAL_STATES,
    AckOptions,
    ClaimOptions,
    ClaimResult,
    HeartbeatStatus,
    JobView,
    NackOptions,
    StepRecord,
)
from ..drivers.memory import MemoryDriver
from ..errors import ErrorCode, JobsError
from ._crash import Killed

__all__ = ["Faults", "SimulationResult", "World", "simulate_jobs"]

ORIGIN = 1_800_000_000.0
SIM_VT = 30.0


@attrs.frozen(kw_only=True)
class Faults:
    """Seeded faults, each a probability per driver call (or a bound).

    ``crash``: the worker dies at that call (nothing it had not committed lands)
    and a fresh one replaces it later. ``lease_loss``: a heartbeat answers lost.
    ``pause``: the worker stalls up to two visibility timeouts before the call
    (its leases may lapse meanwhile). ``skew``: each worker's clock is off by up
    to this many seconds. ``driver_errors``: the call fails transiently
    (``X_DRIVER_UNAVAILABLE``), before or after it reached the driver.
    ``lost_wakeups``: no wake-up is ever delivered; polling must carry the load.
    ``drain``: the worker is drained (SIGTERM) at that call, then replaced.
    """

    crash: float = 0.0
    lease_loss: float = 0.0
    pause: float = 0.0
    skew: float = 0.0
    driver_errors: float = 0.0
    lost_wakeups: bool = False
    drain: float = 0.0


@attrs.frozen
class World:
    """What an invariant sees: every job's view and the virtual now."""

    jobs: Sequence[JobView]
    now: float
    driver: MemoryDriver


@attrs.frozen
class SimulationResult:
    """``seed``, the ordered ``trace`` of events (identical for the same seed),
    and the final ``world``."""

    seed: int
    trace: Sequence[tuple[Any, ...]]
    world: World
    #: Jobs claimed and run: a claim handed straight back because its
    #: concurrency key was busy (or that a transient error hid) is no run.
    job_runs: int

    def trace_bytes(self) -> bytes:
        return orjson.dumps(list(self.trace))


#: A permit request: the worker, its task's role, and how many permits that task had.
Key = tuple[str, str, int]


class InvariantBroken(AssertionError):
    """A built-in invariant failed."""


class _Violated(Exception):
    """The run ends at a built-in check's first violation; raised as
    ``InvariantBroken`` with every violation the checker recorded by then."""


# --------------------------------------------------------------------------- the arbiter


#: Scheduler passes at one virtual instant after which a run is a livelock (a
#: seed takes a few thousand passes in all; a whole one at one instant is rare).
LIVELOCK_PASSES = 1_000_000


class _Arbiter(trio.abc.Instrument):
    """Grants driver permits one at a time, each drawn by the seed among the
    calls waiting while every task is blocked; moves the virtual clock when
    none can be granted.

    It runs between scheduler passes, as a Trio instrument. Trio asks the clock
    how long it may sleep only when no task is runnable; the pass that follows
    calls ``before_io_wait`` before any task runs. There, with every task
    blocked and no deadline due, the arbiter draws the next permit with
    ``random.Random(seed)`` over the sorted keys of the waiting calls (so what
    it draws from never depends on Trio's scheduler order), and the task
    granted runs in that same pass, alone. With nothing to grant it jumps the
    clock to the next deadline, and the tasks due run in that same pass.

    A task granted alone that asks again before it yields, having woken no
    task and with no deadline due, is itself at that quiescent instant: it
    draws there, and goes on without yielding when the draw is its own call.
    """

    def __init__(self, rng: random.Random, clock: _VirtualClock) -> None:
        self.rng = rng
        self.clock = clock
        #: The tasks waiting for a permit, by key; ``order`` holds the keys sorted.
        self.waiting: dict[Key, trio.lowlevel.Task] = {}
        self.order: list[Key] = []
        self.counts: dict[tuple[str, str], int] = {}
        #: A stopped worker's calls are granted no permit until it comes back.
        self.paused: dict[str, float] = {}
        self.trace: list[tuple[Any, ...]] = []
        #: Scheduler passes so far, and the task that runs alone in the current one.
        self.passes = 0
        #: The virtual instant the clock was last seen at, and since which pass.
        self._still_at = -1.0
        self._still_since = 0
        self.solo: trio.lowlevel.Task | None = None
        self.solo_pass = -1
        #: Until the simulation stops (or can go nowhere), the arbiter acts.
        self.active = True
        #: Async checks still running: no permit until they finish.
        self.checking = 0
        #: Whether a task may draw at the quiescent instant itself (not once a
        #: check ran async: it may yield, and the task is not alone then).
        self.solo_draws = True
        # Set by the simulation:
        self.stopped = trio.Event()
        self.poll: _QuietPoll | None = None
        self.nursery: trio.Nursery | None = None
        #: Called after every grant (``check="every-event"``); answers an awaitable
        #: when the invariant is async.
        self.on_grant: Callable[[], Awaitable[None] | None] | None = None
        self.broke: Callable[[BaseException], None] = _reraise

    # ------------------------------------------------------------------ drawing

    def _choose(self, extra: Key | None) -> Key | None:
        """The seed's pick among the waiting keys (and ``extra``), in sorted order."""
        order = self.order
        paused = self.paused
        if paused:
            now = self.clock.now
            for who in [w for w, until in paused.items() if until <= now]:
                del paused[who]  # back: the same as never paused
        if paused:
            keys = [k for k in order if k[0] not in paused]
            if extra is not None and extra[0] not in paused:
                bisect.insort(keys, extra)
            if not keys:
                return None
            return keys[self.rng.randrange(len(keys))]
        if extra is None:
            return order[self.rng.randrange(len(order))] if order else None
        i = self.rng.randrange(len(order) + 1)
        at = bisect.bisect_left(order, extra)
        return order[i] if i < at else extra if i == at else order[i - 1]

    def _forget(self, key: Key) -> trio.lowlevel.Task:
        order = self.order
        del order[bisect.bisect_left(order, key)]
        return self.waiting.pop(key)

    def _granted(self, key: Key | None) -> None:
        """Wake the task waiting under ``key`` (None: the one drawing), then check."""
        if key is not None:
            trio.lowlevel.reschedule(self._forget(key))
        if self.on_grant is not None:
            pending = self.on_grant()
            if pending is not None:
                # The check runs on, as its own task; no permit until it is done.
                self.solo_draws = False
                self._set_checking(self.checking + 1)
                assert self.nursery is not None
                self.nursery.start_soon(self._finish_check, pending)

    async def _finish_check(self, pending: Awaitable[None]) -> None:
        try:
            await pending
        finally:
            self._set_checking(self.checking - 1)

    def _set_checking(self, n: int) -> None:
        self.checking = n
        self.clock.acting = self.active and not n

    def _stop(self) -> None:
        self.active = False
        self.clock.acting = False

    # ------------------------------------------------------------------ permits

    async def permit(self, who: str) -> None:
        # A stable key: which worker, which of its (sequential) tasks, and how many
        # permits that task had before. Arrival order, which Trio decides, is not in it.
        role = _ambient.role_var.get()
        n = self.counts.get((who, role), 0)
        self.counts[(who, role)] = n + 1
        key = (who, role, n)
        task = trio.lowlevel.current_task()
        drawn = False
        if (
            self.solo is task
            and self.solo_pass == self.passes
            and self.clock.acting
            and not self.clock.held
        ):
            if self.solo_draws and _quiet(self.clock.now):
                # Every other task is blocked, and this one is about to be: the
                # quiescent instant the arbiter would draw at, one pass later.
                # (Cancelled? Then this is no request: raise, as the wait would.)
                await trio.lowlevel.checkpoint_if_cancelled()
                chosen = self._choose(key)
                if chosen == key:
                    self._granted(None)
                    return
                if chosen is not None:
                    trio.lowlevel.reschedule(self._forget(chosen))
                    drawn = True
        self.waiting[key] = task
        bisect.insort(self.order, key)
        if drawn and self.on_grant is not None:
            self._granted(None)  # checked with this call waiting, as between passes

        def abort(_: Any) -> trio.lowlevel.Abort:
            # Cancelled while waiting (its worker is going away): no stale permit.
            self._forget(key)
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)
        # Granted at a quiescent instant: this task runs alone in this pass.
        self.solo = task
        self.solo_pass = self.passes

    # ------------------------------------------------------------------ between passes

    def before_io_wait(self, timeout: float) -> None:
        self.passes += 1
        if self.clock.now != self._still_at:
            self._still_at, self._still_since = self.clock.now, self.passes
        elif self.passes - self._still_since > LIVELOCK_PASSES:
            # Tasks checkpoint for ever and virtual time never moves: a bug
            # (a loop on a deadline that has passed, say) that would otherwise
            # hang the seed, and the CI gate with it. The run fails; the clock
            # then moves on (the arbiter still acting), so a loop no cancel
            # reaches (a shielded one) ends and the run can wind down.
            stuck = self.clock.now
            self.clock.jump(1.0)
            self.broke(
                JobsError(
                    ErrorCode.X_INVARIANT,
                    f"livelock: {LIVELOCK_PASSES:,} scheduler passes at virtual time "
                    f"{stuck:.6f} without the clock moving (a task loops on "
                    "checkpoints; replay the seed to see which)",
                )
            )
            return
        deadline = self.clock.asked
        if deadline is None:
            return  # a task is runnable (or a deadline due): not quiescent
        self.clock.asked = None
        try:
            self._quiescent(deadline)
        except BaseException as exc:  # a bug here must fail the run, not stall it
            self._stop()
            self.broke(exc)

    def _quiescent(self, deadline: float) -> None:
        """Every task is blocked and the next deadline is ``deadline``: grant a
        permit, or move the clock (taking the quiet polls on the way)."""
        clock = self.clock
        poll = self.poll
        assert poll is not None
        while True:
            chosen = self._choose(None)
            if chosen is not None:
                self._granted(chosen)
                return
            if self.stopped.is_set():
                self._stop()
                return
            target = min(deadline, poll.at)
            if target == math.inf:
                self._stop()  # nothing can ever move again
                return
            # (Past max_time too: the quiet poll ends the simulation there, and the
            # clean-up after it may still wait on a deadline, a paused worker's.)
            clock.jump_to(target)
            if clock.now < poll.at:
                return  # a task's deadline: the task runs in this pass
            if poll.due(clock.now):
                return  # main wakes to end the simulation
            if deadline <= clock.now:
                return  # a task's deadline at the same instant


def _reraise(exc: BaseException) -> None:
    raise exc


def _quiet_public(now: float) -> bool:
    """No task runnable and no deadline due, by Trio's public run statistics."""
    stats = trio.lowlevel.current_statistics()
    return stats.tasks_runnable == 0 and stats.seconds_to_next_deadline > 0


def _quiet_runner(now: float) -> bool:
    """The same two facts read off Trio's runner (the public call also builds the
    I/O backend's statistics: about a tenth of a permit's cost). ``now`` is the
    simulation's virtual clock, which is Trio's clock in its run."""
    runner = _RUN_CONTEXT.runner
    return not runner.runq and runner.deadlines.next_deadline() > now


try:  # Trio's per-thread run context, which holds the current run's runner
    from trio._core._run import GLOBAL_RUN_CONTEXT as _RUN_CONTEXT
    from trio._core._run import Runner as _Runner

    _READABLE = {"runq", "deadlines"} <= set(attrs.fields_dict(_Runner))
except (ImportError, attrs.exceptions.NotAnAttrsClassError):  # pragma: no cover - another Trio
    _READABLE = False
#: Whether every task is blocked and no deadline is due (see ``_Arbiter.permit``).
_quiet = _quiet_runner if _READABLE else _quiet_public


# --------------------------------------------------------------------------- the checked driver


class _Checker:
    """Built-in invariants, checked as calls land."""

    def __init__(self, driver: MemoryDriver) -> None:
        self.driver = driver
        self.completed: dict[tuple[str, str], Any] = {}
        self.holders: dict[str, tuple[Any, float]] = {}
        self.enqueued: set[str] = set()
        self.violations: list[str] = []
        self.settled: set[tuple[str, Any]] = set()
        self.drained: dict[str, set[str]] = {}
        #: Called at the first violation: the run ends there (see ``_simulate``).
        self.on_violation: Callable[[], None] | None = None

    def fail(self, message: str) -> None:
        self.violations.append(message)
        if len(self.violations) == 1 and self.on_violation is not None:
            self.on_violation()

    def on_attempt_move(self, attempt: Attempt, was: Phase, to: Phase) -> None:
        """A worker's attempt changes phase: only the moves of ``_attempt.LEGAL``;
        and it is SETTLED only once a settle of its claim landed (a worker that
        forgot an attempt whose ack was still in flight would stop renewing a
        row that may yet be refused)."""
        if to not in LEGAL[was]:
            self.fail(
                f"illegal attempt move {was.value} -> {to.value} of job "
                f"{attempt.claimed.id} (claim {attempt.claimed.fence.claim})"
            )
        claimed = attempt.claimed
        if to is Phase.SETTLED and (claimed.id, claimed.fence) not in self.settled:
            self.fail(
                f"attempt of job {claimed.id} (claim {claimed.fence.claim}) settled before "
                "any settle of its claim landed"
            )

    def on_claim(self, result: ClaimResult) -> None:
        now = self.driver.now()
        for job in result.jobs:
            held = self.holders.get(job.id)
            if held is not None and held[1] > now and held[0] != job.fence:
                self.fail(f"two live leases on job {job.id}: {held[0]} and {job.fence}")
            self.holders[job.id] = (job.fence, job.lease_expires_at)

    def on_released(self, job_ids: list[str]) -> None:
        """Orphans of a claim whose answer was lost went back to the queue: their
        claims hold nothing any more."""
        for job_id in job_ids:
            self.holders.pop(job_id, None)

    def on_settle(self, job_id: str, fence: Any, landed: bool) -> None:
        held = self.holders.get(job_id)
        if landed and held is not None and held[0] == fence and held[1] <= self.driver.now():
            self.fail(f"a settle of job {job_id} landed after its lease lapsed ({fence})")
        if landed and (held is None or held[0] != fence):
            key = (job_id, fence)
            if key in self.settled:
                self.fail(f"claim {fence} of job {job_id} was settled twice")
            else:
                self.fail(f"a settle of job {job_id} landed without holding its lease ({fence})")
        if landed:
            self.settled.add((job_id, fence))
        if held is not None and held[0] == fence:
            del self.holders[job_id]

    def on_boundary(self, label: str, job_id: str, boundary: str, step: str | None) -> None:
        drained = self.drained.get(label)
        if boundary == "before-step" and drained is not None and job_id in drained:
            self.fail(
                f"job {job_id} started step {step!r} after its worker {label} aborted it (drain)"
            )

    def on_heartbeat(self, job_id: str, fence: Any, status: str) -> None:
        held = self.holders.get(job_id)
        if status == HeartbeatStatus.OK and (
            held is None or held[0] != fence or held[1] <= self.driver.now()
        ):
            self.fail(
                f"a heartbeat of job {job_id} renewed a lease its claim {fence} no longer held"
            )
            return
        if status == HeartbeatStatus.OK:
            row = self.driver._rows.get(job_id)
            if row is not None:
                self.holders[job_id] = (fence, row.lease_expires_at)

    def on_step(self, job_id: str, fence: Any, record: StepRecord, landed: bool) -> None:
        held = self.holders.get(job_id)
        if landed and (held is None or held[0] != fence or held[1] <= self.driver.now()):
            self.fail(f"a step write of job {job_id} landed without holding its lease ({fence})")
        if not landed or record.status != "completed":
            return
        key = (job_id, record.name)
        if key in self.completed:
            self.fail(f"step {record.name!r} of job {job_id} recorded completed twice")
        self.completed[key] = record.output

    def on_nack(self, job_id: str, options: NackOptions, attempt_before: int, landed: bool) -> None:
        if (
            landed
            and options.error_code == ErrorCode.X_RATE_LIMITED
            and (options.counted or options.state in ("dead", "failed"))
        ):
            self.fail(
                f"job {job_id} was rate limited and handed back {options.state} with its attempt "
                "counted: a run waiting for a budget spends no attempt"
            )
        if landed and options.counted and options.state == "ready" and options.last_error is None:
            self.fail(
                f"job {job_id} was handed back with its attempt counted but no failure (a drain?)"
            )
        if not landed or options.counted:
            return
        row = self.driver._rows.get(job_id)
        if row is not None and row.attempts != attempt_before - 1:
            self.fail(f"an uncounted hand-back of job {job_id} left attempts at {row.attempts}")

    def at_rest(self) -> None:
        rows = self.driver._rows
        for job_id in self.enqueued:
            if job_id not in rows:
                self.fail(f"committed job {job_id} was lost")
        now = self.driver.now()
        for (lease_key, _slot), (holder, _fence, expires) in self.driver._leases.items():
            row = rows.get(holder)
            if expires > now and (row is None or row.state != "running"):
                self.fail(f"settled job {holder} still holds a concurrency lease on {lease_key!r}")


_LEGAL = {
    ("ready", "running"),
    ("delayed", "running"),
    ("suspended", "running"),
    ("running", "done"),
    ("running", "dead"),
    ("running", "failed"),
    ("running", "ready"),
    ("running", "delayed"),
    ("running", "suspended"),
    ("ready", "cancelled"),
    ("delayed", "cancelled"),
    ("suspended", "cancelled"),
    ("running", "cancelled"),
    ("delayed", "ready"),
    ("suspended", "ready"),
}


class _SimDriver:
    """One worker's view of the shared driver: permits, faults, checks, trace."""

    def __init__(self, sim: _Sim, label: str, skew: float) -> None:
        self._sim = sim
        self._d = sim.driver
        self._clock = sim.clock
        self.label = label
        self.skew = skew
        self.dead = False
        self.changed = trio.Event()  # set when this worker crashes or is drained
        self.name = self._d.name
        self.steps = _Sub(self, "steps", self._d.steps)
        self.events = _Sub(self, "events", self._d.events)
        self.leases = _Sub(self, "leases", self._d.leases)
        self.rate_limits = _Sub(self, "rate_limits", self._d.rate_limits)
        self.introspect = _Sub(self, "introspect", self._d.introspect)
        self.backfills = _Sub(self, "backfills", self._d.backfills)
        self.tasks = _Sub(self, "tasks", self._d.tasks)
        #: The worker's ack pipeline under the seeded runs: each batch one gated
        #: call (its faults, crashes and pauses), each of its acks checked as
        #: ack()'s is; a batch that failed retries its acks through ack().
        self.acks = _SimAcks(self) if self._d.acks is not None else None
        self.wake = _SimWake(self) if self._d.wake is not None else None
        self.event_poll_default = 30.0
        #: Never closed under the simulation: a crashed worker raises ``Killed``.
        self.closed = False
        self._arbiter = sim.arbiter
        faults = sim.faults
        #: The app enqueueing is not a worker: no faults there.
        self._faulty = label != "scenario" and bool(
            faults.pause or faults.crash or faults.drain or faults.driver_errors
        )

    def now(self) -> float:
        return ORIGIN + self._clock.now + self.skew  # the driver's now(), skewed

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    @contextlib.asynccontextmanager
    async def open_in(self, nursery: trio.Nursery) -> AsyncIterator[None]:
        yield

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Any]:
        await self._gate("transaction", ())
        async with self._d.transaction() as tx:
            yield tx
            # The commit is a call of its own: a worker may die just before it
            # (nothing of the transaction lands), or the answer may be lost
            # before or after it landed.
            fault = await self._gate("transaction.commit", ())
            if fault == "error-before":
                self._sim.record(self.label, "transaction.commit", fault)
                raise JobsError(ErrorCode.X_DRIVER_UNAVAILABLE, "simulated transient driver error")
        if fault == "error-after":
            self._sim.record(self.label, "transaction.commit", fault)
            raise JobsError(
                ErrorCode.X_DRIVER_UNAVAILABLE, "simulated transient driver error (after landing)"
            )

    async def _gate(self, method: str, args: tuple[Any, ...]) -> str | None:
        """Wait for the permit; answer the fault to apply, if any."""
        if self.dead:
            raise Killed()
        await self._arbiter.permit(self.label)
        if self.dead:
            raise Killed()
        return await self._fault(method) if self._faulty else None

    async def _fault(self, method: str) -> str | None:
        """Draw this call's faults (the permit is held); answer the one to apply."""
        sim = self._sim
        faults = sim.faults
        rng = sim.fault_rng
        if faults.pause and rng.random() < faults.pause:
            pause = rng.uniform(0, 2 * SIM_VT)
            sim.record(self.label, "pause", round(pause, 3))
            # The whole worker is stopped (SIGSTOP): none of its calls, heartbeats
            # included, reach the driver until it comes back. The arbiter holds its
            # permits; an alarm marks the instant it is back.
            until = trio.current_time() + pause
            sim.arbiter.paused[self.label] = until
            sim.alarm(until)
            await sim.arbiter.permit(self.label)
        if faults.crash and rng.random() < faults.crash:
            sim.record(self.label, "crash", method)
            self.dead = True
            sim.crashed(self)
            raise Killed()
        if faults.drain and rng.random() < faults.drain and not sim.draining(self):
            sim.record(self.label, "drain", method)
            sim.drain(self)
        if faults.driver_errors and method != "wait" and rng.random() < faults.driver_errors:
            when = "before" if rng.random() < 0.5 else "after"
            return f"error-{when}"
        return None

    async def _call(self, method: str, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        fault = await self._gate(method, args)
        if fault == "error-before":
            self._sim.record(self.label, method, "error-before")
            if method == "leases.acquire":
                self._sim.job_runs -= 1  # the worker hands the job back: no run
            raise JobsError(ErrorCode.X_DRIVER_UNAVAILABLE, "simulated transient driver error")
        attempt_before = 0
        if method == "nack":
            row = self._d._rows.get(args[0])
            attempt_before = row.attempts if row is not None else 0
        result = await fn(*args)
        touched = _TOUCHED.get(method)
        if touched is not None:
            self._sim.check_transitions(touched(args, result), method)
        self._observe(method, args, result, attempt_before)
        if fault == "error-after":
            self._sim.record(self.label, method, "error-after")
            if method == "claim":
                self._sim.job_runs -= len(result.jobs)  # the worker never saw them
            elif method == "leases.acquire" and result.slot is not None:
                self._sim.job_runs -= 1  # the worker hands the job back: no run
            raise JobsError(
                ErrorCode.X_DRIVER_UNAVAILABLE, "simulated transient driver error (after landing)"
            )
        return result

    def _observe(
        self, method: str, args: tuple[Any, ...], result: Any, attempt_before: int
    ) -> None:
        sim = self._sim
        checker = sim.checker
        if method == "steps.put":  # the commonest call first
            job_id, fence, record = args
            checker.on_step(job_id, fence, record, bool(result))
            sim.record(self.label, "step", job_id[:8], record.name, record.status, bool(result))
        elif method == "claim":
            assert isinstance(result, ClaimResult)
            checker.on_claim(result)
            sim.job_runs += len(result.jobs)
            sim.record(
                self.label,
                "claim",
                [j.id[:8] for j in result.jobs],
                [e.id[:8] for e in result.exhausted],
            )
        elif method == "release_orphans":
            checker.on_released(list(result))
            sim.record(self.label, "released", [i[:8] for i in result])
        elif method == "enqueue_many":
            for r in result:
                checker.enqueued.add(r.id)
            sim.record(self.label, "enqueue", [(r.id[:8], r.deduped) for r in result])
        elif method == "acks.ack_many":
            for (job_id, options), landed in zip(args[0], result, strict=True):
                checker.on_settle(job_id, options.fence, bool(landed))
            pairs = zip(args[0], result, strict=True)
            sim.record(self.label, "ack_many", [(j[:8], bool(x)) for (j, _o), x in pairs])
        elif method in ("ack", "nack"):
            job_id, options = args
            checker.on_settle(job_id, options.fence, bool(result))
            if method == "nack":
                checker.on_nack(job_id, options, attempt_before, bool(result))
                sim.record(
                    self.label, "nack", job_id[:8], options.state, options.counted, bool(result)
                )
            else:
                sim.record(self.label, "ack", job_id[:8], bool(result))
        elif method == "heartbeat":
            requests, _vt = args
            for req, status in zip(requests, result, strict=True):
                checker.on_heartbeat(req.job_id, req.fence, status)
            sim.record(
                self.label,
                "heartbeat",
                [(r.job_id[:8], s) for r, s in zip(requests, result, strict=True)],
            )
        elif method == "leases.acquire" and result.slot is None:
            # The key is busy: the job goes back unrun. Job runs count the
            # claims a worker got to run, not these hand-backs.
            sim.job_runs -= 1
        else:
            sim.record(self.label, method)

    async def enqueue_many(self, requests: Any) -> Any:
        return await self._call("enqueue_many", self._d.enqueue_many, requests)

    async def claim(self, options: ClaimOptions) -> Any:
        return await self._call("claim", self._d.claim, options)

    async def ack(self, job_id: str, options: AckOptions) -> Any:
        return await self._call("ack", self._d.ack, job_id, options)

    async def nack(self, job_id: str, options: NackOptions) -> Any:
        return await self._call("nack", self._d.nack, job_id, options)

    async def release_orphans(self, worker_id: str, held: frozenset[int]) -> Any:
        return await self._call("release_orphans", self._d.release_orphans, worker_id, held)

    async def heartbeat(self, requests: Any, visibility_timeout: float) -> Any:
        faults = self._sim.faults
        result = await self._call("heartbeat", self._d.heartbeat, requests, visibility_timeout)
        if faults.lease_loss and self._sim.fault_rng.random() < faults.lease_loss:
            self._sim.record(self.label, "lease-loss")
            return [HeartbeatStatus.LOST for _ in result]
        return result

    async def stats(self) -> Any:
        return await self._call("stats", self._d.stats)

    async def attempt_log(self, job_id: str) -> Any:
        # An operator's read: never gated (no worker path calls it).
        return await self._d.attempt_log(job_id)


class _SimAcks:
    """The shared driver's ``acks``, gated as one call a batch."""

    def __init__(self, owner: _SimDriver) -> None:
        self._owner = owner

    async def ack_many(self, acks: Sequence[tuple[str, AckOptions]]) -> Any:
        owner = self._owner
        inner = owner._d.acks
        assert inner is not None
        return await owner._call("acks.ack_many", inner.ack_many, list(acks))


class _Sub:
    def __init__(self, owner: _SimDriver, prefix: str, target: Any) -> None:
        self._owner = owner
        self._prefix = prefix
        self._target = target

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not inspect.iscoroutinefunction(value):
            return value
        method = f"{self._prefix}.{name}"
        if method not in _UNGATED:
            value = functools.partial(self._owner._call, method, value)
        # Bound once: the next lookup finds it here without calling __getattr__.
        setattr(self, name, value)
        return value


class _SimWake:
    def __init__(self, owner: _SimDriver) -> None:
        self._owner = owner

    @property
    def live(self) -> bool:
        # What the memory wake says (proven). Under ``lost_wakeups`` the worker
        # still believes it: a wake that stops delivering unannounced is the
        # fault, and the idle poll ceiling must carry the load.
        wake = self._owner._d.wake
        return wake is not None and wake.live

    async def wait(self, queues: Sequence[str], timeout: float) -> bool:
        if self._owner.dead:
            raise Killed()
        if self._owner._sim.faults.lost_wakeups:
            await trio.sleep(timeout)
            return False
        wake = self._owner._d.wake
        assert wake is not None
        return await wake.wait(queues, timeout)


# --------------------------------------------------------------------------- the simulation


class _VirtualClock(trio.abc.Clock):
    """Trio's clock for the simulation: virtual time that moves only by :meth:`jump`.

    What :class:`trio.testing.MockClock` does at rate 0, without reading the
    real clock on every ``trio.current_time()`` (the workers read it thousands
    of times a seed)."""

    def __init__(self) -> None:
        self.now = 0.0
        #: Whether the arbiter acts between passes (see :class:`_Arbiter`).
        self.acting = True
        #: The next deadline, when Trio last found no task runnable.
        self.asked: float | None = None
        #: Outside calls in flight (``_time.outside_call``): their real-time ends.
        self.held: dict[int, float] = {}
        self._holds = 0
        #: Set by the simulation: ``async with outside(limit)`` around a real call.
        self.outside: Callable[[float], contextlib.AbstractAsyncContextManager[None]] | None = None

    def start_clock(self) -> None:
        return None

    def current_time(self) -> float:
        return self.now

    def hold(self, limit: float) -> int:
        """An outside call starts: virtual time stands still (no jump, no permit)
        until it ends or ``limit`` real seconds pass, so its answer arrives at the
        same virtual instant whatever the outside world's latency."""
        self._holds += 1
        self.held[self._holds] = time.monotonic() + max(0.0, limit)
        return self._holds

    def release(self, token: int) -> None:
        self.held.pop(token, None)

    def holding(self) -> float:
        """Real seconds the longest outside call in flight may still hold the clock."""
        if not self.held:
            return 0.0
        left = max(self.held.values()) - time.monotonic()
        if left <= 0:
            self.held.clear()  # the calls overran their limit: time moves again
            return 0.0
        return left

    def deadline_to_sleep_time(self, deadline: float) -> float:
        # Trio asks only when no task is runnable.
        if deadline <= self.now:
            return 0.0
        if self.held:
            left = self.holding()
            if left > 0:
                return left  # wait for the outside world, for real; the clock stays
        if self.acting:
            self.asked = deadline  # every task blocked: the arbiter's turn, now
            return 0.0
        return 999999999.0  # the arbiter has stopped: sleep "forever", like MockClock

    def jump(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time can't go backwards")
        self.now += seconds

    def jump_to(self, instant: float) -> None:
        """Move the clock to ``instant`` exactly. Not ``jump(instant - now)``:
        ``now + (instant - now)`` may round to just below ``instant``, and a
        deadline the clock never reaches is asked for again and again (a
        seed spun for ever on the ack pipeline's hold, ``held_since + 0.5``)."""
        if instant < self.now:
            raise ValueError("time can't go backwards")
        self.now = instant


class _QuietPoll:
    """The simulation ends at the first whole virtual second (counted from when
    the workers start) at which every job is settled, or at ``max_time``.

    Looking costs no task step: ``at`` is the next look, which the arbiter
    treats as a deadline and takes itself when the clock reaches it, as a task
    sleeping a second at a time would (the rows only move at permits, so what a
    look sees is the same). Main waits until a look finds the simulation over."""

    def __init__(self, driver: MemoryDriver, max_time: float, *, forever: bool = False) -> None:
        self._driver = driver
        self._max_time = max_time
        #: Scheduled tasks fire for ever: the simulation runs to ``max_time``.
        self._forever = forever
        self.at = math.inf
        self._over = trio.Event()

    async def wait(self, first: float) -> None:
        self.at = first
        try:
            await self._over.wait()
        finally:
            self.at = math.inf

    def due(self, now: float) -> bool:
        """Look, at ``now`` (the clock has reached ``at``); answer whether main wakes."""
        rows = self._driver._rows.values()
        settled = not self._forever and all(r.state in TERMINAL_STATES for r in rows)
        if settled or now >= self._max_time:
            self.at = math.inf
            self._over.set()
            return True
        self.at = now + 1.0  # main's next one-second sleep, from the instant it woke
        return False


class _SimClock:
    """The driver's wall clock: the virtual clock, from ``ORIGIN``."""

    def __init__(self, clock: _VirtualClock) -> None:
        self._clock = clock

    def now(self) -> float:
        return ORIGIN + self._clock.now


class _Sim:
    def __init__(self, seed: int, faults: Faults) -> None:
        self.seed = seed
        self.faults = faults
        self.clock = _VirtualClock()
        self.arbiter = _Arbiter(random.Random(seed), self.clock)
        self.fault_rng = random.Random(seed * 7919 + 1)
        self.driver = MemoryDriver(clock=_SimClock(self.clock))
        self.clock.outside = self._outside
        self.checker = _Checker(self.driver)
        self.trace = self.arbiter.trace
        self.job_runs = 0
        self._crashed: list[_SimDriver] = []
        self._drains: set[str] = set()
        self.workers: dict[str, Worker] = {}
        self.drain_requests: list[str] = []
        self.shadow: dict[str, str] = {}
        self.nursery: trio.Nursery | None = None
        self.final_views: list[JobView] = []
        self.final_now = ORIGIN

    @contextlib.asynccontextmanager
    async def _outside(self, limit: float) -> AsyncIterator[None]:
        """An outside call (``_time.outside_call``): its turn is a permit the seed
        draws (its worker's, under its task's role), and while it is in flight the
        clock is held, so no other call is granted: outside calls run one at a
        time, in the seed's order, at a virtual instant their latency never moves."""
        run = _ambient.run_var.get()
        who = getattr(getattr(run, "driver", None), "label", None) or "outside"
        await self.arbiter.permit(who)
        self.record(who, "outside", _ambient.role_var.get())
        token = self.clock.hold(limit)
        try:
            yield
        finally:
            self.clock.release(token)

    def record(self, *event: Any) -> None:
        self.trace.append((round(self.clock.now, 6), *event))

    def check_transitions(self, touched: Sequence[str], method: str) -> None:
        """Compare each touched row's state with the last one seen (a shadow)."""
        rows = self.driver._rows
        for job_id in touched:
            row = rows.get(job_id)
            new = row.state if row is not None else "removed"
            old = self.shadow.get(job_id)
            self.shadow[job_id] = new
            if old is None or old == new or method.startswith("introspect"):
                continue
            if (old, new) not in _LEGAL and not (method == "claim" and old == "running"):
                self.checker.fail(f"illegal transition {old} -> {new} of job {job_id} in {method}")

    def alarm(self, when: float) -> None:
        """A deadline at ``when`` so the virtual clock stops there."""
        if self.nursery is not None:
            self.nursery.start_soon(trio.sleep_until, when)

    def crashed(self, driver: _SimDriver) -> None:
        self._crashed.append(driver)
        driver.changed.set()

    def draining(self, driver: _SimDriver) -> bool:
        return driver.label in self._drains

    def drain(self, driver: _SimDriver) -> None:
        # Abort the held jobs now, at this call, so the seed decides what the
        # drain interrupts; the worker's own task then waits for the bodies.
        worker = self.workers.get(driver.label)
        if worker is not None:
            self.checker.drained[driver.label] = {h.claimed.id for h in worker._held.values()}
            worker.begin_drain()
        self._drains.add(driver.label)
        self.drain_requests.append(driver.label)
        driver.changed.set()


#: Calls that move nothing the invariants or other workers read: no permit, no trace line.
_UNGATED = frozenset({"introspect.record_worker", "introspect.remove_worker", "introspect.workers"})


def _seed_trio_scheduler(seed: int) -> None:
    """Make Trio's batch shuffle reproducible inside the simulation's own run.

    The interleavings that decide correctness are the arbiter's; this only pins
    incidental orders (two timers of one worker firing at the same virtual
    instant) so a seed replays byte for byte. It uses the same private hook
    pytest-trio uses for Hypothesis; without it, traces still agree on every
    driver call the arbiter ordered."""
    try:
        from trio._core import _run
    except ImportError:  # pragma: no cover - a Trio without the hook
        return
    rng = getattr(_run, "_r", None)
    if isinstance(rng, random.Random):
        rng.seed(seed)


def _first_arg(args: tuple[Any, ...], result: Any) -> list[str]:
    return [args[0]]


#: The rows each call may have moved, by method; a call not here (a step write,
#: say) moves no row's state.
_TOUCHED: dict[str, Callable[[tuple[Any, ...], Any], list[str]]] = {
    "claim": lambda args, result: [j.id for j in result.jobs] + [e.id for e in result.exhausted],
    "enqueue_many": lambda args, result: [r.id for r in result],
    "ack": _first_arg,
    "acks.ack_many": lambda args, result: [job_id for job_id, _options in args[0]],
    "nack": _first_arg,
    "introspect.cancel": _first_arg,
    "introspect.requeue": _first_arg,
    "introspect.promote": _first_arg,
    "heartbeat": lambda args, result: [r.job_id for r in args[0]],
    "release_orphans": lambda args, result: list(result),
}


def _batches(
    scenario: Sequence[tuple[Job[Any, Any], Any]],
) -> Iterator[list[tuple[Job[Any, Any], Any]]]:
    """The scenario's ``(job, input)`` pairs in order, cut where the job changes
    (and at ``MAX_ENQUEUE_BATCH``)."""
    group: list[tuple[Job[Any, Any], Any]] = []
    for pair in scenario:
        if group and (pair[0] is not group[0][0] or len(group) >= MAX_ENQUEUE_BATCH):
            yield group
            group = []
        group.append(pair)
    if group:
        yield group


def _without_killed(exc: BaseException) -> BaseException | None:
    """``exc`` less its simulated crashes (``Killed``), or ``None`` when that was
    all of it. A crash may land as the simulation ends: then the group holds the
    end's ``Cancelled`` too, which must go on up to the scope that was cancelled."""
    if isinstance(exc, Killed):
        return None
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(Killed)[1]
    return exc


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    value = fn(*args)
    if inspect.isawaitable(value):
        value = await value
    return value


async def _simulate(
    jobs: Sequence[Job[Any, Any]],
    workers: int,
    seed: int,
    scenario: Any,
    invariant: Callable[[World], Any] | None,
    faults: Faults,
    check: str,
    max_time: float,
    worker_options: dict[str, Any],
) -> SimulationResult:
    sim = _Sim(seed, faults)
    ids = UuidSource(seed)
    labels = [f"w{i}" for i in range(workers)]
    generation: dict[str, int] = dict.fromkeys(labels, 0)
    done = trio.Event()
    failure: list[BaseException] = []

    def check_now(jobs: _Views | None = None) -> Awaitable[Any] | None:
        """Raise on a broken invariant; an async invariant answers its awaitable."""
        violations = list(sim.checker.violations)
        if violations:
            raise InvariantBroken("; ".join(violations))
        if invariant is not None:
            jobs = _Views(sim.driver) if jobs is None else jobs
            world = World(jobs, sim.driver.now(), sim.driver)
            refs = sys.getrefcount(world), sys.getrefcount(jobs)
            value: object = invariant(world)
            if inspect.isawaitable(value):
                jobs.read()  # it runs on: the views of this instant, now
                return value
            if refs != (sys.getrefcount(world), sys.getrefcount(jobs)):
                jobs.read()  # it kept the world: the views of this instant, now
        return None

    def broke(exc: BaseException) -> None:
        failure.append(exc)
        done.set()
        for scope in inner:
            scope.cancel()

    async def check_pending(pending: Awaitable[Any]) -> None:
        try:
            await pending
        except BaseException as exc:
            broke(exc)

    def check_event() -> Awaitable[None] | None:
        try:
            pending = check_now()
        except BaseException as exc:
            broke(exc)
            return None
        return None if pending is None else check_pending(pending)

    arbiter = sim.arbiter
    arbiter.broke = broke
    # A built-in check's violation is final (nothing after it can undo it): the
    # run ends at once rather than going on to quiet, which a broken run may
    # never reach before max_time (an unfenced settle's zombies: 30 virtual
    # days, minutes of wall time, for a violation seen in the first seconds).
    sim.checker.on_violation = lambda: broke(_Violated())
    if check == "every-event":
        arbiter.on_grant = check_event

    async def run_worker(label: str, nursery: trio.Nursery) -> None:
        gen = generation[label]
        # Per-worker draws come from their own stream, keyed by who they are, so the
        # order in which replacements start cannot change them.
        own = random.Random(f"{seed}:{label}:{gen}")
        skew = own.uniform(-faults.skew, faults.skew) if faults.skew else 0.0
        restart = own.uniform(1.0, SIM_VT)
        proxy = _SimDriver(sim, f"{label}.{gen}", skew)
        facade = Jobs(proxy, list(jobs), ids=ids)
        options = {
            "visibility_timeout": SIM_VT,
            "poll_interval": 0.25,
            # The product's ceiling behind a proven wake (the memory wake is one);
            # under lost_wakeups the polls at this ceiling carry all the load.
            "idle_poll_max": 5.0,
            # Off the 0.25 s grid of the polls and the 1 s grid of progress, so no
            # two of one worker's timers fire at the same virtual instant.
            "heartbeat_interval": 9.987654,
            # Every simulated worker spends the one memory driver's rate limits.
            "fleet": "single",
            **worker_options,
        }
        worker_label = proxy.label

        async def boundary(name: str, step: str | None) -> None:
            role = _ambient.role_var.get()
            if role.startswith("job:"):
                sim.checker.on_boundary(worker_label, role[4:], name, step)

        worker = Worker(
            facade,
            worker_id=f"{label}.{gen}",
            jitter=random.Random(seed + gen * 1009 + zlib.crc32(label.encode()) % 997),
            # The boundary check watches drained workers: without drains it has
            # nothing to watch, and the hook (an await per step boundary) is left out.
            boundary=boundary if faults.drain else None,
            **options,
        )
        # Every attempt's move is held to the worker's one table (_attempt.LEGAL).
        worker._on_move = sim.checker.on_attempt_move

        async def ack_gate() -> None:
            # The ack pipeline takes its next batch when the arbiter says.
            if proxy.dead:
                raise Killed()
            await sim.arbiter.permit(worker_label)
            if proxy.dead:
                raise Killed()

        worker._ack_gate = ack_gate
        sim.workers[proxy.label] = worker
        try:
            async with trio.open_nursery() as inner:
                inner.start_soon(worker.run)
                while not proxy.dead and proxy.label not in sim._drains and not done.is_set():
                    await proxy.changed.wait()
                if proxy.label in sim._drains and not proxy.dead:
                    await worker.drain()
                inner.cancel_scope.cancel()
        except BaseException as exc:
            rest = _without_killed(exc)
            if rest is exc:
                raise
            if rest is not None:
                raise rest from None
        if done.is_set():
            return
        generation[label] = gen + 1

        async def later() -> None:
            await trio.sleep(restart)
            if not done.is_set():
                await run_worker(label, nursery)

        nursery.start_soon(later)

    inner: list[trio.CancelScope] = []
    poll = arbiter.poll = _QuietPoll(sim.driver, max_time, forever=bool(tasks_of(jobs)))

    stopped = arbiter.stopped

    async def main(clock: _VirtualClock) -> None:
        _seed_trio_scheduler(seed)
        store_inline.set(True)  # no worker threads the arbiter cannot see
        async with (
            open_jobs(sim.driver, jobs=jobs, ids=ids) as _facade,
            trio.open_nursery() as outer,
        ):
            # Checks that run async run here (see _Arbiter._granted).
            arbiter.nursery = outer
            async with trio.open_nursery() as alarms:
                sim.nursery = alarms
                async with trio.open_nursery() as nursery:
                    inner.append(nursery.cancel_scope)
                    scenario_driver = _SimDriver(sim, "scenario", 0.0)
                    scenario_facade = Jobs(scenario_driver, list(jobs), ids=ids)
                    token = _ambient.facade_var.set(scenario_facade)
                    try:
                        if callable(scenario):
                            await _call(scenario)
                        else:
                            # One batch per run of consecutive inputs of one job: the
                            # workers start only after, so one call per job would
                            # decide no interleaving, only cost a permit each.
                            for group in _batches(scenario):
                                await group[0][0].enqueue_many([value for _, value in group])
                    finally:
                        _ambient.facade_var.reset(token)
                    for label in labels:
                        nursery.start_soon(run_worker, label, nursery)
                    # quiet: every job settled, looked at once a virtual second
                    if trio.current_time() < max_time and not done.is_set():
                        await poll.wait(clock.now + 1.0)
                    done.set()
                    nursery.cancel_scope.cancel()
                alarms.cancel_scope.cancel()
            stopped.set()
            if failure and isinstance(failure[0], _Violated):
                raise InvariantBroken("; ".join(sim.checker.violations))
            if failure:
                raise failure[0]
            sim.checker.at_rest()
            final = _Views(sim.driver)
            pending = check_now(final)
            if pending is not None:
                await pending
                final = _Views(sim.driver)  # it ran on: the views after it
            # The invariant's views are the final ones when it ran at once.
            sim.final_views = final.read()
            sim.final_now = sim.driver.now()

    clock = sim.clock
    await trio.to_thread.run_sync(
        functools.partial(trio.run, main, clock, clock=clock, instruments=[sim.arbiter])
    )
    world = World(sim.final_views, sim.final_now, sim.driver)
    return SimulationResult(seed=seed, trace=list(sim.trace), world=world, job_runs=sim.job_runs)


class _Views(Sequence[JobView]):
    """``World.jobs``: every job's view, read when the invariant first looks at
    them (with ``check="every-event"`` an invariant that reads only the driver
    then builds none). The check runs at one instant and reads them then; an
    invariant that keeps the world, or runs later, gets them read at once."""

    def __init__(self, driver: MemoryDriver) -> None:
        self._driver = driver
        self._views: list[JobView] | None = None

    def read(self) -> list[JobView]:
        if self._views is None:
            self._views = _views(self._driver)
        return self._views

    @overload
    def __getitem__(self, index: int) -> JobView: ...

    @overload
    def __getitem__(self, index: slice) -> list[JobView]: ...

    def __getitem__(self, index: int | slice) -> JobView | list[JobView]:
        return self.read()[index]

    def __len__(self) -> int:
        return len(self.read())

    def __iter__(self) -> Iterator[JobView]:
        return iter(self.read())

    def __eq__(self, other: object) -> bool:
        return self.read() == (other.read() if isinstance(other, _Views) else other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self.read())


def _views(driver: MemoryDriver) -> list[JobView]:
    """What ``introspect.show`` answers for every job, read synchronously."""
    intro = driver.introspect
    assert intro is not None
    return [intro._view(intro._row(job_id), steps=True) for job_id in list(driver._rows)]


async def simulate_jobs(
    *,
    jobs: Sequence[Job[Any, Any]],
    workers: int = 3,
    seed: int = 42,
    scenario: Sequence[tuple[Job[Any, Any], Any]] | Callable[[], Awaitable[Any]],
    invariant: Callable[[World], Any] | None = None,
    faults: Faults | None = None,
    check: Literal["quiet", "every-event"] = "quiet",
    max_time: float = 30 * 86400.0,
    **worker_options: Any,
) -> SimulationResult:
    """Run ``workers`` workers over one memory driver on a seeded scheduler.

    ``scenario`` is a list of ``(job, input)`` to enqueue (in order, one
    ``enqueue_many`` per run of one job's inputs, before any worker starts), or
    an async callable that enqueues. ``invariant(world)`` fails by raising; it runs once the
    simulation is quiet (every job settled), and between events too with
    ``check="every-event"``. Scheduled tasks (``task()``) among ``jobs`` are
    fired by the workers' schedulers; they never settle for good, so such a
    simulation runs to ``max_time``. Built-in invariants always run: no committed job
    lost, no step result recorded twice, at most one live lease per job, legal
    state transitions only, drained attempts uncounted. A failure is
    ``JobsError("X_SIMULATION_INVARIANT")`` with the seed, and a one-line
    reproduction in its message. The same seed gives the identical trace.
    """
    try:
        return await _simulate(
            list(jobs),
            workers,
            seed,
            scenario,
            invariant,
            faults or Faults(),
            check,
            max_time,
            worker_options,
        )
    except JobsError:
        raise
    except BaseException as exc:
        found = exc
        while isinstance(found, BaseExceptionGroup) and len(found.exceptions) == 1:
            found = found.exceptions[0]
        if isinstance(found, trio.Cancelled | KeyboardInterrupt):
            raise
        raise JobsError(
            ErrorCode.X_SIMULATION_INVARIANT,
            f"simulation seed {seed} broke an invariant: {type(found).__name__}: {found}. "
            f"Reproduce: python -m simulation run --scenario <name> --seed {seed}",
            meta={"seed": seed},
        ) from found


_ = LIVE_STATES
