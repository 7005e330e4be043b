"""The playground: the page at `/`, its static files, and the artifact's report PNGs (read-only).

These are a user interface, not API: they stay out of the OpenAPI schema, so the schema
(and the conformance test that fuzzes it) keep describing only the JSON API. The page
calls the API itself (/info, /v1/generate, /v1/score) with the key the user types in.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.responses import FileResponse, HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

from app.api.deps import ApiKeyDep, RuntimeDep
from app.api.playground import STATIC_DIR
from app.api.playground.protocol import ReportFiles
from app.api.range_errors import RangeShapedFileResponse, RangeShapedStaticFiles
from app.errors import ServiceError
from app.serving.runtime import Runtime
from app.uncertainty.artifact import TadArtifact

STATIC_PREFIX = "/playground/static"
REPORT_FOLDER = "report"
# Everything the page loads comes from this origin; inline scripts and styles are refused.
# `blob:` images: report PNGs are fetched with the API key header and shown from blob URLs.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)

# The page's and its assets': `index.html` is reachable under STATIC_PREFIX too, and must not be framed there.
PAGE_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

router = APIRouter(include_in_schema=False)


class ReportFileNotFound(ServiceError):
    status_code = 404
    error_type = "not_found"


class RevalidatedStaticFiles(RangeShapedStaticFiles):
    """Assets a browser revalidates on every load (a 304 while unchanged): after an upgrade, no cached
    module of the old page runs against the new one."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers.update(PAGE_HEADERS)
        return response


def static_files() -> StaticFiles:
    """The page's assets, mounted at STATIC_PREFIX."""
    return RevalidatedStaticFiles(directory=STATIC_DIR)


@cache
def _index_html() -> str:
    return (STATIC_DIR / "index.html").read_text(encoding="utf-8")


@router.get("/", response_class=HTMLResponse)
async def page() -> HTMLResponse:
    return HTMLResponse(_index_html(), headers=PAGE_HEADERS)


def _serving_artifact(runtime: Runtime) -> TadArtifact | None:
    """Read once per request: an artifact reload swaps it."""
    runtime.require_ready()
    return runtime.artifact


def _report_root(artifact: TadArtifact) -> Path:
    return (artifact.path / REPORT_FOLDER).resolve()


def _inside(root: Path, relative: str) -> Path | None:
    """`root/relative` if it is a PNG file inside root once every link and `..` is resolved, else None."""
    try:
        candidate = (root / relative).resolve()
        is_file = candidate.is_file()
    except (OSError, ValueError):  # e.g. an embedded NUL byte, a name too long
        return None
    if not is_file or candidate.suffix != ".png" or not candidate.is_relative_to(root):
        return None
    return candidate


@router.get("/playground/report", response_model=ReportFiles, dependencies=[ApiKeyDep])
async def report_files(runtime: RuntimeDep) -> ReportFiles:
    """The report's PNGs (rejection curves), behind the API key like /info (they describe the artifact)."""
    artifact = _serving_artifact(runtime)
    if artifact is None:
        return ReportFiles(artifact=None, files=[])
    root = _report_root(artifact)
    names = [path.relative_to(root).as_posix() for path in root.rglob("*.png")]
    return ReportFiles(artifact=artifact.name, files=sorted(name for name in names if _inside(root, name)))


@router.get("/playground/report/{path:path}", response_class=FileResponse, dependencies=[ApiKeyDep])
async def report_file(path: str, runtime: RuntimeDep) -> FileResponse:
    """One PNG of the report; anything else (another type, outside the folder, missing) is a 404."""
    artifact = _serving_artifact(runtime)
    found = _inside(_report_root(artifact), path) if artifact is not None else None
    if found is None:
        raise ReportFileNotFound("no such PNG in the artifact's report folder", param="path")
    return RangeShapedFileResponse(
        found, media_type="image/png", headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}
    )
