"""Declarations: ``job()`` and the handle it returns.

Spec sections "The fluent surface" (every declared field lifted and resolved, the
handle's members, ``describe()``, the key rules), "Idempotency is in the type
signature" (``X_IDEMPOTENCY_REQUIRED``), "Concurrency, rate limits, queues, retry"
and its "Refused where it is written" table; PYTHON-API.md "Declaring a job" and
"The handle".
"""

from __future__ import annotations

import functools
import json
import math
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import attrs
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from trio_jobs import (
    Concurrency,
    ErrorCode,
    Job,
    JobContext,
    JobsError,
    Retry,
    job,
    memory_driver,
    open_jobs,
)
from trio_jobs._time import parse_duration
from trio_jobs.errors import JobDeclarationError


@attrs.frozen
class Sync:
    org_id: uuid.UUID
    account_id: str


ORG = uuid.UUID("00000000-0000-7000-8000-000000000001")
ACCOUNT = "acct-1"


async def body(ctx: JobContext[Sync]) -> None:
    return None


def key(i: Sync) -> str:
    return f"sync:{i.account_id}"


def declare(**fields: Any) -> Job[Any, Any]:
    """``job(**fields)(body)`` with an input and a key unless the test passes its own."""
    fields.setdefault("input", Sync)
    fields.setdefault("idempotency_key", key)
    return job(**fields)(body)


def refusal(**fields: Any) -> JobsError:
    with pytest.raises(JobsError) as caught:
        declare(**fields)
    assert caught.value.code == ErrorCode.X_JOB_DECLARATION_INVALID, caught.value
    assert isinstance(caught.value, JobDeclarationError)
    return caught.value


# --------------------------------------------------------------------------- the fields


def test_every_field_of_the_fluent_surface_is_lifted_resolved() -> None:
    def settled(s: Any) -> None:
        return None

    def per_account(i: Sync) -> str:
        return i.account_id

    handle = declare(
        name="crm.sync",
        tenant=lambda i: str(i.org_id),
        queue="integrations",
        retry=Retry(attempts=5, backoff="linear", base="250ms", max_delay=timedelta(minutes=2)),
        concurrency=Concurrency(limit=1, key=per_account, when_busy="fail"),
        timeout="30s",
        step_timeout=timedelta(seconds=5),
        event_poll=2,
        compensates=True,
        on_settled=settled,
        on_settled_timeout="10s",
    )
    assert handle.kind == "job"
    assert handle.name == "crm.sync"
    assert handle.queue == "integrations"
    assert handle.input is Sync
    assert handle.run is body
    assert handle.retry == Retry(
        attempts=5, backoff="linear", base=0.25, max_delay=120.0, jitter=True, dead_letter=True
    )
    assert handle.concurrency == 1
    assert handle.when_busy == "fail"
    assert handle.timeout == 30.0
    assert handle.step_timeout == 5.0
    assert handle.event_poll == 2.0
    for seconds in (
        handle.timeout,
        handle.step_timeout,
        handle.event_poll,
        handle.retry.base,
        handle.retry.max_delay,
        handle.on_settled_timeout,
    ):
        assert type(seconds) is float
    assert handle.compensates is True
    assert handle.on_settled is settled
    assert handle.on_settled_timeout == 10.0
    assert handle.concurrency_key_for(Sync(ORG, ACCOUNT)) == ACCOUNT
    assert handle.idempotency_key_for(Sync(ORG, ACCOUNT)) == "sync:acct-1"


def test_undeclared_fields_resolve_to_the_defaults() -> None:
    handle = declare()
    assert handle.kind == "job"
    assert handle.queue == "default"
    assert handle.retry == Retry()
    assert handle.retry == Retry(
        attempts=3, backoff="exponential", base=1.0, max_delay=3600.0, jitter=True, dead_letter=True
    )
    assert type(handle.retry.base) is float
    assert type(handle.retry.max_delay) is float
    assert handle.concurrency is None
    assert handle.when_busy is None
    assert handle.timeout is None
    assert handle.step_timeout is None
    assert handle.event_poll is None
    assert handle.compensates is False
    assert handle.on_settled is None
    assert handle.on_settled_timeout == 30.0
    assert handle.tenant == "none"
    assert handle.concurrency_key_for(Sync(ORG, ACCOUNT)) is None


