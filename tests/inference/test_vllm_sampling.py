"""Our sampling parameters onto vLLM's (inference.engines.vllm.vllm_sampling_params), without an
engine: what a continued answer is asked with."""

from inference.engines.vllm import vllm_sampling_params
from scheduler.generation import SamplingParams


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
