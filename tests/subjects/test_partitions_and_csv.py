"""Jobs-And-Workflows.md "One person's data" over partitioned tables, and the
csv form of ``subject_export``, on a real PostgreSQL.

A partitioned table is reached through its own foreign keys (the parent's,
not the partitions' clones) and paged per row by ``(tableoid, ctid)``: a
``ctid`` alone names a row in every partition, so a page that named rows by it
would touch other people's rows at the same place in another partition. The
seed lays the two people out so that each one's rows sit exactly where the
other's sit in the other partition."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import orjson
import pytest

from pg_schemas import throwaway_schema
from subjects.test_subjects import SEED, Person, app, dump, opened, settle
from trio_jobs import (
    Anonymize,
    Retain,
    define_subject,
    subject_erase,
    subject_export,
    subject_proof,
)
from trio_jobs._subject import PAGE_ROWS

EACH = PAGE_ROWS + 100  # a person's events: two pages

PARTITIONED = f"""
CREATE TABLE events (
    id int NOT NULL, tenant_id int NOT NULL, member_id int NOT NULL, body text,
    PRIMARY KEY (id),
    FOREIGN KEY (tenant_id, member_id) REFERENCES members (tenant_id, id)
) PARTITION BY RANGE (id);
CREATE TABLE events_low PARTITION OF events FOR VALUES FROM (0) TO (100000);
CREATE TABLE events_high PARTITION OF events FOR VALUES FROM (100000) TO (200000);
CREATE TABLE audit_parts (
    id int NOT NULL, tenant_id int, member_id int, who text
) PARTITION BY LIST (tenant_id);
CREATE TABLE audit_parts_1 PARTITION OF audit_parts FOR VALUES IN (1);
CREATE TABLE audit_parts_2 PARTITION OF audit_parts FOR VALUES IN (2);
-- Ann's (1, 7) rows first in events_low, Bob's (1, 8) first in events_high:
-- each one's ctids are the other's in the other partition.
INSERT INTO events SELECT i, 1, 7, 'ann ' || i FROM generate_series(1, {EACH}) i;
INSERT INTO events SELECT i, 1, 8, 'bob ' || i FROM generate_series({EACH} + 1, 2 * {EACH}) i;
INSERT INTO events SELECT 100000 + i, 1, 8, 'bob ' || i FROM generate_series(1, {EACH}) i;
INSERT INTO events SELECT 100000 + i, 1, 7, 'ann ' || i
    FROM generate_series({EACH} + 1, 2 * {EACH}) i;
