"""Quality targets sim(y, y*) per task (training/targets.py)."""

import pytest

from training.data import QARecord, Task
from training.targets import (
    chosen_letter,
    final_number,
    math_score,
    multiple_choice_score,
    normalise,
    rouge_l,
    short_answer_score,
    token_f1,
    truthfulness_score,
)

CHOICES = ["Fish", "Bird", "Reptile", "Mammal"]


def _record(task, answers, **fields):
    return QARecord(id="r1", question="q?", answers=answers, task=task, **fields)


def _mc_record(key="B", **fields):
    meta = {"answer_key": key} if key else {}
    return _record(Task.MULTIPLE_CHOICE, [CHOICES["ABCD".index(key or "B")]], choices=CHOICES, meta=meta, **fields)


# --- normalise / token F1 / short answers -----------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("An apple, a day...", "apple day"),
        ("  Theater   and\tTHEME ", "theater and theme"),
        ("U.S.A.", "usa"),
        ("", ""),
        # written differently, read the same
        ("Luka Modrić", "luka modric"),
        ("2012\u201313", "2012-13"),
        ("48.8\u00b0C", "48.8 c"),
        ("Twenty-eight years", "28 years"),
        ("twenty eight", "28"),
        ("1,986 metres", "1986 metres"),
        # a sign inside a number is part of it
        ("2.8%", "2.8"),
        ("-2", "-2"),
        ("30/5", "30/5"),
    ],
)
def test_normalise(text, expected):
    assert normalise(text) == expected


def test_token_f1_hand_computed():
    # predicted [cat, sat], expected [cat, sat, on, mat]: P = 1, R = 1/2, F1 = 2/3.
    assert token_f1("The cat sat.", "the cat sat on the mat") == pytest.approx(2 / 3)
    # Multiset overlap: predicted [x, x, y], expected [x, y]: common 2, P = 2/3, R = 1, F1 = 0.8.
    assert token_f1("x x y", "x y") == pytest.approx(0.8)
    assert token_f1("dog", "cat") == 0.0
    assert token_f1("Paris", "paris!") == 1.0


def test_token_f1_empty_after_normalisation():
    assert token_f1("the", "a") == 1.0  # both empty
    assert token_f1("the", "cat") == 0.0
    assert token_f1("cat", "") == 0.0


def test_short_answer_containment_gives_one():
    assert short_answer_score("I think it was in 1596, probably.", ["1596"]) == 1.0
    assert short_answer_score("Warsaw, Poland", ["Krakow", "the Poland"]) == 1.0


def test_short_answer_containment_needs_whole_words():
    # "1596" inside "15960" is no match, and the token F1 of different tokens is 0.
    assert short_answer_score("15960", ["1596"]) == 0.0


def test_short_answer_no_credit_for_repeating_the_question():
    question = "What is the common name of the laryngeal prominence?"
    aliases = ["Adam's apple", "Laryngeal prominence", "Adams apple"]
    assert short_answer_score("The laryngeal prominence is the laryngoplacenta.", aliases, question) < 0.5
    assert short_answer_score("It is called the Adam's apple.", aliases, question) == 1.0
    # Either-or questions name their answer: when every reference is in the question, they all count.
    assert short_answer_score("Scandinavia", ["Scandinavia"], "Scandinavia or Germany first?") == 1.0


def test_short_answer_empty_references_and_answers_score_nothing():
    assert short_answer_score("", [",", "Paris"]) == 0.0  # "," normalises to nothing: it matched an empty answer
    assert short_answer_score("Paris", [","]) == 0.0


def test_short_answer_number_words_and_decimals():
    assert short_answer_score("Twenty", ["20"]) == 1.0
    assert short_answer_score("twenty one", ["21"]) == 1.0
    assert short_answer_score("one", ["1"]) == 1.0
    assert short_answer_score("No one knows.", ["1"]) == 0.0  # "one" in a sentence is a pronoun
    assert short_answer_score("28%", ["2.8%"]) == 0.0  # was 1.0: the decimal point was removed


