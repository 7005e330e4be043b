"""The quality target sim(y, y*) in [0, 1] of a generated answer, per task.

- short answers (open QA, extractive QA): 1 when a normalised reference occurs as whole
  words in the normalised answer, else the best SQuAD token-F1 against any reference (a
  reference the question itself contains gives no credit for repeating the question);
- multiple choice: 1 when the chosen letter (or the option's text) is the right one;
- math word problems: 1 when the final number equals the reference number;
- TruthfulQA: 1 when the answer is closer (ROUGE-L) to some correct reference than to
  every incorrect one;
- long-form QA: ROUGE-L F-measure against the reference.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from functools import lru_cache
from typing import Any

from training.data import LETTERS, QARecord

# Runs record the version their answers were scored with (run.json "targets"; none: 1). 2: Unicode,
# symbols, number words and signs in numbers; no credit for repeating the question or for empty
# references; letters as small chat models write them, and none for listing the options or naming two;
# the last "answer is" of a math answer.
TARGETS_VERSION = 2
# What to do with a run scored with older targets (the one-time `rescore` migration left with commit a14ddbe).
RESCORE_HINT = "rescore its answers with `python -m training rescore` of commit a14ddbe (no generation)"

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_DASHES = re.compile(r"[\u2010-\u2015\u2212]")  # hyphens, en and em dashes, the minus sign
# A sign or operator inside a number ("2.8", "-2", "30/5", "2012-13") is part of it: "2.8" is not "28".
_IN_NUMBER = re.compile(r"(?<=\d)[./+*^=:-](?=\d)|(?<![\w.])-(?=\d)")
_KEPT = "\x00"  # stands for a kept sign while punctuation is removed (not punctuation itself)
_UNITS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
    "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15,
    "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19,
}  # fmt: skip
_TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90}
_NUMBER_WORDS = {**_UNITS, **_TENS} | {
    tens + unit: value + _UNITS[unit] for tens, value in _TENS.items() for unit in list(_UNITS)[1:10]
}  # "twentyeight": "twenty-eight" once its hyphen is removed


def _numbers_as_digits(words: list[str]) -> list[str]:
    """Number words as digits, "twenty eight" as one number, so "twenty-eight" and "28" agree."""
    out: list[str] = []
    tens = {str(v) for v in _TENS.values()}
    for word in words:
        value = _NUMBER_WORDS.get(word)
        if value is not None and out and word in _UNITS and 0 < value < 10 and out[-1] in tens:
            out[-1] = str(int(out[-1]) + value)  # "twenty one"
        elif value is None or (word == "one" and len(words) > 1):  # "no one", "the one": a pronoun
            out.append(word)
        else:
            out.append(str(value))
    return out


def normalise(text: str) -> str:
    """SQuAD normalisation (lower case, no punctuation, no articles, single spaces), made to agree on
    what a reference and an answer write differently: accents ("Modrić"), Unicode dashes and symbols
    ("48.8°C"), number words ("twenty-eight"); signs inside numbers are kept ("2.8" is not "28")."""
    text = unicodedata.normalize("NFKD", text.lower())
    text = _IN_NUMBER.sub(lambda match: _KEPT + match.group(0), _DASHES.sub("-", text))
    kept = []
    for index, ch in enumerate(text):
        if ch == _KEPT or unicodedata.combining(ch):
            continue
        if index > 0 and text[index - 1] == _KEPT:
            kept.append(ch)
        elif ch in _PUNCTUATION or unicodedata.category(ch).startswith("P"):
            continue  # removed, as SQuAD does ("U.S.A." is "usa")
        elif unicodedata.category(ch).startswith("S"):
            kept.append(" ")  # a symbol such as "°" separates ("48.8°C" is "48.8 c", as "48.8 °C")
        else:
            kept.append(ch)
    words = _ARTICLES.sub(" ", "".join(kept)).split()
    return " ".join(_numbers_as_digits(words))


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


def short_answer_score(prediction: str, references: list[str], question: str = "") -> float:
    """1 when a reference occurs in the answer, else the best token-F1. References that normalise to
    nothing are no reference (an empty answer would match them), and one the question contains
    ("laryngeal prominence" for "What is the common name of the laryngeal prominence?") gives no
    credit for repeating the question, unless every reference is in it."""
    usable = [ref for ref in references if normalise(ref)]
    asked = f" {normalise(question)} "
    not_asked = [ref for ref in usable if f" {normalise(ref)} " not in asked]
    usable = not_asked or usable
    if not usable or not normalise(prediction):
        return 0.0
    if any(contains_reference(prediction, ref) for ref in usable):
        return 1.0
    return max(token_f1(prediction, ref) for ref in usable)


def _named_letters(text: str, valid: str, keyword: str) -> set[str]:
    """Every letter after `keyword` ("answer is C"): upper case anywhere; lower case only standing alone
    ("answer: c"), so that the article in "the answer is a mammal" is not read as option A."""
    pattern = rf"\b(?i:{keyword})\s*(?i:is\s*:?|:)?\s*\(?"
    upper = re.findall(rf"{pattern}([{valid}])\b", text)
    lower = re.findall(rf"{pattern}([{valid.lower()}])(?=[).:]|\s*$)", text)
    return {letter.upper() for letter in [*upper, *lower]}


def _lists_the_options(text: str, valid: str) -> bool:
    """Whether the answer starts by listing the options in order ("A) ..., B) ..., C) ..."), on one line
    or several: then its first letter is no choice. Options discussed after a choice come in another order."""
    marks = re.findall(rf"(?:^|\s)[(\[]?([{valid}{valid.lower()}])[).:\]](?=\s|$)", text)
    order = [mark.upper() for mark in marks[:3]]
    return len(order) >= 2 and order == list(valid[: len(order)]) and (len(order) == 3 or len(valid) == 2)


def chosen_letter(prediction: str, choices: list[str]) -> str | None:
    """The option a multiple-choice answer picks: the letter it names ("The answer is C"), a leading
    letter ("C.", "(c)"), a letter it says something is ("I think it is C."), else an option's text."""
    valid = LETTERS[: len(choices)]
    text = re.sub(r"[*_`#]", "", prediction).strip()  # markdown: "**C**", "**Answer:** C"
    named = _named_letters(text, valid, "answer")
    # A leading letter needs a mark after it: "A common misconception ..." starts with an article. An
    # answer that starts by listing the options ("A) ...", "B) ...") chooses none of them that way.
    match = re.match(rf"^[(\[]?([{valid}{valid.lower()}])(?:[).:\]]|\s*\n|$)", text)
    leading = {match.group(1).upper()} if match and not _lists_the_options(text, valid) else set()
    if named or leading:
        # "C. ...\n\nThe answer is D." or "The answer is A. Wait, the answer is B.": naming two, it chooses neither.
        chosen = named | leading
        return chosen.pop() if len(chosen) == 1 else None
    option = _named_letters(text, valid, "option")  # after the leading letter: "C. Option A is wrong"
    if option:
        return option.pop() if len(option) == 1 else None
    said = (
        rf"^\(?([{valid}])\)?\s+is\s+(?:the\s+)?(?:correct|right|answer|best)",  # "C is the correct answer."
        rf"\b(?:is|be)\s+\(?([{valid}])(?:[).:]|\s*$)",  # "I think it is C."
        rf"\b(?i:choose|pick|select|go with)\s+(?i:option\s+)?\(?([{valid}])\b",  # "I would choose C."
    )
    for pattern in said:
        for found in re.finditer(pattern, text):
            if not re.search(r"\b(?:not|never|cannot)\s*$|n't\s*$", text[: found.start()].lower()):
                return found.group(1)
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


