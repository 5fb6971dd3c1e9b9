"""The PostgreSQL driver reads a batch staged as columns (``EnqueueBatch``)
straight into enqueue_many's parameters, building no ``EnqueueRequest``: the
parameters must be exactly those of the same rows sent as a list of requests,
and the answers and rows those the list gets (dedupes inside the batch, held
keys, tenants, concurrency keys, a transaction).
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest

from trio_jobs import Actor, Concurrency, JobContext, _ambient, job, memory_driver, open_jobs
from trio_jobs._enqueue import _MISSING, stage_requests
from trio_jobs._time import UuidSource
from trio_jobs.drivers._protocol import EnqueueBatch
from trio_jobs.drivers.postgres import PostgresDriver

from .conftest import sql

pytestmark = pytest.mark.postgres


@attrs.frozen
class Order:
    org_id: str
    n: int = 0


async def _noop(ctx: JobContext[Any]) -> None:
    return None


plain = job(name="pgb.plain", input=int, idempotency_key=lambda i: f"k{i}")(_noop)
orders = job(
    name="pgb.orders",
    input=Order,
    tenant=lambda o: o.org_id,
    idempotency_key=lambda o: f"o{o.n}",
    concurrency=Concurrency(1, key=lambda o: f"c{o.n % 2}"),
)(_noop)
same_ckey = job(
    name="pgb.same",
    input=int,
    idempotency_key=lambda i: f"s{i}",
    concurrency=Concurrency(1, key=lambda i: "one"),
)(_noop)
HANDLES = [plain, orders, same_ckey]


async def _stage(handle: Any, inputs: list[Any], seed: int = 1, **options: Any) -> EnqueueBatch:
    async with open_jobs(memory_driver(), jobs=HANDLES, ids=UuidSource(seed)):
        facade = _ambient.facade_var.get()
        assert facade is not None
        batch = stage_requests(
            facade,
            handle,
            inputs,
            run_ids=[None] * len(inputs),
            delay=options.get("delay"),
            run_at=None,
            tenant_id=options.get("tenant_id"),
            priority=options.get("priority", 0),
            actor=options.get("actor", _MISSING),
        )
    assert isinstance(batch, EnqueueBatch)
    return batch


BATCHES: list[tuple[Any, list[Any], dict[str, Any]]] = [
    (plain, list(range(5)), {}),
    (plain, [1, 2, 1, 3], {"delay": "1h", "priority": 4}),
    (plain, list(range(3)), {"actor": Actor("u", org_id="org-q", permissions=frozenset({"p"}))}),
    (orders, [Order("org-a", n) for n in range(4)], {}),  # one tenant, two concurrency keys
    (orders, [Order("org-a", 1), Order("org-b", 1), Order("org-a", 2)], {}),  # tenants vary
    (same_ckey, list(range(3)), {}),  # one concurrency key for all
]


@pytest.mark.parametrize(("handle", "inputs", "options"), BATCHES)
async def test_a_batchs_parameters_are_those_of_its_requests(
    driver: PostgresDriver, handle: Any, inputs: list[Any], options: dict[str, Any]
) -> None:
    batch = await _stage(handle, inputs, **options)
    requests = list(batch)
    for pending in (range(len(batch)), [0, len(batch) - 1], [1]):
        assert driver._enqueue_params(batch, pending) == driver._enqueue_params(requests, pending)


@pytest.mark.parametrize(("handle", "inputs", "options"), BATCHES)
async def test_a_batch_answers_and_writes_what_its_requests_do(
    driver: PostgresDriver,
    pg_dsn: str,
    pg_schema: str,
    handle: Any,
    inputs: list[Any],
    options: dict[str, Any],
) -> None:
    batch = await _stage(handle, inputs, **options)
    # A held key (the first input's, enqueued alone before) and, for a batch
    # repeating an input, a follower deduped onto the first.
    (held,) = await driver.enqueue_many([batch[0]])
    out = await driver.enqueue_many(batch)
    firsts: dict[tuple[str | None, str], int] = {}
    for i, r in enumerate(batch):
        first = firsts.setdefault((r.tenant_id, r.idempotency_key), i)
        want = (r.id, r.run_id, False) if first == i else (out[first].id, out[first].run_id, True)
        if first == 0:
            want = (held.id, held.run_id, True)
        assert (out[i].id, out[i].run_id, out[i].deduped) == want
    rows = sql(
        pg_dsn,
        pg_schema,
        "SELECT id::text, name, tenant_id, idempotency_key, concurrency_key, priority, state,"
        " actor::text, payload::text FROM trio_jobs_jobs ORDER BY seq",
    )
    want_rows = [
        (
            r.id,
            r.name,
            r.tenant_id,
            r.idempotency_key,
            r.concurrency_key,
            r.priority,
            "delayed" if r.delay else "ready",
            None if r.actor is None else r.actor,
            r.payload,
        )
        for i, r in enumerate(batch)
        if firsts[(r.tenant_id, r.idempotency_key)] == i
    ]
    got_rows = [
        (*row[:7], None if row[7] is None else _loads(row[7]), _loads(row[8])) for row in rows
    ]
    assert got_rows == want_rows


def _loads(text: object) -> Any:
    assert isinstance(text, str)
    return json.loads(text)


async def test_a_batch_in_a_transaction_commits_or_vanishes_whole(
    driver: PostgresDriver, pg_dsn: str, pg_schema: str
) -> None:
    batch = await _stage(plain, list(range(5)), seed=2)

    class Rollback(Exception):
        pass

    async def rolled_back() -> None:
        async with driver.transaction() as tx:
            out = await tx.enqueue_many(batch)
            assert [o.deduped for o in out] == [False] * 5
            raise Rollback

    with pytest.raises(Rollback):
        await rolled_back()
    assert sql(pg_dsn, pg_schema, "SELECT count(*) FROM trio_jobs_jobs") == [(0,)]
    async with driver.transaction() as tx:
        out = await tx.enqueue_many(batch[:3])
        more = await tx.enqueue_many(batch)  # the first three now held, in this transaction
    assert [o.id for o in out] == batch.ids[:3]
    assert [(o.id, o.deduped) for o in more] == [(i, n < 3) for n, i in enumerate(batch.ids)]
    (count,) = sql(pg_dsn, pg_schema, "SELECT count(*) FROM trio_jobs_jobs")[0]
    assert count == 5
