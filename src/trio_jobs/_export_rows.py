"""``export_rows()``: stream a paged read to object storage, one object per page.

Page ``n`` is the step ``page:<n>``: it asks ``source(input, cursor)`` for
``(rows, next_cursor)``, writes them as ``<prefix>/part-NNNNN.<ext>`` (a whole
object: a replay of the page overwrites it), and checkpoints the next cursor.

With ``read_ahead=True`` page ``n``'s step, once its source answered, asks a
task of the export's own for page ``n + 1``'s read (its cursor is known) while
it renders and writes its part; page ``n + 1``'s step uses that answer (or
raises what that read raised) if it asks for the same cursor, else reads itself.
A replayed page ``n + 1`` reads again: nothing read ahead is recorded, written or
raised outside the step of its page.
"""

from __future__ import annotations

import csv
import datetime as _dt
import io
import math
from collections.abc import Callable, Mapping
from itertools import chain
from typing import TYPE_CHECKING, Any

import attrs
import orjson
import outcome
import trio

from ._backfill import MAX_NAME, _items_of
from ._context import _call
from ._declare import Concurrency, Job, Retry, check_factory_name, check_function
from ._enqueue import _MISSING
from ._import_rows import (
    PAGE_STEP_PREFIX,
    _check_column_list,
    _declare,
    _prefix_ok,
    _resolve_prefix,
)
from ._serialization import json_form, payload_form
from ._store import put
from ._time import Duration
from .errors import ErrorCode, JobsError

if TYPE_CHECKING:
    from ._context import JobContext
    from ._settled import Settled

__all__ = ["export_rows"]

#: A csv cell starting with one of these is prefixed with ``'`` (a spreadsheet
#: would run it as a formula).
FORMULA_STARTS = ("=", "+", "-", "@")
_EXT = {"csv": "csv", "ndjson": "ndjson"}


def _guard(value: str) -> str:
    return "'" + value if value[:1] in FORMULA_STARTS else value


def _cell(value: Any) -> Any:
    """One csv cell: text guarded, ``None`` empty, a bool ``true``/``false``,
    dates in ISO form, other values as ``str``."""
    if type(value) is str:
        return "'" + value if value[:1] in FORMULA_STARTS else value
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, _dt.date | _dt.time):
        return value.isoformat()
    if isinstance(value, int | float):
        return value
    return _guard(str(value))


def _values(row: Any, columns: tuple[str, ...], name: str) -> Any:
    """A row's values in ``columns`` order: a mapping by key, an attrs instance
    by attribute, a tuple or list as it is (one value per column)."""
    if isinstance(row, tuple | list):
        if len(row) != len(columns):
            raise JobsError(
                ErrorCode.X_JOB_DECLARATION_INVALID,
                f"export {name!r}: a row of {len(row)} values for {len(columns)} columns",
            )
        return row
    if isinstance(row, Mapping):
        return [row.get(c) for c in columns]
    if attrs.has(type(row)):
        return [getattr(row, c) for c in columns]
    raise JobsError(
        ErrorCode.X_JOB_DECLARATION_INVALID,
        f"export {name!r}: rows must be tuples, mappings or attrs instances; "
        f"source answered a {type(row).__name__}",
    )


_AS_IS = frozenset({int, float, type(None)})  # the csv module writes these as _cell would
_NUMBERS = frozenset({int, float})
_TEXT = frozenset({str, type(None)})
_FLAGS = frozenset({bool, type(None)})
_FLAG_CELL = {True: "true", False: "false", None: ""}


def _flat(rows: list[Any], columns: tuple[str, ...], name: str) -> list[Any]:
    """The page's values in one list, row after row (``columns`` a row)."""
    width = len(columns)
    if set(map(type, rows)) <= {tuple, list} and set(map(len, rows)) == {width}:
        return list(chain.from_iterable(rows))  # rows as the database driver answers them
    return list(chain.from_iterable(_values(row, columns, name) for row in rows))


def _text_cell(value: Any) -> str:
    """A cell :func:`_cell` answered, as the csv module writes it."""
    if type(value) is str:
        return value
    return repr(value) if isinstance(value, float) else str(value)


