"""Which model architectures the attention capture serves, and what the service says about the others.

The capture is an attention function registered with transformers' attention interface
(`app.engine.attention_capture`); a model whose attention layers do not go through that
interface would never call it, so it is refused at start. Architectures in
`TESTED_ARCHITECTURES` are checked in CI on tiny random models against eager attention
(`tests/app/engine/test_architectures.py`); others load with a warning in the log and `/info`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from transformers import PreTrainedModel

logger = logging.getLogger(__name__)

# transformers `model_type` -> what about it the architecture tests exercise.
TESTED_ARCHITECTURES: dict[str, str] = {
    "llama": "grouped-query attention",
    "mistral": "sliding window on every layer",
    "qwen2": "q/k/v bias",
    "qwen3": "q/k RMS norm",
    "gemma2": "attention-logit soft-capping (computed explicitly), alternating sliding window",
    "gemma3_text": "hybrid sliding/full layers, one KV head",
    "phi3": "fused qkv projection",
    "granite": "attention multiplier as the softmax scale",
}


class UnsupportedArchitecture(RuntimeError):
    """The attention capture cannot serve this model."""


@dataclass(frozen=True)
class ArchitectureSupport:
    model_type: str
    tested: bool
    note: str | None  # why it is not in the tested set, for the log and /info

    def as_dict(self) -> dict[str, object]:
        return {"model_type": self.model_type, "tested": self.tested, "note": self.note}


def check_architecture(model: PreTrainedModel) -> ArchitectureSupport:
    """Refuse a model whose attention bypasses the attention interface; warn about untested ones."""
    model_type = str(getattr(model.config, "model_type", "unknown"))
    if not getattr(model, "_supports_attention_backend", False):
        raise UnsupportedArchitecture(
            f"{type(model).__name__} ({model_type}) computes attention inside its own layers instead of "
            "through transformers' attention interface, so TAD's attention capture would never run; "
            f"supported architectures: {', '.join(sorted(TESTED_ARCHITECTURES))}"
        )
    if model_type in TESTED_ARCHITECTURES:
        return ArchitectureSupport(model_type, tested=True, note=None)
    note = (
        f"architecture {model_type!r} is outside the tested set ({', '.join(sorted(TESTED_ARCHITECTURES))}): "
        "its attention goes through the capture, but rows were not checked against eager attention"
    )
    logger.warning(note)
    return ArchitectureSupport(model_type, tested=False, note=note)
