"""Generation runs: answer every record with the LLM and store what TAD trains on, shard by shard.

What `generate` runs, and what `evaluate` and `calibrate` run when they generate their own answers
(training/run_source.py).

The same engine as the server generates (greedy, raw-logit probabilities, attention rows
captured in the same attention function), so the stored features are the ones the
server would see for the same answer. Shards are planned from the input alone, so a
rerun of the same command skips finished shards and continues where it stopped. Under
`accelerate launch`, process k of n takes shards k, k + n, ... (data parallel).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from app.engine.cpu_bf16 import MIN_ROWS
from app.engine.engine import Engine
from app.engine.loading import load_model
from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest
from app.files import write_text_atomic
from app.hashing import file_sha256
from app.identity import ModelIdentity
from training.data import BadRecord, LocatedRecord, QARecord, dataset_name, read_records
from training.runs import (
    RUN_ENTRIES,
    RUN_FILE,
    TextTrace,
    read_run_settings,
    read_shard_metas,
    shard_done,
    shard_path,
    write_plan,
    write_shard,
)
from training.targets import RESCORE_HINT, TARGETS_VERSION
from training.tasks import PromptStyle, build_prompt, score_answer
from training.tasks import max_new_tokens as default_length

logger = logging.getLogger(__name__)

# v2: chat-style budgets are the task's own where longer than 64 tokens (math, long form).
PROMPT_VERSION = "prompts-v2"
# Step rows with keys 0..N back from each step's query (docs/method.md §2).
CAPTURE_VERSION = "step-rows-v2"


@dataclass(frozen=True)
class GenerateOptions:
    data: Sequence[Path]
    out: Path
    model: str
    n_lags: int = 10
    limit: int | None = None
    skip: int = 0  # valid records per file passed over first (extends an earlier run with disjoint records)
    max_new_tokens: int | None = None
    batch_size: int = 16  # rows decoding at once (continuous batching)
    shard_size: int = 64
    max_prompt_tokens: int = 2048
    device: str = "auto"
    dtype: str = "auto"
    cache_dir: Path | None = None
    # Few-shot examples (PromptStyle.FEW_SHOT) come from each data file's `<dataset>_train.jsonl` beside it;
    # a record is never its own example.
    prompt_style: PromptStyle = PromptStyle.TASK
    # The option that names `out` in the caller's command line, for messages (calibrate's is --run-dir).
    out_option: str = "--out"
    # The model an artifact was trained for (evaluate, calibrate): another one is refused before generating.
    expected_model_sha256: str | None = None


@dataclass(frozen=True)
class Distribution:
    """This process's place among data-parallel workers."""

    rank: int = 0
    world: int = 1
    device: str | None = None

    @classmethod
    def detect(cls) -> Distribution:
        try:
            from accelerate import PartialState
        except ImportError:  # pragma: no cover - accelerate is a runtime dependency
            return cls()
        state = PartialState()
        device = str(state.device) if state.num_processes > 1 else None
        return cls(rank=state.process_index, world=state.num_processes, device=device)


# Known only once the model is loaded; every other setting can be checked before.
LOADED_MODEL_SETTINGS = ("model_sha256", "dtype", "identity", "bf16_products")
WIDE_BF16_PRODUCTS = f"float32 from {MIN_ROWS} rows"  # app/engine/cpu_bf16.py


def run_settings(
    identity: ModelIdentity, dtype: str, model_free: dict[str, Any], wide_bf16_products: bool = False
) -> dict[str, Any]:
    """What must be equal for a rerun to continue an existing run (`model_free`: settings_before_loading's).
    bfloat16 products computed in float32 (a CPU without fast bfloat16 kernels) are recorded only where they
    were, so runs made before it still resume; a run is not continued with the other numbers."""
    return {
        "model_sha256": identity.sha256,
        "dtype": dtype,
        "identity": identity.model_dump(),
        **({"bf16_products": WIDE_BF16_PRODUCTS} if wide_bf16_products else {}),
        **model_free,
    }


