"""``trio-jobs check``: exit codes, ``--json`` as pinned, reproduce lines, bad input."""

from __future__ import annotations

import os
import pathlib
import shlex
import subprocess
import sys

import orjson
import pytest
from click.testing import CliRunner

from trio_jobs.cli import main

TESTS = pathlib.Path(__file__).resolve().parents[1]


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["check", *args])
    return result.exit_code, result.stdout, result.stderr


def test_a_passing_app_exits_0_with_the_pinned_json() -> None:
    code, out, _ = invoke("check_apps.good", "--examples", "2", "--seeds", "2", "--json")
    assert code == 0
    body = orjson.loads(out)
    assert body["ok"] is True
    assert [set(j) for j in body["jobs"]] == [
        {"name", "examples", "boundaries", "seeds", "failures"}
    ] * 2
    assert body["jobs"][0] == {
        "name": "checkout", "examples": 2, "boundaries": 18, "seeds": 2, "failures": [],
    }  # fmt: skip


def test_a_failing_job_exits_1_with_a_failure_as_pinned() -> None:
    code, out, _ = invoke("check_apps.double", "--seeds", "1", "--json")
    assert code == 1
    body = orjson.loads(out)
    assert body["ok"] is False
    (failure,) = body["jobs"][0]["failures"]
    assert list(failure) == ["code", "example", "boundary", "message", "reproduce"]
    assert failure["code"] == "X_JOB_CRASH_DIVERGED"
    assert failure["reproduce"] == (
        "trio-jobs check check_apps.double --seeds 1 --json --job pay --example 0"
    )


def test_a_simulation_failure_names_its_seed() -> None:
    code, out, _ = invoke("check_apps.race", "--seeds", "3", "--json")
    assert code == 1
    (failure,) = orjson.loads(out)["jobs"][0]["failures"]
    assert list(failure) == ["code", "example", "seed", "message", "reproduce"]
    assert failure["reproduce"].endswith(f"--json --job deposit --seed {failure['seed']}")


def test_the_summary_table_and_the_reproduce_line_without_json() -> None:
    code, out, _ = invoke("check_apps.double", "--seeds", "1")
    assert code == 1
    assert "pay" in out
    assert "X_JOB_CRASH_DIVERGED" in out
    assert "reproduce: trio-jobs check check_apps.double --seeds 1 --job pay --example 0" in out


def test_a_reproduce_line_fails_alone_the_same_way() -> None:
    _code, out, _ = invoke("check_apps.clock", "--examples", "3", "--seeds", "1", "--json")
    (failure,) = orjson.loads(out)["jobs"][0]["failures"]
    words = shlex.split(failure["reproduce"])
    assert words[:2] == ["trio-jobs", "check"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-m", "trio_jobs.cli", *words[1:]],
        capture_output=True,
        env=env,
        cwd=TESTS,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    (again,) = orjson.loads(done.stdout)["jobs"][0]["failures"]
    assert (again["code"], again["example"], again["boundary"]) == (
        failure["code"], failure["example"], failure["boundary"],
    )  # fmt: skip


@pytest.mark.parametrize(
    ("module", "said"),
    [
        ("check_apps.broken", "importing 'check_apps.broken' raised RuntimeError"),
        ("check_apps.missing_module", "could not import 'check_apps.missing_module'"),
        ("check_apps.nojobs", "has no job at its top level"),
        ("check_apps.unbuildable", "Hypothesis cannot build inputs for odd"),
        ("check_apps.hook_raises", "trio_jobs_reset() raised KeyError"),
    ],
)
def test_the_gate_that_cannot_run_exits_2_without_a_traceback(module: str, said: str) -> None:
    code, out, err = invoke(module, "--seeds", "1")
    assert code == 2
    assert said in err
    assert "Traceback" not in out + err
    code, out, _ = invoke(module, "--seeds", "1", "--json")
    assert code == 2
    assert orjson.loads(out)["error"]["code"] == "X_CONFIG_INVALID"


def test_usage_errors_exit_2() -> None:
    assert invoke("check_apps.good", "--example", "1")[0] == 2  # without --job
    assert invoke("check_apps.good", "--examples", "0")[0] == 2
    assert invoke("check_apps.good", "--job", "nope")[0] == 2


def test_the_pytest_option_adds_one_item_per_job() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}
    done = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
            "--trio-jobs-check=check_apps.good", "--trio-jobs-check-examples=2",
            "--trio-jobs-check-seeds=1", str(TESTS / "check_apps" / "nojobs.py"),
        ],
        capture_output=True, text=True, env=env, cwd=TESTS, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout
    assert "2 passed" in done.stdout
    done = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
            "--trio-jobs-check=check_apps.double", "--trio-jobs-check-seeds=1",
            str(TESTS / "check_apps" / "nojobs.py"),
        ],
        capture_output=True, text=True, env=env, cwd=TESTS, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert "trio-jobs-check[pay]" in done.stdout
    assert "reproduce: trio-jobs check check_apps.double --seeds 1 --job pay --example 0" in (
        done.stdout
    )
