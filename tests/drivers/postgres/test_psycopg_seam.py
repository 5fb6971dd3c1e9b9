"""The psycopg seam, pinned (STYLE.md "an interface the library owns at every
foreign seam ... a test pins every outside name the seam relies on").

``drivers/postgres/_bridge.py`` runs psycopg natively on Trio: it overrides
``AsyncConnection.wait`` and drives libpq's non-blocking connect and cancel
through ``psycopg.pq``. Every psycopg name it (and the LISTEN wake) relies on is
listed here with the call it makes, checked with ``inspect.signature(...).bind``
against the installed psycopg; a name psycopg renames, moves or re-signs fails
here, not in production. CI runs this file on the oldest supported psycopg and
on the newest (``.ci/run``). Nothing in src/ may reach into psycopg's private
modules or names (``psycopg._x``, ``errors._WaitTimeout``): the scan below fails
on any.

Needs no database: it inspects psycopg only.
"""

from __future__ import annotations

import ast
import inspect
import pathlib
import re
import tomllib
from collections.abc import Callable
from typing import Any

import psycopg
import psycopg.errors
import psycopg.waiting
import pytest
from psycopg import pq
from psycopg.conninfo import conninfo_attempts, conninfo_to_dict, make_conninfo
from psycopg.pq import abc as pq_abc
from psycopg.types.json import set_json_loads

import trio_jobs
from trio_jobs.drivers.postgres._bridge import TrioConnection, connect

SRC = pathlib.Path(trio_jobs.__file__).resolve().parent
BRIDGE = SRC / "drivers" / "postgres" / "_bridge.py"

_ = object()  # a stand-in argument: only the shape of the call is checked


