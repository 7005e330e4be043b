"""The logic behind the generation and scoring routes (native and OpenAI-compatible).

Validates what needs the tokenizer or the settings (limits, prompt length, policy),
submits work to the scheduler, waits for it while watching for client disconnects, and
turns results into decisions and metrics.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from app.engine.engine import PromptError
from app.engine.sampling import SamplingParams
from app.engine.sequence import FinishReason, GenerationRequest
from app.errors import DeadlineExceeded, InvalidRequest, ServiceError
from app.schemas import ChatMessage, DecisionInfo, PolicyOverride, SequenceScores, TokenInfo
from app.serving.policy import Decision, Policy, decide, resolve_policy
from app.serving.runtime import Runtime
from app.serving.scheduler import (
    Event,
    Failure,
    GenerationItem,
    GenerationResult,
    ScoringItem,
    StreamedToken,
)
from app.serving.uncertainty import ScoredAnswer

DISCONNECT_POLL_S = 0.25
DEADLINE_GRACE_S = 30.0


class ClientDisconnected(Exception):
    """The client went away; its work was cancelled."""


@dataclass(frozen=True)
class PreparedGeneration:
    prompt_ids: list[int]
    params: SamplingParams
    policy: Policy
    seed: int | None


def finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def finish_reason_text(reason: FinishReason | None) -> str:
    if reason is FinishReason.UNCERTAINTY:
        return "uncertainty"
    return "length" if reason is FinishReason.LENGTH else "stop"


class GenerationService:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.engine, self.scheduler = runtime.require_ready()
        self.settings = runtime.settings

    # ------------------------------------------------------------------ validation
    def encode(self, prompt: str | None, messages: Sequence[ChatMessage] | None) -> list[int]:
        field = "messages" if messages is not None else "prompt"
        try:
            ids = self.engine.encode_prompt(
                prompt=prompt, messages=[m.model_dump() for m in messages] if messages is not None else None
            )
        except PromptError as error:
            raise InvalidRequest(str(error), param=field) from error
        if not ids:
            raise InvalidRequest("the prompt has no tokens", param=field)
        if len(ids) > self.settings.max_prompt_tokens:
            raise InvalidRequest(
                f"the prompt has {len(ids)} tokens; the limit is {self.settings.max_prompt_tokens}", param=field
            )
        return ids

    def _check_context(self, prompt_tokens: int, answer_tokens: int, field: str) -> None:
        context = getattr(self.engine.loaded.model.config, "max_position_embeddings", None)
        if context is not None and prompt_tokens + answer_tokens > context:
            raise InvalidRequest(
                f"prompt ({prompt_tokens} tokens) plus {field} ({answer_tokens}) exceeds the model's context of "
                f"{context} tokens",
                param=field,
            )

    def prepare(
        self,
        prompt: str | None,
        messages: Sequence[ChatMessage] | None,
        *,
        max_new_tokens: int | None,
        temperature: float,
        top_p: float,
        seed: int | None,
        stop: Sequence[str] | None,
        top_logprobs: int = 0,
        policy: PolicyOverride | None = None,
        max_tokens_field: str = "max_new_tokens",
    ) -> PreparedGeneration:
        limit = self.settings.max_new_tokens_limit
        wanted = max_new_tokens if max_new_tokens is not None else min(self.settings.default_max_new_tokens, limit)
        if wanted > limit:
            raise InvalidRequest(f"{max_tokens_field} must be between 1 and {limit}", param=max_tokens_field)
        stops = tuple(stop or ())
        if len(stops) > self.settings.max_stop_strings:
            raise InvalidRequest(f"at most {self.settings.max_stop_strings} stop strings", param="stop")
        if top_logprobs > self.settings.max_top_logprobs:
            raise InvalidRequest(f"top_logprobs must be at most {self.settings.max_top_logprobs}", param="top_logprobs")
        prompt_ids = self.encode(prompt, messages)
        self._check_context(len(prompt_ids), wanted, max_tokens_field)
        if temperature > 0 and seed is None:
            seed = secrets.randbelow(2**31)
        params = SamplingParams(
            max_new_tokens=wanted,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            stop=stops,
            top_logprobs=top_logprobs,
        )
        return PreparedGeneration(
            prompt_ids=prompt_ids,
            params=params,
            policy=resolve_policy(self.settings, self.runtime.artifact, policy),
            seed=seed,
        )

    # ------------------------------------------------------------------ running
    def _deadline(self) -> float:
        return time.monotonic() + self.settings.request_timeout_s

    def submit(self, prepared: PreparedGeneration, stream: bool, early_stop: bool) -> GenerationItem:
        item = GenerationItem(
            loop=asyncio.get_running_loop(),
            events=asyncio.Queue(),
            deadline=self._deadline(),
            request=GenerationRequest(prompt_ids=tuple(prepared.prompt_ids), params=prepared.params),
            stream_tokens=stream,
            policy=prepared.policy,
            early_stop=early_stop,
        )
        self.scheduler.submit_generation(item)
        self.runtime.metrics.prompt_tokens.inc(len(prepared.prompt_ids))
        return item

    async def next_event(self, item: GenerationItem | ScoringItem, request: Request | None) -> Event:
        """The item's next event; cancels the work if the client disconnects meanwhile.

        The worker enforces the deadline; this side gives up too, a little later, so that
        no request can wait forever even if the worker thread were stuck.
        """
        getter = asyncio.ensure_future(item.events.get())
        try:
            while True:
                done, _ = await asyncio.wait({getter}, timeout=DISCONNECT_POLL_S)
                if done:
                    return getter.result()
                if request is not None and await request.is_disconnected():
                    self.cancel(item)
                    raise ClientDisconnected
                if time.monotonic() > item.deadline + DEADLINE_GRACE_S:
                    self.cancel(item)
                    raise DeadlineExceeded("the request ran past its deadline")
        finally:
            if not getter.done():
                getter.cancel()

    def cancel(self, item: GenerationItem | ScoringItem) -> None:
        self.scheduler.cancel(item)

    async def result(self, item: GenerationItem, request: Request | None) -> GenerationResult:
        while True:
            event = await self.next_event(item, request)
            if isinstance(event, Failure):
                raise event.error
            if isinstance(event, GenerationResult):
                return event

    async def stream(
        self, item: GenerationItem, request: Request | None
    ) -> AsyncIterator[StreamedToken | GenerationResult]:
        """Token events, then the result; if the consumer stops early, the generation is cancelled."""
        finished = False
        try:
            while not finished:
                event = await self.next_event(item, request)
                if isinstance(event, Failure):
                    finished = True
                    raise event.error
                finished = isinstance(event, GenerationResult)
                yield event  # type: ignore[misc]
        finally:
            if not finished:
                self.cancel(item)

    async def finish(self, item: GenerationItem, request: Request) -> tuple[GenerationResult, Decision] | None:
        """The result, recorded in the metrics, with its decision; None if the client went away."""
        try:
            result = await self.result(item, request)
        except ClientDisconnected:
            return None
        return result, self.conclude(item, result)

    def conclude(self, item: GenerationItem, result: GenerationResult) -> Decision:
        """Record a finished generation in the metrics and decide on it."""
        assert item.policy is not None
        self.observe_generation(result)
        return self.decide(item.policy, result.scored)

    async def score(self, prompt_ids: list[int], response: str, request: Request | None) -> ScoredAnswer:
        response_ids = self.engine.encode_response(response)
        if not response_ids:
            raise InvalidRequest("the response has no tokens", param="response")
        limit = self.settings.max_new_tokens_limit
        if len(response_ids) > limit:
            raise InvalidRequest(f"the response has {len(response_ids)} tokens; the limit is {limit}", param="response")
        self._check_context(len(prompt_ids), len(response_ids), "response")
        item = ScoringItem(
            loop=asyncio.get_running_loop(),
            events=asyncio.Queue(),
            deadline=self._deadline(),
            prompt_ids=tuple(prompt_ids),
            response_ids=tuple(response_ids),
        )
        self.scheduler.submit_scoring(item)
        event = await self.next_event(item, request)
        if isinstance(event, Failure):
            raise event.error
        if not isinstance(event, ScoredAnswer):
            raise ServiceError("unexpected scheduler event")
        return event

    # ------------------------------------------------------------------ results
    def token_infos(self, scored: ScoredAnswer) -> list[TokenInfo]:
        trace = scored.trace
        confidences = scored.confidences
        infos = []
        for index, token_id in enumerate(trace.token_ids):
            confidence = float(confidences[index]) if confidences is not None else None
            infos.append(
                TokenInfo(
                    id=token_id,
                    text=self.engine.token_text(token_id),
                    logprob=float(trace.logprobs[index]),
                    entropy=float(trace.entropies[index]),
                    confidence=confidence,
                    uncertainty=None if confidence is None else 1.0 - confidence,
                )
            )
        return infos

    def streamed_token(self, event: StreamedToken) -> dict[str, Any]:
        return {
            "index": event.index,
            "id": event.token_id,
            "text": event.text,
            "logprob": event.logprob,
            "entropy": event.entropy,
            "confidence": event.confidence,
            "uncertainty": None if event.confidence is None else 1.0 - event.confidence,
        }

    def decide(self, policy: Policy, scored: ScoredAnswer) -> Decision:
        """The decision, recorded in the metrics with the answer's scores."""
        decision = decide(policy, scored.sequence)
        metrics = self.runtime.metrics
        metrics.decisions.labels(method=decision.method.value, outcome="accept" if decision.accept else "reject").inc()
        metrics.observe_answer(scored.sequence.as_dict(), self.runtime.method_thresholds())
        return decision

    def observe_generation(self, result: GenerationResult) -> None:
        metrics = self.runtime.metrics
        count = len(result.sequence.kept_tokens)
        metrics.generated_tokens.inc(count)
        metrics.finish_reasons.labels(reason=finish_reason_text(result.sequence.finish_reason)).inc()
        metrics.queue_time.observe(result.queued_s)
        if result.first_token_s is not None:
            metrics.time_to_first_token.observe(result.first_token_s)
        if count:
            metrics.time_per_token.observe((result.total_s - result.queued_s) / count)

    @staticmethod
    def sequence_scores(scored: ScoredAnswer) -> SequenceScores:
        values = scored.sequence
        return SequenceScores(
            tad=finite(values.tad),
            msp=finite(values.msp),
            perplexity=finite(values.perplexity),
            mean_token_entropy=finite(values.mean_token_entropy),
        )

    @staticmethod
    def decision_info(decision: Decision) -> DecisionInfo:
        return DecisionInfo(
            accept=decision.accept,
            method=decision.method,
            score=finite(decision.score),
            threshold=decision.threshold,
            policy=decision.policy,
        )
