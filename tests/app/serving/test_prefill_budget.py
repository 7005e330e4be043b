"""The prefill budget: fixed, or sized from the passes' measured speed to fit in the pause (`auto`)."""

from __future__ import annotations

import asyncio

import pytest

from app.engine.engine import Engine
from app.serving.prefill_budget import AUTO_MAX_TOKENS, AUTO_MIN_TOKENS, MIN_MEASURED_TOKENS, PrefillBudget
from app.serving.scheduler import Scheduler
from app.uncertainty.answer import AnswerScorer
from tests.app.serving.scheduler_items import generation_item, run_on, scoring_item


def test_a_fixed_budget_stays_what_it_is_set_to_and_zero_means_whole_prompts() -> None:
    fixed, whole = PrefillBudget(2048, pause_s=0.1), PrefillBudget(0, pause_s=0.1)
    for budget in (fixed, whole):
        budget.observe(4096, 0.001)  # fast passes change nothing
    assert (fixed.auto, fixed.tokens, whole.tokens) == (False, 2048, None)


def test_auto_starts_at_the_floor_and_then_runs_what_the_measured_speed_runs_in_the_pause() -> None:
    budget = PrefillBudget("auto", pause_s=0.1)
    assert budget.auto and budget.tokens == AUTO_MIN_TOKENS
    budget.observe(1000, 0.05)  # 20,000 tokens/s: 2,000 in 100 ms
    assert budget.tokens == 2000
    budget.observe(1000, 0.025)  # 40,000 now, weighed half with the 20,000 before
    assert budget.tokens == 3000


def test_auto_stays_within_its_floor_and_cap() -> None:
    slow, fast = PrefillBudget("auto", pause_s=0.1), PrefillBudget("auto", pause_s=0.1)
    slow.observe(512, 85.0)  # a 1.5B model's 512 tokens on an emulated-bf16 CPU
    fast.observe(8192, 0.01)
    assert (slow.tokens, fast.tokens) == (AUTO_MIN_TOKENS, AUTO_MAX_TOKENS)


def test_auto_does_not_learn_from_short_passes_mostly_overhead() -> None:
    budget = PrefillBudget("auto", pause_s=0.1)
    budget.observe(MIN_MEASURED_TOKENS - 1, 10.0)
    assert budget.tokens_per_s is None and budget.tokens == AUTO_MIN_TOKENS


@pytest.mark.parametrize(("setting", "pause_s"), [(-1, 0.1), ("fast", 0.1), (True, 0.1), (1.5, 0.1), ("auto", 0)])
def test_a_budget_that_is_not_one_is_refused(setting: object, pause_s: float) -> None:
    with pytest.raises(ValueError):
        PrefillBudget(setting, pause_s)  # type: ignore[arg-type]


def _measured_passes(engine: Engine, pause_s: float, monkeypatch: pytest.MonkeyPatch) -> tuple[Scheduler, list]:
    """A burst of 4 prompts of 70 tokens and one scoring pass of 300 tokens through an `auto` scheduler;
    the (tokens, seconds) of every pass it measured."""
    scheduler = Scheduler(
        engine,
        AnswerScorer(None),
        max_batch_size=4,
        max_queue=4,
        batch_window_s=0.05,
        prefill_chunk_tokens="auto",
        prefill_pause_s=pause_s,
    )
    observed: list[tuple[int, float]] = []
    observe = scheduler.prefill_budget.observe

    def recorded(tokens: int, seconds: float) -> None:
        observed.append((tokens, seconds))
        observe(tokens, seconds)

    monkeypatch.setattr(scheduler.prefill_budget, "observe", recorded)

    async def body() -> None:
        loop = asyncio.get_running_loop()
        items = [generation_item(loop, tuple(5 + (i + j) % 40 for j in range(70)), tokens=2) for i in range(4)]
        for item in items:
            scheduler.submit_generation(item)
        for item in items:
            assert (await asyncio.wait_for(item.events.get(), 60))[0] == "done"
        scoring = scoring_item(loop, tuple(5 + j % 30 for j in range(290)), tuple(range(7, 17)))
        scheduler.submit_scoring(scoring)
        await asyncio.wait_for(scoring.events.get(), 60)

    run_on(scheduler, body)
    return scheduler, observed


def test_the_scheduler_measures_each_prefill_and_scoring_pass_by_its_padded_tokens(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    scheduler, observed = _measured_passes(engine, pause_s=1e-9, monkeypatch=monkeypatch)
    # the burst in one whole-prompt pass (4 x 70 fits in the 512 it starts with), then the scoring pass whole
    assert [tokens for tokens, _ in observed] == [4 * 70, 290 + 10]
    assert all(seconds > 0 for _, seconds in observed)
    assert scheduler.prefill_budget.tokens == AUTO_MIN_TOKENS  # no pass runs in a nanosecond


def test_with_a_long_pause_the_scheduler_grows_the_budget_to_its_cap(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    scheduler, _ = _measured_passes(engine, pause_s=3600.0, monkeypatch=monkeypatch)
    assert scheduler.prefill_budget.tokens == AUTO_MAX_TOKENS
