"""A key/value cache with one fixed slot per running sequence: tensors that never move, for a captured step.

The left-padded cache of `DecodeBatch` is re-allocated whenever a row leaves or joins, which a CUDA graph
cannot follow (it replays fixed addresses). Here every sequence owns a slot `[kv_heads, max_length,
head_dim]` from column 0 (no left padding) and a step writes each slot's new key at that slot's own
position (`positions`, a device tensor the captured step advances in place). Attention reads the first
`view_length` columns of every slot, the step's mask hides what lies beyond each slot's position, so a
step's cost grows with the longest running sequence, not with `max_length`.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import Cache, CacheLayerMixin


class SlotLayer(CacheLayerMixin):
    """One layer's keys and values `[slots, kv_heads, max_length, head_dim]`, written at each slot's position."""

    is_compileable = True
    is_sliding = False

    def __init__(self, owner: SlotCache, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.owner = owner
        self.keys, self.values = keys, values
        self.is_initialized = True
        self.dtype, self.device = keys.dtype, keys.device

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Allocated up front: nothing to do."""

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per slot (`key_states` `[slots, kv_heads, 1, head_dim]`) into its slot's column."""
        keys, values = self.keys, self.values
        assert keys is not None and values is not None
        where = self.owner.write_index
        keys.index_put_(where, key_states[:, :, 0])
        values.index_put_(where, value_states[:, :, 0])
        length = self.owner.view_length
        return keys[:, :, :length], values[:, :, :length]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.view_length, 0

    def get_seq_length(self) -> int:
        return self.owner.view_length

    def get_max_length(self) -> int:
        return self.owner.max_length


class SlotCache(Cache):
    """Every layer's slots, the slots' positions (the column each slot writes next) and the columns a step reads."""

    def __init__(self, model: PreTrainedModel, slots: int, max_length: int) -> None:
        config = model.config
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        kv_heads = int(getattr(text, "num_key_value_heads", None) or text.num_attention_heads)
        head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)
        parameter = next(model.parameters())
        shape = (slots, kv_heads, max_length, head_dim)
        self.max_length = max_length
        self.view_length = max_length
        self.positions = torch.zeros(slots, dtype=torch.long, device=parameter.device)
        rows = torch.arange(slots, device=parameter.device)[:, None]
        heads = torch.arange(kv_heads, device=parameter.device)[None, :]
        # (slot, kv head, column) of each slot's next key: advanced indexing, which a compiled step writes in place.
        self.write_index = (rows, heads, self.positions[:, None])
        self.slot_layers = [
            SlotLayer(
                self,
                torch.zeros(shape, dtype=parameter.dtype, device=parameter.device),
                torch.zeros(shape, dtype=parameter.dtype, device=parameter.device),
            )
            for _ in range(int(text.num_hidden_layers))
        ]
        super().__init__(layers=list[Any](self.slot_layers))

    def place(
        self, slots: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], lengths: torch.Tensor
    ) -> None:
        """Prefilled rows into `slots`: layer `i`'s `keys[i]` `[rows, kv_heads, width, head_dim]` are left-padded
        (each row's `lengths[r]` tokens end at column `width`); they land from column 0 of their slot, and each
        slot's position becomes its length. What lies beyond a row's length in its slot is hidden by the step's
        mask until the step overwrites it."""
        width = keys[0].shape[2]
        # Slot column c takes source column c + (width - length): the row's tokens, then clamped repeats.
        source = (torch.arange(width, device=lengths.device)[None, :] + (width - lengths)[:, None]).clamp_(
            max=width - 1
        )
        columns = source[:, None, :, None]
        for layer, new_keys, new_values in zip(self.slot_layers, keys, values, strict=True):
            assert layer.keys is not None and layer.values is not None
            layer.keys[:, :, :width].index_copy_(0, slots, new_keys.gather(2, columns.expand_as(new_keys)))
            layer.values[:, :, :width].index_copy_(0, slots, new_values.gather(2, columns.expand_as(new_values)))
        self.positions.index_copy_(0, slots, lengths)
