"""PYTHON-API.md "Outbound webhooks — webhook()" and Jobs-And-Workflows.md's
table, against a real HTTP server on 127.0.0.1 (``receiver.py``), on the memory
driver, in real time: the signature and headers, each answer's code, the
Retry-After wait, no redirect followed, the timeout, disable-after-N through the
ledger, and nothing sent to a refused endpoint."""

from __future__ import annotations

import hashlib
import hmac
import logging

import orjson
import pytest

from trio_jobs import (
    ErrorCode,
    JobsError,
    Retry,
    WebhookDelivery,
    memory_webhook_ledger,
    verify_webhook_signature,
)

from .receiver import open_receiver
from .support import SECRET, App, make, running, settle


async def test_a_2xx_delivers_once_signed_with_the_pinned_headers() -> None:
    app = App()
    async with open_receiver() as rx:
        app.add("e1", rx.url("/ok"))
        app.publish("ev1", "orders.paid", {"order": 42, "total": "9.00"})
        deliver = make(app)
        async with running(deliver) as jobs:
            queued = await deliver.enqueue(WebhookDelivery("e1", "ev1"))
            view = await settle(jobs, queued.id)
        assert view.state == "done"
        assert view.result == {"status": 200}
        [seen] = rx.to("/ok")
    assert seen.method == "POST"
    assert seen.body == orjson.dumps({"order": 42, "total": "9.00"})
    assert seen.headers["content-type"] == "application/json"
    assert seen.headers["x-webhook-id"] == "ev1"
    assert seen.headers["x-webhook-topic"] == "orders.paid"
    sig = seen.headers["x-webhook-signature"]
    t, v1 = sig.split(",")
    assert t.startswith("t=")
    assert v1.startswith("v1=")
    expected = hmac.new(
        SECRET.encode(), f"v1:{t[2:]}:ev1:orders.paid:".encode() + seen.body, hashlib.sha256
    ).hexdigest()
    assert v1[3:] == expected
    # The receiving half accepts it, and answers the signed event id.
    assert verify_webhook_signature(seen.headers, seen.body, secret=SECRET) == "ev1"
    attempts = await deliver.ledger.attempts()
    assert [(a.endpoint_id, a.event_id, a.attempt, a.status, a.code) for a in attempts] == [
        ("e1", "ev1", 1, 200, None)
    ]
    assert attempts[0].duration_ms >= 0


async def test_the_key_is_webhook_endpoint_event_and_a_second_enqueue_dedupes() -> None:
    app = App()
    deliver = make(app)
    assert deliver.kind == "webhook"
    assert deliver.idempotency_key_for(WebhookDelivery("e1", "ev1")) == "webhook:e1:ev1"
    async with open_receiver() as rx:
        app.add("e1", rx.url("/slow"))
        app.publish("ev1")
        async with running(make(app, name="other")) as jobs:
            del jobs
        from trio_jobs import open_jobs
        from trio_jobs.drivers.memory import memory_driver

        async with open_jobs(memory_driver(), jobs=[deliver]):
            first = await deliver.enqueue(WebhookDelivery("e1", "ev1"))
            again = await deliver.enqueue(WebhookDelivery("e1", "ev1"))
    assert not first.deduped
    assert again.deduped
    assert again.id == first.id


@pytest.mark.parametrize(
    ("path", "body"),
    [("/ok", b"raw bytes \x00\xff"), ("/created", "plain text, sent as it is")],
)
async def test_bytes_and_str_bodies_are_sent_as_they_are(path: str, body: object) -> None:
    app = App()
    async with open_receiver() as rx:
        app.add("e1", rx.url(path))
        app.publish("ev1", body=body)
        deliver = make(app)
        async with running(deliver) as jobs:
            view = await settle(jobs, (await deliver.enqueue(WebhookDelivery("e1", "ev1"))).id)
        assert view.state == "done"
        [seen] = rx.to(path)
    raw = body if isinstance(body, bytes) else body.encode()  # type: ignore[union-attr]
    assert seen.body == raw
    verify_webhook_signature(seen.headers, raw, secret=SECRET)


