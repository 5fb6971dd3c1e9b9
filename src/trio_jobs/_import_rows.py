"""``import_rows()``: read an object a page at a time into the app's tables.

An import is a job (``kind == "import"``) whose body is a loop the library
writes: page ``n`` is the step ``page:<n>``. It reads the bytes from its byte
offset to ``page_bytes`` further in ONE ranged read, keeps the records that end
inside them (record ends found on the bytes, quote-aware for csv), parses and
structures them, hands them to ``handle(rows, input)`` ``batch`` at a time,
writes the page's error part, and returns its checkpoint: the byte offset just
past its last whole record (and the physical line there). No carry survives a
step: the bytes after the last whole record are read again by the next page, so
a character that a page edge splits is always read whole, and a killed attempt
resumes at the checkpoint of the last page that completed.

Page 1 also records the object's size and etag; every later page's read must
answer the same pair, or the run is ``X_IMPORT_SOURCE_CHANGED`` (two files are
never mixed).
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import orjson
import trio

from ._backfill import MAX_NAME
from ._context import _call
from ._declare import Concurrency, Job, Retry, check_factory_name, check_function, job
from ._enqueue import _MISSING
from ._import_form import FieldFault, csv_maker, fault_field
from ._serialization import converter
from ._store import ObjectMeta, get_range, head, put
from ._time import Duration
from ._validate import text_fault
from .errors import ErrorCode, JobDeclarationError, JobsError

if TYPE_CHECKING:
    from ._context import JobContext
    from ._settled import Settled

__all__ = ["ErrorSink", "import_rows"]

#: Page ``n`` of an import (or an export) is the step ``f"page:{n}"``.
PAGE_STEP_PREFIX = "page:"
_BOM = b"\xef\xbb\xbf"
_FORMATS = ("csv", "ndjson")


def _prefix_ok(value: object) -> bool:
    return isinstance(value, str) or callable(value)


@attrs.frozen
class ErrorSink:
    """Where an import writes its refused rows: ``sink(input)`` answers an
    obstore store, ``prefix`` (a ``str`` or a function of the input) the key
    prefix. Each page with a refused row writes
    ``<prefix>/<run_id>/errors-NNNNN.ndjson`` (``NNNNN``: the page number), one
    ``{"line": n, "field": name | null, "code": "X_..."}`` a line, never the
    refused value.

    >>> ErrorSink(sink=lambda i: LocalStore("/srv/imports"), prefix=lambda i: f"{i.org}/errors")
    """

    sink: Callable[[Any], Any]
    prefix: str | Callable[[Any], str]


async def _resolve_prefix(prefix: str | Callable[[Any], Any], value: Any, what: str) -> str:
    answer = prefix if isinstance(prefix, str) else await _call(prefix, value)
    if not isinstance(answer, str) or (answer and text_fault(answer) is not None):
        raise JobsError(
            ErrorCode.X_JOB_DECLARATION_INVALID,
            f"{what} must answer a string key prefix; it answered a {type(answer).__name__}",
        )
    return answer.rstrip("/")


@attrs.frozen
class _Spec:
    """A checked declaration: what each page needs."""

    name: str
    source: Callable[[Any], Any]
    key: Callable[[Any], Any]
    format: str
    columns: tuple[str, ...]
    schema: type
    handle: Callable[[Any, Any], Any]
    errors: ErrorSink | None
    page_bytes: int
    batch: int
    max_record_bytes: int
    max_row_errors: int


def import_rows(
    *,
    name: Any = _MISSING,
    input: Any = None,
    tenant: Any = "none",
    idempotency_key: Any = _MISSING,
    source: Any = _MISSING,
    key: Any = _MISSING,
    format: Any = "csv",
    columns: Any = _MISSING,
    schema: Any = _MISSING,
    handle: Any = _MISSING,
    errors: Any = None,
    page_bytes: Any = 1 << 20,
    batch: Any = 500,
    max_record_bytes: Any = 64 << 10,
    max_row_errors: Any = 1000,
    queue: str = "default",
    retry: Retry | None = None,
    concurrency: int | Concurrency | None = None,
    step_timeout: Duration | None = None,
    on_settled: Callable[[Settled], Any] | None = None,
    **unknown: Any,
) -> Job[Any, dict[str, Any]]:
    """Declare an import: a job that reads one object, a page at a time, into ``handle``.

    ``source(input)`` answers an obstore store (``LocalStore``, ``S3Store``,
    ``GCSStore``, ``AzureStore``, ``MemoryStore``) and ``key(input)`` the
    object's key in it. ``format`` is ``"csv"`` (a header naming exactly
    ``columns``, in any order) or ``"ndjson"`` (one JSON object a line, keys
    among ``columns``). Each record is structured into ``schema`` (an attrs
    class whose fields include ``columns``) with cattrs; csv text is coerced as
    a form's would be (``"12"`` to ``int``, ``"on"`` to ``True``, an empty cell
    to ``None`` where the field allows it). ``handle(rows, input)`` gets up to
    ``batch`` rows at a time, and is called **at least once** per page (a page
    cut short between ``handle`` and its checkpoint runs again): write with an
    upsert.

    Each page is one step (``page:1``, ...) reading ``page_bytes`` from its
    byte offset; its checkpoint is the offset past its last whole record. A
    refused row is reported as ``{line, field, code}`` (the record's first
    physical line, the field or ``null``, the code), never its value, in
    ``errors`` (an :class:`ErrorSink`); past ``max_row_errors`` refused rows the
    run fails with ``X_IMPORT_TOO_MANY_ERRORS`` (the batch that crossed it is
    not handled). A record longer than ``max_record_bytes`` is
    ``X_IMPORT_RECORD_TOO_LARGE``; a header other than ``columns``
    ``X_IMPORT_HEADER_MISMATCH``; an object that changes between pages
    ``X_IMPORT_SOURCE_CHANGED``; a missing one ``X_IMPORT_SOURCE_MISSING``.
    The run's result is ``{"rows": n, "refused": n, "pages": n,
    "error_prefix": "<prefix>/<run_id>" | None}``.

    ``errors=`` is required unless ``max_row_errors=0`` (every refused row then
    fails the run). The other arguments are as for :func:`~trio_jobs.job`.
    Every argument is a keyword; a bad declaration is
    ``X_JOB_DECLARATION_INVALID`` naming every fault.

    >>> import_orders = import_rows(
    ...     name="orders.import",
    ...     input=ImportOrders,
    ...     idempotency_key=lambda i: f"orders:{i.key}",
    ...     source=lambda i: LocalStore("/srv/imports"),
    ...     key=lambda i: i.key,
    ...     columns=["id", "total"],
    ...     schema=Order,
    ...     handle=upsert_orders,
    ...     errors=ErrorSink(sink=lambda i: LocalStore("/srv/imports"), prefix="errors"),
    ... )
    """
    faults: list[str] = []
    if unknown:
        faults.append(f"unknown field(s): {', '.join(sorted(unknown))}")
    name_ok = check_factory_name(name, MAX_NAME, "the job's name", faults)
    check_function(source, "source", 1, "source(input) answering an obstore store", faults)
    check_function(key, "key", 1, "key(input) answering the object's key", faults)
    check_function(handle, "handle", 2, "handle(rows, input) writing one batch", faults)
    if format not in _FORMATS:
        faults.append('format must be "csv" or "ndjson"')
    cols = _check_columns(columns, schema, faults)
    for field, value, low in (
        ("page_bytes", page_bytes, 1),
        ("batch", batch, 1),
        ("max_record_bytes", max_record_bytes, 1),
        ("max_row_errors", max_row_errors, 0),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            faults.append(f"{field} must be a whole number of at least {low}")
    if errors is None:
        if max_row_errors != 0:
            faults.append(
                "errors= is required (an ErrorSink for the refused rows' report), "
                "or pass max_row_errors=0 to fail the run on the first refused row"
            )
    elif not isinstance(errors, ErrorSink):
        faults.append("errors must be an ErrorSink(sink=, prefix=)")
    elif not callable(errors.sink) or not _prefix_ok(errors.prefix):
        faults.append(
            "errors=ErrorSink(sink=, prefix=): sink is a function of the input answering "
            "a store, prefix a str or a function of the input"
        )
    return _declare(
        "import_rows",
        "import",
        name if name_ok else "import",
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
        lambda job_name: _body(
            _Spec(
                job_name,
                source,
                key,
                format,
                cols,
                schema,
                handle,
                errors,
                page_bytes,
                batch,
                max_record_bytes,
                max_row_errors,
            )
        ),
    )


def _check_column_list(columns: Any, faults: list[str]) -> tuple[str, ...]:
    if columns is _MISSING or columns is None:
        faults.append("columns= is required: the list of column names")
        return ()
    if (
        isinstance(columns, str)
        or not isinstance(columns, Sequence)
        or not columns
        or not all(isinstance(c, str) and c and text_fault(c) is None for c in columns)
    ):
        faults.append("columns must be a non-empty list of column names (strings)")
        return ()
    if len(set(columns)) != len(columns):
        faults.append("columns must not name a column twice")
        return ()
    return tuple(columns)


def _check_columns(columns: Any, schema: Any, faults: list[str]) -> tuple[str, ...]:
    cols = _check_column_list(columns, faults)
    if schema is _MISSING or schema is None:
        faults.append("schema= is required: the attrs class each row is structured into")
        return cols
    if not (isinstance(schema, type) and attrs.has(schema)):
        faults.append("schema must be an attrs class")
        return cols
    fields = attrs.fields_dict(schema)
    if not cols:
        return cols
    unknown = [c for c in cols if c not in fields]
    if unknown:
        faults.append(f"columns not fields of {schema.__name__}: {', '.join(unknown)}")
    needed = [
        f.name
        for f in fields.values()
        if f.init and f.default is attrs.NOTHING and f.name not in cols
    ]
    if needed:
        faults.append(
            f"fields of {schema.__name__} without a default missing from columns: "
            + ", ".join(needed)
        )
    return cols


def _declare(
    factory: str,
    kind: str,
    job_name: str,
    faults: list[str],
    idempotency_key: Any,
    options: dict[str, Any],
    body: Callable[[str], Callable[..., Any]],
) -> Job[Any, Any]:
    """The tail both data factories share: ``idempotency_key`` required, then
    ``job()`` with the options, every fault named at once, ``kind`` set."""
    if idempotency_key is _MISSING or idempotency_key is None:
        also = f" (also: {'; '.join(faults)})" if faults else ""
        raise JobDeclarationError(
            ErrorCode.X_IDEMPOTENCY_REQUIRED,
            f"{factory}() needs idempotency_key=: a function of the input answering the "
            f'run\'s key, e.g. idempotency_key=lambda i: f"{kind}:{{i.key}}"{also}',
            meta={"faults": ["idempotency_key= is required", *faults]},
        )
    declare: Callable[[Callable[..., Any]], Job[Any, Any]] | None = None
    try:
        declare = job(name=job_name, idempotency_key=idempotency_key, **options)
    except JobDeclarationError as exc:
        faults.extend(exc.meta.get("faults") or [exc.message])
    if faults or declare is None:
        raise JobDeclarationError(
            ErrorCode.X_JOB_DECLARATION_INVALID,
            f"{factory} declaration is invalid: " + "; ".join(faults),
            meta={"faults": faults},
        )
    handle_ = declare(body(job_name))
    handle_.kind = kind
    handle_.__doc__ = f"The {kind} {job_name!r}."
    return handle_


# ---------------------------------------------------------------------------
# Records on bytes


def _csv_record_end(data: bytes) -> int:
    """The index just past the last newline of ``data`` outside quotes (``data``
    starts at a record start, so quotes pair from its first byte), or -1."""
    end = data.rfind(b"\n")
    if end < 0:
        return -1
    quotes = data.count(b'"', 0, end)
    while quotes % 2:
        nxt = data.rfind(b"\n", 0, end)
        if nxt < 0:
            return -1
        quotes -= data.count(b'"', nxt, end)
        end = nxt
    return end + 1


def _ndjson_record_end(data: bytes) -> int:
    # A JSON text holds no raw newline: every newline ends a record.
    end = data.rfind(b"\n")
    return end + 1 if end >= 0 else -1


def _records(region: Any, fmt: str) -> tuple[list[Any], list[int] | None, bool]:
    """The records of ``region`` (``bytes``, or the ``str`` it decodes to; each
    record without its newline), the index of the physical line each starts on
    (``None``: record ``i`` is line ``i``), and whether the last record is an
    unclosed quote (csv at the end of the file)."""
    nl, quote = ("\n", '"') if isinstance(region, str) else (b"\n", b'"')
    lines = region.split(nl)
    if region.endswith(nl):
        lines.pop()
    if fmt != "csv" or quote not in region:
        return lines, None, False
    records: list[Any] = []
    starts: list[int] = []
    open_at = -1
    pending: list[Any] = []
    for i, line in enumerate(lines):
        odd = line.count(quote) % 2 == 1
        if open_at < 0:
            if odd:
                open_at, pending = i, [line]
            else:
                records.append(line)
                starts.append(i)
        else:
            pending.append(line)
            if odd:
                records.append(nl.join(pending))
                starts.append(open_at)
                open_at = -1
    if open_at >= 0:
        records.append(nl.join(pending))
        starts.append(open_at)
        return records, starts, True
    return records, starts, False


def _csv_fields(text: str) -> list[str]:
    if '"' not in text:
        return text.split(",")
    return next(csv.reader([text], strict=True))


def _split_quoted(text: str) -> list[str] | tuple[()]:
    """A quoted record's cells; ``()`` for one that is not csv (a stray quote)."""
    try:
        return next(csv.reader([text], strict=True))
    except csv.Error:
        return ()


