"""`python -m training fit`: its parser, the fit it asks for, and what it prints."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.uncertainty.features import Convention
from training.cli import build_parser, main
from training.commands import fit
from training.groups import TargetCentring
from training.two_stage import Variant
from training.weighting import RowWeighting


def test_the_choices_are_the_enums_values() -> None:
    """Spelled out in the parser so that --help imports no numpy: they must stay the enums' values."""
    assert tuple(v.value for v in Variant) == fit.VARIANTS
    assert {c.value for c in Convention} == set(fit.CONVENTIONS)  # generating first: the authors'
    assert tuple(w.value for w in RowWeighting) == fit.WEIGHTINGS
    defaults = fit.options_of(build_parser().parse_args(["fit", "r", "--out", "o"]))
    assert tuple(defaults.variants) == tuple(Variant) and tuple(defaults.centrings) == tuple(TargetCentring)


def test_fit_prints_the_served_configuration_and_its_cv_prr(
    tiny_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "artifact"
    quick = ["--alphas", "1", "--variants", "leak-free", "--centrings", "none"]
    main(["fit", str(tiny_runs["train"]), "--out", str(out), *quick])
    printed = capsys.readouterr().out
    assert printed.startswith(f"wrote {out}: ridge ") and "CV PRR " in printed
    assert (out / "report" / "cv.json").is_file()
