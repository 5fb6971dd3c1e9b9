"""Errors: the code enum, JobsError, and the retry classification.

Spec: "Errors" (every ``X_*`` code of Jobs-And-Workflows.md is a member of one enum),
"Concurrency, rate limits, queues, retry" (``terminal`` and ``retry-after`` codes,
``registerErrorRetry``), PYTHON-API.md "Errors and retry classification", and
STYLE.md principle 6 (codes added, never renamed; pickle and JSON round trips).
"""

from __future__ import annotations

import json
import pickle
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from trio_jobs import ErrorCode, JobsError, register_error_retry
from trio_jobs import errors as errors_mod
from trio_jobs.errors import (
    DriverError,
    JobAbortedError,
    JobDeclarationError,
    retry_class_of,
)

SPEC_DIR = Path("/work/shared/spec")
if not SPEC_DIR.exists():  # a checkout beside ../shared
    SPEC_DIR = Path(__file__).resolve().parents[3] / "shared" / "spec"

#: The snapshot. Codes are ADDED to this list, never renamed or removed: a row that
#: is queued or dead-lettered carries its code, and an app's ``except`` or alert
#: rule matches on it.
SNAPSHOT = [
    "X_ABORTED",
    "X_BODY_INVALID",
    "X_CHILD_FAILED",
    "X_CHILD_TIMEOUT",
    "X_CONFIG_INVALID",
    "X_CONSUMER_INVALID",
    "X_CONSUMER_SELF_ENQUEUE",
    "X_DRAINING",
    "X_DRIVER_CONFLICT",
    "X_DRIVER_UNAVAILABLE",
    "X_FORBIDDEN",
    "X_IDEMPOTENCY_CONFLICT",
    "X_IDEMPOTENCY_REQUIRED",
    "X_ID_INVALID",
    "X_ID_AMBIGUOUS",  # an addition to the spec: a job id prefix matching several jobs
    "X_IMPORT_HEADER_MISMATCH",
    "X_IMPORT_RECORD_TOO_LARGE",
    "X_IMPORT_ROW_ENCODING",
    "X_IMPORT_ROW_INVALID",
    "X_IMPORT_ROW_MALFORMED",
    "X_IMPORT_SOURCE_CHANGED",
    "X_IMPORT_SOURCE_MISSING",
    "X_IMPORT_TOO_MANY_ERRORS",
    "X_INVARIANT",
    "X_JOB_COMPENSATION_FAILED",
    "X_JOB_CONCURRENCY_UNENFORCEABLE",
    "X_JOB_CRASH_DIVERGED",
    "X_JOB_DECLARATION_INVALID",
    "X_JOB_DUPLICATE",
    "X_JOB_ENQUEUE_BATCH_TOO_LARGE",
    "X_JOB_EVENT_INVALID",
    "X_JOB_INPUT_INVALID",
    "X_JOB_KEY_BUSY",
    "X_JOB_LEASE_LOST",
    "X_JOB_MAX_ATTEMPTS",
    "X_JOB_NONDETERMINISTIC",
    "X_JOB_NOT_CANCELLABLE",
    "X_JOB_NOT_FOUND",
    "X_JOB_NOT_REMOVABLE",
    "X_JOB_NOT_REQUEUEABLE",
    "X_JOB_ON_SETTLED_FAILED",
    "X_JOB_PAGE_INVALID",
    "X_JOB_REFRESH_VIEW_INVALID",
    "X_JOB_ROLLUP_INVALID",
    "X_JOB_SLOT_LOST",
    "X_JOB_TENANT_MISMATCH",
    "X_JOB_TIMEOUT",
    "X_NOT_IMPLEMENTED",
    "X_N_PLUS_ONE_WRITE",
    "X_RATE_LIMITED",
    "X_RATE_LIMIT_NOT_SHARED",
    "X_SIMULATION_INVARIANT",
    "X_STEP_DUPLICATE",
    "X_STEP_OUTCOME_UNKNOWN",
    "X_STEP_OUTPUT_UNSERIALIZABLE",
    "X_SUBJECT_CYCLE",
    "X_SUBJECT_ERASE_INCOMPLETE",
    "X_SUBJECT_TABLE_UNDECLARED",
    "X_SUBJECT_TREATMENT_INVALID",
    "X_TASK_NOT_FOUND",
    "X_WEBHOOK_DELIVERY_FAILED",
    "X_WEBHOOK_DELIVERY_REJECTED",
    "X_WEBHOOK_DELIVERY_THROTTLED",
    "X_WEBHOOK_ENDPOINT_DISABLED",
    "X_WEBHOOK_ENDPOINT_INVALID",
    "X_WEBHOOK_ENDPOINT_UNKNOWN",
    "X_WEBHOOK_EVENT_ID_INVALID",
    "X_WEBHOOK_EVENT_INVALID",
    "X_WEBHOOK_EVENT_UNKNOWN",
    "X_WEBHOOK_INVALID",
    "X_WEBHOOK_RECEIVER_INVALID",
    "X_WEBHOOK_RECEIVER_UNAVAILABLE",
    "X_WEBHOOK_SIGNATURE_INVALID",
    "X_WEBHOOK_SIGNATURE_STALE",
]

