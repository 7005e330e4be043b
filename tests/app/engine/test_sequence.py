"""`TokenValues`: a sequence's token ids and log-probs read in place, behaving as the lists of them would."""

from __future__ import annotations

import pytest

from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest, SequenceState, TokenRecord


def _sequence(ids: list[int]) -> SequenceState:
    sequence = SequenceState(request=GenerationRequest(prompt_ids=(0,), params=SamplingParams()), generator=None)
    sequence.tokens.extend(TokenRecord(token_id=i, stats={"logprob": -i / 10}) for i in ids)
    return sequence


IDS = [7, 3, 9, 1, 4, 4, 8]


def test_token_ids_read_like_the_list_of_ids() -> None:
    view = _sequence(IDS).token_ids()
    assert len(view) == len(IDS) and list(view) == IDS
    assert [view[i] for i in range(-len(IDS), len(IDS))] == IDS + IDS
    for index in (len(IDS), -len(IDS) - 1):
        with pytest.raises(IndexError):
            view[index]


@pytest.mark.parametrize(
    "cut", [slice(None, -1), slice(2, None), slice(1, 5), slice(5, 2), slice(-3, None), slice(None, None, 2)]
)
def test_a_slice_of_token_ids_is_the_slice_of_the_ids_and_slices_again(cut: slice) -> None:
    view = _sequence(IDS).token_ids()[cut]
    assert list(view) == IDS[cut] and len(view) == len(IDS[cut])
    assert list(view[1:]) == IDS[cut][1:] and list(view[:-1]) == IDS[cut][:-1]


def test_the_first_tokens_stay_what_they_were_as_the_sequence_grows() -> None:
    sequence = _sequence(IDS[:3])
    first = sequence.token_ids(2)
    sequence.tokens.append(TokenRecord(token_id=99, stats={"logprob": -9.9}))
    assert list(first) == IDS[:2] and list(sequence.token_ids()) == [*IDS[:3], 99]


def test_log_probs_read_like_the_list_of_them_and_follow_the_sequence() -> None:
    sequence = _sequence(IDS)
    view = sequence.logprobs()
    assert list(view) == [-i / 10 for i in IDS] and list(view[5:]) == [-i / 10 for i in IDS[5:]]
    sequence.tokens.append(TokenRecord(token_id=99, stats={"logprob": -9.9}))
    assert len(sequence.logprobs()) == len(IDS) + 1 and sequence.logprobs()[-1] == -9.9
