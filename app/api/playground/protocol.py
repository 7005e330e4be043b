"""Response models of the playground's read-only routes."""

from __future__ import annotations

from pydantic import BaseModel, Field


class ReportFiles(BaseModel):
    artifact: str | None = Field(description="the serving artifact's name (null without one)")
    files: list[str] = Field(description="PNG files of its report folder, relative paths, sorted")
