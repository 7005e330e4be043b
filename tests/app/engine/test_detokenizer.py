"""Stop strings and the final cut (app/engine/detokenizer.py), on a character-per-token decoder."""

from __future__ import annotations

from collections.abc import Sequence

from app.engine.detokenizer import find_stop_string

ALPHABET = "abcdefghijklmnopqrstuvwxyz ."


def decode(ids: Sequence[int]) -> str:
    return "".join(ALPHABET[i] for i in ids)


def ids(text: str) -> list[int]:
    return [ALPHABET.index(c) for c in text]


def test_a_stop_string_cuts_the_text_and_keeps_the_tokens_before_it() -> None:
    hit = find_stop_string(decode, ids("the end. more"), ["end."])
    assert hit is None  # only text the last token could complete is searched
    hit = find_stop_string(decode, ids("the end."), ["end.", "xyz"])
    assert hit is not None and hit.text_end == 4 and hit.n_kept == 4  # the tokens of "the "


def test_no_stop_string_no_hit() -> None:
    assert find_stop_string(decode, ids("hello world"), ["stop"]) is None
