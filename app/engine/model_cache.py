"""The dequantised copy of a GGUF model in the cache: written once, atomically, and checked when reused.

Parsing and dequantising a GGUF file takes 15-25 s; the first load writes a safetensors copy in
the model's dtype, which later starts read in under a second with identical weights. The copy is
keyed by the file's sha256 (or, with hashing off, by its path, size and modification time, so
that two models never share one), written in a staging folder flushed to disk and renamed into
place with its marker, readable by any user of the cache (a training run, an image's user), and
made again when a copy that claims to be complete does not load.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from app.files import remove_stale, sync_folder, sync_tree

logger = logging.getLogger(__name__)

UNVERIFIED = "unverified"  # the model sha256 when TAD_VERIFY_MODEL_SHA256 is off
COMPLETE_MARKER = "tad-cache-complete"  # written last, holding the weights' sha256
STAGING_PREFIX = ".staging-"


def cache_key(gguf_path: Path, sha256: str) -> str:
    """The copy's name: the weights' sha256, or, unverified, a digest of the file's path, size and time."""
    if sha256 != UNVERIFIED:
        return sha256[:32]
    resolved = gguf_path.resolve()
    stat = resolved.stat()
    described = f"{resolved}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()
    return f"{UNVERIFIED}-{hashlib.sha256(described).hexdigest()[:24]}"


def copy_folder(cache_dir: Path, key: str, dtype: torch.dtype) -> Path:
    suffix = "" if dtype == torch.float32 else f"-{str(dtype).removeprefix('torch.')}"
    return cache_dir / f"gguf-{key}{suffix}"


def is_complete(folder: Path, marker: str) -> bool:
    try:
        return (folder / COMPLETE_MARKER).read_text().strip() == marker
    except OSError:
        return False


def share(path: Path) -> None:
    """Readable by every user of the cache: mkstemp, mkdtemp and safetensors create files 0600, folders 0700."""
    if path.is_dir():
        path.chmod(0o755)
        for item in path.iterdir():
            share(item)
    else:
        path.chmod(0o644)


def dequantised_copy(
    gguf_location: str, gguf_file: str, sha256: str, cache_dir: Path, dtype: torch.dtype, remake: bool = False
) -> Path:
    """The safetensors copy of the GGUF model in `dtype`, made unless a complete one is there (`remake`: the
    one there did not load). Its marker holds the weights' whole sha256 (unverified: the key)."""
    key = cache_key(Path(gguf_location) / gguf_file, sha256)
    marker = key if sha256 == UNVERIFIED else sha256
    target = copy_folder(cache_dir, key, dtype)
    if not remake and is_complete(target, marker):
        return target
    logger.info("dequantising %s once; later starts reuse %s", gguf_file, target)
    tokenizer = AutoTokenizer.from_pretrained(gguf_location, gguf_file=gguf_file)
    model = AutoModelForCausalLM.from_pretrained(gguf_location, gguf_file=gguf_file, dtype=dtype)
    # The dequantised weights are plain tensors; drop the GGUF marker so they can be saved.
    model.hf_quantizer = None  # type: ignore[assignment]  # torch types module attributes as tensors
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    cache_dir.mkdir(parents=True, exist_ok=True)
    remove_stale(cache_dir, STAGING_PREFIX)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=cache_dir))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / COMPLETE_MARKER).write_text(marker)
        share(staging)
        sync_tree(staging)  # the weights on disk before the rename names them complete
        # Several processes (data-parallel workers) may race here: the first complete copy wins, and a
        # complete copy is never removed while another process may be reading it (unless it does not load).
        if target.exists() and (remake or not is_complete(target, marker)):
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.replace(staging, target)
        except OSError:
            if not is_complete(target, marker):
                raise
        sync_folder(cache_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target
