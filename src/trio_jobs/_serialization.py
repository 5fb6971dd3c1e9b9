"""One cattrs converter, the JSON form of payloads and step outputs, JSON Schema.

A step answers what it stored, on the first run too: :func:`json_form` turns a
value into exactly what a replay would read back (an attrs instance becomes a
dict, a ``datetime`` an ISO string, a ``UUID`` a string, a tuple a list).
"""

from __future__ import annotations

import datetime as _dt
import decimal
import enum
import math
import types
import typing
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import cattrs
import orjson

from .errors import ErrorCode, JobsError

__all__ = ["converter", "dumps", "json_form", "json_schema", "loads", "MAX_PAYLOAD_BYTES"]

#: The largest serialised payload (input or event) the library accepts.
MAX_PAYLOAD_BYTES = 1024 * 1024
#: The largest serialised step output or job result (Temporal's payload cap is 2 MB).
MAX_OUTPUT_BYTES = 2 * 1024 * 1024
#: How deep a payload may nest.
MAX_PAYLOAD_DEPTH = 64

converter = cattrs.Converter(forbid_extra_keys=True)


def _strict(tp: type) -> Any:
    def hook(value: Any, _t: Any) -> Any:
        if tp is float and type(value) is int:
            return float(value)
        if type(value) is not tp:
            raise TypeError(f"expected {tp.__name__}, got {type(value).__name__}")
        return value

    return hook


for _tp in (int, float, str, bool):
    converter.register_structure_hook(_tp, _strict(_tp))
converter.register_unstructure_hook(uuid.UUID, str)
converter.register_structure_hook(
    uuid.UUID, lambda v, _t: v if isinstance(v, uuid.UUID) else uuid.UUID(str(v))
)
converter.register_unstructure_hook(_dt.datetime, lambda v: v.isoformat())
converter.register_structure_hook(
    _dt.datetime,
    lambda v, _t: v if isinstance(v, _dt.datetime) else _dt.datetime.fromisoformat(str(v)),
)
converter.register_unstructure_hook(_dt.date, lambda v: v.isoformat())
converter.register_structure_hook(
    _dt.date, lambda v, _t: v if isinstance(v, _dt.date) else _dt.date.fromisoformat(str(v))
)
converter.register_unstructure_hook(decimal.Decimal, str)
converter.register_structure_hook(decimal.Decimal, lambda v, _t: decimal.Decimal(str(v)))


class UnserializableError(Exception):
    """Internal: a value has no JSON form."""


class TooDeepError(UnserializableError):
    """Internal: a value nests past what the encoder walks (or refers to itself)."""


def too_deep(what: str) -> str:
    """The refusal of a value nested past :data:`MAX_PAYLOAD_DEPTH` (a cycle
    nests without end, so it is refused the same way)."""
    return (
        f"{what} is nested too deep: more than {MAX_PAYLOAD_DEPTH} levels "
        "(or it refers to itself); flatten it"
    )


def _default(value: Any) -> Any:
    if attrs.has(type(value)):
        return converter.unstructure(value)
    if isinstance(value, uuid.UUID | decimal.Decimal):
        return str(value)
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"a {type(value).__name__} has no JSON form")


def dumps(value: Any) -> bytes:
    """Serialise ``value`` to JSON bytes or raise :class:`UnserializableError`."""
    try:
        return orjson.dumps(value, default=_default, option=orjson.OPT_PASSTHROUGH_DATACLASS)
    except RecursionError:
        raise TooDeepError("nested too deep") from None
    except (TypeError, orjson.JSONEncodeError) as exc:
        reason = str(exc).split(":")[0]
        # orjson stops at 255 levels (a cycle reaches it too).
        if reason == "Recursion limit reached":
            raise TooDeepError("nested too deep") from None
        raise UnserializableError(reason) from None


def loads(data: bytes | str) -> Any:
    return orjson.loads(data)


