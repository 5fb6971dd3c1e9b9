"""Bad input at the step and event doors: every refusal is a JobsError with a
spec code, and a refused call wrote nothing."""

from __future__ import annotations

import datetime as dt
import decimal
import math
import uuid
from typing import Any

import attrs
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_jobs import JobContext, JobsError, Retry, job, publish_event
from trio_jobs._validate import text_fault
from trio_jobs.testing import open_harness


@attrs.frozen
class In:
    n: int


class Opaque:
    """An object with no JSON form."""


def _cycle() -> list[Any]:
    value: list[Any] = []
    value.append(value)
    return value


json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
hostile = st.one_of(
    json_like,
    st.builds(Opaque),
    st.integers(min_value=2**64, max_value=2**80),
    st.just(math.nan),
    st.just(math.inf),
    st.sets(st.integers(), max_size=3),
    st.binary(max_size=8),
    st.builds(_cycle),
    st.tuples(st.integers(), st.text(max_size=4)),
    st.just(dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)),
    st.uuids(),
    st.just(decimal.Decimal("1.5")),
    st.dictionaries(st.integers(), st.integers(), min_size=1, max_size=2),
)

SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@SETTINGS
@given(value=hostile)
def test_a_step_output_is_stored_as_json_or_refused_terminal(value: Any) -> None:
    seen: list[Any] = []

    @job(input=In, idempotency_key=lambda i: f"out:{i.n}", retry=Retry(attempts=3))
    async def returns(ctx: JobContext[In]) -> None:
        seen.append(await ctx.step.run("value", lambda: value))

    async def main() -> None:
        async with open_harness(jobs=[returns]) as h:
            trace = await h.run(returns, In(1))
            step = trace.steps["value"]
            if trace.state == "done":
                assert step.status == "completed"
                assert seen == [step.output]  # the first run answers what was stored
            else:
                assert trace.state == "dead"
                assert trace.error_code == "X_STEP_OUTPUT_UNSERIALIZABLE"
                assert trace.attempts == 1  # terminal: not retried
                assert step.status == "failed"
                assert step.output is None  # nothing completed was written

    trio.run(main)


def _refused_output(value: Any) -> None:
    @job(input=In, idempotency_key=lambda i: f"refused:{i.n}", retry=Retry(attempts=3))
    async def returns(ctx: JobContext[In]) -> None:
        await ctx.step.run("value", lambda: value)

    async def main() -> None:
        async with open_harness(jobs=[returns]) as h:
            trace = await h.run(returns, In(1))
            assert trace.state == "dead"
            assert trace.error_code == "X_STEP_OUTPUT_UNSERIALIZABLE"
            assert trace.steps["value"].status == "failed"
            assert trace.steps["value"].output is None

    trio.run(main)


@SETTINGS
@given(
    value=st.one_of(
        st.just(math.nan),
        st.just(-math.inf),
        st.lists(st.just(math.inf), min_size=1, max_size=3),
        st.dictionaries(st.text(max_size=4), st.just(math.nan), min_size=1, max_size=2),
    )
)
def test_a_non_finite_step_output_is_refused_not_stored_as_null(value: Any) -> None:
    _refused_output(value)


