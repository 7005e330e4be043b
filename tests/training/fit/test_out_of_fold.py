"""What fit measures on out-of-fold TAD scores: the combiner and the decision blend, on the fit's own folds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.training.fit import QUICK_FIT
from training.fit.options import FitOptions
from training.fit.pipeline import run_fit
from training.fit.report import read_cv_record


def test_the_combiner_is_measured_on_the_same_folds_as_tad(tiny_runs: dict[str, Path], tmp_path: Path) -> None:
    manifest = run_fit(FitOptions(runs=[tiny_runs["train"]], out=tmp_path / "a", alphas=(1.0,)))
    cv = read_cv_record(tmp_path / "a", manifest)
    combiner = cv["combiner"]
    # The out-of-fold TAD the combiner reads reproduces the cross-validation's own held-out PRRs.
    # (An undefined PRR is null in the report: NaN as floats.)
    np.testing.assert_allclose(
        np.array(combiner["tad_prr_folds"], dtype=float),
        np.array(cv["chosen"]["prr_folds"], dtype=float),
        rtol=1e-9,
        atol=1e-12,
    )
    assert len(combiner["prr_folds"]) == 5
    assert set(combiner["per_dataset"]) == {t for t in manifest.training["datasets"]}
    assert {group.split("/")[0] for group in combiner["per_group"]} == set(combiner["per_dataset"])
    assert sum(row["n"] for row in combiner["per_group"].values()) == sum(
        row["n"] for row in combiner["per_dataset"].values()
    )
    assert {"tad", "combined", "msp"} <= set(combiner["informative_mean"])
    # The blend grid on the same out-of-fold TAD scores (test_blend.py measures it on informative groups):
    # the tiny model answers nothing right, so fit records why it measured nothing.
    blend = combiner["blend_out_of_fold"]
    assert blend["n"] == manifest.training["texts"]
    assert blend["informative_groups"] == cv["informative_groups"] == []
    assert "skipped" in blend


def test_the_blend_is_measured_on_every_training_answer_with_record_keys_and_fit_folds(
    tiny_runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import training.fit.out_of_fold as out_of_fold
    from training.runs import iter_texts

    recorded: dict[str, Any] = {}

    def recorder(table: dict[str, np.ndarray], quality: np.ndarray, groups: np.ndarray, keys: np.ndarray, **kw: Any):
        recorded.update(table=table, quality=quality, groups=groups, keys=keys, **kw)
        return {"recorded": True}

    monkeypatch.setattr(out_of_fold, "measure_out_of_fold", recorder)
    options = {**QUICK_FIT, "combiner": True}
    manifest = run_fit(FitOptions(runs=[tiny_runs["train"]], out=tmp_path / "a", seed=3, **options))
    assert read_cv_record(tmp_path / "a", manifest)["combiner"]["blend_out_of_fold"] == {"recorded": True}
    texts = list(iter_texts([tiny_runs["train"]]))
    assert len(recorded["quality"]) == len(texts)
    assert sorted(recorded["quality"]) == sorted(t.target for t in texts)
    assert set(recorded["keys"]) == {t.key for t in texts}  # record keys: a record's styles share a fold
    assert set(recorded["groups"]) == {f"{t.dataset}/{t.meta.get('prompt_style', 'task')}" for t in texts}
    assert recorded["folds"] == 5 and recorded["seed"] == 3
    assert {"tad", "msp", "perplexity", "mean_token_entropy", "rauq"} <= set(recorded["table"])
    assert all(len(values) == len(texts) for values in recorded["table"].values())
