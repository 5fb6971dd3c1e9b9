"""Spec: "Testing" — ``open_harness`` exactly as PYTHON-API.md shows it (a memory
driver and a frozen clock that drives ``sleep`` and timeouts; ``run``, ``drain``,
``trace``; per-step ``executions``), the spec's own onboarding test, and the
``jobs_harness`` pytest fixture.
"""

from __future__ import annotations

import uuid
from typing import Any

import attrs
import pytest
import trio

from trio_jobs import ErrorCode, JobContext, Retry, job
from trio_jobs.testing import Harness, HarnessClock, StepTrace, Trace, open_harness

ORG = uuid.UUID("0195f0c2-0000-7000-8000-000000000001")


@attrs.frozen
class Onboard:
    org_id: uuid.UUID


class Mail:
    """The test's mail fake: ``fail_once(template)`` makes the next send of it fail."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self._fail: set[str] = set()

    def fail_once(self, template: str) -> None:
        self._fail.add(template)

    def send(self, template: str, org: dict[str, str]) -> str:
        if template in self._fail:
            self._fail.discard(template)
            raise ConnectionError(f"{template}: the mail vendor timed out")
        self.sent.append(template)
        return f"{template} to {org['id']}"


mail = Mail()
provisioned: list[str] = []


def provision(org_id: uuid.UUID) -> dict[str, str]:
    provisioned.append(str(org_id))
    return {"id": str(org_id)}


@job(
    input=Onboard,
    tenant=lambda i: str(i.org_id),
    idempotency_key=lambda i: f"onboard:{i.org_id}",
    retry=Retry(attempts=5, backoff="exponential"),
)
async def onboard_org(ctx: JobContext[Onboard]) -> None:
    org = await ctx.step.run("provision", lambda: provision(ctx.input.org_id))
    await ctx.step.run("welcome-email", lambda: mail.send("welcome", org))
    await ctx.step.sleep("3d")
    await ctx.step.run("nudge", lambda: mail.send("nudge", org))


@pytest.fixture(autouse=True)
def _fresh_world() -> None:
    mail.sent.clear()
    mail._fail.clear()
    provisioned.clear()


class TestTheSpecsExample:
    async def test_onboard_org_retries_only_the_failed_step(self, autojump_clock: Any) -> None:
        """The step guarantee, not the happy path (the spec's own test)."""
        mail.fail_once("nudge")
        async with open_harness(jobs=[onboard_org]) as h:
            trace = await h.run(onboard_org, Onboard(org_id=ORG))
            assert trace.state == "delayed"  # asleep for three days
            h.clock.advance("3d")
            trace = await h.drain()  # type: ignore[assignment]
        assert trace is not None
        assert trace.steps["provision"].executions == 1  # replayed from storage
        assert trace.steps["nudge"].executions == 2  # only this one retried
        assert trace.state == "done"
        assert provisioned == [str(ORG)]
        assert mail.sent == ["welcome", "nudge"]

    async def test_exactly_as_python_api_shows(self, autojump_clock: Any) -> None:
        async with open_harness(jobs=[onboard_org]) as h:  # memory driver + a frozen clock
            trace = await h.run(onboard_org, Onboard(org_id=ORG))
            h.clock.advance("3d")
            trace = await h.drain()  # type: ignore[assignment]
            assert trace is not None
            assert trace.steps["provision"].executions == 1
            assert trace.state == "done"

    async def test_the_shipped_example_app_runs_in_the_harness(self, autojump_clock: Any) -> None:
        from trio_jobs.examples import onboarding

        onboarding.effects.update(provisioned=0, mails=0, mail_failures=0, nudges=0)
        async with open_harness(jobs=onboarding.jobs) as h:
            trace = await h.run(
                onboarding.onboard_org, onboarding.Onboard(org_id=ORG, email="a@example.com")
            )
            h.clock.advance("2s")
            trace = await h.drain()  # type: ignore[assignment]
        assert trace is not None
        assert trace.state == "done"
        assert onboarding.effects["provisioned"] == 1
        assert trace.steps["welcome-email"].executions == 2


class TestTrace:
    async def test_trace_fields(self, autojump_clock: Any) -> None:
        async with open_harness(jobs=[onboard_org]) as h:
            trace = await h.run(onboard_org, Onboard(org_id=ORG))
        assert isinstance(trace, Trace)
        assert str(uuid.UUID(trace.job_id)) == trace.job_id  # a lowercase canonical uuid
        assert trace.state == "delayed"
        assert trace.attempts == 0
        assert trace.result is None
        assert trace.error_code is None
        assert list(trace.steps) == ["provision", "welcome-email", "sleep:1"]
        assert trace.steps["provision"] == StepTrace(1, {"id": str(ORG)}, "completed")
        assert trace.steps["sleep:1"].status == "sleeping"

    async def test_drain_answers_none_before_any_run(self, autojump_clock: Any) -> None:
        async with open_harness(jobs=[onboard_org]) as h:
            assert await h.drain() is None
            # a job enqueued straight through the ambient facade is still run by drain
            enq = await onboard_org.enqueue(Onboard(org_id=ORG))
            assert await h.drain() is None
            trace = await h.trace(enq.id)
        assert trace.state == "delayed"
        assert provisioned == [str(ORG)]

    async def test_trace_answers_any_job(self, autojump_clock: Any) -> None:
        @job(input=Onboard, idempotency_key=lambda i: f"child:{i.org_id}", name="child")
        async def child(ctx: JobContext[Onboard]) -> str:
            return "child done"

        @job(input=Onboard, idempotency_key=lambda i: f"parent:{i.org_id}", name="parent")
        async def parent(ctx: JobContext[Onboard]) -> str:
            enq = await ctx.step.run("spawn", lambda: child.enqueue(ctx.input))
            return str(enq["id"])

        async with open_harness(jobs=[parent, child]) as h:
            trace = await h.run(parent, Onboard(org_id=ORG))
            child_trace = await h.trace(trace.result)
        assert trace.state == "done"
        assert child_trace.state == "done"
        assert child_trace.result == "child done"

    async def test_a_jobs_own_failure_is_in_the_trace_not_raised(self, autojump_clock: Any) -> None:
        @job(input=Onboard, idempotency_key=lambda i: str(i.org_id), retry=Retry(attempts=3))
        async def broken(ctx: JobContext[Onboard]) -> None:
            await ctx.step.run("explode", _explode)

        async with open_harness(jobs=[broken]) as h:
            trace = await h.run(broken, Onboard(org_id=ORG))  # retries fast-forwarded
            again = await h.drain()
        assert trace.state == "dead"
        assert trace.attempts == 3
        assert trace.steps["explode"].executions == 3
        assert trace.steps["explode"].status == "failed"
        assert trace.last_error is not None
        assert ErrorCode.X_JOB_MAX_ATTEMPTS in trace.last_error
        assert again == trace

    async def test_run_registers_a_job_the_harness_was_not_given(self, autojump_clock: Any) -> None:
        async with open_harness() as h:
            trace = await h.run(onboard_org, Onboard(org_id=ORG))
        assert trace.state == "delayed"


def _explode() -> None:
    raise ValueError("boom")


class TestFrozenClock:
    async def test_the_clock_drives_sleeps(self, autojump_clock: Any) -> None:
        @job(input=Onboard, idempotency_key=lambda i: str(i.org_id))
        async def nap(ctx: JobContext[Onboard]) -> str:
            await ctx.step.sleep("10m")
            return "rested"

        async with open_harness(jobs=[nap]) as h:
            trace = await h.run(nap, Onboard(org_id=ORG))
            assert trace.state == "delayed"
            h.clock.advance("9m")
            assert (await h.drain()).state == "delayed"  # type: ignore[union-attr]
            h.clock.advance("1m")
            trace = await h.drain()  # type: ignore[assignment]
        assert trace is not None
        assert (trace.state, trace.result) == ("done", "rested")

    async def test_the_clock_drives_timeouts(self, autojump_clock: Any) -> None:
        starts: list[float] = []

        @job(
            input=Onboard,
            idempotency_key=lambda i: str(i.org_id),
            timeout="30s",
            retry=Retry(attempts=2, base="1s"),
        )
        async def hangs(ctx: JobContext[Onboard]) -> None:
            starts.append(trio.current_time())
            await trio.sleep(3600)

        async with open_harness(jobs=[hangs]) as h:
            trace = await h.run(hangs, Onboard(org_id=ORG))
        assert trace.state == "dead"
        assert trace.error_code == ErrorCode.X_JOB_TIMEOUT
        assert trace.attempts == 2
        assert starts[1] - starts[0] < 60.0  # 30 s and a backoff, never the hour

    async def test_advance_moves_the_clock_and_trio_time_together(
        self, autojump_clock: Any
    ) -> None:
        async with open_harness() as h:
            assert isinstance(h.clock, HarnessClock)
            before, trio_before = h.clock.now(), trio.current_time()
            h.clock.advance("3d")
            assert h.clock.now() - before == pytest.approx(3 * 86400)
            assert trio.current_time() - trio_before == pytest.approx(3 * 86400)
            assert h.driver.now() == h.clock.now()

    def test_without_a_mock_clock_the_clock_is_frozen(self) -> None:
        clock = HarnessClock(origin=1_000.0)
        assert clock.now() == 1_000.0
        clock.advance("90s")
        assert clock.now() == 1_090.0

    async def test_an_exception_in_the_block_propagates_unchanged(
        self, autojump_clock: Any
    ) -> None:
        class Mine(Exception):
            pass

        with pytest.raises(Mine):
            async with open_harness(jobs=[onboard_org]):
                raise Mine()

    async def test_the_ambient_facade_is_the_harness(self, autojump_clock: Any) -> None:
        from trio_jobs import current_jobs

        async with open_harness(jobs=[onboard_org]) as h:
            assert isinstance(h, Harness)
            assert current_jobs() is h.jobs


# --------------------------------------------------------------------------- the pytest plugin


@pytest.mark.jobs(onboard_org)
async def test_the_jobs_harness_fixture(jobs_harness: Harness, autojump_clock: Any) -> None:
    assert isinstance(jobs_harness, Harness)
    assert jobs_harness.jobs.handle(onboard_org.name) is onboard_org
    mail.fail_once("nudge")
    trace = await jobs_harness.run(onboard_org, Onboard(org_id=ORG))
    jobs_harness.clock.advance("3d")
    trace = await jobs_harness.drain()  # type: ignore[assignment]
    assert trace is not None
    assert trace.state == "done"
    assert trace.steps["nudge"].executions == 2


async def test_the_fixture_without_a_marker_registers_on_first_run(
    jobs_harness: Harness, autojump_clock: Any
) -> None:
    assert jobs_harness.jobs.handles == {}
    trace = await jobs_harness.run(onboard_org, Onboard(org_id=ORG))
    assert trace.state == "delayed"