def test_short_answer_partial_overlap_gives_best_f1():
    # [river, thames, in, london] vs [thames, river]: common 2, P = 1/2, R = 1, F1 = 2/3; "Paris" gives 0.
    assert short_answer_score("the river Thames in London", ["Paris", "Thames River"]) == pytest.approx(2 / 3)


# --- multiple choice ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prediction", "expected"),
    [
        ("B", "B"),
        ("B. Bird", "B"),
        ("B) Bird", "B"),
        ("(C)", "C"),
        ("  D:", "D"),
        ("The answer is D", "D"),
        ("The answer is (A).", "A"),
        ("answer: c", "C"),
        ("Option B is right", "B"),
        ("mammal", "D"),
        ("It is a reptile.", "C"),
    ],
)
def test_chosen_letter(prediction, expected):
    assert chosen_letter(prediction, CHOICES) == expected


@pytest.mark.parametrize(
    "prediction",
    [
        "**C**",
        "Answer: **C**",
        "**Answer:** C",
        "The correct answer is **C**",
        "The correct answer is: C",
        "c)",
        "c",
        "I think it is C.",
        "C is the correct answer.",
        "I would choose C.",
        "[C]",
        "C\n\nExplanation: option A is wrong",
        "A common misconception is that it rises. The correct answer is C.",
        "Option A is incorrect. The answer is C.",
        "**C. Reptile",
    ],
)
def test_chosen_letter_as_small_chat_models_write_it(prediction):
    assert chosen_letter(prediction, CHOICES) == "C"


def test_chosen_letter_listing_the_options_or_naming_two_chooses_none():
    assert chosen_letter("A) Fish\nB) Bird\nC) Reptile\nD) Mammal", CHOICES) is None
    assert chosen_letter("A) Fish, B) Bird, C) Reptile, D) Mammal", CHOICES) is None  # on one line too
    assert chosen_letter("C. Reptile\n\nThe answer is D. Mammal", CHOICES) is None
    assert chosen_letter("The answer is A. Wait, actually the answer is B.", CHOICES) is None
    assert chosen_letter("C. Reptile\n\nThe answer is C.", CHOICES) == "C"
    # A choice first, the other options discussed after it (in another order than a listing's).
    assert chosen_letter("B) Bird\n\nA) Fish is wrong.\nC) Reptile is wrong.", CHOICES) == "B"
    assert chosen_letter("D. Mammal\n\nWhy not the others:\nA) gills\nB) feathers", CHOICES) == "D"


def test_chosen_letter_skips_a_letter_said_not_to_be_it():
    assert chosen_letter("It cannot be C. It must be D.", CHOICES) == "D"


@pytest.mark.parametrize("prediction", ["E", "Bird or fish", "I do not know", ""])
def test_chosen_letter_none_when_unclear(prediction):
    # "E" is beyond the four options; naming two options' texts is ambiguous.
    assert chosen_letter(prediction, CHOICES) is None


def test_chosen_letter_does_not_read_the_article_a_as_option_a():
    assert chosen_letter("The answer is a mammal.", CHOICES) == "D"


def test_chosen_letter_matches_option_text_as_whole_words():
    assert chosen_letter("100", ["1", "10", "100", "1000"]) == "C"


def test_multiple_choice_score_uses_answer_key():
    record = _mc_record("B")
    assert multiple_choice_score("B", record) == 1.0
    assert multiple_choice_score("Bird", record) == 1.0
    assert multiple_choice_score("The answer is (B)", record) == 1.0
    assert multiple_choice_score("C", record) == 0.0
    assert multiple_choice_score("no idea", record) == 0.0


def test_multiple_choice_score_derives_key_from_answer_text():
    record = _record(Task.MULTIPLE_CHOICE, ["Reptile"], choices=CHOICES)
    assert multiple_choice_score("C", record) == 1.0
    assert multiple_choice_score("B", record) == 0.0


