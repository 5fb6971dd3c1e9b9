"""PYTHON-API.md "Data jobs" and Jobs-And-Workflows.md "One person's data" on a
real PostgreSQL, in a throwaway schema per test: the reach walked from
``pg_constraint`` (composite keys, tenants, two paths to one table, a loop
through a nullable key, ``columns=``), every treatment, every refusal of the
spec's table (each before anything is written), the export's objects and
index, the proof's canaries, and ``trio-jobs verify``."""

from __future__ import annotations

import contextlib
import importlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from click.testing import CliRunner

from pg_schemas import throwaway_schema
from trio_jobs import (
    Anonymize,
    ErrorCode,
    Jobs,
    JobsError,
    Retain,
    Worker,
    define_subject,
    memory_driver,
    open_jobs,
    postgres_driver,
    subject_erase,
    subject_export,
    subject_proof,
)
from trio_jobs._subject import PAGE_ROWS, plan_subject
from trio_jobs.cli import main

app = importlib.import_module("subjects.subject_app")
Person = app.Person

SEED = """
INSERT INTO members VALUES (1, 7, 'a@x', 'Ann', NULL), (1, 8, 'b@x', 'Bob', NULL),
    (2, 7, 'c@x', 'Cat', NULL);
INSERT INTO posts VALUES (1, 100, 7, 'ann post'), (1, 101, 8, 'bob post'), (2, 100, 7, 'cat post');
UPDATE members SET pinned_post_id = 101 WHERE tenant_id = 1 AND id = 7;
UPDATE members SET pinned_post_id = 100 WHERE tenant_id = 1 AND id = 8;
INSERT INTO comments (tenant_id, post_id, author_id, body) VALUES
    (1, 100, 8, 'bob on ann'), (1, 101, 7, 'ann on bob'), (2, 100, 7, 'other tenant'),
    (1, NULL, 7, 'ann, no post');
INSERT INTO likes (tenant_id, post_id) VALUES (1, 100), (1, 101);
INSERT INTO invoices (tenant_id, member_id, total) VALUES (1, 7, 10), (1, 8, 20);
INSERT INTO audit_copies (tenant_id, member_id, who) VALUES (1, 7, 'Ann'), (1, 8, 'Bob');
"""

ALL = ["members", "posts", "comments", "likes", "invoices", "audit_copies"]


@pytest.fixture
def dsn() -> Any:
    with throwaway_schema("tj_subj") as schema_dsn:
        yield schema_dsn


@contextlib.asynccontextmanager
async def opened(dsn: str, *jobs_: Any, seed: str = SEED) -> AsyncIterator[Jobs]:
    async with open_jobs(postgres_driver(dsn), jobs=list(jobs_)) as jobs:
        await statements(jobs, app.TABLES + seed)
        yield jobs


async def statements(jobs: Jobs, text: str) -> None:
    async with jobs.transaction() as tx:
        for statement in text.split(";"):
            if statement.strip():
                await tx.execute(statement)


async def dump(jobs: Jobs) -> dict[str, list[tuple[Any, ...]]]:
    async with jobs.transaction() as tx:
        return {t: await tx.execute(f"SELECT * FROM {t} ORDER BY 1, 2") for t in ALL}


async def settle(jobs: Jobs, handle: Any, person: Any) -> Any:
    enq = await handle.enqueue(person)
    worker = Worker(jobs, poll_interval="20ms")
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        with trio.fail_after(60):
            while (view := await jobs.show(enq.id)).state not in ("done", "dead"):  # noqa: ASYNC110
                await trio.sleep(0.02)
        await worker.drain()
    return view


# ---------------------------------------------------------------------------- the erase


