"""Does P(True)'s definition matter? (docs/experiments/p-true.md, "Which definition the service computes")

Per chat dev answer: P(Yes), P(No) (canonical first tokens) and the variant sums, written to
`<out>/variants.json`; then the PRR of each definition per dataset and its Spearman correlation with
the experiment's score (`<out>/dev_scores.json`, from `benchmarks.p_true`).

    python -m benchmarks.p_true_definitions --out /work/runs/p-true
"""

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr
from tqdm import tqdm

from app.engine.engine import Engine
from app.engine.loading import load_model
from app.settings import DEFAULT_CACHE_DIR, DEFAULT_MODEL
from benchmarks.p_true import BATCH, CHECK, INFORMATIVE, first_tokens, user_turn
from training.rejection import prediction_rejection_ratio
from training.runs import iter_texts

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--out", type=Path, required=True)
parser.add_argument(
    "--dev", type=Path, nargs="+", default=[Path("/work/runs/qwen-dev-chat"), Path("/work/runs/qwen-dev-chat-extra")]
)
args = parser.parse_args()
dev = [t for t in iter_texts(args.dev) if t.meta["dataset"] in INFORMATIVE]
cached = args.out / "variants.json"
if cached.is_file():  # the 24-minute pass already ran
    out = np.array(json.loads(cached.read_text()))
else:
    engine = Engine(load_model(DEFAULT_MODEL, dtype="bfloat16", cache_dir=DEFAULT_CACHE_DIR), n_lags=0)
    tok = engine.loaded.tokenizer
    yes_ids = first_tokens(engine, ("Yes", "yes", " Yes", " yes", "YES"))
    no_ids = first_tokens(engine, ("No", "no", " No", " no", "NO"))
    yes1 = tok.encode("Yes", add_special_tokens=False)[0]
    no1 = tok.encode("No", add_special_tokens=False)[0]
    pairs = [(user_turn(t.meta), t.meta["answer"]) for t in dev]
    ids = [
        engine.encode_prompt(messages=[{"role": "user", "content": CHECK.format(question=q, answer=a)}])
        for q, a in pairs
    ]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out = np.zeros((len(ids), 4))
    model, pad = engine.loaded.model, engine.context.pad_token_id
    for start in tqdm(range(0, len(order), BATCH)):
        chunk = order[start : start + BATCH]
        width = max(len(ids[i]) for i in chunk)
        inputs = torch.tensor([[pad] * (width - len(ids[i])) + ids[i] for i in chunk])
        mask = torch.tensor([[0] * (width - len(ids[i])) + [1] * len(ids[i]) for i in chunk])
        with torch.inference_mode():
            probs = torch.softmax(
                model(input_ids=inputs, attention_mask=mask, logits_to_keep=1).logits[:, -1].float(), -1
            )
        for row, i in enumerate(chunk):
            out[i] = [probs[row, yes1], probs[row, no1], probs[row, yes_ids].sum(), probs[row, no_ids].sum()]
    cached.write_text(json.dumps(out.tolist()))
reference = np.array(json.loads((args.out / "dev_scores.json").read_text()))
quality = np.array([t.target for t in dev])
datasets = np.array([t.meta["dataset"] for t in dev])
yes_one, no_one, yes_all, no_all = out.T
definitions = {
    "P(no) / (P(yes) + P(no)), variants summed": no_all / (yes_all + no_all),
    "P(No) / (P(Yes) + P(No)), canonical": no_one / (yes_one + no_one),
    "1 - P(Yes)": 1 - yes_one,
}
print(
    "max |summed - the experiment's|",
    float(np.abs(definitions["P(no) / (P(yes) + P(no)), variants summed"] - reference).max()),
)
for name, score in definitions.items():
    prr = [prediction_rejection_ratio(score[datasets == d], quality[datasets == d]) for d in INFORMATIVE]
    rho = spearmanr(score, reference)[0]
    print(f"{name}: Spearman {rho:.4f}, PRR {[round(x, 3) for x in prr]}, mean {np.mean(prr):.3f}")