#: Codes the spec uses as an APP's own examples; they are not the library's.
APP_EXAMPLES = {"X_CARD_DECLINED", "X_VENDOR_BUSY", "X_YOUR_CODE"}

#: Every error an enqueue/worker/declaration family maps onto.
FAMILIES = {
    "X_JOB_DECLARATION_INVALID": JobDeclarationError,
    "X_IDEMPOTENCY_REQUIRED": JobDeclarationError,
    "X_ABORTED": JobAbortedError,
    "X_DRAINING": JobAbortedError,
    "X_JOB_TIMEOUT": JobAbortedError,
    "X_JOB_SLOT_LOST": JobAbortedError,
    "X_JOB_LEASE_LOST": JobAbortedError,
    "X_DRIVER_UNAVAILABLE": DriverError,
    "X_DRIVER_CONFLICT": DriverError,
}


@pytest.fixture(autouse=True)
def _clean_retry_registry() -> Iterator[None]:
    errors_mod._reset_error_retry_for_tests()
    yield
    errors_mod._reset_error_retry_for_tests()


def _spec_codes() -> set[str]:
    text = ""
    for name in ("Jobs-And-Workflows.md", "PYTHON-API.md"):
        text += (SPEC_DIR / name).read_text(encoding="utf-8")
    # `\b` keeps MAX_BULK_ROWS / MAX_ENQUEUE_BATCH / MAX_JOB_PAGE from reading as X_ codes;
    # the spec writes `X_WEBHOOK_SIGNATURE_INVALID` / `_STALE`, so expand that shorthand.
    codes = set(re.findall(r"\bX_[A-Z0-9_]*[A-Z0-9]\b", text))
    if "X_WEBHOOK_SIGNATURE_INVALID` / `_STALE" in text:
        codes.add("X_WEBHOOK_SIGNATURE_STALE")
    return codes - APP_EXAMPLES


# --------------------------------------------------------------------------- the enum


def test_error_code_snapshot_codes_are_added_never_renamed() -> None:
    members = [code.value for code in ErrorCode]
    missing = [code for code in SNAPSHOT if code not in members]
    assert missing == [], f"renamed or removed codes: {missing}"
    added = [code for code in members if code not in SNAPSHOT]
    assert added == [], f"new codes: add them to SNAPSHOT: {added}"


def test_error_code_member_names_equal_their_values() -> None:
    for code in ErrorCode:
        assert code.name == code.value
        assert isinstance(code, str)
        assert re.fullmatch(r"X_[A-Z0-9_]+", code.value)


@pytest.mark.skipif(not SPEC_DIR.exists(), reason="the spec is not beside this checkout")
def test_every_code_of_the_spec_is_a_member() -> None:
    spec = _spec_codes()
    assert len(spec) > 40  # the grep found the spec's codes, not nothing
    members = {code.value for code in ErrorCode}
    assert sorted(spec - members) == []


