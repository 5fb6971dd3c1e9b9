"""``trio_jobs.web.serve``: the dashboard served by Hypercorn's Trio worker, on
the facade's own loop, hit by a real HTTP client (httpx, in a thread).

The PostgreSQL run is the one that matters: the driver must only ever be
called from Trio, and under Hypercorn's Trio worker it is."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

import httpx
import psycopg
import pytest
import trio
from seed import ALL, SECRET, seed

from trio_jobs import ErrorCode, Jobs, JobsError, Worker, memory_driver, open_jobs
from trio_jobs.web import PrometheusObserver, serve
from trio_jobs.web._security import is_loopback_host

T = TypeVar("T")


async def in_thread(fn: Callable[[], T]) -> T:
    return await trio.to_thread.run_sync(fn)


async def served(jobs: Jobs, nursery: trio.Nursery, **options: Any) -> str:
    urls = await nursery.start(
        lambda task_status: serve(jobs, "127.0.0.1", 0, task_status=task_status, **options)
    )
    return str(urls[0])


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "10.0.0.1", "dash.example"])
async def test_a_non_loopback_host_without_an_auth_hook_is_refused(host: str) -> None:
    async with open_jobs(memory_driver(), jobs=ALL) as jobs:
        with pytest.raises(JobsError) as caught:
            await serve(jobs, host, 0)
    assert caught.value.code == ErrorCode.X_CONFIG_INVALID
    assert "auth" in caught.value.message


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.0.1", False),
        ("example.com", False),
    ],
)
def test_which_hosts_are_loopback(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


async def test_served_under_hypercorns_trio_worker_end_to_end() -> None:
    async with open_jobs(memory_driver(), jobs=ALL) as jobs:
        world = await seed(jobs)
        async with trio.open_nursery() as nursery:
            base = await served(jobs, nursery)

            def visit() -> dict[str, Any]:
                out: dict[str, Any] = {}
                with httpx.Client(base_url=base, follow_redirects=False, timeout=10) as http:
                    home = http.get("/")
                    out["home"] = (home.status_code, home.headers.get("location"))
                    overview = http.get("/admin/jobs/")
                    out["overview"] = overview.status_code
                    out["cookie"] = "trio_jobs_csrf" in http.cookies
                    page = http.get(f"/admin/jobs/{world.charge}")
                    out["redacted"] = SECRET not in page.text and "[redacted]" in page.text
                    token = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
                    assert token is not None
                    out["no_token"] = http.post(f"/admin/jobs/{world.charge}/retry").status_code
                    done = http.post(
                        f"/admin/jobs/{world.charge}/retry", data={"csrf": token.group(1)}
                    )
                    out["retry"] = (done.status_code, done.headers.get("location"))
                    metrics = http.get("/metrics")
                    out["metrics"] = (metrics.status_code, metrics.headers["content-type"])
                    out["metrics_text"] = metrics.text
                    out["mounted_metrics"] = http.get("/admin/jobs/metrics").status_code
                return out

            got = await in_thread(visit)
            nursery.cancel_scope.cancel()
        state = (await jobs.show(world.charge)).state
    assert got["home"] == (307, "/admin/jobs/")
    assert got["overview"] == 200
    assert got["cookie"]
    assert got["redacted"]
    assert got["no_token"] == 403
    assert got["retry"] == (303, f"/admin/jobs/{world.charge}?ok=retried")
    assert state == "ready"
    assert got["metrics"][0] == 200
    assert got["metrics"][1].startswith("text/plain")
    assert 'queue_depth{queue="default"} 1.0' in got["metrics_text"]
    assert got["mounted_metrics"] == 200


# --------------------------------------------------------------------------- PostgreSQL


@pytest.fixture
def pg_schema() -> Iterator[tuple[str, str]]:
    dsn = os.environ.get("DATABASE_URL")
    if not dsn:
        pytest.skip("set DATABASE_URL to run the dashboard against PostgreSQL")
    name = f"tj_web_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    try:
        yield dsn, name
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{name}" CASCADE')


@pytest.fixture
async def pg_jobs(pg_schema: tuple[str, str]) -> AsyncIterator[Jobs]:
    from trio_jobs.drivers.postgres import postgres_driver

    dsn, schema = pg_schema
    async with open_jobs(postgres_driver(dsn, schema=schema), jobs=ALL) as jobs:
        yield jobs


@pytest.mark.postgres
async def test_on_postgres_pages_actions_and_metrics_run_on_trio(pg_jobs: Jobs) -> None:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    jobs = pg_jobs
    world = await seed(jobs)
    async with trio.open_nursery() as nursery:
        worker = Worker(jobs, queues=["emails"], observer=PrometheusObserver(registry))
        await nursery.start(worker.run)
        base = await served(jobs, nursery)

        def visit() -> dict[str, Any]:
            out: dict[str, Any] = {}
            with httpx.Client(base_url=base, timeout=20) as http:
                out["overview"] = http.get("/admin/jobs/").text
                out["list"] = http.get("/admin/jobs/jobs", params={"state": "dead"}).text
                page = http.get(f"/admin/jobs/{world.welcomes[0]}")
                out["page"] = page.text
                token = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
                assert token is not None
                token_value = token.group(1)
                paused = http.post(
                    "/admin/jobs/queues/pause",
                    data={"csrf": token_value, "queue": "emails"},
                    follow_redirects=False,
                )
                out["pause"] = paused.status_code
                out["metrics"] = http.get("/metrics").text
            return out

        got = await in_thread(visit)
        paused = await jobs.paused_queues()
        await worker.drain()
        nursery.cancel_scope.cancel()
    assert "emails" in got["overview"]
    assert "billing" in got["overview"]
    assert "X_CARD_DECLINED" in got["list"]
    assert "<b>render</b>" in got["page"]
    assert "m-user0" in got["page"]
    assert got["pause"] == 303
    assert paused == ["emails"]
    assert 'queue_paused{queue="emails"} 1.0' in got["metrics"]
    assert 'queue_jobs{queue="billing",state="dead"} 1.0' in got["metrics"]
