"""A driver's own background tasks (the step writer, the push session, the
relay's helpers), in a nursery held by a Trio system task: ``open()`` may be
called from any Trio task, and the caller never holds a nursery or a loop for
the driver. Shared by the PostgreSQL and Redis drivers."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import trio

__all__ = ["ServiceTasks"]


class ServiceTasks:
    """Start once per ``open()``, :meth:`spawn` while running, :meth:`stop` on close.

    A task that raises is logged (``jobs.<label>.task_failed``) and the others go
    on; the service itself failing (its ``context`` raising) is logged
    ``jobs.<label>.service_failed`` with the exception's type only (its message
    may quote a connection string)."""

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
    ) -> bool:
        """Run ``tasks`` (inside ``context``, entered by the service); answers
        whether the service is running."""
        started = trio.Event()
        closing = self._closing = trio.Event()
        done = self._done = trio.Event()
        label, logger = self._label, self._logger

        async def service() -> None:
            try:
                async with context or contextlib.nullcontext(), trio.open_nursery() as nursery:
                    self._nursery = nursery
                    for task in tasks:
                        nursery.start_soon(task)
                    started.set()
                    await closing.wait()
                    nursery.cancel_scope.cancel()
            except BaseException as exc:
                if not isinstance(exc, trio.Cancelled):
                    logger.warning(
                        f"jobs.{label}.service_failed",
                        extra={"event": f"jobs.{label}.service_failed", "kind": type(exc).__name__},
                    )
            finally:
                self._nursery = None
                started.set()
                done.set()

        trio.lowlevel.spawn_system_task(service)
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
                logger.exception(f"jobs.{label}.task_failed")

        nursery.start_soon(guarded)

    async def stop(self) -> None:
        """Cancel the service's tasks and wait until they are gone (shielded)."""
        if self._closing is not None:
            self._closing.set()
        if self._done is not None:
            with trio.CancelScope(shield=True):
                await self._done.wait()
