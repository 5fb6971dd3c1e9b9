"""A scenario's workload on the real ``Worker`` alone: the simulation's floor.

``python -m simulation speed`` runs each scenario's jobs twice: under
``simulate_jobs`` (arbiter, faults, checks, trace) and here, on the same
workers with the same options over a plain memory driver on Trio's autojump
``MockClock`` — no permits, no faults, no invariants. What this side costs per
job run is what the simulation cannot go below however lean it gets: the
``Worker``'s own path (claim, slot, context, step writes, settle).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import trio
import trio.testing

from trio_jobs import Worker, open_jobs
from trio_jobs.drivers._protocol import ClaimOptions, ClaimResult
from trio_jobs.drivers.memory import MemoryDriver
from trio_jobs.testing._simulate import ORIGIN, SIM_VT

from .scenarios import SCENARIOS

TERMINAL = frozenset({"done", "dead", "failed", "cancelled"})


class _TrioClock:
    """The driver's wall clock: Trio's (virtual) clock, from the simulation's origin."""

    def now(self) -> float:
        return ORIGIN + trio.current_time()


class _CountingDriver(MemoryDriver):
    """A memory driver that counts job runs as the simulation does: jobs
    claimed, less those handed back unrun because their key was busy."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.runs = 0
        leases = self.leases
        assert leases is not None
        acquire = leases.acquire

        async def counted(*args: Any) -> Any:
            grant = await acquire(*args)
            if grant.slot is None:
                self.runs -= 1
            return grant

        leases.acquire = counted  # type: ignore[method-assign]

    async def claim(self, options: ClaimOptions) -> ClaimResult:
        result = await super().claim(options)
        self.runs += len(result.jobs)
        return result


async def _one(name: str) -> int:
    """One seed's worth of ``name``'s workload; answers its job runs."""
    scenario = SCENARIOS[name]
    scenario.reset()
    driver = _CountingDriver(clock=_TrioClock())
    async with open_jobs(driver, jobs=scenario.jobs) as jobs:
        for handle, value in scenario.workload():
            await handle.enqueue(value)
        async with trio.open_nursery() as nursery:
            for k in range(scenario.workers):
                worker = Worker(
                    jobs,
                    worker_id=f"w{k}",
                    visibility_timeout=SIM_VT,
                    poll_interval=0.25,
                    idle_poll_max=5.0,
                    heartbeat_interval=9.987654,
                    fleet="single",  # the scenario's whole fleet, as in the simulation
                )
                nursery.start_soon(worker.run)
            # A look once a virtual second, as the simulation's quiet poll looks;
            # scheduled tasks never settle for good: they run to max_time.
            forever = any(h.kind == "task" for h in scenario.jobs)
            while (  # noqa: ASYNC110
                trio.current_time() < scenario.max_time
                if forever
                else any(row.state not in TERMINAL for row in driver._rows.values())
            ):
                await trio.sleep(1.0)
            nursery.cancel_scope.cancel()
    return driver.runs


def run_alone(name: str, seeds: int) -> tuple[int, float]:
    """Run ``name``'s workload ``seeds`` times; answer (job runs, CPU seconds)."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)  # timed: no log formatting (restored after)
    try:
        started = time.process_time()
        runs = sum(
            trio.run(_one, name, clock=trio.testing.MockClock(autojump_threshold=0))
            for _ in range(seeds)
        )
        return runs, time.process_time() - started
    finally:
        logging.disable(previous)