@pytest.mark.skipif(not SPEC_DIR.exists(), reason="the spec is not beside this checkout")
def test_the_spec_grep_excludes_app_examples_and_truncations() -> None:
    spec = _spec_codes()
    assert not spec & APP_EXAMPLES
    for truncated in ("X_BULK_ROWS", "X_ENQUEUE_BATCH", "X_JOB_PAGE", "X_TASK_FIRES"):
        assert truncated not in spec
    assert "X_WEBHOOK_SIGNATURE_STALE" in spec


# --------------------------------------------------------------------------- JobsError


@pytest.mark.parametrize("code", list(ErrorCode), ids=str)
def test_jobs_error_pickle_round_trip_for_every_code(code: ErrorCode) -> None:
    original = errors_mod.error(code, "do the thing the message says", step="charge", n=3)
    assert type(original) is FAMILIES.get(code.value, JobsError)
    copy = pickle.loads(pickle.dumps(original))
    assert type(copy) is type(original)
    assert copy.code == code
    assert copy.message == original.message
    assert copy.meta == {"step": "charge", "n": 3}
    assert str(copy) == str(original)
    assert repr(copy) == repr(original)


@pytest.mark.parametrize("code", list(ErrorCode), ids=str)
def test_jobs_error_json_round_trip_for_every_code(code: ErrorCode) -> None:
    original = errors_mod.error(code, "what to do", retry_after_seconds=30)
    wire = json.dumps(original.to_json())
    data = json.loads(wire)
    assert data == {
        "code": code.value,
        "message": "what to do",
        "meta": {"retry_after_seconds": 30},
    }
    copy = JobsError.from_json(data)
    assert type(copy) is FAMILIES.get(code.value, JobsError)
    assert (copy.code, copy.message, copy.meta) == (code.value, "what to do", original.meta)


def test_family_subclasses_are_jobs_errors() -> None:
    for family in set(FAMILIES.values()):
        assert issubclass(family, JobsError)
    with pytest.raises(JobAbortedError):
        raise JobsError.from_json({"code": "X_DRAINING", "message": "worker w1 is draining"})


def test_json_round_trip_of_an_app_code_is_a_plain_jobs_error() -> None:
    copy = JobsError.from_json(JobsError("X_CARD_DECLINED", "ask for another card").to_json())
    assert type(copy) is JobsError
    assert copy.code == "X_CARD_DECLINED"


def test_a_pickled_app_subclass_keeps_its_class() -> None:
    err = _AppError("X_VENDOR_BUSY", "wait", meta={"retry_after_seconds": 5})
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is _AppError
    assert copy.meta == {"retry_after_seconds": 5}


class _AppError(JobsError):
    pass


def test_jobs_error_carries_code_message_and_meta() -> None:
    err = JobsError(ErrorCode.X_JOB_KEY_BUSY, "retry it later", meta={"job": "sync"})
    assert err.code == "X_JOB_KEY_BUSY"
    assert err.code == ErrorCode.X_JOB_KEY_BUSY
    assert type(err.code) is str
    assert err.message == "retry it later"
    assert err.meta == {"job": "sync"}
    assert str(err) == "X_JOB_KEY_BUSY: retry it later"
    assert str(JobsError("X_ABORTED")) == "X_ABORTED"
    assert JobsError("X_ABORTED").meta == {}


def test_jobs_error_meta_is_copied_not_shared() -> None:
    meta = {"step": "a"}
    err = JobsError("X_ABORTED", "", meta=meta)
    meta["step"] = "b"
    assert err.meta == {"step": "a"}
    err.to_json()["meta"]["step"] = "c"
    assert err.meta == {"step": "a"}


@pytest.mark.parametrize("code", ["X_CARD_DECLINED", "X_VENDOR_BUSY", "X_YOUR_CODE", "X_A1", "X_9"])
def test_jobs_error_accepts_app_codes(code: str) -> None:
    err = JobsError(code, "the app's own")
    assert err.code == code
    assert err.retry_class is None  # unclassified until the app registers it


