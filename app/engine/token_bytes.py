"""The exact bytes of one token, which a client needs to rebuild characters split over tokens.

Decoding one token alone loses information: a byte-level token holding half of a multi-byte
character decodes to U+FFFD, and a SentencePiece token's leading space is stripped. The
OpenAI `bytes` field exists for exactly this, so the bytes come from the vocabulary's own
piece, read the way the tokenizer's decoder reads it:

- byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM): each character of the piece stands for one byte;
- byte fallback (SentencePiece: Llama 2, Gemma, Mistral): pieces `<0xNN>` are single bytes,
  `▁` is a space;
- special and added tokens, and anything else: the decoded text's UTF-8.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache

from transformers import PreTrainedTokenizerBase
from transformers.convert_slow_tokenizer import bytes_to_unicode

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_METASPACE = "\u2581"


@lru_cache(maxsize=1)
def _byte_of_character() -> dict[str, int]:
    return {character: byte for byte, character in bytes_to_unicode().items()}


def _decoder_parts(tokenizer: PreTrainedTokenizerBase) -> list[dict]:
    """The fast tokenizer's decoder as JSON objects: itself, or its parts if it is a `Sequence`."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return []
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    return decoder.get("decoders", []) if decoder.get("type") == "Sequence" else [decoder]


def _replaces_metaspace(part: dict) -> bool:
    return part.get("type") == "Metaspace" or (
        part.get("type") == "Replace" and (part.get("pattern") or {}).get("String") == _METASPACE
    )


def token_text(raw: bytes) -> str:
    """A token's text: its bytes as UTF-8, a byte that is only part of a character shown as U+FFFD."""
    return raw.decode("utf-8", errors="replace")


class TokenBytes:
    """`token_bytes(token_id)`: the bytes a token stands for, as the tokenizer would decode them."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer
        parts = _decoder_parts(tokenizer)
        self._byte_level = any(part.get("type") == "ByteLevel" for part in parts)
        self._byte_fallback = any(part.get("type") == "ByteFallback" for part in parts)
        self._metaspace = any(_replaces_metaspace(part) for part in parts)
        self._added = set(tokenizer.added_tokens_decoder)

    def __call__(self, token_id: int) -> bytes:
        piece = self._tokenizer.convert_ids_to_tokens(token_id)
        if token_id not in self._added and isinstance(piece, str):
            if self._byte_level:
                table = _byte_of_character()
                if all(character in table for character in piece):
                    return bytes(table[character] for character in piece)
            if self._byte_fallback and (match := _BYTE_PIECE.fullmatch(piece)):
                return bytes([int(match.group(1), 16)])
            if self._metaspace:
                return piece.replace(_METASPACE, " ").encode("utf-8")
        return str(self._tokenizer.decode([token_id], skip_special_tokens=False)).encode("utf-8")

    def text(self, token_id: int) -> str:
        return token_text(self(token_id))