async def test_an_erase_walks_the_catalog_children_first_and_spares_other_people(
    dsn: str,
) -> None:
    async with opened(dsn, app.erase_member) as jobs:
        view = await settle(jobs, app.erase_member, Person(1, 7))
        after = await dump(jobs)
    assert view.state == "done", view.last_error
    # the loop members -> posts -> members is broken at the nullable pinned key, first;
    # then children first, the person last
    assert [s.name for s in view.steps] == [
        "clear:members.pinned_post_id:1",
        "delete:comments:1",
        "delete:likes:1",
        "delete:posts:1",
        "anonymize:invoices:1",
        "anonymize:audit_copies:1",
        "delete:members:1",
    ]
    assert view.result["rows"] == 8
    assert view.result["tables"]["comments"] == {"treatment": "delete", "rows": 3}
    # Bob (same tenant) and Cat (same id, other tenant) keep their rows; Bob's
    # pin on Ann's post is cleared; Bob's comment under Ann's post goes with it
    assert after["members"] == [(1, 8, "b@x", "Bob", None), (2, 7, "c@x", "Cat", None)]
    assert after["posts"] == [(1, 101, 8, "bob post"), (2, 100, 7, "cat post")]
    assert [r[4] for r in after["comments"]] == ["other tenant"]
    assert [r[2] for r in after["likes"]] == [101]
    assert after["invoices"] == [(1, 1, None, 10), (2, 1, 8, 20)]  # kept, key cleared
    assert after["audit_copies"] == [(1, 1, 7, "erased"), (2, 1, 8, "Bob")]  # columns=


async def test_a_second_erase_of_the_same_person_changes_nothing(dsn: str) -> None:
    async with opened(dsn, app.erase_member) as jobs:
        await settle(jobs, app.erase_member, Person(1, 7))
        before = await dump(jobs)
        again = subject_erase(
            name="members.erase-again",
            input=Person,
            subject=app.members,
            key=lambda p: (p.tenant_id, p.member_id),
        )
    async with open_jobs(postgres_driver(dsn), jobs=[again]) as jobs:
        view = await settle(jobs, again, Person(1, 7))
        assert view.state == "done"
        assert view.result["rows"] == 0
        assert await dump(jobs) == before


async def test_pages_are_steps_of_page_rows_and_a_retained_table_is_not_walked(
    dsn: str,
) -> None:
    many = PAGE_ROWS * 2 + 3
    seed = SEED + (
        f";INSERT INTO likes (tenant_id, post_id) SELECT 1, 100 FROM generate_series(1, {many})"
    )
    keep_posts = define_subject(
        "members",
        key=("tenant_id", "id"),
        tables={
            "members": Anonymize({"email": "erased@example.invalid", "name": None}),
            "posts": Retain("published work belongs to the org"),
            "comments": "delete",
            "invoices": "delete",
            "audit_copies": "delete",
            # likes: under retained posts only, so not the person's and not reached
        },
        columns={"audit_copies": ("tenant_id", "member_id")},
    )
    erase = subject_erase(
        name="members.keep-posts", input=Person, subject=keep_posts, key=lambda p: (1, p.member_id)
    )
    many_likes = define_subject(
        "members",
        key=("tenant_id", "id"),
        tables={k: v for k, v in app.members.tables.items()},
        columns={"audit_copies": ("tenant_id", "member_id")},
    )
    erase_all = subject_erase(
        name="members.many", input=Person, subject=many_likes, key=lambda p: (1, p.member_id)
    )
    async with opened(dsn, erase, erase_all, seed=seed) as jobs:
        kept = await settle(jobs, erase, Person(1, 7))
        after = await dump(jobs)
        assert kept.state == "done", kept.last_error
        assert "posts" not in {s.name.split(":")[1] for s in kept.steps}
        assert len(after["likes"]) == many + 2  # not reached through a retained post
        assert (1, 7, "erased@example.invalid", None, 101) in after["members"]
        assert kept.result["tables"]["posts"] == {"treatment": "retain", "rows": 0}
        # Bob erased with every table deleted: his post's likes page by page
        view = await settle(jobs, erase_all, Person(1, 8))
    assert view.state == "done", view.last_error
    like_steps = [s.name for s in view.steps if s.name.startswith("delete:likes:")]
    # Ann's post (100) is not Bob's: his post 101 has one like
    assert like_steps == ["delete:likes:1"]
    assert view.result["tables"]["likes"]["rows"] == 1
    async with open_jobs(postgres_driver(dsn), jobs=[erase_all]) as jobs:
        view = await settle(jobs, erase_all, Person(1, 7))
    assert view.state == "done", view.last_error
    assert [s.name for s in view.steps if s.name.startswith("delete:likes:")] == [
        "delete:likes:1",
        "delete:likes:2",
        "delete:likes:3",
    ]
    assert view.result["tables"]["likes"]["rows"] == many + 1


