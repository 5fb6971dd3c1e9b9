"""PYTHON-API.md "Inbound webhooks": what ``webhook_receiver()`` refuses when it is
declared (``X_WEBHOOK_RECEIVER_INVALID``), the handle it builds, the records
``verify`` answers, and ``verify_body_hmac`` (rotation, encodings, timing-safe
comparison, ``X_CONFIG_INVALID`` for an empty secret)."""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import trio_jobs._receiver as receiver_module
from trio_jobs import (
    DEFAULT_WEBHOOK_BODY_LIMIT,
    Answer,
    ErrorCode,
    JobsError,
    ReceivedWebhook,
    Retry,
    Verified,
    verify_body_hmac,
    webhook_receiver,
)
from trio_jobs._receiver import MAX_WEBHOOK_BODY_LIMIT, event_id_fault
from trio_jobs.errors import JobDeclarationError


def verify(inbound: Any) -> Verified:
    return Verified(event_id="e", payload=None)


async def handle(ctx: Any) -> None:
    return None


def declare(**options: Any) -> Any:
    options.setdefault("name", "billing.events")
    options.setdefault("path", "/hooks/billing/{account}")
    options.setdefault("verify", verify)
    options.setdefault("handle", handle)
    return webhook_receiver(**options)


def refused(**options: Any) -> list[str]:
    with pytest.raises(JobDeclarationError) as caught:
        declare(**options)
    assert caught.value.code == ErrorCode.X_WEBHOOK_RECEIVER_INVALID
    faults: list[str] = caught.value.meta["faults"]
    return faults


# --------------------------------------------------------------------------- the handle


def test_the_handle_is_a_sensitive_job_keyed_by_the_event_id() -> None:
    hook = declare(queue="hooks", retry=Retry(attempts=7))
    assert hook.kind == "webhook-receiver"
    assert hook.name == "billing.events"
    assert hook.input is ReceivedWebhook
    assert hook.sensitive is True
    assert hook.queue == "hooks"
    assert hook.retry.attempts == 7
    assert hook.path == "/hooks/billing/{account}"
    assert hook.max_bytes == DEFAULT_WEBHOOK_BODY_LIMIT == 1 << 20
    assert hook.handshake is None
    assert hook.idempotency_key_for(ReceivedWebhook("evt_1", {"a": 1})) == "evt_1"
    described = hook.describe()
    assert described["kind"] == "webhook-receiver"
    assert described["receiver"] == {
        "path": "/hooks/billing/{account}",
        "max_bytes": 1 << 20,
        "handshake": False,
    }


def test_a_tenant_function_reads_the_received_webhook() -> None:
    hook = declare(tenant=lambda r: r.params["account"])
    assert hook.tenant_of(ReceivedWebhook("e", None, {"account": "acme"})) == "acme"


def test_the_input_round_trips_through_its_stored_form() -> None:
    hook = declare()
    value = ReceivedWebhook("evt", {"nested": [1, "two", None]}, {"account": "a"})
    assert hook.parse(hook._payload(value)) == value


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "path",
    ["hooks/billing", "", "/", "/hooks/", "//hooks", "/hooks/../admin", "/a b", "/a?b=1", "/a#b"],
)
def test_a_relative_or_malformed_path_is_refused(path: str) -> None:
    assert any("path" in f for f in refused(path=path))


def test_a_path_naming_one_parameter_twice_is_refused() -> None:
    assert any("twice" in f for f in refused(path="/hooks/{a}/{a}"))


@pytest.mark.parametrize("path", ["/hooks/{a", "/hooks/{a}b", "/hooks/{1a}", "/hooks/{a:int}"])
def test_a_parameter_is_one_whole_segment_named_by_an_identifier(path: str) -> None:
    assert refused(path=path)


def test_a_missing_path_verify_handle_or_name_is_refused_all_at_once() -> None:
    with pytest.raises(JobDeclarationError) as caught:
        webhook_receiver()
    faults = caught.value.meta["faults"]
    assert caught.value.code == ErrorCode.X_WEBHOOK_RECEIVER_INVALID
    for field in ("name=", "path=", "verify=", "handle="):
        assert any(f.startswith(field) for f in faults), (field, faults)


@pytest.mark.parametrize("field", ["verify", "handle"])
def test_a_verify_or_handle_that_is_not_a_function_is_refused(field: str) -> None:
    assert any(field in f for f in refused(**{field: "not callable"}))


def test_a_non_callable_handshake_is_refused() -> None:
    assert any("handshake" in f for f in refused(handshake="GET ok"))


@pytest.mark.parametrize("max_bytes", [0, -1, True, 1.5, "1MiB", None, MAX_WEBHOOK_BODY_LIMIT + 1])
def test_a_bad_max_bytes_is_refused(max_bytes: Any) -> None:
    assert any("max_bytes" in f for f in refused(max_bytes=max_bytes))


def test_max_bytes_at_its_bounds_is_taken() -> None:
    assert declare(max_bytes=1).max_bytes == 1
    assert declare(max_bytes=MAX_WEBHOOK_BODY_LIMIT).max_bytes == MAX_WEBHOOK_BODY_LIMIT


def test_a_handle_of_the_wrong_shape_and_unknown_options_are_refused() -> None:
    def two(ctx: Any, extra: Any) -> None:
        return None

    assert any("exactly one argument" in f for f in refused(handle=two))
    faults = refused(sensitive=False, retry="twice")
    assert any("unknown field" in f and "sensitive" in f for f in faults)
    assert any("retry" in f for f in faults)


# --------------------------------------------------------------------------- records


