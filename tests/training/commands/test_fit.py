"""The two-stage fit: variants differ where METHOD.md says, the Gram shortcut is exact, and the MLP option runs."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.uncertainty.aggregation import Aggregation
from app.uncertainty.features import FeatureSpec, stage1_features, stage2_features
from training.commands.fit import (
    ConventionResult,
    FitOptions,
    install_artifact,
    keep_by_trial_rule,
    load_runs,
    run_fit,
    trial_verdict,
)
from training.groups import Selection, TargetCentring
from training.ridge import GramStats, fit_ridge
from training.two_stage import (
    Variant,
    confidence_lags,
    cross_stats,
    stage1_confidences,
    stage2_stats,
    static_stats,
)


def test_stage2_gram_from_blocks_equals_the_direct_gram(tiny_runs: dict[str, Path]) -> None:
    texts, _, lags = load_runs([tiny_runs["train"]], None)
    spec = FeatureSpec(lags, 3, 4)
    stats1 = GramStats.zeros(spec.stage1_size)
    for text in texts:
        stats1.add(stage1_features(text.probs, lags), text.rows_target())
    model = fit_ridge(stats1, 0.1)
    probability_only = (Variant.LEAK_FREE, Variant.ALGORITHM1_LITERAL)
    candidates = [[stage1_confidences(t, model, variant, spec, 1e-4) for t in texts] for variant in probability_only]
    static, cross = static_stats(texts, spec), cross_stats(texts, candidates, spec)
    for k, confidences in enumerate(candidates):
        direct = GramStats.zeros(spec.stage2_size)
        for text, conf in zip(texts, confidences, strict=True):
            direct.add(stage2_features(text.probs, conf, np.asarray(text.attention), spec), text.rows_target())
        combined = stage2_stats(static, cross, k, spec)
        np.testing.assert_allclose(combined.xtx, direct.xtx, rtol=1e-9, atol=1e-6)
        np.testing.assert_allclose(combined.xty, direct.xty, rtol=1e-9, atol=1e-6)
        np.testing.assert_allclose(combined.sum_x, direct.sum_x, rtol=1e-9, atol=1e-6)


def test_variants_set_the_first_confidence_as_method_md_says(tiny_runs: dict[str, Path]) -> None:
    texts, _, lags = load_runs([tiny_runs["train"]], None)
    text = next(t for t in texts if len(t) > 2)
    stats = GramStats.zeros(lags + 1)
    stats.add(stage1_features(text.probs, lags), text.rows_target())
    model = fit_ridge(stats, 1.0)
    exact = stage1_confidences(text, model, Variant.ALGORITHM1_LITERAL, FeatureSpec(lags, 3, 4), 1e-4)
    free = stage1_confidences(text, model, Variant.LEAK_FREE, FeatureSpec(lags, 3, 4), 1e-4)
    assert exact[0] == text.target and free[0] == np.float32(text.probs[0])
    np.testing.assert_array_equal(exact[1:], free[1:])
    lagged = confidence_lags(exact, lags)
    assert lagged[0, 0] == np.float32(exact[0]) and lagged[0, 1:].sum() == 0


def test_authors_stage1_is_teacher_forced_and_stage2_gets_the_servers_recurrent_confidences(
    tiny_runs: dict[str, Path],
) -> None:
    from app.uncertainty.tad import TadScorer
    from training.commands.fit import prepare_folds, stage1_for_stage2

    texts, _, lags = load_runs([tiny_runs["train"]], None)
    spec = FeatureSpec(lags, 3, 4)
    direct = GramStats.zeros(spec.stage2_size)
    for text in texts:
        forced = np.full(len(text), text.target)
        direct.add(stage2_features(text.probs, forced, np.asarray(text.attention), spec), text.rows_target())
    options = FitOptions(runs=[tiny_runs["train"]], out=Path("unused"))
    data = prepare_folds(texts, spec, options)
    total = sum(data.teacher_forced[1:], data.teacher_forced[0])
    np.testing.assert_allclose(total.xtx, direct.xtx, rtol=1e-9, atol=1e-6)
    np.testing.assert_allclose(total.xty, direct.xty, rtol=1e-9, atol=1e-6)
    # Out-of-fold: each text's confidences come from the model fitted without its fold, applied as served.
    available = list(range(data.count))
    confidences = stage1_for_stage2(texts, data.fold_of, data, available, 1.0, Variant.AUTHORS, spec, 1e-4)
    index = next(i for i, t in enumerate(texts) if len(t) > 2)
    fold = int(data.fold_of[index])
    model = fit_ridge(total - data.teacher_forced[fold], 1.0)
    served = TadScorer(model, spec, 1e-4).confidences(texts[index].logprobs, np.asarray(texts[index].attention))
    np.testing.assert_allclose(confidences[index], served, rtol=1e-12)
    assert confidences[index][0] == np.float32(texts[index].probs[0])  # c_1 = p_1, as at inference


def test_a_gain_inside_the_fold_noise_is_not_significant() -> None:
    from training.commands.fit import paired_gain

    assert not paired_gain([0.50, 0.61, 0.42, 0.55, 0.47], [0.52, 0.58, 0.44, 0.51, 0.48])["significant"]
    assert paired_gain([0.55, 0.62, 0.47, 0.58, 0.51], [0.50, 0.58, 0.44, 0.52, 0.48])["significant"]


def test_mlp_option(tiny_runs: dict[str, Path], tmp_path: Path) -> None:
    grid = {"layers": (2,), "epochs": (3,), "learning_rate": (1e-3,), "batch_size": (64,)}
    manifest = run_fit(
        FitOptions(runs=[tiny_runs["train"]], out=tmp_path / "a", alphas=(1.0,), mlp=True, mlp_width=16, mlp_grid=grid)
    )
    mlp = manifest.metrics["cv"]["mlp"]
    assert mlp["width"] == 16 and len(mlp["grid"]) == len(Aggregation)  # one configuration x every aggregation
    assert all(len(row["prr_folds"]) == 5 for row in mlp["grid"])
    assert manifest.regressor.kind in ("ridge", "mlp")


def test_the_combiner_is_measured_on_the_same_folds_as_tad(tiny_runs: dict[str, Path], tmp_path: Path) -> None:
    manifest = run_fit(FitOptions(runs=[tiny_runs["train"]], out=tmp_path / "a", alphas=(1.0,)))
    cv = manifest.metrics["cv"]
    combiner = cv["combiner"]
    # The out-of-fold TAD the combiner reads reproduces the cross-validation's own held-out PRRs.
    np.testing.assert_allclose(combiner["tad_prr_folds"], cv["chosen"]["prr_folds"], rtol=1e-9, atol=1e-12)
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
    import training.commands.fit as fit_module
    from training.runs import iter_texts

    recorded: dict[str, Any] = {}

    def recorder(table: dict[str, np.ndarray], quality: np.ndarray, groups: np.ndarray, keys: np.ndarray, **kw: Any):
        recorded.update(table=table, quality=quality, groups=groups, keys=keys, **kw)
        return {"recorded": True}

    monkeypatch.setattr(fit_module, "measure_out_of_fold", recorder)
    options = {**QUICK_FIT, "combiner": True}
    manifest = run_fit(FitOptions(runs=[tiny_runs["train"]], out=tmp_path / "a", seed=3, **options))
    assert manifest.metrics["cv"]["combiner"]["blend_out_of_fold"] == {"recorded": True}
    texts = list(iter_texts([tiny_runs["train"]]))
    assert len(recorded["quality"]) == len(texts)
    assert sorted(recorded["quality"]) == sorted(t.target for t in texts)
    assert set(recorded["keys"]) == {t.key for t in texts}  # record keys: a record's styles share a fold
    assert set(recorded["groups"]) == {f"{t.dataset}/{t.meta.get('prompt_style', 'task')}" for t in texts}
    assert recorded["folds"] == 5 and recorded["seed"] == 3
    assert {"tad", "msp", "perplexity", "mean_token_entropy", "rauq"} <= set(recorded["table"])
    assert all(len(values) == len(texts) for values in recorded["table"].values())


def test_a_refit_into_the_same_folder_keeps_only_its_own_alternatives(
    tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "a"
    from training.weighting import RowWeighting

    quick = {
        "alphas": (1.0,),
        "combiner": False,
        "centrings": (TargetCentring.NONE,),
        "weightings": (RowWeighting.TOKEN,),
    }
    run_fit(FitOptions(runs=[tiny_runs["train"]], out=out, **quick))
    assert len(list((out / "alternatives").iterdir())) == 2
    manifest = run_fit(FitOptions(runs=[tiny_runs["train"]], out=out, variants=(Variant.LEAK_FREE,), **quick))
    assert not (out / "alternatives").exists() or not any((out / "alternatives").iterdir())
    assert set(manifest.files) == {"regressor.joblib", "stage1.joblib"}


def _row(within_group: list[float], pooled: list[float], selection: str = "within-group") -> dict[str, object]:
    selected = within_group if selection == "within-group" else pooled
    return {
        "prr_mean": sum(selected) / len(selected),
        "prr_folds": selected,
        "within_group_prr_folds": within_group,
        "pooled_prr_folds": pooled,
    }


def test_a_trial_is_kept_on_a_significant_gain_that_costs_the_other_ranking_nothing_significant() -> None:
    base = _row([0.20, 0.25, 0.22, 0.18, 0.24], [0.60, 0.66, 0.62, 0.64, 0.61])
    better = _row([0.28, 0.31, 0.27, 0.25, 0.30], [0.61, 0.64, 0.63, 0.62, 0.62])
    verdict = trial_verdict(better, base, Selection.WITHIN_GROUP)
    assert verdict["kept"] and verdict["gain"]["significant"] and verdict["other_metric"] == "pooled"
    # The same within-group gain bought with the pooled ranking (what target centring does): refused.
    bought = _row([0.28, 0.31, 0.27, 0.25, 0.30], [0.20, 0.22, 0.18, 0.21, 0.19])
    verdict = trial_verdict(bought, base, Selection.WITHIN_GROUP)
    assert verdict["gain"]["significant"] and not verdict["kept"]
    assert verdict["other_loss_significant"] and verdict["other_change"]["mean"] == pytest.approx(-0.426)
    # Selecting by pooled PRR, the guard looks at the within-group ranking instead.
    pooled_base = _row([0.28, 0.31, 0.27, 0.25, 0.30], [0.60, 0.66, 0.62, 0.64, 0.61], "pooled")
    pooled_better = _row([0.20, 0.25, 0.22, 0.18, 0.24], [0.68, 0.72, 0.69, 0.71, 0.68], "pooled")
    verdict = trial_verdict(pooled_better, pooled_base, Selection.POOLED)
    assert verdict["gain"]["significant"] and verdict["other_metric"] == "within-group" and not verdict["kept"]
    # No significant gain: not kept, whatever the other metric does.
    assert not trial_verdict(base, base, Selection.WITHIN_GROUP)["kept"]


def _result(row: dict[str, object], centring: TargetCentring) -> ConventionResult:
    return ConventionResult(
        spec=None,  # type: ignore[arg-type]  # the rule reads only the chosen row and the selection
        data=None,  # type: ignore[arg-type]
        table=[],
        best={},
        chosen_row=row,
        baselines={},
        selection=Selection.WITHIN_GROUP,
        centring=centring,
    )


def test_each_trial_is_judged_against_the_one_kept_so_far() -> None:
    pooled = [0.60, 0.66, 0.62, 0.64, 0.61]
    rows = {
        TargetCentring.NONE: _row([0.20, 0.25, 0.22, 0.18, 0.24], pooled),
        TargetCentring.GROUP_QUARTER: _row([0.28, 0.31, 0.27, 0.25, 0.30], pooled),
        # Significantly better than raw targets, but not than the quarter kept before it.
        TargetCentring.GROUP_HALF: _row([0.30, 0.30, 0.28, 0.26, 0.30], pooled),
        TargetCentring.GROUP: _row([0.20, 0.24, 0.22, 0.19, 0.24], pooled),
    }
    assert trial_verdict(rows[TargetCentring.GROUP_HALF], rows[TargetCentring.NONE], Selection.WITHIN_GROUP)["kept"]
    tried: list[TargetCentring] = []

    def cross_validate(centring: TargetCentring) -> ConventionResult:
        tried.append(centring)
        return _result(rows[centring], centring)

    alternatives = (TargetCentring.GROUP_QUARTER, TargetCentring.GROUP_HALF, TargetCentring.GROUP)
    kept, record = keep_by_trial_rule(
        _result(rows[TargetCentring.NONE], TargetCentring.NONE), "none", alternatives, cross_validate
    )
    assert tried == list(alternatives)
    assert kept.centring is TargetCentring.GROUP_QUARTER
    assert [record[c.value]["kept"] for c in alternatives] == [True, False, False]
    assert record["group-0.5"]["gain"]["mean"] == pytest.approx(0.006)


QUICK_FIT: dict[str, Any] = {
    "alphas": (1.0,),
    "variants": (Variant.LEAK_FREE,),
    "combiner": False,
    "centrings": (TargetCentring.NONE,),
}


def test_an_out_that_cannot_be_the_artifact_is_refused_before_the_runs_are_read(
    tiny_runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import training.commands.fit as fit_module

    def never(*args: object) -> None:
        raise AssertionError("the runs were read")

    monkeypatch.setattr(fit_module, "load_runs", never)
    a_file = tmp_path / "artifact"
    a_file.write_text("")
    with pytest.raises(SystemExit, match="is a file"):
        run_fit(FitOptions(runs=[tiny_runs["train"]], out=a_file, **QUICK_FIT))
    with pytest.raises(SystemExit, match="is a generation run"):
        run_fit(FitOptions(runs=[tiny_runs["train"]], out=tiny_runs["dev"], **QUICK_FIT))
    with pytest.raises(SystemExit, match="holds the run"):
        run_fit(FitOptions(runs=[tiny_runs["train"]], out=tiny_runs["train"].parent, **QUICK_FIT))


def test_a_fit_killed_while_writing_leaves_the_previous_artifact_and_the_next_replaces_it(
    tiny_runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.uncertainty.artifact as artifact_module
    from app.uncertainty.artifact import load_artifact

    out = tmp_path / "artifact"
    run_fit(FitOptions(runs=[tiny_runs["train"]], out=out, **QUICK_FIT))
    real_dumps = artifact_module.json.dumps

    def half_then_killed(*args: Any, **kwargs: Any) -> str:
        # The manifest's text is cut off, as a write killed midway leaves it.
        class Killed(str):
            def __add__(self, other: str) -> str:
                raise KeyboardInterrupt

        return Killed(real_dumps(*args, **kwargs)[:100])

    monkeypatch.setattr(artifact_module.json, "dumps", half_then_killed)
    with pytest.raises(KeyboardInterrupt):
        run_fit(FitOptions(runs=[tiny_runs["train"]], out=out, **{**QUICK_FIT, "alphas": (0.01,)}))
    monkeypatch.undo()
    assert load_artifact(out).manifest.regressor.params["alpha"] == 1.0
    # The next refit in place (as scripts/train_default.sh does) replaces it and keeps what lies beside it.
    (out / "report").mkdir()
    (out / "report" / "report.md").write_text("kept")
    manifest = run_fit(FitOptions(runs=[tiny_runs["train"]], out=out, **{**QUICK_FIT, "alphas": (0.01,)}))
    assert manifest.regressor.params["alpha"] == 0.01
    assert load_artifact(out).manifest.regressor.params["alpha"] == 0.01
    assert (out / "report" / "report.md").read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact"]  # no staging folder left behind


def test_a_manifest_write_killed_midway_leaves_the_previous_manifest(
    tiny_runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.uncertainty.artifact import load_artifact, write_manifest

    out = tmp_path / "artifact"
    manifest = run_fit(FitOptions(runs=[tiny_runs["train"]], out=out, **QUICK_FIT))
    real_write = Path.write_text

    def killed_midway(self: Path, text: str, *args: Any, **kwargs: Any) -> int:
        real_write(self, text[: len(text) // 2], *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_text", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        write_manifest(out, manifest.model_copy(update={"default_target": "coverage@0.5"}))
    monkeypatch.undo()
    assert load_artifact(out).manifest.default_target == manifest.default_target


def test_a_run_given_twice_is_refused(tiny_runs: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="more than once"):
        run_fit(FitOptions(runs=[tiny_runs["train"], tiny_runs["train"]], out=tmp_path / "a", **QUICK_FIT))


def test_a_run_made_with_the_attention_to_the_prompt_is_fitted_as_before(
    tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    """Runs that `generate --prompt-attention` made (removed since) hold hundreds more statistics and say so in
    their settings: they are still read, and fit as the same answers without them."""
    import json

    import joblib

    from training.runs import RUN_FILE, read_run_settings

    annotated = tmp_path / "annotated-run"
    shutil.copytree(tiny_runs["train"], annotated)
    for entropy in annotated.glob("shards/*/stat-entropy.npy"):
        for name in ("prompt_mass_l00_h0", "prompt_sink_l00_h0"):
            shutil.copy(entropy, entropy.with_name(f"stat-{name}.npy"))
    settings = read_run_settings(annotated)
    (annotated / RUN_FILE).write_text(json.dumps({**settings, "prompt_attention": True}))
    plain = run_fit(FitOptions(runs=[tiny_runs["train"]], out=tmp_path / "plain", **QUICK_FIT))
    fitted = run_fit(FitOptions(runs=[annotated], out=tmp_path / "annotated", **QUICK_FIT))
    assert fitted.features == plain.features
    # The same cross-validation (NaN where the tiny model leaves a fold's PRR undefined: compared as text).
    assert json.dumps(fitted.metrics["cv"]["chosen"]) == json.dumps(plain.metrics["cv"]["chosen"])
    np.testing.assert_array_equal(
        joblib.load(tmp_path / "annotated" / "regressor.joblib").coef_,
        joblib.load(tmp_path / "plain" / "regressor.joblib").coef_,
    )


def test_fewer_records_than_folds_is_said_plainly(tiny_runs: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="cannot be split into 100 folds"):
        run_fit(FitOptions(runs=[tiny_runs["train"]], out=tmp_path / "a", folds=100, **QUICK_FIT))


def _artifact_folder(path: Path, regressor: str, extra: dict[str, str]) -> Path:
    path.mkdir(parents=True)
    (path / "manifest.json").write_text("{}")
    (path / "regressor.joblib").write_text(regressor)
    for name, text in extra.items():
        (path / name).write_text(text)
    return path


def test_a_fit_killed_between_its_renames_is_repaired_by_the_next(tmp_path: Path) -> None:
    out = tmp_path / "artifact"
    # Killed after moving the old artifact aside and before moving the new one in: `out` is missing.
    _artifact_folder(tmp_path / ".artifact.replaced-123", "old", {"report.md": "old report"})
    install_artifact(_artifact_folder(tmp_path / "staging", "new", {}), out)
    assert (out / "regressor.joblib").read_text() == "new" and (out / "report.md").read_text() == "old report"
    assert not list(tmp_path.glob(".artifact.replaced-*"))


def test_a_fit_killed_while_carrying_over_is_finished_by_the_next(tmp_path: Path) -> None:
    out = _artifact_folder(tmp_path / "artifact", "newer", {})
    _artifact_folder(tmp_path / ".artifact.replaced-123", "old", {"calibration-run": "answers"})
    install_artifact(_artifact_folder(tmp_path / "staging", "newest", {}), out)
    assert (out / "regressor.joblib").read_text() == "newest" and (out / "calibration-run").read_text() == "answers"
    assert not list(tmp_path.glob(".artifact.replaced-*"))


def test_mlp_average_option(tiny_runs: dict[str, Path], tmp_path: Path) -> None:
    import joblib

    from app.uncertainty.artifact import load_artifact
    from app.uncertainty.tad import AveragedRegressor, MLPStage2

    grid = {"layers": (2,), "epochs": (3,), "learning_rate": (1e-3,), "batch_size": (64,)}
    options = FitOptions(
        runs=[tiny_runs["train"]], out=tmp_path / "a", alphas=(1.0,), mlp=True, mlp_width=16, mlp_grid=grid
    )
    manifest = run_fit(replace(options, mlp_average=True))
    mlp = manifest.metrics["cv"]["mlp"]
    assert {row["stage2"] for row in mlp["grid"]} == {"mlp", "mlp+ridge"}
    average = mlp["average"]
    assert average["best"]["stage2"] == "mlp+ridge" and isinstance(average["kept"], bool)
    # The MLP's rows are the same folds' numbers as without the average (same seed, same matrix).
    alone = run_fit(replace(options, out=tmp_path / "b"))
    run_fit(replace(options, out=tmp_path / "ridge", mlp=False))
    assert [r["prr_folds"] for r in alone.metrics["cv"]["mlp"]["grid"]] == [
        r["prr_folds"] for r in mlp["grid"] if r["stage2"] == "mlp"
    ]
    assert manifest.regressor.kind == ("mlp+ridge" if average["kept"] else alone.regressor.kind)
    assert average["installed_by_force"] is False
    # --force-average installs it whatever the rule says, and records that it did.
    forced = run_fit(replace(options, out=tmp_path / "c", mlp_average=True, mlp_average_force=True))
    assert forced.regressor.kind == "mlp+ridge" and forced.regressor.params["alpha"] == 1.0
    assert forced.metrics["cv"]["mlp"]["average"]["installed_by_force"] is (not average["kept"])
    artifact = load_artifact(tmp_path / "c")
    assert isinstance(artifact.scorer.regressor, AveragedRegressor)
    ridge, mlp = artifact.scorer.regressor.members
    assert isinstance(artifact.scorer.split, MLPStage2) and artifact.scorer.split.with_linear
    # Its members are the ridge artifact's stage 2 and the MLP artifact's, fitted on the same rows.
    np.testing.assert_array_equal(ridge.coef_, joblib.load(tmp_path / "ridge" / "regressor.joblib").coef_)


CRAFTED_CONFIG = {"layers": 2, "epochs": 3, "learning_rate": 1e-3, "batch_size": 64}
NOISE = np.array([0.0, 0.1, -0.1, 0.1, -0.1])  # a fold-by-fold spread no mean gain of 0 survives


def _cv_row(stage2: str, folds: np.ndarray) -> dict[str, Any]:
    """A crafted MLP-search row whose folds are the same under both selection metrics."""
    values = [float(v) for v in folds]
    return {
        "stage2": stage2,
        **CRAFTED_CONFIG,
        "aggregation": "mean",
        "prr_mean": float(np.mean(values)),
        "prr_folds": values,
        "pooled_prr_folds": values,
        "within_group_prr_folds": values,
    }


def _plus(row: dict[str, Any], gain: float) -> np.ndarray:
    """The row's folds raised by `gain`, or (a gain of 0) spread by noise no trial rule keeps."""
    return np.array(row["prr_folds"]) + gain + (NOISE if gain == 0 else 0)


