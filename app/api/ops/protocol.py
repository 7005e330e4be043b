"""Response models of the operational routes (/health, /ready, /info)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class HealthResponse(BaseModel):
    status: Literal["ok"]


class ReadyResponse(BaseModel):
    status: Literal["ready"]
    model: str
    artifact: str | None


class InfoResponse(BaseModel):
    model: dict[str, Any]
    chat_template: bool = Field(description="whether `messages` can be sent (the model has a chat template)")
    architecture: dict[str, Any]  # model_type, whether CI tests it, and a note when it does not
    device: str
    dtype: str
    decode_step: dict[str, Any] = Field(
        description="how a decode step runs: `compiled` (a CUDA graph on CUDA, torch.compile's code on a CPU) over "
        "slots of `slot_length` tokens, or `eager`, with `why_eager`"
    )
    tad_available: bool
    tad_unavailable_reason: str | None
    artifact: dict[str, Any] | None
    policy: dict[str, Any]
    limits: dict[str, Any]
    version: str


class ArtifactReloadResponse(BaseModel):
    artifact: str
    manifest_sha256: str | None
    loaded_at: float  # unix time
