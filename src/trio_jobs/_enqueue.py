"""The one enqueue implementation and what it needs: the actor, the ids and times
it parses, the ``Enqueued`` answer.

Below both the declarations (``Job.enqueue`` calls :func:`enqueue_inputs`) and the
facade (which re-exports :class:`Actor`): it finds the facade through
:mod:`._ambient`, and imports neither ``_declare`` nor ``_facade`` at run time.
"""

from __future__ import annotations

import functools
import operator
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import attrs

from . import _ambient, _tracing
from ._time import Duration, UuidSource, parse_duration
from ._validate import check_priority, check_text, epoch
from .drivers._protocol import (
    ENQUEUE_CHUNK,
    MAX_ENQUEUE_BATCH,
    MIN_ID_PREFIX,
    EnqueueBatch,
    EnqueueRequest,
)
from .errors import ErrorCode, JobsError

if TYPE_CHECKING:
    from ._declare import Job
    from ._facade import Jobs

__all__ = [
    "CROSS_TENANT_PERMISSION",
    "Actor",
    "Enqueued",
    "confining_org",
    "current_facade",
    "enqueue_inputs",
    "enqueue_one",
    "job_ref",
    "stage_one",
    "stage_requests",
]

#: "Argument not passed" (``enqueue_as(None, ...)`` passes ``None`` on purpose).
_MISSING: Any = object()

CROSS_TENANT_PERMISSION = "tenancy:cross"


@attrs.frozen
class Actor:
    """Who a run acts for: ``id``, the org (tenant) it belongs to, its permissions."""

    id: str
    org_id: str | None = None
    permissions: frozenset[str] = attrs.field(default=frozenset(), converter=frozenset)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "org_id": self.org_id, "permissions": sorted(self.permissions)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Actor | None:
        if not data:
            return None
        return cls(
            id=str(data["id"]),
            org_id=data.get("org_id"),
            permissions=frozenset(data.get("permissions") or ()),
        )


@attrs.frozen
class Enqueued:
    """What an enqueue answers: the job's own ids, and whether a live key deduped it."""

    id: str
    run_id: str
    deduped: bool


def _crossing(actor: Actor) -> bool:
    """Inside ``cross_tenant(reason)``, for an actor holding ``tenancy:cross``:
    another actor set inside the block is checked as usual."""
    return (
        _ambient.cross_tenant_var.get() is not None and CROSS_TENANT_PERMISSION in actor.permissions
    )


def confining_org() -> str | None:
    """The org the ambient actor confines enqueues and operator calls to: its
    ``org_id``, or ``None`` with no ambient actor, an actor with no org, or inside
    ``cross_tenant(reason)`` (for an actor holding ``tenancy:cross``)."""
    actor = _ambient.actor_var.get()
    if actor is None or actor.org_id is None or _crossing(actor):
        return None
    return actor.org_id


def current_facade() -> Jobs:
    """The ambient facade, or ``X_CONFIG_INVALID`` saying how to install one."""
    facade = _ambient.facade_var.get()
    if facade is None:
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            "no jobs facade is installed here; wrap the code in `async with open_jobs(driver, jobs=[...])` "
            "(or open_harness() in a test)",
        )
    return facade


#: Where a canonical id has its dashes; every other character is a hex digit.
_ID_TEMPLATE = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
_HEX = frozenset("0123456789abcdef")


def job_ref(value: object) -> tuple[str, bool]:
    """A job id as an operator gives it: ``(id, False)`` for a whole id (a
    ``uuid.UUID``, or any text ``uuid.UUID`` reads, made canonical), ``(prefix,
    True)`` for the start of a canonical id of at least ``MIN_ID_PREFIX``
    characters (lowercased: ``6b63347c``, ``6b63347c-1d2c``). Anything else is
    ``X_ID_INVALID``, before any I/O."""
    if isinstance(value, uuid.UUID):
        return str(value), False
    if not isinstance(value, str):
        raise _bad_id()
    text = value.lower()
    if MIN_ID_PREFIX <= len(text) < len(_ID_TEMPLATE) and all(
        ch == "-" if slot == "-" else ch in _HEX
        for ch, slot in zip(text, _ID_TEMPLATE[: len(text)], strict=True)
    ):
        return text, True
    try:
        return str(uuid.UUID(value)), False
    except ValueError:
        raise _bad_id() from None


