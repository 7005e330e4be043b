"""`PrefixText`: a growing answer's text, decoding only its last tokens, equal to decoding it whole."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers
from tokenizers.implementations import BertWordPieceTokenizer, ByteLevelBPETokenizer, SentencePieceBPETokenizer
from transformers import PreTrainedTokenizerFast

from app.engine.prefix_text import Decode, PrefixText

CORPUS = [
    "Tokyo is the capital of Japan. 東京は日本の首都です。",
    "Paris, France — café crème! 🙂👍 naïve façade",
    "It isn't what we'd expect ; right ? Yes , it is .",
    "def f(x):\n    return x ** 2  # square\n\n\tdone",
] * 10


def _byte_fallback() -> PreTrainedTokenizerFast:
    """SentencePiece with byte fallback, as Llama 2, Mistral and Gemma decode: a character missing from the
    vocabulary is spelled in byte tokens, and the decoder turns every byte of one left incomplete into U+FFFD."""
    vocabulary = {"<unk>": 0, **{f"<0x{byte:02X}>": 1 + byte for byte in range(256)}}
    for piece in ["\u2581", "\u2581the", "\u2581cat", "日", "is", "a", "b", "c", ".", "é"]:
        vocabulary[piece] = len(vocabulary)
    backend = Tokenizer(models.BPE(vocab=vocabulary, merges=[], unk_token="<unk>", byte_fallback=True))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    backend.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", clean_up_tokenization_spaces=False)


def _trained(kind: str) -> PreTrainedTokenizerFast:
    """Small tokenizers of the decoder families real models use, trained on the corpus in milliseconds:
    byte-level BPE (GPT-2, Llama 3, Qwen: a character split over tokens), SentencePiece-style Metaspace (a
    leading space stripped from the first token), byte fallback, WordPiece (joins "##" pieces; its
    transformers wrapper also cleans up spaces before punctuation, across token boundaries)."""
    if kind == "byte-fallback":
        return _byte_fallback()
    if kind == "byte-level":
        backend = ByteLevelBPETokenizer()
        backend.train_from_iterator(CORPUS, vocab_size=300, min_frequency=1, show_progress=False)
        return PreTrainedTokenizerFast(tokenizer_object=backend._tokenizer, clean_up_tokenization_spaces=False)
    if kind == "metaspace":
        backend = SentencePieceBPETokenizer()
        backend.train_from_iterator(CORPUS, vocab_size=200, min_frequency=1, show_progress=False)
        return PreTrainedTokenizerFast(tokenizer_object=backend._tokenizer, clean_up_tokenization_spaces=False)
    backend = BertWordPieceTokenizer()
    backend.train_from_iterator(CORPUS, vocab_size=150, min_frequency=1, show_progress=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend._tokenizer, clean_up_tokenization_spaces=True, unk_token="[UNK]", sep_token="[SEP]"
    )


KINDS = ["byte-level", "metaspace", "byte-fallback", "wordpiece"]


@pytest.fixture(scope="module", params=KINDS)
def decode(request: pytest.FixtureRequest) -> Decode:
    tokenizer = _trained(request.param)

    def decoded(ids: Sequence[int]) -> str:
        return str(tokenizer.decode(list(ids), skip_special_tokens=True))

    decoded.vocabulary = len(tokenizer)  # type: ignore[attr-defined]
    decoded.encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # type: ignore[attr-defined]
    return decoded


def _answers(decode: Decode) -> list[list[int]]:
    """Real text, and random ids: these split characters anywhere and leave some never completed."""
    rng = random.Random(0)
    vocabulary = decode.vocabulary  # type: ignore[attr-defined]
    random_ids = [[rng.randrange(vocabulary) for _ in range(80)] for _ in range(6)]
    return [decode.encode(" ".join(CORPUS[:4])), *random_ids]  # type: ignore[attr-defined]


def test_every_prefix_asked_in_turn_decodes_as_the_whole_prefix(decode: Decode) -> None:
    for answer in _answers(decode):
        text = PrefixText(decode)
        for n in range(len(answer) + 1):
            assert text(answer[:n]) == decode(answer[:n]), n


def test_the_stop_search_pattern_of_each_prefix_then_the_one_before_it_decodes_as_whole(decode: Decode) -> None:
    for answer in _answers(decode):
        text = PrefixText(decode)
        for n in range(1, len(answer) + 1):
            assert text(answer[:n]) == decode(answer[:n])
            assert text(answer[: n - 1]) == decode(answer[: n - 1])


def test_a_prefix_behind_the_settled_point_is_decoded_whole(decode: Decode) -> None:
    answer = _answers(decode)[0]
    text = PrefixText(decode)
    for n in range(len(answer) + 1):
        text(answer[:n])
    for n in (0, 1, 5, len(answer) // 2):
        assert text(answer[:n]) == decode(answer[:n])


def test_decoding_work_per_token_does_not_grow_with_the_answer() -> None:
    """The point of it: over a 600-token answer, a few tokens decoded per token, not the whole prefix."""
    tokenizer = _trained("byte-level")
    answer = tokenizer(" ".join(CORPUS), add_special_tokens=False)["input_ids"][:600]
    assert len(answer) == 600
    decoded_tokens = 0

    def counting(ids: Sequence[int]) -> str:
        nonlocal decoded_tokens
        decoded_tokens += len(ids)
        return str(tokenizer.decode(list(ids), skip_special_tokens=True))

    text = PrefixText(counting)
    for n in range(1, len(answer) + 1):
        assert text(answer[:n]) == tokenizer.decode(answer[:n], skip_special_tokens=True)
    assert decoded_tokens < 20 * len(answer)  # the whole prefix each time: 180,300


def test_a_decoder_that_rewrites_text_across_the_window_falls_back_to_the_whole_prefix() -> None:
    """A decoder whose text for earlier tokens depends on later ones beyond what the window shows: the head's
    text no longer starts the window's, and the prefix is decoded whole."""
    words = ["a", "b", "c", "d", "e", "f", "!"]

    def shouting(ids: Sequence[int]) -> str:  # everything upper case once a "!" appears
        text = " ".join(words[i] for i in ids)
        return text.upper() if "!" in text else text

    answer = [0, 1, 2, 3, 4, 5, 0, 1, 6, 2, 3]
    text = PrefixText(shouting)
    for n in range(len(answer) + 1):
        assert text(answer[:n]) == shouting(answer[:n])


