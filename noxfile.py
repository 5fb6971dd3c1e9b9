"""Developer sessions: ``nox -s tests lint typecheck simulation`` before a commit, ``nox -s bench`` for numbers."""

from __future__ import annotations

import nox

nox.options.sessions = ["tests", "lint", "typecheck", "simulation"]
nox.options.reuse_existing_virtualenvs = True


@nox.session
def tests(session: nox.Session) -> None:
    session.install("-e", ".[test]")
    session.run("python", "-m", "pytest", "-n", "auto", "--dist", "loadfile", *session.posargs)


@nox.session
def psycopg_oldest(session: nox.Session) -> None:
    """The PostgreSQL tests on the oldest psycopg pyproject.toml admits (``tests``
    runs the newest) but the ``server_side`` ones, which do not depend on it; CI
    runs both (.ci/run)."""
    import re
    import tomllib

    with open("pyproject.toml", "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    [requirement] = [d for d in deps if re.match(r"psycopg\b", d)]
    found = re.search(r">=\s*([0-9.]+)", requirement)
    assert found, requirement
    oldest = found.group(1)
    session.install("-e", ".[test]", f"psycopg[binary]=={oldest}")
    session.run(
        "python",
        "-m",
        "pytest",
        *("-n", "auto", "--dist", "loadfile", "-m", "not server_side"),
        "tests/drivers/postgres",
        *session.posargs,
    )


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "src", "tests", "simulation")
    session.run("ruff", "format", "--check", "src", "tests", "simulation")


@nox.session
def typecheck(session: nox.Session) -> None:
    session.install("-e", ".[test]", "mypy")
    session.run("mypy")


@nox.session
def simulation(session: nox.Session) -> None:
    session.install("-e", ".[test]")
    session.run("python", "-m", "simulation", "gate", *session.posargs)


@nox.session
def soak(session: nox.Session) -> None:
    """The chaos soak on its own embedded PostgreSQL (about 2 minutes; not in the
    default sessions). Arguments pass through: `nox -s soak -- --seed 7`."""
    session.install("-e", ".[test]")
    session.run("python", "-m", "simulation.soak", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    session.install("-e", ".[test]")
    session.run("python", "-m", "benchmarks", *session.posargs)
