"""bfloat16 products of many rows computed in float32, on CPUs whose bfloat16 kernels are slow.

On an x86 CPU without AVX-512, PyTorch has no fast bfloat16 matrix product (oneDNN's needs AVX-512):
a reference kernel runs it, 3.7x slower than float32's at 128 rows on two cores and slower with every
row, so a 512-token prefill takes 5x float32's time. A linear layer given at least `MIN_ROWS` rows
(a prefill, a scoring pass) computes here in float32 from the exact float32 values of its bfloat16
weights, and rounds the result to bfloat16: what a bfloat16 kernel computes too (products summed in
float32, the sum rounded), so the numbers an artifact fitted on bfloat16 answers reads stay the same
to float rounding. The weights are widened at each such call (31 ms for a 1536 x 8960 matrix here),
not kept: a layer's float32 copy lives during its product only, at most the largest layer's (the
output layer of a tied-embedding model: 0.9 GB for Qwen2.5-1.5B, in a scoring pass). Fewer rows
(decoding) stay in bfloat16, which is faster there (it reads half the bytes). Measured in
docs/performance.md (bfloat16 or float32).
"""

from __future__ import annotations

import platform
import types

import torch
from torch.nn import functional

# Rows from which widening the weights and multiplying in float32 beats the reference bfloat16 kernel
# (1536 x 8960 weights, two cores: 48 ms against 63 at 32 rows, 102 against 79 at 64).
MIN_ROWS = 48


def bf16_matmul_is_slow() -> bool:
    """An x86 CPU torch runs without AVX-512 kernels: its bfloat16 matrix products take the reference path."""
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    return x86 and torch.backends.cpu.get_cpu_capability() in ("DEFAULT", "AVX2")


def _wide_in_float32(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if x.dtype != torch.bfloat16 or x.numel() < MIN_ROWS * x.shape[-1]:
        return functional.linear(x, self.weight, self.bias)
    bias = None if self.bias is None else self.bias.float()
    return functional.linear(x.float(), self.weight.float(), bias).to(torch.bfloat16)


def widen_bf16_products(model: torch.nn.Module) -> int:
    """Route the bfloat16 linear layers of `model` through `_wide_in_float32`; how many there were."""
    count = 0
    for module in model.modules():
        # Exactly nn.Linear: subclasses (mixture-of-experts routers) have forwards of their own.
        if type(module) is torch.nn.Linear and module.weight.dtype == torch.bfloat16:
            module.forward = types.MethodType(_wide_in_float32, module)  # type: ignore[method-assign]
            count += 1
    return count
