"""The erase a worker subprocess serves in ``test_erase_processes.py``:
``python -m trio_jobs.cli worker subjects.erase_app --database-url DSN``
(``tests/`` on ``PYTHONPATH``; the DSN sets the test's schema as the
search_path). The subject is ``subject_app``'s, over its tables; the test adds a
trigger on ``likes`` that holds the page deleting the like noted ``stop`` until
the test lets it go, so the process can be killed inside a page."""

from __future__ import annotations

from trio_jobs import Retry, subject_erase

from .subject_app import Person, members

erase = subject_erase(
    name="members.erase-killed",
    input=Person,
    tenant=lambda p: str(p.tenant_id),
    subject=members,
    key=lambda p: (p.tenant_id, p.member_id),
    retry=Retry(attempts=3, base="100ms", jitter=False),
)