def _stated_number(sentence: str) -> str | None:
    """The number a sentence after "answer is" states: after its last "=" ("3 x 4 = 12"), else its first,
    before any aside ("4 (2 + 2)", "24 because ...", "3.5 hours, or 210 minutes"); a lone number word."""
    statement = re.split(r"\(|, |\b(?:because|since|as|which|so)\b", sentence, maxsplit=1)[0]
    if "=" in statement:
        statement = statement.rsplit("=", 1)[1]
    numbers = _NUMBER.findall(statement)
    if numbers:
        return str(numbers[0])
    words = normalise(statement).split()
    if any(word in ("hundred", "thousand", "million", "billion") for word in words):
        return None  # "one hundred": not a number these words make
    digits = [word for word in _numbers_as_digits(words) if word.isdigit()]
    return digits[0] if len(digits) == 1 else None


def final_number(text: str) -> float | None:
    """The number after the last "answer is" (the last one of its sentence: "The answer is 3 x 4 = 12."),
    else the text's last number."""
    marked = list(re.finditer(r"answer is\b(.*?)(?:\.(?:\s|$)|\n|$)", text, flags=re.IGNORECASE))
    found = _stated_number(marked[-1].group(1)) if marked else None
    if found is None:
        found = (_NUMBER.findall(text) or [None])[-1]
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