CREATE TABLE visits (
    id int NOT NULL, tenant_id int NOT NULL, member_id int NOT NULL,
    FOREIGN KEY (tenant_id, member_id) REFERENCES members (tenant_id, id)
) PARTITION BY RANGE (id);
CREATE TABLE visits_low PARTITION OF visits FOR VALUES FROM (0) TO (100000);
CREATE TABLE visits_high PARTITION OF visits FOR VALUES FROM (100000) TO (200000);
-- Ann's visits share their ctids across the partitions, one row apart (a
-- page of PAGE_ROWS ends between two rows at one ctid).
INSERT INTO visits VALUES (99999, 1, 8);
INSERT INTO visits SELECT i, 1, 7 FROM generate_series(1, {EACH}) i;
INSERT INTO visits SELECT 100000 + i, 1, 7 FROM generate_series(1, {EACH}) i;
INSERT INTO visits SELECT 200 + i, 1, 8 FROM generate_series({EACH}, 2 * {EACH}) i;
INSERT INTO audit_parts VALUES (1, 1, 7, 'Ann'), (2, 1, 8, 'Bob'), (3, 2, 7, 'Cat');
"""


@pytest.fixture
def dsn() -> Any:
    with throwaway_schema("tj_subjp") as schema_dsn:
        yield schema_dsn


def _subject(**over: Any) -> Any:
    return define_subject(
        "members",
        key=("tenant_id", "id"),
        tables={
            **app.members.tables,
            "events": "delete",
            "visits": "delete",
            "audit_parts": Anonymize({"who": "erased"}),
            **over,
        },
        columns={
            "audit_copies": ("tenant_id", "member_id"),
            "audit_parts": ("tenant_id", "member_id"),
        },
    )


async def _events(jobs: Any) -> dict[int, int]:
    async with jobs.transaction() as tx:
        rows = await tx.execute("SELECT member_id, count(*) FROM events GROUP BY 1 ORDER BY 1")
    return {int(m): int(n) for m, n in rows}


async def test_an_erase_pages_a_partitioned_table_by_partition_and_ctid(dsn: str) -> None:
    subject = _subject()
    erase = subject_erase(
        name="members.erase-parts",
        input=Person,
        subject=subject,
        key=lambda p: (p.tenant_id, p.member_id),
    )
    async with opened(dsn, erase, seed=SEED + ";" + PARTITIONED) as jobs:
        assert await _events(jobs) == {7: 2 * EACH, 8: 2 * EACH}
        view = await settle(jobs, erase, Person(1, 7))
        after = await _events(jobs)
        async with jobs.transaction() as tx:
            audit = await tx.execute("SELECT id, who FROM audit_parts ORDER BY id")
    assert view.state == "done", view.last_error
    # every row of Ann's, in both partitions, and not one of Bob's at the same ctids
    assert after == {8: 2 * EACH}
    assert view.result["tables"]["events"] == {"treatment": "delete", "rows": 2 * EACH}
    assert [s.name for s in view.steps if s.name.startswith("delete:events:")] == [
        f"delete:events:{n}" for n in range(1, (2 * EACH) // PAGE_ROWS + 2)
    ]
    assert audit == [(1, "erased"), (2, "Bob"), (3, "Cat")]


async def test_an_export_pages_a_partitioned_table_each_row_once(dsn: str) -> None:
    from obstore.store import MemoryStore

    store = MemoryStore()
    export = subject_export(
        name="members.export-parts",
        input=Person,
        subject=_subject(),
        key=lambda p: (p.tenant_id, p.member_id),
        sink=lambda _: store,
        prefix="parts",
    )
    async with opened(dsn, export, seed=SEED + ";" + PARTITIONED) as jobs:
        view = await settle(jobs, export, Person(1, 7))
    assert view.state == "done", view.last_error
    import obstore

    index = json.loads(bytes(obstore.get(store, "parts/index.json").bytes()))
    events = {t["table"]: t for t in index["tables"]}["events"]
    assert events["rows"] == 2 * EACH
    ids = [
        orjson.loads(line)["id"]
        for part in events["parts"]
        for line in bytes(obstore.get(store, part).bytes()).splitlines()
    ]
    assert sorted(ids) == [*range(1, EACH + 1), *range(100000 + EACH + 1, 100000 + 2 * EACH + 1)]
    visits = {t["table"]: t for t in index["tables"]}["visits"]
    ids = [
        orjson.loads(line)["id"]
        for part in visits["parts"]
        for line in bytes(obstore.get(store, part).bytes()).splitlines()
    ]
    assert sorted(ids) == [*range(1, EACH + 1), *range(100001, 100000 + EACH + 1)]


async def test_the_proof_reads_a_retained_partitioned_table_as_one_table(dsn: str) -> None:
    async with opened(dsn, seed=SEED + ";" + PARTITIONED) as jobs:
        # a canary kept in a partition of a retained table is the retain's, not a leak
        await subject_proof(jobs, _subject(audit_parts=Retain("legal hold")))
        await subject_proof(jobs, _subject())


async def test_a_csv_export_writes_a_header_and_each_value_as_postgres_text(dsn: str) -> None:
    from obstore.store import MemoryStore

    store = MemoryStore()
    export = subject_export(
        name="members.export-csv",
        input=Person,
        subject=app.members,
        key=lambda p: (p.tenant_id, p.member_id),
        sink=lambda _: store,
        prefix=lambda p: f"csv/{p.member_id}",
        format="csv",
    )
    seed = SEED + ";UPDATE comments SET body = '=HYPERLINK(\"x\")' WHERE body = 'ann on bob'"
    async with opened(dsn, export, seed=seed) as jobs:
        before = await dump(jobs)
        view = await settle(jobs, export, Person(1, 7))
        assert await dump(jobs) == before  # an export writes nothing to the tables
    assert view.state == "done", view.last_error
    import obstore

    def rows(path: str) -> list[list[str]]:
        return list(csv.reader(io.StringIO(bytes(obstore.get(store, path).bytes()).decode())))

    index = json.loads(bytes(obstore.get(store, "csv/7/index.json").bytes()))
    assert index["format"] == "csv"
    parts = {t["table"]: t["parts"] for t in index["tables"]}
    assert parts["members"] == ["csv/7/members/part-00001.csv"]
    assert rows("csv/7/members/part-00001.csv") == [
        ["tenant_id", "id", "email", "name", "pinned_post_id"],
        ["1", "7", "a@x", "Ann", "101"],
    ]
    header, *comments = rows(parts["comments"][0])
    assert header == ["id", "tenant_id", "post_id", "author_id", "body"]
    by_body = {r[4]: r for r in comments}
    assert set(by_body) == {'\'=HYPERLINK("x")', "ann, no post", "bob on ann"}
    assert by_body["ann, no post"][2] == ""  # NULL is an empty cell


async def test_a_subject_export_in_another_format_is_refused_at_declaration() -> None:
    from trio_jobs import ErrorCode, JobsError

    with pytest.raises(JobsError) as caught:
        subject_export(
            name="members.export-xml",
            subject=app.members,
            key=lambda p: p,
            sink=lambda _: None,
            prefix="x",
            format="xml",
        )
    assert caught.value.code == ErrorCode.X_JOB_DECLARATION_INVALID
    assert "format must be 'ndjson'" in caught.value.message
    assert "'csv'" in caught.value.message
