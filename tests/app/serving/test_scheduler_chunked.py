"""The scheduler's chunked prefill and chunked scoring: long prompts and long answers to score run
in chunks between the running answers' steps, and short requests are not held behind them."""

from __future__ import annotations

import asyncio
import itertools
import time

import numpy as np
import pytest

from app.engine.decoding import PromptPrefill
from app.engine.engine import Engine
from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest
from app.engine.teacher_forcing import ScoringPass
from app.errors import DeadlineExceeded
from app.serving.events import Failure
from app.serving.scheduler import Scheduler
from app.serving.work_items import GenerationItem, ScoringItem
from app.uncertainty.answer import AnswerScorer
from tests.app.serving.scheduler_items import generation_item, run_on, scoring_item, wait_until_idle


class ChunkRecorder:
    """Wraps `engine.start_prefill`: after every chunk, how far the prefill is and how many tokens
    the answer already running has."""

    def __init__(self, engine: Engine) -> None:
        self.start_prefill = engine.start_prefill
        self.running: GenerationItem | None = None
        self.jobs: list[list[tuple[int, int]]] = []  # per prefill: (columns done, running answer's tokens)
        self.widths: list[int] = []

    def __call__(self, requests: list[GenerationRequest]) -> PromptPrefill:
        job = self.start_prefill(requests)
        chunks: list[tuple[int, int]] = []
        self.jobs.append(chunks)
        self.widths.append(job.columns.width)
        advance = job.advance

        def recorded(max_tokens: int | None = None) -> object:
            batch = advance(max_tokens)
            sequence = self.running.sequence if self.running is not None else None
            chunks.append((job.columns.done, len(sequence.tokens) if sequence is not None else 0))
            return batch

        job.advance = recorded  # type: ignore[method-assign]
        return job


