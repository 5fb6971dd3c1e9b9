"""Structured logs: the events trio-jobs emits, and a JSON-lines renderer for them.

trio-jobs logs through the standard library, on the ``trio_jobs`` logger (and
its children ``trio_jobs.postgres``, ``trio_jobs.outbox``, ...). Every record
carries its event name (``jobs.lease.lost``) as ``record.event`` and its fields
as attributes of the record (``record.job_id``); :data:`EVENTS` lists them.
The record's message is one line that says it all, for an app that configured
no logging (Python prints warnings bare) or a plain ``basicConfig``::

    jobs.job.dead-lettered: job charge 6b63347c (attempt 3): failed for good and is dead-lettered; `trio-jobs show 6b63347c`, then `trio-jobs retry 6b63347c` — X_JOB_MAX_ATTEMPTS: RuntimeError: card declined (queue=default, worker_id=…)

An event about one job carries ``job_id``, ``job`` (its name), ``attempt`` and
``code`` (``null`` for an exception without one), and ``error``: the first line
of the error's message, at most 200 characters, for a job not declared
``sensitive`` (never for a sensitive one), with any payload value, idempotency
key or concurrency key that line quotes replaced by ``[redacted]``. No record
carries a payload value, and an exception rendered with a record shows its type
and frames, never its message.

>>> import trio_jobs.logging
>>> trio_jobs.logging.configure(json=True)      # one JSON object a line, on stderr
{"ts":"2026-11-29T19:49:11.123Z","level":"error","logger":"trio_jobs","event":"jobs.lease.lost","job_id":"…","job":"charge","attempt":2,"queue":"default","code":"X_JOB_LEASE_LOST","worker_id":"…"}
"""

from __future__ import annotations

import logging
import string
import sys
import traceback
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import IO, Any

import orjson

__all__ = [
    "EVENTS",
    "JOB_FIELDS",
    "SUMMARIES",
    "JsonFormatter",
    "TextFormatter",
    "configure",
    "emit",
    "error_line",
    "fields_of",
    "summary",
]

#: The fields every event about one job carries (``code`` may be ``None``: an
#: exception without one).
JOB_FIELDS: tuple[str, ...] = ("job_id", "job", "attempt", "code")