def settings_before_loading(options: GenerateOptions) -> dict[str, Any]:
    """The run settings that need no model: compared before the load, a changed rerun is refused at once."""
    return {
        "model": options.model,
        "n_lags": options.n_lags,
        "data": [{"path": str(p), "sha256": file_sha256(Path(p))} for p in options.data],
        "limit": options.limit,
        "max_new_tokens": options.max_new_tokens,
        "shard_size": options.shard_size,
        "max_prompt_tokens": options.max_prompt_tokens,
        "prompts": PROMPT_VERSION,
        "targets": TARGETS_VERSION,
        "prompt_style": options.prompt_style.value,
        "capture": CAPTURE_VERSION,
        # Only when used, so runs made before the option existed still resume.
        **({"skip": options.skip} if options.skip else {}),
        **(
            {"shots": [{"path": str(p), "sha256": file_sha256(p)} for p in shot_files(options)]}
            if options.prompt_style is PromptStyle.FEW_SHOT
            else {}
        ),
    }


def _resolved(path: str) -> str:
    """A local path made absolute (relative and absolute spellings of one file compare equal); a model spec
    that is no local path (a hub name) as it is."""
    return str(Path(path).resolve()) if Path(path).exists() else path


def comparable(settings: dict[str, Any]) -> dict[str, Any]:
    """Run settings with their file paths resolved and the prompt style by its current name, for comparing a
    rerun's with the stored ones."""
    result = dict(settings)
    if isinstance(result.get("prompt_style"), str):
        # A run made when the chat style was called "bare" is continued by `--prompt-style chat`.
        result["prompt_style"] = _style_name(result["prompt_style"])
    if isinstance(result.get("model"), str):
        result["model"] = _resolved(result["model"])
    identity = result.get("identity")
    if isinstance(identity, dict) and isinstance(identity.get("source"), str):  # the model spec again
        result["identity"] = {**identity, "source": _resolved(identity["source"])}
    for key in ("data", "shots"):
        if isinstance(result.get(key), list):
            result[key] = [
                {**entry, "path": _resolved(entry["path"])} if isinstance(entry, dict) and "path" in entry else entry
                for entry in result[key]
            ]
    return result


def _style_name(stored: str) -> str:
    """The current name of a stored prompt style; an unknown one as it is (it differs, and is refused as such)."""
    try:
        return PromptStyle(stored).value
    except ValueError:
        return stored


def check_unchanged(out: Path, settings: dict[str, Any], out_option: str, ignored: Sequence[str] = ()) -> None:
    """Refuse to continue a run made with other settings (those in `ignored` aside)."""
    existing = comparable(read_run_settings(out))
    wanted = comparable(settings)
    keys = (wanted.keys() | existing.keys()) - set(ignored)
    changed = sorted(key for key in keys if existing.get(key) != wanted.get(key))
    if changed == ["targets"]:
        raise SystemExit(
            f"{out}'s answers were scored with targets version {existing.get('targets', 1)}, this code's are "
            f"version {TARGETS_VERSION}: {RESCORE_HINT} before extending it, or use a new {out_option} folder"
        )
    if changed:
        raise SystemExit(
            f"{out} was generated with different settings ({', '.join(changed)}); "
            f"use a new {out_option} folder or the original settings"
        )


def check_or_write_settings(out: Path, settings: dict[str, Any], rank: int = 0, out_option: str = "--out") -> None:
    path = out / RUN_FILE
    if path.is_file():
        check_unchanged(out, settings, out_option)
        return
    out.mkdir(parents=True, exist_ok=True)
    # Every data-parallel process may get here at once: each writes its own temporary file (by its pid).
    write_text_atomic(path, json.dumps(settings, indent=2) + "\n")


def without_duplicate_ids(records: list[LocatedRecord], bad: list[BadRecord]) -> list[LocatedRecord]:
    """The records with each dataset/id once: a later one is a bad record (every command after `generate`
    refuses an answer key seen twice, so keeping it would make the run unusable)."""
    first: dict[tuple[str, str], LocatedRecord] = {}
    kept = []
    for located in records:
        key = (located.dataset, located.record.id)
        if key in first:
            seen = first[key]
            item = BadRecord(
                located.path, located.line, f"duplicate id {located.record.id!r} (first at {seen.path}:{seen.line})"
            )
            logger.warning("skipping %s", item)
            bad.append(item)
            continue
        first[key] = located
        kept.append(located)
    return kept


def plan_shards(records: Sequence[LocatedRecord], shard_size: int) -> list[list[LocatedRecord]]:
    return [list(records[i : i + shard_size]) for i in range(0, len(records), shard_size)]