def _bad_id() -> JobsError:
    return JobsError(
        ErrorCode.X_ID_INVALID,
        "a job id is a UUID as `trio-jobs list` prints it (0191c6a2-6c1e-7a3b-9f0e-...), "
        f"or its first {MIN_ID_PREFIX} or more characters (0191c6a2, 0191c6a2-6c1e)",
    )


def _epoch(
    value: datetime | float | None, *, what: str, code: ErrorCode = ErrorCode.X_INVARIANT
) -> float | None:
    """An instant a caller passed, as epoch seconds (``None`` stays ``None``);
    refused with ``code`` outside 1970..9999 UTC (see :mod:`._validate`)."""
    if value is None:
        return None
    return epoch(value, what=what, code=code)


def _delay(value: Duration | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value, field="delay", allow_zero=True)
    except JobsError as exc:
        raise JobsError(ErrorCode.X_JOB_INPUT_INVALID, exc.message) from None


def _run_id(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, str):
        try:
            parsed = uuid.UUID(value)
        except ValueError:
            parsed = None
        if parsed is not None and str(parsed) == value:
            return value
    raise JobsError(
        ErrorCode.X_ID_INVALID,
        "run_id must be a lowercase canonical uuid (str or uuid.UUID); nothing was queued",
    )


_INT_MIN = -(2**63)
_is_none = functools.partial(operator.is_, None)
_INT_LIMIT = 2**64


async def enqueue_inputs(
    handle: Job[Any, Any],
    inputs: Sequence[Any],
    *,
    run_ids: Sequence[Any],
    delay: Duration | None,
    run_at: datetime | float | None,
    tenant_id: str | None,
    priority: int,
    actor: Any,
) -> list[Enqueued]:
    """The one enqueue implementation: every refusal before the first write."""
    facade = current_facade()
    _ambient.check_not_aborted()
    requests = stage_requests(
        facade,
        handle,
        inputs,
        run_ids=run_ids,
        delay=delay,
        run_at=run_at,
        tenant_id=tenant_id,
        priority=priority,
        actor=actor,
    )
    if not requests:
        return []
    driver = await facade._resolved_driver()
    tx = _ambient.tx_var.get()
    results = []
    for start in range(0, len(requests), ENQUEUE_CHUNK):
        chunk = requests[start : start + ENQUEUE_CHUNK]
        if tx is not None and tx.jobs is facade:
            got = await tx.driver_tx.enqueue_many(chunk)
        else:
            got = await driver.enqueue_many(chunk)
        results.extend(got)
    return [Enqueued(r.id, r.run_id, r.deduped) for r in results]


async def enqueue_one(
    handle: Job[Any, Any],
    raw: Any,
    *,
    run_id: Any,
    delay: Duration | None,
    run_at: datetime | float | None,
    tenant_id: str | None,
    priority: int,
    actor: Any,
) -> Enqueued:
    """:func:`enqueue_inputs` of one input (``Job.enqueue``, ``enqueue_as``): the
    same checks, in the same order, and the same one ``enqueue_many`` call of the
    driver, through fewer layers (a single enqueue's Python is on the critical
    path of every request handler that queues a job; benchmarks/README.md)."""
    facade = current_facade()
    _ambient.check_not_aborted()
    request = stage_one(
        facade,
        handle,
        raw,
        run_id=run_id,
        delay=delay,
        run_at=run_at,
        tenant_id=tenant_id,
        priority=priority,
        actor=actor,
    )
    driver = await facade._resolved_driver()
    tx = _ambient.tx_var.get()
    if tx is not None and tx.jobs is facade:
        got = await tx.driver_tx.enqueue_many([request])
    else:
        got = await driver.enqueue_many([request])
    r = got[0]
    return Enqueued(r.id, r.run_id, r.deduped)


