"""An attempt log as a driver stores it (a JSON array of objects, times as
numbers or strings) read back as :class:`AttemptRecord` values: one reader for
every driver."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ._protocol import AttemptRecord

__all__ = ["attempt_records"]


def _float_or_none(value: Any) -> float | None:
    return None if value is None or value == "" else float(value)


def attempt_records(value: Any) -> list[AttemptRecord]:
    """The stored log (a sequence of mappings; anything else: no entries) → records."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        return []
    return [
        AttemptRecord(
            attempt=int(e["attempt"]),
            worker_id=str(e["worker_id"]),
            started_at=float(e["started_at"]),
            ended_at=_float_or_none(e.get("ended_at")),
            outcome=e.get("outcome"),
            error_code=e.get("error_code"),
            error=e.get("error"),
            step=e.get("step"),
            step_started_at=_float_or_none(e.get("step_started_at")),
        )
        for e in value
        if isinstance(e, Mapping)
    ]
