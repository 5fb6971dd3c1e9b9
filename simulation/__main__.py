"""``python -m simulation``: run, replay and gate the seeded scenarios."""

from __future__ import annotations

import json
import logging
import random
import sys
import time
from pathlib import Path

import click
import trio

from trio_jobs import JobsError

from .alone import run_alone
from .scenarios import SCENARIOS, run_scenario

SEEDS_FILE = Path(__file__).with_name("seeds.json")


def _run(name: str, seeds: list[int]) -> tuple[int, list[tuple[int, str]], int, float]:
    failures: list[tuple[int, str]] = []
    runs = 0

    async def main() -> None:
        nonlocal runs
        for seed in seeds:
            try:
                result = await run_scenario(name, seed)
                runs += result.job_runs
            except JobsError as exc:
                failures.append((seed, f"{exc.message} | cause: {exc.__cause__!r}"))

    started = time.process_time()
    trio.run(main)
    return len(seeds), failures, runs, time.process_time() - started


@click.group()
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Seeded simulation scenarios."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    # Restored when the command ends (it also runs in-process, under CliRunner).
    ctx.call_on_close(lambda: logging.disable(previous))


@cli.command("list")
def list_scenarios() -> None:
    """List the scenarios."""
    for name, scenario in SCENARIOS.items():
        click.echo(
            f"{name}: {len(scenario.workload())} jobs, {scenario.workers} workers, faults {scenario.faults}"
        )


@cli.command()
@click.option(
    "--scenario", "names", multiple=True, help="Scenario name (repeatable); default: all."
)
@click.option("--seed", type=int, default=None, help="Replay one seed.")
@click.option("--seeds", "count", type=int, default=None, help="Run this many random seeds.")
@click.option(
    "--start", type=int, default=None, help="First seed of a --seeds batch (default: random)."
)
def run(names: tuple[str, ...], seed: int | None, count: int | None, start: int | None) -> None:
    """Replay one seed, or run a batch of seeds."""
    chosen = list(names) or list(SCENARIOS)
    if seed is not None:
        seeds = [seed]
    else:
        first = start if start is not None else random.SystemRandom().randrange(1_000_000)
        seeds = list(range(first, first + (count or 100)))
    sys.exit(_report(chosen, seeds))


@cli.command()
@click.option(
    "--random-seeds", type=int, default=50, show_default=True, help="Random seeds per scenario."
)
def gate(random_seeds: int) -> None:
    """The CI gate: every pinned regression seed, then a random batch."""
    pinned = json.loads(SEEDS_FILE.read_text())
    status = 0
    for name in SCENARIOS:
        status |= _report([name], pinned.get(name, []))
    first = random.SystemRandom().randrange(1_000_000)
    click.echo(f"random batch from seed {first}")
    status |= _report(list(SCENARIOS), list(range(first, first + random_seeds)))
    sys.exit(status)


@cli.command()
@click.option(
    "--scenario", "names", multiple=True, help="Scenario name (repeatable); default: all."
)
@click.option("--seeds", "count", type=int, default=100, show_default=True)
def speed(names: tuple[str, ...], count: int) -> None:
    """Simulated job runs per CPU second, beside the same workload on the
    Worker alone (no arbiter, faults or checks): the simulation's floor."""
    click.echo("| scenario | simulated runs/CPU s | Worker alone runs/CPU s | simulated / alone |")
    click.echo("|---|---:|---:|---:|")
    for name in names or SCENARIOS:
        _count, _failures, runs, cpu = _run(name, list(range(1, count + 1)))
        alone_runs, alone_cpu = run_alone(name, count)
        sim_rate = runs / cpu if cpu else 0.0
        alone_rate = alone_runs / alone_cpu if alone_cpu else 0.0
        ratio = sim_rate / alone_rate if alone_rate else 0.0
        click.echo(f"| {name} | {sim_rate:,.0f} | {alone_rate:,.0f} | {ratio:.2f} |")


def _report(names: list[str], seeds: list[int]) -> int:
    status = 0
    for name in names:
        count, failures, runs, cpu = _run(name, seeds)
        rate = runs / cpu if cpu else 0.0
        click.echo(
            f"{name}: {count} seeds, {runs} job runs, {cpu:.2f} CPU s ({rate:,.0f} runs/CPU s), "
            f"{len(failures)} failed"
        )
        for seed, message in failures:
            status = 1
            click.echo(f"  FAIL seed {seed}: {message}")
            click.echo(f"  reproduce: python -m simulation run --scenario {name} --seed {seed}")
    return status


if __name__ == "__main__":
    cli()
