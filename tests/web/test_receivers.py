"""PYTHON-API.md "Inbound webhooks — webhook_receiver()", the receiving side, over
real HTTP: a Hypercorn server (Trio worker) on 127.0.0.1 serving the app, hit by
httpx or by a raw socket (for the streaming cap), on the memory driver and on
PostgreSQL. Every refusal of the spec's tables is asserted with what it must
leave behind: nothing queued, nothing of the request in the response or the log.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, cast

import attrs
import httpx
import orjson
import psycopg
import pytest
import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve
from hypercorn.typing import ASGIFramework
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from pg_schemas import throwaway_schema
from trio_jobs import (
    Answer,
    ErrorCode,
    JobContext,
    Jobs,
    JobsError,
    ReceivedWebhook,
    Verified,
    Worker,
    open_jobs,
    verify_body_hmac,
    webhook_receiver,
)
from trio_jobs.drivers.memory import MemoryDriver
from trio_jobs.drivers.postgres import postgres_driver
from trio_jobs.errors import DriverError
from trio_jobs.web import create_app, mount_receivers, serve

SECRET = "whsec-current"
OLD_SECRET = "whsec-previous"
#: A value only the request body holds: it must never come back out.
CANARY = "canary-4c1f9e"
PATH = "/hooks/billing/{account}"
TOLERANCE = 300


def sign(body: bytes, secret: str = SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def event(event_id: Any = "evt_1", **extra: Any) -> bytes:
    return orjson.dumps({"id": event_id, "type": "invoice.paid", "note": CANARY, **extra})


def verify(inbound: Any) -> Verified | Answer:
    text = verify_body_hmac(
        inbound.body,
        secret=[SECRET, OLD_SECRET],
        given=inbound.headers.get("x-billing-signature"),
        prefix="sha256=",
    )
    data = orjson.loads(text)  # raises on a body that is not JSON: a 400, never echoed
    if data.get("type") == "ping":
        return Answer(200, "pong", {"content-type": "text/plain"})
    if data.get("type") == "stale":
        raise JobsError(ErrorCode.X_WEBHOOK_SIGNATURE_STALE, "the signature is too old")
    if data.get("type") == "raises":
        raise ValueError(f"could not read {text}")  # quotes the body: must not leak
    return Verified(event_id=data["id"], payload=data)


HANDLED: list[ReceivedWebhook] = []


async def handle_event(ctx: JobContext[ReceivedWebhook]) -> None:
    HANDLED.append(ctx.input)


def receiver(**options: Any) -> Any:
    options.setdefault("name", "billing.events")
    options.setdefault("path", PATH)
    options.setdefault("verify", verify)
    options.setdefault("handle", handle_event)
    return webhook_receiver(**options)


class FlakyMemory(MemoryDriver):
    """The memory driver, with its enqueue failing while ``down`` (a driver outage)."""

    down = False

    async def enqueue_many(self, requests: Sequence[Any]) -> Any:
        if self.down:
            raise DriverError(ErrorCode.X_DRIVER_UNAVAILABLE, "the queue is away")
        return await super().enqueue_many(requests)


@attrs.define
class Backend:
    """One driver under test: how to open a facade on it and how to take its
    enqueue down and bring it back."""

    name: str
    open: Callable[[Sequence[Any]], Any]
    outage: Callable[[bool], Any]
    dsn: str | None = None


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest) -> Any:
    if request.param == "memory":
        driver = FlakyMemory()

        def open_memory(handles: Sequence[Any]) -> Any:
            return open_jobs(driver, jobs=list(handles))

        async def memory_outage(down: bool) -> None:
            driver.down = down

        yield Backend("memory", open_memory, memory_outage)
        return
    with throwaway_schema("tj_hooks") as dsn:

        def open_pg(handles: Sequence[Any]) -> Any:
            return open_jobs(postgres_driver(dsn), jobs=list(handles))

        async def pg_outage(down: bool) -> None:
            # A real failure of the insert: the jobs table is gone while `down`.
            old, new = ("trio_jobs_jobs", "jobs_away") if down else ("jobs_away", "trio_jobs_jobs")

            def rename() -> None:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute(f"ALTER TABLE {old} RENAME TO {new}")

            await trio.to_thread.run_sync(rename)

        yield Backend("postgres", open_pg, pg_outage, dsn)


@asynccontextmanager
async def served(app: Any) -> AsyncIterator[str]:
    """``app`` served by Hypercorn's Trio worker on 127.0.0.1 (a free port)."""
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(
            lambda task_status: hypercorn_serve(
                cast(ASGIFramework, app), config, task_status=task_status
            )
        )
        try:
            yield str(urls[0])
        finally:
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def door(
    backend: Backend, *handles: Any, app: Callable[[Jobs], Any] = create_app
) -> AsyncIterator[tuple[Jobs, httpx.AsyncClient]]:
    handles = handles or (receiver(),)
    async with backend.open(handles) as jobs, served(app(jobs)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            yield jobs, http


async def post(http: httpx.AsyncClient, body: bytes, *, signed: bool = True, **headers: str) -> Any:
    if signed:
        headers.setdefault("x-billing-signature", sign(body))
    return await http.post("/hooks/billing/acme", content=body, headers=headers)


async def rows(jobs: Jobs) -> list[Any]:
    return list((await jobs.list(name="billing.events")).rows)


def no_echo(response: httpx.Response, caplog: pytest.LogCaptureFixture) -> None:
    assert CANARY not in response.text
    assert all(CANARY not in r.getMessage() for r in caplog.records)
    assert all(CANARY not in str(vars(r)) for r in caplog.records)


@pytest.fixture(autouse=True)
def _logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="trio_jobs")
    HANDLED.clear()