# ---------------------------------------------------------------------------
# The run


class _Page:
    """One page's parse: structured rows handed on ``batch`` at a time, refused
    rows collected for the report.

    A batch's ``handle`` runs in its own task while the page parses the next
    batch (a handle waiting on its database overlaps the parse instead of
    adding to it); the next batch is handed only after it returned, so calls
    never overlap and keep the file's order. A handle's exception fails the
    page at the next hand-over or at the page's end."""

    def __init__(
        self,
        spec: _Spec,
        ctx: JobContext[Any],
        refused_before: int,
        report: tuple[str | None, int, Any],
        makers: dict[tuple[str, ...], Callable[[Sequence[str]], Any]],
        nursery: trio.Nursery,
    ) -> None:
        self.spec = spec
        self.nursery = nursery
        self.handed: trio.Event | None = None
        self.failure: Exception | None = None
        self.ctx = ctx
        self.report_prefix, self.page_number, self.sink_store = report
        self.refused: list[dict[str, Any]] = []
        self.refused_before = refused_before
        self.pending: list[Any] = []
        self.rows = 0
        # ndjson values are JSON's own types: the library's converter, strict.
        self.hook = converter.get_structure_hook(spec.schema)
        self.makers = makers

    def maker(self, header: list[str]) -> Callable[[Sequence[str]], Any]:
        """The row function of a csv header (built once an import and header)."""
        found = self.makers.get(tuple(header))
        if found is None:
            found = self.makers[tuple(header)] = csv_maker(self.spec.schema, header)
        return found

    async def refuse(self, line: int, field: str | None, code: ErrorCode) -> None:
        self.refused.append({"line": line, "field": field, "code": str(code)})
        total = self.refused_before + len(self.refused)
        if total > self.spec.max_row_errors:
            # The report is written first; the batch that crossed the limit is not handled.
            await self.write_report()
            raise JobsError(
                ErrorCode.X_IMPORT_TOO_MANY_ERRORS,
                f"import {self.spec.name!r}: {total} rows refused, past max_row_errors="
                f"{self.spec.max_row_errors}; read the report under "
                f"{self.report_prefix or '(no error sink)'} and fix the file",
                meta={"refused": total, "line": line, "error_prefix": self.report_prefix},
            )

    async def write_report(self) -> None:
        if not self.refused or self.report_prefix is None:
            return
        body = b"".join(orjson.dumps(r) + b"\n" for r in self.refused)
        key = f"{self.report_prefix}/errors-{self.page_number:05d}.ndjson"
        await put(self.sink_store, key, body)

    async def take(self, line: int, values: dict[str, Any]) -> None:
        try:
            row = self.hook(values, self.spec.schema)
        except Exception as exc:  # cattrs, or the class's own validators
            await self.refuse(line, fault_field(exc), ErrorCode.X_IMPORT_ROW_INVALID)
            return
        self.pending.append(row)
        if len(self.pending) >= self.spec.batch:
            await self.flush()

    async def flush(self) -> None:
        """Hand the pending rows to ``handle`` once the batch before returned."""
        if self.pending:
            rows, self.pending = self.pending, []
            await self.settle()
            self.handed = done = trio.Event()
            self.nursery.start_soon(self._handle, rows, done)
            # Let the handle start (up to its first wait) before the parse goes on.
            await trio.lowlevel.checkpoint()

    async def _handle(self, rows: list[Any], done: trio.Event) -> None:
        try:
            await _call(self.spec.handle, rows, self.ctx.input)
            self.rows += len(rows)
        except Exception as exc:  # the page raises it, in its own task
            self.failure = exc
        finally:
            done.set()

    async def settle(self) -> None:
        """Wait for the batch in ``handle``; raise what it raised."""
        if self.handed is not None:
            await self.handed.wait()
            self.handed = None
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise failure


