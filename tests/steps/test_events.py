"""Spec: "Durable steps" — ``step.wait_for_event(name, event, schema=, match=, timeout=)``
and ``publish_event``.

Suspends until a matching event arrives or the timeout fires; answers the payload
parsed by the required schema, or ``None`` on a timeout. A payload the schema refuses
is ``X_JOB_EVENT_INVALID``, terminal. Only an event published at or after the instant
the wait began counts. On the memory driver a publish makes waiting runs due at once.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio

from jobs_support import Item, jobs_on_memory, running_worker, wait_for, wait_state
from trio_jobs import ErrorCode, JobContext, JobsError, Retry, job, publish_event
from trio_jobs.testing import open_harness

TERMINAL_NOTE = "not retried: this code is classified terminal"


@attrs.frozen
class Paid:
    order: str
    amount: int


def waiter(seen: list[Any], **wait: Any) -> Any:
    wait.setdefault("schema", Paid)
    wait.setdefault("timeout", "1d")

    @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=2, base="1s"))
    async def await_payment(ctx: JobContext[Item]) -> Any:
        got = await ctx.step.wait_for_event("payment", "order.paid", **wait)
        seen.append(got)
        return None if got is None else attrs.asdict(got) if attrs.has(type(got)) else got

    return await_payment


class TestWaiting:
    async def test_a_waiting_run_is_suspended_and_a_publish_resumes_it(
        self, autojump_clock: Any
    ) -> None:
        seen: list[Any] = []
        body = waiter(seen)
        async with open_harness(jobs=[body]) as h:
            trace = await h.run(body, Item("a"))
            assert trace.state == "suspended"
            assert trace.attempts == 0
            assert trace.steps["payment"].status == "waiting"
            h.clock.advance("10s")
            await publish_event("order.paid", {"order": "o-1", "amount": 5})
            trace = await h.drain()  # type: ignore[assignment]
        assert trace is not None
        assert trace.state == "done"
        assert seen == [Paid("o-1", 5)]  # parsed by the schema
        assert trace.result == {"order": "o-1", "amount": 5}
        assert trace.steps["payment"].status == "completed"

    async def test_publish_wakes_the_waiting_run_at_once_on_the_memory_driver(
        self, autojump_clock: Any
    ) -> None:
        resumed: list[float] = []

        @job(input=Item, idempotency_key=lambda i: i.key, event_poll="1h")
        async def await_payment(ctx: JobContext[Item]) -> None:
            await ctx.step.wait_for_event("payment", "order.paid", schema=Paid, timeout="1d")
            resumed.append(trio.current_time())

        async with jobs_on_memory([await_payment]) as (jobs, _driver):
            enq = await await_payment.enqueue(Item("a"))
            async with running_worker(jobs, idle_poll_max="10s"):
                await wait_state(jobs, enq.id, "suspended")
                await trio.sleep(120)
                published = trio.current_time()
                await publish_event("order.paid", {"order": "o-1", "amount": 5})
                await wait_for(lambda: resumed)
                await wait_state(jobs, enq.id, "done")
        assert resumed[0] - published < 0.001

    async def test_match_picks_the_event_for_this_run(self, autojump_clock: Any) -> None:
        seen: list[Any] = []
        body = waiter(seen, match=lambda p: p.order == "o-2")
        async with open_harness(jobs=[body]) as h:
            await h.run(body, Item("a"))
            h.clock.advance("1s")
            await publish_event("order.paid", {"order": "o-1", "amount": 1})
            await publish_event("order.other", {"order": "o-2", "amount": 1})
            trace = await h.drain()
            assert trace is not None
            assert trace.state == "suspended"
            await publish_event("order.paid", {"order": "o-2", "amount": 2})
            trace = await h.drain()
        assert trace is not None
        assert trace.state == "done"
        assert seen == [Paid("o-2", 2)]

    async def test_a_timeout_answers_none(self, autojump_clock: Any) -> None:
        seen: list[Any] = []
        body = waiter(seen, timeout="1h")
        async with open_harness(jobs=[body]) as h:
            await h.run(body, Item("a"))
            h.clock.advance("59m")
            trace = await h.drain()
            assert trace is not None
            assert trace.state == "suspended"
            h.clock.advance("1m")
            trace = await h.drain()
        assert trace is not None
        assert trace.state == "done"
        assert seen == [None]
        assert trace.steps["payment"].output is None

    async def test_an_event_published_before_the_wait_began_does_not_count(
        self, autojump_clock: Any
    ) -> None:
        seen: list[Any] = []
        body = waiter(seen, timeout="1h")
        async with open_harness(jobs=[body]) as h:
            await publish_event("order.paid", {"order": "early", "amount": 1})
            h.clock.advance("1s")
            trace = await h.run(body, Item("a"))
            assert trace.state == "suspended"
            h.clock.advance("1h")
            trace = await h.drain()  # type: ignore[assignment]
        assert trace is not None
        assert seen == [None]

    async def test_the_poll_is_bounded_by_event_poll(self, autojump_clock: Any) -> None:
        seen: list[Any] = []

        @job(input=Item, idempotency_key=lambda i: i.key, event_poll="5s")
        async def polls(ctx: JobContext[Item]) -> None:
            seen.append(await ctx.step.wait_for_event("e", "evt", schema=dict, timeout="1h"))

        async with open_harness(jobs=[polls]) as h:
            trace = await h.run(polls, Item("a"))
            view = await h.jobs.show(trace.job_id)
            assert view.run_at - h.driver.now() == pytest.approx(5.0, abs=0.01)

    async def test_a_replay_answers_the_stored_event(self, autojump_clock: Any) -> None:
        seen: list[Any] = []

        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=2, base="1s"))
        async def then_fails(ctx: JobContext[Item]) -> None:
            seen.append(await ctx.step.wait_for_event("p", "order.paid", schema=Paid, timeout="1h"))
            if ctx.attempt == 1:
                raise RuntimeError("after the event")

        async with open_harness(jobs=[then_fails]) as h:
            await h.run(then_fails, Item("a"))
            await publish_event("order.paid", {"order": "o-1", "amount": 3})
            trace = await h.drain()
        assert trace is not None
        assert trace.state == "done"
        assert seen == [Paid("o-1", 3), Paid("o-1", 3)]


class TestSchema:
    async def test_a_payload_the_schema_refuses_is_terminal(self, autojump_clock: Any) -> None:
        seen: list[Any] = []
        body = waiter(seen)
        async with open_harness(jobs=[body]) as h:
            await h.run(body, Item("a"))
            await publish_event("order.paid", {"order": "o-1", "amount": "five"})
            trace = await h.drain()
        assert trace is not None
        assert seen == []
        assert (trace.state, trace.attempts) == ("dead", 1)
        assert trace.error_code == ErrorCode.X_JOB_EVENT_INVALID
        assert trace.last_error is not None
        assert TERMINAL_NOTE in trace.last_error
        assert "five" not in trace.last_error  # never the payload

    async def test_schema_is_required(self, autojump_clock: Any) -> None:
        codes: list[Any] = []

        @job(input=Item, idempotency_key=lambda i: i.key)
        async def no_schema(ctx: JobContext[Item]) -> None:
            try:
                await ctx.step.wait_for_event("e", "evt", schema=None, timeout="1m")
            except JobsError as exc:
                codes.append(exc.code)
            try:
                await ctx.step.wait_for_event("f", "evt", timeout="1m")  # type: ignore[call-arg]
            except TypeError:
                codes.append("TypeError")

        async with open_harness(jobs=[no_schema]) as h:
            trace = await h.run(no_schema, Item("a"))
        assert codes == [ErrorCode.X_JOB_DECLARATION_INVALID, "TypeError"]
        assert trace.steps == {}

    @pytest.mark.parametrize(
        ("kwargs", "code"),
        [
            ({"timeout": "never"}, ErrorCode.X_JOB_DECLARATION_INVALID),
            ({"timeout": "1m", "match": "o-1"}, ErrorCode.X_JOB_DECLARATION_INVALID),
        ],
    )
    async def test_a_bad_wait_is_refused(
        self, kwargs: dict[str, Any], code: str, autojump_clock: Any
    ) -> None:
        codes: list[str] = []

        @job(input=Item, idempotency_key=lambda i: i.key)
        async def bad_wait(ctx: JobContext[Item]) -> None:
            try:
                await ctx.step.wait_for_event("e", "evt", schema=dict, **kwargs)
            except JobsError as exc:
                codes.append(exc.code)

        async with open_harness(jobs=[bad_wait]) as h:
            await h.run(bad_wait, Item("a"))
        assert codes == [code]


class TestPublish:
    async def test_publish_joins_the_ambient_transaction(self, autojump_clock: Any) -> None:
        seen: list[Any] = []
        body = waiter(seen, timeout="1h")
        async with open_harness(jobs=[body]) as h:
            await h.run(body, Item("a"))

            async def rolled_back() -> None:
                async with h.jobs.transaction():
                    await publish_event("order.paid", {"order": "rolled-back", "amount": 1})
                    raise RuntimeError("roll back")

            with pytest.raises(RuntimeError):
                await rolled_back()
            trace = await h.drain()
            assert trace is not None
            assert trace.state == "suspended"  # the rolled-back event never existed
            async with h.jobs.transaction():
                await publish_event("order.paid", {"order": "committed", "amount": 2})
            trace = await h.drain()
        assert trace is not None
        assert trace.state == "done"
        assert seen == [Paid("committed", 2)]

    async def test_an_unserializable_payload_is_refused(self, autojump_clock: Any) -> None:
        async with open_harness(jobs=[]):
            with pytest.raises(JobsError) as info:
                await publish_event("evt", {"x": object()})
        assert info.value.code == ErrorCode.X_JOB_EVENT_INVALID