def _plain(text: str, count: int) -> bool:
    """Whether ``text``, a column's ``count`` cells joined with line ends, has no
    cell the csv module quotes: none holding ``,``, ``"`` or a line end."""
    return (
        "," not in text and '"' not in text and "\r" not in text and text.count("\n") == count - 1
    )


def _starts_formula(text: str) -> bool:
    """Whether a cell may start a formula, ``text`` its column's cells joined with
    line ends: the text starts with a formula start or a line end is followed by
    one (exact unless a cell holds a line end, which may answer ``True`` for a
    column that holds none; guarding it then changes no cell). A formula
    character found nowhere (one ``memchr``) needs no two-character search."""
    if text[:1] in FORMULA_STARTS:
        return True
    return any(c in text and "\n" + c in text for c in FORMULA_STARTS)


def _csv_cells(flat: list[Any], width: int, count: int) -> bool:
    """Turn ``flat`` (a page's values, row after row) into its csv cells in
    place, a column at a time, answering whether no cell needs quoting: a column
    of numbers is kept as it is, a column of booleans by one lookup a value
    (neither is ever quoted), a column of text joined once to look for quoting
    and formula starts (scans in C) and guarded where one starts; only other
    columns go through :func:`_cell` value by value."""
    plain = True
    for j in range(width):
        col = flat[j::width]
        kinds = set(map(type, col))
        if kinds <= _NUMBERS:
            continue
        if kinds <= _AS_IS:
            flat[j::width] = ["" if c is None else c for c in col]
        elif kinds <= _FLAGS:
            flat[j::width] = map(_FLAG_CELL.__getitem__, col)
        elif kinds <= _TEXT:
            changed = type(None) in kinds
            if changed:
                col = ["" if c is None else c for c in col]
            text = "\n".join(col)
            plain = plain and _plain(text, count)
            if _starts_formula(text):
                col, changed = list(map(_guard, col)), True
            if changed:
                flat[j::width] = col
        else:
            col = [_text_cell(_cell(c)) for c in col]
            plain = plain and _plain("\n".join(col), count)
            flat[j::width] = col
    return plain


def _joined(flat: list[Any], width: int, count: int, head: str = "") -> str:
    """``head`` and the page's lines, its cells joined with ``,`` in one
    formatting call: what the csv module writes when no cell needs quoting."""
    # ``head`` goes into the format (a ``%`` in it doubled): the page's text is
    # made once, not made and then copied behind its header.
    line = ",".join(["%s"] * width) + "\n"
    return (head.replace("%", "%%") + line * count) % tuple(flat)


def _ndjson_default(value: Any) -> Any:
    return json_form(value)


def render(fmt: str, columns: tuple[str, ...], rows: list[Any], name: str) -> bytes:
    """One part's bytes: a csv with its header line, or one JSON object a line."""
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        if rows:
            width = len(columns)
            flat = _flat(rows, columns, name)
            plain = _csv_cells(flat, width, len(rows))
            # A line of one empty cell is written ``""``.
            if plain and not (width == 1 and "" in flat):
                text = _joined(flat, width, len(rows), out.getvalue())
                del flat
                return text.encode("utf-8")
            writer.writerows(flat[i : i + width] for i in range(0, len(flat), width))
        return out.getvalue().encode("utf-8")
    dumps = orjson.dumps
    return b"".join(
        dumps(
            dict(zip(columns, _values(row, columns, name), strict=True)),
            default=_ndjson_default,
            option=orjson.OPT_APPEND_NEWLINE,
        )
        for row in rows
    )


