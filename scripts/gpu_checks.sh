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
#     2. benchmarks.graph_decode --time: tokens/s, `graph_vs_limit` and `inductor_graph_vs_limit`
#        (issue 49's target: >= 0.40 of the memory-bandwidth limit);
#   bash scripts/gpu_checks.sh serving   (timeout_s 330)
#     3. benchmarks.serving with the decode step as CUDA graphs (captured at startup), then eager.
# Outputs are printed as they come and left under $OUT. Each step has its own time limit, so that one
# hanging leaves the others their minutes.
set -u
OUT=${OUT:-/tmp/gpu-checks}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "installing the wheels from .whl/ failed"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__)"
started=$(date +%s)
elapsed() { echo "$1 done at $(($(date +%s) - started)) s"; }

part=${1:-step}
if [ "$part" = step ]; then
    timeout 200 python3 -m benchmarks.graph_decode --check 2>&1 | grep -v Warning | tee "$OUT/check.txt"
    elapsed check
    timeout 340 python3 -m benchmarks.graph_decode --time --model llama --batch 32 --prompt-tokens 128 \
        --new-tokens 128 --repeats 2 2>&1 | grep -v Warning | tee "$OUT/time.txt"
    elapsed time
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
