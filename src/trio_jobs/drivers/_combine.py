"""The write combiner: many tasks' writes, one call to the store per batch.

Both durable drivers use it: the PostgreSQL driver for its acks and its step
records (one statement a batch), the Redis driver for its acks (one script call
a batch).

Each task's :meth:`Combiner.submit` queues its write and waits; one flusher task
(:meth:`Combiner.run`, in the driver's service nursery) sends everything queued
in one call, then wakes each waiter with whether its write landed. A caller
returns only after the call answered, so durability is what it was; the round
trip and the call's fixed cost are shared. Batches form by themselves under load
(writes queue while a call is in flight), with no added wait when idle;
``linger`` adds a wait before each call to grow them further. Two writes with one
``key`` (one row) never share a call: the later waits for the next one, so the
order of writes to one row is kept.

A waiter cancelled before its write was taken leaves the queue; one cancelled
while its call is in flight is not rescheduled (the call may have landed it: the
driver's retry recognises that). A failed call fails every write of its batch
with the call's error; a flusher cancelled mid-call (the driver is closing)
answers each waiter of that batch with ``in_flight_error()``.

:meth:`Combiner.submit_shielded` is the wait of a write that must outlive a
cancel of its caller (a step record: the body continues only once it is known to
have landed): its waiter is not taken out by a cancel, and learns of it at its
next checkpoint, after the answer. What bounds that wait is the combiner's
``budget``: each call runs under one deadline (one cancel scope a batch, where
the caller's own shielded scope cost one a write), and a call past it answers
its batch with ``hung_error()``. A write queued behind a hung call waits for
that call's budget and then its own: at most twice the budget. A flusher that
stops answers whatever is still queued, and a stopped one refuses new writes,
so no shielded waiter waits on a flusher that is gone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Hashable
from typing import Any

import outcome
import trio

__all__ = ["BATCH", "Combiner"]

#: The most writes one call carries (a constructor argument overrides it).
BATCH = 500


class _Pending:
    """One queued write: the waiting task is rescheduled with its answer (no
    Event per write: a hot path, one per ack and per step)."""

    __slots__ = ("combiner", "gone", "item", "key", "taken", "task")

    def __init__(
        self, key: Hashable, item: Any, task: trio.lowlevel.Task, combiner: Combiner
    ) -> None:
        self.key = key
        self.item = item
        self.task = task
        self.combiner = combiner
        #: In a call under way: the call may land it.
        self.taken = False
        #: Answered, or its waiter was cancelled: nobody is to be rescheduled.
        self.gone = False

    def answer(self, result: outcome.Outcome[bool]) -> None:
        if not self.gone:
            self.gone = True
            trio.lowlevel.reschedule(self.task, result)

    def abort(self, _raise_cancel: Any) -> trio.lowlevel.Abort:
        """The waiter was cancelled: out of the queue unless its call took it (a
        bound method, not a closure: one object a write, not three)."""
        self.gone = True
        pending = self.combiner._pending
        if not self.taken and self in pending:
            pending.remove(self)
        return trio.lowlevel.Abort.SUCCEEDED


def _stay(_raise_cancel: Any) -> trio.lowlevel.Abort:
    """A shielded waiter's answer to a cancel: it waits on (the flusher answers it
    within the budget; the cancel is raised at its next checkpoint)."""
    return trio.lowlevel.Abort.FAILED


class Combiner:
    """Many tasks' writes, one call per batch (see the module's docstring).

    ``flush`` sends a batch's items (in order) and answers the 1-based positions
    of those that landed. ``check`` runs first in :meth:`submit` (a closed driver
    refuses at once, by raising). ``in_flight_error`` is what each waiter of a
    call under way hears when the flusher is cancelled (the driver is closing);
    ``exit_error``, when given, is what every write still queued hears when
    :meth:`run` ends (else the driver answers them with :meth:`fail_pending`).
    ``budget`` (seconds) bounds each call; one past it answers its batch with
    ``hung_error()`` (both are needed by :meth:`submit_shielded`)."""

    def __init__(
        self,
        flush: Callable[[list[Any]], Awaitable[Collection[int]]],
        check: Callable[[], object],
        in_flight_error: Callable[[], BaseException],
        *,
        exit_error: Callable[[], BaseException] | None = None,
        linger: float = 0.0,
        batch: int = BATCH,
        budget: float | None = None,
        hung_error: Callable[[], BaseException] | None = None,
    ) -> None:
        self._flush = flush
        self._check = check
        self._in_flight_error = in_flight_error
        self._exit_error = exit_error
        self._linger = linger
        self._batch = batch
        #: Seconds a call may take (``None``: unbounded); tests shorten it.
        self.budget = budget
        self._hung_error = hung_error
        self._pending: list[_Pending] = []
        self._kick = trio.Event()
        #: Whether :meth:`run` is under way (a shielded write needs its flusher).
        self._running = False
        #: Calls made (tests and benchmarks read it).
        self.flushes = 0

    async def submit(self, key: Hashable, item: Any) -> bool:
        """Queue ``item`` (a write of row ``key``) and wait for its call: whether
        it landed. Raises the call's error when the call failed."""
        self._check()
        entry = _Pending(key, item, trio.lowlevel.current_task(), self)
        self._pending.append(entry)
        self._kick.set()
        landed: bool = await trio.lowlevel.wait_task_rescheduled(entry.abort)
        return landed

    async def submit_shielded(self, key: Hashable, item: Any) -> bool:
        """:meth:`submit` for a write that outlives a cancel of its caller: a cancel
        neither takes it out of the queue nor ends the wait, which the call's
        ``budget`` bounds (see the module's docstring); the cancel is raised at
        the caller's next checkpoint."""
        self._check()
        if not self._running or self.budget is None or self._exit_error is None:
            raise self._in_flight_error()
        entry = _Pending(key, item, trio.lowlevel.current_task(), self)
        self._pending.append(entry)
        self._kick.set()
        landed: bool = await trio.lowlevel.wait_task_rescheduled(_stay)
        return landed

    def fail_pending(self, error: BaseException) -> None:
        """Answer every queued write with ``error`` (the driver is closing)."""
        pending, self._pending = self._pending, []
        for entry in pending:
            entry.answer(outcome.Error(error))

    def _take(self) -> list[_Pending]:
        batch: list[_Pending] = []
        seen: set[Hashable] = set()
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
        self._running = True
        try:
            while True:
                await self._kick.wait()
                self._kick = trio.Event()
                if self._linger > 0:
                    await trio.sleep(self._linger)
                while self._pending:
                    batch = self._take()
                    self.flushes += 1
                    try:
                        if self.budget is None:
                            landed = await self._flush([entry.item for entry in batch])
                        else:
                            with trio.move_on_after(self.budget) as bound:
                                landed = await self._flush([entry.item for entry in batch])
                            if bound.cancelled_caught:
                                # The call may have landed: a replay resolves it.
                                assert self._hung_error is not None
                                for entry in batch:
                                    entry.answer(outcome.Error(self._hung_error()))
                                continue
                    except Exception as exc:  # each waiter gets the failure
                        for entry in batch:
                            entry.answer(outcome.Error(exc))
                        continue
                    except BaseException:
                        # Cancelled mid-call (the driver is closing): the call
                        # may have landed; each waiter hears so, none waits forever.
                        for entry in batch:
                            entry.answer(outcome.Error(self._in_flight_error()))
                        raise
                    for i, entry in enumerate(batch, start=1):
                        entry.answer(outcome.Value(i in landed))
        finally:
            self._running = False
            if self._exit_error is not None:
                self.fail_pending(self._exit_error())
