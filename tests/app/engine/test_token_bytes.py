"""A token's exact bytes (app/engine/token_bytes.py): what OpenAI's `bytes` field carries."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from app.engine.token_bytes import TokenBytes
from tests.fixtures.tiny_model import build_tokenizer

TEXT = "hello world, café 東京はです 😀"


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """GPT-2-style byte-level BPE (as SmolLM2, Llama 3, Qwen), trained on a line that never splits CJK whole."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=280, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<eos>"]
    )
    backend.train_from_iterator(["hello world hello there"] * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")


def byte_fallback_tokenizer() -> PreTrainedTokenizerFast:
    """SentencePiece-style BPE with byte fallback (as Llama 2, Gemma, Mistral): `▁` for spaces, `<0xNN>` pieces."""
    vocab = {"<unk>": 0, "<eos>": 1}
    vocab.update({f"<0x{byte:02X}>": 2 + byte for byte in range(256)})
    for piece in ["▁", "h", "e", "l", "o", "w", "r", "d", "c", "a", "f", ","]:
        vocab[piece] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", unk_token="<unk>")


def test_byte_level_tokens_join_to_the_texts_bytes() -> None:
    tokenizer = byte_level_tokenizer()
    token_bytes = TokenBytes(tokenizer)
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    split = [i for i in ids if "\ufffd" in tokenizer.decode([i])]
    assert split, "the text must hold characters split over byte tokens, or the test shows nothing"
    assert b"".join(token_bytes(i) for i in ids) == TEXT.encode()
    assert all(len(token_bytes(i)) == 1 and token_bytes.text(i) == "\ufffd" for i in split[:3])
    assert token_bytes(tokenizer.eos_token_id) == b"<eos>"


def test_byte_fallback_tokens_join_to_the_texts_bytes_with_the_leading_space() -> None:
    tokenizer = byte_fallback_tokenizer()
    token_bytes = TokenBytes(tokenizer)
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    assert tokenizer.decode(ids) == TEXT
    # The first piece stands for " hello": decoding strips that space, the bytes keep it.
    assert b"".join(token_bytes(i) for i in ids) == b" " + TEXT.encode()
    assert token_bytes(tokenizer.convert_tokens_to_ids("<0xC3>")) == b"\xc3"
    assert token_bytes(tokenizer.eos_token_id) == b"<eos>"


def test_other_tokenizers_fall_back_to_the_decoded_text() -> None:
    tokenizer = build_tokenizer()  # word-level, as the tests' tiny model
    token_bytes = TokenBytes(tokenizer)
    for token_id in tokenizer.encode("the capital of france", add_special_tokens=False):
        assert token_bytes(token_id) == tokenizer.decode([token_id]).encode()
