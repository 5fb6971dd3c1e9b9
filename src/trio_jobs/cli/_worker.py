"""``trio-jobs worker MODULE[:ATTR]``: a worker process, drained by SIGTERM.

The first SIGTERM (or Ctrl-C) stops claiming and aborts every held job's
``ctx.signal`` with ``X_DRAINING``; a body that unwinds is handed back with the
attempt uncounted, and the process exits 0 once drained. A second signal, or a
drain that outlasts ``--drain-timeout`` (plus a short grace for the hand-back
writes), abandons the jobs still held: the logs are flushed and the process
exits ``3`` at once; their leases lapse and the queue redelivers them (the
attempt is counted).

Under ``--processes N`` (``_supervise.py``) the worker is one of N children: it
tells its supervisor when it is ready, why it refused and what it did, and
drains itself if the supervisor goes away.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .._declare import Job
from ._args import check_queue, check_target
from ._common import (
    EXIT_ABANDONED,
    _checked,
    config_error,
    flush_logs,
    log_event,
    resolve_database,
)

if TYPE_CHECKING:
    from ._supervise import ChildLink

__all__ = [
    "WorkerOptions",
    "check_settings",
    "load_jobs",
    "parse_concurrency",
    "parse_queues",
    "parse_rate",
    "serve",
]

#: How long past ``--drain-timeout`` the hand-back writes may take before the
#: process abandons what it still holds.
DRAIN_GRACE = 3.0


def load_jobs(target: str) -> list[Job[Any, Any]]:
    """The jobs ``MODULE[:ATTR]`` names: ``ATTR`` (a job or a list of jobs), or
    every job handle at the module's top level. The current folder is importable."""
    module_name, attr = check_target(target)
    here = str(Path.cwd())
    if here not in sys.path:
        sys.path.insert(0, here)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise config_error(
            f"could not import {module_name!r} ({type(exc).__name__}: {exc}); run from the folder "
            "that holds it, or put it on PYTHONPATH"
        ) from None
    except Exception as exc:
        raise config_error(
            f"importing {module_name!r} raised {type(exc).__name__}; run "
            f'`python -c "import {module_name}"` to see the traceback'
        ) from None
    found: list[Job[Any, Any]] = []
    if attr:
        obj: Any = module
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise config_error(f"{module_name} has no attribute {attr!r}")
            obj = getattr(obj, part)
        if isinstance(obj, Job):
            found = [obj]
        elif isinstance(obj, list | tuple | set | frozenset):
            # A collection, never any iterable: iterating a stream or a
            # generator would read it, or never end.
            items = list(obj)
            if not items or not all(isinstance(h, Job) for h in items):
                raise config_error(f"{target} must be a job or a non-empty list of jobs")
            found = items
        else:
            raise config_error(f"{target} must be a job or a list of jobs")
    else:
        seen: set[int] = set()
        for value in vars(module).values():
            if isinstance(value, Job) and id(value) not in seen:
                seen.add(id(value))
                found.append(value)
        if not found:
            raise config_error(
                f"{module_name} has no job at its top level; name a list with {module_name}:ATTR"
            )
    return found


def parse_queues(text: str | None) -> list[str] | None:
    """``--queues q1,q2`` (``None``: every queue the jobs declare)."""
    if text is None:
        return None
    queues = [q.strip() for q in text.split(",") if q.strip()]
    if not queues:
        raise config_error(
            "--queues names no queue; pass q1,q2, or leave it out for every queue the jobs declare"
        )
    for queue in queues:
        check_queue(queue, "--queues")
    return list(dict.fromkeys(queues))


def parse_concurrency(text: str) -> int | dict[str, int]:
    """``N`` (every served queue), or ``q1=N,q2=M``. ``int`` allows the ASCII
    spaces around a number, not a control character (which ``str.strip`` would
    quietly drop: ``"1\x1f"`` is refused, not read as 1)."""
    if "=" not in text:
        try:
            return int(text)
        except ValueError:
            raise config_error("--concurrency is N or q1=N,q2=M with whole numbers") from None
    out: dict[str, int] = {}
    for part in text.split(","):
        queue, _, n = part.partition("=")
        queue = queue.strip()
        try:
            count = int(n)
        except ValueError:
            raise config_error("--concurrency is N or q1=N,q2=M with whole numbers") from None
        if not queue:
            raise config_error("--concurrency names an empty queue")
        check_queue(queue, "a queue in --concurrency")
        if queue in out:
            raise config_error("--concurrency names a queue twice; give each queue one count")
        out[queue] = count
    return out