def _run_options(
    handle: Job[Any, Any],
    delay: Duration | None,
    run_at: datetime | float | None,
    tenant_id: str | None,
    priority: int,
) -> tuple[float | None, float | None]:
    """The run's options, checked once for the whole call against the range every
    driver stores (_validate.py): nothing reaches a driver that one of them would
    refuse or corrupt. Answers ``(delay, run_at)`` in seconds."""
    if delay is not None and run_at is not None:
        raise JobsError(ErrorCode.X_INVARIANT, "pass delay= or run_at=, not both")
    if handle.debounce is not None and (delay is not None or run_at is not None):
        raise JobsError(
            ErrorCode.X_INVARIANT,
            f"{handle.name} declares debounce=: its run starts debounce after the last "
            "enqueue of its key; drop delay=/run_at= (nothing was queued)",
            meta={"job": handle.name},
        )
    delay_s = _delay(delay)
    run_at_s = _epoch(run_at, what="run_at", code=ErrorCode.X_JOB_INPUT_INVALID)
    check_priority(priority, code=ErrorCode.X_JOB_INPUT_INVALID)
    if tenant_id is not None and (not isinstance(tenant_id, str) or tenant_id == ""):
        raise JobsError(ErrorCode.X_JOB_TENANT_MISMATCH, "tenant_id must be a non-empty string")
    if tenant_id is not None:
        check_text(tenant_id, what="tenant_id", code=ErrorCode.X_JOB_INPUT_INVALID)
    return delay_s, run_at_s


def _actor(actor: Any) -> tuple[bool, Actor | None]:
    """``(explicit, actor)``: the actor ``enqueue_as`` passed, else the ambient one."""
    if actor is _MISSING:
        return False, _ambient.actor_var.get()
    if actor is not None and not isinstance(actor, Actor):
        raise JobsError(ErrorCode.X_INVARIANT, "enqueue_as takes an Actor or None")
    return True, actor


def _row_tenant(
    handle: Job[Any, Any],
    declared: str | None,
    tenant_id: str | None,
    explicit_actor: bool,
    actor_obj: Actor | None,
    confined: str | None,
) -> str | None:
    """The row's tenant when ``tenant_id=``, ``enqueue_as`` or an ambient actor's
    org applies: an ambient actor of an org confines every row to that org (or to
    none), whichever way the row's tenant was named (the input's declared tenant,
    tenant_id=, or the actor passed to enqueue_as)."""
    row_tenant = declared
    if tenant_id is not None:
        if declared is not None and declared != tenant_id:
            raise _mismatch(handle, "tenant_id=")
        row_tenant = tenant_id
    if explicit_actor:
        org = actor_obj.org_id if actor_obj is not None else None
        if org is not None:
            if declared is not None and declared != org:
                raise _mismatch(handle, "the actor passed to enqueue_as")
            row_tenant = org
    if confined is not None and row_tenant is not None and row_tenant != confined:
        if declared is not None and declared == row_tenant:
            raise _mismatch(handle, "the ambient actor")
        raise _outside(handle, "enqueue_as's actor" if explicit_actor else "tenant_id=")
    return row_tenant


def _native(handle: Job[Any, Any]) -> Any:
    """A JSON-native declared input (int, str, bool): an input of exactly that type
    is its own structured value and parses back to itself (no parse, no round trip)."""
    return handle.input if handle.input in (int, str, bool) else None


def _value_payload(handle: Job[Any, Any], raw: Any, native: Any) -> tuple[Any, Any]:
    """The input as the job's body sees it, and as the row stores it."""
    if native is not None and type(raw) is native:
        # orjson writes ints of 64 bits; payload_form refuses the rest (and
        # checks a string's size and encoding).
        if native is bool or (native is int and _INT_MIN <= raw < _INT_LIMIT):
            return raw, raw
        return raw, handle._payload(raw)
    value = handle.parse(raw)
    payload = handle._payload(value)
    # Round trip: what the worker will parse must parse.
    handle.parse(payload)
    return value, payload


