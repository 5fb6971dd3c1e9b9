"""The jobs the chaos soak's worker processes serve (``simulation/soak.py``).

``trio-jobs worker simulation.soak_jobs --database-url DSN`` runs them. Each job
is three steps whose effects land in the app's own table, ``soak_effects``, in
the same database as the queue, each row carrying ``(job_id, step, attempt)``
and the token of the execution that wrote it, so the soak can attribute every
row it finds:

``one``
    Inserts its effect in a transaction of its own (``ctx.jobs.transaction()``),
    which commits before ``fn`` returns; then it dawdles (a slow tail, the window
    a crash lands in) and returns the execution's token. The step's record is
    written by the worker *after* ``fn`` returns, in another statement: a crash
    between the two re-runs the effect on the next attempt. That is the
    *explained duplicate* the soak counts; the token stored in the record names
    the one execution whose record landed.
``two``
    ``once=True``: ``started`` is persisted before ``fn``, so the effect can
    never double. A crash after ``started`` leaves the outcome unknown
    (``X_STEP_OUTCOME_UNKNOWN``, terminal): the soak resolves it from the app
    table, as an operator would, and retries the job.
``three``
    ``ctx.step.transaction``: the effect is a plain INSERT made through the
    step's own transaction, which also writes the step's record, then the step
    dawdles *inside* the transaction (the window a crash lands in). A crash
    there rolls the row back with the record, so the effect can never double
    and a done job has exactly the row its record names. (There is no unique
    index on it: a double would show, not fail.)
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from typing import Any

import attrs
import trio

from trio_jobs import JobContext, Retry, job
from trio_jobs._planted import planted

__all__ = ["TABLES", "Item", "jobs", "pauses", "three_steps"]

#: The app's tables (created by the soak before the workers start).
TABLES = """
CREATE TABLE soak_effects (
    id      bigserial PRIMARY KEY,
    job_id  uuid NOT NULL,
    step    int NOT NULL,
    attempt int NOT NULL,
    token   text NOT NULL,
    pid     int NOT NULL,
    writes  int NOT NULL DEFAULT 1,
    value   text,
    at      float8 NOT NULL DEFAULT extract(epoch FROM clock_timestamp())
);
CREATE INDEX soak_effects_job_idx ON soak_effects (job_id, step);
CREATE SEQUENCE soak_three_tries
"""

#: Plenty: a job meets a SIGKILL or two, the restart and the SIGSTOP at most.
ATTEMPTS = 30

#: Test-only: ``TRIO_JOBS_SOAK_PLANT=NAME`` switches a planted bug on in the worker
#: processes (``soak --plant NAME``), so a test can prove the soak catches it.
_PLANTED = contextlib.ExitStack()
if os.environ.get("TRIO_JOBS_SOAK_PLANT"):
    _PLANTED.enter_context(planted(os.environ["TRIO_JOBS_SOAK_PLANT"]))


@attrs.frozen
class Item:
    """One soak job: ``key`` (its idempotency key); the pauses derive from it."""

    key: str


def pauses(key: str) -> tuple[float, float]:
    """Step one's tail and step three's lead, in seconds: 0-800 ms each,
    derived from the key so a seed gives the same work every run."""
    digest = hashlib.blake2s(key.encode(), digest_size=4).digest()
    return digest[0] / 255 * 0.8, digest[1] / 255 * 0.8


async def _insert(ctx: JobContext[Item], step: int, token: str) -> None:
    async with ctx.jobs.transaction() as tx:
        await tx.execute(
            "INSERT INTO soak_effects (job_id, step, attempt, token, pid) "
            "VALUES (%s, %s, %s, %s, %s)",
            (ctx.job_id, step, ctx.attempt, token, os.getpid()),
        )


@job(
    input=Item,
    tenant="none",
    idempotency_key=lambda i: i.key,
    retry=Retry(attempts=ATTEMPTS, base="50ms", max_delay="1s"),
    name="soak.three_steps",
)
async def three_steps(ctx: JobContext[Item]) -> dict[str, str]:
    """Three steps, each with an effect in ``soak_effects``."""
    tail, lead = pauses(ctx.input.key)

    async def one() -> dict[str, object]:
        token = uuid.uuid4().hex
        await _insert(ctx, 1, token)  # committed now, before the record
        await trio.sleep(tail)
        return {"token": token, "attempt": ctx.attempt}

    async def two() -> dict[str, object]:
        token = uuid.uuid4().hex
        await _insert(ctx, 2, token)
        return {"token": token, "attempt": ctx.attempt}

    async def three(tx: Any) -> dict[str, object]:
        # Counts every try, rolled back or not (a sequence is not transactional).
        await tx.execute("SELECT nextval('soak_three_tries')")
        token = uuid.uuid4().hex
        await tx.execute(
            "INSERT INTO soak_effects (job_id, step, attempt, token, pid, value) "
            "VALUES (%s, 3, %s, %s, %s, %s)",
            (ctx.job_id, ctx.attempt, token, os.getpid(), ctx.input.key),
        )
        await trio.sleep(lead)  # written, not committed: a crash here rolls it back
        return {"token": token, "attempt": ctx.attempt}

    first = await ctx.step.run("one", one)
    second = await ctx.step.run("two", two, once=True)
    third = await ctx.step.transaction("three", three)
    return {"one": first["token"], "two": second["token"], "three": third["token"]}


jobs = [three_steps]
