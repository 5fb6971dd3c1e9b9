"""The gate over the factories (consumer(), webhook(), import_rows/export_rows,
child jobs on the memory driver): each one's boundaries walked like a plain
job's, a sound app passing and a planted double effect failing at its
boundary. The PostgreSQL-only kinds (step.transaction over the app's tables,
rollup, refresh_view, subject erase/export) are in
tests/cli/test_check_postgres.py."""

from __future__ import annotations

import pytest

from check_apps import (
    children,
    children_double,
    consumer_double,
    consumers,
    dataio,
    dataio_double,
    tasks,
    tasks_double,
    webhooks,
)
from trio_jobs import ErrorCode
from trio_jobs._task import Occurrence
from trio_jobs.testing import check_jobs
from trio_jobs.testing._check import GATE_TASK_TIME, draw_examples


def by_name(report: object) -> dict[str, object]:
    return {j.name: j for j in report.jobs}  # type: ignore[attr-defined]


async def test_a_consumer_passes_with_its_batches_walked() -> None:
    """Its one rolling batch record is the framework's (a replay from the
    committed cursor may find nothing left to batch), and its supervisor (a
    task that fires for ever) bounds each seed to GATE_TASK_TIME."""
    assert GATE_TASK_TIME < 3600
    report = await check_jobs(consumers, seeds=2)
    assert report.ok, report.to_json()
    (streams,) = report.jobs
    assert (streams.examples, streams.seeds) == (2, 2)
    assert streams.boundaries >= 2 * 6  # 7 items in batches of 3: three batches a key


async def test_a_consumer_whose_handle_adds_outside_its_transaction_fails() -> None:
    report = await check_jobs(consumer_double, seeds=0)
    (failure,) = report.jobs[0].failures
    assert failure.code == ErrorCode.X_JOB_CRASH_DIVERGED
    assert failure.boundary == "after-fn:batch"


async def test_child_jobs_pass_and_a_parent_effect_outside_a_step_fails() -> None:
    report = await check_jobs(children, seeds=2)
    assert report.ok, report.to_json()
    ship = by_name(report)["app.ship"]
    assert ship.boundaries > 2 * 9  # type: ignore[attr-defined]  # invoke, gather, a step
    bad = await check_jobs(children_double, seeds=0)
    (failure,) = by_name(bad)["app.ship"].failures  # type: ignore[attr-defined]
    assert failure.code == ErrorCode.X_JOB_CRASH_DIVERGED
    assert failure.boundary == "before-step:ship"


async def test_a_webhook_delivers_to_a_real_receiver_at_every_boundary() -> None:
    webhooks.received.clear()
    report = await check_jobs(webhooks, seeds=2)
    assert report.ok, report.to_json()
    (deliver,) = report.jobs
    assert (deliver.examples, deliver.boundaries) == (2, 2)  # no steps: one boundary each
    assert webhooks.received == {"ev1", "ev2"}  # what the last seed sent


async def test_an_import_and_an_export_pass_and_an_appending_import_fails() -> None:
    report = await check_jobs(dataio, seeds=2)
    assert report.ok, report.to_json()
    assert all(j.boundaries > 4 for j in report.jobs)  # one step a page, several pages
    bad = await check_jobs(dataio_double, seeds=0)
    (failure,) = bad.jobs[0].failures
    assert failure.code == ErrorCode.X_JOB_CRASH_DIVERGED
    assert failure.boundary is not None
    assert failure.boundary.startswith("after-fn:page:")


async def test_a_tasks_occurrences_are_drawn_on_its_schedule_and_walked() -> None:
    drawn = draw_examples(tasks.tick, 5)
    assert len({o.at for o in drawn}) == 5
    assert all(isinstance(o, Occurrence) and o.at.second == 0 for o in drawn)
    hourly = draw_examples(tasks_double.hourly, 3)
    assert all(o.at.minute == 0 for o in hourly)  # on the cron's own minute
    report = await check_jobs(tasks, examples=3, seeds=2)
    assert report.ok, report.to_json()
    assert report.jobs[0].boundaries == 3 * 7  # two steps: before, fn, record each, and the end
    bad = await check_jobs(tasks_double, examples=2, seeds=0)
    (failure,) = bad.jobs[0].failures
    assert failure.code == ErrorCode.X_JOB_CRASH_DIVERGED
    assert failure.boundary == "before-step:done"


@pytest.mark.parametrize("module", [consumers, webhooks, dataio, children, tasks])
async def test_the_seeds_of_each_kind_are_deterministic(module: object) -> None:
    first = await check_jobs(module, seeds=1, job=None)
    again = await check_jobs(module, seeds=1, job=None)
    assert first.to_json() == again.to_json()
