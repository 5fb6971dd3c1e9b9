"""Memory-driver benchmarks: a real :class:`~trio_jobs.Worker` on Trio's real clock.

Three figures (issue 2, item 11):

``noop``
    End-to-end throughput of no-op jobs: enqueue ``--jobs`` inputs with
    ``enqueue_many`` (not timed), then time from ``nursery.start(worker.run)``
    until the worker has acked every one. Swept over worker concurrency.
``steps5``
    The same with a body of five ``step.run`` calls (each a fenced step write).
``replay1000``
    A job whose first attempt records 1,000 steps and then fails; its second
    attempt finds all 1,000 recorded. Timed: from the moment the claim handing
    out the second attempt returns to the moment its ack lands — the replay
    attempt only. The recording attempt is timed the same way, for context.

Nothing here uses a ``MockClock``: the driver follows Trio's real clock.
"""

from __future__ import annotations

import contextlib
import cProfile
import gc
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

import attrs
import trio

from trio_jobs import JobContext, Jobs, Retry, Worker, job, memory_driver, open_jobs
from trio_jobs.drivers import AckOptions, ClaimOptions, ClaimResult, NackOptions

__all__ = ["BENCHMARKS", "Result", "bench_noop", "bench_replay1000", "bench_steps5"]

#: How many jobs one throughput run settles.
DEFAULT_JOBS = 20_000
#: Worker concurrencies the throughput benchmarks sweep.
DEFAULT_CONCURRENCY: tuple[int, ...] = (64, 128, 192, 256)
#: Steps the replay benchmark records.
REPLAY_STEPS = 1_000
#: ``enqueue_many`` takes at most this many inputs per call.
ENQUEUE_BATCH = 10_000


def _const(value: int) -> Callable[[], int]:
    """A step fn as apps write them: a lambda taking no argument."""
    return lambda: value


@job(input=int, idempotency_key=lambda i: f"noop:{i}", name="bench.noop")
async def noop(ctx: JobContext[int]) -> None:
    """Does nothing: the cost of the queue and the worker alone."""
    return None


STEPS5 = tuple(f"step-{k}" for k in range(5))


@job(input=int, idempotency_key=lambda i: f"steps5:{i}", name="bench.steps5")
async def steps5(ctx: JobContext[int]) -> None:
    """Five memoized steps, each a fenced write on the memory driver."""
    for k, name in enumerate(STEPS5):
        await ctx.step.run(name, _const(k))


REPLAY_NAMES = tuple(f"step-{k:04d}" for k in range(REPLAY_STEPS))


@job(
    input=int,
    idempotency_key=lambda i: f"replay:{i}",
    name="bench.replay1000",
    # A long base so the retry waits until the benchmark promotes it.
    retry=Retry(attempts=2, base="1h", jitter=False),
)
async def replay1000(ctx: JobContext[int]) -> int:
    """1,000 steps; the first attempt fails after recording them all."""
    for k, name in enumerate(REPLAY_NAMES):
        await ctx.step.run(name, _const(k))
    if ctx.attempt == 1:
        raise RuntimeError("first attempt: fail after recording every step")
    return len(REPLAY_NAMES)


#: Set by :func:`profiling`: enabled around the timed part of each run only, so a
#: profile shows the worker at work, not the enqueues that set the run up.
_profiler: cProfile.Profile | None = None


@contextlib.contextmanager
def profiling(profiler: cProfile.Profile) -> Iterator[None]:
    """Profile the timed part of every run started inside the block."""
    global _profiler
    _profiler = profiler
    try:
        yield
    finally:
        _profiler = None


@contextlib.contextmanager
def _timed() -> Iterator[None]:
    if _profiler is not None:
        _profiler.enable()
    try:
        yield
    finally:
        if _profiler is not None:
            _profiler.disable()


@attrs.frozen
class Result:
    """One benchmark configuration: its samples and how to read them."""

    name: str
    config: str
    unit: str
    samples: Sequence[float]
    higher_is_better: bool
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def best(self) -> float:
        return max(self.samples) if self.higher_is_better else min(self.samples)

    @property
    def worst(self) -> float:
        return min(self.samples) if self.higher_is_better else max(self.samples)


# ---------------------------------------------------------------------- instruments


class _Settles:
    """Counts landed acks on one driver instance and notes when the last one landed.

    It wraps the instance's ``ack`` (the worker looks it up on the instance), so the
    end of a run is the moment the N-th ack returned, not the next tick of a poller.
    """

    def __init__(self, driver: Any, target: int) -> None:
        self.target = target
        self.acked = 0
        self.done = trio.Event()
        self.finished_at = 0.0
        inner = driver.ack

        async def ack(job_id: str, options: AckOptions) -> bool:
            landed: bool = await inner(job_id, options)
            if landed:
                self.acked += 1
                if self.acked == self.target:
                    self.finished_at = time.perf_counter()
                    self.done.set()
            return landed

        driver.ack = ack


async def _enqueue_all(handle: Any, n: int) -> float:
    """Enqueue ``0..n-1`` in ``enqueue_many`` batches; answer the seconds it took."""
    started = time.perf_counter()
    for start in range(0, n, ENQUEUE_BATCH):
        await handle.enqueue_many(range(start, min(n, start + ENQUEUE_BATCH)))
    return time.perf_counter() - started


