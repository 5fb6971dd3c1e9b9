"""Spec: "Durable steps" — ``step.run(name, fn)`` and the step-rule table.

Driven through the harness (a real worker over the memory driver, on Trio's
MockClock) and, where the worker's own timing matters, a running Worker.
"""

from __future__ import annotations

import datetime as dt
import uuid
from functools import partial
from typing import Any

import attrs
import pytest
import trio
import trio.lowlevel

from jobs_support import Item, jobs_on_memory, running_worker, wait_for, wait_state
from trio_jobs import ErrorCode, JobContext, JobsError, Retry, job
from trio_jobs.testing import open_harness

TERMINAL_NOTE = "not retried: this code is classified terminal"


@attrs.frozen
class Point:
    x: int
    label: str


class TestStoredForm:
    """It answers what it stored, on the first run too: the JSON form."""

    async def test_the_first_run_answers_the_json_form(self, autojump_clock: Any) -> None:
        first: list[Any] = []
        when = dt.datetime(2026, 8, 1, 12, 30, tzinfo=dt.UTC)
        ident = uuid.UUID("12345678-1234-5678-1234-567812345678")

        @job(input=Item, idempotency_key=lambda i: i.key)
        async def shapes(ctx: JobContext[Item]) -> Any:
            out = await ctx.step.run(
                "shapes",
                lambda: {
                    "at": when,
                    "pair": (1, 2),
                    "point": Point(3, "p"),
                    "id": ident,
                    "nested": [(4, Point(5, "q"))],
                },
            )
            first.append(out)
            return out

        async with open_harness(jobs=[shapes]) as h:
            trace = await h.run(shapes, Item("a"))
        expected = {
            "at": "2026-08-01T12:30:00+00:00",
            "pair": [1, 2],
            "point": {"x": 3, "label": "p"},
            "id": "12345678-1234-5678-1234-567812345678",
            "nested": [[4, {"x": 5, "label": "q"}]],
        }
        assert first == [expected]
        assert isinstance(first[0]["at"], str)  # a datetime is a string: parse it at the read
        assert trace.steps["shapes"].output == expected
        assert trace.result == expected

    @pytest.mark.parametrize(
        ("value", "stored"),
        [
            (None, None),  # a miss is None: compare `is None`
            (dt.date(2026, 1, 2), "2026-01-02"),
            (("a", "b"), ["a", "b"]),
            (Point(1, "x"), {"x": 1, "label": "x"}),
            (2**62, 2**62),
            (1.5, 1.5),
            ("text", "text"),
        ],
    )
    async def test_replay_and_first_run_agree(
        self, value: Any, stored: Any, autojump_clock: Any
    ) -> None:
        answers: list[Any] = []

        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=2, base="1s"))
        async def twice(ctx: JobContext[Item]) -> None:
            answers.append(await ctx.step.run("value", lambda: value))
            if ctx.attempt == 1:
                raise RuntimeError("retry so the step replays")

        async with open_harness(jobs=[twice]) as h:
            trace = await h.run(twice, Item("a"))
        assert trace.state == "done"
        assert answers == [stored, stored]
        assert trace.steps["value"].executions == 1


class TestReplay:
    """On replay, returns the stored result without calling fn."""

    async def test_replay_does_not_call_fn(self, autojump_clock: Any) -> None:
        calls = {"provision": 0, "email": 0}

        def provision() -> dict[str, str]:
            calls["provision"] += 1
            return {"org": "o-1"}

        async def email(org: dict[str, str]) -> str:
            calls["email"] += 1
            if calls["email"] == 1:
                raise ConnectionError("mail vendor timed out")
            return f"sent to {org['org']}"

        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=3, base="1s"))
        async def onboard(ctx: JobContext[Item]) -> str:
            org = await ctx.step.run("provision", provision)
            return str(await ctx.step.run("email", lambda: email(org)))

        async with open_harness(jobs=[onboard]) as h:
            trace = await h.run(onboard, Item("a"))
        assert calls == {"provision": 1, "email": 2}
        assert trace.state == "done"
        assert trace.attempts == 2
        assert trace.steps["provision"].executions == 1
        assert trace.steps["email"].executions == 2
        assert trace.steps["email"].status == "completed"
        assert trace.result == "sent to o-1"
        assert list(trace.steps) == ["provision", "email"]  # in the order first recorded

    async def test_requeue_replays_completed_steps_from_storage(self, autojump_clock: Any) -> None:
        calls: list[str] = []

        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=1))
        async def once_dead(ctx: JobContext[Item]) -> None:
            await ctx.step.run("a", lambda: calls.append("a"))

            def b() -> None:
                calls.append("b")
                if len(calls) == 2:
                    raise KeyError("b fails the first time")

            await ctx.step.run("b", b)

        async with open_harness(jobs=[once_dead]) as h:
            trace = await h.run(once_dead, Item("a"))
            assert trace.state == "dead"
            await h.jobs.requeue(trace.job_id)
            trace = await h.drain()
        assert calls == ["a", "b", "b"]  # resumes from the failed step
        assert trace is not None
        assert trace.steps["a"].executions == 1
        assert trace.steps["b"].executions == 2

    async def test_sync_and_async_fns_and_the_step_signal(self, autojump_clock: Any) -> None:
        seen: list[Any] = []

        @job(input=Item, idempotency_key=lambda i: i.key)
        async def kinds(ctx: JobContext[Item]) -> None:
            seen.append(await ctx.step.run("sync", lambda: 1))

            async def coro() -> int:
                await trio.lowlevel.checkpoint()
                return 2

            seen.append(await ctx.step.run("async", coro))

            def with_signal(signal: Any) -> bool:
                return signal.aborted

            seen.append(await ctx.step.run("signal", with_signal))

        async with open_harness(jobs=[kinds]) as h:
            trace = await h.run(kinds, Item("a"))
        assert trace.state == "done"
        assert seen == [1, 2, False]