@pytest.mark.parametrize(
    ("retry", "expected"),
    [
        (Retry(attempts=5), Retry(attempts=5, base=1.0, max_delay=3600.0)),
        (Retry(backoff="fixed"), Retry(backoff="fixed", base=1.0, max_delay=3600.0)),
        (Retry(base="100ms"), Retry(base=0.1, max_delay=3600.0)),
        (Retry(max_delay="1m"), Retry(base=1.0, max_delay=60.0)),
        (Retry(jitter=False, dead_letter=False), Retry(jitter=False, dead_letter=False, base=1.0)),
        (Retry(attempts=1), Retry(attempts=1, base=1.0, max_delay=3600.0)),
    ],
    ids=repr,
)
def test_retry_carries_the_framework_defaults_merged_underneath(
    retry: Retry, expected: Retry
) -> None:
    assert declare(retry=retry).retry == expected


@pytest.mark.parametrize(
    ("declared", "limit", "when_busy"),
    [
        (4, 4, None),
        (Concurrency(limit=4), 4, None),
        (Concurrency(limit=1, key=lambda i: i.account_id), 1, "wait"),
        (Concurrency(limit=2, key=lambda i: i.account_id, when_busy="wait"), 2, "wait"),
        (Concurrency(limit=1, key=lambda i: i.account_id, when_busy="fail"), 1, "fail"),
    ],
    ids=["int", "unkeyed", "keyed-default", "keyed-wait", "keyed-fail"],
)
def test_concurrency_is_the_cap_as_an_int_and_when_busy_only_when_keyed(
    declared: Any, limit: int, when_busy: str | None
) -> None:
    handle = declare(concurrency=declared)
    assert handle.concurrency == limit
    assert type(handle.concurrency) is int
    assert handle.when_busy == when_busy


def test_concurrency_takes_its_limit_positionally() -> None:
    # PYTHON-API.md: Concurrency(limit, key=fn, when_busy="wait"|"fail")
    per_account = Concurrency(2, key=lambda i: i.account_id, when_busy="fail")
    assert per_account.limit == 2
    handle = declare(concurrency=per_account)
    assert (handle.concurrency, handle.when_busy) == (2, "fail")
    assert Concurrency(3) == Concurrency(limit=3)
    with pytest.raises(TypeError):
        Concurrency(1, lambda i: i.account_id)  # key is keyword-only


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("250ms", 0.25),
        ("30s", 30.0),
        ("1m", 60.0),
        ("2h", 7200.0),
        ("3d", 259200.0),
        (timedelta(seconds=90), 90.0),
        (5, 5.0),
        (0.5, 0.5),
    ],
)
@pytest.mark.parametrize("field", ["timeout", "step_timeout", "event_poll", "on_settled_timeout"])
def test_durations_are_lifted_as_float_seconds(field: str, value: Any, seconds: float) -> None:
    lifted = getattr(declare(**{field: value}), field)
    assert lifted == seconds
    assert type(lifted) is float


@pytest.mark.parametrize("field", ["timeout", "step_timeout", "event_poll", "on_settled_timeout"])
@pytest.mark.parametrize(
    "value", [0, 0.0, "0s", "0ms", -1, -0.001, timedelta(0), timedelta(seconds=-5)], ids=repr
)
def test_a_non_positive_ceiling_is_refused_at_declaration(field: str, value: Any) -> None:
    err = refusal(**{field: value})
    assert err.meta["faults"] == [
        f"{field} must be a positive duration of at most 100 years "
        '("30s", "250ms", a timedelta or seconds)'
    ]


@pytest.mark.parametrize("field", ["timeout", "step_timeout", "event_poll"])
@pytest.mark.parametrize(
    "value", ["soon", "30", "1w", float("nan"), float("inf"), True, [30]], ids=repr
)
def test_a_malformed_duration_is_refused_at_declaration(field: str, value: Any) -> None:
    err = refusal(**{field: value})
    assert any(f.startswith(field + " ") for f in err.meta["faults"]), err


# --------------------------------------------------------------------------- the key is required


# That omitting the key is also a type error is held by tests/typecheck/test_overloads.py.


def test_a_missing_idempotency_key_is_x_idempotency_required_at_decoration() -> None:
    with pytest.raises(JobsError) as caught:
        job(input=Sync)  # type: ignore[call-overload]
    assert caught.value.code == ErrorCode.X_IDEMPOTENCY_REQUIRED
    assert isinstance(caught.value, JobDeclarationError)
    assert "idempotency_key" in caught.value.message