async def _throughput_once(handle: Any, n: int, concurrency: int) -> tuple[float, float]:
    """One run: answer (jobs settled per second, inputs enqueued per second)."""
    driver = memory_driver()
    async with open_jobs(driver, jobs=[handle]) as jobs:
        enqueue_seconds = await _enqueue_all(handle, n)
        settles = _Settles(driver, n)
        worker = Worker(jobs, concurrency=concurrency)
        gc.collect()
        async with trio.open_nursery() as nursery:
            with _timed():
                started = time.perf_counter()
                await nursery.start(worker.run)
                await settles.done.wait()
                elapsed = settles.finished_at - started
            await worker.drain()
        stats = {s.queue: s for s in await jobs.stats()}
        if stats["default"].done != n:
            raise RuntimeError(f"expected {n} done rows, found {stats['default']}")
    return n / elapsed, n / enqueue_seconds


def _throughput(
    name: str, handle: Any, *, runs: int, jobs: int, concurrency: Sequence[int], per_job: int
) -> list[Result]:
    results: list[Result] = []
    enqueue_rates: list[float] = []
    for conc in concurrency:
        rates: list[float] = []
        for _ in range(runs):
            rate, enqueue_rate = trio.run(_throughput_once, handle, jobs, conc)
            rates.append(rate)
            enqueue_rates.append(enqueue_rate)
        note = (
            f"{per_job} steps/job: {statistics.median(rates) * per_job:,.0f} steps/s"
            if per_job
            else ""
        )
        results.append(
            Result(name, f"{jobs:,} jobs, concurrency {conc}", "jobs/s", rates, True, note)
        )
    results.append(
        Result(
            f"{name} (enqueue)",
            f"enqueue_many, {jobs:,} inputs in batches of {ENQUEUE_BATCH:,}",
            "inputs/s",
            enqueue_rates,
            True,
            "not part of the timed run above",
        )
    )
    return results


def bench_noop(*, runs: int, jobs: int, concurrency: Sequence[int]) -> list[Result]:
    """End-to-end no-op jobs per second, per worker concurrency."""
    return _throughput("noop", noop, runs=runs, jobs=jobs, concurrency=concurrency, per_job=0)


def bench_steps5(*, runs: int, jobs: int, concurrency: Sequence[int]) -> list[Result]:
    """End-to-end 5-step jobs per second, per worker concurrency."""
    return _throughput("steps5", steps5, runs=runs, jobs=jobs, concurrency=concurrency, per_job=5)


# ---------------------------------------------------------------------- replay


class _AttemptTimer:
    """Times one attempt of one job: from its claim returning to its settle landing."""

    def __init__(self, driver: Any, job_id: str) -> None:
        self.job_id = job_id
        self.claimed_at: float | None = None
        self.settled_at: float | None = None
        claim, ack, nack = driver.claim, driver.ack, driver.nack

        async def timed_claim(options: ClaimOptions) -> ClaimResult:
            result: ClaimResult = await claim(options)
            if any(j.id == job_id for j in result.jobs):
                self.claimed_at = time.perf_counter()
            return result

        def settle(inner: Callable[[str, Any], Awaitable[bool]]) -> Any:
            async def timed(jid: str, options: AckOptions | NackOptions) -> bool:
                landed = await inner(jid, options)
                if landed and jid == job_id:
                    self.settled_at = time.perf_counter()
                return landed

            return timed

        driver.claim = timed_claim
        driver.ack = settle(ack)
        driver.nack = settle(nack)

    @property
    def seconds(self) -> float:
        assert self.claimed_at is not None, "the claim never handed out the job"
        assert self.settled_at is not None, "the attempt never settled"
        return self.settled_at - self.claimed_at


async def _attempt(jobs: Jobs, driver: Any, job_id: str, *, profile: bool = False) -> float:
    timer = _AttemptTimer(driver, job_id)
    gc.collect()
    try:
        with _timed() if profile else contextlib.nullcontext():
            await Worker(jobs, concurrency=8).run_until_quiet()
    finally:
        # Take the instruments off (the class's methods show through again):
        # the next attempt gets its own.
        del driver.claim, driver.ack, driver.nack
    return timer.seconds


async def _replay_once() -> tuple[float, float]:
    """One run: answer (seconds recording 1,000 steps, seconds replaying them)."""
    driver = memory_driver()
    async with open_jobs(driver, jobs=[replay1000]) as jobs:
        enqueued = await replay1000.enqueue(1)
        record = await _attempt(jobs, driver, enqueued.id)
        view = await jobs.show(enqueued.id)
        if view.state != "ready" or view.attempts != 1 or len(view.steps) != REPLAY_STEPS:
            raise RuntimeError(f"the recording attempt did not leave {REPLAY_STEPS} steps: {view}")
        await jobs.promote(enqueued.id)  # the retry is due now, not in an hour
        replay = await _attempt(jobs, driver, enqueued.id, profile=True)
        view = await jobs.show(enqueued.id)
        if view.state != "done" or any(s.executions != 1 for s in view.steps):
            raise RuntimeError(f"the replay attempt re-ran a step or did not finish: {view.state}")
    return record, replay


def bench_replay1000(*, runs: int, **_ignored: Any) -> list[Result]:
    """Milliseconds from claim to ack for an attempt whose 1,000 steps are all recorded."""
    records: list[float] = []
    replays: list[float] = []
    for _ in range(runs):
        record, replay = trio.run(_replay_once)
        records.append(record * 1000.0)
        replays.append(replay * 1000.0)
    return [
        Result(
            "replay1000",
            f"replay attempt, {REPLAY_STEPS:,} recorded steps (claim to ack)",
            "ms",
            replays,
            False,
        ),
        Result(
            "replay1000 (record)",
            f"recording attempt, {REPLAY_STEPS:,} new steps (claim to nack)",
            "ms",
            records,
            False,
            "context: the first attempt, which writes every step",
        ),
    ]


BENCHMARKS: dict[str, Callable[..., list[Result]]] = {
    "noop": bench_noop,
    "steps5": bench_steps5,
    "replay1000": bench_replay1000,
}
