"""What a fit is asked for: the grids it cross-validates and the options of `python -m training fit`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.uncertainty.features import Convention
from training.folds import FoldUnit
from training.groups import Selection, TargetCentring
from training.two_stage import Variant
from training.weighting import RowWeighting

ALPHAS = (10.0, 1.0, 0.1, 0.01, 0.001, 0.0001)
MLP_CONFIG_KEYS = ("layers", "epochs", "learning_rate", "batch_size")
MLP_GRIDS: dict[str, dict[str, Sequence[float]]] = {
    # The paper's grid (36 configurations).
    "paper": {"layers": (2, 4), "epochs": (10, 20, 30), "learning_rate": (1e-5, 3e-5, 5e-5), "batch_size": (64, 128)},
    # One configuration from it, for a quick check.
    "small": {"layers": (2,), "epochs": (10,), "learning_rate": (5e-5,), "batch_size": (64,)},
}


@dataclass(frozen=True)
class FitOptions:
    runs: Sequence[Path]
    out: Path
    n_lags: int | None = None
    alphas: Sequence[float] = ALPHAS
    folds: int = 5
    fold_unit: FoldUnit = FoldUnit.RECORD  # training/folds.py
    seed: int = 0
    epsilon: float = 1e-4
    mlp: bool = False
    mlp_width: int = 256
    mlp_grid: dict[str, Sequence[float]] = field(default_factory=lambda: dict(MLP_GRIDS["paper"]))
    # Also cross-validate each MLP averaged with the chosen ridge stage 2 (`AveragedRegressor`) on the same
    # folds; the average replaces the single model under the trial rule (beyond the paper: an ablation).
    mlp_average: bool = False
    # Install the average even when the trial rule does not keep it (the verdict is still recorded): how the
    # SmolLM2 artifact's was adopted, on the dev split (docs/experiments/ridge-mlp-average.md).
    mlp_average_force: bool = False
    conventions: Sequence[Convention] = (Convention.GENERATING, Convention.CONSUMING)
    variants: Sequence[Variant] = tuple(Variant)
    stage1_alphas: Sequence[float] | None = None  # None: the same grid as stage 2
    selection: Selection = Selection.WITHIN_GROUP
    # Tried in this order; each replaces the one kept so far only when the trial rule keeps it.
    centrings: Sequence[TargetCentring] = tuple(TargetCentring)
    # Likewise, tried after the centring is settled (training/weighting.py).
    weightings: Sequence[RowWeighting] = (RowWeighting.TOKEN, RowWeighting.TEXT)

    def described(self, without_mlp: bool = False) -> dict[str, Any]:
        """The options as a progress key describes them: all but the output folder, which changes no number
        (`without_mlp`: nor the MLP's, for work done before the MLP's cross-validation)."""
        return {
            name: value
            for name, value in asdict(self).items()
            if name != "out" and not (without_mlp and name.startswith("mlp"))
        }
