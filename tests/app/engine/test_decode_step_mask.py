"""The one-token step's ready-made attention mask: what transformers would build, and the same generation."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from transformers.masking_utils import create_causal_mask

from app.engine.batch_cache import padding_mask_suffices
from app.engine.decoding import DecodeBatch, run_continuously
from app.engine.engine import Engine
from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest
from tests.app.engine.eager_reference import prompts


def _requests(engine: Engine, lengths: tuple[int, ...]) -> list[GenerationRequest]:
    """The reference prompts in turn (three lengths), each answer `lengths[i]` tokens long at most."""
    texts = prompts(engine)
    return [
        GenerationRequest(tuple(texts[index % len(texts)]), SamplingParams(max_new_tokens=length))
        for index, length in enumerate(lengths)
    ]


def test_the_tiny_llama_takes_the_shortcut(engine: Engine) -> None:
    assert padding_mask_suffices(engine.loaded.model)
    assert engine.context.step_mask_from_padding


def test_the_step_mask_is_what_transformers_builds(engine: Engine) -> None:
    model = engine.loaded.model
    requests = _requests(engine, (6, 6, 6))
    for batch in (DecodeBatch.prefill(engine.context, requests), DecodeBatch.prefill(engine.context, requests[:1])):
        mask = torch.nn.functional.pad(batch.attention_mask, (0, 1), value=1)
        with torch.inference_mode():
            built = create_causal_mask(
                config=model.config,
                inputs_embeds=torch.zeros((mask.shape[0], 1, model.config.hidden_size)),
                attention_mask=mask,
                past_key_values=batch.cache,
                position_ids=batch.positions.view(-1, 1),
            )
        if batch.padded:
            assert built is not None and torch.equal(built, mask[:, None, None, :].bool())
        else:
            assert built is None
    assert DecodeBatch.prefill(engine.context, requests).padded  # the prompts differ in length
    assert not DecodeBatch.prefill(engine.context, requests[:1]).padded


def test_generation_is_the_same_bit_for_bit_with_and_without_it(engine: Engine) -> None:
    """Rows join and leave a running batch (padding comes and goes) in both runs."""
    requests = _requests(engine, (9, 4, 12, 7, 5, 3, 10))
    without = replace(engine.context, step_mask_from_padding=False)
    shortcut = dict(run_continuously(engine.context, requests, max_batch=3))
    built = dict(run_continuously(without, requests, max_batch=3))
    assert shortcut.keys() == built.keys() == set(range(len(requests)))
    for index, sequence in shortcut.items():
        other = built[index]
        assert [t.token_id for t in sequence.tokens] == [t.token_id for t in other.tokens]
        assert [dict(t.stats) for t in sequence.tokens] == [dict(t.stats) for t in other.tokens]
        assert len(sequence.attention_rows) == len(other.attention_rows)
        for a, b in zip(sequence.attention_rows, other.attention_rows, strict=True):
            np.testing.assert_array_equal(a, b)