def json_form(value: Any) -> Any:
    """The JSON form of ``value`` (a step's output, a job's result): what storage
    hands back on a replay. Raises :class:`UnserializableError` for a value with
    no JSON form, a NaN or infinity (JSON would store ``null``: the replay would
    answer another value), or one over :data:`MAX_OUTPUT_BYTES` serialised."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        if len(value) * 4 > MAX_OUTPUT_BYTES and len(value.encode()) > MAX_OUTPUT_BYTES:
            raise UnserializableError(_too_big(len(value.encode())))
        return value
    if isinstance(value, int) and -(2**63) <= value < 2**64:
        return value
    raw = dumps(value)
    if len(raw) > MAX_OUTPUT_BYTES:
        raise UnserializableError(_too_big(len(raw)))
    # orjson writes NaN and infinity as null: only then is the walk needed.
    if b"null" in raw and _has_non_finite(value):
        raise UnserializableError("a NaN or infinite number, which JSON cannot store")
    return orjson.loads(raw)


def _too_big(size: int) -> str:
    return (
        f"{size} bytes serialised, over the {MAX_OUTPUT_BYTES}-byte limit for a step output "
        "or result; store the data in your tables and return a pointer"
    )


def depth_of(value: Any, limit: int = MAX_PAYLOAD_DEPTH) -> int:
    """How deep a JSON form nests (stops counting past ``limit``)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    deepest = 0
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


def payload_form(value: Any, *, what: str, code: ErrorCode) -> Any:
    """Serialise a payload (an input or an event), refusing what cannot be stored.

    Refusals name the fault, never the value.
    """
    try:
        raw = dumps(value)
    except TooDeepError:
        raise JobsError(code, too_deep(what)) from None
    except UnserializableError as exc:
        raise JobsError(code, f"{what} has no JSON form ({exc}); pass plain data") from None
    if len(raw) > MAX_PAYLOAD_BYTES:
        raise JobsError(
            code,
            f"{what} is {len(raw)} bytes serialised, over the {MAX_PAYLOAD_BYTES}-byte limit; "
            "store the data in your tables and pass a pointer (an id) instead",
        )
    form = orjson.loads(raw)
    if depth_of(form) > MAX_PAYLOAD_DEPTH:
        raise JobsError(code, too_deep(what))
    if _has_non_finite(value):
        # JSON has no NaN or infinity: the encoder would store null, and the worker
        # would read back a payload that is not the one enqueued.
        raise JobsError(code, f"{what} holds a NaN or infinite number, which JSON cannot store")
    return form


def _has_non_finite(value: Any) -> bool:
    # Runs after dumps() succeeded (so no cycles) and the size check (so bounded).
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            stack.extend(item)
        elif attrs.has(type(item)):
            stack.append(converter.unstructure(item))
    return False


# --------------------------------------------------------------------------- JSON Schema


def json_schema(tp: Any) -> dict[str, Any]:
    """A JSON Schema (draft 2020-12) for a type the converter can structure."""
    schema = _schema(tp, set())
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def _schema(tp: Any, seen: set[Any]) -> dict[str, Any]:
    if tp is Any or tp is object:
        return {}
    if tp is type(None) or tp is None:
        return {"type": "null"}
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union or origin is types.UnionType:
        return {"anyOf": [_schema(a, seen) for a in args]}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (list, Sequence, tuple, set, frozenset) or tp in (list, tuple, set, frozenset):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return {"type": "array", "prefixItems": [_schema(a, seen) for a in args]}
        item = _schema(args[0], seen) if args else {}
        return {"type": "array", "items": item}
    if origin in (dict, Mapping) or tp is dict:
        value = _schema(args[1], seen) if len(args) == 2 else {}
        return {"type": "object", "additionalProperties": value}
    if isinstance(tp, type):
        if issubclass(tp, bool):
            return {"type": "boolean"}
        if issubclass(tp, enum.Enum):
            return {"enum": [m.value for m in tp]}
        if issubclass(tp, int):
            return {"type": "integer"}
        if issubclass(tp, float):
            return {"type": "number"}
        if issubclass(tp, str):
            return {"type": "string"}
        if issubclass(tp, uuid.UUID):
            return {"type": "string", "format": "uuid"}
        if issubclass(tp, _dt.datetime):
            return {"type": "string", "format": "date-time"}
        if issubclass(tp, _dt.date):
            return {"type": "string", "format": "date"}
        if issubclass(tp, decimal.Decimal):
            return {"type": "string", "format": "decimal"}
        if attrs.has(tp):
            if tp in seen:
                return {"type": "object"}
            seen = seen | {tp}
            hints = typing.get_type_hints(tp)
            props: dict[str, Any] = {}
            required: list[str] = []
            for field in attrs.fields(tp):
                props[field.name] = _schema(hints.get(field.name, field.type), seen)
                if field.default is attrs.NOTHING:
                    required.append(field.name)
            out: dict[str, Any] = {
                "type": "object",
                "title": tp.__name__,
                "properties": props,
                "additionalProperties": False,
            }
            if required:
                out["required"] = required
            return out
    return {}