def _too_large(spec: _Spec, offset: int, line: int) -> JobsError:
    return JobsError(
        ErrorCode.X_IMPORT_RECORD_TOO_LARGE,
        f"import {spec.name!r}: the record at byte {offset} (line {line}) is longer than "
        f"max_record_bytes={spec.max_record_bytes}; usually an unclosed quote: fix the "
        "file, or raise max_record_bytes if such records are expected",
        meta={"offset": offset, "line": line},
    )


def _body(spec: _Spec) -> Callable[[JobContext[Any]], Any]:
    record_end = _csv_record_end if spec.format == "csv" else _ndjson_record_end
    makers: dict[tuple[str, ...], Callable[[Sequence[str]], Any]] = {}

    async def run_import(ctx: JobContext[Any]) -> dict[str, Any]:
        store = await _call(spec.source, ctx.input)
        key = await _call(spec.key, ctx.input)
        if not isinstance(key, str) or not key:
            raise JobsError(
                ErrorCode.X_JOB_DECLARATION_INVALID,
                f"import {spec.name!r}: key must answer the object's key (a non-empty string)",
            )
        report_prefix: str | None = None
        sink_store: Any = None
        if spec.errors is not None:
            base = await _resolve_prefix(spec.errors.prefix, ctx.input, "errors.prefix")
            report_prefix = f"{base}/{ctx.run_id}" if base else ctx.run_id
            sink_store = await _call(spec.errors.sink, ctx.input)

        def changed(offset: int) -> JobsError:
            return JobsError(
                ErrorCode.X_IMPORT_SOURCE_CHANGED,
                f"import {spec.name!r}: the object {key!r} changed (size or etag) since "
                "page 1 read it; an import never mixes two files: upload the new file "
                "under a new key and import that",
                meta={"key": key, "offset": offset},
            )

        async def read(offset: int, length: int, pinned: ObjectMeta) -> tuple[bytes, bool]:
            if offset >= pinned.size:
                return b"", True
            data, meta = await get_range(store, key, offset, offset + length)
            if meta != pinned:
                raise changed(offset)
            return data, offset + len(data) >= pinned.size

        async def page(number: int, prev: dict[str, Any]) -> dict[str, Any]:
            offset: int = prev["offset"]
            line: int = prev["line"]
            if number == 1:
                pinned = await head(store, key)
            else:
                pinned = ObjectMeta(prev["size"], prev["etag"])
            data, last = await read(offset, spec.page_bytes, pinned)
            end = len(data) if last else record_end(data)
            if end < 0:
                # No record ends inside the page: read on, up to the longest record.
                data, last = await read(offset, spec.max_record_bytes + 1, pinned)
                end = len(data) if last else record_end(data)
                if end < 0:
                    raise _too_large(spec, offset, line)
            region = data[:end]
            skip = len(_BOM) if offset == 0 and region.startswith(_BOM) else 0
            body = region[skip:]
            # A csv page decodes whole (one call, not one a record); a page with a
            # byte that is not UTF-8 is read record by record, to refuse that one.
            text = _decode(body) if spec.format == "csv" else None
            records, starts, unclosed = _records(body if text is None else text, spec.format)
            if len(region) > spec.max_record_bytes:
                # A character is at most 4 bytes: a shorter text record is short enough.
                chars = spec.max_record_bytes // 4 if text is not None else spec.max_record_bytes
                for i, record in enumerate(records):
                    if len(record) > chars and (
                        text is None or len(record.encode()) > spec.max_record_bytes
                    ):
                        at = starts[i] if starts is not None else i
                        before = sum(len(x) + 1 for x in body.split(b"\n")[:at])
                        raise _too_large(spec, offset + skip + before, line + at)
            header = prev["header"]
            async with trio.open_nursery() as nursery:
                work = _Page(
                    spec,
                    ctx,
                    prev["refused"],
                    (report_prefix, number, sink_store),
                    makers,
                    nursery,
                )
                try:
                    if spec.format == "csv":
                        if text is None:
                            records = [_decode(r) for r in records]
                            clean, crlf = False, True
                        else:
                            clean, crlf = "\x00" not in text, "\r" in text
                        header = await _csv_page(
                            spec,
                            work,
                            (records, starts, clean, crlf),
                            unclosed and last,
                            line,
                            header,
                        )
                    else:
                        await _ndjson_page(spec, work, records, starts, line)
                    await work.flush()
                    await work.settle()
                    await work.write_report()
                except Exception as exc:
                    # A batch in handle finishes first (it was handed; a fault of its
                    # own, from earlier in the file, is the one the page reports).
                    fault: Exception | None = exc
                else:
                    fault = None
                if fault is not None:
                    try:
                        await work.settle()
                    except Exception as earlier:
                        fault = earlier
            if fault is not None:
                raise fault
            if last and spec.format == "csv" and header is None:
                raise _header_mismatch(spec, "the file has no header line")
            return {
                "offset": offset + end,
                "line": line + region.count(b"\n"),
                "rows": prev["rows"] + work.rows,
                "refused": prev["refused"] + len(work.refused),
                "header": header,
                "size": pinned.size,
                "etag": pinned.etag,
                "done": last,
            }

        state: dict[str, Any] = {
            "offset": 0,
            "line": 1,
            "rows": 0,
            "refused": 0,
            "header": None,
            "size": None,
            "etag": None,
        }
        number = 0
        while True:
            number += 1

            # Default arguments: step.run hands a page fn that takes none no signal.
            async def this_page(number: int = number, prev: dict[str, Any] = state) -> Any:
                return await page(number, prev)

            state = await ctx.step.run(f"{PAGE_STEP_PREFIX}{number}", this_page)
            if state["done"]:
                return {
                    "rows": state["rows"],
                    "refused": state["refused"],
                    "pages": number,
                    "error_prefix": report_prefix if state["refused"] else None,
                }

    run_import.__name__ = run_import.__qualname__ = spec.name
    return run_import


