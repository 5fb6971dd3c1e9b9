"""``pytest --trio-jobs-check=MODULE``: the gate as one test item per job.

The hooks are re-exported by the project's pytest plugin (``_plugin.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from ..errors import JobsError

__all__ = ["pytest_addoption", "pytest_collection_modifyitems"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("trio-jobs")
    group.addoption(
        "--trio-jobs-check",
        dest="trio_jobs_check",
        default=None,
        metavar="MODULE",
        help="Run `trio-jobs check MODULE` as one test item per job.",
    )
    group.addoption(
        "--trio-jobs-check-examples", dest="trio_jobs_check_examples", type=int, default=20
    )
    group.addoption("--trio-jobs-check-seeds", dest="trio_jobs_check_seeds", type=int, default=100)
    group.addoption(
        "--trio-jobs-check-database-url",
        dest="trio_jobs_check_database_url",
        default=None,
        metavar="DSN",
        help="Run the gate's crash runs on PostgreSQL (as `trio-jobs check --database-url`).",
    )


class CheckFailed(Exception):
    """A job failed the gate; its message is the report's."""


class JobCheckItem(pytest.Item):
    """One job of ``--trio-jobs-check``: passes when the gate passes it."""

    def __init__(self, *, module: Any, job: str, target: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.module = module
        self.job = job
        self.target = target
        #: pytest-trio's trio_mode looks at every item's ``obj``: a plain one here.
        self.obj = self.runtest

    def runtest(self) -> None:
        import trio

        from ..cli._check import reproduce_command
        from ._check import check_jobs

        examples = self.config.getoption("trio_jobs_check_examples")
        seeds = self.config.getoption("trio_jobs_check_seeds")
        dsn = self.config.getoption("trio_jobs_check_database_url")
        driver = None
        if dsn:
            from ..drivers.postgres import postgres_driver

            driver = postgres_driver(dsn)

        async def go() -> Any:
            return await check_jobs(
                self.module,
                job=self.job,
                examples=examples,
                seeds=seeds,
                driver=driver,
                reproduce=lambda name, k, s: reproduce_command(
                    self.target, examples, seeds, False, name, k, s, dsn or None
                ),
            )

        report = trio.run(go)
        if not report.ok:
            lines = []
            for failure in report.jobs[0].failures:
                where = f"seed {failure.seed}" if failure.seed is not None else failure.boundary
                lines.append(
                    f"{failure.code} at {where}, example {failure.example}: {failure.message}"
                )
                lines.append(f"  reproduce: {failure.reproduce}")
            raise CheckFailed("\n".join(lines))

    def repr_failure(self, excinfo: Any, style: Any = None) -> str:
        if isinstance(excinfo.value, CheckFailed | JobsError):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[str, int | None, str]:
        return self.target, None, f"trio-jobs check {self.target} --job {self.job}"


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    target = config.getoption("trio_jobs_check", default=None)
    if not target:
        return
    from ..cli._check import import_module
    from ._check import _plan_of

    try:
        module = import_module(target)
        plan = _plan_of(
            module, observe=None, reset=None, invariant=None, job=None, examples=1, seeds=0,
            example=None, seed=None, reproduce=None,
        )  # fmt: skip
    except JobsError as exc:
        raise pytest.UsageError(f"--trio-jobs-check: {exc.code}: {exc.message}") from None
    for handle in plan.handles:
        items.append(
            JobCheckItem.from_parent(
                session,
                name=f"trio-jobs-check[{handle.name}]",
                module=module,
                job=handle.name,
                target=target,
            )
        )
