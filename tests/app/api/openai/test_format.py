"""The OpenAI response formatter's pure parts."""

from __future__ import annotations

import pytest

from app.api.openai.format import text_offsets


@pytest.mark.parametrize(
    ("pieces", "expected"),
    [
        (["Paris", " is", " nice"], [0, 5, 8]),
        # the tokens of a character split over several: the first ones send nothing, all start where it does
        (["a", "", "", "\N{GRINNING FACE}", "!"], [0, 1, 1, 1, 2]),
        ([], []),
    ],
)
def test_each_token_starts_after_the_text_streamed_before_it(pieces: list[str], expected: list[int]) -> None:
    assert text_offsets(pieces) == expected
