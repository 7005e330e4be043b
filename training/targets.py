"""The quality target sim(y, y*) in [0, 1] of a generated answer, per task.

- short answers (open QA, extractive QA): 1 when a normalised reference occurs as whole
  words in the normalised answer, else the best SQuAD token-F1 against any reference;
- multiple choice: 1 when the chosen letter (or the option's text) is the right one;
- math word problems: 1 when the final number equals the reference number;
- TruthfulQA: 1 when the answer is closer (ROUGE-L) to some correct reference than to
  every incorrect one;
- long-form QA: ROUGE-L F-measure against the reference.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from functools import lru_cache
from typing import Any

from training.data import LETTERS, QARecord

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def normalise(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def token_f1(prediction: str, reference: str) -> float:
    predicted, expected = normalise(prediction).split(), normalise(reference).split()
    if not predicted or not expected:
        return float(predicted == expected)
    common = sum((Counter(predicted) & Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def contains_reference(prediction: str, reference: str) -> bool:
    expected = normalise(reference)
    return bool(expected) and f" {expected} " in f" {normalise(prediction)} "


def short_answer_score(prediction: str, references: list[str]) -> float:
    if any(contains_reference(prediction, ref) for ref in references):
        return 1.0
    return max(token_f1(prediction, ref) for ref in references)


def chosen_letter(prediction: str, choices: list[str]) -> str | None:
    """The option a multiple-choice answer picks: a leading letter, else an option's text."""
    valid = LETTERS[: len(choices)]
    text = prediction.strip()
    match = re.match(rf"^\(?([{valid}])(?:[).:\s]|$)", text)
    if match:
        return match.group(1)
    # Upper-case letters anywhere after "answer is"; a lower-case one only standing alone ("answer: c"),
    # so that the article in "the answer is a mammal" is not read as option A.
    keyword = r"\b(?i:answer|option)\s*(?i:is|:)?\s*\(?"
    match = re.search(rf"{keyword}([{valid}])\b", text) or re.search(
        rf"{keyword}([{valid.lower()}])(?=[).:]|\s*$)", text
    )
    if match:
        return match.group(1).upper()
    normalised = f" {normalise(text)} "
    options = [normalise(choice) for choice in choices]
    exact = [LETTERS[i] for i, option in enumerate(options) if option and option == normalised.strip()]
    if len(exact) == 1:
        return exact[0]
    hits = [LETTERS[i] for i, option in enumerate(options) if option and f" {option} " in normalised]
    return hits[0] if len(hits) == 1 else None


def multiple_choice_score(prediction: str, record: QARecord) -> float:
    choices = record.choices or []
    key = record.meta.get("answer_key")
    if key is None:
        key = LETTERS[choices.index(record.answers[0])] if record.answers[0] in choices else None
    return float(key is not None and chosen_letter(prediction, choices) == key)


def final_number(text: str) -> float | None:
    marked = re.search(r"answer is\s*\$?\s*(-?\d[\d,]*(?:\.\d+)?)", text, flags=re.IGNORECASE)
    found = marked.group(1) if marked else (_NUMBER.findall(text) or [None])[-1]
    if found is None:
        return None
    try:
        return float(found.replace(",", "").rstrip("."))
    except ValueError:
        return None


def math_score(prediction: str, references: list[str]) -> float:
    value = final_number(prediction)
    if value is None:
        return 0.0
    for ref in references:
        try:
            if abs(float(ref.replace(",", "")) - value) < 1e-6:
                return 1.0
        except ValueError:
            continue
    return 0.0


@lru_cache(maxsize=1)
def _rouge_scorer() -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def rouge_l(prediction: str, reference: str) -> float:
    if not prediction.strip() or not reference.strip():
        return 0.0
    return float(_rouge_scorer().score(reference, prediction)["rougeL"].fmeasure)


def truthfulness_score(prediction: str, record: QARecord) -> float:
    correct = max(rouge_l(prediction, ref) for ref in record.answers)
    incorrect_refs = [str(ref) for ref in record.meta.get("incorrect_answers", [])]
    incorrect = max((rouge_l(prediction, ref) for ref in incorrect_refs), default=0.0)
    return float(correct > incorrect)


def rouge_l_best(prediction: str, references: list[str]) -> float:
    return max(rouge_l(prediction, ref) for ref in references)
