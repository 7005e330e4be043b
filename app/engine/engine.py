"""The engine: the one object that owns the LLM and its tokenizer."""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from app.engine.batch_cache import padding_mask_suffices
from app.engine.chat_prompt import PromptError, encode_chat
from app.engine.decoding import DecodeContext, PromptPrefill, run_continuously, run_to_completion
from app.engine.detokenizer import StreamDetokenizer, decode_text
from app.engine.loading import LoadedModel, ModelIdentity
from app.engine.sequence import GenerationRequest, SequenceState, trace_of
from app.engine.slot_decoding import SlotDecodeBatch, slot_decoding_refusal
from app.engine.teacher_forcing import ScoringPass, score_answers
from app.engine.token_bytes import TokenBytes
from app.uncertainty.trace import TokenTrace

logger = logging.getLogger(__name__)


def special_token_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Every special token's id: the named ones (`all_special_ids`) and added tokens marked special. A GGUF's
    control tokens come as the latter only (Qwen2.5's `<|im_start|>` and fill-in-the-middle markers), and the
    method scores no special token (METHOD.md): generating one ends the answer, like EOS."""
    ids = {int(i) for i in tokenizer.all_special_ids}
    ids.update(int(i) for i, token in getattr(tokenizer, "added_tokens_decoder", {}).items() if token.special)
    return ids


class Engine:
    """Tokenisation, chat templates, batched generation with capture, teacher-forced scoring."""

    def __init__(
        self,
        loaded: LoadedModel,
        n_lags: int,
        allow_fused_kernel: bool = True,
        last_row: bool = True,
        compiled_decode_length: int = 0,
    ) -> None:
        """`n_lags`: capture keys 0..n_lags back at every step (0 = no capture); `last_row`: also the last
        token's own step row, which only the consuming convention reads (docs/method.md §2);
        `compiled_decode_length`: decode in a slot cache of that many tokens per sequence with every step
        compiled, a CUDA graph on CUDA and `torch.compile`'s code on a CPU (`app/engine/slot_decoding.py`;
        0: the eager loop)."""
        self.loaded = loaded
        self.compiled_decode_length = compiled_decode_length
        self._slot_batch: SlotDecodeBatch | None = None
        self._compile_failure: str | None = None
        tokenizer = loaded.tokenizer
        stop_ids = special_token_ids(tokenizer)
        eos = loaded.model.generation_config.eos_token_id
        stop_ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if tokenizer.eos_token_id is not None:
            stop_ids.add(tokenizer.eos_token_id)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(stop_ids), 0)
        self._token_bytes = TokenBytes(tokenizer)
        # The decode loop gets its own tokenizer: a fast tokenizer used from two threads at once
        # (encoding a new request while the loop decodes) fails with "Already borrowed".
        self.context = DecodeContext(
            model=loaded.model,
            tokenizer=copy.deepcopy(tokenizer),
            device=loaded.device,
            n_lags=n_lags,
            stop_token_ids=frozenset(int(i) for i in stop_ids),
            pad_token_id=int(pad),
            num_layers=loaded.identity.num_layers,
            allow_fused_kernel=allow_fused_kernel,
            last_row=last_row,
            step_mask_from_padding=padding_mask_suffices(loaded.model),
        )
        # Asked on every request (the context a prompt may fill): the model's layout is fixed once loaded.
        self._slot_refusal = slot_decoding_refusal(self.context)

    # ------------------------------------------------------------------ facts
    @property
    def identity(self) -> ModelIdentity:
        return self.loaded.identity

    @property
    def device(self) -> torch.device:
        return self.loaded.device

    @property
    def dtype(self) -> torch.dtype:
        return self.loaded.model.dtype

    @property
    def n_lags(self) -> int:
        return self.context.n_lags

    @property
    def capturing(self) -> bool:
        return self.context.capturing

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.loaded.tokenizer, "chat_template", None))

    def with_lags(self, n_lags: int) -> Engine:
        """The same loaded model capturing a different number of lags (no reload)."""
        # A shallow copy carries every field, one added later included; only what depends on the lags is new.
        clone = copy.copy(self)
        clone.context = replace(self.context, n_lags=n_lags)
        clone._slot_batch = None  # the slots are shaped for the lags captured
        return clone

    def with_own_tokenizer(self) -> Engine:
        """The same engine with a tokenizer of its own, to encode request text on another thread than the event
        loop's: a fast tokenizer sets its mode (`split_special_tokens`) on its backend and then encodes, so two
        threads sharing one can each encode in the other's mode (a scored answer's "<|im_end|>" read as the
        control token, a raw prompt's as text)."""
        clone = copy.copy(self)
        clone.loaded = replace(self.loaded, tokenizer=copy.deepcopy(self.loaded.tokenizer))
        return clone

    def compiled_decode_refusal(self) -> str | None:
        """Why the decode step will not be compiled (None: it will)."""
        if not self.compiled_decode_length:
            return "compiled decoding is off"
        if self.device.type not in ("cuda", "cpu"):
            return f"the model runs on {self.device.type}, neither CUDA nor a CPU"
        if self._compile_failure is not None:
            return self._compile_failure
        return None if self._slot_refusal is None else f"this model: {self._slot_refusal}"

    def running_batch(self, slots: int) -> SlotDecodeBatch | None:
        """The batch a scheduler decodes in, emptied: one slot batch kept for the engine's life (its compiled
        steps stay built) when the decode step is compiled; None when it is not (the scheduler's own
        `DecodeBatch`)."""
        if self.compiled_decode_refusal() is not None:
            return None
        if self._slot_batch is None or len(self._slot_batch.lengths) != slots:
            self._slot_batch = SlotDecodeBatch(self.context, slots, self.compiled_decode_length, compiled=True)
        self._slot_batch.clear()
        return self._slot_batch

    def warm_up_compiled_decode(self, slots: int) -> float | None:
        """Compile the decode step of every width for `slots` rows now, before the first request (None: the step
        is not compiled). If compiling fails (on a CPU, inductor needs a C++ compiler), the engine keeps the
        eager loop and `compiled_decode_refusal` says why."""
        batch = self.running_batch(slots)
        if batch is None:
            return None
        try:
            return batch.warm_up()
        except Exception as error:  # any compiler failure: the eager loop still works
            # The compiler's message (paths, source lines) goes to the log, not to `/info`'s readers.
            logger.warning("compiling the decode step failed; the decode loop stays eager", exc_info=True)
            self._compile_failure = (
                f"compiling the step failed ({type(error).__name__}; the server log has its message)"
            )
            self._slot_batch = None
            return None

    # ------------------------------------------------------------------ text
    def encode_prompt(self, prompt: str | None = None, messages: Sequence[dict[str, Any]] | None = None) -> list[int]:
        """Token ids of a raw prompt (control-token text in it is read as control tokens), or of chat
        messages through the model's chat template (their contents are always read as text)."""
        tokenizer = self.loaded.tokenizer
        if messages is not None:
            if not self.has_chat_template:
                raise PromptError("this model has no chat template; send a plain prompt instead")
            return encode_chat(tokenizer, messages)
        if prompt is None:
            raise PromptError("either prompt or messages is required")
        return [int(i) for i in tokenizer(prompt, add_special_tokens=True)["input_ids"]]

    def encode_answer(self, text: str) -> list[int]:
        """Token ids of an answer as the model would have produced it.

        Special-token strings in the text ("<|im_end|>") are read as plain text: generation never
        scores a special token, so a scored answer must not contain one either.
        """
        encoded = self.loaded.tokenizer(text, add_special_tokens=False, split_special_tokens=True)
        return [int(i) for i in encoded["input_ids"]]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of token ids, with the decode loop's tokenizer (call it from the decode thread)."""
        return decode_text(self.context.tokenizer, ids)

    def stream_detokenizer(self) -> StreamDetokenizer:
        """Text pieces of one streamed answer (use it from the decode thread)."""
        return StreamDetokenizer(self.decode)

    def answer_pieces(self, sequence: SequenceState) -> list[str]:
        """The text each kept token of a finished answer adds to it, as its stream would send them (the
        pieces join to its text), with the request-side tokenizer (call it from the request thread)."""
        detokenizer = StreamDetokenizer(partial(decode_text, self.loaded.tokenizer))
        pieces = [""] * len(sequence.kept_tokens)
        for index, piece in detokenizer.ready(sequence, len(pieces)):
            pieces[index] = piece
        return pieces

    def token_bytes(self, token_id: int) -> bytes:
        """One token's exact bytes, with the request-side tokenizer (call it from the request thread)."""
        return self._token_bytes(token_id)

    def token_text(self, token_id: int) -> str:
        """One token's text (its bytes as UTF-8; part of a character shows as U+FFFD), from the request thread."""
        return self._token_bytes.text(token_id)

    # ------------------------------------------------------------------ compute
    def start_prefill(self, requests: Sequence[GenerationRequest]) -> PromptPrefill:
        """A prefill to run chunk by chunk (`PromptPrefill.advance`)."""
        return PromptPrefill(self.context, requests)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[SequenceState]:
        """Generate all requests as one batch, to completion."""
        return run_to_completion(self.context, requests)

    def generate_continuously(
        self, requests: Sequence[GenerationRequest], max_batch: int
    ) -> Iterator[tuple[int, SequenceState]]:
        """Generate all requests, at most `max_batch` at a time, refilling rows as answers finish;
        yields (request index, sequence) as each finishes."""
        return run_continuously(self.context, requests, max_batch)

    def trace(self, sequence: SequenceState) -> TokenTrace:
        return trace_of(sequence)

    def score(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[TokenTrace]:
        """Teacher-forced traces of given (prompt ids, answer ids) pairs."""
        return score_answers(self.context, pairs)

    def start_scoring(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> ScoringPass:
        """A teacher-forced scoring pass to run chunk by chunk (`ScoringPass.advance`)."""
        return ScoringPass(self.context, pairs)