def _header_mismatch(spec: _Spec, why: str, **meta: Any) -> JobsError:
    return JobsError(
        ErrorCode.X_IMPORT_HEADER_MISMATCH,
        f"import {spec.name!r}: {why}; the csv's first line must name exactly the "
        f"columns {', '.join(spec.columns)} (in any order)",
        meta=meta,
    )


def _decode(record: bytes) -> str | None:
    try:
        return record.decode("utf-8")
    except UnicodeDecodeError:
        return None


async def _csv_page(
    spec: _Spec,
    work: _Page,
    parsed: tuple[list[str | None], list[int] | None, bool, bool],
    unclosed_at_end: bool,
    first_line: int,
    header: list[str] | None,
) -> list[str] | None:
    """Read one page's records (``None``: one that is not UTF-8). ``clean``: no
    record holds a NUL; ``crlf``: a record may end with a carriage return."""
    records, starts, clean, crlf = parsed
    width = len(spec.columns)
    make = None if header is None else work.maker(header)
    size, pending = spec.batch, work.pending
    last = len(records) - 1
    for i, text in enumerate(records):
        if crlf and text is not None and text.endswith("\r"):
            text = text[:-1]
        if not text:
            if text is None:
                if make is None:
                    raise _header_mismatch(spec, "the header line is not UTF-8 text")
                await work.refuse(
                    _line(first_line, starts, i), None, ErrorCode.X_IMPORT_ROW_ENCODING
                )
            continue  # a blank line is nothing
        if make is None or header is None:
            header = _read_header(spec, text)
            make = work.maker(header)
            continue
        fields = text.split(",") if '"' not in text else _split_quoted(text)
        if (
            len(fields) != width
            or (not clean and "\x00" in text)
            or (unclosed_at_end and i == last)
        ):
            # A ragged line, a stray quote, a NUL, an unclosed quote at the file's end.
            await work.refuse(_line(first_line, starts, i), None, ErrorCode.X_IMPORT_ROW_MALFORMED)
            continue
        try:
            row = make(fields)
        except FieldFault as fault:
            line = _line(first_line, starts, i)
            await work.refuse(line, fault.field, ErrorCode.X_IMPORT_ROW_INVALID)
            continue
        pending.append(row)
        if len(pending) >= size:
            await work.flush()
            pending = work.pending
    return header


