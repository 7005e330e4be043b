"""bfloat16 products of many rows in float32 (CPUs without fast bfloat16 kernels): the same numbers as
bfloat16's own product to its rounding, few rows untouched, and applied by `load_model` only where slow."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional

from app.engine import cpu_bf16
from app.engine.cpu_bf16 import MIN_ROWS, bf16_matmul_is_slow, widen_bf16_products
from app.engine.engine import Engine
from app.engine.loading import load_model


def _layer(bias: bool) -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(96, 80, bias=bias, dtype=torch.bfloat16).requires_grad_(False)


def _dtypes_multiplied(monkeypatch: pytest.MonkeyPatch) -> list[torch.dtype]:
    """The input dtype of every product the widened forward runs."""
    seen: list[torch.dtype] = []
    linear = functional.linear

    def recorded(x: torch.Tensor, *args: object) -> torch.Tensor:
        seen.append(x.dtype)
        return linear(x, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(cpu_bf16.functional, "linear", recorded)
    return seen


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(MIN_ROWS, 96), (2, MIN_ROWS // 2, 96)])  # rows of every batch entry count
def test_many_rows_multiply_in_float32_and_give_bfloat16s_product_to_its_rounding(
    bias: bool, shape: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    layer = _layer(bias)
    x = torch.randn(*shape).bfloat16()
    own = functional.linear(x, layer.weight, layer.bias)
    wide = functional.linear(x.float(), layer.weight.float(), None if layer.bias is None else layer.bias.float())
    widen_bf16_products(layer)
    multiplied = _dtypes_multiplied(monkeypatch)
    got = layer(x)
    assert multiplied == [torch.float32]
    assert got.dtype == torch.bfloat16 and torch.equal(got, wide.bfloat16())
    # bfloat16's own product sums in another order: at most a bfloat16 step (2^-8 relative) apart, mostly equal
    np.testing.assert_allclose(got.float().numpy(), own.float().numpy(), rtol=2**-7, atol=1e-3)
    assert (got != own).float().mean().item() < 0.05


@pytest.mark.parametrize("shape", [(MIN_ROWS - 1, 96), (1, MIN_ROWS - 1, 96), (1, 96)])
def test_few_rows_run_bfloat16s_own_product(shape: tuple[int, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    layer = _layer(bias=True)
    x = torch.randn(*shape).bfloat16()
    expected = functional.linear(x, layer.weight, layer.bias)
    widen_bf16_products(layer)
    multiplied = _dtypes_multiplied(monkeypatch)
    assert torch.equal(layer(x), expected)
    assert multiplied == [torch.bfloat16]


class Router(torch.nn.Linear):
    """A subclass with a forward of its own (as mixture-of-experts routers are): not a plain product."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x).softmax(-1)


def test_only_plain_bfloat16_linear_layers_are_widened() -> None:
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 4, dtype=torch.bfloat16),
        torch.nn.ReLU(),
        torch.nn.Linear(4, 4, dtype=torch.float32),
        Router(4, 4, dtype=torch.bfloat16),
    )
    assert widen_bf16_products(model) == 1
    assert "forward" in vars(model[0]) and "forward" not in vars(model[2]) and "forward" not in vars(model[3])


@pytest.mark.parametrize(
    ("machine", "capability", "slow"),
    [("x86_64", "AVX2", True), ("x86_64", "DEFAULT", True), ("x86_64", "AVX512", False), ("aarch64", "DEFAULT", False)],
)
def test_slow_bfloat16_products_are_an_x86_cpu_without_avx512(
    machine: str, capability: str, slow: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cpu_bf16.platform, "machine", lambda: machine)
    monkeypatch.setattr(cpu_bf16.torch.backends.cpu, "get_cpu_capability", lambda: capability)
    assert bf16_matmul_is_slow() is slow


def _widened(model: torch.nn.Module) -> bool:
    return any("forward" in vars(m) for m in model.modules() if isinstance(m, torch.nn.Linear))


@pytest.mark.parametrize("slow", [True, False])
def test_load_model_widens_bfloat16_only_where_its_products_are_slow(
    tiny_model_dir: Path, slow: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("app.engine.loading.bf16_matmul_is_slow", lambda: slow)
    loaded = load_model(str(tiny_model_dir), dtype="bfloat16")
    assert _widened(loaded.model) is slow and loaded.wide_bf16_products is slow
    assert not _widened(load_model(str(tiny_model_dir), dtype="bfloat16", widen_slow_bf16=False).model)
    assert not _widened(load_model(str(tiny_model_dir), dtype="float32").model)


def test_a_widened_model_scores_an_answer_as_bfloat16_does(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("app.engine.loading.bf16_matmul_is_slow", lambda: True)
    prompt, answer = [5 + i % 40 for i in range(2 * MIN_ROWS)], [7, 8, 9, 10, 11, 12]
    traces = [
        Engine(load_model(str(tiny_model_dir), dtype="bfloat16", widen_slow_bf16=widen), n_lags=4).score(
            [(prompt, answer)]
        )[0]
        for widen in (True, False)
    ]
    widened, plain = traces
    assert widened.attention is not None and plain.attention is not None
    # within bfloat16's rounding (tests/app/engine/test_bfloat16.py's tolerances, docs/method.md "Numerics")
    np.testing.assert_allclose(widened.attention, plain.attention, atol=0.02)
    np.testing.assert_allclose(widened.logprobs, plain.logprobs, atol=0.15)
