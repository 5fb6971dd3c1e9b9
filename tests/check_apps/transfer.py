"""A step.transaction job: the follow-up it enqueues commits with its record,
so a crash never enqueues a second one (checked on PostgreSQL too)."""

from __future__ import annotations

import uuid
from typing import Any

import attrs

from trio_jobs import JobContext, Retry, job


@attrs.frozen
class Transfer:
    id: int


@attrs.frozen
class Notice:
    token: str


noticed: set[str] = set()


@job(name="notice", input=Notice, idempotency_key=lambda n: n.token)
async def notice(ctx: JobContext[Notice]) -> None:
    noticed.add(ctx.input.token)


async def _enqueue_notice(tx: Any) -> str:
    token = uuid.uuid4().hex  # a fresh key per execution: a re-run would notice twice
    await notice.enqueue(Notice(token))
    return token


@job(
    name="transfer",
    input=Transfer,
    idempotency_key=lambda t: f"transfer:{t.id}",
    retry=Retry(attempts=5),
)
async def transfer(ctx: JobContext[Transfer]) -> None:
    await ctx.step.transaction("book", _enqueue_notice)
    await ctx.step.run("done", lambda: None)


trio_jobs_examples = {"transfer": [Transfer(1)], "notice": [Notice("n")]}


def trio_jobs_observe() -> int:
    return len(noticed)


def trio_jobs_reset() -> None:
    noticed.clear()
