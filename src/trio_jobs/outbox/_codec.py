"""The JSON form of a staged row (the ``request`` column of the outbox).

A job row carries every field of its :class:`EnqueueRequest`, the ids
included: the relay publishes it under the id it was staged with. An event row
carries the event's name and payload (already in JSON form).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from ..drivers._protocol import EnqueueRequest
from ..errors import ErrorCode, JobsError

__all__ = ["decode", "encode_event", "encode_job"]


def _job_fields() -> tuple[str, ...]:
    # Every field of the request, so a field added to EnqueueRequest rides the
    # outbox without a change here.
    return tuple(f.name for f in attrs.fields(EnqueueRequest))


_JOB_FIELDS = _job_fields()


def encode_job(request: EnqueueRequest) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": "job"}
    for field in _JOB_FIELDS:
        value = getattr(request, field)
        if isinstance(value, Mapping):
            value = dict(value)
        out[field] = value
    return out


def encode_event(name: str, payload: Any) -> dict[str, Any]:
    return {"kind": "event", "name": name, "payload": payload}


def decode(data: Any) -> tuple[str, EnqueueRequest | None, str | None, Any]:
    """``(kind, request, event, payload)`` of a stored row.

    A row this version cannot read is ``X_INVARIANT`` (the relay names it as the
    poison row; its content is never put in the message)."""
    if not isinstance(data, Mapping):
        raise JobsError(ErrorCode.X_INVARIANT, "an outbox row's request is not a JSON object")
    kind = data.get("kind")
    if kind == "event":
        name = data.get("name")
        if not isinstance(name, str) or not name:
            raise JobsError(ErrorCode.X_INVARIANT, "an outbox event row has no event name")
        return "event", None, name, data.get("payload")
    if kind == "job":
        try:
            fields = {f: data[f] for f in _JOB_FIELDS if f in data}
            return "job", EnqueueRequest(**fields), None, None
        except TypeError:
            raise JobsError(
                ErrorCode.X_INVARIANT, "an outbox job row lacks a field of its enqueue request"
            ) from None
    raise JobsError(ErrorCode.X_INVARIANT, "an outbox row is neither a job nor an event")
