"""The server side of `benchmarks/serving.py`: the real app under uvicorn, plus plain `generate` on its model.

One process holds the model: it is loaded (or built from a config with random weights) before
uvicorn starts, the runtime's own loading is handed that object, and plain transformers
`generate` runs on the same object, in the same process, when the client asks for it between
two timed windows (`POST /bench/generate`). The client also resets and reads the worker's phase
clock (`app/engine/phase_timing.py`) and the threads' CPU times around each window.

Stop tokens are off on both sides (the engine's stop ids cleared, `generate` held to its length by
`min_new_tokens`), so every answer has exactly `--new-tokens` tokens: the two sides generate the same
number of tokens from prompts of the same length (`generate` takes the first `--clients`, the warm-up
round's).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import hashlib
import json
import logging
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from fastapi import FastAPI, Request
from transformers import LlamaConfig, PretrainedConfig, PreTrainedModel

from app.engine import phase_timing
from app.engine.engine import Engine
from app.engine.loading import LoadedModel

if TYPE_CHECKING:
    from app.serving.scheduler import Scheduler
    from app.settings import Settings

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MANIFEST = REPO / "models" / "smollm2-135m-instruct-tad" / "manifest.json"
TINY = "tiny-llama"
KEEP_ALIVE_S = 600
T = TypeVar("T")


def tiny_llama() -> PretrainedConfig:
    """A host-bound model: on CPU its forward is a few hundred small kernels, so the Python around
    them dominates, as on a GPU (4 layers x 4 heads, 2 KV heads, hidden 64, vocabulary 2,048)."""
    return LlamaConfig(
        vocab_size=2048,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )


def random_configs() -> dict[str, Any]:
    from benchmarks.random_models import CONFIGS

    return {TINY: tiny_llama, **CONFIGS}


class NoStopEngine(Engine):
    """The server's engine with its stop tokens off: every answer runs to its token limit."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.context = replace(self.context, stop_token_ids=frozenset())


def in_own_thread(function: Callable[..., T], *args: Any) -> T:
    """`function(*args)` on a thread that ends with it, as the server loads its model on one.

    torch's CPU ops run on OpenMP, which keeps a team of helper threads for each thread that ran a
    parallel region, for that thread's life. With more team threads alive than cores (two threads
    using torch, 2 threads each, on 2 cores) libgomp lets the helpers sleep between regions, and every
    op then waits for one to wake (about 0.1 ms): the tiny model's steps ran 2-3x slower on the
    scheduler's worker and on a pool thread once the main thread had built the model. In the server
    only the worker keeps a team (the loader's ends with it); here, likewise, the model is built and
    warmed up on threads that end, and `generate` runs on one while the worker is stopped."""
    result: list[T] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            result.append(function(*args))
        except BaseException as error:  # re-raised on the calling thread
            failure.append(error)

    thread = threading.Thread(target=target, name="bench-torch")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


