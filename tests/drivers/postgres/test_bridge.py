"""The bridge: psycopg on Trio's I/O loop, cancellation reaching the server."""

from __future__ import annotations

import hashlib
import time

import psycopg
import pytest
import trio

from trio_jobs.drivers.postgres._bridge import Database, Pool, statement_name
from trio_jobs.errors import JobsError

pytestmark = pytest.mark.postgres


def _active_sleeps(dsn: str, marker: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE %s",
            (f"%{marker}%",),
        ).fetchone()
        assert row is not None
        return int(row[0])


async def test_round_trip_and_json(pg_dsn: str) -> None:
    db = Database(Pool(pg_dsn, max_size=2))
    try:
        rows = await db.fetch('SELECT %s::int + 1, \'{"b": 1, "a": [2]}\'::json', (41,))
        assert rows == [(42, {"b": 1, "a": [2]})]
        assert await db.fetch("SELECT 1 WHERE false") == []
    finally:
        await db.pool.close()


async def test_cancelling_the_scope_cancels_the_query_on_the_server(pg_dsn: str) -> None:
    db = Database(Pool(pg_dsn, max_size=1))
    marker = "bridge_cancel_probe_1"
    try:
        started = time.monotonic()
        with trio.move_on_after(0.3) as scope:
            await db.fetch(f"SELECT pg_sleep(30) /* {marker} */")
        assert scope.cancelled_caught
        assert time.monotonic() - started < 5.0
        # the server stopped the query, not just the client waiting on it
        assert _active_sleeps(pg_dsn, marker) == 0
        # and the pool's one connection is healthy and reused
        assert db.pool.size == 1
        assert await db.fetch("SELECT 2") == [(2,)]
        assert db.pool.size == 1
    finally:
        await db.pool.close()


async def test_cancelling_inside_a_transaction_rolls_it_back(pg_dsn: str) -> None:
    db = Database(Pool(pg_dsn, max_size=1))
    marker = "bridge_cancel_probe_2"
    try:
        await db.fetch("CREATE TABLE IF NOT EXISTS pg_temp.t (x int)")
        with trio.move_on_after(0.3):
            async with db.transaction() as tx:
                await tx.execute("CREATE TEMP TABLE IF NOT EXISTS bridge_tx (x int)")
                await tx.execute("INSERT INTO bridge_tx VALUES (1)")
                await tx.execute(f"SELECT pg_sleep(30) /* {marker} */")
        assert _active_sleeps(pg_dsn, marker) == 0
        # the temp table was created in the rolled-back transaction: gone
        rows = await db.fetch("SELECT to_regclass('pg_temp.bridge_tx') IS NULL")
        assert rows == [(True,)]
    finally:
        await db.pool.close()


async def test_many_tasks_share_the_pool(pg_dsn: str) -> None:
    db = Database(Pool(pg_dsn, max_size=4))
    results: list[int] = []
    try:

        async def one(i: int) -> None:
            rows = await db.fetch("SELECT %s::int", (i,))
            results.append(int(rows[0][0]))

        async with trio.open_nursery() as nursery:
            for i in range(50):
                nursery.start_soon(one, i)
        assert sorted(results) == list(range(50))
        assert db.pool.size <= 4
    finally:
        await db.pool.close()


