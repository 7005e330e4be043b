"""The training variants as artifacts' manifests name them."""

from __future__ import annotations

import pytest

from training.two_stage import Variant


@pytest.mark.parametrize("variant", list(Variant))
def test_a_manifest_names_each_variant_by_its_value(variant: Variant) -> None:
    assert Variant.of_manifest(variant.value) is variant


def test_the_name_before_the_rename_is_the_literal_algorithm_1() -> None:
    assert Variant.of_manifest("paper-exact") is Variant.ALGORITHM1_LITERAL


def test_an_unknown_name_is_refused() -> None:
    with pytest.raises(ValueError):
        Variant.of_manifest("exact")
