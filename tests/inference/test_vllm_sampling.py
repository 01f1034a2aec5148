"""Our sampling parameters onto vLLM's (inference.engines.vllm.vllm_sampling_params), without an
engine: what a continued answer is asked with."""

import pytest

from inference.engines.vllm import vllm_sampling_params
from scheduler.generation import SamplingParams, StructuredOutput


def test_a_continuation_counts_its_written_tokens_as_spent():
    sampling = SamplingParams(max_tokens=24, temperature=0.0, top_p=1.0, min_tokens=10)
    params = vllm_sampling_params(sampling, written=8, written_ids=[5] * 8)
    assert (params.max_tokens, params.min_tokens, params.logit_bias) == (16, 2, None)


def test_a_continuation_carries_the_frequency_penalty_of_its_written_tokens_as_a_logit_bias():
    """vLLM counts the frequency penalty over the output; a continuation's written tokens are in
    its prompt, so the same amounts come off their logits as a bias."""
    sampling = SamplingParams(
        max_tokens=24, temperature=0.0, top_p=1.0, frequency_penalty=1.5, logit_bias={7: 2.0, 9: -100.0}
    )
    params = vllm_sampling_params(sampling, written=4, written_ids=[7, 7, 9, 11])
    assert params.logit_bias == {7: 2.0 - 2 * 1.5, 9: -100.0, 11: -1.5}
    fresh = vllm_sampling_params(sampling)
    assert fresh.logit_bias == {7: 2.0, 9: -100.0}


def test_vllm_s_output_options_reach_its_sampling_params_as_they_were_asked():
    sampling = SamplingParams(
        max_tokens=24,
        temperature=0.0,
        top_p=1.0,
        stop=("!",),
        include_stop_str_in_output=True,
        skip_special_tokens=False,
        spaces_between_special_tokens=False,
        bad_words=("refund",),
        allowed_token_ids=(5, 6),
    )
    params = vllm_sampling_params(sampling)
    assert params.include_stop_str_in_output is True
    assert params.skip_special_tokens is False
    assert params.spaces_between_special_tokens is False
    assert params.bad_words == ["refund"]
    assert params.allowed_token_ids == [5, 6]


@pytest.mark.parametrize(
    ("structured", "field", "value"),
    [
        (StructuredOutput(regex=r"\d+"), "regex", r"\d+"),
        (StructuredOutput(choice=("yes", "no")), "choice", ["yes", "no"]),
        (StructuredOutput(grammar='root ::= "a"'), "grammar", 'root ::= "a"'),
        (StructuredOutput(json_schema={"type": "object"}), "json", {"type": "object"}),
        (StructuredOutput(json_object=True), "json_object", True),
    ],
)
def test_each_structured_output_becomes_vllm_s_one_constraint(structured, field, value):
    sampling = SamplingParams(max_tokens=8, temperature=0.0, top_p=1.0, structured=structured)
    assert getattr(vllm_sampling_params(sampling).structured_outputs, field) == value
