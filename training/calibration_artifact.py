"""A calibration-only artifact: decisions for a model no regressor was trained for yet.

From a few hundred labelled answers (generated here, resumably), with no regressor: the free
methods' thresholds and a decision method. The records are split in two by record: on the
*selection* part the decision method is chosen by the rule trained artifacts use
(training/decision_rule.py: a reference unless the best other free score beats it with a paired
95% interval of the gain excluding 0); on the *certification* part, which the choice never saw,
every threshold is chosen and its guarantee holds (training/thresholds.py). Besides the scores of
the answers' own tokens, P(True) is a candidate, and the reference, when the model can be asked
about its answers (a check pass per answer, training/check_pass_scores.py); MSP is the reference
otherwise. The server loads the artifact like any other: decisions on, `tad` null with the reason.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from app.files import write_text_atomic
from app.identity import ModelIdentity
from app.numeric import finite_tree
from app.uncertainty.artifact import FeatureInfo, Manifest, write_manifest
from app.uncertainty.features import Convention, FeatureSpec
from app.uncertainty.methods import BASELINES, Method
from training.calibration import KEEP_HALF, CalibrationTargets, calibrate_thresholds, check_default
from training.check_pass_scores import CHECKED, CheckPassOptions, check_pass_table
from training.decision_rule import DecisionRule, choose
from training.method_scores import baseline_table
from training.rejection import accuracy, informative, interval, paired_bootstrap_prr, prediction_rejection_ratio
from training.runs import TextTrace, check_no_duplicates, check_run_folders, iter_texts, read_run_settings, run_dtype
from training.tasks import PromptStyle

logger = logging.getLogger(__name__)

REFERENCE = Method("msp")  # the rule's reference where P(True) is not a candidate
REPORT = Path("report") / "report.json"


@dataclass(frozen=True)
class CalibrationArtifactOptions:
    out: Path
    runs: Sequence[Path]
    coverages: Sequence[float] = (0.5, 0.8, 0.9)
    errors: Sequence[float] = tuple(round(0.05 * k, 2) for k in range(1, 19))  # 0.05 .. 0.9
    delta: float = 0.05
    seed: int = 0
    selection_share: float = 0.5  # of the records, for choosing the method; the rest certifies its thresholds
    resamples: int = 2000  # the decision rule reads a tail of 0.05/2K of them for K challengers
    check_pass: CheckPassOptions | None = None  # None: P(True) is not a candidate (no second pass per answer)


def selection_part(texts: Sequence[TextTrace], share: float, seed: int) -> np.ndarray:
    """Which texts choose the method (True) and which certify the thresholds (False): by a hash of the record,
    so one record asked in two styles falls on one side, and the split does not depend on the order of runs."""

    def draw(key: str) -> float:
        digest = hashlib.sha256(f"{seed}|{key}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    return np.array([draw(text.key) < share for text in texts])


def within_dataset_samples(
    table: dict[str, np.ndarray], quality: np.ndarray, datasets: np.ndarray, resamples: int, seed: int
) -> tuple[dict[str, np.ndarray], list[str]]:
    """Each method's mean PRR over the informative datasets, on `resamples` paired bootstrap resamples drawn
    within each dataset; and those datasets (accuracy in [0.1, 0.9])."""
    names = sorted({str(d) for d in datasets if informative(accuracy(quality[datasets == d]))})
    samples = {method: np.zeros(resamples) for method in table}
    for offset, name in enumerate(names):
        members = np.flatnonzero(datasets == name)
        per_method = paired_bootstrap_prr(
            {m: values[members] for m, values in table.items()}, quality[members], resamples, seed + offset
        )
        for method, values in per_method.items():
            samples[method] += values / len(names)
    return samples, names


def per_dataset_table(
    table: dict[str, np.ndarray], quality: np.ndarray, datasets: np.ndarray, resamples: int, seed: int
) -> dict[str, dict[str, Any]]:
    """PRR of every method per dataset, with its bootstrap interval, accuracy and n."""
    report: dict[str, dict[str, Any]] = {}
    for name in sorted({str(d) for d in datasets}):
        members = np.flatnonzero(datasets == name)
        samples = paired_bootstrap_prr({m: v[members] for m, v in table.items()}, quality[members], resamples, seed)
        report[name] = {
            "n": len(members),
            "accuracy": accuracy(quality[members]),
            "prr": {m: prediction_rejection_ratio(v[members], quality[members]) for m, v in table.items()},
            "prr_ci95": {m: interval(samples[m]) for m in table},
        }
    return report


def _identity_and_settings(runs: Sequence[Path]) -> tuple[ModelIdentity, dict[str, Any]]:
    settings = [read_run_settings(Path(run)) for run in runs]
    if len({s["model_sha256"] for s in settings}) > 1 or len({run_dtype(s) for s in settings}) > 1:
        raise SystemExit("the runs were generated with different models or dtypes: give runs of one model")
    return ModelIdentity.model_validate(settings[0]["identity"]), settings[0]


def build_calibration_artifact(options: CalibrationArtifactOptions) -> Manifest:
    check_run_folders(options.runs)
    identity, settings = _identity_and_settings(options.runs)
    texts = list(iter_texts(options.runs))
    if not texts:
        raise SystemExit("the runs hold no answers: nothing to calibrate on")
    check_no_duplicates(t.answer_key for t in texts)
    table = baseline_table([t.token_trace() for t in texts])
    methods = list(BASELINES)
    if options.check_pass is not None and _checkable(texts):
        table.update(check_pass_table([CHECKED], options.runs, texts, options.check_pass))
        methods.append(Method(CHECKED))
    quality = np.array([t.target for t in texts])
    datasets = np.array([t.dataset for t in texts])
    selecting = selection_part(texts, options.selection_share, options.seed)
    if selecting.all() or not selecting.any():
        raise SystemExit("too few records to split into a selection and a certification part")
    samples, informative_datasets = within_dataset_samples(
        {m: v[selecting] for m, v in table.items()},
        quality[selecting],
        datasets[selecting],
        options.resamples,
        options.seed,
    )
    if not informative_datasets:
        raise SystemExit(
            "no dataset's accuracy lies in [0.1, 0.9] on the selection records: the answers cannot tell a "
            "good score from a bad one"
        )
    # A few hundred records rarely separate two scores, so the reference is usually what ships: P(True) where
    # the model can be asked, the score with the best evidence (docs/experiments/p-true-reference.md).
    reference = CHECKED if CHECKED in table else REFERENCE.value
    rule: DecisionRule = choose(reference, samples, "bootstrap")
    decision = Method(rule.chosen)
    certifying = ~selecting
    targets = CalibrationTargets(options.coverages, options.errors, options.delta, options.seed)
    default_target, default_rule = _default_target(table, quality, selecting, decision, targets)
    calibration = calibrate_thresholds(
        {m: v[certifying] for m, v in table.items()},
        quality[certifying],
        methods,
        decision,
        replace(targets, default_target=default_target),
    )
    check_default(calibration, decision, options.errors)
    spec = FeatureSpec(
        n_lags=int(settings["n_lags"]),
        num_layers=identity.num_layers,
        num_heads=identity.num_heads,
        convention=Convention.GENERATING,
    )
    runs = [str(Path(run).resolve()) for run in options.runs]
    split = {
        "by": "record",
        "selection_share": options.selection_share,
        "seed": options.seed,
        "selection_answers": int(selecting.sum()),
        "certification_answers": int(certifying.sum()),
        "default_target": default_rule,
    }
    manifest = Manifest(
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        llm=identity,
        dtype=run_dtype(settings),
        features=FeatureInfo.of(spec),
        decision_method=decision,
        thresholds=calibration.thresholds,
        default_target=calibration.default_target,
        metrics={
            "decision": finite_tree({**rule.as_dict(), "informative_datasets": informative_datasets, "split": split}),
            "calibration": {"runs": runs, "part": "certification", **calibration.record},
        },
        training={"runs": runs, "texts": len(texts), "kind": "calibration-only"},
    )
    report = {
        "decision": manifest.metrics["decision"],
        "certification": per_dataset_table(
            {m: v[certifying] for m, v in table.items()},
            quality[certifying],
            datasets[certifying],
            options.resamples,
            options.seed,
        ),
    }
    return _write(options.out, manifest, report)


def _default_target(
    table: dict[str, np.ndarray],
    quality: np.ndarray,
    selecting: np.ndarray,
    decision: Method,
    targets: CalibrationTargets,
) -> tuple[str, str]:
    """The default target, chosen by `keep-half` on the selection records, and how it was chosen. Named before
    the certification labels are seen, its certificate there holds at 1 - delta; `keep-half` on the same labels
    would hold only at 1 - K delta over the K targets it picks from. A choice the certification records do not
    certify gives way to `keep-half` on them (said so in the manifest)."""
    on_selection = calibrate_thresholds(
        {m: v[selecting] for m, v in table.items()},
        quality[selecting],
        [decision],
        decision,
        replace(targets, default_target=KEEP_HALF),
    )
    chosen = on_selection.default_target
    certifying = ~selecting
    certified = calibrate_thresholds(
        {decision.value: table[decision.value][certifying]}, quality[certifying], [decision], decision, targets
    ).thresholds[decision]
    if chosen is not None and chosen in certified:
        return chosen, f"{KEEP_HALF} on the selection records: {chosen}, certified at 1 - delta"
    logger.warning(
        "the selection records' default %s is not certified on the certification records: keep-half there, whose "
        "confidence is the union bound's",
        chosen,
    )
    return KEEP_HALF, f"{KEEP_HALF} on the certification records (the selection's {chosen} not certified there)"


def _checkable(texts: Sequence[TextTrace]) -> bool:
    """Whether the answers were generated for a user turn the check can quote (a few-shot prompt has none, and
    the base models asked that way usually have no chat template to ask under either)."""
    if any(text.prompt_style is PromptStyle.FEW_SHOT for text in texts):
        logger.warning("few-shot answers have no user turn for the check to quote: P(True) is not a candidate")
        return False
    return True


def refuse_trained_artifact(out: Path, error: type[BaseException] = SystemExit) -> None:
    """A calibration-only artifact never replaces a trained one (its regressor would be orphaned)."""
    if (out / "regressor.joblib").exists():
        raise error(f"{out} holds a trained artifact: write the calibration-only one elsewhere")


def _write(out: Path, manifest: Manifest, report: dict[str, Any]) -> Manifest:
    """The manifest and its report, into `out` (created; an existing artifact's regressor is not kept)."""
    refuse_trained_artifact(out)
    # The manifest does not hash the report: an earlier artifact's goes before the new manifest, and the new
    # report comes after it, so that a kill never leaves a loadable artifact beside another run's report.
    out.mkdir(parents=True, exist_ok=True)
    (out / REPORT).unlink(missing_ok=True)
    written = write_manifest(out, manifest)
    (out / REPORT).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / REPORT, json.dumps(finite_tree(report), indent=2, allow_nan=False) + "\n")
    chosen = written.metrics["decision"]
    gain = chosen["gain"]
    logger.info(
        "decision method %s (best other: %s, gain %s, interval %s)",
        chosen["chosen"],
        chosen["challenger"],
        "n/a" if gain is None or (isinstance(gain, float) and math.isnan(gain)) else f"{gain:+.3f}",
        chosen["interval"],
    )
    return written