# ---------------------------------------------------------------------------- refusals


def _subject(**tables: Any) -> Any:
    base = dict(app.members.tables)
    for name, t in tables.items():
        if t is None:
            base.pop(name)
        else:
            base[name] = t
    return define_subject(
        "members",
        key=("tenant_id", "id"),
        tables=base,
        columns={"audit_copies": ("tenant_id", "member_id")},
    )


REFUSED = [
    ("undeclared", _subject(likes=None), ErrorCode.X_SUBJECT_TABLE_UNDECLARED, "likes"),
    (
        "unknown column",
        _subject(audit_copies=Anonymize({"nope": 1})),
        ErrorCode.X_SUBJECT_TREATMENT_INVALID,
        "unknown column(s) nope",
    ),
    (
        "null on not null",
        _subject(members=Anonymize({"email": None})),
        ErrorCode.X_SUBJECT_TREATMENT_INVALID,
        "not-null column(s) email",
    ),
    (
        "kept under a deleted parent",
        _subject(comments=Retain("moderation record")),
        ErrorCode.X_SUBJECT_TREATMENT_INVALID,
        "comments keeps rows under",
    ),
    (
        "anonymized but keyed under a deleted parent",
        _subject(invoices=Anonymize({"total": 0})),
        ErrorCode.X_SUBJECT_TREATMENT_INVALID,
        "invoices keeps rows under members",
    ),
    (
        "unknown table",
        _subject(ghosts="delete"),
        ErrorCode.X_SUBJECT_TREATMENT_INVALID,
        "no table ghosts",
    ),
]


@pytest.mark.parametrize(("what", "subject", "code", "says"), REFUSED, ids=[r[0] for r in REFUSED])
async def test_a_refused_erase_deletes_nothing(
    dsn: str, what: str, subject: Any, code: ErrorCode, says: str
) -> None:
    erase = subject_erase(
        name="members.refused",
        input=Person,
        subject=subject,
        key=lambda p: (p.tenant_id, p.member_id),
    )
    async with opened(dsn, erase) as jobs:
        before = await dump(jobs)
        view = await settle(jobs, erase, Person(1, 7))
        after = await dump(jobs)
    assert view.state == "dead"
    assert view.error_code == code
    assert says in view.last_error
    assert view.attempts == 1  # terminal: the same tables give the same answer
    assert view.steps == []
    assert after == before


async def test_a_loop_without_a_nullable_key_is_a_cycle(dsn: str) -> None:
    loop = """
    CREATE TABLE teams (id int PRIMARY KEY, owner_id int NOT NULL);
    CREATE TABLE seats (id int PRIMARY KEY, team_id int NOT NULL REFERENCES teams,
                        member_tenant int NOT NULL, member_id int NOT NULL,
                        FOREIGN KEY (member_tenant, member_id) REFERENCES members (tenant_id, id));
    ALTER TABLE teams ADD FOREIGN KEY (owner_id) REFERENCES seats DEFERRABLE INITIALLY DEFERRED
    """
    subject = _subject(teams="delete", seats="delete")
    async with opened(dsn) as jobs:
        await statements(jobs, loop)
        async with jobs.transaction() as tx:
            plan, faults = await plan_subject(tx.execute, subject)
    assert plan is None
    assert [(f.code, f.table) for f in faults] == [(ErrorCode.X_SUBJECT_CYCLE, "seats")]
    assert "seats -> teams -> seats" in faults[0].message


