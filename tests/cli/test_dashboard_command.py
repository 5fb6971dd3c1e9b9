"""``trio-jobs dashboard`` and ``trio-jobs dev --serve``, through real subprocesses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from pg_schemas import throwaway_schema

pytest.importorskip("hypercorn", reason="the dashboard needs the web extra: pip install -e .[test]")


@pytest.fixture(scope="module")
def dsn() -> Iterator[str]:
    with throwaway_schema("tj_dash") as dsn:
        yield dsn


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}


def test_a_non_loopback_host_without_auth_is_refused(dsn: str) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trio_jobs.cli",
            "dashboard",
            "--host",
            "0.0.0.0",
            "--database-url",
            dsn,
        ],
        capture_output=True,
        timeout=60,
        env=_env(),
    )
    assert proc.returncode == 1
    assert b"X_CONFIG_INVALID" in proc.stderr
    assert dsn.encode() not in proc.stderr + proc.stdout


def test_the_dashboard_serves_pages_and_metrics_then_stops_on_sigint(dsn: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "trio_jobs.cli", "dashboard", "--port", "0", "--database-url", dsn],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        assert line.startswith("dashboard: http://127.0.0.1:"), line
        url = line.split()[1]
        with urllib.request.urlopen(url, timeout=10) as page:
            assert page.status == 200
            assert b"<html" in page.read().lower()
        metrics_url = url.replace("/admin/jobs/", "/metrics")
        with urllib.request.urlopen(metrics_url, timeout=10) as metrics:
            assert b"queue_depth" in metrics.read()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_dev_serve_keeps_the_worker_and_the_dashboard_up(dsn: str) -> None:
    port = 20000 + os.getpid() % 20000
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trio_jobs.cli",
            "dev",
            "--serve",
            "--port",
            str(port),
            "--database-url",
            dsn,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
    )
    try:
        deadline = time.monotonic() + 45
        status = None
        while time.monotonic() < deadline and status is None:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/admin/jobs/", timeout=5
                ) as page:
                    status = page.status
            except OSError:
                time.sleep(0.3)
        assert status == 200
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


AUTH_MODULE = """
def is_op(request):
    return request.headers.get("authorization") == "Bearer ops"
"""


def test_auth_resolves_a_module_from_the_current_folder(dsn: str, tmp_path: Path) -> None:
    """``--auth myauth:is_op`` run from the folder holding ``myauth.py``, as
    ``trio-jobs worker`` resolves its module. ``-P`` keeps Python from putting the
    folder on the path itself, as the ``trio-jobs`` console script does not."""
    (tmp_path / "myauth.py").write_text(AUTH_MODULE)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-P",
            "-m",
            "trio_jobs.cli",
            "dashboard",
            "--port",
            "0",
            "--auth",
            "myauth:is_op",
            "--database-url",
            dsn,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
        cwd=tmp_path,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        assert line.startswith("dashboard: http://127.0.0.1:"), line + _stderr(proc)
        url = line.split()[1]
        operator = urllib.request.Request(url, headers={"Authorization": "Bearer ops"})
        with urllib.request.urlopen(operator, timeout=10) as page:
            assert page.status == 200
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=10)
        assert refused.value.code == 403
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _stderr(proc: subprocess.Popen[bytes]) -> str:
    if proc.poll() is None:
        return ""
    assert proc.stderr is not None
    return proc.stderr.read().decode(errors="replace")


def test_allowed_host_needs_auth_and_a_well_formed_name(dsn: str) -> None:
    for extra in (
        ["--allowed-host", "ops.example.com"],
        ["--auth", "x:y", "--allowed-host", "a b"],
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "trio_jobs.cli", "dashboard", *extra, "--database-url", dsn],
            capture_output=True,
            timeout=60,
            env=_env(),
        )
        assert proc.returncode == 1, extra
        assert b"X_CONFIG_INVALID" in proc.stderr
        assert b"allowed_hosts" in proc.stderr
