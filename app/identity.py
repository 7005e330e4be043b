"""The identity of an LLM: what a TAD artifact must match (weights and attention shape)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ModelIdentity(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    source: str
    sha256: str
    num_layers: int
    num_heads: int
    vocab_size: int
