"""The simulated engine's failure option: a failing request streams a few tokens, then raises."""

import asyncio

import pytest

from inference.engines.base import EngineRequestError, GenerationRequest
from inference.engines.simulated import FAILURE_AFTER_TOKENS, SimulatedEngine


def _generate(failure_rate: float, requests: int = 1) -> list[tuple[int, bool]]:
    """(tokens streamed, failed) per request."""

    async def run():
        engine = SimulatedEngine(
            max_num_seqs=4,
            prefill_s_per_token=0,
            decode_base_s=0,
            decode_per_seq_s=0,
            output_tokens=10,
            failure_rate=failure_rate,
        )
        await engine.start()

        async def one(n: int) -> tuple[int, bool]:
            request = GenerationRequest(request_id=f"r{n}", messages=[{"role": "user", "content": "hi"}])
            tokens = 0
            try:
                async for delta in engine.generate(request):
                    tokens += bool(delta.text)
            except EngineRequestError:
                return tokens, True
            return tokens, False

        try:
            return await asyncio.gather(*(one(n) for n in range(requests)))
        finally:
            await engine.shutdown()

    return asyncio.run(run())


def test_a_failing_request_streams_a_few_tokens_then_raises():
    assert _generate(1.0) == [(FAILURE_AFTER_TOKENS, True)]


def test_without_a_failure_rate_every_request_completes():
    assert _generate(0.0, requests=20) == [(10, False)] * 20


def test_the_failure_rate_is_the_share_of_requests_that_fail():
    failed = sum(f for _, f in _generate(0.3, requests=400))
    assert failed == pytest.approx(120, abs=40)


def test_a_raw_prompt_is_answered_without_chat_messages():
    async def run() -> tuple[str, int]:
        engine = SimulatedEngine(
            max_num_seqs=1, prefill_s_per_token=0, decode_base_s=0, decode_per_seq_s=0, output_tokens=10
        )
        await engine.start()
        try:
            request = GenerationRequest(request_id="r", messages=[], prompt="Once upon a time")
            deltas = [delta async for delta in engine.generate(request)]
        finally:
            await engine.shutdown()
        return "".join(delta.text for delta in deltas), deltas[-1].prompt_tokens

    text, prompt_tokens = asyncio.run(run())
    assert text.startswith("[simulated] You asked: Once upon a time")
    assert prompt_tokens == 5  # a word a token, and no chat template's own
