"""What `blend` does: the decision score, TAD blended with free baselines, chosen on answers TAD was not fitted on.

Candidates are TAD alone and `(1 - w) z(TAD) + w z(B)` for every baseline B, and for the mean of the
standardised unsupervised sequence scores (MSP, perplexity, mean token entropy, RAUQ), at each weight
w; `z` standardises a score by its mean and standard deviation on the selection answers (the blend
stores them, so the served score is the same number). The chosen candidate maximises the mean PRR
within the informative dataset/prompt-style groups, among those whose pooled PRR is at most
`POOLED_TOLERANCE` below TAD's (mixed traffic and the calibrated thresholds need the pooled ranking).

Whether to install it is cross-validated: folds by record; each fold's answers are scored by the
choice made on the other folds, and the out-of-fold blend is compared with TAD alone on the same
answers (paired bootstrap): kept when the within-group gain's 95% interval is above zero and the
pooled change's is not below zero (as `fit` keeps a trial: a gain in one ranking must not be bought
with the other).
The runs must hold answers the artifact's regressor was not fitted on: TAD's scores on its own training
answers are better than on new ones, and a blend chosen there would under-weight the baselines.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from app.uncertainty.artifact import BlendInfo, BlendTermInfo, Manifest, load_artifact, write_manifest
from app.uncertainty.methods import BASELINES, Method
from training.folds import FoldUnit
from training.method_scores import uncertainty_table
from training.rejection import accuracy, informative, interval, paired_bootstrap_prr, prediction_rejection_ratio
from training.run_source import check_runs_match
from training.runs import RUN_FILE, TextTrace, check_no_duplicates, completed_shards, iter_texts
from training.tasks import PromptStyle

logger = logging.getLogger(__name__)

WEIGHTS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6)
UNSUPERVISED = ("msp", "perplexity", "mean_token_entropy", "rauq")
POOLED_TOLERANCE = 0.02
TAD_ALONE = "tad"


@dataclass(frozen=True)
class Candidate:
    name: str
    weights: dict[str, float]  # method -> weight of its standardised score


def candidates(weights: Sequence[float] = WEIGHTS) -> list[Candidate]:
    """TAD alone, then TAD with each baseline and with the unsupervised mean, at each weight."""
    result = [Candidate(TAD_ALONE, {Method("tad").value: 1.0})]
    partners = [(m.value, (m.value,)) for m in BASELINES] + [("mean(" + ", ".join(UNSUPERVISED) + ")", UNSUPERVISED)]
    for label, methods in partners:
        for weight in weights:
            parts = {Method("tad").value: 1.0 - weight, **{m: weight / len(methods) for m in methods}}
            result.append(Candidate(f"tad + {weight:g} {label}", parts))
    return result


def terms_table(table: dict[str, np.ndarray], options: Sequence[Candidate]) -> dict[str, np.ndarray]:
    """The scores the candidates blend, out of a table of every method's."""
    return {name: table[name] for name in {name for option in options for name in option.weights}}


@dataclass(frozen=True)
class Standardisation:
    means: dict[str, float]
    scales: dict[str, float]

    @classmethod
    def of(cls, table: dict[str, np.ndarray], rows: np.ndarray) -> Standardisation:
        means, scales = {}, {}
        for name, values in table.items():
            finite = values[rows][np.isfinite(values[rows])]
            means[name] = float(finite.mean()) if len(finite) else 0.0
            scale = float(finite.std()) if len(finite) > 1 else 0.0
            scales[name] = scale if scale > 0.0 else 1.0
        return cls(means, scales)

    def score(self, candidate: Candidate, table: dict[str, np.ndarray]) -> np.ndarray:
        """The candidate's blended uncertainty for every text (+inf where a term is undefined: empty answers)."""
        total = np.zeros(len(next(iter(table.values()))))
        for name, weight in candidate.weights.items():
            total = total + weight * (table[name] - self.means[name]) / self.scales[name]
        return np.where(np.isfinite(total), total, math.inf)

    def terms(self, candidate: Candidate) -> list[BlendTermInfo]:
        return [
            BlendTermInfo(method=Method(name), weight=weight, mean=self.means[name], scale=self.scales[name])
            for name, weight in candidate.weights.items()
        ]


