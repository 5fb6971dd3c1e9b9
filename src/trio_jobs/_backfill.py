"""``backfill()``: page a source through a handler, one durable step per page.

A backfill is a job (``kind == "backfill"``) whose body is a loop the library
writes: page ``n`` is the step ``page:<n>``, which asks ``source(input, cursor)``
for ``(items, next_cursor)``, hands the items to ``handle(items, input)``, writes
the pass's ledger row and returns ``{"cursor": next_cursor, "items": total}``.
That step record is the checkpoint. A run killed anywhere resumes at its page:
completed pages replay from their records (their stored cursors), and the page
that was cut short runs again from its start, so ``handle`` sees every page at
least once and a page twice only when a crash fell between its ``handle`` and
its checkpoint.

The ledger (``JobDriver.backfills``, read with ``jobs.backfills()``) is written
inside the page's step, after ``handle`` and before the checkpoint: it never
lags what was handled. Its writes are absolute and only move forward (see
``drivers/_backfills.py``), so a page written twice leaves it as once.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ._context import _call
from ._declare import (
    Concurrency,
    Job,
    Retry,
    check_factory_name,
    check_function,
    job,
    refuse_declaration,
)
from ._enqueue import _MISSING
from ._serialization import payload_form
from ._time import Duration
from ._validate import check_text
from .drivers._backfills import MAX_BACKFILL_ROWS, BackfillPage, BackfillRow
from .errors import ErrorCode, JobDeclarationError, JobsError

if TYPE_CHECKING:
    from ._context import JobContext, RunState
    from ._facade import Jobs
    from ._settled import Settled

__all__ = ["PAGE_STEP_PREFIX", "backfill", "read_ledger"]

#: A backfill's page ``n`` is the step ``f"page:{n}"`` (``trio-jobs show`` lists them).
PAGE_STEP_PREFIX = "page:"
#: The longest ``name`` a backfill takes (a job's name).
MAX_NAME = 200

Source = Callable[[Any, Any], Any]
Handle = Callable[[Any, Any], Any]


def backfill(
    *,
    name: Any = _MISSING,
    input: Any = None,
    tenant: Any = "none",
    idempotency_key: Any = _MISSING,
    source: Any = _MISSING,
    handle: Any = _MISSING,
    queue: str = "default",
    retry: Retry | None = None,
    concurrency: int | Concurrency | None = None,
    step_timeout: Duration | None = None,
    on_settled: Callable[[Settled], Any] | None = None,
    **unknown: Any,
) -> Job[Any, dict[str, int]]:
    """Declare a backfill: a job that pages ``source`` through ``handle``.

    ``source(input, cursor)`` answers ``(items, next_cursor)``: a list of items
    and where the next page starts (``None``: this page is the last). The first
    page is asked with ``cursor=None``; each later one with the JSON form of the
    cursor the page before answered (what its checkpoint stored, so a resumed
    run asks the same). ``handle(items, input)`` handles one page. Both may be
    sync or async.

    Each page is one step (``page:1``, ``page:2``, ...): ``handle`` runs, then
    the checkpoint lands, so a page is handled **at least once**: make
    ``handle``'s writes idempotent (an upsert, ``on conflict do nothing``). A
    killed run resumes at its page. ``await jobs.backfills()`` lists the passes
    (the ledger). The run's result is ``{"pages": n, "items": total}``.

    ``name``, ``idempotency_key`` (a function of the input), ``source`` and
    ``handle`` are required; ``input`` (an attrs class, or ``None``), ``tenant``,
    ``queue``, ``retry``, ``concurrency``, ``step_timeout`` (per page) and
    ``on_settled`` are as for :func:`~trio_jobs.job`. Every argument is a
    keyword. A bad declaration is ``X_JOB_DECLARATION_INVALID`` naming every
    fault (no ``idempotency_key``: ``X_IDEMPOTENCY_REQUIRED``, as for ``job()``).

    >>> users_email = backfill(
    ...     name="users.email-lowercase",
    ...     idempotency_key=lambda _: "users.email-lowercase",
    ...     source=lambda _, after: fetch_users(after, limit=500),  # (rows, last id or None)
    ...     handle=lambda rows, _: lowercase_emails(rows),
    ... )
    >>> await users_email.enqueue(None)
    """
    faults: list[str] = []
    if unknown:
        faults.append(f"unknown field(s): {', '.join(sorted(unknown))}")
    name_ok = check_factory_name(
        name, MAX_NAME, "the backfill's name, as its ledger rows carry it", faults
    )
    check_function(
        source, "source", 2, "source(input, cursor) answering (items, next_cursor)", faults
    )
    check_function(handle, "handle", 2, "handle(items, input) handling one page", faults)
    if idempotency_key is _MISSING or idempotency_key is None:
        also = f" (also: {'; '.join(faults)})" if faults else ""
        raise JobDeclarationError(
            ErrorCode.X_IDEMPOTENCY_REQUIRED,
            "backfill() needs idempotency_key=: a function of the input answering the "
            'pass\'s key, e.g. idempotency_key=lambda i: f"<backfill>:{i.<id>}" (one live '
            f"pass per key){also}",
            meta={"faults": ["idempotency_key= is required", *faults]},
        )
    job_name = name if name_ok else "backfill"
    declare: Callable[[Callable[..., Any]], Job[Any, dict[str, int]]] | None = None
    try:
        declare = job(
            name=job_name,
            input=input,
            tenant=tenant,
            idempotency_key=idempotency_key,
            queue=queue,
            retry=retry,
            concurrency=concurrency,
            step_timeout=step_timeout,
            on_settled=on_settled,
        )
    except JobDeclarationError as exc:
        faults.extend(exc.meta.get("faults") or [exc.message])
    if faults or declare is None:
        raise refuse_declaration(ErrorCode.X_JOB_DECLARATION_INVALID, "backfill", faults)
    handle_ = declare(_body(job_name, source, handle))
    handle_.kind = "backfill"
    handle_.__doc__ = f"The backfill {job_name!r}: pages its source through its handler."
    return handle_


def _items_of(name: str, answer: Any) -> tuple[builtins.list[Any], Any]:
    """The page ``source`` answered, checked: a list of items and a cursor.
    A wrong shape is the declaration's fault (terminal), named by type only."""
    if not isinstance(answer, tuple | builtins.list) or len(answer) != 2:
        raise JobsError(
            ErrorCode.X_JOB_DECLARATION_INVALID,
            f"backfill {name!r}: source must answer a pair (items, next_cursor); "
            f"it answered a {type(answer).__name__}",
        )
    items, cursor = answer
    if isinstance(items, str | bytes | bytearray | Mapping) or not hasattr(items, "__iter__"):
        raise JobsError(
            ErrorCode.X_JOB_DECLARATION_INVALID,
            f"backfill {name!r}: the items source answers must be a list (or another "
            f"sequence) of items; it answered a {type(items).__name__}",
        )
    return builtins.list(items), cursor


