"""Serialization: the JSON form of payloads and step outputs.

Spec "Durable steps": a step "answers what it stored, on the first run too" — a date
is a string, a miss is ``null``, a bigint or a cycle is unserializable. PYTHON-API.md:
the input is an attrs class that cattrs structures; what ``enqueue`` stores is what the
worker parses. Refusals name the fault, never the value (STYLE.md principle 6).
"""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import uuid
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_jobs import ErrorCode, JobsError, job, memory_driver, open_jobs
from trio_jobs._serialization import (
    MAX_PAYLOAD_BYTES,
    MAX_PAYLOAD_DEPTH,
    UnserializableError,
    dumps,
    json_form,
    loads,
    payload_form,
)

SECRET = "SECRET-4e1f-do-not-log"


class Plan(enum.Enum):
    TRIAL = "trial"
    PAID = "paid"


@attrs.frozen
class Line:
    sku: str
    qty: int


@attrs.frozen
class Order:
    order_id: uuid.UUID
    org_id: str
    total: float
    paid: bool
    lines: list[Line]
    tags: dict[str, int]
    dims: tuple[int, ...]
    plan: Plan
    placed_at: dt.datetime
    ship_on: dt.date | None
    price: decimal.Decimal
    note: str | None = None


@attrs.frozen
class Blob:
    key: str
    data: Any = None


async def _noop(ctx: Any) -> None:
    return None


order_job = job(name="order", input=Order, idempotency_key=lambda o: f"order:{o.order_id}")(_noop)
blob_job = job(name="blob", input=Blob, idempotency_key=lambda b: f"blob:{b.key}")(_noop)
dict_job = job(name="dict", input=dict, idempotency_key=lambda d: f"dict:{d.get('k', 'x')}")(_noop)


# --------------------------------------------------------------------------- json_form


@pytest.mark.parametrize(
    ("value", "form"),
    [
        (None, None),
        (True, True),
        (0, 0),
        (-(2**63), -(2**63)),
        (2**64 - 1, 2**64 - 1),
        (1.5, 1.5),
        ("x", "x"),
        (dt.datetime(2026, 8, 1, 12, 30, tzinfo=dt.UTC), "2026-08-01T12:30:00+00:00"),
        (dt.datetime(2026, 8, 1, 12, 30), "2026-08-01T12:30:00"),  # noqa: DTZ001
        (uuid.UUID(int=1), "00000000-0000-0000-0000-000000000001"),
        ((1, 2, (3,)), [1, 2, [3]]),
        ([1, (2, 3)], [1, [2, 3]]),
        (Plan.PAID, "paid"),
        (decimal.Decimal("1.10"), "1.10"),
        ({"at": dt.date(2026, 8, 1)}, {"at": "2026-08-01"}),
        (Line("a", 2), {"sku": "a", "qty": 2}),
        ([Line("a", 2)], [{"sku": "a", "qty": 2}]),
        ({"when": None}, {"when": None}),
    ],
    ids=repr,
)
def test_json_form(value: Any, form: Any) -> None:
    assert json_form(value) == form


def test_json_form_of_an_attrs_value_nests_its_json_forms() -> None:
    order = _an_order()
    form = json_form(order)
    assert form["order_id"] == str(order.order_id)
    assert form["placed_at"] == order.placed_at.isoformat()
    assert form["lines"] == [{"sku": "widget", "qty": 2}]
    assert form["dims"] == [1, 2, 3]
    assert form["plan"] == "trial"
    assert form["price"] == "9.99"


