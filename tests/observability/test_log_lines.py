"""Each log line says which job (its name and short id), what happened, and the
error's code and first line, whether the app configured logging or not: an
unconfigured app sees the record's message (Python prints warnings bare), a
``basicConfig`` app ``LEVEL:logger:message``, and ``configure(json=True)``
the fields. A sensitive job's line carries no error text, and no line carries
a payload value, even one the error's message quotes."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import textwrap
from typing import Any

import attrs
import orjson

import trio_jobs.logging as tj_logging
from jobs_support import jobs_on_memory, running_worker, wait_state
from trio_jobs import JobContext, JobsError, Retry, job

SECRET = "tok_live_SECRET_42"

SCRIPT = textwrap.dedent(
    """
    import logging, sys
    import attrs, trio
    from trio_jobs import JobContext, Retry, Worker, job, memory_driver, open_jobs

    if sys.argv[1] == "basic":
        logging.basicConfig(level=logging.INFO)

    @attrs.frozen
    class Card:
        key: str

    @job(input=Card, idempotency_key=lambda i: f"card:{i.key}", name="charge",
         retry=Retry(attempts=2, base="10ms", jitter=False))
    async def charge(ctx: JobContext[Card]) -> None:
        raise RuntimeError(f"card {ctx.input.key} declined\\nthe gateway said more")

    @job(input=Card, idempotency_key=lambda i: f"hush:{i.key}", name="hush",
         retry=Retry(attempts=1), sensitive=True)
    async def hush(ctx: JobContext[Card]) -> None:
        raise RuntimeError(f"card {ctx.input.key} declined")

    async def main():
        async with open_jobs(memory_driver(), jobs=[charge, hush]) as jobs:
            a = await charge.enqueue(Card(sys.argv[2]))
            b = await hush.enqueue(Card(sys.argv[2]))
            print(a.id, b.id)
            async with trio.open_nursery() as nursery:
                worker = Worker(jobs, poll_interval="10ms")
                await nursery.start(worker.run)
                with trio.fail_after(30):
                    while {(await jobs.show(i)).state for i in (a.id, b.id)} != {"dead"}:
                        await trio.sleep(0.01)
                await worker.drain()

    trio.run(main)
    """
)


def _run(mode: str) -> tuple[list[str], list[str]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode, SECRET],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    )
    return proc.stdout.split(), proc.stderr.splitlines()


def test_without_logging_configured_a_warning_names_the_job_the_outcome_and_the_error() -> None:
    (charge_id, hush_id), lines = _run("bare")
    assert SECRET not in "\n".join(lines)
    dead = [line for line in lines if line.startswith("jobs.job.dead-lettered: ")]
    assert len(dead) == 2, lines
    (charge,) = [line for line in dead if charge_id[:8] in line]
    assert charge.startswith(f"jobs.job.dead-lettered: job charge {charge_id[:8]} (attempt 2): ")
    assert "failed for good and is dead-lettered" in charge
    assert f"`trio-jobs show {charge_id[:8]}`" in charge
    assert "— X_JOB_MAX_ATTEMPTS: RuntimeError: card [redacted] declined" in charge
    assert "the gateway said more" not in charge  # the first line only
    (hush,) = [line for line in dead if hush_id[:8] in line]
    assert f"job hush {hush_id[:8]} (attempt 1)" in hush
    assert "X_JOB_MAX_ATTEMPTS" in hush
    assert "RuntimeError" not in hush  # a sensitive job's error text stays out of the logs


def test_with_basic_config_the_retry_says_why_too() -> None:
    (charge_id, _hush_id), lines = _run("basic")
    retried = [line for line in lines if "jobs.attempt.retried" in line]
    assert len(retried) == 1, lines
    assert retried[0].startswith(
        f"INFO:trio_jobs:jobs.attempt.retried: job charge {charge_id[:8]} (attempt 1): failed; "
        "it runs again after its backoff — RuntimeError: card [redacted] declined"
    )
    assert "None" not in retried[0]
    assert SECRET not in "\n".join(lines)


@attrs.frozen
class Card:
    key: str = SECRET


async def test_the_json_lines_carry_the_job_the_code_and_the_error(autojump_clock: Any) -> None:
    @job(
        input=Card,
        idempotency_key=lambda i: f"card:{i.key}",
        name="json.charge",
        retry=Retry(attempts=2),
    )
    async def charge(ctx: JobContext[Card]) -> None:
        if ctx.attempt == 1:
            raise RuntimeError(f"declined {ctx.input.key}")
        raise JobsError("X_GATEWAY_BUSY", "the gateway is busy\nretry later")

    @job(
        input=Card,
        idempotency_key=lambda i: f"hush:{i.key}",
        name="json.hush",
        retry=Retry(attempts=1),
        sensitive=True,
    )
    async def hush(ctx: JobContext[Card]) -> None:
        raise RuntimeError("the card number was wrong")

    out = io.StringIO()
    tj_logging.configure(json=True, stream=out)
    async with jobs_on_memory([charge, hush]) as (jobs, _driver):
        a = await charge.enqueue(Card())
        b = await hush.enqueue(Card())
        async with running_worker(jobs):
            await wait_state(jobs, a.id, "dead")
            await wait_state(jobs, b.id, "dead")
    lines = [orjson.loads(line) for line in out.getvalue().splitlines()]
    assert SECRET not in out.getvalue()
    by = {(line["event"], line.get("job_id")): line for line in lines}
    retried = by[("jobs.attempt.retried", a.id)]
    assert (retried["job"], retried["attempt"], retried["code"]) == ("json.charge", 1, None)
    assert retried["error"] == "RuntimeError: declined [redacted]"
    dead = by[("jobs.job.dead-lettered", a.id)]
    assert (dead["job"], dead["attempt"], dead["code"]) == ("json.charge", 2, "X_GATEWAY_BUSY")
    assert dead["error"] == "X_GATEWAY_BUSY: the gateway is busy"
    hushed = by[("jobs.job.dead-lettered", b.id)]
    assert (hushed["job"], hushed["code"]) == ("json.hush", "X_JOB_MAX_ATTEMPTS")
    assert hushed["error"] is None
    assert "card number" not in out.getvalue()


# --------------------------------------------------------------------------- the one line


def test_every_catalogued_event_says_what_happened_in_words() -> None:
    assert set(tj_logging.SUMMARIES) == set(tj_logging.EVENTS)
    for event, (_level, fields, _meaning) in tj_logging.EVENTS.items():
        values = {f: f"<{f}>" for f in fields}
        if "job_id" in values:
            values["job_id"] = "6b63347c-1d2c-4c3b-9a8e-7f6d5c4b3a21"
        line = tj_logging.summary(event, values)
        assert line.startswith(event + ": "), line
        assert "{" not in line, line  # every placeholder filled
        for field in fields:
            # every field said, in the sentence or after it (job_id as its short form)
            assert ("6b63347c" if field == "job_id" else f"<{field}>") in line, (event, field)


def test_the_line_puts_the_code_before_an_error_that_lacks_it_and_survives_a_missing_field() -> (
    None
):
    fields = {"job_id": "0191c6a2-6c1e-7a3b-9f0e-000000000001", "job": "charge", "attempt": 3}
    assert tj_logging.summary(
        "jobs.job.failed", {**fields, "code": "X_JOB_KEY_BUSY", "error": "the key is busy"}
    ) == (
        "jobs.job.failed: job charge 0191c6a2 (attempt 3): ended failed (dropped, or refused)"
        " — X_JOB_KEY_BUSY: the key is busy"
    )
    said = tj_logging.summary(
        "jobs.job.failed", {**fields, "code": "X_JOB_KEY_BUSY", "error": "X_JOB_KEY_BUSY: busy"}
    )
    assert said.endswith(" — X_JOB_KEY_BUSY: busy")
    # a template field the call site left out: the line still renders, fields after it
    assert tj_logging.summary("jobs.heartbeat.failed", {**fields, "queue": "q"}).endswith(
        "(attempt 3) (queue=q)"
    )
    assert tj_logging.summary("jobs.custom.thing", {"n": 1}) == "jobs.custom.thing (n=1)"


def test_the_error_line_is_the_first_line_bounded_with_payload_values_redacted() -> None:
    line = tj_logging.error_line(
        f"RuntimeError: {SECRET} and 12345678 failed\nsecond",
        redact=[{"card": SECRET, "n": 12345678, "ok": True, "tiny": "ab"}, "key:1"],
    )
    assert line == "RuntimeError: [redacted] and [redacted] failed"
    assert tj_logging.error_line("x" * 500) == "x" * 199 + "…"
    assert tj_logging.error_line(None) is None
    assert tj_logging.error_line("  \n") is None


def test_emit_keeps_the_event_and_the_fields_on_the_record(caplog: Any) -> None:
    logger = logging.getLogger("trio_jobs.test")
    tj_logging.emit(logger, logging.WARNING, "jobs.queue.unknown", queue="emials", command="pause")
    (record,) = [r for r in caplog.records if r.name == "trio_jobs.test"]
    assert record.event == "jobs.queue.unknown"  # type: ignore[attr-defined]
    assert (record.queue, record.command) == ("emials", "pause")  # type: ignore[attr-defined]
    assert record.getMessage().startswith(
        "jobs.queue.unknown: no job declares queue emials and no job is in it"
    )
