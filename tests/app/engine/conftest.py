from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, PreTrainedModel


@pytest.fixture(scope="session")
def eager_model(tiny_model_dir: Path) -> PreTrainedModel:
    """The same weights with transformers' eager attention: the reference for attention weights."""
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="eager").eval()
