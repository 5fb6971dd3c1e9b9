"""A driver's own background tasks (the step writer, the push session, the
relay's helpers), in one service task with a nursery of its own. Shared by the
PostgreSQL and Redis drivers.

Under ``open_jobs`` the service task runs in the nursery ``open_jobs`` opened
(the driver's ``open_in(nursery)``): the driver's tasks are descendants of the
task that entered the block and are gone when it ends. A driver opened directly
with ``await driver.open()`` (a script, a test, the outbox relay) has no
nursery to run them in: its service runs in a Trio system task, the fallback."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import trio

from ..logging import emit

__all__ = ["ServiceTasks"]


class ServiceTasks:
    """Start once per open, :meth:`spawn` while running, :meth:`stop` on close.

    A task that raises is logged (``jobs.<label>.task_failed``) and the others go
    on; the service itself failing (its ``context`` raising) is logged
    ``jobs.<label>.service_failed`` with the exception's type only (its message
    may quote a connection string). Neither reaches the nursery the service runs
    in: a driver's failure is the driver's to report, never the app's block."""

    def __init__(self, label: str, logger: logging.Logger) -> None:
        self._label = label
        self._logger = logger
        self._nursery: trio.Nursery | None = None
        self._closing: trio.Event | None = None
        self._done: trio.Event | None = None

    @property
    def running(self) -> bool:
        return self._nursery is not None

    async def start(
        self,
        *tasks: Callable[[], Awaitable[None]],
        context: AbstractAsyncContextManager[Any] | None = None,
        nursery: trio.Nursery | None = None,
    ) -> bool:
        """Run ``tasks`` (inside ``context``, entered by the service) in a task of
        ``nursery``, or of a system task without one; answers whether the
        service is running."""
        started = trio.Event()
        closing = self._closing = trio.Event()
        done = self._done = trio.Event()
        label, logger = self._label, self._logger

        async def service() -> None:
            try:
                # In a nursery, shielded: cancelling the scope around open_jobs
                # does not stop the driver before the block's own close (its
                # pending writes still flush); only stop() ends it. A system
                # task stays cancellable, so trio.run can end without a close.
                with trio.CancelScope(shield=nursery is not None):
                    async with context or contextlib.nullcontext(), trio.open_nursery() as inner:
                        self._nursery = inner
                        for task in tasks:
                            inner.start_soon(task)
                        started.set()
                        await closing.wait()
                        inner.cancel_scope.cancel()
            except BaseException as exc:
                if not isinstance(exc, trio.Cancelled):
                    emit(
                        logger,
                        logging.WARNING,
                        f"jobs.{label}.service_failed",
                        kind=type(exc).__name__,
                    )
            finally:
                self._nursery = None
                started.set()
                done.set()

        name = f"trio_jobs.{label}.service"
        if nursery is None:
            trio.lowlevel.spawn_system_task(service, name=name)
        else:
            nursery.start_soon(service, name=name)
        await started.wait()
        return self._nursery is not None

    def spawn(
        self, fn: Callable[[], Awaitable[None]], unavailable: Callable[[], Exception]
    ) -> None:
        """Run ``fn`` in the service; raises ``unavailable()`` when it is not running."""
        nursery = self._nursery
        if nursery is None:
            raise unavailable()
        label, logger = self._label, self._logger

        async def guarded() -> None:
            try:
                await fn()
            except Exception:
                emit(logger, logging.ERROR, f"jobs.{label}.task_failed", exc_info=True)

        nursery.start_soon(guarded)

    async def stop(self) -> None:
        """Cancel the service's tasks and wait until they are gone (shielded)."""
        if self._closing is not None:
            self._closing.set()
        if self._done is not None:
            with trio.CancelScope(shield=True):
                await self._done.wait()
