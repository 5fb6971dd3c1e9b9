"""import_rows and export_rows checked on the memory driver: the import's
handle upserts by id (a page handled twice counts once), the export writes
each page to a fixed object name (a page written twice is the same object)."""

from __future__ import annotations

import tempfile

import attrs
from obstore.store import LocalStore

from trio_jobs import ErrorSink, export_rows, import_rows

FOLDER = tempfile.mkdtemp(prefix="trio-jobs-check-dataio-")
with open(f"{FOLDER}/people.csv", "w") as out:
    out.write("id,name\n" + "".join(f"{i},p{i}\n" for i in range(1, 8)) + "x,bad\n")

people: dict[int, str] = {}


@attrs.frozen
class Person:
    id: int
    name: str


@attrs.frozen
class Load:
    key: str


async def _upsert(rows: list[Person], input: Load) -> None:
    for row in rows:
        people[row.id] = row.name


async def _people_after(input: Load, after: int | None) -> tuple[list[tuple[int, str]], int | None]:
    rows = [(i, f"p{i}") for i in range(1, 8) if i > (after or 0)][:3]
    return rows, (rows[-1][0] if len(rows) == 3 else None)


import_people = import_rows(
    name="app.people-import",
    input=Load,
    idempotency_key=lambda i: f"people-import:{i.key}",
    source=lambda i: LocalStore(FOLDER),
    key=lambda i: i.key,
    columns=["id", "name"],
    schema=Person,
    handle=_upsert,
    errors=ErrorSink(sink=lambda i: LocalStore(FOLDER), prefix="errors"),
    page_bytes=32,
    batch=2,
)

export_people = export_rows(
    name="app.people-export",
    input=Load,
    idempotency_key=lambda i: f"people-export:{i.key}",
    source=_people_after,
    sink=lambda i: LocalStore(FOLDER),
    prefix=lambda i: f"exports/{i.key}",
    columns=["id", "name"],
)

trio_jobs_examples = {
    "app.people-import": [Load("people.csv")],
    "app.people-export": [Load("people")],
}


def trio_jobs_observe() -> dict[int, str]:
    return dict(sorted(people.items()))


def trio_jobs_reset() -> None:
    people.clear()
