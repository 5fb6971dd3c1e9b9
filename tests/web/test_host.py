"""The dashboard answers only the ``Host`` names it should (issue 15: DNS rebinding).

A page on a rebinding domain (``evil.example`` resolving to 127.0.0.1) reaches a
loopback dashboard from the victim's browser as a loopback client; only its
``Host`` gives it away. Without an auth hook only ``localhost`` or a loopback
address on the served port is answered; with one, ``allowed_hosts`` names the
rest. A refused ``Host`` is a plain 400 before anything is read or written."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import attrs
import httpx
import pytest
import trio
from asgi_client import AsgiClient
from seed import ALL, World, seed

from trio_jobs import ErrorCode, Jobs, JobsError, memory_driver, open_jobs
from trio_jobs.web import create_app, serve, standalone_app

PORT = 8799


@attrs.define
class Site:
    jobs: Jobs
    world: World


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    async with open_jobs(memory_driver(), jobs=ALL) as jobs:
        yield Site(jobs, await seed(jobs))


def client(app: Any, host: str | None, **kw: Any) -> AsgiClient:
    return AsgiClient(app, host=host, server=("127.0.0.1", PORT), **kw)


async def test_the_rebinding_attack_is_refused_and_removes_nothing(site: Site) -> None:
    app = create_app(site.jobs)
    done_before = [v.id for v in (await site.jobs.list(state="done")).rows]
    assert len(done_before) == 3
    # The victim's own tab, on the real address, holds a cookie and a token...
    own = client(app, f"127.0.0.1:{PORT}")
    page = await own.get("/jobs?state=done")
    assert page.status == 200
    token = page.csrf()
    # ...and the attacker's page, served from evil.example (now resolving to
    # 127.0.0.1), is a loopback client too: its reads and its POST are refused.
    evil = client(app, f"evil.example:{PORT}")
    evil.cookies = dict(own.cookies)
    read = await evil.get("/jobs?state=done")
    assert read.status == 400
    assert read.headers["content-type"].startswith("text/plain")
    assert "localhost" in read.text
    assert 'name="csrf"' not in read.text
    assert "set-cookie" not in read.headers
    removed = await evil.post(
        "/bulk", {"csrf": token, "op": "remove", "state": "done"}, headers={"origin": "null"}
    )
    assert removed.status == 400
    assert [v.id for v in (await site.jobs.list(state="done")).rows] == done_before


@pytest.mark.parametrize(
    "host", [f"localhost:{PORT}", f"127.0.0.1:{PORT}", f"[::1]:{PORT}", f"127.9.9.9:{PORT}"]
)
async def test_loopback_names_on_the_served_port_are_served(site: Site, host: str) -> None:
    reply = await client(create_app(site.jobs), host).get("/")
    assert reply.status == 200, reply.text
    assert "Queues" in reply.text


@pytest.mark.parametrize(
    "host",
    [
        f"evil.example:{PORT}",
        "evil.example",
        f"localhost:{PORT + 1}",  # another port: not this server's address
        "localhost",  # port 80 implied
        f"localhost.evil.example:{PORT}",
        f"127.0.0.1.nip.io:{PORT}",
        f"0.0.0.0:{PORT}",
        f"192.168.1.20:{PORT}",
        f"[::ffff:10.0.0.1]:{PORT}",
        f"::1:{PORT}",  # an IPv6 literal without brackets
        f"localhost:{PORT}:1",
        f"localhost:{PORT}/x",
        "",
        None,
    ],
)
async def test_any_other_host_is_a_400(site: Site, host: str | None) -> None:
    reply = await client(create_app(site.jobs), host).get("/")
    assert reply.status == 400
    assert reply.headers["cache-control"] == "no-store"


async def test_two_host_headers_are_refused(site: Site) -> None:
    reply = await client(create_app(site.jobs), f"localhost:{PORT}").get(
        "/", headers={"host": f"evil.example:{PORT}"}
    )
    assert reply.status == 400


async def test_a_refused_host_is_answered_before_the_body_is_read(site: Site) -> None:
    app = create_app(site.jobs)
    reads = 0

    async def receive() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        return {"type": "http.request", "body": b"op=remove&state=done", "more_body": False}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/bulk",
        "raw_path": b"/bulk",
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"evil.example"),
            (b"content-type", b"application/x-www-form-urlencoded"),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 80),
    }
    await app(scope, receive, send)
    assert sent[0]["status"] == 400
    assert reads == 0


async def test_metrics_and_the_home_redirect_check_the_host_too(site: Site) -> None:
    app = standalone_app(site.jobs)
    good = client(app, f"localhost:{PORT}")
    assert (await good.get("/metrics")).status == 200
    assert (await good.get("/")).status == 307
    evil = client(app, f"evil.example:{PORT}")
    for path in ("/", "/metrics", "/admin/jobs/", "/admin/jobs/metrics"):
        assert (await evil.get(path)).status == 400, path


# --------------------------------------------------------------------------- allow-list


def is_operator(request: Any) -> bool:
    return bool(request.headers.get("authorization") == "Bearer ops")


OPS = {"authorization": "Bearer ops"}


async def test_with_an_auth_hook_and_no_list_only_loopback_names_are_served(site: Site) -> None:
    app = create_app(site.jobs, auth=is_operator)
    remote = ("203.0.113.7", 40000)
    assert (
        await client(app, f"localhost:{PORT}", client=remote).get("/", headers=OPS)
    ).status == 200
    outside = client(app, "ops.example.com", client=remote)
    assert (await outside.get("/", headers=OPS)).status == 400


async def test_the_allow_list_names_the_hosts_served(site: Site) -> None:
    app = create_app(
        site.jobs,
        auth=is_operator,
        allowed_hosts=["ops.example.com", "*.jobs.example.com", "10.0.0.5:8443", "[2001:db8::1]"],
    )
    remote = ("203.0.113.7", 40000)
    for host in (
        "ops.example.com",
        "OPS.example.com:443",
        f"ops.example.com:{PORT}",
        "eu.jobs.example.com",
        "10.0.0.5:8443",
        f"[2001:db8::1]:{PORT}",
    ):
        reply = await client(app, host, client=remote).get("/", headers=OPS)
        assert reply.status == 200, host
    for host in (
        "evil.example",
        "ops.example.com.evil.example",
        "jobs.example.com",  # "*.x" is the subdomains of x, not x
        "10.0.0.5:8444",
        f"localhost:{PORT}",  # a list replaces the loopback rule
    ):
        reply = await client(app, host, client=remote).get("/", headers=OPS)
        assert reply.status == 400, host
    # the hook still decides who, under an allowed name
    assert (await client(app, "ops.example.com", client=remote).get("/")).status == 403


async def test_star_allows_any_host_when_said_explicitly(site: Site) -> None:
    app = create_app(site.jobs, auth=is_operator, allowed_hosts=["*"])
    reply = await client(app, "anything.example:1234").get("/", headers=OPS)
    assert reply.status == 200


@pytest.mark.parametrize(
    "allowed",
    [
        "ops.example.com",  # a string, not a list
        [],
        ["http://ops.example.com"],
        ["ops.example.com/admin"],
        ["ops example.com"],
        ["ops.*.com"],
        ["*example.com"],
        [""],
        [None],
        ["ops.example.com:99999"],
    ],
)
async def test_a_bad_allow_list_is_refused_at_create_app(site: Site, allowed: Any) -> None:
    with pytest.raises(JobsError) as caught:
        create_app(site.jobs, auth=is_operator, allowed_hosts=allowed)
    assert caught.value.code == ErrorCode.X_CONFIG_INVALID


async def test_an_allow_list_without_an_auth_hook_is_refused(site: Site) -> None:
    with pytest.raises(JobsError) as caught:
        create_app(site.jobs, allowed_hosts=["ops.example.com"])
    assert caught.value.code == ErrorCode.X_CONFIG_INVALID
    assert "auth" in caught.value.message


async def test_served_by_hypercorn_the_served_port_is_the_bound_one(site: Site) -> None:
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(
            lambda task_status: serve(site.jobs, "127.0.0.1", 0, task_status=task_status)
        )
        base = str(urls[0])
        port = base.rsplit(":", 1)[1]

        def visit() -> tuple[int, int, int]:
            with httpx.Client(base_url=base, timeout=10) as http:
                ok = http.get("/admin/jobs/").status_code
                evil = http.get("/admin/jobs/", headers={"host": f"evil.example:{port}"})
                other_port = http.get("/admin/jobs/", headers={"host": "localhost:1"})
            return ok, evil.status_code, other_port.status_code

        got = await trio.to_thread.run_sync(visit)
        nursery.cancel_scope.cancel()
    assert got == (200, 400, 400)
