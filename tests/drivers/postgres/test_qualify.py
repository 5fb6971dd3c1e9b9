"""``_sql.qualify``: a lone statement names its schema itself (no search_path
behind a pooler). Pure text: every shipped query, and the edges of the lexing."""

from __future__ import annotations

import re

import pytest

from trio_jobs.drivers.postgres import _driver
from trio_jobs.drivers.postgres._sql import load_queries, qualify
from trio_jobs.errors import JobsError


def test_names_strings_comments_and_quoted_names() -> None:
    sql = (
        "SELECT nextval('trio_jobs_claim_seq'), j.trio_jobs_x -- it's trio_jobs_jobs\n"
        "FROM trio_jobs_jobs j JOIN other.trio_jobs_steps s ON true\n"
        "WHERE current_schema() = 'trio_jobs.migrate:' AND \"trio_jobs_q\" = 'trio_jobs_jobs x'"
    )
    assert qualify(sql, 'a"b') == (
        'SELECT nextval(\'"a""b".trio_jobs_claim_seq\'), j.trio_jobs_x -- it\'s trio_jobs_jobs\n'
        'FROM "a""b".trio_jobs_jobs j JOIN other.trio_jobs_steps s ON true\n'
        "WHERE 'a\"b'::name = 'trio_jobs.migrate:' AND \"trio_jobs_q\" = 'trio_jobs_jobs x'"
    )


def test_a_quote_in_the_schema_name_stays_inside_its_literal() -> None:
    assert qualify("SELECT current_schema(), to_regclass('trio_jobs_jobs')", "o'k") == (
        "SELECT 'o''k'::name, to_regclass('\"o''k\".trio_jobs_jobs')"
    )


@pytest.mark.parametrize("name", sorted(load_queries()))
def test_every_shipped_query_names_no_object_unqualified(name: str) -> None:
    out = qualify(load_queries()[name], "s")
    # Outside comments, every trio_jobs_ object is now "s".trio_jobs_...
    code = re.sub(r"--[^\n]*", "", out)
    code = re.sub(r"'(?:[^']|'')*'", "''", code)
    for match in re.finditer(r"(?<![\w.$])trio_jobs_[a-z0-9_]+", code):
        pytest.fail(f"{name}: {match.group(0)} left unqualified")
    assert "current_schema()" not in code


def test_a_search_path_in_the_options_is_lifted_out() -> None:
    dsn, schema = _driver.lift_search_path(
        "host=h dbname=d options='-c statement_timeout=5s -c search_path=tj_1'"
    )
    assert schema == "tj_1"
    assert "search_path" not in dsn
    assert "statement_timeout=5s" in dsn
    assert _driver.lift_search_path("host=h dbname=d") == ("host=h dbname=d", None)
    with pytest.raises(JobsError) as caught:
        _driver.lift_search_path("host=h options='-c search_path=a,public'")
    assert caught.value.code == "X_CONFIG_INVALID"
