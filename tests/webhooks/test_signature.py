"""``verify_webhook_signature``: the receiving half of the signature webhook()
sends (timing-safe, secret rotation, the tolerance window), and the
declaration refusals of ``webhook()``."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_jobs import (
    ErrorCode,
    JobsError,
    WebhookDelivery,
    memory_webhook_ledger,
    verify_webhook_signature,
    webhook,
)
from trio_jobs._webhook_signature import ONE_SHOT_BYTES, signature_header

NOW = 1_800_000_000


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def now(self) -> float:
        return self.t


def signed(
    secret: str = "s3cret", body: bytes = b'{"a":1}', t: int = NOW, **over: str
) -> dict[str, str]:
    headers = {
        "x-webhook-id": "ev1",
        "x-webhook-topic": "orders.paid",
        "x-webhook-signature": signature_header(secret, t, "ev1", "orders.paid", body),
    }
    headers.update(over)
    return headers


def test_a_genuine_signature_verifies_and_answers_the_event_id() -> None:
    headers = signed()
    assert verify_webhook_signature(headers, b'{"a":1}', secret="s3cret", clock=Clock(NOW)) == "ev1"
    # Header names are case-insensitive; pairs work too; a str body is its UTF-8 bytes.
    upper = {k.upper(): v for k, v in headers.items()}
    assert verify_webhook_signature(upper, '{"a":1}', secret="s3cret", clock=Clock(NOW)) == "ev1"
    pairs = [(k.encode(), v.encode()) for k, v in headers.items()]
    assert verify_webhook_signature(pairs, b'{"a":1}', secret=b"s3cret", clock=Clock(NOW))


def test_the_mac_is_over_v1_t_id_topic_body() -> None:
    mac = hmac.new(b"k", b"v1:5:ev1:orders.paid:hello", hashlib.sha256).hexdigest()
    assert signature_header("k", 5, "ev1", "orders.paid", b"hello") == f"t=5,v1={mac}"


@pytest.mark.parametrize("size", [0, ONE_SHOT_BYTES, ONE_SHOT_BYTES + 1, 3 * ONE_SHOT_BYTES])
def test_the_one_shot_and_the_streaming_mac_agree_at_every_size(size: int) -> None:
    """A body up to ONE_SHOT_BYTES is signed in one call, a longer one streamed:
    both give the mac of the same bytes."""
    body = bytes(i % 251 for i in range(size))
    mac = hmac.new(b"k", b"v1:5:ev1:orders.paid:" + body, hashlib.sha256).hexdigest()
    assert signature_header(b"k", 5, "ev1", "orders.paid", body) == f"t=5,v1={mac}"


@pytest.mark.parametrize(
    "tamper",
    ["body", "id", "topic", "t", "secret", "missing", "malformed", "no-id", "uppercase-junk"],
)
def test_a_tampered_delivery_is_invalid(tamper: str) -> None:
    body = b'{"a":1}'
    headers = signed(body=body)
    secret = "s3cret"
    if tamper == "body":
        body = b'{"a":2}'
    elif tamper == "id":
        headers["x-webhook-id"] = "ev2"
    elif tamper == "topic":
        headers["x-webhook-topic"] = "orders.refunded"
    elif tamper == "t":
        sig = headers["x-webhook-signature"]
        headers["x-webhook-signature"] = sig.replace(f"t={NOW}", f"t={NOW + 1}")
    elif tamper == "secret":
        secret = "other"
    elif tamper == "missing":
        del headers["x-webhook-signature"]
    elif tamper == "malformed":
        headers["x-webhook-signature"] = "sha256=abc"
    elif tamper == "no-id":
        del headers["x-webhook-id"]
    elif tamper == "uppercase-junk":
        headers["x-webhook-signature"] += ",v2=zz"
    with pytest.raises(JobsError) as refused:
        verify_webhook_signature(headers, body, secret=secret, clock=Clock(NOW))
    assert refused.value.code == ErrorCode.X_WEBHOOK_SIGNATURE_INVALID
    text = str(refused.value) + repr(refused.value.meta)
    assert secret not in text
    assert headers.get("x-webhook-signature", "v1=")[-20:] not in text or tamper == "malformed"


def test_rotation_accepts_the_old_secret_and_the_new() -> None:
    for used in ("old-secret", "new-secret"):
        headers = signed(secret=used)
        assert verify_webhook_signature(
            headers, b'{"a":1}', secret=["new-secret", "old-secret"], clock=Clock(NOW)
        )
    with pytest.raises(JobsError):
        verify_webhook_signature(
            signed(secret="retired"),
            b'{"a":1}',
            secret=["new-secret", "old-secret"],
            clock=Clock(NOW),
        )


@pytest.mark.parametrize("offset", [301, -301, 86_400])
def test_outside_the_tolerance_is_stale(offset: int) -> None:
    with pytest.raises(JobsError) as stale:
        verify_webhook_signature(signed(), b'{"a":1}', secret="s3cret", clock=Clock(NOW + offset))
    assert stale.value.code == ErrorCode.X_WEBHOOK_SIGNATURE_STALE
    assert verify_webhook_signature(
        signed(), b'{"a":1}', secret="s3cret", tolerance="2d", clock=Clock(NOW + offset)
    )


@pytest.mark.parametrize("offset", [0, 300, -300])
def test_inside_the_tolerance_verifies(offset: int) -> None:
    assert verify_webhook_signature(
        signed(), b'{"a":1}', secret="s3cret", clock=Clock(NOW + offset)
    )


def test_a_forged_old_signature_is_invalid_not_stale() -> None:
    """A wrong mac is INVALID whatever its age: STALE is said only of a genuine one."""
    headers = signed(secret="wrong", t=NOW - 10_000)
    with pytest.raises(JobsError) as refused:
        verify_webhook_signature(headers, b'{"a":1}', secret="s3cret", clock=Clock(NOW))
    assert refused.value.code == ErrorCode.X_WEBHOOK_SIGNATURE_INVALID


@pytest.mark.parametrize("secret", ["", b"", [], ["ok", ""], None, 42])
def test_an_empty_or_bad_secret_is_config_invalid(secret: Any) -> None:
    with pytest.raises(JobsError) as refused:
        verify_webhook_signature(signed(), b'{"a":1}', secret=secret, clock=Clock(NOW))
    assert refused.value.code == ErrorCode.X_CONFIG_INVALID


@settings(max_examples=200, deadline=None)
@given(
    body=st.binary(max_size=512),
    secret=st.text(min_size=1, max_size=40),
    event_id=st.from_regex(r"[A-Za-z0-9_.\-]{1,40}", fullmatch=True),
)
def test_round_trip_any_body_and_secret(body: bytes, secret: str, event_id: str) -> None:
    headers = {
        "x-webhook-id": event_id,
        "x-webhook-topic": "t.opic",
        "x-webhook-signature": signature_header(secret, NOW, event_id, "t.opic", body),
    }
    assert verify_webhook_signature(headers, body, secret=secret, clock=Clock(NOW)) == event_id
    if body:
        flipped = bytes([body[0] ^ 1]) + body[1:]
        with pytest.raises(JobsError):
            verify_webhook_signature(headers, flipped, secret=secret, clock=Clock(NOW))


# --------------------------------------------------------------------------- declaration


def _fields(**over: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "name": "partner.webhooks",
        "tenant": "none",
        "endpoint": lambda d: None,
        "event": lambda d: None,
        "ledger": memory_webhook_ledger(),
    }
    fields.update(over)
    return fields


@pytest.mark.parametrize(
    ("over", "fault"),
    [
        ({"name": None}, "name= is required"),
        ({"name": ""}, "name must be"),
        ({"tenant": None}, "tenant= is required"),
        ({"tenant": "org"}, "tenant must be"),
        ({"endpoint": None}, "endpoint= is required"),
        ({"event": "events"}, "event must be a function"),
        ({"ledger": None}, "ledger= is required"),
        ({"ledger": {}}, "ledger must be a WebhookLedger"),
        ({"disable_after": 0}, "disable_after"),
        ({"disable_after": True}, "disable_after"),
        ({"timeout": "soon"}, "timeout"),
        ({"timeout": 0}, "timeout"),
        ({"allow_private": "yes"}, "allow_private"),
        ({"queue": "bad queue"}, "queue"),
        ({"fanout": True}, "unknown field"),
    ],
)
def test_a_bad_declaration_names_every_fault(over: dict[str, Any], fault: str) -> None:
    with pytest.raises(JobsError) as refused:
        webhook(**_fields(**over))
    assert refused.value.code == ErrorCode.X_JOB_DECLARATION_INVALID
    assert fault in refused.value.message


def test_faults_are_collected_together() -> None:
    with pytest.raises(JobsError) as refused:
        webhook(name=None, tenant=None, endpoint=None, event=None, ledger=None)
    assert len(refused.value.meta["faults"]) == 5


@pytest.mark.parametrize(
    "delivery",
    [
        WebhookDelivery("e:1", "ev1"),
        WebhookDelivery("e1", "ev:1"),
        WebhookDelivery("", "ev1"),
        WebhookDelivery("e1", "x" * 201),
        WebhookDelivery("e1", "ev\x001"),
    ],
)
async def test_a_delivery_whose_ids_cannot_form_the_key_is_refused_at_enqueue(
    delivery: WebhookDelivery,
) -> None:
    from trio_jobs import open_jobs
    from trio_jobs.drivers.memory import memory_driver

    deliver = webhook(**_fields())
    async with open_jobs(memory_driver(), jobs=[deliver]) as jobs:
        with pytest.raises(JobsError) as refused:
            await deliver.enqueue(delivery)
        assert refused.value.code == ErrorCode.X_JOB_INPUT_INVALID
        assert (await jobs.list()).rows == []


def test_describe_says_webhook() -> None:
    deliver = webhook(**_fields(timeout="3s"))
    row = deliver.describe()
    assert row["kind"] == "webhook"
    assert row["timeout"] == pytest.approx(13.0)