async def test_the_endpoint_and_event_are_read_per_attempt_and_never_checkpointed() -> None:
    app = App()
    async with open_receiver() as rx:
        app.add("e1", rx.url("/flaky/2"))
        app.publish("ev1")
        deliver = make(app)
        async with running(deliver) as jobs:
            queued = await deliver.enqueue(WebhookDelivery("e1", "ev1"))
            view = await settle(jobs, queued.id)
        assert view.state == "done"
        assert view.attempts == 3
        assert len(rx.to("/flaky/2")) == 3
    assert app.endpoint_reads == 3
    assert app.event_reads == 3
    assert (
        list(view.steps) == []
    )  # nothing stored: the secret and the body stay in the app's tables
    codes = [(a.attempt, a.status, a.code) for a in await deliver.ledger.attempts()]
    assert codes == [
        (1, 500, ErrorCode.X_WEBHOOK_DELIVERY_FAILED),
        (2, 500, ErrorCode.X_WEBHOOK_DELIVERY_FAILED),
        (3, 200, None),
    ]


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/fail", 500, ErrorCode.X_WEBHOOK_DELIVERY_FAILED),
        ("/reject", 400, ErrorCode.X_WEBHOOK_DELIVERY_REJECTED),
        ("/gone", 410, ErrorCode.X_WEBHOOK_DELIVERY_REJECTED),
        ("/redirect", 302, ErrorCode.X_WEBHOOK_DELIVERY_REJECTED),
        ("/throttle-bare", 429, ErrorCode.X_WEBHOOK_DELIVERY_REJECTED),
        ("/busy-bare", 503, ErrorCode.X_WEBHOOK_DELIVERY_FAILED),
        ("/nowhere", 404, ErrorCode.X_WEBHOOK_DELIVERY_REJECTED),
    ],
)
async def test_each_answer_is_classified_and_retried(
    path: str, status: int, code: ErrorCode
) -> None:
    app = App()
    async with open_receiver() as rx:
        app.add("e1", rx.url(path))
        app.publish("ev1")
        deliver = make(app, retry=Retry(attempts=2, base="10ms", jitter=False))
        async with running(deliver) as jobs:
            view = await settle(jobs, (await deliver.enqueue(WebhookDelivery("e1", "ev1"))).id)
        assert view.state == "dead"
        assert view.error_code == code
        assert view.attempts == 2  # both are retried: the attempts were spent
        assert len(rx.to(path)) == 2
        assert rx.to("/ok") == []  # a redirect is never followed
    assert [a.status for a in await deliver.ledger.attempts()] == [status, status]


@pytest.mark.parametrize("path", ["/throttle", "/busy"])
async def test_retry_after_is_honoured_as_throttled(path: str) -> None:
    app = App()
    async with open_receiver() as rx:
        app.add("e1", rx.url(path))
        app.publish("ev1")
        # max_delay clamps the receiver's 2-3 s so the test does not wait it out.
        deliver = make(app, retry=Retry(attempts=2, base="10ms", max_delay="20ms", jitter=False))
        async with running(deliver) as jobs:
            view = await settle(jobs, (await deliver.enqueue(WebhookDelivery("e1", "ev1"))).id)
    assert view.error_code == ErrorCode.X_WEBHOOK_DELIVERY_THROTTLED
    assert view.attempts == 2
    [first, _] = await deliver.ledger.attempts()
    assert first.code == ErrorCode.X_WEBHOOK_DELIVERY_THROTTLED


