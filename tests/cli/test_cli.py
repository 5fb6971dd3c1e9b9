"""The ``trio-jobs`` command's refusals: each exits non-zero printing its ``X_*``
code, before touching a database, and never echoes a connection string."""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest
from click.testing import CliRunner

from trio_jobs.cli import main
from trio_jobs.cli._worker import load_jobs, parse_concurrency
from trio_jobs.errors import JobsError


@pytest.fixture
def cli() -> CliRunner:
    return CliRunner()


def test_the_subcommands_are_listed(cli: CliRunner) -> None:
    out = cli.invoke(main, ["--help"])
    assert out.exit_code == 0
    for name in ("dev", "migrate", "worker"):
        assert name in out.output


def test_python_dash_m_runs_the_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "trio_jobs.cli", "--help"], capture_output=True, timeout=30
    )
    assert out.returncode == 0
    assert b"Usage: trio-jobs" in out.stdout


def test_an_unparseable_database_url_is_refused_without_echoing_it(cli: CliRunner) -> None:
    out = cli.invoke(main, ["migrate", "--database-url", "secret=hunter2 ===", "--json"])
    assert out.exit_code == 1
    body = orjson.loads(out.output)
    assert body["error"]["code"] == "X_CONFIG_INVALID"
    assert "hunter2" not in out.output


def test_a_database_url_from_the_environment_is_checked_too(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", "pw=hunter2 ===")
    out = cli.invoke(main, ["migrate"])
    assert out.exit_code == 1
    assert out.output.startswith("X_CONFIG_INVALID: $DATABASE_URL does not parse")
    assert "hunter2" not in out.output


def test_an_unreachable_database_is_x_driver_unavailable(cli: CliRunner) -> None:
    url = "postgresql://someone:hunter2@127.0.0.1:1/nothing?connect_timeout=2"
    out = cli.invoke(main, ["migrate", "--json", "--database-url", url])
    assert out.exit_code == 1
    assert orjson.loads(out.output)["error"]["code"] == "X_DRIVER_UNAVAILABLE"
    assert "hunter2" not in out.output
    assert "someone" not in out.output


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("no_such_module_anywhere", "could not import"),
        ("trio_jobs.errors", "has no job at its top level"),
        ("trio_jobs.examples.onboarding:effects", "must be a job or a list of jobs"),
        ("trio_jobs.examples.onboarding:missing", "has no attribute"),
    ],
)
def test_a_worker_target_that_names_no_jobs_is_refused(
    cli: CliRunner, target: str, why: str
) -> None:
    out = cli.invoke(main, ["worker", target, "--database-url", "postgresql://127.0.0.1:1/x"])
    assert out.exit_code == 1
    assert out.output.startswith("X_CONFIG_INVALID: ")
    assert why in out.output


def test_a_worker_target_resolves_a_list_a_job_or_the_module() -> None:
    from trio_jobs.examples import onboarding

    assert load_jobs("trio_jobs.examples.onboarding:jobs") == onboarding.jobs
    assert load_jobs("trio_jobs.examples.onboarding:onboard_org") == [onboarding.onboard_org]
    assert load_jobs("trio_jobs.examples.onboarding") == [onboarding.onboard_org]


def test_concurrency_is_n_or_per_queue() -> None:
    assert parse_concurrency("4") == 4
    assert parse_concurrency("mail=2, default=8") == {"mail": 2, "default": 8}
    assert parse_concurrency(" 4 ") == 4
    # "1\x1f": str.strip() drops the control character, int() does not (found by
    # Hypothesis in test_cli_bad_input.py)
    for bad in ("x", "a=b", "=3", "a=1,b", "1\x1f", "\x1c2"):
        with pytest.raises(JobsError) as err:
            parse_concurrency(bad)
        assert err.value.code == "X_CONFIG_INVALID"


@pytest.mark.parametrize(
    ("flags", "code"),
    [
        (["--concurrency", "0"], "X_CONFIG_INVALID"),
        (["--concurrency", "mail=0"], "X_CONFIG_INVALID"),
        (["--visibility-timeout", "soon"], "X_CONFIG_INVALID"),
        (["--drain-timeout", "-1"], "X_CONFIG_INVALID"),
        (["--max-in-flight", "0"], "X_INVARIANT"),
        (["--rate-per-tenant", "0/1m"], "X_CONFIG_INVALID"),
        (["--rate-per-tenant", "10"], "X_CONFIG_INVALID"),
        (["--rate-per-tenant", "10/soon"], "X_CONFIG_INVALID"),
    ],
)
def test_worker_settings_are_refused_before_any_io(
    cli: CliRunner, flags: list[str], code: str
) -> None:
    # The database is unreachable: a refusal that waited for it would be X_DRIVER_UNAVAILABLE.
    out = cli.invoke(
        main,
        [
            "worker",
            "trio_jobs.examples.onboarding",
            *flags,
            "--database-url",
            "postgresql://127.0.0.1:1/x",
        ],
    )
    assert out.exit_code == 1
    assert out.output.startswith(f"{code}: "), out.output


def test_rate_per_tenant_reads_limit_slash_per() -> None:
    from trio_jobs.cli._worker import parse_rate

    assert parse_rate(None) is None
    assert parse_rate("10/1m") == (10, "1m")
    assert parse_rate(" 3 / 250ms ") == (3, "250ms")
    with pytest.raises(JobsError) as caught:
        parse_rate("-1/1m")
    assert "--rate-per-tenant is LIMIT/PER" in caught.value.message