def test_answer_takes_bytes_or_str_and_refuses_the_rest() -> None:
    assert Answer(200, "pong").body == b"pong"
    assert Answer(204).body == b""
    assert Answer(200, b"\x00", {"x-a": "b"}).headers == {"x-a": "b"}
    for bad in (
        {"status": 99},
        {"status": 600},
        {"status": True},
        {"status": 200, "body": 5},
        {"status": 200, "headers": {"x": 1}},
    ):
        with pytest.raises(JobsError) as caught:
            Answer(**bad)
        assert caught.value.code == ErrorCode.X_WEBHOOK_RECEIVER_INVALID


@given(
    st.text(
        alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=256
    )
)
def test_every_printable_ascii_id_up_to_256_is_an_event_id(event_id: str) -> None:
    assert event_id_fault(event_id) is None


@given(st.text(min_size=1, max_size=300))
def test_an_id_with_anything_else_is_refused_without_quoting_it(event_id: str) -> None:
    fault = event_id_fault(event_id)
    printable = all(0x20 <= ord(c) <= 0x7E for c in event_id) and len(event_id) <= 256
    assert (fault is None) == printable
    if fault is not None and len(event_id) > 3:
        assert event_id not in fault


# --------------------------------------------------------------------------- verify_body_hmac

BODY = b'{"id":"evt_1","amount":100}'


def mac(secret: str, body: bytes = BODY, algorithm: Any = hashlib.sha256) -> bytes:
    return hmac.new(secret.encode(), body, algorithm).digest()


def test_hex_with_a_prefix_answers_the_body_as_text() -> None:
    given_ = "sha256=" + mac("k").hex()
    assert verify_body_hmac(BODY, secret="k", given=given_, prefix="sha256=") == BODY.decode()
    assert verify_body_hmac(
        BODY, secret=b"k", given=given_.upper().replace("SHA256=", "sha256="), prefix="sha256="
    )


def test_base64_standard_and_urlsafe_and_other_hashes() -> None:
    digest = mac("k")
    assert verify_body_hmac(
        BODY, secret="k", given=base64.b64encode(digest).decode(), encoding="base64"
    )
    assert verify_body_hmac(
        BODY,
        secret="k",
        given=base64.urlsafe_b64encode(digest).decode().rstrip("="),
        encoding="base64",
    )
    sha1 = mac("k", algorithm=hashlib.sha1).hex()
    assert verify_body_hmac(BODY, secret="k", given=sha1, algorithm="sha1")
    with pytest.raises(JobsError) as caught:
        verify_body_hmac(BODY, secret="k", given=sha1)  # sha256 expected
    assert caught.value.code == ErrorCode.X_WEBHOOK_SIGNATURE_INVALID


def test_any_secret_of_a_rotation_list_verifies() -> None:
    for secret in ("new", "old"):
        assert verify_body_hmac(BODY, secret=["new", "old"], given=mac(secret).hex())
    with pytest.raises(JobsError) as caught:
        verify_body_hmac(BODY, secret=["new", "old"], given=mac("older").hex())
    assert caught.value.code == ErrorCode.X_WEBHOOK_SIGNATURE_INVALID


def test_message_is_what_the_mac_covers_when_it_is_not_the_body_alone() -> None:
    signed = b"1700000000." + BODY
    given_ = mac("k", signed).hex()
    assert verify_body_hmac(BODY, secret="k", given=given_, message=signed) == BODY.decode()
    with pytest.raises(JobsError):
        verify_body_hmac(BODY, secret="k", given=given_)


@pytest.mark.parametrize(
    "given_",
    [None, "", "   ", "sha1=" + "00" * 32, "sha256=nothex", "sha256=" + "00" * 32, "sha256=abc"],
)
def test_a_missing_malformed_or_wrong_signature_is_invalid_and_quotes_nothing(
    given_: str | None,
) -> None:
    with pytest.raises(JobsError) as caught:
        verify_body_hmac(BODY, secret="sekrit", given=given_, prefix="sha256=")
    assert caught.value.code == ErrorCode.X_WEBHOOK_SIGNATURE_INVALID
    assert "sekrit" not in caught.value.message
    assert "evt_1" not in caught.value.message
    if given_:
        assert given_.strip() not in caught.value.message or given_.strip() == ""


@pytest.mark.parametrize("secret", ["", b"", [], ["ok", ""], ["ok", None], None, 42])
def test_an_empty_or_unset_secret_is_a_config_error(secret: Any) -> None:
    with pytest.raises(JobsError) as caught:
        verify_body_hmac(BODY, secret=secret, given=mac("ok").hex())
    assert caught.value.code == ErrorCode.X_CONFIG_INVALID


def test_bad_options_are_config_errors() -> None:
    for options in ({"encoding": "base32"}, {"algorithm": "md5"}, {"prefix": 5}):
        with pytest.raises(JobsError) as caught:
            verify_body_hmac(BODY, secret="k", given="00", **options)
        assert caught.value.code == ErrorCode.X_CONFIG_INVALID


def test_a_signed_body_that_is_not_utf8_is_x_webhook_invalid() -> None:
    body = b"\xff\xfe"
    with pytest.raises(JobsError) as caught:
        verify_body_hmac(body, secret="k", given=mac("k", body).hex())
    assert caught.value.code == ErrorCode.X_WEBHOOK_INVALID


def test_the_comparison_is_timing_safe_against_every_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def recording(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(receiver_module.hmac, "compare_digest", recording)
    verify_body_hmac(BODY, secret=["a", "b", "c"], given=mac("a").hex())
    assert len(calls) == 3  # the match on the first secret does not stop the others
    assert all(given_ == mac("a") for _expected, given_ in calls)
