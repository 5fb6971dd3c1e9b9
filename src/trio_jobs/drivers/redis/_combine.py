"""The settle combiner: the acks of every slot of a process, one script call a batch.

Each slot's ``ack`` queues its settle and waits; one flusher task (in the
driver's service nursery) sends everything queued in one ``ack`` script call,
then wakes each waiter with whether its settle landed. A caller returns only
after the script ran, so durability is what it was; the round trip and the
script's fixed cost are shared. Batches form by themselves under load (settles
queue while a call is in flight), with no added wait when idle. Two settles of
one row never share a call (the later waits for the next one), so the order of
writes to one row is kept.

A waiter cancelled before its settle was taken leaves the queue; one cancelled
while its call is in flight is not rescheduled (the script may have landed
it: the driver's ``again`` retry recognises that). A failed call fails every
settle of its batch with the call's error.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import outcome
import trio

__all__ = ["Combiner"]

#: The most settles one script call carries.
BATCH = 500


class _Pending:
    __slots__ = ("gone", "item", "key", "taken", "task")

    def __init__(self, key: str, item: Any, task: trio.lowlevel.Task) -> None:
        self.key = key
        self.item = item
        self.task = task
        #: In a call under way: the script may land it.
        self.taken = False
        #: Answered, or its waiter was cancelled: nobody is to be rescheduled.
        self.gone = False

    def answer(self, result: outcome.Outcome[bool]) -> None:
        if not self.gone:
            self.gone = True
            trio.lowlevel.reschedule(self.task, result)


class Combiner:
    """Many tasks' writes, one call per batch (see the module's docstring).

    ``flush`` sends a batch's items and answers, per item in order, whether it
    landed. ``check`` runs in :meth:`submit` first (a closed driver refuses at
    once)."""

    def __init__(
        self,
        flush: Callable[[list[Any]], Awaitable[Sequence[bool]]],
        check: Callable[[], object],
        closed: Callable[[], BaseException],
        *,
        batch: int = BATCH,
    ) -> None:
        self._flush = flush
        self._check = check
        self._closed = closed
        self._batch = batch
        self._pending: list[_Pending] = []
        self._kick = trio.Event()
        #: Script calls made (tests and benchmarks read it).
        self.flushes = 0

    async def submit(self, key: str, item: Any) -> bool:
        self._check()
        entry = _Pending(key, item, trio.lowlevel.current_task())
        self._pending.append(entry)
        self._kick.set()

        def abort(_raise_cancel: Any) -> trio.lowlevel.Abort:
            entry.gone = True
            if not entry.taken and entry in self._pending:
                self._pending.remove(entry)
            return trio.lowlevel.Abort.SUCCEEDED

        landed: bool = await trio.lowlevel.wait_task_rescheduled(abort)
        return landed

    def fail_pending(self, error: BaseException) -> None:
        """Answer every queued settle with ``error`` (the driver is closing)."""
        pending, self._pending = self._pending, []
        for entry in pending:
            entry.answer(outcome.Error(error))

    def _take(self) -> list[_Pending]:
        batch: list[_Pending] = []
        seen: set[str] = set()
        rest: list[_Pending] = []
        for entry in self._pending:
            if entry.key in seen or len(batch) >= self._batch:
                rest.append(entry)
                continue
            seen.add(entry.key)
            entry.taken = True
            batch.append(entry)
        self._pending = rest
        return batch

    async def run(self) -> None:
        """The flusher: runs in the driver's service nursery until it closes."""
        try:
            while True:
                await self._kick.wait()
                self._kick = trio.Event()
                while self._pending:
                    batch = self._take()
                    self.flushes += 1
                    try:
                        landed = await self._flush([entry.item for entry in batch])
                    except Exception as exc:  # each waiter gets the failure
                        for entry in batch:
                            entry.answer(outcome.Error(exc))
                        continue
                    except BaseException:
                        # Cancelled mid-call (the driver is closing): the script
                        # may have run; each waiter hears so, none waits forever.
                        for entry in batch:
                            entry.answer(outcome.Error(self._closed()))
                        raise
                    for entry, ok in zip(batch, landed, strict=True):
                        entry.answer(outcome.Value(bool(ok)))
        finally:
            self.fail_pending(self._closed())