def _counted(decode: Decode) -> tuple[Decode, list[int]]:
    """`decode`, and a running count of the tokens it has decoded."""
    count = [0]

    def counting(ids: Sequence[int]) -> str:
        count[0] += len(ids)
        return decode(ids)

    return counting, count


def test_a_decoder_whose_head_never_reads_as_the_texts_end_costs_about_decoding_whole() -> None:
    """Each decode here capitalises its first word, so no head read alone ends the text: the prefixes are
    decoded whole, as before `PrefixText`, with a bounded search for a head now and then."""
    words = ["alpha", "beta", "gamma", "delta"]

    def capitalised(ids: Sequence[int]) -> str:
        return " ".join(words[i] for i in ids).capitalize()

    answer = [i % 4 for i in range(300)]
    decode, decoded = _counted(capitalised)
    text = PrefixText(decode)
    for n in range(len(answer) + 1):
        assert text(answer[:n]) == capitalised(answer[:n])
    whole = sum(range(len(answer) + 1))
    assert decoded[0] < 1.5 * whole


def test_after_text_rewritten_further_back_than_a_head_reaches_it_finds_a_head_again() -> None:
    """Text between "<" and ">" is upper case: a head starting inside a long bracket reads in lower case.
    Prefixes are decoded whole for a while, then the answer goes back to decoding a few tokens at a time."""
    words = ["a", "b", "c", "d", "<", ">"]

    def bracketed(ids: Sequence[int]) -> str:
        parts, upper = [], False
        for token in ids:
            upper = (upper or words[token] == "<") and words[token] != ">"
            parts.append(words[token].upper() if upper else words[token])
        return " ".join(parts)

    answer = [i % 4 for i in range(20)] + [4] + [i % 4 for i in range(30)] + [5] + [i % 4 for i in range(850)]
    decode, decoded = _counted(bracketed)
    text = PrefixText(decode)
    for n in range(len(answer) + 1):
        assert text(answer[:n]) == bracketed(answer[:n])
    assert decoded[0] < 0.1 * sum(range(len(answer) + 1))
