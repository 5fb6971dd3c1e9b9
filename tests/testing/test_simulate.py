"""simulate_jobs: seeded, virtual-clock races of many workers over one driver."""

from __future__ import annotations

import logging

import attrs
import pytest

from trio_jobs import JobContext, JobsError, Retry, job
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
