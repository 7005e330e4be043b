"""How much does an answer copy from its prompt, and does that tell right from wrong?

A diagnostic for the signal TAD's features do not see: TAD reads attention among the generated
tokens only, and on SQuAD (a passage in the prompt) a TAD trained on other datasets ranks answers
at chance while the entropy-type scores do not. For every answer in the runs, the share of its
words that do not occur in its own prompt (the user turn exactly as `generate` built it: passage,
options and question) is taken as an uncertainty score; per dataset and prompt style it prints
that score's PRR with a bootstrap 95% interval beside every baseline's. Nothing is generated or
fitted.

    python -m benchmarks.prompt_copy runs/smollm2-dev-task runs/smollm2-dev-bare ...
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.uncertainty.trace import TokenTrace
from training.commands.evaluate import best_baseline
from training.data import QARecord, read_records
from training.rejection import accuracy, interval, paired_bootstrap_prr, prediction_rejection_ratio
from training.runs import iter_texts
from training.scoring import baseline_table
from training.tasks import PromptStyle, build_messages

WORD = re.compile(r"\w+")
NOVEL_SHARE = "novel_word_share"


def novel_word_share(answer: str, prompt: str) -> float:
    """The share of the answer's words (case-folded) that the prompt does not contain; 0 for an answer
    without words, which copies nothing new."""
    words = [w.casefold() for w in WORD.findall(answer)]
    if not words:
        return 0.0
    seen = {w.casefold() for w in WORD.findall(prompt)}
    return sum(w not in seen for w in words) / len(words)


@dataclass(frozen=True)
class CopyRow:
    """One dataset asked in one prompt style: every score's PRR and bootstrap interval on its answers."""

    dataset: str
    style: str
    n: int
    accuracy: float
    prr: dict[str, float]
    ci95: dict[str, tuple[float, float] | None]


def _records_by_line(path: Path, cache: dict[Path, dict[int, QARecord]]) -> dict[int, QARecord]:
    if path not in cache:
        cache[path] = {located.line: located.record for located in read_records([path])}
    return cache[path]


def prompt_copy_table(runs: Sequence[Path], resamples: int = 1000, seed: int = 0) -> list[CopyRow]:
    """Per (dataset, prompt style): n, accuracy, and the PRR with its interval of the novel-word share
    and of every baseline, on the same answers."""
    cache: dict[Path, dict[int, QARecord]] = {}
    groups: dict[tuple[str, str], list[tuple[float, float, TokenTrace]]] = {}
    for text in iter_texts(runs):
        meta = text.meta
        record = _records_by_line(Path(meta["file"]), cache)[int(meta["line"])]
        style = PromptStyle(meta.get("prompt_style", PromptStyle.TASK.value))
        prompt = " ".join(message["content"] for message in build_messages(record, style))
        share = novel_word_share(str(meta["answer"]), prompt)
        groups.setdefault((text.dataset, style.value), []).append((share, text.target, text.token_trace()))
    rows: list[CopyRow] = []
    for (dataset, style_name), items in sorted(groups.items()):
        quality = np.array([target for _, target, _ in items])
        scores = {NOVEL_SHARE: np.array([share for share, _, _ in items])}
        scores |= baseline_table([trace for _, _, trace in items])
        boot = paired_bootstrap_prr(scores, quality, resamples, seed)
        rows.append(
            CopyRow(
                dataset=dataset,
                style=style_name,
                n=len(items),
                accuracy=accuracy(quality),
                prr={name: prediction_rejection_ratio(values, quality) for name, values in scores.items()},
                ci95={name: interval(values) for name, values in boot.items()},
            )
        )
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="+", help="generation runs (training or dev)")
    parser.add_argument("--bootstrap", type=int, default=1000)
    args = parser.parse_args(argv)
    for row in prompt_copy_table(args.runs, args.bootstrap):
        low_high = row.ci95[NOVEL_SHARE]
        ci_text = "" if low_high is None else f" [{low_high[0]:.2f}, {low_high[1]:.2f}]"
        best = best_baseline(row.prr)
        print(
            f"{row.dataset:<11} {row.style:<5} n={row.n:<5} accuracy {row.accuracy:.2f}  "
            f"novel-word share PRR {row.prr[NOVEL_SHARE]:+.3f}{ci_text}  best baseline {best} {row.prr[best]:+.3f}"
        )


if __name__ == "__main__":
    main()
