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

The reading and parsing run in a task of their own, ahead of the steps (see
"The run" below): page ``n + 1`` is parsed while page ``n``'s batches are in
``handle``, and page ``n``'s step still checkpoints only after its own batches
returned.

Page 1 also records the object's size and etag; every later page's read must
answer the same pair, or the run is ``X_IMPORT_SOURCE_CHANGED`` (two files are
never mixed).
"""

from __future__ import annotations

import csv
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import orjson
import trio

from ._backfill import MAX_NAME
from ._context import _call
from ._declare import Concurrency, Job, Retry, check_factory_name, check_function, job
from ._enqueue import _MISSING
from ._gc_pause import paused_gc
from ._import_form import FieldFault, csv_maker, fault_field
from ._serialization import converter
from ._store import ObjectMeta, get_range, head, put
from ._time import Duration
from ._validate import text_fault
from .errors import ErrorCode, JobDeclarationError, JobsError

if TYPE_CHECKING:
    from trio import MemoryReceiveChannel, MemorySendChannel

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
#
# A task of the import's nursery reads and parses the pages in order and sends
# each page's batches, then the page's end, over a memory channel; the page's
# step receives them and hands each batch to ``handle``. The parse runs ahead of
# the handles (by the channel's one item and the batch being parsed), within a
# page and across a page's end: while the database writes a batch, the client
# parses the next, the next page's included. A page's step still checkpoints
# only after every batch of its page returned from ``handle``; nothing the
# reader found ahead (a refused row, a fault) is written or raised before the
# step of its page receives it.


class _RowFns:
    """An import's row functions, built once a header."""

    def __init__(self, schema: type) -> None:
        self.schema = schema
        self._hook: Callable[[Any, type], Any] | None = None
        self._makers: dict[tuple[str, ...], Callable[[Sequence[str]], Any]] = {}

    def hook(self) -> Callable[[Any, type], Any]:
        # ndjson values are JSON's own types: the library's converter, strict.
        if self._hook is None:
            self._hook = converter.get_structure_hook(self.schema)
        return self._hook

    def maker(self, header: list[str]) -> Callable[[Sequence[str]], Any]:
        """The row function of a csv header."""
        key = tuple(header)
        found = self._makers.get(key)
        if found is None:
            found = self._makers[key] = csv_maker(self.schema, header)
        return found


class _Crossed(Exception):
    """Internal: the refused row that took the run past ``max_row_errors``."""

    def __init__(self, total: int, line: int) -> None:
        super().__init__(total, line)
        self.total, self.line = total, line


def _page_key(number: int, prev: dict[str, Any]) -> tuple[Any, ...]:
    """What a page's parse reads: its number and the checkpoint before it, all
    of it but the count of rows handled."""
    header = prev["header"]
    return (
        number,
        prev["offset"],
        prev["line"],
        prev["refused"],
        None if header is None else tuple(header),
        prev["size"],
        prev["etag"],
    )


@attrs.define
class _PageEnd:
    """The last item of a page on the channel. ``after``: its checkpoint but for
    the rows handled (``None`` with a ``fault``); ``refused``: its report;
    ``crossed``: past ``max_row_errors`` (the batches before the crossing row
    were sent, the rest of the page was not); ``fault``: what its read or
    parse raised; ``next``: the key of the page the reader parses next
    (``None``: it stopped)."""

    after: dict[str, Any] | None = None
    refused: list[dict[str, Any]] = attrs.Factory(list)
    crossed: _Crossed | None = None
    fault: Exception | None = None
    next: tuple[Any, ...] | None = None


class _Parse:
    """One page's parse on the reader's side: rows gathered ``batch`` at a time
    and sent, refused rows kept for the page's end."""

    def __init__(
        self, spec: _Spec, refused_before: int, fns: _RowFns, send: MemorySendChannel[Any]
    ) -> None:
        self.spec = spec
        self.refused_before = refused_before
        self.fns = fns
        self.send = send
        self.refused: list[dict[str, Any]] = []
        self.pending: list[Any] = []

    def refuse(self, line: int, field: str | None, code: ErrorCode) -> None:
        self.refused.append({"line": line, "field": field, "code": str(code)})
        total = self.refused_before + len(self.refused)
        if total > self.spec.max_row_errors:
            raise _Crossed(total, line)

    async def flush(self) -> None:
        """Send the pending rows (the page's step hands them to ``handle``)."""
        if self.pending:
            rows, self.pending = self.pending, []
            await self.send.send(rows)


