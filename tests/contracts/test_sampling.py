"""SamplingParams' log-probability fields: bounds, and a header that carries them only when asked."""

from __future__ import annotations

import pytest

from contracts.logprobs import TokenLogprobs, item_logprobs
from contracts.sampling import SamplingParams


def test_a_header_without_logprobs_is_what_it_always_was():
    header = SamplingParams(temperature=0.5, seed=3).to_header()
    assert header == {"temperature": 0.5, "top_k": 0, "top_p": 1.0, "seed": 3}
    asked = SamplingParams(logprobs=0, prompt_logprobs=20)
    assert SamplingParams(**asked.to_header()) == asked and asked.scores


@pytest.mark.parametrize("fields", [{"logprobs": 21}, {"logprobs": -1}, {"prompt_logprobs": 1.5},
                                    {"logprobs": True}])
def test_out_of_bounds_logprobs_are_refused(fields):
    with pytest.raises(ValueError):
        SamplingParams(**fields)


def test_an_item_carries_the_token_and_with_the_first_the_prompt():
    entries = [[-1.0, [[4, -0.5]]], [-2.0, [[7, -0.25]]]]
    parsed = TokenLogprobs.from_wire(item_logprobs(entries))
    assert (parsed.token.logprob, parsed.token.top) == (-2.0, ((7, -0.25),))
    assert [(e.logprob, e.top) for e in parsed.prompt] == [(-1.0, ((4, -0.5),))]
    assert TokenLogprobs.from_wire(item_logprobs(entries[1:])).prompt is None
