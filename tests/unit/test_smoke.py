import uuid

import attrs
import pytest

from trio_jobs import JobContext, Retry, job
from trio_jobs.testing import open_harness


@attrs.frozen
class Onboard:
    org_id: uuid.UUID


calls = {"provision": 0, "nudge": 0}
fail_nudge = [True]


@job(
    input=Onboard,
    tenant=lambda i: str(i.org_id),
    idempotency_key=lambda i: f"onboard:{i.org_id}",
    retry=Retry(attempts=5),
)
async def onboard_org(ctx: JobContext[Onboard]) -> None:
    org = await ctx.step.run(
        "provision",
        lambda: (
            calls.__setitem__("provision", calls["provision"] + 1) or {"id": str(ctx.input.org_id)}
        ),
    )
    await ctx.step.run("welcome-email", lambda: None)
    await ctx.step.sleep("3d")

    def nudge():
        calls["nudge"] += 1
        if fail_nudge[0]:
            fail_nudge[0] = False
            raise RuntimeError("mail down")

    await ctx.step.run("nudge", nudge)
    return {"ok": True}


@pytest.mark.parametrize("mock", [True, False])
async def test_smoke(mock, request):
    if mock:
        request.getfixturevalue("autojump_clock")
    ORG = uuid.uuid4()
    calls.update(provision=0, nudge=0)
    fail_nudge[0] = True
    async with open_harness(jobs=[onboard_org]) as h:
        trace = await h.run(onboard_org, Onboard(org_id=ORG))
        assert trace.state == "delayed", trace
        h.clock.advance("3d")
        trace = await h.drain()
        print(trace)
        assert trace.steps["provision"].executions == 1
        assert trace.steps["nudge"].executions == 2
        assert trace.state == "done"
        assert trace.result == {"ok": True}