class _Reader:
    """The task that reads and parses the pages ahead of their steps.

    A page's step asks for its page by its checkpoint (:meth:`page`): the reader
    already on it (it was started by a page before, in this attempt) is used,
    any other is cancelled and one is started there (the first page an attempt
    runs, after the pages it replayed)."""

    def __init__(
        self,
        nursery: trio.Nursery,
        parse: Callable[[int, dict[str, Any], _Parse], Awaitable[dict[str, Any]]],
        spec: _Spec,
        fns: _RowFns,
    ) -> None:
        self._nursery = nursery
        self._parse = parse
        self._spec = spec
        self._fns = fns
        self._recv: MemoryReceiveChannel[Any] | None = None
        self._scope: trio.CancelScope | None = None
        self._at: tuple[Any, ...] | None = None

    def page(self, number: int, prev: dict[str, Any]) -> MemoryReceiveChannel[Any]:
        """The channel page ``number``'s batches, then its :class:`_PageEnd`,
        arrive on."""
        key = _page_key(number, prev)
        if self._recv is None or self._at != key:
            if self._scope is not None:
                self._scope.cancel()
            # One item of room: the reader parses on past a page's end while the
            # last batch of the page is in handle.
            send, self._recv = trio.open_memory_channel[Any](1)
            self._scope = scope = trio.CancelScope()
            self._nursery.start_soon(self._run, scope, send, number, prev)
        self._at = None  # until this page's end names the next
        return self._recv

    def ended(self, end: _PageEnd) -> None:
        self._at = end.next

    async def _run(
        self,
        scope: trio.CancelScope,
        send: MemorySendChannel[Any],
        number: int,
        prev: dict[str, Any],
    ) -> None:
        with scope, send:
            while True:
                work = _Parse(self._spec, prev["refused"], self._fns, send)
                end = _PageEnd()
                try:
                    end.after = await self._parse(number, prev, work)
                    await work.flush()
                except _Crossed as crossed:
                    end.crossed = crossed
                except Exception as exc:  # the page's step raises it
                    end.fault = exc
                end.refused = work.refused
                after = end.after
                if after is not None and not after["done"] and end.crossed is None:
                    end.next = _page_key(number + 1, after)
                await send.send(end)
                if after is None or end.next is None:
                    return
                number, prev = number + 1, after


def _too_large(spec: _Spec, offset: int, line: int) -> JobsError:
    return JobsError(
        ErrorCode.X_IMPORT_RECORD_TOO_LARGE,
        f"import {spec.name!r}: the record at byte {offset} (line {line}) is longer than "
        f"max_record_bytes={spec.max_record_bytes}; usually an unclosed quote: fix the "
        "file, or raise max_record_bytes if such records are expected",
        meta={"offset": offset, "line": line},
    )


def _too_many(spec: _Spec, crossed: _Crossed, report_prefix: str | None) -> JobsError:
    return JobsError(
        ErrorCode.X_IMPORT_TOO_MANY_ERRORS,
        f"import {spec.name!r}: {crossed.total} rows refused, past max_row_errors="
        f"{spec.max_row_errors}; read the report under "
        f"{report_prefix or '(no error sink)'} and fix the file",
        meta={"refused": crossed.total, "line": crossed.line, "error_prefix": report_prefix},
    )