def shot_files(options: GenerateOptions) -> list[Path]:
    """Where few-shot examples come from: each data file's train split beside it."""
    files = []
    for path in options.data:
        train = Path(path).with_name(f"{dataset_name(Path(path))}_train.jsonl")
        if not train.is_file():
            raise SystemExit(f"few-shot prompts need examples: no {train} beside {path}")
        if train not in files:
            files.append(train)
    return files


def shot_pools(files: Sequence[Path]) -> dict[str, list[QARecord]]:
    """Example records per dataset name, in file order."""
    pools: dict[str, list[QARecord]] = {}
    for located in read_records(files):
        pools.setdefault(located.dataset, []).append(located.record)
    return pools


def answer_records(
    engine: Engine,
    records: Sequence[LocatedRecord],
    max_new_tokens: int | None,
    batch_size: int,
    max_prompt_tokens: int,
    bad: list[BadRecord],
    progress: tqdm | None = None,
    style: PromptStyle = PromptStyle.TASK,
    pools: dict[str, list[QARecord]] | None = None,
) -> list[TextTrace]:
    """Generate greedily for each record and score the answer; results in input order."""
    prompts: list[tuple[int, list[int]]] = []
    stops: dict[int, tuple[str, ...]] = {}
    for position, located in enumerate(records):
        prompt = build_prompt(located.record, style, (pools or {}).get(located.dataset, ()))
        ids = engine.encode_prompt(prompt=prompt.text, messages=prompt.messages)
        stops[position] = prompt.stop
        if len(ids) > max_prompt_tokens:
            bad.append(BadRecord(located.path, located.line, f"prompt has {len(ids)} tokens > {max_prompt_tokens}"))
            continue
        prompts.append((position, ids))
    # Similar lengths together waste less compute on padding; order is restored below.
    prompts.sort(key=lambda item: len(item[1]))
    requests = []
    for position, ids in prompts:
        limit = max_new_tokens or default_length(records[position].record.task, style)
        requests.append(
            GenerationRequest(prompt_ids=tuple(ids), params=SamplingParams(max_new_tokens=limit, stop=stops[position]))
        )
    # Continuous batching: a short answer's row is refilled as soon as it ends instead of idling
    # until the longest answer of a static batch is done (docs/training.md, generate).
    results: dict[int, TextTrace] = {}
    for index, sequence in engine.generate_continuously(requests, batch_size):
        position, ids = prompts[index]
        located = records[position]
        trace = engine.trace(sequence)
        attention = trace.attention
        if attention is None:
            attention = np.zeros((0, engine.identity.num_layers, engine.identity.num_heads, engine.n_lags + 1))
        meta = {
            "key": f"{located.dataset}/{located.record.id}",
            "id": located.record.id,
            "dataset": located.dataset,
            "task": located.record.task.value,
            "file": str(located.path),
            "line": located.line,
            "prompt_tokens": len(ids),
            "answer": sequence.text,
            "finish_reason": str(sequence.finish_reason),
            "target": score_answer(sequence.text, located.record),
            "prompt_style": style.value,
        }
        results[position] = TextTrace(
            meta=meta,
            token_ids=np.array(trace.token_ids, dtype=np.int32),
            stats=dict(trace.stats),
            attention=attention.astype(np.float32),
        )
        if progress is not None:
            progress.update(1)
    return [results[position] for position in sorted(results)]


