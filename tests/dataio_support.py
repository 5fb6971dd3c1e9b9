"""Shared pieces of the data-job tests: a schema, an input, a table keyed by line,
and a factory that declares an import over a real obstore store."""

from __future__ import annotations

import pathlib
from typing import Any

import attrs
import obstore
from obstore.store import LocalStore

from trio_jobs import ErrorSink, Retry, import_rows


@attrs.frozen
class Person:
    id: int
    name: str
    score: float | None = None
    active: bool = False


@attrs.frozen
class Load:
    key: str


class Table:
    """An app table keyed by ``id`` (an upsert: a page handled twice leaves it as
    once) and a log of every ``handle`` call's size."""

    def __init__(self) -> None:
        self.rows: dict[int, Person] = {}
        self.calls: list[int] = []

    def reset(self) -> None:
        self.rows.clear()
        self.calls.clear()

    def write(self, rows: list[Person], _input: Load) -> None:
        self.calls.append(len(rows))
        for row in rows:
            self.rows[row.id] = row


def local(tmp_path: pathlib.Path) -> LocalStore:
    root = tmp_path / "store"
    root.mkdir(exist_ok=True)
    return LocalStore(str(root))


def put(store: Any, key: str, data: bytes | str) -> None:
    obstore.put(store, key, data.encode() if isinstance(data, str) else data)


def read(store: Any, key: str) -> bytes:
    return bytes(obstore.get(store, key).bytes())


def listing(store: Any, prefix: str = "") -> list[str]:
    return sorted(m["path"] for batch in obstore.list(store, prefix or None) for m in batch)


def make_import(store: Any, table: Table, **over: Any) -> Any:
    fields: dict[str, Any] = {
        "name": "people.import",
        "input": Load,
        "idempotency_key": lambda i: f"people:{i.key}",
        "source": lambda _i: store,
        "key": lambda i: i.key,
        "columns": ["id", "name", "score", "active"],
        "schema": Person,
        "handle": table.write,
        "errors": ErrorSink(sink=lambda _i: store, prefix="reports"),
        "retry": Retry(attempts=3, base="1s", jitter=False),
    }
    fields.update(over)
    return import_rows(**fields)
