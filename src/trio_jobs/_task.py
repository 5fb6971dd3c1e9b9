"""``task()``: a job the scheduler enqueues on a schedule, and its pure parts.

A task is a :class:`~trio_jobs.Job` (``.kind == "task"``) whose input is an
:class:`Occurrence` and whose idempotency key is built in:
``task:<name>:<the occurrence's instant, ISO 8601 UTC>``, so one occurrence is
one run however many times it is fired. Its schedule is a five-field cron
(cronsim's syntax, evaluated in the task's IANA zone) or ``every=`` a whole
number of seconds (the multiples of it since the Unix epoch, so every process
agrees). Everything here is pure: what falls due between two instants, and
which of those the ``catch_up`` rule fires, are answered without a store. The
scheduler (``_scheduler.py``) and ``next_fire`` read the same functions, so a
dashboard and the scheduler cannot disagree.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import attrs
from cronsim import CronSim, CronSimError

from ._declare import Concurrency, Job, Retry, job, refuse_declaration, with_companions
from ._serialization import converter
from ._time import Duration, IdSource, parse_duration
from ._validate import text_fault
from .drivers._protocol import EnqueueRequest
from .errors import ErrorCode, JobDeclarationError, JobsError

if TYPE_CHECKING:
    from ._context import JobContext
    from ._settled import Settled

__all__ = [
    "MAX_CATCH_UP",
    "NONE_LATENESS",
    "Occurrence",
    "Schedule",
    "Task",
    "TaskView",
    "decide",
    "next_fire",
    "occurrence_key",
    "task",
]

CatchUp = Literal["latest", "all", "none"]

#: The most missed occurrences ``catch_up="all"`` fires at once (the newest, oldest first).
MAX_CATCH_UP = 1_000
#: ``catch_up="none"`` fires no occurrence later than this many seconds.
NONE_LATENESS = 60.0


@attrs.frozen
class Occurrence:
    """A task run's input: ``at``, the occurrence's instant, an aware datetime in
    the task's zone."""

    at: datetime


@attrs.frozen
class TaskView:
    """One scheduled task as ``jobs.tasks()`` answers it.

    ``schedule`` is the cron text or ``every:<whole seconds>``; ``tz`` the zone's
    IANA name; ``paused`` whether it is paused fleet-wide; ``last_fire`` the
    instant of the last occurrence that queued a run (arming a task or skipping
    missed occurrences is no fire); ``next_fire`` the first occurrence after now
    (``None`` while paused). Times are aware datetimes in the task's zone, or
    ``None``."""

    name: str
    schedule: str
    tz: str
    paused: bool
    last_fire: datetime | None
    next_fire: datetime | None