# --------------------------------------------------------------------------- the ack


async def test_a_verified_event_is_queued_then_acknowledged(backend: Backend) -> None:
    async with door(backend) as (jobs, http):
        body = event("evt_1")
        response = await post(http, body)
        assert response.status_code == 200
        assert response.json() == {"ok": True, "event_id": "evt_1", "deduped": False}
        assert response.headers["content-type"] == "application/json"
        [row] = await rows(jobs)
        assert row.idempotency_key == "evt_1"
        assert row.sensitive is True
        assert row.payload == {
            "event_id": "evt_1",
            "payload": orjson.loads(body),
            "params": {"account": "acme"},
        }
        view = await jobs.show(row.id)
        assert view.sensitive is True


async def test_a_redelivery_while_live_is_deduped_and_still_acknowledged(backend: Backend) -> None:
    async with door(backend) as (jobs, http):
        first = await post(http, event("evt_1"))
        again = await post(http, event("evt_1", retried=True))
        assert first.json()["deduped"] is False
        assert again.status_code == 200
        assert again.json() == {"ok": True, "event_id": "evt_1", "deduped": True}
        [row] = await rows(jobs)
        assert "retried" not in row.payload["payload"]  # the first payload wins


async def test_handle_runs_as_the_job_with_the_received_webhook(backend: Backend) -> None:
    async with door(backend) as (jobs, http):
        assert (await post(http, event("evt_9"))).status_code == 200
        [row] = await rows(jobs)
        async with trio.open_nursery() as nursery:
            worker = Worker(jobs, poll_interval="50ms")
            await nursery.start(worker.run)
            with trio.fail_after(20):
                while (await jobs.show(row.id)).state != "done":  # noqa: ASYNC110 - bounded
                    await trio.sleep(0.05)
            await worker.drain()
    [received] = HANDLED
    assert received == ReceivedWebhook("evt_9", orjson.loads(event("evt_9")), {"account": "acme"})


