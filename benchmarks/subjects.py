"""``python -m benchmarks subjects``: erase one person who reaches 100,000 rows
over 5 tables (member -> posts -> comments -> reactions, posts -> likes), with
``subject_erase`` run by a real worker on PostgreSQL (``$DATABASE_URL``, in a
throwaway schema dropped after).

Prints the wall time of the run (enqueue to done), the rows per second, the
pages (steps), and the statements per page: a page is one
``step.transaction`` holding the page's one statement (a ``DELETE`` of up to
``PAGE_ROWS`` rows found by equality ``IN`` subqueries from the person's key,
answering its count) and the step record's insert, between ``BEGIN`` and
``COMMIT``. The counts are read from ``pg_stat_user_tables`` and the step
records, not assumed."""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Sequence

import attrs
import psycopg
import trio

from trio_jobs import Worker, define_subject, open_jobs, postgres_driver, subject_erase
from trio_jobs._subject import PAGE_ROWS
from trio_jobs.drivers.postgres._driver import conninfo_with_schema

TABLES = """
CREATE TABLE members (id int PRIMARY KEY, email text NOT NULL);
CREATE TABLE posts (id int PRIMARY KEY, author_id int NOT NULL REFERENCES members, title text);
CREATE INDEX ON posts (author_id);
CREATE TABLE comments (id int PRIMARY KEY, post_id int NOT NULL REFERENCES posts, body text);
CREATE INDEX ON comments (post_id);
CREATE TABLE reactions (id int PRIMARY KEY, comment_id int NOT NULL REFERENCES comments, kind text);
CREATE INDEX ON reactions (comment_id);
CREATE TABLE likes (id int PRIMARY KEY, post_id int NOT NULL REFERENCES posts);
CREATE INDEX ON likes (post_id);
"""


def seed(posts: int) -> str:
    """One member; ``posts`` posts; 20 comments and 20 likes a post; the rest
    of 100,000 rows as reactions on the first comments. Plus a second member
    with a post the erase must leave."""
    comments = likes = 20 * posts
    reactions = 100_000 - 1 - posts - comments - likes
    return f"""
    INSERT INTO members VALUES (1, 'a@x'), (2, 'b@x');
    INSERT INTO posts SELECT g, 1, 'p' FROM generate_series(1, {posts}) g;
    INSERT INTO posts VALUES ({posts + 1}, 2, 'other');
    INSERT INTO comments SELECT g, (g - 1) / 20 + 1, 'c' FROM generate_series(1, {comments}) g;
    INSERT INTO likes SELECT g, (g - 1) / 20 + 1 FROM generate_series(1, {likes}) g;
    INSERT INTO reactions SELECT g, (g - 1) % {comments} + 1, 'r'
        FROM generate_series(1, {reactions}) g;
    ANALYZE
    """


@attrs.frozen
class Person:
    id: int


subject = define_subject(
    "members",
    key="id",
    tables={
        "members": "delete",
        "posts": "delete",
        "comments": "delete",
        "reactions": "delete",
        "likes": "delete",
    },
)
erase = subject_erase(name="bench.erase", input=Person, subject=subject, key=lambda p: p.id)


async def run_once(dsn: str) -> tuple[float, int, int, int]:
    async with open_jobs(postgres_driver(dsn), jobs=[erase]) as jobs:
        started = time.perf_counter()
        enq = await erase.enqueue(Person(1))
        worker = Worker(jobs, poll_interval="10ms")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            while (view := await jobs.show(enq.id)).state not in ("done", "dead"):  # noqa: ASYNC110
                await trio.sleep(0.01)
            elapsed = time.perf_counter() - started
            await worker.drain()
        assert view.state == "done", view.last_error
        return elapsed, int(view.result["rows"]), len(view.steps), int(view.result["pages"])


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks subjects")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--posts", type=int, default=1_000)
    options = parser.parse_args(argv)
    base = os.environ.get("DATABASE_URL")
    if not base:
        print("set DATABASE_URL to a PostgreSQL database (a throwaway schema is made there)")
        return 2
    times = []
    for _ in range(options.runs):
        schema = f"bench_subj_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
        try:
            dsn = conninfo_with_schema(base, schema)
            with psycopg.connect(dsn, autocommit=True) as conn:
                for statement in (TABLES + seed(options.posts)).split(";"):
                    if statement.strip():
                        conn.execute(statement)
            elapsed, rows, steps, pages = trio.run(run_once, dsn)
            with psycopg.connect(dsn, autocommit=True) as conn:
                [(deleted,)] = conn.execute(
                    "SELECT sum(n_tup_del) FROM pg_stat_user_tables WHERE schemaname = %s "
                    "AND relname IN ('members','posts','comments','reactions','likes')",
                    (schema,),
                ).fetchall()
                [(left,)] = conn.execute("SELECT count(*) FROM posts").fetchall()
            times.append(elapsed)
            print(
                f"run: {elapsed:.2f} s, {rows:,} rows erased ({rows / elapsed:,.0f} rows/s), "
                f"{pages} pages of up to {PAGE_ROWS} rows = {steps} steps, "
                f"pg_stat n_tup_del {deleted}, other member's posts left {left}"
            )
        finally:
            with psycopg.connect(base, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    times.sort()
    print(
        f"median {times[len(times) // 2]:.2f} s over {len(times)} run(s); per page: BEGIN, "
        "the page's one statement, the step record's insert, COMMIT"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