def export_rows(
    *,
    name: Any = _MISSING,
    input: Any = None,
    tenant: Any = "none",
    idempotency_key: Any = _MISSING,
    source: Any = _MISSING,
    sink: Any = _MISSING,
    prefix: Any = _MISSING,
    format: Any = "csv",
    columns: Any = _MISSING,
    queue: str = "default",
    retry: Retry | None = None,
    concurrency: int | Concurrency | None = None,
    step_timeout: Duration | None = None,
    on_settled: Callable[[Settled], Any] | None = None,
    read_ahead: Any = False,
    **unknown: Any,
) -> Job[Any, dict[str, Any]]:
    """Declare an export: a job that writes a paged read to object storage.

    ``source(input, cursor)`` answers ``(rows, next_cursor)`` (``None``: the
    last page; the first page is asked with ``cursor=None``, each later one with
    the JSON form of the cursor the page before answered). Rows are tuples (one
    value per column), mappings or attrs instances. ``sink(input)`` answers an
    obstore store and ``prefix`` (a ``str`` or a function of the input) the key
    prefix: page ``n`` is the object ``<prefix>/part-NNNNN.csv`` (or
    ``.ndjson``), written whole, so a replayed page overwrites its part. A csv
    part starts with a header line naming ``columns``; a text cell starting
    with ``=``, ``+``, ``-`` or ``@`` is prefixed with ``'`` (a spreadsheet
    would run it as a formula). The run's result is ``{"pages": n, "rows": n,
    "prefix": str}``.

    ``read_ahead=True`` (an addition to the spec, off by default) calls
    ``source`` for page ``n + 1`` while page ``n`` renders and writes its part,
    so the database's query overlaps the client's work. Page ``n + 1``'s step
    uses the answer (a replayed page reads again); the read itself runs before
    page ``n`` is recorded. Turn it on only for a source that just reads (a
    keyset query): never for one that claims, marks or deletes rows as it reads
    them. One more page of rows is held in memory.

    Every argument is a keyword; the others are as for :func:`~trio_jobs.job`.
    A bad declaration is ``X_JOB_DECLARATION_INVALID`` naming every fault.

    >>> export_orders = export_rows(
    ...     name="orders.export",
    ...     input=ExportOrders,
    ...     idempotency_key=lambda i: f"orders-export:{i.org}",
    ...     source=lambda i, after: fetch_orders(i.org, after, limit=10_000),
    ...     sink=lambda i: S3Store("exports", region="eu-west-1"),
    ...     prefix=lambda i: f"{i.org}/orders",
    ...     columns=["id", "total"],
    ... )
    """
    faults: list[str] = []
    if unknown:
        faults.append(f"unknown field(s): {', '.join(sorted(unknown))}")
    name_ok = check_factory_name(name, MAX_NAME, "the job's name", faults)
    check_function(
        source, "source", 2, "source(input, cursor) answering (rows, next_cursor)", faults
    )
    check_function(sink, "sink", 1, "sink(input) answering an obstore store", faults)
    if prefix is _MISSING or prefix is None:
        faults.append("prefix= is required: a str or a function of the input")
    elif not _prefix_ok(prefix):
        faults.append("prefix must be a str or a function of the input")
    if format not in _EXT:
        faults.append('format must be "csv" or "ndjson"')
    cols = _check_column_list(columns, faults)
    if type(read_ahead) is not bool:
        faults.append("read_ahead must be True or False")
    return _declare(
        "export_rows",
        "export",
        name if name_ok else "export",
        faults,
        idempotency_key,
        dict(
            input=input,
            tenant=tenant,
            queue=queue,
            retry=retry,
            concurrency=concurrency,
            step_timeout=step_timeout,
            on_settled=on_settled,
        ),
        lambda job_name: _body(job_name, source, sink, prefix, format, cols, read_ahead is True),
    )


class _Ask:
    """One read asked ahead: its cursor, and its outcome once ``done`` is set."""

    def __init__(self, cursor: Any) -> None:
        self.cursor = cursor
        self.started = trio.Event()
        self.done = trio.Event()
        self.scope = trio.CancelScope()
        self.result: outcome.Outcome[Any] | None = None