def stage_one(
    facade: Jobs,
    handle: Job[Any, Any],
    raw: Any,
    *,
    run_id: Any,
    delay: Duration | None,
    run_at: datetime | float | None,
    tenant_id: str | None,
    priority: int,
    actor: Any,
) -> EnqueueRequest:
    """``stage_requests(facade, handle, [raw], run_ids=[run_id], ...)[0]``, without
    the batch's set-up: the same refusals in the same order, and the same ids
    drawn from a seeded source."""
    delay_s, run_at_s = _run_options(handle, delay, run_at, tenant_id, priority)
    explicit_actor, actor_obj = _actor(actor)
    confined = confining_org()
    trace_context = _tracing.inject()
    rid = _run_id(run_id) if run_id is not None else ""
    value, payload = _value_payload(handle, raw, _native(handle))
    key = handle.idempotency_key_for(value)
    ckey = handle.concurrency_key_for(value) if handle._concurrency_key is not None else None
    row_tenant = handle.tenant_of(value) if handle.tenant != "none" else None
    if tenant_id is not None or explicit_actor or confined is not None:
        row_tenant = _row_tenant(handle, row_tenant, tenant_id, explicit_actor, actor_obj, confined)
    ids = facade.ids
    if isinstance(ids, UuidSource) and not ids.seeded:
        job_id, fresh_run = ids.new_pair()
        run = rid or fresh_run
    else:
        job_id = ids.new_id()
        run = rid or ids.new_id()
    return EnqueueRequest(
        id=job_id,
        run_id=run,
        name=handle.name,
        queue=handle.queue,
        payload=payload,
        idempotency_key=key,
        max_attempts=handle.max_attempts,
        tenant_id=row_tenant,
        concurrency_key=ckey,
        priority=priority,
        run_at=run_at_s,
        delay=delay_s,
        actor=actor_obj.to_json() if actor_obj is not None else None,
        trace_context=trace_context,
        sensitive=handle.sensitive,
        debounce=handle.debounce,
        unique_for=handle.unique_for,
    )


