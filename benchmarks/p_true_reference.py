"""Study script (docs/experiments/p-true-reference.md): P(True) against MSP on answers no decision has seen.

Rule 1 of that page: mean within-dataset PRR of P(True) minus MSP over the informative datasets, paired
bootstrap 95% interval (resamples within each dataset); beside it P(True) minus the best other free score.
Rule 2: the artifact's default policy on the same answers (`training evaluate` reports it too).

    python -m benchmarks.p_true_reference --artifact DIR --run /work/runs/qwen-dev-chat-fresh
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from app.uncertainty.artifact import load_artifact
from app.uncertainty.methods import BASELINES
from training.calibration_artifact import within_dataset_samples
from training.check_pass_scores import CheckPassOptions, p_true_values
from training.method_scores import baseline_table
from training.policy_outcome import default_policy_outcome
from training.rejection import interval, prediction_rejection_ratio
from training.runs import iter_texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifact", type=Path, required=True)
    parser.add_argument("--run", type=Path, nargs="+", required=True)
    parser.add_argument("--resamples", type=int, default=1000)
    args = parser.parse_args()
    texts = list(iter_texts(args.run))
    table = baseline_table([t.token_trace() for t in texts])
    table["p_true"] = p_true_values(args.run, texts, CheckPassOptions())
    quality = np.array([t.target for t in texts])
    datasets = np.array([t.dataset for t in texts])
    samples, names = within_dataset_samples(table, quality, datasets, args.resamples, seed=0)
    prr = {
        name: {m: prediction_rejection_ratio(v[datasets == name], quality[datasets == name]) for m, v in table.items()}
        for name in names
    }
    means = {m: float(np.mean([prr[name][m] for name in names])) for m in table}
    best_other = max((m.value for m in BASELINES), key=lambda m: means[m])
    result: dict[str, Any] = {
        "informative_datasets": names,
        "n": {name: int((datasets == name).sum()) for name in names},
        "prr": prr,
        "mean_prr": means,
        "p_true_minus_msp": [means["p_true"] - means["msp"], interval(samples["p_true"] - samples["msp"])],
        "best_other": best_other,
        "p_true_minus_best_other": [
            means["p_true"] - means[best_other],
            interval(samples["p_true"] - samples[best_other]),
        ],
    }
    artifact = load_artifact(args.artifact)
    groups = {str(name): [int(i) for i in np.flatnonzero(datasets == name)] for name in sorted(set(datasets))}
    result["default_policy"] = default_policy_outcome(artifact, table, quality, groups)
    print(json.dumps(result, indent=2, default=float))


if __name__ == "__main__":
    main()
