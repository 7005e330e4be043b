"""Where `evaluate` and `calibrate` get their traces: existing runs, or a new (resumable) one."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from app.uncertainty.artifact import TadArtifact
from training.generation import GenerateOptions, run_generate
from training.runs import RUN_FILE, check_run_folders, read_run_settings, record_keys, run_dtype
from training.tasks import PromptStyle

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunSource:
    """Where the traces come from: existing runs (e.g. a run and its extension made with --skip), or a
    new (resumable) one generated here."""

    data: Sequence[Path]
    runs: Sequence[Path]
    default_run_dir: Path
    model: str | None = None
    limit: int | None = None
    batch_size: int = 16
    max_new_tokens: int | None = None
    device: str = "auto"
    cache_dir: Path | None = None
    prompt_style: PromptStyle = PromptStyle.TASK
    # The option that sets `default_run_dir` on the command line (named when a rerun's settings differ).
    run_dir_option: str = "--out"


def check_runs_match(runs: Sequence[Path], artifact: TadArtifact) -> None:
    """Refuse runs the artifact cannot score: made with another model (its features would be another
    model's) or in another dtype than its answers (the server runs the model in the artifact's dtype, and
    answers generated in another have other features and scores: a threshold certified on them would not
    hold), or storing fewer attention lags than the artifact's features read."""
    check_run_folders(runs)
    for run in runs:
        settings = read_run_settings(Path(run))
        if settings.get("model_sha256") != artifact.manifest.llm.sha256:
            raise SystemExit(f"run {run} was generated with another model than the artifact's")
        if run_dtype(settings) != artifact.manifest.dtype:
            raise SystemExit(
                f"run {run} was generated in {run_dtype(settings)}, the artifact's answers in {artifact.manifest.dtype}"
                f" (as the server runs its model): generate in {artifact.manifest.dtype}"
            )
        if int(settings.get("n_lags", 0)) < artifact.n_lags:
            raise SystemExit(f"run {run} stores {settings.get('n_lags')} lags; the artifact needs {artifact.n_lags}")


def check_held_out(artifact: TadArtifact, keys: Iterable[str], use: str) -> None:
    """Refuse answers to records the artifact's regressor was fitted on (its `training.runs`, by record key:
    both prompt styles of a question count): scored in-sample, TAD would look better than it is, and a
    threshold certified on them would promise an error rate the service does not have. `use` says what the
    answers were for ("calibrate on", "evaluate on"). Runs the fit read that are not on this machine cannot
    be checked: said, not refused."""
    fitted_runs = [Path(run) for run in artifact.manifest.training.get("runs", [])]
    if not fitted_runs:  # a calibration-only artifact: nothing was fitted
        return
    absent = [str(run) for run in fitted_runs if not (run / RUN_FILE).is_file()]
    if absent:
        logger.warning(
            "the runs the artifact was fitted on are not all here (%s): that these answers were held out from its "
            "fit is not checked",
            ", ".join(absent),
        )
        return
    overlap = sorted(set(keys) & record_keys(fitted_runs))
    if overlap:
        raise SystemExit(
            f"{len(overlap)} of the records to {use} (e.g. {overlap[0]}) are among those the artifact was fitted on "
            f"({', '.join(map(str, fitted_runs))}): its scores on them are in-sample. Use held-out answers (a dev "
            "split)"
        )


def obtain_runs(source: RunSource, artifact: TadArtifact) -> list[Path]:
    """The runs to score with `artifact`: the given ones, checked against it, or one generated for it."""
    if source.runs:
        check_runs_match(source.runs, artifact)
        return list(source.runs)
    if not source.data:
        raise SystemExit("give --data files to generate from, or --run to reuse a run")
    options = GenerateOptions(
        data=source.data,
        out=source.default_run_dir,
        model=source.model or artifact.manifest.llm.source,
        n_lags=artifact.n_lags,
        limit=source.limit,
        max_new_tokens=source.max_new_tokens,
        batch_size=source.batch_size,
        device=source.device,
        # The artifact's features are those of answers generated in its dtype.
        dtype=artifact.manifest.dtype,
        cache_dir=source.cache_dir,
        prompt_style=source.prompt_style,
        out_option=source.run_dir_option,
        # Answers of another model would be scored with this artifact's thresholds (calibrate would rewrite
        # them): refused once the model is loaded, before anything is generated.
        expected_model_sha256=artifact.manifest.llm.sha256,
    )
    return [run_generate(options)]