def _body(spec: _Spec) -> Callable[[JobContext[Any]], Any]:
    record_end = _csv_record_end if spec.format == "csv" else _ndjson_record_end
    fns = _RowFns(spec.schema)

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

        async def parse(number: int, prev: dict[str, Any], work: _Parse) -> dict[str, Any]:
            """Read page ``number`` and parse it, sending its rows through
            ``work``; its checkpoint but for the rows handled."""
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
            # The page's records are data[skip:end]: read in place, not copied out.
            skip = len(_BOM) if offset == 0 and data.startswith(_BOM, 0, end) else 0
            # A csv page decodes whole (one call, not one a record, from the read's
            # own buffer); a page with a byte that is not UTF-8 is read record by
            # record, to refuse that one.
            text = _decode(memoryview(data)[skip:end]) if spec.format == "csv" else None
            body = data[skip:end] if text is None else b""
            records, starts, unclosed = _records(body if text is None else text, spec.format)
            # A character is at most 4 bytes: a shorter text record is short enough.
            chars = spec.max_record_bytes // 4 if text is not None else spec.max_record_bytes
            if end > spec.max_record_bytes and max(map(len, records), default=0) > chars:
                for i, record in enumerate(records):
                    if len(record) > chars and (
                        text is None or len(record.encode()) > spec.max_record_bytes
                    ):
                        at = starts[i] if starts is not None else i
                        lines = data[skip:end].split(b"\n")[:at]
                        before = sum(len(x) + 1 for x in lines)
                        raise _too_large(spec, offset + skip + before, line + at)
            header = prev["header"]
            if spec.format == "csv":
                if text is None:
                    records = [_decode(r) for r in records]
                    clean, crlf = False, True
                else:
                    clean, crlf = "\x00" not in text, "\r" in text
                header = await _csv_page(
                    spec, work, (records, starts, clean, crlf), unclosed and last, line, header
                )
                if last and header is None:
                    raise _header_mismatch(spec, "the file has no header line")
            else:
                await _ndjson_page(work, records, starts, line)
            return {
                "offset": offset + end,
                "line": line + data.count(b"\n", 0, end),
                "refused": prev["refused"] + len(work.refused),
                "header": header,
                "size": pinned.size,
                "etag": pinned.etag,
                "done": last,
            }

        async def write_report(number: int, refused: list[dict[str, Any]]) -> None:
            if not refused or report_prefix is None:
                return
            body = b"".join(orjson.dumps(r) + b"\n" for r in refused)
            await put(sink_store, f"{report_prefix}/errors-{number:05d}.ndjson", body)

        async def page(reader: _Reader, number: int, prev: dict[str, Any]) -> dict[str, Any]:
            """Hand the page's batches as they arrive (each call after the one
            before returned, in the file's order), write its report, answer its
            checkpoint."""
            feed = reader.page(number, prev)
            handed = 0
            while True:
                item = await feed.receive()
                if type(item) is _PageEnd:
                    break
                await _call(spec.handle, item, ctx.input)
                handed += len(item)
            reader.ended(item)
            if item.fault is not None:
                raise item.fault
            await write_report(number, item.refused)
            if item.crossed is not None:
                # The report is written; the batch that crossed the limit was not sent.
                raise _too_many(spec, item.crossed, report_prefix)
            after = item.after
            assert after is not None
            return {
                "offset": after["offset"],
                "line": after["line"],
                "rows": prev["rows"] + handed,
                "refused": after["refused"],
                "header": after["header"],
                "size": after["size"],
                "etag": after["etag"],
                "done": after["done"],
            }

        async def pages(reader: _Reader) -> dict[str, Any]:
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
                    return await page(reader, number, prev)

                state = await ctx.step.run(f"{PAGE_STEP_PREFIX}{number}", this_page)
                if state["done"]:
                    return {
                        "rows": state["rows"],
                        "refused": state["refused"],
                        "pages": number,
                        "error_prefix": report_prefix if state["refused"] else None,
                    }

        failure: BaseException | None = None
        answer: dict[str, Any] = {}
        async with trio.open_nursery() as nursery:
            try:
                answer = await pages(_Reader(nursery, parse, spec, fns))
            except BaseException as exc:  # raised past the nursery, never in a group
                failure = exc
            nursery.cancel_scope.cancel()
        if failure is not None:
            raise failure
        return answer

    run_import.__name__ = run_import.__qualname__ = spec.name
    return run_import


def _header_mismatch(spec: _Spec, why: str, **meta: Any) -> JobsError:
    return JobsError(
        ErrorCode.X_IMPORT_HEADER_MISMATCH,
        f"import {spec.name!r}: {why}; the csv's first line must name exactly the "
        f"columns {', '.join(spec.columns)} (in any order)",
        meta=meta,
    )


def _decode(record: bytes | memoryview) -> str | None:
    try:
        return str(record, "utf-8")
    except UnicodeDecodeError:
        return None


async def _csv_page(
    spec: _Spec,
    work: _Parse,
    parsed: tuple[list[str | None], list[int] | None, bool, bool],
    unclosed_at_end: bool,
    first_line: int,
    header: list[str] | None,
) -> list[str] | None:
    """Read one page's records (``None``: one that is not UTF-8). ``clean``: no
    record holds a NUL; ``crlf``: a record may end with a carriage return.

    The rows are built a batch at a time by :func:`_csv_rows`, a loop with no
    ``await`` in it, with the cyclic collector held off (:class:`paused_gc`):
    the batch's instances all live until it is handled, so a collection inside
    the loop finds nothing to free. The batch is sent outside the pause."""
    records = parsed[0]
    at, end = 0, len(records)
    while at < end:
        with paused_gc():
            at, header = _csv_rows(spec, work, parsed, unclosed_at_end, first_line, header, at)
        if len(work.pending) >= spec.batch:
            await work.flush()
    return header