def test_a_none_idempotency_key_is_x_idempotency_required() -> None:
    with pytest.raises(JobsError) as caught:
        job(input=Sync, idempotency_key=None)  # type: ignore[call-overload]
    assert caught.value.code == ErrorCode.X_IDEMPOTENCY_REQUIRED


def test_a_missing_key_wins_over_other_faults() -> None:
    with pytest.raises(JobsError) as caught:
        job(input=Sync, queue="")  # type: ignore[call-overload]
    assert caught.value.code == ErrorCode.X_IDEMPOTENCY_REQUIRED


def test_a_non_function_key_is_a_declaration_fault() -> None:
    err = refusal(idempotency_key="sync:static")
    assert err.meta["faults"] == [
        "idempotency_key must be a function of the input answering a string"
    ]


# --------------------------------------------------------------------------- refusals


def _lambda_key(i: Any) -> str:
    return "k"


BAD_FIELDS: list[tuple[str, dict[str, Any], str]] = [
    ("input-int", {"input": 42}, "input must be"),
    ("input-object", {"input": object}, "input must be"),
    ("tenant-str", {"tenant": "org-1"}, "tenant must be"),
    ("tenant-none-obj", {"tenant": None}, "tenant must be"),
    ("name-empty", {"name": ""}, "name must be"),
    ("name-blank", {"name": "  "}, "name must be"),
    ("name-long", {"name": "n" * 201}, "name must be"),
    ("name-int", {"name": 7}, "name must be"),
    ("name-nul", {"name": "job\x00one"}, "name cannot be stored: it holds a NUL character"),
    ("name-surrogate", {"name": "job\ud800"}, "name cannot be stored: it holds half of a"),
    ("queue-nul", {"queue": "default\x00"}, "queue must be"),
    ("queue-empty", {"queue": ""}, "queue must be"),
    ("queue-space", {"queue": "my queue"}, "queue must be"),
    ("queue-long", {"queue": "q" * 129}, "queue must be"),
    ("queue-int", {"queue": 1}, "queue must be"),
    ("queue-newline", {"queue": "default\n"}, "queue must be"),
    ("retry-dict", {"retry": {"attempts": 3}}, "retry must be"),
    ("retry-attempts-0", {"retry": Retry(attempts=0)}, "retry.attempts"),
    ("retry-attempts-neg", {"retry": Retry(attempts=-1)}, "retry.attempts"),
    ("retry-attempts-float", {"retry": Retry(attempts=2.5)}, "retry.attempts"),  # type: ignore[arg-type]
    ("retry-attempts-bool", {"retry": Retry(attempts=True)}, "retry.attempts"),
    ("retry-backoff", {"retry": Retry(backoff="random")}, "retry.backoff"),  # type: ignore[arg-type]
    ("retry-base-0", {"retry": Retry(base=0)}, "retry.base"),
    ("retry-base-bad", {"retry": Retry(base="soon")}, "retry.base"),
    ("retry-max-delay-neg", {"retry": Retry(max_delay=-1)}, "retry.max_delay"),
    ("retry-max-below-base", {"retry": Retry(base="2m", max_delay="1m")}, "retry.max_delay"),
    ("retry-base-none", {"retry": Retry(base=None)}, "retry.base"),
    ("retry-max-delay-none", {"retry": Retry(base="2h", max_delay=None)}, "retry.max_delay"),
    ("retry-base-1e300", {"retry": Retry(base=1e300, max_delay=1e300)}, "retry.base"),
    ("retry-max-delay-1e300", {"retry": Retry(max_delay=1e300)}, "at most 100 years"),
    ("timeout-1e300", {"timeout": 1e300}, "timeout must be a positive duration of at most"),
    ("event-poll-century", {"event_poll": "36526d"}, "event_poll must be"),
    ("retry-jitter", {"retry": Retry(jitter="yes")}, "retry.jitter"),  # type: ignore[arg-type]
    ("retry-dead-letter", {"retry": Retry(dead_letter=1)}, "retry.dead_letter"),  # type: ignore[arg-type]
    ("compensates", {"compensates": "yes"}, "compensates must be"),
    ("on-settled", {"on_settled": 3}, "on_settled must be"),
    ("sensitive", {"sensitive": "yes"}, "sensitive must be"),
    ("unknown-field", {"rate_limit": 10}, "unknown field(s): rate_limit"),
]


