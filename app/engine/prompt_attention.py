"""Each head's attention to the prompt at the step that produces a token: two per-token statistics per head.

TAD reads the attention of a step's query to the N + 1 keys ending at it (docs/method.md §2). Where
the rest goes is what it does not see: to the prompt (the passage and question an answer should
draw on, the "lookback" of Lookback Lens, Chuang et al. 2024), or to generated tokens further back.
Per layer `l` and query head `h` of the step that produces token i (its query is the previous
token's position, the last prompt token's for the first answer token), two weights:

- `prompt_mass_lLL_hH`: the attention on the prompt's positions 1 .. P-1 (its content);
- `prompt_sink_lLL_hH`: the attention on position 0 (the attention sink, where a head with nothing
  to read parks its weight).

They are per-token statistics (`FeatureSpec.extra_stats`): an artifact fitted with them
(`fit --extra-stats`) makes the engine compute them, from the score rows the capture already
normalises (one extra product of the step's queries with the cache's keys per layer); training
copies of runs get them from a teacher-forced forward with eager attention
(`benchmarks/prompt_attention_runs.py`), the same weights to float rounding.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache

import torch

PROMPT_MASS, PROMPT_SINK = "prompt_mass", "prompt_sink"
PROMPT_FAMILIES = (PROMPT_MASS, PROMPT_SINK)
_NAME = re.compile(rf"^({PROMPT_MASS}|{PROMPT_SINK})_l(\d+)_h(\d+)$")


def prompt_statistic_name(family: str, layer: int, head: int) -> str:
    return f"{family}_l{layer:02d}_h{head}"


def prompt_statistic_names(
    num_layers: int, num_heads: int, families: Sequence[str] = PROMPT_FAMILIES
) -> tuple[str, ...]:
    """Every head's statistic of each family, family by family, then layer by layer: the order in which
    `PromptColumns.shares` lays out its values."""
    return tuple(
        prompt_statistic_name(family, layer, head)
        for family in families
        for layer in range(num_layers)
        for head in range(num_heads)
    )


@cache
def _names_of(num_layers: int, num_heads: int) -> frozenset[str]:
    return frozenset(prompt_statistic_names(num_layers, num_heads))


def is_prompt_statistic(name: str, num_layers: int, num_heads: int) -> bool:
    """Whether `name` is one of this model's prompt-attention statistics, spelt as the engine writes it."""
    return name in _names_of(num_layers, num_heads)


def wants_prompt_statistics(names: Iterable[str]) -> bool:
    """Whether any of `names` is a prompt-attention statistic (of any model)."""
    return any(_NAME.match(name) for name in names)


@dataclass(frozen=True)
class PromptColumns:
    """Which key columns hold each row's prompt: `selectors[b, 0, k, 0]` is 1 on the prompt's positions
    1 .. P-1 and 0 elsewhere, `selectors[b, 0, k, 1]` 1 on its position 0 only (`[batch, 1, columns, 2]`
    float32, families in `PROMPT_FAMILIES` order)."""

    selectors: torch.Tensor
    # A copy per device, for the layers of a model split over several (device_map="auto").
    _on_device: dict[torch.device, torch.Tensor] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(cls, starts: Sequence[int], lengths: Sequence[int], width: int, device: torch.device) -> PromptColumns:
        """`starts[b]`: the column of row b's first prompt token; `lengths[b]`: its prompt's length P."""
        columns = torch.arange(width, device=device)
        start = torch.tensor(list(starts), device=device)[:, None]
        end = start + torch.tensor(list(lengths), device=device)[:, None]
        content = (columns > start) & (columns < end)
        sink = columns == start
        selectors = torch.stack([content, sink], dim=-1).float()  # [batch, columns, 2]
        return cls(selectors[:, None])

    def shares(self, scores: torch.Tensor, log_sum_exp: torch.Tensor) -> torch.Tensor:
        """Each query's weight on the prompt's content and on its first position, `[..., 2]` float32.

        `scores` `[batch, X, Y, keys]`: a layer's float32 attention scores, masked as the softmax saw
        them; `log_sum_exp` `[batch, X, Y]`: their softmax normaliser. A layer whose cache holds fewer
        keys than the batch has columns (a sliding window) holds the last ones. One temporary the size
        of `scores` (the weights), then one product with the selectors: teacher-forced scoring's score
        rows of a long answer are large already.
        """
        selectors = self._on_device.get(scores.device)
        if selectors is None:
            selectors = self._on_device[scores.device] = self.selectors.to(scores.device)
        weights = torch.exp(scores - log_sum_exp.unsqueeze(-1))
        return torch.matmul(weights, selectors[..., -scores.shape[-1] :, :])  # [batch, X, Y, 2]
