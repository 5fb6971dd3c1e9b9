"""The dashboard acts as an operator, whoever the mounting app says is acting.

An app may set the ambient actor for each request (``acting_as(user)`` in its
middleware), and a facade call under an actor of an org is confined to that
org's rows. The dashboard is the operator's view: once its ``auth`` hook admits
a request, it sees and acts on every org's rows, so each request runs with no
ambient actor, as the CLI does.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from .._facade import acting_as

__all__ = ["AsOperator"]


class AsOperator:
    """ASGI middleware: run the wrapped app with no ambient actor."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        with acting_as(None):
            await self.app(scope, receive, send)