@pytest.mark.parametrize(
    ("fields", "fault"), [c[1:] for c in BAD_FIELDS], ids=[c[0] for c in BAD_FIELDS]
)
def test_each_bad_field_is_refused_naming_its_fault(fields: dict[str, Any], fault: str) -> None:
    err = refusal(**fields)
    assert err.message.startswith("job declaration is invalid: ")
    assert fault in err.message
    assert any(fault in f for f in err.meta["faults"])


@pytest.mark.parametrize(
    "concurrency",
    [0, -1, 1.5, 2.0, math.nan, math.inf, -math.inf, True, False, "4", [1]],
    ids=repr,
)
def test_a_bad_plain_cap_is_refused(concurrency: Any) -> None:
    err = refusal(concurrency=concurrency)
    assert any(f.startswith("concurrency") for f in err.meta["faults"])


@pytest.mark.parametrize("limit", [0, -1, 1.5, 2.0, math.nan, math.inf, True, "1", None], ids=repr)
def test_a_bad_concurrency_limit_is_refused(limit: Any) -> None:
    err = refusal(concurrency=Concurrency(limit=limit, key=lambda i: i.account_id))
    assert err.meta["faults"] == [
        "concurrency limit must be a whole number, 1 or more (0, negative, fractional, NaN "
        "and infinity are refused)"
    ]


@pytest.mark.parametrize("key_value", ["account", 42, ["account"]], ids=repr)
def test_a_non_function_concurrency_key_is_refused(key_value: Any) -> None:
    err = refusal(concurrency=Concurrency(limit=1, key=key_value))
    assert (
        "concurrency.key must be a function of the input answering a string" in err.meta["faults"]
    )


@pytest.mark.parametrize("when_busy", ["drop", "FAIL", "", None, 1], ids=repr)
def test_an_unknown_when_busy_is_refused(when_busy: Any) -> None:
    err = refusal(concurrency=Concurrency(limit=1, key=lambda i: i.account_id, when_busy=when_busy))
    assert "concurrency.when_busy must be 'wait' or 'fail'" in err.meta["faults"]


def test_when_busy_fail_without_a_key_is_refused() -> None:
    err = refusal(concurrency=Concurrency(limit=1, when_busy="fail"))
    assert err.meta["faults"] == [
        "concurrency.when_busy='fail' needs a key=; a plain cap always waits"
    ]


def test_several_faults_are_named_in_one_refusal() -> None:
    err = refusal(
        queue="no spaces allowed",
        timeout=0,
        concurrency=0,
        retry=Retry(attempts=0, backoff="sometimes"),  # type: ignore[arg-type]
        tenant="org-1",
    )
    faults = err.meta["faults"]
    assert len(faults) == 6, faults
    for fragment in (
        "queue must be",
        "timeout must be",
        "concurrency limit must be",
        "retry.attempts",
        "retry.backoff",
        "tenant must be",
    ):
        assert fragment in err.message
    assert err.message == "job declaration is invalid: " + "; ".join(faults)


def test_a_refusal_comes_at_the_decorator_call_before_any_body() -> None:
    with pytest.raises(JobsError) as caught:
        job(input=Sync, idempotency_key=key, queue="")
    assert caught.value.code == ErrorCode.X_JOB_DECLARATION_INVALID


def test_the_body_must_take_exactly_the_context() -> None:
    async def two(ctx: Any, extra: Any) -> None:
        return None

    async def none() -> None:
        return None

    for fn in (two, none):
        with pytest.raises(JobsError) as caught:
            job(idempotency_key=_lambda_key)(fn)  # type: ignore[arg-type]
        assert caught.value.code == ErrorCode.X_JOB_DECLARATION_INVALID
        assert "exactly one argument" in caught.value.message
    with pytest.raises(JobsError) as caught:
        job(idempotency_key=_lambda_key)(42)  # type: ignore[arg-type]
    assert caught.value.code == ErrorCode.X_JOB_DECLARATION_INVALID


