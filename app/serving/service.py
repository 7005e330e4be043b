"""The logic behind every generation and scoring route, whatever its protocol.

Validates what needs the tokenizer or the settings (limits, prompt length, policy),
submits work to the scheduler, waits for it while watching for client disconnects, and
turns results into decisions and metrics. It returns domain objects (`GenerationOutcome`,
`ScoreOutcome`); each protocol's formatter turns them into its own response shapes.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

from app.engine.chat_prompt import PromptError
from app.engine.engine import Engine
from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest, SequenceState
from app.errors import DeadlineExceeded, InvalidRequest, ServiceError
from app.serving.check_pass import CHECK_PROMPT_NAME, check_pass, p_true_of, with_p_true
from app.serving.context_room import check_context, context_length, fit_check_pass
from app.serving.decision_log import log_decision
from app.serving.events import Event, Failure, GenerationResult, KeepAlive, StreamedToken
from app.serving.outcomes import (
    ClientConnection,
    ClientDisconnected,
    GenerationOutcome,
    PreparedGeneration,
    PromptInput,
    ScoreOutcome,
    ServedModel,
    Submitted,
)
from app.serving.policy import Decision, Policy, PolicyRequest, decide, resolve_policy
from app.serving.progress import AnswerProgress
from app.serving.runtime import Runtime, ServingArtifact
from app.serving.tokenizing import tokenized
from app.serving.work_items import GenerationItem, ScoringItem, WorkItem
from app.settings import RejectAction
from app.uncertainty.answer import AnswerScorer, ScoredAnswer
from app.uncertainty.features import FeatureSpec
from app.uncertainty.methods import REGISTRY

DISCONNECT_POLL_S = 0.25
DEADLINE_GRACE_S = 30.0
TRACE_ONLY = AnswerScorer(None)  # a check pass's scorer: the baselines of its one token, no artifact
logger = logging.getLogger(__name__)


def _question(prompt: PromptInput) -> str:
    """What the user asked: the last user turn, or the raw prompt."""
    if prompt.messages is not None:
        users = [m.get("content", "") for m in prompt.messages if m.get("role") == "user"]
        return str(users[-1]) if users else ""
    return prompt.prompt or ""


class GenerationService:
    def __init__(self, runtime: Runtime, request_id: str | None = None) -> None:
        """`request_id`: the request's id, for the decision log."""
        self.runtime = runtime
        self.request_id = request_id
        self.engine: Engine
        self.engine, self.scheduler = runtime.require_ready()
        self.settings = runtime.settings

    @property
    def served(self) -> ServedModel:
        """Who answers a request starting now."""
        return self._served_by(self.runtime.serving)

    def _served_by(self, serving: ServingArtifact) -> ServedModel:
        artifact = serving.artifact
        return ServedModel(
            model=self.runtime.model_name,
            artifact=artifact.name if artifact else None,
            manifest_sha256=serving.manifest_sha256 if artifact else None,
            tad_available=serving.scorer.tad_available,
        )

    def token_text(self, token_id: int) -> str:
        return self.engine.token_text(token_id)

    def token_bytes(self, token_id: int) -> bytes:
        return self.engine.token_bytes(token_id)

    def answer_pieces(self, sequence: SequenceState) -> list[str]:
        return self.engine.answer_pieces(sequence)

    def feature_spec(self, serving: ServingArtifact | None = None) -> FeatureSpec | None:
        """How the artifact's regressor (`serving`'s, else the one serving now) reads attention rows; None without
        one."""
        artifact = (serving or self.runtime.serving).artifact
        return artifact.tad.spec if artifact is not None and artifact.tad is not None else None

    # ------------------------------------------------------------------ validation
    async def encode(self, prompt: PromptInput) -> list[int]:
        field = prompt.field
        messages = [dict(m) for m in prompt.messages] if prompt.messages is not None else None
        try:
            ids = await tokenized(prompt.chars, self.engine, Engine.encode_prompt, prompt.prompt, messages)
        except PromptError as error:
            raise InvalidRequest(str(error), param=field) from error
        if not ids:
            raise InvalidRequest("the prompt has no tokens", param=field)
        if len(ids) > self.settings.max_prompt_tokens:
            raise InvalidRequest(
                f"the prompt has {len(ids)} tokens; the limit is {self.settings.max_prompt_tokens}", param=field
            )
        return ids

    def policy(self, request: PolicyRequest | None, serving: ServingArtifact | None = None) -> Policy:
        if request is not None and not self.settings.policy_overrides:
            raise InvalidRequest(
                "this service's reject policy is binding (TAD_POLICY_OVERRIDES=false): leave policy out",
                param="policy",
            )
        artifact = (serving or self.runtime.serving).artifact
        resolved = resolve_policy(self.settings, artifact, request)
        if REGISTRY[resolved.method.value].needs_check_pass and not self.engine.has_chat_template:
            raise InvalidRequest(
                f"{resolved.method.value} asks the model about its answer through a chat template, and this model "
                "has none",
                param="policy.method" if request is not None and request.method is not None else "policy",
            )
        return resolved

    async def prepare(
        self,
        prompt: PromptInput,
        *,
        max_new_tokens: int | None,
        temperature: float,
        top_p: float,
        seed: int | None,
        stop: Sequence[str] | None,
        top_logprobs: int = 0,
        policy: PolicyRequest | None = None,
        max_tokens_field: str = "max_new_tokens",
        top_logprobs_field: str = "top_logprobs",
        default_max_new_tokens: int | None = None,
    ) -> PreparedGeneration:
        """`default_max_new_tokens`: the route's own default when the client sets none (else the service's)."""
        limit = self.settings.max_new_tokens_limit
        default = default_max_new_tokens or self.settings.default_max_new_tokens
        wanted = max_new_tokens if max_new_tokens is not None else min(default, limit)
        if wanted > limit:
            raise InvalidRequest(f"{max_tokens_field} must be between 1 and {limit}", param=max_tokens_field)
        stops = tuple(stop or ())
        if len(stops) > self.settings.max_stop_strings:
            raise InvalidRequest(f"at most {self.settings.max_stop_strings} stop strings", param="stop")
        if top_logprobs > self.settings.max_top_logprobs:
            raise InvalidRequest(
                f"{top_logprobs_field} must be at most {self.settings.max_top_logprobs}", param=top_logprobs_field
            )
        prompt_ids = await self.encode(prompt)
        context = context_length(self.engine)
        if max_new_tokens is None and context is not None:
            # The default is a default: a prompt near the end of the context gets what room is left (as
            # vLLM does), and one that fills it is the prompt's problem, not that of a field never sent.
            room = context - len(prompt_ids)
            if room < 1:
                raise InvalidRequest(
                    f"the prompt ({len(prompt_ids)} tokens) leaves no room for an answer in the model's maximum "
                    f"context length of {context} tokens",
                    param=prompt.field,
                )
            wanted = min(wanted, room)
        check_context(self.engine, len(prompt_ids), wanted, max_tokens_field, prompt_field=prompt.field)
        serving = self.runtime.serving
        resolved = self.policy(policy, serving)
        question = _question(prompt)
        if REGISTRY[resolved.method.value].needs_check_pass:
            # The answer is asked about in a prompt of its own after it is generated: refused now if that could
            # not fit, rather than once the answer has been computed.
            asked = max_new_tokens is not None
            wanted = await fit_check_pass(self.engine, question, prompt.field, wanted, max_tokens_field, asked)
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
            policy=resolved,
            seed=seed,
            serving=serving,
            question=question,
        )

    # ------------------------------------------------------------------ running
    def _deadline(self) -> float:
        return time.monotonic() + self.settings.request_timeout_s

    def submit(
        self,
        prepared: PreparedGeneration,
        stream: bool,
        early_stop: bool,
        attention: bool = False,
        early_stop_field: str = "early_stop",
    ) -> Submitted:
        """Hand a generation to the scheduler; `attention`: streamed tokens carry what TAD reads of their attention."""
        if early_stop and REGISTRY[prepared.policy.method.value].needs_check_pass:
            raise InvalidRequest(
                f"early stop needs a score that runs along the answer; {prepared.policy.method.value} is computed "
                "once the answer has ended",
                param=early_stop_field,
            )
        item = GenerationItem(
            loop=asyncio.get_running_loop(),
            events=asyncio.Queue(),
            deadline=self._deadline(),
            request=GenerationRequest(prompt_ids=tuple(prepared.prompt_ids), params=prepared.params),
            observer=AnswerProgress(
                self.engine, prepared.serving.scorer, prepared.policy, stream, early_stop, attention=attention
            ),
        )
        self.scheduler.submit_generation(item)
        self.runtime.metrics.prompt_tokens.inc(len(prepared.prompt_ids))
        return Submitted(
            item=item,
            policy=prepared.policy,
            seed=prepared.seed,
            served=self._served_by(prepared.serving),
            question=prepared.question,
        )

    async def next_event(
        self, item: WorkItem, client: ClientConnection | None, keep_alive_at: float = math.inf
    ) -> Event | KeepAlive:
        """The item's next event; cancels the work if the client disconnects meanwhile.

        The worker enforces the deadline; this side gives up too, a little later, so that
        no request can wait forever even if the worker thread were stuck. A KeepAlive instead
        if none has come by `keep_alive_at` (monotonic time; the event stays queued).
        """
        if not item.events.empty():  # already delivered (a stream behind its steps): no future, no timer
            return item.events.get_nowait()
        getter = asyncio.ensure_future(item.events.get())
        try:
            while True:
                done, _ = await asyncio.wait({getter}, timeout=DISCONNECT_POLL_S)
                if done:
                    return getter.result()
                # Disconnect and deadline first: a keep-alive due at every poll must not hide them.
                if client is not None and await client.is_disconnected():
                    self.scheduler.cancel(item)
                    raise ClientDisconnected
                if time.monotonic() > item.deadline + DEADLINE_GRACE_S:
                    self.scheduler.cancel(item)
                    raise DeadlineExceeded("the request ran past its deadline")
                if time.monotonic() > keep_alive_at:
                    return KeepAlive()
        finally:
            if not getter.done():
                getter.cancel()

    async def stream(
        self, submitted: Submitted, client: ClientConnection | None = None, keep_alive: bool = False
    ) -> AsyncIterator[StreamedToken | GenerationOutcome | KeepAlive]:
        """Token events, then the outcome; if the consumer stops early, the generation is cancelled.

        Under the withhold action no token leaves before the decision: they are held, and sent
        only if the answer is accepted. `keep_alive`: KeepAlive events while nothing else comes.
        """
        item = submitted.item
        held: list[StreamedToken] | None = [] if submitted.policy.action is RejectAction.WITHHOLD else None
        keep_alive_s = (
            self.settings.stream_keepalive_s if keep_alive and self.settings.stream_keepalive_s > 0 else math.inf
        )
        sent_at = time.monotonic()  # silence counts from the last thing the consumer got, held tokens aside
        finished = False
        try:
            while not finished:
                event = await self.next_event(item, client, sent_at + keep_alive_s)
                if not isinstance(event, StreamedToken) or held is None:
                    sent_at = time.monotonic()
                if isinstance(event, KeepAlive):
                    yield event
                elif isinstance(event, Failure):
                    finished = True
                    self.runtime.metrics.observe_unanswered(item.timing(time.monotonic()))
                    raise event.error
                elif isinstance(event, GenerationResult):
                    if REGISTRY[submitted.policy.method.value].needs_check_pass:
                        if keep_alive:  # the check is a scoring pass: what the consumer holds goes out first
                            yield KeepAlive()
                        check = asyncio.ensure_future(
                            self._with_p_true(
                                submitted.question, event.sequence.text, event.scored, client, item.deadline
                            )
                        )
                        try:
                            # Queued behind long chunked work, the pass may take a while: the stream stays alive.
                            while not (await asyncio.wait({check}, timeout=min(keep_alive_s, 3600.0)))[0]:
                                yield KeepAlive()
                        finally:
                            check.cancel()  # only if it is still running: the consumer went away
                        event = replace(event, scored=check.result())
                    finished = True
                    outcome = self.conclude(submitted, event)
                    for token in held if held is not None and not outcome.withheld else ():
                        yield token
                        # The held tokens go out in one burst, and a send to a socket does not suspend: without
                        # this the event loop would not see a client that has left, and the whole burst would be
                        # written to the closed socket (asyncio logs a warning per failed write).
                        await asyncio.sleep(0)
                    yield outcome
                elif isinstance(event, StreamedToken):
                    if held is None:
                        yield event
                    else:
                        held.append(event)
                        if time.monotonic() > sent_at + keep_alive_s:  # tokens keep coming, none goes out
                            sent_at = time.monotonic()
                            yield KeepAlive()
        except ServiceError as error:
            # Counted here, where streamed and whole responses meet: a stream has already sent its 200.
            self.runtime.metrics.failed_generations.labels(error_type=error.error_type).inc()
            if not finished:  # given up waiting for it (its deadline long past): no Failure came
                self.runtime.metrics.observe_unanswered(item.timing(time.monotonic()))
            raise
        except ClientDisconnected:
            self.runtime.metrics.observe_client_gone(item.timing(time.monotonic()))
            raise
        except (asyncio.CancelledError, GeneratorExit):
            # A stream's consumer went away: the response cancels or closes this generator mid-answer.
            if not finished:
                self.runtime.metrics.observe_client_gone(item.timing(time.monotonic()))
            raise
        except Exception:  # a defect: a whole answer's becomes a 500, a stream's an error event after its 200
            self.runtime.metrics.failed_generations.labels(error_type="internal_error").inc()
            raise
        finally:
            if not finished:
                self.scheduler.cancel(item)

    async def finish(self, submitted: Submitted, client: ClientConnection) -> GenerationOutcome | None:
        """The outcome, recorded in the metrics; None if the client went away."""
        try:
            async for event in self.stream(submitted, client):
                if isinstance(event, GenerationOutcome):
                    return event
        except ClientDisconnected:
            return None
        raise ServiceError("the generation ended without a result")

    async def _with_p_true(
        self, question: str, answer: str, scored: ScoredAnswer, client: ClientConnection | None, deadline: float
    ) -> ScoredAnswer:
        """`scored` with the answer's P(True), from one more pass over the question and the answer
        (`app/serving/check_pass.py`) within the request's own `deadline`; the pass is cancelled if the
        client goes away meanwhile."""
        prompt_ids, yes = await tokenized(len(question) + len(answer), self.engine, check_pass, question, answer)
        context = context_length(self.engine)
        if context is not None and len(prompt_ids) + 1 > context:
            # Re-tokenized, the answer outgrew the room `fit_check_pass` left: kept without P(True) (rejected).
            logger.warning("the check prompt (%d tokens) does not fit the context: no P(True)", len(prompt_ids) + 1)
            return scored
        item = ScoringItem(
            loop=asyncio.get_running_loop(),
            events=asyncio.Queue(),
            deadline=deadline,
            prompt_ids=prompt_ids,
            answer_ids=yes,
            scorer=TRACE_ONLY,  # only its trace is read: no TAD pass, and no artifact a reload has replaced
        )
        # Part of a request already admitted: a full queue must not throw away the answer it has computed.
        self.scheduler.submit_scoring(item, follow_up=True)
        try:
            event = await self.next_event(item, client)
        except BaseException:
            self.scheduler.cancel(item)
            raise
        if isinstance(event, Failure):
            raise event.error
        if not isinstance(event, ScoredAnswer):
            raise ServiceError("unexpected scheduler event")
        return with_p_true(scored, p_true_of(event.trace))

    def conclude(self, submitted: Submitted, result: GenerationResult) -> GenerationOutcome:
        """Record a finished generation in the metrics and decide on it."""
        self.runtime.metrics.observe_generation(result)
        current = submitted.served.manifest_sha256 == self.runtime.serving.manifest_sha256
        decision = self.decide(submitted.policy, result.scored, generated=True, current=current)
        reason = result.sequence.finish_reason
        self._log(
            decision,
            submitted.served,
            kind="generate",
            prompt_tokens=len(result.sequence.request.prompt_ids),
            answer_tokens=len(result.scored.trace),
            finish_reason=reason.reported if reason else None,
            queued_s=round(result.timing.queued_s, 4),
            total_s=round(result.timing.total_s, 4),
        )
        text = self.settings.withheld_message if decision.withheld else result.sequence.text
        return GenerationOutcome(
            result=result, decision=decision, seed=submitted.seed, text=text, served=submitted.served
        )

    async def score(
        self, prompt: PromptInput, response: str, policy: PolicyRequest | None, client: ClientConnection | None
    ) -> ScoreOutcome | None:
        """Uncertainty and decision of a given answer; None if the client went away."""
        prompt_ids = await self.encode(prompt)
        serving = self.runtime.serving
        resolved = self.policy(policy, serving)
        answer_ids = await tokenized(len(response), self.engine, Engine.encode_answer, response)
        if not answer_ids:
            raise InvalidRequest("the response has no tokens", param="response")
        limit = self.settings.max_new_tokens_limit
        if len(answer_ids) > limit:
            raise InvalidRequest(f"the response has {len(answer_ids)} tokens; the limit is {limit}", param="response")
        check_context(self.engine, len(prompt_ids), len(answer_ids), "response", prompt_field=prompt.field)
        question = _question(prompt)
        if REGISTRY[resolved.method.value].needs_check_pass:
            check_ids, _ = await tokenized(len(question) + len(response), self.engine, check_pass, question, response)
            context = context_length(self.engine)
            if context is not None and len(check_ids) + 1 > context:
                # The question alone may leave no room (then the prompt is named); else the response is too long.
                await fit_check_pass(self.engine, question, prompt.field, 0, "response", asked=True)
                raise InvalidRequest(
                    f"{CHECK_PROMPT_NAME}, with this response, has {len(check_ids) + 1} tokens: more than the "
                    f"model's maximum context length of {context}",
                    param="response",
                )
        item = ScoringItem(
            loop=asyncio.get_running_loop(),
            events=asyncio.Queue(),
            deadline=self._deadline(),
            prompt_ids=tuple(prompt_ids),
            answer_ids=tuple(answer_ids),
            scorer=serving.scorer,
        )
        self.scheduler.submit_scoring(item)
        try:
            event = await self.next_event(item, client)
        except ClientDisconnected:
            return None
        if isinstance(event, Failure):
            raise event.error
        if not isinstance(event, ScoredAnswer):
            raise ServiceError("unexpected scheduler event")
        if REGISTRY[resolved.method.value].needs_check_pass:
            try:
                event = await self._with_p_true(question, response, event, client, item.deadline)
            except ClientDisconnected:
                return None
        decision = self.decide(resolved, event)
        served = self._served_by(serving)
        self._log(decision, served, kind="score", prompt_tokens=len(prompt_ids), answer_tokens=len(answer_ids))
        return ScoreOutcome(
            scored=event, decision=decision, prompt_tokens=len(prompt_ids), served=served, serving=serving
        )

    def _log(
        self,
        decision: Decision,
        served: ServedModel,
        *,
        kind: str,
        prompt_tokens: int,
        answer_tokens: int,
        **details: object,
    ) -> None:
        if self.settings.decision_log:
            log_decision(
                decision,
                request_id=self.request_id,
                kind=kind,
                artifact=served.artifact,
                manifest_sha256=served.manifest_sha256,
                prompt_tokens=prompt_tokens,
                answer_tokens=answer_tokens,
                **details,
            )

    def decide(self, policy: Policy, scored: ScoredAnswer, generated: bool = False, current: bool = True) -> Decision:
        """The decision, recorded in the metrics with the answer's scores (`current`: scored by the artifact
        serving now; one a reload replaced meanwhile stays out of the drift windows, which restarted on
        the new artifact's thresholds)."""
        decision = decide(policy, scored.sequence, generated=generated)
        self.runtime.metrics.observe_decision(
            decision, scored.sequence, self.runtime.method_thresholds(), generated=generated and current
        )
        return decision