@pytest.mark.parametrize(
    "code",
    [
        "",
        "X_",
        "x_card_declined",
        "X_card",
        "Y_CARD",
        "XCARD",
        "X-CARD",
        "X_CARD-DECLINED",
        " X_CARD",
        "X_CARD ",
        "X_CARD\n",
        "X_CÄRD",
    ],
)
def test_jobs_error_refuses_malformed_codes(code: str) -> None:
    with pytest.raises(ValueError, match="X_"):
        JobsError(code, "nope")


# --------------------------------------------------------------------------- retry classes


def test_register_error_retry_terminal_and_retry_after() -> None:
    assert retry_class_of("X_CARD_DECLINED") is None
    register_error_retry({"X_CARD_DECLINED": "terminal", "X_VENDOR_BUSY": "retry-after"})
    assert retry_class_of("X_CARD_DECLINED") == "terminal"
    assert retry_class_of("X_VENDOR_BUSY") == "retry-after"
    assert JobsError("X_CARD_DECLINED").retry_class == "terminal"
    assert JobsError("X_VENDOR_BUSY", meta={"retry_after_seconds": 30}).retry_class == "retry-after"


def test_an_unclassified_code_and_none_are_unclassified() -> None:
    assert retry_class_of("X_SOMETHING_ELSE") is None
    assert retry_class_of(None) is None


def test_the_library_classifies_its_own_terminal_codes() -> None:
    for code in (
        ErrorCode.X_STEP_DUPLICATE,  # PYTHON-API: classified terminal
        ErrorCode.X_STEP_OUTCOME_UNKNOWN,  # "stops with terminal X_STEP_OUTCOME_UNKNOWN"
        ErrorCode.X_STEP_OUTPUT_UNSERIALIZABLE,  # "is X_STEP_OUTPUT_UNSERIALIZABLE, terminal"
        ErrorCode.X_JOB_EVENT_INVALID,  # "X_JOB_EVENT_INVALID, terminal"
        ErrorCode.X_JOB_TENANT_MISMATCH,  # "refused at its run, terminally"
        ErrorCode.X_CONSUMER_SELF_ENQUEUE,  # "X_CONSUMER_SELF_ENQUEUE, terminal"
    ):
        assert retry_class_of(code) == "terminal", code
    for code in (ErrorCode.X_RATE_LIMITED, ErrorCode.X_WEBHOOK_DELIVERY_THROTTLED):
        assert retry_class_of(code) == "retry-after", code


def test_a_later_registration_reclassifies() -> None:
    register_error_retry({"X_VENDOR_BUSY": "terminal"})
    register_error_retry({"X_VENDOR_BUSY": "retry-after"})
    assert retry_class_of("X_VENDOR_BUSY") == "retry-after"


@pytest.mark.parametrize(
    "bad",
    [
        {"card_declined": "terminal"},
        {"X_card": "terminal"},
        {"X_CARD\n": "terminal"},
        {"": "terminal"},
        {1: "terminal"},
        {None: "terminal"},
        {"X_CARD_DECLINED": "fatal"},
        {"X_CARD_DECLINED": "retry_after"},
        {"X_CARD_DECLINED": None},
        {"X_CARD_DECLINED": "Terminal"},
    ],
    ids=repr,
)
def test_register_error_retry_refuses_bad_input(bad: dict[object, object]) -> None:
    with pytest.raises(JobsError) as caught:
        register_error_retry(bad)  # type: ignore[arg-type]
    assert caught.value.code == ErrorCode.X_CONFIG_INVALID


def test_a_refused_registration_registers_nothing() -> None:
    with pytest.raises(JobsError):
        register_error_retry({"X_CARD_DECLINED": "terminal", "X_VENDOR_BUSY": "sometimes"})
    assert retry_class_of("X_CARD_DECLINED") is None
    assert retry_class_of("X_VENDOR_BUSY") is None
