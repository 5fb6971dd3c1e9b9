"""``trio-jobs verify MODULE``: every subject the module declares, walked from
the database's catalog; each reached table without a treatment, each refused
treatment and each loop with no nullable key is reported with its code."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click

from .._subject import Subject, SubjectFault, plan_subject
from ._check import import_module
from ._common import common_options, guarded
from ._operate import _echo_json, _operate

if TYPE_CHECKING:
    from .._facade import Jobs

__all__ = ["subjects_of", "verify"]

#: A subject is refused: its erase would be refused before its first write.
EXIT_FAULTS = 1


def subjects_of(module: Any) -> list[Subject]:
    """The subjects at the module's top level: ``define_subject`` values, and
    those a ``subject_erase`` / ``subject_export`` job holds (each once)."""
    found: dict[int, Subject] = {}
    for value in vars(module).values():
        subject = value if isinstance(value, Subject) else getattr(value, "subject", None)
        if isinstance(subject, Subject):
            found.setdefault(id(subject), subject)
    return list(found.values())


@click.command("verify")
@click.argument("module")
@common_options
@guarded
def verify(module: str, as_json: bool, database_url: str | None) -> None:
    """Check every subject MODULE declares (define_subject, subject_erase,
    subject_export) against the database: walk the foreign keys from each
    person's table and report every reached table without a treatment
    (X_SUBJECT_TABLE_UNDECLARED), every treatment the tables refuse
    (X_SUBJECT_TREATMENT_INVALID) and every loop of deleted tables with no
    nullable key (X_SUBJECT_CYCLE). Exit 0 when all hold, 1 when any fault is
    found: the erase would refuse it before deleting anything."""
    subjects = subjects_of(import_module(module))  # a refusal exits 1 with its code

    async def go(jobs: Jobs) -> list[tuple[Subject, list[str], list[SubjectFault]]]:
        out = []
        for subject in subjects:
            async with jobs.transaction() as tx:
                plan, faults = await plan_subject(tx.execute, subject)
            out.append((subject, [t for t, _ in plan.tables] if plan else [], faults))
        return out

    checked = _operate(go, database_url, as_json)
    bad = any(faults for _s, _t, faults in checked)
    if as_json:
        _echo_json(
            {
                "ok": not bad,
                "subjects": [
                    {
                        "table": s.table,
                        "reached": tables,
                        "faults": [
                            {"code": str(f.code), "table": f.table, "message": f.message}
                            for f in faults
                        ],
                    }
                    for s, tables, faults in checked
                ],
            }
        )
    else:
        if not checked:
            click.echo(f"{module} declares no subject (define_subject): nothing to verify")
        for s, tables, faults in checked:
            if faults:
                click.echo(f"subject {s.table}: {len(faults)} fault(s)")
                for f in faults:
                    click.echo(f"  {f.code} {f.table}: {f.message}")
            else:
                click.echo(
                    f"subject {s.table}: ok, {len(tables)} table(s) reached, each with a "
                    f"treatment ({', '.join(tables)})"
                )
    if bad:
        sys.exit(EXIT_FAULTS)