@pytest.fixture
def recorder(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> ChunkRecorder:
    """Every prefill of the engine, chunk by chunk (its `start_prefill` wrapped for the test)."""
    recording = ChunkRecorder(engine)
    monkeypatch.setattr(engine, "start_prefill", recording)
    return recording


async def _until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


LONG_PROMPT = tuple(5 + i % 30 for i in range(40))


async def _until_decoding(running: GenerationItem) -> None:
    """Until the running answer has a couple of tokens: it is decoding when the next request arrives."""
    await _until(lambda: running.sequence is not None and len(running.sequence.tokens) >= 2)


async def _long_prompt_joining(
    scheduler: Scheduler, recorder: ChunkRecorder, chunks: int
) -> tuple[GenerationItem, GenerationItem]:
    """An answer decoding, then LONG_PROMPT joining it: returned once the prompt has run `chunks` chunks."""
    loop = asyncio.get_running_loop()
    running, joining = generation_item(loop, (5, 6), tokens=80), generation_item(loop, LONG_PROMPT, tokens=6)
    recorder.running = running
    scheduler.submit_generation(running)
    await _until_decoding(running)
    scheduler.submit_generation(joining)
    await _until(lambda: len(recorder.jobs) == 2 and len(recorder.jobs[1]) >= chunks)
    return running, joining


def _assert_answered_as_alone(
    engine: Engine, answers: list[object], prompts: tuple[tuple[int, ...], ...], tokens: tuple[int, ...]
) -> None:
    """Each answer is done and has the tokens its request gets when generated alone."""
    for (tag, sequence, _), prompt, count in zip(answers, prompts, tokens, strict=True):  # type: ignore[misc]
        alone = engine.generate([GenerationRequest(prompt, SamplingParams(max_new_tokens=count))])[0]
        assert tag == "done"
        assert [t.token_id for t in sequence.kept_tokens] == [t.token_id for t in alone.kept_tokens]


def test_a_long_prompt_joining_a_running_answer_is_prefilled_in_chunks_between_its_steps(
    engine: Engine, recorder: ChunkRecorder
) -> None:
    scheduler = Scheduler(
        engine, AnswerScorer(None), max_batch_size=2, max_queue=2, batch_window_s=0.0, prefill_chunk_tokens=8
    )

    async def body() -> list[object]:
        items = await _long_prompt_joining(scheduler, recorder, chunks=0)
        return [await asyncio.wait_for(item.events.get(), 60) for item in items]

    answers = run_on(scheduler, body)
    first, second = recorder.jobs
    assert len(first) == 1  # nothing was decoding: the first prompt ran whole
    assert [columns for columns, _ in second] == [8, 16, 24, 32, 40]
    running_tokens = [tokens for _, tokens in second]
    assert all(later > earlier for earlier, later in itertools.pairwise(running_tokens))
    _assert_answered_as_alone(engine, answers, ((5, 6), LONG_PROMPT), (80, 6))  # type: ignore[arg-type]
    assert scheduler.unanswered == 0


def test_a_prompt_cancelled_during_its_chunked_prefill_stops_taking_chunks(
    engine: Engine, recorder: ChunkRecorder
) -> None:
    scheduler = Scheduler(
        engine, AnswerScorer(None), max_batch_size=2, max_queue=2, batch_window_s=0.0, prefill_chunk_tokens=1
    )

    async def body() -> object:
        running, joining = await _long_prompt_joining(scheduler, recorder, chunks=2)
        scheduler.cancel(joining)
        return await asyncio.wait_for(running.events.get(), 60)

    tag, sequence, _ = run_on(scheduler, body)  # type: ignore[misc]
    assert tag == "done" and len(sequence.kept_tokens) == 80
    columns_done = recorder.jobs[1][-1][0]
    assert columns_done < recorder.widths[1] - 10  # one column per step: it stopped long before the end
    assert scheduler.unanswered == 0


def test_a_prompt_cancelled_while_queued_behind_a_chunked_prefill_frees_its_slot_at_once(
    engine: Engine, recorder: ChunkRecorder
) -> None:
    scheduler = _chunked_scheduler(engine, chunk_tokens=1)

    async def body() -> None:
        running, long = await _long_prompt_joining(scheduler, recorder, chunks=1)
        queued = generation_item(asyncio.get_running_loop(), (7, 8, 9), tokens=6)
        scheduler.submit_generation(queued)
        await _until(lambda: len(recorder.jobs) == 3)  # its prefill is queued behind the long one
        scheduler.cancel(queued)
        await _until(lambda: scheduler.unanswered == 2)
        assert recorder.jobs[1][-1][0] < recorder.widths[1]  # the long prompt was still being prefilled
        assert recorder.jobs[2] == []  # and the cancelled one never ran a chunk
        for item in (running, long):
            scheduler.cancel(item)

    run_on(scheduler, body)
    wait_until_idle(scheduler)


def _chunked_scheduler(engine: Engine, chunk_tokens: int) -> Scheduler:
    return Scheduler(
        engine, AnswerScorer(None), max_batch_size=4, max_queue=4, batch_window_s=0.0, prefill_chunk_tokens=chunk_tokens
    )


def test_a_short_prompt_arriving_during_a_long_chunked_prefill_is_not_held_behind_it(
    engine: Engine, recorder: ChunkRecorder
) -> None:
    scheduler = _chunked_scheduler(engine, chunk_tokens=4)
    long_prompt, short_prompt = LONG_PROMPT * 3, (7, 8, 9)
    seen: dict[str, int] = {}

    async def body() -> list[object]:
        loop = asyncio.get_running_loop()
        running, joining, short = (
            generation_item(loop, (5, 6), tokens=200),
            generation_item(loop, long_prompt, tokens=6),
            generation_item(loop, short_prompt, tokens=3),
        )
        recorder.running = running
        scheduler.submit_generation(running)
        await _until_decoding(running)
        scheduler.submit_generation(joining)
        await _until(lambda: len(recorder.jobs) == 2 and len(recorder.jobs[1]) >= 2)
        await _until(lambda: scheduler.stats.running == 2)  # the prompt being prefilled counts as admitted
        scheduler.submit_generation(short)
        short_answer = await asyncio.wait_for(short.events.get(), 60)
        seen["long_prompt_columns_then"] = recorder.jobs[1][-1][0]
        long_answer = await asyncio.wait_for(joining.events.get(), 60)
        scheduler.cancel(running)
        return [long_answer, short_answer]

    answers = run_on(scheduler, body)
    assert seen["long_prompt_columns_then"] < len(long_prompt)  # answered while the long prompt was still prefilling
    _assert_answered_as_alone(engine, answers, (long_prompt, short_prompt), (6, 3))  # type: ignore[arg-type]
    wait_until_idle(scheduler)


def test_a_request_arriving_while_an_idle_server_prefills_a_long_prompt_joins_between_its_chunks(
    engine: Engine, recorder: ChunkRecorder
) -> None:
    scheduler = _chunked_scheduler(engine, chunk_tokens=4)
    long_prompt, short_prompt = LONG_PROMPT * 3, (7, 8, 9)
    seen: dict[str, int] = {}

    async def body() -> list[object]:
        loop = asyncio.get_running_loop()
        joining, short = generation_item(loop, long_prompt, tokens=6), generation_item(loop, short_prompt, tokens=3)
        scheduler.submit_generation(joining)  # nothing else is running
        await _until(lambda: len(recorder.jobs) == 1 and len(recorder.jobs[0]) >= 2)
        scheduler.submit_generation(short)
        short_answer = await asyncio.wait_for(short.events.get(), 60)
        seen["long_prompt_columns_then"] = recorder.jobs[0][-1][0]
        return [await asyncio.wait_for(joining.events.get(), 60), short_answer]

    answers = run_on(scheduler, body)
    assert seen["long_prompt_columns_then"] < len(long_prompt)
    _assert_answered_as_alone(engine, answers, (long_prompt, short_prompt), (6, 3))  # type: ignore[arg-type]
    wait_until_idle(scheduler)


def test_a_model_failure_in_a_later_chunk_fails_its_own_request_only_and_the_scheduler_serves_on(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = ChunkRecorder(engine)

    def failing_on_the_third_chunk(requests: list[GenerationRequest]) -> PromptPrefill:
        job = recorder(requests)
        advance = job.advance

        def advance_or_fail(max_tokens: int | None = None) -> object:
            if len(recorder.jobs) == 2 and len(recorder.jobs[1]) >= 2:
                raise RuntimeError("the model failed")
            return advance(max_tokens)

        job.advance = advance_or_fail  # type: ignore[method-assign]
        return job

    monkeypatch.setattr(engine, "start_prefill", failing_on_the_third_chunk)
    scheduler = _chunked_scheduler(engine, chunk_tokens=1)

    async def body() -> list[object]:
        loop = asyncio.get_running_loop()
        running, joining = generation_item(loop, (5, 6), tokens=80), generation_item(loop, LONG_PROMPT, tokens=6)
        recorder.running = running
        scheduler.submit_generation(running)
        await _until_decoding(running)
        scheduler.submit_generation(joining)
        failures = [await asyncio.wait_for(item.events.get(), 60) for item in (running, joining)]
        monkeypatch.setattr(engine, "start_prefill", recorder.start_prefill)
        later = generation_item(loop, (5, 6), tokens=3)
        scheduler.submit_generation(later)
        return [*failures, await asyncio.wait_for(later.events.get(), 60)]

    running_event, joining_event, later_event = run_on(scheduler, body)  # type: ignore[misc]
    # The joining prompt's prefill failed; the answer decoding meanwhile (its cache apart) is not its victim.
    assert isinstance(joining_event, Failure) and running_event[0] == "done"  # type: ignore[index]
    assert later_event[0] == "done"  # type: ignore[index]
    assert scheduler.failures.in_a_row == 0  # the steps after the failure succeeded
    wait_until_idle(scheduler)


def test_a_deadline_passing_during_a_chunked_prefill_answers_at_once(engine: Engine, recorder: ChunkRecorder) -> None:
    scheduler = _chunked_scheduler(engine, chunk_tokens=1)
    long_prompt = LONG_PROMPT * 10  # 400 chunks: far more than fit in the deadline

    async def body() -> object:
        loop = asyncio.get_running_loop()
        running, joining = (
            generation_item(loop, (5, 6), tokens=5000),
            generation_item(loop, long_prompt, tokens=6, deadline_s=0.3),
        )
        recorder.running = running
        scheduler.submit_generation(running)
        await _until_decoding(running)
        scheduler.submit_generation(joining)
        event = await asyncio.wait_for(joining.events.get(), 60)
        scheduler.cancel(running)
        return event

    event = run_on(scheduler, body)
    assert isinstance(event, Failure) and isinstance(event.error, DeadlineExceeded)
    assert "prefilled" in str(event.error)
    assert recorder.jobs[1][-1][0] < len(long_prompt)
    wait_until_idle(scheduler)


class ScoringRecorder:
    """Wraps `engine.start_scoring`: after every step of a pass, how many tokens the running answer has."""

    def __init__(self, engine: Engine, fail_after: int | None = None) -> None:
        self.start_scoring = engine.start_scoring
        self.running: GenerationItem | None = None
        self.steps: list[int] = []
        self.fail_after = fail_after

    def __call__(self, pairs: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> ScoringPass:
        scoring = self.start_scoring(pairs)
        advance = scoring.advance

        def recorded(max_tokens: int | None = None) -> object:
            if self.fail_after is not None and len(self.steps) >= self.fail_after:
                raise RuntimeError("the model failed")
            traces = advance(max_tokens)
            sequence = self.running.sequence if self.running is not None else None
            self.steps.append(len(sequence.tokens) if sequence is not None else 0)
            return traces

        scoring.advance = recorded  # type: ignore[method-assign]
        return scoring


@pytest.mark.parametrize("fail_after", [None, 3], ids=["scored", "model-fails-in-a-later-chunk"])
def test_a_long_scoring_request_runs_in_chunks_between_the_running_answers_steps(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, fail_after: int | None
) -> None:
    recorder = ScoringRecorder(engine, fail_after)
    monkeypatch.setattr(engine, "start_scoring", recorder)
    scheduler = _chunked_scheduler(engine, chunk_tokens=8)
    response = (7, 8, 9, 10)

    async def body() -> list[object]:
        loop = asyncio.get_running_loop()
        running, scoring = generation_item(loop, (5, 6), tokens=60), scoring_item(loop, LONG_PROMPT, response)
        recorder.running = running
        scheduler.submit_generation(running)
        await _until_decoding(running)
        scheduler.submit_scoring(scoring)
        return [await asyncio.wait_for(item.events.get(), 60) for item in (scoring, running)]

    scored, answer = run_on(scheduler, body)  # type: ignore[misc]
    assert answer[0] == "done" and len(answer[1].kept_tokens) == 60  # type: ignore[index]
    if fail_after is not None:  # the failure fails the scoring request only
        assert isinstance(scored, Failure) and "scoring failed" in str(scored.error)
        return
    # The prompt's 40 - 1 columns before the answer's last forward, 8 at a time, then that forward.
    assert len(recorder.steps) == 6
    assert all(later > earlier for earlier, later in itertools.pairwise(recorder.steps))
    whole = engine.score([(LONG_PROMPT, response)])[0]
    chunked = scored.trace  # type: ignore[union-attr]
    assert chunked.token_ids == response
    np.testing.assert_allclose(chunked.logprobs, whole.logprobs, atol=1e-5)
    np.testing.assert_allclose(chunked.attention, whole.attention, atol=1e-5)
    wait_until_idle(scheduler)


def test_short_scoring_requests_sent_with_a_long_one_are_answered_first_and_correctly(engine: Engine) -> None:
    scheduler = _chunked_scheduler(engine, chunk_tokens=8)
    shorts = [((5, 6), (7 + i,)) for i in range(5)]
    answered: list[str] = []

    async def body() -> list[object]:
        loop = asyncio.get_running_loop()
        running = generation_item(loop, (5, 6), tokens=80)
        scheduler.submit_generation(running)
        await _until_decoding(running)
        items = [scoring_item(loop, LONG_PROMPT, (7, 8, 9, 10))] + [scoring_item(loop, p, r) for p, r in shorts]
        for item in items:  # the long one first: the shorter ones must not wait behind its chunks
            scheduler.submit_scoring(item)

        async def answer(item: ScoringItem, name: str) -> object:
            event = await asyncio.wait_for(item.events.get(), 60)
            answered.append(name)
            return event

        events = await asyncio.gather(*(answer(item, f"item{i}") for i, item in enumerate(items)))
        scheduler.cancel(running)
        return list(events)

    events = run_on(scheduler, body)
    assert answered[-1] == "item0"  # the long one
    for event, (prompt, response) in zip(events[1:], shorts, strict=True):  # type: ignore[index]
        whole = engine.score([(prompt, response)])[0]
        np.testing.assert_allclose(event.trace.logprobs, whole.logprobs, atol=1e-5)
    wait_until_idle(scheduler)


def test_a_failed_decode_step_fails_the_running_batch_only_not_a_queued_prefill(
    engine: Engine, recorder: ChunkRecorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.engine.decoding import DecodeBatch

    scheduler = _chunked_scheduler(engine, chunk_tokens=1)
    original = DecodeBatch.step
    failed: list[bool] = []

    def failing_once_while_a_prompt_is_queued(self: DecodeBatch) -> None:
        if not failed and len(recorder.jobs) == 2 and len(recorder.jobs[1]) >= 2:  # the joining prompt is queued
            failed.append(True)
            raise RuntimeError("out of memory")
        original(self)

    monkeypatch.setattr(DecodeBatch, "step", failing_once_while_a_prompt_is_queued)

    async def body() -> list[object]:
        running, joining = await _long_prompt_joining(scheduler, recorder, chunks=0)
        return [await asyncio.wait_for(item.events.get(), 60) for item in (running, joining)]

    running_event, joining_event = run_on(scheduler, body)  # type: ignore[misc]
    assert failed and isinstance(running_event, Failure)
    # Its prefill has a cache of its own: it goes on, and the answer comes.
    assert joining_event[0] == "done"  # type: ignore[index]
    wait_until_idle(scheduler)


def test_one_answers_scorer_failing_fails_that_request_only(engine: Engine) -> None:
    class FailingScorer(AnswerScorer):
        def score(self, trace):  # type: ignore[no-untyped-def]
            raise RuntimeError("a scorer's bug")

    scheduler = _chunked_scheduler(engine, chunk_tokens=0)

    async def body() -> list[object]:
        loop = asyncio.get_running_loop()
        bad, good = scoring_item(loop, (5, 6, 7), (8, 9)), scoring_item(loop, (5, 6, 7), (8, 10))
        bad.scorer = FailingScorer(None)  # the artifact its request started with, say, before a reload
        with scheduler._condition:  # both queued before the worker looks: one scoring pass, the failing one first
            for item in (bad, good):
                scheduler.submit_scoring(item)
        return [await asyncio.wait_for(item.events.get(), 30) for item in (bad, good)]

    bad_event, good_event = run_on(scheduler, body)  # type: ignore[misc]
    assert isinstance(bad_event, Failure) and not isinstance(good_event, Failure)
    assert scheduler.failures.in_a_row == 0  # the model's pass succeeded: not a model failure
    wait_until_idle(scheduler)