@dataclass(frozen=True)
class Answers:
    """The selection answers: every method's score, quality, group and record key."""

    table: dict[str, np.ndarray]
    quality: np.ndarray
    groups: np.ndarray
    keys: np.ndarray
    informative_groups: list[str] = field(default_factory=list)

    def within_group(self, scores: np.ndarray, rows: np.ndarray) -> float:
        values = []
        for group in self.informative_groups:
            mask = rows & (self.groups == group)
            value = prediction_rejection_ratio(scores[mask], self.quality[mask])
            if math.isfinite(value):
                values.append(value)
        return float(np.mean(values)) if values else math.nan

    def pooled(self, scores: np.ndarray, rows: np.ndarray) -> float:
        return prediction_rejection_ratio(scores[rows], self.quality[rows])

    def bootstrap(
        self, scores: dict[str, np.ndarray], resamples: int, seed: int
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Paired bootstrap PRRs of every score: the within-group mean (each group resampled on its own)
        and the pooled PRR, `resamples` draws each."""
        per_group = [
            paired_bootstrap_prr(
                {name: values[mask] for name, values in scores.items()}, self.quality[mask], resamples, seed
            )
            for group in self.informative_groups
            if (mask := self.groups == group).any()
        ]
        pooled = paired_bootstrap_prr(scores, self.quality, resamples, seed)
        if not per_group:  # no informative group: the within-group mean is undefined
            return {name: np.full(resamples, math.nan) for name in scores}, pooled
        within = {name: np.nanmean(np.stack([draws[name] for draws in per_group]), axis=0) for name in scores}
        return within, pooled


def answers_from(table: dict[str, np.ndarray], quality: np.ndarray, groups: np.ndarray, keys: np.ndarray) -> Answers:
    """The answers with their informative groups (accuracy in [0.1, 0.9]), the ones selection ranks within."""
    chosen = sorted(g for g in set(groups) if informative(accuracy(quality[groups == g])))
    return Answers(table, quality, groups, keys, chosen)


def answers_of(table: dict[str, np.ndarray], texts: Sequence[TextTrace]) -> Answers:
    groups = np.array([t.group for t in texts])
    quality = np.array([t.target for t in texts], dtype=np.float64)
    return answers_from(table, quality, groups, np.array([t.key for t in texts]))


def evaluate_candidates(
    answers: Answers, rows: np.ndarray, options: Sequence[Candidate]
) -> tuple[Standardisation, list[dict[str, Any]]]:
    """Every candidate's within-group and pooled PRR on `rows`, standardised on those rows."""
    standardisation = Standardisation.of(answers.table, rows)
    table = []
    for candidate in options:
        scores = standardisation.score(candidate, answers.table)
        table.append(
            {
                "candidate": candidate.name,
                "within_group_prr": answers.within_group(scores, rows),
                "pooled_prr": answers.pooled(scores, rows),
            }
        )
    return standardisation, table


def choose(rows_table: list[dict[str, Any]]) -> int:
    """Index of the best within-group candidate whose pooled PRR is within the tolerance of TAD alone's."""
    floor = rows_table[0]["pooled_prr"] - POOLED_TOLERANCE
    eligible = [
        i
        for i, row in enumerate(rows_table)
        if math.isfinite(row["within_group_prr"]) and (not math.isfinite(floor) or row["pooled_prr"] >= floor)
    ]
    return max(eligible, key=lambda i: rows_table[i]["within_group_prr"]) if eligible else 0


def cross_validate(
    answers: Answers, options: Sequence[Candidate], folds: int, seed: int, resamples: int, fixed: Candidate | None
) -> dict[str, Any]:
    """Out-of-fold blend scores (the choice and standardisation made on the other folds, folds by record),
    against TAD alone on the same answers, with paired bootstrap 95% intervals of the differences.

    The PRRs are taken over all out-of-fold answers of a group together, not fold by fold: a fold holds
    about 30 answers of a group, too few for a PRR to say much. `fixed`: that candidate in every fold
    (only its standardisation is made on the other folds) instead of each fold's own choice.
    """
    from sklearn.model_selection import GroupKFold

    splitter = GroupKFold(n_splits=folds, shuffle=True, random_state=seed)
    positions = np.arange(len(answers.quality))
    blended = np.full(len(positions), math.inf)
    chosen = []
    for train, held in splitter.split(positions, groups=answers.keys):
        inside = np.zeros(len(positions), dtype=bool)
        inside[train] = True
        standardisation, table = evaluate_candidates(answers, inside, options)
        best = fixed if fixed is not None else options[choose(table)]
        chosen.append(best.name)
        blended[held] = standardisation.score(best, answers.table)[held]
    scores = {"blend": blended, TAD_ALONE: answers.table[Method("tad").value]}
    everything = np.ones(len(positions), dtype=bool)
    within = {name: answers.within_group(values, everything) for name, values in scores.items()}
    pooled = {name: answers.pooled(values, everything) for name, values in scores.items()}
    within_draws, pooled_draws = answers.bootstrap(scores, resamples, seed)
    gain = within_draws["blend"] - within_draws[TAD_ALONE]
    pooled_change = pooled_draws["blend"] - pooled_draws[TAD_ALONE]
    gain_ci, pooled_ci = interval(gain), interval(pooled_change)
    kept = bool(gain_ci is not None and gain_ci[0] > 0.0 and not (pooled_ci is not None and pooled_ci[1] < 0.0))
    return {
        "folds": folds,
        "split": f"by {FoldUnit.RECORD.value}",
        "chosen_per_fold": chosen,
        "within_group_prr": within,
        "pooled_prr": pooled,
        "gain": {"mean": within["blend"] - within[TAD_ALONE], "ci95": gain_ci},
        "pooled_change": {"mean": pooled["blend"] - pooled[TAD_ALONE], "ci95": pooled_ci},
        "rule": "kept when the within-group gain's 95% interval is above 0 and the pooled change's is not below 0",
        "kept": kept,
    }


def measure_out_of_fold(
    table: dict[str, np.ndarray],
    quality: np.ndarray,
    groups: np.ndarray,
    keys: np.ndarray,
    folds: int = 5,
    seed: int = 0,
    resamples: int = 1000,
) -> dict[str, Any]:
    """The blend measured on the training answers themselves, with TAD's out-of-fold scores (`fit` reports it).

    Each answer's TAD comes from a regressor fitted without it, so these answers can choose a blend as
    answers the regressor never saw would, with no generation beyond the training runs; the grid and its
    nested cross-validation are `blend`'s. A measurement, never installed: `blend` installs one from answers
    the artifact's final regressor was not fitted on.
    """
    options = candidates()
    answers = answers_from(terms_table(table, options), quality, groups, keys)
    if not answers.informative_groups:
        return {"n": len(quality), "informative_groups": [], "skipped": "no informative group to rank within"}
    if len(set(keys)) < folds:
        return {
            "n": len(quality),
            "informative_groups": answers.informative_groups,
            "skipped": f"fewer records than the {folds} folds of the cross-validation",
        }
    _, grid = evaluate_candidates(answers, np.ones(len(quality), dtype=bool), options)
    by_within_group = sorted(grid, key=lambda row: _finite_or_lowest(row["within_group_prr"]), reverse=True)
    return {
        "n": len(quality),
        "informative_groups": answers.informative_groups,
        "pooled_tolerance": POOLED_TOLERANCE,
        "chosen": options[choose(grid)].name,
        "best_candidates": by_within_group[:5],
        "tad_alone": grid[0],
        "cv": cross_validate(answers, options, folds, seed, resamples, None),
    }


def _finite_or_lowest(value: float) -> float:
    """Sort key: an undefined PRR ranks last."""
    return value if math.isfinite(value) else -math.inf


def fitted_keys(manifest: Manifest) -> set[tuple[str, str]]:
    """(record key, prompt style) of every answer the regressor was fitted on, where its runs are on disk
    (read from the shards' texts.json alone: the answers' arrays are not needed)."""
    keys: set[tuple[str, str]] = set()
    for run in manifest.training.get("runs", []):
        for shard in completed_shards(Path(run)):
            for meta in json.loads((shard / "texts.json").read_text()):
                # As TextTrace.answer_key has it: a style stored by its old name ("bare") is the chat style.
                keys.add((str(meta["key"]), PromptStyle(meta.get("prompt_style", PromptStyle.TASK.value)).value))
    return keys


def check_not_fitted_on(
    manifest: Manifest, runs: Sequence[Path], texts: Sequence[TextTrace], unchecked_training_runs: bool = False
) -> None:
    """Refuse answers the regressor was fitted on: by run folder, and by answer where its runs are on disk.
    Where they are not (the artifact came from elsewhere), nothing could be checked: refuse that too, unless
    the caller vouches for the answers."""
    missing = [run for run in manifest.training.get("runs", []) if not (Path(run) / RUN_FILE).is_file()]
    if missing and not unchecked_training_runs:
        raise SystemExit(
            f"the artifact's training runs are not on disk ({', '.join(missing)}), so these answers cannot be checked "
            "against them: regenerate them there, or pass --unchecked-training-runs if these are other answers"
        )
    fitted_runs = {Path(run).resolve() for run in manifest.training.get("runs", [])}
    reused = [str(run) for run in runs if Path(run).resolve() in fitted_runs]
    if reused:
        raise SystemExit(f"the artifact's regressor was fitted on {', '.join(reused)}: blend on other answers")
    overlap = fitted_keys(manifest) & {t.answer_key for t in texts}
    if overlap:
        raise SystemExit(f"{len(overlap)} answers were in the regressor's training runs: blend on other answers")


def run_blend(
    artifact_dir: Path,
    runs: Sequence[Path],
    weights: Sequence[float] = WEIGHTS,
    folds: int = 5,
    seed: int = 0,
    force: bool = False,
    resamples: int = 1000,
    candidate: str | None = None,
    unchecked_training_runs: bool = False,
) -> Manifest:
    """Choose the blend on `runs` (or take the named `candidate`), cross-validate it, and install it in
    the artifact if kept (or `force`). The artifact's thresholds for the blend come from `calibrate`, run next."""
    artifact = load_artifact(artifact_dir)
    # The blend is installed in this artifact and served on its model: answers of another model, or runs
    # without the lags its TAD reads, cannot choose it.
    check_runs_match(runs, artifact)
    texts = list(iter_texts(runs))
    if not texts:
        raise SystemExit("the runs hold no answers")
    check_no_duplicates(t.answer_key for t in texts)
    check_not_fitted_on(artifact.manifest, runs, texts, unchecked_training_runs)
    # The artifact's own TAD, without any blend it already has: the blend is chosen afresh.
    bare = artifact.manifest.model_copy(update={"blend": None})
    scored = uncertainty_table(replace(artifact, manifest=bare), texts)
    options = candidates(weights)
    table = terms_table(scored, options)
    answers = answers_of(table, texts)
    if not answers.informative_groups and not (force and candidate is not None):
        raise SystemExit(
            "no dataset/prompt-style group has an informative accuracy: nothing to choose a blend on "
            "(--force with --candidate installs a named one)"
        )
    everything = np.ones(len(texts), dtype=bool)
    standardisation, grid = evaluate_candidates(answers, everything, options)
    names = [option.name for option in options]
    if candidate is not None and candidate not in names:
        raise SystemExit(f"--candidate {candidate!r} is not one of: {'; '.join(names)}")
    best = options[names.index(candidate)] if candidate is not None else options[choose(grid)]
    validation = cross_validate(answers, options, folds, seed, resamples, best if candidate is not None else None)
    install = force or validation["kept"]
    logger.info(
        "blend: chose %s (within-group PRR %.3f vs TAD %.3f); cross-validated gain %+.3f %s: %s",
        best.name,
        grid[options.index(best)]["within_group_prr"],
        grid[0]["within_group_prr"],
        validation["gain"]["mean"],
        validation["gain"]["ci95"],
        "installed" if install else "not installed",
    )
    metrics = {
        "runs": [str(run) for run in runs],
        "n": len(texts),
        "informative_groups": answers.informative_groups,
        "pooled_tolerance": POOLED_TOLERANCE,
        "chosen": best.name,
        "chosen_by": "named (--candidate)" if candidate is not None else "grid",
        "candidates": grid,
        "cv": validation,
        "installed": install,
        "forced": bool(force and not validation["kept"]),
    }
    blend = BlendInfo(terms=standardisation.terms(best)) if install and best.name != TAD_ALONE else None
    manifest = artifact.manifest.model_copy(
        update={
            "blend": blend,
            "decision_method": _decision_method_with(blend, artifact.manifest.decision_method),
            "metrics": {**artifact.manifest.metrics, "blend": metrics},
        }
    )
    return write_manifest(artifact.path, manifest)


def _decision_method_with(blend: BlendInfo | None, current: Method | None) -> Method | None:
    """The decision method once the blend is installed or removed: the blend decides where TAD did (it is TAD
    as shipped); a free score that the decision rule preferred stays."""
    if blend is not None and current in (None, Method("tad")):
        return Method("tad_blend")
    if blend is None and current is Method("tad_blend"):
        return Method("tad")
    return current
