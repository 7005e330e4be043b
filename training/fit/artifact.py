"""Writing the artifact folder a fit makes, and swapping it into place.

It is written into a sibling folder and moved to `--out` when complete: a fit killed midway leaves
`--out` as it was, never regressors without their manifest. A refit in place (as
scripts/train_smollm2.sh does) keeps what lay beside the old artifact's own files: its reports and
calibration runs.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import joblib

from app.files import sync_folder, sync_tree
from app.uncertainty.artifact import MANIFEST_NAME, ArtifactError, Manifest, read_manifest, write_manifest
from app.uncertainty.tad import Regressor
from training.fit.report import CV_REPORT, write_cv_report
from training.progress import PROGRESS_SUFFIX
from training.runs import RUN_FILE, read_run_settings

logger = logging.getLogger(__name__)

REPORTS = CV_REPORT.parent.name  # the folder of the artifact's reports: cv.json and evaluate's, lodo's ...


def check_out(out: Path, runs: Sequence[Path]) -> None:
    """Refuse an --out the artifact cannot replace, before the minutes of cross-validation rather than after."""
    if out.exists() and not out.is_dir():
        raise SystemExit(f"--out {out} is a file: give a folder for the artifact")
    finish_interrupted_swap(out)  # else an artifact a killed fit left aside would escape the checks below
    if (out / RUN_FILE).is_file():
        raise SystemExit(f"--out {out} is a generation run: give another folder for the artifact")
    # The artifact folder is replaced as a whole at the end: a folder holding the runs must not be it.
    resolved = out.resolve()
    for run in runs:
        if resolved == Path(run).resolve() or resolved in Path(run).resolve().parents:
            raise SystemExit(f"--out {out} holds the run {run}: give another folder for the artifact")
    if out.is_dir() and any(out.iterdir()):
        _check_replaceable(out, runs)


def _check_replaceable(out: Path, runs: Sequence[Path]) -> None:
    """A folder that is not empty is replaced only if it is an artifact of the runs' model: a refit in place."""
    if not (out / MANIFEST_NAME).is_file():
        raise SystemExit(
            f"--out {out} is a folder with other files in it and no artifact: give a new or empty folder, or the "
            "artifact to refit"
        )
    try:
        artifact_model = read_manifest(out).llm
    except ArtifactError as error:
        raise SystemExit(
            f"--out {out} holds an artifact this code cannot read ({error}): give another folder"
        ) from None
    models = {str(read_run_settings(Path(run))["model_sha256"]) for run in runs}
    if artifact_model.sha256 not in models:
        raise SystemExit(
            f"--out {out} is the artifact of another model ({artifact_model.name}): refitting it on these runs would "
            "replace it, calibration and reports included; give another folder"
        )


def write_artifact(
    out: Path, manifest: Manifest, regressors: Mapping[str, Regressor], cv_record: dict[str, Any]
) -> Manifest:
    """The artifact at `out`: `regressors` (by path in the folder), the CV record as report/cv.json and the
    manifest (with every regressor's sha256), written beside `out` and then moved into place."""
    staging = out.parent / f".{out.name}.partial"
    shutil.rmtree(staging, ignore_errors=True)  # a killed fit's leftovers
    staging.mkdir(parents=True)
    for name, regressor in regressors.items():
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        joblib.dump(regressor, staging / name)
    write_cv_report(staging, cv_record)
    written = write_manifest(staging, manifest)
    sync_tree(staging)  # the regressors on disk before the rename makes them the artifact (and the old one goes)
    install_artifact(staging, out)
    return written


def install_artifact(staging: Path, out: Path) -> None:
    """Move the finished artifact `staging` (a sibling of `out`) to `out`, replacing an artifact already there
    (a refit in place, as scripts/train_smollm2.sh does). Renames only: at every moment `out` is the old
    artifact, the new one, or (between two renames) absent, never a mix. What lies beside the old artifact's
    own files (its README, calibration runs) is carried over to the new one; its reports are not (they
    describe the old regressor)."""
    finish_interrupted_swap(out)
    if not out.exists():
        os.replace(staging, out)
        sync_folder(out.parent)
        return
    old = out.with_name(f".{out.name}.replaced-{os.getpid()}")
    os.replace(out, old)
    os.replace(staging, out)
    sync_folder(out.parent)
    _carry_over(old, out)


def finish_interrupted_swap(out: Path) -> None:
    """A fit killed between its renames left the old artifact aside: put it back where `out` is missing, or
    carry what lay beside it over to the new one that is in place."""
    for leftover in sorted(out.parent.glob(f".{out.name}.replaced-*")):
        if out.exists():
            _carry_over(leftover, out)
        else:
            logger.warning("restoring %s, left aside by an interrupted fit", out)
            os.replace(leftover, out)


def _carry_over(old: Path, out: Path) -> None:
    """Move what lay beside the old artifact's own files into `out`, then remove the old artifact."""
    for item in old.iterdir():
        # The old regressors, alternatives and manifest go: an earlier fit's alternatives would otherwise
        # stay beside the new ones and be hashed into the manifest as if they belonged to it.
        own = item.name in (MANIFEST_NAME, "alternatives") or item.suffix == ".joblib"
        if item.name == REPORTS and item.is_dir():
            _carry_over_reports(item, out / REPORTS, out)
        elif not own:
            _move_missing(item, out / item.name)
    shutil.rmtree(old)


def _carry_over_reports(old: Path, new: Path, out: Path) -> None:
    """The old report/ folder's reports describe the old regressor: beside the new cv.json they would pass for
    the new one's, so they go. What was generated there (evaluate's answers, a run folder) depends on the model
    alone, and a stopped command's progress store on its own key: both are kept."""
    dropped: list[str] = []

    def walk(folder: Path, target: Path) -> None:
        for item in sorted(folder.iterdir()):
            keep = item.is_dir() and ((item / RUN_FILE).is_file() or item.name.endswith(PROGRESS_SUFFIX))
            if keep:
                target.mkdir(parents=True, exist_ok=True)
                _move_missing(item, target / item.name)
            elif item.is_dir() and not item.is_symlink():
                walk(item, target / item.name)
            elif item.name != CV_REPORT.name or folder != old:  # the new fit wrote its own cv.json
                dropped.append(item.relative_to(old).as_posix())

    walk(old, new)
    if dropped:
        logger.warning(
            "%s: the replaced artifact's reports are removed (%s); evaluate the new one", out, ", ".join(dropped)
        )


def _move_missing(item: Path, target: Path) -> None:
    """Move `item` to `target` unless the new artifact has it; a folder both have is merged, the new artifact's
    files winning."""
    if not target.exists():
        os.replace(item, target)
    elif item.is_dir() and not item.is_symlink() and target.is_dir():
        for child in item.iterdir():
            _move_missing(child, target / child.name)
