"""``python -m simulation speed``: the simulated rate beside the Worker alone.

The Worker-alone side must do the same work the simulation counts, or the
ratio it prints means nothing: the same job runs for a fault-free scenario,
and no busy-key hand-back counted as a run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import trio
from click.testing import CliRunner

from trio_jobs.testing import Faults

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from simulation.__main__ import cli  # noqa: E402
from simulation.alone import run_alone  # noqa: E402
from simulation.scenarios import SCENARIOS, run_scenario  # noqa: E402


def test_the_worker_alone_runs_what_a_fault_free_simulation_runs() -> None:
    # concurrent-workers has no faults: 40 jobs, each run twice (its 30 s sleep
    # hands it back once).
    assert SCENARIOS["concurrent-workers"].faults == Faults()
    runs, cpu = run_alone("concurrent-workers", 2)
    simulated = sum(trio.run(run_scenario, "concurrent-workers", s).job_runs for s in (1, 2))
    assert runs == simulated == 160
    assert cpu > 0


def test_the_worker_alone_counts_no_hand_back_as_a_run() -> None:
    runs, _cpu = run_alone("keyed-concurrency", 1)
    assert runs == len(SCENARIOS["keyed-concurrency"].workload()) == 24


def test_speed_prints_one_row_per_scenario() -> None:
    result = CliRunner().invoke(
        cli, ["speed", "--seeds", "1", "--scenario", "tenants", "--scenario", "compensation"]
    )
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if line.startswith("| ")]
    assert [r.split(" | ")[0] for r in rows[1:]] == ["| tenants", "| compensation"]
    for row in rows[1:]:
        sim, alone, ratio = (cell.strip().replace(",", "") for cell in row.split("|")[2:5])
        assert float(sim) > 0
        assert float(alone) > 0
        assert float(ratio) > 0