async def test_a_secret_being_rotated_out_still_verifies(backend: Backend) -> None:
    async with door(backend) as (jobs, http):
        body = event("evt_old")
        response = await post(http, body, **{"x-billing-signature": sign(body, OLD_SECRET)})
        assert response.status_code == 200
        assert len(await rows(jobs)) == 1


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "signature",
    [None, "", "sha256=", "sha256=00", "md5=abc", "sha256=zz", "sha256=" + "0" * 64],
)
async def test_a_bad_or_missing_signature_is_401_and_nothing_is_queued(
    backend: Backend, signature: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    async with door(backend) as (jobs, http):
        headers = {} if signature is None else {"x-billing-signature": signature}
        response = await post(http, event("evt_1"), signed=False, **headers)
        assert response.status_code == 401
        assert response.json()["code"] == "X_WEBHOOK_SIGNATURE_INVALID"
        assert response.json()["ok"] is False
        assert await rows(jobs) == []
        no_echo(response, caplog)


async def test_a_signature_under_a_foreign_secret_is_401(backend: Backend) -> None:
    async with door(backend) as (jobs, http):
        body = event("evt_1")
        response = await post(http, body, **{"x-billing-signature": sign(body, "not-ours")})
        assert response.status_code == 401
        assert await rows(jobs) == []


async def test_a_stale_signature_is_401_stale(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    async with door(backend) as (jobs, http):
        response = await post(http, event("evt_1", type="stale"))
        assert response.status_code == 401
        assert response.json()["code"] == "X_WEBHOOK_SIGNATURE_STALE"
        assert await rows(jobs) == []
        no_echo(response, caplog)


@pytest.mark.parametrize("body", [b"not json " + CANARY.encode(), event(type="raises")])
async def test_anything_else_verify_raises_is_400_without_echoing_the_body(
    backend: Backend, body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    async with door(backend) as (jobs, http):
        response = await post(http, body)
        assert response.status_code == 400
        assert response.json()["code"] == "X_WEBHOOK_INVALID"
        assert await rows(jobs) == []
        no_echo(response, caplog)
        [record] = [r for r in caplog.records if getattr(r, "event", "") == "jobs.webhook.refused"]
        assert record.code == "X_WEBHOOK_INVALID"  # type: ignore[attr-defined]
        assert record.cause in ("JSONDecodeError", "ValueError")  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "event_id",
    ["", "x" * 257, "évt-" + CANARY, "evt\n" + CANARY, "evt\x7f" + CANARY, 42, None],
)
async def test_an_event_id_outside_printable_ascii_is_422_never_echoed(
    backend: Backend, event_id: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async with door(backend) as (jobs, http):
        response = await post(http, event(event_id))
        assert response.status_code == 422
        assert response.json()["code"] == "X_WEBHOOK_EVENT_ID_INVALID"
        assert await rows(jobs) == []
        no_echo(response, caplog)


async def test_event_ids_at_the_bounds_are_queued(backend: Backend) -> None:
    async with door(backend) as (jobs, http):
        for event_id in ("x", "~" * 256, " spaced id "):
            response = await post(http, event(event_id))
            assert response.status_code == 200, event_id
        assert len(await rows(jobs)) == 3


async def test_a_declared_length_over_max_bytes_is_413_before_a_byte_is_read(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    async with door(backend, receiver(max_bytes=64)) as (jobs, http):
        body = event("evt_1", pad="y" * 100)
        response = await post(http, body)
        assert response.status_code == 413
        assert response.json()["code"] == "X_BODY_INVALID"
        assert "max_bytes (64 bytes)" in response.json()["message"]
        assert await rows(jobs) == []
        no_echo(response, caplog)
        at_cap = orjson.dumps({"id": "e"}).ljust(64)
        assert (await post(http, at_cap)).status_code == 200


async def _raw_exchange(base: str, head: bytes, chunks: Sequence[bytes]) -> bytes:
    """Send ``head`` and the chunks (chunked encoding, never terminated), then
    read the answer: the body is still open when it comes."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(head)
        for chunk in chunks:
            await stream.send_all(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        answer = b""
        with trio.fail_after(10):
            while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
                data = await stream.receive_some(65536)
                if not data:
                    break
                answer += data
    return answer


async def test_a_streamed_body_is_cut_at_max_bytes_while_it_is_still_arriving(
    backend: Backend,
) -> None:
    """No Content-Length: the door counts while reading and answers 413 the moment
    the body passes the cap, without waiting for (or reading) the rest."""
    seen: list[int] = []

    def counting(app: Any) -> Any:
        async def wrapped(scope: Any, receive: Any, send: Any) -> None:
            async def counted() -> Any:
                message = await receive()
                seen.append(len(message.get("body", b"")))
                return message

            await app(scope, counted, send)

        return wrapped

    async with (
        backend.open([receiver(max_bytes=1000)]) as jobs,
        served(counting(create_app(jobs))) as base,
    ):
        head = (
            b"POST /hooks/billing/acme HTTP/1.1\r\nhost: vendor.example\r\n"
            b"transfer-encoding: chunked\r\nx-billing-signature: sha256=00\r\n\r\n"
        )
        answer = await _raw_exchange(base, head, [b"a" * 400, b"b" * 400, b"c" * 400])
        status_line, _, rest = answer.partition(b"\r\n")
        assert status_line.split()[1] == b"413", answer
        assert b'"code":"X_BODY_INVALID"' in rest
        assert sum(seen) <= 1200
        assert list((await jobs.list()).rows) == []


async def test_verify_answering_an_answer_sends_it_and_queues_nothing(backend: Backend) -> None:
    async with door(backend) as (jobs, http):
        response = await post(http, event("evt_1", type="ping"))
        assert response.status_code == 200
        assert response.text == "pong"
        assert response.headers["content-type"] == "text/plain"
        assert await rows(jobs) == []


async def test_the_handshake_answers_get_and_without_one_there_is_no_get(
    backend: Backend,
) -> None:
    def handshake(inbound: Any) -> Answer:
        return Answer(200, inbound.headers.get("x-challenge", ""), {"content-type": "text/plain"})

    with_handshake = receiver(name="with.handshake", path="/hooks/shake", handshake=handshake)
    async with door(backend, receiver(), with_handshake) as (jobs, http):
        shaken = await http.get("/hooks/shake", headers={"x-challenge": "abc123"})
        assert shaken.status_code == 200
        assert shaken.text == "abc123"
        no_get = await http.get("/hooks/billing/acme")
        assert no_get.status_code == 405
        assert no_get.json()["ok"] is False
        assert no_get.headers["allow"] == "POST"
        assert list((await jobs.list()).rows) == []


async def test_a_handshake_that_raises_is_refused_like_verify(backend: Backend) -> None:
    def handshake(inbound: Any) -> Answer:
        raise JobsError(ErrorCode.X_WEBHOOK_SIGNATURE_INVALID, "unsigned challenge")

    async with door(backend, receiver(path="/hooks/shake", handshake=handshake)) as (_jobs, http):
        response = await http.get("/hooks/shake")
        assert response.status_code == 401
        assert response.json()["code"] == "X_WEBHOOK_SIGNATURE_INVALID"


async def test_an_enqueue_failure_is_503_retry_after_and_the_redelivery_lands(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    async with door(backend) as (jobs, http):
        await backend.outage(True)
        try:
            refused = await post(http, event("evt_1"))
        finally:
            await backend.outage(False)
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "30"
        assert refused.json()["code"] == "X_WEBHOOK_RECEIVER_UNAVAILABLE"
        no_echo(refused, caplog)
        failed = [r for r in caplog.records if getattr(r, "event", "") == "jobs.webhook.failed"]
        assert failed
        assert failed[0].levelno == logging.ERROR
        assert await rows(jobs) == []
        again = await post(http, event("evt_1"))
        assert again.status_code == 200
        assert again.json()["deduped"] is False
        assert len(await rows(jobs)) == 1


async def test_a_misconfigured_secret_is_500_so_the_vendor_redelivers(backend: Backend) -> None:
    def unset_secret(inbound: Any) -> Verified:
        verify_body_hmac(inbound.body, secret=[SECRET, ""], given="sha256=00", prefix="sha256=")
        raise AssertionError("unreachable")

    def answers_junk(inbound: Any) -> Any:
        return {"event_id": "evt_1"}

    async with door(
        backend,
        receiver(verify=unset_secret),
        receiver(name="junk", path="/hooks/junk", verify=answers_junk),
    ) as (jobs, http):
        response = await post(http, event("evt_1"))
        assert response.status_code == 500
        assert response.json()["code"] == "X_CONFIG_INVALID"
        junk = await http.post("/hooks/junk", content=b"{}")
        assert junk.status_code == 500
        assert junk.json()["code"] == "X_WEBHOOK_RECEIVER_INVALID"
        assert list((await jobs.list()).rows) == []


async def test_an_async_verify_is_awaited(backend: Backend) -> None:
    async def verify_later(inbound: Any) -> Verified:
        await trio.lowlevel.checkpoint()
        return verify(inbound)  # type: ignore[return-value]

    async with door(backend, receiver(verify=verify_later)) as (jobs, http):
        assert (await post(http, event("evt_a"))).status_code == 200
        assert len(await rows(jobs)) == 1


# --------------------------------------------------------------------------- public doors


async def test_the_dashboards_guards_do_not_apply_to_a_receiver(backend: Backend) -> None:
    """An auth hook refusing everyone, a foreign Host, a POST without CSRF: the
    dashboard refuses them all; the receiver takes the signed event."""

    def nobody(request: Any) -> bool:
        return False

    async with door(backend, app=lambda jobs: create_app(jobs, auth=nobody)) as (jobs, http):
        headers = {"host": "hooks.vendor-facing.example", "origin": "https://elsewhere.example"}
        accepted = await post(http, event("evt_1"), **headers)
        assert accepted.status_code == 200
        assert (await http.get("/jobs")).status_code == 403
        assert (await http.get("/jobs", headers={"host": "evil.example"})).status_code == 400
        assert len(await rows(jobs)) == 1


async def test_the_dashboards_own_routes_answer_first(backend: Backend) -> None:
    """A receiver whose path overlaps the dashboard's never takes its requests."""
    shadowed = receiver(name="shadowed", path="/queues/{action}")
    async with door(backend, shadowed) as (jobs, http):
        response = await http.post("/queues/pause", content=event("evt_1"))
        assert response.status_code == 403  # the dashboard's CSRF check, not the door
        body = event("evt_2")
        other = await http.post(
            "/queues/other", content=body, headers={"x-billing-signature": sign(body)}
        )
        assert other.status_code == 200
        assert [r.idempotency_key for r in (await jobs.list()).rows] == ["evt_2"]


async def test_serve_mounts_the_receivers_at_their_own_paths(backend: Backend) -> None:
    async with backend.open([receiver()]) as jobs, trio.open_nursery() as nursery:
        urls = await nursery.start(
            lambda task_status: serve(jobs, "127.0.0.1", 0, task_status=task_status)
        )
        async with httpx.AsyncClient(base_url=str(urls[0]), timeout=30) as http:
            response = await post(http, event("evt_1"), host="hooks.example")
            dashboard = await http.get("/admin/jobs/", headers={"host": "hooks.example"})
        nursery.cancel_scope.cancel()
        assert response.status_code == 200
        assert dashboard.status_code == 400
        assert len(await rows(jobs)) == 1


async def test_mount_receivers_serves_them_from_an_app_of_ones_own(backend: Backend) -> None:
    class DenyAll:
        """The app's own auth middleware: the receiver answers before it."""

        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                await PlainTextResponse("no", status_code=401)(scope, receive, send)
                return
            await self.app(scope, receive, send)

    def own_app(jobs: Jobs) -> Starlette:
        app = Starlette(
            routes=[Route("/", lambda request: PlainTextResponse("home"))],
            middleware=[Middleware(DenyAll)],
        )
        mount_receivers(app, jobs)
        return app

    async with door(backend, app=own_app) as (jobs, http):
        assert (await post(http, event("evt_1"))).status_code == 200
        assert (await http.get("/")).status_code == 401
        assert len(await rows(jobs)) == 1


async def test_create_app_mounted_under_a_prefix_serves_the_door_under_it(
    backend: Backend,
) -> None:
    from starlette.routing import Mount

    def mounted(jobs: Jobs) -> Starlette:
        return Starlette(routes=[Mount("/admin/jobs", create_app(jobs))])

    async with door(backend, app=mounted) as (jobs, http):
        body = event("evt_1")
        response = await http.post(
            "/admin/jobs/hooks/billing/acme",
            content=body,
            headers={"x-billing-signature": sign(body)},
        )
        assert response.status_code == 200
        [row] = await rows(jobs)
        assert row.payload["params"] == {"account": "acme"}


# --------------------------------------------------------------------------- redaction


async def test_the_stored_payload_is_redacted_in_the_dashboard_and_the_cli(
    backend: Backend,
) -> None:
    from asgi_client import AsgiClient
    from click.testing import CliRunner

    from trio_jobs.cli import main

    async with door(backend) as (jobs, http):
        assert (await post(http, event("evt_1"))).status_code == 200
        [row] = await rows(jobs)
        page = await AsgiClient(create_app(jobs)).get(f"/{row.id}")
        assert page.status == 200
        assert CANARY not in page.text
        assert "[redacted]" in page.text
        if backend.dsn is not None:
            dsn = backend.dsn

            def show() -> Any:
                return CliRunner().invoke(main, ["show", row.id, "--json", "--database-url", dsn])

            shown = await trio.to_thread.run_sync(show)
            assert shown.exit_code == 0, shown.output
            assert CANARY not in shown.output
            assert "[redacted]" in shown.output


async def test_two_receivers_on_one_path_are_refused_when_mounted(backend: Backend) -> None:
    async with backend.open(
        [receiver(), receiver(name="other", path="/hooks/billing/{org}")]
    ) as jobs:
        with pytest.raises(JobsError) as caught:
            create_app(jobs)
        assert caught.value.code == ErrorCode.X_WEBHOOK_RECEIVER_INVALID
        with pytest.raises(JobsError) as caught:
            mount_receivers(Starlette(), jobs)
        assert caught.value.code == ErrorCode.X_WEBHOOK_RECEIVER_INVALID


async def test_a_tenant_read_from_the_path_names_the_rows_org(backend: Backend) -> None:
    """``tenant`` is a function of the ReceivedWebhook: here the path's account.
    Dedupe is per tenant, as for any job."""
    hook = receiver(tenant=lambda received: received.params["account"])
    async with door(backend, hook) as (jobs, http):
        body = event("evt_1")
        for account in ("acme", "globex", "acme"):
            response = await http.post(
                f"/hooks/billing/{account}",
                content=body,
                headers={"x-billing-signature": sign(body)},
            )
            assert response.status_code == 200
        found = sorted((r.tenant_id, r.idempotency_key) for r in await rows(jobs))
        assert found == [("acme", "evt_1"), ("globex", "evt_1")]