#: Every event trio-jobs logs: ``name -> (level, fields, meaning)``. The
#: events about one job carry :data:`JOB_FIELDS` among their fields.
EVENTS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "jobs.lease.lost": (
        "error",
        ("job_id", "job", "attempt", "code", "queue", "worker_id"),
        "a whole visibility window passed with no renewal landing: another worker may "
        "now run the job too (also one point on job_leases_lost_total{queue}); alert on any",
    ),
    "jobs.heartbeat.failed": (
        "warning",
        ("job_id", "job", "attempt", "code", "worker_id", "cause"),
        "one renewal failed or hung; the window still has room for the next",
    ),
    "jobs.heartbeat.retry": (
        "warning",
        ("worker_id", "jobs", "code", "retry", "retry_in"),
        "one batched renewal of `jobs` leases met a transient driver failure "
        "(X_DRIVER_UNAVAILABLE, X_DRIVER_CONFLICT): retry number `retry` follows in "
        "`retry_in` seconds, within the heartbeat's budget (the interval, and the first lease "
        "window to close)",
    ),
    "jobs.timeout.abandoned": (
        "warning",
        ("job_id", "job", "attempt", "code", "how"),
        "a body ignored its abort (timeout, drain, lost lease) and ended anyway; its lease "
        "lapses and the queue redelivers it",
    ),
    "jobs.drain.abandoned": (
        "warning",
        ("job_id", "job", "attempt", "code"),
        "a body still running at the drain deadline; its lease lapses and the attempt counts",
    ),
    "jobs.settle.unowned": (
        "warning",
        ("job_id", "job", "attempt", "code", "worker_id"),
        "a settle (ack/nack) did not land: the claim is no longer this worker's",
    ),
    "jobs.settle.failed": (
        "error",
        ("code", "worker_id"),
        "the driver failed a settle write (jobs.settle.unowned then names the job)",
    ),
    "jobs.settle.retry": (
        "warning",
        ("job_id", "job", "attempt", "code", "worker_id", "write", "retry", "retry_in"),
        "a settle (write: ack or nack) met a driver that is briefly unavailable "
        "(X_DRIVER_UNAVAILABLE): retry number `retry` follows in `retry_in` seconds, within "
        "the 10 s write budget and while the lease holds; jobs.settle.failed if it never lands",
    ),
    "jobs.step.retry": (
        "warning",
        ("job_id", "job", "attempt", "code", "worker_id", "retry", "retry_in"),
        "a step record, step.transaction's transaction, an event poll or a rate limiter's "
        "acquire met a transient driver "
        "failure (X_DRIVER_UNAVAILABLE, X_DRIVER_CONFLICT): retry number `retry` follows in "
        "`retry_in` seconds, within the write budget and while the lease holds; past the budget "
        "the run is handed back uncounted (jobs.attempt.faulted), never failed",
    ),
    "jobs.claim.orphans-released": (
        "warning",
        ("worker_id", "count", "code"),
        "a claim failed after it may have committed (its answer was lost with the connection): "
        "the `count` rows it took, running under this worker unknown to it, went back to the "
        "queue with the attempt uncounted (code X_DRIVER_UNAVAILABLE in last_error)",
    ),
    "jobs.claim.exhausted": (
        "warning",
        ("job_id", "job", "attempt", "code", "error", "queue", "worker_id"),
        "a lease lapsed on the row's final attempt: the claim buried it dead (or failed)",
    ),
    "jobs.attempt.retried": (
        "info",
        ("job_id", "job", "attempt", "code", "error", "queue", "worker_id"),
        "an attempt failed and the run goes back to the queue after its backoff (code: the "
        "failure's X_* code, null for an exception without one; error: the first line of its "
        "message, e.g. `RuntimeError: card declined`)",
    ),
    "jobs.attempt.deferred": (
        "info",
        ("job_id", "job", "attempt", "code", "retry_in", "queue", "worker_id"),
        "a rate limit refused the run (X_RATE_LIMITED: a rate_limiter's acquire in the body, "
        "or the worker's rate_per_tenant before the body started): it goes back to the queue "
        "for `retry_in` seconds with the attempt uncounted, never dead-lettered for waiting",
    ),
    "jobs.attempt.faulted": (
        "warning",
        ("job_id", "job", "attempt", "code", "error", "queue", "worker_id"),
        "the library's own statements for a run (a step record, step.transaction's "
        "transaction, an event poll) met an infrastructure fault (X_DRIVER_UNAVAILABLE: a lost "
        "connection, a restart; X_DRIVER_CONFLICT: a deadlock, a serialization failure) and "
        "still failed after their retries: the run goes back to the queue with the attempt "
        "uncounted and the code in last_error",
    ),
    "jobs.job.dead-lettered": (
        "warning",
        ("job_id", "job", "attempt", "code", "error", "queue", "worker_id"),
        "a run failed for good and is dead-lettered (X_JOB_MAX_ATTEMPTS when its last "
        "error had no code); `trio-jobs show ID`, then `trio-jobs retry ID`",
    ),
    "jobs.job.failed": (
        "warning",
        ("job_id", "job", "attempt", "code", "error", "queue", "worker_id"),
        "a run ended failed: dropped (dead_letter=False) or refused (X_JOB_KEY_BUSY)",
    ),
    "jobs.claim.failed": (
        "warning",
        ("code", "worker_id"),
        "a claim statement failed; the worker backs off and polls again",
    ),
    "jobs.on_settled.failed": (
        "error",
        ("job_id", "job", "attempt", "code", "cause"),
        "an on_settled hook failed three times (X_JOB_ON_SETTLED_FAILED); the row is untouched",
    ),
    "jobs.worker.slot-failed": (
        "error",
        ("job_id", "job", "attempt"),
        "an internal error in a slot (a bug): the job's lease lapses and it is redelivered",
    ),
    "jobs.observer.failed": (
        "warning",
        ("method", "cause"),
        "a WorkerObserver (metrics sink) raised; logged once per method, the job is unaffected",
    ),
    "jobs.wake.live": (
        "info",
        ("channel",),
        "the LISTEN wake is proven: idle workers poll every 5 s at most",
    ),
    "jobs.wake.unverified": (
        "warning",
        ("channel", "hint"),
        "a probe never came back on the LISTEN session (PgBouncer in transaction mode?); "
        "the 2 s poll ceiling stays",
    ),
    "jobs.wake.reconnect": ("warning", ("retry_in",), "the LISTEN session could not connect"),
    "jobs.driver.unavailable": (
        "warning",
        ("code", "sqlstate", "hint"),
        "PostgreSQL (or the pooler in front of it) stopped taking statements: logged once "
        "an outage, however many statements fail",
    ),
    "jobs.driver.recovered": (
        "info",
        ("down_for", "failed_calls"),
        "statements succeed again, none failing for a second: the outage is over",
    ),
    "jobs.wake.lost": ("warning", (), "the LISTEN session dropped; the poll covers the gap"),
    "jobs.outbox.publish-failed": (
        "error",
        (
            "job_id",
            "job",
            "attempt",
            "code",
            "row_id",
            "seq",
            "attempts",
            "published",
            "released",
            "held_for",
        ),
        "the relay could not publish a staged row; it names the poison row and keeps order",
    ),
    "jobs.outbox.relay-failed": ("warning", ("code",), "a relay pass failed; it backs off"),
    "jobs.outbox.purge-failed": ("warning", ("code",), "purging published outbox rows failed"),
    "jobs.purge.done": ("info", ("removed",), "retention removed expired terminal rows"),
    "jobs.purge.failed": ("warning", ("code",), "a retention pass failed"),
    "jobs.purge.unsupported": ("warning", ("driver",), "the driver cannot purge"),
    "jobs.worker.ready": (
        "info",
        ("worker_id", "pid", "queues", "slots", "jobs", "database"),
        "`trio-jobs worker` is claiming (database: where the DSN came from, never the DSN)",
    ),
    "jobs.worker.draining": (
        "info",
        ("signal", "in_flight"),
        "`trio-jobs worker` got SIGTERM/SIGINT: it stops claiming and aborts held jobs",
    ),
    "jobs.worker.drained": (
        "info",
        ("worker_id", "done", "retried", "dead_lettered", "drained", "abandoned"),
        "`trio-jobs worker` drained and exits 0",
    ),
    "jobs.worker.abandoned": (
        "warning",
        ("worker_id", "reason", "in_flight"),
        "`trio-jobs worker` gave up on held jobs (second signal or drain deadline) and exits 3",
    ),
    "jobs.worker.orphaned": (
        "warning",
        ("pid",),
        "a `--processes` child found its supervisor gone (killed, or crashed): it drains itself "
        "as on SIGTERM",
    ),
    "jobs.supervisor.started": (
        "info",
        ("pid", "processes"),
        "`trio-jobs worker --processes N` starts its N children",
    ),
    "jobs.supervisor.child-started": (
        "info",
        ("slot", "pid"),
        "a child worker process started in slot `slot` (0 to N-1)",
    ),
    "jobs.supervisor.child-exited": (
        "warning",
        ("slot", "pid", "worker_id", "exit_code", "signal", "code", "uptime", "restart_in"),
        "a child ended while the supervisor was not draining (exit_code, or the signal that "
        "killed it; code: its refusal's X_* code, if it sent one); it restarts in `restart_in` "
        "seconds (0.5 s doubling to 30 s, back to 0.5 s after a minute up)",
    ),
    "jobs.supervisor.child-restarted": (
        "info",
        ("slot", "pid", "previous_pid", "restarts"),
        "a replacement child started (restarts: how many so far, every slot)",
    ),
    "jobs.supervisor.child-refused": (
        "error",
        ("slot", "pid", "exit_code", "signal", "code", "refusals"),
        "a child refused its configuration before it was ready (exit 1 or 2), before any child "
        "was ready or for the 3rd time in a row: the others drain and the supervisor exits with "
        "its code, printing the refusal",
    ),
    "jobs.supervisor.draining": (
        "info",
        ("reason", "children"),
        "the supervisor got SIGTERM/SIGINT (or a child refused: reason=child-refused) and "
        "forwarded SIGTERM to every child, which drains itself",
    ),
    "jobs.supervisor.abandoning": (
        "warning",
        ("reason", "children"),
        "a second signal, forwarded: the children abandon their held jobs at once (exit 3)",
    ),
    "jobs.supervisor.child-killed": (
        "warning",
        ("slot", "pid", "waited"),
        "a child still running `waited` seconds after the drain began (its drain deadline, plus "
        "grace) was SIGKILLed; its leases lapse",
    ),
    "jobs.supervisor.stopped": (
        "info",
        ("outcome", "exit_code", "restarts"),
        "every child has exited: outcome drained (exit 0), abandoned (3) or refused (the child's "
        "code)",
    ),
    "jobs.queue.unknown": (
        "warning",
        ("queue", "command"),
        "a command named a queue no job declares and no job is in (`trio-jobs pause`, "
        "`trio-jobs worker --queues`): a typo pauses or serves nothing; it is done all the same",
    ),
    "jobs.task.leading": (
        "info",
        ("task", "leader"),
        "this process's scheduler took a task's lease: it fires the task's occurrences now "
        "(the previous leader stopped, died or never was)",
    ),
    "jobs.task.fired": (
        "info",
        ("task", "occurrences", "leader"),
        "the leader fired occurrences of a task: their runs and its watermark landed together",
    ),
    "jobs.task.catch-up-capped": (
        "warning",
        ("task", "fired", "hint"),
        "more than 1,000 occurrences of a catch_up='all' task fell due while nothing fired "
        "them: the newest 1,000 fired, the older ones were skipped",
    ),
    "jobs.task.store-failed": (
        "warning",
        ("code", "leader"),
        "a scheduler's lease renewal or fire failed (the store is away); it tries again "
        "within a second, backing off to the renewal interval",
    ),
    "jobs.consumer.lag-failed": (
        "warning",
        ("job_id", "job", "error_type", "code", "hint"),
        "a consumer's lag(key, cursor) raised (error_type, code) or answered no count: the "
        "batch is committed all the same, and the run's progress keeps its last lag",
    ),
    "jobs.dev.database": ("info", ("database",), "`trio-jobs dev` picked its database"),
    "jobs.dev.serving": ("warning", ("note", "worker_id"), "`trio-jobs dev --serve` keeps running"),
    "jobs.webhook.refused": (
        "info",
        ("receiver", "status", "code", "cause"),
        "a webhook receiver's door refused a request (body too large, signature, verify, "
        "event id, method): nothing was queued; cause names the exception's type, never "
        "its message or anything of the request",
    ),
    "jobs.webhook.failed": (
        "error",
        ("receiver", "status", "code", "cause"),
        "a webhook receiver could not take an event: its enqueue failed (503, the vendor "
        "redelivers) or it is misconfigured (500); nothing was queued",
    ),
    "jobs.dashboard.action": (
        "info",
        ("action", "job_id", "queue", "client", "code"),
        "an operator acted from the dashboard (code: the refusal, when refused)",
    ),
}