class GenerateThread:
    """Where plain `generate` runs, warm-up and timed runs alike. On a CPU, a thread that ends with each run
    (`in_own_thread`: OpenMP teams). On CUDA, one thread for all of them: PyTorch keeps its cuDNN attention
    plans per thread (one per key length), so a new thread per run timed `generate` rebuilding them for every
    decode step's length (the H200 figures measured that way fit a fixed cost of about 6 s a timed window)."""

    def __init__(self, device: torch.device) -> None:
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="bench-generate") if device.type == "cuda" else None

    def run(self, function: Callable[..., T], *args: Any) -> T:
        if self.executor is None:
            return in_own_thread(function, *args)
        return self.executor.submit(function, *args).result()

    def run_beside(self, scheduler: Scheduler, function: Callable[..., T], *args: Any) -> T:
        """`function(*args)` between the service's windows. On a CPU the scheduler's worker is stopped
        meanwhile (two OpenMP teams on two cores would each slow the other) and started again after, on a
        new thread. On CUDA it stays up, idle: a new worker thread would rebuild the attention plans of every
        key length in the next window's timed steps, as a new `generate` thread did."""
        if self.executor is not None:
            return self.run(function, *args)
        scheduler.stop()
        try:
            return self.run(function, *args)
        finally:
            scheduler.start()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PlainGenerate:
    """transformers `generate` on the server's model: greedy, no eos, the first `--clients` prompts as one batch."""

    def __init__(self, loaded: LoadedModel, prompts: list[list[int]], new_tokens: int) -> None:
        self.model: PreTrainedModel = loaded.model
        self.device = loaded.device
        self.ids = torch.tensor(prompts, device=self.device)
        self.new_tokens = new_tokens
        config = copy.deepcopy(self.model.generation_config)
        # Exactly `new_tokens` tokens, as the service generates: transformers refills an eos_token_id set to None
        # from the model's own config (a real model's end of turn), so the end is held off instead.
        config.pad_token_id = 0 if config.pad_token_id is None else config.pad_token_id
        config.do_sample = False
        config.max_new_tokens = config.min_new_tokens = new_tokens
        self.config = config

    def run(self, new_tokens: int | None = None) -> int:
        """One batch; the tokens each row made (checked: all that were asked for)."""
        config = self.config
        if new_tokens is not None:
            config = copy.deepcopy(config)
            config.max_new_tokens = config.min_new_tokens = new_tokens
        with torch.inference_mode():
            out = self.model.generate(  # type: ignore[operator]  # torch types module attributes as tensors
                self.ids, attention_mask=torch.ones_like(self.ids), generation_config=config
            )
        made = out.shape[1] - self.ids.shape[1]
        if made != config.max_new_tokens:  # the rate counts that many: a shorter run would overstate it
            raise RuntimeError(f"generate made {made} tokens, not {config.max_new_tokens}")
        return int(made)

    def timed(self, batches: int, split: bool) -> dict[str, float]:
        """`batches` runs back to back, timed together (as much work as a window of the service's); with
        `split`, then one more run with the model's forwards timed apart (hooks cost a little, so its total
        is not the throughput's)."""
        synchronize(self.device)
        started = time.perf_counter()
        for _ in range(batches):
            self.run()
        synchronize(self.device)
        seconds = time.perf_counter() - started
        result = {"seconds": seconds, "tokens": float(batches * self.ids.shape[0] * self.new_tokens)}
        if split:
            result.update(self._forward_split())
        return result

    def _forward_split(self) -> dict[str, float]:
        forward = 0.0
        started_at: list[float] = []

        def before(*_: object) -> None:
            started_at.append(time.perf_counter())

        def after(*_: object) -> None:
            nonlocal forward
            forward += time.perf_counter() - started_at.pop()

        handles = [self.model.register_forward_pre_hook(before), self.model.register_forward_hook(after)]
        try:
            started = time.perf_counter()
            self.run()
            synchronize(self.device)
            total = time.perf_counter() - started
        finally:
            for handle in handles:
                handle.remove()
        return {"split_seconds": total, "split_forward_seconds": forward}


