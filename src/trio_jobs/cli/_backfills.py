"""``trio-jobs backfills``: the backfill ledger, one row per ``backfill()`` pass."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ..drivers._backfills import MAX_BACKFILL_ROWS, BackfillRow
from ._args import check_job_name
from ._common import common_options, guarded
from ._operate import (
    _compact,
    _console,
    _echo_json,
    _operate,
    _table,
    _text,
    _when,
    backfill_json,
)

if TYPE_CHECKING:
    from .._facade import Jobs

__all__ = ["backfills_command"]


@click.command("backfills")
@click.option("--name", "name", default=None, metavar="NAME", help="Only this backfill's passes.")
@click.option(
    "--limit",
    default=100,
    show_default=True,
    type=click.IntRange(1, MAX_BACKFILL_ROWS),
    metavar="N",
    help=f"At most this many passes (1 to {MAX_BACKFILL_ROWS}).",
)
@common_options
@guarded
def backfills_command(
    name: str | None, limit: int, as_json: bool, database_url: str | None
) -> None:
    """The backfill ledger: one row per backfill() pass, newest first, with the
    pages and items its handler has handled so far, the cursor where its next
    page starts, and when it started and finished. `trio-jobs show JOB_ID`
    shows a pass's job (its steps are its pages)."""
    check_job_name(name, "--name")

    async def go(jobs: Jobs) -> tuple[list[BackfillRow], float]:
        return await jobs.backfills(name=name, limit=limit), float(jobs.driver.now())

    rows, now = _operate(go, database_url, as_json)
    body = {"backfills": [backfill_json(r) for r in rows]}
    if as_json:
        _echo_json(body)
        return
    if not rows:
        click.echo("no backfill pass" + (f" of {name}" if name else ""))
        return
    table = _table(
        f"{len(rows)} pass(es), newest first",
        ("job id", "name", "pages", "items", "cursor", "started", "finished"),
        whole=("job id",),
    )
    for r in rows:
        table.add_row(
            _text(r.job_id),
            _text(r.name),
            _text(r.pages),
            _text(r.items),
            _text("(done)" if r.cursor is None and r.finished_at else _compact(r.cursor)),
            _text(_when(r.started_at, now)),
            _text(_when(r.finished_at, now) if r.finished_at is not None else "running"),
        )
    _console().print(table)
