"""The API's interactive documentation, Swagger UI at `/docs` and ReDoc at `/redoc`, served whole by
this process.

FastAPI's own pages load their scripts from a CDN, so they stay blank where the service runs without
internet, as it is built to. Their assets here come from the `fastapi-offline` wheel (Swagger UI 5,
which reads the OpenAPI 3.1 schema FastAPI emits), mounted at ASSETS_PREFIX.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from app.api.range_errors import RangeShapedStaticFiles

ASSETS_PREFIX = "/docs/static"
ASSETS_DIR = Path(str(files("fastapi_offline") / "static"))

router = APIRouter(include_in_schema=False)


def static_files() -> StaticFiles:
    """The pages' scripts, stylesheet and icon, mounted at ASSETS_PREFIX."""
    return RangeShapedStaticFiles(directory=ASSETS_DIR)


def _root(request: Request) -> str:
    # Behind a proxy that strips a path prefix (uvicorn --root-path), links must carry it back.
    return request.scope.get("root_path", "").rstrip("/")


@router.get("/docs", response_class=HTMLResponse)
async def swagger_ui(request: Request) -> HTMLResponse:
    root = _root(request)
    return get_swagger_ui_html(
        openapi_url=root + request.app.openapi_url,
        title=f"{request.app.title} - Swagger UI",
        swagger_js_url=f"{root}{ASSETS_PREFIX}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{ASSETS_PREFIX}/swagger-ui.css",
        swagger_favicon_url=f"{root}{ASSETS_PREFIX}/favicon.png",
    )


@router.get("/redoc", response_class=HTMLResponse)
async def redoc(request: Request) -> HTMLResponse:
    root = _root(request)
    return get_redoc_html(
        openapi_url=root + request.app.openapi_url,
        title=f"{request.app.title} - ReDoc",
        redoc_js_url=f"{root}{ASSETS_PREFIX}/redoc.standalone.js",
        redoc_favicon_url=f"{root}{ASSETS_PREFIX}/favicon.png",
        with_google_fonts=False,
    )
