"""Attention rows for TAD without eager attention or an extra forward pass.

TAD needs, per decode step, the attention weight from the step's query to the positions
0..N back from it (0 back = the query itself), for every layer and query head: one
capture serves both feature conventions (docs/method.md §2). Eager attention would
materialise every T x T matrix of every layer; instead this module registers an
attention function with transformers that computes the layer output exactly as
`sdpa` does and, only when a forward asks for it, the few weights TAD reads:

- one decode step (one query): the softmax normaliser (log-sum-exp over all keys)
  comes from the same fused kernel that computes the output (on CPU the flash kernel
  for CPU, on CUDA the memory-efficient kernel; both return it), and only N extra
  dot products per head are needed, done for all layers at once after the forward.
  Where neither kernel applies, the log-sum-exp of the single query row is computed
  directly (one matrix-vector product per kv head, queries of a GQA group packed together).
- several queries (teacher-forced scoring): the score rows of the wanted queries
  are computed against all keys, and the band of N keys is read off them.

Weights are always float32, whatever the model dtype.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

logger = logging.getLogger(__name__)

CAPTURE_ATTENTION = "tad_capture"
"""Name under which the capturing attention function is registered. Without "sdpa" in it:
transformers refuses any name containing "sdpa" for models whose attention sdpa cannot
express (Gemma-2's soft-capping), which this function computes explicitly instead."""

_FUSED_CPU_KERNEL = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
# Returns the output and its log-sum-exp, takes an additive bias (padding, sliding windows) and any query
# count, so a GQA group's queries go in as one kv head's query rows: no repeat_kv copy of the cache.
_FUSED_CUDA_KERNEL = getattr(torch.ops.aten, "_scaled_dot_product_efficient_attention", None)
_BIAS_ALIGNMENT = 16  # the memory-efficient kernel reads the bias's rows at strides that are multiples of 16
_cuda_kernel_unusable: set[tuple[torch.dtype, int]] = set()  # (dtype, head_dim) the kernel refused once


@dataclass
class _DecodeStep:
    """What one layer of a decode step leaves for the weights: no arithmetic during the forward."""

    query: torch.Tensor  # [batch, kv_heads, groups, head_dim]
    keys: torch.Tensor  # [batch, kv_heads, n_lags + 1, head_dim]: the last keys, zero-padded on the left
    mask: torch.Tensor  # [batch, 1, 1, n_lags + 1] float32: 0 where the query may attend, -inf elsewhere
    log_sum_exp: torch.Tensor  # [batch, kv_heads, groups]
    scale: float
    softcap: float | None = None  # attention-logit soft-capping (Gemma-2): tanh(s / cap) * cap before the mask


def _stacked(parts: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Every layer's tensor of one kind, stacked on `device` (layers may sit on several devices)."""
    if all(part.device == device for part in parts):
        return torch.stack(parts)
    return torch.stack([part.to(device) for part in parts])


_REVERSED_SLOTS: dict[tuple[int, torch.device], torch.Tensor] = {}


def reversed_slots(slots: int, device: torch.device) -> torch.Tensor:
    """The slots' order reversed, as an index (built once per slot count and device)."""
    key = (slots, device)
    if key not in _REVERSED_SLOTS:
        _REVERSED_SLOTS[key] = torch.arange(slots - 1, -1, -1, device=device)
    return _REVERSED_SLOTS[key]


def _window_mask(
    attention_mask: torch.Tensor | None, batch: int, kv_length: int, n_slots: int, device: torch.device
) -> torch.Tensor:
    """`[batch, 1, 1, n_slots]` float32 for the query's last `n_slots` keys: 0 where it may attend, -inf
    elsewhere (padding before a row's start, keys outside a window, slots before the first key)."""
    width = min(n_slots, kv_length)
    if attention_mask is None:
        mask = torch.zeros((batch, 1, 1, width), dtype=torch.float32, device=device)
    else:
        window = attention_mask[..., -1:, kv_length - width :]
        if window.dtype == torch.bool:
            mask = torch.zeros(window.shape, dtype=torch.float32, device=device).masked_fill_(~window, -torch.inf)
        else:
            mask = window.float()
        mask = mask.expand(batch, 1, 1, width)
    if width < n_slots:
        mask = torch.nn.functional.pad(mask, (n_slots - width, 0), value=-torch.inf)
    return mask


def _last_keys(
    key: torch.Tensor, attention_mask: torch.Tensor | None, capture: AttentionCapture
) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's last N + 1 keys and their mask for the one query, left-padded where the layer holds fewer.

    Each layer is cut from its own end: a sliding-window layer's cache is shorter than a full
    layer's, and the query is always the last key. Masked keys get -inf, so their weight is
    exactly zero. Layers that share a mask (all full layers; all sliding ones) share its window,
    built once per step.
    """
    n_slots = capture.n_lags + 1
    batch, kv_length = key.shape[0], key.shape[2]
    if capture.key_columns is not None:  # a slot cache: each row's window ends at its own position
        assert capture.window_mask is not None
        columns = capture.key_columns[:, None, :, None].expand(batch, key.shape[1], n_slots, key.shape[3])
        return key.gather(2, columns), capture.window_mask
    width = min(n_slots, kv_length)
    keys = key[:, :, kv_length - width :]
    if width < n_slots:
        keys = torch.nn.functional.pad(keys, (0, 0, n_slots - width, 0))
    cached = capture._window_masks.get(kv_length)
    if cached is not None and cached[0] is attention_mask and cached[1].shape[0] == batch:
        return keys, cached[1]
    mask = _window_mask(attention_mask, batch, kv_length, n_slots, key.device)
    capture._window_masks[kv_length] = (attention_mask, mask)
    return keys, mask


@dataclass
class AttentionCapture:
    """A request, passed through the model's forward kwargs, for attention rows.

    `query_start`: index (within this forward's queries) of the first query whose row
    is wanted. `stacked()` returns `[batch, queries, layers, heads, n_lags + 1]` float32
    where slot `k` holds the weight to the key `k` positions before the query (slot 0: the
    query's own position); slots that point before position 0 are zero.

    On a decode step each layer only stores references (its packed query, the cache's
    keys and the softmax log-sum-exp the fused kernel returned); the weights of all layers
    are then computed together in a handful of batched operations, so the per-layer cost
    inside the forward is a few attribute stores rather than a dozen small kernels.
    """

    n_lags: int
    num_layers: int
    query_start: int = 0
    allow_fused_kernel: bool = True
    rows: list[torch.Tensor | None] = field(default_factory=list)
    decode_steps: list[_DecodeStep | None] = field(default_factory=list)
    # Per mask object: (the mask, kept alive so its id stays its own; its additive form).
    _additive_masks: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    # Per key length: (the attention mask it was cut from, its window), reused by the layers of a step.
    _window_masks: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = field(default_factory=dict)
    # A slot cache's step (`app/engine/slot_decoding.py`): each row's N + 1 window columns `[batch, N + 1]`,
    # oldest first, and their mask `[batch, 1, 1, N + 1]` (0 / -inf), in place of the keys' last columns.
    key_columns: torch.Tensor | None = None
    window_mask: torch.Tensor | None = None

    def __post_init__(self) -> None:
        self.rows = [None] * self.num_layers
        self.decode_steps = [None] * self.num_layers

    def stacked(self) -> torch.Tensor:
        """All layers as one `[batch, queries, layers, heads, n_lags + 1]` float32 tensor on CPU."""
        return self.stacked_on_device().cpu()

    def stacked_on_device(self) -> torch.Tensor:
        """`stacked()` where the model runs: its kernels are queued, nothing waits for them yet."""
        if all(step is not None for step in self.decode_steps):
            return self._decode_weights()
        missing = [i for i, row in enumerate(self.rows) if row is None]
        if missing:
            raise RuntimeError(f"attention rows missing for layers {missing}")
        device = self.rows[0].device  # type: ignore[union-attr]
        layers = torch.stack([row.to(device) for row in self.rows], dim=2)  # type: ignore[union-attr]
        # [batch, heads, layers, queries, lags] -> [batch, queries, layers, heads, lags]
        return layers.permute(0, 3, 2, 1, 4).contiguous()

    def _decode_weights(self) -> torch.Tensor:
        steps: list[_DecodeStep] = self.decode_steps  # type: ignore[assignment]
        device = steps[0].query.device
        queries = _stacked([step.query for step in steps], device).float()  # [L, b, kvh, g, d]
        keys = _stacked([step.keys for step in steps], device).float()  # [L, b, kvh, slots, d]
        log_sum_exp = _stacked([step.log_sum_exp for step in steps], device).float().unsqueeze(-1)
        first_mask = steps[0].mask
        if all(step.mask is first_mask for step in steps):  # every layer full (or every one sliding)
            masks = first_mask.to(device).unsqueeze(0)  # [1, b, 1, 1, slots], broadcast over the layers
        else:
            masks = _stacked([step.mask for step in steps], device)  # [L, b, 1, 1, slots]
        layers, batch, kv_heads, groups, dim = queries.shape
        slots = keys.shape[3]
        offsets = masks - log_sum_exp  # [L, b, kvh, g, slots]
        scales = {step.scale for step in steps}
        if len(scales) == 1 and all(step.softcap is None for step in steps):
            # The usual case in one kernel: scale x (q . k) + mask - log-sum-exp.
            scores = torch.baddbmm(
                offsets.reshape(-1, groups, slots),
                queries.reshape(-1, groups, dim),
                keys.reshape(-1, slots, dim).transpose(1, 2),
                alpha=scales.pop(),
            )
        else:
            per_layer = torch.tensor([step.scale for step in steps], device=device).view(-1, 1, 1, 1, 1)
            scores = torch.matmul(queries, keys.transpose(-1, -2)).mul_(per_layer)  # [L, b, kvh, g, slots]
            if any(step.softcap is not None for step in steps):
                caps = torch.tensor([step.softcap or 1.0 for step in steps], device=device).view(-1, 1, 1, 1, 1)
                capped = torch.tensor([step.softcap is not None for step in steps], device=device).view(-1, 1, 1, 1, 1)
                scores = torch.where(capped, torch.tanh(scores / caps) * caps, scores)
            scores = scores.add_(offsets)
        # [L, b, kvh * g = heads, slots] -> [b, L, heads, slots], slots reversed (slot 0: the query's own key)
        # in the same copy.
        weights = scores.exp_().view(layers, batch, kv_heads * groups, slots).permute(1, 0, 2, 3)
        return weights.index_select(-1, reversed_slots(slots, device)).unsqueeze(1)

    def additive_mask(self, mask: torch.Tensor, dtype: torch.dtype, aligned: bool = False) -> torch.Tensor:
        """The mask as 0/-inf floats of `dtype`, converted once per forward and mask, not once per layer
        (full and sliding-window layers each have their own mask).

        `aligned`: the last dimension's storage padded to a multiple of `_BIAS_ALIGNMENT` (the
        returned view has the mask's shape), as the memory-efficient CUDA kernel requires.
        """
        cached = self._additive_masks.get(id(mask))
        if cached is not None and cached[0] is mask:
            return cached[1]
        if mask.dtype == torch.bool:
            additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
        else:
            additive = mask.to(dtype)
        if aligned:
            length = additive.shape[-1]
            padded = -(-length // _BIAS_ALIGNMENT) * _BIAS_ALIGNMENT
            additive = torch.nn.functional.pad(additive, (0, padded - length))[..., :length]
        self._additive_masks[id(mask)] = (mask, additive)
        return additive


def _lag_window(scores: torch.Tensor, query_positions: torch.Tensor, n_lags: int) -> torch.Tensor:
    """Gather, for each query row of `scores` `[..., queries, keys]`, the keys 0..n_lags before it."""
    lags = torch.arange(0, n_lags + 1, device=scores.device)
    key_index = query_positions[:, None] - lags[None, :]  # [queries, lags]
    valid = key_index >= 0
    gathered = scores.gather(-1, key_index.clamp(min=0).expand(*scores.shape[:-1], n_lags + 1).contiguous())
    return gathered.masked_fill(~valid, float("-inf"))


def _layer(module: torch.nn.Module) -> int:
    """The attention module's layer number (transformers sets `layer_idx`; torch types attributes as tensors)."""
    return cast(int, module.layer_idx)


_FusedKernel = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, float, "AttentionCapture"],
    "tuple[torch.Tensor, torch.Tensor] | None",
]


def _decode_rows(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    capture: AttentionCapture,
) -> torch.Tensor | None:
    """A decode step's output via a fused kernel that also returns the log-sum-exp, or None where none applies."""
    if not capture.allow_fused_kernel or key.shape[-1] != value.shape[-1] or query.dtype != key.dtype:
        return None
    fused: _FusedKernel
    if query.device.type == "cpu" and _FUSED_CPU_KERNEL is not None:
        fused = _fused_cpu
    elif query.device.type == "cuda" and _FUSED_CUDA_KERNEL is not None:
        if (query.dtype, query.shape[-1]) in _cuda_kernel_unusable:
            return None
        fused = _fused_cuda
    else:
        return None
    batch, heads, _, head_dim = query.shape
    kv_heads = key.shape[1]
    # The queries of a GQA group share keys: pack them as a group's "query rows", no repeat_kv copy.
    packed = query.reshape(batch, kv_heads, heads // kv_heads, head_dim)
    result = fused(packed, key, value, attention_mask, scaling, capture)
    if result is None:
        return None
    output, log_sum_exp = result
    keys, window_mask = _last_keys(key, attention_mask, capture)
    capture.decode_steps[_layer(module)] = _DecodeStep(packed, keys, window_mask, log_sum_exp, scaling)
    return output.reshape(batch, heads, 1, head_dim).transpose(1, 2).contiguous()


def _fused_cpu(
    packed: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    capture: AttentionCapture,
) -> tuple[torch.Tensor, torch.Tensor]:
    mask = None if attention_mask is None else capture.additive_mask(attention_mask, packed.dtype)
    output, log_sum_exp = _FUSED_CPU_KERNEL(packed, key, value, 0.0, False, attn_mask=mask, scale=scaling)  # type: ignore[misc]
    return output, log_sum_exp


def _fused_cuda(
    packed: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    capture: AttentionCapture,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The memory-efficient kernel (what sdpa itself runs for a masked decode step); None if it refuses."""
    batch, kv_heads, groups, _ = packed.shape
    bias = None
    if attention_mask is not None:
        bias = capture.additive_mask(attention_mask, packed.dtype, aligned=True)
        bias = bias.expand(batch, kv_heads, groups, key.shape[2])
    try:
        output, log_sum_exp, *_ = _FUSED_CUDA_KERNEL(  # type: ignore[misc]
            packed, key, value, bias, True, 0.0, False, scale=scaling
        )
    except RuntimeError as error:  # e.g. a head size or dtype this build's kernel lacks: the generic path
        _cuda_kernel_unusable.add((packed.dtype, packed.shape[-1]))
        logger.warning("fused CUDA attention kernel unusable (%s); computing the normaliser separately", error)
        return None
    # The kernel pads its log-sum-exp's query dimension (to a multiple of 32).
    return output, log_sum_exp[..., :groups].float()


def _record_decode_row(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scale: float,
    capture: AttentionCapture,
) -> None:
    """Off the fused CPU kernel: the one query row's log-sum-exp, from GQA-packed scores (no key copy)."""
    batch, heads, _, head_dim = query.shape
    kv_heads = key.shape[1]
    packed = query.reshape(batch, kv_heads, heads // kv_heads, head_dim)
    # float32 scores, as for the window weights (bf16 scores would skew the normaliser by ~5%).
    scores = torch.matmul(packed.float(), key.float().transpose(-1, -2)) * scale  # [b, kvh, g, kv]
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, float("-inf"))
        else:
            scores = scores + attention_mask.float()
    keys, window_mask = _last_keys(key, attention_mask, capture)
    capture.decode_steps[_layer(module)] = _DecodeStep(
        packed, keys, window_mask, torch.logsumexp(scores, dim=-1), scale
    )


def _scored_rows(
    query: torch.Tensor,
    key: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    capture: AttentionCapture,
) -> torch.Tensor:
    """Weights `[batch, heads, wanted queries, n_lags + 1]` from explicit score rows (any query count)."""
    q_length, kv_length = query.shape[2], key.shape[2]
    wanted = query[:, :, capture.query_start :, :].float()
    keys = repeat_kv(key, query.shape[1] // key.shape[1]).float()
    scores = torch.matmul(wanted, keys.transpose(-1, -2)) * scaling  # [b, h, wanted, kv]
    # Absolute key positions of the wanted queries (queries are the last q_length positions).
    query_positions = torch.arange(kv_length - q_length + capture.query_start, kv_length, device=query.device)
    if attention_mask is not None:
        mask = attention_mask[:, :, capture.query_start :, :]
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask.float()
    else:
        causal = torch.arange(kv_length, device=query.device)[None, :] <= query_positions[:, None]
        scores = scores.masked_fill(~causal, float("-inf"))
    log_sum_exp = torch.logsumexp(scores, dim=-1, keepdim=True)
    return torch.exp(_lag_window(scores, query_positions, capture.n_lags) - log_sum_exp)


def _masked_scores(
    scores: torch.Tensor, attention_mask: torch.Tensor | None, query_positions: torch.Tensor
) -> torch.Tensor:
    """Scores `[..., queries, keys]` with the mask applied (causal, bottom-right aligned, when there is none).

    Masked entries get the lowest finite float, as eager attention does, not -inf: a padding
    query masked everywhere then has a finite (uniform) softmax instead of NaN, which would
    reach real rows through its value vector (0 x NaN is NaN).
    """
    lowest = torch.finfo(scores.dtype).min
    if attention_mask is None:
        keys = torch.arange(scores.shape[-1], device=scores.device)
        return scores.masked_fill(keys[None, :] > query_positions[:, None], lowest)
    if attention_mask.dtype == torch.bool:
        return scores.masked_fill(~attention_mask, lowest)
    return (scores + attention_mask.float()).clamp_(min=lowest)


def _explicit_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scale: float,
    softcap: float,
    capture: AttentionCapture | None,
) -> torch.Tensor:
    """Attention with logit soft-capping, as the model's eager attention computes it (float32 softmax).

    sdpa has no soft-capping; layers that need it take this path, capture or not.
    """
    q_length, kv_length = query.shape[2], key.shape[2]
    groups = query.shape[1] // key.shape[1]
    scores = torch.matmul(query.float(), repeat_kv(key, groups).float().transpose(-1, -2)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    query_positions = torch.arange(kv_length - q_length, kv_length, device=query.device)
    if attention_mask is not None:
        attention_mask = attention_mask[..., -q_length:, -kv_length:]
    scores = _masked_scores(scores, attention_mask, query_positions)
    output = torch.matmul(torch.softmax(scores, dim=-1).to(value.dtype), repeat_kv(value, groups))
    if capture is not None:
        if q_length == 1:
            batch, _, _, head_dim = query.shape
            packed = query.reshape(batch, key.shape[1], groups, head_dim)
            log_sum_exp = torch.logsumexp(scores, dim=-1).reshape(batch, key.shape[1], groups)
            keys, window_mask = _last_keys(key, attention_mask, capture)
            capture.decode_steps[_layer(module)] = _DecodeStep(packed, keys, window_mask, log_sum_exp, scale, softcap)
        else:
            wanted = scores[:, :, capture.query_start :, :]
            log_sum_exp = torch.logsumexp(wanted, dim=-1, keepdim=True)
            window = _lag_window(wanted, query_positions[capture.query_start :], capture.n_lags)
            capture.rows[_layer(module)] = torch.exp(window - log_sum_exp)
    return output.transpose(1, 2).contiguous()


def capture_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    tad_capture: AttentionCapture | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """`sdpa` attention that also records TAD's attention rows when `tad_capture` is passed."""
    softcap = kwargs.get("softcap")
    if softcap is not None:
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        return _explicit_attention(module, query, key, value, attention_mask, scale, float(softcap), tad_capture), None
    if tad_capture is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    plain_kernel_ok = dropout == 0.0 and kwargs.get("position_bias") is None
    if query.shape[2] == 1 and plain_kernel_ok:
        fused = _decode_rows(module, query, key, value, attention_mask, scale, tad_capture)
        if fused is not None:
            return fused, None
        output, _ = sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
        _record_decode_row(module, query, key, attention_mask, scale, tad_capture)
        return output, None
    output, _ = sdpa_attention_forward(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
    )
    tad_capture.rows[_layer(module)] = _scored_rows(query, key, attention_mask, scale, tad_capture)
    return output, None


def register_capture_attention() -> str:
    """Register the capturing attention (and sdpa's mask builder) under `CAPTURE_ATTENTION`."""
    AttentionInterface.register(CAPTURE_ATTENTION, capture_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(CAPTURE_ATTENTION, sdpa_mask)
    return CAPTURE_ATTENTION
