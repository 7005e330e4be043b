"""Builds the FastAPI app: settings, a lifespan that loads the engine once, middleware, routers."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.routing import Mount

from app import __version__
from app.api.body_limit import BodySizeLimitMiddleware
from app.api.cors import ErrorShapedCORSMiddleware
from app.api.deployment_schema import deployment_openapi
from app.api.deps import unauthenticated
from app.api.errors import install_error_handlers
from app.api.head import HeadAsGetMiddleware
from app.api.metrics_middleware import MetricsMiddleware
from app.api.native import routes as native_routes
from app.api.openai import routes as openai_routes
from app.api.ops import routes as ops_routes
from app.api.playground import routes as playground_routes
from app.api.request_id import RequestIdMiddleware
from app.api.swagger import routes as swagger_routes
from app.serving.metrics import ServiceMetrics
from app.serving.runtime import Runtime
from app.settings import Settings

logger = logging.getLogger(__name__)


def create_app(settings: Settings | None = None, on_fatal: Callable[[str], None] | None = None) -> FastAPI:
    """The app; the model loads in the background after start-up (`/ready` says when it is done).

    `on_fatal` is called with the reason if loading fails (the CLI uses it to exit non-zero).
    """
    settings = settings or Settings()
    metrics = ServiceMetrics(rejection_window=settings.rejection_rate_window)
    runtime = Runtime(settings, metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime.start_loading(on_fatal=on_fatal)
        yield
        runtime.shutdown()

    app = FastAPI(
        title="TAD uncertainty-gated generation",
        version=__version__,
        description="Every generation comes with per-token and sequence uncertainty (TAD and baselines) "
        "and an accept/reject decision.",
        lifespan=lifespan,
        # Served by swagger_routes from local assets instead of FastAPI's CDN-backed pages.
        docs_url=None,
        redoc_url=None,
    )
    app.state.runtime = runtime
    app.openapi = deployment_openapi(app, runtime)  # type: ignore[method-assign]
    install_error_handlers(app, unauthenticated)
    app.add_middleware(HeadAsGetMiddleware)  # innermost: routing sees a GET, the outer middlewares a HEAD
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s)
    if settings.cors_origins:
        app.add_middleware(
            ErrorShapedCORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            # Any request header, as vLLM allows: the origins are the guard, and clients add their own
            # (OpenAI's JS SDK its x-stainless-* headers, which a fixed list refused).
            allow_headers=["*"],
            expose_headers=["X-Request-ID", "Retry-After"],
        )
    routers = [
        ops_routes.router,
        native_routes.router,
        openai_routes.router,
        playground_routes.router,
        swagger_routes.router,
    ]
    mounts = [
        Mount(playground_routes.STATIC_PREFIX, app=playground_routes.static_files(), name="playground-static"),
        Mount(swagger_routes.ASSETS_PREFIX, app=swagger_routes.static_files(), name="docs-static"),
    ]
    # FastAPI's own (/openapi.json) and the mounts too: a static file is labelled by its mount, not "unmatched".
    routes = [*app.router.routes, *(route for router in routers for route in router.routes), *mounts]
    app.add_middleware(MetricsMiddleware, metrics=metrics, counter=runtime.track_http, routes=routes)
    app.add_middleware(RequestIdMiddleware)  # outermost of ours: every response carries the id, a 413 included
    for router in routers:
        app.include_router(router)
    app.router.routes.extend(mounts)  # what `app.mount` does, with the Mounts the metrics label by
    return app