def check_settings(opts: WorkerOptions) -> None:
    """Refuse a bad setting before any I/O, with the code ``Worker`` would use."""
    from .._time import parse_duration
    from ..errors import ErrorCode, JobsError

    check_target(opts.target)
    for field in ("visibility_timeout", "drain_timeout", "poll_interval", "idle_poll_max"):
        value = getattr(opts, field)
        if value is not None:
            parse_duration(
                value, field=f"--{field.replace('_', '-')}", allow_zero=field == "drain_timeout"
            )
    slots = opts.concurrency.values() if isinstance(opts.concurrency, dict) else [opts.concurrency]
    if any(n < 1 for n in slots):
        raise config_error("--concurrency must be a whole number, 1 or more, for every queue")
    if isinstance(opts.concurrency, dict) and opts.queues is not None:
        if any(q not in opts.concurrency for q in opts.queues):
            raise config_error(
                "--concurrency q1=N,q2=M must give a count for every queue --queues names"
            )
    if opts.max_in_flight is not None and opts.max_in_flight < 1:
        code = ErrorCode.X_INVARIANT if opts.max_in_flight == 0 else ErrorCode.X_CONFIG_INVALID
        raise JobsError(code, "--max-in-flight must be a whole number, 1 or more")
    from ._supervise import MAX_PROCESSES

    if not 1 <= opts.processes <= MAX_PROCESSES:
        raise config_error(
            f"--processes is how many worker processes to run: a whole number from 1 to "
            f"{MAX_PROCESSES} (1: this process, no supervisor)"
        )


def parse_rate(value: str | None) -> tuple[int, str] | None:
    """``--rate-per-tenant LIMIT/PER`` (``10/1m``): the pair ``Worker(rate_per_tenant=...)``
    takes; ``X_CONFIG_INVALID`` for a value that is not one."""
    from .._rate import tenant_rate
    from ..errors import JobsError

    if value is None:
        return None
    limit, slash, per = value.partition("/")
    limit = limit.strip()
    if not slash or not limit.isascii() or not limit.isdigit():
        raise config_error(
            "--rate-per-tenant is LIMIT/PER: a whole number of starts per tenant and a "
            "duration, e.g. 10/1m"
        )
    rate = (int(limit), per.strip())
    try:
        tenant_rate(rate)
    except JobsError as exc:
        raise config_error(exc.message.replace("rate_per_tenant", "--rate-per-tenant")) from None
    return rate


@attrs.frozen
class WorkerOptions:
    target: str
    queues: list[str] | None
    concurrency: int | dict[str, int]
    max_in_flight: int | None
    visibility_timeout: Any
    drain_timeout: Any
    poll_interval: Any
    idle_poll_max: Any
    purge: bool
    database_url: str | None
    processes: int = 1
    rate_per_tenant: tuple[int, str] | None = None
    listen_database_url: str | None = None


