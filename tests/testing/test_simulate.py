"""simulate_jobs: seeded, virtual-clock races of many workers over one driver."""

from __future__ import annotations

import logging

import attrs
import pytest
import trio
import trio.testing

from trio_jobs import Concurrency, JobContext, JobsError, Retry, job
from trio_jobs.testing import Faults, World, simulate_jobs


@attrs.frozen
class In:
    n: int


@job(input=In, idempotency_key=lambda i: f"three:{i.n}", retry=Retry(attempts=8, base="1s"))
async def three_steps(ctx: JobContext[In]) -> int:
    a = await ctx.step.run("a", lambda: 1)
    b = await ctx.step.run("b", lambda: 2)
    c = await ctx.step.run("c", lambda: 3)
    return int(a) + int(b) + int(c)


def _scenario(n: int) -> list[tuple[object, In]]:
    return [(three_steps, In(i)) for i in range(n)]


async def test_the_same_seed_gives_the_identical_trace() -> None:
    first = await simulate_jobs(jobs=[three_steps], workers=3, seed=42, scenario=_scenario(60))
    second = await simulate_jobs(jobs=[three_steps], workers=3, seed=42, scenario=_scenario(60))
    assert first.trace_bytes() == second.trace_bytes()
    assert first.seed == 42
    assert first.job_runs >= 60
    assert [v.state for v in first.world.jobs] == ["done"] * 60
    assert all(v.result == 6 for v in first.world.jobs)


BODIES: list[int] = []


@job(
    input=In,
    idempotency_key=lambda i: f"keyed:{i.n}",
    concurrency=Concurrency(limit=1, key=lambda i: "the-one-key"),
)
async def one_key(ctx: JobContext[In]) -> None:
    BODIES.append(ctx.input.n)
    await ctx.step.run("hold", _hold)


async def _hold() -> None:
    await trio.sleep(5)  # virtual time: the key stays busy meanwhile


@pytest.mark.parametrize("seed", [1, 2])
async def test_job_runs_count_bodies_run_not_busy_key_hand_backs(seed: int) -> None:
    # Six runs over one key: the runs claimed while it is busy are handed straight
    # back to wait on it, none of them a run.
    BODIES.clear()
    result = await simulate_jobs(
        jobs=[one_key], workers=3, seed=seed, scenario=[(one_key, In(i)) for i in range(6)]
    )
    hand_backs = [e for e in result.trace if e[1:2] != ("scenario",) and e[2:3] == ("nack",)]
    claimed = sum(len(e[3]) for e in result.trace if e[2:3] == ("claim",))
    assert hand_backs
    assert claimed == 6 + len(hand_backs)
    assert [v.state for v in result.world.jobs] == ["done"] * 6
    assert sorted(BODIES) == list(range(6))
    assert result.job_runs == len(BODIES) == 6


async def test_another_seed_interleaves_differently() -> None:
    a = await simulate_jobs(jobs=[three_steps], workers=3, seed=1, scenario=_scenario(40))
    b = await simulate_jobs(jobs=[three_steps], workers=3, seed=2, scenario=_scenario(40))
    assert a.trace_bytes() != b.trace_bytes()


async def test_a_failing_invariant_names_the_seed() -> None:
    def invariant(world: World) -> None:
        assert len(world.jobs) == 999, "planted: never true"

    with pytest.raises(JobsError) as err:
        await simulate_jobs(
            jobs=[three_steps], workers=2, seed=7, scenario=_scenario(5), invariant=invariant
        )
    assert err.value.code == "X_SIMULATION_INVARIANT"
    assert err.value.meta["seed"] == 7
    assert "seed 7" in err.value.message
    assert "--seed 7" in err.value.message
    assert isinstance(err.value.__cause__, AssertionError)


