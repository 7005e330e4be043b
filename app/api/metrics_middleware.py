"""Counts HTTP requests by route template and status, and times them, into the service's metrics."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from starlette.routing import BaseRoute, Match

from app.api.asgi import ASGIApp, Message, Receive, Scope, Send
from app.api.errors import CLIENT_CLOSED_REQUEST
from app.serving.metrics import ServiceMetrics


def route_label(scope: Scope, routes: Sequence[BaseRoute] = (), root_path: str | None = None) -> str:
    """The route template that served the request; for one refused before routing (a 413 from the body
    limit) or served by a mount, the template of the first of `routes` its path matches; "unmatched" for
    unknown paths (keeps labels bounded). `root_path`: the request's as it arrived (a mount that served it
    has extended the scope's by its own path)."""
    route = scope.get("route")
    if route is None:
        arrived = scope if root_path is None else {**scope, "root_path": root_path}
        route = next((r for r in routes if r.matches(arrived)[0] is not Match.NONE), None)
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "unmatched"


PREFLIGHT = "preflight"
"""The route label of CORS preflights: counted under the route they ask about, their 200s would dilute its
error ratios (the 429 alert's among them)."""


def is_preflight(scope: Scope) -> bool:
    """A browser's CORS preflight: an OPTIONS request naming the method it asks for."""
    return scope.get("method") == "OPTIONS" and any(
        name == b"access-control-request-method" for name, _ in scope.get("headers", ())
    )


def route_path(scope: Scope) -> str:
    """The path the app routes on: uvicorn's `--root-path` (a proxy's prefix) is part of `scope["path"]`."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


class MetricsMiddleware:
    """Counts requests by route template and status, and times them (streams until their end)."""

    def __init__(
        self,
        app: ASGIApp,
        metrics: ServiceMetrics,
        counter: Callable[[int], None],
        routes: Sequence[BaseRoute] = (),
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.counter = counter
        self.routes = routes  # the app's routes, to label requests refused before routing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = {"code": 500}
        preflight = is_preflight(scope)
        tracked = not preflight and route_path(scope).startswith("/v1/")
        root_path = scope.get("root_path", "")

        responded = False
        disconnected = False

        async def send_wrapper(message: Message) -> None:
            nonlocal responded
            if message["type"] == "http.response.start":
                status["code"] = int(message["status"])
                responded = True
            await send(message)

        async def receive_wrapper() -> Message:
            nonlocal disconnected
            message = await receive()
            if message["type"] == "http.disconnect":
                disconnected = True
            return message

        if tracked:
            self.metrics.in_flight.inc()
            self.counter(+1)
        failed = False
        try:
            await self.app(scope, receive_wrapper, send_wrapper)
        except Exception:
            failed = True
            raise
        finally:
            if not responded and disconnected and not failed:
                # The client left before any response (e.g. mid-body): not a server error to alert on.
                status["code"] = CLIENT_CLOSED_REQUEST
            if tracked:
                self.metrics.in_flight.dec()
                self.counter(-1)
            route = PREFLIGHT if preflight else route_label(scope, self.routes, root_path)
            self.metrics.requests.labels(route=route, status=str(status["code"])).inc()
            self.metrics.latency.labels(route=route).observe(time.perf_counter() - started)
