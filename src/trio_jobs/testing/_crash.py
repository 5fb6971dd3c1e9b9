"""``crash_proof``: kill a job at every boundary and check a fresh worker ends the same."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol

import attrs

from .._declare import Job
from .._facade import Jobs, open_jobs
from .._worker import Worker
from ..drivers._protocol import TERMINAL_STATES
from ..drivers.memory import MemoryDriver
from ..errors import ErrorCode, JobsError
from ._harness import HarnessClock

__all__ = ["MEMORY", "CrashReport", "Ground", "MemoryGround", "crash_proof"]

#: The visibility timeout crash_proof's workers use; a killed run resumes one past it.
CRASH_VT = 30.0
MAX_PASSES = 2_000


class Killed(BaseException):
    """The process died here: raised at a boundary and by every driver call after it."""


class _Switch:
    __slots__ = ("killed",)

    def __init__(self) -> None:
        self.killed = False


class _Dead:
    """Proxy for a driver (or one of its stores) that dies with its process."""

    def __init__(self, target: Any, switch: _Switch) -> None:
        self._target = target
        self._switch = switch

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if (
            name in ("steps", "events", "leases", "introspect", "wake", "backfills")
            and value is not None
        ):
            return _Dead(value, self._switch)
        if name == "transaction":
            return self._transaction
        if inspect.iscoroutinefunction(value):
            switch = self._switch

            async def call(*args: Any, **kwargs: Any) -> Any:
                if switch.killed:
                    raise Killed()
                result = await value(*args, **kwargs)
                if switch.killed:
                    raise Killed()
                return result

            return call
        return value

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[Any]:
        if self._switch.killed:
            raise Killed()
        async with self._target.transaction() as tx:
            yield _Dead(tx, self._switch)
            if self._switch.killed:
                raise Killed()


@attrs.frozen
class CrashReport:
    """What :func:`crash_proof` tried: ``boundaries`` (how many), ``points`` (each
    as ``"boundary:step"``), the ``reference`` snapshot, and how many kills
    surfaced ``X_STEP_OUTCOME_UNKNOWN`` on a ``once`` step as they must."""

    boundaries: int
    points: Sequence[str]
    reference: Any
    unknown_outcomes: int


def _point(boundary: str, step: str | None) -> str:
    return f"{boundary}:{step}" if step else boundary


def _contains_killed(exc: BaseException) -> bool:
    if isinstance(exc, Killed):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(_contains_killed(e) for e in exc.exceptions)
    return False


async def _call(fn: Callable[[], Any] | None) -> Any:
    if fn is None:
        return None
    value = fn()
    if inspect.isawaitable(value):
        value = await value
    return value


class Ground(Protocol):
    """Where the runs happen: a fresh world for each, and what a run left in it.
    :class:`MemoryGround` (a new memory driver per run) is the default; the
    gate's PostgreSQL one is in ``_pg_ground.py``."""

    def world(
        self, handles: list[Job[Any, Any]]
    ) -> contextlib.AbstractAsyncContextManager[tuple[Jobs, Any, HarnessClock]]:
        """An empty queue with ``handles`` registered: its facade, driver and clock."""
        ...

    async def next_wake(self, driver: Any) -> float | None:
        """When the next live row is due (a running one: when its lease ends); ``None``: none."""
        ...

    async def started_step(self, driver: Any) -> bool:
        """Whether a ``once`` step was left ``started``."""
        ...


class MemoryGround:
    """Each run on a memory driver of its own, on a frozen clock of its own."""

    @contextlib.asynccontextmanager
    async def world(
        self, handles: list[Job[Any, Any]]
    ) -> AsyncIterator[tuple[Jobs, Any, HarnessClock]]:
        clock = HarnessClock()
        driver = MemoryDriver(clock=clock)
        async with open_jobs(driver, jobs=handles) as facade:
            yield facade, driver, clock

    async def next_wake(self, driver: MemoryDriver) -> float | None:
        waits = [
            row.lease_expires_at if row.state == "running" else row.run_at
            for row in driver._rows.values()
            if row.state not in TERMINAL_STATES and row.tx is None
        ]
        return min(waits) if waits else None

    async def started_step(self, driver: MemoryDriver) -> bool:
        return any(
            rec.status == "started" for recs in driver._steps.values() for rec in recs.values()
        )


MEMORY = MemoryGround()


async def _run_to_rest(
    facade: Jobs, driver: Any, clock: HarnessClock, hook: Any, queues: list[str], ground: Ground
) -> None:
    """Run workers until every row is terminal, fast-forwarding every wait."""
    for _ in range(MAX_PASSES):
        worker = Worker(
            facade,
            queues=queues,
            boundary=hook,
            visibility_timeout=CRASH_VT,
            concurrency=8,
            fleet="single",
        )
        await worker.run_until_quiet()
        now = driver.now()
        wake = await ground.next_wake(driver)
        if wake is None:
            return
        clock.advance(max(0.0, wake - now) + 0.001)
    raise JobsError(
        ErrorCode.X_INVARIANT, f"crash_proof: the job did not come to rest in {MAX_PASSES} passes"
    )


