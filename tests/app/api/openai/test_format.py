"""The OpenAI response formatter's pure parts."""

from __future__ import annotations

import pytest

from app.api.openai.format import completion_token, completion_top, text_offsets


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


# byte-level pieces of "’" (e2 80 99) and "😀" (f0 9f 98 80) split over tokens, and a whole word
PIECES = {1: b"\xe2\x80", 2: b"\x99", 3: b"\xf0\x9f", 4: b" \xe2", 5: b"ok", 6: b"\\\xe2", 7: b"\xe2\x80"}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"ok", "ok"),
        (b"\xe2\x80\x99", "\N{RIGHT SINGLE QUOTATION MARK}"),
        (b"\xe2\x80", "bytes:\\xe2\\x80"),
        (b" \xe2", "bytes: \\xe2"),
        (b"\\\xe2", "bytes:\\x5c\\xe2"),  # a backslash escaped too, so that the name reads back one way
    ],
)
def test_a_completion_token_that_is_part_of_a_character_is_named_by_its_bytes(raw: bytes, expected: str) -> None:
    assert completion_token(raw) == expected


def test_completion_top_logprobs_keep_partial_tokens_apart_and_the_sampled_ones_value() -> None:
    top = completion_top(PIECES.__getitem__, 2, -2.0, ((1, -0.1), (3, -1.0), (2, -2.0), (4, -3.0)))
    assert top == {"bytes:\\xe2\\x80": -0.1, "bytes:\\xf0\\x9f": -1.0, "bytes:\\x99": -2.0, "bytes: \\xe2": -3.0}


def test_two_tokens_of_one_name_keep_the_likelier_and_the_sampled_token_its_own_logprob() -> None:
    assert completion_top(PIECES.__getitem__, 5, -4.0, ((1, -0.1), (7, -0.5))) == {"bytes:\\xe2\\x80": -0.1, "ok": -4.0}
    assert completion_top(PIECES.__getitem__, 7, -0.5, ((1, -0.1), (7, -0.5))) == {"bytes:\\xe2\\x80": -0.5}
