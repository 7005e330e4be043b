"""The OpenAI response formatter's pure parts."""

from __future__ import annotations

import pytest

from app.api.openai.format import text_offsets

EMOJI = "\N{GRINNING FACE}".encode()  # 4 bytes
TWO_EMOJI = "\N{GRINNING FACE}" * 2 + "!"


@pytest.mark.parametrize(
    ("tokens", "text", "expected"),
    [
        # byte-level BPE: the tokens' texts are the text
        ([b"Paris", b" is", b" nice"], "Paris is nice", [0, 5, 8]),
        # SentencePiece with a Strip decoder: the first token's space is not in the text
        ([b" Paris", b" is", b" nice"], "Paris is nice", [0, 5, 8]),
        # an answer that itself starts with a space keeps it
        ([b" Paris", b" is"], " Paris is", [0, 6]),
        # cut at a stop string inside the last token
        ([b" Paris", b" is", b".\n"], "Paris is.", [0, 5, 8]),
        # characters split over tokens: the tokens of one character share its offset, as when streamed
        ([EMOJI[:1], EMOJI[1:3], EMOJI[3:], EMOJI[:2], EMOJI[2:], b"!"], TWO_EMOJI, [0, 0, 0, 1, 1, 2]),
        # a character left incomplete at the end shows as U+FFFD; no offset points past the text
        ([b"a", EMOJI[:2]], "a\ufffd", [0, 1]),
        # invalid bytes: their U+FFFD counts once a character follows, as the stream sends them
        ([b"\x0e", b"\xb2", b"\xcb", b"A", b"B"], "\x0e\ufffd\ufffdAB", [0, 1, 1, 1, 4]),
        ([], "", []),
    ],
)
def test_offsets_count_from_the_text_the_client_gets(tokens: list[bytes], text: str, expected: list[int]) -> None:
    assert text_offsets(tokens, text) == expected
