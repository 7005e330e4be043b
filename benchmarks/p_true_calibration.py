"""Follow-up of docs/experiments/p-true.md: the calibration-only recipe with P(True) as the decision.

P(True) (the experiment's definition) on the committed calibration-only artifact's answers, its
thresholds certified as `calibration-artifact` certifies them, and issue 48's conditions at the
default target on the chat dev answers and the made-up premises (from `benchmarks.p_true`'s
`<out>/dev_scores.json` and `<out>/results.json`).

    python -m benchmarks.p_true_calibration --out /work/runs/p-true
"""

import argparse
import json
from pathlib import Path

import numpy as np

from app.engine.engine import Engine
from app.engine.loading import load_model
from app.settings import DEFAULT_CACHE_DIR, DEFAULT_MODEL
from app.uncertainty.methods import Method
from benchmarks.p_true import INFORMATIVE, p_true_scores, user_turn
from training.calibration import KEEP_HALF, CalibrationTargets, calibrate_thresholds
from training.calibration_artifact import CalibrationArtifactOptions, selection_part
from training.rejection import CORRECT_THRESHOLD
from training.runs import iter_texts

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--out", type=Path, required=True)
parser.add_argument("--calibration-run", type=Path, default=Path("/work/runs/qwen-calib-50"))
parser.add_argument(
    "--dev", type=Path, nargs="+", default=[Path("/work/runs/qwen-dev-chat"), Path("/work/runs/qwen-dev-chat-extra")]
)
args = parser.parse_args()
OUT = args.out
calib = list(iter_texts([args.calibration_run]))
cached = OUT / "calibration_scores.json"
if cached.is_file():
    cal_scores = np.array(json.loads(cached.read_text()))
else:
    engine = Engine(load_model(DEFAULT_MODEL, dtype="bfloat16", cache_dir=DEFAULT_CACHE_DIR), n_lags=0)
    cal_scores = p_true_scores(engine, [(user_turn(t.meta), t.meta["answer"]) for t in calib])
    cached.write_text(json.dumps(cal_scores.tolist()))
quality = np.array([t.target for t in calib])
options = CalibrationArtifactOptions(out=Path("."), runs=())
certifying = ~selection_part(calib, options.selection_share, options.seed)
method = Method("p_true")
targets = CalibrationTargets(options.coverages, options.errors, options.delta, options.seed, default_target=KEEP_HALF)
calibration = calibrate_thresholds({"p_true": cal_scores[certifying]}, quality[certifying], [method], method, targets)
default = calibration.default_target
assert default is not None
entry = calibration.thresholds[method][default]
print(
    f"certification answers {int(certifying.sum())}, default {default}, threshold {entry.threshold:.4f}, "
    f"coverage {entry.coverage:.3f}, error {entry.error:.3f}"
)
dev = [t for t in iter_texts(args.dev) if t.meta["dataset"] in INFORMATIVE]
dev_scores = np.array(json.loads((OUT / "dev_scores.json").read_text()))
dev_quality = np.array([t.target for t in dev])
dev_datasets = np.array([t.meta["dataset"] for t in dev])


def share(values: np.ndarray) -> str:
    return f"{values.mean():.1%}" if len(values) else "n/a"


def report(name: str, mask: np.ndarray) -> None:
    correct = dev_quality[mask] >= CORRECT_THRESHOLD
    accepted = dev_scores[mask] <= entry.threshold
    print(
        f"{name}: n {int(mask.sum())}, accepted {share(accepted)}, error among accepted {share(~correct[accepted])}, "
        f"error accepting all {share(~correct)}, correct kept {share(accepted[correct])}"
    )
    for dataset in INFORMATIVE:
        m = dev_datasets[mask] == dataset
        a, c = accepted[m], correct[m]
        print(f"   {dataset}: accepted {share(a)}, its error {share(~c[a])}, all {share(~c)}, kept {share(a[c])}")


report("dev", np.ones(len(dev), dtype=bool))
report("dev, the first 100 records per dataset", np.array([int(t.meta["line"]) <= 100 for t in dev]))
premises = json.loads((OUT / "results.json").read_text())["false_premises"]
print("made-up premises rejected:", sum(r["p_true"] > entry.threshold for r in premises), "of", len(premises))
