"""Attention rows for TAD without eager attention or an extra forward pass.

TAD needs, per decode step, the attention weight from the step's query to the positions
0..N back from it (0 back = the query itself), for every layer and query head: one
capture serves both feature conventions (docs/method.md §2). Eager attention would
materialise every T x T matrix of every layer; instead this module registers an
attention function with transformers that computes the layer output exactly as
`sdpa` does and, only when a forward asks for it, the few weights TAD reads:

- one decode step (one query): the softmax normaliser (log-sum-exp over all keys)
  comes from the same fused CPU kernel that computes the output, and only N extra
  dot products per head are needed, done for all layers at once after the forward.
  Off CPU, the log-sum-exp of the single query row is computed directly (one
  matrix-vector product per kv head, queries of a GQA group packed together).
- several queries (teacher-forced scoring): the score rows of the wanted queries
  are computed against all keys, and the band of N keys is read off them.

Weights are always float32, whatever the model dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

CAPTURE_ATTENTION = "tad_sdpa_capture"
"""Name under which the capturing attention function is registered."""

_FUSED_CPU_KERNEL = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


@dataclass
class _DecodeStep:
    """What one layer of a decode step leaves for the weights: no arithmetic during the forward."""

    query: torch.Tensor  # [batch, kv_heads, groups, head_dim]
    key: torch.Tensor  # [batch, kv_heads, kv_length, head_dim] (the cache's tensor, not a copy)
    log_sum_exp: torch.Tensor  # [batch, kv_heads, groups]
    scale: float


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
    _mask_source: torch.Tensor | None = None
    _mask_additive: torch.Tensor | None = None

    def __post_init__(self) -> None:
        self.rows = [None] * self.num_layers
        self.decode_steps = [None] * self.num_layers

    def stacked(self) -> torch.Tensor:
        """All layers as one `[batch, queries, layers, heads, n_lags + 1]` float32 tensor on CPU."""
        if all(step is not None for step in self.decode_steps):
            return self._decode_weights()
        missing = [i for i, row in enumerate(self.rows) if row is None]
        if missing:
            raise RuntimeError(f"attention rows missing for layers {missing}")
        device = self.rows[0].device  # type: ignore[union-attr]
        layers = torch.stack([row.to(device) for row in self.rows], dim=2)  # type: ignore[union-attr]
        # [batch, heads, layers, queries, lags] -> [batch, queries, layers, heads, lags]
        return layers.permute(0, 3, 2, 1, 4).contiguous().cpu()

    def _decode_weights(self) -> torch.Tensor:
        steps: list[_DecodeStep] = self.decode_steps  # type: ignore[assignment]
        device = steps[0].query.device
        kv_length = steps[0].key.shape[2]
        n_window = min(self.n_lags + 1, kv_length)
        queries = torch.stack([step.query.to(device) for step in steps])  # [L, b, kvh, g, d]
        windows = torch.stack([step.key[:, :, kv_length - n_window : kv_length].to(device) for step in steps])
        log_sum_exp = torch.stack([step.log_sum_exp.to(device) for step in steps]).unsqueeze(-1)
        scores = torch.matmul(queries.float(), windows.float().transpose(-1, -2))  # [L, b, kvh, g, window]
        weights = torch.exp(scores.mul_(steps[0].scale).sub_(log_sum_exp.float())).flip(-1)
        if n_window < self.n_lags + 1:
            weights = torch.nn.functional.pad(weights, (0, self.n_lags + 1 - n_window))
        layers, batch, kv_heads, groups, _ = weights.shape
        # [L, b, kvh * g = heads, slots] -> [b, 1, L, heads, slots]
        weights = weights.reshape(layers, batch, kv_heads * groups, self.n_lags + 1).permute(1, 0, 2, 3)
        return weights.unsqueeze(1).contiguous().cpu()

    def additive_mask(self, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The boolean mask as 0/-inf floats, converted once per forward, not once per layer."""
        if self._mask_source is not mask or self._mask_additive is None:
            additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
            self._mask_additive = additive.masked_fill_(~mask, float("-inf"))
            self._mask_source = mask
        return self._mask_additive


def _lag_window(scores: torch.Tensor, query_positions: torch.Tensor, n_lags: int) -> torch.Tensor:
    """Gather, for each query row of `scores` `[..., queries, keys]`, the keys 0..n_lags before it."""
    lags = torch.arange(0, n_lags + 1, device=scores.device)
    key_index = query_positions[:, None] - lags[None, :]  # [queries, lags]
    valid = key_index >= 0
    gathered = scores.gather(-1, key_index.clamp(min=0).expand(*scores.shape[:-1], n_lags + 1).contiguous())
    return gathered.masked_fill(~valid, float("-inf"))


def _decode_rows(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    capture: AttentionCapture,
) -> torch.Tensor | None:
    """A decode step's output via the fused CPU kernel (which also returns the log-sum-exp), or None."""
    if (
        not capture.allow_fused_kernel
        or _FUSED_CPU_KERNEL is None
        or query.device.type != "cpu"
        or key.shape[-1] != value.shape[-1]
        or query.dtype != key.dtype
    ):
        return None
    batch, heads, _, head_dim = query.shape
    kv_heads = key.shape[1]
    # The queries of a GQA group share keys: pack them as a group's "query rows", no repeat_kv copy.
    packed = query.reshape(batch, kv_heads, heads // kv_heads, head_dim)
    mask = None
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            mask = capture.additive_mask(attention_mask, query.dtype)
        else:
            mask = attention_mask.to(query.dtype)
    output, log_sum_exp = _FUSED_CPU_KERNEL(packed, key, value, 0.0, False, attn_mask=mask, scale=scaling)
    capture.decode_steps[module.layer_idx] = _DecodeStep(packed, key, log_sum_exp, scaling)
    return output.reshape(batch, heads, 1, head_dim).transpose(1, 2).contiguous()


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
    capture.decode_steps[module.layer_idx] = _DecodeStep(packed, key, torch.logsumexp(scores, dim=-1), scale)


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


def capture_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    tad_capture: AttentionCapture | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """`sdpa` attention that also records TAD's attention rows when `tad_capture` is passed."""
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
    tad_capture.rows[module.layer_idx] = _scored_rows(query, key, attention_mask, scale, tad_capture)
    return output, None


def register_capture_attention() -> str:
    """Register the capturing attention (and sdpa's mask builder) under `CAPTURE_ATTENTION`."""
    AttentionInterface.register(CAPTURE_ATTENTION, capture_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(CAPTURE_ATTENTION, sdpa_mask)
    return CAPTURE_ATTENTION