class _Ahead:
    """The export's read-ahead: a task of the export's nursery (started outside
    any step, so a read carries no step's context) that runs ``read(cursor)``
    when a page asks for the next one. :meth:`take` answers a page's read: the
    one asked ahead when its cursor is the page's, else a read of its own."""

    def __init__(self, nursery: trio.Nursery, read: Callable[[Any], Any]) -> None:
        self._read = read
        self._ask: _Ask | None = None
        # Unbounded, and served in order: a read asked and dropped ends (or is
        # skipped) before the next one starts, so the source never runs twice at once.
        self._send, recv = trio.open_memory_channel[_Ask](math.inf)
        nursery.start_soon(self._serve, recv)

    async def _serve(self, recv: trio.MemoryReceiveChannel[_Ask]) -> None:
        async for ask in recv:
            ask.started.set()
            if ask.scope.cancel_called:
                ask.done.set()
                continue
            with ask.scope:
                try:
                    ask.result = outcome.Value(await self._read(ask.cursor))
                except Exception as exc:  # raised by the step of the page it is for
                    ask.result = outcome.Error(exc)
            ask.done.set()

    def _drop(self) -> None:
        if self._ask is not None:
            self._ask.scope.cancel()
            self._ask = None

    async def ask(self, cursor: Any) -> None:
        """Start reading the page at ``cursor`` (dropping a read asked before).
        Answers once the read is under way: the serving task runs from
        ``started`` into the source without a pause until the source waits
        (on its thread or its socket), so a page's render that follows runs
        while the database answers."""
        self._drop()
        self._ask = ask = _Ask(cursor)
        self._send.send_nowait(ask)
        await ask.started.wait()

    async def take(self, cursor: Any) -> Any:
        """Page ``cursor``'s source answer (raising what its read raised)."""
        ask, self._ask = self._ask, None
        if ask is None or ask.cursor != cursor:
            if ask is not None:
                ask.scope.cancel()
                await ask.done.wait()  # never two reads at once
            return await self._read(cursor)
        await ask.done.wait()
        assert ask.result is not None
        return ask.result.unwrap()


def _body(
    name: str,
    source: Callable[[Any, Any], Any],
    sink: Callable[[Any], Any],
    prefix: str | Callable[[Any], Any],
    fmt: str,
    columns: tuple[str, ...],
    read_ahead: bool,
) -> Callable[[JobContext[Any]], Any]:
    async def run_export(ctx: JobContext[Any]) -> dict[str, Any]:
        if not read_ahead:
            return await run_pages(ctx, None)
        failure: BaseException | None = None
        answer: dict[str, Any] = {}
        async with trio.open_nursery() as nursery:

            async def read(cursor: Any) -> Any:
                return await _call(source, ctx.input, cursor)

            try:
                answer = await run_pages(ctx, _Ahead(nursery, read))
            except BaseException as exc:  # raised past the nursery, never in a group
                failure = exc
            nursery.cancel_scope.cancel()
        if failure is not None:
            raise failure
        return answer

    async def run_pages(ctx: JobContext[Any], ahead: _Ahead | None) -> dict[str, Any]:
        store = await _call(sink, ctx.input)
        base = await _resolve_prefix(prefix, ctx.input, "prefix")
        cursor: Any = None
        pages = 0
        rows = 0
        while True:
            number = pages + 1

            async def page(number: int = number, cursor: Any = cursor, before: int = rows) -> Any:
                if ahead is None:
                    answer = await _call(source, ctx.input, cursor)
                else:
                    answer = await ahead.take(cursor)
                found, nxt = _items_of(name, answer)
                del answer  # the source's own list: only ``found`` holds the rows now
                nxt = payload_form(
                    nxt,
                    what=f"export {name!r}: the cursor source answered",
                    code=ErrorCode.X_STEP_OUTPUT_UNSERIALIZABLE,
                )
                if nxt is not None and nxt == cursor:
                    raise JobsError(
                        ErrorCode.X_JOB_DECLARATION_INVALID,
                        f"export {name!r}: source answered the cursor it was asked with; "
                        "the export would never end (answer where the next page starts, "
                        "or None after the last page)",
                    )
                if ahead is not None and nxt is not None:
                    await ahead.ask(nxt)  # page n + 1 is read while this page is written
                count = len(found)
                body = render(fmt, columns, found, name)
                del found  # the rows are not held while the part is written
                part = f"part-{number:05d}.{_EXT[fmt]}"
                await put(store, f"{base}/{part}" if base else part, body)
                return {"cursor": nxt, "rows": before + count}

            out = await ctx.step.run(f"{PAGE_STEP_PREFIX}{number}", page)
            pages = number
            cursor, rows = out["cursor"], int(out["rows"])
            if cursor is None:
                return {"pages": pages, "rows": rows, "prefix": base}

    run_export.__name__ = run_export.__qualname__ = name
    return run_export
