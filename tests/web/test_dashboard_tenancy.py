"""The dashboard acts as an operator (issue 15, "Tenancy under an acting actor"):
an ambient actor the mounting app set for the request (``acting_as(user)`` in its
middleware) does not confine what the dashboard shows or does."""

from __future__ import annotations

from asgi_client import AsgiClient

from tenancy_suite import JOBS, ORG_A, Onboard, bob, untenanted
from trio_jobs import acting_as, memory_driver, open_jobs
from trio_jobs.web import create_app


async def test_an_ambient_actor_of_one_org_does_not_confine_the_dashboard() -> None:
    async with open_jobs(memory_driver(), jobs=JOBS) as jobs:
        theirs = await untenanted.enqueue(Onboard("a1"), tenant_id=ORG_A, delay=3600)
        client = AsgiClient(create_app(jobs))
        with acting_as(bob()):  # what the mounting app's middleware would do
            listing = await client.get("/jobs")
            page = await client.get(f"/{theirs.id}")
            overview = await client.get("/")
            token = page.csrf()
            cancelled = await client.post(
                f"/{theirs.id}/cancel", form={"csrf": token, "reason": "operator"}
            )
        assert listing.status == 200
        assert theirs.id[:8] in listing.text
        assert page.status == 200, page.text
        assert overview.status == 200
        assert cancelled.status in (302, 303), cancelled.text
        assert (await jobs.show(theirs.id)).state == "cancelled"
