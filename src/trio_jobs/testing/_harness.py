"""``open_harness``: the memory driver, a frozen clock, and run-until-quiet."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import attrs
import trio
import trio.testing

from .._declare import Job
from .._facade import Jobs, open_jobs
from .._scheduler import LEASE_TTL, fire_due, spec_of
from .._task import tasks_of
from .._time import Duration, SystemClock, parse_duration
from .._worker import Worker
from ..drivers.memory import MemoryDriver
from ..errors import ErrorCode, JobsError

__all__ = ["Harness", "HarnessClock", "StepTrace", "Trace", "open_harness"]

#: A harness pass that never goes quiet is a bug in a job (or in the library).
MAX_PASSES = 10_000
#: Who leads the harness's scheduled tasks (the harness is their whole fleet).
HARNESS_LEADER = "harness"


class HarnessClock:
    """A frozen clock. ``advance(duration)`` moves it; under Trio's ``MockClock``
    (pytest-trio's ``autojump_clock``) it jumps that clock too, so sleeps,
    timeouts and leases move together."""

    def __init__(self, origin: float | None = None) -> None:
        self._origin = SystemClock().now() if origin is None else origin
        self._offset = 0.0
        self._trio_zero: float | None = None

    def _mock(self) -> trio.testing.MockClock | None:
        try:
            clock = trio.lowlevel.current_clock()
        except RuntimeError:
            return None
        return clock if isinstance(clock, trio.testing.MockClock) else None

    def now(self) -> float:
        mock = self._mock()
        if mock is None:
            return self._origin + self._offset
        current = trio.current_time()
        if self._trio_zero is None:
            self._trio_zero = current
        return self._origin + self._offset + (current - self._trio_zero)

    def advance(self, duration: Duration) -> None:
        """Move the clock forward by ``duration`` (``"3d"``, seconds, a timedelta)."""
        seconds = parse_duration(duration, field="advance", allow_zero=True)
        mock = self._mock()
        if mock is not None:
            self.now()  # pin the zero before jumping
            mock.jump(seconds)
        else:
            self._offset += seconds

    def shift(self, seconds: float) -> None:
        self._offset += seconds


@attrs.frozen
class StepTrace:
    """One step in a :class:`Trace`: how many times its fn ran, its stored output, its status."""

    executions: int
    output: Any
    status: str


@attrs.frozen
class Trace:
    """One job as the harness saw it last."""

    job_id: str
    state: str
    attempts: int
    result: Any
    error_code: str | None
    last_error: str | None
    steps: Mapping[str, StepTrace]


class Harness:
    """What ``open_harness`` yields. See :func:`open_harness`."""

    def __init__(
        self,
        jobs: Jobs,
        driver: MemoryDriver,
        clock: HarnessClock,
        worker_options: Mapping[str, Any],
    ) -> None:
        self.jobs = jobs
        self.driver = driver
        self.clock = clock
        self._last: str | None = None
        self._worker_options = dict(worker_options)
        self.workers: list[Worker] = []

    async def run(self, job: Job[Any, Any], input: Any, **options: Any) -> Trace:
        """Enqueue ``input`` and run every due job until nothing is due; answer this job's trace."""
        if self.jobs.handle(job.name) is not job:
            self.jobs.register(job)
        enqueued = await job.enqueue(input, **options)
        self._last = enqueued.id
        await self._until_quiet()
        return await self.trace(enqueued.id)

    async def drain(self) -> Trace | None:
        """Fire every task occurrence due by the harness clock (by its
        ``catch_up`` rule), then run every due job until nothing is due; answer
        the trace of the job the last :meth:`run` started (``None`` if ``run``
        was never called)."""
        await self._until_quiet()
        return await self.trace(self._last) if self._last is not None else None

    async def trace(self, job_id: str) -> Trace:
        """Any job's trace."""
        assert self.driver.introspect is not None
        view = await self.driver.introspect.show(job_id)
        return Trace(
            job_id=view.id,
            state=view.state,
            attempts=view.attempts,
            result=view.result,
            error_code=view.error_code,
            last_error=view.last_error,
            steps={s.name: StepTrace(s.executions, s.output, s.status) for s in view.steps},
        )

    def _retry_waits(self) -> list[float]:
        now = self.driver.now()
        return [
            r.run_at
            for r in self.driver._rows.values()
            if r.state == "ready" and r.run_at > now and r.tx is None
        ]

    async def fire_due(self) -> int:
        """Fire every occurrence of the harness's tasks due by its clock, by each
        task's ``catch_up`` (as the scheduler would); answers how many fired.
        :meth:`run` and :meth:`drain` do this first."""
        return await fire_due(self.jobs, tasks_of(list(self.jobs.handles.values())), HARNESS_LEADER)

    async def _until_quiet(self) -> None:
        await self.fire_due()
        queues = sorted({h.queue for h in self.jobs.handles.values()}) or ["default"]
        for _ in range(MAX_PASSES):
            worker = Worker(self.jobs, queues=queues, **self._worker_options)
            self.workers.append(worker)
            await worker.run_until_quiet()
            waits = self._retry_waits()
            if not waits:
                return
            # A retry backing off is fast-forwarded; a sleep or an event wait is not.
            self.clock.advance(max(0.0, min(waits) - self.driver.now()))
        raise JobsError(
            ErrorCode.X_INVARIANT, f"the harness did not go quiet in {MAX_PASSES} passes"
        )


@contextlib.asynccontextmanager
async def open_harness(
    *,
    jobs: Sequence[Job[Any, Any]] = (),
    origin: float | None = None,
    start: datetime | None = None,
    **worker_options: Any,
) -> AsyncIterator[Harness]:
    """The memory driver on a frozen clock, with the ambient facade installed.

    ``start`` (an aware datetime; default now) is the clock's wall-clock origin,
    and the scheduler of the listed tasks is armed there: an occurrence exactly
    at ``start`` is not fired, every later one is, by :meth:`Harness.drain`
    once the clock reaches it (``h.clock.advance(...)``).

    >>> async with open_harness(jobs=[onboard_org]) as h:
    ...     trace = await h.run(onboard_org, Onboard(org_id=ORG))
    ...     h.clock.advance("3d")
    ...     trace = await h.drain()
    """
    if start is not None:
        if origin is not None:
            raise JobsError(ErrorCode.X_CONFIG_INVALID, "pass start= or origin=, not both")
        if not isinstance(start, datetime) or start.utcoffset() is None:
            raise JobsError(
                ErrorCode.X_CONFIG_INVALID,
                "open_harness(start=...) takes an aware datetime (give it a tzinfo)",
            )
        origin = start.timestamp()
    clock = HarnessClock(origin)
    driver = MemoryDriver(clock=clock)
    worker_options.setdefault("concurrency", 8)
    # The harness's workers are its whole fleet: a shared rate limit lives here.
    worker_options.setdefault("fleet", "single")
    async with open_jobs(driver, jobs=jobs) as facade:
        harness = Harness(facade, driver, clock, worker_options)
        scheduled = tasks_of(list(facade.handles.values()))
        if scheduled:
            # Armed at the origin: the tasks' watermarks are the clock's now.
            assert driver.tasks is not None
            await driver.tasks.lead(HARNESS_LEADER, [spec_of(t) for t in scheduled], LEASE_TTL)
        yield harness
