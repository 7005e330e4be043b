"""Prometheus metrics of the service, in a registry of its own (one per app instance)."""

from __future__ import annotations

import math
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from app.serving.events import GenerationResult, Timing
from app.serving.policy import Decision
from app.uncertainty.methods import Method, SequenceUncertainty

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120, 300)
TOKEN_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0)
# Every 0.05 over [0, 1], where the bounded scores (TAD's mean, P(True)) and their thresholds lie, then wide steps
# for the unbounded ones (perplexity, summed log-probabilities, RAUQ) over long answers.
UNCERTAINTY_BUCKETS = (
    *(round(0.05 * i, 2) for i in range(1, 21)),
    *(1.5, 2, 3, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000),
)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)


class ServiceMetrics:
    def __init__(self, rejection_window: int = 200) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("tad_requests", "HTTP requests by route and status", ["route", "status"], registry=r)
        self.latency = Histogram(
            "tad_request_duration_seconds", "Request latency by route", ["route"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.in_flight = Gauge("tad_requests_in_flight", "/v1 requests being handled", registry=r)
        self.time_per_token = Histogram(
            "tad_time_per_output_token_seconds",
            "Time per output token after the first (decode steps only, as vLLM's TPOT)",
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.time_to_first_token = Histogram(
            "tad_time_to_first_token_seconds", "Time from arrival to first token", buckets=LATENCY_BUCKETS, registry=r
        )
        self.queue_time = Histogram(
            "tad_queue_time_seconds", "Time requests waited before prefill", buckets=LATENCY_BUCKETS, registry=r
        )
        self.queue_depth = Gauge("tad_queue_depth", "Requests waiting for a batch slot", registry=r)
        self.running_requests = Gauge(
            "tad_running_requests",
            "Requests in the running batch: decoding, or their prompt being prefilled",
            registry=r,
        )
        self.batch_size = Histogram(
            "tad_batch_size", "Rows per forward (a decode step, or prefills joining)", buckets=BATCH_BUCKETS, registry=r
        )
        self.generated_tokens = Counter("tad_generated_tokens", "Tokens generated", registry=r)
        self.prompt_tokens = Counter("tad_prompt_tokens", "Prompt tokens processed", registry=r)
        self.decisions = Counter("tad_decisions", "Accept/reject decisions", ["method", "outcome"], registry=r)
        self.withheld = Counter(
            "tad_withheld_answers", "Rejected answers whose text was withheld (the withhold action)", registry=r
        )
        self.sequence_uncertainty = Histogram(
            "tad_sequence_uncertainty",
            "Sequence uncertainty of answers, per method",
            ["method"],
            buckets=UNCERTAINTY_BUCKETS,
            registry=r,
        )
        self.rejection_rate = Gauge(
            "tad_rolling_rejection_rate",
            "Share of the last N answers each method would reject at its threshold (drift signal)",
            ["method"],
            registry=r,
        )
        # How many answers that share is of: a window barely begun (after a start or a reload) is mostly noise.
        self.rejection_window_answers = Gauge(
            "tad_rolling_rejection_answers",
            "Answers in each method's rolling rejection-rate window (at most TAD_REJECTION_RATE_WINDOW)",
            ["method"],
            registry=r,
        )
        self.finish_reasons = Counter("tad_finish_reasons", "Why answered generations ended", ["reason"], registry=r)
        self.failed_generations = Counter(
            "tad_failed_generations",
            "Generations that ended without an answer, by error type (streams included, whose status was 200)",
            ["error_type"],
            registry=r,
        )
        self.info = Gauge("tad_model_info", "Loaded model and artifact", ["model", "artifact", "device"], registry=r)
        self.decision_method = Gauge(
            "tad_decision_method", "1 for the method the service decides with (its policy's)", ["method"], registry=r
        )
        self.ready = Gauge("tad_ready", "1 when the model (and artifact) are loaded and the worker answers", registry=r)
        self.artifact = Gauge(
            "tad_artifact_loaded_timestamp_seconds",
            "When the serving TAD artifact was loaded, labelled with its name and manifest sha256",
            ["artifact", "manifest_sha256"],
            registry=r,
        )
        self.artifact_reloads = Counter(
            "tad_artifact_reloads",
            "Artifact hot reloads (SIGHUP or the admin route) by outcome",
            ["outcome"],
            registry=r,
        )
        self._windows: dict[str, deque[bool]] = {m.value: deque(maxlen=rejection_window) for m in Method}

    def observe_generation(self, result: GenerationResult) -> None:
        timing = result.timing
        self.generated_tokens.inc(result.sequence.tokens_chosen)  # as usage's completion_tokens counts them
        reason = result.sequence.finish_reason
        self.finish_reasons.labels(reason=reason.reported if reason else "stop").inc()
        self.queue_time.observe(timing.queued_s)
        if timing.first_token_s is not None:
            self.time_to_first_token.observe(timing.first_token_s)
        # The first token's time is the prompt's prefill (time to first token): counted in, a short answer to a
        # long prompt would look like slow decoding. After it, one decode step per token chosen, the stop token
        # and the tokens a stop string trimmed included.
        chosen = result.sequence.tokens_chosen
        if chosen > 1 and timing.first_token_s is not None:
            self.time_per_token.observe((timing.total_s - timing.first_token_s) / (chosen - 1))

    def observe_unanswered(self, timing: Timing) -> None:
        """A generation that failed (its deadline passed, the model failed): its wait counts too, or under
        overload, when requests time out in the queue, the latency histograms would show only the lucky ones."""
        self.queue_time.observe(timing.queued_s)
        if timing.first_token_s is not None:
            self.time_to_first_token.observe(timing.first_token_s)

    def observe_client_gone(self, timing: Timing) -> None:
        """A client that left before its answer: a failed generation, and its wait so far counts as
        `observe_unanswered`'s do (under overload the clients that give up in the queue waited longest)."""
        self.failed_generations.labels(error_type="client_disconnected").inc()
        self.observe_unanswered(timing)

    def observe_decision(
        self, decision: Decision, scores: SequenceUncertainty, thresholds: dict[str, float | None], generated: bool
    ) -> None:
        """`generated`: the service's own answer. Answers sent to /v1/score (an evaluation job's known-wrong
        ones, say) are decisions too, but not what the service answers: they stay out of the histograms and
        the rolling rejection rates, which watch the served answers drift."""
        self.decisions.labels(method=decision.method.value, outcome="accept" if decision.accept else "reject").inc()
        if decision.withheld:
            self.withheld.inc()
        if generated:
            self.observe_answer(scores.as_dict(), thresholds)

    def observe_answer(self, scores: dict[str, float | None], thresholds: dict[str, float | None]) -> None:
        """Per-method uncertainty histograms and rolling would-reject rates."""
        for method, value in scores.items():
            if value is None:  # not computed for this answer
                continue
            undefined = math.isnan(value)  # an empty answer: rejected by every method, as calibration counted it
            if math.isfinite(value):  # an infinite one (a token of probability 0) would make the sum infinite for good
                self.sequence_uncertainty.labels(method=method).observe(value)
            threshold = thresholds.get(method)
            if threshold is not None:
                window = self._windows[method]
                window.append(undefined or value > threshold)
                judged = list(window)  # a reload's reset (on its own thread) may empty it meanwhile
                if judged:
                    self.rejection_rate.labels(method=method).set(sum(judged) / len(judged))
                    self.rejection_window_answers.labels(method=method).set(len(judged))

    def reset_rejection_windows(self) -> None:
        """A new artifact's thresholds: the answers judged against the old ones leave the rolling rates (a method
        the new artifact has no threshold for leaves the gauge)."""
        for window in self._windows.values():
            window.clear()
        self.rejection_rate.clear()
        self.rejection_window_answers.clear()

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
