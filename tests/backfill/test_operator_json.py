"""Observability rows for backfills (Jobs-And-Workflows.md, "Observability"), on
the memory driver: `show <id> --json` carries the run's ledger row under
``backfill`` when the job is a backfill, and each `list --json` row carries its
pass's, so the passes in flight show with their pages, items and cursor so far.
The CLI opens PostgreSQL (``tests/drivers/postgres/test_backfill.py`` runs the
commands); here the same JSON builders run over a memory facade."""

from __future__ import annotations

from typing import Any

import attrs
import trio

from jobs_support import Item, jobs_on_memory, running_worker, wait_state
from trio_jobs import JobContext, backfill, job
from trio_jobs.cli._operate import REDACTED, VIEW_FIELDS, ledger_rows, page_json, view_json


@attrs.frozen
class Size:
    n: int = 3


def _source(input: Size, cursor: Any) -> tuple[list[int], Any]:
    after = cursor or 0
    found = list(range(after + 1, min(after + input.n, 9) + 1))
    return found, (found[-1] if found and found[-1] < 9 else None)


def held_at(first_id: int) -> tuple[Any, trio.Event, trio.Event]:
    """A handler that holds the pass in flight at the page starting at
    ``first_id`` until ``gate`` is set (``reached`` says it got there)."""
    gate, reached = trio.Event(), trio.Event()

    async def handle(items: list[int], _input: Size) -> None:
        if items[0] == first_id:
            reached.set()
            await gate.wait()

    return handle, gate, reached


@job(input=Item, idempotency_key=lambda i: i.key, name="plain")
async def plain(ctx: JobContext[Item]) -> None:
    return None


async def test_show_and_list_json_carry_the_ledger_row_of_a_pass_in_flight(
    autojump_clock: Any,
) -> None:
    handle, gate, reached = held_at(7)  # page 3

    pass_ = backfill(
        name="nine", input=Size, idempotency_key=lambda _: "nine", source=_source, handle=handle
    )
    async with jobs_on_memory([pass_, plain]) as (jobs, _driver):
        other = await plain.enqueue(Item("x"))
        async with running_worker(jobs, concurrency=2) as _worker:
            enqueued = await pass_.enqueue(Size())
            await wait_state(jobs, other.id, "done")
            await reached.wait()
            view = await jobs.show(enqueued.id)
            shown = view_json(view, (await ledger_rows(jobs, [view])).get(view.id))
            page = await jobs.list()
            listed = page_json(page, await ledger_rows(jobs, page.rows))
            gate.set()
            await wait_state(jobs, enqueued.id, "done")
            done = await jobs.show(enqueued.id)
            finished = view_json(done, (await ledger_rows(jobs, [done])).get(done.id))
        plain_view = await jobs.show(other.id)
        [row] = await jobs.backfills()
    assert list(shown) == list(VIEW_FIELDS)
    assert shown["state"] == "running"
    assert shown["backfill"] == {
        "name": "nine",
        "job_id": enqueued.id,
        "pages": 2,
        "items": 6,
        "cursor": 6,
        "started_at": row.started_at,
        "finished_at": None,
    }
    by_id = {r["id"]: r for r in listed["rows"]}
    assert by_id[enqueued.id]["backfill"] == shown["backfill"]
    assert by_id[other.id]["backfill"] is None  # not a backfill
    assert finished["backfill"] == {
        "name": "nine",
        "job_id": enqueued.id,
        "pages": 3,
        "items": 9,
        "cursor": None,
        "started_at": row.started_at,
        "finished_at": row.finished_at,
    }
    assert view_json(plain_view, None)["backfill"] is None


async def test_a_sensitive_pass_shows_its_counts_and_hides_its_cursor(
    autojump_clock: Any,
) -> None:
    handle, gate, reached = held_at(4)  # page 2

    secret = backfill(
        name="secret", input=Size, idempotency_key=lambda _: "secret", source=_source, handle=handle
    )
    secret.sensitive = True  # what job(sensitive=True) sets: its values never print
    async with jobs_on_memory([secret]) as (jobs, _driver):
        enqueued = await secret.enqueue(Size())
        async with running_worker(jobs):
            await reached.wait()
            view = await jobs.show(enqueued.id)
            shown = view_json(view, (await ledger_rows(jobs, [view])).get(view.id))
            gate.set()
            await wait_state(jobs, enqueued.id, "done")
    assert shown["redacted"] is True
    assert shown["backfill"]["pages"] == 1
    assert shown["backfill"]["items"] == 3
    assert shown["backfill"]["cursor"] == REDACTED  # 3: the page's last id
