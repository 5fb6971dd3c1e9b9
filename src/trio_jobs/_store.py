"""The seam to object storage: obstore's sync API, run in a worker thread.

obstore (``obstore.store.LocalStore``, ``S3Store``, ``GCSStore``, ``AzureStore``,
``MemoryStore``) speaks a sync API and an asyncio one; Trio takes the sync one
through :func:`trio.to_thread.run_sync` (obstore releases the GIL while it
waits on the network or the disk), so a read or a write never blocks the event
loop. obstore is imported here only, and only when a data job runs: ``import
trio_jobs`` stays light, and the ``data`` extra is needed only by an app that
declares one.

Only this module knows obstore's names (``get``, ``head``, ``put``, the
``meta`` keys ``size`` and ``e_tag``, ``FileNotFoundError`` for a missing
object); ``tests/dataio/test_store_seam.py`` pins them.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import trio

from .errors import ErrorCode, JobsError

__all__ = ["ObjectMeta", "get_range", "head", "load_obstore", "put"]


@attrs.frozen
class ObjectMeta:
    """What a page compares to know it reads the object page 1 read."""

    size: int
    etag: str | None


def load_obstore() -> Any:
    """obstore, imported on first use; its absence says which extra to install."""
    try:
        import obstore
    except ImportError:  # pragma: no cover - the test extra installs it
        raise JobsError(
            ErrorCode.X_CONFIG_INVALID,
            "import_rows/export_rows need obstore: pip install 'trio-jobs[data]'",
        ) from None
    return obstore


def _meta(raw: Any) -> ObjectMeta:
    etag = raw.get("e_tag")
    return ObjectMeta(int(raw["size"]), None if etag is None else str(etag))


def _missing(key: str) -> JobsError:
    return JobsError(
        ErrorCode.X_IMPORT_SOURCE_MISSING,
        f"the object {key!r} is not in the source store: upload it (or fix key=) "
        "and enqueue the import again",
        meta={"key": key},
    )


_T = TypeVar("_T")

#: Set by the seeded simulation (one Trio run on virtual time whose arbiter acts
#: whenever no task is runnable): a call in a worker thread is invisible to the
#: arbiter, which may act or stop while the thread still runs, and the run then
#: waited for ever (seen as an intermittent hang of ``trio-jobs check`` on an
#: import). Under the simulation a store call runs inline: it is local, and the
#: run is single-threaded anyway.
INLINE: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "trio_jobs_store_inline", default=False
)


async def _off_loop(fn: Callable[..., _T], *args: Any) -> _T:
    """``fn(*args)`` in a worker thread (inline under the simulation: :data:`INLINE`)."""
    if INLINE.get():
        return fn(*args)
    return await trio.to_thread.run_sync(fn, *args)


async def head(store: Any, key: str) -> ObjectMeta:
    """The object's size and etag; a missing object is ``X_IMPORT_SOURCE_MISSING``."""
    obstore = load_obstore()
    try:
        raw = await _off_loop(obstore.head, store, key)
    except FileNotFoundError:
        raise _missing(key) from None
    return _meta(raw)


async def get_range(store: Any, key: str, start: int, end: int) -> tuple[bytes, ObjectMeta]:
    """Bytes ``start .. end`` (clamped to the object's end) and the meta of the
    object they came from, in one request (so the two cannot disagree)."""
    obstore = load_obstore()

    def read() -> tuple[bytes, Any]:
        got = obstore.get(store, key, options={"range": (start, end)})
        return bytes(got.bytes()), got.meta

    try:
        data, raw = await _off_loop(read)
    except FileNotFoundError:
        raise _missing(key) from None
    except Exception as exc:
        if type(exc).__module__.startswith("obstore"):
            # A range the object no longer holds (it shrank): head tells which fault.
            now = await head(store, key)
            if now.size <= start:
                raise JobsError(
                    ErrorCode.X_IMPORT_SOURCE_CHANGED,
                    f"the object {key!r} is shorter than where this page starts: it "
                    "changed during the import; upload the new file under a new key "
                    "and import that",
                    meta={"key": key, "offset": start},
                ) from None
        raise
    return data, _meta(raw)


async def put(store: Any, key: str, data: bytes) -> None:
    """Write ``data`` as the object ``key`` (a second write replaces it whole)."""
    obstore = load_obstore()
    await _off_loop(obstore.put, store, key, data)