def test_a_declaration_is_refused_naming_every_fault() -> None:
    with pytest.raises(JobsError) as caught:
        define_subject(
            "members",
            key="",
            tables={"members": Retain("  "), "posts": Anonymize({}), "likes": "keep"},
        )
    assert caught.value.code == ErrorCode.X_SUBJECT_TREATMENT_INVALID
    message = caught.value.message
    for part in ("key must", "Retain needs a reason", "Anonymize names no column", "likes:"):
        assert part in message
    with pytest.raises(JobsError) as caught:
        define_subject("members", key="id", tables={"members": "delete"}, columns={"audit": "m"})
    assert caught.value.code == ErrorCode.X_SUBJECT_TABLE_UNDECLARED
    with pytest.raises(JobsError) as caught:
        subject_erase(name="x", subject="members", key=None, bogus=1)
    assert caught.value.code == ErrorCode.X_JOB_DECLARATION_INVALID
    for part in ("unknown field(s): bogus", "subject= is required", "key= is required"):
        assert part in caught.value.message
    with pytest.raises(JobsError) as caught:
        subject_export(name="x", subject=app.members, key=lambda i: i, format="xml")
    assert caught.value.code == ErrorCode.X_JOB_DECLARATION_INVALID
    for part in ("sink= is required", "prefix= is required", "format must be 'ndjson'"):
        assert part in caught.value.message


async def test_other_drivers_are_refused_with_not_implemented() -> None:
    async with open_jobs(memory_driver(), jobs=[app.erase_member]) as jobs:
        with pytest.raises(JobsError) as caught:
            await subject_proof(jobs, app.members)
        assert caught.value.code == ErrorCode.X_NOT_IMPLEMENTED
        view = await settle(jobs, app.erase_member, Person(1, 7))
    assert view.state == "dead"
    assert view.error_code == ErrorCode.X_NOT_IMPLEMENTED


# ---------------------------------------------------------------------------- export


async def test_an_export_writes_a_part_per_page_per_table_and_an_index(dsn: str) -> None:
    from obstore.store import MemoryStore

    store = MemoryStore()
    keep = define_subject(
        "members",
        key=("tenant_id", "id"),
        tables={
            **app.members.tables,
            "members": Anonymize({"email": "erased@example.invalid", "name": None}),
            "posts": Retain("published work belongs to the org"),
        },
        columns={"audit_copies": ("tenant_id", "member_id")},
    )
    export = subject_export(
        name="members.export",
        input=Person,
        tenant=lambda p: str(p.tenant_id),
        subject=app.members,
        key=lambda p: (p.tenant_id, p.member_id),
        sink=lambda _: store,
        prefix=lambda p: f"t/{p.tenant_id}/subjects/{p.member_id}",
    )
    export_kept = subject_export(
        name="members.export-kept",
        input=Person,
        subject=keep,
        key=lambda p: (p.tenant_id, p.member_id),
        sink=lambda _: store,
        prefix="kept",
    )
    many = PAGE_ROWS + 1
    seed = (
        SEED
        + f";INSERT INTO likes (tenant_id, post_id) SELECT 1, 100 FROM generate_series(2, {many})"
    )
    async with opened(dsn, export, export_kept, seed=seed) as jobs:
        view = await settle(jobs, export, Person(1, 7))
        kept = await settle(jobs, export_kept, Person(1, 7))
    assert view.state == "done", view.last_error
    base = "t/1/subjects/7"
    assert view.result == {
        "tables": 6,
        "rows": 1 + 1 + 3 + many + 1 + 1,
        "index": f"{base}/index.json",
    }

    def read(path: str) -> bytes:
        import obstore

        return bytes(obstore.get(store, path).bytes())

    index = json.loads(read(f"{base}/index.json"))
    assert index["subject"] == "members"
    tables = {t["table"]: t for t in index["tables"]}
    assert tables["likes"]["parts"] == [
        f"{base}/likes/part-00001.ndjson",
        f"{base}/likes/part-00002.ndjson",
    ]
    assert tables["likes"]["rows"] == many
    assert tables["invoices"]["treatment"] == "anonymize"
    members = [
        orjson.loads(line) for line in read(f"{base}/members/part-00001.ndjson").splitlines()
    ]
    assert members == [
        {"tenant_id": 1, "id": 7, "email": "a@x", "name": "Ann", "pinned_post_id": 101}
    ]
    bodies = sorted(
        orjson.loads(line)["body"]
        for line in read(f"{base}/comments/part-00001.ndjson").splitlines()
    )
    assert bodies == ["ann on bob", "ann, no post", "bob on ann"]
    # a retained table is exported with its reason, and the walk stops at it
    kept_index = json.loads(read("kept/index.json"))
    kept_tables = {t["table"]: t for t in kept_index["tables"]}
    assert kept_tables["posts"]["reason"] == "published work belongs to the org"
    assert kept.state == "done", kept.last_error
    assert "likes" not in kept_tables


