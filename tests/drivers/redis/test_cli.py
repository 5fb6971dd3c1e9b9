"""The CLI and the dashboard against Redis: a ``--database-url`` (or
``$DATABASE_URL``) whose scheme is ``redis://`` selects the Redis driver, and its
``?prefix=`` names the key prefix. Real subprocesses, a real server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from typing import Any

import attrs
import orjson
import pytest
import trio

from trio_jobs import JobContext, job, open_jobs, redis_driver
from trio_jobs.drivers import WorkerInfo

from .conftest import pytestmark as _skip_without_redis

pytestmark = _skip_without_redis


@attrs.frozen
class Order:
    key: str


@job(input=Order, tenant="none", idempotency_key=lambda o: o.key, name="redis.cli.order")
async def order(ctx: JobContext[Order]) -> None:
    return None


def _url(redis_url: str, prefix: str) -> str:
    return f"{redis_url}?prefix={prefix}"


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    base = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    return subprocess.run(
        [sys.executable, "-m", "trio_jobs.cli", *args],
        capture_output=True,
        timeout=60,
        env={**base, **(env or {})},
    )


def _json(proc: subprocess.CompletedProcess[bytes]) -> Any:
    assert proc.returncode == 0, proc.stderr.decode()
    return orjson.loads(proc.stdout)


def _seed(redis_url: str, prefix: str) -> list[str]:
    async def go() -> list[str]:
        async with open_jobs(redis_driver(redis_url, prefix=prefix), jobs=[order]) as jobs:
            now = await order.enqueue(Order("now"))
            later = await order.enqueue(Order("later"), delay=3600)
            intro = jobs.driver.introspect
            assert intro is not None
            await intro.record_worker(
                WorkerInfo(
                    id="w-cli",
                    host="cli-host",
                    pid=7,
                    started_at=jobs.driver.now(),
                    queues=["default"],
                    slots={"default": 2},
                ),
                600.0,
            )
            return [now.id, later.id]

    return trio.run(go)


def test_the_operator_commands_run_against_redis(redis_url: str, redis_prefix: str) -> None:
    now, later = _seed(redis_url, redis_prefix)
    url = _url(redis_url, redis_prefix)
    listed = _json(_cli("list", "--json", "--database-url", url))
    assert [r["id"] for r in listed["rows"]] == [later, now]
    shown = _json(_cli("show", later[:8], "--json", "--database-url", url))
    assert (shown["id"], shown["state"]) == (later, "delayed")
    # $DATABASE_URL selects it too.
    promoted = _json(_cli("promote", later, "--json", env={"DATABASE_URL": url}))
    assert promoted["job"]["state"] == "ready"
    cancelled = _json(_cli("cancel", now, "--reason", "test", "--json", "--database-url", url))
    assert cancelled["job"]["state"] == "cancelled"
    (queue,) = _json(_cli("stats", "--json", "--database-url", url))["queues"]
    assert (queue["queue"], queue["ready"], queue["cancelled"]) == ("default", 1, 1)
    workers = _json(_cli("workers", "--json", "--database-url", url))
    assert "w-cli" in orjson.dumps(workers).decode()
    migrated = _json(_cli("migrate", "--json", "--database-url", url))
    assert migrated["ok"] is True
    # Another prefix is another key space: nothing there.
    other = _json(_cli("list", "--json", "--database-url", _url(redis_url, redis_prefix + "-x")))
    assert other["rows"] == []


def test_a_redis_url_is_refused_where_postgresql_is_needed(redis_url: str) -> None:
    proc = _cli("dev", "--database-url", redis_url)
    assert proc.returncode == 1
    assert b"X_CONFIG_INVALID" in proc.stderr
    assert b"Redis" in proc.stderr
    bad = _cli("list", "--database-url", f"{redis_url}?prefix=a&prefix=b")
    assert bad.returncode == 1
    assert b"prefix" in bad.stderr


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("hypercorn") is None,
    reason="the dashboard needs the web extra: pip install -e .[test]",
)
def test_the_dashboard_serves_a_redis_driver(redis_url: str, redis_prefix: str) -> None:
    now, _later = _seed(redis_url, redis_prefix)
    base = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trio_jobs.cli",
            "dashboard",
            "--port",
            "0",
            "--database-url",
            _url(redis_url, redis_prefix),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=base,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        assert line.startswith("dashboard: http://127.0.0.1:"), line
        root = line.split()[1]
        with urllib.request.urlopen(root, timeout=10) as page:
            assert page.status == 200
        with urllib.request.urlopen(f"{root.rstrip('/')}/jobs", timeout=10) as page:
            assert now in page.read().decode()
        with urllib.request.urlopen(f"{root.rstrip('/')}/{now}", timeout=10) as page:
            body = page.read().decode()
        assert now in body
        assert "redis.cli.order" in body
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


WORKER_MODULE = """
import attrs
from trio_jobs import JobContext, job


@attrs.frozen
class Order:
    key: str


@job(input=Order, tenant="none", idempotency_key=lambda o: o.key, name="redis.cli.order")
async def order(ctx: JobContext[Order]) -> str:
    return "shipped " + ctx.input.key
"""


def test_trio_jobs_worker_serves_a_redis_queue(
    redis_url: str, redis_prefix: str, tmp_path: Any
) -> None:
    (tmp_path / "redis_cli_jobs.py").write_text(WORKER_MODULE)
    now, _later = _seed(redis_url, redis_prefix)
    base = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trio_jobs.cli",
            "worker",
            "redis_cli_jobs",
            "--database-url",
            _url(redis_url, redis_prefix),
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=base,
    )
    try:

        async def settled() -> Any:
            async with open_jobs(
                redis_driver(redis_url, prefix=redis_prefix), jobs=[order]
            ) as jobs:
                with trio.fail_after(30):
                    # another process settles it: polled, as an operator would
                    while (view := await jobs.show(now)).state != "done":  # noqa: ASYNC110
                        await trio.sleep(0.05)
                return view

        view = trio.run(settled)
        assert view.result == "shipped now"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