#: What happened, in words, per event: the middle of the record's one-line
#: message (:func:`summary`). ``{field}`` is the event's field, ``{short}`` the
#: first 8 characters of ``job_id`` (what ``trio-jobs show`` takes).
SUMMARIES: dict[str, str] = {
    "jobs.lease.lost": "its lease lapsed with no renewal landing; another worker may run it too",
    "jobs.heartbeat.failed": "a lease renewal failed ({cause}); the next one may still land",
    "jobs.heartbeat.retry": (
        "renewing {jobs} lease(s) met a transient driver failure; retry {retry} in {retry_in}s"
    ),
    "jobs.timeout.abandoned": (
        "its body ignored its abort and ended anyway ({how}); the queue redelivers it"
    ),
    "jobs.drain.abandoned": (
        "still running at the drain deadline: abandoned; its lease lapses and the attempt counts"
    ),
    "jobs.settle.unowned": "its settle did not land: the claim is no longer this worker's",
    "jobs.settle.failed": "the driver failed a settle write",
    "jobs.settle.retry": "its {write} met an unavailable driver; retry {retry} in {retry_in}s",
    "jobs.step.retry": "a step write met a transient driver failure; retry {retry} in {retry_in}s",
    "jobs.claim.orphans-released": (
        "{count} job(s) a claim took while its answer was lost went back to the queue, "
        "their attempt uncounted"
    ),
    "jobs.claim.exhausted": "its lease lapsed on its final attempt; the claim buried it",
    "jobs.attempt.retried": "failed; it runs again after its backoff",
    "jobs.attempt.deferred": "rate limited; runs again in {retry_in}s, the attempt uncounted",
    "jobs.attempt.faulted": (
        "met an infrastructure fault; handed back to the queue with the attempt uncounted"
    ),
    "jobs.job.dead-lettered": (
        "failed for good and is dead-lettered; `trio-jobs show {short}`, then "
        "`trio-jobs retry {short}`"
    ),
    "jobs.job.failed": "ended failed (dropped, or refused)",
    "jobs.claim.failed": "a claim failed; the worker backs off and polls again",
    "jobs.on_settled.failed": (
        "its on_settled hook failed three times ({cause}); the row is untouched"
    ),
    "jobs.worker.slot-failed": (
        "an internal error in its slot (a bug); its lease lapses and it is redelivered"
    ),
    "jobs.observer.failed": "a WorkerObserver raised in {method} ({cause}); the job is unaffected",
    "jobs.wake.live": "the wake on {channel} is proven: idle workers poll every 5 s at most",
    "jobs.wake.unverified": "a wake probe on {channel} never came back; the 2 s poll ceiling stays",
    "jobs.wake.reconnect": "the wake session could not connect; retrying in {retry_in}s",
    "jobs.driver.unavailable": (
        "PostgreSQL stopped taking statements ({code}, SQLSTATE {sqlstate}); "
        "logged once an outage: {hint}"
    ),
    "jobs.driver.recovered": (
        "PostgreSQL takes statements again after {down_for}s; {failed_calls} calls failed meanwhile"
    ),
    "jobs.wake.lost": "the wake session dropped; polling covers the gap",
    "jobs.outbox.publish-failed": "the outbox relay could not publish its staged row {row_id}",
    "jobs.outbox.relay-failed": "an outbox relay pass failed; it backs off",
    "jobs.outbox.purge-failed": "purging published outbox rows failed",
    "jobs.purge.done": "retention removed {removed} expired job(s)",
    "jobs.purge.failed": "a retention pass failed",
    "jobs.purge.unsupported": "the {driver} driver cannot purge expired jobs",
    "jobs.worker.ready": "worker {worker_id} is claiming from {queues} (slots {slots})",
    "jobs.worker.draining": "got {signal}: stops claiming and drains {in_flight} held job(s)",
    "jobs.worker.drained": "worker {worker_id} drained",
    "jobs.worker.abandoned": "worker {worker_id} gave up on its held jobs ({reason})",
    "jobs.worker.orphaned": "its supervisor is gone: the worker drains itself",
    "jobs.supervisor.started": "the supervisor starts {processes} worker process(es)",
    "jobs.supervisor.child-started": "worker process {pid} started in slot {slot}",
    "jobs.supervisor.child-exited": (
        "worker process {pid} in slot {slot} ended; it restarts in {restart_in}s"
    ),
    "jobs.supervisor.child-restarted": "worker process {pid} replaced {previous_pid}",
    "jobs.supervisor.child-refused": (
        "worker process {pid} in slot {slot} refused its configuration; stopping them all"
    ),
    "jobs.supervisor.draining": "draining {children} worker process(es) ({reason})",
    "jobs.supervisor.abandoning": (
        "a second signal: {children} worker process(es) abandon their jobs ({reason})"
    ),
    "jobs.supervisor.child-killed": (
        "worker process {pid} in slot {slot} still ran {waited}s into the drain: killed"
    ),
    "jobs.supervisor.stopped": "every worker process has exited: {outcome}",
    "jobs.task.leading": "this process leads task {task} now",
    "jobs.consumer.lag-failed": "consumer {job}: lag() gave no count; the batch is committed",
    "jobs.task.fired": "task {task}: {occurrences} occurrence(s) fired",
    "jobs.task.catch-up-capped": (
        "task {task}: more than 1,000 occurrences fell due; the newest {fired} fired, the "
        "older ones were skipped"
    ),
    "jobs.task.store-failed": (
        "the scheduler's call to the task store failed; it tries again shortly"
    ),
    "jobs.dev.database": "`trio-jobs dev` uses {database}",
    "jobs.dev.serving": "{note}",
    "jobs.dashboard.action": "an operator acted from the dashboard: {action}",
    "jobs.webhook.refused": "receiver {receiver} answered {status}: nothing was queued",
    "jobs.webhook.failed": (
        "receiver {receiver} answered {status}: nothing was queued; the vendor redelivers"
    ),
    "jobs.queue.unknown": (
        "no job declares queue {queue} and no job is in it; check its name "
        "(`trio-jobs stats` lists the queues)"
    ),
}