async def test_throttled_carries_retry_after_seconds_in_its_meta() -> None:
    from trio_jobs._webhook import retry_after_seconds

    # delta-seconds; an HTTP-date against the answer's own Date; 0 and the past are unstated
    assert retry_after_seconds("7", None, 1_000.0) == 7.0
    assert (
        retry_after_seconds(
            "Wed, 21 Oct 2015 07:28:03 GMT", "Wed, 21 Oct 2015 07:28:00 GMT", 99_999_999_999.0
        )
        == 3.0
    )
    assert retry_after_seconds("0", None, 0.0) is None
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", None, 2_000_000_000.0) is None
    assert retry_after_seconds("soon", None, 0.0) is None
    assert retry_after_seconds(None, None, 0.0) is None
    app = App()
    deliver = make(app)
    spec = deliver.run.__closure__[0].cell_contents  # the declaration the body closes over
    with pytest.raises(Exception) as caught:
        spec._classify("e1", 429, "7", None, 0.0)
    error = caught.value.error  # type: ignore[attr-defined]
    assert error.code == ErrorCode.X_WEBHOOK_DELIVERY_THROTTLED
    assert error.meta["retry_after_seconds"] == 7.0
    assert error.retry_class == "retry-after"


async def test_the_timeout_bounds_the_attempt_and_is_a_failed_delivery() -> None:
    app = App()
    async with open_receiver() as rx:
        app.add("e1", rx.url("/slow"))
        app.publish("ev1")
        deliver = make(app, timeout="200ms", retry=Retry(attempts=1))
        assert deliver.timeout == pytest.approx(0.2 + 10.0)  # plus the ledger write's budget
        async with running(deliver) as jobs:
            view = await settle(jobs, (await deliver.enqueue(WebhookDelivery("e1", "ev1"))).id)
    assert view.state == "dead"
    assert view.error_code == ErrorCode.X_WEBHOOK_DELIVERY_FAILED
    assert "timeout" in (view.last_error or "")
    [attempt] = await deliver.ledger.attempts()
    assert (attempt.status, attempt.code) == (None, ErrorCode.X_WEBHOOK_DELIVERY_FAILED)


async def test_a_connection_refused_is_a_failed_delivery() -> None:
    app = App()
    async with open_receiver() as rx:
        port = rx.port
    app.add("e1", f"http://127.0.0.1:{port}/ok")  # the server is gone
    app.publish("ev1")
    deliver = make(app, retry=Retry(attempts=1))
    async with running(deliver) as jobs:
        view = await settle(jobs, (await deliver.enqueue(WebhookDelivery("e1", "ev1"))).id)
    assert view.error_code == ErrorCode.X_WEBHOOK_DELIVERY_FAILED
    [attempt] = await deliver.ledger.attempts()
    assert attempt.status is None


async def test_disable_after_n_consecutive_failures_then_nothing_is_sent() -> None:
    app = App()
    async with open_receiver() as rx:
        app.add("e1", rx.url("/fail"))
        for i in range(4):
            app.publish(f"ev{i}")
        ledger = memory_webhook_ledger()
        deliver = make(app, ledger=ledger, disable_after=3, retry=Retry(attempts=1))
        async with running(deliver) as jobs:
            views = []
            for i in range(4):
                queued = await deliver.enqueue(WebhookDelivery("e1", f"ev{i}"))
                views.append(await settle(jobs, queued.id))
            assert [v.error_code for v in views] == [
                ErrorCode.X_WEBHOOK_DELIVERY_FAILED,
                ErrorCode.X_WEBHOOK_DELIVERY_FAILED,
                ErrorCode.X_WEBHOOK_DELIVERY_FAILED,
                ErrorCode.X_WEBHOOK_ENDPOINT_DISABLED,
            ]
            assert "now disabled" in (views[2].last_error or "")
            assert len(rx.to("/fail")) == 3  # the fourth sent nothing
            assert await ledger.is_disabled("e1")
            [state] = await ledger.endpoints()
            assert (state.consecutive_failures, state.disabled) == (3, True)
            # Terminal: a disabled endpoint does not spend the delivery's attempts.
            assert views[3].attempts == 1
            # Re-enabling is the app's; then a delivery goes out again.
            await ledger.enable("e1")
            app.add("e1", rx.url("/ok"))
            queued = await deliver.enqueue(WebhookDelivery("e1", "ev-after"))
            app.publish("ev-after")
            view = await settle(jobs, queued.id)
        assert view.state == "done"
        [state] = await ledger.endpoints()
        assert (state.consecutive_failures, state.disabled) == (0, False)
    last = (await ledger.attempts(event_id="ev3"))[0]
    assert (last.status, last.code) == (None, ErrorCode.X_WEBHOOK_ENDPOINT_DISABLED)


