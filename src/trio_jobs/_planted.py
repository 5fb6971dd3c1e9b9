"""Planted bugs: test-only wrappers that break one guarantee each.

The checkers (``simulate_jobs``'s invariants and ``crash_proof``) are checked by
planting each bug and asserting they catch it (``tests/testing/test_planted_bugs.py``).
The product never reads a switch: :func:`planted` replaces, for its block, the
method (or private seam) of the product whose behaviour the bug changes with a
wrapper that misbehaves, and puts the original back on exit. Nothing in
production calls it; nothing under ``src/trio_jobs`` but this module imports it.

Blocks nest (each restores what it found), but must exit in the reverse order
of entry, like any ``with``. A bug planted in a process is planted for every
driver and worker of that process, as the replaced methods are the classes'.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any

import attrs

from . import _consumer, _context, _retry, _unwind
from ._attempt import Attempt, Phase
from ._context import Compensator, RunState, Steps
from ._context import _call as _context_call
from ._facade import Transaction
from ._scheduler import Scheduler
from ._worker import Worker
from .drivers._protocol import (
    AckOptions,
    ClaimedJob,
    EventRecord,
    Fence,
    NackOptions,
    StepRecord,
)
from .drivers._tasks import TaskFire
from .drivers.memory import _driver as memory
from .drivers.memory import _rate as memory_rate
from .errors import ErrorCode

__all__ = ["NAMES", "active", "planted"]

_Stack = contextlib.ExitStack


@contextlib.contextmanager
def _patched(owner: object, name: str, new: object) -> Iterator[None]:
    """Set ``owner.name`` to ``new`` for the block; restore what was there."""
    own = vars(owner)
    had = name in own
    old = own.get(name)
    setattr(owner, name, new)
    try:
        yield
    finally:
        if had:
            setattr(owner, name, old)
        else:
            delattr(owner, name)


# ---------------------------------------------------------------------- the bugs


def _double_settle(stack: _Stack) -> None:
    """The worker settles a run twice, and the driver lets it: the worker's ack
    write is written a second time (a bare ack of the same fence; the ack
    pipeline's batch sends its landed acks again), and the memory driver's
    fence check lets a settle land on a row this fence already settled."""
    settle_write = Worker._settle_write
    send_batch = Worker._send_batch
    owned = memory.MemoryDriver._owned

    async def twice(
        self: Worker,
        claimed: ClaimedJob,
        write: str,
        call: Callable[[], Awaitable[bool]],
        held: Attempt | None = None,
        **kw: Any,
    ) -> bool:
        landed = await settle_write(self, claimed, write, call, held, **kw)
        if landed and write == "ack":
            await settle_write(
                self,
                claimed,
                "ack",
                lambda: self.driver.ack(claimed.id, AckOptions(fence=claimed.fence)),
            )
        return landed

    def owned_or_settled(
        self: memory.MemoryDriver, job_id: str, fence: Fence, now: float | None = None
    ) -> Any:
        row = self._rows.get(job_id)
        if row is not None and row.state == "done" and row.settled_fence == fence:
            return row
        return owned(self, job_id, fence, now)

    async def send_twice(self: Worker, sink: Any, batch: Any, nursery: Any) -> None:
        await send_batch(self, sink, batch, nursery)
        again = [
            (h.claimed.id, AckOptions(fence=h.claimed.fence))
            for h, _o, _d, _b in batch
            if h.phase is Phase.SETTLED
        ]
        if again:
            await sink.ack_many(again)

    stack.enter_context(_patched(Worker, "_settle_write", twice))
    stack.enter_context(_patched(Worker, "_send_batch", send_twice))
    stack.enter_context(_patched(memory.MemoryDriver, "_owned", owned_or_settled))


def _unfenced_settle(stack: _Stack) -> None:
    """A settle lands without holding the claim's lease: the memory driver's
    fence check answers the row to whoever calls."""

    def anyone(
        self: memory.MemoryDriver, job_id: str, fence: Fence, now: float | None = None
    ) -> Any:
        return self._rows.get(job_id)

    stack.enter_context(_patched(memory.MemoryDriver, "_owned", anyone))


def _step_rerun(stack: _Stack) -> None:
    """A replay re-runs a step that has a completed record: ``step.run`` and
    ``step.transaction`` forget the step's completed record before they look."""

    def forgetting(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def forget(self: Steps, name: str, fn: Any, **kwargs: Any) -> Any:
            records = self._s.records
            rec = records.get(name) if isinstance(name, str) else None
            if rec is not None and rec.status == "completed":
                del records[name]
            return await method(self, name, fn, **kwargs)

        return forget

    stack.enter_context(_patched(Steps, "run", forgetting(Steps.run)))
    stack.enter_context(_patched(Steps, "transaction", forgetting(Steps.transaction)))


def _drain_counts(stack: _Stack) -> None:
    """A drained attempt is handed back counted: the worker's drain hand-back
    (an uncounted ``ready`` nack of an attempt aborted by ``X_DRAINING``) is
    written counted."""
    nack = Worker._nack

    async def counted(self: Worker, held: Attempt, options: NackOptions) -> bool:
        state = held.state
        reason = state.signal.reason if state is not None else None
        if (
            reason is not None
            and reason.code == ErrorCode.X_DRAINING
            and options.state == "ready"
            and not options.counted
            and options.delay is None
            and options.run_at is None
            and options.busy_key is None
            and options.error_code is None
        ):
            options = attrs.evolve(options, counted=True)
        return await nack(self, held, options)

    stack.enter_context(_patched(Worker, "_nack", counted))


def _dedupe_ignores_tenant(stack: _Stack) -> None:
    """The live key leaves the tenant out: the memory driver's dedupe key."""

    def key(name: str, tenant_id: str | None, key: str) -> tuple[str, str | None, str]:
        return (name, None, key)

    stack.enter_context(_patched(memory, "_key", key))


def _lease_not_released(stack: _Stack) -> None:
    """A settle keeps the run's concurrency lease: the memory driver's release
    of a run's leases does nothing."""

    def keep(self: memory.MemoryDriver, job_id: str) -> None:
        return None

    stack.enter_context(_patched(memory.MemoryDriver, "_release_leases", keep))


def _compensation_reversed(stack: _Stack) -> None:
    """Compensators run first-in first-out: the unwind's order is the
    registration order."""

    def registered(compensators: list[Compensator]) -> Iterable[Compensator]:
        return list(compensators)

    stack.enter_context(_patched(_unwind, "compensation_order", registered))


def _cancelled_body_writes(stack: _Stack) -> None:
    """A step starts and records after the abort: the refusal of a step past
    the run's abort lets every step through."""

    def let_through(self: RunState, name: str) -> None:
        return None

    stack.enter_context(_patched(RunState, "refuse_past_abort", let_through))


def _event_before_wait(stack: _Stack) -> None:
    """A wait sees events published before it began: the memory driver's event
    poll looks from the beginning of time."""
    poll = memory._MemoryEvents.poll

    async def from_the_start(
        self: memory._MemoryEvents, name: str, since: float
    ) -> tuple[list[EventRecord], float]:
        return await poll(self, name, -math.inf)

    stack.enter_context(_patched(memory._MemoryEvents, "poll", from_the_start))


def _waiter_not_woken(stack: _Stack) -> None:
    """A released slot leaves the runs waiting on its key asleep: the memory
    driver's wake of a key's first waiter (called only on a release) does
    nothing."""

    def sleep_on(self: memory.MemoryDriver, lease_key: str) -> None:
        return None

    stack.enter_context(_patched(memory.MemoryDriver, "_wake_waiter", sleep_on))


def _rate_limit_counts(stack: _Stack) -> None:
    """A rate-limited run is handed back with its attempt counted: the retry
    decision's deferral counts (so a backlog waiting for a budget dies)."""
    deferral = _retry.deferral

    def counted(*args: Any, **kwargs: Any) -> _retry.Decision:
        decision = deferral(*args, **kwargs)
        assert decision.retry is not None
        return attrs.evolve(decision, retry=attrs.evolve(decision.retry, counted=True))

    stack.enter_context(_patched(_retry, "deferral", counted))


def _rate_window_halved(stack: _Stack) -> None:
    """The window forgets grants early: the memory store counts the grants of
    half the window."""
    acquire = memory_rate.MemoryRateLimits.acquire

    async def halved(
        self: memory_rate.MemoryRateLimits, name: str, key: str, limit: int, per: float
    ) -> Any:
        return await acquire(self, name, key, limit, per / 2)

    stack.enter_context(_patched(memory_rate.MemoryRateLimits, "acquire", halved))


def _watermark_apart(stack: _Stack) -> None:
    """A task's watermark is written apart from its fire: the scheduler enqueues
    the occurrences' rows with the driver's own enqueue, then moves the
    watermark alone, in a second call (a crash between the two fires the
    occurrences again under the next leader)."""

    async def apart(self: Scheduler, fires: list[TaskFire]) -> list[str]:
        for fire in fires:
            if fire.requests:
                await self.jobs.driver.enqueue_many(list(fire.requests))
        store = self.store
        assert store is not None
        return await store.fire(self.leader, [attrs.evolve(f, requests=()) for f in fires])

    stack.enter_context(_patched(Scheduler, "_send", apart))


def _cursor_apart(stack: _Stack) -> None:
    """A consumer's cursor is saved outside its batch's transaction: in a
    transaction of its own, committed before the batch's (a crash or a failed
    commit in between leaves the cursor ahead of what was handled)."""

    async def apart(handle: _consumer.Consumer, key: str, cursor: str, tx: Transaction) -> None:
        driver = await tx.jobs._resolved_driver()
        async with driver.transaction() as own:
            await _context_call(handle.save_cursor, key, cursor, Transaction(tx.jobs, own))

    stack.enter_context(_patched(_consumer, "save_in_batch", apart))


def _children_apart(stack: _Stack) -> None:
    """A step's children are enqueued outside the transaction that records the
    step: committed on their own first, the step's ``waiting`` record written
    after (a crash in between leaves children no record names; the replay
    enqueues them again once the first ones have settled and freed their keys)."""

    async def apart(
        s: RunState,
        step_name: str,
        calls: list[tuple[Any, Any]],
        timeout_s: float | None,
        old: StepRecord | None,
    ) -> StepRecord:
        requests = _context.child_requests(s, step_name, calls, old)
        await s.hit("before-step", step_name)
        now = s.driver.now()
        ids = [r.id for r in await s.driver.enqueue_many(requests)]
        await s.hit("after-enqueue", step_name)
        record = StepRecord(
            name=step_name,
            status="waiting",
            seq=s.seq_for(step_name),
            executions=(old.executions if old is not None else 0) + 1,
            output={"children": ids, "wait": requests[0].id if requests else None},
            deadline=now + timeout_s if timeout_s is not None else None,
            started_at=now,
        )
        await s.put(record)
        s.records[step_name] = record
        return record

    stack.enter_context(_patched(_context, "_enqueue_children", apart))


def _settled_before_ack(stack: _Stack) -> None:
    """The ack pipeline settles an attempt when its slot hands the ack over,
    before the ack lands: the attempt is SETTLED, counted done and forgotten
    (no more renewals, its room freed) while its row still runs; the answer,
    when it comes, is ignored."""
    hand_ack = Worker._hand_ack
    acked = Worker._acked
    early: dict[int, Attempt] = {}

    def settle_now(
        self: Worker, held: Attempt, ack: AckOptions, deadline: float, began: float | None
    ) -> None:
        hand_ack(self, held, ack, deadline, began)
        early[id(held)] = held
        acked(self, held, True, began)

    def answer(self: Worker, held: Attempt, landed: bool, began: float | None) -> None:
        if early.pop(id(held), None) is not None:
            return
        acked(self, held, landed, began)

    stack.enter_context(_patched(Worker, "_hand_ack", settle_now))
    stack.enter_context(_patched(Worker, "_acked", answer))


_PLANTERS: dict[str, Callable[[_Stack], None]] = {
    "double-settle": _double_settle,
    "unfenced-settle": _unfenced_settle,
    "step-rerun": _step_rerun,
    "drain-counts": _drain_counts,
    "dedupe-ignores-tenant": _dedupe_ignores_tenant,
    "lease-not-released": _lease_not_released,
    "compensation-reversed": _compensation_reversed,
    "cancelled-body-writes": _cancelled_body_writes,
    "event-before-wait": _event_before_wait,
    "waiter-not-woken": _waiter_not_woken,
    "rate-limit-counts": _rate_limit_counts,
    "rate-window-halved": _rate_window_halved,
    "watermark-apart": _watermark_apart,
    "cursor-apart": _cursor_apart,
    "children-apart": _children_apart,
    "settled-before-ack": _settled_before_ack,
}

NAMES = frozenset(_PLANTERS)

_ON: list[str] = []


def active(name: str) -> bool:
    """Whether the planted bug ``name`` is planted now (never in production)."""
    return name in _ON


@contextlib.contextmanager
def planted(name: str) -> Iterator[None]:
    """Plant the bug ``name`` for the block (tests only): install its wrappers
    on entry, restore the originals on exit."""
    plant = _PLANTERS.get(name)
    if plant is None:
        raise ValueError(f"unknown planted bug {name!r}; one of {sorted(NAMES)}")
    with contextlib.ExitStack() as stack:
        plant(stack)
        _ON.append(name)
        try:
            yield
        finally:
            _ON.remove(name)
