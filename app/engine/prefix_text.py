"""The text of a growing answer's first tokens, decoding only the last few tokens each time.

Decoding an answer's whole prefix again for each new token costs time in proportion to its
length, so over an answer it grows with the square of the length. The stream and the
stop-string search each did that once or twice per token. `PrefixText` keeps the text up to the
last point where it was settled (it did not end in U+FFFD, so no character was left incomplete)
and decodes from a few tokens before that point: those tokens are also decoded alone (the head),
and what the window adds after the head's text is what the new tokens add. vLLM's incremental
detokenizer does the same with its prefix and read offsets. The tokens of context give decoders
that look at neighbouring tokens the same text for the head as in the whole answer. That covers
a leading space stripped from the first token, spaces cleaned up before punctuation, and
WordPiece's "##"; a head that starts inside a character spelled in byte tokens (byte fallback)
starts further back, until its text is the end of the settled text (where none is, prefixes are
decoded whole for a while). Where the window's text does not start with the head's (a decoder
rewrote text across the boundary), the prefix is decoded whole, as it was before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Decode = Callable[[Sequence[int]], str]

CONTEXT_TOKENS = 4  # tokens decoded before the settled point, so the head's text is what the whole gives it
RETRY_TOKENS = 64  # tokens decoded whole after a settle point where no head was found, before looking again


class PrefixText:
    """`decode(ids)` for `ids` the first tokens of one answer as it grows (a `Decode` itself).

    Cheap for the calls the decode loop makes: the first n tokens for n at or past the last
    settled point, and the last two lengths asked for again (known by length and last id, which
    only tell prefixes of one answer apart). Anything further back is decoded whole.
    """

    def __init__(self, decode: Decode) -> None:
        self._decode = decode
        self._settled = 0  # the first `_settled` tokens decode to `_settled_text`, ending in a whole character
        self._settled_text = ""
        self._head_start = 0
        self._head = ""  # the text of tokens `_head_start`..`_settled` decoded alone
        self._recent: dict[int, tuple[int, str]] = {}  # length -> (its last id, its text), the last two asked
        self._retry_at = 0  # no head found at the last settle: decode whole until this many tokens, then look again

    def __call__(self, ids: Sequence[int]) -> str:
        n = len(ids)
        last_id = ids[-1] if n else -1
        recent = self._recent.get(n)
        if recent is not None and recent[0] == last_id:
            return recent[1]
        if n < self._settled or self._retry_at:
            text = self._decode(ids)
            if self._retry_at and n >= self._retry_at and not text.endswith("\ufffd"):
                self._retry_at = 0
                self._settle(ids, text)
        else:
            window = self._decode(ids[self._head_start :])
            if window.startswith(self._head):
                text = self._settled_text + window[len(self._head) :]
            else:
                text = self._decode(ids)
            if n > self._settled and not text.endswith("\ufffd"):
                self._settle(ids, text)
        self._remember(n, last_id, text)
        return text

    def _settle(self, ids: Sequence[int], text: str) -> None:
        self._settled, self._settled_text = len(ids), text
        self._head_start = max(0, len(ids) - CONTEXT_TOKENS)
        self._head = self._decode(ids[self._head_start :])
        # The head must read as the end of the text: one starting inside a character spelled in byte
        # tokens (byte fallback) decodes each of its bytes as U+FFFD. Start it further back until it does
        # (a character is at most 4 bytes). Where none does (a decoder that rewrites text further back),
        # prefixes are decoded whole for a while, and a head is looked for again later.
        tries = 2 * CONTEXT_TOKENS
        while not text.endswith(self._head):
            if self._head_start == 0 or tries == 0:
                self._retry_at = len(ids) + RETRY_TOKENS
                return
            tries -= 1
            self._head_start -= 1
            self._head = self._decode(ids[self._head_start :])

    def _remember(self, n: int, last_id: int, text: str) -> None:
        self._recent[n] = (last_id, text)
        while len(self._recent) > 2:
            del self._recent[min(self._recent)]