async def _run_once(
    job: Job[Any, Any],
    input: Any,
    handles: list[Job[Any, Any]],
    observe: Callable[[], Any] | None,
    reset: Callable[[], Any] | None,
    kill_at: int | None,
    ground: Ground = MEMORY,
) -> tuple[list[tuple[str, str | None]], Any, Any, bool]:
    await _call(reset)
    queues = sorted({h.queue for h in handles})
    hits: list[tuple[str, str | None]] = []
    switch = _Switch()
    started_step = False
    async with ground.world(handles) as (facade, driver, clock):
        enqueued = await job.enqueue(input)

        async def hook(boundary: str, step: str | None) -> None:
            if switch.killed:
                raise Killed()
            hits.append((boundary, step))
            if kill_at is not None and len(hits) - 1 == kill_at:
                switch.killed = True
                raise Killed()

        doomed = Jobs(_Dead(driver, switch), list(facade.handles.values()), ids=facade.ids)
        try:
            await _run_to_rest(doomed, driver, clock, hook, queues, ground)
        except BaseException as exc:
            if not _contains_killed(exc):
                raise
        if switch.killed:
            started_step = await ground.started_step(driver)
            # A fresh worker resumes once the lease has lapsed; it counts no boundaries.
            clock.advance(CRASH_VT + 1)
            await _run_to_rest(facade, driver, clock, None, queues, ground)
        view = await facade.show(enqueued.id)
        if observe is None:
            # No hook: what the run left in the queue is the world.
            snapshot = (view.result, {s.name: s.output for s in view.steps})
        else:
            snapshot = await _call(observe)
    return hits, snapshot, view, started_step


async def crash_proof(
    job: Job[Any, Any],
    input: Any,
    *,
    observe: Callable[[], Any] | None,
    reset: Callable[[], Any] | None = None,
    jobs: Sequence[Job[Any, Any]] | None = None,
) -> CrashReport:
    """Run ``job`` once cleanly, then once per boundary killed there.

    A kill tears the worker down with no cleanup: the boundary raises, and every
    driver call from that worker after it fails, so nothing uncommitted lands. A
    fresh worker resumes once the lease has lapsed, and the world is run to rest
    (sleeps and retries fast-forwarded). ``observe()`` must then equal the clean
    run's snapshot; a difference is ``JobsError("X_JOB_CRASH_DIVERGED")`` whose
    ``meta["boundary"]`` names the boundary and its step. A ``once`` step killed
    after ``started`` must end the run with ``X_STEP_OUTCOME_UNKNOWN`` instead
    (never a double effect). A crash spends an attempt like any lapse, so the
    job's retry policy must allow one more.

    ``observe=None`` compares what the run left in the queue instead: the
    terminal state, the result and every step's stored output.
    """
    return await _crash_proof(job, input, observe=observe, reset=reset, jobs=jobs)


async def _crash_proof(
    job: Job[Any, Any],
    input: Any,
    *,
    observe: Callable[[], Any] | None,
    reset: Callable[[], Any] | None,
    jobs: Sequence[Job[Any, Any]] | None,
    on_run: Callable[[int | None, int, str | None], None] | None = None,
    ground: Ground = MEMORY,
) -> CrashReport:
    """:func:`crash_proof`; ``on_run(index, total, point)`` is told before each
    run (``None``: the clean one) and once more after the last (``index == total``);
    ``ground`` is where the runs happen (a new memory driver each, by default)."""
    handles = [job, *(jobs or [])]
    if on_run is not None:
        on_run(None, 0, None)
    hits, reference, ref_view, _ = await _run_once(
        job, input, handles, observe, reset, None, ground
    )
    if ref_view.state not in TERMINAL_STATES:
        raise JobsError(
            ErrorCode.X_INVARIANT,
            f"crash_proof: the clean run of {job.name} did not finish (state {ref_view.state})",
        )
    unknown = 0
    for index, (boundary, step) in enumerate(hits):
        if on_run is not None:
            on_run(index, len(hits), _point(boundary, step))
        _hits, snapshot, view, started = await _run_once(
            job, input, handles, observe, reset, index, ground
        )
        point = _point(boundary, step)
        if started:
            if view.state == "dead" and view.error_code == ErrorCode.X_STEP_OUTCOME_UNKNOWN:
                unknown += 1
                continue
            raise JobsError(
                ErrorCode.X_JOB_CRASH_DIVERGED,
                f"killed at {point} (boundary {index + 1} of {len(hits)}) with a once step started: the run "
                f"must stop with X_STEP_OUTCOME_UNKNOWN, but it ended {view.state} ({view.error_code})",
                meta={
                    "boundary": point,
                    "step": step,
                    "index": index,
                    "reference": reference,
                    "got": snapshot,
                    "state": view.state,
                },
            )
        if snapshot != reference or view.state != ref_view.state:
            raise JobsError(
                ErrorCode.X_JOB_CRASH_DIVERGED,
                f"killed at {point} (boundary {index + 1} of {len(hits)}): the world differs from the clean run "
                f"(state {view.state} against {ref_view.state}); a step is not replay-safe, or the job's retry "
                "policy has no attempt to spare for the crash",
                meta={
                    "boundary": point,
                    "step": step,
                    "index": index,
                    "reference": reference,
                    "got": snapshot,
                    "state": view.state,
                },
            )
    if on_run is not None:
        on_run(len(hits), len(hits), None)
    return CrashReport(
        boundaries=len(hits),
        points=[_point(b, s) for b, s in hits],
        reference=reference,
        unknown_outcomes=unknown,
    )
