"""How a run ended: the value ``on_settled`` receives."""

from __future__ import annotations

import enum
from typing import Any

import attrs

__all__ = ["Outcome", "Settled"]


class Outcome(enum.StrEnum):
    """How a run ended, as ``on_settled`` is told: ``"completed"``, ``"dead-lettered"``,
    ``"dropped"`` (failed for good on a ``dead_letter=False`` job) or ``"refused"``
    (``when_busy="fail"`` over a busy key)."""

    COMPLETED = "completed"
    DEAD_LETTERED = "dead-lettered"
    DROPPED = "dropped"
    REFUSED = "refused"


@attrs.frozen
class Settled:
    """``outcome``; ``input`` (``None`` when the stored payload no longer parses);
    ``result`` (what the body returned, ``None`` unless completed); ``error`` (the
    row's ``last_error``); ``code`` (its ``X_*`` code or ``None``)."""

    outcome: Outcome
    job_id: str
    input: Any = None
    result: Any = None
    error: str | None = None
    code: str | None = None
