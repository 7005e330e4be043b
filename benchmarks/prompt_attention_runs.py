"""Copies of generation runs with each head's attention to the prompt per token, to measure it as a TAD feature.

TAD reads, per layer and head, the attention of the step's query to the N + 1 positions ending at
the query (docs/method.md §2). Where the rest of the attention goes is what it does not see: to the
prompt (the passage and question the answer should draw on, the "lookback" of Lookback Lens, Chuang
et al. 2024) or to generated tokens further back. While that window still reaches into the prompt
(a token's producing step for the first N + 1 answer tokens), all the weight outside it lies on the
prompt, 1 minus the window's sum, except for one split TAD cannot make: how much goes to the
prompt's first position (the attention sink, where a head with nothing to read parks its weight)
and how much to the prompt's content; later, how much goes to the prompt and how much to generated
tokens further back. So there are two statistics per layer ``l``
and query head ``h``: a token's attention mass on the prompt's positions 1 .. P-1 (`prompt_mass`,
all prompt tokens but the first) and on position 0 (`prompt_sink`), read from the step that
produces the token (the generating convention, the shipped one: the query is the previous token's
position, the last prompt token's for the first answer token), so they are known the moment the
token is sampled, as a streamed confidence needs.

The copies link every file of the original shards (nothing is duplicated) and add one
`stat-prompt_mass_lLL_hH.npy` and one `stat-prompt_sink_lLL_hH.npy` per head; the weights come
from one teacher-forced forward per answer with eager attention (the full attention matrices).
For each run it prints the largest difference, over the shards written, between those weights and
the run's stored step rows on every slot: a check that the forward reproduces the generation
(float rounding only). Then

    python -m training fit COPIES... --extra-feature-sets \
        "$(python -m benchmarks.prompt_attention_runs --names LAYERS HEADS)" \
        "$(python -m benchmarks.prompt_attention_runs --names LAYERS HEADS --family prompt_mass prompt_sink)"

measures it as a cross-validated ablation. Resumable shard by shard:

    python -m benchmarks.prompt_attention_runs --out runs/prompt-mass RUN...
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from app.engine.chat_prompt import encode_chat
from app.engine.loading import LoadedModel, load_model
from app.engine.prompt_attention import (
    PROMPT_FAMILIES,
    PROMPT_MASS,
    PROMPT_SINK,
    prompt_statistic_name,
    prompt_statistic_names,
)
from benchmarks.run_copies import chat_run_settings, pending_shards, run_records, runs_model, write_linked_shard
from training.data import QARecord
from training.runs import RUN_FILE, STAT_PREFIX
from training.tasks import PromptStyle, build_messages


def answer_attention(loaded: LoadedModel, prompt_ids: Sequence[int], answer_ids: Sequence[int]) -> np.ndarray:
    """`[layers, heads, answer + 1, P + answer]` float32: the attention rows of the queries at positions
    P-1 .. P+n-1 (row i is the step that produces answer token i; the last row consumes the last token)."""
    ids = torch.tensor([list(prompt_ids) + [int(t) for t in answer_ids]], dtype=torch.long, device=loaded.device)
    with torch.inference_mode():
        output = loaded.model(input_ids=ids, output_attentions=True, use_cache=False)
    first_query = len(prompt_ids) - 1
    return torch.stack([layer[0, :, first_query:, :] for layer in output.attentions]).float().cpu().numpy()


def prompt_attention(rows: np.ndarray, prompt_length: int) -> dict[str, np.ndarray]:
    """Per family `[answer, layers, heads]`: each producing step's attention to prompt positions
    1 .. P-1 (`prompt_mass`) and to position 0 (`prompt_sink`)."""
    producing = rows[:, :, :-1]  # the last row consumes the last token
    mass = producing[..., 1:prompt_length].sum(axis=-1, dtype=np.float64)  # [layers, heads, answer]
    sink = producing[..., 0].astype(np.float64)
    return {PROMPT_MASS: np.moveaxis(mass, -1, 0), PROMPT_SINK: np.moveaxis(sink, -1, 0)}


def stored_row_difference(rows: np.ndarray, prompt_length: int, stored: np.ndarray) -> float:
    """Largest difference between the forward's weights and the stored step rows (`[answer, layers,
    heads, N + 1]`, row j from the query at answer token j's position, row j + 1 of `rows`; slot k
    the key k back, a prompt or a generated token) on every key the slots reach."""
    largest = 0.0
    for j in range(len(stored)):
        for lag in range(min(stored.shape[-1], prompt_length + j + 1)):  # keys P+j-lag >= 0
            weight = rows[:, :, j + 1, prompt_length + j - lag]
            largest = max(largest, float(np.abs(weight - stored[j, :, :, lag]).max()))
    return largest


def annotate_run(run: Path, out: Path, loaded: LoadedModel) -> list[float]:
    """Write `out/<run name>` (a linked copy with the prompt-mass statistics); the per-shard differences
    from the stored rows of the shards written now."""
    settings = chat_run_settings(run)
    layers, heads = loaded.identity.num_layers, loaded.identity.num_heads
    target = out / run.name
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(run / RUN_FILE, target / RUN_FILE)
    records: dict[str, QARecord] | None = None
    differences = []
    for shard, final in pending_shards(run, target, "prompt attention"):
        records = records if records is not None else run_records(run, settings)
        metas = json.loads((shard / "texts.json").read_text())
        offsets, token_ids = np.load(shard / "offsets.npy"), np.load(shard / "token_ids.npy")
        stored = np.load(shard / "attention.npy", mmap_mode="r")
        statistics = {family: np.zeros((len(token_ids), layers, heads), dtype=np.float64) for family in PROMPT_FAMILIES}
        difference = 0.0
        for index, meta in enumerate(metas):
            record = records.get(meta["key"])
            if record is None:
                raise SystemExit(f"{shard}: answer {meta['key']} has no record in the run's data files")
            start, end = int(offsets[index]), int(offsets[index + 1])
            if end == start:
                continue
            style = PromptStyle(meta.get("prompt_style", PromptStyle.TASK.value))
            prompt_ids = encode_chat(loaded.tokenizer, build_messages(record, style))
            rows = answer_attention(loaded, prompt_ids, token_ids[start:end])
            for family, values in prompt_attention(rows, len(prompt_ids)).items():
                statistics[family][start:end] = values
            difference = max(difference, stored_row_difference(rows, len(prompt_ids), stored[start:end]))
        arrays = {}
        for family, values in statistics.items():
            for layer in range(layers):
                for head in range(heads):
                    name = prompt_statistic_name(family, layer, head)
                    arrays[f"{STAT_PREFIX}{name}.npy"] = np.ascontiguousarray(values[:, layer, head])
        write_linked_shard(shard, final, arrays)
        differences.append(difference)
    return differences


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="*", help="generation runs (chat or task prompts)")
    parser.add_argument("--out", type=Path, help="folder for the copies (one per run, same name)")
    parser.add_argument(
        "--names",
        type=int,
        nargs=2,
        metavar=("LAYERS", "HEADS"),
        help="print the statistics' names joined by '+' (one --extra-feature-sets entry) and stop",
    )
    parser.add_argument("--family", nargs="+", choices=PROMPT_FAMILIES, help="with --names: whose names (prompt_mass)")
    args = parser.parse_args(argv)
    if args.names is not None:
        layers, heads = args.names
        print("+".join(prompt_statistic_names(layers, heads, args.family or [PROMPT_MASS])))
        return
    if args.family is not None:
        parser.error("--family goes with --names")
    if not args.runs or args.out is None:
        parser.error("give the runs and --out")
    loaded = load_model(runs_model(args.runs), device="cpu", verify_sha256=False)
    loaded.model.set_attn_implementation("eager")  # the full attention matrices, which capture never builds
    for run in args.runs:
        differences = annotate_run(run, args.out, loaded)
        largest = max(differences, default=0.0)
        print(f"{args.out / run.name}: {len(differences)} shards written, largest difference {largest:.1e}")


if __name__ == "__main__":
    main()