def test_a_body_without_a_qualname_needs_a_name() -> None:
    async def with_option(ctx: Any, option: int = 1) -> None:
        return None

    partial = functools.partial(with_option, option=2)
    with pytest.raises(JobsError) as caught:
        job(idempotency_key=_lambda_key)(partial)
    assert caught.value.code == ErrorCode.X_JOB_DECLARATION_INVALID
    assert "name=" in caught.value.message
    assert job(idempotency_key=_lambda_key, name="partial.job")(partial).name == "partial.job"


# --------------------------------------------------------------------------- name


@job(input=Sync, idempotency_key=key)
async def module_level(ctx: JobContext[Sync]) -> None:
    return None


def test_the_default_name_is_module_dot_qualname() -> None:
    assert module_level.name == f"{module_level.run.__module__}.module_level"
    assert module_level.name == f"{__name__}.module_level"
    assert module_level.name.endswith("test_declare.module_level")


def test_a_local_function_keeps_its_locals_qualname() -> None:
    @job(input=Sync, idempotency_key=key)
    async def local(ctx: JobContext[Sync]) -> None:
        return None

    assert local.name == (
        f"{__name__}.test_a_local_function_keeps_its_locals_qualname.<locals>.local"
    )


def test_a_declared_name_is_kept() -> None:
    assert declare(name="billing.charge").name == "billing.charge"


def test_redeclaring_a_name_is_fine_without_a_registry() -> None:
    first = declare(name="same.name")
    second = declare(name="same.name")  # re-importing a module does this
    assert first.name == second.name


def test_the_handle_looks_like_its_function() -> None:
    assert module_level.__name__ == "module_level"
    assert module_level.__module__ == __name__
    assert module_level.__wrapped__ is module_level.run
    assert "module_level" in repr(module_level)


# --------------------------------------------------------------------------- describe()


def _walk(value: Any) -> list[Any]:
    out = [value]
    if isinstance(value, dict):
        for k, v in value.items():
            out.append(k)
            out.extend(_walk(v))
    elif isinstance(value, list):
        for v in value:
            out.extend(_walk(v))
    return out


def test_describe_is_the_manifest_row() -> None:
    handle = declare(
        name="crm.sync",
        queue="integrations",
        retry=Retry(attempts=3),
        concurrency=Concurrency(limit=1, key=lambda i: i.account_id, when_busy="fail"),
    )
    row = handle.describe()
    assert row["name"] == "crm.sync"
    assert row["queue"] == "integrations"
    assert row["retry"]["attempts"] == 3
    assert row["retry"]["backoff"] == "exponential"
    assert row["steps"] == []  # empty by design: step names are chosen at run time
    assert row["idempotent"] is True
    assert row["concurrency"] == {"limit": 1, "keyed": True, "when_busy": "fail"}
    json.dumps(row)  # the manifest is plain JSON


def test_describe_input_is_the_json_schema_of_the_attrs_input() -> None:
    schema = declare().describe()["input"]
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["type"] == "object"
    assert schema["properties"] == {
        "org_id": {"type": "string", "format": "uuid"},
        "account_id": {"type": "string"},
    }
    assert schema["required"] == ["org_id", "account_id"]
    assert schema["additionalProperties"] is False


def test_describe_concurrency_shapes() -> None:
    assert declare().describe()["concurrency"] is None
    assert declare(concurrency=4).describe()["concurrency"] == {
        "limit": 4,
        "keyed": False,
        "when_busy": None,
    }
    assert declare(concurrency=Concurrency(limit=2, key=lambda i: i.account_id)).describe()[
        "concurrency"
    ] == {"limit": 2, "keyed": True, "when_busy": "wait"}


def test_describe_never_carries_a_key() -> None:
    handle = declare(
        idempotency_key=lambda i: f"IDEM-{i.account_id}",
        concurrency=Concurrency(limit=1, key=lambda i: f"CONC-{i.account_id}"),
    )
    everything = _walk(handle.describe())
    for item in everything:
        assert not callable(item)
        if isinstance(item, str):
            assert "IDEM-" not in item
            assert "CONC-" not in item
            assert item not in ("idempotency_key", "concurrency_key", "key")


def test_describe_is_one_list_for_every_job() -> None:
    rows = [declare(name=f"j{i}").describe() for i in range(3)]
    assert [r["name"] for r in rows] == ["j0", "j1", "j2"]
    assert all(set(r) == set(rows[0]) for r in rows)