async def test_an_illegal_state_transition_fails_the_simulation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trio_jobs.drivers.memory import MemoryDriver

    ack = MemoryDriver.ack

    async def ack_then_drop(self: MemoryDriver, job_id: str, options: object) -> bool:
        landed = await ack(self, job_id, options)  # type: ignore[arg-type]
        del self._rows[job_id]  # running -> gone: no legal transition does that
        return landed

    monkeypatch.setattr(MemoryDriver, "ack", ack_then_drop)
    with pytest.raises(JobsError) as err:
        await simulate_jobs(jobs=[three_steps], workers=2, seed=7, scenario=_scenario(3))
    assert err.value.code == "X_SIMULATION_INVARIANT"
    assert "illegal transition running -> removed" in str(err.value.__cause__)
    assert "in ack" in str(err.value.__cause__)


async def test_an_illegal_attempt_move_fails_the_simulation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The worker's own table (_attempt.LEGAL) is checked at every move: a worker
    # that settled an attempt a second time must fail the simulation, even though
    # the slot only logs the X_INVARIANT it raises.
    from trio_jobs._attempt import Attempt, Phase

    real = Attempt.move

    def move(self: Attempt, to: Phase) -> None:
        real(self, to)
        if to is Phase.SETTLED:
            real(self, Phase.SETTLING)  # SETTLED is final: no legal move leaves it

    monkeypatch.setattr(Attempt, "move", move)
    with pytest.raises(JobsError) as err:
        await simulate_jobs(jobs=[three_steps], workers=2, seed=7, scenario=_scenario(3))
    assert err.value.code == "X_SIMULATION_INVARIANT"
    assert "illegal attempt move settled -> settling" in str(err.value.__cause__)


async def test_every_event_checking_runs_between_events() -> None:
    seen: list[int] = []

    def invariant(world: World) -> None:
        seen.append(len(world.jobs))
        running = [v for v in world.jobs if v.state == "running"]
        assert len(running) <= 2 * 8

    await simulate_jobs(
        jobs=[three_steps],
        workers=2,
        seed=3,
        scenario=_scenario(10),
        invariant=invariant,
        check="every-event",
    )
    assert len(seen) > 20


async def test_an_async_scenario_enqueues() -> None:
    async def scenario() -> None:
        for i in range(4):
            await three_steps.enqueue(In(i))
        await three_steps.enqueue(In(0))  # a live key dedupes

    result = await simulate_jobs(jobs=[three_steps], workers=2, seed=5, scenario=scenario)
    assert len(result.world.jobs) == 4


@job(input=In, idempotency_key=lambda i: f"other:{i.n}")
async def other(ctx: JobContext[In]) -> None:
    return None


async def test_a_list_scenario_is_enqueued_in_order_one_batch_per_run_of_a_job() -> None:
    scenario = [
        (three_steps, In(0)),
        (three_steps, In(1)),
        (other, In(0)),
        (three_steps, In(2)),
        (three_steps, In(0)),  # a live key dedupes, in a later batch too
        (three_steps, In(2)),  # ... and in its own batch
    ]
    result = await simulate_jobs(jobs=[three_steps, other], workers=2, seed=6, scenario=scenario)
    enqueues = [event[3] for event in result.trace if event[1:3] == ("scenario", "enqueue")]
    assert [len(batch) for batch in enqueues] == [2, 1, 3]
    assert [deduped for batch in enqueues for _id, deduped in batch] == [
        False,
        False,
        False,
        False,
        True,
        True,
    ]
    views = result.world.jobs
    assert [(v.name, v.payload["n"]) for v in views] == [
        (three_steps.name, 0),
        (three_steps.name, 1),
        (other.name, 0),
        (three_steps.name, 2),
    ]
    assert all(v.state == "done" for v in views)


def test_a_list_scenario_batch_is_cut_at_the_enqueue_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    from trio_jobs.testing import _simulate

    monkeypatch.setattr(_simulate, "MAX_ENQUEUE_BATCH", 2)
    pairs = [(three_steps, In(i)) for i in range(5)] + [(other, In(0))]
    batches = list(_simulate._batches(pairs))
    assert [[value.n for _job, value in batch] for batch in batches] == [[0, 1], [2, 3], [4], [0]]
    assert [batch[0][0] for batch in batches] == [three_steps, three_steps, three_steps, other]