def run_generate(options: GenerateOptions, distribution: Distribution | None = None) -> Path:
    distribution = distribution or Distribution.detect()
    bad: list[BadRecord] = []
    records = without_duplicate_ids(
        list(read_records(options.data, limit=options.limit, bad=bad, skip=options.skip)), bad
    )
    bad_in_data = len(bad)
    if not records and not options.skip:
        # Before the model loads and before anything is written: an empty run would refuse the rerun with the
        # right file as "different settings", and fit/calibrate would only fail on it later.
        shown = f"{len(bad)} lines refused, the first {bad[0]}" if bad else "the files hold no records"
        raise SystemExit(f"no valid records in {', '.join(map(str, options.data))}: {shown}")
    if not records:  # a --skip past the end: a finished extension, but more often a wrong --skip
        logger.warning(
            "no valid record left in %s after --skip %d: the run will hold no answers",
            ", ".join(map(str, options.data)),
            options.skip,
        )
    shards = plan_shards(records, options.shard_size)
    out = options.out
    model_free = settings_before_loading(options)  # hashes the data files: once
    if (out / RUN_FILE).is_file():  # the model-free settings now: a loaded model would tell nothing more of them
        check_unchanged(out, model_free, options.out_option, ignored=LOADED_MODEL_SETTINGS)
    elif out.is_dir() and any(
        item.name not in RUN_ENTRIES and not item.name.endswith(".tmp") for item in out.iterdir()
    ):
        # Not a run (no run.json) yet not empty: a run written into it would mix with what is there. (A
        # `.tmp`, or a run's own entry, is another data-parallel process starting the same run this moment.)
        raise SystemExit(f"{options.out_option} {out} is a folder with other files in it: give a new or empty one")
    device = distribution.device or options.device
    loaded = load_model(options.model, device=device, dtype=options.dtype, cache_dir=options.cache_dir)
    if options.expected_model_sha256 is not None and loaded.identity.sha256 != options.expected_model_sha256:
        raise SystemExit(
            f"--model {options.model} ({loaded.identity.name}) is not the model the artifact was trained for: "
            "its answers cannot be scored with this artifact"
        )
    if options.prompt_style is not PromptStyle.FEW_SHOT and not loaded.tokenizer.chat_template:
        # Before anything is written: the task and chat styles are chat messages.
        raise SystemExit(
            f"--model {options.model} has no chat template (a base model): generate with --prompt-style few-shot"
        )
    dtype = str(loaded.model.dtype).removeprefix("torch.")
    settings = run_settings(loaded.identity, dtype, model_free, loaded.wide_bf16_products)
    check_or_write_settings(out, settings, distribution.rank, options.out_option)
    write_plan(out, len(shards), distribution.rank)
    mine = [i for i in range(len(shards)) if i % distribution.world == distribution.rank]
    todo = [i for i in mine if not shard_done(out, i)]
    logger.info("%d records in %d shards; %d to do here", len(records), len(shards), len(todo))
    if 0 < len(todo) < len(mine):  # said at any log level: the user may not have meant to continue that run
        logger.warning("resuming %s: %d of its %d shards here are done already", out, len(mine) - len(todo), len(mine))
    # Every step row, the last token's included, so that a run serves both conventions.
    engine = Engine(loaded, n_lags=options.n_lags, last_row=True)
    shape = (loaded.identity.num_layers, loaded.identity.num_heads, options.n_lags + 1)
    pools = shot_pools(shot_files(options)) if options.prompt_style is PromptStyle.FEW_SHOT else None
    with tqdm(total=sum(len(shards[i]) for i in todo), desc=f"generate [{distribution.rank}]", unit="text") as bar:
        for index in todo:
            texts = answer_records(
                engine,
                shards[index],
                options.max_new_tokens,
                options.batch_size,
                options.max_prompt_tokens,
                bad,
                bar,
                options.prompt_style,
                pools,
            )
            # Before the shard is done: a shard done is never redone, so its bad records must be on record by
            # then (a kill between the two redoes the shard, whose lines the report already holds once).
            report_bad_records(out, distribution.rank, bad, bad_in_data)
            write_shard(out, index, texts, shape)
    report = out / f"bad_records.{distribution.rank}.txt"
    if lines := report_bad_records(out, distribution.rank, bad, bad_in_data):
        logger.warning("%d bad records skipped; see %s", lines, report)
    if distribution.world == 1 and mine and not any(read_shard_metas(shard_path(out, i)) for i in mine):
        # Every record skipped (e.g. each prompt past --max-prompt-tokens): a run fit and calibrate cannot use.
        # (One of several processes sees its own shards only: `fit` says it if the whole run holds no answer.)
        raise SystemExit(f"none of the {sum(len(shards[i]) for i in mine)} records gave an answer; see {report}")
    return out


def report_bad_records(out: Path, rank: int, bad: Sequence[BadRecord], bad_in_data: int) -> int:
    """Merge `bad` into the process's `bad_records.RANK.txt` (atomically); how many lines it holds."""
    if rank != 0:
        bad = bad[bad_in_data:]  # every process reads the same data; rank 0 reports its bad lines
    report = out / f"bad_records.{rank}.txt"
    # Shards finished by earlier runs reported theirs already: keep those lines.
    known = set(report.read_text().splitlines()) if report.is_file() else set()
    lines = sorted(known | {str(item) for item in bad})
    if lines and len(lines) > len(known):
        write_text_atomic(report, "".join(f"{line}\n" for line in lines))
    return len(lines)
