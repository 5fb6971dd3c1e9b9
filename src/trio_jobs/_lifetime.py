"""The drivers an ``open_jobs`` block holds open, each in a task of its nursery.

Every driver is entered with its :meth:`~trio_jobs.drivers.JobDriver.open_in`
context manager by a *holder* task started in the nursery ``open_jobs`` opened,
so the driver's own tasks (write combiners, push sessions) are descendants of
the task that entered the block, and leaving the block leaves none running.
A holder, not the block's own task, enters the context manager because a
driver ``set_job_driver()`` swapped in is opened by whichever task first uses
it, and must still be closed with the block.
"""

from __future__ import annotations

import attrs
import trio

from .drivers._protocol import JobDriver

__all__ = ["DriverLifetimes"]


@attrs.define(eq=False)
class _Held:
    driver: JobDriver
    scope: trio.CancelScope
    closing: trio.Event = attrs.Factory(trio.Event)
    done: trio.Event = attrs.Factory(trio.Event)


class DriverLifetimes:
    """Open drivers into ``nursery`` (:meth:`open`); close them all (:meth:`close`)."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self._held: list[_Held] = []
        self._failures: list[BaseException] = []

    def holds(self, driver: JobDriver) -> bool:
        return any(held.driver is driver for held in self._held)

    async def open(self, driver: JobDriver) -> None:
        """Open ``driver`` until :meth:`close`; its opening failure raises here."""
        held: _Held = await self._nursery.start(self._hold, driver)
        self._held.append(held)

    async def _hold(
        self, driver: JobDriver, *, task_status: trio.TaskStatus[_Held] = trio.TASK_STATUS_IGNORED
    ) -> None:
        opened = False
        held: _Held | None = None
        try:
            # Shielded: the block's close ends it (bounded, by cancelling this
            # scope), never a cancellation of the scope around open_jobs, which
            # would cut the driver's close short.
            with trio.CancelScope(shield=True) as scope:
                held = _Held(driver, scope)
                async with driver.open_in(self._nursery):
                    opened = True
                    task_status.started(held)
                    await held.closing.wait()
        except BaseException as exc:
            if not opened:
                raise
            # A failed close is raised by close(), as open_jobs always did; raised
            # here it would reach the block as an ExceptionGroup.
            self._failures.append(exc)
        finally:
            if held is not None:
                held.done.set()

    async def close(self, driver: JobDriver) -> None:
        """Close ``driver`` (held here) and wait until its tasks are gone. Call
        it under a shielded scope; when that scope's deadline passes first, the
        holder is cancelled and the nursery reaps it. A close that raised
        raises here."""
        for held in self._held:
            if held.driver is driver:
                held.closing.set()
                try:
                    await held.done.wait()
                finally:
                    if not held.done.is_set():
                        held.scope.cancel()
        if self._failures:
            failure = self._failures.pop(0)
            raise failure

    def abandon(self) -> None:
        """Cancel every holder still running (the block's close ran out of time):
        each driver's close runs cancelled, and the nursery can exit."""
        for held in self._held:
            if not held.done.is_set():
                held.scope.cancel()
