"""Continuous batching on one worker thread, so the event loop never waits on the model.

Requests wait in a bounded queue. The worker admits them into the running batch between
decode steps (an idle worker first waits a short window for more to arrive), prefills them,
merges them into the batch, and steps the whole batch one token at a time; finished sequences
leave at once. Admitted prompts are prefilled in groups that fit in `prefill_chunk_tokens`
together (`prefill_groups`): the first at once, the others queued with any longer prompt, which
runs that many of its tokens per pass (chunked prefill); one queued pass runs per step, oldest
first (on an idle server too), and each group joins the batch as soon as it is done. So a long
prompt delays running answers a chunk at a time and a short prompt arriving meanwhile is not held
behind it. Teacher-forced scoring requests run between steps, their prompts chunked the same
way. The scheduler only batches: what a request wants after each step (streamed tokens, early
stop, the scored result) is its observer's business (`app/serving/progress.py`); the events
reach the request through an asyncio queue fed thread-safely.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Literal

from app.engine import phase_timing
from app.engine.decoding import DecodeBatch, PromptPrefill
from app.engine.engine import Engine
from app.engine.sequence import FinishReason, SequenceState
from app.engine.teacher_forcing import ScoringPass
from app.errors import DeadlineExceeded, ServiceError
from app.serving.admission import Admission
from app.serving.events import Event, Failure
from app.serving.step_failures import StepFailures
from app.serving.work_items import (
    GenerationItem,
    Outbox,
    PendingWork,
    ScoringItem,
    WorkItem,
    prefill_groups,
)
from app.uncertainty.answer import AnswerScorer
from app.uncertainty.tad import prime_streams

logger = logging.getLogger(__name__)
FAILED_INSIDE_THE_MODEL = {
    "prefill": "generation failed inside the model; see the server log",
    "scoring": "scoring failed; see the server log",
}
# How long `stop` waits for the worker, which finishes a forward already running (seconds for a CPU prefill).
STOP_TIMEOUT_S = 10.0


class Scheduler(Admission):
    def __init__(
        self,
        engine: Engine,
        scorer: AnswerScorer,
        max_batch_size: int,
        max_queue: int,
        batch_window_s: float,
        on_batch: Callable[[int], None] | None = None,
        prefill_chunk_tokens: int = 0,
        broken_after_failed_steps: int = 5,
    ) -> None:
        """`prefill_chunk_tokens`: prompt tokens a prefill or a scoring pass may run between two
        decode steps of the running batch (0: they run whole). `broken_after_failed_steps`: failed model steps
        in a row after which the worker counts as broken (`StepFailures` says which runs count)."""
        super().__init__(max_batch_size, max_queue)
        self.engine = engine
        self.scorer = scorer
        self.batch_window_s = batch_window_s
        self.on_batch = on_batch
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.failures = StepFailures(broken_after_failed_steps)
        self._thread: threading.Thread | None = None
        self._joining: list[GenerationItem] = []
        self._batch: DecodeBatch | None = None
        self._items: dict[int, GenerationItem] = {}
        self._stepped = 0  # items in `_items` whose observer needs each step (streams, early stop)
        self._earliest_deadline = math.inf  # of the running items: no row can be past its deadline before it
        self._outbox = Outbox()
        self._pass_started: float | None = None  # when the pass in progress began (worker writes, anyone reads)
        self._prime_failure_logged = False
        self._pending: deque[PendingWork] = deque()  # queued prefills and scoring passes, oldest first (worker only)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the worker (again, after `stop`)."""
        if self.alive:  # a `stop` that timed out left it running: two workers would share the batch
            raise RuntimeError("the scheduler's worker is still running")
        with self._condition:  # an abandon before this start is over: the new worker must not answer with it
            self._stopping = False
            self._abandon = self._refusal = None
        self._thread = threading.Thread(target=self._run, name="tad-scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        with self._condition:
            self._stopping = True
            self._condition.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        """The worker thread runs (it ends only on stop, or if it died: then nothing would be answered)."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def pass_running_s(self) -> float:
        """How long the worker has been in its current pass (0 between passes): a pass runs a decode step and
        what joins between two steps (a prefill chunk, the scoring passes that fit in one); a forward that
        never returns is a stall no failure count sees."""
        started = self._pass_started
        return 0.0 if started is None else time.monotonic() - started

    # ------------------------------------------------------------------ worker
    def _run(self) -> None:
        while True:
            with self._condition:
                abandon, self._abandon = self._abandon, None
                queued, queued_scoring = (list(self._waiting), list(self._scoring)) if abandon else ([], [])
                if abandon is not None:
                    self._waiting.clear()
                    self._scoring.clear()
            if abandon is not None:
                self._fail_everything(queued, queued_scoring, Failure(abandon))
                self._outbox.flush()
                continue
            with self._condition:
                prefilling = self._prefilling()
                busy = bool(self._items) or bool(self._pending)
                if self._stopping and not busy and not self._waiting and not self._scoring:
                    return
                if not busy and not self._waiting and not self._scoring:
                    phase_timing.lap(phase_timing.SCHEDULER)
                    self._condition.wait(timeout=0.5)
                    phase_timing.lap(phase_timing.IDLE)
                    continue
                if not busy and self._waiting and self.batch_window_s > 0:
                    phase_timing.lap(phase_timing.SCHEDULER)
                    window_end = time.monotonic() + self.batch_window_s
                    while len(self._waiting) < self.max_batch_size and not self._stopping:
                        remaining = window_end - time.monotonic()
                        if remaining <= 0:
                            break
                        self._condition.wait(timeout=remaining)
                    phase_timing.lap(phase_timing.IDLE)
                free = self.max_batch_size - len(self._items) - prefilling
                admitted = [self._waiting.popleft() for _ in range(min(free, len(self._waiting)))]
                scoring = list(self._scoring)
                self._scoring.clear()
                self.stats.queue_depth = len(self._waiting)
            self._pass_started = time.monotonic()
            try:
                self._work(admitted, scoring)
            except Exception:  # a model failure must not hang the waiting requests
                logger.exception("scheduler step failed")
                self._fail_running(admitted, scoring)
                self.failures.record("decode", succeeded=False)
            finally:
                self._pass_started = None
                self._outbox.flush()
                # An idle worker would otherwise hold this pass's items (their sequences, and the scorer of an
                # artifact a reload has since replaced) until the next request.
                admitted, scoring = [], []
                phase_timing.lap(phase_timing.HANDOFF)

    def _work(self, admitted: list[GenerationItem], scoring: list[ScoringItem]) -> None:
        if scoring:
            self._start_scoring(scoring)
        now = time.monotonic()
        live = [item for item in admitted if self._still_wanted(item, now)]
        if live:
            self._start_prefills(live, now)
        if self._pending:
            self._advance_pending()
        if self._batch is not None and self._batch.sequences:
            self._check_abandoned()
            self._batch.step()
            self.failures.record("decode", succeeded=True)
            self._after_step(computed=len(self._batch.sequences))
        self.stats.running = len(self._items) + self._prefilling()

    def _prefilling(self) -> int:
        """Generation requests being prefilled: they hold batch slots."""
        return sum(len(pending.items) for pending in self._pending if isinstance(pending.job, PromptPrefill))

    def _chunk_budget(self) -> int | None:
        """Prompt tokens chunked work may run per step (None: all of it, chunking off). An idle server
        chunks too, so that a request arriving during a long prompt joins between its chunks."""
        return self.prefill_chunk_tokens if self.prefill_chunk_tokens > 0 else None

    def _still_wanted(self, item: WorkItem, now: float, stage: str = "queued") -> bool:
        if item.cancelled:
            self._release(item)
            return False
        if now > item.deadline:
            self._answer(item, Failure(DeadlineExceeded(f"the request's deadline passed while it was {stage}")))
            return False
        return True

    def _answer(self, item: WorkItem, event: Event) -> None:
        """The item's last event (sent once): its slot is freed first, so a retry at once finds it free."""
        if item.released:
            return
        self._release(item)
        self._outbox.put(item, event)

    def _start_scoring(self, items: list[ScoringItem]) -> None:
        """Teacher-forced passes of at most `max_batch_size` answers each, shortest first (similar lengths
        pad little): run now while they fit in this step's chunk (or chunking is off), else queued to
        run in chunks."""
        now = time.monotonic()
        live = [item for item in items if self._still_wanted(item, now)]
        live.sort(key=lambda item: len(item.prompt_ids) + len(item.answer_ids))
        budget = self._chunk_budget()
        spent = 0
        for start in range(0, len(live), self.max_batch_size):
            group = live[start : start + self.max_batch_size]
            try:
                scoring = self.engine.start_scoring([(item.prompt_ids, item.answer_ids) for item in group])
            except Exception:
                self._fail_group(group, "scoring")
                continue
            tokens = len(group) * max(len(item.prompt_ids) + len(item.answer_ids) for item in group)
            if budget is None or spent + tokens <= budget:
                spent += tokens
                self._run_scoring_job(scoring, group, None)
            else:
                self._pending.append(PendingWork(scoring, group))

    def _run_scoring_job(self, scoring: ScoringPass, items: list[ScoringItem], budget: int | None) -> bool:
        """One step of a scoring pass; answers its items when done (or failed). True once finished."""
        try:
            traces = scoring.advance(budget)
        except Exception:
            self._fail_group(items, "scoring")
            return True
        self.failures.record("scoring", succeeded=True)
        if traces is None:
            return False
        failure = Failure(ServiceError(FAILED_INSIDE_THE_MODEL["scoring"]))
        now = time.monotonic()
        try:
            for item, trace in zip(items, traces, strict=True):
                if self._still_wanted(item, now, stage="being scored"):
                    # Each with its own scorer (the artifact its request started with): its failure is its own.
                    try:
                        self._answer(item, (item.scorer or self.scorer).score(trace))
                    except Exception:
                        logger.exception("scoring an answer failed")
                        self._answer(item, failure)
        except Exception:  # a defect in the bookkeeping: the pass is over, and no item is left waiting
            logger.exception("answering a scoring pass failed")
            for item in items:
                self._answer(item, failure)
        return True

    def _fail_group(self, items: list[GenerationItem] | list[ScoringItem], work: Literal["prefill", "scoring"]) -> None:
        """A prefill or scoring pass failed: its own requests fail, and only them; the running batch (whose
        cache a prefill does not touch before its group joins) decodes on."""
        logger.exception("%s failed", work)
        failure = Failure(ServiceError(FAILED_INSIDE_THE_MODEL[work]))
        for item in items:
            self._answer(item, failure)
        self.failures.record(work, succeeded=False)

    def _start_prefills(self, items: list[GenerationItem], now: float) -> None:
        """Prefill the first group that fits in a chunk (`prefill_groups`) at once; queue the others."""
        for item in items:
            item.admitted_at = now
        budget = self._chunk_budget()
        at_once, queued = (items, []) if budget is None else prefill_groups(items, budget)
        for group in queued:
            try:
                prefill = self.engine.start_prefill([item.request for item in group if item.request is not None])
            except Exception:
                self._fail_group(group, "prefill")
                continue
            self._pending.append(PendingWork(prefill, group))
        if at_once:
            try:
                prefill = self.engine.start_prefill([item.request for item in at_once if item.request is not None])
                batch = prefill.advance()
            except Exception:
                self._fail_group(at_once, "prefill")
                return
            assert batch is not None
            self.failures.record("prefill", succeeded=True)
            self._join(at_once, batch)

    def _advance_pending(self) -> None:
        """The oldest queued work's next pass; done, it is merged into the batch (a prefill) or
        answered (a scoring pass)."""
        now = time.monotonic()
        for gone in [work for work in self._pending if all(i.cancelled or now > i.deadline for i in work.items)]:
            # Nobody waits for these any more (queued behind others too): their slots go now, no chunk runs.
            self._pending.remove(gone)
            stage = "being prefilled" if isinstance(gone.job, PromptPrefill) else "being scored"
            for item in gone.items:
                self._still_wanted(item, now, stage=stage)
        if not self._pending:
            return
        pending = self._pending[0]
        budget = self._chunk_budget()
        if isinstance(pending.job, ScoringPass):
            if self._run_scoring_job(pending.job, pending.items, budget):  # type: ignore[arg-type]
                self._pending.popleft()
            return
        try:
            batch = pending.job.advance(budget)
        except Exception:
            self._pending.popleft()
            self._fail_group(pending.items, "prefill")
            return
        self.failures.record("prefill", succeeded=True)
        if batch is None:
            return
        self._pending.popleft()
        self._join(pending.items, batch)  # type: ignore[arg-type]

    def _join(self, items: list[GenerationItem], batch: DecodeBatch) -> None:
        """Prefilled sequences join the running batch; their first tokens go out."""
        self._joining = items  # out of the pending work and maybe not all in `_items`: failed with the batch
        now = time.monotonic()
        for item, sequence in zip(items, batch.sequences, strict=True):
            item.sequence = sequence
            self._items[id(sequence)] = item
            if sequence.tokens:  # the prefill chose the first token (unless it was a stop token)
                item.first_token_at = now
            item.stepped = item.observer is not None and getattr(item.observer, "needs_steps", True)
            self._stepped += item.stepped
            self._earliest_deadline = min(self._earliest_deadline, item.deadline)
            # Cancelled while its prefill ran (a `cancel` seen by a step before it joined): look again. Only ever
            # set here: a read-and-write of the flag would lose a `cancel` setting it between the two.
            if item.cancelled:
                self._cancel_seen = True
        joined = len(batch.sequences)  # the rows the prefill computed; the running ones got nothing new
        phase_timing.lap(phase_timing.SCHEDULER)
        if self._batch is None or not self._batch.sequences:
            running = self.engine.running_batch(self.max_batch_size)  # a compiled step's slot batch, or None
            if running is None:
                self._batch = batch
            else:
                running.merge(batch)
                self._batch = running
        else:
            self._batch.merge(batch)
        phase_timing.lap(phase_timing.BATCH)
        self._after_step(computed=joined)
        self._joining = []

    def _check_abandoned(self) -> None:
        """Abandon rows whose client went away or whose deadline passed. Looked for only after a `cancel`
        or once the earliest deadline has passed, not on every step."""
        assert self._batch is not None
        now = time.monotonic()
        if not self._cancel_seen and now <= self._earliest_deadline:
            return
        self._cancel_seen = False
        earliest = math.inf
        for sequence in self._batch.sequences:
            item = self._items[id(sequence)]
            if item.cancelled:
                sequence.abandon(FinishReason.CANCELLED)
            elif now > item.deadline:
                sequence.abandon(FinishReason.DEADLINE)
            else:
                earliest = min(earliest, item.deadline)
        self._earliest_deadline = earliest

    def _after_step(self, computed: int) -> None:
        """After a forward (a decode step, or prefills joining) that computed `computed` rows: new tokens go
        out, finished answers are answered."""
        assert self._batch is not None
        if self.on_batch is not None:  # once per forward: the batch size histogram counts rows computed together
            self.on_batch(computed)
        if self._stepped:  # observers with something to do each step (streams, early stop); none for whole answers
            phase_timing.lap(phase_timing.SCHEDULER)
            self._prime_tad_streams()
            for sequence in self._batch.sequences:
                item = self._items[id(sequence)]
                if not item.stepped or item.observer is None:
                    continue
                try:
                    for event in item.observer.on_step(sequence):
                        self._outbox.put(item, event)
                except Exception:  # one answer's scoring or streaming must not fail its neighbours, as in _finish
                    logger.exception("streaming a request's progress failed")
                    self._answer(item, Failure(ServiceError("scoring the answer failed; see the server log")))
                    sequence.abandon(FinishReason.ERROR)  # leaves the batch at pop_done; its answer is sent
            phase_timing.lap(phase_timing.SCORING)
        else:
            phase_timing.lap(phase_timing.SCHEDULER)
        for sequence in self._batch.pop_done():
            phase_timing.lap(phase_timing.BATCH)
            item = self._items.pop(id(sequence))
            self._stepped -= item.stepped
            try:
                self._finish(item, sequence)
            except Exception:  # one answer that cannot be scored must not fail its neighbours
                logger.exception("finishing a request failed")
                self._answer(item, Failure(ServiceError("scoring the answer failed; see the server log")))
        phase_timing.lap(phase_timing.BATCH)
        # Counted before the flush: a client that has its first token must find its request running.
        self.stats.running = len(self._items) + self._prefilling()
        self._outbox.flush()  # once per forward: the new tokens and answers reach their event loops together
        phase_timing.lap(phase_timing.HANDOFF)

    def _prime_tad_streams(self) -> None:
        """The streamed answers' TAD inputs of this step, batched (one product per MLP stage 2, not one each)."""
        assert self._batch is not None
        try:
            pending = []
            for sequence in self._batch.sequences:
                observer = self._items[id(sequence)].observer
                entry = observer.tad_pending(sequence) if observer is not None else None
                if entry is not None:
                    pending.append(entry)
            prime_streams(pending)
        except Exception:  # each stream then computes its own in on_step, where a failure is that answer's
            if not self._prime_failure_logged:  # once: a bad answer would fail every step's priming
                logger.exception("priming the step's TAD streams failed (logged once)")
            self._prime_failure_logged = True

    def _finish(self, item: GenerationItem, sequence: SequenceState) -> None:
        if sequence.finish_reason is FinishReason.CANCELLED or item.cancelled:
            self._release(item)
            return
        if sequence.finish_reason is FinishReason.DEADLINE:
            self._answer(item, Failure(DeadlineExceeded("the request ran past its deadline")))
            return
        if sequence.finish_reason is FinishReason.ERROR:
            self._answer(item, Failure(ServiceError("choosing a token failed; see the server log")))
            return
        timing = item.timing(time.monotonic())
        self.stats.average_request_s = 0.9 * self.stats.average_request_s + 0.1 * timing.total_s
        assert item.observer is not None, "a generation item needs an observer to answer it"
        phase_timing.lap(phase_timing.SCHEDULER)
        *events, last = item.observer.on_finish(sequence, timing)
        phase_timing.lap(phase_timing.SCORING)
        for event in events:
            self._outbox.put(item, event)
        self._answer(item, last)

    def _fail_running(self, admitted: list[GenerationItem], scoring: list[ScoringItem]) -> None:
        """A decode step (or the bookkeeping around it) failed: the running batch's requests fail, and those this
        pass took up that are in no queued work; queued prefills and scoring passes, each with its own cache,
        go on."""
        queued = {id(item) for work in self._pending for item in work.items}
        failure = Failure(ServiceError(FAILED_INSIDE_THE_MODEL["prefill"]))
        for item in [*admitted, *scoring, *self._joining, *self._items.values()]:
            if id(item) not in queued:
                self._answer(item, failure)
        self._items.clear()
        self._joining = []
        self._stepped = 0
        self._batch = None
        self.stats.running = 0

    def _fail_everything(self, admitted: list[GenerationItem], scoring: list[ScoringItem], failure: Failure) -> None:
        """Shutdown abandons the work: every request, queued or running, gets `failure`."""
        pending = [item for work in self._pending for item in work.items]
        unique = {id(item): item for item in [*admitted, *scoring, *pending, *self._items.values()]}
        for item in unique.values():
            self._answer(item, failure)
        self._items.clear()
        self._stepped = 0
        self._batch = None
        self._pending.clear()
        self.stats.running = 0