class TestFailure:
    """An exception from fn is recorded and re-raised unchanged."""

    async def test_recorded_and_reraised_unchanged(self, autojump_clock: Any) -> None:
        raised: list[BaseException] = []
        caught: list[BaseException] = []

        class VendorDown(Exception):
            pass

        def call_vendor() -> None:
            exc = VendorDown("vendor is down")
            raised.append(exc)
            raise exc

        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=1))
        async def calls(ctx: JobContext[Item]) -> None:
            try:
                await ctx.step.run("vendor", call_vendor)
            except VendorDown as exc:
                caught.append(exc)
                raise

        async with open_harness(jobs=[calls]) as h:
            trace = await h.run(calls, Item("a"))
            view = await h.jobs.show(trace.job_id)
        assert caught[0] is raised[0]
        assert trace.state == "dead"
        assert trace.steps["vendor"].status == "failed"
        assert trace.steps["vendor"].executions == 1
        step = next(s for s in view.steps if s.name == "vendor")
        assert step.error is not None
        assert "VendorDown" in step.error
        assert trace.last_error is not None
        assert trace.last_error.startswith("VendorDown: vendor is down")

    async def test_a_jobs_error_keeps_its_code_on_the_row(self, autojump_clock: Any) -> None:
        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=1))
        async def coded(ctx: JobContext[Item]) -> None:
            await ctx.step.run("vendor", _raise(JobsError("X_TEST_VENDOR", "vendor said no")))

        async with open_harness(jobs=[coded]) as h:
            trace = await h.run(coded, Item("a"))
        assert trace.error_code == "X_TEST_VENDOR"


def _raise(exc: BaseException) -> Any:
    def fn() -> None:
        raise exc

    return fn


class _Cycle:
    pass


def _cycle() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


class TestUnserializable:
    """A value with no JSON form (a big int, a cycle, an object) is
    X_STEP_OUTPUT_UNSERIALIZABLE, terminal."""

    @pytest.mark.parametrize(
        "make",
        [lambda: 2**80, _cycle, _Cycle, lambda: {"when": object()}],
        ids=["big-int", "cycle", "plain-object", "object-in-dict"],
    )
    async def test_terminal(self, make: Any, autojump_clock: Any) -> None:
        after: list[str] = []

        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=3))
        async def bad_output(ctx: JobContext[Item]) -> None:
            await ctx.step.run("bad", make)
            after.append("continued")

        async with open_harness(jobs=[bad_output]) as h:
            trace = await h.run(bad_output, Item("a"))
        assert trace.state == "dead"
        assert trace.attempts == 1
        assert trace.error_code == ErrorCode.X_STEP_OUTPUT_UNSERIALIZABLE
        assert trace.last_error is not None
        assert TERMINAL_NOTE in trace.last_error
        assert "'bad'" in trace.last_error
        assert trace.steps["bad"].status == "failed"
        assert after == []

    async def test_the_jobs_own_result_too(self, autojump_clock: Any) -> None:
        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=3))
        async def bad_result(ctx: JobContext[Item]) -> Any:
            return object()

        async with open_harness(jobs=[bad_result]) as h:
            trace = await h.run(bad_result, Item("a"))
        assert (trace.state, trace.attempts) == ("dead", 1)
        assert trace.error_code == ErrorCode.X_STEP_OUTPUT_UNSERIALIZABLE


