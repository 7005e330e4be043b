"""The engine's stop set: every special token ends an answer unscored (METHOD.md)."""

from __future__ import annotations

import copy
from dataclasses import replace

from tokenizers import AddedToken

from app.engine.engine import Engine, special_token_ids
from app.engine.loading import LoadedModel


def test_added_tokens_marked_special_stop_generation_like_named_ones(tiny_loaded: LoadedModel) -> None:
    # A GGUF's control tokens (Qwen2.5's <|im_start|>, <|fim_prefix|>) are added tokens marked special that
    # `all_special_ids` does not list.
    tokenizer = copy.deepcopy(tiny_loaded.tokenizer)
    tokenizer.add_tokens([AddedToken("<|control|>", special=True), AddedToken("<|plain|>", special=False)])
    control, plain = tokenizer.convert_tokens_to_ids(["<|control|>", "<|plain|>"])
    assert control not in tokenizer.all_special_ids
    assert control in special_token_ids(tokenizer) and plain not in special_token_ids(tokenizer)
    stops = Engine(replace(tiny_loaded, tokenizer=tokenizer), n_lags=2).context.stop_token_ids
    assert control in stops and plain not in stops
    assert set(tokenizer.all_special_ids) <= stops


def test_a_finished_answers_pieces_join_to_its_text_as_its_stream_sends_them(engine: Engine) -> None:
    from app.engine.sampling import SamplingParams
    from app.engine.sequence import GenerationRequest
    from tests.app.engine.eager_reference import prompts

    request = GenerationRequest(tuple(prompts(engine)[0]), SamplingParams(max_new_tokens=8))
    free = engine.generate([request])[0]
    pieces = engine.answer_pieces(free)
    assert len(pieces) == len(free.kept_tokens) and "".join(pieces) == free.text
    # Cut by a stop string inside a later token: the pieces still join to the cut text.
    stop = free.text.split(" ")[2][:2] if len(free.text.split(" ")) > 2 else free.text[-2:]
    cut_request = GenerationRequest(request.prompt_ids, SamplingParams(max_new_tokens=8, stop=(stop,)))
    cut = engine.generate([cut_request])[0]
    assert cut.text == free.text[: free.text.index(stop)]
    assert "".join(engine.answer_pieces(cut)) == cut.text and len(engine.answer_pieces(cut)) == len(cut.kept_tokens)
