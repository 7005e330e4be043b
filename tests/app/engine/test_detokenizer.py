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


LITERAL_FFFD = 256  # one token for the three bytes of U+FFFD, as a byte-level vocabulary has it


def decode_with_literal(ids: Sequence[int]) -> str:
    return b"".join("\ufffd".encode() if i == LITERAL_FFFD else bytes([i]) for i in ids).decode(errors="replace")


def streamed(answer: list[int], stops: tuple[str, ...] = (), known_lag: int = 0) -> tuple[str, str]:
    """(the stream's pieces joined, the final text) as the decode loop drives it; EOS after `answer`
    unless a stop string ends it first. `known_lag`: tokens whose confidence comes a step late."""
    request = GenerationRequest(prompt_ids=(0,), params=SamplingParams(stop=stops, max_new_tokens=100))
    sequence = SequenceState(request=request, generator=None, wants_rows=False)
    stream = StreamDetokenizer(decode_with_literal)
    sent = ""
    for token_id in answer:
        sequence.tokens.append(TokenRecord(token_id=token_id, stats={}))
        ids_so_far = [t.token_id for t in sequence.tokens]
        if stops and (hit := find_stop_string(decode_with_literal, ids_so_far, list(stops))) is not None:
            sequence.stop_text_end = hit.text_end
            sequence.finish(FinishReason.STOP, n_kept=hit.n_kept)
            break
        sent += "".join(piece for _, piece in stream.ready(sequence, max(0, len(sequence.tokens) - known_lag)))
    if not sequence.finished:
        sequence.finish(FinishReason.STOP)  # the EOS
    sequence.text, sequence.text_final = final_text(decode_with_literal, sequence), True
    sent += "".join(piece for _, piece in stream.ready(sequence, len(sequence.tokens)))
    return sent, sequence.text


def test_an_answer_ending_in_a_replacement_character_streams_it() -> None:
    # Sent at once, a token ending in U+FFFD used to lose it when EOS came next: its piece leaves
    # the U+FFFD to a later token, and there was none.
    for last in (LITERAL_FFFD, 0xB2, 0xE6):  # written by the model, an invalid byte, an incomplete character
        for known_lag in (0, 1):
            sent, text = streamed([*b"ab", last], known_lag=known_lag)
            assert text == "ab\ufffd" and sent == text, (last, known_lag)


def test_a_stop_string_right_after_a_replacement_character_streams_it() -> None:
    sent, text = streamed([*b"f", LITERAL_FFFD, *b"!?"], stops=("!?",))
    assert text == "f\ufffd" and sent == text


def test_a_character_completed_by_a_later_token_is_streamed_once() -> None:
    sent, text = streamed(list("a東b".encode()))
    assert text == "a東b" and sent == text


def test_an_empty_token_where_a_stop_string_then_starts_is_not_streamed() -> None:
    """A token with no text of its own at the stop string's start is dropped with it: it must not go out."""
    vocabulary = ["\u2581", "Paris", "\u2581is"]

    def decode_pieces(ids: Sequence[int]) -> str:  # SentencePiece-style: the leading space is stripped
        return "".join(vocabulary[i] for i in ids).replace("\u2581", " ").removeprefix(" ")

    request = GenerationRequest(prompt_ids=(0,), params=SamplingParams(stop=("P",)))
    sequence = SequenceState(request=request, generator=None, wants_rows=False)
    stream = StreamDetokenizer(decode_pieces)
    sent: list[tuple[int, str]] = []
    for token_id in (0, 1):
        sequence.tokens.append(TokenRecord(token_id=token_id, stats={}))
        hit = find_stop_string(decode_pieces, [t.token_id for t in sequence.tokens], ["P"])
        if hit is not None:
            sequence.stop_text_end = hit.text_end
            sequence.finish(FinishReason.STOP, n_kept=hit.n_kept)
            break
        sent += stream.ready(sequence, len(sequence.tokens))
    sequence.text, sequence.text_final = final_text(decode_pieces, sequence), True
    sent += stream.ready(sequence, len(sequence.tokens))
    assert sequence.n_kept == 0 and sequence.text == "" and sent == []
