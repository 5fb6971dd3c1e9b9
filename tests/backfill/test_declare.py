"""PYTHON-API.md, "Backfills — backfill()" and the intro of "Wave 2": the factory
returns a ``Job`` handle whose ``.kind`` is ``"backfill"``; a bad declaration is
refused at the call with the pinned code, naming every fault."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from trio_jobs import Job, JobContext, JobsError, Retry, backfill, job
from trio_jobs.errors import ErrorCode, JobDeclarationError


@attrs.frozen
class Table:
    name: str


def source(input: Table, cursor: Any) -> tuple[list[int], Any]:
    return [], None


def handle(items: list[int], input: Table) -> None:
    return None


def good(**over: Any) -> Job[Any, Any]:
    fields: dict[str, Any] = {
        "name": "rows.copy",
        "input": Table,
        "idempotency_key": lambda i: f"copy:{i.name}",
        "source": source,
        "handle": handle,
    }
    fields.update(over)
    return backfill(**fields)


def test_a_backfill_is_a_job_handle_of_kind_backfill() -> None:
    handle_ = good(queue="backfills", retry=Retry(attempts=5))
    assert isinstance(handle_, Job)
    assert handle_.kind == "backfill"
    assert handle_.describe()["kind"] == "backfill"
    assert handle_.name == "rows.copy"
    assert handle_.queue == "backfills"
    assert handle_.retry.attempts == 5
    assert handle_.idempotency_key_for(Table("users")) == "copy:users"
    assert handle_.parse({"name": "users"}) == Table("users")
    assert handle_.__doc__


def test_a_plain_job_is_of_kind_job() -> None:
    @job(input=Table, idempotency_key=lambda i: i.name)
    async def plain(ctx: JobContext[Table]) -> None: ...

    assert plain.kind == "job"
    assert Job.kind == "job"


def test_input_may_be_none_and_the_callables_async() -> None:
    async def pages(_input: None, cursor: Any) -> tuple[list[int], Any]:
        return [], None

    async def write(items: list[int], _input: None) -> None: ...

    handle_ = backfill(name="once", idempotency_key=lambda _: "once", source=pages, handle=write)
    assert handle_.input is None
    assert handle_.kind == "backfill"


def test_every_fault_is_named_in_one_refusal() -> None:
    with pytest.raises(JobDeclarationError) as err:
        backfill(
            input=Table,
            idempotency_key=lambda i: i.name,
            source="not callable",
            handle=lambda items: None,  # one argument: it is called with two
            queue="no spaces allowed",
            retry=Retry(attempts=0),
            bogus=1,
        )
    exc = err.value
    assert exc.code == ErrorCode.X_JOB_DECLARATION_INVALID
    faults = exc.meta["faults"]
    assert any("unknown field(s): bogus" in f for f in faults)
    assert any(f.startswith("name= is required") for f in faults)
    assert any(f.startswith("source must be a function") for f in faults)
    assert any(f.startswith("handle must take two arguments") for f in faults)
    assert any(f.startswith("queue must be") for f in faults)
    assert any(f.startswith("retry.attempts") for f in faults)
    assert len(faults) == 6
    for fault in faults:
        assert fault in exc.message


@pytest.mark.parametrize(
    ("over", "fault"),
    [
        ({"source": None}, "source= is required"),
        ({"handle": None}, "handle= is required"),
        ({"name": ""}, "name must be a non-empty string"),
        ({"name": "x" * 201}, "name must be a non-empty string"),
        ({"name": 12}, "name must be a non-empty string"),
        ({"name": "nul\x00"}, "name cannot be stored"),
        ({"source": lambda: None}, "source must take two arguments"),
        ({"source": lambda a, b, c: None}, "source must take two arguments"),
        ({"tenant": 5}, "tenant must be a function"),
        ({"input": object()}, "input must be an attrs class"),
        ({"step_timeout": "soon"}, "step_timeout must be a positive duration"),
        ({"timeout": "1h"}, "unknown field(s): timeout"),
    ],
)
def test_each_fault_alone_is_refused(over: dict[str, Any], fault: str) -> None:
    with pytest.raises(JobsError) as err:
        good(**over)
    assert err.value.code == ErrorCode.X_JOB_DECLARATION_INVALID
    assert any(f.startswith(fault) for f in err.value.meta["faults"]), err.value.meta


def test_callables_that_take_defaults_or_varargs_are_accepted() -> None:
    good(source=lambda i, c, limit=100: ([], None), handle=lambda *args: None)


def test_no_idempotency_key_is_x_idempotency_required_naming_the_other_faults() -> None:
    with pytest.raises(JobDeclarationError) as err:
        backfill(name="rows", source=source)  # no key, no handle
    assert err.value.code == ErrorCode.X_IDEMPOTENCY_REQUIRED
    assert "idempotency_key=" in err.value.message
    assert "handle= is required" in err.value.message
    with pytest.raises(JobDeclarationError) as err:
        good(idempotency_key=None)
    assert err.value.code == ErrorCode.X_IDEMPOTENCY_REQUIRED


def test_a_refusal_never_echoes_a_value() -> None:
    secret = "postgres://admin:hunter2@db/prod"
    with pytest.raises(JobsError) as err:
        good(source=secret, name=secret + "x" * 300)
    assert "hunter2" not in str(err.value)
    assert "hunter2" not in repr(err.value.meta)