#: How much of an error's first line a record carries.
ERROR_LINE_MAX = 200
#: A payload string shorter than this is not looked for in an error line (a
#: two-letter value would redact half the line).
_REDACT_MIN = 4
_REDACTED = "[redacted]"
_FORMAT = string.Formatter()


def error_line(message: str | None, *, redact: Iterable[Any] = ()) -> str | None:
    """The first line of an error message, at most :data:`ERROR_LINE_MAX`
    characters, for a log record: every string (and number) found in
    ``redact``, a job's payload and keys as stored, that the line quotes is
    replaced by ``[redacted]``. ``None`` for no message."""
    if message is None:
        return None
    line = message.strip().splitlines()[0] if message.strip() else ""
    secrets = sorted({v for v in _leaves(redact) if len(v) >= _REDACT_MIN}, key=len, reverse=True)
    for secret in secrets:
        if secret in line:
            line = line.replace(secret, _REDACTED)
    if len(line) > ERROR_LINE_MAX:
        line = line[: ERROR_LINE_MAX - 1] + "…"
    return line or None


def _leaves(value: Any) -> Iterable[str]:
    """The string and number leaves of a JSON form (and their keys' values)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int | float):
            yield str(item)
        elif isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            stack.extend(item)


def summary(event: str, fields: Mapping[str, Any]) -> str:
    """The one-line message of an event: ``event: [job NAME SHORT_ID (attempt
    N): ]what happened[ — CODE: the error's first line][ (other fields)]``.

    >>> summary("jobs.attempt.retried", {"job_id": "6b63347c-1d2c-...", "job": "charge",
    ...     "attempt": 1, "code": None, "error": "RuntimeError: card declined"})
    'jobs.attempt.retried: job charge 6b63347c (attempt 1): failed; it runs again after its backoff — RuntimeError: card declined'
    """
    fields = dict(fields)
    used = {"job_id", "job", "attempt", "code", "error"}
    head = event
    job_id = fields.get("job_id")
    short = str(job_id)[:8] if job_id else ""
    if job_id:
        name = fields.get("job")
        head += f": job {name} {short}" if name else f": job {short}"
        if fields.get("attempt") is not None:
            head += f" (attempt {fields['attempt']})"
    template = SUMMARIES.get(event)
    what = ""
    if template is not None:
        try:
            names = {f for _text, f, _spec, _conv in _FORMAT.parse(template) if f}
            what = template.format_map({**fields, "short": short})
            used |= names
        except (KeyError, ValueError, IndexError, AttributeError):
            what = ""  # a field the template names is missing: the fields say it below
    line = head + (f": {what}" if what else "")
    code, error = fields.get("code"), fields.get("error")
    if error:
        line += f" — {error}" if code is None or str(code) in str(error) else f" — {code}: {error}"
    elif code is not None:
        line += f" — {code}"
    rest = [f"{k}={v}" for k, v in fields.items() if k not in used and v is not None]
    if rest:
        line += " (" + ", ".join(rest) + ")"
    return line


def emit(
    logger: logging.Logger, level: int, event: str, *, exc_info: bool = False, **fields: Any
) -> None:
    """Log ``event`` on ``logger``: its fields as the record's attributes (and
    ``record.event``), its message the one line :func:`summary` makes of them,
    so a record printed without any configuration still says which job, what
    happened and why. ``exc_info``: attach the exception being handled (its
    type and frames are rendered, never its message)."""
    if logger.isEnabledFor(level):
        logger.log(
            level, summary(event, fields), extra={"event": event, **fields}, exc_info=exc_info
        )


_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """A record's structured fields: what the call site passed in ``extra``."""
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD and k != "event"}


