"""An app for the consumer tests: a stream per key (items are numbers, an
item's cursor is its number as text), the cursors the app keeps, and a log of
every batch ``handle`` saw."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import trio

from trio_jobs import ConsumerBatch, Retry, Signal, Transaction, consumer


class Stream:
    def __init__(self, **items: list[int]) -> None:
        self.items: dict[str, list[int]] = {k: list(v) for k, v in items.items()}
        #: Seconds to wait before each item, by item (default: none).
        self.gaps: dict[int, float] = {}
        #: After its items, a key's stream waits forever (a live stream) when set.
        self.live = False
        self.cursors: dict[str, str] = {}
        self.batches: list[tuple[str, list[int], str | None]] = []
        self.opened: list[tuple[str, str | None]] = []

    def reset(self) -> None:
        self.cursors.clear()
        self.batches.clear()
        self.opened.clear()

    @property
    def handled(self) -> list[int]:
        return [n for _key, items, _before in self.batches for n in items]

    async def open(self, key: str, cursor: str | None, signal: Signal) -> AsyncIterator[int]:
        self.opened.append((key, cursor))
        after = -1 if cursor is None else int(cursor)
        for n in self.items[key]:
            if n > after:
                gap = self.gaps.get(n, 0.0)
                if gap:
                    await trio.sleep(gap)
                yield n
        if self.live:
            await trio.sleep_forever()

    async def handle(self, batch: ConsumerBatch) -> str:
        self.batches.append((batch.key, list(batch.items), batch.cursor))
        return str(batch.items[-1])

    def load_cursor(self, key: str, tx: Transaction) -> str | None:
        return self.cursors.get(key)

    def save_cursor(self, key: str, cursor: str, tx: Transaction) -> None:
        self.cursors[key] = cursor

    def consumer(self, **over: Any) -> Any:
        fields: dict[str, Any] = {
            "name": "sync",
            "keys": lambda: sorted(self.items),
            "open": self.open,
            "handle": self.handle,
            "load_cursor": self.load_cursor,
            "save_cursor": self.save_cursor,
            "batch": 4,
            "retry": Retry(attempts=3, base="1s", jitter=False),
        }
        fields.update(over)
        return consumer(**fields)


class TxStream(Stream):
    """A :class:`Stream` whose effects and cursors are written through the
    batch's transaction (published on commit, as rows of the app's tables would
    be): what a crash rolls back, this app loses too."""

    def __init__(self, **items: list[int]) -> None:
        super().__init__(**items)
        self.driver: Any = None

    async def handle(self, batch: ConsumerBatch) -> str:
        await batch.tx.driver_tx.publish(f"handled:{batch.key}", list(batch.items))
        return str(batch.items[-1])

    async def load_cursor(self, key: str, tx: Transaction) -> str | None:  # type: ignore[override]
        self.driver = tx.jobs.driver
        found, _now = await tx.jobs.driver.events.poll(f"cursor:{key}", float("-inf"))
        return str(found[-1].payload) if found else None

    async def save_cursor(self, key: str, cursor: str, tx: Transaction) -> None:  # type: ignore[override]
        await tx.driver_tx.publish(f"cursor:{key}", cursor)

    def committed(self) -> tuple[list[int], list[str]]:
        """The items whose effect committed, and the cursors committed, in order."""
        events = self.driver._events
        items = sorted({n for e in events if e.name.startswith("handled:") for n in e.payload})
        return items, [e.payload for e in events if e.name.startswith("cursor:")]