def test_json_form_is_what_a_replay_reads_back() -> None:
    value = {"at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC), "ids": (uuid.UUID(int=7),)}
    form = json_form(value)
    assert loads(dumps(value)) == form
    assert json_form(form) == form


def _cycle() -> list[Any]:
    a: list[Any] = []
    a.append(a)
    return a


def _dict_cycle() -> dict[str, Any]:
    d: dict[str, Any] = {}
    d["self"] = d
    return d


class _Opaque:
    pass


@pytest.mark.parametrize(
    "value",
    [
        _cycle(),
        _dict_cycle(),
        2**64,
        -(2**63) - 1,
        [2**100],
        {"n": 10**30},
        _Opaque(),
        [_Opaque()],
        {1: "non-str key"},
        object(),
        b"bytes",
        lambda: None,
    ],
    ids=lambda v: type(v).__name__,
)
def test_unserializable_values_raise(value: Any) -> None:
    with pytest.raises(UnserializableError):
        json_form(value)
    with pytest.raises(UnserializableError):
        dumps(value)


# --------------------------------------------------------------------------- payload refusals


def test_payload_form_names_the_fault_never_the_value() -> None:
    with pytest.raises(JobsError) as caught:
        payload_form({SECRET: _Opaque()}, what="the input", code=ErrorCode.X_JOB_INPUT_INVALID)
    assert caught.value.code == ErrorCode.X_JOB_INPUT_INVALID
    assert SECRET not in str(caught.value)
    assert SECRET not in repr(caught.value.meta)


def test_oversize_payload_is_refused_without_the_value() -> None:
    big = SECRET + "x" * MAX_PAYLOAD_BYTES
    with pytest.raises(JobsError) as caught:
        payload_form({"data": big}, what="the input", code=ErrorCode.X_JOB_INPUT_INVALID)
    assert caught.value.code == ErrorCode.X_JOB_INPUT_INVALID
    assert str(MAX_PAYLOAD_BYTES) in str(caught.value)
    assert SECRET not in str(caught.value)
    assert SECRET not in repr(caught.value.meta)


def test_a_payload_under_the_byte_limit_is_accepted() -> None:
    data = "x" * (MAX_PAYLOAD_BYTES - 100)
    assert payload_form({"data": data}, what="x", code=ErrorCode.X_JOB_INPUT_INVALID) == {
        "data": data
    }


def _nested(levels: int) -> Any:
    value: Any = SECRET
    for _ in range(levels):
        value = {"k": value}
    return value


def test_too_deep_payload_is_refused_without_the_value() -> None:
    with pytest.raises(JobsError) as caught:
        payload_form(_nested(MAX_PAYLOAD_DEPTH + 5), what="x", code=ErrorCode.X_JOB_INPUT_INVALID)
    assert caught.value.code == ErrorCode.X_JOB_INPUT_INVALID
    assert SECRET not in str(caught.value)
    assert payload_form(
        _nested(MAX_PAYLOAD_DEPTH - 2), what="x", code=ErrorCode.X_JOB_INPUT_INVALID
    )


def test_a_payload_deeper_than_the_encoder_can_go_is_refused_with_the_same_code() -> None:
    with pytest.raises(JobsError) as caught:
        payload_form(_nested(1_000), what="x", code=ErrorCode.X_JOB_INPUT_INVALID)
    assert caught.value.code == ErrorCode.X_JOB_INPUT_INVALID


async def _queued(jobs: Any) -> int:
    return sum(s.ready + s.delayed + s.running + s.suspended for s in await jobs.stats())


async def test_enqueue_refuses_an_oversize_input_and_queues_nothing() -> None:
    async with open_jobs(memory_driver(), jobs=[blob_job]) as jobs:
        with pytest.raises(JobsError) as caught:
            await blob_job.enqueue(Blob(key="k", data=SECRET + "x" * MAX_PAYLOAD_BYTES))
        assert caught.value.code == ErrorCode.X_JOB_INPUT_INVALID
        assert SECRET not in str(caught.value)
        assert await _queued(jobs) == 0


async def test_enqueue_refuses_a_too_deep_input_and_queues_nothing() -> None:
    async with open_jobs(memory_driver(), jobs=[dict_job]) as jobs:
        with pytest.raises(JobsError) as caught:
            await dict_job.enqueue(_nested(MAX_PAYLOAD_DEPTH + 5))
        assert caught.value.code == ErrorCode.X_JOB_INPUT_INVALID
        assert SECRET not in str(caught.value)
        assert await _queued(jobs) == 0


@pytest.mark.parametrize(
    "data",
    [_Opaque(), 2**70, [_cycle()], float("nan"), float("inf"), {1: 2}],
    ids=["object", "bigint", "cycle", "nan", "inf", "int-key"],
)
async def test_enqueue_refuses_an_unserializable_input_and_queues_nothing(data: Any) -> None:
    async with open_jobs(memory_driver(), jobs=[blob_job, order_job]) as jobs:
        with pytest.raises(JobsError) as caught:
            await blob_job.enqueue(Blob(key=SECRET, data=data))
        assert caught.value.code == ErrorCode.X_JOB_INPUT_INVALID
        assert SECRET not in str(caught.value)
        assert await _queued(jobs) == 0


async def test_a_nan_in_a_float_field_is_refused_not_stored_as_null() -> None:
    async with open_jobs(memory_driver(), jobs=[order_job]) as jobs:
        with pytest.raises(JobsError) as caught:
            await order_job.enqueue(attrs.evolve(_an_order(), total=float("nan")))
        assert caught.value.code == ErrorCode.X_JOB_INPUT_INVALID
        assert await _queued(jobs) == 0


# --------------------------------------------------------------------------- round trips


def _an_order() -> Order:
    return Order(
        order_id=uuid.UUID(int=42),
        org_id="org-1",
        total=12.5,
        paid=False,
        lines=[Line("widget", 2)],
        tags={"a": 1},
        dims=(1, 2, 3),
        plan=Plan.TRIAL,
        placed_at=dt.datetime(2026, 8, 1, 9, 0, tzinfo=dt.UTC),
        ship_on=dt.date(2026, 8, 3),
        price=decimal.Decimal("9.99"),
    )


TEXT = st.text(max_size=20)
FLOATS = st.floats(allow_nan=False, allow_infinity=False)
INTS = st.integers(min_value=-(2**63), max_value=2**63 - 1)

orders = st.builds(
    Order,
    order_id=st.uuids(),
    org_id=TEXT,
    total=FLOATS,
    paid=st.booleans(),
    lines=st.lists(st.builds(Line, sku=TEXT, qty=INTS), max_size=3),
    tags=st.dictionaries(TEXT, INTS, max_size=3),
    dims=st.lists(INTS, max_size=3).map(tuple),
    plan=st.sampled_from(Plan),
    placed_at=st.datetimes(timezones=st.sampled_from([dt.UTC, dt.timezone(dt.timedelta(hours=-5))]))
    | st.datetimes(),
    ship_on=st.none() | st.dates(),
    price=st.decimals(allow_nan=False, allow_infinity=False, places=4),
    note=st.none() | TEXT,
)


@given(orders)
def test_property_payload_round_trip_parses_back_equal(order: Order) -> None:
    payload = order_job._payload(order)
    assert loads(dumps(payload)) == payload  # the stored form is plain JSON
    assert order_job.parse(payload) == order
    assert order_job.parse(loads(dumps(payload))) == order


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(order=orders)
async def test_property_what_enqueue_stores_parses_back_equal(order: Order) -> None:
    async with open_jobs(memory_driver(), jobs=[order_job]) as jobs:
        enqueued = await order_job.enqueue(order)
        view = await jobs.show(enqueued.id)
        assert loads(dumps(view.payload)) == view.payload
        assert order_job.parse(view.payload) == order


JSON = st.recursive(
    st.none() | st.booleans() | INTS | FLOATS | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=20,
)


@given(JSON)
def test_property_json_form_of_plain_json_is_itself(value: Any) -> None:
    assert json_form(value) == value
    assert json_form(json_form(value)) == json_form(value)


@given(JSON)
def test_property_a_dict_input_round_trips(value: Any) -> None:
    payload = dict_job._payload({"k": "1", "v": value})
    assert dict_job.parse(payload) == {"k": "1", "v": value}
