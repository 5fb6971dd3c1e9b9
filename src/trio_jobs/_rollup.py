"""``rollup()`` and ``refresh_view()``: the two jobs that keep derived tables fresh.

A rollup (``kind == "rollup"``) recomputes the recent buckets of a time series
into the app's own table. Each run is ONE ``step.transaction`` (``upsert``):
it checks the catalog (a unique constraint on ``into`` covering ``key``), reads
``source(tx, since, input)`` from ``since`` (the first instant of the bucket
holding ``now - lookback``, found in the bucket's zone), maps every point to a
row and writes them all in one ``INSERT ... ON CONFLICT (key) DO UPDATE``. The
read, the upsert and the step's record commit together, so every bucket lands
or none does, and a run killed anywhere upserts once.

``refresh_view()`` (``kind == "refresh-view"``) is one step too (``refresh``):
the catalog checks, then ``REFRESH MATERIALIZED VIEW [CONCURRENTLY]``.

Both are PostgreSQL only: on another driver the run's first statement is
refused with that driver's ``X_NOT_IMPLEMENTED``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

import attrs

from ._context import _call
from ._declare import Concurrency, Job, Retry, check_factory_name, job
from ._enqueue import _MISSING
from ._serialization import UnserializableError, converter, dumps
from ._task import _zone
from ._time import Duration, parse_duration
from ._validate import text_fault
from .drivers.postgres._sql import query
from .errors import ErrorCode, JobDeclarationError, JobsError

if TYPE_CHECKING:
    from ._context import JobContext
    from ._facade import Transaction
    from ._settled import Settled

__all__ = ["BUCKET_UNITS", "Bucket", "refresh_view", "rollup"]

#: The units a :class:`Bucket` takes: PostgreSQL's ``date_trunc`` names for them.
BUCKET_UNITS = ("minute", "hour", "day", "week", "month", "quarter", "year")
#: The longest ``name`` the factories take (a job's name).
MAX_NAME = 200
#: The step each run is: a rollup's upsert, a view's refresh.
UPSERT_STEP = "upsert"
REFRESH_STEP = "refresh"


def _bucket_faults(unit: object, tz: object) -> tuple[list[str], ZoneInfo | None]:
    faults: list[str] = []
    if unit not in BUCKET_UNITS:
        shown = repr(unit)[:40] if isinstance(unit, str) else f"a {type(unit).__name__}"
        faults.append(f"bucket unit {shown} is not one of {', '.join(BUCKET_UNITS)}")
    zone = _zone(tz, faults)
    faults = [f.replace("tz ", "bucket zone ", 1) if f.startswith("tz ") else f for f in faults]
    return faults, zone


@attrs.frozen(init=False)
class Bucket:
    """One row of a rollup's table: a ``unit`` of time in an IANA zone ``tz``.

    ``unit`` is one of ``"minute"``, ``"hour"``, ``"day"``, ``"week"`` (starting
    Monday), ``"month"``, ``"quarter"`` or ``"year"``: the names PostgreSQL's
    ``date_trunc(unit, ts, tz)`` takes, so a source groups its points with the
    bucket's own two fields. A bucket is a span of the zone's wall clock, so a
    day in Europe/Paris is 23 hours long in March and 25 in October. A bad unit
    or zone is ``X_JOB_ROLLUP_INVALID``, naming both.

    >>> Bucket("day", "Europe/Paris").start(datetime(2026, 3, 29, 12, tzinfo=UTC))
    datetime.datetime(2026, 3, 29, 0, 0, tzinfo=zoneinfo.ZoneInfo(key='Europe/Paris'))
    """

    unit: str
    tz: str
    zone: ZoneInfo = attrs.field(repr=False, eq=False)

    def __init__(self, unit: str, tz: str = "UTC") -> None:
        faults, zone = _bucket_faults(unit, tz)
        if faults or zone is None:
            raise JobDeclarationError(
                ErrorCode.X_JOB_ROLLUP_INVALID,
                "Bucket(unit, tz) is invalid: " + "; ".join(faults),
                meta={"faults": faults},
            )
        self.__attrs_init__(unit, zone.key, zone)

    def start(self, at: datetime) -> datetime:
        """The first instant of the bucket holding ``at`` (an aware datetime), as an
        aware datetime in the bucket's zone.

        Buckets are PostgreSQL's ``date_trunc(unit, ts, tz)``: a source grouping
        its points with it reads each bucket whole from its start. ``at``'s
        local time is cut down to the unit. A day (or longer) whose midnight was
        skipped by a change to summer time starts at the change; one whose
        midnight came twice, at the first. A minute or an hour is cut on the
        offset ``at`` has, so each pass of a repeated hour is a bucket of its
        own, and an hour a 30-minute change cuts short starts at the change.
        Every instant from the start up to ``at`` is in ``at``'s bucket, and the
        instant before the start is not.
        """
        if not isinstance(at, datetime) or at.tzinfo is None or at.utcoffset() is None:
            raise JobsError(
                ErrorCode.X_INVARIANT,
                "Bucket.start(at): at must be an aware datetime (give it a tzinfo)",
            )
        local = at.astimezone(self.zone)
        if self.unit in ("minute", "hour"):
            # Cut on the offset `at` has: each pass of a repeated hour is its own
            # bucket. Where the offset changed inside the cut (a zone moving by
            # 30 minutes), the bucket starts at the change.
            cut = timedelta(
                minutes=local.minute if self.unit == "hour" else 0,
                seconds=local.second,
                microseconds=local.microsecond,
            )
            # In UTC: arithmetic on a zoned datetime is on its wall clock.
            start = at.astimezone(UTC) - cut
            offset = local.utcoffset()
            if start.astimezone(self.zone).utcoffset() != offset:
                start = _change_after(start, at, self.zone, offset)
            return start.astimezone(self.zone)
        wall = local.replace(tzinfo=None, fold=0)
        wall = wall.replace(hour=0, minute=0, second=0, microsecond=0)
        if self.unit == "week":
            wall -= timedelta(days=wall.weekday())
        elif self.unit == "month":
            wall = wall.replace(day=1)
        elif self.unit == "quarter":
            wall = wall.replace(month=(wall.month - 1) // 3 * 3 + 1, day=1)
        elif self.unit == "year":
            wall = wall.replace(month=1, day=1)
        # fold=0: a midnight the clock went through twice starts at its first
        # pass; one it skipped is read with the offset before the change, which
        # is the change's own instant.
        return datetime.fromtimestamp(wall.replace(tzinfo=self.zone).timestamp(), self.zone)


def _change_after(
    low: datetime, high: datetime, zone: ZoneInfo, offset: timedelta | None
) -> datetime:
    """The first instant in ``(low, high]`` from which the zone's offset is
    ``offset`` (it is at ``high``, not at ``low``), to the microsecond."""
    lo, hi = low, high
    step = timedelta(microseconds=1)
    while hi - lo > step:
        mid = lo + (hi - lo) / 2
        if mid.astimezone(zone).utcoffset() == offset:
            hi = mid
        else:
            lo = mid
    return hi


# --------------------------------------------------------------------------- shared


def _takes(fn: Callable[..., Any], n: int) -> bool:
    """Whether ``fn`` can be called with ``n`` positional arguments (``True`` when
    its signature cannot be read: the call will tell)."""
    try:
        inspect.signature(fn).bind(*([None] * n))
    except TypeError:
        return False
    except ValueError:
        return True
    return True


def _check_callable(value: object, field: str, shape: str, n: int, faults: list[str]) -> None:
    if value is _MISSING or value is None:
        faults.append(f"{field}= is required: {shape}")
    elif not callable(value):
        faults.append(f"{field} must be a function: {shape}")
    elif not _takes(value, n):
        faults.append(f"{field} must take {n} arguments: {shape}")


def _check_relation(value: object, field: str, what: str, faults: list[str]) -> bool:
    if value is _MISSING or value is None:
        faults.append(f"{field}= is required: the name of the {what} ('name' or 'schema.name')")
    elif not isinstance(value, str) or not value.strip() or len(value) > 2 * 64 + 1:
        faults.append(f"{field} must be the name of the {what} ('name' or 'schema.name')")
    elif (fault := text_fault(value)) is not None:
        faults.append(f"{field} cannot be stored: {fault}")
    else:
        return True
    return False


def _default_key(name: str) -> Callable[[Any], str]:
    """The default idempotency key: the name plus the input's JSON form (one live
    run per input)."""

    def key(value: Any) -> str:
        form = None if value is None else converter.unstructure(value)
        return f"{name}:{dumps(form).decode()}"

    return key


def _declare(
    kind: str,
    code: ErrorCode,
    faults: list[str],
    job_name: str,
    options: dict[str, Any],
) -> Callable[[Callable[..., Any]], Job[Any, Any]]:
    """``job()`` with the factory's options; its faults join the factory's, and
    any fault refuses the declaration with ``code``, naming every one."""
    declare: Callable[[Callable[..., Any]], Job[Any, Any]] | None = None
    try:
        declare = job(name=job_name, **options)
    except JobDeclarationError as exc:
        faults.extend(exc.meta.get("faults") or [exc.message])
    if faults or declare is None:
        raise JobDeclarationError(
            code, f"{kind} declaration is invalid: " + "; ".join(faults), meta={"faults": faults}
        )
    return declare


def _quote(column: str) -> str:
    return '"' + column.replace('"', '""') + '"'


async def _relation(tx: Transaction, name: str) -> tuple[str, str, list[str]] | None:
    """``(relkind, name as a statement spells it, columns)``, or ``None``: no such relation."""
    rows = await tx.execute(query("rollup_relation"), {"name": name})
    if not rows:
        return None
    kind, spelled, columns = rows[0]
    return str(kind), str(spelled), list(columns)


async def _unique_keys(tx: Transaction, name: str) -> list[frozenset[str]]:
    rows = await tx.execute(query("rollup_unique_keys"), {"name": name})
    return [frozenset(row[0]) for row in rows]


_KINDS = {
    "r": "a table",
    "p": "a partitioned table",
    "v": "a plain view",
    "m": "a materialized view",
    "f": "a foreign table",
    "S": "a sequence",
    "i": "an index",
    "I": "an index",
    "c": "a composite type",
    "t": "a TOAST table",
}


# --------------------------------------------------------------------------- rollup


def rollup(
    *,
    name: Any = _MISSING,
    into: Any = _MISSING,
    key: Any = _MISSING,
    lookback: Any = _MISSING,
    bucket: Any = _MISSING,
    source: Any = _MISSING,
    map: Any = _MISSING,
    input: Any = None,
    tenant: Any = "none",
    idempotency_key: Any = _MISSING,
    queue: str = "default",
    retry: Retry | None = None,
    concurrency: int | Concurrency | None = None,
    timeout: Duration | None = None,
    on_settled: Callable[[Settled], Any] | None = None,
    **unknown: Any,
) -> Job[Any, dict[str, Any]]:
    """Declare a rollup: a job that recomputes the recent buckets of a time series
    into the app's table ``into``, all in one upsert.

    Each run reads ``source(tx, since, input)``: ``tx`` is the run's transaction
    (``await tx.execute(sql, params) -> list[tuple]``), ``since`` an aware
    datetime, the first instant of the bucket holding ``now - lookback`` (see
    :meth:`Bucket.start`), so the oldest bucket it rewrites is read whole. It
    answers points, typically ``(bucket_start, value)`` pairs; each reaches
    ``map(point, input)`` unchanged, which answers one row of ``into`` as a dict
    of column to value. Every row is written in ONE ``INSERT ... ON CONFLICT
    (key) DO UPDATE``, in the same transaction as the read and the step's record:
    every bucket or none. A late row inside ``lookback`` moves its bucket on the
    next run; a row older than ``lookback`` when it lands is not counted, and a
    bucket whose rows were all deleted keeps its last value.

    ``into`` is a table name (``"daily_signups"`` or ``"schema.table"``), ``key``
    its columns naming one bucket (``["org_id", "day"]``): a unique constraint or
    index on ``into`` over exactly those columns must exist. ``lookback`` is a
    positive duration (``"2d"``, a ``timedelta``, seconds); ``bucket`` a
    :class:`Bucket`. ``input`` (an attrs class, or ``None``: enqueue ``None``),
    ``tenant``, ``queue``, ``retry``, ``concurrency``, ``timeout`` and
    ``on_settled`` are as for :func:`~trio_jobs.job`; ``idempotency_key``
    defaults to the name plus the input's JSON form. Nothing schedules a rollup:
    enqueue it from a :func:`~trio_jobs.task`. The run's result is ``{"since":
    ISO 8601, "rows": n}``.

    A bad declaration is ``X_JOB_ROLLUP_INVALID`` naming every fault; the first
    statement of every run checks the catalog (``into`` a table, ``key`` its
    columns, covered by a unique constraint) before anything is written, and a
    fault there is ``X_JOB_ROLLUP_INVALID`` too, terminal. PostgreSQL only.

    >>> daily_signups = rollup(
    ...     name="signups.daily",
    ...     into="daily_signups",
    ...     key=["org_id", "day"],
    ...     lookback="2d",
    ...     bucket=Bucket("day", "Europe/Paris"),
    ...     source=signups_since,  # (tx, since, input) -> [(org_id, day, count), ...]
    ...     map=lambda p, _: {"org_id": p[0], "day": p[1], "signups": p[2]},
    ... )
    """
    faults: list[str] = []
    if unknown:
        faults.append(f"unknown field(s): {', '.join(sorted(unknown))}")
    name_ok = check_factory_name(name, MAX_NAME, "the rollup's job name", faults)
    _check_relation(into, "into", "table the rollup writes", faults)
    keys: list[str] = []
    if key is _MISSING or key is None:
        faults.append("key= is required: the columns of into naming one bucket, e.g. ['day']")
    elif (
        isinstance(key, str | bytes)
        or not isinstance(key, Sequence)
        or not key
        or not all(isinstance(k, str) and k and text_fault(k) is None for k in key)
    ):
        faults.append("key must be a non-empty list of column names, e.g. ['org_id', 'day']")
    elif len(set(key)) != len(key):
        faults.append("key names a column twice")
    else:
        keys = list(key)
    seconds: float | None = None
    if lookback is _MISSING or lookback is None:
        faults.append("lookback= is required: how late a row may land and still count, e.g. '2d'")
    else:
        try:
            seconds = parse_duration(lookback, field="lookback")
        except JobsError as exc:
            faults.append(exc.message)
    if bucket is _MISSING or bucket is None:
        faults.append("bucket= is required: Bucket(unit, tz), e.g. Bucket('day', 'UTC')")
    elif not isinstance(bucket, Bucket):
        faults.append("bucket must be a Bucket(unit, tz), e.g. Bucket('day', 'Europe/Paris')")
    _check_callable(source, "source", "source(tx, since, input) answering the points", 3, faults)
    _check_callable(map, "map", "map(point, input) answering one row as a dict", 2, faults)
    job_name = name if name_ok else "rollup"
    if idempotency_key is _MISSING or idempotency_key is None:
        idempotency_key = _default_key(job_name)
    declare = _declare(
        "rollup",
        ErrorCode.X_JOB_ROLLUP_INVALID,
        faults,
        job_name,
        {
            "input": input,
            "tenant": tenant,
            "idempotency_key": idempotency_key,
            "queue": queue,
            "retry": retry,
            "concurrency": concurrency,
            "timeout": timeout,
            "on_settled": on_settled,
        },
    )
    assert seconds is not None
    assert isinstance(bucket, Bucket)
    plan = _Rollup(job_name, into, keys, seconds, bucket, source, map)
    handle = declare(plan.body())
    handle.kind = "rollup"
    handle.__doc__ = f"The rollup {job_name!r}: recomputes its recent buckets into {into!r}."
    return handle


@attrs.frozen
class _Rollup:
    name: str
    into: str
    key: list[str]
    lookback: float
    bucket: Bucket
    source: Callable[..., Any]
    map: Callable[..., Any]

    def _invalid(self, message: str) -> JobsError:
        return JobsError(
            ErrorCode.X_JOB_ROLLUP_INVALID,
            f"rollup {self.name!r}: {message}",
            meta={"job": self.name, "into": self.into},
        )

    def _refused(self, exc: Exception) -> BaseException:
        """A row the database refused: a value that does not fit its column (SQLSTATE
        class 22) is the declaration's fault, terminal, named by its SQLSTATE and
        column (the database's own message quotes the value, so it is left out).
        Anything else (a conflict, a lost connection) is raised as it was."""
        state = getattr(exc, "sqlstate", None)
        if not isinstance(state, str) or not state.startswith("22"):
            return exc
        diag = getattr(exc, "diag", None)
        column = getattr(diag, "column_name", None)
        where = f" in column {column}" if column else ""
        return self._invalid(
            f"{self.into!r} refused a row map answered (SQLSTATE {state}{where}): a value "
            "does not fit its column's type; answer values of the column's type"
        )

    async def target(self, tx: Transaction) -> tuple[str, list[str]]:
        """``into`` as a statement spells it and its columns, once the catalog
        says it is a table with a unique constraint over exactly ``key``."""
        found = await _relation(tx, self.into)
        if found is None:
            raise self._invalid(
                f"into {self.into!r} names no table the run's search path reaches; create it "
                "(with a unique constraint over key) or qualify it as 'schema.table'"
            )
        kind, spelled, columns = found
        if kind not in ("r", "p"):
            raise self._invalid(
                f"into {self.into!r} is {_KINDS.get(kind, 'not a table')}; a rollup writes a table"
            )
        missing = [k for k in self.key if k not in columns]
        if missing:
            raise self._invalid(f"key names column(s) {', '.join(missing)} that {spelled} lacks")
        if frozenset(self.key) not in await _unique_keys(tx, self.into):
            raise self._invalid(
                f"no unique constraint on {spelled} covers key ({', '.join(self.key)}); add one "
                f"(ALTER TABLE {spelled} ADD UNIQUE ({', '.join(_quote(k) for k in self.key)})): the "
                "upsert finds each bucket's row by it"
            )
        return spelled, columns

    def rows_of(self, answers: list[Any], columns: list[str]) -> tuple[list[str], list[Any]]:
        """The rows ``map`` answered, checked: dicts over one set of columns of
        ``into`` holding every key column, no two naming one bucket. Faults name
        columns and positions, never values."""
        if not answers:
            return [], []
        first = answers[0]
        for i, row in enumerate(answers):
            if not isinstance(row, Mapping):
                raise self._invalid(
                    f"map must answer a dict of column to value; for point {i} it answered "
                    f"a {type(row).__name__}"
                )
            if set(row) != set(first):
                raise self._invalid(
                    f"map answered rows of different columns (point 0 and point {i}); answer "
                    "the same columns for every point"
                )
        names = list(first)
        strange = [c for c in names if not isinstance(c, str) or c not in columns]
        if strange:
            shown = ", ".join(repr(c)[:64] for c in strange)
            raise self._invalid(f"map answered column(s) {shown} that {self.into!r} lacks")
        absent = [k for k in self.key if k not in first]
        if absent:
            raise self._invalid(f"map's rows lack the key column(s) {', '.join(absent)}")
        seen: set[str] = set()
        for i, row in enumerate(answers):
            try:
                ident = dumps([row[k] for k in self.key]).decode()
            except UnserializableError as exc:
                raise self._invalid(f"a key value of point {i} cannot be written: {exc}") from None
            if ident in seen:
                raise self._invalid(
                    f"map answered two rows for one bucket (point {i} repeats an earlier "
                    "key); answer one point per bucket"
                )
            seen.add(ident)
        return names, answers

    def statement(self, spelled: str, names: list[str]) -> str:
        cols = ", ".join(_quote(c) for c in names)
        conflict = ", ".join(_quote(k) for k in self.key)
        rest = [c for c in names if c not in self.key]
        head = (
            f"INSERT INTO {spelled} AS t ({cols}) SELECT {cols} "
            f"FROM jsonb_populate_recordset(NULL::{spelled}, %s::jsonb) "
            f"ON CONFLICT ({conflict}) DO "
        )
        if not rest:
            return head + "NOTHING"
        sets = ", ".join(f"{_quote(c)} = EXCLUDED.{_quote(c)}" for c in rest)
        old = ", ".join(f"t.{_quote(c)}" for c in rest)
        new = ", ".join(f"EXCLUDED.{_quote(c)}" for c in rest)
        # An unchanged bucket is not rewritten (no dead tuple per run per bucket).
        return head + f"UPDATE SET {sets} WHERE ROW({old}) IS DISTINCT FROM ROW({new})"

    def body(self) -> Callable[[JobContext[Any]], Any]:
        async def run_rollup(ctx: JobContext[Any]) -> Any:
            driver = ctx._state.driver

            async def upsert(tx: Transaction) -> dict[str, Any]:
                spelled, columns = await self.target(tx)
                now = datetime.fromtimestamp(driver.now() - self.lookback, self.bucket.zone)
                since = self.bucket.start(now)
                points = await _call(self.source, tx, since, ctx.input)
                if isinstance(points, str | bytes | Mapping) or not hasattr(points, "__iter__"):
                    raise self._invalid(
                        "source must answer a list of points; it answered a "
                        f"{type(points).__name__}"
                    )
                answers = [await _call(self.map, point, ctx.input) for point in points]
                names, rows = self.rows_of(answers, columns)
                if rows:
                    try:
                        data = dumps(rows).decode()
                    except UnserializableError as exc:
                        raise self._invalid(
                            f"a row map answered cannot be written: {exc}"
                        ) from None
                    try:
                        await tx.execute(self.statement(spelled, names), (data,))
                    except Exception as exc:
                        raise self._refused(exc) from None
                return {"since": since.isoformat(), "rows": len(rows)}

            return await ctx.step.transaction(UPSERT_STEP, upsert)

        run_rollup.__name__ = run_rollup.__qualname__ = self.name
        return run_rollup


# --------------------------------------------------------------------------- refresh_view


def refresh_view(
    *,
    name: Any = _MISSING,
    view: Any = _MISSING,
    concurrently: Any = False,
    input: Any = None,
    idempotency_key: Any = _MISSING,
    queue: str = "default",
    retry: Retry | None = None,
    timeout: Duration | None = None,
    on_settled: Callable[[Settled], Any] | None = None,
    **unknown: Any,
) -> Job[Any, dict[str, Any]]:
    """Declare a job that refreshes the materialized view ``view``, in one step.

    Each run is ``REFRESH MATERIALIZED VIEW [CONCURRENTLY] view`` in one
    ``step.transaction`` (``refresh``), so a run killed anywhere refreshes once.
    ``concurrently=True`` keeps readers on the old rows meanwhile; PostgreSQL
    needs a unique index on the view over plain columns, with no ``WHERE``. The
    job has no tenant (``tenant="none"``): the read path scopes the rows.

    ``view`` is the view's name (``"post_totals"`` or ``"schema.view"``).
    ``input`` (default none: enqueue ``None``), ``idempotency_key`` (default: the
    name plus the input's JSON form), ``queue``, ``retry``, ``timeout`` and
    ``on_settled`` are as for :func:`~trio_jobs.job`. Nothing schedules it:
    enqueue it from a :func:`~trio_jobs.task`. The run's result is ``{"view":
    name, "concurrently": bool}``.

    A bad declaration is ``X_JOB_REFRESH_VIEW_INVALID`` naming every fault. The
    run checks the catalog before it refreshes: a table, a plain view, no such
    relation, or ``concurrently`` with no such unique index is
    ``X_JOB_REFRESH_VIEW_INVALID``, terminal. PostgreSQL only.

    >>> refresh_totals = refresh_view(name="post-totals.refresh", view="post_totals",
    ...                               concurrently=True)
    """
    faults: list[str] = []
    if unknown:
        faults.append(f"unknown field(s): {', '.join(sorted(unknown))}")
    name_ok = check_factory_name(name, MAX_NAME, "the refresh's job name", faults)
    _check_relation(view, "view", "materialized view", faults)
    if not isinstance(concurrently, bool):
        faults.append("concurrently must be True or False")
    job_name = name if name_ok else "refresh-view"
    if idempotency_key is _MISSING or idempotency_key is None:
        idempotency_key = _default_key(job_name)
    declare = _declare(
        "refresh_view",
        ErrorCode.X_JOB_REFRESH_VIEW_INVALID,
        faults,
        job_name,
        {
            "input": input,
            "tenant": "none",
            "idempotency_key": idempotency_key,
            "queue": queue,
            "retry": retry,
            "timeout": timeout,
            "on_settled": on_settled,
        },
    )
    handle = declare(_refresh_body(job_name, view, concurrently))
    handle.kind = "refresh-view"
    handle.__doc__ = f"Refreshes the materialized view {view!r}."
    return handle


def _refresh_body(name: str, view: str, concurrently: bool) -> Callable[[JobContext[Any]], Any]:
    def invalid(message: str) -> JobsError:
        return JobsError(
            ErrorCode.X_JOB_REFRESH_VIEW_INVALID,
            f"refresh_view {name!r}: {message}",
            meta={"job": name, "view": view},
        )

    async def refresh(tx: Transaction) -> dict[str, Any]:
        found = await _relation(tx, view)
        if found is None:
            raise invalid(
                f"view {view!r} names no relation the run's search path reaches; create the "
                "materialized view or qualify it as 'schema.view'"
            )
        kind, spelled, _columns = found
        if kind != "m":
            raise invalid(
                f"view {view!r} is {_KINDS.get(kind, 'not a materialized view')}; refresh_view "
                "refreshes a materialized view (CREATE MATERIALIZED VIEW)"
            )
        if concurrently and not await _unique_keys(tx, view):
            raise invalid(
                f"concurrently=True needs a unique index on {spelled} over plain columns with no "
                f"WHERE (CREATE UNIQUE INDEX ON {spelled} (...)); add one, or refresh with "
                "concurrently=False (readers wait for the refresh)"
            )
        how = "CONCURRENTLY " if concurrently else ""
        await tx.execute(f"REFRESH MATERIALIZED VIEW {how}{spelled}")
        return {"view": spelled, "concurrently": concurrently}

    async def run_refresh(ctx: JobContext[Any]) -> Any:
        return await ctx.step.transaction(REFRESH_STEP, refresh)

    run_refresh.__name__ = run_refresh.__qualname__ = name
    return run_refresh