class TestNames:
    """Names unique within one run; `unwinding` and `compensate:*` are the framework's."""

    async def test_a_duplicate_name_is_terminal(self, autojump_clock: Any) -> None:
        calls: list[str] = []

        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=3))
        async def dup(ctx: JobContext[Item]) -> None:
            await ctx.step.run("same", lambda: calls.append("first"))
            await ctx.step.run("same", lambda: calls.append("second"))

        async with open_harness(jobs=[dup]) as h:
            trace = await h.run(dup, Item("a"))
        assert calls == ["first"]
        assert (trace.state, trace.attempts) == ("dead", 1)
        assert trace.error_code == ErrorCode.X_STEP_DUPLICATE
        assert trace.last_error is not None
        assert TERMINAL_NOTE in trace.last_error
        assert trace.steps["same"].executions == 1

    @pytest.mark.parametrize("second", ["sleep", "wait_for_event"])
    async def test_duplicates_across_kinds(self, second: str, autojump_clock: Any) -> None:
        codes: list[str] = []

        @job(input=Item, idempotency_key=lambda i: i.key)
        async def dup(ctx: JobContext[Item]) -> None:
            await ctx.step.run("same", lambda: 1)
            try:
                if second == "sleep":
                    await ctx.step.sleep("1s", name="same")
                else:
                    await ctx.step.wait_for_event("same", "evt", schema=dict, timeout="1m")
            except JobsError as exc:
                codes.append(exc.code)

        async with open_harness(jobs=[dup]) as h:
            trace = await h.run(dup, Item("a"))
        assert codes == [ErrorCode.X_STEP_DUPLICATE]
        assert trace.state == "done"

    @pytest.mark.parametrize("name", ["unwinding", "compensate:charge", "compensate:"])
    async def test_reserved_names_are_refused_on_run_sleep_and_wait(
        self, name: str, autojump_clock: Any
    ) -> None:
        codes: list[tuple[str, str]] = []

        @job(input=Item, idempotency_key=lambda i: i.key)
        async def reserved(ctx: JobContext[Item]) -> None:
            attempts = {
                "run": lambda: ctx.step.run(name, lambda: 1),
                "sleep": lambda: ctx.step.sleep("1s", name=name),
                "wait_for_event": lambda: ctx.step.wait_for_event(
                    name, "evt", schema=dict, timeout="1m"
                ),
            }
            for kind, call in attempts.items():
                try:
                    await call()
                except JobsError as exc:
                    codes.append((kind, exc.code))

        async with open_harness(jobs=[reserved]) as h:
            trace = await h.run(reserved, Item("a"))
        assert codes == [
            ("run", ErrorCode.X_JOB_DECLARATION_INVALID),
            ("sleep", ErrorCode.X_JOB_DECLARATION_INVALID),
            ("wait_for_event", ErrorCode.X_JOB_DECLARATION_INVALID),
        ]
        assert trace.state == "done"
        assert trace.steps == {}  # nothing written under a reserved name

    async def test_a_reserved_name_left_uncaught_is_terminal(self, autojump_clock: Any) -> None:
        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=3))
        async def reserved(ctx: JobContext[Item]) -> None:
            await ctx.step.run("unwinding", lambda: 1)

        async with open_harness(jobs=[reserved]) as h:
            trace = await h.run(reserved, Item("a"))
        assert (trace.state, trace.attempts) == ("dead", 1)
        assert trace.error_code == ErrorCode.X_JOB_DECLARATION_INVALID

    @pytest.mark.parametrize("name", ["", "x" * 201, 7])
    async def test_a_name_must_be_a_short_string(self, name: Any, autojump_clock: Any) -> None:
        codes: list[str] = []

        @job(input=Item, idempotency_key=lambda i: i.key)
        async def badly_named(ctx: JobContext[Item]) -> None:
            try:
                await ctx.step.run(name, lambda: 1)
            except JobsError as exc:
                codes.append(exc.code)

        async with open_harness(jobs=[badly_named]) as h:
            await h.run(badly_named, Item("a"))
        assert codes == [ErrorCode.X_JOB_DECLARATION_INVALID]

    async def test_renaming_a_step_reruns_it(self, autojump_clock: Any) -> None:
        """Names stable across deploys: a renamed step's stored result is not found."""
        calls: list[str] = []
        current = ["v1"]

        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=2, base="1s"))
        async def renamed(ctx: JobContext[Item]) -> None:
            await ctx.step.run(f"load-{current[0]}", lambda: calls.append(current[0]))
            if ctx.attempt == 1:
                current[0] = "v2"  # the deploy between attempts renamed it
                raise RuntimeError("retry")

        async with open_harness(jobs=[renamed]) as h:
            trace = await h.run(renamed, Item("a"))
        assert calls == ["v1", "v2"]
        assert set(trace.steps) == {"load-v1", "load-v2"}


