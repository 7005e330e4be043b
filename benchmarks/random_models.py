"""Models of real shapes with random weights, for the benchmarks that time what a step costs.

No weights can be downloaded onto a GPU machine, so these models are randomly initialised from a real
model's shape, written inline: Llama-3.1-8B, Qwen2.5-7B and Gemma-2-9B. Random weights change what is
generated, not what a step costs: the engines built here never stop early (no stop ids, no eos). Also an
id tokenizer and a random TAD scorer of any shape, standing in for a trained artifact at the same cost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import cast

import numpy as np
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from app.engine.architectures import check_architecture
from app.engine.engine import Engine
from app.engine.loading import LoadedModel
from app.identity import ModelIdentity
from app.uncertainty.features import Convention, FeatureSpec
from app.uncertainty.tad import AveragedRegressor, Regressor, TadScorer


def llama_3_1_8b() -> PretrainedConfig:
    return LlamaConfig(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=131072,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )


def qwen_2_5_7b() -> PretrainedConfig:
    return Qwen2Config(
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )  # Qwen2 attention has q/k/v biases by construction


def gemma_2_9b() -> PretrainedConfig:
    return Gemma2Config(
        vocab_size=256000,
        hidden_size=3584,
        intermediate_size=14336,
        num_hidden_layers=42,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=256,
        query_pre_attn_scalar=256,
        sliding_window=4096,
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
        max_position_embeddings=8192,
    )


CONFIGS: dict[str, Callable[[], PretrainedConfig]] = {
    "llama": llama_3_1_8b,
    "qwen": qwen_2_5_7b,
    "gemma2": gemma_2_9b,
}


def id_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A word-level tokenizer whose tokens are `t<id>`: only ids matter (the engine decodes answers at the end)."""
    backend = Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="t0", eos_token="t1", pad_token="t1")


def build_model(config: PretrainedConfig, dtype: torch.dtype, device: str, attention: str) -> PreTrainedModel:
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attention)
    model.generation_config.eos_token_id = None  # never stop early: exactly the asked number of tokens
    model.generation_config.pad_token_id = 1
    return model.eval()


def make_engine(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, name: str, n_lags: int, fused: bool = True
) -> Engine:
    config = model.config
    identity = ModelIdentity(
        name=name,
        source="random-init",
        sha256="random-init",
        num_layers=int(config.num_hidden_layers),
        num_heads=int(config.num_attention_heads),
        vocab_size=int(config.vocab_size),
    )
    device = cast(torch.device, model.get_input_embeddings().weight.device)
    loaded = LoadedModel(
        model=model, tokenizer=tokenizer, identity=identity, device=device, architecture=check_architecture(model)
    )
    # The shipped generating convention: no extra 1-token step for the last token's own row.
    engine = Engine(loaded, n_lags=n_lags, allow_fused_kernel=fused, last_row=False)
    engine.context = replace(engine.context, stop_token_ids=frozenset())  # always exactly max_new_tokens
    return engine


def random_tad(num_layers: int, num_heads: int, n_lags: int, stage2: str = "ridge") -> TadScorer:
    """A scorer of the given shape with a random stage 2: `ridge` (linear), `mlp` (two ReLU layers of 256, the
    default artifact's size) or `mlp+ridge` (the two averaged, `AveragedRegressor`)."""
    from benchmarks.scoring import Linear, random_mlp

    spec = FeatureSpec(n_lags=n_lags, num_layers=num_layers, num_heads=num_heads, convention=Convention.GENERATING)
    rng = np.random.default_rng(0)
    linear = Linear(rng.normal(0.0, 1e-3, spec.stage2_size), 0.5)
    regressors: dict[str, Callable[[], Regressor]] = {
        "ridge": lambda: linear,
        "mlp": lambda: random_mlp(spec.stage2_size, 256, rng),
        "mlp+ridge": lambda: AveragedRegressor((linear, random_mlp(spec.stage2_size, 256, rng))),
    }
    return TadScorer(regressor=regressors[stage2](), spec=spec, epsilon=1e-4)
