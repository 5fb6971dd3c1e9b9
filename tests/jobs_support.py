"""Shared helpers for the worker, step and harness test packages.

Everything here runs on Trio's ``MockClock`` (pytest-trio's ``autojump_clock``):
waiting is ``trio.sleep`` on virtual time, never the wall clock.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import attrs
import trio

from trio_jobs import Jobs, JobView, Worker, memory_driver, open_jobs
from trio_jobs.drivers.memory import MemoryDriver
from trio_jobs.errors import _reset_error_retry_for_tests

__all__ = [
    "FixedJitter",
    "Item",
    "events_named",
    "jobs_on_memory",
    "running_worker",
    "wait_for",
    "wait_state",
]


@attrs.frozen
class Item:
    """A small input most test jobs take: ``key`` is the idempotency key."""

    key: str
    group: str = "g"


class FixedJitter:
    """A jitter source that always draws ``value`` (in ``[0, 1)``)."""

    def __init__(self, value: float) -> None:
        self.value = value
        self.draws = 0

    def random(self) -> float:
        self.draws += 1
        return self.value


@contextlib.asynccontextmanager
async def jobs_on_memory(
    jobs: Sequence[Any], driver: MemoryDriver | None = None
) -> AsyncIterator[tuple[Jobs, MemoryDriver]]:
    """``open_jobs`` over a fresh memory driver that follows Trio's clock."""
    driver = driver if driver is not None else memory_driver()
    async with open_jobs(driver, jobs=list(jobs)) as facade:
        yield facade, driver


@contextlib.asynccontextmanager
async def running_worker(jobs: Jobs, **options: Any) -> AsyncIterator[Worker]:
    """A real worker, started with ``nursery.start(worker.run)`` and drained on exit."""
    options.setdefault("jitter", FixedJitter(0.5))
    worker = Worker(jobs, **options)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        try:
            yield worker
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(3600):
                await worker.drain()


async def wait_for(
    predicate: Callable[[], Any | Awaitable[Any]],
    *,
    timeout: float = 600.0,
    step: float = 0.01,
    what: str = "condition",
) -> Any:
    """Poll ``predicate`` on virtual time until it answers something truthy."""
    with trio.move_on_after(timeout):
        while True:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
            await trio.sleep(step)
    raise AssertionError(f"timed out waiting for {what}")


async def wait_state(jobs: Jobs, job_id: str, *states: str, timeout: float = 600.0) -> JobView:
    """Wait until the job's row is in one of ``states``; answer its view."""
    last: list[JobView] = []

    async def check() -> bool:
        view = await jobs.show(job_id)
        last[:] = [view]
        return view.state in states

    try:
        await wait_for(check, timeout=timeout, what=f"state in {states}")
    except AssertionError:
        raise AssertionError(f"job never reached {states}; last seen {last}") from None
    return last[0]


def events_named(caplog: Any, event: str) -> list[logging.LogRecord]:
    """The ``trio_jobs`` log records whose event is ``event``."""
    return [
        r for r in caplog.records if r.name == "trio_jobs" and getattr(r, "event", None) == event
    ]


def reset_retry_classes() -> None:
    _reset_error_retry_for_tests()


def count_acquires(driver: Any) -> list[str]:
    """Record the job id of every ``leases.acquire`` call on ``driver`` (a slot
    asked for: a run started, or a busy claim handed back)."""
    leases = driver.leases
    assert leases is not None
    acquire = leases.acquire
    asked: list[str] = []

    async def counted(key: str, limit: int, job_id: str, *rest: Any) -> Any:
        asked.append(job_id)
        return await acquire(key, limit, job_id, *rest)

    leases.acquire = counted
    return asked
