"""The serving benchmark end to end, at its smallest: server and clients, `generate` beside them, the phases."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks.server_process import free_port

REPO = Path(__file__).resolve().parents[2]


def _run(*arguments: str) -> str:
    command = [sys.executable, "-m", "benchmarks.serving", "--device", "cpu", "--port", str(free_port())]
    sizes = ["--clients", "2", "--requests", "2", "--repeats", "1", "--prompt-tokens", "8", "--new-tokens", "4"]
    done = subprocess.run(
        [*command, *sizes, "--torch-threads", "1", *arguments], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def test_a_random_tiny_model_with_a_random_artifact_is_served_and_timed() -> None:
    out = _run("--model", "tiny-llama", "--stream")
    assert "decided by {'tad': 2}, every answer scored: True" in out
    assert "streamed tokens with a TAD confidence: 8 of 8" in out
    assert "forward" in out and "event loop CPU" in out and "generate, per step" in out
    assert out.strip().splitlines()[-1].startswith("scheduler_vs_generate=")


def test_a_model_folder_with_a_calibration_only_artifact_decides_with_its_free_score(
    tiny_model_dir: Path, tiny_calibration_artifact: Path
) -> None:
    out = _run("--model", str(tiny_model_dir), "--artifact", str(tiny_calibration_artifact), "--no-phases")
    assert "every answer scored: True" in out and "'tad'" not in out
    assert out.strip().splitlines()[-1].startswith("scheduler_vs_generate=")


def test_without_http_the_requests_are_sent_inside_the_server() -> None:
    out = _run("--model", "tiny-llama", "--no-http")
    assert "in the server without HTTP" in out
    assert "decided by {'tad': 2}, every answer scored: True" in out
    assert out.strip().splitlines()[-1].startswith("scheduler_vs_generate=")


def test_plain_generate_makes_every_token_it_is_credited_with_though_the_model_has_an_end_token(
    tiny_model_dir: Path,
) -> None:
    """transformers refills an eos id set to None from the model's own config: the benchmark must hold the end
    off, or a batch ending early would be counted at full length and `generate`'s rate overstated."""
    import torch

    from app.engine.loading import load_model
    from benchmarks.serving_server import PlainGenerate

    loaded = load_model(str(tiny_model_dir), device="cpu", dtype="float32")
    prompt = [5, 6, 7]
    with torch.inference_mode():
        first = int(loaded.model(torch.tensor([prompt])).logits[0, -1].argmax())
    loaded.model.generation_config.eos_token_id = first  # the greedy answer would end at once
    plain = PlainGenerate(loaded, [prompt], new_tokens=6)
    assert plain.run() == 6


class _Worker:
    """The scheduler's start and stop, recorded."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def stop(self) -> None:
        self.calls.append("stop")

    def start(self) -> None:
        self.calls.append("start")


def test_plain_generate_pauses_the_worker_on_a_cpu_and_leaves_it_up_on_cuda() -> None:
    """On CUDA a restarted worker is a new thread, which rebuilds every attention plan in the next timed window."""
    import threading

    import torch

    from benchmarks.serving_server import GenerateThread

    def thread_name() -> str:
        return threading.current_thread().name

    cpu, worker = GenerateThread(torch.device("cpu")), _Worker()
    assert cpu.run_beside(worker, thread_name) == "bench-torch"
    assert worker.calls == ["stop", "start"]

    cuda, worker = GenerateThread(torch.device("cuda")), _Worker()
    names = {cuda.run_beside(worker, thread_name) for _ in range(2)}
    assert worker.calls == [] and len(names) == 1 and names.pop().startswith("bench-generate")