@pytest.mark.parametrize("seed", [3, 4, 8, 13])
async def test_faults_keep_the_built_in_invariants(
    seed: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.CRITICAL)
    faults = Faults(
        crash=0.01, lease_loss=0.01, pause=0.01, driver_errors=0.02, skew=2.0, drain=0.005
    )
    result = await simulate_jobs(
        jobs=[three_steps], workers=3, seed=seed, scenario=_scenario(30), faults=faults
    )
    states = {v.state for v in result.world.jobs}
    assert states <= {"done", "dead"}
    assert len(result.world.jobs) == 30


@pytest.mark.parametrize("seed", [1, 5, 9, 11, 17, 21])
async def test_the_same_seed_replays_byte_for_byte_under_every_fault(
    seed: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.CRITICAL)
    faults = Faults(
        crash=0.01,
        lease_loss=0.01,
        pause=0.01,
        driver_errors=0.02,
        skew=2.0,
        drain=0.005,
        lost_wakeups=False,
    )
    runs = [
        await simulate_jobs(
            jobs=[three_steps], workers=3, seed=seed, scenario=_scenario(30), faults=faults
        )
        for _ in range(2)
    ]
    assert runs[0].trace_bytes() == runs[1].trace_bytes()


async def test_the_fault_seeds_above_do_inject_faults(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL)
    faults = Faults(
        crash=0.01, lease_loss=0.01, pause=0.01, driver_errors=0.02, skew=2.0, drain=0.005
    )
    kinds: set[str] = set()
    for seed in [1, 5, 9, 11, 17, 21]:
        result = await simulate_jobs(
            jobs=[three_steps], workers=3, seed=seed, scenario=_scenario(30), faults=faults
        )
        kinds |= {str(event[2]) for event in result.trace}
    assert {"crash", "pause", "drain"} <= kinds


