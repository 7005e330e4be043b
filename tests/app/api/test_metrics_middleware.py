"""A request the client abandons before any response is counted as 499, not as a server error; a bug stays a 500."""

from __future__ import annotations

import asyncio
import contextlib

from app.api.asgi import Message, Receive, Scope, Send
from app.api.metrics_middleware import MetricsMiddleware, route_path
from app.serving.metrics import ServiceMetrics

SCOPE: Scope = {"type": "http", "method": "POST", "path": "/v1/generate", "headers": []}


def _count(metrics: ServiceMetrics, status: str) -> float:
    labels = {"route": "unmatched", "status": status}
    return metrics.registry.get_sample_value("tad_requests_total", labels) or 0.0


def _run(app_behaviour: str) -> ServiceMetrics:
    metrics = ServiceMetrics()
    incoming: list[Message] = [
        {"type": "http.request", "body": b'{"prompt":', "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if app_behaviour == "raises":
            raise RuntimeError("a bug after the disconnect")

    async def receive() -> Message:
        return incoming.pop(0)

    async def send(message: Message) -> None:
        raise AssertionError("nothing is sent to a client that left")

    middleware = MetricsMiddleware(app, metrics, counter=lambda _: None)
    with contextlib.suppress(RuntimeError):  # the "raises" app's bug, re-raised by the middleware
        asyncio.run(middleware(SCOPE, receive, send))
    return metrics


def test_a_client_gone_mid_body_is_499() -> None:
    metrics = _run("returns")
    assert _count(metrics, "499") == 1 and _count(metrics, "500") == 0


def test_an_exception_stays_a_500_even_after_the_client_left() -> None:
    metrics = _run("raises")
    assert _count(metrics, "500") == 1 and _count(metrics, "499") == 0


def test_requests_under_a_proxy_prefix_are_tracked_by_the_path_the_app_routes_on() -> None:
    assert route_path({"path": "/tad/v1/generate", "root_path": "/tad"}) == "/v1/generate"
    assert route_path({"path": "/v1/generate", "root_path": ""}) == "/v1/generate"
    assert route_path({"path": "/v1/generate", "root_path": "/tad"}) == "/v1/generate"  # a server that strips it
