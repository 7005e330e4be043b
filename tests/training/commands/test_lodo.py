"""Leave one dataset out on the tiny model's runs."""

from __future__ import annotations

import json
from pathlib import Path

from training.cli import main


def test_every_dataset_is_held_out_once(tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path) -> None:
    main(
        [
            "lodo",
            str(tiny_runs["train"]),
            "--test",
            str(tiny_runs["dev"]),
            "--artifact",
            str(tiny_artifact),
            "--out",
            str(tmp_path),
            "--bootstrap",
            "50",
        ]
    )
    report = json.loads((tmp_path / "lodo.json").read_text())
    assert set(report["datasets"]) == {"squad", "mmlu"}
    for entry in report["datasets"].values():
        assert entry["n"] == 16 and entry["train_texts"] == 24  # fitted on the other dataset only
        assert {"tad", "msp", "perplexity"} <= set(entry["prr"])
    assert (tmp_path / "lodo.md").read_text().startswith("Leave one dataset out")