def _body(name: str, source: Source, handle: Handle) -> Callable[[JobContext[Any]], Any]:
    async def run_backfill(ctx: JobContext[Any]) -> dict[str, int]:
        state: RunState = ctx._state
        ledger = state.driver.backfills
        first = state.records.get(f"{PAGE_STEP_PREFIX}1")
        if ledger is not None and (first is None or first.status != "completed"):
            # The pass shows in the ledger while its first page runs.
            opened = BackfillPage(ctx.job_id, name, 0, 0)
            await state.read(f"{PAGE_STEP_PREFIX}1", lambda: ledger.record(opened))
        cursor: Any = None
        pages = 0
        items = 0
        while True:
            step = f"{PAGE_STEP_PREFIX}{pages + 1}"

            async def page(
                step: str = step, number: int = pages + 1, cursor: Any = cursor, before: int = items
            ) -> dict[str, Any]:
                found, nxt = _items_of(name, await _call(source, ctx.input, cursor))
                nxt = payload_form(
                    nxt,
                    what=f"backfill {name!r}: the cursor source answered",
                    code=ErrorCode.X_STEP_OUTPUT_UNSERIALIZABLE,
                )
                if nxt is not None and nxt == cursor:
                    raise JobsError(
                        ErrorCode.X_JOB_DECLARATION_INVALID,
                        f"backfill {name!r}: source answered the cursor it was asked with; "
                        "the pass would never end (answer where the next page starts, or "
                        "None after the last page)",
                        meta={"step": step},
                    )
                await _call(handle, found, ctx.input)
                total = before + len(found)
                if ledger is not None:
                    written = BackfillPage(ctx.job_id, name, number, total, nxt, nxt is None)
                    await state.read(step, lambda: ledger.record(written))
                return {"cursor": nxt, "items": total}

            # A default argument makes step.run hand the page fn no signal.
            out = await ctx.step.run(step, page)
            pages += 1
            cursor, items = out["cursor"], int(out["items"])
            if cursor is None:
                return {"pages": pages, "items": items}

    run_backfill.__name__ = run_backfill.__qualname__ = name
    return run_backfill


async def read_ledger(jobs: Jobs, *, name: str | None, limit: int) -> builtins.list[BackfillRow]:
    """``jobs.backfills()``: the driver's ledger, checked arguments first."""
    if name is not None:
        if not isinstance(name, str):
            raise JobsError(ErrorCode.X_INVARIANT, "name must be a backfill's name (a string)")
        check_text(name, what="the backfill name", code=ErrorCode.X_INVARIANT)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_BACKFILL_ROWS:
        raise JobsError(
            ErrorCode.X_INVARIANT,
            f"limit is how many passes to answer: a whole number from 1 to {MAX_BACKFILL_ROWS}",
        )
    driver = await jobs._resolved_driver()
    ledger = driver.backfills
    if ledger is None:
        raise JobsError(
            ErrorCode.X_NOT_IMPLEMENTED,
            f"the {driver.name} driver keeps no backfill ledger (its passes run without "
            "one); use postgres_driver(), redis_driver() or memory_driver()",
        )
    return await ledger.list(name, limit)