# --------------------------------------------------------------------------- keys


def test_idempotency_key_for_answers_what_the_declaration_returned() -> None:
    assert declare().idempotency_key_for(Sync(ORG, "a")) == "sync:a"


def test_an_empty_idempotency_key_is_x_invariant_at_the_call() -> None:
    handle = declare(idempotency_key=lambda i: "")
    with pytest.raises(JobsError) as caught:
        handle.idempotency_key_for(Sync(ORG, ACCOUNT))
    assert caught.value.code == ErrorCode.X_INVARIANT


@pytest.mark.parametrize("answer", [None, 42, b"bytes", ORG], ids=repr)
def test_a_non_string_idempotency_key_is_refused(answer: Any) -> None:
    handle = declare(idempotency_key=lambda i: answer)
    with pytest.raises(JobsError) as caught:
        handle.idempotency_key_for(Sync(ORG, ACCOUNT))
    assert caught.value.code == ErrorCode.X_JOB_DECLARATION_INVALID


def test_concurrency_key_for_is_none_without_a_keyed_cap() -> None:
    assert declare(concurrency=3).concurrency_key_for(Sync(ORG, ACCOUNT)) is None


@pytest.mark.parametrize("length", [1, 200])
def test_a_concurrency_key_of_1_to_200_characters_is_accepted(length: int) -> None:
    handle = declare(concurrency=Concurrency(limit=1, key=lambda i: "k" * length))
    assert handle.concurrency_key_for(Sync(ORG, ACCOUNT)) == "k" * length


BAD_CONCURRENCY_KEYS = ["", None, 7, ORG, "k" * 201]


@pytest.mark.parametrize("answer", BAD_CONCURRENCY_KEYS, ids=repr)
def test_a_bad_concurrency_key_is_refused(answer: Any) -> None:
    handle = declare(concurrency=Concurrency(limit=1, key=lambda i: answer))
    with pytest.raises(JobsError) as caught:
        handle.concurrency_key_for(Sync(ORG, ACCOUNT))
    assert caught.value.code == ErrorCode.X_JOB_DECLARATION_INVALID


@pytest.mark.parametrize("answer", BAD_CONCURRENCY_KEYS, ids=repr)
async def test_a_bad_concurrency_key_reaches_the_enqueue_caller(answer: Any) -> None:
    handle = declare(concurrency=Concurrency(limit=1, key=lambda i: answer))
    async with open_jobs(memory_driver(), jobs=[handle]) as jobs:
        with pytest.raises(JobsError) as caught:
            await handle.enqueue(Sync(ORG, ACCOUNT))
        assert caught.value.code == ErrorCode.X_JOB_DECLARATION_INVALID
        with pytest.raises(JobsError) as caught:
            await handle.enqueue_many([Sync(ORG, "a"), Sync(ORG, "b")])
        assert caught.value.code == ErrorCode.X_JOB_DECLARATION_INVALID
        assert (await jobs.list()).rows == []


# --------------------------------------------------------------------------- parse


def test_parse_structures_a_raw_payload() -> None:
    handle = declare()
    assert handle.parse({"org_id": str(ORG), "account_id": "a"}) == Sync(ORG, "a")
    assert handle.parse(Sync(ORG, "a")) == Sync(ORG, "a")


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"org_id": "SECRET-not-a-uuid", "account_id": "a"}, "$.org_id"),
        ({"org_id": str(ORG), "account_id": 5}, "$.account_id"),
        ({"org_id": str(ORG)}, "$.account_id"),
    ],
)
def test_parse_refuses_naming_the_field_never_the_value(raw: Any, field: str) -> None:
    with pytest.raises(JobsError) as caught:
        declare().parse(raw)
    assert caught.value.code == ErrorCode.X_JOB_INPUT_INVALID
    assert field in caught.value.meta["fields"]
    assert "SECRET" not in str(caught.value)


@pytest.mark.parametrize(
    "raw", [None, 5, "x", [1], {"org_id": str(ORG), "account_id": "a", "x": 1}], ids=repr
)
def test_parse_refuses_a_wrong_shape(raw: Any) -> None:
    with pytest.raises(JobsError) as caught:
        declare().parse(raw)
    assert caught.value.code == ErrorCode.X_JOB_INPUT_INVALID


