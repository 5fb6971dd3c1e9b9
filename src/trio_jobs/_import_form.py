"""csv text to the declared attrs ``schema``, as a form's text is taken.

The coercions are the library's cattrs converter with the form hooks below
(``"12"`` an ``int``, ``"on"`` a ``True``, an empty cell ``None`` where the field
allows it). Calling cattrs once a row costs more than the rest of the import
together (a dict built, a hook a field, an error group prepared), so for the
header a page reads, :func:`csv_maker` builds ONE function from the row's list
of cells to the instance: a ``str`` field is the cell as it is, an ``int``,
``float`` or ``bool`` field goes through the form hook directly, and any other
type (a date, a UUID, an enum, a union) through cattrs' own hook for that type;
the instance is then made by calling the class, or, for an attrs slots class
whose ``__init__`` would only set each slot (no validator, converter, hook or
default to fill), by setting its slots directly (a quarter of the call's cost).
The answer is cattrs' answer, field by field (``tests/dataio/test_import_form.py``
compares the two on generated rows); a schema whose shape it does not know (a
column that is not an ``__init__`` argument) is structured by cattrs whole.
"""

from __future__ import annotations

import inspect
import math
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import cattrs

from ._serialization import converter

__all__ = ["FieldFault", "csv_maker", "fault_field", "form", "nullable"]

_TRUE = frozenset({"true", "t", "yes", "y", "on", "1"})
_FALSE = frozenset({"false", "f", "no", "n", "off", "0"})


def as_int(value: Any, _t: Any = int) -> int:
    if type(value) is int:
        return value
    if not isinstance(value, str) or "_" in value:
        raise ValueError("not a whole number")
    return int(value)


def as_float(value: Any, _t: Any = float) -> float:
    if type(value) in (int, float):
        return float(value)
    if not isinstance(value, str) or "_" in value:
        raise ValueError("not a number")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError("not a finite number")
    return number


def as_bool(value: Any, _t: Any = bool) -> bool:
    if type(value) is bool:
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError("not a yes/no value")


def _form_converter() -> cattrs.Converter:
    """The library's converter, taking csv text as an HTML form's is taken."""
    taken = converter.copy()
    taken.register_structure_hook(int, as_int)
    taken.register_structure_hook(float, as_float)
    taken.register_structure_hook(bool, as_bool)
    return taken


#: The converter a csv row is structured with.
form = _form_converter()

#: The form hooks of int, float and bool written out, for a cell (a ``str``):
#: each sets ``a`` from ``v`` or raises, as :func:`as_int` and the others do.
_INLINE: dict[Any, list[str]] = {
    int: ["if '_' in v:", "    raise ValueError", "a = int(v)"],
    float: [
        "if '_' in v:",
        "    raise ValueError",
        "a = float(v)",
        "if not _finite(a):",
        "    raise ValueError",
    ],
    bool: ["a = _BOOL.get(v)", "if a is None:", "    a = _as_bool(v)"],
}


def nullable(tp: Any) -> bool:
    """An empty cell is ``None`` for a field of this type."""
    if tp is None or tp is type(None) or tp is Any:
        return True
    origin = typing.get_origin(tp)
    return origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


def fault_field(exc: BaseException) -> str | None:
    """The attribute a cattrs error names (its first), or ``None``."""
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        return sorted(exc.extra_fields)[0] if exc.extra_fields else None
    for sub in getattr(exc, "exceptions", ()):
        for note in getattr(sub, "__notes__", ()):
            name = getattr(note, "name", None)
            if isinstance(name, str):
                return name
        found = fault_field(sub)
        if found is not None:
            return found
    return None


class FieldFault(Exception):
    """A row's cell the schema refuses: :attr:`field` names it (``None``: the
    class itself refused the row, e.g. a validator)."""

    def __init__(self, field: str | None) -> None:
        super().__init__(field)
        self.field = field


