"""One owner per attempt: the phases of a claimed job and the one table of moves.

``_attempt.Attempt`` replaces six booleans that were kept in sync by hand; every
change of phase is checked against ``_attempt.LEGAL``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import trio

from jobs_support import Item, jobs_on_memory, wait_state
from trio_jobs import JobContext, Worker, job
from trio_jobs._attempt import LEGAL, Attempt, Phase
from trio_jobs._context import Signal
from trio_jobs.drivers import ClaimOptions
from trio_jobs.errors import ErrorCode, JobsError


def test_the_table_names_every_phase_and_settled_is_final() -> None:
    assert set(LEGAL) == set(Phase)
    assert LEGAL[Phase.SETTLED] == frozenset()
    # Every phase but SETTLED can still settle, and a settle ends SETTLED or LOST.
    assert all(
        Phase.SETTLING in LEGAL[p] for p in Phase if p not in (Phase.SETTLED, Phase.SETTLING)
    )
    assert LEGAL[Phase.SETTLING] == {Phase.SETTLED, Phase.LOST}
    # Nothing goes back to CLAIMED.
    assert all(Phase.CLAIMED not in targets for targets in LEGAL.values())


@job(input=Item, idempotency_key=lambda i: i.key, name="att.noop")
async def noop(ctx: JobContext[Item]) -> str:
    return "ok"


@job(input=Item, idempotency_key=lambda i: i.key, name="att.sleepy")
async def sleepy(ctx: JobContext[Item]) -> str:
    await ctx.step.run("one", lambda: 1)
    await ctx.step.sleep("1s")
    return "ok"


async def test_an_illegal_move_is_refused_and_reported_first(autojump_clock: Any) -> None:
    async with jobs_on_memory([noop]) as (_jobs, driver):
        await noop.enqueue(Item("x"))
        claimed = (await driver.claim(ClaimOptions("w", {"default": 1}, 30.0))).jobs[0]
    seen: list[tuple[Phase, Phase]] = []
    attempt = Attempt(claimed, trio.current_time(), lambda _a, was, to: seen.append((was, to)))
    attempt.settling()
    attempt.move(Phase.SETTLED)
    with pytest.raises(JobsError) as err:
        attempt.move(Phase.RUNNING)
    assert err.value.code == ErrorCode.X_INVARIANT
    assert "settled -> running" in err.value.message
    assert attempt.phase is Phase.SETTLED
    # The hook heard the illegal move too (the simulation fails on it).
    assert seen == [
        (Phase.CLAIMED, Phase.SETTLING),
        (Phase.SETTLING, Phase.SETTLED),
        (Phase.SETTLED, Phase.RUNNING),
    ]


async def test_an_abort_before_the_run_state_applies_when_it_attaches(
    autojump_clock: Any,
) -> None:
    async with jobs_on_memory([noop]) as (_jobs, driver):
        await noop.enqueue(Item("y"))
        claimed = (await driver.claim(ClaimOptions("w", {"default": 1}, 30.0))).jobs[0]
    attempt = Attempt(claimed, trio.current_time())
    attempt.abort(ErrorCode.X_DRAINING, "draining")
    attempt.abort(ErrorCode.X_ABORTED, "a second reason is not the first")
    assert attempt.phase is Phase.ABORTING
    assert attempt.pending == (ErrorCode.X_DRAINING, "draining")
    assert attempt.abort_at is not None
    # The run state (its signal and its `lost`) attaches: the first abort applies.
    state: Any = SimpleNamespace(signal=Signal(), lost=False, on_lost=None)
    attempt.attach(state)
    assert state.signal.reason is not None
    assert state.signal.reason.code == ErrorCode.X_DRAINING
    # A fenced write the state finds refused tells the attempt: it is lost.
    state.on_lost()
    assert attempt.phase is Phase.LOST
    attempt.detach()
    assert state.on_lost is None


@pytest.mark.parametrize(
    ("handle", "path"),
    [
        (noop, [Phase.RUNNING, Phase.SETTLING, Phase.SETTLED]),
        (sleepy, [Phase.RUNNING, Phase.SETTLING, Phase.SETTLED]),
    ],
)
async def test_a_worker_moves_each_attempt_through_the_table(
    autojump_clock: Any, handle: Any, path: list[Phase]
) -> None:
    moves: dict[tuple[str, int], list[Phase]] = {}

    def on_move(attempt: Attempt, was: Phase, to: Phase) -> None:
        assert to in LEGAL[was], (was, to)
        moves.setdefault((attempt.claimed.id, attempt.claimed.fence.claim), []).append(to)

    async with jobs_on_memory([handle]) as (jobs, _driver):
        enq = await handle.enqueue(Item("z"))
        worker = Worker(jobs)
        worker._on_move = on_move
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            view = await wait_state(jobs, enq.id, "done")
            await worker.drain()
    assert view.state == "done"
    # One attempt object per claim, each moved claimed -> running -> settling -> settled
    # (a sleep's hand-back settles its claim too; the wake is a new claim).
    assert moves
    assert all(seen == path for seen in moves.values()), moves


@job(input=Item, idempotency_key=lambda i: i.key, name="att.steps")
async def stepped(ctx: JobContext[Item]) -> int:
    a = await ctx.step.run("a", lambda: 1)
    b = await ctx.step.run("b", lambda: 2)
    return int(a) + int(b)


@pytest.mark.parametrize("handle", [noop, stepped], ids=["noop", "steps"])
async def test_a_finished_attempt_leaves_no_garbage_cycle(autojump_clock: Any, handle: Any) -> None:
    # An attempt and its run state point at each other while the slot runs; the
    # slot breaks the link when it ends. A cycle per job made every run garbage
    # that only the collector frees: 300 collections and 4,500 objects left
    # unreachable per 20,000 no-op jobs, ~15% of the worker's throughput.
    import gc

    async with jobs_on_memory([handle]) as (jobs, _driver):
        await handle.enqueue_many([Item(f"g{i}") for i in range(200)])
        gc.collect()
        gc.disable()
        try:
            worker = Worker(jobs, concurrency=16)
            await worker.run_until_quiet()
            left = gc.collect()
        finally:
            gc.enable()
        assert worker.stats().done == 200
    assert left == 0
