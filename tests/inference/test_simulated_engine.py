"""The simulated engine: its failure option, and the sampling parameters it honours or simulates."""

import asyncio
import json
from typing import Any

import jsonschema
import pytest

from inference.engines.base import Continuation, Delta, EngineRequestError, GenerationRequest
from inference.engines.simulated import FAILURE_AFTER_TOKENS, SimulatedEngine
from scheduler.generation import SamplingParams, StructuredOutput


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


def _answer(**sampling: Any) -> list[Delta]:
    """The deltas of one request with these sampling parameters (natural length: 10 tokens)."""

    async def run() -> list[Delta]:
        engine = SimulatedEngine(
            max_num_seqs=1, prefill_s_per_token=0, decode_base_s=0, decode_per_seq_s=0, output_tokens=10
        )
        await engine.start()
        request = GenerationRequest(
            request_id="r",
            messages=[{"role": "user", "content": "Where is my parcel?"}],
            sampling=SamplingParams(**{"max_tokens": 40, "temperature": 1.0, "top_p": 1.0, **sampling}),
        )
        try:
            return [delta async for delta in engine.generate(request)]
        finally:
            await engine.shutdown()

    return asyncio.run(run())


def _text(deltas: list[Delta]) -> str:
    return "".join(delta.text for delta in deltas)


def test_a_seed_picks_the_answer():
    assert _text(_answer(seed=3, max_tokens=20)) == _text(_answer(seed=3, max_tokens=20))
    assert _text(_answer(seed=3, max_tokens=20)) != _text(_answer(seed=4, max_tokens=20))


@pytest.mark.parametrize(
    ("sampling", "tokens", "finish_reason"),
    [
        ({}, 10, "stop"),  # its natural end
        ({"max_tokens": 6}, 6, "length"),
        ({"min_tokens": 15}, 15, "stop"),
        ({"ignore_eos": True}, 40, "length"),
    ],
)
def test_length_follows_max_and_min_tokens_and_ignore_eos(sampling, tokens, finish_reason):
    deltas = _answer(**sampling)
    assert (deltas[-1].output_tokens, deltas[-1].finish_reason) == (tokens, finish_reason)


def test_a_stop_string_ends_the_answer_before_it():
    deltas = _answer(stop=("parcel",))
    assert (_text(deltas), deltas[-1].finish_reason) == ("[simulated] You asked: Where is my ", "stop")


def test_include_stop_str_in_output_keeps_the_stop_string_in_the_answer():
    deltas = _answer(stop=("parcel",), include_stop_str_in_output=True)
    assert (_text(deltas), deltas[-1].finish_reason) == ("[simulated] You asked: Where is my parcel", "stop")


def test_a_choice_constraint_answers_the_first_choice():
    assert _text(_answer(structured=StructuredOutput(choice=("yes", "no")))) == "yes"


def test_structured_output_is_json_valid_against_the_schema():
    schema = {
        "type": "object",
        "properties": {
            "ids": {"type": "array", "items": {"type": "integer"}, "minItems": 2},
            "why": {"$ref": "#/$defs/why"},
        },
        "required": ["ids", "why"],
        "$defs": {"why": {"anyOf": [{"type": "string", "minLength": 12}, {"type": "null"}]}},
    }
    answer = json.loads(_text(_answer(structured=StructuredOutput(json_schema=schema))))
    jsonschema.validate(answer, schema)
    assert json.loads(_text(_answer(structured=StructuredOutput(json_object=True)))) == {"simulated": True}


def test_logprobs_are_certain_with_that_many_candidates_after_the_sampled_token():
    deltas = _answer(max_tokens=3, logprobs=2)
    entries = [entry for delta in deltas for entry in delta.logprobs]
    assert [entry.token for entry in entries] == [delta.text for delta in deltas]
    assert all(entry.logprob == 0.0 for entry in entries)
    assert all([top.logprob for top in entry.top_logprobs] == [0.0, -9999.0, -9999.0] for entry in entries)
    assert _answer(max_tokens=3)[0].logprobs is None


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


def test_a_continuation_streams_only_what_follows_the_text_already_written():
    async def run() -> tuple[list[Delta], list[Delta]]:
        engine = SimulatedEngine(
            max_num_seqs=2, prefill_s_per_token=0, decode_base_s=0, decode_per_seq_s=0, output_tokens=10
        )
        await engine.start()
        messages = [{"role": "user", "content": "hi"}]
        try:
            whole = [d async for d in engine.generate(GenerationRequest("whole", messages))]
            written = Continuation(text="".join(d.text for d in whole[:4]), output_tokens=4)
            resumed = GenerationRequest("rest", messages, continuation=written)
            rest = [d async for d in engine.generate(resumed)]
            return whole, rest
        finally:
            await engine.shutdown()

    whole, rest = asyncio.run(run())
    assert [d.text for d in rest] == [d.text for d in whole[4:]]
    assert [d.output_tokens for d in rest] == list(range(5, 11))
    assert rest[-1].finish_reason == "stop" and rest[0].prompt_tokens == whole[0].prompt_tokens


def test_a_raw_prompt_s_continuation_streams_only_what_follows_and_pays_its_prefill_again():
    async def run() -> tuple[list[Delta], list[Delta]]:
        engine = SimulatedEngine(
            max_num_seqs=2, prefill_s_per_token=0, decode_base_s=0, decode_per_seq_s=0, output_tokens=10
        )
        await engine.start()
        try:
            whole = [d async for d in engine.generate(GenerationRequest("whole", [], prompt="Once upon"))]
            written = Continuation(text="".join(d.text for d in whole[:6]), output_tokens=6)
            resumed = GenerationRequest("rest", [], prompt="Once upon", continuation=written)
            rest = [d async for d in engine.generate(resumed)]
            return whole, rest
        finally:
            await engine.shutdown()

    whole, rest = asyncio.run(run())
    assert [d.text for d in rest] == [d.text for d in whole[6:]]
    assert rest[-1].output_tokens == 10 and rest[0].prompt_tokens == whole[0].prompt_tokens == 3