async def serve(opts: WorkerOptions, link: ChildLink | None = None) -> dict[str, Any]:
    """Run the worker until a signal drains it; answers the summary. An abandoned
    drain never returns: the process exits ``EXIT_ABANDONED`` at once. ``link``:
    the supervisor's, when this process is one of ``--processes N``."""
    from .. import Retention, Worker, open_jobs

    # Installed before anything slow: a SIGTERM during startup drains, never kills.
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        handles = load_jobs(opts.target)
        db = await resolve_database(opts.database_url)
        listen = opts.listen_database_url
        if listen is not None:
            listen = _checked(listen, "--listen-database-url")
        driver = db.driver() if listen is None else db.driver(listen_dsn=listen)
        async with open_jobs(driver, jobs=handles) as jobs:
            queues = opts.queues
            if queues is None and isinstance(opts.concurrency, dict):
                queues = list(opts.concurrency)
            await _warn_unknown_queues(jobs, queues, handles)
            worker = Worker(
                jobs,
                queues=queues,
                concurrency=opts.concurrency,
                max_in_flight=opts.max_in_flight,
                visibility_timeout=opts.visibility_timeout,
                drain_timeout=opts.drain_timeout,
                poll_interval=opts.poll_interval,
                idle_poll_max=opts.idle_poll_max,
                rate_per_tenant=opts.rate_per_tenant,
            )
            async with trio.open_nursery() as nursery:
                if link is not None:
                    nursery.start_soon(_orphaned, link)
                await nursery.start(worker.run)
                if opts.purge:
                    await nursery.start(Retention(jobs.driver).run)
                log_event(
                    logging.INFO,
                    "jobs.worker.ready",
                    worker_id=worker.id,
                    pid=os.getpid(),
                    queues=",".join(worker.queues),
                    slots=",".join(f"{q}={n}" for q, n in worker.slots.items()),
                    jobs=len(handles),
                    database=db.source,
                )
                if link is not None:
                    link.ready(worker.id)
                outcome = await _until_drained(worker, signals, link)
                nursery.cancel_scope.cancel()
            stats = worker.stats()
    counts = {
        "done": stats.done,
        "retried": stats.retried,
        "dead_lettered": stats.dead_lettered,
        "drained": stats.drained,
        "abandoned": stats.abandoned,
    }
    if outcome == "drained":
        log_event(logging.INFO, "jobs.worker.drained", worker_id=worker.id, **counts)
    else:
        # Bodies outlived the drain deadline but did end: their leases lapse.
        log_event(
            logging.WARNING,
            "jobs.worker.abandoned",
            worker_id=worker.id,
            reason="drain-deadline",
            in_flight=0,
            **counts,
        )
    summary = {"worker_id": worker.id, "outcome": outcome, **counts}
    if link is not None:
        link.summary(summary)
    return summary


async def _warn_unknown_queues(
    jobs: Any, queues: list[str] | None, handles: list[Job[Any, Any]]
) -> None:
    """``jobs.queue.unknown`` for each queue ``--queues`` (or ``--concurrency
    q=N``) names that no loaded job declares, no job is in and no live worker
    serves: most likely a typo, and the worker would idle on it. It is served
    all the same (jobs may be enqueued there later)."""
    from ._operate import queue_known

    declared = [h.queue for h in handles]
    for queue in queues or ():
        if not await queue_known(jobs, queue, declared):
            log_event(logging.WARNING, "jobs.queue.unknown", queue=queue, command="worker")


async def _orphaned(link: ChildLink) -> None:
    """The supervisor is gone (killed, or crashed): drain rather than run on
    unsupervised, by sending this process the SIGTERM it would have forwarded
    (one drain path; a later signal still abandons)."""
    await link.orphaned()
    log_event(logging.WARNING, "jobs.worker.orphaned", pid=os.getpid())
    os.kill(os.getpid(), signal.SIGTERM)


async def _until_drained(worker: Any, signals: Any, link: ChildLink | None = None) -> str:
    """Wait for the first signal, drain; ``"drained"``, or ``"abandoned"`` when a
    body outlasted the drain deadline but the worker still stopped. A second
    signal, or a worker that does not stop by the deadline, exits the process."""
    async for signum in signals:
        log_event(
            logging.INFO,
            "jobs.worker.draining",
            signal=signal.Signals(signum).name,
            in_flight=worker.stats().in_flight,
        )
        break
    worker.begin_drain()
    reason = "drain-deadline"
    async with trio.open_nursery() as nursery:

        async def drain() -> None:
            nonlocal reason
            with trio.move_on_after(worker.drain_timeout + DRAIN_GRACE):
                await worker.drain()
                reason = ""
            nursery.cancel_scope.cancel()

        async def second() -> None:
            nonlocal reason
            async for signum in signals:
                reason = f"second {signal.Signals(signum).name}"
                nursery.cancel_scope.cancel()
                return

        nursery.start_soon(drain)
        nursery.start_soon(second)
    if reason:
        _abandon(worker, reason, link)
    return "abandoned" if worker.stats().abandoned else "drained"


def _abandon(worker: Any, reason: str, link: ChildLink | None = None) -> None:
    """Leave now: the held jobs' leases lapse and the queue redelivers them."""
    log_event(
        logging.WARNING,
        "jobs.worker.abandoned",
        worker_id=worker.id,
        reason=reason,
        in_flight=worker.stats().in_flight,
    )
    if link is not None:
        link.summary({"worker_id": worker.id, "outcome": "abandoned", "reason": reason})
    flush_logs()
    os._exit(EXIT_ABANDONED)
