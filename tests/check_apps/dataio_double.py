"""An import with a double effect: its handle appends each row to a list, so a
page handled again after a crash (at least once per page) lands twice."""

from __future__ import annotations

import tempfile

import attrs
from obstore.store import LocalStore

from trio_jobs import import_rows

FOLDER = tempfile.mkdtemp(prefix="trio-jobs-check-dataio-")
with open(f"{FOLDER}/people.csv", "w") as out:
    out.write("id,name\n" + "".join(f"{i},p{i}\n" for i in range(1, 8)))

loaded: list[int] = []


@attrs.frozen
class Person:
    id: int
    name: str


@attrs.frozen
class Load:
    key: str


async def _append(rows: list[Person], input: Load) -> None:
    loaded.extend(row.id for row in rows)  # the bug: not an upsert


import_people = import_rows(
    name="app.people-import",
    input=Load,
    idempotency_key=lambda i: f"people-import:{i.key}",
    source=lambda i: LocalStore(FOLDER),
    key=lambda i: i.key,
    columns=["id", "name"],
    schema=Person,
    handle=_append,
    max_row_errors=0,
    page_bytes=32,
)

trio_jobs_examples = {"app.people-import": [Load("people.csv")]}


def trio_jobs_observe() -> list[int]:
    return sorted(loaded)


def trio_jobs_reset() -> None:
    loaded.clear()