def test_multiple_choice_score_zero_when_answer_not_an_option():
    record = _record(Task.MULTIPLE_CHOICE, ["Amphibian"], choices=CHOICES)
    assert multiple_choice_score("A", record) == 0.0
    assert multiple_choice_score("Amphibian", record) == 0.0


# --- math ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is 1,500.", 1500.0),
        ("The answer is $1,500.00", 1500.0),
        ("3 apples and 4 pears make 7 fruits.", 7.0),
        ("The answer is 42. Check: 42 - 2 = 40", 42.0),
        ("So the change is -12.5 dollars", -12.5),
        ("answer is 0", 0.0),
    ],
)
def test_final_number(text, expected):
    assert final_number(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Step 1: the answer is 240 months. Step 2: ... The answer is 1500.", 1500.0),  # the last one
        ("The answer is 3 x 4 + 1488 = 1500.", 1500.0),  # the last number of its sentence
        ("The answer is eight.", 8.0),
        # the stated number, not one of an aside after it
        ("The answer is 4 (2 + 2).", 4.0),
        ("The answer is 24 because he had 30 and ate 6.", 24.0),
        ("The answer is 3.5 hours, or 210 minutes.", 3.5),
    ],
)
def test_final_number_as_small_models_write_it(text, expected):
    assert final_number(text) == expected


def test_final_number_none_without_a_number():
    assert final_number("I cannot solve this.") is None


def test_math_score():
    assert math_score("The answer is 1,500.", ["1500"]) == 1.0
    assert math_score("The answer is 1500", ["1,500"]) == 1.0
    assert math_score("We get 20, then 30, so 50 in total", ["50"]) == 1.0  # last number
    assert math_score("The answer is 13. Earlier I had 12", ["12"]) == 0.0  # marked answer wins
    assert math_score("no idea", ["12"]) == 0.0
    assert math_score("The answer is 7", ["n/a", "7"]) == 1.0  # unparsable reference skipped
    assert math_score("The answer is 7", ["8"]) == 0.0


# --- ROUGE-L / TruthfulQA -------------------------------------------------------------------------


def test_rouge_l_sanity():
    assert rouge_l("the cat sat on the mat", "the cat sat on the mat") == pytest.approx(1.0)
    assert rouge_l("dogs bark", "the cat sat") == 0.0
    assert rouge_l("", "the cat") == 0.0
    assert rouge_l("the cat", "   ") == 0.0
    # LCS of 3 tokens: P = 3/3, R = 3/6, F = 2/3.
    assert rouge_l("the cat sat", "the cat sat on the mat") == pytest.approx(2 / 3)
    # Stemming: "cats running" and "cat runs" have the same stems.
    assert rouge_l("cats running", "cat runs") == pytest.approx(1.0)


def _truthful_record(incorrect):
    return _record(
        Task.OPEN_QA_TRUTHFULNESS,
        ["Nothing happens if you swallow gum", "The gum passes through you"],
        meta={"incorrect_answers": incorrect},
    )


def test_truthfulness_closer_to_correct_is_one():
    record = _truthful_record(["Gum stays in your stomach for seven years"])
    assert truthfulness_score("Nothing happens, it passes through you", record) == 1.0
    assert truthfulness_score("It stays in your stomach for seven years", record) == 0.0


def test_truthfulness_tie_is_zero_and_no_incorrect_refs_needs_overlap():
    # Identical correct and incorrect references: never strictly closer to the correct one.
    tied = _record(Task.OPEN_QA_TRUTHFULNESS, ["yes it is"], meta={"incorrect_answers": ["yes it is"]})
    assert truthfulness_score("yes it is", tied) == 0.0
    no_incorrect = _record(Task.OPEN_QA_TRUTHFULNESS, ["Nothing happens"])
    assert truthfulness_score("nothing at all happens", no_incorrect) == 1.0
    assert truthfulness_score("purple elephants", no_incorrect) == 0.0