async def test_a_2xx_resets_the_consecutive_count() -> None:
    app = App()
    async with open_receiver() as rx:
        app.add("e1", rx.url("/flaky/2"))
        app.publish("ev1")
        deliver = make(app, disable_after=3)
        async with running(deliver) as jobs:
            view = await settle(jobs, (await deliver.enqueue(WebhookDelivery("e1", "ev1"))).id)
        assert view.state == "done"
    [state] = await deliver.ledger.endpoints()
    assert state.consecutive_failures == 0
    assert not state.disabled


async def test_an_endpoint_the_app_disabled_is_sent_nothing() -> None:
    app = App()
    async with open_receiver() as rx:
        app.add("e1", rx.url("/ok"), enabled=False)
        app.publish("ev1")
        deliver = make(app)
        async with running(deliver) as jobs:
            view = await settle(jobs, (await deliver.enqueue(WebhookDelivery("e1", "ev1"))).id)
        assert rx.requests == []
    assert view.state == "dead"
    assert view.attempts == 1
    assert view.error_code == ErrorCode.X_WEBHOOK_ENDPOINT_DISABLED


@pytest.mark.parametrize(
    ("setup", "code"),
    [
        ("no-endpoint", ErrorCode.X_WEBHOOK_ENDPOINT_UNKNOWN),
        ("no-event", ErrorCode.X_WEBHOOK_EVENT_UNKNOWN),
        ("endpoint-id", ErrorCode.X_WEBHOOK_ENDPOINT_INVALID),
        ("empty-secret", ErrorCode.X_WEBHOOK_ENDPOINT_INVALID),
        ("ftp", ErrorCode.X_WEBHOOK_ENDPOINT_INVALID),
        ("credentials", ErrorCode.X_WEBHOOK_ENDPOINT_INVALID),
        ("not-an-endpoint", ErrorCode.X_WEBHOOK_ENDPOINT_INVALID),
        ("event-id", ErrorCode.X_WEBHOOK_EVENT_INVALID),
        ("colon-topic", ErrorCode.X_WEBHOOK_EVENT_INVALID),
        ("unserializable", ErrorCode.X_WEBHOOK_EVENT_INVALID),
        ("not-an-event", ErrorCode.X_WEBHOOK_EVENT_INVALID),
    ],
)
async def test_refusals_are_terminal_recorded_and_send_nothing(setup: str, code: str) -> None:
    from trio_jobs import Endpoint, WebhookEvent

    app = App()
    async with open_receiver() as rx:
        app.add("e1", rx.url("/ok"))
        app.publish("ev1")
        if setup == "no-endpoint":
            del app.endpoints["e1"]
        elif setup == "no-event":
            del app.events["ev1"]
        elif setup == "endpoint-id":
            app.endpoints["e1"] = Endpoint("e2", rx.url("/ok"), SECRET)
        elif setup == "empty-secret":
            app.endpoints["e1"] = Endpoint("e1", rx.url("/ok"), "")
        elif setup == "ftp":
            app.endpoints["e1"] = Endpoint("e1", f"ftp://127.0.0.1:{rx.port}/ok", SECRET)
        elif setup == "credentials":
            app.endpoints["e1"] = Endpoint("e1", f"http://u:p@127.0.0.1:{rx.port}/ok", SECRET)
        elif setup == "not-an-endpoint":
            app.endpoints["e1"] = {"url": rx.url("/ok")}  # type: ignore[assignment]
        elif setup == "event-id":
            app.events["ev1"] = WebhookEvent("ev2", "orders.paid", {})
        elif setup == "colon-topic":
            app.events["ev1"] = WebhookEvent("ev1", "orders:paid", {})
        elif setup == "unserializable":
            app.events["ev1"] = WebhookEvent("ev1", "orders.paid", {"at": object()})
        elif setup == "not-an-event":
            app.events["ev1"] = ("ev1", "orders.paid", {})  # type: ignore[assignment]
        deliver = make(app)
        async with running(deliver) as jobs:
            view = await settle(jobs, (await deliver.enqueue(WebhookDelivery("e1", "ev1"))).id)
        assert rx.requests == []
    assert view.state == "dead"
    assert view.attempts == 1  # terminal
    assert view.error_code == code
    [attempt] = await deliver.ledger.attempts()
    assert (attempt.status, attempt.code) == (None, code)