def test_a_job_without_input_takes_none() -> None:
    handle = job(idempotency_key=lambda i: "singleton")(body)
    assert handle.input is None
    assert handle.parse(None) is None
    with pytest.raises(JobsError) as caught:
        handle.parse({"x": 1})
    assert caught.value.code == ErrorCode.X_JOB_INPUT_INVALID
    assert handle.describe()["input"] == {"type": "null"}


# --------------------------------------------------------------------------- one name per facade


async def test_two_different_handles_with_one_name_are_refused_by_open_jobs() -> None:
    first = declare(name="dup")
    second = declare(name="dup")
    with pytest.raises(JobsError) as caught:
        async with open_jobs(memory_driver(), jobs=[first, second]):
            pytest.fail("open_jobs accepted two jobs named 'dup'")
    assert caught.value.code == ErrorCode.X_JOB_DECLARATION_INVALID
    assert "dup" in caught.value.message


async def test_the_same_handle_twice_is_one_job() -> None:
    handle = declare(name="once")
    async with open_jobs(memory_driver(), jobs=[handle, handle]) as jobs:
        assert list(jobs.handles) == ["once"]


async def test_registering_a_second_handle_under_a_taken_name_is_refused() -> None:
    async with open_jobs(memory_driver(), jobs=[declare(name="taken")]) as jobs:
        with pytest.raises(JobsError) as caught:
            jobs.register(declare(name="taken"))
        assert caught.value.code == ErrorCode.X_JOB_DECLARATION_INVALID


async def test_open_jobs_refuses_a_non_handle() -> None:
    with pytest.raises(JobsError) as caught:
        async with open_jobs(memory_driver(), jobs=[body]):  # type: ignore[list-item]
            pytest.fail("accepted a bare function")
    assert caught.value.code == ErrorCode.X_JOB_DECLARATION_INVALID


# --------------------------------------------------------------------------- Hypothesis


def _attempt(fn: Callable[[], Job[Any, Any]]) -> tuple[Job[Any, Any] | None, JobsError | None]:
    """Run ``fn``; answer its value or the JobsError it raised (any other type escapes)."""
    try:
        return fn(), None
    except JobsError as exc:
        return None, exc


def _valid_duration(value: Any) -> bool:
    if value is None:
        return True
    try:
        parse_duration(value)
    except JobsError:
        return False
    return True


def _valid_concurrency(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, Concurrency):
        limit, key_fn, when_busy = value.limit, value.key, value.when_busy
    elif isinstance(value, int) and not isinstance(value, bool):
        limit, key_fn, when_busy = value, None, "wait"
    else:
        return False
    return (
        isinstance(limit, int)
        and not isinstance(limit, bool)
        and limit >= 1
        and (key_fn is None or callable(key_fn))
        and when_busy in ("wait", "fail")
        and not (when_busy == "fail" and key_fn is None)
    )


def _valid_retry(value: Any) -> bool:
    if value is None:
        return True
    if not isinstance(value, Retry):
        return False
    a = value.attempts
    if isinstance(a, bool) or not isinstance(a, int) or a < 1:
        return False
    if value.backoff not in ("exponential", "linear", "fixed"):
        return False
    if value.base is None or value.max_delay is None:
        return False
    if not (_valid_duration(value.base) and _valid_duration(value.max_delay)):
        return False
    if parse_duration(value.max_delay) < parse_duration(value.base):
        return False
    return isinstance(value.jitter, bool) and isinstance(value.dead_letter, bool)


