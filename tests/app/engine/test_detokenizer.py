"""Stop strings and the final cut (app/engine/detokenizer.py), on a character-per-token decoder."""

from __future__ import annotations

from collections.abc import Sequence

from app.engine.detokenizer import StreamDetokenizer, final_text, find_stop_string
from app.engine.sampling import SamplingParams
from app.engine.sequence import FinishReason, GenerationRequest, SequenceState, TokenRecord

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


def decode_bytes(ids: Sequence[int]) -> str:
    """A byte-level decoder: every token one UTF-8 byte, an incomplete character shown as U+FFFD."""
    return bytes(ids).decode("utf-8", errors="replace")


def test_a_stop_string_ending_in_a_character_split_over_tokens_is_found() -> None:
    answer = list("東京はです。".encode())
    for stop in ["で", "はで", "す。"]:
        hits = []
        for n in range(1, len(answer) + 1):  # as generation calls it, once per new token
            if (hit := find_stop_string(decode_bytes, answer[:n], [stop])) is not None:
                hits.append(hit)
                break
        assert hits, stop
        start = "東京はです。".index(stop)
        assert hits[0].text_end == start
        assert decode_bytes(answer[: hits[0].n_kept])[:start] == "東京はです。"[:start]
        assert decode_bytes(answer[: hits[0].n_kept]).rstrip("\ufffd") == "東京はです。"[:start]


def test_a_stream_holds_back_a_stop_string_ending_in_a_split_character() -> None:
    """Tokens sent as they settle never show a stop string whose last character is still incomplete."""
    answer = list("東京はです。".encode())
    request = GenerationRequest(prompt_ids=(0,), params=SamplingParams(stop=("はで",)))
    sequence = SequenceState(request=request, generator=None, wants_rows=False)
    stream = StreamDetokenizer(decode_bytes)
    sent = ""
    for token_id in answer:  # as the decode loop does: the stop string is looked for, then the stream reads
        sequence.tokens.append(TokenRecord(token_id=token_id, stats={}))
        hit = find_stop_string(decode_bytes, [t.token_id for t in sequence.tokens], ["はで"])
        if hit is not None:
            sequence.stop_text_end = hit.text_end
            sequence.finish(FinishReason.STOP, n_kept=hit.n_kept)
            sequence.text, sequence.text_final = final_text(decode_bytes, sequence), True
        sent += "".join(piece for _, piece in stream.ready(sequence, known=len(sequence.tokens)))
        if sequence.finished:
            break
    assert sequence.finished and sequence.text == "東京"
    assert sent == "東京"  # "は" was held back until "で" settled whether the stop string is there


def test_a_replacement_character_the_model_wrote_does_not_keep_the_stop_strings_token() -> None:
    """U+FFFD in the answer itself (an invalid byte, or the character as one token) is text, not a
    character still being completed: the token holding the stop string is not kept."""
    literal = 256  # one token for the three bytes of U+FFFD, as a byte-level vocabulary has it

    def decode_with_literal(ids: Sequence[int]) -> str:
        return b"".join("\ufffd".encode() if i == literal else bytes([i]) for i in ids).decode(errors="replace")

    for answer in ([*b"ok", 0x80, *b"\n"], [*b"ok", literal, *b"\n"]):
        hit = find_stop_string(decode_with_literal, answer, ["\n"])
        assert hit is not None and hit.text_end == 3
        assert hit.n_kept == len(answer) - 1, answer
