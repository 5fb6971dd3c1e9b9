"""Walk Trio's task tree: which tasks run under which (the driver lifetime tests)."""

from __future__ import annotations

from collections.abc import Iterator

import trio


def descendants(task: trio.lowlevel.Task) -> Iterator[trio.lowlevel.Task]:
    """Every task started, at any depth, in a nursery ``task`` opened."""
    for nursery in task.child_nurseries:
        for child in nursery.child_tasks:
            yield child
            yield from descendants(child)


def every_task() -> list[trio.lowlevel.Task]:
    """Every task of the run, the system tasks included."""
    root = trio.lowlevel.current_root_task()
    assert root is not None
    return [root, *descendants(root)]


def named(tasks: list[trio.lowlevel.Task], fragment: str) -> list[trio.lowlevel.Task]:
    return [task for task in tasks if fragment in task.name]


def driver_tasks(label: str) -> list[trio.lowlevel.Task]:
    """The ``label`` driver's service tasks and everything under them, anywhere in the run."""
    services = named(every_task(), f"trio_jobs.{label}.service")
    return [*services, *(t for s in services for t in descendants(s))]
