"""What every driver's operator surface shares: the answer to a job id prefix,
and which bulk filters each bulk action refuses (its dry run refuses them alike)."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ErrorCode, JobsError
from ._protocol import PROMOTABLE_STATES, TERMINAL_STATES, BulkAction, BulkFilter

__all__ = ["AMBIGUOUS_SHOWN", "check_bulk_action", "not_found", "resolved_prefix"]

#: How many of the jobs an ambiguous prefix matches its refusal names.
AMBIGUOUS_SHOWN = 5


def not_found() -> JobsError:
    return JobsError(
        ErrorCode.X_JOB_NOT_FOUND,
        "no job has that id; list jobs with `trio-jobs list` to find it",
    )


def resolved_prefix(matches: Sequence[str], total: int) -> str:
    """The one id a prefix matched; ``matches`` are the first ids that did (in id
    order, at least two when ``total`` is two or more), ``total`` how many did."""
    if total == 0 or not matches:
        raise JobsError(
            ErrorCode.X_JOB_NOT_FOUND,
            "no job's id starts with that prefix; `trio-jobs list` prints the ids",
        )
    if total == 1:
        return matches[0]
    shown = list(matches[:AMBIGUOUS_SHOWN])
    more = "at least " if total > len(matches) else ""
    raise JobsError(
        ErrorCode.X_ID_AMBIGUOUS,
        f"that id prefix matches {more}{total} jobs ({', '.join(shown)}"
        f"{', ...' if total > len(shown) else ''}); give more of the id, or all of it",
        meta={"matches": shown},
    )


def check_bulk_action(action: BulkAction, filter: BulkFilter) -> None:
    """The refusal of ``<action>_many(filter)`` that comes before any row is read."""
    if action == "remove":
        if filter.state == "running":
            raise JobsError(
                ErrorCode.X_JOB_NOT_REMOVABLE,
                "running jobs cannot be removed; cancel them first",
            )
    elif action == "requeue":
        if filter.state not in TERMINAL_STATES:
            raise JobsError(
                ErrorCode.X_JOB_NOT_REQUEUEABLE,
                "only done, failed, dead or cancelled jobs can be requeued",
            )
    elif action == "promote":
        if filter.state not in PROMOTABLE_STATES:
            raise JobsError(
                ErrorCode.X_INVARIANT,
                f"promote_many takes state in {PROMOTABLE_STATES}",
            )
    else:
        raise JobsError(
            ErrorCode.X_INVARIANT, "a bulk action is one of 'remove', 'requeue' or 'promote'"
        )
