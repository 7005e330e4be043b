"""Builds the FastAPI app: settings, a lifespan that loads the engine once, middleware, routers."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from app import __version__
from app.api import generation, openai, ops
from app.api.body_limit import BodySizeLimitMiddleware
from app.errors import install_error_handlers
from app.metrics import MetricsMiddleware, ServiceMetrics
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
    )
    app.state.runtime = runtime
    install_error_handlers(app)
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.max_body_bytes)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "X-API-Key"],
        )
    app.add_middleware(MetricsMiddleware, metrics=metrics, counter=runtime.track_http)
    app.include_router(ops.router)
    app.include_router(generation.router)
    app.include_router(openai.router)
    return app
