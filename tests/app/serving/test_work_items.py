"""How admitted prompts are grouped for prefill (`prefill_groups`)."""

from __future__ import annotations

import asyncio
import time

from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest
from app.serving.work_items import GenerationItem, prefill_groups


def _items(*lengths: int) -> list[GenerationItem]:
    loop = asyncio.new_event_loop()
    try:
        return [
            GenerationItem(
                loop=loop,
                events=asyncio.Queue(),
                deadline=time.monotonic() + 60,
                request=GenerationRequest(prompt_ids=tuple(range(5, 5 + length)), params=SamplingParams()),
                observer=None,
            )
            for length in lengths
        ]
    finally:
        loop.close()


def _lengths(group: list[GenerationItem]) -> list[int]:
    return [len(item.request.prompt_ids) for item in group if item.request is not None]


def test_prompts_that_fit_together_are_one_group_run_at_once() -> None:
    items = _items(3, 1, 2)
    at_once, queued = prefill_groups(items, budget=9)
    assert _lengths(at_once) == [1, 2, 3] and queued == []


def test_shortest_first_each_group_padded_to_its_longest_fits_the_budget() -> None:
    at_once, queued = prefill_groups(_items(4, 2, 3, 4, 2, 5, 4), budget=8)
    groups = [at_once, *queued]
    assert [_lengths(group) for group in groups] == [[2, 2], [3, 4], [4, 4], [5]]
    assert all(len(group) * max(_lengths(group)) <= 8 for group in groups)


def test_a_prompt_longer_than_the_budget_is_a_group_of_its_own() -> None:
    at_once, queued = prefill_groups(_items(12, 2, 3), budget=8)
    assert _lengths(at_once) == [2, 3] and [_lengths(group) for group in queued] == [[12]]


def test_nothing_runs_at_once_when_even_the_shortest_prompt_is_longer_than_the_budget() -> None:
    at_once, queued = prefill_groups(_items(9, 12), budget=8)
    assert at_once == [] and [_lengths(group) for group in queued] == [[9], [12]]


def test_prompts_just_over_half_the_budget_are_chunked_together_when_that_takes_fewer_passes() -> None:
    """Seven groups of one would take seven passes; the seven chunked by columns take five (one column each)."""
    at_once, queued = prefill_groups(_items(*[5] * 8, 20), budget=9)
    assert _lengths(at_once) == [5] and [_lengths(group) for group in queued] == [[5] * 7, [20]]