def _inner(tp: Any) -> Any:
    """``T`` of ``T | None`` (one ``T``), else ``tp``."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if nullable(tp) and len(args) == 1 else tp


def _arguments(schema: type, values: dict[str, str]) -> list[str]:
    """The constructor's arguments: by position while the ``__init__``
    parameters, in order, are all given (a positional call costs a third less
    than the same by keyword), by keyword from the first one left out on."""
    out: list[str] = []
    positional = True
    for f in attrs.fields(schema):
        if not f.init:
            continue
        given = values.get(f.name)
        positional = positional and given is not None and not f.kw_only
        if given is not None:
            out.append(given if positional else f"{f.alias}={given}")
    return out


def csv_maker(schema: type, header: Sequence[str]) -> Callable[[Sequence[str]], Any]:
    """A function from one row's cells (in ``header`` order) to an instance of
    ``schema``; a refused cell raises :class:`FieldFault` naming its field."""
    try:
        attrs.resolve_types(schema)
    except Exception:  # a name the annotations use is not resolvable: cattrs says so
        return _cattrs_maker(schema, header)
    fields = attrs.fields_dict(schema)
    if not all(fields[name].init for name in header):
        return _cattrs_maker(schema, header)
    names: dict[str, Any] = {
        "_cls": schema,
        "_Fault": FieldFault,
        "_finite": math.isfinite,
        "_BOOL": {**dict.fromkeys(_TRUE, True), **dict.fromkeys(_FALSE, False)},
        "_as_bool": as_bool,
    }
    lines = ["def make(r):"]
    values: dict[str, str] = {}
    where = {name: i for i, name in enumerate(header)}
    # Checked in the class's field order, as cattrs does: a row refused in two
    # cells names the same field either way.
    for name in [f.name for f in attrs.fields(schema) if f.name in where]:
        i = where[name]
        tp = fields[name].type
        empty = nullable(tp)
        inner = _inner(tp) if empty else tp
        cell = f"r[{i}]"
        if inner is str or inner is None or inner is Any:
            value = f"({cell} or None)" if empty else cell
        else:
            if inner in _INLINE:
                check = _INLINE[inner]
            else:
                names[f"_h{i}"], names[f"_t{i}"] = form.get_structure_hook(tp), tp
                check = [f"a = _h{i}(v, _t{i})"]
            if empty:
                check = ["if v == '':", "    a = None", "else:", *("    " + x for x in check)]
            lines += [
                f"    v = {cell}",
                "    try:",
                *(f"        {x}" for x in check),
                "    except Exception:",
                f"        raise _Fault({name!r}) from None",
                f"    a{i} = a",
            ]
            value = f"a{i}"
        values[name] = value
    setters = _slot_setters(schema, header)
    if setters is not None:
        # What the class's attrs __init__ does, without the call: a new instance
        # and each slot set, in the class's field order.
        names["_new"] = object.__new__
        lines.append("    o = _new(_cls)")
        for k, (name, setter) in enumerate(setters):
            names[f"_s{k}"] = setter
            lines.append(f"    _s{k}(o, {values[name]})")
        lines.append("    return o")
    else:
        lines += [
            "    try:",
            f"        return _cls({', '.join(_arguments(schema, values))})",
            "    except Exception:",
            "        raise _Fault(None) from None",
        ]
    exec(compile("\n".join(lines), f"<csv row of {schema.__qualname__}>", "exec"), names)
    made: Callable[[Sequence[str]], Any] = names["make"]
    return made


@attrs.frozen
class _Frozen:
    """attrs' ``__setattr__`` of a frozen class, to know one by."""


_FROZEN_SETATTR: Any = _Frozen.__setattr__


def _slot_setters(schema: type, header: Sequence[str]) -> list[tuple[str, Any]] | None:
    """The slot setters of ``schema``'s fields, in field order, where calling
    its ``__init__`` does no more than set each slot to its argument: an attrs
    slots class whose ``__init__`` is attrs' own, every field an ``__init__``
    argument given by ``header``, no validator, converter, pre- or post-init
    hook, cached hash or other slot, ``object.__new__``, and (unless frozen,
    where attrs sets slots with ``object.__setattr__``) no ``__setattr__`` of
    its own. ``None`` otherwise: the row function then calls the class.
    Setting the slots directly costs a quarter of the call."""
    init = schema.__dict__.get("__init__")
    code = getattr(init, "__code__", None)
    if code is None or not code.co_filename.startswith("<attrs generated"):
        return None
    klass: Any = schema  # the class's own methods, compared by identity
    if klass.__new__ is not object.__new__:
        return None
    if hasattr(schema, "__attrs_pre_init__") or hasattr(schema, "__attrs_post_init__"):
        return None
    fields = attrs.fields(schema)
    given = set(header)
    if any(
        not f.init or f.validator is not None or f.converter is not None or f.name not in given
        for f in fields
    ):
        return None
    if len(fields) != len(given):
        return None
    slots: set[str] = set()
    for base in schema.__mro__:
        own = base.__dict__.get("__slots__", ())
        slots.update([own] if isinstance(own, str) else own)
    slots.discard("__weakref__")
    if "__slots__" not in schema.__dict__ or slots != {f.name for f in fields}:
        return None
    if klass.__setattr__ not in (object.__setattr__, _FROZEN_SETATTR):
        return None
    setters: list[tuple[str, Any]] = []
    for f in fields:
        slot = inspect.getattr_static(schema, f.name, None)
        if type(slot) is not types.MemberDescriptorType:
            return None
        setters.append((f.name, slot.__set__))
    return setters


def _cattrs_maker(schema: type, header: Sequence[str]) -> Callable[[Sequence[str]], Any]:
    hook = form.get_structure_hook(schema)
    fields = attrs.fields_dict(schema)
    empty = frozenset(name for name in header if nullable(fields[name].type))
    keys = tuple(header)

    def make(cells: Sequence[str]) -> Any:
        values: dict[str, Any] = dict(zip(keys, cells, strict=True))
        for name in empty:
            if values[name] == "":
                values[name] = None
        try:
            return hook(values, schema)
        except Exception as exc:
            raise FieldFault(fault_field(exc)) from None

    return make
