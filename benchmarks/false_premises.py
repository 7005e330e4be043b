"""Questions with a made-up premise (every answer is wrong): how many does the default policy reject?

The questions (`benchmarks/data/false_premises.jsonl`, written for this project) are asked
the way users ask: chat messages with the bare question, greedy, up to 64 new tokens. Each
answer is decided with the service's default policy (the artifact's default target), and
beside it with MSP at the same coverage: the artifact's MSP threshold calibrated to accept
the share of calibration answers the default policy accepts (`coverage@<c>`, written by
`calibrate`). A policy deciding with P(True) asks the model about each answer as the server does
(app/serving/check_pass.py). Every answer here is wrong, so the share rejected is the share caught.

    python -m benchmarks.false_premises [--artifact DIR] [--model SPEC]
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

from app.engine.engine import Engine
from app.engine.loading import load_model
from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest
from app.serving.check_pass import check_pass, p_true_of
from app.serving.policy import Policy, resolve_policy
from app.settings import DEFAULT_CACHE_DIR, DEFAULT_MODEL, Settings, committed_artifact
from app.uncertainty.answer import AnswerScorer
from app.uncertainty.artifact import Manifest, load_artifact
from app.uncertainty.features import Convention
from app.uncertainty.methods import REGISTRY, Method

QUESTIONS = Path(__file__).parent / "data" / "false_premises.jsonl"
MAX_NEW_TOKENS = 64


def matched_msp_threshold(manifest: Manifest, coverage: float) -> tuple[str, float] | None:
    """MSP's calibrated threshold at a policy's calibration coverage, if calibrate wrote one."""
    name = f"coverage@{round(coverage, 2):g}"
    entry = manifest.thresholds.get(Method("msp"), {}).get(name)
    return (name, entry.threshold) if entry is not None else None


@dataclass(frozen=True)
class Rule:
    """One way to decide: a method's score against a threshold (reject above it)."""

    label: str
    method: Method
    threshold: float


def rules_of(manifest: Manifest, policy: Policy) -> list[Rule]:
    """The default policy; TAD's own at the same target where the default decides with another score; and MSP
    at the calibration coverage of each (what the same share of accepted answers looks like for MSP)."""
    target = policy.name.removeprefix("calibrated:")
    rules: list[Rule] = []
    policies = [(f"default policy ({policy.method.value}, {policy.name})", policy.method)]
    if policy.method is not Method("tad") and target in manifest.thresholds.get(Method("tad"), {}):
        policies.append((f"TAD at {target}", Method("tad")))
    for label, method in policies:
        entry = manifest.thresholds.get(method, {}).get(target)
        if entry is None:
            continue
        rules.append(Rule(label, method, entry.threshold))
        matched = matched_msp_threshold(manifest, entry.coverage)
        if matched is not None and method is not Method("msp"):
            rules.append(Rule(f"  msp at the same coverage ({matched[0]})", Method("msp"), matched[1]))
    return rules


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--artifact", type=Path, default=None, help="default: the catalog model's committed one")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
    parser.add_argument("--show", action="store_true", help="print every answer")
    args = parser.parse_args()
    if args.artifact is None:
        args.artifact = committed_artifact(args.model)
        if args.artifact is None:
            parser.error(f"--artifact: {args.model} has no committed artifact; name one")

    artifact = load_artifact(args.artifact)
    loaded = load_model(args.model, cache_dir=args.cache_dir, artifact_dtype=artifact.manifest.dtype)
    artifact.check_model(loaded.identity)
    engine = Engine(loaded, n_lags=artifact.n_lags, last_row=artifact.convention is Convention.CONSUMING)
    scorer = AnswerScorer(artifact)
    policy = resolve_policy(Settings(artifact_dir=args.artifact), artifact, None)
    if policy.threshold is None:
        raise SystemExit(f"{args.artifact} has no calibrated default policy: run `python -m training calibrate`")
    rules = rules_of(artifact.manifest, policy)

    records = [json.loads(line) for line in QUESTIONS.read_text().splitlines() if line.strip()]
    requests = [
        GenerationRequest(
            prompt_ids=tuple(engine.encode_prompt(messages=[{"role": "user", "content": r["question"]}])),
            params=SamplingParams(max_new_tokens=MAX_NEW_TOKENS),
        )
        for r in records
    ]
    sequences = engine.generate(requests)
    checked: list[float | None] = [None] * len(records)
    if any(REGISTRY[rule.method.value].needs_check_pass for rule in rules):
        checks = [check_pass(engine, r["question"], s.text) for r, s in zip(records, sequences, strict=True)]
        checked = [p_true_of(trace) for trace in engine.score(checks)]
    rejected = {rule.label: 0 for rule in rules}
    for record, sequence, p_true in zip(records, sequences, checked, strict=True):
        scores = {**scorer.score(engine.trace(sequence)).sequence.values, Method("p_true"): p_true}
        verdicts = []
        for rule in rules:
            value = scores.get(rule.method)
            rejects = value is None or math.isnan(value) or value > rule.threshold
            rejected[rule.label] += rejects
            verdicts.append(
                f"{rule.method.value}={'n/a' if value is None else f'{value:.3f}'}:{'R' if rejects else 'A'}"
            )
        if args.show:
            print(f"{record['id']} {' '.join(verdicts)} | {sequence.text!r}")
    n = len(records)
    print(f"questions: {n} (every answer wrong: a made-up premise); model {loaded.identity.name} ({loaded.dtype_name})")
    for rule in rules:
        print(f"{rule.label} rejects {rejected[rule.label]}/{n} = {rejected[rule.label] / n:.2f}")
    if not any(rule.method is Method("msp") for rule in rules[1:]):
        print("msp at the same coverage: n/a (run calibrate to write the matched coverage@ threshold)")


if __name__ == "__main__":
    main()
