"""What an artifact's default policy does to answers it was not calibrated on, per dataset and overall: the
share accepted, the error among them against the error of accepting everything, and the share of the
correct answers kept (a policy that withholds most right answers is one users switch off)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from app.uncertainty.artifact import TadArtifact
from training.rejection import CORRECT_THRESHOLD


def outcome(values: np.ndarray, quality: np.ndarray, threshold: float) -> dict[str, Any]:
    """Accept an answer when its score is at most `threshold` (an empty answer, +inf, is rejected)."""
    accepted = values <= threshold
    correct = quality >= CORRECT_THRESHOLD
    return {
        "n": len(quality),
        "accepted": float(accepted.mean()) if len(quality) else None,
        "error_accepted": float(1 - correct[accepted].mean()) if accepted.any() else None,
        "error_all": float(1 - correct.mean()) if len(quality) else None,
        "correct_kept": float(accepted[correct].mean()) if correct.any() else None,
    }


def default_policy_outcome(
    artifact: TadArtifact, table: Mapping[str, np.ndarray], quality: np.ndarray, groups: Mapping[str, Sequence[int]]
) -> dict[str, Any] | None:
    """The default policy (the decision method at the default target) on these answers; None where the artifact
    has no calibrated default."""
    manifest = artifact.manifest
    method = artifact.decision_method
    entry = manifest.thresholds.get(method, {}).get(manifest.default_target or "")
    if entry is None or method.value not in table:
        return None
    values = table[method.value]
    return {
        "method": method.value,
        "target": manifest.default_target,
        "threshold": entry.threshold,
        "certified_error": entry.target if entry.kind == "error" else None,
        "datasets": {
            name: outcome(values[list(rows)], quality[list(rows)], entry.threshold) for name, rows in groups.items()
        },
        "overall": outcome(values, quality, entry.threshold),
    }


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def outcome_markdown(policy: Mapping[str, Any]) -> str:
    certified = policy["certified_error"]
    lines = [
        f"Default policy: {policy['method']} at {policy['target']} (threshold {policy['threshold']:.4f}"
        + (f", error among accepted certified at most {certified:g} on the calibration answers" if certified else "")
        + "):",
        "",
        "| dataset | n | accepted | error among accepted | error accepting all | correct answers kept |",
        "|---|---|---|---|---|---|",
    ]
    rows = [*policy["datasets"].items(), ("*overall*", policy["overall"])]
    for name, row in rows:
        cells = [row["accepted"], row["error_accepted"], row["error_all"], row["correct_kept"]]
        lines.append(f"| {name} | {row['n']} | " + " | ".join(_share(c) for c in cells) + " |")
    return "\n".join(lines)
