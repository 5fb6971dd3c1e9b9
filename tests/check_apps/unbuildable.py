"""An input type Hypothesis cannot build."""

from __future__ import annotations

import attrs

from trio_jobs import JobContext, job


class Opaque:
    def __init__(self, handle, *, secret):  # type: ignore[no-untyped-def] -> None:
        self.handle = handle


@attrs.frozen
class Payload:
    thing: Opaque


@job(name="odd", input=Payload, idempotency_key=lambda p: "one")
async def odd(ctx: JobContext[Payload]) -> None:
    return None