def _binds(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """``fn`` accepts this call (names, positions, keywords), as the bridge makes it."""
    try:
        inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as exc:
        pytest.fail(
            f"{fn.__qualname__}{inspect.signature(fn)} no longer takes the bridge's call: {exc}"
        )


#: Each call the bridge and the wake make into psycopg, as (label, function, args, kwargs).
CALLS: list[tuple[str, Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = [
    ("conninfo_to_dict(conninfo)", conninfo_to_dict, ("dbname=x",), {}),
    ("make_conninfo('', **attempt)", make_conninfo, ("",), {"host": "h", "port": 5432}),
    ("conninfo_attempts(params)", conninfo_attempts, ({"host": "h"},), {}),
    ("set_json_loads(loads, conn)", set_json_loads, (_, _), {}),
    ("capabilities.has_cancel_safe()", psycopg.capabilities.has_cancel_safe, (), {}),
    ("TrioConnection(pgconn)", psycopg.AsyncConnection.__init__, (_, _), {}),
    ("conn.set_autocommit(True)", psycopg.AsyncConnection.set_autocommit, (_, True), {}),
    ("conn.execute(sql)", psycopg.AsyncConnection.execute, (_, "BEGIN"), {}),
    ("conn.cursor()", psycopg.AsyncConnection.cursor, (_,), {}),
    ("conn.close()", psycopg.AsyncConnection.close, (_,), {}),
    ("conn.cancel()", psycopg.AsyncConnection.cancel, (_,), {}),
    ("cursor.execute(sql, params)", psycopg.AsyncCursor.execute, (_, "SELECT 1", ()), {}),
    ("cursor.fetchall()", psycopg.AsyncCursor.fetchall, (_,), {}),
    # libpq through psycopg.pq: the protocol every implementation (python, binary) follows
    ("pq.PGconn.connect_start(conninfo)", pq_abc.PGconn.connect_start, (b"",), {}),
    ("pgconn.connect_poll()", pq_abc.PGconn.connect_poll, (_,), {}),
    ("pgconn.finish()", pq_abc.PGconn.finish, (_,), {}),
    ("pgconn.cancel_conn()", pq_abc.PGconn.cancel_conn, (_,), {}),
    ("pgconn.consume_input()", pq_abc.PGconn.consume_input, (_,), {}),
    ("pgconn.notifies()", pq_abc.PGconn.notifies, (_,), {}),
    # the text path (_run_text): a hot statement sent without a cursor
    ("pgconn.send_prepare(name, sql)", pq_abc.PGconn.send_prepare, (_, b"n", b"SELECT 1"), {}),
    (
        "pgconn.send_query_prepared(name, values)",
        pq_abc.PGconn.send_query_prepared,
        (_, b"n", [b"1"]),
        {},
    ),
    (
        "pgconn.send_query_params(sql, values)",
        pq_abc.PGconn.send_query_params,
        (_, b"SELECT $1", [None]),
        {},
    ),
    ("pgconn.flush()", pq_abc.PGconn.flush, (_,), {}),
    ("pgconn.is_busy()", pq_abc.PGconn.is_busy, (_,), {}),
    ("pgconn.get_result()", pq_abc.PGconn.get_result, (_,), {}),
    ("pgconn.parameter_status(name)", pq_abc.PGconn.parameter_status, (_, b"client_encoding"), {}),
    ("pgresult.get_value(row, col)", pq_abc.PGresult.get_value, (_, 0, 0), {}),
    (
        "errors.error_from_result(res, encoding=)",
        psycopg.errors.error_from_result,
        (_,),
        {"encoding": "utf-8"},
    ),
    ("cancel_conn.start()", pq_abc.PGcancelConn.start, (_,), {}),
    ("cancel_conn.poll()", pq_abc.PGcancelConn.poll, (_,), {}),
    ("cancel_conn.finish()", pq_abc.PGcancelConn.finish, (_,), {}),
]


@pytest.mark.parametrize(("label", "fn", "args", "kwargs"), CALLS, ids=[c[0] for c in CALLS])
def test_every_psycopg_call_the_bridge_makes_still_binds(
    label: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    _binds(fn, *args, **kwargs)


#: Attributes read on psycopg's classes: (owner, attribute).
ATTRIBUTES = [
    (pq_abc.PGconn, "socket"),
    (pq_abc.PGconn, "status"),
    (pq_abc.PGconn, "transaction_status"),
    (pq_abc.PGconn, "nonblocking"),
    (pq_abc.PGcancelConn, "socket"),
    (pq.PGnotify, "extra"),
    (pq.PGconn, "connect_start"),
    (pq.PGconn, "connect_poll"),
    (pq.PGconn, "cancel_conn"),
    (pq.PGcancelConn, "poll"),
    (pq_abc.PGresult, "status"),
    (pq_abc.PGresult, "nfields"),
    (pq_abc.PGresult, "ntuples"),
    (psycopg.AsyncConnection, "info"),
    (psycopg.AsyncConnection, "closed"),
    # set to None: no server-side prepared statement behind a pooler
    (psycopg.AsyncConnection, "prepare_threshold"),
]


@pytest.mark.parametrize(
    ("owner", "name"), ATTRIBUTES, ids=[f"{o.__name__}.{n}" for o, n in ATTRIBUTES]
)
def test_every_attribute_the_bridge_reads_exists(owner: type, name: str) -> None:
    assert hasattr(owner, name), f"{owner.__name__}.{name} is gone"


@pytest.mark.postgres
async def test_the_instance_attributes_the_bridge_reads(pg_dsn: str) -> None:
    # set in __init__, so only a live connection shows them
    conn = await connect(pg_dsn)
    try:
        assert isinstance(conn.pgconn.socket, int)
        assert conn.pgconn.nonblocking == 1  # psycopg's query generators need it
        assert conn.pgconn.transaction_status == pq.TransactionStatus.IDLE
        cursor = conn.cursor()
        await cursor.execute("SELECT 1")
        assert cursor.pgresult is not None
        assert cursor.pgresult.status == pq.ExecStatus.TUPLES_OK
        assert await cursor.fetchall() == [(1,)]
    finally:
        await conn.close()
    assert conn.closed


def test_the_enumerations_the_bridge_compares_with() -> None:
    # psycopg's generators yield a Wait and are sent a Ready; the bridge answers
    # with these values, so they must stay what its poll masks assume.
    assert (psycopg.waiting.Wait.R, psycopg.waiting.Wait.W, psycopg.waiting.Wait.RW) == (1, 2, 3)
    assert (psycopg.waiting.Ready.R, psycopg.waiting.Ready.W) == (1, 2)
    for name in ("OK", "READING", "WRITING", "FAILED"):
        assert hasattr(pq.PollingStatus, name)
    for name in ("OK", "BAD"):
        assert hasattr(pq.ConnStatus, name)
    for name in ("ACTIVE", "IDLE"):
        assert hasattr(pq.TransactionStatus, name)
    assert hasattr(pq.ExecStatus, "TUPLES_OK")
    assert hasattr(pq.ExecStatus, "FATAL_ERROR")


def test_the_required_psycopg_cancels_without_blocking() -> None:
    # pyproject's lower bound is the first psycopg-binary carrying libpq 17, whose
    # non-blocking cancel the bridge drives on Trio. Below it the bridge falls back
    # to a blocking PQcancel in a thread, which psycopg-binary runs holding the GIL.
    assert psycopg.capabilities.has_cancel_safe(), (
        f"psycopg {psycopg.__version__} ({pq.__impl__}, libpq {pq.version()}) has no "
        "non-blocking cancel: install psycopg[binary] within pyproject.toml's bounds"
    )


def test_the_exceptions_the_bridge_and_driver_catch() -> None:
    for name in (
        "Error",
        "OperationalError",
        "InterfaceError",
        "InternalError",
        "ProgrammingError",
    ):
        assert issubclass(getattr(psycopg, name), Exception)
    assert issubclass(psycopg.errors.QueryCanceled, psycopg.OperationalError)
    assert issubclass(psycopg.errors.UniqueViolation, psycopg.IntegrityError)
    # what a session that lost the text path's prepared statement answers
    assert psycopg.errors.lookup("26000") is psycopg.errors.InvalidSqlStatementName


#: ``AsyncConnection.wait`` as psycopg has declared it: the one method the bridge
#: overrides. A new shape is a psycopg change to review before admitting it here.
KNOWN_WAIT_SHAPES = [
    ("self", "gen", "interval"),  # psycopg 3.2
    ("self", "gen", "interval", "timeout"),  # psycopg 3.3
]


def test_the_overridden_wait_takes_every_argument_psycopg_passes() -> None:
    theirs = inspect.signature(psycopg.AsyncConnection.wait).parameters
    ours = inspect.signature(TrioConnection.wait).parameters
    assert tuple(theirs) in KNOWN_WAIT_SHAPES, (
        f"psycopg's AsyncConnection.wait is now {tuple(theirs)}: check how psycopg calls it "
        "and what it expects back before adding the shape"
    )
    for name, param in theirs.items():
        assert name in ours, f"TrioConnection.wait does not take {name!r}"
        assert ours[name].kind == param.kind, name
        if param.default is not inspect.Parameter.empty:
            assert ours[name].default is not inspect.Parameter.empty, f"{name} must stay optional"
    # psycopg calls it as wait(gen), wait(gen, interval=...) and (3.3) wait(gen, timeout=...)
    _binds(TrioConnection.wait, _, _)
    _binds(TrioConnection.wait, _, _, interval=0.1)
    _binds(TrioConnection.wait, _, _, timeout=1.0)


def _psycopg_references(path: pathlib.Path) -> list[str]:
    """Every dotted psycopg name a module imports or reads (``psycopg.errors.X``,
    ``from psycopg.x import y``, ``pq.X``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    aliases: dict[str, str] = {}
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "psycopg":
                    found.append(alias.name)
                    aliases[(alias.asname or alias.name).split(".")[0]] = (
                        alias.name if alias.asname else "psycopg"
                    )
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "psycopg":
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.append(full)
                aliases[alias.asname or alias.name] = full
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts: list[str] = []
            inner: ast.expr = node
            while isinstance(inner, ast.Attribute):
                parts.insert(0, inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id in aliases:
                found.append(".".join([aliases[inner.id], *parts]))
    return found


def test_no_module_reaches_into_psycopg_internals() -> None:
    private = []
    for path in sorted(SRC.rglob("*.py")):
        for name in _psycopg_references(path):
            if any(part.startswith("_") for part in name.split(".")):
                private.append(f"{path.relative_to(SRC)}: {name}")
        text = path.read_text(encoding="utf-8")
        # a private name looked up by string (getattr(psycopg.errors, "_WaitTimeout"))
        if "getattr(psycopg" in text:
            private.append(f"{path.relative_to(SRC)}: getattr(psycopg...)")
    assert private == []


def test_the_scan_finds_what_the_bridge_uses() -> None:
    # the scan above is only as good as what it sees: it sees the bridge's names
    names = set(_psycopg_references(BRIDGE))
    assert "psycopg.conninfo.conninfo_attempts" in names
    assert "psycopg.waiting.Wait.R" in names
    assert "psycopg.pq.PGconn.connect_start" in names


def _psycopg_requirement() -> str:
    pyproject = pathlib.Path(__file__).resolve().parents[3] / "pyproject.toml"
    with pyproject.open("rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    [requirement] = [d for d in deps if re.match(r"psycopg\b", d)]
    return str(requirement)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def test_psycopg_is_capped_below_its_next_minor() -> None:
    requirement = _psycopg_requirement()
    lower = re.search(r">=\s*([\d.]+)", requirement)
    upper = re.search(r"<\s*([\d.]+)", requirement)
    assert lower is not None, f"{requirement}: give the oldest supported psycopg (>=X.Y.Z)"
    assert upper is not None, f"{requirement}: cap psycopg below its next minor (<X.Y)"
    # a minor, not a patch: a patch release may not change what the bridge relies on
    assert re.fullmatch(r"\d+\.\d+", upper.group(1)), requirement
    installed = _version(psycopg.__version__)
    assert _version(lower.group(1)) <= installed < _version(upper.group(1)), (
        f"psycopg {psycopg.__version__} is outside {requirement}"
    )
