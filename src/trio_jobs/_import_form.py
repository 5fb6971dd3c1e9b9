"""csv text to the declared attrs ``schema``, as a form's text is taken.

The coercions are the library's cattrs converter with the form hooks below
(``"12"`` an ``int``, ``"on"`` a ``True``, an empty cell ``None`` where the field
allows it). Calling cattrs once a row costs more than the rest of the import
together (a dict built, a hook a field, an error group prepared), so for the
header a page reads, :func:`csv_maker` builds ONE function from the row's list
of cells to the instance: a ``str`` field is the cell as it is, an ``int``,
``float`` or ``bool`` field goes through the form hook directly, and any other
type (a date, a UUID, an enum, a union) through cattrs' own hook for that type.
The answer is cattrs' answer, field by field (``tests/dataio/test_import_form.py``
compares the two on generated rows); a schema whose shape it does not know (a
column that is not an ``__init__`` argument) is structured by cattrs whole.
"""

from __future__ import annotations

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
    lines += [
        "    try:",
        f"        return _cls({', '.join(_arguments(schema, values))})",
        "    except Exception:",
        "        raise _Fault(None) from None",
    ]
    exec(compile("\n".join(lines), f"<csv row of {schema.__qualname__}>", "exec"), names)
    made: Callable[[Sequence[str]], Any] = names["make"]
    return made


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