DURATIONS = st.one_of(
    st.none(),
    st.sampled_from(["250ms", "30s", "1m", "2h", "3d", "0s", "-1s", "soon", "", "1w"]),
    st.integers(min_value=-5, max_value=10**6),
    st.floats(),
    st.timedeltas(min_value=timedelta(seconds=-10), max_value=timedelta(days=10)),
    st.booleans(),
)
LIMITS = st.one_of(
    st.integers(min_value=-2, max_value=50), st.floats(), st.booleans(), st.text(max_size=2)
)
KEYS: st.SearchStrategy[Any] = st.one_of(
    st.none(), st.just(lambda i: i.account_id), st.text(max_size=3), st.integers()
)
WHEN_BUSY = st.one_of(st.sampled_from(["wait", "fail"]), st.text(max_size=4), st.none())
CONCURRENCY = st.one_of(
    st.none(),
    LIMITS,
    st.builds(Concurrency, limit=LIMITS, key=KEYS, when_busy=WHEN_BUSY),
)
RETRY = st.one_of(
    st.none(),
    st.builds(
        Retry,
        attempts=st.one_of(st.integers(min_value=-2, max_value=20), st.booleans(), st.floats()),
        backoff=st.one_of(st.sampled_from(["exponential", "linear", "fixed"]), st.text(max_size=4)),
        base=DURATIONS,
        max_delay=DURATIONS,
        jitter=st.one_of(st.booleans(), st.integers(0, 1)),
        dead_letter=st.one_of(st.booleans(), st.none()),
    ),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
QUEUES = st.one_of(
    st.sampled_from(["default", "integrations", "a.b:c-d_e"]), st.text(max_size=130), st.integers()
)
NAMES = st.one_of(st.none(), st.text(max_size=210), st.integers())
TENANTS: st.SearchStrategy[Any] = st.one_of(
    st.just("none"), st.just(lambda i: str(i.org_id)), st.text(max_size=5), st.none()
)
BOOLS = st.one_of(st.booleans(), st.integers(0, 2), st.none())


@settings(max_examples=400, deadline=None)
@example(
    queue="default",
    name="\x00",
    tenant="none",
    retry=None,
    concurrency=None,
    timeout=None,
    step_timeout=None,
    event_poll=None,
    compensates=False,
)
@example(
    queue="default",
    name="job\ud800",
    tenant="none",
    retry=None,
    concurrency=None,
    timeout=None,
    step_timeout=None,
    event_poll=None,
    compensates=False,
)
@given(
    queue=QUEUES,
    name=NAMES,
    tenant=TENANTS,
    retry=RETRY,
    concurrency=CONCURRENCY,
    timeout=DURATIONS,
    step_timeout=DURATIONS,
    event_poll=DURATIONS,
    compensates=BOOLS,
)
def test_property_declarations_are_accepted_iff_valid_and_refused_only_with_the_code(
    queue: Any,
    name: Any,
    tenant: Any,
    retry: Any,
    concurrency: Any,
    timeout: Any,
    step_timeout: Any,
    event_poll: Any,
    compensates: Any,
) -> None:
    import re

    expected: dict[str, bool] = {
        "queue": isinstance(queue, str)
        and re.fullmatch(r"[A-Za-z0-9_.:\-]{1,128}", queue) is not None,
        "name": name is None
        or (
            isinstance(name, str)
            and bool(name.strip())
            and len(name) <= 200
            # storable by every driver: no NUL (PostgreSQL text), no lone surrogate
            and "\x00" not in name
            and not any(0xD800 <= ord(c) <= 0xDFFF for c in name)
        ),
        "tenant": tenant == "none" or callable(tenant),
        "retry": _valid_retry(retry),
        "concurrency": _valid_concurrency(concurrency),
        "timeout": _valid_duration(timeout),
        "step_timeout": _valid_duration(step_timeout),
        "event_poll": _valid_duration(event_poll),
        "compensates": isinstance(compensates, bool),
    }
    fields = dict(
        queue=queue,
        name=name,
        tenant=tenant,
        retry=retry,
        concurrency=concurrency,
        timeout=timeout,
        step_timeout=step_timeout,
        event_poll=event_poll,
        compensates=compensates,
    )
    handle, refused = _attempt(lambda: declare(**fields))
    if refused is not None:
        assert refused.code == ErrorCode.X_JOB_DECLARATION_INVALID
        invalid = [f for f, ok in expected.items() if not ok]
        assert invalid, f"refused a valid declaration: {refused}"
        for field in invalid:
            assert any(
                fault.startswith((field + " ", field + ".")) for fault in refused.meta["faults"]
            ), (field, refused.meta["faults"])
        return
    assert handle is not None
    assert all(expected.values()), f"accepted an invalid declaration: {expected}"
    assert handle.kind == "job"
    assert handle.queue == queue
    assert type(handle.retry.base) is float
    assert handle.concurrency is None or type(handle.concurrency) is int
    assert (handle.when_busy is not None) == (
        isinstance(concurrency, Concurrency) and concurrency.key is not None
    )
    for lifted in (handle.timeout, handle.step_timeout, handle.event_poll):
        assert lifted is None or (type(lifted) is float and lifted > 0)
    json.dumps(handle.describe())
