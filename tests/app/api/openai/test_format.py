"""The OpenAI response formatter's pure parts."""

from __future__ import annotations

import pytest

from app.api.openai.format import text_offsets


@pytest.mark.parametrize(
    ("tokens", "text", "expected"),
    [
        # byte-level BPE: the tokens' texts are the text
        (["Paris", " is", " nice"], "Paris is nice", [0, 5, 8]),
        # SentencePiece with a Strip decoder: the first token's space is not in the text
        ([" Paris", " is", " nice"], "Paris is nice", [0, 5, 8]),
        # an answer that itself starts with a space keeps it
        ([" Paris", " is"], " Paris is", [0, 6]),
        # cut at a stop string inside the last token
        ([" Paris", " is", ".\n"], "Paris is.", [0, 5, 8]),
        ([], "", []),
    ],
)
def test_offsets_count_from_the_text_the_client_gets(tokens: list[str], text: str, expected: list[int]) -> None:
    assert text_offsets(tokens, text) == expected
