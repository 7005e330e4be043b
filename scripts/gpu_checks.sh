#!/bin/bash
# The GPU checks of docs/performance.md (GPU) as two device calls, for a session that is lent a machine.
#
# The device image has torch, CUDA and a Python, but not this project's other runtime packages, and
# reaches no package index. Prepare their wheels here first, for the device's Python (its pydantic_core
# wheel is the only one built per Python version; 3.12 when this was written), into the ignored .whl/:
#
#   pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl \
#       annotated_doc==0.0.7 annotated_types==0.8.0 fastapi==0.165.0 fastapi_offline==1.7.7 gguf==0.19.0 \
#       opentelemetry_api==1.45.2 pydantic==2.14.3 pydantic_core==2.50.4 pydantic_settings==2.16.3 \
#       python_dotenv==1.2.4 starlette==1.10.0 transformers==5.23.0 typing_inspection==0.4.5 uvicorn==0.54.0
#
# then run it through the device tool with `carry: [".whl"]`, in two calls of at most 600 s each (a call's
# limit), the first the one that matters most:
#   bash scripts/gpu_checks.sh step      (timeout_s 600)
#     1. benchmarks.graph_decode --check: the CUDA-graph step, and inductor's kernels in a graph, against
#        each sequence decoded alone;
#     2. benchmarks.graph_decode --time --variants product: tokens/s and `graph_vs_limit` (issue 49's target:
#        >= 0.40 of the memory-bandwidth limit);
#     3. the same with --variants inductor: `inductor_graph_vs_limit`, in a process of its own (inductor
#        compiles an 8B step for minutes on a cold cache: past its limit, it takes no other number with it);
#   bash scripts/gpu_checks.sh serving   (timeout_s 330)
#     4. benchmarks.serving with the decode step as CUDA graphs (captured at startup), then eager.
# Outputs are printed as they come and left under $OUT. Each step has its own time limit, so that one
# hanging leaves the others their minutes; a step that fails or runs out of time says so.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-checks}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "installing the wheels from .whl/ failed"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__)"
started=$(date +%s)
elapsed() { echo "$1 done at $(($(date +%s) - started)) s"; }
# step NAME LIMIT COMMAND...: COMMAND under `timeout LIMIT`, its output (warnings left out) shown line by line
# and kept in $OUT/NAME.txt.
step() {
    local name=$1 limit=$2
    shift 2
    timeout "$limit" "$@" 2>&1 | grep --line-buffered -v Warning | tee "$OUT/$name.txt"
    local status=${PIPESTATUS[0]}
    [ "$status" = 0 ] || echo "$name exited with $status (124: past its $limit s)"
    elapsed "$name"
}

part=${1:-step}
if [ "$part" = step ]; then
    step check 170 python3 -m benchmarks.graph_decode --check
    shape=(--model llama --batch 32 --prompt-tokens 128 --new-tokens 128 --repeats 2)
    step time 190 python3 -m benchmarks.graph_decode --time "${shape[@]}" --variants product
    step time_inductor 180 python3 -m benchmarks.graph_decode --time "${shape[@]}" --variants inductor
elif [ "$part" = serving ]; then
    TAD_COMPILED_DECODE_LENGTH=288 timeout 160 python3 -m benchmarks.serving --model llama --clients 32 \
        --requests 64 --repeats 1 --port 8791 > "$OUT/serving_graphs.txt" 2>&1
    tail -30 "$OUT/serving_graphs.txt"
    elapsed "serving, CUDA graphs"
    timeout 130 python3 -m benchmarks.serving --model llama --clients 32 --requests 64 --repeats 1 --port 8792 \
        > "$OUT/serving_eager.txt" 2>&1
    tail -30 "$OUT/serving_eager.txt"
    elapsed "serving, eager"
else
    echo "usage: bash scripts/gpu_checks.sh [step|serving]"
    exit 2
fi