def make_prompts(
    engine: Engine, count: int, length: int, random_ids: bool, seed: int = 0
) -> tuple[list[str], list[list[int]]]:
    """`count` prompt texts that the server encodes to exactly `length` tokens each, and those ids.

    Windows of a token stream (`random_ids`: random ids, for the id tokenizer of a random model; else
    the long-prompt text) decoded to text and kept where encoding that text gives the window's length."""
    rng = random.Random(seed)
    if random_ids:
        # Ids whose text starts with 0 or 1 would be split by the id tokenizer's special tokens "t0" and "t1".
        usable = [i for i in range(2, min(len(engine.loaded.tokenizer), 10_000)) if str(i)[0] not in "01"]
        stream = [rng.choice(usable) for _ in range(count * length * 2)]
    else:
        text = (Path(__file__).with_name("long_prompt.txt")).read_text()
        special = set(engine.loaded.tokenizer.all_special_ids)  # an unknown word's id would vanish in decoding
        stream = [token for token in engine.encode_answer(text) if token not in special]
        while len(stream) < count * length * 2:
            stream = stream + stream
    texts: list[str] = []
    ids: list[list[int]] = []
    offset = 0
    while len(texts) < count:
        if offset + length > len(stream):
            raise SystemExit(f"could not find {count} prompts of exactly {length} tokens")
        text = engine.decode(stream[offset : offset + length]).strip()
        encoded = engine.encode_prompt(prompt=text)
        if len(encoded) == length and text not in texts:
            texts.append(text)
            ids.append(encoded)
        offset += rng.randrange(length // 2 + 1, length + 1)
    return texts, ids


def thread_cpu_seconds() -> dict[str, float]:
    """CPU seconds of the event loop's thread, the scheduler's worker, and the whole process."""
    times = {"process": time.process_time()}
    for thread in threading.enumerate():
        name = "event_loop" if thread is threading.main_thread() else thread.name
        if name in ("event_loop", "tad-scheduler") and thread.ident is not None:
            times[name] = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    return times


def serve(args: argparse.Namespace) -> None:
    """Load or build the model, wire it into the real runtime, add the benchmark's routes, run uvicorn."""
    import uvicorn

    from app.main import create_app
    from app.serving import runtime as runtime_module
    from app.settings import Settings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.torch_threads:  # before anything runs: `generate` and the service then use the same pool
        torch.set_num_threads(args.torch_threads)
    overrides: dict[str, Any] = {
        "device": args.device,
        "max_batch_size": args.clients,
        "max_queue": 4 * (args.requests + args.clients),
        "max_prompt_tokens": args.prompt_tokens + 16,
        "max_new_tokens_limit": args.new_tokens,
        "torch_threads": args.torch_threads or None,
    }
    configs = random_configs()
    random_weights = args.model in configs
    if random_weights:
        loaded, artifact = in_own_thread(random_model, args, configs[args.model]())
        # The runtime's own loading, with the artifact built above in place of files on disk.
        runtime_module.Runtime._load_artifact = lambda self: artifact  # type: ignore[method-assign]
        settings = Settings(**overrides, reject_target=None, reject_method="tad", reject_threshold=0.5)
    else:
        artifact_dir = None if args.artifact == "none" else Path(args.artifact)
        settings = Settings(**overrides, model=args.model, dtype=args.dtype, artifact_dir=artifact_dir)
        loaded = in_own_thread(real_model, settings)
    runtime_module.load_model = lambda *_, **__: loaded
    runtime_module.Engine = NoStopEngine  # type: ignore[misc]
    probe = NoStopEngine(loaded, n_lags=0)
    texts, ids = make_prompts(probe, args.clients + args.requests, args.prompt_tokens, random_ids=random_weights)
    generate = PlainGenerate(loaded, ids[: args.clients], args.new_tokens)
    runner = GenerateThread(loaded.device)
    runner.run(generate.run)  # warm-up: every step's length, on the thread the timed runs use

    def fatal(reason: str) -> None:
        print(f"server failed: {reason}", file=sys.stderr, flush=True)
        os._exit(1)

    app = create_app(settings, on_fatal=fatal)
    add_bench_routes(app, texts, generate, runner)
    # The clients' connections sit idle while `generate` runs in the server between windows, longer than
    # uvicorn's 5-second keep-alive on a slow machine: a client then reused a connection being closed.
    uvicorn.run(
        app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False, timeout_keep_alive=KEEP_ALIVE_S
    )


def add_bench_routes(app: FastAPI, texts: list[str], generate: PlainGenerate, runner: GenerateThread) -> None:
    from app.serving.outcomes import PromptInput
    from app.serving.service import GenerationService

    runtime = app.state.runtime

    def prompts() -> dict[str, Any]:
        return {"prompts": texts}

    def time_generate(batches: int = 1, split: bool = False) -> dict[str, float]:
        """A sync route: it runs on a pool thread, `generate` on its own (`GenerateThread.run_beside`)."""
        return runner.run_beside(runtime.scheduler, generate.timed, batches, split)

    def reset() -> dict[str, Any]:
        if phase_timing.CLOCK is not None:
            phase_timing.CLOCK.reset()
            phase_timing.CLOCK.mark()
        return {"cpu": thread_cpu_seconds(), "wall": time.perf_counter()}

    def phases() -> dict[str, Any]:
        clock = phase_timing.CLOCK
        engine = runtime.engine
        return {
            "phases": clock.snapshot() if clock is not None else None,
            "cpu": thread_cpu_seconds(),
            "wall": time.perf_counter(),
            "device": describe_device(engine.loaded),
            "model": engine.identity.name,
            "torch_threads": torch.get_num_threads(),
            "artifact": runtime.serving.name,
            "prefill_chunk_tokens": runtime.settings.prefill_chunk_tokens,
        }

    async def window(body: dict[str, Any], request: Request) -> dict[str, Any]:
        """`--no-http`: a window's requests sent by `clients` tasks on the server's own event loop, straight to
        the service (what a route does after parsing its body, without HTTP, JSON or the middleware)."""
        service = GenerationService(runtime)
        waiting = list(reversed(body["prompts"]))
        answers: list[dict[str, Any]] = []

        async def client() -> None:
            while waiting:
                prompt = waiting.pop()
                started = time.perf_counter()
                prepared = await service.prepare(
                    PromptInput(prompt=prompt),
                    max_new_tokens=int(body["new_tokens"]),
                    temperature=0.0,
                    top_p=1.0,
                    seed=None,
                    stop=None,
                )
                outcome = await service.finish(service.submit(prepared, stream=False, early_stop=False), request)
                assert outcome is not None
                answers.append(
                    {
                        "seconds": time.perf_counter() - started,
                        "prompt_tokens": outcome.prompt_tokens,
                        "completion_tokens": outcome.completion_tokens,
                        "method": outcome.decision.method.value,
                        "scored": outcome.decision.score is not None,
                    }
                )

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(int(body["clients"]))))
        return {"seconds": time.perf_counter() - started, "answers": answers}

    app.add_api_route("/bench/prompts", prompts, methods=["GET"])
    app.add_api_route("/bench/window", window, methods=["POST"])
    app.add_api_route("/bench/generate", time_generate, methods=["POST"])
    app.add_api_route("/bench/reset", reset, methods=["POST"])
    app.add_api_route("/bench/phases", phases, methods=["GET"])