def _event(record: logging.LogRecord) -> str:
    event = record.__dict__.get("event")
    return event if isinstance(event, str) else record.getMessage()


def _frames(record: logging.LogRecord) -> str | None:
    # The frames and the type, never the message: an exception's text may quote job data.
    if not record.exc_info or record.exc_info[0] is None:
        return None
    etype, _value, tb = record.exc_info
    return "".join(traceback.format_tb(tb)) + f"{etype.__name__} (message withheld)"


def _timestamp(record: logging.LogRecord) -> str:
    moment = datetime.fromtimestamp(record.created, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ``ts``, ``level``, ``logger``, ``event``, then the
    event's fields. An exception is rendered as its type and frames only."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": _event(record),
        }
        for key, value in fields_of(record).items():
            out.setdefault(key, value)
        frames = _frames(record)
        if frames is not None and record.exc_info and record.exc_info[0] is not None:
            out["exception"] = record.exc_info[0].__name__
            out["traceback"] = frames
        return orjson.dumps(out, default=str).decode()


class TextFormatter(logging.Formatter):
    """``HH:MM:SS level event key=value ...`` for a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        moment = datetime.fromtimestamp(record.created, tz=UTC)
        fields = " ".join(f"{k}={v}" for k, v in fields_of(record).items())
        line = f"{moment:%H:%M:%S} {record.levelname.lower():7} {_event(record)}"
        if fields:
            line += " " + fields
        frames = _frames(record)
        if frames is not None:
            line += "\n" + frames
        return line


def configure(
    *,
    json: bool = True,
    level: int | str = logging.INFO,
    stream: IO[str] | None = None,
    logger: str = "trio_jobs",
) -> logging.Handler:
    """Render trio-jobs' events on ``stream`` (stderr by default), as JSON lines
    (``json=True``) or as text, and answer the handler.

    It configures the ``trio_jobs`` logger only (children included) and stops
    its records from also reaching the root logger, so they are not printed
    twice; the rest of the app's logging is untouched. Calling it again
    replaces the handler it installed.
    """
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if json else TextFormatter())
    handler.set_name("trio_jobs.logging")
    target = logging.getLogger(logger)
    target.handlers[:] = [h for h in target.handlers if h.get_name() != "trio_jobs.logging"]
    target.addHandler(handler)
    target.setLevel(level)
    target.propagate = False
    return handler
