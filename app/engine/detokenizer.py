"""Token ids to text: stop strings, the final cut, and the pieces a stream sends as tokens settle.

One home for everything that turns tokens into the answer's text (vLLM v1's
`engine/detokenizer.py` plays this part there). Text is always that of a whole prefix of the
answer rather than of single tokens, so characters spanning several byte-level tokens stay
intact; the decode loop and the stream get a prefix's text by decoding only its last few tokens
(`PrefixText`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.engine.prefix_text import Decode, PrefixText
from app.engine.sequence import SequenceState

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def decode_text(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]) -> str:
    """The text of token ids as the answer shows it (special tokens left out)."""
    return str(tokenizer.decode(list(ids), skip_special_tokens=True))


@dataclass(frozen=True)
class StopHit:
    text_end: int  # the answer's text ends here (where the stop string starts)
    n_kept: int  # tokens that make up the text before it


def find_stop_string(decode: Decode, ids: Sequence[int], stops: Sequence[str]) -> StopHit | None:
    """The first stop string that the last token completed, if any.

    Only the text the last token could have completed a stop string in is searched. The
    token in which a stop string starts is kept (its text is cut at the stop string).
    """
    text = decode(ids)
    longest = max(len(stop) for stop in stops)
    # A character split over byte-level tokens decodes as U+FFFD until complete: counting that
    # placeholder would start the search past a stop string the last token completed.
    previous = _settled_length(decode, ids[:-1], text)
    search_from = max(0, previous - longest + 1)
    hits = [pos for stop in stops if (pos := text.find(stop, search_from)) >= 0]
    if not hits:
        return None
    cut = min(hits)
    n_kept = len(ids)
    while n_kept > 0 and _settled_length(decode, ids[: n_kept - 1], text) >= cut:
        n_kept -= 1
    return StopHit(text_end=cut, n_kept=n_kept)


def _settled_length(decode: Decode, ids: Sequence[int], whole: str) -> int:
    """Characters of the text of `ids` (a prefix of the tokens whose text is `whole`), not counting
    an incomplete character at its end: U+FFFD that `whole` does not have there (a U+FFFD the model
    wrote stays; one it spelled as three separate byte tokens reads like a placeholder, which only
    means its partial tokens may count as complete)."""
    prefix = decode(ids)
    return len(prefix) if whole.startswith(prefix) else len(prefix.rstrip("\ufffd"))


def final_text(decode: Decode, sequence: SequenceState) -> str:
    """The answer: its kept tokens' text, cut where a stop string started."""
    text = decode([token.token_id for token in sequence.kept_tokens])
    return text if sequence.stop_text_end is None else text[: sequence.stop_text_end]


@dataclass
class StreamDetokenizer:
    """The text pieces of one streamed answer; the pieces concatenate to the final text exactly."""

    decode: Decode
    emitted: int = 0  # tokens whose piece was handed out
    emitted_text: str = ""
    text_ends: list[int] = field(default_factory=list)  # decoded length after each token (stop strings only)
    text: str = ""  # the decoded text of every token so far (stop strings only)
    # One per kind of call, each asked for ever longer prefixes (what `PrefixText` does cheaply); the stop
    # text's only for a sequence without the decode loop's own.
    _piece_text: PrefixText = field(init=False, repr=False)
    _stop_text: PrefixText = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._piece_text = PrefixText(self.decode)
        self._stop_text = PrefixText(self.decode)

    def ready(self, sequence: SequenceState, known: int) -> list[tuple[int, str]]:
        """(token index, text piece) of every token that can be sent now.

        `known`: how many tokens the caller can describe (e.g. whose confidence is known).
        Tokens that might still be the start of a stop string are held back until that is
        settled, so a stop string never appears in a stream.
        """
        limit = min(known, len(sequence.kept_tokens))
        if sequence.params.stop and not sequence.finished:
            limit = min(limit, self._clear_of_stop_strings(sequence))
        pieces = []
        while self.emitted < limit:
            piece = self._piece(sequence, self.emitted, followed=self.emitted + 1 < limit)
            if piece is None:
                break
            pieces.append((self.emitted, piece))
            self.emitted += 1
        return pieces

    def _piece(self, sequence: SequenceState, index: int, followed: bool) -> str | None:
        """The text token `index` adds to the answer, or None to wait.

        A trailing U+FFFD (a character still incomplete, or one the model wrote) is left to a later
        token's piece, so a token ending in one waits until a later token goes out with it
        (`followed`) or the answer is over: were the answer to end at it, nothing would be left to
        send it with. The last kept token gets the rest of the final text (a stop string's first
        characters in that token are cut off).
        """
        last = sequence.finished and index == sequence.n_kept - 1
        if last and not sequence.text_final:
            return None
        if last:
            full = sequence.text
        else:
            decoded = self._piece_text(sequence.token_ids(index + 1))
            if decoded.endswith("\ufffd") and not followed and not sequence.finished:
                return None
            full = decoded.rstrip("\ufffd")
            if sequence.text_final:
                full = full[: len(sequence.text)]
        piece = full[len(self.emitted_text) :] if full.startswith(self.emitted_text) else ""
        if len(full) > len(self.emitted_text):
            self.emitted_text = full
        return piece

    def _clear_of_stop_strings(self, sequence: SequenceState) -> int:
        """How many tokens lie wholly before any place a stop string could still start.

        A stop string not yet seen must end after the current text, so it starts within its
        last (longest stop - 1) characters; tokens that end before that cannot be part of it.
        The current text is what has settled: an incomplete character at its end (U+FFFD until
        its last byte-level token arrives) may yet complete a stop string. A token's own end
        counts such placeholders, so a token holding part of a character is held with it.
        """
        ids = sequence.token_ids()
        # The decode loop's stop search has just asked for this text: its `PrefixText` answers again for free.
        text_of = sequence.stop_search_text or self._stop_text
        while len(self.text_ends) < len(ids):
            self.text = text_of(ids[: len(self.text_ends) + 1])
            self.text_ends.append(len(self.text))
        if not self.text_ends:
            return 0
        # Whether a trailing U+FFFD is a placeholder or the model's own is not known yet: either
        # way, holding its tokens back is safe.
        settled = len(self.text.rstrip("\ufffd"))
        horizon = settled - max(len(stop) for stop in sequence.params.stop) + 1
        # A stop string found at `horizon` drops every token that starts there (find_stop_string keeps
        # only tokens starting before the cut): an empty-text token ending at it is not yet clear.
        clear = 0
        for start, end in zip([0, *self.text_ends], self.text_ends, strict=False):
            if end > horizon or start >= horizon:
                break
            clear += 1
        return clear