class TestThroughAWorker:
    async def test_each_step_record_is_durable_before_the_next_step(
        self, autojump_clock: Any
    ) -> None:
        seen: list[list[str]] = []

        @job(input=Item, idempotency_key=lambda i: i.key)
        async def chain(ctx: JobContext[Item]) -> None:
            await ctx.step.run("one", lambda: 1)
            view = await ctx.jobs.show(ctx.job_id)
            seen.append([f"{s.name}:{s.status}" for s in view.steps])
            await ctx.step.run("two", lambda: 2)

        async with jobs_on_memory([chain]) as (jobs, _driver):
            enq = await chain.enqueue(Item("a"))
            async with running_worker(jobs):
                view = await wait_state(jobs, enq.id, "done")
        assert seen == [["one:completed"]]
        assert [(s.name, s.output, s.executions) for s in view.steps] == [
            ("one", 1, 1),
            ("two", 2, 1),
        ]


async def test_wrapped_step_fns_sharing_a_decorator_each_get_their_own_signature(
    autojump_clock: object,
) -> None:
    import functools

    from trio_jobs import Signal, job
    from trio_jobs.testing import open_harness

    def passthrough(fn):  # type: ignore[no-untyped-def]
        @functools.wraps(fn)
        def wrapper(*args):  # type: ignore[no-untyped-def]
            return fn(*args)

        return wrapper

    @passthrough
    def no_signal() -> str:
        return "a"

    @passthrough
    def takes_signal(signal: Signal) -> str:
        assert isinstance(signal, Signal)
        return "b"

    @job(idempotency_key=lambda _i: "wrapped")
    async def wrapped(ctx: JobContext[None]) -> list[str]:
        return [await ctx.step.run("a", no_signal), await ctx.step.run("b", takes_signal)]

    async with open_harness(jobs=[wrapped]) as h:
        trace = await h.run(wrapped, None)
    assert trace.state == "done"
    assert trace.result == ["a", "b"]


class TestTimes:
    """What the job page shows: each step's start and end, and the step in
    progress, which the worker's heartbeat writes to the attempt log."""

    async def test_a_step_records_when_it_started_and_ended(self, autojump_clock: Any) -> None:
        @job(input=Item, idempotency_key=lambda i: i.key, retry=Retry(attempts=1))
        async def timed(ctx: JobContext[Item]) -> None:
            await ctx.step.run("fetch", partial(trio.sleep, 3))
            await ctx.step.run("charge", partial(trio.sleep, 2), once=True)

            async def boom() -> None:
                await trio.sleep(1)
                raise RuntimeError("declined")

            await ctx.step.run("notify", boom)

        async with jobs_on_memory([timed]) as (jobs, driver):
            start = driver.now()
            enq = await timed.enqueue(Item("t"))
            async with running_worker(jobs):
                await wait_state(jobs, enq.id, "dead")
            records = {r.name: r for r in await driver.steps.load(enq.id)}
            [attempt] = await driver.attempt_log(enq.id)
        fetch, charge, notify = records["fetch"], records["charge"], records["notify"]
        for record, took in ((fetch, 3.0), (charge, 2.0), (notify, 1.0)):
            assert record.started_at is not None
            assert record.ended_at is not None
            assert record.ended_at - record.started_at == pytest.approx(took, abs=0.01)
        assert start <= attempt.started_at <= fetch.started_at
        assert fetch.ended_at is not None
        assert charge.started_at is not None
        assert fetch.ended_at <= charge.started_at
        assert notify.status == "failed"
        assert attempt.ended_at is not None
        assert notify.ended_at is not None
        assert notify.ended_at <= attempt.ended_at

    async def test_the_step_in_progress_reaches_the_attempt_log(self, autojump_clock: Any) -> None:
        release = trio.Event()

        @job(input=Item, idempotency_key=lambda i: i.key)
        async def slow(ctx: JobContext[Item]) -> None:
            await ctx.step.run("quick", lambda: 1)
            await ctx.step.run("upload", release.wait)

        async with jobs_on_memory([slow]) as (jobs, driver):
            enq = await slow.enqueue(Item("s"))
            async with running_worker(jobs, heartbeat_interval=2.0):

                async def in_upload() -> bool:
                    log = await driver.attempt_log(enq.id)
                    return bool(log) and log[-1].step == "upload"

                await wait_for(in_upload, timeout=60, what="the heartbeat names the step")
                [entry] = await driver.attempt_log(enq.id)
                [quick] = [r for r in await driver.steps.load(enq.id) if r.name == "quick"]
                assert entry.outcome is None
                assert entry.step_started_at is not None
                assert quick.ended_at is not None
                assert entry.step_started_at >= quick.ended_at
                release.set()
                view = await wait_state(jobs, enq.id, "done")
        [entry] = view.attempt_log
        assert entry.outcome == "done"