# ---------------------------------------------------------------------------- proof


async def test_the_proof_passes_a_subject_that_erases_and_names_a_surviving_column(
    dsn: str,
) -> None:
    async with opened(dsn) as jobs:
        await subject_proof(jobs, app.members)
        leaky = _subject(members=Anonymize({"email": "erased@example.invalid"}))
        with pytest.raises(JobsError) as caught:
            await subject_proof(jobs, leaky)
        # a trigger copies a comment's body where no key reaches it
        async with jobs.transaction() as tx:
            await tx.execute("CREATE TABLE shadow (body text)")
            await tx.execute(
                "CREATE FUNCTION copy_body() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN INSERT INTO shadow VALUES (NEW.body); RETURN NEW; END $$"
            )
            await tx.execute(
                "CREATE TRIGGER copy AFTER INSERT ON comments "
                "FOR EACH ROW EXECUTE FUNCTION copy_body()"
            )
        with pytest.raises(JobsError) as shadowed:
            await subject_proof(jobs, app.members)
        after = await dump(jobs)
        async with jobs.transaction() as tx:
            shadow_rows = await tx.execute("SELECT count(*) FROM shadow")
    assert caught.value.code == ErrorCode.X_SUBJECT_ERASE_INCOMPLETE
    assert caught.value.meta["found"] == [{"table": "members", "column": "name"}]
    assert "members.name" in caught.value.message
    assert shadowed.value.meta["found"] == [{"table": "shadow", "column": "body"}]
    # the proof rolls back what it seeded
    assert len(after["members"]) == 3
    assert len(after["comments"]) == 4
    assert shadow_rows == [(0,)]


# ---------------------------------------------------------------------------- verify


def test_verify_reports_each_undeclared_table(dsn: str, tmp_path: Path, monkeypatch: Any) -> None:
    async def make() -> None:
        async with opened(dsn) as jobs:
            await statements(
                jobs,
                "CREATE TABLE follows (tenant_id int, member_id int, "
                "FOREIGN KEY (tenant_id, member_id) REFERENCES members (tenant_id, id))",
            )

    trio.run(make)
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    out = CliRunner().invoke(main, ["verify", "subjects.subject_app", "--database-url", dsn])
    assert out.exit_code == 1, out.output
    assert "X_SUBJECT_TABLE_UNDECLARED follows" in out.output
    js = CliRunner().invoke(
        main, ["verify", "subjects.subject_app", "--json", "--database-url", dsn]
    )
    body = orjson.loads(js.output)
    assert body["ok"] is False
    [subject] = body["subjects"]
    assert [f["code"] for f in subject["faults"]] == ["X_SUBJECT_TABLE_UNDECLARED"]

    async def drop() -> None:
        async with open_jobs(postgres_driver(dsn)) as jobs:
            await statements(jobs, "DROP TABLE follows")

    trio.run(drop)
    ok = CliRunner().invoke(main, ["verify", "subjects.subject_app", "--database-url", dsn])
    assert ok.exit_code == 0, ok.output
    assert "subject members: ok, 6 table(s) reached" in ok.output
    bad = CliRunner().invoke(main, ["verify", "no_such_module_x", "--database-url", dsn])
    assert bad.exit_code != 0
    assert "X_CONFIG_INVALID" in bad.output