async def test_the_trace_does_not_depend_on_trios_scheduler_order(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The arbiter decides every interleaving that matters: reseeding Trio's own
    # batch shuffle (which tasks of one pass run first) changes no event.
    caplog.set_level(logging.CRITICAL)
    from trio_jobs.testing import _simulate

    faults = Faults(crash=0.02, lease_loss=0.01, pause=0.02, driver_errors=0.02, drain=0.01)
    seeded = _simulate._seed_trio_scheduler
    traces = set()
    for salt in (0, 1, 2):
        monkeypatch.setattr(
            _simulate, "_seed_trio_scheduler", lambda seed, salt=salt: seeded(seed * 7 + salt)
        )
        result = await simulate_jobs(
            jobs=[three_steps], workers=3, seed=11, scenario=_scenario(20), faults=faults
        )
        traces.add(result.trace_bytes())
    assert len(traces) == 1


async def test_an_async_invariant_is_checked_between_events() -> None:
    runs = []
    for _ in range(2):
        seen: list[int] = []

        async def invariant(world: World, seen: list[int] = seen) -> None:
            await trio.lowlevel.checkpoint()
            seen.append(len([v for v in world.jobs if v.state == "done"]))

        result = await simulate_jobs(
            jobs=[three_steps],
            workers=2,
            seed=4,
            scenario=_scenario(6),
            invariant=invariant,
            check="every-event",
        )
        runs.append((result.trace_bytes(), seen))
    assert runs[0] == runs[1]
    seen = runs[0][1]
    assert len(seen) > 20
    assert seen == sorted(seen)  # each check saw the jobs of its own instant
    assert seen[-1] == 6


async def test_a_world_the_invariant_keeps_holds_the_jobs_of_its_instant() -> None:
    read_then: list[list[str]] = []
    kept: list[World] = []

    def reads(world: World) -> None:
        read_then.append([v.state for v in world.jobs])

    def keeps(world: World) -> None:
        kept.append(world)  # read only after the simulation

    for invariant in (reads, keeps):
        await simulate_jobs(
            jobs=[three_steps],
            workers=2,
            seed=9,
            scenario=_scenario(5),
            invariant=invariant,
            check="every-event",
        )
    assert len(kept) == len(read_then) > 20
    assert [[v.state for v in w.jobs] for w in kept] == read_then


async def test_max_time_ends_the_simulation_with_a_worker_paused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The quiet poll stops at max_time while a paused worker's clean-up still
    # waits for the pause to end: the clock must go on until it has.
    caplog.set_level(logging.CRITICAL)
    result = await simulate_jobs(
        jobs=[three_steps],
        workers=3,
        seed=3,
        scenario=_scenario(10),
        faults=Faults(crash=0.02, pause=0.05),
        max_time=40.0,
    )
    assert result.world.now >= 1_800_000_000.0 + 40.0
    assert any(event[2] == "pause" for event in result.trace)


def test_trio_asks_the_clock_only_when_every_task_is_blocked() -> None:
    # The arbiter acts where Trio asks the clock how long it may sleep (only when
    # no task is runnable), in the before_io_wait of that same pass, before any
    # task runs. Pin both, so a Trio that changes either fails here, loudly.
    log: list[str] = []

    class Clock(trio.abc.Clock):
        now = 0.0

        def start_clock(self) -> None:
            return None

        def current_time(self) -> float:
            return self.now

        def deadline_to_sleep_time(self, deadline: float) -> float:
            runnable = trio.lowlevel.current_statistics().tasks_runnable
            log.append(f"ask:{runnable}")
            self.now = max(self.now, deadline)  # a jump, as the arbiter's
            return 0.0

    class Log(trio.abc.Instrument):
        def before_io_wait(self, timeout: float) -> None:
            log.append("io")

        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            log.append("step")

    async def main() -> None:
        async def spin(n: int) -> None:
            for _ in range(n):
                await trio.lowlevel.checkpoint()

        async def nap() -> None:
            for _ in range(3):
                await trio.sleep(1)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(spin, 5)
            nursery.start_soon(spin, 2)
            nursery.start_soon(nap)

    trio.run(main, clock=Clock(), instruments=[Log()])
    asks = [i for i, entry in enumerate(log) if entry.startswith("ask")]
    assert len(asks) >= 3
    assert all(log[i] == "ask:0" and log[i + 1] == "io" for i in asks)


def test_the_arbiters_quiet_check_reads_what_trios_statistics_say() -> None:
    # The arbiter reads "no task runnable, no deadline due" off Trio's runner (the
    # public statistics also build the I/O backend's, a tenth of a permit's cost).
    # Pin it to the public answer in each case, so a Trio that changes either
    # fails here.
    from trio_jobs.testing import _simulate

    seen: list[tuple[str, bool, bool]] = []

    def probe(label: str) -> None:
        now = trio.current_time()
        seen.append((label, _simulate._quiet(now), _simulate._quiet_public(now)))

    clock = trio.testing.MockClock(autojump_threshold=0)

    async def main() -> None:
        probe("alone")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep, 10)
            probe("a task spawned, not yet run")
            await trio.sleep(0.5)  # it ran, and sleeps on
            probe("a deadline ahead")
            with trio.CancelScope(deadline=trio.current_time() + 1):  # noqa: ASYNC100
                clock.jump(2)  # past it, before any pass processed it
                probe("a deadline due")
            nursery.cancel_scope.cancel()

    trio.run(main, clock=clock)
    assert _simulate._quiet is _simulate._quiet_runner  # this Trio is readable
    assert [(label, fast) for label, fast, _public in seen] == [
        ("alone", True),
        ("a task spawned, not yet run", False),
        ("a deadline ahead", True),
        ("a deadline due", False),
    ]
    assert all(fast == public for _label, fast, public in seen)


def test_a_crash_landing_with_the_end_of_the_simulation_leaves_only_the_rest() -> None:
    # A worker crash (Killed) may land in the same nursery exit as the end's
    # cancellation: the crash is the simulation's, the rest goes on up.
    from trio_jobs.testing._crash import Killed
    from trio_jobs.testing._simulate import _without_killed

    ending = KeyboardInterrupt()
    mixed = BaseExceptionGroup("x", [Killed(), BaseExceptionGroup("y", [ending, Killed()])])
    rest = _without_killed(mixed)
    assert isinstance(rest, BaseExceptionGroup)
    assert [type(e) for e in rest.exceptions[0].exceptions] == [KeyboardInterrupt]
    assert _without_killed(Killed()) is None
    assert _without_killed(BaseExceptionGroup("z", [Killed(), Killed()])) is None
    other = ValueError("a real failure")
    assert _without_killed(other) is other
