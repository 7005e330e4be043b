"""The service's metrics from one answer's timing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from app.serving.events import Timing
from app.serving.metrics import ServiceMetrics


def _answer(tokens: int, timing: Timing, chosen: int | None = None) -> SimpleNamespace:
    """`chosen`: tokens the model chose, the stop token and trimmed ones included (default: `tokens`)."""
    sequence = SimpleNamespace(
        kept_tokens=[object()] * tokens, tokens_chosen=tokens if chosen is None else chosen, finish_reason=None
    )
    return SimpleNamespace(sequence=sequence, timing=timing)


def test_time_per_output_token_counts_the_decode_steps_not_the_prefill() -> None:
    """Queued 1 s, first token after 3 s (a long prompt's prefill), 5 tokens by 5 s: the four later tokens took
    0.5 s each. Counting the prefill in would give 0.8 s, slow decoding that did not happen."""
    metrics = ServiceMetrics()
    metrics.observe_generation(_answer(5, Timing(queued_s=1.0, first_token_s=3.0, total_s=5.0)))  # type: ignore[arg-type]
    metrics.observe_generation(_answer(1, Timing(queued_s=0.0, first_token_s=0.2, total_s=0.2)))  # type: ignore[arg-type]
    sample = metrics.registry.get_sample_value
    assert sample("tad_time_per_output_token_seconds_count") == 1  # one token: no time between tokens
    assert sample("tad_time_per_output_token_seconds_sum") == pytest.approx(0.5)
    assert sample("tad_time_to_first_token_seconds_sum") == pytest.approx(3.2)


def test_time_per_output_token_counts_the_stop_token_among_the_steps() -> None:
    """4 tokens then the end token, first token at 1 s, done at 3 s: 4 decode steps after the first token (the
    end token's included), 0.5 s each, as vLLM counts it; the 3 kept tokens after the first would make it 0.67."""
    metrics = ServiceMetrics()
    metrics.observe_generation(_answer(4, Timing(queued_s=0.0, first_token_s=1.0, total_s=3.0), chosen=5))  # type: ignore[arg-type]
    assert metrics.registry.get_sample_value("tad_time_per_output_token_seconds_sum") == pytest.approx(0.5)
    assert metrics.registry.get_sample_value("tad_generated_tokens_total") == 5  # as usage counts them


def test_a_client_gone_counts_as_a_failed_generation_and_its_wait_as_a_wait() -> None:
    metrics = ServiceMetrics()
    metrics.observe_client_gone(Timing(queued_s=30.0, first_token_s=None, total_s=30.0))  # gave up in the queue
    sample = metrics.registry.get_sample_value
    assert sample("tad_failed_generations_total", {"error_type": "client_disconnected"}) == 1
    assert sample("tad_queue_time_seconds_sum") == 30.0 and sample("tad_time_to_first_token_seconds_count") == 0


def test_the_rolling_window_says_how_many_answers_its_rate_is_of() -> None:
    metrics = ServiceMetrics(rejection_window=3)
    for value in (0.9, 0.1, 0.1, 0.1):
        metrics.observe_answer({"msp": value}, {"msp": 0.5})
    sample = metrics.registry.get_sample_value
    assert sample("tad_rolling_rejection_answers", {"method": "msp"}) == 3  # the window's, not all answers
    metrics.reset_rejection_windows()
    assert sample("tad_rolling_rejection_answers", {"method": "msp"}) is None


def test_an_empty_answer_counts_as_rejected_in_the_rolling_rate_as_it_is_decided() -> None:
    """An empty answer's scores are undefined (NaN): the policy rejects it and calibration counted it rejected,
    so the rolling would-reject rate that watches for drift counts it too (it is left out of the histograms)."""
    metrics = ServiceMetrics()
    metrics.observe_answer({"msp": 0.2}, {"msp": 0.5})
    metrics.observe_answer({"msp": float("nan")}, {"msp": 0.5})
    sample = metrics.registry.get_sample_value
    assert sample("tad_rolling_rejection_rate", {"method": "msp"}) == 0.5
    assert sample("tad_sequence_uncertainty_count", {"method": "msp"}) == 1


def test_an_infinite_score_is_judged_but_kept_out_of_the_histogram() -> None:
    metrics = ServiceMetrics()
    metrics.observe_answer({"perplexity": float("inf")}, {"perplexity": 5.0})
    metrics.observe_answer({"perplexity": 3.0}, {"perplexity": 5.0})
    sample = metrics.registry.get_sample_value
    assert sample("tad_rolling_rejection_rate", {"method": "perplexity"}) == 0.5
    assert sample("tad_sequence_uncertainty_sum", {"method": "perplexity"}) == 3.0


def test_bounded_scores_near_a_threshold_fall_in_buckets_of_their_own() -> None:
    metrics = ServiceMetrics()
    for value in (0.61, 0.66):  # either side of a 0.642 threshold
        metrics.observe_answer({"tad": value}, {})
    sample = metrics.registry.get_sample_value
    assert sample("tad_sequence_uncertainty_bucket", {"method": "tad", "le": "0.65"}) == 1
    assert sample("tad_sequence_uncertainty_bucket", {"method": "tad", "le": "0.7"}) == 2


def test_resetting_the_rejection_windows_forgets_answers_judged_on_old_thresholds() -> None:
    metrics = ServiceMetrics()
    metrics.observe_answer({"msp": 0.9, "tad": 0.9}, {"msp": 0.5, "tad": 0.5})
    metrics.reset_rejection_windows()
    sample = metrics.registry.get_sample_value
    assert sample("tad_rolling_rejection_rate", {"method": "tad"}) is None
    metrics.observe_answer({"tad": 0.1}, {"tad": 0.5})
    assert sample("tad_rolling_rejection_rate", {"method": "tad"}) == 0.0
    assert sample("tad_rolling_rejection_rate", {"method": "msp"}) is None
