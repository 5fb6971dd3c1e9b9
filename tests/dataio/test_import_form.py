"""The csv row function (``_import_form.csv_maker``) answers what cattrs answers.

An import structures each csv row with one generated function instead of a
cattrs call a row (the cost of the call was most of an import's CPU). These
tests hold the two to the same answer on generated rows: the same instance, or
a refusal naming the same field.
"""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import uuid
from typing import Any, Literal

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_jobs._import_form import FieldFault, _cattrs_maker, csv_maker


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


@attrs.frozen
class Plain:
    id: int
    name: str
    score: float | None
    active: bool
    note: str | None = None


@attrs.define
class Mixed:
    when: dt.date
    at: dt.datetime | None
    ref: uuid.UUID
    amount: decimal.Decimal
    colour: Colour
    kind: Literal["a", "b"]
    count: int | None = None
    flag: bool | None = None
    anything: Any = None


def _positive(_inst: Any, _attr: Any, value: int) -> None:
    if value <= 0:
        raise ValueError("must be positive")


@attrs.frozen
class Checked:
    _secret: str  # an attribute whose __init__ argument is "secret"
    n: int = attrs.field(validator=_positive)
    tags: str = attrs.field(default="", converter=str.upper)


@attrs.frozen
class Keywords:
    a: int
    b: str = "b"
    c: float = attrs.field(default=0.0, kw_only=True)
    d: bool | None = None


CELLS = st.one_of(
    st.sampled_from(
        [
            "",
            "0",
            "1",
            "-3",
            " 12 ",
            "+5",
            "1_000",
            "2.5",
            "1e3",
            "nan",
            "inf",
            "-Infinity",
            "true",
            "False",
            " ON ",
            "yes",
            "n",
            "maybe",
            "red",
            "blue",
            "RED",
            "a",
            "b",
            "2026-01-02",
            "2026-13-01",
            "2026-03-29T02:30:00+01:00",
            "12345678-1234-5678-1234-567812345678",
            "not-a-uuid",
            "3.14159",
            "١٢",
            "x",
        ]
    ),
    st.text(max_size=8),
)


def _answer(make: Any, cells: list[str]) -> tuple[str, Any]:
    try:
        return "row", make(cells)
    except FieldFault as fault:
        return "refused", fault.field


@pytest.mark.parametrize(
    "schema",
    [Plain, Mixed, Checked, Keywords],
    ids=lambda s: s.__name__,
)
@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_a_generated_row_is_structured_as_cattrs_structures_it(schema: type, data: Any) -> None:
    names = [
        f.name
        for f in attrs.fields(schema)
        if f.default is attrs.NOTHING or data.draw(st.booleans())
    ]
    header = data.draw(st.permutations(names))
    cells = data.draw(st.lists(CELLS, min_size=len(header), max_size=len(header)))
    fast, slow = csv_maker(schema, header), _cattrs_maker(schema, header)
    assert fast is not slow
    assert _answer(fast, cells) == _answer(slow, cells)


def test_the_field_a_refusal_names_is_the_first_refused_in_the_class_order() -> None:
    header = ["active", "score", "name", "id"]  # not the class's order
    make = csv_maker(Plain, header)
    with pytest.raises(FieldFault) as caught:
        make(["maybe", "x", "n", "y"])
    assert caught.value.field == "id"
    with pytest.raises(FieldFault) as caught:
        make(["maybe", "1", "n", "7"])
    assert caught.value.field == "active"
    assert make(["on", "", "n", "7"]) == Plain(7, "n", None, True)


def test_a_validator_refusal_names_no_field_and_a_converter_runs() -> None:
    make = csv_maker(Checked, ["_secret", "n", "tags"])
    assert make(["s", "2", "ab"]) == Checked("s", 2, "AB")
    with pytest.raises(FieldFault) as caught:
        make(["s", "0", "ab"])
    assert caught.value.field is None


def test_a_plain_slots_class_has_its_slots_set_and_any_other_is_called() -> None:
    """The row function sets the slots itself only where the class's attrs
    ``__init__`` does no more than that; a post-init hook, a ``__setattr__`` of
    the app's, a cached hash or a dict class is called as cattrs calls it."""
    from trio_jobs._import_form import _slot_setters

    made = csv_maker(Plain, ["note", "active", "score", "name", "id"])(["n", "on", "", "a", "7"])
    assert made == Plain(7, "a", None, True, "n")
    assert hash(made) == hash(Plain(7, "a", None, True, "n"))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        made.id = 8  # type: ignore[misc]
    assert _slot_setters(Plain, ["id", "name", "score", "active", "note"]) is not None
    assert _slot_setters(Plain, ["id", "name", "score", "active"]) is None  # a default to set

    calls: list[str] = []

    @attrs.frozen
    class Hooked:
        a: int

        def __attrs_post_init__(self) -> None:
            calls.append("post-init")

    @attrs.define
    class Watched:
        a: int

        def __setattr__(self, name: str, value: Any) -> None:
            calls.append(f"set {name}")
            object.__setattr__(self, name, value)

    @attrs.frozen(cache_hash=True)
    class Cached:
        a: int

    @attrs.define(slots=False)
    class Loose:
        a: int

    for schema, seen in ((Hooked, ["post-init"]), (Watched, ["set a"]), (Cached, []), (Loose, [])):
        assert _slot_setters(schema, ["a"]) is None, schema
        make = csv_maker(schema, ["a"])
        calls.clear()
        row = make(["3"])
        assert calls == seen  # the class was called
        assert row == schema(3)
        assert _answer(make, ["x"]) == _answer(_cattrs_maker(schema, ["a"]), ["x"])
    assert hash(csv_maker(Cached, ["a"])(["3"])) == hash(Cached(3))