def _crafted_mlp_and_average(mlp_gain: float, average_gain: float) -> tuple[dict[str, Any], dict[str, Any]]:
    mlp = _cv_row("mlp", 5.0 * mlp_gain + np.array([0.0, 0.05, -0.05, 0.0, 0.0]))
    return mlp, _cv_row("mlp+ridge", _plus(mlp, average_gain))


def _crafted_options(tiny_runs: dict[str, Path], tmp_path: Path, force: bool) -> FitOptions:
    """Fit options for a crafted `mlp_search` (its grid is never run)."""
    return FitOptions(
        runs=[tiny_runs["train"]],
        out=tmp_path / "a",
        alphas=(1.0,),
        mlp=True,
        mlp_width=8,
        mlp_grid={},
        mlp_average=True,
        mlp_average_force=force,
        combiner=False,
    )


@pytest.mark.parametrize(
    ("mlp_gain", "average_gain", "force", "kind", "against", "forced"),
    [
        (1.0, 1.0, False, "mlp+ridge", "mlp", False),  # MLP kept, the average beats it significantly
        (1.0, 0.0, False, "mlp", "mlp", False),  # ... not significantly: the MLP stays
        (1.0, 0.0, True, "mlp+ridge", "mlp", True),  # ... unless forced, which is recorded
        # MLP not kept: the average against the ridge, whose folds on the tiny runs are mostly undefined
        # (no gain over them is significant), so only forcing installs it.
        (-1.0, 10.0, True, "mlp+ridge", "ridge", True),
        (-1.0, -10.0, False, "ridge", "ridge", False),
    ],
)
def test_which_stage_2_is_installed(
    tiny_runs: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mlp_gain: float,
    average_gain: float,
    force: bool,
    kind: str,
    against: str,
    forced: bool,
) -> None:
    from training.commands import fit

    def crafted_search(texts: Any, spec: Any, data: Any, choice: Any, options: Any) -> Any:
        mlp, average = _crafted_mlp_and_average(mlp_gain, average_gain)
        return mlp, average, [mlp, average]

    monkeypatch.setattr(fit, "mlp_search", crafted_search)
    manifest = run_fit(_crafted_options(tiny_runs, tmp_path, force))
    assert manifest.regressor.kind == kind
    average = manifest.metrics["cv"]["mlp"]["average"]
    assert average["against"] == against and average["installed_by_force"] is forced
    assert ("alpha" in manifest.regressor.params) is (kind != "mlp")
    assert ("layers" in manifest.regressor.params) is (kind != "ridge")
