"""Questions with a made-up premise (every answer is wrong): how many does the default policy reject?

The questions (`benchmarks/data/false_premises.jsonl`, written for this project) are asked
the way users ask: chat messages with the bare question, greedy, up to 64 new tokens. Each
answer is decided with the service's default policy (the artifact's default target), and
beside it with MSP at the same coverage: the artifact's MSP threshold calibrated to accept
the share of calibration answers the default policy accepts (`coverage@<c>`, written by
`calibrate`). Every answer here is wrong, so the share rejected is the share caught.

    python -m benchmarks.false_premises [--artifact DIR] [--model SPEC]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from app.engine.engine import Engine
from app.engine.loading import load_model
from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest
from app.serving.policy import decide, resolve_policy
from app.settings import DEFAULT_ARTIFACT, DEFAULT_CACHE_DIR, DEFAULT_MODEL, Settings
from app.uncertainty.answer import AnswerScorer
from app.uncertainty.artifact import load_artifact
from app.uncertainty.features import Convention
from app.uncertainty.methods import Method

QUESTIONS = Path(__file__).parent / "data" / "false_premises.jsonl"
MAX_NEW_TOKENS = 64


def matched_msp_threshold(manifest: object, coverage: float) -> tuple[str, float] | None:
    """MSP's calibrated threshold at the default policy's calibration coverage, if calibrate wrote one."""
    name = f"coverage@{round(coverage, 2):g}"
    entry = manifest.thresholds.get(Method("msp"), {}).get(name)  # type: ignore[attr-defined]
    return (name, entry.threshold) if entry is not None else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--artifact", type=Path, default=DEFAULT_ARTIFACT)
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
    parser.add_argument("--show", action="store_true", help="print every answer")
    args = parser.parse_args()

    artifact = load_artifact(args.artifact)
    loaded = load_model(args.model, cache_dir=args.cache_dir)
    artifact.check_model(loaded.identity)
    engine = Engine(loaded, n_lags=artifact.n_lags, last_row=artifact.convention is Convention.CONSUMING)
    scorer = AnswerScorer(artifact)
    policy = resolve_policy(Settings(artifact_dir=args.artifact), artifact, None)
    default_entry = artifact.manifest.thresholds.get(policy.method, {}).get(policy.name.removeprefix("calibrated:"))
    matched = matched_msp_threshold(artifact.manifest, default_entry.coverage) if default_entry else None

    records = [json.loads(line) for line in QUESTIONS.read_text().splitlines() if line.strip()]
    requests = [
        GenerationRequest(
            prompt_ids=tuple(engine.encode_prompt(messages=[{"role": "user", "content": r["question"]}])),
            params=SamplingParams(max_new_tokens=MAX_NEW_TOKENS),
        )
        for r in records
    ]
    rejected_default = rejected_msp = 0
    for record, sequence in zip(records, engine.generate(requests), strict=True):
        scored = scorer.score(engine.trace(sequence))
        decision = decide(policy, scored.sequence)
        rejected_default += not decision.accept
        msp = scored.sequence.get(Method("msp"))
        msp_rejects = matched is not None and msp is not None and msp > matched[1]
        rejected_msp += msp_rejects
        if args.show:
            verdict = "reject" if not decision.accept else "accept"
            print(
                f"{record['id']} {verdict} {policy.method.value}={decision.score:.3f} msp={msp:.2f} | {sequence.text!r}"
            )
    n = len(records)
    print(f"questions: {n} (every answer wrong: a made-up premise); policy: {policy.name} on {policy.method.value}")
    print(f"default policy rejects {rejected_default}/{n} = {rejected_default / n:.2f}")
    if matched is None:
        print("msp at the same coverage: n/a (run calibrate to write the matched coverage@ threshold)")
    else:
        print(f"msp at the same coverage ({matched[0]}) rejects {rejected_msp}/{n} = {rejected_msp / n:.2f}")


if __name__ == "__main__":
    main()
