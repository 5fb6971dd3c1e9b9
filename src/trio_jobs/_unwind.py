"""Compensation: a run that failed for good undoes its steps, last-in first-out.

The unwind is its own phase of an attempt (``Attempt.unwind_phase``): it records
the durable ``unwinding`` step with the original failure, replays the body only
to re-register its compensators when they are not known, then runs each
compensator not yet recorded, and finally buries the run with the original
failure. A compensator that fails is recorded and the unwind is retried on a
counted attempt while attempts are left (``_retry.decide_unwind``); a ``once``
step with an unknown outcome cannot be compensated (``X_JOB_COMPENSATION_FAILED``).

It settles through the worker that holds the attempt, seen as a
:class:`Settler`; this module never imports the worker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from ._attempt import Attempt
from ._context import (
    COMPENSATE_PREFIX,
    RESERVED_STEP,
    Compensator,
    Handback,
    InfraFault,
    JobContext,
    LeaseLost,
    RunState,
    _call,
    failed_record,
)
from ._declare import Job
from ._retry import decide_unwind
from ._time import JitterSource
from .drivers._protocol import NackOptions, StepRecord
from .errors import ErrorCode, JobsError

__all__ = ["Settler", "compensation_order", "unwind"]


def compensation_order(compensators: list[Compensator]) -> Iterable[Compensator]:
    """The order the compensators of a run are called in: last-in first-out."""
    return reversed(compensators)


class Settler(Protocol):
    """What the unwind needs of the worker holding the attempt."""

    _jitter: JitterSource

    async def _guarded(
        self, held: Attempt, state: RunState, fn: Callable[[], Any]
    ) -> tuple[Any, BaseException | None, Handback | InfraFault | None]: ...

    async def _aborted_verdict(
        self, held: Attempt, handle: Job[Any, Any], state: RunState, exc: BaseException | None
    ) -> bool: ...

    async def _fault(
        self,
        held: Attempt,
        error: JobsError,
        state: RunState | None,
        duration: float | None = None,
    ) -> None: ...

    async def _nack(self, held: Attempt, options: NackOptions) -> bool: ...

    def _count(
        self,
        key: str,
        held: Attempt | None,
        code: str | None = None,
        *,
        queue: str = "",
        name: str = "",
    ) -> None: ...

    async def _bury(
        self,
        held: Attempt,
        handle: Job[Any, Any] | None,
        code: str | None,
        message: str,
        value: Any,
        state: RunState | None,
    ) -> None: ...


async def unwind(
    worker: Settler,
    held: Attempt,
    handle: Job[Any, Any],
    state: RunState,
    original: tuple[str | None, str] | None,
) -> None:
    """Compensate, last-in first-out, a run that failed for good (``original``:
    its code and message; ``None`` when a replay finds the unwind under way or a
    final attempt's lease lapsed)."""

    claimed = held.claimed
    held.unwind_phase()
    try:
        rec = state.records.get(RESERVED_STEP)
        if rec is None:
            if original is None:
                original = (
                    ErrorCode.X_JOB_LEASE_LOST,
                    f"{ErrorCode.X_JOB_LEASE_LOST}: the lease lapsed on the final attempt; unwinding",
                )
            await state.put(
                StepRecord(
                    name=RESERVED_STEP,
                    status="completed",
                    seq=state.seq_for(RESERVED_STEP),
                    executions=1,
                    output={"code": original[0], "error": original[1]},
                )
            )
        else:
            out = rec.output if isinstance(rec.output, dict) else {}
            original = (out.get("code"), str(out.get("error") or "failed"))
        if not state.compensators:
            # Replay the body only to re-register its compensators.
            state.unwinding = True
            ctx: JobContext[Any] = JobContext(state)
            _r, _e, replayed = await worker._guarded(held, state, lambda: handle.run(ctx))
            if await worker._aborted_verdict(held, handle, state, None):
                return
            if isinstance(replayed, InfraFault):
                raise replayed
            held.unwind_phase()
    except LeaseLost:
        return
    except InfraFault as fault:
        await worker._fault(held, fault.error, state)
        return
    code, message = original
    if state.unknown_compensation is not None:
        step = state.unknown_compensation
        await worker._bury(
            held,
            handle,
            ErrorCode.X_JOB_COMPENSATION_FAILED,
            f"{ErrorCode.X_JOB_COMPENSATION_FAILED}: once step {step!r} has an unknown outcome, "
            f"so its compensation cannot be decided; resolve the step, then retry. "
            f"Original failure: {message}",
            state.input,
            state,
        )
        return
    for comp in compensation_order(state.compensators):
        cname = COMPENSATE_PREFIX + comp.step
        crec = state.records.get(cname)
        if crec is not None and crec.status == "completed":
            continue
        executions = (crec.executions if crec is not None else 0) + 1
        seq = state.seq_for(cname)
        await state.hit("compensate", comp.step)

        async def call(comp: Any = comp) -> None:
            await _call(comp.fn, comp.output)

        _r, comp_exc, comp_hb = await worker._guarded(held, state, call)
        if await worker._aborted_verdict(held, handle, state, comp_exc):
            return
        if isinstance(comp_hb, InfraFault):
            await worker._fault(held, comp_hb.error, state)
            return
        reason = state.signal.reason
        if reason is not None and comp_exc is None:
            comp_exc = reason
        try:
            if comp_exc is not None:
                await state.put(failed_record(cname, seq, executions, comp_exc))
                decision = decide_unwind(
                    comp_exc,
                    step=comp.step,
                    code=code,
                    message=message,
                    attempt=claimed.attempt,
                    max_attempts=claimed.max_attempts,
                    retry=handle.retry,
                    fence=claimed.fence,
                    jitter=worker._jitter,
                )
                if decision.retry is not None:
                    if await worker._nack(held, decision.retry):
                        worker._count("retried", held, decision.code)
                    return
                await worker._bury(
                    held, handle, decision.code, decision.message, state.input, state
                )
                return
            await state.put(
                StepRecord(name=cname, status="completed", seq=seq, executions=executions)
            )
        except LeaseLost:
            return
        except InfraFault as fault:
            await worker._fault(held, fault.error, state)
            return
    await worker._bury(held, handle, code, message, state.input, state)
