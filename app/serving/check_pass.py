"""P(True): the model asked whether its own answer is correct (docs/experiments/p-true.md).

After an answer is generated, one more pass teacher-forces "Yes" after a check prompt, the question
and the answer in one user turn under the model's chat template; the score is 1 - P("Yes") at that
position (higher = less trustworthy, as every method). On Qwen2.5-Coder-1.5B's chat dev answers it
ranks as the experiment's P(no) / (P(yes) + P(no)) does (Spearman 0.98, mean PRR 0.511 against
0.503), with one token to score instead of the whole next-token distribution, so the scheduler's
ordinary scoring pass computes it.
"""

from __future__ import annotations

import math
from dataclasses import replace

from app.engine.engine import Engine
from app.uncertainty.answer import ScoredAnswer
from app.uncertainty.methods import Method, SequenceUncertainty
from app.uncertainty.trace import TokenTrace

CHECK_PROMPT = "Question: {question}\nProposed answer: {answer}\nIs the proposed answer correct? Answer yes or no."
YES = "Yes"
# The check prompt, as error messages name it.
CHECK_PROMPT_NAME = "the prompt that asks the model about its answer"


def check_pass(engine: Engine, question: str, answer: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The check prompt's token ids and the one response token whose probability the pass reads."""
    message = {"role": "user", "content": CHECK_PROMPT.format(question=question, answer=answer)}
    prompt_ids = tuple(engine.encode_prompt(messages=[message]))
    yes = engine.loaded.tokenizer.encode(YES, add_special_tokens=False)[:1]
    return prompt_ids, tuple(int(t) for t in yes)


def p_true_of(trace: TokenTrace) -> float:
    """1 - P("Yes") from a check pass's trace: its teacher-forced first token (the server's passes, and training's
    of stored answers)."""
    return 1.0 - math.exp(float(trace.logprobs[0]))


def with_p_true(scored: ScoredAnswer, p_true: float) -> ScoredAnswer:
    values = dict(scored.sequence.values)
    values[Method("p_true")] = p_true
    return replace(scored, sequence=SequenceUncertainty(values))