def _line(first_line: int, starts: list[int] | None, i: int) -> int:
    return first_line + (starts[i] if starts is not None else i)


def _read_header(spec: _Spec, text: str | None) -> list[str]:
    if text is None or "\x00" in text:
        raise _header_mismatch(spec, "the header line is not UTF-8 text")
    try:
        names = [n.strip() for n in _csv_fields(text)]
    except csv.Error:
        raise _header_mismatch(spec, "the header line is not valid csv") from None
    missing = [c for c in spec.columns if c not in names]
    extra = sorted({n for n in names if n not in spec.columns})
    if missing or extra or len(names) != len(spec.columns):
        raise _header_mismatch(
            spec,
            "the header names "
            + "; ".join(
                part
                for part in (
                    f"no {', '.join(missing)}" if missing else "",
                    f"undeclared {', '.join(n[:64] for n in extra[:10])}" if extra else "",
                    "a column twice" if not missing and not extra else "",
                )
                if part
            ),
            missing=missing,
            undeclared=[n[:64] for n in extra[:10]],
        )
    return names


async def _ndjson_page(
    spec: _Spec,
    work: _Page,
    records: list[bytes],
    starts: list[int] | None,
    first_line: int,
) -> None:
    allowed = frozenset(spec.columns)
    for i, record in enumerate(records):
        line = first_line + (starts[i] if starts is not None else i)
        if not record.strip():
            continue
        try:
            value = orjson.loads(record)
        except orjson.JSONDecodeError:
            code = (
                ErrorCode.X_IMPORT_ROW_ENCODING
                if _decode(record) is None
                else ErrorCode.X_IMPORT_ROW_MALFORMED
            )
            await work.refuse(line, None, code)
            continue
        if not isinstance(value, dict):
            await work.refuse(line, None, ErrorCode.X_IMPORT_ROW_MALFORMED)
            continue
        extra = [k for k in value if k not in allowed]
        if extra:
            await work.refuse(line, sorted(extra)[0][:64], ErrorCode.X_IMPORT_ROW_INVALID)
            continue
        await work.take(line, value)
