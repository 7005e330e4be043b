"""bfloat16 products of several rows computed in float32, on CPUs whose bfloat16 kernels are slow.

On an x86 CPU without AVX-512, PyTorch has no fast bfloat16 matrix product (oneDNN's needs AVX-512):
a reference kernel runs it, 3.7x slower than float32's at 128 rows on two cores and slower with every
row, so a 512-token prefill takes 5x float32's time. A linear layer given at least `MIN_ROWS` rows (a
batch of decoding rows, a prefill, a scoring pass) computes here in float32 from the exact float32
values of its bfloat16 weights, and rounds the result to bfloat16: what a bfloat16 kernel computes too
(products summed in float32, the sum rounded), so the numbers an artifact fitted on bfloat16 answers
reads stay the same to float rounding.

The weights are widened a tile of `TILE_BYTES` at a time into one buffer per thread, which stays in
cache, each tile multiplied into its columns of the result: only the bfloat16 weights are read from
memory, and no float32 copy of a layer is ever made (a whole one cost more than the product saved
below 48 rows; the output layer's would be 0.9 GB for Qwen2.5-1.5B). Fewer rows (decoding alone or
a few at once) stay in bfloat16, which is faster there. Measured in docs/performance.md (bfloat16 or
float32) and docs/experiments/cpu-bf16-tiles.md.
"""

from __future__ import annotations

import platform
import threading
import types

import torch
from torch.nn import functional

# Rows from which tiles in float32 beat the reference bfloat16 kernel (1536 x 8960 weights, two
# cores: 8.3 ms against 9.7 at 6 rows, 8.8 against 12.8 at 8; 9.5 against 7.0 at 4).
MIN_ROWS = 8
# Float32 weights widened per tile: a few MB stay in a core's cache (2-8 MB timed within 10% at 8-128 rows).
TILE_BYTES = 4 << 20
# Rows from which widening a whole matrix at the call beats the reference kernel (48 ms against 63 at 32
# rows, 102 against 79 at 64).
WHOLE_MATRIX_MIN_ROWS = 48

_buffers = threading.local()


def bf16_matmul_is_slow() -> bool:
    """An x86 CPU torch runs without AVX-512 kernels: its bfloat16 matrix products take the reference path."""
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    return x86 and torch.backends.cpu.get_cpu_capability() in ("DEFAULT", "AVX2")


def _tile_buffer(elements: int) -> torch.Tensor:
    """This thread's float32 buffer of at least `elements`: a plain tensor even when first made in inference
    mode, so that code outside it (training, tests) can write into it too."""
    buffer: torch.Tensor | None = getattr(_buffers, "tile", None)
    if buffer is None or buffer.numel() < elements:
        with torch.inference_mode(False):
            buffer = torch.empty(elements, dtype=torch.float32)
        _buffers.tile = buffer
    return buffer


def _wide_in_float32(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    weight = self.weight
    if (
        x.dtype != torch.bfloat16
        or x.numel() < MIN_ROWS * x.shape[-1]
        or (torch.is_grad_enabled() and weight.requires_grad)
    ):
        return functional.linear(x, weight, self.bias)
    if torch.compiler.is_compiling():
        # A traced graph (the compiled decode step) keeps the rule from before tiles: it would unroll the
        # tiles' loop, and widens whole matrices only where that pays, from 48 rows.
        if x.numel() < WHOLE_MATRIX_MIN_ROWS * x.shape[-1]:
            return functional.linear(x, weight, self.bias)
        bias = None if self.bias is None else self.bias.float()
        return functional.linear(x.float(), weight.float(), bias).to(torch.bfloat16)
    out_features, in_features = weight.shape
    rows = x.reshape(-1, in_features).float()
    result = torch.empty(rows.shape[0], out_features, dtype=torch.float32)
    step = max(1, TILE_BYTES // (4 * in_features))
    buffer = _tile_buffer(min(step, out_features) * in_features)
    for start in range(0, out_features, step):
        stop = min(out_features, start + step)
        tile = buffer[: (stop - start) * in_features].view(stop - start, in_features)
        tile.copy_(weight[start:stop])
        torch.mm(rows, tile.t(), out=result[:, start:stop])
    if self.bias is not None:
        result += self.bias.float()
    return result.to(torch.bfloat16).reshape(*x.shape[:-1], out_features)


def widen_bf16_products(model: torch.nn.Module) -> int:
    """Route the bfloat16 linear layers of `model` through `_wide_in_float32`; how many there were."""
    count = 0
    for module in model.modules():
        # Exactly nn.Linear: subclasses (mixture-of-experts routers) have forwards of their own.
        if type(module) is torch.nn.Linear and module.weight.dtype == torch.bfloat16:
            module.forward = types.MethodType(_wide_in_float32, module)  # type: ignore[method-assign]
            count += 1
    return count