def _csv_rows(
    spec: _Spec,
    work: _Parse,
    parsed: tuple[list[str | None], list[int] | None, bool, bool],
    unclosed_at_end: bool,
    first_line: int,
    header: list[str] | None,
    at: int,
) -> tuple[int, list[str] | None]:
    """The page's records from ``at`` on, made rows onto ``work.pending`` until
    a batch is full or the page ends: the index to go on from, and the header."""
    records, starts, clean, crlf = parsed
    width = len(spec.columns)
    make = None if header is None else work.fns.maker(header)
    size, pending = spec.batch, work.pending
    last = len(records) - 1
    for i in range(at, len(records)):
        text = records[i]
        if crlf and text is not None and text.endswith("\r"):
            text = text[:-1]
        if not text:
            if text is None:
                if make is None:
                    raise _header_mismatch(spec, "the header line is not UTF-8 text")
                work.refuse(_line(first_line, starts, i), None, ErrorCode.X_IMPORT_ROW_ENCODING)
            continue  # a blank line is nothing
        if make is None or header is None:
            header = _read_header(spec, text)
            make = work.fns.maker(header)
            continue
        fields = text.split(",") if '"' not in text else _split_quoted(text)
        if (
            len(fields) != width
            or (not clean and "\x00" in text)
            or (unclosed_at_end and i == last)
        ):
            # A ragged line, a stray quote, a NUL, an unclosed quote at the file's end.
            work.refuse(_line(first_line, starts, i), None, ErrorCode.X_IMPORT_ROW_MALFORMED)
            continue
        try:
            row = make(fields)
        except FieldFault as fault:
            work.refuse(_line(first_line, starts, i), fault.field, ErrorCode.X_IMPORT_ROW_INVALID)
            continue
        pending.append(row)
        if len(pending) >= size:
            return i + 1, header
    return len(records), header


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
    work: _Parse,
    records: list[bytes],
    starts: list[int] | None,
    first_line: int,
) -> None:
    """Read one page's ndjson records, a batch at a time by :func:`_ndjson_rows`
    under :class:`paused_gc` as :func:`_csv_page` does; each full batch is sent
    outside the pause."""
    at, end = 0, len(records)
    while at < end:
        with paused_gc():
            at = _ndjson_rows(work, records, starts, first_line, at)
        if len(work.pending) >= work.spec.batch:
            await work.flush()


def _ndjson_rows(
    work: _Parse,
    records: list[bytes],
    starts: list[int] | None,
    first_line: int,
    at: int,
) -> int:
    """The page's records from ``at`` on, structured onto ``work.pending`` until
    a batch is full or the page ends: the index to go on from."""
    allowed = frozenset(work.spec.columns)
    hook, schema = work.fns.hook(), work.spec.schema
    size, pending, loads = work.spec.batch, work.pending, orjson.loads
    for i in range(at, len(records)):
        record = records[i]
        if not record.strip():
            continue
        try:
            value = loads(record)
        except orjson.JSONDecodeError:
            code = (
                ErrorCode.X_IMPORT_ROW_ENCODING
                if _decode(record) is None
                else ErrorCode.X_IMPORT_ROW_MALFORMED
            )
            work.refuse(_line(first_line, starts, i), None, code)
            continue
        if type(value) is not dict:
            work.refuse(_line(first_line, starts, i), None, ErrorCode.X_IMPORT_ROW_MALFORMED)
            continue
        if not allowed.issuperset(value):
            extra = sorted(k for k in value if k not in allowed)
            work.refuse(_line(first_line, starts, i), extra[0][:64], ErrorCode.X_IMPORT_ROW_INVALID)
            continue
        try:
            row = hook(value, schema)
        except Exception as exc:  # cattrs, or the class's own validators
            work.refuse(
                _line(first_line, starts, i), fault_field(exc), ErrorCode.X_IMPORT_ROW_INVALID
            )
            continue
        pending.append(row)
        if len(pending) >= size:
            return i + 1
    return len(records)