def test_an_oversized_step_output_is_refused() -> None:
    from trio_jobs._serialization import MAX_OUTPUT_BYTES

    _refused_output("x" * (MAX_OUTPUT_BYTES + 1))
    _refused_output({"rows": ["y" * 1000] * (MAX_OUTPUT_BYTES // 1000 + 1)})


@SETTINGS
@given(payload=hostile)
def test_an_event_payload_is_published_or_refused_writing_nothing(payload: Any) -> None:
    async def main() -> None:
        async with open_harness() as h:
            events = h.driver.events
            try:
                await publish_event("order.paid", payload)
            except JobsError as exc:
                assert exc.code == "X_JOB_EVENT_INVALID"
                found, _now = await events.poll("order.paid", 0.0)
                assert found == []
                return
            found, _now = await events.poll("order.paid", 0.0)
            assert len(found) == 1

    trio.run(main)


@SETTINGS
@given(
    name=st.one_of(
        st.text(max_size=3), st.integers(), st.none(), st.text(min_size=201, max_size=210)
    )
)
def test_an_event_name_is_checked(name: Any) -> None:
    async def main() -> None:
        async with open_harness() as h:
            try:
                await publish_event(name, {"ok": True})
            except JobsError as exc:
                assert exc.code == "X_INVARIANT"
                assert (
                    not isinstance(name, str)
                    or not name
                    or len(name) > 200
                    or text_fault(name) is not None
                )
                assert h.driver._events == []
            else:
                assert isinstance(name, str)
                assert 0 < len(name) <= 200
                assert text_fault(name) is None

    trio.run(main)


@SETTINGS
@given(payload=json_like)
def test_a_waiting_step_refuses_a_payload_its_schema_refuses(payload: Any) -> None:
    @attrs.frozen
    class Paid:
        order_id: uuid.UUID

    @job(input=In, idempotency_key=lambda i: f"wait:{i.n}", retry=Retry(attempts=3))
    async def waits(ctx: JobContext[In]) -> Any:
        got = await ctx.step.wait_for_event("paid", "order.paid", schema=Paid, timeout="1h")
        return None if got is None else str(got.order_id)

    async def main() -> None:
        async with open_harness(jobs=[waits]) as h:
            trace = await h.run(waits, In(1))
            assert trace.state == "suspended"
            await publish_event("order.paid", payload)
            trace = await h.drain()
            assert trace is not None
            assert trace.state == "dead"
            assert trace.error_code == "X_JOB_EVENT_INVALID"
            assert trace.attempts == 1

    trio.run(main)


# --------------------------------------------------------------------------- what a body passes on


def _body_refused(body: Any, code: str, phrase: str) -> None:
    """A job whose body passes ``body(ctx)`` a value no driver could store: the
    step refuses it with ``code`` (the run ends with it) and records nothing."""

    @job(input=In, idempotency_key=lambda i: f"body:{i.n}", retry=Retry(attempts=2))
    async def passes(ctx: JobContext[In]) -> None:
        await body(ctx)

    async def main() -> None:
        async with open_harness(jobs=[passes]) as h:
            trace = await h.run(passes, In(1))
            assert trace.state == "dead"
            assert trace.error_code == code
            assert phrase in (trace.last_error or "")
            assert trace.steps == {}  # no sleeping, waiting or started record

    trio.run(main)


def test_a_sleep_past_a_century_is_refused_before_it_is_recorded() -> None:
    # 1e300 s would be a wake time no driver can store or show.
    _body_refused(lambda ctx: ctx.step.sleep(1e300), "X_CONFIG_INVALID", "100 years")
    _body_refused(lambda ctx: ctx.step.sleep(math.inf), "X_CONFIG_INVALID", "finite")


def test_a_wait_with_a_timeout_past_a_century_is_refused_before_it_is_recorded() -> None:
    _body_refused(
        lambda ctx: ctx.step.wait_for_event("w", "paid", schema=dict, timeout=1e300),
        "X_JOB_DECLARATION_INVALID",
        "100 years",
    )


def test_a_wait_for_an_event_named_with_nul_is_refused() -> None:
    _body_refused(
        lambda ctx: ctx.step.wait_for_event("w", "paid\x00", schema=dict, timeout="1h"),
        "X_JOB_DECLARATION_INVALID",
        "NUL",
    )


def test_a_step_named_with_nul_is_refused() -> None:
    async def step(ctx: Any) -> None:
        await ctx.step.run("charge\x00card", lambda: 1)

    _body_refused(step, "X_JOB_DECLARATION_INVALID", "NUL")
    _body_refused(
        lambda ctx: ctx.step.sleep("1s", name="nap\ud800"), "X_JOB_DECLARATION_INVALID", "surrogate"
    )