def _utc_text(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")


def occurrence_key(name: str, at: float) -> str:
    """The built-in idempotency key: ``task:<name>:<at as ISO 8601 UTC>``."""
    return f"task:{name}:{_utc_text(at)}"


# --------------------------------------------------------------------------- schedules


@attrs.frozen
class Schedule:
    """A task's schedule, in float epoch seconds: a cron in a zone, or every
    ``every`` seconds since the epoch. ``text`` is what ``TaskView.schedule``
    shows (and what a store keeps, so a reader without the declaration rebuilds
    it with :meth:`parse`)."""

    text: str
    tz_name: str
    tz: ZoneInfo
    cron: str | None = None
    every: int | None = None

    @classmethod
    def parse(cls, text: str, tz_name: str) -> Schedule:
        """Rebuild a schedule from its stored text and zone (``X_INVARIANT`` when
        they do not parse: a row written by something else)."""
        faults: list[str] = []
        zone = _zone(tz_name, faults)
        if text.startswith("every:"):
            seconds = text[6:]
            if not seconds.isdigit() or int(seconds) < 1:
                faults.append("a stored every: schedule must be a whole number of seconds")
            elif zone is not None:
                return cls(text, tz_name, zone, every=int(seconds))
        else:
            _check_cron(text, faults)
            if not faults and zone is not None:
                return cls(text, tz_name, zone, cron=text)
        raise JobsError(
            ErrorCode.X_INVARIANT, "a stored task schedule does not parse: " + "; ".join(faults)
        )

    def local(self, at: float) -> datetime:
        return datetime.fromtimestamp(at, self.tz)

    def next_after(self, t: float) -> float:
        """The first occurrence strictly after ``t``."""
        if self.every is not None:
            return float((math.floor(t / self.every) + 1) * self.every)
        assert self.cron is not None
        found = next(CronSim(self.cron, self.local(t))).timestamp()
        # cronsim's forward step can skip occurrences right after a DST change of
        # other than an hour (Australia/Lord_Howe's 30 minutes: from 02:59 +11 the
        # day before, it answers 02:30 +10:30 and skips 02:00-02:29 +10:30). Its
        # reverse walk (what `newest` reads) finds them: take the oldest one it
        # sees after `t`, so both agree. Usually one step: `found` itself.
        for moment in CronSim(
            self.cron, self.local(found) + timedelta(microseconds=1), reverse=True
        ):
            at = moment.timestamp()
            if at <= t:
                break
            found = min(found, at)
        return found

    def newest(self, after: float, until: float, limit: int) -> tuple[list[float], bool]:
        """The newest ``limit`` occurrences in ``(after, until]``, oldest first, and
        whether older ones in that interval were left out."""
        if until <= after or limit < 1:
            return [], False
        found: list[float] = []
        if self.every is not None:
            last = math.floor(until / self.every) * self.every
            first = math.floor(after / self.every) * self.every + self.every
            count = int((last - first) // self.every) + 1 if last >= first else 0
            take = min(count, limit)
            found = [float(last - i * self.every) for i in range(take)]
            found.reverse()
            return found, count > take
        assert self.cron is not None
        # Reverse iteration is strict: start a microsecond past `until` to include it.
        it = CronSim(self.cron, self.local(until) + timedelta(microseconds=1), reverse=True)
        for moment in it:
            at = moment.timestamp()
            if at <= after:
                break
            if len(found) == limit:
                found.reverse()
                return found, True
            found.append(at)
        found.reverse()
        return found, False


def decide(
    schedule: Schedule, catch_up: str, watermark: float, now: float
) -> tuple[list[float], float | None, bool]:
    """What the scheduler does at ``now`` for a task whose occurrences up to
    ``watermark`` are decided: the occurrences to fire (oldest first), the new
    watermark (``None``: nothing fell due, nothing to write) and whether
    ``catch_up="all"`` left older occurrences out (more than 1,000 fell due).

    ``latest`` fires the most recent one; ``all`` each, at most the newest 1,000;
    ``none`` those at most 60 s late. Every occurrence up to the newest due one
    is decided either way: the watermark moves to it."""
    if catch_up == "all":
        newest, more = schedule.newest(watermark, now, MAX_CATCH_UP)
        return newest, (newest[-1] if newest else None), more
    latest, _more = schedule.newest(watermark, now, 1)
    if not latest:
        return [], None, False
    through = latest[0]
    if catch_up == "latest":
        return [through], through, False
    # "none": only the occurrences of the last minute can fire (one past it is
    # looked at too, and left out by the comparison: `<=` keeps exactly 60 s).
    recent, _more = schedule.newest(max(watermark, now - NONE_LATENESS - 1), now, MAX_CATCH_UP)
    return [at for at in recent if now - at <= NONE_LATENESS], through, False


def next_fire(handle: Job[Any, Any], after: datetime) -> datetime:
    """The first occurrence of the task ``handle`` strictly after ``after`` (an
    aware datetime), as an aware datetime in the task's zone. A pure function:
    the scheduler's own resolver, no store or running scheduler needed.

    >>> next_fire(nightly_report, datetime(2026, 3, 28, 12, tzinfo=ZoneInfo("Europe/Paris")))
    datetime.datetime(2026, 3, 29, 3, 0, tzinfo=zoneinfo.ZoneInfo(key='Europe/Paris'))
    """
    if not isinstance(handle, Task):
        raise JobsError(ErrorCode.X_INVARIANT, "next_fire takes a task() handle")
    if not isinstance(after, datetime) or after.tzinfo is None or after.utcoffset() is None:
        raise JobsError(
            ErrorCode.X_INVARIANT,
            "next_fire(handle, after): after must be an aware datetime (give it a tzinfo)",
        )
    return handle.schedule.local(handle.schedule.next_after(after.timestamp()))


# --------------------------------------------------------------------------- checks


def _zone(tz: object, faults: list[str]) -> ZoneInfo | None:
    if not isinstance(tz, str) or not tz or text_fault(tz) is not None:
        faults.append("tz must be an IANA zone name such as 'Europe/Paris' or 'UTC'")
        return None
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        faults.append(
            f"tz {tz[:64]!r} is not an IANA zone name (write one such as 'Europe/Paris' or 'UTC')"
        )
        return None


def _check_cron(cron: object, faults: list[str]) -> None:
    if not isinstance(cron, str):
        faults.append(
            "cron must be a string of five fields (minute hour day-of-month month day-of-week)"
        )
        return
    fields = cron.split()
    if len(fields) == 6:
        faults.append(
            "cron has a sixth field (seconds), which is refused: write five "
            "(minute hour day-of-month month day-of-week), or use every= for seconds"
        )
        return
    if len(fields) != 5:
        faults.append(
            f"cron must have five fields (minute hour day-of-month month day-of-week); "
            f"it has {len(fields)}"
        )
        return
    try:
        it = CronSim(cron, datetime(2000, 1, 1, tzinfo=UTC))
        next(it)
    except CronSimError as exc:
        faults.append(f"cron does not parse: {exc}")
    except (StopIteration, ValueError, OverflowError):
        faults.append("cron names no instant that ever happens (check the day and month)")


def _check_every(every: object, faults: list[str]) -> int | None:
    try:
        seconds = parse_duration(every, field="every")
    except JobsError:
        faults.append(
            'every must be a duration of at least 1 s ("10s", "5m", a timedelta or seconds)'
        )
        return None
    if seconds < 1:
        faults.append("every must be at least 1 s")
        return None
    if not float(seconds).is_integer():
        faults.append("every must be a whole number of seconds")
        return None
    return int(seconds)


class Task(Job[Occurrence, Any]):
    """The handle ``task()`` returns: a :class:`~trio_jobs.Job` with
    ``.kind == "task"``, its input an :class:`Occurrence`, and the schedule
    lifted (``.schedule``, ``.cron``, ``.every``, ``.tz``, ``.catch_up``)."""

    kind = "task"

    def __init__(self, base: Job[Any, Any], schedule: Schedule, catch_up: CatchUp) -> None:
        self.__dict__.update(base.__dict__)
        self.schedule = schedule
        self.cron = schedule.cron
        self.every = schedule.every
        self.tz = schedule.tz_name
        self.catch_up: CatchUp = catch_up
        self._idempotency_key = self._key

    def _key(self, occurrence: Occurrence) -> str:
        return occurrence_key(self.name, occurrence.at.timestamp())

    def __repr__(self) -> str:
        return f"<task {self.name!r} {self.schedule.text} tz={self.tz} queue={self.queue!r}>"

    def parse(self, raw: Any) -> Occurrence:
        """The stored ``Occurrence``, its ``at`` in the task's zone."""
        value = super().parse(raw)
        at = value.at
        if at.tzinfo is None:
            raise JobsError(
                ErrorCode.X_JOB_INPUT_INVALID,
                f"{self.name}: Occurrence.at must be an aware datetime",
                meta={"job": self.name},
            )
        return Occurrence(at.astimezone(self.schedule.tz))

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["schedule"] = {"text": self.schedule.text, "tz": self.tz, "catch_up": self.catch_up}
        return out

    def occurrence_request(self, at: float, ids: IdSource) -> EnqueueRequest:
        """The row that fires the occurrence at ``at`` (due now, no tenant)."""
        value = Occurrence(self.schedule.local(at))
        return EnqueueRequest(
            id=ids.new_id(),
            run_id=ids.new_id(),
            name=self.name,
            queue=self.queue,
            payload=converter.unstructure(value),
            idempotency_key=occurrence_key(self.name, at),
            max_attempts=self.max_attempts,
            concurrency_key=self.concurrency_key_for(value),
        )


def task(
    *,
    cron: str | None = None,
    every: Duration | None = None,
    tz: str = "UTC",
    catch_up: CatchUp = "latest",
    name: str | None = None,
    queue: str = "default",
    retry: Retry | None = None,
    timeout: Duration | None = None,
    concurrency: int | Concurrency | None = None,
    on_settled: Callable[[Settled], Any] | None = None,
    **unknown: Any,
) -> Callable[[Callable[[JobContext[Occurrence]], Awaitable[Any]]], Task]:
    """Declare a scheduled task. Decorate an ``async def body(ctx: JobContext[Occurrence])``.

    Exactly one of ``cron`` (five fields, cronsim's syntax, in ``tz``) or
    ``every`` (a duration of at least 1 s, whole seconds; the occurrences are its
    multiples since the Unix epoch). ``tz`` is an IANA zone name. ``catch_up``
    decides the occurrences that fell due while nothing fired them: ``"latest"``
    fires the most recent, ``"all"`` each (at most 1,000, oldest first),
    ``"none"`` none more than 60 s late. Every fault is named in one
    ``X_JOB_DECLARATION_INVALID``.

    >>> @task(cron="30 2 * * *", tz="Europe/Paris")
    ... async def nightly_report(ctx: JobContext[Occurrence]) -> None:
    ...     ctx.input.at   # the occurrence's instant, in Europe/Paris
    """
    faults: list[str] = []
    if (cron is None) == (every is None):
        faults.append("pass exactly one of cron= or every=")
    if cron is not None:
        _check_cron(cron, faults)
    seconds = _check_every(every, faults) if every is not None else None
    zone = _zone(tz, faults)
    if catch_up not in ("latest", "all", "none"):
        faults.append("catch_up must be 'latest', 'all' or 'none'")
    make: Callable[[Callable[..., Any]], Job[Any, Any]] | None = None
    try:
        make = job(
            input=Occurrence,
            idempotency_key=lambda _o: "",  # replaced by the built-in key
            name=name,
            queue=queue,
            retry=retry,
            timeout=timeout,
            concurrency=concurrency,
            on_settled=on_settled,
            **unknown,
        )
    except JobDeclarationError as exc:
        faults.extend(exc.meta.get("faults") or [exc.message])
    if faults or make is None or zone is None:
        raise refuse_declaration(ErrorCode.X_JOB_DECLARATION_INVALID, "task", faults)
    if cron is not None:
        schedule = Schedule(cron, zone.key, zone, cron=cron)
    else:
        assert seconds is not None
        schedule = Schedule(f"every:{seconds}", zone.key, zone, every=seconds)
    build = make

    def decorate(fn: Callable[[JobContext[Occurrence]], Awaitable[Any]]) -> Task:
        return Task(build(fn), schedule, catch_up)

    return decorate


def tasks_of(handles: Sequence[Job[Any, Any]]) -> list[Task]:
    """The task handles among ``handles``, by name."""
    found = {h.name: h for h in with_companions(handles) if isinstance(h, Task)}
    return [found[name] for name in sorted(found)]