def _terminate(dsn: str, pid: int) -> None:
    """End a backend the way a server restart does (FATAL 57P01, socket closed),
    and wait until it is gone."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))


async def test_an_idle_connection_killed_by_the_server_is_replaced_before_use(
    pg_dsn: str,
) -> None:
    # Regression (the chaos soak): after a server restart every idle pooled
    # connection failed one call with X_DRIVER_UNAVAILABLE, the server long back up.
    db = Database(Pool(pg_dsn, max_size=1))
    try:
        pid = (await db.fetch("SELECT pg_backend_pid()"))[0][0]
        _terminate(pg_dsn, pid)
        new_pid = (await db.fetch("SELECT pg_backend_pid()"))[0][0]
        assert new_pid != pid
        assert db.pool.size == 1
    finally:
        await db.pool.close()


async def test_a_connection_killed_mid_statement_is_driver_unavailable_then_replaced(
    pg_dsn: str,
) -> None:
    db = Database(Pool(pg_dsn, max_size=2))
    marker = "bridge_kill_probe_1"
    try:
        async with trio.open_nursery() as nursery:

            async def kill_the_sleeper() -> None:
                with trio.fail_after(5):
                    while True:
                        rows = await db.fetch(
                            "SELECT pid FROM pg_stat_activity WHERE query LIKE %s "
                            "AND pid <> pg_backend_pid()",
                            (f"%{marker}%",),
                        )
                        if rows:
                            break
                        await trio.sleep(0.01)
                await trio.to_thread.run_sync(_terminate, pg_dsn, rows[0][0])

            nursery.start_soon(kill_the_sleeper)
            with pytest.raises(JobsError) as err:
                await db.fetch(f"SELECT pg_sleep(30) /* {marker} */")
        assert err.value.code == "X_DRIVER_UNAVAILABLE"
        assert await db.fetch("SELECT 1") == [(1,)]
    finally:
        await db.pool.close()


async def test_an_unreachable_server_is_driver_unavailable() -> None:
    db = Database(Pool("postgresql://nobody@127.0.0.1:1/none?connect_timeout=2", max_size=1))
    with pytest.raises(JobsError) as err:
        await db.fetch("SELECT 1")
    assert err.value.code == "X_DRIVER_UNAVAILABLE"
    assert "nobody" not in str(err.value)  # no user, host or password in the message
    await db.pool.close()


def test_no_asyncio_outside_the_bridge() -> None:
    """STYLE principle 1: only a bridge module may import asyncio (this one needs none)."""
    import pathlib

    import trio_jobs.drivers.postgres as pkg

    root = pathlib.Path(pkg.__file__).parent
    for path in root.rglob("*.py"):
        text = path.read_text()
        assert "import asyncio" not in text, path
        assert "from asyncio" not in text, path


class BlackHoleProxy:
    """A TCP proxy to the server that forwards the connections it takes while
    open, then takes new ones and never answers (a cancel request sent there
    waits for ever). It lets go of those after ``give_up`` seconds, saying so."""

    def __init__(self, host: str, port: int, give_up: float) -> None:
        self.host, self.server_port, self.give_up = host, port, give_up
        self.port = 0
        self.black_hole = False
        self.swallowed = 0
        self.gave_up = False

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, client: trio.SocketStream) -> None:
        if self.black_hole:
            self.swallowed += 1
            async with client:
                await trio.sleep(self.give_up)
                self.gave_up = True
            return
        server = await trio.open_tcp_stream(self.host, self.server_port)
        async with client, server, trio.open_nursery() as nursery:

            async def pump(src: trio.SocketStream, dst: trio.SocketStream) -> None:
                try:
                    while data := await src.receive_some(65536):
                        await dst.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                nursery.cancel_scope.cancel()

            nursery.start_soon(pump, client, server)
            nursery.start_soon(pump, server, client)


async def test_a_cancel_request_the_server_never_answers_is_bounded_by_the_grace(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Regression (CI on the oldest psycopg): with libpq 16, psycopg-binary's
    # blocking PQcancel ran in a worker thread holding the GIL, so a cancel request
    # nobody answered froze the whole process. With libpq >= 17 (what pyproject's
    # lower bound guarantees) the request is Trio's non-blocking I/O, bounded by
    # the grace like the rest of the cleanup.
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from trio_jobs.drivers.postgres import _bridge

    params = conninfo_to_dict(pg_dsn)
    host = str(params.get("host") or "")
    if not host or host.startswith("/"):
        pytest.skip("the PostgreSQL server is reached over a Unix socket: no TCP to proxy")
    monkeypatch.setattr(_bridge, "CANCEL_GRACE", 1.0)
    proxy = BlackHoleProxy(host, int(params.get("port") or 5432), give_up=30.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.serve)
        dsn = make_conninfo(pg_dsn, host="127.0.0.1", port=proxy.port)
        db = Database(Pool(dsn, max_size=1))
        try:
            assert await db.fetch("SELECT 1") == [(1,)]
            proxy.black_hole = True  # the cancel request goes nowhere from now on
            with trio.move_on_after(0.3) as scope:
                await db.fetch("SELECT pg_sleep(10) /* bridge_black_hole */")
            assert scope.cancelled_caught
            assert proxy.swallowed == 1  # the cancel request was sent...
            assert not proxy.gave_up  # ...and the scope ended while it hung
            assert db.pool.size == 0  # the connection, in an unknown state, is closed
        finally:
            await db.pool.close()
            nursery.cancel_scope.cancel()


# --------------------------------------------------------------------------- the text path


async def _prepared_names(db: Database) -> list[str]:
    rows = await db.fetch("SELECT name FROM pg_prepared_statements ORDER BY name")
    return [r[0] for r in rows]


@pytest.mark.parametrize("prepare", [True, False])
async def test_fetch_text_sends_text_parameters_and_answers_text_columns(
    pg_dsn: str, prepare: bool
) -> None:
    db = Database(Pool(pg_dsn, max_size=1, prepare=prepare))
    try:
        sql = "SELECT $1::int + 1, $2::text, $3::text IS NULL, $4::json ->> 'a'"
        for _ in range(3):
            rows = await db.fetch_text(sql, ["41", "é\u2603", None, '{"a": "b"}'])
            assert rows == [(b"42", "é\u2603".encode(), b"t", b"b")]
        assert await db.fetch_text("SELECT 1 WHERE $1::bool", ["f"]) == []
        # no row set at all (an INSERT without RETURNING) answers no rows
        await db.fetch("CREATE TEMP TABLE t (x int)")
        assert await db.fetch_text("INSERT INTO t VALUES ($1::int)", ["1"]) == []
        assert await db.fetch("SELECT x FROM t") == [(1,)]
    finally:
        await db.pool.close()


async def test_fetch_text_prepares_once_per_session_only_where_the_pool_prepares(
    pg_dsn: str,
) -> None:
    sql = "SELECT $1::int * 2"
    direct = Database(Pool(pg_dsn, max_size=1, prepare=True))
    pooled = Database(Pool(pg_dsn, max_size=1, prepare=False))
    try:
        for _ in range(3):
            assert await direct.fetch_text(sql, ["2"]) == [(b"4",)]
            assert await pooled.fetch_text(sql, ["2"]) == [(b"4",)]
        # one named statement on the direct session, none behind a pooler
        assert [n for n in await _prepared_names(direct) if n.startswith("trio_jobs_")] == [
            statement_name(sql).decode()
        ]
        assert [n for n in await _prepared_names(pooled) if n.startswith("trio_jobs_")] == []
        # a session whose statements were dropped (psycopg itself sends
        # DEALLOCATE ALL when a schema change invalidates its statements)
        # prepares again and answers, with no error
        await direct.fetch("DEALLOCATE ALL")
        assert await direct.fetch_text(sql, ["3"]) == [(b"6",)]
        assert [n for n in await _prepared_names(direct) if n.startswith("trio_jobs_")] == [
            statement_name(sql).decode()
        ]
        # in a transaction the statement goes unnamed: a lost name cannot fail it
        await direct.fetch("DEALLOCATE ALL")
        async with direct.transaction() as tx:
            assert await tx.fetch_text(sql, ["5"]) == [(b"10",)]
        assert [n for n in await _prepared_names(direct) if n.startswith("trio_jobs_")] == []
    finally:
        await direct.pool.close()
        await pooled.pool.close()


async def test_fetch_text_raises_the_statements_error_and_the_connection_stays_usable(
    pg_dsn: str,
) -> None:
    db = Database(Pool(pg_dsn, max_size=1, prepare=True))
    try:
        with pytest.raises(psycopg.errors.DivisionByZero) as err:
            await db.fetch_text("SELECT 1 / $1::int", ["0"])
        assert err.value.sqlstate == "22012"
        with pytest.raises(psycopg.errors.UndefinedTable):
            await db.fetch_text("SELECT * FROM no_such_table_here WHERE $1::int = 1", ["1"])
        assert await db.fetch_text("SELECT 1 / $1::int", ["1"]) == [(b"1",)]
        assert db.pool.size == 1
    finally:
        await db.pool.close()


async def test_cancelling_fetch_text_cancels_the_statement_on_the_server(pg_dsn: str) -> None:
    db = Database(Pool(pg_dsn, max_size=1, prepare=True))
    marker = "bridge_cancel_probe_text"
    try:
        with trio.move_on_after(0.3) as scope:
            await db.fetch_text(f"SELECT pg_sleep($1::float8) /* {marker} */", ["30"])
        assert scope.cancelled_caught
        assert _active_sleeps(pg_dsn, marker) == 0
        assert await db.fetch_text("SELECT $1::int", ["2"]) == [(b"2",)]
        assert db.pool.size == 1
        # a scope cancelled before the call sends nothing
        with trio.CancelScope() as early:
            early.cancel()
            await db.fetch_text(f"SELECT pg_sleep($1::float8) /* {marker} */", ["30"])
        assert early.cancelled_caught
        assert _active_sleeps(pg_dsn, marker) == 0
    finally:
        await db.pool.close()


async def test_fetch_text_in_a_transaction_commits_or_rolls_back_with_it(pg_dsn: str) -> None:
    db = Database(Pool(pg_dsn, max_size=1, prepare=True))
    try:
        await db.fetch("CREATE TABLE IF NOT EXISTS pg_temp.tt (x int)")
        async with db.transaction() as tx:
            assert await tx.fetch_text("INSERT INTO tt VALUES ($1::int) RETURNING x", ["5"]) == [
                (b"5",)
            ]

        async def insert_then_fail() -> None:
            async with db.transaction() as tx:
                await tx.fetch_text("INSERT INTO tt VALUES ($1::int)", ["6"])
                raise RuntimeError("roll back")

        with pytest.raises(RuntimeError):
            await insert_then_fail()
        assert await db.fetch("SELECT x FROM tt") == [(5,)]
    finally:
        await db.pool.close()


@pytest.mark.parametrize("prepare", [True, False])
async def test_fetch_text_sends_a_statement_larger_than_the_socket_takes_at_once(
    pg_dsn: str, prepare: bool
) -> None:
    # 8 MB of parameter: libpq cannot hand it to the socket in one write, so the
    # answer's wait first waits for the socket to take the rest.
    db = Database(Pool(pg_dsn, max_size=1, prepare=prepare))
    big = "é" * (4 * 1024 * 1024)
    try:
        for _ in range(2):
            rows = await db.fetch_text("SELECT length($1::text), md5($1::text)", [big])
            assert rows == [
                (str(len(big)).encode(), hashlib.md5(big.encode()).hexdigest().encode())
            ]
        assert await db.fetch_text("SELECT $1::int", ["3"]) == [(b"3",)]
        assert db.pool.size == 1
    finally:
        await db.pool.close()


async def test_fetch_text_answers_every_row_and_column_of_the_result(pg_dsn: str) -> None:
    db = Database(Pool(pg_dsn, max_size=1, prepare=True))
    try:
        rows = await db.fetch_text(
            "SELECT g, g * $1::int, NULLIF(g % 2, 0)::text FROM generate_series(1, 3) g", ["10"]
        )
        assert rows == [(b"1", b"10", b"1"), (b"2", b"20", None), (b"3", b"30", b"1")]
        # a multi-statement text is refused as psycopg refuses one (one statement a call)
        with pytest.raises(psycopg.errors.SyntaxError):
            await db.fetch_text("SELECT $1::int; SELECT 2", ["1"])
        assert await db.fetch_text("SELECT $1::int", ["4"]) == [(b"4",)]
    finally:
        await db.pool.close()


async def test_an_idle_connection_the_server_ended_is_replaced_before_a_statement(
    pg_dsn: str,
) -> None:
    db = Database(Pool(pg_dsn, max_size=1, prepare=True))
    try:
        pid = (await db.fetch_text("SELECT pg_backend_pid()::text || $1::text", [""]))[0][0]
        with psycopg.connect(pg_dsn, autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s)", (int(pid or b"0"),))
        for _ in range(200):  # the FATAL notice reaches the idle socket
            conn = db.pool._idle[0]
            if conn.idle_poll.poll(0):
                break
            await trio.sleep(0.01)
        # no call fails for it: the acquire sees the readable idle socket
        again = (await db.fetch_text("SELECT pg_backend_pid()::text || $1::text", [""]))[0][0]
        assert again != pid
        assert db.pool.size == 1
    finally:
        await db.pool.close()
