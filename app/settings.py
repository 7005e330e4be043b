"""Service settings: one pydantic-settings class, read from `TAD_*` environment variables."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Literal

from pydantic import Field, FiniteFloat, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.uncertainty.methods import REGISTRY, Method

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = "qwen2.5-coder-1.5b"
# The committed artifact of each catalog model (app/engine/catalog.py): what `TAD_MODEL=<name>` serves with
# when TAD_ARTIFACT_DIR is not set, so that one setting switches model and artifact together.
MODEL_ARTIFACTS: dict[str, Path] = {
    "qwen2.5-coder-1.5b": REPO_ROOT / "models" / "qwen2.5-coder-1.5b-tad",
    "smollm2-135m": REPO_ROOT / "models" / "smollm2-135m-instruct-tad",
    "gemma3-270m": REPO_ROOT / "models" / "gemma3-270m-tad",
}
DEFAULT_ARTIFACT = MODEL_ARTIFACTS[DEFAULT_MODEL]


def committed_artifact(model: str) -> Path | None:
    """The committed artifact a model spec is served with when none is named (None unless a catalog name)."""
    return MODEL_ARTIFACTS.get(model.strip().lower())


DEFAULT_CACHE_DIR = Path.home() / ".cache" / "tad-serve"


LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
# The shortest slot a compiled decode step reads (app/engine/slot_decoding.py's SMALLEST_WIDTH): a shorter
# length would leave prompts hardly any room, or none.
MIN_COMPILED_DECODE_LENGTH = 128
# Variables with the settings' prefix read by others: the phase clock (app/engine/phase_timing.py) and the
# HAProxy balancer's container (deploy/).
OTHER_VARIABLES = frozenset({"TAD_PHASE_TIMING", "TAD_BALANCER_BIND"})
OTHER_PREFIXES = ("TAD_REPLICA_",)
# What Kubernetes (service links) and Docker's legacy links put in a container's environment for a service or
# container named `tad-...`: TAD_SERVE_SERVICE_HOST, TAD_SERVE_PORT, TAD_SERVE_PORT_80_TCP_ADDR, ...
LINK_VARIABLE = re.compile(r"_(SERVICE_HOST|SERVICE_PORT(_\w+)?|PORT(_\d+_(TCP|UDP|SCTP)(_(ADDR|PORT|PROTO))?)?)$")
DEFAULT_ANSWER_TOKENS = 64
RENAMED = {"TAD_CUDA_GRAPHS_LENGTH": "TAD_COMPILED_DECODE_LENGTH"}


class RejectAction(StrEnum):
    """What happens to a generated answer the policy rejects."""

    FLAG = "flag"  # returned as generated, with its decision: the client acts on it
    WITHHOLD = "withhold"  # its text never leaves the service: the client gets the withheld message instead


DEFAULT_WITHHELD_MESSAGE = "I'm not confident enough in an answer to give one."


class Settings(BaseSettings):
    """Every knob of the service; `TAD_<NAME>` sets `<name>` (e.g. TAD_PORT=9000)."""

    # A misspelt variable is refused by `unknown_variables`, which `python -m app` checks first.
    model_config = SettingsConfigDict(env_prefix="TAD_", extra="ignore", protected_namespaces=())

    # The LLM: a catalog name (`qwen2.5-coder-1.5b`, `smollm2-135m`, `gemma3-270m`), `pkg:<package>/<file>`
    # (a file shipped in an installed package), a GGUF file, a local model folder, or a hub id `<org>/<name>`
    # (hub ids need network or a local HF cache).
    model: str = Field(DEFAULT_MODEL, min_length=1)
    device: str = Field("auto", description="auto (cuda if available, else cpu), cpu, cuda, cuda:1, ...")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="auto (the artifact's dtype; without one bfloat16 on GPU and on CPUs with native bf16, else "
        "float32), float32, bfloat16, float16",
    )
    cache_dir: Path = Field(DEFAULT_CACHE_DIR, description="dequantised GGUF copies")
    served_model_name: str | None = Field(None, description="the model's name in responses (default: from its file)")
    verify_model_sha256: bool = True
    torch_threads: int | None = Field(None, ge=1)

    # The TAD artifact. Without one the service answers with baselines only.
    artifact_dir: Path | None = Field(
        DEFAULT_ARTIFACT,
        description="the TAD artifact; empty for none; unset: the catalog model's committed artifact, none for others",
    )
    artifact_manifest_sha256: str | None = Field(
        None, pattern=r"^[0-9a-fA-F]{64}$", description="pin the exact manifest.json (its sha256, 64 hex digits)"
    )
    require_artifact: bool = False

    host: str = Field("127.0.0.1", min_length=1)
    port: int = Field(8000, ge=1, le=65535)
    log_level: str = Field("info", description="critical, error, warning, info or debug")
    decision_log: bool = Field(
        True, description="one JSON line per decision on logger tad.decisions (request id, scores; never text)"
    )
    api_key: SecretStr | None = None
    cors_origins: list[str] = Field(default_factory=list)

    # Limits.
    max_new_tokens_limit: int = Field(512, ge=1)
    default_max_new_tokens: int = Field(
        DEFAULT_ANSWER_TOKENS, ge=1, description=f"unset: {DEFAULT_ANSWER_TOKENS}, or the limit when that is lower"
    )
    max_prompt_tokens: int = Field(4096, ge=1)
    max_body_bytes: int = Field(1_000_000, ge=1)
    body_timeout_s: float = Field(
        30.0, gt=0.0, le=3_600.0, description="a request body not all arrived in this time gets 408"
    )
    max_stop_strings: int = Field(8, ge=0, le=256, description="at most the schema's cap (256)")
    max_top_logprobs: int = Field(20, ge=0, le=20, description="at most the schema's cap (20, OpenAI's)")

    # Scheduling.
    max_batch_size: int = Field(8, ge=1)
    max_queue: int = Field(64, ge=0, description="waiting requests beyond the running batch; more get 429")
    batch_window_ms: float = Field(
        10.0, ge=0.0, le=60_000.0, description="how long an idle scheduler waits to fill a batch"
    )
    broken_after_failed_steps: int = Field(
        5,
        ge=1,
        description="model steps failing in a row (or decode steps, prefills succeeding between them) after "
        "which the replica reports itself broken (/ready and /health 503) until restarted",
    )
    prefill_chunk_tokens: int = Field(
        512,
        ge=0,
        description="prompt tokens a prefill or scoring pass runs between two decode steps of running answers "
        "(0: whole prompt)",
    )
    compiled_decode_length: int = Field(
        0,
        ge=0,
        description=f"0, or at least {MIN_COMPILED_DECODE_LENGTH}: decode in a slot cache of this many tokens per "
        "sequence (prompt + answer, which then caps "
        "the context), each decode step compiled before the server is ready: replayed from a CUDA graph on CUDA, "
        "compiled by torch.compile on a CPU (seconds per read width; needs a C++ compiler); 0: the eager decode "
        "loop. Full-attention models on one device (Llama, Qwen2/3, Phi-3, Granite); others keep the eager loop",
    )
    # Bounded: the worker waits with these as timeouts, and the threading module refuses infinite ones.
    request_timeout_s: float = Field(300.0, gt=0.0, le=86_400.0, description="per-request deadline")
    stream_keepalive_s: float = Field(
        15.0,
        ge=0.0,
        le=3_600.0,
        description="a stream silent this long sends an SSE comment, so proxies keep it open (0: never)",
    )
    graceful_shutdown_s: float = Field(30.0, ge=0.0, le=3_600.0, description="on SIGTERM, time in-flight requests get")

    # Reject policy (overridable per request): a fixed threshold on a method's sequence
    # uncertainty, or a threshold the artifact calibrated for a named target.
    reject_method: Method | None = Field(
        None, description="default: the artifact's decision method (tad for artifacts that do not name one)"
    )
    reject_threshold: FiniteFloat | None = Field(
        None, description="a fixed threshold on TAD_REJECT_METHOD's score (that setting is then required)"
    )
    reject_target: str | None = Field(
        "default", description="'default' = the artifact's default target; empty: none (ungated without a threshold)"
    )
    fallback_method: Method = Field(
        Method("perplexity"), description="used when TAD is unavailable: a method that needs no artifact"
    )
    fallback_threshold: FiniteFloat | None = None
    reject_action: RejectAction = Field(
        RejectAction.FLAG,
        description="flag: return a rejected answer with its decision; withhold: send the withheld message instead "
        "(streams then hold every token until the decision)",
    )
    withheld_message: str = Field(DEFAULT_WITHHELD_MESSAGE, description="the text a withheld answer is replaced with")
    policy_overrides: bool = Field(
        True,
        description="let requests override the policy (method, threshold, target, action); false makes the "
        "service's policy binding, e.g. so that no client can turn withholding off",
    )
    rejection_rate_window: int = Field(
        200, ge=1, description="answers in the rolling would-reject gauges (tad_rolling_rejection_rate)"
    )

    @model_validator(mode="after")
    def _artifact_follows_the_model(self) -> Settings:
        if "artifact_dir" not in self.model_fields_set:
            self.artifact_dir = committed_artifact(self.model)
        return self

    @model_validator(mode="after")
    def _default_length_follows_the_limit(self) -> Settings:
        # Lowering the limit alone lowers the default with it; a default set above the limit is refused below.
        if "default_max_new_tokens" not in self.model_fields_set:
            self.default_max_new_tokens = min(DEFAULT_ANSWER_TOKENS, self.max_new_tokens_limit)
        return self

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        """Settings each valid alone that contradict each other: refused before anything loads."""
        if self.artifact_manifest_sha256 is not None and self.artifact_dir is None:
            raise ValueError("TAD_ARTIFACT_MANIFEST_SHA256 pins an artifact, but TAD_ARTIFACT_DIR names none")
        if not self.verify_model_sha256 and self.artifact_dir is not None:
            raise ValueError(
                "TAD_VERIFY_MODEL_SHA256=false leaves the model unidentified, and an artifact serves only the "
                "model it was trained for: set TAD_ARTIFACT_DIR= (no artifact) as well, or verify"
            )
        if self.default_max_new_tokens > self.max_new_tokens_limit:
            raise ValueError(
                f"TAD_DEFAULT_MAX_NEW_TOKENS ({self.default_max_new_tokens}) is above TAD_MAX_NEW_TOKENS_LIMIT "
                f"({self.max_new_tokens_limit})"
            )
        if 0 < self.compiled_decode_length < MIN_COMPILED_DECODE_LENGTH:
            raise ValueError(f"TAD_COMPILED_DECODE_LENGTH must be 0 or at least {MIN_COMPILED_DECODE_LENGTH}")
        if self.reject_threshold is not None and self.reject_method is None:
            # The default method is the artifact's, which a reload may change: a threshold is on one method's scale.
            raise ValueError("TAD_REJECT_THRESHOLD needs TAD_REJECT_METHOD: the method whose score it is compared with")
        return self

    @field_validator("fallback_method")
    @classmethod
    def _needs_no_regressor(cls, value: Method) -> Method:
        # It decides exactly when the configured method cannot be computed: no artifact, or one without a regressor.
        if REGISTRY[value.value].needs_regressor:
            raise ValueError(
                f"{value.value} needs a TAD regressor; the fallback decides when there is none (no artifact, or a "
                "calibration-only one)"
            )
        return value

    @field_validator("device")
    @classmethod
    def _a_device_name(cls, value: str) -> str:
        # Whether the device is there is checked at load; its name can be checked now.
        import torch

        if value != "auto":
            try:
                torch.device(value)
            except RuntimeError:
                raise ValueError("not a device name: use auto, cpu, cuda or cuda:<index>") from None
        return value

    @field_validator("api_key")
    @classmethod
    def _a_key(cls, value: SecretStr | None) -> SecretStr | None:
        # An empty key would refuse every client (an empty header is no key): unset it for none.
        if value is not None and not value.get_secret_value().strip():
            raise ValueError("empty: unset it to serve without a key")
        return value

    @field_validator("withheld_message")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("blank: a withheld answer needs a message")
        return value

    @field_validator("cache_dir", mode="before")
    @classmethod
    def _a_cache_dir(cls, value: object) -> object:
        if isinstance(value, str) and not value.strip():  # not the current directory
            raise ValueError("empty: unset it for ~/.cache/tad-serve")
        return value

    @field_validator("log_level")
    @classmethod
    def _a_log_level(cls, value: str) -> str:
        # Both Python's logging and uvicorn read it: a name outside both would fail after the settings passed.
        if value.lower() not in LOG_LEVELS:
            raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
        return value.lower()

    @field_validator("artifact_dir", "reject_target", "artifact_manifest_sha256", mode="before")
    @classmethod
    def _empty_means_none(cls, value: object) -> object:
        # `TAD_ARTIFACT_DIR=` is how a shell says "no artifact" (not the current directory); `TAD_REJECT_TARGET=`,
        # "no target"; `TAD_ARTIFACT_MANIFEST_SHA256=`, "no pin".
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("artifact_manifest_sha256")
    @classmethod
    def _lower_case(cls, value: str | None) -> str | None:
        return None if value is None else value.lower()  # as hashlib's hexdigest writes it


def unknown_variables(environment: Mapping[str, str]) -> list[str]:
    """A problem line for each `TAD_*` variable that sets nothing, with the name meant where one is close:
    pydantic-settings ignores them, and a misspelt limit would go unnoticed."""
    prefix = Settings.model_config.get("env_prefix", "").upper()
    known = {prefix + name.upper() for name in Settings.model_fields}
    problems = []
    for name in sorted(environment):
        upper = name.upper()  # pydantic-settings reads `tad_port` as TAD_PORT
        if not upper.startswith(prefix) or upper in known | OTHER_VARIABLES or upper.startswith(OTHER_PREFIXES):
            continue
        if LINK_VARIABLE.search(upper):
            continue
        if upper in RENAMED:
            problems.append(f"{name}: renamed {RENAMED[upper]}")
            continue
        close = difflib.get_close_matches(upper, sorted(known), n=1)
        problems.append(f"{name}: no such setting" + (f" (did you mean {close[0]}?)" if close else ""))
    return problems
