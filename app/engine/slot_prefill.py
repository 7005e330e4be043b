"""A prompt's prefill compiled once for every length, for the decode step compiled on a CPU.

An eager prefill of a short prompt is mostly the Python around its kernels: a 128-token prompt on a
small model costs about twice what the same forward compiled by inductor does, and while answers
stream, prompts arrive one or a few at a time, each its own forward. Here one program, compiled by
`torch.compile` with the prompt's length symbolic (`mark_dynamic`), runs any prompt of 2 to the slot
length's tokens without compiling again: the forward, the first token's greedy choice, its raw
distribution and statistics (what `DecodeBatch._queue_choice` computes). Like the compiled decode
step, it runs its generated C++ with no Python between the kernels and no guard before them
(`SlotDecodeBatch._compiled_step` says why skipping the guards is safe for code of its own).

The program keeps no cache of its own: each layer's keys and values come back as outputs and become
a `DynamicCache` of one row, so what follows (the first token's record, merging the group's rows, the
copy into free slots) is the eager prefill's. A group runs its prompts one at a time, a row each;
a group that does not fit the step's token budget runs as `PromptPrefill`, chunked by columns.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, CacheLayerMixin

from app.engine import phase_timing
from app.engine.decoding import DecodeBatch, DecodeContext, PromptPrefill, QueuedChoice
from app.engine.sampling import make_generator
from app.engine.sequence import GenerationRequest, SequenceState
from app.engine.token_stats import token_stats_tensor

logger = logging.getLogger(__name__)

# torch.compile specialises a dimension of size 0 or 1: a shorter prompt runs eagerly.
SHORTEST_PROMPT = 2


class _PromptLayer(CacheLayerMixin):
    """One layer of a prompt's forward with nothing before it: it keeps the keys and values it is given."""

    is_compileable = True
    is_sliding = False

    def __init__(self) -> None:
        super().__init__()
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to allocate: `update` keeps what it is given."""

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys, self.values = key_states, value_states
        return key_states, value_states

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return query_length, 0

    def get_seq_length(self) -> int:
        return 0

    def get_max_length(self) -> int:
        return -1


class _PromptCache(Cache):
    def __init__(self, num_layers: int) -> None:
        self.prompt_layers = [_PromptLayer() for _ in range(num_layers)]
        super().__init__(layers=list[Any](self.prompt_layers))


@dataclass(frozen=True)
class _PromptOutputs:
    """What the program computes for one prompt: the last position's logits, their argmax, raw distribution
    and the argmax's statistics, and every layer's keys and values `[1, kv_heads, length, head_dim]`."""

    logits: torch.Tensor
    argmax: torch.Tensor
    log_probs: torch.Tensor
    stats: torch.Tensor
    keys: list[torch.Tensor]
    values: list[torch.Tensor]


class CompiledPrefill:
    """The compiled program for prompts of `SHORTEST_PROMPT` to `longest` tokens; `build` compiles it."""

    def __init__(self, context: DecodeContext, longest: int) -> None:
        self.context = context
        self.longest = longest
        self._cache = _PromptCache(context.num_layers)
        self._dtype = next(context.model.parameters()).dtype
        self._program: Callable[[torch.Tensor], _PromptOutputs] | None = None

    def _body(self, ids: torch.Tensor) -> _PromptOutputs:
        length = ids.shape[1]
        hidden = torch.ones(length, length, dtype=torch.bool, device=ids.device).triu(1)
        mask = torch.zeros(hidden.shape, dtype=self._dtype, device=ids.device).masked_fill_(hidden, -torch.inf)
        logits = self.context.model(
            input_ids=ids,
            attention_mask=mask[None, None],
            position_ids=torch.arange(length, device=ids.device)[None],
            past_key_values=self._cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1, :]
        argmax = torch.argmax(logits, dim=-1)
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        layers = self._cache.prompt_layers
        return _PromptOutputs(
            logits,
            argmax,
            log_probs,
            token_stats_tensor(log_probs, argmax),
            [layer.keys for layer in layers],  # type: ignore[misc]
            [layer.values for layer in layers],  # type: ignore[misc]
        )

    @property
    def built(self) -> bool:
        return self._program is not None

    def build(self) -> float:
        """Compile the program (seconds) and run it once; returns the seconds it took."""
        started = time.monotonic()

        def prefill(ids: torch.Tensor) -> _PromptOutputs:
            return self._body(ids)

        options: dict[str, str | int | bool | Callable[..., Any]] = {
            "cpp_wrapper": True,
            "guard_filter_fn": torch.compiler.skip_all_guards_unsafe,
        }
        program = torch.compile(prefill, dynamic=False, fullgraph=True, options=options)
        sample = torch.full((1, min(64, self.longest)), self.context.pad_token_id, device=self.context.device)
        # Compiled for every length at once; specialising it (a branch on the length) fails here, not later.
        torch._dynamo.mark_dynamic(sample, 1, min=SHORTEST_PROMPT, max=self.longest)
        with torch.inference_mode():
            program(sample)
        self._program = program
        seconds = time.monotonic() - started
        shortest, longest = SHORTEST_PROMPT, self.longest
        logger.info("prompt prefill compiled (torch.compile) for %d to %d tokens in %.1f s", shortest, longest, seconds)
        return seconds

    def takes(self, prompt_ids: Sequence[int]) -> bool:
        return self._program is not None and SHORTEST_PROMPT <= len(prompt_ids) <= self.longest

    def run(self, prompt_ids: Sequence[int]) -> _PromptOutputs:
        assert self._program is not None, "build() first"
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=self.context.device)
        with torch.inference_mode():
            return self._program(ids)


class CompiledPromptPrefill:
    """The scheduler's prefill job (as `PromptPrefill`) for prompts that `CompiledPrefill` takes: whole, each
    prompt through the compiled program; chunked by columns (`PromptPrefill`) when the group is larger
    than a pass may be."""

    def __init__(self, prefill: CompiledPrefill, requests: Sequence[GenerationRequest]) -> None:
        if not requests:
            raise ValueError("nothing to prefill")
        self.prefill = prefill
        self.requests = list(requests)
        self._chunked: PromptPrefill | None = None

    def advance(self, max_tokens: int | None = None) -> DecodeBatch | None:
        """All the prompts when they fit in `max_tokens` padded together (None: no limit), as `PromptPrefill`
        would count them; else its next chunk. Once done, the batch with every sequence's first token."""
        if self._chunked is None:
            width = max(len(request.prompt_ids) for request in self.requests)
            if max_tokens is None or len(self.requests) * width <= max_tokens:
                return self._whole()
            self._chunked = PromptPrefill(self.prefill.context, self.requests)
        return self._chunked.advance(max_tokens)

    def _whole(self) -> DecodeBatch:
        context = self.prefill.context
        clock = phase_timing.CLOCK
        batch: DecodeBatch | None = None
        for request in self.requests:
            outputs = self.prefill.run(request.prompt_ids)
            if clock is not None:
                clock.lap(phase_timing.PREFILL)
            cache = DynamicCache(config=context.model.config)
            for index, (keys, values) in enumerate(zip(outputs.keys, outputs.values, strict=True)):
                cache.update(keys, values, index)
            sequence = SequenceState(
                request=request,
                generator=make_generator(request.params),
                wants_rows=context.capturing,
                last_row=context.last_row,
            )
            length = len(request.prompt_ids)
            mask = torch.ones((1, length), dtype=torch.long, device=context.device)
            row = DecodeBatch(context, [sequence], cache, mask, torch.tensor([length], device=context.device), False)
            stats = outputs.stats if request.params.greedy else None
            row._choose_next(outputs.logits, [0], QueuedChoice(outputs.argmax, outputs.log_probs, stats))
            if batch is None:
                batch = row
            else:
                batch.merge(row)
        assert batch is not None
        if clock is not None:
            clock.lap(phase_timing.PREFILL)
        return batch


Prefill = PromptPrefill | CompiledPromptPrefill
