"""``trio-jobs tasks``, ``pause-task NAME``, ``resume-task NAME``: scheduled
tasks from the command line. No job module is imported: the schedules are
read from the task store, where every scheduler registers its tasks."""

from __future__ import annotations

from typing import Any

import click

from .._facade import Jobs
from .._task import TaskView
from ._args import check_job_name
from ._common import common_options, guarded
from ._operate import _console, _done, _echo_json, _operate, _table, _text

__all__ = ["TASK_COMMANDS", "task_json"]


def task_json(view: TaskView) -> dict[str, Any]:
    """A task view as ``--json`` prints it: instants as ISO 8601 in the task's zone."""
    return {
        "name": view.name,
        "schedule": view.schedule,
        "tz": view.tz,
        "paused": view.paused,
        "last_fire": view.last_fire.isoformat() if view.last_fire is not None else None,
        "next_fire": view.next_fire.isoformat() if view.next_fire is not None else None,
    }


@click.command("tasks")
@common_options
@guarded
def tasks_command(as_json: bool, database_url: str | None) -> None:
    """Scheduled tasks: schedule, zone, paused, last and next fire (every task a
    worker's scheduler registered)."""

    async def go(jobs: Jobs) -> list[TaskView]:
        return await jobs.tasks()

    views = _operate(go, database_url, as_json)
    body = {"tasks": [task_json(v) for v in views]}
    if as_json:
        _echo_json(body)
        return
    if not views:
        click.echo("no scheduled task (a worker registers its tasks when it starts)")
        return
    table = _table(
        f"{len(views)} task(s)",
        ("name", "schedule", "tz", "paused", "last fire", "next fire"),
        whole=("name",),
    )
    for t in body["tasks"]:
        table.add_row(
            _text(t["name"]),
            _text(t["schedule"]),
            _text(t["tz"]),
            _text("yes" if t["paused"] else ""),
            _text(t["last_fire"] or "never"),
            _text(t["next_fire"] or ("paused" if t["paused"] else "")),
        )
    _console().print(table)


def _pause_or_resume(name: str, as_json: bool, database_url: str | None, *, pause: bool) -> None:
    check_job_name(name, "NAME")

    async def go(jobs: Jobs) -> list[TaskView]:
        await (jobs.pause_task(name) if pause else jobs.resume_task(name))
        return await jobs.tasks()

    views = _operate(go, database_url, as_json)
    paused = [v.name for v in views if v.paused]
    action = "pause-task" if pause else "resume-task"
    _done(
        f"{'paused' if pause else 'resumed'} {name}; paused tasks: {', '.join(paused) or 'none'}",
        as_json,
        {"action": action, "task": name, "paused_tasks": paused},
    )


@click.command("pause-task")
@click.argument("name", metavar="NAME")
@common_options
@guarded
def pause_task_command(name: str, as_json: bool, database_url: str | None) -> None:
    """Pause a scheduled task fleet-wide: no occurrence fires until it is resumed.
    An unknown name is X_TASK_NOT_FOUND."""
    _pause_or_resume(name, as_json, database_url, pause=True)


@click.command("resume-task")
@click.argument("name", metavar="NAME")
@common_options
@guarded
def resume_task_command(name: str, as_json: bool, database_url: str | None) -> None:
    """Resume a paused task; its catch_up decides what it missed (latest: the
    most recent occurrence, all: each, none: none more than 60 s late)."""
    _pause_or_resume(name, as_json, database_url, pause=False)


#: Registered on the ``trio-jobs`` group by ``_main``.
TASK_COMMANDS: tuple[click.Command, ...] = (tasks_command, pause_task_command, resume_task_command)
