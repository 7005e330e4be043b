"""The slot cache's bookkeeping: prefilled rows land from column 0 of their slot, a step writes at each position."""

from __future__ import annotations

import torch

from app.engine.slot_cache import SlotCache
from tests.fixtures.tiny_model import build_model


def _cache(slots: int = 3, max_length: int = 8) -> SlotCache:
    return SlotCache(build_model(vocab_size=32, num_layers=2), slots=slots, max_length=max_length)


def test_left_padded_rows_land_from_column_0_of_their_slots() -> None:
    cache = _cache()
    kv_heads, head_dim = cache.slot_layers[0].keys.shape[1], cache.slot_layers[0].keys.shape[3]
    width = 4
    # Row 0 holds 2 tokens (columns 2 and 3; 0 and 1 are padding), row 1 holds 4.
    keys = [
        torch.arange(2 * kv_heads * width * head_dim, dtype=torch.float32).view(2, kv_heads, width, head_dim) + 1000 * i
        for i in range(2)
    ]
    values = [-k for k in keys]
    cache.place(torch.tensor([2, 0]), keys, values, torch.tensor([2, 4]))
    assert cache.positions.tolist() == [4, 0, 2]
    for layer, layer_keys, layer_values in zip(cache.slot_layers, keys, values, strict=True):
        torch.testing.assert_close(layer.keys[2, :, :2], layer_keys[0, :, 2:])  # padding left behind
        torch.testing.assert_close(layer.keys[0, :, :4], layer_keys[1])
        torch.testing.assert_close(layer.values[0, :, :4], layer_values[1])
        assert not layer.keys[1].any()  # a free slot untouched


def test_a_step_writes_each_slots_key_at_its_own_position_and_reads_the_view() -> None:
    cache = _cache()
    cache.positions.copy_(torch.tensor([4, 0, 2]))
    cache.view_length = 5
    layer = cache.slot_layers[0]
    kv_heads, head_dim = layer.keys.shape[1], layer.keys.shape[3]
    new = torch.arange(3, dtype=torch.float32)[:, None, None, None].expand(3, kv_heads, 1, head_dim) + 1
    keys, values = layer.update(new, -new)
    assert keys.shape[2] == values.shape[2] == 5 == layer.get_seq_length()
    for slot, column in enumerate([4, 0, 2]):
        assert (layer.keys[slot, :, column] == slot + 1).all() and (layer.values[slot, :, column] == -(slot + 1)).all()
        assert int((layer.keys[slot] != 0).any(dim=-1).sum()) == kv_heads  # that column alone