def stage_requests(
    facade: Jobs,
    handle: Job[Any, Any],
    inputs: Sequence[Any],
    *,
    run_ids: Sequence[Any],
    delay: Duration | None,
    run_at: datetime | float | None,
    tenant_id: str | None,
    priority: int,
    actor: Any,
) -> EnqueueBatch:
    """The rows an enqueue of ``inputs`` writes, every refusal raised before any
    write (``step.invoke``/``step.gather`` write them inside the step's record).

    Staged as columns (:class:`EnqueueBatch`): a list per field that varies
    (ids, payloads, keys, and tenants or concurrency keys when a rule applies),
    every other field once; no :class:`EnqueueRequest` is made unless a driver
    reads the batch as requests. The refusals, their order, and the ids drawn
    (from a seeded source too) are those of staging row by row (:func:`stage_one`)."""
    if len(inputs) > MAX_ENQUEUE_BATCH:
        raise JobsError(
            ErrorCode.X_JOB_ENQUEUE_BATCH_TOO_LARGE,
            f"enqueue_many takes at most {MAX_ENQUEUE_BATCH} inputs, got {len(inputs)}; page the source",
        )
    delay_s, run_at_s = _run_options(handle, delay, run_at, tenant_id, priority)
    explicit_actor, actor_obj = _actor(actor)
    confined = confining_org()

    # The enqueuer's span (W3C traceparent), so each attempt's span links to it.
    trace_context = _tracing.inject()
    native = _native(handle)
    ids = facade.ids
    # An unseeded uuid4 source makes a batch's ids in one call; any other source
    # (a seeded stream, one passed in) is asked per id, in the order it always was.
    fresh = ids.new_ids(2 * len(inputs)) if isinstance(ids, UuidSource) and not ids.seeded else None
    key_for = handle.idempotency_key_for
    # Hoisted out of the loop (an enqueue_many stages 1,000 rows): the bound
    # methods, whether any tenant rule can apply, and the actor's JSON form
    # (one object every row shares, as trace_context is).
    ckey_for = handle.concurrency_key_for if handle._concurrency_key is not None else None
    tenant_of = handle.tenant_of if handle.tenant != "none" else None
    tenancy = tenant_id is not None or explicit_actor or confined is not None
    actor_json = actor_obj.to_json() if actor_obj is not None else None
    payloads: list[Any] = []
    keys: list[str] = []
    tenants: list[str | None] | None = None
    ckeys: list[str | None] | None = None
    if (
        fresh is not None
        and native is not None
        and ckey_for is None
        and tenant_of is None
        and not tenancy
        and all(map(_is_none, run_ids))
    ):
        # The common batch (enqueue_many of JSON-native inputs: no run ids, no
        # concurrency key, no tenant rule): only the payload and the key vary.
        job_ids, run_col = fresh[0::2], fresh[1::2]
        if (
            native is not str
            and set(map(type, inputs)) == {native}
            and (native is bool or (_INT_MIN <= min(inputs) and max(inputs) < _INT_LIMIT))
        ):
            # Every input is its own payload (C loops): only the keys are asked
            # per row, in order, so the first refusal is the same row's.
            payloads = list(inputs)
            keys.extend(map(key_for, payloads))
        else:
            add_payload, add_key = payloads.append, keys.append
            for raw in inputs:
                value, payload = _value_payload(handle, raw, native)
                add_payload(payload)
                add_key(key_for(value))
    else:
        job_ids = []
        run_col = []
        tenants = [] if tenant_of is not None or tenancy else None
        ckeys = [] if ckey_for is not None else None
        for index, raw in enumerate(inputs):
            rid = _run_id(run_ids[index]) if run_ids[index] is not None else ""
            value, payload = _value_payload(handle, raw, native)
            key = key_for(value)
            ckey = ckey_for(value) if ckey_for is not None else None
            row_tenant = tenant_of(value) if tenant_of is not None else None
            if tenancy:
                row_tenant = _row_tenant(
                    handle, row_tenant, tenant_id, explicit_actor, actor_obj, confined
                )
            if fresh is not None:
                job_id = fresh[2 * index]
                run_id = rid or fresh[2 * index + 1]
            else:
                job_id = ids.new_id()
                run_id = rid or ids.new_id()
            job_ids.append(job_id)
            run_col.append(run_id)
            payloads.append(payload)
            keys.append(key)
            if tenants is not None:
                tenants.append(row_tenant)
            if ckeys is not None:
                ckeys.append(ckey)
    return EnqueueBatch(
        ids=job_ids,
        run_ids=run_col,
        payloads=payloads,
        idempotency_keys=keys,
        tenant_ids=tenants,
        concurrency_keys=ckeys,
        name=handle.name,
        queue=handle.queue,
        max_attempts=handle.max_attempts,
        priority=priority,
        run_at=run_at_s,
        delay=delay_s,
        actor=actor_json,
        trace_context=trace_context,
        sensitive=handle.sensitive,
        debounce=handle.debounce,
        unique_for=handle.unique_for,
    )


def _outside(handle: Job[Any, Any], source: str) -> JobsError:
    return JobsError(
        ErrorCode.X_JOB_TENANT_MISMATCH,
        f"{handle.name}: {source} names another org than the ambient actor's; nothing was "
        "queued (an actor acts within its own org: use cross_tenant(reason) for an ambient "
        "actor holding tenancy:cross, or enqueue outside acting_as())",
        meta={"job": handle.name},
    )


def _mismatch(handle: Job[Any, Any], source: str) -> JobsError:
    return JobsError(
        ErrorCode.X_JOB_TENANT_MISMATCH,
        f"{handle.name}: the input's declared tenant differs from the tenant of {source}; "
        "nothing was queued (use cross_tenant(reason) for an ambient actor holding tenancy:cross)",
        meta={"job": handle.name},
    )