async def test_secrets_and_payload_values_never_reach_logs_or_errors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="trio_jobs")
    secret_body = {"card": "4242-SECRET-CARD"}
    app = App()
    async with open_receiver() as rx:
        app.add("e1", rx.url("/fail?token=URL-TOKEN-123"), secret="whsec_NEVER_LOGGED_abc")
        app.publish("ev1", body=secret_body)
        deliver = make(app, retry=Retry(attempts=2, base="10ms", jitter=False))
        async with running(deliver) as jobs:
            view = await settle(jobs, (await deliver.enqueue(WebhookDelivery("e1", "ev1"))).id)
            shown = repr(await jobs.show(view.id))
    text = caplog.text + (view.last_error or "") + shown + repr(app.endpoints) + repr(app.events)
    for needle in ("whsec_NEVER_LOGGED_abc", "4242-SECRET-CARD", "URL-TOKEN-123"):
        assert needle not in text


async def test_tenancy_an_org_webhook_needs_the_org_and_hands_it_to_both_seams() -> None:
    seen_orgs: list[str | None] = []
    app = App()

    def endpoint(d: WebhookDelivery) -> object:
        seen_orgs.append(d.org_id)
        return app.endpoint(d)

    async with open_receiver() as rx:
        app.add("e1", rx.url("/ok"))
        app.publish("ev1")
        deliver = make(app, tenant=lambda d: d.org_id, endpoint=endpoint)
        async with running(deliver) as jobs:
            # No org for an org-owned webhook: refused at the enqueue, nothing queued.
            with pytest.raises(JobsError) as refused:
                await deliver.enqueue(WebhookDelivery("e1", "ev1"))
            assert refused.value.code == ErrorCode.X_JOB_TENANT_MISMATCH
            assert (await jobs.list()).rows == []
            # A tenant_id= naming another org than the delivery's: refused too.
            with pytest.raises(JobsError) as other:
                await deliver.enqueue(
                    WebhookDelivery("e1", "ev1", org_id="acme"), tenant_id="globex"
                )
            assert other.value.code == ErrorCode.X_JOB_TENANT_MISMATCH
            queued = await deliver.enqueue(WebhookDelivery("e1", "ev1", org_id="acme"))
            view = await settle(jobs, queued.id)
        assert view.state == "done"
        assert view.tenant_id == "acme"
    assert seen_orgs == ["acme"]


async def test_tenancy_a_queued_row_naming_no_org_is_dead_on_attempt_one() -> None:
    """A row queued while the webhook was tenant='none' meets the org tenant."""
    from trio_jobs import open_jobs
    from trio_jobs.drivers.memory import memory_driver

    app = App()
    async with open_receiver() as rx:
        app.add("e1", rx.url("/ok"))
        app.publish("ev1")
        driver = memory_driver()
        before = make(app)
        async with open_jobs(driver, jobs=[before]):
            queued = await before.enqueue(WebhookDelivery("e1", "ev1"))
        after = make(app, tenant=lambda d: d.org_id)
        async with running(after, driver=driver) as jobs:
            view = await settle(jobs, queued.id)
        assert rx.requests == []
    assert view.state == "dead"
    assert view.attempts == 1
    assert view.error_code == ErrorCode.X_JOB_TENANT_MISMATCH
    assert app.endpoint_reads == 0  # refused before either seam read