def describe_device(loaded: LoadedModel) -> str:
    device = loaded.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({os.cpu_count()} cores)"
    return f"{name}, {str(loaded.model.dtype).removeprefix('torch.')}"


def real_model(settings: Settings) -> LoadedModel:
    """A catalog name or model spec, loaded as the runtime loads it (dtype auto follows the artifact)."""
    from app.engine.loading import load_model
    from app.uncertainty.artifact import MANIFEST_NAME, Manifest

    artifact_dtype = None
    if settings.artifact_dir is not None:
        manifest_path = settings.artifact_dir / MANIFEST_NAME
        artifact_dtype = Manifest.model_validate(json.loads(manifest_path.read_text())).dtype
    return load_model(
        settings.model,
        device=settings.device,
        dtype=settings.dtype,
        cache_dir=settings.cache_dir,
        verify_sha256=settings.verify_model_sha256,
        artifact_dtype=artifact_dtype,
    )


def random_model(args: argparse.Namespace, config: PretrainedConfig) -> tuple[LoadedModel, Any]:
    """A model of `config`'s shape with random weights and an artifact with a random regressor of its shape:
    the service does all its work (capture, TAD, the baselines, the policy) whatever the weights say."""
    from app.engine.attention_capture import register_capture_attention
    from app.uncertainty.artifact import MANIFEST_NAME, Manifest, TadArtifact
    from app.uncertainty.features import Convention
    from benchmarks.random_models import build_model, id_tokenizer, make_engine, random_tad

    if args.layers:  # a quick trial: fewer layers of the same shape
        config.num_hidden_layers = args.layers
        if getattr(config, "layer_types", None) is not None:
            config.layer_types = config.layer_types[: args.layers]
    dtype = {"auto": torch.bfloat16 if args.device.startswith("cuda") else torch.float32}.get(
        args.dtype, getattr(torch, args.dtype, None)
    )
    if not isinstance(dtype, torch.dtype):
        raise SystemExit(f"unknown dtype {args.dtype}")
    torch.manual_seed(0)
    model = build_model(config, dtype, args.device, register_capture_attention())
    loaded = make_engine(model, id_tokenizer(config.vocab_size), args.model, args.n_lags).loaded
    tad = random_tad(config.num_hidden_layers, config.num_attention_heads, args.n_lags, args.stage2)
    manifest = Manifest.model_validate(json.loads(DEFAULT_MANIFEST.read_text()))
    features = manifest.features.model_copy(
        update={
            "n_lags": args.n_lags,
            "num_layers": config.num_hidden_layers,
            "num_heads": config.num_attention_heads,
            "convention": Convention.GENERATING,
            "stage1_size": tad.spec.stage1_size,
            "stage2_size": tad.spec.stage2_size,
        }
    )
    manifest = manifest.model_copy(
        update={
            "llm": loaded.identity,
            "features": features,
            "dtype": str(dtype).removeprefix("torch."),
            "created_at": datetime.now(UTC).isoformat(),
        }
    )
    folder = Path(tempfile.mkdtemp()) / f"random-{args.model}-tad"
    folder.mkdir()
    written = manifest.model_dump_json(indent=2).encode()
    (folder / MANIFEST_NAME).write_bytes(written)  # /info names it and the metrics label it by its hash
    return loaded, TadArtifact(
        path=folder, manifest=manifest, tad=tad, manifest_sha256=hashlib.sha256(written).hexdigest()
    )
