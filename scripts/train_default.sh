#!/usr/bin/env bash
# Rebuilds the default artifact (models/smollm2-135m-instruct-tad) and its report from the
# shared data: generate on the train and dev splits, fit, calibrate on dev, evaluate on dev.
# Every step resumes if interrupted. About 3 hours on 2 CPU cores, most of it generation.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
DATA=${DATA:-../shared/data}
RUNS=${RUNS:-runs}
OUT=${OUT:-models/smollm2-135m-instruct-tad}
DATASETS=(squad mmlu truthfulqa)

files() { local split=$1; for name in "${DATASETS[@]}"; do printf '%s ' "$DATA/${name}_${split}.jsonl"; done; }

# shellcheck disable=SC2046
$PY -m training generate --data $(files train) --out "$RUNS/smollm2-train" --batch-size 16
# shellcheck disable=SC2046
$PY -m training generate --data $(files dev) --out "$RUNS/smollm2-dev" --batch-size 16
$PY -m training fit "$RUNS/smollm2-train" --out "$OUT"
$PY -m training calibrate --artifact "$OUT" --run "$RUNS/smollm2-dev" \
    --coverage 0.5 0.8 0.9 --error 0.3 0.4 0.5 --delta 0.05 --default-target error@0.4
$PY -m training evaluate --artifact "$OUT" --run "$RUNS/smollm2-dev" --out "$OUT/report"
