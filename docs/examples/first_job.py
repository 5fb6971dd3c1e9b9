"""The code of docs/tutorial/first-job.md, whole and runnable.

``python docs/examples/first_job.py`` runs :func:`main`; ``tests/docs/test_examples.py``
runs it and :func:`test_send_welcome` under Trio's ``MockClock`` and checks that
every code block of the tutorial is a verbatim part of this file.
"""

from __future__ import annotations

import attrs
import trio

from trio_jobs import JobContext, Retry, Worker, job, memory_driver, open_jobs
from trio_jobs.testing import open_harness


@attrs.frozen
class Welcome:
    user_id: str
    email: str


#: Stands in for a mail vendor: what was "sent", in order, and the outages
#: it will suffer next (a test appends one to make a send fail).
sent: list[str] = []
outages: list[Exception] = []


async def send_mail(to: str, subject: str) -> str:
    if outages:
        raise outages.pop(0)
    sent.append(f"{to}: {subject}")
    return f"msg-{len(sent)}"


@job(
    input=Welcome,
    idempotency_key=lambda w: f"welcome:{w.user_id}",
    retry=Retry(attempts=3, backoff="exponential", base="1s"),
)
async def send_welcome(ctx: JobContext[Welcome]) -> dict[str, str]:
    message_id = await ctx.step.run(
        "send-mail", lambda: send_mail(ctx.input.email, "Welcome aboard")
    )
    return {"message_id": message_id}


async def enqueue_twice() -> str:
    ada = Welcome(user_id="u-1", email="ada@example.com")
    first = await send_welcome.enqueue(ada)
    again = await send_welcome.enqueue(ada)  # the same key while the first is live
    assert again.deduped
    assert again.id == first.id
    return first.id


async def main() -> None:
    async with open_jobs(memory_driver(), jobs=[send_welcome]) as jobs:
        job_id = await enqueue_twice()

        worker = Worker(jobs, concurrency=4)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)  # returns once the worker is claiming
            for _ in range(100):  # a script polls the operator surface, at most 5 s
                if (await jobs.show(job_id)).state == "done":
                    break
                await trio.sleep(0.05)
            await worker.drain()  # what SIGTERM does; run() returns after it

        view = await jobs.show(job_id)
        print(view.state, view.attempts, view.result)
        for step in view.steps:
            print(f"  {step.name}: {step.status}, ran {step.executions}x, stored {step.output!r}")


async def test_send_welcome() -> None:
    async with open_harness(jobs=[send_welcome]) as h:
        trace = await h.run(send_welcome, Welcome(user_id="u-2", email="bob@example.com"))
    assert trace.state == "done"
    assert trace.attempts == 1
    assert trace.steps["send-mail"].executions == 1
    assert trace.result == {"message_id": trace.steps["send-mail"].output}


async def test_a_failed_send_is_retried() -> None:
    outages.append(ConnectionError("mail vendor timed out"))
    async with open_harness(jobs=[send_welcome]) as h:
        trace = await h.run(send_welcome, Welcome(user_id="u-3", email="cy@example.com"))
    assert trace.state == "done"
    assert trace.attempts == 2  # the first attempt failed; the backoff was skipped
    assert trace.steps["send-mail"].executions == 2


if __name__ == "__main__":
    trio.run(main)
