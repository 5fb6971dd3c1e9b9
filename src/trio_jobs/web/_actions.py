"""The dashboard's actions: each is a POST (its CSRF token already checked) that
calls one member of the facade's operator surface and redirects back, with the
outcome (or the refusal's code) in the query for the page's banner. Each is
logged as ``jobs.dashboard.action``, without a payload value.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import orjson
from starlette.responses import RedirectResponse, Response

from ..errors import ErrorCode, JobsError
from ._templates import href

if TYPE_CHECKING:
    from ._app import Dashboard, Req

__all__ = [
    "bulk",
    "cancel",
    "pause",
    "pause_task",
    "promote",
    "remove",
    "resolve",
    "resume",
    "resume_task",
    "retry",
]

log = logging.getLogger("trio_jobs.web")


async def _act(
    ctx: Req,
    action: str,
    call: Callable[[], Awaitable[Any]],
    *,
    back: str,
    back_query: Mapping[str, Any] | None = None,
    job_id: str | None = None,
    queue: str | None = None,
    done: str | None = None,
    gone: str | None = None,
) -> Response:
    client = ctx.request.client.host if ctx.request.client else None
    code: str | None = None
    try:
        result = await call()
    except JobsError as exc:
        code = str(exc.code)
        result = None
    log.info(
        "jobs.dashboard.action",
        extra={
            "event": "jobs.dashboard.action",
            "action": action,
            "job_id": job_id,
            "queue": queue,
            "client": client,
            "code": code,
        },
    )
    if code is not None:
        target = href(ctx.root, back, {**(back_query or {}), "refused": code})
        return RedirectResponse(target, status_code=303)
    query: dict[str, Any] = {**(back_query or {}), "ok": done or action}
    if hasattr(result, "affected") and hasattr(result, "remaining"):
        query.update(affected=result.affected, remaining=result.remaining)
    return RedirectResponse(href(ctx.root, gone or back, query), status_code=303)


def _job_id(ctx: Req) -> str:
    return str(ctx.request.path_params["job_id"])


async def retry(d: Dashboard, ctx: Req) -> Response:
    """``POST /{id}/retry`` (``from_step``: requeue from that step)."""
    job_id = _job_id(ctx)
    step = ctx.form.get("from_step") or None
    return await _act(
        ctx,
        "retry",
        lambda: d.jobs.requeue(job_id, from_step=step),
        back=f"/{job_id}",
        job_id=job_id,
        done="retried",
    )


async def cancel(d: Dashboard, ctx: Req) -> Response:
    """``POST /{id}/cancel`` with an optional ``reason``."""
    job_id = _job_id(ctx)
    reason = (ctx.form.get("reason") or "").strip() or "cancelled from the dashboard"
    return await _act(
        ctx,
        "cancel",
        lambda: d.jobs.cancel(job_id, reason=reason),
        back=f"/{job_id}",
        job_id=job_id,
        done="cancelled",
    )


async def promote(d: Dashboard, ctx: Req) -> Response:
    """``POST /{id}/promote``: run a delayed job now."""
    job_id = _job_id(ctx)
    return await _act(
        ctx,
        "promote",
        lambda: d.jobs.promote(job_id),
        back=f"/{job_id}",
        job_id=job_id,
        done="promoted",
    )


async def remove(d: Dashboard, ctx: Req) -> Response:
    """``POST /{id}/remove``: delete the job and its steps."""
    job_id = _job_id(ctx)
    return await _act(
        ctx,
        "remove",
        lambda: d.jobs.remove(job_id),
        back=f"/{job_id}",
        job_id=job_id,
        done="removed",
        gone="/jobs",
    )


async def resolve(d: Dashboard, ctx: Req) -> Response:
    """``POST /{id}/resolve-step``: say whether a once step of unknown outcome ran."""
    job_id = _job_id(ctx)
    step = ctx.form.get("step") or ""
    ran = ctx.form.get("ran") == "1"
    text = (ctx.form.get("output") or "").strip()

    async def call() -> None:
        output: Any = None
        if ran and text:
            try:
                output = orjson.loads(text)
            except orjson.JSONDecodeError:
                raise JobsError(ErrorCode.X_INVARIANT, "the step's output must be JSON") from None
        await d.jobs.resolve_step(job_id, step, ran=ran, output=output)

    return await _act(ctx, "resolve-step", call, back=f"/{job_id}", job_id=job_id, done="resolved")


async def pause(d: Dashboard, ctx: Req) -> Response:
    """``POST /queues/pause``: no worker claims from the queue until resumed."""
    queue = ctx.form.get("queue") or ""
    return await _act(
        ctx, "pause", lambda: d.jobs.pause_queue(queue), back="/", queue=queue, done="paused"
    )


async def resume(d: Dashboard, ctx: Req) -> Response:
    """``POST /queues/resume``."""
    queue = ctx.form.get("queue") or ""
    return await _act(
        ctx, "resume", lambda: d.jobs.resume_queue(queue), back="/", queue=queue, done="resumed"
    )


async def pause_task(d: Dashboard, ctx: Req) -> Response:
    """``POST /tasks/pause``: no occurrence of the task fires until resumed."""
    name = ctx.form.get("task") or ""
    return await _act(
        ctx, "pause-task", lambda: d.jobs.pause_task(name), back="/tasks", done="task_paused"
    )


async def resume_task(d: Dashboard, ctx: Req) -> Response:
    """``POST /tasks/resume``: its ``catch_up`` decides what it missed."""
    name = ctx.form.get("task") or ""
    return await _act(
        ctx, "resume-task", lambda: d.jobs.resume_task(name), back="/tasks", done="task_resumed"
    )


async def bulk(d: Dashboard, ctx: Req) -> Response:
    """``POST /bulk``: one bounded ``requeue_many`` / ``remove_many`` /
    ``promote_many`` over the list's filter (at most ``MAX_BULK_ROWS`` rows a
    press; the banner says how many remain)."""
    form = ctx.form
    op = form.get("op", "")
    state = form.get("state") or ""
    queue = form.get("queue") or None
    name = form.get("name") or None
    tenant_id = form.get("tenant_id") or None
    back = "/dead" if form.get("back") == "/dead" else "/jobs"
    calls = {
        "requeue": d.jobs.requeue_many,
        "remove": d.jobs.remove_many,
        "promote": d.jobs.promote_many,
    }
    method = calls.get(op)
    if method is None:
        return RedirectResponse(href(ctx.root, back, {"refused": "X_INVARIANT"}), status_code=303)
    keep = {
        k: v
        for k, v in {"state": state, "queue": queue, "name": name, "tenant_id": tenant_id}.items()
        if v
    }
    if back == "/dead":
        keep.pop("state", None)
    return await _act(
        ctx,
        f"{op}_many",
        lambda: method(state=state, queue=queue, name=name, tenant_id=tenant_id),
        back=back,
        back_query=keep,
        queue=queue,
    )
